// The CUDA optimizers (optimizer_gpu.h) against Optimizer::Apply: every rule, several steps
// across a warm-up, random tensors (a decayed weight, an odd-length decay=false bias, a
// zero-initialised tensor that takes the norm-0 branches), weights and every state slot
// compared after each step. Runs where a CUDA device is present and says why it skips where
// not; the registry and no-device errors are checked everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "algorithms/optimizers/optimizer.h"
#include "algorithms/optimizers/optimizer_gpu.h"
#include "common/cuda/platform.h"
#include "common/error.h"

namespace shoal {
namespace {

OptimizerHyper TestHyper(bool nesterov) {
  OptimizerHyper h;
  h.weight_decay = 0.01f;  // large enough that decay=false visibly differs
  h.nesterov = nesterov;
  h.trust_coefficient = 0.02f;
  h.lamb_lr_ratio = 0.5f;
  return h;
}

struct Tensor {
  int64_t n;
  bool decay;
  bool zero_init;
};

// Device and host must agree to float rounding: the two use the same formulas, but sums
// run in another order and nvcc may fuse multiply-adds.
void ExpectClose(const std::vector<float>& cpu, const std::vector<float>& gpu, const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i)
    ASSERT_NEAR(gpu[i], cpu[i], 2e-5 + 2e-4 * std::fabs(cpu[i])) << what << " [" << i << "]";
}

void CompareRule(const std::string& name, bool nesterov, const OptimizerHyper& h) {
  auto cpu = MakeOptimizer(name, h);
  auto gpu = MakeDeviceOptimizer(name, h);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  const Tensor tensors[] = {{4099, true, false}, {37, false, false}, {17, false, true}};
  for (const Tensor& t : tensors) {
    std::string what = name + (nesterov ? " (nesterov)" : "") + " n=" + std::to_string(t.n) +
                       (t.decay ? "" : " decay=false") + (t.zero_init ? " zero-init" : "");
    size_t n = size_t(t.n);
    std::vector<float> w(n), g(n);
    for (auto& x : w) x = t.zero_init ? 0.f : 0.1f * nd(rng);
    OptimizerState cpu_state;
    auto dev_state = gpu->NewState(t.n);
    float *dw = nullptr, *dg = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dw), n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dg), n * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dw, w.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    // Steps 0..5 over a 4-step warm-up: STiLL and rmsprop_sgd blend, then finish blending.
    for (int64_t step = 0; step < 6; ++step) {
      for (auto& x : g) x = 0.05f * nd(rng);
      StepContext ctx{0.5f * float(step + 1) / 6.f, step, 4};
      cpu->Apply(w.data(), g.data(), t.n, t.decay, ctx, &cpu_state);
      ASSERT_EQ(cudaMemcpyAsync(dg, g.data(), n * 4, cudaMemcpyHostToDevice, stream), cudaSuccess);
      gpu->Apply(dw, dg, t.n, t.decay, ctx, dev_state.get(), stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      std::vector<float> got(n);
      ASSERT_EQ(cudaMemcpy(got.data(), dw, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      std::string at = what + " step " + std::to_string(step);
      ExpectClose(w, got, at + " weights");
      OptimizerState dev = dev_state->Download();
      EXPECT_EQ(dev.steps, cpu_state.steps) << at;
      ASSERT_EQ(dev.slots.size(), cpu_state.slots.size()) << at;
      for (size_t s = 0; s < dev.slots.size(); ++s)
        ExpectClose(cpu_state.slots[s], dev.slots[s], at + " slot " + std::to_string(s));
      w = got;  // carry on from the device's weights so rounding does not accumulate
      dev_state->Upload(dev);
      cpu_state = dev;
    }
    cudaStreamDestroy(stream);
    cudaFree(dw);
    cudaFree(dg);
  }
}

TEST(OptimizerGpu, AgreesWithCpu) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  for (const std::string& name : OptimizerNames()) {
    SCOPED_TRACE(name);
    CompareRule(name, false, TestHyper(false));
    if (name == "momentum") CompareRule(name, true, TestHyper(true));
    if (name == "adam" || name == "adamw") {
      // PyTorch's defaults too (eps 1e-8: the division is then nearly sign(m) for small v),
      // and other betas, which come to the kernel as the host's rounded 1 - beta.
      OptimizerHyper h = DefaultOptimizerHyper(name);
      CompareRule(name, false, h);
      h.beta1 = 0.8;
      h.beta2 = 0.99;
      h.weight_decay = 0.1f;
      CompareRule(name, false, h);
    }
  }
}

// Replicas of an allreduce job apply the same step to the same bits and must stay
// identical: the norm sums over many blocks (n spans 1024 norm blocks) give the same bits
// on every run, so two applications from one start end bit for bit equal.
TEST(OptimizerGpu, NormRulesAreDeterministic) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  const int64_t n = 1 << 20;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (auto& x : w) x = 0.1f * nd(rng);
  for (auto& x : g) x = 0.05f * nd(rng);
  for (const char* name : {"lars", "lamb", "still"}) {
    auto gpu = MakeDeviceOptimizer(name, TestHyper(false));
    std::vector<std::vector<float>> out;
    for (int run = 0; run < 2; ++run) {
      auto st = gpu->NewState(n);
      float *dw = nullptr, *dg = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dw), size_t(n) * 4), cudaSuccess);
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dg), size_t(n) * 4), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dw, w.data(), size_t(n) * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(dg, g.data(), size_t(n) * 4, cudaMemcpyHostToDevice), cudaSuccess);
      for (int64_t step = 0; step < 3; ++step) gpu->Apply(dw, dg, n, true, StepContext{0.1f, step, 2}, st.get(), 0);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      out.emplace_back(size_t(n));
      ASSERT_EQ(cudaMemcpy(out.back().data(), dw, size_t(n) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      cudaFree(dw);
      cudaFree(dg);
    }
    EXPECT_EQ(0, memcmp(out[0].data(), out[1].data(), size_t(n) * 4)) << name << ": two runs differ";
  }
}

TEST(OptimizerGpu, RegistryMatchesCpu) {
  // Every CPU rule has a CUDA form with the same name; unknown names get the CPU's error.
  for (const std::string& name : OptimizerNames()) EXPECT_EQ(MakeDeviceOptimizer(name, OptimizerHyper())->Name(), name);
  try {
    MakeDeviceOptimizer("adagrad", OptimizerHyper());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown optimizer \"adagrad\" (known: adam, adamw, lamb, lars"),
              std::string::npos)
        << e.what();
  }
}

TEST(OptimizerGpu, NoDeviceIsAClearError) {
  std::string why;
  if (CudaDeviceCount(&why) > 0) GTEST_SKIP() << "a CUDA device is present";
  try {
    MakeDeviceOptimizer("lamb", OptimizerHyper())->NewState(10);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shoal
