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
//
// Elastic (diloco with elastic = true, workers lost and restarted alone while the job runs):
// a checkpoint's writers are the members of the outer round it was taken at; the others are
// listed in its record (record.absent) and write nothing of it. It commits once every writer
// wrote it; a writer lost first (listed dead by the coordinator, or restarted alone since:
// it says so under its key until it holds the global state, Joined; a mark that stays a
// second) leaves it uncommitted, and training goes on. A checkpoint is
// complete where every worker holds it or is absent from it (NewestCompleteOfWorkers), and
// on --resume a worker absent from the newest complete one gets a holder's copy over the
// algorithm's communicator (the algorithm's LoadState sees its rank in record.absent and keeps
// only the shared global state).
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
  // Opens <cfg.checkpoint_dir>/worker-<rank>; `store` outlives this object. `elastic`: the job
  // survives lost workers (above); `rejoined`: this worker was restarted alone into the running
  // job (elastic only; its store is kept as it is, and no Resume follows).
  WorkerCheckpoints(const JobConfig& cfg, int rank, int world, Store* store, CheckpointStart start,
                    bool elastic = false, bool rejoined = false);
  // The newest checkpoint every worker holds (same on every rank) or, when the job has
  // another number of workers than the run that wrote it, the newest one some worker knows
  // complete, sent to all through `peers` (entries under `averaged` prefixes: the mean over
  // the workers holding it). Throws InputError naming what each holds when there is none,
  // or when the world changed and `peers` is null (an algorithm that cannot share it).
  CheckpointState Resume(Communicator* peers, const std::vector<std::string>& averaged);
  // Training goes on from `step` as checkpoint `id`: later checkpoints are id + (step' - step).
  void ContinueFrom(uint64_t id, int64_t step) { SetIdOffset(int64_t(id) - step); }
  // The id of a checkpoint taken after `step` global steps.
  uint64_t IdAt(int64_t step) const { return uint64_t(step + id_offset_); }
  // A worker restarted alone, once it holds the global state and trains on from `step`: it
  // writes every checkpoint after that step (the one at it lists it absent).
  void Joined(int64_t step);
  // Writes state (record.id > 0; record.absent: the workers that write no part of it, elastic
  // only) and returns once every other writer has written that id: true, committed. Elastic:
  // false when a writer was lost first (the checkpoint stays uncommitted). Otherwise a writer
  // silent past the bound throws.
  bool Save(CheckpointState state);
  uint64_t committed() const { return committed_; }
  // After Resume: what this worker resumed from, for the resume line ("its own checkpoint 40",
  // "worker 0's copy of checkpoint 40 (absent from it: ...)").
  const std::string& resumed_from() const { return resumed_from_; }

 private:
  // Blocks until `key_prefix<r>` holds a value for every rank r (at most timeout_ms_ in all;
  // throws naming the first rank missing); returns them.
  std::vector<std::string> GatherAll(const std::string& key_prefix, const std::string& what);
  // Elastic: every worker of the newest complete checkpoint `rec` (record of a holder) gets
  // it, a worker absent from it as `source` (the lowest holder) sends it over `peers`.
  CheckpointState ShareWithAbsent(const CheckpointRecord& rec, const std::vector<std::vector<CheckpointRecord>>& held,
                                  Communicator* peers);
  // Whether rank r wrote checkpoint `id`; elastic: kLost when the coordinator lists it dead,
  // kRestarted when it was restarted alone and has not yet taken the global state.
  enum class Written { kYes, kNotYet, kLost, kRestarted };
  Written Wrote(int r, uint64_t id, int wait_ms);
  // Sets id_offset_; elastic: rank 0 publishes it for a worker restarted alone later.
  void SetIdOffset(int64_t offset);

  int rank_, world_;
  Store* store_;
  CheckpointStore ckpt_;
  // The checkpoint a job resumed on another number of workers starts from, sent by `source`.
  CheckpointState Reshape(uint64_t id, int source, const std::vector<char>& holds, Communicator* peers,
                          const std::vector<std::string>& averaged);

  uint64_t committed_ = 0;
  int64_t id_offset_ = 0;
  int timeout_ms_;
  bool elastic_;
  std::string resumed_from_;
};

}  // namespace shoal
