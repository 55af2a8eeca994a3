// Bad input on a server's port: each case gets one clear log line (and an error answer
// where there is someone to answer), and the server keeps serving everyone else.
#include <arpa/inet.h>
#include <csignal>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <cstring>
#include <fstream>
#include <thread>
#include <unistd.h>
#include <zmq.hpp>  // a hostile raw client, below the transport

#include "common/config.h"
#include "common/error.h"
#include "common/transport/transport.h"
#include "tests/ps/ps_test_util.h"
#include "common/ps/client.h"
#include "common/rendezvous/rendezvous.h"

namespace shoal {
namespace {

using testing::ForkChild;
using testing::ServerProcess;
using testing::WaitChild;

const std::vector<TensorSpec> kSpecs = {{"good", DType::kF32, {1000}}, {"huge", DType::kF32, {16 << 20}}};

int PortOf(const std::string& host_port) { return std::stoi(host_port.substr(host_port.rfind(':') + 1)); }

// Writes raw bytes to the port over plain TCP, then closes.
void RawTcp(int port, const std::string& bytes) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), ssize_t(bytes.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  close(fd);
}

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    job_ = testing::WriteJob("bad-input", 1, 2);
    cfg_ = LoadJobConfig(job_);
    server_ = std::make_unique<ServerProcess>(job_, 0);
    ASSERT_TRUE(server_->WaitForLog("listening on")) << server_->log();
    raw_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
    raw_->set(zmq::sockopt::linger, 0);
    raw_->connect("tcp://" + cfg_.servers[0]);
  }

  // Sends frames from a raw DEALER and returns the server's error answer.
  std::string SendRaw(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t m(frames[i].data(), frames[i].size());
      raw_->send(m, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    zmq::pollitem_t item{raw_->handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(5000)) == 0) return "(no answer)";
    zmq::message_t head;
    EXPECT_TRUE(raw_->recv(head, zmq::recv_flags::none));
    InMessage in;
    in.ParseHeader(Frame(head.data(), head.size()));
    EXPECT_EQ(in.header().getKind(), msg::Kind::ERROR);
    return in.header().getMessage();
  }

  static std::string Header(const std::function<void(msg::Header::Builder)>& fill) {
    capnp::MallocMessageBuilder b;
    fill(b.getRoot<msg::Header>());
    auto words = capnp::messageToFlatArray(b);
    return std::string(reinterpret_cast<const char*>(words.asBytes().begin()), words.asBytes().size());
  }

  // A well-behaved client still gets exact answers.
  void ExpectStillServing(float value) {
    ClientOptions o;
    o.rank = 0;
    o.timeout_ms = 5000;
    o.heartbeat = false;
    Client c(cfg_, o);
    c.Register(kSpecs);
    std::vector<float> v(1000, value);
    c.Wait(c.Push({{"good", DType::kF32, {1000}, v.data(), 4000}}, msg::PushOp::ASSIGN));
    std::vector<PulledTensor> out;
    c.Wait(c.Pull({"good"}, &out));
    EXPECT_EQ(out[0].ToFloats()[999], value);
    EXPECT_TRUE(server_->alive());
  }

  std::string job_;
  JobConfig cfg_;
  std::unique_ptr<ServerProcess> server_;
  zmq::context_t ctx_{1};
  std::unique_ptr<zmq::socket_t> raw_;
};

TEST_F(BadInput, MalformedAndTruncatedHeaders) {
  EXPECT_NE(SendRaw({"abc"}).find("not whole 8-byte words"), std::string::npos);
  EXPECT_NE(SendRaw({std::string(64, '\xff')}).find("not a valid Cap'n Proto message"), std::string::npos);
  EXPECT_NE(SendRaw({""}).find("empty header frame"), std::string::npos);
  std::string oversized = SendRaw({std::string(kMaxHeaderBytes + 8, '\0')});
  EXPECT_NE(oversized.find("header frame of " + std::to_string(kMaxHeaderBytes + 8) + " bytes exceeds the limit of " +
                           std::to_string(kMaxHeaderBytes) + " bytes"),
            std::string::npos)
      << oversized;
  std::string h = Header([](msg::Header::Builder b) { b.setMessage(std::string(100, 'x')); });
  EXPECT_NE(SendRaw({h.substr(0, h.size() - 16)}).find("not a valid Cap'n Proto message"), std::string::npos);
  EXPECT_TRUE(server_->WaitForLog("bad message from peer 0x")) << server_->log();
  ExpectStillServing(1.5f);
}

TEST_F(BadInput, UnknownKindsAndInconsistentTensors) {
  std::string unknown = Header([](msg::Header::Builder b) {
    b.setKind(static_cast<msg::Kind>(77));
    b.setRequestId(5);
  });
  EXPECT_NE(SendRaw({unknown}).find("unknown message kind 77"), std::string::npos);
  EXPECT_TRUE(server_->WaitForLog("unknown message kind 77")) << server_->log();

  auto push = [](uint64_t bytes, int tensors) {
    return Header([=](msg::Header::Builder b) {
      b.setKind(msg::Kind::PUSH);
      auto t = b.initTensors(tensors);
      for (int i = 0; i < tensors; ++i) {
        t[i].setName("t" + std::to_string(i));
        t[i].initShape(1).set(0, 4);
        t[i].setByteSize(bytes);
      }
    });
  };
  std::string sixteen(16, '\0');
  EXPECT_NE(SendRaw({push(16, 2), sixteen}).find("2 tensors but 1 data frames"), std::string::npos);
  EXPECT_NE(SendRaw({push(16, 1), std::string(10, '\0')}).find("data frame has 10 bytes"), std::string::npos);
  EXPECT_NE(SendRaw({push(20, 1), std::string(20, '\0')}).find("does not match its shape"), std::string::npos);
  std::string nine_dims = Header([](msg::Header::Builder b) {
    b.setKind(msg::Kind::PUSH);
    auto t = b.initTensors(1);
    t[0].setName("good");
    auto shape = t[0].initShape(kMaxTensorDims + 1);
    for (unsigned d = 0; d < shape.size(); ++d) shape.set(d, 1);
    t[0].setByteSize(4);
  });
  EXPECT_NE(SendRaw({nine_dims, std::string(4, '\0')}).find("'good': 9 dimensions (at most 8)"), std::string::npos);
  std::string bad_op = Header([](msg::Header::Builder b) {
    b.setKind(msg::Kind::PUSH);
    b.setOp(static_cast<msg::PushOp>(9));
  });
  EXPECT_NE(SendRaw({bad_op}).find("unknown op 9"), std::string::npos);
  std::string pull = Header([](msg::Header::Builder b) {
    b.setKind(msg::Kind::PULL);
    b.initNames(1).set(0, "nothing-here");
  });
  EXPECT_NE(SendRaw({pull}).find("unknown tensor 'nothing-here'"), std::string::npos);
  ExpectStillServing(2.5f);
}

TEST_F(BadInput, ARequestNamingATensorTwiceIsRefused) {
  ExpectStillServing(1.0f);  // registers and stores "good"
  std::string pull = Header([](msg::Header::Builder b) {
    b.setKind(msg::Kind::PULL);
    auto names = b.initNames(100000);
    for (unsigned i = 0; i < names.size(); ++i) names.set(i, "good");
  });
  EXPECT_NE(SendRaw({pull}).find("pull names tensor 'good' twice"), std::string::npos);
  std::string push = Header([](msg::Header::Builder b) {
    b.setKind(msg::Kind::PUSH);
    b.setOp(msg::PushOp::ADD);
    auto t = b.initTensors(2);
    for (int i = 0; i < 2; ++i) {
      t[i].setName("good");
      t[i].initShape(1).set(0, 1000);
      t[i].setByteSize(4000);
    }
  });
  EXPECT_NE(SendRaw({push, std::string(4000, '\0'), std::string(4000, '\0')}).find("push names tensor 'good' twice"),
            std::string::npos);
  ExpectStillServing(2.0f);
}

TEST_F(BadInput, AFloodOfJunkIsLoggedBriefly) {
  for (int i = 0; i < 200; ++i) {
    zmq::message_t m("junk", 4);
    raw_->send(m, zmq::send_flags::none);
  }
  EXPECT_TRUE(server_->WaitForLog("more warnings like the above were suppressed", 5000)) << server_->log();
  std::string log = server_->log();
  size_t lines = 0;
  for (size_t p = log.find("bad message from"); p != std::string::npos; p = log.find("bad message from", p + 1))
    ++lines;
  EXPECT_LE(lines, 40u);
  EXPECT_GE(lines, 1u);
  ExpectStillServing(5.5f);
}

TEST_F(BadInput, GarbageBytesOnTheServerPort) {
  std::string junk;
  for (int i = 0; i < 4096; ++i) junk += char((i * 131 + 7) & 0xff);
  RawTcp(PortOf(cfg_.servers[0]), junk);
  RawTcp(PortOf(cfg_.servers[0]), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(server_->WaitForLog("rejected a connection on")) << server_->log();
  ExpectStillServing(3.5f);
}

TEST_F(BadInput, PeerVanishesMidMessage) {
  // A valid ZMTP 3.0 greeting and READY, then a frame announcing 1 MB that stops after
  // 100 bytes: the connection closes with a message half-received.
  std::string greeting(64, '\0');
  greeting[0] = '\xff';
  greeting[9] = '\x7f';
  greeting[10] = 3;
  greeting.replace(12, 4, "NULL");
  std::string ready = std::string("\x04\x1c\x05READY\x0bSocket-Type", 19) + std::string("\0\0\0\x06", 4) + "DEALER";
  std::string frame = std::string("\x02\0\0\0\0\0\x0f\x42\x40", 9) + std::string(100, 'z');
  RawTcp(PortOf(cfg_.servers[0]), greeting + ready + frame);
  EXPECT_TRUE(server_->WaitForLog("disconnected; any partly received message from it was discarded")) << server_->log();

  // A real client killed while pushing 64 MiB tensors: the shard must hold either a whole
  // pushed value or nothing, never part of one.
  JobConfig cfg = cfg_;
  pid_t victim = ForkChild([cfg] {
    ClientOptions o;
    o.rank = 1;
    o.heartbeat = false;
    Client c(cfg, o);
    c.Register(kSpecs);
    std::vector<float> v(16 << 20, 7.0f);
    while (true) c.Wait(c.Push({{"huge", DType::kF32, {16 << 20}, v.data(), v.size() * 4}}, msg::PushOp::ASSIGN));
    return true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  kill(victim, SIGKILL);
  WaitChild(victim, 5000);
  ExpectStillServing(4.5f);
  ClientOptions o;
  o.heartbeat = false;
  o.timeout_ms = 5000;
  Client c(cfg_, o);
  c.Register();
  std::vector<PulledTensor> out;
  try {
    c.Wait(c.Pull({"huge"}, &out));
    auto v = out[0].ToFloats();
    ASSERT_EQ(v.size(), size_t(16 << 20));
    EXPECT_EQ(v.front(), 7.0f);
    EXPECT_EQ(v.back(), 7.0f);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown tensor 'huge'"), std::string::npos) << e.what();
  }
}

// The address space a process has reserved (VmSize), in bytes.
int64_t VirtualBytes(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7)) * 1024;
  return -1;
}

// Limits the shard's address space to what it maps now plus `headroom` bytes (the soft
// limit only: raising a lowered hard limit again takes privileges).
void LimitAddressSpace(pid_t pid, int64_t headroom) {
  int64_t used = VirtualBytes(pid);
  ASSERT_GT(used, 0);
  rlimit lim{rlim_t(used + headroom), RLIM_INFINITY};
  ASSERT_EQ(prlimit(pid, RLIMIT_AS, &lim, nullptr), 0);
}

// A shard holding one 256 MiB tensor is asked for checkpoints it has no memory for: first
// too little for the snapshot (it runs out on the serving thread), then enough for the
// snapshot but not for RocksDB's copies of it (which abort the process if an allocation
// fails inside RocksDB). Both are refused by name, the shard keeps serving with its state
// whole, and once memory is there again the next checkpoint is written.
TEST(ServerOutOfMemory, ACheckpointBeyondTheShardsMemoryIsRefusedAndTheShardKeepsServing) {
#if defined(__SANITIZE_ADDRESS__)
  // ASan's operator new reports running out of memory and aborts instead of throwing
  // std::bad_alloc, and its shadow memory does not fit under this test's RLIMIT_AS.
  GTEST_SKIP() << "not under AddressSanitizer: it aborts on out-of-memory instead of throwing std::bad_alloc";
#endif
  std::string job = testing::WriteJob("oom", 1, 1);
  std::string text = testing::ReadFile(job);
  text.replace(text.find("[job]\n") + 6, 0, "checkpoint_dir = \"" + testing::TempPath("oom-ckpt") + "\"\n");
  testing::WriteFile(job, text);
  JobConfig cfg = LoadJobConfig(job);
  ServerProcess server(job, 0);
  ASSERT_TRUE(server.WaitForLog("listening on")) << server.log();

  constexpr int64_t kBig = int64_t(256) << 20;
  ClientOptions o;
  o.timeout_ms = 30000;  // a loaded machine copies and syncs 256 MiB slowly
  Client c(cfg, o);
  c.Register({{"big", DType::kF32, {kBig / 4}}, {"small", DType::kF32, {4}}});
  {
    std::vector<float> big(size_t(kBig / 4), 1.0f);
    big.back() = 7.0f;
    c.Wait(c.Push({{"big", DType::kF32, {kBig / 4}, big.data(), size_t(kBig)}}, msg::PushOp::ASSIGN));
  }
  // Every path the test uses afterwards runs once before the limit, so the threads and
  // allocator arenas it needs are already counted in what the shard maps.
  std::vector<float> v = {1, 2, 3, 4};
  auto serves = [&](const std::string& when) {
    SCOPED_TRACE(when);
    c.Wait(c.Push({{"small", DType::kF32, {4}, v.data(), 16}}, msg::PushOp::ASSIGN));
    std::vector<PulledTensor> out;
    c.Wait(c.Pull({"small", "big"}, &out));
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].ToFloats()[3], 4.0f);
    ASSERT_EQ(out[1].size(), size_t(kBig));
    float first, last;  // pulled bytes are read by copying (PulledTensor)
    memcpy(&first, out[1].data(), 4);
    memcpy(&last, static_cast<const char*>(out[1].data()) + kBig - 4, 4);
    EXPECT_EQ(first, 1.0f);
    EXPECT_EQ(last, 7.0f);
  };
  serves("before any limit");

  // Half the tensor's size to spare: its snapshot cannot be made.
  LimitAddressSpace(server.pid(), kBig / 2);
  try {
    c.Checkpoint({1, 1, 0, 0, 1});
    ADD_FAILURE() << "a checkpoint whose snapshot cannot fit in the shard's memory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory handling checkpoint"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(server.alive()) << server.log();
  serves("after the snapshot ran out of memory");

  // One and a half times its size: the snapshot fits, RocksDB's two more copies do not.
  LimitAddressSpace(server.pid(), kBig + kBig / 2);
  try {
    c.Checkpoint({2, 1, 0, 0, 1});
    ADD_FAILURE() << "a checkpoint RocksDB has no memory to write succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory writing checkpoint 2 (268435"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(server.alive()) << server.log();
  serves("after the write ran out of memory");

  rlimit none{RLIM_INFINITY, RLIM_INFINITY};
  ASSERT_EQ(prlimit(server.pid(), RLIMIT_AS, &none, nullptr), 0) << strerror(errno);
  c.Checkpoint({3, 1, 0, 0, 1});
  EXPECT_TRUE(server.WaitForLog("wrote checkpoint 3")) << server.log();
  serves("after a checkpoint written with memory to spare");
}

// Sends `frames` from a fresh raw DEALER to `endpoint`; returns the answer's kind and message.
std::pair<msg::Kind, std::string> AskRaw(const std::string& endpoint, const std::vector<std::string>& frames) {
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  for (size_t i = 0; i < frames.size(); ++i) {
    zmq::message_t m(frames[i].data(), frames[i].size());
    s.send(m, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, std::chrono::milliseconds(10000)) == 0) return {msg::Kind::INVALID, "(no answer)"};
  zmq::message_t head;
  EXPECT_TRUE(s.recv(head, zmq::recv_flags::none));
  InMessage in;
  in.ParseHeader(Frame(head.data(), head.size()));
  return {in.header().getKind(), in.header().getMessage()};
}

std::string PushOf(const std::string& name) {
  capnp::MallocMessageBuilder b;
  auto h = b.getRoot<msg::Header>();
  h.setKind(msg::Kind::PUSH);
  h.setOp(msg::PushOp::ASSIGN);
  auto t = h.initTensors(1);
  t[0].setName(name);
  t[0].initShape(1).set(0, 4);
  t[0].setByteSize(16);
  auto words = capnp::messageToFlatArray(b);
  return std::string(reinterpret_cast<const char*>(words.asBytes().begin()), words.asBytes().size());
}

// A shard stores only what the job registered and the coordinator placed on it: a push may
// not create a tensor (which would be kept and checkpointed forever).
TEST(Placement, ShardsAcceptOnlyTheTensorsPlacedOnThem) {
  std::string job = testing::WriteJob("placement", 2, 1);
  JobConfig cfg = LoadJobConfig(job);
  ServerProcess shard0(job, 0), shard1(job, 1);
  ASSERT_TRUE(shard0.WaitForLog("listening on")) << shard0.log();
  ASSERT_TRUE(shard1.WaitForLog("listening on")) << shard1.log();
  std::string at0 = "tcp://" + cfg.servers[0], at1 = "tcp://" + cfg.servers[1];
  std::string data(16, '\0');

  auto before = AskRaw(at1, {PushOf("early"), data});
  EXPECT_EQ(before.first, msg::Kind::ERROR);
  EXPECT_NE(before.second.find("unknown tensor 'early': no worker has registered"), std::string::npos) << before.second;

  ClientOptions o;
  o.timeout_ms = 10000;
  Client c(cfg, o);
  // Equal sizes: placed by name, "a" on shard 0 and "b" on shard 1.
  const ClusterInfo& info = c.Register({{"a", DType::kF32, {4}}, {"b", DType::kF32, {4}}});
  ASSERT_EQ(info.shard_of.at("a"), 0);
  ASSERT_EQ(info.shard_of.at("b"), 1);

  EXPECT_EQ(AskRaw(at1, {PushOf("b"), data}).first, msg::Kind::PUSH_ACK);
  EXPECT_EQ(AskRaw(at0, {PushOf("a"), data}).first, msg::Kind::PUSH_ACK);
  for (auto [endpoint, name, shard] : {std::tuple<std::string, std::string, int>{at1, "a", 1},
                                       {at1, "stranger", 1},
                                       {at0, "b", 0},
                                       {at0, "stranger", 0}}) {
    auto r = AskRaw(endpoint, {PushOf(name), data});
    EXPECT_EQ(r.first, msg::Kind::ERROR) << name << " on shard " << shard;
    EXPECT_NE(r.second.find("push of unknown tensor '" + name + "': not a tensor the job registered on shard " +
                            std::to_string(shard)),
              std::string::npos)
        << r.second;
  }
  capnp::MallocMessageBuilder pull;
  pull.getRoot<msg::Header>().setKind(msg::Kind::PULL);
  pull.getRoot<msg::Header>().initNames(1).set(0, "stranger");
  auto words = capnp::messageToFlatArray(pull);
  auto r = AskRaw(at1, {std::string(reinterpret_cast<const char*>(words.asBytes().begin()), words.asBytes().size())});
  EXPECT_EQ(r.first, msg::Kind::ERROR);
  EXPECT_NE(r.second.find("pull of unknown tensor 'stranger': not a tensor the job registered on shard 1"),
            std::string::npos)
      << r.second;
  std::vector<PulledTensor> out;
  c.Wait(c.Pull({"a", "b"}, &out));
  EXPECT_EQ(out.size(), 2u);
}

// A plain TCP echo service on 127.0.0.1 (what a job file's address may point at by
// mistake): echoes every byte back until the test ends. ZeroMQ's handshake completes
// against it with the client's own greeting, so the client's request comes back to it.
// With `http`, it answers whatever it reads with an HTTP 400 response and closes, as a
// web server does: ZeroMQ's handshake never completes.
class EchoService {
 public:
  explicit EchoService(bool http = false) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    SHOAL_CHECK(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && listen(fd_, 8) == 0, "echo: bind");
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, http] {
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        int c = accept(fd_, nullptr, nullptr);
        if (c >= 0) echoes_.emplace_back([this, c, http] {
          char buf[4096];
          while (!stop_) {
            pollfd q{c, POLLIN, 0};
            if (poll(&q, 1, 50) <= 0) continue;
            ssize_t n = read(c, buf, sizeof buf);
            if (n > 0 && http) {
              const char r[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
              (void)!write(c, r, sizeof r - 1);
              break;
            }
            if (n <= 0 || write(c, buf, size_t(n)) != n) break;
          }
          close(c);
        });
      }
    });
  }
  ~EchoService() {
    stop_ = true;
    thread_.join();
    for (auto& t : echoes_) t.join();
    close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<std::thread> echoes_;
};

// A job file whose shard address points at something else that answers (an echo service):
// one clear error naming the address and saying it is not a Shoal process, at once, not a
// bare "answered with message kind 16" (nor a wait for the timeout).
TEST(WrongService, AShardOrCoordinatorAddressOnAnEchoServiceIsNamed) {
  EchoService echo;
  JobConfig cfg = LoadJobConfig(testing::WriteJob("echo-coordinator", 1, 1));
  cfg.servers = {echo.address()};
  ClientOptions o;
  o.timeout_ms = 20000;
  o.heartbeat = false;
  try {
    Client c(cfg, o);
    c.Register({{"w", DType::kF32, {4}}});
    ADD_FAILURE() << "registered with an echo service";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("register: the coordinator at " + echo.address()), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("not a Shoal process"), std::string::npos) << e.what();
  }

  // Shard 1 of two on the echo service: the coordinator (shard 0) places tensors there, and
  // the first request to it comes back.
  std::string job = testing::WriteJob("echo-shard", 2, 1);
  std::string text = testing::ReadFile(job), shard1 = LoadJobConfig(job).servers[1];
  testing::WriteFile(job, text.replace(text.find(shard1), shard1.size(), echo.address()));
  cfg = LoadJobConfig(job);
  ServerProcess s0(job, 0);
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  try {
    Client c(cfg, o);
    c.Register({{"a", DType::kF32, {1000}}, {"b", DType::kF32, {1000}}});
    std::vector<PulledTensor> out;
    c.Wait(c.Pull({"a", "b"}, &out));
    ADD_FAILURE() << "pulled from an echo service";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard 1 at " + echo.address() + " answered pull"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("not a Shoal process"), std::string::npos) << e.what();
  }
}

// The same for a job without servers: the rendezvous store's coordinator address.
TEST(WrongService, ARendezvousCoordinatorOnAnEchoServiceIsNamed) {
  EchoService echo;
  CoordinatorStore store("tcp://" + echo.address(), CurveKeys{}, 20000);
  try {
    store.Set("ring-0", "tcp://127.0.0.1:1");
    ADD_FAILURE() << "an echo service stored a key";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the coordinator at tcp://" + echo.address()), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("not a Shoal process"), std::string::npos) << e.what();
  }
}

// An address where a web server listens: ZeroMQ's handshake fails on every reconnect. The
// client waited out its whole timeout and said only "did not answer within N ms".
TEST(WrongService, AnAddressOnAnHttpServerIsNamedAsNotAZeroMQService) {
  EchoService web(/*http=*/true);
  JobConfig cfg = LoadJobConfig(testing::WriteJob("http-coordinator", 1, 1));
  cfg.servers = {web.address()};
  ClientOptions o;
  o.timeout_ms = 1500;
  o.heartbeat = false;
  const std::string named = "the peer at tcp://" + web.address() + " is not a Shoal/ZeroMQ service (handshake failed";
  try {
    Client c(cfg, o);
    c.Register({{"w", DType::kF32, {4}}});
    ADD_FAILURE() << "registered with a web server";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
  }
  CoordinatorStore store("tcp://" + web.address(), CurveKeys{}, 1500);
  try {
    store.Set("ring-0", "tcp://127.0.0.1:1");
    ADD_FAILURE() << "a web server stored a key";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shoal
