#include "server/checkpointer.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "common/byte_codec.h"
#include "common/error.h"

namespace shoal {
namespace {

constexpr uint32_t kTensorMagic = 0x4b434853;    // "SHCK"
constexpr uint32_t kManifestMagic = 0x4d434853;  // "SHCM"
const char* kCommittedKey = "committed";

std::string Hex(uint64_t id) {
  char b[17];
  snprintf(b, sizeof b, "%016llx", (unsigned long long)id);
  return b;
}
std::string TensorPrefix(uint64_t id) { return "t/" + Hex(id) + "/"; }
std::string ManifestKey(uint64_t id) { return "m/" + Hex(id); }

void Check(const rocksdb::Status& s, const std::string& what) {
  if (!s.ok()) throw Error(what + ": " + s.ToString());
}

std::string EncodeRecord(const CheckpointRecord& r) {
  ByteWriter w;
  w.Put(kManifestMagic).Put(r.id).Put(r.step).Put(r.epoch).Put(r.batch).Put(r.shards);
  return std::move(w.str());
}

CheckpointRecord DecodeRecord(std::string_view v, const std::string& what) {
  ByteReader r(v, what);
  SHOAL_CHECK(r.Get<uint32_t>() == kManifestMagic, what + ": not a Shoal checkpoint record");
  CheckpointRecord c;
  c.id = r.Get<uint64_t>();
  c.step = r.Get<int64_t>();
  c.epoch = r.Get<int64_t>();
  c.batch = r.Get<int64_t>();
  c.shards = r.Get<uint32_t>();
  return c;
}

}  // namespace

Checkpointer::Checkpointer(const std::string& dir, int shard, bool fresh)
    : path_(dir + "/shard-" + std::to_string(shard)), shard_(shard) {
  SHOAL_CHECK(!dir.empty(), "checkpoints: [job] checkpoint_dir is not set");
  rocksdb::Options o;
  o.create_if_missing = true;
  o.create_missing_column_families = true;
  std::error_code ec;  // RocksDB creates only the last folder
  std::filesystem::create_directories(dir, ec);
  SHOAL_CHECK(!ec, "checkpoints: cannot create " + dir + ": " + ec.message());
  if (fresh && std::filesystem::exists(path_)) {
    // A new job: an earlier run's checkpoints here must never be resumed by this one.
    Check(rocksdb::DestroyDB(path_, o), "checkpoints: cannot clear " + path_);
  }
  rocksdb::DB* db = nullptr;
  Check(rocksdb::DB::Open(o, path_, &db), "checkpoints: cannot open " + path_);
  db_.reset(db);
}

Checkpointer::~Checkpointer() = default;

uint64_t Checkpointer::Write(const CheckpointRecord& rec, const KvShard& kv) {
  SHOAL_CHECK(rec.id > 0, "checkpoint id 0 is reserved for 'none'");
  rocksdb::WriteBatch batch;
  uint64_t bytes = 0;
  const std::string prefix = TensorPrefix(rec.id);
  // A retried id (a worker's request repeated) replaces what was there.
  batch.DeleteRange(prefix, prefix + "\xff");
  for (auto& [name, t] : kv.tensors()) {
    ByteWriter w;
    w.Put(kTensorMagic).Put(uint8_t(t.dtype)).Put(uint32_t(t.shape.size()));
    for (int64_t d : t.shape) w.Put(d);
    w.Put(t.version);
    std::string state = kv.rule().SaveState(t);
    w.Blob(state.data(), state.size());
    w.Blob(t.buf->data(), t.buf->size());
    bytes += w.str().size();
    Check(batch.Put(prefix + name, w.str()), "checkpoint " + std::to_string(rec.id));
  }
  // The manifest last: a checkpoint without one does not exist.
  ByteWriter m;
  m.Put(uint64_t(kv.tensors().size()));
  Check(batch.Put(ManifestKey(rec.id), EncodeRecord(rec) + m.str()), "checkpoint manifest");
  // In the same batch: drop every other checkpoint but the newest one before this (the
  // committed one while this is not yet); ids above this one belong to a timeline that a
  // resume abandoned.
  std::vector<uint64_t> old = Written();
  uint64_t previous = 0;
  for (uint64_t o : old)
    if (o < rec.id) previous = std::max(previous, o);
  for (uint64_t o : old) {
    if (o == rec.id || o == previous) continue;
    batch.Delete(ManifestKey(o));
    batch.DeleteRange(TensorPrefix(o), TensorPrefix(o) + "\xff");
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  Check(db_->Write(wo, &batch),
        "checkpoint " + std::to_string(rec.id) + " of shard " + std::to_string(shard_) + " in " + path_);
  return bytes;
}

void Checkpointer::Load(uint64_t id, KvShard* kv) const {
  std::string what = path_ + ": checkpoint " + std::to_string(id);
  std::string manifest;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ManifestKey(id), &manifest);
  if (s.IsNotFound()) {
    std::string have;
    for (uint64_t w : Written()) have += (have.empty() ? "" : ", ") + std::to_string(w);
    throw Error(what + " is not here (this shard holds: " + (have.empty() ? "none" : have) +
                "); was the job started with another checkpoint_dir or shard count?");
  }
  Check(s, what);
  std::string_view mv(manifest);
  const size_t record_bytes = EncodeRecord({}).size();
  SHOAL_CHECK(mv.size() == record_bytes + 8, what + ": manifest of " + std::to_string(mv.size()) + " bytes");
  SHOAL_CHECK(DecodeRecord(mv.substr(0, record_bytes), what + " manifest").id == id,
              what + ": manifest names another id");
  uint64_t expected = ByteReader(mv.substr(record_bytes), what + " manifest").Get<uint64_t>();

  std::map<std::string, StoredTensor> tensors;
  const std::string prefix = TensorPrefix(id);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    std::string name = it->key().ToString().substr(prefix.size());
    std::string tw = what + " tensor '" + name + "'";
    ByteReader r(std::string_view(it->value().data(), it->value().size()), tw);
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
    tensors.emplace(std::move(name), std::move(t));
  }
  Check(it->status(), what);
  SHOAL_CHECK(tensors.size() == expected,
              what + ": " + std::to_string(tensors.size()) + " tensors, its manifest says " + std::to_string(expected));
  kv->ReplaceAll(std::move(tensors));
}

void Checkpointer::Commit(const CheckpointRecord& rec) {
  rocksdb::WriteOptions wo;
  wo.sync = true;
  Check(db_->Put(wo, kCommittedKey, EncodeRecord(rec)), "checkpoint commit in " + path_);
}

CheckpointRecord Checkpointer::Committed() const {
  std::string v;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kCommittedKey, &v);
  if (s.IsNotFound()) return {};
  Check(s, path_);
  return DecodeRecord(v, path_ + ": committed checkpoint record");
}

std::vector<uint64_t> Checkpointer::Written() const {
  std::vector<uint64_t> ids;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("m/"); it->Valid() && it->key().starts_with("m/"); it->Next()) {
    std::string hex = it->key().ToString().substr(2);
    if (hex.size() == 16) ids.push_back(std::stoull(hex, nullptr, 16));
  }
  std::sort(ids.rbegin(), ids.rend());
  return ids;
}

}  // namespace shoal
