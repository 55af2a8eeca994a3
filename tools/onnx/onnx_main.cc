// shoal onnx: what Shoal makes of an ONNX model, outside any job.
//   shoal onnx inspect MODEL.onnx [--batch N]
//       the nodes, their output shapes and the parameter count Shoal would train
//   shoal onnx run MODEL.onnx --input IN0.pb [--input IN1.pb ...] --output_dir DIR [--device cuda:0]
//       one forward pass in inference mode; DIR/output_K.pb per graph output, as ONNX TensorProtos
//       (the format of ONNX's own test data). The first input is the data; the others are
//       bound as constants of the graph. A graph with nothing to batch (no input, a scalar
//       data input, or data read only as a shape) is evaluated on the host instead.
#include <gflags/gflags.h>
#include <onnx/onnx_pb.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/error.h"
#include "worker/engine/backend.h"
#include "worker/engine/model.h"
#include "worker/engine/onnx/graph_layers.h"
#include "worker/engine/onnx/host_value.h"
#include "worker/engine/onnx/onnx_import.h"

DEFINE_string(input, "", "an input TensorProto (.pb); repeat the flag for each graph input, in order");
DEFINE_string(output_dir, "", "run: where output_K.pb go");
DEFINE_string(device, "cpu", "cpu or cuda:N");
DEFINE_int64(batch, 1, "inspect: the batch size to show shapes for");
DEFINE_int32(threads, 0, "CPU threads (0: all cores)");

namespace shoal {
namespace {

std::vector<std::string> Inputs(int argc, char** argv) {
  // gflags keeps the last of a repeated flag: read every --input from the command line.
  std::vector<std::string> in;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--input" && i + 1 < argc)
      in.push_back(argv[++i]);
    else if (a.rfind("--input=", 0) == 0)
      in.push_back(a.substr(8));
  }
  return in;
}

onnx::ModelProto ReadModel(const std::string& path) {
  onnx::ModelProto m;
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open");
  if (!m.ParseFromIstream(&f)) throw InputError(path + ": is not an ONNX model (the protobuf does not parse)");
  return m;
}

onnx::TensorProto ReadTensor(const std::string& path) {
  onnx::TensorProto t;
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path + ": cannot open");
  if (!t.ParseFromIstream(&f)) throw InputError(path + ": is not an ONNX TensorProto");
  return t;
}

// The graph inputs that are not initializers: the ones a caller feeds.
std::vector<const onnx::ValueInfoProto*> FedInputs(const onnx::GraphProto& g) {
  std::vector<const onnx::ValueInfoProto*> out;
  for (const onnx::ValueInfoProto& in : g.input()) {
    bool init = false;
    for (const onnx::TensorProto& t : g.initializer()) init = init || t.name() == in.name();
    if (!init) out.push_back(&in);
  }
  return out;
}

int Opset(const onnx::ModelProto& m) {
  for (const onnx::OperatorSetIdProto& id : m.opset_import())
    if (id.domain().empty() || id.domain() == "ai.onnx") return int(id.version());
  return 1;
}

// Whether the graph has no data to batch: no input, a scalar one, or one every node reads
// as a value known before training (a shape), as ConstantOfShape and Range do.
bool NothingToBatch(const onnx::GraphProto& g, const std::vector<const onnx::ValueInfoProto*>& fed,
                    const HostValue& data, int opset) {
  if (fed.empty() || data.shape.empty()) return true;
  for (const onnx::NodeProto& n : g.node())
    for (int i = 0; i < n.input_size(); ++i)
      if (n.input(i) == fed[0]->name() && !IsHostInput(n.op_type(), i, opset)) return false;
  return true;
}

void WriteOutput(const std::string& name, const Shape& shape, const std::vector<float>& values, int k) {
  onnx::TensorProto out;
  out.set_name(name);
  out.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : shape) out.add_dims(d);
  out.set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  const std::string file = FLAGS_output_dir + "/output_" + std::to_string(k) + ".pb";
  std::ofstream f(file, std::ios::binary);
  if (!f || !out.SerializeToOstream(&f)) throw Error(file + ": cannot write");
  printf("%s: %s %s\n", file.c_str(), name.c_str(), ShapeString(shape).c_str());
}

// Every node on the host, as the importer evaluates shape arithmetic (initializers and the
// inputs, all bound, are in `model`'s initializers).
void RunOnHost(const onnx::ModelProto& model, const std::string& path) {
  const int opset = Opset(model);
  std::map<std::string, HostValue> values;
  for (const onnx::TensorProto& t : model.graph().initializer()) values[t.name()] = FromTensorProto(t, path);
  for (const onnx::NodeProto& n : model.graph().node()) {
    std::vector<const HostValue*> in;
    std::vector<Shape> shapes;
    for (const std::string& name : n.input()) {
      auto it = values.find(name);
      if (!name.empty() && it == values.end())
        throw InputError(path + ": node '" + n.name() + "' (" + n.op_type() + "): input '" + name +
                         "' is not known on the host");
      in.push_back(name.empty() ? nullptr : &it->second);
      shapes.push_back(name.empty() ? Shape() : it->second.shape);
    }
    std::vector<HostValue> out = EvalHost(n, opset, in, shapes);
    for (int k = 0; k < n.output_size() && k < int(out.size()); ++k) values[n.output(k)] = std::move(out[size_t(k)]);
  }
  for (int k = 0; k < model.graph().output_size(); ++k) {
    const std::string& name = model.graph().output(k).name();
    auto it = values.find(name);
    if (it == values.end()) throw InputError(path + ": output '" + name + "' is computed by no node");
    WriteOutput(name, it->second.shape, std::vector<float>(it->second.v.begin(), it->second.v.end()), k);
  }
}

int Inspect(const std::string& path, Backend& be) {
  OnnxOptions o;
  o.any_output = true;
  o.batch = FLAGS_batch;
  std::unique_ptr<Model> m = ImportOnnx(path, be, o);
  printf("%s", m->Summary().c_str());
  printf("input: [N,%s; %zu parameter tensors (%lld values), %zu buffers\n",
         ShapeString(m->input_shape()).substr(1).c_str(), m->parameters().size(), (long long)m->NumParams(),
         m->buffers().size());
  return 0;
}

int Run(const std::string& path, const std::vector<std::string>& inputs, Backend& be) {
  if (FLAGS_output_dir.empty()) throw InputError("shoal onnx run: --output_dir is required");
  onnx::ModelProto model = ReadModel(path);
  const std::vector<const onnx::ValueInfoProto*> fed = FedInputs(model.graph());
  if (inputs.size() != fed.size())
    throw InputError(path + ": the graph takes " + std::to_string(fed.size()) + " input(s), given " +
                     std::to_string(inputs.size()));
  std::vector<onnx::TensorProto> tensors;
  for (const std::string& p : inputs) tensors.push_back(ReadTensor(p));
  std::vector<std::string> names;
  for (const auto* v : fed) names.push_back(v->name());
  mkdir(FLAGS_output_dir.c_str(), 0755);
  const HostValue x = tensors.empty() ? HostValue() : FromTensorProto(tensors[0], inputs[0]);
  if (NothingToBatch(model.graph(), fed, x, Opset(model))) {
    for (size_t k = 0; k < tensors.size(); ++k) {
      tensors[k].set_name(names[k]);
      *model.mutable_graph()->add_initializer() = tensors[k];
    }
    RunOnHost(model, path);
    return 0;
  }
  // Training never meets a batch of no samples, nor does the engine size tensors for one.
  if (x.numel() == 0)
    throw InputError(inputs[0] + ": the data input " + ShapeString(x.shape) +
                     " has no elements; Shoal runs batches of at least one sample");
  // Inputs after the first become constants of the graph.
  for (size_t k = 1; k < tensors.size(); ++k) {
    onnx::TensorProto t = tensors[k];
    t.set_name(names[k]);
    *model.mutable_graph()->add_initializer() = t;
  }
  {
    auto* in = model.mutable_graph()->mutable_input();
    for (int i = in->size() - 1; i >= 0; --i)
      if (in->Get(i).name() != names[0] && std::find(names.begin() + 1, names.end(), in->Get(i).name()) != names.end())
        in->DeleteSubrange(i, 1);
  }
  if (model.ir_version() < 4) model.set_ir_version(4);  // initializers outside the inputs
  // One import per output: the model's output is its graph's first.
  const int outputs = model.graph().output_size();
  for (int k = 0; k < outputs; ++k) {
    onnx::ModelProto mk = model;
    mk.mutable_graph()->mutable_output()->SwapElements(0, k);
    OnnxOptions o;
    o.any_output = true;
    o.batch = x.shape[0];
    o.input_shape = Shape(x.shape.begin() + 1, x.shape.end());
    o.node_training_modes = true;
    for (size_t i = 1; i < names.size(); ++i) o.constants.push_back(names[i]);
    std::unique_ptr<Model> m = ImportOnnx(mk, path, be, o);
    m->InitParameters(0);
    Tensor xt = be.Empty(x.shape);
    std::vector<float> xf(x.v.begin(), x.v.end());
    be.CopyFromHost(xt, xf.data());
    const Tensor& y = m->Forward(xt, false);
    std::vector<float> host(size_t(y.numel()));
    be.CopyToHost(y, host.data());
    WriteOutput(model.graph().output(k).name(), y.shape(), host, k);
  }
  return 0;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  const std::vector<std::string> inputs = shoal::Inputs(argc, argv);
  gflags::SetUsageMessage(
      "shoal onnx inspect MODEL.onnx [--batch N] | shoal onnx run MODEL.onnx --input IN0.pb [--input IN1.pb ...] "
      "--output_dir DIR [--device cuda:0]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc != 3 || (std::string(argv[1]) != "inspect" && std::string(argv[1]) != "run")) {
    fprintf(stderr, "usage: %s\n", gflags::ProgramUsage());
    return 2;
  }
  try {
    std::unique_ptr<shoal::Backend> be = shoal::MakeBackend(shoal::ParseDevice(FLAGS_device), FLAGS_threads);
    return std::string(argv[1]) == "inspect" ? shoal::Inspect(argv[2], *be) : shoal::Run(argv[2], inputs, *be);
  } catch (const shoal::InputError& e) {
    fprintf(stderr, "shoal onnx: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fprintf(stderr, "shoal onnx: %s\n", e.what());
    return 1;
  }
}
