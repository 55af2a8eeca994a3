#include "worker/data/cifar_reader.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/data/test_files.h"

namespace shoal {
namespace {

using testdata::Cifar100Records;
using testdata::CifarRecords;
using testdata::WriteGzip;
using testdata::TempDir;
using testdata::WriteBytes;

void ExpectError(const std::string& path, std::vector<std::string> fragments, const std::string& format = "cifar",
                 const DatasetOptions& options = {}) {
  try {
    LoadDataset(format, path, options);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nmissing: " << f;
  }
}

// A CIFAR-10 layout in miniature: two training batches of 7 and 5 records, a test batch of 4.
class CifarFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteBytes(dir_ / "data_batch_1.bin", CifarRecords(0, 7));
    WriteBytes(dir_ / "data_batch_2.bin", CifarRecords(7, 5));
    WriteBytes(dir_ / "test_batch.bin", CifarRecords(100, 4));
  }
  TempDir dir_;
};

void ExpectRecords(const Dataset& d, int first, int count) {
  ASSERT_EQ(d.size(), count);
  EXPECT_EQ(d.sample_shape(), (std::vector<int64_t>{3, 32, 32}));
  EXPECT_EQ(d.num_classes(), 10);
  for (int r = 0; r < count; ++r) {
    EXPECT_EQ(d.label(r), (first + r) % 10);
    const uint8_t* p = d.u8_sample(r);
    // CHW as stored: red plane, then green, then blue.
    for (int k : {0, 1, 1023, 1024, 2048, 3071}) ASSERT_EQ(p[k], uint8_t((first + r + k) % 256)) << r << " " << k;
  }
}

TEST_F(CifarFiles, DirectoryReadsAllTrainingBatchesInOrder) {
  ExpectRecords(*LoadDataset("cifar", dir_.path(), {}), 0, 12);
}

TEST_F(CifarFiles, PrefixTrainTestAndExactFile) {
  ExpectRecords(*LoadDataset("cifar", dir_ / "data_batch", {}), 0, 12);
  ExpectRecords(*LoadDataset("cifar", dir_ / "train", {}), 0, 12);
  ExpectRecords(*LoadDataset("cifar", dir_ / "test", {}), 100, 4);
  ExpectRecords(*LoadDataset("cifar", dir_ / "test_batch", {}), 100, 4);
  ExpectRecords(*LoadDataset("cifar", dir_ / "data_batch_2.bin", {}), 7, 5);
}

TEST_F(CifarFiles, MaxSamplesSpansFiles) {
  DatasetOptions o;
  o.max_samples = 9;
  ExpectRecords(*LoadDataset("cifar", dir_.path(), o), 0, 9);
}

TEST_F(CifarFiles, PerChannelStatistics) {
  auto d = LoadDataset("cifar", dir_ / "test", {});
  ASSERT_EQ(d->mean().size(), 3u);
  double sum = 0;
  for (int r = 0; r < 4; ++r)
    for (int k = 1024; k < 2048; ++k) sum += d->u8_sample(r)[k] / 255.0;
  EXPECT_NEAR(d->mean()[1], sum / 4096, 1e-5);
}

TEST_F(CifarFiles, TruncatedRecord) {
  auto b = CifarRecords(0, 3);
  b.resize(b.size() - 100);
  WriteBytes(dir_ / "cut.bin", b);
  ExpectError(dir_ / "cut.bin", {dir_ / "cut.bin", "truncated", "multiple of 3073", "got 9119"});
}

TEST_F(CifarFiles, LabelOutOfRange) {
  auto b = CifarRecords(0, 3);
  b[3073 * 2] = 57;
  WriteBytes(dir_ / "bad.bin", b);
  ExpectError(dir_ / "bad.bin", {dir_ / "bad.bin", "label 57 of record 2", "outside 0..9"});
}

TEST_F(CifarFiles, MissingAndEmpty) {
  ExpectError(dir_ / "nothing", {dir_ / "nothing", "no CIFAR-10 binary file found"});
  TempDir empty;
  ExpectError(empty.path(), {empty.path(), "no CIFAR-10 training batches"});
  WriteBytes(dir_ / "zero.bin", {});
  ExpectError(dir_ / "zero.bin", {dir_ / "zero.bin", "empty file"});
}

// CIFAR-100's layout in miniature (cifar-100-binary/): train.bin of 9 records, test.bin
// (gzip, as the readers take any file) of 4.
class Cifar100Files : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteBytes(dir_ / "train.bin", Cifar100Records(0, 9));
    WriteGzip(dir_ / "test.bin", Cifar100Records(100, 4));
  }
  std::shared_ptr<Dataset> Load(const std::string& path, bool coarse = false, int64_t max_samples = 0) {
    DatasetOptions o;
    o.cifar100_coarse = coarse;
    o.max_samples = max_samples;
    return LoadDataset("cifar100", path, o);
  }
  TempDir dir_;
};

void Expect100(const Dataset& d, int first, int count, bool coarse) {
  ASSERT_EQ(d.size(), count);
  EXPECT_EQ(d.sample_shape(), (std::vector<int64_t>{3, 32, 32}));
  EXPECT_EQ(d.num_classes(), coarse ? 20 : 100);
  for (int r = 0; r < count; ++r) {
    const int i = first + r;
    EXPECT_EQ(d.label(r), coarse ? (3 * i + 1) % 20 : i % 100) << r;
    const uint8_t* p = d.u8_sample(r);
    // Both label bytes are skipped: pixel 0 is the record's third byte.
    for (int k = 0; k < 3072; ++k) ASSERT_EQ(p[k], uint8_t((i + k) % 256)) << r << " " << k;
  }
}

TEST_F(Cifar100Files, FineAndCoarseLabelsAndPixels) {
  Expect100(*Load(dir_.path()), 0, 9, false);
  Expect100(*Load(dir_.path(), true), 0, 9, true);
  Expect100(*Load(dir_ / "train"), 0, 9, false);
  Expect100(*Load(dir_ / "train.bin", true), 0, 9, true);
  Expect100(*Load(dir_ / "test"), 100, 4, false);
  Expect100(*Load(dir_ / "test.bin", true), 100, 4, true);
  Expect100(*Load(dir_ / "train", false, 5), 0, 5, false);
}

TEST_F(Cifar100Files, SizesAndLabelsAreCheckedNamingFileAndRecord) {
  auto b = Cifar100Records(0, 3);
  b.resize(b.size() - 10);
  WriteBytes(dir_ / "cut.bin", b);
  ExpectError(dir_ / "cut.bin", {dir_ / "cut.bin", "not CIFAR-100", "multiple of 3074", "got 9212"}, "cifar100");

  b = Cifar100Records(0, 3);
  b[3074 * 2 + 1] = 100;  // record 2's fine label
  WriteBytes(dir_ / "fine.bin", b);
  ExpectError(dir_ / "fine.bin", {dir_ / "fine.bin", "fine label 100 of record 2", "outside 0..99"}, "cifar100");
  b = Cifar100Records(0, 3);
  b[3074] = 20;  // record 1's coarse label
  WriteBytes(dir_ / "coarse.bin", b);
  DatasetOptions coarse;
  coarse.cifar100_coarse = true;
  ExpectError(dir_ / "coarse.bin", {dir_ / "coarse.bin", "coarse label 20 of record 1", "outside 0..19"}, "cifar100",
              coarse);

  TempDir empty;
  ExpectError(empty.path(), {empty.path(), "no CIFAR-100 training file", "expected train.bin", "test.bin"}, "cifar100");
  ExpectError(empty / "test", {"no CIFAR-100 binary file found", empty / "test.bin"}, "cifar100");
}

// Each layout's reader recognizes the other's files and says which format to use.
TEST_F(Cifar100Files, TheOtherLayoutIsNamed) {
  WriteBytes(dir_ / "ten.bin", CifarRecords(0, 2));
  ExpectError(dir_ / "ten.bin", {"not CIFAR-100", "whole records of 3073 bytes", "format = \"cifar\""}, "cifar100");
  ExpectError(dir_ / "train.bin", {"not CIFAR-10", "whole records of 3074 bytes", "format = \"cifar100\""});
  auto b = CifarRecords(0, 3);
  b[3073] = 42;
  WriteBytes(dir_ / "big_label.bin", b);
  ExpectError(dir_ / "big_label.bin", {"label 42 of record 1", "format = \"cifar100\""});
}

}  // namespace
}  // namespace shoal
