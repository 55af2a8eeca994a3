// Training throughput of the engine on one backend: forward + backward + SGD-momentum
// update (momentum 0.9, weight decay 5e-4 on weights, lr 0.025), batch 64 by default, on
// random inputs. Prints one JSON line; samples_per_s is batch / median step time, peak_bytes
// the most device memory the backend's allocator had handed out at once (memory_counter.h),
// plan_* the memory plan's shared block and its buffers unshared (memory_plan.h):
//   {"bench":"engine_cpp","model":..,"threads":..,"batch":..,"samples_per_s":..,"mean_samples_per_s":..,"step_ms":..,
//    "memory_reuse":..,"peak_bytes":..,"plan_block_bytes":..,"plan_buffer_bytes":..}
// --estimate_batch N trains nothing: it prints what a step at batch N would hold, from the
// plan (computed without allocating) and the model's sizes ({"bench":"engine_memory",...}).
#include <gflags/gflags.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "common/error.h"
#include "worker/engine/model.h"
#include "worker/engine/onnx/onnx_import.h"

DEFINE_string(model, "lenet", "mlp | lenet | resnet20 | resnet50");
DEFINE_string(device, "cpu", "cpu | cuda:N");
DEFINE_int32(threads, 2, "CPU threads (0 = all cores)");
DEFINE_int32(batch, 64, "batch size");
DEFINE_string(
    precision, "fp32",
    "fp32 | tf32 (CUDA: TF32 tensor cores; CPU: fp32) | bf16 | fp16 (CUDA only): the arithmetic of convolutions and "
    "fully connected layers");
DEFINE_int32(warmup, 5, "untimed steps first");
DEFINE_double(seconds, 5.0, "time to measure for (at least 5 steps)");
DEFINE_bool(memory_reuse, true, "share activation and gradient buffers by liveness (Model::set_memory_reuse)");
DEFINE_int32(estimate_batch, 0, "print the memory a step at this batch would hold instead of training");
DEFINE_string(onnx, "",
              "an ONNX file to train instead of a zoo model (--model then only names it); 1x28x28 input, "
              "10 classes");

namespace shoal {
namespace {

Shape InputOf(const std::string& model) {
  if (model == "resnet20") return {3, 32, 32};
  if (model == "resnet50") return {3, 224, 224};
  return {1, 28, 28};
}

// The memory one training step of this zoo model holds at `batch`, by parts, without
// running it: weights, their gradients and the momentum buffer; the input; the activations
// and gradients unshared and in the plan's block; and the narrow copies of every
// convolution's input a mixed-precision CUDA backend keeps for the backward (2 bytes an
// element; its scratch and cuDNN's workspace are not counted).
int Estimate(Model& m, const Shape& sample) {
  Shape xs = {FLAGS_estimate_batch};
  xs.insert(xs.end(), sample.begin(), sample.end());
  std::vector<Shape> shapes;
  const MemoryPlan plan = m.PlanFor(xs, true, &shapes);
  int64_t conv_inputs = 0;
  for (int id = 1; id < m.NumNodes(); ++id)
    if (m.NodeLayer(id)->Kind() == "Conv2d") conv_inputs += NumElements(shapes[size_t(m.NodeInputs(id)[0])]);
  const int64_t params = 3 * 4 * m.NumParams(), input = 4 * NumElements(xs), narrow = 2 * conv_inputs;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  printf(
      "{\"bench\":\"engine_memory\",\"model\":\"%s\",\"batch\":%d,\"params_grads_momentum_bytes\":%lld,"
      "\"input_bytes\":%lld,\"activations_unshared_bytes\":%lld,\"activations_block_bytes\":%lld,"
      "\"bf16_conv_input_copies_bytes\":%lld,\"mixed_cuda_gib_without_reuse\":%.2f,\"mixed_cuda_gib_with_reuse\":%.2f}"
      "\n",
      FLAGS_model.c_str(), FLAGS_estimate_batch, (long long)params, (long long)input, (long long)plan.buffer_bytes,
      (long long)plan.block_bytes, (long long)narrow, double(params + input + plan.buffer_bytes + narrow) / gib,
      double(params + input + plan.block_bytes + narrow) / gib);
  return 0;
}

int Run() {
  std::unique_ptr<Backend> be = MakeBackend(ParseDevice(FLAGS_device), FLAGS_threads, ParsePrecision(FLAGS_precision));
  ModelOptions mo;
  mo.input_shape = InputOf(FLAGS_model);
  mo.num_classes = 10;
  std::unique_ptr<Model> m;
  if (FLAGS_onnx.empty()) {
    m = MakeModel(FLAGS_model, *be, mo);
  } else {
    mo.input_shape = {1, 28, 28};
    OnnxOptions oo;
    oo.input_shape = mo.input_shape;
    oo.num_classes = 10;
    oo.batch = FLAGS_batch;
    m = ImportOnnx(FLAGS_onnx, *be, oo);
  }
  m->InitParameters(1);
  m->set_memory_reuse(FLAGS_memory_reuse);
  if (FLAGS_estimate_batch > 0) return Estimate(*m, mo.input_shape);
  SHOAL_CHECK(FLAGS_batch > 0, "--batch must be positive");

  std::mt19937_64 rng(2);
  std::normal_distribution<float> d(0, 1);
  Shape xs = {FLAGS_batch};
  xs.insert(xs.end(), mo.input_shape.begin(), mo.input_shape.end());
  std::vector<float> xh(size_t(NumElements(xs)));
  for (float& v : xh) v = d(rng);
  std::vector<int32_t> labels(static_cast<size_t>(FLAGS_batch));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t(i % 10);
  Tensor x = be->Empty(xs);
  be->CopyFromHost(x, xh.data());

  // momentum buffers live on the device next to the parameters
  std::vector<Tensor> vel;
  for (Parameter& p : m->parameters()) vel.push_back(be->Zeros(p.value.shape()));
  const float lr = 0.025f, mom = 0.9f, wd = 5e-4f;
  auto step = [&] {
    m->ZeroGrad();
    m->TrainStep(x, labels.data());
    auto& ps = m->parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      if (!ps[i].no_weight_decay) be->Axpy(wd, ps[i].value, ps[i].grad);
      be->Scale(mom, vel[i]);
      be->Axpy(1.0f, ps[i].grad, vel[i]);
      be->Axpy(-lr, vel[i], ps[i].value);
    }
  };
  for (int i = 0; i < FLAGS_warmup; ++i) step();
  be->Synchronize();
  // Per-step times: the median resists the other tenants of a shared machine; the mean
  // is reported beside it.
  using Clock = std::chrono::steady_clock;
  // process CPU time (all threads): with other tenants on the machine it moves far less
  // than wall time, so it tells compute cost apart from waiting for a core
  auto cpu_s = [] {
    rusage u;
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  const double cpu0 = cpu_s();
  std::vector<double> times;
  const auto t0 = Clock::now();
  double el = 0;
  while (times.size() < 5 || el < FLAGS_seconds) {
    const auto s0 = Clock::now();
    step();
    be->Synchronize();
    const auto s1 = Clock::now();
    times.push_back(std::chrono::duration<double>(s1 - s0).count());
    el = std::chrono::duration<double>(s1 - t0).count();
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double mean = el / double(times.size());
  const double cpu_ms = 1000.0 * (cpu_s() - cpu0) / double(times.size());
  printf(
      "{\"bench\":\"engine_cpp\",\"precision\":\"%s\",\"model\":\"%s\",\"device\":\"%s\",\"backend\":\"%s\","
      "\"threads\":%d,\"batch\":%d,"
      "\"steps\":%zu,\"samples_per_s\":%.1f,\"mean_samples_per_s\":%.1f,\"step_ms\":%.3f,\"cpu_ms_per_step\":%.3f,"
      "\"memory_reuse\":%s,\"peak_bytes\":%lld,\"plan_block_bytes\":%lld,\"plan_buffer_bytes\":%lld}\n",
      FLAGS_precision.c_str(), FLAGS_model.c_str(), FLAGS_device.c_str(), be->Name().c_str(), FLAGS_threads,
      FLAGS_batch, times.size(), FLAGS_batch / median, FLAGS_batch / mean, 1000.0 * median, cpu_ms,
      FLAGS_memory_reuse ? "true" : "false", (long long)be->Memory().peak_bytes,
      (long long)m->memory_plan().block_bytes, (long long)m->memory_plan().buffer_bytes);
  return 0;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  gflags::SetUsageMessage("engine training throughput");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  try {
    return shoal::Run();
  } catch (const shoal::Error& e) {
    fprintf(stderr, "engine_bench: %s\n", e.what());
    return 1;
  }
}
