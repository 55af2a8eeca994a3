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

TEST(KvShard, CopiesOnWriteWhileABufferIsBeingSent) {
  KvShard kv;
  kv.Push("w", DType::kF32, {2}, Floats({1, 2}), msg::PushOp::ASSIGN);
  std::shared_ptr<Buffer> in_flight = kv.Find("w")->buf;  // as a pending pull reply holds it
  kv.Push("w", DType::kF32, {2}, Floats({1, 1}), msg::PushOp::ADD);
  EXPECT_EQ(reinterpret_cast<const float*>(in_flight->data())[0], 1);  // the sent bytes did not change
  EXPECT_EQ(F(kv.Find("w"))[0], 2);
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
