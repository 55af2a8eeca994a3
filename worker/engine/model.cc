#include "worker/engine/model.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/error.h"

namespace shoal {

Model::Model(Backend& backend, std::string name, Shape input_shape)
    : be_(backend), name_(std::move(name)), input_shape_(std::move(input_shape)), loss_(backend) {
  Shape s1 = {1};
  s1.insert(s1.end(), input_shape_.begin(), input_shape_.end());
  nodes_.push_back(Node{"input", nullptr, {}, s1});
}

Model::~Model() = default;

int Model::AddNode(const std::string& name, std::unique_ptr<Layer> layer, std::vector<int> inputs) {
  SHOAL_CHECK(layer != nullptr, "Model " + name_ + ": node " + name + " has no layer");
  SHOAL_CHECK(int(inputs.size()) == layer->NumInputs(), "Model " + name_ + ": node " + name + " (" + layer->Kind() +
                                                            ") takes " + std::to_string(layer->NumInputs()) +
                                                            " input(s), given " + std::to_string(inputs.size()));
  std::vector<Shape> in;
  for (int id : inputs) {
    SHOAL_CHECK(id >= 0 && id < int(nodes_.size()),
                "Model " + name_ + ": node " + name + " reads unknown node " + std::to_string(id));
    in.push_back(nodes_[size_t(id)].shape1);
  }
  Shape out;
  try {
    out = layer->OutputShape(in);
  } catch (const Error& e) {
    throw Error("Model " + name_ + ", node " + name + ": " + e.what());
  }
  return AddNode(name, std::move(layer), std::move(inputs), std::move(out));
}

int Model::AddNode(const std::string& name, std::unique_ptr<Layer> layer, std::vector<int> inputs, Shape out) {
  SHOAL_CHECK(layer != nullptr && int(inputs.size()) == layer->NumInputs(),
              "Model " + name_ + ": node " + name + " has no layer or the wrong number of inputs");
  for (int id : inputs)
    SHOAL_CHECK(id >= 0 && id < int(nodes_.size()),
                "Model " + name_ + ": node " + name + " reads unknown node " + std::to_string(id));
  const size_t param_begin = params_.size(), buffer_begin = buffers_.size();
  const bool global = layer->GlobalNames();
  for (Parameter p : layer->params()) {
    if (!global) p.name = name + "." + p.name;
    params_.push_back(std::move(p));
  }
  for (Buffer b : layer->buffers()) {
    if (!global) b.name = name + "." + b.name;
    buffers_.push_back(std::move(b));
  }
  nodes_.push_back(
      Node{name, std::move(layer), std::move(inputs), out, param_begin, params_.size(), buffer_begin, buffers_.size()});
  return int(nodes_.size()) - 1;
}

Shape Model::OutputShape(int64_t batch) const {
  Shape s = nodes_.back().shape1;
  s[0] = batch;
  return s;
}

const Tensor& Model::Forward(const Tensor& x, bool train) {
  SHOAL_CHECK(nodes_.size() > 1, "Model " + name_ + " has no layers");
  SHOAL_CHECK(x.ndim() == int(input_shape_.size()) + 1 &&
                  Shape(x.shape().begin() + 1, x.shape().end()) == input_shape_ && x.dim(0) > 0,
              "Model " + name_ + ": input must be [N," + ShapeString(input_shape_).substr(1) + ", got " +
                  ShapeString(x.shape()));
  if (batch_hook_ && x.dim(0) != bound_batch_) {
    batch_hook_(x.dim(0));
    bound_batch_ = x.dim(0);
  }
  // An evaluation runs in a training step's plan of its shape, or in a plan of its own whose
  // outputs live only to their last reader.
  if (memory_reuse_ && (x.shape() != planned_input_ || (train && !plan_.backward))) PlanBuffers(x.shape(), train);
  input_ = x;
  outs_.assign(nodes_.size(), nullptr);
  in_ptrs_.resize(nodes_.size());
  outs_[0] = &input_;
  for (size_t i = 1; i < nodes_.size(); ++i) {
    Node& n = nodes_[i];
    std::vector<const Tensor*>& in = in_ptrs_[i];
    in.clear();
    for (int id : n.inputs) in.push_back(outs_[size_t(id)]);
    outs_[i] = &n.layer->Forward(in, train);
  }
  have_train_forward_ = train;
  return *outs_.back();
}

void Model::set_memory_reuse(bool on) {
  if (on == memory_reuse_) return;
  memory_reuse_ = on;
  UnplaceBuffers();
  block_ = Tensor();
}

void Model::UnplaceBuffers() {
  for (size_t i = 1; i < nodes_.size(); ++i) {
    Layer& l = *nodes_[i].layer;
    const BufferUse use = l.Buffers();
    if (use.output == BufferUse::kOwn) l.PlaceOutput(Tensor());
    if (use.grads == BufferUse::kOwn)
      for (size_t k = 0; k < nodes_[i].inputs.size(); ++k) l.PlaceInputGrad(k, Tensor());
  }
  acc_.clear();
  dx_.clear();
  grads_.clear();
  plan_ = MemoryPlan();
  planned_input_.clear();
}

MemoryPlan Model::PlanFor(const Shape& input, bool backward, std::vector<Shape>* shapes) const {
  std::vector<Shape> own;
  std::vector<Shape>& out = shapes ? *shapes : own;
  out.assign(nodes_.size(), Shape());
  std::vector<PlanNode> graph(nodes_.size());
  out[0] = input;
  graph[0].output_bytes = NumElements(input) * int64_t(sizeof(float));
  for (size_t i = 1; i < nodes_.size(); ++i) {
    const Node& n = nodes_[i];
    std::vector<Shape> in;
    for (int id : n.inputs) in.push_back(out[size_t(id)]);
    out[i] = n.layer->OutputShape(in);
    PlanNode& p = graph[i];
    p.inputs = n.inputs;
    p.use = n.layer->Buffers();
    p.output_bytes = NumElements(out[i]) * int64_t(sizeof(float));  // layers write fp32 (Layer::Ensure)
    for (int id : n.inputs) p.input_grads |= id != kInput;
  }
  return PlanMemory(graph, int64_t(be_.AllocationAlignment()), backward);
}

void Model::PlanBuffers(const Shape& input, bool backward) {
  UnplaceBuffers();
  std::vector<Shape> shapes;
  try {
    plan_ = PlanFor(input, backward, &shapes);
  } catch (const Error&) {
    plan_ = MemoryPlan();
    plan_.backward = backward;
    planned_input_ = input;
    return;  // a shape only the forward itself finds: every layer keeps buffers of its own
  }
  if (!block_.defined() || int64_t(block_.bytes()) < plan_.block_bytes) {
    block_ = Tensor();  // the old block goes back before the new one is taken
    block_ = be_.Empty({(plan_.block_bytes + 3) / 4});
  }
  auto view = [&](int64_t offset, const Shape& s) { return block_.Slice(offset, s); };
  acc_.assign(nodes_.size(), Tensor());
  for (size_t i = 1; i < nodes_.size(); ++i) {
    Layer& l = *nodes_[i].layer;
    if (plan_.output[i] != MemoryPlan::kNotPlaced) l.PlaceOutput(view(plan_.output[i], shapes[i]));
    for (size_t k = 0; k < nodes_[i].inputs.size(); ++k)
      if (plan_.input_grad[i][k] != MemoryPlan::kNotPlaced)
        l.PlaceInputGrad(k, view(plan_.input_grad[i][k], shapes[size_t(nodes_[i].inputs[k])]));
    if (plan_.grad_sum[i] != MemoryPlan::kNotPlaced) acc_[i] = view(plan_.grad_sum[i], shapes[i]);
  }
  planned_input_ = input;
}

void Model::Accumulate(int id, const Tensor& g) {
  Tensor& cur = grads_[size_t(id)];
  if (!cur.defined()) {
    cur = g;
    return;
  }
  // A second consumer: sum into a buffer this node owns (cur may alias another layer's
  // buffer, which must not be written).
  Tensor& acc = acc_[size_t(id)];
  if (!acc.defined() || acc.shape() != g.shape()) acc = be_.Empty(g.shape());
  if (cur.raw() == acc.raw()) {
    be_.Axpy(1.0f, g, acc);
  } else {
    be_.Add(cur, g, acc);
    cur = acc;
  }
}

void Model::Backward(const Tensor& dlogits) {
  SHOAL_CHECK(have_train_forward_, "Model " + name_ + ": Backward needs a Forward(x, train=true) first");
  SHOAL_CHECK(dlogits.shape() == outs_.back()->shape(), "Model " + name_ + ": dlogits " + ShapeString(dlogits.shape()) +
                                                            " does not match the output " +
                                                            ShapeString(outs_.back()->shape()));
  grads_.assign(nodes_.size(), Tensor());
  acc_.resize(nodes_.size());
  dx_.resize(nodes_.size());
  grads_.back() = dlogits;
  for (size_t i = nodes_.size() - 1; i >= 1; --i) {
    Node& n = nodes_[i];
    if (!grads_[i].defined()) {  // feeds nothing that reaches the output: its gradients stay zero
      if (grad_ready_ && n.param_end > n.param_begin) grad_ready_(n.param_begin, n.param_end);
      continue;
    }
    bool need_dx = false;
    for (int id : n.inputs) need_dx |= id != kInput;
    std::vector<Tensor>& dx = dx_[i];
    dx.assign(n.inputs.size(), Tensor());
    n.layer->Backward(in_ptrs_[i], grads_[i], need_dx, dx);
    for (size_t j = 0; j < n.inputs.size(); ++j)
      if (n.inputs[j] != kInput && dx[j].defined()) Accumulate(n.inputs[j], dx[j]);
    grads_[i] = Tensor();  // drop the handle: the buffer may be reused by its owner
    // A node's parameters belong to it alone, so their gradients are final now.
    if (grad_ready_ && n.param_end > n.param_begin) grad_ready_(n.param_begin, n.param_end);
  }
}

StepResult Model::TrainStep(const Tensor& x, const int32_t* labels, float loss_scale) {
  const Tensor& logits = Forward(x, true);
  StepResult r;
  r.loss = loss_.Forward(logits, labels, true, &r.correct);
  if (loss_scale != 1.0f) {
    Tensor dlogits = loss_.grad();  // the loss's own buffer, refilled by its next Forward
    be_.Scale(loss_scale, dlogits);
  }
  Backward(loss_.grad());
  return r;
}

StepResult Model::EvalStep(const Tensor& x, const int32_t* labels) {
  const Tensor& logits = Forward(x, false);
  StepResult r;
  r.loss = loss_.Forward(logits, labels, false, &r.correct);
  return r;
}

void Model::ZeroGrad() {
  for (Parameter& p : params_) be_.Fill(p.grad, 0.0f);
}

void Model::InitParameters(uint64_t seed) {
  // One stream per node, seeded from the seed and the node's position, so adding a node
  // at the end does not change the others' draws.
  for (size_t i = 1; i < nodes_.size(); ++i) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + i);
    nodes_[i].layer->InitParameters(rng);
  }
  ZeroGrad();
}

std::vector<ParamInfo> Model::ParamLayout() const {
  std::vector<ParamInfo> out;
  int64_t off = 0;
  for (const Parameter& p : params_) {
    out.push_back(ParamInfo{p.name, p.value.shape(), p.value.numel(), off, p.no_weight_decay});
    off += p.value.numel();
  }
  return out;
}

int64_t Model::MinStatisticsValues() const {
  int64_t least = 0;
  for (const Node& n : nodes_) {
    if (!n.layer || n.layer->buffers().empty()) continue;
    int64_t area = 1;  // the output has the input's shape: [1, C, H, W] or [1, C]
    for (size_t d = 2; d < n.shape1.size(); ++d) area *= n.shape1[d];
    least = least == 0 ? area : std::min(least, area);
  }
  return least;
}

int64_t Model::NumParams() const {
  int64_t n = 0;
  for (const Parameter& p : params_) n += p.value.numel();
  return n;
}

void Model::CopyParamsToHost(float* dst) const {
  for (const Parameter& p : params_) {
    be_.CopyToHost(p.value, dst);
    dst += p.value.numel();
  }
}

void Model::CopyParamsFromHost(const float* src) {
  for (Parameter& p : params_) {
    be_.CopyFromHost(p.value, src);
    src += p.value.numel();
  }
}

void Model::CopyGradsToHost(float* dst) const {
  for (const Parameter& p : params_) {
    be_.CopyToHost(p.grad, dst);
    dst += p.grad.numel();
  }
}

void Model::CopyGradsFromHost(const float* src) {
  for (Parameter& p : params_) {
    be_.CopyFromHost(p.grad, src);
    src += p.grad.numel();
  }
}

const Model::Node& Model::NodeAt(int id) const {
  SHOAL_CHECK(id >= 0 && id < int(nodes_.size()),
              "Model " + name_ + ": no node " + std::to_string(id) + " (it has " + std::to_string(nodes_.size()) + ")");
  return nodes_[size_t(id)];
}

std::vector<const Parameter*> Model::NodeParameters(int id) const {
  const Node& n = NodeAt(id);
  std::vector<const Parameter*> out;
  for (size_t i = n.param_begin; i < n.param_end; ++i) out.push_back(&params_[i]);
  return out;
}

std::vector<const Buffer*> Model::NodeBuffers(int id) const {
  const Node& n = NodeAt(id);
  std::vector<const Buffer*> out;
  for (size_t i = n.buffer_begin; i < n.buffer_end; ++i) out.push_back(&buffers_[i]);
  return out;
}

std::string Model::Summary() const {
  std::ostringstream os;
  os << name_ << " on " << be_.Name() << ", " << NumParams() << " parameters\n";
  for (size_t i = 1; i < nodes_.size(); ++i) {
    int64_t n = 0;
    for (Parameter& p : nodes_[i].layer->params()) n += p.value.numel();
    os << "  " << nodes_[i].name << " " << nodes_[i].layer->Kind() << " " << ShapeString(nodes_[i].shape1) << " " << n
       << "\n";
  }
  return os.str();
}

}  // namespace shoal
