// Where a data loader's batches live. A CUDA worker's loader allocates them page-locked
// (Backend::AllocHost: cudaMallocHost), so copying a batch to the device is a real
// asynchronous DMA at full bus speed instead of a staged copy the host waits for; a CPU
// worker, or a loader given nothing, uses plain memory.
//
//   auto pinned = std::make_shared<HostMemory>([&be](size_t n) { return be.AllocHost(n); });
//   DataLoaderOptions o; o.host_memory = pinned;   // every batch's images come from `pinned`
//
// HostFloats is a std::vector<float> whose allocator draws from a HostMemory (or from the
// heap when it has none); the allocator travels with the vector when batches are moved
// or swapped, so a buffer is always freed by the memory it came from.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace shoal {
namespace data {

class HostMemory {
 public:
  // alloc: `bytes` of host memory, freed when the last copy of the returned pointer goes.
  using AllocFn = std::function<std::shared_ptr<void>(size_t bytes)>;
  explicit HostMemory(AllocFn alloc) : alloc_(std::move(alloc)) {}
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  // Thread-safe (a loader's producer allocates while its consumer frees).
  void* Allocate(size_t bytes);
  void Free(void* p) noexcept;
  // Blocks handed out and not yet freed.
  size_t live_blocks() const;

 private:
  AllocFn alloc_;
  mutable std::mutex mu_;
  std::unordered_map<void*, std::shared_ptr<void>> live_;
};

template <typename T>
class HostAllocator {
 public:
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  HostAllocator() = default;
  explicit HostAllocator(std::shared_ptr<HostMemory> memory) : memory_(std::move(memory)) {}
  template <typename U>
  HostAllocator(const HostAllocator<U>& o) : memory_(o.memory()) {}  // NOLINT: rebinding is implicit

  T* allocate(size_t n) {
    if (!memory_) return std::allocator<T>().allocate(n);
    return static_cast<T*>(memory_->Allocate(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (!memory_) return std::allocator<T>().deallocate(p, n);
    memory_->Free(p);
  }
  const std::shared_ptr<HostMemory>& memory() const { return memory_; }
  template <typename U>
  bool operator==(const HostAllocator<U>& o) const {
    return memory_ == o.memory();
  }
  template <typename U>
  bool operator!=(const HostAllocator<U>& o) const {
    return memory_ != o.memory();
  }

 private:
  std::shared_ptr<HostMemory> memory_;
};

using HostFloats = std::vector<float, HostAllocator<float>>;

}  // namespace data
using data::HostMemory;
}  // namespace shoal
