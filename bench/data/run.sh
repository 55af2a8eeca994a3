#!/usr/bin/env bash
# Image data pipeline throughput against torchvision, in one go: a JPEG folder of
# photo-like images at ImageNet's typical size (500x375, quality 90) made once, then
# decode + RandomResizedCrop(224) + flip + normalize + batch of 64 with 1 and 2 threads,
# Shoal's DataLoader (threads) against torchvision's ImageFolder through a DataLoader
# (worker processes, one thread each). Each side's figure is its best of --rounds, in
# images per wall second and per CPU second (every thread and worker process: steadier on a
# shared machine). Prints a table, then last one JSON object:
#   {"bench":"data","threads":[1,2],"images_per_s":[..],"torch_images_per_s":[..],"ratio":..,"ratios":[..],
#    "images_per_cpu_s":[..],"torch_images_per_cpu_s":[..],"cpu_ratios":[..]}
# ("ratio": wall-clock at 1 thread, i.e. per core; torch figures null when torchvision is missing).
#
# usage: bench/data/run.sh [BAZEL_BIN] [--images N] [--seconds S] [--rounds R] [--dir DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
images=512 seconds=5 rounds=2 dir=""
bazel_bin=""
if [ $# -gt 0 ] && [ -d "$1" ]; then bazel_bin="$1"; shift; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --images) images="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --dir) dir="$2"; shift 2 ;;
    *) echo "bench/data/run.sh: unknown argument '$1' (see the usage line in this script)" >&2; exit 2 ;;
  esac
done
[ "$images" -ge 64 ] || { echo "bench/data/run.sh: --images must be at least one batch (64)" >&2; exit 2; }
if [ -z "$bazel_bin" ]; then
  bazel_bin=bazel-bin
  [ "${SHOAL_BENCH_NO_BUILD:-0}" = 1 ] || bazel build //bench/data:data_bench >&2
fi
bin="$bazel_bin/bench/data/data_bench"
[ -x "$bin" ] || { echo "bench/data/run.sh: $bin is missing (bazel build //bench/data:data_bench)" >&2; exit 1; }

dir="${dir:-${TMPDIR:-/tmp}/shoal-bench-data-$images}"
if [ ! -f "$dir/.done" ]; then
  echo "making $images JPEGs (500x375, quality 90) in $dir ..." >&2
  /usr/bin/python3 bench/data/make_photos.py "$dir" "$images"
  touch "$dir/.done"
fi

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for t in 1 2; do
  for ((r = 1; r <= rounds; r++)); do
    echo "round $r: $t thread(s): Shoal ..." >&2
    "$bin" --dir "$dir" --threads "$t" --seconds "$seconds" | tail -n 1 >>"$results"
    echo "round $r: $t thread(s): torchvision ..." >&2
    /usr/bin/python3 bench/data/torch_data.py --dir "$dir" --threads "$t" --seconds "$seconds" | tail -n 1 >>"$results" || true
  done
done

/usr/bin/python3 - "$results" <<'PY'
import json, sys
best, cpu, err = {}, {}, None
for line in open(sys.argv[1]):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if "error" in r:
        err = r["error"]
        continue
    k = (r["bench"], r["threads"])
    best[k] = max(best.get(k, 0.0), r["images_per_s"])
    if r.get("images_per_cpu_s"):
        cpu[k] = max(cpu.get(k, 0.0), r["images_per_cpu_s"])
threads = [1, 2]
ours = [best.get(("data_shoal", t)) for t in threads]
theirs = [best.get(("data_torch", t)) for t in threads]
ours_cpu = [cpu.get(("data_shoal", t)) for t in threads]
theirs_cpu = [cpu.get(("data_torch", t)) for t in threads]
ratio = lambda a, b: round(a / b, 2) if a and b else None
ratios = [ratio(o, t) for o, t in zip(ours, theirs)]
cpu_ratios = [ratio(o, t) for o, t in zip(ours_cpu, theirs_cpu)]
print("JPEG 500x375 q90 -> RandomResizedCrop 224 + flip + normalize, batch 64, best of rounds")
print("%8s %14s %14s %7s %18s %18s %9s" % ("threads", "shoal img/s", "torch img/s", "ratio", "shoal img/cpu-s",
                                          "torch img/cpu-s", "cpu ratio"))
for row in zip(threads, ours, theirs, ratios, ours_cpu, theirs_cpu, cpu_ratios):
    print("%8d %14s %14s %7s %18s %18s %9s" % row)
if err:
    print("torchvision: " + err)
print(json.dumps({"bench": "data", "threads": threads, "images_per_s": ours, "torch_images_per_s": theirs,
                  "ratio": ratios[0], "ratios": ratios, "images_per_cpu_s": ours_cpu,
                  "torch_images_per_cpu_s": theirs_cpu, "cpu_ratios": cpu_ratios}, separators=(",", ":")))
PY
