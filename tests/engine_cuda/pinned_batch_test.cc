// A CUDA worker's batches (worker/data/host_memory.h): a DataLoader drawing from the CUDA
// backend's AllocHost hands out page-locked buffers (cudaPointerGetAttributes: host memory
// the device reaches), and each one's asynchronous copy to the device lands bit for bit.
// Skips without a device (the loader's side runs on CPU in tests/data:data_loader_test).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/cuda/platform.h"
#include "worker/data/data_loader.h"
#include "worker/engine/backend.h"

namespace shoal {
namespace {

TEST(PinnedBatches, LoaderBuffersArePageLockedAndCopyAsynchronously) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  auto be = MakeCudaBackend(0);
  const int64_t n = 1000;
  std::vector<uint8_t> px(size_t(n) * 3 * 32 * 32);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (size_t i = 0; i < px.size(); ++i) px[i] = uint8_t(i * 31 % 251);
  for (int64_t i = 0; i < n; ++i) labels[size_t(i)] = int32_t(i % 10);
  auto d = Dataset::FromU8("pinned", {3, 32, 32}, px, labels, 10);
  DataLoaderOptions o;
  o.batch_size = 64;
  o.seed = 1;
  o.augment = true;
  o.host_memory = std::make_shared<HostMemory>([&](size_t bytes) { return be->AllocHost(bytes); });
  DataLoader loader(d, o);
  Batch b;
  Tensor x = be->Empty({64, 3, 32, 32});
  std::vector<float> back(size_t(x.numel()));
  int batches = 0;
  while (loader.Next(&b)) {
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, b.images.data()), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeHost) << "batch " << b.index << " is not page-locked";
    be->CopyFromHostAsync(x, b.images.data());
    be->Synchronize();
    be->CopyToHost(x, back.data());
    ASSERT_EQ(std::memcmp(back.data(), b.images.data(), back.size() * sizeof(float)), 0) << "batch " << b.index;
    ++batches;
  }
  EXPECT_EQ(batches, int(loader.batches_per_epoch()));
}

}  // namespace
}  // namespace shoal
