// Push+pull throughput of one tensor through a shoal-server shard, against raw ZeroMQ doing
// the same exchange, both between two processes on loopback. Throughput = (pushed + pulled
// bytes) / time of one push then one pull; median of repeats. Also timed: the same exchange
// as one PushPull request, against raw ZeroMQ's one round trip. All are measured
// alternately, repeat by repeat, so machine noise hits them alike.
//
// The raw side is what Shoal's exchange is without Shoal: the same socket types (DEALER to
// ROUTER), the same messages (a header frame, then the tensor frame), sent zero-copy and kept
// by the server as received: push+pull is two pipelined requests (push, then pull before the
// push's answer) and two answers (an acknowledgement, then header + tensor), as Client::Push
// and Client::Pull send them; the fused exchange is one request and one answer. A request-
// reply echo of one frame is half of push+pull's messages, and was no fair baseline for it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <malloc.h>
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
DEFINE_string(only, "",
              "run only this exchange (shoal | raw | fused | raw1), e.g. to count one side's system calls "
              "and context switches with perf stat (the others print 0)");

namespace {

// The raw-ZeroMQ baseline polls by itself (riding out EINTR), not through Shoal.
int RawPoll(zmq::pollitem_t* item, int timeout_ms) {
  int rc;
  while ((rc = zmq_poll(item, 1, timeout_ms)) < 0 && zmq_errno() == EINTR) {
  }
  return rc < 0 ? 0 : rc;
}

using Clock = std::chrono::steady_clock;
void NoFree(void*, void*) {}
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

// Raw ZeroMQ's shard: a ROUTER whose requests are [identity, header, tensor?], the header's
// first byte saying which: 'P' push (keeps the tensor frame, answers with a header), 'L' pull
// (answers header + the kept frame, by reference), 'F' push-pull (keeps it and answers with
// it). Headers are kHeaderBytes, a little less than Shoal's Cap'n Proto headers for one tensor
// (a push's 176 bytes, a pull's 128).
constexpr size_t kHeaderBytes = 96;

void RawShard(const std::string& ep) {
  // The malloc policy every Shoal process sets (common/transport: freed frames stay
  // mapped), so the baseline is not slowed by page faults that Shoal avoids. The raw client
  // shares the bench's process, where the Shoal client has set it already.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::router);
  s.bind(ep);
  zmq::message_t kept;
  while (!g_stop) {
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    if (RawPoll(&item, 100) == 0) continue;
    zmq::message_t id, header, tensor;
    if (!s.recv(id, zmq::recv_flags::none) || !id.more() || !s.recv(header, zmq::recv_flags::none)) continue;
    if (header.more() && !s.recv(tensor, zmq::recv_flags::none)) continue;
    const char kind = header.size() ? *static_cast<const char*>(header.data()) : 0;
    // The replaced frame is freed once the answer is out, as the shard does (unmapping a
    // large buffer need not delay the reply).
    zmq::message_t replaced;
    if (kind == 'P' || kind == 'F') {
      replaced.move(kept);
      kept.move(tensor);
    }
    s.send(id, zmq::send_flags::sndmore);
    if (kind == 'P') {
      s.send(header, zmq::send_flags::none);
      continue;
    }
    zmq::message_t out;
    out.copy(kept);  // a reference, as the shard sends its stored buffer
    s.send(header, zmq::send_flags::sndmore);
    s.send(out, zmq::send_flags::none);
  }
}

// One raw request (header + tensor, or the header alone), sent as the Shoal client sends.
void RawSend(zmq::socket_t& s, char kind, const void* data, size_t n) {
  zmq::message_t header(kHeaderBytes);
  memset(header.data(), 0, kHeaderBytes);
  *static_cast<char*>(header.data()) = kind;
  if (!data) {
    s.send(header, zmq::send_flags::none);
    return;
  }
  s.send(header, zmq::send_flags::sndmore);
  zmq::message_t tensor(const_cast<void*>(data), n, &NoFree, nullptr);
  s.send(tensor, zmq::send_flags::none);
}

// Receives one raw answer; returns its last frame (the tensor, or the header of an ack).
zmq::message_t RawAnswer(zmq::socket_t& s) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  zmq::message_t frame;
  if (RawPoll(&item, 60000) == 0 || !s.recv(frame, zmq::recv_flags::none))
    throw shoal::Error("raw ZeroMQ shard did not answer");
  while (frame.more())
    if (!s.recv(frame, zmq::recv_flags::none)) throw shoal::Error("raw ZeroMQ shard's answer was cut short");
  return frame;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("transport_bench [--min_bytes N] [--max_bytes N] [--repeats N]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // keep the table readable
  google::InitGoogleLogging(argv[0]);
  if (!FLAGS_only.empty() && FLAGS_only != "shoal" && FLAGS_only != "raw" && FLAGS_only != "fused" &&
      FLAGS_only != "raw1") {
    fprintf(stderr, "transport_bench: --only %s: expected shoal, raw, fused or raw1\n", FLAGS_only.c_str());
    return 2;
  }

  shoal::JobConfig cfg;
  cfg.path = "transport_bench";
  cfg.name = "transport-bench";
  cfg.servers = {"127.0.0.1:" + std::to_string(FreePort())};
  cfg.workers.resize(1);
  std::string raw_ep = "tcp://127.0.0.1:" + std::to_string(FreePort());

  pid_t server = Spawn([&] {
    shoal::Server s(cfg, 0);
    s.Run(g_stop);
  });
  pid_t raw = Spawn([&] { RawShard(raw_ep); });
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
    zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect(raw_ep);

    std::vector<char> buf(size_t(sizes.back()));
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = char(i * 7 + 3);
    // shoal: Push then Pull (pipelined, two requests); raw: the same two requests over raw
    // ZeroMQ; fused: one PushPull request; raw1: one raw request and answer of that shape.
    // GB/s = 1e9 bytes/s counting both directions.
    printf("%10s %7s %10s %9s %10s %9s %7s %10s %9s %10s %9s %7s\n", "bytes", "repeats", "shoal_ms", "shoal_GB/s",
           "raw_ms", "raw_GB/s", "ratio", "fused_ms", "fused_GB/s", "raw1_ms", "raw1_GB/s", "ratio1");
    double report_shoal = 0, report_raw = 0;
    for (int64_t n : sizes) {
      const std::string name = "t" + std::to_string(n);
      int repeats = FLAGS_repeats > 0 ? FLAGS_repeats : int(std::clamp<int64_t>((int64_t(512) << 20) / n, 25, 301));
      shoal::TensorRef ref{name, shoal::DType::kF32, {n / 4}, buf.data(), size_t(n)};
      std::vector<double> shoal_s, raw_s, fused_s, raw1_s;
      auto seconds = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double>(b - a).count();
      };
      const bool all = FLAGS_only.empty();
      for (int r = -2; r < repeats; ++r) {  // two warm-up rounds
        auto t0 = Clock::now(), t1 = t0, t2 = t0, t3 = t0, t4 = t0, t5 = t0, t6 = t0, t7 = t0;
        if (all || FLAGS_only == "shoal") {
          // The pull goes out right behind the push: the shard applies them in order.
          int push = client.Push({ref}, shoal::msg::PushOp::ASSIGN);
          std::vector<shoal::PulledTensor> out;
          int pull = client.Pull({name}, &out);
          client.Wait(push);
          client.Wait(pull);
          t1 = Clock::now();
          if (out[0].size() != size_t(n) || memcmp(out[0].data(), buf.data(), size_t(n)) != 0)
            throw shoal::Error("pulled bytes of '" + name + "' differ from the pushed ones");
        }

        if (all || FLAGS_only == "raw") {
          t2 = Clock::now();
          RawSend(dealer, 'P', buf.data(), size_t(n));
          RawSend(dealer, 'L', nullptr, 0);
          RawAnswer(dealer);
          zmq::message_t back = RawAnswer(dealer);
          t3 = Clock::now();
          if (back.size() != size_t(n) || memcmp(back.data(), buf.data(), size_t(n)) != 0)
            throw shoal::Error("raw ZeroMQ pull returned other bytes than were pushed");
        }

        if (all || FLAGS_only == "fused") {
          t4 = Clock::now();
          std::vector<shoal::PulledTensor> fused_out;
          client.Wait(client.PushPull({ref}, shoal::msg::PushOp::ASSIGN, &fused_out));
          t5 = Clock::now();
          if (fused_out[0].size() != size_t(n))
            throw shoal::Error("PushPull of '" + name + "' returned the wrong size");
        }

        if (all || FLAGS_only == "raw1") {
          t6 = Clock::now();
          RawSend(dealer, 'F', buf.data(), size_t(n));
          zmq::message_t back1 = RawAnswer(dealer);
          t7 = Clock::now();
          if (back1.size() != size_t(n)) throw shoal::Error("raw ZeroMQ push-pull returned the wrong size");
        }
        if (r < 0) continue;
        shoal_s.push_back(seconds(t0, t1));
        raw_s.push_back(seconds(t2, t3));
        fused_s.push_back(seconds(t4, t5));
        raw1_s.push_back(seconds(t6, t7));
      }
      double ts = Median(shoal_s), tr = Median(raw_s), tf = Median(fused_s), tr1 = Median(raw1_s);
      // An exchange left out by --only times 0 and prints 0.
      auto gbps = [n](double t) { return t > 0 ? 2.0 * n / t / 1e9 : 0.0; };
      auto ratio = [](double a, double b) { return a > 0 && b > 0 ? a / b : 0.0; };
      printf("%10ld %7d %10.4f %9.3f %10.4f %9.3f %7.2f %10.4f %9.3f %10.4f %9.3f %7.2f\n", long(n), repeats, ts * 1e3,
             gbps(ts), tr * 1e3, gbps(tr), ratio(tr, ts), tf * 1e3, gbps(tf), tr1 * 1e3, gbps(tr1), ratio(tr1, tf));
      fflush(stdout);
      if (n == FLAGS_report_bytes) report_shoal = gbps(ts), report_raw = gbps(tr);
    }
    printf(
        "{\"bench\":\"transport\",\"size_bytes\":%ld,\"push_pull_gbps\":%.4f,\"raw_zmq_gbps\":%.4f,\"ratio\":%.4f}\n",
        long(FLAGS_report_bytes), report_shoal, report_raw, report_raw > 0 ? report_shoal / report_raw : 0.0);
  } catch (const std::exception& e) {
    fprintf(stderr, "transport_bench: %s\n", e.what());
    rc = 1;
  }
  kill(server, SIGTERM);
  kill(raw, SIGTERM);
  waitpid(server, nullptr, 0);
  waitpid(raw, nullptr, 0);
  return rc;
}
