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
//
// A job resumed on another number of workers (or with a worker whose disk is new) takes the
// newest checkpoint some worker knows was complete (it holds it and committed it) and sends
// it to every rank over the algorithm's communicator: the synchronous algorithms' model and
// optimizer state are the same on every worker, and entries that differ (adpsgd's models)
// are averaged over the workers that hold them. Its record keeps the writing run's worker
// count (record.shards), which tells algorithms and the trainer that the world changed.
// Checkpoint ids then go on from the resumed id (id = step + offset), so they keep growing
// even where the new run's step count restarts lower.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint/checkpoint_store.h"
#include "common/config.h"

namespace shoal {

class Communicator;
class Store;

class WorkerCheckpoints {
 public:
  // Opens <cfg.checkpoint_dir>/worker-<rank>; `store` outlives this object.
  WorkerCheckpoints(const JobConfig& cfg, int rank, int world, Store* store, CheckpointStart start);
  // The newest checkpoint every worker holds (same on every rank) or, when the job has
  // another number of workers than the run that wrote it, the newest one some worker knows
  // complete, sent to all through `peers` (entries under `averaged` prefixes: the mean over
  // the workers holding it). Throws InputError naming what each holds when there is none,
  // or when the world changed and `peers` is null (an algorithm that cannot share it).
  CheckpointState Resume(Communicator* peers, const std::vector<std::string>& averaged);
  // Training goes on from `step` as checkpoint `id`: later checkpoints are id + (step' - step).
  void ContinueFrom(uint64_t id, int64_t step) { id_offset_ = int64_t(id) - step; }
  // The id of a checkpoint taken after `step` global steps.
  uint64_t IdAt(int64_t step) const { return uint64_t(step + id_offset_); }
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
  // The checkpoint a job resumed on another number of workers starts from, sent by `source`;
  // `read`: one this rank has read already (used when it is checkpoint `id`).
  CheckpointState Reshape(uint64_t id, int source, const std::vector<char>& holds, Communicator* peers,
                          const std::vector<std::string>& averaged, CheckpointState read);

  uint64_t committed_ = 0;
  int64_t id_offset_ = 0;
  int timeout_ms_;
};

}  // namespace shoal
