#include "common/batch_schedule.h"

#include <cmath>

#include "common/error.h"

namespace shoal {

BatchSchedule::BatchSchedule(std::vector<BatchStage> stages, int64_t samples, const std::string& what)
    : stages_(std::move(stages)) {
  SHOAL_CHECK(!stages_.empty(), what + ": expected at least one [epoch, global batch] stage");
  SHOAL_CHECK(stages_[0].epoch == 0,
              what + ": the first stage must start at epoch 0, got " + std::to_string(stages_[0].epoch));
  for (size_t i = 0; i < stages_.size(); ++i) {
    const BatchStage& s = stages_[i];
    SHOAL_CHECK(s.global_batch >= 1, what + ": stage " + std::to_string(i) + ": global batch " +
                                         std::to_string(s.global_batch) + " (expected >= 1)");
    if (i > 0)
      SHOAL_CHECK(s.epoch > stages_[i - 1].epoch, what + ": stage " + std::to_string(i) + " starts at epoch " +
                                                      std::to_string(s.epoch) + ", not after the stage before (" +
                                                      std::to_string(stages_[i - 1].epoch) + ")");
    SHOAL_CHECK(s.global_batch <= samples, what + ": stage " + std::to_string(i) + ": a global batch of " +
                                               std::to_string(s.global_batch) + " is larger than the epoch's " +
                                               std::to_string(samples) + " samples");
    steps_per_epoch_.push_back(samples / s.global_batch);
  }
}

BatchSchedule BatchSchedule::Constant(int64_t global_batch, int64_t steps_per_epoch) {
  BatchSchedule b;
  b.stages_ = {{0, std::max<int64_t>(1, global_batch)}};
  b.steps_per_epoch_ = {std::max<int64_t>(1, steps_per_epoch)};
  return b;
}

namespace {
// The stage epoch `epoch` is in.
size_t StageOf(const std::vector<BatchStage>& stages, int64_t epoch) {
  size_t i = 0;
  while (i + 1 < stages.size() && stages[i + 1].epoch <= epoch) ++i;
  return i;
}
}  // namespace

int64_t BatchSchedule::BatchOfEpoch(int64_t epoch) const { return stages_[StageOf(stages_, epoch)].global_batch; }

int64_t BatchSchedule::StepsInEpoch(int64_t epoch) const { return steps_per_epoch_[StageOf(stages_, epoch)]; }

int64_t BatchSchedule::FirstStepOfEpoch(int64_t epoch) const {
  int64_t steps = 0;
  for (size_t i = 0; i < stages_.size() && stages_[i].epoch < epoch; ++i) {
    const int64_t end = i + 1 < stages_.size() ? std::min(epoch, stages_[i + 1].epoch) : epoch;
    steps += (end - stages_[i].epoch) * steps_per_epoch_[i];
  }
  return steps;
}

int64_t BatchSchedule::EpochOfStep(int64_t step) const {
  int64_t first = 0;  // the first step of stage i
  for (size_t i = 0; i + 1 < stages_.size(); ++i) {
    const int64_t span = (stages_[i + 1].epoch - stages_[i].epoch) * steps_per_epoch_[i];
    if (step < first + span) return stages_[i].epoch + (step - first) / steps_per_epoch_[i];
    first += span;
  }
  return stages_.back().epoch + (step - first) / steps_per_epoch_.back();
}

int64_t BatchSchedule::StepsOfEpochs(double epochs) const {
  const int64_t whole = int64_t(std::floor(epochs));
  return FirstStepOfEpoch(whole) + std::llround((epochs - double(whole)) * double(StepsInEpoch(whole)));
}

}  // namespace shoal
