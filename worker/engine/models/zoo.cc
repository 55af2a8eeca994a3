// The model zoo by name, and the two small models.
#include "common/error.h"
#include "worker/engine/models/builder.h"

namespace shoal {

std::unique_ptr<Model> BuildMlp(Backend& be, const ModelOptions& o) {
  auto m = std::make_unique<Model>(be, "mlp", o.input_shape);
  ModelBuilder b{*m, be, o.init.value_or(WeightInit::kFanInUniform)};
  const int64_t in = NumElements(o.input_shape);
  int x = b.Flat("flatten", Model::kInput);
  x = b.Relu("relu1", b.Fc("fc1", x, in, 256));
  x = b.Relu("relu2", b.Fc("fc2", x, 256, 256));
  b.Logits("fc3", x, 256, o.num_classes);
  return m;
}

// conv5x5 C->32, pool, conv5x5 32->64, pool, fc ->256, fc ->classes; no padding, so a
// 28x28 input goes 24, 12, 8, 4 and the first fc sees 64*4*4 = 1024 features.
std::unique_ptr<Model> BuildLenet(Backend& be, const ModelOptions& o) {
  SHOAL_CHECK(o.input_shape.size() == 3, "model lenet: input shape must be [C,H,W], got " + ShapeString(o.input_shape));
  // Said here, in the data's terms, rather than by conv2 about a 2x2 map the data never had.
  SHOAL_CHECK(o.input_shape[1] >= 16 && o.input_shape[2] >= 16,
              "model lenet: input " + ShapeString(o.input_shape) +
                  " is too small: its two unpadded 5x5 convolutions and 2x2 pools need images of at least 16x16 "
                  "(use mlp or resnet20 for smaller ones)");
  auto m = std::make_unique<Model>(be, "lenet", o.input_shape);
  ModelBuilder b{*m, be, o.init.value_or(WeightInit::kFanInUniform)};
  int x = b.Conv("conv1", Model::kInput, o.input_shape[0], 32, 5, 1, 0, true);
  x = b.MaxPool2d("pool1", b.Relu("relu1", x), 2, 2);
  x = b.Conv("conv2", x, 32, 64, 5, 1, 0, true);
  x = b.MaxPool2d("pool2", b.Relu("relu2", x), 2, 2);
  x = b.Flat("flatten", x);
  const int64_t features = m->OutputShape(1)[1];
  x = b.Relu("relu3", b.Fc("fc1", x, features, 256));
  b.Logits("fc2", x, 256, o.num_classes);
  return m;
}

std::vector<std::string> ModelNames() { return {"mlp", "lenet", "resnet20", "resnet50"}; }

std::unique_ptr<Model> MakeModel(const std::string& name, Backend& backend, const ModelOptions& options) {
  ModelOptions o = options;
  SHOAL_CHECK(o.num_classes >= 2, "model " + name + ": num_classes must be >= 2, got " + std::to_string(o.num_classes));
  for (int64_t d : o.input_shape)
    SHOAL_CHECK(d > 0,
                "model " + name + ": input shape " + ShapeString(o.input_shape) + " has a non-positive dimension");
  std::unique_ptr<Model> m;
  if (name == "mlp") {
    if (o.input_shape.empty()) o.input_shape = {1, 28, 28};
    m = BuildMlp(backend, o);
  } else if (name == "lenet") {
    if (o.input_shape.empty()) o.input_shape = {1, 28, 28};
    m = BuildLenet(backend, o);
  } else if (name == "resnet20") {
    if (o.input_shape.empty()) o.input_shape = {3, 32, 32};
    m = BuildResnet20(backend, o);
  } else if (name == "resnet50") {
    if (o.input_shape.empty()) o.input_shape = {3, 224, 224};
    m = BuildResnet50(backend, o);
  } else {
    std::string known;
    for (const std::string& n : ModelNames()) known += (known.empty() ? "" : ", ") + n;
    throw Error("[model] name = \"" + name + "\": unknown model (known: " + known + ")");
  }
  m->set_label_smoothing(o.label_smoothing);
  return m;
}

}  // namespace shoal
