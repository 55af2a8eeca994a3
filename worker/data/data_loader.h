// One worker's view of a data set: its shard of each epoch's global shuffle, as
// normalized float32 NCHW batches, built ahead on a background thread.
//
//   auto train = LoadDataset("idx", "/usr/share/datasets/fashion-mnist/train", {});
//   DataLoaderOptions o; o.batch_size = 64; o.rank = r; o.world_size = W; o.seed = 42;
//   DataLoader loader(train, o);
//   for (int64_t e = 0; e < epochs; ++e) {
//     loader.StartEpoch(e);
//     Batch b;
//     while (loader.Next(&b)) { /* b.images: b.n x C x H x W, b.labels: b.n */ }
//   }
//
// Sharding: epoch e's global permutation of all samples is drawn from (seed, e) only, so
// every worker computes the same one; rank r takes positions r, r+W, r+2W, ... With
// drop_last (training) every rank gets floor(N/W) samples and floor(N/W/batch) full
// batches, so all ranks step the same number of times; without it (evaluation) the shards
// cover every sample and the last batch may be partial.
//
// Balanced (uneven) splits, `global_slices`: step s of an epoch uses the global batch
// permutation[s*B, (s+1)*B) with B = batch_size x world_size, and this rank takes the
// slice [offset, offset+count) of it (SetShare; by default the equal share rank*batch_size,
// batch_size). Whatever shares the ranks hold at each step (they must tile [0, B)), every
// sample is used once per epoch, floor(N/B) steps like the strided layout.
//
// Encoded images (imagefolder, webdataset) are read and decoded per batch by build_threads
// threads; sample i of epoch e draws its crop and flip from (seed, e, i), so which thread
// decodes it never matters. A sharded set (webdataset) orders an epoch as its shards in an
// order drawn from (seed, e), each front to back, through a shuffle buffer of
// shuffle_buffer samples; without global_slices rank r takes the r-th contiguous run of
// that stream, so it reads its own shards (mostly) front to back.
//
// Token windows (token_offsets, training): epoch e tiles the file with shifted_windows()
// windows starting at phase p_e + k*seq_len, p_e drawn from (seed, e) in [0, room]
// (Dataset::token_phase_room, at least seq_len - 1 when the file allows), and shuffles and
// shards them like any samples. nanoGPT draws every window at its own random offset, with
// replacement: windows overlap and an epoch misses tokens. A shifted tiling keeps what every
// other format promises (every window once per epoch, disjoint across workers, balanced
// shares, the same batches after --resume) while each epoch cuts the text at other places.
// Without token_offsets (evaluation) window i starts at i*seq_len, every time.
//
// Resume: position() is the next batch Next() will return; Seek(position) on a fresh
// loader with the same options reproduces the exact batches from there on (augmentation
// is drawn per (seed, epoch, sample), not from a running stream).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "worker/data/dataset.h"
#include "worker/data/host_memory.h"

namespace shoal {
namespace data {

struct Batch {
  HostFloats images;            // n x C x H x W, normalized with the data set's mean/std (tokens: n x T ids)
  std::vector<int32_t> labels;  // n x labels_per_sample() (tokens: n x T, the next token at each position)
  int64_t n = 0;
  int64_t epoch = 0;  // where it came from
  int64_t index = 0;  // batch index within the epoch
};

struct DataLoaderOptions {
  int64_t batch_size = 64;
  int rank = 0;
  int world_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;         // false: samples in file order (still sharded by rank)
  bool drop_last = true;       // training: equal full batches on every rank; false: full pass
  int64_t max_samples = 0;     // 0 = all; otherwise only the first max_samples samples
  bool augment = false;        // in-memory images: random crop with 4-pixel zero padding + horizontal
                               // flip; encoded images: RandomResizedCrop + horizontal flip
  int prefetch = 2;            // batches built ahead on a background thread; 0 = in Next()
  int build_threads = 0;       // threads that fill one batch (decode encoded images); 0 = auto
                               // (several only for big or encoded batches, on machines with spare cores)
  bool global_slices = false;  // per-step slices of the global batch (balanced splits; drop_last only)
  // Encoded images only:
  double crop_fraction = 0.875;   // without augment: resize the shorter side to size / this, center-crop
  bool skip_bad = false;          // an image that does not decode (a token window holding an id >= vocab_size)
                                  // is replaced by the next good sample, counted
  int64_t shuffle_buffer = 1000;  // sharded (webdataset) sets: the stream's shuffle buffer, in samples
  bool crop_decode = true;        // JPEGs: decode only the rows and columns the crop's resize reads
  // Tokens: the epoch's windows start at a phase drawn from (seed, epoch), not at multiples of
  // seq_len (training; see the header comment).
  bool token_offsets = false;
  // Encoded images read in a fixed order without augmentation (evaluation): the batches
  // built are kept, up to this many bytes of them, and later epochs copy them instead of
  // decoding again (each is the same every epoch). 0: nothing kept.
  int64_t cache_bytes = 0;
  // Where the batches' images live (host_memory.h): page-locked memory on CUDA workers;
  // null, plain memory.
  std::shared_ptr<HostMemory> host_memory;
};

struct Position {
  int64_t epoch = 0;
  int64_t batch = 0;  // batches of that epoch already returned
  bool operator==(const Position& o) const { return epoch == o.epoch && batch == o.batch; }
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  ~DataLoader();  // stops and joins the prefetch thread, even mid-epoch
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Restarts at batch 0 of `epoch`, dropping anything prefetched. Next() before any
  // StartEpoch/Seek starts epoch 0.
  void StartEpoch(int64_t epoch);
  // Fills *out with the next batch (reusing its buffers); false at the end of the epoch.
  bool Next(Batch* out);
  Position position() const;
  void Seek(Position p);

  // global_slices only: from the next batch Next() returns on, this rank takes samples
  // [offset, offset+count) of each step's global batch. Drops anything prefetched.
  void SetShare(int64_t offset, int64_t count);
  int64_t share_count() const;
  // global_slices only (batch-size control): from the next StartEpoch or Seek on, each step
  // takes batch_size x world_size samples of the epoch's permutation (floor(N / that) steps),
  // and this rank the equal share [rank x batch_size, +batch_size) until SetShare.
  void SetBatchSize(int64_t batch_size);

  int64_t batches_per_epoch() const { return batches_; }
  int64_t total_samples() const { return total_; }           // samples an epoch draws from, all ranks together
  int64_t samples_per_epoch() const { return shard_size_; }  // this rank's
  const Dataset& dataset() const { return *dataset_; }
  const DataLoaderOptions& options() const { return opt_; }
  // This rank's sample indices for `epoch`, in the order its batches use them (with
  // global_slices: the whole epoch's permutation, which the shares slice).
  std::vector<int64_t> EpochIndices(int64_t epoch) const;

  // skip_bad: samples replaced because they did not decode (token windows: held a bad id),
  // so far (every occurrence), and the one-line reasons of those not yet taken, each bad
  // sample (bad id) once.
  int64_t skipped() const;
  std::vector<std::string> TakeSkipNotes();
  // cache_bytes: the batches kept so far and their bytes.
  int64_t cached_batches() const;
  int64_t cached_bytes() const;

 private:
  void Restart(int64_t epoch, int64_t batch);
  void ProducerLoop();
  // Gives b's images a buffer from options().host_memory unless it has one.
  void UseHostMemory(Batch* b) const;
  void Build(const std::vector<int64_t>& indices, int64_t epoch, int64_t index, int64_t start, int64_t n,
             Batch* b) const;  // from the cache, or BuildNew (and kept)
  void BuildNew(const std::vector<int64_t>& indices, int64_t epoch, int64_t index, int64_t start, int64_t n,
                Batch* b) const;
  // Where batch `index` starts in the epoch's indices and how many it takes (under mu_).
  int64_t StartOf(int64_t index) const;
  void WriteSample(int64_t i, int64_t epoch, float* out) const;
  void WriteEncoded(int64_t i, int64_t epoch, float* out) const;
  void WriteWindow(int64_t i, int64_t epoch, float* x, int32_t* y) const;
  int64_t TokenPhase(int64_t epoch) const;
  std::vector<int64_t> StreamOrder(int64_t epoch) const;
  int BuildThreads(int64_t n) const;

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions opt_;
  int64_t total_ = 0;       // samples in use (after max_samples)
  int64_t shard_size_ = 0;  // this rank's samples per epoch
  int64_t batches_ = 0;
  std::vector<float> lut_;  // uint8 pixel -> normalized value, 256 per channel
  std::vector<float> scale_, shift_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool stop_ = false;
  uint64_t generation_ = 0;  // bumped on every restart so stale prefetched batches are dropped
  int64_t epoch_ = 0;
  std::shared_ptr<const std::vector<int64_t>> indices_;
  int64_t share_offset_ = 0, share_count_ = 0;  // global_slices: this rank's slice of a step
  int64_t produce_next_ = 0;
  int64_t consume_next_ = 0;
  std::deque<Batch> ready_;
  std::vector<Batch> free_;  // spare buffers, so steady state allocates nothing
  std::exception_ptr error_;
  std::thread producer_;

  // Threads that help build a batch, kept for the loader's life: a decoder's handle and
  // buffers stay warm, and nothing is started per batch. Only one Build runs at a time (the
  // producer's, or Next()'s without prefetch), so one job slot is enough.
  class Helpers {
   public:
    ~Helpers();
    // Runs job() on `n` threads (this one and n - 1 helpers, started on first use) and
    // returns once every one of them has returned from it.
    void Run(int n, const std::function<void()>& job);

   private:
    void Loop();
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::thread> threads_;
    const std::function<void()>* job_ = nullptr;
    uint64_t gen_ = 0;
    int want_ = 0, taken_ = 0, done_ = 0;
    bool stop_ = false;
  };
  mutable Helpers helpers_;

  bool cacheable_ = false;  // cache_bytes > 0 and every epoch's batches are the same
  mutable std::mutex cache_mu_;
  mutable std::vector<std::unique_ptr<const Batch>> cache_;  // by batch index; null: not kept
  mutable int64_t cache_used_ = 0;

  mutable std::mutex skip_mu_;  // decode threads record bad samples here
  mutable int64_t skipped_ = 0;
  mutable std::set<int64_t> bad_;  // sample indices; tokens: positions of bad ids
  mutable std::vector<std::string> skip_notes_;
};

}  // namespace data

using data::Batch;
using data::DataLoader;
using data::DataLoaderOptions;

}  // namespace shoal
