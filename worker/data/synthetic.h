// Synthetic ImageNet-shaped data for throughput benchmarks: N x C x S x S uint8 images,
// deterministic from the seed.
#pragma once
#include <memory>
#include <string>

#include "worker/data/dataset.h"

namespace shoal {
namespace data {

// A pool of options.synthetic_pool random images, each with a random class, is generated
// once; sample i reuses pool image rows[i] (and its label), so memory and start-up cost
// stay those of the pool while a model can still fit the data. `path` only salts the
// seed, so "train" and "test" differ.
std::shared_ptr<Dataset> MakeSynthetic(const std::string& path, const DatasetOptions& options);

}  // namespace data
}  // namespace shoal
