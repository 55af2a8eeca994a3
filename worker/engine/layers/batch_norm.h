// Batch normalization over N,H,W per channel (input [N,C,H,W] or [N,C]). Training uses
// batch statistics and updates the running ones; inference uses the running ones.
#pragma once
#include "worker/engine/layers/layer.h"

namespace shoal {

class BatchNorm final : public Layer {
 public:
  // zero_gamma: start with scale 0, so a residual block begins as the identity (seed
  // papers' zero-γ init for large-batch training).
  BatchNorm(Backend& be, int64_t channels, float eps = 1e-5f, float momentum = 0.1f, bool zero_gamma = false);
  std::string Kind() const override { return "BatchNorm"; }
  Shape OutputShape(const std::vector<Shape>& in) const override;
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override;
  void InitParameters(std::mt19937_64& rng) override;
  BufferUse Buffers() const override;
  void set_zero_gamma(bool z) { zero_gamma_ = z; }
  int64_t channels() const { return c_; }
  float eps() const { return eps_; }
  // PyTorch's sense: the weight of the new batch's statistics (ONNX's momentum is 1 - this).
  float momentum() const { return momentum_; }

 private:
  void Reset();
  int64_t c_;
  float eps_, momentum_;
  bool zero_gamma_;
  Tensor save_mean_, save_invstd_;
};

}  // namespace shoal
