#include "algorithms/collectives/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "algorithms/collectives/wire_cast_kernel.h"
#include "common/error.h"
#include "common/cuda/platform.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;

std::string Hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    uint8_t b = static_cast<const uint8_t*>(p)[i];
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

void Unhex(const std::string& s, void* out, size_t n) {
  SHOAL_CHECK(s.size() == 2 * n, "nccl: the published unique id has " + std::to_string(s.size()) +
                                     " hex digits, expected " + std::to_string(2 * n));
  auto val = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw Error("nccl: the published unique id is not hex");
  };
  for (size_t i = 0; i < n; ++i) static_cast<uint8_t*>(out)[i] = uint8_t(val(s[2 * i]) << 4 | val(s[2 * i + 1]));
}

}  // namespace

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* dev = nullptr;  // staging buffer on the GPU (host buffers; the fp16/bf16 wire of device ones)
  size_t dev_bytes = 0;
  std::vector<uint8_t> host;  // fp16/bf16 wire encoding
  int timeout_ms = 0;
  int rank = 0;
  int device = 0;
  bool aborted = false;

  // NCCL calls in non-blocking mode may return ncclInProgress: wait, bounded, for the
  // communicator to settle; on error or timeout abort it so no rank is left hanging.
  void Settle(ncclResult_t r, const std::string& what) {
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (r == ncclInProgress) {
      if (Clock::now() > deadline)
        Fail(what + ": no progress for " + std::to_string(timeout_ms) + " ms (a rank stopped?)");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      ncclCommGetAsyncError(comm, &r);
    }
    if (r != ncclSuccess) Fail(what + ": " + ncclGetErrorString(r));
  }
  // Waits for the stream (the collective's completion), watching NCCL's async errors.
  void Finish(const std::string& what) {
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) {
        cudaGetLastError();
        Fail(what + ": " + cudaGetErrorString(e));
      }
      ncclResult_t r = ncclSuccess;
      ncclCommGetAsyncError(comm, &r);
      if (r != ncclSuccess && r != ncclInProgress) Fail(what + ": " + ncclGetErrorString(r));
      if (Clock::now() > deadline)
        Fail(what + ": not done after " + std::to_string(timeout_ms) + " ms (a rank stopped?)");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  // Staging -> host once the collective has finished (Finish): the stream is idle, so the
  // copy cannot wait on a peer.
  void Download(void* dst, const void* src, size_t bytes, const std::string& what) {
    CheckCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), "nccl " + what + ": download");
    CheckCuda(cudaStreamSynchronize(stream), "nccl " + what + ": download");
  }
  [[noreturn]] void Fail(const std::string& why) {
    if (comm && !aborted) {
      ncclCommAbort(comm);
      aborted = true;
      comm = nullptr;
    }
    throw Error("nccl rank " + std::to_string(rank) + ": " + why);
  }
  void* Staging(size_t bytes) {
    if (bytes > dev_bytes) {
      if (dev) cudaFree(dev);
      dev = nullptr;
      CheckCuda(cudaMalloc(&dev, bytes), "nccl: staging buffer of " + std::to_string(bytes) + " bytes");
      dev_bytes = bytes;
    }
    return dev;
  }
  // Before every call: the communicator is usable and this thread is on its device (the
  // CUDA device is per thread, and an overlapped all-reduce runs on its own thread).
  void Usable() {
    if (!comm)
      throw Error("nccl rank " + std::to_string(rank) + ": the communicator was aborted by an earlier failure");
    CheckCuda(cudaSetDevice(device), "nccl: cudaSetDevice(" + std::to_string(device) + ")");
  }
  // Device (or managed) memory: reduced in place, no staging. Host memory, pinned or not,
  // takes the copying path.
  static bool OnDevice(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // an unknown pointer is host memory to older runtimes
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  ncclDataType_t Wire(DType wire) const {
    return wire == DType::kF32 ? ncclFloat32 : wire == DType::kF16 ? ncclFloat16 : ncclBfloat16;
  }
};

NcclComm::NcclComm(int rank, int size, Store& store, const NcclOptions& opts)
    : impl_(std::make_unique<Impl>()), rank_(rank), size_(size) {
  SHOAL_CHECK(size >= 1 && rank >= 0 && rank < size,
              "nccl: rank " + std::to_string(rank) + " outside size " + std::to_string(size));
  std::string why;
  int n = CudaDeviceCount(&why);
  if (n == 0) throw Error("nccl: no CUDA device: " + why);
  SHOAL_CHECK(opts.device >= 0 && opts.device < n,
              "nccl: cuda:" + std::to_string(opts.device) + " does not exist (" + std::to_string(n) + " device(s))");
  impl_->timeout_ms = opts.timeout_ms;
  impl_->rank = rank;
  impl_->device = opts.device;
  CheckCuda(cudaSetDevice(opts.device), "nccl: cudaSetDevice(" + std::to_string(opts.device) + ")");
  CheckCuda(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking), "nccl: stream");
  ncclUniqueId id;
  const std::string key = opts.prefix + "-nccl-id";
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw Error(std::string("nccl: ncclGetUniqueId: ") + ncclGetErrorString(r));
    store.Set(key, Hex(&id, sizeof id));
  } else {
    Unhex(store.Get(key, opts.timeout_ms), &id, sizeof id);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait stays ours to bound
  ncclResult_t r = ncclCommInitRankConfig(&impl_->comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress)
    throw Error(std::string("nccl: ncclCommInitRankConfig: ") + ncclGetErrorString(r));
  impl_->Settle(r, "init of " + std::to_string(size) + " ranks");
}

NcclComm::~NcclComm() {
  if (impl_->comm) {
    if (cudaStreamSynchronize(impl_->stream) == cudaSuccess)
      ncclCommDestroy(impl_->comm);
    else
      ncclCommAbort(impl_->comm);
  }
  if (impl_->dev) cudaFree(impl_->dev);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void NcclComm::AllReduce(float* data, int64_t n, ReduceOp op, DType wire) {
  if (n <= 0) return;
  impl_->Usable();
  const size_t es = DTypeSize(wire);
  const size_t bytes = size_t(n) * es;
  const ncclRedOp_t rop = op == ReduceOp::kMean ? ncclAvg : ncclSum;
  if (Impl::OnDevice(data)) {
    // In place on the GPU; a 16-bit wire goes through the same rounding as EncodeFloats.
    void* buf = data;
    if (wire != DType::kF32) {
      buf = impl_->Staging(bytes);
      CheckCuda(WireEncodeDevice(data, n, int(wire), buf, impl_->stream), "nccl all-reduce: encode to " +
                                                                              std::string(DTypeName(wire)));
    }
    impl_->Settle(ncclAllReduce(buf, buf, size_t(n), impl_->Wire(wire), rop, impl_->comm, impl_->stream),
                  "all-reduce");
    if (wire != DType::kF32)
      CheckCuda(WireDecodeDevice(buf, n, int(wire), data, impl_->stream), "nccl all-reduce: decode from " +
                                                                              std::string(DTypeName(wire)));
    impl_->Finish("all-reduce of " + std::to_string(n) + " device elements");
    bytes_sent_ += int64_t(2 * bytes * size_t(size_ - 1) / size_t(size_));
    return;
  }
  void* dev = impl_->Staging(bytes);
  const void* src = data;
  if (wire != DType::kF32) {
    impl_->host.resize(bytes);
    EncodeFloats(data, size_t(n), wire, impl_->host.data());
    src = impl_->host.data();
  }
  CheckCuda(cudaMemcpyAsync(dev, src, bytes, cudaMemcpyHostToDevice, impl_->stream), "nccl all-reduce: upload");
  impl_->Settle(ncclAllReduce(dev, dev, size_t(n), impl_->Wire(wire), rop, impl_->comm, impl_->stream), "all-reduce");
  // The bounded wait comes before the download: a device-to-pageable-host cudaMemcpyAsync
  // returns only once the copy is done, i.e. once the collective ahead of it ended, so with
  // a peer gone it would block forever and no timeout or abort could ever run.
  impl_->Finish("all-reduce of " + std::to_string(n) + " elements");
  void* dst = wire == DType::kF32 ? static_cast<void*>(data) : static_cast<void*>(impl_->host.data());
  impl_->Download(dst, dev, bytes, "all-reduce");
  if (wire != DType::kF32) DecodeFloats(impl_->host.data(), size_t(n), wire, data);
  bytes_sent_ += int64_t(2 * bytes * size_t(size_ - 1) / size_t(size_));
}

void NcclComm::AllGather(const void* in, int64_t bytes, void* out) {
  impl_->Usable();
  if (bytes <= 0) return;
  const bool in_dev = Impl::OnDevice(in), out_dev = Impl::OnDevice(out);
  SHOAL_CHECK(in_dev == out_dev, std::string("nccl all-gather: in is ") + (in_dev ? "device" : "host") +
                                     " memory but out is " + (out_dev ? "device" : "host") +
                                     " memory (pass both on the GPU or both on the host)");
  if (in_dev) {
    impl_->Settle(ncclAllGather(in, out, size_t(bytes), ncclUint8, impl_->comm, impl_->stream), "all-gather");
    impl_->Finish("all-gather of " + std::to_string(bytes) + " device bytes");
    bytes_sent_ += bytes * (size_ - 1);
    return;
  }
  uint8_t* dev = static_cast<uint8_t*>(impl_->Staging(size_t(bytes) * size_t(size_ + 1)));
  uint8_t* dev_out = dev + bytes;
  CheckCuda(cudaMemcpyAsync(dev, in, size_t(bytes), cudaMemcpyHostToDevice, impl_->stream), "nccl all-gather: upload");
  impl_->Settle(ncclAllGather(dev, dev_out, size_t(bytes), ncclUint8, impl_->comm, impl_->stream), "all-gather");
  impl_->Finish("all-gather of " + std::to_string(bytes) + " bytes");  // before the download (AllReduce)
  impl_->Download(out, dev_out, size_t(bytes) * size_t(size_), "all-gather");
  bytes_sent_ += bytes * (size_ - 1);
}

void NcclComm::Broadcast(void* data, int64_t bytes, int root) {
  impl_->Usable();
  SHOAL_CHECK(root >= 0 && root < size_,
              "nccl broadcast: root " + std::to_string(root) + " outside size " + std::to_string(size_));
  if (bytes <= 0) return;
  if (Impl::OnDevice(data)) {
    impl_->Settle(ncclBroadcast(data, data, size_t(bytes), ncclUint8, root, impl_->comm, impl_->stream), "broadcast");
    impl_->Finish("broadcast of " + std::to_string(bytes) + " device bytes");
    if (rank_ == root) bytes_sent_ += bytes;
    return;
  }
  void* dev = impl_->Staging(size_t(bytes));
  if (rank_ == root)
    CheckCuda(cudaMemcpyAsync(dev, data, size_t(bytes), cudaMemcpyHostToDevice, impl_->stream),
              "nccl broadcast: upload");
  impl_->Settle(ncclBroadcast(dev, dev, size_t(bytes), ncclUint8, root, impl_->comm, impl_->stream), "broadcast");
  impl_->Finish("broadcast of " + std::to_string(bytes) + " bytes");  // before the download (AllReduce)
  impl_->Download(data, dev, size_t(bytes), "broadcast");
  if (rank_ == root) bytes_sent_ += bytes;
}

void NcclComm::Barrier() {
  float x = 0;
  AllReduce(&x, 1, ReduceOp::kSum);
}

}  // namespace shoal
