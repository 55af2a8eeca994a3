"""./shoal bench lowbandwidth: 4 workers whose sends are capped at MBPS Mbit/s each (the
ring's token bucket, [cluster] workers = [{bandwidth_mbps = ...}]), then at a quarter of that.
Time to the target accuracy, final accuracy and bytes sent per worker for allreduce, bmuf, dgc
and diloco (sync_every 20 and 100, int4 pseudo-gradients, streaming in 4 fragments), each a
real job through the launcher, one after the other. The last line is one JSON object: per
bandwidth and algorithm the figures, "diloco_bytes_ratio" (allreduce's bytes per worker /
diloco's at sync_every 100, at the first bandwidth), "diloco_accuracy", "allreduce_accuracy"
and "fastest_at_low_bandwidth". Environment: TARGET, EPOCHS, SAMPLES, MODEL, MBPS."""
import json, os, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import collective_job, run_job  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "bazel-bin"
TARGET = float(os.environ.get("TARGET", "0.80"))
EPOCHS = int(os.environ.get("EPOCHS", "8"))
SAMPLES = int(os.environ.get("SAMPLES", "6144"))  # per epoch: 48 steps of 4 x 32, one evaluation each
MODEL = os.environ.get("MODEL", "mlp")
MBPS = float(os.environ.get("MBPS", "100"))

ADAMW = 'name = "adamw"\nlr = 1e-3\nwarmup_steps = 20\nschedule = "cosine"\n'
MOMENTUM = 'name = "momentum"\nlr = 0.05\nmomentum = 0.9\nweight_decay = 1e-4\n'
RUNS = [  # (label, algorithm, [algorithm] keys, [optimizer] keys)
    ("allreduce", "allreduce", "", ADAMW),
    ("bmuf", "bmuf", "block_steps = 8\nblock_momentum = 0.5\nblock_lr = 1.0\n", MOMENTUM),
    ("dgc", "dgc", "sparsity = 0.999\nsparsity_warmup_epochs = 1\n", MOMENTUM),
    ("diloco_h20", "diloco", "sync_every = 20\n", ADAMW),
    ("diloco_h100", "diloco", "sync_every = 100\n", ADAMW),
    ("diloco_h20_int4", "diloco", "sync_every = 20\nouter_wire = \"int4\"\n", ADAMW),
    ("streaming_diloco_h20", "diloco", "sync_every = 20\nstreaming = 4\noverlap_steps = 1\n", ADAMW),
]


def job(name, out, algo, keys, optimizer, mbps):
    links = ", ".join([f"{{bandwidth_mbps = {mbps}}}"] * 4)
    return collective_job(name, out, links, MODEL, SAMPLES, algo, keys, optimizer, EPOCHS, TARGET)


def run(label, algo, keys, optimizer, mbps, tmp):
    j = run_job(BIN, tmp, f"{label}_{mbps}", lambda out: job(f"lowbw-{label}", out, algo, keys, optimizer, mbps),
                timeout=1800)
    if j.error:
        return {"error": j.error}
    reach = j.time_to(TARGET)
    workers = j.done.get("workers") or 4
    return {"time_to_target_s": round(reach, 1) if reach is not None else None,
            "final_accuracy": j.done.get("test_accuracy"), "steps": j.done.get("steps"),
            "bytes_per_worker": int(j.done.get("bytes_sent", 0) / workers), "wall_s": round(j.wall_s, 1)}


def main():
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mbps in (MBPS, MBPS / 4):
            for label, algo, keys, optimizer in RUNS:
                r = run(label, algo, keys, optimizer, mbps, tmp)
                results.setdefault(f"{mbps:g}mbps", {})[label] = r
                print(f"{mbps:>6g} Mbit/s {label:>22} {json.dumps(r)}", flush=True)
    print(f"\n| algorithm | Mbit/s | s to {TARGET} | final accuracy | MB sent per worker | steps |")
    print("|---|---|---|---|---|---|")
    for bw, by_label in results.items():
        for label, r in by_label.items():
            if "error" in r:
                print(f"| {label} | {bw[:-4]} | fail: {r['error']} | | | |")
                continue
            t = r["time_to_target_s"]
            print(f"| {label} | {bw[:-4]} | {t if t is not None else '-'} | {r['final_accuracy']} | "
                  f"{r['bytes_per_worker'] / 1e6:.1f} | {r['steps']} |")
    first, low = results[f"{MBPS:g}mbps"], results[f"{MBPS / 4:g}mbps"]
    ar, dl = first.get("allreduce", {}), first.get("diloco_h100", {})
    reached = {k: v["time_to_target_s"] for k, v in low.items() if v.get("time_to_target_s") is not None}
    out = {"bench": "lowbandwidth", "target_accuracy": TARGET, "model": MODEL, "mbps": [MBPS, MBPS / 4],
           "results": results,
           "diloco_bytes_ratio": round(ar["bytes_per_worker"] / dl["bytes_per_worker"], 1)
           if ar.get("bytes_per_worker") and dl.get("bytes_per_worker") else None,
           "diloco_accuracy": dl.get("final_accuracy"), "allreduce_accuracy": ar.get("final_accuracy"),
           "fastest_at_low_bandwidth": min(reached, key=reached.get) if reached else None}
    # The baseline ratio: allreduce's time to target over diloco's (sync_every 20), per bandwidth.
    for bw, by_label in results.items():
        a, d = by_label.get("allreduce", {}).get("time_to_target_s"), by_label.get("diloco_h20", {}).get("time_to_target_s")
        out[f"diloco_speedup_{bw}"] = round(a / d, 2) if a and d else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
