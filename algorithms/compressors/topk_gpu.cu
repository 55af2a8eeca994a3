#include "algorithms/compressors/topk_gpu_kernel.h"

#include <cub/cub.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <stdexcept>

namespace shoal {
namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("topk gpu: ") + what + ": " + cudaGetErrorString(e));
}

constexpr int kSample = 4096;

// A fixed, well-spread sample: position i*stride + hash(i, seed) % stride.
__global__ void SampleAbs(const float* x, int64_t n, uint64_t seed, float* sample) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= kSample) return;
  int64_t stride = n / kSample > 0 ? n / kSample : 1;
  uint64_t h = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  int64_t pos = (int64_t(i) * stride + int64_t(h % uint64_t(stride))) % n;
  sample[i] = fabsf(x[pos]);
}

// Entries with |x| >= thr, and NaNs, are appended (unordered) through an atomic counter.
// NaN passes too: `a >= thr` is false for it, so a NaN-bearing gradient could leave fewer
// than k candidates even at thr = 0, and Gather would then read idx2 past the sorted ones
// (uninitialized scratch used as indices into x: an illegal address). With `!(a < thr)` the
// last attempt (thr = 0) keeps every entry, so found >= k always.
__global__ void Compact(const float* x, int64_t n, float thr, int* count, int cap, float* cand_key, int32_t* cand_idx) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float a = fabsf(x[i]);
    if (!(a < thr)) {
      int slot = atomicAdd(count, 1);
      if (slot < cap) {
        cand_key[slot] = a;
        cand_idx[slot] = int32_t(i);
      }
    }
  }
}

__global__ void Gather(const float* x, const int32_t* idx, int64_t k, int64_t base, int32_t* out_idx, float* out_val) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= k) return;
  out_idx[i] = int32_t(idx[i] + base);
  out_val[i] = x[idx[i]];
}

struct Layout {
  size_t sample, count, key, idx, key2, idx2, temp, total;
};

Layout Plan(int64_t n) {
  Layout l{};
  size_t temp = 0;
  cub::DeviceRadixSort::SortPairsDescending(nullptr, temp, (const float*)nullptr, (float*)nullptr,
                                            (const int32_t*)nullptr, (int32_t*)nullptr, int(n));
  auto align = [](size_t v) { return (v + 255) / 256 * 256; };
  l.sample = 0;
  l.count = align(l.sample + kSample * 4);
  l.key = align(l.count + 4);
  l.idx = align(l.key + size_t(n) * 4);
  l.key2 = align(l.idx + size_t(n) * 4);
  l.idx2 = align(l.key2 + size_t(n) * 4);
  l.temp = align(l.idx2 + size_t(n) * 4);
  l.total = l.temp + temp;
  return l;
}

}  // namespace

size_t TopKGpuScratchBytes(int64_t n) { return Plan(n).total; }

void SampledTopKGpuRaw(const float* x, int64_t n, int64_t k, int64_t base, uint64_t seed, int32_t* out_idx,
                       float* out_val, void* scratch) {
  k = std::min(k, n);
  if (k <= 0) return;
  if (n > INT32_MAX) throw std::runtime_error("topk gpu: tensors over 2^31 elements are not supported");
  int dev = 0;
  Check(cudaGetDeviceCount(&dev), "no CUDA device");
  Layout l = Plan(n);
  char* s = static_cast<char*>(scratch);
  float* sample = reinterpret_cast<float*>(s + l.sample);
  int* count = reinterpret_cast<int*>(s + l.count);
  float* key = reinterpret_cast<float*>(s + l.key);
  int32_t* idx = reinterpret_cast<int32_t*>(s + l.idx);
  float* key2 = reinterpret_cast<float*>(s + l.key2);
  int32_t* idx2 = reinterpret_cast<int32_t*>(s + l.idx2);
  // Threshold from the sample (host-side nth_element on 4096 values), a little low so that
  // usually more than k pass; widened if too few did.
  SampleAbs<<<(kSample + 255) / 256, 256>>>(x, n, seed, sample);
  std::vector<float> h(kSample);
  Check(cudaMemcpy(h.data(), sample, kSample * 4, cudaMemcpyDeviceToHost), "copy sample");
  double q = 1.0 - 1.5 * double(k) / double(n);
  int qi = std::clamp(int(q * kSample), 0, kSample - 1);
  // NaN ranks as the largest (as Compact takes it); nth_element wants a strict weak order.
  for (float& v : h)
    if (v != v) v = INFINITY;
  std::nth_element(h.begin(), h.begin() + qi, h.end());
  float thr = k * 4 >= n ? 0.0f : h[size_t(qi)];
  int found = 0;
  for (int attempt = 0; attempt < 4; ++attempt) {
    Check(cudaMemset(count, 0, 4), "memset");
    int blocks = int(std::min<int64_t>(1024, (n + 255) / 256));
    Compact<<<blocks, 256>>>(x, n, thr, count, int(n), key, idx);
    Check(cudaGetLastError(), "compact");
    Check(cudaMemcpy(&found, count, 4, cudaMemcpyDeviceToHost), "copy count");
    if (found >= k) break;
    thr = attempt == 2 ? 0.0f : thr * 0.5f;
  }
  if (found < k) throw std::runtime_error("topk gpu: " + std::to_string(found) + " candidates for k = " + std::to_string(k));
  // Exact trim: sort the candidates by |x| descending, keep the first k.
  size_t temp = l.total - l.temp;
  Check(cub::DeviceRadixSort::SortPairsDescending(s + l.temp, temp, key, key2, idx, idx2, found), "sort");
  Gather<<<int((k + 255) / 256), 256>>>(x, idx2, k, base, out_idx, out_val);
  Check(cudaGetLastError(), "gather");
  Check(cudaDeviceSynchronize(), "synchronize");
}

}  // namespace shoal
