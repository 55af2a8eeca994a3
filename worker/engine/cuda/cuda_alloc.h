// A caching device allocator: freed blocks go back to a per-device pool instead of
// cudaFree, so a training step's same-sized tensors are recycled without driver calls.
// Blocks are reused in stream order, which is safe because the backend issues all its work
// on one stream; code that touches a buffer on another stream must synchronize before
// dropping its last reference.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "worker/engine/memory_counter.h"

namespace shoal {

class CudaAllocator : public std::enable_shared_from_this<CudaAllocator> {
 public:
  // counter: told of every buffer handed out and given back, at its rounded size (the
  // backend's Memory()); cached blocks are not counted.
  CudaAllocator(int device, std::shared_ptr<MemoryCounter> counter) : device_(device), counter_(std::move(counter)) {}
  ~CudaAllocator();
  CudaAllocator(const CudaAllocator&) = delete;
  CudaAllocator& operator=(const CudaAllocator&) = delete;

  // A buffer of at least `bytes`; its deleter returns it to this pool (which it keeps
  // alive), so buffers may outlive the backend. Throws shoal::Error when out of memory.
  std::shared_ptr<void> Allocate(size_t bytes);
  static constexpr size_t kAlign = 512;  // every buffer's size is rounded up to this
  // Frees every cached (unused) block back to the driver.
  void ReleaseCached();
  size_t cached_bytes() const;

 private:
  void Return(void* p, size_t block, size_t size) noexcept;

  const int device_;
  const std::shared_ptr<MemoryCounter> counter_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // block size -> block
  size_t cached_bytes_ = 0;
};

}  // namespace shoal
