// The fully connected layer's matrix products. fp32: dnnl_sgemm. bf16 compute: a oneDNN
// matmul primitive (built once per shape) on bf16 copies of both operands, accumulating
// and writing fp32, which runs on AMX or AVX512-BF16.
#include <dnnl.hpp>

#include "common/dtype.h"
#include "common/error.h"
#include "worker/engine/cpu/cpu_backend.h"
#include "worker/engine/cpu/dnnl_util.h"
#include "worker/engine/cpu/matmul_plan.h"

namespace shoal {

using dnnl::memory;
using dt = dnnl::memory::data_type;

namespace {

// A row-major [rows, cols] matrix with leading dimension ld, read as op(X): its
// transpose when t is 'T'.
memory::desc Operand(char t, int64_t rows, int64_t cols, int64_t ld, dt type) {
  return t == 'N' ? memory::desc({rows, cols}, type, memory::dims{ld, 1})
                  : memory::desc({rows, cols}, type, memory::dims{1, ld});
}

void ToBf16(const float* in, int64_t n, std::vector<uint16_t>& out) {
  out.resize(size_t(n));
#pragma omp parallel for if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = FloatToBf16(in[i]);
}

}  // namespace

void CpuBackend::Gemm(char ta, char tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                      int64_t ldb, float beta, float* C, int64_t ldc) {
  if (compute_ != DType::kBF16) {
    dnnl_status_t st = dnnl_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    if (st != dnnl_success) throw Error("CpuBackend: dnnl_sgemm failed with status " + std::to_string(int(st)));
    return;
  }
  SHOAL_CHECK(beta == 0.0f || beta == 1.0f, "CpuBackend::Gemm: beta must be 0 or 1");
  MatmulKey key{ta, tb, M, N, K, lda, ldb, ldc, beta == 1.0f};
  auto& slot = matmul_plans_[key];
  if (!slot) {
    auto plan = std::make_unique<MatmulPlan>();
    const dnnl::engine& eng = dnnl_->engine;
    memory::desc a_md = Operand(ta, M, K, lda, dt::bf16), b_md = Operand(tb, K, N, ldb, dt::bf16);
    memory::desc c_md({M, N}, dt::f32, memory::dims{ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (beta == 1.0f) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng);
    plan->prim = dnnl::matmul(pd);
    plan->a = memory(a_md, eng, DNNL_MEMORY_NONE);
    plan->b = memory(b_md, eng, DNNL_MEMORY_NONE);
    plan->c = memory(c_md, eng, DNNL_MEMORY_NONE);
    plan->scratch = memory(pd.scratchpad_desc(), eng);
    slot = std::move(plan);
  }
  MatmulPlan& p = *slot;
  // Both operands are whole row-major matrices: M*K and K*N elements whatever the op.
  ToBf16(A, M * K, p.a16);
  ToBf16(B, K * N, p.b16);
  p.a.set_data_handle(p.a16.data());
  p.b.set_data_handle(p.b16.data());
  p.c.set_data_handle(C);
  p.prim.execute(dnnl_->stream,
                 {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}, {DNNL_ARG_SCRATCHPAD, p.scratch}});
  dnnl_->stream.wait();
}

}  // namespace shoal
