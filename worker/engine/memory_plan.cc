#include "worker/engine/memory_plan.h"

#include <algorithm>

#include "common/error.h"

namespace shoal {
namespace {

struct Life {
  int64_t bytes;
  int first, last;
};

// The buffers a value may point into (placed ones only: the others need no life).
using Lives = std::vector<int>;

Lives Union(Lives a, const Lives& b) {
  for (int id : b)
    if (std::find(a.begin(), a.end(), id) == a.end()) a.push_back(id);
  return a;
}

// Offsets for every life: largest first, each at the lowest offset where it overlaps no
// placed buffer alive at the same time.
std::vector<int64_t> Place(const std::vector<Life>& lives, int64_t* block_bytes) {
  std::vector<size_t> order(lives.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lives[a].bytes > lives[b].bytes; });
  std::vector<int64_t> offset(lives.size(), -1);
  std::vector<size_t> placed;
  *block_bytes = 0;
  for (size_t i : order) {
    const Life& l = lives[i];
    std::vector<std::pair<int64_t, int64_t>> busy;  // [begin, end) of buffers alive with it
    for (size_t j : placed)
      if (lives[j].first <= l.last && l.first <= lives[j].last)
        busy.emplace_back(offset[j], offset[j] + lives[j].bytes);
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& b : busy) {
      if (b.first >= at + l.bytes) break;
      at = std::max(at, b.second);
    }
    offset[i] = at;
    placed.push_back(i);
    *block_bytes = std::max(*block_bytes, at + l.bytes);
  }
  return offset;
}

}  // namespace

MemoryPlan PlanMemory(const std::vector<PlanNode>& nodes, int64_t alignment, bool backward) {
  SHOAL_CHECK(alignment > 0, "PlanMemory: alignment must be positive");
  const int n = int(nodes.size());
  std::vector<Life> lives;
  auto make = [&](int64_t bytes, int t) {
    lives.push_back(Life{(std::max<int64_t>(bytes, 1) + alignment - 1) / alignment * alignment, t, t});
    return int(lives.size()) - 1;
  };
  auto read = [&](const Lives& s, int t) {
    for (int id : s) lives[size_t(id)].last = std::max(lives[size_t(id)].last, t);
  };
  const int end = 2 * n + 1;  // after the last backward: the loss and the caller read the output
  auto back = [&](int i) { return 2 * n - i; };

  // Which life each placed buffer got; mapped to offsets at the end.
  std::vector<int> out_life(static_cast<size_t>(n), -1), sum_life(static_cast<size_t>(n), -1);
  std::vector<std::vector<int>> grad_life(static_cast<size_t>(n));

  // ---- forward: outputs
  std::vector<Lives> out(static_cast<size_t>(n));
  for (int i = 1; i < n; ++i) {
    const PlanNode& node = nodes[size_t(i)];
    for (int in : node.inputs) {
      SHOAL_CHECK(in >= 0 && in < i, "PlanMemory: node " + std::to_string(i) + " reads node " + std::to_string(in));
      read(out[size_t(in)], i);
    }
    switch (node.use.output) {
      case BufferUse::kOwn:
        out_life[size_t(i)] = make(node.output_bytes, i);
        out[size_t(i)] = {out_life[size_t(i)]};
        break;
      case BufferUse::kView:
        SHOAL_CHECK(!node.inputs.empty(), "PlanMemory: node " + std::to_string(i) + " is a view of no input");
        out[size_t(i)] = out[size_t(node.inputs[0])];
        break;
      case BufferUse::kUnknown:
        for (int in : node.inputs) out[size_t(i)] = Union(out[size_t(i)], out[size_t(in)]);
        break;
    }
  }
  if (n > 1) read(out[size_t(n - 1)], end);

  // ---- what each backward reads of the forward
  for (int i = 1; i < n && backward; ++i) {
    const PlanNode& node = nodes[size_t(i)];
    for (size_t k = 0; k < node.inputs.size(); ++k)
      if (node.use.ReadsInput(k)) read(out[size_t(node.inputs[k])], back(i));
    if (node.use.reads_output) read(out[size_t(i)], back(i));
  }

  // ---- backward: gradients
  std::vector<Lives> grad(static_cast<size_t>(n));
  std::vector<bool> has(static_cast<size_t>(n), false);
  if (n > 1) has[size_t(n - 1)] = backward;  // dlogits: the loss's own buffer
  for (int i = n - 1; i >= 1; --i) {
    if (!has[size_t(i)]) continue;
    const PlanNode& node = nodes[size_t(i)];
    const int t = back(i);
    read(grad[size_t(i)], t);
    grad_life[size_t(i)].assign(node.inputs.size(), -1);
    if (!node.input_grads) continue;
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const int in = node.inputs[k];
      Lives g = grad[size_t(i)];  // kView, kUnknown: dy's buffers (kUnknown's own need no life)
      if (node.use.grads == BufferUse::kOwn) {
        grad_life[size_t(i)][k] = make(nodes[size_t(in)].output_bytes, t);
        g = {grad_life[size_t(i)][k]};
      }
      if (in == 0) continue;
      if (!has[size_t(in)]) {
        has[size_t(in)] = true;
        grad[size_t(in)] = g;
        continue;
      }
      // a further reader: summed into the node's accumulation buffer now
      read(grad[size_t(in)], t);
      read(g, t);
      if (sum_life[size_t(in)] < 0) sum_life[size_t(in)] = make(nodes[size_t(in)].output_bytes, t);
      grad[size_t(in)] = {sum_life[size_t(in)]};
    }
  }

  MemoryPlan plan;
  const std::vector<int64_t> offset = Place(lives, &plan.block_bytes);
  auto at = [&](int life) { return life < 0 ? MemoryPlan::kNotPlaced : offset[size_t(life)]; };
  plan.output.resize(size_t(n));
  plan.grad_sum.resize(size_t(n));
  plan.input_grad.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    plan.output[size_t(i)] = at(out_life[size_t(i)]);
    plan.grad_sum[size_t(i)] = at(sum_life[size_t(i)]);
    plan.input_grad[size_t(i)].assign(nodes[size_t(i)].inputs.size(), MemoryPlan::kNotPlaced);
    for (size_t k = 0; k < grad_life[size_t(i)].size(); ++k)
      plan.input_grad[size_t(i)][k] = at(grad_life[size_t(i)][k]);
  }
  for (const Life& l : lives) plan.buffer_bytes += l.bytes;
  plan.buffers = int(lives.size());
  plan.backward = backward;
  return plan;
}

}  // namespace shoal
