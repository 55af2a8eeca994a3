// Push+pull throughput of one tensor through a shoal-server shard, against raw ZeroMQ
// request-reply echo of the same size, both between two processes on loopback.
// Throughput = (pushed + pulled bytes) / time of one push then one pull; median of repeats.
// Also timed: the same exchange as one PushPull request. All are measured alternately,
// repeat by repeat, so machine noise hits them alike.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>
#include <zmq.hpp>

#include "common/config.h"
#include "common/error.h"
#include "server/server.h"
#include "common/ps/client.h"

DEFINE_int64(min_bytes, 4 << 10, "smallest message size");
DEFINE_int64(max_bytes, 64 << 20, "largest message size");
DEFINE_int32(repeats, 0, "repeats per size (0 = by size: more for small messages)");
DEFINE_int64(report_bytes, 16 << 20, "size reported in the final JSON line");

namespace {

// The raw-ZeroMQ baseline polls by itself (riding out EINTR), not through Shoal.
int RawPoll(zmq::pollitem_t* item, int timeout_ms) {
  int rc;
  while ((rc = zmq_poll(item, 1, timeout_ms)) < 0 && zmq_errno() == EINTR) {
  }
  return rc < 0 ? 0 : rc;
}

using Clock = std::chrono::steady_clock;
std::atomic<bool> g_stop{false};
void OnTerm(int) { g_stop = true; }

int FreePort() {
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::rep);
  s.bind("tcp://127.0.0.1:*");
  std::string ep = s.get(zmq::sockopt::last_endpoint);
  return std::stoi(ep.substr(ep.rfind(':') + 1));
}

pid_t Spawn(const std::function<void()>& fn) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGTERM, OnTerm);
    fn();
    _exit(0);
  }
  return pid;
}

// The raw baseline: REP echoes each request back as is (no copy).
void EchoServer(const std::string& ep) {
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::rep);
  s.bind(ep);
  while (!g_stop) {
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    if (RawPoll(&item, 100) == 0) continue;
    zmq::message_t m;
    if (!s.recv(m, zmq::recv_flags::none)) continue;
    s.send(m, zmq::send_flags::none);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void NoFree(void*, void*) {}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("transport_bench [--min_bytes N] [--max_bytes N] [--repeats N]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // keep the table readable
  google::InitGoogleLogging(argv[0]);

  shoal::JobConfig cfg;
  cfg.path = "transport_bench";
  cfg.name = "transport-bench";
  cfg.servers = {"127.0.0.1:" + std::to_string(FreePort())};
  cfg.workers.resize(1);
  std::string echo_ep = "tcp://127.0.0.1:" + std::to_string(FreePort());

  pid_t server = Spawn([&] {
    shoal::Server s(cfg, 0);
    s.Run(g_stop);
  });
  pid_t echo = Spawn([&] { EchoServer(echo_ep); });
  int rc = 0;
  try {
    std::vector<int64_t> sizes;
    for (int64_t n = FLAGS_min_bytes; n <= FLAGS_max_bytes; n *= 4) sizes.push_back(n);
    std::vector<shoal::TensorSpec> specs;
    for (int64_t n : sizes) specs.push_back({"t" + std::to_string(n), shoal::DType::kF32, {n / 4}});

    shoal::ClientOptions o;
    o.timeout_ms = 60000;
    shoal::Client client(cfg, o);
    client.Register(specs);
    zmq::context_t ctx(1);
    zmq::socket_t req(ctx, zmq::socket_type::req);
    req.set(zmq::sockopt::linger, 0);
    req.connect(echo_ep);

    std::vector<char> buf(size_t(sizes.back()));
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = char(i * 7 + 3);
    // shoal: Push then Pull (pipelined, two requests); fused: one PushPull request;
    // raw: ZeroMQ REQ/REP echo. GB/s = 1e9 bytes/s counting both directions.
    printf("%10s %7s %10s %9s %10s %9s %10s %9s %7s %7s\n", "bytes", "repeats", "shoal_ms", "shoal_GB/s", "fused_ms",
           "fused_GB/s", "raw_ms", "raw_GB/s", "ratio", "fused/raw");
    double report_shoal = 0, report_raw = 0;
    for (int64_t n : sizes) {
      const std::string name = "t" + std::to_string(n);
      int repeats = FLAGS_repeats > 0 ? FLAGS_repeats : int(std::clamp<int64_t>((int64_t(512) << 20) / n, 25, 301));
      shoal::TensorRef ref{name, shoal::DType::kF32, {n / 4}, buf.data(), size_t(n)};
      std::vector<double> shoal_s, fused_s, raw_s;
      for (int r = -2; r < repeats; ++r) {  // two warm-up rounds
        auto t0 = Clock::now();
        // The pull goes out right behind the push: the shard applies them in order.
        int push = client.Push({ref}, shoal::msg::PushOp::ASSIGN);
        std::vector<shoal::PulledTensor> out;
        int pull = client.Pull({name}, &out);
        client.Wait(push);
        client.Wait(pull);
        auto t1 = Clock::now();
        if (out[0].size() != size_t(n) || memcmp(out[0].data(), buf.data(), size_t(n)) != 0)
          throw shoal::Error("pulled bytes of '" + name + "' differ from the pushed ones");

        // The same exchange as one PushPull request (one round trip).
        auto t4 = Clock::now();
        std::vector<shoal::PulledTensor> fused_out;
        client.Wait(client.PushPull({ref}, shoal::msg::PushOp::ASSIGN, &fused_out));
        auto t5 = Clock::now();
        if (fused_out[0].size() != size_t(n)) throw shoal::Error("PushPull of '" + name + "' returned the wrong size");

        auto t2 = Clock::now();
        zmq::message_t m(buf.data(), size_t(n), &NoFree, nullptr);
        req.send(m, zmq::send_flags::none);
        zmq::message_t back;
        zmq::pollitem_t item{req.handle(), 0, ZMQ_POLLIN, 0};
        if (RawPoll(&item, 60000) == 0 || !req.recv(back, zmq::recv_flags::none))
          throw shoal::Error("raw ZeroMQ echo server did not answer");
        auto t3 = Clock::now();
        if (back.size() != size_t(n)) throw shoal::Error("raw echo returned the wrong size");
        if (r < 0) continue;
        shoal_s.push_back(std::chrono::duration<double>(t1 - t0).count());
        fused_s.push_back(std::chrono::duration<double>(t5 - t4).count());
        raw_s.push_back(std::chrono::duration<double>(t3 - t2).count());
      }
      double ts = Median(shoal_s), tf = Median(fused_s), tr = Median(raw_s);
      double gs = 2.0 * n / ts / 1e9, gf = 2.0 * n / tf / 1e9, gr = 2.0 * n / tr / 1e9;
      printf("%10ld %7d %10.4f %9.3f %10.4f %9.3f %10.4f %9.3f %7.2f %7.2f\n", long(n), repeats, ts * 1e3, gs, tf * 1e3,
             gf, tr * 1e3, gr, gs / gr, gf / gr);
      fflush(stdout);
      if (n == FLAGS_report_bytes) report_shoal = gs, report_raw = gr;
    }
    printf(
        "{\"bench\":\"transport\",\"size_bytes\":%ld,\"push_pull_gbps\":%.4f,\"raw_zmq_gbps\":%.4f,\"ratio\":%.4f}\n",
        long(FLAGS_report_bytes), report_shoal, report_raw, report_raw > 0 ? report_shoal / report_raw : 0.0);
  } catch (const std::exception& e) {
    fprintf(stderr, "transport_bench: %s\n", e.what());
    rc = 1;
  }
  kill(server, SIGTERM);
  kill(echo, SIGTERM);
  waitpid(server, nullptr, 0);
  waitpid(echo, nullptr, 0);
  return rc;
}
