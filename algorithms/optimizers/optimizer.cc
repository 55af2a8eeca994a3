#include "algorithms/optimizers/optimizer.h"

#include "common/byte_codec.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "common/error.h"

namespace shoal {
namespace {

double Norm(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return std::sqrt(s);
}

std::vector<float>& Slot(OptimizerState* st, size_t i, int64_t n) {
  if (st->slots.size() <= i) st->slots.resize(i + 1);
  auto& s = st->slots[i];
  if (int64_t(s.size()) != n) s.assign(size_t(n), 0.0f);
  return s;
}

// Plain SGD with weight decay: w -= lr (g + wd w).
class Sgd : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::string Name() const override { return "sgd"; }
  void Apply(float* w, const float* g, int64_t n, bool decay, const StepContext& c, OptimizerState* st) const override {
    float wd = decay ? h_.weight_decay : 0.f;
    for (int64_t i = 0; i < n; ++i) w[i] -= c.lr * (g[i] + wd * w[i]);
    ++st->steps;
  }
};

// Momentum SGD (PyTorch convention): v = m v + (g + wd w); w -= lr v, or with Nesterov
// w -= lr (g + wd w + m v).
class Momentum : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::string Name() const override { return "momentum"; }
  void Apply(float* w, const float* g, int64_t n, bool decay, const StepContext& c, OptimizerState* st) const override {
    auto& v = Slot(st, 0, n);
    float wd = decay ? h_.weight_decay : 0.f, m = h_.momentum;
    for (int64_t i = 0; i < n; ++i) {
      float d = g[i] + wd * w[i];
      v[i] = m * v[i] + d;
      w[i] -= c.lr * (h_.nesterov ? d + m * v[i] : v[i]);
    }
    ++st->steps;
  }
};

// LARS (You et al. 2017; seed 003 Algorithm 1): local lr = eta ||w|| / (||g|| + wd ||w||);
// v = m v + lr * local * (g + wd w); w -= v. Every tensor gets its trust ratio (bias and
// BN too, only without weight decay): at large-batch learning rates (lr 16 at 2K) a plain
// step on them diverges. A tensor whose norm is still 0 (zero-initialised bias) takes
// local = eta, i.e. the ratio ||w|| / ||g|| counted as 1.
void LarsUpdate(const OptimizerHyper& h, float* w, const float* g, int64_t n, bool decay, float lr,
                std::vector<float>& v, float blend_scale) {
  float wd = decay ? h.weight_decay : 0.f;
  double local = h.trust_coefficient;
  double wn = Norm(w, n), gn = Norm(g, n);
  if (wn > 0 && gn > 0) local = h.trust_coefficient * wn / (gn + wd * wn);
  float s = float(lr * local);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = h.momentum * v[i] + s * (g[i] + wd * w[i]);
    w[i] -= blend_scale * v[i];
  }
}

class Lars : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::string Name() const override { return "lars"; }
  void Apply(float* w, const float* g, int64_t n, bool decay, const StepContext& c, OptimizerState* st) const override {
    LarsUpdate(h_, w, g, n, decay, c.lr, Slot(st, 0, n), 1.0f);
    ++st->steps;
  }
};

// LAMB (You et al. 2019, Algorithm 2): Adam moments with bias correction, r = m^/(sqrt(v^)+eps),
// u = r + wd w, w -= lr (||w|| / ||u||) u (ratio 1 when either norm is 0).
void LambUpdate(const OptimizerHyper& h, float* w, const float* g, int64_t n, bool decay, float lr,
                std::vector<float>& m, std::vector<float>& v, int64_t t, float blend_scale, std::vector<float>& u) {
  float wd = decay ? h.weight_decay : 0.f;
  double bc1 = 1.0 - std::pow(double(h.beta1), double(t)), bc2 = 1.0 - std::pow(double(h.beta2), double(t));
  const float b1 = float(h.beta1), b2 = float(h.beta2);  // the moments in float, as on the GPU
  u.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    double mh = m[i] / bc1, vh = v[i] / bc2;
    u[i] = float(mh / (std::sqrt(vh) + h.eps)) + wd * w[i];
  }
  double wn = Norm(w, n), un = Norm(u.data(), n);
  double ratio = (wn > 0 && un > 0) ? wn / un : 1.0;
  float s = float(lr * ratio) * blend_scale;
  for (int64_t i = 0; i < n; ++i) w[i] -= s * u[i];
}

class Lamb : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::string Name() const override { return "lamb"; }
  void Apply(float* w, const float* g, int64_t n, bool decay, const StepContext& c, OptimizerState* st) const override {
    ++st->steps;
    std::vector<float> u;
    Slot(st, 1, n);
    LambUpdate(h_, w, g, n, decay, c.lr, Slot(st, 0, n), Slot(st, 1, n), st->steps, 1.0f, u);
  }
};

// STiLL (Sony, seed 000): both LAMB and LARS updates each step, weighted LAMB:LARS from
// 100:0 at step 0 moving linearly to 0:100 at the end of warm-up, then LARS only. Each
// keeps its own state; LAMB runs at lamb_lr_ratio x the LARS learning rate.
class Still : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::string Name() const override { return "still"; }
  void Apply(float* w, const float* g, int64_t n, bool decay, const StepContext& c, OptimizerState* st) const override {
    ++st->steps;
    float a = c.warmup_steps > 0 ? std::min(1.0f, float(c.step) / float(c.warmup_steps)) : 1.0f;  // LARS share
    Slot(st, 2, n);  // size all slots first: growing the vector moves them
    auto& lars_v = Slot(st, 0, n);
    if (a < 1.0f) {
      // Both updates are computed from the same w_t, then mixed.
      std::vector<float> w0(w, w + n), u;
      LambUpdate(h_, w, g, n, decay, c.lr * h_.lamb_lr_ratio, Slot(st, 1, n), Slot(st, 2, n), st->steps, 1.0f - a, u);
      std::vector<float> lars_w(w0);
      LarsUpdate(h_, lars_w.data(), g, n, decay, c.lr, lars_v, a);
      for (int64_t i = 0; i < n; ++i) w[i] += lars_w[i] - w0[i];
    } else {
      LarsUpdate(h_, w, g, n, decay, c.lr, lars_v, 1.0f);
    }
  }
};

// RMSprop warm-up moving to momentum SGD (ChainerMN, seed 002): the update is
// (1-a) * rmsprop + a * momentum-SGD with a rising linearly over warm-up.
class RmspropSgd : public Optimizer {
 public:
  using Optimizer::Optimizer;
  std::string Name() const override { return "rmsprop_sgd"; }
  void Apply(float* w, const float* g, int64_t n, bool decay, const StepContext& c, OptimizerState* st) const override {
    float a = c.warmup_steps > 0 ? std::min(1.0f, float(c.step) / float(c.warmup_steps)) : 1.0f;
    Slot(st, 1, n);
    auto& v = Slot(st, 0, n);   // momentum buffer
    auto& ms = Slot(st, 1, n);  // RMSprop mean square
    float wd = decay ? h_.weight_decay : 0.f, rlr = c.lr * h_.rms_lr_ratio;
    for (int64_t i = 0; i < n; ++i) {
      float d = g[i] + wd * w[i];
      v[i] = h_.momentum * v[i] + d;
      ms[i] = h_.rms_decay * ms[i] + (1 - h_.rms_decay) * d * d;
      float rms = rlr * d / (std::sqrt(ms[i]) + h_.rms_eps);
      w[i] -= (1 - a) * rms + a * c.lr * v[i];
    }
    ++st->steps;
  }
};

// Adam (Kingma & Ba 2015) and AdamW (Loshchilov & Hutter 2019) as torch.optim.Adam/AdamW
// compute them, so a PyTorch recipe carries over: Adam adds wd w to the gradient (L2),
// AdamW first shrinks w by lr wd (decoupled); then m and v, and
// w -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps),
// eps added after the bias correction of v as PyTorch does (not to sqrt(v) before it).
// The scalars (AdamStepScalars) come in double, as Python floats do in PyTorch.
class Adam : public Optimizer {
 public:
  Adam(const OptimizerHyper& h, bool decoupled) : Optimizer(h), decoupled_(decoupled) {}
  std::string Name() const override { return decoupled_ ? "adamw" : "adam"; }
  void Apply(float* w, const float* g, int64_t n, bool decay, const StepContext& c, OptimizerState* st) const override {
    ++st->steps;
    Slot(st, 1, n);  // size both slots first: growing the vector moves them
    auto& m = Slot(st, 0, n);
    auto& v = Slot(st, 1, n);
    float wd = decay ? h_.weight_decay : 0.f;
    AdamScalars s = AdamStepScalars(h_, decoupled_, wd, c.lr, st->steps);
    float l2 = decoupled_ ? 0.f : wd;
    for (int64_t i = 0; i < n; ++i) {
      float wi = w[i] * s.shrink;
      float d = g[i] + l2 * w[i];
      m[i] = s.b1 * m[i] + s.c1 * d;
      v[i] = s.b2 * v[i] + s.c2 * d * d;
      w[i] = wi - s.step_size * (m[i] / (std::sqrt(v[i]) / s.bc2_sqrt + h_.eps));
    }
  }

 private:
  bool decoupled_;
};

using Factory = std::function<std::unique_ptr<Optimizer>(const OptimizerHyper&)>;
// Each optimizer with the [optimizer] hyper-parameters its rule uses (MakeOptimizer below
// reads them all; this list is what a job may set).
struct Entry {
  Factory make;
  std::vector<std::string> keys;
};
template <class T>
Factory Make() {
  return [](const OptimizerHyper& h) { return std::unique_ptr<Optimizer>(new T(h)); };
}
Factory MakeAdam(bool decoupled) {
  return [decoupled](const OptimizerHyper& h) { return std::unique_ptr<Optimizer>(new Adam(h, decoupled)); };
}
const std::map<std::string, Entry>& Registry() {
  static const std::map<std::string, Entry> r = {
      {"sgd", {Make<Sgd>(), {"weight_decay"}}},
      {"momentum", {Make<Momentum>(), {"weight_decay", "momentum", "nesterov"}}},
      {"lars", {Make<Lars>(), {"weight_decay", "momentum", "trust_coefficient"}}},
      {"lamb", {Make<Lamb>(), {"weight_decay", "beta1", "beta2", "eps"}}},
      {"still",
       {Make<Still>(), {"weight_decay", "momentum", "trust_coefficient", "beta1", "beta2", "eps", "lamb_lr_ratio"}}},
      {"rmsprop_sgd", {Make<RmspropSgd>(), {"weight_decay", "momentum", "rms_decay", "rms_lr_ratio"}}},
      {"adam", {MakeAdam(false), {"weight_decay", "beta1", "beta2", "eps"}}},
      {"adamw", {MakeAdam(true), {"weight_decay", "beta1", "beta2", "eps"}}},
  };
  return r;
}

// What LrSchedule::FromConfig reads, for every optimizer.
const std::vector<std::string>& ScheduleKeys() {
  static const std::vector<std::string> k = {
      "lr",       "base_batch_size", "warmup_epochs", "warmup_steps", "warmup_start_ratio",
      "schedule", "poly_power",      "min_lr",        "step_epochs",  "step_gamma"};
  return k;
}

}  // namespace

std::vector<std::string> OptimizerNames() {
  std::vector<std::string> n;
  for (auto& [k, v] : Registry()) n.push_back(k);
  return n;
}

std::vector<std::string> OptimizerKeys(const std::string& name) {
  auto it = Registry().find(name);
  std::vector<std::string> keys = ScheduleKeys();
  keys.push_back("smoothout");  // every optimizer: the worker's SmoothOut (worker/smoothout.h)
  if (it != Registry().end()) keys.insert(keys.end(), it->second.keys.begin(), it->second.keys.end());
  return keys;
}

void CheckOptimizerKeys(const std::string& name, const ConfigSection& opts, const std::vector<std::string>& extra) {
  if (!Registry().count(name)) MakeOptimizer(name, opts);  // the unknown-name error
  std::vector<std::string> known = OptimizerKeys(name);
  known.insert(known.end(), extra.begin(), extra.end());
  opts.CheckKeys(known, "optimizer \"" + name + "\"");
}

std::unique_ptr<Optimizer> MakeOptimizer(const std::string& name, const OptimizerHyper& h) {
  auto it = Registry().find(name);
  if (it == Registry().end()) {
    std::string known;
    for (auto& n : OptimizerNames()) known += (known.empty() ? "" : ", ") + n;
    throw Error("unknown optimizer \"" + name + "\" (known: " + known + ")");
  }
  return it->second.make(h);
}

AdamScalars AdamStepScalars(const OptimizerHyper& h, bool decoupled, float wd, float lr, int64_t t) {
  double bc1 = 1.0 - std::pow(h.beta1, double(t)), bc2 = 1.0 - std::pow(h.beta2, double(t));
  AdamScalars s;
  s.b1 = float(h.beta1);
  s.c1 = float(1.0 - h.beta1);
  s.b2 = float(h.beta2);
  s.c2 = float(1.0 - h.beta2);
  s.step_size = float(double(lr) / bc1);
  s.bc2_sqrt = float(std::sqrt(bc2));
  s.shrink = decoupled ? float(1.0 - double(lr) * double(wd)) : 1.0f;
  return s;
}

OptimizerHyper DefaultOptimizerHyper(const std::string& name) {
  OptimizerHyper h;
  if (name == "adam" || name == "adamw") h.eps = 1e-8f;
  if (name == "adamw") h.weight_decay = 1e-2f;
  return h;
}

std::unique_ptr<Optimizer> MakeOptimizer(const std::string& name, const ConfigSection& o) {
  const OptimizerHyper d = DefaultOptimizerHyper(name);
  OptimizerHyper h = d;
  // Defaults pass through double and back: the float fields keep their exact bits.
  h.momentum = float(o.GetDouble("momentum", d.momentum, 0, 0.99999));
  h.nesterov = o.GetBool("nesterov", d.nesterov);
  h.weight_decay = float(o.GetDouble("weight_decay", d.weight_decay, 0, 1));
  h.trust_coefficient = float(o.GetDouble("trust_coefficient", d.trust_coefficient, 1e-9, 100));
  // A beta of 1 would freeze its moment (and 1 - beta^t = 0 divides by zero); eps > 0 keeps
  // the division defined for a zero second moment.
  h.beta1 = o.GetDouble("beta1", d.beta1, 0, 0.99999);
  h.beta2 = o.GetDouble("beta2", d.beta2, 0, 0.9999999);
  h.eps = float(o.GetDouble("eps", d.eps, 1e-12, 1));
  h.lamb_lr_ratio = float(o.GetDouble("lamb_lr_ratio", d.lamb_lr_ratio, 1e-9, 1e9));
  h.rms_decay = float(o.GetDouble("rms_decay", d.rms_decay, 0, 0.99999));
  h.rms_lr_ratio = float(o.GetDouble("rms_lr_ratio", d.rms_lr_ratio, 1e-9, 1e9));
  try {
    return MakeOptimizer(name, h);
  } catch (const Error& e) {
    throw Error(o.Where("name") + ": " + e.what());
  }
}

LrSchedule::LrSchedule(const LrScheduleOptions& o) : o_(o) {
  peak_ = o.base_lr;
  if (o.base_batch_size > 0) peak_ *= double(o.global_batch) / double(o.base_batch_size);
  if (o_.total_steps < 1) o_.total_steps = 1;
}

LrSchedule LrSchedule::FromConfig(const ConfigSection& s, int64_t global_batch, int64_t steps_per_epoch,
                                  int64_t total_steps) {
  return FromConfig(s, BatchSchedule::Constant(global_batch, steps_per_epoch), total_steps);
}

LrSchedule LrSchedule::FromConfig(const ConfigSection& s, const BatchSchedule& batches, int64_t total_steps) {
  LrScheduleOptions o;
  o.base_lr = s.GetDouble("lr", 0.1, 0, 1e6);
  o.base_batch_size =
      s.GetInt("base_batch_size", batches.constant() ? 0 : batches.stages()[0].global_batch, 0, INT64_MAX);
  o.global_batch = batches.stages()[0].global_batch;
  for (size_t i = 1; i < batches.stages().size(); ++i)
    o.batch_changes.push_back({batches.FirstStepOfEpoch(batches.stages()[i].epoch), batches.stages()[i].global_batch});
  double we = s.GetDouble("warmup_epochs", 0, 0, 1e6);
  o.warmup_steps = s.Has("warmup_steps") ? s.GetInt("warmup_steps", 0, 0, INT64_MAX) : batches.StepsOfEpochs(we);
  o.warmup_start_ratio = s.GetDouble("warmup_start_ratio", 0.0, 0, 1);
  o.total_steps = total_steps;
  o.kind = s.GetString("schedule", "constant");
  if (o.kind != "constant" && o.kind != "poly" && o.kind != "cosine" && o.kind != "step")
    throw Error(s.Where("schedule") + ": expected constant, poly, cosine or step, got \"" + o.kind + "\"");
  o.poly_power = s.GetDouble("poly_power", 2.0, 0, 100);
  o.min_lr = s.GetDouble("min_lr", 0, 0, 1e6);
  o.step_every = std::max<int64_t>(
      1, int64_t(std::llround(s.GetDouble("step_epochs", 30, 1e-6, 1e6) * double(batches.StepsInEpoch(0)))));
  o.step_gamma = s.GetDouble("step_gamma", 0.1, 0, 1);
  return LrSchedule(o);
}

double LrSchedule::At(int64_t step) const {
  // Linear scaling by the batch of the stage `step` is in (peak_ is the first stage's).
  double peak = peak_;
  for (auto& [first, batch] : o_.batch_changes)
    if (step >= first && o_.base_batch_size > 0) peak = o_.base_lr * double(batch) / double(o_.base_batch_size);
  if (step < o_.warmup_steps) {
    double f = double(step + 1) / double(o_.warmup_steps);
    return peak * (o_.warmup_start_ratio + (1 - o_.warmup_start_ratio) * f);
  }
  int64_t span = std::max<int64_t>(1, o_.total_steps - o_.warmup_steps);
  double p = std::min(1.0, double(step - o_.warmup_steps) / double(span));
  double lr = peak;
  if (o_.kind == "poly")
    lr = o_.min_lr + (peak - o_.min_lr) * std::pow(1 - p, o_.poly_power);
  else if (o_.kind == "cosine")
    lr = o_.min_lr + (peak - o_.min_lr) * 0.5 * (1 + std::cos(M_PI * p));
  else if (o_.kind == "step")
    lr = peak * std::pow(o_.step_gamma, double((step - o_.warmup_steps) / o_.step_every));
  return lr;
}

std::string EncodeOptimizerState(const OptimizerState& s) {
  ByteWriter w;
  w.Put(s.steps).Put(uint32_t(s.slots.size()));
  for (auto& slot : s.slots) w.Floats(slot);
  return std::move(w.str());
}

OptimizerState DecodeOptimizerState(std::string_view bytes, size_t elements, const std::string& what) {
  ByteReader r(bytes, what);
  OptimizerState s;
  s.steps = r.Get<int64_t>();
  SHOAL_CHECK(s.steps >= 0, what + ": a negative step count");
  uint32_t slots = r.Get<uint32_t>();
  SHOAL_CHECK(slots <= 16, what + ": " + std::to_string(slots) + " slots");
  for (uint32_t i = 0; i < slots; ++i) {
    s.slots.push_back(r.Floats());
    SHOAL_CHECK(s.slots.back().size() == elements || s.slots.back().empty(),
                what + ": a slot of " + std::to_string(s.slots.back().size()) + " for " + std::to_string(elements) +
                    " elements");
  }
  r.ExpectDone();
  return s;
}

}  // namespace shoal
