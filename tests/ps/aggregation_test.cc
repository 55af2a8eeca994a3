// The shard's optimizer follows the plan the workers send at registration: nothing is
// applied before it, ps_sync applies the mean once every worker pushed, ps_async scales
// each push by 1/workers, and the LR schedule uses the plan's steps per epoch.
#include <gtest/gtest.h>

#include "common/config.h"
#include "common/error.h"
#include "server/aggregation.h"
#include "server/kv_shard.h"

namespace shoal {
namespace {

Frame Floats(const std::vector<float>& v) { return Frame(v.data(), v.size() * 4); }
std::vector<float> Values(const KvShard& kv, const std::string& name) {
  const float* p = reinterpret_cast<const float*>(kv.Find(name)->buf->data());
  return std::vector<float>(p, p + kv.Find(name)->elements());
}

// SGD at lr 0.4 with one warm-up epoch: at step 0 the LR is 0.4 / steps_per_epoch.
JobConfig Job() {
  return ParseJobConfig(
      "[job]\nname = \"t\"\n[cluster]\nservers = [\"127.0.0.1:1\"]\nworkers = 2\n[model]\nname = \"mlp\"\n"
      "[data]\nformat = \"synthetic\"\nbatch_size = 8\n[algorithm]\nname = \"ps_sync\"\n"
      "[optimizer]\nname = \"sgd\"\nlr = 0.4\nweight_decay = 0\nwarmup_epochs = 1\n[train]\nepochs = 2\n",
      "job.toml");
}

TrainingPlan Plan(msg::ServerRule rule) {
  TrainingPlan p;
  p.steps_per_epoch = 4;
  p.total_steps = 8;
  p.rule = rule;
  p.workers = 2;
  p.global_batch = 16;
  return p;
}

TEST(ServerRule, NothingIsAppliedBeforeAWorkerSentItsPlan) {
  KvShard kv;
  kv.SetUpdateRule(MakeServerUpdateRule(Job()));
  kv.Push("w", DType::kF32, {2}, Floats({1, 1}), msg::PushOp::ASSIGN);
  try {
    kv.Push("w", DType::kF32, {2}, Floats({1, 1}), msg::PushOp::APPLY);
    FAIL() << "an apply without a plan was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training plan"), std::string::npos) << e.what();
  }
  EXPECT_EQ(Values(kv, "w"), (std::vector<float>{1, 1}));
}

TEST(ServerRule, MeanOfWorkersAppliesTheMeanOnceWithThePlansWarmup) {
  KvShard kv;
  kv.SetUpdateRule(MakeServerUpdateRule(Job()));
  kv.SetPlan(Plan(msg::ServerRule::MEAN_OF_WORKERS));
  kv.Push("w", DType::kF32, {2}, Floats({1, 1}), msg::PushOp::ASSIGN);
  kv.Push("w", DType::kF32, {2}, Floats({1, 2}), msg::PushOp::APPLY);
  EXPECT_EQ(Values(kv, "w"), (std::vector<float>{1, 1}));  // waits for the second worker
  kv.Push("w", DType::kF32, {2}, Floats({3, 4}), msg::PushOp::APPLY);
  // lr(0) = 0.4 * 1/4 (warm-up over the plan's 4 steps per epoch); mean gradient (2, 3).
  std::vector<float> w = Values(kv, "w");
  EXPECT_NEAR(w[0], 1 - 0.1 * 2, 1e-6);
  EXPECT_NEAR(w[1], 1 - 0.1 * 3, 1e-6);
}

TEST(ServerRule, ApplyEachScalesEveryPushByOneOverTheWorkers) {
  KvShard kv;
  kv.SetUpdateRule(MakeServerUpdateRule(Job()));
  kv.SetPlan(Plan(msg::ServerRule::APPLY_EACH));
  kv.Push("w", DType::kF32, {2}, Floats({1, 1}), msg::PushOp::ASSIGN);
  kv.Push("w", DType::kF32, {2}, Floats({1, -1}), msg::PushOp::APPLY);
  std::vector<float> w = Values(kv, "w");
  EXPECT_NEAR(w[0], 1 - 0.1 / 2, 1e-6);
  EXPECT_NEAR(w[1], 1 + 0.1 / 2, 1e-6);
}

// A checkpoint of another number of workers: the shard's state counts the mapped steps, so
// the next update takes the schedule's learning rate there, as if the shard had done them.
TEST(ServerRule, RestepMovesTheScheduleToTheMappedStep) {
  for (auto rule : {msg::ServerRule::MEAN_OF_WORKERS, msg::ServerRule::APPLY_EACH}) {
    const int pushes_a_step = 2;  // the plan's workers: ps_sync sums both, async takes each as half a step
    KvShard restepped, walked;
    for (KvShard* kv : {&restepped, &walked}) {
      kv->SetUpdateRule(MakeServerUpdateRule(Job()));
      kv->SetPlan(Plan(rule));
      kv->Push("w", DType::kF32, {2}, Floats({1, 1}), msg::PushOp::ASSIGN);
    }
    // One step, then the checkpoint's mapped step 3; the other shard walks to step 3 with
    // zero gradients (no decay: the weights stay).
    for (int i = 0; i < pushes_a_step; ++i) restepped.Push("w", DType::kF32, {2}, Floats({0, 0}), msg::PushOp::APPLY);
    restepped.Restep(3);
    for (int i = 0; i < 3 * pushes_a_step; ++i) walked.Push("w", DType::kF32, {2}, Floats({0, 0}), msg::PushOp::APPLY);
    for (KvShard* kv : {&restepped, &walked})
      for (int i = 0; i < pushes_a_step; ++i) kv->Push("w", DType::kF32, {2}, Floats({1, 1}), msg::PushOp::APPLY);
    EXPECT_EQ(Values(restepped, "w"), Values(walked, "w")) << int(rule);
    EXPECT_NE(Values(restepped, "w"), (std::vector<float>{1, 1})) << int(rule);
  }
}

TEST(ServerRule, APlanTheJobCannotHaveIsRefused) {
  auto rule = MakeServerUpdateRule(Job());
  TrainingPlan p = Plan(msg::ServerRule::APPLY_EACH);
  p.workers = 5;  // the job lists 2
  EXPECT_THROW(rule->SetPlan(p), Error);
  p = Plan(msg::ServerRule::APPLY_EACH);
  p.steps_per_epoch = 0;
  EXPECT_THROW(rule->SetPlan(p), Error);
}

}  // namespace
}  // namespace shoal
