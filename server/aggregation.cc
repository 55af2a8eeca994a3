#include "server/aggregation.h"

#include <algorithm>
#include <cstring>

#include "algorithms/optimizers/optimizer.h"
#include "common/byte_codec.h"
#include "common/error.h"
#include "worker/data/data_loader.h"
#include "worker/data/dataset.h"

namespace shoal {
namespace {

// Per-tensor state kept in StoredTensor::rule_state.
struct RuleState {
  OptimizerState opt;
  std::vector<float> sum;  // ps_sync: gradients of this step so far
  int count = 0;
  int64_t pushes = 0;
};

class OptimizerRule : public UpdateRule {
 public:
  OptimizerRule(const JobConfig& cfg, int contributors)
      : contributors_(contributors), world_(std::max(1, cfg.world_size())) {
    opt_ = MakeOptimizer(cfg.optimizer, cfg.optimizer_opts);
    int64_t spe = StepsPerEpoch(cfg);
    int64_t total = cfg.epochs * spe;
    if (cfg.max_steps > 0) total = std::min(total, cfg.max_steps);
    schedule_ = std::make_unique<LrSchedule>(LrSchedule::FromConfig(cfg.optimizer_opts, cfg.batch_size * cfg.world_size(), spe, total));
  }

  std::string SaveState(const StoredTensor& t) const override {
    ByteWriter w;
    auto* st = static_cast<const RuleState*>(t.rule_state.get());
    if (!st) return {};
    w.Put(st->pushes).Put(int32_t(st->count)).Put(st->opt.steps).Put(uint32_t(st->opt.slots.size()));
    for (auto& slot : st->opt.slots) w.Floats(slot);
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
    st->opt.steps = r.Get<int64_t>();
    uint32_t slots = r.Get<uint32_t>();
    SHOAL_CHECK(slots <= 16, "optimizer state: " + std::to_string(slots) + " slots");
    const size_t n = t.elements();
    for (uint32_t i = 0; i < slots; ++i) {
      st->opt.slots.push_back(r.Floats());
      SHOAL_CHECK(st->opt.slots.back().size() == n || st->opt.slots.back().empty(),
                  "optimizer state: a slot of " + std::to_string(st->opt.slots.back().size()) + " for " + std::to_string(n) + " elements");
    }
    st->sum = r.Floats();
    SHOAL_CHECK(st->sum.empty() || st->sum.size() == n, "optimizer state: a partial sum of the wrong size");
    SHOAL_CHECK(st->pushes >= 0 && st->count >= 0 && st->count < contributors_ + 1, "optimizer state: bad counters");
    r.ExpectDone();
    t.rule_state = std::move(st);
  }

  void Apply(const std::string& name, StoredTensor& param, const void* grad, size_t bytes) override {
    if (name.rfind("__shoal/", 0) == 0) {  // control values (clocks, flags): assign
      SHOAL_CHECK(bytes == param.buf->size(), "push of '" + name + "': size changed");
      memcpy(param.buf->data(), grad, bytes);
      return;
    }
    SHOAL_CHECK(param.dtype == DType::kF32, "push of '" + name + "': the server optimizer needs fp32 tensors");
    const size_t n = param.elements();
    SHOAL_CHECK(bytes == n * 4, "push of '" + name + "': " + std::to_string(bytes) + " bytes for " + std::to_string(n) + " floats");
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

  int contributors_, world_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<LrSchedule> schedule_;
};

}  // namespace

int64_t StepsPerEpoch(const JobConfig& cfg) {
  DatasetOptions d;
  d.seed = cfg.seed;
  d.synthetic_samples = cfg.synthetic_samples * cfg.world_size();
  d.synthetic_image_size = cfg.synthetic_image_size;
  d.synthetic_classes = cfg.synthetic_classes;
  d.max_samples = cfg.max_train_samples;
  auto train = LoadDataset(cfg.data_format, cfg.train_path, d);
  DataLoaderOptions o;
  o.batch_size = cfg.batch_size;
  o.world_size = cfg.world_size();
  o.prefetch = 0;
  DataLoader loader(train, o);
  return std::max<int64_t>(1, loader.batches_per_epoch());
}

std::unique_ptr<UpdateRule> MakeServerUpdateRule(const JobConfig& cfg) {
  if (cfg.algorithm == "ps_async" || cfg.algorithm == "ps_ssp") return std::make_unique<OptimizerRule>(cfg, 1);
  if (cfg.algorithm == "ps_sync") return std::make_unique<OptimizerRule>(cfg, cfg.world_size());
  return nullptr;
}

}  // namespace shoal
