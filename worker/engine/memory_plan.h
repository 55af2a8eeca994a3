// PlanMemory: the activation and gradient buffers of one training step placed in one
// shared block by liveness, so buffers whose lives do not overlap share memory.
//
// A step runs every node's forward in graph order (time i for node i), the loss (time n),
// then every node's backward in reverse order (time 2n - i). A buffer lives from the
// time it is written to the last time it is read:
//   - a node's output, from its forward to the last forward that reads it, the backward of
//     every reader that reads it (BufferUse::reads_input) and its own backward when that
//     reads it (reads_output); the model's output to the end of the step;
//   - a gradient buffer a node's backward writes for an input, to that input's backward;
//   - the sum of the gradients from several readers of one output (Model's accumulation
//     buffer), from the second reader's backward to the output's node's backward.
// Views extend the life of what they view: a view output or gradient is read as the
// buffers it may point into, and a layer that promises nothing (BufferUse::kUnknown) may
// point into any of its inputs (output) or into dy (gradients).
//
// A plan for evaluation (no backward) keeps outputs alive only to their last forward reader.
//
// Buffers are then placed greedily, largest first, each at the lowest offset free of every
// placed buffer it is alive with. The plan is a property of the graph and the batch, the
// same on every backend but for the alignment.
#pragma once
#include <cstdint>
#include <vector>

#include "worker/engine/layers/layer.h"

namespace shoal {

// One node of a model's graph; node 0 is the input (no layer, never placed).
struct PlanNode {
  std::vector<int> inputs;   // node ids, each below this node's
  BufferUse use;             // what the layer promises
  int64_t output_bytes = 0;  // at the planned batch
  bool input_grads = false;  // its backward writes input gradients (it has an input that is not node 0)
};

struct MemoryPlan {
  static constexpr int64_t kNotPlaced = -1;  // the layer's (or model's) own buffer
  // Offsets into the shared block, in bytes, or kNotPlaced.
  std::vector<int64_t> output;                   // per node
  std::vector<std::vector<int64_t>> input_grad;  // per node, per input
  std::vector<int64_t> grad_sum;                 // per node
  int64_t block_bytes = 0;                       // the shared block
  int64_t buffer_bytes = 0;                      // the placed buffers one by one (what they take unshared)
  int buffers = 0;                               // how many were placed
  bool backward = false;                         // planned for a training step (else forwards only)
};

// alignment: every buffer's size is rounded up to it and its offset is a multiple of it
// (the backend's AllocationAlignment, so that unshared the buffers would take buffer_bytes).
// backward: plan a training step; false, forwards only (evaluation).
MemoryPlan PlanMemory(const std::vector<PlanNode>& nodes, int64_t alignment, bool backward = true);

}  // namespace shoal
