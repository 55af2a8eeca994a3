// "local": one worker, no communication; the optimizer runs in place. The baseline every
// distributed algorithm is compared against.
#include "algorithms/algorithm.h"

namespace shoal {
namespace {

class Local : public Algorithm {
 public:
  explicit Local(const AlgorithmEnv& env) : updater_(env) {}
  std::string Name() const override { return "local"; }
  void Step(const std::vector<ParamView>& params, const StepInfo& info) override { updater_.Apply(params, info.step); }
  int64_t skipped_steps() const override { return updater_.skipped(); }
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    updater_.Save(params, "opt/", out);
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    updater_.Load(params, "opt/", in);
  }

 private:
  LocalUpdater updater_;
};

const bool kRegistered =
    RegisterAlgorithm("local", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new Local(env)); });

}  // namespace
}  // namespace shoal
