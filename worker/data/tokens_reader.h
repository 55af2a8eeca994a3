// Token files (nanoGPT's train.bin / val.bin): a flat array of little-endian uint16 token
// ids, no header. Samples are non-overlapping windows of options.seq_len tokens; each
// position's label is the token after it (see Dataset::FromTokens).
#pragma once
#include <memory>
#include <string>

#include "worker/data/dataset.h"

namespace shoal {
namespace data {

// Maps `path` (read-only; the Dataset keeps the map) and checks every id once.
// options.num_classes is the vocabulary size: every id must be below it. Throws InputError
// naming the file for a file that cannot be opened or mapped, an empty file, an odd byte
// length, fewer than seq_len + 1 tokens (not one window with its targets), or an id >=
// vocab_size (with its byte offset). options.max_samples keeps the first windows only.
std::shared_ptr<Dataset> ReadTokens(const std::string& path, const DatasetOptions& options);

}  // namespace data
}  // namespace shoal
