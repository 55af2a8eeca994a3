// Encoded image data end to end, through the launcher and real worker processes: an
// ImageFolder and a WebDataset made from Fashion-MNIST (PNG and JPEG) train lenet on
// grayscale 28x28 as well as the IDX files of the same images do; bad data stops the job
// with one line naming the file (worker exit 2), or with [data] skip_bad is skipped and
// counted in metrics.jsonl and the done line.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/json_fields.h"
#include "tests/data/image_files.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

using testdata::MakeImages;
using testdata::ReadAll;

constexpr int kTrain = 3000, kTest = 1000;

// Fashion-MNIST's statistics, as the IDX run computes them, so the runs differ only in
// where the pixels come from (and JPEG's loss on half of them).
std::string Job(const std::string& name, const std::string& dir, const std::string& data) {
  return "[job]\nname = \"" + name + "\"\nseed = 42\noutput_dir = \"" + dir +
         "/out\"\n\n[cluster]\nworkers = 2\n\n[model]\nname = \"lenet\"\n\n[data]\n" + data +
         "batch_size = 32\n\n[algorithm]\nname = \"allreduce\"\n\n[optimizer]\nname = \"momentum\"\nlr = "
         "0.05\n\n[train]\nepochs = 2\nthreads = 1\nlog_every_steps = 20\n";
}

std::string Encoded(const std::string& format, const std::string& train, const std::string& test,
                    const std::string& extra = "") {
  return "format = \"" + format + "\"\ntrain = \"" + train + "\"\ntest = \"" + test +
         "\"\nimage_size = 28\nchannels = 1\naugment = false\ncrop_fraction = 1.0\nmean = [0.286]\nstd = [0.353]\n" +
         extra;
}

double Accuracy(const JobRun& r) { return JsonNumber(r.done_line, "test_accuracy").value_or(-1); }

class ImageData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new std::string(FreshDir("image_data"));
    MakeImages("folder '" + *data_ + "/f' " + std::to_string(kTrain) + " " + std::to_string(kTest));
    MakeImages("shards '" + *data_ + "/w' " + std::to_string(kTrain) + " " + std::to_string(kTest) + " 4");
  }
  static std::string* data_;
};
std::string* ImageData::data_ = nullptr;

TEST_F(ImageData, FolderAndShardsTrainLikeTheIdxFiles) {
  const std::string& d = *data_;
  const std::string i = FreshDir("idx");
  JobRun idx = RunJob(i,
                      Job("idx", i,
                          "format = \"idx\"\ntrain = \"/usr/share/datasets/fashion-mnist/train\"\ntest = "
                          "\"/usr/share/datasets/fashion-mnist/t10k\"\nmax_train_samples = " +
                              std::to_string(kTrain) + "\nmax_test_samples = " + std::to_string(kTest) + "\n"),
                      180);
  ASSERT_EQ(idx.exit_code, 0) << idx.stderr_text;
  const std::string f = FreshDir("folder");
  JobRun folder = RunJob(f, Job("folder", f, Encoded("imagefolder", d + "/f/train", d + "/f/test")), 180);
  ASSERT_EQ(folder.exit_code, 0) << folder.stderr_text;
  const std::string w = FreshDir("shards");
  JobRun shards = RunJob(
      w, Job("shards", w, Encoded("webdataset", d + "/w/train-{000000..000003}.tar", d + "/w/test-000000.tar")), 180);
  ASSERT_EQ(shards.exit_code, 0) << shards.stderr_text;
  printf("idx: %s\nfolder: %s\nshards: %s\n", idx.done_line.c_str(), folder.done_line.c_str(),
         shards.done_line.c_str());
  // Same images, same steps: the same accuracy band.
  EXPECT_GE(Accuracy(idx), 0.7) << idx.done_line;
  EXPECT_GE(Accuracy(folder), Accuracy(idx) - 0.04) << folder.done_line << "\n" << idx.done_line;
  EXPECT_GE(Accuracy(shards), Accuracy(idx) - 0.04) << shards.done_line << "\n" << idx.done_line;
  EXPECT_EQ(JsonNumber(folder.done_line, "steps"), JsonNumber(idx.done_line, "steps"));
  // Decode waits are counted where straggler detection reads them.
  std::vector<std::string> train = Events(folder, "train");
  ASSERT_FALSE(train.empty());
  EXPECT_TRUE(JsonNumber(train.back(), "wait_s").has_value()) << train.back();
  EXPECT_EQ(folder.done_line.find("data_skipped"), std::string::npos) << "only with skip_bad";
}

// A copy of the folder with one truncated JPEG; a copy of the shards with one missing.
TEST_F(ImageData, BadDataStopsTheJobOrIsSkippedAndCounted) {
  const std::string& d = *data_;
  const std::string bad = FreshDir("bad");
  ASSERT_EQ(system(("cp -r '" + d + "/f' '" + bad + "/f'").c_str()), 0);
  const std::string cut = bad + "/f/train/0-tshirt/000001.jpg";
  std::vector<uint8_t> b = ReadAll(cut);
  ASSERT_GT(b.size(), 100u);
  FILE* fp = fopen(cut.c_str(), "wb");
  ASSERT_NE(fp, nullptr);
  fwrite(b.data(), 1, b.size() / 2, fp);
  fclose(fp);
  const std::string data = Encoded("imagefolder", bad + "/f/train", bad + "/f/test");

  const std::string s = FreshDir("stop");
  JobRun stop = RunJob(s, Job("stop", s, data), 180);
  EXPECT_NE(stop.exit_code, 0);
  EXPECT_NE(stop.stderr_text.find(cut + ": corrupt or truncated JPEG"), std::string::npos) << stop.stderr_text;
  EXPECT_NE(stop.stderr_text.find("exit code 2"), std::string::npos) << stop.stderr_text;

  const std::string k = FreshDir("skip");
  JobRun skip = RunJob(k, Job("skip", k, data + "skip_bad = true\n"), 180);
  ASSERT_EQ(skip.exit_code, 0) << skip.stderr_text;
  // Two epochs: the file comes up at most once in each (whichever worker draws it; an
  // epoch's last samples short of a whole batch on every worker are left out).
  EXPECT_GE(JsonNumber(skip.done_line, "data_skipped").value_or(0), 1) << skip.done_line;
  EXPECT_LE(JsonNumber(skip.done_line, "data_skipped").value_or(9), 2) << skip.done_line;
  std::vector<std::string> notes = Events(skip, "data_skip");
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes[0].find("000001.jpg"), std::string::npos) << notes[0];
  EXPECT_GE(Accuracy(skip), 0.7) << skip.done_line;

  // WebDataset: a shard the pattern names is missing.
  const std::string shards = Encoded("webdataset", d + "/w/train-{000000..000004}.tar", d + "/w/test-000000.tar");
  const std::string m = FreshDir("missing");
  JobRun missing = RunJob(m, Job("missing", m, shards), 180);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.stderr_text.find(d + "/w/train-000004.tar: missing shard"), std::string::npos)
      << missing.stderr_text;
  const std::string n = FreshDir("missing_skip");
  JobRun skipped = RunJob(n, Job("missing_skip", n, shards + "skip_bad = true\n"), 180);
  ASSERT_EQ(skipped.exit_code, 0) << skipped.stderr_text;
  EXPECT_EQ(JsonNumber(skipped.done_line, "data_skipped"), 1) << skipped.done_line;
}

// Augmentation on (RandomResizedCrop + flip): a job killed after its first checkpoint and
// restarted from it (mid-epoch, at the checkpoint's data position) ends with the same
// weights as the uninterrupted run, so every crop and flip after the restart was the same.
TEST_F(ImageData, AugmentedRunResumedMidEpochEndsWithTheSameWeights) {
  const std::string& d = *data_;
  auto job = [&](const std::string& dir) {
    std::string t = Job("augmented", dir,
                        "format = \"imagefolder\"\ntrain = \"" + d + "/f/train\"\ntest = \"" + d +
                            "/f/test\"\nimage_size = 28\nchannels = 1\naugment = true\nloader_threads = 2\n");
    t.replace(t.find("[cluster]"), 9,
              "checkpoint_dir = \"" + dir + "/ckpt\"\ncheckpoint_every_steps = 20\nmax_restarts = 1\n\n[cluster]");
    t.replace(t.find("epochs = 2"), 10, "epochs = 3");
    return t;
  };
  WholeAndKilled runs = RunWholeAndKilledAtCheckpoint("augmented", job, 300);
  ASSERT_TRUE(runs.failure.empty()) << runs.failure;
  const JobRun &whole = runs.whole, &run = runs.killed;
  EXPECT_EQ(WeightsHashes(whole).size(), 1u);
  EXPECT_EQ(WeightsHashes(run), WeightsHashes(whole));
  EXPECT_EQ(Accuracy(run), Accuracy(whole)) << run.done_line << "\n" << whole.done_line;
}

}  // namespace
}  // namespace testing
}  // namespace shoal
