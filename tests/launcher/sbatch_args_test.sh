#!/usr/bin/env bash
# docs/examples/slurm/train.sbatch's argument handling, with stubs for srun and the bundle's
# shoal on PATH / $SHOAL (Slurm itself is tests/cluster/slurm_test.sh's): what each task is
# started with on the first start and on a requeue (SLURM_RESTART_COUNT), for each answer of
# `shoal checkpoints`.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
SCRIPT="$R/docs/examples/slurm/train.sbatch"
T="$TEST_TMPDIR"
passed=0
fail() { echo "FAIL: $*" >&2; echo "$passed passed, 1 failed"; exit 1; }

mkdir -p "$T/bin" "$T/shoal"
# srun: records its arguments, one a line.
cat > "$T/bin/srun" << 'STUB'
#!/usr/bin/env bash
printf '%s\n' "$@" > "$ARGS_OUT"
STUB
# The bundle's entry: `checkpoints` answers what the test says.
cat > "$T/shoal/shoal" << 'STUB'
#!/usr/bin/env bash
[[ "$1" == checkpoints ]] && { echo "$STUB_STATE"; exit 0; }
echo "unexpected: $*" >&2
exit 3
STUB
chmod +x "$T/bin/srun" "$T/shoal/shoal"

# run RESTARTS STATE ARGS...: the task's arguments after `task --config job.toml`, space-joined.
run() {
  local restarts="$1" state="$2"
  shift 2
  ARGS_OUT="$T/args" STUB_STATE="$state" SHOAL="$T/shoal" SLURM_RESTART_COUNT="$restarts" PATH="$T/bin:$PATH" \
    bash "$SCRIPT" job.toml "$@" 2> "$T/err" || fail "train.sbatch failed: $(cat "$T/err")"
  local got
  got="$(tr '\n' ' ' < "$T/args")"
  [[ "$got" == "--kill-on-bad-exit=1 $T/shoal/shoal task --config job.toml "* ]] || fail "srun got: $got"
  got="${got#--kill-on-bad-exit=1 $T/shoal/shoal task --config job.toml }"
  echo "${got% }"
}
expect() {
  local want="$1" got="$2" what="$3"
  [[ "$got" == "$want" ]] || fail "$what: the tasks got '$got', expected '$want'"
  passed=$((passed + 1))
}

expect "" "$(run 0 unused)" "first start, no flags (no empty argument)"
expect "--fresh --threads 2" "$(run 0 unused --fresh --threads 2)" "first start with --fresh"
expect "--resume --threads 2" "$(run 1 "complete 40 40" --fresh --threads 2)" "requeue after --fresh, a checkpoint"
expect "--resume" "$(run 2 "complete 40 40" --resume)" "requeue after --resume"
expect "--fresh" "$(run 1 none)" "requeue before the first checkpoint"
expect "--fresh --threads 2" "$(run 1 none --fresh --threads 2)" "requeue before the first checkpoint, --fresh given"
expect "--resume" "$(run 1 "unknown: worker 1's folder /x is not on this machine" --fresh)" "requeue, folders elsewhere"
expect "" "$(run 1 off)" "requeue of a job without checkpoint_dir"
grep -q "requeued (1); checkpoints: off" "$T/err" || fail "no line saying what the requeue does: $(cat "$T/err")"
# bash before 4.4 takes an empty "${A[@]}" for an unbound variable under set -u (this bash
# is newer, so the script is read for it): every array expands as ${A[@]+"${A[@]}"}.
if grep -nE '(^|[^+])"\$\{[A-Za-z_]+\[@\]\}"' "$SCRIPT" | grep -vE '^[0-9]+:[[:space:]]*#' | grep -vE '\$\{[A-Za-z_]+\[@\]\+"\$\{'; then
  fail "an array expanded without \${A[@]+...} (set -u on bash < 4.4 aborts when it is empty)"
fi
passed=$((passed + 1))
echo "$passed passed, 0 failed"
