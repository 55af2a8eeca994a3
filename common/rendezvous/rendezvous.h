// Rendezvous over the network: a key-value store served by the job's coordinator (shard 0
// in a job with servers, worker rank 0 otherwise), so ranks on different hosts meet
// without a shared filesystem. Values are small (endpoints, NCCL's unique id); the service
// bounds what one peer can make it hold.
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <chrono>
#include <functional>

#include "common/config.h"
#include "common/rendezvous/store.h"
#include "common/transport/heartbeat.h"
#include "common/transport/transport.h"

namespace shoal {

// The coordinator's side: answers storeSet / storeGet. Not thread-safe: the coordinator's
// loop owns it.
class RendezvousService {
 public:
  static constexpr size_t kMaxKeyBytes = 256;
  static constexpr size_t kMaxValueBytes = 64 << 10;
  static constexpr size_t kMaxKeys = 100000;
  // True when `m` was a store message (answered through `reply`); throws shoal::Error for a
  // malformed or oversized one (the caller answers with the error).
  bool Handle(const InMessage& m, const std::function<void(OutMessage&)>& reply);
  // The coordinator's own value (its membership news), beside what the ranks set.
  void Put(const std::string& key, std::string value) { values_[key] = std::move(value); }
  size_t size() const { return values_.size(); }

 private:
  std::map<std::string, std::string> values_;
};

// A Store whose values live at the coordinator. Get asks until the value is there or the
// timeout passes; every wait is bounded.
class CoordinatorStore : public Store {
 public:
  // `endpoint`: "tcp://host:port".
  CoordinatorStore(const std::string& endpoint, const CurveKeys& keys, int request_timeout_ms = 10000);
  ~CoordinatorStore() override;
  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, int timeout_ms) override;
  // Not resent: a lost answer is an error (the caller reads the key to learn what won).
  std::string CompareSet(const std::string& key, const std::string& expected, const std::string& desired) override;

 private:
  InMessage Ask(OutMessage& m, uint64_t id, const std::string& what, int timeout_ms);
  // One request of `kind` about `key` (`fill` sets its other fields) whose answer must be of
  // kind `answer`; the answer's header, which lives in *r.
  msg::Header::Reader Request(msg::Kind kind, const std::string& key, const std::string& what, msg::Kind answer,
                              int timeout_ms, const std::function<void(msg::Header::Builder)>& fill, InMessage* r);
  std::string endpoint_;
  int request_timeout_ms_;
  TransportContext ctx_{"rendezvous client"};
  std::unique_ptr<Transport> link_;
  uint64_t next_id_ = 1;
};

// Who the coordinator of a job without servers watches: the workers, by heartbeat.
struct MembershipOptions {
  std::vector<std::string> hosts;  // worker rank -> host, for the messages
  int heartbeat_timeout_ms = 5000;
  // True: a death is every member's news (memberDead), and the job ends. False (a job that
  // survives lost workers, algorithms/live_quorum.h): the ranks silent now are only kept in
  // the store as kDeadRanksKey, and a rank that heartbeats again (restarted) is alive again.
  bool deaths_end_job = true;
};

// What a job's coordinator watches: its workers' hosts and heartbeat timeout from the job
// file; `deaths_end_job`: false for a job that survives lost workers.
MembershipOptions JobMembership(const JobConfig& cfg, bool deaths_end_job);

// The store key under which the coordinator of a job without deaths_end_job lists the
// workers silent past the heartbeat timeout ("1,3"; "" when none).
inline constexpr const char* kDeadRanksKey = "members.dead";

// The coordinator of a job without servers: worker rank 0 runs one on its own thread and
// socket, or (a job that survives lost workers, rank 0 included) a process of its own,
// `shoal-launch --serve_coordinator`. It serves rendezvous and membership: it acknowledges every worker's heartbeat,
// and once a worker has been silent past the timeout it answers every other heartbeat
// with memberDead naming the rank and host, so every member learns it within a timeout.
class RendezvousServer {
 public:
  // Binds `bind_endpoint` ("tcp://host:port"); with keys, only the job's clients get in.
  RendezvousServer(const std::string& bind_endpoint, const CurveKeys& keys, MembershipOptions members = {});
  // Waits (bounded by the heartbeat timeout) until every worker seen has left or is dead,
  // so no member is left talking to a coordinator that went away.
  ~RendezvousServer();
  const std::string& endpoint() const { return endpoint_; }
  // Some worker heartbeated, and every one seen has since left or been listed dead: a
  // coordinator of its own process (`shoal coordinator`) may exit.
  bool finished() const { return finished_; }

 private:
  void Run();
  void OnMembership(const InMessage& m);
  void Tick();
  bool AllGone() const;
  void PublishDead();
  MembershipOptions members_;
  std::vector<std::chrono::steady_clock::time_point> last_seen_;
  std::vector<char> seen_, left_, dead_;
  std::string dead_message_;
  std::atomic<bool> draining_{false};
  TransportContext ctx_{"coordinator"};
  std::unique_ptr<Transport> transport_;
  std::string endpoint_;
  RendezvousService service_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> all_gone_{false};
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

// A worker's membership in a job without servers: heartbeats to the coordinator, and a
// leave message when it is destroyed (the worker has finished). `on_failure` runs once,
// from the heartbeat thread, when the coordinator reports a member dead or stops answering.
class Membership {
 public:
  Membership(const std::string& endpoint, const CurveKeys& keys, int rank, int interval_ms, int timeout_ms,
             std::function<void(const std::string&)> on_failure);
  ~Membership();

 private:
  TransportContext ctx_{"membership"};
  std::string endpoint_;
  CurveKeys keys_;
  int rank_;
  std::unique_ptr<HeartbeatSender> heartbeat_;
};

}  // namespace shoal
