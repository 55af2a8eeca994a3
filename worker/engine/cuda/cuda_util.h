// Error checks and RAII holders for the CUDA backend's library handles and descriptors.
#pragma once
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

#include "common/error.h"

namespace shoal {
namespace cudautil {

// Each check throws shoal::Error("<where>: <library message>") on failure.
inline void Check(cudaError_t e, const std::string& where) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a sticky launch error so the next call starts clean
    throw Error(where + ": " + cudaGetErrorString(e));
  }
}
inline void Check(cudnnStatus_t e, const std::string& where) {
  if (e != CUDNN_STATUS_SUCCESS) throw Error(where + ": cuDNN " + cudnnGetErrorString(e));
}
// For blas.h calls, which return nullptr or cuBLAS's message.
inline void CheckBlas(const char* err, const std::string& where) {
  if (err != nullptr) throw Error(where + ": cuBLAS " + err);
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

using TensorDesc = Desc<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor,
                        cudnnDestroyTensorDescriptor>;
using FilterDesc = Desc<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor,
                        cudnnDestroyFilterDescriptor>;
using ConvDesc = Desc<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                      cudnnDestroyConvolutionDescriptor>;
using PoolDesc = Desc<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor,
                      cudnnDestroyPoolingDescriptor>;

}  // namespace cudautil
}  // namespace shoal
