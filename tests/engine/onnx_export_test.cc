// ExportOnnx: zoo models and an imported PyTorch CNN, trained a little, written, checked by
// ONNX's checker (and by python3-onnx's full check where it is installed), imported back:
// the same logits in evaluation, the same names, and the imported graph's structure kept.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "common/error.h"
#include "tests/engine/grad_check.h"
#include "worker/engine/backend.h"
#include "worker/engine/model.h"
#include "worker/engine/onnx/onnx_export.h"
#include "worker/engine/onnx/onnx_import.h"

namespace shoal {
namespace {

const std::string kSmallCnn = "tests/engine/testdata/small_cnn.onnx";

onnx::ModelProto Load(const std::string& path) {
  onnx::ModelProto p;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f && p.ParseFromIstream(&f)) << path;
  return p;
}

// A few SGD steps on random data, so the weights and the running statistics are no longer
// their starting values (batch norm's gamma 1, beta 0, mean 0, var 1), then noise on every
// weight: some gradients (a gamma ahead of max pooling) are too small to move an fp32 1.0.
void Train(Model& m, Backend& be, const Shape& x_shape, int steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor x = testing_util::Random(be, x_shape, rng);
  std::vector<int32_t> labels(static_cast<size_t>(x_shape[0]));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t(i % 10);
  for (int s = 0; s < steps; ++s) {
    m.ZeroGrad();
    m.TrainStep(x, labels.data());
    for (Parameter& p : m.parameters()) be.Axpy(-0.05f, p.grad, p.value);
  }
  for (Parameter& p : m.parameters()) be.Axpy(0.01f, testing_util::Random(be, p.value.shape(), rng), p.value);
}

void ExpectSameLogits(Backend& be, Model& a, Model& b, const Shape& x_shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor x = testing_util::Random(be, x_shape, rng);
  const std::vector<float> ya = testing_util::Host(be, a.Forward(x, false));
  const std::vector<float> yb = testing_util::Host(be, b.Forward(x, false));
  ASSERT_EQ(ya.size(), yb.size());
  for (size_t i = 0; i < ya.size(); ++i) EXPECT_NEAR(ya[i], yb[i], 1e-4 + 1e-4 * std::fabs(ya[i])) << i;
}

std::set<std::string> Names(const Model& m) {
  std::set<std::string> s;
  for (const Parameter& p : m.parameters()) s.insert(p.name);
  for (const Buffer& b : m.buffers()) s.insert("buffer:" + b.name);
  return s;
}

struct ZooCase {
  std::string name;
  Shape sample;
  int64_t batch;
  int train_steps;
};

class ZooExport : public ::testing::TestWithParam<ZooCase> {};

TEST_P(ZooExport, ReimportsWithTheSameLogitsAndNames) {
  const ZooCase& c = GetParam();
  auto be = MakeCpuBackend(2);
  ModelOptions mo;
  mo.input_shape = c.sample;
  mo.num_classes = 10;
  auto m = MakeModel(c.name, *be, mo);
  m->InitParameters(7);
  Shape xs = {c.batch};
  xs.insert(xs.end(), c.sample.begin(), c.sample.end());
  Train(*m, *be, xs, c.train_steps, 11);
  const std::string path = ::testing::TempDir() + "/" + c.name + ".onnx";
  ExportOnnx(*m, *be, path);

  const onnx::ModelProto p = Load(path);
  EXPECT_NO_THROW(onnx::checker::check_model(p));
  EXPECT_EQ(p.ir_version(), 8);
  ASSERT_EQ(p.opset_import_size(), 1);
  EXPECT_EQ(p.opset_import(0).version(), 17);
  ASSERT_EQ(p.graph().input_size(), 1);
  EXPECT_EQ(p.graph().input(0).name(), "input");
  EXPECT_EQ(p.graph().input(0).type().tensor_type().shape().dim(0).dim_param(), "batch");
  ASSERT_EQ(p.graph().output_size(), 1);
  EXPECT_EQ(p.graph().output(0).name(), "logits");
  EXPECT_EQ(p.graph().output(0).type().tensor_type().shape().dim(1).dim_value(), 10);

  OnnxOptions o;
  o.input_shape = c.sample;
  o.num_classes = 10;
  o.batch = 3;
  auto back = ImportOnnx(path, *be, o);
  back->InitParameters(99);  // an imported model starts from the file's values, whatever the seed
  EXPECT_EQ(Names(*back), Names(*m));
  ExpectSameLogits(*be, *m, *back, Shape(xs.begin(), xs.end()), 13);
  xs[0] = 3;  // another batch size than the one trained at
  ExpectSameLogits(*be, *m, *back, xs, 17);
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooExport,
                         ::testing::Values(ZooCase{"mlp", {1, 28, 28}, 8, 3}, ZooCase{"lenet", {1, 28, 28}, 8, 3},
                                           ZooCase{"resnet20", {3, 32, 32}, 4, 2},
                                           // 64x64 keeps it quick; the graph is the 224x224 one's (at 32x32 a
                                           // step on 2 samples' 1x1 maps diverges).
                                           ZooCase{"resnet50", {3, 64, 64}, 2, 1}),
                         [](const ::testing::TestParamInfo<ZooCase>& i) { return i.param.name; });

TEST(OnnxExport, ImportedModelKeepsItsGraphWithTheTrainedValues) {
  auto be = MakeCpuBackend(2);
  OnnxOptions o;
  o.input_shape = {1, 28, 28};
  o.num_classes = 10;
  o.batch = 8;
  auto m = ImportOnnx(kSmallCnn, *be, o);
  m->InitParameters(1);
  Train(*m, *be, {8, 1, 28, 28}, 4, 21);
  const std::string path = ::testing::TempDir() + "/small_cnn_trained.onnx";
  ExportOnnx(*m, *be, path, kSmallCnn);

  auto back = ImportOnnx(path, *be, o);
  back->InitParameters(1);
  EXPECT_EQ(Names(*back), Names(*m));
  ExpectSameLogits(*be, *m, *back, {5, 1, 28, 28}, 23);

  const onnx::ModelProto src = Load(kSmallCnn), out = Load(path);
  EXPECT_NO_THROW(onnx::checker::check_model(out));
  ASSERT_EQ(out.graph().node_size(), src.graph().node_size());
  for (int i = 0; i < src.graph().node_size(); ++i)
    EXPECT_EQ(out.graph().node(i).op_type(), src.graph().node(i).op_type());
  EXPECT_EQ(out.graph().input(0).type().tensor_type().shape().dim(0).dim_param(), "batch");
  // Inference form: batch norm on its running statistics, dropout off.
  for (const onnx::NodeProto& n : out.graph().node()) {
    if (n.op_type() == "BatchNormalization") {
      EXPECT_EQ(n.output_size(), 1) << n.name();
      for (const onnx::AttributeProto& a : n.attribute()) EXPECT_NE(a.name(), "training_mode") << n.name();
    }
    if (n.op_type() == "Dropout") {
      EXPECT_LT(n.input_size(), 3) << n.name();
    }
  }
  // Every parameter and statistic changed; nothing else did.
  std::map<std::string, std::string> before;
  for (const onnx::TensorProto& t : src.graph().initializer()) before[t.name()] = t.SerializeAsString();
  std::set<std::string> trained;
  for (const std::string& n : Names(*m)) trained.insert(n.rfind("buffer:", 0) == 0 ? n.substr(7) : n);
  ASSERT_EQ(out.graph().initializer_size(), src.graph().initializer_size());
  for (const onnx::TensorProto& t : out.graph().initializer())
    EXPECT_EQ(before.at(t.name()) != t.SerializeAsString(), trained.count(t.name()) > 0) << t.name();
}

void WriteFloats(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
}

// The promise to a PyTorch user: the trained initializers, loaded into the module by
// name (testdata/torch_load_export.py), give Shoal's outputs.
TEST(OnnxExport, PyTorchModuleLoadsTheTrainedInitializersByName) {
  if (std::system("/usr/bin/python3 -c 'import torch, onnx' 2>/dev/null") != 0)
    GTEST_SKIP() << "python3-torch or python3-onnx is not installed";
  auto be = MakeCpuBackend(2);
  OnnxOptions o;
  o.batch = 8;
  auto m = ImportOnnx(kSmallCnn, *be, o);
  m->InitParameters(1);
  Train(*m, *be, {8, 1, 28, 28}, 4, 31);
  const std::string dir = ::testing::TempDir();
  ExportOnnx(*m, *be, dir + "/torch.onnx", kSmallCnn);
  std::mt19937_64 rng(37);
  Tensor x = testing_util::Random(*be, {5, 1, 28, 28}, rng);
  WriteFloats(dir + "/torch_input.bin", testing_util::Host(*be, x));
  WriteFloats(dir + "/torch_logits.bin", testing_util::Host(*be, m->Forward(x, false)));
  const std::string cmd = "/usr/bin/python3 tests/engine/testdata/torch_load_export.py " + dir + "/torch.onnx " + dir +
                          "/torch_input.bin " + dir + "/torch_logits.bin 5";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// A graph that also outputs a batch norm's training statistics (as an export may list them):
// in inference form they are gone, and so are those outputs.
TEST(OnnxExport, TrainingStatisticsOutputsGoWithTheTrainingMode) {
  onnx::ModelProto src = Load(kSmallCnn);
  for (const onnx::NodeProto& n : src.graph().node())
    if (n.op_type() == "BatchNormalization") {
      onnx::ValueInfoProto* v = src.mutable_graph()->add_output();
      v->set_name(n.output(1));
      v->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
      v->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(16);  // channels
    }
  const std::string source = ::testing::TempDir() + "/stats_outputs.onnx";
  {
    std::ofstream f(source, std::ios::binary);
    ASSERT_TRUE(src.SerializeToOstream(&f));
  }
  auto be = MakeCpuBackend(1);
  OnnxOptions o;
  o.batch = 2;
  auto m = ImportOnnx(source, *be, o);
  const std::string path = ::testing::TempDir() + "/stats_outputs_trained.onnx";
  ExportOnnx(*m, *be, path, source);
  const onnx::ModelProto out = Load(path);
  ASSERT_EQ(out.graph().output_size(), 1);
  EXPECT_EQ(out.graph().output(0).name(), "logits");
}

// python3-onnx's full check (checker plus strict shape inference), outside this library.
TEST(OnnxExport, PythonOnnxAcceptsTheExport) {
  if (std::system("/usr/bin/python3 -c 'import onnx' 2>/dev/null") != 0)
    GTEST_SKIP() << "python3-onnx is not installed";
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = {3, 32, 32};
  auto m = MakeModel("resnet20", *be, mo);
  m->InitParameters(3);
  const std::string zoo = ::testing::TempDir() + "/py_resnet20.onnx";
  ExportOnnx(*m, *be, zoo);
  OnnxOptions o;
  o.batch = 2;
  auto imported = ImportOnnx(kSmallCnn, *be, o);
  const std::string cnn = ::testing::TempDir() + "/py_small_cnn.onnx";
  ExportOnnx(*imported, *be, cnn, kSmallCnn);
  for (const std::string& path : {zoo, cnn}) {
    const std::string cmd =
        "/usr/bin/python3 -c 'import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1]), "
        "full_check=True)' " +
        path;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
}

TEST(OnnxExport, RefusesWhatItCannotWrite) {
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = {1, 28, 28};
  auto m = MakeModel("mlp", *be, mo);
  try {
    ExportOnnx(*m, *be, "/nonexistent/dir/out.onnx");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/out.onnx"), std::string::npos) << e.what();
  }
  // An imported model's layers are not the zoo's: without its source file, a clear refusal.
  OnnxOptions o;
  auto imported = ImportOnnx(kSmallCnn, *be, o);
  try {
    ExportOnnx(*imported, *be, ::testing::TempDir() + "/x.onnx");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no ONNX export"), std::string::npos) << e.what();
  }
  // A source the model did not come from.
  const std::string other = ::testing::TempDir() + "/mlp.onnx";
  ExportOnnx(*m, *be, other);
  try {
    ExportOnnx(*imported, *be, ::testing::TempDir() + "/y.onnx", other);
    FAIL();
  } catch (const Error& e) {
    // mlp's fc1.weight has another shape; small_cnn's conv1.weight is not there at all.
    EXPECT_NE(std::string(e.what()).find(other + ": initializer 'fc1.weight' is [256,784]"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shoal
