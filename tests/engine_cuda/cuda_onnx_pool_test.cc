// The pooling layers of imported graphs on the CUDA backend against the CPU engine: the
// backends' own pooling (plain 1-D and 2-D windows; max pooling with uneven pads or a ceil_mode
// window past the input, on a -inf padded copy) and the gather path both run on (dilations,
// average pooling with uneven pads or past the input, the pads counted and not, 3-D), the
// output and the input's gradient. The models are built here: the GPU machine has no ONNX test
// data. Skips without a device; the harness self-test (SHOAL_TEST_HARNESS_ON_CPU) runs the CPU
// engine in the device's place, so a failure on a GPU is the GPU's.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/platform.h"
#include "worker/engine/backend.h"
#include "worker/engine/model.h"
#include "worker/engine/onnx/onnx_import.h"

namespace shoal {
namespace {

struct PoolCase {
  std::string name, op;
  Shape x;
  std::vector<int64_t> kernel, strides, dilations, pads;
  int ceil_mode = 0, count_include_pad = 0;
};

void Ints(onnx::NodeProto& n, const char* name, const std::vector<int64_t>& v) {
  if (v.empty()) return;
  onnx::AttributeProto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t i : v) a->add_ints(i);
}

void Int(onnx::NodeProto& n, const char* name, int64_t v) {
  onnx::AttributeProto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

// One pooling node over the initializer x (trained, so its gradient is a parameter's); the
// data input is an unused stand-in.
onnx::ModelProto PoolModel(const PoolCase& c, const std::vector<float>& x) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  onnx::OperatorSetIdProto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(17);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name(c.name);
  onnx::ValueInfoProto* data = g->add_input();
  data->set_name("data");
  data->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (int i = 0; i < 2; ++i) data->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(1);
  onnx::TensorProto* t = g->add_initializer();
  t->set_name("x");
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : c.x) t->add_dims(d);
  t->set_raw_data(std::string(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float)));
  onnx::NodeProto* n = g->add_node();
  n->set_op_type(c.op);
  n->set_name(c.name);
  n->add_input("x");
  n->add_output("y");
  if (c.op != "GlobalAveragePool") {
    Ints(*n, "kernel_shape", c.kernel);
    Ints(*n, "strides", c.strides);
    Ints(*n, "dilations", c.dilations);
    Ints(*n, "pads", c.pads);
    Int(*n, "ceil_mode", c.ceil_mode);
    if (c.op == "AveragePool") Int(*n, "count_include_pad", c.count_include_pad);
  }
  onnx::ValueInfoProto* y = g->add_output();
  y->set_name("y");
  y->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  for (size_t i = 0; i < c.x.size(); ++i)  // the rank, sizes left to shape inference
    y->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_param("y" + std::to_string(i));
  return m;
}

std::unique_ptr<Backend> Device(std::string* skip) {
#ifdef SHOAL_TEST_HARNESS_ON_CPU
  (void)skip;
  return MakeCpuBackend(2);
#else
  std::string why;
  if (CudaDeviceCount(&why) == 0) {
    *skip = "no CUDA device: " + why;
    return nullptr;
  }
  return MakeCudaBackend(0);
#endif
}

struct Result {
  Shape shape;
  std::vector<float> y, dx;
};

// Forward in training mode, then backward of L = sum(y * r).
Result RunPool(Backend& be, const onnx::ModelProto& m, const std::string& name) {
  OnnxOptions o;
  o.any_output = true;
  std::unique_ptr<Model> model = ImportOnnx(m, name, be, o);
  EXPECT_EQ(model->parameters().size(), 1u) << name;
  Tensor data = be.Zeros({1, 1});
  model->ZeroGrad();
  const Tensor& y = model->Forward(data, true);
  Result r{y.shape(), std::vector<float>(size_t(y.numel())), {}};
  be.CopyToHost(y, r.y.data());
  std::vector<float> weights(r.y.size());
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = float(int(i % 7) - 3) * 0.25f;
  Tensor rt = be.Empty(y.shape());
  be.CopyFromHost(rt, weights.data());
  model->Backward(rt);
  const Tensor& g = model->parameters()[0].grad;
  r.dx.resize(size_t(g.numel()));
  be.CopyToHost(g, r.dx.data());
  return r;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << what << " element " << i;
}

TEST(CudaOnnxPool, EveryWindowKindMatchesTheCpuEngine) {
  std::string skip;
  std::unique_ptr<Backend> gpu = Device(&skip);
  if (!gpu) GTEST_SKIP() << skip;
  std::unique_ptr<Backend> cpu = MakeCpuBackend(2);
  const std::vector<PoolCase> cases = {
      {"max_2d_backend", "MaxPool", {2, 3, 9, 9}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}},
      {"avg_2d_backend_pads_counted", "AveragePool", {2, 3, 9, 9}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, 0, 1},
      {"max_1d_backend", "MaxPool", {2, 3, 10}, {3}, {2}, {}, {1, 1}},
      {"max_dilated_ceil", "MaxPool", {2, 3, 11, 12}, {3, 3}, {2, 2}, {2, 2}, {}, 1},
      {"max_uneven_pads", "MaxPool", {2, 3, 9, 8}, {3, 3}, {2, 2}, {}, {0, 1, 1, 0}},
      {"max_ceil", "MaxPool", {2, 3, 10, 9}, {3, 3}, {2, 2}, {}, {}, 1},
      {"avg_uneven_ceil", "AveragePool", {2, 3, 10, 9}, {3, 3}, {2, 2}, {}, {1, 0, 0, 1}, 1, 0},
      {"avg_uneven_ceil_pads_counted", "AveragePool", {2, 3, 10, 9}, {3, 3}, {2, 2}, {}, {1, 0, 0, 1}, 1, 1},
      {"avg_1d_ceil", "AveragePool", {2, 3, 10}, {3}, {2}, {}, {}, 1},
      {"max_3d", "MaxPool", {2, 2, 5, 7, 6}, {2, 3, 2}, {2, 2, 1}, {1, 1, 2}, {0, 1, 0, 1, 0, 1}, 1},
      {"avg_3d_pads_counted", "AveragePool", {1, 2, 6, 5, 7}, {3, 3, 3}, {2, 2, 2}, {}, {1, 1, 1, 1, 1, 1}, 0, 1},
      {"global_avg_3d", "GlobalAveragePool", {2, 3, 4, 5, 6}},
  };
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const PoolCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<float> x(size_t(NumElements(c.x)));
    for (float& v : x) v = u(rng);
    const onnx::ModelProto m = PoolModel(c, x);
    const Result want = RunPool(*cpu, m, c.name), got = RunPool(*gpu, m, c.name);
    ASSERT_EQ(got.shape, want.shape);
    ExpectClose(got.y, want.y, "y");
    ExpectClose(got.dx, want.dx, "dx");
  }
}

}  // namespace
}  // namespace shoal
