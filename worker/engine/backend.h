// Backend: the numeric operations layers need, implemented once per device kind.
// CpuBackend (oneDNN) and CudaBackend (cuDNN + cuBLAS + own kernels) implement it; layers
// and models call only this interface, so the same model code runs on either.
//
// Conventions: activations are NCHW fp32 unless a dtype is given; all tensors passed to
// one call live on this backend's device; outputs are preallocated by the caller (with
// Empty/Zeros) and overwritten, except gradients of parameters, which are ACCUMULATED
// (+=) so a parameter used twice gets both contributions; callers zero them per step.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "common/device_fence.h"
#include "worker/engine/tensor.h"

namespace shoal {

struct ConvParams {
  int stride = 1;
  int pad = 0;
};

struct PoolParams {
  int kernel = 2;
  int stride = 2;
  int pad = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string Name() const = 0;  // e.g. "cpu/oneDNN", "cuda:0/H100"
  // The arithmetic of convolutions and fully connected layers: kF32, or kBF16/kF16 inputs
  // with fp32 accumulation (mixed precision). Tensors between layers, weights and
  // gradients stay fp32 either way: the optimizer updates fp32 master weights.
  virtual DType compute_dtype() const { return DType::kF32; }

  // ---- memory
  virtual Tensor Empty(const Shape& shape, DType dtype = DType::kF32) = 0;
  Tensor Zeros(const Shape& shape, DType dtype = DType::kF32);
  virtual void Fill(Tensor& t, float value) = 0;
  // Copies between this backend's device and host memory (n = t.bytes()).
  virtual void CopyFromHost(Tensor& dst, const void* src) = 0;
  virtual void CopyToHost(const Tensor& src, void* dst) = 0;
  virtual void Copy(const Tensor& src, Tensor& dst) = 0;  // same device
  virtual void Synchronize() {}
  // A marker of the work queued so far (common/device_fence.h states the ordering
  // contract); null where every call is finished when it returns (the CPU).
  virtual std::shared_ptr<const DeviceFence> RecordFence() { return nullptr; }
  // Host memory for staging this device's copies: page-locked on CUDA, so copies run at
  // full bus speed and the Async variants below do not wait; plain memory elsewhere.
  virtual std::shared_ptr<void> AllocHost(size_t bytes);
  // Queued copies, complete after the next Synchronize(): the host side must stay untouched
  // until then. Many copies then one Synchronize cost one wait instead of one per tensor.
  // Defaults: the synchronous copies.
  virtual void CopyFromHostAsync(Tensor& dst, const void* src) { CopyFromHost(dst, src); }
  virtual void CopyToHostAsync(const Tensor& src, void* dst) { CopyToHost(src, dst); }

  // ---- convolution, weights OIHW, bias [O] (may be undefined)
  virtual void ConvForward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y) = 0;
  // dx may be undefined (first layer); dw, db accumulate.
  virtual void ConvBackward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvParams& p, Tensor* dx,
                            Tensor& dw, Tensor* db) = 0;
  // Training variants: the forward may keep what its backward can reuse in `saved` (a
  // backend-private copy of x, e.g. in the layout the kernels want), allocated by the
  // backend on first use; pass the same Tensor object, with x unchanged, to the backward.
  // Backends without such a cache inherit these defaults, which ignore `saved`.
  virtual void ConvForwardTrain(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y,
                                Tensor& saved) {
    (void)saved;
    ConvForward(x, w, b, p, y);
  }
  virtual void ConvBackwardSaved(const Tensor& x, const Tensor& saved, const Tensor& w, const Tensor& dy,
                                 const ConvParams& p, Tensor* dx, Tensor& dw, Tensor* db) {
    (void)saved;
    ConvBackward(x, w, dy, p, dx, dw, db);
  }

  // ---- batch norm over N,H,W per channel (x is [N,C,H,W] or [N,C])
  // training: uses batch stats, updates running_* with `momentum` (new = (1-m)*old + m*batch,
  // running_var uses the unbiased variance), saves mean and inverse std for backward.
  virtual void BatchNormForwardTrain(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                     float momentum, Tensor& running_mean, Tensor& running_var, Tensor& save_mean,
                                     Tensor& save_invstd, Tensor& y) = 0;
  virtual void BatchNormForwardInference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                         const Tensor& running_mean, const Tensor& running_var, float eps,
                                         Tensor& y) = 0;
  // eps: the forward's (cuDNN asks for it beside the saved statistics).
  virtual void BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                                 const Tensor& save_invstd, float eps, Tensor& dx, Tensor& dgamma, Tensor& dbeta) = 0;

  // ---- elementwise
  virtual void ReluForward(const Tensor& x, Tensor& y) = 0;
  virtual void ReluBackward(const Tensor& y, const Tensor& dy, Tensor& dx) = 0;  // uses y > 0
  virtual void Add(const Tensor& a, const Tensor& b, Tensor& y) = 0;             // y = a + b
  virtual void Axpy(float alpha, const Tensor& x, Tensor& y) = 0;                // y += alpha x
  virtual void Scale(float alpha, Tensor& x) = 0;                                // x *= alpha

  // ---- pooling; max pool keeps what backward needs in `workspace` (allocated by the
  // backend on first use; pass the same Tensor object to backward).
  virtual void MaxPoolForward(const Tensor& x, const PoolParams& p, Tensor& y, Tensor& workspace) = 0;
  virtual void MaxPoolBackward(const Tensor& x, const Tensor& y, const Tensor& dy, const PoolParams& p,
                               const Tensor& workspace, Tensor& dx) = 0;
  virtual void GlobalAvgPoolForward(const Tensor& x, Tensor& y) = 0;  // [N,C,H,W] -> [N,C]
  virtual void GlobalAvgPoolBackward(const Tensor& dy, Tensor& dx) = 0;

  // ---- fully connected: y[N,O] = x[N,I] w[O,I]^T + b[O]
  virtual void LinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) = 0;
  // dx may be null; dw, db accumulate.
  virtual void LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                              Tensor* db) = 0;

  // ---- loss: mean softmax cross-entropy over the batch with label smoothing eps
  // (target = (1-eps) one-hot + eps/K). labels: host int32[N]. Writes dlogits (already
  // divided by N), returns the mean loss; *correct gets the count of argmax == label.
  virtual float SoftmaxCrossEntropy(const Tensor& logits, const int32_t* labels, float smoothing, Tensor* dlogits,
                                    int64_t* correct) = 0;

  // ---- reductions used by optimizers (fp32)
  virtual double SumSquares(const Tensor& x) = 0;
};

// The CPU backend (oneDNN); `threads` = 0 means all cores. compute kBF16 needs a processor
// with bf16 instructions (AVX512-BF16 or AMX-BF16): without, a clear shoal::Error; kF16 is
// refused (CPUs have no fp16 arithmetic faster than fp32).
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0, DType compute = DType::kF32);
// The CUDA backend on device `index`; throws shoal::Error with a clear message when no
// CUDA device is present (never crashes). compute kBF16/kF16: convolutions and fully
// connected layers on tensor cores in that type, fp32 everywhere else (cuda_backend.h).
std::unique_ptr<Backend> MakeCudaBackend(int index, DType compute = DType::kF32);
std::unique_ptr<Backend> MakeBackend(const Device& d, int threads = 0, DType compute = DType::kF32);

}  // namespace shoal
