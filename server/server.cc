#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <glog/logging.h>
#include <kj/exception.h>
#include <set>

#include "common/error.h"
#include "common/ps/client.h"

namespace shoal {

CurveKeys CurveKeysFrom(const JobConfig& cfg) {
  CurveKeys k;
  k.server_public = cfg.curve_server_public;
  k.server_secret = cfg.curve_server_secret;
  k.client_public = cfg.curve_client_public;
  k.client_secret = cfg.curve_client_secret;
  return k;
}

std::string ConnectEndpoint(const std::string& host_port) { return "tcp://" + host_port; }

Server::Server(const JobConfig& cfg, int shard, const std::string& bind_override)
    : cfg_(cfg), shard_(shard), who_("shard " + std::to_string(shard)), ctx_(who_) {
  if (shard < 0 || shard >= int(cfg_.servers.size()))
    throw InputError(cfg_.path + ": shard " + std::to_string(shard) + " is not in [cluster] servers (" +
                     std::to_string(cfg_.servers.size()) + " listed)");
  CurveKeys keys = CurveKeysFrom(cfg_);
  if (!bind_override.empty() && !keys.enabled() && !cfg_.allow_plaintext) {
    std::string host =
        bind_override.substr(bind_override.find("://") == std::string::npos ? 0 : bind_override.find("://") + 3);
    host = host.substr(0, host.rfind(':'));
    if (!IsLoopbackHost(host))
      throw InputError("--bind " + bind_override + ": not a loopback address, and " + cfg_.path +
                       " has no [security] keys: add keys (./shoal keygen) or set [security] allow_plaintext = true");
  }
  transport_ = std::make_unique<Transport>(ctx_, Transport::Kind::kServer, keys);
  transport_->EnableMonitor();
  endpoint_ = transport_->Bind(bind_override.empty() ? ListenEndpoint(cfg_.servers[shard]) : bind_override);
  if (shard == 0) {
    coordinator_ =
        std::make_unique<Coordinator>(cfg_, [this](const PeerId& to, OutMessage& m) { transport_->Send(m, &to); });
  } else {
    // Silence past three heartbeat timeouts outlasts any restart of shard 0 alone (the
    // launcher gives one 2 x heartbeat_timeout_ms to come back, else restarts the whole
    // job): nobody is left to serve, so the shard leaves instead of waiting for ever.
    heartbeat_ = std::make_unique<HeartbeatSender>(
        ctx_, ConnectEndpoint(cfg_.servers[0]), keys, msg::Role::SERVER, shard, int(cfg_.heartbeat_ms),
        int(3 * cfg_.heartbeat_timeout_ms),
        [this](const std::string& why) {
          std::lock_guard<std::mutex> l(failure_mu_);
          failure_ = why;
        },
        "shard 0 on " + cfg_.servers[0] + ", which coordinates the job, is gone or its host unreachable");
  }
  LOG(INFO) << who_ << ": listening on " << endpoint_ << (keys.enabled() ? " (CURVE)" : "")
            << (shard == 0 ? ", coordinator on" : "");
}

Server::~Server() {
  heartbeat_.reset();
  coordinator_.reset();
  transport_.reset();
}

void Server::OpenCheckpoints(CheckpointStart start, bool rejoin) {
  const bool resume = start == CheckpointStart::kResume;
  if (rejoin && !resume) throw InputError(who_ + ": --rejoin needs --resume");
  if (cfg_.checkpoint_dir.empty()) {
    if (resume)
      throw InputError(cfg_.path + ": [job] checkpoint_dir: not set, so there is no checkpoint to resume from");
    return;
  }
  checkpointer_ = std::make_unique<Checkpointer>(cfg_.checkpoint_dir, shard_, start);
  // Shard 0 restarted alone: its coordinator starts the next recovery generation, and
  // this shard refuses the older generation's pushes and pulls from the start.
  if (coordinator_) coordinator_->SetCheckpointer(checkpointer_.get(), rejoin);
  if (!resume) return;
  CheckpointRecord rec;
  if (shard_ == 0) {
    rec = coordinator_->Committed();
    generation_ = coordinator_->generation();
  } else {
    ClientOptions o;
    o.role = msg::Role::SERVER;
    o.rank = shard_;
    o.heartbeat = false;
    o.timeout_ms = int(std::max<int64_t>(30000, cfg_.heartbeat_timeout_ms * 4));
    o.rejoin = rejoin;
    Client c(cfg_, o);
    rec = c.NewestCheckpoint();
    generation_ = c.generation();
  }
  // What the stores hold against the job: the same on every restart, so InputError. (Not
  // getting an answer from shard 0 above is the network's or shard 0's failure: Error.)
  if (rec.id == 0) throw InputError(who_ + ": --resume: no complete checkpoint in " + cfg_.checkpoint_dir);
  if (rec.shards != cfg_.servers.size())
    throw InputError(who_ + ": --resume: checkpoint " + std::to_string(rec.id) + " was written by " +
                     std::to_string(rec.shards) + " shards, the job has " + std::to_string(cfg_.servers.size()));
  checkpointer_->Load(rec.id, &kv_);
  loaded_ = rec;
  resumed_step_ = rec.step;
  LOG(INFO) << who_ << ": resumed checkpoint " << rec.id << " (step " << rec.step << ", " << kv_.size() << " tensors, "
            << kv_.bytes() << " bytes) from " << checkpointer_->path()
            << (rejoin ? ", rejoining the running job as recovery generation " + std::to_string(generation_) : "");
}

void Server::CheckGeneration(InMessage& m, const char* request) const {
  uint32_t g = m.header().getGeneration();
  SHOAL_CHECK(g >= generation_, std::string(request) + " of recovery generation " + std::to_string(g) +
                                    " refused: this shard serves generation " + std::to_string(generation_) +
                                    " (a shard was restarted alone since; pull again)");
}

void Server::HandleReload(InMessage& m) {
  auto h = m.header();
  SHOAL_CHECK(checkpointer_, "reload requested but this job keeps no checkpoints ([job] checkpoint_dir is not set)");
  SHOAL_CHECK(h.getGeneration() >= generation_, "reload of an old recovery generation " +
                                                    std::to_string(h.getGeneration()) + " (serving " +
                                                    std::to_string(generation_) + ")");
  CheckpointRecord rec = FromWire(h.getCheckpoint());
  if (write_) FinishCheckpointWrite(/*wait=*/true);
  checkpointer_->Load(rec.id, &kv_);
  loaded_ = rec;
  generation_ = h.getGeneration();
  LOG(WARNING) << who_ << ": reloaded checkpoint " << rec.id << " (step " << rec.step
               << ") after a shard was restarted alone; serving recovery generation " << generation_;
  ReshapeLoaded();
  OutMessage out;
  auto r = ReplyHeader(out, msg::Kind::CHECKPOINT_ACK, h.getRequestId());
  ToWire(rec, r.initCheckpoint());
  transport_->Send(out, &m.identity);
}

void Server::HandleCheckpoint(InMessage& m) {
  auto h = m.header();
  SHOAL_CHECK(checkpointer_, "checkpoint requested but this job keeps none ([job] checkpoint_dir is not set)");
  CheckGeneration(m, "checkpoint");
  CheckpointRecord rec = FromWire(h.getCheckpoint());
  SHOAL_CHECK(rec.id > 0 && rec.shards == cfg_.servers.size(), "checkpoint request with id " + std::to_string(rec.id) +
                                                                   " for " + std::to_string(rec.shards) + " shards");
  if (write_) FinishCheckpointWrite(/*wait=*/true);
  // The snapshot is taken now, between two requests, so it is one consistent state.
  auto w = std::make_unique<WriteInFlight>();
  w->to = m.identity;
  w->request_id = h.getRequestId();
  w->rec = rec;
  w->tensors = kv_.size();
  w->start = std::chrono::steady_clock::now();
  auto pending = checkpointer_->Snapshot(rec, rec.keep, kv_);
  w->bytes = pending->bytes();
  Checkpointer* c = checkpointer_.get();
  w->error = std::async(std::launch::async, [c, p = std::move(pending), id = rec.id]() mutable -> std::string {
    try {
      c->Write(std::move(p));
      return "";
    } catch (const std::bad_alloc&) {
      return "out of memory writing checkpoint " + std::to_string(id) + "; the earlier checkpoints are kept";
    } catch (const std::exception& e) {
      return e.what();
    }
  });
  write_ = std::move(w);
}

void Server::FinishCheckpointWrite(bool wait) {
  if (!write_) return;
  if (!wait && write_->error.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
  std::unique_ptr<WriteInFlight> w = std::move(write_);
  std::string error = w->error.get();
  if (!error.empty()) {
    LOG(ERROR) << who_ << ": " << error;
    ReplyError(w->to, w->request_id, who_ + ": " + error);
    return;
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w->start).count();
  LOG(INFO) << who_ << ": wrote checkpoint " << w->rec.id << " (step " << w->rec.step << ", " << w->tensors
            << " tensors, " << w->bytes << " bytes) in " << ms << " ms";
  OutMessage out;
  auto r = ReplyHeader(out, msg::Kind::CHECKPOINT_ACK, w->request_id);
  ToWire(w->rec, r.initCheckpoint());
  transport_->Send(out, &w->to);
}

void Server::HandlePlan(InMessage& m) {
  auto h = m.header();
  TrainingPlan plan = FromWire(h.getPlan());
  if (plan_) {
    SHOAL_CHECK(*plan_ == plan, "worker " + std::to_string(h.getRank()) +
                                    "'s training plan disagrees with the first worker's (different job files?)");
  } else {
    kv_.SetPlan(plan);
    plan_ = std::make_unique<TrainingPlan>(plan);
    LOG(INFO) << who_ << ": training plan: " << plan.steps_per_epoch << " steps/epoch, " << plan.total_steps
              << " steps, global batch " << plan.global_batch << ", " << plan.workers << " workers";
    ReshapeLoaded();
  }
  OutMessage out;
  ReplyHeader(out, msg::Kind::PLAN_ACK, h.getRequestId());
  transport_->Send(out, &m.identity);
}

void Server::ReshapeLoaded() {
  if (!plan_ || loaded_.id == 0 || loaded_.workers == 0 || int(loaded_.workers) == plan_->workers) return;
  // The worker that sent the plan registered first: the coordinator has placed the tensors.
  LearnPlacement();
  SHOAL_CHECK(placement_known_, "the training plan came before any worker registered the job's tensors");
  const int64_t batch = plan_->global_batch / plan_->workers;
  const CheckpointRecord now =
      OnOtherWorkers(loaded_, batch, int(loaded_.workers), plan_->workers, plan_->steps_per_epoch);
  std::vector<std::string> gone;
  for (auto& [name, t] : kv_.tensors())
    if (!placed_.count(name)) gone.push_back(name);
  for (auto& name : gone) kv_.Erase(name);
  // Every worker starts at the mapped step: the clocks are its steps (ps_ssp's bound), and
  // the old ones counted batches of the global batch before.
  const float clock = float(now.step), none = 0.f;
  int clocks = 0;
  for (auto& name : placed_) {
    const bool is_clock = name.rfind(kWorkerClockPrefix, 0) == 0;
    if (!is_clock && name != kStopTensor) continue;
    kv_.Push(name, DType::kF32, {1}, Frame(is_clock ? &clock : &none, 4), msg::PushOp::ASSIGN);
    clocks += is_clock;
  }
  kv_.Restep(now.step);
  LOG(INFO) << who_ << ": " << OnOtherWorkersLine(loaded_, now, batch, int(loaded_.workers), plan_->workers)
            << "; the optimizer state counts " << now.step << " steps, " << clocks << " clock(s) here start there, "
            << gone.size() << " tensor(s) of workers gone dropped";
  loaded_.workers = uint32_t(plan_->workers);
}

msg::Header::Builder Server::ReplyHeader(OutMessage& out, msg::Kind kind, uint64_t request_id) const {
  auto r = out.header();
  r.setKind(kind);
  r.setRequestId(request_id);
  r.setRole(msg::Role::SERVER);
  r.setRank(shard_);
  return r;
}

void Server::Run(const std::atomic<bool>& stop) {
  auto last_tick = Coordinator::Clock::now();
  // The last moment this loop had read everything queued. Members' silence is measured up
  // to here, not up to now: after a long handling step (a RELOAD's load, a checkpoint
  // write it waits for) their heartbeats sit unread in the socket, and the loop serves at
  // most 64 messages before the next check, so counting up to now would declare live
  // members dead (and refuse every barrier after).
  auto caught_up = last_tick;
  auto events_read = last_tick;
  InMessage m;  // one for every message: a reused InMessage parses without allocating
  // Pushed frames are kept as received: KvShard aligns what its update rules read as floats.
  m.align_payloads = false;
  while (!stop) {
    const bool message = transport_->Wait(50);
    if (!message) caught_up = Coordinator::Clock::now();
    // Drain what is queued, but come back to ticks and the stop flag regularly.
    for (int i = 0; i < 64 && message; ++i) {
      bool got = true;
      try {
        got = ServeOne(m);
      } catch (...) {
        // Even answering the failure failed (e.g. no memory for the log line): drop the
        // message and keep serving.
        LOG(ERROR) << who_ << ": dropped a message after a second failure while refusing it";
      }
      if (!got) {
        caught_up = Coordinator::Clock::now();
        break;
      }
    }
    FinishCheckpointWrite(/*wait=*/false);
    auto now = Coordinator::Clock::now();
    // The socket monitor's events are read on a clock, not polled with every message (see
    // Transport::Wait): a disconnect or refused handshake is logged within 50 ms.
    if (now - events_read >= std::chrono::milliseconds(20)) {
      events_read = now;
      for (auto& e : transport_->DrainEvents()) {
        // Ordinary disconnects are routine; failed handshakes are worth a warning.
        if (e.is_disconnect())
          LOG(INFO) << who_ << ": " << e.Describe();
        else
          Warn(e.Describe());
      }
    }
    if (warn_suppressed_ > 0) FlushWarnings(now);
    // Every worker has finished (or died): the servers leave by themselves, shard 0 once
    // every other shard has heard it.
    if ((coordinator_ && coordinator_->JobOver() && coordinator_->ShardsTold()) ||
        (heartbeat_ && heartbeat_->job_over())) {
      LOG(INFO) << who_ << ": every worker has finished; stopping";
      break;
    }
    if (!failure().empty()) {
      LOG(ERROR) << who_ << ": " << failure() << "; stopping";
      break;
    }
    if (coordinator_ && now - last_tick > std::chrono::milliseconds(20)) {
      coordinator_->Tick(caught_up);
      last_tick = now;
    }
  }
  FinishCheckpointWrite(/*wait=*/true);
}

// Receives and handles one message; false when none was queued. Every failure becomes an
// answer to the requester and a log line: the loop never stops for one peer's request.
bool Server::ServeOne(InMessage& m) {
  try {
    if (!transport_->Recv(&m, 0)) return false;
  } catch (const BadMessage& e) {
    Warn("bad message from " + PeerName(e.identity) + ": " + e.what() + "; ignored");
    ReplyError(e.identity, 0, who_ + ": bad message: " + e.what());
    return true;
  } catch (const std::exception& e) {  // e.g. no memory for a large frame: drop it, keep serving
    Warn(std::string("failed receiving a message: ") + e.what());
    return true;
  }
  Serve(m);
  m.payloads.clear();  // a refused request's frames are not kept until the next message
  return true;
}

void Server::Serve(InMessage& m) {
  try {
    HandleMessage(m);
  } catch (const Error& e) {
    Warn("rejected " + Describe(m) + " from " + PeerName(m.identity) + ": " + e.what());
    ReplyError(m.identity, RequestIdOf(m), who_ + ": " + e.what());
  } catch (const kj::Exception& e) {
    Warn("malformed message from " + PeerName(m.identity) + ": " + e.getDescription().cStr());
    ReplyError(m.identity, 0, who_ + ": malformed message");
  } catch (const std::bad_alloc&) {
    // One request too big for this process's memory must not take the shard (and every
    // other worker's state) down with it.
    Warn("out of memory handling " + Describe(m) + " from " + PeerName(m.identity) + "; refused, still serving");
    ReplyError(m.identity, RequestIdOf(m), who_ + ": out of memory handling " + Describe(m));
  } catch (const std::exception& e) {
    Warn("failed handling " + Describe(m) + " from " + PeerName(m.identity) + ": " + e.what());
    ReplyError(m.identity, RequestIdOf(m), who_ + ": failed handling " + Describe(m) + ": " + e.what());
  }
}

void Server::HandleMessage(InMessage& m) {
  auto kind = m.header().getKind();
  // Pushes and pulls are the shard's own (the coordinator and its rendezvous store answer
  // other kinds only): they skip the coordinator's checks and its clock read.
  const bool data = kind == msg::Kind::PUSH || kind == msg::Kind::PUSH_PULL || kind == msg::Kind::PULL;
  if (!data && coordinator_ && coordinator_->Handle(m, Coordinator::Clock::now())) return;
  switch (kind) {
    case msg::Kind::PUSH:
    case msg::Kind::PUSH_PULL:
      return HandlePush(m);
    case msg::Kind::PULL:
      return HandlePull(m);
    case msg::Kind::CHECKPOINT:
      return HandleCheckpoint(m);
    case msg::Kind::PLAN:
      return HandlePlan(m);
    case msg::Kind::RELOAD:
      return HandleReload(m);
    case msg::Kind::REGISTER:
    case msg::Kind::BARRIER:
    case msg::Kind::HEARTBEAT:
    case msg::Kind::CHECKPOINT_COMMIT:
    case msg::Kind::RESUME_QUERY:
      throw Error("message kind " + std::to_string(int(kind)) + " belongs to the coordinator (shard 0)");
    default:
      throw Error("unknown message kind " + std::to_string(int(kind)));
  }
}

namespace {

// Throws when `names` lists one twice (`what`: "push", "pull"). A small request naming one
// big tensor many times would make the reply that many times larger: refused, never
// amplified. Sorting pointers is cheaper than a set of strings per request.
void CheckNoRepeats(const std::vector<std::string>& names, const char* what) {
  if (names.size() < 2) return;
  std::vector<const std::string*> sorted;
  sorted.reserve(names.size());
  for (auto& n : names) sorted.push_back(&n);
  std::sort(sorted.begin(), sorted.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
  for (size_t i = 1; i < sorted.size(); ++i)
    SHOAL_CHECK(*sorted[i - 1] != *sorted[i],
                std::string(what) + " names tensor '" + *sorted[i] + "' twice (one entry per tensor)");
}

}  // namespace

void Server::HandlePush(InMessage& m) {
  CheckGeneration(m, "push");
  const std::vector<TensorEntry>& tensors = m.ValidateTensors();
  auto h = m.header();
  auto op = h.getOp();
  SHOAL_CHECK(op == msg::PushOp::ASSIGN || op == msg::PushOp::ADD || op == msg::PushOp::APPLY,
              "push with unknown op " + std::to_string(int(op)));
  // Names and shapes go into scratch kept from the last request.
  std::vector<std::string>& names = names_;
  names.resize(tensors.size());
  shapes_.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    names[i].assign(tensors[i].name.begin(), tensors[i].name.size());
    tensors[i].ShapeInto(&shapes_[i]);
  }
  // Check every tensor before changing any, so a rejected push leaves the shard as it was.
  CheckNoRepeats(names, "push");
  for (size_t i = 0; i < tensors.size(); ++i) {
    CheckPlaced(names[i], "push");
    const StoredTensor* t = kv_.Find(names[i]);
    if (!t || op == msg::PushOp::ASSIGN) continue;
    SHOAL_CHECK(t->dtype == FromWire(tensors[i].dtype) && t->shape == shapes_[i],
                "push of '" + names[i] + "' disagrees with the stored dtype/shape");
  }
  std::vector<Frame>& replaced = replaced_;  // freed after the answer is on its way
  std::vector<const StoredTensor*>& stored = found_;
  replaced.resize(tensors.size());
  stored.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    replaced[i] = kv_.Push(names[i], FromWire(tensors[i].dtype), shapes_[i], std::move(m.payloads[i]), op, &stored[i]);
  if (h.getKind() == msg::Kind::PUSH_PULL) {
    SendTensors(m.identity, h.getRequestId(), names, stored);
  } else {
    OutMessage out;
    ReplyHeader(out, msg::Kind::PUSH_ACK, h.getRequestId());
    transport_->Send(out, &m.identity);
  }
  replaced.clear();
}

void Server::HandlePull(InMessage& m) {
  CheckGeneration(m, "pull");
  auto list = m.header().getNames();
  std::vector<std::string>& names = names_;
  names.resize(list.size());
  for (unsigned i = 0; i < list.size(); ++i) names[i].assign(list[i].begin(), list[i].size());
  CheckNoRepeats(names, "pull");
  std::vector<const StoredTensor*>& found = found_;
  found.clear();
  for (auto& n : names) {
    CheckPlaced(n, "pull");
    const StoredTensor* t = kv_.Find(n);
    SHOAL_CHECK(t, "pull of unknown tensor '" + n + "' (this shard holds " + std::to_string(kv_.size()) + " tensors)");
    found.push_back(t);
  }
  SendTensors(m.identity, m.header().getRequestId(), names, found);
}

void Server::LearnPlacement() {
  if (placement_known_) return;
  std::vector<TensorPlacement> all;
  if (coordinator_) {
    all = coordinator_->placement();
  } else {
    if (!placement_client_) {
      ClientOptions o;
      o.role = msg::Role::SERVER;
      o.rank = shard_;
      o.heartbeat = false;
      o.timeout_ms = int(std::max<int64_t>(5000, cfg_.heartbeat_timeout_ms));
      placement_client_ = std::make_unique<Client>(cfg_, o);
    }
    // A registration without tensors only reads the cluster map.
    for (auto& [name, shard] : placement_client_->Register().shard_of) all.push_back({name, 0, shard});
  }
  if (all.empty()) return;  // no worker has registered yet: ask again next time
  for (auto& p : all)
    if (p.shard == shard_) placed_.insert(p.name);
  placement_known_ = true;
  placement_client_.reset();
  LOG(INFO) << who_ << ": " << placed_.size() << " of the job's " << all.size() << " tensors are placed here";
}

void Server::CheckPlaced(const std::string& name, const char* request) {
  LearnPlacement();
  SHOAL_CHECK(placement_known_, std::string(request) + " of unknown tensor '" + name +
                                    "': no worker has registered the job's tensors with the coordinator yet");
  SHOAL_CHECK(placed_.count(name), std::string(request) + " of unknown tensor '" + name +
                                       "': not a tensor the job registered on shard " + std::to_string(shard_) + " (" +
                                       std::to_string(placed_.size()) + " are placed here)");
}

void Server::SendTensors(const PeerId& to, uint64_t request_id, const std::vector<std::string>& names,
                         const std::vector<const StoredTensor*>& found) {
  OutMessage out;
  out.payloads.swap(spare_payloads_);  // the last reply's vector, emptied by Send: no allocation
  auto r = ReplyHeader(out, msg::Kind::PULL_REPLY, request_id);
  auto metas = r.initTensors(found.size());
  out.payloads.reserve(found.size());
  for (unsigned i = 0; i < found.size(); ++i) {
    const StoredTensor* t = found[i];
    metas[i].setName(names[i]);
    metas[i].setDtype(ToWire(t->dtype));
    auto shape = metas[i].initShape(t->shape.size());
    for (size_t d = 0; d < t->shape.size(); ++d) shape.set(d, t->shape[d]);
    metas[i].setByteSize(t->buf->size());
    metas[i].setVersion(t->version);
    Payload p;
    p.data = t->buf->data();
    p.size = t->buf->size();
    p.keep = t->buf;  // the stored buffer is sent in place; a later write copies it first
    out.payloads.push_back(std::move(p));
  }
  transport_->Send(out, &to);
  out.payloads.swap(spare_payloads_);
}

void Server::FlushWarnings(Coordinator::Clock::time_point now) {
  if (now - warn_window_ < std::chrono::seconds(1)) return;
  if (warn_suppressed_ > 0)
    LOG(WARNING) << who_ << ": " << warn_suppressed_ << " more warnings like the above were suppressed";
  warn_window_ = now;
  warn_count_ = 0;
  warn_suppressed_ = 0;
}

void Server::Warn(const std::string& line) {
  // At most kWarnPerSecond lines a second, so a peer spraying junk cannot flood the log.
  constexpr int kWarnPerSecond = 20;
  FlushWarnings(Coordinator::Clock::now());
  if (++warn_count_ <= kWarnPerSecond)
    LOG(WARNING) << who_ << ": " << line;
  else
    ++warn_suppressed_;
}

// Called from the loop's exception handlers, so it must not throw itself: an answer that
// cannot be sent (no memory, a socket error) is logged instead.
void Server::ReplyError(const PeerId& to, uint64_t request_id, const std::string& what) noexcept {
  if (to.size() == 0) return;
  try {
    OutMessage out;
    auto r = ReplyHeader(out, msg::Kind::ERROR, request_id);
    r.setMessage(what);
    transport_->Send(out, &to);
  } catch (const std::exception& e) {
    LOG(WARNING) << who_ << ": could not send the error answer to " << PeerName(to) << ": " << e.what();
  } catch (const kj::Exception& e) {
    LOG(WARNING) << who_ << ": could not send the error answer to " << PeerName(to) << ": "
                 << e.getDescription().cStr();
  }
}

// The request a failure belongs to, for log lines and answers; safe on a message whose
// header never parsed.
std::string Server::Describe(const InMessage& m) {
  if (!m.has_header()) return "a message";
  try {
    auto h = m.header();
    const char* kind = nullptr;
    switch (h.getKind()) {
      case msg::Kind::PUSH:
        kind = "push";
        break;
      case msg::Kind::PUSH_PULL:
        kind = "push-pull";
        break;
      case msg::Kind::PULL:
        kind = "pull";
        break;
      case msg::Kind::CHECKPOINT:
        kind = "checkpoint";
        break;
      case msg::Kind::PLAN:
        kind = "plan";
        break;
      default:
        break;
    }
    std::string k = kind ? kind : "message kind " + std::to_string(int(h.getKind()));
    return k + " request " + std::to_string(h.getRequestId());
  } catch (const kj::Exception&) {
    return "a message";
  }
}

uint64_t Server::RequestIdOf(const InMessage& m) {
  if (!m.has_header()) return 0;
  try {
    return m.header().getRequestId();
  } catch (const kj::Exception&) {
    return 0;
  }
}

}  // namespace shoal
