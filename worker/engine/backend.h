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
#include <vector>

#include "common/device_fence.h"
#include "worker/engine/memory_counter.h"
#include "worker/engine/tensor.h"

namespace shoal {

// Convolution geometry. `stride` and `pad` are the height's, and the width's too unless
// stride_w / pad_w are set (>= 0): the zoo's square convolutions set two numbers, imported
// graphs all of them. Padding is symmetric per dimension (an imported graph's uneven padding
// becomes an explicit pad before the convolution). Weights are [O, I / groups, KH, KW].
struct ConvParams {
  int stride = 1;
  int pad = 0;
  int stride_w = -1;
  int pad_w = -1;
  int dilation = 1;
  int dilation_w = -1;
  int groups = 1;

  int sh() const { return stride; }
  int sw() const { return stride_w >= 0 ? stride_w : stride; }
  int ph() const { return pad; }
  int pw() const { return pad_w >= 0 ? pad_w : pad; }
  int dh() const { return dilation; }
  int dw() const { return dilation_w >= 0 ? dilation_w : dilation; }
  bool operator<(const ConvParams& o) const;
  // The output size along one dimension, or <= 0 when the window does not fit.
  static int64_t OutSize(int64_t in, int64_t k, int s, int p, int d) { return (in + 2 * p - d * (k - 1) - 1) / s + 1; }
};

// Pooling geometry, square unless the _w fields are set (>= 0), symmetric padding.
struct PoolParams {
  int kernel = 2;
  int stride = 2;
  int pad = 0;
  int kernel_w = -1;
  int stride_w = -1;
  int pad_w = -1;
  // Average pooling only: whether padded positions count in the divisor.
  bool count_include_pad = false;

  int kh() const { return kernel; }
  int kw() const { return kernel_w >= 0 ? kernel_w : kernel; }
  int sh() const { return stride; }
  int sw() const { return stride_w >= 0 ? stride_w : stride; }
  int ph() const { return pad; }
  int pw() const { return pad_w >= 0 ? pad_w : pad; }
};

// Elementwise ops of imported graphs (worker/engine/onnx). Parameters a, b as noted.
enum class UnaryOp {
  kIdentity,
  kNeg,
  kRelu,
  kLeakyRelu,  // a: slope for x < 0
  kClip,       // a: min, b: max
  kSigmoid,
  kTanh,
  kErf,
  kSqrt,
  kExp,
  kLog,
  kAbs,
  kReciprocal,
  kPowScalar,  // x^a
  kAffine,     // a x + b
};
// Binary ops broadcast their inputs numpy-style to the output's shape. Comparisons give 1 or 0.
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kPow, kMax, kMin, kEqual, kLess, kGreater };

// Where a strided walk reads or writes: an offset and one stride per dimension walked, in
// elements (stride 0 repeats an element: broadcasting).
struct StridedView {
  int64_t offset = 0;
  std::vector<int64_t> strides;
};
// The contiguous (row-major) strides of a shape.
std::vector<int64_t> ContiguousStrides(const Shape& s);

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
  // The device memory in the buffers this backend's allocator handed out (tensors; on CUDA
  // also its scratch and workspace), each counted at its rounded size: live now, and the
  // most at once since the backend was made or ResetPeakMemory.
  MemoryStats Memory() const { return memory_->Stats(); }
  void ResetPeakMemory() { memory_->ResetPeak(); }
  // What the allocator rounds every buffer up to (its alignment); the memory planner
  // (memory_plan.h) places buffers at multiples of it.
  virtual size_t AllocationAlignment() const { return 64; }
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

  // ---- general ops for imported (ONNX) graphs; fp32, at most kMaxTensorDims dimensions.
  // Backends that lack one throw shoal::Error naming it and the backend (these defaults).
  //
  // y = op(x) elementwise; dx = dy * op'(x) (y is op's output, for ops whose derivative
  // reads it more cheaply).
  virtual void Unary(UnaryOp op, const Tensor& x, Tensor& y, float a = 0, float b = 0);
  virtual void UnaryBackward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, float a = 0,
                             float b = 0);
  // y = op(a, b), a and b broadcast to y's shape (same rank or fewer dimensions, aligned right).
  virtual void Binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& y);
  // y = cond != 0 ? a : b, all three broadcast to y's shape.
  virtual void Where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& y);
  // y = alpha * sum of x over the dimensions where y has size 1 and x does not (y has x's
  // rank, or fewer dimensions aligned right); += when accumulate.
  virtual void ReduceSum(const Tensor& x, Tensor& y, float alpha = 1.0f, bool accumulate = false);
  // dst[dv] = (or +=) src[sv], walking `shape`. Covers transpose, slice, concat, split, pad,
  // expand (a source stride of 0). Written positions must not repeat when accumulating.
  virtual void StridedCopy(const Tensor& src, const StridedView& sv, Tensor& dst, const StridedView& dv,
                           const Shape& shape, bool accumulate = false);
  // c[B,M,N] = alpha op(a) op(b) + beta c, batched: a is [Ba,M,K] ([Ba,K,M] if ta), b
  // [Bb,K,N] ([Bb,N,K] if tb), Ba and Bb each B or 1 (1: the same matrix for every batch).
  virtual void MatMul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha = 1.0f,
                      float beta = 0.0f);
  // Softmax (log-softmax when `log`) of x along `axis`; backward from y, its output.
  virtual void Softmax(const Tensor& x, int axis, bool log, Tensor& y);
  virtual void SoftmaxBackward(const Tensor& y, const Tensor& dy, int axis, bool log, Tensor& dx);
  // Normalizes each row of `cols` trailing elements: y = (x - mean) * invstd * gamma + beta
  // (gamma [cols], beta [cols] or undefined). mean and invstd [rows] are saved for backward;
  // dgamma and dbeta (may be null) accumulate.
  virtual void LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t cols, float eps,
                                Tensor& y, Tensor& mean, Tensor& invstd);
  virtual void LayerNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                                 const Tensor& invstd, int64_t cols, Tensor& dx, Tensor* dgamma, Tensor* dbeta);
  // y = x indexed along `axis` by `indices` (fp32 holding integers; negative count from the
  // end): y's shape is x's with that dimension replaced by indices' shape. An index out of
  // range throws. Backward: dx += scatter of dy (dx zeroed by the caller).
  virtual void IndexSelect(const Tensor& x, const Tensor& indices, int axis, Tensor& y);
  virtual void IndexSelectBackward(const Tensor& dy, const Tensor& indices, int axis, Tensor& dx);
  // Average pooling over [N,C,H,W].
  virtual void AvgPoolForward(const Tensor& x, const PoolParams& p, Tensor& y);
  virtual void AvgPoolBackward(const Tensor& dy, const PoolParams& p, Tensor& dx);
  // mask[i] = 1 / (1 - ratio) with probability 1 - ratio, else 0, drawn from a hash of
  // (seed, i): the same mask on every backend for the same seed.
  virtual void DropoutMask(uint64_t seed, float ratio, Tensor& mask);

 protected:
  // Every allocator of a backend reports to this counter (Memory()).
  const std::shared_ptr<MemoryCounter>& memory_counter() const { return memory_; }

 private:
  std::shared_ptr<MemoryCounter> memory_ = std::make_shared<MemoryCounter>();
};

// The hash DropoutMask draws from: a uniform number in [0, 1) for element i.
inline float HashUniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f);
}

// The CPU backend (oneDNN); `threads` = 0 means all cores. compute kBF16 needs a processor
// with bf16 instructions (AVX512-BF16 or AMX-BF16): without, a clear shoal::Error; kF16 is
// refused (CPUs have no fp16 arithmetic faster than fp32).
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0, DType compute = DType::kF32);
// The CUDA backend on device `index`; throws shoal::Error with a clear message when no
// CUDA device is present (never crashes). compute kBF16/kF16: convolutions and fully
// connected layers on tensor cores in that type, fp32 everywhere else (cuda_backend.h).
// allow_tf32: fp32 convolutions and matrix products on TF32 tensor cores (10-bit mantissa
// inputs, fp32 accumulation), off by default so fp32 matches the CPU backend.
std::unique_ptr<Backend> MakeCudaBackend(int index, DType compute = DType::kF32, bool allow_tf32 = false);

std::unique_ptr<Backend> MakeBackend(const Device& d, int threads = 0, const Precision& precision = Precision());

}  // namespace shoal
