#include "server/aggregation.h"

#include <algorithm>
#include <cstring>

#include "algorithms/optimizers/optimizer.h"
#include "common/byte_codec.h"
#include "common/error.h"

namespace shoal {
namespace {

// Per-tensor state kept in StoredTensor::rule_state.
struct RuleState {
  OptimizerState opt;
  std::vector<float> sum;  // ps_sync: gradients of this step so far
  int count = 0;
  int64_t pushes = 0;
};

// Until the first worker's plan arrives the rule knows the optimizer but not the
// schedule; it can still restore checkpointed state (resume loads before anyone registers).
class OptimizerRule : public UpdateRule {
 public:
  explicit OptimizerRule(const JobConfig& cfg) : cfg_(cfg), max_contributors_(std::max(1, cfg.world_size())) {
    opt_ = MakeOptimizer(cfg.optimizer, cfg.optimizer_opts);
  }

  void SetPlan(const TrainingPlan& plan) override {
    SHOAL_CHECK(plan.steps_per_epoch >= 1 && plan.total_steps >= 0 && plan.global_batch >= 1,
                "training plan with " + std::to_string(plan.steps_per_epoch) + " steps per epoch, " +
                    std::to_string(plan.total_steps) + " steps, global batch " + std::to_string(plan.global_batch));
    SHOAL_CHECK(plan.workers >= 1 && plan.workers <= max_contributors_,
                "training plan for " + std::to_string(plan.workers) + " workers; the job has " +
                    std::to_string(max_contributors_));
    SHOAL_CHECK(plan.rule == msg::ServerRule::APPLY_EACH || plan.rule == msg::ServerRule::MEAN_OF_WORKERS ||
                    plan.rule == msg::ServerRule::NONE,
                "training plan with unknown server rule " + std::to_string(int(plan.rule)));
    rule_ = plan.rule;
    world_ = plan.workers;
    contributors_ = plan.rule == msg::ServerRule::MEAN_OF_WORKERS ? plan.workers : 1;
    schedule_ = std::make_unique<LrSchedule>(
        LrSchedule::FromConfig(cfg_.optimizer_opts, plan.global_batch, plan.steps_per_epoch, plan.total_steps));
  }

  std::string SaveState(const StoredTensor& t) const override {
    ByteWriter w;
    auto* st = static_cast<const RuleState*>(t.rule_state.get());
    if (!st) return {};
    w.Put(st->pushes).Put(int32_t(st->count));
    std::string opt = EncodeOptimizerState(st->opt);
    w.Blob(opt.data(), opt.size());
    w.Floats(st->sum);
    return std::move(w.str());
  }

  void LoadState(StoredTensor& t, std::string_view bytes) const override {
    t.rule_state.reset();
    if (bytes.empty()) return;  // never updated
    ByteReader r(bytes, "optimizer state");
    auto st = std::make_shared<RuleState>();
    st->pushes = r.Get<int64_t>();
    st->count = r.Get<int32_t>();
    const size_t n = t.elements();
    st->opt = DecodeOptimizerState(r.Blob(), n, "optimizer state");
    st->sum = r.Floats();
    SHOAL_CHECK(st->sum.empty() || st->sum.size() == n, "optimizer state: a partial sum of the wrong size");
    SHOAL_CHECK(st->pushes >= 0 && st->count >= 0 && st->count < max_contributors_ + 1,
                "optimizer state: bad counters");
    r.ExpectDone();
    t.rule_state = std::move(st);
  }

  // ps_sync counts global steps; the asynchronous modes count pushes, `world_` a step. A
  // partial sum belongs to a step of the workers before (a checkpoint is taken between
  // steps, so there is none there) and is dropped.
  void Restep(StoredTensor& t, int64_t step) const override {
    auto* st = static_cast<RuleState*>(t.rule_state.get());
    if (!st) return;
    st->pushes = contributors_ <= 1 ? step * int64_t(world_) : step;
    st->count = 0;
    st->sum.clear();
  }

  void Apply(const std::string& name, StoredTensor& param, const void* grad, size_t bytes) override {
    if (name.rfind("__shoal/", 0) == 0) {  // control values (clocks, flags): assign
      SHOAL_CHECK(bytes == param.buf->size(), "push of '" + name + "': size changed");
      memcpy(param.buf->data(), grad, bytes);
      return;
    }
    SHOAL_CHECK(schedule_, "push of '" + name + "' with op apply before any worker sent its training plan");
    SHOAL_CHECK(rule_ != msg::ServerRule::NONE,
                "push of '" + name + "' with op apply: this job runs no optimizer on the servers");
    SHOAL_CHECK(param.dtype == DType::kF32, "push of '" + name + "': the server optimizer needs fp32 tensors");
    const size_t n = param.elements();
    SHOAL_CHECK(bytes == n * 4,
                "push of '" + name + "': " + std::to_string(bytes) + " bytes for " + std::to_string(n) + " floats");
    if (!param.rule_state) param.rule_state = std::make_shared<RuleState>();
    auto* st = static_cast<RuleState*>(param.rule_state.get());
    const float* g = static_cast<const float*>(grad);
    float* w = reinterpret_cast<float*>(param.buf->data());
    bool decay = param.shape.size() > 1;
    if (contributors_ <= 1) {
      // Async: world pushes make one global step, and [optimizer] lr is set for the
      // global batch, so one push (one worker's batch) gets lr / world (linear scaling).
      int64_t step = st->pushes++ / world_;
      Step(w, g, int64_t(n), decay, step, st, 1.0f / float(world_));
      return;
    }
    if (st->sum.size() != n) st->sum.assign(n, 0.f);
    for (size_t i = 0; i < n; ++i) st->sum[i] += g[i];
    if (++st->count < contributors_) return;
    for (auto& x : st->sum) x /= float(contributors_);
    Step(w, st->sum.data(), int64_t(n), decay, st->pushes++, st, 1.0f);
    std::fill(st->sum.begin(), st->sum.end(), 0.f);
    st->count = 0;
  }

 private:
  void Step(float* w, const float* g, int64_t n, bool decay, int64_t step, RuleState* st, float lr_scale) {
    StepContext c;
    c.lr = float(schedule_->At(step)) * lr_scale;
    c.step = step;
    c.warmup_steps = schedule_->options().warmup_steps;
    opt_->Apply(w, g, n, decay, c, &st->opt);
  }

  JobConfig cfg_;
  const int max_contributors_;
  msg::ServerRule rule_ = msg::ServerRule::NONE;
  int contributors_ = 1, world_ = 1;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<LrSchedule> schedule_;
};

}  // namespace

std::unique_ptr<UpdateRule> MakeServerUpdateRule(const JobConfig& cfg) { return std::make_unique<OptimizerRule>(cfg); }

}  // namespace shoal
