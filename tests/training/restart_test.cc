// What `shoal run` refuses before starting anything, and how it restarts: real launcher,
// servers and workers on loopback, bounded waits. An earlier run's checkpoints are refused
// once, by the launcher, and never restarted over (a restart with --fresh deleted them); a
// missing data file is named before the checkpoints; deaths in one reap count against
// max_restarts together; a restart asks the checkpoint stores, not the log, whether a
// complete checkpoint exists. The processes' own labels: exit 2 only for the job's input.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

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

// Every file under `dir` (RocksDB's info logs too: the launcher only reads), with its size
// and modification time.
std::map<std::string, std::string> Listing(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
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

// The launcher's process id for the job in `dir` (0 when none).
pid_t LauncherOf(const std::string& dir) {
  FILE* p = popen(("pgrep -f -- 'shoal-launc[h] .*" + dir + "/job.toml'").c_str(), "r");
  if (!p) return 0;
  int pid = 0;
  if (fscanf(p, "%d", &pid) != 1) pid = 0;
  pclose(p);
  return pid_t(pid);
}

// Process `pid`'s state letter (R, S, T stopped, Z ended and not yet reaped); 0 when gone.
char State(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() ? stat[paren + 2] : 0;
}
bool Ended(const std::string& pid) { return State(pid) == 0 || State(pid) == 'Z'; }

// Both workers of an asynchronous PS job die at once (the launcher is held stopped while
// they die) with one restart left: the launcher restarted each alone ("restart 2 of 1");
// now the two deaths are one failure and the job restarts once, as a whole. (The launcher
// may be stopped between two of its waitpid calls, so the two ends can straddle two reaps:
// its short wait after a death gathers them.)
TEST(Restart, DeathsInOneReapCountAgainstMaxRestartsTogether) {
  const std::string d = FreshDir("one_reap");
  bool killed = false;
  std::thread killer([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (CountEvents(d, "checkpoint") < 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // The launcher reads metrics.jsonl every 100 ms: it knows of the checkpoint (so each
    // worker could be restarted alone) before it is held.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    pid_t launcher = 0;
    while (!(launcher = LauncherOf(d)) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::string w0 = PidsOf(d, "--rank 0"), w1 = PidsOf(d, "--rank 1");
    if (!launcher || w0.empty() || w1.empty()) return;
    w0 = w0.substr(0, w0.find('\n'));
    w1 = w1.substr(0, w1.find('\n'));
    kill(launcher, SIGSTOP);
    while (State(std::to_string(launcher)) != 'T' && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    kill(pid_t(std::stoi(w0)), SIGKILL);
    kill(pid_t(std::stoi(w1)), SIGKILL);
    while (!(Ended(w0) && Ended(w1)) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    kill(launcher, SIGCONT);
    killed = true;
  });
  // 30 epochs (1,500 steps, several seconds): with 4 the job once ended within the killer's 500 ms.
  JobRun run = RunJob(d, Job("one_reap", d, "ps_async", 30, 1), 300);
  killer.join();
  ASSERT_TRUE(killed) << run.stderr_text;
  EXPECT_EQ(run.stderr_text.find("restart 2 of 1"), std::string::npos) << run.stderr_text;
  auto restarts = Events(run, "restart");
  ASSERT_EQ(restarts.size(), 1u) << run.stderr_text;
  EXPECT_FALSE(JsonField(restarts[0], "alone")) << restarts[0] << run.stderr_text;
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(ProcessesOf(d), 0);
}

// Rank 0 dies after every worker wrote checkpoint 20 but before it logged it: the launcher,
// reading only the log, restarted with --fresh and deleted that complete checkpoint. It asks
// the stores now, and the job resumes from it.
TEST(Restart, ACompleteCheckpointNobodyLoggedIsResumedNotDeleted) {
  const std::string d = FreshDir("unlogged");
  setenv("SHOAL_FAILPOINT_DIE_BEFORE_CHECKPOINT_LOG", (d + "/died").c_str(), 1);
  JobRun run = RunJob(d, Job("unlogged", d, "allreduce", 2, 1), 300);
  unsetenv("SHOAL_FAILPOINT_DIE_BEFORE_CHECKPOINT_LOG");
  ASSERT_TRUE(std::filesystem::exists(d + "/died")) << run.stderr_text;
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("restart 1 of 1 after worker 0 exit code 1: every process starts again from "
                                 "checkpoint 20 (step 20)"),
            std::string::npos)
      << run.stderr_text;
  auto resumes = Events(run, "resume");
  ASSERT_EQ(resumes.size(), 2u) << run.stderr_text;
  for (auto& e : resumes) EXPECT_EQ(JsonNumber(e, "step").value_or(-1), 20) << e;
  EXPECT_EQ(JsonNumber(run.done_line, "steps").value_or(0), 100) << run.done_line;
}

// --fresh, and shard 0 fails before it opened (and so deleted) its checkpoints: its port is
// taken. The restart that follows must not take the earlier run's complete checkpoint, still
// in shard 0's folder, for this launch's: the user chose to discard it (and shard 1 has
// already deleted its part). It starts from the beginning again.
TEST(Restart, AFreshRunNeverResumesTheRunItWasToldToDiscard) {
  const std::string d = FreshDir("fresh_discard");
  const std::string job = Job("fresh_discard", d, "ps_async", 1, 1);
  JobRun first = RunJob(d, job, 300);
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  const size_t at = job.find("127.0.0.1:") + 10;
  const int port = std::stoi(job.substr(at, job.find('"', at) - at));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  // not held open by the job's processes
  const int one = 1;  // the first run's connections may hold the port in TIME_WAIT
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << "port " << port;
  ASSERT_EQ(listen(fd, 1), 0);
  std::thread release([&] {
    // Free the port once shard 0 has failed on it, before the launcher restarts the job.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (ReadAll(d + "/out/logs/server-0.log").find("could not start") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    close(fd);
  });
  JobRun run = RunJob(d, job, 300, {"--fresh"});
  release.join();
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("restart 1 of 1 after server 0 exit code 1: every process starts again from the "
                                 "start (no complete checkpoint yet)"),
            std::string::npos)
      << run.stderr_text;
  EXPECT_TRUE(Events(run, "resume").empty()) << run.stderr_text;
}

// shoal-server exits 2 ("bad input", never restarted) only for the job's input: a shard that
// cannot reach shard 0 to ask for the complete checkpoint (here: nobody listens there) fails
// with exit 1, which a launcher may restart.
TEST(Restart, AShardThatCannotReachShardZeroIsNotBadInput) {
  const std::string d = FreshDir("no_shard0");
  std::ofstream(d + "/job.toml") << Job("no_shard0", d, "ps_async", 1, 0);
  const std::string out = d + "/server.txt";
  const int rc = Exec(BinDir() + "/server/shoal-server --config " + d + "/job.toml --shard 1 --resume", out, 120);
  EXPECT_EQ(rc, 1) << ReadAll(out);
  EXPECT_NE(ReadAll(out).find("shoal-server: shard 1 could not start:"), std::string::npos) << ReadAll(out);
}

// A data file that opens but fails to read (EIO: /proc/self/mem at offset 0) is the
// machine's failure, not the job's: the worker exits 1 (a launcher may restart it), not 2.
TEST(Restart, AWorkersReadErrorIsNotBadInput) {
  const std::string d = FreshDir("eio");
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"})
    std::filesystem::create_symlink("/proc/self/mem", d + "/" + f);
  std::string job = Job("eio", d, "allreduce", 1, 0);
  job.replace(job.find("/usr/share/datasets/fashion-mnist/train"), 39, d + "/train");
  job.replace(job.find("workers = 2"), 11, "workers = 1");
  std::ofstream(d + "/job.toml") << job;
  const std::string out = d + "/worker.txt";
  const int rc = Exec(BinDir() + "/worker/shoal-worker --config " + d + "/job.toml --rank 0", out, 60);
  EXPECT_EQ(rc, 1) << ReadAll(out);
  EXPECT_NE(ReadAll(out).find("read error: Input/output error"), std::string::npos) << ReadAll(out);
}

// `shoal checkpoints JOB.toml` (shoal-launch --checkpoint_state), which a requeued sbatch job
// asks before it starts its tasks with --resume or --fresh: "none" only when every folder is
// here and none holds a complete checkpoint.
TEST(Restart, CheckpointStateSaysWhatTheFoldersHold) {
  const std::string d = FreshDir("state");
  auto state = [&](const std::string& job) {
    std::ofstream(d + "/state.toml") << job;
    const std::string out = d + "/state.txt";
    EXPECT_EQ(Exec(BinDir() + "/tools/launcher/shoal-launch --checkpoint_state " + d + "/state.toml", out, 60), 0)
        << ReadAll(out);
    return ReadAll(out);
  };
  std::string job = Job("state", d, "allreduce", 1, 0);
  EXPECT_EQ(state(job), "unknown: worker 0's folder " + d + "/ckpt/worker-0 is not on this machine\n");
  std::string never = job;
  never.replace(never.find("checkpoint_every_steps = 20"), 27, "checkpoint_every_steps = 1000");
  JobRun empty = RunJob(d, never, 300);
  ASSERT_EQ(empty.exit_code, 0) << empty.stderr_text;
  EXPECT_EQ(state(job), "none\n");
  JobRun full = RunJob(d, job, 300);
  ASSERT_EQ(full.exit_code, 0) << full.stderr_text;
  EXPECT_EQ(state(job), "complete 40 40\n");
  std::string off = job;
  off.erase(off.find("checkpoint_dir"), off.find('\n', off.find("checkpoint_dir")) - off.find("checkpoint_dir") + 1);
  EXPECT_EQ(state(off), "off\n");
}

}  // namespace
}  // namespace testing
}  // namespace shoal
