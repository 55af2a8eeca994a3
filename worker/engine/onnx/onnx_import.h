// ImportOnnx: any ONNX model (torch.onnx.export of a CNN or a transformer) as a Model of
// Layer nodes, trained like the zoo's models by every algorithm on every backend.
//
//   OnnxOptions o;
//   o.input_shape = {1, 28, 28};  // one sample, as the data has it
//   o.num_classes = 10;
//   std::unique_ptr<Model> m = ImportOnnx("net.onnx", backend, o);
//
// The file is parsed and checked by ONNX's own library (checker, shape inference). Its
// initializers become parameters named as in the file (no weight decay for those of rank
// <= 1: biases, normalization scales and shifts), batch-norm running statistics become
// buffers, and the file's values are the starting weights on every worker. Initializers
// that are not trainable stay constants: integer ones, single numbers, ones holding inf or
// NaN (masks), and those named in o.constants. The graph's first input is the data, its
// first output the logits [N, classes]. What the graph computes from shapes (the
// Shape/Gather/Concat/Reshape chains of an export) is evaluated on the host for each batch
// size the model meets, whatever batch the export used.
//
// Anything outside what is supported (an operator, an attribute, a data type, control
// flow, external weights) throws shoal::InputError naming the node, the file and what is
// supported, before any training starts.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/engine/model.h"

namespace onnx {
class ModelProto;
}

namespace shoal {

struct OnnxOptions {
  Shape input_shape;                   // per sample; empty: the file's (every dimension but the batch fixed)
  int64_t num_classes = 0;             // 0: whatever the file's output has
  uint64_t seed = 0;                   // dropout masks
  std::vector<std::string> constants;  // initializer names never trained
  float label_smoothing = 0;
  // The batch size the graph is built and checked at (the job's); others are bound when met.
  int64_t batch = 1;
  // Accept any output shape (tests of single operators, inference): no [N, classes] check.
  bool any_output = false;
  // The data is a token sequence (input [N, T]): the output must be [N, T, num_classes],
  // logits per position, each with its own label (the loss is the mean over positions).
  bool sequence_output = false;
  // Inference runs of a graph as written (shoal onnx run): batch norm and dropout follow
  // their node's training_mode in evaluation too. Training ignores it: the model's mode rules.
  bool node_training_modes = false;
};

std::unique_ptr<Model> ImportOnnx(const std::string& path, Backend& backend, const OnnxOptions& options);
// The same for a model already in memory; `name` stands for the file in errors.
std::unique_ptr<Model> ImportOnnx(const onnx::ModelProto& model, const std::string& name, Backend& backend,
                                  const OnnxOptions& options);

}  // namespace shoal
