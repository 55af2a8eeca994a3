#include "common/ps/client.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <glog/logging.h>
#include <thread>

#include "common/error.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms < 0 ? 0 : int(ms);
}

void SetMeta(msg::TensorMeta::Builder m, const std::string& name, DType dtype, const std::vector<int64_t>& shape,
             size_t bytes) {
  m.setName(name);
  m.setDtype(ToWire(dtype));
  auto s = m.initShape(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) s.set(i, shape[i]);
  m.setByteSize(bytes);
}

}  // namespace

size_t TensorSpec::bytes() const {
  size_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

std::vector<float> PulledTensor::ToFloats() const {
  size_t n = size() / DTypeSize(dtype);
  std::vector<float> out(n);
  DecodeFloats(data(), n, dtype, out.data());
  return out;
}

Client::Client(const JobConfig& cfg, const ClientOptions& opts) : cfg_(cfg), opts_(opts) {
  SHOAL_CHECK(!cfg_.servers.empty(), cfg_.path + ": [cluster] servers is empty");
  keys_.server_public = cfg_.curve_server_public;
  keys_.client_public = cfg_.curve_client_public;
  keys_.client_secret = cfg_.curve_client_secret;
  control_ = std::make_unique<Transport>(ctx_, Transport::Kind::kClient, keys_);
  control_->Connect("tcp://" + cfg_.servers[0]);
  // Pulled tensors are only ever copied out (PulledTensor): a small one is not copied to
  // alignment first.
  answer_.align_payloads = false;
}

Client::~Client() {
  heartbeat_.reset();
  control_.reset();
  shards_.clear();
}

uint64_t Client::bytes_sent() const {
  uint64_t n = control_->bytes_sent();
  for (auto& s : shards_) n += s->bytes_sent();
  return n;
}

void Client::Header(msg::Header::Builder h, msg::Kind kind, uint64_t id) {
  h.setKind(kind);
  h.setRequestId(id);
  h.setRole(opts_.role);
  h.setRank(opts_.rank);
  h.setGeneration(generation_);
}

InMessage Client::Control(OutMessage& m, uint64_t id, const std::string& what, bool resend, int64_t timeout_ms) {
  if (timeout_ms < 0) timeout_ms = opts_.timeout_ms;
  control_->DrainEvents();  // an earlier call's events say nothing about this one
  control_->Send(m);
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  // Shard 0 may die and be started again alone: a request it had received is lost with it,
  // so an unanswered one goes again every two heartbeat periods (ZeroMQ delivers it once
  // the coordinator is back). A duplicate is harmless: every such request is idempotent,
  // and the second answer carries this id, which later calls skip. The resend never
  // blocks: with no pipe to the coordinator (a refused CURVE handshake) a DEALER's send
  // would wait for ever, so it is dropped and the deadline stands.
  const auto period = std::chrono::milliseconds(2 * std::max<int64_t>(10, cfg_.heartbeat_ms));
  auto resend_at = Clock::now() + period;
  while (true) {
    InMessage r;
    try {
      int wait = RemainingMs(deadline);
      if (resend) wait = std::min(wait, RemainingMs(resend_at));
      if (!control_->Recv(&r, wait)) {
        if (RemainingMs(deadline) == 0)
          throw ControlTimeout(what + ": the coordinator (" + cfg_.servers[0] + ") did not answer within " +
                               std::to_string(timeout_ms) + " ms" + control_->RefusalHint());
        control_->TrySend(m);
        resend_at = Clock::now() + period;
        continue;
      }
    } catch (const BadMessage& e) {
      throw Error(what + ": undecodable answer from the coordinator: " + e.what());
    }
    auto h = r.header();
    if (h.getRequestId() != id) continue;  // a late answer to an earlier, timed-out call
    if (h.getKind() == msg::Kind::ERROR) {
      if (h.getInputError()) throw InputError(what + ": " + std::string(h.getMessage()));
      throw Error(what + ": " + std::string(h.getMessage()));
    }
    if (h.getKind() == m.header().getKind())  // an echo, not the coordinator
      throw Error(what + ": " + UnexpectedAnswer("the coordinator", cfg_.servers[0], h.getKind(), h.getKind()));
    return r;
  }
}

const ClusterInfo& Client::Register(const std::vector<TensorSpec>& tensors, const TrainingPlan* plan) {
  OutMessage m;
  uint64_t id = next_id_++;
  auto h = m.header();
  Header(h, msg::Kind::REGISTER, id);
  auto metas = h.initTensors(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    SetMeta(metas[i], tensors[i].name, tensors[i].dtype, tensors[i].shape, tensors[i].bytes());
  InMessage r = Control(m, id, "register");
  auto rh = r.header();
  SHOAL_CHECK(rh.getKind() == msg::Kind::CLUSTER_MAP,
              "register: " + UnexpectedAnswer("the coordinator", cfg_.servers[0], msg::Kind::REGISTER, rh.getKind()));
  auto cm = rh.getCluster();
  ClusterInfo info;
  for (auto s : cm.getServers()) info.servers.push_back(s);
  info.world_size = cm.getWorldSize();
  for (auto p : cm.getPlacement()) {
    SHOAL_CHECK(p.getShard() < info.servers.size(), "register: tensor '" + std::string(p.getName()) +
                                                        "' placed on shard " + std::to_string(p.getShard()) + " of " +
                                                        std::to_string(info.servers.size()));
    info.shard_of[p.getName()] = int(p.getShard());
  }
  for (auto mem : cm.getMembers()) info.members.push_back({mem.getRole(), mem.getRank(), mem.getAlive()});
  cluster_ = std::move(info);
  if (shards_.empty()) {
    for (auto& addr : cluster_.servers) {
      shards_.push_back(std::make_unique<Transport>(ctx_, Transport::Kind::kClient, keys_));
      shards_.back()->Connect("tcp://" + addr);
    }
  }
  if (opts_.heartbeat && !heartbeat_)
    heartbeat_ = std::make_unique<HeartbeatSender>(ctx_, "tcp://" + cfg_.servers[0], keys_, opts_.role, opts_.rank,
                                                   int(cfg_.heartbeat_ms));
  if (plan) SendPlan(*plan);
  return cluster_;
}

Client::Request& Client::NewRequest(msg::Kind asked, msg::Kind ack) {
  std::unique_ptr<Request> r;
  if (spare_.empty()) {
    r = std::make_unique<Request>();
  } else {
    r = std::move(spare_.back());
    spare_.pop_back();
  }
  r->id = next_id_++;
  r->waiting.assign(shards_.size(), 0);
  r->left = 0;
  r->out = nullptr;
  r->slots.resize(shards_.size());
  for (auto& v : r->slots) v.clear();
  r->error.clear();
  // The counter is reused unless a frame ZeroMQ has yet to release still holds it.
  if (r->unreleased && r->unreleased.use_count() == 1)
    *r->unreleased = 0;
  else
    r->unreleased.reset();
  r->asked = asked;
  r->ack = ack;
  pending_.push_back(std::move(r));
  return *pending_.back();
}

Client::Request* Client::FindRequest(uint64_t id) {
  for (auto& r : pending_)
    if (r->id == id) return r.get();
  return nullptr;
}

void Client::EraseRequest(Request* req) {
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i].get() != req) continue;
    std::unique_ptr<Request> r = std::move(pending_[i]);
    pending_.erase(pending_.begin() + i);
    r->out = nullptr;
    if (spare_.size() < 16) spare_.push_back(std::move(r));
    return;
  }
}

void Client::SendTo(Request& req, size_t shard, OutMessage& m) {
  shards_[shard]->Send(m);
  if (!req.waiting[shard]) ++req.left;
  req.waiting[shard] = 1;
}

void Client::CheckNoRepeats(const char* what, std::vector<const std::string*>& names) {
  if (names.size() < 2) return;
  // Sorting pointers is cheaper than building a set of strings for every request.
  std::sort(names.begin(), names.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
  for (size_t i = 1; i < names.size(); ++i)
    SHOAL_CHECK(*names[i - 1] != *names[i], std::string(what) + " lists '" + *names[i] + "' twice");
}

void Client::AskEveryShard(msg::Kind kind, msg::Kind ack, const std::function<void(msg::Header::Builder)>& fill) {
  Request& req = NewRequest(kind, ack);
  for (size_t s = 0; s < shards_.size(); ++s) {
    OutMessage m;
    auto h = m.header();
    Header(h, kind, req.id);
    fill(h);
    SendTo(req, s, m);
  }
  Wait(int(req.id));
}

void Client::SendPlan(const TrainingPlan& plan) {
  AskEveryShard(msg::Kind::PLAN, msg::Kind::PLAN_ACK, [&](msg::Header::Builder h) { ToWire(plan, h.initPlan()); });
}

int Client::ShardOf(const std::string& name) const {
  auto it = cluster_.shard_of.find(name);
  SHOAL_CHECK(it != cluster_.shard_of.end(), "tensor '" + name + "' was not registered (Register it first)");
  return it->second;
}

int Client::Push(const std::vector<TensorRef>& tensors, msg::PushOp op) { return SendPush(tensors, op, nullptr); }

int Client::PushPull(const std::vector<TensorRef>& tensors, msg::PushOp op, std::vector<PulledTensor>* out) {
  return SendPush(tensors, op, out);
}

int Client::SendPush(const std::vector<TensorRef>& tensors, msg::PushOp op, std::vector<PulledTensor>* out) {
  SHOAL_CHECK(!shards_.empty(), "push before Register");
  by_shard_.resize(shards_.size());
  for (auto& v : by_shard_) v.clear();
  names_.clear();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    size_t want = DTypeSize(t.dtype);
    for (int64_t d : t.shape) want *= size_t(d);
    SHOAL_CHECK(t.bytes == want, "push of '" + t.name + "': " + std::to_string(t.bytes) +
                                     " bytes given, its shape and dtype need " + std::to_string(want));
    by_shard_[size_t(ShardOf(t.name))].push_back(uint32_t(i));
    names_.push_back(&t.name);
  }
  if (out) CheckNoRepeats("push", names_);
  Request& req = NewRequest(out ? msg::Kind::PUSH_PULL : msg::Kind::PUSH, msg::Kind::PUSH_ACK);
  if (!req.unreleased) req.unreleased = std::make_shared<std::atomic<int>>(0);
  if (out) {
    out->clear();
    out->resize(tensors.size());
    req.out = out;
    // Named now, so that Dispatch can match the answer's tensors by comparing, not looking up.
    for (size_t i = 0; i < tensors.size(); ++i) (*out)[i].name = tensors[i].name;
  }
  for (size_t s = 0; s < by_shard_.size(); ++s) {
    const std::vector<uint32_t>& mine = by_shard_[s];
    if (mine.empty()) continue;
    OutMessage m;
    m.payloads.swap(spare_payloads_);  // the last push's vector, emptied by Send: no allocation
    auto h = m.header();
    Header(h, out ? msg::Kind::PUSH_PULL : msg::Kind::PUSH, req.id);
    h.setOp(op);
    auto metas = h.initTensors(mine.size());
    m.payloads.reserve(mine.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      const TensorRef& t = tensors[mine[i]];
      SetMeta(metas[i], t.name, t.dtype, t.shape, t.bytes);
      Payload p;
      p.data = t.data;
      p.size = t.bytes;
      p.keep = t.keep;
      ++*req.unreleased;
      p.unreleased = req.unreleased;
      m.payloads.push_back(std::move(p));
    }
    if (out) req.slots[s] = mine;
    SendTo(req, s, m);
    m.payloads.swap(spare_payloads_);
  }
  return int(req.id);
}

int Client::Pull(const std::vector<std::string>& names, std::vector<PulledTensor>* out) {
  SHOAL_CHECK(!shards_.empty(), "pull before Register");
  by_shard_.resize(shards_.size());
  for (auto& v : by_shard_) v.clear();
  names_.clear();
  for (size_t i = 0; i < names.size(); ++i) {
    by_shard_[size_t(ShardOf(names[i]))].push_back(uint32_t(i));
    names_.push_back(&names[i]);
  }
  CheckNoRepeats("pull", names_);
  Request& req = NewRequest(msg::Kind::PULL, msg::Kind::PUSH_ACK);
  out->clear();
  out->resize(names.size());
  req.out = out;
  for (size_t i = 0; i < names.size(); ++i) (*out)[i].name = names[i];
  for (size_t s = 0; s < by_shard_.size(); ++s) {
    const std::vector<uint32_t>& mine = by_shard_[s];
    if (mine.empty()) continue;
    OutMessage m;
    auto h = m.header();
    Header(h, msg::Kind::PULL, req.id);
    auto list = h.initNames(mine.size());
    for (size_t i = 0; i < mine.size(); ++i) list.set(i, names[mine[i]]);
    req.slots[s] = mine;
    SendTo(req, s, m);
  }
  return int(req.id);
}

void Client::Dispatch(int shard, InMessage& m) {
  auto h = m.header();
  Request* found = FindRequest(h.getRequestId());
  if (!found || size_t(shard) >= found->waiting.size() || !found->waiting[size_t(shard)]) {
    LOG(WARNING) << "client: ignoring an answer from shard " << shard << " to unknown request " << h.getRequestId()
                 << (h.getKind() == msg::Kind::ERROR ? ": " + std::string(h.getMessage()) : "");
    return;
  }
  Request& req = *found;
  req.waiting[size_t(shard)] = 0;
  --req.left;
  if (h.getKind() == req.ack) return;  // push or checkpoint done
  switch (h.getKind()) {
    case msg::Kind::ERROR:
      req.error += (req.error.empty() ? "" : "; ") + std::string(h.getMessage());
      break;
    case msg::Kind::PULL_REPLY: {
      const std::vector<TensorEntry>& tensors = m.ValidateTensors();
      const std::vector<uint32_t>& asked = req.slots[size_t(shard)];
      for (size_t i = 0; i < tensors.size(); ++i) {
        const TensorEntry& e = tensors[i];
        auto named = [&](uint32_t slot) {
          const std::string& want = (*req.out)[slot].name;
          return want.size() == e.name.size() && memcmp(want.data(), e.name.begin(), want.size()) == 0;
        };
        // The shard answers in the order asked; any other order is matched by search.
        size_t slot = SIZE_MAX;
        if (req.out && i < asked.size() && named(asked[i])) {
          slot = asked[i];
        } else if (req.out) {
          for (uint32_t a : asked)
            if (named(a)) slot = a;
        }
        SHOAL_CHECK(slot != SIZE_MAX, "shard " + std::to_string(shard) + " sent tensor '" + std::string(e.name) +
                                          "' that was not asked for");
        PulledTensor& t = (*req.out)[slot];
        t.dtype = FromWire(e.dtype);
        e.ShapeInto(&t.shape);
        t.version = e.version;
        t.bytes = std::move(m.payloads[i]);
      }
      break;
    }
    default:
      req.error +=
          (req.error.empty() ? "" : "; ") +
          UnexpectedAnswer("shard " + std::to_string(shard), cluster_.servers[size_t(shard)], req.asked, h.getKind());
  }
}

void Client::Wait(int ts) {
  Request* req = FindRequest(uint64_t(ts));
  SHOAL_CHECK(req, "Wait(" + std::to_string(ts) + "): no such request in flight");
  auto deadline = Clock::now() + std::chrono::milliseconds(opts_.timeout_ms);
  sockets_.clear();
  for (auto& s : shards_) sockets_.push_back(s.get());
  // Answers often are already queued (a pull answered right behind its push): read them
  // before paying for a poll.
  ready_.assign(sockets_.size(), 1);
  const int slice_ms = opts_.watch_restarts ? int(std::max<int64_t>(10, cfg_.heartbeat_ms)) : 1 << 30;
  while (req->left > 0) {
    bool any = false;
    for (char r : ready_) any = any || r;
    int left = RemainingMs(deadline);
    if (left > 0 && !any && !WaitAny(sockets_, std::min(left, slice_ms), &ready_)) {
      // Silence for a heartbeat period: perhaps the shard died and was restarted alone.
      if (opts_.watch_restarts) try {
          CheckRestarts();
        } catch (const ShardRestarted&) {
          EraseRequest(req);
          throw;
        }
      continue;
    }
    if (left == 0) {
      std::string who;
      for (size_t s = 0; s < req->waiting.size(); ++s)
        if (req->waiting[s])
          who += (who.empty() ? "" : ", ") + std::to_string(s) + " (" + cluster_.servers[s] + ")" +
                 shards_[s]->RefusalHint();
      EraseRequest(req);
      throw Error("request " + std::to_string(ts) + ": shard(s) " + who + " did not answer within " +
                  std::to_string(opts_.timeout_ms) + " ms");
    }
    for (size_t i = 0; i < ready_.size(); ++i) {
      if (!ready_[i]) continue;
      InMessage& m = answer_;
      try {
        if (shards_[i]->Recv(&m, 0))
          Dispatch(int(i), m);
        else
          ready_[i] = 0;  // drained
      } catch (const BadMessage& e) {
        LOG(WARNING) << "client: undecodable answer from shard " << i << ": " << e.what();
      } catch (const Error& e) {
        req->error += std::string(e.what());
      }
      m.payloads.clear();  // frames of a refused answer are not kept until the next one
    }
  }
  // The shards have everything, but ZeroMQ may not yet have released the pushed frames.
  auto unreleased = req->unreleased;
  while (unreleased && *unreleased > 0) {
    SHOAL_CHECK(RemainingMs(deadline) > 0, "request " + std::to_string(ts) + ": ZeroMQ kept the pushed buffers");
    std::this_thread::yield();
  }
  std::string error = std::move(req->error);
  EraseRequest(req);
  SHOAL_CHECK(error.empty(), error);
}

void Client::Barrier(const std::string& name) {
  OutMessage m;
  uint64_t id = next_id_++;
  auto h = m.header();
  Header(h, msg::Kind::BARRIER, id);
  h.setBarrierName(name);
  // A barrier waits for the others: when one of them is gone, the coordinator answers naming
  // it once its heartbeats have been missing for heartbeat_timeout_ms. Waiting that long (and
  // two heartbeats) beyond timeout_ms lets that answer arrive, instead of this worker blaming
  // the coordinator for a silence that is another member's.
  Control(m, id, "barrier '" + name + "'", /*resend=*/true,
          opts_.timeout_ms + cfg_.heartbeat_timeout_ms + 2 * cfg_.heartbeat_ms);
}

void Client::LiveBarrier(const std::string& name) {
  OutMessage m;
  uint64_t id = next_id_++;
  auto h = m.header();
  Header(h, msg::Kind::BARRIER, id);
  h.setBarrierName(name);
  h.setLiveOnly(true);
  while (true) {
    try {
      Control(m, id, "barrier '" + name + "'");
      return;
    } catch (const ControlTimeout&) {
      // Still waiting for a live worker's last steps: go on while the coordinator answers
      // (Members throws when it does not). Asking again is harmless: the coordinator keeps
      // one place per rank, and the answer carries this id.
      Members();
    }
  }
}

}  // namespace shoal

namespace shoal {

const std::vector<ClusterInfo::Member>& Client::Members() {
  OutMessage m;
  uint64_t id = next_id_++;
  Header(m.header(), msg::Kind::MEMBERS, id);
  InMessage r = Control(m, id, "members");
  auto rh = r.header();
  SHOAL_CHECK(rh.getKind() == msg::Kind::CLUSTER_MAP,
              "members: " + UnexpectedAnswer("the coordinator", cfg_.servers[0], msg::Kind::MEMBERS, rh.getKind()));
  cluster_.members.clear();
  for (auto mem : rh.getCluster().getMembers())
    cluster_.members.push_back({mem.getRole(), mem.getRank(), mem.getAlive()});
  return cluster_.members;
}

void Client::Leave() {
  OutMessage m;
  uint64_t id = next_id_++;
  Header(m.header(), msg::Kind::LEAVE, id);
  Control(m, id, "leave");
}

void Client::Checkpoint(const CheckpointRecord& rec) {
  SHOAL_CHECK(!shards_.empty(), "checkpoint before Register");
  CheckpointRecord request = rec;
  request.keep = committed_;
  AskEveryShard(msg::Kind::CHECKPOINT, msg::Kind::CHECKPOINT_ACK,
                [&](msg::Header::Builder h) { ToWire(request, h.initCheckpoint()); });
  OutMessage m;
  uint64_t id = next_id_++;
  auto h = m.header();
  Header(h, msg::Kind::CHECKPOINT_COMMIT, id);
  ToWire(rec, h.initCheckpoint());
  Control(m, id, "checkpoint " + std::to_string(rec.id) + " commit");
  committed_ = rec.id;
}

CheckpointRecord Client::NewestCheckpoint() {
  OutMessage m;
  uint64_t id = next_id_++;
  Header(m.header(), msg::Kind::RESUME_QUERY, id);
  const bool rejoin = opts_.rejoin && !rejoined_;
  m.header().setRejoin(rejoin);
  // A rejoining process's query starts a generation: never sent twice.
  InMessage r = Control(m, id, "resume query", /*resend=*/!rejoin);
  SHOAL_CHECK(r.header().getKind() == msg::Kind::CHECKPOINT_ACK,
              "resume query: " +
                  UnexpectedAnswer("the coordinator", cfg_.servers[0], msg::Kind::RESUME_QUERY, r.header().getKind()));
  CheckpointRecord rec = FromWire(r.header().getCheckpoint());
  committed_ = std::max(committed_, rec.id);
  latest_generation_ = r.header().getGeneration();
  last_restart_ = r.header().getMessage();
  // A process restarted alone starts in the generation its own query began.
  if (rejoin) generation_ = latest_generation_;
  rejoined_ = rejoined_ || rejoin;
  return rec;
}

void Client::CheckRestarts() {
  CheckpointRecord rec = NewestCheckpoint();
  if (latest_generation_ > generation_)
    throw ShardRestarted(latest_generation_, rec,
                         last_restart_ + " (recovery generation " + std::to_string(latest_generation_) + ")");
}

void Client::Reload(const CheckpointRecord& rec) {
  AskEveryShard(msg::Kind::RELOAD, msg::Kind::CHECKPOINT_ACK,
                [&](msg::Header::Builder h) { ToWire(rec, h.initCheckpoint()); });
}

}  // namespace shoal
