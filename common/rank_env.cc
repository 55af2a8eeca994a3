#include "common/rank_env.h"

#include <cstdlib>
#include <string>

#include "common/error.h"

namespace shoal {
namespace {

bool ReadInt(const char* name, int* out) {
  const char* v = getenv(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  long x = strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > 1000000)
    throw Error(std::string("environment ") + name + "=\"" + v + "\": expected a non-negative integer");
  *out = int(x);
  return true;
}

}  // namespace

RankInfo ResolveRank(int flag_rank, const std::string& no_rank) {
  // -1 is the flag's "not given"; any other negative value is a typo, never "ask the environment".
  if (flag_rank < -1) throw Error("--rank " + std::to_string(flag_rank) + ": expected a rank of 0 or more");
  RankInfo r;
  r.world = 0;
  struct Source {
    const char* rank;
    const char* size;
    const char* name;
  };
  // The launcher that started this process first: mpirun inside an sbatch allocation leaves
  // the batch step's SLURM_PROCID=0 in every task's environment, so Slurm's variable is
  // taken only where no MPI launcher set its own (srun then started the task; srun --mpi=pmix
  // sets PMIX_RANK to the same rank).
  for (Source s :
       {Source{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "openmpi"}, Source{"PMIX_RANK", nullptr, "pmix"},
        Source{"SLURM_PROCID", "SLURM_NTASKS", "slurm"}, Source{"RANK", "WORLD_SIZE", "env"}}) {
    int rank;
    if (ReadInt(s.rank, &rank)) {
      r.rank = rank;
      if (s.size) ReadInt(s.size, &r.world);  // PMIx keeps the size out of the environment
      r.source = s.name;
      break;
    }
  }
  if (flag_rank >= 0) {
    r.rank = flag_rank;
    r.source = "flag";
  } else if (r.source.empty()) {
    if (!no_rank.empty()) throw Error(no_rank);
    throw Error(
        "no rank: pass --rank R, or start under Open MPI (OMPI_COMM_WORLD_RANK), PMIx (PMIX_RANK), Slurm "
        "(SLURM_PROCID) or with RANK set");
  }
  return r;
}

}  // namespace shoal
