#include "tests/training/job_runner.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/json_fields.h"
#include "common/metrics.h"
#include "tests/ps/ps_test_util.h"

namespace shoal {
namespace testing {

std::string BinDir() {
  const char* src = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  if (src && ws) return std::string(src) + "/" + ws;
  return "bazel-bin";
}

std::string FreshDir(const std::string& name) {
  static int n = 0;
  const char* tmp = getenv("TEST_TMPDIR");
  std::string d =
      std::string(tmp ? tmp : "/tmp") + "/" + name + "_" + std::to_string(getpid()) + "_" + std::to_string(n++);
  MakeDirs(d);
  return d;
}

JobRun RunJob(const std::string& dir, const std::string& toml, int timeout_s,
              const std::vector<std::string>& extra_args) {
  JobRun r;
  std::string job = dir + "/job.toml";
  std::ofstream(job) << toml;
  std::string cmd = "timeout -s KILL " + std::to_string(timeout_s) + " " + BinDir() +
                    "/tools/launcher/shoal-launch --bin_dir=" + BinDir() + " " + job;
  for (auto& a : extra_args) cmd += " " + a;
  cmd += " > " + dir + "/stdout.txt 2> " + dir + "/stderr.txt";
  int st = system(cmd.c_str());
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.stdout_text = ReadFile(dir + "/stdout.txt");
  r.stderr_text = ReadFile(dir + "/stderr.txt");
  std::istringstream out(r.stdout_text);
  std::string line;
  while (std::getline(out, line))
    if (!line.empty()) r.done_line = line;
  r.output_dir = dir + "/out";
  std::ifstream m(r.output_dir + "/metrics.jsonl");
  while (std::getline(m, line)) r.metrics.push_back(line);
  return r;
}

std::string FmnistJob(const std::string& name, const std::string& out_dir, int workers, const std::string& model,
                      int64_t train_samples, int epochs, const std::string& extra) {
  std::ostringstream s;
  s << "[job]\nname = \"" << name << "\"\nseed = 42\noutput_dir = \"" << out_dir << "\"\n\n"
    << "[cluster]\n"
    << (extra.find("ps_") != std::string::npos ? ServersLine(2) : "") << "workers = " << workers << "\n\n"
    << "[model]\n"
    << (model.size() > 5 && model.substr(model.size() - 5) == ".onnx" ? "onnx" : "name") << " = \"" << model << "\"\n\n"
    << "[data]\nformat = \"idx\"\ntrain = \"/usr/share/datasets/fashion-mnist/train\"\n"
    << "test = \"/usr/share/datasets/fashion-mnist/t10k\"\nbatch_size = 32\n"
    << "max_train_samples = " << train_samples << "\nmax_test_samples = 2000\n\n"
    << "[train]\nepochs = " << epochs << "\nthreads = 1\nlog_every_steps = 20\n\n"
    << extra;
  return s.str();
}

std::string ServersLine(int n) {
  std::string s = "servers = [";
  for (int i = 0; i < n; ++i) s += std::string(i ? ", " : "") + "\"127.0.0.1:" + std::to_string(FreePort()) + "\"";
  return s + "]\n";
}

int CountEvents(const std::string& dir, const std::string& event) {
  std::ifstream m(dir + "/out/metrics.jsonl");
  std::string l;
  int n = 0;
  while (std::getline(m, l)) n += l.find("\"event\":\"" + event + "\"") != std::string::npos;
  return n;
}

bool KillWhenLogged(const std::string& dir, const std::string& process, const std::string& event, int count,
                    int timeout_s, const std::string& signal) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (CountEvents(dir, event) < count) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // "[g]": the pattern must not match the shell that runs pkill.
  std::string cmd = "pkill -" + signal + " -f -- '--confi[g] " + dir + "/job.toml " + process + "'";
  return system(cmd.c_str()) == 0;  // pkill: 0 when it signalled a process
}

void KillWhenTraining(const std::string& dir, const std::string& process, int train_events, const std::string& signal) {
  KillWhenLogged(dir, process, "train", train_events, 120, signal);
}

WholeAndKilled RunWholeAndKilledAtCheckpoint(const std::string& name,
                                             const std::function<std::string(const std::string&)>& job, int timeout_s,
                                             const std::string& process, int checkpoints) {
  WholeAndKilled r;
  const std::string a = FreshDir(name + "_whole"), b = FreshDir(name + "_killed");
  r.whole = RunJob(a, job(a), timeout_s);
  if (r.whole.exit_code != 0) {
    r.failure = "the uninterrupted run exited " + std::to_string(r.whole.exit_code) + ":\n" + r.whole.stderr_text;
    return r;
  }
  bool killed = false;
  std::thread killer([&] { killed = KillWhenLogged(b, process, "checkpoint", checkpoints); });
  r.killed = RunJob(b, job(b), timeout_s);
  killer.join();
  if (!killed)
    r.failure = "no process \"" + process + "\" was killed after " + std::to_string(checkpoints) + " checkpoint(s)";
  else if (r.killed.exit_code != 0)
    r.failure = "the killed run exited " + std::to_string(r.killed.exit_code) + ":\n" + r.killed.stderr_text;
  else if (Events(r.killed, "restart").size() != 1)
    r.failure = "the killed run restarted " + std::to_string(Events(r.killed, "restart").size()) +
                " times, not once:\n" + r.killed.stderr_text;
  else if (ProcessesOf(b) != 0)
    r.failure = std::to_string(ProcessesOf(b)) + " process(es) of the killed run still running";
  return r;
}

int ProcessesOf(const std::string& dir) {
  std::string cmd = "pgrep -c -f -- '--confi[g] " + dir + "/job.toml' 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  int n = 0;
  if (fscanf(p, "%d", &n) != 1) n = 0;
  pclose(p);
  return n;
}

std::string PidsOf(const std::string& dir, const std::string& process) {
  std::string cmd = "pgrep -f -- '--confi[g] " + dir + "/job.toml " + process + "( |$)' 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  return out;
}

std::vector<std::string> Events(const JobRun& r, const std::string& event) {
  std::vector<std::string> out;
  for (auto& l : r.metrics)
    if (JsonField(l, "event").value_or("") == event) out.push_back(l);
  return out;
}

std::set<std::string> WeightsHashes(const JobRun& r) {
  std::set<std::string> h;
  for (auto& e : Events(r, "end")) h.insert(JsonField(e, "weights_hash").value_or("?"));
  return h;
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<float> v;
  float x;
  while (in.read(reinterpret_cast<char*>(&x), 4)) v.push_back(x);
  return v;
}

}  // namespace testing
}  // namespace shoal
