#include "algorithms/algorithm.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "common/error.h"

namespace shoal {
namespace {

std::map<std::string, AlgorithmFactory>& Registry() {
  static std::map<std::string, AlgorithmFactory> r;
  return r;
}

}  // namespace

bool RegisterAlgorithm(const std::string& name, AlgorithmFactory f) {
  FactsOf(name);  // throws for a name with no facts
  if (!Registry().emplace(name, std::move(f)).second) throw Error("algorithm \"" + name + "\" is registered twice");
  return true;
}

std::unique_ptr<Algorithm> MakeAlgorithm(const std::string& name, const AlgorithmEnv& env) {
  FactsOf(name);  // the error lists the known algorithms
  auto it = Registry().find(name);
  if (it == Registry().end())
    throw Error("algorithm \"" + name + "\" is not linked into this binary (link //algorithms:all)");
  return it->second(env);
}

bool BalanceOn(const AlgorithmEnv& env) {
  if (env.balance >= 0) return env.balance > 0;
  return env.config && env.config->algorithm_opts.GetBool("balance", false);
}

double GradientWeight(const StepInfo& info, int world) {
  if (info.samples <= 0 || info.global_samples <= 0 || info.samples * world == info.global_samples) return 1.0;
  return double(world) * double(info.samples) / double(info.global_samples);
}

void ScaleGradients(const std::vector<ParamView>& params, double weight, DeviceOps* device) {
  if (weight == 1.0) return;
  for (auto& p : params) ScaleGradient(p, float(weight), device);
}

void ScaleGradient(const ParamView& p, float f, DeviceOps* device, bool queued) {
  if (p.on_device) {
    SHOAL_CHECK(device, "scaling the gradient of \"" + p.name + "\": it is in device memory, and no DeviceOps");
    device->After(p.ready.get());  // the backward kernels that wrote g may still be queued
    if (queued)
      device->ScaleQueued(p.g, p.n, f);
    else
      device->Scale(p.g, p.n, f);
    return;
  }
  for (int64_t i = 0; i < p.n; ++i) p.g[i] *= f;
}

uint64_t WeightsHashValue(const std::vector<ParamView>& views) {
  uint64_t hash = 1469598103934665603ull;
  for (auto& v : views)
    for (int64_t i = 0; i < v.n; ++i) {
      uint32_t bits;
      memcpy(&bits, &v.w[i], 4);
      hash = (hash ^ bits) * 1099511628211ull;
    }
  return hash;
}

std::string WeightsHash(const std::vector<ParamView>& views) {
  char hex[32];
  snprintf(hex, sizeof hex, "%016llx", (unsigned long long)WeightsHashValue(views));
  return hex;
}

void StartFromRankZero(Communicator& comm, const std::vector<ParamView>& params) {
  // Every rank takes part in the all-gather, so all decide alike; one that cannot read its
  // weights here sends a value of its own rank instead of a hash, so the ranks disagree.
  const bool on_device = std::any_of(params.begin(), params.end(), [](const ParamView& p) { return p.on_device; });
  const uint64_t mine = on_device ? ~uint64_t(comm.rank()) : WeightsHashValue(params);
  std::vector<uint64_t> all(size_t(comm.size()));
  comm.AllGather(&mine, sizeof mine, all.data());
  if (std::all_of(all.begin(), all.end(), [&](uint64_t h) { return h == all[0]; })) return;
  for (auto& p : params) comm.Broadcast(p.w, p.n * 4, 0);
}

bool AnyRank(Communicator& comm, bool mine) {
  float v = mine ? 1.f : 0.f;
  comm.AllReduce(&v, 1, ReduceOp::kSum);
  return v > 0;
}

bool GradientsFinite(const std::vector<ParamView>& params, DeviceOps* device) {
  std::vector<std::pair<const float*, int64_t>> on_device;
  for (auto& p : params) {
    if (p.on_device) {
      on_device.emplace_back(p.g, p.n);
      continue;
    }
    // NaN and inf are the floats whose exponent bits are all ones: one branch-free pass of
    // integer ops per tensor (no float compare that -ffinite-math could fold away).
    uint32_t bad = 0;
    for (int64_t i = 0; i < p.n; ++i) {
      uint32_t bits;
      memcpy(&bits, &p.g[i], 4);
      bad |= uint32_t((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (bad) return false;
  }
  if (on_device.empty()) return true;
  SHOAL_CHECK(device, "checking the gradient of \"" + params[0].name + "\": it is in device memory, and no DeviceOps");
  return device->AllFinite(on_device);
}

DeviceUpdater& LocalUpdater::Device(const ParamView& p) {
  if (!device_) {
    SHOAL_CHECK(bool(env_.device), "tensor \"" + p.name +
                                       "\" is in device memory, but this binary has no CUDA optimizer (link " +
                                       "//algorithms:cuda_device_ops and set AlgorithmEnv::device)");
    device_ = env_.device->NewUpdater(*env_.optimizer);
  }
  return *device_;
}

bool LocalUpdater::Apply(const std::vector<ParamView>& params, int64_t step) {
  for (auto& p : params)
    if (p.on_device) {
      Device(p);  // a binary without the CUDA optimizer says so before anything else
      break;
    }
  if (!GradientsFinite(params, env_.device.get())) {
    ++skipped_;
    return false;
  }
  if (states_.size() != params.size()) states_.resize(params.size());
  StepContext ctx;
  ctx.lr = float(env_.schedule->At(step));
  ctx.step = step;
  ctx.warmup_steps = env_.schedule->options().warmup_steps;
  bool device = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamView& p = params[i];
    if (p.on_device) {
      Device(p).Apply(p, i, ctx);
      device = true;
    } else {
      env_.optimizer->Apply(p.w, p.g, p.n, !p.no_weight_decay, ctx, &states_[i]);
    }
  }
  if (device) device_->Sync();  // the weights are final when Apply returns, as on the host
  return true;
}

void LocalUpdater::Save(const std::vector<ParamView>& params, const std::string& prefix, CheckpointState* out) const {
  for (size_t i = 0; i < params.size(); ++i) {
    std::string bytes;
    if (params[i].on_device) {
      if (device_ && device_->HasState(i)) bytes = EncodeOptimizerState(device_->Download(i));
    } else if (i < states_.size()) {
      bytes = EncodeOptimizerState(states_[i]);
    }
    out->Put(prefix + params[i].name, bytes);
  }
}

void LocalUpdater::Load(const std::vector<ParamView>& params, const std::string& prefix, const CheckpointState& in) {
  states_.assign(params.size(), OptimizerState());
  if (device_) device_->Clear();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& bytes = in.Get(prefix + params[i].name);
    if (bytes.empty()) continue;
    OptimizerState s =
        DecodeOptimizerState(bytes, size_t(params[i].n),
                             "checkpoint " + std::to_string(in.record.id) + " entry '" + prefix + params[i].name + "'");
    if (params[i].on_device)
      Device(params[i]).Upload(i, params[i].n, s);
    else
      states_[i] = std::move(s);
  }
}

void SaveWeights(const std::vector<ParamView>& params, CheckpointState* out) {
  for (auto& p : params) out->PutFloats("w/" + p.name, p.w, size_t(p.n));
}

void RestoreWeights(const CheckpointState& in, const std::vector<ParamView>& params) {
  for (auto& p : params) in.GetFloats("w/" + p.name, p.w, size_t(p.n));
}

void SaveBuffers(const std::vector<ParamView>& buffers, CheckpointState* out) {
  for (auto& b : buffers) out->PutFloats("b/" + b.name, b.w, size_t(b.n));
}

void RestoreBuffers(const CheckpointState& in, const std::vector<ParamView>& buffers) {
  for (auto& b : buffers) in.GetFloats("b/" + b.name, b.w, size_t(b.n));
}

void AverageBuffers(Communicator& comm, const std::vector<ParamView>& buffers) {
  size_t total = 0;
  for (auto& b : buffers) total += size_t(b.n);
  if (total == 0) return;
  std::vector<float> flat(total);
  size_t at = 0;
  for (auto& b : buffers) {
    std::copy(b.w, b.w + b.n, flat.begin() + int64_t(at));
    at += size_t(b.n);
  }
  comm.AllReduce(flat.data(), int64_t(total), ReduceOp::kMean);
  at = 0;
  for (auto& b : buffers) {
    std::copy(flat.begin() + int64_t(at), flat.begin() + int64_t(at + size_t(b.n)), b.w);
    at += size_t(b.n);
  }
}

}  // namespace shoal
