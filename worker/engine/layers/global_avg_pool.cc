#include "worker/engine/layers/global_avg_pool.h"

#include "common/error.h"

namespace shoal {

Shape GlobalAvgPool::OutputShape(const std::vector<Shape>& in) const {
  CheckInputs(in);
  SHOAL_CHECK(in[0].size() == 4, "GlobalAvgPool: input must be [N,C,H,W], got " + ShapeString(in[0]));
  return {in[0][0], in[0][1]};
}

const Tensor& GlobalAvgPool::Forward(const std::vector<const Tensor*>& x, bool train) {
  (void)train;
  Ensure(y_, OutputShape({x[0]->shape()}));
  be_.GlobalAvgPoolForward(*x[0], y_);
  return y_;
}

void GlobalAvgPool::Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx,
                             std::vector<Tensor>& dx) {
  if (!need_dx) return;
  Tensor& g = InputGrad(0, x[0]->shape());
  be_.GlobalAvgPoolBackward(dy, g);
  dx[0] = g;
}

}  // namespace shoal
