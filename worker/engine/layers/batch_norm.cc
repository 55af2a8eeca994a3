#include "worker/engine/layers/batch_norm.h"

#include "common/error.h"

namespace shoal {

BatchNorm::BatchNorm(Backend& be, int64_t channels, float eps, float momentum, bool zero_gamma)
    : Layer(be), c_(channels), eps_(eps), momentum_(momentum), zero_gamma_(zero_gamma) {
  SHOAL_CHECK(c_ > 0 && eps > 0 && momentum >= 0 && momentum <= 1, "BatchNorm: bad channels/eps/momentum " +
                                                                       std::to_string(c_) + "/" + std::to_string(eps) +
                                                                       "/" + std::to_string(momentum));
  AddParam("gamma", {c_}, true);
  AddParam("beta", {c_}, true);
  AddBuffer("running_mean", {c_});
  AddBuffer("running_var", {c_});
  save_mean_ = be.Zeros({c_});
  save_invstd_ = be.Zeros({c_});
  Reset();
}

Shape BatchNorm::OutputShape(const std::vector<Shape>& in) const {
  CheckInputs(in);
  SHOAL_CHECK((in[0].size() == 2 || in[0].size() == 4) && in[0][1] == c_,
              "BatchNorm(" + std::to_string(c_) + "): input must be [N," + std::to_string(c_) + "(,H,W)], got " +
                  ShapeString(in[0]));
  return in[0];
}

const Tensor& BatchNorm::Forward(const std::vector<const Tensor*>& x, bool train) {
  Ensure(y_, OutputShape({x[0]->shape()}));
  if (train)
    be_.BatchNormForwardTrain(*x[0], params_[0].value, params_[1].value, eps_, momentum_, buffers_[0].value,
                              buffers_[1].value, save_mean_, save_invstd_, y_);
  else
    be_.BatchNormForwardInference(*x[0], params_[0].value, params_[1].value, buffers_[0].value, buffers_[1].value, eps_,
                                  y_);
  return y_;
}

void BatchNorm::Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) {
  // The backend computes dx alongside dgamma/dbeta in one pass, so it is always produced.
  Tensor& g = InputGrad(0, x[0]->shape());
  be_.BatchNormBackward(*x[0], dy, params_[0].value, save_mean_, save_invstd_, eps_, g, params_[0].grad,
                        params_[1].grad);
  if (need_dx) dx[0] = g;
}

// The backward reads x and the saved statistics, not y.
BufferUse BatchNorm::Buffers() const { return BufferUse{BufferUse::kOwn, BufferUse::kOwn, false, {true}}; }

void BatchNorm::InitParameters(std::mt19937_64& rng) {
  (void)rng;  // deterministic: no draws
  Reset();
}

void BatchNorm::Reset() {
  be_.Fill(params_[0].value, zero_gamma_ ? 0.0f : 1.0f);
  be_.Fill(params_[1].value, 0.0f);
  be_.Fill(buffers_[0].value, 0.0f);
  be_.Fill(buffers_[1].value, 1.0f);
}

}  // namespace shoal
