#include "worker/data/dataset.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "worker/data/cifar_reader.h"
#include "worker/data/idx_reader.h"
#include "worker/data/image_folder.h"
#include "worker/data/synthetic.h"
#include "worker/data/tokens_reader.h"
#include "worker/data/webdataset.h"

namespace shoal {
namespace data {

const float kImageNetMean[3] = {0.485f, 0.456f, 0.406f};
const float kImageNetStd[3] = {0.229f, 0.224f, 0.225f};
const float kImageNetLumaMean = 0.299f * 0.485f + 0.587f * 0.456f + 0.114f * 0.406f;
const float kImageNetLumaStd = 0.299f * 0.229f + 0.587f * 0.224f + 0.114f * 0.225f;

namespace {

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void CheckShape(const std::string& source, const std::vector<int64_t>& shape) {
  SHOAL_CHECK(shape.size() == 3,
              source + ": sample shape must be (C,H,W), got " + std::to_string(shape.size()) + " dims");
  for (int64_t d : shape) SHOAL_CHECK(d > 0, source + ": sample shape has a non-positive dimension");
}

}  // namespace

std::shared_ptr<Dataset> Dataset::FromU8(std::string source, std::vector<int64_t> sample_shape,
                                         std::vector<uint8_t> pixels, std::vector<int32_t> labels, int64_t num_classes,
                                         std::vector<int64_t> rows) {
  CheckShape(source, sample_shape);
  std::shared_ptr<Dataset> d(new Dataset());
  d->source_ = std::move(source);
  d->shape_ = std::move(sample_shape);
  d->numel_ = Product(d->shape_);
  d->u8_ = std::move(pixels);
  d->labels_ = std::move(labels);
  d->num_classes_ = num_classes;
  SHOAL_CHECK(d->u8_.size() % size_t(d->numel_) == 0, d->source_ + ": pixel buffer is not a whole number of images");
  d->Init(std::move(rows), int64_t(d->u8_.size()) / d->numel_);
  return d;
}

std::shared_ptr<Dataset> Dataset::FromFloat(std::string source, std::vector<int64_t> sample_shape,
                                            std::vector<float> pixels, std::vector<int32_t> labels, int64_t num_classes,
                                            std::vector<int64_t> rows) {
  CheckShape(source, sample_shape);
  std::shared_ptr<Dataset> d(new Dataset());
  d->source_ = std::move(source);
  d->shape_ = std::move(sample_shape);
  d->numel_ = Product(d->shape_);
  d->f32_ = std::move(pixels);
  d->is_u8_ = false;
  d->labels_ = std::move(labels);
  d->num_classes_ = num_classes;
  SHOAL_CHECK(d->f32_.size() % size_t(d->numel_) == 0, d->source_ + ": pixel buffer is not a whole number of images");
  d->Init(std::move(rows), int64_t(d->f32_.size()) / d->numel_);
  return d;
}

std::shared_ptr<Dataset> Dataset::FromEncoded(std::string source, std::vector<int64_t> sample_shape,
                                              std::vector<int32_t> labels, int64_t num_classes,
                                              std::shared_ptr<const EncodedImages> images, std::vector<float> mean,
                                              std::vector<float> stddev, int64_t skipped,
                                              std::vector<std::string> classes) {
  CheckShape(source, sample_shape);
  SHOAL_CHECK(images != nullptr, source + ": no images");
  std::shared_ptr<Dataset> d(new Dataset());
  d->source_ = std::move(source);
  d->shape_ = std::move(sample_shape);
  d->numel_ = Product(d->shape_);
  d->is_u8_ = false;
  d->labels_ = std::move(labels);
  d->num_classes_ = num_classes;
  d->encoded_ = std::move(images);
  d->load_skipped_ = skipped;
  d->class_names_ = std::move(classes);
  d->Init({}, d->size());  // statistics of undecoded images are not known: set below
  d->SetNormalization(std::move(mean), std::move(stddev));
  return d;
}

std::shared_ptr<Dataset> Dataset::FromTokens(std::string source, std::shared_ptr<const void> owner,
                                             const uint16_t* tokens, int64_t count, int64_t seq_len, int64_t vocab_size,
                                             int64_t bad_tokens) {
  SHOAL_CHECK(seq_len > 0, source + ": seq_len must be positive");
  SHOAL_CHECK(vocab_size > 0, source + ": vocab_size must be positive");
  SHOAL_CHECK(count >= 0 && (tokens != nullptr || count == 0), source + ": no tokens");
  std::shared_ptr<Dataset> d(new Dataset());
  d->source_ = std::move(source);
  d->shape_ = {seq_len};
  d->numel_ = seq_len;
  d->is_u8_ = false;
  d->num_classes_ = vocab_size;
  d->seq_len_ = seq_len;
  d->token_samples_ = count == 0 ? 0 : (count - 1) / seq_len;
  d->token_owner_ = std::move(owner);
  d->tokens_ = tokens;
  d->token_count_ = count;
  d->bad_tokens_ = bad_tokens;
  // Ids go to the model as they are (an embedding looks them up): no normalization.
  d->mean_ = {0.0f};
  d->std_ = {1.0f};
  return d;
}

int64_t Dataset::shifted_windows() const {
  // n / T - 1 windows end by token n - 1 - (T - 1) at the latest; a file too short for that
  // keeps its one window (and whatever room it has).
  const int64_t shifted = token_count_ / seq_len_ - 1;
  return shifted >= 1 ? shifted : token_samples_;
}

void Dataset::WriteTokenWindow(int64_t start, float* x, int32_t* y) const {
  const uint16_t* t = tokens_ + start;
  for (int64_t k = 0; k < seq_len_; ++k) {
    x[k] = float(t[k]);
    y[k] = int32_t(t[k + 1]);
  }
}

int64_t Dataset::FirstBadToken(int64_t start) const {
  if (bad_tokens_ == 0) return -1;
  for (int64_t k = start; k <= start + seq_len_; ++k)
    if (int64_t(tokens_[k]) >= num_classes_) return k;
  return -1;
}

void Dataset::WriteLabels(int64_t i, int32_t* out) const {
  if (!is_tokens()) {
    out[0] = labels_[size_t(i)];
    return;
  }
  const uint16_t* t = tokens_ + i * seq_len_ + 1;
  for (int64_t k = 0; k < seq_len_; ++k) out[k] = int32_t(t[k]);
}

void Dataset::Init(std::vector<int64_t> rows, int64_t stored_rows) {
  rows_ = std::move(rows);
  if (rows_.empty()) {
    SHOAL_CHECK(stored_rows == size(),
                source_ + ": " + std::to_string(stored_rows) + " images but " + std::to_string(size()) + " labels");
  } else {
    SHOAL_CHECK(int64_t(rows_.size()) == size(), source_ + ": row map and labels differ in length");
    for (int64_t r : rows_) SHOAL_CHECK(r >= 0 && r < stored_rows, source_ + ": row map points past the stored images");
  }
  SHOAL_CHECK(num_classes_ > 0, source_ + ": number of classes must be positive");
  for (int64_t i = 0; i < size(); ++i) {
    int32_t l = labels_[size_t(i)];
    if (l < 0 || l >= num_classes_)
      throw Error(source_ + ": label " + std::to_string(l) + " of sample " + std::to_string(i) + " is outside 0.." +
                  std::to_string(num_classes_ - 1));
  }
  ComputeStats();
}

// Exact per-channel mean/std. uint8 data goes through a 256-bin histogram per channel and
// weights each stored row by how many samples use it, so a synthetic set that reuses a
// small pool costs only the pool.
void Dataset::ComputeStats() {
  if (encoded_) {
    mean_.assign(size_t(channels()), 0.0f);
    std_.assign(size_t(channels()), 1.0f);
    return;
  }
  const int64_t C = channels(), hw = numel_ / C;
  const int64_t stored = is_u8() ? int64_t(u8_.size()) / numel_ : int64_t(f32_.size()) / numel_;
  std::vector<int64_t> weight(size_t(stored), rows_.empty() ? 1 : 0);
  if (!rows_.empty())
    for (int64_t r : rows_) ++weight[size_t(r)];
  mean_.assign(size_t(C), 0.0f);
  std_.assign(size_t(C), 1.0f);
  if (size() == 0) return;
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0, sq = 0;
    if (is_u8()) {
      int64_t hist[256] = {0};
      for (int64_t r = 0; r < stored; ++r) {
        if (!weight[size_t(r)]) continue;
        int64_t local[256] = {0};
        const uint8_t* p = u8_.data() + r * numel_ + c * hw;
        for (int64_t k = 0; k < hw; ++k) ++local[p[k]];
        for (int v = 0; v < 256; ++v) hist[v] += local[v] * weight[size_t(r)];
      }
      for (int v = 0; v < 256; ++v) {
        double x = v / 255.0;
        sum += double(hist[v]) * x;
        sq += double(hist[v]) * x * x;
      }
    } else {
      for (int64_t r = 0; r < stored; ++r) {
        if (!weight[size_t(r)]) continue;
        const float* p = f32_.data() + r * numel_ + c * hw;
        double s = 0, q = 0;
        for (int64_t k = 0; k < hw; ++k) {
          s += p[k];
          q += double(p[k]) * p[k];
        }
        sum += s * double(weight[size_t(r)]);
        sq += q * double(weight[size_t(r)]);
      }
    }
    const double n = double(size()) * double(hw);
    const double m = sum / n;
    const double var = std::max(0.0, sq / n - m * m);
    mean_[size_t(c)] = float(m);
    // A constant channel would divide by zero; leave it centred but unscaled.
    std_[size_t(c)] = var > 1e-12 ? float(std::sqrt(var)) : 1.0f;
  }
}

void Dataset::SetNormalization(std::vector<float> mean, std::vector<float> stddev) {
  SHOAL_CHECK(int64_t(mean.size()) == channels() && int64_t(stddev.size()) == channels(),
              source_ + ": normalization needs " + std::to_string(channels()) + " means and stds");
  for (float s : stddev) SHOAL_CHECK(s > 0 && std::isfinite(s), source_ + ": normalization std must be positive");
  mean_ = std::move(mean);
  std_ = std::move(stddev);
}

void Dataset::UseNormalizationOf(const Dataset& train) {
  if (is_tokens() != train.is_tokens())
    throw Error(source_ + ": the test set and the training set (" + train.source() + ") are of different formats");
  if (train.sample_shape() != shape_ || train.is_tokens()) {
    auto str = [](const std::vector<int64_t>& s) {
      std::string o;
      for (size_t i = 0; i < s.size(); ++i) o += (i ? "x" : "") + std::to_string(s[i]);
      return o;
    };
    if (train.sample_shape() != shape_)
      throw Error(source_ + ": samples are " + str(shape_) + " but the training set's (" + train.source() + ") are " +
                  str(train.sample_shape()));
    // Token windows: both were read with the same vocab_size, which checked every id.
    SHOAL_CHECK(num_classes_ == train.num_classes(), source_ + ": vocab_size differs from the training set's");
    return;
  }
  int32_t top = -1;
  for (int32_t l : labels_) top = std::max(top, l);
  for (int64_t i = 0; i < size(); ++i)
    if (labels_[size_t(i)] >= train.num_classes())
      throw Error(source_ + ": label " + std::to_string(labels_[size_t(i)]) + " of sample " + std::to_string(i) +
                  " is not a class of the training set (" + train.source() + " has " +
                  std::to_string(train.num_classes()) + "; [data] classes = " + std::to_string(int64_t(top) + 1) +
                  " sizes the model for every test label)");
  num_classes_ = train.num_classes();
  SetNormalization(train.mean(), train.stddev());
}

void Dataset::NormalizationAffine(std::vector<float>* scale, std::vector<float>* shift) const {
  const float pixel = is_u8() || encoded_ ? 1.0f / 255.0f : 1.0f;
  scale->resize(mean_.size());
  shift->resize(mean_.size());
  for (size_t c = 0; c < mean_.size(); ++c) {
    (*scale)[c] = pixel / std_[c];
    (*shift)[c] = -mean_[c] / std_[c];
  }
}

void Dataset::WriteNormalized(int64_t i, float* out) const {
  SHOAL_CHECK(!encoded_, source_ + ": encoded images are decoded by the DataLoader");
  if (is_tokens()) {
    const uint16_t* t = tokens_ + i * seq_len_;
    for (int64_t k = 0; k < seq_len_; ++k) out[k] = float(t[k]);
    return;
  }
  const int64_t C = channels(), hw = numel_ / C;
  std::vector<float> scale, shift;
  NormalizationAffine(&scale, &shift);
  for (int64_t c = 0; c < C; ++c) {
    const float a = scale[size_t(c)], b = shift[size_t(c)];
    float* o = out + c * hw;
    if (is_u8()) {
      const uint8_t* p = u8_sample(i) + c * hw;
      for (int64_t k = 0; k < hw; ++k) o[k] = float(p[k]) * a + b;
    } else {
      const float* p = f32_sample(i) + c * hw;
      for (int64_t k = 0; k < hw; ++k) o[k] = p[k] * a + b;
    }
  }
}

std::shared_ptr<Dataset> LoadDataset(const std::string& format, const std::string& path,
                                     const DatasetOptions& options) {
  SHOAL_CHECK(options.max_samples >= 0, "[data] max_samples must be >= 0, got " + std::to_string(options.max_samples));
  if (format == "idx") return ReadIdx(path, options);
  if (format == "cifar") return ReadCifar(path, options);
  if (format == "cifar100") return ReadCifar100(path, options);
  if (format == "synthetic") return MakeSynthetic(path, options);
  if (format == "imagefolder") return ReadImageFolder(path, options);
  if (format == "webdataset") return ReadWebDataset(path, options);
  if (format == "tokens") return ReadTokens(path, options);
  throw Error("[data] format: unknown \"" + format +
              "\" (expected idx, cifar, cifar100, synthetic, imagefolder, webdataset or tokens)");
}

}  // namespace data
}  // namespace shoal
