// The ZeroMQ ring among real processes on loopback: exact sums for many sizes and rank
// counts, fp16 wire, all-gather, broadcast, and a rank dying mid-collective.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <thread>

#include "algorithms/collectives/torus.h"
#include "algorithms/collectives/zmq_ring.h"
#include "tests/collectives/run_ranks.h"
#include "common/error.h"
#include <zmq.h>
#include <cstring>

namespace shoal {
namespace {

std::string FreshDir(const std::string& name) {
  static int counter = 0;
  std::string d =
      ::testing::TempDir() + "/ring_" + name + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
  return d;
}

float Value(int rank, int64_t i) { return float((rank * 7 + i * 3) % 23) - 11.0f; }

TEST(ZmqRing, AllReduceExactForManySizesAndRankCounts) {
  for (int size : {1, 2, 3, 4, 5, 8}) {
    std::string dir = FreshDir("sum");
    auto codes = RunRanks(size, [&](int rank) {
      FileStore store(dir);
      RingOptions o;
      o.segment_bytes = 4096;  // many segments: exercises pipelining
      ZmqRing ring(rank, size, store, o);
      for (int64_t n :
           {int64_t(0), int64_t(1), int64_t(3), int64_t(7), int64_t(1000), int64_t(4099), int64_t(100003)}) {
        std::vector<float> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[size_t(i)] = Value(rank, i);
        ring.AllReduce(v.data(), n, ReduceOp::kSum);
        for (int64_t i = 0; i < n; ++i) {
          float want = 0;
          for (int r = 0; r < size; ++r) want += Value(r, i);
          if (v[size_t(i)] != want) {
            fprintf(stderr, "size %d n %lld i %lld: got %g want %g\n", size, (long long)n, (long long)i, v[size_t(i)],
                    want);
            return 1;
          }
        }
      }
      return 0;
    });
    for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "size " << size << " rank " << r;
  }
}

TEST(ZmqRing, MeanAndHalfPrecisionWireAreIdenticalOnEveryRank) {
  const int size = 4;
  const int64_t n = 5001;
  std::string dir = FreshDir("fp16");
  std::string out = dir + "-out";
  auto codes = RunRanks(size, [&](int rank) {
    FileStore store(dir);
    ZmqRing ring(rank, size, store);
    for (DType wire : {DType::kF16, DType::kBF16}) {
      std::vector<float> v(n);
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = Value(rank, i) * 0.37f + 0.001f * float(rank);
      ring.AllReduce(v.data(), n, ReduceOp::kMean, wire);
      // Close to the exact mean, and identical everywhere (checked via all-gather of a hash).
      double max_err = 0;
      uint64_t h = 1469598103934665603ull;
      for (int64_t i = 0; i < n; ++i) {
        double want = 0;
        for (int r = 0; r < size; ++r) want += Value(r, i) * 0.37f + 0.001f * float(r);
        want /= size;
        max_err = std::max(max_err, std::fabs(v[size_t(i)] - want));
        uint32_t bits;
        memcpy(&bits, &v[size_t(i)], 4);
        h = (h ^ bits) * 1099511628211ull;
      }
      double tol = wire == DType::kF16 ? 0.02 : 0.1;
      if (max_err > tol) {
        fprintf(stderr, "%s max_err %g\n", DTypeName(wire), max_err);
        return 1;
      }
      std::vector<uint64_t> all(size);
      ring.AllGather(&h, sizeof h, all.data());
      for (int r = 0; r < size; ++r)
        if (all[size_t(r)] != h) {
          fprintf(stderr, "rank %d differs\n", r);
          return 2;
        }
    }
    return 0;
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// Block-quantized all-reduce: every rank ends with the same bits, within the rounding bound
// of the exact mean. Each hop k of the reduce-scatter rounds a partial sum of k values (at most
// k M / 2L off, M the largest |value|, L = 127 or 7), the owner rounds the mean (M / 2L): on
// the mean at most M / 2L x ((W - 1) / 2 + 1). Small segments: blocks cut at segment ends.
TEST(ZmqRing, QuantizedAllReduceIsIdenticalOnEveryRankWithinItsBound) {
  for (int size : {1, 2, 3, 5}) {
    std::string dir = FreshDir("quant");
    auto codes = RunRanks(size, [&](int rank) {
      FileStore store(dir);
      RingOptions o;
      o.segment_bytes = 4096;
      ZmqRing ring(rank, size, store, o);
      for (BlockQuant q : {BlockQuant::kInt8, BlockQuant::kInt4})
        for (int64_t n : {int64_t(0), int64_t(1), int64_t(3), int64_t(257), int64_t(4099), int64_t(100003)}) {
          std::vector<float> v(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) v[size_t(i)] = Value(rank, i) * 0.37f + 0.001f * float(rank);
          ring.AllReduceQuantized(v.data(), n, ReduceOp::kMean, q);
          const double M = 11 * 0.37 + 0.001 * size, L = q == BlockQuant::kInt8 ? 127 : 7;
          const double bound = M / (2 * L) * ((size - 1) / 2.0 + 1) + 1e-4;
          uint64_t h = 1469598103934665603ull;
          for (int64_t i = 0; i < n; ++i) {
            double want = 0;
            for (int r = 0; r < size; ++r) want += Value(r, i) * 0.37f + 0.001f * float(r);
            want /= size;
            if (std::fabs(v[size_t(i)] - want) > bound) {
              fprintf(stderr, "size %d n %lld i %lld: got %g want %g (bound %g)\n", size, (long long)n, (long long)i,
                      v[size_t(i)], want, bound);
              return 1;
            }
            uint32_t bits;
            memcpy(&bits, &v[size_t(i)], 4);
            h = (h ^ bits) * 1099511628211ull;
          }
          std::vector<uint64_t> all(static_cast<size_t>(size));
          ring.AllGather(&h, sizeof h, all.data());
          for (int r = 0; r < size; ++r)
            if (all[size_t(r)] != h) {
              fprintf(stderr, "size %d n %lld: rank %d differs\n", size, (long long)n, r);
              return 2;
            }
        }
      return 0;
    });
    for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "size " << size << " rank " << r;
  }
}

TEST(Torus2D, AllReduceExactOnGrids) {
  for (auto [size, cols] : {std::pair<int, int>{4, 2}, {6, 3}, {6, 2}, {3, 3}, {4, 1}}) {
    std::string dir = FreshDir("torus");
    auto codes = RunRanks(size, [&, size = size, cols = cols](int rank) {
      FileStore store(dir);
      RingOptions o;
      o.segment_bytes = 4096;
      Torus2D t(rank, size, cols, store, o, "t");
      for (int64_t n : {int64_t(1), int64_t(5), int64_t(1001), int64_t(65537)}) {
        std::vector<float> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[size_t(i)] = Value(rank, i);
        t.AllReduce(v.data(), n, ReduceOp::kSum);
        for (int64_t i = 0; i < n; ++i) {
          float want = 0;
          for (int r = 0; r < size; ++r) want += Value(r, i);
          if (v[size_t(i)] != want) return 1;
        }
      }
      // Half-precision wire: still identical on every rank.
      std::vector<float> v(3000);
      for (size_t i = 0; i < v.size(); ++i) v[i] = Value(rank, int64_t(i)) * 0.37f;
      t.AllReduce(v.data(), int64_t(v.size()), ReduceOp::kMean, DType::kF16);
      uint64_t h = 1469598103934665603ull;
      for (float x : v) {
        uint32_t b;
        memcpy(&b, &x, 4);
        h = (h ^ b) * 1099511628211ull;
      }
      std::vector<uint64_t> all(static_cast<size_t>(size));
      t.AllGather(&h, sizeof h, all.data());
      for (auto x : all)
        if (x != h) return 2;
      return 0;
    });
    for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << size << " ranks, " << cols << " columns, rank " << r;
  }
}

TEST(ZmqRing, CurveEncryptedRingWorksAndPlaintextJunkCannotGetIn) {
  char spub[41], ssec[41], cpub[41], csec[41];
  ASSERT_EQ(zmq_curve_keypair(spub, ssec), 0);
  ASSERT_EQ(zmq_curve_keypair(cpub, csec), 0);
  const int size = 3;
  std::string dir = FreshDir("curve");
  auto codes = RunRanks(size, [&](int rank) {
    FileStore store(dir);
    RingOptions o;
    o.tcp_only = true;  // exercise the TCP path, where encryption matters
    // Small segments, so the collectives below send many full ones: CURVE adds bytes to each
    // frame on the wire, and a full segment must still get through the receiver's size limit.
    o.segment_bytes = 256;
    o.curve_server_public = spub;
    o.curve_server_secret = ssec;
    o.curve_client_public = cpub;
    o.curve_client_secret = csec;
    ZmqRing ring(rank, size, store, o);
    if (rank == 0) {  // a plaintext intruder sprays rank 1's port; the handshake stops it
      std::string ep = store.Get("ring-1", 1000);
      ep = ep.substr(0, ep.find(' '));
      void* ctx = zmq_ctx_new();
      void* s = zmq_socket(ctx, ZMQ_PUSH);
      int linger = 0;
      zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
      zmq_connect(s, ep.c_str());
      zmq_send(s, "garbage!", 8, ZMQ_DONTWAIT);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      zmq_close(s);
      zmq_ctx_term(ctx);
    }
    std::vector<float> v(10000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = Value(rank, int64_t(i));
    ring.AllReduce(v.data(), int64_t(v.size()), ReduceOp::kSum);
    for (size_t i = 0; i < v.size(); ++i) {
      float want = 0;
      for (int r = 0; r < size; ++r) want += Value(r, int64_t(i));
      if (v[i] != want) return 1;
    }
    std::vector<int32_t> b(777, rank == 1 ? 105 : -1);
    ring.Broadcast(b.data(), int64_t(b.size() * 4), 1);
    for (int32_t x : b)
      if (x != 105) return 2;
    return 0;
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// Waits up to 3 s for a CURVE client holding a key pair of its own to finish its handshake
// with `ep`; true if the server admitted it.
bool ForeignKeyAdmitted(const std::string& ep, const char* server_public) {
  char fpub[41], fsec[41];
  zmq_curve_keypair(fpub, fsec);
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_PUSH);
  int linger = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_public, 40);
  zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, fpub, 40);
  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, fsec, 40);
  zmq_socket_monitor(s, "inproc://foreign", ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
  void* mon = zmq_socket(ctx, ZMQ_PAIR);
  zmq_connect(mon, "inproc://foreign");
  zmq_connect(s, ep.c_str());
  bool admitted = false;
  zmq_pollitem_t item{mon, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, 3000) > 0) {
    zmq_msg_t ev;
    zmq_msg_init(&ev);
    zmq_msg_recv(&ev, mon, 0);
    uint16_t id = 0;
    memcpy(&id, zmq_msg_data(&ev), 2);
    admitted = id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
    zmq_msg_close(&ev);
  }
  zmq_socket_monitor(s, nullptr, 0);
  zmq_close(mon);
  zmq_close(s);
  zmq_ctx_term(ctx);
  return admitted;
}

TEST(ZmqRing, AClientWithAForeignKeyPairIsRefused) {
  char spub[41], ssec[41], cpub[41], csec[41];
  ASSERT_EQ(zmq_curve_keypair(spub, ssec), 0);
  ASSERT_EQ(zmq_curve_keypair(cpub, csec), 0);
  const int size = 3;
  std::string dir = FreshDir("foreign");
  auto codes = RunRanks(size, [&](int rank) {
    FileStore store(dir);
    RingOptions o;
    o.tcp_only = true;
    o.curve_server_public = spub;
    o.curve_server_secret = ssec;
    o.curve_client_public = cpub;
    o.curve_client_secret = csec;
    ZmqRing ring(rank, size, store, o);
    int code = 0;
    if (rank == 0) {  // knows the server key, holds a key pair of its own
      std::string ep = store.Get("ring-1", 1000);
      if (ForeignKeyAdmitted(ep.substr(0, ep.find(' ')), spub)) code = 2;
    }
    std::vector<float> v(1000, float(rank + 1));
    ring.AllReduce(v.data(), int64_t(v.size()), ReduceOp::kSum);
    for (float x : v)
      if (x != 6.f) return 1;
    return code;
  });
  for (int r = 0; r < size; ++r)
    EXPECT_EQ(codes[r], 0) << "rank " << r << (codes[r] == 2 ? ": the foreign key got in" : "");
}

// A rank holding another job's keys (both pairs) shares the store but not the ring: every
// handshake fails both ways, no data crosses, and each rank's error says its handshake with
// its right neighbour (by address) failed and asks about the [security] keys, instead of
// only "no data".
TEST(ZmqRing, ARankWithAnotherJobsKeysIsToldItsHandshakeFailed) {
  const int size = 2;
  std::string dir = FreshDir("otherjob");
  auto codes = RunRanks(size, [&](int rank) {
    FileStore store(dir);
    RingOptions o;
    o.tcp_only = true;
    o.timeout_ms = 1500;
    auto server = CurveKeyPair(), client = CurveKeyPair();  // each rank its own job's keys
    o.curve_server_public = server.first;
    o.curve_server_secret = server.second;
    o.curve_client_public = client.first;
    o.curve_client_secret = client.second;
    try {
      ZmqRing ring(rank, size, store, o);
      return 1;  // wired: data crossed a handshake that must fail
    } catch (const Error& e) {
      std::string m = e.what();
      std::string right = store.Get("ring-" + std::to_string((rank + 1) % size), 1000);
      right = right.substr(0, right.find(' '));
      bool ok = m.find("no data from rank") != std::string::npos && m.find("handshake") != std::string::npos &&
                m.find("[security] keys") != std::string::npos && m.find(right) != std::string::npos;
      fprintf(stderr, "rank %d: %s (right neighbour %s)\n", rank, m.c_str(), right.c_str());
      return ok ? 0 : 3;
    }
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(ZmqRing, BroadcastFromEveryRootAndAllGatherInManySegments) {
  const int size = 3;
  std::string dir = FreshDir("bcast");
  auto codes = RunRanks(size, [&](int rank) {
    FileStore store(dir);
    RingOptions o;
    o.segment_bytes = 256;  // messages are at most one segment: both collectives stream them
    ZmqRing ring(rank, size, store, o);
    for (int root = 0; root < size; ++root) {
      std::vector<int32_t> v(777, rank == root ? root * 100 + 5 : -1);
      ring.Broadcast(v.data(), int64_t(v.size() * 4), root);
      for (int32_t x : v)
        if (x != root * 100 + 5) return 1;
    }
    std::vector<int32_t> mine(777, rank + 7), all(777 * size);
    ring.AllGather(mine.data(), int64_t(mine.size() * 4), all.data());
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i] != int32_t(i / 777) + 7) return 2;
    return 0;
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(ZmqRing, RankDyingMidCollectiveFailsTheOthersFast) {
  const int size = 4;
  std::string dir = FreshDir("die");
  auto t0 = std::chrono::steady_clock::now();
  auto codes = RunRanks(size, [&](int rank) {
    FileStore store(dir);
    RingOptions o;
    o.timeout_ms = 20000;  // the failure must be found long before this
    ZmqRing ring(rank, size, store, o);
    std::vector<float> v(1 << 16, 1.0f);
    for (int it = 0; it < 1000; ++it) {
      if (rank == 2 && it == 3) raise(SIGKILL);
      ring.AllReduce(v.data(), int64_t(v.size()), ReduceOp::kMean);
    }
    return 0;
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(codes[2], 128 + SIGKILL);
  for (int r : {0, 1, 3}) EXPECT_EQ(codes[r], 42) << "rank " << r << " should fail with an error";
  EXPECT_LT(secs, 15.0) << "failure detection relied on the timeout";
}

TEST(ZmqRing, GarbageOnTheRingPortIsDroppedAndTheRingGoesOn) {
  const int size = 2;
  std::string dir = FreshDir("junk");
  auto codes = RunRanks(
      size,
      [&](int rank) {
        FileStore store(dir);
        ZmqRing ring(rank, size, store);
        if (rank == 0) {
          // A stray PUSH peer sends junk to rank 1's port.
          std::string ep = store.Get("ring-1", 1000);
          ep = ep.substr(0, ep.find(' '));  // the TCP endpoint (then the ipc one and the host)
          void* ctx = zmq_ctx_new();
          void* s = zmq_socket(ctx, ZMQ_PUSH);
          zmq_connect(s, ep.c_str());
          zmq_send(s, "garbage!", 8, 0);
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          zmq_close(s);
          zmq_ctx_term(ctx);
          return 0;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        return 0;
      },
      30);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  // Now both ranks all-reduce while junk arrives at rank 1: the result is still exact.
  std::string dir2 = FreshDir("junk2");
  auto codes2 = RunRanks(
      size,
      [&](int rank) {
        FileStore store(dir2);
        ZmqRing ring(rank, size, store);
        if (rank == 0) {
          std::string ep = store.Get("ring-1", 1000);
          ep = ep.substr(0, ep.find(' '));
          void* ctx = zmq_ctx_new();
          void* s = zmq_socket(ctx, ZMQ_PUSH);
          zmq_connect(s, ep.c_str());
          for (int i = 0; i < 50; ++i) zmq_send(s, "garbage!", 8, 0);
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          zmq_close(s);
          zmq_ctx_term(ctx);
        }
        std::vector<float> v(1000, float(rank + 1));
        ring.AllReduce(v.data(), 1000, ReduceOp::kSum);
        for (float x : v)
          if (x != 3.0f) return 1;
        return 0;
      },
      30);
  EXPECT_EQ(codes2[0], 0);
  EXPECT_EQ(codes2[1], 0);
}

// Writes `bytes` over a plain TCP connection to "tcp://127.0.0.1:PORT", then closes it.
void RawTcp(const std::string& ep, const std::string& bytes) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(std::stoi(ep.substr(ep.rfind(':') + 1))));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && !bytes.empty()) {
    ssize_t n = write(fd, bytes.data(), bytes.size());
    (void)n;
  }
  close(fd);
}

// A store through which strangers reach rank 1's ring socket before its left neighbour
// can: a port scan (connect, close), a connection sending garbage bytes, and a ZeroMQ peer
// sending a malformed message, all gone before rank 1 publishes its address. Rank 0 (the
// left neighbour) reads that address late, so rank 1 has looked at its connections first.
class StrangersFirstStore : public Store {
 public:
  StrangersFirstStore(const std::string& dir, int rank) : inner_(dir), rank_(rank) {}
  void Set(const std::string& key, const std::string& value) override {
    if (key == "ring-1") {
      std::string ep = value.substr(0, value.find(' '));
      RawTcp(ep, "");
      RawTcp(ep, std::string(300, '\x5a'));
      void* ctx = zmq_ctx_new();
      void* s = zmq_socket(ctx, ZMQ_PUSH);
      int linger = 1000;
      zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
      zmq_connect(s, ep.c_str());
      zmq_send(s, "garbage!", 8, 0);
      zmq_close(s);
      zmq_ctx_term(ctx);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let rank 1 see them go
    }
    inner_.Set(key, value);
  }
  std::string Get(const std::string& key, int timeout_ms) override {
    if (rank_ == 0 && key == "ring-1") std::this_thread::sleep_for(std::chrono::milliseconds(500));
    return inner_.Get(key, timeout_ms);
  }
  std::string CompareSet(const std::string& key, const std::string& expected, const std::string& desired) override {
    return inner_.CompareSet(key, expected, desired);
  }

 private:
  FileStore inner_;
  int rank_;
};

TEST(ZmqRing, StrangersThatCloseBeforeTheNeighbourConnectsDoNotBreakWiring) {
  const int size = 3;
  std::string dir = FreshDir("scan");
  auto codes = RunRanks(
      size,
      [&](int rank) {
        StrangersFirstStore store(dir, rank);
        RingOptions o;
        o.timeout_ms = 20000;
        ZmqRing ring(rank, size, store, o);
        std::vector<float> v(10000);
        for (size_t i = 0; i < v.size(); ++i) v[i] = Value(rank, int64_t(i));
        ring.AllReduce(v.data(), int64_t(v.size()), ReduceOp::kSum);
        for (size_t i = 0; i < v.size(); ++i) {
          float want = 0;
          for (int r = 0; r < size; ++r) want += Value(r, int64_t(i));
          if (v[i] != want) return 1;
        }
        return 0;
      },
      60);
  for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// Waits up to timeout_ms for `event` on a socket monitor; true if it came.
bool WaitEvent(void* mon, uint16_t event, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    zmq_pollitem_t item{mon, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 100) <= 0) continue;
    zmq_msg_t ev, addr;
    zmq_msg_init(&ev);
    zmq_msg_init(&addr);
    zmq_msg_recv(&ev, mon, 0);
    zmq_msg_recv(&addr, mon, 0);
    uint16_t id = 0;
    memcpy(&id, zmq_msg_data(&ev), 2);
    zmq_msg_close(&ev);
    zmq_msg_close(&addr);
    if (id == event) return true;
  }
  return false;
}

// What a stranger can make a ring rank hold is bounded: a message larger than a segment is
// refused (the connection dropped, nothing allocated), and a flood of segment-sized
// messages that the rank is not reading stops at a bounded queue (TCP back-pressure).
TEST(ZmqRing, AStrangerCannotMakeARankQueueUnboundedData) {
  const int size = 2;
  const int64_t kSegment = 64 << 10;
  std::string dir = FreshDir("bounded");
  auto codes = RunRanks(
      size,
      [&](int rank) {
        FileStore store(dir);
        RingOptions o;
        o.segment_bytes = kSegment;
        o.timeout_ms = 20000;
        ZmqRing ring(rank, size, store, o);
        int code = 0;
        if (rank == 0) {
          std::string ep = store.Get("ring-1", 1000);
          ep = ep.substr(0, ep.find(' '));
          void* ctx = zmq_ctx_new();
          std::string head(16, '\x11');  // not the ring's magic

          void* big = zmq_socket(ctx, ZMQ_PUSH);
          int zero = 0;
          zmq_setsockopt(big, ZMQ_LINGER, &zero, sizeof zero);
          zmq_socket_monitor(big, "inproc://big", ZMQ_EVENT_DISCONNECTED);
          void* mon = zmq_socket(ctx, ZMQ_PAIR);
          zmq_connect(mon, "inproc://big");
          zmq_connect(big, ep.c_str());
          std::string body(size_t(4 * kSegment), 'x');
          zmq_send(big, head.data(), head.size(), ZMQ_SNDMORE);
          zmq_send(big, body.data(), body.size(), 0);
          if (!WaitEvent(mon, ZMQ_EVENT_DISCONNECTED, 10000)) {
            fprintf(stderr, "a message of 4 segments was not refused\n");
            code = 3;
          }
          zmq_close(big);
          zmq_close(mon);

          void* flood = zmq_socket(ctx, ZMQ_PUSH);
          int hwm = 4;
          zmq_setsockopt(flood, ZMQ_SNDHWM, &hwm, sizeof hwm);
          zmq_setsockopt(flood, ZMQ_LINGER, &zero, sizeof zero);
          zmq_connect(flood, ep.c_str());
          std::string seg(size_t(kSegment), 'y');
          const int64_t kCap = int64_t(128) << 20;
          int64_t sent = 0;
          auto stalled_since = std::chrono::steady_clock::now();
          while (sent < kCap && std::chrono::steady_clock::now() - stalled_since < std::chrono::milliseconds(2000)) {
            if (zmq_send(flood, head.data(), head.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
              continue;
            }
            zmq_send(flood, seg.data(), seg.size(), 0);
            sent += kSegment;
            stalled_since = std::chrono::steady_clock::now();
          }
          if (sent >= int64_t(64) << 20) {
            fprintf(stderr, "rank 1 queued %lld bytes from a stranger\n", (long long)sent);
            code = 4;
          }
          zmq_close(flood);
          zmq_ctx_term(ctx);
          store.Set("flood-done", "1");
        } else {
          store.Get("flood-done", 60000);  // not reading the ring meanwhile
        }
        std::vector<float> v(100000, float(rank + 1));
        ring.AllReduce(v.data(), int64_t(v.size()), ReduceOp::kSum);
        for (float x : v)
          if (x != 3.0f) return 1;
        return code;
      },
      90);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

}  // namespace
}  // namespace shoal
