// A PyTorch-exported CNN (testdata/make_models.py) imported: the same logits as PyTorch, the
// module's parameter names, no decay on rank-1 parameters, running statistics as buffers, a
// batch size other than the export's, and training that lowers the loss.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "common/error.h"
#include "tests/engine/grad_check.h"
#include "worker/engine/backend.h"
#include "worker/engine/model.h"
#include "worker/engine/onnx/onnx_import.h"

namespace shoal {
namespace {

const std::string kDir = "tests/engine/testdata/";

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(f) << path;
  std::vector<float> v(size_t(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
  return v;
}

std::unique_ptr<Model> Import(Backend& be, int64_t batch) {
  OnnxOptions o;
  o.input_shape = {1, 28, 28};
  o.num_classes = 10;
  o.batch = batch;
  return ImportOnnx(kDir + "small_cnn.onnx", be, o);
}

TEST(OnnxModel, SameLogitsAsPyTorch) {
  auto be = MakeCpuBackend(1);
  auto m = Import(*be, 64);
  m->InitParameters(1);
  const std::vector<float> x = ReadFloats(kDir + "small_cnn_input.bin"),
                           want = ReadFloats(kDir + "small_cnn_logits.bin");
  Tensor xt = be->Empty({5, 1, 28, 28});
  be->CopyFromHost(xt, x.data());
  const std::vector<float> got = testing_util::Host(*be, m->Forward(xt, false));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 + 1e-4 * std::fabs(want[i])) << i;
}

TEST(OnnxModel, ParametersKeepTheModulesNames) {
  auto be = MakeCpuBackend(1);
  auto m = Import(*be, 8);
  std::map<std::string, bool> decay_free;
  for (const Parameter& p : m->parameters()) decay_free[p.name] = p.no_weight_decay;
  const std::map<std::string, bool> want = {{"conv1.weight", false}, {"conv1.bias", true},    {"bn1.weight", true},
                                            {"bn1.bias", true},      {"dw.weight", false},    {"bn2.weight", true},
                                            {"bn2.bias", true},      {"conv2.weight", false}, {"conv2.bias", true},
                                            {"fc1.weight", false},   {"fc1.bias", true},      {"fc2.weight", false},
                                            {"fc2.bias", true}};
  EXPECT_EQ(decay_free, want);
  std::set<std::string> buffers;
  for (const Buffer& b : m->buffers()) buffers.insert(b.name);
  EXPECT_EQ(buffers,
            (std::set<std::string>{"bn1.running_mean", "bn1.running_var", "bn2.running_mean", "bn2.running_var"}));
  EXPECT_EQ(m->OutputShape(3), Shape({3, 10}));
}

TEST(OnnxModel, TrainingLowersTheLossOnAFixedBatch) {
  auto be = MakeCpuBackend(1);
  auto m = Import(*be, 16);
  m->InitParameters(1);
  std::mt19937_64 rng(3);
  Tensor x = testing_util::Random(*be, {16, 1, 28, 28}, rng);
  std::vector<int32_t> labels(16);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t(i % 10);
  float first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    m->ZeroGrad();
    const StepResult r = m->TrainStep(x, labels.data());
    if (step == 0) first = r.loss;
    last = r.loss;
    for (Parameter& p : m->parameters()) be->Axpy(-0.3f, p.grad, p.value);
  }
  EXPECT_LT(last, 0.5f * first) << "first " << first << " last " << last;
}

// nn.TransformerEncoder: the attention's Shape/Gather/Concat/Reshape chains evaluated for a
// batch other than the export's and the one the model was built at.
TEST(OnnxModel, TransformerGivesPyTorchsLogitsAtAnyBatch) {
  auto be = MakeCpuBackend(1);
  OnnxOptions o;
  o.input_shape = {12};
  o.num_classes = 5;
  o.batch = 8;
  auto m = ImportOnnx(kDir + "tiny_transformer.onnx", *be, o);
  m->InitParameters(1);
  const std::vector<float> x = ReadFloats(kDir + "tiny_transformer_input.bin"),
                           want = ReadFloats(kDir + "tiny_transformer_logits.bin");
  Tensor xt = be->Empty({3, 12});
  be->CopyFromHost(xt, x.data());
  const std::vector<float> got = testing_util::Host(*be, m->Forward(xt, false));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 + 1e-4 * std::fabs(want[i])) << i;
  // Training at the built batch, then evaluating at 3 again: the shapes rebind both ways.
  std::mt19937_64 rng(2);
  std::vector<float> ids(8 * 12);
  for (float& v : ids) v = float(rng() % 50);
  Tensor batch = be->Empty({8, 12});
  be->CopyFromHost(batch, ids.data());
  std::vector<int32_t> labels(8);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t(i % 5);
  float first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    m->ZeroGrad();
    const StepResult r = m->TrainStep(batch, labels.data());
    if (step == 0) first = r.loss;
    last = r.loss;
    for (Parameter& p : m->parameters()) be->Axpy(-0.1f, p.grad, p.value);
  }
  EXPECT_LT(last, 0.5f * first) << "first " << first << " last " << last;
  EXPECT_EQ(m->Forward(xt, false).shape(), Shape({3, 5}));
}

// A GPT exported by PyTorch (causal nn.TransformerEncoder, per-position head): Shoal's
// [N, T, vocab] logits equal PyTorch's; the loss and accuracy are per position (N*T labels);
// the -inf mask stays a constant; training on a fixed batch lowers the loss.
TEST(OnnxModel, TinyGptMatchesPyTorchPerPosition) {
  auto be = MakeCpuBackend(1);
  OnnxOptions o;
  o.input_shape = {32};
  o.num_classes = 256;
  o.batch = 8;
  o.sequence_output = true;
  auto m = ImportOnnx(kDir + "tiny_gpt.onnx", *be, o);
  m->InitParameters(1);
  for (const Parameter& p : m->parameters()) EXPECT_EQ(p.name.find("causal_mask"), std::string::npos) << p.name;
  const std::vector<float> x = ReadFloats(kDir + "tiny_gpt_input.bin"), want = ReadFloats(kDir + "tiny_gpt_logits.bin");
  ASSERT_EQ(x.size(), 3u * 32);
  Tensor xt = be->Empty({3, 32});
  be->CopyFromHost(xt, x.data());
  const Tensor& out = m->Forward(xt, false);
  EXPECT_EQ(out.shape(), Shape({3, 32, 256}));
  const std::vector<float> got = testing_util::Host(*be, out);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 + 1e-4 * std::fabs(want[i])) << i;

  // The loss per position, from PyTorch's logits: labels are the next input token (the
  // last position's wraps to the first), so every position has its own label.
  std::vector<int32_t> labels(3 * 32);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t(x[(i + 1) % x.size()]);
  double loss = 0;
  int64_t hits = 0;
  for (size_t r = 0; r < labels.size(); ++r) {
    const float* z = want.data() + r * 256;
    double mx = z[0];
    size_t arg = 0;
    for (size_t k = 1; k < 256; ++k)
      if (z[k] > z[arg]) arg = k;
    mx = z[arg];
    double sum = 0;
    for (size_t k = 0; k < 256; ++k) sum += std::exp(double(z[k]) - mx);
    loss += std::log(sum) + mx - double(z[labels[r]]);
    hits += int64_t(arg) == labels[r];
  }
  loss /= double(labels.size());
  const StepResult ev = m->EvalStep(xt, labels.data());
  EXPECT_NEAR(ev.loss, loss, 1e-4 * loss);
  EXPECT_EQ(ev.correct, hits);

  // Training at the built batch (8 windows, 256 labels) learns the fixed batch.
  std::mt19937_64 rng(3);
  std::vector<float> ids(8 * 32);
  for (float& v : ids) v = float(rng() % 256);
  Tensor batch = be->Empty({8, 32});
  be->CopyFromHost(batch, ids.data());
  std::vector<int32_t> next(8 * 32);
  for (size_t i = 0; i < next.size(); ++i) next[i] = int32_t(rng() % 256);
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    m->ZeroGrad();
    const StepResult r = m->TrainStep(batch, next.data());
    if (step == 0) first = r.loss;
    last = r.loss;
    for (Parameter& p : m->parameters()) be->Axpy(-0.5f, p.grad, p.value);
  }
  EXPECT_LT(last, 0.5f * first) << "first " << first << " last " << last;

  // Without the token flag an [N, T, V] output is refused, and a vocabulary mismatch too.
  o.sequence_output = false;
  try {
    ImportOnnx(kDir + "tiny_gpt.onnx", *be, o);
    ADD_FAILURE() << "a [N, T, V] output was accepted for image data";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tokens"), std::string::npos) << e.what();
  }
  o.sequence_output = true;
  o.num_classes = 300;
  try {
    ImportOnnx(kDir + "tiny_gpt.onnx", *be, o);
    ADD_FAILURE() << "vocab 256 accepted for vocab_size 300";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size is 300"), std::string::npos) << e.what();
  }
}

// The whole graph's backward against central differences (dropout made an identity, so
// every pass draws the same function).
TEST(OnnxModel, GradientsMatchFiniteDifferences) {
  onnx::ModelProto proto;
  {
    std::ifstream f(kDir + "small_cnn.onnx", std::ios::binary);
    ASSERT_TRUE(proto.ParseFromIstream(&f));
  }
  for (onnx::NodeProto& n : *proto.mutable_graph()->mutable_node())
    if (n.op_type() == "Dropout") {
      n.set_op_type("Identity");
      while (n.input_size() > 1) n.mutable_input()->RemoveLast();
      while (n.output_size() > 1) n.mutable_output()->RemoveLast();
    }
  const std::string path = ::testing::TempDir() + "/no_dropout.onnx";
  {
    std::ofstream f(path, std::ios::binary);
    proto.SerializeToOstream(&f);
  }
  auto be = MakeCpuBackend(1);
  OnnxOptions o;
  o.batch = 4;
  auto m = ImportOnnx(path, *be, o);
  m->InitParameters(1);
  std::mt19937_64 rng(5);
  Tensor x = testing_util::Random(*be, {4, 1, 28, 28}, rng);
  const Tensor& y0 = m->Forward(x, true);
  std::vector<float> r(size_t(y0.numel()));
  std::uniform_real_distribution<float> d(-1, 1);
  for (float& v : r) v = d(rng);
  Tensor rt = be->Empty(y0.shape());
  be->CopyFromHost(rt, r.data());
  m->ZeroGrad();
  m->Forward(x, true);
  m->Backward(rt);
  auto loss = [&] { return testing_util::Dot(*be, m->Forward(x, true), r); };
  testing_util::GradCheckResult res;
  for (Parameter& p : m->parameters())
    testing_util::Probe(*be, p.value, testing_util::Host(*be, p.grad), loss, p.name, 3e-3, 8, &res);
  EXPECT_GT(res.checked, 50);
  EXPECT_LT(res.max_err, 3e-2) << res.where;
}

TEST(OnnxModel, BadFilesAreRefusedNamingTheFile) {
  auto be = MakeCpuBackend(1);
  OnnxOptions o;
  try {
    ImportOnnx("/nonexistent/model.onnx", *be, o);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.onnx"), std::string::npos) << e.what();
  }
  const std::string junk = ::testing::TempDir() + "/junk.onnx";
  std::ofstream(junk) << "this is not a protobuf";
  EXPECT_THROW(ImportOnnx(junk, *be, o), InputError);
  o.input_shape = {3, 32, 32};
  try {
    ImportOnnx(kDir + "small_cnn.onnx", *be, o);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("[3,32,32]"), std::string::npos) << e.what();
  }
  o.input_shape = {1, 28, 28};
  o.num_classes = 100;
  EXPECT_THROW(ImportOnnx(kDir + "small_cnn.onnx", *be, o), InputError);
}

// A graph whose output is an operator's second output (Dropout's mask), which Shoal does not
// make: refused naming the output, not as a node reading "unknown node -1".
TEST(OnnxModel, AnExtraOutputAsTheGraphsOutputIsRefusedByName) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("dropout_mask");
  onnx::ValueInfoProto* x = g->add_input();
  x->set_name("x");
  x->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int d : {2, 3}) x->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
  onnx::NodeProto* n = g->add_node();
  n->set_op_type("Dropout");
  n->set_name("drop");
  n->add_input("x");
  n->add_output("y");
  n->add_output("mask");
  onnx::ValueInfoProto* out = g->add_output();
  out->set_name("mask");
  out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::BOOL);
  for (int d : {2, 3}) out->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(d);
  auto be = MakeCpuBackend(1);
  OnnxOptions o;
  o.any_output = true;
  o.batch = 2;
  o.input_shape = {3};
  try {
    ImportOnnx(m, "mask.onnx", *be, o);
    FAIL() << "a mask output was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("output 'mask' is an extra output"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shoal
