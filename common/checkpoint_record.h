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
  uint32_t shards = 0;           // shards that wrote it
};

inline void ToWire(const CheckpointRecord& r, msg::CheckpointInfo::Builder b) {
  b.setId(r.id);
  b.setStep(r.step);
  b.setEpoch(r.epoch);
  b.setBatch(r.batch);
  b.setShards(r.shards);
}

inline CheckpointRecord FromWire(msg::CheckpointInfo::Reader b) {
  CheckpointRecord r;
  r.id = b.getId();
  r.step = b.getStep();
  r.epoch = b.getEpoch();
  r.batch = b.getBatch();
  r.shards = b.getShards();
  return r;
}

}  // namespace shoal
