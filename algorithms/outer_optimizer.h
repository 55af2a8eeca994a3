// DiLoCo's outer step (Douillard et al. 2023, Algorithm 1), as a pure function so it can be
// checked by hand. The pseudo-gradient is the mean over workers of (global - local) after a
// round of inner steps; the outer optimizer is PyTorch's SGD (dampening 0, no weight decay)
// applied to it as if it were a gradient:
//   b_t  = mu b_{t-1} + delta                (b_0 = 0, so b_1 = delta, as PyTorch's first step)
//   step = delta + mu b_t  (nesterov)  |  b_t  (sgd; with mu = 0 that is delta)
//   global_t = global_{t-1} - lr step
// Plain model averaging is "sgd" with lr 1 and mu 0. Unlike bmuf's block momentum there is
// no (1 - mu) factor and the workers continue from global_t itself.
#pragma once
#include <cstdint>
#include <string>

namespace shoal {

enum class OuterRule { kSgd, kNesterov };

struct OuterOptimizerParams {
  OuterRule rule = OuterRule::kNesterov;
  float lr = 0.7f;        // outer_lr (the paper's 0.7)
  float momentum = 0.9f;  // outer_momentum (mu)
};

// delta: the mean pseudo-gradient; updates global and the momentum buffer b in place.
inline void ApplyOuterStep(const OuterOptimizerParams& p, const float* delta, int64_t n, float* global, float* b) {
  for (int64_t i = 0; i < n; ++i) {
    b[i] = p.momentum * b[i] + delta[i];
    const float step = p.rule == OuterRule::kNesterov ? delta[i] + p.momentum * b[i] : b[i];
    global[i] = global[i] - p.lr * step;
  }
}

}  // namespace shoal
