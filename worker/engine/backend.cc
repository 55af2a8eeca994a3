#include "worker/engine/backend.h"

#include <cstdlib>
#include <new>
#include <tuple>

#include "common/error.h"

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

bool ConvParams::operator<(const ConvParams& o) const {
  return std::make_tuple(sh(), sw(), ph(), pw(), dh(), dw(), groups) <
         std::make_tuple(o.sh(), o.sw(), o.ph(), o.pw(), o.dh(), o.dw(), o.groups);
}

std::vector<int64_t> ContiguousStrides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = int(s.size()) - 2; i >= 0; --i) st[size_t(i)] = st[size_t(i) + 1] * s[size_t(i) + 1];
  return st;
}

namespace {
[[noreturn]] void Missing(const Backend& be, const char* op) {
  throw Error(be.Name() + " has no " + op + " (an operator of imported models) yet");
}
}  // namespace

void Backend::Unary(UnaryOp, const Tensor&, Tensor&, float, float) { Missing(*this, "Unary"); }
void Backend::UnaryBackward(UnaryOp, const Tensor&, const Tensor&, const Tensor&, Tensor&, float, float) {
  Missing(*this, "UnaryBackward");
}
void Backend::Binary(BinaryOp, const Tensor&, const Tensor&, Tensor&) { Missing(*this, "Binary"); }
void Backend::Where(const Tensor&, const Tensor&, const Tensor&, Tensor&) { Missing(*this, "Where"); }
void Backend::ReduceSum(const Tensor&, Tensor&, float, bool) { Missing(*this, "ReduceSum"); }
void Backend::StridedCopy(const Tensor&, const StridedView&, Tensor&, const StridedView&, const Shape&, bool) {
  Missing(*this, "StridedCopy");
}
void Backend::MatMul(const Tensor&, bool, const Tensor&, bool, Tensor&, float, float) { Missing(*this, "MatMul"); }
void Backend::Softmax(const Tensor&, int, bool, Tensor&) { Missing(*this, "Softmax"); }
void Backend::SoftmaxBackward(const Tensor&, const Tensor&, int, bool, Tensor&) { Missing(*this, "SoftmaxBackward"); }
void Backend::LayerNormForward(const Tensor&, const Tensor&, const Tensor&, int64_t, float, Tensor&, Tensor&, Tensor&) {
  Missing(*this, "LayerNormForward");
}
void Backend::LayerNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                                Tensor&, Tensor*, Tensor*) {
  Missing(*this, "LayerNormBackward");
}
void Backend::IndexSelect(const Tensor&, const Tensor&, int, Tensor&) { Missing(*this, "IndexSelect"); }
void Backend::IndexSelectBackward(const Tensor&, const Tensor&, int, Tensor&) { Missing(*this, "IndexSelectBackward"); }
void Backend::AvgPoolForward(const Tensor&, const PoolParams&, Tensor&) { Missing(*this, "AvgPoolForward"); }
void Backend::AvgPoolBackward(const Tensor&, const PoolParams&, Tensor&) { Missing(*this, "AvgPoolBackward"); }
void Backend::DropoutMask(uint64_t, float, Tensor&) { Missing(*this, "DropoutMask"); }

}  // namespace shoal
