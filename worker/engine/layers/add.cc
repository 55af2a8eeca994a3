#include "worker/engine/layers/add.h"

#include "common/error.h"

namespace shoal {

Shape AddLayer::OutputShape(const std::vector<Shape>& in) const {
  CheckInputs(in);
  SHOAL_CHECK(in[0] == in[1], "Add: input shapes " + ShapeString(in[0]) + " and " + ShapeString(in[1]) + " differ");
  return in[0];
}

const Tensor& AddLayer::Forward(const std::vector<const Tensor*>& x, bool train) {
  (void)train;
  Ensure(y_, OutputShape({x[0]->shape(), x[1]->shape()}));
  be_.Add(*x[0], *x[1], y_);
  return y_;
}

void AddLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) {
  (void)x;
  if (!need_dx) return;
  dx[0] = dy;
  dx[1] = dy;
}

}  // namespace shoal
