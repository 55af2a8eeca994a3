// WorkerCheckpoints over a real FileStore (the rendezvous_dir store) and real RocksDB
// stores, two ranks on threads: a checkpoint counts once both wrote it, and --resume loads
// the newest one both hold.
#include "algorithms/worker_checkpoints.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/rendezvous/store.h"

namespace shoal {
namespace {

// A fresh directory under bazel's per-test TEST_TMPDIR (removed with it).
std::string FreshDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/worker_ckpt_XXXXXX";
  if (!mkdtemp(&tmpl[0])) ADD_FAILURE() << "mkdtemp " << tmpl << " failed";
  return tmpl;
}

CheckpointState State(uint64_t id, float w) {
  CheckpointState st;
  st.record.id = id;
  st.record.step = int64_t(id);
  st.PutFloats("w/x", std::vector<float>{w, w + 1});
  return st;
}

// Runs fn(rank) on two threads, one per rank, and returns once both are done; an error on
// either fails the test with its message.
template <typename Fn>
void OnBothRanks(Fn fn) {
  auto guarded = [&](int r) {
    try {
      fn(r);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  };
  std::thread t([&] { guarded(1); });
  guarded(0);
  t.join();
}

TEST(WorkerCheckpoints, CommitOnceEveryRankWroteAndResumeTheNewestAllHold) {
  const std::string tmp = FreshDir();
  JobConfig cfg;
  cfg.checkpoint_dir = tmp + "/ckpt";
  {
    FileStore store(tmp + "/run1");  // rendezvous_dir's store: keys are files
    uint64_t committed[2] = {0, 0};
    OnBothRanks([&](int r) {
      WorkerCheckpoints wc(cfg, r, 2, &store, CheckpointStart::kNew);
      for (uint64_t id = 2; id <= 20; id += 2) wc.Save(State(id, float(id) / 10.f));
      committed[r] = wc.committed();
    });
    EXPECT_EQ(committed[0], 20u);
    EXPECT_EQ(committed[1], 20u);
    // Ten checkpoints leave one key per rank in the store, not one per checkpoint: a long
    // job must not fill the coordinator's capped store.
    int keys = 0;
    for (auto& e : std::filesystem::directory_iterator(store.dir())) keys += e.path().filename().string().rfind("checkpoint", 0) == 0;
    EXPECT_EQ(keys, 2);
  }
  // Rank 0 alone wrote checkpoint 30 (its peer died first): not complete, so not resumed.
  {
    CheckpointStore only0(cfg.checkpoint_dir + "/worker-0", "worker 0", CheckpointStart::kResume);
    CheckpointState st = State(30, 3.f);
    st.record.shards = 2;
    only0.WriteState(st, 20);
  }
  FileStore store(tmp + "/run2");  // a new attempt, a new store
  CheckpointState got[2];
  OnBothRanks([&](int r) {
    WorkerCheckpoints wc(cfg, r, 2, &store, CheckpointStart::kResume);
    got[r] = wc.Resume();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].record.id, 20u) << r;
    EXPECT_EQ(got[r].entries.at("w/x"), State(20, 2.f).entries.at("w/x")) << r;
  }
}

// A peer's list in the store is read strictly: a damaged one is an error naming the peer,
// not a checkpoint id made of junk.
TEST(WorkerCheckpoints, ADamagedPeerListIsRefusedNamingThePeer) {
  const std::string tmp = FreshDir();
  JobConfig cfg;
  cfg.checkpoint_dir = tmp + "/ckpt";
  FileStore store(tmp + "/run");
  for (const char* bad : {"4,,6", "4,x", "4,-6", "18446744073709551616"}) {
    store.Set("checkpoint-held-1", bad);
    WorkerCheckpoints wc(cfg, 0, 2, &store, CheckpointStart::kFresh);
    try {
      wc.Resume();
      ADD_FAILURE() << "worker 1's list \"" << bad << "\" was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--resume: worker 1's list: item "), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace shoal
