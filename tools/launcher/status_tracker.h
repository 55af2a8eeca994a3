// What `shoal run` knows about its job, built only from the events the job's processes
// append to metrics.jsonl, so it works the same for every kind of job (collective or
// parameter-server): the progress line, one row per worker (throughput and where its time
// goes), the loss and accuracy curves, and the stragglers.
//
// A straggler is a worker whose time per step outside the exchange (compute plus waiting
// for data, from the cumulative compute_s / wait_s of its train events), or whose wall time
// per step, exceeds the median of the other workers' (running or finished, not failed) by
// [job] straggler_ratio in two windows in a row; a window spans train events over at least
// 0.5 s (one holding the worker's evaluation is skipped), and the figures are smoothed over
// windows; nobody is judged before every worker has a window. It stops being one after two
// windows below halfway between 1 and the ratio.
// Outside the exchange, because in a synchronous job everyone's step takes as long as the
// slowest's: the fast workers spend the difference waiting inside the exchange.
//
// Not thread-safe: the launcher's loop owns it; the status server gets Json() snapshots.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"

namespace shoal {

// A worker became a straggler (or stopped being one).
struct StragglerChange {
  int rank = 0;
  std::string host, device;
  bool straggler = true;
  double slower = 0;             // its time per step / the other workers' median
  int64_t since_step = 0;        // the step where the slow (or recovered) stretch began
  double since_wall_s = 0;       // seconds since the job started, at since_step
  int64_t step = 0;              // the step at which it was decided
  std::string Describe() const;  // one console line
};

class StatusTracker {
 public:
  explicit StatusTracker(const JobConfig& cfg);

  // One metrics.jsonl line (any event; unknown or malformed lines are ignored).
  void Consume(const std::string& line);
  // A worker whose process ended (`failed`: not by finishing): no evaluation is awaited
  // from it any more, and a failed one's throughput no longer counts.
  void WorkerGone(int rank, bool failed);
  // That worker's process was started again alone (the others went on): it counts as live
  // again, its throughput measured afresh.
  void WorkerRestarted(int rank);
  // Forget the per-process baselines (a restart starts every counter again).
  void Restarted();

  // Straggler changes since the last call, oldest first.
  std::vector<StragglerChange> TakeStragglerChanges();
  // The progress line for an evaluation once every live worker reported it (or a later
  // evaluation began, or `force`): one line per evaluated step value, never one per worker.
  std::optional<std::string> TakeEvalLine(double now_s, bool force = false);
  // The current progress line ("epoch 2 step 700 loss ... [12 s]") at `step` (default: the
  // newest step any worker logged).
  std::string ProgressLine(double now_s, double step = -1) const;
  double step() const { return step_; }
  // The newest step a log may show between evaluations without ever naming a step that an
  // evaluation line will name too: one some worker has logged and gone past without
  // evaluating there; -1 when there is none.
  int64_t SettledStep() const;

  // The status page's data (see docs/cluster-security.md, "Status page"); `state` is running | restarting |
  // done | failed | stopped.
  std::string Json(double now_s, const std::string& state, int restarts) const;

  // Series for plot.png.
  const std::vector<std::pair<double, double>>& loss_curve() const { return loss_curve_; }
  const std::vector<std::pair<double, double>>& accuracy_curve() const { return acc_curve_; }

 private:
  struct Worker {
    int64_t batch_size = 0;
    int64_t last_train_step = -1, prev_train_step = -1, last_eval_step = -1;
    double samples_per_s = 0, loss = NAN, step = 0, bytes_sent = 0;
    double loss_scale = NAN, skipped_steps = 0;  // the loss scaler's (worker/loss_scaler.h)
    double data_skipped = 0;                     // [data] skip_bad: bad samples skipped
    bool ended = false, gone = false, failed = false;
    // The previous train event's cumulative counters: the window's start.
    bool have_base = false;
    int64_t base_step = 0;
    double base_busy = 0, base_comm = 0, base_compute = 0, base_wait = 0, base_wall = 0;
    // The last window, per step (seconds); own = compute + wait (outside the exchange).
    bool measured = false;
    double compute = 0, exchange = 0, wait = 0, own = 0, wall = 0;
    bool unjudged = false;     // the last window waits for the others' (JudgeRound)
    int64_t window_start = 0;  // the last window's first step and wall_s (base_* move on before a round)
    double window_start_wall = 0;
    double slower = 0;
    int slow_windows = 0, fast_windows = 0;
    int64_t streak_step = 0;
    double streak_wall = 0;
    bool straggler = false;
    int64_t straggler_since_step = 0;
    double straggler_since_wall = 0;
  };

  void OnTrain(int rank, const std::string& line);
  void OnEval(int rank, const std::string& line);
  void JudgeRound();
  void Judge(int rank);  // its window from window_start
  void FlushEval(int64_t step);
  // " skipped_steps N" (the most any worker skipped) when some worker skipped a step, else "".
  std::string SkippedNote() const;
  Worker& At(int rank);

  const JobConfig cfg_;
  std::map<int, Worker> workers_;
  double epoch_ = 0, step_ = 0, loss_ = NAN, acc_ = NAN, staleness_ = NAN;
  std::vector<std::pair<double, double>> loss_curve_, acc_curve_;
  std::map<int64_t, std::map<int, double>> pending_evals_;  // step -> rank -> accuracy
  std::map<int64_t, double> pending_eval_wall_, pending_eval_epoch_;
  double pending_since_ = 0;
  std::optional<std::string> TakeFinalLine(double now_s, bool force);
  // The final model's evaluation (a `final` eval event; rank 0's, else the first), shown
  // as the last progress line once every epoch's line is out and the workers ended: the
  // done line's accuracy is the figure the last progress line shows.
  bool final_pending_ = false;
  int final_rank_ = -1;
  int64_t final_step_ = 0;
  double final_acc_ = NAN;
  std::vector<std::string> eval_lines_;
  int64_t last_eval_step_printed_ = -1;
  std::vector<StragglerChange> changes_, straggler_log_;
  std::string auto_event_;  // the last `auto` event, verbatim (its fields shown as they are)
  int64_t checkpoint_id_ = 0, checkpoint_step_ = 0;
  double checkpoint_wall_ = NAN;
};

}  // namespace shoal
