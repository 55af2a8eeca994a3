// The worker side of the parameter servers: register with the coordinator, then push and
// pull named tensors. Each call splits its tensors by shard and talks to all shards at
// once; Push/Pull return a timestamp right away and Wait(ts) blocks, bounded, until every
// shard has answered (the ps-lite shape). A shard applies one client's requests in the
// order they were issued, so a Pull issued right after a Push sees it without waiting in
// between. Not thread-safe: one Client per thread.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/checkpoint_record.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/training_plan.h"
#include "common/transport/heartbeat.h"
#include "common/transport/transport.h"

namespace shoal {

struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  size_t bytes() const;
};

// Bytes to push. They are sent in place: keep them unchanged until Wait(ts) returns.
// `keep` (optional) is held until ZeroMQ is done with the bytes.
struct TensorRef {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
  std::shared_ptr<const void> keep;
};

// A pulled tensor; its bytes are the received frame itself (no copy was made), at whatever
// byte offset ZeroMQ delivered it: read them through ToFloats or memcpy, never through a
// float pointer.
struct PulledTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t version = 0;  // pushes the shard had applied when it answered
  Frame bytes;
  const void* data() const { return bytes.data(); }
  size_t size() const { return bytes.size(); }
  std::vector<float> ToFloats() const;
};

struct ClusterInfo {
  struct Member {
    msg::Role role;
    int rank;
    bool alive;
  };
  std::vector<std::string> servers;
  int world_size = 0;
  std::map<std::string, int> shard_of;  // tensor name -> shard
  std::vector<Member> members;
};

struct ClientOptions {
  msg::Role role = msg::Role::WORKER;
  int rank = 0;
  int timeout_ms = 30000;  // bound on every wait for a server's answer
  bool heartbeat = true;
  // Wait() asks the coordinator, each heartbeat period it waits in vain, whether a shard
  // was restarted alone, and then throws ShardRestarted instead of waiting out timeout_ms
  // for an answer the dead shard will never send.
  bool watch_restarts = false;
  // A shard (or ps_sync worker) restarted alone: its first resume query starts a new
  // generation (later ones, CheckRestarts, only ask).
  bool rejoin = false;
};

// A shard was restarted alone (recovery generation `generation`): it restored checkpoint
// `from`; requests of the generation before are lost or refused.
class ShardRestarted : public Error {
 public:
  ShardRestarted(uint32_t generation, const CheckpointRecord& from, const std::string& what)
      : Error(what), generation(generation), from(from) {}
  uint32_t generation;
  CheckpointRecord from;
};

// A control request the coordinator did not answer within timeout_ms (as opposed to one
// it refused): the caller may ask again when waiting longer is what it wants.
class ControlTimeout : public Error {
 public:
  using Error::Error;
};

class Client {
 public:
  Client(const JobConfig& cfg, const ClientOptions& opts);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Registers this member. The first registration that lists tensors fixes their
  // placement on shards; later lists must name the same tensors and sizes. With `plan`,
  // every shard then learns it (and refuses one that disagrees with an earlier worker's).
  const ClusterInfo& Register(const std::vector<TensorSpec>& tensors = {}, const TrainingPlan* plan = nullptr);
  int Push(const std::vector<TensorRef>& tensors, msg::PushOp op = msg::PushOp::ADD);
  // Push, then pull the same tensors' new values, in one round trip per shard (the step
  // of a parameter-server worker: gradients out, weights back). Fills (*out)[i] for
  // tensors[i] once Wait(ts) returns.
  int PushPull(const std::vector<TensorRef>& tensors, msg::PushOp op, std::vector<PulledTensor>* out);
  // Fills (*out)[i] for names[i] once Wait(ts) returns.
  int Pull(const std::vector<std::string>& names, std::vector<PulledTensor>* out);
  // Throws shoal::Error with the server's message, or naming the shards that did not
  // answer within timeout_ms.
  void Wait(int ts);
  // Tells the coordinator this worker has finished: once every worker has, the servers
  // exit by themselves.
  void Leave();
  // Returns once every worker of the job has reached the barrier of that name.
  void Barrier(const std::string& name);
  // Returns once every worker the coordinator does not know to be dead has reached the
  // barrier of that name; a death while waiting does not fail it. It waits as long as the
  // coordinator answers and the others live (an asynchronous job's slower workers may
  // need far longer than timeout_ms for their last epoch): it throws when the coordinator
  // stops answering, or refuses the barrier (a new recovery generation).
  void LiveBarrier(const std::string& name);
  // The members as the coordinator sees them now: a worker whose heartbeats stopped for
  // [cluster] heartbeat_timeout_ms has alive = false. Also updates cluster().members.
  const std::vector<ClusterInfo::Member>& Members();

  // Checkpoints: every shard writes `rec` (blocks until all acknowledged), then the
  // coordinator commits it as the newest complete one. Call at a point where the shards'
  // state is the one to resume from. The shards keep the last checkpoint this client
  // committed (or found at resume) until this one is committed.
  void Checkpoint(const CheckpointRecord& rec);
  // The newest complete checkpoint the coordinator knows (id 0: none); also learns the
  // coordinator's recovery generation (see latest_generation()).
  CheckpointRecord NewestCheckpoint();
  // Throws ShardRestarted when the coordinator's recovery generation is newer than this
  // client's (one round trip to the coordinator).
  void CheckRestarts();
  // Every shard loads checkpoint `rec.id` and serves this client's generation from then on
  // (ps_sync's rollback after a shard was restarted alone).
  void Reload(const CheckpointRecord& rec);
  // The recovery generation this client's requests carry; SetGeneration once recovered.
  uint32_t generation() const { return generation_; }
  // The coordinator's generation as of the last NewestCheckpoint / CheckRestarts.
  uint32_t latest_generation() const { return latest_generation_; }
  void SetGeneration(uint32_t g) { generation_ = g; }

  const ClusterInfo& cluster() const { return cluster_; }
  uint64_t bytes_sent() const;

 private:
  // One request in flight. Requests are recycled (see NewRequest), so that a push or pull
  // costs no allocations for its bookkeeping once the first few have run.
  struct Request {
    uint64_t id = 0;
    std::vector<char> waiting;  // per shard: yet to answer
    int left = 0;               // shards yet to answer
    std::vector<PulledTensor>* out = nullptr;
    // Pulls: per shard, the indices in *out of the tensors asked of it, in the order asked
    // (a shard answers in that order; Dispatch still accepts any order).
    std::vector<std::vector<uint32_t>> slots;
    std::string error;
    std::shared_ptr<std::atomic<int>> unreleased;  // pushed frames ZeroMQ still holds
    msg::Kind ack = msg::Kind::PUSH_ACK;           // the answer kind that means done
    msg::Kind asked = msg::Kind::PUSH;             // the request's kind (for errors)
  };
  int ShardOf(const std::string& name) const;
  // A cleared Request with a fresh id, in pending_.
  Request& NewRequest(msg::Kind asked, msg::Kind ack);
  Request* FindRequest(uint64_t id);
  void EraseRequest(Request* req);
  // Sends `m` to `shard` as part of `req`.
  void SendTo(Request& req, size_t shard, OutMessage& m);
  // Throws naming a name listed twice in `names` (`what`: "push", "pull").
  void CheckNoRepeats(const char* what, std::vector<const std::string*>& names);
  void SendPlan(const TrainingPlan& plan);
  // Sends one `kind` message (filled by `fill`) to every shard and waits for every `ack`.
  void AskEveryShard(msg::Kind kind, msg::Kind ack, const std::function<void(msg::Header::Builder)>& fill);
  int SendPush(const std::vector<TensorRef>& tensors, msg::PushOp op, std::vector<PulledTensor>* out);
  void Dispatch(int shard, InMessage& m);
  // Sends a request to the coordinator and waits (bounded by timeout_ms) for its answer;
  // `resend`: again while unanswered (see client.cc), for idempotent requests.
  InMessage Control(OutMessage& m, uint64_t id, const std::string& what, bool resend = true, int64_t timeout_ms = -1);
  void Header(msg::Header::Builder h, msg::Kind kind, uint64_t id);

  JobConfig cfg_;
  ClientOptions opts_;
  CurveKeys keys_;
  TransportContext ctx_{"client"};
  std::unique_ptr<Transport> control_;
  std::vector<std::unique_ptr<Transport>> shards_;
  std::unique_ptr<HeartbeatSender> heartbeat_;
  ClusterInfo cluster_;
  std::vector<std::unique_ptr<Request>> pending_;  // in flight, oldest first (few at a time)
  std::vector<std::unique_ptr<Request>> spare_;    // finished, kept for reuse
  std::vector<std::vector<uint32_t>> by_shard_;    // SendPush/Pull: tensor indices per shard
  std::vector<const std::string*> names_;          // scratch for CheckNoRepeats
  std::vector<Payload> spare_payloads_;            // SendPush's, kept (empty) between messages
  std::vector<Transport*> sockets_;                // Wait's
  std::vector<char> ready_;                        // Wait's
  InMessage answer_;                               // Wait's, reused for every answer (frames kept unaligned)
  uint64_t next_id_ = 1;
  uint64_t committed_ = 0;  // the newest checkpoint known complete
  uint32_t generation_ = 0, latest_generation_ = 0;
  bool rejoined_ = false;     // the rejoining resume query was sent
  std::string last_restart_;  // the coordinator's words for the newest restart
};

}  // namespace shoal
