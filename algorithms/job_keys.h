// The check that a job file's free-form sections ([algorithm], [optimizer]) carry only keys
// the chosen algorithm and optimizer read: without it a typo ("learning_rate",
// "stalenes") silently falls back to a default. The key lists live with what reads them
// (AlgorithmFacts::keys, the optimizer registry); this only joins them.
#pragma once
#include "common/config.h"

namespace shoal {

// Throws shoal::Error naming the file, the section, the key and the nearest known key.
// Also rejects an unknown algorithm or optimizer name, and [train] batch_schedule with an
// algorithm that needs servers.
// Also refuses `elastic` where it cannot work (SurvivesLostWorkers).
void CheckJobKeys(const JobConfig& cfg);

// diloco with [algorithm] elastic = true: a worker lost between two outer steps drops out of
// them and the job goes on (algorithms/live_quorum.h); `shoal run` restarts it alone.
bool SurvivesLostWorkers(const JobConfig& cfg);

}  // namespace shoal
