// Every model of the zoo against data shapes and class counts it was not written for: each
// either takes a training step and an eval step (logits [N, classes], finite loss) or
// refuses at build time with one Error that names the model, the shape and what it needs,
// never a failure deep in the engine.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "worker/engine/model.h"

namespace shoal {
namespace {

const std::vector<Shape> kShapes = {{1, 28, 28}, {1, 32, 32}, {3, 32, 32}, {1, 16, 16}, {3, 64, 64}, {1, 8, 8}};

// "" when the model trains a step on this shape, else the message it refused with.
std::string TryStep(const std::string& name, const Shape& in, int64_t classes) {
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = in;
  mo.num_classes = classes;
  std::unique_ptr<Model> m;
  try {
    m = MakeModel(name, *be, mo);
  } catch (const Error& e) {
    return e.what();
  }
  m->InitParameters(1);
  const int64_t n = 2;
  Shape xs = {n};
  xs.insert(xs.end(), in.begin(), in.end());
  Tensor x = be->Empty(xs);
  std::vector<float> xh(size_t(x.numel()));
  for (size_t i = 0; i < xh.size(); ++i) xh[i] = float(i % 13) / 13.0f - 0.5f;
  be->CopyFromHost(x, xh.data());
  std::vector<int32_t> labels = {0, int32_t(classes - 1)};
  m->ZeroGrad();
  StepResult r = m->TrainStep(x, labels.data());
  EXPECT_TRUE(std::isfinite(r.loss)) << name << " " << ShapeString(in);
  EXPECT_EQ(m->Forward(x, false).shape(), (Shape{n, classes})) << name << " " << ShapeString(in);
  StepResult e = m->EvalStep(x, labels.data());
  EXPECT_TRUE(std::isfinite(e.loss)) << name << " " << ShapeString(in);
  return "";
}

// lenet's two unpadded 5x5 convolutions and 2x2 pools need at least 16x16; every other
// model takes any image (the ResNets pool globally, the mlp flattens).
bool Fits(const std::string& name, const Shape& in) { return name != "lenet" || (in[1] >= 16 && in[2] >= 16); }

TEST(ModelShapes, EveryModelTrainsOrRefusesEveryShapeClearly) {
  for (const std::string& name : ModelNames())
    for (const Shape& in : kShapes) {
      SCOPED_TRACE(name + " on " + ShapeString(in));
      const std::string refused = TryStep(name, in, 10);
      if (Fits(name, in)) {
        EXPECT_EQ(refused, "");
      } else {
        EXPECT_NE(refused.find("model " + name), std::string::npos) << refused;
        EXPECT_NE(refused.find(ShapeString(in)), std::string::npos) << refused;
        EXPECT_NE(refused.find("at least 16x16"), std::string::npos) << refused;
      }
    }
}

// 2, 27 (EMNIST letters: labels 1..26, 0 unused), 47 (EMNIST balanced) and 100 classes.
TEST(ModelShapes, EveryModelTakesAnyClassCount) {
  for (const std::string& name : ModelNames())
    for (int64_t classes : {2, 27, 47, 100}) {
      SCOPED_TRACE(name + " with " + std::to_string(classes) + " classes");
      EXPECT_EQ(TryStep(name, {1, 16, 16}, classes), "");
    }
}

TEST(ModelShapes, OneClassIsRefused) {
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.num_classes = 1;
  try {
    MakeModel("mlp", *be, mo);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model mlp: num_classes must be >= 2, got 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shoal
