#include "worker/engine/onnx/host_value.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "worker/engine/backend.h"
#include "worker/engine/onnx/attrs.h"

namespace shoal {

std::vector<int64_t> HostValue::Ints(const std::string& what) const {
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (double d : v) {
    SHOAL_CHECK(std::isfinite(d) && d == std::floor(d), what + ": " + std::to_string(d) + " is not an integer");
    out.push_back(int64_t(d));
  }
  return out;
}

namespace {

bool IsFloatType(int t) {
  return t == onnx::TensorProto::FLOAT || t == onnx::TensorProto::DOUBLE || t == onnx::TensorProto::FLOAT16 ||
         t == onnx::TensorProto::BFLOAT16;
}

template <typename T>
void AppendRaw(const std::string& raw, std::vector<double>& v, const std::string& where) {
  SHOAL_CHECK(raw.size() % sizeof(T) == 0,
              where + ": raw_data of " + std::to_string(raw.size()) + " bytes is not a whole number of elements");
  const size_t n = raw.size() / sizeof(T);
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, raw.data() + i * sizeof(T), sizeof(T));
    v.push_back(double(x));
  }
}

}  // namespace

HostValue FromTensorProto(const onnx::TensorProto& t, const std::string& where) {
  HostValue h;
  for (int64_t d : t.dims()) {
    SHOAL_CHECK(d >= 0 && d <= kMaxTensorDimSize, where + ": dimension " + std::to_string(d) + " out of range");
    h.shape.push_back(d);
  }
  SHOAL_CHECK(h.shape.size() <= kMaxTensorDims,
              where + ": more than " + std::to_string(kMaxTensorDims) + " dimensions");
  SHOAL_CHECK(uint64_t(NumElements(h.shape)) <= kMaxTensorElements, where + ": too many elements");
  SHOAL_CHECK(t.data_location() != onnx::TensorProto::EXTERNAL,
              where +
                  ": its data is in an external file; save the model with its weights inside "
                  "(torch.onnx.export without external data, or onnx.save(model, path, save_as_external_data=False))");
  const int type = t.data_type();
  h.is_float = IsFloatType(type);
  const std::string& raw = t.raw_data();
  const bool has_raw = t.has_raw_data();
  switch (type) {
    case onnx::TensorProto::FLOAT:
      if (has_raw)
        AppendRaw<float>(raw, h.v, where);
      else
        h.v.assign(t.float_data().begin(), t.float_data().end());
      break;
    case onnx::TensorProto::DOUBLE:
      if (has_raw)
        AppendRaw<double>(raw, h.v, where);
      else
        h.v.assign(t.double_data().begin(), t.double_data().end());
      break;
    case onnx::TensorProto::INT64:
      if (has_raw)
        AppendRaw<int64_t>(raw, h.v, where);
      else
        h.v.assign(t.int64_data().begin(), t.int64_data().end());
      break;
    case onnx::TensorProto::INT32:
      if (has_raw)
        AppendRaw<int32_t>(raw, h.v, where);
      else
        h.v.assign(t.int32_data().begin(), t.int32_data().end());
      break;
    case onnx::TensorProto::INT8:
      if (has_raw)
        AppendRaw<int8_t>(raw, h.v, where);
      else
        h.v.assign(t.int32_data().begin(), t.int32_data().end());
      break;
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::BOOL:
      if (has_raw)
        AppendRaw<uint8_t>(raw, h.v, where);
      else
        h.v.assign(t.int32_data().begin(), t.int32_data().end());
      break;
    case onnx::TensorProto::FLOAT16:
      if (has_raw) {
        std::vector<double> bits;
        AppendRaw<uint16_t>(raw, bits, where);
        for (double b : bits) h.v.push_back(HalfToFloat(uint16_t(b)));
      } else {
        for (int32_t b : t.int32_data()) h.v.push_back(HalfToFloat(uint16_t(b)));
      }
      break;
    default:
      throw Error(where + ": element type " + std::to_string(type) +
                  " is not supported (float, double, half, int64, int32, int8, uint8, bool are)");
  }
  SHOAL_CHECK(int64_t(h.v.size()) == NumElements(h.shape),
              where + ": holds " + std::to_string(h.v.size()) + " values for shape " + ShapeString(h.shape));
  return h;
}

Shape BroadcastShapes(const Shape& a, const Shape& b, const std::string& where) {
  Shape out(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    const int64_t y = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    SHOAL_CHECK(x == y || x == 1 || y == 1,
                where + ": shapes " + ShapeString(a) + " and " + ShapeString(b) + " do not broadcast");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

namespace {

// a's values laid out over `out` (a broadcasts to it).
std::vector<double> Spread(const HostValue& a, const Shape& out) {
  const std::vector<int64_t> st = [&] {
    std::vector<int64_t> s(out.size(), 0), cs = ContiguousStrides(a.shape);
    const size_t lead = out.size() - a.shape.size();
    for (size_t i = 0; i < a.shape.size(); ++i) s[lead + i] = a.shape[i] == 1 ? 0 : cs[i];
    return s;
  }();
  const int64_t n = NumElements(out);
  std::vector<double> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, off = 0;
    for (int d = int(out.size()) - 1; d >= 0; --d) {
      off += (rem % out[size_t(d)]) * st[size_t(d)];
      rem /= out[size_t(d)];
    }
    r[size_t(i)] = a.v[size_t(off)];
  }
  return r;
}

int64_t NormAxis(int64_t axis, int64_t rank, const std::string& where) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  SHOAL_CHECK(a >= 0 && a < rank,
              where + ": axis " + std::to_string(axis) + " out of range for rank " + std::to_string(rank));
  return a;
}

const HostValue& In(const std::vector<const HostValue*>& in, size_t i, const std::string& where) {
  SHOAL_CHECK(i < in.size() && in[i] != nullptr, where + ": input " + std::to_string(i) + " is missing");
  return *in[i];
}

HostValue Scalar(double x, bool is_float) { return HostValue{{}, is_float, {x}}; }

HostValue FromInts(const std::vector<int64_t>& v) {
  HostValue h{{int64_t(v.size())}, false, {}};
  for (int64_t x : v) h.v.push_back(double(x));
  return h;
}

// The ONNX Slice rule for one axis: clamps start/end by the step's direction.
void SliceBounds(int64_t dim, int64_t step, int64_t* start, int64_t* end) {
  if (*start < 0) *start += dim;
  if (*end < 0) *end += dim;
  if (step > 0) {
    *start = std::clamp<int64_t>(*start, 0, dim);
    *end = std::clamp<int64_t>(*end, 0, dim);
  } else {
    *start = std::clamp<int64_t>(*start, 0, dim - 1);
    *end = std::clamp<int64_t>(*end, -1, dim - 1);
  }
}

}  // namespace

Shape ViewShape(const onnx::NodeProto& node, int opset, const Shape& in_shape,
                const std::vector<const HostValue*>& in) {
  const std::string where = NodeWhere(node);
  const std::string& op = node.op_type();
  Shape shape = in_shape;
  const int64_t numel = NumElements(in_shape);
  if (op == "Unsqueeze" || op == "Squeeze") {
    std::vector<int64_t> axes =
        opset >= 13 && HasInput(node, 1) ? In(in, 1, where).Ints(where + " axes") : AttrInts(node, "axes");
    if (op == "Unsqueeze") {
      const int64_t rank = int64_t(shape.size() + axes.size());
      for (int64_t& a : axes) a = NormAxis(a, rank, where);
      std::sort(axes.begin(), axes.end());
      for (int64_t a : axes) shape.insert(shape.begin() + a, 1);
    } else {
      const int64_t rank = int64_t(shape.size());
      if (axes.empty())
        for (int64_t d = 0; d < rank; ++d)
          if (shape[size_t(d)] == 1) axes.push_back(d);
      for (int64_t& a : axes) a = NormAxis(a, rank, where);
      std::sort(axes.rbegin(), axes.rend());
      for (int64_t a : axes) {
        SHOAL_CHECK(shape[size_t(a)] == 1, where + ": dimension " + std::to_string(a) + " is not 1");
        shape.erase(shape.begin() + a);
      }
    }
    return shape;
  }
  if (op == "Flatten") {
    const int64_t axis = AttrInt(node, "axis", 1);
    const int64_t a = axis < 0 ? axis + int64_t(shape.size()) : axis;
    SHOAL_CHECK(a >= 0 && a <= int64_t(shape.size()), where + ": axis " + std::to_string(axis) + " out of range");
    return {NumElements(Shape(shape.begin(), shape.begin() + a)), NumElements(Shape(shape.begin() + a, shape.end()))};
  }
  if (op != "Reshape") return shape;  // Identity, Cast, Dropout
  const std::vector<int64_t> dims = In(in, 1, where).Ints(where + " shape");
  Shape s;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = dims[i];
    if (d == 0 && !AttrInt(node, "allowzero", 0)) d = i < shape.size() ? shape[i] : 0;
    if (d == -1) {
      SHOAL_CHECK(infer < 0, where + ": more than one -1 in the shape");
      infer = int64_t(i);
    } else {
      SHOAL_CHECK(d >= 0, where + ": dimension " + std::to_string(d));
      known *= d;
    }
    s.push_back(d);
  }
  if (infer >= 0) {
    SHOAL_CHECK(known > 0 && numel % known == 0, where + ": cannot infer -1 for " + ShapeString(shape));
    s[size_t(infer)] = numel / known;
  }
  SHOAL_CHECK(NumElements(s) == numel, where + ": cannot reshape " + ShapeString(shape) + " to " + ShapeString(s));
  return s;
}

SliceWindow SliceWindowOf(const onnx::NodeProto& node, int opset, const Shape& shape,
                          const std::vector<const HostValue*>& in) {
  const std::string where = NodeWhere(node);
  const int64_t rank = int64_t(shape.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (opset >= 10) {
    starts = In(in, 1, where).Ints(where + " starts");
    ends = In(in, 2, where).Ints(where + " ends");
    if (HasInput(node, 3)) axes = In(in, 3, where).Ints(where + " axes");
    if (HasInput(node, 4)) steps = In(in, 4, where).Ints(where + " steps");
  } else {
    starts = AttrInts(node, "starts");
    ends = AttrInts(node, "ends");
    axes = AttrInts(node, "axes");
  }
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  SHOAL_CHECK(ends.size() == starts.size() && axes.size() == starts.size() && steps.size() == starts.size(),
              where + ": starts, ends, axes and steps differ in length");
  SliceWindow w{std::vector<int64_t>(size_t(rank), 0), std::vector<int64_t>(size_t(rank), 1), shape};
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t a = size_t(NormAxis(axes[i], rank, where));
    SHOAL_CHECK(steps[i] != 0, where + ": step 0");
    int64_t lo = starts[i], hi = ends[i];
    SliceBounds(shape[a], steps[i], &lo, &hi);
    w.begin[a] = lo;
    w.step[a] = steps[i];
    w.out[a] = std::max<int64_t>(0, (hi - lo + steps[i] + (steps[i] > 0 ? -1 : 1)) / steps[i]);
  }
  return w;
}

std::vector<int64_t> TransposePerm(const onnx::NodeProto& node, int64_t rank) {
  const std::string where = NodeWhere(node);
  std::vector<int64_t> perm = AttrInts(node, "perm");
  if (perm.empty())
    for (int64_t d = rank - 1; d >= 0; --d) perm.push_back(d);
  SHOAL_CHECK(int64_t(perm.size()) == rank, where + ": perm has " + std::to_string(perm.size()) +
                                                " entries for an input of rank " + std::to_string(rank));
  std::vector<int64_t> seen(size_t(rank), 0);
  for (int64_t& d : perm) {
    d = NormAxis(d, rank, where);
    SHOAL_CHECK(!seen[size_t(d)]++, where + ": perm repeats dimension " + std::to_string(d));
  }
  return perm;
}

std::vector<HostValue> EvalHost(const onnx::NodeProto& node, int opset, const std::vector<const HostValue*>& in,
                                const std::vector<Shape>& in_shapes) {
  const std::string where = NodeWhere(node);
  const std::string& op = node.op_type();
  auto one = [](HostValue h) { return std::vector<HostValue>{std::move(h)}; };

  if (op == "Constant") {
    if (const onnx::AttributeProto* a = FindAttr(node, "value")) return one(FromTensorProto(a->t(), where));
    if (const onnx::AttributeProto* a = FindAttr(node, "value_float")) return one(Scalar(a->f(), true));
    if (const onnx::AttributeProto* a = FindAttr(node, "value_int")) return one(Scalar(double(a->i()), false));
    if (FindAttr(node, "value_ints")) return one(FromInts(AttrInts(node, "value_ints")));
    if (const onnx::AttributeProto* a = FindAttr(node, "value_floats")) {
      HostValue h{{int64_t(a->floats_size())}, true, {}};
      for (float f : a->floats()) h.v.push_back(f);
      return one(h);
    }
    throw Error(where + ": no value attribute this importer reads (value, value_float(s), value_int(s))");
  }
  if (op == "Shape") {
    const Shape& s = in_shapes.at(0);
    const int64_t r = int64_t(s.size());
    int64_t start = AttrInt(node, "start", 0), end = AttrInt(node, "end", r);
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = std::clamp<int64_t>(start, 0, r);
    end = std::clamp<int64_t>(end, start, r);
    return one(FromInts(std::vector<int64_t>(s.begin() + start, s.begin() + end)));
  }
  if (op == "Size") return one(Scalar(double(NumElements(in_shapes.at(0))), false));
  if (op == "Identity") return one(In(in, 0, where));
  if (op == "Cast") {
    HostValue h = In(in, 0, where);
    const int to = int(AttrInt(node, "to", onnx::TensorProto::FLOAT));
    const bool was_float = h.is_float;
    h.is_float = IsFloatType(to);
    if (!h.is_float && was_float)
      for (double& x : h.v) x = to == onnx::TensorProto::BOOL ? double(x != 0) : std::trunc(x);
    if (to == onnx::TensorProto::FLOAT)
      for (double& x : h.v) x = double(float(x));
    return one(h);
  }
  static const char* kBinary[] = {"Add",   "Sub",  "Mul",     "Div",         "Pow",
                                  "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                                  "And",   "Or",   "Max",     "Min",         "Mod"};
  if (std::find(std::begin(kBinary), std::end(kBinary), op) != std::end(kBinary)) {
    const HostValue &a = In(in, 0, where), &b = In(in, 1, where);
    HostValue r;
    r.shape = BroadcastShapes(a.shape, b.shape, where);
    const bool cmp = op != "Add" && op != "Sub" && op != "Mul" && op != "Div" && op != "Pow" && op != "Max" &&
                     op != "Min" && op != "Mod";
    r.is_float = !cmp && (a.is_float || b.is_float);
    const std::vector<double> x = Spread(a, r.shape), y = Spread(b, r.shape);
    r.v.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double p = x[i], q = y[i];
      double z = 0;
      if (op == "Add")
        z = p + q;
      else if (op == "Sub")
        z = p - q;
      else if (op == "Mul")
        z = p * q;
      else if (op == "Div") {
        if (r.is_float)
          z = p / q;
        else {
          SHOAL_CHECK(q != 0, where + ": integer division by zero");
          z = std::trunc(p / q);
        }
      } else if (op == "Pow")
        z = std::pow(p, q);
      else if (op == "Equal")
        z = p == q;
      else if (op == "Less")
        z = p < q;
      else if (op == "Greater")
        z = p > q;
      else if (op == "LessOrEqual")
        z = p <= q;
      else if (op == "GreaterOrEqual")
        z = p >= q;
      else if (op == "And")
        z = (p != 0) && (q != 0);
      else if (op == "Or")
        z = (p != 0) || (q != 0);
      else if (op == "Max")
        z = std::max(p, q);
      else if (op == "Min")
        z = std::min(p, q);
      else if (op == "Mod") {
        SHOAL_CHECK(q != 0, where + ": modulo by zero");
        z = std::fmod(p, q);
        if (!AttrInt(node, "fmod", 0) && z != 0 && ((z < 0) != (q < 0))) z += q;
      }
      if (!r.is_float && (op == "Add" || op == "Sub" || op == "Mul")) z = std::trunc(z);
      r.v[i] = z;
    }
    if (r.is_float && !(a.is_float && b.is_float)) {
      // ONNX needs equal types; a mixed pair only arises from Cast-free exports of shape math.
    }
    return one(r);
  }
  static const char* kUnary[] = {"Neg", "Sqrt", "Abs", "Floor", "Ceil", "Not", "Reciprocal", "Exp", "Log", "Relu"};
  if (std::find(std::begin(kUnary), std::end(kUnary), op) != std::end(kUnary)) {
    HostValue r = In(in, 0, where);
    for (double& x : r.v) {
      if (op == "Neg")
        x = -x;
      else if (op == "Sqrt")
        x = std::sqrt(x);
      else if (op == "Abs")
        x = std::fabs(x);
      else if (op == "Floor")
        x = std::floor(x);
      else if (op == "Ceil")
        x = std::ceil(x);
      else if (op == "Not")
        x = x == 0;
      else if (op == "Reciprocal")
        x = 1.0 / x;
      else if (op == "Exp")
        x = std::exp(x);
      else if (op == "Log")
        x = std::log(x);
      else if (op == "Relu")
        x = std::max(x, 0.0);
    }
    return one(r);
  }
  if (op == "Where") {
    const HostValue &c = In(in, 0, where), &a = In(in, 1, where), &b = In(in, 2, where);
    HostValue r;
    r.shape = BroadcastShapes(BroadcastShapes(c.shape, a.shape, where), b.shape, where);
    r.is_float = a.is_float;
    const std::vector<double> cv = Spread(c, r.shape), av = Spread(a, r.shape), bv = Spread(b, r.shape);
    r.v.resize(cv.size());
    for (size_t i = 0; i < cv.size(); ++i) r.v[i] = cv[i] != 0 ? av[i] : bv[i];
    return one(r);
  }
  if (op == "ConstantOfShape") {
    const std::vector<int64_t> dims = In(in, 0, where).Ints(where + " shape");
    HostValue r{Shape(dims.begin(), dims.end()), true, {}};
    for (int64_t d : dims) SHOAL_CHECK(d >= 0, where + ": negative dimension");
    SHOAL_CHECK(uint64_t(NumElements(r.shape)) <= kMaxTensorElements, where + ": too many elements");
    double fill = 0;
    if (const onnx::AttributeProto* a = FindAttr(node, "value")) {
      HostValue v = FromTensorProto(a->t(), where + " value");
      SHOAL_CHECK(v.numel() == 1, where + ": value must hold one element");
      fill = v.v[0];
      r.is_float = v.is_float;
    }
    r.v.assign(size_t(NumElements(r.shape)), fill);
    return one(r);
  }
  if (op == "Range") {
    const double start = In(in, 0, where).v.at(0), limit = In(in, 1, where).v.at(0), delta = In(in, 2, where).v.at(0);
    SHOAL_CHECK(delta != 0, where + ": delta 0");
    HostValue r{{}, In(in, 0, where).is_float, {}};
    const int64_t n = std::max<int64_t>(int64_t(std::ceil((limit - start) / delta)), 0);
    SHOAL_CHECK(n <= kMaxTensorDimSize, where + ": too many elements");
    for (int64_t i = 0; i < n; ++i) r.v.push_back(start + double(i) * delta);
    r.shape = {n};
    return one(r);
  }
  if (op == "Concat") {
    std::vector<const HostValue*> parts;
    for (size_t i = 0; i < in.size(); ++i) parts.push_back(&In(in, i, where));
    SHOAL_CHECK(!parts.empty(), where + ": no inputs");
    const int64_t rank = int64_t(parts[0]->shape.size());
    const int64_t axis = NormAxis(AttrInt(node, "axis", 0), rank, where);
    HostValue r{parts[0]->shape, parts[0]->is_float, {}};
    r.shape[size_t(axis)] = 0;
    for (const HostValue* p : parts) {
      SHOAL_CHECK(int64_t(p->shape.size()) == rank, where + ": inputs differ in rank");
      for (int64_t d = 0; d < rank; ++d)
        SHOAL_CHECK(d == axis || p->shape[size_t(d)] == parts[0]->shape[size_t(d)],
                    where + ": input shapes " + ShapeString(p->shape) + " and " + ShapeString(parts[0]->shape) +
                        " differ off the axis");
      r.shape[size_t(axis)] += p->shape[size_t(axis)];
    }
    const int64_t outer = NumElements(Shape(r.shape.begin(), r.shape.begin() + axis));
    for (int64_t o = 0; o < outer; ++o)
      for (const HostValue* p : parts) {
        const int64_t chunk = NumElements(Shape(p->shape.begin() + axis, p->shape.end()));
        r.v.insert(r.v.end(), p->v.begin() + o * chunk, p->v.begin() + (o + 1) * chunk);
      }
    return one(r);
  }
  if (op == "Unsqueeze" || op == "Squeeze" || op == "Reshape" || op == "Flatten") {
    HostValue r = In(in, 0, where);
    r.shape = ViewShape(node, opset, r.shape, in);
    return one(r);
  }
  if (op == "Expand") {
    const HostValue& x = In(in, 0, where);
    const std::vector<int64_t> dims = In(in, 1, where).Ints(where + " shape");
    HostValue r = x;
    r.shape = BroadcastShapes(x.shape, Shape(dims.begin(), dims.end()), where);
    r.v = Spread(x, r.shape);
    return one(r);
  }
  if (op == "Gather") {
    const HostValue &x = In(in, 0, where), &idx = In(in, 1, where);
    const int64_t rank = int64_t(x.shape.size());
    const int64_t axis = NormAxis(AttrInt(node, "axis", 0), rank, where);
    const int64_t dim = x.shape[size_t(axis)];
    const int64_t outer = NumElements(Shape(x.shape.begin(), x.shape.begin() + axis));
    const int64_t inner = NumElements(Shape(x.shape.begin() + axis + 1, x.shape.end()));
    HostValue r{Shape(x.shape.begin(), x.shape.begin() + axis), x.is_float, {}};
    r.shape.insert(r.shape.end(), idx.shape.begin(), idx.shape.end());
    r.shape.insert(r.shape.end(), x.shape.begin() + axis + 1, x.shape.end());
    const std::vector<int64_t> ids = idx.Ints(where + " indices");
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k : ids) {
        SHOAL_CHECK(k >= -dim && k < dim,
                    where + ": index " + std::to_string(k) + " out of range for " + std::to_string(dim));
        if (k < 0) k += dim;
        r.v.insert(r.v.end(), x.v.begin() + (o * dim + k) * inner, x.v.begin() + (o * dim + k + 1) * inner);
      }
    return one(r);
  }
  if (op == "Slice") {
    const HostValue& x = In(in, 0, where);
    const int64_t rank = int64_t(x.shape.size());
    const SliceWindow w = SliceWindowOf(node, opset, x.shape, in);
    const Shape& s = w.out;
    const std::vector<int64_t>&b = w.begin, &st = w.step;
    HostValue r{s, x.is_float, {}};
    const std::vector<int64_t> cs = ContiguousStrides(x.shape);
    for (int64_t i = 0; i < NumElements(s); ++i) {
      int64_t rem = i, off = 0;
      for (int d = int(rank) - 1; d >= 0; --d) {
        off += (b[size_t(d)] + (rem % s[size_t(d)]) * st[size_t(d)]) * cs[size_t(d)];
        rem /= s[size_t(d)];
      }
      r.v.push_back(x.v[size_t(off)]);
    }
    return one(r);
  }
  if (op == "Transpose") {
    const HostValue& x = In(in, 0, where);
    const int64_t rank = int64_t(x.shape.size());
    const std::vector<int64_t> perm = TransposePerm(node, rank);
    HostValue r{Shape(size_t(rank)), x.is_float, {}};
    for (int64_t d = 0; d < rank; ++d) r.shape[size_t(d)] = x.shape[size_t(perm[size_t(d)])];
    const std::vector<int64_t> cs = ContiguousStrides(x.shape);
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t rem = i, off = 0;
      for (int d = int(rank) - 1; d >= 0; --d) {
        off += (rem % r.shape[size_t(d)]) * cs[size_t(perm[size_t(d)])];
        rem /= r.shape[size_t(d)];
      }
      r.v.push_back(x.v[size_t(off)]);
    }
    return one(r);
  }
  throw Error(where + ": computing " + op + " on values known before training (shapes, constants) is not supported");
}

}  // namespace shoal
