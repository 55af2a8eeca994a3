"""./shoal bench lowbandwidth: 4 workers on four network-namespace hosts whose links tbf shapes
(bench/hosts.py, as tests/cluster makes them; CurveZMQ keys), first at a rate calibrated so one
dense exchange of the model takes EXCHANGE_OVER_COMPUTE (4) times one step's compute (both
measured first by a short unlimited job on loopback), then at a quarter of that rate. Where this
process cannot make namespaces (not root) it falls back to the ring's token bucket
([cluster] workers = [{bandwidth_mbps = ...}]) at the same rates, and says so.
Time to the target accuracy, final accuracy and bytes sent per worker for allreduce, bmuf, dgc
and diloco (sync_every 20 and 100, sync_every 100 with bf16 pseudo-gradients, sync_every 20 with
int4, streaming in 4 fragments), each a real job, one after the other. The last line is one
JSON object: per bandwidth and algorithm the figures, "diloco_bytes_ratio" and
"diloco_accuracy" (allreduce's bytes per worker / diloco's at sync_every 100, and diloco's final
accuracy, at the first bandwidth, for diloco with DILOCO_WIRE pseudo-gradients: bf16 unless
set, named by "diloco_wire"), the same for fp32 pseudo-gradients beside them
("diloco_bytes_ratio_fp32", "diloco_accuracy_fp32"), "allreduce_accuracy",
"fastest_at_low_bandwidth" and "goal" (the issue's three goals, each true or false).
Environment: TARGET, EPOCHS, SAMPLES, MODEL, EXCHANGE_OVER_COMPUTE, MBPS (a rate instead of the
calibration), RUNS (a comma-separated subset of the labels below; the JSON then lists them in
"runs", and "fastest_at_low_bandwidth" is among those only), DILOCO_WIRE (the goal's diloco row:
bf16 or fp32), LINKS=token_bucket (skip the hosts)."""
import json, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import hosts  # noqa: E402
from jobs import collective_job, link_mbps, run_job  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "bazel-bin"
TARGET = float(os.environ.get("TARGET", "0.85"))
EPOCHS = int(os.environ.get("EPOCHS", "12"))
SAMPLES = int(os.environ.get("SAMPLES", "6144"))  # per epoch: 48 steps of 4 x 32, one evaluation each
MODEL = os.environ.get("MODEL", "mlp")
EXCHANGE_OVER_COMPUTE = float(os.environ.get("EXCHANGE_OVER_COMPUTE", "4"))
# The pseudo-gradients' wire of the diloco row the goals are judged on. With fp32 at sync_every
# 100 the byte ratio stays under 100: each outer step all-reduces the model as allreduce's every
# step does, diloco takes more steps to the target than allreduce, and its stop exchanges the
# last partial round (ceil(steps / 100) outer steps).
DILOCO_WIRE = os.environ.get("DILOCO_WIRE", "bf16")
if DILOCO_WIRE not in ("bf16", "fp32"):
    sys.exit(f"DILOCO_WIRE: \"{DILOCO_WIRE}\" is not bf16 or fp32")
GOAL_ROW = "diloco_h100" if DILOCO_WIRE == "fp32" else f"diloco_h100_{DILOCO_WIRE}"

ADAMW = 'name = "adamw"\nlr = 1e-3\nwarmup_steps = 20\nschedule = "cosine"\n'
MOMENTUM = 'name = "momentum"\nlr = 0.05\nmomentum = 0.9\nweight_decay = 1e-4\n'
RUNS = [  # (label, algorithm, [algorithm] keys, [optimizer] keys)
    ("allreduce", "allreduce", "", ADAMW),
    ("bmuf", "bmuf", "block_steps = 8\nblock_momentum = 0.5\nblock_lr = 1.0\n", MOMENTUM),
    ("dgc", "dgc", "sparsity = 0.999\nsparsity_warmup_epochs = 1\n", MOMENTUM),
    ("diloco_h20", "diloco", "sync_every = 20\n", ADAMW),
    ("diloco_h100", "diloco", "sync_every = 100\n", ADAMW),
    ("diloco_h100_bf16", "diloco", "sync_every = 100\nouter_wire = \"bf16\"\n", ADAMW),
    ("diloco_h20_int4", "diloco", "sync_every = 20\nouter_wire = \"int4\"\n", ADAMW),
    ("streaming_diloco_h20", "diloco", "sync_every = 20\nstreaming = 4\noverlap_steps = 1\n", ADAMW),
]
if os.environ.get("RUNS"):
    chosen = os.environ["RUNS"].split(",")
    unknown = [c for c in chosen if c not in [r[0] for r in RUNS]]
    if unknown:
        sys.exit(f"RUNS: unknown {', '.join(unknown)} (known: {', '.join(r[0] for r in RUNS)})")
    RUNS = [r for r in RUNS if r[0] in chosen]


def job(label, out, algo, keys, optimizer, workers):
    return collective_job(f"lowbw-{label}", out, workers, MODEL, SAMPLES, algo, keys, optimizer, EPOCHS, TARGET)


def calibrate(tmp):
    """The link rate (Mbit/s per worker) at which one dense exchange of the model takes
    EXCHANGE_OVER_COMPUTE x one step's compute, with the figures it came from. Both from one
    unlimited job on loopback that does not exchange until it ends (diloco, sync_every beyond
    its steps): the step is what a step costs here beside its exchange (forward/backward, the
    optimizer, the data; on a loaded machine far more than forward/backward alone), the bytes
    its one all-reduce of the model at the end."""
    j = run_job(BIN, tmp, "calibrate", lambda out: collective_job(
        "lowbw-calibrate", out, "{}, {}, {}, {}", MODEL, SAMPLES, "diloco", f"sync_every = {1 << 30}\n", ADAMW,
        2, 1.0), timeout=600)
    step_s, dense = (None, None) if j.error else (j.local_step_s(), j.done.get("bytes_per_outer_step"))
    if not step_s or not dense:
        sys.exit(f"lowbandwidth: the calibration job gave no step time or exchange bytes: {j.error or j.done}")
    return link_mbps(dense, step_s, EXCHANGE_OVER_COMPUTE), {
        "step_s": round(step_s, 4), "forward_backward_s": round(j.compute_s_per_step(), 4),
        "dense_exchange_bytes": dense, "exchange_over_compute": EXCHANGE_OVER_COMPUTE}


def figures(j):
    if j.error:
        return {"error": j.error}
    reach = j.time_to(TARGET)
    r = {"time_to_target_s": round(reach, 1) if reach is not None else None,
         "final_accuracy": j.done.get("test_accuracy"), "steps": j.done.get("steps"),
         "bytes_per_worker": int(j.done.get("bytes_sent", 0) / (j.done.get("workers") or 4)),
         "wall_s": round(j.wall_s, 1)}
    # Steps to the target, and what one step's exchange took on rank 0 against its compute.
    r["steps_to_target"] = j.first_eval(TARGET).get("step")
    end = next(iter(j.rank0("end")), {})
    if end.get("compute_s"):
        r["comm_over_compute"] = round((end.get("comm_s", 0) + end.get("wait_s", 0)) / end["compute_s"], 2)
    return r


def run_all(mbps, tmp, on_hosts, keys, results):
    for label, algo, algo_keys, optimizer in RUNS:
        name = f"{label}_{mbps:g}"
        if on_hosts:
            j = on_hosts.run(BIN, job(label, "OUT", algo, algo_keys, optimizer, "{}, {}, {}, {}"), tmp, name, keys,
                             timeout=1800)
        else:
            links = ", ".join([f"{{bandwidth_mbps = {mbps}}}"] * 4)
            j = run_job(BIN, tmp, name, lambda out: job(label, out, algo, algo_keys, optimizer, links), timeout=1800)
        r = figures(j)
        results.setdefault(f"{mbps:g}mbps", {})[label] = r
        print(f"{mbps:>7.4g} Mbit/s {label:>22} {json.dumps(r)}", flush=True)


def print_table(results):
    print(f"\n| algorithm | Mbit/s | s to {TARGET} | final accuracy | MB sent per worker | steps |")
    print("|---|---|---|---|---|---|")
    for bw, by_label in results.items():
        for label, r in by_label.items():
            if "error" in r:
                print(f"| {label} | {bw[:-4]} | fail: {r['error']} | | | |")
                continue
            t = r["time_to_target_s"]
            print(f"| {label} | {bw[:-4]} | {t if t is not None else '-'} | {r['final_accuracy']} | "
                  f"{r['bytes_per_worker'] / 1e6:.2f} | {r['steps']} |")


def summary(results, rates):
    first, low = results.get(f"{rates[0]:g}mbps", {}), results.get(f"{rates[1]:g}mbps", {})
    ar, dl, fp32 = first.get("allreduce", {}), first.get(GOAL_ROW, {}), first.get("diloco_h100", {})
    reached = {k: v["time_to_target_s"] for k, v in low.items() if v.get("time_to_target_s") is not None}

    def ratio(d):
        b = ar.get("bytes_per_worker"), d.get("bytes_per_worker")
        return round(b[0] / b[1], 1) if b[0] and b[1] else None

    out = {"diloco_bytes_ratio": ratio(dl), "diloco_accuracy": dl.get("final_accuracy"), "diloco_wire": DILOCO_WIRE,
           "diloco_bytes_ratio_fp32": ratio(fp32), "diloco_accuracy_fp32": fp32.get("final_accuracy"),
           "allreduce_accuracy": ar.get("final_accuracy"),
           "fastest_at_low_bandwidth": min(reached, key=reached.get) if reached else None}
    # The baseline ratio: allreduce's time to target over diloco's (sync_every 20), per bandwidth.
    for bw, by_label in results.items():
        a, d = (by_label.get(k, {}).get("time_to_target_s") for k in ("allreduce", "diloco_h20"))
        out[f"diloco_speedup_{bw}"] = round(a / d, 2) if a and d else None
    acc_ok = out["diloco_accuracy"] is not None and out["allreduce_accuracy"] is not None
    out["goal"] = {
        "diloco_within_1_point": acc_ok and out["diloco_accuracy"] >= out["allreduce_accuracy"] - 0.01,
        "bytes_ratio_at_least_100": (out["diloco_bytes_ratio"] or 0) >= 100,
        "diloco_fastest_at_low_bandwidth": (out["fastest_at_low_bandwidth"] or "").find("diloco") >= 0}
    return out


def main():
    why_not = "LINKS=token_bucket" if os.environ.get("LINKS") == "token_bucket" else hosts.unavailable()
    links = "tbf_netns_hosts" if why_not is None else "token_bucket"
    results, load_start, measured = {}, os.getloadavg()[0], []
    with tempfile.TemporaryDirectory() as tmp:
        if os.environ.get("MBPS"):
            rate, cal = float(os.environ["MBPS"]), {"mbps_from": "MBPS"}
        else:
            rate, cal = calibrate(tmp)
        rates = [round(rate, 1), round(rate / 4, 1)]
        if why_not:
            print(f"links: the ring's token bucket on loopback, NOT tbf-shaped namespace hosts ({why_not})", flush=True)
        else:
            print("links: 4 network-namespace hosts, each link tbf-shaped, CurveZMQ keys", flush=True)
        print(f"calibration: {json.dumps(cal)}; links at {rates[0]} then {rates[1]} Mbit/s per worker", flush=True)
        if why_not:
            for mbps in rates:
                run_all(mbps, tmp, None, "", results)
        else:
            keys = subprocess.run([f"{BIN}/common/transport/shoal-keygen"], capture_output=True, text=True,
                                  check=True).stdout
            with hosts.Hosts(rates[0], prefix="lbw", net=215) as on_hosts:
                for mbps in rates:
                    on_hosts.set_rate(mbps)
                    measured.append(round(on_hosts.measure_mbps(), 1))
                    print(f"links at {mbps} Mbit/s: one TCP stream measured {measured[-1]} Mbit/s", flush=True)
                    run_all(mbps, tmp, on_hosts, keys, results)
    print_table(results)
    out = {"bench": "lowbandwidth", "runs": [r[0] for r in RUNS] if os.environ.get("RUNS") else "all",
           "links": links, "target_accuracy": TARGET, "model": MODEL, "mbps": rates,
           "measured_mbps": measured or None, "calibration": cal, "load_avg_start": round(load_start, 1),
           "load_avg_end": round(os.getloadavg()[0], 1), "results": results}
    out.update(summary(results, rates))
    if out["diloco_bytes_ratio"] is not None:
        print(f"\ndiloco_bytes_ratio {out['diloco_bytes_ratio']} (accuracy {out['diloco_accuracy']}): diloco at "
              f"sync_every 100 with {DILOCO_WIRE} pseudo-gradients; with fp32 ones "
              f"{out['diloco_bytes_ratio_fp32']} (accuracy {out['diloco_accuracy_fp32']}); allreduce's accuracy "
              f"{out['allreduce_accuracy']}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
