// CUDA (cuDNN/cuBLAS/own kernels) against a reference backend for every Backend operation,
// forward and backward, on random inputs. Built twice: against the CPU engine (oneDNN) when
// SHOAL_TEST_AGAINST_CPU_ENGINE is defined, else against the naive host reference in
// reference_backend.cc. Skips with the driver's reason where no CUDA device is present
// (cuda_device_test covers the no-device behaviour).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "common/cuda/platform.h"
#include "worker/engine/backend.h"

#ifndef SHOAL_TEST_AGAINST_CPU_ENGINE
#include "tests/engine_cuda/reference_backend.h"
#endif

namespace shoal {
namespace {

std::unique_ptr<Backend> MakeReference() {
#ifdef SHOAL_TEST_AGAINST_CPU_ENGINE
  return MakeCpuBackend(2);
#else
  return MakeHostReferenceBackend();
#endif
}

// The same logical tensor on both backends.
struct Pair {
  Tensor ref, gpu;
};

class CudaVsReference : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef SHOAL_TEST_HARNESS_ON_CPU
    // Harness self-test: the CPU engine stands in for the device, so these cases, their
    // tolerances and the reference are exercised on machines without a GPU.
    ref_ = MakeReference();
    gpu_ = MakeCpuBackend(2);
    cuda_ = false;
#else
    std::string why;
    if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    ref_ = MakeReference();
    gpu_ = MakeCudaBackend(0);
#endif
  }
  // Cases that exercise CUDA-only features (fp16/bf16 compute, exact error texts) open with
  // `if (!cuda_) GTEST_SKIP() << kCudaOnly;`.
  static constexpr const char* kCudaOnly = "CUDA-specific case; the harness self-test runs the CPU engine";

  Pair FromHost(const Shape& s, const std::vector<float>& v) {
    Pair p{ref_->Empty(s), gpu_->Empty(s)};
    ref_->CopyFromHost(p.ref, v.data());
    gpu_->CopyFromHost(p.gpu, v.data());
    return p;
  }
  Pair Random(const Shape& s, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(size_t(NumElements(s)));
    for (float& x : v) x = u(rng_);
    return FromHost(s, v);
  }
  Pair Empty(const Shape& s) {
    // Garbage-free outputs: a NaN fill would expose an op that leaves elements unwritten.
    return FromHost(s, std::vector<float>(size_t(NumElements(s)), std::nanf("")));
  }
  std::vector<float> Host(Backend& b, const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    b.CopyToHost(t, v.data());
    return v;
  }

  // |gpu - ref| <= rtol * (|ref| + max|ref|) elementwise: relative, with an absolute floor
  // scaled to the tensor so sums that cancel to ~0 do not fail on rounding order.
  void ExpectClose(const Pair& p, const std::string& what, double rtol = 1e-4) {
    ASSERT_EQ(p.ref.shape(), p.gpu.shape()) << what;
    Tensor g32 = p.gpu;
    if (p.gpu.dtype() != DType::kF32) {  // mixed-precision results: widen on the device
      g32 = gpu_->Empty(p.gpu.shape());
      gpu_->Copy(p.gpu, g32);
    }
    std::vector<float> c = Host(*ref_, p.ref), g = Host(*gpu_, g32);
    double scale = 0;
    for (float x : c) scale = std::max(scale, double(std::fabs(x)));
    int64_t bad = 0, first = -1;
    double worst = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      double err = std::fabs(double(g[i]) - double(c[i]));
      bool ok = err <= rtol * (std::fabs(double(c[i])) + scale) && !std::isnan(g[i]) && !std::isnan(c[i]);
      if (!ok && bad++ == 0) first = int64_t(i);
      worst = std::max(worst, err);
    }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << c.size() << " elements differ; first at " << first
                      << " ref=" << (first >= 0 ? c[first] : 0.f) << " cuda=" << (first >= 0 ? g[first] : 0.f)
                      << "; max |diff| " << worst << ", max |ref| " << scale;
  }

  // The same values, stored as `dt` on the device; the reference gets them already rounded to
  // dt so only the operation's own error is compared.
  Pair RandomAs(DType dt, const Shape& s, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(size_t(NumElements(s)));
    for (float& x : v) x = u(rng_);
    std::vector<uint16_t> narrow(v.size());
    EncodeFloats(v.data(), v.size(), dt, narrow.data());
    DecodeFloats(narrow.data(), v.size(), dt, v.data());
    Pair p = FromHost(s, v);
    Tensor g = gpu_->Empty(s, dt);
    gpu_->Copy(p.gpu, g);
    p.gpu = g;
    return p;
  }
  Pair EmptyAs(DType dt, const Shape& s) {
    Pair p = Empty(s);
    p.gpu = gpu_->Empty(s, dt);
    gpu_->Fill(p.gpu, std::nanf(""));
    return p;
  }

  std::mt19937 rng_{20261123};
  std::unique_ptr<Backend> ref_, gpu_;
  bool cuda_ = true;
};

struct ConvCase {
  int64_t n, c, h, w, o, k;
  int stride, pad;
  bool bias;
};

// The trainer's host mirrors: staging memory from AllocHost (pinned on CUDA), a whole
// model's copies queued in both directions, one Synchronize each way.
TEST_F(CudaVsReference, QueuedCopiesThroughStagingMemoryArriveAfterOneSynchronize) {
  const std::vector<Shape> shapes = {{64, 3, 3, 3}, {64}, {1000, 2048}, {7}};
  size_t floats = 0;
  for (auto& s : shapes) floats += size_t(NumElements(s));
  std::shared_ptr<void> staging = gpu_->AllocHost(floats * sizeof(float));
  ASSERT_NE(staging, nullptr);
  float* host = static_cast<float*>(staging.get());
  for (size_t i = 0; i < floats; ++i) host[i] = float(i % 977) * 0.5f - 100.f;
  std::vector<Tensor> dev;
  float* at = host;
  for (auto& s : shapes) {
    dev.push_back(gpu_->Empty(s));
    gpu_->CopyFromHostAsync(dev.back(), at);
    at += NumElements(s);
  }
  gpu_->Synchronize();
  std::vector<float> want(host, host + floats);
  std::fill(host, host + floats, std::nanf(""));
  at = host;
  for (auto& t : dev) {
    gpu_->Scale(2.f, t);
    gpu_->CopyToHostAsync(t, at);
    at += t.numel();
  }
  gpu_->Synchronize();
  for (size_t i = 0; i < floats; ++i) ASSERT_EQ(host[i], 2.f * want[i]) << "element " << i;
}

// RecordFence marks the work queued so far: waiting on the marker (not the stream) is
// enough for a queued copy to have arrived. The CPU engine gives no marker (done already).
TEST_F(CudaVsReference, AFenceMarksTheWorkQueuedBeforeIt) {
  const Shape s = {1000, 2048};
  const size_t floats = size_t(NumElements(s));
  std::shared_ptr<void> staging = gpu_->AllocHost(floats * sizeof(float));
  float* host = static_cast<float*>(staging.get());
  for (size_t i = 0; i < floats; ++i) host[i] = float(i % 977) - 400.f;
  Tensor t = gpu_->Empty(s);
  gpu_->CopyFromHostAsync(t, host);
  gpu_->Synchronize();
  std::vector<float> want(host, host + floats);
  std::fill(host, host + floats, std::nanf(""));
  gpu_->Scale(3.f, t);
  gpu_->CopyToHostAsync(t, host);
  std::shared_ptr<const DeviceFence> fence = gpu_->RecordFence();
  ASSERT_EQ(fence != nullptr, cuda_);
  if (fence) {
    ASSERT_NE(fence->native(), nullptr);
    fence->Wait();
  }
  for (size_t i = 0; i < floats; ++i) ASSERT_EQ(host[i], 3.f * want[i]) << "element " << i;
  gpu_->Synchronize();
}

TEST_F(CudaVsReference, ConvolutionForwardAndBackward) {
  const ConvCase cases[] = {{2, 3, 9, 9, 4, 3, 1, 1, true},
                            {3, 2, 12, 10, 5, 5, 2, 0, true},
                            {2, 4, 8, 8, 6, 1, 1, 0, false},
                            {2, 3, 7, 7, 4, 3, 2, 1, true}};
  for (const ConvCase& cc : cases) {
    const std::string tag =
        "conv k" + std::to_string(cc.k) + " s" + std::to_string(cc.stride) + " p" + std::to_string(cc.pad);
    const int64_t ho = (cc.h + 2 * cc.pad - cc.k) / cc.stride + 1;
    const int64_t wo = (cc.w + 2 * cc.pad - cc.k) / cc.stride + 1;
    ConvParams p;
    p.stride = cc.stride;
    p.pad = cc.pad;
    Pair x = Random({cc.n, cc.c, cc.h, cc.w});
    Pair w = Random({cc.o, cc.c, cc.k, cc.k}, -0.5f, 0.5f);
    Pair b = cc.bias ? Random({cc.o}) : Pair{};
    Pair y = Empty({cc.n, cc.o, ho, wo});
    ref_->ConvForward(x.ref, w.ref, b.ref, p, y.ref);
    gpu_->ConvForward(x.gpu, w.gpu, b.gpu, p, y.gpu);
    ExpectClose(y, tag + " y");

    // Parameter gradients start non-zero: both backends must accumulate into them.
    Pair dy = Random({cc.n, cc.o, ho, wo});
    Pair dx = Empty(x.ref.shape());
    Pair dw = Random(w.ref.shape());
    Pair db = Random({cc.o});
    ref_->ConvBackward(x.ref, w.ref, dy.ref, p, &dx.ref, dw.ref, cc.bias ? &db.ref : nullptr);
    gpu_->ConvBackward(x.gpu, w.gpu, dy.gpu, p, &dx.gpu, dw.gpu, cc.bias ? &db.gpu : nullptr);
    ExpectClose(dx, tag + " dx");
    ExpectClose(dw, tag + " dw");
    ExpectClose(db, tag + " db");
  }
}

TEST_F(CudaVsReference, ConvolutionBackwardWithoutInputGradient) {
  ConvParams p;
  p.pad = 1;
  Pair x = Random({2, 1, 6, 6});
  Pair w = Random({3, 1, 3, 3});
  Pair dy = Random({2, 3, 6, 6});
  Pair dw = Random({3, 1, 3, 3});
  ref_->ConvBackward(x.ref, w.ref, dy.ref, p, nullptr, dw.ref, nullptr);
  gpu_->ConvBackward(x.gpu, w.gpu, dy.gpu, p, nullptr, dw.gpu, nullptr);
  ExpectClose(dw, "first-layer dw");
}

// Synchronous algorithms promise bit-identical weights on every worker and after --resume:
// convolution backward (where cuDNN has atomics-based algorithms) must give the same bits on
// every run, in every compute type. Shapes large enough that cuDNN's heuristics rank
// non-deterministic algorithms first for some of them.
TEST_F(CudaVsReference, ConvolutionBackwardGivesTheSameBitsEveryRun) {
  std::vector<DType> types = {DType::kF32};
  if (cuda_) types = {DType::kF32, DType::kF16, DType::kBF16};
  const ConvCase cases[] = {{32, 64, 28, 28, 64, 3, 1, 1, true}, {64, 128, 14, 14, 256, 1, 2, 0, false}};
  for (DType dt : types) {
    std::unique_ptr<Backend> owned = cuda_ ? MakeCudaBackend(0, dt) : nullptr;
    Backend* be = cuda_ ? owned.get() : gpu_.get();
    for (const ConvCase& cc : cases) {
      const std::string tag = std::string(DTypeName(dt)) + " conv k" + std::to_string(cc.k) + " c" +
                              std::to_string(cc.c) + " o" + std::to_string(cc.o);
      const int64_t ho = (cc.h + 2 * cc.pad - cc.k) / cc.stride + 1;
      const int64_t wo = (cc.w + 2 * cc.pad - cc.k) / cc.stride + 1;
      ConvParams p;
      p.stride = cc.stride;
      p.pad = cc.pad;
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      auto filled = [&](const Shape& s) {
        std::vector<float> v(size_t(NumElements(s)));
        for (float& e : v) e = u(rng_);
        Tensor t = be->Empty(s);
        be->CopyFromHost(t, v.data());
        return t;
      };
      Tensor x = filled({cc.n, cc.c, cc.h, cc.w}), w = filled({cc.o, cc.c, cc.k, cc.k}),
             dy = filled({cc.n, cc.o, ho, wo});
      std::vector<float> first_dx, first_dw, first_db;
      for (int run = 0; run < 3; ++run) {
        Tensor dx = be->Empty(x.shape()), dw = be->Empty(w.shape()), db = be->Empty({cc.o});
        be->Fill(dw, 0.f);
        be->Fill(db, 0.f);
        be->ConvBackward(x, w, dy, p, &dx, dw, cc.bias ? &db : nullptr);
        std::vector<float> hdx = Host(*be, dx), hdw = Host(*be, dw), hdb = Host(*be, db);
        if (run == 0) {
          first_dx = hdx, first_dw = hdw, first_db = hdb;
          continue;
        }
        EXPECT_EQ(0, memcmp(hdx.data(), first_dx.data(), hdx.size() * 4)) << tag << " dx differs on run " << run;
        EXPECT_EQ(0, memcmp(hdw.data(), first_dw.data(), hdw.size() * 4)) << tag << " dw differs on run " << run;
        EXPECT_EQ(0, memcmp(hdb.data(), first_db.data(), hdb.size() * 4)) << tag << " db differs on run " << run;
      }
    }
  }
}
TEST_F(CudaVsReference, BatchNormSpatial) {
  const int64_t c = 5;
  Pair x = Random({4, c, 6, 6}, -1.f, 3.f);
  Pair gamma = Random({c}, 0.5f, 1.5f), beta = Random({c});
  Pair rmean = Random({c}), rvar = Random({c}, 0.5f, 1.5f);
  Pair smean = Empty({c}), sinv = Empty({c}), y = Empty(x.ref.shape());
  ref_->BatchNormForwardTrain(x.ref, gamma.ref, beta.ref, 1e-5f, 0.1f, rmean.ref, rvar.ref, smean.ref, sinv.ref, y.ref);
  gpu_->BatchNormForwardTrain(x.gpu, gamma.gpu, beta.gpu, 1e-5f, 0.1f, rmean.gpu, rvar.gpu, smean.gpu, sinv.gpu, y.gpu);
  ExpectClose(y, "bn y");
  ExpectClose(rmean, "bn running_mean");
  ExpectClose(rvar, "bn running_var (unbiased)");
  ExpectClose(smean, "bn save_mean");
  ExpectClose(sinv, "bn save_invstd");

  Pair dy = Random(x.ref.shape());
  Pair dx = Empty(x.ref.shape());
  Pair dgamma = Random({c}), dbeta = Random({c});
  ref_->BatchNormBackward(x.ref, dy.ref, gamma.ref, smean.ref, sinv.ref, 1e-5f, dx.ref, dgamma.ref, dbeta.ref);
  gpu_->BatchNormBackward(x.gpu, dy.gpu, gamma.gpu, smean.gpu, sinv.gpu, 1e-5f, dx.gpu, dgamma.gpu, dbeta.gpu);
  ExpectClose(dx, "bn dx");
  ExpectClose(dgamma, "bn dgamma");
  ExpectClose(dbeta, "bn dbeta");

  Pair yi = Empty(x.ref.shape());
  ref_->BatchNormForwardInference(x.ref, gamma.ref, beta.ref, rmean.ref, rvar.ref, 1e-5f, yi.ref);
  gpu_->BatchNormForwardInference(x.gpu, gamma.gpu, beta.gpu, rmean.gpu, rvar.gpu, 1e-5f, yi.gpu);
  ExpectClose(yi, "bn inference y");
}

TEST_F(CudaVsReference, BatchNormOverFeatures) {
  const int64_t c = 7;
  Pair x = Random({8, c}, -2.f, 2.f);
  Pair gamma = Random({c}, 0.5f, 1.5f), beta = Random({c});
  Pair rmean = Random({c}), rvar = Random({c}, 0.5f, 1.5f);
  Pair smean = Empty({c}), sinv = Empty({c}), y = Empty(x.ref.shape());
  ref_->BatchNormForwardTrain(x.ref, gamma.ref, beta.ref, 1e-3f, 0.25f, rmean.ref, rvar.ref, smean.ref, sinv.ref,
                              y.ref);
  gpu_->BatchNormForwardTrain(x.gpu, gamma.gpu, beta.gpu, 1e-3f, 0.25f, rmean.gpu, rvar.gpu, smean.gpu, sinv.gpu,
                              y.gpu);
  ExpectClose(y, "bn2d y");
  ExpectClose(rmean, "bn2d running_mean");
  ExpectClose(rvar, "bn2d running_var");
  ExpectClose(sinv, "bn2d save_invstd");
  Pair dy = Random(x.ref.shape()), dx = Empty(x.ref.shape());
  Pair dgamma = Random({c}), dbeta = Random({c});
  ref_->BatchNormBackward(x.ref, dy.ref, gamma.ref, smean.ref, sinv.ref, 1e-5f, dx.ref, dgamma.ref, dbeta.ref);
  gpu_->BatchNormBackward(x.gpu, dy.gpu, gamma.gpu, smean.gpu, sinv.gpu, 1e-5f, dx.gpu, dgamma.gpu, dbeta.gpu);
  ExpectClose(dx, "bn2d dx");
  ExpectClose(dgamma, "bn2d dgamma");
  ExpectClose(dbeta, "bn2d dbeta");
}

// A large epsilon over a small variance: should cuDNN's backward re-derive 1/sqrt(var + eps)
// instead of using save_invstd, an epsilon other than the forward's puts dx off by a factor
// of several, not by rounding.
TEST_F(CudaVsReference, BatchNormBackwardKeepsTheForwardsEpsilon) {
  const int64_t c = 3;
  Pair x = Random({4, c, 5, 5}, -0.05f, 0.05f);
  Pair gamma = Random({c}, 0.5f, 1.5f), beta = Random({c});
  Pair rmean = Random({c}), rvar = Random({c}, 0.5f, 1.5f);
  Pair smean = Empty({c}), sinv = Empty({c}), y = Empty(x.ref.shape());
  ref_->BatchNormForwardTrain(x.ref, gamma.ref, beta.ref, 0.5f, 0.1f, rmean.ref, rvar.ref, smean.ref, sinv.ref, y.ref);
  gpu_->BatchNormForwardTrain(x.gpu, gamma.gpu, beta.gpu, 0.5f, 0.1f, rmean.gpu, rvar.gpu, smean.gpu, sinv.gpu, y.gpu);
  ExpectClose(y, "bn eps 0.5 y");
  ExpectClose(sinv, "bn eps 0.5 save_invstd");
  Pair dy = Random(x.ref.shape()), dx = Empty(x.ref.shape());
  Pair dgamma = Random({c}), dbeta = Random({c});
  ref_->BatchNormBackward(x.ref, dy.ref, gamma.ref, smean.ref, sinv.ref, 0.5f, dx.ref, dgamma.ref, dbeta.ref);
  gpu_->BatchNormBackward(x.gpu, dy.gpu, gamma.gpu, smean.gpu, sinv.gpu, 0.5f, dx.gpu, dgamma.gpu, dbeta.gpu);
  ExpectClose(dx, "bn eps 0.5 dx");
  ExpectClose(dgamma, "bn eps 0.5 dgamma");
  ExpectClose(dbeta, "bn eps 0.5 dbeta");
}

TEST_F(CudaVsReference, ReluAddAxpyScale) {
  const Shape s{3, 4, 5, 6};
  Pair x = Random(s), y = Empty(s);
  ref_->ReluForward(x.ref, y.ref);
  gpu_->ReluForward(x.gpu, y.gpu);
  ExpectClose(y, "relu y", 0);
  Pair dy = Random(s), dx = Empty(s);
  ref_->ReluBackward(y.ref, dy.ref, dx.ref);
  gpu_->ReluBackward(y.gpu, dy.gpu, dx.gpu);
  ExpectClose(dx, "relu dx", 0);

  Pair a = Random(s), b = Random(s), sum = Empty(s);
  ref_->Add(a.ref, b.ref, sum.ref);
  gpu_->Add(a.gpu, b.gpu, sum.gpu);
  ExpectClose(sum, "add");
  ref_->Axpy(-0.75f, a.ref, b.ref);
  gpu_->Axpy(-0.75f, a.gpu, b.gpu);
  ExpectClose(b, "axpy");
  ref_->Scale(1.5f, a.ref);
  gpu_->Scale(1.5f, a.gpu);
  ExpectClose(a, "scale");
}

TEST_F(CudaVsReference, MaxPool) {
  struct Case {
    Shape x;
    int k, s, p;
  };
  const Case cases[] = {{{2, 3, 8, 8}, 2, 2, 0}, {{2, 3, 9, 9}, 3, 2, 1}, {{1, 2, 7, 5}, 3, 1, 1}};
  for (const Case& c : cases) {
    PoolParams p;
    p.kernel = c.k;
    p.stride = c.s;
    p.pad = c.p;
    const std::string tag = "maxpool k" + std::to_string(c.k) + " s" + std::to_string(c.s) + " p" + std::to_string(c.p);
    const int64_t ho = (c.x[2] + 2 * c.p - c.k) / c.s + 1, wo = (c.x[3] + 2 * c.p - c.k) / c.s + 1;
    Pair x = Random(c.x), y = Empty({c.x[0], c.x[1], ho, wo});
    Tensor ws_ref, ws_gpu;
    ref_->MaxPoolForward(x.ref, p, y.ref, ws_ref);
    gpu_->MaxPoolForward(x.gpu, p, y.gpu, ws_gpu);
    ExpectClose(y, tag + " y", 0);
    Pair dy = Random(y.ref.shape()), dx = Empty(c.x);
    ref_->MaxPoolBackward(x.ref, y.ref, dy.ref, p, ws_ref, dx.ref);
    gpu_->MaxPoolBackward(x.gpu, y.gpu, dy.gpu, p, ws_gpu, dx.gpu);
    ExpectClose(dx, tag + " dx");
  }
}

TEST_F(CudaVsReference, GlobalAvgPool) {
  Pair x = Random({3, 4, 5, 5}), y = Empty({3, 4});
  ref_->GlobalAvgPoolForward(x.ref, y.ref);
  gpu_->GlobalAvgPoolForward(x.gpu, y.gpu);
  ExpectClose(y, "avgpool y");
  Pair dy = Random({3, 4}), dx = Empty({3, 4, 5, 5});
  ref_->GlobalAvgPoolBackward(dy.ref, dx.ref);
  gpu_->GlobalAvgPoolBackward(dy.gpu, dx.gpu);
  ExpectClose(dx, "avgpool dx");
}

TEST_F(CudaVsReference, Linear) {
  for (bool bias : {true, false}) {
    const std::string tag = bias ? "linear" : "linear (no bias)";
    Pair x = Random({5, 7}), w = Random({3, 7}), b = bias ? Random({3}) : Pair{};
    Pair y = Empty({5, 3});
    ref_->LinearForward(x.ref, w.ref, b.ref, y.ref);
    gpu_->LinearForward(x.gpu, w.gpu, b.gpu, y.gpu);
    ExpectClose(y, tag + " y");
    Pair dy = Random({5, 3}), dx = Empty({5, 7}), dw = Random({3, 7}), db = Random({3});
    ref_->LinearBackward(x.ref, w.ref, dy.ref, &dx.ref, dw.ref, bias ? &db.ref : nullptr);
    gpu_->LinearBackward(x.gpu, w.gpu, dy.gpu, &dx.gpu, dw.gpu, bias ? &db.gpu : nullptr);
    ExpectClose(dx, tag + " dx");
    ExpectClose(dw, tag + " dw");
    ExpectClose(db, tag + " db");
  }
}

TEST_F(CudaVsReference, SoftmaxCrossEntropyWithLabelSmoothing) {
  const int64_t n = 9, k = 10;
  std::vector<int32_t> labels(n);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(k) - 1);
  for (auto& l : labels) l = pick(rng_);
  for (float eps : {0.f, 0.1f}) {
    Pair logits = Random({n, k}, -3.f, 3.f), d = Empty({n, k});
    int64_t hits_ref = -1, hits_gpu = -1;
    float loss_ref = ref_->SoftmaxCrossEntropy(logits.ref, labels.data(), eps, &d.ref, &hits_ref);
    float loss_gpu = gpu_->SoftmaxCrossEntropy(logits.gpu, labels.data(), eps, &d.gpu, &hits_gpu);
    EXPECT_NEAR(loss_gpu, loss_ref, 1e-5 * std::fabs(loss_ref) + 1e-6) << "eps " << eps;
    EXPECT_EQ(hits_gpu, hits_ref) << "eps " << eps;
    ExpectClose(d, "dlogits eps " + std::to_string(eps));
  }
}

TEST_F(CudaVsReference, SumSquares) {
  Pair x = Random({1000, 3});
  double c = ref_->SumSquares(x.ref), g = gpu_->SumSquares(x.gpu);
  EXPECT_NEAR(g, c, 1e-6 * c);
}

// fp16 / bf16 activations (fp32 accumulation) against the fp32 reference on the same
// rounded inputs; the tolerance covers rounding of the outputs to the narrow type.
class CudaMixedPrecision : public CudaVsReference, public ::testing::WithParamInterface<DType> {
 protected:
  double Tol() const { return GetParam() == DType::kF16 ? 5e-3 : 3e-2; }
};

TEST_P(CudaMixedPrecision, LayerOps) {
  if (!cuda_) GTEST_SKIP() << kCudaOnly;
  const DType dt = GetParam();
  const std::string tag = DTypeName(dt);
  ConvParams cp;
  cp.pad = 1;
  Pair x = RandomAs(dt, {2, 8, 6, 6}), w = RandomAs(dt, {8, 8, 3, 3}, -0.3f, 0.3f);
  Pair b = RandomAs(dt, {8}), y = EmptyAs(dt, {2, 8, 6, 6});
  ref_->ConvForward(x.ref, w.ref, b.ref, cp, y.ref);
  gpu_->ConvForward(x.gpu, w.gpu, b.gpu, cp, y.gpu);
  ExpectClose(y, tag + " conv y", Tol());
  Pair dy = RandomAs(dt, y.ref.shape()), dx = EmptyAs(dt, x.ref.shape());
  Pair dw = RandomAs(dt, w.ref.shape()), db = RandomAs(dt, {8});
  ref_->ConvBackward(x.ref, w.ref, dy.ref, cp, &dx.ref, dw.ref, &db.ref);
  gpu_->ConvBackward(x.gpu, w.gpu, dy.gpu, cp, &dx.gpu, dw.gpu, &db.gpu);
  ExpectClose(dx, tag + " conv dx", Tol());
  ExpectClose(dw, tag + " conv dw", Tol());
  ExpectClose(db, tag + " conv db", Tol());

  // Batch norm: narrow activations, fp32 parameters and statistics.
  Pair gamma = Random({8}, 0.5f, 1.5f), beta = Random({8}), rm = Random({8});
  Pair rv = Random({8}, 0.5f, 1.5f), sm = Empty({8}), si = Empty({8});
  Pair bn = EmptyAs(dt, x.ref.shape());
  ref_->BatchNormForwardTrain(x.ref, gamma.ref, beta.ref, 1e-5f, 0.1f, rm.ref, rv.ref, sm.ref, si.ref, bn.ref);
  gpu_->BatchNormForwardTrain(x.gpu, gamma.gpu, beta.gpu, 1e-5f, 0.1f, rm.gpu, rv.gpu, sm.gpu, si.gpu, bn.gpu);
  ExpectClose(bn, tag + " bn y", Tol());
  ExpectClose(rv, tag + " bn running_var", 1e-4);
  ExpectClose(si, tag + " bn save_invstd", 1e-4);
  Pair bdx = EmptyAs(dt, x.ref.shape()), dg = Random({8}), dbe = Random({8});
  ref_->BatchNormBackward(x.ref, dy.ref, gamma.ref, sm.ref, si.ref, 1e-5f, bdx.ref, dg.ref, dbe.ref);
  gpu_->BatchNormBackward(x.gpu, dy.gpu, gamma.gpu, sm.gpu, si.gpu, 1e-5f, bdx.gpu, dg.gpu, dbe.gpu);
  ExpectClose(bdx, tag + " bn dx", Tol());
  ExpectClose(dg, tag + " bn dgamma", 1e-3);
  ExpectClose(dbe, tag + " bn dbeta", 1e-3);

  Pair r = EmptyAs(dt, x.ref.shape()), rdx = EmptyAs(dt, x.ref.shape());
  ref_->ReluForward(x.ref, r.ref);
  gpu_->ReluForward(x.gpu, r.gpu);
  ExpectClose(r, tag + " relu y", 0);
  ref_->ReluBackward(r.ref, dy.ref, rdx.ref);
  gpu_->ReluBackward(r.gpu, dy.gpu, rdx.gpu);
  ExpectClose(rdx, tag + " relu dx", 0);

  PoolParams pp;
  Pair mp = EmptyAs(dt, {2, 8, 3, 3}), mdy = RandomAs(dt, {2, 8, 3, 3}), mdx = EmptyAs(dt, x.ref.shape());
  Tensor ws_ref, ws_gpu;
  ref_->MaxPoolForward(x.ref, pp, mp.ref, ws_ref);
  gpu_->MaxPoolForward(x.gpu, pp, mp.gpu, ws_gpu);
  ExpectClose(mp, tag + " maxpool y", 0);
  ref_->MaxPoolBackward(x.ref, mp.ref, mdy.ref, pp, ws_ref, mdx.ref);
  gpu_->MaxPoolBackward(x.gpu, mp.gpu, mdy.gpu, pp, ws_gpu, mdx.gpu);
  ExpectClose(mdx, tag + " maxpool dx", 0);

  Pair ap = EmptyAs(dt, {2, 8}), ady = RandomAs(dt, {2, 8}), adx = EmptyAs(dt, x.ref.shape());
  ref_->GlobalAvgPoolForward(x.ref, ap.ref);
  gpu_->GlobalAvgPoolForward(x.gpu, ap.gpu);
  ExpectClose(ap, tag + " avgpool y", Tol());
  ref_->GlobalAvgPoolBackward(ady.ref, adx.ref);
  gpu_->GlobalAvgPoolBackward(ady.gpu, adx.gpu);
  ExpectClose(adx, tag + " avgpool dx", Tol());

  Pair a = RandomAs(dt, {16, 32}), lw = RandomAs(dt, {24, 32}), lb = RandomAs(dt, {24});
  Pair ly = EmptyAs(dt, {16, 24});
  ref_->LinearForward(a.ref, lw.ref, lb.ref, ly.ref);
  gpu_->LinearForward(a.gpu, lw.gpu, lb.gpu, ly.gpu);
  ExpectClose(ly, tag + " linear y", Tol());
  Pair ldy = RandomAs(dt, {16, 24}), ldx = EmptyAs(dt, {16, 32});
  Pair ldw = RandomAs(dt, {24, 32}), ldb = RandomAs(dt, {24});
  ref_->LinearBackward(a.ref, lw.ref, ldy.ref, &ldx.ref, ldw.ref, &ldb.ref);
  gpu_->LinearBackward(a.gpu, lw.gpu, ldy.gpu, &ldx.gpu, ldw.gpu, &ldb.gpu);
  ExpectClose(ldx, tag + " linear dx", Tol());
  ExpectClose(ldw, tag + " linear dw", Tol());
  ExpectClose(ldb, tag + " linear db", Tol());

  Pair sum = EmptyAs(dt, a.ref.shape()), a2 = RandomAs(dt, a.ref.shape());
  ref_->Add(a.ref, a2.ref, sum.ref);
  gpu_->Add(a.gpu, a2.gpu, sum.gpu);
  ExpectClose(sum, tag + " add", Tol());
}

INSTANTIATE_TEST_SUITE_P(Narrow, CudaMixedPrecision, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(DTypeName(i.param)); });

// CUDA-only checks against host arithmetic.
TEST_F(CudaVsReference, FillAndDtypeConversionMatchHost) {
  if (!cuda_) GTEST_SKIP() << kCudaOnly;
  const int64_t n = 1000;
  std::vector<float> v(n);
  std::uniform_real_distribution<float> u(-100.f, 100.f);
  for (float& x : v) x = u(rng_);
  Tensor src = gpu_->Empty({n});
  gpu_->CopyFromHost(src, v.data());
  for (DType t : {DType::kF16, DType::kBF16}) {
    Tensor half = gpu_->Empty({n}, t), back = gpu_->Empty({n});
    gpu_->Copy(src, half);
    gpu_->Copy(half, back);
    std::vector<uint16_t> got(n), want(n);
    gpu_->CopyToHost(half, got.data());
    EncodeFloats(v.data(), size_t(n), t, want.data());
    EXPECT_EQ(got, want) << DTypeName(t) << " rounding differs from the host's";
    std::vector<float> round_trip(n), host_back(n);
    gpu_->CopyToHost(back, round_trip.data());
    DecodeFloats(want.data(), size_t(n), t, host_back.data());
    EXPECT_EQ(round_trip, host_back) << DTypeName(t);

    gpu_->Fill(half, 0.1f);
    std::vector<uint16_t> filled(n);
    gpu_->CopyToHost(half, filled.data());
    uint16_t want_fill = t == DType::kF16 ? FloatToHalf(0.1f) : FloatToBf16(0.1f);
    EXPECT_EQ(filled, std::vector<uint16_t>(n, want_fill)) << DTypeName(t);
  }
  gpu_->Fill(src, -2.5f);
  std::vector<float> f(n);
  gpu_->CopyToHost(src, f.data());
  EXPECT_EQ(f, std::vector<float>(n, -2.5f));
}

TEST_F(CudaVsReference, BadInputGetsAnErrorNotACrash) {
  if (!cuda_) GTEST_SKIP() << kCudaOnly;
  Tensor x = gpu_->Empty({2, 3, 8, 8}), w = gpu_->Empty({4, 2, 3, 3}), y = gpu_->Empty({2, 4, 8, 8});
  try {
    gpu_->ConvForward(x, w, Tensor(), ConvParams{}, y);
    FAIL() << "channel mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ConvForward"), std::string::npos) << e.what();
  }
  Tensor logits = gpu_->Empty({2, 3});
  gpu_->Fill(logits, 0.f);
  const int32_t labels[] = {1, 3};
  try {
    gpu_->SoftmaxCrossEntropy(logits, labels, 0.f, nullptr, nullptr);
    FAIL() << "label 3 of 3 classes accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label[1] = 3"), std::string::npos) << e.what();
  }
  Tensor host_side = ref_->Empty({2, 3});
  EXPECT_THROW(gpu_->Scale(2.f, host_side), Error);
}

}  // namespace
}  // namespace shoal
