#include "worker/engine/cuda/layout_cast.h"

#include "common/dtype_bits.h"
#include "worker/engine/cuda/kernels.h"

namespace shoal {
namespace cudak {
namespace {

// 32x32 tiles through shared memory so that both the strided read and the strided write
// of a transpose stay coalesced; blocks of 32x8 threads each move 4 rows.
constexpr int kTile = 32;
constexpr int kRows = 8;

struct F16 {
  __device__ static uint16_t To(float f) { return dtype_bits::HalfFromFloatBits(__float_as_uint(f)); }
  __device__ static float From(uint16_t h) { return __uint_as_float(dtype_bits::FloatBitsFromHalf(h)); }
};
struct BF16 {
  __device__ static uint16_t To(float f) { return dtype_bits::Bf16FromFloatBits(__float_as_uint(f)); }
  __device__ static float From(uint16_t h) { return __uint_as_float(dtype_bits::FloatBitsFromBf16(h)); }
};

// Grid: x over hw tiles, y over c tiles, z over images; y and z loop so any size fits.
template <typename T>
__global__ void ToNhwcKernel(const float* src, uint16_t* dst, int64_t n, int64_t c, int64_t hw) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t p0 = int64_t(blockIdx.x) * kTile;
  for (int64_t c0 = int64_t(blockIdx.y) * kTile; c0 < c; c0 += int64_t(gridDim.y) * kTile) {
    for (int64_t img = blockIdx.z; img < n; img += gridDim.z) {
      const float* s = src + img * c * hw;
      uint16_t* d = dst + img * c * hw;
      for (int j = threadIdx.y; j < kTile; j += kRows) {
        const int64_t k = c0 + j, p = p0 + threadIdx.x;
        if (k < c && p < hw) tile[j][threadIdx.x] = s[k * hw + p];
      }
      __syncthreads();
      for (int j = threadIdx.y; j < kTile; j += kRows) {
        const int64_t p = p0 + j, k = c0 + threadIdx.x;
        if (k < c && p < hw) d[p * c + k] = T::To(tile[threadIdx.x][j]);
      }
      __syncthreads();
    }
  }
}

template <typename T>
__global__ void FromNhwcKernel(const uint16_t* src, float* dst, const float* bias, bool accumulate, int64_t n,
                               int64_t c, int64_t hw) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t p0 = int64_t(blockIdx.x) * kTile;
  for (int64_t c0 = int64_t(blockIdx.y) * kTile; c0 < c; c0 += int64_t(gridDim.y) * kTile) {
    for (int64_t img = blockIdx.z; img < n; img += gridDim.z) {
      const uint16_t* s = src + img * c * hw;
      float* d = dst + img * c * hw;
      for (int j = threadIdx.y; j < kTile; j += kRows) {
        const int64_t p = p0 + j, k = c0 + threadIdx.x;
        if (k < c && p < hw) tile[j][threadIdx.x] = T::From(s[p * c + k]);
      }
      __syncthreads();
      for (int j = threadIdx.y; j < kTile; j += kRows) {
        const int64_t k = c0 + j, p = p0 + threadIdx.x;
        if (k < c && p < hw) {
          float v = tile[threadIdx.x][j];
          if (bias != nullptr) v += bias[k];
          if (accumulate) v += d[k * hw + p];
          d[k * hw + p] = v;
        }
      }
      __syncthreads();
    }
  }
}

// c == 1: the transpose is the identity, so a plain elementwise pass (the NCHW fallback
// and the fully connected layer use it).
template <typename T>
__global__ void ToLowKernel(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(blockDim.x) * gridDim.x)
    dst[i] = T::To(src[i]);
}
template <typename T>
__global__ void FromLowKernel(const uint16_t* src, float* dst, const float* bias, bool accumulate, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(blockDim.x) * gridDim.x) {
    float v = T::From(src[i]);
    if (bias != nullptr) v += bias[0];
    if (accumulate) v += dst[i];
    dst[i] = v;
  }
}

unsigned FlatBlocks(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return unsigned(b < 65535 ? b : 65535);
}

dim3 Grid(int64_t n, int64_t c, int64_t hw) {
  const int64_t x = (hw + kTile - 1) / kTile, y = (c + kTile - 1) / kTile;
  return dim3(unsigned(x), unsigned(y < 65535 ? y : 65535), unsigned(n < 65535 ? n : 65535));
}

bool BadSize(int64_t n, int64_t c, int64_t hw) {
  return n < 0 || c < 0 || hw < 0 || (hw + kTile - 1) / kTile > 0x7fffffff;
}

}  // namespace

cudaError_t NchwToNhwc(const float* src, void* dst, int dst_type, int64_t n, int64_t c, int64_t hw, cudaStream_t s) {
  if (BadSize(n, c, hw) || (dst_type != kF16 && dst_type != kBF16)) return cudaErrorInvalidValue;
  if (n == 0 || c == 0 || hw == 0) return cudaSuccess;
  auto* d = static_cast<uint16_t*>(dst);
  if (c == 1) {
    if (dst_type == kF16) {
      ToLowKernel<F16><<<FlatBlocks(n * hw), 256, 0, s>>>(src, d, n * hw);
    } else {
      ToLowKernel<BF16><<<FlatBlocks(n * hw), 256, 0, s>>>(src, d, n * hw);
    }
    return cudaGetLastError();
  }
  if (dst_type == kF16) {
    ToNhwcKernel<F16><<<Grid(n, c, hw), dim3(kTile, kRows), 0, s>>>(src, d, n, c, hw);
  } else {
    ToNhwcKernel<BF16><<<Grid(n, c, hw), dim3(kTile, kRows), 0, s>>>(src, d, n, c, hw);
  }
  return cudaGetLastError();
}

cudaError_t NhwcToNchw(const void* src, int src_type, float* dst, const float* bias, bool accumulate, int64_t n,
                       int64_t c, int64_t hw, cudaStream_t s) {
  if (BadSize(n, c, hw) || (src_type != kF16 && src_type != kBF16)) return cudaErrorInvalidValue;
  if (n == 0 || c == 0 || hw == 0) return cudaSuccess;
  auto* sp = static_cast<const uint16_t*>(src);
  if (c == 1) {
    if (src_type == kF16) {
      FromLowKernel<F16><<<FlatBlocks(n * hw), 256, 0, s>>>(sp, dst, bias, accumulate, n * hw);
    } else {
      FromLowKernel<BF16><<<FlatBlocks(n * hw), 256, 0, s>>>(sp, dst, bias, accumulate, n * hw);
    }
    return cudaGetLastError();
  }
  if (src_type == kF16) {
    FromNhwcKernel<F16><<<Grid(n, c, hw), dim3(kTile, kRows), 0, s>>>(sp, dst, bias, accumulate, n, c, hw);
  } else {
    FromNhwcKernel<BF16><<<Grid(n, c, hw), dim3(kTile, kRows), 0, s>>>(sp, dst, bias, accumulate, n, c, hw);
  }
  return cudaGetLastError();
}

}  // namespace cudak
}  // namespace shoal
