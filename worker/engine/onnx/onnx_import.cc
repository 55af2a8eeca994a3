#include "worker/engine/onnx/onnx_import.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "common/error.h"
#include "worker/engine/onnx/attrs.h"
#include "worker/engine/onnx/graph_layers.h"
#include "worker/engine/onnx/layer_families.h"

namespace shoal {
namespace {

constexpr int kNoNode = -1;

// One value of the graph: where it comes from and, per batch size, what it is.
struct Value {
  bool is_host = false;             // known before training (computed on the host)
  std::unique_ptr<HostValue> host;  // its value, when is_host (stable address: ConstLayers read it)
  const onnx::TensorProto* init = nullptr;
  bool trainable = false;  // an initializer the optimizer trains
  int model_id = kNoNode;  // its Model node once used as a device tensor
  Shape shape;             // for the batch size bound last
};

// One step of the per-batch binding: a host evaluation, or the layers of a device node.
struct Step {
  const onnx::NodeProto* node;
  std::vector<GraphLayer*> layers;                        // one per output (Split), else one
  std::vector<std::pair<int, ExtraOutputLayer*>> extras;  // further outputs read later: (output, layer)
};

class Importer {
 public:
  // From a file (model null) or a model in memory (`path` names it in errors).
  Importer(const std::string& path, const onnx::ModelProto* model, Backend& be, const OnnxOptions& o)
      : path_(path), be_(be), o_(o) {
    if (model) {
      model_ = *model;
      from_memory_ = true;
    }
  }

  // Builds the model; `self` (this importer) stays alive in the model's batch hook, which
  // re-evaluates the graph's shape arithmetic for each new batch size before the layers run.
  std::unique_ptr<Model> Run(std::shared_ptr<Importer> self) {
    Load();
    const onnx::GraphProto& g = model_.graph();
    Classify(g);
    model_out_ = std::make_unique<Model>(be_, "onnx:" + Basename(path_), input_shape_);
    values_[input_].model_id = Model::kInput;
    Bind(std::max<int64_t>(1, o_.batch), /*build=*/true);
    FinishOutput(g);
    model_out_->set_batch_hook([self](int64_t batch) { self->Bind(batch, false); });
    return std::move(model_out_);
  }

 private:
  [[noreturn]] void Fail(const std::string& what) const { throw InputError(path_ + ": " + what); }

  static std::string Basename(const std::string& p) {
    const size_t s = p.find_last_of('/');
    return s == std::string::npos ? p : p.substr(s + 1);
  }

  void Load() {
    if (!from_memory_) {
      std::ifstream f(path_, std::ios::binary);
      if (!f) Fail("cannot open the ONNX model ([model] onnx)");
      if (!model_.ParseFromIstream(&f)) Fail("is not an ONNX model (the protobuf does not parse)");
    }
    try {
      onnx::checker::check_model(model_);
    } catch (const std::exception& e) {
      Fail(std::string("ONNX's checker refuses the model: ") + e.what());
    }
    try {
      onnx::shape_inference::InferShapes(model_);
    } catch (const std::exception& e) {
      Fail(std::string("ONNX's shape inference fails: ") + e.what());
    }
    for (const onnx::OperatorSetIdProto& id : model_.opset_import())
      if (id.domain().empty() || id.domain() == "ai.onnx") opset_ = int(id.version());
    if (opset_ == 0) Fail("imports no opset of the default ONNX domain");
  }

  void Classify(const onnx::GraphProto& g) {
    std::set<std::string> constants(o_.constants.begin(), o_.constants.end());
    for (const onnx::TensorProto& t : g.initializer()) {
      Value& v = values_[t.name()];
      v.init = &t;
    }
    // The data: the first graph input that is not an initializer.
    for (const onnx::ValueInfoProto& in : g.input()) {
      if (values_.count(in.name()) && values_[in.name()].init) continue;
      if (!input_.empty()) continue;  // further inputs: refused below if a node reads them
      input_ = in.name();
      Shape file;
      for (const onnx::TensorShapeProto_Dimension& d : in.type().tensor_type().shape().dim())
        file.push_back(d.has_dim_value() ? d.dim_value() : -1);
      if (file.empty()) Fail("input '" + input_ + "' has no shape");
      Shape sample(file.begin() + 1, file.end());
      if (o_.input_shape.empty()) {
        for (int64_t d : sample)
          if (d <= 0) Fail("input '" + input_ + "' has a symbolic dimension besides the batch; the data must fix it");
        input_shape_ = sample;
      } else {
        input_shape_ = o_.input_shape;
        bool fits = sample.size() == input_shape_.size();
        for (size_t i = 0; fits && i < sample.size(); ++i) fits = sample[i] <= 0 || sample[i] == input_shape_[i];
        if (!fits)
          Fail("input '" + input_ + "' takes samples of " + ShapeString(sample) + " but the data has " +
               ShapeString(input_shape_));
      }
    }
    if (input_.empty()) Fail("has no input for the data");
    values_[input_];

    // Which initializers feed a device position, which a BN's statistics.
    std::set<std::string> device_use, stats;
    for (const onnx::NodeProto& n : g.node()) {
      if (!n.domain().empty() && n.domain() != "ai.onnx")
        Fail(NodeWhere(n) + " is in domain '" + n.domain() + "'; only the default ONNX domain is supported");
      if (n.op_type() == "If" || n.op_type() == "Loop" || n.op_type() == "Scan")
        Fail(NodeWhere(n) + ": control flow (If, Loop, Scan) is not supported");
      for (int i = 0; i < n.input_size(); ++i) {
        if (n.input(i).empty()) continue;
        if (n.op_type() == "BatchNormalization" && i >= 3)
          stats.insert(n.input(i));
        else if (!IsHostInput(n.op_type(), i, opset_) && !(n.op_type() == "Shape" || n.op_type() == "Size"))
          device_use.insert(n.input(i));
      }
    }
    for (const onnx::TensorProto& t : g.initializer()) {
      Value& v = values_[t.name()];
      const bool is_float = t.data_type() == onnx::TensorProto::FLOAT || t.data_type() == onnx::TensorProto::DOUBLE ||
                            t.data_type() == onnx::TensorProto::FLOAT16;
      HostValue h = FromTensorProto(t, path_ + ": initializer '" + t.name() + "'");
      bool finite = true;
      for (double x : h.v) finite = finite && std::isfinite(x);
      v.trainable = is_float && h.numel() > 1 && finite && device_use.count(t.name()) && !stats.count(t.name()) &&
                    !constants.count(t.name());
      if (!v.trainable) {
        v.is_host = true;
        v.host = std::make_unique<HostValue>(std::move(h));
        v.shape = v.host->shape;
      } else {
        trainable_init_[t.name()] = std::move(h);
      }
    }
    for (const std::string& c : constants)
      if (!values_.count(c) || !values_[c].init) Fail("[model] onnx_constants names '" + c + "', no initializer");
  }

  // Evaluates the graph's host values for `batch` and binds every layer; with build, makes
  // the layers and the Model's nodes as it goes.
  void Bind(int64_t batch, bool build) {
    Shape in = {batch};
    in.insert(in.end(), input_shape_.begin(), input_shape_.end());
    values_[input_].shape = in;
    const onnx::GraphProto& g = model_.graph();
    if (build) steps_.reserve(size_t(g.node_size()));
    for (int k = 0; k < g.node_size(); ++k) {
      const onnx::NodeProto& n = g.node(k);
      if (build) steps_.push_back(Plan(n));
      Step& st = steps_[size_t(k)];
      std::vector<const HostValue*> host(size_t(n.input_size()), nullptr);
      std::vector<Shape> shapes(size_t(n.input_size()));
      for (int i = 0; i < n.input_size(); ++i) {
        if (n.input(i).empty()) continue;
        Value& v = Get(n, n.input(i));
        shapes[size_t(i)] = v.shape;
        if (v.is_host) host[size_t(i)] = v.host.get();
      }
      if (st.layers.empty()) {  // evaluated on the host
        std::vector<HostValue> out;
        try {
          out = EvalHost(n, opset_, host, shapes);
        } catch (const InputError&) {
          throw;
        } catch (const Error& e) {
          Fail(e.what());
        }
        for (int j = 0; j < n.output_size() && j < int(out.size()); ++j) {
          if (n.output(j).empty()) continue;
          Value& v = values_[n.output(j)];
          v.is_host = true;
          if (!v.host) v.host = std::make_unique<HostValue>();
          *v.host = std::move(out[size_t(j)]);
          v.shape = v.host->shape;
        }
        continue;
      }
      std::vector<int> ids;
      std::vector<Shape> dev_shapes;
      if (build) {
        for (int i = 0; i < n.input_size(); ++i)
          if (!n.input(i).empty() && DeviceInput(n, i)) ids.push_back(DeviceId(n.input(i)));
      }
      for (int i = 0; i < n.input_size(); ++i)
        if (!n.input(i).empty() && DeviceInput(n, i)) dev_shapes.push_back(values_[n.input(i)].shape);
      for (size_t j = 0; j < st.layers.size(); ++j) {
        GraphLayer* layer = st.layers[j];
        const std::string& out_name = n.output(int(j));
        try {
          layer->Bind(host);
          values_[out_name].shape = layer->OutputShape(dev_shapes);
        } catch (const InputError&) {
          throw;
        } catch (const Error& e) {
          Fail(std::string(e.what()) + " (batch " + std::to_string(batch) + ")");
        }
        if (build) {
          std::unique_ptr<GraphLayer> owned(pending_[j].release());
          values_[out_name].model_id = model_out_->AddNode(out_name, std::move(owned), ids, values_[out_name].shape);
        }
      }
      for (size_t e = 0; e < st.extras.size(); ++e) {
        const auto& [j, layer] = st.extras[e];
        const std::string& out_name = n.output(j);
        layer->set_source_inputs(dev_shapes);
        values_[out_name].shape = layer->OutputShape({});
        if (build) {
          std::unique_ptr<GraphLayer> owned(extra_pending_[e].release());
          values_[out_name].model_id =
              model_out_->AddNode(out_name, std::move(owned), {values_[n.output(0)].model_id}, values_[out_name].shape);
        }
      }
      pending_.clear();
      extra_pending_.clear();
    }
    for (ConstLayer* c : consts_) c->Bind({});
  }

  Value& Get(const onnx::NodeProto& n, const std::string& name) {
    auto it = values_.find(name);
    if (it == values_.end()) Fail(NodeWhere(n) + " reads '" + name + "', which no earlier node or initializer makes");
    return it->second;
  }

  // Whether input i of n is read as a device tensor (else as a host value).
  bool DeviceInput(const onnx::NodeProto& n, int i) const {
    if (n.op_type() == "BatchNormalization") return i < 3;
    return !IsHostInput(n.op_type(), i, opset_);
  }

  // Decides how node n runs: on the host when every input it reads is known before training
  // (or it only reads shapes), else as device layers; makes those layers.
  Step Plan(const onnx::NodeProto& n) {
    bool all_host = true;
    for (int i = 0; i < n.input_size(); ++i) {
      if (n.input(i).empty()) continue;
      const Value& v = Get(n, n.input(i));
      const bool reads_shape_only = n.op_type() == "Shape" || n.op_type() == "Size";
      if (!v.is_host && !reads_shape_only) all_host = false;
      if (!v.is_host && !reads_shape_only && !DeviceInput(n, i))
        Fail(NodeWhere(n) + ": input " + std::to_string(i) + " ('" + n.input(i) +
             "') must be known before training (a shape, axes, pads or a ratio), but it depends on the data or the "
             "weights");
    }
    const bool host_only_op = n.op_type() == "Shape" || n.op_type() == "Size" || n.op_type() == "Constant" ||
                              n.op_type() == "ConstantOfShape" || n.op_type() == "Range";
    if (all_host || host_only_op) {
      for (int j = 0; j < n.output_size(); ++j) values_[n.output(j)].is_host = true;
      return Step{&n, {}};
    }
    int device_inputs = 0;
    for (int i = 0; i < n.input_size(); ++i) device_inputs += !n.input(i).empty() && DeviceInput(n, i);
    Step st{&n, {}};
    if (n.op_type() == "Split") {
      for (int j = 0; j < n.output_size(); ++j) {
        pending_.push_back(MakeSplitPart(be_, n, opset_, j));
        st.layers.push_back(pending_.back().get());
      }
    } else {
      try {
        pending_.push_back(MakeGraphLayer(be_, n, opset_, device_inputs, o_.seed + uint64_t(steps_.size()) * 7919,
                                          o_.node_training_modes));
      } catch (const InputError&) {
        throw;
      } catch (const Error& e) {
        Fail(e.what());
      }
      GraphLayer* main = pending_.back().get();
      st.layers.push_back(main);
      for (int j = 1; j < n.output_size(); ++j) {
        if (n.output(j).empty()) continue;
        if (!main->HasExtraOutput(j)) {
          used_extra_outputs_.insert(n.output(j));  // refused if a later node reads it
          continue;
        }
        extra_pending_.push_back(std::make_unique<ExtraOutputLayer>(be_, n, main, j));
        st.extras.emplace_back(j, extra_pending_.back().get());
      }
    }
    for (int j = 0; j < n.output_size(); ++j) values_[n.output(j)].is_host = false;
    for (int i = 0; i < n.input_size(); ++i)
      if (used_extra_outputs_.count(n.input(i)))
        Fail(NodeWhere(n) + " reads '" + n.input(i) +
             "', an extra output (mask, indices, statistics) of an "
             "operator; only first outputs are supported");
    return st;
  }

  // The Model node that outputs `name` as a device tensor: a parameter, or an upload of a
  // host value, made on first use.
  int DeviceId(const std::string& name) {
    if (used_extra_outputs_.count(name))
      Fail("'" + name + "' is an extra output of an operator; only first outputs are supported");
    Value& v = values_[name];
    if (v.model_id != kNoNode) return v.model_id;
    if (v.trainable) {
      HostValue& h = trainable_init_[name];
      const bool no_decay = h.shape.size() <= 1;
      v.shape = h.shape;
      v.model_id = model_out_->AddNode(name, std::make_unique<ParamLayer>(be_, name, h, no_decay), {}, h.shape);
      return v.model_id;
    }
    if (v.is_host) {
      auto c = std::make_unique<ConstLayer>(be_, name, v.host.get());
      c->Bind({});
      consts_.push_back(c.get());
      v.model_id = model_out_->AddNode(name, std::move(c), {}, v.host->shape);
      return v.model_id;
    }
    Fail("'" + name + "' is read before a node makes it");
  }

  void FinishOutput(const onnx::GraphProto& g) {
    if (g.output_size() == 0) Fail("has no output");
    const std::string& out = g.output(0).name();
    Value& v = values_[out];
    if (v.is_host) Fail("output '" + out + "' does not depend on the data");
    if (used_extra_outputs_.count(out))
      Fail("output '" + out +
           "' is an extra output (mask, indices, statistics) of an operator; only first outputs are "
           "supported");
    DeviceId(out);  // a parameter output as it is; a name nothing makes fails there
    if (v.model_id != model_out_->OutputNodeId()) {
      // A later node made something else: end on an identity of the output.
      onnx::NodeProto id;
      id.set_op_type("Identity");
      id.set_name(out + "/output");
      id.add_input(out);
      id.add_output(out + "/output");
      keep_nodes_.push_back(std::make_unique<onnx::NodeProto>(id));
      auto layer = MakeGraphLayer(be_, *keep_nodes_.back(), opset_, 1, 0, false);
      layer->Bind({nullptr});
      model_out_->AddNode(out + "/output", std::move(layer), {v.model_id}, v.shape);
    }
    if (o_.any_output) return;
    const Shape s = model_out_->OutputShape(1);
    if (o_.sequence_output) {
      // One label per input position: the logits must line up with the tokens.
      const int64_t T = o_.input_shape.empty() ? -1 : o_.input_shape[0];
      if (s.size() != 3 || (T > 0 && s[1] != T))
        Fail("output '" + out + "' is " + ShapeString(s) +
             " for one sample; a model of token sequences must output [N, T, vocab] with T = [data] seq_len" +
             (T > 0 ? " = " + std::to_string(T) : std::string()));
      if (o_.num_classes > 0 && s[2] != o_.num_classes)
        Fail("output '" + out + "' has " + std::to_string(s[2]) + " logits per position but [data] vocab_size is " +
             std::to_string(o_.num_classes));
      return;
    }
    if (s.size() != 2)
      Fail("output '" + out + "' is " + ShapeString(s) + " for one sample; the logits must be [N, classes]" +
           (s.size() == 3 ? " ([N, T, vocab] only for [data] format = \"tokens\")" : ""));
    if (o_.num_classes > 0 && s[1] != o_.num_classes)
      Fail("output '" + out + "' has " + std::to_string(s[1]) + " classes but the data has " +
           std::to_string(o_.num_classes));
  }

  std::string path_;
  Backend& be_;
  OnnxOptions o_;
  onnx::ModelProto model_;
  bool from_memory_ = false;
  int opset_ = 0;
  std::string input_;
  Shape input_shape_;
  std::map<std::string, Value> values_;
  std::map<std::string, HostValue> trainable_init_;
  std::vector<Step> steps_;
  std::vector<std::unique_ptr<GraphLayer>> pending_;
  std::vector<std::unique_ptr<ExtraOutputLayer>> extra_pending_;
  std::vector<ConstLayer*> consts_;
  std::set<std::string> used_extra_outputs_;
  std::vector<std::unique_ptr<onnx::NodeProto>> keep_nodes_;
  std::unique_ptr<Model> model_out_;
};

}  // namespace

std::unique_ptr<Model> ImportOnnx(const onnx::ModelProto& model, const std::string& name, Backend& backend,
                                  const OnnxOptions& options) {
  auto imp = std::make_shared<Importer>(name, &model, backend, options);
  std::unique_ptr<Model> m = imp->Run(imp);
  m->set_label_smoothing(options.label_smoothing);
  return m;
}

std::unique_ptr<Model> ImportOnnx(const std::string& path, Backend& backend, const OnnxOptions& options) {
  auto imp = std::make_shared<Importer>(path, nullptr, backend, options);
  std::unique_ptr<Model> m = imp->Run(imp);
  m->set_label_smoothing(options.label_smoothing);
  return m;
}

}  // namespace shoal
