#include "tools/launcher/status_tracker.h"

#include <algorithm>
#include <cstdio>

#include "common/json_fields.h"
#include "common/metrics.h"

namespace shoal {
namespace {

// At most this many points per curve: older points are thinned (every other one dropped),
// so a long job's status stays small and its curves keep their whole span.
constexpr size_t kMaxCurvePoints = 2000;
// A window shorter than this (wall time) is extended to the next train event instead of
// judged: a few steps of a few milliseconds on shared cores say more about the neighbours
// than about the worker.
constexpr double kMinWindowS = 0.5;
// A pending evaluation is printed anyway after this long (a worker that never evaluates
// that step must not hold the line back forever).
constexpr double kEvalWaitS = 10;

std::string Fmt(const char* f, double v) {
  if (std::isnan(v)) return "-";
  char b[64];
  snprintf(b, sizeof b, f, v);
  return b;
}

std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  char b[32];
  snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::string Str(const std::string& s) { return "\"" + JsonEscape(s) + "\""; }

void AddPoint(std::vector<std::pair<double, double>>* curve, double x, double y) {
  if (std::isnan(y)) return;
  curve->emplace_back(x, y);
  if (curve->size() <= kMaxCurvePoints) return;
  std::vector<std::pair<double, double>> thin;
  for (size_t i = 0; i < curve->size(); i += 2) thin.push_back((*curve)[i]);
  if (thin.back() != curve->back()) thin.push_back(curve->back());
  curve->swap(thin);
}

std::string Curve(const std::vector<std::pair<double, double>>& c) {
  std::string s = "[";
  for (size_t i = 0; i < c.size(); ++i) s += (i ? ",[" : "[") + Num(c[i].first) + "," + Num(c[i].second) + "]";
  return s + "]";
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::string StragglerChange::Describe() const {
  char b[320];
  if (straggler)
    snprintf(b, sizeof b,
             "worker %d (%s, %s) is a straggler: %.1fx slower per step than the other workers since step %lld", rank,
             host.c_str(), device.c_str(), slower, (long long)since_step);
  else
    snprintf(b, sizeof b, "worker %d (%s, %s) keeps up again since step %lld (%.1fx the other workers' time per step)",
             rank, host.c_str(), device.c_str(), (long long)since_step, slower);
  return b;
}

StatusTracker::StatusTracker(const JobConfig& cfg) : cfg_(cfg) {
  for (int r = 0; r < cfg_.world_size(); ++r) At(r).batch_size = cfg_.batch_size;
}

StatusTracker::Worker& StatusTracker::At(int rank) { return workers_[rank]; }

void StatusTracker::Consume(const std::string& line) {
  auto ev = JsonField(line, "event");
  if (!ev) return;
  int rank = int(JsonNumber(line, "rank").value_or(0));
  // Ranks come from our own processes, but a stray line must not grow the table without
  // bound or index outside the job.
  if (rank < 0 || rank >= std::max(1, cfg_.world_size())) return;
  if (*ev == "train") {
    OnTrain(rank, line);
  } else if (*ev == "eval") {
    OnEval(rank, line);
  } else if (*ev == "end") {
    At(rank).ended = true;
    At(rank).bytes_sent = JsonNumber(line, "bytes_sent").value_or(At(rank).bytes_sent);
  } else if (*ev == "checkpoint") {
    checkpoint_id_ = int64_t(JsonNumber(line, "id").value_or(double(checkpoint_id_)));
    checkpoint_step_ = int64_t(JsonNumber(line, "step").value_or(0));
    checkpoint_wall_ = JsonNumber(line, "wall_s").value_or(NAN);
  } else if (*ev == "auto") {
    // Shown field by field; kept only when it is one whole object (embedded as is).
    if (line.size() > 1 && line.front() == '{' && line.back() == '}' && line.size() < 8192) auto_event_ = line;
  }
}

void StatusTracker::OnTrain(int rank, const std::string& line) {
  Worker& w = At(rank);
  const double step = JsonNumber(line, "step").value_or(0), wall = JsonNumber(line, "wall_s").value_or(0);
  epoch_ = JsonNumber(line, "epoch").value_or(epoch_);
  step_ = std::max(step_, step);
  loss_ = JsonNumber(line, "loss").value_or(loss_);
  staleness_ = JsonNumber(line, "staleness").value_or(staleness_);
  w.loss = JsonNumber(line, "loss").value_or(w.loss);
  w.samples_per_s = JsonNumber(line, "samples_per_s").value_or(0);
  w.bytes_sent = JsonNumber(line, "bytes_sent").value_or(w.bytes_sent);
  w.batch_size = int64_t(JsonNumber(line, "batch_size").value_or(double(w.batch_size)));
  w.loss_scale = JsonNumber(line, "loss_scale").value_or(w.loss_scale);
  w.skipped_steps = JsonNumber(line, "skipped_steps").value_or(w.skipped_steps);
  w.data_skipped = JsonNumber(line, "data_skipped").value_or(w.data_skipped);
  w.step = step;
  w.prev_train_step = w.last_train_step;
  w.last_train_step = int64_t(step);
  w.gone = w.ended = w.failed = false;
  // The loss curve follows the lowest-ranked worker still running: rank 0, unless it was lost
  // (an elastic diloco job goes on without it).
  bool lowest_running = true;
  for (auto& [r, other] : workers_) lowest_running = lowest_running && (r >= rank || other.gone);
  if (lowest_running) AddPoint(&loss_curve_, wall, JsonNumber(line, "loss").value_or(NAN));

  const double compute = JsonNumber(line, "compute_s").value_or(0), comm = JsonNumber(line, "comm_s").value_or(0),
               wait = JsonNumber(line, "wait_s").value_or(0);
  const double busy = compute + wait;
  // Counters only grow within one process: a smaller step or counter is a new process
  // (restart, resume), whose first event is only the next window's start.
  const bool fresh_process = !w.have_base || int64_t(step) <= w.base_step || busy < w.base_busy || comm < w.base_comm;
  if (!fresh_process && wall - w.base_wall < kMinWindowS) return;  // the window goes on
  if (!fresh_process) {
    const double n = double(int64_t(step) - w.base_step);
    w.compute = (compute - w.base_compute) / n;
    w.wait = (wait - w.base_wait) / n;
    w.exchange = (comm - w.base_comm) / n;
    // Smoothed over windows (half weight to the newest): one noisy window on a shared
    // machine must not name or clear a straggler by itself.
    const double own = (busy - w.base_busy) / n, per_step = (wall - w.base_wall) / n;
    // A window holding this worker's evaluation (after the train event of its step), the
    // agreement to stop and a new epoch's first batch is not judged: the workers' windows
    // begin at different steps, so only some of them would carry that time.
    const bool evaluated = w.last_eval_step >= w.base_step && w.last_eval_step < int64_t(step);
    if (!evaluated) {
      w.own = w.measured ? 0.5 * (w.own + own) : own;
      w.wall = w.measured ? 0.5 * (w.wall + per_step) : per_step;
      w.measured = true;
      w.unjudged = true;
      w.window_start = w.base_step;
      w.window_start_wall = w.base_wall;
      JudgeRound();
    }
  }
  w.have_base = true;
  w.base_step = int64_t(step);
  w.base_busy = busy;
  w.base_comm = comm;
  w.base_compute = compute;
  w.base_wait = wait;
  w.base_wall = wall;
}

// Judges every worker once each running worker has a window since the last round. A window
// judged against the others' previous ones compares different stretches of time: in a
// synchronous job, the worker that reports first saw a slowdown of the whole machine that
// the others' last windows did not, and was named for it.
void StatusTracker::JudgeRound() {
  // "Slower than the rest" needs the rest: no judgement before every worker that has not
  // failed has a window (one starting late would otherwise leave a lone reference).
  for (int r = 0; r < cfg_.world_size(); ++r) {
    const Worker& w = At(r);
    if (!w.measured && !w.failed) return;
    if (!w.unjudged && !w.failed && !w.gone && !w.ended) return;
  }
  for (auto& [r, w] : workers_)
    if (w.unjudged) {
      w.unjudged = false;
      Judge(r);
    }
}

// Compares `rank`'s last window with the other live workers' last windows.
void StatusTracker::Judge(int rank) {
  Worker& w = At(rank);
  std::vector<double> own, wall;
  // Workers that finished still show how fast a step goes (an asynchronous job's fast
  // workers end first); failed ones do not.
  for (auto& [r, o] : workers_)
    if (r != rank && o.measured && !o.failed) {
      own.push_back(o.own);
      wall.push_back(o.wall);
    }
  if (own.empty()) return;
  const double mo = Median(own), mw = Median(wall);
  w.slower = std::max(mo > 0 ? w.own / mo : 1.0, mw > 0 ? w.wall / mw : 1.0);
  // Hysteresis: named above the ratio, cleared only below halfway between 1 and it.
  const bool slow = w.straggler ? w.slower > 1 + 0.5 * (cfg_.straggler_ratio - 1) : w.slower > cfg_.straggler_ratio;
  int& streak = slow ? w.slow_windows : w.fast_windows;
  (slow ? w.fast_windows : w.slow_windows) = 0;
  if (++streak == 1) {
    w.streak_step = w.window_start;
    w.streak_wall = w.window_start_wall;
  }
  if (streak < 2 || slow == w.straggler) return;
  w.straggler = slow;
  w.straggler_since_step = w.streak_step;
  w.straggler_since_wall = w.streak_wall;
  StragglerChange c;
  c.rank = rank;
  c.host = cfg_.workers[size_t(rank)].host;
  c.device = cfg_.workers[size_t(rank)].device;
  c.straggler = slow;
  c.slower = w.slower;
  c.since_step = w.streak_step;
  c.since_wall_s = w.streak_wall;
  c.step = int64_t(w.step);
  changes_.push_back(c);
  straggler_log_.push_back(c);
  if (straggler_log_.size() > 100) straggler_log_.erase(straggler_log_.begin());
}

void StatusTracker::OnEval(int rank, const std::string& line) {
  const double acc = JsonNumber(line, "test_accuracy").value_or(NAN);
  At(rank).bytes_sent = JsonNumber(line, "bytes_sent").value_or(At(rank).bytes_sent);
  // The final model's evaluation is the done line's business, not a progress line.
  if (JsonField(line, "final").value_or("") == "true") {
    if (std::isnan(acc) || (final_rank_ >= 0 && rank != 0)) return;
    final_pending_ = true;
    final_rank_ = rank;
    final_acc_ = acc;
    final_step_ = int64_t(JsonNumber(line, "step").value_or(0));
    return;
  }
  const int64_t step = int64_t(JsonNumber(line, "step").value_or(0));
  At(rank).last_eval_step = step;
  if (step <= last_eval_step_printed_) return;      // a restarted worker re-evaluating: already shown
  if (pending_evals_.empty()) pending_since_ = -1;  // set by the next TakeEvalLine
  pending_evals_[step][rank] = acc;
  pending_eval_wall_[step] = std::max(pending_eval_wall_[step], JsonNumber(line, "wall_s").value_or(0));
  pending_eval_epoch_[step] = JsonNumber(line, "epoch").value_or(epoch_);
}

void StatusTracker::WorkerGone(int rank, bool failed) {
  if (rank < 0 || rank >= cfg_.world_size()) return;
  At(rank).gone = true;
  At(rank).failed = failed;
}

void StatusTracker::Restarted() {
  for (auto& [r, w] : workers_) WorkerRestarted(r);
}

void StatusTracker::WorkerRestarted(int rank) {
  if (rank < 0 || rank >= cfg_.world_size()) return;
  Worker& w = At(rank);
  w.have_base = w.measured = w.unjudged = false;
  w.slow_windows = w.fast_windows = 0;
  w.gone = w.ended = w.failed = false;
}

std::vector<StragglerChange> StatusTracker::TakeStragglerChanges() {
  std::vector<StragglerChange> out;
  out.swap(changes_);
  return out;
}

std::optional<std::string> StatusTracker::TakeEvalLine(double now_s, bool force) {
  if (pending_evals_.empty()) return TakeFinalLine(now_s, force);
  if (pending_since_ < 0) pending_since_ = now_s;
  auto first = pending_evals_.begin();
  int expected = 0, have = 0;
  for (int r = 0; r < cfg_.world_size(); ++r) {
    const Worker& w = At(r);
    if (w.gone || w.ended) continue;
    ++expected;
    have += first->second.count(r) > 0;
  }
  const bool complete = have >= expected, later = pending_evals_.size() > 1;
  if (!complete && !later && !force && now_s - pending_since_ < kEvalWaitS) return std::nullopt;
  const int64_t step = first->first;
  // Rank 0's accuracy (the done line's), else the mean; the spread when workers differ
  // (asynchronous algorithms: each evaluates its own model).
  double lo = 1e300, hi = -1e300, sum = 0;
  for (auto& [r, a] : first->second) {
    lo = std::min(lo, a);
    hi = std::max(hi, a);
    sum += a;
  }
  const double acc = first->second.count(0) ? first->second.at(0) : sum / double(first->second.size());
  acc_ = acc;
  AddPoint(&acc_curve_, pending_eval_wall_[step], acc);
  double sps = 0;
  for (auto& [r, w] : workers_) sps += w.failed ? 0 : w.samples_per_s;
  std::string line =
      "epoch " + Fmt("%.0f", pending_eval_epoch_[step]) + " step " + std::to_string(step) + " loss " +
      Fmt("%.4f", loss_) + " test_acc " + Fmt("%.4f", acc) +
      (first->second.size() > 1 && hi - lo >= 5e-5 ? " (workers " + Fmt("%.4f", lo) + "-" + Fmt("%.4f", hi) + ")"
                                                   : "") +
      " samples/s " + Fmt("%.0f", sps) + SkippedNote() + " [" + Fmt("%.0f", now_s) + " s]";
  last_eval_step_printed_ = step;
  pending_evals_.erase(first);
  pending_eval_wall_.erase(step);
  pending_eval_epoch_.erase(step);
  pending_since_ = pending_evals_.empty() ? 0 : -1;
  return line;
}

std::optional<std::string> StatusTracker::TakeFinalLine(double now_s, bool force) {
  if (!final_pending_) return std::nullopt;
  // Rank 0's figure is the done line's: wait for its end (or the job's) unless it is here.
  if (!force && final_rank_ != 0)
    for (auto& [r, w] : workers_)
      if (!w.gone && !w.ended) return std::nullopt;
  final_pending_ = false;
  acc_ = final_acc_;
  AddPoint(&acc_curve_, now_s, acc_);
  return "final model step " + std::to_string(std::max<int64_t>(final_step_, int64_t(step_))) + " test_acc " +
         Fmt("%.4f", acc_) + " [" + Fmt("%.0f", now_s) + " s]";
}

int64_t StatusTracker::SettledStep() const {
  int64_t settled = -1;
  for (auto& [r, w] : workers_)
    if (w.prev_train_step >= 0 && w.last_train_step > w.prev_train_step && w.last_eval_step != w.prev_train_step)
      settled = std::max(settled, w.prev_train_step);
  // Another worker may still evaluate there (asynchronous jobs), or already did.
  if (settled <= last_eval_step_printed_ || pending_evals_.count(settled)) return -1;
  return settled;
}

std::string StatusTracker::ProgressLine(double now_s, double step) const {
  double sps = 0;
  for (auto& [r, w] : workers_) sps += w.failed ? 0 : w.samples_per_s;
  return "epoch " + Fmt("%.0f", epoch_) + " step " + Fmt("%.0f", step >= 0 ? step : step_) + " loss " +
         Fmt("%.4f", loss_) + " test_acc " + Fmt("%.4f", acc_) + " samples/s " + Fmt("%.0f", sps) +
         (std::isnan(staleness_) ? "" : " staleness " + Fmt("%.1f", staleness_)) + SkippedNote() + " [" +
         Fmt("%.0f", now_s) + " s]";
}

std::string StatusTracker::SkippedNote() const {
  double most = 0;
  for (auto& [r, w] : workers_) most = std::max(most, w.skipped_steps);
  return most > 0 ? " skipped_steps " + Fmt("%.0f", most) : "";
}

std::string StatusTracker::Json(double now_s, const std::string& state, int restarts) const {
  double sps = 0, bytes = 0;
  for (auto& [r, w] : workers_) {
    sps += w.failed ? 0 : w.samples_per_s;
    bytes += w.bytes_sent;
  }
  std::string s = "{\"job\":" + Str(cfg_.name) + ",\"algorithm\":" + Str(cfg_.algorithm) + ",\"state\":" + Str(state) +
                  ",\"wall_s\":" + Num(now_s) + ",\"restarts\":" + std::to_string(restarts) +
                  ",\"epoch\":" + Num(epoch_) + ",\"step\":" + Num(step_) + ",\"loss\":" + Num(loss_) +
                  ",\"test_accuracy\":" + Num(acc_) + ",\"samples_per_s\":" + Num(sps) +
                  ",\"bytes_sent\":" + Num(bytes) + ",\"straggler_ratio\":" + Num(cfg_.straggler_ratio);
  s += ",\"auto\":" + (auto_event_.empty() ? std::string("null") : auto_event_);
  s += ",\"checkpoint\":" + (checkpoint_id_ > 0 ? "{\"id\":" + std::to_string(checkpoint_id_) +
                                                      ",\"step\":" + std::to_string(checkpoint_step_) +
                                                      ",\"wall_s\":" + Num(checkpoint_wall_) + "}"
                                                : std::string("null"));
  s += ",\"workers\":[";
  for (int r = 0; r < cfg_.world_size(); ++r) {
    auto it = workers_.find(r);
    const Worker w = it == workers_.end() ? Worker() : it->second;
    const WorkerSpec& spec = cfg_.workers[size_t(r)];
    const char* st = w.failed ? "failed" : w.ended || w.gone ? "ended" : w.step > 0 ? "training" : "starting";
    s += std::string(r ? "," : "") + "{\"rank\":" + std::to_string(r) + ",\"host\":" + Str(spec.host) +
         ",\"device\":" + Str(spec.device) + ",\"batch_size\":" + std::to_string(w.batch_size) +
         ",\"state\":" + Str(st) + ",\"step\":" + Num(w.step) + ",\"loss\":" + Num(w.loss) +
         ",\"samples_per_s\":" + Num(w.samples_per_s) + ",\"bytes_sent\":" + Num(w.bytes_sent) +
         ",\"loss_scale\":" + Num(w.loss_scale) + ",\"skipped_steps\":" + Num(w.skipped_steps) +
         ",\"data_skipped\":" + Num(w.data_skipped);
    if (w.measured)
      s += ",\"compute_ms\":" + Num(1e3 * w.compute) + ",\"exchange_ms\":" + Num(1e3 * w.exchange) +
           ",\"wait_ms\":" + Num(1e3 * w.wait) + ",\"step_ms\":" + Num(1e3 * w.wall) + ",\"slower\":" + Num(w.slower);
    else
      s += ",\"compute_ms\":null,\"exchange_ms\":null,\"wait_ms\":null,\"step_ms\":null,\"slower\":null";
    s += ",\"straggler\":" + std::string(w.straggler ? "true" : "false");
    if (w.straggler)
      s += ",\"straggler_since_step\":" + std::to_string(w.straggler_since_step) +
           ",\"straggler_since_wall_s\":" + Num(w.straggler_since_wall);
    s += "}";
  }
  s += "],\"stragglers\":[";
  for (size_t i = 0; i < straggler_log_.size(); ++i) {
    const StragglerChange& c = straggler_log_[i];
    s += std::string(i ? "," : "") + "{\"rank\":" + std::to_string(c.rank) + ",\"host\":" + Str(c.host) +
         ",\"straggler\":" + (c.straggler ? "true" : "false") + ",\"slower\":" + Num(c.slower) +
         ",\"since_step\":" + std::to_string(c.since_step) + ",\"since_wall_s\":" + Num(c.since_wall_s) + "}";
  }
  s += "],\"curves\":{\"loss\":" + Curve(loss_curve_) + ",\"test_accuracy\":" + Curve(acc_curve_) + "}}";
  return s;
}

}  // namespace shoal
