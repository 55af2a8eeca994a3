// Fuzzes the job-file loader on arbitrary text: ParseJobConfig, then what the launcher
// checks before starting anything (the optimizer and its [optimizer] keys). A
// shoal::Error is the normal outcome for bad input; any other exception escaping (an
// std::out_of_range from a conversion, a toml++ error not turned into a clear line) is a
// finding, like a crash.
#include <string>

#include "algorithms/optimizers/optimizer.h"
#include "common/config.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    shoal::JobConfig cfg = shoal::ParseJobConfig(text, "fuzz.toml");
    shoal::MakeOptimizer(cfg.optimizer, cfg.optimizer_opts);
  } catch (const shoal::Error&) {
  }
  return 0;
}
