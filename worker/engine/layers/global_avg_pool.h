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

 private:
  Tensor dx_;
};

}  // namespace shoal
