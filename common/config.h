// The job file (TOML) as a typed, validated JobConfig. Key names are a contract
// (see DESIGN.md): extend, don't rename. Every error names the file, the key and what
// was expected.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "common/batch_schedule.h"

namespace shoal {

// A free-form section ([algorithm], [optimizer]): known keys are typed by the code that
// reads them; getters throw shoal::Error naming file, section, key and expectation.
class ConfigSection {
 public:
  using Value = std::variant<bool, int64_t, double, std::string>;
  ConfigSection() = default;
  ConfigSection(std::string file, std::string section) : file_(std::move(file)), section_(std::move(section)) {}

  bool Has(const std::string& key) const { return values_.count(key) > 0; }
  double GetDouble(const std::string& key, double def) const;
  int64_t GetInt(const std::string& key, int64_t def) const;
  bool GetBool(const std::string& key, bool def) const;
  std::string GetString(const std::string& key, const std::string& def) const;
  // Range-checked variants: error when the value lies outside [lo, hi].
  double GetDouble(const std::string& key, double def, double lo, double hi) const;
  int64_t GetInt(const std::string& key, int64_t def, int64_t lo, int64_t hi) const;

  void Set(const std::string& key, Value v) { values_[key] = std::move(v); }
  const std::map<std::string, Value>& values() const { return values_; }
  std::string Where(const std::string& key) const;  // "job.toml: [algorithm] key"
  // Rejects the first key not in `known` (a typo would otherwise fall back to a default
  // without a word): "job.toml: [optimizer] learning_rate: unknown key for `owner` (did you
  // mean 'lr'?)", listing the known keys when none is close.
  void CheckKeys(const std::vector<std::string>& known, const std::string& owner) const;

 private:
  std::string file_, section_;
  std::map<std::string, Value> values_;
};

struct WorkerSpec {
  std::string host = "127.0.0.1";
  std::string device = "cpu";  // "cpu" | "cuda:N"
  double slowdown = 0;         // sleep slowdown x compute time per step (counted as compute)
  double bandwidth_mbps = 0;   // 0 = unlimited; token bucket on sends
  // Cores of CPU time `shoal run` lets this worker's process use (a CFS quota on its own
  // cgroup: 0.15 = 15 ms of every 100 ms), to rehearse slower devices on one machine without
  // the others taking their cores; 0 = no limit.
  double cpu_quota = 0;
};

// The fewest and most cores a worker's cpu_quota may give: CFS refuses a quota under 1 ms
// per period (100 ms here), and more cores than kMaxThreads is a typo, not a machine.
constexpr double kMinCpuQuota = 0.01;
constexpr double kMaxCpuQuota = 1024;

// Where worker rank 0 serves a job without servers its coordinator, unless [cluster]
// coordinator says otherwise.
constexpr int kDefaultCoordinatorPort = 7700;

// The largest fixed loss scale and the most a dynamic one grows to: 2^126, whose inverse
// (what gradients are unscaled by) is still a normal float.
constexpr double kMaxLossScale = 85070591730234615865843651857942052864.0;
// A dynamic scale may start higher (up to 1e300): above fp32's range the scaled loss
// gradient overflows, those steps are skipped and the scale halves until it fits.
constexpr double kMaxLossScaleInit = 1e300;

struct JobConfig {
  std::string path;  // the file it came from

  // [job]
  std::string name;
  uint64_t seed = 42;
  std::string output_dir;
  std::string checkpoint_dir;
  int64_t checkpoint_every_steps = 0;  // 0 = only at the end
  // `shoal run` restarts a failed job from its newest complete checkpoint this many times.
  int64_t max_restarts = 0;
  std::string export_weights;  // rank 0 writes the final weights here (raw fp32)
  std::string export_onnx;     // and the final model here, as an ONNX inference graph
  // `shoal run`'s live status page: the port (0 = one the kernel picks) and the IPv4
  // address it binds (loopback unless the job opens it deliberately).
  int64_t status_port = 0;
  std::string status_bind = "127.0.0.1";
  // A worker whose time per step (outside the exchange) exceeds the other workers' median
  // by this factor is named a straggler.
  double straggler_ratio = 1.5;

  // [cluster]
  std::vector<std::string> servers;  // "host:port"; shard k listens on servers[k]
  std::vector<WorkerSpec> workers;
  // "host:port" of the job's coordinator (rendezvous, membership); empty: the default of
  // CoordinatorAddress.
  std::string coordinator;
  // [cluster] coordinator if set; else shard 0 in a job with servers; else the first
  // worker's host at kDefaultCoordinatorPort (worker rank 0 serves it).
  std::string CoordinatorAddress(bool has_servers) const;
  int64_t heartbeat_ms = 500;
  int64_t heartbeat_timeout_ms = 5000;

  // [security] CurveZMQ (Z85 keys, 40 chars); empty = plaintext.
  std::string curve_server_public, curve_server_secret;
  std::string curve_client_public, curve_client_secret;
  bool curve_enabled() const { return !curve_server_public.empty(); }
  // Without keys, every address of the job must be loopback unless this is set: plaintext
  // across a network is a decision, never a default.
  bool allow_plaintext = false;

  // [model]
  std::string model = "mlp";  // a zoo name, or "onnx" with onnx_model set
  // [model] onnx: an ONNX file to train instead of a zoo model, and initializers of it that
  // stay constant (worker/engine/onnx/onnx_import.h says which are trained by default).
  std::string onnx_model;
  std::vector<std::string> onnx_constants;
  bool zero_gamma_init = true;
  double label_smoothing = 0.0;
  std::string precision = "fp32";    // of convolutions and fully connected layers: fp32 | tf32 | bf16 | fp16
  std::string weight_init = "auto";  // auto (the model's default) | he_normal | uniform
  // Loss scaling (worker/loss_scaler.h): "none" | "dynamic" | "fixed" (the file's number).
  // Default: "dynamic" with precision = "fp16", else "none". loss_scale_init is the
  // dynamic scale's start (at most kMaxLossScaleInit), or the fixed scale (at most
  // kMaxLossScale).
  std::string loss_scale = "none";
  double loss_scale_init = 65536;
  int64_t loss_scale_growth_interval = 2000;  // good steps before a dynamic scale doubles

  // [data]
  std::string data_format = "idx";  // idx | cifar | cifar100 | synthetic | imagefolder | webdataset | tokens
  std::string data_label = "fine";  // cifar100: fine (100 classes) | coarse (20 superclasses)
  std::string train_path, test_path;
  int64_t batch_size = 64;           // per worker
  int64_t synthetic_samples = 1024;  // synthetic: samples per epoch per worker
  int64_t synthetic_image_size = 224;
  int64_t synthetic_classes = 1000;
  // idx | cifar | cifar100: the class count the model is built for, which every label must be
  // below (0 = the format's own: idx the training set's largest label + 1, cifar 10,
  // cifar100 100 or 20). Set it when the training set lacks the test set's top classes.
  int64_t data_classes = 0;
  int64_t max_train_samples = 0;  // 0 = all; a subset for quick runs
  int64_t max_test_samples = 0;
  // idx, cifar: random crop (pad 4) + horizontal flip (default off); imagefolder,
  // webdataset: RandomResizedCrop + horizontal flip (default on).
  bool augment = false;
  // imagefolder, webdataset (encoded images, decoded per batch):
  int64_t data_channels = 3;      // 3: RGB, 1: grayscale (luma)
  double crop_fraction = 0.875;   // evaluation (and training without augment): resize to image_size / this, center-crop
  bool skip_bad = false;          // bad images, members, shards, class folders: skipped and counted, not fatal
  int64_t shuffle_buffer = 1000;  // webdataset: samples in the stream's shuffle buffer
  int64_t test_cache_mb = 1024;   // the decoded test batches each worker keeps after the first evaluation; 0: none
  // Every format: per-channel normalization ([0,1] pixel scale); empty: the data set's own
  // statistics (in-memory formats) or ImageNet's (encoded images; its luma for 1 channel).
  std::vector<double> data_mean, data_std;
  int64_t loader_threads = 0;  // threads that build (decode) a batch; 0: from the cores per worker
  // tokens (flat little-endian uint16 ids): samples are windows of seq_len tokens, each
  // position's label the next token; vocab_size is the model's output size (ids below it).
  int64_t seq_len = 0;
  int64_t vocab_size = 0;

  // [algorithm], [optimizer]: name plus algorithm-specific keys
  std::string algorithm = "local";
  ConfigSection algorithm_opts;
  std::string optimizer = "momentum";
  ConfigSection optimizer_opts;

  // [train]
  int64_t epochs = 1;
  double target_accuracy = 0;  // 0 = never stop early
  int64_t max_steps = 0;       // 0 = no limit
  int64_t threads = 0;         // 0 = all cores
  int64_t log_every_steps = 50;
  // Also evaluate (and stop at target_accuracy) every this many steps within an epoch; 0: at
  // each epoch's end only. A time to target is then known to this many steps, not an epoch.
  int64_t eval_every_steps = 0;
  // Batch-size control (common/batch_schedule.h): [[epoch, global batch], ...], the first at
  // epoch 0; empty: batch_size x workers throughout. With it [data] batch_size is the first
  // stage's share (set from it when the file leaves it out).
  std::vector<BatchStage> batch_schedule;

  int world_size() const { return int(workers.size()); }
};

// The entry of `known` that `key` most likely misspells ("" when none is close): a small
// edit distance, or `key`'s words' initials (learning_rate -> lr).
std::string NearestKey(const std::string& key, const std::vector<std::string>& known);

// Limits that keep every product of job values (samples x workers, batch x workers, epochs
// x steps per epoch) far inside int64: a data set of at most 2^31 samples, a global batch
// of at most 2^32.
constexpr int64_t kMaxSamples = int64_t(1) << 31;
constexpr int64_t kMaxBatchSize = int64_t(1) << 20;
constexpr int64_t kMaxWorkers = 4096;
constexpr int64_t kMaxEpochs = 1000000;
// More threads than this is a typo, not a machine (the OpenMP runtime crashes making 100000).
constexpr int64_t kMaxThreads = 1024;
// Which command-line flag set a job value: job key ("[train] epochs") -> flag ("--epochs").
using FlagOverrides = std::map<std::string, std::string>;

// Checks the values that command-line flags may override: the ranges whose products other
// code forms, the thread count, the coordinator's host:port and the plaintext policy
// (ParseJobConfig runs it; run it again after command-line overrides): throws
// "FILE: [data] synthetic_samples: ..." naming the key, or "--epochs (overriding [train]
// epochs of the job file): ..." for a value a flag in `flags` set.
void CheckJobLimits(const JobConfig& c, const FlagOverrides& flags = {});

// Whether `s` is a TCP port as typed: decimal digits only, 1 to 65535.
bool IsPort(const std::string& s);

// Loads and validates; throws shoal::Error("FILE: [section] key: expected ..., got ...").
JobConfig LoadJobConfig(const std::string& path);
// Same, from text already in memory (name used in messages).
JobConfig ParseJobConfig(const std::string& text, const std::string& name);

// "localhost" or 127.x.x.x: addresses plaintext may use without [security]
// allow_plaintext. (Shoal's sockets speak IPv4.)
bool IsLoopbackHost(const std::string& host);

}  // namespace shoal
