// CIFAR-10 binary batches: records of 1 label byte + 3072 pixel bytes (3x32x32, CHW).
#pragma once
#include <memory>
#include <string>

#include "worker/data/dataset.h"

namespace shoal {
namespace data {

// `path` is one of:
//  - a .bin file (or any regular file) holding whole records;
//  - a directory (e.g. cifar-10-batches-bin/): its training batches data_batch_1..5.bin;
//  - a prefix: <p>.bin if it exists, else <p>_1.bin, <p>_2.bin, ... (so .../data_batch
//    reads all training batches and .../test_batch the test batch);
//  - <dir>/train or <dir>/test: data_batch_*.bin or test_batch.bin in <dir>.
// Files are concatenated in that order. Each must be a whole number of records and every
// label below the class count (10 unless options.num_classes says otherwise).
std::shared_ptr<Dataset> ReadCifar(const std::string& path, const DatasetOptions& options);

constexpr int64_t kCifarRecordBytes = 1 + 3 * 32 * 32;

}  // namespace data
}  // namespace shoal
