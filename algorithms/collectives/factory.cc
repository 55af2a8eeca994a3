#include "algorithms/collectives/factory.h"

#include <algorithm>
#include <cstdlib>

#include "algorithms/collectives/hierarchical_nccl.h"
#include "algorithms/collectives/nccl_comm.h"
#include "algorithms/collectives/torus.h"
#include "algorithms/collectives/zmq_ring.h"
#include "common/error.h"
#include "common/device.h"

namespace shoal {

std::string RunId() {
  for (const char* v : {"SHOAL_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid"}) {
    const char* s = getenv(v);
    if (s && *s) return s;
  }
  return "0";
}

int CollectiveTimeoutMs(const JobConfig& cfg) {
  return int(cfg.algorithm_opts.GetInt("collective_timeout_ms", 120000, 100, 86400000));
}

namespace {

// The ring options of worker `rank`'s rings: the job's timeouts, segment size, bind host,
// simulated bandwidth and CurveZMQ keys.
RingOptions RingOptionsOf(const JobConfig& cfg, int rank, const std::string& name) {
  const ConfigSection& o = cfg.algorithm_opts;
  RingOptions ro;
  ro.prefix = name;
  ro.timeout_ms = CollectiveTimeoutMs(cfg);
  ro.segment_bytes = o.GetInt("segment_bytes", 1 << 20, 256, int64_t(1) << 30);
  ro.bind_host = cfg.workers[size_t(rank)].host;
  ro.bandwidth_bytes_per_s = cfg.workers[size_t(rank)].bandwidth_mbps * 1e6 / 8;
  ro.curve_server_public = cfg.curve_server_public;
  ro.curve_server_secret = cfg.curve_server_secret;
  ro.curve_client_public = cfg.curve_client_public;
  ro.curve_client_secret = cfg.curve_client_secret;
  return ro;
}

}  // namespace

std::unique_ptr<Communicator> MakeMemberRing(const JobConfig& cfg, int rank, const std::vector<int>& members,
                                             Store& store, const std::string& name) {
  const auto me = std::find(members.begin(), members.end(), rank);
  if (rank < 0 || rank >= cfg.world_size() || me == members.end())
    throw Error(cfg.path + ": rank " + std::to_string(rank) + " is not among the ring's members");
  RingOptions ro = RingOptionsOf(cfg, rank, name);
  ro.members = members;
  return std::unique_ptr<Communicator>(new ZmqRing(int(me - members.begin()), int(members.size()), store, ro));
}

std::unique_ptr<Communicator> MakeWorkerCommunicator(const JobConfig& cfg, int rank, Store& store,
                                                     const std::string& name) {
  const ConfigSection& o = cfg.algorithm_opts;
  const int world = cfg.world_size();
  if (rank < 0 || rank >= world)
    throw Error(cfg.path + ": rank " + std::to_string(rank) + " is outside the job's " + std::to_string(world) +
                " worker(s)");
  std::string kind = o.GetString("collective", "ring");
  if (kind != "ring" && kind != "torus2d" && kind != "hierarchical" && kind != "nccl")
    throw Error(o.Where("collective") + ": expected \"ring\", \"torus2d\", \"hierarchical\" or \"nccl\", got \"" +
                kind + "\"");
  const RingOptions ro = RingOptionsOf(cfg, rank, name);
  if (kind == "ring") return std::unique_ptr<Communicator>(new ZmqRing(rank, world, store, ro));
  // NCCL has no encryption: a job that asked for it with keys must say it accepts that.
  auto refuse_unencrypted = [&] {
    if (cfg.curve_enabled() && !cfg.allow_plaintext)
      throw Error(o.Where("collective") + ": NCCL's traffic is not encrypted or authenticated, and this job has " +
                  "[security] keys: use collective = \"ring\" (encrypted) or set [security] allow_plaintext = true " +
                  "to accept NCCL's plaintext");
  };
  if (kind == "nccl") {
    refuse_unencrypted();
    // NCCL reduces on the GPUs: every worker of the job must have one (mixed CPU and GPU
    // workers use the ring, which takes both).
    for (size_t r = 0; r < cfg.workers.size(); ++r)
      if (ParseDevice(cfg.workers[r].device).is_cpu())
        throw Error(o.Where("collective") + ": \"nccl\" needs every worker on a GPU, but worker " + std::to_string(r) +
                    " is on the CPU (use \"ring\" for a mixed job)");
    NcclOptions no;
    no.device = ParseDevice(cfg.workers[size_t(rank)].device).index;
    no.prefix = name;
    no.timeout_ms = ro.timeout_ms;
    return std::unique_ptr<Communicator>(new NcclComm(rank, world, store, no));
  }
  int cols = 1;
  if (kind == "torus2d") {
    int def = 1;
    for (int c = 1; c * c <= world; ++c)
      if (world % c == 0) def = world / c;  // the most square grid, cols >= rows
    cols = int(o.GetInt("torus_cols", def, 1, world));
    if (world % cols != 0)
      throw Error(o.Where("torus_cols") + ": " + std::to_string(cols) + " does not divide the " +
                  std::to_string(world) + " workers");
  } else {
    // Hierarchical: one grid row per host; workers must be listed host by host, the same
    // number on each host.
    const auto& w = cfg.workers;
    cols = 1;
    while (cols < int(w.size()) && w[size_t(cols)].host == w[0].host) ++cols;
    for (size_t i = 0; i < w.size(); ++i)
      if (w.size() % size_t(cols) != 0 || w[i].host != w[i - i % size_t(cols)].host ||
          (i % size_t(cols) == 0 && i > 0 && w[i].host == w[i - 1].host))
        throw Error(cfg.path +
                    ": [cluster] workers: hierarchical all-reduce needs the same number of workers on every host, "
                    "listed host by host");
  }
  bool all_gpus = kind == "hierarchical";
  for (auto& w : cfg.workers) all_gpus = all_gpus && !ParseDevice(w.device).is_cpu();
  if (all_gpus) refuse_unencrypted();
  if (all_gpus)  // NCCL inside each host, rings across hosts
    return std::unique_ptr<Communicator>(
        new HierarchicalNccl(rank, world, cols, ParseDevice(cfg.workers[size_t(rank)].device).index, store, ro, name));
  return std::unique_ptr<Communicator>(new Torus2D(rank, world, cols, store, ro, name));
}

}  // namespace shoal
