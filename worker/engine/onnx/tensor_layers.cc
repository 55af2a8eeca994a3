// Layers that move elements: Transpose, Concat, Slice and Split, Gather, Expand, Pad; and
// the reductions ReduceMean and ReduceSum. All are strided copies or sums on the backend.
#include <algorithm>

#include "common/error.h"
#include "worker/engine/onnx/attrs.h"
#include "worker/engine/onnx/layer_families.h"

namespace shoal {
namespace {

int64_t Axis(int64_t axis, int64_t rank, const std::string& where) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  SHOAL_CHECK(a >= 0 && a < rank,
              where + ": axis " + std::to_string(axis) + " out of range for rank " + std::to_string(rank));
  return a;
}

class TransposeLayer final : public GraphLayer {
 public:
  BufferUse Buffers() const override { return OutputInY(); }
  TransposeLayer(Backend& be, const onnx::NodeProto& n) : GraphLayer(be, n, 1), node_(n) {}
  Shape OutputShape(const std::vector<Shape>& in) const override {
    const std::vector<int64_t> p = Perm(int64_t(in[0].size()));
    Shape s;
    for (int64_t d : p) s.push_back(in[0][size_t(d)]);
    return s;
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    const Shape& xs = x[0]->shape();
    Ensure(y_, OutputShape({xs}));
    const std::vector<int64_t> p = Perm(int64_t(xs.size())), cs = ContiguousStrides(xs);
    StridedView src{0, {}};
    for (int64_t d : p) src.strides.push_back(cs[size_t(d)]);
    be_.StridedCopy(*x[0], src, y_, StridedView{0, ContiguousStrides(y_.shape())}, y_.shape());
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    const Shape& xs = x[0]->shape();
    Ensure(dx_, xs);
    const std::vector<int64_t> p = Perm(int64_t(xs.size())), cs = ContiguousStrides(xs);
    StridedView dst{0, {}};
    for (int64_t d : p) dst.strides.push_back(cs[size_t(d)]);
    be_.StridedCopy(dy, StridedView{0, ContiguousStrides(dy.shape())}, dx_, dst, dy.shape());
    dx[0] = dx_;
  }

 private:
  std::vector<int64_t> Perm(int64_t rank) const { return TransposePerm(node_, rank); }
  onnx::NodeProto node_;
  Tensor dx_;
};

// Copies between x and the slice of it that `s` describes (to the slice, or back into x).
void SliceCopy(Backend& be, const SliceWindow& s, const Tensor& x, Tensor& y, bool backward, const Tensor* dy) {
  const std::vector<int64_t> cs = ContiguousStrides(x.shape());
  StridedView xv{0, {}};
  for (size_t d = 0; d < cs.size(); ++d) {
    xv.offset += s.begin[d] * cs[d];
    xv.strides.push_back(cs[d] * s.step[d]);
  }
  const StridedView yv{0, ContiguousStrides(s.out)};
  if (!backward) {
    be.StridedCopy(x, xv, y, yv, s.out);
  } else {
    be.Fill(y, 0.0f);  // y is dx here, x's shape
    be.StridedCopy(*dy, yv, y, xv, s.out);
  }
}

class SliceLayer final : public GraphLayer {
 public:
  BufferUse Buffers() const override { return OutputInY(); }
  // Slice (bounds bound on the host), or Split's output `part` (bounds from the split sizes).
  SliceLayer(Backend& be, const onnx::NodeProto& n, int opset, int part)
      : GraphLayer(be, n, 1), node_(n), opset_(opset), part_(part) {}
  Shape OutputShape(const std::vector<Shape>& in) const override { return Spec(in[0]).out; }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    const SliceWindow s = Spec(x[0]->shape());
    Ensure(y_, s.out);
    SliceCopy(be_, s, *x[0], y_, false, nullptr);
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    Ensure(dx_, x[0]->shape());
    SliceCopy(be_, Spec(x[0]->shape()), *x[0], dx_, true, &dy);
    dx[0] = dx_;
  }

 private:
  SliceWindow Spec(const Shape& xs) const {
    if (part_ < 0) return SliceWindowOf(node_, opset_, xs, host_);
    // Split's output part_: the part [start, start + size) of its axis.
    const int64_t rank = int64_t(xs.size());
    SliceWindow s{std::vector<int64_t>(size_t(rank), 0), std::vector<int64_t>(size_t(rank), 1), xs};
    const int64_t axis = Axis(AttrInt(node_, "axis", 0), rank, where_);
    std::vector<int64_t> sizes =
        HasInput(node_, 1) && Host(1) ? Host(1)->Ints(where_ + " split") : AttrInts(node_, "split");
    if (sizes.empty()) {
      const int64_t parts = node_.output_size(), dim = xs[size_t(axis)];
      const int64_t each = (dim + parts - 1) / parts;  // the last part may be smaller
      for (int64_t k = 0; k < parts; ++k) sizes.push_back(std::max<int64_t>(0, std::min(each, dim - k * each)));
    }
    SHOAL_CHECK(int64_t(sizes.size()) == node_.output_size(), where_ + ": split sizes do not match the outputs");
    int64_t start = 0, total = 0;
    for (int k = 0; k < int(sizes.size()); ++k) {
      if (k < part_) start += sizes[size_t(k)];
      total += sizes[size_t(k)];
    }
    SHOAL_CHECK(total == xs[size_t(axis)],
                where_ + ": split sizes sum to " + std::to_string(total) + ", not " + std::to_string(xs[size_t(axis)]));
    s.begin[size_t(axis)] = start;
    s.out[size_t(axis)] = sizes[size_t(part_)];
    return s;
  }
  onnx::NodeProto node_;
  int opset_, part_;
  Tensor dx_;
};

class ConcatLayer final : public GraphLayer {
 public:
  BufferUse Buffers() const override { return OutputInY(); }
  ConcatLayer(Backend& be, const onnx::NodeProto& n, int inputs)
      : GraphLayer(be, n, inputs), axis_(AttrInt(n, "axis", 0)) {}
  Shape OutputShape(const std::vector<Shape>& in) const override {
    const int64_t rank = int64_t(in[0].size()), a = Axis(axis_, rank, where_);
    Shape s = in[0];
    s[size_t(a)] = 0;
    for (const Shape& t : in) {
      SHOAL_CHECK(int64_t(t.size()) == rank, where_ + ": inputs differ in rank");
      for (int64_t d = 0; d < rank; ++d)
        SHOAL_CHECK(d == a || t[size_t(d)] == in[0][size_t(d)],
                    where_ + ": shapes " + ShapeString(t) + " and " + ShapeString(in[0]) + " differ off the axis");
      s[size_t(a)] += t[size_t(a)];
    }
    return s;
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    std::vector<Shape> in;
    for (const Tensor* t : x) in.push_back(t->shape());
    Ensure(y_, OutputShape(in));
    Walk(x, [&](const Tensor& t, const StridedView& part) {
      be_.StridedCopy(t, StridedView{0, ContiguousStrides(t.shape())}, y_, part, t.shape());
    });
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    dx_.resize(x.size());
    size_t i = 0;
    Walk(x, [&](const Tensor& t, const StridedView& part) {
      Ensure(dx_[i], t.shape());
      be_.StridedCopy(dy, part, dx_[i], StridedView{0, ContiguousStrides(t.shape())}, t.shape());
      dx[i] = dx_[i];
      ++i;
    });
  }

 private:
  // f(input, where the input sits in the output).
  template <typename F>
  void Walk(const std::vector<const Tensor*>& x, F f) {
    const int64_t a = Axis(axis_, y_.ndim(), where_);
    const std::vector<int64_t> ys = ContiguousStrides(y_.shape());
    int64_t at = 0;
    for (const Tensor* t : x) {
      f(*t, StridedView{at * ys[size_t(a)], ys});
      at += t->dim(int(a));
    }
  }
  int64_t axis_;
  std::vector<Tensor> dx_;
};

class GatherLayer final : public GraphLayer {
 public:
  BufferUse Buffers() const override { return OutputInY(); }
  GatherLayer(Backend& be, const onnx::NodeProto& n) : GraphLayer(be, n, 2), axis_(AttrInt(n, "axis", 0)) {}
  Shape OutputShape(const std::vector<Shape>& in) const override {
    const int64_t a = Axis(axis_, int64_t(in[0].size()), where_);
    Shape s(in[0].begin(), in[0].begin() + a);
    s.insert(s.end(), in[1].begin(), in[1].end());
    s.insert(s.end(), in[0].begin() + a + 1, in[0].end());
    return s;
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    Ensure(y_, OutputShape({x[0]->shape(), x[1]->shape()}));
    be_.IndexSelect(*x[0], *x[1], int(axis_), y_);
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    Ensure(dx_, x[0]->shape());
    be_.Fill(dx_, 0.0f);
    be_.IndexSelectBackward(dy, *x[1], int(axis_), dx_);
    dx[0] = dx_;  // indices take no gradient: dx[1] stays undefined
  }

 private:
  int64_t axis_;
  Tensor dx_;
};

class ExpandLayer final : public GraphLayer {
 public:
  BufferUse Buffers() const override { return OutputInY(); }
  ExpandLayer(Backend& be, const onnx::NodeProto& n) : GraphLayer(be, n, 1) {}
  Shape OutputShape(const std::vector<Shape>& in) const override {
    SHOAL_CHECK(Host(1), where_ + ": the shape must be known before training");
    const std::vector<int64_t> d = Host(1)->Ints(where_ + " shape");
    return BroadcastShapes(in[0], Shape(d.begin(), d.end()), where_);
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    const Shape out = OutputShape({x[0]->shape()});
    Ensure(y_, out);
    StridedView src{0, std::vector<int64_t>(out.size(), 0)};
    const std::vector<int64_t> cs = ContiguousStrides(x[0]->shape());
    const size_t lead = out.size() - cs.size();
    for (size_t i = 0; i < cs.size(); ++i) src.strides[lead + i] = x[0]->shape()[i] == 1 ? 0 : cs[i];
    be_.StridedCopy(*x[0], src, y_, StridedView{0, ContiguousStrides(out)}, out);
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (need_dx) dx[0] = ReduceTo(dy, x[0]->shape(), dx_);
  }

 private:
  Tensor dx_;
};

class PadLayer final : public GraphLayer {
 public:
  BufferUse Buffers() const override { return OutputInY(); }
  PadLayer(Backend& be, const onnx::NodeProto& n, int opset) : GraphLayer(be, n, 1), node_(n), opset_(opset) {
    const std::string mode = AttrString(n, "mode", "constant");
    SHOAL_CHECK(mode == "constant", where_ + ": mode " + mode + " is not supported (constant is)");
  }
  Shape OutputShape(const std::vector<Shape>& in) const override {
    const std::vector<int64_t> p = Pads(int64_t(in[0].size()));
    Shape s = in[0];
    for (size_t d = 0; d < s.size(); ++d) s[d] += p[d] + p[d + s.size()];
    return s;
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    Ensure(y_, OutputShape({x[0]->shape()}));
    be_.Fill(y_, Value());
    be_.StridedCopy(*x[0], StridedView{0, ContiguousStrides(x[0]->shape())}, y_, Inner(x[0]->shape()), x[0]->shape());
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    Ensure(dx_, x[0]->shape());
    be_.StridedCopy(dy, Inner(x[0]->shape()), dx_, StridedView{0, ContiguousStrides(x[0]->shape())}, x[0]->shape());
    dx[0] = dx_;
  }

 private:
  std::vector<int64_t> Pads(int64_t rank) const {
    std::vector<int64_t> p =
        opset_ >= 11 ? (Host(1) ? Host(1)->Ints(where_ + " pads") : std::vector<int64_t>{}) : AttrInts(node_, "pads");
    SHOAL_CHECK(int64_t(p.size()) == 2 * rank,
                where_ + ": pads has " + std::to_string(p.size()) + " entries for rank " + std::to_string(rank));
    for (int64_t v : p) SHOAL_CHECK(v >= 0, where_ + ": negative pads (cropping) are not supported");
    return p;
  }
  float Value() const {
    if (opset_ >= 11) return Host(2) && Host(2)->numel() ? float(Host(2)->v[0]) : 0.0f;
    return AttrFloat(node_, "value", 0.0f);
  }
  // Where x sits inside the padded output.
  StridedView Inner(const Shape& xs) const {
    const std::vector<int64_t> p = Pads(int64_t(xs.size()));
    Shape ys = xs;
    for (size_t d = 0; d < ys.size(); ++d) ys[d] += p[d] + p[d + ys.size()];
    StridedView v{0, ContiguousStrides(ys)};
    for (size_t d = 0; d < ys.size(); ++d) v.offset += p[d] * v.strides[d];
    return v;
  }
  onnx::NodeProto node_;
  int opset_;
  Tensor dx_;
};

class ReduceLayer final : public GraphLayer {
 public:
  ReduceLayer(Backend& be, const onnx::NodeProto& n, bool mean)
      : GraphLayer(be, n, 1),
        mean_(mean),
        keep_(AttrInt(n, "keepdims", 1) != 0),
        noop_empty_(AttrInt(n, "noop_with_empty_axes", 0) != 0),
        attr_axes_(AttrInts(n, "axes")) {}
  Shape OutputShape(const std::vector<Shape>& in) const override {
    const Shape k = Kept(in[0]);
    if (keep_) return k;
    Shape s;
    const std::vector<bool> r = Reduced(in[0]);
    for (size_t d = 0; d < k.size(); ++d)
      if (!r[d]) s.push_back(k[d]);
    return s;
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    const Shape k = Kept(x[0]->shape());
    Ensure(sum_, k);
    const int64_t count = std::max<int64_t>(1, x[0]->numel() / std::max<int64_t>(1, NumElements(k)));
    be_.ReduceSum(*x[0], sum_, mean_ ? 1.0f / float(count) : 1.0f);
    y_ = sum_.Reshape(OutputShape({x[0]->shape()}));
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    const Shape& xs = x[0]->shape();
    const Shape k = Kept(xs);
    Ensure(dx_, xs);
    StridedView src{0, ContiguousStrides(k)};
    for (size_t d = 0; d < k.size(); ++d)
      if (k[d] == 1) src.strides[d] = 0;
    be_.StridedCopy(dy.Reshape(k), src, dx_, StridedView{0, ContiguousStrides(xs)}, xs);
    if (mean_) be_.Scale(1.0f / float(std::max<int64_t>(1, x[0]->numel() / std::max<int64_t>(1, NumElements(k)))), dx_);
    dx[0] = dx_;
  }

 private:
  std::vector<bool> Reduced(const Shape& xs) const {
    const int64_t rank = int64_t(xs.size());
    std::vector<int64_t> axes = Host(1) ? Host(1)->Ints(where_ + " axes") : attr_axes_;
    std::vector<bool> r(size_t(rank), axes.empty() && !noop_empty_);
    for (int64_t a : axes) r[size_t(Axis(a, rank, where_))] = true;
    return r;
  }
  Shape Kept(const Shape& xs) const {
    Shape k = xs;
    const std::vector<bool> r = Reduced(xs);
    for (size_t d = 0; d < k.size(); ++d)
      if (r[d]) k[d] = 1;
    return k;
  }
  bool mean_, keep_, noop_empty_;
  std::vector<int64_t> attr_axes_;
  Tensor sum_, dx_;
};

}  // namespace

const std::vector<std::string>& TensorLayerOps() {
  static const std::vector<std::string> ops = {"Transpose", "Concat", "Slice",      "Split",    "Gather",
                                               "Expand",    "Pad",    "ReduceMean", "ReduceSum"};
  return ops;
}

std::unique_ptr<GraphLayer> MakeSplitPart(Backend& be, const onnx::NodeProto& n, int opset, int output) {
  return std::make_unique<SliceLayer>(be, n, opset, output);
}

std::unique_ptr<GraphLayer> MakeTensorLayer(Backend& be, const onnx::NodeProto& n, int opset, int device_inputs) {
  const std::string& op = n.op_type();
  if (op == "Transpose") return std::make_unique<TransposeLayer>(be, n);
  if (op == "Concat") return std::make_unique<ConcatLayer>(be, n, device_inputs);
  if (op == "Slice") return std::make_unique<SliceLayer>(be, n, opset, -1);
  if (op == "Split") throw Error(NodeWhere(n) + ": Split is imported one output at a time (MakeSplitPart)");
  if (op == "Gather") return std::make_unique<GatherLayer>(be, n);
  if (op == "Expand") return std::make_unique<ExpandLayer>(be, n);
  if (op == "Pad") return std::make_unique<PadLayer>(be, n, opset);
  if (op == "ReduceMean" || op == "ReduceSum") return std::make_unique<ReduceLayer>(be, n, op == "ReduceMean");
  return nullptr;
}

}  // namespace shoal
