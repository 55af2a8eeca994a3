#include "algorithms/optimizers/optimizer_gpu.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "algorithms/optimizers/optimizer_gpu_kernel.h"
#include "common/cuda/platform.h"
#include "common/error.h"

namespace shoal {
namespace {

struct Rule {
  GpuOptimizerKind kind;
  int slots;  // as many as the CPU rule creates (optimizer.cc's Slot calls)
};

const std::map<std::string, Rule>& Rules() {
  static const std::map<std::string, Rule> r = {
      {"sgd", {GpuOptimizerKind::kSgd, 0}},     {"momentum", {GpuOptimizerKind::kMomentum, 1}},
      {"lars", {GpuOptimizerKind::kLars, 1}},   {"lamb", {GpuOptimizerKind::kLamb, 2}},
      {"still", {GpuOptimizerKind::kStill, 3}}, {"rmsprop_sgd", {GpuOptimizerKind::kRmspropSgd, 2}},
      {"adam", {GpuOptimizerKind::kAdam, 2}},   {"adamw", {GpuOptimizerKind::kAdamW, 2}},
  };
  return r;
}

void NeedDevice(const std::string& what) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) throw Error(what + ": no CUDA device (" + why + ")");
}

}  // namespace

DeviceOptimizerState::DeviceOptimizerState(int slots, int64_t n) : n_(n) {
  SHOAL_CHECK(slots >= 0 && n >= 0,
              "DeviceOptimizerState: bad shape (" + std::to_string(slots) + " slots of " + std::to_string(n) + ")");
  NeedDevice("DeviceOptimizerState");
  try {
    CheckCuda(cudaMalloc(reinterpret_cast<void**>(&norms_), sizeof(double) * kGpuOptimizerScratch),
              "DeviceOptimizerState: cudaMalloc norms");
    for (int i = 0; i < slots; ++i) {
      float* p = nullptr;
      CheckCuda(cudaMalloc(reinterpret_cast<void**>(&p), sizeof(float) * size_t(std::max<int64_t>(n, 1))),
                "DeviceOptimizerState: cudaMalloc slot " + std::to_string(i));
      slots_.push_back(p);
      CheckCuda(cudaMemset(p, 0, sizeof(float) * size_t(n)), "DeviceOptimizerState: cudaMemset");
    }
  } catch (...) {
    for (float* p : slots_) cudaFree(p);
    cudaFree(norms_);
    throw;
  }
}

DeviceOptimizerState::~DeviceOptimizerState() {
  for (float* p : slots_) cudaFree(p);
  cudaFree(norms_);
}

void DeviceOptimizerState::Upload(const OptimizerState& s) {
  SHOAL_CHECK(s.slots.size() <= slots_.size(), "DeviceOptimizerState::Upload: " + std::to_string(s.slots.size()) +
                                                   " slots for a rule with " + std::to_string(slots_.size()));
  for (size_t i = 0; i < slots_.size(); ++i) {
    bool have = i < s.slots.size() && !s.slots[i].empty();
    if (have)
      SHOAL_CHECK(int64_t(s.slots[i].size()) == n_, "DeviceOptimizerState::Upload: slot " + std::to_string(i) +
                                                        " has " + std::to_string(s.slots[i].size()) + " floats for " +
                                                        std::to_string(n_) + " elements");
    CheckCuda(have ? cudaMemcpy(slots_[i], s.slots[i].data(), sizeof(float) * size_t(n_), cudaMemcpyHostToDevice)
                   : cudaMemset(slots_[i], 0, sizeof(float) * size_t(n_)),
              "DeviceOptimizerState::Upload slot " + std::to_string(i));
  }
  steps = s.steps;
}

OptimizerState DeviceOptimizerState::Download() const {
  OptimizerState s;
  s.steps = steps;
  s.slots.resize(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    s.slots[i].resize(size_t(n_));
    CheckCuda(cudaMemcpy(s.slots[i].data(), slots_[i], sizeof(float) * size_t(n_), cudaMemcpyDeviceToHost),
              "DeviceOptimizerState::Download slot " + std::to_string(i));
  }
  return s;
}

std::unique_ptr<DeviceOptimizerState> DeviceOptimizer::NewState(int64_t n) const {
  return std::make_unique<DeviceOptimizerState>(slots_, n);
}

void DeviceOptimizer::Apply(float* w, const float* g, int64_t n, bool decay, const StepContext& c,
                            DeviceOptimizerState* st, cudaStream_t stream) const {
  SHOAL_CHECK(st->n() == n && st->slots() == slots_,
              "DeviceOptimizer \"" + name_ + "\": a state of " + std::to_string(st->slots()) + " slots of " +
                  std::to_string(st->n()) + " for a tensor of " + std::to_string(n) + " (want " +
                  std::to_string(slots_) + " slots)");
  ++st->steps;
  GpuOptimizerArgs a;
  a.kind = GpuOptimizerKind(kind_);
  a.w = w;
  a.g = g;
  a.n = n;
  for (int i = 0; i < slots_; ++i) a.slot[i] = st->slot(i);
  a.norms = st->norms();
  a.lr = c.lr;
  a.wd = decay ? h_.weight_decay : 0.f;
  // The warm-up blend of STiLL and rmsprop_sgd, computed as their CPU rules do.
  a.share = c.warmup_steps > 0 ? std::min(1.0f, float(c.step) / float(c.warmup_steps)) : 1.0f;
  a.bc1 = 1.0 - std::pow(h_.beta1, double(st->steps));
  a.bc2 = 1.0 - std::pow(h_.beta2, double(st->steps));
  AdamScalars adam = AdamStepScalars(h_, a.kind == GpuOptimizerKind::kAdamW, a.wd, c.lr, st->steps);
  a.adam_b1 = adam.b1;
  a.adam_c1 = adam.c1;
  a.adam_b2 = adam.b2;
  a.adam_c2 = adam.c2;
  a.adam_step_size = adam.step_size;
  a.adam_bc2_sqrt = adam.bc2_sqrt;
  a.adam_shrink = adam.shrink;
  a.momentum = h_.momentum;
  a.nesterov = h_.nesterov;
  a.trust_coefficient = h_.trust_coefficient;
  a.beta1 = float(h_.beta1);
  a.beta2 = float(h_.beta2);
  a.eps = h_.eps;
  a.lamb_lr_ratio = h_.lamb_lr_ratio;
  a.rms_decay = h_.rms_decay;
  a.rms_eps = h_.rms_eps;
  a.rms_lr_ratio = h_.rms_lr_ratio;
  CheckCuda(GpuOptimizerApplyRaw(a, stream), "DeviceOptimizer \"" + name_ + "\" Apply");
}

std::unique_ptr<DeviceOptimizer> MakeDeviceOptimizer(const std::string& name, const OptimizerHyper& h) {
  auto it = Rules().find(name);
  if (it == Rules().end()) MakeOptimizer(name, h);  // the unknown-name error, with the known names
  SHOAL_CHECK(it != Rules().end(), "optimizer \"" + name + "\" has no CUDA form");
  return std::make_unique<DeviceOptimizer>(name, int(it->second.kind), it->second.slots, h);
}

std::unique_ptr<DeviceOptimizer> MakeDeviceOptimizer(const std::string& name, const ConfigSection& opts) {
  // MakeOptimizer reads and checks the hyper-parameters; one reader of [optimizer].
  return MakeDeviceOptimizer(name, MakeOptimizer(name, opts)->hyper());
}

}  // namespace shoal
