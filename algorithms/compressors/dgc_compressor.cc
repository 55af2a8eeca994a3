#include "algorithms/compressors/dgc_compressor.h"

#include <sstream>

#include <algorithm>
#include <cmath>

#include "algorithms/compressors/topk.h"
#include "common/error.h"

namespace shoal {

double DgcCompressor::SparsityAt(double epoch) const {
  if (epoch >= o_.warmup_epochs) return o_.sparsity;
  double s = 1.0 - std::pow(0.25, std::floor(epoch) + 1);  // 0.75, 0.9375, 0.984, ...
  return std::min(s, o_.sparsity);
}

int64_t DgcCompressor::KFor(int64_t n, double sparsity) {
  // The epsilon keeps 1000 x (1 - 0.999) = 1.0000000000000009 at 1.
  return std::max<int64_t>(1, int64_t(std::ceil(double(n) * (1.0 - sparsity) - 1e-9)));
}

SparseGrad DgcCompressor::Compress(const std::vector<ParamView>& params, const std::vector<size_t>& which, double epoch,
                                   int world) {
  if (u_.size() != which.size()) {
    u_.resize(which.size());
    v_.resize(which.size());
    for (size_t j = 0; j < which.size(); ++j) {
      u_[j].assign(size_t(params[which[j]].n), 0.f);
      v_[j].assign(size_t(params[which[j]].n), 0.f);
    }
  }
  // Local clipping on the global norm of the local gradient, threshold / sqrt(N).
  float scale = 1.f;
  if (o_.clip_norm > 0) {
    double ss = 0;
    for (size_t j : which)
      for (int64_t i = 0; i < params[j].n; ++i) ss += double(params[j].g[i]) * params[j].g[i];
    double bound = o_.clip_norm / std::sqrt(double(world));
    double norm = std::sqrt(ss);
    if (norm > bound) scale = float(bound / norm);
  }
  SparseGrad out;
  out.layout = LayoutAt(params, which, epoch);
  std::vector<int32_t> idx;
  std::vector<float> val;
  std::vector<std::pair<int32_t, float>> pairs;
  for (size_t j = 0; j < which.size(); ++j) {
    const ParamView& p = params[which[j]];
    auto& u = u_[j];
    auto& v = v_[j];
    float wd = p.no_weight_decay ? 0.f : float(o_.weight_decay), m = float(o_.momentum);
    for (int64_t i = 0; i < p.n; ++i) {
      float g = scale * p.g[i] + wd * p.w[i];
      u[size_t(i)] = m * u[size_t(i)] + g;  // momentum correction
      v[size_t(i)] += u[size_t(i)];
    }
    idx.clear();
    val.clear();
    SampledTopK(v.data(), p.n, out.layout.counts[j], 0, rng_, &idx, &val);
    // The encoding wants each tensor's indices in order.
    pairs.clear();
    for (size_t t = 0; t < idx.size(); ++t) pairs.emplace_back(idx[t], val[t]);
    std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [i, x] : pairs) {
      out.idx.push_back(i);
      out.val.push_back(x);
    }
  }
  out.wire = SparseEncode(out.layout, out.idx, &out.val);
  // Momentum factor masking: a sent entry leaves both accumulators, except what rounding
  // to the wire took off it, which the velocity keeps for a later step.
  size_t q = 0;
  for (size_t j = 0; j < which.size(); ++j)
    for (int64_t c = 0; c < out.layout.counts[j]; ++c, ++q) {
      size_t i = size_t(out.idx[q]);
      v_[j][i] -= out.val[q];
      u_[j][i] = 0.f;
    }
  return out;
}

SparseLayout DgcCompressor::LayoutAt(const std::vector<ParamView>& params, const std::vector<size_t>& which,
                                     double epoch) const {
  SparseLayout l;
  double sparsity = SparsityAt(epoch);
  for (size_t j : which) {
    l.sizes.push_back(params[j].n);
    l.counts.push_back(std::min(params[j].n, std::max(o_.min_pairs, KFor(params[j].n, sparsity))));
  }
  return l;
}

void DgcCompressor::Decode(const SparseGrad& s, float* out, int64_t out_n) {
  int64_t total = 0;
  for (int64_t n : s.layout.sizes) total += n;
  SHOAL_CHECK(total == out_n,
              "dgc: pairs for " + std::to_string(total) + " elements decoded into " + std::to_string(out_n));
  size_t q = 0;
  int64_t base = 0;
  for (size_t t = 0; t < s.layout.sizes.size(); ++t) {
    for (int64_t c = 0; c < s.layout.counts[t]; ++c, ++q) out[base + s.idx[q]] += s.val[q];
    base += s.layout.sizes[t];
  }
}

void DgcCompressor::Save(const std::vector<ParamView>& params, const std::vector<size_t>& which,
                         const std::string& prefix, CheckpointState* out) const {
  std::ostringstream rng;
  rng << rng_;
  out->Put(prefix + "rng", rng.str());
  out->PutInt(prefix + "started", u_.size() == which.size() ? 1 : 0);
  if (u_.size() != which.size()) return;
  for (size_t j = 0; j < which.size(); ++j) {
    out->PutFloats(prefix + "momentum/" + params[which[j]].name, u_[j]);
    out->PutFloats(prefix + "velocity/" + params[which[j]].name, v_[j]);
  }
}

void DgcCompressor::Load(const std::vector<ParamView>& params, const std::vector<size_t>& which,
                         const std::string& prefix, const CheckpointState& in) {
  std::istringstream rng(in.Get(prefix + "rng"));
  rng >> rng_;
  SHOAL_CHECK(!rng.fail(), "checkpoint: entry '" + prefix + "rng' is not a random stream state");
  u_.clear();
  v_.clear();
  if (!in.GetInt(prefix + "started")) return;
  for (size_t j = 0; j < which.size(); ++j) {
    const ParamView& p = params[which[j]];
    u_.push_back(in.GetFloatVector(prefix + "momentum/" + p.name, size_t(p.n)));
    v_.push_back(in.GetFloatVector(prefix + "velocity/" + p.name, size_t(p.n)));
  }
}

}  // namespace shoal
