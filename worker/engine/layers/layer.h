// Layer: one node type of a model graph. Layers are backend-agnostic: they call only
// Backend ops, so the same layer runs on the CPU and on CUDA.
//
// A layer writes its output and input gradients into tensors it keeps across steps while
// the batch shape stays the same (no allocation per step): views into the model's shared
// block where the model's memory plan placed them (Buffers(), memory_plan.h), else buffers
// of its own. Parameter gradients follow the Backend contract: they accumulate, and the
// model zeroes them once per step.
#pragma once
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/backend.h"

namespace shoal {

// How a Linear or Conv2d layer draws its first weights. He normal (std sqrt(2/fan_in)) keeps
// activations' scale through deep ReLU stacks and suits layers followed by batch norm
// (torchvision's ResNets). Fan-in uniform is PyTorch's nn.Linear/nn.Conv2d default: about
// 2.4x smaller weights, which small nets without normalization need to survive a large
// learning rate (with He normal, lenet at lr 0.1 and momentum 0.9 often dies in its first
// steps: every ReLU off, loss stuck at ln(classes)).
enum class WeightInit { kHeNormal, kFanInUniform };

// A named tensor and its gradient. `no_weight_decay` marks bias and batch-norm scale/shift,
// which the optimizers leave out of weight decay (and LARS/LAMB trust ratios may treat
// apart).
struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;
  bool no_weight_decay = false;
};

// A named tensor the model keeps but no optimizer touches (batch-norm running stats).
struct Buffer {
  std::string name;
  Tensor value;
};

// What a model's memory plan (memory_plan.h) may assume about one layer's buffers. The
// default assumes nothing: the layer keeps buffers of its own, its output may be a view of
// any input and its input gradients views of dy, and its Backward reads every input and
// its output.
struct BufferUse {
  enum Place {
    kUnknown,  // its own buffer, or a view of an input (output) or of dy (gradients)
    kOwn,      // in y_ (output) or input_grads_[k] (InputGrad): the plan may place it
    kView,     // a view of input 0 (output) or of dy (gradients), never a buffer of its own
  };
  Place output = kUnknown;
  Place grads = kUnknown;
  bool reads_output = true;       // Backward reads the output of the last Forward
  std::vector<bool> reads_input;  // Backward reads input k's values; empty: every input
  bool ReadsInput(size_t k) const { return reads_input.empty() || (k < reads_input.size() && reads_input[k]); }
};

class Layer {
 public:
  explicit Layer(Backend& backend) : be_(backend) {}
  virtual ~Layer() = default;
  virtual std::string Kind() const = 0;
  virtual int NumInputs() const { return 1; }
  // Whether params() and buffers() carry their full names (an imported graph's initializer
  // names), which the model keeps as they are instead of prefixing the node's name.
  virtual bool GlobalNames() const { return false; }

  // Shape of the output for these input shapes (batch dimension included); throws
  // shoal::Error naming the layer kind when they do not fit.
  virtual Shape OutputShape(const std::vector<Shape>& in) const = 0;
  // The returned tensor stays valid until the next Forward.
  virtual const Tensor& Forward(const std::vector<const Tensor*>& x, bool train) = 0;
  // Fills dx[i] (may alias dy or internal buffers) for every input when need_dx (an input
  // that takes no gradient, such as indices, may stay undefined); always
  // accumulates parameter gradients. x must be the inputs of the last Forward(train=true).
  virtual void Backward(const std::vector<const Tensor*>& x, const Tensor& dy, bool need_dx,
                        std::vector<Tensor>& dx) = 0;

  virtual BufferUse Buffers() const { return BufferUse(); }
  // The model's memory plan places the output (when Buffers().output is kOwn) and the input
  // gradients (when grads is kOwn) in memory it shares between layers; an undefined tensor
  // gives the layer back a buffer of its own on first use.
  void PlaceOutput(Tensor t) { y_ = std::move(t); }
  void PlaceInputGrad(size_t k, Tensor t);

  // Parameters and buffers, names local to the layer ("weight", "bias", ...).
  std::vector<Parameter>& params() { return params_; }
  std::vector<Buffer>& buffers() { return buffers_; }
  // Sets parameters and buffers to their initial values, drawing from rng.
  virtual void InitParameters(std::mt19937_64& rng) { (void)rng; }

 protected:
  // t keeps its buffer while the shape is unchanged.
  Tensor& Ensure(Tensor& t, const Shape& s) {
    if (!t.defined() || t.shape() != s) t = be_.Empty(s);
    return t;
  }
  // The buffer for input k's gradient (see PlaceInputGrad).
  Tensor& InputGrad(size_t k, const Shape& s) {
    if (input_grads_.size() <= k) input_grads_.resize(k + 1);
    return Ensure(input_grads_[k], s);
  }
  Parameter& AddParam(const std::string& name, const Shape& s, bool no_weight_decay);
  Buffer& AddBuffer(const std::string& name, const Shape& s);
  // Draws a weight (and its bias, when there is one) by `init`, on the host, copied over.
  // He normal: weight ~ N(0, gain / fan_in), bias 0. Fan-in uniform: weight and bias
  // ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), whatever the gain.
  void InitWeightAndBias(WeightInit init, int64_t fan_in, double gain, Tensor& weight, Tensor* bias,
                         std::mt19937_64& rng);
  void CheckInputs(const std::vector<Shape>& in) const;

  Backend& be_;
  std::vector<Parameter> params_;
  std::vector<Buffer> buffers_;
  Tensor y_;                         // output
  std::vector<Tensor> input_grads_;  // by input (InputGrad)
};

}  // namespace shoal
