// The CUDA form of every optimizer in optimizer.cc: the same formulas, in the same
// precision (fp32 elementwise, norms and LAMB's bias-corrected moments in double), so a
// device step agrees with Optimizer::Apply to rounding. Rules that need per-tensor norms
// (LARS, LAMB, STiLL) take two kernels: one pass that updates the moments and sums every
// square they need at once, then the update, which reads the sums from device memory (no
// host round trip between them). The others (Adam and AdamW too) are one elementwise kernel.
#include "algorithms/optimizers/optimizer_gpu_kernel.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace shoal {
namespace {

using Kind = GpuOptimizerKind;
constexpr int kThreads = 256;

__device__ double BlockSum(double v) {
  __shared__ double warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  double s = 0;
  if (threadIdx.x == 0)
    for (int i = 0; i < kThreads / 32; ++i) s += warp_sums[i];
  __syncthreads();  // warp_sums is reused by the next BlockSum
  return s;
}

// LAMB's direction r + wd w from the already-updated moments (LambUpdate in optimizer.cc).
__device__ float LambU(const GpuOptimizerArgs& a, float m, float v, float w) {
  double mh = m / a.bc1, vh = v / a.bc2;
  return float(mh / (sqrt(vh) + a.eps)) + a.wd * w;
}

// LARS's lr x trust ratio (LarsUpdate): eta ||w|| / (||g|| + wd ||w||), eta when a norm is 0.
__device__ float LarsScale(const GpuOptimizerArgs& a, const double* norms) {
  double wn = sqrt(norms[0]), gn = sqrt(norms[1]);
  double local = a.trust_coefficient;
  if (wn > 0 && gn > 0) local = a.trust_coefficient * wn / (gn + a.wd * wn);
  return float(a.lr * local);
}

// LAMB's ||w|| / ||u|| (1 when either is 0).
__device__ double LambRatio(const double* norms) {
  double wn = sqrt(norms[0]), un = sqrt(norms[2]);
  return (wn > 0 && un > 0) ? wn / un : 1.0;
}

// The one reduction pass: ||w||² always, ||g||² for LARS (and STiLL), and for LAMB (and
// STiLL) the moment update with ||u||² of the direction it gives.
__global__ void NormPass(GpuOptimizerArgs a) {
  bool lars = a.kind == Kind::kLars || a.kind == Kind::kStill;
  bool lamb = a.kind == Kind::kLamb || a.kind == Kind::kStill;
  float* m = a.kind == Kind::kStill ? a.slot[1] : a.slot[0];
  float* v = a.kind == Kind::kStill ? a.slot[2] : a.slot[1];
  double sw = 0, sg = 0, su = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < a.n; i += int64_t(gridDim.x) * blockDim.x) {
    float w = a.w[i], g = a.g[i];
    sw += double(w) * w;
    if (lars) sg += double(g) * g;
    if (lamb) {
      float mi = a.beta1 * m[i] + (1 - a.beta1) * g;
      float vi = a.beta2 * v[i] + (1 - a.beta2) * g * g;
      m[i] = mi;
      v[i] = vi;
      float u = LambU(a, mi, vi, w);
      su += double(u) * u;
    }
  }
  sw = BlockSum(sw);
  if (lars) sg = BlockSum(sg);
  if (lamb) su = BlockSum(su);
  if (threadIdx.x == 0) {
    double* part = a.norms + kGpuOptimizerNorms * (1 + blockIdx.x);
    part[0] = sw;
    part[1] = sg;
    part[2] = su;
  }
}

// The blocks' partials summed in block order (deterministic), by one thread: at most
// kGpuOptimizerMaxNormBlocks x 3 additions, small beside the pass itself.
__global__ void SumPartials(double* norms, int blocks) {
  double s[kGpuOptimizerNorms] = {0, 0, 0};
  for (int b = 0; b < blocks; ++b)
    for (int k = 0; k < kGpuOptimizerNorms; ++k) s[k] += norms[kGpuOptimizerNorms * (1 + b) + k];
  for (int k = 0; k < kGpuOptimizerNorms; ++k) norms[k] = s[k];
}

__global__ void Update(GpuOptimizerArgs a) {
  // The per-tensor scalars, once per thread rather than per element.
  bool lars = a.kind == Kind::kLars || a.kind == Kind::kStill;
  bool lamb = a.kind == Kind::kLamb || a.kind == Kind::kStill;
  float lars_s = lars ? LarsScale(a, a.norms) : 0.f;
  double lamb_ratio = lamb ? LambRatio(a.norms) : 1.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < a.n; i += int64_t(gridDim.x) * blockDim.x) {
    float w = a.w[i], g = a.g[i];
    switch (a.kind) {
      case Kind::kSgd:
        a.w[i] = w - a.lr * (g + a.wd * w);
        break;
      case Kind::kMomentum: {
        float d = g + a.wd * w;
        float v = a.momentum * a.slot[0][i] + d;
        a.slot[0][i] = v;
        a.w[i] = w - a.lr * (a.nesterov ? d + a.momentum * v : v);
        break;
      }
      case Kind::kLars: {
        float v = a.momentum * a.slot[0][i] + lars_s * (g + a.wd * w);
        a.slot[0][i] = v;
        a.w[i] = w - v;
        break;
      }
      case Kind::kLamb: {
        float s = float(a.lr * lamb_ratio);
        a.w[i] = w - s * LambU(a, a.slot[0][i], a.slot[1][i], w);
        break;
      }
      case Kind::kStill: {
        // Both updates from the same w_t, then mixed, as Still::Apply does.
        float lamb_lr = a.lr * a.lamb_lr_ratio;
        float s = float(lamb_lr * lamb_ratio) * (1.0f - a.share);
        float lamb_w = w - s * LambU(a, a.slot[1][i], a.slot[2][i], w);
        float v = a.momentum * a.slot[0][i] + lars_s * (g + a.wd * w);
        a.slot[0][i] = v;
        float lars_w = w - a.share * v;
        a.w[i] = lamb_w + (lars_w - w);
        break;
      }
      case Kind::kRmspropSgd: {
        float d = g + a.wd * w;
        float v = a.momentum * a.slot[0][i] + d;
        float ms = a.rms_decay * a.slot[1][i] + (1 - a.rms_decay) * d * d;
        a.slot[0][i] = v;
        a.slot[1][i] = ms;
        float rms = (a.lr * a.rms_lr_ratio) * d / (sqrtf(ms) + a.rms_eps);
        a.w[i] = w - ((1 - a.share) * rms + a.share * a.lr * v);
        break;
      }
      case Kind::kAdam:
      case Kind::kAdamW: {
        // Adam's wd is L2 on the gradient; AdamW's is the host's shrink factor (Adam in optimizer.cc).
        float d = a.kind == Kind::kAdam ? g + a.wd * w : g;
        float m = a.adam_b1 * a.slot[0][i] + a.adam_c1 * d;
        float v = a.adam_b2 * a.slot[1][i] + a.adam_c2 * d * d;
        a.slot[0][i] = m;
        a.slot[1][i] = v;
        a.w[i] = w * a.adam_shrink - a.adam_step_size * (m / (sqrtf(v) / a.adam_bc2_sqrt + a.eps));
        break;
      }
    }
  }
}

}  // namespace

cudaError_t GpuOptimizerApplyRaw(const GpuOptimizerArgs& in, cudaStream_t stream) {
  if (in.n <= 0) return cudaSuccess;
  GpuOptimizerArgs a = in;
  // After warm-up STiLL is LARS alone on its LARS slot; LAMB's moments rest (Still::Apply).
  if (a.kind == Kind::kStill && a.share >= 1.0f) a.kind = Kind::kLars;
  int blocks = int(std::min<int64_t>((a.n + kThreads - 1) / kThreads, 4096));
  if (a.kind == Kind::kLars || a.kind == Kind::kLamb || a.kind == Kind::kStill) {
    const int norm_blocks = std::min(blocks, kGpuOptimizerMaxNormBlocks);
    NormPass<<<norm_blocks, kThreads, 0, stream>>>(a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    SumPartials<<<1, 1, 0, stream>>>(a.norms, norm_blocks);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  Update<<<blocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace shoal
