// [model] precision through a whole job: a bf16 CPU worker trains to accuracy where the
// processor has bf16 instructions and is refused clearly where it has not; fp16 on a CPU
// worker is refused before training starts.
#include <gtest/gtest.h>

#include <string>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"
#include "worker/engine/cpu/cpu_backend.h"

namespace shoal {
namespace testing {
namespace {

std::string PrecisionJob(const std::string& name, const std::string& dir, const std::string& precision) {
  std::string t = FmnistJob(name, dir + "/out", 1, "lenet", 3200, 1,
                            "[algorithm]\nname = \"local\"\n\n[optimizer]\nname = \"momentum\"\nlr = 0.05\n");
  t.replace(t.find("name = \"lenet\""), 14, "name = \"lenet\"\nprecision = \"" + precision + "\"");
  return t;
}

TEST(Precision, Bf16WorkerTrainsOrIsRefusedClearly) {
  std::string d = FreshDir("bf16");
  JobRun run = RunJob(d, PrecisionJob("bf16", d, "bf16"), 300);
  if (CpuHasBf16()) {
    ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
    EXPECT_GE(JsonNumber(run.done_line, "test_accuracy").value_or(0), 0.65) << run.done_line;
  } else {
    EXPECT_NE(run.exit_code, 0);
    EXPECT_NE(run.stderr_text.find("this processor has no bf16 instructions"), std::string::npos) << run.stderr_text;
  }
}

TEST(Precision, Fp16OnACpuWorkerIsRefused) {
  std::string d = FreshDir("fp16");
  JobRun run = RunJob(d, PrecisionJob("fp16", d, "fp16"), 120);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.stderr_text.find("precision = \"fp16\" on a CPU worker"), std::string::npos) << run.stderr_text;
}

}  // namespace
}  // namespace testing
}  // namespace shoal
