"""PyTorch's side of onnx_pytorch_test: builds torchvision's resnet18 and mobilenet_v2 (1-channel
stems for 28x28 input), a small ViT and a CNN of unusual pooling windows, exports each to ONNX
as users do (training mode, no constant folding, opset 17), and writes, for one batch,
PyTorch's cross-entropy loss and the gradient of every parameter. Dropout is set to 0 so the two sides compute the same function.

usage: /usr/bin/python3 reference.py OUT_DIR
OUT_DIR/<model>.onnx, <model>.input.bin (float32), <model>.labels.bin (int32),
<model>.loss.txt, <model>.grads/<parameter name>.bin (float32)."""
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torchvision


class SmallViT(nn.Module):
    def __init__(self, patch=7, d=64, depth=2, heads=4, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(1, d, patch, stride=patch)
        n = (28 // patch) ** 2
        self.pos = nn.Parameter(torch.randn(1, n, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=2 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, depth)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        h = self.norm(self.enc(h))
        return self.head(h.mean(dim=1))


def resnet18():
    m = torchvision.models.resnet18(num_classes=10)
    m.conv1 = nn.Conv2d(1, 64, 3, stride=1, padding=1, bias=False)
    return m


def mobilenet_v2():
    m = torchvision.models.mobilenet_v2(num_classes=10, dropout=0.0)
    m.features[0][0] = nn.Conv2d(1, 32, 3, stride=1, padding=1, bias=False)
    return m


class Pools(nn.Module):
    """The pooling windows the backends' own pooling cannot do, each between convolutions:
    dilations, ceil_mode windows that overhang the input (average pooling counting the
    padding and not), and 3-D max and average pooling over [N, 1, channels, H, W]."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 6, 3, padding=1)
        self.pool1 = nn.MaxPool2d(3, stride=2, dilation=2, ceil_mode=True)  # 28 -> 13
        self.c2 = nn.Conv2d(6, 6, 2)  # 13 -> 12
        self.pool2 = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=True)  # 12 -> 7
        self.c3 = nn.Conv2d(6, 6, 2, padding=1)  # 7 -> 8
        self.pool3 = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)  # 8 -> 5
        self.c4 = nn.Conv2d(6, 8, 3, padding=1)
        self.pool4 = nn.MaxPool3d(2, stride=2, ceil_mode=True)  # [8, 5, 5] -> [4, 3, 3]
        self.pool5 = nn.AvgPool3d(3, stride=1, padding=1, count_include_pad=False)
        self.c5 = nn.Conv2d(4, 4, 1)
        self.head = nn.Linear(4 * 3 * 3, 10)

    def forward(self, x):
        h = self.pool1(torch.tanh(self.c1(x)))
        h = self.pool2(torch.tanh(self.c2(h)))
        h = self.pool3(torch.tanh(self.c3(h)))
        h = self.pool5(self.pool4(torch.tanh(self.c4(h)).unsqueeze(1)))
        h = self.c5(h.squeeze(1))
        return self.head(h.flatten(1))


MODELS = {"resnet18": resnet18, "mobilenet_v2": mobilenet_v2, "vit": SmallViT, "pools": Pools}


def main(out, names):
    torch.manual_seed(0)
    os.makedirs(out, exist_ok=True)
    for name in names:
        model = MODELS[name]()
        model.train()
        x = torch.randn(16, 1, 28, 28)
        labels = torch.arange(16, dtype=torch.int64) % 10
        torch.onnx.export(model, x, os.path.join(out, name + ".onnx"), opset_version=17, input_names=["x"],
                          output_names=["logits"], dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
        # The export ran the model once in training mode: start again from the exported weights
        # (running statistics moved, parameters did not), so both sides start equal.
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        x.numpy().astype(np.float32).tofile(os.path.join(out, name + ".input.bin"))
        labels.numpy().astype(np.int32).tofile(os.path.join(out, name + ".labels.bin"))
        with open(os.path.join(out, name + ".loss.txt"), "w") as f:
            f.write("%.9g\n" % loss.item())
        gdir = os.path.join(out, name + ".grads")
        os.makedirs(gdir, exist_ok=True)
        for pname, p in model.named_parameters():
            p.grad.numpy().astype(np.float32).tofile(os.path.join(gdir, pname + ".bin"))
        print(name, "loss", loss.item())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or list(MODELS))
