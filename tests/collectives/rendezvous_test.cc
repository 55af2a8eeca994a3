// Rendezvous over the network: the coordinator's key-value store answers sets and gets,
// bounds what one peer can store, admits only the job's client key, and is enough for a
// ring of separate processes to wire itself with no shared directory.
#include <gtest/gtest.h>

#include <glog/logging.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "algorithms/collectives/zmq_ring.h"
#include "common/error.h"
#include "common/rendezvous/rendezvous.h"
#include "common/rendezvous/store.h"
#include "common/transport/pipe.h"
#include "tests/collectives/run_ranks.h"
#include "tests/ps/ps_test_util.h"

namespace shoal {
namespace {

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Rendezvous, SetGetAndAValueThatComesLater) {
  RendezvousServer server("tcp://127.0.0.1:*", {});
  CoordinatorStore a(server.endpoint(), {}), b(server.endpoint(), {});
  a.Set("ring-0", "tcp://10.0.0.1:5000");
  EXPECT_EQ(b.Get("ring-0", 1000), "tcp://10.0.0.1:5000");
  a.Set("ring-0", std::string("\0binary\xff", 8));  // values are bytes, replaced whole
  EXPECT_EQ(b.Get("ring-0", 1000), std::string("\0binary\xff", 8));
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CoordinatorStore c(server.endpoint(), {});
    c.Set("nccl-id", "abc");
  });
  EXPECT_EQ(b.Get("nccl-id", 5000), "abc");
  later.join();
  std::string e = ErrorOf([&] { b.Get("never", 300); });
  EXPECT_NE(e.find("no value for \"never\""), std::string::npos) << e;
  EXPECT_NE(e.find(server.endpoint()), std::string::npos) << e;
}

TEST(Rendezvous, OversizedKeysAndValuesAreRefusedByName) {
  RendezvousServer server("tcp://127.0.0.1:*", {});
  CoordinatorStore a(server.endpoint(), {});
  std::string e = ErrorOf([&] { a.Set("big", std::string(RendezvousService::kMaxValueBytes + 1, 'x')); });
  EXPECT_NE(e.find("rendezvous value for \"big\""), std::string::npos) << e;
  e = ErrorOf([&] { a.Set(std::string(RendezvousService::kMaxKeyBytes + 1, 'k'), "v"); });
  EXPECT_NE(e.find("rendezvous key of"), std::string::npos) << e;
  a.Set("ok", "still served");  // a refusal does not stop the service
  EXPECT_EQ(a.Get("ok", 1000), "still served");
}

TEST(Rendezvous, NobodyListeningIsABoundedError) {
  CoordinatorStore a("tcp://127.0.0.1:" + std::to_string(testing::FreePort()), {}, 300);
  auto t0 = std::chrono::steady_clock::now();
  std::string e = ErrorOf([&] { a.Set("k", "v"); });
  EXPECT_NE(e.find("did not answer"), std::string::npos) << e;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(Rendezvous, OnlyTheJobsClientKeyGetsIn) {
  auto server_keys = CurveKeyPair(), client_keys = CurveKeyPair(), foreign = CurveKeyPair();
  CurveKeys job{server_keys.first, server_keys.second, client_keys.first, client_keys.second};
  CurveKeys other{server_keys.first, "", foreign.first, foreign.second};
  RendezvousServer server("tcp://127.0.0.1:*", job);
  CoordinatorStore member(server.endpoint(), job);
  member.Set("k", "v");
  CoordinatorStore intruder(server.endpoint(), other, 500);
  std::string e = ErrorOf([&] { intruder.Get("k", 500); });
  EXPECT_NE(e.find("did not answer"), std::string::npos) << e;
  EXPECT_NE(e.find("[security] keys"), std::string::npos) << e;
  // A worker of another job (other server keys too) is told the same, not "not running".
  auto other_server = CurveKeyPair();
  CurveKeys other_job{other_server.first, other_server.second, foreign.first, foreign.second};
  CoordinatorStore stranger(server.endpoint(), other_job, 500);
  e = ErrorOf([&] { stranger.Set("k", "w"); });
  EXPECT_NE(e.find("did not answer"), std::string::npos) << e;
  EXPECT_NE(e.find("[security] keys"), std::string::npos) << e;
  EXPECT_EQ(member.Get("k", 1000), "v");
}

// The log lines this process writes while it lives (glog's sink, so real log output).
class LogLines : public google::LogSink {
 public:
  LogLines() { google::AddLogSink(this); }
  ~LogLines() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity, const char*, const char*, int, const google::LogMessageTime&, const char* message,
            size_t len) override {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.emplace_back(message, len);
  }
  int Count(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& l : lines_) n += l.find(what) != std::string::npos;
    return n;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

// The number before " handshake(s) from <from> were refused" in RefusedHandshakes(), or 0.
long RefusedFrom(const std::string& from) {
  std::string s = RefusedHandshakes();
  auto at = s.find(" handshake(s) from " + from + " were refused");
  if (at == std::string::npos) return 0;
  auto start = s.find_last_of(" (", at - 1);
  return std::stol(s.substr(start + 1, at - start - 1));
}

// The bound side of a refused handshake says so too: a stranger retrying every 100 ms gets
// one log line at the coordinator (then a count every few seconds), not one per attempt,
// and rank 0's own "no value" timeout names the refusals, by the peer's address where
// ZeroMQ gives it (ZAP: a foreign client key) and by our endpoint where it does not
// (another job's server key: the handshake fails before authentication).
TEST(Rendezvous, TheCoordinatorLogsRefusedHandshakesOnceAndItsTimeoutNamesThem) {
  LogLines log;
  auto server_keys = CurveKeyPair(), client_keys = CurveKeyPair(), foreign = CurveKeyPair(), other = CurveKeyPair();
  CurveKeys job{server_keys.first, server_keys.second, client_keys.first, client_keys.second};
  CurveKeys other_job{other.first, other.second, foreign.first, foreign.second};
  CurveKeys other_client{server_keys.first, "", foreign.first, foreign.second};
  RendezvousServer server("tcp://127.0.0.1:*", job);
  const std::string peer_of = "a peer of " + server.endpoint();
  TransportContext hostile("hostile");
  const int kAttempts = 30;
  for (int i = 0; i < kAttempts; ++i) {
    Transport t(hostile, Transport::Kind::kClient, i % 2 ? other_client : other_job);
    t.Connect(server.endpoint());
    OutMessage m;
    m.header().setKind(msg::Kind::STORE_GET);
    m.header().setKey("allreduce-1");
    t.Send(m);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CoordinatorStore rank0(server.endpoint(), job);
  std::string e = ErrorOf([&] { rank0.Get("allreduce-1", 300); });
  EXPECT_NE(e.find("no value for \"allreduce-1\""), std::string::npos) << e;
  EXPECT_NE(e.find("handshake(s) from " + peer_of), std::string::npos) << e;
  EXPECT_NE(e.find("handshake(s) from 127.0.0.1 were refused"), std::string::npos) << e;
  EXPECT_NE(e.find("other [security] keys?"), std::string::npos) << e;
  EXPECT_GE(RefusedFrom(peer_of), kAttempts / 2) << RefusedHandshakes();
  // One line for the other job's attempts (this endpoint is new), and at most one count
  // line on top, however many attempts.
  EXPECT_EQ(log.Count("coordinator: rejected a connection on " + server.endpoint()), 1);
  EXPECT_LE(log.Count(server.endpoint()), 2);
  EXPECT_LE(log.Count("from 127.0.0.1"), 2);  // ZAP's refusals, logged the same way
}

// A ring's PipeIn, too, counts what it refused, read with its connection events.
TEST(Rendezvous, ARingPipeInCountsRefusedHandshakes) {
  auto server_keys = CurveKeyPair(), client_keys = CurveKeyPair(), other = CurveKeyPair();
  PipeOptions in_opts, out_opts;
  in_opts.keys = {server_keys.first, server_keys.second, client_keys.first, client_keys.second};
  out_opts.keys = {other.first, other.second, client_keys.first, client_keys.second};
  TransportContext ctx("ring");
  PipeIn in(ctx, in_opts);
  std::string ep = in.Bind("tcp://127.0.0.1:*");
  for (int i = 0; i < 5; ++i) {
    PipeOut out(ctx, out_opts);
    out.Connect(ep);
    for (int j = 0; j < 10; ++j) {
      in.Wait(20);
      in.UpdateConnections();
    }
    out.Close(true);
  }
  EXPECT_GE(RefusedFrom("a peer of " + ep), 3) << RefusedHandshakes();
}

// Three processes, no shared directory: rank 0 serves the coordinator, every rank meets the
// others through it, and the ring sums exactly.
TEST(Rendezvous, ARingWiresThroughTheCoordinatorAlone) {
  const int size = 3;
  const std::string address = "127.0.0.1:" + std::to_string(testing::FreePort());
  auto codes = RunRanks(size, [&](int rank) {
    std::unique_ptr<RendezvousServer> coordinator;
    if (rank == 0) coordinator = std::make_unique<RendezvousServer>("tcp://" + address, CurveKeys{});
    CoordinatorStore store("tcp://" + address, {});
    RingOptions o;
    o.tcp_only = true;
    ZmqRing ring(rank, size, store, o);
    std::vector<float> v(5000, float(rank + 1));
    ring.AllReduce(v.data(), int64_t(v.size()), ReduceOp::kSum);
    for (float x : v)
      if (x != 6.f) return 1;
    ring.Barrier();  // nobody leaves (rank 0 takes the coordinator along) before all are done
    return 0;
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// Four processes race to move one key from each value to the next, as two round deciders
// would: in every round exactly one wins, and every process learns the winner's value.
// `store(rank)` makes the process's own store.
template <typename MakeStore>
void RaceCompareSet(MakeStore store_of) {
  const int size = 4, rounds = 20;
  auto codes = RunRanks(size, [&](int rank) {
    std::unique_ptr<Store> store = store_of(rank);
    std::string held;  // round r's value: "r;<winner>"
    int wins = 0;
    for (int r = 0; r < rounds; ++r) {
      const std::string mine = std::to_string(r) + ";" + std::to_string(rank);
      const std::string got = store->CompareSet("decision", held, mine);
      if (got.rfind(std::to_string(r) + ";", 0) != 0) return 1;  // not round r's: a lost or a double write
      if (got == mine) ++wins;
      // Every process saw the same winner before any starts the next round.
      store->Set("seen." + std::to_string(r) + "." + std::to_string(rank), got);
      for (int o = 0; o < size; ++o)
        if (store->Get("seen." + std::to_string(r) + "." + std::to_string(o), 20000) != got) return 2;
      held = got;
    }
    store->Set("wins." + std::to_string(rank), std::to_string(wins));
    int total = 0;
    for (int o = 0; o < size; ++o) total += std::stoi(store->Get("wins." + std::to_string(o), 20000));
    return total == rounds ? 0 : 3;
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(CompareSet, OneWinnerPerRoundThroughTheCoordinator) {
  const std::string address = "127.0.0.1:" + std::to_string(testing::FreePort());
  RendezvousServer server("tcp://" + address, {});
  RaceCompareSet([&](int) { return std::make_unique<CoordinatorStore>("tcp://" + address, CurveKeys{}); });
  CoordinatorStore s("tcp://" + address, {});
  EXPECT_EQ(s.CompareSet("fresh", "x", "y"), "");  // not set, and "x" is not "not set"
  EXPECT_EQ(s.CompareSet("fresh", "", "y"), "y");  // "" matches a key not set
  EXPECT_EQ(s.CompareSet("fresh", "", "z"), "y");  // no longer
  EXPECT_EQ(s.CompareSet("fresh", "y", "z"), "z");
  std::string e = ErrorOf([&] { s.CompareSet("big", "", std::string(RendezvousService::kMaxValueBytes + 1, 'x')); });
  EXPECT_NE(e.find("rendezvous value for \"big\""), std::string::npos) << e;
}

TEST(CompareSet, OneWinnerPerRoundInADirectory) {
  const std::string dir = ::testing::TempDir() + "/compare_set_" + std::to_string(getpid());
  RaceCompareSet([&](int) { return std::make_unique<FileStore>(dir); });
  FileStore s(dir);
  EXPECT_EQ(s.CompareSet("fresh", "x", "y"), "");
  EXPECT_EQ(s.CompareSet("fresh", "", "y"), "y");
  EXPECT_EQ(s.CompareSet("fresh", "", "z"), "y");
  EXPECT_EQ(s.CompareSet("fresh", "y", "z"), "z");
}

// Two hand-started runs in one directory (both run id "0"): the second run's rank 1 starts
// first, while the first run's files (its generation, its ring endpoints, its joins) are
// still there, and must wait for this run's rank 0 instead of reading them.
TEST(FileStoreRun, ASecondRunNeverReadsTheFirstRunsValues) {
  std::string dir = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/filestore-runs";
  auto run = [&](const std::string& value, int rank0_delay_ms) {
    std::string got;
    std::thread r1([&] {
      FileStore s(dir, FileStoreRun{1, 2, 10000});
      s.Set("ring-1", value);
      got = s.Get("ring-0", 10000);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(rank0_delay_ms));
    FileStore s0(dir, FileStoreRun{0, 2, 10000});
    s0.Set("ring-0", value);
    EXPECT_EQ(s0.Get("ring-1", 10000), value);
    r1.join();
    return got;
  };
  EXPECT_EQ(run("tcp://first:1", 0), "tcp://first:1");
  // Files an older version left straight in the directory are no keys either.
  FileStore(dir).Set("ring-0", "tcp://planted:1");
  EXPECT_EQ(run("tcp://second:2", 300), "tcp://second:2");
  EXPECT_EQ(run("tcp://third:3", 0), "tcp://third:3");
}

TEST(FileStoreRun, AMissingRankIsNamed) {
  std::string dir = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/filestore-missing";
  EXPECT_NE(ErrorOf([&] {
              FileStore s(dir, FileStoreRun{0, 3, 200});
            }).find("rank 1 did not join " + dir),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              FileStore s(dir, FileStoreRun{2, 3, 200});
            }).find("rank 0 did not claim " + dir),
            std::string::npos);
}

}  // namespace
}  // namespace shoal
