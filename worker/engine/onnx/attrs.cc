#include "worker/engine/onnx/attrs.h"

#include "common/error.h"

namespace shoal {

std::string NodeWhere(const onnx::NodeProto& n) {
  const std::string name = n.name().empty() ? (n.output_size() ? n.output(0) : std::string("?")) : n.name();
  return "node '" + name + "' (" + n.op_type() + ")";
}

const onnx::AttributeProto* FindAttr(const onnx::NodeProto& n, const std::string& name) {
  for (const onnx::AttributeProto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

namespace {
const onnx::AttributeProto* Typed(const onnx::NodeProto& n, const std::string& name,
                                  onnx::AttributeProto_AttributeType type, const char* type_name) {
  const onnx::AttributeProto* a = FindAttr(n, name);
  if (a && a->type() != type && a->type() != onnx::AttributeProto_AttributeType_UNDEFINED)
    throw Error(NodeWhere(n) + ": attribute " + name + " must be " + type_name);
  return a;
}
}  // namespace

int64_t AttrInt(const onnx::NodeProto& n, const std::string& name, int64_t dflt) {
  const onnx::AttributeProto* a = Typed(n, name, onnx::AttributeProto_AttributeType_INT, "an int");
  return a ? a->i() : dflt;
}

float AttrFloat(const onnx::NodeProto& n, const std::string& name, float dflt) {
  const onnx::AttributeProto* a = Typed(n, name, onnx::AttributeProto_AttributeType_FLOAT, "a float");
  return a ? a->f() : dflt;
}

std::string AttrString(const onnx::NodeProto& n, const std::string& name, const std::string& dflt) {
  const onnx::AttributeProto* a = Typed(n, name, onnx::AttributeProto_AttributeType_STRING, "a string");
  return a ? a->s() : dflt;
}

std::vector<int64_t> AttrInts(const onnx::NodeProto& n, const std::string& name) {
  const onnx::AttributeProto* a = Typed(n, name, onnx::AttributeProto_AttributeType_INTS, "a list of ints");
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{};
}

}  // namespace shoal
