// The CUDA DeviceOps (algorithms/cuda_device_ops.h). LocalUpdater on on-device views
// (ParamView::on_device) against the CPU LocalUpdater:
// every rule over a few steps across a warm-up, a decayed weight and a no-decay bias,
// weights compared after each step; a checkpoint written from device states continues on
// the CPU (and back) with the same weights. Needs a CUDA device and says why it skips
// without one; the no-CUDA-optimizer error is checked everywhere. ScaleGradients on device
// views gives the host loop's bits. After(fence) orders a copy after another stream's work.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <random>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/cuda_device_ops.h"
#include "common/cuda/platform.h"
#include "common/error.h"

namespace shoal {
namespace {

AlgorithmEnv EnvFor(const std::string& optimizer, bool with_device) {
  AlgorithmEnv env;
  OptimizerHyper h;
  h.weight_decay = 0.01f;
  h.trust_coefficient = 0.02f;
  h.lamb_lr_ratio = 0.5f;
  env.optimizer = MakeOptimizer(optimizer, h);
  LrScheduleOptions o;
  o.base_lr = 0.3;
  o.warmup_steps = 3;
  o.total_steps = 8;
  o.kind = "poly";
  env.schedule = std::make_shared<LrSchedule>(o);
  if (with_device) env.device = MakeCudaDeviceOps(0);
  return env;
}

// Two tensors (a weight with decay, an odd-length bias without) on the host or the device.
struct Params {
  std::vector<std::vector<float>> host;
  std::vector<float*> dev;
  std::vector<ParamView> views;
  Params(const std::vector<std::vector<float>>& w, bool on_device) : host(w) {
    for (size_t i = 0; i < host.size(); ++i) {
      ParamView p;
      p.name = i == 0 ? "fc.w" : "fc.b";
      p.n = int64_t(host[i].size());
      p.no_weight_decay = i == 1;
      p.on_device = on_device;
      if (on_device) {
        float* d[2] = {nullptr, nullptr};
        CheckCuda(cudaMalloc(reinterpret_cast<void**>(&d[0]), host[i].size() * 4), "test w");
        CheckCuda(cudaMalloc(reinterpret_cast<void**>(&d[1]), host[i].size() * 4), "test g");
        CheckCuda(cudaMemcpy(d[0], host[i].data(), host[i].size() * 4, cudaMemcpyHostToDevice), "test upload");
        dev.push_back(d[0]);
        dev.push_back(d[1]);
        p.w = d[0];
        p.g = d[1];
      } else {
        grads.emplace_back(host[i].size());
        p.w = host[i].data();
      }
      views.push_back(p);
    }
    if (!on_device)
      for (size_t i = 0; i < views.size(); ++i) views[i].g = grads[i].data();
  }
  ~Params() {
    for (float* p : dev) cudaFree(p);
  }
  void SetGrads(const std::vector<std::vector<float>>& g) {
    for (size_t i = 0; i < views.size(); ++i) {
      if (views[i].on_device)
        CheckCuda(cudaMemcpy(views[i].g, g[i].data(), g[i].size() * 4, cudaMemcpyHostToDevice), "test grads");
      else
        grads[i] = g[i];
    }
  }
  std::vector<float> Weights(size_t i) const {
    if (!views[i].on_device) return host[i];
    std::vector<float> out(host[i].size());
    CheckCuda(cudaMemcpy(out.data(), views[i].w, out.size() * 4, cudaMemcpyDeviceToHost), "test download");
    return out;
  }
  std::vector<std::vector<float>> grads;
};

void ExpectClose(const std::vector<float>& cpu, const std::vector<float>& gpu, const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i)
    ASSERT_NEAR(gpu[i], cpu[i], 2e-5 + 2e-4 * std::fabs(cpu[i])) << what << " [" << i << "]";
}

TEST(DeviceOps, AnOnDeviceViewWithoutACudaOptimizerIsAClearError) {
  LocalUpdater u(EnvFor("momentum", false));
  float w = 1, g = 1;
  ParamView p;
  p.name = "conv1.w";
  p.w = &w;
  p.g = &g;
  p.n = 1;
  p.on_device = true;
  try {
    u.Apply({p}, 0);
    FAIL() << "applied a device update without a CUDA optimizer";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("\"conv1.w\" is in device memory"), std::string::npos) << m;
    EXPECT_NE(m.find("no CUDA optimizer"), std::string::npos) << m;
  }
  EXPECT_EQ(w, 1.f);
}

TEST(DeviceOps, AgreesWithTheCpuUpdaterAndCheckpointsMoveBetweenThem) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  for (const std::string& name : OptimizerNames()) {
    SCOPED_TRACE(name);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<std::vector<float>> w = {std::vector<float>(4099), std::vector<float>(37)};
    for (auto& t : w)
      for (auto& x : t) x = 0.1f * nd(rng);
    Params cpu(w, false), gpu(w, true);
    LocalUpdater cu(EnvFor(name, true)), gu(EnvFor(name, true));
    for (int64_t step = 0; step < 5; ++step) {
      std::vector<std::vector<float>> g = w;
      for (auto& t : g)
        for (auto& x : t) x = 0.05f * nd(rng);
      cpu.SetGrads(g);
      gpu.SetGrads(g);
      cu.Apply(cpu.views, step);
      gu.Apply(gpu.views, step);
      for (size_t i = 0; i < w.size(); ++i)
        ExpectClose(cpu.Weights(i), gpu.Weights(i), "step " + std::to_string(step) + " " + cpu.views[i].name);
    }
    // The device states as a checkpoint: a CPU updater that loads them (with the device's
    // weights) takes the next step as the device does, and the device loads it back.
    CheckpointState ck;
    gu.Save(gpu.views, "opt/", &ck);
    std::vector<std::vector<float>> dw = {gpu.Weights(0), gpu.Weights(1)};
    Params cpu2(dw, false);
    LocalUpdater cu2(EnvFor(name, false));
    cu2.Load(cpu2.views, "opt/", ck);
    LocalUpdater gu2(EnvFor(name, true));
    Params gpu2(dw, true);
    gu2.Load(gpu2.views, "opt/", ck);
    std::vector<std::vector<float>> g = dw;
    for (auto& t : g)
      for (auto& x : t) x = 0.05f * nd(rng);
    cpu2.SetGrads(g);
    gpu2.SetGrads(g);
    cu2.Apply(cpu2.views, 5);
    gu2.Apply(gpu2.views, 5);
    for (size_t i = 0; i < w.size(); ++i) ExpectClose(cpu2.Weights(i), gpu2.Weights(i), "after the checkpoint");
  }
}

TEST(DeviceOps, ScaleGradientsOnDeviceViewsGivesTheHostBits) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<std::vector<float>> w = {std::vector<float>(1000), std::vector<float>(3)};
  std::vector<std::vector<float>> g = w;
  for (auto& t : g)
    for (auto& x : t) x = nd(rng);
  Params cpu(w, false), gpu(w, true);
  cpu.SetGrads(g);
  gpu.SetGrads(g);
  auto ops = MakeCudaDeviceOps(0);
  ScaleGradients(cpu.views, 0.7371, nullptr);
  ScaleGradients(gpu.views, 0.7371, ops.get());
  for (size_t i = 0; i < g.size(); ++i) {
    std::vector<float> got(g[i].size());
    CheckCuda(cudaMemcpy(got.data(), gpu.views[i].g, got.size() * 4, cudaMemcpyDeviceToHost), "test");
    EXPECT_EQ(0, memcmp(got.data(), cpu.grads[i].data(), got.size() * 4)) << cpu.views[i].name;
  }
  try {
    ScaleGradients(gpu.views, 0.5, nullptr);
    FAIL() << "scaled device memory without DeviceOps";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"fc.w\": it is in device memory"), std::string::npos) << e.what();
  }
}

// A raw CUDA event as the trainer's marker (the backend's own is private to it).
class EventFence : public DeviceFence {
 public:
  explicit EventFence(cudaStream_t s) {
    CheckCuda(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "test: event");
    CheckCuda(cudaEventRecord(e_, s), "test: record");
  }
  ~EventFence() override { cudaEventDestroy(e_); }
  void Wait() const override { CheckCuda(cudaEventSynchronize(e_), "test: wait"); }
  void* native() const override { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// The ordering GradReady relies on (common/device_fence.h): work queued on a non-blocking
// stream (as the backend's backward kernels) and marked by a fence is finished before a
// DeviceOps copy queued after After(fence) reads its memory, with no host wait between.
// Without After the copy runs at once and reads the zeros (the stream is kept busy for
// milliseconds by repeated 256 MB fills).
TEST(DeviceOps, AfterAFenceACopyReadsWhatTheMarkedStreamWrote) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  auto ops = MakeCudaDeviceOps(0);
  const int64_t n = int64_t(64) << 20;
  float* src = ops->Alloc(n);  // zeroed, finished
  float* dst = ops->Alloc(1024);
  cudaStream_t s = nullptr;
  CheckCuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "test: stream");
  for (int k = 0; k < 20; ++k) CheckCuda(cudaMemsetAsync(src, k % 2 ? 0 : 0x11, size_t(n) * 4, s), "test: fill");
  CheckCuda(cudaMemsetAsync(src, 0x3f, size_t(n) * 4, s), "test: fill");
  EventFence fence(s);
  ops->After(nullptr);  // no marker: nothing to wait for
  ops->After(&fence);
  ops->Copy(dst, src + n - 1024, 1024);
  std::vector<uint32_t> got(1024);
  CheckCuda(cudaMemcpy(got.data(), dst, got.size() * 4, cudaMemcpyDeviceToHost), "test");
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(0x3f3f3f3fu, got[i]) << "float " << i;
  CheckCuda(cudaStreamSynchronize(s), "test");
  cudaStreamDestroy(s);
  ops->Free(src);
  ops->Free(dst);
}

// The guard on device views: the CUDA finite check finds a NaN or inf anywhere (first,
// last, in the short tensor), and LocalUpdater then leaves the device weights and states
// bit-identical, counted as skipped.
TEST(DeviceOps, NonFiniteDeviceGradientsAreFoundAndTheStepSkipped) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  auto ops = MakeCudaDeviceOps(0);
  std::vector<std::vector<float>> w = {std::vector<float>(70001, 0.5f), std::vector<float>(3, -1.f)};
  std::vector<std::vector<float>> good = {std::vector<float>(70001, 0.25f), std::vector<float>(3, 0.125f)};
  Params gpu(w, true);
  gpu.SetGrads(good);
  EXPECT_TRUE(GradientsFinite(gpu.views, ops.get()));
  const float kInf = std::numeric_limits<float>::infinity(), kNaN = std::numeric_limits<float>::quiet_NaN();
  for (auto [t, i, v] : {std::tuple<size_t, size_t, float>{0, 0, kNaN}, {0, 70000, kInf}, {1, 2, -kInf}}) {
    auto bad = good;
    bad[t][i] = v;
    gpu.SetGrads(bad);
    EXPECT_FALSE(GradientsFinite(gpu.views, ops.get())) << t << "," << i;
  }
  LocalUpdater u(EnvFor("momentum", true));
  gpu.SetGrads(good);
  ASSERT_TRUE(u.Apply(gpu.views, 0));
  CheckpointState before;
  u.Save(gpu.views, "opt/", &before);
  std::vector<std::vector<float>> wb = {gpu.Weights(0), gpu.Weights(1)};
  auto bad = good;
  bad[1][1] = kNaN;
  gpu.SetGrads(bad);
  EXPECT_FALSE(u.Apply(gpu.views, 1));
  EXPECT_EQ(u.skipped(), 1);
  CheckpointState after;
  u.Save(gpu.views, "opt/", &after);
  EXPECT_EQ(after.entries, before.entries);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(gpu.Weights(i), wb[i]);
}

}  // namespace
}  // namespace shoal
