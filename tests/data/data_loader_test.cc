#include "worker/data/data_loader.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <mutex>
#include <set>

#include <gtest/gtest.h>

#include "common/error.h"
#include "worker/data/file_util.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;

// n samples of 1x4x4; every pixel of sample i is i % 256 and its label is i % classes,
// so a batch's values say which samples it holds.
std::shared_ptr<Dataset> Tagged(int64_t n, int64_t classes = 10) {
  std::vector<uint8_t> px;
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    px.insert(px.end(), 16, uint8_t(i % 256));
    labels.push_back(int32_t(i % classes));
  }
  auto d = Dataset::FromU8("tagged", {1, 4, 4}, px, labels, classes);
  d->SetNormalization({0.0f}, {1.0f / 255.0f});  // normalized value == pixel value
  return d;
}

std::vector<std::vector<float>> Drain(DataLoader& l) {
  std::vector<std::vector<float>> out;
  Batch b;
  while (l.Next(&b)) {
    out.emplace_back(b.images.begin(), b.images.end());
    EXPECT_EQ(int64_t(b.labels.size()), b.n);
  }
  return out;
}

TEST(DataLoader, ShardsAreDisjointCoveringAndAgreeAcrossRanks) {
  const int64_t N = 103;
  auto d = Tagged(N);
  const int W = 3;
  for (int64_t epoch : {0, 1}) {
    std::vector<int64_t> seen;
    for (int r = 0; r < W; ++r) {
      DataLoaderOptions o;
      o.batch_size = 8;
      o.rank = r;
      o.world_size = W;
      o.seed = 7;
      o.drop_last = false;
      DataLoader l(d, o);
      auto idx = l.EpochIndices(epoch);
      EXPECT_EQ(int64_t(idx.size()), r < N % W ? N / W + 1 : N / W);
      EXPECT_EQ(l.batches_per_epoch(), (int64_t(idx.size()) + 7) / 8);
      seen.insert(seen.end(), idx.begin(), idx.end());
      // The batches hold exactly those samples, in that order, last batch partial.
      l.StartEpoch(epoch);
      Batch b;
      size_t k = 0;
      while (l.Next(&b)) {
        for (int64_t j = 0; j < b.n; ++j, ++k) {
          ASSERT_LT(k, idx.size());
          EXPECT_EQ(b.images[size_t(j * 16)], float(idx[k] % 256));
          EXPECT_EQ(b.labels[size_t(j)], int32_t(idx[k] % 10));
        }
      }
      EXPECT_EQ(k, idx.size());
    }
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(int64_t(seen.size()), N);
    for (int64_t i = 0; i < N; ++i) EXPECT_EQ(seen[size_t(i)], i);
  }
}

TEST(DataLoader, DropLastGivesEveryRankTheSameFullBatches) {
  auto d = Tagged(103);
  std::set<int64_t> all;
  for (int r = 0; r < 4; ++r) {
    DataLoaderOptions o;
    o.batch_size = 5;
    o.rank = r;
    o.world_size = 4;
    DataLoader l(d, o);
    EXPECT_EQ(l.samples_per_epoch(), 25);
    EXPECT_EQ(l.batches_per_epoch(), 5);
    auto batches = Drain(l);
    EXPECT_EQ(batches.size(), 5u);
    for (auto& b : batches) EXPECT_EQ(b.size(), 5u * 16);
    for (int64_t i : l.EpochIndices(0)) EXPECT_TRUE(all.insert(i).second) << "sample " << i << " on two ranks";
  }
}

// Balanced batches: whatever uneven shares the ranks switch to mid-epoch (prefetched
// batches of the old share dropped), each step's slices tile the global batch and every
// sample is used exactly once per epoch.
TEST(DataLoader, UnevenSharesUseEverySampleOncePerEpoch) {
  const int64_t N = 103;  // 8 steps of 12, 7 samples left over (drop_last)
  auto d = Tagged(N);
  const int W = 3;
  // Shares per step (offset, count) for each rank, switching at steps 3 and 6.
  auto share = [](int64_t step, int r) -> std::pair<int64_t, int64_t> {
    const std::vector<std::vector<int64_t>> sizes = {{4, 4, 4}, {2, 7, 3}, {1, 1, 10}};
    const auto& s = sizes[size_t(step < 3 ? 0 : step < 6 ? 1 : 2)];
    int64_t off = 0;
    for (int k = 0; k < r; ++k) off += s[size_t(k)];
    return {off, s[size_t(r)]};
  };
  for (int prefetch : {0, 2}) {
    for (int64_t epoch : {0, 1}) {
      std::map<int, int> used;  // sample tag -> times seen
      int64_t total = 0;
      for (int r = 0; r < W; ++r) {
        DataLoaderOptions o;
        o.batch_size = 4;
        o.rank = r;
        o.world_size = W;
        o.seed = 7;
        o.prefetch = prefetch;
        o.global_slices = true;
        DataLoader l(d, o);
        EXPECT_EQ(l.batches_per_epoch(), 8);
        EXPECT_EQ(int64_t(l.EpochIndices(epoch).size()), N);
        l.StartEpoch(epoch);
        Batch b;
        for (int64_t step = 0; step < 8; ++step) {
          auto [off, n] = share(step, r);
          l.SetShare(off, n);
          ASSERT_TRUE(l.Next(&b));
          ASSERT_EQ(b.n, n) << "rank " << r << " step " << step;
          for (int64_t j = 0; j < b.n; ++j) ++used[int(b.images[size_t(j * 16)])];
          total += b.n;
        }
        EXPECT_FALSE(l.Next(&b));
      }
      EXPECT_EQ(total, 96);
      EXPECT_EQ(used.size(), 96u) << "a sample was used twice";
      for (auto& [tag, times] : used) EXPECT_EQ(times, 1) << "sample " << tag;
    }
  }
  DataLoaderOptions o;
  o.batch_size = 4;
  o.world_size = 3;
  o.global_slices = true;
  DataLoader l(d, o);
  EXPECT_THROW(l.SetShare(10, 3), Error);  // past the global batch of 12
  EXPECT_THROW(l.SetShare(0, 0), Error);
  o.global_slices = false;
  DataLoader strided(d, o);
  EXPECT_THROW(strided.SetShare(0, 4), Error);
}

TEST(DataLoader, ReshufflesEachEpochTheSameWayForEverySeedHolder) {
  auto d = Tagged(500);
  DataLoaderOptions o;
  o.seed = 42;
  DataLoader a(d, o), b(d, o);
  EXPECT_EQ(a.EpochIndices(0), b.EpochIndices(0));
  EXPECT_EQ(a.EpochIndices(3), b.EpochIndices(3));
  EXPECT_NE(a.EpochIndices(0), a.EpochIndices(1));
  o.seed = 43;
  DataLoader c(d, o);
  EXPECT_NE(a.EpochIndices(0), c.EpochIndices(0));
  // Shuffled, not merely rotated: most samples move.
  auto idx = a.EpochIndices(0);
  int fixed = 0;
  for (size_t i = 0; i < idx.size(); ++i) fixed += idx[i] == int64_t(i);
  EXPECT_LT(fixed, 20);
  o.shuffle = false;
  DataLoader s(d, o);
  auto ordered = s.EpochIndices(5);
  for (size_t i = 0; i < ordered.size(); ++i) EXPECT_EQ(ordered[i], int64_t(i));
}

TEST(DataLoader, SeekReproducesTheExactBatchSequence) {
  auto d = Tagged(300);
  DataLoaderOptions o;
  o.batch_size = 16;
  o.seed = 3;
  o.rank = 1;
  o.world_size = 2;
  DataLoader a(d, o);
  a.StartEpoch(2);
  Batch b;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a.Next(&b));
  data::Position p = a.position();
  EXPECT_EQ(p.epoch, 2);
  EXPECT_EQ(p.batch, 4);
  auto rest = Drain(a);
  ASSERT_EQ(int64_t(rest.size()), a.batches_per_epoch() - 4);

  DataLoader fresh(d, o);  // as after a restart from a checkpoint
  fresh.Seek(p);
  EXPECT_EQ(fresh.position(), p);
  EXPECT_EQ(Drain(fresh), rest);
  fresh.Seek(p);  // seeking back on a used loader works too
  EXPECT_EQ(Drain(fresh), rest);

  data::Position end{2, a.batches_per_epoch()};
  fresh.Seek(end);
  EXPECT_FALSE(fresh.Next(&b));
  EXPECT_THROW(fresh.Seek({2, a.batches_per_epoch() + 1}), Error);
  EXPECT_THROW(fresh.Seek({-1, 0}), Error);
}

TEST(DataLoader, PrefetchAndSynchronousAgree) {
  auto d = Tagged(200);
  DataLoaderOptions o;
  o.batch_size = 7;
  o.seed = 11;
  o.prefetch = 0;
  DataLoader sync(d, o);
  o.prefetch = 3;
  DataLoader pre(d, o);
  o.build_threads = 3;  // each batch filled by three threads
  DataLoader split(d, o);
  for (int64_t e : {0, 1}) {
    sync.StartEpoch(e);
    pre.StartEpoch(e);
    split.StartEpoch(e);
    auto expect = Drain(sync);
    EXPECT_EQ(Drain(pre), expect);
    EXPECT_EQ(Drain(split), expect);
  }
  // A restart mid-epoch drops what was prefetched for the old position.
  pre.StartEpoch(0);
  Batch b;
  ASSERT_TRUE(pre.Next(&b));
  pre.StartEpoch(1);
  sync.StartEpoch(1);
  EXPECT_EQ(Drain(pre), Drain(sync));
}

TEST(DataLoader, DestructorStopsPrefetchMidEpoch) {
  // Big enough that the producer is still working when the loader goes away.
  std::vector<uint8_t> px(size_t(64) * 3 * 64 * 64, 7);
  std::vector<int32_t> labels(64, 1);
  auto d = Dataset::FromU8("big", {3, 64, 64}, px, labels, 2);
  auto done = std::async(std::launch::async, [&] {
    for (int round = 0; round < 20; ++round) {
      DataLoaderOptions o;
      o.batch_size = 4;
      o.prefetch = 4;
      DataLoader l(d, o);
      Batch b;
      for (int i = 0; i < round % 3; ++i) l.Next(&b);
      if (round % 2) l.StartEpoch(1);
    }
  });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "loader shutdown hung";
  done.get();
}

TEST(DataLoader, NormalizedTrainingSetHasZeroMeanUnitStd) {
  const std::string fm = "/usr/share/datasets/fashion-mnist/train";
  if (!data::FileExists(fm + "-images-idx3-ubyte.gz")) GTEST_SKIP() << "Fashion-MNIST not installed";
  auto d = LoadDataset("idx", fm, {});
  DataLoaderOptions o;
  o.batch_size = 64;
  o.drop_last = false;
  DataLoader l(d, o);
  double sum = 0, sq = 0, n = 0;
  Batch b;
  int64_t batches = 0;
  auto t0 = Clock::now();
  while (l.Next(&b)) {
    ++batches;
    for (float v : b.images) {
      sum += v;
      sq += double(v) * v;
    }
    n += double(b.images.size());
  }
  double per_batch_ms = 1e3 * std::chrono::duration<double>(Clock::now() - t0).count() / double(batches);
  printf("fashion-mnist: %lld batches of 64, %.3f ms per batch (including the test's own summing)\n",
         (long long)batches, per_batch_ms);
  EXPECT_EQ(batches, 938);
  EXPECT_EQ(n, 60000.0 * 784);
  const double mean = sum / n, std = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(std, 1.0, 1e-3);
  EXPECT_LT(per_batch_ms, 5.0);  // a lenet step is 10-20 ms
}

TEST(DataLoader, AugmentationIsAShiftedOrMirroredCropAndRepeatable) {
  // 1 channel 12x12, pixel (y, x) = 1 + y*12 + x, so every source pixel is unique and
  // nonzero; padding shows up as 0.
  std::vector<uint8_t> px;
  for (int i = 0; i < 30; ++i)
    for (int k = 0; k < 144; ++k) px.push_back(uint8_t(1 + k));
  std::vector<int32_t> labels(30, 0);
  auto d = Dataset::FromU8("grid", {1, 12, 12}, px, labels, 1);
  d->SetNormalization({0.0f}, {1.0f / 255.0f});
  DataLoaderOptions o;
  o.batch_size = 30;
  o.augment = true;
  o.seed = 5;
  DataLoader l(d, o), again(d, o);
  Batch b, c;
  ASSERT_TRUE(l.Next(&b));
  ASSERT_TRUE(again.Next(&c));
  EXPECT_EQ(b.images, c.images);
  std::set<std::vector<float>> views;
  for (int j = 0; j < 30; ++j) {
    std::vector<float> img(b.images.begin() + j * 144, b.images.begin() + (j + 1) * 144);
    views.insert(img);
    bool matched = false;
    for (int dy = -4; dy <= 4 && !matched; ++dy)
      for (int dx = -4; dx <= 4 && !matched; ++dx)
        for (int flip = 0; flip < 2 && !matched; ++flip) {
          bool ok = true;
          for (int y = 0; y < 12 && ok; ++y)
            for (int x = 0; x < 12 && ok; ++x) {
              int sy = y + dy, sx = (flip ? 11 - x : x) + dx;
              float want = (sy < 0 || sy >= 12 || sx < 0 || sx >= 12) ? 0.0f : float(1 + sy * 12 + sx);
              ok = img[size_t(y * 12 + x)] == want;
            }
          matched = ok;
        }
    EXPECT_TRUE(matched) << "sample " << j << " is not a padded crop/flip of the source";
  }
  EXPECT_GT(views.size(), 15u);  // crops and flips vary per sample
  // A different epoch draws different crops.
  l.StartEpoch(1);
  ASSERT_TRUE(l.Next(&c));
  EXPECT_NE(b.images, c.images);
}

TEST(DataLoader, MaxSamplesAndBadOptions) {
  auto d = Tagged(100);
  DataLoaderOptions o;
  o.batch_size = 10;
  o.max_samples = 35;
  o.drop_last = false;
  DataLoader l(d, o);
  EXPECT_EQ(l.batches_per_epoch(), 4);
  for (int64_t i : l.EpochIndices(0)) EXPECT_LT(i, 35);

  DataLoaderOptions bad;
  bad.rank = 2;
  bad.world_size = 2;
  EXPECT_THROW(DataLoader(d, bad), Error);
  bad = DataLoaderOptions();
  bad.batch_size = 0;
  EXPECT_THROW(DataLoader(d, bad), Error);
  try {
    DataLoaderOptions r;
    r.rank = 5;
    r.world_size = 4;
    DataLoader x(d, r);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 5 is outside 0..3"), std::string::npos) << e.what();
  }
}

TEST(Synthetic, DeterministicImageNetShaped) {
  DatasetOptions o;
  o.seed = 1;
  o.synthetic_samples = 300;
  auto t0 = Clock::now();
  auto a = LoadDataset("synthetic", "train", o);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(secs, 1.0);
  EXPECT_EQ(a->size(), 300);
  EXPECT_EQ(a->sample_shape(), (std::vector<int64_t>{3, 224, 224}));
  EXPECT_EQ(a->num_classes(), 1000);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(a->mean()[size_t(c)], 0.5, 0.01);
    EXPECT_NEAR(a->stddev()[size_t(c)], 0.2887, 0.01);  // uniform bytes
  }
  auto b = LoadDataset("synthetic", "train", o);
  EXPECT_EQ(a->labels(), b->labels());
  EXPECT_TRUE(std::equal(a->u8_sample(299), a->u8_sample(299) + 3 * 224 * 224, b->u8_sample(299)));
  auto test = LoadDataset("synthetic", "test", o);
  EXPECT_NE(a->labels(), test->labels());
  // Same pool of images and classes: the first `pool` samples are the pool in order.
  for (int64_t i = 0; i < 64; ++i) {
    ASSERT_EQ(a->label(i), test->label(i));
    ASSERT_TRUE(std::equal(a->u8_sample(i), a->u8_sample(i) + 3 * 224 * 224, test->u8_sample(i)));
  }
  o.seed = 2;
  EXPECT_NE(a->labels(), LoadDataset("synthetic", "train", o)->labels());

  DataLoaderOptions lo;
  lo.batch_size = 32;
  DataLoader l(a, lo);
  Batch batch;
  ASSERT_TRUE(l.Next(&batch));
  EXPECT_EQ(batch.images.size(), size_t(32) * 3 * 224 * 224);

  o.synthetic_image_size = 0;
  EXPECT_THROW(LoadDataset("synthetic", "train", o), Error);
}

// A CUDA worker's loader draws its batches from page-locked memory (host_memory.h); here a
// counting heap stands in for cudaMallocHost (the GPU case is tests/engine_cuda's
// pinned_batch_test). Every batch handed out, with or without prefetch, shuffled (training)
// or in order (evaluation), sits in a block of that memory and holds what a plain loader's
// batch holds; the loader reuses a few blocks rather than allocating per batch, and every
// block goes back once loader and batches are gone.
TEST(DataLoader, BatchesLiveInTheGivenHostMemory) {
  auto d = Tagged(100);
  std::mutex mu;
  std::set<const void*> live;
  int64_t allocated = 0;
  auto mem = std::make_shared<HostMemory>([&](size_t n) {
    void* p = std::malloc(n);
    std::lock_guard<std::mutex> lock(mu);
    live.insert(p);
    ++allocated;
    return std::shared_ptr<void>(p, [&](void* q) {
      std::lock_guard<std::mutex> lock(mu);
      live.erase(q);
      std::free(q);
    });
  });
  for (int prefetch : {0, 2}) {
    for (bool eval : {false, true}) {
      DataLoaderOptions o;
      o.batch_size = 8;
      o.seed = 3;
      o.prefetch = prefetch;
      o.shuffle = !eval;
      o.drop_last = !eval;
      DataLoader plain(d, o);
      o.host_memory = mem;
      DataLoader pinned(d, o);
      Batch a, b;
      for (int64_t epoch : {0, 1}) {
        plain.StartEpoch(epoch);
        pinned.StartEpoch(epoch);
        int64_t batches = 0;
        while (plain.Next(&a)) {
          ASSERT_TRUE(pinned.Next(&b));
          ++batches;
          EXPECT_EQ(std::vector<float>(a.images.begin(), a.images.end()),
                    std::vector<float>(b.images.begin(), b.images.end()));
          EXPECT_EQ(a.labels, b.labels);
          EXPECT_EQ(b.images.get_allocator().memory(), mem);
          std::lock_guard<std::mutex> lock(mu);
          EXPECT_EQ(live.count(b.images.data()), 1u) << "batch " << b.index << " is not in the given memory";
        }
        EXPECT_FALSE(pinned.Next(&b));
        EXPECT_EQ(batches, plain.batches_per_epoch());
      }
      // the batch in hand, those prefetched and the spare ones: never one per batch
      EXPECT_LE(mem->live_blocks(), size_t(2 * prefetch + 2)) << "prefetch " << prefetch;
    }
    EXPECT_EQ(mem->live_blocks(), 0u);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(live.empty());
  }
  EXPECT_LE(allocated, 2 * (2 * 2 + 2)) << "blocks are reused across batches and epochs";
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// Batch-size control: the global batch changes at an epoch boundary (SetBatchSize before
// StartEpoch, as the trainer does), with even and uneven shares; each epoch every rank steps
// floor(N / global) times and every sample is used exactly once across the ranks, before
// and after the change. Seek into the new size finds the same batches.
TEST(DataLoader, BatchSizeChangeKeepsEverySampleOncePerEpoch) {
  const int64_t N = 103;
  auto d = Tagged(N);
  const int W = 3;
  // Per epoch: per-rank batch, then the shares of the global batch (empty: equal).
  struct Stage {
    int64_t batch;
    std::vector<int64_t> shares;
  };
  const std::vector<Stage> epochs = {{2, {}}, {2, {1, 4, 1}}, {4, {}}, {8, {3, 20, 1}}};
  for (int prefetch : {0, 2}) {
    std::vector<std::unique_ptr<DataLoader>> loaders;
    for (int r = 0; r < W; ++r) {
      DataLoaderOptions o;
      o.batch_size = 2;
      o.rank = r;
      o.world_size = W;
      o.seed = 11;
      o.prefetch = prefetch;
      o.global_slices = true;
      loaders.push_back(std::make_unique<DataLoader>(d, o));
    }
    for (int64_t e = 0; e < int64_t(epochs.size()); ++e) {
      const Stage& st = epochs[size_t(e)];
      const int64_t global = st.batch * W, steps = N / global;
      std::map<int, int> used;
      int64_t total = 0;
      for (int r = 0; r < W; ++r) {
        DataLoader& l = *loaders[size_t(r)];
        l.SetBatchSize(st.batch);
        if (!st.shares.empty()) {
          int64_t off = 0;
          for (int k = 0; k < r; ++k) off += st.shares[size_t(k)];
          l.SetShare(off, st.shares[size_t(r)]);
        }
        l.StartEpoch(e);
        ASSERT_EQ(l.batches_per_epoch(), steps) << "epoch " << e;
        Batch b;
        for (int64_t s = 0; s < steps; ++s) {
          ASSERT_TRUE(l.Next(&b)) << "epoch " << e << " rank " << r << " step " << s;
          ASSERT_EQ(b.n, st.shares.empty() ? st.batch : st.shares[size_t(r)]);
          for (int64_t j = 0; j < b.n; ++j) ++used[int(b.images[size_t(j * 16)])];
          total += b.n;
        }
        EXPECT_FALSE(l.Next(&b));
      }
      EXPECT_EQ(total, steps * global) << "epoch " << e;
      EXPECT_EQ(int64_t(used.size()), steps * global) << "a sample was used twice in epoch " << e;
      for (auto& [tag, times] : used) EXPECT_EQ(times, 1) << "epoch " << e << " sample " << tag;
    }
  }
  // A fresh loader seeking into epoch 2 at the new size returns what the running one did.
  DataLoaderOptions o;
  o.batch_size = 2;
  o.rank = 1;
  o.world_size = W;
  o.seed = 11;
  o.global_slices = true;
  DataLoader a(d, o), b(d, o);
  a.SetBatchSize(4);
  a.StartEpoch(2);
  Batch x, y;
  ASSERT_TRUE(a.Next(&x));
  ASSERT_TRUE(a.Next(&x));
  b.SetBatchSize(4);
  b.Seek({2, 1});
  ASSERT_TRUE(b.Next(&y));
  EXPECT_EQ(x.images, y.images);
  EXPECT_EQ(x.labels, y.labels);
  EXPECT_THROW(b.SetBatchSize(35), Error);  // 105 samples a step: more than the 103
  o.global_slices = false;
  DataLoader strided(d, o);
  EXPECT_THROW(strided.SetBatchSize(4), Error);
}

}  // namespace
}  // namespace shoal
