#include "worker/data/host_memory.h"

#include <new>

namespace shoal {
namespace data {

void* HostMemory::Allocate(size_t bytes) {
  std::shared_ptr<void> block = alloc_(bytes ? bytes : 1);
  if (!block) throw std::bad_alloc();
  void* p = block.get();
  std::lock_guard<std::mutex> lock(mu_);
  live_.emplace(p, std::move(block));
  return p;
}

void HostMemory::Free(void* p) noexcept {
  std::shared_ptr<void> block;  // released outside the lock: freeing pinned memory is slow
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    block = std::move(it->second);
    live_.erase(it);
  }
}

size_t HostMemory::live_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}

}  // namespace data
}  // namespace shoal
