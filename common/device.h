// Where a tensor lives: "cpu" or "cuda:N". Shared by the engine (worker/engine), the
// collectives (NCCL needs the worker's GPU index) and the job file checks, so it lives
// below all of them.
#pragma once
#include <cstdint>
#include <string>

namespace shoal {

enum class DeviceKind : uint8_t { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  std::string ToString() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
};

// Parses "cpu" | "cuda" | "cuda:N"; throws shoal::Error otherwise.
Device ParseDevice(const std::string& s);

}  // namespace shoal
