// Every ONNX backend test case (Debian's libonnx-testdata, node/) whose operators Shoal
// supports, run through `shoal onnx run` and compared as ONNX's own runner does
// (rtol 1e-3, atol 1e-7). The cases that cannot pass are listed below with the reason; any
// other failure fails the test, and so does a listed case that starts passing.
// SHOAL_ONNX_DEVICE=cuda:N runs them on that device (skipped, saying why, without one) and
// SHOAL_ONNX_CASES=DIR reads the cases from DIR: `shoal gpu-check` sets both, with the cases
// packed into the bundle.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <dirent.h>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "common/cuda/platform.h"
#include "worker/engine/onnx/graph_layers.h"
#include "worker/engine/onnx/host_value.h"

namespace shoal {
namespace {

std::string Env(const char* name, const std::string& fallback) {
  const char* v = getenv(name);
  return v && *v ? v : fallback;
}

const std::string kRoot = Env("SHOAL_ONNX_CASES", "/usr/share/libonnx-testdata/data/node") + "/";
const std::string kDevice = Env("SHOAL_ONNX_DEVICE", "cpu");

// Cases of supported operators that do not pass, and why.
const std::map<std::string, std::string> kKnown = {
    {"test_reshape_allowzero_reordered", "a zero-size data input (a batch of no samples)"},
    {"test_split_zero_size_splits", "a zero-size data input (a batch of no samples)"},
    {"test_batchnorm_epsilon_training_mode",
     "the running variance is updated with the unbiased batch variance, as PyTorch does; ONNX's reference uses the "
     "biased one"},
    {"test_batchnorm_example_training_mode",
     "the running variance is updated with the unbiased batch variance, as PyTorch does; ONNX's reference uses the "
     "biased one"},
    {"test_training_dropout", "random masks: ONNX draws them with numpy's generator, Shoal with its own"},
    {"test_training_dropout_default", "random masks: ONNX draws them with numpy's generator, Shoal with its own"},
};

std::vector<std::string> Cases() {
  std::vector<std::string> out;
  DIR* d = opendir(kRoot.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d))
    if (std::string(e->d_name).rfind("test_", 0) == 0) out.push_back(e->d_name);
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

bool Read(const std::string& path, google::protobuf::Message* m) {
  std::ifstream f(path, std::ios::binary);
  return f && m->ParseFromIstream(&f);
}

std::string Bin() {
  const char* src = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  return (src && ws ? std::string(src) + "/" + ws : std::string("bazel-bin")) + "/tools/onnx/shoal-onnx";
}

// Runs one case; empty when it passes, else why not.
std::string RunCase(const std::string& name, const onnx::ModelProto& m) {
  const std::string dir = kRoot + name + "/", set = dir + "test_data_set_0/";
  const std::string out = ::testing::TempDir() + "/" + name;
  std::string cmd = Bin() + " run " + dir + "model.onnx --output_dir " + out + " --threads 1 --device " + kDevice;
  int inputs = 0;
  for (const onnx::ValueInfoProto& in : m.graph().input()) {
    bool init = false;
    for (const onnx::TensorProto& t : m.graph().initializer()) init = init || t.name() == in.name();
    if (!init) cmd += " --input " + set + "input_" + std::to_string(inputs++) + ".pb";
  }
  cmd += " > " + out + ".log 2>&1";
  const int rc = system(cmd.c_str());
  if (rc != 0) {
    std::ifstream log(out + ".log");
    std::string all((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    return "exit " + std::to_string(WEXITSTATUS(rc)) + ": " + all.substr(0, 300);
  }
  for (int k = 0; k < m.graph().output_size(); ++k) {
    onnx::TensorProto want, got;
    if (!Read(set + "output_" + std::to_string(k) + ".pb", &want)) return "no expected output " + std::to_string(k);
    if (!Read(out + "/output_" + std::to_string(k) + ".pb", &got)) return "no output " + std::to_string(k);
    const HostValue w = FromTensorProto(want, "expected"), g = FromTensorProto(got, "got");
    if (w.shape != g.shape) return "shape " + ShapeString(g.shape) + ", expected " + ShapeString(w.shape);
    for (size_t i = 0; i < w.v.size(); ++i)
      if (!(std::fabs(g.v[i] - w.v[i]) <= 1e-7 + 1e-3 * std::fabs(w.v[i])) &&
          !(std::isnan(w.v[i]) && std::isnan(g.v[i])))
        return "output " + std::to_string(k) + " element " + std::to_string(i) + ": " + std::to_string(g.v[i]) +
               ", expected " + std::to_string(w.v[i]);
  }
  return "";
}

TEST(OnnxBackendCases, EverySupportedCasePasses) {
  if (kDevice.rfind("cuda", 0) == 0) {
    std::string why;
    if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  }
  const std::vector<std::string>& ops = SupportedOperators();
  const std::set<std::string> supported(ops.begin(), ops.end());
  std::vector<std::pair<std::string, onnx::ModelProto>> cases;
  for (const std::string& name : Cases()) {
    onnx::ModelProto m;
    if (!Read(kRoot + name + "/model.onnx", &m)) continue;
    bool all = m.graph().node_size() > 0;
    for (const onnx::NodeProto& n : m.graph().node()) all = all && supported.count(n.op_type()) && n.domain().empty();
    // Float outputs (Shoal's tensors are fp32), inputs and initializers of the types it reads.
    static const std::set<int> kTypes = {
        onnx::TensorProto::FLOAT, onnx::TensorProto::DOUBLE, onnx::TensorProto::FLOAT16, onnx::TensorProto::INT64,
        onnx::TensorProto::INT32, onnx::TensorProto::INT8,   onnx::TensorProto::UINT8,   onnx::TensorProto::BOOL};
    for (const onnx::ValueInfoProto& o : m.graph().output())
      all = all && (o.type().tensor_type().elem_type() == onnx::TensorProto::FLOAT);
    for (const onnx::ValueInfoProto& i : m.graph().input())
      all = all && kTypes.count(i.type().tensor_type().elem_type());
    for (const onnx::TensorProto& t : m.graph().initializer()) all = all && kTypes.count(t.data_type());
    if (all) cases.emplace_back(name, std::move(m));
  }
  // Several at a time (two on CI's two cores): each run is mostly process start-up.
  const size_t width = std::clamp<size_t>(std::thread::hardware_concurrency() / 2, 2, 8);
  std::vector<std::string> why(cases.size());
  std::vector<std::thread> runners;
  for (size_t t = 0; t < width; ++t)
    runners.emplace_back([&, t] {
      for (size_t i = t; i < cases.size(); i += width) why[i] = RunCase(cases[i].first, cases[i].second);
    });
  for (std::thread& r : runners) r.join();
  const int tried = int(cases.size());
  int passed = 0;
  std::vector<std::string> unexpected;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string& name = cases[i].first;
    if (why[i].empty()) {
      ++passed;
      EXPECT_EQ(kKnown.count(name), 0u) << name << " passes now: take it off the known list";
    } else if (!kKnown.count(name)) {
      unexpected.push_back(name + ": " + why[i]);
    }
  }
  printf("ONNX backend cases with only supported operators and float outputs, on %s: %d tried, %d passed\n",
         kDevice.c_str(), tried, passed);
  for (const std::string& u : unexpected) ADD_FAILURE() << u;
  EXPECT_GT(tried, 100);
}

}  // namespace
}  // namespace shoal
