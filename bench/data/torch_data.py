#!/usr/bin/python3
"""torchvision's side of `./shoal bench data`: ImageFolder + RandomResizedCrop(224) +
RandomHorizontalFlip + ToTensor + Normalize through a DataLoader with --threads workers
(each worker one thread), images/s for --seconds after one warm-up batch."""
import argparse
import json
import os
import time

ap = argparse.ArgumentParser()
ap.add_argument("--dir", required=True)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--size", type=int, default=224)
ap.add_argument("--seconds", type=float, default=5)
a = ap.parse_args()
try:
    import torch
    import torchvision.datasets as datasets
    import torchvision.transforms as T
except Exception as e:  # noqa: BLE001 - reported as the figure's absence
    print(json.dumps({"bench": "data_torch", "error": "torchvision: %s" % e}))
    raise SystemExit(0)

torch.set_num_threads(1)
tf = T.Compose([T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.ToTensor(),
                T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
ds = datasets.ImageFolder(a.dir, tf)
if len(ds) < a.batch:
    raise SystemExit("%s: %d images, fewer than one batch of %d" % (a.dir, len(ds), a.batch))
loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.threads, drop_last=True,
                                     persistent_workers=True, worker_init_fn=lambda _: torch.set_num_threads(1))


def batches():
    while True:
        for b in loader:
            yield b


def cpu_seconds(pids):
    """utime + stime of these processes (the main one and the DataLoader's workers)."""
    total = 0.0
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


it = batches()
next(it)  # warm-up: worker start, page cache
pids = [os.getpid()] + [w.pid for w in loader._iterator._workers]
images, t0, c0 = 0, time.monotonic(), cpu_seconds(pids)
while time.monotonic() - t0 < a.seconds:
    x, _ = next(it)
    images += x.shape[0]
wall, cpu = time.monotonic() - t0, cpu_seconds(pids) - c0
print(json.dumps({"bench": "data_torch", "threads": a.threads, "images_per_s": round(images / wall, 1),
                  "images_per_cpu_s": round(images / cpu, 1) if cpu > 0 else None}))
