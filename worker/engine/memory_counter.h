// MemoryCounter: the bytes a backend's allocator has handed out and not yet got back, and
// the most there ever were at once (since the last ResetPeak). Shared by the allocator and
// every buffer's deleter, so it outlives the backend when tensors do.
#pragma once
#include <atomic>
#include <cstdint>

namespace shoal {

// Bytes of device memory in buffers a backend allocated (what Backend::Memory reports).
struct MemoryStats {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
};

class MemoryCounter {
 public:
  void Allocated(int64_t bytes) {
    const int64_t now = live_.fetch_add(bytes) + bytes;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  void Freed(int64_t bytes) { live_.fetch_sub(bytes); }
  // The peak from now on starts at what is live now.
  void ResetPeak() { peak_.store(live_.load()); }
  MemoryStats Stats() const { return MemoryStats{live_.load(), peak_.load()}; }

 private:
  std::atomic<int64_t> live_{0}, peak_{0};
};

}  // namespace shoal
