#include "worker/engine/cuda/kernels.h"

#include <cublas_v2.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <type_traits>

#include "worker/engine/cuda/blas.h"

namespace shoal {
namespace cudak {
namespace {

constexpr int kThreads = 256;

// Grid-stride loops cover any n; the cap keeps the grid small for huge tensors.
inline int BlocksFor(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return int(b > 65535 ? 65535 : b);
}

#define GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(blockDim.x) * gridDim.x)

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void Store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void Store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

template <typename T>
__global__ void FillKernel(T* p, int64_t n, float v) {
  GRID_STRIDE(i, n) Store(p, i, v);
}

template <typename S, typename D>
__global__ void CastKernel(const S* src, D* dst, int64_t n) {
  GRID_STRIDE(i, n) Store(dst, i, Load(src, i));
}

template <typename T>
__global__ void AddKernel(const T* a, const T* b, T* y, int64_t n) {
  GRID_STRIDE(i, n) Store(y, i, Load(a, i) + Load(b, i));
}
template <typename T>
__global__ void AxpyKernel(float alpha, const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) Store(y, i, Load(y, i) + alpha * Load(x, i));
}
template <typename T>
__global__ void ScaleKernel(float alpha, T* x, int64_t n) {
  GRID_STRIDE(i, n) Store(x, i, alpha * Load(x, i));
}
template <typename T>
__global__ void ReluForwardKernel(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) {
    float v = Load(x, i);
    Store(y, i, v > 0.f ? v : 0.f);
  }
}
template <typename T>
__global__ void ReluBackwardKernel(const T* y, const T* dy, T* dx, int64_t n) {
  GRID_STRIDE(i, n) Store(dx, i, Load(y, i) > 0.f ? Load(dy, i) : 0.f);
}

template <typename T>
__global__ void BiasAddKernel(T* y, const T* b, int64_t c, int64_t inner, int64_t n) {
  GRID_STRIDE(i, n) Store(y, i, Load(y, i) + Load(b, (i / inner) % c));
}

// Shared-memory tree reductions for a block of kThreads threads.
template <typename T>
__device__ T BlockSum(T v, T* buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  T r = buf[0];
  __syncthreads();  // buf is reused by the caller's next reduction
  return r;
}

// One block per channel: a fixed reduction order, so results are deterministic.
template <typename T>
__global__ void BiasGradKernel(const T* dy, T* db, int64_t outer, int64_t c, int64_t inner) {
  __shared__ float buf[kThreads];
  const int64_t k = blockIdx.x;
  const int64_t m = outer * inner;
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < m; j += kThreads) {
    int64_t o = j / inner, i = j - o * inner;
    acc += Load(dy, (o * c + k) * inner + i);
  }
  float total = BlockSum(acc, buf);
  if (threadIdx.x == 0) Store(db, k, Load(db, k) + total);
}

template <typename T>
__global__ void AvgPoolForwardKernel(const T* x, T* y, int64_t rows, int64_t hw) {
  GRID_STRIDE(r, rows) {
    float acc = 0.f;
    for (int64_t j = 0; j < hw; ++j) acc += Load(x, r * hw + j);
    Store(y, r, acc / float(hw));
  }
}
template <typename T>
__global__ void AvgPoolBackwardKernel(const T* dy, T* dx, int64_t rows, int64_t hw) {
  GRID_STRIDE(i, rows * hw) Store(dx, i, Load(dy, i / hw) / float(hw));
}

// One block per row.
__global__ void SoftmaxXentKernel(const float* logits, const int32_t* labels, int64_t n, int64_t k, float eps,
                                  float* dlogits, float* row_loss, int32_t* row_correct) {
  __shared__ float buf[kThreads];
  __shared__ int64_t ibuf[kThreads];
  const int64_t r = blockIdx.x;
  const float* z = logits + r * k;
  const int32_t label = labels[r];

  // First index of the maximum, matching a sequential argmax on the host.
  float best = -FLT_MAX;
  int64_t best_i = k;
  for (int64_t j = threadIdx.x; j < k; j += kThreads) {
    if (z[j] > best || best_i == k) {
      best = z[j];
      best_i = j;
    }
  }
  buf[threadIdx.x] = best;
  ibuf[threadIdx.x] = best_i;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      float ov = buf[threadIdx.x + s];
      int64_t oi = ibuf[threadIdx.x + s];
      if (oi < k &&
          (ibuf[threadIdx.x] == k || ov > buf[threadIdx.x] || (ov == buf[threadIdx.x] && oi < ibuf[threadIdx.x]))) {
        buf[threadIdx.x] = ov;
        ibuf[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  const float zmax = buf[0];
  const int64_t argmax = ibuf[0];
  // Read before any thread writes dlogits, which may alias logits.
  const float z_label = z[label];
  __syncthreads();

  float se = 0.f, sz = 0.f;
  for (int64_t j = threadIdx.x; j < k; j += kThreads) {
    se += expf(z[j] - zmax);
    sz += z[j];
  }
  const float sum_exp = BlockSum(se, buf);
  const float sum_z = BlockSum(sz, buf);
  const float lse = zmax + logf(sum_exp);
  const float off = eps / float(k);
  const float on = 1.f - eps + off;

  if (threadIdx.x == 0) {
    // -sum_j t_j (z_j - lse) = lse - sum_j t_j z_j, since the targets sum to 1.
    row_loss[r] = lse - ((1.f - eps) * z_label + off * sum_z);
    row_correct[r] = argmax == label ? 1 : 0;
  }
  if (dlogits != nullptr) {
    const float inv_n = 1.f / float(n);
    float* d = dlogits + r * k;
    for (int64_t j = threadIdx.x; j < k; j += kThreads) {
      float p = expf(z[j] - zmax) / sum_exp;
      d[j] = (p - (j == label ? on : off)) * inv_n;
    }
  }
}

__global__ void SumSquaresKernel(const float* x, int64_t n, double* partials) {
  __shared__ double buf[kThreads];
  double acc = 0.0;
  GRID_STRIDE(i, n) {
    double v = x[i];
    acc += v * v;
  }
  double total = BlockSum(acc, buf);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

template <typename S>
cudaError_t CastFrom(const S* src, void* dst, int dst_type, int64_t n, cudaStream_t s) {
  switch (dst_type) {
    case kF32:
      CastKernel<<<BlocksFor(n), kThreads, 0, s>>>(src, static_cast<float*>(dst), n);
      break;
    case kF16:
      CastKernel<<<BlocksFor(n), kThreads, 0, s>>>(src, static_cast<__half*>(dst), n);
      break;
    case kBF16:
      CastKernel<<<BlocksFor(n), kThreads, 0, s>>>(src, static_cast<__nv_bfloat16*>(dst), n);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// Calls f with a null pointer of the element type `type` names, then reports launch errors.
template <typename F>
cudaError_t Dispatch(int type, F f) {
  switch (type) {
    case kF32:
      f(static_cast<float*>(nullptr));
      break;
    case kF16:
      f(static_cast<__half*>(nullptr));
      break;
    case kBF16:
      f(static_cast<__nv_bfloat16*>(nullptr));
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t Fill(void* p, int type, int64_t n, float v, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  switch (type) {
    case kF32:
      FillKernel<<<BlocksFor(n), kThreads, 0, s>>>(static_cast<float*>(p), n, v);
      break;
    case kF16:
      FillKernel<<<BlocksFor(n), kThreads, 0, s>>>(static_cast<__half*>(p), n, v);
      break;
    case kBF16:
      FillKernel<<<BlocksFor(n), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(p), n, v);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t Cast(const void* src, int src_type, void* dst, int dst_type, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  switch (src_type) {
    case kF32:
      return CastFrom(static_cast<const float*>(src), dst, dst_type, n, s);
    case kF16:
      return CastFrom(static_cast<const __half*>(src), dst, dst_type, n, s);
    case kBF16:
      return CastFrom(static_cast<const __nv_bfloat16*>(src), dst, dst_type, n, s);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t Add(int type, const void* a, const void* b, void* y, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return Dispatch(type, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    AddKernel<<<BlocksFor(n), kThreads, 0, s>>>(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y),
                                                n);
  });
}
cudaError_t Axpy(int type, float alpha, const void* x, void* y, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return Dispatch(type, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    AxpyKernel<<<BlocksFor(n), kThreads, 0, s>>>(alpha, static_cast<const T*>(x), static_cast<T*>(y), n);
  });
}
cudaError_t Scale(int type, float alpha, void* x, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return Dispatch(type, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    ScaleKernel<<<BlocksFor(n), kThreads, 0, s>>>(alpha, static_cast<T*>(x), n);
  });
}
cudaError_t ReluForward(int type, const void* x, void* y, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return Dispatch(type, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    ReluForwardKernel<<<BlocksFor(n), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), n);
  });
}
cudaError_t ReluBackward(int type, const void* y, const void* dy, void* dx, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return Dispatch(type, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    ReluBackwardKernel<<<BlocksFor(n), kThreads, 0, s>>>(static_cast<const T*>(y), static_cast<const T*>(dy),
                                                         static_cast<T*>(dx), n);
  });
}

cudaError_t BiasAdd(int type, void* y, const void* b, int64_t outer, int64_t c, int64_t inner, cudaStream_t s) {
  const int64_t n = outer * c * inner;
  if (n == 0) return cudaSuccess;
  return Dispatch(type, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    BiasAddKernel<<<BlocksFor(n), kThreads, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(b), c, inner, n);
  });
}

cudaError_t BiasGradAccumulate(int type, const void* dy, void* db, int64_t outer, int64_t c, int64_t inner,
                               cudaStream_t s) {
  if (c == 0) return cudaSuccess;
  if (c > 0x7fffffff) return cudaErrorInvalidValue;
  return Dispatch(type, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    BiasGradKernel<<<unsigned(c), kThreads, 0, s>>>(static_cast<const T*>(dy), static_cast<T*>(db), outer, c, inner);
  });
}

cudaError_t GlobalAvgPoolForward(int type, const void* x, void* y, int64_t rows, int64_t hw, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  return Dispatch(type, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    AvgPoolForwardKernel<<<BlocksFor(rows), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), rows, hw);
  });
}
cudaError_t GlobalAvgPoolBackward(int type, const void* dy, void* dx, int64_t rows, int64_t hw, cudaStream_t s) {
  if (rows * hw == 0) return cudaSuccess;
  return Dispatch(type, [&](auto* t) {
    using T = std::remove_pointer_t<decltype(t)>;
    AvgPoolBackwardKernel<<<BlocksFor(rows * hw), kThreads, 0, s>>>(static_cast<const T*>(dy), static_cast<T*>(dx),
                                                                    rows, hw);
  });
}

cudaError_t SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t k, float smoothing,
                                float* dlogits, float* row_loss, int32_t* row_correct, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (n > 0x7fffffff) return cudaErrorInvalidValue;
  SoftmaxXentKernel<<<unsigned(n), kThreads, 0, s>>>(logits, labels, n, k, smoothing, dlogits, row_loss, row_correct);
  return cudaGetLastError();
}

cudaError_t SumSquaresPartials(const float* x, int64_t n, double* partials, cudaStream_t s) {
  SumSquaresKernel<<<kSumSquaresBlocks, kThreads, 0, s>>>(x, n, partials);
  return cudaGetLastError();
}

}  // namespace cudak
}  // namespace shoal

// ---- cuBLAS wrappers (blas.h). They live in this file because cuda_library runs one nvcc
// per .cu with pid-derived temp names in a shared /tmp, so two .cu files compiled at once
// in sibling sandboxes can clobber each other.

namespace shoal {
namespace blas {
namespace {
const char* Msg(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? nullptr : cublasGetStatusString(s); }
}  // namespace

const char* Create(Handle* h, cudaStream_t s, bool allow_tf32) {
  cublasHandle_t handle = nullptr;
  cublasStatus_t st = cublasCreate(&handle);
  if (st != CUBLAS_STATUS_SUCCESS) return Msg(st);
  if ((st = cublasSetStream(handle, s)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST)) != CUBLAS_STATUS_SUCCESS ||
      (st = cublasSetMathMode(handle, allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH)) !=
          CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(handle);
    return Msg(st);
  }
  *h = handle;
  return nullptr;
}

void Destroy(Handle h) {
  if (h) cublasDestroy(static_cast<cublasHandle_t>(h));
}

const char* Sgemm(Handle h, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc) {
  return Msg(cublasSgemm(static_cast<cublasHandle_t>(h), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                         trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc));
}

namespace {
// Narrow A and B of `type`, C of c_type, fp32 accumulation on tensor cores.
const char* GemmEx(Handle h, int type, bool c_narrow, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                   const void* a, int lda, const void* b, int ldb, float beta, void* c, int ldc) {
  cudaDataType_t t;
  if (type == cudak::kF16) {
    t = CUDA_R_16F;
  } else if (type == cudak::kBF16) {
    t = CUDA_R_16BF;
  } else {
    return "GemmHalf/GemmMixed: element type must be fp16 or bf16";
  }
  return Msg(cublasGemmEx(static_cast<cublasHandle_t>(h), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                          trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, t, lda, b, t, ldb, &beta, c,
                          c_narrow ? t : CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
}  // namespace

const char* GemmHalf(Handle h, int type, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
                     int lda, const void* b, int ldb, float beta, void* c, int ldc) {
  return GemmEx(h, type, true, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char* GemmMixed(Handle h, int type, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const void* a,
                      int lda, const void* b, int ldb, float beta, float* c, int ldc) {
  return GemmEx(h, type, false, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char* SgemmStridedBatched(Handle h, bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                                int lda, long long stride_a, const float* b, int ldb, long long stride_b, float beta,
                                float* c, int ldc, long long stride_c, int batch) {
  return Msg(cublasSgemmStridedBatched(static_cast<cublasHandle_t>(h), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, lda, stride_a, b, ldb,
                                       stride_b, &beta, c, ldc, stride_c, batch));
}

const char* GemmMixedStridedBatched(Handle h, int type, bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                                    const void* a, int lda, long long stride_a, const void* b, int ldb,
                                    long long stride_b, float beta, float* c, int ldc, long long stride_c, int batch) {
  cudaDataType_t t;
  if (type == cudak::kF16) {
    t = CUDA_R_16F;
  } else if (type == cudak::kBF16) {
    t = CUDA_R_16BF;
  } else {
    return "GemmMixedStridedBatched: element type must be fp16 or bf16";
  }
  return Msg(cublasGemmStridedBatchedEx(static_cast<cublasHandle_t>(h), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a, t, lda, stride_a, b, t,
                                        ldb, stride_b, &beta, c, CUDA_R_32F, ldc, stride_c, batch, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
}

}  // namespace blas
}  // namespace shoal
