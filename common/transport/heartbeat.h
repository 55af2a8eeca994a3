// Sends heartbeats to the coordinator from its own thread and socket, so a member that is
// busy computing (or blocked in a long transfer) still counts as alive.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/transport/transport.h"

namespace shoal {

class HeartbeatSender {
 public:
  // `on_failure` (optional) runs on the sender's thread, once, when the coordinator reports
  // a member dead (memberDead) or, with ack_timeout_ms > 0, when the coordinator has not
  // acknowledged a heartbeat for that long; `silence_hint` ends that message (who the
  // coordinator is, what to look at).
  HeartbeatSender(TransportContext& ctx, const std::string& coordinator_endpoint, const CurveKeys& keys, msg::Role role,
                  int rank, int interval_ms, int ack_timeout_ms = 0,
                  std::function<void(const std::string&)> on_failure = nullptr, std::string silence_hint = "");
  ~HeartbeatSender();
  // The coordinator answered a heartbeat saying every worker has finished.
  bool job_over() const { return job_over_.load(); }

 private:
  void Run();
  Transport transport_;
  msg::Role role_;
  int rank_;
  int interval_ms_;
  int ack_timeout_ms_;
  std::function<void(const std::string&)> on_failure_;
  std::string endpoint_;
  std::string silence_hint_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<bool> job_over_{false};
  std::thread thread_;
};

}  // namespace shoal
