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
  if (logits.ndim() <= 2)
    return be_.SoftmaxCrossEntropy(logits, labels, smoothing_, want_grad ? &dlogits_ : nullptr, correct);
  // A sequence model's [N, T, V] logits: each position is one row with its own label, so
  // the backends' [rows, classes] kernel gives the mean over all N*T positions as is.
  int64_t rows = 1;
  for (int d = 0; d + 1 < logits.ndim(); ++d) rows *= logits.dim(d);
  const Shape flat = {rows, logits.dim(logits.ndim() - 1)};
  Tensor dflat = want_grad ? dlogits_.Reshape(flat) : Tensor();
  return be_.SoftmaxCrossEntropy(logits.Reshape(flat), labels, smoothing_, want_grad ? &dflat : nullptr, correct);
}

}  // namespace shoal
