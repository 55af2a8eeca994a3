// Layers of network operators: Conv, Gemm, MatMul, BatchNormalization,
// LayerNormalization, Softmax, LogSoftmax, Dropout (the pools: pool_layers.cc).
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "worker/engine/onnx/attrs.h"
#include "worker/engine/onnx/layer_families.h"
#include "worker/engine/onnx/window.h"

namespace shoal {
namespace {

// Zero padding written out, for uneven padding the backends' symmetric kernels cannot do.
struct ExplicitPad {
  Shape padded;
  StridedView inner;
  void Plan(const Shape& x4, const Window& w) {
    padded = {x4[0], x4[1], x4[2] + w.pb[0] + w.pe[0], x4[3] + w.pb[1] + w.pe[1]};
    inner = StridedView{0, ContiguousStrides(padded)};
    inner.offset = w.pb[0] * inner.strides[2] + w.pb[1] * inner.strides[3];
  }
};

class ConvLayer final : public GraphLayer {
 public:
  ConvLayer(Backend& be, const onnx::NodeProto& n, int inputs) : GraphLayer(be, n, inputs), node_(n) {
    groups_ = AttrInt(n, "group", 1);
    SHOAL_CHECK(groups_ >= 1, where_ + ": group must be >= 1");
  }
  Shape OutputShape(const std::vector<Shape>& in) const override {
    SHOAL_CHECK(in[1].size() == in[0].size(),
                where_ + ": weights " + ShapeString(in[1]) + " and input " + ShapeString(in[0]) + " differ in rank");
    const Shape x4 = As4d(in[0], where_);
    SHOAL_CHECK(x4[1] == in[1][1] * groups_ && in[1][0] % groups_ == 0,
                where_ + ": input channels " + std::to_string(x4[1]) + " do not match weights " + ShapeString(in[1]) +
                    " with group " + std::to_string(groups_));
    if (in.size() > 2)
      SHOAL_CHECK(in[2] == Shape({in[1][0]}), where_ + ": bias must be [" + std::to_string(in[1][0]) + "]");
    const Window w = Geometry(in[0], in[1]);
    Shape out = {x4[0], in[1][0], 0, 0};
    for (int i = 0; i < 2; ++i) {
      out[size_t(2 + i)] = (x4[size_t(2 + i)] + w.pb[i] + w.pe[i] - w.d[i] * (w.k[i] - 1) - 1) / w.s[i] + 1;
      SHOAL_CHECK(out[size_t(2 + i)] > 0, where_ + ": the kernel does not fit the input " + ShapeString(in[0]));
    }
    if (in[0].size() == 3) out.pop_back();
    return out;
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override {
    const Shape out = OutputShape(Shapes(x));
    Ensure(y_, out);
    const Window w = Geometry(x[0]->shape(), x[1]->shape());
    const Tensor x4 = x[0]->Reshape(As4d(x[0]->shape(), where_)), w4 = x[1]->Reshape(As4d(x[1]->shape(), where_));
    Tensor y4 = y_.Reshape(As4d(out, where_));
    const Tensor& in = Padded(x4, w);
    const Tensor bias = x.size() > 2 ? *x[2] : Tensor();
    if (train)
      be_.ConvForwardTrain(in, w4, bias, Params(w), y4, saved_);
    else
      be_.ConvForward(in, w4, bias, Params(w), y4);
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    const Window w = Geometry(x[0]->shape(), x[1]->shape());
    const Tensor x4 = x[0]->Reshape(As4d(x[0]->shape(), where_)), w4 = x[1]->Reshape(As4d(x[1]->shape(), where_));
    const Tensor dy4 = dy.Reshape(As4d(dy.shape(), where_));
    const bool pad = !Symmetric(w);
    const Tensor& in = pad ? padded_ : x4;
    Tensor& dw = InputGrad(1, x[1]->shape());
    be_.Fill(dw, 0.0f);
    Tensor dw4 = dw.Reshape(w4.shape());
    Tensor* db = nullptr;
    if (x.size() > 2) {
      db = &InputGrad(2, x[2]->shape());
      be_.Fill(*db, 0.0f);
    }
    Tensor& g = InputGrad(0, x[0]->shape());
    Tensor g4 = g.Reshape(x4.shape());
    if (pad) {  // the gradient of the padded copy, then its inner part
      Ensure(dxin_, in.shape());
      be_.ConvBackwardSaved(in, saved_, w4, dy4, Params(w), &dxin_, dw4, db);
      be_.StridedCopy(dxin_, pad_.inner, g4, StridedView{0, ContiguousStrides(x4.shape())}, x4.shape());
    } else {
      be_.ConvBackwardSaved(in, saved_, w4, dy4, Params(w), &g4, dw4, db);
    }
    dx[0] = g;
    dx[1] = dw;
    if (db) dx[2] = *db;
  }
  // The backward reads the inputs (or its padded copy), not y.
  BufferUse Buffers() const override { return BufferUse{BufferUse::kOwn, BufferUse::kOwn, false, {}}; }

 private:
  static std::vector<Shape> Shapes(const std::vector<const Tensor*>& x) {
    std::vector<Shape> s;
    for (const Tensor* t : x) s.push_back(t->shape());
    return s;
  }
  Window Geometry(const Shape& xs, const Shape& ws) const {
    const int spatial = int(xs.size()) - 2;
    std::vector<int64_t> k = AttrInts(node_, "kernel_shape");
    if (k.empty()) k.assign(ws.begin() + 2, ws.end());
    SHOAL_CHECK(int(k.size()) == spatial && std::equal(k.begin(), k.end(), ws.begin() + 2),
                where_ + ": kernel_shape does not match the weights " + ShapeString(ws));
    return ReadWindow(node_, As4d(xs, where_), spatial, k.data(), where_);
  }
  ConvParams Params(const Window& w) const {
    ConvParams p;
    p.stride = int(w.s[0]);
    p.stride_w = int(w.s[1]);
    p.pad = Symmetric(w) ? int(w.pb[0]) : 0;
    p.pad_w = Symmetric(w) ? int(w.pb[1]) : 0;
    p.dilation = int(w.d[0]);
    p.dilation_w = int(w.d[1]);
    p.groups = int(groups_);
    return p;
  }
  const Tensor& Padded(const Tensor& x4, const Window& w) {
    if (Symmetric(w)) return x4;
    pad_.Plan(x4.shape(), w);
    Ensure(padded_, pad_.padded);
    be_.Fill(padded_, 0.0f);
    be_.StridedCopy(x4, StridedView{0, ContiguousStrides(x4.shape())}, padded_, pad_.inner, x4.shape());
    return padded_;
  }
  onnx::NodeProto node_;
  int64_t groups_;
  ExplicitPad pad_;
  Tensor padded_, saved_, dxin_;
};

// C = alpha op(A) op(B) + beta C.
class GemmLayer final : public GraphLayer {
 public:
  BufferUse Buffers() const override { return OutputInY(); }
  GemmLayer(Backend& be, const onnx::NodeProto& n, int inputs)
      : GraphLayer(be, n, inputs),
        alpha_(AttrFloat(n, "alpha", 1.0f)),
        beta_(AttrFloat(n, "beta", 1.0f)),
        ta_(AttrInt(n, "transA", 0) != 0),
        tb_(AttrInt(n, "transB", 0) != 0) {}
  Shape OutputShape(const std::vector<Shape>& in) const override {
    SHOAL_CHECK(in[0].size() == 2 && in[1].size() == 2,
                where_ + ": A and B must be matrices, got " + ShapeString(in[0]) + " and " + ShapeString(in[1]));
    const int64_t M = ta_ ? in[0][1] : in[0][0], K = ta_ ? in[0][0] : in[0][1];
    const int64_t K2 = tb_ ? in[1][1] : in[1][0], N = tb_ ? in[1][0] : in[1][1];
    SHOAL_CHECK(K == K2, where_ + ": inner dimensions " + std::to_string(K) + " and " + std::to_string(K2) + " differ");
    if (in.size() > 2) BroadcastShapes(in[2], {M, N}, where_);
    return {M, N};
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    std::vector<Shape> s = {x[0]->shape(), x[1]->shape()};
    if (x.size() > 2) s.push_back(x[2]->shape());
    const Shape out = OutputShape(s);
    Ensure(y_, out);
    Tensor y3 = y_.Reshape({1, out[0], out[1]});
    be_.MatMul(x[0]->Reshape(Three(x[0]->shape())), ta_, x[1]->Reshape(Three(x[1]->shape())), tb_, y3, alpha_, 0.0f);
    if (x.size() > 2 && beta_ != 0.0f) {
      if (beta_ != 1.0f) {
        Ensure(cb_, x[2]->shape());
        be_.Unary(UnaryOp::kAffine, *x[2], cb_, beta_, 0.0f);
        be_.Binary(BinaryOp::kAdd, y_, cb_, y_);
      } else {
        be_.Binary(BinaryOp::kAdd, y_, *x[2], y_);
      }
    }
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    const Tensor a = x[0]->Reshape(Three(x[0]->shape())), b = x[1]->Reshape(Three(x[1]->shape()));
    const Tensor g = dy.Reshape(Three(dy.shape()));
    Ensure(da_, x[0]->shape());
    Ensure(db_, x[1]->shape());
    Tensor da = da_.Reshape(a.shape()), db = db_.Reshape(b.shape());
    if (!ta_)
      be_.MatMul(g, false, b, !tb_, da, alpha_);
    else
      be_.MatMul(b, tb_, g, true, da, alpha_);
    if (!tb_)
      be_.MatMul(a, !ta_, g, false, db, alpha_);
    else
      be_.MatMul(g, true, a, ta_, db, alpha_);
    dx[0] = da_;
    dx[1] = db_;
    if (x.size() > 2) {
      Tensor dc = ReduceTo(dy, x[2]->shape(), dc_);
      if (beta_ != 1.0f) {
        Ensure(dcs_, x[2]->shape());
        be_.Unary(UnaryOp::kAffine, dc, dcs_, beta_, 0.0f);
        dc = dcs_;
      }
      dx[2] = dc;
    }
  }

 private:
  static Shape Three(const Shape& s) { return {1, s[0], s[1]}; }
  float alpha_, beta_;
  bool ta_, tb_;
  Tensor cb_, da_, db_, dc_, dcs_;
};

// numpy matmul: [..., M, K] x [..., K, N], batch dimensions broadcast; 1-D operands gain
// and lose a dimension as numpy's rules say.
class MatMulLayer final : public GraphLayer {
 public:
  BufferUse Buffers() const override { return OutputInY(); }
  MatMulLayer(Backend& be, const onnx::NodeProto& n) : GraphLayer(be, n, 2) {}
  Shape OutputShape(const std::vector<Shape>& in) const override { return Plan(in[0], in[1]).out; }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    const P p = Plan(x[0]->shape(), x[1]->shape());
    Ensure(y_, p.out);
    Tensor y3 = y_.Reshape({p.batch, p.M, p.N});
    be_.MatMul(Operand(*x[0], p.a_full, p.a3, ea_), false, Operand(*x[1], p.b_full, p.b3, eb_), false, y3);
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    const P p = Plan(x[0]->shape(), x[1]->shape());
    const Tensor g = dy.Reshape({p.batch, p.M, p.N});
    const Tensor a = Operand(*x[0], p.a_full, p.a3, ea_), b = Operand(*x[1], p.b_full, p.b3, eb_);
    // dA = dY B^T and dB = A^T dY over the whole batch, then summed over what was broadcast.
    if (p.a_flat) {  // B shared: dB = A^T dY is one product over all rows
      Ensure(ga_, {1, p.M, p.K});
      Ensure(gb_, {1, p.K, p.N});
    } else {
      Ensure(ga_, {p.batch, p.M, p.K});
      Ensure(gb_, {p.batch, p.K, p.N});
    }
    be_.MatMul(g, false, b, true, ga_);
    be_.MatMul(a, true, g, false, gb_);
    dx[0] = Back(ga_, p, p.M, p.K, x[0]->shape(), ra_);
    dx[1] = Back(gb_, p, p.K, p.N, x[1]->shape(), rb_);
  }

 private:
  struct P {
    Shape out, batch_shape;
    int64_t batch = 1, M = 1, K = 1, N = 1;
    Shape a3, b3;          // the 3-D views the product reads
    Shape a_full, b_full;  // an operand copied out to the full batch, where it broadcasts partly
    bool a_flat = false;   // the batch folded into A's rows (B has no batch)
  };
  P Plan(Shape as, Shape bs) const {
    SHOAL_CHECK(!as.empty() && !bs.empty(), where_ + ": scalar operands are not allowed");
    const bool a1 = as.size() == 1, b1 = bs.size() == 1;
    if (a1) as.insert(as.begin(), 1);
    if (b1) bs.push_back(1);
    P p;
    p.M = as[as.size() - 2];
    p.K = as.back();
    p.N = bs.back();
    SHOAL_CHECK(bs[bs.size() - 2] == p.K,
                where_ + ": inner dimensions " + ShapeString(as) + " x " + ShapeString(bs) + " differ");
    const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
    p.batch_shape = BroadcastShapes(ab, bb, where_);
    p.batch = NumElements(p.batch_shape);
    p.out = p.batch_shape;
    if (!a1) p.out.push_back(p.M);
    if (!b1) p.out.push_back(p.N);
    const int64_t na = NumElements(ab), nb = NumElements(bb);
    if (nb == 1 && na == p.batch) {
      p.a3 = {1, p.batch * p.M, p.K};
      p.b3 = {1, p.K, p.N};
      p.M *= p.batch;
      p.batch = 1;
      p.a_flat = true;
      return p;
    }
    p.a3 = {na == p.batch ? p.batch : 1, p.M, p.K};
    p.b3 = {nb == p.batch ? p.batch : 1, p.K, p.N};
    if (na != p.batch && na != 1) {
      p.a_full = p.batch_shape;
      p.a_full.insert(p.a_full.end(), {p.M, p.K});
      p.a3[0] = p.batch;
    }
    if (nb != p.batch && nb != 1) {
      p.b_full = p.batch_shape;
      p.b_full.insert(p.b_full.end(), {p.K, p.N});
      p.b3[0] = p.batch;
    }
    return p;
  }
  // The operand as the product reads it: a view, or a copy broadcast to the full batch.
  Tensor Operand(const Tensor& t, const Shape& full, const Shape& three, Tensor& buf) {
    if (full.empty()) return t.Reshape(three);
    Ensure(buf, full);
    StridedView src{0, std::vector<int64_t>(full.size(), 0)};
    const Shape& ts = t.shape();
    const std::vector<int64_t> cs = ContiguousStrides(ts);
    const size_t lead = full.size() - ts.size();
    for (size_t i = 0; i < ts.size(); ++i) src.strides[lead + i] = ts[i] == 1 ? 0 : cs[i];
    be_.StridedCopy(t, src, buf, StridedView{0, ContiguousStrides(full)}, full);
    return buf.Reshape(three);
  }
  // A gradient [batch, r, c] summed to the operand's shape over what was broadcast.
  Tensor Back(const Tensor& g, const P& p, int64_t r, int64_t c, const Shape& shape, Tensor& buf) {
    if (g.numel() == NumElements(shape)) return g.Reshape(shape);
    Shape gs = p.batch_shape;
    gs.insert(gs.end(), {r, c});
    Shape target = shape;  // a 1-D operand had a dimension added: put it back for the sum
    if (shape.size() == 1) target = r == 1 && c == shape[0] ? Shape{1, shape[0]} : Shape{shape[0], 1};
    Ensure(buf, target);
    be_.ReduceSum(g.Reshape(gs), buf);
    return buf.Reshape(shape);
  }
  Tensor ea_, eb_, ga_, gb_, ra_, rb_;
};

class BatchNormLayer final : public GraphLayer {
 public:
  // always_train: batch statistics even in evaluation (a node's training_mode, honoured by
  // inference runs of the graph as written).
  BatchNormLayer(Backend& be, const onnx::NodeProto& n, bool always_train)
      : GraphLayer(be, n, 3),
        node_(n),
        always_train_(always_train),
        eps_(AttrFloat(n, "epsilon", 1e-5f)),
        momentum_(1.0f - AttrFloat(n, "momentum", 0.9f)) {
    SHOAL_CHECK(HasInput(n, 3) && HasInput(n, 4), where_ + ": needs its running mean and variance");
    SHOAL_CHECK(momentum_ >= 0 && momentum_ <= 1 && eps_ > 0, where_ + ": momentum or epsilon out of range");
  }
  // The running statistics: initializers of the file, kept as the model's buffers.
  void Bind(const std::vector<const HostValue*>& host) override {
    GraphLayer::Bind(host);
    if (!buffers_.empty()) return;
    SHOAL_CHECK(Host(3) && Host(4), where_ + ": the running mean and variance must be initializers");
    mean0_ = *Host(3);
    var0_ = *Host(4);
    AddBuffer(node_.input(3), mean0_.shape);
    AddBuffer(node_.input(4), var0_.shape);
    std::mt19937_64 unused;
    InitParameters(unused);
  }
  Shape OutputShape(const std::vector<Shape>& in) const override {
    SHOAL_CHECK(in[0].size() >= 2 && in[0].size() <= 4, where_ + ": input " + ShapeString(in[0]) + " not supported");
    const int64_t c = in[0][1];
    SHOAL_CHECK(in[1] == Shape({c}) && in[2] == Shape({c}) && mean0_.numel() == c && var0_.numel() == c,
                where_ + ": scale, bias, mean and variance must be [" + std::to_string(c) + "]");
    return in[0];
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override {
    train = train || always_train_;
    Ensure(y_, OutputShape({x[0]->shape(), x[1]->shape(), x[2]->shape()}));
    const Tensor x4 = x[0]->Reshape(Four(x[0]->shape()));
    Tensor y4 = y_.Reshape(x4.shape());
    if (!save_mean_.defined()) {
      save_mean_ = be_.Zeros({x[0]->dim(1)});
      save_invstd_ = be_.Zeros({x[0]->dim(1)});
    }
    if (train)
      be_.BatchNormForwardTrain(x4, *x[1], *x[2], eps_, momentum_, buffers_[0].value, buffers_[1].value, save_mean_,
                                save_invstd_, y4);
    else
      be_.BatchNormForwardInference(x4, *x[1], *x[2], buffers_[0].value, buffers_[1].value, eps_, y4);
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    Tensor& g = InputGrad(0, x[0]->shape());
    Tensor& dg = InputGrad(1, x[1]->shape());
    Tensor& db = InputGrad(2, x[2]->shape());
    be_.Fill(dg, 0.0f);
    be_.Fill(db, 0.0f);
    Tensor dx4 = g.Reshape(Four(x[0]->shape()));
    be_.BatchNormBackward(x[0]->Reshape(dx4.shape()), dy.Reshape(dx4.shape()), *x[1], save_mean_, save_invstd_, eps_,
                          dx4, dg, db);
    dx[0] = g;
    dx[1] = dg;
    dx[2] = db;
  }
  // The backward reads x, the scale and the saved statistics, not y.
  BufferUse Buffers() const override { return BufferUse{BufferUse::kOwn, BufferUse::kOwn, false, {}}; }
  // Training mode's running mean and variance, as updated by the last forward.
  bool HasExtraOutput(int k) const override { return k == 1 || k == 2; }
  Shape ExtraOutputShape(int, const std::vector<Shape>& in) const override { return {in[0][1]}; }
  Tensor ExtraOutput(int k) const override { return buffers_[size_t(k - 1)].value; }
  void InitParameters(std::mt19937_64&) override {
    std::vector<float> m(mean0_.v.begin(), mean0_.v.end()), v(var0_.v.begin(), var0_.v.end());
    be_.CopyFromHost(buffers_[0].value, m.data());
    be_.CopyFromHost(buffers_[1].value, v.data());
  }

 private:
  // [N,C], [N,C,H,W] as they are; [N,C,L] as [N,C,L,1].
  static Shape Four(const Shape& s) { return s.size() == 3 ? Shape{s[0], s[1], s[2], 1} : s; }
  onnx::NodeProto node_;
  bool always_train_;
  float eps_, momentum_;
  HostValue mean0_, var0_;
  Tensor save_mean_, save_invstd_;
};

class LayerNormLayer final : public GraphLayer {
 public:
  BufferUse Buffers() const override { return OutputInY(); }
  LayerNormLayer(Backend& be, const onnx::NodeProto& n, int inputs)
      : GraphLayer(be, n, inputs), axis_(AttrInt(n, "axis", -1)), eps_(AttrFloat(n, "epsilon", 1e-5f)) {}
  Shape OutputShape(const std::vector<Shape>& in) const override {
    const int64_t cols = Cols(in[0]);
    SHOAL_CHECK(NumElements(in[1]) == cols && (in.size() < 3 || NumElements(in[2]) == cols),
                where_ + ": scale and bias must hold " + std::to_string(cols) + " values");
    return in[0];
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    Ensure(y_, x[0]->shape());
    const int64_t cols = Cols(x[0]->shape()), rows = x[0]->numel() / std::max<int64_t>(cols, 1);
    Ensure(mean_, {rows});
    Ensure(invstd_, {rows});
    be_.LayerNormForward(*x[0], *x[1], x.size() > 2 ? *x[2] : Tensor(), cols, eps_, y_, mean_, invstd_);
    return y_;
  }
  bool HasExtraOutput(int k) const override { return k == 1 || k == 2; }
  // Mean and InvStdDev: the input's shape with the normalized dimensions 1.
  Shape ExtraOutputShape(int, const std::vector<Shape>& in) const override {
    Shape s = in[0];
    const int64_t r = int64_t(s.size()), a = axis_ < 0 ? axis_ + r : axis_;
    for (int64_t d = a; d < r; ++d) s[size_t(d)] = 1;
    return s;
  }
  Tensor ExtraOutput(int k) const override {
    Shape s = ExtraOutputShape(k, {y_.shape()});
    return (k == 1 ? mean_ : invstd_).Reshape(s);
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    Ensure(dx_, x[0]->shape());
    Ensure(dg_, x[1]->shape());
    be_.Fill(dg_, 0.0f);
    Tensor* db = nullptr;
    if (x.size() > 2) {
      Ensure(db_, x[2]->shape());
      be_.Fill(db_, 0.0f);
      db = &db_;
    }
    be_.LayerNormBackward(*x[0], dy, *x[1], mean_, invstd_, Cols(x[0]->shape()), dx_, &dg_, db);
    dx[0] = dx_;
    dx[1] = dg_;
    if (db) dx[2] = db_;
  }

 private:
  int64_t Cols(const Shape& s) const {
    const int64_t r = int64_t(s.size()), a = axis_ < 0 ? axis_ + r : axis_;
    SHOAL_CHECK(a >= 0 && a < r, where_ + ": axis " + std::to_string(axis_) + " out of range");
    return NumElements(Shape(s.begin() + a, s.end()));
  }
  int64_t axis_;
  float eps_;
  Tensor mean_, invstd_, dx_, dg_, db_;
};

class SoftmaxLayer final : public GraphLayer {
 public:
  BufferUse Buffers() const override { return OutputInY(); }
  SoftmaxLayer(Backend& be, const onnx::NodeProto& n, int opset, bool log)
      : GraphLayer(be, n, 1), axis_(AttrInt(n, "axis", opset >= 13 ? -1 : 1)), legacy_(opset < 13), log_(log) {}
  Shape OutputShape(const std::vector<Shape>& in) const override { return in[0]; }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    Ensure(y_, x[0]->shape());
    Tensor yv = y_.Reshape(View(x[0]->shape()));
    be_.Softmax(x[0]->Reshape(yv.shape()), Axis(x[0]->shape()), log_, yv);
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    Ensure(dx_, x[0]->shape());
    const Shape v = View(x[0]->shape());
    Tensor dxv = dx_.Reshape(v);
    be_.SoftmaxBackward(y_.Reshape(v), dy.Reshape(v), Axis(x[0]->shape()), log_, dxv);
    dx[0] = dx_;
  }

 private:
  // Before opset 13, softmax ran over everything from `axis` on (the input as a matrix).
  Shape View(const Shape& s) const {
    if (!legacy_) return s;
    const int64_t r = int64_t(s.size()), a = axis_ < 0 ? axis_ + r : axis_;
    SHOAL_CHECK(a >= 0 && a <= r, where_ + ": axis out of range");
    return {NumElements(Shape(s.begin(), s.begin() + a)), NumElements(Shape(s.begin() + a, s.end()))};
  }
  int Axis(const Shape& s) const { return legacy_ ? 1 : int(axis_ < 0 ? axis_ + int64_t(s.size()) : axis_); }
  int64_t axis_;
  bool legacy_, log_;
  Tensor dx_;
};

// Dropout follows the model's mode: in training it drops with the node's ratio (whatever the
// graph's training_mode input says), in evaluation it passes everything through.
class DropoutLayer final : public GraphLayer {
 public:
  DropoutLayer(Backend& be, const onnx::NodeProto& n, int opset, uint64_t seed, bool node_mode)
      : GraphLayer(be, n, 1),
        ratio_(opset < 12 ? AttrFloat(n, "ratio", 0.5f) : 0.5f),
        seed_(seed),
        node_mode_(node_mode) {
    opset_ = opset;
  }
  void Bind(const std::vector<const HostValue*>& host) override {
    GraphLayer::Bind(host);
    if (opset_ >= 12) ratio_ = Host(1) && Host(1)->numel() ? float(Host(1)->v[0]) : 0.5f;
    node_train_ = node_mode_ && Host(2) && Host(2)->numel() && Host(2)->v[0] != 0;
    SHOAL_CHECK(ratio_ >= 0 && ratio_ < 1, where_ + ": ratio " + std::to_string(ratio_) + " is not in [0, 1)");
  }
  Shape OutputShape(const std::vector<Shape>& in) const override { return in[0]; }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) override {
    active_ = (train || node_train_) && ratio_ > 0;
    if (!active_) {
      y_ = *x[0];
      return y_;
    }
    Ensure(mask_, x[0]->shape());
    be_.DropoutMask(seed_ + 0x9E3779B97F4A7C15ull * ++calls_, ratio_, mask_);
    Ensure(out_, x[0]->shape());
    be_.Binary(BinaryOp::kMul, *x[0], mask_, out_);
    y_ = out_;
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    if (!active_) {
      dx[0] = dy;
      return;
    }
    Ensure(dx_, x[0]->shape());
    be_.Binary(BinaryOp::kMul, dy, mask_, dx_);
    dx[0] = dx_;
  }

 private:
  float ratio_;
  uint64_t seed_, calls_ = 0;
  int opset_;
  bool node_mode_, node_train_ = false, active_ = false;
  Tensor mask_, out_, dx_;
};

}  // namespace

const std::vector<std::string>& NnLayerOps() {
  static const std::vector<std::string> ops = {
      "Conv", "Gemm", "MatMul", "BatchNormalization", "LayerNormalization", "Softmax", "LogSoftmax", "Dropout"};
  return ops;
}

std::unique_ptr<GraphLayer> MakeNnLayer(Backend& be, const onnx::NodeProto& n, int opset, int device_inputs,
                                        uint64_t seed, bool node_modes) {
  const std::string& op = n.op_type();
  if (op == "Conv") return std::make_unique<ConvLayer>(be, n, device_inputs);
  if (op == "Gemm") return std::make_unique<GemmLayer>(be, n, device_inputs);
  if (op == "MatMul") return std::make_unique<MatMulLayer>(be, n);
  if (op == "BatchNormalization")
    return std::make_unique<BatchNormLayer>(be, n, node_modes && AttrInt(n, "training_mode", 0) != 0);
  if (op == "LayerNormalization") return std::make_unique<LayerNormLayer>(be, n, device_inputs);
  if (op == "Softmax" || op == "LogSoftmax") return std::make_unique<SoftmaxLayer>(be, n, opset, op == "LogSoftmax");
  if (op == "Dropout") return std::make_unique<DropoutLayer>(be, n, opset, seed, node_modes);
  return nullptr;
}

}  // namespace shoal
