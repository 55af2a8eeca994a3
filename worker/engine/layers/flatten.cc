#include "worker/engine/layers/flatten.h"

#include <algorithm>

#include "common/error.h"

namespace shoal {

Shape Flatten::OutputShape(const std::vector<Shape>& in) const {
  CheckInputs(in);
  SHOAL_CHECK(!in[0].empty(), "Flatten: input has no batch dimension");
  return {in[0][0], NumElements(in[0]) / std::max<int64_t>(in[0][0], 1)};
}

const Tensor& Flatten::Forward(const std::vector<const Tensor*>& x, bool train) {
  (void)train;
  y_ = x[0]->Reshape(OutputShape({x[0]->shape()}));
  return y_;
}

void Flatten::Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) {
  if (need_dx) dx[0] = dy.Reshape(x[0]->shape());
}

}  // namespace shoal
