#!/usr/bin/env bash
# `shoal gpu-check [OUT_DIR]` from a bundle built with `./shoal bundle --gpu-checks`: every
# GPU check in one bounded run (about 8 minutes at most), for a session lent a GPU machine.
#   1. nvidia-smi's line for the device (or that there is none);
#   2. each CUDA test in checks/tests/ (ONNX's backend cases on cuda:0 among them) with a time
#      limit, its log in OUT_DIR/<test>.log and
#      one line: passed | partial (some cases skipped) | skipped (with gtest's reason) |
#      failed | timeout | not run;
#   3. engine_bench on cuda:0, resnet50, batch 256, fp32 (TF32 off), tf32 and bf16, and PyTorch the same
#      (bench/engine/torch_engine.py --device cuda) when `import torch` works, with the ratio and
#      Shoal's peak device memory (its line's peak_bytes);
#   4. OUT_DIR/summary.json (one object), printed last.
# The bundle's `shoal` entry has already put the machine's CUDA libraries on LD_LIBRARY_PATH.
# Without a device every step says so and the summary is still written; exit 0 unless a
# test failed or timed out.
# Knobs: SHOAL_GPU_CHECK_SECONDS (whole run, default 470), SHOAL_GPU_CHECK_BENCH_SECONDS
# (timed seconds per bench side, default 10).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-$PWD/gpu-check-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
TOTAL="${SHOAL_GPU_CHECK_SECONDS:-470}"
BENCH_S="${SHOAL_GPU_CHECK_BENCH_SECONDS:-10}"
BENCH_LIMIT=$((BENCH_S + 50))  # per bench process: model setup + warm-up + the timed seconds
# What the tests leave to the six bench runs (their usual need; slow benches are cut by
# the run's own deadline, never the run).
BENCH_RESERVE=$((6 * (BENCH_S + 25)))
START=$SECONDS
left() { echo $((TOTAL - (SECONDS - START))); }

# JSON string of $1 (quotes, backslashes and control characters escaped or dropped).
js() {
  local s
  s="$(printf '%s' "$1" | tr -d '\000-\010\013-\037' | tr '\t\n' '  ')"
  s="${s//\\/\\\\}"
  printf '"%s"' "${s//\"/\\\"}"
}
# The number after "KEY": in a one-line JSON object, or null.
num() { local v; v="$(printf '%s' "$2" | sed -n "s/.*\"$1\": *\([0-9.eE+-]*\).*/\1/p")"; echo "${v:-null}"; }

echo "gpu-check: results in $OUT"
DEVICE=null
if command -v nvidia-smi > /dev/null; then
  smi="$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
  echo "nvidia-smi: $smi"
  [[ "$smi" == *MiB* ]] && DEVICE="$(js "$smi")"  # not its "failed to communicate" line
else
  echo "nvidia-smi: not found (no NVIDIA driver on this machine: no CUDA device)"
fi
echo "gpu-check: LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
# The first test that needs the CUDA libraries tells whether they load; say which are missing.
missing="$(ldd "$HERE/tests/cuda_device_test" 2> /dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')"
[[ -n "$missing" ]] && echo "gpu-check: CUDA libraries not found on LD_LIBRARY_PATH: $missing(tests needing them fail to load)"

# A GPU the driver shows but the CUDA runtime cannot use (typically a driver older than the
# runtime this build ships) would make every test skip "green": stop here and fail instead.
if [[ "$DEVICE" != null ]]; then
  probe="$(timeout 60 "$HERE/tests/cuda_device_test" --gtest_filter=CudaDevice.MemoryRoundTripWhenPresent 2>&1)"
  if [[ "$probe" == *"no CUDA device"* ]]; then
    why="$(printf '%s\n' "$probe" | grep -m1 -o 'no CUDA device.*')"
    echo "gpu-check: FAILED: nvidia-smi sees a GPU ($smi) but the CUDA runtime reports none: $why"
    SUMMARY="{\"gpu_check\":\"summary\",\"device\":$DEVICE,\"error\":$(js "nvidia-smi sees a GPU but the CUDA runtime reports none: $why"),\"tests\":{},\"wall_s\":$((SECONDS - START))}"
    printf '%s\n' "$SUMMARY" > "$OUT/summary.json"
    printf '%s\n' "$SUMMARY"
    exit 1
  fi
fi

# --- tests ---------------------------------------------------------------------------------
# onnx_backend_cases_test runs ONNX's cases packed in the bundle through `shoal onnx run --device cuda:0`.
export SHOAL_ONNX_CASES="$HERE/onnx-node" SHOAL_ONNX_DEVICE=cuda:0
TESTS_JSON=""
failed=0
for t in "$HERE"/tests/*; do
  name="$(basename "$t")"
  log="$OUT/$name.log"
  limit=$(($(left) - BENCH_RESERVE))
  ((limit > 150)) && limit=150
  if ((limit < 10)); then
    status="not run" reason="the run's time budget was spent"
    : > "$log"
  else
    tmp="$OUT/tmp/$name"
    mkdir -p "$tmp"
    # gpu_train_test finds shoal-launch at TEST_SRCDIR/TEST_WORKSPACE/tools/launcher/.
    # timeout kills the test's whole process group when the limit passes.
    env TEST_TMPDIR="$tmp" TEST_SRCDIR="$HERE/runfiles" TEST_WORKSPACE=shoal GTEST_COLOR=no \
      timeout -s KILL "$limit" "$t" > "$log" 2>&1 < /dev/null
    rc=$?
    npass="$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)"
    nskip="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)"
    nfail="$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)"
    reason=""
    if ((rc == 137 || rc == 124)); then
      status="timeout" reason="killed after ${limit}s"
    elif ((rc != 0)); then
      status="failed"
      reason="$(grep -m1 -E 'Failure|error while loading|what\(\)|^F[0-9]|Check failed' "$log" || tail -1 "$log")"
    elif [[ -n "$nskip" && "${npass:-0}" == 0 ]]; then
      status="skipped"
      reason="$(grep -m1 -A1 ': Skipped$' "$log" | tail -1)"
    elif [[ -n "$nskip" ]]; then
      status="partial"  # some cases ran and passed, others skipped (often: no device)
      reason="$(grep -m1 -A1 ': Skipped$' "$log" | tail -1)"
    else
      status="passed"
    fi
  fi
  [[ "$status" == failed || "$status" == timeout ]] && failed=1
  printf '%-34s %-8s %s\n' "$name" "$status" "${npass:+passed $npass }${nskip:+skipped $nskip }${nfail:+failed $nfail }${reason:+($reason)}"
  TESTS_JSON+="${TESTS_JSON:+,}$(js "$name"):{\"status\":$(js "$status"),\"passed\":${npass:-0},\"skipped\":${nskip:-0},\"failed\":${nfail:-0},\"reason\":$(js "$reason"),\"log\":$(js "$log")}"
  npass="" nskip="" nfail=""
done
rm -rf "$OUT/tmp"

# --- engine benchmark: Shoal against PyTorch, resnet50, batch 256 on cuda:0 -----------------
PY=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" > /dev/null && timeout 60 "$cand" -c "import torch" > /dev/null 2>&1; then PY="$cand"; break; fi
done
[[ -z "$PY" ]] && echo "bench: PyTorch: import torch fails here; its figures are null"
# One bench process: its last stdout line when that is a JSON object, else an error object
# carrying the last line of its output.
bench_line() {
  local log="$1" limit
  shift
  limit=$(left)
  ((limit > BENCH_LIMIT)) && limit=$BENCH_LIMIT
  if ((limit < 10)); then echo '{"error":"the run'"'"'s time budget was spent"}'; return; fi
  timeout -s KILL "$limit" "$@" > "$log" 2>&1 < /dev/null
  local rc=$? last
  last="$(grep '^{' "$log" | tail -1)"
  if [[ $rc == 0 && -n "$last" ]]; then echo "$last"; return; fi
  [[ -n "$last" ]] && { echo "$last"; return; }
  ((rc == 137)) && { echo "{\"error\":\"killed after ${limit}s\"}"; return; }
  echo "{\"error\":$(js "$(tail -1 "$log")")}"
}
BENCH_JSON=""
for prec in fp32 tf32 bf16; do
  shoal="$(bench_line "$OUT/engine_bench_$prec.log" "$HERE/bench/engine_bench" --device cuda:0 --model resnet50 \
    --batch 256 --precision "$prec" --warmup 5 --seconds "$BENCH_S")"
  torch='{"error":"import torch fails here"}'
  [[ -n "$PY" ]] && torch="$(bench_line "$OUT/torch_engine_$prec.log" "$PY" "$HERE/bench/torch_engine.py" --device cuda \
    --model resnet50 --batch 256 --precision "$prec" --warmup 5 --seconds "$BENCH_S")"
  a="$(num samples_per_s "$shoal")" b="$(num samples_per_s "$torch")"
  ratio=null
  [[ "$a" != null && "$b" != null ]] && ratio="$(awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "null" }')"
  peak="$(num peak_bytes "$shoal")"
  [[ "$peak" != null ]] && peak="$(awk -v p="$peak" 'BEGIN { printf "%.2f GiB", p / 2^30 }')"
  echo "bench resnet50 b256 $prec: shoal $a img/s, pytorch $b img/s, ratio $ratio, shoal's peak memory $peak"
  [[ "$a" == null ]] && echo "  shoal: $(printf '%s' "$shoal" | sed -n 's/.*"error": *"\(.*\)".*/\1/p')"
  [[ "$b" == null ]] && echo "  pytorch: $(printf '%s' "$torch" | sed -n 's/.*"error": *"\(.*\)".*/\1/p')"
  BENCH_JSON+="${BENCH_JSON:+,}\"$prec\":{\"shoal_samples_per_s\":$a,\"torch_samples_per_s\":$b,\"ratio\":$ratio,\"shoal\":$shoal,\"torch\":$torch}"
done

SUMMARY="{\"gpu_check\":\"summary\",\"device\":$DEVICE,\"tests\":{$TESTS_JSON},\"bench\":{\"model\":\"resnet50\",\"batch\":256,$BENCH_JSON},\"wall_s\":$((SECONDS - START))}"
printf '%s\n' "$SUMMARY" > "$OUT/summary.json"
printf '%s\n' "$SUMMARY"
exit $failed
