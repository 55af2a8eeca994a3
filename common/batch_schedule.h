// Batch-size control (Mikami et al., "ImageNet/ResNet-50 Training in 224 Seconds", seed 000):
// the global batch grows in stages, [train] batch_schedule = [[0, 4096], [10, 8192]] (from
// epoch, global batch). A stage begins at an epoch boundary, so each epoch is wholly one batch
// size and takes floor(samples / batch) steps (the last partial batch dropped, as always).
// A job without a schedule is one stage. The step <-> (epoch, batch) mapping here is the only
// one the trainer, the checkpoints and the learning-rate schedule use, so a resumed job finds
// the very batch it would have trained next.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shoal {

struct BatchStage {
  int64_t epoch = 0;         // the first epoch at this global batch
  int64_t global_batch = 1;  // samples per step, all workers together
};

class BatchSchedule {
 public:
  // `stages`: non-empty, the first at epoch 0, epochs increasing, batches >= 1; with
  // `samples` samples an epoch (each stage's batch must fit: at least one step an epoch).
  // Throws shoal::Error naming `what` otherwise.
  BatchSchedule(std::vector<BatchStage> stages, int64_t samples, const std::string& what = "batch_schedule");
  // One stage: `global_batch` samples a step, `steps_per_epoch` steps an epoch.
  static BatchSchedule Constant(int64_t global_batch, int64_t steps_per_epoch);

  bool constant() const { return stages_.size() == 1; }
  const std::vector<BatchStage>& stages() const { return stages_; }
  int64_t BatchOfEpoch(int64_t epoch) const;
  int64_t StepsInEpoch(int64_t epoch) const;
  int64_t FirstStepOfEpoch(int64_t epoch) const;  // steps in the epochs before it
  int64_t EpochOfStep(int64_t step) const;        // the epoch step `step` (0-based) trains in
  int64_t BatchAt(int64_t step) const { return BatchOfEpoch(EpochOfStep(step)); }
  // Whole and fractional epochs as steps (warm-up lengths given in epochs), rounded.
  int64_t StepsOfEpochs(double epochs) const;

 private:
  BatchSchedule() = default;
  std::vector<BatchStage> stages_;
  std::vector<int64_t> steps_per_epoch_;  // per stage
};

}  // namespace shoal
