#include "common/checkpoint/checkpoint_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <map>
#include <set>
#include <thread>

#include "common/byte_codec.h"
#include "common/error.h"
#include "common/int_list.h"

namespace shoal {
namespace {

constexpr uint32_t kManifestMagic = 0x4d434853;        // "SHCM"
constexpr uint32_t kManifestAbsentMagic = 0x41434853;  // "SHCA": the same, then the absent workers
const char* kCommittedKey = "committed";

std::string Hex(uint64_t id) {
  char b[17];
  snprintf(b, sizeof b, "%016llx", (unsigned long long)id);
  return b;
}
std::string EntryPrefix(uint64_t id) { return "t/" + Hex(id) + "/"; }
std::string ManifestKey(uint64_t id) { return "m/" + Hex(id); }

void Check(const rocksdb::Status& s, const std::string& what) {
  if (!s.ok()) throw Error(what + ": " + s.ToString());
}

std::string EncodeRecord(const CheckpointRecord& r) {
  ByteWriter w;
  // Without absent workers the format of every earlier release, which they still read.
  w.Put(r.absent.empty() ? kManifestMagic : kManifestAbsentMagic);
  w.Put(r.id).Put(r.step).Put(r.epoch).Put(r.batch).Put(r.shards);
  if (r.absent.empty()) return std::move(w.str());
  w.Put<uint32_t>(uint32_t(r.absent.size()));
  for (uint32_t a : r.absent) w.Put(a);
  return std::move(w.str());
}

CheckpointRecord DecodeRecord(ByteReader& r, const std::string& what) {
  const uint32_t magic = r.Get<uint32_t>();
  SHOAL_CHECK(magic == kManifestMagic || magic == kManifestAbsentMagic, what + ": not a Shoal checkpoint record");
  CheckpointRecord c;
  c.id = r.Get<uint64_t>();
  c.step = r.Get<int64_t>();
  c.epoch = r.Get<int64_t>();
  c.batch = r.Get<int64_t>();
  c.shards = r.Get<uint32_t>();
  SHOAL_CHECK(c.step >= 0 && c.epoch >= 0 && c.batch >= 0, what + ": a negative step or data position");
  if (magic == kManifestMagic) return c;
  const uint32_t n = r.Get<uint32_t>();
  SHOAL_CHECK(n < c.shards, what + ": " + std::to_string(n) + " absent workers of " + std::to_string(c.shards));
  for (uint32_t i = 0; i < n; ++i) {
    c.absent.push_back(r.Get<uint32_t>());
    SHOAL_CHECK(c.absent.back() < c.shards,
                what + ": absent worker " + std::to_string(c.absent.back()) + " of " + std::to_string(c.shards));
  }
  return c;
}

// Every manifest's record in `db` (the store at `path`), newest first.
std::vector<CheckpointRecord> ReadManifests(rocksdb::DB* db, const std::string& path) {
  std::vector<CheckpointRecord> out;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("m/"); it->Valid() && it->key().starts_with("m/"); it->Next()) {
    const std::string what = path + ": checkpoint manifest " + it->key().ToString();
    ByteReader r(std::string_view(it->value().data(), it->value().size()), what);
    out.push_back(DecodeRecord(r, what));
  }
  Check(it->status(), path + ": checkpoints: cannot read");
  std::sort(out.begin(), out.end(), [](const CheckpointRecord& a, const CheckpointRecord& b) { return a.id > b.id; });
  return out;
}

}  // namespace

CheckpointRecord NewestCompleteOfWorkers(const std::vector<std::vector<CheckpointRecord>>& held) {
  std::map<uint64_t, std::pair<std::set<uint32_t>, CheckpointRecord>> seen;  // id -> workers it covers, a record
  for (size_t r = 0; r < held.size(); ++r)
    for (const CheckpointRecord& rec : held[r]) {
      auto& [covered, any] = seen[rec.id];
      covered.insert(uint32_t(r));
      covered.insert(rec.absent.begin(), rec.absent.end());
      any = rec;
    }
  for (auto it = seen.rbegin(); it != seen.rend(); ++it) {
    const std::set<uint32_t>& covered = it->second.first;
    if (size_t(std::distance(covered.begin(), covered.lower_bound(uint32_t(held.size())))) == held.size())
      return it->second.second;
  }
  return CheckpointRecord{};
}

std::string IdList(const std::vector<uint64_t>& ids) { return ids.empty() ? "none" : JoinIntList(ids, ", "); }

CheckpointStart CheckpointStartFrom(bool resume, bool fresh) {
  SHOAL_CHECK(!(resume && fresh), "--resume and --fresh contradict each other: continue the run, or start over");
  return resume ? CheckpointStart::kResume : fresh ? CheckpointStart::kFresh : CheckpointStart::kNew;
}

namespace {

// The database's options, the same for opening it and for deleting it.
rocksdb::Options StoreOptions() {
  rocksdb::Options o;
  o.create_if_missing = true;
  // Checkpoints are mostly float tensors, which Snappy barely shrinks; compressing would cost
  // the flush a compressed copy of every block for nothing.
  o.compression = rocksdb::kNoCompression;
  // Every write is flushed to a checksummed table file before it returns (Durable), so the
  // write-ahead log never holds anything acknowledged: its recovery drops a damaged log's
  // tail without a word, which once lost committed checkpoints silently. Damage to what is
  // kept (a table file cut short, a bad block) fails the open or the read instead.
  o.paranoid_checks = true;
  // A failed flush (a full disk) must fail the Flush that waits for it, so Write can reopen
  // and report it; RocksDB's own retries in the background would keep that wait forever.
  o.max_bgerror_resume_count = 0;
  return o;
}

// Why `path` cannot be opened as it is, when it holds data files (table files, or a log
// with something in it) but not the file that says which of them are current: RocksDB would
// start a new, empty database over them. A MANIFEST alone, or an empty log, is what a
// process killed while first creating the store leaves: nothing was kept yet, so that
// store opens afresh rather than stopping a restarted job.
std::string MissingCurrent(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec) || fs::exists(fs::path(path) / "CURRENT", ec)) return "";
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string(), ext = e.path().extension().string();
    std::error_code size_ec;
    if (ext == ".sst" || (ext == ".log" && fs::file_size(e.path(), size_ec) > 0 && !size_ec)) kept.push_back(name);
  }
  if (kept.empty()) {
    // Nothing kept: clear the empty logs, which RocksDB would refuse to create a store beside.
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".log") fs::remove(e.path(), ec);
    return "";
  }
  std::sort(kept.begin(), kept.end());
  std::string list;
  for (size_t i = 0; i < kept.size() && i < 4; ++i) list += (i ? ", " : "") + kept[i];
  if (kept.size() > 4) list += ", ...";
  return "its CURRENT file is missing, but it holds " + std::to_string(kept.size()) + " database files (" + list + ")";
}

// Whether `bytes` of address space can be mapped now (they are unmapped again at once).
// mmap rather than malloc: the compiler may drop a malloc whose memory is never used.
bool AddressSpaceFor(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  munmap(p, bytes);
  return true;
}

}  // namespace

CheckpointStore::CheckpointStore(const std::string& path, const std::string& who, CheckpointStart start)
    : path_(path), who_(who) {
  SHOAL_CHECK(!path.empty(), who + ": checkpoints: [job] checkpoint_dir is not set");
  std::error_code ec;  // RocksDB creates only the last folder
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  SHOAL_CHECK(!ec, who + ": checkpoints: cannot create the folder of " + path + ": " + ec.message());
  if (start == CheckpointStart::kFresh && std::filesystem::exists(path_))
    Check(rocksdb::DestroyDB(path_, StoreOptions()), who + ": --fresh: cannot delete the checkpoints in " + path_);
  Open();
  if (start == CheckpointStart::kNew) {
    HeldCheckpoints held;
    for (uint64_t id : Written()) held.written.push_back(CheckpointRecord{id});
    held.committed = Committed();
    // InputError: the same flags refuse the same folder again, so a launcher must not restart
    // (with --fresh, which would delete what the refusal protects). `shoal run` refuses
    // before starting anything; this is the line for srun, mpirun and hand-started processes.
    if (!held.empty()) throw InputError(EarlierRunError(who, path_, held));
  }
}

std::string EarlierRunError(const std::string& who, const std::string& path, const HeldCheckpoints& held) {
  std::vector<uint64_t> ids;
  for (auto& rec : held.written) ids.push_back(rec.id);
  const std::string newest = DescribeCommitted(held.committed);
  return who + ": " + path + " holds checkpoints of an earlier run (" + IdList(ids) +
         (newest.empty() ? "" : "; " + newest) +
         "): continue that run with --resume, or start over with --fresh (deletes them)";
}

std::string DescribeCommitted(const CheckpointRecord& committed) {
  if (committed.id == 0) return "";
  return "the newest complete one is " + std::to_string(committed.id) + " (step " + std::to_string(committed.step) +
         ")";
}

std::optional<HeldCheckpoints> CheckpointStore::Peek(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return std::nullopt;
  const std::string missing = MissingCurrent(path);
  if (!missing.empty()) throw InputError(path + ": checkpoints: damaged (" + missing + ")");
  // A folder without CURRENT holds nothing kept (MissingCurrent): a process killed as it
  // first created the store.
  if (!std::filesystem::exists(std::filesystem::path(path) / "CURRENT", ec)) return std::nullopt;
  rocksdb::DB* raw = nullptr;
  Check(rocksdb::DB::OpenForReadOnly(StoreOptions(), path, &raw), path + ": checkpoints: cannot read");
  std::unique_ptr<rocksdb::DB> db(raw);
  HeldCheckpoints held;
  held.written = ReadManifests(db.get(), path);
  std::string v;
  rocksdb::Status s = db->Get(rocksdb::ReadOptions(), kCommittedKey, &v);
  if (!s.IsNotFound()) {
    Check(s, path + ": checkpoints: cannot read");
    ByteReader r(v, path + ": committed checkpoint record");
    held.committed = DecodeRecord(r, path + ": committed checkpoint record");
  }
  return held;
}

CheckpointStore::~CheckpointStore() = default;

std::string CheckpointStore::Damaged(const std::string& what) const {
  return who_ + ": checkpoints: " + path_ + " is damaged (" + what +
         "); its checkpoints cannot be trusted: restore the folder from a copy, or start over with --fresh "
         "(deletes it)";
}

void CheckpointStore::Open() {
  const std::string missing = MissingCurrent(path_);
  if (!missing.empty()) throw InputError(Damaged(missing));
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(StoreOptions(), path_, &db);
  if (s.IsIOError() && s.ToString().find("lock") != std::string::npos)
    throw Error(who_ + ": checkpoints: " + path_ + " is in use by another process (" + s.ToString() +
                "); is another job, or another process of this one, using the same checkpoint_dir?");
  if (s.IsCorruption() || (s.IsIOError() && s.ToString().find("No such file") != std::string::npos))
    throw InputError(Damaged(s.ToString()));
  Check(s, who_ + ": checkpoints: cannot open " + path_);
  std::lock_guard<std::mutex> lock(mu_);
  db_.reset(db);
}

rocksdb::Status CheckpointStore::Durable(rocksdb::WriteBatch* batch) {
  // Straight into the memtable, then flushed to a table file and synced (with the MANIFEST
  // entry that makes it part of the database) before this returns: one copy of the data on
  // disk, as the synced log took, but in a file whose blocks are checksummed and which a
  // damaged log cannot take away. A crash before the flush ends leaves the batch wholly out.
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  std::shared_ptr<rocksdb::DB> db = this->db();
  rocksdb::Status s = db->Write(wo, batch);
  if (!s.ok()) return s;
  rocksdb::FlushOptions fo;
  fo.wait = true;
  return db->Flush(fo);
}

std::shared_ptr<rocksdb::DB> CheckpointStore::db() const {
  std::lock_guard<std::mutex> lock(mu_);
  SHOAL_CHECK(db_, who_ + ": checkpoints: " + path_ + " could not be reopened after a failed write");
  return db_;
}

CheckpointStore::Pending::Pending() : batch_(std::make_unique<rocksdb::WriteBatch>()) {}
CheckpointStore::Pending::~Pending() = default;

void CheckpointStore::Pending::Add(const std::string& key, std::initializer_list<std::string_view> parts) {
  const std::string full_key = EntryPrefix(rec_.id) + key;
  std::vector<rocksdb::Slice> slices;
  uint64_t bytes = 0;
  for (std::string_view part : parts) {
    slices.emplace_back(part.data(), part.size());
    bytes += part.size();
  }
  Reserve(EntryRoom(key.size(), bytes));
  rocksdb::Slice k(full_key);
  Check(batch_->Put(rocksdb::SliceParts(&k, 1), rocksdb::SliceParts(slices.data(), int(slices.size()))),
        "checkpoint " + std::to_string(rec_.id) + " entry '" + key + "'");
  ++entries_;
  bytes_ += bytes;
}

uint64_t CheckpointStore::Pending::EntryRoom(size_t key_size, uint64_t value_size) const {
  constexpr uint64_t kRecordOverhead = 32;  // a record's tag and length varints, with room to spare
  return EntryPrefix(rec_.id).size() + key_size + value_size + kRecordOverhead;
}

void CheckpointStore::Pending::Reserve(uint64_t bytes) {
  const std::string& rep = batch_->Data();
  const uint64_t need = bytes + tail_;
  if (rep.capacity() - rep.size() >= need) return;
  std::string grown;
  grown.reserve(rep.size() + std::max<uint64_t>(need, rep.size()));  // at least doubles: no quadratic copying
  grown.append(rep);
  batch_ = std::make_unique<rocksdb::WriteBatch>(std::move(grown));
}

std::unique_ptr<CheckpointStore::Pending> CheckpointStore::Begin(const CheckpointRecord& rec, uint64_t keep) const {
  SHOAL_CHECK(rec.id > 0, "checkpoint id 0 is reserved for 'none'");
  std::unique_ptr<Pending> p(new Pending());
  p->rec_ = rec;
  // A retried id (a request repeated) replaces what was there.
  const std::string prefix = EntryPrefix(rec.id);
  p->batch_->DeleteRange(prefix, prefix + "\xff");
  const uint64_t committed = Committed().id;
  for (uint64_t o : Written())
    if (o != rec.id && o != committed && (o < keep || o > rec.id)) p->drop_.push_back(o);
  // The manifest (its key, record and entry count: under 100 bytes) and a Delete plus a
  // DeleteRange per dropped checkpoint.
  p->tail_ = 256 + p->drop_.size() * 2 * (EntryPrefix(0).size() + 32);
  return p;
}

void CheckpointStore::Write(std::unique_ptr<Pending> p) {
  const CheckpointRecord& rec = p->rec_;
  ByteWriter count;
  count.Put(p->entries_);
  p->Reserve(0);  // the room Begin kept for the manifest and the drops
  rocksdb::WriteBatch& batch = *p->batch_;
  // The manifest last: a checkpoint without one does not exist.
  Check(batch.Put(ManifestKey(rec.id), EncodeRecord(rec) + count.str()), "checkpoint manifest");
  for (uint64_t o : p->drop_) {
    batch.Delete(ManifestKey(o));
    batch.DeleteRange(EntryPrefix(o), EntryPrefix(o) + "\xff");
  }
  // Failpoint for tests: a disk that does not finish a write until the file named here
  // exists (at most 120 s), to show that nothing but the checkpoint's own ack waits on it.
  if (const char* gate = getenv("SHOAL_FAILPOINT_CHECKPOINT_WRITE_GATE")) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!std::filesystem::exists(gate) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // RocksDB copies the batch into its memtable, and the flush that follows builds a block
  // from that copy; a failed allocation in either aborts the process. Ask the system for
  // that much first, so a shard short of memory refuses the checkpoint and keeps serving.
  const uint64_t copies = 2 * batch.GetDataSize() + (64 << 20);
  if (!AddressSpaceFor(copies))
    throw Error(who_ + ": out of memory writing checkpoint " + std::to_string(rec.id) + " (" +
                std::to_string(p->bytes_) + " bytes): RocksDB's copies of it need " + std::to_string(copies) +
                " bytes more than this process can map; the earlier checkpoints are kept");
  rocksdb::Status s = Durable(&batch);
  if (!s.ok()) {
    // RocksDB refuses every later write after a failed one; reopening recovers to the last
    // whole batch, so the next checkpoint can succeed once there is room again.
    {
      std::lock_guard<std::mutex> lock(mu_);
      db_.reset();
    }
    try {
      Open();
    } catch (const Error&) {
    }
    throw Error(who_ + ": checkpoint " + std::to_string(rec.id) + " (" + std::to_string(p->bytes_) +
                " bytes) was not written to " + path_ + ": " + s.ToString() + "; the earlier checkpoints are kept");
  }
}

void CheckpointStore::WriteState(const CheckpointState& state, uint64_t keep) {
  auto p = Begin(state.record, keep);
  for (auto& [k, v] : state.entries) p->Add(k, v);
  Write(std::move(p));
}

CheckpointRecord CheckpointStore::Visit(
    uint64_t id, const std::function<void(const std::string& key, std::string_view value)>& fn) const {
  const std::string what = path_ + ": checkpoint " + std::to_string(id);
  std::string manifest;
  rocksdb::Status s = db()->Get(rocksdb::ReadOptions(), ManifestKey(id), &manifest);
  if (s.IsNotFound())
    throw Error(what + " is not here (this store holds: " + IdList(Written()) +
                "); was the job started with another checkpoint_dir or process count?");
  Check(s, what);
  ByteReader mr(manifest, what + " manifest");
  CheckpointRecord rec = DecodeRecord(mr, what + " manifest");
  SHOAL_CHECK(rec.id == id, what + ": its manifest names checkpoint " + std::to_string(rec.id));
  const uint64_t expected = mr.Get<uint64_t>();
  mr.ExpectDone();
  uint64_t seen = 0;
  // One snapshot: a write in flight on another thread is not half seen.
  rocksdb::ReadOptions ro;
  std::shared_ptr<rocksdb::DB> db = this->db();
  const rocksdb::Snapshot* snap = db->GetSnapshot();
  ro.snapshot = snap;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
  const std::string prefix = EntryPrefix(id);
  try {
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      fn(it->key().ToString().substr(prefix.size()), std::string_view(it->value().data(), it->value().size()));
      ++seen;
    }
    Check(it->status(), what);
  } catch (...) {
    it.reset();
    db->ReleaseSnapshot(snap);
    throw;
  }
  it.reset();
  db->ReleaseSnapshot(snap);
  SHOAL_CHECK(seen == expected,
              what + ": " + std::to_string(seen) + " entries, its manifest says " + std::to_string(expected));
  return rec;
}

CheckpointState CheckpointStore::Read(uint64_t id) const {
  CheckpointState st;
  st.record = Visit(id, [&](const std::string& k, std::string_view v) { st.entries.emplace(k, std::string(v)); });
  return st;
}

void CheckpointStore::Commit(const CheckpointRecord& rec, const std::map<std::string, std::string>& notes) {
  rocksdb::WriteBatch b;
  for (auto& [key, value] : notes) Check(b.Put("n/" + key, value), "note '" + key + "'");
  Check(b.Put(kCommittedKey, EncodeRecord(rec)), "checkpoint commit");
  Check(Durable(&b), who_ + ": checkpoint commit in " + path_);
}

CheckpointRecord CheckpointStore::Committed() const {
  std::string v;
  rocksdb::Status s = db()->Get(rocksdb::ReadOptions(), kCommittedKey, &v);
  if (s.IsNotFound()) return {};
  Check(s, path_);
  ByteReader r(v, path_ + ": committed checkpoint record");
  CheckpointRecord rec = DecodeRecord(r, path_ + ": committed checkpoint record");
  r.ExpectDone();
  return rec;
}

void CheckpointStore::PutNote(const std::string& key, const std::string& value) {
  rocksdb::WriteBatch b;
  Check(b.Put("n/" + key, value), "note '" + key + "'");
  Check(Durable(&b), who_ + ": note '" + key + "' in " + path_);
}

std::optional<std::string> CheckpointStore::Note(const std::string& key) const {
  std::string v;
  rocksdb::Status s = db()->Get(rocksdb::ReadOptions(), "n/" + key, &v);
  if (s.IsNotFound()) return std::nullopt;
  Check(s, who_ + ": note '" + key + "' in " + path_);
  return v;
}

std::vector<uint64_t> CheckpointStore::Written() const {
  std::vector<uint64_t> ids;
  std::shared_ptr<rocksdb::DB> db = this->db();
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("m/"); it->Valid() && it->key().starts_with("m/"); it->Next()) {
    std::string hex = it->key().ToString().substr(2);
    if (hex.size() == 16 && hex.find_first_not_of("0123456789abcdef") == std::string::npos)
      ids.push_back(std::stoull(hex, nullptr, 16));
  }
  std::sort(ids.rbegin(), ids.rend());
  return ids;
}

std::vector<CheckpointRecord> CheckpointStore::Records() const {
  std::shared_ptr<rocksdb::DB> db = this->db();
  return ReadManifests(db.get(), path_);
}

}  // namespace shoal
