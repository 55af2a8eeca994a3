#include "algorithms/facts.h"

#include <algorithm>

#include "common/error.h"

namespace shoal {

const std::vector<AlgorithmFacts>& AllAlgorithmFacts() {
  using D = ToleratedDeaths;
  using U = ServerUpdate;
  // The collective keys of every algorithm that asks for a communicator
  // (algorithms/collectives/factory.cc), and a fused all-reduce's bucket size.
  auto comm = [](std::vector<std::string> own) {
    for (const char* k : {"collective", "collective_timeout_ms", "segment_bytes", "torus_cols"}) own.push_back(k);
    return own;
  };
  // name, needs servers, tolerated worker deaths, server update,
  // [algorithm] keys, extra [optimizer] keys, algorithms it may choose.
  static const std::vector<AlgorithmFacts> kFacts = {
      {"adpsgd", false, D::kNone, U::kNone, comm({"gossip_timeout_ms"})},
      {"allreduce", false, D::kNone, U::kNone,
       comm({"bucket_bytes", "overlap", "wire_dtype", "balance", "balance_every_steps"})},
      {"auto",
       false,
       D::kNone,
       U::kNone,
       comm({"bucket_bytes", "overlap", "probe_steps", "probe_settle_steps", "probe_settle_s", "uneven_ratio",
             "bmuf_ratio", "dgc_ratio", "diloco_ratio", "balance", "balance_every_steps", "bmuf_factor",
             "adpsgd_factor", "dgc_factor"}),
       {},
       {"adpsgd", "allreduce", "bmuf", "dgc", "diloco"}},
      {"bmuf", false, D::kNone, U::kNone,
       comm({"bucket_bytes", "block_steps", "block_momentum", "block_lr", "nesterov", "sync_warmup_epochs", "balance",
             "balance_every_steps"})},
      {"diloco", false, D::kNone, U::kNone,
       comm({"sync_every", "outer_optimizer", "outer_lr", "outer_momentum", "outer_wire", "streaming", "overlap_steps",
             "merge_alpha", "balance", "balance_every_steps", "elastic"})},
      {"dgc",
       false,
       D::kNone,
       U::kNone,
       comm({"sparsity", "sparsity_warmup_epochs", "clip_norm", "min_compress_elements", "min_pairs", "balance",
             "balance_every_steps"}),
       {"momentum", "weight_decay"}},
      {"double_buffer", false, D::kNone, U::kNone,
       comm({"bucket_bytes", "wire_dtype", "balance", "balance_every_steps"})},
      {"local", false, D::kNone, U::kNone},
      {"ps_async", true, D::kAnyButLast, U::kApplyEach, {"timeout_ms"}},
      {"ps_ssp", true, D::kAnyButLast, U::kApplyEach, {"timeout_ms", "staleness"}},
      {"ps_sync", true, D::kNone, U::kMeanOfWorkers, {"timeout_ms"}},
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

const std::vector<std::string>& JobAlgorithmKeys() {
  // rendezvous_dir: algorithms/env.cc; tolerate_worker_failure: the launcher.
  static const std::vector<std::string> k = {"rendezvous_dir", "tolerate_worker_failure"};
  return k;
}

std::vector<std::string> KnownAlgorithmKeys(const std::string& name) {
  const AlgorithmFacts& f = FactsOf(name);
  std::vector<std::string> out = JobAlgorithmKeys();
  out.insert(out.end(), f.keys.begin(), f.keys.end());
  for (auto& c : f.may_choose) {
    auto more = KnownAlgorithmKeys(c);
    out.insert(out.end(), more.begin(), more.end());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::string> AlgorithmOptimizerKeys(const std::string& name) {
  const AlgorithmFacts& f = FactsOf(name);
  std::vector<std::string> out = f.optimizer_keys;
  for (auto& c : f.may_choose) {
    auto more = AlgorithmOptimizerKeys(c);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

}  // namespace shoal
