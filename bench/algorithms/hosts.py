"""Scenario (d) of ./shoal bench algorithms: slow links that are real. Four network-namespace
hosts on a bridge, each host's link shaped by tbf to the calibrated rate, every process in its
host's namespace (CurveZMQ keys, as a job across hosts must have), no shared directory."""
import json, os, subprocess, time

NET = "10.214.%d" % (os.getpid() % 250 + 1)
HOSTS = 4


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


class Hosts:
    """The namespaces and bridge, torn down on exit whatever happened."""

    def __init__(self, mbps):
        self.id = os.getpid() % 50000
        self.br = f"sab{self.id}"
        self.ns = [f"sa{self.id}h{k}" for k in range(HOSTS)]
        self.mbps = mbps

    def __enter__(self):
        try:
            sh("ip", "link", "add", self.br, "type", "bridge")
            sh("ip", "link", "set", self.br, "up")
            for k, n in enumerate(self.ns):
                veth = f"sav{self.id}x{k}"
                sh("ip", "netns", "add", n)
                sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", n)
                sh("ip", "link", "set", veth, "master", self.br, "up")
                sh("ip", "-n", n, "addr", "add", f"{NET}.{k + 1}/24", "dev", "eth0")
                sh("ip", "-n", n, "link", "set", "eth0", "up")
                sh("ip", "-n", n, "link", "set", "lo", "up")
                sh("ip", "netns", "exec", n, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                   f"{max(1, int(self.mbps * 1000))}kbit", "burst", "64kb", "latency", "400ms")
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for k, n in enumerate(self.ns):
            pids = sh("ip", "netns", "pids", n, check=False).stdout.split()
            for p in pids:
                sh("kill", "-9", p, check=False)
            sh("ip", "netns", "del", n, check=False)
            sh("ip", "link", "del", f"sav{self.id}x{k}", check=False)
        sh("ip", "link", "del", self.br, check=False)


def run(bin_dir, algo, job_text, tmp, target, keys):
    """One job across the hosts; the same figures as the one-machine runs."""
    d = os.path.join(tmp, f"{algo}-hosts")
    os.makedirs(d, exist_ok=True)
    servers = algo.startswith("ps_")
    cluster = (f'servers = ["{NET}.1:7701", "{NET}.2:7701"]\n' if servers else "") + \
        "workers = [" + ", ".join(f'{{host = "{NET}.{k + 1}"}}' for k in range(HOSTS)) + "]"
    # The hosts replace the one-machine job's servers and workers.
    lines = [l for l in job_text.splitlines() if not l.startswith(("servers =", "workers ="))]
    text = "\n".join(lines).replace("[cluster]", "[cluster]\n" + cluster, 1) + "\n" + keys
    path = os.path.join(d, "job.toml")
    open(path, "w").write(text)
    env = dict(os.environ, SHOAL_JOB_START=str(time.time()), OMP_WAIT_POLICY="PASSIVE")
    procs = []
    ns = [f"sa{os.getpid() % 50000}h{k}" for k in range(HOSTS)]
    t0 = time.time()
    if servers:
        for k in range(2):
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns[k], f"{bin_dir}/server/shoal-server", "--config",
                                           path, "--shard", str(k)], env=env, stdout=subprocess.DEVNULL,
                                          stderr=open(os.path.join(d, f"server{k}.log"), "w")))
    for k in range(HOSTS):
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns[k], f"{bin_dir}/worker/shoal-worker", "--config", path,
                                       "--rank", str(k), "--output_dir", os.path.join(d, f"host{k}")], env=env,
                                      stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, f"worker{k}.log"), "w")))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=3600))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(-9)
    wall = time.time() - t0
    if any(codes):
        last = open(os.path.join(d, "worker0.log")).read().strip().splitlines() or ["?"]
        return {"error": last[-1][:200]}
    reach, choice, end = None, None, {}
    for line in open(os.path.join(d, "host0", "metrics.jsonl")):
        e = json.loads(line)
        if e.get("event") == "eval" and reach is None and (e.get("test_accuracy") or 0) >= target:
            reach = e["wall_s"]
        if e.get("event") == "auto":
            choice = e.get("choice")
        if e.get("event") == "end":
            end = e
    r = {"time_to_target_s": round(reach, 1) if reach is not None else None,
         "final_accuracy": end.get("test_accuracy"), "wall_s": round(wall, 1),
         "bytes_per_worker": end.get("bytes_sent")}
    if choice:
        r["auto_choice"] = choice
    return r
