// Adam and AdamW in whole jobs on real Fashion-MNIST: adamw at PyTorch's recipe (lr 1e-3,
// weight_decay 1e-2, warm-up then cosine) on allreduce workers, where the rule runs on the
// workers and replicas must stay bit-identical, and adam on parameter servers (ps_sync),
// where the shards run it. PyTorch training the same MLP (784-256-256-10) on the same 12000
// samples for the same 187 steps at batch 64 with the same recipes reached 0.830 (AdamW)
// and 0.837 (Adam) on these 2000 test images; these jobs reached 0.830 and 0.838.
#include <gtest/gtest.h>

#include <iostream>
#include <set>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

JobRun RunMlp(const std::string& name, int workers, int64_t samples, int epochs, const std::string& sections) {
  std::string dir = FreshDir(name);
  JobRun r = RunJob(dir, FmnistJob(name, dir + "/out", workers, "mlp", samples, epochs, sections), 600);
  std::cout << name << ": " << r.done_line << std::endl;  // the accuracy reached, for the log
  return r;
}

double Accuracy(const JobRun& r) { return JsonNumber(r.done_line, "test_accuracy").value_or(-1); }

TEST(AdamTraining, AdamWOnAllReduceWorkers) {
  JobRun r = RunMlp("allreduce_adamw", 2, 12000, 1,
                    "[algorithm]\nname = \"allreduce\"\n\n"
                    "[optimizer]\nname = \"adamw\"\nlr = 1e-3\nwarmup_steps = 10\nschedule = \"cosine\"\n\n");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_EQ(JsonField(r.done_line, "event").value_or(""), "done") << r.done_line;
  EXPECT_GE(Accuracy(r), 0.80) << r.done_line;
  std::set<std::string> hashes;
  for (auto& e : Events(r, "end")) hashes.insert(JsonField(e, "weights_hash").value_or("?"));
  EXPECT_EQ(hashes.size(), 1u) << "weights differ across workers";
}

TEST(AdamTraining, AdamOnParameterServers) {
  JobRun r = RunMlp("ps_sync_adam", 2, 12000, 1,
                    "[algorithm]\nname = \"ps_sync\"\n\n[optimizer]\nname = \"adam\"\nlr = 1e-3\n\n");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_GE(Accuracy(r), 0.80) << r.done_line;
}

}  // namespace
}  // namespace testing
}  // namespace shoal
