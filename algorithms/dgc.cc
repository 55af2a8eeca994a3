// "dgc": Deep Gradient Compression over the ring. Large tensors send only the top-k of
// their momentum-corrected accumulated gradient as (index, value) pairs in about 4 bytes a
// pair (sparse_codec.h), all-gathered and decoded exactly; small tensors (biases, BN) go
// dense. Every worker decodes the same bytes and applies the same update, so weights stay
// identical.
#include <cmath>

#include "algorithms/algorithm.h"
#include "algorithms/compressors/dgc_compressor.h"
#include "common/error.h"

namespace shoal {
namespace {

class Dgc : public Algorithm {
 public:
  explicit Dgc(const AlgorithmEnv& env) : env_(env) {
    const JobConfig& c = *env.config;
    if (!DgcRunsUnder(c.optimizer))
      throw Error(c.path +
                  ": [optimizer] name: dgc applies its own momentum correction; use \"momentum\" or \"sgd\", not \"" +
                  c.optimizer + "\"");
    const ConfigSection& a = c.algorithm_opts;
    const ConfigSection& o = c.optimizer_opts;
    DgcOptions d;
    d.sparsity = a.GetDouble("sparsity", 0.999, 0, 0.999999);
    d.warmup_epochs = a.GetDouble("sparsity_warmup_epochs", 4, 0, 1e6);
    d.momentum = c.optimizer == "sgd" ? 0.0 : o.GetDouble("momentum", 0.9, 0, 0.99999);
    d.clip_norm = a.GetDouble("clip_norm", 0, 0, 1e9);
    d.weight_decay = o.GetDouble("weight_decay", 0, 0, 1);
    d.min_compress = a.GetInt("min_compress_elements", 512, 1, int64_t(1) << 40);
    d.min_pairs = a.GetInt("min_pairs", 8, 1, int64_t(1) << 40);
    opts_ = d;
    comp_.reset(new DgcCompressor(d, c.seed * 7919 + uint64_t(env.rank)));
    comm_ = env.make_communicator("dgc");
  }
  std::string Name() const override { return "dgc"; }

  void Init(const std::vector<ParamView>& params) override {
    for (size_t i = 0; i < params.size(); ++i) {
      (params[i].n >= opts_.min_compress ? sparse_ : dense_).push_back(i);
      if (params[i].n >= opts_.min_compress) sparse_total_ += params[i].n;
    }
    dense_v_.resize(dense_.size());
    StartFromRankZero(*comm_, params);
  }

  void Step(const std::vector<ParamView>& params, const StepInfo& info) override {
    ScaleGradients(params, GradientWeight(info, comm_->size()));  // uneven batches: the global mean
    const int N = comm_->size();
    // Dense part first, carrying the guard as one more element: a non-finite gradient must
    // reach neither this worker's residuals nor anyone's weights, and every rank must skip
    // the same step (the weights agree). The mean is the same bits on every rank, so
    // checking it needs no further message.
    dense_buf_.clear();
    for (size_t j : dense_) dense_buf_.insert(dense_buf_.end(), params[j].g, params[j].g + params[j].n);
    dense_buf_.push_back(GradientsFinite(params) ? 0.f : 1.f);
    comm_->AllReduce(dense_buf_.data(), int64_t(dense_buf_.size()), ReduceOp::kMean);
    bool bad = dense_buf_.back() != 0.f;
    for (float x : dense_buf_) bad |= !std::isfinite(x);
    if (bad) {
      ++skipped_;
      return;
    }
    float lr = float(env_.schedule->At(info.step));
    double epoch = double(info.step) / double(std::max<int64_t>(1, env_.steps_per_epoch));
    // Sparse part: every rank's encoding has the size the layout gives, so one fixed-size
    // all-gather carries everyone's.
    SparseGrad mine = comp_->Compress(params, sparse_, epoch, N);
    const int64_t bytes = int64_t(mine.wire.size());
    all_wire_.resize(size_t(bytes) * size_t(N));
    comm_->AllGather(mine.wire.data(), bytes, all_wire_.data());
    dense_sum_.assign(size_t(sparse_total_), 0.f);
    // Rank order: every rank sums the same values in the same order.
    for (int r = 0; r < N; ++r)
      SparseDecodeAdd(mine.layout, all_wire_.data() + size_t(bytes) * size_t(r), bytes, dense_sum_.data(),
                      "rank " + std::to_string(r));
    int64_t off = 0;
    for (size_t j : sparse_) {
      const ParamView& p = params[j];
      for (int64_t i = 0; i < p.n; ++i) p.w[i] -= lr * dense_sum_[size_t(off + i)] / float(N);
      off += p.n;
    }
    sent_pairs_ += int64_t(mine.idx.size());
    sent_sparse_bytes_ += bytes;
    dense_elems_ += sparse_total_;
    // Dense part: plain averaged momentum SGD.
    off = 0;
    for (size_t d = 0; d < dense_.size(); ++d) {
      const ParamView& p = params[dense_[d]];
      auto& v = dense_v_[d];
      v.resize(size_t(p.n), 0.f);
      float wd = p.no_weight_decay ? 0.f : float(opts_.weight_decay), m = float(opts_.momentum);
      const float* g = dense_buf_.data() + off;
      for (int64_t i = 0; i < p.n; ++i) {
        v[size_t(i)] = m * v[size_t(i)] + g[i] + wd * p.w[i];
        p.w[i] -= lr * v[size_t(i)];
      }
      off += p.n;
    }
    sparsity_now_ = comp_->SparsityAt(epoch);
  }
  bool AgreeToStop(bool mine) override { return AnyRank(*comm_, mine); }
  Communicator* peers() override { return comm_.get(); }
  Communicator* EvaluationPeers() override { return comm_.get(); }  // every step leaves identical weights
  std::string ReshapeNote() const override { return "dgc's residuals (each worker's unsent gradients) start at 0"; }
  int64_t bytes_sent() const override { return comm_->bytes_sent(); }
  int64_t skipped_steps() const override { return skipped_; }
  bool BalancesBatches() const override { return balance_; }
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    comp_->Save(params, sparse_, "dgc/", out);
    for (size_t d = 0; d < dense_.size(); ++d)
      out->PutFloats("dgc/dense_momentum/" + params[dense_[d]].name, dense_v_[d]);
    out->PutInt("dgc/sent_pairs", sent_pairs_);
    out->PutInt("dgc/dense_elements", dense_elems_);
    out->PutInt("dgc/sent_bytes", sent_sparse_bytes_);
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    // Residuals are each worker's own gradients not yet sent: with another set of workers
    // they start from zero (the trainer's resume line says so). The dense momentum follows
    // averaged gradients, the same on every worker, and is kept.
    if (in.record.shards == uint32_t(env_.world)) comp_->Load(params, sparse_, "dgc/", in);
    for (size_t d = 0; d < dense_.size(); ++d) {
      const std::string key = "dgc/dense_momentum/" + params[dense_[d]].name;
      // Empty until the first step sized it.
      dense_v_[d] = in.Get(key).empty() ? std::vector<float>() : in.GetFloatVector(key, size_t(params[dense_[d]].n));
    }
    sent_pairs_ = in.GetInt("dgc/sent_pairs");
    dense_elems_ = in.GetInt("dgc/dense_elements");
    // Checkpoints from before the encoding count 8 bytes a pair.
    sent_sparse_bytes_ = in.Get("dgc/sent_bytes").empty() ? sent_pairs_ * 8 : in.GetInt("dgc/sent_bytes");
  }
  void AddMetrics(JsonObject* out) const override {
    out->Add("sparsity", sparsity_now_);
    // Of the compressed tensors alone: their dense fp32 bytes over their encodings' bytes.
    out->Add("compression_ratio", sent_sparse_bytes_ > 0 ? double(dense_elems_ * 4) / double(sent_sparse_bytes_) : 0.0);
  }

 private:
  AlgorithmEnv env_;
  bool balance_ = BalanceOn(env_);
  DgcOptions opts_;
  std::unique_ptr<DgcCompressor> comp_;
  std::unique_ptr<Communicator> comm_;
  std::vector<size_t> sparse_, dense_;
  int64_t sparse_total_ = 0;
  std::vector<float> dense_sum_, dense_buf_;
  std::vector<uint8_t> all_wire_;
  std::vector<std::vector<float>> dense_v_;
  int64_t sent_pairs_ = 0, sent_sparse_bytes_ = 0, dense_elems_ = 0, skipped_ = 0;
  double sparsity_now_ = 0;
};

const bool kRegistered =
    RegisterAlgorithm("dgc", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new Dgc(env)); });

}  // namespace
}  // namespace shoal
