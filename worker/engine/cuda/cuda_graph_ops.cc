// The general ops of imported graphs on CUDA: argument checks and walks here, kernels in
// graph_kernels.cu, batched MatMul on cuBLAS, softmax on cuDNN. Average pooling lives with
// the other cuDNN pooling in cuda_dnn.cc.
#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "worker/engine/cuda/blas.h"
#include "worker/engine/cuda/cuda_backend.h"
#include "worker/engine/cuda/graph_kernels.h"
#include "worker/engine/cuda/graph_walks.h"
#include "worker/engine/cuda/kernels.h"

namespace shoal {

using cudautil::Check;
using cudawalk::Dims;
using cudawalk::Simplify;

static_assert(int(UnaryOp::kAffine) == cudak::kUAffine && int(UnaryOp::kPowScalar) == cudak::kUPowScalar &&
                  int(UnaryOp::kClip) == cudak::kUClip && int(UnaryOp::kErf) == cudak::kUErf,
              "graph_kernels.h's UnaryCode must number UnaryOp alike");
static_assert(int(BinaryOp::kGreater) == cudak::kBGreater && int(BinaryOp::kPow) == cudak::kBPow &&
                  int(BinaryOp::kEqual) == cudak::kBEqual,
              "graph_kernels.h's BinaryCode must number BinaryOp alike");
static_assert(cudak::kWalkDims == int(kMaxTensorDims), "a walk covers every tensor rank");

namespace {

int NormAxis(int axis, int rank, const std::string& where) {
  SHOAL_CHECK(axis >= -rank && axis < rank, where + ": axis " + std::to_string(axis) + " outside [" +
                                                std::to_string(-rank) + ", " + std::to_string(rank) + ")");
  return axis < 0 ? axis + rank : axis;
}

int64_t Prod(const Shape& s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; ++i) p *= s[size_t(i)];
  return p;
}

}  // namespace

// ---- elementwise

void CudaBackend::Unary(UnaryOp op, const Tensor& x, Tensor& y, float a, float b) {
  Expect(x, "Unary", "x");
  Expect(y, "Unary", "y");
  ExpectShape(y, x.shape(), "Unary", "y");
  Activate();
  Check(cudak::Unary(int(op), x.data<float>(), y.data<float>(), x.numel(), a, b, stream_),
        Where("Unary") + " " + Dims(x.shape()));
}

void CudaBackend::UnaryBackward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, float a,
                                float b) {
  const char* name = "UnaryBackward";
  Expect(dy, name, "dy");
  Expect(dx, name, "dx");
  ExpectShape(dx, dy.shape(), name, "dx");
  // Each derivative reads x or y (the cheaper one), never both; the other may be undefined.
  bool needs_x = false, needs_y = false;
  switch (op) {
    case UnaryOp::kSigmoid:
    case UnaryOp::kTanh:
    case UnaryOp::kSqrt:
    case UnaryOp::kExp:
    case UnaryOp::kReciprocal:
      needs_y = true;
      break;
    case UnaryOp::kIdentity:
    case UnaryOp::kNeg:
    case UnaryOp::kAffine:
      break;
    default:
      needs_x = true;
  }
  if (needs_x) {
    Expect(x, name, "x");
    ExpectShape(x, dy.shape(), name, "x");
  }
  if (needs_y) {
    Expect(y, name, "y");
    ExpectShape(y, dy.shape(), name, "y");
  }
  Activate();
  Check(cudak::UnaryBackward(int(op), needs_x ? x.data<float>() : nullptr, needs_y ? y.data<float>() : nullptr,
                             dy.data<float>(), dx.data<float>(), dy.numel(), a, b, stream_),
        Where(name) + " " + Dims(dy.shape()));
}

void CudaBackend::Binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& y) {
  const std::string where = Where("Binary") + " a " + Dims(a.shape()) + " b " + Dims(b.shape());
  Expect(a, "Binary", "a");
  Expect(b, "Binary", "b");
  Expect(y, "Binary", "y");
  cudak::Walk w = cudawalk::OutputWalk(y.shape(), where);
  cudawalk::Broadcast(a.shape(), y.shape(), w, 0, where, "a");
  cudawalk::Broadcast(b.shape(), y.shape(), w, 1, where, "b");
  Activate();
  Check(cudak::Binary(int(op), a.data<float>(), b.data<float>(), y.data<float>(), Simplify(w, 2), stream_), where);
}

void CudaBackend::Where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& y) {
  const std::string where =
      Where("Where") + " cond " + Dims(cond.shape()) + " a " + Dims(a.shape()) + " b " + Dims(b.shape());
  Expect(cond, "Where", "cond");
  Expect(a, "Where", "a");
  Expect(b, "Where", "b");
  Expect(y, "Where", "y");
  cudak::Walk w = cudawalk::OutputWalk(y.shape(), where);
  cudawalk::Broadcast(cond.shape(), y.shape(), w, 0, where, "cond");
  cudawalk::Broadcast(a.shape(), y.shape(), w, 1, where, "a");
  cudawalk::Broadcast(b.shape(), y.shape(), w, 2, where, "b");
  Activate();
  Check(cudak::Where(cond.data<float>(), a.data<float>(), b.data<float>(), y.data<float>(), Simplify(w, 3), stream_),
        where);
}

// ---- reductions and copies

void CudaBackend::ReduceSum(const Tensor& x, Tensor& y, float alpha, bool accumulate) {
  const std::string where = Where("ReduceSum") + " x " + Dims(x.shape()) + " to y " + Dims(y.shape());
  Expect(x, "ReduceSum", "x");
  Expect(y, "ReduceSum", "y");
  cudak::Walk kept, reduced;
  cudawalk::ReduceWalks(x.shape(), y.shape(), where, &kept, &reduced);
  Activate();
  Check(cudak::ReduceSum(x.data<float>(), y.data<float>(), kept, reduced, alpha, accumulate, stream_), where);
}

void CudaBackend::StridedCopy(const Tensor& src, const StridedView& sv, Tensor& dst, const StridedView& dv,
                              const Shape& shape, bool accumulate) {
  const std::string where =
      Where("StridedCopy") + " src " + Dims(src.shape()) + " dst " + Dims(dst.shape()) + " walking " + Dims(shape);
  Expect(src, "StridedCopy", "src");
  Expect(dst, "StridedCopy", "dst");
  cudak::Walk w;
  if (!cudawalk::StridedWalk(sv, src.numel(), dv, dst.numel(), shape, where, &w)) return;
  Activate();
  Check(cudak::StridedCopy(src.data<float>(), dst.data<float>(), w, accumulate, stream_), where);
}

// ---- batched matrix product. Row-major matrices seen by column-major cuBLAS are their
// transposes, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: B is cuBLAS's first
// operand, A its second, and each keeps its own transpose flag and row length as ld.

void CudaBackend::MatMul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta) {
  const std::string where = Where("MatMul") + " a " + Dims(a.shape()) + (ta ? "^T" : "") + " b " + Dims(b.shape()) +
                            (tb ? "^T" : "") + " c " + Dims(c.shape());
  Expect(a, "MatMul", "a");
  Expect(b, "MatMul", "b");
  Expect(c, "MatMul", "c");
  for (const Tensor* t : {&a, &b, static_cast<const Tensor*>(&c)})
    SHOAL_CHECK(t->ndim() == 2 || t->ndim() == 3, where + ": operands must be [B,rows,cols] (or [rows,cols])");
  const int64_t ba = a.ndim() == 3 ? a.dim(0) : 1, bb = b.ndim() == 3 ? b.dim(0) : 1;
  const int64_t batch = c.ndim() == 3 ? c.dim(0) : 1;
  const int64_t m = ta ? a.dim(-1) : a.dim(-2), k = ta ? a.dim(-2) : a.dim(-1);
  const int64_t kb = tb ? b.dim(-1) : b.dim(-2), n = tb ? b.dim(-2) : b.dim(-1);
  SHOAL_CHECK(k == kb, where + ": inner dimensions " + std::to_string(k) + " and " + std::to_string(kb) + " differ");
  SHOAL_CHECK(c.dim(-2) == m && c.dim(-1) == n,
              where + ": c must be [" + std::to_string(m) + "," + std::to_string(n) + "] per batch");
  SHOAL_CHECK((ba == batch || ba == 1) && (bb == batch || bb == 1), where + ": batch counts " + std::to_string(ba) +
                                                                        " and " + std::to_string(bb) + " must be " +
                                                                        std::to_string(batch) + " or 1");
  for (int64_t v : {m, n, k, batch, a.dim(-1), b.dim(-1)})
    SHOAL_CHECK(v <= INT_MAX, where + ": a dimension exceeds cuBLAS's int");
  Activate();
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: c = beta c (cuBLAS rejects a zero leading dimension)
    if (beta == 0.f)
      Check(cudak::Fill(c.raw(), cudak::kF32, c.numel(), 0.f, stream_), where);
    else
      Check(cudak::Scale(cudak::kF32, beta, c.raw(), c.numel(), stream_), where);
    return;
  }
  const long long sa = ba == 1 ? 0 : m * k, sb = bb == 1 ? 0 : k * n, sc = m * n;
  const int lda = int(a.dim(-1)), ldb = int(b.dim(-1));
  if (!Mixed()) {
    cudautil::CheckBlas(
        blas::SgemmStridedBatched(cublas_, tb, ta, int(n), int(m), int(k), alpha, b.data<float>(), ldb, sb,
                                  a.data<float>(), lda, sa, beta, c.data<float>(), int(n), sc, int(batch)),
        where);
    return;
  }
  // Mixed mode, as LinearForward: narrow copies of a and b, fp32 accumulation, c stays fp32.
  const size_t es = DTypeSize(options_.compute);
  const size_t ab = (size_t(a.numel()) * es + 255) / 256 * 256;
  char* s = static_cast<char*>(Scratch(ab + size_t(b.numel()) * es));
  const int type = cudautil::ElemType(options_.compute);
  Check(cudak::Cast(a.raw(), cudak::kF32, s, type, a.numel(), stream_), where + " a cast");
  Check(cudak::Cast(b.raw(), cudak::kF32, s + ab, type, b.numel(), stream_), where + " b cast");
  cudautil::CheckBlas(blas::GemmMixedStridedBatched(cublas_, type, tb, ta, int(n), int(m), int(k), alpha, s + ab, ldb,
                                                    sb, s, lda, sa, beta, c.data<float>(), int(n), sc, int(batch)),
                      where);
}

// ---- softmax on cuDNN: x viewed as [outer, k, inner, 1], CHANNEL mode normalizes over k.

void CudaBackend::Softmax(const Tensor& x, int axis, bool log, Tensor& y) {
  const std::string where = Where("Softmax") + " x " + Dims(x.shape()) + " axis " + std::to_string(axis);
  Expect(x, "Softmax", "x");
  Expect(y, "Softmax", "y");
  ExpectShape(y, x.shape(), "Softmax", "y");
  const int ax = NormAxis(axis, x.ndim(), where);
  if (x.numel() == 0) return;
  Activate();
  cudnnTensorDescriptor_t d = Desc4d(Prod(x.shape(), 0, ax), x.dim(ax), Prod(x.shape(), ax + 1, x.ndim()), 1);
  const float one = 1.f, zero = 0.f;
  Check(cudnnSoftmaxForward(cudnn_, log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, &one,
                            d, x.raw(), &zero, d, y.raw()),
        where + " cudnnSoftmaxForward");
}

void CudaBackend::SoftmaxBackward(const Tensor& y, const Tensor& dy, int axis, bool log, Tensor& dx) {
  const std::string where = Where("SoftmaxBackward") + " y " + Dims(y.shape()) + " axis " + std::to_string(axis);
  Expect(y, "SoftmaxBackward", "y");
  Expect(dy, "SoftmaxBackward", "dy");
  Expect(dx, "SoftmaxBackward", "dx");
  ExpectShape(dy, y.shape(), "SoftmaxBackward", "dy");
  ExpectShape(dx, y.shape(), "SoftmaxBackward", "dx");
  const int ax = NormAxis(axis, y.ndim(), where);
  if (y.numel() == 0) return;
  Activate();
  cudnnTensorDescriptor_t d = Desc4d(Prod(y.shape(), 0, ax), y.dim(ax), Prod(y.shape(), ax + 1, y.ndim()), 1);
  const float one = 1.f, zero = 0.f;
  Check(cudnnSoftmaxBackward(cudnn_, log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, &one,
                             d, y.raw(), d, dy.raw(), &zero, d, dx.raw()),
        where + " cudnnSoftmaxBackward");
}

// ---- layer norm

void CudaBackend::LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t cols, float eps,
                                   Tensor& y, Tensor& mean, Tensor& invstd) {
  const char* op = "LayerNormForward";
  const std::string where = Where(op) + " x " + Dims(x.shape()) + " cols " + std::to_string(cols);
  Expect(x, op, "x");
  Expect(gamma, op, "gamma");
  Expect(y, op, "y");
  Expect(mean, op, "mean");
  Expect(invstd, op, "invstd");
  SHOAL_CHECK(cols > 0 && x.numel() % cols == 0, where + ": cols must divide x's element count");
  SHOAL_CHECK(eps >= 0.f, where + ": eps must not be negative, got " + std::to_string(eps));
  const int64_t rows = x.numel() / cols;
  ExpectShape(y, x.shape(), op, "y");
  SHOAL_CHECK(gamma.numel() == cols, where + ": gamma " + Dims(gamma.shape()) + " must hold cols elements");
  if (beta.defined()) {
    Expect(beta, op, "beta");
    SHOAL_CHECK(beta.numel() == cols, where + ": beta " + Dims(beta.shape()) + " must hold cols elements");
  }
  SHOAL_CHECK(mean.numel() == rows && invstd.numel() == rows, where + ": mean " + Dims(mean.shape()) + " and invstd " +
                                                                  Dims(invstd.shape()) + " must hold " +
                                                                  std::to_string(rows) + " rows");
  Activate();
  Check(cudak::LayerNormForward(x.data<float>(), gamma.data<float>(), beta.defined() ? beta.data<float>() : nullptr,
                                rows, cols, eps, y.data<float>(), mean.data<float>(), invstd.data<float>(), stream_),
        where);
}

void CudaBackend::LayerNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                                    const Tensor& invstd, int64_t cols, Tensor& dx, Tensor* dgamma, Tensor* dbeta) {
  const char* op = "LayerNormBackward";
  const std::string where = Where(op) + " x " + Dims(x.shape()) + " cols " + std::to_string(cols);
  Expect(x, op, "x");
  Expect(dy, op, "dy");
  Expect(gamma, op, "gamma");
  Expect(mean, op, "mean");
  Expect(invstd, op, "invstd");
  Expect(dx, op, "dx");
  SHOAL_CHECK(cols > 0 && x.numel() % cols == 0, where + ": cols must divide x's element count");
  const int64_t rows = x.numel() / cols;
  ExpectShape(dy, x.shape(), op, "dy");
  ExpectShape(dx, x.shape(), op, "dx");
  SHOAL_CHECK(gamma.numel() == cols, where + ": gamma " + Dims(gamma.shape()) + " must hold cols elements");
  SHOAL_CHECK(mean.numel() == rows && invstd.numel() == rows, where + ": mean " + Dims(mean.shape()) + " and invstd " +
                                                                  Dims(invstd.shape()) + " must hold " +
                                                                  std::to_string(rows) + " rows");
  if (dgamma) {
    Expect(*dgamma, op, "dgamma");
    SHOAL_CHECK(dgamma->numel() == cols, where + ": dgamma " + Dims(dgamma->shape()) + " must hold cols elements");
  }
  if (dbeta) {
    Expect(*dbeta, op, "dbeta");
    SHOAL_CHECK(dbeta->numel() == cols, where + ": dbeta " + Dims(dbeta->shape()) + " must hold cols elements");
  }
  Activate();
  Check(cudak::LayerNormBackwardData(x.data<float>(), dy.data<float>(), gamma.data<float>(), mean.data<float>(),
                                     invstd.data<float>(), rows, cols, dx.data<float>(), stream_),
        where + " dx");
  if (dgamma || dbeta) {
    auto* partials =
        static_cast<float*>(Scratch(2 * size_t(cudak::LayerNormParamChunks(rows)) * size_t(cols) * sizeof(float)));
    Check(cudak::LayerNormBackwardParams(x.data<float>(), dy.data<float>(), mean.data<float>(), invstd.data<float>(),
                                         rows, cols, dgamma ? dgamma->data<float>() : nullptr,
                                         dbeta ? dbeta->data<float>() : nullptr, partials, stream_),
          where + " dgamma/dbeta");
  }
}

// ---- index select

std::vector<int32_t> CudaBackend::HostIndices(const Tensor& indices, int64_t dim, const char* op) {
  Expect(indices, op, "indices");
  SHOAL_CHECK(dim <= INT_MAX, Where(op) + ": dimension of " + std::to_string(dim) + " exceeds int32 indices");
  SHOAL_CHECK(indices.numel() <= INT_MAX, Where(op) + ": more than 2^31-1 indices");
  std::vector<float> host(size_t(indices.numel()));
  CopyToHost(indices, host.data());
  std::vector<int32_t> idx(host.size());
  for (size_t i = 0; i < host.size(); ++i) {
    const float v = host[i];
    SHOAL_CHECK(std::isfinite(v) && v == std::floor(v) && v >= float(-dim) && v < float(dim),
                Where(op) + ": indices[" + std::to_string(i) + "] = " + std::to_string(v) + " is not an integer in [" +
                    std::to_string(-dim) + ", " + std::to_string(dim) + ")");
    idx[i] = int32_t(v < 0 ? v + float(dim) : v);
  }
  return idx;
}

namespace {
// x's shape with dimension `axis` replaced by the indices' shape.
Shape SelectedShape(const Shape& x, int axis, const Shape& idx) {
  Shape s(x.begin(), x.begin() + axis);
  s.insert(s.end(), idx.begin(), idx.end());
  s.insert(s.end(), x.begin() + axis + 1, x.end());
  return s;
}
}  // namespace

void CudaBackend::IndexSelect(const Tensor& x, const Tensor& indices, int axis, Tensor& y) {
  const char* op = "IndexSelect";
  const std::string where = Where(op) + " x " + Dims(x.shape()) + " indices " + Dims(indices.shape());
  Expect(x, op, "x");
  Expect(y, op, "y");
  const int ax = NormAxis(axis, x.ndim(), where);
  ExpectShape(y, SelectedShape(x.shape(), ax, indices.shape()), op, "y");
  const std::vector<int32_t> idx = HostIndices(indices, x.dim(ax), op);
  if (y.numel() == 0) return;
  auto* d_idx = static_cast<int32_t*>(Scratch(idx.size() * sizeof(int32_t)));
  // From pageable memory: returns once the source is staged, so idx may go out of scope.
  Check(cudaMemcpyAsync(d_idx, idx.data(), idx.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
        where + " indices upload");
  Check(cudak::IndexSelect(x.data<float>(), d_idx, y.data<float>(), Prod(x.shape(), 0, ax), x.dim(ax),
                           int64_t(idx.size()), Prod(x.shape(), ax + 1, x.ndim()), stream_),
        where);
}

void CudaBackend::IndexSelectBackward(const Tensor& dy, const Tensor& indices, int axis, Tensor& dx) {
  const char* op = "IndexSelectBackward";
  const std::string where = Where(op) + " dx " + Dims(dx.shape()) + " indices " + Dims(indices.shape());
  Expect(dy, op, "dy");
  Expect(dx, op, "dx");
  const int ax = NormAxis(axis, dx.ndim(), where);
  ExpectShape(dy, SelectedShape(dx.shape(), ax, indices.shape()), op, "dy");
  const int64_t dim = dx.dim(ax);
  const std::vector<int32_t> idx = HostIndices(indices, dim, op);
  if (dy.numel() == 0 || dx.numel() == 0) return;
  const std::vector<int32_t> table = cudawalk::IndexTable(idx, dim);
  auto* d_table = static_cast<int32_t*>(Scratch(table.size() * sizeof(int32_t)));
  Check(cudaMemcpyAsync(d_table, table.data(), table.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
        where + " index table upload");
  Check(cudak::IndexSelectBackward(dy.data<float>(), d_table, d_table + dim + 1, dx.data<float>(),
                                   Prod(dx.shape(), 0, ax), dim, int64_t(idx.size()),
                                   Prod(dx.shape(), ax + 1, dx.ndim()), stream_),
        where);
}

// ---- dropout

void CudaBackend::DropoutMask(uint64_t seed, float ratio, Tensor& mask) {
  Expect(mask, "DropoutMask", "mask");
  SHOAL_CHECK(ratio >= 0.f && ratio < 1.f,
              Where("DropoutMask") + ": ratio " + std::to_string(ratio) + " outside [0, 1)");
  Activate();
  Check(cudak::DropoutMask(seed, ratio, 1.0f / (1.0f - ratio), mask.data<float>(), mask.numel(), stream_),
        Where("DropoutMask") + " " + Dims(mask.shape()));
}

}  // namespace shoal
