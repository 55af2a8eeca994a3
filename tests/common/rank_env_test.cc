// ResolveRank takes the rank from the launcher that started the process: mpirun inside an
// sbatch allocation leaves the batch step's SLURM_PROCID=0 in every task, which made every
// task rank 0 while Slurm's variable came first.
#include "common/rank_env.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "common/error.h"

namespace shoal {
namespace {

// Sets exactly these launcher variables for one test (unsetting the rest).
class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* v : kAll) unsetenv(v);
    for (auto& [k, v] : vars) setenv(k, v, 1);
  }
  ~Env() {
    for (const char* v : kAll) unsetenv(v);
  }

 private:
  static constexpr const char* kAll[] = {
      "SLURM_PROCID",         "SLURM_NTASKS", "SLURM_STEP_ID", "OMPI_COMM_WORLD_RANK",
      "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",    "RANK",          "WORLD_SIZE"};
};

TEST(RankEnv, MpirunInsideAnSbatchAllocationTakesMpisRank) {
  Env e({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  RankInfo r = ResolveRank(-1);
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.world, 4);
  EXPECT_EQ(r.source, "openmpi");
}

TEST(RankEnv, PmixRankWinsOverTheBatchStepsSlurmProcid) {
  Env e({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"PMIX_RANK", "2"}});
  RankInfo r = ResolveRank(-1);
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.world, 0) << "PMIx gives no size: the job file decides";
  EXPECT_EQ(r.source, "pmix");
}

TEST(RankEnv, SrunAloneGivesSlurmsRankAndSize) {
  Env e({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_ID", "0"}, {"RANK", "1"}});
  RankInfo r = ResolveRank(-1);
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world, 8);
  EXPECT_EQ(r.source, "slurm");
}

TEST(RankEnv, RankVariablesAndTheFlag) {
  {
    Env e({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
    RankInfo r = ResolveRank(-1);
    EXPECT_EQ(r.rank, 1);
    EXPECT_EQ(r.source, "env");
  }
  {
    Env e({{"OMPI_COMM_WORLD_RANK", "3"}});
    EXPECT_EQ(ResolveRank(0).rank, 0);
    EXPECT_EQ(ResolveRank(0).source, "flag");
  }
  {
    Env e({});
    EXPECT_THROW(ResolveRank(-1), Error);
    Env bad({{"PMIX_RANK", "x"}});
    EXPECT_THROW(ResolveRank(-1), Error);
  }
}

}  // namespace
}  // namespace shoal
