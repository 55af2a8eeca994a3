#!/usr/bin/env python3
"""Imported models trained by Shoal against PyTorch training the same module, same recipe,
same steps: PyTorch exports torchvision's resnet18 and mobilenet_v2 (1-channel stems for
28x28) and the small ViT of tests/engine/pytorch/reference.py; Shoal trains each ONNX file on
Fashion-MNIST with allreduce on `--workers` processes, PyTorch trains the module itself from
the same initial weights (the file's initializers, loaded by name) with the same global batch,
optimizer, weight decay rule (none on parameters of rank <= 1, as Shoal), learning-rate
schedule and number of steps. As in a data-parallel job (PyTorch DDP without SyncBatchNorm),
PyTorch computes each worker's share of the global batch separately, so batch norm sees the
same per-worker batches, and averages the running statistics over the shares as Shoal does
before evaluating. The schedule is cosine to zero by default: a constant learning rate leaves
the last step's weights, and so one evaluation, at a random point of a noisy walk (resnet18 at
lr 0.05: 0.70-0.86 between runs that differ only in the data order). Each model runs
`--seeds` times (data orders), and the diff is of the means.
Test accuracy on the same test samples. Last line one JSON object:
{"bench":"onnx_parity","results":{"resnet18":{"shoal":..,"torch":..,"diff":..,"steps":..,"runs":[..]}, ...}}

usage: bench/onnx/run.py BAZEL_BIN [--models "resnet18 mobilenet_v2 vit"] [--samples 6000]
       [--epochs 1] [--workers 2] [--batch 32] [--test 2000] [--seeds 1] [--schedule cosine|constant]"""
import argparse
import gzip
import json
import math
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "engine", "pytorch"))
import jobs  # noqa: E402

RECIPES = {  # model: ([optimizer] section for Shoal, PyTorch optimizer factory)
    "resnet18": ("name = \"momentum\"\nlr = 0.05\nmomentum = 0.9\nweight_decay = 5e-4", ("sgd", 0.05, 5e-4)),
    "mobilenet_v2": ("name = \"momentum\"\nlr = 0.05\nmomentum = 0.9\nweight_decay = 5e-4", ("sgd", 0.05, 5e-4)),
    "vit": ("name = \"adamw\"\nlr = 0.001\nweight_decay = 0.05", ("adamw", 0.001, 0.05)),
}


def read_idx(prefix, kind, limit):
    with gzip.open(prefix + "-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(prefix + "-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return x[:limit], y[:limit].astype(np.int64)


def cosine_lr(peak, step, total):
    """Shoal's LrSchedule "cosine" without warm-up (algorithms/optimizers/optimizer.cc)."""
    p = min(1.0, step / max(1, total))
    return peak * 0.5 * (1 + math.cos(math.pi * p))


def batch_norms(model):
    import torch.nn as nn
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def torch_train(name, onnx_path, a, steps, seed):
    import onnx
    import onnx.numpy_helper
    import torch
    import reference
    torch.set_num_threads(a.threads)
    torch.manual_seed(seed)
    model = reference.MODELS[name]()
    init = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(onnx_path).graph.initializer}
    state = model.state_dict()
    for k in state:
        if k in init:
            state[k] = torch.from_numpy(np.array(init[k]))
    model.load_state_dict(state)
    xtr, ytr = read_idx("/usr/share/datasets/fashion-mnist/train", "train", a.samples)
    xte, yte = read_idx("/usr/share/datasets/fashion-mnist/t10k", "test", a.test)
    mean, std = (xtr / 255.0).mean(), (xtr / 255.0).std()  # Shoal normalizes by the training set's
    norm = lambda x: torch.from_numpy(((x / 255.0 - mean) / std).astype(np.float32))
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    kind, lr, wd = RECIPES[name][1]
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.SGD(groups, lr=lr, momentum=0.9) if kind == "sgd" else torch.optim.AdamW(groups, lr=lr)
    gb = a.batch * a.workers
    rng = np.random.default_rng(7 + seed)
    bns = batch_norms(model)
    done = 0
    model.train()
    while done < steps:
        order = rng.permutation(len(xtr))
        for i in range(0, len(order) - gb + 1, gb):
            idx = order[i:i + gb]
            if a.schedule == "cosine":
                for g in opt.param_groups:
                    g["lr"] = cosine_lr(lr, done, steps)
            opt.zero_grad()
            # Worker w's share: every workers-th sample, as Shoal's loader deals them. Each share
            # runs from the same running statistics; their mean is what the job keeps.
            start = [(m.running_mean.clone(), m.running_var.clone()) for m in bns]
            sums = [(torch.zeros_like(m.running_mean), torch.zeros_like(m.running_var)) for m in bns]
            for w in range(a.workers):
                share = idx[w::a.workers]
                for m, (mean0, var0) in zip(bns, start):
                    m.running_mean.copy_(mean0)
                    m.running_var.copy_(var0)
                loss = torch.nn.functional.cross_entropy(model(norm(xtr[share])), torch.from_numpy(ytr[share]))
                (loss / a.workers).backward()
                for m, (sm, sv) in zip(bns, sums):
                    sm += m.running_mean
                    sv += m.running_var
            for m, (sm, sv) in zip(bns, sums):
                m.running_mean.copy_(sm / a.workers)
                m.running_var.copy_(sv / a.workers)
            opt.step()
            done += 1
            if done >= steps:
                break
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(xte), 500):
            correct += int((model(norm(xte[i:i + 500])).argmax(1).numpy() == yte[i:i + 500]).sum())
    return correct / len(xte)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--models", default="resnet18 mobilenet_v2 vit")
    ap.add_argument("--samples", type=int, default=6000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="per worker")
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=1, help="runs per model, each with its own data order")
    ap.add_argument("--schedule", default="cosine", choices=["cosine", "constant"])
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="onnx_parity_")
    names = a.models.split()
    import subprocess
    subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "tests", "engine", "pytorch", "reference.py"), tmp]
                   + names, check=True, capture_output=True)
    results = {}
    print("%-14s %4s %8s %10s %10s %8s" % ("model", "seed", "steps", "shoal acc", "torch acc", "diff"))
    for name in names:
        path = os.path.join(tmp, name + ".onnx")
        runs = []
        for seed in range(1, a.seeds + 1):
            job = lambda out: (f'[job]\nname = "parity-{name}"\nseed = {seed}\noutput_dir = "{out}"\n\n'
                               f'[cluster]\nworkers = {a.workers}\n\n[model]\nonnx = "{path}"\n\n'
                               f'[data]\n{jobs.FASHION_MNIST}\nbatch_size = {a.batch}\n'
                               f'max_train_samples = {a.samples}\nmax_test_samples = {a.test}\n\n'
                               f'[algorithm]\nname = "allreduce"\n\n[optimizer]\n{RECIPES[name][0]}\n'
                               f'schedule = "{a.schedule}"\n\n'
                               f'[train]\nepochs = {a.epochs}\nthreads = {max(1, a.threads // a.workers)}\n')
            run = jobs.run_job(a.bin_dir, tmp, f"{name}-{seed}", job, 7200)
            if run.error or run.done.get("test_accuracy") is None:
                print(name, "seed", seed, "shoal failed:", run.error)
                runs = None
                break
            steps = int(run.done.get("steps", 0))
            shoal = float(run.done["test_accuracy"])
            torch_acc = torch_train(name, path, a, steps, seed)
            runs.append({"seed": seed, "shoal": shoal, "torch": round(torch_acc, 4), "steps": steps})
            print("%-14s %4d %8d %10.4f %10.4f %8.4f" % (name, seed, steps, shoal, torch_acc, shoal - torch_acc))
        if runs is None:
            results[name] = {"shoal": None, "torch": None, "diff": None, "error": "shoal failed"}
            continue
        ms = sum(r["shoal"] for r in runs) / len(runs)
        mt = sum(r["torch"] for r in runs) / len(runs)
        results[name] = {"shoal": round(ms, 4), "torch": round(mt, 4), "diff": round(ms - mt, 4),
                         "steps": runs[0]["steps"], "runs": runs}
        if len(runs) > 1:
            print("%-14s mean %8d %10.4f %10.4f %8.4f" % (name, runs[0]["steps"], ms, mt, ms - mt))
    print(json.dumps({"bench": "onnx_parity", "samples": a.samples, "epochs": a.epochs, "workers": a.workers,
                      "schedule": a.schedule, "seeds": a.seeds, "results": results}, separators=(",", ":")))


if __name__ == "__main__":
    main()
