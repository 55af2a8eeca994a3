// Mean over H,W: [N,C,H,W] -> [N,C].
#pragma once
#include "worker/engine/layers/layer.h"

namespace shoal {

class GlobalAvgPool final : public Layer {
 public:
  explicit GlobalAvgPool(Backend& be) : Layer(be) {}
  std::string Kind() const override { return "GlobalAvgPool"; }
  Shape OutputShape(const std::vector<Shape>& in) const override;
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override;
  // The backward spreads dy evenly: it reads neither x's values nor y.
  BufferUse Buffers() const override { return BufferUse{BufferUse::kOwn, BufferUse::kOwn, false, {false}}; }
};

}  // namespace shoal
