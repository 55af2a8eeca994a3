// CIFAR binary files, one reader for both layouts (the record is the only difference):
//  - CIFAR-10:  1 label byte + 3072 pixel bytes (3x32x32, CHW);
//  - CIFAR-100: 1 coarse label byte (20 superclasses) + 1 fine label byte (100 classes) +
//               the same 3072 pixel bytes.
#pragma once
#include <memory>
#include <string>

#include "worker/data/dataset.h"

namespace shoal {
namespace data {

// `path` is one of:
//  - a .bin file (or any regular file) holding whole records;
//  - a directory: its training set (CIFAR-10, e.g. cifar-10-batches-bin/: data_batch_1..5.bin;
//    CIFAR-100, e.g. cifar-100-binary/: train.bin);
//  - a prefix: <p>.bin if it exists, else <p>_1.bin, <p>_2.bin, ... (so .../data_batch
//    reads all training batches and .../test_batch the test batch);
//  - <dir>/train or <dir>/test: data_batch_*.bin or test_batch.bin in <dir> (CIFAR-100:
//    train.bin or test.bin, which the prefix rule already finds).
// Files are concatenated in that order, plain or gzip. Each must be a whole number of
// records and every label below the class count (10; CIFAR-100: 100 fine or 20 coarse,
// by options.cifar100_coarse; options.num_classes overrides it).
std::shared_ptr<Dataset> ReadCifar(const std::string& path, const DatasetOptions& options);
std::shared_ptr<Dataset> ReadCifar100(const std::string& path, const DatasetOptions& options);

constexpr int64_t kCifarPixelBytes = 3 * 32 * 32;
constexpr int64_t kCifarRecordBytes = 1 + kCifarPixelBytes;
constexpr int64_t kCifar100RecordBytes = 2 + kCifarPixelBytes;

}  // namespace data
}  // namespace shoal
