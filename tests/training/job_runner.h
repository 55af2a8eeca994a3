// Runs whole jobs through the real launcher, servers and workers (separate processes on
// loopback) from a test, with a bounded wait; reads the done line and metrics.jsonl.
#pragma once
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace shoal {
namespace testing {

struct JobRun {
  int exit_code = -1;
  std::string stdout_text, stderr_text;
  std::string done_line;             // last stdout line
  std::vector<std::string> metrics;  // lines of metrics.jsonl
  std::string output_dir;
};

// Directory with the built binaries (runfiles root).
std::string BinDir();
// A fresh directory under the test's temp dir.
std::string FreshDir(const std::string& name);
// Writes `toml` to <dir>/job.toml and runs `shoal-launch` on it; killed after timeout_s.
JobRun RunJob(const std::string& dir, const std::string& toml, int timeout_s,
              const std::vector<std::string>& extra_args = {});
// A Fashion-MNIST job with the given algorithm/model/optimizer sections appended; `model` is a
// zoo name, or an ONNX file (a path ending in .onnx).
std::string FmnistJob(const std::string& name, const std::string& out_dir, int workers, const std::string& model,
                      int64_t train_samples, int epochs, const std::string& extra);
// `[cluster] servers = [...]` line with n fresh loopback ports.
std::string ServersLine(int n);
// Waits (bounded) until the job in `dir` has logged `train_events` train events, then
// sends `signal` (pkill's name for it) to its process started with `process` after the job file
// ("--rank 2", "--shard 1").
void KillWhenTraining(const std::string& dir, const std::string& process, int train_events,
                      const std::string& signal = "KILL");
// The same, once metrics.jsonl holds `count` events named `event` ("checkpoint", ...);
// false when that did not happen within timeout_s or no such process was there to kill.
bool KillWhenLogged(const std::string& dir, const std::string& process, const std::string& event, int count,
                    int timeout_s = 120, const std::string& signal = "KILL");
// A job run twice from `job(dir)`'s text (which must allow a restart): uninterrupted in
// <name>_whole, and in <name>_killed with `process` SIGKILLed once metrics.jsonl holds
// `checkpoints` checkpoint events. `failure` is empty when both exited 0, the killed run
// restarted exactly once and left no process behind; otherwise it says what went wrong.
struct WholeAndKilled {
  JobRun whole, killed;
  std::string failure;
};
WholeAndKilled RunWholeAndKilledAtCheckpoint(const std::string& name,
                                             const std::function<std::string(const std::string&)>& job, int timeout_s,
                                             const std::string& process = "--rank 1", int checkpoints = 1);
// How many events named `event` the job in `dir` has logged to metrics.jsonl so far.
int CountEvents(const std::string& dir, const std::string& event);
// Processes (pgrep -f) still running with this job's file on their command line.
int ProcessesOf(const std::string& dir);
// The ids of the job's processes started with `process` after the job file ("--rank 0"),
// as pgrep lists them (one a line; empty when none runs).
std::string PidsOf(const std::string& dir, const std::string& process);
// The little-endian floats of a file (export_weights writes them), as many as it holds whole.
std::vector<float> ReadFloats(const std::string& path);
// The metrics lines whose "event" is `event`.
std::vector<std::string> Events(const JobRun& r, const std::string& event);
// The weights_hash of every worker's end record: one value when a synchronous job's workers agree.
std::set<std::string> WeightsHashes(const JobRun& r);

}  // namespace testing
}  // namespace shoal
