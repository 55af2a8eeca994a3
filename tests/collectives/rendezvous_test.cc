// Rendezvous over the network: the coordinator's key-value store answers sets and gets,
// bounds what one peer can store, admits only the job's client key, and is enough for a
// ring of separate processes to wire itself with no shared directory.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "algorithms/collectives/zmq_ring.h"
#include "common/error.h"
#include "common/rendezvous/rendezvous.h"
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
  EXPECT_EQ(member.Get("k", 1000), "v");
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

}  // namespace
}  // namespace shoal
