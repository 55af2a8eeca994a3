// Learning robustness at settings a PyTorch user would try first: lenet with momentum SGD at
// lr 0.1 (batch 128, momentum 0.9, constant, no warm-up) learns from Shoal's default start,
// and a network that died at the start is named on the console and in metrics.
#include <gtest/gtest.h>

#include <string>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

// 12,800 Fashion-MNIST samples: 100 steps of 128. Seed 2 is one where He-normal weights die
// in the first steps (as about half the seeds do at this learning rate).
std::string LargeLrLenet(const std::string& name, const std::string& dir, const std::string& init) {
  return "[job]\nname = \"" + name + "\"\nseed = 2\noutput_dir = \"" + dir +
         "/out\"\n\n[cluster]\nworkers = 1\n\n[model]\nname = \"lenet\"\ninit = \"" + init +
         "\"\n\n[data]\nformat = \"idx\"\ntrain = \"/usr/share/datasets/fashion-mnist/train\"\n"
         "test = \"/usr/share/datasets/fashion-mnist/t10k\"\nbatch_size = 128\nmax_train_samples = 12800\n"
         "max_test_samples = 2000\n\n[algorithm]\nname = \"local\"\n\n[optimizer]\nname = \"momentum\"\n"
         "lr = 0.1\nmomentum = 0.9\nschedule = \"constant\"\n\n[train]\nepochs = 1\nthreads = 1\n";
}

TEST(Robustness, LenetLearnsAtLearningRate01FromTheDefaultStart) {
  std::string d = FreshDir("lr01_default");
  JobRun run = RunJob(d, LargeLrLenet("lr01_default", d, "auto"), 300);
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_GE(JsonNumber(run.done_line, "test_accuracy").value_or(0), 0.70) << run.done_line;
  EXPECT_TRUE(Events(run, "warning").empty()) << run.stderr_text;
}

TEST(Robustness, ADeadNetworkIsNamedWithItsLikelyCause) {
  std::string d = FreshDir("lr01_he");
  JobRun run = RunJob(d, LargeLrLenet("lr01_he", d, "he_normal"), 300);
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_LE(JsonNumber(run.done_line, "test_accuracy").value_or(1), 0.15) << run.done_line;
  auto warnings = Events(run, "warning");
  ASSERT_EQ(warnings.size(), 1u) << run.stderr_text;
  EXPECT_EQ(JsonField(warnings[0], "kind").value_or(""), "dead_network") << warnings[0];
  EXPECT_NE(run.stderr_text.find("the network is dead"), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("lr 0.1"), std::string::npos) << run.stderr_text;
}

}  // namespace
}  // namespace testing
}  // namespace shoal
