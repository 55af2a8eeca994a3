// Shoal's side of `./shoal bench data`: images/s through the training transforms of an
// imagefolder (decode, RandomResizedCrop, flip, normalize, batch) with --threads decode
// threads, for --seconds after one warm-up batch. Last line: one JSON object.
#include <gflags/gflags.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>

#include "common/error.h"
#include "worker/data/data_loader.h"
#include "worker/data/dataset.h"

DEFINE_string(dir, "", "an ImageFolder (class folders of JPEGs)");
DEFINE_int32(threads, 1, "decode threads");
DEFINE_int32(batch, 64, "batch size");
DEFINE_int32(size, 224, "output image size");
DEFINE_double(seconds, 5, "how long to measure");
DEFINE_bool(crop_decode, true, "decode only the JPEG rows and columns the crop needs (false: whole images)");

// CPU seconds of this process, every thread: on a shared machine a steadier measure of the
// work per image than wall time.
static double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  try {
    shoal::DatasetOptions o;
    o.image_size = FLAGS_size;
    auto ds = shoal::LoadDataset("imagefolder", FLAGS_dir, o);
    shoal::DataLoaderOptions lo;
    lo.batch_size = FLAGS_batch;
    lo.augment = true;
    lo.build_threads = FLAGS_threads;
    lo.seed = 1;
    lo.crop_decode = FLAGS_crop_decode;
    shoal::DataLoader loader(ds, lo);
    if (loader.batches_per_epoch() < 1)
      throw shoal::Error(FLAGS_dir + ": " + std::to_string(ds->size()) + " images, fewer than one batch of " +
                         std::to_string(FLAGS_batch));
    shoal::Batch b;
    int64_t epoch = 0;
    loader.StartEpoch(epoch);
    auto next = [&] {
      while (!loader.Next(&b)) loader.StartEpoch(++epoch);
    };
    next();  // warm-up: threads, page cache
    int64_t images = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = CpuSeconds();
    double s = 0;
    while (s < FLAGS_seconds) {
      next();
      images += b.n;
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const double cpu = CpuSeconds() - cpu0;
    printf("{\"bench\":\"data_shoal\",\"threads\":%d,\"images_per_s\":%.1f,\"images_per_cpu_s\":%.1f}\n", FLAGS_threads,
           double(images) / s, double(images) / cpu);
  } catch (const shoal::Error& e) {
    fprintf(stderr, "data_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
