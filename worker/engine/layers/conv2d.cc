#include "worker/engine/layers/conv2d.h"

#include <cmath>

#include "common/error.h"

namespace shoal {

Conv2d::Conv2d(Backend& be, int64_t in_channels, int64_t out_channels, int kernel, int stride, int pad, bool bias,
               WeightInit init)
    : Layer(be), in_(in_channels), out_(out_channels), kernel_(kernel), bias_(bias), init_(init) {
  SHOAL_CHECK(in_ > 0 && out_ > 0 && kernel > 0 && stride > 0 && pad >= 0,
              "Conv2d: bad configuration in=" + std::to_string(in_) + " out=" + std::to_string(out_) + " kernel=" +
                  std::to_string(kernel) + " stride=" + std::to_string(stride) + " pad=" + std::to_string(pad));
  p_.stride = stride;
  p_.pad = pad;
  AddParam("weight", {out_, in_, kernel, kernel}, false);
  if (bias_) AddParam("bias", {out_}, true);
}

Shape Conv2d::OutputShape(const std::vector<Shape>& in) const {
  CheckInputs(in);
  const Shape& s = in[0];
  SHOAL_CHECK(s.size() == 4 && s[1] == in_, "Conv2d(" + std::to_string(in_) + "->" + std::to_string(out_) +
                                                "): input must be [N," + std::to_string(in_) + ",H,W], got " +
                                                ShapeString(s));
  const int64_t ho = (s[2] + 2 * p_.pad - kernel_) / p_.stride + 1, wo = (s[3] + 2 * p_.pad - kernel_) / p_.stride + 1;
  SHOAL_CHECK(s[2] + 2 * p_.pad >= kernel_ && s[3] + 2 * p_.pad >= kernel_,
              "Conv2d: kernel " + std::to_string(kernel_) + " larger than padded input " + ShapeString(s));
  return {s[0], out_, ho, wo};
}

const Tensor& Conv2d::Forward(const std::vector<const Tensor*>& x, bool train) {
  Ensure(y_, OutputShape({x[0]->shape()}));
  const Tensor b = bias_ ? params_[1].value : Tensor();
  if (train)
    be_.ConvForwardTrain(*x[0], params_[0].value, b, p_, y_, saved_);
  else
    be_.ConvForward(*x[0], params_[0].value, b, p_, y_);
  return y_;
}

void Conv2d::Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) {
  Tensor* g = need_dx ? &InputGrad(0, x[0]->shape()) : nullptr;
  be_.ConvBackwardSaved(*x[0], saved_, params_[0].value, dy, p_, g, params_[0].grad,
                        bias_ ? &params_[1].grad : nullptr);
  if (need_dx) dx[0] = *g;
}

// The backward reads x (or the backend's copy of it), not y.
BufferUse Conv2d::Buffers() const { return BufferUse{BufferUse::kOwn, BufferUse::kOwn, false, {true}}; }

void Conv2d::InitParameters(std::mt19937_64& rng) {
  InitWeightAndBias(init_, in_ * kernel_ * kernel_, 2.0, params_[0].value, bias_ ? &params_[1].value : nullptr, rng);
}

}  // namespace shoal
