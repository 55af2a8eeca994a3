#include "worker/engine/tensor.h"

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

std::string ShapeString(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

Tensor Tensor::Reshape(Shape s) const {
  SHOAL_CHECK(NumElements(s) == numel(),
              "Tensor::Reshape: " + ShapeString(shape_) + " has " + std::to_string(numel()) +
                  " elements, cannot view as " + ShapeString(s));
  return Tensor(std::move(s), dtype_, device_, buffer_);
}

}  // namespace shoal
