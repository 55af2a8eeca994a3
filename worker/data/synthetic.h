// Synthetic ImageNet-shaped data for throughput benchmarks: N x C x S x S uint8 images,
// deterministic from the seed.
#pragma once
#include <memory>
#include <string>

#include "worker/data/dataset.h"

namespace shoal {
namespace data {

// A pool of options.synthetic_pool random images, each with a random class, is generated
// once from the seed; sample i reuses pool image rows[i] (and its label), so memory and
// start-up cost stay those of the pool. `path` salts only the draw of rows, so "train"
// and "test" are different samples of the same pool: a model that fits the training set
// scores on the test set too, which lets end-to-end runs on synthetic data show learning.
std::shared_ptr<Dataset> MakeSynthetic(const std::string& path, const DatasetOptions& options);

}  // namespace data
}  // namespace shoal
