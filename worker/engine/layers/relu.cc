#include "worker/engine/layers/relu.h"

namespace shoal {

const Tensor& ReLU::Forward(const std::vector<const Tensor*>& x, bool train) {
  (void)train;
  Ensure(y_, x[0]->shape());
  be_.ReluForward(*x[0], y_);
  return y_;
}

void ReLU::Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) {
  (void)x;
  if (!need_dx) return;
  // The mask comes from the output kept since Forward: y > 0 exactly where x > 0.
  Tensor& g = InputGrad(0, dy.shape());
  be_.ReluBackward(y_, dy, g);
  dx[0] = g;
}

}  // namespace shoal
