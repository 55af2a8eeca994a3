// shoal-task --config JOB.toml [FLAGS...]: one task of a job started by a cluster's own
// launcher (one `srun` step, one `mpirun`): the task's rank decides its role. With servers,
// tasks 0..S-1 are shards 0..S-1 and the rest workers 0..W-1; without, every task is a
// worker. It then becomes shoal-server or shoal-worker (exec), passing the other flags on. In a
// diloco job with elastic = true, task 0 first starts the job's coordinator beside its worker
// (shoal-launch --serve_coordinator), since any worker may be lost.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/facts.h"
#include "algorithms/job_keys.h"
#include "common/config.h"
#include "common/error.h"
#include "common/rank_env.h"

namespace {

// The directory of this binary: shoal-server and shoal-worker sit beside it in a bundle, or
// in bazel-bin's server/ and worker/ next to tools/launcher/.
std::string SelfDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, size_t(n));
  return p.substr(0, p.rfind('/'));
}

std::string FindBinary(const std::string& name, const std::string& bazel_sub) {
  std::string dir = SelfDir();
  for (const std::string& c : {dir + "/" + name, dir + "/../../" + bazel_sub + "/" + name})
    if (access(c.c_str(), X_OK) == 0) return c;
  throw shoal::Error("cannot find " + name + " beside " + dir);
}

}  // namespace

int main(int argc, char** argv) {
  std::string config;
  std::vector<std::string> pass;  // flags for the role's binary
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config = argv[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      config = a.substr(9);
    } else if (a == "--rank" || a == "--shard" || a.rfind("--rank=", 0) == 0 || a.rfind("--shard=", 0) == 0) {
      fprintf(stderr,
              "shoal-task: %s: the task's rank decides its role; start shoal-server or shoal-worker "
              "directly to choose one\n",
              a.c_str());
      return 2;
    } else {
      pass.push_back(a);
    }
  }
  if (config.empty()) {
    fprintf(stderr, "usage: shoal-task --config JOB.toml [FLAGS...] (one task of an srun / mpirun job)\n");
    return 2;
  }
  std::vector<std::string> args, coordinator;
  try {
    shoal::JobConfig cfg = shoal::LoadJobConfig(config);
    shoal::CheckJobKeys(cfg);
    // shoal-task has no --rank: the role's rank comes from the task's.
    shoal::RankInfo task =
        shoal::ResolveRank(-1,
                           "no task rank in the environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, SLURM_PROCID or RANK): "
                           "start shoal-task with srun or mpirun");
    const bool servers = shoal::FactsOf(cfg.algorithm).needs_servers;
    const int num_servers = servers ? int(cfg.servers.size()) : 0;
    const int tasks = num_servers + cfg.world_size();
    if (task.world > 0 && task.world != tasks)
      throw shoal::Error(config + ": the job needs " + std::to_string(tasks) + " tasks (" +
                         std::to_string(num_servers) + " server(s) + " + std::to_string(cfg.world_size()) +
                         " worker(s)) but " + task.source + " started " + std::to_string(task.world));
    if (task.rank >= tasks)
      throw shoal::Error("task " + std::to_string(task.rank) + " is outside the job's " + std::to_string(tasks) +
                         " tasks");
    if (task.rank < num_servers)
      args = {FindBinary("shoal-server", "server"), "--config", config, "--shard", std::to_string(task.rank)};
    else
      args = {FindBinary("shoal-worker", "worker"), "--config", config, "--rank",
              std::to_string(task.rank - num_servers)};
    // A job that survives lost workers, rank 0 included, keeps its coordinator in a process of
    // its own: task 0 starts it beside its worker; it ends once every worker has left or died.
    if (!servers && shoal::SurvivesLostWorkers(cfg) && task.rank == 0) {
      coordinator = {FindBinary("shoal-launch", "tools/launcher"), "--serve_coordinator"};
      for (size_t i = 0; i < pass.size(); ++i)
        if (pass[i] == "--coordinator" && i + 1 < pass.size())
          coordinator.insert(coordinator.end(), {"--coordinator", pass[i + 1]});
        else if (pass[i].rfind("--coordinator=", 0) == 0)
          coordinator.push_back(pass[i]);
      coordinator.push_back(config);
    }
    // Only `shoal run` makes cgroups; here the scheduler owns the task's CPUs.
    if (task.rank >= num_servers && cfg.workers[size_t(task.rank - num_servers)].cpu_quota > 0)
      fprintf(stderr,
              "shoal-task: %s: [cluster] workers[%d] cpu_quota is not applied under srun / mpirun (only by shoal run); "
              "ask the scheduler for the CPUs instead\n",
              config.c_str(), task.rank - num_servers);
  } catch (const std::exception& e) {
    fprintf(stderr, "shoal-task: %s\n", e.what());
    return 2;
  }
  args.insert(args.end(), pass.begin(), pass.end());
  // The role's binary reads its rank from its flag; the task's environment would disagree.
  for (const char* v : {"SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                        "RANK", "WORLD_SIZE"})
    unsetenv(v);
  if (!coordinator.empty()) {
    pid_t pid = fork();
    if (pid == 0) {
      setsid();  // outlives this task's worker, which may be lost
      std::vector<char*> c;
      for (auto& a : coordinator) c.push_back(a.data());
      c.push_back(nullptr);
      execv(c[0], c.data());
      fprintf(stderr, "shoal-task: cannot start %s: %s\n", c[0], strerror(errno));
      _exit(1);
    }
    if (pid < 0) {
      fprintf(stderr, "shoal-task: cannot start the coordinator: %s\n", strerror(errno));
      return 1;
    }
  }
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execv(cargs[0], cargs.data());
  fprintf(stderr, "shoal-task: cannot start %s: %s\n", cargs[0], strerror(errno));
  return 1;
}
