// Small helpers the zoo uses to add layers to a Model by node id.
#pragma once
#include <memory>
#include <string>

#include "worker/engine/layers/add.h"
#include "worker/engine/layers/batch_norm.h"
#include "worker/engine/layers/conv2d.h"
#include "worker/engine/layers/flatten.h"
#include "worker/engine/layers/global_avg_pool.h"
#include "worker/engine/layers/linear.h"
#include "worker/engine/layers/max_pool.h"
#include "worker/engine/layers/relu.h"
#include "worker/engine/model.h"

namespace shoal {

struct ModelBuilder {
  Model& m;
  Backend& be;
  WeightInit init = WeightInit::kHeNormal;  // of every Conv, Fc and Logits layer added

  int Conv(const std::string& n, int in, int64_t cin, int64_t cout, int k, int stride, int pad, bool bias) {
    return m.AddNode(n, std::make_unique<Conv2d>(be, cin, cout, k, stride, pad, bias, init), {in});
  }
  int BN(const std::string& n, int in, int64_t c, bool zero_gamma = false) {
    return m.AddNode(n, std::make_unique<BatchNorm>(be, c, 1e-5f, 0.1f, zero_gamma), {in});
  }
  int Relu(const std::string& n, int in) { return m.AddNode(n, std::make_unique<ReLU>(be), {in}); }
  int MaxPool2d(const std::string& n, int in, int k, int s, int p = 0) {
    return m.AddNode(n, std::make_unique<MaxPool>(be, k, s, p), {in});
  }
  int Gap(const std::string& n, int in) { return m.AddNode(n, std::make_unique<GlobalAvgPool>(be), {in}); }
  int Flat(const std::string& n, int in) { return m.AddNode(n, std::make_unique<Flatten>(be), {in}); }
  int Fc(const std::string& n, int in, int64_t i, int64_t o) {
    return m.AddNode(n, std::make_unique<Linear>(be, i, o, true, 2.0, init), {in});
  }
  // the classifier: gain-1 init, as no ReLU follows
  int Logits(const std::string& n, int in, int64_t i, int64_t o) {
    return m.AddNode(n, std::make_unique<Linear>(be, i, o, true, 1.0, init), {in});
  }
  int Sum(const std::string& n, int a, int b) { return m.AddNode(n, std::make_unique<AddLayer>(be), {a, b}); }
};

// Builders, one per zoo entry (options already validated for shape).
std::unique_ptr<Model> BuildMlp(Backend& be, const ModelOptions& o);
std::unique_ptr<Model> BuildLenet(Backend& be, const ModelOptions& o);
std::unique_ptr<Model> BuildResnet20(Backend& be, const ModelOptions& o);
std::unique_ptr<Model> BuildResnet50(Backend& be, const ModelOptions& o);

}  // namespace shoal
