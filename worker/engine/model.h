// Model: a graph of layers with named parameters and gradients, on one Backend.
//
// Build one from the zoo:
//   ModelOptions mo;
//   mo.input_shape = {1, 28, 28};   // one sample, no batch dimension
//   mo.num_classes = 10;
//   mo.zero_gamma_init = true;      // residual nets: last BN of each block starts at γ = 0
//   std::unique_ptr<Model> m = MakeModel("lenet", backend, mo);  // mlp|lenet|resnet20|resnet50
//   m->InitParameters(seed);        // same seed => bit-identical weights on every worker
//
// One training step (x is [N, input_shape...] on the backend's device, labels host int32):
//   m->ZeroGrad();
//   StepResult r = m->TrainStep(x, labels);   // forward + loss + backward
//   r.loss, r.correct                         // mean loss, count of argmax == label
//   for (Parameter& p : m->parameters())      // p.name, p.value, p.grad, p.no_weight_decay
//     optimizer(p.value, p.grad, p.no_weight_decay);
// or by hand: Forward(x, true) -> Backend::SoftmaxCrossEntropy -> Backward(dlogits).
// Evaluation: Forward(x, /*train=*/false) (batch norm uses its running statistics).
// Overlap: set_grad_ready_hook(f) makes Backward call f(first, last) as soon as the
// gradients of parameters()[first, last) are final for this pass (one call per node, in
// reverse graph order), so a caller can start exchanging them while the rest runs.
//
// Parameter and gradient tensors never move: pointers into them (p.value.data<float>())
// stay valid for the model's lifetime. parameters() is in a stable order (graph order,
// then the layer's own order) that is the same on every worker and backend; the flat
// host views below use that order.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "worker/engine/backend.h"
#include "worker/engine/layers/layer.h"
#include "worker/engine/layers/softmax_cross_entropy.h"
#include "worker/engine/memory_plan.h"

namespace shoal {

struct ModelOptions {
  Shape input_shape;  // per sample, e.g. {1,28,28} or {3,32,32}; empty = model default
  int64_t num_classes = 10;
  bool zero_gamma_init = false;
  float label_smoothing = 0.0f;  // used by TrainStep / EvalStep
  // Of every conv and fully connected layer; unset: the model's own default (fan-in uniform
  // for mlp and lenet, as PyTorch's layers; He normal for the ResNets, as torchvision's).
  std::optional<WeightInit> init;
};

// Where one parameter sits in the flat buffers.
struct ParamInfo {
  std::string name;
  Shape shape;
  int64_t numel = 0;
  int64_t offset = 0;  // in floats, into the flat buffer
  bool no_weight_decay = false;
};

struct StepResult {
  float loss = 0;
  int64_t correct = 0;
};

class Model {
 public:
  // input_shape: one sample's shape (no batch dimension).
  Model(Backend& backend, std::string name, Shape input_shape);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // ---- building (the zoo does this). Node 0 is the input.
  static constexpr int kInput = 0;
  // Adds a node fed by `inputs` (node ids); checks shapes now, with batch 2. Returns its id.
  int AddNode(const std::string& name, std::unique_ptr<Layer> layer, std::vector<int> inputs);
  // The same with the output shape the caller computed (an imported graph, whose shapes
  // depend on values bound for the batch it is built at): `shape` at that batch.
  int AddNode(const std::string& name, std::unique_ptr<Layer> layer, std::vector<int> inputs, Shape shape);
  // The last node added is the output (the logits [N, classes]).
  int OutputNodeId() const { return int(nodes_.size()) - 1; }
  // Called by Forward before the layers run whenever the batch size differs from the last
  // call's: imported graphs bind there what their shapes compute for that batch.
  void set_batch_hook(std::function<void(int64_t batch)> hook) { batch_hook_ = std::move(hook); }

  // ---- running
  const Tensor& Forward(const Tensor& x, bool train);
  // The same, in the mode set by Train() / Eval() (training after construction).
  const Tensor& Forward(const Tensor& x) { return Forward(x, training_); }
  void Train() { training_ = true; }
  void Eval() { training_ = false; }
  bool training() const { return training_; }
  // dlogits: gradient of the loss w.r.t. the last Forward(train=true)'s output.
  void Backward(const Tensor& dlogits);
  // Forward(train) + loss + Backward. Does NOT zero gradients (call ZeroGrad first).
  // loss_scale multiplies dlogits (loss scaling: every gradient comes out that many times
  // too large; the caller divides it back); the returned loss is not scaled.
  StepResult TrainStep(const Tensor& x, const int32_t* labels, float loss_scale = 1.0f);
  StepResult EvalStep(const Tensor& x, const int32_t* labels);  // forward only, eval mode
  void ZeroGrad();
  // Called from Backward, on its thread, once per node with parameters (nodes without any
  // too): the range [first, last) of parameters() whose gradients no later part of this
  // Backward touches. Empty = none.
  using GradReadyHook = std::function<void(size_t first, size_t last)>;
  void set_grad_ready_hook(GradReadyHook hook) { grad_ready_ = std::move(hook); }
  void InitParameters(uint64_t seed);
  // Memory reuse (on unless turned off): the layers' outputs and gradients, and the sums of
  // gradients, live in one block where buffers whose lives do not overlap share memory
  // (memory_plan.h), planned again whenever the input's shape changes. Off: every layer
  // keeps buffers of its own. Results are the same bits either way.
  void set_memory_reuse(bool on);
  bool memory_reuse() const { return memory_reuse_; }
  // The plan of the last Forward's input shape (empty with reuse off or before a Forward).
  const MemoryPlan& memory_plan() const { return plan_; }
  // The plan for an input of this shape ([N, sample...]) in a training step (backward) or an
  // evaluation, computed without allocating; shapes, when given, gets every node's output
  // shape. Imported graphs: at the batch bound by the last Forward.
  MemoryPlan PlanFor(const Shape& input, bool backward = true, std::vector<Shape>* shapes = nullptr) const;
  void set_label_smoothing(float s) { loss_.set_smoothing(s); }

  // ---- parameters
  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  std::vector<Buffer>& buffers() { return buffers_; }  // batch-norm running stats
  const std::vector<Buffer>& buffers() const { return buffers_; }
  std::vector<ParamInfo> ParamLayout() const;
  int64_t NumParams() const;  // total floats
  // Values per channel per sample that the layers with running statistics (batch norm)
  // normalize over, at the smallest of them: H x W of the smallest map, 1 for [N,C]
  // inputs; 0 when the model has no such layer. A batch of N gives them N times this.
  int64_t MinStatisticsValues() const;
  // Flat host copies in ParamLayout() order (dst/src hold NumParams() floats).
  void CopyParamsToHost(float* dst) const;
  void CopyParamsFromHost(const float* src);
  void CopyGradsToHost(float* dst) const;
  void CopyGradsFromHost(const float* src);

  const std::string& name() const { return name_; }
  const Shape& input_shape() const { return input_shape_; }
  Shape OutputShape(int64_t batch) const;
  Backend& backend() { return be_; }
  // One line per node: name, kind, output shape for batch 1, parameter count.
  std::string Summary() const;

  // ---- reading the graph (the ONNX exporter), by node id in [0, NumNodes()); node 0 is
  // the input and has no layer. Nodes come in graph order: inputs before their readers.
  int NumNodes() const { return int(nodes_.size()); }
  const std::string& NodeName(int id) const { return NodeAt(id).name; }
  const Layer* NodeLayer(int id) const { return NodeAt(id).layer.get(); }
  const std::vector<int>& NodeInputs(int id) const { return NodeAt(id).inputs; }
  // The node's parameters and buffers in the layer's own order, under the model's names
  // (as in parameters() and buffers()).
  std::vector<const Parameter*> NodeParameters(int id) const;
  std::vector<const Buffer*> NodeBuffers(int id) const;

 private:
  struct Node {
    std::string name;
    std::unique_ptr<Layer> layer;
    std::vector<int> inputs;
    Shape shape1;                             // output shape at batch 1
    size_t param_begin = 0, param_end = 0;    // its parameters in params_
    size_t buffer_begin = 0, buffer_end = 0;  // its buffers in buffers_
  };
  const Node& NodeAt(int id) const;
  const Tensor& Output(int id) const;
  void Accumulate(int id, const Tensor& g);
  void PlanBuffers(const Shape& input, bool backward);
  void UnplaceBuffers();

  Backend& be_;
  std::string name_;
  Shape input_shape_;
  std::vector<Node> nodes_;
  std::vector<Parameter> params_;
  std::vector<Buffer> buffers_;
  std::vector<const Tensor*> outs_;  // per node, from the last Forward
  std::vector<Tensor> grads_, acc_;  // per node: gradient handle, owned sum buffer
  std::vector<std::vector<Tensor>> dx_;
  std::vector<std::vector<const Tensor*>> in_ptrs_;
  Tensor input_;
  bool have_train_forward_ = false;
  bool training_ = true;
  SoftmaxCrossEntropyLoss loss_;
  GradReadyHook grad_ready_;
  std::function<void(int64_t)> batch_hook_;
  int64_t bound_batch_ = 0;
  bool memory_reuse_ = true;
  Shape planned_input_;  // the input shape plan_ is for; empty: none
  MemoryPlan plan_;
  Tensor block_;  // the plan's shared block (kept when a later plan fits)
};

// The zoo: "mlp" (784-256-256-10), "lenet", "resnet20" (CIFAR), "resnet50" (ImageNet).
// Throws shoal::Error naming the model and the known names when unknown, or the input
// shape when it does not fit the model.
std::unique_ptr<Model> MakeModel(const std::string& name, Backend& backend, const ModelOptions& options);
std::vector<std::string> ModelNames();

}  // namespace shoal
