#!/usr/bin/env bash
# ./shoal bundle's archive is relocatable: unpacked elsewhere, every binary finds its
# libraries inside the bundle (glibc and CUDA excepted), also when LD_LIBRARY_PATH names a
# folder of other libraries of the same names (an HPC `module load`), and a job runs from it
# with a bare environment, from another directory, and with that LD_LIBRARY_PATH.
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

# A decoy of every bundled library: another library under its name, which breaks whatever
# loads it (its symbols are missing). The bundle's own must win over LD_LIBRARY_PATH.
DECOY="$TEST_TMPDIR/decoy"
mkdir -p "$DECOY"
ZLIB="$( (ldconfig -p 2> /dev/null || /sbin/ldconfig -p) | awk '/libz\.so\.1 / {p = $NF} END {print p}')"
[[ -f "$ZLIB" ]] || fail "no libz.so.1 here to make decoys of"
for l in "$B"/lib/*; do cp -L "$ZLIB" "$DECOY/$(basename "$l")"; done
[[ -n "$(ls "$DECOY")" ]] || fail "no decoy libraries"

for b in "$B"/bin/*; do
  readelf -d "$b" | grep -q '(RPATH).*\$ORIGIN/\.\./lib' || fail "$b: DT_RPATH is not \$ORIGIN/../lib (RUNPATH loses to LD_LIBRARY_PATH)"
  while read -r name path; do
    case "$name" in
      ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*) continue ;;
      libcu*|libnccl*) continue ;;  # the target machine's CUDA
    esac
    path="$(realpath "$path")"
    [[ "$path" == "$(realpath "$B/lib")/"* ]] || fail "$(basename "$b") loads $name from $path, not from the bundle"
  done < <(env -i LD_LIBRARY_PATH="$DECOY" ldd "$b" | awk '/=>/ {print $1, $3}')
done

source "$R/tests/bundle/mlp_job.sh"
mlp_job "$TEST_TMPDIR/job.toml" "$TEST_TMPDIR/out" 2
cd "$TEST_TMPDIR"
env -i PATH=/usr/bin:/bin HOME="$TEST_TMPDIR" LD_LIBRARY_PATH="$DECOY" timeout -s KILL 120 "$B/shoal" run job.toml \
  > run.out 2> run.err || fail "the bundled job failed: $(tail -5 run.err)"
tail -1 run.out | grep -q '"event":"done".*"steps":' || fail "no done line: $(tail -2 run.out)"

# `shoal onnx` from the bundle, bare environment: one of ONNX's own test models inspected.
M=/usr/share/libonnx-testdata/data/node/test_relu/model.onnx
[[ -f "$M" ]] || fail "no $M (Debian's libonnx-testdata)"
env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$DECOY" "$B/shoal" onnx inspect "$M" > inspect.out 2>&1 ||
  fail "shoal onnx inspect from the bundle failed: $(tail -3 inspect.out)"
grep -q 'Relu' inspect.out || fail "shoal onnx inspect printed no Relu node: $(head -3 inspect.out)"
# `shoal coordinator` from the bundle (an elastic diloco job's coordinator process) reaches
# shoal-launch's --serve_coordinator: a missing job file is refused, exit 2, naming it.
set +e
env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$DECOY" timeout -s KILL 30 "$B/shoal" coordinator missing.toml \
  > coord.out 2>&1
rc=$?
set -e
[[ $rc -eq 2 ]] && grep -q 'missing.toml: cannot open job file' coord.out ||
  fail "shoal coordinator from the bundle: exit $rc: $(tail -2 coord.out)"
echo "5 passed, 0 failed"
