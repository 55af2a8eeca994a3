#include "algorithms/balance.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"
#include "common/int_list.h"

namespace shoal {

std::vector<int64_t> SplitBatch(int64_t global, const std::vector<double>& rates, int64_t floor) {
  const size_t W = rates.size();
  SHOAL_CHECK(floor >= 1 && W >= 1 && global / int64_t(W) >= floor,
              "SplitBatch: a global batch of " + std::to_string(global) + " cannot give each of " + std::to_string(W) +
                  " workers " + std::to_string(floor) + " sample(s)");
  bool ok = true;
  double sum = 0;
  for (double r : rates) {
    ok = ok && std::isfinite(r) && r > 0;
    sum += r;
  }
  std::vector<double> ideal(W);
  for (size_t i = 0; i < W; ++i) ideal[i] = ok ? double(global) * rates[i] / sum : double(global) / double(W);
  std::vector<int64_t> out(W);
  int64_t given = 0;
  for (size_t i = 0; i < W; ++i) {
    out[i] = std::max<int64_t>(floor, int64_t(std::floor(ideal[i])));
    given += out[i];
  }
  // Hand out what is left by largest remainder, or take back what the floor over-gave from
  // the largest shares (never below the floor: W x floor <= global); ties go to the lower
  // rank, so all ranks agree.
  std::vector<size_t> order(W);
  std::iota(order.begin(), order.end(), size_t(0));
  if (given < global) {
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return ideal[a] - double(out[a]) > ideal[b] - double(out[b]); });
    for (size_t k = 0; given < global; k = (k + 1) % W, ++given) ++out[order[k]];
  }
  while (given > global) {
    size_t big = size_t(std::max_element(out.begin(), out.end()) - out.begin());
    --out[big];
    --given;
  }
  return out;
}

int64_t MinBalancedShare(int64_t values, int64_t batch_size) {
  if (values <= 0) return 1;
  const int64_t need = std::max<int64_t>(2, (kMinBatchNormValues + values - 1) / values);
  return std::max<int64_t>(1, std::min(need, batch_size));
}

Balancer::Balancer(const AlgorithmEnv& env)
    : rank_(env.rank),
      world_(env.world),
      global_(env.config->batch_size * env.world),
      every_(env.config->algorithm_opts.GetInt("balance_every_steps", 5, 1, int64_t(1) << 30)),
      floor_(std::max<int64_t>(1, std::min(env.min_share, env.config->batch_size))) {
  comm_ = env.make_communicator("balance");
  sizes_.assign(size_t(world_), env.config->batch_size);
}

void Balancer::SetGlobal(int64_t global) {
  if (global == global_) return;
  SHOAL_CHECK(global >= floor_ * world_, "balance: a global batch of " + std::to_string(global) + " cannot give " +
                                             std::to_string(world_) + " workers " + std::to_string(floor_) +
                                             " samples each");
  std::vector<double> rates(sizes_.begin(), sizes_.end());
  sizes_ = SplitBatch(global, rates, floor_);
  global_ = global;
}

int64_t Balancer::offset() const { return std::accumulate(sizes_.begin(), sizes_.begin() + rank_, int64_t(0)); }

void Balancer::Observe(int64_t samples, double compute_s) {
  window_samples_ += samples;
  window_s_ += compute_s;
}

bool Balancer::MaybeRebalance(int64_t steps_done) {
  if (steps_done % every_ != 0) return false;
  // A quarter the last estimate, three quarters this window: one noisy window (a busy
  // core) moves the split less, and a lasting change wins within a window or two. (Rates
  // measured at an older share are staler: a step's fixed cost makes a worker's samples/s
  // depend on its batch, so the old estimate weighs little.)
  const double now = window_s_ > 0 ? double(window_samples_) / window_s_ : 0;
  rate_ = rate_ > 0 && now > 0 ? 0.25 * rate_ + 0.75 * now : now;
  double mine = rate_;
  window_samples_ = 0;
  window_s_ = 0;
  std::vector<double> rates(static_cast<size_t>(world_));
  comm_->AllGather(&mine, sizeof mine, rates.data());
  std::vector<int64_t> next = SplitBatch(global_, rates, floor_);
  if (next == sizes_) return false;
  sizes_ = std::move(next);
  return true;
}

void Balancer::Save(CheckpointState* out) const { out->Put("balance/sizes", JoinIntList(sizes_)); }

void Balancer::Load(const CheckpointState& in) {
  if (!in.Has("balance/sizes")) return;  // written before balancing started: the equal split
  const std::string s = in.Get("balance/sizes");
  std::vector<int64_t> v =
      ParseIntList<int64_t>(s, "checkpoint " + std::to_string(in.record.id) + " entry 'balance/sizes'");
  int64_t sum = 0;
  bool ok = int(v.size()) == world_;
  for (int64_t x : v) {
    ok = ok && x >= 1 && x <= global_;  // bounded before adding: a damaged entry cannot overflow the sum
    if (ok) sum += x;
  }
  SHOAL_CHECK(ok && sum == global_, "checkpoint " + std::to_string(in.record.id) + " entry 'balance/sizes' (" + s +
                                        ") is no split of a global batch of " + std::to_string(global_) + " over " +
                                        std::to_string(world_) + " workers (was batch_size or workers changed?)");
  sizes_ = std::move(v);
}

}  // namespace shoal
