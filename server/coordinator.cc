#include "server/coordinator.h"

#include <algorithm>
#include <map>
#include <optional>
#include <glog/logging.h>

#include "common/error.h"
#include "common/int_list.h"
#include "common/training_plan.h"

namespace shoal {

std::vector<TensorPlacement> PlaceTensors(std::vector<TensorPlacement> tensors, int num_shards) {
  SHOAL_CHECK(num_shards > 0, "cannot place tensors on zero shards");
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (tensors[a].bytes != tensors[b].bytes) return tensors[a].bytes > tensors[b].bytes;
    return tensors[a].name < tensors[b].name;
  });
  std::vector<uint64_t> load(num_shards, 0);
  for (size_t i : order) {
    int best = int(std::min_element(load.begin(), load.end()) - load.begin());
    tensors[i].shard = best;
    load[best] += tensors[i].bytes;
  }
  return tensors;
}

Coordinator::Coordinator(const JobConfig& cfg, ReplyFn reply) : cfg_(cfg), reply_(std::move(reply)) {}

namespace {
const char* kGenerationNote = "coordinator/generation";
const char* kLeftNote = "coordinator/left";        // "0,2": the workers that finished
const char* kTensorsNote = "coordinator/tensors";  // Coordinator::tensors_

struct KeptTensor {
  std::string shape;  // "[256,784]"
  int shard = -1;     // -1: a note from before placements were kept (PlaceTensors gave them)
};

// "name\t[shape]\tshard" lines (older notes: "name\t[shape]") -> name -> KeptTensor.
std::map<std::string, KeptTensor> TensorLines(const std::string& lines) {
  std::map<std::string, KeptTensor> out;
  size_t at = 0;
  while (at < lines.size()) {
    size_t end = lines.find('\n', at), tab = lines.find('\t', at);
    if (end == std::string::npos) end = lines.size();
    if (tab < end) {
      KeptTensor& t = out[lines.substr(at, tab - at)];
      t.shape = lines.substr(tab + 1, end - tab - 1);
      size_t second = t.shape.find('\t');
      if (second != std::string::npos) {
        const std::string shard = t.shape.substr(second + 1);
        t.shape.resize(second);
        t.shard = shard.empty() || shard.size() > 6 || shard.find_first_not_of("0123456789") != std::string::npos
                      ? -2  // damaged: refused where placement is read
                      : std::stoi(shard);
      }
    }
    at = end + 1;
  }
  return out;
}

bool IsClock(const std::string& name) { return name.rfind(kWorkerClockPrefix, 0) == 0; }

// Why a job registering `job` cannot continue from checkpoints of `kept` ("" when it can).
// The workers' clocks are left out: a job resumes on any number of workers.
std::string ModelMismatch(const std::map<std::string, KeptTensor>& kept,
                          const std::map<std::string, std::string>& job) {
  for (auto& [name, t] : kept) {
    if (IsClock(name)) continue;
    auto it = job.find(name);
    if (it == job.end()) return "its tensor '" + name + "' " + t.shape + " is not in this job's model";
    if (it->second != t.shape)
      return "tensor '" + name + "' is " + t.shape + " in the checkpoint but " + it->second + " in this job";
  }
  for (auto& [name, shape] : job)
    if (!IsClock(name) && !kept.count(name))
      return "this job's tensor '" + name + "' " + shape + " is not in the checkpoint";
  return "";
}
// Workers whose clocks the tensors hold (one each).
template <typename Map>
int ClockedWorkers(const Map& tensors) {
  int n = 0;
  for (auto& kv : tensors) n += IsClock(kv.first);
  return n;
}

// Elements of a "[d0,d1,...]" shape.
uint64_t Elements(const std::string& shape) {
  uint64_t n = 1;
  for (int64_t d : ParseIntList<int64_t>(shape.substr(1, shape.size() - 2), "shape " + shape)) n *= uint64_t(d);
  return n;
}
}  // namespace

std::vector<TensorPlacement> PlaceAround(std::vector<TensorPlacement> tensors, const std::map<std::string, int>& kept,
                                         int num_shards) {
  SHOAL_CHECK(num_shards > 0, "cannot place tensors on zero shards");
  std::vector<uint64_t> load(num_shards, 0);
  std::vector<TensorPlacement> added;
  for (auto& t : tensors) {
    auto it = kept.find(t.name);
    if (it == kept.end()) {
      added.push_back(t);
      continue;
    }
    SHOAL_CHECK(it->second >= 0 && it->second < num_shards, "tensor '" + t.name + "' was kept on shard " +
                                                                std::to_string(it->second) + ", but the job has " +
                                                                std::to_string(num_shards) + " shards");
    t.shard = it->second;
    load[size_t(t.shard)] += t.bytes;
  }
  // The new ones, largest first onto the least-loaded shard, as PlaceTensors does.
  std::stable_sort(added.begin(), added.end(), [](const TensorPlacement& a, const TensorPlacement& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
  });
  std::map<std::string, int> shard_of;
  for (auto& t : added) {
    int best = int(std::min_element(load.begin(), load.end()) - load.begin());
    shard_of[t.name] = best;
    load[size_t(best)] += t.bytes;
  }
  for (auto& t : tensors)
    if (shard_of.count(t.name)) t.shard = shard_of[t.name];
  return tensors;
}

namespace {
// The job's placement around what the checkpoints hold (`kept`; empty: a new job).
std::vector<TensorPlacement> PlaceKept(const std::vector<TensorPlacement>& asked,
                                       const std::map<std::string, KeptTensor>& kept, int num_shards) {
  if (kept.empty()) return PlaceTensors(asked, num_shards);
  std::map<std::string, int> shard_of;
  std::vector<TensorPlacement> unknown;  // kept before placements were: as PlaceTensors placed them then
  for (auto& [name, t] : kept) {
    SHOAL_CHECK(t.shard != -2,
                "the coordinator's note '" + std::string(kTensorsNote) + "' is damaged at '" + name + "'");
    SHOAL_CHECK(t.shape.size() >= 2,
                "the coordinator's note '" + std::string(kTensorsNote) + "': tensor '" + name + "' has no shape");
    if (t.shard >= 0)
      shard_of[name] = t.shard;
    else
      unknown.push_back({name, Elements(t.shape) * 4, 0});
  }
  for (auto& p : PlaceTensors(unknown, num_shards)) shard_of[p.name] = p.shard;
  return PlaceAround(asked, shard_of, num_shards);
}
}  // namespace

void Coordinator::SetCheckpointer(Checkpointer* c, bool rejoin) {
  checkpointer_ = c;
  if (!c) return;
  if (!rejoin) return Persist(generation_);
  uint32_t before = 0;
  std::optional<std::string> g = c->Note(kGenerationNote), l = c->Note(kLeftNote);
  try {
    if (g) {
      size_t used = 0;
      unsigned long v = std::stoul(*g, &used);
      SHOAL_CHECK(used == g->size() && v < 0xffffffffUL, "not a generation");
      before = uint32_t(v);
    }
  } catch (const std::exception&) {
    throw Error(c->path() + ": the coordinator's note '" + kGenerationNote + "' is damaged ('" + g.value_or("") +
                "' is not a recovery generation)");
  }
  const std::string what = c->path() + ": the coordinator's note '" + kLeftNote + "' (the workers that finished)";
  for (int r : ParseIntList<int>(l.value_or(""), what)) {
    SHOAL_CHECK(r >= 0 && r < cfg_.world_size(), what + " names worker " + std::to_string(r) + ", but the job has " +
                                                     std::to_string(cfg_.world_size()) + " workers");
    left_.insert(r);
  }
  CheckpointRecord rec = c->Committed();
  last_restart_ = "server shard 0 (the coordinator) restarted from checkpoint " + std::to_string(rec.id) + " (step " +
                  std::to_string(rec.step) + ")";
  // On disk before anyone hears of it: a second restart must go higher still.
  Persist(before + 1);
  generation_ = before + 1;
  LOG(WARNING) << "coordinator: " << last_restart_ << "; recovery generation " << generation_ << " (was " << before
               << "), " << left_.size() << " worker(s) had finished";
}

CheckpointRecord Coordinator::Committed() const {
  CheckpointRecord rec = checkpointer_->Committed();
  std::optional<std::string> kept = checkpointer_->Note(kTensorsNote);
  if (rec.id > 0 && kept) rec.workers = uint32_t(ClockedWorkers(TensorLines(*kept)));
  return rec;
}

void Coordinator::Persist(uint32_t generation) const {
  checkpointer_->PutNote(kLeftNote, JoinIntList(std::vector<int>(left_.begin(), left_.end())));
  checkpointer_->PutNote(kGenerationNote, std::to_string(generation));
}

std::string Coordinator::Name(const Key& k) {
  return std::string(k.first == int(msg::Role::WORKER) ? "worker " : "server shard ") + std::to_string(k.second);
}

void Coordinator::Seen(const Key& k, Clock::time_point now) {
  auto it = members_.find(k);
  if (it == members_.end()) {
    LOG(INFO) << "coordinator: " << Name(k) << " joined";
    members_[k].last_seen = now;
    return;
  }
  if (!it->second.alive) LOG(WARNING) << "coordinator: " << Name(k) << " is answering again";
  it->second.alive = true;
  it->second.last_seen = now;
}

bool Coordinator::IsAlive(msg::Role role, int rank) const {
  auto it = members_.find({int(role), rank});
  return it != members_.end() && it->second.alive;
}

bool Coordinator::Handle(const InMessage& m, Clock::time_point now) {
  if (rendezvous_.Handle(m, [&](OutMessage& out) { reply_(m.identity, out); })) return true;
  auto h = m.header();
  auto kind = h.getKind();
  if (kind != msg::Kind::REGISTER && kind != msg::Kind::BARRIER && kind != msg::Kind::HEARTBEAT &&
      kind != msg::Kind::CHECKPOINT_COMMIT && kind != msg::Kind::RESUME_QUERY && kind != msg::Kind::LEAVE &&
      kind != msg::Kind::MEMBERS)
    return false;
  Key key{int(h.getRole()), h.getRank()};
  bool worker = h.getRole() == msg::Role::WORKER;
  int limit = worker ? cfg_.world_size() : int(cfg_.servers.size());
  if (h.getRank() < 0 || h.getRank() >= limit ||
      (h.getRole() != msg::Role::WORKER && h.getRole() != msg::Role::SERVER)) {
    std::string what = "coordinator: " + std::string(worker ? "worker rank " : "member rank ") +
                       std::to_string(h.getRank()) + " is outside the job (" + std::to_string(limit) +
                       (worker ? " workers)" : " servers)");
    LOG(WARNING) << what << " from " << PeerName(m.identity);
    if (kind != msg::Kind::HEARTBEAT) ReplyError(m.identity, h.getRequestId(), what);
    return true;
  }
  Seen(key, now);
  if (kind == msg::Kind::REGISTER) OnRegister(m);
  if (kind == msg::Kind::BARRIER) OnBarrier(m);
  if (kind == msg::Kind::CHECKPOINT_COMMIT || kind == msg::Kind::RESUME_QUERY) OnCheckpoint(m);
  if (kind == msg::Kind::LEAVE) OnLeave(m);
  if (kind == msg::Kind::MEMBERS) ReplyClusterMap(m);
  // A shard's heartbeat is answered, so that a shard cut off from the coordinator (its
  // host's link down for good, shard 0 gone with nobody to restart it) can tell and leave.
  if (kind == msg::Kind::HEARTBEAT && h.getRole() == msg::Role::SERVER) {
    OutMessage out;
    auto r = out.header();
    r.setKind(JobOver() ? msg::Kind::JOB_OVER : msg::Kind::HEARTBEAT_ACK);
    r.setRole(msg::Role::SERVER);
    reply_(m.identity, out);
    if (JobOver()) told_.insert(h.getRank());
  }
  return true;
}

void Coordinator::OnLeave(const InMessage& m) {
  auto h = m.header();
  if (h.getRole() != msg::Role::WORKER)
    return ReplyError(m.identity, h.getRequestId(), "coordinator: only workers leave a job");
  if (left_.insert(h.getRank()).second) {
    LOG(INFO) << "coordinator: worker " << h.getRank() << " finished (" << left_.size() << " of " << cfg_.world_size()
              << ")";
    // A coordinator restarted alone must still know it: the worker never comes back.
    if (checkpointer_) Persist(generation_);
  }
  OutMessage out;
  auto r = out.header();
  r.setKind(msg::Kind::LEAVE_ACK);
  r.setRequestId(h.getRequestId());
  r.setRole(msg::Role::SERVER);
  reply_(m.identity, out);
}

bool Coordinator::JobOver() const {
  for (int r = 0; r < cfg_.world_size(); ++r)
    if (!left_.count(r) && IsAlive(msg::Role::WORKER, r)) return false;
  // A worker never seen is not known to be dead: it may be starting.
  for (int r = 0; r < cfg_.world_size(); ++r)
    if (!left_.count(r) && !members_.count({int(msg::Role::WORKER), r})) return false;
  return true;
}

bool Coordinator::ShardsTold() const {
  for (int k = 1; k < int(cfg_.servers.size()); ++k)
    if (!told_.count(k) && IsAlive(msg::Role::SERVER, k)) return false;
  return true;
}

// The commit is the moment a checkpoint becomes the one to resume from: a worker sends it
// only after every shard acknowledged writing it.
void Coordinator::OnCheckpoint(const InMessage& m) {
  auto h = m.header();
  if (!checkpointer_) {
    ReplyError(m.identity, h.getRequestId(),
               "coordinator: this job keeps no checkpoints ([job] checkpoint_dir is not set)");
    return;
  }
  CheckpointRecord rec;
  try {
    if (h.getKind() == msg::Kind::CHECKPOINT_COMMIT) {
      rec = FromWire(h.getCheckpoint());
      SHOAL_CHECK(rec.id > 0 && rec.step >= 0 && rec.epoch >= 0 && rec.batch >= 0 && rec.shards == cfg_.servers.size(),
                  "commit of a malformed checkpoint record (id " + std::to_string(rec.id) + ", " +
                      std::to_string(rec.shards) + " shards)");
      // Shard 0 wrote it too (every shard acknowledged before a worker commits): a commit
      // naming anything else is not from a worker of this job.
      std::vector<uint64_t> here = checkpointer_->Written();
      SHOAL_CHECK(std::find(here.begin(), here.end(), rec.id) != here.end(),
                  "commit of checkpoint " + std::to_string(rec.id) + ", which shard 0 never wrote");
      // A commit begun before a shard was restarted alone would name a checkpoint the
      // restarted shard may not have loaded: refused, and the worker recovers instead.
      SHOAL_CHECK(h.getGeneration() == generation_, "commit of checkpoint " + std::to_string(rec.id) +
                                                        " from before the restart (generation " +
                                                        std::to_string(h.getGeneration()) + ", now " +
                                                        std::to_string(generation_) + ": " + last_restart_ + ")");
      std::map<std::string, std::string> notes;
      if (!tensors_kept_ && !tensors_.empty()) notes[kTensorsNote] = tensors_;
      checkpointer_->Commit(rec, notes);
      tensors_kept_ = tensors_kept_ || !notes.empty();
      if (!tensors_.empty()) rec.workers = uint32_t(cfg_.world_size());
      LOG(INFO) << "coordinator: checkpoint " << rec.id << " complete (step " << rec.step << ", epoch " << rec.epoch
                << ", batch " << rec.batch << ")";
    } else {
      rec = Committed();
      if (h.getRejoin()) {
        // A shard restarted alone: it loads `rec`, and every worker must learn that the
        // shards no longer hold what they pushed since. A ps_sync worker restarted alone:
        // it resumes at `rec`, so everyone else must go back there with it.
        Persist(generation_ + 1);
        ++generation_;
        last_restart_ = Name({int(h.getRole()), h.getRank()}) + " restarted from checkpoint " + std::to_string(rec.id) +
                        " (step " + std::to_string(rec.step) + ")";
        LOG(WARNING) << "coordinator: " << last_restart_ << "; recovery generation " << generation_;
        FailBarriers(last_restart_);
      }
    }
  } catch (const Error& e) {
    ReplyError(m.identity, h.getRequestId(), std::string("coordinator: ") + e.what());
    return;
  }
  OutMessage out;
  auto r = out.header();
  r.setKind(msg::Kind::CHECKPOINT_ACK);
  r.setRequestId(h.getRequestId());
  r.setRole(msg::Role::SERVER);
  r.setRank(0);
  r.setGeneration(generation_);
  if (generation_ > 0) r.setMessage(last_restart_);
  ToWire(rec, r.initCheckpoint());
  reply_(m.identity, out);
}

void Coordinator::OnRegister(const InMessage& m) {
  auto h = m.header();
  auto specs = h.getTensors();
  if (specs.size() > 0) {
    std::vector<TensorPlacement> asked;
    std::map<std::string, std::string> job;
    for (auto t : specs) {
      asked.push_back({t.getName(), t.getByteSize(), 0});
      std::string shape;
      for (int64_t d : t.getShape()) shape += (shape.empty() ? "" : ",") + std::to_string(d);
      job[t.getName()] = "[" + shape + "]";
    }
    std::map<std::string, KeptTensor> kept;
    bool resuming = false;
    if (checkpointer_) {
      try {
        std::optional<std::string> note = checkpointer_->Note(kTensorsNote);
        resuming = note && checkpointer_->Committed().id > 0;
        if (resuming) kept = TensorLines(*note);
      } catch (const Error& e) {
        return ReplyError(m.identity, h.getRequestId(), std::string("coordinator: ") + e.what());
      }
    }
    const std::string why = resuming ? ModelMismatch(kept, job) : "";
    if (!why.empty()) {
      std::string what = "coordinator: " + Name({int(h.getRole()), h.getRank()}) +
                         " registered another model than the checkpoints in " + checkpointer_->path() +
                         " hold: " + why + "; resume with the model that wrote them, or start over with --fresh";
      LOG(WARNING) << what;
      return ReplyError(m.identity, h.getRequestId(), what, /*input_error=*/true);
    }
    if (placement_.empty()) {
      std::vector<TensorPlacement> placed;
      try {
        placed = PlaceKept(asked, kept, int(cfg_.servers.size()));
      } catch (const Error& e) {
        std::string what = "coordinator: the checkpoints in " + cfg_.checkpoint_dir + ": " + e.what() +
                           "; resume with the servers that wrote them, or start over with --fresh";
        LOG(WARNING) << what;
        return ReplyError(m.identity, h.getRequestId(), what, /*input_error=*/true);
      }
      const int before = ClockedWorkers(kept);
      if (resuming && before > 0 && before != ClockedWorkers(job))
        LOG(INFO) << "coordinator: the checkpoints in " << checkpointer_->path() << " were written by " << before
                  << " workers, this job has " << ClockedWorkers(job)
                  << ": every tensor stays on its shard, the servers map their step to the new global batch";
      placement_ = placed;
      std::map<std::string, int> shard_of;
      for (auto& p : placement_) shard_of[p.name] = p.shard;
      for (auto& [name, shape] : job) tensors_ += name + "\t" + shape + "\t" + std::to_string(shard_of[name]) + "\n";
    } else {
      auto by_name = [](std::vector<TensorPlacement> v) {
        std::map<std::string, uint64_t> out;
        for (auto& p : v) out[p.name] = p.bytes;
        return out;
      };
      if (by_name(asked) != by_name(placement_)) {
        std::string what = "coordinator: " + Name({int(h.getRole()), h.getRank()}) +
                           " registered a tensor list that differs from the one already placed";
        LOG(WARNING) << what;
        ReplyError(m.identity, h.getRequestId(), what);
        return;
      }
    }
  }
  ReplyClusterMap(m);
}

// The map as it is now, members' liveness included (what a worker asks with MEMBERS).
void Coordinator::ReplyClusterMap(const InMessage& m) {
  auto h = m.header();
  OutMessage out;
  auto r = out.header();
  r.setKind(msg::Kind::CLUSTER_MAP);
  r.setRequestId(h.getRequestId());
  r.setRole(msg::Role::SERVER);
  r.setRank(0);
  auto cm = r.initCluster();
  auto servers = cm.initServers(cfg_.servers.size());
  for (size_t i = 0; i < cfg_.servers.size(); ++i) servers.set(i, cfg_.servers[i]);
  cm.setWorldSize(cfg_.world_size());
  auto pl = cm.initPlacement(placement_.size());
  for (size_t i = 0; i < placement_.size(); ++i) {
    pl[i].setName(placement_[i].name);
    pl[i].setShard(placement_[i].shard);
    pl[i].setByteSize(placement_[i].bytes);
  }
  auto mem = cm.initMembers(members_.size());
  size_t i = 0;
  for (auto& kv : members_) {
    mem[i].setRole(static_cast<msg::Role>(kv.first.first));
    mem[i].setRank(kv.first.second);
    mem[i].setAlive(kv.second.alive);
    ++i;
  }
  reply_(m.identity, out);
}

void Coordinator::OnBarrier(const InMessage& m) {
  auto h = m.header();
  std::string name = h.getBarrierName();
  if (h.getRole() != msg::Role::WORKER) {
    ReplyError(m.identity, h.getRequestId(), "coordinator: only workers take part in barriers");
    return;
  }
  for (auto& kv : members_) {
    if (!kv.second.alive && !h.getLiveOnly()) {
      ReplyError(m.identity, h.getRequestId(),
                 "coordinator: barrier '" + name + "' cannot complete: " + Name(kv.first) + " stopped answering");
      return;
    }
  }
  if (h.getGeneration() != generation_) {
    ReplyError(m.identity, h.getRequestId(),
               "coordinator: barrier '" + name + "' of recovery generation " + std::to_string(h.getGeneration()) +
                   " refused: generation " + std::to_string(generation_) + " began when " + last_restart_);
    return;
  }
  BarrierState& b = barriers_[name];
  b.waiting[h.getRank()] = m.identity;
  b.request_ids[h.getRank()] = h.getRequestId();
  b.live_only = h.getLiveOnly();
  MaybeCompleteBarrier(name);
}

void Coordinator::MaybeCompleteBarrier(const std::string& name) {
  BarrierState& b = barriers_.at(name);
  for (int r = 0; r < cfg_.world_size(); ++r) {
    if (b.waiting.count(r) || (b.live_only && left_.count(r))) continue;
    // A live-only barrier leaves out the workers known dead or finished (a worker never
    // seen may be starting, so it is waited for); one that answers again is waited for again.
    auto it = members_.find({int(msg::Role::WORKER), r});
    if (!b.live_only || it == members_.end() || it->second.alive) return;
  }
  for (auto& kv : b.waiting) {
    OutMessage out;
    auto r = out.header();
    r.setKind(msg::Kind::BARRIER_DONE);
    r.setRequestId(b.request_ids[kv.first]);
    r.setRole(msg::Role::SERVER);
    r.setBarrierName(name);
    reply_(kv.second, out);
  }
  barriers_.erase(name);
}

void Coordinator::ReplyError(const PeerId& to, uint64_t request_id, const std::string& what, bool input_error) {
  OutMessage out;
  auto r = out.header();
  r.setKind(msg::Kind::ERROR);
  r.setRequestId(request_id);
  r.setRole(msg::Role::SERVER);
  r.setMessage(what);
  r.setInputError(input_error);
  reply_(to, out);
}

void Coordinator::FailBarriers(const std::string& why, bool strict_only) {
  for (auto it = barriers_.begin(); it != barriers_.end();) {
    if (strict_only && it->second.live_only) {
      ++it;
      continue;
    }
    for (auto& kv : it->second.waiting)
      ReplyError(kv.second, it->second.request_ids[kv.first],
                 "coordinator: barrier '" + it->first + "' cannot complete: " + why);
    it = barriers_.erase(it);
  }
}

void Coordinator::Tick(Clock::time_point now) {
  auto timeout = std::chrono::milliseconds(cfg_.heartbeat_timeout_ms);
  for (auto& kv : members_) {
    if (!kv.second.alive || now - kv.second.last_seen <= timeout) continue;
    if (kv.first.first == int(msg::Role::WORKER) && left_.count(kv.first.second)) continue;  // finished
    kv.second.alive = false;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - kv.second.last_seen).count();
    LOG(ERROR) << "coordinator: " << Name(kv.first) << " stopped answering: no heartbeat for " << ms << " ms (timeout "
               << cfg_.heartbeat_timeout_ms << " ms)";
    FailBarriers(Name(kv.first) + " stopped answering", /*strict_only=*/true);
  }
  // A live-only barrier may have been waiting only for the worker that just died.
  std::vector<std::string> live;
  for (auto& [name, b] : barriers_)
    if (b.live_only) live.push_back(name);
  for (auto& name : live) MaybeCompleteBarrier(name);
}

}  // namespace shoal
