// The GPU top-k against the CPU one (both exact top-k, so the index sets must match); runs
// where a CUDA device is present and says why it skips where not.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>

#include "algorithms/compressors/topk.h"
#include "algorithms/compressors/topk_gpu.h"
#include "common/error.h"

namespace shoal {
namespace {

bool HaveDevice(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    *why = e != cudaSuccess ? cudaGetErrorString(e) : "no devices";
    return false;
  }
  return true;
}

TEST(TopKGpu, NoDeviceIsAClearError) {
  std::string why;
  if (HaveDevice(&why)) GTEST_SKIP() << "a CUDA device is present";
  try {
    SampledTopKGpu(nullptr, 100, 10, 0, 1, nullptr, nullptr, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

TEST(TopKGpu, MatchesCpuTopK) {
  std::string why;
  if (!HaveDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd;
  for (int64_t n : {int64_t(1000), int64_t(1) << 20}) {
    for (int64_t k : {int64_t(1), n / 1000 + 1, n / 4}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (auto& v : x) v = nd(rng);
      std::vector<int32_t> ci;
      std::vector<float> cv;
      SampledTopK(x.data(), n, k, 3, rng, &ci, &cv);
      float* dx;
      int32_t* di;
      float* dv;
      void* scratch;
      ASSERT_EQ(cudaMalloc(&dx, size_t(n) * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&di, size_t(k) * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dv, size_t(k) * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&scratch, TopKGpuScratchBytes(n)), cudaSuccess);
      cudaMemcpy(dx, x.data(), size_t(n) * 4, cudaMemcpyHostToDevice);
      SampledTopKGpu(dx, n, k, 3, 9, di, dv, scratch);
      std::vector<int32_t> gi(static_cast<size_t>(k));
      std::vector<float> gv(static_cast<size_t>(k));
      cudaMemcpy(gi.data(), di, size_t(k) * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(gv.data(), dv, size_t(k) * 4, cudaMemcpyDeviceToHost);
      for (size_t t = 0; t < gi.size(); ++t) EXPECT_EQ(gv[t], x[size_t(gi[t] - 3)]);
      std::sort(ci.begin(), ci.end());
      std::sort(gi.begin(), gi.end());
      EXPECT_EQ(ci, gi) << "n " << n << " k " << k;
      cudaFree(dx);
      cudaFree(di);
      cudaFree(dv);
      cudaFree(scratch);
    }
  }
}

// A gradient of NaNs (an overflowed fp16 step) still gives k in-range indices: NaN never
// passed `|x| >= thr`, so fewer than k candidates reached the trim, and the gather read
// uninitialized scratch as indices (an illegal address that poisons the CUDA context).
TEST(TopKGpu, NanGradientGivesKInRangeIndices) {
  std::string why;
  if (!HaveDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  const int64_t n = 50000, k = 1000, base = 7;
  std::vector<float> x(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
  for (int64_t i = 0; i < n; i += 100) x[size_t(i)] = 0.5f;  // 500 finite values, fewer than k
  float* dx;
  int32_t* di;
  float* dv;
  void* scratch;
  ASSERT_EQ(cudaMalloc(&dx, size_t(n) * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&di, size_t(k) * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dv, size_t(k) * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&scratch, TopKGpuScratchBytes(n)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), size_t(n) * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  SampledTopKGpu(dx, n, k, base, 9, di, dv, scratch);
  std::vector<int32_t> gi(static_cast<size_t>(k));
  ASSERT_EQ(cudaMemcpy(gi.data(), di, size_t(k) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int32_t i : gi) ASSERT_TRUE(i >= base && i < base + n) << i;
  std::sort(gi.begin(), gi.end());
  EXPECT_EQ(std::unique(gi.begin(), gi.end()), gi.end()) << "an index came twice";
  cudaFree(dx);
  cudaFree(di);
  cudaFree(dv);
  cudaFree(scratch);
}

}  // namespace
}  // namespace shoal
