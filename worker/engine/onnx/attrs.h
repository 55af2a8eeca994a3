// Reading an ONNX node's attributes, with the node named in every error.
#pragma once
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shoal {

// "node 'conv1' (Conv)": how errors name a node.
std::string NodeWhere(const onnx::NodeProto& n);
const onnx::AttributeProto* FindAttr(const onnx::NodeProto& n, const std::string& name);
int64_t AttrInt(const onnx::NodeProto& n, const std::string& name, int64_t dflt);
float AttrFloat(const onnx::NodeProto& n, const std::string& name, float dflt);
std::string AttrString(const onnx::NodeProto& n, const std::string& name, const std::string& dflt);
// Empty when absent.
std::vector<int64_t> AttrInts(const onnx::NodeProto& n, const std::string& name);
// Whether input i is present (optional inputs may be missing or named "").
inline bool HasInput(const onnx::NodeProto& n, int i) { return i < n.input_size() && !n.input(i).empty(); }

}  // namespace shoal
