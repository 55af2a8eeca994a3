// 2-D convolution, weights [O,C,K,K], optional bias [O].
#pragma once
#include "worker/engine/layers/layer.h"

namespace shoal {

class Conv2d final : public Layer {
 public:
  Conv2d(Backend& be, int64_t in_channels, int64_t out_channels, int kernel, int stride, int pad, bool bias,
         WeightInit init = WeightInit::kHeNormal);
  std::string Kind() const override { return "Conv2d"; }
  Shape OutputShape(const std::vector<Shape>& in) const override;
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override;
  void InitParameters(std::mt19937_64& rng) override;
  BufferUse Buffers() const override;
  // Geometry, read by the ONNX exporter.
  int64_t in_channels() const { return in_; }
  int64_t out_channels() const { return out_; }
  int kernel() const { return kernel_; }
  const ConvParams& geometry() const { return p_; }
  bool has_bias() const { return bias_; }

 private:
  int64_t in_, out_;
  int kernel_;
  ConvParams p_;
  bool bias_;
  WeightInit init_;
  Tensor saved_;  // the backend's copy of x from the last training forward
};

}  // namespace shoal
