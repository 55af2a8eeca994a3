// Optimizers: one implementation each, applied per whole tensor (layer-wise methods such as
// LARS and LAMB need the whole layer), used by servers (PS modes) and workers (collective
// modes) alike. They work on host fp32 memory; GPU workers hand them host views.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/batch_schedule.h"
#include "common/config.h"

namespace shoal {

// Per-tensor optimizer state (momentum, second moments, ...), checkpointed with the tensor.
struct OptimizerState {
  std::vector<std::vector<float>> slots;
  int64_t steps = 0;  // updates applied to this tensor (bias correction)
};

// The one byte form of an optimizer state (server and worker checkpoints). Decode checks
// every slot against `elements` (a slot is empty or whole) and names `what` on bad bytes.
std::string EncodeOptimizerState(const OptimizerState& s);
OptimizerState DecodeOptimizerState(std::string_view bytes, size_t elements, const std::string& what);

struct StepContext {
  float lr = 0;              // this step's learning rate from the schedule
  int64_t step = 0;          // global step, 0-based
  int64_t warmup_steps = 0;  // for blends that move during warm-up (STiLL, rmsprop_sgd)
};

struct OptimizerHyper {
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0;            // L2 (added to the gradient); decoupled for adamw
  float trust_coefficient = 0.001f;  // LARS eta
  // LAMB / Adam family. eps is LAMB's default; DefaultOptimizerHyper gives Adam PyTorch's 1e-8.
  // The betas stay in double as the job file wrote them: 1 - beta is then PyTorch's (a
  // Python float) and not 1 - float(beta), which is 1.3e-5 off for beta2 = 0.999.
  double beta1 = 0.9, beta2 = 0.999;
  float eps = 1e-6f;
  float lamb_lr_ratio = 1.0f;  // STiLL: LAMB's LR = ratio x LARS's LR
  float rms_decay = 0.99f;     // rmsprop_sgd
  float rms_eps = 1e-8f;
  float rms_lr_ratio = 0.01f;  // rmsprop_sgd: RMSprop's LR = ratio x SGD's LR
};

// One Adam/AdamW step's per-tensor scalars, shared by the CPU and CUDA rules so both round
// them alike, each computed in double and then rounded to float as PyTorch's Python floats
// are: b1 = beta1, c1 = 1 - beta1, b2, c2 likewise; step_size = lr / (1 - beta1^t);
// bc2_sqrt = sqrt(1 - beta2^t); shrink = 1 - lr wd for the decoupled decay (1 for adam).
struct AdamScalars {
  float b1, c1, b2, c2, step_size, bc2_sqrt, shrink;
};
AdamScalars AdamStepScalars(const OptimizerHyper& h, bool decoupled, float wd, float lr, int64_t t);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string Name() const = 0;
  // w -= update(g); `decay` false for bias and BN parameters (no weight decay).
  virtual void Apply(float* w, const float* g, int64_t n, bool decay, const StepContext& ctx,
                     OptimizerState* state) const = 0;
  const OptimizerHyper& hyper() const { return h_; }

  explicit Optimizer(const OptimizerHyper& h) : h_(h) {}

 protected:
  OptimizerHyper h_;
};

// Registry: sgd | momentum | lars | lamb | still | rmsprop_sgd | adam | adamw. Unknown names
// get an error listing the known ones; hyper-parameters come from the [optimizer] section,
// where a key left out takes the rule's own default (DefaultOptimizerHyper). The
// OptimizerHyper form takes every field as given.
std::unique_ptr<Optimizer> MakeOptimizer(const std::string& name, const ConfigSection& opts);
std::unique_ptr<Optimizer> MakeOptimizer(const std::string& name, const OptimizerHyper& h);
// The defaults of rule `name`: OptimizerHyper's, except where the rule's reference differs
// (adam and adamw: PyTorch's eps 1e-8; adamw: weight_decay 1e-2).
OptimizerHyper DefaultOptimizerHyper(const std::string& name);
std::vector<std::string> OptimizerNames();
// The [optimizer] keys optimizer `name` reads, its schedule's (LrSchedule::FromConfig)
// included: the one list a job file's [optimizer] section is checked against.
std::vector<std::string> OptimizerKeys(const std::string& name);
// Throws "FILE: [optimizer] KEY: unknown key for optimizer "NAME" (did you mean ...?)" for a
// key neither the optimizer nor `extra` (keys the algorithm reads there) knows.
void CheckOptimizerKeys(const std::string& name, const ConfigSection& opts, const std::vector<std::string>& extra = {});

// Learning rate over steps: linear scaling with the global batch, linear warm-up, then
// constant | poly | cosine | step decay. Under batch-size control the global batch changes
// by stage: lr(step) = base_lr x batch(step) / base_batch_size x shape(step), where shape is
// the warm-up ramp and the decay over the whole run (peak 1), so each stage's lr is the
// linear scaling of its own batch.
struct LrScheduleOptions {
  double base_lr = 0.1;         // [optimizer] lr, for base_batch_size samples
  int64_t base_batch_size = 0;  // 0: no linear scaling
  int64_t global_batch = 1;     // the first stage's
  // Later stages: {first step, global batch}, steps increasing (empty: one batch size).
  std::vector<std::pair<int64_t, int64_t>> batch_changes;
  int64_t warmup_steps = 0;
  double warmup_start_ratio = 0.0;  // lr at step 0 = ratio x peak
  int64_t total_steps = 1;
  std::string kind = "constant";
  double poly_power = 2.0;
  double min_lr = 0;
  int64_t step_every = 1;  // step: decay every N steps by gamma
  double step_gamma = 0.1;
};

class LrSchedule {
 public:
  explicit LrSchedule(const LrScheduleOptions& o);
  // From [optimizer]: lr, base_batch_size, warmup_epochs, schedule, poly_power, min_lr,
  // step_epochs, step_gamma (epoch keys turned into steps with steps_per_epoch).
  static LrSchedule FromConfig(const ConfigSection& opts, int64_t global_batch, int64_t steps_per_epoch,
                               int64_t total_steps);
  // Under batch-size control: epoch keys turned into steps through `batches` (step decay
  // counts epochs of the first stage's length), and without base_batch_size the lr is
  // the first stage's (base_batch_size = its global batch), scaled linearly as it grows.
  static LrSchedule FromConfig(const ConfigSection& opts, const BatchSchedule& batches, int64_t total_steps);
  double peak_lr() const { return peak_; }  // the first stage's
  double At(int64_t step) const;
  const LrScheduleOptions& options() const { return o_; }

 private:
  LrScheduleOptions o_;
  double peak_;
};

}  // namespace shoal
