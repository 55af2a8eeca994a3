#include "worker/engine/backend.h"

#include <cstdlib>
#include <new>

namespace shoal {

Tensor Backend::Zeros(const Shape& shape, DType dtype) {
  Tensor t = Empty(shape, dtype);
  Fill(t, 0.0f);
  return t;
}

std::shared_ptr<void> Backend::AllocHost(size_t bytes) {
  void* p = std::malloc(bytes ? bytes : 1);
  if (!p) throw std::bad_alloc();
  return std::shared_ptr<void>(p, std::free);
}

}  // namespace shoal
