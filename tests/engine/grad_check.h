// Central finite differences against a layer's or model's backward, on the CPU in fp32.
// The probe loss is L = sum(y * r) for a fixed random r, summed in double, so dL/dy = r.
#pragma once
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/backend.h"

namespace shoal {
namespace testing_util {

inline std::vector<float> Host(Backend& be, const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  be.CopyToHost(t, v.data());
  return v;
}

inline Tensor Random(Backend& be, const Shape& s, std::mt19937_64& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(size_t(NumElements(s)));
  for (float& x : v) x = d(rng);
  Tensor t = be.Empty(s);
  be.CopyFromHost(t, v.data());
  return t;
}

inline double Dot(Backend& be, const Tensor& y, const std::vector<float>& r) {
  std::vector<float> v = Host(be, y);
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += double(v[i]) * double(r[i]);
  return s;
}

struct GradCheckResult {
  double max_err = 0;  // max |numeric - analytic| / (1 + |analytic|)
  std::string where;
  int checked = 0;
};

// Perturbs up to `max_probe` elements of `t` (spread evenly), calling loss() for L(t +- h)
// and comparing to `analytic` (dL/dt).
inline void Probe(Backend& be, Tensor& t, const std::vector<float>& analytic, const std::function<double()>& loss,
                  const std::string& name, double h, int max_probe, GradCheckResult* res) {
  std::vector<float> v = Host(be, t);
  const int64_t n = int64_t(v.size());
  const int64_t step = std::max<int64_t>(1, n / max_probe);
  for (int64_t i = 0; i < n; i += step) {
    const float orig = v[size_t(i)];
    v[size_t(i)] = orig + float(h);
    be.CopyFromHost(t, v.data());
    const double lp = loss();
    v[size_t(i)] = orig - float(h);
    be.CopyFromHost(t, v.data());
    const double lm = loss();
    v[size_t(i)] = orig;
    be.CopyFromHost(t, v.data());
    // the step actually taken in fp32
    const double hp = double(orig + float(h)) - double(orig - float(h));
    const double num = (lp - lm) / hp;
    const double a = analytic[size_t(i)];
    const double err = std::fabs(num - a) / (1.0 + std::fabs(a));
    ++res->checked;
    if (err > res->max_err) {
      res->max_err = err;
      res->where =
          name + "[" + std::to_string(i) + "] numeric " + std::to_string(num) + " analytic " + std::to_string(a);
    }
  }
}

}  // namespace testing_util
}  // namespace shoal
