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

#include "common/checkpoint/checkpoint_store.h"
#include "common/error.h"
#include "common/rendezvous/rendezvous.h"
#include "common/rendezvous/store.h"
#include "tests/algorithms/fake_communicator.h"

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
    for (auto& e : std::filesystem::directory_iterator(store.dir()))
      keys += e.path().filename().string().rfind("checkpoint", 0) == 0;
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
    got[r] = wc.Resume(nullptr, {});
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
  for (const char* bad : {"4,,6/0", "4,x/0", "4,-6/0", "18446744073709551616/0", "4,6", "4/x"}) {
    store.Set("checkpoint-held-1", bad);
    WorkerCheckpoints wc(cfg, 0, 2, &store, CheckpointStart::kFresh);
    try {
      wc.Resume(nullptr, {});
      ADD_FAILURE() << "worker 1's list \"" << bad << "\" was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--resume: worker 1's list"), std::string::npos) << e.what();
    }
  }
}

// Runs fn(rank) on n threads and returns once all are done; an error fails the test.
template <typename Fn>
void OnRanks(int n, Fn fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  for (auto& t : ts) t.join();
}

// A 2-worker run in `tmp` that saved checkpoints `first`, first + 2, ..., `last`, worker r's
// weights id / 10 + r; returns its job config.
JobConfig TwoWorkerRun(const std::string& tmp, uint64_t first, uint64_t last) {
  JobConfig cfg;
  cfg.checkpoint_dir = tmp + "/ckpt";
  FileStore store(tmp + "/run1");
  OnRanks(2, [&](int r) {
    WorkerCheckpoints wc(cfg, r, 2, &store, CheckpointStart::kNew);
    for (uint64_t id = first; id <= last; id += 2) wc.Save(State(id, float(id) / 10.f + float(r)));
  });
  return cfg;
}

// Two workers wrote checkpoints 2..20, each its own weights (w + rank). Resumed by `world`
// workers: every rank gets checkpoint 20 of the 2-worker run, the weights of worker 0 or,
// averaged, the mean of the writers present (both, or worker 0 alone); later ids go on from 20.
void ResumeOnAnotherWorld(int world, bool average) {
  const std::string tmp = FreshDir();
  const JobConfig cfg = TwoWorkerRun(tmp, 2, 20);
  FileStore store(tmp + "/run2");
  FakeCluster cluster(world);
  std::vector<CheckpointState> got(static_cast<size_t>(world));
  std::vector<uint64_t> next(static_cast<size_t>(world));
  OnRanks(world, [&](int r) {
    std::unique_ptr<Communicator> comm = cluster.Join("resume", r);
    WorkerCheckpoints wc(cfg, r, world, &store, CheckpointStart::kResume);
    std::vector<std::string> averaged;
    if (average) averaged.push_back("w/");
    got[size_t(r)] = wc.Resume(comm.get(), averaged);
    wc.ContinueFrom(got[size_t(r)].record.id, 7);  // the trainer's step in the new world
    next[size_t(r)] = wc.IdAt(8);
  });
  // The mean over the workers that hold it and are in this job, or worker 0's.
  const float w0 = average && world > 1 ? 2.5f : 2.f;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(got[size_t(r)].record.id, 20u) << r;
    EXPECT_EQ(got[size_t(r)].record.shards, 2u) << "rank " << r << ": the writers' count tells the world changed";
    EXPECT_EQ(got[size_t(r)].GetFloatVector("w/x", 2), (std::vector<float>{w0, w0 + 1})) << r;
    EXPECT_EQ(next[size_t(r)], 21u) << r;
  }
}

TEST(WorkerCheckpoints, ResumedOnMoreWorkersEveryRankGetsTheCompleteCheckpoint) { ResumeOnAnotherWorld(3, false); }
TEST(WorkerCheckpoints, ResumedOnFewerWorkersAveragedEntriesAreTheHoldersMean) { ResumeOnAnotherWorld(1, true); }
TEST(WorkerCheckpoints, ResumedOnMoreWorkersAveragedEntriesAreTheHoldersMean) { ResumeOnAnotherWorld(3, true); }

// What cannot resume is an input error (exit 2, never restarted), said once with what each
// worker holds: no checkpoint anywhere, or another world and no way to share it.
TEST(WorkerCheckpoints, AnotherWorldWithoutPeersOrWithoutACheckpointIsAnInputError) {
  const std::string tmp = FreshDir();
  JobConfig cfg = TwoWorkerRun(tmp, 4, 4);
  FileStore store(tmp + "/run2");
  std::vector<std::string> errors(3);
  OnRanks(3, [&](int r) {
    WorkerCheckpoints wc(cfg, r, 3, &store, CheckpointStart::kResume);
    try {
      wc.Resume(nullptr, {});
    } catch (const InputError& e) {
      errors[size_t(r)] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[size_t(r)].find("checkpoint 4 was written by another set of workers"), std::string::npos)
        << errors[size_t(r)];
    EXPECT_NE(errors[size_t(r)].find("worker 2: none"), std::string::npos) << errors[size_t(r)];
  }
  FileStore empty_store(tmp + "/run3");
  cfg.checkpoint_dir = tmp + "/nothing";
  std::vector<std::string> none(2);
  OnRanks(2, [&](int r) {
    WorkerCheckpoints wc(cfg, r, 2, &empty_store, CheckpointStart::kResume);
    try {
      wc.Resume(nullptr, {});
    } catch (const InputError& e) {
      none[size_t(r)] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(none[size_t(r)].find("no complete checkpoint"), std::string::npos) << none[size_t(r)];
}

// Elastic (diloco elastic = true): checkpoint `id` saved by `ranks` of 3, worker r's weights
// id / 10 + r, with `absent` recorded; returns whether each committed it.
std::vector<bool> ElasticSave(const JobConfig& cfg, Store* store, const std::vector<int>& ranks, uint64_t id,
                              const std::vector<uint32_t>& absent) {
  std::vector<bool> committed(ranks.size());
  OnRanks(int(ranks.size()), [&](int i) {
    WorkerCheckpoints wc(cfg, ranks[size_t(i)], 3, store, CheckpointStart::kResume, /*elastic=*/true);
    CheckpointState st = State(id, float(id) / 10.f + float(ranks[size_t(i)]));
    st.record.absent = absent;
    committed[size_t(i)] = wc.Save(std::move(st));
  });
  return committed;
}

// The members of the round write a checkpoint and it commits without the worker recorded
// absent; a writer lost first (listed dead, or restarted alone: its key says so) leaves it
// uncommitted at once instead of waiting out the bound.
TEST(WorkerCheckpoints, ElasticCommitsAmongTheRoundsMembers) {
  const std::string tmp = FreshDir();
  JobConfig cfg;
  cfg.checkpoint_dir = tmp + "/ckpt";
  FileStore store(tmp + "/run1");
  EXPECT_EQ(ElasticSave(cfg, &store, {0, 1, 2}, 10, {}), (std::vector<bool>{true, true, true}));
  EXPECT_EQ(ElasticSave(cfg, &store, {0, 1}, 20, {2}), (std::vector<bool>{true, true}));
  store.Set(kDeadRanksKey, "2");  // the coordinator's heartbeats found worker 2 dead
  EXPECT_EQ(ElasticSave(cfg, &store, {0, 1}, 30, {}), (std::vector<bool>{false, false}));
  store.Set(kDeadRanksKey, "");
  // Worker 2 restarted alone (before its death was noticed): it will write nothing before 30.
  {
    WorkerCheckpoints rejoined(cfg, 2, 3, &store, CheckpointStart::kResume, true, /*rejoined=*/true);
    EXPECT_EQ(ElasticSave(cfg, &store, {0, 1}, 40, {}), (std::vector<bool>{false, false}));
    rejoined.Joined(45);  // it took the global state at an outer round at step 45
  }
  EXPECT_EQ(ElasticSave(cfg, &store, {0, 1, 2}, 50, {}), (std::vector<bool>{true, true, true}));
  // Each store keeps its own committed one: 50 now, 20 and 10 are older and may go; 30 and 40
  // were never complete.
  for (int r = 0; r < 3; ++r) {
    std::optional<HeldCheckpoints> h = CheckpointStore::Peek(cfg.checkpoint_dir + "/worker-" + std::to_string(r));
    ASSERT_TRUE(h.has_value()) << r;
    EXPECT_EQ(h->committed.id, 50u) << r;
  }
}

// --resume takes the newest checkpoint every worker holds or is recorded absent from: the
// holders load their own, the absent worker a holder's copy (record.absent names it); a
// newer one with a gap nobody recorded (a writer lost first) is not complete.
TEST(WorkerCheckpoints, ElasticResumeHandsTheAbsentWorkerAHoldersCopy) {
  const std::string tmp = FreshDir();
  JobConfig cfg;
  cfg.checkpoint_dir = tmp + "/ckpt";
  {
    FileStore store(tmp + "/run1");
    ElasticSave(cfg, &store, {0, 1, 2}, 10, {});
    ElasticSave(cfg, &store, {0, 1}, 20, {2});
    store.Set(kDeadRanksKey, "2");
    ElasticSave(cfg, &store, {0, 1}, 30, {});
  }
  // The launcher's rule (shoal checkpoints, restarts) over the stores themselves.
  std::vector<std::vector<CheckpointRecord>> held;
  for (int r = 0; r < 3; ++r)
    held.push_back(CheckpointStore::Peek(cfg.checkpoint_dir + "/worker-" + std::to_string(r))->written);
  EXPECT_EQ(NewestCompleteOfWorkers(held).id, 20u);
  EXPECT_EQ(NewestCompleteOfWorkers(held).absent, (std::vector<uint32_t>{2}));
  // Workers 0 and 1 dropped 10 once they committed 20: without 20 on worker 1 none is complete.
  EXPECT_EQ(held[0].back().id, 20u);
  held[1].erase(held[1].begin() + 1);
  EXPECT_EQ(held[1].back().id, 30u);
  EXPECT_EQ(NewestCompleteOfWorkers(held).id, 0u);

  FileStore store(tmp + "/run2");
  FakeCluster cluster(3);
  std::vector<CheckpointState> got(3);
  std::vector<std::string> from(3);
  std::vector<uint64_t> next(3);
  OnRanks(3, [&](int r) {
    std::unique_ptr<Communicator> comm = cluster.Join("resume", r);
    WorkerCheckpoints wc(cfg, r, 3, &store, CheckpointStart::kResume, /*elastic=*/true);
    got[size_t(r)] = wc.Resume(comm.get(), {});
    from[size_t(r)] = wc.resumed_from();
    next[size_t(r)] = wc.IdAt(got[size_t(r)].record.step + 10);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got[size_t(r)].record.id, 20u) << r;
    EXPECT_EQ(got[size_t(r)].record.shards, 3u) << r;
    EXPECT_EQ(got[size_t(r)].record.absent, (std::vector<uint32_t>{2})) << r;
    EXPECT_EQ(next[size_t(r)], 30u) << r;
  }
  EXPECT_EQ(got[0].GetFloatVector("w/x", 2), (std::vector<float>{2.f, 3.f}));
  EXPECT_EQ(got[1].GetFloatVector("w/x", 2), (std::vector<float>{3.f, 4.f}));
  EXPECT_EQ(got[2].GetFloatVector("w/x", 2), (std::vector<float>{2.f, 3.f})) << "worker 0's copy";
  EXPECT_EQ(from[0], "its own checkpoint 20");
  EXPECT_NE(from[2].find("worker 0's copy of checkpoint 20"), std::string::npos) << from[2];
  // Without a communicator to hand it over the absent worker cannot resume: an input error.
  FileStore store3(tmp + "/run3");
  std::vector<std::string> errors(3);
  OnRanks(3, [&](int r) {
    WorkerCheckpoints wc(cfg, r, 3, &store3, CheckpointStart::kResume, true);
    try {
      wc.Resume(nullptr, {});
    } catch (const InputError& e) {
      errors[size_t(r)] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(errors[size_t(r)].find("worker(s) 2 wrote no part of checkpoint 20"), std::string::npos)
        << errors[size_t(r)];
}

}  // namespace
}  // namespace shoal
