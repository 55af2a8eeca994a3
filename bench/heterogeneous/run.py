"""./shoal bench heterogeneous: 4 workers, one at slowdown 3 (it sleeps 3x its compute
time every step, like a device a quarter as fast). Time to the target accuracy for plain
allreduce, balanced allreduce ([algorithm] balance = true: batches split by measured
throughput), adpsgd, bmuf and auto, each a real job through the launcher, one after the
other. The last line is one JSON object with each time and "speedup" = allreduce time /
balanced allreduce time. Environment: TARGET, EPOCHS, SAMPLES, MODEL, SLOWDOWN."""
import json, os, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import FASHION_MNIST, run_job  # noqa: E402

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
{FASHION_MNIST}
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
    j = run_job(BIN, tmp, label, lambda out: job(f"hetero-{label}", out, algo, keys), timeout=900)
    if j.error:
        return {"error": j.error}
    reach = j.time_to(TARGET)
    slow = [e["batch_size"] for e in j.events if e.get("event") == "train" and e.get("rank") == 0 and "batch_size" in e]
    auto = next((e for e in j.events if e.get("event") == "auto" and e.get("rank") == 0), {})
    r = {"time_to_target_s": round(reach, 1) if reach is not None else None,
         "final_accuracy": j.done.get("test_accuracy"), "steps": j.done.get("steps"), "wall_s": round(j.wall_s, 1)}
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
