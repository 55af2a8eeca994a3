// Mean softmax cross-entropy with label smoothing: the loss at the end of every model.
// Not a graph node (it takes host labels and returns a scalar); it keeps dlogits across
// steps.
#pragma once
#include "worker/engine/backend.h"

namespace shoal {

class SoftmaxCrossEntropyLoss {
 public:
  explicit SoftmaxCrossEntropyLoss(Backend& be, float smoothing = 0.0f);
  void set_smoothing(float s);
  float smoothing() const { return smoothing_; }
  // labels: host int32[N] for logits [N, K]; for a sequence model's logits [N, T, K],
  // int32[N*T] (position-major within a sample) and the loss is the mean over all N*T
  // positions, *correct a count of positions. Returns the mean loss; fills grad() when want_grad.
  float Forward(const Tensor& logits, const int32_t* labels, bool want_grad, int64_t* correct);
  const Tensor& grad() const { return dlogits_; }

 private:
  Backend& be_;
  float smoothing_;
  Tensor dlogits_;
};

}  // namespace shoal
