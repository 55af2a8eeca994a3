#include "worker/engine/backend.h"

namespace shoal {

Tensor Backend::Zeros(const Shape& shape, DType dtype) {
  Tensor t = Empty(shape, dtype);
  Fill(t, 0.0f);
  return t;
}

}  // namespace shoal
