// The mixed mode of CudaBackend (Options::compute = kBF16/kF16): fp32 tensors at the
// interface, convolution and the fully connected layer computed on narrow copies of their
// inputs with fp32 accumulation (see cuda_backend.h). Validation happens in the callers
// (ConvFwd/ConvBwd, LinearForward/Backward); these bodies only cast and compute.
#include "common/error.h"
#include "worker/engine/cuda/blas.h"
#include "worker/engine/cuda/cuda_backend.h"
#include "worker/engine/cuda/kernels.h"
#include "worker/engine/cuda/layout_cast.h"

namespace shoal {

using cudautil::Check;
using cudautil::ElemType;

namespace {

size_t Align256(size_t b) { return (b + 255) / 256 * 256; }

// How a [n, c, hw] fp32 tensor is laid out in the compute type: NHWC, or (NCHW plans)
// unchanged, which is the c = 1 case of the same transpose.
struct View {
  int64_t n, c, hw;
};
View Layout(bool nhwc, int64_t n, int64_t c, int64_t hw) { return nhwc ? View{n, c, hw} : View{n, 1, c * hw}; }

}  // namespace

void CudaBackend::ToCompute(const float* src, void* dst, int64_t n, int64_t c, int64_t hw, const char* what) {
  Check(cudak::NchwToNhwc(src, dst, ElemType(options_.compute), n, c, hw, stream_), Where(what));
}

void CudaBackend::FromCompute(const void* src, float* dst, const float* bias, bool accumulate, int64_t n, int64_t c,
                              int64_t hw, const char* what) {
  Check(cudak::NhwcToNchw(src, ElemType(options_.compute), dst, bias, accumulate, n, c, hw, stream_), Where(what));
}

// ---- convolution

void CudaBackend::MixedConvFwd(CudaConvPlan& pl, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y,
                               Tensor* saved) {
  const int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3), rs = w.dim(2) * w.dim(3);
  const int64_t ohw = pl.ho * pl.wo;
  const size_t es = DTypeSize(pl.dtype);
  const size_t wb = Align256(size_t(w.numel()) * es), yb = Align256(size_t(y.numel()) * es);
  const size_t xb = Align256(size_t(x.numel()) * es);
  // Scratch: w | y | x (x goes to `saved` instead when the caller keeps it for the backward).
  char* s = static_cast<char*>(Scratch(wb + yb + (saved ? 0 : xb)));
  void* wl = s;
  void* yl = s + wb;
  void* xl = s + wb + yb;
  if (saved != nullptr) {
    const Shape shape = pl.nhwc ? Shape{n, x.dim(2), x.dim(3), c} : x.shape();
    if (!saved->defined() || saved->dtype() != pl.dtype || saved->shape() != shape || !(saved->device() == device()))
      *saved = Empty(shape, pl.dtype);
    xl = saved->raw();
  }
  const View xv = Layout(pl.nhwc, n, c, hw), wv = Layout(pl.nhwc, pl.o, w.dim(1), rs),
             yv = Layout(pl.nhwc, n, pl.o, ohw);
  ToCompute(x.data<float>(), xl, xv.n, xv.c, xv.hw, "ConvForward x cast");
  ToCompute(w.data<float>(), wl, wv.n, wv.c, wv.hw, "ConvForward w cast");
  const float one = 1.f, zero = 0.f;
  Check(cudnnSetConvolutionMathType(pl.conv.get(), pl.fwd_math), Where("ConvForward"));
  void* ws = Workspace(pl.fwd_bytes);
  Check(cudnnConvolutionForward(cudnn_, &one, pl.x.get(), xl, pl.w.get(), wl, pl.conv.get(), pl.fwd, ws, pl.fwd_bytes,
                                &zero, pl.y.get(), yl),
        Where("cudnnConvolutionForward"));
  // The bias is added in fp32, fused into the way back where the layout has channels.
  const float* bias = b.defined() ? b.data<float>() : nullptr;
  FromCompute(yl, y.data<float>(), pl.nhwc ? bias : nullptr, false, yv.n, yv.c, yv.hw, "ConvForward y cast");
  if (bias != nullptr && !pl.nhwc)
    Check(cudak::BiasAdd(cudak::kF32, y.raw(), b.raw(), n, pl.o, ohw, stream_), Where("ConvForward bias"));
}

void CudaBackend::MixedConvBwd(CudaConvPlan& pl, const Tensor& x, const Tensor* saved, const Tensor& w,
                               const Tensor& dy, Tensor* dx, Tensor& dw, Tensor* db) {
  const int64_t n = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3), rs = w.dim(2) * w.dim(3);
  const int64_t ohw = pl.ho * pl.wo;
  const size_t es = DTypeSize(pl.dtype);
  const size_t wb = Align256(size_t(w.numel()) * es), yb = Align256(size_t(dy.numel()) * es);
  const size_t xb = Align256(size_t(x.numel()) * es);
  // The forward's narrow copy of x when the caller kept one (same plan, so same layout).
  const bool reuse = saved != nullptr && saved->defined() && saved->dtype() == pl.dtype &&
                     saved->numel() == x.numel() && saved->device() == device();
  // Scratch: dy | dw | w | dx | x; the last three only when needed.
  char* s = static_cast<char*>(Scratch(yb + wb + (dx ? wb + xb : 0) + (reuse ? 0 : xb)));
  void* dyl = s;
  void* dwl = s + yb;
  void* wl = s + yb + wb;
  void* dxl = s + yb + 2 * wb;
  const void* xl = reuse ? saved->raw() : s + yb + wb + (dx ? wb + xb : 0);
  const View xv = Layout(pl.nhwc, n, c, hw), wv = Layout(pl.nhwc, pl.o, w.dim(1), rs),
             yv = Layout(pl.nhwc, n, pl.o, ohw);
  ToCompute(dy.data<float>(), dyl, yv.n, yv.c, yv.hw, "ConvBackward dy cast");
  if (!reuse) ToCompute(x.data<float>(), const_cast<void*>(xl), xv.n, xv.c, xv.hw, "ConvBackward x cast");
  const float one = 1.f, zero = 0.f;
  // cuDNN writes the narrow dw (beta = 0); the way back to fp32 accumulates into dw, as the
  // Backend contract asks of parameter gradients.
  Check(cudnnSetConvolutionMathType(pl.conv.get(), pl.bwd_filter_math), Where("ConvBackward"));
  void* ws = Workspace(pl.bwd_filter_bytes);
  Check(cudnnConvolutionBackwardFilter(cudnn_, &one, pl.x.get(), xl, pl.y.get(), dyl, pl.conv.get(), pl.bwd_filter, ws,
                                       pl.bwd_filter_bytes, &zero, pl.w.get(), dwl),
        Where("cudnnConvolutionBackwardFilter"));
  FromCompute(dwl, dw.data<float>(), nullptr, true, wv.n, wv.c, wv.hw, "ConvBackward dw cast");
  // db from the fp32 dy: no rounding at all.
  if (db)
    Check(cudak::BiasGradAccumulate(cudak::kF32, dy.raw(), db->raw(), n, pl.o, ohw, stream_), Where("ConvBackward db"));
  if (dx) {
    ToCompute(w.data<float>(), wl, wv.n, wv.c, wv.hw, "ConvBackward w cast");
    Check(cudnnSetConvolutionMathType(pl.conv.get(), pl.bwd_data_math), Where("ConvBackward"));
    ws = Workspace(pl.bwd_data_bytes);
    Check(cudnnConvolutionBackwardData(cudnn_, &one, pl.w.get(), wl, pl.y.get(), dyl, pl.conv.get(), pl.bwd_data, ws,
                                       pl.bwd_data_bytes, &zero, pl.x.get(), dxl),
          Where("cudnnConvolutionBackwardData"));
    FromCompute(dxl, dx->data<float>(), nullptr, false, xv.n, xv.c, xv.hw, "ConvBackward dx cast");
  }
}

// ---- fully connected: narrow copies of x, w (and dy) in row-major order as they are;
// cublasGemmEx reads them and writes fp32 C directly (fp32 accumulation), so y, dx and the
// accumulating dw never pass through the narrow type.

void CudaBackend::MixedLinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  const int N = int(x.dim(0)), I = int(x.dim(1)), O = int(w.dim(0));
  const size_t es = DTypeSize(options_.compute);
  const size_t xb = Align256(size_t(x.numel()) * es);
  char* s = static_cast<char*>(Scratch(xb + Align256(size_t(w.numel()) * es)));
  ToCompute(x.data<float>(), s, 1, 1, x.numel(), "LinearForward x cast");
  ToCompute(w.data<float>(), s + xb, 1, 1, w.numel(), "LinearForward w cast");
  cudautil::CheckBlas(blas::GemmMixed(cublas_, ElemType(options_.compute), true, false, O, N, I, 1.f, s + xb, I, s, I,
                                      0.f, y.data<float>(), O),
                      Where("LinearForward gemm"));
  if (b.defined()) Check(cudak::BiasAdd(cudak::kF32, y.raw(), b.raw(), N, O, 1, stream_), Where("LinearForward bias"));
}

void CudaBackend::MixedLinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                                      Tensor* db) {
  const int N = int(x.dim(0)), I = int(x.dim(1)), O = int(w.dim(0));
  const int type = ElemType(options_.compute);
  const size_t es = DTypeSize(options_.compute);
  const size_t xb = Align256(size_t(x.numel()) * es), yb = Align256(size_t(dy.numel()) * es);
  char* s = static_cast<char*>(Scratch(xb + yb + (dx ? Align256(size_t(w.numel()) * es) : 0)));
  char *xl = s, *dyl = s + xb, *wl = s + xb + yb;
  ToCompute(x.data<float>(), xl, 1, 1, x.numel(), "LinearBackward x cast");
  ToCompute(dy.data<float>(), dyl, 1, 1, dy.numel(), "LinearBackward dy cast");
  // dw^T [I, O] += x^T [I, N] * (dy^T [O, N])^T, straight into the fp32 gradient (beta = 1).
  cudautil::CheckBlas(
      blas::GemmMixed(cublas_, type, false, true, I, O, N, 1.f, xl, I, dyl, O, 1.f, dw.data<float>(), I),
      Where("LinearBackward dw gemm"));
  if (db != nullptr)
    Check(cudak::BiasGradAccumulate(cudak::kF32, dy.raw(), db->raw(), N, O, 1, stream_), Where("LinearBackward db"));
  if (dx != nullptr) {
    ToCompute(w.data<float>(), wl, 1, 1, w.numel(), "LinearBackward w cast");
    // dx^T [I, N] = w^T [I, O] * dy^T [O, N]
    cudautil::CheckBlas(
        blas::GemmMixed(cublas_, type, false, false, I, N, O, 1.f, wl, I, dyl, O, 0.f, dx->data<float>(), I),
        Where("LinearBackward dx gemm"));
  }
}

}  // namespace shoal
