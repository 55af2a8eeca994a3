// The factories of the layer families in tensor_layers.cc, nn_layers.cc and pool_layers.cc, for
// MakeGraphLayer: each returns null for an operator outside its family.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "worker/engine/onnx/graph_layers.h"

namespace shoal {

// Transpose, Concat, Slice, Split (one layer per output), Gather, Expand, Pad, ReduceMean, ReduceSum.
std::unique_ptr<GraphLayer> MakeTensorLayer(Backend& be, const onnx::NodeProto& n, int opset, int device_inputs);
const std::vector<std::string>& TensorLayerOps();
// A Split's output k as its own layer.
std::unique_ptr<GraphLayer> MakeSplitPart(Backend& be, const onnx::NodeProto& n, int opset, int output);

// Conv, Gemm, MatMul, BatchNormalization, LayerNormalization, Softmax, LogSoftmax, Dropout.
std::unique_ptr<GraphLayer> MakeNnLayer(Backend& be, const onnx::NodeProto& n, int opset, int device_inputs,
                                        uint64_t seed, bool node_modes);
const std::vector<std::string>& NnLayerOps();

// MaxPool, AveragePool, GlobalAveragePool (1-D to 3-D).
std::unique_ptr<GraphLayer> MakePoolLayer(Backend& be, const onnx::NodeProto& n);
const std::vector<std::string>& PoolLayerOps();

}  // namespace shoal
