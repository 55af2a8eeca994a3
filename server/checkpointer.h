// A shard's checkpoints in RocksDB (<checkpoint_dir>/shard-K).
//
// One checkpoint = every tensor the shard holds with its optimizer state, written as one
// synced WriteBatch whose last entry is the shard's manifest: RocksDB applies a batch
// whole or not at all, so a crash mid-write leaves the previous checkpoint as it was. A
// job-wide checkpoint is complete once the coordinator (shard 0) has committed it, which a
// worker asks for only after every shard acknowledged its write; resume always loads the
// committed one. Each shard keeps its newest two, so the committed checkpoint survives
// while the next one is being written.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "common/checkpoint_record.h"
#include "server/kv_shard.h"

namespace rocksdb {
class DB;
}

namespace shoal {

class Checkpointer {
 public:
  // Opens (or creates) <dir>/shard-<shard>. `fresh`: a new job, so checkpoints of an
  // earlier run in the same directory are removed first (resume must never pick them up).
  Checkpointer(const std::string& dir, int shard, bool fresh);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Writes the shard's tensors and `kv.rule()` state as checkpoint rec.id; drops older ones
  // but the previous. Returns the bytes written.
  uint64_t Write(const CheckpointRecord& rec, const KvShard& kv);
  // Replaces what `kv` holds with checkpoint `id`; throws naming what is missing or bad.
  void Load(uint64_t id, KvShard* kv) const;
  // The coordinator's record of the newest complete checkpoint (synced before returning).
  void Commit(const CheckpointRecord& rec);
  CheckpointRecord Committed() const;  // id 0 when there is none
  // Checkpoints this shard holds a manifest for, newest first.
  std::vector<uint64_t> Written() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int shard_;
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace shoal
