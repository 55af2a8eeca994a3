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

namespace shoal {

Tensor Tensor::Slice(int64_t byte_offset, Shape s) const {
  const int64_t want = NumElements(s) * int64_t(DTypeSize(dtype_));
  SHOAL_CHECK(byte_offset >= 0 && byte_offset + want <= int64_t(bytes()),
              "Tensor::Slice: " + std::to_string(want) + " bytes at " + std::to_string(byte_offset) +
                  " do not fit in " + std::to_string(bytes()));
  return Tensor(std::move(s), dtype_, device_, std::shared_ptr<void>(buffer_, static_cast<char*>(raw()) + byte_offset));
}

}  // namespace shoal
