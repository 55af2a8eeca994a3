// A parameter-server shard process: one ROUTER socket serving every client, the KV store,
// and on shard 0 the Coordinator. One thread owns the socket; bad input from one peer is
// logged in one line and answered with an error, never allowed to stop the loop.
#pragma once
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/config.h"
#include "common/ps/client.h"
#include "common/transport/heartbeat.h"
#include "common/transport/transport.h"
#include "server/checkpointer.h"
#include "server/coordinator.h"
#include "server/kv_shard.h"

namespace shoal {

CurveKeys CurveKeysFrom(const JobConfig& cfg);
std::string ConnectEndpoint(const std::string& host_port);

class Server {
 public:
  // Binds servers[shard] (or bind_override, e.g. "tcp://127.0.0.1:*" in tests).
  Server(const JobConfig& cfg, int shard, const std::string& bind_override = "");
  ~Server();
  const std::string& endpoint() const { return endpoint_; }
  KvShard& kv() { return kv_; }
  // Checkpoints to [job] checkpoint_dir (nothing when it is not set). kResume: load the
  // job's newest complete checkpoint first (shard 0 reads it from its own record, other
  // shards ask the coordinator); otherwise start clean (kNew refuses a directory holding
  // checkpoints, kFresh deletes them). Call before Run, after the update rule is set (it
  // decodes the optimizer state). `rejoin` (with kResume): this shard was restarted
  // alone while the job runs; the coordinator starts a new recovery generation (on shard 0
  // from the generation it kept on disk), which this shard serves from the start.
  void OpenCheckpoints(CheckpointStart start, bool rejoin = false);
  // The step the shard resumed at (0 for a fresh start).
  int64_t resumed_step() const { return resumed_step_; }
  // Serves until `stop` becomes true, every worker has finished, or (shards K > 0) the
  // coordinator has been silent too long: then failure() says so.
  void Run(const std::atomic<bool>& stop);
  std::string failure() const {
    std::lock_guard<std::mutex> l(failure_mu_);
    return failure_;
  }
  // Handles one decoded message the way Run does: a request it rejects is answered with
  // ERROR and logged, never thrown. Public so tests and fuzzers can drive the shard
  // without a socket peer.
  void Serve(InMessage& m);

 private:
  bool ServeOne(InMessage& m);
  void HandleMessage(InMessage& m);
  void HandlePush(InMessage& m);
  void HandlePull(InMessage& m);
  void HandleCheckpoint(InMessage& m);
  // Acknowledges the checkpoint write in flight once it is on disk (or its failure);
  // `wait`: block until then.
  void FinishCheckpointWrite(bool wait);
  void HandlePlan(InMessage& m);
  // ps_sync after a shard was restarted alone: every shard goes back to the checkpoint it
  // restored, so all hold the same step again.
  void HandleReload(InMessage& m);
  // Once the plan is known: when the loaded checkpoint was written by another number of
  // workers, maps the servers' step count to the plan's global batch, sets every worker's
  // clock to that step (the new workers' too), clears the stop flag (a step of the workers
  // before) and drops what is no longer placed here (the clocks of workers gone).
  void ReshapeLoaded();
  // Refuses a data request of an earlier recovery generation: it was sent before a shard
  // was restarted alone, against state that no longer exists.
  void CheckGeneration(InMessage& m, const char* request) const;
  // The header of an answer from this shard: kind, the request it answers, role and rank.
  msg::Header::Builder ReplyHeader(OutMessage& out, msg::Kind kind, uint64_t request_id) const;
  // Answers with the tensors `found` (stored under `names`, in the order asked).
  void SendTensors(const PeerId& to, uint64_t request_id, const std::vector<std::string>& names,
                   const std::vector<const StoredTensor*>& found);
  // Throws unless the job registered `name` and the coordinator placed it on this shard:
  // nothing else is ever stored (and checkpointed) here.
  void CheckPlaced(const std::string& name, const char* request);
  void LearnPlacement();
  void ReplyError(const PeerId& to, uint64_t request_id, const std::string& what) noexcept;
  static std::string Describe(const InMessage& m);
  static uint64_t RequestIdOf(const InMessage& m);
  void Warn(const std::string& line);
  void FlushWarnings(Coordinator::Clock::time_point now);

  JobConfig cfg_;
  int shard_;
  std::string who_;  // "shard K" for log lines
  TransportContext ctx_;
  std::unique_ptr<Transport> transport_;
  std::string endpoint_;
  KvShard kv_;
  std::unique_ptr<Checkpointer> checkpointer_;
  // The synced write runs off the serving thread, so heartbeats and barriers never wait
  // for the disk; one at a time.
  struct WriteInFlight {
    PeerId to;
    uint64_t request_id = 0;
    CheckpointRecord rec;
    uint64_t bytes = 0;
    size_t tensors = 0;
    std::chrono::steady_clock::time_point start;
    std::future<std::string> error;  // empty once written
  };
  std::unique_ptr<WriteInFlight> write_;
  int64_t resumed_step_ = 0;
  CheckpointRecord loaded_;             // the checkpoint kv_ was restored from (with its workers); id 0: none
  uint32_t generation_ = 0;             // the recovery generation served (see msg::Header.generation)
  std::unique_ptr<TrainingPlan> plan_;  // the first worker's; later ones must agree
  std::unique_ptr<Coordinator> coordinator_;
  mutable std::mutex failure_mu_;
  std::string failure_;  // set by the heartbeat thread (see failure())
  std::unique_ptr<HeartbeatSender> heartbeat_;
  // The tensors the coordinator placed here. Placement is fixed by the first registration,
  // so once known it never changes; shards > 0 ask the coordinator through placement_client_.
  bool placement_known_ = false;
  std::set<std::string> placed_;
  // HandlePush, HandlePull and SendTensors: kept from one request to the next, so that a
  // request does not allocate them again.
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;  // the pushed tensors' shapes, read off the wire once
  std::vector<Frame> replaced_;
  std::vector<const StoredTensor*> found_;
  std::vector<Payload> spare_payloads_;  // SendTensors', kept (empty) between replies
  std::unique_ptr<Client> placement_client_;
  Coordinator::Clock::time_point warn_window_{};
  int warn_count_ = 0;
  int64_t warn_suppressed_ = 0;
};

}  // namespace shoal
