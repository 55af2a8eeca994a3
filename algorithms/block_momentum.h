// BMUF's block update (Chen & Huo 2016; seed 003 Algorithm 1), as a pure function so it
// can be checked by hand:
//   v_t = eta_B v_{t-1} + (1 - eta_B) eps_B mean_k(g_k),   g_k = w_0^(k) - w_n^(k)
//   w_t = w_{t-1} - v_t
//   next local start = w_t - eta_B v_t (Nesterov) or w_t.
// With eta_B = 0 and eps_B = 1 this is plain model averaging (local SGD). The seed writes
// the sum over the K workers; we use the mean so block_lr = 1 means "no extra step size"
// whatever K is.
#pragma once
#include <cstdint>

namespace shoal {

struct BlockMomentumParams {
  float momentum = 0.9f;  // eta_B
  float lr = 1.0f;        // eps_B
  bool nesterov = true;
};

// mean_delta: mean over workers of (block start - block end). Updates global and v in
// place and writes the next local start.
inline void ApplyBlockMomentum(const BlockMomentumParams& p, const float* mean_delta, int64_t n, float* global,
                               float* v, float* local_start) {
  for (int64_t i = 0; i < n; ++i) {
    v[i] = p.momentum * v[i] + (1.0f - p.momentum) * p.lr * mean_delta[i];
    global[i] -= v[i];
    local_start[i] = p.nesterov ? global[i] - p.momentum * v[i] : global[i];
  }
}

}  // namespace shoal
