// Cast + transpose kernels for mixed-precision convolution (CudaBackend with compute
// bf16/fp16): fp32 NCHW activations and OIHW weights become the compute type in NHWC/KRSC
// in one pass, and cuDNN's NHWC results come back to fp32 NCHW in one pass. Rounding is
// common/dtype_bits.h's (round to nearest even, the host's bits exactly).
// Plain C++ header over kernels compiled by nvcc (layout_cast.cu).
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace shoal {
namespace cudak {

// Per image i < n, the [c, hw] matrix of fp32 src becomes the [hw, c] matrix of dst in
// `dst_type` (kF16 or kBF16): dst[i][p][k] = round(src[i][k][p]). With n = O, c = I, hw =
// R*S this turns OIHW weights into KRSC.
cudaError_t NchwToNhwc(const float* src, void* dst, int dst_type, int64_t n, int64_t c, int64_t hw, cudaStream_t s);

// The reverse into fp32: dst[i][k][p] = src[i][p][k] (+ bias[k] when bias is not null),
// and when `accumulate`, dst[i][k][p] += that instead (parameter gradients accumulate).
cudaError_t NhwcToNchw(const void* src, int src_type, float* dst, const float* bias, bool accumulate, int64_t n,
                       int64_t c, int64_t hw, cudaStream_t s);

}  // namespace cudak
}  // namespace shoal
