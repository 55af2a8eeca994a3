// cuBLAS behind a plain header. cublas_v2.h pulls in cuda_fp16.h, which includes the
// extension-less <nv/target> that the @cuda header glob does not carry, so only code
// compiled by nvcc (kernels.cu) includes it.
#pragma once
#include <cuda_runtime_api.h>

namespace shoal {
namespace blas {

using Handle = void*;

// Each call returns nullptr on success, else cuBLAS's message for the failure.
// Scalars are host values; math is true fp32 unless allow_tf32.
const char* Create(Handle* h, cudaStream_t s, bool allow_tf32);
void Destroy(Handle h);
// Column-major C[m, n] = alpha op(A) op(B) + beta C, op = transpose when trans_*.
const char* Sgemm(Handle h, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc);

// The same for fp16 (type 1) or bf16 (type 2) matrices, accumulating in fp32.
const char* GemmHalf(Handle h, int type, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
                     int lda, const void* b, int ldb, float beta, void* c, int ldc);
// fp16/bf16 A and B, fp32 C (the mixed mode's y, dx and accumulating dw), fp32 accumulation.
const char* GemmMixed(Handle h, int type, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
                      int lda, const void* b, int ldb, float beta, float* c, int ldc);

// `batch` products of the shapes above, each operand's matrix `stride_*` elements after the
// previous one (0: the same matrix for every batch). fp32 throughout, and fp16 (type 1) or
// bf16 (type 2) A and B with fp32 C and accumulation.
const char* SgemmStridedBatched(Handle h, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                                int lda, long long stride_a, const float* b, int ldb, long long stride_b, float beta,
                                float* c, int ldc, long long stride_c, int batch);
const char* GemmMixedStridedBatched(Handle h, int type, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                                    const void* a, int lda, long long stride_a, const void* b, int ldb,
                                    long long stride_b, float beta, float* c, int ldc, long long stride_c, int batch);

}  // namespace blas
}  // namespace shoal
