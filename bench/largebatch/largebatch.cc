// The large-batch table (seeds 000-003) on Fashion-MNIST: test accuracy and optimizer steps
// after a fixed number of epochs at global batch 256, 4K, 8K and 16K for momentum SGD, LARS,
// LAMB and STiLL, each with the seeds' recipe (Recipe below). Big batches are simulated
// workers: micro-batches of 256 whose gradients are averaged, then one optimizer step,
// exactly what a synchronous all-reduce of 16, 32 or 64 workers of 256 computes (lenet has
// no batch norm, so the split changes nothing). Under batch-size control ([train]
// batch_schedule; common/batch_schedule.h) each epoch's step takes that epoch's batch and the
// learning rate follows it (LrSchedule), as in a real job.
#include <gflags/gflags.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "algorithms/optimizers/optimizer.h"
#include "common/batch_schedule.h"
#include "common/error.h"
#include "common/int_list.h"
#include "common/json_fields.h"
#include "worker/data/data_loader.h"
#include "worker/data/dataset.h"
#include "worker/engine/backend.h"
#include "worker/engine/model.h"
#include "worker/smoothout.h"

DEFINE_string(model, "lenet", "model from the zoo");
DEFINE_string(batches, "256,4096,8192,16384", "global batch sizes (the last stage's under batch-size control)");
DEFINE_string(optimizers, "momentum,lars,lamb,still", "optimizers");
DEFINE_string(cells, "", "optimizer_batch cells to run, in this order (default: every optimizer x batch)");
DEFINE_int32(epochs, 30, "epochs per run");
DEFINE_int32(micro, 256, "micro-batch (one simulated worker's batch)");
DEFINE_int32(threads, 0, "CPU threads (0: all)");
DEFINE_string(seeds, "42",
              "seeds of the initial weights, the data order and SmoothOut's noise: each cell runs once a seed, and the "
              "table gives the mean (and the standard deviation over seeds, where more than one)");
DEFINE_double(label_smoothing, 0.1, "label smoothing of the loss");
DEFINE_string(set, "",
              "recipe overrides, OPT.KEY=VALUE,... (OPT: an optimizer or *; KEY: an [optimizer] key, or smoothout, "
              "batch_control = 0/1, stages = EPOCH:BATCH/EPOCH:BATCH/... ending at the cell's batch, scaling = "
              "linear/sqrt/a power of the batch)");
DEFINE_string(record, "",
              "JSON-lines file of finished cells: each cell run is appended; a cell it already holds with the same "
              "recipe is not run again and joins the table (the 30-epoch table takes hours: run it in parts)");
DEFINE_bool(list, false, "print each cell's recipe and whether --record holds it, and run nothing");
DEFINE_string(train, "/usr/share/datasets/fashion-mnist/train", "training set prefix");
DEFINE_string(test, "/usr/share/datasets/fashion-mnist/t10k", "test set prefix");

namespace shoal {
namespace {

// A number given on the command line: a shoal::Error naming `what` and the text where it is
// none (std::stod's own error says only "stod", and it reads "0.1x" as 0.1).
double NumberArg(const std::string& text, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  SHOAL_CHECK(!text.empty() && end == text.c_str() + text.size() && errno == 0 && std::isfinite(v),
              what + ": expected a number, got \"" + text + "\"");
  return v;
}

// A batch size or a seed: one integer above 0.
int64_t PositiveArg(const std::string& text, const std::string& what) {
  const auto v = ParseIntList<int64_t>(text, what);
  SHOAL_CHECK(v.size() == 1 && v[0] > 0, what + ": expected a whole number above 0, got \"" + text + "\"");
  return v[0];
}

std::vector<std::string> Split(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, sep))
    if (!x.empty()) out.push_back(x);
  return out;
}

struct Recipe {
  ConfigSection opt{"largebatch", "optimizer"};
  double smoothout = 0;
  std::vector<BatchStage> stages;  // one stage: a constant batch
};

// The seeds' recipe at global batch `batch`: the base lr is for batch 256 and scales
// linearly (JSC, Goyal et al.) for momentum SGD and LAMB; warm-up grows with the batch (NNL
// warms STiLL up over 25 of 90 epochs at 64K); poly decay (power 2) to 0; LARS and STiLL with
// eta 0.001 and momentum 0.9; no weight decay on biases (the model marks them). LARS and STiLL
// scale their lr as batch^0.8 (`scaling = 0.8`): their trust ratio makes the lr a step relative
// to each layer's norm, and linear scaling from the lr best at 256 (2.0) overshoots at 8K
// (lr 64: 0.47 and 0.25 after 8 epochs) while from the 8K's best of those tried (32) it would
// be 1.0 at 256; 2.0 x 32^0.8 = 32 (docs/performance.md, "Large batch"). At 16K, 30 epochs are 90 steps,
// so the batch grows there in stages (Mikami et al.'s batch-size control): 4K, then 8K, then
// 16K, each a third of the epochs, the lr linearly with each stage's batch up to the 16K peak.
// Thirds, not epochs 5 and 10: STiLL at 16K then ends 1.6 points under batch 256, not 2.7.
Recipe RecipeFor(const std::string& name, int64_t batch, const std::map<std::string, std::string>& set) {
  Recipe r;
  ConfigSection& s = r.opt;
  s.Set("base_batch_size", int64_t(256));
  s.Set("momentum", 0.9);
  s.Set("weight_decay", 5e-4);
  s.Set("schedule", std::string("poly"));
  // LARS at 8K warms up as the 16K cells do, 8 of 30 epochs (NNL: 25 of 90): over seeds 43-45 it ended 0.35
  // points above 5 epochs (0.9104 against 0.9069). STiLL needs no more: its LAMB share steadies the first steps.
  const bool long_warmup = batch > 8192 || (name == "lars" && batch == 8192);
  s.Set("warmup_epochs", batch <= 256 ? 1.0 : batch <= 4096 ? 3.0 : long_warmup ? 8.0 : 5.0);
  if (name == "momentum") s.Set("lr", 0.05);
  if (name == "lars" || name == "still") {
    s.Set("lr", 2.0);
    s.Set("trust_coefficient", 0.001);
  }
  std::string scaling = name == "lars" || name == "still" ? "0.8" : "linear";
  if (name == "still") s.Set("lamb_lr_ratio", 0.004);
  if (name == "lamb") {
    s.Set("lr", 0.002);
    s.Set("weight_decay", 0.01);
  }
  // Batch-size control where 30 epochs are too few steps (16K: 90), and for STiLL from 8K, as NNL's
  // recipe has it (there 0.9134 against plain 8K's 0.9095; LARS with the same stages lost 0.13).
  bool control = batch > 8192 || (name == "still" && batch >= 8192);
  std::vector<BatchStage> stages;  // given by --set OPT.stages=EPOCH:BATCH/EPOCH:BATCH/...
  for (auto& [key, value] : set) {
    const size_t dot = key.find('.');
    const std::string who = key.substr(0, dot), what = key.substr(dot + 1);
    if (who != "*" && who != name) continue;
    if (what == "smoothout")
      r.smoothout = NumberArg(value, "--set " + key);
    else if (what == "batch_control")
      control = value == "1";
    else if (what == "stages")
      for (std::string st : Split(value, '/')) {
        // "EPOCH:BATCH" read as the list "EPOCH,BATCH" by the strict integer-list parser.
        std::replace(st.begin(), st.end(), ':', ',');
        const auto v = ParseIntList<int64_t>(st, "--set " + key);
        SHOAL_CHECK(v.size() == 2, "--set " + key + ": stages are EPOCH:BATCH/..., got \"" + value + "\"");
        stages.push_back({v[0], v[1]});
      }
    else if (what == "scaling")
      scaling = value;
    else if (what == "schedule")
      s.Set(what, value);
    else
      s.Set(what, NumberArg(value, "--set " + key));
  }
  // The lr at the batch is lr x (batch / 256)^power; the schedule scales linearly from
  // base_batch_size, so it gets lr x (batch / 256)^(power - 1).
  const double power = scaling == "linear" ? 1.0 : scaling == "sqrt" ? 0.5 : NumberArg(scaling, "--set scaling");
  SHOAL_CHECK(power >= 0 && power <= 1, "--set: scaling is linear, sqrt or a power in [0, 1], got " + scaling);
  s.Set("lr", s.GetDouble("lr", 0, 0, 1e6) * std::pow(double(batch) / 256.0, power - 1.0));
  r.stages = {{0, batch}};
  if (control) {
    const int64_t third = std::max(1, FLAGS_epochs / 3);
    r.stages = {{0, batch / 4}, {third, batch / 2}, {std::max(third + 1, int64_t(2 * FLAGS_epochs / 3)), batch}};
  }
  if (!stages.empty()) {
    SHOAL_CHECK(stages.back().global_batch == batch,
                "--set: the last stage's batch must be the cell's, " + std::to_string(batch));
    r.stages = stages;
  }
  return r;
}

// Everything that decides a cell's result, as one line: a recorded cell counts only while
// the bench would still run it the same way.
std::string RecipeText(const std::string& opt_name, int64_t batch, const Recipe& r, int64_t seed) {
  std::ostringstream t;
  t.precision(12);
  // Seed 42 unnamed: the records made before --seeds existed were all seed 42.
  if (seed != 42) t << "seed=" << seed << " ";
  t << "model=" << FLAGS_model << " epochs=" << FLAGS_epochs << " micro=" << FLAGS_micro
    << " label_smoothing=" << FLAGS_label_smoothing << " optimizer=" << opt_name << " batch=" << batch
    << " smoothout=" << r.smoothout << " stages=";
  for (auto& st : r.stages) t << st.epoch << ":" << st.global_batch << ";";
  for (auto& [key, value] : r.opt.values()) {
    t << " " << key << "=";
    std::visit([&](const auto& v) { t << v; }, value);
  }
  return t.str();
}

// Accuracy of the model on every sample `test` gives, in evaluation mode.
double Evaluate(Model& m, Backend& be, DataLoader& test) {
  test.StartEpoch(0);
  Batch b;
  int64_t correct = 0, n = 0;
  Tensor x;
  while (test.Next(&b)) {
    Shape s = {b.n};
    for (auto d : test.dataset().sample_shape()) s.push_back(d);
    if (!x.defined() || x.shape() != s) x = be.Empty(s);
    be.CopyFromHost(x, b.images.data());
    correct += m.EvalStep(x, b.labels.data()).correct;
    n += b.n;
  }
  return double(correct) / double(n);
}

struct Cell {
  double accuracy = 0;
  int64_t steps = 0;
  // On the whole training set, after the last step: beside the test figure, it tells a cell that did not fit its
  // training data (too few steps) from one that fit it and generalizes worse. -1: not measured (the cells
  // recorded before 2026-11-27).
  double train_accuracy = -1;
};

// One optimizer at one (final) global batch, from the same initial weights and data order.
Cell Run(const std::string& opt_name, int64_t B, const Recipe& recipe, int64_t seed, Backend& be,
         std::shared_ptr<Dataset> train, DataLoader& test, DataLoader& train_whole) {
  ModelOptions mo;
  mo.input_shape = train->sample_shape();
  mo.num_classes = train->num_classes();
  mo.label_smoothing = float(FLAGS_label_smoothing);
  auto model = MakeModel(FLAGS_model, be, mo);
  model->InitParameters(uint64_t(seed));
  DataLoaderOptions lo;
  lo.batch_size = FLAGS_micro;
  lo.seed = uint64_t(seed);
  DataLoader loader(train, lo);
  for (auto& st : recipe.stages)
    SHOAL_CHECK(st.global_batch % FLAGS_micro == 0, "batch " + std::to_string(st.global_batch) +
                                                        " is not a multiple of the micro-batch " +
                                                        std::to_string(FLAGS_micro));
  const BatchSchedule batches(recipe.stages, train->size());
  const int64_t total = batches.FirstStepOfEpoch(FLAGS_epochs);
  auto opt = MakeOptimizer(opt_name, recipe.opt);
  const LrSchedule sched = LrSchedule::FromConfig(recipe.opt, batches, total);
  SmoothOut smoothout(recipe.smoothout, uint64_t(seed));
  std::vector<OptimizerState> states(model->parameters().size());
  auto t0 = std::chrono::steady_clock::now();
  int64_t step = 0;
  Tensor x;
  Batch b;
  for (int e = 0; e < FLAGS_epochs; ++e) {
    const int64_t k = batches.BatchOfEpoch(e) / FLAGS_micro;
    loader.StartEpoch(e);
    for (int64_t s = 0; s < batches.StepsInEpoch(e); ++s) {
      model->ZeroGrad();
      smoothout.Perturb(*model, step);   // one noise for the whole step, as on every worker
      for (int64_t j = 0; j < k; ++j) {  // one micro-batch per simulated worker
        SHOAL_CHECK(loader.Next(&b), "the loader ran out of micro-batches");
        Shape sh = {b.n};
        for (auto d : train->sample_shape()) sh.push_back(d);
        if (!x.defined() || x.shape() != sh) x = be.Empty(sh);
        be.CopyFromHost(x, b.images.data());
        model->TrainStep(x, b.labels.data());
      }
      smoothout.Restore(*model);
      StepContext c;
      c.lr = float(sched.At(step));
      c.step = step;
      c.warmup_steps = sched.options().warmup_steps;
      auto& ps = model->parameters();
      for (size_t i = 0; i < ps.size(); ++i) {
        float* g = ps[i].grad.data<float>();
        int64_t n = ps[i].grad.numel();
        for (int64_t t = 0; t < n; ++t) g[t] /= float(k);  // mean over simulated workers
        opt->Apply(ps[i].value.data<float>(), g, n, !ps[i].no_weight_decay, c, &states[i]);
      }
      ++step;
    }
  }
  Cell cell{Evaluate(*model, be, test), step, Evaluate(*model, be, train_whole)};
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string stages;
  for (auto& st : recipe.stages)
    stages += (stages.empty() ? "" : ",") + std::to_string(st.epoch) + ":" + std::to_string(st.global_batch);
  printf(
      "%-9s batch %5lld seed %lld: %4lld steps, stages %s, peak lr %.4g, warm-up %lld steps, smoothout %g, test "
      "accuracy %.4f, training-set accuracy %.4f (%.0f s)\n",
      opt_name.c_str(), (long long)B, (long long)seed, (long long)step, stages.c_str(), sched.peak_lr(),
      (long long)sched.options().warmup_steps, recipe.smoothout, cell.accuracy, cell.train_accuracy, secs);
  fflush(stdout);
  return cell;
}

int Main() {
  auto be = MakeCpuBackend(FLAGS_threads);
  std::shared_ptr<Dataset> train = LoadDataset("idx", FLAGS_train, {});
  auto test = LoadDataset("idx", FLAGS_test, {});
  test->UseNormalizationOf(*train);
  DataLoaderOptions to;
  to.batch_size = 1000;
  to.shuffle = false;
  to.drop_last = false;
  DataLoader test_loader(test, to);
  DataLoader train_whole(train, to);
  std::map<std::string, std::string> set;
  for (auto& kv : Split(FLAGS_set)) {
    const size_t eq = kv.find('='), dot = kv.find('.');
    SHOAL_CHECK(eq != std::string::npos && dot < eq, "--set: expected OPT.KEY=VALUE, got \"" + kv + "\"");
    set[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  auto batches = Split(FLAGS_batches);
  auto opts = Split(FLAGS_optimizers);
  std::vector<std::pair<std::string, int64_t>> cells;
  if (FLAGS_cells.empty()) {
    for (auto& o : opts)
      for (auto& bs : batches) cells.push_back({o, PositiveArg(bs, "--batches")});
  } else {
    for (auto& c : Split(FLAGS_cells)) {
      const size_t u = c.rfind('_');
      SHOAL_CHECK(u != std::string::npos, "--cells: expected OPTIMIZER_BATCH, got \"" + c + "\"");
      cells.push_back({c.substr(0, u), PositiveArg(c.substr(u + 1), "--cells " + c)});
    }
  }
  // Cells already in the record, by recipe.
  std::map<std::string, Cell> recorded;
  if (!FLAGS_record.empty()) {
    std::ifstream in(FLAGS_record);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      auto recipe = JsonField(line, "recipe");
      auto accuracy = JsonNumber(line, "test_accuracy"), steps = JsonNumber(line, "steps");
      SHOAL_CHECK(recipe && accuracy && steps, FLAGS_record + ":" + std::to_string(n) +
                                                   ": expected a cell's \"recipe\", \"test_accuracy\" and \"steps\"");
      const auto train_accuracy = JsonNumber(line, "train_accuracy");
      recorded[*recipe] = Cell{*accuracy, int64_t(*steps), train_accuracy ? *train_accuracy : -1};
    }
  }
  std::vector<int64_t> seeds;
  std::string seed_list;  // as JSON numbers
  for (auto& t : Split(FLAGS_seeds)) {
    seeds.push_back(PositiveArg(t, "--seeds"));
    seed_list += (seed_list.empty() ? "" : ",") + std::to_string(seeds.back());
  }
  SHOAL_CHECK(!seeds.empty(), "--seeds: expected at least one seed");
  std::map<std::pair<std::string, int64_t>, std::vector<Cell>> result;  // a cell's runs, one a seed
  for (auto& [o, B] : cells) {
    const Recipe recipe = RecipeFor(o, B, set);
    for (int64_t seed : seeds) {
      const std::string text = RecipeText(o, B, recipe, seed);
      auto it = recorded.find(text);
      if (FLAGS_list) {
        printf("%s_%lld: %s%s\n", o.c_str(), (long long)B, text.c_str(), it == recorded.end() ? "" : " (recorded)");
        continue;
      }
      if (it != recorded.end()) {
        printf("%-9s batch %5lld seed %lld: recorded in %s, test accuracy %.4f\n", o.c_str(), (long long)B,
               (long long)seed, FLAGS_record.c_str(), it->second.accuracy);
        result[{o, B}].push_back(it->second);
        continue;
      }
      const Cell cell = Run(o, B, recipe, seed, *be, train, test_loader, train_whole);
      result[{o, B}].push_back(cell);
      if (!FLAGS_record.empty()) {
        std::ofstream out(FLAGS_record, std::ios::app);
        // Compact, as metrics.jsonl: JsonField reads "key":value.
        out << "{\"cell\":\"" << o << "_" << B << "\",\"recipe\":\"" << text << "\",\"test_accuracy\":" << cell.accuracy
            << ",\"steps\":" << cell.steps << ",\"train_accuracy\":" << cell.train_accuracy << "}\n";
        SHOAL_CHECK(out.good(), "--record: could not append to " + FLAGS_record);
      }
    }
  }
  if (FLAGS_list) return 0;

  // Per cell over its seeds: the mean accuracy, the sample standard deviation (0 for one seed) and the steps
  // (the same for every seed: they follow from the batches alone).
  struct Summary {
    double mean = 0, sd = 0;
    int64_t steps = 0;
    double train_mean = -1;  // over the seeds that measured it; -1: none did
  };
  std::map<std::pair<std::string, int64_t>, Summary> summary;
  for (auto& [key, runs] : result) {
    Summary& m = summary[key];
    for (auto& c : runs) m.mean += c.accuracy / double(runs.size());
    for (auto& c : runs) m.sd += (c.accuracy - m.mean) * (c.accuracy - m.mean);
    m.sd = runs.size() > 1 ? std::sqrt(m.sd / double(runs.size() - 1)) : 0;
    m.steps = runs.front().steps;
    int measured = 0;
    double train_sum = 0;
    for (auto& c : runs)
      if (c.train_accuracy >= 0) train_sum += c.train_accuracy, ++measured;
    if (measured > 0) m.train_mean = train_sum / measured;
  }
  const bool several = seeds.size() > 1;
  // The table: rows optimizers, columns batches, each cell accuracy (steps), and the difference
  // from its optimizer's batch-256 accuracy where both ran.
  if (several) printf("\nmean test accuracy over seeds %s (+- the standard deviation over seeds)", seed_list.c_str());
  printf("\n| optimizer |");
  for (auto& bs : batches) printf(" batch %s |", bs.c_str());
  printf("\n|---|");
  for (size_t i = 0; i < batches.size(); ++i) printf("---|");
  printf("\n");
  for (auto& o : opts) {
    printf("| %s |", o.c_str());
    for (auto& bs : batches) {
      auto it = summary.find({o, PositiveArg(bs, "--batches")});
      auto base = summary.find({o, 256});
      if (it == summary.end()) {
        printf(" - |");
        continue;
      }
      printf(" %.4f", it->second.mean);
      if (several) printf(" +- %.4f", it->second.sd);
      printf(" (%lld steps", (long long)it->second.steps);
      if (base != summary.end() && it != base) printf(", %+.2f pt vs 256", 100 * (it->second.mean - base->second.mean));
      printf(") |");
    }
    printf("\n");
  }
  printf("{\"bench\": \"largebatch\", \"model\": \"%s\", \"epochs\": %d, \"seeds\": [%s], \"results\": {",
         FLAGS_model.c_str(), FLAGS_epochs, seed_list.c_str());
  bool first = true;
  for (auto& [key, m] : summary) {
    printf("%s\"%s_%lld\": {\"test_accuracy\": %.4f, ", first ? "" : ", ", key.first.c_str(), (long long)key.second,
           m.mean);
    if (several) printf("\"test_accuracy_sd\": %.4f, ", m.sd);
    if (m.train_mean >= 0) printf("\"train_accuracy\": %.4f, ", m.train_mean);
    printf("\"steps\": %lld}", (long long)m.steps);
    first = false;
  }
  printf("}}\n");
  return 0;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  try {
    return shoal::Main();
  } catch (const std::exception& e) {
    fprintf(stderr, "largebatch: %s\n", e.what());
    return 2;
  }
}
