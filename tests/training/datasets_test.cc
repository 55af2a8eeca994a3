// Data sets Shoal was not written around, end to end through the launcher and real worker
// processes: CIFAR-100 (fine and coarse labels) learns well above chance, EMNIST-letters
// style IDX (labels 1..26, 8x8 images) trains the mlp, and data a model cannot take or
// labels the model was not sized for stop the job at start with one line (worker exit 2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

void Write(const std::string& path, const std::vector<uint8_t>& b) {
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(fwrite(b.data(), 1, b.size(), f), b.size());
  fclose(f);
}

// Learnable images: each class is a fixed random prototype; a sample is its class's
// prototype plus uniform noise of +-40, clamped to a byte.
struct Prototypes {
  Prototypes(int classes, int pixels, uint64_t seed) : n(pixels), rng(seed) {
    std::uniform_int_distribution<int> v(0, 255);
    for (int i = 0; i < classes * pixels; ++i) protos.push_back(uint8_t(v(rng)));
  }
  void Sample(int cls, std::vector<uint8_t>* out) {
    std::uniform_int_distribution<int> noise(-40, 40);
    for (int k = 0; k < n; ++k) out->push_back(uint8_t(std::clamp(protos[size_t(cls * n + k)] + noise(rng), 0, 255)));
  }
  int n;
  std::mt19937_64 rng;
  std::vector<uint8_t> protos;
};

// cifar-100-binary/{train,test}.bin: per_class records of each fine class; coarse = fine / 5,
// as CIFAR-100's superclasses group five classes each.
void WriteCifar100(const std::string& dir, int train_per_class, int test_per_class) {
  ASSERT_EQ(system(("mkdir -p '" + dir + "'").c_str()), 0);
  Prototypes p(100, 3072, 5);
  for (auto [name, per] : {std::make_pair("train", train_per_class), std::make_pair("test", test_per_class)}) {
    std::vector<uint8_t> b;
    for (int i = 0; i < per; ++i)
      for (int fine = 0; fine < 100; ++fine) {
        b.push_back(uint8_t(fine / 5));
        b.push_back(uint8_t(fine));
        p.Sample(fine, &b);
      }
    Write(dir + "/" + name + ".bin", b);
  }
}

void PutBE32(std::vector<uint8_t>* b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b->push_back(uint8_t(v >> s));
}

// <prefix>-images-idx3-ubyte and <prefix>-labels-idx1-ubyte: side x side images of `labels`.
void WriteIdx(const std::string& prefix, Prototypes* p, int side, const std::vector<int>& labels) {
  std::vector<uint8_t> img = {0, 0, 8, 3}, lab = {0, 0, 8, 1};
  PutBE32(&img, uint32_t(labels.size()));
  PutBE32(&img, uint32_t(side));
  PutBE32(&img, uint32_t(side));
  PutBE32(&lab, uint32_t(labels.size()));
  for (int l : labels) {
    p->Sample(l, &img);
    lab.push_back(uint8_t(l));
  }
  Write(prefix + "-images-idx3-ubyte", img);
  Write(prefix + "-labels-idx1-ubyte", lab);
}

std::string Job(const std::string& name, const std::string& dir, int workers, const std::string& model,
                const std::string& data, int epochs) {
  return "[job]\nname = \"" + name + "\"\nseed = 3\noutput_dir = \"" + dir + "/out\"\n\n[cluster]\nworkers = " +
         std::to_string(workers) + "\n\n[model]\nname = \"" + model + "\"\n\n[data]\n" + data +
         "batch_size = 25\n\n[algorithm]\nname = \"" + (workers > 1 ? "allreduce" : "local") +
         "\"\n\n[optimizer]\nname = \"momentum\"\nlr = 0.02\nmomentum = 0.9\n\n[train]\nepochs = " +
         std::to_string(epochs) + "\nthreads = 1\nlog_every_steps = 10\n";
}

// The worker stopped with exit code 2 (the job's input is wrong) and the launcher said so.
void ExpectInputError(const JobRun& r) {
  EXPECT_NE(r.exit_code, 0) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("worker 0 stopped: exit code 2"), std::string::npos) << r.stderr_text;
}

double Accuracy(const JobRun& r) { return JsonNumber(r.done_line, "test_accuracy").value_or(-1); }

// 1,000 training images (10 a class), 2 workers, allreduce: chance is 1% (fine), 5% (coarse).
TEST(Datasets, Cifar100LearnsFineAndCoarseLabels) {
  const std::string d = FreshDir("cifar100");
  WriteCifar100(d + "/cifar-100-binary", 10, 2);
  const std::string data = "format = \"cifar100\"\ntrain = \"" + d + "/cifar-100-binary\"\ntest = \"" + d +
                           "/cifar-100-binary/test\"\n";
  JobRun fine = RunJob(d, Job("c100fine", d, 2, "mlp", data, 4), 120);
  ASSERT_EQ(fine.exit_code, 0) << fine.stderr_text;
  EXPECT_GE(Accuracy(fine), 0.5) << fine.done_line;

  const std::string c = FreshDir("cifar100_coarse");
  JobRun coarse = RunJob(c, Job("c100coarse", c, 1, "mlp", data + "label = \"coarse\"\n", 4), 120);
  ASSERT_EQ(coarse.exit_code, 0) << coarse.stderr_text;
  EXPECT_GE(Accuracy(coarse), 0.5) << coarse.done_line;
}

// EMNIST letters' labels are 1..26 (0 unused): the model gets 27 outputs and learns.
TEST(Datasets, LettersStyleIdxOnSmallImagesTrains) {
  const std::string d = FreshDir("letters");
  Prototypes p(27, 64, 9);
  std::vector<int> train, test;
  for (int i = 0; i < 40; ++i)
    for (int l = 1; l <= 26; ++l) (i < 32 ? train : test).push_back(l);
  WriteIdx(d + "/train", &p, 8, train);
  WriteIdx(d + "/t10k", &p, 8, test);
  const std::string data = "format = \"idx\"\ntrain = \"" + d + "/train\"\ntest = \"" + d + "/t10k\"\n";
  JobRun r = RunJob(d, Job("letters", d, 1, "mlp", data, 3), 120);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_GE(Accuracy(r), 0.6) << r.done_line;

  // lenet cannot take 8x8: refused at start, naming the model, the shape and the need.
  JobRun l = RunJob(FreshDir("letters_lenet"), Job("letters_lenet", d, 1, "lenet", data, 1), 60);
  ExpectInputError(l);
  EXPECT_NE(l.stderr_text.find("model lenet: input [1,8,8] is too small"), std::string::npos) << l.stderr_text;
  EXPECT_NE(l.stderr_text.find("at least 16x16"), std::string::npos) << l.stderr_text;
}

// A test set with a class the training set lacks: refused naming [data] classes, which
// then sizes the model for it; labels at or over [data] classes are refused too.
TEST(Datasets, ClassesTheTrainingSetLacks) {
  const std::string d = FreshDir("lacks");
  Prototypes p(5, 64, 11);
  std::vector<int> train, test;
  for (int i = 0; i < 40; ++i)
    for (int l = 0; l < 5; ++l)
      if (l < 4) train.push_back(l);
  for (int i = 0; i < 10; ++i)
    for (int l = 0; l < 5; ++l) test.push_back(l);
  WriteIdx(d + "/train", &p, 8, train);
  WriteIdx(d + "/t10k", &p, 8, test);
  const std::string data = "format = \"idx\"\ntrain = \"" + d + "/train\"\ntest = \"" + d + "/t10k\"\n";

  JobRun r = RunJob(FreshDir("lacks_refused"), Job("lacks", d, 1, "mlp", data, 1), 60);
  ExpectInputError(r);
  EXPECT_NE(r.stderr_text.find("label 4 of sample 4 is not a class of the training set"), std::string::npos)
      << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("[data] classes = 5 sizes the model"), std::string::npos) << r.stderr_text;

  const std::string k = FreshDir("lacks_classes");
  JobRun ok = RunJob(k, Job("lacks5", k, 1, "mlp", data + "classes = 5\n", 2), 60);
  ASSERT_EQ(ok.exit_code, 0) << ok.stderr_text;
  // Class 4 is never learned: at most the other four fifths are right, and those are.
  EXPECT_GE(Accuracy(ok), 0.7) << ok.done_line;
  EXPECT_LE(Accuracy(ok), 0.8 + 1e-9) << ok.done_line;

  JobRun few = RunJob(FreshDir("lacks_few"), Job("lacks3", d, 1, "mlp", data + "classes = 3\n", 1), 60);
  ExpectInputError(few);
  EXPECT_NE(few.stderr_text.find(d + "/train"), std::string::npos) << few.stderr_text;
  EXPECT_NE(few.stderr_text.find("label 3 of"), std::string::npos) << few.stderr_text;
  EXPECT_NE(few.stderr_text.find("outside 0..2"), std::string::npos) << few.stderr_text;
}

}  // namespace
}  // namespace testing
}  // namespace shoal
