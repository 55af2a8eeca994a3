"""Real slow links for the benchmarks that time jobs (bench/algorithms' scenario (d),
bench/lowbandwidth): four network-namespace hosts on a bridge, as tests/cluster/netns_test.sh
makes them, each host's link shaped by tbf, every process in its host's namespace with
CurveZMQ keys (as a job across hosts must have), each host writing its own output directory.
Needs root; `unavailable()` says why not, so a benchmark can fall back to the ring's token
bucket and say so."""
import json, os, signal, subprocess, sys, time

from jobs import JobRun

HOSTS = 4
PROBE_PORT = 7799
# measure_mbps's two ends: the receiver prints the Mbit/s it got from its first byte to the end.
RECEIVE = f"""import socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {PROBE_PORT}))
s.listen(1)
s.settimeout(30)
c, _ = s.accept()
c.settimeout(30)
n, t0 = 0, None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    t0 = t0 or time.time()
    n += len(b)
print(n * 8 / max(1e-9, time.time() - (t0 or 0)) / 1e6)
"""
SEND = f"""import socket, sys, time
for _ in range(100):  # the receiver may not listen yet
    try:
        s = socket.create_connection((sys.argv[1], {PROBE_PORT}), timeout=30)
        break
    except ConnectionRefusedError:
        time.sleep(0.05)
b, t = b"x" * (1 << 20), time.time()
while time.time() - t < float(sys.argv[2]):
    s.sendall(b)
s.close()
"""


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def unavailable():
    """None where this process can make network namespaces, else the reason it cannot."""
    if os.geteuid() != 0:
        return "not root"
    probe = f"shoalprobe{os.getpid()}"
    r = sh("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return "ip netns add failed: " + (r.stderr.strip() or "?")
    sh("ip", "netns", "del", probe, check=False)
    return None


def tbf_args(mbps):
    """tc's tbf arguments for `mbps` Mbit/s: a burst of at least one 4 ms tick's worth (a
    smaller bucket holds the rate below what was asked at hundreds of Mbit/s)."""
    burst_kb = max(64, int(mbps * 1e6 / 8 / 250 / 1024) + 1)
    return ["tbf", "rate", f"{max(1, int(mbps * 1000))}kbit", "burst", f"{burst_kb}kb", "latency", "400ms"]


class Hosts:
    """The namespaces `<prefix><id>h<k>` and their bridge on 10.<net>.<id % 250 + 1>.0/24,
    torn down on exit whatever happened (every process left in a namespace killed first).
    `prefix` and `net` keep two benchmarks, or a benchmark and tests/cluster (10.213), apart."""

    def __init__(self, mbps, prefix="sa", net=214):
        self.id = os.getpid() % 50000
        self.prefix, self.mbps = prefix, mbps
        self.net = f"10.{net}.{self.id % 250 + 1}"
        self.br = f"{prefix}b{self.id}"
        self.ns = [f"{prefix}{self.id}h{k}" for k in range(HOSTS)]
        self.veth = [f"{prefix}v{self.id}x{k}" for k in range(HOSTS)]

    def __enter__(self):
        # A benchmark stopped by SIGTERM (a timeout, a scheduler) still tears the hosts down.
        self.old_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            sh("ip", "link", "add", self.br, "type", "bridge")
            sh("ip", "link", "set", self.br, "up")
            for k, n in enumerate(self.ns):
                sh("ip", "netns", "add", n)
                sh("ip", "link", "add", self.veth[k], "type", "veth", "peer", "name", "eth0", "netns", n)
                sh("ip", "link", "set", self.veth[k], "master", self.br, "up")
                sh("ip", "-n", n, "addr", "add", f"{self.net}.{k + 1}/24", "dev", "eth0")
                sh("ip", "-n", n, "link", "set", "eth0", "up")
                sh("ip", "-n", n, "link", "set", "lo", "up")
                sh("ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", "eth0", "root", *tbf_args(self.mbps))
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for k, n in enumerate(self.ns):
            for p in sh("ip", "netns", "pids", n, check=False).stdout.split():
                sh("kill", "-9", p, check=False)
            sh("ip", "netns", "del", n, check=False)
            sh("ip", "link", "del", self.veth[k], check=False)
        sh("ip", "link", "del", self.br, check=False)
        signal.signal(signal.SIGTERM, self.old_term)

    def set_rate(self, mbps):
        """Every host's link shaped to `mbps` from now on."""
        for n in self.ns:
            sh("ip", "netns", "exec", n, "tc", "qdisc", "replace", "dev", "eth0", "root", *tbf_args(mbps))
        self.mbps = mbps

    def measure_mbps(self, seconds=2.0):
        """What one TCP stream gets from host 0 to host 1 over the shaped links, Mbit/s: the
        check that tbf gives the rate asked for (a few percent under it: TCP/IP headers)."""
        py = "/usr/bin/python3"
        recv = subprocess.Popen(["ip", "netns", "exec", self.ns[1], py, "-c", RECEIVE], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            sh("ip", "netns", "exec", self.ns[0], py, "-c", SEND, f"{self.net}.2", str(seconds))
            out, err = recv.communicate(timeout=30)
        finally:
            recv.kill()
        if recv.returncode != 0:
            raise RuntimeError(f"measuring the links: {err.strip()[-200:]}")
        return float(out)

    def run(self, bin_dir, job_text, tmp, label, keys, servers=0, timeout=3600):
        """One job across the hosts: `job_text`'s [cluster] servers and workers replaced by
        `servers` shards (on hosts 0..servers-1) and one worker per host, `keys` (shoal-keygen's
        [security] section) appended. Returns a JobRun like bench/jobs.py's run_job: `done`
        sums what the launcher's done line sums (test_accuracy is rank 0's), `events` holds
        every host's metrics.jsonl, and `error` names the first process that failed."""
        d = os.path.join(tmp, label)
        os.makedirs(d, exist_ok=True)
        cluster = ("servers = [" + ", ".join(f'"{self.net}.{k + 1}:7701"' for k in range(servers)) + "]\n"
                   if servers else "")
        cluster += "workers = [" + ", ".join(f'{{host = "{self.net}.{k + 1}"}}' for k in range(HOSTS)) + "]"
        lines = [l for l in job_text.splitlines() if not l.startswith(("servers =", "workers ="))]
        path = os.path.join(d, "job.toml")
        with open(path, "w") as f:
            f.write("\n".join(lines).replace("[cluster]", "[cluster]\n" + cluster, 1) + "\n" + keys)
        env = dict(os.environ, SHOAL_JOB_START=str(time.time()), OMP_WAIT_POLICY="PASSIVE")
        procs = []  # (log name, process)

        def start(k, name, args):
            log = os.path.join(d, f"{name}.log")
            procs.append((log, subprocess.Popen(["ip", "netns", "exec", self.ns[k], *args], env=env,
                                                stdout=subprocess.DEVNULL, stderr=open(log, "w"))))

        t0 = time.time()
        for k in range(servers):
            start(k, f"server{k}", [f"{bin_dir}/server/shoal-server", "--config", path, "--shard", str(k)])
        for k in range(HOSTS):
            start(k, f"worker{k}", [f"{bin_dir}/worker/shoal-worker", "--config", path, "--rank", str(k),
                                    "--output_dir", os.path.join(d, f"host{k}")])
        deadline, failed = t0 + timeout, None
        for log, p in procs:
            try:
                code = p.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                code = f"killed after {timeout} s"
            if code and failed is None:
                last = (open(log).read().strip().splitlines() or ["?"])[-1]
                failed = f"{os.path.basename(log)[:-4]} ({code}): {last[:200]}"
        wall = time.time() - t0
        if failed:
            return JobRun(wall, error=failed)
        events, ends = [], []
        for k in range(HOSTS):
            with open(os.path.join(d, f"host{k}", "metrics.jsonl")) as f:
                for e in map(json.loads, f):
                    events.append(e)
                    if e.get("event") == "end":
                        ends.append(e)
        rank0 = next((e for e in ends if e.get("rank", 0) == 0), {})
        done = {"event": "done", "test_accuracy": rank0.get("test_accuracy"),
                "steps": max((e.get("steps", 0) for e in ends), default=0), "wall_s": wall,
                "bytes_sent": sum(e.get("bytes_sent", 0) for e in ends), "workers": HOSTS}
        return JobRun(wall, done=done, events=events)
