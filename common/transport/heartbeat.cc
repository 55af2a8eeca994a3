#include "common/transport/heartbeat.h"

#include <chrono>

namespace shoal {

HeartbeatSender::HeartbeatSender(zmq::context_t& ctx, const std::string& endpoint, const CurveKeys& keys,
                                 msg::Role role, int rank, int interval_ms)
    : transport_(ctx, Transport::Kind::kClient, keys), role_(role), rank_(rank), interval_ms_(interval_ms) {
  // While the coordinator is unreachable, keep a couple of heartbeats queued, not hours'.
  transport_.socket().set(zmq::sockopt::sndhwm, 2);
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
    auto words = capnp::messageToFlatArray(m.builder);
    zmq::message_t frame(words.asBytes().begin(), words.asBytes().size());
    (void)transport_.socket().send(frame, zmq::send_flags::dontwait);  // a full queue drops it
    cv_.wait_for(l, std::chrono::milliseconds(interval_ms_), [this] { return stop_; });
  }
}

}  // namespace shoal
