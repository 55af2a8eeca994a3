"""Loads the initializers of an ONNX file Shoal exported from small_cnn.onnx into PyTorch's
SmallCnn by name (make_models.py) and checks that the module, in evaluation, gives the logits
Shoal gave. Usage: /usr/bin/python3 torch_load_export.py MODEL.onnx INPUT.bin LOGITS.bin N"""
import os
import sys

import numpy as np
import onnx
import torch
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_models import SmallCnn  # noqa: E402


def main():
    model_path, input_path, logits_path, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    weights = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
               for t in onnx.load(model_path).graph.initializer}
    cnn = SmallCnn()
    missing, unexpected = cnn.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        sys.exit(f"names do not match the module: missing {missing}, unexpected {unexpected}")
    cnn.eval()
    x = torch.from_numpy(np.fromfile(input_path, dtype=np.float32).reshape(n, 1, 28, 28))
    want = np.fromfile(logits_path, dtype=np.float32).reshape(n, 10)
    with torch.no_grad():
        got = cnn(x).numpy()
    err = float(np.max(np.abs(got - want) / (1e-4 + 1e-4 * np.abs(want))))
    print(f"max |torch - shoal| / (1e-4 + 1e-4 |shoal|) = {err:.3f}")
    sys.exit(0 if err <= 1.0 else 1)


if __name__ == "__main__":
    main()
