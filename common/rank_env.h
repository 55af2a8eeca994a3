// A process's rank and world size from the flag, or from the launcher's environment, the
// launcher that started the process first: Open MPI (OMPI_COMM_WORLD_RANK/SIZE), PMIx
// (PMIX_RANK), Slurm's srun (SLURM_PROCID/SLURM_NTASKS), or RANK/WORLD_SIZE.
#pragma once
#include <string>

namespace shoal {

struct RankInfo {
  int rank = 0;
  int world = 1;       // from the environment; 0 when none gave it
  std::string source;  // "flag", "openmpi", "pmix", "slurm", "env"
};

// flag_rank < 0: take it from the environment. Throws shoal::Error on malformed values, and
// when no rank is given at all: with `no_rank` as the message if set (a caller without a
// --rank flag must not suggest one), else one naming --rank and the variables.
RankInfo ResolveRank(int flag_rank, const std::string& no_rank = "");

}  // namespace shoal
