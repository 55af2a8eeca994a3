#include "worker/engine/cuda/graph_kernels.h"

#include <cuda_runtime.h>

#include <cmath>

namespace shoal {
namespace cudak {
namespace {

constexpr int kThreads = 256;

inline int BlocksFor(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  return int(b > 65535 ? 65535 : b);
}
// Grids of one block per row (or per output element) loop over the rest.
inline int RowBlocks(int64_t rows) { return int(rows < 1 ? 1 : rows > 65535 ? 65535 : rows); }

#define GRID_STRIDE(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(blockDim.x) * gridDim.x)

// Offsets of the element at linear position i of the walk, for the first `ops` operands.
template <int ops>
__device__ __forceinline__ void Offsets(const Walk& w, int64_t i, int64_t* off) {
#pragma unroll
  for (int k = 0; k < ops; ++k) off[k] = w.offset[k];
  for (int d = w.ndim - 1; d >= 0; --d) {
    const int64_t n = w.shape[d];
    const int64_t q = i / n, r = i - q * n;
#pragma unroll
    for (int k = 0; k < ops; ++k) off[k] += r * w.stride[k][d];
    i = q;
  }
}

// A fixed-order tree sum over a block of kThreads threads.
__device__ float BlockSum(float v, float* buf) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  float r = buf[0];
  __syncthreads();
  return r;
}

__device__ __forceinline__ float UnaryF(int op, float x, float a, float b) {
  switch (op) {
    case kUIdentity:
      return x;
    case kUNeg:
      return -x;
    case kURelu:
      return x > 0.f ? x : 0.f;
    case kULeakyRelu:
      return x < 0.f ? a * x : x;
    case kUClip:
      return fminf(fmaxf(x, a), b);
    case kUSigmoid:
      return 1.f / (1.f + expf(-x));
    case kUTanh:
      return tanhf(x);
    case kUErf:
      return erff(x);
    case kUSqrt:
      return sqrtf(x);
    case kUExp:
      return expf(x);
    case kULog:
      return logf(x);
    case kUAbs:
      return fabsf(x);
    case kUReciprocal:
      return 1.f / x;
    case kUPowScalar:
      return powf(x, a);
    case kUAffine:
      return a * x + b;
  }
  return x;
}

// dx for dy = 1; reads x or y, whichever is cheaper.
__device__ __forceinline__ float UnaryGrad(int op, float x, float y, float a, float b) {
  switch (op) {
    case kUIdentity:
      return 1.f;
    case kUNeg:
      return -1.f;
    case kURelu:
      return x > 0.f ? 1.f : 0.f;
    case kULeakyRelu:
      return x < 0.f ? a : 1.f;
    case kUClip:
      return x >= a && x <= b ? 1.f : 0.f;
    case kUSigmoid:
      return y * (1.f - y);
    case kUTanh:
      return 1.f - y * y;
    case kUErf:
      return 1.1283791670955126f * expf(-x * x);  // 2 / sqrt(pi)
    case kUSqrt:
      return 0.5f / y;
    case kUExp:
      return y;
    case kULog:
      return 1.f / x;
    case kUAbs:
      return x > 0.f ? 1.f : x < 0.f ? -1.f : 0.f;
    case kUReciprocal:
      return -y * y;
    case kUPowScalar:
      return a * powf(x, a - 1.f);
    case kUAffine:
      return a;
  }
  return 1.f;
}

__device__ __forceinline__ float BinaryF(int op, float a, float b) {
  switch (op) {
    case kBAdd:
      return a + b;
    case kBSub:
      return a - b;
    case kBMul:
      return a * b;
    case kBDiv:
      return a / b;
    case kBPow:
      return powf(a, b);
    case kBMax:
      return fmaxf(a, b);
    case kBMin:
      return fminf(a, b);
    case kBEqual:
      return a == b ? 1.f : 0.f;
    case kBLess:
      return a < b ? 1.f : 0.f;
    case kBGreater:
      return a > b ? 1.f : 0.f;
  }
  return 0.f;
}

__global__ void UnaryKernel(int op, const float* x, float* y, int64_t n, float a, float b) {
  GRID_STRIDE(i, n) y[i] = UnaryF(op, x[i], a, b);
}

__global__ void UnaryBackwardKernel(int op, const float* x, const float* y, const float* dy, float* dx, int64_t n,
                                    float a, float b) {
  GRID_STRIDE(i, n) dx[i] = dy[i] * UnaryGrad(op, x ? x[i] : 0.f, y ? y[i] : 0.f, a, b);
}

__global__ void BinaryKernel(int op, const float* a, const float* b, float* y, Walk w, int64_t n) {
  GRID_STRIDE(i, n) {
    int64_t off[2];
    Offsets<2>(w, i, off);
    y[i] = BinaryF(op, a[off[0]], b[off[1]]);
  }
}

__global__ void WhereKernel(const float* c, const float* a, const float* b, float* y, Walk w, int64_t n) {
  GRID_STRIDE(i, n) {
    int64_t off[3];
    Offsets<3>(w, i, off);
    y[i] = c[off[0]] != 0.f ? a[off[1]] : b[off[2]];
  }
}

__global__ void StridedCopyKernel(const float* src, float* dst, Walk w, int64_t n, bool accumulate) {
  GRID_STRIDE(i, n) {
    int64_t off[2];
    Offsets<2>(w, i, off);
    const float v = src[off[0]];
    dst[off[1]] = accumulate ? dst[off[1]] + v : v;
  }
}

// Short reductions: one thread per output element, summing in walk order.
__global__ void ReduceSumThreadKernel(const float* x, float* y, Walk kept, Walk red, int64_t outs, int64_t r,
                                      float alpha, bool accumulate) {
  GRID_STRIDE(o, outs) {
    int64_t base;
    Offsets<1>(kept, o, &base);
    float acc = 0.f;
    for (int64_t j = 0; j < r; ++j) {
      int64_t off;
      Offsets<1>(red, j, &off);
      acc += x[base + off];
    }
    y[o] = alpha * acc + (accumulate ? y[o] : 0.f);
  }
}

// Long reductions: one block per output element, a strided partial per thread, then a tree.
__global__ void ReduceSumBlockKernel(const float* x, float* y, Walk kept, Walk red, int64_t outs, int64_t r,
                                     float alpha, bool accumulate) {
  __shared__ float buf[kThreads];
  for (int64_t o = blockIdx.x; o < outs; o += gridDim.x) {
    int64_t base;
    Offsets<1>(kept, o, &base);
    float acc = 0.f;
    for (int64_t j = threadIdx.x; j < r; j += kThreads) {
      int64_t off;
      Offsets<1>(red, j, &off);
      acc += x[base + off];
    }
    const float total = BlockSum(acc, buf);
    if (threadIdx.x == 0) y[o] = alpha * total + (accumulate ? y[o] : 0.f);
  }
}

__global__ void LayerNormForwardKernel(const float* x, const float* gamma, const float* beta, int64_t rows,
                                       int64_t cols, float eps, float* y, float* mean, float* invstd) {
  __shared__ float buf[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float acc = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) acc += xr[j];
    const float mu = BlockSum(acc, buf) / float(cols);
    // Two passes over the row: E[(x - mu)^2] has no cancellation, unlike E[x^2] - mu^2.
    acc = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const float d = xr[j] - mu;
      acc += d * d;
    }
    const float inv = 1.f / sqrtf(BlockSum(acc, buf) / float(cols) + eps);
    float* yr = y + r * cols;
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const float v = (xr[j] - mu) * inv * gamma[j];
      yr[j] = beta ? v + beta[j] : v;
    }
    if (threadIdx.x == 0) {
      mean[r] = mu;
      invstd[r] = inv;
    }
  }
}

// dx = invstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma.
__global__ void LayerNormBackwardDataKernel(const float* x, const float* dy, const float* gamma, const float* mean,
                                            const float* invstd, int64_t rows, int64_t cols, float* dx) {
  __shared__ float buf[kThreads];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    const float* dyr = dy + r * cols;
    const float mu = mean[r], inv = invstd[r];
    float sg = 0.f, sgx = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const float g = dyr[j] * gamma[j];
      sg += g;
      sgx += g * (xr[j] - mu) * inv;
    }
    const float mg = BlockSum(sg, buf) / float(cols);
    const float mgx = BlockSum(sgx, buf) / float(cols);
    float* dxr = dx + r * cols;
    for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const float xhat = (xr[j] - mu) * inv;
      dxr[j] = inv * (dyr[j] * gamma[j] - mg - xhat * mgx);
    }
  }
}

constexpr int kColTile = 32, kRowLanes = 8;

// Stage 1: block (32 columns x 8 row lanes) over one chunk of rows; each lane sums its rows
// in order, lane partials add up in lane order: partials[chunk, col].
__global__ void LayerNormParamPartialsKernel(const float* x, const float* dy, const float* mean, const float* invstd,
                                             int64_t rows, int64_t cols, int64_t rows_per_chunk, float* pg, float* pb) {
  __shared__ float sg[kRowLanes][kColTile + 1], sb[kRowLanes][kColTile + 1];
  const int64_t col = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float ag = 0.f, ab = 0.f;
  if (col < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float d = dy[r * cols + col];
      ag += d * (x[r * cols + col] - mean[r]) * invstd[r];
      ab += d;
    }
  }
  sg[threadIdx.y][threadIdx.x] = ag;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float tg = 0.f, tb = 0.f;
    for (int k = 0; k < kRowLanes; ++k) {
      tg += sg[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    pg[chunk * cols + col] = tg;
    pb[chunk * cols + col] = tb;
  }
}

// Stage 2: per column, the chunks' partials in chunk order.
__global__ void LayerNormParamFinishKernel(const float* pg, const float* pb, int64_t chunks, int64_t cols,
                                           float* dgamma, float* dbeta) {
  GRID_STRIDE(c, cols) {
    float tg = 0.f, tb = 0.f;
    for (int64_t k = 0; k < chunks; ++k) {
      tg += pg[k * cols + c];
      tb += pb[k * cols + c];
    }
    if (dgamma) dgamma[c] += tg;
    if (dbeta) dbeta[c] += tb;
  }
}

__global__ void IndexSelectKernel(const float* x, const int32_t* idx, float* y, int64_t dim, int64_t m, int64_t inner,
                                  int64_t n) {
  GRID_STRIDE(i, n) {
    const int64_t in = i % inner, t = i / inner;
    const int64_t j = t % m, o = t / m;
    y[i] = x[(o * dim + idx[j]) * inner + in];
  }
}

__global__ void IndexSelectBackwardKernel(const float* dy, const int32_t* start, const int32_t* pos, float* dx,
                                          int64_t dim, int64_t m, int64_t inner, int64_t n) {
  GRID_STRIDE(i, n) {
    const int64_t in = i % inner, t = i / inner;
    const int64_t d = t % dim, o = t / dim;
    const int32_t b = start[d], e = start[d + 1];
    if (b == e) continue;
    float acc = 0.f;
    for (int32_t k = b; k < e; ++k) acc += dy[(o * m + pos[k]) * inner + in];
    dx[i] += acc;
  }
}

// backend.h's HashUniform, the same 64-bit arithmetic.
__device__ __forceinline__ float HashUniformDev(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (1.0f / 16777216.0f);
}

__global__ void DropoutMaskKernel(uint64_t seed, float ratio, float scale, float* mask, int64_t n) {
  GRID_STRIDE(i, n) mask[i] = HashUniformDev(seed, uint64_t(i)) < ratio ? 0.f : scale;
}

int64_t NumElements(const Walk& w) {
  int64_t n = 1;
  for (int d = 0; d < w.ndim; ++d) n *= w.shape[d];
  return n;
}

}  // namespace

cudaError_t Unary(int op, const float* x, float* y, int64_t n, float a, float b, cudaStream_t s) {
  if (n > 0) UnaryKernel<<<BlocksFor(n), kThreads, 0, s>>>(op, x, y, n, a, b);
  return cudaGetLastError();
}

cudaError_t UnaryBackward(int op, const float* x, const float* y, const float* dy, float* dx, int64_t n, float a,
                          float b, cudaStream_t s) {
  if (n > 0) UnaryBackwardKernel<<<BlocksFor(n), kThreads, 0, s>>>(op, x, y, dy, dx, n, a, b);
  return cudaGetLastError();
}

cudaError_t Binary(int op, const float* a, const float* b, float* y, const Walk& w, cudaStream_t s) {
  const int64_t n = NumElements(w);
  if (n > 0) BinaryKernel<<<BlocksFor(n), kThreads, 0, s>>>(op, a, b, y, w, n);
  return cudaGetLastError();
}

cudaError_t Where(const float* cond, const float* a, const float* b, float* y, const Walk& w, cudaStream_t s) {
  const int64_t n = NumElements(w);
  if (n > 0) WhereKernel<<<BlocksFor(n), kThreads, 0, s>>>(cond, a, b, y, w, n);
  return cudaGetLastError();
}

cudaError_t StridedCopy(const float* src, float* dst, const Walk& w, bool accumulate, cudaStream_t s) {
  const int64_t n = NumElements(w);
  if (n > 0) StridedCopyKernel<<<BlocksFor(n), kThreads, 0, s>>>(src, dst, w, n, accumulate);
  return cudaGetLastError();
}

cudaError_t ReduceSum(const float* x, float* y, const Walk& kept, const Walk& reduced, float alpha, bool accumulate,
                      cudaStream_t s) {
  const int64_t outs = NumElements(kept), r = NumElements(reduced);
  if (outs == 0) return cudaGetLastError();
  // The choice depends on the shapes only, so a given call always sums in the same order.
  if (r <= 64)
    ReduceSumThreadKernel<<<BlocksFor(outs), kThreads, 0, s>>>(x, y, kept, reduced, outs, r, alpha, accumulate);
  else
    ReduceSumBlockKernel<<<RowBlocks(outs), kThreads, 0, s>>>(x, y, kept, reduced, outs, r, alpha, accumulate);
  return cudaGetLastError();
}

cudaError_t LayerNormForward(const float* x, const float* gamma, const float* beta, int64_t rows, int64_t cols,
                             float eps, float* y, float* mean, float* invstd, cudaStream_t s) {
  if (rows > 0)
    LayerNormForwardKernel<<<RowBlocks(rows), kThreads, 0, s>>>(x, gamma, beta, rows, cols, eps, y, mean, invstd);
  return cudaGetLastError();
}

cudaError_t LayerNormBackwardData(const float* x, const float* dy, const float* gamma, const float* mean,
                                  const float* invstd, int64_t rows, int64_t cols, float* dx, cudaStream_t s) {
  if (rows > 0)
    LayerNormBackwardDataKernel<<<RowBlocks(rows), kThreads, 0, s>>>(x, dy, gamma, mean, invstd, rows, cols, dx);
  return cudaGetLastError();
}

// Chunks of at least 64 rows, at most 256 chunks: enough blocks to fill the device for a
// transformer's [batch * tokens, hidden] without a long serial tail per lane.
int64_t LayerNormParamChunks(int64_t rows) {
  int64_t chunks = (rows + 63) / 64;
  if (chunks < 1) chunks = 1;
  return chunks > 256 ? 256 : chunks;
}

cudaError_t LayerNormBackwardParams(const float* x, const float* dy, const float* mean, const float* invstd,
                                    int64_t rows, int64_t cols, float* dgamma, float* dbeta, float* scratch,
                                    cudaStream_t s) {
  if (rows == 0 || cols == 0 || (!dgamma && !dbeta)) return cudaGetLastError();
  const int64_t chunks = LayerNormParamChunks(rows);
  const int64_t per = (rows + chunks - 1) / chunks;
  float* pg = scratch;
  float* pb = scratch + chunks * cols;
  const dim3 grid(unsigned((cols + kColTile - 1) / kColTile), unsigned(chunks));
  LayerNormParamPartialsKernel<<<grid, dim3(kColTile, kRowLanes), 0, s>>>(x, dy, mean, invstd, rows, cols, per, pg, pb);
  LayerNormParamFinishKernel<<<BlocksFor(cols), kThreads, 0, s>>>(pg, pb, chunks, cols, dgamma, dbeta);
  return cudaGetLastError();
}

cudaError_t IndexSelect(const float* x, const int32_t* idx, float* y, int64_t outer, int64_t dim, int64_t m,
                        int64_t inner, cudaStream_t s) {
  const int64_t n = outer * m * inner;
  if (n > 0) IndexSelectKernel<<<BlocksFor(n), kThreads, 0, s>>>(x, idx, y, dim, m, inner, n);
  return cudaGetLastError();
}

cudaError_t IndexSelectBackward(const float* dy, const int32_t* start, const int32_t* pos, float* dx, int64_t outer,
                                int64_t dim, int64_t m, int64_t inner, cudaStream_t s) {
  const int64_t n = outer * dim * inner;
  if (n > 0 && m > 0) IndexSelectBackwardKernel<<<BlocksFor(n), kThreads, 0, s>>>(dy, start, pos, dx, dim, m, inner, n);
  return cudaGetLastError();
}

cudaError_t DropoutMask(uint64_t seed, float ratio, float scale, float* mask, int64_t n, cudaStream_t s) {
  if (n > 0) DropoutMaskKernel<<<BlocksFor(n), kThreads, 0, s>>>(seed, ratio, scale, mask, n);
  return cudaGetLastError();
}

}  // namespace cudak
}  // namespace shoal
