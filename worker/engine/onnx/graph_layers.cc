// GraphLayer, parameters, constants, elementwise operators and views; the factory.
#include "worker/engine/onnx/graph_layers.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/error.h"
#include "worker/engine/onnx/attrs.h"
#include "worker/engine/onnx/layer_families.h"

namespace shoal {

GraphLayer::GraphLayer(Backend& be, const onnx::NodeProto& node, int device_inputs)
    : Layer(be), kind_(node.op_type()), where_(NodeWhere(node)), n_in_(device_inputs) {}

Tensor GraphLayer::ReduceTo(const Tensor& g, const Shape& s, Tensor& buf) {
  if (g.shape() == s) return g;
  Ensure(buf, s);
  be_.ReduceSum(g, buf);
  return buf;
}

Shape GraphLayer::ExtraOutputShape(int k, const std::vector<Shape>&) const {
  throw Error(where_ + ": has no output " + std::to_string(k) + " here");
}

Tensor GraphLayer::ExtraOutput(int k) const { throw Error(where_ + ": has no output " + std::to_string(k) + " here"); }

ExtraOutputLayer::ExtraOutputLayer(Backend& be, const onnx::NodeProto& node, GraphLayer* source, int k)
    : GraphLayer(be, node, 1), source_(source), k_(k) {}

Shape ExtraOutputLayer::OutputShape(const std::vector<Shape>&) const {
  return source_->ExtraOutputShape(k_, source_in_);
}

const Tensor& ExtraOutputLayer::Forward(const std::vector<const Tensor*>&, bool) {
  y_ = source_->ExtraOutput(k_);
  return y_;
}

// ---------------------------------------------------------------- parameters, constants

namespace {
onnx::NodeProto NamedNode(const std::string& op, const std::string& name) {
  onnx::NodeProto n;
  n.set_op_type(op);
  n.set_name(name);
  return n;
}
}  // namespace

ParamLayer::ParamLayer(Backend& be, const std::string& name, HostValue init, bool no_weight_decay)
    : GraphLayer(be, NamedNode("Initializer", name), 0), init_(std::move(init)) {
  AddParam(name, init_.shape, no_weight_decay);
  std::mt19937_64 unused;
  InitParameters(unused);
}

Shape ParamLayer::OutputShape(const std::vector<Shape>&) const { return init_.shape; }

const Tensor& ParamLayer::Forward(const std::vector<const Tensor*>&, bool) { return params_[0].value; }

void ParamLayer::Backward(const std::vector<const Tensor*>&, const Tensor& dy, bool, std::vector<Tensor>&) {
  be_.Axpy(1.0f, dy, params_[0].grad);
}

void ParamLayer::InitParameters(std::mt19937_64&) {
  // The file's weights are the start: the same on every worker, whatever the seed.
  std::vector<float> f(init_.v.begin(), init_.v.end());
  be_.CopyFromHost(params_[0].value, f.data());
}

ConstLayer::ConstLayer(Backend& be, const std::string& name, const HostValue* value)
    : GraphLayer(be, NamedNode("Constant", name), 0), value_(value) {}

void ConstLayer::Bind(const std::vector<const HostValue*>&) {
  if (y_.defined() && uploaded_ == *value_) return;
  uploaded_ = *value_;
  y_ = be_.Empty(uploaded_.shape);
  std::vector<float> f(uploaded_.v.begin(), uploaded_.v.end());
  be_.CopyFromHost(y_, f.data());
}

Shape ConstLayer::OutputShape(const std::vector<Shape>&) const { return value_->shape; }

const Tensor& ConstLayer::Forward(const std::vector<const Tensor*>&, bool) { return y_; }

// ---------------------------------------------------------------- elementwise

namespace {

class UnaryLayer final : public GraphLayer {
 public:
  UnaryLayer(Backend& be, const onnx::NodeProto& n, UnaryOp op, float a, float b)
      : GraphLayer(be, n, 1), op_(op), a_(a), b_(b) {}
  Shape OutputShape(const std::vector<Shape>& in) const override { return in[0]; }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    Ensure(y_, x[0]->shape());
    be_.Unary(op_, *x[0], y_, a_, b_);
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    Tensor& g = InputGrad(0, x[0]->shape());
    be_.UnaryBackward(op_, *x[0], y_, dy, g, a_, b_);
    dx[0] = g;
  }
  BufferUse Buffers() const override { return BufferUse{BufferUse::kOwn, BufferUse::kOwn, true, {}}; }
  // Clip's bounds may come as inputs known before training.
  void Bind(const std::vector<const HostValue*>& host) override {
    GraphLayer::Bind(host);
    if (op_ != UnaryOp::kClip) return;
    if (const HostValue* lo = Host(1)) a_ = float(lo->v.at(0));
    if (const HostValue* hi = Host(2)) b_ = float(hi->v.at(0));
  }

 private:
  UnaryOp op_;
  float a_, b_;
};

class BinaryLayer final : public GraphLayer {
 public:
  BinaryLayer(Backend& be, const onnx::NodeProto& n, BinaryOp op) : GraphLayer(be, n, 2), op_(op) {}
  Shape OutputShape(const std::vector<Shape>& in) const override { return BroadcastShapes(in[0], in[1], where_); }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    Ensure(y_, OutputShape({x[0]->shape(), x[1]->shape()}));
    be_.Binary(op_, *x[0], *x[1], y_);
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    const Tensor &a = *x[0], &b = *x[1];
    switch (op_) {
      case BinaryOp::kAdd:
        dx[0] = ReduceTo(dy, a.shape(), ra_);
        dx[1] = ReduceTo(dy, b.shape(), rb_);
        return;
      case BinaryOp::kSub:
        dx[0] = ReduceTo(dy, a.shape(), ra_);
        Ensure(t1_, dy.shape());
        be_.Unary(UnaryOp::kNeg, dy, t1_);
        dx[1] = ReduceTo(t1_, b.shape(), rb_);
        return;
      case BinaryOp::kMul:
        Ensure(t1_, dy.shape());
        Ensure(t2_, dy.shape());
        be_.Binary(BinaryOp::kMul, dy, b, t1_);
        be_.Binary(BinaryOp::kMul, dy, a, t2_);
        dx[0] = ReduceTo(t1_, a.shape(), ra_);
        dx[1] = ReduceTo(t2_, b.shape(), rb_);
        return;
      case BinaryOp::kDiv:  // d/da = 1/b, d/db = -y/b
        Ensure(t1_, dy.shape());
        Ensure(t2_, dy.shape());
        be_.Binary(BinaryOp::kDiv, dy, b, t1_);
        be_.Binary(BinaryOp::kMul, t1_, y_, t2_);
        be_.Unary(UnaryOp::kNeg, t2_, t2_);
        dx[0] = ReduceTo(t1_, a.shape(), ra_);
        dx[1] = ReduceTo(t2_, b.shape(), rb_);
        return;
      case BinaryOp::kPow: {  // d/da = b a^(b-1), d/db = y ln a
        Ensure(t1_, dy.shape());
        Ensure(t2_, dy.shape());
        Ensure(bm1_, b.shape());
        be_.Unary(UnaryOp::kAffine, b, bm1_, 1.0f, -1.0f);
        be_.Binary(BinaryOp::kPow, a, bm1_, t1_);
        be_.Binary(BinaryOp::kMul, t1_, b, t1_);
        be_.Binary(BinaryOp::kMul, t1_, dy, t1_);
        dx[0] = ReduceTo(t1_, a.shape(), ra_);
        Ensure(loga_, a.shape());
        be_.Unary(UnaryOp::kLog, a, loga_);
        be_.Binary(BinaryOp::kMul, y_, loga_, t2_);
        be_.Binary(BinaryOp::kMul, t2_, dy, t2_);
        dx[1] = ReduceTo(t2_, b.shape(), rb_);
        return;
      }
      default:  // comparisons: no gradient
        return;
    }
  }
  // Gradients are dy itself or buffers of its own (a broadcast operand's sum, a product).
  BufferUse Buffers() const override { return BufferUse{BufferUse::kOwn, BufferUse::kUnknown, true, {}}; }

 private:
  BinaryOp op_;
  Tensor t1_, t2_, ra_, rb_, bm1_, loga_;
};

class WhereLayer final : public GraphLayer {
 public:
  WhereLayer(Backend& be, const onnx::NodeProto& n) : GraphLayer(be, n, 3) { zero_ = be.Zeros({1}); }
  Shape OutputShape(const std::vector<Shape>& in) const override {
    return BroadcastShapes(BroadcastShapes(in[0], in[1], where_), in[2], where_);
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    Ensure(y_, OutputShape({x[0]->shape(), x[1]->shape(), x[2]->shape()}));
    be_.Where(*x[0], *x[1], *x[2], y_);
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    Ensure(t1_, dy.shape());
    Ensure(t2_, dy.shape());
    be_.Where(*x[0], dy, zero_, t1_);
    be_.Where(*x[0], zero_, dy, t2_);
    dx[1] = ReduceTo(t1_, x[1]->shape(), ra_);
    dx[2] = ReduceTo(t2_, x[2]->shape(), rb_);
  }

 private:
  Tensor zero_, t1_, t2_, ra_, rb_;
};

// Reshape, Flatten, Squeeze, Unsqueeze, Identity, Cast to float, inference Dropout: the
// same elements under another shape (no copy).
class ViewLayer final : public GraphLayer {
 public:
  ViewLayer(Backend& be, const onnx::NodeProto& n, int opset) : GraphLayer(be, n, 1), node_(n), opset_(opset) {}
  Shape OutputShape(const std::vector<Shape>& in) const override {
    std::vector<const HostValue*> args{nullptr};
    for (int i = 1; i < node_.input_size(); ++i) args.push_back(Host(i));
    return ViewShape(node_, opset_, in[0], args);
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    y_ = x[0]->Reshape(OutputShape({x[0]->shape()}));
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (need_dx) dx[0] = dy.Reshape(x[0]->shape());
  }
  BufferUse Buffers() const override { return BufferUse{BufferUse::kView, BufferUse::kView, false, {false}}; }

 private:
  onnx::NodeProto node_;
  int opset_;
};

}  // namespace

// ---------------------------------------------------------------- the factory

namespace {

const std::map<std::string, UnaryOp>& UnaryOps() {
  static const std::map<std::string, UnaryOp> m = {{"Relu", UnaryOp::kRelu}, {"LeakyRelu", UnaryOp::kLeakyRelu},
                                                   {"Clip", UnaryOp::kClip}, {"Sigmoid", UnaryOp::kSigmoid},
                                                   {"Tanh", UnaryOp::kTanh}, {"Erf", UnaryOp::kErf},
                                                   {"Sqrt", UnaryOp::kSqrt}, {"Exp", UnaryOp::kExp},
                                                   {"Log", UnaryOp::kLog},   {"Neg", UnaryOp::kNeg},
                                                   {"Abs", UnaryOp::kAbs},   {"Reciprocal", UnaryOp::kReciprocal}};
  return m;
}

const std::map<std::string, BinaryOp>& BinaryOps() {
  static const std::map<std::string, BinaryOp> m = {
      {"Add", BinaryOp::kAdd}, {"Sub", BinaryOp::kSub},     {"Mul", BinaryOp::kMul},   {"Div", BinaryOp::kDiv},
      {"Pow", BinaryOp::kPow}, {"Equal", BinaryOp::kEqual}, {"Less", BinaryOp::kLess}, {"Greater", BinaryOp::kGreater}};
  return m;
}

}  // namespace

bool IsHostInput(const std::string& op, int i, int opset) {
  if (op == "Reshape" || op == "Expand" || op == "Tile") return i == 1;
  if (op == "Unsqueeze" || op == "Squeeze") return i == 1 && opset >= 13;
  if (op == "Slice") return i >= 1;
  if (op == "Split") return i == 1;
  if (op == "Pad") return i >= 1;
  if (op == "Clip") return i >= 1;
  if (op == "Dropout") return i >= 1;
  if (op == "ReduceSum" || op == "ReduceMean") return i == 1;
  if (op == "ConstantOfShape" || op == "Range" || op == "Shape" || op == "Size") return true;
  return false;
}

const std::vector<std::string>& SupportedOperators() {
  static const std::vector<std::string> ops = [] {
    std::vector<std::string> v;
    for (const auto& [k, op] : UnaryOps()) v.push_back(k);
    for (const auto& [k, op] : BinaryOps()) v.push_back(k);
    for (const char* k : {"Where", "Identity", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze"}) v.push_back(k);
    for (const std::string& k : TensorLayerOps()) v.push_back(k);
    for (const std::string& k : NnLayerOps()) v.push_back(k);
    for (const std::string& k : PoolLayerOps()) v.push_back(k);
    for (const char* k : {"Constant", "ConstantOfShape", "Shape", "Size", "Range"}) v.push_back(k);
    std::sort(v.begin(), v.end());
    return v;
  }();
  return ops;
}

std::unique_ptr<GraphLayer> MakeGraphLayer(Backend& be, const onnx::NodeProto& n, int opset, int device_inputs,
                                           uint64_t seed, bool node_modes) {
  const std::string& op = n.op_type();
  if (auto it = UnaryOps().find(op); it != UnaryOps().end()) {
    float a = 0, b = 0;
    if (op == "LeakyRelu") a = AttrFloat(n, "alpha", 0.01f);
    if (op == "Clip") {  // opset < 11: attributes; later: inputs bound at Bind
      a = AttrFloat(n, "min", -INFINITY);
      b = AttrFloat(n, "max", INFINITY);
    }
    return std::make_unique<UnaryLayer>(be, n, it->second, a, b);
  }
  if (auto it = BinaryOps().find(op); it != BinaryOps().end()) {
    SHOAL_CHECK(device_inputs == 2, NodeWhere(n) + ": expected two tensor inputs");
    return std::make_unique<BinaryLayer>(be, n, it->second);
  }
  if (op == "Where") return std::make_unique<WhereLayer>(be, n);
  if (op == "Cast") {
    const int64_t to = AttrInt(n, "to", onnx::TensorProto::FLOAT);
    SHOAL_CHECK(to == onnx::TensorProto::FLOAT || to == onnx::TensorProto::DOUBLE,
                NodeWhere(n) + ": casting a tensor computed during training to type " + std::to_string(to) +
                    " is not supported (tensors are fp32; only casts to float are)");
    return std::make_unique<ViewLayer>(be, n, opset);
  }
  if (op == "Identity" || op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze")
    return std::make_unique<ViewLayer>(be, n, opset);
  if (auto l = MakeTensorLayer(be, n, opset, device_inputs)) return l;
  if (auto l = MakeNnLayer(be, n, opset, device_inputs, seed, node_modes)) return l;
  if (auto l = MakePoolLayer(be, n)) return l;
  std::string list;
  for (const std::string& s : SupportedOperators()) list += (list.empty() ? "" : ", ") + s;
  throw Error(NodeWhere(n) + ": operator " + op + " is not supported; supported: " + list);
}

}  // namespace shoal
