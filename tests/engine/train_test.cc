// Short training runs on synthetic but learnable data: the loss must fall.
#include <gtest/gtest.h>

#include <random>

#include "tests/engine/grad_check.h"
#include "worker/engine/model.h"

namespace shoal {
namespace {

using namespace testing_util;

// Each class is a fixed random prototype image; samples are prototype + noise.
struct Synthetic {
  Synthetic(int64_t classes, const Shape& sample, uint64_t seed) : k(classes), shape(sample), rng(seed) {
    std::normal_distribution<float> d(0, 1);
    protos.resize(size_t(k * NumElements(shape)));
    for (float& v : protos) v = d(rng);
  }
  void Batch(int64_t n, std::vector<float>* x, std::vector<int32_t>* y) {
    const int64_t s = NumElements(shape);
    std::normal_distribution<float> noise(0, 1.0f);
    std::uniform_int_distribution<int32_t> cls(0, int32_t(k) - 1);
    x->resize(size_t(n * s));
    y->resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      (*y)[size_t(i)] = cls(rng);
      for (int64_t j = 0; j < s; ++j) (*x)[size_t(i * s + j)] = protos[size_t((*y)[size_t(i)] * s + j)] + noise(rng);
    }
  }
  int64_t k;
  Shape shape;
  std::mt19937_64 rng;
  std::vector<float> protos;
};

// SGD with momentum 0.9 and weight decay on weights only, as the trainer would.
void Train(const std::string& name, const Shape& in, int steps, float lr, double* first, double* last, double* acc) {
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = in;
  mo.num_classes = 10;
  mo.label_smoothing = 0.1f;
  auto m = MakeModel(name, *be, mo);
  m->InitParameters(42);
  std::vector<std::vector<float>> vel;
  for (Parameter& p : m->parameters()) vel.emplace_back(size_t(p.value.numel()), 0.0f);
  Synthetic data(10, in, 7);
  std::vector<float> xh;
  std::vector<int32_t> yh;
  Shape xs = {32};
  xs.insert(xs.end(), in.begin(), in.end());
  Tensor x = be->Empty(xs);
  double head = 0, tail = 0;
  int64_t hits = 0, seen = 0;
  for (int step = 0; step < steps; ++step) {
    data.Batch(32, &xh, &yh);
    be->CopyFromHost(x, xh.data());
    m->ZeroGrad();
    StepResult r = m->TrainStep(x, yh.data());
    ASSERT_TRUE(std::isfinite(r.loss)) << name << " step " << step;
    if (step < 5) head += r.loss / 5;
    if (step >= steps - 5) {
      tail += r.loss / 5;
      hits += r.correct;
      seen += 32;
    }
    auto& ps = m->parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      float* w = ps[i].value.data<float>();
      const float* g = ps[i].grad.data<float>();
      const float wd = ps[i].no_weight_decay ? 0.0f : 5e-4f;
      for (size_t j = 0; j < vel[i].size(); ++j) {
        vel[i][j] = 0.9f * vel[i][j] + g[j] + wd * w[j];
        w[j] -= lr * vel[i][j];
      }
    }
  }
  *first = head;
  *last = tail;
  *acc = double(hits) / double(seen);
}

TEST(Train, MlpLossFalls) {
  double first, last, acc;
  Train("mlp", {1, 28, 28}, 40, 0.01f, &first, &last, &acc);
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
  EXPECT_GT(acc, 0.8) << "first " << first << " last " << last;
}

TEST(Train, LenetLossFalls) {
  double first, last, acc;
  Train("lenet", {1, 28, 28}, 40, 0.02f, &first, &last, &acc);
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
  EXPECT_GT(acc, 0.8) << "first " << first << " last " << last;
}

TEST(Train, Resnet20LossFallsOnSmallImages) {
  double first, last, acc;
  Train("resnet20", {3, 8, 8}, 30, 0.05f, &first, &last, &acc);
  EXPECT_LT(last, 0.7 * first) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace shoal
