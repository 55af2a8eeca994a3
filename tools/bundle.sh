#!/usr/bin/env bash
# Packs Shoal into one relocatable archive: bin/ (shoal-server, shoal-worker, shoal-launch,
# shoal-task, shoal-keygen, shoal-onnx) with RPATH $ORIGIN/../lib, lib/ with every shared library they
# need except glibc's and the CUDA driver's and toolkit's (those come from the target
# machine), and a `shoal` entry that runs from the unpacked folder.
# With --gpu-checks it also holds checks/: the CUDA tests and the engine benchmark listed in
# tools/gpu_checks.txt (their libraries packed into the same lib/ by the same code) and ONNX's
# backend test cases, laid out for `shoal gpu-check` (tools/gpu_check.sh), which runs them all
# on a GPU machine.
# usage: tools/bundle.sh BAZEL_BIN OUT_DIR [--gpu-checks]   (prints the archive's path last)
set -euo pipefail
BIN="$1"
OUT="$2"
GPU_CHECKS="${3:-}"
[[ -z "$GPU_CHECKS" || "$GPU_CHECKS" == --gpu-checks ]] || { echo "bundle: unknown argument '$GPU_CHECKS'" >&2; exit 2; }
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command -v patchelf > /dev/null || { echo "bundle: patchelf is missing (apt-get install patchelf)" >&2; exit 2; }
NAME="shoal-$(uname -m)"
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
ROOT="$STAGE/$NAME"
mkdir -p "$ROOT/bin" "$ROOT/lib"
# The tests that run this script from their runfiles (tests/bundle, tests/cluster) list each
# of these in their data: a binary added here goes there too.
BINARIES=(server/shoal-server worker/shoal-worker tools/launcher/shoal-launch tools/launcher/shoal-task
  common/transport/shoal-keygen tools/onnx/shoal-onnx)

# Left to the target machine: glibc and the dynamic loader, and the CUDA driver and toolkit
# (a GPU machine has its own; a CPU machine reports "no CUDA device" without them).
skip() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcudnn*|libcublas*|libcublasLt*|libnccl.so*|libnvrtc*|libnvJitLink*) return 0 ;;
  esac
  return 1
}

# pack DEST RPATH BUILT...: copies each built binary (a path under BAZEL_BIN) into DEST, its
# shared-library closure into $ROOT/lib (once each), and sets the copy's RPATH to RPATH so
# that it finds them there. The one packer of the bundle.
# DT_RPATH (--force-rpath), not patchelf's default DT_RUNPATH: the loader searches RUNPATH
# after LD_LIBRARY_PATH, so an HPC `module load` that puts an older libstdc++ or libzmq on
# LD_LIBRARY_PATH would win over the bundle's own and break its binaries; RPATH comes first.
pack() {
  local dest="$1" rpath="$2" b name path
  shift 2
  mkdir -p "$dest"
  for b in "$@"; do
    [[ -x "$BIN/$b" ]] || { echo "bundle: $BIN/$b is not built" >&2; exit 2; }
    # ldd on the built file (tests find Bazel's _solib through their own RPATH) lists the
    # whole closure; a library the loader cannot find here is an error now, not on a node.
    while read -r name _ path _; do
      [[ -z "${name:-}" ]] && continue
      skip "$name" && continue
      if [[ "$path" == "not" ]]; then
        case "$name" in libcu*|libnccl*) continue ;; esac  # CUDA, from the target machine
        echo "bundle: $b needs $name, which this machine cannot find" >&2
        exit 2
      fi
      [[ -f "$path" && ! -e "$ROOT/lib/$name" ]] && cp -L "$path" "$ROOT/lib/$name"
    done < <(ldd "$BIN/$b" | awk '/=>/ {print $1, $2, $3, $4}')
    cp -L "$BIN/$b" "$dest/"
    patchelf --force-rpath --set-rpath "$rpath" "$dest/$(basename "$b")"
  done
}
pack "$ROOT/bin" '$ORIGIN/../lib' "${BINARIES[@]}"

if [[ -n "$GPU_CHECKS" ]]; then
  # checks/tests/ and checks/bench/ hold the binaries; checks/runfiles/shoal/ mirrors
  # bazel-bin's paths of the job binaries (links into bin/) so that gpu_train_test, which
  # finds shoal-launch through TEST_SRCDIR/TEST_WORKSPACE, runs unchanged.
  tests=() benches=()
  while read -r label; do
    [[ -z "$label" || "$label" == \#* ]] && continue
    rel="${label#//}"
    rel="${rel/://}"
    case "$rel" in
      bench/*) benches+=("$rel") ;;
      *) tests+=("$rel") ;;
    esac
  done < "$SRC/tools/gpu_checks.txt"
  pack "$ROOT/checks/tests" '$ORIGIN/../../lib' "${tests[@]}"
  pack "$ROOT/checks/bench" '$ORIGIN/../../lib' "${benches[@]}"
  cp "$SRC/bench/engine/torch_engine.py" "$ROOT/checks/bench/"
  cp "$SRC/tools/gpu_check.sh" "$ROOT/checks/gpu_check.sh"
  RUNFILES="$ROOT/checks/runfiles/shoal"
  for b in server/shoal-server worker/shoal-worker tools/launcher/shoal-launch tools/launcher/shoal-task \
    tools/onnx/shoal-onnx; do
    mkdir -p "$RUNFILES/$(dirname "$b")"
    ln -s "$(realpath --relative-to="$RUNFILES/$(dirname "$b")" "$ROOT/bin/$(basename "$b")")" "$RUNFILES/$b"
  done
  # ONNX's backend test cases (Debian's libonnx-testdata), which onnx_backend_cases_test runs
  # on cuda:0 there: GPU machines rarely have the package.
  CASES=/usr/share/libonnx-testdata/data/node
  [[ -d "$CASES" ]] || { echo "bundle: $CASES is missing (apt-get install libonnx-testdata)" >&2; exit 2; }
  cp -r "$CASES" "$ROOT/checks/onnx-node"
fi
for l in "$ROOT"/lib/*; do patchelf --force-rpath --set-rpath '$ORIGIN' "$l" 2>/dev/null || true; done

cat > "$ROOT/shoal" <<'ENTRY'
#!/usr/bin/env bash
# Shoal from an unpacked bundle: run | checkpoints | server | worker | task | keygen | gpu-check.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# CUDA libraries of the machine's Python packages, when present (GPU machines without a
# system toolkit: PyTorch's wheels bring cuDNN, cuBLAS, NCCL and the runtime under
# site-packages/nvidia/*/lib; python3 names its site-packages, a venv's included).
sites="$(python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null || true)"
while read -r d; do
  if [[ -d "$d" ]]; then LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"; fi
done < <(for s in $sites /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages; do
           for d in "$s"/nvidia/*/lib; do echo "$d"; done
         done | awk '!seen[$0]++'; echo /usr/local/cuda/lib64; echo /usr/local/cuda/lib)
# The bundle's binaries find their own libraries first through DT_RPATH (pack), whatever a
# `module load` put here. lib/ itself is not put on LD_LIBRARY_PATH: gpu-check's python3 and
# PyTorch inherit it and must keep the machine's libstdc++ and libz.
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  run) exec "$HERE/bin/shoal-launch" --bin_dir="$HERE/bin" "$@" ;;
  checkpoints) exec "$HERE/bin/shoal-launch" --checkpoint_state "$@" ;;
  coordinator) exec "$HERE/bin/shoal-launch" --serve_coordinator "$@" ;;
  server) exec "$HERE/bin/shoal-server" "$@" ;;
  worker) exec "$HERE/bin/shoal-worker" "$@" ;;
  task) exec "$HERE/bin/shoal-task" "$@" ;;
  keygen) exec "$HERE/bin/shoal-keygen" "$@" ;;
  onnx) exec "$HERE/bin/shoal-onnx" "$@" ;;
  gpu-check)
    [[ -x "$HERE/checks/gpu_check.sh" ]] || { echo "shoal: this bundle has no checks/ (build it with ./shoal bundle --gpu-checks)" >&2; exit 2; }
    exec "$HERE/checks/gpu_check.sh" "$@" ;;
  *) echo "usage: shoal run JOB.toml [--resume] | checkpoints JOB.toml | coordinator JOB.toml | server | worker | task --config JOB.toml | keygen | onnx run|inspect MODEL.onnx | gpu-check [OUT_DIR]" >&2; exit 2 ;;
esac
ENTRY
chmod +x "$ROOT/shoal"
mkdir -p "$OUT"
ARCHIVE="$(cd "$OUT" && pwd)/$NAME.tar.gz"
tar -C "$STAGE" -czf "$ARCHIVE" "$NAME"
echo "bundle: $(du -h "$ARCHIVE" | cut -f1) ($(ls "$ROOT/lib" | wc -l) libraries)" >&2
echo "$ARCHIVE"
