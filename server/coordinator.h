// The control plane, run by shard 0 but independent of the KV data path: registration,
// the cluster map (tensor placement, server addresses), barriers and heartbeats.
#pragma once
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/rendezvous/rendezvous.h"
#include "common/transport/transport.h"
#include "server/checkpointer.h"

namespace shoal {

struct TensorPlacement {
  std::string name;
  uint64_t bytes = 0;
  int shard = 0;
};

// Packs whole tensors onto shards, largest first onto the least-loaded shard, so bytes
// balance and every member computing it from the same list gets the same answer.
std::vector<TensorPlacement> PlaceTensors(std::vector<TensorPlacement> tensors, int num_shards);
// Placement for a job resuming checkpoints: every tensor named in `kept` stays on that shard
// (each shard restores only its own store), and the others (the clocks of workers added
// since) go largest first onto the least-loaded shard. Throws for a kept shard outside
// the job.
std::vector<TensorPlacement> PlaceAround(std::vector<TensorPlacement> tensors, const std::map<std::string, int>& kept,
                                         int num_shards);

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;
  // Sends a reply to the peer with that identity.
  using ReplyFn = std::function<void(const PeerId& to, OutMessage& m)>;

  Coordinator(const JobConfig& cfg, ReplyFn reply);

  // Handles register / barrier / heartbeat / rendezvous; returns false for other kinds.
  bool Handle(const InMessage& m, Clock::time_point now);
  // Reports members whose heartbeats stopped; call periodically. `now`: the last moment
  // the caller had read every message queued for it (its silence, not theirs, is no death).
  void Tick(Clock::time_point now);

  // Where committed checkpoints are recorded (shard 0's checkpointer); nullptr = no
  // checkpoints in this job, and commits or resume queries get an error saying so. What
  // the coordinator cannot learn again from the members lives beside them, synced: the
  // recovery generation and the workers that finished. `rejoin`: shard 0 was restarted
  // alone while the job runs; the coordinator takes those back and starts the next
  // generation, so every request of the one before is refused (membership comes back with
  // the heartbeats, placement with the workers' registrations). Otherwise the job starts
  // (or resumes whole) at generation 0.
  void SetCheckpointer(Checkpointer* c, bool rejoin = false);

  // The committed checkpoint (SetCheckpointer's), with the workers that wrote it: one clock
  // each among the tensors kept with it (0 when it kept none).
  CheckpointRecord Committed() const;

  bool IsAlive(msg::Role role, int rank) const;
  // Every worker has left (finished) or is known dead: the servers can go.
  bool JobOver() const;
  // Every other shard has been told the job is over (or is gone): shard 0 can go too.
  bool ShardsTold() const;
  size_t placed_tensors() const { return placement_.size(); }
  // Every registered tensor and its shard; empty until the first worker registered a list.
  const std::vector<TensorPlacement>& placement() const { return placement_; }
  // Goes up by one each time a shard (or ps_sync worker) restarted alone asks what to
  // resume (resumeQuery with `rejoin`), or shard 0 itself comes back alone (SetCheckpointer
  // with `rejoin`): barriers and commits of an older generation are refused from then on,
  // so every worker notices and recovers (algorithms/ps: re-pull; ps_sync rolls back).
  uint32_t generation() const { return generation_; }

 private:
  RendezvousService rendezvous_;  // the job's key-value rendezvous (ring endpoints, NCCL ids)
  struct MemberState {
    Clock::time_point last_seen;
    bool alive = true;
  };
  struct BarrierState {
    std::map<int, PeerId> waiting;  // rank -> identity
    std::map<int, uint64_t> request_ids;
    bool live_only = false;  // complete once every worker not known dead waits (Client::LiveBarrier)
  };
  using Key = std::pair<int, int>;  // (role, rank)

  void Seen(const Key& k, Clock::time_point now);
  void OnRegister(const InMessage& m);
  void OnBarrier(const InMessage& m);
  void OnCheckpoint(const InMessage& m);
  void OnLeave(const InMessage& m);
  void ReplyClusterMap(const InMessage& m);
  void ReplyError(const PeerId& to, uint64_t request_id, const std::string& what, bool input_error = false);
  // Fails every waiting barrier, or with `strict_only` those that a death fails (a live-only
  // barrier outlives a death).
  void FailBarriers(const std::string& why, bool strict_only = false);
  // Answers `name`'s waiters once everyone it waits for is there.
  void MaybeCompleteBarrier(const std::string& name);
  // Writes generation_ and left_ to the checkpointer (synced); throws shoal::Error.
  void Persist(uint32_t generation) const;
  static std::string Name(const Key& k);

  const JobConfig& cfg_;
  ReplyFn reply_;
  std::map<Key, MemberState> members_;
  std::vector<TensorPlacement> placement_;
  // The registered tensors, one "name\t[shape]\tshard" line each, sorted: kept with the first
  // checkpoint this coordinator commits, so a resume under another model is refused at
  // registration naming the tensor (a shard would only fail its first pull), a resume keeps
  // every tensor on the shard that restores it, and the clocks among them say how many
  // workers wrote it.
  std::string tensors_;
  bool tensors_kept_ = false;
  std::map<std::string, BarrierState> barriers_;
  Checkpointer* checkpointer_ = nullptr;
  std::set<int> left_;  // workers that said they finished (their silence is no death)
  std::set<int> told_;  // server shards told the job is over
  uint32_t generation_ = 0;
  std::string last_restart_;  // "server shard 1 restarted from checkpoint 40", for answers
};

}  // namespace shoal
