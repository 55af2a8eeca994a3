"""./shoal bench overlap: step time of resnet20 on 4 CPU workers (allreduce over the ZeroMQ
ring) with and without overlapping the gradient exchange with the backward pass
([algorithm] overlap). Each worker's sends are limited (the in-process token bucket,
[cluster] workers = [{bandwidth_mbps}]) so that one step's exchange takes about as long as
its compute, calibrated from a first unlimited run. Each run is a real job through the
launcher; both runs must end with the same weights_hash (overlap changes no bit). The
last line is one JSON object: {"bench":"overlap","speedup":...}."""
import json, os, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import run_job  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "bazel-bin"
STEPS = int(os.environ.get("STEPS", "40"))
WARMUP = int(os.environ.get("WARMUP", "10"))  # steps left out of the timing
BATCH = int(os.environ.get("BATCH", "32"))
BUCKET = int(os.environ.get("BUCKET_BYTES", str(256 << 10)))
RATIO = float(os.environ.get("RATIO", "1.0"))  # exchange time / compute time under the limit


def job(name, out, overlap, mbps):
    limit = "[" + ", ".join([f"{{bandwidth_mbps = {mbps}}}"] * 4) + "]" if mbps else "4"
    return f"""[job]
name = "{name}"
seed = 42
output_dir = "{out}"
[cluster]
workers = {limit}
[model]
name = "resnet20"
[data]
format = "synthetic"
image_size = 32
classes = 10
synthetic_samples = {STEPS * BATCH}
batch_size = {BATCH}
[algorithm]
name = "allreduce"
bucket_bytes = {BUCKET}
overlap = {"true" if overlap else "false"}
[optimizer]
name = "momentum"
lr = 0.05
momentum = 0.9
[train]
epochs = 1
max_steps = {STEPS}
threads = 1
log_every_steps = {WARMUP}
"""


def run(tmp, label, overlap, mbps):
    j = run_job(BIN, tmp, label, lambda out: job(f"bench-overlap-{label}", out, overlap, mbps), timeout=1800)
    if j.error:
        sys.exit(f"bench overlap: the {label} run failed: {j.error}")
    # Rank 0's train records: the first one closes the warm-up, the last ends the run.
    train = j.rank0("train")
    a, b = train[0], train[-1]
    steps = b["step"] - a["step"]
    ends = [e for e in j.events if e.get("event") == "end"]
    return {"step_s": round((b["wall_s"] - a["wall_s"]) / steps, 4),
            "compute_s_per_step": round((b["compute_s"] - a["compute_s"]) / steps, 4),
            "comm_s_per_step": round((b["comm_s"] - a["comm_s"]) / steps, 4),
            "bytes_per_step": int((b["bytes_sent"] - a["bytes_sent"]) / steps),
            "weights_hash": sorted({e.get("weights_hash") for e in ends})}


def main():
    with tempfile.TemporaryDirectory() as tmp:
        base = run(tmp, "calibrate", False, 0)
        # Limit so one step's exchange takes RATIO x one step's compute.
        mbps = float(os.environ.get("LIMIT_MBPS", "0")) or \
            base["bytes_per_step"] * 8 / (RATIO * base["compute_s_per_step"]) / 1e6
        print(f"unlimited: {json.dumps(base)}; links limited to {mbps:.1f} Mbit/s per worker", flush=True)
        results = {"unlimited_overlap": run(tmp, "unlimited-overlap", True, 0), "unlimited_no_overlap": base}
        for overlap in (False, True):
            label = "overlap" if overlap else "no_overlap"
            results[label] = run(tmp, label, overlap, round(mbps, 1))
            print(f"{label:>12}: {json.dumps(results[label])}", flush=True)
    same = results["overlap"]["weights_hash"] == results["no_overlap"]["weights_hash"] and \
        len(results["overlap"]["weights_hash"]) == 1
    speedup = results["no_overlap"]["step_s"] / results["overlap"]["step_s"]
    unlimited = results["unlimited_no_overlap"]["step_s"] / results["unlimited_overlap"]["step_s"]
    print("\n| links | step s, no overlap | step s, overlap | speedup |")
    print("|---|---|---|---|")
    print(f"| {mbps:.0f} Mbit/s per worker | {results['no_overlap']['step_s']} | {results['overlap']['step_s']} "
          f"| {speedup:.2f} |")
    print(f"| unlimited (loopback) | {results['unlimited_no_overlap']['step_s']} | "
          f"{results['unlimited_overlap']['step_s']} | {unlimited:.2f} |")
    print(json.dumps({"bench": "overlap", "model": "resnet20", "workers": 4, "limit_mbps": round(mbps, 1),
                      "bucket_bytes": BUCKET, "same_weights": same, "unlimited_speedup": round(unlimited, 2),
                      "results": results, "speedup": round(speedup, 2)}))


if __name__ == "__main__":
    main()
