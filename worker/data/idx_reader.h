// IDX files (MNIST, Fashion-MNIST, EMNIST...): uint8 images N x H x W and uint8 labels N.
#pragma once
#include <memory>
#include <string>

#include "worker/data/dataset.h"

namespace shoal {
namespace data {

// `path` is a prefix such as /usr/share/datasets/fashion-mnist/train, read as
// <prefix>-images-idx3-ubyte[.gz] + <prefix>-labels-idx1-ubyte[.gz] (also the
// <prefix>-images.idx3-ubyte spelling), or the exact path of the images file, whose
// labels file is found by the same naming. Gzip or plain. Checks magic numbers, element
// type, dimensions, that images and labels agree in count, that each file holds exactly
// the bytes its header promises, and the label range; every error names the file.
std::shared_ptr<Dataset> ReadIdx(const std::string& path, const DatasetOptions& options);

}  // namespace data
}  // namespace shoal
