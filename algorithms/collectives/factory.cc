#include "algorithms/collectives/factory.h"

#include <cstdlib>

#include "algorithms/collectives/zmq_ring.h"
#include "common/error.h"

namespace shoal {

std::string RunId() {
  for (const char* v : {"SHOAL_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid"}) {
    const char* s = getenv(v);
    if (s && *s) return s;
  }
  return "0";
}

std::unique_ptr<Communicator> MakeWorkerCommunicator(const AlgorithmEnv& env, const std::string& name) {
  const ConfigSection& o = env.config->algorithm_opts;
  std::string kind = o.GetString("collective", "ring");
  if (kind != "ring")
    throw Error(o.Where("collective") + ": \"" + kind + "\" is not available in this build (known: ring)");
  std::string dir = o.GetString("rendezvous_dir", env.config->output_dir + "/rendezvous");
  // The store lives as long as the process: the ring only reads it while wiring.
  static std::unique_ptr<FileStore> store;
  store.reset(new FileStore(dir + "/" + RunId()));
  RingOptions ro;
  ro.prefix = name;
  ro.timeout_ms = int(o.GetInt("collective_timeout_ms", 120000, 100, 86400000));
  ro.segment_bytes = o.GetInt("segment_bytes", 1 << 20, 256, int64_t(1) << 30);
  ro.bind_host = env.config->workers[size_t(env.rank)].host;
  ro.bandwidth_bytes_per_s = env.config->workers[size_t(env.rank)].bandwidth_mbps * 1e6 / 8;
  return std::unique_ptr<Communicator>(new ZmqRing(env.rank, env.world, *store, ro));
}

}  // namespace shoal
