#include "worker/engine/cuda/cuda_alloc.h"

#include <cuda_runtime_api.h>

#include <string>

#include "common/error.h"

namespace shoal {

CudaAllocator::~CudaAllocator() {
  // Errors are ignored: at process exit the runtime may already be shutting down.
  ReleaseCached();
}

std::shared_ptr<void> CudaAllocator::Allocate(size_t bytes) {
  const size_t size = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = nullptr;
  size_t got = size;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Best fit, but never more than twice the request, so big idle blocks are not pinned
    // down by small tensors.
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= 2 * size) {
      got = it->first;
      p = it->second;
      cached_bytes_ -= got;
      free_.erase(it);
    }
  }
  if (p == nullptr) {
    cudaSetDevice(device_);
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      ReleaseCached();
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      // Out of memory now (another process on the GPU) may pass: never the job's input.
      throw TransientError("cuda:" + std::to_string(device_) + ": cudaMalloc of " + std::to_string(size) +
                           " bytes failed: " + cudaGetErrorString(e));
    }
  }
  counter_->Allocated(int64_t(size));
  auto self = shared_from_this();
  return std::shared_ptr<void>(p, [self, got, size](void* q) { self->Return(q, got, size); });
}

void CudaAllocator::Return(void* p, size_t block, size_t size) noexcept {
  counter_->Freed(int64_t(size));
  std::lock_guard<std::mutex> lock(mu_);
  free_.emplace(block, p);
  cached_bytes_ += block;
}

void CudaAllocator::ReleaseCached() {
  std::multimap<size_t, void*> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    blocks.swap(free_);
    cached_bytes_ = 0;
  }
  if (blocks.empty()) return;
  cudaSetDevice(device_);
  for (auto& kv : blocks) cudaFree(kv.second);  // cudaFree waits for pending work on the block
}

size_t CudaAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

}  // namespace shoal
