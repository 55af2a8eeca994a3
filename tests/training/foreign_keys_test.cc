// Two real worker processes of one job, the second holding another job's [security] keys:
// the bound side (rank 0, which hosts the coordinator) takes nothing from it and trains no
// step, and the refused worker's error says its CURVE handshake with the coordinator's
// address failed and asks about the keys, for a ring job and a gossip job alike.
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/transport/transport.h"
#include "tests/ps/ps_test_util.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace {

std::string Keys() {
  auto server = CurveKeyPair(), client = CurveKeyPair();
  return "[security]\nserver_public_key = \"" + server.first + "\"\nserver_secret_key = \"" + server.second +
         "\"\nclient_public_key = \"" + client.first + "\"\nclient_secret_key = \"" + client.second + "\"\n";
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct PairRun {
  std::string dir, coordinator;
  int foreign_exit = -1;
};

// Rank 0 with the job's keys, then rank 1 with another job's; rank 0 is killed once rank 1
// has given up (it would wait out its own rendezvous timeout for rank 1).
PairRun RunPair(const std::string& algorithm) {
  PairRun r;
  r.dir = testing::FreshDir("foreign_" + algorithm);
  r.coordinator = "127.0.0.1:" + std::to_string(testing::FreePort());
  const std::string job = "[job]\nname = \"foreign\"\noutput_dir = \"" + r.dir +
                          "/out\"\n[cluster]\nworkers = 2\ncoordinator = \"" + r.coordinator +
                          "\"\n[model]\nname = \"mlp\"\n[data]\nformat = \"synthetic\"\nsynthetic_samples = 64\n"
                          "batch_size = 16\nimage_size = 8\nclasses = 4\n[algorithm]\nname = \"" +
                          algorithm + "\"\n[optimizer]\nname = \"sgd\"\nlr = 0.01\n[train]\nthreads = 1\n";
  std::ofstream(r.dir + "/job.toml") << job << Keys();
  std::ofstream(r.dir + "/other.toml") << job << Keys();
  const std::string bin = testing::BinDir() + "/worker/shoal-worker";
  const std::string cmd = "cd " + r.dir + " && { " + bin + " --config job.toml --rank 0 > r0.log 2>&1 & P=$!; " +
                          "timeout -s KILL 60 " + bin + " --config other.toml --rank 1 > r1.log 2>&1; echo $? > r1.rc; " +
                          "kill -KILL $P; wait $P; } 2> /dev/null";
  (void)system(cmd.c_str());
  r.foreign_exit = std::stoi("0" + Read(r.dir + "/r1.rc"));
  return r;
}

TEST(ForeignKeys, ARingAndAGossipWorkerWithAnotherJobsKeysIsToldWhyAndTakesNoPart) {
  PairRun runs[2];
  std::thread gossip([&] { runs[1] = RunPair("adpsgd"); });
  runs[0] = RunPair("allreduce");
  gossip.join();
  for (const PairRun& r : runs) {
    SCOPED_TRACE(r.dir);
    const std::string foreign = Read(r.dir + "/r1.log"), member = Read(r.dir + "/r0.log");
    EXPECT_EQ(r.foreign_exit, 1) << foreign;
    EXPECT_NE(foreign.find("the CURVE handshake with tcp://" + r.coordinator + " failed"), std::string::npos)
        << foreign;
    EXPECT_NE(foreign.find("[security] keys"), std::string::npos) << foreign;
    // The bound side took nothing from it: no step was trained, no run finished.
    EXPECT_EQ(member.find("done after"), std::string::npos) << member;
    EXPECT_EQ(Read(r.dir + "/out/metrics.jsonl").find("\"event\":\"train\""), std::string::npos);
  }
}

}  // namespace
}  // namespace shoal
