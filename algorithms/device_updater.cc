#include "algorithms/device_updater.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "algorithms/optimizers/optimizer_gpu.h"
#include "common/cuda/platform.h"
#include "common/error.h"

namespace shoal {
namespace {

class CudaDeviceUpdater : public DeviceUpdater {
 public:
  CudaDeviceUpdater(const Optimizer& optimizer, int device)
      : opt_(MakeDeviceOptimizer(optimizer.Name(), optimizer.hyper())), device_(device) {}

  void Apply(const ParamView& p, size_t index, const StepContext& ctx) override {
    SetDevice();
    // The legacy default stream: ordered after the backward kernels of every blocking stream.
    opt_->Apply(p.w, p.g, p.n, !p.no_weight_decay, ctx, &State(index, p.n), nullptr);
  }
  void Sync() override {
    SetDevice();
    CheckCuda(cudaStreamSynchronize(nullptr), "device optimizer \"" + opt_->Name() + "\"");
  }
  bool HasState(size_t index) const override { return index < states_.size() && states_[index]; }
  OptimizerState Download(size_t index) const override {
    SHOAL_CHECK(HasState(index), "device optimizer: no state for tensor " + std::to_string(index));
    const_cast<CudaDeviceUpdater*>(this)->SetDevice();
    return states_[index]->Download();
  }
  void Upload(size_t index, int64_t n, const OptimizerState& s) override {
    SetDevice();
    State(index, n).Upload(s);
  }
  void Clear() override { states_.clear(); }

 private:
  // The CUDA device is per thread; an updater may be called from any of the worker's.
  void SetDevice() { CheckCuda(cudaSetDevice(device_), "device optimizer: cudaSetDevice(" + std::to_string(device_) + ")"); }
  DeviceOptimizerState& State(size_t index, int64_t n) {
    if (states_.size() <= index) states_.resize(index + 1);
    auto& s = states_[index];
    if (!s) s = opt_->NewState(n);
    SHOAL_CHECK(s->n() == n, "device optimizer: tensor " + std::to_string(index) + " has " + std::to_string(n) +
                                 " elements, its state " + std::to_string(s->n()));
    return *s;
  }

  std::unique_ptr<DeviceOptimizer> opt_;
  int device_;
  std::vector<std::unique_ptr<DeviceOptimizerState>> states_;
};

}  // namespace

std::unique_ptr<DeviceUpdater> MakeCudaDeviceUpdater(const Optimizer& optimizer, int device) {
  return std::make_unique<CudaDeviceUpdater>(optimizer, device);
}

}  // namespace shoal
