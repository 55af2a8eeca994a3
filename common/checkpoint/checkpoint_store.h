// Checkpoints in one RocksDB database, for whoever keeps them: a parameter-server shard
// (<checkpoint_dir>/shard-K) or a worker of a job without servers (<checkpoint_dir>/worker-R).
//
// One checkpoint = named entries plus a manifest (its record and entry count), written as
// one synced WriteBatch with the manifest last: RocksDB applies a batch whole or not at all,
// so a crash or a full disk mid-write leaves every earlier checkpoint as it was. Which
// checkpoint a job resumes from is decided above this store (the job's commit rule); the
// store only keeps what that rule needs: a write drops the checkpoints older than the
// `keep` id its writer names (the job's newest committed one), never that one nor this
// store's own committed record, and drops those newer than itself (a timeline a resume
// abandoned).
//
// Thread safety: reads may run while one Write is in flight on another thread (a shard
// writes off its serving thread); Begin and Write must not overlap another Write.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/checkpoint/checkpoint_state.h"
#include "common/checkpoint_record.h"

namespace rocksdb {
class DB;
class Status;
class WriteBatch;
}  // namespace rocksdb

namespace shoal {

// How a process opens its checkpoint directory.
enum class CheckpointStart {
  kNew,     // a new job: a directory holding checkpoints is refused (the error names --resume and --fresh)
  kFresh,   // a new job that deletes what the directory holds (--fresh)
  kResume,  // the job continues from what is there (--resume)
};

// From the --resume and --fresh flags; throws when both are given.
CheckpointStart CheckpointStartFrom(bool resume, bool fresh);

// What one store holds, as the launcher sees it before (or between) the job's processes.
struct HeldCheckpoints {
  std::vector<CheckpointRecord> written;  // every checkpoint with a manifest, newest first
  CheckpointRecord committed;             // id 0 when none
  bool empty() const { return written.empty() && committed.id == 0; }
};

class CheckpointStore {
 public:
  // Opens (or creates) `path`; `who` ("shard 1", "worker 0") names the owner in errors.
  // kNew over a store holding checkpoints throws InputError: a restart would be refused alike.
  CheckpointStore(const std::string& path, const std::string& who, CheckpointStart start);
  // What the store at `path` holds, read-only: nothing is created, locked or changed, so the
  // launcher can look before starting any process and after stopping them all. nullopt when
  // no store is there; throws shoal::Error naming the path when one is there but unreadable.
  // Must not run while a process writes the store (RocksDB leaves that undefined).
  static std::optional<HeldCheckpoints> Peek(const std::string& path);
  ~CheckpointStore();
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  // A checkpoint being built: a snapshot of the owner's state, in memory.
  class Pending {
   public:
    ~Pending();
    void Add(const std::string& key, std::string_view value) { Add(key, {value}); }
    // An entry given in pieces (a tensor's header, then its buffer), stored as their
    // concatenation without joining them in memory first.
    void Add(const std::string& key, std::initializer_list<std::string_view> parts);
    // Makes room for `bytes` more of entries. Every allocation the batch needs happens here,
    // where a failed one throws std::bad_alloc and leaves the store as it was: RocksDB's own
    // appends do not survive one (Debian's build asserts and aborts).
    void Reserve(uint64_t bytes);
    // What Add of a key and value of these sizes takes of the batch (for Reserve up front).
    uint64_t EntryRoom(size_t key_size, uint64_t value_size) const;
    const CheckpointRecord& record() const { return rec_; }
    uint64_t bytes() const { return bytes_; }

   private:
    friend class CheckpointStore;
    Pending();
    CheckpointRecord rec_;
    uint64_t entries_ = 0, bytes_ = 0;
    uint64_t tail_ = 0;  // what Write appends (the manifest, the drops): kept free by Reserve
    std::vector<uint64_t> drop_;
    std::unique_ptr<rocksdb::WriteBatch> batch_;
  };
  // Starts checkpoint rec.id (> 0); `keep`: the oldest checkpoint the writer still needs.
  std::unique_ptr<Pending> Begin(const CheckpointRecord& rec, uint64_t keep) const;
  // Writes it synced, with the drops, in one batch; throws shoal::Error naming the path when
  // the write fails (a full disk, or too little memory for RocksDB's copies of it), leaving
  // every earlier checkpoint as it was.
  void Write(std::unique_ptr<Pending> p);
  // Begin + every entry of `state` + Write.
  void WriteState(const CheckpointState& state, uint64_t keep);

  // Checkpoint `id`, checked against its manifest; throws naming what is missing or bad.
  CheckpointState Read(uint64_t id) const;
  // Visits its entries in key order without gathering them (large shards).
  CheckpointRecord Visit(uint64_t id,
                         const std::function<void(const std::string& key, std::string_view value)>& fn) const;

  // The newest checkpoint the owner knows to be complete job-wide (synced before returning),
  // with `notes` (PutNote's) in the same write: what they say of it holds exactly when it
  // is the committed one.
  void Commit(const CheckpointRecord& rec, const std::map<std::string, std::string>& notes = {});
  CheckpointRecord Committed() const;  // id 0 when there is none
  // Checkpoints this store holds a manifest for, newest first.
  std::vector<uint64_t> Written() const;
  // Their records (manifests), newest first.
  std::vector<CheckpointRecord> Records() const;
  // A small note of the owner's beside its checkpoints (the coordinator's recovery
  // generation), synced before returning; no checkpoint write or drop touches it.
  void PutNote(const std::string& key, const std::string& value);
  std::optional<std::string> Note(const std::string& key) const;  // nullopt when never put
  const std::string& path() const { return path_; }

 private:
  void Open();
  // Applies `batch` and makes it durable in a table file (not only in the log).
  rocksdb::Status Durable(rocksdb::WriteBatch* batch);
  // The error for a damaged folder: names it, what is wrong, and the way out.
  std::string Damaged(const std::string& what) const;
  std::shared_ptr<rocksdb::DB> db() const;

  std::string path_, who_;
  mutable std::mutex mu_;  // guards db_ (reopened after a failed write)
  std::shared_ptr<rocksdb::DB> db_;
};

// The refusal of a new run (neither --resume nor --fresh) over what `held` holds, naming
// `who` ("worker 0") and `path`.
std::string EarlierRunError(const std::string& who, const std::string& path, const HeldCheckpoints& held);

// "the newest complete one is 7 (step 700)", or "" for id 0: for error messages.
std::string DescribeCommitted(const CheckpointRecord& committed);

// The newest checkpoint of a job without servers that is complete: every worker's store holds
// it, or the record of some holder lists that worker absent (elastic diloco: dead at the round
// it was taken at). `held[r]`: the records worker r's store holds. Id 0 when there is none.
// The launcher (over the stores) and the workers (over what each published) use this one rule.
CheckpointRecord NewestCompleteOfWorkers(const std::vector<std::vector<CheckpointRecord>>& held);

// "7, 5" (or "none"): ids for error messages.
std::string IdList(const std::vector<uint64_t>& ids);

}  // namespace shoal
