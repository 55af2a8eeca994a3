// Optimizers on device memory: the CUDA backend of optimizer.h. Same rules, same names, same
// hyper-parameters, same state slots (so a checkpointed OptimizerState moves between the
// two), applied to one whole tensor on a CUDA stream. The math is in optimizer_gpu.cu, once
// per rule; tests/algorithms/optimizer_gpu_test.cc holds it to Optimizer::Apply. A separate
// target (:optimizer_gpu) so CPU-only builds never link CUDA.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/optimizers/optimizer.h"
#include "common/config.h"

namespace shoal {

// One tensor's optimizer state in device memory: `Slots()` slots of n floats (zeroed) with
// the meaning and order of OptimizerState::slots, plus the scratch the norm pass sums into
// (per tensor, so tensors on different streams never share it). Owns its allocations.
class DeviceOptimizerState {
 public:
  DeviceOptimizerState(int slots, int64_t n);  // throws shoal::Error naming the CUDA failure
  ~DeviceOptimizerState();
  DeviceOptimizerState(const DeviceOptimizerState&) = delete;
  DeviceOptimizerState& operator=(const DeviceOptimizerState&) = delete;

  // Host <-> device copies (synchronous), for checkpoints and tests. An empty host slot
  // uploads as zeros (the CPU rules create slots lazily); a slot of another size is an error.
  void Upload(const OptimizerState& s);
  OptimizerState Download() const;

  int64_t n() const { return n_; }
  float* slot(int i) const { return slots_[size_t(i)]; }
  int slots() const { return int(slots_.size()); }
  double* norms() const { return norms_; }
  int64_t steps = 0;  // updates applied (LAMB's bias correction), as OptimizerState::steps

 private:
  int64_t n_;
  std::vector<float*> slots_;
  double* norms_ = nullptr;
};

class DeviceOptimizer {
 public:
  // w -= update(g) on device pointers, enqueued on `stream` (asynchronous; the state's
  // device slots change on the stream, its `steps` at once). `decay` false for bias and BN.
  void Apply(float* w, const float* g, int64_t n, bool decay, const StepContext& ctx, DeviceOptimizerState* state,
             cudaStream_t stream) const;
  // A zeroed state of the slots this rule keeps (OptimizerState's count after one step).
  std::unique_ptr<DeviceOptimizerState> NewState(int64_t n) const;
  const std::string& Name() const { return name_; }
  int Slots() const { return slots_; }
  const OptimizerHyper& hyper() const { return h_; }

  DeviceOptimizer(std::string name, int kind, int slots, const OptimizerHyper& h)
      : name_(std::move(name)), kind_(kind), slots_(slots), h_(h) {}

 private:
  std::string name_;
  int kind_;  // GpuOptimizerKind
  int slots_;
  OptimizerHyper h_;
};

// The CUDA registry: the names and [optimizer] keys of MakeOptimizer (its errors too).
std::unique_ptr<DeviceOptimizer> MakeDeviceOptimizer(const std::string& name, const OptimizerHyper& h);
std::unique_ptr<DeviceOptimizer> MakeDeviceOptimizer(const std::string& name, const ConfigSection& opts);

}  // namespace shoal
