// What identifies one checkpoint of a job, shared by servers (which write it), the
// coordinator (which commits it) and workers (which ask for it and resume from it).
#pragma once
#include <cstdint>

#include "common/messages/schema.capnp.h"

namespace shoal {

struct CheckpointRecord {
  uint64_t id = 0;               // 0 = none; otherwise the global steps done when it was taken (>= 1)
  int64_t step = 0;              // global steps done
  int64_t epoch = 0, batch = 0;  // the data position training continues from
  uint32_t shards = 0;           // shards (or, without servers, workers) that wrote it
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
}

inline CheckpointRecord FromWire(msg::CheckpointInfo::Reader b) {
  CheckpointRecord r;
  r.id = b.getId();
  r.step = b.getStep();
  r.epoch = b.getEpoch();
  r.batch = b.getBatch();
  r.shards = b.getShards();
  r.keep = b.getKeep();
  return r;
}

}  // namespace shoal
