"""Exports the ONNX models the engine tests import, with PyTorch (Debian's python3-torch),
and PyTorch's own outputs for a fixed input, so the tests compare Shoal against PyTorch
without needing it installed. Run from this folder: /usr/bin/python3 make_models.py [gpt | pools]"""
import sys

import numpy as np
import torch
import torch.nn as nn


class SmallCnn(nn.Module):
    """Conv/BN/ReLU, a depthwise conv, max and average pooling, ReLU6, dropout, two linear layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.bn1 = nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.drop = nn.Dropout(0.1)
        self.fc1 = nn.Linear(32 * 3 * 3, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = nn.functional.max_pool2d(x, 2)
        x = nn.functional.relu6(self.bn2(self.dw(x)))
        x = torch.relu(self.conv2(x))
        x = self.pool(x)
        x = torch.flatten(x, 1)
        x = self.drop(torch.relu(self.fc1(x)))
        return self.fc2(x)


def export(model, x, path):
    torch.onnx.export(model, x, path, opset_version=17, input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)


class TinyTransformer(nn.Module):
    """Token embedding (Gather), a learned position table, nn.TransformerEncoder (attention
    with its Shape/Reshape chains, Softmax, LayerNormalization, GELU as Erf), mean over
    positions, a classifier."""

    def __init__(self, vocab=50, seq=12, d=32, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.1)
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=64, dropout=0.1, activation="gelu",
                                           batch_first=True)
        self.enc = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens):
        h = self.enc(self.emb(tokens) + self.pos)
        return self.head(h.mean(dim=1))


class TinyGpt(nn.Module):
    """A GPT: byte-token embedding (Gather), learned positions, nn.TransformerEncoder with a
    causal mask (each position attends to itself and the ones before it), a final LayerNorm
    and a per-position head: logits [N, T, vocab], a next-token prediction at every position."""

    def __init__(self, vocab=256, seq=32, d=48, heads=4, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, num_layers=layers)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        # -inf above the diagonal: exported as an initializer, which Shoal keeps constant
        # (an initializer holding inf is never trained).
        self.register_buffer("causal_mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, tokens):
        h = self.enc(self.emb(tokens) + self.pos, mask=self.causal_mask)
        return self.head(self.norm(h))


def make_gpt():
    torch.manual_seed(2)
    gpt = TinyGpt()
    gpt.eval()
    tokens = torch.randint(0, 256, (3, 32))
    export(gpt, tokens, "tiny_gpt.onnx")
    with torch.no_grad():
        y = gpt(tokens)
    tokens.numpy().astype(np.float32).tofile("tiny_gpt_input.bin")
    y.numpy().astype(np.float32).tofile("tiny_gpt_logits.bin")
    print("tiny_gpt", tuple(tokens.shape), "->", tuple(y.shape))


def make_pools():
    """onnx_pytorch_test's CNN of dilated, ceil_mode and 3-D pools, for memory_reuse_test."""
    sys.path.insert(0, "../pytorch")
    from reference import Pools
    torch.manual_seed(2)
    export(Pools(), torch.randn(4, 1, 28, 28), "pools.onnx")
    print("pools.onnx")


def main():
    if sys.argv[1:] == ["gpt"]:  # only the GPT (the others' files stay as committed)
        make_gpt()
        return
    if sys.argv[1:] == ["pools"]:
        make_pools()
        return
    make_gpt()
    torch.manual_seed(0)
    cnn = SmallCnn()
    # Non-trivial running statistics, so evaluation reads them.
    with torch.no_grad():
        cnn.train()
        for _ in range(3):
            cnn(torch.randn(32, 1, 28, 28))
    cnn.eval()
    x = torch.randn(5, 1, 28, 28)
    export(cnn, x, "small_cnn.onnx")
    cnn.eval()
    with torch.no_grad():
        y = cnn(x)
    x.numpy().astype(np.float32).tofile("small_cnn_input.bin")
    y.numpy().astype(np.float32).tofile("small_cnn_logits.bin")
    print("small_cnn", tuple(x.shape), "->", tuple(y.shape))

    torch.manual_seed(1)
    tr = TinyTransformer()
    tr.eval()
    tokens = torch.randint(0, 50, (3, 12))
    export(tr, tokens, "tiny_transformer.onnx")
    with torch.no_grad():
        y = tr(tokens)
    tokens.numpy().astype(np.float32).tofile("tiny_transformer_input.bin")
    y.numpy().astype(np.float32).tofile("tiny_transformer_logits.bin")
    print("tiny_transformer", tuple(tokens.shape), "->", tuple(y.shape))


if __name__ == "__main__":
    main()
