#include "server/kv_shard.h"

#include <cstring>

#include "common/error.h"

namespace shoal {
namespace {

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

void AddInto(DType t, void* dst, const void* src, size_t n) {
  if (t == DType::kF32) {
    AddFloats(static_cast<float*>(dst), src, n);
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) {
    float a = t == DType::kF16 ? HalfToFloat(d[i]) : Bf16ToFloat(d[i]);
    float b = t == DType::kF16 ? HalfToFloat(s[i]) : Bf16ToFloat(s[i]);
    d[i] = t == DType::kF16 ? FloatToHalf(a + b) : FloatToBf16(a + b);
  }
}

void AddRule::Apply(const std::string&, StoredTensor& param, const void* grad, size_t) {
  AddInto(param.dtype, param.buf->data(), grad, param.elements());
}

Frame KvShard::Push(const std::string& name, DType dtype, const std::vector<int64_t>& shape, Frame&& data,
                    msg::PushOp op, const StoredTensor** stored) {
  auto it = tensors_.find(name);
  if (it == tensors_.end() || op == msg::PushOp::ASSIGN) {
    // First push of a tensor, or a replacement: keep the received frame as the value, at
    // whatever offset ZeroMQ delivered it (Writable aligns it before anything reads floats).
    StoredTensor& t = it == tensors_.end() ? tensors_[name] : it->second;
    if (t.dtype != dtype || t.shape != shape) {
      t.rule_state.reset();  // sized for the old shape
      t.dtype = dtype;
      t.shape = shape;
    }
    ++t.version;
    if (stored) *stored = &t;
    // Only ZeroMQ's I/O thread (a pull reply still being sent) drops references
    // concurrently, so a count of 1 is final: the Buffer is reused in place.
    if (t.buf && t.buf.use_count() == 1) {
      Frame old = std::move(t.buf->bytes);
      t.buf->bytes = std::move(data);
      return old;
    }
    t.buf = std::make_shared<Buffer>();  // the old one stays with whoever still holds it
    t.buf->bytes = std::move(data);
    return Frame();
  }
  StoredTensor& t = it->second;
  SHOAL_CHECK(t.dtype == dtype && t.shape == shape, "push of '" + name + "' as " + DTypeName(dtype) + ShapeStr(shape) +
                                                        " but the shard holds " + DTypeName(t.dtype) +
                                                        ShapeStr(t.shape));
  SHOAL_CHECK(op == msg::PushOp::ADD || op == msg::PushOp::APPLY,
              "push of '" + name + "': unknown op " + std::to_string(int(op)));
  StoredTensor& w = Writable(name);
  const Frame grad = Aligned(std::move(data));  // read as floats in place
  if (op == msg::PushOp::ADD)
    AddInto(w.dtype, w.buf->data(), grad.data(), w.elements());
  else
    rule_->Apply(name, w, grad.data(), grad.size());
  ++w.version;
  if (stored) *stored = &w;
  return Frame();
}

StoredTensor& KvShard::Writable(const std::string& name) {
  StoredTensor& t = tensors_.at(name);
  // Only ZeroMQ's I/O thread drops references concurrently, so a count of 1 is final. A
  // value kept as received may lie at any offset: the copy is aligned for the update rule.
  if (t.buf.use_count() > 1 || !t.buf->bytes.aligned()) {
    auto copy = std::make_shared<Buffer>();
    copy->bytes = Frame(t.buf->data(), t.buf->size());
    t.buf = std::move(copy);
  }
  return t;
}

const StoredTensor* KvShard::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void KvShard::Restep(int64_t step) {
  for (auto& [name, t] : tensors_)
    if (name.rfind("__shoal/", 0) != 0) rule_->Restep(t, step);
}

uint64_t KvShard::bytes() const {
  uint64_t n = 0;
  for (auto& kv : tensors_) n += kv.second.buf->size();
  return n;
}

}  // namespace shoal
