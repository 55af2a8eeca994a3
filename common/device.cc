#include "common/device.h"

#include <cstdlib>

#include "common/error.h"

namespace shoal {

Device ParseDevice(const std::string& s) {
  if (s == "cpu") return Device{DeviceKind::kCpu, 0};
  if (s == "cuda") return Device{DeviceKind::kCuda, 0};
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5) {
    const std::string idx = s.substr(5);
    char* end = nullptr;
    long v = std::strtol(idx.c_str(), &end, 10);
    if (*end == '\0' && v >= 0 && v < 1024) return Device{DeviceKind::kCuda, int(v)};
  }
  throw Error("device \"" + s + "\": expected \"cpu\", \"cuda\" or \"cuda:N\"");
}

}  // namespace shoal
