// Max pooling over K x K windows.
#pragma once
#include "worker/engine/layers/layer.h"

namespace shoal {

class MaxPool final : public Layer {
 public:
  MaxPool(Backend& be, int kernel, int stride, int pad = 0);
  std::string Kind() const override { return "MaxPool"; }
  Shape OutputShape(const std::vector<Shape>& in) const override;
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override;
  const PoolParams& geometry() const { return p_; }
  // The backward reads x and y (and its workspace, its own).
  BufferUse Buffers() const override { return BufferUse{BufferUse::kOwn, BufferUse::kOwn, true, {true}}; }

 private:
  PoolParams p_;
  Tensor workspace_;
};

}  // namespace shoal
