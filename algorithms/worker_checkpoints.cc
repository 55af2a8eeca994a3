#include "algorithms/worker_checkpoints.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

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

CheckpointState WorkerCheckpoints::Resume() {
  std::vector<uint64_t> mine = ckpt_.Written();
  store_->Set("checkpoint-held-" + std::to_string(rank_), JoinIntList(mine));
  std::vector<std::string> held = GatherAll("checkpoint-held-", "--resume");
  std::set<uint64_t> common(mine.begin(), mine.end());
  std::string each;
  for (int r = 0; r < world_; ++r) {
    std::vector<uint64_t> ids =
        ParseIntList<uint64_t>(held[size_t(r)], "--resume: worker " + std::to_string(r) + "'s list");
    std::set<uint64_t> theirs(ids.begin(), ids.end()), both;
    std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(),
                          std::inserter(both, both.begin()));
    common = std::move(both);
    each += (each.empty() ? "" : "; ") + std::string("worker ") + std::to_string(r) + ": " + IdList(ids);
  }
  SHOAL_CHECK(!common.empty(), "--resume: no checkpoint that every worker holds (" + each + ")");
  CheckpointState st = ckpt_.Read(*common.rbegin());
  SHOAL_CHECK(st.record.shards == uint32_t(world_), "--resume: checkpoint " + std::to_string(st.record.id) +
                                                        " was written by " + std::to_string(st.record.shards) +
                                                        " workers, the job has " + std::to_string(world_));
  ckpt_.Commit(st.record);
  committed_ = st.record.id;
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
