#!/usr/bin/env bash
# Packs Shoal into one relocatable archive: bin/ (shoal-server, shoal-worker, shoal-launch,
# shoal-task, shoal-keygen) with RPATH $ORIGIN/../lib, lib/ with every shared library they
# need except glibc's and the CUDA driver's and toolkit's (those come from the target
# machine), and a `shoal` entry that runs from the unpacked folder.
# usage: tools/bundle.sh BAZEL_BIN OUT_DIR   (prints the archive's path last)
set -euo pipefail
BIN="$1"
OUT="$2"
command -v patchelf > /dev/null || { echo "bundle: patchelf is missing (apt-get install patchelf)" >&2; exit 2; }
NAME="shoal-$(uname -m)"
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
ROOT="$STAGE/$NAME"
mkdir -p "$ROOT/bin" "$ROOT/lib"
BINARIES=(server/shoal-server worker/shoal-worker tools/launcher/shoal-launch tools/launcher/shoal-task
  common/transport/shoal-keygen)
for b in "${BINARIES[@]}"; do
  [[ -x "$BIN/$b" ]] || { echo "bundle: $BIN/$b is not built" >&2; exit 2; }
  cp -L "$BIN/$b" "$ROOT/bin/"
done

# Left to the target machine: glibc and the dynamic loader, and the CUDA driver and toolkit
# (a GPU machine has its own; a CPU machine reports "no CUDA device" without them).
skip() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcudnn*|libcublas*|libcublasLt*|libnccl.so*|libnvrtc*|libnvJitLink*) return 0 ;;
  esac
  return 1
}

for b in "$ROOT"/bin/*; do
  # ldd lists the whole closure; a library the loader cannot find here is an error now,
  # not on a cluster node.
  while read -r name _ path _; do
    [[ -z "${name:-}" ]] && continue
    skip "$name" && continue
    if [[ "$path" == "not" ]]; then
      case "$name" in libcu*|libnccl*) continue ;; esac  # CUDA, from the target machine
      echo "bundle: $b needs $name, which this machine cannot find" >&2
      exit 2
    fi
    [[ -f "$path" && ! -e "$ROOT/lib/$name" ]] && cp -L "$path" "$ROOT/lib/$name"
  done < <(ldd "$b" | awk '/=>/ {print $1, $2, $3, $4}')
done
for b in "$ROOT"/bin/*; do patchelf --set-rpath '$ORIGIN/../lib' "$b"; done
for l in "$ROOT"/lib/*; do patchelf --set-rpath '$ORIGIN' "$l" 2>/dev/null || true; done

cat > "$ROOT/shoal" <<'ENTRY'
#!/usr/bin/env bash
# Shoal from an unpacked bundle: run | server | worker | task | keygen.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# CUDA libraries of the machine's Python packages, when present (GPU machines without a
# system toolkit).
for d in /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/lib/python3/dist-packages/nvidia/*/lib \
         "${HOME:-/nonexistent}"/.local/lib/python3*/site-packages/nvidia/*/lib /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d "$d" ]] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  run) exec "$HERE/bin/shoal-launch" --bin_dir="$HERE/bin" "$@" ;;
  server) exec "$HERE/bin/shoal-server" "$@" ;;
  worker) exec "$HERE/bin/shoal-worker" "$@" ;;
  task) exec "$HERE/bin/shoal-task" "$@" ;;
  keygen) exec "$HERE/bin/shoal-keygen" "$@" ;;
  *) echo "usage: shoal run JOB.toml [--resume] | server | worker | task --config JOB.toml | keygen" >&2; exit 2 ;;
esac
ENTRY
chmod +x "$ROOT/shoal"
mkdir -p "$OUT"
ARCHIVE="$(cd "$OUT" && pwd)/$NAME.tar.gz"
tar -C "$STAGE" -czf "$ARCHIVE" "$NAME"
echo "bundle: $(du -h "$ARCHIVE" | cut -f1) ($(ls "$ROOT/lib" | wc -l) libraries)" >&2
echo "$ARCHIVE"
