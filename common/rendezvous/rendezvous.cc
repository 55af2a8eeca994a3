#include "common/rendezvous/rendezvous.h"

#include <glog/logging.h>

#include <chrono>
#include <thread>

#include "common/error.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;

int LeftMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? int(left) : 0;
}

void CheckKey(const std::string& key) {
  SHOAL_CHECK(!key.empty() && key.size() <= RendezvousService::kMaxKeyBytes,
              "rendezvous key of " + std::to_string(key.size()) + " bytes (1 to " +
                  std::to_string(RendezvousService::kMaxKeyBytes) + ")");
}

}  // namespace

bool RendezvousService::Handle(const InMessage& m, const std::function<void(OutMessage&)>& reply) {
  auto h = m.header();
  auto kind = h.getKind();
  if (kind != msg::Kind::STORE_SET && kind != msg::Kind::STORE_GET) return false;
  std::string key = h.getKey();
  CheckKey(key);
  OutMessage out;
  auto r = out.header();
  r.setRequestId(h.getRequestId());
  r.setRole(msg::Role::SERVER);
  if (kind == msg::Kind::STORE_SET) {
    auto v = h.getValue();
    SHOAL_CHECK(v.size() <= kMaxValueBytes, "rendezvous value for \"" + key + "\" of " + std::to_string(v.size()) +
                                                " bytes (at most " + std::to_string(kMaxValueBytes) + ")");
    SHOAL_CHECK(values_.size() < kMaxKeys || values_.count(key),
                "rendezvous store full (" + std::to_string(kMaxKeys) + " keys)");
    values_[key] = std::string(reinterpret_cast<const char*>(v.begin()), v.size());
    r.setKind(msg::Kind::STORE_ACK);
  } else {
    r.setKind(msg::Kind::STORE_VALUE);
    auto it = values_.find(key);
    r.setFound(it != values_.end());
    if (it != values_.end())
      r.setValue(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(it->second.data()), it->second.size()));
  }
  reply(out);
  return true;
}

CoordinatorStore::CoordinatorStore(const std::string& endpoint, const CurveKeys& keys, int request_timeout_ms)
    : endpoint_(endpoint), request_timeout_ms_(request_timeout_ms) {
  link_ = std::make_unique<Transport>(ctx_, Transport::Kind::kClient, keys);
  link_->Connect(endpoint);
}

CoordinatorStore::~CoordinatorStore() = default;

InMessage CoordinatorStore::Ask(OutMessage& m, uint64_t id, const std::string& what, int timeout_ms) {
  link_->Send(m);
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    InMessage r;
    int left = LeftMs(deadline);
    if (left == 0 || !link_->Recv(&r, left))
      throw Error("rendezvous: " + what + ": the coordinator at " + endpoint_ + " did not answer within " +
                  std::to_string(timeout_ms) + " ms (is rank 0 / shard 0 running there?)");
    auto h = r.header();
    if (h.getRequestId() != id) continue;  // a late answer to an earlier request
    if (h.getKind() == msg::Kind::ERROR) throw Error("rendezvous: " + what + ": " + std::string(h.getMessage()));
    return r;
  }
}

void CoordinatorStore::Set(const std::string& key, const std::string& value) {
  CheckKey(key);
  OutMessage m;
  uint64_t id = next_id_++;
  auto h = m.header();
  h.setKind(msg::Kind::STORE_SET);
  h.setRequestId(id);
  h.setKey(key);
  h.setValue(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(value.data()), value.size()));
  InMessage r = Ask(m, id, "set \"" + key + "\"", request_timeout_ms_);
  SHOAL_CHECK(
      r.header().getKind() == msg::Kind::STORE_ACK,
      "rendezvous: set \"" + key + "\": answered with message kind " + std::to_string(int(r.header().getKind())));
}

std::string CoordinatorStore::Get(const std::string& key, int timeout_ms) {
  CheckKey(key);
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  int pause_ms = 5;
  while (true) {
    OutMessage m;
    uint64_t id = next_id_++;
    auto h = m.header();
    h.setKind(msg::Kind::STORE_GET);
    h.setRequestId(id);
    h.setKey(key);
    // The coordinator may still be starting: its first answer may take the whole wait.
    int ask_ms = std::max(1, std::max(LeftMs(deadline), std::min(request_timeout_ms_, 1000)));
    InMessage r = Ask(m, id, "get \"" + key + "\"", ask_ms);
    auto rh = r.header();
    SHOAL_CHECK(rh.getKind() == msg::Kind::STORE_VALUE,
                "rendezvous: get \"" + key + "\": answered with message kind " + std::to_string(int(rh.getKind())));
    if (rh.getFound()) {
      auto v = rh.getValue();
      return std::string(reinterpret_cast<const char*>(v.begin()), v.size());
    }
    if (LeftMs(deadline) == 0)
      throw Error("rendezvous: no value for \"" + key + "\" at the coordinator " + endpoint_ + " after " +
                  std::to_string(timeout_ms) + " ms (did that rank start?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(pause_ms, LeftMs(deadline))));
    pause_ms = std::min(pause_ms * 2, 100);
  }
}

RendezvousServer::RendezvousServer(const std::string& bind_endpoint, const CurveKeys& keys) {
  transport_ = std::make_unique<Transport>(ctx_, Transport::Kind::kServer, keys);
  endpoint_ = transport_->Bind(bind_endpoint);
  thread_ = std::thread([this] { Run(); });
}

RendezvousServer::~RendezvousServer() {
  stop_ = true;
  thread_.join();
}

void RendezvousServer::Run() {
  while (!stop_) {
    InMessage m;
    bool received = false;
    try {
      if (!transport_->Recv(&m, 50)) continue;
      received = true;
      if (!service_.Handle(m, [&](OutMessage& out) { transport_->Send(out, &m.identity); }))
        throw Error("message kind " + std::to_string(int(m.header().getKind())) +
                    " is not served here (this coordinator serves rendezvous only)");
    } catch (const BadMessage& e) {
      LOG(WARNING) << "coordinator: bad message from " << PeerName(e.identity) << ": " << e.what();
    } catch (const std::exception& e) {
      LOG(WARNING) << "coordinator: rejected a message from " << PeerName(m.identity) << ": " << e.what();
      if (!received) continue;
      OutMessage out;
      auto r = out.header();
      r.setKind(msg::Kind::ERROR);
      r.setRequestId(m.header().getRequestId());
      r.setMessage(std::string("coordinator: ") + e.what());
      try {
        transport_->Send(out, &m.identity);
      } catch (const std::exception&) {
      }
    }
  }
}

}  // namespace shoal
