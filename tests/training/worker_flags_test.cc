// shoal-worker's command-line overrides get the job file's checks: a bad one stops the
// worker at once with exit code 2 (not restarted by the launcher) and a line naming it,
// never a crash, a silently ignored value, or a keyless job taken off this machine; and
// what would fail at the end of a run (the export path) fails before it starts.
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/training/job_runner.h"

namespace shoal {
namespace {

struct Outcome {
  int exit_code = -1;
  std::string output;
};

// Runs one worker of a one-worker synthetic job with `flags` (and `job_keys` in [job],
// `data_keys` in [data]); bounded by timeout(1).
Outcome RunWorker(const std::string& flags, const std::string& job_keys = "", const std::string& data_keys = "") {
  const std::string dir = testing::FreshDir("worker_flags");
  std::ofstream(dir + "/job.toml") << "[job]\nname = \"flags\"\n"
                                   << job_keys << "\noutput_dir = \"" << dir
                                   << "/out\"\n[cluster]\nworkers = 1\n[model]\nname = \"mlp\"\n"
                                      "[data]\nformat = \"synthetic\"\nsynthetic_samples = 64\nbatch_size = 16\n"
                                   << data_keys
                                   << "\n[algorithm]\nname = \"local\"\n[optimizer]\nname = \"sgd\"\nlr = 0.01\n";
  const std::string cmd = "timeout -s KILL 60 " + testing::BinDir() + "/worker/shoal-worker --config " + dir +
                          "/job.toml --rank 0 " + flags + " > " + dir + "/log.txt 2>&1";
  const int st = system(cmd.c_str());
  Outcome o;
  o.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream in(dir + "/log.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  o.output = ss.str();
  return o;
}

void ExpectRefused(const std::string& flags, const std::string& names) {
  SCOPED_TRACE(flags);
  Outcome o = RunWorker(flags);
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find(names), std::string::npos) << o.output;
}

TEST(WorkerFlags, GoodOverridesRun) {
  Outcome o = RunWorker("--threads 1 --max_steps 2 --epochs 1 --batch_size 8");
  EXPECT_EQ(o.exit_code, 0) << o.output;
  EXPECT_NE(o.output.find("done after 2 steps"), std::string::npos) << o.output;
}

// --threads 100000 crashed the worker (SIGSEGV making threads); negative counts were ignored.
// A refused flag is named as the user typed it, with the job key it overrides (it was named
// only by the job key, as if the job file were wrong).
TEST(WorkerFlags, OutOfRangeCountsAreRefusedByName) {
  ExpectRefused("--threads 100000",
                "--threads (overriding [train] threads of the job file): expected an integer in [0, 1024], got 100000");
  ExpectRefused("--threads -5", "--threads (overriding [train] threads");
  ExpectRefused("--batch_size -4", "--batch_size (overriding [data] batch_size");
  ExpectRefused("--epochs -1", "--epochs (overriding [train] epochs");
  ExpectRefused("--rank -5", "--rank -5: expected a rank of 0 or more");
  ExpectRefused("--max_steps -7", "--max_steps (overriding [train] max_steps");
}

// gflags exited 1 for these (a crash to the launcher), and a stray argument was ignored.
TEST(WorkerFlags, MalformedValuesUnknownFlagsAndStrayArgumentsExitTwo) {
  ExpectRefused("--threads abc", "shoal-worker: --threads abc: not a valid int32 value");
  ExpectRefused("--rank=", "shoal-worker: --rank=: not a valid int32 value");
  ExpectRefused("--thread 2", "shoal-worker: --thread: unknown flag");
  ExpectRefused("--resume false", "shoal-worker: unexpected argument 'false'");
}

// --coordinator skipped the job file's host:port check (a bad port waited out the
// rendezvous timeout) and its plaintext policy (a keyless job's traffic left loopback).
TEST(WorkerFlags, CoordinatorFlagGetsTheJobFilesAddressChecks) {
  ExpectRefused("--coordinator 127.0.0.1:99999",
                "--coordinator (overriding [cluster] coordinator of the job file): expected \"host:port\" with port "
                "1-65535");
  ExpectRefused("--coordinator garbage", "--coordinator (overriding [cluster] coordinator");
  ExpectRefused("--coordinator 10.1.2.3:7700", "--coordinator (overriding [cluster] coordinator");
  ExpectRefused("--coordinator 10.1.2.3:7700", "allow_plaintext");
}

// An export path that cannot be written failed only after the whole run had trained.
TEST(WorkerStart, AnUnwritableExportPathStopsTheWorkerBeforeTraining) {
  const std::string dir = testing::FreshDir("export");
  for (const std::string key : {"export_weights", "export_onnx"})
    for (const std::string& path : {dir, dir + "/no/such/dir/w.bin"}) {
      SCOPED_TRACE(key + " = " + path);
      Outcome o = RunWorker("--max_steps 2", key + " = \"" + path + "\"");
      EXPECT_EQ(o.exit_code, 2) << o.output;
      EXPECT_NE(o.output.find("[job] " + key + " = \"" + path + "\""), std::string::npos) << o.output;
      EXPECT_EQ(o.output.find("test_accuracy"), std::string::npos) << o.output;
    }
  // 3x16x16 images, 10 classes: mlp has 768*256 + 256*256 + 256*10 weights and 522 biases.
  Outcome o =
      RunWorker("--max_steps 2", "export_weights = \"" + dir + "/w.bin\"\nexport_onnx = \"" + dir + "/model.onnx\"",
                "image_size = 16\nclasses = 10");
  EXPECT_EQ(o.exit_code, 0) << o.output;
  std::ifstream onnx(dir + "/model.onnx", std::ios::binary | std::ios::ate);
  EXPECT_TRUE(onnx && onnx.tellg() > 4 * (768 * 256 + 256 * 256 + 256 * 10 + 522)) << "mlp's weights, as ONNX";
}

// What only the machine or the files can refuse (a data file, a device) is the job's fault
// too: exit code 2, so `shoal run` does not restart a job that would fail the same way.
TEST(WorkerStart, MissingDataAndMissingDevicesAreInputErrors) {
  const std::string dir = testing::FreshDir("input_errors");
  Outcome o = RunWorker("--device cuda:9");
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find("worker 0"), std::string::npos) << o.output;

  const std::string job =
      "[job]\nname = \"nodata\"\nmax_restarts = 2\n[cluster]\nworkers = 2\n[model]\nname = \"mlp\"\n"
      "[data]\nformat = \"idx\"\ntrain = \"" +
      dir + "/no/such/train\"\ntest = \"" + dir +
      "/no/such/test\"\nbatch_size = 16\n[algorithm]\nname = \"allreduce\"\n"
      "[optimizer]\nname = \"sgd\"\nlr = 0.01\n";
  // `shoal run` names the missing data itself, before starting anything.
  testing::JobRun r = testing::RunJob(dir, job, 60);
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("[data] train = \"" + dir + "/no/such/train\": no such file"), std::string::npos)
      << r.stderr_text;
  EXPECT_EQ(r.stderr_text.find("restart 1 of"), std::string::npos) << r.stderr_text;
  // A worker started by hand (srun, mpirun) refuses it too, with exit code 2.
  std::ofstream(dir + "/job.toml") << job;
  const int rc = system(("timeout -s KILL 60 " + testing::BinDir() + "/worker/shoal-worker --config " + dir +
                         "/job.toml --rank 0 > " + dir + "/worker.txt 2>&1")
                            .c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 2) << rc;
}

}  // namespace
}  // namespace shoal
