// Convolution on oneDNN. Layers hand over plain NCHW/OIHW buffers; the primitives run in
// the blocked layouts oneDNN picks for this machine (format_tag::any), which are several
// times faster than plain-layout kernels for the channel counts of the zoo.
#include <unordered_map>

#include "common/error.h"
#include "worker/engine/cpu/conv_plan.h"
#include "worker/engine/cpu/dnnl_util.h"

namespace shoal {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

void ConvArg::Init(const memory::desc& plain, const memory::desc& chosen, const dnnl::engine& eng) {
  user = memory(plain, eng, DNNL_MEMORY_NONE);
  reorder = plain != chosen;
  if (reorder) {
    inner = memory(chosen, eng);
    to_inner = dnnl::reorder(user, inner);
    to_user = dnnl::reorder(inner, user);
  }
}

memory& ConvArg::In(dnnl::stream& s, const void* ptr) {
  user.set_data_handle(const_cast<void*>(ptr));
  if (!reorder) return user;
  to_inner.execute(s, user, inner);
  return inner;
}

memory& ConvArg::Target(void* ptr) {
  user.set_data_handle(ptr);
  return reorder ? inner : user;
}

void ConvArg::Out(dnnl::stream& s) {
  if (reorder) to_user.execute(s, inner, user);
}

namespace {
memory::desc Any(const memory::dims& d, dt type = dt::f32) { return memory::desc(d, type, tag::any); }

// Scratchpads the plan owns: oneDNN's own are allocated per execution, which showed up as
// page faults every step.
dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}
}  // namespace

CpuConvPlan& CpuBackend::Plan(const Tensor& x, const Tensor& w, bool has_bias, const ConvParams& p) {
  ConvKey key{x.shape(), w.shape(), p, has_bias};
  auto it = conv_plans_.find(key);
  if (it != conv_plans_.end()) return *it->second;

  const int64_t G = p.groups;
  SHOAL_CHECK(G >= 1 && x.ndim() == 4 && w.ndim() == 4 && x.dim(1) == w.dim(1) * G && w.dim(0) % G == 0,
              "CpuBackend::Conv: x " + ShapeString(x.shape()) + " and weights " + ShapeString(w.shape()) +
                  " are not [N,C,H,W] and [O,C/groups,KH,KW] with groups " + std::to_string(G));
  SHOAL_CHECK(p.sh() > 0 && p.sw() > 0 && p.ph() >= 0 && p.pw() >= 0 && p.dh() > 0 && p.dw() > 0,
              "CpuBackend::Conv: bad stride/pad/dilation " + std::to_string(p.sh()) + "x" + std::to_string(p.sw()) +
                  "/" + std::to_string(p.ph()) + "x" + std::to_string(p.pw()) + "/" + std::to_string(p.dh()) + "x" +
                  std::to_string(p.dw()));
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const int64_t O = w.dim(0), KH = w.dim(2), KW = w.dim(3);
  const int64_t Ho = ConvParams::OutSize(H, KH, p.sh(), p.ph(), p.dh());
  const int64_t Wo = ConvParams::OutSize(W, KW, p.sw(), p.pw(), p.dw());
  SHOAL_CHECK(Ho > 0 && Wo > 0,
              "CpuBackend::Conv: kernel " + ShapeString(w.shape()) + " does not fit input " + ShapeString(x.shape()));

  auto plan = std::make_unique<CpuConvPlan>();
  CpuConvPlan& c = *plan;
  const dnnl::engine& eng = dnnl_->engine;
  c.has_bias = has_bias;
  c.x_md = memory::desc({N, C, H, W}, dt::f32, tag::nchw);
  // Grouped weights [O, C/G, KH, KW] are oneDNN's goihw [G, O/G, C/G, KH, KW], same bytes.
  c.w_md = G == 1 ? memory::desc({O, C, KH, KW}, dt::f32, tag::oihw)
                  : memory::desc({G, O / G, C / G, KH, KW}, dt::f32, tag::goihw);
  c.b_md = memory::desc({O}, dt::f32, tag::x);
  c.y_md = memory::desc({N, O, Ho, Wo}, dt::f32, tag::nchw);
  c.y_shape = {N, O, Ho, Wo};
  c.strides = {p.sh(), p.sw()};
  c.pad = {p.ph(), p.pw()};
  c.dilation = {p.dh() - 1, p.dw() - 1};  // oneDNN counts the gaps between taps
  // Measured on this machine kind, 1 thread: blocked layouts with reorders at the
  // boundary beat plain-layout (gemm) kernels 1.5x on lenet and 2.5x on resnet20.
  const dt in = compute_ == DType::kBF16 ? dt::bf16 : dt::f32;
  c.ax = Any(c.x_md.dims(), in);
  c.aw = Any(c.w_md.dims(), in);
  c.ady = Any(c.y_md.dims(), in);
  c.ay = Any(c.y_md.dims());
  c.adx = Any(c.x_md.dims());
  c.adw = Any(c.w_md.dims());

  auto fd =
      has_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                                 c.ax, c.aw, c.b_md, c.ay, c.strides, c.dilation, c.pad, c.pad)
               : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                                 c.ax, c.aw, c.ay, c.strides, c.dilation, c.pad, c.pad);
  c.fwd_pd = dnnl::convolution_forward::primitive_desc(fd, UserScratchpad(), eng);
  c.fwd = dnnl::convolution_forward(c.fwd_pd);
  c.f_scratch = memory(c.fwd_pd.scratchpad_desc(), eng);
  c.f_x.Init(c.x_md, c.fwd_pd.src_desc(), eng);
  c.f_w.Init(c.w_md, c.fwd_pd.weights_desc(), eng);
  c.f_y.Init(c.y_md, c.fwd_pd.dst_desc(), eng);
  if (has_bias) c.f_b = memory(c.b_md, eng, DNNL_MEMORY_NONE);
  c.saved_x = memory(c.fwd_pd.src_desc(), eng, DNNL_MEMORY_NONE);
  return *(conv_plans_[key] = std::move(plan));
}

void CpuBackend::ConvForward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y) {
  ConvFwd(x, w, b, p, y, nullptr);
}

void CpuBackend::ConvForwardTrain(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y,
                                  Tensor& saved) {
  ConvFwd(x, w, b, p, y, &saved);
}

void CpuBackend::ConvBackward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvParams& p, Tensor* dx,
                              Tensor& dw, Tensor* db) {
  ConvBwd(x, nullptr, w, dy, p, dx, dw, db);
}

void CpuBackend::ConvBackwardSaved(const Tensor& x, const Tensor& saved, const Tensor& w, const Tensor& dy,
                                   const ConvParams& p, Tensor* dx, Tensor& dw, Tensor* db) {
  ConvBwd(x, &saved, w, dy, p, dx, dw, db);
}

void CpuBackend::ConvFwd(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y,
                         Tensor* saved) {
  SHOAL_CHECK(x.dtype() == DType::kF32 && w.dtype() == DType::kF32, "CpuBackend::ConvForward: fp32 only");
  PinThreads();
  CpuConvPlan& c = Plan(x, w, b.defined(), p);
  const Shape& want = c.y_shape;
  SHOAL_CHECK(y.shape() == want,
              "CpuBackend::ConvForward: output must be " + ShapeString(want) + ", got " + ShapeString(y.shape()));
  dnnl::stream& s = dnnl_->stream;
  memory* src = nullptr;
  if (saved && c.f_x.reorder) {
    // convert x straight into the caller's `saved` buffer instead of the shared one
    const int64_t floats = int64_t((c.fwd_pd.src_desc().get_size() + 3) / 4);
    if (!saved->defined() || saved->numel() != floats) *saved = Empty({floats});
    c.f_x.user.set_data_handle(x.raw());
    c.saved_x.set_data_handle(saved->raw());
    c.f_x.to_inner.execute(s, c.f_x.user, c.saved_x);
    src = &c.saved_x;
  } else {
    src = &c.f_x.In(s, x.raw());
  }
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, *src},
                                       {DNNL_ARG_WEIGHTS, c.f_w.In(s, w.raw())},
                                       {DNNL_ARG_DST, c.f_y.Target(y.raw())},
                                       {DNNL_ARG_SCRATCHPAD, c.f_scratch}};
  if (c.has_bias) {
    c.f_b.set_data_handle(b.raw());
    args[DNNL_ARG_BIAS] = c.f_b;
  }
  c.fwd.execute(s, args);
  c.f_y.Out(s);
  s.wait();
}

void CpuBackend::ConvBwd(const Tensor& x, const Tensor* saved, const Tensor& w, const Tensor& dy, const ConvParams& p,
                         Tensor* dx, Tensor& dw, Tensor* db) {
  PinThreads();
  SHOAL_CHECK(x.dtype() == DType::kF32 && w.dtype() == DType::kF32 && dy.dtype() == DType::kF32,
              "CpuBackend::ConvBackward: fp32 only");
  const bool want_db = db && db->defined();
  CpuConvPlan& c = Plan(x, w, want_db, p);
  const dnnl::engine& eng = dnnl_->engine;
  const Shape& yshape = c.y_shape;
  SHOAL_CHECK(dy.shape() == yshape && dw.shape() == w.shape(),
              "CpuBackend::ConvBackward: dy " + ShapeString(dy.shape()) + " / dw " + ShapeString(dw.shape()) +
                  " do not match output " + ShapeString(yshape) + " / weights " + ShapeString(w.shape()));
  if (dx)
    SHOAL_CHECK(dx->shape() == x.shape(), "CpuBackend::ConvBackward: dx " + ShapeString(dx->shape()) +
                                              " is not x's shape " + ShapeString(x.shape()));
  if (!c.has_bwd) {
    dnnl::convolution_backward_data::desc dd(dnnl::algorithm::convolution_direct, c.adx, c.aw, c.ady, c.strides,
                                             c.dilation, c.pad, c.pad);
    dnnl::convolution_backward_data::primitive_desc dpd(dd, UserScratchpad(), eng, c.fwd_pd);
    c.bwd_data = dnnl::convolution_backward_data(dpd);
    c.bd_scratch = memory(dpd.scratchpad_desc(), eng);
    c.bd_dx.Init(c.x_md, dpd.diff_src_desc(), eng);
    c.bd_w.Init(c.w_md, dpd.weights_desc(), eng);
    c.bd_dy.Init(c.y_md, dpd.diff_dst_desc(), eng);
    auto wd = want_db ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, c.ax, c.adw,
                                                                 c.b_md, c.ady, c.strides, c.dilation, c.pad, c.pad)
                      : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, c.ax, c.adw,
                                                                 c.ady, c.strides, c.dilation, c.pad, c.pad);
    dnnl::convolution_backward_weights::primitive_desc wpd(wd, UserScratchpad(), eng, c.fwd_pd);
    c.bwd_weights = dnnl::convolution_backward_weights(wpd);
    c.bw_scratch = memory(wpd.scratchpad_desc(), eng);
    c.bw_x.Init(c.x_md, wpd.src_desc(), eng);
    c.bw_x_is_fwd_x = c.f_x.reorder && wpd.src_desc() == c.fwd_pd.src_desc();
    c.bw_dw.Init(c.w_md, wpd.diff_weights_desc(), eng);
    c.bw_dy.Init(c.y_md, wpd.diff_dst_desc(), eng);
    c.dw_tmp.resize(size_t(w.numel()));
    if (want_db) {
      c.db_tmp.resize(size_t(w.dim(0)));
      c.bw_db = memory(c.b_md, eng, c.db_tmp.data());
    }
    c.has_bwd = true;
  }
  dnnl::stream& s = dnnl_->stream;
  // dy in the layout both backward primitives want (usually the same: one reorder)
  memory& dy_w = c.bw_dy.In(s, dy.raw());
  const bool use_saved =
      saved && c.bw_x_is_fwd_x && saved->defined() && size_t(saved->numel()) * 4 >= c.fwd_pd.src_desc().get_size();
  if (use_saved) c.saved_x.set_data_handle(saved->raw());
  std::unordered_map<int, memory> wargs{{DNNL_ARG_SRC, use_saved ? c.saved_x : c.bw_x.In(s, x.raw())},
                                        {DNNL_ARG_DIFF_DST, dy_w},
                                        {DNNL_ARG_DIFF_WEIGHTS, c.bw_dw.Target(c.dw_tmp.data())},
                                        {DNNL_ARG_SCRATCHPAD, c.bw_scratch}};
  if (want_db) wargs[DNNL_ARG_DIFF_BIAS] = c.bw_db;
  c.bwd_weights.execute(s, wargs);
  c.bw_dw.Out(s);
  if (dx) {
    memory& dy_d = (c.bd_dy.reorder && c.bw_dy.reorder && c.bd_dy.inner.get_desc() == c.bw_dy.inner.get_desc())
                       ? c.bw_dy.inner
                       : c.bd_dy.In(s, dy.raw());
    c.bwd_data.execute(s, {{DNNL_ARG_DIFF_DST, dy_d},
                           {DNNL_ARG_WEIGHTS, c.bd_w.In(s, w.raw())},
                           {DNNL_ARG_DIFF_SRC, c.bd_dx.Target(dx->raw())},
                           {DNNL_ARG_SCRATCHPAD, c.bd_scratch}});
    c.bd_dx.Out(s);
  }
  s.wait();
  float* o = dw.data<float>();
  const float* t = c.dw_tmp.data();
  const int64_t n = dw.numel();
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] += t[i];
  if (want_db) {
    float* bo = db->data<float>();
    for (size_t i = 0; i < c.db_tmp.size(); ++i) bo[i] += c.db_tmp[i];
  }
}

}  // namespace shoal
