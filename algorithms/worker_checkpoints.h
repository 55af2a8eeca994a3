// Checkpoints of a job whose model lives on the workers (every algorithm without servers).
// Each worker keeps its own in <checkpoint_dir>/worker-R (a CheckpointStore: its weights,
// its algorithm's state, the step), so no host needs another's disk.
//
// The commit rule: a checkpoint counts once every worker has written it. Each worker
// publishes that it wrote id N under its own key for N in the job's rendezvous store and
// waits (bounded) until every other worker's key for N is there, then records it as
// committed. No worker removes a
// checkpoint older than its own committed one, so the newest id that every worker still
// holds is always complete; on --resume the workers publish what they hold and all load
// that id.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "common/checkpoint/checkpoint_store.h"
#include "common/config.h"

namespace shoal {

class Store;

class WorkerCheckpoints {
 public:
  // Opens <cfg.checkpoint_dir>/worker-<rank>; `store` outlives this object.
  WorkerCheckpoints(const JobConfig& cfg, int rank, int world, Store* store, CheckpointStart start);
  // The newest checkpoint every worker holds (same on every rank); throws naming what each
  // holds when there is none.
  CheckpointState Resume();
  // Writes state (record.id > 0) and returns once every worker has written that id.
  void Save(CheckpointState state);
  uint64_t committed() const { return committed_; }

 private:
  // Blocks until `key_prefix<r>` holds a value for every rank r (at most timeout_ms_ in all;
  // throws naming the first rank missing); returns them.
  std::vector<std::string> GatherAll(const std::string& key_prefix, const std::string& what);

  int rank_, world_;
  Store* store_;
  CheckpointStore ckpt_;
  uint64_t committed_ = 0;
  int timeout_ms_;
};

}  // namespace shoal
