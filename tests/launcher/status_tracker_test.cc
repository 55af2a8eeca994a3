// StatusTracker from synthetic metrics lines: stragglers named and cleared on the numbers
// alone, one progress line per evaluated step, status.json's rows.
#include "tools/launcher/status_tracker.h"

#include <gtest/gtest.h>

#include "common/config.h"
#include "common/json_fields.h"
#include "common/metrics.h"

namespace shoal {
namespace {

JobConfig Job(int workers) {
  return ParseJobConfig("[job]\nname = \"t\"\n[cluster]\nworkers = " + std::to_string(workers) +
                            "\n[data]\nformat = \"synthetic\"\nbatch_size = 16\n[algorithm]\nname = \"allreduce\"\n",
                        "job.toml");
}

// Rank `rank`'s train event at `step`, having spent `own_ms` per step outside the exchange
// and `comm_ms` in it since step 0 (cumulative counters, as the trainer writes them).
std::string Train(int rank, int64_t step, double own_ms, double comm_ms) {
  double own = own_ms * 1e-3 * double(step), comm = comm_ms * 1e-3 * double(step);
  JsonObject f;
  f.Add("event", "train").Add("step", step).Add("wall_s", own + comm).Add("rank", rank).Add("epoch", 0);
  f.Add("loss", 1.0).Add("samples_per_s", 100.0).Add("compute_s", 0.9 * own).Add("wait_s", 0.1 * own);
  f.Add("comm_s", comm).Add("bytes_sent", step * 1000);
  return f.str();
}

std::string Eval(int rank, int64_t step, double acc) {
  return JsonObject()
      .Add("event", "eval")
      .Add("step", step)
      .Add("wall_s", 1.0)
      .Add("rank", rank)
      .Add("epoch", 1)
      .Add("test_accuracy", acc)
      .str();
}

TEST(StatusTracker, NamesTheSlowWorkerOnlyAndClearsItWhenItCatchesUp) {
  StatusTracker t(Job(3));
  // A synchronous job: everyone's step takes 40 ms; rank 1 computes 40 ms, the others 10 ms
  // and wait 30 ms in the exchange. Windows span two events (0.4 s each, under 0.5 s), and
  // nobody is judged before every worker has one.
  for (int64_t step = 10; step <= 70; step += 10) {
    t.Consume(Train(0, step, 10, 30));
    t.Consume(Train(1, step, 40, 0.5));
    t.Consume(Train(2, step, 10, 30));
  }
  auto changes = t.TakeStragglerChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rank, 1);
  EXPECT_TRUE(changes[0].straggler);
  EXPECT_NEAR(changes[0].slower, 4.0, 0.01);
  EXPECT_EQ(changes[0].since_step, 10);  // the first judged slow window began there
  // Judged when rank 2's window closed, after rank 1's own base had moved on: the wall time is
  // still its window's start (step 10 at 40 ms a step).
  EXPECT_NEAR(changes[0].since_wall_s, 0.405, 1e-9);
  EXPECT_EQ(changes[0].host, "127.0.0.1");
  std::string json = t.Json(5, "running", 0);
  EXPECT_NE(json.find("\"rank\":1,\"host\":\"127.0.0.1\",\"device\":\"cpu\",\"batch_size\":16"), std::string::npos);
  EXPECT_NE(json.find("\"straggler\":true,\"straggler_since_step\":10"), std::string::npos) << json;

  // Rank 1 catches up (cumulative counters: from now on everyone needs 100 ms per step).
  double own1 = 40e-3 * 70, comm1 = 0.5e-3 * 70, own = 10e-3 * 70, comm = 30e-3 * 70;
  for (int64_t step = 80; step <= 140; step += 10) {
    own1 += 1.0, own += 1.0, comm += 0.05, comm1 += 0.05;
    for (int r : {0, 1, 2}) {
      double o = r == 1 ? own1 : own, c = r == 1 ? comm1 : comm;
      t.Consume(JsonObject()
                    .Add("event", "train")
                    .Add("step", step)
                    .Add("wall_s", o + c)
                    .Add("rank", r)
                    .Add("compute_s", o)
                    .Add("wait_s", 0.0)
                    .Add("comm_s", c)
                    .str());
    }
  }
  changes = t.TakeStragglerChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rank, 1);
  EXPECT_FALSE(changes[0].straggler);
  EXPECT_NE(t.Json(9, "running", 0).find("\"straggler\":false"), std::string::npos);
}

TEST(StatusTracker, AMachineWideSlowdownNamesNoOneInASynchronousJob) {
  // Two workers in step (rank 0 computes 6x longer); the machine slows down 2x, 4x, 8x over
  // steps 40 to 70. Rank 1 reports each window first, so judged against rank 0's previous
  // window alone it looked 1.5x slower twice in a row and was named (a loaded CI machine did).
  StatusTracker t(Job(2));
  double wall = 0, own0 = 0, own1 = 0;
  for (int64_t step = 1; step <= 200; ++step) {
    const double k = step > 40 && step <= 70 ? double(1 << ((step - 31) / 10)) : 1.0;
    wall += 0.070 * k, own0 += 0.060 * k, own1 += 0.010 * k;
    if (step % 10) continue;
    for (int r : {1, 0}) {
      JsonObject f;
      f.Add("event", "train").Add("step", step).Add("wall_s", wall).Add("rank", r).Add("epoch", 0);
      f.Add("compute_s", r == 0 ? own0 : own1).Add("wait_s", 0.0).Add("comm_s", wall - (r == 0 ? own0 : own1));
      t.Consume(f.str());
    }
  }
  auto changes = t.TakeStragglerChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rank, 0);
  EXPECT_TRUE(changes[0].straggler);
}

TEST(StatusTracker, OneWorkerOrEqualWorkersHaveNoStraggler) {
  StatusTracker one(Job(1));
  for (int64_t step = 10; step <= 400; step += 10) one.Consume(Train(0, step, 50, 0));
  EXPECT_TRUE(one.TakeStragglerChanges().empty());
  StatusTracker two(Job(2));
  for (int64_t step = 10; step <= 400; step += 10) {
    two.Consume(Train(0, step, 10, 5));
    two.Consume(Train(1, step, 12, 3));
  }
  EXPECT_TRUE(two.TakeStragglerChanges().empty());
}

TEST(StatusTracker, OneProgressLinePerEvaluatedStep) {
  StatusTracker t(Job(3));
  t.Consume(Eval(1, 100, 0.81));
  t.Consume(Eval(0, 100, 0.82));
  EXPECT_FALSE(t.TakeEvalLine(1.0).has_value());  // rank 2 has not evaluated step 100 yet
  t.Consume(Eval(2, 100, 0.80));
  auto line = t.TakeEvalLine(1.0);
  ASSERT_TRUE(line.has_value());
  EXPECT_NE(line->find("epoch 1 step 100 "), std::string::npos) << *line;
  EXPECT_NE(line->find("test_acc 0.8200 (workers 0.8000-0.8200)"), std::string::npos) << *line;
  EXPECT_FALSE(t.TakeEvalLine(1.0).has_value());
  // A late duplicate of a printed step prints nothing; a worker that died is not awaited.
  t.Consume(Eval(2, 100, 0.80));
  EXPECT_FALSE(t.TakeEvalLine(2.0).has_value());
  t.WorkerGone(2, /*failed=*/true);
  t.Consume(Eval(0, 200, 0.85));
  t.Consume(Eval(1, 200, 0.85));
  line = t.TakeEvalLine(3.0);
  ASSERT_TRUE(line.has_value());
  EXPECT_NE(line->find("step 200 loss - test_acc 0.8500 samples/s"), std::string::npos) << *line;
  // A worker that never reports does not hold the line back for ever.
  t.Consume(Eval(0, 300, 0.86));
  EXPECT_FALSE(t.TakeEvalLine(4.0).has_value());
  EXPECT_TRUE(t.TakeEvalLine(20.0).has_value());
  EXPECT_EQ(t.accuracy_curve().size(), 3u);
}

TEST(StatusTracker, LogLinesBetweenEvaluationsNeverShowAnEvaluatedStep) {
  StatusTracker t(Job(2));
  for (int r : {0, 1}) t.Consume(Train(r, 16, 10, 1));
  EXPECT_EQ(t.SettledStep(), -1);  // nobody went past a step yet
  for (int r : {0, 1}) t.Consume(Train(r, 20, 10, 1));
  EXPECT_EQ(t.SettledStep(), 16);
  // Step 20 ends an epoch: its evaluation follows its train event, so 20 is no log line's.
  t.Consume(Eval(0, 20, 0.5));
  t.Consume(Train(0, 24, 10, 1));
  EXPECT_EQ(t.SettledStep(), 16);  // rank 0 evaluated at 20; rank 1 has not gone past it
  t.Consume(Eval(1, 20, 0.5));
  ASSERT_TRUE(t.TakeEvalLine(1.0).has_value());
  t.Consume(Train(0, 28, 10, 1));
  EXPECT_EQ(t.SettledStep(), 24);
  EXPECT_NE(t.ProgressLine(3.0, 24).find(" step 24 "), std::string::npos);
}

TEST(StatusTracker, StrayLinesAreIgnored) {
  StatusTracker t(Job(2));
  for (const char* l : {"", "{", "not json", "{\"event\":\"train\",\"rank\":99,\"step\":5}",
                        "{\"event\":\"train\",\"rank\":-1}", "{\"event\":\"auto\",\"choice\":\"bmuf\""})
    t.Consume(l);
  std::string json = t.Json(0, "running", 0);
  EXPECT_NE(json.find("\"auto\":null"), std::string::npos);
  EXPECT_EQ(JsonField(json, "step").value_or(""), "0");
}

// [data] skip_bad: each worker's data_skipped reaches its status.json row.
TEST(StatusTracker, DataSkippedPerWorker) {
  StatusTracker t(Job(2));
  std::string line = Train(1, 10, 10, 1);
  t.Consume(line.substr(0, line.size() - 1) + ",\"data_skipped\":3}");
  t.Consume(Train(0, 10, 10, 1));
  const std::string json = t.Json(0, "running", 0);
  EXPECT_NE(json.find("\"rank\":1,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"data_skipped\":3"), std::string::npos) << json;
  EXPECT_NE(json.find("\"data_skipped\":0"), std::string::npos) << json;
}

// The loss curve is rank 0's while it runs; while it is gone (lost in an elastic job) the
// next lowest running worker's, and rank 0's again once it is back.
TEST(StatusTracker, TheLossCurveFollowsTheLowestRunningWorker) {
  StatusTracker t(Job(3));
  auto train = [](int rank, int64_t step, double wall, double loss) {
    return JsonObject()
        .Add("event", "train")
        .Add("step", step)
        .Add("wall_s", wall)
        .Add("rank", rank)
        .Add("epoch", 0)
        .Add("loss", loss)
        .str();
  };
  t.Consume(train(0, 10, 1.0, 2.0));
  t.Consume(train(1, 10, 1.1, 2.1));
  t.Consume(train(2, 10, 1.2, 2.2));
  t.WorkerGone(0, /*failed=*/true);
  t.Consume(train(1, 20, 2.1, 1.1));
  t.Consume(train(2, 20, 2.2, 1.2));
  t.WorkerRestarted(0);
  t.Consume(train(0, 30, 3.0, 0.5));
  t.Consume(train(1, 30, 3.1, 0.6));
  const std::vector<std::pair<double, double>> want = {{1.0, 2.0}, {2.1, 1.1}, {3.0, 0.5}};
  EXPECT_EQ(t.loss_curve(), want);
}

}  // namespace
}  // namespace shoal
