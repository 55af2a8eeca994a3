// A shard's checkpoints (<checkpoint_dir>/shard-K, a CheckpointStore): every tensor the
// shard holds with its optimizer state, one entry per tensor. A job-wide checkpoint is
// complete once the coordinator (shard 0) has committed it, which a worker asks for only
// after every shard acknowledged its write; resume always loads the committed one. A write
// request names the newest committed checkpoint (`keep`), which no write ever removes.
//
// The serving thread takes the snapshot (Snapshot: a copy in memory, fast); the synced
// write (Write: the disk) may run on another thread, so heartbeats never wait for a disk.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "common/checkpoint/checkpoint_store.h"
#include "common/checkpoint_record.h"
#include "server/kv_shard.h"

namespace shoal {

class Checkpointer {
 public:
  // Opens <dir>/shard-<shard>; see CheckpointStart for what an existing one means.
  Checkpointer(const std::string& dir, int shard, CheckpointStart start);

  // The shard's tensors and `kv.rule()` state as checkpoint rec.id.
  std::unique_ptr<CheckpointStore::Pending> Snapshot(const CheckpointRecord& rec, uint64_t keep,
                                                     const KvShard& kv) const;
  // Synced; throws shoal::Error when the disk refuses it (earlier checkpoints stay).
  void Write(std::unique_ptr<CheckpointStore::Pending> p) { store_.Write(std::move(p)); }
  // Snapshot + Write; returns the bytes written.
  uint64_t Write(const CheckpointRecord& rec, uint64_t keep, const KvShard& kv);
  // Replaces what `kv` holds with checkpoint `id`; throws naming what is missing or bad.
  void Load(uint64_t id, KvShard* kv) const;
  void Commit(const CheckpointRecord& rec, const std::map<std::string, std::string>& notes = {}) {
    store_.Commit(rec, notes);
  }
  CheckpointRecord Committed() const { return store_.Committed(); }
  std::vector<uint64_t> Written() const { return store_.Written(); }
  // Shard 0's coordinator keeps its recovery generation here (CheckpointStore::PutNote).
  void PutNote(const std::string& key, const std::string& value) { store_.PutNote(key, value); }
  std::optional<std::string> Note(const std::string& key) const { return store_.Note(key); }
  const std::string& path() const { return store_.path(); }

 private:
  CheckpointStore store_;
};

}  // namespace shoal
