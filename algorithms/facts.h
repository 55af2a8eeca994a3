// What the rest of Shoal needs to know about each algorithm, in one table: the launcher
// (start servers? which deaths end the job?), the trainer and the servers
// (through the workers' training plan) read it here instead of comparing names. Links
// nothing but common/error, so a tool can ask without linking the algorithms.
#pragma once
#include <string>
#include <vector>

namespace shoal {

// Which worker deaths a job of this algorithm survives.
enum class ToleratedDeaths {
  kNone,       // synchronous: one death ends the job
  kAnyButLast  // asynchronous: the others go on while one worker is left
};

// How the parameter servers apply pushed gradients (none for collective algorithms).
enum class ServerUpdate {
  kNone,
  kApplyEach,     // every push is one worker's optimizer step
  kMeanOfWorkers  // the mean of all workers' pushes of a step, applied once
};

struct AlgorithmFacts {
  std::string name;
  bool needs_servers = false;
  ToleratedDeaths tolerated_deaths = ToleratedDeaths::kNone;
  ServerUpdate server_update = ServerUpdate::kNone;
  // The [algorithm] keys its code reads (besides name and the keys every job may carry,
  // JobAlgorithmKeys). This list is what a job file is checked against, so a key read
  // without being listed here can never be set.
  std::vector<std::string> keys;
  // [optimizer] keys it reads beyond the optimizer's own (dgc's momentum correction).
  std::vector<std::string> optimizer_keys;
  // Algorithms it may hand the job to (auto): their keys are accepted too.
  std::vector<std::string> may_choose;
};

// [algorithm] keys of any job: rendezvous_dir, tolerate_worker_failure.
const std::vector<std::string>& JobAlgorithmKeys();
// Every [algorithm] key a job of `name` may carry: its own, those of the algorithms it may
// choose, and JobAlgorithmKeys(). Throws like FactsOf for an unknown name.
std::vector<std::string> KnownAlgorithmKeys(const std::string& name);
// [optimizer] keys `name` adds, with those of the algorithms it may choose.
std::vector<std::string> AlgorithmOptimizerKeys(const std::string& name);

// Throws shoal::Error `unknown algorithm "x" (known: ...)` for a name not in the table.
const AlgorithmFacts& FactsOf(const std::string& name);
// Every algorithm's facts, by name.
const std::vector<AlgorithmFacts>& AllAlgorithmFacts();
std::vector<std::string> AlgorithmNames();

}  // namespace shoal
