#!/usr/bin/python3
"""Photo-like JPEGs for `./shoal bench data`: OUT/<class>/<i>.jpg, 500x375, quality 90.
Smooth colour fields, edges and fine grain, so they compress (about 60-120 KB) and decode
like photographs rather than like flat colour or noise."""
import os
import sys

import numpy as np
from PIL import Image

out, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
h, w = 375, 500
yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
for i in range(n):
    cls = f"{out}/class{i % 8}"
    os.makedirs(cls, exist_ok=True)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        for _ in range(4):  # low-frequency colour fields
            fx, fy, ph = rng.uniform(0.002, 0.03), rng.uniform(0.002, 0.03), rng.uniform(0, 6.3)
            img[:, :, c] += 30 * np.sin(fx * xx * 6.3 + fy * yy * 6.3 + ph)
        img[:, :, c] += rng.uniform(60, 190)
    for _ in range(8):  # objects with hard edges
        x0, y0 = rng.integers(0, w - 40), rng.integers(0, h - 40)
        img[y0:y0 + rng.integers(20, 150), x0:x0 + rng.integers(20, 200)] += rng.uniform(-70, 70, 3)
    img += rng.normal(0, 9, img.shape)  # grain
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(f"{cls}/{i:05d}.jpg", quality=90)
