// SmoothOut (Wen et al. 2018, "SmoothOut: Smoothing Out Sharp Minima to Improve
// Generalization in Deep Learning"; NNL uses it to keep very large batches accurate): each step
// the forward and backward pass run at weights perturbed by uniform noise in [-a, a], and the
// optimizer then updates the unperturbed weights with that gradient. Averaged over the noise,
// that descends the loss smoothed over a box of side 2a, which flattens sharp minima.
//
// The noise of parameter i at step s is drawn from (the job's seed, s, i) alone, so every
// worker of a synchronous job adds the same noise and their weights stay identical; Restore
// puts back the very bits Perturb saved (w + u - u would not be exact in floats).
#pragma once
#include <cstdint>
#include <vector>

#include "worker/engine/model.h"

namespace shoal {

class SmoothOut {
 public:
  // a = 0: off (Perturb and Restore do nothing).
  SmoothOut(double a, uint64_t seed) : a_(a), seed_(seed) {}
  bool on() const { return a_ > 0; }
  double amplitude() const { return a_; }
  // Before the forward pass of `step`: saves every parameter and adds the step's noise.
  void Perturb(Model& model, int64_t step);
  // After the backward pass: the saved parameters back, bit for bit. The gradients stay.
  void Restore(Model& model);
  // The noise of parameter `index` at `step`: n floats uniform in [-a, a].
  static void Noise(uint64_t seed, int64_t step, size_t index, double a, float* out, int64_t n);

 private:
  const double a_;
  const uint64_t seed_;
  bool perturbed_ = false;
  std::vector<Tensor> saved_, noise_;
  std::vector<float> host_;
};

}  // namespace shoal
