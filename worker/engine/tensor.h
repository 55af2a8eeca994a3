// Tensor: a shape, a dtype and a reference-counted buffer on one device.
// Allocation and copies across devices go through a Backend (backend.h).
#pragma once
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/dtype.h"

namespace shoal {

using Shape = std::vector<int64_t>;
inline int64_t NumElements(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t(1), std::multiplies<int64_t>());
}
std::string ShapeString(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  Tensor(Shape shape, DType dtype, Device device, std::shared_ptr<void> buffer)
      : shape_(std::move(shape)), dtype_(dtype), device_(device), buffer_(std::move(buffer)) {}

  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int ndim() const { return int(shape_.size()); }
  int64_t numel() const { return NumElements(shape_); }
  size_t bytes() const { return size_t(numel()) * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool defined() const { return buffer_ != nullptr; }

  void* raw() const { return buffer_.get(); }
  template <typename T>
  T* data() const {
    return static_cast<T*>(buffer_.get());
  }

  // Same buffer, new shape of equal element count (a view, no copy).
  Tensor Reshape(Shape s) const;
  // A tensor of shape s and this dtype over this buffer's bytes from byte_offset on (a
  // view that keeps the buffer alive; it must fit inside).
  Tensor Slice(int64_t byte_offset, Shape s) const;

 private:
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_;
  std::shared_ptr<void> buffer_;
};

}  // namespace shoal
