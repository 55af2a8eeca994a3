#!/usr/bin/env bash
# ./shoal bundle's archive is relocatable: unpacked elsewhere, every binary finds its
# libraries inside the bundle (glibc and CUDA excepted), and a job runs from it with a bare
# environment, from another directory.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
fail() { echo "FAIL: $*" >&2; echo "0 passed, 1 failed"; exit 1; }

ARCHIVE="$(bash "$R/tools/bundle.sh" "$R" "$TEST_TMPDIR/dist" | tail -1)"
[[ -f "$ARCHIVE" && "$ARCHIVE" == *.tar.gz ]] || fail "the last line is not the archive: $ARCHIVE"
NODE="$TEST_TMPDIR/node"
mkdir -p "$NODE"
tar -C "$NODE" -xzf "$ARCHIVE"
B="$(echo "$NODE"/shoal-*)"
[[ -x "$B/shoal" ]] || fail "no shoal entry in the bundle"

for b in "$B"/bin/*; do
  readelf -d "$b" | grep -q 'R.*PATH.*\$ORIGIN/\.\./lib' || fail "$b: RPATH is not \$ORIGIN/../lib"
  while read -r name path; do
    case "$name" in
      ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*) continue ;;
      libcu*|libnccl*) continue ;;  # the target machine's CUDA
    esac
    path="$(realpath "$path")"
    [[ "$path" == "$(realpath "$B/lib")/"* ]] || fail "$(basename "$b") loads $name from $path, not from the bundle"
  done < <(env -i ldd "$b" | awk '/=>/ {print $1, $3}')
done

source "$R/tests/bundle/mlp_job.sh"
mlp_job "$TEST_TMPDIR/job.toml" "$TEST_TMPDIR/out" 2
cd "$TEST_TMPDIR"
env -i PATH=/usr/bin:/bin HOME="$TEST_TMPDIR" timeout -s KILL 120 "$B/shoal" run job.toml > run.out 2> run.err ||
  fail "the bundled job failed: $(tail -5 run.err)"
tail -1 run.out | grep -q '"event":"done".*"steps":' || fail "no done line: $(tail -2 run.out)"
echo "3 passed, 0 failed"
