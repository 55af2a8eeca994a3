// shoal-worker --config JOB.toml --rank R: one worker of a job. Flags override job values.
#include <gflags/gflags.h>

#include <cstdio>
#include <cstdlib>

#include "algorithms/job_keys.h"
#include "common/config.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/rank_env.h"
#include "worker/trainer.h"

DEFINE_string(config, "", "job file (TOML)");
DEFINE_int32(rank, -1, "worker rank; from OMPI_COMM_WORLD_RANK / PMIX_RANK / SLURM_PROCID / RANK when not given");
DEFINE_bool(resume, false, "continue from the newest complete checkpoint");
DEFINE_bool(rejoin, false,
            "this worker was restarted alone while the job's other processes still run: with --resume in a ps_sync "
            "job it starts a new recovery generation, and every shard and worker goes back to the checkpoint with "
            "it; in a diloco job with elastic = true it joins at the next outer step and takes the global weights");
DEFINE_bool(fresh, false, "start over: delete the checkpoints an earlier run left in [job] checkpoint_dir");
DEFINE_int32(threads, 0, "CPU threads (0: [train] threads, or all cores)");
DEFINE_int64(epochs, 0, "override [train] epochs");
DEFINE_int64(max_steps, -1, "override [train] max_steps");
DEFINE_int64(batch_size, 0, "override [data] batch_size");
DEFINE_string(device, "", "override this worker's device (cpu | cuda:N)");
DEFINE_string(coordinator, "", "override [cluster] coordinator (host:port)");

namespace {

// Takes --NAME=VALUE or --NAME VALUE out of argv. For --output_dir: RocksDB (linked for
// the worker's checkpoints) registers a gflag of that name for one of its tools, and two
// definitions of one flag stop the binary at start-up.
std::string TakeFlag(int* argc, char** argv, const std::string& name) {
  std::string value;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    std::string a = argv[i];
    for (const std::string& p : {"--" + name, "-" + name}) {
      if (a == p && i + 1 < *argc) {
        value = argv[++i];
        goto next;
      }
      if (a.rfind(p + "=", 0) == 0) {
        value = a.substr(p.size() + 1);
        goto next;
      }
    }
    argv[out++] = argv[i];
  next:;
  }
  *argc = out;
  argv[out] = nullptr;
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  // CUDA loads kernels lazily by default: a first launch on the compute stream while NCCL's
  // kernels run on the communication thread can then wait on them (a hang). Loaded at context
  // creation instead; a user's own CUDA_MODULE_LOADING wins.
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  gflags::SetUsageMessage("shoal-worker --config JOB.toml [--rank R] [--output_dir DIR (overrides [job] output_dir)]");
  const std::string output_dir = TakeFlag(&argc, argv, "output_dir");
  // gflags would exit 1 (a crash, to the launcher) for a malformed value or unknown flag.
  const std::string bad_flag = shoal::ParseFlags(&argc, &argv);
  if (!bad_flag.empty()) {
    fprintf(stderr, "shoal-worker: %s\n", bad_flag.c_str());
    return 2;
  }
  if (FLAGS_config.empty()) {
    fprintf(stderr, "shoal-worker: --config JOB.toml is required\n");
    return 2;
  }
  shoal::JobConfig cfg;
  shoal::RankInfo rank;
  try {
    cfg = shoal::LoadJobConfig(FLAGS_config);
    shoal::CheckJobKeys(cfg);
    rank = shoal::ResolveRank(FLAGS_rank);
    if (rank.world > 0 && rank.world != cfg.world_size())
      throw shoal::Error(FLAGS_config + ": [cluster] workers: the job file says " + std::to_string(cfg.world_size()) +
                         " worker(s) but " + rank.source + " started " + std::to_string(rank.world));
    // Each flag's default (0, or -1 for max_steps) means "the job file's value"; any other
    // value overrides it and is checked below, so a negative one is refused, not ignored.
    // A refused value is named by the flag the user typed (and the job key it overrides).
    shoal::FlagOverrides flags;
    auto set = [&](auto* field, auto value, const char* key, const char* flag) {
      *field = value;
      flags[key] = flag;
    };
    if (FLAGS_epochs != 0) set(&cfg.epochs, FLAGS_epochs, "[train] epochs", "--epochs");
    if (FLAGS_max_steps != -1) set(&cfg.max_steps, FLAGS_max_steps, "[train] max_steps", "--max_steps");
    if (FLAGS_batch_size != 0) set(&cfg.batch_size, FLAGS_batch_size, "[data] batch_size", "--batch_size");
    if (FLAGS_threads != 0) set(&cfg.threads, FLAGS_threads, "[train] threads", "--threads");
    if (!output_dir.empty()) cfg.output_dir = output_dir;
    if (!FLAGS_coordinator.empty())
      set(&cfg.coordinator, FLAGS_coordinator, "[cluster] coordinator", "--coordinator");
    shoal::CheckJobLimits(cfg, flags);  // the overrides are job values too
    if (!FLAGS_device.empty() && rank.rank >= 0 && rank.rank < cfg.world_size())
      cfg.workers[size_t(rank.rank)].device = FLAGS_device;
  } catch (const shoal::Error& e) {
    fprintf(stderr, "shoal-worker: %s\n", e.what());
    return 2;
  }
  try {
    shoal::TrainerOptions opts;
    opts.rank = rank.rank;
    opts.resume = FLAGS_resume;
    opts.fresh = FLAGS_fresh;
    opts.rejoin = FLAGS_rejoin;
    shoal::TrainResult r = shoal::Train(cfg, opts);
    printf("worker %d: done after %lld steps, test_accuracy %.4f, %.0f samples/s\n", rank.rank, (long long)r.steps,
           r.test_accuracy, r.samples_per_s);
  } catch (const shoal::InputError& e) {
    fprintf(stderr, "shoal-worker %d: %s\n", rank.rank, e.what());
    return 2;  // the job's own fault: a restart would fail the same way
  } catch (const shoal::Error& e) {
    fprintf(stderr, "shoal-worker %d: %s\n", rank.rank, e.what());
    return 1;
  } catch (const std::exception& e) {
    fprintf(stderr, "shoal-worker %d: internal error: %s\n", rank.rank, e.what());
    return 1;
  }
  return 0;
}
