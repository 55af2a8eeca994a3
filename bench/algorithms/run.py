"""./shoal bench algorithms: time to target accuracy and bytes sent per worker for each
algorithm on 4 workers, (a) equal workers, (b) one slow worker: as root each worker in its own
cgroup with a CPU quota (QUOTAS, default three at 0.45 of a core and one at 0.15, a device a third
as fast, as `./shoal bench heterogeneous`), elsewhere one worker sleeping 2x its compute (which
lets the others take its core while it sleeps, so it is no slower device; the output says which
ran), (c) every
worker's bandwidth limited so a dense exchange takes about 4x the compute time (the
in-process token bucket), (d) the same limit as real tbf-shaped links between four
network-namespace hosts (root only; HOSTS=0 skips it). auto runs in every scenario too, and a
table sets its choice and time against the fastest algorithm's.
Each run is a real job through the launcher; REPS repeats every cell, each repetition with its own seed
(medians in the tables); EVAL_EVERY evaluates every that many steps as well as at epochs' ends, and each
run also reports its training time to target (less rank 0's evaluations) and its step; the last line is
one JSON object."""
import json, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from hosts import Hosts, unavailable  # noqa: E402
from jobs import FASHION_MNIST, free_port, link_mbps, run_job  # noqa: E402

BIN = sys.argv[1] if len(sys.argv) > 1 else "bazel-bin"
ALGOS = [a for a in os.environ.get("ALGOS", "allreduce,double_buffer,ps_async,bmuf,adpsgd,dgc").split(",")
         if a != "auto"]  # auto runs in every scenario, after the others
TARGET = float(os.environ.get("TARGET", "0.85"))
EPOCHS = int(os.environ.get("EPOCHS", "4"))
SAMPLES = int(os.environ.get("SAMPLES", "30000"))
MODEL = os.environ.get("MODEL", "lenet")
# A subset of "equal,slow_worker,slow_links" (the token bucket calibrates only when it runs).
SCENARIOS = os.environ.get("SCENARIOS", "equal,slow_worker,slow_links").split(",")
QUOTAS = [float(q) for q in os.environ.get("QUOTAS", "0.45,0.45,0.45,0.15").split(",")]
# Repetitions per algorithm and scenario (each repetition runs every algorithm before the next
# begins); the tables show the median run by time to target. Near the target a run crosses it
# an evaluation sooner or later by chance, so one run per cell can mislead.
REPS = int(os.environ.get("REPS", "1"))
# Repetition r runs with seed 42 + r (SAME_SEED=1: 42 for all): a synchronous algorithm repeats
# its steps exactly from one seed, so only other seeds show how much its step to target is chance.
SAME_SEED = os.environ.get("SAME_SEED", "0") == "1"
# Evaluate every EVAL_EVERY steps too ([train] eval_every_steps; 0: at each epoch's end only): a
# time to target is then known to that many steps, where at epochs' ends one evaluation more or
# less is 20-25% of it.
EVAL_EVERY = int(os.environ.get("EVAL_EVERY", "0"))

ALGO_KEYS = {
    "allreduce": "",
    "double_buffer": "",
    "ps_async": "",
    "bmuf": "block_steps = 8\nblock_momentum = 0.5\nblock_lr = 1.0\n",
    "adpsgd": "",
    # A short run: no sparsity warm-up, or its dense-sized first epochs dominate the bytes.
    "dgc": "sparsity = 0.999\nsparsity_warmup_epochs = 0\nclip_norm = 5.0\n",
}
# auto hands over to the candidates as configured here: the same block momentum and sparsity as
# their own rows (bmuf's default block_momentum, 0.9, took 290-330 steps to 0.85 on slow links where
# 0.5 took 200-280).
ALGO_KEYS["auto"] = "probe_steps = 10\n" + ALGO_KEYS["bmuf"] + ALGO_KEYS["dgc"]
# Learning rate per algorithm (for the global batch): a 1-step-stale gradient under
# momentum 0.9 needs a smaller one (tests/training measured the same).
LR = {"double_buffer": 0.02}


def job(name, out, algo, workers_toml, rep=0):
    return f"""[job]
name = "{name}"
seed = {42 + (0 if SAME_SEED else rep)}
output_dir = "{out}"
[cluster]
servers = ["127.0.0.1:{free_port()}", "127.0.0.1:{free_port()}"]
workers = {workers_toml}
[model]
name = "{MODEL}"
[data]
{FASHION_MNIST}
batch_size = 32
max_train_samples = {SAMPLES}
max_test_samples = 5000
[algorithm]
name = "{algo}"
{ALGO_KEYS.get(algo, "")}
[optimizer]
name = "momentum"
lr = {LR.get(algo, 0.05)}
momentum = 0.9
weight_decay = 1e-4
schedule = "cosine"
[train]
epochs = {EPOCHS}
target_accuracy = {TARGET}
eval_every_steps = {EVAL_EVERY}
threads = 1
log_every_steps = 20
"""


def run(algo, scenario, workers_toml, tmp, rep=0):
    return figures(job_run(algo, scenario, workers_toml, tmp, rep))


def job_run(algo, scenario, workers_toml, tmp, rep=0):
    return run_job(BIN, tmp, f"{algo}-{scenario}-{rep}",
                   lambda out: job(f"bench-{algo}-{scenario}", out, algo, workers_toml, rep), timeout=3600)


def median_run(runs):
    """Of one cell's repetitions, the median run by time to target (one that missed the target
    counts as the slowest; the lower median of an even count), every run's time beside it."""
    ordered = sorted(runs, key=lambda r: (r.get("time_to_target_s") is None, r.get("time_to_target_s") or 0))
    median = dict(ordered[(len(ordered) - 1) // 2])
    if len(runs) > 1:
        median["runs_s"] = [r.get("time_to_target_s") for r in runs]
    return median


def figures(j):
    """One job's figures (a JobRun from the launcher or from the hosts)."""
    if j.error:
        return {"error": j.error}
    reach, train = j.time_to(TARGET), j.train_time_to(TARGET)
    auto = next(iter(j.rank0("auto")), {})
    return {"time_to_target_s": round(reach, 1) if reach is not None else None,
            "train_s_to_target": round(train, 1) if train is not None else None,
            "steps_to_target": j.first_eval(TARGET).get("step"),
            **({"auto_choice": auto.get("choice") + (" (balanced)" if auto.get("balance") else ""),
                "auto_probe_steps": auto.get("probe_steps"), "auto_handover_s": auto.get("handover_s"),
                "auto_compute_max_s": auto.get("compute_max_s"),
                "auto_exchange_s": auto.get("exchange_s")} if auto else {}),
            "compute_s_per_step": j.compute_s_per_step(), "bytes_per_step": j.bytes_per_step(),
            "final_accuracy": j.done.get("test_accuracy"), "wall_s": round(j.wall_s, 1),
            "bytes_per_worker": int(j.done.get("bytes_sent", 0) / 4),
            "steady_bytes_per_step": j.steady_bytes_per_step()}


def print_auto_against_best(results):
    """Per scenario: what auto chose and its time to target against the fastest algorithm's, by
    wall time and by training time (wall time less rank 0's evaluations)."""
    print("\n| scenario | auto chose | auto: s | fastest | its s | auto / fastest | auto: s training (steps) "
          "| fastest training | its s (steps) | auto / fastest training |\n|---|---|---|---|---|---|---|---|---|---|")
    for scenario in ("equal", "slow_worker", "slow_links", "hosts"):
        a = results.get(f"auto/{scenario}")
        cells = {algo: results.get(f"{algo}/{scenario}", {}) for algo in ALGOS}
        if not a:
            continue
        row = [scenario, a.get("auto_choice", "-")]
        for key in ("time_to_target_s", "train_s_to_target"):
            times = {k: c.get(key) for k, c in cells.items() if c.get(key) is not None}
            t = a.get(key)
            if not times:
                row += [t if t is not None else "-", "-", "-", "-"]
                continue
            best = min(times, key=times.get)

            def with_steps(value, cell):  # the training columns show the step beside the time
                return f"{value} ({cell.get('steps_to_target')})" if key == "train_s_to_target" else value
            row += [with_steps(t if t is not None else "-", a), best, with_steps(times[best], cells[best]),
                    round(t / times[best], 2) if t else "-"]
        print("| " + " | ".join(str(x) for x in row) + " |")


def main():
    # Calibrate (c): dense bytes per step of the model vs compute time per step, from a
    # short allreduce run on equal workers.
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        equal = "4"
        if os.geteuid() == 0:
            slow = "[" + ", ".join(f"{{cpu_quota = {q}}}" for q in QUOTAS) + "]"
            print(f"slow worker: CPU quotas {QUOTAS} (cores)", flush=True)
        else:
            slow = "[{}, {}, {}, {slowdown = 2.0}]"
            print("slow worker: not root, so no CPU quotas: worker 3 sleeps 2x its compute (the others may use "
                  "its core meanwhile)", flush=True)
        mbps = float(os.environ.get("LIMIT_MBPS", "0"))
        base = {}
        if "slow_links" in SCENARIOS and not mbps:
            cal = job_run("allreduce", "calibrate", equal, tmp)
            base = figures(cal)
            if not cal.error:  # limit so one step's dense exchange takes 4x that step's compute
                mbps = link_mbps(cal.bytes_per_step(), cal.compute_s_per_step(), 4)
        mbps = mbps or 100.0
        print(f"calibration: {json.dumps(base)}; slow links at {mbps:.1f} Mbit/s per worker", flush=True)
        limited = "[" + ", ".join([f"{{bandwidth_mbps = {mbps}}}"] * 4) + "]"
        for scenario, workers in (("equal", equal), ("slow_worker", slow), ("slow_links", limited)):
            if scenario not in SCENARIOS:
                continue
            runs = {}
            for rep in range(REPS):
                for algo in ALGOS + ["auto"]:
                    r = run(algo, scenario, workers, tmp, rep)
                    runs.setdefault(algo, []).append(r)
                    print(f"{algo:>14} {scenario:>12} {json.dumps(r)}", flush=True)
            for algo, rs in runs.items():
                results[f"{algo}/{scenario}"] = median_run(rs)
        why_not = "HOSTS=0" if os.environ.get("HOSTS", "1") == "0" else unavailable()
        if why_not:
            print(f"scenario (d), tbf-shaped namespace hosts, skipped: {why_not}", flush=True)
        else:
            keys = subprocess.run([f"{BIN}/common/transport/shoal-keygen"], capture_output=True, text=True).stdout
            with Hosts(mbps) as hosts:
                runs = {}
                for rep in range(REPS):
                    for algo in ALGOS + ["auto"]:
                        servers = 2 if algo.startswith("ps_") else 0
                        r = figures(hosts.run(BIN, job(f"bench-{algo}-hosts", "OUT", algo, "4", rep), tmp,
                                              f"{algo}-hosts-{rep}", keys, servers))
                        runs.setdefault(algo, []).append(r)
                        print(f"{algo:>14} {'tbf_hosts':>12} {json.dumps(r)}", flush=True)
                for algo, rs in runs.items():
                    results[f"{algo}/hosts"] = median_run(rs)
    print(f"\n| algorithm | equal: s to {TARGET} | bytes/worker | slow worker: s | slow links: s | bytes/worker "
          f"| tbf hosts: s |")
    print("|---|---|---|---|---|---|---|")
    for algo in ALGOS + ["auto"]:
        e, w, l, h = (results.get(f"{algo}/{k}", {}) for k in ("equal", "slow_worker", "slow_links", "hosts"))
        f = lambda r, k: r.get(k) if r.get(k) is not None else ("-" if "error" not in r else "fail")
        name = algo + (f" (chose {h['auto_choice']})" if h.get("auto_choice") else "")
        print(f"| {name} | {f(e, 'time_to_target_s')} | {f(e, 'bytes_per_worker')} | {f(w, 'time_to_target_s')} | "
              f"{f(l, 'time_to_target_s')} | {f(l, 'bytes_per_worker')} | {f(h, 'time_to_target_s')} |")
    print_auto_against_best(results)
    # Bytes per step from the transport's counters, each algorithm against dense all-reduce
    # on equal workers (2(N-1)/N of the model per worker per step, plus the ring's headers).
    dense = results.get("allreduce/equal", {}).get("steady_bytes_per_step")
    ratios = {}
    print("\n| algorithm | bytes/step/worker (equal) | dense all-reduce / this |")
    print("|---|---|---|")
    for algo in ALGOS:
        b = results.get(f"{algo}/equal", {}).get("steady_bytes_per_step")
        ratios[algo] = round(dense / b, 1) if dense and b else None
        print(f"| {algo} | {b if b is not None else '-'} | {ratios[algo] if ratios[algo] is not None else '-'} |")
    print(json.dumps({"bench": "algorithms", "target_accuracy": TARGET, "model": MODEL, "limit_mbps": round(mbps, 1),
                      "dense_bytes_per_step": dense, "bytes_ratio_vs_dense": ratios, "results": results}))


if __name__ == "__main__":
    main()
