#include "common/rendezvous/rendezvous.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/error.h"
#include "common/int_list.h"

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

kj::ArrayPtr<const capnp::byte> Bytes(const std::string& s) {
  return kj::arrayPtr(reinterpret_cast<const capnp::byte*>(s.data()), s.size());
}
std::string ValueOf(msg::Header::Reader h) {
  auto v = h.getValue();
  return std::string(reinterpret_cast<const char*>(v.begin()), v.size());
}

}  // namespace

bool RendezvousService::Handle(const InMessage& m, const std::function<void(OutMessage&)>& reply) {
  auto h = m.header();
  auto kind = h.getKind();
  if (kind != msg::Kind::STORE_SET && kind != msg::Kind::STORE_GET && kind != msg::Kind::STORE_COMPARE_SET)
    return false;
  std::string key = h.getKey();
  CheckKey(key);
  OutMessage out;
  auto r = out.header();
  r.setRequestId(h.getRequestId());
  r.setRole(msg::Role::SERVER);
  auto bytes = [](capnp::Data::Reader d) { return std::string(reinterpret_cast<const char*>(d.begin()), d.size()); };
  if (kind == msg::Kind::STORE_SET || kind == msg::Kind::STORE_COMPARE_SET) {
    auto v = h.getValue();
    SHOAL_CHECK(v.size() <= kMaxValueBytes, "rendezvous value for \"" + key + "\" of " + std::to_string(v.size()) +
                                                " bytes (at most " + std::to_string(kMaxValueBytes) + ")");
    SHOAL_CHECK(values_.size() < kMaxKeys || values_.count(key),
                "rendezvous store full (" + std::to_string(kMaxKeys) + " keys)");
  }
  if (kind == msg::Kind::STORE_SET) {
    values_[key] = bytes(h.getValue());
    r.setKind(msg::Kind::STORE_ACK);
    reply(out);
    return true;
  }
  auto it = values_.find(key);
  if (kind == msg::Kind::STORE_COMPARE_SET &&
      (it == values_.end() ? std::string() : it->second) == bytes(h.getExpected()))
    it = values_.insert_or_assign(key, bytes(h.getValue())).first;
  // storeGet, and storeCompareSet: what the key holds now.
  r.setKind(msg::Kind::STORE_VALUE);
  r.setFound(it != values_.end());
  if (it != values_.end()) r.setValue(Bytes(it->second));
  reply(out);
  return true;
}

CoordinatorStore::CoordinatorStore(const std::string& endpoint, const CurveKeys& keys, int request_timeout_ms)
    : endpoint_(endpoint), request_timeout_ms_(request_timeout_ms) {
  link_ = std::make_unique<Transport>(ctx_, Transport::Kind::kClient, keys);
  link_->Connect(endpoint);
}

CoordinatorStore::~CoordinatorStore() = default;

namespace {
std::string Why(const std::string& refusal) {
  return refusal.empty() ? " (is rank 0 / shard 0 running there?)" : refusal;
}
}  // namespace

InMessage CoordinatorStore::Ask(OutMessage& m, uint64_t id, const std::string& what, int timeout_ms) {
  link_->DrainEvents();  // an earlier request's events say nothing about this one
  link_->Send(m);
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    InMessage r;
    int left = LeftMs(deadline);
    if (left == 0 || !link_->Recv(&r, left))
      throw Error("rendezvous: " + what + ": the coordinator at " + endpoint_ + " did not answer within " +
                  std::to_string(timeout_ms) + " ms" + Why(link_->RefusalHint()));
    auto h = r.header();
    if (h.getRequestId() != id) continue;  // a late answer to an earlier request
    if (h.getKind() == msg::Kind::ERROR) throw Error("rendezvous: " + what + ": " + std::string(h.getMessage()));
    if (h.getKind() == m.header().getKind())  // an echo, not the coordinator
      throw Error("rendezvous: " + what + ": " +
                  UnexpectedAnswer("the coordinator", endpoint_, h.getKind(), h.getKind()));
    return r;
  }
}

msg::Header::Reader CoordinatorStore::Request(msg::Kind kind, const std::string& key, const std::string& what,
                                              msg::Kind answer, int timeout_ms,
                                              const std::function<void(msg::Header::Builder)>& fill, InMessage* r) {
  CheckKey(key);
  OutMessage m;
  const uint64_t id = next_id_++;
  auto h = m.header();
  h.setKind(kind);
  h.setRequestId(id);
  h.setKey(key);
  if (fill) fill(h);
  *r = Ask(m, id, what + " \"" + key + "\"", timeout_ms);
  auto rh = r->header();
  SHOAL_CHECK(rh.getKind() == answer, "rendezvous: " + what + " \"" + key +
                                          "\": " + UnexpectedAnswer("the coordinator", endpoint_, kind, rh.getKind()));
  return rh;
}

void CoordinatorStore::Set(const std::string& key, const std::string& value) {
  InMessage r;
  Request(
      msg::Kind::STORE_SET, key, "set", msg::Kind::STORE_ACK, request_timeout_ms_,
      [&](msg::Header::Builder h) { h.setValue(Bytes(value)); }, &r);
}

std::string CoordinatorStore::CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired) {
  InMessage r;
  auto h = Request(
      msg::Kind::STORE_COMPARE_SET, key, "compare-set", msg::Kind::STORE_VALUE, request_timeout_ms_,
      [&](msg::Header::Builder b) {
        b.setExpected(Bytes(expected));
        b.setValue(Bytes(desired));
      },
      &r);
  return h.getFound() ? ValueOf(h) : "";
}

std::string CoordinatorStore::Get(const std::string& key, int timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  int pause_ms = 5;
  while (true) {
    // The coordinator may still be starting: its first answer may take the whole wait.
    int ask_ms = std::max(1, std::max(LeftMs(deadline), std::min(request_timeout_ms_, 1000)));
    InMessage r;
    auto h = Request(msg::Kind::STORE_GET, key, "get", msg::Kind::STORE_VALUE, ask_ms, nullptr, &r);
    if (h.getFound()) return ValueOf(h);
    if (LeftMs(deadline) == 0)
      throw Error("rendezvous: no value for \"" + key + "\" at the coordinator " + endpoint_ + " after " +
                  std::to_string(timeout_ms) + " ms (did that rank start?)" + RefusedHandshakes());
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(pause_ms, LeftMs(deadline))));
    pause_ms = std::min(pause_ms * 2, 100);
  }
}

MembershipOptions JobMembership(const JobConfig& cfg, bool deaths_end_job) {
  MembershipOptions mo;
  for (auto& w : cfg.workers) mo.hosts.push_back(w.host);
  mo.heartbeat_timeout_ms = int(cfg.heartbeat_timeout_ms);
  mo.deaths_end_job = deaths_end_job;
  return mo;
}

RendezvousServer::RendezvousServer(const std::string& bind_endpoint, const CurveKeys& keys, MembershipOptions members)
    : members_(std::move(members)) {
  const size_t n = members_.hosts.size();
  last_seen_.assign(n, Clock::now());
  seen_.assign(n, 0);
  left_.assign(n, 0);
  dead_.assign(n, 0);
  transport_ = std::make_unique<Transport>(ctx_, Transport::Kind::kServer, keys);
  endpoint_ = transport_->Bind(bind_endpoint);
  if (!members_.deaths_end_job) PublishDead();
  thread_ = std::thread([this] { Run(); });
}

RendezvousServer::~RendezvousServer() {
  auto deadline = Clock::now() + std::chrono::milliseconds(members_.heartbeat_timeout_ms + 1000);
  while (!all_gone_ && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop_ = true;
  thread_.join();
}

bool RendezvousServer::AllGone() const {
  for (size_t r = 0; r < seen_.size(); ++r)
    if (seen_[r] && !left_[r] && !dead_[r]) return false;
  return true;
}

void RendezvousServer::OnMembership(const InMessage& m) {
  auto h = m.header();
  int r = h.getRank();
  SHOAL_CHECK(h.getRole() == msg::Role::WORKER && r >= 0 && r < int(seen_.size()),
              "membership message from rank " + std::to_string(r) + ", outside the job's " +
                  std::to_string(seen_.size()) + " workers");
  OutMessage out;
  auto o = out.header();
  o.setRequestId(h.getRequestId());
  o.setRole(msg::Role::SERVER);
  if (h.getKind() == msg::Kind::LEAVE) {
    left_[size_t(r)] = 1;
    o.setKind(msg::Kind::LEAVE_ACK);
  } else {
    seen_[size_t(r)] = 1;
    last_seen_[size_t(r)] = Clock::now();
    if (dead_[size_t(r)] && !members_.deaths_end_job) {  // restarted: a member again
      dead_[size_t(r)] = 0;
      left_[size_t(r)] = 0;
      LOG(INFO) << "coordinator: worker " << r << " answers again";
      PublishDead();
    }
    if (dead_message_.empty()) {
      o.setKind(msg::Kind::HEARTBEAT_ACK);
    } else {
      o.setKind(msg::Kind::MEMBER_DEAD);
      o.setMessage(dead_message_);
    }
  }
  transport_->Send(out, &m.identity);
}

void RendezvousServer::Tick() {
  auto now = Clock::now();
  for (size_t r = 0; r < seen_.size(); ++r) {
    if (!seen_[r] || left_[r] || dead_[r]) continue;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_seen_[r]).count();
    if (ms <= members_.heartbeat_timeout_ms) continue;
    dead_[r] = 1;
    std::string what = "worker " + std::to_string(r) + " (" + members_.hosts[r] +
                       ") stopped answering: no heartbeat for " + std::to_string(ms) + " ms (timeout " +
                       std::to_string(members_.heartbeat_timeout_ms) + " ms)";
    LOG(ERROR) << "coordinator: " << what;
    if (!members_.deaths_end_job)
      PublishDead();
    else if (dead_message_.empty())
      dead_message_ = what;
  }
  all_gone_ = AllGone();
  finished_ = all_gone_ && std::find(seen_.begin(), seen_.end(), 1) != seen_.end();
}

void RendezvousServer::PublishDead() {
  std::vector<int> dead;
  for (size_t r = 0; r < dead_.size(); ++r)
    if (dead_[r]) dead.push_back(int(r));
  service_.Put(kDeadRanksKey, JoinIntList(dead));
}

void RendezvousServer::Run() {
  auto last_tick = Clock::now();
  while (!stop_) {
    if (Clock::now() - last_tick > std::chrono::milliseconds(20)) {
      Tick();
      last_tick = Clock::now();
    }
    InMessage m;
    bool received = false;
    try {
      transport_->DrainEvents();  // refused handshakes go to the refusal log
      if (!transport_->Recv(&m, 20)) continue;
      received = true;
      auto kind = m.header().getKind();
      if (kind == msg::Kind::HEARTBEAT || kind == msg::Kind::LEAVE) {
        OnMembership(m);
        continue;
      }
      if (!service_.Handle(m, [&](OutMessage& out) { transport_->Send(out, &m.identity); }))
        throw Error("message kind " + std::to_string(int(kind)) + " is not served here");
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

Membership::Membership(const std::string& endpoint, const CurveKeys& keys, int rank, int interval_ms, int timeout_ms,
                       std::function<void(const std::string&)> on_failure)
    : endpoint_(endpoint), keys_(keys), rank_(rank) {
  heartbeat_ = std::make_unique<HeartbeatSender>(
      ctx_, endpoint, keys, msg::Role::WORKER, rank, interval_ms, timeout_ms, std::move(on_failure),
      "did the coordinator (worker rank 0, or an elastic job's shoal coordinator) stop?");
}

Membership::~Membership() {
  heartbeat_.reset();
  // Leaving: the coordinator stops expecting this worker's heartbeats. Best effort, bounded.
  try {
    Transport t(ctx_, Transport::Kind::kClient, keys_);
    t.Connect(endpoint_);
    OutMessage m;
    auto h = m.header();
    h.setKind(msg::Kind::LEAVE);
    h.setRole(msg::Role::WORKER);
    h.setRank(rank_);
    h.setRequestId(1);
    t.Send(m);
    InMessage r;
    (void)t.Recv(&r, 2000);
  } catch (const std::exception&) {
  }
}

}  // namespace shoal
