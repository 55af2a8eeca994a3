#include "worker/engine/layers/linear.h"

#include <cmath>

#include "common/error.h"

namespace shoal {

Linear::Linear(Backend& be, int64_t in_features, int64_t out_features, bool bias, double init_gain, WeightInit init)
    : Layer(be), in_(in_features), out_(out_features), bias_(bias), gain_(init_gain), init_(init) {
  SHOAL_CHECK(in_ > 0 && out_ > 0 && init_gain > 0,
              "Linear: bad features " + std::to_string(in_) + "->" + std::to_string(out_) + " or init gain");
  AddParam("weight", {out_, in_}, false);
  if (bias_) AddParam("bias", {out_}, true);
}

Shape Linear::OutputShape(const std::vector<Shape>& in) const {
  CheckInputs(in);
  SHOAL_CHECK(in[0].size() == 2 && in[0][1] == in_, "Linear(" + std::to_string(in_) + "->" + std::to_string(out_) +
                                                        "): input must be [N," + std::to_string(in_) + "], got " +
                                                        ShapeString(in[0]));
  return {in[0][0], out_};
}

const Tensor& Linear::Forward(const std::vector<const Tensor*>& x, bool train) {
  (void)train;
  Ensure(y_, OutputShape({x[0]->shape()}));
  be_.LinearForward(*x[0], params_[0].value, bias_ ? params_[1].value : Tensor(), y_);
  return y_;
}

void Linear::Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) {
  Tensor* g = need_dx ? &InputGrad(0, x[0]->shape()) : nullptr;
  be_.LinearBackward(*x[0], params_[0].value, dy, g, params_[0].grad, bias_ ? &params_[1].grad : nullptr);
  if (need_dx) dx[0] = *g;
}

void Linear::InitParameters(std::mt19937_64& rng) {
  InitWeightAndBias(init_, in_, gain_, params_[0].value, bias_ ? &params_[1].value : nullptr, rng);
}

}  // namespace shoal
