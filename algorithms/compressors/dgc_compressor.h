// Deep Gradient Compression's worker side (Lin et al. 2018): local gradient clipping,
// momentum correction (accumulate velocity, not raw gradients), top-k of the accumulated
// velocity, momentum factor masking (sent entries leave both accumulators), and the
// exponential sparsity warm-up. The pairs travel in sparse_codec.h's form (fp16 values,
// bit-packed indices); what rounding takes off a value stays in the residual.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/compressors/sparse_codec.h"

namespace shoal {

// DGC's momentum correction stands in for the optimizer's own, so it runs under momentum SGD or
// plain SGD only (the dgc algorithm refuses others; auto does not weigh it under them).
inline bool DgcRunsUnder(const std::string& optimizer) { return optimizer == "momentum" || optimizer == "sgd"; }

struct DgcOptions {
  double sparsity = 0.999;   // final fraction NOT sent
  double warmup_epochs = 4;  // sparsity 75%, 93.75%, 98.4%, 99.6%, ... up to `sparsity`
  double momentum = 0.9;
  double clip_norm = 0;  // 0: no clipping; else global norm bound (scaled by 1/sqrt(N))
  double weight_decay = 0;
  int64_t min_compress = 512;  // smaller tensors go dense
  // Pairs a compressed tensor sends at least (all of it if smaller): at 99.9% a first conv
  // layer of 800 weights would send 1, and learn that slowly; 8 cost a few dozen bytes.
  int64_t min_pairs = 1;
};

// One rank's selection for one step.
struct SparseGrad {
  SparseLayout layout;        // the compressed tensors' sizes and this step's pairs per tensor
  std::vector<int32_t> idx;   // tensor by tensor, relative to the tensor, increasing
  std::vector<float> val;     // as every rank decodes them (rounded to the wire's precision)
  std::vector<uint8_t> wire;  // SparseEncode's bytes of idx/val
};

class DgcCompressor {
 public:
  DgcCompressor(const DgcOptions& o, uint64_t seed) : o_(o), rng_(seed) {}
  // Sparsity for an epoch (fractional epochs allowed) under the warm-up schedule.
  double SparsityAt(double epoch) const;
  // Fixed per-step count of pairs for tensor of n elements at this sparsity (>= 1).
  static int64_t KFor(int64_t n, double sparsity);
  // The layout of a step at this epoch: every rank computes the same one.
  SparseLayout LayoutAt(const std::vector<ParamView>& params, const std::vector<size_t>& which, double epoch) const;
  // Consumes this step's local gradients of the compressed tensors (indices `which` into
  // params) and returns exactly sum(KFor) pairs, encoded; `world` scales the clipping
  // threshold.
  SparseGrad Compress(const std::vector<ParamView>& params, const std::vector<size_t>& which, double epoch, int world);
  // Adds the pairs into the concatenation of the compressed tensors (`out_n` elements).
  static void Decode(const SparseGrad& s, float* out, int64_t out_n);
  const std::vector<std::vector<float>>& residual() const { return v_; }  // accumulated velocity
  // Both accumulators and the sampling stream, as checkpoint entries "<prefix>...", and back
  // (`which` as for Compress).
  void Save(const std::vector<ParamView>& params, const std::vector<size_t>& which, const std::string& prefix,
            CheckpointState* out) const;
  void Load(const std::vector<ParamView>& params, const std::vector<size_t>& which, const std::string& prefix,
            const CheckpointState& in);

 private:
  DgcOptions o_;
  std::mt19937_64 rng_;
  std::vector<std::vector<float>> u_, v_;  // momentum and accumulated velocity per tensor
};

}  // namespace shoal
