#include "algorithms/algorithm.h"

#include <map>
#include <mutex>

#include "common/error.h"

namespace shoal {
namespace {

struct Entry {
  bool needs_servers;
  AlgorithmFactory factory;
};

std::map<std::string, Entry>& Registry() {
  static std::map<std::string, Entry> r;
  return r;
}

}  // namespace

bool RegisterAlgorithm(const std::string& name, bool needs_servers, AlgorithmFactory f) {
  Registry()[name] = Entry{needs_servers, std::move(f)};
  return true;
}

std::vector<std::string> AlgorithmNames() {
  std::vector<std::string> out;
  for (auto& [k, v] : Registry()) out.push_back(k);
  return out;
}

static const Entry& Find(const std::string& name) {
  auto it = Registry().find(name);
  if (it == Registry().end()) {
    std::string known;
    for (auto& n : AlgorithmNames()) known += (known.empty() ? "" : ", ") + n;
    throw Error("unknown algorithm \"" + name + "\" (known: " + known + ")");
  }
  return it->second;
}

std::unique_ptr<Algorithm> MakeAlgorithm(const std::string& name, const AlgorithmEnv& env) {
  return Find(name).factory(env);
}

bool AlgorithmNeedsServers(const std::string& name) { return Find(name).needs_servers; }

void LocalUpdater::Apply(const std::vector<ParamView>& params, int64_t step) {
  if (states_.size() != params.size()) states_.resize(params.size());
  StepContext ctx;
  ctx.lr = float(env_.schedule->At(step));
  ctx.step = step;
  ctx.warmup_steps = env_.schedule->options().warmup_steps;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamView& p = params[i];
    env_.optimizer->Apply(p.w, p.g, p.n, !p.no_weight_decay, ctx, &states_[i]);
  }
}

}  // namespace shoal
