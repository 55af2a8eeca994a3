#include "worker/loss_scaler.h"

#include <algorithm>
#include <limits>

#include "common/error.h"

namespace shoal {

LossScaler::LossScaler(Mode mode, double init, int64_t growth_interval)
    : mode_(mode), scale_(mode == Mode::kNone ? 1.0 : init), growth_interval_(growth_interval) {
  SHOAL_CHECK(
      scale_ > 0 && scale_ <= (mode == Mode::kDynamic ? kMaxLossScaleInit : kMaxLossScale) && growth_interval_ > 0,
      "loss scaler: scale " + std::to_string(init) + " or growth interval " + std::to_string(growth_interval) +
          " out of range");
}

LossScaler LossScaler::FromConfig(const JobConfig& cfg) {
  Mode m = cfg.loss_scale == "dynamic" ? Mode::kDynamic : cfg.loss_scale == "fixed" ? Mode::kFixed : Mode::kNone;
  return LossScaler(m, cfg.loss_scale_init, cfg.loss_scale_growth_interval);
}

float LossScaler::scale() const {
  // Above fp32's range the loss gradient becomes inf: the step is skipped and S halves.
  return scale_ <= std::numeric_limits<float>::max() ? float(scale_) : std::numeric_limits<float>::infinity();
}

void LossScaler::Unscale(const ParamView& p, DeviceOps* device, bool queued) const {
  if (scale_ == 1.0) return;
  // Products by normal floats only (a subnormal factor could be flushed to 0): 1/S when
  // S <= 2^126, else 2^-126 and then 2^126/S. Exact for powers of two absent underflow;
  // a scale beyond fp32 made the gradients inf or NaN, and they stay so.
  if (scale_ <= kMaxLossScale) return ScaleGradient(p, float(1.0 / scale_), device, queued);
  ScaleGradient(p, float(1.0 / kMaxLossScale), device, queued);
  ScaleGradient(p, float(kMaxLossScale / scale_), device, queued);
}

void LossScaler::Update(bool skipped) {
  if (skipped) {
    ++skipped_;
    good_ = 0;
    if (mode_ == Mode::kDynamic) scale_ = std::max(1.0, scale_ / 2);
    return;
  }
  if (mode_ != Mode::kDynamic) return;
  if (++good_ >= growth_interval_) {
    good_ = 0;
    if (scale_ * 2 <= kMaxLossScale) scale_ *= 2;
  }
}

void LossScaler::Save(CheckpointState* out) const {
  out->PutDouble("loss_scale/scale", scale_);
  out->PutInt("loss_scale/good_steps", good_);
  out->PutInt("loss_scale/skipped_steps", skipped_);
}

void LossScaler::Load(const CheckpointState& in) {
  if (!in.Has("loss_scale/scale")) return;
  // A fixed or absent scale is the job file's, whatever the checkpoint's run used.
  if (mode_ == Mode::kDynamic) {
    double s = in.GetDouble("loss_scale/scale");
    SHOAL_CHECK(s > 0 && s <= kMaxLossScaleInit, "checkpoint " + std::to_string(in.record.id) +
                                                     ": entry 'loss_scale/scale' holds " + std::to_string(s) +
                                                     ", not a loss scale in (0, 1e300]");
    scale_ = s;
    good_ = std::max<int64_t>(0, in.GetInt("loss_scale/good_steps"));
  }
  skipped_ = std::max<int64_t>(0, in.GetInt("loss_scale/skipped_steps"));
}

}  // namespace shoal
