"""What the benchmarks that time real jobs share (bench/algorithms, bench/heterogeneous,
bench/lowbandwidth, bench/overlap): write a job file, run it through the launcher as `shoal run` does, and read
what it left: the launcher's `done` line and the job's metrics.jsonl (bench/hosts.py runs one
across network-namespace hosts instead and returns the same JobRun). A benchmark's run.py
imports it with `sys.path.insert(0, <bench/>)`, since each runs as a plain script."""
import json, os, socket, subprocess, time

# The [data] section of a Fashion-MNIST job, as the image ships the data set; the sample caps
# come after it.
FASHION_MNIST = ('format = "idx"\n'
                 'train = "/usr/share/datasets/fashion-mnist/train"\n'
                 'test = "/usr/share/datasets/fashion-mnist/t10k"')


def collective_job(name, out, workers, model, samples, algo, keys, optimizer, epochs, target):
    """A Fashion-MNIST job timed to a target accuracy on four loopback workers, one thread
    each; `workers` is the [cluster] workers list's TOML (per-worker quotas or links)."""
    return f"""[job]
name = "{name}"
seed = 42
output_dir = "{out}"
[cluster]
workers = [{workers}]
[model]
name = "{model}"
[data]
{FASHION_MNIST}
batch_size = 32
max_train_samples = {samples}
max_test_samples = 1000
[algorithm]
name = "{algo}"
{keys}
[optimizer]
{optimizer}
[train]
epochs = {epochs}
target_accuracy = {target}
threads = 1
log_every_steps = 10
"""

def free_port():
    """A TCP port free on loopback now (for a job's servers)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class JobRun:
    """One finished job: `error` (the launcher's last stderr line) when it failed, else
    `done` (its last stdout line, the `done` object) and `events` (metrics.jsonl, in order)."""

    def __init__(self, wall_s, error=None, done=None, events=None):
        self.wall_s, self.error, self.done, self.events = wall_s, error, done or {}, events or []

    def rank0(self, event):
        """Rank 0's events of one kind (a record without a rank is the launcher's or rank 0's)."""
        return [e for e in self.events if e.get("event") == event and e.get("rank", 0) == 0]

    def time_to(self, target):
        """wall_s of the first evaluation at or above `target` (first_eval); None if none reached it.
        wall_s counts from the job's start, so start-up counts the same for every run."""
        return self.first_eval(target).get("wall_s")

    def train_time_to(self, target):
        """time_to(target) less rank 0's evaluation time until then (each eval record's eval_s):
        the training time to the target, which does not grow with how often the job evaluates.
        None if the target was not reached."""
        first = self.first_eval(target)
        if not first:
            return None
        return first["wall_s"] - sum(e.get("eval_s") or 0 for e in self.rank0("eval")
                                     if not e.get("final") and e.get("step", 0) <= first.get("step", 0))

    def first_eval(self, target):
        """The first evaluation at or above `target` by any worker ({} if none): its wall_s and
        step. Every worker evaluates its own model and the job stops once one reaches the target;
        where the models differ (bmuf, adpsgd, diloco between exchanges) rank 0's alone can miss
        the evaluation that stopped the job."""
        hits = [e for e in self.events if e.get("event") == "eval" and (e.get("test_accuracy") or 0) >= target]
        return min(hits, key=lambda e: (e.get("step", 0), e.get("wall_s", 0)), default={})

    def compute_s_per_step(self):
        """Compute seconds per step, the mean over the workers' end records."""
        ends = [e for e in self.events if e.get("event") == "end"]
        steps = max((e.get("steps", 0) for e in ends), default=0)
        return sum(e.get("compute_s", 0) for e in ends) / max(1, len(ends)) / max(1, steps)

    def bytes_per_step(self):
        """Bytes one worker sent per step over the whole job (its start included)."""
        workers, steps = self.done.get("workers") or 4, self.done.get("steps") or 0
        return self.done.get("bytes_sent", 0) / workers / max(1, steps)

    def steady_bytes_per_step(self):
        """Rank 0's transport counter (bytes_sent) between its second and its last train event,
        over the steps between them: what one step puts on the wire once the job runs (the
        start left out; dgc's sparsity warm-up too where it ends before the
        second event). None without two such events."""
        t = [e for e in self.rank0("train") if e.get("bytes_sent") is not None]
        if len(t) < 3 or t[-1]["step"] <= t[1]["step"]:
            return None
        return round((t[-1]["bytes_sent"] - t[1]["bytes_sent"]) / (t[-1]["step"] - t[1]["step"]), 1)

    def local_step_s(self):
        """Seconds per step on rank 0 between its train events, the median over the intervals
        after the first (start-up left out; an interval holding an evaluation or an exchange
        is outvoted): what a step costs this machine beside its exchange, in a job that does
        not exchange every step. None without two intervals."""
        t = [e for e in self.rank0("train")]
        per = sorted((b["wall_s"] - a["wall_s"]) / (b["step"] - a["step"]) for a, b in zip(t[1:], t[2:])
                     if b["step"] > a["step"])
        return per[len(per) // 2] if per else None


def link_mbps(bytes_per_step, step_s, exchange_over_step):
    """The per-worker link rate, Mbit/s, at which sending `bytes_per_step` takes
    `exchange_over_step` times `step_s` (a benchmark's calibrated slow links)."""
    return bytes_per_step * 8 / (exchange_over_step * step_s) / 1e6


def run_job(bin_dir, tmp, label, job_text, timeout):
    """Runs the job `job_text(output_dir)` in tmp/label (job.toml there, its output in
    tmp/label/out) through bin_dir's shoal-launch, waiting at most `timeout` s."""
    d = os.path.join(tmp, label)
    os.makedirs(d, exist_ok=True)
    out = os.path.join(d, "out")
    path = os.path.join(d, "job.toml")
    with open(path, "w") as f:
        f.write(job_text(out))
    t0 = time.time()
    p = subprocess.run([f"{bin_dir}/tools/launcher/shoal-launch", f"--bin_dir={bin_dir}", path],
                       capture_output=True, text=True, timeout=timeout)
    wall = time.time() - t0
    if p.returncode != 0:
        return JobRun(wall, error=(p.stderr.strip().splitlines() or ["?"])[-1])
    with open(os.path.join(out, "metrics.jsonl")) as f:
        events = [json.loads(line) for line in f]
    return JobRun(wall, done=json.loads(p.stdout.strip().splitlines()[-1]), events=events)
