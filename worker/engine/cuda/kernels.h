// Own CUDA kernels for the operations cuDNN and cuBLAS do not cover (or cover awkwardly).
// Compiled by nvcc (kernels.cu); this header is plain C++ so host code can include it.
// Every launcher enqueues on `s` and returns cudaGetLastError() (launch errors only; the
// kernel's own faults surface at the next synchronizing call).
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace shoal {
namespace cudak {

// Element type codes; same numbering as shoal::DType (fp32, fp16, bf16).
enum ElemType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

cudaError_t Fill(void* p, int type, int64_t n, float value, cudaStream_t s);
// dst[i] = convert(src[i]); fp16 and bf16 round to nearest even.
cudaError_t Cast(const void* src, int src_type, void* dst, int dst_type, int64_t n, cudaStream_t s);

// The following take tensors of one element type `type` (all operands alike) and compute
// in fp32; n counts elements.
cudaError_t Add(int type, const void* a, const void* b, void* y, int64_t n, cudaStream_t s);
cudaError_t Axpy(int type, float alpha, const void* x, void* y, int64_t n, cudaStream_t s);
cudaError_t Scale(int type, float alpha, void* x, int64_t n, cudaStream_t s);
cudaError_t ReluForward(int type, const void* x, void* y, int64_t n, cudaStream_t s);
cudaError_t ReluBackward(int type, const void* y, const void* dy, void* dx, int64_t n, cudaStream_t s);

// y viewed as [outer, c, inner]: y[o, k, i] += b[k].
cudaError_t BiasAdd(int type, void* y, const void* b, int64_t outer, int64_t c, int64_t inner, cudaStream_t s);
// db[k] += sum over o, i of dy[o, k, i].
cudaError_t BiasGradAccumulate(int type, const void* dy, void* db, int64_t outer, int64_t c, int64_t inner,
                               cudaStream_t s);

// x [rows, hw] -> y [rows] (mean), and its backward dx[r, j] = dy[r] / hw.
cudaError_t GlobalAvgPoolForward(int type, const void* x, void* y, int64_t rows, int64_t hw, cudaStream_t s);
cudaError_t GlobalAvgPoolBackward(int type, const void* dy, void* dx, int64_t rows, int64_t hw, cudaStream_t s);

// fp32 only from here on. Per row of logits [n, k]: row_loss[r] = cross-entropy against (1-eps) one-hot + eps/k,
// row_correct[r] = (first argmax == label); dlogits (may be null) = (softmax - target) / n.
// Labels must already be validated to lie in [0, k).
cudaError_t SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t k, float smoothing,
                                float* dlogits, float* row_loss, int32_t* row_correct, cudaStream_t s);

// Writes kSumSquaresBlocks partial sums (double) of x[i]^2; the caller adds them up.
constexpr int kSumSquaresBlocks = 256;
cudaError_t SumSquaresPartials(const float* x, int64_t n, double* partials, cudaStream_t s);

}  // namespace cudak
}  // namespace shoal
