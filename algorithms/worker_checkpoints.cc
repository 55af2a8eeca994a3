#include "algorithms/worker_checkpoints.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "algorithms/collectives/communicator.h"
#include "common/byte_codec.h"
#include "common/error.h"
#include "common/int_list.h"
#include "common/rendezvous/store.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

WorkerCheckpoints::WorkerCheckpoints(const JobConfig& cfg, int rank, int world, Store* store, CheckpointStart start)
    : rank_(rank),
      world_(world),
      store_(store),
      ckpt_(cfg.checkpoint_dir + "/worker-" + std::to_string(rank), "worker " + std::to_string(rank), start) {
  SHOAL_CHECK(store_, "worker checkpoints need the job's rendezvous store");
  // Peers reach a checkpoint within one step of each other; a dead one is named by the
  // membership long before this bound.
  timeout_ms_ = int(std::max<int64_t>(120000, 4 * cfg.heartbeat_timeout_ms));
  committed_ = ckpt_.Committed().id;
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
  std::vector<uint64_t> mine = ckpt_.Written();
  // What this worker holds, and the newest of it that it knows every writer had written.
  store_->Set("checkpoint-held-" + std::to_string(rank_),
              JoinIntList(mine) + "/" + std::to_string(ckpt_.Committed().id));
  std::vector<std::string> held = GatherAll("checkpoint-held-", "--resume");
  std::set<uint64_t> common(mine.begin(), mine.end());
  std::string each;
  uint64_t complete = 0;  // the newest checkpoint some worker holds and knows complete
  int source = -1;
  std::vector<std::vector<uint64_t>> ids(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    const std::string& v = held[size_t(r)];
    const std::string what = "--resume: worker " + std::to_string(r) + "'s list";
    const size_t slash = v.rfind('/');
    SHOAL_CHECK(slash != std::string::npos, what + ": '" + v + "' has no committed id");
    ids[size_t(r)] = ParseIntList<uint64_t>(v.substr(0, slash), what);
    const std::vector<uint64_t> committed = ParseIntList<uint64_t>(v.substr(slash + 1), what);
    SHOAL_CHECK(committed.size() == 1, what + ": '" + v + "' has no committed id");
    std::set<uint64_t> theirs(ids[size_t(r)].begin(), ids[size_t(r)].end()), both;
    std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(),
                          std::inserter(both, both.begin()));
    common = std::move(both);
    for (uint64_t id : ids[size_t(r)])
      if (id <= committed[0] && id > complete) {
        complete = id;
        source = r;
      }
    each += (each.empty() ? "" : "; ") + std::string("worker ") + std::to_string(r) + ": " + IdList(ids[size_t(r)]);
  }
  CheckpointState st;  // the newest all hold, read once: returned here, or reused by Reshape
  if (!common.empty()) {
    st = ckpt_.Read(*common.rbegin());
    // Every rank reads the same record, so every rank takes the same branch.
    if (st.record.shards == uint32_t(world_)) {
      ckpt_.Commit(st.record);
      committed_ = st.record.id;
      id_offset_ = int64_t(st.record.id) - st.record.step;
      return st;
    }
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
  for (int r = 0; r < world_; ++r)
    holds[size_t(r)] = std::count(ids[size_t(r)].begin(), ids[size_t(r)].end(), complete) > 0;
  return Reshape(complete, source, holds, peers, averaged, std::move(st));
}

namespace {

std::string EncodeState(const CheckpointState& st) {
  ByteWriter w;
  w.Put<uint64_t>(st.record.id).Put<int64_t>(st.record.step).Put<int64_t>(st.record.epoch);
  w.Put<int64_t>(st.record.batch).Put<uint32_t>(st.record.shards).Put<uint64_t>(st.entries.size());
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
  const uint64_t n = r.Get<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) {
    std::string key(r.Blob());
    st.entries[key] = std::string(r.Blob());
  }
  r.ExpectDone();
  return st;
}

bool StartsWithAny(const std::string& key, const std::vector<std::string>& prefixes) {
  for (const std::string& p : prefixes)
    if (key.compare(0, p.size(), p) == 0) return true;
  return false;
}

}  // namespace

CheckpointState WorkerCheckpoints::Reshape(uint64_t id, int source, const std::vector<char>& holds, Communicator* peers,
                                           const std::vector<std::string>& averaged, CheckpointState read) {
  const bool mine = holds[size_t(rank_)] != 0;
  CheckpointState own;
  if (mine) own = read.record.id == id ? std::move(read) : ckpt_.Read(id);
  std::string bytes = rank_ == source ? EncodeState(own) : std::string();
  uint64_t size = bytes.size();
  peers->Broadcast(&size, sizeof size, source);
  bytes.resize(size_t(size));
  peers->Broadcast(bytes.data(), int64_t(size), source);
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
  id_offset_ = int64_t(st.record.id) - st.record.step;
  return st;
}

void WorkerCheckpoints::Save(CheckpointState state) {
  const uint64_t id = state.record.id;
  state.record.shards = uint32_t(world_);
  ckpt_.WriteState(state, committed_);
  // One key per rank, overwritten with its newest written id: the store holds `world` keys
  // however long the job runs (a key per checkpoint would fill the coordinator's store,
  // RendezvousService::kMaxKeys, on long jobs). Ranks write the same ids in order, so
  // "every worker wrote it" is every key at id or beyond. No '/' in keys: a FileStore's
  // keys are files.
  store_->Set("checkpoint-written-" + std::to_string(rank_), std::to_string(id));
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    const std::string key = "checkpoint-written-" + std::to_string(r);
    int sleep_ms = 1;
    while (true) {
      const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      SHOAL_CHECK(left > 0, "checkpoint " + std::to_string(id) + ": worker " + std::to_string(r) +
                                " did not write it within " + std::to_string(timeout_ms_ / 1000) + " s");
      std::vector<uint64_t> got =
          ParseIntList<uint64_t>(store_->Get(key, int(left)), "checkpoint: worker " + std::to_string(r) + "'s id");
      if (got.size() == 1 && got[0] >= id) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      sleep_ms = std::min(sleep_ms * 2, 20);
    }
  }
  ckpt_.Commit(state.record);
  committed_ = id;
}

}  // namespace shoal
