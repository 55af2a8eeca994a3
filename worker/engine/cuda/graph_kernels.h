// Kernels for the general ops of imported graphs (Backend::Unary ... DropoutMask), fp32 only.
// Plain C++ like kernels.h; compiled by nvcc in graph_kernels.cu. Every launcher enqueues on
// `s` and returns cudaGetLastError(). Shapes arrive already checked by cuda_graph_ops.cc.
//
// Reductions (ReduceSum, LayerNorm's dgamma/dbeta, IndexSelect's backward) sum in an order
// fixed by the shapes alone, never with atomics, so results are bit-identical run to run.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace shoal {
namespace cudak {

constexpr int kWalkDims = 8;      // kMaxTensorDims
constexpr int kWalkOperands = 4;  // Where: cond, a, b (and the output's own strides)

// A row-major walk over `shape` with one stride per dimension for each operand, in elements
// (0 repeats: broadcasting), starting at `offset`. Passed by value to the kernels.
struct Walk {
  int ndim = 0;
  int64_t shape[kWalkDims] = {};
  int64_t offset[kWalkOperands] = {};
  int64_t stride[kWalkOperands][kWalkDims] = {};
};

// Numbering of shoal::UnaryOp and shoal::BinaryOp (cuda_graph_ops.cc static_asserts it).
enum UnaryCode : int {
  kUIdentity,
  kUNeg,
  kURelu,
  kULeakyRelu,
  kUClip,
  kUSigmoid,
  kUTanh,
  kUErf,
  kUSqrt,
  kUExp,
  kULog,
  kUAbs,
  kUReciprocal,
  kUPowScalar,
  kUAffine,
};
enum BinaryCode : int { kBAdd, kBSub, kBMul, kBDiv, kBPow, kBMax, kBMin, kBEqual, kBLess, kBGreater };

cudaError_t Unary(int op, const float* x, float* y, int64_t n, float a, float b, cudaStream_t s);
cudaError_t UnaryBackward(int op, const float* x, const float* y, const float* dy, float* dx, int64_t n, float a,
                          float b, cudaStream_t s);
// Walk over y's shape: operand 0 reads a, 1 reads b; y is written contiguously.
cudaError_t Binary(int op, const float* a, const float* b, float* y, const Walk& w, cudaStream_t s);
// Operands 0, 1, 2: cond, a, b; y contiguous.
cudaError_t Where(const float* cond, const float* a, const float* b, float* y, const Walk& w, cudaStream_t s);
// Operand 0 reads src, operand 1 writes dst (+= when accumulate).
cudaError_t StridedCopy(const float* src, float* dst, const Walk& w, bool accumulate, cudaStream_t s);
// y (contiguous, `kept` walks its shape; operand 0 = x's strides for those dimensions) =
// alpha * sum over the `reduced` walk (operand 0 = x's strides) [+ y].
cudaError_t ReduceSum(const float* x, float* y, const Walk& kept, const Walk& reduced, float alpha, bool accumulate,
                      cudaStream_t s);

// Rows of `cols` elements: mean and invstd per row (biased variance), y normalized, scaled
// by gamma and shifted by beta (may be null).
cudaError_t LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows, int64_t cols,
                             float eps, float* y, float* mean, float* invstd, cudaStream_t s);
cudaError_t LayerNormBackwardData(const float* x, const float* dy, const float* gamma, const float* mean,
                                  const float* invstd, int64_t rows, int64_t cols, float* dx, cudaStream_t s);
// How many float partials per column LayerNormBackwardParams needs in `scratch` (times 2).
int64_t LayerNormParamChunks(int64_t rows);
// dgamma += sum over rows of dy * xhat, dbeta += sum of dy (either may be null); scratch
// holds 2 * LayerNormParamChunks(rows) * cols floats.
cudaError_t LayerNormBackwardParams(const float* x, const float* dy, const float* mean, const float* invstd,
                                    int64_t rows, int64_t cols, float* dgamma, float* dbeta, float* scratch,
                                    cudaStream_t s);

// x [outer, dim, inner] -> y [outer, m, inner], y[o, j, i] = x[o, idx[j], i]; idx already
// validated and made non-negative.
cudaError_t IndexSelect(const float* x, const int32_t* idx, float* y, int64_t outer, int64_t dim, int64_t m,
                        int64_t inner, cudaStream_t s);
// dx[o, d, i] += sum over j in pos[start[d] .. start[d+1]) of dy[o, j, i]: the positions
// of each index in ascending order (a counting sort on the host), so the order is fixed.
cudaError_t IndexSelectBackward(const float* dy, const int32_t* start, const int32_t* pos, float* dx, int64_t outer,
                                int64_t dim, int64_t m, int64_t inner, cudaStream_t s);

// mask[i] = HashUniform(seed, i) < ratio ? 0 : scale (backend.h's hash, bit for bit).
cudaError_t DropoutMask(uint64_t seed, float ratio, float scale, float* mask, int64_t n, cudaStream_t s);

}  // namespace cudak
}  // namespace shoal
