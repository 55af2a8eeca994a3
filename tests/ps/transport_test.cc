// Schema round-trip and the Transport itself: header + zero-copy tensor frames over TCP.
#include <atomic>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/transport/heartbeat.h"
#include "common/transport/transport.h"

namespace shoal {
namespace {

TEST(Schema, RoundTripsEveryField) {
  OutMessage out;
  auto h = out.header();
  h.setKind(msg::Kind::PULL_REPLY);
  h.setRequestId(0x123456789abcULL);
  h.setRole(msg::Role::SERVER);
  h.setRank(3);
  auto t = h.initTensors(1);
  t[0].setName("fc1.weight");
  t[0].setDtype(msg::DType::BF16);
  auto shape = t[0].initShape(2);
  shape.set(0, 300);
  shape.set(1, 7);
  t[0].setByteSize(300 * 7 * 2);
  t[0].setVersion(9);
  auto names = h.initNames(2);
  names.set(0, "a");
  names.set(1, "b");
  h.setOp(msg::PushOp::APPLY);
  auto cm = h.initCluster();
  auto servers = cm.initServers(2);
  servers.set(0, "127.0.0.1:1");
  servers.set(1, "127.0.0.1:2");
  cm.setWorldSize(4);
  auto pl = cm.initPlacement(1);
  pl[0].setName("fc1.weight");
  pl[0].setShard(1);
  pl[0].setByteSize(4200);
  h.setBarrierName("epoch-1");
  h.setMessage("hello");

  auto words = capnp::messageToFlatArray(out.builder);
  Frame frame(words.asBytes().begin(), words.asBytes().size());
  InMessage in;
  in.ParseHeader(frame);
  auto r = in.header();
  EXPECT_EQ(r.getKind(), msg::Kind::PULL_REPLY);
  EXPECT_EQ(r.getRequestId(), 0x123456789abcULL);
  EXPECT_EQ(r.getRole(), msg::Role::SERVER);
  EXPECT_EQ(r.getRank(), 3);
  ASSERT_EQ(r.getTensors().size(), 1u);
  EXPECT_EQ(std::string(r.getTensors()[0].getName()), "fc1.weight");
  EXPECT_EQ(r.getTensors()[0].getDtype(), msg::DType::BF16);
  EXPECT_EQ(r.getTensors()[0].getShape()[1], 7);
  EXPECT_EQ(r.getTensors()[0].getByteSize(), 4200u);
  EXPECT_EQ(r.getTensors()[0].getVersion(), 9u);
  EXPECT_EQ(std::string(r.getNames()[1]), "b");
  EXPECT_EQ(r.getOp(), msg::PushOp::APPLY);
  EXPECT_EQ(std::string(r.getCluster().getServers()[1]), "127.0.0.1:2");
  EXPECT_EQ(r.getCluster().getWorldSize(), 4);
  EXPECT_EQ(r.getCluster().getPlacement()[0].getShard(), 1u);
  EXPECT_EQ(std::string(r.getBarrierName()), "epoch-1");
  EXPECT_EQ(std::string(r.getMessage()), "hello");
}

TEST(Schema, RejectsTruncatedAndGarbageHeaders) {
  OutMessage out;
  out.header().setMessage("some text to make it longer than a few words");
  auto words = capnp::messageToFlatArray(out.builder);
  auto bytes = words.asBytes();
  InMessage in;
  Frame odd(bytes.begin(), bytes.size() - 3);
  EXPECT_THROW(in.ParseHeader(odd), Error);
  Frame cut(bytes.begin(), bytes.size() - 8);  // whole words, but the text is cut off
  EXPECT_THROW(in.ParseHeader(cut), Error);
  std::string junk(64, '\xff');
  Frame garbage(junk.data(), junk.size());
  EXPECT_THROW(in.ParseHeader(garbage), Error);
  Frame empty;
  EXPECT_THROW(in.ParseHeader(empty), Error);
}

// A header whose root holds `pointers` list pointers, the first `shared` of them to one and the
// same list of `elems` words: Cap'n Proto's amplification (the bytes are read once per
// pointer). As a flat frame: segment table, root pointer, the root's pointers, the list.
Frame SharedListHeader(uint32_t pointers, uint32_t shared, uint32_t elems) {
  std::vector<uint64_t> w;
  const uint32_t segment = 1 + pointers + elems;
  w.push_back(uint64_t(segment) << 32);      // one segment of `segment` words
  w.push_back(uint64_t(pointers) << 48);     // root: struct, 0 data words
  for (uint32_t k = 0; k < pointers; ++k) {  // pointer k sits at segment word 1 + k
    if (k >= shared) {
      w.push_back(0);  // null
      continue;
    }
    int64_t offset = int64_t(1 + pointers) - int64_t(1 + k + 1);  // to the list, from past the pointer
    w.push_back(1 | (uint64_t(offset) << 2) | (uint64_t(5 | (elems << 3)) << 32));  // list of 8-byte elements
  }
  for (uint32_t i = 0; i < elems; ++i) w.push_back(i);
  return Frame(w.data(), w.size() * sizeof(uint64_t));
}

TEST(Schema, RefusesAmplifiedHeadersAndKeepsPlainOnes) {
  InMessage in;
  // The same 200 words through one pointer: an ordinary header.
  EXPECT_NO_THROW(in.ParseHeader(SharedListHeader(16, 1, 200)));
  // ... and through 16: refused when parsed, before any handler reads it.
  try {
    in.ParseHeader(SharedListHeader(16, 16, 200));
    ADD_FAILURE() << "an amplified header was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a valid Cap'n Proto message"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(in.has_header());
}

TEST(Transport, SendsTensorFramesWithoutCopying) {
  TransportContext ctx;
  Transport server(ctx, Transport::Kind::kServer, {});
  std::string ep = server.Bind("tcp://127.0.0.1:*");
  Transport client(ctx, Transport::Kind::kClient, {});
  client.Connect(ep);

  std::vector<float> data(1 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i);
  std::atomic<int> released{0};
  OutMessage m;
  auto h = m.header();
  h.setKind(msg::Kind::PUSH);
  h.setRequestId(7);
  auto t = h.initTensors(1);
  t[0].setName("x");
  t[0].setDtype(msg::DType::FP32);
  t[0].initShape(1).set(0, data.size());
  t[0].setByteSize(data.size() * 4);
  Payload p;
  p.data = data.data();
  p.size = data.size() * 4;
  p.on_release = [&] { ++released; };
  m.payloads.push_back(std::move(p));
  client.Send(m);

  InMessage in;
  ASSERT_TRUE(server.Recv(&in, 5000));
  EXPECT_GT(in.identity.size(), 0u);
  EXPECT_EQ(in.header().getRequestId(), 7u);
  ASSERT_EQ(in.payloads.size(), 1u);
  EXPECT_NO_THROW(in.ValidateTensors());
  const float* got = static_cast<const float*>(in.payloads[0].data());
  EXPECT_EQ(got[12345], 12345.0f);
  // ZeroMQ released our buffer itself rather than a copy of it.
  for (int i = 0; i < 500 && released == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(released, 1);

  // A reply routed back by identity.
  OutMessage reply;
  reply.header().setKind(msg::Kind::PUSH_ACK);
  reply.header().setRequestId(7);
  server.Send(reply, &in.identity);
  InMessage back;
  ASSERT_TRUE(client.Recv(&back, 5000));
  EXPECT_EQ(back.header().getKind(), msg::Kind::PUSH_ACK);
  EXPECT_FALSE(client.Recv(&back, 10));  // nothing more: a bounded wait times out
}

// Sends a header-only message numbered `id` (OutMessage cannot be returned: its builder points
// into it).
void SendNumbered(Transport& t, uint64_t id, const PeerId* to = nullptr) {
  OutMessage m;
  m.header().setKind(msg::Kind::PUSH_ACK);
  m.header().setRequestId(id);
  t.Send(m, to);
}

// A wait right after a receive that found nothing sleeps on the socket's ZMQ_FD alone, which
// signals only ZeroMQ's next command: it must still wake for a message sent later, from
// another thread, on any of several sockets.
TEST(Transport, AWaitAfterAnEmptyReceiveWakesForTheNextMessage) {
  TransportContext ctx;
  Transport a(ctx, Transport::Kind::kServer, {}), b(ctx, Transport::Kind::kServer, {});
  std::string ep_b = b.Bind("tcp://127.0.0.1:*");
  a.Bind("tcp://127.0.0.1:*");
  Transport client(ctx, Transport::Kind::kClient, {});
  client.Connect(ep_b);
  InMessage in;
  EXPECT_FALSE(a.Recv(&in, 0));
  EXPECT_FALSE(b.Recv(&in, 0));
  std::thread sender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    SendNumbered(client, 41);
  });
  std::vector<char> ready;
  bool woke = WaitAny({&a, &b}, 10000, &ready);
  sender.join();
  ASSERT_TRUE(woke);
  EXPECT_EQ(ready, std::vector<char>({0, 1}));
  ASSERT_TRUE(b.Recv(&in, 0));
  EXPECT_EQ(in.header().getRequestId(), 41u);
  EXPECT_FALSE(b.Recv(&in, 0));
  EXPECT_FALSE(b.Recv(&in, 10));  // nothing more: the bounded wait times out
  // A second message while the receiver sleeps in Recv itself.
  std::thread again([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    SendNumbered(client, 42);
  });
  bool got = b.Recv(&in, 10000);
  again.join();
  ASSERT_TRUE(got);
  EXPECT_EQ(in.header().getRequestId(), 42u);
}

// A send handles ZeroMQ's pending commands too, the "a message came" one among them, and
// takes ZMQ_FD's signal with it: a wait after it must not sleep on that descriptor.
TEST(Transport, AWaitAfterASendSeesAMessageThatCameBeforeIt) {
  TransportContext ctx;
  Transport server(ctx, Transport::Kind::kServer, {});
  std::string ep = server.Bind("tcp://127.0.0.1:*");
  Transport client(ctx, Transport::Kind::kClient, {});
  client.Connect(ep);
  SendNumbered(client, 1);
  InMessage in;
  ASSERT_TRUE(server.Recv(&in, 5000));
  PeerId peer = in.identity;
  EXPECT_FALSE(server.Recv(&in, 0));  // drained
  SendNumbered(client, 2);
  // Time for the message to arrive, and for ZeroMQ's send-side throttle (about 1 ms) to let
  // the reply below handle commands.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  SendNumbered(server, 3, &peer);
  ASSERT_TRUE(server.Wait(5000));
  ASSERT_TRUE(server.Recv(&in, 0));
  EXPECT_EQ(in.header().getRequestId(), 2u);
  ASSERT_TRUE(client.Recv(&in, 5000));
  EXPECT_EQ(in.header().getRequestId(), 3u);
}

// Found by the ASan + UBSan suite: ZeroMQ delivered small frames at odd offsets of its
// receive buffer, and the shards read them as floats (a misaligned load). Frames up to 33
// bytes are held inside the zmq_msg_t (aligned); larger ones up to ZeroMQ's 8 KiB batch land
// in its receive buffer at whatever offset the bytes before them left.
TEST(Transport, ReceivedPayloadsAreAlignedForFloats) {
  TransportContext ctx;
  Transport server(ctx, Transport::Kind::kServer, {});
  std::string ep = server.Bind("tcp://127.0.0.1:*");
  Transport client(ctx, Transport::Kind::kClient, {});
  client.Connect(ep);
  std::vector<float> data(75);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i) + 0.5f;
  const size_t sizes[] = {4, 100, 200, 300};
  auto send_eight = [&] {
    for (int k = 0; k < 8; ++k) {
      OutMessage m;
      m.header().setKind(msg::Kind::PUSH);
      m.header().setBarrierName(std::string(size_t(k), 'x'));  // shifts where the payloads land
      for (size_t n : sizes) {
        Payload p;
        p.data = data.data();
        p.size = n;
        m.payloads.push_back(std::move(p));
      }
      client.Send(m);
    }
  };
  // Received as floats: every frame 8-byte aligned, the bytes unchanged.
  send_eight();
  for (int k = 0; k < 8; ++k) {
    InMessage in;
    ASSERT_TRUE(server.Recv(&in, 5000));
    ASSERT_EQ(in.payloads.size(), 4u);
    for (size_t f = 0; f < 4; ++f) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(in.payloads[f].data()) % 8, 0u) << "message " << k << ", frame " << f;
      ASSERT_EQ(in.payloads[f].size(), sizes[f]);
      EXPECT_EQ(memcmp(in.payloads[f].data(), data.data(), sizes[f]), 0) << "message " << k << ", frame " << f;
    }
  }
  // A receiver that only copies the bytes out (the PS client's pulled tensors) keeps every
  // frame as ZeroMQ delivered it: the same bytes, some at odd offsets, none copied.
  send_eight();
  int misaligned = 0;
  InMessage in;
  in.align_payloads = false;
  for (int k = 0; k < 8; ++k) {
    ASSERT_TRUE(server.Recv(&in, 5000));
    ASSERT_EQ(in.payloads.size(), 4u);
    for (size_t f = 0; f < 4; ++f) {
      misaligned += reinterpret_cast<uintptr_t>(in.payloads[f].data()) % 8 != 0;
      ASSERT_EQ(in.payloads[f].size(), sizes[f]);
      EXPECT_EQ(memcmp(in.payloads[f].data(), data.data(), sizes[f]), 0) << "message " << k << ", frame " << f;
    }
  }
  EXPECT_GT(misaligned, 0);
}

Frame FrameOf(OutMessage& m) {
  auto words = capnp::messageToFlatArray(m.builder);
  return Frame(words.asBytes().begin(), words.asBytes().size());
}

// Server::Run and Client::Wait decode every message into one InMessage, which keeps its
// header copy and reader for the next: each header must still be read afresh (nothing of
// the one before shows through), a refused one leaves none, and after a large header (a
// registration naming many tensors) smaller ones parse as before.
TEST(Schema, AReusedInMessageReadsEachHeaderAfresh) {
  InMessage in;
  OutMessage big;
  big.header().setKind(msg::Kind::PULL);
  auto names = big.header().initNames(20000);  // some 60,000 words: more than one keeps
  for (unsigned i = 0; i < names.size(); ++i) names.set(i, "tensor-" + std::to_string(i));
  in.ParseHeader(FrameOf(big));
  ASSERT_EQ(in.header().getNames().size(), 20000u);
  EXPECT_EQ(std::string(in.header().getNames()[19999]), "tensor-19999");

  OutMessage ack;
  ack.header().setKind(msg::Kind::PUSH_ACK);
  ack.header().setRequestId(42);
  in.ParseHeader(FrameOf(ack));
  EXPECT_EQ(in.header().getKind(), msg::Kind::PUSH_ACK);
  EXPECT_EQ(in.header().getRequestId(), 42u);
  EXPECT_EQ(in.header().getNames().size(), 0u);

  std::string junk(64, '\xff');
  EXPECT_THROW(in.ParseHeader(Frame(junk.data(), junk.size())), Error);
  EXPECT_FALSE(in.has_header());
  EXPECT_EQ(in.header().getRequestId(), 0u);  // an empty header, not the one before

  OutMessage push;
  push.header().setKind(msg::Kind::PUSH);
  push.header().setRequestId(7);
  auto t = push.header().initTensors(1);
  t[0].setName("w");
  t[0].setDtype(msg::DType::FP32);
  t[0].initShape(1).set(0, 4);
  t[0].setByteSize(16);
  std::vector<Frame> frames;
  frames.emplace_back("peer-a", 6);
  frames.push_back(FrameOf(push));
  frames.emplace_back(16);
  in.Decode(std::move(frames), /*with_identity=*/true);
  EXPECT_EQ(in.identity, "peer-a");
  ASSERT_EQ(in.payloads.size(), 1u);
  const std::vector<TensorEntry>& entries = in.ValidateTensors();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(std::string(entries[0].name), "w");
  EXPECT_EQ(entries[0].dtype, msg::DType::FP32);
  std::vector<int64_t> shape{9, 9, 9};
  entries[0].ShapeInto(&shape);
  EXPECT_EQ(shape, std::vector<int64_t>{4});
  EXPECT_EQ(entries[0].byte_size, 16u);
  EXPECT_EQ(std::string(in.header().getTensors()[0].getName()), "w");

  // A message whose header is refused keeps none of its frames.
  frames.clear();
  frames.emplace_back("peer-c", 6);
  frames.emplace_back(junk.data(), junk.size());
  frames.emplace_back(16);
  EXPECT_THROW(in.Decode(std::move(frames), /*with_identity=*/true), BadMessage);
  EXPECT_TRUE(in.payloads.empty());
  EXPECT_FALSE(in.has_header());

  frames.clear();
  frames.emplace_back("peer-b", 6);
  frames.push_back(FrameOf(ack));
  in.Decode(std::move(frames), /*with_identity=*/true);
  EXPECT_EQ(in.identity, "peer-b");
  EXPECT_TRUE(in.payloads.empty());
  EXPECT_EQ(in.header().getRequestId(), 42u);
  EXPECT_EQ(in.header().getTensors().size(), 0u);

  // A moved-from message's header stays valid in the one it moved to.
  InMessage moved(std::move(in));
  EXPECT_EQ(moved.header().getKind(), msg::Kind::PUSH_ACK);
  EXPECT_TRUE(moved.has_header());
}

TEST(Transport, ValidateTensorsNamesTheMismatch) {
  OutMessage m;
  auto t = m.header().initTensors(2);
  t[0].setName("w");
  t[0].setDtype(msg::DType::FP32);
  t[0].initShape(1).set(0, 4);
  t[0].setByteSize(16);
  t[1].setName("b");
  t[1].setByteSize(0);
  InMessage in;
  in.ParseHeader(FrameOf(m));
  in.payloads.emplace_back(16);
  try {
    in.ValidateTensors();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 tensors but 1 data frames"), std::string::npos) << e.what();
  }
  in.payloads.clear();
  in.payloads.emplace_back(12);
  in.payloads.emplace_back(0);
  try {
    in.ValidateTensors();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w': data frame has 12 bytes"), std::string::npos) << e.what();
  }
}

TEST(Heartbeat, NobodyListeningNeitherBlocksNorQueuesWithoutBound) {
  TransportContext ctx;
  auto t0 = std::chrono::steady_clock::now();
  {
    // Port 1 on loopback: nobody listens there.
    HeartbeatSender hb(ctx, "tcp://127.0.0.1:1", {}, msg::Role::WORKER, 0, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST(Curve, MismatchedOrBadKeysAreRefusedAtStartup) {
  TransportContext ctx;
  auto server = CurveKeyPair(), client = CurveKeyPair();
  CurveKeys keys{server.first, server.second, client.first, client.second};
  EXPECT_NO_THROW(Transport(ctx, Transport::Kind::kServer, keys));
  EXPECT_NO_THROW(Transport(ctx, Transport::Kind::kClient, keys));
  CurveKeys swapped = keys;
  swapped.server_secret = client.second;
  try {
    Transport t(ctx, Transport::Kind::kServer, swapped);
    FAIL() << "mismatched pair accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("server_secret_key does not belong to server_public_key"), std::string::npos)
        << e.what();
  }
  CurveKeys bad = keys;
  bad.client_public = std::string(40, ' ');
  EXPECT_THROW(Transport(ctx, Transport::Kind::kClient, bad), Error);
}

// Every keyed client socket (the gossip links, the PS shard links, not only the coordinator's)
// can say why nothing came back: another job's peer refused its handshake, at that address.
// A working link gives no hint, and the bound side takes nothing from the stranger.
TEST(Curve, AnyKeyedClientRefusedByAnotherJobSaysSoAndWhere) {
  TransportContext server_ctx("server"), client_ctx("client");
  auto server = CurveKeyPair(), client = CurveKeyPair();
  CurveKeys job{server.first, server.second, client.first, client.second};
  Transport bound(server_ctx, Transport::Kind::kServer, job);
  std::string ep = bound.Bind("tcp://127.0.0.1:*");
  auto send = [](Transport& t) {
    OutMessage m;
    m.header().setKind(msg::Kind::GOSSIP);
    m.header().setRequestId(7);
    t.Send(m);
  };
  auto other_server = CurveKeyPair(), other_client = CurveKeyPair();
  for (const CurveKeys& stranger : {CurveKeys{other_server.first, other_server.second, other_client.first,
                                              other_client.second},  // another job altogether
                                    CurveKeys{server.first, "", other_client.first, other_client.second}}) {
    Transport link(client_ctx, Transport::Kind::kClient, stranger);  // no EnableMonitor: it is on
    link.Connect(ep);
    send(link);
    InMessage got;
    EXPECT_FALSE(bound.Recv(&got, 1000)) << "the bound side took a message from a foreign key";
    std::string hint = link.RefusalHint();
    EXPECT_NE(hint.find("handshake with " + ep + " failed"), std::string::npos) << hint;
    EXPECT_NE(hint.find("[security] keys"), std::string::npos) << hint;
  }
  Transport member(client_ctx, Transport::Kind::kClient, job);
  member.Connect(ep);
  send(member);
  InMessage got;
  ASSERT_TRUE(bound.Recv(&got, 5000));
  EXPECT_EQ(got.header().getRequestId(), 7u);
  EXPECT_EQ(member.RefusalHint(), "");
}

// The bound side hands refused connections to the refusal log, disconnects included: its
// owner's own log sees none of a stranger's attempts, and a member's disconnect still.
TEST(Curve, ABoundSocketsRefusalsGoToTheRefusalLogNotItsEvents) {
  TransportContext server_ctx("bound"), client_ctx("stranger");
  auto server = CurveKeyPair(), client = CurveKeyPair(), other_server = CurveKeyPair(), other = CurveKeyPair();
  CurveKeys job{server.first, server.second, client.first, client.second};
  CurveKeys stranger{other_server.first, other_server.second, other.first, other.second};
  Transport bound(server_ctx, Transport::Kind::kServer, job);
  std::string ep = bound.Bind("tcp://127.0.0.1:*");
  std::vector<SocketEvent> events;
  for (int i = 0; i < 5; ++i) {
    Transport link(client_ctx, Transport::Kind::kClient, stranger);
    link.Connect(ep);
    for (int j = 0; j < 10; ++j) {
      bound.Wait(20);
      for (auto& e : bound.DrainEvents()) events.push_back(e);
    }
  }
  for (const auto& e : events) ADD_FAILURE() << "the owner saw: " << e.Describe();
  EXPECT_NE(RefusedHandshakes().find("handshake(s) from a peer of " + ep + " were refused"), std::string::npos)
      << RefusedHandshakes();
  {
    Transport member(client_ctx, Transport::Kind::kClient, job);
    member.Connect(ep);
    OutMessage m;
    m.header().setKind(msg::Kind::GOSSIP);
    member.Send(m);
    InMessage got;
    ASSERT_TRUE(bound.Recv(&got, 5000));
  }
  bool disconnect = false;
  for (int j = 0; j < 250 && !disconnect; ++j) {
    bound.Wait(20);
    for (auto& e : bound.DrainEvents()) disconnect |= e.is_disconnect();
  }
  EXPECT_TRUE(disconnect) << "a member's disconnect was swallowed";
}

TEST(Curve, KeyPairsAreZ85) {
  auto kp = CurveKeyPair();
  EXPECT_EQ(kp.first.size(), 40u);
  EXPECT_EQ(kp.second.size(), 40u);
  EXPECT_NE(kp.first, CurveKeyPair().first);
}

}  // namespace
}  // namespace shoal
