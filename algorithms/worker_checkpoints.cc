#include "algorithms/worker_checkpoints.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>

#include "algorithms/collectives/communicator.h"
#include "common/byte_codec.h"
#include "common/error.h"
#include "common/int_list.h"
#include "common/rendezvous/rendezvous.h"
#include "common/rendezvous/store.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;

// The newest checkpoint id rank r wrote (no '/' in keys: a FileStore's keys are files), or
// kRestarted from a worker restarted alone that wrote none since.
std::string WrittenKey(int r) { return "checkpoint-written-" + std::to_string(r); }
constexpr const char* kRestarted = "restarted";
constexpr const char* kIdOffsetKey = "checkpoint-id-offset";
constexpr auto kRestartedGrace = std::chrono::milliseconds(1000);

bool Contains(const std::vector<uint32_t>& v, int x) { return std::find(v.begin(), v.end(), uint32_t(x)) != v.end(); }

bool Holds(const std::vector<CheckpointRecord>& held, uint64_t id) {
  for (const CheckpointRecord& r : held)
    if (r.id == id) return true;
  return false;
}

// What a worker publishes on --resume: "<committed>/<id>:<shards>[:<absent>...],...".
std::string EncodeHeld(const std::vector<CheckpointRecord>& held, uint64_t committed) {
  std::string out = std::to_string(committed) + "/";
  for (size_t i = 0; i < held.size(); ++i) {
    out += (i ? "," : "") + std::to_string(held[i].id) + ":" + std::to_string(held[i].shards);
    for (uint32_t a : held[i].absent) out += ":" + std::to_string(a);
  }
  return out;
}

void DecodeHeld(const std::string& v, const std::string& what, std::vector<CheckpointRecord>* held,
                uint64_t* committed) {
  const size_t slash = v.find('/');
  SHOAL_CHECK(slash != std::string::npos, what + ": '" + v + "' has no committed id");
  const std::vector<uint64_t> c = ParseIntList<uint64_t>(v.substr(0, slash), what);
  SHOAL_CHECK(c.size() == 1, what + ": '" + v + "' has no committed id");
  *committed = c[0];
  std::string rest = v.substr(slash + 1);
  size_t at = 0;
  while (at < rest.size()) {
    const size_t end = std::min(rest.find(',', at), rest.size());
    std::string one = rest.substr(at, end - at);
    std::replace(one.begin(), one.end(), ':', ',');
    const std::vector<uint64_t> f = ParseIntList<uint64_t>(one, what);
    SHOAL_CHECK(f.size() >= 2, what + ": '" + v + "': a checkpoint without its worker count");
    CheckpointRecord rec;
    rec.id = f[0];
    rec.shards = uint32_t(f[1]);
    for (size_t i = 2; i < f.size(); ++i) rec.absent.push_back(uint32_t(f[i]));
    held->push_back(rec);
    at = end + 1;
  }
}

}  // namespace

WorkerCheckpoints::WorkerCheckpoints(const JobConfig& cfg, int rank, int world, Store* store, CheckpointStart start,
                                     bool elastic, bool rejoined)
    : rank_(rank),
      world_(world),
      store_(store),
      ckpt_(cfg.checkpoint_dir + "/worker-" + std::to_string(rank), "worker " + std::to_string(rank), start),
      elastic_(elastic) {
  SHOAL_CHECK(store_, "worker checkpoints need the job's rendezvous store");
  // Peers reach a checkpoint within one step of each other; a dead one is named by the
  // membership long before this bound.
  timeout_ms_ = int(std::max<int64_t>(120000, 4 * cfg.heartbeat_timeout_ms));
  committed_ = ckpt_.Committed().id;
  if (!rejoined) return;
  // The others may be waiting for a checkpoint this process will never write (the one its
  // predecessor died before); it writes the next ones only after it joined an outer round.
  store_->Set(WrittenKey(rank_), kRestarted);
  // A run resumed on another number of workers numbers its checkpoints from the one it took.
  try {
    SetIdOffset(std::stoll(store_->Get(kIdOffsetKey, 0)));
  } catch (const std::exception&) {  // not published: the ids are the steps
  }
}

void WorkerCheckpoints::Joined(int64_t step) { store_->Set(WrittenKey(rank_), std::to_string(IdAt(step))); }

void WorkerCheckpoints::SetIdOffset(int64_t offset) {
  id_offset_ = offset;
  if (elastic_ && rank_ == 0) store_->Set(kIdOffsetKey, std::to_string(offset));
}

std::vector<std::string> WorkerCheckpoints::GatherAll(const std::string& key_prefix, const std::string& what) {
  // One deadline for all ranks, so a gather waits at most timeout_ms_ however many there are.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  std::vector<std::string> out(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      out[size_t(r)] = store_->Get(key_prefix + std::to_string(r), int(std::max<int64_t>(1, left.count())));
    } catch (const Error& e) {
      throw Error(what + ": worker " + std::to_string(r) + " did not answer within " +
                  std::to_string(timeout_ms_ / 1000) + " s: " + e.what());
    }
  }
  return out;
}

CheckpointState WorkerCheckpoints::Resume(Communicator* peers, const std::vector<std::string>& averaged) {
  // What this worker holds, and the newest of it that it knows every writer had written.
  store_->Set("checkpoint-held-" + std::to_string(rank_), EncodeHeld(ckpt_.Records(), ckpt_.Committed().id));
  std::vector<std::string> published = GatherAll("checkpoint-held-", "--resume");
  std::vector<std::vector<CheckpointRecord>> held(static_cast<size_t>(world_));
  std::string each;
  uint64_t complete = 0;  // the newest checkpoint some worker holds and knows complete
  int source = -1;
  for (int r = 0; r < world_; ++r) {
    uint64_t committed = 0;
    DecodeHeld(published[size_t(r)], "--resume: worker " + std::to_string(r) + "'s list", &held[size_t(r)], &committed);
    std::vector<uint64_t> ids;
    for (const CheckpointRecord& rec : held[size_t(r)]) {
      ids.push_back(rec.id);
      if (rec.id <= committed && rec.id > complete) {
        complete = rec.id;
        source = r;
      }
    }
    each += (each.empty() ? "" : "; ") + std::string("worker ") + std::to_string(r) + ": " + IdList(ids);
  }
  // Every rank decides from the same lists, so every rank takes the same branch.
  const CheckpointRecord newest = NewestCompleteOfWorkers(held);
  if (newest.id > 0 && newest.shards == uint32_t(world_)) {
    bool all_hold = true;
    for (auto& h : held) all_hold = all_hold && Holds(h, newest.id);
    if (!all_hold) return ShareWithAbsent(newest, held, peers);
    CheckpointState st = ckpt_.Read(newest.id);
    ckpt_.Commit(st.record);
    committed_ = st.record.id;
    SetIdOffset(int64_t(st.record.id) - st.record.step);
    resumed_from_ = "its own checkpoint " + std::to_string(st.record.id);
    return st;
  }
  if (complete == 0)
    throw InputError("--resume: no complete checkpoint that any worker holds (" + each +
                     "); start over with --fresh, or resume with the workers that wrote them");
  if (!peers)
    throw InputError("--resume: checkpoint " + std::to_string(complete) +
                     " was written by another set of workers, and this job's algorithm cannot hand it to the "
                     "others; resume with the workers that wrote it (" +
                     each + ")");
  std::vector<char> holds(size_t(world_), 0);
  for (int r = 0; r < world_; ++r) holds[size_t(r)] = Holds(held[size_t(r)], complete);
  return Reshape(complete, source, holds, peers, averaged);
}

namespace {

std::string EncodeState(const CheckpointState& st) {
  ByteWriter w;
  w.Put<uint64_t>(st.record.id).Put<int64_t>(st.record.step).Put<int64_t>(st.record.epoch);
  w.Put<int64_t>(st.record.batch).Put<uint32_t>(st.record.shards).Put<uint32_t>(uint32_t(st.record.absent.size()));
  for (uint32_t a : st.record.absent) w.Put<uint32_t>(a);
  w.Put<uint64_t>(st.entries.size());
  for (const auto& [key, bytes] : st.entries) w.Blob(key.data(), key.size()).Blob(bytes.data(), bytes.size());
  return std::move(w.str());
}

CheckpointState DecodeState(const std::string& bytes) {
  ByteReader r(bytes, "--resume: the checkpoint sent by another worker");
  CheckpointState st;
  st.record.id = r.Get<uint64_t>();
  st.record.step = r.Get<int64_t>();
  st.record.epoch = r.Get<int64_t>();
  st.record.batch = r.Get<int64_t>();
  st.record.shards = r.Get<uint32_t>();
  const uint32_t absent = r.Get<uint32_t>();
  SHOAL_CHECK(absent < st.record.shards, "--resume: the checkpoint sent by another worker: " + std::to_string(absent) +
                                             " absent workers of " + std::to_string(st.record.shards));
  for (uint32_t i = 0; i < absent; ++i) st.record.absent.push_back(r.Get<uint32_t>());
  const uint64_t n = r.Get<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) {
    std::string key(r.Blob());
    st.entries[key] = std::string(r.Blob());
  }
  r.ExpectDone();
  return st;
}

// `source`'s checkpoint, encoded, on every rank (`own` is read only on the source).
std::string BroadcastState(const CheckpointState& own, bool is_source, int source, Communicator* peers) {
  std::string bytes = is_source ? EncodeState(own) : std::string();
  uint64_t size = bytes.size();
  peers->Broadcast(&size, sizeof size, source);
  bytes.resize(size_t(size));
  peers->Broadcast(bytes.data(), int64_t(size), source);
  return bytes;
}

bool StartsWithAny(const std::string& key, const std::vector<std::string>& prefixes) {
  for (const std::string& p : prefixes)
    if (key.compare(0, p.size(), p) == 0) return true;
  return false;
}

}  // namespace

CheckpointState WorkerCheckpoints::ShareWithAbsent(const CheckpointRecord& rec,
                                                   const std::vector<std::vector<CheckpointRecord>>& held,
                                                   Communicator* peers) {
  std::vector<int> absent;
  int source = -1;
  for (int r = 0; r < world_; ++r) {
    if (Holds(held[size_t(r)], rec.id)) {
      if (source < 0) source = r;
    } else {
      absent.push_back(r);
    }
  }
  if (!peers)
    throw InputError("--resume: worker(s) " + JoinIntList(absent, ", ") + " wrote no part of checkpoint " +
                     std::to_string(rec.id) + ", and this job's algorithm cannot hand it to them");
  const bool mine = Holds(held[size_t(rank_)], rec.id);
  CheckpointState own;
  if (mine) own = ckpt_.Read(rec.id);
  const std::string bytes = BroadcastState(own, rank_ == source, source, peers);
  CheckpointState st;
  if (mine) {
    st = std::move(own);
    ckpt_.Commit(st.record);
    committed_ = st.record.id;
    resumed_from_ = "its own checkpoint " + std::to_string(rec.id);
  } else {  // nothing of it here to commit: this store's own committed one stays
    st = DecodeState(bytes);
    resumed_from_ = "worker " + std::to_string(source) + "'s copy of checkpoint " + std::to_string(rec.id) +
                    " (this worker wrote none of it: it was not a member of the outer round it was taken at)";
  }
  SHOAL_CHECK(Contains(st.record.absent, rank_) != mine,
              "--resume: checkpoint " + std::to_string(rec.id) + " lists worker " + std::to_string(rank_) +
                  (mine ? " absent, and its store holds it" : " as a writer, and its store lacks it"));
  SetIdOffset(int64_t(st.record.id) - st.record.step);
  return st;
}

CheckpointState WorkerCheckpoints::Reshape(uint64_t id, int source, const std::vector<char>& holds, Communicator* peers,
                                           const std::vector<std::string>& averaged) {
  const bool mine = holds[size_t(rank_)] != 0;
  CheckpointState own;
  if (mine) own = ckpt_.Read(id);
  const std::string bytes = BroadcastState(own, rank_ == source, source, peers);
  CheckpointState st = rank_ == source ? std::move(own) : DecodeState(bytes);
  // Entries that differ between workers: the mean of those who hold the checkpoint, in the
  // map's (sorted, so common) order on every rank.
  float holders = 0;
  for (char h : holds) holders += h ? 1.f : 0.f;
  for (auto& [key, value] : st.entries) {
    if (!StartsWithAny(key, averaged)) continue;
    SHOAL_CHECK(value.size() % sizeof(float) == 0,
                "--resume: entry '" + key + "' of checkpoint " + std::to_string(id) + " is no float array");
    std::vector<float> sum(value.size() / sizeof(float), 0.f);
    if (mine) {
      const std::string& own_value = rank_ == source ? value : own.Get(key);
      SHOAL_CHECK(own_value.size() == value.size(), "--resume: entry '" + key + "' differs in size between workers");
      memcpy(sum.data(), own_value.data(), own_value.size());
    }
    peers->AllReduce(sum.data(), int64_t(sum.size()), ReduceOp::kSum);
    for (float& x : sum) x /= holders;
    memcpy(value.data(), sum.data(), value.size());
  }
  if (mine) {
    ckpt_.Commit(st.record);
    committed_ = id;
  }
  SetIdOffset(int64_t(st.record.id) - st.record.step);
  resumed_from_ = "checkpoint " + std::to_string(id) + " of " + std::to_string(st.record.shards) +
                  " workers, sent by worker " + std::to_string(source);
  return st;
}

WorkerCheckpoints::Written WorkerCheckpoints::Wrote(int r, uint64_t id, int wait_ms) {
  std::string v;
  try {
    v = store_->Get(WrittenKey(r), wait_ms);
  } catch (const Error&) {
    if (!elastic_) throw;  // none within the bound: the caller names it
  }
  if (v == kRestarted) return Written::kRestarted;
  if (!v.empty()) {
    std::vector<uint64_t> got = ParseIntList<uint64_t>(v, "checkpoint: worker " + std::to_string(r) + "'s id");
    if (got.size() == 1 && got[0] >= id) return Written::kYes;
  }
  if (elastic_) {
    std::string dead;
    try {
      dead = store_->Get(kDeadRanksKey, 0);
    } catch (const Error&) {  // nobody listed yet
    }
    const std::vector<int> ranks = ParseIntList<int>(dead, kDeadRanksKey);
    if (std::find(ranks.begin(), ranks.end(), r) != ranks.end()) return Written::kLost;
  }
  return Written::kNotYet;
}

bool WorkerCheckpoints::Save(CheckpointState state) {
  const uint64_t id = state.record.id;
  state.record.shards = uint32_t(world_);
  SHOAL_CHECK(elastic_ || state.record.absent.empty(),
              "checkpoint " + std::to_string(id) + ": absent workers in a job that needs every worker's");
  ckpt_.WriteState(state, committed_);
  // One key per rank, overwritten with its newest written id: the store holds `world` keys
  // however long the job runs (a key per checkpoint would fill the coordinator's store,
  // RendezvousService::kMaxKeys, on long jobs). Ranks write the same ids in order, so
  // "every worker wrote it" is every key at id or beyond.
  store_->Set(WrittenKey(rank_), std::to_string(id));
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_ || Contains(state.record.absent, r)) continue;
    int sleep_ms = 1;
    std::optional<Clock::time_point> restarted;  // since when r's key says it was restarted
    while (true) {
      const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      std::string lost;
      if (left <= 0) {
        lost = "worker " + std::to_string(r) + " did not write it within " + std::to_string(timeout_ms_ / 1000) + " s";
        if (!elastic_) throw Error("checkpoint " + std::to_string(id) + ": " + lost);
      } else {
        const Written w = Wrote(r, id, elastic_ ? int(std::min<int64_t>(left, 100)) : int(left));
        if (w == Written::kYes) break;
        if (w == Written::kRestarted && !restarted) restarted = Clock::now();
        if (w != Written::kRestarted) restarted.reset();
        // A member restarted again before it wrote stays marked; one that has just taken
        // the global state clears the mark at once (Joined), so a moment's grace tells them apart.
        if (w == Written::kLost || (restarted && Clock::now() - *restarted > kRestartedGrace))
          lost = "worker " + std::to_string(r) + " was lost before it wrote it";
      }
      if (!lost.empty()) {
        fprintf(stderr,
                "worker %d: checkpoint %llu is not complete: %s; training goes on, and a later checkpoint taken "
                "after an outer round without it will be\n",
                rank_, (unsigned long long)id, lost.c_str());
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      sleep_ms = std::min(sleep_ms * 2, 20);
    }
  }
  ckpt_.Commit(state.record);
  committed_ = id;
  return true;
}

}  // namespace shoal
