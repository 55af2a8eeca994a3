// A convolution shape's oneDNN primitives, built once and reused every step.
#pragma once
#include <dnnl.hpp>
#include <vector>

#include "worker/engine/cpu/cpu_backend.h"

namespace shoal {

// One primitive argument: the caller's plain-layout buffer, and the layout the primitive
// chose. When they differ, a cached reorder converts at the call boundary.
struct ConvArg {
  dnnl::memory user, inner;
  dnnl::reorder to_inner, to_user;
  bool reorder = false;

  void Init(const dnnl::memory::desc& plain, const dnnl::memory::desc& chosen, const dnnl::engine& eng);
  // Input: points the user memory at ptr and converts it into the primitive's layout.
  dnnl::memory& In(dnnl::stream& s, const void* ptr);
  // Output: the memory the primitive writes; call Out() afterwards to convert back.
  dnnl::memory& Target(void* ptr);
  void Out(dnnl::stream& s);
};

struct CpuConvPlan {
  bool has_bias = false;
  dnnl::memory::desc x_md, w_md, b_md, y_md;  // plain layouts
  dnnl::memory::dims strides, pad, dilation;
  Shape y_shape;
  // What the primitives are asked for: x, w and dy in the compute type (bf16 or f32), y,
  // dx and dw in f32 (accumulated in f32 either way).
  dnnl::memory::desc ax, aw, ay, ady, adx, adw;

  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  ConvArg f_x, f_w, f_y;
  dnnl::memory f_b, f_scratch;
  dnnl::memory saved_x;  // wraps a caller's `saved` tensor in the forward's src layout

  bool has_bwd = false;
  dnnl::convolution_backward_data bwd_data;
  ConvArg bd_dx, bd_w, bd_dy;
  dnnl::memory bd_scratch, bw_scratch;
  dnnl::convolution_backward_weights bwd_weights;
  ConvArg bw_x, bw_dw, bw_dy;
  bool bw_x_is_fwd_x = false;  // weight-gradient kernel reads x in the forward's layout
  dnnl::memory bw_db;
  std::vector<float> dw_tmp, db_tmp;  // oneDNN overwrites; the Backend contract accumulates
};

}  // namespace shoal
