// The CPU backend's general ops for imported (ONNX) graphs: plain OpenMP loops, except the
// batched matrix product (the backend's Gemm: dnnl_sgemm, or oneDNN matmul in bf16).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "worker/engine/cpu/cpu_backend.h"
#include "worker/engine/cpu/cpu_checks.h"

namespace shoal {
namespace {

// Strides of `in` walked along `out`'s dimensions: right-aligned, 0 where `in` broadcasts.
std::vector<int64_t> BroadcastStrides(const Shape& in, const Shape& out, const char* op) {
  SHOAL_CHECK(in.size() <= out.size(), std::string("CpuBackend::") + op + ": " + ShapeString(in) +
                                           " has more dimensions than the output " + ShapeString(out));
  std::vector<int64_t> st(out.size(), 0);
  const std::vector<int64_t> cs = ContiguousStrides(in);
  const size_t lead = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) {
    SHOAL_CHECK(in[i] == out[lead + i] || in[i] == 1, std::string("CpuBackend::") + op + ": " + ShapeString(in) +
                                                          " does not broadcast to " + ShapeString(out));
    st[lead + i] = in[i] == 1 ? 0 : cs[i];
  }
  return st;
}

// Calls f(row, offsets...) for every row of the output's last dimension, with the starting
// offset of each operand; rows run in parallel. The last dimension's strides are the
// caller's to read from `strides[k].back()`.
template <size_t K, typename F>
void ForEachRow(const Shape& out, const std::vector<int64_t> (&strides)[K], F f) {
  const int64_t cols = out.empty() ? 1 : out.back();
  const int64_t rows = cols == 0 ? 0 : NumElements(out) / cols;
  const int nd = int(out.size());
#pragma omp parallel for if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off[K] = {};
    int64_t rem = r;
    for (int d = nd - 2; d >= 0; --d) {
      const int64_t i = rem % out[size_t(d)];
      rem /= out[size_t(d)];
      for (size_t k = 0; k < K; ++k) off[k] += i * strides[k][size_t(d)];
    }
    f(off, cols);
  }
}

inline float ApplyUnary(UnaryOp op, float x, float a, float b) {
  switch (op) {
    case UnaryOp::kIdentity:
      return x;
    case UnaryOp::kNeg:
      return -x;
    case UnaryOp::kRelu:
      return x > 0 ? x : 0.0f;
    case UnaryOp::kLeakyRelu:
      return x > 0 ? x : a * x;
    case UnaryOp::kClip:
      return std::min(std::max(x, a), b);
    case UnaryOp::kSigmoid:
      return 1.0f / (1.0f + std::exp(-x));
    case UnaryOp::kTanh:
      return std::tanh(x);
    case UnaryOp::kErf:
      return std::erf(x);
    case UnaryOp::kSqrt:
      return std::sqrt(x);
    case UnaryOp::kExp:
      return std::exp(x);
    case UnaryOp::kLog:
      return std::log(x);
    case UnaryOp::kAbs:
      return std::fabs(x);
    case UnaryOp::kReciprocal:
      return 1.0f / x;
    case UnaryOp::kPowScalar:
      return std::pow(x, a);
    case UnaryOp::kAffine:
      return a * x + b;
  }
  return x;
}

// d op(x) / dx, from x and y = op(x).
inline float UnaryDerivative(UnaryOp op, float x, float y, float a, float b) {
  switch (op) {
    case UnaryOp::kIdentity:
      return 1.0f;
    case UnaryOp::kNeg:
      return -1.0f;
    case UnaryOp::kRelu:
      return x > 0 ? 1.0f : 0.0f;
    case UnaryOp::kLeakyRelu:
      return x > 0 ? 1.0f : a;
    case UnaryOp::kClip:
      return x >= a && x <= b ? 1.0f : 0.0f;
    case UnaryOp::kSigmoid:
      return y * (1.0f - y);
    case UnaryOp::kTanh:
      return 1.0f - y * y;
    case UnaryOp::kErf:
      return 1.1283791670955126f * std::exp(-x * x);  // 2 / sqrt(pi)
    case UnaryOp::kSqrt:
      return 0.5f / y;
    case UnaryOp::kExp:
      return y;
    case UnaryOp::kLog:
      return 1.0f / x;
    case UnaryOp::kAbs:
      return x > 0 ? 1.0f : (x < 0 ? -1.0f : 0.0f);
    case UnaryOp::kReciprocal:
      return -y * y;
    case UnaryOp::kPowScalar:
      return a * std::pow(x, a - 1.0f);
    case UnaryOp::kAffine:
      return a;
  }
  (void)b;
  return 1.0f;
}

inline float ApplyBinary(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::kAdd:
      return a + b;
    case BinaryOp::kSub:
      return a - b;
    case BinaryOp::kMul:
      return a * b;
    case BinaryOp::kDiv:
      return a / b;
    case BinaryOp::kPow:
      return std::pow(a, b);
    case BinaryOp::kMax:
      return std::max(a, b);
    case BinaryOp::kMin:
      return std::min(a, b);
    case BinaryOp::kEqual:
      return a == b ? 1.0f : 0.0f;
    case BinaryOp::kLess:
      return a < b ? 1.0f : 0.0f;
    case BinaryOp::kGreater:
      return a > b ? 1.0f : 0.0f;
  }
  return 0.0f;
}

int NormAxis(int axis, int ndim, const char* op) {
  const int a = axis < 0 ? axis + ndim : axis;
  SHOAL_CHECK(a >= 0 && a < ndim, std::string("CpuBackend::") + op + ": axis " + std::to_string(axis) +
                                      " out of range for " + std::to_string(ndim) + " dimensions");
  return a;
}

// [outer, dim, inner] around `axis`.
void SplitAt(const Shape& s, int axis, int64_t* outer, int64_t* dim, int64_t* inner) {
  *outer = NumElements(Shape(s.begin(), s.begin() + axis));
  *dim = s[size_t(axis)];
  *inner = NumElements(Shape(s.begin() + axis + 1, s.end()));
}

}  // namespace

void CpuBackend::Unary(UnaryOp op, const Tensor& x, Tensor& y, float a, float b) {
  PinThreads();
  CheckF32(x, "Unary", "x");
  SHOAL_CHECK(x.numel() == y.numel(),
              "CpuBackend::Unary: " + ShapeString(x.shape()) + " into " + ShapeString(y.shape()));
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) yp[i] = ApplyUnary(op, xp[i], a, b);
}

void CpuBackend::UnaryBackward(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, float a,
                               float b) {
  PinThreads();
  CheckF32(x, "UnaryBackward", "x");
  SHOAL_CHECK(x.numel() == y.numel() && x.numel() == dy.numel() && x.numel() == dx.numel(),
              "CpuBackend::UnaryBackward: sizes of x, y, dy, dx differ");
  const float *xp = x.data<float>(), *yp = y.data<float>(), *g = dy.data<float>();
  float* o = dx.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] * UnaryDerivative(op, xp[i], yp[i], a, b);
}

void CpuBackend::Binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& y) {
  PinThreads();
  CheckF32(a, "Binary", "a");
  CheckF32(b, "Binary", "b");
  CheckF32(y, "Binary", "y");
  const float *ap = a.data<float>(), *bp = b.data<float>();
  float* yp = y.data<float>();
  if (a.shape() == y.shape() && b.shape() == y.shape()) {
    const int64_t n = y.numel();
#pragma omp parallel for if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) yp[i] = ApplyBinary(op, ap[i], bp[i]);
    return;
  }
  const std::vector<int64_t> st[3] = {ContiguousStrides(y.shape()), BroadcastStrides(a.shape(), y.shape(), "Binary"),
                                      BroadcastStrides(b.shape(), y.shape(), "Binary")};
  const int64_t sa = st[1].empty() ? 0 : st[1].back(), sb = st[2].empty() ? 0 : st[2].back();
  ForEachRow(y.shape(), st, [&](const int64_t* off, int64_t cols) {
    float* o = yp + off[0];
    const float *p = ap + off[1], *q = bp + off[2];
    for (int64_t c = 0; c < cols; ++c) o[c] = ApplyBinary(op, p[c * sa], q[c * sb]);
  });
}

void CpuBackend::Where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& y) {
  PinThreads();
  CheckF32(cond, "Where", "cond");
  CheckF32(a, "Where", "a");
  CheckF32(b, "Where", "b");
  const std::vector<int64_t> st[4] = {ContiguousStrides(y.shape()), BroadcastStrides(cond.shape(), y.shape(), "Where"),
                                      BroadcastStrides(a.shape(), y.shape(), "Where"),
                                      BroadcastStrides(b.shape(), y.shape(), "Where")};
  const int64_t s1 = st[1].empty() ? 0 : st[1].back(), s2 = st[2].empty() ? 0 : st[2].back(),
                s3 = st[3].empty() ? 0 : st[3].back();
  const float *cp = cond.data<float>(), *ap = a.data<float>(), *bp = b.data<float>();
  float* yp = y.data<float>();
  ForEachRow(y.shape(), st, [&](const int64_t* off, int64_t cols) {
    for (int64_t c = 0; c < cols; ++c)
      yp[off[0] + c] = cp[off[1] + c * s1] != 0 ? ap[off[2] + c * s2] : bp[off[3] + c * s3];
  });
}

void CpuBackend::ReduceSum(const Tensor& x, Tensor& y, float alpha, bool accumulate) {
  PinThreads();
  CheckF32(x, "ReduceSum", "x");
  CheckF32(y, "ReduceSum", "y");
  const Shape& xs = x.shape();
  // y's strides along x's dimensions (0 where reduced): a broadcast of y to x, walked once.
  const std::vector<int64_t> ys = BroadcastStrides(y.shape(), xs, "ReduceSum");
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const int64_t yn = y.numel();
  if (!accumulate) std::memset(yp, 0, size_t(yn) * sizeof(float));
  if (alpha == 0.0f) return;
  // Each output element sums its inputs on one thread in one fixed order: deterministic.
  const int nd = int(xs.size());
  const std::vector<int64_t> xst = ContiguousStrides(xs);
  std::vector<int64_t> kept, red;  // dimensions of x kept in y, and summed over
  for (int d = 0; d < nd; ++d) (ys[size_t(d)] != 0 || xs[size_t(d)] == 1 ? kept : red).push_back(d);
  const int64_t red_n = NumElements([&] {
    Shape r;
    for (int64_t d : red) r.push_back(xs[size_t(d)]);
    return r;
  }());
#pragma omp parallel for if (x.numel() > kParallelMin)
  for (int64_t o = 0; o < yn; ++o) {
    // x's offset of this output's first input: y is x's shape with reduced dims of size 1.
    int64_t rem = o, base = 0;
    for (int i = int(kept.size()) - 1; i >= 0; --i) {
      const size_t d = size_t(kept[size_t(i)]);
      base += (rem % xs[d]) * xst[d];
      rem /= xs[d];
    }
    double s = 0;
    for (int64_t r = 0; r < red_n; ++r) {
      int64_t rr = r, off = base;
      for (int i = int(red.size()) - 1; i >= 0; --i) {
        const size_t d = size_t(red[size_t(i)]);
        off += (rr % xs[d]) * xst[d];
        rr /= xs[d];
      }
      s += xp[off];
    }
    yp[o] += alpha * float(s);
  }
}

void CpuBackend::StridedCopy(const Tensor& src, const StridedView& sv, Tensor& dst, const StridedView& dv,
                             const Shape& shape, bool accumulate) {
  PinThreads();
  CheckF32(src, "StridedCopy", "src");
  CheckF32(dst, "StridedCopy", "dst");
  SHOAL_CHECK(sv.strides.size() == shape.size() && dv.strides.size() == shape.size(),
              "CpuBackend::StridedCopy: strides do not match the walked shape " + ShapeString(shape));
  if (NumElements(shape) == 0) return;
  // Bounds: the largest offset each side reaches must lie inside its tensor.
  auto reach = [&](const StridedView& v) {
    int64_t lo = v.offset, hi = v.offset;
    for (size_t d = 0; d < shape.size(); ++d) {
      const int64_t e = (shape[d] - 1) * v.strides[d];
      (e < 0 ? lo : hi) += e;
    }
    return std::make_pair(lo, hi);
  };
  const auto rs = reach(sv), rd = reach(dv);
  SHOAL_CHECK(rs.first >= 0 && rs.second < src.numel() && rd.first >= 0 && rd.second < dst.numel(),
              "CpuBackend::StridedCopy: the walk of " + ShapeString(shape) + " leaves its tensors (" +
                  ShapeString(src.shape()) + " -> " + ShapeString(dst.shape()) + ")");
  const std::vector<int64_t> st[2] = {sv.strides, dv.strides};
  const float* sp = src.data<float>() + sv.offset;
  float* dp = dst.data<float>() + dv.offset;
  const int64_t ss = shape.empty() ? 0 : sv.strides.back(), ds = shape.empty() ? 0 : dv.strides.back();
  ForEachRow(shape, st, [&](const int64_t* off, int64_t cols) {
    const float* p = sp + off[0];
    float* o = dp + off[1];
    if (accumulate) {
      for (int64_t c = 0; c < cols; ++c) o[c * ds] += p[c * ss];
    } else if (ss == 1 && ds == 1) {
      std::memcpy(o, p, size_t(cols) * sizeof(float));
    } else {
      for (int64_t c = 0; c < cols; ++c) o[c * ds] = p[c * ss];
    }
  });
}

void CpuBackend::MatMul(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta) {
  PinThreads();
  CheckF32(a, "MatMul", "a");
  CheckF32(b, "MatMul", "b");
  CheckF32(c, "MatMul", "c");
  SHOAL_CHECK(a.ndim() == 3 && b.ndim() == 3 && c.ndim() == 3,
              "CpuBackend::MatMul: a, b, c must be 3-D [batch, rows, cols], got " + ShapeString(a.shape()) + ", " +
                  ShapeString(b.shape()) + ", " + ShapeString(c.shape()));
  const int64_t B = c.dim(0), M = c.dim(1), N = c.dim(2);
  const int64_t K = ta ? a.dim(1) : a.dim(2);
  SHOAL_CHECK((a.dim(0) == B || a.dim(0) == 1) && (b.dim(0) == B || b.dim(0) == 1) && (ta ? a.dim(2) : a.dim(1)) == M &&
                  (tb ? b.dim(2) : b.dim(1)) == K && (tb ? b.dim(1) : b.dim(2)) == N,
              "CpuBackend::MatMul: " + ShapeString(a.shape()) + (ta ? "^T" : "") + " x " + ShapeString(b.shape()) +
                  (tb ? "^T" : "") + " does not give " + ShapeString(c.shape()));
  const int64_t as = a.dim(0) == 1 ? 0 : a.dim(1) * a.dim(2), bs = b.dim(0) == 1 ? 0 : b.dim(1) * b.dim(2);
  float* cp = c.data<float>();
  // Gemm overwrites or adds (beta 0 or 1) and has no alpha, so c = alpha (ab + (beta / alpha) c):
  // c is scaled first when beta / alpha is not 0 or 1, the product added, and the sum scaled by alpha.
  const int64_t cn = c.numel();
  auto scale_c = [cp, cn](float f) {
#pragma omp parallel for if (cn > kParallelMin)
    for (int64_t i = 0; i < cn; ++i) cp[i] *= f;
  };
  if (alpha == 0.0f) {
    if (beta == 0.0f)
      std::fill(cp, cp + cn, 0.0f);
    else
      scale_c(beta);
    return;
  }
  const float rel = beta / alpha;
  if (beta != 0.0f && rel != 1.0f) scale_c(rel);
  beta = beta == 0.0f ? 0.0f : 1.0f;
  // One matrix shared by every batch on the left, none on the right: one tall product.
  if (as != 0 && bs == 0 && !ta) {
    Gemm('N', tb ? 'T' : 'N', B * M, N, K, a.data<float>(), K, b.data<float>(), tb ? K : N, beta, cp, N);
  } else {
    for (int64_t i = 0; i < B; ++i)
      Gemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, a.data<float>() + i * as, ta ? M : K, b.data<float>() + i * bs,
           tb ? K : N, beta, cp + i * M * N, N);
  }
  if (alpha != 1.0f) scale_c(alpha);
}

void CpuBackend::Softmax(const Tensor& x, int axis, bool log, Tensor& y) {
  PinThreads();
  CheckF32(x, "Softmax", "x");
  SHOAL_CHECK(x.shape() == y.shape(), "CpuBackend::Softmax: x and y shapes differ");
  int64_t outer, dim, inner;
  SplitAt(x.shape(), NormAxis(axis, x.ndim(), "Softmax"), &outer, &dim, &inner);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for if (x.numel() > kParallelMin)
  for (int64_t r = 0; r < outer * inner; ++r) {
    const int64_t base = (r / inner) * dim * inner + r % inner;
    float m = -INFINITY;
    for (int64_t i = 0; i < dim; ++i) m = std::max(m, xp[base + i * inner]);
    double s = 0;
    for (int64_t i = 0; i < dim; ++i) s += std::exp(double(xp[base + i * inner] - m));
    const float ls = float(std::log(s));
    for (int64_t i = 0; i < dim; ++i) {
      const float z = xp[base + i * inner] - m - ls;
      yp[base + i * inner] = log ? z : std::exp(z);
    }
  }
}

void CpuBackend::SoftmaxBackward(const Tensor& y, const Tensor& dy, int axis, bool log, Tensor& dx) {
  PinThreads();
  CheckF32(y, "SoftmaxBackward", "y");
  SHOAL_CHECK(y.shape() == dy.shape() && y.shape() == dx.shape(), "CpuBackend::SoftmaxBackward: shapes differ");
  int64_t outer, dim, inner;
  SplitAt(y.shape(), NormAxis(axis, y.ndim(), "SoftmaxBackward"), &outer, &dim, &inner);
  const float *yp = y.data<float>(), *g = dy.data<float>();
  float* o = dx.data<float>();
#pragma omp parallel for if (y.numel() > kParallelMin)
  for (int64_t r = 0; r < outer * inner; ++r) {
    const int64_t base = (r / inner) * dim * inner + r % inner;
    double s = 0;  // softmax: sum g*y; log-softmax: sum g
    for (int64_t i = 0; i < dim; ++i) s += log ? g[base + i * inner] : g[base + i * inner] * yp[base + i * inner];
    for (int64_t i = 0; i < dim; ++i) {
      const int64_t k = base + i * inner;
      o[k] = log ? g[k] - std::exp(yp[k]) * float(s) : yp[k] * (g[k] - float(s));
    }
  }
}

void CpuBackend::LayerNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t cols, float eps,
                                  Tensor& y, Tensor& mean, Tensor& invstd) {
  PinThreads();
  CheckF32(x, "LayerNormForward", "x");
  SHOAL_CHECK(cols > 0 && x.numel() % cols == 0 && gamma.numel() == cols && (!beta.defined() || beta.numel() == cols),
              "CpuBackend::LayerNormForward: " + std::to_string(cols) + " columns do not fit x " +
                  ShapeString(x.shape()) + " / gamma " + ShapeString(gamma.shape()));
  const int64_t rows = x.numel() / cols;
  SHOAL_CHECK(mean.numel() == rows && invstd.numel() == rows && y.numel() == x.numel(),
              "CpuBackend::LayerNormForward: y, mean or invstd sized wrong");
  const float *xp = x.data<float>(), *gp = gamma.data<float>(), *bp = beta.defined() ? beta.data<float>() : nullptr;
  float *yp = y.data<float>(), *mp = mean.data<float>(), *ip = invstd.data<float>();
#pragma omp parallel for if (x.numel() > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = xp + r * cols;
    double s = 0, ss = 0;
    for (int64_t c = 0; c < cols; ++c) s += p[c];
    const double mu = s / double(cols);
    for (int64_t c = 0; c < cols; ++c) ss += (p[c] - mu) * (p[c] - mu);
    const float is = float(1.0 / std::sqrt(ss / double(cols) + eps));
    mp[r] = float(mu);
    ip[r] = is;
    for (int64_t c = 0; c < cols; ++c) yp[r * cols + c] = (p[c] - float(mu)) * is * gp[c] + (bp ? bp[c] : 0.0f);
  }
}

void CpuBackend::LayerNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& mean,
                                   const Tensor& invstd, int64_t cols, Tensor& dx, Tensor* dgamma, Tensor* dbeta) {
  PinThreads();
  CheckF32(x, "LayerNormBackward", "x");
  SHOAL_CHECK(cols > 0 && x.numel() % cols == 0 && dy.numel() == x.numel() && dx.numel() == x.numel(),
              "CpuBackend::LayerNormBackward: shapes do not fit");
  const int64_t rows = x.numel() / cols;
  const float *xp = x.data<float>(), *g = dy.data<float>(), *gp = gamma.data<float>(), *mp = mean.data<float>(),
              *ip = invstd.data<float>();
  float* o = dx.data<float>();
#pragma omp parallel for if (x.numel() > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float *p = xp + r * cols, *gr = g + r * cols;
    double s1 = 0, s2 = 0;  // sum(dy*gamma), sum(dy*gamma*xhat)
    for (int64_t c = 0; c < cols; ++c) {
      const double gg = double(gr[c]) * gp[c];
      s1 += gg;
      s2 += gg * (p[c] - mp[r]) * ip[r];
    }
    const float m1 = float(s1 / double(cols)), m2 = float(s2 / double(cols));
    for (int64_t c = 0; c < cols; ++c) {
      const float xh = (p[c] - mp[r]) * ip[r];
      o[r * cols + c] = ip[r] * (gr[c] * gp[c] - m1 - xh * m2);
    }
  }
  // Parameter gradients: columns in parallel, rows in order (deterministic).
  float* dg = dgamma ? dgamma->data<float>() : nullptr;
  float* db = dbeta ? dbeta->data<float>() : nullptr;
  if (!dg && !db) return;
#pragma omp parallel for if (x.numel() > kParallelMin)
  for (int64_t c = 0; c < cols; ++c) {
    double sg = 0, sb = 0;
    for (int64_t r = 0; r < rows; ++r) {
      sg += double(g[r * cols + c]) * (xp[r * cols + c] - mp[r]) * ip[r];
      sb += g[r * cols + c];
    }
    if (dg) dg[c] += float(sg);
    if (db) db[c] += float(sb);
  }
}

void CpuBackend::IndexSelect(const Tensor& x, const Tensor& indices, int axis, Tensor& y) {
  PinThreads();
  CheckF32(x, "IndexSelect", "x");
  CheckF32(indices, "IndexSelect", "indices");
  const int ax = NormAxis(axis, x.ndim(), "IndexSelect");
  int64_t outer, dim, inner;
  SplitAt(x.shape(), ax, &outer, &dim, &inner);
  const int64_t n = indices.numel();
  SHOAL_CHECK(y.numel() == outer * n * inner, "CpuBackend::IndexSelect: y " + ShapeString(y.shape()) + " sized wrong");
  const float *xp = x.data<float>(), *ip = indices.data<float>();
  float* yp = y.data<float>();
  for (int64_t j = 0; j < n; ++j) {
    const float v = ip[j];
    SHOAL_CHECK(v == std::floor(v) && v >= -float(dim) && v < float(dim),
                "IndexSelect: index " + std::to_string(v) + " out of range for a dimension of " + std::to_string(dim));
  }
#pragma omp parallel for if (y.numel() > kParallelMin)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n; ++j) {
      int64_t k = int64_t(ip[j]);
      if (k < 0) k += dim;
      std::memcpy(yp + (o * n + j) * inner, xp + (o * dim + k) * inner, size_t(inner) * sizeof(float));
    }
}

void CpuBackend::IndexSelectBackward(const Tensor& dy, const Tensor& indices, int axis, Tensor& dx) {
  PinThreads();
  CheckF32(dy, "IndexSelectBackward", "dy");
  const int ax = NormAxis(axis, dx.ndim(), "IndexSelectBackward");
  int64_t outer, dim, inner;
  SplitAt(dx.shape(), ax, &outer, &dim, &inner);
  const int64_t n = indices.numel();
  SHOAL_CHECK(dy.numel() == outer * n * inner, "CpuBackend::IndexSelectBackward: dy sized wrong");
  const float *g = dy.data<float>(), *ip = indices.data<float>();
  for (int64_t j = 0; j < n; ++j)
    SHOAL_CHECK(ip[j] == std::floor(ip[j]) && ip[j] >= -float(dim) && ip[j] < float(dim),
                "IndexSelectBackward: index " + std::to_string(ip[j]) + " out of range for " + std::to_string(dim));
  float* o = dx.data<float>();
  // Parallel over the outer and inner positions; each thread adds its indices in order.
#pragma omp parallel for if (dy.numel() > kParallelMin)
  for (int64_t oi = 0; oi < outer; ++oi)
    for (int64_t j = 0; j < n; ++j) {
      int64_t k = int64_t(ip[j]);
      if (k < 0) k += dim;
      float* dst = o + (oi * dim + k) * inner;
      const float* src = g + (oi * n + j) * inner;
      for (int64_t c = 0; c < inner; ++c) dst[c] += src[c];
    }
}

namespace {
int64_t PoolOutSize(int64_t in, int k, int s, int p) { return (in + 2 * p - k) / s + 1; }
}  // namespace

void CpuBackend::AvgPoolForward(const Tensor& x, const PoolParams& p, Tensor& y) {
  PinThreads();
  CheckF32(x, "AvgPoolForward", "x");
  SHOAL_CHECK(x.ndim() == 4 && p.kh() > 0 && p.kw() > 0 && p.sh() > 0 && p.sw() > 0 && p.ph() >= 0 && p.pw() >= 0,
              "CpuBackend::AvgPoolForward: bad input " + ShapeString(x.shape()) + " or window");
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t Ho = PoolOutSize(H, p.kh(), p.sh(), p.ph()), Wo = PoolOutSize(W, p.kw(), p.sw(), p.pw());
  SHOAL_CHECK(Ho > 0 && Wo > 0 && y.shape() == Shape({N, C, Ho, Wo}),
              "CpuBackend::AvgPoolForward: output must be " + ShapeString({N, C, Ho, Wo}));
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for if (x.numel() > kParallelMin)
  for (int64_t nc = 0; nc < N * C; ++nc)
    for (int64_t oh = 0; oh < Ho; ++oh)
      for (int64_t ow = 0; ow < Wo; ++ow) {
        const int64_t h0 = oh * p.sh() - p.ph(), w0 = ow * p.sw() - p.pw();
        const int64_t h1 = std::min<int64_t>(h0 + p.kh(), H), w1 = std::min<int64_t>(w0 + p.kw(), W);
        float s = 0;
        for (int64_t h = std::max<int64_t>(h0, 0); h < h1; ++h)
          for (int64_t w = std::max<int64_t>(w0, 0); w < w1; ++w) s += xp[(nc * H + h) * W + w];
        const int64_t cnt = p.count_include_pad ? int64_t(p.kh()) * p.kw()
                                                : (h1 - std::max<int64_t>(h0, 0)) * (w1 - std::max<int64_t>(w0, 0));
        yp[(nc * Ho + oh) * Wo + ow] = s / float(std::max<int64_t>(cnt, 1));
      }
}

void CpuBackend::AvgPoolBackward(const Tensor& dy, const PoolParams& p, Tensor& dx) {
  PinThreads();
  CheckF32(dy, "AvgPoolBackward", "dy");
  SHOAL_CHECK(dx.ndim() == 4 && dy.ndim() == 4, "CpuBackend::AvgPoolBackward: expected [N,C,H,W]");
  const int64_t NC = dx.dim(0) * dx.dim(1), H = dx.dim(2), W = dx.dim(3), Ho = dy.dim(2), Wo = dy.dim(3);
  const float* g = dy.data<float>();
  float* o = dx.data<float>();
  std::memset(o, 0, dx.bytes());
#pragma omp parallel for if (dx.numel() > kParallelMin)
  for (int64_t nc = 0; nc < NC; ++nc)
    for (int64_t oh = 0; oh < Ho; ++oh)
      for (int64_t ow = 0; ow < Wo; ++ow) {
        const int64_t h0 = oh * p.sh() - p.ph(), w0 = ow * p.sw() - p.pw();
        const int64_t h1 = std::min<int64_t>(h0 + p.kh(), H), w1 = std::min<int64_t>(w0 + p.kw(), W);
        const int64_t cnt = p.count_include_pad ? int64_t(p.kh()) * p.kw()
                                                : (h1 - std::max<int64_t>(h0, 0)) * (w1 - std::max<int64_t>(w0, 0));
        const float v = g[(nc * Ho + oh) * Wo + ow] / float(std::max<int64_t>(cnt, 1));
        for (int64_t h = std::max<int64_t>(h0, 0); h < h1; ++h)
          for (int64_t w = std::max<int64_t>(w0, 0); w < w1; ++w) o[(nc * H + h) * W + w] += v;
      }
}

void CpuBackend::DropoutMask(uint64_t seed, float ratio, Tensor& mask) {
  PinThreads();
  CheckF32(mask, "DropoutMask", "mask");
  SHOAL_CHECK(ratio >= 0.0f && ratio < 1.0f, "Dropout: ratio " + std::to_string(ratio) + " is not in [0, 1)");
  float* m = mask.data<float>();
  const float keep = 1.0f / (1.0f - ratio);
  const int64_t n = mask.numel();
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) m[i] = HashUniform(seed, uint64_t(i)) >= ratio ? keep : 0.0f;
}

}  // namespace shoal
