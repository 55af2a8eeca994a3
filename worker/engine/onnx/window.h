// Window geometry of Conv and the pools: ONNX's kernel_shape, strides, dilations, pads and
// auto_pad, per spatial dimension.
#pragma once
#include <onnx/onnx_pb.h>

#include <string>

#include "worker/engine/tensor.h"

namespace shoal {

// Up to three spatial dimensions; the unused ones are a window of 1 without padding.
struct Window {
  int64_t k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, d[3] = {1, 1, 1}, pb[3] = {0, 0, 0}, pe[3] = {0, 0, 0};
};

// A 1-D spatial input [N,C,L] runs as [N,C,L,1]; 2-D as it is; others are refused.
Shape As4d(const Shape& s, const std::string& where);

// Reads node n's window over `spatial` dimensions of the input shape xs ([N,C,spatial...]).
Window ReadWindow(const onnx::NodeProto& n, const Shape& xs, int spatial, const int64_t* kernel,
                  const std::string& where);

// Whether every dimension is padded as much at its start as at its end.
bool Symmetric(const Window& w);

}  // namespace shoal
