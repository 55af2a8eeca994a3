#include "worker/engine/layers/layer.h"

#include <cmath>

#include "common/error.h"

namespace shoal {

void Layer::PlaceInputGrad(size_t k, Tensor t) {
  if (input_grads_.size() <= k) input_grads_.resize(k + 1);
  input_grads_[k] = std::move(t);
}

Parameter& Layer::AddParam(const std::string& name, const Shape& s, bool no_weight_decay) {
  Parameter p;
  p.name = name;
  p.value = be_.Zeros(s);
  p.grad = be_.Zeros(s);
  p.no_weight_decay = no_weight_decay;
  params_.push_back(std::move(p));
  return params_.back();
}

Buffer& Layer::AddBuffer(const std::string& name, const Shape& s) {
  buffers_.push_back(Buffer{name, be_.Zeros(s)});
  return buffers_.back();
}

void Layer::InitWeightAndBias(WeightInit init, int64_t fan_in, double gain, Tensor& weight, Tensor* bias,
                              std::mt19937_64& rng) {
  auto draw = [&](Tensor& t, auto dist) {
    std::vector<float> host(size_t(t.numel()));
    for (float& v : host) v = float(dist(rng));
    be_.CopyFromHost(t, host.data());
  };
  if (init == WeightInit::kHeNormal) {
    draw(weight, std::normal_distribution<double>(0.0, std::sqrt(gain / double(fan_in))));
    if (bias) be_.Fill(*bias, 0.0f);
  } else {
    const double bound = 1.0 / std::sqrt(double(fan_in));
    draw(weight, std::uniform_real_distribution<double>(-bound, bound));
    if (bias) draw(*bias, std::uniform_real_distribution<double>(-bound, bound));
  }
}

void Layer::CheckInputs(const std::vector<Shape>& in) const {
  SHOAL_CHECK(int(in.size()) == NumInputs(),
              Kind() + ": expected " + std::to_string(NumInputs()) + " input(s), got " + std::to_string(in.size()));
}

}  // namespace shoal
