#!/usr/bin/env bash
# ./shoal bench onnx [--models "resnet18 mobilenet_v2 vit"] [--samples N] [--epochs E] [--workers W] [--seeds S]
# [--schedule cosine|constant]:
# imported models trained by Shoal against PyTorch on the same recipe (bench/onnx/run.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-bazel-bin}"
shift || true
exec /usr/bin/python3 bench/onnx/run.py "$bin" "$@"
