#include "common/transport/heartbeat.h"

#include <chrono>

namespace shoal {

HeartbeatSender::HeartbeatSender(TransportContext& ctx, const std::string& endpoint, const CurveKeys& keys,
                                 msg::Role role, int rank, int interval_ms)
    : transport_(ctx, Transport::Kind::kClient, keys), role_(role), rank_(rank), interval_ms_(interval_ms) {
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
  while (!stop_) {
    OutMessage m;
    auto h = m.header();
    h.setKind(msg::Kind::HEARTBEAT);
    h.setRole(role_);
    h.setRank(rank_);
    try {
      (void)transport_.TrySend(m);  // a full queue drops it
      InMessage in;
      while (transport_.Recv(&in, 0))
        if (in.header().getKind() == msg::Kind::JOB_OVER) job_over_ = true;
    } catch (const std::exception&) {
      // A heartbeat that cannot be sent is a missed heartbeat: the coordinator notices.
    }
    cv_.wait_for(l, std::chrono::milliseconds(interval_ms_), [this] { return stop_; });
  }
}

}  // namespace shoal
