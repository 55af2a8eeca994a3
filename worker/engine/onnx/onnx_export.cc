#include "worker/engine/onnx/onnx_export.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "common/dtype.h"
#include "common/error.h"
#include "worker/engine/layers/add.h"
#include "worker/engine/layers/batch_norm.h"
#include "worker/engine/layers/conv2d.h"
#include "worker/engine/layers/flatten.h"
#include "worker/engine/layers/global_avg_pool.h"
#include "worker/engine/layers/linear.h"
#include "worker/engine/layers/max_pool.h"
#include "worker/engine/layers/relu.h"

namespace shoal {
namespace {

std::vector<float> ToHost(Backend& be, const Tensor& t, const std::string& name) {
  SHOAL_CHECK(t.dtype() == DType::kF32, "ExportOnnx: " + name + " is not fp32");
  std::vector<float> v(size_t(t.numel()));
  be.CopyToHost(t, v.data());
  return v;
}

// Replaces t's values (whatever field held them) by v, in t's own floating-point type so a
// half or double model stays one.
void SetValues(onnx::TensorProto& t, const std::vector<float>& v) {
  const int type = t.data_type();
  t.clear_float_data();
  t.clear_double_data();
  t.clear_int32_data();
  t.clear_raw_data();
  std::string raw;
  if (type == onnx::TensorProto::FLOAT) {
    raw.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  } else if (type == onnx::TensorProto::DOUBLE) {
    std::vector<double> d(v.begin(), v.end());
    raw.assign(reinterpret_cast<const char*>(d.data()), d.size() * sizeof(double));
  } else if (type == onnx::TensorProto::FLOAT16) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = FloatToHalf(v[i]);
    raw.assign(reinterpret_cast<const char*>(h.data()), h.size() * sizeof(uint16_t));
  } else {
    throw Error("ExportOnnx: initializer '" + t.name() + "' has data type " + std::to_string(type) +
                ", not a float type, yet the model trains it");
  }
  t.set_raw_data(raw);  // little-endian, as ONNX's raw_data is
}

onnx::TensorProto Initializer(Backend& be, const std::string& name, const Tensor& value) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : value.shape()) t.add_dims(d);
  SetValues(t, ToHost(be, value, name));
  return t;
}

// ---- an imported model: its source file with the trained values, in inference form.

onnx::ModelProto FromSource(const Model& m, Backend& be, const std::string& source) {
  onnx::ModelProto proto;
  std::ifstream f(source, std::ios::binary);
  if (!f || !proto.ParseFromIstream(&f)) throw Error("ExportOnnx: cannot read the model's source ONNX file " + source);
  std::map<std::string, const Tensor*> trained;
  for (const Parameter& p : m.parameters()) trained[p.name] = &p.value;
  for (const Buffer& b : m.buffers()) trained[b.name] = &b.value;
  std::set<std::string> written;
  for (onnx::TensorProto& t : *proto.mutable_graph()->mutable_initializer()) {
    auto it = trained.find(t.name());
    if (it == trained.end()) continue;
    const Shape dims(t.dims().begin(), t.dims().end());
    SHOAL_CHECK(dims == it->second->shape(), "ExportOnnx: " + source + ": initializer '" + t.name() + "' is " +
                                                 ShapeString(dims) + " but the model's is " +
                                                 ShapeString(it->second->shape()));
    SetValues(t, ToHost(be, *it->second, t.name()));
    written.insert(t.name());
  }
  for (const auto& kv : trained)
    SHOAL_CHECK(written.count(kv.first),
                "ExportOnnx: " + source + " has no initializer '" + kv.first + "' (was the model imported from it?)");

  // Inference form. The importer refuses graphs that read a BatchNormalization's extra
  // outputs, so dropping them leaves no reader behind.
  for (onnx::NodeProto& n : *proto.mutable_graph()->mutable_node()) {
    if (n.op_type() == "BatchNormalization") {
      auto* attrs = n.mutable_attribute();
      for (int i = attrs->size() - 1; i >= 0; --i)
        if (attrs->Get(i).name() == "training_mode") attrs->DeleteSubrange(i, 1);
      while (n.output_size() > 1) n.mutable_output()->RemoveLast();
    } else if (n.op_type() == "Dropout" && n.input_size() >= 3) {
      // Without training_mode Dropout is the identity; the Constant that fed it stays,
      // unread, so the graph keeps the source's nodes.
      n.mutable_input()->RemoveLast();
    }
  }
  // Graph outputs and shape annotations of the values dropped above go with them.
  onnx::GraphProto& g = *proto.mutable_graph();
  std::set<std::string> made;
  for (const onnx::NodeProto& n : g.node()) made.insert(n.output().begin(), n.output().end());
  for (const onnx::ValueInfoProto& v : g.input()) made.insert(v.name());
  for (const onnx::TensorProto& t : g.initializer()) made.insert(t.name());
  for (auto* list : {g.mutable_output(), g.mutable_value_info()})
    for (int i = list->size() - 1; i >= 0; --i)
      if (!made.count(list->Get(i).name())) list->DeleteSubrange(i, 1);
  return proto;
}

// ---- a zoo model: one ONNX node per layer.

onnx::ValueInfoProto TensorInfo(const std::string& name, const Shape& per_sample) {
  onnx::ValueInfoProto v;
  v.set_name(name);
  onnx::TypeProto_Tensor* tt = v.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("batch");
  for (int64_t d : per_sample) tt->mutable_shape()->add_dim()->set_dim_value(d);
  return v;
}

void Ints(onnx::NodeProto& n, const std::string& name, std::vector<int64_t> v) {
  onnx::AttributeProto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

void Int(onnx::NodeProto& n, const std::string& name, int64_t v) {
  onnx::AttributeProto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

void Float(onnx::NodeProto& n, const std::string& name, float v) {
  onnx::AttributeProto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}

class ZooWriter {
 public:
  ZooWriter(const Model& m, Backend& be) : m_(m), be_(be) {}

  onnx::ModelProto Run() {
    onnx::ModelProto proto;
    proto.set_ir_version(8);
    proto.set_producer_name("shoal");
    onnx::OperatorSetIdProto* op = proto.add_opset_import();
    op->set_domain("");
    op->set_version(17);
    g_ = proto.mutable_graph();
    g_->set_name(m_.name());
    *g_->add_input() = TensorInfo("input", m_.input_shape());
    const Shape out = m_.OutputShape(1);
    *g_->add_output() = TensorInfo("logits", Shape(out.begin() + 1, out.end()));
    names_.assign(size_t(m_.NumNodes()), "");
    names_[0] = "input";
    used_ = {"input", "logits"};
    for (const Parameter& p : m_.parameters()) used_.insert(p.name);
    for (const Buffer& b : m_.buffers()) used_.insert(b.name);
    for (int id = 1; id < m_.NumNodes(); ++id) {
      names_[size_t(id)] = id == m_.NumNodes() - 1 ? "logits" : Unique(m_.NodeName(id));
      AddNode(id);
    }
    return proto;
  }

 private:
  std::string Unique(const std::string& want) {
    std::string name = want;
    for (int k = 1; used_.count(name); ++k) name = want + "_" + std::to_string(k);
    used_.insert(name);
    return name;
  }

  onnx::NodeProto& Node(const std::string& op, const std::string& name, std::vector<std::string> in,
                        const std::string& out) {
    onnx::NodeProto* n = g_->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const std::string& i : in) n->add_input(i);
    n->add_output(out);
    return *n;
  }

  // The node's parameters then buffers as initializers, their names appended to `in`.
  void Weights(int id, std::vector<std::string>& in) {
    for (const Parameter* p : m_.NodeParameters(id)) {
      *g_->add_initializer() = Initializer(be_, p->name, p->value);
      in.push_back(p->name);
    }
    for (const Buffer* b : m_.NodeBuffers(id)) {
      *g_->add_initializer() = Initializer(be_, b->name, b->value);
      in.push_back(b->name);
    }
  }

  void AddNode(int id) {
    const Layer* layer = m_.NodeLayer(id);
    const std::string& name = m_.NodeName(id);
    const std::string& out = names_[size_t(id)];
    std::vector<std::string> in;
    for (int i : m_.NodeInputs(id)) in.push_back(names_[size_t(i)]);
    if (auto* c = dynamic_cast<const Conv2d*>(layer)) {
      const ConvParams& p = c->geometry();
      Weights(id, in);
      onnx::NodeProto& n = Node("Conv", name, in, out);
      Ints(n, "kernel_shape", {c->kernel(), c->kernel()});
      Ints(n, "strides", {p.sh(), p.sw()});
      Ints(n, "pads", {p.ph(), p.pw(), p.ph(), p.pw()});
      Ints(n, "dilations", {p.dh(), p.dw()});
      Int(n, "group", p.groups);
    } else if (auto* b = dynamic_cast<const BatchNorm*>(layer)) {
      Weights(id, in);  // gamma, beta, running_mean, running_var: ONNX's input order
      onnx::NodeProto& n = Node("BatchNormalization", name, in, out);
      Float(n, "epsilon", b->eps());
      Float(n, "momentum", 1.0f - b->momentum());
    } else if (dynamic_cast<const ReLU*>(layer)) {
      Node("Relu", name, in, out);
    } else if (auto* mp = dynamic_cast<const MaxPool*>(layer)) {
      const PoolParams& p = mp->geometry();
      const int kw = p.kernel_w >= 0 ? p.kernel_w : p.kernel, sw = p.stride_w >= 0 ? p.stride_w : p.stride,
                pw = p.pad_w >= 0 ? p.pad_w : p.pad;
      onnx::NodeProto& n = Node("MaxPool", name, in, out);
      Ints(n, "kernel_shape", {p.kernel, kw});
      Ints(n, "strides", {p.stride, sw});
      Ints(n, "pads", {p.pad, pw, p.pad, pw});
    } else if (dynamic_cast<const GlobalAvgPool*>(layer)) {
      // ONNX keeps the 1x1 map; the zoo's layer gives [N, C].
      const std::string pooled = Unique(name + "/pooled");
      Node("GlobalAveragePool", name, in, pooled);
      Int(Node("Flatten", name + "/flatten", {pooled}, out), "axis", 1);
    } else if (dynamic_cast<const Flatten*>(layer)) {
      Int(Node("Flatten", name, in, out), "axis", 1);
    } else if (dynamic_cast<const Linear*>(layer)) {
      Weights(id, in);
      Int(Node("Gemm", name, in, out), "transB", 1);
    } else if (dynamic_cast<const AddLayer*>(layer)) {
      Node("Add", name, in, out);
    } else {
      throw Error("ExportOnnx: model " + m_.name() + ", node " + name + ": layer kind " + layer->Kind() +
                  " has no ONNX export (known: Conv2d, BatchNorm, ReLU, MaxPool, GlobalAvgPool, Flatten, Linear, "
                  "Add; an imported model is exported from its source file)");
    }
  }

  const Model& m_;
  Backend& be_;
  onnx::GraphProto* g_ = nullptr;
  std::vector<std::string> names_;  // per node id, its output value
  std::set<std::string> used_;
};

void Check(const onnx::ModelProto& proto) {
  try {
    onnx::checker::check_model(proto);
    onnx::ModelProto copy = proto;  // inferred shapes stay out of the file
    onnx::shape_inference::InferShapes(copy, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(/*check_type=*/true, /*strict_mode=*/1));
  } catch (const std::exception& e) {
    throw Error(std::string("ExportOnnx: ONNX's checker refuses the exported model: ") + e.what());
  }
}

void Write(const onnx::ModelProto& proto, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error(path + ": cannot write the exported ONNX model");
    if (!proto.SerializeToOstream(&f) || !f.flush()) {
      std::remove(tmp.c_str());
      throw Error(path + ": short write of the exported ONNX model");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(path + ": cannot move the exported ONNX model into place");
  }
}

}  // namespace

void ExportOnnx(const Model& model, Backend& backend, const std::string& out_path, const std::string& source_onnx) {
  const onnx::ModelProto proto =
      source_onnx.empty() ? ZooWriter(model, backend).Run() : FromSource(model, backend, source_onnx);
  Check(proto);
  Write(proto, out_path);
}

}  // namespace shoal
