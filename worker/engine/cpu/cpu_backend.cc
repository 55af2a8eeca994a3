#include "worker/engine/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "worker/engine/cpu/conv_plan.h"
#include "worker/engine/cpu/cpu_checks.h"
#include "worker/engine/cpu/dnnl_util.h"
#include "worker/engine/cpu/matmul_plan.h"

namespace shoal {
namespace {

// [N,C,H,W] or [N,C] -> (N, C, H*W)
void NCS(const Tensor& x, const char* op, int64_t* n, int64_t* c, int64_t* s) {
  SHOAL_CHECK(x.ndim() == 2 || x.ndim() == 4,
              std::string("CpuBackend::") + op + ": expected [N,C] or [N,C,H,W], got " + ShapeString(x.shape()));
  *n = x.dim(0);
  *c = x.dim(1);
  *s = x.ndim() == 4 ? x.dim(2) * x.dim(3) : 1;
}

}  // namespace

CpuBackend::CpuBackend(int threads, DType compute) : compute_(compute), dnnl_(new Dnnl) {
  SHOAL_CHECK(threads >= 0, "CpuBackend: threads must be >= 0 (0 = all cores), got " + std::to_string(threads));
  SHOAL_CHECK(compute != DType::kF16,
              "[model] precision = \"fp16\" on a CPU worker: CPUs have no fp16 arithmetic faster than fp32; use "
              "\"bf16\" (on processors with AVX512-BF16 or AMX) or \"fp32\"");
  SHOAL_CHECK(compute != DType::kBF16 || CpuHasBf16(),
              "[model] precision = \"bf16\" on a CPU worker: this processor has no bf16 instructions (oneDNN's "
              "instruction set here: " +
                  CpuIsaName() + "; bf16 needs AVX512-BF16 or AMX-BF16); use \"fp32\"");
  if (threads > 0) omp_set_num_threads(threads);
  threads_ = threads > 0 ? threads : omp_get_max_threads();
}

CpuBackend::~CpuBackend() = default;

bool CpuHasBf16() { return __builtin_cpu_supports("avx512bf16") || CpuIsaName() == "avx512_core_amx"; }

std::string CpuIsaName() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::sse41:
      return "sse41";
    default:
      return "other";
  }
}

void CpuBackend::PinThreads() const {
  // The OpenMP thread count is per calling thread: a backend built on one thread and
  // used from another would otherwise run with that thread's default.
  if (omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
}

std::string CpuBackend::Name() const {
  return "cpu/oneDNN x" + std::to_string(threads_) + " threads" +
         (compute_ == DType::kBF16 ? ", bf16 compute (" + CpuIsaName() + ")" : "");
}

Tensor CpuBackend::Empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) SHOAL_CHECK(d >= 0, "CpuBackend::Empty: negative dimension in shape " + ShapeString(shape));
  // 64-byte aligned for AVX-512 loads; rounded up because aligned_alloc demands it.
  size_t bytes = size_t(NumElements(shape)) * DTypeSize(dtype);
  bytes = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, bytes);
  if (!p)
    throw Error("CpuBackend::Empty: out of memory allocating " + std::to_string(bytes) + " bytes for " +
                ShapeString(shape));
  memory_counter()->Allocated(int64_t(bytes));
  return Tensor(shape, dtype, device(), std::shared_ptr<void>(p, [counter = memory_counter(), bytes](void* q) {
                  std::free(q);
                  counter->Freed(int64_t(bytes));
                }));
}

void CpuBackend::Fill(Tensor& t, float value) {
  PinThreads();
  const int64_t n = t.numel();
  if (t.dtype() == DType::kF32) {
    float* p = t.data<float>();
#pragma omp parallel for simd if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) p[i] = value;
    return;
  }
  uint16_t bits = t.dtype() == DType::kF16 ? FloatToHalf(value) : FloatToBf16(value);
  std::fill_n(t.data<uint16_t>(), n, bits);
}

void CpuBackend::CopyFromHost(Tensor& dst, const void* src) { std::memcpy(dst.raw(), src, dst.bytes()); }
void CpuBackend::CopyToHost(const Tensor& src, void* dst) { std::memcpy(dst, src.raw(), src.bytes()); }
void CpuBackend::Copy(const Tensor& src, Tensor& dst) {
  SHOAL_CHECK(src.bytes() == dst.bytes(),
              "CpuBackend::Copy: " + ShapeString(src.shape()) + " into " + ShapeString(dst.shape()));
  if (src.raw() != dst.raw()) std::memcpy(dst.raw(), src.raw(), src.bytes());
}

// ---------------------------------------------------------------- batch norm

void CpuBackend::BatchNormForwardTrain(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                       float momentum, Tensor& running_mean, Tensor& running_var, Tensor& save_mean,
                                       Tensor& save_invstd, Tensor& y) {
  PinThreads();
  CheckF32(x, "BatchNormForwardTrain", "x");
  CheckSameShape(x, y, "BatchNormForwardTrain");
  int64_t N, C, S;
  NCS(x, "BatchNormForwardTrain", &N, &C, &S);
  SHOAL_CHECK(gamma.numel() == C && beta.numel() == C && running_mean.numel() == C && running_var.numel() == C &&
                  save_mean.numel() == C && save_invstd.numel() == C,
              "CpuBackend::BatchNormForwardTrain: per-channel tensors must have " + std::to_string(C) + " elements");
  const int64_t M = N * S;
  SHOAL_CHECK(
      M > 1, "CpuBackend::BatchNormForwardTrain: needs more than one value per channel, got " + ShapeString(x.shape()));
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const float *g = gamma.data<float>(), *b = beta.data<float>();
  float *rm = running_mean.data<float>(), *rv = running_var.data<float>();
  float *sm = save_mean.data<float>(), *si = save_invstd.data<float>();
#pragma omp parallel for if (x.numel() > kParallelMin)
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0;
    for (int64_t n = 0; n < N; ++n) {
      const float* p = xp + (n * C + c) * S;
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < S; ++i) s += p[i];
      sum += s;
    }
    const float mean = float(sum / double(M));
    double sq = 0;  // two passes: no cancellation in E[x^2] - E[x]^2
    for (int64_t n = 0; n < N; ++n) {
      const float* p = xp + (n * C + c) * S;
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < S; ++i) s += (p[i] - mean) * (p[i] - mean);
      sq += s;
    }
    const double var = sq / double(M);
    const float invstd = float(1.0 / std::sqrt(var + double(eps)));
    sm[c] = mean;
    si[c] = invstd;
    rm[c] = (1 - momentum) * rm[c] + momentum * mean;
    rv[c] = (1 - momentum) * rv[c] + momentum * float(var * double(M) / double(M - 1));
    const float scale = g[c] * invstd, shift = b[c] - mean * scale;
    for (int64_t n = 0; n < N; ++n) {
      const float* p = xp + (n * C + c) * S;
      float* q = yp + (n * C + c) * S;
#pragma omp simd
      for (int64_t i = 0; i < S; ++i) q[i] = p[i] * scale + shift;
    }
  }
}

void CpuBackend::BatchNormForwardInference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                           const Tensor& running_mean, const Tensor& running_var, float eps,
                                           Tensor& y) {
  PinThreads();
  CheckF32(x, "BatchNormForwardInference", "x");
  CheckSameShape(x, y, "BatchNormForwardInference");
  int64_t N, C, S;
  NCS(x, "BatchNormForwardInference", &N, &C, &S);
  SHOAL_CHECK(
      gamma.numel() == C && beta.numel() == C && running_mean.numel() == C && running_var.numel() == C,
      "CpuBackend::BatchNormForwardInference: per-channel tensors must have " + std::to_string(C) + " elements");
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const float *g = gamma.data<float>(), *b = beta.data<float>();
  const float *rm = running_mean.data<float>(), *rv = running_var.data<float>();
#pragma omp parallel for collapse(2) if (x.numel() > kParallelMin)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const float scale = g[c] / std::sqrt(rv[c] + eps), shift = b[c] - rm[c] * scale;
      const float* p = xp + (n * C + c) * S;
      float* q = yp + (n * C + c) * S;
#pragma omp simd
      for (int64_t i = 0; i < S; ++i) q[i] = p[i] * scale + shift;
    }
}

void CpuBackend::BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                                   const Tensor& save_invstd, float /*eps: in save_invstd*/, Tensor& dx, Tensor& dgamma,
                                   Tensor& dbeta) {
  PinThreads();
  CheckF32(x, "BatchNormBackward", "x");
  CheckSameShape(x, dy, "BatchNormBackward");
  CheckSameShape(x, dx, "BatchNormBackward");
  int64_t N, C, S;
  NCS(x, "BatchNormBackward", &N, &C, &S);
  SHOAL_CHECK(gamma.numel() == C && save_mean.numel() == C && save_invstd.numel() == C && dgamma.numel() == C &&
                  dbeta.numel() == C,
              "CpuBackend::BatchNormBackward: per-channel tensors must have " + std::to_string(C) + " elements");
  const int64_t M = N * S;
  const float *xp = x.data<float>(), *dyp = dy.data<float>();
  float* dxp = dx.data<float>();
  const float *g = gamma.data<float>(), *sm = save_mean.data<float>(), *si = save_invstd.data<float>();
  float *dg = dgamma.data<float>(), *db = dbeta.data<float>();
#pragma omp parallel for if (x.numel() > kParallelMin)
  for (int64_t c = 0; c < C; ++c) {
    const float mean = sm[c], invstd = si[c];
    double sdy = 0, sdyx = 0;
    for (int64_t n = 0; n < N; ++n) {
      const float *p = xp + (n * C + c) * S, *d = dyp + (n * C + c) * S;
      float a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
      for (int64_t i = 0; i < S; ++i) {
        a += d[i];
        b += d[i] * (p[i] - mean);
      }
      sdy += a;
      sdyx += b;
    }
    const float dbeta_c = float(sdy), dgamma_c = float(sdyx * invstd);
    db[c] += dbeta_c;
    dg[c] += dgamma_c;
    // dx = gamma*invstd * (dy - mean(dy) - xhat * mean(dy*xhat))
    const float k = g[c] * invstd;
    const float mdy = float(sdy / double(M)), mdyx = float(double(dgamma_c) / double(M)) * invstd;
    for (int64_t n = 0; n < N; ++n) {
      const float *p = xp + (n * C + c) * S, *d = dyp + (n * C + c) * S;
      float* q = dxp + (n * C + c) * S;
#pragma omp simd
      for (int64_t i = 0; i < S; ++i) q[i] = k * (d[i] - mdy - (p[i] - mean) * mdyx);
    }
  }
}

// ---------------------------------------------------------------- elementwise

void CpuBackend::ReluForward(const Tensor& x, Tensor& y) {
  PinThreads();
  CheckF32(x, "ReluForward", "x");
  CheckSameShape(x, y, "ReluForward");
  const float* a = x.data<float>();
  float* o = y.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) o[i] = a[i] > 0 ? a[i] : 0.0f;
}

void CpuBackend::ReluBackward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  PinThreads();
  CheckF32(y, "ReluBackward", "y");
  CheckSameShape(y, dy, "ReluBackward");
  CheckSameShape(y, dx, "ReluBackward");
  const float *a = y.data<float>(), *d = dy.data<float>();
  float* o = dx.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) o[i] = a[i] > 0 ? d[i] : 0.0f;
}

void CpuBackend::Add(const Tensor& a, const Tensor& b, Tensor& y) {
  PinThreads();
  CheckF32(a, "Add", "a");
  CheckSameShape(a, b, "Add");
  CheckSameShape(a, y, "Add");
  const float *p = a.data<float>(), *q = b.data<float>();
  float* o = y.data<float>();
  const int64_t n = a.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) o[i] = p[i] + q[i];
}

void CpuBackend::Axpy(float alpha, const Tensor& x, Tensor& y) {
  PinThreads();
  CheckF32(x, "Axpy", "x");
  SHOAL_CHECK(x.numel() == y.numel(),
              "CpuBackend::Axpy: " + ShapeString(x.shape()) + " into " + ShapeString(y.shape()));
  const float* p = x.data<float>();
  float* o = y.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) o[i] += alpha * p[i];
}

void CpuBackend::Scale(float alpha, Tensor& x) {
  PinThreads();
  CheckF32(x, "Scale", "x");
  float* o = x.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) o[i] *= alpha;
}

// ---------------------------------------------------------------- pooling

namespace {
int64_t PoolOut(int64_t in, int k, int s, int p) { return (in + 2 * p - k) / s + 1; }
}  // namespace

void CpuBackend::MaxPoolForward(const Tensor& x, const PoolParams& p, Tensor& y, Tensor& workspace) {
  PinThreads();
  CheckF32(x, "MaxPoolForward", "x");
  SHOAL_CHECK(x.ndim() == 4, "CpuBackend::MaxPoolForward: expected [N,C,H,W], got " + ShapeString(x.shape()));
  SHOAL_CHECK(p.kh() > 0 && p.kw() > 0 && p.sh() > 0 && p.sw() > 0 && p.ph() >= 0 && p.pw() >= 0 && p.ph() < p.kh() &&
                  p.pw() < p.kw(),
              "CpuBackend::MaxPoolForward: bad kernel/stride/pad " + std::to_string(p.kh()) + "x" +
                  std::to_string(p.kw()) + "/" + std::to_string(p.sh()) + "x" + std::to_string(p.sw()) + "/" +
                  std::to_string(p.ph()) + "x" + std::to_string(p.pw()));
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t Ho = PoolOut(H, p.kh(), p.sh(), p.ph()), Wo = PoolOut(W, p.kw(), p.sw(), p.pw());
  SHOAL_CHECK(
      Ho > 0 && Wo > 0 && y.shape() == Shape({N, C, Ho, Wo}),
      "CpuBackend::MaxPoolForward: output must be " + ShapeString({N, C, Ho, Wo}) + ", got " + ShapeString(y.shape()));
  // The workspace holds the argmax (index within the input plane) as int32 bits.
  if (!workspace.defined() || workspace.numel() != y.numel()) workspace = Empty(y.shape());
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  int32_t* ap = workspace.data<int32_t>();
  if (p.kh() == 2 && p.kw() == 2 && p.sh() == 2 && p.sw() == 2 && p.ph() == 0 &&
      p.pw() == 0) {  // lenet's pools: no bounds checks
#pragma omp parallel for if (x.numel() > kParallelMin)
    for (int64_t nc = 0; nc < N * C; ++nc)
      for (int64_t oh = 0; oh < Ho; ++oh) {
        const float* r0 = xp + nc * H * W + 2 * oh * W;
        const float* r1 = r0 + W;
        float* yo = yp + (nc * Ho + oh) * Wo;
        int32_t* ao = ap + (nc * Ho + oh) * Wo;
        const int32_t base = int32_t(2 * oh * W);
        for (int64_t ow = 0; ow < Wo; ++ow) {
          const int64_t w = 2 * ow;
          // first maximum wins, as in the general loop below
          float best = r0[w];
          int32_t arg = base + int32_t(w);
          if (r0[w + 1] > best) best = r0[w + 1], arg = base + int32_t(w + 1);
          if (r1[w] > best) best = r1[w], arg = base + int32_t(W + w);
          if (r1[w + 1] > best) best = r1[w + 1], arg = base + int32_t(W + w + 1);
          yo[ow] = best;
          ao[ow] = arg;
        }
      }
    return;
  }
#pragma omp parallel for if (x.numel() > kParallelMin)
  for (int64_t nc = 0; nc < N * C; ++nc) {
    const float* plane = xp + nc * H * W;
    for (int64_t oh = 0; oh < Ho; ++oh)
      for (int64_t ow = 0; ow < Wo; ++ow) {
        const int64_t h0 = oh * p.sh() - p.ph(), w0 = ow * p.sw() - p.pw();
        float best = -INFINITY;
        int32_t arg = -1;
        for (int64_t h = std::max<int64_t>(h0, 0); h < std::min<int64_t>(h0 + p.kh(), H); ++h)
          for (int64_t w = std::max<int64_t>(w0, 0); w < std::min<int64_t>(w0 + p.kw(), W); ++w) {
            const float v = plane[h * W + w];
            if (v > best || arg < 0) {
              best = v;
              arg = int32_t(h * W + w);
            }
          }
        yp[(nc * Ho + oh) * Wo + ow] = best;
        ap[(nc * Ho + oh) * Wo + ow] = arg;
      }
  }
}

void CpuBackend::MaxPoolBackward(const Tensor& x, const Tensor& y, const Tensor& dy, const PoolParams& p,
                                 const Tensor& workspace, Tensor& dx) {
  PinThreads();
  (void)p;
  CheckF32(dy, "MaxPoolBackward", "dy");
  CheckSameShape(x, dx, "MaxPoolBackward");
  CheckSameShape(y, dy, "MaxPoolBackward");
  SHOAL_CHECK(workspace.defined() && workspace.numel() == y.numel(),
              "CpuBackend::MaxPoolBackward: workspace is not the one MaxPoolForward filled for this output");
  const int64_t NC = x.dim(0) * x.dim(1), HW = x.dim(2) * x.dim(3), O = y.dim(2) * y.dim(3);
  const float* d = dy.data<float>();
  const int32_t* ap = workspace.data<int32_t>();
  float* o = dx.data<float>();
#pragma omp parallel for if (x.numel() > kParallelMin)
  for (int64_t nc = 0; nc < NC; ++nc) {
    float* plane = o + nc * HW;
    std::fill_n(plane, HW, 0.0f);
    for (int64_t i = 0; i < O; ++i) plane[ap[nc * O + i]] += d[nc * O + i];
  }
}

void CpuBackend::GlobalAvgPoolForward(const Tensor& x, Tensor& y) {
  PinThreads();
  CheckF32(x, "GlobalAvgPoolForward", "x");
  SHOAL_CHECK(x.ndim() == 4 && y.shape() == Shape({x.dim(0), x.dim(1)}),
              "CpuBackend::GlobalAvgPoolForward: " + ShapeString(x.shape()) + " -> " + ShapeString(y.shape()));
  const int64_t NC = x.dim(0) * x.dim(1), S = x.dim(2) * x.dim(3);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const float inv = 1.0f / float(S);
#pragma omp parallel for if (x.numel() > kParallelMin)
  for (int64_t i = 0; i < NC; ++i) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < S; ++j) s += xp[i * S + j];
    yp[i] = s * inv;
  }
}

void CpuBackend::GlobalAvgPoolBackward(const Tensor& dy, Tensor& dx) {
  PinThreads();
  CheckF32(dy, "GlobalAvgPoolBackward", "dy");
  SHOAL_CHECK(dx.ndim() == 4 && dy.shape() == Shape({dx.dim(0), dx.dim(1)}),
              "CpuBackend::GlobalAvgPoolBackward: " + ShapeString(dy.shape()) + " -> " + ShapeString(dx.shape()));
  const int64_t NC = dx.dim(0) * dx.dim(1), S = dx.dim(2) * dx.dim(3);
  const float* d = dy.data<float>();
  float* o = dx.data<float>();
  const float inv = 1.0f / float(S);
#pragma omp parallel for if (dx.numel() > kParallelMin)
  for (int64_t i = 0; i < NC; ++i) {
    const float v = d[i] * inv;
#pragma omp simd
    for (int64_t j = 0; j < S; ++j) o[i * S + j] = v;
  }
}

// ---------------------------------------------------------------- fully connected

void CpuBackend::LinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  PinThreads();
  CheckF32(x, "LinearForward", "x");
  CheckF32(w, "LinearForward", "w");
  SHOAL_CHECK(x.ndim() == 2 && w.ndim() == 2 && x.dim(1) == w.dim(1) && y.shape() == Shape({x.dim(0), w.dim(0)}),
              "CpuBackend::LinearForward: x " + ShapeString(x.shape()) + ", w " + ShapeString(w.shape()) + ", y " +
                  ShapeString(y.shape()) + " do not fit y[N,O] = x[N,I] w[O,I]^T");
  const int64_t N = x.dim(0), I = x.dim(1), O = w.dim(0);
  Gemm('N', 'T', N, O, I, x.data<float>(), I, w.data<float>(), I, 0.0f, y.data<float>(), O);
  if (b.defined()) {
    SHOAL_CHECK(b.numel() == O, "CpuBackend::LinearForward: bias has " + std::to_string(b.numel()) +
                                    " elements, want " + std::to_string(O));
    const float* bp = b.data<float>();
    float* yp = y.data<float>();
    for (int64_t n = 0; n < N; ++n)
#pragma omp simd
      for (int64_t o = 0; o < O; ++o) yp[n * O + o] += bp[o];
  }
}

void CpuBackend::LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                                Tensor* db) {
  PinThreads();
  CheckF32(dy, "LinearBackward", "dy");
  const int64_t N = x.dim(0), I = x.dim(1), O = w.dim(0);
  SHOAL_CHECK(dy.shape() == Shape({N, O}) && dw.shape() == w.shape(),
              "CpuBackend::LinearBackward: dy " + ShapeString(dy.shape()) + " / dw " + ShapeString(dw.shape()) +
                  " do not match x " + ShapeString(x.shape()) + ", w " + ShapeString(w.shape()));
  // dw[O,I] += dy^T x
  Gemm('T', 'N', O, I, N, dy.data<float>(), O, x.data<float>(), I, 1.0f, dw.data<float>(), I);
  if (dx) {
    CheckSameShape(x, *dx, "LinearBackward");
    Gemm('N', 'N', N, I, O, dy.data<float>(), O, w.data<float>(), I, 0.0f, dx->data<float>(), I);
  }
  if (db && db->defined()) {
    SHOAL_CHECK(db->numel() == O, "CpuBackend::LinearBackward: db has " + std::to_string(db->numel()) +
                                      " elements, want " + std::to_string(O));
    const float* d = dy.data<float>();
    float* o = db->data<float>();
    for (int64_t n = 0; n < N; ++n)
#pragma omp simd
      for (int64_t j = 0; j < O; ++j) o[j] += d[n * O + j];
  }
}

// ---------------------------------------------------------------- loss and reductions

float CpuBackend::SoftmaxCrossEntropy(const Tensor& logits, const int32_t* labels, float smoothing, Tensor* dlogits,
                                      int64_t* correct) {
  CheckF32(logits, "SoftmaxCrossEntropy", "logits");
  SHOAL_CHECK(logits.ndim() == 2 && logits.dim(0) > 0,
              "CpuBackend::SoftmaxCrossEntropy: logits must be [N,K] with N > 0, got " + ShapeString(logits.shape()));
  SHOAL_CHECK(smoothing >= 0 && smoothing < 1,
              "CpuBackend::SoftmaxCrossEntropy: label smoothing must be in [0,1), got " + std::to_string(smoothing));
  if (dlogits) CheckSameShape(logits, *dlogits, "SoftmaxCrossEntropy");
  const int64_t N = logits.dim(0), K = logits.dim(1);
  for (int64_t i = 0; i < N; ++i)
    SHOAL_CHECK(labels[i] >= 0 && labels[i] < K, "CpuBackend::SoftmaxCrossEntropy: label " + std::to_string(labels[i]) +
                                                     " at batch index " + std::to_string(i) + " is outside [0," +
                                                     std::to_string(K) + ")");
  const float* z = logits.data<float>();
  float* d = dlogits ? dlogits->data<float>() : nullptr;
  const double off = double(smoothing) / double(K), on = 1.0 - double(smoothing) + off;
  double loss = 0;
  int64_t hits = 0;
  for (int64_t i = 0; i < N; ++i) {
    const float* row = z + i * K;
    int64_t arg = 0;
    for (int64_t k = 1; k < K; ++k)
      if (row[k] > row[arg]) arg = k;
    hits += arg == labels[i];
    const double mx = row[arg];
    double sum = 0, tz = 0;
    for (int64_t k = 0; k < K; ++k) {
      sum += std::exp(double(row[k]) - mx);
      tz += (k == labels[i] ? on : off) * double(row[k]);
    }
    const double lse = mx + std::log(sum);
    loss += lse - tz;  // -sum_k t_k log p_k with sum_k t_k = 1
    if (d) {
      // row may alias d: each element is read before it is overwritten
      for (int64_t k = 0; k < K; ++k) {
        const double pk = std::exp(double(row[k]) - lse);
        d[i * K + k] = float((pk - (k == labels[i] ? on : off)) / double(N));
      }
    }
  }
  if (correct) *correct = hits;
  return float(loss / double(N));
}

double CpuBackend::SumSquares(const Tensor& x) {
  PinThreads();
  CheckF32(x, "SumSquares", "x");
  const float* p = x.data<float>();
  const int64_t n = x.numel();
  double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > kParallelMin)
  for (int64_t i = 0; i < n; i += 1024) {
    float part = 0;
    const int64_t e = std::min(n, i + 1024);
#pragma omp simd reduction(+ : part)
    for (int64_t j = i; j < e; ++j) part += p[j] * p[j];
    s += part;
  }
  return s;
}

std::unique_ptr<Backend> MakeCpuBackend(int threads, DType compute) {
  return std::make_unique<CpuBackend>(threads, compute);
}

}  // namespace shoal
