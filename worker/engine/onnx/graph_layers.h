// The layers an imported ONNX graph is built from, one class per operator family. They
// run on any Backend through its general ops (backend.h), like the zoo's layers.
//
// A node's inputs are of two kinds. Device tensors (activations, parameters) arrive as the
// layer's Model inputs, in the node's input order. Values known before training (shapes,
// axes, pads, the Shape/Gather/Concat chains of an export) arrive through Bind, evaluated
// on the host for the batch size at hand (onnx_import.cc decides which is which).
#pragma once
#include <onnx/onnx_pb.h>

#include <memory>
#include <string>
#include <vector>

#include "worker/engine/layers/layer.h"
#include "worker/engine/onnx/host_value.h"

namespace shoal {

class GraphLayer : public Layer {
 public:
  GraphLayer(Backend& be, const onnx::NodeProto& node, int device_inputs);
  std::string Kind() const override { return kind_; }
  int NumInputs() const override { return n_in_; }
  bool GlobalNames() const override { return true; }
  // host[i]: the value of the node's input i when known before training, else null.
  // Called before OutputShape and Forward whenever the batch size changes.
  virtual void Bind(const std::vector<const HostValue*>& host) { host_ = host; }
  // Further outputs some operators have (layer norm's mean and inverse deviation, batch
  // norm's running statistics in training mode): whether output k exists here, its shape
  // for these inputs, and its value after Forward. No gradient flows back through them.
  virtual bool HasExtraOutput(int k) const {
    (void)k;
    return false;
  }
  virtual Shape ExtraOutputShape(int k, const std::vector<Shape>& in) const;
  virtual Tensor ExtraOutput(int k) const;

 protected:
  // For a layer whose Forward writes its output into y_ (Ensure) and nothing else: the
  // plan may place the output; gradients and what the backward reads stay unknown.
  static BufferUse OutputInY() { return BufferUse{BufferUse::kOwn, BufferUse::kUnknown, true, {}}; }
  const HostValue* Host(int i) const { return i < int(host_.size()) ? host_[size_t(i)] : nullptr; }
  // Tensor `t` with the gradient g of a broadcast operand of shape `s` (summed over what
  // was broadcast); returns g itself when nothing was.
  Tensor ReduceTo(const Tensor& g, const Shape& s, Tensor& buf);

  std::string kind_, where_;
  int n_in_;
  std::vector<const HostValue*> host_;
};

// An initializer the optimizer trains; its node outputs the value, its backward adds the
// gradient from every consumer.
class ParamLayer final : public GraphLayer {
 public:
  ParamLayer(Backend& be, const std::string& name, HostValue init, bool no_weight_decay);
  Shape OutputShape(const std::vector<Shape>& in) const override;
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override;
  void InitParameters(std::mt19937_64& rng) override;

 private:
  HostValue init_;
};

// A value known before training used as a device tensor (a mask, an index list, a float
// constant): uploaded at Bind when it changed.
class ConstLayer final : public GraphLayer {
 public:
  ConstLayer(Backend& be, const std::string& name, const HostValue* value);
  void Bind(const std::vector<const HostValue*>& host) override;
  Shape OutputShape(const std::vector<Shape>& in) const override;
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override;
  void Backward(const std::vector<const Tensor*>&, const Tensor&, bool, std::vector<Tensor>&) override {}

 private:
  const HostValue* value_;
  HostValue uploaded_;
};

// Output k >= 1 of another layer's node, as a node of its own (fed by that node, so it runs
// after it).
class ExtraOutputLayer final : public GraphLayer {
 public:
  ExtraOutputLayer(Backend& be, const onnx::NodeProto& node, GraphLayer* source, int k);
  Shape OutputShape(const std::vector<Shape>& in) const override;
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override;
  void Backward(const std::vector<const Tensor*>&, const Tensor&, bool, std::vector<Tensor>&) override {}
  // The source layer's input shapes, for ExtraOutputShape (set by the importer at Bind).
  void set_source_inputs(std::vector<Shape> in) { source_in_ = std::move(in); }

 private:
  GraphLayer* source_;
  int k_;
  std::vector<Shape> source_in_;
};

// Makes the layer for a node with `device_inputs` device tensors (the rest bound on the
// host). Throws shoal::Error naming the node for operators and attributes not supported.
// node_modes: batch norm and dropout follow the node's training_mode in evaluation too.
std::unique_ptr<GraphLayer> MakeGraphLayer(Backend& be, const onnx::NodeProto& node, int opset, int device_inputs,
                                           uint64_t seed, bool node_modes);
// Which inputs of `op_type` must be known before training (shapes, axes, pads, ratios).
bool IsHostInput(const std::string& op_type, int input, int opset);
// The operators imported graphs may use, for error messages.
const std::vector<std::string>& SupportedOperators();

}  // namespace shoal
