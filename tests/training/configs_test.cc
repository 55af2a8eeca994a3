// Every ready job file in configs/ loads, names a registered algorithm and optimizer, and
// its optimizer and schedule keys are valid.
#include <dirent.h>
#include <gtest/gtest.h>

#include "algorithms/facts.h"
#include "algorithms/optimizers/optimizer.h"
#include "common/config.h"
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
    EXPECT_NO_THROW(MakeOptimizer(c.optimizer, c.optimizer_opts));
    EXPECT_NO_THROW(LrSchedule::FromConfig(c.optimizer_opts, c.batch_size * c.world_size(), 100, 1000));
  }
  closedir(d);
  EXPECT_GE(n, 5);
}

}  // namespace
}  // namespace shoal
