// HostValue: a small tensor an imported graph computes on the host (shapes, indices, masks,
// constants): the Shape / Gather / Concat / Reshape chains of an export, evaluated for the
// batch size at hand, never on the device and never differentiated.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "worker/engine/tensor.h"

namespace onnx {
class NodeProto;
class TensorProto;
}  // namespace onnx

namespace shoal {

struct HostValue {
  Shape shape;
  bool is_float = false;  // float (ONNX float, double, half) or integer/bool
  std::vector<double> v;  // row-major; doubles hold every int64 a shape needs exactly

  int64_t numel() const { return int64_t(v.size()); }
  // The values as integers (shape arithmetic); throws naming `what` when one is not whole.
  std::vector<int64_t> Ints(const std::string& what) const;
  bool operator==(const HostValue& o) const { return shape == o.shape && is_float == o.is_float && v == o.v; }
};

// Decodes an initializer or a Constant's tensor (raw_data or the typed fields, external data
// refused). `where` names it in errors.
HostValue FromTensorProto(const onnx::TensorProto& t, const std::string& where);

// Evaluates one node whose inputs are all host values. in[i] is null for an absent optional
// input; in_shapes[i] is the shape of input i (for Shape, whose input may live on the device).
// Throws shoal::Error naming the node when its operator has no host evaluation here.
std::vector<HostValue> EvalHost(const onnx::NodeProto& node, int opset, const std::vector<const HostValue*>& in,
                                const std::vector<Shape>& in_shapes);

// The output shape of a view operator (Reshape, Flatten, Squeeze, Unsqueeze; others keep the
// shape) for an input of shape `in_shape`; in[i] holds the node's host inputs (in[0] unused).
Shape ViewShape(const onnx::NodeProto& node, int opset, const Shape& in_shape, const std::vector<const HostValue*>& in);

// What a Slice node takes of an input of `shape`: where it begins and its step in every
// dimension, and the output shape. in[i]: the node's host inputs (starts, ends, axes, steps).
struct SliceWindow {
  std::vector<int64_t> begin, step;
  Shape out;
};
SliceWindow SliceWindowOf(const onnx::NodeProto& node, int opset, const Shape& shape,
                          const std::vector<const HostValue*>& in);
// A Transpose node's permutation for an input of `rank`, checked (each dimension once).
std::vector<int64_t> TransposePerm(const onnx::NodeProto& node, int64_t rank);

// Numpy broadcasting of two shapes; throws naming `where` when they do not broadcast.
Shape BroadcastShapes(const Shape& a, const Shape& b, const std::string& where);

}  // namespace shoal
