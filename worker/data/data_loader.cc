#include "worker/data/data_loader.h"

#include <algorithm>
#include <atomic>
#include <numeric>

#include "common/error.h"
#include "worker/data/image.h"
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
  SHOAL_CHECK(opt_.crop_fraction > 0 && opt_.crop_fraction <= 1, where + "crop_fraction must be in (0, 1]");
  SHOAL_CHECK(opt_.shuffle_buffer >= 1, where + "shuffle_buffer must be >= 1");
  SHOAL_CHECK(opt_.cache_bytes >= 0, where + "cache_bytes must be >= 0");
  SHOAL_CHECK(!(opt_.augment && dataset_->is_tokens()), where + "token windows have no augmentation");
  if (opt_.augment && !dataset_->is_encoded())
    SHOAL_CHECK(dataset_->sample_shape()[1] > 8 && dataset_->sample_shape()[2] > 8,
                where + "augmentation (4-pixel crop) needs images larger than 8x8");

  total_ = dataset_->is_tokens() && opt_.token_offsets ? dataset_->shifted_windows() : dataset_->size();
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

  // In-memory and token samples are built from memory at about the speed of a copy: only
  // decoding is worth the memory.
  cacheable_ = opt_.cache_bytes > 0 && dataset_->is_encoded() && !opt_.shuffle && !opt_.augment && !opt_.global_slices;
  if (cacheable_) cache_.resize(size_t(batches_));
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

// Shards in an order drawn from (seed, epoch), each front to back, through a shuffle buffer
// (webdataset's: once full, a random slot is emitted and refilled), then what is left in
// the buffer in a random order.
std::vector<int64_t> DataLoader::StreamOrder(int64_t epoch) const {
  const std::vector<int64_t> sizes = dataset_->encoded().ShardSizes();
  std::vector<int64_t> first(sizes.size() + 1, 0);
  for (size_t s = 0; s < sizes.size(); ++s) first[s + 1] = first[s] + sizes[s];
  std::vector<int64_t> order(sizes.size());
  std::iota(order.begin(), order.end(), int64_t(0));
  Rng rng(MixSeed(opt_.seed, uint64_t(epoch) + 1));
  for (int64_t i = int64_t(order.size()) - 1; i > 0; --i)
    std::swap(order[size_t(i)], order[rng.Below(uint64_t(i) + 1)]);
  Rng pick(MixSeed(opt_.seed ^ 0xb0ffe7, uint64_t(epoch)));
  std::vector<int64_t> out, buf;
  out.reserve(size_t(total_));
  const size_t cap = size_t(std::min<int64_t>(opt_.shuffle_buffer, std::max<int64_t>(total_, 1)));
  buf.reserve(cap);
  for (int64_t s : order)
    for (int64_t i = first[size_t(s)]; i < first[size_t(s) + 1]; ++i) {
      if (i >= total_) continue;  // max_samples
      if (buf.size() < cap) {
        buf.push_back(i);
        continue;
      }
      const size_t j = size_t(pick.Below(cap));
      out.push_back(buf[j]);
      buf[j] = i;
    }
  for (int64_t i = int64_t(buf.size()) - 1; i > 0; --i) std::swap(buf[size_t(i)], buf[pick.Below(uint64_t(i) + 1)]);
  out.insert(out.end(), buf.begin(), buf.end());
  return out;
}

std::vector<int64_t> DataLoader::EpochIndices(int64_t epoch) const {
  const bool stream = opt_.shuffle && dataset_->is_encoded() && !dataset_->encoded().ShardSizes().empty();
  if (stream) {
    std::vector<int64_t> perm = StreamOrder(epoch);
    if (opt_.global_slices) return perm;
    std::vector<int64_t> mine(static_cast<size_t>(shard_size_));
    for (int64_t k = 0; k < shard_size_; ++k)
      mine[size_t(k)] =
          opt_.drop_last ? perm[size_t(opt_.rank * shard_size_ + k)] : perm[size_t(opt_.rank + k * opt_.world_size)];
    return mine;
  }
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

void DataLoader::SetBatchSize(int64_t batch_size) {
  SHOAL_CHECK(opt_.global_slices, "DataLoader(" + dataset_->source() + "): SetBatchSize needs global_slices");
  const int64_t W = opt_.world_size;
  SHOAL_CHECK(batch_size >= 1 && batch_size <= (int64_t(1) << 40) / W && batch_size * W <= total_,
              "DataLoader(" + dataset_->source() + "): a batch of " + std::to_string(batch_size) + " x " +
                  std::to_string(W) + " workers does not fit the " + std::to_string(total_) + " samples");
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (batch_size == opt_.batch_size) return;
    opt_.batch_size = batch_size;
    batches_ = total_ / (batch_size * W);
    shard_size_ = batches_ * batch_size;
    share_offset_ = opt_.rank * batch_size;
    share_count_ = batch_size;
    ++generation_;  // nothing built at the old size is handed out
    while (!ready_.empty()) {
      free_.push_back(std::move(ready_.front()));
      ready_.pop_front();
    }
    produce_next_ = consume_next_ = batches_;  // nothing more until StartEpoch or Seek
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
    UseHostMemory(out);
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

void DataLoader::UseHostMemory(Batch* b) const {
  if (b->images.get_allocator().memory() != opt_.host_memory)
    b->images = HostFloats(HostAllocator<float>(opt_.host_memory));  // the old buffer goes back where it came from
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
    UseHostMemory(&b);
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
  if (cacheable_) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (const Batch* kept = cache_[size_t(index)].get()) {
      b->images.assign(kept->images.begin(), kept->images.end());
      b->labels.assign(kept->labels.begin(), kept->labels.end());
      b->n = kept->n;
      b->epoch = epoch;
      b->index = index;
      return;
    }
  }
  BuildNew(indices, epoch, index, start, count, b);
  if (cacheable_) {
    const int64_t bytes = int64_t((b->images.size() + b->labels.size()) * sizeof(float));
    std::lock_guard<std::mutex> lk(cache_mu_);
    // Batches past the bound are built every epoch; those before it are kept.
    if (!cache_[size_t(index)] && cache_used_ + bytes <= opt_.cache_bytes) {
      // kept in plain memory: page-locked memory is scarce, and only the batches in flight need it
      auto kept = std::make_unique<Batch>();
      kept->images.assign(b->images.begin(), b->images.end());
      kept->labels = b->labels;
      kept->n = b->n;
      cache_[size_t(index)] = std::move(kept);
      cache_used_ += bytes;
    }
  }
}

int64_t DataLoader::cached_batches() const {
  std::lock_guard<std::mutex> lk(cache_mu_);
  int64_t n = 0;
  for (const auto& b : cache_) n += b != nullptr;
  return n;
}

int64_t DataLoader::cached_bytes() const {
  std::lock_guard<std::mutex> lk(cache_mu_);
  return cache_used_;
}

void DataLoader::BuildNew(const std::vector<int64_t>& indices, int64_t epoch, int64_t index, int64_t start,
                          int64_t count, Batch* b) const {
  const int64_t n = std::min(count, int64_t(indices.size()) - start);
  const int64_t numel = dataset_->sample_numel();
  b->n = n;
  b->epoch = epoch;
  b->index = index;
  b->images.resize(size_t(n * numel));
  const int64_t per = dataset_->labels_per_sample();
  b->labels.resize(size_t(n * per));
  // Samples are claimed one at a time: decode times differ from image to image.
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto fill = [&] {
    try {
      for (int64_t j; (j = next.fetch_add(1)) < n;) {
        const int64_t i = indices[size_t(start + j)];
        if (dataset_->is_tokens()) {
          WriteWindow(i, epoch, b->images.data() + j * numel, b->labels.data() + j * per);
          continue;
        }
        dataset_->WriteLabels(i, b->labels.data() + j * per);
        WriteSample(i, epoch, b->images.data() + j * numel);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lk(error_mu);
      if (!error) error = std::current_exception();
      next = n;
    }
  };
  const int threads = BuildThreads(n);
  if (threads <= 1) {
    fill();
    if (error) std::rethrow_exception(error);
    return;
  }
  const std::function<void()> job = fill;
  helpers_.Run(threads, job);
  if (error) std::rethrow_exception(error);
}

DataLoader::Helpers::~Helpers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void DataLoader::Helpers::Run(int n, const std::function<void()>& job) {
  std::unique_lock<std::mutex> lk(mu_);
  while (int(threads_.size()) < n - 1) threads_.emplace_back([this] { Loop(); });
  job_ = &job;
  want_ = n - 1;
  taken_ = done_ = 0;
  ++gen_;
  lk.unlock();
  cv_.notify_all();
  job();
  lk.lock();
  // Every helper that took the job must be out of it before `job` (on the caller's stack)
  // goes; helpers that did not take it never will (want_ is reached first).
  cv_.wait(lk, [&] { return done_ == want_; });
  job_ = nullptr;
}

void DataLoader::Helpers::Loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (gen_ != seen && taken_ < want_); });
    if (stop_) return;
    seen = gen_;
    ++taken_;
    const std::function<void()>* job = job_;
    lk.unlock();
    (*job)();
    lk.lock();
    ++done_;
    cv_.notify_all();
  }
}

int DataLoader::BuildThreads(int64_t n) const {
  if (opt_.build_threads > 0) return int(std::min<int64_t>(opt_.build_threads, n));
  if (dataset_->is_encoded())
    return int(std::min<int64_t>(n, std::max(1, std::min(8, int(std::thread::hardware_concurrency())))));
  if (n * dataset_->sample_numel() < (int64_t(1) << 22)) return 1;  // under 16 MB of floats
  const int hw = int(std::thread::hardware_concurrency());
  return int(std::min<int64_t>(n, std::max(1, std::min(8, hw / 2))));
}

int64_t DataLoader::skipped() const {
  std::lock_guard<std::mutex> lk(skip_mu_);
  return skipped_;
}

std::vector<std::string> DataLoader::TakeSkipNotes() {
  std::lock_guard<std::mutex> lk(skip_mu_);
  std::vector<std::string> out;
  out.swap(skip_notes_);
  return out;
}

void DataLoader::WriteEncoded(int64_t i, int64_t epoch, float* out) const {
  const Dataset& d = *dataset_;
  const int size = int(d.sample_shape()[1]), C = int(d.channels());
  thread_local std::vector<uint8_t> bytes;
  thread_local Image img;
  // skip_bad: a sample that does not decode is replaced by the next one in index order
  // that does, with the bad one's own crop draws, so the batch keeps its size and the
  // epoch its length on every rank, and a re-run replaces it the same way.
  for (int64_t tries = 0, j = i; tries < d.size(); ++tries, j = (j + 1) % d.size()) {
    if (opt_.skip_bad && tries > 0) {
      std::lock_guard<std::mutex> lk(skip_mu_);
      if (bad_.count(j)) continue;
    }
    Rng rng(MixSeed(MixSeed(opt_.seed ^ 0x5eedau, uint64_t(epoch)), uint64_t(i)));
    try {
      if (opt_.skip_bad && tries == 0) {
        std::lock_guard<std::mutex> lk(skip_mu_);
        if (bad_.count(j)) throw InputError("");  // known bad: counted, not read again
      }
      d.encoded().Read(j, &bytes);
      const std::string name = d.encoded().Name(j);
      int w = 0, h = 0;
      ImageSize(bytes.data(), bytes.size(), name, &w, &h);
      const Box box = opt_.augment ? RandomResizedCropBox(w, h, &rng) : CenterCropBox(w, h, size, opt_.crop_fraction);
      const bool flip = opt_.augment && rng.Below(2) == 1;
      int num = 1, den = 1;
      const bool jpeg = DetectImageFormat(bytes.data(), bytes.size()) == ImageFormat::kJpeg;
      if (jpeg) JpegScaleFor(box.x1 - box.x0, box.y1 - box.y0, size, size, &num, &den);
      // The box in the decoded (maybe DCT-downscaled) image's pixels (libjpeg rounds the
      // scaled size up).
      const int fw = jpeg ? (w * num + den - 1) / den : w, fh = jpeg ? (h * num + den - 1) / den : h;
      const double sx = double(fw) / w, sy = double(fh) / h;
      const Box scaled = {box.x0 * sx, box.y0 * sy, box.x1 * sx, box.y1 * sy};
      if (jpeg && opt_.crop_decode) {
        // Only the rows and columns the resize reads: a RandomResizedCrop box is on average
        // about half the image.
        int x0, y0, x1, y1;
        ResizeFootprint(fw, fh, scaled, size, size, &x0, &y0, &x1, &y1);
        DecodeJpegRegion(bytes.data(), bytes.size(), name, C, num, den, x0, y0, x1, y1, &img);
      } else {
        DecodeImage(bytes.data(), bytes.size(), name, C, &img, num, den);
      }
      ResizeBoxToCHW(img, scaled, size, size, flip, scale_.data(), shift_.data(), out);
      return;
    } catch (const InputError& e) {
      if (!opt_.skip_bad) throw;
      std::lock_guard<std::mutex> lk(skip_mu_);
      if (tries == 0) ++skipped_;
      if (bad_.insert(j).second) skip_notes_.push_back(e.what());
    }
  }
  throw InputError(d.source() + ": no image of the data set decodes");
}

int64_t DataLoader::TokenPhase(int64_t epoch) const {
  if (!opt_.token_offsets) return 0;
  Rng rng(MixSeed(opt_.seed ^ 0x70ce5u, uint64_t(epoch)));
  return int64_t(rng.Below(uint64_t(dataset_->token_phase_room()) + 1));
}

void DataLoader::WriteWindow(int64_t i, int64_t epoch, float* x, int32_t* y) const {
  const Dataset& d = *dataset_;
  const int64_t T = d.seq_len(), phase = TokenPhase(epoch);
  // skip_bad (the reader refused bad ids otherwise): a window holding an id >= vocab_size,
  // as input or target, is replaced by the next clean one of this epoch's tiling, counted
  // as a bad image is, and each bad id is noted once by its byte offset.
  for (int64_t tries = 0, j = i; tries < total_; ++tries, j = (j + 1) % total_) {
    const int64_t start = phase + j * T, bad = d.FirstBadToken(start);
    if (bad < 0) {
      d.WriteTokenWindow(start, x, y);
      return;
    }
    std::lock_guard<std::mutex> lk(skip_mu_);
    if (tries == 0) ++skipped_;
    if (bad_.insert(bad).second)
      skip_notes_.push_back(d.source() + ": token " + std::to_string(d.token(bad)) + " at byte offset " +
                            std::to_string(2 * bad) + " is not below [data] vocab_size = " +
                            std::to_string(d.num_classes()) + ": the windows holding it are skipped");
  }
  throw InputError(d.source() +
                   ": every window holds a token id >= [data] vocab_size = " + std::to_string(d.num_classes()));
}

void DataLoader::WriteSample(int64_t i, int64_t epoch, float* out) const {
  if (dataset_->is_encoded()) return WriteEncoded(i, epoch, out);
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
