#include "worker/data/idx_reader.h"

#include <chrono>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/data/test_files.h"
#include "worker/data/file_util.h"

namespace shoal {
namespace {

using testdata::IdxImages;
using testdata::IdxLabels;
using testdata::TempDir;
using testdata::WriteBytes;
using testdata::WriteGzip;

const char* kFashion = "/usr/share/datasets/fashion-mnist";

// Expects LoadDataset to throw an Error whose message contains every fragment.
void ExpectError(const std::string& path, std::vector<std::string> fragments, DatasetOptions o = {}) {
  try {
    LoadDataset("idx", path, o);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nmissing: " << f;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

class FashionMnist : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!data::FileExists(std::string(kFashion) + "/train-images-idx3-ubyte.gz"))
      GTEST_SKIP() << "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist; ./shoal test installs it)";
  }
};

TEST_F(FashionMnist, TrainSetFactsAndLoadTime) {
  auto t0 = std::chrono::steady_clock::now();
  auto d = LoadDataset("idx", std::string(kFashion) + "/train", {});
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("fashion-mnist train (gzip) loaded in %.3f s\n", secs);
  EXPECT_LT(secs, 5.0);  // about 0.5 s here; loose because CI machines are shared
  ASSERT_EQ(d->size(), 60000);
  EXPECT_EQ(d->sample_shape(), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(d->num_classes(), 10);
  EXPECT_TRUE(d->is_u8());
  std::vector<int64_t> count(10, 0);
  for (int32_t l : d->labels()) {
    ASSERT_GE(l, 0);
    ASSERT_LT(l, 10);
    ++count[size_t(l)];
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(count[size_t(c)], 6000) << "class " << c;
  // First labels and first image as published (ankle boot, t-shirt, t-shirt, dress, ...).
  EXPECT_EQ(std::vector<int32_t>(d->labels().begin(), d->labels().begin() + 6),
            (std::vector<int32_t>{9, 0, 0, 3, 0, 2}));
  int64_t sum = 0;
  for (int k = 0; k < 784; ++k) sum += d->u8_sample(0)[k];
  EXPECT_EQ(sum, 76247);
  // The widely quoted normalization constants of Fashion-MNIST.
  EXPECT_NEAR(d->mean()[0], 0.2860, 1e-4);
  EXPECT_NEAR(d->stddev()[0], 0.3530, 1e-3);
}

TEST_F(FashionMnist, TestSetByExactPath) {
  auto d = LoadDataset("idx", std::string(kFashion) + "/t10k-images-idx3-ubyte.gz", {});
  ASSERT_EQ(d->size(), 10000);
  std::vector<int64_t> count(10, 0);
  for (int32_t l : d->labels()) ++count[size_t(l)];
  for (int c = 0; c < 10; ++c) EXPECT_EQ(count[size_t(c)], 1000);
  EXPECT_EQ(d->label(0), 9);
  EXPECT_EQ(d->label(1), 2);
}

TEST_F(FashionMnist, MaxSamplesKeepsTheFirstRecords) {
  DatasetOptions o;
  o.max_samples = 100;
  auto d = LoadDataset("idx", std::string(kFashion) + "/train", o);
  ASSERT_EQ(d->size(), 100);
  EXPECT_EQ(d->label(0), 9);
  EXPECT_EQ(d->label(3), 3);
}

TEST(IdxReader, PlainAndGzipGiveTheSameData) {
  TempDir dir;
  WriteBytes(dir / "a-images-idx3-ubyte", IdxImages(12, 5, 4));
  WriteBytes(dir / "a-labels-idx1-ubyte", IdxLabels(12, 3));
  WriteGzip(dir / "b-images-idx3-ubyte.gz", IdxImages(12, 5, 4));
  WriteGzip(dir / "b-labels-idx1-ubyte.gz", IdxLabels(12, 3));
  auto a = LoadDataset("idx", dir / "a", {});
  auto b = LoadDataset("idx", dir / "b", {});
  ASSERT_EQ(a->size(), 12);
  EXPECT_EQ(a->sample_shape(), (std::vector<int64_t>{1, 5, 4}));
  EXPECT_EQ(a->num_classes(), 3);
  ASSERT_EQ(b->size(), 12);
  EXPECT_EQ(a->labels(), b->labels());
  for (int i = 0; i < 12; ++i)
    for (int k = 0; k < 20; ++k) {
      ASSERT_EQ(a->u8_sample(i)[k], uint8_t((i * 7 + k) % 256));
      ASSERT_EQ(b->u8_sample(i)[k], a->u8_sample(i)[k]);
    }
}

TEST(IdxReader, MissingFileNamesWhatWasTried) {
  TempDir dir;
  ExpectError(dir / "nope", {dir / "nope-images-idx3-ubyte", "no IDX images file"});
  WriteBytes(dir / "x-images-idx3-ubyte", IdxImages(2, 3, 3));
  ExpectError(dir / "x", {dir / "x-labels-idx1-ubyte", "no IDX labels file"});
}

TEST(IdxReader, BadMagic) {
  TempDir dir;
  auto img = IdxImages(4, 3, 3);
  img[3] = 2;  // a 2-dim file where a 3-dim one belongs
  WriteBytes(dir / "m-images-idx3-ubyte", img);
  WriteBytes(dir / "m-labels-idx1-ubyte", IdxLabels(4, 2));
  ExpectError(dir / "m", {dir / "m-images-idx3-ubyte", "bad magic number 0x00000802", "expected 0x00000803"});
  // Labels and images swapped.
  WriteBytes(dir / "s-images-idx3-ubyte", IdxLabels(4, 2));
  WriteBytes(dir / "s-labels-idx1-ubyte", IdxLabels(4, 2));
  WriteBytes(dir / "t-images-idx3-ubyte", IdxImages(4, 3, 3));
  WriteBytes(dir / "t-labels-idx1-ubyte", IdxImages(4, 3, 3));
  ExpectError(dir / "s", {dir / "s-images-idx3-ubyte", "bad magic number 0x00000801"});
  ExpectError(dir / "t", {dir / "t-labels-idx1-ubyte", "bad magic number 0x00000803", "expected 0x00000801"});
}

// Found by tests/fuzz/idx_fuzzer: two dimensions near 2^32 overflowed the int64 payload
// size (undefined behaviour) before the plausibility check saw it.
TEST(IdxReader, HugeDimensionsAreRejectedWithoutOverflow) {
  TempDir dir;
  std::vector<uint8_t> img = {0, 0, 0x08, 3, 0, 0, 0, 3, 0xff, 0xff, 0xff, 0x00, 0xff, 0xff, 0xff, 0x00};
  WriteBytes(dir / "h-images-idx3-ubyte", img);
  WriteBytes(dir / "h-labels-idx1-ubyte", IdxLabels(3, 2));
  ExpectError(dir / "h", {dir / "h-images-idx3-ubyte", "implausibly large"});
}

TEST(IdxReader, TruncatedImagesPlainAndGzip) {
  TempDir dir;
  auto img = IdxImages(10, 4, 4);
  img.resize(img.size() - 5);
  WriteBytes(dir / "p-images-idx3-ubyte", img);
  WriteBytes(dir / "p-labels-idx1-ubyte", IdxLabels(10, 2));
  ExpectError(dir / "p", {dir / "p-images-idx3-ubyte", "truncated", "expected 176 bytes", "got 171"});
  WriteGzip(dir / "g-images-idx3-ubyte.gz", img);
  WriteGzip(dir / "g-labels-idx1-ubyte.gz", IdxLabels(10, 2));
  ExpectError(dir / "g", {dir / "g-images-idx3-ubyte.gz", "expected 176 bytes", "got 171"});
  // A header cut short.
  WriteBytes(dir / "h-images-idx3-ubyte", std::vector<uint8_t>(img.begin(), img.begin() + 9));
  WriteBytes(dir / "h-labels-idx1-ubyte", IdxLabels(10, 2));
  ExpectError(dir / "h", {dir / "h-images-idx3-ubyte", "truncated header"});
}

TEST(IdxReader, TruncatedAndGarbageGzipStreams) {
  TempDir dir;
  WriteGzip(dir / "full.gz", IdxImages(50, 8, 8));
  std::vector<uint8_t> gz;
  {
    FILE* f = fopen((dir / "full.gz").c_str(), "rb");
    ASSERT_NE(f, nullptr);
    int c;
    while ((c = fgetc(f)) != EOF) gz.push_back(uint8_t(c));
    fclose(f);
  }
  WriteBytes(dir / "cut-images-idx3-ubyte.gz", std::vector<uint8_t>(gz.begin(), gz.begin() + long(gz.size() / 2)));
  WriteGzip(dir / "cut-labels-idx1-ubyte.gz", IdxLabels(50, 2));
  ExpectError(dir / "cut", {dir / "cut-images-idx3-ubyte.gz", "gzip stream is truncated"});

  std::vector<uint8_t> garbage = {0x1f, 0x8b, 0x08, 0x00};
  for (int i = 0; i < 200; ++i) garbage.push_back(uint8_t(i * 37 + 11));
  WriteBytes(dir / "bad-images-idx3-ubyte.gz", garbage);
  WriteGzip(dir / "bad-labels-idx1-ubyte.gz", IdxLabels(50, 2));
  ExpectError(dir / "bad", {dir / "bad-images-idx3-ubyte.gz", "gzip"});

  // Not gzip at all despite the name: read as plain bytes, rejected by the magic check.
  WriteBytes(dir / "txt-images-idx3-ubyte.gz", std::vector<uint8_t>{'h', 'e', 'l', 'l', 'o', '\n'});
  WriteGzip(dir / "txt-labels-idx1-ubyte.gz", IdxLabels(50, 2));
  ExpectError(dir / "txt", {dir / "txt-images-idx3-ubyte.gz", "bad magic number"});
}

// A small .gz whose header declares 10 images of 8x8 (656 bytes) but which inflates to
// 64 MiB more: refused as soon as it passes the declared size, not after inflating it all.
TEST(IdxReader, GzipBombStopsAtTheSizeTheHeaderDeclares) {
  TempDir tmp;
  const std::string dir = tmp.path();
  testdata::WriteGzipBomb(dir + "/b-images-idx3-ubyte.gz", IdxImages(10, 8, 8), int64_t(64) << 20);
  WriteGzip(dir + "/b-labels-idx1-ubyte.gz", IdxLabels(10, 2));
  ExpectError(dir + "/b",
              {dir + "/b-images-idx3-ubyte.gz", "gzip data inflates past the 656 bytes its IDX header declares"});
  // The labels file too (header 8 bytes + 10 labels).
  WriteGzip(dir + "/c-images-idx3-ubyte.gz", IdxImages(10, 8, 8));
  testdata::WriteGzipBomb(dir + "/c-labels-idx1-ubyte.gz", IdxLabels(10, 2), int64_t(64) << 20);
  ExpectError(dir + "/c", {dir + "/c-labels-idx1-ubyte.gz", "inflates past the 18 bytes its IDX header declares"});
}

// Without a header that says the size (CIFAR), the absolute cap holds.
TEST(FileUtil, GzipBombStopsAtTheAbsoluteCap) {
  TempDir tmp;
  const std::string dir = tmp.path();
  testdata::WriteGzipBomb(dir + "/data_batch_1.bin", {}, int64_t(16) << 20);
  data::InflateLimit limit;
  limit.max_bytes = 1 << 20;
  try {
    data::ReadFileBytes(dir + "/data_batch_1.bin", limit);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/data_batch_1.bin: gzip data inflates past 1048576 bytes, the cap"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(data::ReadFileBytes(dir + "/data_batch_1.bin").size(), size_t(16) << 20);  // under the default cap
  EXPECT_GE(data::kMaxInflatedBytes, int64_t(1) << 30);
  EXPECT_LE(data::kMaxInflatedBytes, int64_t(16) << 30);
}

TEST(IdxReader, LabelCountMismatch) {
  TempDir dir;
  WriteBytes(dir / "c-images-idx3-ubyte", IdxImages(10, 3, 3));
  WriteBytes(dir / "c-labels-idx1-ubyte", IdxLabels(9, 2));
  ExpectError(dir / "c", {dir / "c-labels-idx1-ubyte", "9 labels", "10 images"});
}

TEST(IdxReader, LabelOutOfRange) {
  TempDir dir;
  auto lab = IdxLabels(10, 10);
  lab[8 + 7] = 12;
  WriteBytes(dir / "r-images-idx3-ubyte", IdxImages(10, 3, 3));
  WriteBytes(dir / "r-labels-idx1-ubyte", lab);
  DatasetOptions o;
  o.num_classes = 10;
  ExpectError(dir / "r", {dir / "r-labels-idx1-ubyte", "label 12 of sample 7", "outside 0..9"}, o);
  // Without a declared class count the largest label decides it.
  EXPECT_EQ(LoadDataset("idx", dir / "r", {})->num_classes(), 13);
}

TEST(IdxReader, TestSetMustFitTheTrainingClasses) {
  TempDir dir;
  WriteBytes(dir / "train-images-idx3-ubyte", IdxImages(10, 3, 3));
  WriteBytes(dir / "train-labels-idx1-ubyte", IdxLabels(10, 4));
  WriteBytes(dir / "t10k-images-idx3-ubyte", IdxImages(10, 3, 3));
  WriteBytes(dir / "t10k-labels-idx1-ubyte", IdxLabels(10, 2));
  WriteBytes(dir / "big-images-idx3-ubyte", IdxImages(10, 3, 3));
  WriteBytes(dir / "big-labels-idx1-ubyte", IdxLabels(10, 6));
  WriteBytes(dir / "odd-images-idx3-ubyte", IdxImages(10, 4, 3));
  WriteBytes(dir / "odd-labels-idx1-ubyte", IdxLabels(10, 2));
  auto train = LoadDataset("idx", dir / "train", {});
  auto test = LoadDataset("idx", dir / "t10k", {});
  EXPECT_EQ(test->num_classes(), 2);
  test->UseNormalizationOf(*train);
  EXPECT_EQ(test->num_classes(), 4);
  EXPECT_EQ(test->mean(), train->mean());
  auto big = LoadDataset("idx", dir / "big", {});
  try {
    big->UseNormalizationOf(*train);
    ADD_FAILURE() << "label 5 accepted against 4 training classes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("big-images-idx3-ubyte: label 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(LoadDataset("idx", dir / "odd", {})->UseNormalizationOf(*train), Error);
}

TEST(IdxReader, UnknownFormatAndDirectory) {
  TempDir dir;
  try {
    LoadDataset("hdf5", dir.path(), {});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown \"hdf5\""), std::string::npos);
  }
  ExpectError(dir.path(), {dir.path(), "is a directory", dir / "train"});
  // A labels file where the images file belongs.
  WriteBytes(dir / "l-labels-idx1-ubyte", IdxLabels(4, 2));
  ExpectError(dir / "l-labels-idx1-ubyte", {dir / "l-labels-idx1-ubyte", "cannot tell the labels file"});
}

}  // namespace
}  // namespace shoal
