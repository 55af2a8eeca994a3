// CpuBackend: the Backend interface on the host. Convolution runs on oneDNN primitives
// (cached per shape, in whatever blocked layout oneDNN prefers, with reorders from and to
// plain NCHW at the call boundary), the fully connected layer on dnnl_sgemm, and the
// memory-bound ops (batch norm, pooling, elementwise, loss) on plain OpenMP loops, which
// share oneDNN's OpenMP thread pool.
//
// One backend serves one thread at a time (its primitive cache is unguarded). Tensors are
// fp32 (fp16/bf16 tensors can be allocated, filled and copied, not computed on); with
// compute bf16, convolutions and fully connected layers read bf16 copies of their inputs
// and weights (converted on the way in) and accumulate and write fp32, on AVX512-BF16/AMX.
#pragma once
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "worker/engine/backend.h"

namespace shoal {

struct CpuConvPlan;  // cpu_conv.cc

// Whether this processor computes bf16 natively (AVX512-BF16 or AMX-BF16), and the
// instruction set oneDNN's kernels use here ("avx512_core_amx", "avx2", ...).
bool CpuHasBf16();
std::string CpuIsaName();

class CpuBackend final : public Backend {
 public:
  // threads = 0: all cores. The OpenMP thread count is process-wide.
  CpuBackend(int threads, DType compute = DType::kF32);
  ~CpuBackend() override;

  Device device() const override { return Device{DeviceKind::kCpu, 0}; }
  std::string Name() const override;
  int threads() const { return threads_; }
  DType compute_dtype() const override { return compute_; }

  Tensor Empty(const Shape& shape, DType dtype = DType::kF32) override;
  void Fill(Tensor& t, float value) override;
  void CopyFromHost(Tensor& dst, const void* src) override;
  void CopyToHost(const Tensor& src, void* dst) override;
  void Copy(const Tensor& src, Tensor& dst) override;

  void ConvForward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y) override;
  void ConvBackward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvParams& p, Tensor* dx, Tensor& dw,
                    Tensor* db) override;
  // Keep x in the forward kernel's blocked layout, so the weight-gradient kernel skips
  // converting it again.
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

  void MaxPoolForward(const Tensor& x, const PoolParams& p, Tensor& y, Tensor& workspace) override;
  void MaxPoolBackward(const Tensor& x, const Tensor& y, const Tensor& dy, const PoolParams& p, const Tensor& workspace,
                       Tensor& dx) override;
  void GlobalAvgPoolForward(const Tensor& x, Tensor& y) override;
  void GlobalAvgPoolBackward(const Tensor& dy, Tensor& dx) override;

  void LinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override;
  void LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw, Tensor* db) override;

  // Imported graphs' ops (cpu_graph_ops.cc).
  void Unary(UnaryOp op, const Tensor& x, Tensor& y, float a, float b) override;
  void UnaryBackward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, float a,
                     float b) override;
  void Binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& y) override;
  void Where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& y) override;
  void ReduceSum(const Tensor& x, Tensor& y, float alpha, bool accumulate) override;
  void StridedCopy(const Tensor& src, const StridedView& sv, Tensor& dst, const StridedView& dv, const Shape& shape,
                   bool accumulate) override;
  void MatMul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta) override;
  void Softmax(const Tensor& x, int axis, bool log, Tensor& y) override;
  void SoftmaxBackward(const Tensor& y, const Tensor& dy, int axis, bool log, Tensor& dx) override;
  void LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t cols, float eps, Tensor& y,
                        Tensor& mean, Tensor& invstd) override;
  void LayerNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                         const Tensor& invstd, int64_t cols, Tensor& dx, Tensor* dgamma, Tensor* dbeta) override;
  void IndexSelect(const Tensor& x, const Tensor& indices, int axis, Tensor& y) override;
  void IndexSelectBackward(const Tensor& dy, const Tensor& indices, int axis, Tensor& dx) override;
  void AvgPoolForward(const Tensor& x, const PoolParams& p, Tensor& y) override;
  void AvgPoolBackward(const Tensor& dy, const PoolParams& p, Tensor& dx) override;
  void DropoutMask(uint64_t seed, float ratio, Tensor& mask) override;

  float SoftmaxCrossEntropy(const Tensor& logits, const int32_t* labels, float smoothing, Tensor* dlogits,
                            int64_t* correct) override;
  double SumSquares(const Tensor& x) override;

 private:
  // x shape, w shape, geometry, has bias
  using ConvKey = std::tuple<Shape, Shape, ConvParams, bool>;
  void PinThreads() const;
  CpuConvPlan& Plan(const Tensor& x, const Tensor& w, bool has_bias, const ConvParams& p);
  void ConvFwd(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y, Tensor* saved);
  void ConvBwd(const Tensor& x, const Tensor* saved, const Tensor& w, const Tensor& dy, const ConvParams& p, Tensor* dx,
               Tensor& dw, Tensor* db);

  // C[M,N] (beta 0: =, beta 1: +=) op(A)[M,K] op(B)[K,N]: dnnl_sgemm in fp32, a cached
  // oneDNN matmul on bf16 copies of A and B in bf16.
  void Gemm(char ta, char tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
            float beta, float* C, int64_t ldc);

  int threads_;
  DType compute_;
  struct Dnnl;  // engine + stream, kept out of this header
  std::unique_ptr<Dnnl> dnnl_;
  std::map<ConvKey, std::unique_ptr<CpuConvPlan>> conv_plans_;
  struct MatmulPlan;  // cpu_gemm.cc
  using MatmulKey = std::tuple<char, char, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>;
  std::map<MatmulKey, std::unique_ptr<MatmulPlan>> matmul_plans_;
};

}  // namespace shoal
