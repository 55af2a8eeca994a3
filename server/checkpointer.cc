#include "server/checkpointer.h"

#include <map>

#include "common/byte_codec.h"
#include "common/error.h"
#include "common/dtype.h"

namespace shoal {
namespace {

constexpr uint32_t kTensorMagic = 0x4b434853;  // "SHCK"

// A tensor record's bytes before its buffer, less the update rule's state: magic, dtype,
// rank, shape, version, the state's length, the buffer's length (Snapshot's `head`).
uint64_t HeadBytes(const StoredTensor& t) { return 4 + 1 + 4 + 8 * t.shape.size() + 8 + 8 + 8; }

}  // namespace

Checkpointer::Checkpointer(const std::string& dir, int shard, CheckpointStart start)
    : store_(dir + "/shard-" + std::to_string(shard), "shard " + std::to_string(shard), start) {}

std::unique_ptr<CheckpointStore::Pending> Checkpointer::Snapshot(const CheckpointRecord& rec, uint64_t keep,
                                                                 const KvShard& kv) const {
  auto p = store_.Begin(rec, keep);
  // Room for the tensors up front, in one allocation: the snapshot's one copy of them (an
  // update rule's state, unknown until saved, may grow it later).
  uint64_t bytes = 0;
  for (auto& [name, t] : kv.tensors()) bytes += p->EntryRoom(name.size(), HeadBytes(t) + t.buf->size());
  p->Reserve(bytes);
  for (auto& [name, t] : kv.tensors()) {
    ByteWriter head;  // everything but the buffer, which goes into the batch straight from the shard
    head.Put(kTensorMagic).Put(uint8_t(t.dtype)).Put(uint32_t(t.shape.size()));
    for (int64_t d : t.shape) head.Put(d);
    head.Put(t.version);
    std::string state = kv.rule().SaveState(t);
    head.Blob(state.data(), state.size());
    head.Put<uint64_t>(t.buf->size());  // ByteWriter::Blob's layout, in two parts
    p->Add(name, {head.str(), std::string_view(static_cast<const char*>(t.buf->data()), t.buf->size())});
  }
  return p;
}

uint64_t Checkpointer::Write(const CheckpointRecord& rec, uint64_t keep, const KvShard& kv) {
  auto p = Snapshot(rec, keep, kv);
  uint64_t bytes = p->bytes();
  store_.Write(std::move(p));
  return bytes;
}

void Checkpointer::Load(uint64_t id, KvShard* kv) const {
  const std::string what = path() + ": checkpoint " + std::to_string(id);
  std::map<std::string, StoredTensor> tensors;
  store_.Visit(id, [&](const std::string& name, std::string_view value) {
    std::string tw = what + " tensor '" + name + "'";
    ByteReader r(value, tw);
    SHOAL_CHECK(r.Get<uint32_t>() == kTensorMagic, tw + ": not a Shoal tensor record");
    StoredTensor t;
    uint8_t dt = r.Get<uint8_t>();
    SHOAL_CHECK(dt <= uint8_t(DType::kBF16), tw + ": unknown dtype " + std::to_string(dt));
    t.dtype = DType(dt);
    uint32_t ndim = r.Get<uint32_t>();
    SHOAL_CHECK(ndim <= kMaxTensorDims,
                tw + ": " + std::to_string(ndim) + " dimensions (at most " + std::to_string(kMaxTensorDims) + ")");
    uint64_t elems = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      int64_t n = r.Get<int64_t>();
      SHOAL_CHECK(n >= 0 && n < kMaxTensorDimSize, tw + ": dimension " + std::to_string(n));
      t.shape.push_back(n);
      SHOAL_CHECK(n == 0 || elems <= kMaxTensorElements / uint64_t(n), tw + ": more than 2^40 elements");
      elems *= uint64_t(n);
    }
    t.version = r.Get<uint64_t>();
    std::string_view state = r.Blob();
    std::string_view data = r.Blob();
    r.ExpectDone();
    SHOAL_CHECK(data.size() == elems * DTypeSize(t.dtype),
                tw + ": " + std::to_string(data.size()) + " bytes for its shape");
    t.buf = std::make_shared<Buffer>();
    t.buf->bytes = Frame(data.data(), data.size());
    kv->rule().LoadState(t, state);
    tensors.emplace(name, std::move(t));
  });
  kv->ReplaceAll(std::move(tensors));
}

}  // namespace shoal
