// Batch-size control's step <-> epoch map (common/batch_schedule.h) and the learning rate it
// drives (LrSchedule): every figure against the formulas written out here.
#include <gtest/gtest.h>

#include <cmath>

#include "algorithms/optimizers/optimizer.h"
#include "common/batch_schedule.h"
#include "common/error.h"

namespace shoal {
namespace {

// 1000 samples: 250 at batch 4 (epochs 0-1), 125 at 8 (epoch 2), 62 at 16 (epochs 3-).
BatchSchedule Three() { return BatchSchedule({{0, 4}, {2, 8}, {3, 16}}, 1000); }

TEST(BatchSchedule, MapsStepsToEpochsAndBatches) {
  const BatchSchedule s = Three();
  EXPECT_FALSE(s.constant());
  EXPECT_EQ(s.StepsInEpoch(0), 250);
  EXPECT_EQ(s.StepsInEpoch(1), 250);
  EXPECT_EQ(s.StepsInEpoch(2), 125);
  EXPECT_EQ(s.StepsInEpoch(7), 62);  // 1000 / 16, the last 8 samples dropped
  EXPECT_EQ(s.FirstStepOfEpoch(0), 0);
  EXPECT_EQ(s.FirstStepOfEpoch(2), 500);
  EXPECT_EQ(s.FirstStepOfEpoch(3), 625);
  EXPECT_EQ(s.FirstStepOfEpoch(5), 625 + 2 * 62);
  // Every step of the first 6 epochs: its epoch, and its batch, by walking them.
  int64_t step = 0;
  for (int64_t e = 0; e < 6; ++e)
    for (int64_t b = 0; b < s.StepsInEpoch(e); ++b, ++step) {
      ASSERT_EQ(s.EpochOfStep(step), e) << "step " << step;
      ASSERT_EQ(s.FirstStepOfEpoch(e) + b, step);
      ASSERT_EQ(s.BatchAt(step), e < 2 ? 4 : e < 3 ? 8 : 16);
    }
  EXPECT_EQ(s.StepsOfEpochs(2.5), 500 + 63);  // half of epoch 2's 125 steps, rounded
  EXPECT_EQ(s.StepsOfEpochs(0), 0);
  const BatchSchedule c = BatchSchedule::Constant(64, 50);
  EXPECT_TRUE(c.constant());
  EXPECT_EQ(c.EpochOfStep(149), 2);
  EXPECT_EQ(c.FirstStepOfEpoch(3), 150);
  EXPECT_EQ(c.StepsOfEpochs(1.5), 75);
}

std::string ErrorOf(std::vector<BatchStage> stages, int64_t samples) {
  try {
    BatchSchedule(stages, samples, "job.toml: [train] batch_schedule");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BatchSchedule, RefusesStagesThatCannotRun) {
  EXPECT_NE(ErrorOf({}, 100).find("at least one"), std::string::npos);
  EXPECT_NE(ErrorOf({{1, 4}}, 100).find("must start at epoch 0"), std::string::npos);
  EXPECT_NE(ErrorOf({{0, 4}, {3, 8}, {3, 16}}, 100).find("stage 2 starts at epoch 3, not after"), std::string::npos);
  EXPECT_NE(ErrorOf({{0, 0}}, 100).find("global batch 0"), std::string::npos);
  const std::string big = ErrorOf({{0, 4}, {1, 128}}, 100);
  EXPECT_NE(big.find("job.toml: [train] batch_schedule: stage 1: a global batch of 128 is larger than the epoch's 100"),
            std::string::npos)
      << big;
}

// lr(step) = lr x batch(step) / base_batch_size x shape(step), shape the warm-up ramp and the
// poly decay over the whole run.
TEST(BatchSchedule, LearningRateScalesLinearlyWithEachStagesBatch) {
  const BatchSchedule s = Three();
  const int64_t total = s.FirstStepOfEpoch(6);  // 625 + 3 x 62 = 811
  ConfigSection o("job.toml", "optimizer");
  o.Set("lr", 0.1);
  o.Set("base_batch_size", int64_t(4));
  o.Set("warmup_epochs", 1.5);
  o.Set("schedule", std::string("poly"));
  const LrSchedule lr = LrSchedule::FromConfig(o, s, total);
  const int64_t warm = 250 + 125;  // 1.5 epochs of batch 4
  ASSERT_EQ(lr.options().warmup_steps, warm);
  for (int64_t step = 0; step < total; ++step) {
    const double batch = step < 500 ? 4 : step < 625 ? 8 : 16;
    const double peak = 0.1 * batch / 4;
    const double shape =
        step < warm ? double(step + 1) / double(warm) : std::pow(1 - double(step - warm) / double(total - warm), 2.0);
    ASSERT_NEAR(lr.At(step), peak * shape, 1e-12 * peak) << "step " << step;
  }
  // Without base_batch_size the lr is the first stage's, scaled as the batch grows.
  ConfigSection plain("job.toml", "optimizer");
  plain.Set("lr", 0.2);
  const LrSchedule first = LrSchedule::FromConfig(plain, s, total);
  EXPECT_DOUBLE_EQ(first.At(0), 0.2);
  EXPECT_DOUBLE_EQ(first.At(500), 0.4);
  EXPECT_DOUBLE_EQ(first.At(810), 0.8);
  // A constant batch keeps what it always was: base_batch_size 0 means no scaling.
  const LrSchedule constant = LrSchedule::FromConfig(plain, 256, 50, 500);
  EXPECT_DOUBLE_EQ(constant.At(499), 0.2);
}

}  // namespace
}  // namespace shoal
