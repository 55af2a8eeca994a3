// ResNets: resnet20 for 32x32 CIFAR images (He et al. 2016, section 4.2, with projection
// shortcuts where the shape changes) and resnet50 for 224x224 ImageNet images (bottleneck
// blocks, stride on the 3x3 convolution as in torchvision's v1.5).
#include "common/error.h"
#include "worker/engine/models/builder.h"

namespace shoal {
namespace {

// conv-bn-relu-conv-bn (+ shortcut) -relu
int BasicBlock(ModelBuilder& b, const std::string& n, int x, int64_t cin, int64_t cout, int stride, bool zero_gamma) {
  int y = b.Relu(n + ".relu1", b.BN(n + ".bn1", b.Conv(n + ".conv1", x, cin, cout, 3, stride, 1, false), cout));
  y = b.BN(n + ".bn2", b.Conv(n + ".conv2", y, cout, cout, 3, 1, 1, false), cout, zero_gamma);
  int sc = x;
  if (stride != 1 || cin != cout)
    sc = b.BN(n + ".down.bn", b.Conv(n + ".down.conv", x, cin, cout, 1, stride, 0, false), cout);
  return b.Relu(n + ".relu2", b.Sum(n + ".add", y, sc));
}

// 1x1 reduce, 3x3 (stride), 1x1 expand to 4x width (+ shortcut)
int Bottleneck(ModelBuilder& b, const std::string& n, int x, int64_t cin, int64_t width, int stride, bool zero_gamma) {
  const int64_t cout = width * 4;
  int y = b.Relu(n + ".relu1", b.BN(n + ".bn1", b.Conv(n + ".conv1", x, cin, width, 1, 1, 0, false), width));
  y = b.Relu(n + ".relu2", b.BN(n + ".bn2", b.Conv(n + ".conv2", y, width, width, 3, stride, 1, false), width));
  y = b.BN(n + ".bn3", b.Conv(n + ".conv3", y, width, cout, 1, 1, 0, false), cout, zero_gamma);
  int sc = x;
  if (stride != 1 || cin != cout)
    sc = b.BN(n + ".down.bn", b.Conv(n + ".down.conv", x, cin, cout, 1, stride, 0, false), cout);
  return b.Relu(n + ".relu3", b.Sum(n + ".add", y, sc));
}

void CheckImage(const std::string& model, const Shape& s) {
  SHOAL_CHECK(s.size() == 3, "model " + model + ": input shape must be [C,H,W], got " + ShapeString(s));
}

}  // namespace

std::unique_ptr<Model> BuildResnet20(Backend& be, const ModelOptions& o) {
  CheckImage("resnet20", o.input_shape);
  auto m = std::make_unique<Model>(be, "resnet20", o.input_shape);
  ModelBuilder b{*m, be, o.init.value_or(WeightInit::kHeNormal)};
  int x = b.Relu("relu", b.BN("bn", b.Conv("conv", Model::kInput, o.input_shape[0], 16, 3, 1, 1, false), 16));
  int64_t cin = 16;
  const int64_t widths[3] = {16, 32, 64};
  for (int s = 0; s < 3; ++s)
    for (int i = 0; i < 3; ++i) {
      const int stride = (s > 0 && i == 0) ? 2 : 1;
      x = BasicBlock(b, "layer" + std::to_string(s + 1) + "." + std::to_string(i), x, cin, widths[s], stride,
                     o.zero_gamma_init);
      cin = widths[s];
    }
  x = b.Flat("flatten", b.Gap("avgpool", x));
  b.Logits("fc", x, cin, o.num_classes);
  return m;
}

std::unique_ptr<Model> BuildResnet50(Backend& be, const ModelOptions& o) {
  CheckImage("resnet50", o.input_shape);
  auto m = std::make_unique<Model>(be, "resnet50", o.input_shape);
  ModelBuilder b{*m, be, o.init.value_or(WeightInit::kHeNormal)};
  int x = b.Relu("relu", b.BN("bn", b.Conv("conv", Model::kInput, o.input_shape[0], 64, 7, 2, 3, false), 64));
  x = b.MaxPool2d("maxpool", x, 3, 2, 1);
  int64_t cin = 64;
  const int blocks[4] = {3, 4, 6, 3};
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int s = 0; s < 4; ++s)
    for (int i = 0; i < blocks[s]; ++i) {
      const int stride = (s > 0 && i == 0) ? 2 : 1;
      x = Bottleneck(b, "layer" + std::to_string(s + 1) + "." + std::to_string(i), x, cin, widths[s], stride,
                     o.zero_gamma_init);
      cin = widths[s] * 4;
    }
  x = b.Flat("flatten", b.Gap("avgpool", x));
  b.Logits("fc", x, cin, o.num_classes);
  return m;
}

}  // namespace shoal
