// An in-memory image classification data set: uint8 or float32 images of one shape
// (C,H,W), int32 labels, and the per-channel mean/std used to normalize them. Or a token
// sequence (format "tokens"): samples are windows of seq_len ids (shape {T}), each with T
// labels, the next token at every position.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shoal {
namespace data {

struct DatasetOptions {
  uint64_t seed = 0;             // synthetic data only
  int64_t max_samples = 0;       // 0 = all; otherwise keep the first max_samples records
  int64_t num_classes = 0;       // 0 = the format's own (idx: largest label + 1, cifar: 10,
                                 // cifar100: 100, or 20 coarse); >0: every label must be below it
  bool cifar100_coarse = false;  // cifar100: the 20 superclass labels instead of the 100 fine ones
  // Synthetic ImageNet-shaped data: samples x channels x image_size x image_size.
  int64_t synthetic_samples = 1024;
  int64_t synthetic_image_size = 224;
  int64_t synthetic_channels = 3;
  int64_t synthetic_classes = 1000;
  int64_t synthetic_pool = 64;  // distinct images; samples reuse them so generation is cheap
  // Encoded images (imagefolder, webdataset): the decoded sample is channels x image_size
  // x image_size; mean/std (empty: ImageNet's, or its luma for one channel) normalize it.
  int64_t image_size = 224;
  int64_t channels = 3;
  std::vector<float> mean, stddev;
  bool skip_bad = false;             // bad files, members, shards, class folders, token ids: skipped and counted
  std::vector<std::string> classes;  // imagefolder test set: the training set's class names
  int64_t seq_len = 0;               // tokens: tokens per window (num_classes is the vocabulary size)
};

// ImageNet's per-channel statistics (RGB, [0,1] scale), and for one channel their ITU-R 601
// luma (0.299 R + 0.587 G + 0.114 B), the weights grayscale decoding uses.
extern const float kImageNetMean[3], kImageNetStd[3], kImageNetLumaMean, kImageNetLumaStd;

// Images kept encoded (JPEG or PNG files, tar members) and decoded when a batch needs them.
class EncodedImages {
 public:
  virtual ~EncodedImages() = default;
  // Sample i's encoded bytes into *out; thread-safe. Throws InputError naming the file (and
  // member) when it cannot be read (TransientError for a read error of the disk).
  virtual void Read(int64_t i, std::vector<uint8_t>* out) const = 0;
  // "FILE", or "SHARD: member NAME", for messages.
  virtual std::string Name(int64_t i) const = 0;
  // Samples stored in shards that are best read front to back (webdataset): how many each
  // shard holds, in index order. Empty when every sample is as cheap to reach as any other.
  virtual std::vector<int64_t> ShardSizes() const { return {}; }
};

class Dataset {
 public:
  // `rows` maps sample i to the stored image rows[i]; empty means the identity. Pixel
  // storage holds one image per row, C*H*W values each. uint8 pixels are scaled to [0,1]
  // before normalization (so mean/std are in that scale); float pixels are used as given.
  static std::shared_ptr<Dataset> FromU8(std::string source, std::vector<int64_t> sample_shape,
                                         std::vector<uint8_t> pixels, std::vector<int32_t> labels, int64_t num_classes,
                                         std::vector<int64_t> rows = {});
  static std::shared_ptr<Dataset> FromFloat(std::string source, std::vector<int64_t> sample_shape,
                                            std::vector<float> pixels, std::vector<int32_t> labels, int64_t num_classes,
                                            std::vector<int64_t> rows = {});

  // Encoded samples: `images` holds labels.size() images that decode to sample_shape.
  // `skipped` counts the bad inputs the reader left out (skip_bad); `classes` names them.
  static std::shared_ptr<Dataset> FromEncoded(std::string source, std::vector<int64_t> sample_shape,
                                              std::vector<int32_t> labels, int64_t num_classes,
                                              std::shared_ptr<const EncodedImages> images, std::vector<float> mean,
                                              std::vector<float> stddev, int64_t skipped,
                                              std::vector<std::string> classes = {});

  // Token windows over `count` ids at `tokens` (host order), kept alive by `owner` (a memory
  // map, or a vector): sample i is tokens[i*seq_len, (i+1)*seq_len) as floats (the ids: an
  // embedding's Gather takes float indices), its labels tokens[i*seq_len + 1, ... + seq_len]
  // (the next token at each position). Non-overlapping; a last partial window is dropped, so
  // the size is (count - 1) / seq_len. `bad_tokens` counts the ids >= vocab_size the caller
  // found (skip_bad; 0: every id is below it, and windows are not checked again).
  static std::shared_ptr<Dataset> FromTokens(std::string source, std::shared_ptr<const void> owner,
                                             const uint16_t* tokens, int64_t count, int64_t seq_len, int64_t vocab_size,
                                             int64_t bad_tokens = 0);

  const std::string& source() const { return source_; }  // where it came from, for messages
  int64_t size() const { return is_tokens() ? token_samples_ : int64_t(labels_.size()); }
  bool is_tokens() const { return seq_len_ > 0; }
  // Tokens only. Windows starting anywhere (DataLoaderOptions::token_offsets): one fewer
  // than size() when that leaves room to shift them by up to seq_len - 1, so a shifted tiling
  // still fits; `token_phase_room()` is how far the first may start (the ids past the last).
  int64_t seq_len() const { return seq_len_; }
  int64_t token_count() const { return token_count_; }
  int64_t bad_tokens() const { return bad_tokens_; }
  int64_t shifted_windows() const;
  int64_t token_phase_room() const { return token_count_ - 1 - shifted_windows() * seq_len_; }
  // The window of seq_len ids starting at token `start` into x (as floats) and its next-token
  // labels into y. Without bad ids (bad_tokens() == 0) nothing is checked.
  void WriteTokenWindow(int64_t start, float* x, int32_t* y) const;
  // The first token of [start, start + seq_len] (a window and its last target) that is not
  // below vocab_size, or -1.
  int64_t FirstBadToken(int64_t start) const;
  uint16_t token(int64_t k) const { return tokens_[k]; }
  // Labels each sample carries: 1, or seq_len for token windows (one per position).
  int64_t labels_per_sample() const { return is_tokens() ? seq_len_ : 1; }
  // Sample i's labels_per_sample() labels into out.
  void WriteLabels(int64_t i, int32_t* out) const;
  const std::vector<int64_t>& sample_shape() const { return shape_; }  // {C, H, W}
  int64_t channels() const { return shape_[0]; }
  int64_t sample_numel() const { return numel_; }
  int64_t num_classes() const { return num_classes_; }
  bool is_u8() const { return is_u8_; }
  bool is_encoded() const { return encoded_ != nullptr; }
  const EncodedImages& encoded() const { return *encoded_; }
  int64_t load_skipped() const { return load_skipped_; }                        // bad inputs left out at load
  const std::vector<std::string>& class_names() const { return class_names_; }  // imagefolder
  int32_t label(int64_t i) const { return labels_[size_t(i)]; }                 // one-label sets only
  const std::vector<int32_t>& labels() const { return labels_; }
  const uint8_t* u8_sample(int64_t i) const { return u8_.data() + Row(i) * numel_; }
  const float* f32_sample(int64_t i) const { return f32_.data() + Row(i) * numel_; }

  // Per-channel statistics of this set, computed when it is built (exact, over every sample).
  const std::vector<float>& mean() const { return mean_; }
  const std::vector<float>& stddev() const { return std_; }
  void SetNormalization(std::vector<float> mean, std::vector<float> stddev);
  // A test set normalizes with the training set's statistics and must use its classes:
  // adopts both, and throws naming this set if a label does not fit or the shapes differ.
  void UseNormalizationOf(const Dataset& train);

  // Sample i as normalized float32 CHW into out[sample_numel()].
  void WriteNormalized(int64_t i, float* out) const;
  // Per-channel affine map x -> x*scale + shift that WriteNormalized applies (after the
  // [0,1] scaling of uint8 pixels), for loaders that write pixels themselves.
  void NormalizationAffine(std::vector<float>* scale, std::vector<float>* shift) const;

 private:
  Dataset() = default;
  void Init(std::vector<int64_t> rows, int64_t stored_rows);
  void ComputeStats();
  int64_t Row(int64_t i) const { return rows_.empty() ? i : rows_[size_t(i)]; }

  std::string source_;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  int64_t num_classes_ = 0;
  bool is_u8_ = true;
  std::vector<uint8_t> u8_;
  std::vector<float> f32_;
  std::vector<int32_t> labels_;
  std::vector<int64_t> rows_;
  std::vector<float> mean_, std_;
  std::shared_ptr<const EncodedImages> encoded_;
  int64_t load_skipped_ = 0;
  std::vector<std::string> class_names_;
  int64_t seq_len_ = 0;  // tokens only
  int64_t token_samples_ = 0;
  std::shared_ptr<const void> token_owner_;  // what keeps tokens_ valid (a memory map)
  const uint16_t* tokens_ = nullptr;
  int64_t token_count_ = 0;
  int64_t bad_tokens_ = 0;
};

// format: "idx" | "cifar" | "cifar100" | "synthetic" | "imagefolder" | "webdataset" | "tokens".
// path: see the reader of each format (idx_reader.h, cifar_reader.h, image_folder.h,
// webdataset.h, tokens_reader.h;
// synthetic uses the path only to tell train from test).
std::shared_ptr<Dataset> LoadDataset(const std::string& format, const std::string& path, const DatasetOptions& options);

}  // namespace data

// The trainer and tests name these without the sub-namespace.
using data::Dataset;
using data::DatasetOptions;
using data::LoadDataset;

}  // namespace shoal
