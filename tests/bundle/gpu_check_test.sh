#!/usr/bin/env bash
# The GPU kit: `tools/bundle.sh --gpu-checks` packs every check of tools/gpu_checks.txt,
# relocatable like the rest of the bundle; unpacked elsewhere with a bare environment,
# `shoal gpu-check OUT` runs them all and writes OUT/summary.json. On a machine without a
# device (CI, this one) every CUDA case skips saying so and the benches report the missing
# device; on a GPU machine the same assertions hold except the skips.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
fail() { echo "FAIL: $*" >&2; echo "0 passed, 1 failed"; exit 1; }

ARCHIVE="$(bash "$R/tools/bundle.sh" "$R" "$TEST_TMPDIR/dist" --gpu-checks | tail -1)"
[[ -f "$ARCHIVE" ]] || fail "no archive: $ARCHIVE"
size=$(stat -c %s "$ARCHIVE")
((size < 48 * 1024 * 1024)) || fail "the archive is $size bytes: too big to carry to a GPU machine (64 MiB in all)"
NODE="$TEST_TMPDIR/node"
mkdir -p "$NODE"
tar -C "$NODE" -xzf "$ARCHIVE"
B="$(echo "$NODE"/shoal-*)"

# Every listed check is there and loads its libraries from the bundle (CUDA's excepted).
n=0
while read -r label; do
  [[ "$label" == //* ]] || continue
  f="$B/checks/tests/${label##*:}"
  [[ "$label" == //bench/* ]] && f="$B/checks/bench/${label##*:}"
  [[ -x "$f" ]] || fail "$label is not in the bundle's checks/"
  while read -r name path; do
    case "$name" in ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libcu*|libnccl*) continue ;; esac
    [[ "$(realpath "$path")" == "$(realpath "$B/lib")/"* ]] || fail "$(basename "$f") loads $name from $path, not from the bundle"
  done < <(env -i ldd "$f" | awk '/=>/ {print $1, $3}')
  n=$((n + 1))
done < "$R/tools/gpu_checks.txt"
((n >= 10)) || fail "only $n checks listed in tools/gpu_checks.txt"

# gpu_train_test's launcher, through the runfiles links, runs a CPU job from the bundle.
RF="$B/checks/runfiles/shoal"
source "$R/tests/bundle/mlp_job.sh"
mlp_job "$TEST_TMPDIR/job.toml" "$TEST_TMPDIR/jobout" 1
env -i PATH=/usr/bin:/bin HOME="$TEST_TMPDIR" timeout -s KILL 120 "$RF/tools/launcher/shoal-launch" --bin_dir="$RF" \
  "$TEST_TMPDIR/job.toml" > "$TEST_TMPDIR/job.out" 2> "$TEST_TMPDIR/job.err" || fail "the job through runfiles/ failed: $(tail -3 "$TEST_TMPDIR/job.err")"
tail -1 "$TEST_TMPDIR/job.out" | grep -q '"event":"done"' || fail "no done line from the runfiles job"

OUT="$TEST_TMPDIR/gpucheck"
cd "$TEST_TMPDIR"
set +e
env -i PATH=/usr/bin:/bin HOME="$TEST_TMPDIR" SHOAL_GPU_CHECK_BENCH_SECONDS=1 timeout -s KILL 300 "$B/shoal" gpu-check "$OUT" \
  > check.out 2> check.err
rc=$?
set -e
S="$OUT/summary.json"
[[ -f "$S" ]] || fail "no summary.json (rc $rc): $(tail -3 check.err)"
[[ "$(tail -1 check.out)" == "$(cat "$S")" ]] || fail "the last line printed is not the summary"
python3 - "$S" "$rc" <<'PY' || fail "summary.json: see above"
import json, subprocess, sys
s = json.load(open(sys.argv[1]))
rc = int(sys.argv[2])
assert len(s["tests"]) >= 10, s["tests"].keys()
has_device = s["device"] is not None
for name, t in s["tests"].items():
    assert t["status"] in ("passed", "partial", "skipped"), (name, t)
    if not has_device and t["skipped"]:
        assert "no CUDA device" in t["reason"] or "CPU engine" in t["reason"], (name, t["reason"])
if not has_device:
    for name in ("cuda_backend_test", "cuda_vs_reference_test", "gpu_train_test"):
        assert s["tests"][name]["status"] == "skipped", (name, s["tests"][name])
    for prec in ("fp32", "tf32", "bf16"):
        b = s["bench"][prec]
        assert b["shoal_samples_per_s"] is None and b["ratio"] is None, b
        assert "error" in b["shoal"] and "error" in b["torch"], b
    # bf16 too: the CUDA backend builds its mixed mode, so only the missing device stops it.
    for prec in ("fp32", "tf32", "bf16"):
        assert "no CUDA device" in s["bench"][prec]["shoal"]["error"], s["bench"]
assert rc == 0, rc
PY
grep -q "^nvidia-smi: " check.out || fail "no nvidia-smi line"

# A driver that shows a GPU the CUDA runtime cannot use (here: a stub nvidia-smi on a machine
# without one) fails at once, naming driver and runtime, instead of skipping every test green.
if ! command -v nvidia-smi > /dev/null; then
  mkdir -p "$TEST_TMPDIR/stub"
  printf '#!/bin/sh\necho "NVIDIA H100 80GB HBM3, 535.104.05, 81559 MiB"\n' > "$TEST_TMPDIR/stub/nvidia-smi"
  chmod +x "$TEST_TMPDIR/stub/nvidia-smi"
  set +e
  env -i PATH="$TEST_TMPDIR/stub:/usr/bin:/bin" HOME="$TEST_TMPDIR" timeout -s KILL 120 "$B/shoal" gpu-check \
    "$TEST_TMPDIR/stubcheck" > stub.out 2> stub.err
  rc=$?
  set -e
  ((rc == 1)) || fail "a GPU the runtime cannot use gave exit $rc, not 1: $(tail -3 stub.out)"
  grep -q "FAILED: nvidia-smi sees a GPU .* but the CUDA runtime reports none: no CUDA device.*runtime [0-9]" stub.out ||
    fail "no failure line naming driver and runtime: $(tail -3 stub.out)"
  grep -q '"error":"nvidia-smi sees a GPU' "$TEST_TMPDIR/stubcheck/summary.json" || fail "the summary lacks the error"
fi
# nothing of the bundle still running
pgrep -f "$NODE/" > /dev/null && fail "processes of the bundle were left behind: $(pgrep -af "$NODE/")"
echo "5 passed, 0 failed"
