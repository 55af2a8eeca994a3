// Residual sum of two same-shaped inputs.
#pragma once
#include "worker/engine/layers/layer.h"

namespace shoal {

class AddLayer final : public Layer {
 public:
  explicit AddLayer(Backend& be) : Layer(be) {}
  std::string Kind() const override { return "Add"; }
  int NumInputs() const override { return 2; }
  Shape OutputShape(const std::vector<Shape>& in) const override;
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override;
  // Both gradients are dy itself (aliases; the model copies before accumulating into one).
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override;
  BufferUse Buffers() const override { return BufferUse{BufferUse::kOwn, BufferUse::kView, false, {false, false}}; }
};

}  // namespace shoal
