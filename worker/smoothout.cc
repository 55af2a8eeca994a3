#include "worker/smoothout.h"

#include "common/error.h"
#include "worker/data/random.h"

namespace shoal {

void SmoothOut::Noise(uint64_t seed, int64_t step, size_t index, double a, float* out, int64_t n) {
  data::Rng rng(data::MixSeed(data::MixSeed(seed ^ 0x5300700075ULL, uint64_t(step)), uint64_t(index)));
  for (int64_t i = 0; i < n; ++i) out[i] = float(a * (2.0 * rng.Uniform() - 1.0));
}

void SmoothOut::Perturb(Model& model, int64_t step) {
  if (!on()) return;
  SHOAL_CHECK(!perturbed_, "SmoothOut: Perturb twice without Restore");
  Backend& be = model.backend();
  auto& ps = model.parameters();
  if (saved_.size() != ps.size()) {
    saved_.clear();
    noise_.clear();
    for (auto& p : ps) {
      saved_.push_back(be.Empty(p.value.shape(), p.value.dtype()));
      noise_.push_back(be.Empty(p.value.shape(), p.value.dtype()));
    }
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    const int64_t n = ps[i].value.numel();
    host_.resize(size_t(n));
    Noise(seed_, step, i, a_, host_.data(), n);
    be.CopyFromHost(noise_[i], host_.data());
    be.Copy(ps[i].value, saved_[i]);
    be.Axpy(1.0f, noise_[i], ps[i].value);
  }
  perturbed_ = true;
}

void SmoothOut::Restore(Model& model) {
  if (!perturbed_) return;
  Backend& be = model.backend();
  auto& ps = model.parameters();
  for (size_t i = 0; i < ps.size(); ++i) be.Copy(saved_[i], ps[i].value);
  perturbed_ = false;
}

}  // namespace shoal
