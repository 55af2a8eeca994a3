// Loss scaling ([model] loss_scale; Micikevicius et al. 2018, PyTorch's GradScaler): the
// loss gradient (dlogits) is multiplied by S so that small gradients survive reduced
// precision, and every gradient is divided by S again as soon as it is final, before the
// algorithm sees it (the exchange carries true gradients; scaling by a power of two and
// back is exact absent overflow). A step whose gradients are not all finite is skipped by
// the algorithm's guard (Algorithm::skipped_steps); the dynamic rule then halves S (never
// below 1), and doubles it after growth_interval consecutive good steps (never above 2^126).
// A fixed scale never changes; "none" is S = 1 and costs nothing.
#pragma once
#include <cstdint>

#include "algorithms/algorithm.h"
#include "common/checkpoint/checkpoint_state.h"
#include "common/config.h"

namespace shoal {

class LossScaler {
 public:
  enum class Mode { kNone, kFixed, kDynamic };
  LossScaler(Mode mode, double init, int64_t growth_interval);
  // From [model] loss_scale, loss_scale_init, loss_scale_growth_interval.
  static LossScaler FromConfig(const JobConfig& cfg);

  // S as the factor of dlogits: inf while S is beyond fp32 (a dynamic start that high).
  float scale() const;
  double scale_double() const { return scale_; }
  // Divides one final gradient by S (nothing when S = 1); on-device views through `device`
  // (queued: see ScaleGradient).
  void Unscale(const ParamView& p, DeviceOps* device, bool queued = false) const;
  // After each step: whether the algorithm skipped it.
  void Update(bool skipped);

  int64_t skipped_steps() const { return skipped_; }
  int64_t good_steps() const { return good_; }
  Mode mode() const { return mode_; }

  // S, the good-step count and the skips as checkpoint entries "loss_scale/...", and back
  // (a checkpoint without them, written before loss scaling existed, leaves the start).
  void Save(CheckpointState* out) const;
  void Load(const CheckpointState& in);

 private:
  Mode mode_;
  double scale_;
  int64_t growth_interval_;
  int64_t good_ = 0, skipped_ = 0;
};

}  // namespace shoal
