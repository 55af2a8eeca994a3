// shoal-server's flags get shoal-worker's treatment: a bad one stops the server at once with
// exit code 2 (the launcher does not restart it) and a line naming the flag as typed; never
// gflags' own exit code 1, a port ZeroMQ wrapped round (--bind ...:99999 listened on 34463),
// or a silently ignored value (--bind= or a stray argument).
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/ps/ps_test_util.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace {

struct Outcome {
  int exit_code = -1;
  std::string output;
};

// Runs shard `flags` of a one-server job. A server that starts is stopped (SIGINT) once it
// says it listens; every wait is bounded.
Outcome RunServer(const std::string& flags) {
  const std::string dir = testing::FreshDir("server_flags");
  std::ofstream(dir + "/job.toml") << "[job]\nname = \"flags\"\noutput_dir = \"" << dir
                                   << "/out\"\n[cluster]\nworkers = 1\nservers = [\"127.0.0.1:" << testing::FreePort()
                                   << "\"]\n[model]\nname = \"mlp\"\n[data]\nformat = \"synthetic\"\n"
                                      "[algorithm]\nname = \"ps_sync\"\n[optimizer]\nname = \"sgd\"\nlr = 0.01\n";
  const std::string log = dir + "/log.txt";
  std::ofstream(dir + "/run.sh") << "timeout -s KILL 60 " << testing::BinDir() << "/server/shoal-server --config "
                                 << dir << "/job.toml " << flags << " > " << log << " 2>&1 &\npid=$!\n"
                                 << "for i in $(seq 300); do\n"
                                 << "  grep -q 'listening on' " << log << " && kill -INT $pid\n"
                                 << "  kill -0 $pid 2>/dev/null || break\n  sleep 0.1\ndone\nwait $pid\n";
  const int st = system(("bash " + dir + "/run.sh").c_str());
  Outcome o;
  o.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  o.output = ss.str();
  return o;
}

void ExpectRefused(const std::string& flags, const std::string& line) {
  SCOPED_TRACE(flags);
  Outcome o = RunServer(flags);
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find("shoal-server: " + line), std::string::npos) << o.output;
  EXPECT_EQ(o.output.find("listening on"), std::string::npos) << o.output;
}

TEST(ServerFlags, GoodFlagsServe) {
  Outcome o = RunServer("--shard=0 --noresume --bind 'tcp://127.0.0.1:*'");
  EXPECT_EQ(o.exit_code, 0) << o.output;
  EXPECT_NE(o.output.find("shard 0: listening on tcp://127.0.0.1:"), std::string::npos) << o.output;
}

// gflags exited 1 for these (a crash to the launcher, restarted over and over).
TEST(ServerFlags, MalformedValuesAndUnknownFlagsExitTwoNamingTheFlag) {
  ExpectRefused("--shard abc", "--shard abc: not a valid int32 value");
  ExpectRefused("--shard 99999999999", "--shard 99999999999: not a valid int32 value");
  ExpectRefused("--shard=", "--shard=: not a valid int32 value");
  ExpectRefused("--shard", "--shard: missing its value");
  ExpectRefused("--resume=maybe", "--resume=maybe: not a valid bool value");
  ExpectRefused("--shards 1", "--shards: unknown flag");
}

// Named as "shard -1 is not in [cluster] servers", as if the job file were wrong.
TEST(ServerFlags, AShardOutsideTheJobIsNamedAsTyped) {
  ExpectRefused("--shard -1", "--shard -1: ");
  ExpectRefused("--shard 1", "--shard 1: ");
  Outcome o = RunServer("--shard 1");
  EXPECT_NE(o.output.find("lists 1 server(s) in [cluster] servers (shards 0 to 0)"), std::string::npos) << o.output;
}

// ZeroMQ listened on port 99999 - 65536 and on 65536 - 5; an empty --bind and a stray
// argument were ignored; "host:port" without tcp:// said only "Invalid argument".
TEST(ServerFlags, BadBindAndStrayArgumentsAreRefused) {
  ExpectRefused("--bind tcp://127.0.0.1:99999", "--bind tcp://127.0.0.1:99999: expected tcp://HOST:PORT");
  ExpectRefused("--bind tcp://127.0.0.1:-5", "--bind tcp://127.0.0.1:-5: expected tcp://HOST:PORT");
  ExpectRefused("--bind 127.0.0.1:7000", "--bind 127.0.0.1:7000: expected tcp://HOST:PORT");
  ExpectRefused("--bind garbage", "--bind garbage: expected tcp://HOST:PORT");
  ExpectRefused("--bind=", "--bind is empty");
  ExpectRefused("--resume false", "unexpected argument 'false'");
}

// Refused only after the shard had bound its port and said it listened.
TEST(ServerFlags, RejoinWithoutResumeIsRefusedBeforeListening) {
  ExpectRefused("--rejoin", "--rejoin needs --resume: ");
  ExpectRefused("--rejoin --fresh", "--rejoin needs --resume, not --fresh: ");
}

}  // namespace
}  // namespace shoal
