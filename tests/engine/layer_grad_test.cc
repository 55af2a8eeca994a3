// Every layer's backward against central finite differences (CPU, fp32).
#include <gtest/gtest.h>

#include <memory>

#include "tests/engine/grad_check.h"
#include "worker/engine/layers/add.h"
#include "worker/engine/layers/batch_norm.h"
#include "worker/engine/layers/conv2d.h"
#include "worker/engine/layers/flatten.h"
#include "worker/engine/layers/global_avg_pool.h"
#include "worker/engine/layers/linear.h"
#include "worker/engine/layers/max_pool.h"
#include "worker/engine/layers/relu.h"
#include "worker/engine/layers/softmax_cross_entropy.h"

namespace shoal {
namespace {

using namespace testing_util;

constexpr double kTol = 2e-3;

class LayerGrad : public ::testing::Test {
 protected:
  void SetUp() override { be_ = MakeCpuBackend(1); }

  // Checks dL/dx for every input and dL/dp for every parameter of `layer`.
  GradCheckResult Check(Layer& layer, std::vector<Tensor> inputs, double h = 1e-2, bool train = true) {
    std::mt19937_64 rng(7);
    layer.InitParameters(rng);
    for (Parameter& p : layer.params()) {  // make parameters generic, not 1/0
      Tensor r = Random(*be_, p.value.shape(), rng, 0.5f, 1.5f);
      be_->Copy(r, p.value);
      be_->Fill(p.grad, 0.0f);
    }
    std::vector<const Tensor*> in;
    for (Tensor& t : inputs) in.push_back(&t);
    const Tensor& y0 = layer.Forward(in, train);
    std::vector<float> r = Host(*be_, Random(*be_, y0.shape(), rng));
    Tensor dy = be_->Empty(y0.shape());
    be_->CopyFromHost(dy, r.data());
    std::vector<Tensor> dx(inputs.size());
    layer.Backward(in, dy, true, dx);
    std::vector<std::vector<float>> dxh;
    for (Tensor& d : dx) dxh.push_back(Host(*be_, d));  // before forwards reuse buffers
    std::vector<std::vector<float>> dph;
    for (Parameter& p : layer.params()) dph.push_back(Host(*be_, p.grad));

    auto loss = [&] { return Dot(*be_, layer.Forward(in, train), r); };
    GradCheckResult res;
    for (size_t i = 0; i < inputs.size(); ++i)
      Probe(*be_, inputs[i], dxh[i], loss, "dx" + std::to_string(i), h, 200, &res);
    for (size_t i = 0; i < layer.params().size(); ++i)
      Probe(*be_, layer.params()[i].value, dph[i], loss, layer.params()[i].name, h, 200, &res);
    return res;
  }

  Tensor In(const Shape& s, uint64_t seed, float lo = -1, float hi = 1) {
    std::mt19937_64 rng(seed);
    return Random(*be_, s, rng, lo, hi);
  }

  std::unique_ptr<Backend> be_;
};

TEST_F(LayerGrad, Conv2dWithBiasPadStride) {
  Conv2d conv(*be_, 3, 4, 3, 2, 1, true);
  auto r = Check(conv, {In({2, 3, 7, 7}, 1)});
  EXPECT_LT(r.max_err, kTol) << r.where;
  EXPECT_GT(r.checked, 100);
}

TEST_F(LayerGrad, Conv2dNoBias5x5) {
  Conv2d conv(*be_, 2, 3, 5, 1, 0, false);
  auto r = Check(conv, {In({2, 2, 9, 9}, 2)});
  EXPECT_LT(r.max_err, kTol) << r.where;
}

TEST_F(LayerGrad, Conv2dWideChannels) {  // channel counts where oneDNN picks blocked layouts
  Conv2d conv(*be_, 16, 32, 3, 1, 1, true);
  auto r = Check(conv, {In({2, 16, 6, 6}, 3)}, 1e-2);
  EXPECT_LT(r.max_err, kTol) << r.where;
}

TEST_F(LayerGrad, Linear) {
  Linear fc(*be_, 7, 5);
  auto r = Check(fc, {In({3, 7}, 4)});
  EXPECT_LT(r.max_err, kTol) << r.where;
}

TEST_F(LayerGrad, BatchNormTrain4d) {
  BatchNorm bn(*be_, 3);
  auto r = Check(bn, {In({4, 3, 3, 3}, 5)}, 5e-3);
  EXPECT_LT(r.max_err, kTol) << r.where;
}

TEST_F(LayerGrad, BatchNormTrain2d) {
  BatchNorm bn(*be_, 5);
  auto r = Check(bn, {In({6, 5}, 6)}, 5e-3);
  EXPECT_LT(r.max_err, kTol) << r.where;
}

TEST_F(LayerGrad, ReLU) {
  // |x| >= 0.1 keeps every probe on one side of the kink
  std::mt19937_64 rng(8);
  std::vector<float> v(2 * 3 * 4 * 4);
  std::uniform_real_distribution<float> d(0.1f, 1.0f);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (i % 3 == 0 ? -1.0f : 1.0f) * d(rng);
  Tensor x = be_->Empty({2, 3, 4, 4});
  be_->CopyFromHost(x, v.data());
  ReLU relu(*be_);
  auto r = Check(relu, {x});
  EXPECT_LT(r.max_err, kTol) << r.where;
}

// Values spaced 0.05 apart, shuffled: every window has a clear maximum.
Tensor Distinct(Backend& be, const Shape& s, uint64_t seed) {
  std::vector<float> v(size_t(NumElements(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.05f * float(i) - 1.0f;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  Tensor t = be.Empty(s);
  be.CopyFromHost(t, v.data());
  return t;
}

TEST_F(LayerGrad, MaxPool2x2) {
  MaxPool pool(*be_, 2, 2);
  auto r = Check(pool, {Distinct(*be_, {2, 2, 6, 6}, 9)});
  EXPECT_LT(r.max_err, kTol) << r.where;
}

TEST_F(LayerGrad, MaxPool3x3Stride2Pad1Overlapping) {
  MaxPool pool(*be_, 3, 2, 1);
  auto r = Check(pool, {Distinct(*be_, {1, 2, 7, 7}, 10)});
  EXPECT_LT(r.max_err, kTol) << r.where;
}

TEST_F(LayerGrad, GlobalAvgPool) {
  GlobalAvgPool gap(*be_);
  auto r = Check(gap, {In({2, 3, 4, 5}, 11)});
  EXPECT_LT(r.max_err, kTol) << r.where;
}

TEST_F(LayerGrad, Flatten) {
  Flatten f(*be_);
  auto r = Check(f, {In({2, 3, 2, 2}, 12)});
  EXPECT_LT(r.max_err, kTol) << r.where;
}

TEST_F(LayerGrad, ResidualAdd) {
  AddLayer add(*be_);
  auto r = Check(add, {In({2, 3, 2, 2}, 13), In({2, 3, 2, 2}, 14)});
  EXPECT_LT(r.max_err, kTol) << r.where;
}

TEST_F(LayerGrad, SoftmaxCrossEntropyWithLabelSmoothing) {
  for (float eps : {0.0f, 0.1f}) {
    SoftmaxCrossEntropyLoss loss(*be_, eps);
    Tensor z = In({4, 6}, 15, -3, 3);
    const int32_t labels[4] = {0, 5, 2, 2};
    int64_t correct = -1;
    loss.Forward(z, labels, true, &correct);
    std::vector<float> g = Host(*be_, loss.grad());
    GradCheckResult res;
    Probe(
        *be_, z, g, [&] { return double(loss.Forward(z, labels, false, nullptr)); }, "dlogits", 1e-2, 100, &res);
    EXPECT_LT(res.max_err, kTol) << "eps " << eps << ": " << res.where;
    EXPECT_GE(correct, 0);
  }
}

}  // namespace
}  // namespace shoal
