// Error checks and RAII holders for the CUDA backend's library handles and descriptors.
#pragma once
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

#include "common/cuda/platform.h"
#include "common/dtype.h"
#include "common/error.h"
#include "worker/engine/cuda/kernels.h"

namespace shoal {
namespace cudautil {

// Each check throws shoal::Error("<where>: <library message>") on failure.
inline void Check(cudaError_t e, const std::string& where) { CheckCuda(e, where); }
inline void Check(cudnnStatus_t e, const std::string& where) {
  if (e != CUDNN_STATUS_SUCCESS) throw Error(where + ": cuDNN " + cudnnGetErrorString(e));
}
// For blas.h calls, which return nullptr or cuBLAS's message.
inline void CheckBlas(const char* err, const std::string& where) {
  if (err != nullptr) throw Error(where + ": cuBLAS " + err);
}

inline int ElemType(DType t) {
  switch (t) {
    case DType::kF16:
      return cudak::kF16;
    case DType::kBF16:
      return cudak::kBF16;
    case DType::kF32:
      break;
  }
  return cudak::kF32;
}

inline cudnnDataType_t CudnnType(DType t) {
  switch (t) {
    case DType::kF16:
      return CUDNN_DATA_HALF;
    case DType::kBF16:
      return CUDNN_DATA_BFLOAT16;
    case DType::kF32:
      break;
  }
  return CUDNN_DATA_FLOAT;
}

// Owns one cuDNN descriptor; Create/Destroy are the library's pair for that type.
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class Desc {
 public:
  Desc() { Check(Create(&d_), "cudnnCreate*Descriptor"); }
  ~Desc() { Destroy(d_); }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  T get() const { return d_; }

 private:
  T d_{};
};

using TensorDesc = Desc<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDesc = Desc<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvDesc =
    Desc<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;
using PoolDesc = Desc<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor>;

}  // namespace cudautil
}  // namespace shoal
