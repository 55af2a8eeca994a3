// Limits on tensors that Shoal accepts from anywhere (the wire, a checkpoint), in one place
// so a tensor the wire accepts is always one a checkpoint can hold.
#pragma once
#include <cstdint>

namespace shoal {

constexpr uint32_t kMaxTensorDims = 8;
constexpr int64_t kMaxTensorDimSize = int64_t(1) << 40;
constexpr uint64_t kMaxTensorElements = uint64_t(1) << 40;

}  // namespace shoal
