// KV shard semantics (assign, add, apply hook, copy-on-write) and byte-balanced placement.
#include <gtest/gtest.h>

#include <map>

#include "common/error.h"
#include "server/coordinator.h"
#include "server/kv_shard.h"

namespace shoal {
namespace {

Frame Floats(const std::vector<float>& v) { return Frame(v.data(), v.size() * 4); }
const float* F(const StoredTensor* t) { return reinterpret_cast<const float*>(t->buf->data()); }

TEST(KvShard, AssignAddAndVersions) {
  KvShard kv;
  kv.Push("w", DType::kF32, {3}, Floats({1, 2, 3}), msg::PushOp::ADD);  // first push creates
  kv.Push("w", DType::kF32, {3}, Floats({10, 20, 30}), msg::PushOp::ADD);
  const StoredTensor* t = kv.Find("w");
  ASSERT_TRUE(t);
  EXPECT_EQ(F(t)[0], 11);
  EXPECT_EQ(F(t)[2], 33);
  EXPECT_EQ(t->version, 2u);
  kv.Push("w", DType::kF32, {3}, Floats({5, 5, 5}), msg::PushOp::ASSIGN);
  EXPECT_EQ(F(kv.Find("w"))[1], 5);
  EXPECT_EQ(kv.bytes(), 12u);
  EXPECT_THROW(kv.Push("w", DType::kF32, {4}, Floats({1, 1, 1, 1}), msg::PushOp::ADD), Error);
  EXPECT_EQ(kv.Find("nope"), nullptr);
}

TEST(KvShard, AssignReusesAnUnsharedBufferAndHandsBackTheReplacedBytes) {
  KvShard kv;
  kv.Push("w", DType::kF32, {2}, Floats({1, 2}), msg::PushOp::ASSIGN);
  const Buffer* first = kv.Find("w")->buf.get();
  const StoredTensor* stored = nullptr;
  Frame replaced = kv.Push("w", DType::kF32, {2}, Floats({3, 4}), msg::PushOp::ASSIGN, &stored);
  EXPECT_EQ(stored, kv.Find("w"));
  EXPECT_EQ(kv.Find("w")->buf.get(), first);  // the same Buffer, new bytes
  EXPECT_EQ(F(kv.Find("w"))[1], 4);
  EXPECT_EQ(kv.Find("w")->version, 2u);
  ASSERT_EQ(replaced.size(), 8u);  // the old bytes, for the caller to free after answering
  EXPECT_EQ(reinterpret_cast<const float*>(replaced.data())[0], 1);

  // A buffer a pending pull reply still holds is never written or reused: the push gets a new one.
  std::shared_ptr<Buffer> in_flight = kv.Find("w")->buf;
  replaced = kv.Push("w", DType::kF32, {2}, Floats({5, 6}), msg::PushOp::ASSIGN);
  EXPECT_EQ(replaced.size(), 0u);
  EXPECT_NE(kv.Find("w")->buf.get(), in_flight.get());
  EXPECT_EQ(reinterpret_cast<const float*>(in_flight->data())[0], 3);  // the sent bytes did not change
  EXPECT_EQ(F(kv.Find("w"))[0], 5);

  // An assign of another shape replaces the shape and drops the update rule's state.
  kv.Push("w", DType::kF32, {3}, Floats({7, 8, 9}), msg::PushOp::ASSIGN);
  EXPECT_EQ(kv.Find("w")->shape, std::vector<int64_t>{3});
  EXPECT_EQ(F(kv.Find("w"))[2], 9);
}

TEST(KvShard, CopiesOnWriteWhileABufferIsBeingSent) {
  KvShard kv;
  kv.Push("w", DType::kF32, {2}, Floats({1, 2}), msg::PushOp::ASSIGN);
  std::shared_ptr<Buffer> in_flight = kv.Find("w")->buf;  // as a pending pull reply holds it
  kv.Push("w", DType::kF32, {2}, Floats({1, 1}), msg::PushOp::ADD);
  EXPECT_EQ(reinterpret_cast<const float*>(in_flight->data())[0], 1);  // the sent bytes did not change
  EXPECT_EQ(F(kv.Find("w"))[0], 2);
}

// A shard keeps a pushed frame as ZeroMQ delivered it: frames of 34 bytes to 8 KiB lie at
// whatever offset of ZeroMQ's receive buffer they arrived. What its updates read as floats
// (the stored value, the pushed gradient) is copied to alignment first (ASan + UBSan's
// misaligned-load check is what this guards).
TEST(KvShard, KeepsFramesAsReceivedAndAlignsWhatItUpdates) {
  TransportContext ctx;
  Transport server(ctx, Transport::Kind::kServer, {});
  std::string ep = server.Bind("tcp://127.0.0.1:*");
  Transport client(ctx, Transport::Kind::kClient, {});
  client.Connect(ep);
  InMessage in;
  in.align_payloads = false;  // as the shard's loop receives
  // `v` (over 33 bytes) sent until it arrives at an odd offset.
  auto misaligned = [&](const std::vector<float>& v) {
    for (int k = 0; k < 16; ++k) {
      OutMessage m;
      m.header().setKind(msg::Kind::PUSH);
      m.header().setBarrierName(std::string(size_t(k), 'x'));  // shifts where the frame lands
      Payload p;
      p.data = v.data();
      p.size = v.size() * 4;
      m.payloads.push_back(std::move(p));
      client.Send(m);
      EXPECT_TRUE(server.Recv(&in, 5000));
      if (in.payloads.size() == 1 && !in.payloads[0].aligned()) return std::move(in.payloads[0]);
    }
    ADD_FAILURE() << "ZeroMQ delivered every frame aligned";
    return Floats(v);
  };
  std::vector<float> a(16), b(16);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i) + 0.25f;
    b[i] = 100.0f - float(i);
  }
  KvShard kv;  // its default rule adds (param += grad)
  Frame first = misaligned(a);
  const void* received = first.data();
  kv.Push("w", DType::kF32, {16}, std::move(first), msg::PushOp::ASSIGN);
  EXPECT_EQ(kv.Find("w")->buf->data(), received);  // kept, not copied
  kv.Push("w", DType::kF32, {16}, misaligned(b), msg::PushOp::ADD);
  const StoredTensor* t = kv.Find("w");
  EXPECT_TRUE(t->buf->bytes.aligned());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(F(t)[i], a[i] + b[i]) << i;
  kv.Push("w", DType::kF32, {16}, misaligned(b), msg::PushOp::APPLY);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(F(kv.Find("w"))[i], a[i] + 2 * b[i]) << i;
  EXPECT_EQ(kv.Find("w")->version, 3u);
}

TEST(KvShard, Fp16AddAndApplyHook) {
  KvShard kv;
  uint16_t h[2] = {FloatToHalf(1.5f), FloatToHalf(-2)};
  kv.Push("h", DType::kF16, {2}, Frame(h, 4), msg::PushOp::ADD);
  kv.Push("h", DType::kF16, {2}, Frame(h, 4), msg::PushOp::ADD);
  auto* d = reinterpret_cast<const uint16_t*>(kv.Find("h")->buf->data());
  EXPECT_EQ(HalfToFloat(d[0]), 3.0f);
  EXPECT_EQ(HalfToFloat(d[1]), -4.0f);

  // A server-side momentum SGD step plugs in as an UpdateRule, keeping its velocity in
  // the tensor's rule_state: v = 0.5 v + g; w -= 0.5 v.
  struct Momentum : UpdateRule {
    void Apply(const std::string&, StoredTensor& p, const void* g, size_t) override {
      if (!p.rule_state) p.rule_state = std::make_shared<std::vector<float>>(p.elements(), 0.0f);
      auto& v = *std::static_pointer_cast<std::vector<float>>(p.rule_state);
      float* w = reinterpret_cast<float*>(p.buf->data());
      for (size_t i = 0; i < p.elements(); ++i) {
        v[i] = 0.5f * v[i] + static_cast<const float*>(g)[i];
        w[i] -= 0.5f * v[i];
      }
    }
  };
  kv.SetUpdateRule(std::make_unique<Momentum>());
  kv.Push("w", DType::kF32, {2}, Floats({1, 1}), msg::PushOp::ASSIGN);
  kv.Push("w", DType::kF32, {2}, Floats({2, 4}), msg::PushOp::APPLY);  // v = 2,4; w = 0,-1
  EXPECT_EQ(F(kv.Find("w"))[0], 0);
  EXPECT_EQ(F(kv.Find("w"))[1], -1);
  kv.Push("w", DType::kF32, {2}, Floats({2, 4}), msg::PushOp::APPLY);  // v = 3,6; w = -1.5,-4
  EXPECT_EQ(F(kv.Find("w"))[0], -1.5f);
  EXPECT_EQ(F(kv.Find("w"))[1], -4);
  EXPECT_EQ(kv.Find("w")->version, 3u);
}

TEST(Placement, BalancesBytesAndKeepsTensorsWhole) {
  std::vector<TensorPlacement> ts = {{"a", 100}, {"b", 60}, {"c", 50}, {"d", 40}, {"e", 10}};
  auto p = PlaceTensors(ts, 2);
  uint64_t load[2] = {0, 0};
  for (auto& t : p) load[t.shard] += t.bytes;
  // Largest first onto the lighter shard: a->0, b->1, c->1, d->0, e->1.
  EXPECT_EQ(load[0], 140u);
  EXPECT_EQ(load[1], 120u);
  EXPECT_EQ(PlaceTensors(ts, 2)[3].shard, p[3].shard);  // deterministic
  EXPECT_THROW(PlaceTensors(ts, 0), Error);
}

// A resumed job keeps every checkpointed tensor on the shard that restores it, even where a
// fresh placement of its list (one clock more or less) would move it; the added ones go to
// the lighter shard.
TEST(Placement, AResumeKeepsCheckpointedTensorsOnTheirShards) {
  std::vector<TensorPlacement> ts = {
      {"w", 100},         {"b", 8}, {"__shoal/clock/0", 4}, {"__shoal/clock/1", 4}, {"__shoal/clock/2", 4},
      {"__shoal/stop", 4}};
  // The run before (clocks 0 and 1) kept them so, with shard 0 the heavier.
  std::map<std::string, int> kept = {
      {"w", 0}, {"b", 1}, {"__shoal/clock/0", 0}, {"__shoal/clock/1", 1}, {"__shoal/stop", 0}};
  auto p = PlaceAround(ts, kept, 2);
  ASSERT_EQ(p.size(), ts.size());
  for (auto& t : p) {
    if (kept.count(t.name))
      EXPECT_EQ(t.shard, kept[t.name]) << t.name;
    else
      EXPECT_EQ(t.shard, 1) << t.name << ": not on the lighter shard";
  }
  EXPECT_THROW(PlaceAround(ts, {{"w", 2}}, 2), Error);  // kept on a shard the job no longer has
}

}  // namespace
}  // namespace shoal
