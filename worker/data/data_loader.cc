#include "worker/data/data_loader.h"

#include <algorithm>
#include <numeric>

#include "common/error.h"
#include "worker/data/random.h"

namespace shoal {
namespace data {

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), opt_(options) {
  SHOAL_CHECK(dataset_ != nullptr, "DataLoader: no data set");
  const std::string where = "DataLoader(" + dataset_->source() + "): ";
  SHOAL_CHECK(opt_.batch_size > 0, where + "batch_size must be > 0, got " + std::to_string(opt_.batch_size));
  SHOAL_CHECK(opt_.world_size > 0, where + "world_size must be > 0, got " + std::to_string(opt_.world_size));
  SHOAL_CHECK(opt_.rank >= 0 && opt_.rank < opt_.world_size,
              where + "rank " + std::to_string(opt_.rank) + " is outside 0.." + std::to_string(opt_.world_size - 1));
  SHOAL_CHECK(opt_.max_samples >= 0, where + "max_samples must be >= 0");
  SHOAL_CHECK(opt_.prefetch >= 0, where + "prefetch must be >= 0");
  SHOAL_CHECK(opt_.build_threads >= 0, where + "build_threads must be >= 0");
  if (opt_.augment)
    SHOAL_CHECK(dataset_->sample_shape()[1] > 8 && dataset_->sample_shape()[2] > 8,
                where + "augmentation (4-pixel crop) needs images larger than 8x8");

  total_ = dataset_->size();
  if (opt_.max_samples > 0) total_ = std::min(total_, opt_.max_samples);
  const int64_t W = opt_.world_size, r = opt_.rank;
  if (opt_.global_slices) {
    SHOAL_CHECK(opt_.drop_last, where + "global_slices needs drop_last");
    SHOAL_CHECK(opt_.batch_size <= (int64_t(1) << 40) / W, where + "batch_size x world_size overflows");
    batches_ = total_ / (opt_.batch_size * W);
    shard_size_ = batches_ * opt_.batch_size;  // nominal: the shares decide
    share_offset_ = r * opt_.batch_size;
    share_count_ = opt_.batch_size;
  } else if (opt_.drop_last) {
    shard_size_ = total_ / W;
    batches_ = shard_size_ / opt_.batch_size;
  } else {
    shard_size_ = total_ > r ? (total_ - r + W - 1) / W : 0;
    batches_ = (shard_size_ + opt_.batch_size - 1) / opt_.batch_size;
  }

  dataset_->NormalizationAffine(&scale_, &shift_);
  if (dataset_->is_u8()) {
    lut_.resize(scale_.size() * 256);
    for (size_t c = 0; c < scale_.size(); ++c)
      for (int v = 0; v < 256; ++v) lut_[c * 256 + size_t(v)] = float(v) * scale_[c] + shift_[c];
  }
  if (opt_.prefetch > 0) producer_ = std::thread([this] { ProducerLoop(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    ++generation_;
  }
  cv_.notify_all();
  if (producer_.joinable()) producer_.join();
}

std::vector<int64_t> DataLoader::EpochIndices(int64_t epoch) const {
  std::vector<int64_t> perm(static_cast<size_t>(total_));
  std::iota(perm.begin(), perm.end(), int64_t(0));
  if (opt_.shuffle) {
    // Fisher-Yates from (seed, epoch) alone: identical on every rank.
    Rng rng(MixSeed(opt_.seed, uint64_t(epoch) + 1));
    for (int64_t i = total_ - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[rng.Below(uint64_t(i) + 1)]);
  }
  if (opt_.global_slices) return perm;
  std::vector<int64_t> mine(static_cast<size_t>(shard_size_));
  for (int64_t k = 0; k < shard_size_; ++k) mine[size_t(k)] = perm[size_t(opt_.rank + k * opt_.world_size)];
  return mine;
}

void DataLoader::Restart(int64_t epoch, int64_t batch) {
  auto indices = std::make_shared<const std::vector<int64_t>>(EpochIndices(epoch));
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++generation_;
    while (!ready_.empty()) {
      free_.push_back(std::move(ready_.front()));
      ready_.pop_front();
    }
    epoch_ = epoch;
    indices_ = std::move(indices);
    produce_next_ = consume_next_ = batch;
    started_ = true;
  }
  cv_.notify_all();
}

void DataLoader::StartEpoch(int64_t epoch) {
  SHOAL_CHECK(epoch >= 0, "DataLoader: epoch must be >= 0, got " + std::to_string(epoch));
  Restart(epoch, 0);
}

void DataLoader::Seek(Position p) {
  if (p.epoch < 0 || p.batch < 0 || p.batch > batches_)
    throw Error("DataLoader(" + dataset_->source() + "): cannot seek to epoch " + std::to_string(p.epoch) + " batch " +
                std::to_string(p.batch) + " (an epoch has " + std::to_string(batches_) +
                " batches; was the checkpoint made with another batch size, worker count or data set?)");
  Restart(p.epoch, p.batch);
}

void DataLoader::SetShare(int64_t offset, int64_t count) {
  const int64_t B = opt_.batch_size * opt_.world_size;
  SHOAL_CHECK(opt_.global_slices, "DataLoader(" + dataset_->source() + "): SetShare needs global_slices");
  SHOAL_CHECK(offset >= 0 && count >= 1 && offset + count <= B,
              "DataLoader(" + dataset_->source() + "): share [" + std::to_string(offset) + ", " +
                  std::to_string(offset + count) + ") is outside the global batch of " + std::to_string(B));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (offset == share_offset_ && count == share_count_) return;
    share_offset_ = offset;
    share_count_ = count;
    ++generation_;  // batches built with the old share are dropped
    while (!ready_.empty()) {
      free_.push_back(std::move(ready_.front()));
      ready_.pop_front();
    }
    produce_next_ = consume_next_;
  }
  cv_.notify_all();
}

int64_t DataLoader::share_count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return opt_.global_slices ? share_count_ : opt_.batch_size;
}

int64_t DataLoader::StartOf(int64_t index) const {
  if (opt_.global_slices) return index * opt_.batch_size * opt_.world_size + share_offset_;
  return index * opt_.batch_size;
}

Position DataLoader::position() const {
  std::lock_guard<std::mutex> lk(mu_);
  Position p;
  p.epoch = epoch_;
  p.batch = consume_next_;
  return p;
}

bool DataLoader::Next(Batch* out) {
  if (!started_) StartEpoch(0);  // started_ only changes on this (the consumer's) thread
  std::unique_lock<std::mutex> lk(mu_);
  if (consume_next_ >= batches_) return false;
  if (opt_.prefetch == 0) {
    const int64_t index = consume_next_++;
    produce_next_ = consume_next_;
    auto indices = indices_;
    const int64_t epoch = epoch_, start = StartOf(index), count = opt_.global_slices ? share_count_ : opt_.batch_size;
    lk.unlock();
    Build(*indices, epoch, index, start, count, out);
    return true;
  }
  cv_.wait(lk, [&] { return !ready_.empty() || error_ != nullptr; });
  if (ready_.empty()) std::rethrow_exception(error_);
  std::swap(*out, ready_.front());
  // The caller's previous buffers become the producer's next ones.
  if (ready_.front().images.capacity() > 0 && int64_t(free_.size()) <= opt_.prefetch)
    free_.push_back(std::move(ready_.front()));
  ready_.pop_front();
  ++consume_next_;
  lk.unlock();
  cv_.notify_all();
  return true;
}

void DataLoader::ProducerLoop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] {
      return stop_ || (started_ && !error_ && produce_next_ < batches_ && int64_t(ready_.size()) < opt_.prefetch);
    });
    if (stop_) return;
    const uint64_t gen = generation_;
    const int64_t index = produce_next_++, epoch = epoch_, start = StartOf(index);
    const int64_t count = opt_.global_slices ? share_count_ : opt_.batch_size;
    auto indices = indices_;
    Batch b;
    if (!free_.empty()) {
      b = std::move(free_.back());
      free_.pop_back();
    }
    lk.unlock();
    std::exception_ptr err;
    try {
      Build(*indices, epoch, index, start, count, &b);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    if (gen != generation_) {
      free_.push_back(std::move(b));
      continue;
    }
    if (err)
      error_ = err;
    else
      ready_.push_back(std::move(b));
    cv_.notify_all();
  }
}

void DataLoader::Build(const std::vector<int64_t>& indices, int64_t epoch, int64_t index, int64_t start, int64_t count,
                       Batch* b) const {
  const int64_t n = std::min(count, int64_t(indices.size()) - start);
  const int64_t numel = dataset_->sample_numel();
  b->n = n;
  b->epoch = epoch;
  b->index = index;
  b->images.resize(size_t(n * numel));
  b->labels.resize(size_t(n));
  auto fill = [&](int64_t from, int64_t to) {
    for (int64_t j = from; j < to; ++j) {
      const int64_t i = indices[size_t(start + j)];
      b->labels[size_t(j)] = dataset_->label(i);
      WriteSample(i, epoch, b->images.data() + j * numel);
    }
  };
  const int threads = BuildThreads(n);
  if (threads <= 1) {
    fill(0, n);
    return;
  }
  // Thread per chunk, started per batch: at the batch sizes that get here (tens of MB)
  // the start-up cost is noise, and no pool outlives the loader.
  std::vector<std::thread> helpers;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int t = 1; t < threads; ++t) {
    const int64_t from = std::min(n, t * chunk), to = std::min(n, from + chunk);
    if (from < to) helpers.emplace_back(fill, from, to);
  }
  fill(0, std::min(n, chunk));
  for (auto& h : helpers) h.join();
}

int DataLoader::BuildThreads(int64_t n) const {
  if (opt_.build_threads > 0) return int(std::min<int64_t>(opt_.build_threads, n));
  if (n * dataset_->sample_numel() < (int64_t(1) << 22)) return 1;  // under 16 MB of floats
  const int hw = int(std::thread::hardware_concurrency());
  return int(std::min<int64_t>(n, std::max(1, std::min(8, hw / 2))));
}

void DataLoader::WriteSample(int64_t i, int64_t epoch, float* out) const {
  const Dataset& d = *dataset_;
  const int64_t C = d.channels(), H = d.sample_shape()[1], W = d.sample_shape()[2], hw = H * W;
  const bool u8 = d.is_u8();
  if (!opt_.augment) {
    for (int64_t c = 0; c < C; ++c) {
      float* o = out + c * hw;
      if (u8) {
        const uint8_t* p = d.u8_sample(i) + c * hw;
        const float* lut = lut_.data() + c * 256;
        for (int64_t k = 0; k < hw; ++k) o[k] = lut[p[k]];
      } else {
        const float* p = d.f32_sample(i) + c * hw;
        const float a = scale_[size_t(c)], s = shift_[size_t(c)];
        for (int64_t k = 0; k < hw; ++k) o[k] = p[k] * a + s;
      }
    }
    return;
  }
  // Crop window offset in [-4, 4] of a 4-pixel zero-padded image, then maybe mirror.
  Rng rng(MixSeed(MixSeed(opt_.seed ^ 0x5eedau, uint64_t(epoch)), uint64_t(i)));
  const int64_t dy = int64_t(rng.Below(9)) - 4, dx = int64_t(rng.Below(9)) - 4;
  const bool flip = rng.Below(2) == 1;
  for (int64_t c = 0; c < C; ++c) {
    const float zero = u8 ? lut_[size_t(c) * 256] : shift_[size_t(c)];
    const float a = scale_[size_t(c)], s = shift_[size_t(c)];
    for (int64_t y = 0; y < H; ++y) {
      float* o = out + c * hw + y * W;
      const int64_t sy = y + dy;
      if (sy < 0 || sy >= H) {
        std::fill(o, o + W, zero);
        continue;
      }
      for (int64_t x = 0; x < W; ++x) {
        const int64_t sx = (flip ? W - 1 - x : x) + dx;
        if (sx < 0 || sx >= W) {
          o[x] = zero;
        } else if (u8) {
          o[x] = lut_[size_t(c) * 256 + d.u8_sample(i)[c * hw + sy * W + sx]];
        } else {
          o[x] = d.f32_sample(i)[c * hw + sy * W + sx] * a + s;
        }
      }
    }
  }
}

}  // namespace data
}  // namespace shoal
