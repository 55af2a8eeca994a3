// Every ready job file in configs/ loads, names a registered algorithm and optimizer, and
// its optimizer and schedule keys are valid.
#include <dirent.h>
#include <gtest/gtest.h>

#include "algorithms/facts.h"
#include "algorithms/job_keys.h"
#include "algorithms/optimizers/optimizer.h"
#include "common/config.h"
#include "common/error.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace {

TEST(Configs, AllLoadAndNameKnownParts) {
  std::string dir = testing::BinDir() + "/configs";
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr) << dir;
  int n = 0;
  while (dirent* e = readdir(d)) {
    std::string f = e->d_name;
    if (f.size() < 5 || f.substr(f.size() - 5) != ".toml") continue;
    ++n;
    SCOPED_TRACE(f);
    JobConfig c = LoadJobConfig(dir + "/" + f);
    EXPECT_NO_THROW(FactsOf(c.algorithm));
    EXPECT_NO_THROW(CheckJobKeys(c));
    EXPECT_NO_THROW(MakeOptimizer(c.optimizer, c.optimizer_opts));
    EXPECT_NO_THROW(LrSchedule::FromConfig(c.optimizer_opts, c.batch_size * c.world_size(), 100, 1000));
  }
  closedir(d);
  EXPECT_GE(n, 5);
}

JobConfig Job(const std::string& algorithm, const std::string& optimizer) {
  return ParseJobConfig("[job]\nname = \"k\"\n[data]\nformat = \"synthetic\"\n[algorithm]\n" + algorithm +
                            "\n[optimizer]\n" + optimizer + "\n",
                        "job.toml");
}

std::string KeyError(const std::string& algorithm, const std::string& optimizer) {
  try {
    CheckJobKeys(Job(algorithm, optimizer));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Elastic diloco keeps checkpoints (they commit among each outer round's members); what meets
// every worker stays refused, naming the key.
TEST(JobKeys, ElasticDilocoTakesCheckpointsButNotStreamingOrBalance) {
  JobConfig c = ParseJobConfig(
      "[job]\nname = \"k\"\ncheckpoint_dir = \"ckpt\"\n[data]\nformat = \"synthetic\"\n[algorithm]\nname = "
      "\"diloco\"\nelastic = true\n[optimizer]\nname = \"adamw\"\n",
      "job.toml");
  EXPECT_EQ(c.checkpoint_dir, "ckpt");
  EXPECT_NO_THROW(CheckJobKeys(c));
  EXPECT_EQ(KeyError("name = \"diloco\"\nelastic = true\nstreaming = 2", "name = \"adamw\""),
            "job.toml: [algorithm] streaming: not with elastic = true (lost-worker tolerance works with streaming = 0 "
            "only)");
  EXPECT_EQ(KeyError("name = \"diloco\"\nelastic = true\nbalance = true", "name = \"adamw\""),
            "job.toml: [algorithm] balance: not with elastic = true (the balancer meets every worker)");
}

TEST(JobKeys, UnknownKeysAreRejectedWithTheNearestKnownOne) {
  EXPECT_EQ(KeyError("name = \"ps_ssp\"\nstalenes = 2", "name = \"momentum\""),
            "job.toml: [algorithm] stalenes: unknown key for algorithm \"ps_ssp\" (did you mean 'staleness'?)");
  EXPECT_EQ(KeyError("name = \"allreduce\"", "name = \"momentum\"\nlearning_rate = 0.1"),
            "job.toml: [optimizer] learning_rate: unknown key for optimizer \"momentum\" (did you mean 'lr'?)");
  // Nothing close: the known keys are listed instead.
  std::string e = KeyError("name = \"local\"\nzzz = 1", "name = \"sgd\"");
  EXPECT_NE(e.find("[algorithm] zzz: unknown key for algorithm \"local\" (known: rendezvous_dir, "), std::string::npos)
      << e;
  // A key of another algorithm or optimizer does nothing here, so it is refused too.
  EXPECT_NE(KeyError("name = \"allreduce\"\nblock_steps = 8", "name = \"sgd\"").find("block_steps"), std::string::npos);
  EXPECT_NE(KeyError("name = \"allreduce\"", "name = \"sgd\"\nmomentum = 0.9").find("momentum"), std::string::npos);
  EXPECT_NE(KeyError("name = \"allreduce\"", "name = \"lamb\"\ntrust_coefficient = 0.01").find("trust_coefficient"),
            std::string::npos);
}

TEST(JobKeys, EveryKeyAnAlgorithmOrOptimizerReadsIsAccepted) {
  // auto may hand the job to bmuf or dgc, so their keys are its keys.
  EXPECT_EQ(KeyError("name = \"auto\"\nblock_steps = 8\nsparsity = 0.99\nprobe_steps = 10\ncollective = \"ring\"",
                     "name = \"momentum\"\nlr = 0.1\nmomentum = 0.9\nnesterov = true\nschedule = \"cosine\""),
            "");
  EXPECT_EQ(KeyError("name = \"dgc\"\nsparsity = 0.999\nsparsity_warmup_epochs = 0\nclip_norm = 5.0",
                     "name = \"lamb\"\nmomentum = 0.9\nbeta1 = 0.9\nwarmup_steps = 10"),
            "");
  EXPECT_EQ(KeyError("name = \"ps_ssp\"\nstaleness = 2\ntimeout_ms = 1000\ntolerate_worker_failure = true",
                     "name = \"still\"\nlamb_lr_ratio = 2.0\ntrust_coefficient = 0.01\nbase_batch_size = 256"),
            "");
  EXPECT_EQ(KeyError("name = \"bmuf\"\nblock_steps = 8\nblock_momentum = 0.5\nblock_lr = 1.0\nrendezvous_dir = \"/x\"",
                     "name = \"rmsprop_sgd\"\nrms_decay = 0.9\nrms_lr_ratio = 0.1"),
            "");
  EXPECT_EQ(KeyError("name = \"diloco\"\nsync_every = 20\nouter_optimizer = \"nesterov\"\nouter_lr = 0.7\n"
                     "outer_momentum = 0.9\nouter_wire = \"int4\"\nbalance = true",
                     "name = \"adamw\"\nlr = 1e-3\nweight_decay = 1e-2"),
            "");
  // auto may hand the job to diloco.
  EXPECT_EQ(
      KeyError("name = \"auto\"\ndiloco_ratio = 50.0\nsync_every = 20\nouter_wire = \"int8\"", "name = \"adamw\""), "");
  for (auto& name : AlgorithmNames()) EXPECT_NO_THROW(KnownAlgorithmKeys(name)) << name;
}

// The launcher refuses the job before it starts anything, with the one line.
TEST(JobKeys, LauncherStopsOnATypo) {
  std::string dir = testing::FreshDir("typo");
  testing::JobRun r = testing::RunJob(dir,
                                      "[job]\nname = \"typo\"\noutput_dir = \"" + dir +
                                          "/out\"\n[data]\nformat = \"synthetic\"\n[algorithm]\nname = "
                                          "\"ps_ssp\"\nstalenes = 2\n[cluster]\nservers = [\"127.0.0.1:1\"]\n",
                                      60);
  EXPECT_EQ(r.exit_code, 2) << r.stderr_text;
  EXPECT_NE(
      r.stderr_text.find("[algorithm] stalenes: unknown key for algorithm \"ps_ssp\" (did you mean 'staleness'?)"),
      std::string::npos)
      << r.stderr_text;
}

}  // namespace
}  // namespace shoal
