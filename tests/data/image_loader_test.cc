// imagefolder and webdataset through LoadDataset and the DataLoader, on data made from
// Fashion-MNIST: pixels as the IDX files hold them, the same batches for a seed (crops and
// flips included, any thread count, after a Seek), every sample once per epoch across
// ranks, and each kind of bad data: an error naming the file (and member), or a counted skip.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/data/image_files.h"
#include "tests/data/test_files.h"
#include "worker/data/data_loader.h"
#include "worker/data/dataset.h"

namespace shoal {
namespace data {
namespace {

using testdata::MakeImages;
using testdata::ReadAll;
using testdata::TempDir;
using testdata::WriteBytes;

DatasetOptions Gray28() {
  DatasetOptions o;
  o.image_size = 28;
  o.channels = 1;
  o.mean = {0.0f};
  o.stddev = {1.0f};
  return o;
}

std::vector<Batch> Epoch(DataLoader& l, int64_t epoch) {
  l.StartEpoch(epoch);
  std::vector<Batch> out;
  Batch b;
  while (l.Next(&b)) out.push_back(b);
  return out;
}

// Whatever `f` throws, as text ("" when nothing).
template <typename F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not an InputError: ") + e.what();
  }
  return "";
}

TEST(ImageFolder, ClassesSortedAndPixelsAsInTheIdxFiles) {
  TempDir dir;
  MakeImages("folder '" + dir / "f" + "' 200 40");
  auto ds = LoadDataset("imagefolder", dir / "f/train", Gray28());
  ASSERT_EQ(ds->size(), 200);
  EXPECT_EQ(ds->num_classes(), 10);
  EXPECT_EQ(ds->class_names().front(), "0-tshirt");
  EXPECT_EQ(ds->class_names().back(), "9-boot");
  EXPECT_EQ(ds->sample_shape(), (std::vector<int64_t>{1, 28, 28}));
  DatasetOptions io;
  io.max_samples = 200;
  auto idx = LoadDataset("idx", "/usr/share/datasets/fashion-mnist/train", io);

  DataLoaderOptions lo;
  lo.batch_size = 200;
  lo.shuffle = false;
  lo.drop_last = false;
  lo.crop_fraction = 1.0;  // 28 -> 28: no resampling at all
  lo.prefetch = 0;
  DataLoader l(ds, lo);
  std::vector<Batch> e = Epoch(l, 0);
  ASSERT_EQ(e.size(), 1u);
  int png = 0;
  for (int64_t j = 0; j < ds->size(); ++j) {
    const std::string name = ds->encoded().Name(j);
    const int64_t i = std::stoll(name.substr(name.rfind('/') + 1, 6));
    ASSERT_EQ(e[0].labels[size_t(j)], idx->label(i)) << name;
    EXPECT_EQ(ds->class_names()[size_t(idx->label(i))],
              name.substr(name.rfind('/', name.rfind('/') - 1) + 1,
                          name.rfind('/') - name.rfind('/', name.rfind('/') - 1) - 1));
    if (name.find(".png") == std::string::npos) continue;  // JPEG is lossy
    ++png;
    for (int k = 0; k < 28 * 28; ++k)
      ASSERT_NEAR(e[0].images[size_t(j * 784 + k)], idx->u8_sample(i)[k] / 255.0f, 1e-6) << name << " pixel " << k;
  }
  EXPECT_EQ(png, 100);
}

TEST(ImageFolder, SameBatchesForASeedWhateverTheThreadsAndAfterSeek) {
  TempDir dir;
  MakeImages("folder '" + dir / "f" + "' 120 10");
  DatasetOptions o;
  o.image_size = 24;  // augmentation resamples
  o.channels = 3;
  auto ds = LoadDataset("imagefolder", dir / "f/train", o);
  DataLoaderOptions lo;
  lo.batch_size = 16;
  lo.seed = 7;
  lo.augment = true;
  lo.build_threads = 1;
  DataLoader one(ds, lo);
  lo.build_threads = 3;
  DataLoader three(ds, lo);
  std::vector<Batch> a = Epoch(one, 1), b = Epoch(three, 1), c = Epoch(one, 2);
  ASSERT_EQ(a.size(), 7u);
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].images, b[k].images) << "batch " << k;
    EXPECT_EQ(a[k].labels, b[k].labels);
  }
  EXPECT_NE(a[0].images, c[0].images);  // another epoch: other order, other crops
  // Resume at the data position: the rest of the epoch exactly as before.
  lo.build_threads = 2;
  DataLoader resumed(ds, lo);
  resumed.Seek({1, 3});
  Batch r;
  for (size_t k = 3; k < a.size(); ++k) {
    ASSERT_TRUE(resumed.Next(&r));
    EXPECT_EQ(r.images, a[k].images) << "batch " << k;
  }
  // The same crops on a re-run are the same sample's: a sample's crop does not depend on
  // which batch or rank it lands in.
  lo.augment = false;
  DataLoader plain(ds, lo);
  EXPECT_NE(Epoch(plain, 1)[0].images, a[0].images);
}

TEST(ImageFolder, EverySampleOncePerEpochAcrossRanks) {
  TempDir dir;
  MakeImages("folder '" + dir / "f" + "' 100 10");
  MakeImages("shards '" + dir / "w" + "' 100 10 4");
  for (const char* fmt : {"imagefolder", "webdataset"}) {
    auto ds =
        LoadDataset(fmt, std::string(fmt)[0] == 'i' ? dir / "f/train" : dir / "w/train-{000000..000003}.tar", Gray28());
    ASSERT_EQ(ds->size(), 100) << fmt;
    std::set<int64_t> seen;
    for (int r = 0; r < 3; ++r) {
      DataLoaderOptions lo;
      lo.batch_size = 8;
      lo.rank = r;
      lo.world_size = 3;
      lo.seed = 3;
      lo.shuffle_buffer = 10;
      DataLoader l(ds, lo);
      for (int64_t i : l.EpochIndices(2)) EXPECT_TRUE(seen.insert(i).second) << fmt << ": sample " << i << " twice";
    }
    EXPECT_EQ(seen.size(), 99u) << fmt;  // 100 / 3 = 33 each
  }
}

// An evaluation loader (fixed order, no augmentation) keeps the batches it built, up to
// cache_bytes, and later epochs take them from memory: with every image file overwritten
// after the first epoch, the kept batches still come back as they were, and only those past
// the bound are decoded again (and now fail, naming the file). Without a cache nothing is kept.
TEST(ImageFolder, EvaluationBatchesAreKeptUpToTheBound) {
  TempDir dir;
  MakeImages("folder '" + dir / "f" + "' 40 100");
  auto ds = LoadDataset("imagefolder", dir / "f/test", Gray28());
  ASSERT_EQ(ds->size(), 100);
  DataLoaderOptions lo;
  lo.batch_size = 32;  // 4 batches: 32, 32, 32, 4
  lo.shuffle = false;
  lo.drop_last = false;
  lo.crop_fraction = 1.0;
  lo.build_threads = 2;
  const int64_t batch_bytes = 32 * (28 * 28 + 1) * 4;
  lo.cache_bytes = 2 * batch_bytes + 100;  // the first two batches fit, the third does not
  DataLoader kept(ds, lo);
  lo.cache_bytes = 0;
  DataLoader plain(ds, lo);
  std::vector<Batch> first = Epoch(kept, 0);
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(Epoch(plain, 0).size(), 4u);
  EXPECT_EQ(kept.cached_batches(), 2);
  EXPECT_EQ(kept.cached_bytes(), 2 * batch_bytes);
  EXPECT_EQ(plain.cached_batches(), 0);

  for (int64_t j = 0; j < ds->size(); ++j) WriteBytes(ds->encoded().Name(j), {'g', 'o', 'n', 'e'});
  kept.StartEpoch(1);
  Batch b;
  for (size_t k = 0; k < 2; ++k) {
    ASSERT_TRUE(kept.Next(&b));
    EXPECT_EQ(b.n, first[k].n);
    EXPECT_EQ(b.images, first[k].images) << "batch " << k;
    EXPECT_EQ(b.labels, first[k].labels) << "batch " << k;
    EXPECT_EQ(b.epoch, 1);
  }
  const std::string third = ErrorOf([&] { kept.Next(&b); });
  EXPECT_NE(third.find(dir / "f/test/"), std::string::npos) << third;
  const std::string again = ErrorOf([&] { Epoch(plain, 1); });
  EXPECT_NE(again.find(dir / "f/test/"), std::string::npos) << again;

  // Shuffled or augmented loaders (training) never keep a batch: each epoch's differ.
  lo.cache_bytes = int64_t(1) << 30;
  lo.shuffle = true;
  DataLoader train(LoadDataset("imagefolder", dir / "f/train", Gray28()), lo);
  Epoch(train, 0);
  EXPECT_EQ(train.cached_batches(), 0);
}

// JPEGs decoded only where the crop's resize reads give the batches of whole decodes, bit
// for bit, with RandomResizedCrop and flips, RGB and grayscale, and in the evaluation transform.
TEST(ImageFolder, CropDecodingGivesTheWholeDecodesBatches) {
  TempDir dir;
  for (int k = 0; k < 12; ++k) {
    const std::string cls = dir / ("p/c" + std::to_string(k % 2));
    ASSERT_EQ(system(("mkdir -p '" + cls + "'").c_str()), 0);
    MakeImages("photo '" + cls + "/" + std::to_string(k) + ".jpg' " + std::to_string(300 + 17 * k) + " " +
               std::to_string(200 + 11 * k) + " 90");
  }
  for (int channels : {3, 1}) {
    DatasetOptions o;
    o.image_size = 64;
    o.channels = channels;
    auto ds = LoadDataset("imagefolder", dir / "p", o);
    ASSERT_EQ(ds->size(), 12);
    for (bool augment : {true, false}) {
      DataLoaderOptions lo;
      lo.batch_size = 4;
      lo.seed = 3;
      lo.augment = augment;
      lo.shuffle = augment;
      lo.build_threads = 2;
      DataLoader crop(ds, lo);
      lo.crop_decode = false;
      DataLoader whole(ds, lo);
      for (int64_t e = 0; e < 3; ++e) {
        std::vector<Batch> a = Epoch(crop, e), b = Epoch(whole, e);
        ASSERT_EQ(a.size(), b.size());
        for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k].images, b[k].images) << channels << " " << augment;
      }
    }
  }
}

TEST(WebDataset, StreamReadsShardsFrontToBackThroughTheBuffer) {
  TempDir dir;
  MakeImages("shards '" + dir / "w" + "' 120 10 4");
  auto ds = LoadDataset("webdataset", dir / "w/train-{000000..000003}.tar", Gray28());
  ASSERT_EQ(ds->encoded().ShardSizes(), (std::vector<int64_t>{30, 30, 30, 30}));
  DataLoaderOptions lo;
  lo.batch_size = 10;
  lo.world_size = 2;
  lo.seed = 1;
  lo.shuffle_buffer = 5;
  DataLoader l(ds, lo);
  std::vector<int64_t> mine = l.EpochIndices(0);
  ASSERT_EQ(mine.size(), 60u);
  // A buffer of 5 moves a sample at most a few places back and mostly not far forward: the
  // rank's run covers about two shards, not all four.
  std::set<int64_t> shards;
  for (int64_t i : mine) shards.insert(i / 30);
  EXPECT_LE(shards.size(), 3u);
  // And the same shard data as the tar holds: labels match the folder made from the same images.
  MakeImages("folder '" + dir / "f" + "' 120 10");
  auto folder = LoadDataset("imagefolder", dir / "f/train", Gray28());
  std::multiset<int32_t> a(ds->labels().begin(), ds->labels().end()),
      b(folder->labels().begin(), folder->labels().end());
  EXPECT_EQ(a, b);
}

TEST(ImageFolderBadData, TestSetClassesMustMatchTheTrainingSets) {
  TempDir dir;
  MakeImages("folder '" + dir / "f" + "' 60 30");
  auto train = LoadDataset("imagefolder", dir / "f/train", Gray28());
  DatasetOptions o = Gray28();
  o.classes = train->class_names();
  ASSERT_EQ(system(("mv '" + dir / "f/test/3-dress" + "' '" + dir / "f/test/3-frock" + "'").c_str()), 0);
  std::string e = ErrorOf([&] { LoadDataset("imagefolder", dir / "f/test", o); });
  EXPECT_NE(e.find("lacks class \"3-dress\""), std::string::npos) << e;
  o.skip_bad = true;
  auto test = LoadDataset("imagefolder", dir / "f/test", o);
  EXPECT_EQ(test->load_skipped(), 2);  // 3-dress lacking, 3-frock added
  for (int32_t l : test->labels()) EXPECT_NE(l, 3);
  o.skip_bad = false;
  ASSERT_EQ(system(("mkdir '" + dir / "f/test/3-dress" + "' && cp '" + dir / "f/test/3-frock" + "'/* '" +
                    dir / "f/test/3-dress" + "'/")
                       .c_str()),
            0);
  e = ErrorOf([&] { LoadDataset("imagefolder", dir / "f/test", o); });
  EXPECT_NE(e.find("class \"3-frock\" is not one of the training set's"), std::string::npos) << e;
}

TEST(ImageFolderBadData, EmptyClassFolder) {
  TempDir dir;
  MakeImages("folder '" + dir / "f" + "' 60 10");
  ASSERT_EQ(
      system(("mkdir '" + dir / "f/train/5-zzz" + "' && touch '" + dir / "f/train/5-zzz/readme.txt" + "'").c_str()), 0);
  std::string e = ErrorOf([&] { LoadDataset("imagefolder", dir / "f/train", Gray28()); });
  EXPECT_NE(e.find(dir / "f/train/5-zzz" + ": empty class folder"), std::string::npos) << e;
  DatasetOptions o = Gray28();
  o.skip_bad = true;
  auto ds = LoadDataset("imagefolder", dir / "f/train", o);
  EXPECT_EQ(ds->load_skipped(), 1);
  EXPECT_EQ(ds->num_classes(), 11);  // the class keeps its number
}

// Corrupt files inside a folder: found when a batch decodes them.
TEST(ImageFolderBadData, CorruptImagesFailTheBatchOrAreSkipped) {
  TempDir dir;
  MakeImages("folder '" + dir / "f" + "' 40 10");
  const std::string cut = dir / "f/train/0-tshirt/000001.jpg", text = dir / "f/train/9-boot/000000.png";
  std::vector<uint8_t> b = ReadAll(cut);
  b.resize(b.size() / 2);
  WriteBytes(cut, b);
  WriteBytes(text, {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'});
  auto ds = LoadDataset("imagefolder", dir / "f/train", Gray28());
  DataLoaderOptions lo;
  lo.batch_size = 8;
  DataLoader l(ds, lo);
  const std::string e = ErrorOf([&] { Epoch(l, 0); });
  EXPECT_TRUE(e.find(cut + ": corrupt or truncated JPEG") != std::string::npos ||
              e.find(text + ": not an image") != std::string::npos)
      << e;
  lo.skip_bad = true;
  DataLoader s1(ds, lo), s2(ds, lo);
  std::vector<Batch> a = Epoch(s1, 0), c = Epoch(s2, 0);
  EXPECT_EQ(a.size(), 5u);
  EXPECT_EQ(s1.skipped(), 2);
  std::vector<std::string> notes = s1.TakeSkipNotes();
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_TRUE(s1.TakeSkipNotes().empty());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k].images, c[k].images);  // replaced the same way
  Epoch(s1, 1);
  EXPECT_EQ(s1.skipped(), 4);               // every time a batch skips one
  EXPECT_TRUE(s1.TakeSkipNotes().empty());  // each file named once
}

TEST(WebDatasetBadData, MissingShardCutMemberCorruptHeader) {
  TempDir dir;
  MakeImages("shards '" + dir / "w" + "' 40 10 2");
  const std::string pattern = dir / "w/train-{000000..000002}.tar";  // 000002 does not exist
  std::string e = ErrorOf([&] { LoadDataset("webdataset", pattern, Gray28()); });
  EXPECT_NE(e.find(dir / "w/train-000002.tar" + ": missing shard"), std::string::npos) << e;
  DatasetOptions o = Gray28();
  o.skip_bad = true;
  auto ds = LoadDataset("webdataset", pattern, o);
  EXPECT_EQ(ds->size(), 40);
  EXPECT_EQ(ds->load_skipped(), 1);

  // Cut inside the last image member: the member is named.
  const std::string shard = dir / "w/train-000001.tar";
  std::vector<uint8_t> tar = ReadAll(shard);
  tar.resize(tar.size() - 2048 - 512 - 100);  // the end blocks, the last .cls, into the last image
  WriteBytes(shard, tar);
  const std::string two = dir / "w/train-{000000..000001}.tar";
  e = ErrorOf([&] { LoadDataset("webdataset", two, Gray28()); });
  EXPECT_NE(e.find(shard + ": member s000039."), std::string::npos) << e;
  EXPECT_NE(e.find("cut short"), std::string::npos) << e;
  ds = LoadDataset("webdataset", two, o);
  EXPECT_EQ(ds->size(), 39);

  // A compressed shard.
  WriteBytes(shard, {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3});
  e = ErrorOf([&] { LoadDataset("webdataset", two, Gray28()); });
  EXPECT_NE(e.find(shard + ": gzip-compressed"), std::string::npos) << e;

  // A file that is no tar at all.
  WriteBytes(shard, std::vector<uint8_t>(4096, 'x'));
  e = ErrorOf([&] { LoadDataset("webdataset", two, Gray28()); });
  EXPECT_NE(e.find(shard + ": corrupt tar header at byte 0"), std::string::npos) << e;
}

}  // namespace
}  // namespace data
}  // namespace shoal
