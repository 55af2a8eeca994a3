// max(x, 0)
#pragma once
#include "worker/engine/layers/layer.h"

namespace shoal {

class ReLU final : public Layer {
 public:
  explicit ReLU(Backend& be) : Layer(be) {}
  std::string Kind() const override { return "ReLU"; }
  Shape OutputShape(const std::vector<Shape>& in) const override {
    CheckInputs(in);
    return in[0];
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override;
  // The backward's mask comes from y, not x.
  BufferUse Buffers() const override { return BufferUse{BufferUse::kOwn, BufferUse::kOwn, true, {false}}; }
};

}  // namespace shoal
