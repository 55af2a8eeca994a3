#include "worker/engine/layers/softmax_cross_entropy.h"

#include "common/error.h"

namespace shoal {

SoftmaxCrossEntropyLoss::SoftmaxCrossEntropyLoss(Backend& be, float smoothing) : be_(be) { set_smoothing(smoothing); }

void SoftmaxCrossEntropyLoss::set_smoothing(float s) {
  SHOAL_CHECK(s >= 0 && s < 1, "label smoothing must be in [0, 1), got " + std::to_string(s));
  smoothing_ = s;
}

float SoftmaxCrossEntropyLoss::Forward(const Tensor& logits, const int32_t* labels, bool want_grad, int64_t* correct) {
  if (want_grad && (!dlogits_.defined() || dlogits_.shape() != logits.shape())) dlogits_ = be_.Empty(logits.shape());
  return be_.SoftmaxCrossEntropy(logits, labels, smoothing_, want_grad ? &dlogits_ : nullptr, correct);
}

}  // namespace shoal
