// The Model graph and the zoo: shapes, parameter counts and flags, flat views, init,
// a model-level finite-difference check, and clear errors on bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "common/error.h"
#include "tests/engine/grad_check.h"
#include "worker/engine/models/builder.h"

namespace shoal {
namespace {

using namespace testing_util;

struct ZooCase {
  const char* name;
  Shape input;
  int64_t batch;
  int64_t params;
};

class Zoo : public ::testing::TestWithParam<ZooCase> {};

TEST_P(Zoo, ForwardShapeAndParameterCount) {
  const ZooCase c = GetParam();
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = c.input;
  mo.num_classes = 10;
  auto m = MakeModel(c.name, *be, mo);
  m->InitParameters(1);
  EXPECT_EQ(m->NumParams(), c.params) << m->Summary();
  Shape xs = {c.batch};
  xs.insert(xs.end(), c.input.begin(), c.input.end());
  std::mt19937_64 rng(2);
  Tensor x = Random(*be, xs, rng);
  const Tensor& y = m->Forward(x, false);
  EXPECT_EQ(y.shape(), Shape({c.batch, 10}));
  for (float v : Host(*be, y)) ASSERT_TRUE(std::isfinite(v));
  // bias and batch-norm parameters skip weight decay, weights do not
  for (const Parameter& p : m->parameters()) {
    const bool is_weight = p.name.size() > 6 && p.name.substr(p.name.size() - 6) == "weight";
    EXPECT_EQ(p.no_weight_decay, !is_weight) << p.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Zoo,
                         ::testing::Values(ZooCase{"mlp", {1, 28, 28}, 3, 784 * 256 + 256 + 256 * 256 + 256 + 2570},
                                           ZooCase{"lenet", {1, 28, 28}, 3, 832 + 51264 + 262400 + 2570},
                                           // conv + 9 blocks + 2 projections + fc (He et al.: 0.27M)
                                           ZooCase{"resnet20", {3, 32, 32}, 2, 272474},
                                           // torchvision resnet50 with a 10-way fc: 23,528,522
                                           ZooCase{"resnet50", {3, 224, 224}, 1, 23528522}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Model, UnknownNameAndBadShapesAreClearErrors) {
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  try {
    MakeModel("vgg", *be, mo);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model (known: mlp, lenet, resnet20, resnet50)"), std::string::npos);
  }
  mo.input_shape = {1, 4, 4};  // too small for two 5x5 convolutions
  EXPECT_THROW(MakeModel("lenet", *be, mo), Error);
  mo.input_shape = {1, 28, 28};
  auto m = MakeModel("lenet", *be, mo);
  Tensor x = be->Zeros({2, 3, 28, 28});
  try {
    m->Forward(x, true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[N,1,28,28]"), std::string::npos) << e.what();
  }
  Tensor d = be->Zeros({2, 10});
  auto m2 = MakeModel("mlp", *be, mo);
  EXPECT_THROW(m2->Backward(d), Error);  // no forward yet
}

TEST(Model, InitIsDeterministicAndFlatViewsRoundTrip) {
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = {3, 32, 32};
  mo.zero_gamma_init = true;
  auto a = MakeModel("resnet20", *be, mo), b = MakeModel("resnet20", *be, mo);
  a->InitParameters(5);
  b->InitParameters(5);
  std::vector<float> fa(size_t(a->NumParams())), fb(fa.size());
  a->CopyParamsToHost(fa.data());
  b->CopyParamsToHost(fb.data());
  EXPECT_EQ(fa, fb);
  b->InitParameters(6);
  b->CopyParamsToHost(fb.data());
  EXPECT_NE(fa, fb);
  // the layout tiles the flat buffer in parameters() order
  int64_t off = 0;
  for (const ParamInfo& p : a->ParamLayout()) {
    EXPECT_EQ(p.offset, off) << p.name;
    off += p.numel;
    // zero-gamma: the last BN of every residual block starts at 0, the others at 1
    if (p.name.find(".bn2.gamma") != std::string::npos) {
      EXPECT_EQ(fa[size_t(p.offset)], 0.0f) << p.name;
    }
    if (p.name.find(".bn1.gamma") != std::string::npos) {
      EXPECT_EQ(fa[size_t(p.offset)], 1.0f) << p.name;
    }
  }
  EXPECT_EQ(off, a->NumParams());
  for (size_t i = 0; i < fa.size(); ++i) fa[i] = float(i % 97) * 0.01f;
  b->CopyParamsFromHost(fa.data());
  b->CopyParamsToHost(fb.data());
  EXPECT_EQ(fa, fb);
  b->CopyGradsFromHost(fa.data());
  std::vector<float> g(fa.size());
  b->CopyGradsToHost(g.data());
  EXPECT_EQ(g, fa);
  b->ZeroGrad();
  b->CopyGradsToHost(g.data());
  EXPECT_EQ(g, std::vector<float>(fa.size(), 0.0f));
}

// Each model's default start: lenet's layers as PyTorch's (weights and biases uniform in
// +-1/sqrt(fan_in), std bound/sqrt(3)), resnet20's convolutions He normal (std
// sqrt(2/fan_in), no bias); [model] init overrides it.
TEST(Model, InitDrawsEachModelsDefaultDistribution) {
  auto be = MakeCpuBackend(1);
  auto stats = [&](const std::string& model, std::optional<WeightInit> init, const std::string& param) {
    ModelOptions mo;
    mo.init = init;
    auto m = MakeModel(model, *be, mo);
    m->InitParameters(3);
    std::vector<float> flat(size_t(m->NumParams()));
    m->CopyParamsToHost(flat.data());
    for (const ParamInfo& p : m->ParamLayout())
      if (p.name == param) {
        double sum = 0, sq = 0, max_abs = 0;
        for (int64_t i = 0; i < p.numel; ++i) {
          const double v = flat[size_t(p.offset + i)];
          sum += v;
          sq += v * v;
          max_abs = std::max(max_abs, std::abs(v));
        }
        const double n = double(p.numel), mean = sum / n;
        return std::make_pair(std::sqrt(sq / n - mean * mean), max_abs);
      }
    ADD_FAILURE() << "no parameter " << param << " in " << model;
    return std::make_pair(0.0, 0.0);
  };
  // lenet fc1: fan-in 1024, bound 1/32
  auto [std_fc, max_fc] = stats("lenet", std::nullopt, "fc1.weight");
  EXPECT_LE(max_fc, 1.0 / 32);
  EXPECT_NEAR(std_fc, 1.0 / 32 / std::sqrt(3.0), 0.02 * std_fc);
  auto [std_b, max_b] = stats("lenet", std::nullopt, "conv2.bias");  // fan-in 32*5*5 = 800
  EXPECT_LE(max_b, 1.0 / std::sqrt(800.0));
  EXPECT_GT(std_b, 0.0);
  // He normal when asked: std sqrt(2/1024)
  auto [std_he, max_he] = stats("lenet", WeightInit::kHeNormal, "fc1.weight");
  EXPECT_NEAR(std_he, std::sqrt(2.0 / 1024), 0.02 * std_he);
  EXPECT_GT(max_he, 1.0 / 32);
  EXPECT_EQ(stats("lenet", WeightInit::kHeNormal, "conv2.bias").second, 0.0);
  // resnet20's first convolution: fan-in 3*3*3 = 27, He normal by default
  auto [std_rn, max_rn] = stats("resnet20", std::nullopt, "conv.weight");
  EXPECT_NEAR(std_rn, std::sqrt(2.0 / 27), 0.15 * std_rn);  // 432 draws
}

TEST(Model, GradientsMatchFiniteDifferences) {
  auto be = MakeCpuBackend(1);
  // every node kind but pooling (FD-checked per layer), and c0 with three consumers
  auto m = std::make_unique<Model>(*be, "tiny", Shape{2, 5, 5});
  {
    ModelBuilder b{*m, *be};
    int c0 = b.Relu("r0", b.Conv("c0", Model::kInput, 2, 3, 3, 1, 1, true));
    int y = b.Relu("r1", b.BN("bn1", b.Conv("c1", c0, 3, 3, 3, 1, 1, false), 3));
    y = b.BN("bn2", b.Conv("c2", y, 3, 3, 3, 1, 1, false), 3);
    y = b.Sum("add", y, c0);
    y = b.Sum("add2", y, c0);
    y = b.Relu("r2", y);
    y = b.Gap("gap", y);
    b.Fc("fc", y, 3, 4);
  }
  m->set_label_smoothing(0.1f);
  m->InitParameters(3);
  std::mt19937_64 rng(4);
  Tensor x = Random(*be, {4, 2, 5, 5}, rng);
  const int32_t labels[4] = {0, 1, 2, 3};
  m->ZeroGrad();
  m->TrainStep(x, labels);
  GradCheckResult res;
  // train mode: batch statistics, as in the analytic pass
  auto train_loss = [&] {
    const Tensor& z = m->Forward(x, true);
    return double(be->SoftmaxCrossEntropy(z, labels, 0.1f, nullptr, nullptr));
  };
  for (Parameter& p : m->parameters()) Probe(*be, p.value, Host(*be, p.grad), train_loss, p.name, 1e-3, 40, &res);
  EXPECT_LT(res.max_err, 3e-3) << res.where;
  EXPECT_GT(res.checked, 100);
}

TEST(Model, EvalModeUsesRunningStatistics) {
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = {3, 8, 8};
  auto m = MakeModel("resnet20", *be, mo);
  m->InitParameters(1);
  std::mt19937_64 rng(9);
  Tensor x = Random(*be, {2, 3, 8, 8}, rng);
  std::vector<float> train = Host(*be, m->Forward(x, true));
  std::vector<float> eval = Host(*be, m->Forward(x, false));
  EXPECT_NE(train, eval);
  m->Eval();
  std::vector<float> eval2 = Host(*be, m->Forward(x));
  EXPECT_EQ(eval, eval2);  // inference does not touch running stats
  m->Train();
  EXPECT_TRUE(m->training());
  EXPECT_NE(Host(*be, m->Forward(x)), eval);
  EXPECT_EQ(m->buffers().size(), 2u * (1 + 9 * 2 + 2));
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

TEST(Model, GradientsAccumulateAcrossStepsUntilZeroed) {
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = {1, 16, 16};
  auto m = MakeModel("lenet", *be, mo);
  m->InitParameters(2);
  std::mt19937_64 rng(1);
  Tensor x = Random(*be, {3, 1, 16, 16}, rng);
  const int32_t labels[3] = {1, 2, 3};
  m->ZeroGrad();
  m->TrainStep(x, labels);
  std::vector<float> once(size_t(m->NumParams())), twice(once.size());
  m->CopyGradsToHost(once.data());
  m->TrainStep(x, labels);
  m->CopyGradsToHost(twice.data());
  double norm = 0;
  for (size_t i = 0; i < once.size(); ++i) {
    ASSERT_NEAR(twice[i], 2 * once[i], 1e-5 * (1 + std::fabs(once[i]))) << m->ParamLayout().size();
    norm += double(once[i]) * once[i];
  }
  EXPECT_GT(norm, 0.0);
}

// The overlap hook: every parameter announced exactly once per Backward, whole nodes in
// reverse parameter order, and each gradient already final when announced (it equals what
// the pass leaves at its end). resnet20 has residual joins, so later layers feed earlier
// gradients through two paths.
TEST(Model, GradReadyHookAnnouncesEachFinalGradientInReverseOrder) {
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = {3, 8, 8};
  auto m = MakeModel("resnet20", *be, mo);
  m->InitParameters(3);
  std::mt19937_64 rng(4);
  Tensor x = Random(*be, {2, 3, 8, 8}, rng);
  const int32_t labels[2] = {1, 7};
  auto& ps = m->parameters();
  std::vector<std::pair<size_t, size_t>> calls;
  std::vector<std::vector<float>> at_hook(ps.size());
  m->set_grad_ready_hook([&](size_t first, size_t last) {
    calls.emplace_back(first, last);
    for (size_t i = first; i < last; ++i) at_hook[i] = Host(*be, ps[i].grad);
  });
  m->ZeroGrad();
  m->TrainStep(x, labels);
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.front().second, ps.size());
  EXPECT_EQ(calls.back().first, 0u);
  for (size_t k = 1; k < calls.size(); ++k) EXPECT_EQ(calls[k].second, calls[k - 1].first) << k;
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(at_hook[i], Host(*be, ps[i].grad)) << ps[i].name;
  m->set_grad_ready_hook(nullptr);
  calls.clear();
  m->TrainStep(x, labels);
  EXPECT_TRUE(calls.empty());
}

// What the balanced-batch floor for batch norm is computed from: the values per channel per
// sample at the smallest map a batch norm normalizes (a 1x1 map: one sample has none to
// spread over).
TEST(Model, MinStatisticsValuesIsTheSmallestBatchNormMap) {
  auto be = MakeCpuBackend(1);
  struct Case {
    const char* model;
    Shape input;
    int64_t values;
  };
  for (const Case& c :
       {Case{"mlp", {1, 28, 28}, 0}, Case{"lenet", {1, 28, 28}, 0}, Case{"resnet20", {3, 32, 32}, 64},
        Case{"resnet20", {1, 28, 28}, 49}, Case{"resnet50", {3, 32, 32}, 1}, Case{"resnet50", {3, 64, 64}, 4}}) {
    ModelOptions mo;
    mo.input_shape = c.input;
    EXPECT_EQ(MakeModel(c.model, *be, mo)->MinStatisticsValues(), c.values) << c.model << ShapeString(c.input);
  }
}

TEST(Model, Resnet50TrainStepOnSmallImages) {
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = {3, 64, 64};
  mo.zero_gamma_init = true;
  auto m = MakeModel("resnet50", *be, mo);
  m->InitParameters(3);
  std::mt19937_64 rng(5);
  Tensor x = Random(*be, {2, 3, 64, 64}, rng);
  const int32_t labels[2] = {4, 7};
  m->ZeroGrad();
  StepResult r = m->TrainStep(x, labels);
  EXPECT_TRUE(std::isfinite(r.loss));
  for (const Parameter& p : m->parameters()) {
    const double ss = be->SumSquares(p.grad);
    ASSERT_TRUE(std::isfinite(ss)) << p.name;
    // zero-γ blocks still pass gradient to their γ and to the stem through the shortcuts
    if (p.name == "conv.weight" || p.name.find("bn3.gamma") != std::string::npos) {
      EXPECT_GT(ss, 0.0) << p.name;
    }
  }
}

}  // namespace
}  // namespace shoal
