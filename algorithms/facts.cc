#include "algorithms/facts.h"

#include "common/error.h"

namespace shoal {

const std::vector<AlgorithmFacts>& AllAlgorithmFacts() {
  using D = ToleratedDeaths;
  using U = ServerUpdate;
  // name, needs servers, keeps checkpoints, tolerated worker deaths, server update.
  static const std::vector<AlgorithmFacts> kFacts = {
      {"adpsgd", false, true, D::kNone, U::kNone},
      {"allreduce", false, true, D::kNone, U::kNone},
      {"auto", false, true, D::kNone, U::kNone},
      {"bmuf", false, true, D::kNone, U::kNone},
      {"dgc", false, true, D::kNone, U::kNone},
      {"double_buffer", false, true, D::kNone, U::kNone},
      {"local", false, true, D::kNone, U::kNone},
      {"ps_async", true, true, D::kAnyButLast, U::kApplyEach},
      {"ps_ssp", true, true, D::kAnyButLast, U::kApplyEach},
      {"ps_sync", true, true, D::kNone, U::kMeanOfWorkers},
  };
  return kFacts;
}

std::vector<std::string> AlgorithmNames() {
  std::vector<std::string> out;
  for (auto& f : AllAlgorithmFacts()) out.push_back(f.name);
  return out;
}

const AlgorithmFacts& FactsOf(const std::string& name) {
  for (auto& f : AllAlgorithmFacts())
    if (f.name == name) return f;
  std::string known;
  for (auto& n : AlgorithmNames()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown algorithm \"" + name + "\" (known: " + known + ")");
}

}  // namespace shoal
