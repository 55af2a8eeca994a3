// One whole training step of the zoo's lenet and resnet20 on the CUDA backend against the CPU
// engine from the same weights and batch: the loss, every parameter gradient and the batch-norm
// running statistics; and the elementwise kernels past one grid dimension (more than
// 65535 x 256 elements). Skips where no CUDA device is present; the harness build
// (SHOAL_TEST_HARNESS_ON_CPU) runs the same cases with the CPU engine in the device's place, so
// a failure on a GPU is the GPU's.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/platform.h"
#include "common/dtype.h"
#include "worker/engine/backend.h"
#include "worker/engine/models/builder.h"

namespace shoal {
namespace {

std::unique_ptr<Backend> DeviceBackend(DType compute, std::string* skip) {
#ifdef SHOAL_TEST_HARNESS_ON_CPU
  if (compute != DType::kF32) *skip = "CUDA-specific case; the harness self-test runs the CPU engine";
  return compute == DType::kF32 ? MakeCpuBackend(2) : nullptr;
#else
  std::string why;
  if (CudaDeviceCount(&why) == 0) {
    *skip = "no CUDA device: " + why;
    return nullptr;
  }
  return MakeCudaBackend(0, compute);
#endif
}

// ||a - b|| / ||b||, the measure a whole gradient tensor is compared by (per-element
// tolerances fail on the cancellation-heavy sums of a convolution's weight gradient).
double RelativeL2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct StepCase {
  const char* model;
  Shape input;
  int64_t batch;
  DType compute;
  double tolerance;  // the loss's relative error; fp32: also every gradient's and statistic's relative L2
};

// The narrow type's rounding, applied to every value.
std::vector<float> Rounded(std::vector<float> v, DType t) {
  for (float& f : v) f = t == DType::kBF16 ? Bf16ToFloat(FloatToBf16(f)) : HalfToFloat(FloatToHalf(f));
  return v;
}

class CudaTrainStep : public ::testing::TestWithParam<StepCase> {};

TEST_P(CudaTrainStep, LossGradientsAndRunningStatisticsMatchTheCpuEngine) {
  const StepCase c = GetParam();
  std::string skip;
  std::unique_ptr<Backend> dev = DeviceBackend(c.compute, &skip);
  if (!dev) GTEST_SKIP() << skip;
  std::unique_ptr<Backend> cpu = MakeCpuBackend(2);
  ModelOptions mo;
  mo.input_shape = c.input;
  mo.num_classes = 10;
  std::unique_ptr<Model> ref = MakeModel(c.model, *cpu, mo), got = MakeModel(c.model, *dev, mo);
  ref->InitParameters(7);
  std::vector<float> w(size_t(ref->NumParams()));
  ref->CopyParamsToHost(w.data());
  got->CopyParamsFromHost(w.data());
  ASSERT_EQ(ref->buffers().size(), got->buffers().size());
  for (size_t i = 0; i < ref->buffers().size(); ++i) {  // the fresh statistics, on both sides alike
    std::vector<float> b(size_t(ref->buffers()[i].value.numel()));
    cpu->CopyToHost(ref->buffers()[i].value, b.data());
    dev->CopyFromHost(got->buffers()[i].value, b.data());
  }

  Shape xs = {c.batch};
  xs.insert(xs.end(), c.input.begin(), c.input.end());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(size_t(NumElements(xs)));
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> labels(size_t(c.batch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t(i % 10);
  Tensor xr = cpu->Empty(xs), xg = dev->Empty(xs);
  cpu->CopyFromHost(xr, x.data());
  dev->CopyFromHost(xg, x.data());

  ref->ZeroGrad();
  got->ZeroGrad();
  const StepResult r = ref->TrainStep(xr, labels.data());
  const StepResult g = got->TrainStep(xg, labels.data());
  dev->Synchronize();
  EXPECT_NEAR(g.loss, r.loss, c.tolerance * std::fabs(r.loss)) << c.model;
  EXPECT_EQ(g.correct, r.correct) << c.model;

  std::vector<float> gr(w.size()), gg(w.size());
  ref->CopyGradsToHost(gr.data());
  got->CopyGradsToHost(gg.data());
  // A narrow compute type rounds the inputs of every convolution and product, forward and
  // backward; at initialisation on random data the gradients are sums with much cancellation,
  // so that alone moves them by 5-15% (lenet) and up to 70% (resnet20's batch-norm scales at
  // batch 8), as PyTorch with the same rounding shows. The bound per tensor is therefore its
  // measured sensitivity: the exact fp32 step from weights and input rounded to the narrow type
  // moves that gradient by s, and the narrow engine may move it by at most 6 s + 0.02 (PyTorch's
  // emulation of bf16 compute gave at most 3.7 s over 12 seeds of lenet). A wrong layout, a stale
  // buffer or a missing term moves a gradient by about 1: caught where s is small (lenet, resnet20's
  // last layers); resnet20's batch-norm parameters at batch 8 are too sensitive to tell (s ~ 0.35).
  std::vector<float> gs;
  if (c.compute != DType::kF32) {
    std::unique_ptr<Model> moved = MakeModel(c.model, *cpu, mo);
    const std::vector<float> wr = Rounded(w, c.compute), xq = Rounded(x, c.compute);
    moved->CopyParamsFromHost(wr.data());
    Tensor xm = cpu->Empty(xs);
    cpu->CopyFromHost(xm, xq.data());
    moved->ZeroGrad();
    moved->TrainStep(xm, labels.data());
    gs.resize(w.size());
    moved->CopyGradsToHost(gs.data());
  }
  for (const ParamInfo& p : ref->ParamLayout()) {
    const double bound =
        gs.empty() ? c.tolerance : 6 * RelativeL2(gs.data() + p.offset, gr.data() + p.offset, p.numel) + 0.02;
    EXPECT_LE(RelativeL2(gg.data() + p.offset, gr.data() + p.offset, p.numel), bound)
        << c.model << " " << DTypeName(c.compute) << ": gradient of " << p.name;
  }
  for (size_t i = 0; i < ref->buffers().size(); ++i) {
    const int64_t n = ref->buffers()[i].value.numel();
    std::vector<float> br(static_cast<size_t>(n)), bg(static_cast<size_t>(n));
    cpu->CopyToHost(ref->buffers()[i].value, br.data());
    dev->CopyToHost(got->buffers()[i].value, bg.data());
    EXPECT_LE(RelativeL2(bg.data(), br.data(), n), c.tolerance) << c.model << ": " << ref->buffers()[i].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, CudaTrainStep,
                         ::testing::Values(StepCase{"lenet", {1, 28, 28}, 16, DType::kF32, 1e-4},
                                           StepCase{"resnet20", {3, 32, 32}, 8, DType::kF32, 1e-4},
                                           // bf16 convolutions and products against fp32: bf16's 8-bit mantissa
                                           StepCase{"lenet", {1, 28, 28}, 16, DType::kBF16, 3e-2},
                                           StepCase{"resnet20", {3, 32, 32}, 8, DType::kBF16, 5e-2}),
                         [](const auto& info) {
                           return std::string(info.param.model) + "_" + DTypeName(info.param.compute);
                         });

// CUDA grids hold at most 65535 blocks in y and z: an element count above 65535 x 256 must
// still reach every element (a kernel that sized its grid in one such dimension would leave
// the tail unwritten or fail to launch).
TEST(CudaElementwise, CountsBeyondOneGridDimensionReachEveryElement) {
  std::string skip;
  std::unique_ptr<Backend> dev = DeviceBackend(DType::kF32, &skip);
  if (!dev) GTEST_SKIP() << skip;
  const int64_t n = 65535LL * 256 * 2 + 777;
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    a[size_t(i)] = float((i % 2001) - 1000) / 100.f;
    b[size_t(i)] = float(i % 7);
  }
  Tensor ta = dev->Empty({n}), tb = dev->Empty({n}), ty = dev->Empty({n});
  dev->CopyFromHost(ta, a.data());
  dev->CopyFromHost(tb, b.data());
  std::vector<float> y(static_cast<size_t>(n));
  auto expect_all = [&](const char* op, auto want) {
    dev->CopyToHost(ty, y.data());
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; ++i)
      if (y[size_t(i)] != want(i) && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0) << op << ": " << bad << " of " << n << " wrong, first at " << first;
  };
  dev->ReluForward(ta, ty);
  expect_all("ReluForward", [&](int64_t i) { return std::max(a[size_t(i)], 0.f); });
  dev->Add(ta, tb, ty);
  expect_all("Add", [&](int64_t i) { return a[size_t(i)] + b[size_t(i)]; });
  dev->Copy(tb, ty);
  dev->Axpy(2.f, ta, ty);
  expect_all("Axpy", [&](int64_t i) { return b[size_t(i)] + 2.f * a[size_t(i)]; });
  dev->Scale(0.5f, ty);
  expect_all("Scale", [&](int64_t i) { return 0.5f * (b[size_t(i)] + 2.f * a[size_t(i)]); });
  dev->Fill(ty, 3.f);
  expect_all("Fill", [](int64_t) { return 3.f; });
}

}  // namespace
}  // namespace shoal
