// CudaBackend: the Backend interface on one CUDA device, with cuDNN for convolution,
// batch norm, pooling and softmax, cuBLAS for the fully connected layer and MatMul, and own
// kernels (kernels.cu, graph_kernels.cu) for the rest. All work goes on one stream owned by
// the backend.
//
// One backend serves one thread at a time (its descriptor caches are unguarded); tensors it
// allocates may be released from any thread.
//
// fp32 results are computed in true fp32 by default (no TF32 tensor-core math), so they
// match the CPU backend to ~1e-5 relative; Options::allow_tf32 trades that for speed.
// Mixed precision: convolution, batch norm, pooling, linear and the elementwise ops also
// take fp16 or bf16 activations (all activations, weights and their gradients of one call
// in that type; batch-norm parameters and statistics stay fp32), computing in fp32 with
// tensor cores. The loss and SumSquares take fp32 only.
//
// Options::compute = kBF16/kF16 is the model-level mixed mode (Backend::compute_dtype()),
// the CPU backend's contract: every tensor at the interface is fp32 (weights, gradients,
// activations), and only convolution and the fully connected layer compute in the narrow
// type. They cast their inputs and weights on the way in, run on tensor cores with fp32
// accumulation and hand back fp32 (parameter gradients still accumulate in fp32).
// Convolutions run NHWC there: one kernel casts and transposes x (and dy) to NHWC and w to
// KRSC (layout_cast.h), another brings cuDNN's NHWC output back to fp32 NCHW, adding the
// bias on the way. ConvForwardTrain keeps the narrow NHWC copy of x in `saved` for the
// backward. Channel counts that are not multiples of 8 (the 3-channel input layer) stay NCHW:
// cuDNN's NHWC tensor-core kernels want multiples of 8.
#pragma once
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/engine/backend.h"
#include "worker/engine/cuda/cuda_alloc.h"
#include "worker/engine/cuda/cuda_util.h"

namespace shoal {

// Descriptors and chosen algorithms for one convolution shape, built on first use.
struct CudaConvPlan {
  cudautil::TensorDesc x, y;
  cudautil::FilterDesc w;
  cudautil::ConvDesc conv;
  DType dtype = DType::kF32;
  int64_t n = 0, o = 0, ho = 0, wo = 0;  // output dims
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  cudnnMathType_t fwd_math{}, bwd_data_math{}, bwd_filter_math{};
  size_t fwd_bytes = 0, bwd_data_bytes = 0, bwd_filter_bytes = 0;
  bool has_fwd = false, has_bwd = false;
  // Mixed mode: x, w, y live in cuDNN as NHWC / KRSC (else NCHW / OIHW).
  bool nhwc = false;
  std::string where;  // the shapes and geometry, for messages
};

class CudaBackend final : public Backend {
 public:
  struct Options {
    bool allow_tf32 = false;
    bool deterministic = true;                     // convolution algorithms that give the same bits on every run only
    size_t max_workspace_bytes = size_t(1) << 30;  // per convolution algorithm
    DType compute = DType::kF32;                   // kBF16 / kF16: the mixed mode above
  };
  // Throws shoal::Error when the device cannot be used.
  CudaBackend(int index, Options options);
  explicit CudaBackend(int index) : CudaBackend(index, Options()) {}
  ~CudaBackend() override;

  Device device() const override { return {DeviceKind::kCuda, index_}; }
  std::string Name() const override { return name_; }
  DType compute_dtype() const override { return options_.compute; }
  cudaStream_t stream() const { return stream_; }

  Tensor Empty(const Shape& shape, DType dtype = DType::kF32) override;
  size_t AllocationAlignment() const override { return CudaAllocator::kAlign; }
  void Fill(Tensor& t, float value) override;
  void CopyFromHost(Tensor& dst, const void* src) override;
  void CopyToHost(const Tensor& src, void* dst) override;
  // Same dtype: a device copy; different dtypes: an elementwise conversion.
  void Copy(const Tensor& src, Tensor& dst) override;
  void Synchronize() override;
  std::shared_ptr<const DeviceFence> RecordFence() override;  // a cudaEvent on the stream
  // Page-locked (cudaMallocHost), freed by its last reference.
  std::shared_ptr<void> AllocHost(size_t bytes) override;
  void CopyFromHostAsync(Tensor& dst, const void* src) override;
  void CopyToHostAsync(const Tensor& src, void* dst) override;

  void ConvForward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y) override;
  void ConvBackward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvParams& p, Tensor* dx, Tensor& dw,
                    Tensor* db) override;
  void ConvForwardTrain(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y,
                        Tensor& saved) override;
  void ConvBackwardSaved(const Tensor& x, const Tensor& saved, const Tensor& w, const Tensor& dy, const ConvParams& p,
                         Tensor* dx, Tensor& dw, Tensor* db) override;

  void BatchNormForwardTrain(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, float momentum,
                             Tensor& running_mean, Tensor& running_var, Tensor& save_mean, Tensor& save_invstd,
                             Tensor& y) override;
  void BatchNormForwardInference(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                                 const Tensor& running_var, float eps, Tensor& y) override;
  void BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                         const Tensor& save_invstd, float eps, Tensor& dx, Tensor& dgamma, Tensor& dbeta) override;

  void ReluForward(const Tensor& x, Tensor& y) override;
  void ReluBackward(const Tensor& y, const Tensor& dy, Tensor& dx) override;
  void Add(const Tensor& a, const Tensor& b, Tensor& y) override;
  void Axpy(float alpha, const Tensor& x, Tensor& y) override;
  void Scale(float alpha, Tensor& x) override;

  // cuDNN max pooling recomputes the argmax from x and y, so `workspace` stays untouched.
  void MaxPoolForward(const Tensor& x, const PoolParams& p, Tensor& y, Tensor& workspace) override;
  void MaxPoolBackward(const Tensor& x, const Tensor& y, const Tensor& dy, const PoolParams& p, const Tensor& workspace,
                       Tensor& dx) override;
  void GlobalAvgPoolForward(const Tensor& x, Tensor& y) override;
  void GlobalAvgPoolBackward(const Tensor& dy, Tensor& dx) override;

  void LinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override;
  void LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw, Tensor* db) override;

  float SoftmaxCrossEntropy(const Tensor& logits, const int32_t* labels, float smoothing, Tensor* dlogits,
                            int64_t* correct) override;
  double SumSquares(const Tensor& x) override;

  // ---- general ops of imported graphs (cuda_graph_ops.cc, graph_kernels.cu), fp32.
  // MatMul honours compute_dtype() like LinearForward (narrow copies, fp32 accumulation and
  // result); softmax runs on cuDNN; IndexSelect and its backward read the indices on the host
  // (to reject bad ones with a clear message), which waits for the stream.
  void Unary(UnaryOp op, const Tensor& x, Tensor& y, float a = 0, float b = 0) override;
  void UnaryBackward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, float a = 0,
                     float b = 0) override;
  void Binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& y) override;
  void Where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& y) override;
  void ReduceSum(const Tensor& x, Tensor& y, float alpha = 1.0f, bool accumulate = false) override;
  void StridedCopy(const Tensor& src, const StridedView& sv, Tensor& dst, const StridedView& dv, const Shape& shape,
                   bool accumulate = false) override;
  void MatMul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha = 1.0f,
              float beta = 0.0f) override;
  void Softmax(const Tensor& x, int axis, bool log, Tensor& y) override;
  void SoftmaxBackward(const Tensor& y, const Tensor& dy, int axis, bool log, Tensor& dx) override;
  void LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t cols, float eps, Tensor& y,
                        Tensor& mean, Tensor& invstd) override;
  void LayerNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                         const Tensor& invstd, int64_t cols, Tensor& dx, Tensor* dgamma, Tensor* dbeta) override;
  void IndexSelect(const Tensor& x, const Tensor& indices, int axis, Tensor& y) override;
  void IndexSelectBackward(const Tensor& dy, const Tensor& indices, int axis, Tensor& dx) override;
  // cuDNN average pooling (count_include_pad picks its INCLUDE/EXCLUDE_PADDING mode).
  void AvgPoolForward(const Tensor& x, const PoolParams& p, Tensor& y) override;
  void AvgPoolBackward(const Tensor& dy, const PoolParams& p, Tensor& dx) override;
  void DropoutMask(uint64_t seed, float ratio, Tensor& mask) override;

 private:
  // x's NCHW, w's OIHW, stride, pad and dilation per dimension, groups, compute type, NHWC.
  using ConvKey = std::array<int64_t, 17>;

  bool Mixed() const { return options_.compute != DType::kF32; }

  // fp32 data computed without TF32: only FMA convolution kernels qualify.
  bool ExactFp32(DType dt) const { return dt == DType::kF32 && !options_.allow_tf32; }
  cudnnMathType_t RankingMath(DType dt) const;
  // Makes this backend's device current for the calling thread.
  void Activate() const;
  // Throws unless t is defined, on this device, of dtype dt.
  void Expect(const Tensor& t, const char* op, const char* name, DType dt = DType::kF32) const;
  void ExpectShape(const Tensor& t, const Shape& s, const char* op, const char* name) const;
  std::string Where(const char* op) const;
  // Reads `indices` (fp32 integers) to the host, checks each lies in [-dim, dim) and returns
  // them made non-negative.
  std::vector<int32_t> HostIndices(const Tensor& indices, int64_t dim, const char* op);
  // A cached NCHW descriptor of the given dims and element type.
  cudnnTensorDescriptor_t Desc4d(int64_t n, int64_t c, int64_t h, int64_t w, DType dt = DType::kF32);
  // Descriptors for batch norm over x ([N,C,H,W] or [N,C]) and its per-channel tensors.
  void BnDescs(const Tensor& x, const char* op, cudnnTensorDescriptor_t* xd, cudnnTensorDescriptor_t* pd, int64_t* c,
               int64_t* hw);
  // Column-major C = alpha op(A) op(B) + beta C on cuBLAS, for fp32 or fp16/bf16 operands.
  void Gemm(DType dt, bool ta, bool tb, int m, int n, int k, float alpha, const void* a, int lda, const void* b,
            int ldb, float beta, void* c, int ldc, const char* what);
  // Device scratch of at least `bytes`, reused across calls (stream-ordered).
  void* Scratch(size_t bytes);
  void* Workspace(size_t bytes);
  CudaConvPlan& PlanFor(const Tensor& x, const Tensor& w, const ConvParams& p, const char* op);
  void ChooseForwardAlgo(CudaConvPlan& plan);
  void ChooseBackwardAlgos(CudaConvPlan& plan);
  // The convolution bodies; `saved` is null for the non-training entry points.
  void ConvFwd(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y, Tensor* saved);
  void ConvBwd(const Tensor& x, const Tensor* saved, const Tensor& w, const Tensor& dy, const ConvParams& p, Tensor* dx,
               Tensor& dw, Tensor* db);
  // Mixed mode (fp32 interface, narrow compute), cuda_conv.cc and cuda_backend.cc.
  void MixedConvFwd(CudaConvPlan& pl, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, Tensor* saved);
  void MixedConvBwd(CudaConvPlan& pl, const Tensor& x, const Tensor* saved, const Tensor& w, const Tensor& dy,
                    Tensor* dx, Tensor& dw, Tensor* db);
  void MixedLinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y);
  void MixedLinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw, Tensor* db);
  // fp32 src (n images of [c, hw]) into the compute type at dst, NHWC; and back into fp32.
  void ToCompute(const float* src, void* dst, int64_t n, int64_t c, int64_t hw, const char* what);
  void FromCompute(const void* src, float* dst, const float* bias, bool accumulate, int64_t n, int64_t c, int64_t hw,
                   const char* what);

  const int index_;
  const Options options_;
  std::string name_;
  std::shared_ptr<CudaAllocator> alloc_;
  cudaStream_t stream_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  void* cublas_ = nullptr;  // blas::Handle
  std::shared_ptr<void> scratch_, workspace_;
  size_t scratch_bytes_ = 0, workspace_bytes_ = 0;
  std::map<std::array<int64_t, 5>, std::unique_ptr<cudautil::TensorDesc>> descs_;
  std::map<ConvKey, std::unique_ptr<CudaConvPlan>> plans_;
};

}  // namespace shoal
