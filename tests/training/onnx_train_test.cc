// Whole jobs training an imported ONNX model (tests/engine/testdata/small_cnn.onnx, exported
// by PyTorch) through the launcher: a collective and a parameter-server algorithm reach an
// accuracy, the synchronous one with identical weights everywhere; a checkpointed run
// resumes; an operator Shoal lacks stops the job before it starts, naming it (exit 2).
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <fstream>
#include <set>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

const char* kMomentum = "[optimizer]\nname = \"momentum\"\nlr = 0.05\nmomentum = 0.9\nweight_decay = 5e-4\n\n";

std::string Cnn() { return BinDir() + "/tests/engine/testdata/small_cnn.onnx"; }

TEST(OnnxTraining, AllReduceTrainsTheExportedCnnWithIdenticalWeights) {
  const std::string dir = FreshDir("onnx_allreduce");
  JobRun r = RunJob(dir,
                    FmnistJob("onnx_allreduce", dir + "/out", 2, Cnn(), 6000, 1,
                              "[algorithm]\nname = \"allreduce\"\n\n" + std::string(kMomentum)),
                    300);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_GE(JsonNumber(r.done_line, "test_accuracy").value_or(0), 0.70) << r.done_line;
  std::set<std::string> hashes;
  for (const std::string& e : Events(r, "end")) hashes.insert(JsonField(e, "weights_hash").value_or("?"));
  EXPECT_EQ(hashes.size(), 1u) << "weights differ across workers";
}

TEST(OnnxTraining, ParameterServerTrainsIt) {
  const std::string dir = FreshDir("onnx_ps");
  JobRun r = RunJob(dir,
                    FmnistJob("onnx_ps", dir + "/out", 2, Cnn(), 6000, 1,
                              "[algorithm]\nname = \"ps_async\"\n\n" + std::string(kMomentum)),
                    300);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_GE(JsonNumber(r.done_line, "test_accuracy").value_or(0), 0.65) << r.done_line;
}

TEST(OnnxTraining, ACheckpointedRunResumes) {
  const std::string dir = FreshDir("onnx_resume");

  auto job = [&](int epochs) {
    std::string t = FmnistJob("onnx_resume", dir + "/out", 2, Cnn(), 3000, epochs,
                              "[algorithm]\nname = \"bmuf\"\nblock_steps = 4\n\n" + std::string(kMomentum));
    // One [job] table: the checkpoint keys go into the one FmnistJob wrote.
    t.replace(t.find("seed = 42\n"), 10,
              "seed = 42\ncheckpoint_dir = \"" + dir + "/ckpt\"\ncheckpoint_every_steps = 20\n");
    return t;
  };

  JobRun first = RunJob(dir, job(1), 300);
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  const double steps1 = JsonNumber(first.done_line, "steps").value_or(0);
  JobRun second = RunJob(dir, job(2), 300, {"--resume"});
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  EXPECT_GT(JsonNumber(second.done_line, "steps").value_or(0), steps1) << second.done_line;
  EXPECT_NE(second.stdout_text.find("resum"), std::string::npos) << second.stdout_text.substr(0, 2000);
}

TEST(OnnxTraining, AnUnsupportedOperatorStopsTheJobBeforeItStarts) {
  const std::string dir = FreshDir("onnx_bad_op");
  onnx::ModelProto m;
  {
    std::ifstream f(Cnn(), std::ios::binary);
    ASSERT_TRUE(m.ParseFromIstream(&f));
  }
  for (onnx::NodeProto& n : *m.mutable_graph()->mutable_node())
    if (n.op_type() == "Relu") {
      n.set_op_type("Selu");  // a valid ONNX operator Shoal does not implement
      break;
    }
  const std::string path = dir + "/selu.onnx";
  {
    std::ofstream f(path, std::ios::binary);
    m.SerializeToOstream(&f);
  }
  JobRun r = RunJob(dir,
                    FmnistJob("onnx_bad_op", dir + "/out", 2, path, 1000, 1,
                              "[algorithm]\nname = \"allreduce\"\n\n" + std::string(kMomentum)),
                    120);
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  const std::string all = r.stdout_text + r.stderr_text;
  EXPECT_NE(all.find("Selu"), std::string::npos) << all;
  EXPECT_NE(all.find("selu.onnx"), std::string::npos) << all;
  EXPECT_NE(all.find("supported"), std::string::npos) << all;
}

}  // namespace
}  // namespace testing
}  // namespace shoal
