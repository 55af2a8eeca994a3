"""./shoal bench heterogeneous [--reps N] [--algos a,b,...]: mixed devices emulated with CPU
quotas. 4 worker processes, each in its own cgroup with a CFS quota ([cluster] workers =
[{cpu_quota = Q}, ...]; default three at 0.45 of a core and one at 0.15, a device a third as
fast, 1.5 cores in all so on 2 cores nobody takes another's time). Time to the target
accuracy for plain allreduce, balanced allreduce ([algorithm] balance = true: batches split
by measured throughput), adpsgd, bmuf, dgc and auto, each a real job through the launcher,
one after the other; every repetition runs them all before the next starts, so load that
comes and goes touches each alike. Prints each run, then the medians as a table; the last
line is one JSON object with the medians, "speedup" = allreduce / balanced allreduce and
"auto_vs_best" = auto / the fastest of the others. Needs root (cgroups).
Environment: TARGET, EPOCHS, SAMPLES, MODEL, QUOTAS (comma-separated cores per worker)."""
import argparse, json, os, statistics, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from jobs import collective_job, run_job  # noqa: E402

TARGET = float(os.environ.get("TARGET", "0.85"))
EPOCHS = int(os.environ.get("EPOCHS", "12"))
SAMPLES = int(os.environ.get("SAMPLES", "4096"))  # per epoch: a short epoch, a fine clock
MODEL = os.environ.get("MODEL", "lenet")
QUOTAS = [float(q) for q in os.environ.get("QUOTAS", "0.45,0.45,0.45,0.15").split(",")]

RUNS = {  # label: (algorithm, [algorithm] keys)
    "allreduce": ("allreduce", ""),
    "balanced_allreduce": ("allreduce", "balance = true\n"),
    "adpsgd": ("adpsgd", ""),
    "bmuf": ("bmuf", "block_steps = 8\nblock_momentum = 0.5\nblock_lr = 1.0\n"),
    # bench/algorithms' settings: no sparsity warm-up in a short run.
    "dgc": ("dgc", "sparsity = 0.999\nsparsity_warmup_epochs = 0\nclip_norm = 5.0\n"),
    "auto": ("auto", "probe_steps = 10\n"),
}


MOMENTUM = 'name = "momentum"\nlr = 0.05\nmomentum = 0.9\nweight_decay = 1e-4'


def job(name, out, algo, keys):
    workers = ", ".join(f"{{cpu_quota = {q}}}" for q in QUOTAS)
    return collective_job(name, out, workers, MODEL, SAMPLES, algo, keys, MOMENTUM, EPOCHS, TARGET)


def run(bin_dir, label, rep, tmp):
    algo, keys = RUNS[label]
    j = run_job(bin_dir, tmp, f"{label}-{rep}", lambda out: job(f"hetero-{label}", out, algo, keys), timeout=1200)
    if j.error:
        return {"error": j.error}
    reach = j.time_to(TARGET)
    steps = j.first_eval(TARGET).get("step")
    slowest = QUOTAS.index(min(QUOTAS))
    slow = [e["batch_size"] for e in j.events
            if e.get("event") == "train" and e.get("rank", 0) == slowest and "batch_size" in e]
    auto = next(iter(j.rank0("auto")), {})
    r = {"time_to_target_s": round(reach, 1) if reach is not None else None, "steps_to_target": steps,
         "final_accuracy": j.done.get("test_accuracy"), "steps": j.done.get("steps"), "wall_s": round(j.wall_s, 1)}
    if slow:
        r["slow_worker_last_batch"] = slow[-1]
    # Compute seconds per step, slowest worker over the others' mean: the quotas' ratio (3x)
    # when they hold and batches are equal, nearer 1 when other load leaves every worker less
    # than its quota (or when balancing evened the steps out).
    per_step = {e["rank"]: e["compute_s"] / max(1, e.get("steps", 0))
                for e in j.events if e.get("event") == "end" and "compute_s" in e and "rank" in e}
    if slowest in per_step and len(per_step) > 1:
        rest = [v for k, v in per_step.items() if k != slowest]
        r["slow_compute_ratio"] = round(per_step[slowest] / (sum(rest) / len(rest)), 2)
    if auto:
        r["auto_choice"] = auto.get("choice") + (" (balanced)" if auto.get("balance") else "")
    return r


def median(xs):
    """The median of the runs that reached the target; None when fewer than half did."""
    ok = [x for x in xs if x is not None]
    return round(statistics.median(ok), 1) if ok and len(ok) * 2 >= len(xs) else None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bin_dir", nargs="?", default="bazel-bin")
    p.add_argument("--reps", type=int, default=3, help="repetitions of every algorithm (default 3)")
    p.add_argument("--algos", default=",".join(RUNS), help="comma-separated subset of " + ",".join(RUNS))
    a = p.parse_args()
    labels = a.algos.split(",")
    for label in labels:
        if label not in RUNS:
            p.error(f"--algos: unknown '{label}' (known: {', '.join(RUNS)})")
    if a.reps < 1:
        p.error("--reps: at least 1")
    load_start = os.getloadavg()[0]
    runs = {label: [] for label in labels}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.reps):
            for label in labels:
                r = run(a.bin_dir, label, rep, tmp)
                runs[label].append(r)
                print(f"rep {rep + 1} {label:>20} {json.dumps(r)} load {os.getloadavg()[0]:.1f}", flush=True)
    med = {label: median([r.get("time_to_target_s") for r in runs[label]]) for label in labels}
    print(f"\nquotas {QUOTAS} (cores), {MODEL}, batch 32 per worker, median of {a.reps} run(s)")
    print(f"| algorithm | median s to {TARGET} | runs (s) | steps to target | slowest / others' compute per step "
          f"| final accuracy (last run) | slowest worker's last batch |")
    print("|---|---|---|---|---|---|---|")
    for label in labels:
        rs = runs[label]
        times = ", ".join("fail" if "error" in r else str(r.get("time_to_target_s") or "-") for r in rs)
        chose = [r["auto_choice"] for r in rs if r.get("auto_choice")]
        name = label + (f" (chose {', '.join(chose)})" if chose else "")
        m = med[label]
        steps = ", ".join(str(r.get("steps_to_target") or "-") for r in rs)
        ratios = ", ".join(str(r.get("slow_compute_ratio", "-")) for r in rs)
        print(f"| {name} | {m if m is not None else '-'} | {times} | {steps} | {ratios} | "
              f"{rs[-1].get('final_accuracy', '-')} | {rs[-1].get('slow_worker_last_batch', '-')} |")
    others = {k: v for k, v in med.items() if k != "auto" and v is not None}
    best = min(others, key=others.get) if others else None
    speedup = (round(med["allreduce"] / med["balanced_allreduce"], 2)
               if med.get("allreduce") and med.get("balanced_allreduce") else None)
    auto_vs_best = round(med["auto"] / others[best], 2) if med.get("auto") and best else None
    if "auto" in labels:
        print(f"\n| auto chose | its median s | fastest | its median s | auto / fastest |\n|---|---|---|---|---|")
        chose = sorted({r.get("auto_choice", "-") for r in runs["auto"]})
        print(f"| {', '.join(chose)} | {med['auto']} | {best} | {others.get(best)} | {auto_vs_best} |")
    out = {"bench": "heterogeneous", "target_accuracy": TARGET, "model": MODEL, "cpu_quotas": QUOTAS, "reps": a.reps,
           "load_avg_start": round(load_start, 1), "load_avg_end": round(os.getloadavg()[0], 1)}
    out.update({f"{k}_s": v for k, v in med.items()})
    out.update({"best": best, "speedup": speedup, "auto_vs_best": auto_vs_best, "runs": runs})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
