// What `shoal run` refuses before starting anything, and how it restarts: real launcher,
// servers and workers on loopback, bounded waits. An earlier run's checkpoints are refused
// once, by the launcher, and never restarted over (a restart with --fresh deleted them); a
// missing data file is named before the checkpoints.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

const char* kMomentum = "[optimizer]\nname = \"momentum\"\nlr = 0.05\nmomentum = 0.9\n\n";

// 2 workers, batch 32, 1600 samples a worker: 50 steps an epoch; a checkpoint every 20.
std::string Job(const std::string& name, const std::string& dir, const std::string& algorithm, int epochs,
                int max_restarts) {
  std::string t = FmnistJob(name, dir + "/out", 2, "mlp", 3200, epochs,
                            "[algorithm]\nname = \"" + algorithm + "\"\n\n" + kMomentum);
  t.insert(t.find("seed = 42\n") + 10,
           "checkpoint_dir = \"" + dir +
               "/ckpt\"\ncheckpoint_every_steps = 20\nmax_restarts = " + std::to_string(max_restarts) + "\n");
  return t;
}

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Every file under `dir` but RocksDB's info logs, with its size and modification time.
std::map<std::string, std::string> Listing(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename().string().rfind("LOG", 0) == 0) continue;
    out[e.path().string()] =
        std::to_string(e.file_size()) + "@" + std::to_string(e.last_write_time().time_since_epoch().count());
  }
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs `cmd` (stdout and stderr to `out`) and returns its exit code; killed after timeout_s.
int Exec(const std::string& cmd, const std::string& out, int timeout_s) {
  int st = system(("timeout -s KILL " + std::to_string(timeout_s) + " " + cmd + " > " + out + " 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// A finished job run again without --resume or --fresh, with max_restarts: one line from the
// launcher naming the checkpoints, exit 2, no process started, nothing restarted or deleted.
// Its processes started by hand (srun, mpirun) refuse alike, exit 2 (not restarted). And a
// job whose training data is missing names the data, not the checkpoints.
TEST(Restart, AnEarlierRunsCheckpointsAreRefusedOnceBeforeAnythingStarts) {
  for (std::string algo : {"allreduce", "ps_async"}) {
    const std::string d = FreshDir("earlier_" + algo);
    const std::string job = Job("earlier", d, algo, 1, 2);
    JobRun first = RunJob(d, job, 300);
    ASSERT_EQ(first.exit_code, 0) << algo << first.stderr_text;
    const auto ckpt_before = Listing(d + "/ckpt");
    const std::string log_before = ReadAll(d + "/out/logs/worker-0.log");
    ASSERT_FALSE(ckpt_before.empty());

    JobRun again = RunJob(d, job, 120);
    EXPECT_EQ(again.exit_code, 2) << algo << again.stderr_text;
    EXPECT_EQ(Count(again.stderr_text, "holds checkpoints of an earlier run"), 1) << algo << again.stderr_text;
    EXPECT_EQ(Count(again.stderr_text, "\n"), 1) << algo << "one line:\n" << again.stderr_text;
    EXPECT_EQ(again.stderr_text.rfind("shoal: " + d + "/job.toml: [job] checkpoint_dir " + d + "/ckpt holds", 0), 0u)
        << again.stderr_text;
    for (const char* w : {"--resume", "--fresh", algo == "allreduce" ? "worker 1: " : "shard 0: "})
      EXPECT_NE(again.stderr_text.find(w), std::string::npos) << w << "\n" << again.stderr_text;
    EXPECT_EQ(again.stderr_text.find("restart"), std::string::npos) << again.stderr_text;
    EXPECT_EQ(ReadAll(d + "/out/logs/worker-0.log"), log_before) << algo << ": a worker was started";
    EXPECT_EQ(Listing(d + "/ckpt"), ckpt_before) << algo << ": the checkpoints changed";

    // The second line of defence: a process started without the launcher refuses with exit 2,
    // before it meets any other process (so it cannot hang on them).
    const std::string worker = BinDir() + "/worker/shoal-worker --config " + d + "/job.toml --rank 1";
    const std::string server = BinDir() + "/server/shoal-server --config " + d + "/job.toml --shard 0";
    const std::string out = d + "/process.txt";
    EXPECT_EQ(Exec(algo == "allreduce" ? worker : server, out, 60), 2) << ReadAll(out);
    EXPECT_NE(ReadAll(out).find("holds checkpoints of an earlier run"), std::string::npos) << ReadAll(out);

    // Missing data over full checkpoints: the data is named, and nothing else.
    std::string missing = job;
    missing.replace(missing.find("/usr/share/datasets/fashion-mnist/train"), 39, d + "/no-such/train");
    JobRun nodata = RunJob(d, missing, 60);
    EXPECT_EQ(nodata.exit_code, 2) << nodata.stderr_text;
    EXPECT_NE(nodata.stderr_text.find("[data] train = \"" + d + "/no-such/train\": no such file"), std::string::npos)
        << nodata.stderr_text;
    EXPECT_EQ(nodata.stderr_text.find("checkpoint"), std::string::npos) << nodata.stderr_text;
    EXPECT_EQ(ProcessesOf(d), 0);
  }
}

}  // namespace
}  // namespace testing
}  // namespace shoal
