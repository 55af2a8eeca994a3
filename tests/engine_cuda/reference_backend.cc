#include "tests/engine_cuda/reference_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"

namespace shoal {
namespace {

class HostReference final : public Backend {
 public:
  Device device() const override { return Device{}; }
  std::string Name() const override { return "host-reference"; }

  Tensor Empty(const Shape& shape, DType dtype) override {
    size_t bytes = size_t(NumElements(shape)) * DTypeSize(dtype);
    return Tensor(shape, dtype, device(), std::shared_ptr<void>(std::malloc(bytes ? bytes : 1), std::free));
  }
  void Fill(Tensor& t, float v) override {
    SHOAL_CHECK(t.dtype() == DType::kF32, "host-reference Fill: fp32 only");
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = v;
  }
  void CopyFromHost(Tensor& dst, const void* src) override { std::memcpy(dst.raw(), src, dst.bytes()); }
  void CopyToHost(const Tensor& src, void* dst) override { std::memcpy(dst, src.raw(), src.bytes()); }
  void Copy(const Tensor& src, Tensor& dst) override {
    SHOAL_CHECK(src.bytes() == dst.bytes() && src.dtype() == dst.dtype(), "host-reference Copy: mismatch");
    std::memcpy(dst.raw(), src.raw(), src.bytes());
  }

  void ConvForward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y) override {
    Geometry g(x, w, p);
    const float *X = x.data<float>(), *W = w.data<float>();
    float* Y = y.data<float>();
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t o = 0; o < g.o; ++o)
        for (int64_t i = 0; i < g.ho; ++i)
          for (int64_t j = 0; j < g.wo; ++j) {
            double acc = b.defined() ? b.data<float>()[o] : 0.0;
            g.ForTaps(i, j, [&](int64_t c, int64_t kh, int64_t kw, int64_t hi, int64_t wi) {
              acc += double(X[g.Xi(n, c, hi, wi)]) * W[g.Wi(o, c, kh, kw)];
            });
            Y[g.Yi(n, o, i, j)] = float(acc);
          }
  }

  void ConvBackward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvParams& p, Tensor* dx, Tensor& dw,
                    Tensor* db) override {
    Geometry g(x, w, p);
    const float *X = x.data<float>(), *W = w.data<float>(), *DY = dy.data<float>();
    std::vector<double> gx(size_t(x.numel()), 0.0), gw(size_t(w.numel()), 0.0), gb(size_t(g.o), 0.0);
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t o = 0; o < g.o; ++o)
        for (int64_t i = 0; i < g.ho; ++i)
          for (int64_t j = 0; j < g.wo; ++j) {
            const double d = DY[g.Yi(n, o, i, j)];
            gb[o] += d;
            g.ForTaps(i, j, [&](int64_t c, int64_t kh, int64_t kw, int64_t hi, int64_t wi) {
              gx[g.Xi(n, c, hi, wi)] += d * W[g.Wi(o, c, kh, kw)];
              gw[g.Wi(o, c, kh, kw)] += d * X[g.Xi(n, c, hi, wi)];
            });
          }
    if (dx)
      for (size_t i = 0; i < gx.size(); ++i) dx->data<float>()[i] = float(gx[i]);
    for (size_t i = 0; i < gw.size(); ++i) dw.data<float>()[i] += float(gw[i]);
    if (db)
      for (size_t i = 0; i < gb.size(); ++i) db->data<float>()[i] += float(gb[i]);
  }

  void BatchNormForwardTrain(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, float momentum,
                             Tensor& rmean, Tensor& rvar, Tensor& smean, Tensor& sinv, Tensor& y) override {
    BnView v(x);
    for (int64_t c = 0; c < v.c; ++c) {
      double sum = 0, sq = 0;
      v.ForChannel(c, [&](int64_t i) { sum += x.data<float>()[i]; });
      const double mean = sum / v.m;
      v.ForChannel(c, [&](int64_t i) {
        double d = x.data<float>()[i] - mean;
        sq += d * d;
      });
      const double var = sq / v.m, inv = 1.0 / std::sqrt(var + eps);
      v.ForChannel(c, [&](int64_t i) {
        y.data<float>()[i] = float(gamma.data<float>()[c] * (x.data<float>()[i] - mean) * inv + beta.data<float>()[c]);
      });
      rmean.data<float>()[c] = float((1 - momentum) * rmean.data<float>()[c] + momentum * mean);
      rvar.data<float>()[c] = float((1 - momentum) * rvar.data<float>()[c] + momentum * sq / (v.m - 1));
      smean.data<float>()[c] = float(mean);
      sinv.data<float>()[c] = float(inv);
    }
  }

  void BatchNormForwardInference(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& rmean,
                                 const Tensor& rvar, float eps, Tensor& y) override {
    BnView v(x);
    for (int64_t c = 0; c < v.c; ++c) {
      const double inv = 1.0 / std::sqrt(double(rvar.data<float>()[c]) + eps);
      v.ForChannel(c, [&](int64_t i) {
        y.data<float>()[i] =
            float(gamma.data<float>()[c] * (x.data<float>()[i] - rmean.data<float>()[c]) * inv + beta.data<float>()[c]);
      });
    }
  }

  void BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& smean,
                         const Tensor& sinv, float /*eps: sinv already holds it*/, Tensor& dx, Tensor& dgamma, Tensor& dbeta) override {
    BnView v(x);
    for (int64_t c = 0; c < v.c; ++c) {
      const double mean = smean.data<float>()[c], inv = sinv.data<float>()[c];
      double sdy = 0, sdyx = 0;
      v.ForChannel(c, [&](int64_t i) {
        sdy += dy.data<float>()[i];
        sdyx += dy.data<float>()[i] * (x.data<float>()[i] - mean) * inv;
      });
      v.ForChannel(c, [&](int64_t i) {
        const double xhat = (x.data<float>()[i] - mean) * inv;
        dx.data<float>()[i] =
            float(gamma.data<float>()[c] * inv / v.m * (v.m * dy.data<float>()[i] - sdy - xhat * sdyx));
      });
      dgamma.data<float>()[c] += float(sdyx);
      dbeta.data<float>()[c] += float(sdy);
    }
  }

  void ReluForward(const Tensor& x, Tensor& y) override {
    for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = std::max(x.data<float>()[i], 0.f);
  }
  void ReluBackward(const Tensor& y, const Tensor& dy, Tensor& dx) override {
    for (int64_t i = 0; i < y.numel(); ++i) dx.data<float>()[i] = y.data<float>()[i] > 0 ? dy.data<float>()[i] : 0.f;
  }
  void Add(const Tensor& a, const Tensor& b, Tensor& y) override {
    for (int64_t i = 0; i < a.numel(); ++i) y.data<float>()[i] = a.data<float>()[i] + b.data<float>()[i];
  }
  void Axpy(float alpha, const Tensor& x, Tensor& y) override {
    for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] += alpha * x.data<float>()[i];
  }
  void Scale(float alpha, Tensor& x) override {
    SHOAL_CHECK(x.device().is_cpu(), "host-reference Scale: tensor not on the host");
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] *= alpha;
  }

  // Max pooling over the in-bounds part of each window; the gradient goes to the first
  // maximum in row-major window order.
  void MaxPoolForward(const Tensor& x, const PoolParams& p, Tensor& y, Tensor&) override {
    Pool(x, p, [&](int64_t out, int64_t arg) { y.data<float>()[out] = x.data<float>()[arg]; });
  }
  void MaxPoolBackward(const Tensor& x, const Tensor&, const Tensor& dy, const PoolParams& p, const Tensor&,
                       Tensor& dx) override {
    std::vector<double> g(size_t(x.numel()), 0.0);
    Pool(x, p, [&](int64_t out, int64_t arg) { g[arg] += dy.data<float>()[out]; });
    for (size_t i = 0; i < g.size(); ++i) dx.data<float>()[i] = float(g[i]);
  }

  void GlobalAvgPoolForward(const Tensor& x, Tensor& y) override {
    const int64_t rows = x.dim(0) * x.dim(1), hw = x.dim(2) * x.dim(3);
    for (int64_t r = 0; r < rows; ++r) {
      double acc = 0;
      for (int64_t j = 0; j < hw; ++j) acc += x.data<float>()[r * hw + j];
      y.data<float>()[r] = float(acc / hw);
    }
  }
  void GlobalAvgPoolBackward(const Tensor& dy, Tensor& dx) override {
    const int64_t hw = dx.dim(2) * dx.dim(3);
    for (int64_t i = 0; i < dx.numel(); ++i) dx.data<float>()[i] = dy.data<float>()[i / hw] / float(hw);
  }

  void LinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override {
    const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t o = 0; o < out; ++o) {
        double acc = b.defined() ? b.data<float>()[o] : 0.0;
        for (int64_t i = 0; i < in; ++i) acc += double(x.data<float>()[r * in + i]) * w.data<float>()[o * in + i];
        y.data<float>()[r * out + o] = float(acc);
      }
  }
  void LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw, Tensor* db) override {
    const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
    const float *X = x.data<float>(), *W = w.data<float>(), *DY = dy.data<float>();
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        double acc = 0;
        for (int64_t r = 0; r < n; ++r) acc += double(DY[r * out + o]) * X[r * in + i];
        dw.data<float>()[o * in + i] += float(acc);
      }
      if (db) {
        double acc = 0;
        for (int64_t r = 0; r < n; ++r) acc += DY[r * out + o];
        db->data<float>()[o] += float(acc);
      }
    }
    if (dx)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < in; ++i) {
          double acc = 0;
          for (int64_t o = 0; o < out; ++o) acc += double(DY[r * out + o]) * W[o * in + i];
          dx->data<float>()[r * in + i] = float(acc);
        }
  }

  float SoftmaxCrossEntropy(const Tensor& logits, const int32_t* labels, float eps, Tensor* dlogits,
                            int64_t* correct) override {
    const int64_t n = logits.dim(0), k = logits.dim(1);
    double total = 0;
    int64_t hits = 0;
    for (int64_t r = 0; r < n; ++r) {
      const float* z = logits.data<float>() + r * k;
      int64_t arg = 0;
      for (int64_t j = 1; j < k; ++j)
        if (z[j] > z[arg]) arg = j;
      double se = 0;
      for (int64_t j = 0; j < k; ++j) se += std::exp(double(z[j]) - z[arg]);
      const double lse = z[arg] + std::log(se);
      for (int64_t j = 0; j < k; ++j) {
        const double t = (j == labels[r] ? 1.0 - eps : 0.0) + double(eps) / k;
        total -= t * (z[j] - lse);
        if (dlogits) dlogits->data<float>()[r * k + j] = float((std::exp(z[j] - lse) - t) / n);
      }
      hits += arg == labels[r];
    }
    if (correct) *correct = hits;
    return float(total / n);
  }

  double SumSquares(const Tensor& x) override {
    double acc = 0;
    for (int64_t i = 0; i < x.numel(); ++i) acc += double(x.data<float>()[i]) * x.data<float>()[i];
    return acc;
  }

 private:
  struct Geometry {
    Geometry(const Tensor& x, const Tensor& w, const ConvParams& p)
        : n(x.dim(0)),
          c(x.dim(1)),
          h(x.dim(2)),
          wd(x.dim(3)),
          o(w.dim(0)),
          k(w.dim(2)),
          s(p.stride),
          pad(p.pad),
          ho((h + 2 * pad - k) / s + 1),
          wo((wd + 2 * pad - k) / s + 1) {}
    int64_t Xi(int64_t a, int64_t b, int64_t i, int64_t j) const { return ((a * c + b) * h + i) * wd + j; }
    int64_t Wi(int64_t a, int64_t b, int64_t i, int64_t j) const { return ((a * c + b) * k + i) * k + j; }
    int64_t Yi(int64_t a, int64_t b, int64_t i, int64_t j) const { return ((a * o + b) * ho + i) * wo + j; }
    template <typename F>
    void ForTaps(int64_t i, int64_t j, F f) const {
      for (int64_t cc = 0; cc < c; ++cc)
        for (int64_t kh = 0; kh < k; ++kh)
          for (int64_t kw = 0; kw < k; ++kw) {
            const int64_t hi = i * s - pad + kh, wi = j * s - pad + kw;
            if (hi >= 0 && hi < h && wi >= 0 && wi < wd) f(cc, kh, kw, hi, wi);
          }
    }
    int64_t n, c, h, wd, o, k, s, pad, ho, wo;
  };

  // x [N,C,H,W] or [N,C]: visits the flat indices of one channel.
  struct BnView {
    explicit BnView(const Tensor& x)
        : n(x.dim(0)), c(x.dim(1)), hw(x.ndim() == 4 ? x.dim(2) * x.dim(3) : 1), m(double(n * hw)) {}
    template <typename F>
    void ForChannel(int64_t ch, F f) const {
      for (int64_t a = 0; a < n; ++a)
        for (int64_t i = 0; i < hw; ++i) f((a * c + ch) * hw + i);
    }
    int64_t n, c, hw;
    double m;
  };

  template <typename F>
  void Pool(const Tensor& x, const PoolParams& p, F emit) {
    const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
    const int64_t ho = (h + 2 * p.pad - p.kernel) / p.stride + 1;
    const int64_t wo = (w + 2 * p.pad - p.kernel) / p.stride + 1;
    const float* X = x.data<float>();
    for (int64_t a = 0; a < n * c; ++a)
      for (int64_t i = 0; i < ho; ++i)
        for (int64_t j = 0; j < wo; ++j) {
          int64_t arg = -1;
          for (int64_t kh = 0; kh < p.kernel; ++kh)
            for (int64_t kw = 0; kw < p.kernel; ++kw) {
              const int64_t hi = i * p.stride - p.pad + kh, wi = j * p.stride - p.pad + kw;
              if (hi < 0 || hi >= h || wi < 0 || wi >= w) continue;
              const int64_t idx = (a * h + hi) * w + wi;
              if (arg < 0 || X[idx] > X[arg]) arg = idx;
            }
          emit((a * ho + i) * wo + j, arg);
        }
  }
};

}  // namespace

std::unique_ptr<Backend> MakeHostReferenceBackend() { return std::make_unique<HostReference>(); }

}  // namespace shoal
