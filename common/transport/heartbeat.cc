#include "common/transport/heartbeat.h"

#include <chrono>
#include <utility>

namespace shoal {

HeartbeatSender::HeartbeatSender(TransportContext& ctx, const std::string& endpoint, const CurveKeys& keys,
                                 msg::Role role, int rank, int interval_ms, int ack_timeout_ms,
                                 std::function<void(const std::string&)> on_failure, std::string silence_hint)
    : transport_(ctx, Transport::Kind::kClient, keys),
      role_(role),
      rank_(rank),
      interval_ms_(interval_ms),
      ack_timeout_ms_(ack_timeout_ms),
      on_failure_(std::move(on_failure)),
      endpoint_(endpoint),
      silence_hint_(std::move(silence_hint)) {
  // While the coordinator is unreachable, keep a couple of heartbeats queued, not hours'.
  transport_.SetSendQueue(2);
  transport_.Connect(endpoint);
  thread_ = std::thread([this] { Run(); });
}

HeartbeatSender::~HeartbeatSender() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HeartbeatSender::Run() {
  std::unique_lock<std::mutex> l(mu_);
  auto last_ack = std::chrono::steady_clock::now();
  bool acked = false;  // silence counts only once the coordinator has answered
  bool failed = false;
  auto fail = [&](const std::string& why) {
    if (failed || !on_failure_) return;
    failed = true;
    on_failure_(why);
  };
  while (!stop_) {
    OutMessage m;
    auto h = m.header();
    h.setKind(msg::Kind::HEARTBEAT);
    h.setRole(role_);
    h.setRank(rank_);
    try {
      (void)transport_.TrySend(m);  // a full queue drops it
      InMessage in;
      while (transport_.Recv(&in, 0)) {
        auto kind = in.header().getKind();
        if (kind == msg::Kind::JOB_OVER) job_over_ = true;
        if (kind == msg::Kind::HEARTBEAT_ACK) {
          last_ack = std::chrono::steady_clock::now();
          acked = true;
        }
        if (kind == msg::Kind::MEMBER_DEAD) fail(in.header().getMessage());
      }
    } catch (const std::exception&) {
      // A heartbeat that cannot be sent is a missed heartbeat: the coordinator notices.
    }
    auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - last_ack);
    if (acked && ack_timeout_ms_ > 0 && silent.count() > ack_timeout_ms_)
      fail("the coordinator at " + endpoint_ + " stopped answering: no reply for " + std::to_string(silent.count()) +
           " ms" + (silence_hint_.empty() ? "" : " (" + silence_hint_ + ")"));
    cv_.wait_for(l, std::chrono::milliseconds(interval_ms_), [this] { return stop_; });
  }
}

}  // namespace shoal
