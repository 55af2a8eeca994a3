// [N, ...] -> [N, prod(...)]: a view, no copy either way.
#pragma once
#include "worker/engine/layers/layer.h"

namespace shoal {

class Flatten final : public Layer {
 public:
  explicit Flatten(Backend& be) : Layer(be) {}
  std::string Kind() const override { return "Flatten"; }
  Shape OutputShape(const std::vector<Shape>& in) const override;
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override;
  BufferUse Buffers() const override { return BufferUse{BufferUse::kView, BufferUse::kView, false, {false}}; }
};

}  // namespace shoal
