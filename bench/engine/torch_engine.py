#!/usr/bin/env python3
"""The engine benchmark's baseline: the same model, batch, thread count and update
(forward + backward + SGD momentum 0.9, weight decay 5e-4, lr 0.025) in PyTorch on the
CPU, or with --device cuda on the GPU (bf16 there: channels_last + torch.autocast("cuda"),
each step timed after torch.cuda.synchronize()). Prints one JSON line {"bench":"engine_torch","model":..,"samples_per_s":..}, or
{"bench":"engine_torch","error":..} with exit code 2 when torch cannot be imported."""
import argparse
import json
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # the C++ side reports null torch figures
    print(json.dumps({"bench": "engine_torch", "error": "import torch failed: %s" % e}))
    sys.exit(2)


class LeNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        self.fc1 = nn.Linear(1024, 256)
        self.fc2 = nn.Linear(256, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class Mlp(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, classes))

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    """Basic block with a projection shortcut where the shape changes, as in Shoal's zoo."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet20(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for s, width in enumerate([16, 32, 64]):
            for i in range(3):
                layers.append(Block(cin, width, 2 if (s > 0 and i == 0) else 1))
                cin = width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 with the stride, 1x1 expand to 4x width (+ projection where the shape
    changes): worker/engine/models/resnet.cc's block (torchvision's v1.5)."""

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for s, (blocks, width) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512])):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, 2 if (s > 0 and i == 0) else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 3, 2, 1)
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


MODELS = {"lenet": (LeNet, (1, 28, 28)), "mlp": (Mlp, (1, 28, 28)), "resnet20": (ResNet20, (3, 32, 32)),
          "resnet50": (ResNet50, (3, 224, 224))}

# The models Shoal trains as ONNX in `run.sh --onnx` (torchvision's resnet18 and mobilenet_v2
# with 1-channel stems, the small ViT): the very modules tests/engine/pytorch/reference.py exports.
try:
    import os as _os
    sys.path.insert(0, _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "..", "tests", "engine",
                                     "pytorch"))
    import reference as _reference
    for _name, _make in _reference.MODELS.items():
        MODELS[_name] = (_make, (1, 28, 28))
except ImportError:  # torchvision missing: the zoo's models still run
    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lenet", choices=sorted(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"bench": "engine_torch", "device": "cuda", "error": "no CUDA device (torch.cuda.is_available() is False)"}))
        sys.exit(2)
    dev = torch.device(a.device)
    # PyTorch runs fp32 convolutions on TF32 tensor cores by default (Ampere and later): fp32
    # means true fp32 here, as on Shoal's side, and tf32 turns it on for convolutions and matmuls.
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    cls, shape = MODELS[a.model]
    model = cls().to(dev)
    # bf16 on the GPU: NHWC, the layout tensor cores want (Shoal's CUDA bf16 path is NHWC too)
    fmt = torch.channels_last if (a.device == "cuda" and a.precision == "bf16" and len(shape) == 3) else torch.contiguous_format
    model = model.to(memory_format=fmt)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.025, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(a.batch, *shape).to(dev).contiguous(memory_format=fmt) if len(shape) == 3 else torch.randn(a.batch, *shape).to(dev)
    y = (torch.arange(a.batch) % 10).to(dev)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

    def step():
        opt.zero_grad(set_to_none=True)
        # bf16: autocast, PyTorch's mixed precision (bf16 convolutions and matmuls, fp32 weights)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    sync()
    # median step time, as the C++ side: robust to other tenants of a shared machine
    times = []
    cpu0 = time.process_time()  # all threads' CPU time, as the C++ side reports
    t0 = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - t0 < a.seconds:
        s0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - s0)
    el = time.perf_counter() - t0
    med = sorted(times)[len(times) // 2]
    cpu_ms = 1000 * (time.process_time() - cpu0) / len(times)
    print(json.dumps({"bench": "engine_torch", "precision": a.precision, "model": a.model, "device": a.device, "torch": torch.__version__, "threads": a.threads,
                      "batch": a.batch, "steps": len(times), "samples_per_s": round(a.batch / med, 1),
                      "mean_samples_per_s": round(len(times) * a.batch / el, 1), "step_ms": round(1000 * med, 3), "cpu_ms_per_step": round(cpu_ms, 3)}))


if __name__ == "__main__":
    main()
