// ExportOnnx: a trained Model as an ONNX inference graph a user deploys (onnxruntime,
// TensorRT, or PyTorch loading the initializers into its module by name).
//
//   ExportOnnx(*model, backend, "trained.onnx", cfg.onnx_model);  // "" for a zoo model
//
// An imported model (source_onnx: the file it came from) is written as that file with every
// initializer that is a parameter or a buffer (batch-norm running statistics) replaced by the
// model's current value, matched by name and kept in the initializer's data type. Everything
// else stays, put in inference form: BatchNormalization on its running statistics (training
// mode off, its extra outputs dropped) and Dropout off; the input's batch dimension stays
// whatever the source had (symbolic in a torch.onnx.export with dynamic_axes).
//
// A zoo model is written as opset 17 (ir_version 8): input "input" [batch, sample...] and
// output "logits" [batch, classes] with a symbolic "batch", one ONNX node per layer (Conv,
// BatchNormalization, Relu, MaxPool, GlobalAveragePool + Flatten, Flatten, Gemm, Add) and the
// parameters and buffers as initializers under the model's names (conv1.weight,
// bn.running_mean).
//
// What is written passes ONNX's checker and strict shape inference first (onnx.checker's
// full_check), and reaches out_path whole or not at all (written aside, then renamed).
// Throws shoal::Error naming the layer kind the exporter does not know, the initializer that
// does not fit, or the path that cannot be written.
#pragma once
#include <string>

#include "worker/engine/model.h"

namespace shoal {

// backend: the model's (its tensors are read through it).
void ExportOnnx(const Model& model, Backend& backend, const std::string& out_path, const std::string& source_onnx = "");

}  // namespace shoal
