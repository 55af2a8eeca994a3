// WebDataset: tar shards whose members are grouped into samples by basename (the name up
// to the first dot of its last path component): xxx.jpg | xxx.jpeg | xxx.png with xxx.cls
// (the class number as text). At load every shard's headers are scanned once (the image
// members are skipped over, only .cls members are read), so that the DataLoader can give
// each worker its contiguous run of the epoch's shard order and read it front to back.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "worker/data/dataset.h"

namespace shoal {
namespace data {

// Brace expansion as the webdataset library does it: "train-{000000..000127}.tar" (a
// numeric range, zero-padded to the width of its bounds), "{a,b,c}" (a list), several
// groups multiply out. Throws Error for an unbalanced brace or a range of more than 10^7.
std::vector<std::string> ExpandBraces(const std::string& pattern);

// `path`: a shard pattern (ExpandBraces), or several separated by spaces. A missing shard, a
// corrupt tar header, a member cut short by the end of the file, a sample without its
// image or its .cls, or a .cls that is no class number is an error naming the shard (and
// member); with options.skip_bad, a line on stderr and a counted skip (a cut-short
// member ends its shard). Labels must be below options.num_classes when set, else the
// class count is the largest label + 1.
std::shared_ptr<Dataset> ReadWebDataset(const std::string& path, const DatasetOptions& options);

}  // namespace data
}  // namespace shoal
