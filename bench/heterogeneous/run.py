"""./shoal bench heterogeneous: 4 workers, one at slowdown 3 (it sleeps 3x its compute
time every step, like a device a quarter as fast). Time to the target accuracy for plain
allreduce, balanced allreduce ([algorithm] balance = true: batches split by measured
throughput), adpsgd, bmuf and auto, each a real job through the launcher, one after the
other. The last line is one JSON object with each time and "speedup" = allreduce time /
balanced allreduce time. Environment: TARGET, EPOCHS, SAMPLES, MODEL, SLOWDOWN."""
import json, os, subprocess, sys, tempfile, time

BIN = sys.argv[1] if len(sys.argv) > 1 else "bazel-bin"
TARGET = float(os.environ.get("TARGET", "0.85"))
EPOCHS = int(os.environ.get("EPOCHS", "12"))
SAMPLES = int(os.environ.get("SAMPLES", "4096"))  # per epoch: a short epoch, a fine clock
MODEL = os.environ.get("MODEL", "lenet")
SLOWDOWN = float(os.environ.get("SLOWDOWN", "3.0"))

RUNS = [  # (label, algorithm, [algorithm] keys)
    ("allreduce", "allreduce", ""),
    ("balanced_allreduce", "allreduce", "balance = true\n"),
    ("adpsgd", "adpsgd", ""),
    ("bmuf", "bmuf", "block_steps = 8\nblock_momentum = 0.5\nblock_lr = 1.0\n"),
    ("auto", "auto", "probe_steps = 10\n"),
]


def job(name, out, algo, keys):
    return f"""[job]
name = "{name}"
seed = 42
output_dir = "{out}"
[cluster]
workers = [{{slowdown = {SLOWDOWN}}}, {{}}, {{}}, {{}}]
[model]
name = "{MODEL}"
[data]
format = "idx"
train = "/usr/share/datasets/fashion-mnist/train"
test = "/usr/share/datasets/fashion-mnist/t10k"
batch_size = 32
max_train_samples = {SAMPLES}
max_test_samples = 1000
[algorithm]
name = "{algo}"
{keys}
[optimizer]
name = "momentum"
lr = 0.05
momentum = 0.9
weight_decay = 1e-4
[train]
epochs = {EPOCHS}
target_accuracy = {TARGET}
threads = 1
log_every_steps = 10
"""


def run(label, algo, keys, tmp):
    d = os.path.join(tmp, label)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "job.toml")
    with open(path, "w") as f:
        f.write(job(f"hetero-{label}", os.path.join(d, "out"), algo, keys))
    t0 = time.time()
    p = subprocess.run([f"{BIN}/tools/launcher/shoal-launch", f"--bin_dir={BIN}", path],
                       capture_output=True, text=True, timeout=900)
    wall = time.time() - t0
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    done = json.loads(p.stdout.strip().splitlines()[-1])
    events = [json.loads(l) for l in open(os.path.join(d, "out", "metrics.jsonl"))]
    # wall_s counts from the job's start: start-up counts the same for every run.
    reach = next((e["wall_s"] for e in events if e.get("event") == "eval" and e.get("rank", 0) == 0
                  and (e.get("test_accuracy") or 0) >= TARGET), None)
    slow = [e["batch_size"] for e in events if e.get("event") == "train" and e.get("rank") == 0 and "batch_size" in e]
    auto = next((e for e in events if e.get("event") == "auto" and e.get("rank") == 0), {})
    r = {"time_to_target_s": round(reach, 1) if reach is not None else None,
         "final_accuracy": done.get("test_accuracy"), "steps": done.get("steps"), "wall_s": round(wall, 1)}
    if slow:
        r["slow_worker_last_batch"] = slow[-1]
    if auto:
        r["auto_choice"] = auto.get("choice") + (" (balanced)" if auto.get("balance") else "")
    return r


def main():
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, algo, keys in RUNS:
            results[label] = run(label, algo, keys, tmp)
            print(f"{label:>20} {json.dumps(results[label])}", flush=True)
    t = {k: v.get("time_to_target_s") for k, v in results.items()}
    speedup = round(t["allreduce"] / t["balanced_allreduce"], 2) if t["allreduce"] and t["balanced_allreduce"] else None
    print(f"\n| algorithm | s to {TARGET} | final accuracy | slow worker's last batch |")
    print("|---|---|---|---|")
    for label, _, _ in RUNS:
        r = results[label]
        name = label + (f" (chose {r['auto_choice']})" if r.get("auto_choice") else "")
        val = r.get("time_to_target_s") if "error" not in r else "fail"
        print(f"| {name} | {val if val is not None else '-'} | {r.get('final_accuracy', '-')} | "
              f"{r.get('slow_worker_last_batch', '-')} |")
    out = {"bench": "heterogeneous", "target_accuracy": TARGET, "model": MODEL, "slowdown": SLOWDOWN}
    out.update({f"{k}_s": v for k, v in t.items()})
    out["speedup"] = speedup
    out["results"] = results
    print(json.dumps(out))


if __name__ == "__main__":
    main()
