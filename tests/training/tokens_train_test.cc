// A whole job on token data: the GPT exported by PyTorch (tests/engine/testdata/tiny_gpt.onnx)
// learns the bytes of a text file Debian ships (the GPL-3) with allreduce on 2 workers, the
// training loss falling clearly; a token file of odd length stops the job naming the file.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

const char* kText = "/usr/share/common-licenses/GPL-3";

// Bytes [begin, end) of the text as little-endian uint16 tokens (docs/data.md's one-liner).
void WriteByteTokens(const std::string& path, const std::string& text, size_t begin, size_t end) {
  std::ofstream f(path, std::ios::binary);
  for (size_t i = begin; i < end && i < text.size(); ++i) {
    const char le[2] = {text[i], 0};
    f.write(le, 2);
  }
}

std::string GptJob(const std::string& dir, const std::string& train, const std::string& test) {
  return "[job]\nname = \"tokens_gpt\"\nseed = 42\noutput_dir = \"" + dir +
         "/out\"\n\n"
         "[cluster]\nworkers = 2\n\n"
         "[model]\nonnx = \"" +
         BinDir() +
         "/tests/engine/testdata/tiny_gpt.onnx\"\n\n"
         "[data]\nformat = \"tokens\"\ntrain = \"" +
         train + "\"\ntest = \"" + test +
         "\"\nseq_len = 32\nvocab_size = 256\nbatch_size = 16\n\n"
         "[algorithm]\nname = \"allreduce\"\n\n"
         "[optimizer]\nname = \"adam\"\nlr = 0.003\n\n"
         "[train]\nepochs = 3\nthreads = 1\nlog_every_steps = 10\n";
}

TEST(TokensTraining, AllReduceTrainsTheGptOnByteTokens) {
  std::ifstream in(kText, std::ios::binary);
  ASSERT_TRUE(in) << kText << " (Debian's base-files) is missing";
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(text.size(), 30000u);
  const std::string dir = FreshDir("tokens_gpt");
  // nanoGPT's split: the first 90% to train on, the rest to validate.
  const size_t cut = text.size() * 9 / 10;
  WriteByteTokens(dir + "/train.bin", text, 0, cut);
  WriteByteTokens(dir + "/val.bin", text, cut, text.size());

  std::string job = GptJob(dir, dir + "/train.bin", dir + "/val.bin");
  // The trained GPT written back as ONNX: an [N, T, vocab] output exports like any other.
  job.replace(job.find("seed = 42\n"), 10, "seed = 42\nexport_onnx = \"" + dir + "/gpt.onnx\"\n");
  JobRun r = RunJob(dir, job, 240);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const std::vector<std::string> train = Events(r, "train");
  ASSERT_GE(train.size(), 4u) << r.stdout_text.substr(0, 2000);
  const double first = JsonNumber(train.front(), "loss").value_or(0),
               last = JsonNumber(train.back(), "loss").value_or(0);
  // Uniform over 256 bytes is ln 256 = 5.55; English text's byte statistics alone give ~3.
  EXPECT_GT(first, 3.5) << train.front();
  EXPECT_LT(last, 0.75 * first) << "first " << train.front() << "\nlast " << train.back();
  // test_accuracy: the fraction of positions whose next byte is predicted right, far above
  // chance (1/256) once the common bytes (space, e, t) are learned.
  const double acc = JsonNumber(r.done_line, "test_accuracy").value_or(-1);
  printf("first train loss %.3f, last %.3f (%zu train events); done line: %s\n", first, last, train.size(),
         r.done_line.c_str());
  EXPECT_GT(acc, 0.15) << r.done_line;
  EXPECT_LE(acc, 1.0) << r.done_line;
  std::ifstream exported(dir + "/gpt.onnx", std::ios::binary | std::ios::ate);
  EXPECT_TRUE(exported && exported.tellg() > 100000) << "export_onnx wrote no model";
}

// Balanced splits slice each step's global batch of windows (uneven shares as the measured
// rates differ); the job still trains and finishes.
TEST(TokensTraining, BalancedAllReduceTrainsIt) {
  std::ifstream in(kText, std::ios::binary);
  ASSERT_TRUE(in);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string dir = FreshDir("tokens_balanced");
  WriteByteTokens(dir + "/train.bin", text, 0, text.size() * 9 / 10);
  WriteByteTokens(dir + "/val.bin", text, text.size() * 9 / 10, text.size());
  std::string job = GptJob(dir, dir + "/train.bin", dir + "/val.bin");
  job.replace(job.find("name = \"allreduce\"\n"), 19,
              "name = \"allreduce\"\nbalance = true\nbalance_every_steps = 5\n");
  job.replace(job.find("epochs = 3"), 10, "epochs = 1");
  JobRun r = RunJob(dir, job, 240);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const std::vector<std::string> train = Events(r, "train");
  ASSERT_GE(train.size(), 2u);
  EXPECT_LT(JsonNumber(train.back(), "loss").value_or(99), JsonNumber(train.front(), "loss").value_or(0));
  EXPECT_GT(JsonNumber(r.done_line, "test_accuracy").value_or(0), 0.1) << r.done_line;
}

// Training windows start at a phase drawn per epoch from the seed: a job killed at its first
// checkpoint (mid-epoch 0) and restarted from it ends with the uninterrupted run's weights,
// so the resumed epoch cut the text where the whole run did, and so did the next epoch.
TEST(TokensTraining, ResumedMidEpochEndsWithTheSameWeights) {
  std::ifstream in(kText, std::ios::binary);
  ASSERT_TRUE(in);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string data = FreshDir("tokens_resume_data");
  WriteByteTokens(data + "/train.bin", text, 0, text.size() * 9 / 10);
  WriteByteTokens(data + "/val.bin", text, text.size() * 9 / 10, text.size());
  auto job = [&](const std::string& dir) {
    std::string t = GptJob(dir, data + "/train.bin", data + "/val.bin");
    t.replace(t.find("[cluster]"), 9,
              "checkpoint_dir = \"" + dir + "/ckpt\"\ncheckpoint_every_steps = 20\nmax_restarts = 1\n\n[cluster]");
    t.replace(t.find("epochs = 3"), 10, "epochs = 2");
    return t;
  };
  WholeAndKilled runs = RunWholeAndKilledAtCheckpoint("tokens", job, 240);
  ASSERT_TRUE(runs.failure.empty()) << runs.failure;
  const JobRun &whole = runs.whole, &run = runs.killed;
  const std::vector<std::string> resumed = Events(run, "resume");
  ASSERT_FALSE(resumed.empty()) << run.stdout_text.substr(0, 3000);
  EXPECT_GT(JsonNumber(resumed.front(), "batch").value_or(0), 0) << resumed.front();  // mid-epoch
  EXPECT_EQ(WeightsHashes(whole).size(), 1u);
  EXPECT_EQ(WeightsHashes(run), WeightsHashes(whole));
  EXPECT_EQ(JsonNumber(run.done_line, "test_accuracy"), JsonNumber(whole.done_line, "test_accuracy"))
      << run.done_line << "\n"
      << whole.done_line;
}

// Ids past vocab_size (a damaged record, say): the job stops at load naming the file and the
// byte offset; with skip_bad the windows holding them are skipped, counted in the done line
// and named in data_skip events, and the job trains to its end.
TEST(TokensTraining, BadIdsStopTheJobOrAreSkipped) {
  std::ifstream in(kText, std::ios::binary);
  ASSERT_TRUE(in);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string dir = FreshDir("tokens_bad_ids");
  WriteByteTokens(dir + "/train.bin", text, 0, text.size() * 9 / 10);
  WriteByteTokens(dir + "/val.bin", text, text.size() * 9 / 10, text.size());
  {
    std::fstream f(dir + "/train.bin", std::ios::binary | std::ios::in | std::ios::out);
    for (long offset : {20000L, 40002L}) {  // token 10000 and 20001: id 999 (0x03e7)
      f.seekp(offset);
      f.write("\xe7\x03", 2);
    }
  }
  auto job = [&](const std::string& out, bool skip) {
    std::string t = GptJob(out, dir + "/train.bin", dir + "/val.bin");
    t.replace(t.find("epochs = 3"), 10, "epochs = 1");
    if (skip) t.replace(t.find("vocab_size = 256\n"), 17, "vocab_size = 256\nskip_bad = true\n");
    return t;
  };
  const std::string a = FreshDir("tokens_bad_refused");
  JobRun refused = RunJob(a, job(a, false), 120);
  EXPECT_EQ(refused.exit_code, 2) << refused.stderr_text;
  const std::string all = refused.stdout_text + refused.stderr_text;
  EXPECT_NE(
      all.find(dir + "/train.bin: token 999 at byte offset 20000 (token 10000) is not below [data] vocab_size = 256"),
      std::string::npos)
      << all.substr(0, 3000);

  const std::string b = FreshDir("tokens_bad_skipped");
  JobRun run = RunJob(b, job(b, true), 240);
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  // Each bad id lies in one or two windows of an epoch's tiling; both ranks' batches cover it.
  const double skipped = JsonNumber(run.done_line, "data_skipped").value_or(-1);
  EXPECT_GE(skipped, 2) << run.done_line;
  EXPECT_LE(skipped, 4) << run.done_line;
  std::string named;
  for (const std::string& e : Events(run, "data_skip")) named += JsonField(e, "what").value_or("") + "\n";
  EXPECT_NE(named.find(dir + "/train.bin: token 999 at byte offset 20000 "), std::string::npos) << named;
  EXPECT_NE(named.find(dir + "/train.bin: token 999 at byte offset 40002 "), std::string::npos) << named;
  EXPECT_GT(JsonNumber(run.done_line, "test_accuracy").value_or(0), 0.1) << run.done_line;
}

TEST(TokensTraining, AZooModelIsRefusedForTokens) {
  const std::string dir = FreshDir("tokens_zoo");
  WriteByteTokens(dir + "/train.bin", std::string(5000, 'a'), 0, 5000);
  std::string job = GptJob(dir, dir + "/train.bin", dir + "/train.bin");
  job.replace(job.find("onnx = \""), job.find("\n", job.find("onnx = \"")) - job.find("onnx = \""), "name = \"mlp\"");
  JobRun r = RunJob(dir, job, 120);
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  const std::string all = r.stdout_text + r.stderr_text;
  EXPECT_NE(all.find("[data] format = \"tokens\" needs a sequence model"), std::string::npos) << all.substr(0, 3000);
}

TEST(TokensTraining, AnOddLengthTokenFileStopsTheJobNamingIt) {
  const std::string dir = FreshDir("tokens_odd");
  {
    std::ofstream f(dir + "/train.bin", std::ios::binary);
    f << std::string(4001, 'a');  // 2000 tokens and half of one
  }
  WriteByteTokens(dir + "/val.bin", std::string(500, 'b'), 0, 500);
  JobRun r = RunJob(dir, GptJob(dir, dir + "/train.bin", dir + "/val.bin"), 120);
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  const std::string all = r.stdout_text + r.stderr_text;
  EXPECT_NE(all.find(dir + "/train.bin: 4001 bytes, an odd length"), std::string::npos) << all.substr(0, 3000);
}

}  // namespace
}  // namespace testing
}  // namespace shoal
