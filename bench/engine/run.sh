#!/usr/bin/env bash
# Engine training throughput against PyTorch, same model, batch, threads and update, in
# one go, and the engine's peak memory with buffers shared by liveness against one more short
# run without (--memory_reuse=false). Prints two tables, one JSON line per model, and last
# the lenet line:
#   {"bench":"engine","model":"lenet","samples_per_s":..,"torch_samples_per_s":..,"ratio":..,
#    "peak_mib":..,"peak_mib_no_reuse":..,"memory_ratio":..}
# (torch figures null when `import torch` fails; memory_ratio = peak_mib / peak_mib_no_reuse).
#
# usage: bench/engine/run.sh [BAZEL_BIN] [--threads N] [--batch B] [--seconds S] [--rounds R] [--models "resnet20 lenet"]
#        [--precision fp32|bf16]   (bf16: Shoal's [model] precision = "bf16" against PyTorch's CPU autocast)
#        [--onnx "resnet18 vit"]   imported models instead: PyTorch exports each (torchvision resnet18,
#                                  mobilenet_v2, the small ViT of tests/engine/pytorch/reference.py), Shoal
#                                  trains the ONNX file, PyTorch the module itself
# (`./shoal bench engine` passes BAZEL_BIN after building; without it this script builds.)
# Each round runs C++ then PyTorch; a side's figure is its best round (median step time
# within a round), which keeps other tenants of a shared machine from deciding the ratio.
set -euo pipefail
cd "$(dirname "$0")/../.."

threads=2 batch=64 seconds=5 rounds=3 models="resnet20 lenet" precision=fp32 onnx=""
bazel_bin=""
if [ $# -gt 0 ] && [ -d "$1" ]; then bazel_bin="$1"; shift; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --models) models="$2"; shift 2 ;;
    --precision) precision="$2"; shift 2 ;;
    --onnx) onnx="$2"; shift 2 ;;
    *) echo "bench/engine/run.sh: unknown argument '$1' (see the usage line in this script)" >&2; exit 2 ;;
  esac
done

if [ -z "$bazel_bin" ]; then
  bazel_bin=bazel-bin
  [ "${SHOAL_BENCH_NO_BUILD:-0}" = 1 ] || bazel build //bench/engine:engine_bench >&2
fi
bin="$bazel_bin/bench/engine/engine_bench"
[ -x "$bin" ] || { echo "bench/engine/run.sh: $bin is missing (bazel build //bench/engine:engine_bench)" >&2; exit 1; }

# Both sides use libgomp. Its default spin-waiting collapses 2-thread throughput 2-20x
# whenever anything else runs on the machine (measured on 2 shared cores: resnet20 22-145
# samples/s active vs ~245 passive), so both run passive unless the caller chose.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

# Debian's torch lives in the system interpreter, which may not be the first python3.
py=python3
for cand in /usr/bin/python3 python3; do
  if "$cand" -c "import torch" >/dev/null 2>&1; then py="$cand"; break; fi
done

results=$(mktemp)
onnx_dir=$(mktemp -d)
trap 'rm -rf "$results" "$onnx_dir"' EXIT
onnx_args=()
if [ -n "$onnx" ]; then
  models="$onnx"
  "$py" tests/engine/pytorch/reference.py "$onnx_dir" $onnx >&2
fi
for model in $models; do
  [ -n "$onnx" ] && onnx_args=(--onnx "$onnx_dir/$model.onnx")
  for ((r = 1; r <= rounds; r++)); do
    echo "round $r: $model C++ ..." >&2
    "$bin" --model "$model" --threads "$threads" --batch "$batch" --seconds "$seconds" --precision "$precision" \
      ${onnx_args[@]+"${onnx_args[@]}"} | tail -n 1 >>"$results"
    echo "round $r: $model PyTorch ..." >&2
    "$py" bench/engine/torch_engine.py --model "$model" --threads "$threads" --batch "$batch" --seconds "$seconds" \
      --precision "$precision" \
      | tail -n 1 >>"$results" || true
  done
  echo "$model C++ without memory reuse (peak memory only) ..." >&2
  "$bin" --model "$model" --threads "$threads" --batch "$batch" --seconds 0 --warmup 1 --precision "$precision" \
    --memory_reuse=false ${onnx_args[@]+"${onnx_args[@]}"} | tail -n 1 >>"$results"
done

"$py" - "$results" "$models" "$threads" "$batch" "$precision" <<'PY'
import json, sys
path, models, threads, batch = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4])
precision = sys.argv[5]
best, cpu, peak = {}, {}, {}
torch_error = None
for line in open(path):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if "error" in r:
        torch_error = r["error"]
        continue
    key = (r["bench"], r["model"])
    if "peak_bytes" in r:
        peak[(r["model"], r["memory_reuse"])] = r["peak_bytes"]
        if not r["memory_reuse"]:
            continue  # a short run for its memory figure only
    best[key] = max(best.get(key, 0.0), r["samples_per_s"])
    if "cpu_ms_per_step" in r:
        cpu[key] = min(cpu.get(key, float("inf")), r["cpu_ms_per_step"])
import os
print("training samples/s (forward + backward + SGD momentum), CPU, %s, OMP_WAIT_POLICY=%s, best of rounds"
      % (precision, os.environ.get("OMP_WAIT_POLICY", "")))
print("(cpu ms/step: process CPU time per step, all threads, steadier than wall time on a shared machine)")
print("%-10s %8s %6s %16s %16s %7s %18s %18s" % ("model", "threads", "batch", "shoal samples/s", "torch samples/s",
                                                "ratio", "shoal cpu ms/step", "torch cpu ms/step"))
lines = []
for m in models:
    ours = best.get(("engine_cpp", m))
    theirs = best.get(("engine_torch", m))
    ratio = round(ours / theirs, 3) if ours and theirs else None
    oc, tc = cpu.get(("engine_cpp", m)), cpu.get(("engine_torch", m))
    print("%-10s %8d %6d %16s %16s %7s %18s %18s" % (m, threads, batch, "%.1f" % ours if ours else "-",
                                                   "%.1f" % theirs if theirs else "-", ratio if ratio else "-",
                                                   "%.2f" % oc if oc else "-", "%.2f" % tc if tc else "-"))
    mib = lambda reuse: round(peak[(m, reuse)] / 2**20, 1) if (m, reuse) in peak else None
    with_reuse, without = mib(True), mib(False)
    lines.append({"bench": "engine", "precision": precision, "model": m, "threads": threads, "batch": batch, "samples_per_s": ours,
                  "torch_samples_per_s": theirs, "ratio": ratio, "cpu_ms_per_step": oc, "torch_cpu_ms_per_step": tc,
                  "peak_mib": with_reuse, "peak_mib_no_reuse": without,
                  "memory_ratio": round(with_reuse / without, 3) if with_reuse and without else None})
print()
print("peak engine memory (every tensor the backend allocated: weights, gradients, momentum, input, activations)")
print("%-10s %6s %16s %19s %7s" % ("model", "batch", "peak MiB (reuse)", "peak MiB (no reuse)", "ratio"))
for l in lines:
    print("%-10s %6d %16s %19s %7s" % (l["model"], batch, l["peak_mib"], l["peak_mib_no_reuse"], l["memory_ratio"]))
if torch_error:
    print("torch: " + torch_error)
# lenet's line last: the contract's one JSON object
lines.sort(key=lambda l: l["model"] == "lenet")
for l in lines:
    print(json.dumps(l, separators=(",", ":")))
PY
