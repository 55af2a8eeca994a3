// The nvcc-compiled half of optimizer_gpu.h (no Shoal headers: nvcc sees only this package).
// One call applies one optimizer step to one tensor in device memory; the wrapper
// (DeviceOptimizer, optimizer_gpu.cc) fills the arguments from OptimizerHyper/StepContext.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace shoal {

enum class GpuOptimizerKind : int { kSgd, kMomentum, kLars, kLamb, kStill, kRmspropSgd, kAdam, kAdamW };

// The norm pass's sums of squares ||w||², ||g||², ||u||², and before them each block's
// partial sums: the scratch a tensor's state owns (kGpuOptimizerScratch doubles). Partials
// are added in block order by one thread, never with atomics, so the sums (and the weights)
// are the same bits on every run and every worker: allreduce keeps replicas identical.
constexpr int kGpuOptimizerNorms = 3;
constexpr int kGpuOptimizerMaxNormBlocks = 1024;
constexpr int kGpuOptimizerScratch = kGpuOptimizerNorms * (1 + kGpuOptimizerMaxNormBlocks);

struct GpuOptimizerArgs {
  GpuOptimizerKind kind = GpuOptimizerKind::kSgd;
  float* w = nullptr;
  const float* g = nullptr;
  int64_t n = 0;
  float* slot[3] = {nullptr, nullptr, nullptr};  // same slots, same order as OptimizerState
  double* norms = nullptr;                       // kGpuOptimizerScratch doubles of device scratch
  float lr = 0;
  float wd = 0;             // 0 for decay=false tensors
  float share = 1;          // STiLL's LARS share, rmsprop_sgd's momentum-SGD share (1 after warm-up)
  double bc1 = 1, bc2 = 1;  // LAMB bias corrections 1 - beta^t, computed on the host in double
  // Adam/AdamW's AdamScalars (optimizer.h), the CPU rule's very floats.
  float adam_b1 = 0.9f, adam_c1 = 0.1f, adam_b2 = 0.999f, adam_c2 = 0.001f;
  float adam_step_size = 0, adam_bc2_sqrt = 1, adam_shrink = 1;
  // OptimizerHyper, copied field by field.
  float momentum = 0.9f;
  bool nesterov = false;
  float trust_coefficient = 0.001f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-6f;
  float lamb_lr_ratio = 1.0f;
  float rms_decay = 0.99f, rms_eps = 1e-8f, rms_lr_ratio = 0.01f;
};

// Enqueues the step's kernels on `stream` (a norm pass where the rule needs norms, then one
// update kernel); returns the first launch error, cudaSuccess otherwise. Asynchronous.
cudaError_t GpuOptimizerApplyRaw(const GpuOptimizerArgs& a, cudaStream_t stream);

}  // namespace shoal
