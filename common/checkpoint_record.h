// What identifies one checkpoint of a job, shared by servers (which write it), the
// coordinator (which commits it) and workers (which ask for it and resume from it).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/messages/schema.capnp.h"

namespace shoal {

struct CheckpointRecord {
  uint64_t id = 0;               // 0 = none; otherwise the global steps done when it was taken (>= 1)
  int64_t step = 0;              // global steps done
  int64_t epoch = 0, batch = 0;  // the data position training continues from
  uint32_t shards = 0;           // shards (or, without servers, workers) that wrote it
  // Without servers, elastic diloco: the workers (ranks below `shards`) recorded dead at the
  // outer round it was taken at, or that joined at its very step; they wrote no part of it.
  // Stored in the manifest; not sent on the wire (PS jobs have none).
  std::vector<uint32_t> absent;
  // Not stored in the checkpoint: in a PS job's answers from the coordinator, the workers
  // whose steps it counts (from the clocks among its tensors; 0 = not known).
  uint32_t workers = 0;
  // Not stored: in a write request, the newest committed checkpoint, which the write must
  // not remove.
  uint64_t keep = 0;
};

inline void ToWire(const CheckpointRecord& r, msg::CheckpointInfo::Builder b) {
  b.setId(r.id);
  b.setStep(r.step);
  b.setEpoch(r.epoch);
  b.setBatch(r.batch);
  b.setShards(r.shards);
  b.setKeep(r.keep);
  b.setWorkers(r.workers);
}

inline CheckpointRecord FromWire(msg::CheckpointInfo::Reader b) {
  CheckpointRecord r;
  r.id = b.getId();
  r.step = b.getStep();
  r.epoch = b.getEpoch();
  r.batch = b.getBatch();
  r.shards = b.getShards();
  r.keep = b.getKeep();
  r.workers = b.getWorkers();
  return r;
}

// Checkpoint `old`, written by `old_workers` workers of `batch_size` samples each, as a
// position of a job on `workers` workers with `steps_per_epoch` steps an epoch: the same
// epoch and, in it, the batch with as many samples of the epoch behind it (rounded down: no
// sample is skipped, at most one global batch is seen twice). Workers, the trainer and the
// servers (their step count) all map a checkpoint this way, so they agree on the step.
inline CheckpointRecord OnOtherWorkers(const CheckpointRecord& old, int64_t batch_size, int old_workers, int workers,
                                       int64_t steps_per_epoch) {
  CheckpointRecord r = old;
  const int64_t samples = old.batch * batch_size * int64_t(old_workers);
  r.batch = samples / (batch_size * int64_t(workers));
  if (r.batch > steps_per_epoch - 1) r.batch = steps_per_epoch - 1;
  if (r.batch < 0) r.batch = 0;
  r.step = old.epoch * steps_per_epoch + r.batch;
  return r;
}

// The console's account of OnOtherWorkers: "checkpoint 40 was written by 2 workers, this job
// has 3: epoch 0 batch 40 of 64 samples each becomes batch 26 of 96 (step 26)".
inline std::string OnOtherWorkersLine(const CheckpointRecord& old, const CheckpointRecord& now, int64_t batch_size,
                                      int old_workers, int workers) {
  char line[320];
  snprintf(line, sizeof line,
           "checkpoint %llu was written by %d workers, this job has %d: epoch %lld batch %lld of %lld samples each "
           "becomes batch %lld of %lld (step %lld)",
           (unsigned long long)old.id, old_workers, workers, (long long)old.epoch, (long long)old.batch,
           (long long)(batch_size * int64_t(old_workers)), (long long)now.batch,
           (long long)(batch_size * int64_t(workers)), (long long)now.step);
  return line;
}

}  // namespace shoal
