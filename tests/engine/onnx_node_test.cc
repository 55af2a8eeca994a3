// Imported operators against ONNX's own backend test cases (Debian's libonnx-testdata):
// the forward pass must reproduce each case's expected output, and the backward pass must
// match central finite differences of the same graph.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "common/error.h"
#include "tests/engine/grad_check.h"
#include "worker/engine/backend.h"
#include "worker/engine/model.h"
#include "worker/engine/onnx/host_value.h"
#include "worker/engine/onnx/onnx_import.h"

namespace shoal {
namespace {

const char* kRoot = "/usr/share/libonnx-testdata/data/node/";

onnx::TensorProto ReadTensor(const std::string& path) {
  onnx::TensorProto t;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f && t.ParseFromIstream(&f)) << path;
  return t;
}

onnx::ModelProto ReadModel(const std::string& path) {
  onnx::ModelProto m;
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f && m.ParseFromIstream(&f)) << path;
  return m;
}

std::string Save(const onnx::ModelProto& m, const std::string& tag) {
  const std::string path = ::testing::TempDir() + "/" + tag + "_" + std::to_string(getpid()) + ".onnx";
  std::ofstream f(path, std::ios::binary);
  m.SerializeToOstream(&f);
  return path;
}

// Turns graph input k (k >= first) into an initializer holding `value`.
void InputToInitializer(onnx::ModelProto& m, int k, onnx::TensorProto value) {
  value.set_name(m.graph().input(k).name());
  *m.mutable_graph()->add_initializer() = value;
}

void DropInputs(onnx::ModelProto& m, int first) {
  auto* in = m.mutable_graph()->mutable_input();
  while (in->size() > first) in->RemoveLast();
}

// Gives a graph whose inputs all became initializers the 1x1 data input an import needs (its
// value is never read), at an IR version where initializers need not be inputs (4).
void AddUnreadDataInput(onnx::ModelProto& m) {
  m.set_ir_version(std::max<int64_t>(m.ir_version(), 4));
  onnx::ValueInfoProto* dummy = m.mutable_graph()->add_input();
  dummy->set_name("shoal_test_data");
  dummy->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  dummy->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(1);
  dummy->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(1);
}

class OnnxNodeCase : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { be_ = MakeCpuBackend(1); }
  std::unique_ptr<Backend> be_;
};

// Input 0 is the data; the others become initializers. The output must match.
TEST_P(OnnxNodeCase, ForwardMatchesExpectedOutput) {
  const std::string dir = std::string(kRoot) + GetParam() + "/";
  onnx::ModelProto m = ReadModel(dir + "model.onnx");
  const int inputs = m.graph().input_size();
  std::vector<onnx::TensorProto> in;
  for (int k = 0; k < inputs; ++k) in.push_back(ReadTensor(dir + "test_data_set_0/input_" + std::to_string(k) + ".pb"));
  for (int k = 1; k < inputs; ++k) InputToInitializer(m, k, in[size_t(k)]);
  DropInputs(m, 1);
  OnnxOptions o;
  o.any_output = true;
  o.batch = in[0].dims_size() ? in[0].dims(0) : 1;
  std::unique_ptr<Model> model = ImportOnnx(Save(m, GetParam()), *be_, o);
  const HostValue x = FromTensorProto(in[0], "input_0");
  const HostValue want = FromTensorProto(ReadTensor(dir + "test_data_set_0/output_0.pb"), "output_0");
  Tensor xt = be_->Empty(x.shape);
  std::vector<float> xf(x.v.begin(), x.v.end());
  be_->CopyFromHost(xt, xf.data());
  const Tensor& y = model->Forward(xt, false);
  ASSERT_EQ(y.shape(), want.shape);
  const std::vector<float> got = testing_util::Host(*be_, y);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want.v[i], 1e-4 + 1e-4 * std::fabs(want.v[i])) << "element " << i;
}

// Every float input becomes a trained initializer (the data is an unused stand-in), and each
// one's gradient of L = sum(y * r) must match central differences.
TEST_P(OnnxNodeCase, BackwardMatchesFiniteDifferences) {
  // Random masks differ between the probes' forward passes.
  if (GetParam().find("dropout") != std::string::npos) GTEST_SKIP() << "dropout draws a new mask per pass";
  const std::string dir = std::string(kRoot) + GetParam() + "/";
  onnx::ModelProto m = ReadModel(dir + "model.onnx");
  const int inputs = m.graph().input_size();
  for (int k = 0; k < inputs; ++k) {
    onnx::TensorProto t = ReadTensor(dir + "test_data_set_0/input_" + std::to_string(k) + ".pb");
    InputToInitializer(m, k, t);
  }
  DropInputs(m, 0);
  AddUnreadDataInput(m);
  OnnxOptions o;
  o.any_output = true;
  std::unique_ptr<Model> model = ImportOnnx(Save(m, GetParam() + "_grad"), *be_, o);
  ASSERT_FALSE(model->parameters().empty()) << "no trainable input";
  Tensor x = be_->Zeros({1, 1});
  std::mt19937_64 rng(7);
  const Tensor& y0 = model->Forward(x, true);
  std::vector<float> r(size_t(y0.numel()));
  std::uniform_real_distribution<float> d(-1, 1);
  for (float& v : r) v = d(rng);
  Tensor rt = be_->Empty(y0.shape());
  be_->CopyFromHost(rt, r.data());
  model->ZeroGrad();
  model->Forward(x, true);
  model->Backward(rt);
  auto loss = [&] { return testing_util::Dot(*be_, model->Forward(x, true), r); };
  testing_util::GradCheckResult res;
  for (Parameter& p : model->parameters()) {
    const std::vector<float> g = testing_util::Host(*be_, p.grad);
    testing_util::Probe(*be_, p.value, g, loss, p.name, 3e-3, 24, &res);
  }
  EXPECT_GT(res.checked, 0);
  EXPECT_LT(res.max_err, 2e-2) << res.where;
}

// Average pooling with uneven pads and a ceil_mode window running past the input, counting
// the pads and not: the output and the input's gradient of L = sum(y * [1, 2, 3, 4]) equal
// PyTorch's (torch 1.13: avg_pool2d(pad(x, (1, 0, 0, 0)), 3, 2, ceil_mode=True), divided by
// the same pooling of the padded ones mask when the pads do not count). ONNX's own cases
// have no uneven pads with count_include_pad = 1.
TEST(OnnxPooling, AveragePoolUnevenPadsAndCeilModeMatchPyTorch) {
  const std::string dir = std::string(kRoot) + "test_averagepool_2d_ceil/";
  const onnx::TensorProto x = ReadTensor(dir + "test_data_set_0/input_0.pb");  // 1x1x4x4: 1 to 16
  const std::vector<float> want_y[2] = {{5.5f, 7.0f, 11.5f, 13.0f}, {11.0f / 3, 7.0f, 23.0f / 3, 13.0f}};
  const std::vector<float> want_dx[2] = {{1.f / 6, 7.f / 18, 2.f / 9, 2.f / 9, 1.f / 6, 7.f / 18, 2.f / 9, 2.f / 9,
                                          11.f / 12, 65.f / 36, 8.f / 9, 8.f / 9, 0.75f, 17.f / 12, 2.f / 3, 2.f / 3},
                                         {1.f / 9, 1.f / 3, 2.f / 9, 2.f / 9, 1.f / 9, 1.f / 3, 2.f / 9, 2.f / 9,
                                          11.f / 18, 1.5f, 8.f / 9, 8.f / 9, 0.5f, 7.f / 6, 2.f / 3, 2.f / 3}};
  for (int include = 0; include < 2; ++include) {
    SCOPED_TRACE("count_include_pad " + std::to_string(include));
    onnx::ModelProto m = ReadModel(dir + "model.onnx");
    onnx::NodeProto* node = m.mutable_graph()->mutable_node(0);
    onnx::AttributeProto* pads = node->add_attribute();
    pads->set_name("pads");
    pads->set_type(onnx::AttributeProto::INTS);
    for (int64_t v : {0, 1, 0, 0}) pads->add_ints(v);  // H begin, W begin, H end, W end
    onnx::AttributeProto* count = node->add_attribute();
    count->set_name("count_include_pad");
    count->set_type(onnx::AttributeProto::INT);
    count->set_i(include);
    // x becomes a trained initializer, so its gradient is a parameter's.
    InputToInitializer(m, 0, x);
    DropInputs(m, 0);
    AddUnreadDataInput(m);
    OnnxOptions o;
    o.any_output = true;
    auto be = MakeCpuBackend(1);
    std::unique_ptr<Model> model = ImportOnnx(Save(m, "avgpool_uneven_" + std::to_string(include)), *be, o);
    ASSERT_EQ(model->parameters().size(), 1u);
    Tensor data = be->Zeros({1, 1});
    model->ZeroGrad();
    const Tensor& y = model->Forward(data, true);
    ASSERT_EQ(y.shape(), Shape({1, 1, 2, 2}));
    const std::vector<float> got = testing_util::Host(*be, y);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want_y[include][i], 1e-5) << "y " << i;
    const std::vector<float> r = {1, 2, 3, 4};
    Tensor rt = be->Empty(y.shape());
    be->CopyFromHost(rt, r.data());
    model->Backward(rt);
    const std::vector<float> dx = testing_util::Host(*be, model->parameters()[0].grad);
    ASSERT_EQ(dx.size(), 16u);
    for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx[i], want_dx[include][i], 1e-5) << "dx " << i;
  }
}

// Cases whose forward is checked; their backward too unless listed in kForwardOnly.
const std::vector<std::string> kCases = {
    "test_add",
    "test_add_bcast",
    "test_sub",
    "test_sub_bcast",
    "test_mul",
    "test_mul_bcast",
    "test_div",
    "test_div_bcast",
    "test_pow",
    "test_pow_bcast_array",
    "test_relu",
    "test_leakyrelu",
    "test_leakyrelu_default",
    "test_sigmoid",
    "test_tanh",
    "test_erf",
    "test_sqrt",
    "test_exp",
    "test_neg",
    "test_abs",
    "test_reciprocal",
    "test_clip",
    "test_clip_splitbounds",
    "test_softmax_axis_0",
    "test_softmax_axis_1",
    "test_softmax_axis_2",
    "test_softmax_default_axis",
    "test_softmax_negative_axis",
    "test_logsoftmax_axis_1",
    "test_logsoftmax_default_axis",
    "test_conv_with_strides_padding",
    "test_conv_with_strides_no_padding",
    "test_conv_with_autopad_same",
    "test_conv_with_strides_and_asymmetric_padding",
    "test_basic_conv_with_padding",
    "test_basic_conv_without_padding",
    "test_batchnorm_epsilon",
    "test_batchnorm_example",
    "test_maxpool_2d_default",
    "test_maxpool_2d_pads",
    "test_maxpool_2d_strides",
    "test_maxpool_1d_default",
    "test_maxpool_2d_same_upper",
    "test_maxpool_2d_same_lower",
    "test_maxpool_2d_ceil",
    "test_maxpool_2d_dilations",
    "test_maxpool_3d_default",
    "test_averagepool_2d_default",
    "test_averagepool_2d_pads",
    "test_averagepool_2d_pads_count_include_pad",
    "test_averagepool_2d_strides",
    "test_averagepool_1d_default",
    "test_averagepool_2d_same_upper",
    "test_averagepool_2d_same_lower",
    "test_averagepool_2d_ceil",
    "test_averagepool_3d_default",
    "test_globalaveragepool",
    "test_gemm_all_attributes",
    "test_gemm_alpha",
    "test_gemm_beta",
    "test_gemm_transposeA",
    "test_gemm_transposeB",
    "test_gemm_default_matrix_bias",
    "test_gemm_default_vector_bias",
    "test_gemm_default_no_bias",
    "test_matmul_2d",
    "test_matmul_3d",
    "test_matmul_4d",
    "test_layer_normalization_2d_axis1",
    "test_layer_normalization_3d_axis1_epsilon",
    "test_layer_normalization_4d_axis_negative_1",
    "test_layer_normalization_default_axis",
    "test_flatten_axis1",
    "test_flatten_default_axis",
    "test_reshape_reordered_all_dims",
    "test_reshape_negative_dim",
    "test_reshape_zero_dim",
    "test_transpose_default",
    "test_transpose_all_permutations_3",
    "test_unsqueeze_axis_1",
    "test_squeeze",
    "test_concat_2d_axis_1",
    "test_concat_3d_axis_negative_2",
    "test_split_equal_parts_1d",
    "test_split_variable_parts_2d",
    "test_slice",
    "test_slice_neg_steps",
    "test_slice_default_axes",
    "test_gather_0",
    "test_gather_1",
    "test_gather_negative_indices",
    "test_expand_dim_changed",
    "test_expand_dim_unchanged",
    "test_where_example",
    "test_reduce_mean_keepdims_example",
    "test_reduce_mean_do_not_keepdims_example",
    "test_reduce_sum_keepdims_example",
    "test_constant_pad",
    "test_identity",
    "test_dropout_default",
    "test_cast_DOUBLE_to_FLOAT",
};

INSTANTIATE_TEST_SUITE_P(Node, OnnxNodeCase, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param.substr(5); });

}  // namespace
}  // namespace shoal
