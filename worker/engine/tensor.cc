#include "worker/engine/tensor.h"

#include "common/error.h"

namespace shoal {

std::string ShapeString(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

Tensor Tensor::Reshape(Shape s) const {
  SHOAL_CHECK(NumElements(s) == numel(), "Tensor::Reshape: " + ShapeString(shape_) + " has " + std::to_string(numel()) +
                                             " elements, cannot view as " + ShapeString(s));
  return Tensor(std::move(s), dtype_, device_, buffer_);
}

}  // namespace shoal
