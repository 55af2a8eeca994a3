// `shoal run`'s status page on a real job (launcher, two workers, one slowed 6x): the
// /status.json rows and straggler flag while it runs, the page rendered by headless
// Chromium (DOM and a screenshot kept among the test outputs), hostile HTTP clients that do
// not harm the job, the straggler events in metrics.jsonl, and one progress line per step.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/json_fields.h"
#include "tests/ps/ps_test_util.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

using Clock = std::chrono::steady_clock;

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  timeval tv{10, 0};  // every read and write below is bounded
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends until it closes (or 10 s pass without a byte).
std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, size_t(n));
  return out;
}

// One raw request; the whole response ("" when the connection failed).
std::string Raw(int port, const std::string& request) {
  int fd = Connect(port);
  if (fd < 0) return "";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string r = ReadAll(fd);
  close(fd);
  return r;
}

std::string Body(const std::string& response) {
  size_t p = response.find("\r\n\r\n");
  return p == std::string::npos ? "" : response.substr(p + 4);
}

std::string StatusJson(int port) { return Body(Raw(port, "GET /status.json HTTP/1.1\r\nHost: x\r\n\r\n")); }

// The flat object of worker `rank` inside status.json's "workers" array.
std::string WorkerRow(const std::string& json, int rank) {
  size_t p = json.find("{\"rank\":" + std::to_string(rank) + ",\"host\"");
  if (p == std::string::npos) return "";
  return json.substr(p, json.find('}', p) - p + 1);
}

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// Points on status.json's accuracy curve (the last "test_accuracy" key: curves come last).
int AccuracyPoints(const std::string& json) {
  size_t p = json.rfind("\"test_accuracy\":[");
  if (p == std::string::npos || json.compare(p + 16, 2, "[]") == 0) return 0;
  return 1 + Count(json.substr(p), "],[");
}

// One job for every test of the suite, started once and stopped at the end.
class StatusPage : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(FreshDir("status_page"));
    std::string toml = FmnistJob("status", *dir_ + "/out", 2, "lenet", 1280, 1000,
                                 "[algorithm]\nname = \"allreduce\"\n\n[optimizer]\nname = \"momentum\"\nlr = 0.02\n");
    // Rank 0 takes 6x its compute, so rank 1 is named only if the machine's load slows its
    // compute 9x more than rank 0's in one window (at 4x, a loaded suite once named it).
    toml.replace(toml.find("workers = 2"), 11, "workers = [{slowdown = 5.0}, {}]");
    toml.replace(toml.find("log_every_steps = 20"), 20, "log_every_steps = 4");
    toml.replace(toml.find("max_test_samples = 2000"), 23, "max_test_samples = 500");
    // A fixed power-of-two scale changes no bit of the training and shows on the page.
    toml.replace(toml.find("name = \"lenet\""), 14, "name = \"lenet\"\nloss_scale = 1024");
    std::ofstream(*dir_ + "/job.toml") << toml;
    launcher_ = fork();
    if (launcher_ == 0) {
      int out = open((*dir_ + "/stdout.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = open((*dir_ + "/stderr.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(out, 1);
      dup2(err, 2);
      std::string bin = BinDir() + "/tools/launcher/shoal-launch", flag = "--bin_dir=" + BinDir(),
                  job = *dir_ + "/job.toml";
      execl(bin.c_str(), bin.c_str(), flag.c_str(), job.c_str(), nullptr);
      _exit(127);
    }
    // The URL the launcher prints when the job starts.
    auto deadline = Clock::now() + std::chrono::seconds(60);
    std::smatch m;
    std::regex url("status page: http://127\\.0\\.0\\.1:([0-9]+)/");
    while (Clock::now() < deadline) {
      std::string err = ReadFile(*dir_ + "/stderr.txt");
      if (std::regex_search(err, m, url)) {
        port_ = std::stoi(m[1]);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  static void TearDownTestSuite() {
    if (launcher_ > 0) {
      kill(launcher_, SIGINT);  // the launcher stops every process of the job
      int st = 0;
      auto deadline = Clock::now() + std::chrono::seconds(30);
      while (waitpid(launcher_, &st, WNOHANG) == 0 && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (Clock::now() >= deadline) {
        kill(launcher_, SIGKILL);  // its children die with it (PR_SET_PDEATHSIG)
        waitpid(launcher_, &st, 0);
      }
    }
    for (int i = 0; i < 100 && ProcessesOf(*dir_) > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(ProcessesOf(*dir_), 0) << "processes of the job left behind";
  }

  // status.json once `ready` holds for it (bounded); "" when it never did.
  static std::string WaitForStatus(const std::function<bool(const std::string&)>& ready, int timeout_s = 120) {
    auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    while (Clock::now() < deadline) {
      std::string j = StatusJson(port_);
      if (!j.empty() && ready(j)) return j;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return "";
  }

  static std::string* dir_;
  static pid_t launcher_;
  static int port_;
};
std::string* StatusPage::dir_ = nullptr;
pid_t StatusPage::launcher_ = -1;
int StatusPage::port_ = 0;

TEST_F(StatusPage, StatusJsonHasARowPerWorkerAndFlagsTheSlowedOne) {
  ASSERT_GT(port_, 0) << "no status page URL on the launcher's stderr:\n" << ReadFile(*dir_ + "/stderr.txt");
  std::string j = WaitForStatus([](const std::string& s) {
    return WorkerRow(s, 0).find("\"straggler\":true") != std::string::npos && AccuracyPoints(s) >= 1;
  });
  ASSERT_FALSE(j.empty()) << "rank 0 never flagged, or no evaluation; last status: " << StatusJson(port_) << "\n"
                          << ReadFile(*dir_ + "/stderr.txt");
  EXPECT_EQ(JsonField(j, "job").value_or(""), "status");
  EXPECT_EQ(JsonField(j, "algorithm").value_or(""), "allreduce");
  EXPECT_EQ(JsonField(j, "state").value_or(""), "running");
  EXPECT_GT(JsonNumber(j, "bytes_sent").value_or(0), 0);
  for (int r : {0, 1}) {
    std::string row = WorkerRow(j, r);
    ASSERT_FALSE(row.empty()) << j;
    EXPECT_EQ(JsonField(row, "host").value_or(""), "127.0.0.1");
    EXPECT_EQ(JsonField(row, "device").value_or(""), "cpu");
    EXPECT_EQ(JsonNumber(row, "batch_size").value_or(0), 32);
    EXPECT_GT(JsonNumber(row, "samples_per_s").value_or(0), 0) << row;
    for (const char* k : {"compute_ms", "exchange_ms", "wait_ms", "step_ms", "slower"})
      EXPECT_TRUE(JsonNumber(row, k).has_value()) << k << " in " << row;
  }
  EXPECT_EQ(JsonField(WorkerRow(j, 0), "straggler").value_or(""), "true");
  EXPECT_EQ(JsonField(WorkerRow(j, 1), "straggler").value_or(""), "false");
  EXPECT_TRUE(JsonNumber(WorkerRow(j, 0), "straggler_since_step").has_value());
  // The slowed worker's time goes to compute; the other waits for it in the exchange.
  EXPECT_GT(JsonNumber(WorkerRow(j, 0), "compute_ms").value_or(0),
            JsonNumber(WorkerRow(j, 1), "compute_ms").value_or(0));
  EXPECT_GT(JsonNumber(WorkerRow(j, 1), "exchange_ms").value_or(0),
            JsonNumber(WorkerRow(j, 0), "exchange_ms").value_or(0));
}

TEST_F(StatusPage, HostileClientsDoNotHarmTheJobOrThePage) {
  ASSERT_GT(port_, 0);
  const double step0 = JsonNumber(StatusJson(port_), "step").value_or(-1);
  EXPECT_EQ(Raw(port_, std::string("\x00\xff\x13 garbage\r\n\r\n", 15)).rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(Raw(port_, "POST /status.json HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(Raw(port_, "GET /../../etc/passwd HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  std::string head = Raw(port_, "HEAD / HTTP/1.0\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(Body(head), "");
  // A huge request head: refused once it passes the limit (or the connection is cut while
  // we still send), never buffered whole.
  std::string huge = "GET / HTTP/1.1\r\nX: " + std::string(1 << 20, 'a');
  std::string r = Raw(port_, huge);
  EXPECT_TRUE(r.empty() || r.rfind("HTTP/1.1 431", 0) == 0) << r.substr(0, 80);
  // Slow clients: a half request trickling in, and more idle connections than the server
  // keeps; the server closes them by its deadline.
  int slow = Connect(port_);
  ASSERT_GE(slow, 0);
  send(slow, "GET /status.json HTTP/1.1\r\n", 27, MSG_NOSIGNAL);
  std::vector<int> idle;
  for (int i = 0; i < 80; ++i) idle.push_back(Connect(port_));
  auto t0 = Clock::now();
  for (int i = 0; i < 30; ++i) {
    send(slow, "X", 1, MSG_NOSIGNAL);  // one byte at a time, never the end of the head
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  char c;
  EXPECT_EQ(recv(slow, &c, 1, 0), 0) << "the slow client was not cut off";
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(20));  // recv is bounded at 10 s anyway
  close(slow);
  for (int fd : idle)
    if (fd >= 0) close(fd);
  // The page answers again and the job kept training all along.
  std::string j = WaitForStatus([&](const std::string& s) { return JsonNumber(s, "step").value_or(-1) > step0; }, 60);
  EXPECT_FALSE(j.empty()) << "the job made no progress after the hostile clients";
  std::string page = Raw(port_, "GET / HTTP/1.1\r\n\r\n");
  EXPECT_EQ(page.rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_NE(page.find("<tbody id=\"worker-rows\">"), std::string::npos);
}

std::string Chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

// Runs headless Chromium on `url` with `args`; its stdout.
std::string RunChromium(const std::string& url, const std::string& args) {
  static int n = 0;
  std::string profile = FreshDir("chromium-profile-" + std::to_string(n++));
  std::string out = profile + ".out";
  std::string cmd = "HOME=" + profile + " timeout -s KILL 60 " + Chromium() +
                    " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run"
                    " --disable-background-networking --disable-component-update --disable-sync"
                    " --disable-dev-shm-usage --user-data-dir=" +
                    profile + " " + args + " " + url + " > " + out + " 2> " + profile + ".err";
  int rc = system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd << "\n" << ReadFile(profile + ".err");
  return ReadFile(out);
}

TEST_F(StatusPage, ChromiumRendersTheRowsAndCurves) {
  ASSERT_GT(port_, 0);
  ASSERT_FALSE(Chromium().empty())
      << "chromium is not installed: the status page test renders the page in headless Chromium; install it with "
         "`apt-get install -y chromium` (./shoal test installs it)";
  // Wait until the page has something to draw: a straggler named and an evaluation.
  ASSERT_FALSE(WaitForStatus([](const std::string& s) {
                 return s.find("\"straggler\":true") != std::string::npos && AccuracyPoints(s) >= 1;
               }).empty());
  const std::string url = "http://127.0.0.1:" + std::to_string(port_) + "/";
  std::string dom = RunChromium(url, "--virtual-time-budget=5000 --dump-dom");
  EXPECT_EQ(Count(dom, "<tr id=\"worker-"), 2) << dom;
  EXPECT_NE(dom.find("<tr id=\"worker-0\" class=\"worker straggler\""), std::string::npos) << dom;
  EXPECT_NE(dom.find("<tr id=\"worker-1\" class=\"worker\""), std::string::npos) << dom;
  EXPECT_NE(dom.find("straggler since step"), std::string::npos);
  std::smatch m;
  EXPECT_TRUE(std::regex_search(dom, m, std::regex("<path id=\"loss-curve\"[^>]* d=\"M[0-9.]+ [0-9.]+ L")))
      << "no loss curve with two points or more";
  EXPECT_TRUE(std::regex_search(dom, m, std::regex("<path id=\"acc-curve\"[^>]* d=\"M[0-9.]+ [0-9.]+")))
      << "no accuracy curve";
  EXPECT_NE(dom.find("shoal job status"), std::string::npos);
  EXPECT_NE(dom.find("allreduce"), std::string::npos);
  EXPECT_NE(dom.find("worker 1 loss scale</th><td class=\"l\">2^10, 0 steps skipped"), std::string::npos) << dom;

  const char* outputs = getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  std::string png = std::string(outputs ? outputs : *dir_) + "/status_page.png";
  RunChromium(url, "--virtual-time-budget=5000 --window-size=1100,820 --hide-scrollbars --screenshot=" + png);
  std::string bytes = ReadFile(png);
  ASSERT_GT(bytes.size(), 1000u) << png;
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
}

TEST_F(StatusPage, StragglerEventsNameOnlyTheSlowedWorker) {
  ASSERT_GT(port_, 0);
  ASSERT_FALSE(
      WaitForStatus([](const std::string& s) { return s.find("\"straggler\":true") != std::string::npos; }).empty());
  std::ifstream m(*dir_ + "/out/metrics.jsonl");
  std::string line;
  int named = 0;
  while (std::getline(m, line)) {
    if (JsonField(line, "event").value_or("") != "straggler") continue;
    ++named;
    EXPECT_EQ(JsonNumber(line, "rank").value_or(-1), 0) << line;
    EXPECT_EQ(JsonField(line, "host").value_or(""), "127.0.0.1");
    EXPECT_GT(JsonNumber(line, "slower").value_or(0), 1.5) << line;
    EXPECT_TRUE(JsonNumber(line, "since_step").has_value());
    EXPECT_TRUE(JsonNumber(line, "since_wall_s").has_value());
  }
  EXPECT_GE(named, 1);
  EXPECT_NE(ReadFile(*dir_ + "/stderr.txt").find("shoal: worker 0 (127.0.0.1, cpu) is a straggler: "),
            std::string::npos);
}

TEST_F(StatusPage, OneProgressLinePerStep) {
  ASSERT_GT(port_, 0);
  // Two evaluations at least, each made by both workers.
  ASSERT_FALSE(WaitForStatus([](const std::string& s) { return AccuracyPoints(s) >= 2; }).empty());
  std::istringstream err(ReadFile(*dir_ + "/stderr.txt"));
  std::string line;
  std::map<std::string, int> steps;
  int evals = 0;
  std::regex progress("^epoch [0-9]+ step ([0-9]+) ");
  std::smatch m;
  while (std::getline(err, line))
    if (std::regex_search(line, m, progress)) {
      ++steps[m[1]];
      evals += line.find("test_acc -") == std::string::npos;
    }
  EXPECT_GE(evals, 2);
  for (auto& [step, n] : steps) EXPECT_EQ(n, 1) << "step " << step << " printed " << n << " times";
}

TEST(StatusPort, APortInUseIsAClearErrorBeforeAnythingStarts) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  std::string dir = FreshDir("status_port");
  std::string toml = FmnistJob("busy", dir + "/out", 2, "mlp", 256, 1, "[algorithm]\nname = \"allreduce\"\n");
  toml.replace(toml.find("seed = 42"), 9, "seed = 42\nstatus_port = " + std::to_string(port));
  JobRun r = RunJob(dir, toml, 60);
  close(fd);
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("[job] status_port / status_bind: status page at 127.0.0.1:" + std::to_string(port) +
                               ": cannot listen: Address already in use"),
            std::string::npos)
      << r.stderr_text;
  EXPECT_EQ(ProcessesOf(dir), 0);
}

}  // namespace
}  // namespace testing
}  // namespace shoal
