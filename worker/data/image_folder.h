// torchvision's ImageFolder layout: <dir>/<class>/**/<image>.{jpg,jpeg,png} (any case),
// classes sorted by name (byte order) and numbered from 0, images sorted by path within a
// class. Only the file list is read at load; images are decoded per batch (DataLoader).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "worker/data/dataset.h"

namespace shoal {
namespace data {

// `path` is the folder. options.classes set (a test set): the folder must hold exactly
// those classes, numbered as given; a class it lacks or adds is named in the error. An
// empty class folder is an error too. With options.skip_bad each of these is a line on
// stderr and a counted skip instead (an added class's images are left out). Files of
// other types are left out (as torchvision does), with one line saying how many.
// options.max_samples keeps an evenly spread subset (every class, not the first ones).
std::shared_ptr<Dataset> ReadImageFolder(const std::string& path, const DatasetOptions& options);

// Shared by the encoded formats: {channels, image_size, image_size}, checked, and the
// normalization options.mean/stddev or the default for the channel count.
std::vector<int64_t> EncodedSampleShape(const std::string& source, const DatasetOptions& options);
void EncodedNormalization(const std::string& source, const DatasetOptions& options, std::vector<float>* mean,
                          std::vector<float>* stddev);
// Reads the whole of `path` (no gzip detection: images are stored as they are).
void ReadRawFile(const std::string& path, std::vector<uint8_t>* out);
// max_samples > 0 and below n: that many indices spread evenly over [0, n); else empty.
std::vector<int64_t> SpreadSubset(int64_t n, int64_t max_samples);

}  // namespace data
}  // namespace shoal
