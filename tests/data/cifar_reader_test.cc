#include "worker/data/cifar_reader.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/data/test_files.h"

namespace shoal {
namespace {

using testdata::CifarRecords;
using testdata::TempDir;
using testdata::WriteBytes;

void ExpectError(const std::string& path, std::vector<std::string> fragments) {
  try {
    LoadDataset("cifar", path, {});
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
  ExpectError(dir_ / "nothing", {dir_ / "nothing", "no CIFAR binary file found"});
  TempDir empty;
  ExpectError(empty.path(), {empty.path(), "no CIFAR training batches"});
  WriteBytes(dir_ / "zero.bin", {});
  ExpectError(dir_ / "zero.bin", {dir_ / "zero.bin", "empty file"});
}

}  // namespace
}  // namespace shoal
