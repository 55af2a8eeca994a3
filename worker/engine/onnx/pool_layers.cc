// MaxPool, AveragePool and GlobalAveragePool.
//
// Plain 1-D and 2-D windows (symmetric pads, no dilation, no ceil_mode overhang) run on the
// backend's pooling, and so does 1-D and 2-D max pooling with uneven pads or a ceil_mode
// overhang, on a copy padded with -inf. Every other window (dilations, average pooling with
// uneven pads or an overhang, 3-D) runs as a gather on the backend's general ops, so both
// backends share one implementation: the padded input's window elements are laid out side by side as
// [N, C, outputs, window] by one strided copy per window offset, then pooled along the last
// axis (max pooling with a 1 x window kernel, or a sum times each output's 1 / divisor); the
// backward runs the same steps in reverse, accumulating the copies.
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "worker/engine/onnx/attrs.h"
#include "worker/engine/onnx/layer_families.h"
#include "worker/engine/onnx/window.h"

namespace shoal {
namespace {

// [N, C, spatial...] as [N, C, positions, 1], for global pooling of any spatial rank.
Shape Flat(const Shape& s) { return {s[0], s[1], NumElements(Shape(s.begin() + 2, s.end())), 1}; }

// The window along each spatial dimension, with the output size; `extra`: the end
// padding a ceil_mode window running past the input adds (never counted by an average).
struct PoolGeometry {
  Window w;
  int64_t n = 0, c = 0;
  int spatial = 0;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, extra[3] = {0, 0, 0};
  // kBackend: the backend's pooling with its symmetric pads; kPaddedMax: max pooling of a copy
  // padded with -inf; kGather: the general ops.
  enum Route { kBackend, kPaddedMax, kGather } route = kBackend;
  int64_t Outputs() const { return out[0] * out[1] * out[2]; }
  int64_t Taps() const { return w.k[0] * w.k[1] * w.k[2]; }
  int64_t Padded(int i) const { return in[i] + w.pb[i] + w.pe[i] + extra[i]; }
};

class PoolLayer final : public GraphLayer {
 public:
  enum Kind { kMax, kAvg, kGlobalAvg };
  PoolLayer(Backend& be, const onnx::NodeProto& n, Kind kind)
      : GraphLayer(be, n, 1), node_(n), kind_(kind), include_pad_(AttrInt(n, "count_include_pad", 0) != 0) {}
  Shape OutputShape(const std::vector<Shape>& in) const override {
    const Shape& xs = in[0];
    SHOAL_CHECK(xs.size() >= 3 && xs.size() <= 5,
                where_ + ": input " + ShapeString(xs) + " must be [N,C,L], [N,C,H,W] or [N,C,D,H,W]");
    Shape out = {xs[0], xs[1]};
    if (kind_ == kGlobalAvg) {
      out.resize(xs.size(), 1);
      return out;
    }
    const PoolGeometry g = Geometry(xs);
    for (int i = 0; i < g.spatial; ++i) out.push_back(g.out[i]);
    return out;
  }
  const Tensor& Forward(const std::vector<const Tensor*>& x, bool) override {
    const Shape& xs = x[0]->shape();
    Ensure(y_, OutputShape({xs}));
    if (kind_ == kGlobalAvg) {
      Tensor y2 = y_.Reshape({xs[0], xs[1]});
      be_.GlobalAvgPoolForward(x[0]->Reshape(Flat(xs)), y2);
      return y_;
    }
    const PoolGeometry g = Geometry(xs);
    if (g.route == PoolGeometry::kGather) {
      GatherForward(*x[0], g);
      return y_;
    }
    Tensor y4 = y_.Reshape(As4d(y_.shape(), where_));
    if (g.route == PoolGeometry::kPaddedMax)
      be_.MaxPoolForward(PaddedCopy(*x[0], g), Params(g), y4, ws_);
    else if (kind_ == kMax)
      be_.MaxPoolForward(x[0]->Reshape(As4d(xs, where_)), Params(g), y4, ws_);
    else
      be_.AvgPoolForward(x[0]->Reshape(As4d(xs, where_)), Params(g), y4);
    return y_;
  }
  void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx, std::vector<Tensor>& dx) override {
    if (!need_dx) return;
    const Shape& xs = x[0]->shape();
    Tensor& grad = InputGrad(0, xs);
    if (kind_ == kGlobalAvg) {
      Tensor flat = grad.Reshape(Flat(xs));
      be_.GlobalAvgPoolBackward(dy.Reshape({xs[0], xs[1]}), flat);
    } else if (const PoolGeometry g = Geometry(xs); g.route == PoolGeometry::kGather) {
      GatherBackward(dy, g, grad);
    } else if (g.route == PoolGeometry::kPaddedMax) {
      const Tensor dy4 = dy.Reshape(As4d(dy.shape(), where_)), padded4 = padded_.Reshape(As4d(padded_.shape(), where_));
      Ensure(dpadded_, padded_.shape());
      Tensor dpadded4 = dpadded_.Reshape(padded4.shape());
      be_.MaxPoolBackward(padded4, y_.Reshape(dy4.shape()), dy4, Params(g), ws_, dpadded4);
      be_.StridedCopy(dpadded_, Inner(g), grad, StridedView{0, ContiguousStrides(xs)}, xs);
    } else {
      const Tensor x4 = x[0]->Reshape(As4d(xs, where_)), dy4 = dy.Reshape(As4d(dy.shape(), where_));
      Tensor dx4 = grad.Reshape(x4.shape());
      if (kind_ == kMax)
        be_.MaxPoolBackward(x4, y_.Reshape(dy4.shape()), dy4, Params(g), ws_, dx4);
      else
        be_.AvgPoolBackward(dy4, Params(g), dx4);
    }
    dx[0] = grad;
  }
  BufferUse Buffers() const override { return BufferUse{BufferUse::kOwn, BufferUse::kOwn, true, {}}; }

 private:
  PoolGeometry Geometry(const Shape& xs) const {
    PoolGeometry g;
    g.n = xs[0];
    g.c = xs[1];
    g.spatial = int(xs.size()) - 2;
    const std::vector<int64_t> k = AttrInts(node_, "kernel_shape");
    SHOAL_CHECK(int(k.size()) == g.spatial,
                where_ + ": kernel_shape must have " + std::to_string(g.spatial) + " entries");
    g.w = ReadWindow(node_, xs, g.spatial, k.data(), where_);
    const bool ceil = AttrInt(node_, "ceil_mode", 0) != 0;
    bool plain = g.spatial <= 2;
    for (int i = 0; i < g.spatial; ++i) {
      const int64_t in = xs[size_t(2 + i)], s = g.w.s[i], pb = g.w.pb[i];
      const int64_t reach = (g.w.k[i] - 1) * g.w.d[i] + 1, span = in + pb + g.w.pe[i] - reach;
      SHOAL_CHECK(span >= 0, where_ + ": the window does not fit the input " + ShapeString(xs));
      g.in[i] = in;
      g.out[i] = span / s + 1;
      if (ceil) {
        int64_t out = (span + s - 1) / s + 1;
        // PyTorch's and ONNX's rule: the last window must start inside the input or left padding.
        if ((out - 1) * s >= in + pb) --out;
        g.out[i] = out;
        g.extra[i] = std::max<int64_t>(0, (out - 1) * s + reach - (in + pb + g.w.pe[i]));
      }
      plain = plain && g.w.d[i] == 1;
    }
    const bool overhang = g.extra[0] || g.extra[1] || g.extra[2];
    if (!plain)
      g.route = PoolGeometry::kGather;
    else if (!Symmetric(g.w) || overhang)
      g.route = kind_ == kMax ? PoolGeometry::kPaddedMax : PoolGeometry::kGather;
    return g;
  }
  // The backend's geometry; none of the pads on the padded copy.
  PoolParams Params(const PoolGeometry& g) const {
    PoolParams p;
    p.kernel = int(g.w.k[0]);
    p.kernel_w = int(g.w.k[1]);
    p.stride = int(g.w.s[0]);
    p.stride_w = int(g.w.s[1]);
    p.pad = g.route == PoolGeometry::kBackend ? int(g.w.pb[0]) : 0;
    p.pad_w = g.route == PoolGeometry::kBackend ? int(g.w.pb[1]) : 0;
    p.count_include_pad = include_pad_;
    return p;
  }
  // Max pooling of [N, C, outputs, taps] along the taps.
  static PoolParams TapParams(int64_t taps) {
    PoolParams p;
    p.kernel = 1;
    p.stride = 1;
    p.pad = 0;
    p.kernel_w = p.stride_w = int(taps);
    p.pad_w = 0;
    return p;
  }
  Shape PaddedShape(const PoolGeometry& g) const {
    Shape s = {g.n, g.c};
    for (int i = 0; i < g.spatial; ++i) s.push_back(g.Padded(i));
    return s;
  }
  // Where the input sits in its padded copy.
  StridedView Inner(const PoolGeometry& g) const {
    StridedView v{0, ContiguousStrides(PaddedShape(g))};
    for (int i = 0; i < g.spatial; ++i) v.offset += g.w.pb[i] * v.strides[size_t(2 + i)];
    return v;
  }
  // Calls f(padded view, taps view, grid) for each window offset: the padded input's elements
  // at that offset of every window, and where they go in [N, C, outputs, taps].
  template <typename F>
  void ForEachTap(const PoolGeometry& g, F f) const {
    const Shape padded = PaddedShape(g);
    const std::vector<int64_t> ps = ContiguousStrides(padded);
    Shape grid = {padded[0], padded[1]};
    for (int i = 0; i < g.spatial; ++i) grid.push_back(g.out[i]);
    const int64_t taps = g.Taps(), outputs = g.Outputs();
    StridedView src{0, {ps[0], ps[1]}}, dst{0, {padded[1] * outputs * taps, outputs * taps}};
    int64_t outer = outputs;
    for (int i = 0; i < g.spatial; ++i) {
      src.strides.push_back(g.w.s[i] * ps[size_t(2 + i)]);
      outer /= g.out[i];
      dst.strides.push_back(outer * taps);
    }
    for (int64_t t = 0; t < taps; ++t) {
      int64_t rest = t;
      src.offset = 0;
      for (int i = g.spatial - 1; i >= 0; --i) {
        src.offset += (rest % g.w.k[i]) * g.w.d[i] * ps[size_t(2 + i)];
        rest /= g.w.k[i];
      }
      dst.offset = t;
      f(src, dst, grid);
    }
  }
  // x in padded_ (-inf around it for max pooling: never a window's maximum unless the whole
  // window is padding; zeros for average pooling), as [N,C,H,W] unless 3-D.
  Tensor PaddedCopy(const Tensor& x, const PoolGeometry& g) {
    Ensure(padded_, PaddedShape(g));
    be_.Fill(padded_, kind_ == kMax ? -INFINITY : 0.0f);
    be_.StridedCopy(x, StridedView{0, ContiguousStrides(x.shape())}, padded_, Inner(g), x.shape());
    return g.spatial <= 2 ? padded_.Reshape(As4d(padded_.shape(), where_)) : padded_;
  }
  void GatherForward(const Tensor& x, const PoolGeometry& g) {
    PaddedCopy(x, g);
    const Shape rows = {g.n, g.c, g.Outputs(), 1};
    Ensure(taps_, {rows[0], rows[1], rows[2], g.Taps()});
    ForEachTap(g, [&](const StridedView& src, const StridedView& dst, const Shape& grid) {
      be_.StridedCopy(padded_, src, taps_, dst, grid);
    });
    Tensor y = y_.Reshape(rows);
    if (kind_ == kMax) {
      be_.MaxPoolForward(taps_, TapParams(g.Taps()), y, ws_);
    } else {
      Ensure(sum_, rows);
      be_.ReduceSum(taps_, sum_);
      be_.Binary(BinaryOp::kMul, sum_, InverseDivisors(g), y);
    }
  }
  void GatherBackward(const Tensor& dy, const PoolGeometry& g, Tensor& grad) {
    const Shape rows = {g.n, g.c, g.Outputs(), 1};
    Ensure(dtaps_, taps_.shape());
    if (kind_ == kMax)
      be_.MaxPoolBackward(taps_, y_.Reshape(rows), dy.Reshape(rows), TapParams(g.Taps()), ws_, dtaps_);
    else
      be_.Binary(BinaryOp::kMul, dy.Reshape(rows), InverseDivisors(g), dtaps_);
    Ensure(dpadded_, padded_.shape());
    be_.Fill(dpadded_, 0.0f);
    ForEachTap(g, [&](const StridedView& src, const StridedView& dst, const Shape& grid) {
      be_.StridedCopy(dtaps_, dst, dpadded_, src, grid, /*accumulate=*/true);
    });
    be_.StridedCopy(dpadded_, Inner(g), grad, StridedView{0, ContiguousStrides(grad.shape())}, grad.shape());
  }
  // 1 / the number of window positions each output averages, [1, 1, outputs, 1]: the
  // positions inside the input, or with count_include_pad also those in the pads (never in
  // the ceil_mode overhang, as in PyTorch).
  const Tensor& InverseDivisors(const PoolGeometry& g) {
    const Shape key(g.in, g.in + 3);
    if (inv_count_.defined() && inv_key_ == key) return inv_count_;
    std::vector<std::vector<int64_t>> count(3, std::vector<int64_t>(1, 1));
    for (int i = 0; i < g.spatial; ++i) {
      const int64_t lo = include_pad_ ? -g.w.pb[i] : 0, hi = include_pad_ ? g.in[i] + g.w.pe[i] : g.in[i];
      count[size_t(i)].assign(size_t(g.out[i]), 0);
      for (int64_t o = 0; o < g.out[i]; ++o)
        for (int64_t j = 0; j < g.w.k[i]; ++j) {
          const int64_t at = o * g.w.s[i] - g.w.pb[i] + j * g.w.d[i];
          count[size_t(i)][size_t(o)] += at >= lo && at < hi;
        }
    }
    std::vector<float> inv;
    inv.reserve(size_t(g.Outputs()));
    for (int64_t a : count[0])
      for (int64_t b : count[1])
        for (int64_t c : count[2]) inv.push_back(1.0f / float(std::max<int64_t>(a * b * c, 1)));
    inv_count_ = be_.Empty({1, 1, g.Outputs(), 1});
    be_.CopyFromHost(inv_count_, inv.data());
    inv_key_ = key;
    return inv_count_;
  }

  onnx::NodeProto node_;
  Kind kind_;
  bool include_pad_;
  Shape inv_key_;
  Tensor ws_, padded_, dpadded_, taps_, dtaps_, sum_, inv_count_;
};

}  // namespace

const std::vector<std::string>& PoolLayerOps() {
  static const std::vector<std::string> ops = {"MaxPool", "AveragePool", "GlobalAveragePool"};
  return ops;
}

std::unique_ptr<GraphLayer> MakePoolLayer(Backend& be, const onnx::NodeProto& n) {
  const std::string& op = n.op_type();
  if (op == "MaxPool") return std::make_unique<PoolLayer>(be, n, PoolLayer::kMax);
  if (op == "AveragePool") return std::make_unique<PoolLayer>(be, n, PoolLayer::kAvg);
  if (op == "GlobalAveragePool") return std::make_unique<PoolLayer>(be, n, PoolLayer::kGlobalAvg);
  return nullptr;
}

}  // namespace shoal
