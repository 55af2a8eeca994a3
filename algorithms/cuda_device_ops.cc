#include "algorithms/cuda_device_ops.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "algorithms/device_scale.h"
#include "algorithms/optimizers/optimizer_gpu.h"
#include "common/cuda/platform.h"
#include "common/error.h"

namespace shoal {
namespace {

// The CUDA device is per thread; ops may be called from any of the worker's threads.
void SetDevice(int device) {
  CheckCuda(cudaSetDevice(device), "device ops: cudaSetDevice(" + std::to_string(device) + ")");
}

class CudaDeviceUpdater : public DeviceUpdater {
 public:
  CudaDeviceUpdater(const Optimizer& optimizer, int device)
      : opt_(MakeDeviceOptimizer(optimizer.Name(), optimizer.hyper())), device_(device) {}

  void Apply(const ParamView& p, size_t index, const StepContext& ctx) override {
    SetDevice();
    // The default stream. The backend's stream is non-blocking, so this is ordered after the
    // backward kernels by the trainer's Synchronize before Step, not by the stream.
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
  void SetDevice() { shoal::SetDevice(device_); }
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

class CudaDeviceOps : public DeviceOps {
 public:
  explicit CudaDeviceOps(int device) : device_(device) {}
  std::unique_ptr<DeviceUpdater> NewUpdater(const Optimizer& optimizer) override {
    return std::make_unique<CudaDeviceUpdater>(optimizer, device_);
  }
  float* Alloc(int64_t n) override {
    SetDevice(device_);
    float* p = nullptr;
    const size_t bytes = sizeof(float) * size_t(n > 0 ? n : 1);
    CheckCuda(cudaMalloc(reinterpret_cast<void**>(&p), bytes),
              "device ops: cudaMalloc of " + std::to_string(bytes) + " bytes");
    CheckCuda(cudaMemset(p, 0, bytes), "device ops: cudaMemset");
    // cudaMemset of device memory is asynchronous to the host (on the default stream), and
    // the buffer may next be touched from a non-blocking stream (NCCL's, a test's), which
    // the default stream does not order: wait, so "zeroed" holds for every stream.
    CheckCuda(cudaStreamSynchronize(nullptr), "device ops: cudaMemset");
    return p;
  }
  void Free(float* p) override {
    SetDevice(device_);
    cudaFree(p);
  }
  void Copy(float* dst, const float* src, int64_t n) override {
    if (n <= 0) return;
    SetDevice(device_);
    CheckCuda(cudaMemcpyAsync(dst, src, sizeof(float) * size_t(n), cudaMemcpyDeviceToDevice, nullptr),
              "device ops: copy");
    CheckCuda(cudaStreamSynchronize(nullptr), "device ops: copy");  // a D2D cudaMemcpy may return early
  }
  void Scale(float* p, int64_t n, float f) override {
    SetDevice(device_);
    CheckCuda(ScaleFloatsDevice(p, n, f, nullptr), "device ops: scale");
    CheckCuda(cudaStreamSynchronize(nullptr), "device ops: scale");
  }
  void CopyQueued(float* dst, const float* src, int64_t n) override {
    if (n <= 0) return;
    SetDevice(device_);
    CheckCuda(cudaMemcpyAsync(dst, src, sizeof(float) * size_t(n), cudaMemcpyDeviceToDevice, nullptr),
              "device ops: queued copy");
  }
  void ScaleQueued(float* p, int64_t n, float f) override {
    SetDevice(device_);
    CheckCuda(ScaleFloatsDevice(p, n, f, nullptr), "device ops: queued scale");
  }
  std::shared_ptr<const DeviceFence> Record() override {
    SetDevice(device_);
    return RecordCudaFence(nullptr, "device ops: Record");
  }
  bool AllFinite(const std::vector<std::pair<const float*, int64_t>>& spans) override {
    SetDevice(device_);
    std::lock_guard<std::mutex> lock(flag_mu_);  // one flag; calls may come from any thread
    if (!flag_)
      CheckCuda(cudaMalloc(reinterpret_cast<void**>(&flag_), sizeof(int)), "device ops: cudaMalloc of the finite flag");
    CheckCuda(cudaMemsetAsync(flag_, 0, sizeof(int), nullptr), "device ops: finite check");
    for (auto& [p, n] : spans) CheckCuda(FlagNonFiniteDevice(p, n, flag_, nullptr), "device ops: finite check");
    int bad = 0;
    CheckCuda(cudaMemcpy(&bad, flag_, sizeof(int), cudaMemcpyDeviceToHost), "device ops: finite check");
    return bad == 0;
  }
  // The stream every op here uses (the default one) waits on the event; the host goes on.
  void After(const DeviceFence* fence) override {
    if (!fence) return;
    SetDevice(device_);
    CheckCuda(cudaStreamWaitEvent(nullptr, static_cast<cudaEvent_t>(fence->native()), 0),
              "device ops: wait on a fence");
  }
  ~CudaDeviceOps() override {
    if (flag_) {
      cudaSetDevice(device_);
      cudaFree(flag_);
    }
  }

 private:
  int device_;
  std::mutex flag_mu_;
  int* flag_ = nullptr;
};

}  // namespace

std::shared_ptr<DeviceOps> MakeCudaDeviceOps(int device) { return std::make_shared<CudaDeviceOps>(device); }

}  // namespace shoal
