#include "worker/engine/layers/max_pool.h"

#include "common/error.h"

namespace shoal {

MaxPool::MaxPool(Backend& be, int kernel, int stride, int pad) : Layer(be) {
  SHOAL_CHECK(kernel > 0 && stride > 0 && pad >= 0 && pad < kernel,
              "MaxPool: bad kernel/stride/pad " + std::to_string(kernel) + "/" + std::to_string(stride) + "/" +
                  std::to_string(pad));
  p_.kernel = kernel;
  p_.stride = stride;
  p_.pad = pad;
}

Shape MaxPool::OutputShape(const std::vector<Shape>& in) const {
  CheckInputs(in);
  const Shape& s = in[0];
  SHOAL_CHECK(
      s.size() == 4 && s[2] + 2 * p_.pad >= p_.kernel && s[3] + 2 * p_.pad >= p_.kernel,
      "MaxPool(" + std::to_string(p_.kernel) + "): input must be [N,C,H,W] at least the window, got " + ShapeString(s));
  return {s[0], s[1], (s[2] + 2 * p_.pad - p_.kernel) / p_.stride + 1, (s[3] + 2 * p_.pad - p_.kernel) / p_.stride + 1};
}

const Tensor& MaxPool::Forward(const std::vector<const Tensor*>& x, bool train) {
  (void)train;
  Ensure(y_, OutputShape({x[0]->shape()}));
  be_.MaxPoolForward(*x[0], p_, y_, workspace_);
  return y_;
}

void MaxPool::Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) {
  if (!need_dx) return;
  Tensor& g = InputGrad(0, x[0]->shape());
  be_.MaxPoolBackward(*x[0], y_, dy, p_, workspace_, g);
  dx[0] = g;
}

}  // namespace shoal
