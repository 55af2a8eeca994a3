#!/usr/bin/env bash
# Builds the fuzz targets and runs each for a bounded time from its seed corpus
# (tests/fuzz/corpus/<target>/). New inputs go to .fuzz/corpus/<target>/, so the
# repository's seeds stay small; a crash leaves its input in .fuzz/artifacts/ and fails.
# usage: tests/fuzz/run.sh [SECONDS_EACH (default 20)] [TARGET...]
#        FUZZ_ARGS="-jobs=2 -workers=2" tests/fuzz/run.sh 600 message   # a longer run
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SECONDS_EACH="${1:-20}"
[[ $# -gt 0 ]] && shift
"$ROOT/tests/fuzz/build.sh"
BIN="$ROOT/.fuzz/bin"
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for f in "$BIN"/*_fuzzer; do targets+=("$(basename "$f" _fuzzer)"); done
fi
# Readers get inputs up to a few records; the job file and messages stay small. The
# limits make a huge allocation (e.g. trusting a size field) a finding, not a slow run.
max_len() { case "$1" in cifar | image) echo 16384 ;; idx | checkpoint) echo 8192 ;; *) echo 4096 ;; esac; }
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
for t in "${targets[@]}"; do
  work="$ROOT/.fuzz/corpus/$t"
  art="$ROOT/.fuzz/artifacts/$t/"
  mkdir -p "$work" "$art"
  log="$ROOT/.fuzz/$t.log"
  rc=0
  # shellcheck disable=SC2086
  "$BIN/${t}_fuzzer" -max_total_time="$SECONDS_EACH" -max_len="$(max_len "$t")" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1 -artifact_prefix="$art" \
    ${FUZZ_ARGS:-} "$work" "$ROOT/tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  execs="$(grep -h 'stat::number_of_executed_units' "$log" | awk '{s += $2} END {print s + 0}')"
  if [[ $rc -ne 0 ]]; then
    failed+=("$t")
    echo "fuzz $t: FAILED after $execs executions (exit $rc); input in $art, log $log:" >&2
    grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$log" | head -20 >&2
  else
    echo "fuzz $t: $execs executions in ${SECONDS_EACH}s, no crash ($(ls "$work" | wc -l) corpus inputs)" >&2
  fi
done
[[ ${#failed[@]} -eq 0 ]] || { echo "fuzz: crashes in: ${failed[*]}" >&2; exit 1; }
