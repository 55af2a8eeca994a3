// Fully connected: y[N,O] = x[N,I] W[O,I]^T + b[O].
#pragma once
#include "worker/engine/layers/layer.h"

namespace shoal {

class Linear final : public Layer {
 public:
  // init_gain (He normal only): weights start at N(0, init_gain / in_features): 2 ahead of
  // a ReLU, 1 for the logits layer, whose outputs feed no rectifier.
  Linear(Backend& be, int64_t in_features, int64_t out_features, bool bias = true, double init_gain = 2.0,
         WeightInit init = WeightInit::kHeNormal);
  std::string Kind() const override { return "Linear"; }
  Shape OutputShape(const std::vector<Shape>& in) const override;
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override;
  void InitParameters(std::mt19937_64& rng) override;
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return bias_; }
  // The backward reads x, not y.
  BufferUse Buffers() const override { return BufferUse{BufferUse::kOwn, BufferUse::kOwn, false, {true}}; }

 private:
  int64_t in_, out_;
  bool bias_;
  double gain_;
  WeightInit init_;
};

}  // namespace shoal
