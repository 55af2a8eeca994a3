// Memory reuse by liveness (memory_plan.h): a hand-worked plan; training with and without
// reuse gives the same bits (loss, every gradient, logits, across batch sizes) for zoo
// models and imported graphs with residual and branching structure; the peak bytes the
// backend counts fall by exactly what the plan says.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include "tests/engine/grad_check.h"
#include "worker/engine/memory_plan.h"
#include "worker/engine/model.h"
#include "worker/engine/onnx/onnx_export.h"
#include "worker/engine/onnx/onnx_import.h"

namespace shoal {
namespace {

using testing_util::Host;

const std::string kDir = "tests/engine/testdata/";

// A chain of three layers whose backward reads neither inputs nor output, 100 bytes each:
//   outputs o1 [1,2], o2 [2,3], o3 [3,9] (the model's output lives to the end);
//   gradients g3 (written by node 3's backward for o2) [5,6], g2 (node 2's, for o1) [6,7].
// Largest first, ties in creation order, each 128 bytes: o1 @0, o2 @128, o3 @0, g3 @128
// (o3 is alive), g2 @256 (o3 and g3 are).
TEST(PlanMemory, HandWorkedChain) {
  std::vector<PlanNode> g(4);
  g[0].output_bytes = 100;
  for (int i = 1; i <= 3; ++i) {
    g[size_t(i)].inputs = {i - 1};
    g[size_t(i)].use = BufferUse{BufferUse::kOwn, BufferUse::kOwn, false, {false}};
    g[size_t(i)].output_bytes = 100;
    g[size_t(i)].input_grads = i > 1;
  }
  const MemoryPlan p = PlanMemory(g, 64);
  EXPECT_EQ(p.output, std::vector<int64_t>({MemoryPlan::kNotPlaced, 0, 128, 0}));
  EXPECT_EQ(p.input_grad[3], std::vector<int64_t>({128}));
  EXPECT_EQ(p.input_grad[2], std::vector<int64_t>({256}));
  EXPECT_EQ(p.input_grad[1], std::vector<int64_t>({MemoryPlan::kNotPlaced}));  // input 0 takes no gradient
  EXPECT_EQ(p.buffers, 5);
  EXPECT_EQ(p.buffer_bytes, 5 * 128);
  EXPECT_EQ(p.block_bytes, 3 * 128);
  // Evaluation: no gradients, and o1 is dead once node 2 has read it, so o3 takes its place.
  const MemoryPlan e = PlanMemory(g, 64, /*backward=*/false);
  EXPECT_EQ(e.output, std::vector<int64_t>({MemoryPlan::kNotPlaced, 0, 128, 0}));
  EXPECT_EQ(e.input_grad[3], std::vector<int64_t>({MemoryPlan::kNotPlaced}));
  EXPECT_EQ(e.buffers, 3);
  EXPECT_EQ(e.block_bytes, 2 * 128);
}

// A residual: node 1 feeds node 2 and the sum (node 3, Add: gradients are dy). Node 1's
// gradient comes from two readers, so it is summed into a buffer of its own, alive from
// the second reader's backward (node 2's, time 6) to node 1's (time 7); node 2 reads its
// input in backward, so o1 lives to time 6.
TEST(PlanMemory, ResidualSumsGradients) {
  std::vector<PlanNode> g(4);
  g[1] = PlanNode{{0}, BufferUse{BufferUse::kOwn, BufferUse::kOwn, false, {false}}, 64, false};
  g[2] = PlanNode{{1}, BufferUse{BufferUse::kOwn, BufferUse::kOwn, false, {true}}, 64, true};
  g[3] = PlanNode{{1, 2}, BufferUse{BufferUse::kOwn, BufferUse::kView, false, {false, false}}, 64, true};
  const MemoryPlan p = PlanMemory(g, 64);
  // lives: o1 [1,6], o2 [2,3], o3 [3,9], g2 (node 2's for o1) [6,6], sum of o1 [6,7]
  EXPECT_EQ(p.output, std::vector<int64_t>({MemoryPlan::kNotPlaced, 0, 64, 128}));
  EXPECT_EQ(p.input_grad[3], std::vector<int64_t>({MemoryPlan::kNotPlaced, MemoryPlan::kNotPlaced}));
  EXPECT_EQ(p.input_grad[2], std::vector<int64_t>({64}));  // o2 is dead by then; o1 and o3 are not
  EXPECT_EQ(p.grad_sum[1], 192);                           // o1, g2 and o3 are alive at time 6
  EXPECT_EQ(p.block_bytes, 256);
  EXPECT_EQ(p.buffer_bytes, 5 * 64);
}

using Factory = std::function<std::unique_ptr<Model>(Backend&)>;

std::vector<float> Inputs(const Shape& s, bool tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(size_t(NumElements(s)));
  std::uniform_real_distribution<float> d(-1, 1);
  for (float& x : v) x = tokens ? float(rng() % 50) : d(rng);
  return v;
}

void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

// Trains a model with reuse and one without side by side (SGD after every step) at
// batches 8, 8, 6, 8 with an evaluation at batch 5 between: every step's loss, accuracy
// and gradient and the evaluation's logits are the same bits.
void ExpectReuseChangesNothing(const Factory& make, const Shape& sample, int classes, bool tokens) {
  std::unique_ptr<Backend> be[2] = {MakeCpuBackend(1), MakeCpuBackend(1)};
  std::unique_ptr<Model> m[2] = {make(*be[0]), make(*be[1])};
  m[1]->set_memory_reuse(false);
  for (auto& model : m) model->InitParameters(3);
  const int64_t batches[] = {8, 8, 5, 6, 8};
  for (size_t s = 0; s < 5; ++s) {
    Shape xs = {batches[s]};
    xs.insert(xs.end(), sample.begin(), sample.end());
    const std::vector<float> xh = Inputs(xs, tokens, 10 + s);
    std::vector<int32_t> labels(size_t(batches[s]));
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t((i * 7 + s) % size_t(classes));
    std::vector<float> logits[2], grads[2];
    StepResult r[2];
    for (int k = 0; k < 2; ++k) {
      Tensor x = be[k]->Empty(xs);
      be[k]->CopyFromHost(x, xh.data());
      if (s == 2) {  // an evaluation at another batch: planned anew, then again for training
        logits[k] = Host(*be[k], m[k]->Forward(x, false));
        if (k == 0) {  // in a plan of its own: no gradients, outputs dead after their last reader
          const MemoryPlan& eval = m[0]->memory_plan();
          EXPECT_FALSE(eval.backward);
          for (const auto& grads : eval.input_grad)
            for (int64_t at : grads) EXPECT_EQ(at, MemoryPlan::kNotPlaced);
          EXPECT_LT(eval.block_bytes, m[0]->PlanFor(xs, true).block_bytes);
        }
        continue;
      }
      m[k]->ZeroGrad();
      r[k] = m[k]->TrainStep(x, labels.data());
      grads[k].resize(size_t(m[k]->NumParams()));
      m[k]->CopyGradsToHost(grads[k].data());
      for (Parameter& p : m[k]->parameters()) be[k]->Axpy(-0.05f, p.grad, p.value);
    }
    const std::string at = m[0]->name() + " step " + std::to_string(s);
    if (s == 2) {
      ExpectSameBits(logits[0], logits[1], at + " logits");
      continue;
    }
    EXPECT_EQ(std::memcmp(&r[0].loss, &r[1].loss, sizeof(float)), 0) << at << ": " << r[0].loss << " " << r[1].loss;
    EXPECT_EQ(r[0].correct, r[1].correct) << at;
    ExpectSameBits(grads[0], grads[1], at + " gradients");
  }
  EXPECT_GT(m[0]->memory_plan().buffers, 0);
  EXPECT_EQ(m[1]->memory_plan().buffers, 0);
}

Factory Zoo(const std::string& name, const Shape& sample) {
  return [=](Backend& be) {
    ModelOptions mo;
    mo.input_shape = sample;
    mo.num_classes = 10;
    return MakeModel(name, be, mo);
  };
}

// resnet20 written out as ONNX and imported: Conv, BatchNormalization, Relu, Add over the
// shortcut, GlobalAveragePool, Flatten, Gemm as the importer's layers.
Factory ImportedResnet20() {
  static const std::string path = [] {
    auto be = MakeCpuBackend(1);
    auto m = Zoo("resnet20", {3, 16, 16})(*be);
    m->InitParameters(5);
    const std::string p = ::testing::TempDir() + "/resnet20_reuse.onnx";
    ExportOnnx(*m, *be, p);
    return p;
  }();
  return [](Backend& be) {
    OnnxOptions o;
    o.input_shape = {3, 16, 16};
    o.num_classes = 10;
    o.batch = 8;
    return ImportOnnx(path, be, o);
  };
}

TEST(MemoryReuse, LenetSameBits) { ExpectReuseChangesNothing(Zoo("lenet", {1, 28, 28}), {1, 28, 28}, 10, false); }

TEST(MemoryReuse, Resnet20SameBits) { ExpectReuseChangesNothing(Zoo("resnet20", {3, 16, 16}), {3, 16, 16}, 10, false); }

TEST(MemoryReuse, ImportedResnet20SameBits) { ExpectReuseChangesNothing(ImportedResnet20(), {3, 16, 16}, 10, false); }

// PyTorch's nn.TransformerEncoder: residual adds, Q/K/V branching off one input, and many
// operators that promise nothing about their buffers (kept as they are, read conservatively).
Factory ImportedTransformer() {
  return [](Backend& be) {
    OnnxOptions o;
    o.input_shape = {12};
    o.num_classes = 5;
    o.batch = 8;
    return ImportOnnx(kDir + "tiny_transformer.onnx", be, o);
  };
}

TEST(MemoryReuse, ImportedTransformerSameBits) { ExpectReuseChangesNothing(ImportedTransformer(), {12}, 5, true); }

// The pools only the gather path runs (dilated, ceil_mode past the input, 3-D; make_models.py
// pools): its own buffers beside the planned output and gradient.
TEST(MemoryReuse, ImportedPoolsSameBits) {
  ExpectReuseChangesNothing(
      [](Backend& be) {
        OnnxOptions o;
        o.input_shape = {1, 28, 28};
        o.num_classes = 10;
        o.batch = 8;
        return ImportOnnx(kDir + "pools.onnx", be, o);
      },
      {1, 28, 28}, 10, false);
}

// The peak over a step after the first (every buffer allocated by then) without reuse,
// minus the same with reuse, is what the plan saves: its buffers one by one minus its block.
int64_t SecondStepPeak(const Factory& make, const Shape& xs, bool tokens, bool reuse, MemoryPlan* plan) {
  auto be = MakeCpuBackend(1);
  auto m = make(*be);
  m->set_memory_reuse(reuse);
  m->InitParameters(3);
  Tensor x = be->Empty(xs);
  const std::vector<float> xh = Inputs(xs, tokens, 1);
  be->CopyFromHost(x, xh.data());
  std::vector<int32_t> labels(size_t(xs[0]), 1);
  m->TrainStep(x, labels.data());
  be->ResetPeakMemory();
  m->ZeroGrad();
  m->TrainStep(x, labels.data());
  *plan = m->memory_plan();
  return be->Memory().peak_bytes;
}

void ExpectPeakFallsByThePlan(const Factory& make, const Shape& xs, bool tokens = false) {
  MemoryPlan plan, none;
  const int64_t without = SecondStepPeak(make, xs, tokens, false, &none);
  const int64_t with = SecondStepPeak(make, xs, tokens, true, &plan);
  EXPECT_EQ(none.buffers, 0);
  EXPECT_LT(plan.block_bytes, plan.buffer_bytes);
  EXPECT_EQ(without - with, plan.buffer_bytes - plan.block_bytes)
      << "peak without " << without << " with " << with << "; plan: " << plan.buffers << " buffers of "
      << plan.buffer_bytes << " bytes in a block of " << plan.block_bytes;
}

TEST(MemoryReuse, LenetPeakFallsByThePlan) { ExpectPeakFallsByThePlan(Zoo("lenet", {1, 28, 28}), {16, 1, 28, 28}); }

TEST(MemoryReuse, Resnet20PeakFallsByThePlan) {
  ExpectPeakFallsByThePlan(Zoo("resnet20", {3, 32, 32}), {16, 3, 32, 32});
}

TEST(MemoryReuse, ImportedResnet20PeakFallsByThePlan) { ExpectPeakFallsByThePlan(ImportedResnet20(), {8, 3, 16, 16}); }

TEST(MemoryReuse, ImportedTransformerPeakFallsByThePlan) {
  ExpectPeakFallsByThePlan(ImportedTransformer(), {8, 12}, true);
}

}  // namespace
}  // namespace shoal
