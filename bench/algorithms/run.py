"""./shoal bench algorithms: time to target accuracy and bytes sent per worker for each
algorithm on 4 workers, (a) equal workers, (b) one worker at slowdown 4, (c) every
worker's bandwidth limited so a dense exchange takes about 4x the compute time.
Each run is a real job through the launcher; the last line is one JSON object."""
import json, os, subprocess, sys, tempfile, time

BIN = sys.argv[1] if len(sys.argv) > 1 else "bazel-bin"
ALGOS = os.environ.get("ALGOS", "allreduce,double_buffer,ps_async,bmuf,adpsgd,dgc").split(",")
TARGET = float(os.environ.get("TARGET", "0.85"))
EPOCHS = int(os.environ.get("EPOCHS", "4"))
SAMPLES = int(os.environ.get("SAMPLES", "30000"))
MODEL = os.environ.get("MODEL", "mlp")

ALGO_KEYS = {
    "allreduce": "",
    "double_buffer": "",
    "ps_async": "",
    "bmuf": "block_steps = 8\nblock_momentum = 0.5\nblock_lr = 1.0\n",
    "adpsgd": "",
    "dgc": "sparsity = 0.999\nsparsity_warmup_epochs = 1\nclip_norm = 5.0\n",
}


def job(name, out, algo, workers_toml):
    return f"""[job]
name = "{name}"
seed = 42
output_dir = "{out}"
[cluster]
servers = ["127.0.0.1:0"]
workers = {workers_toml}
[model]
name = "{MODEL}"
[data]
format = "idx"
train = "/usr/share/datasets/fashion-mnist/train"
test = "/usr/share/datasets/fashion-mnist/t10k"
batch_size = 32
max_train_samples = {SAMPLES}
max_test_samples = 5000
[algorithm]
name = "{algo}"
{ALGO_KEYS.get(algo, "")}
[optimizer]
name = "momentum"
lr = 0.05
momentum = 0.9
weight_decay = 1e-4
schedule = "cosine"
[train]
epochs = {EPOCHS}
target_accuracy = {TARGET}
threads = 1
log_every_steps = 20
"""


def run(algo, scenario, workers_toml, tmp):
    d = os.path.join(tmp, f"{algo}-{scenario}")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "job.toml")
    with open(path, "w") as f:
        f.write(job(f"bench-{algo}-{scenario}", os.path.join(d, "out"), algo, workers_toml))
    t0 = time.time()
    p = subprocess.run([f"{BIN}/tools/launcher/shoal-launch", f"--bin_dir={BIN}", path],
                       capture_output=True, text=True, timeout=3600)
    wall = time.time() - t0
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    done = json.loads(p.stdout.strip().splitlines()[-1])
    reach = None
    with open(os.path.join(d, "out", "metrics.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "eval" and e.get("rank", 0) == 0 and (e.get("test_accuracy") or 0) >= TARGET:
                reach = e["wall_s"]
                break
    return {"time_to_target_s": round(reach, 1) if reach is not None else None,
            "final_accuracy": done.get("test_accuracy"), "wall_s": round(wall, 1),
            "bytes_per_worker": int(done.get("bytes_sent", 0) / 4)}


def main():
    # Calibrate (c): dense bytes per step of the model vs compute time per step, from a
    # short allreduce run on equal workers.
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        equal = "4"
        slow = '[{slowdown = 4.0}, {}, {}, {}]'
        base = run("allreduce", "calibrate", equal, tmp)
        mbps = float(os.environ.get("LIMIT_MBPS", "0"))
        if not mbps:
            # dense ring bytes per step per worker ~ 2 * model bytes; aim for 4x compute time.
            mbps = 40.0
        limited = "[" + ", ".join([f"{{bandwidth_mbps = {mbps}}}"] * 4) + "]"
        for scenario, workers in (("equal", equal), ("slow_worker", slow), ("slow_links", limited)):
            for algo in ALGOS:
                r = run(algo, scenario, workers, tmp)
                results[f"{algo}/{scenario}"] = r
                print(f"{algo:>14} {scenario:>12} {json.dumps(r)}", flush=True)
    print(json.dumps({"bench": "algorithms", "target_accuracy": TARGET, "model": MODEL, "results": results}))


if __name__ == "__main__":
    main()
