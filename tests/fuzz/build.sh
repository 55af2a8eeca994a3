#!/usr/bin/env bash
# Builds the libFuzzer targets with Debian's clang, ASan and UBSan, straight from the
# production sources (no Bazel: Bazel's toolchain is GCC, and libFuzzer's coverage
# instrumentation is clang-only). Objects are rebuilt only when a source or header is
# newer, so a second run costs only the link.
# usage: tests/fuzz/build.sh [OUT_DIR]   (default .fuzz/bin; prints nothing on success)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$ROOT/.fuzz/bin}"
OBJ="$ROOT/.fuzz/obj"
GEN="$ROOT/.fuzz/gen"
CXX="${FUZZ_CXX:-clang++-14}"
command -v "$CXX" >/dev/null || { echo "fuzz: $CXX not found (apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 1; }
mkdir -p "$OUT" "$OBJ" "$GEN/common/messages"

# The production code the targets reach (transport decoding, the server with its
# coordinator and update rule, the job-file loader, the data readers, the checkpointer):
# the .cc sources of their Bazel deps (tests/fuzz/BUILD), so this build never keeps a list
# of its own. Generated code (the Cap'n Proto schema) is compiled below.
query='kind("source file", deps(tests("//tests/fuzz:all"))) except (//tests/...:* + //third_party/...:*)'
mapfile -t SRCS < <(cd "$ROOT" && bazel query --noshow_progress --ui_event_filters=-info "$query" 2>/dev/null |
  grep '^//.*\.cc$' | sed -e 's|^//||' -e 's|:|/|' -e 's|^/||')
[[ ${#SRCS[@]} -gt 0 ]] || { echo "fuzz: bazel query for the targets' sources failed: bazel query '$query'" >&2; exit 1; }

SAN=(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
CXXFLAGS=(-std=c++17 -O1 -g -DTOML_HEADER_ONLY=1 -I"$ROOT" -I"$GEN" "${SAN[@]}"
  -Wno-deprecated-declarations -Wno-unused-command-line-argument)
LIBS=(-lzmq -lcapnp -lkj -lrocksdb -lglog -lgflags -lz -lsodium -lturbojpeg -ljpeg -lpng16 -pthread)

schema="$ROOT/common/messages/schema.capnp"
if [[ ! -f "$GEN/common/messages/schema.capnp.cc" || "$schema" -nt "$GEN/common/messages/schema.capnp.cc" ]]; then
  capnp compile -I/usr/include -o/usr/bin/capnpc-c++:"$GEN/common/messages" \
    --src-prefix="$ROOT/common/messages" "$schema"
  mv "$GEN/common/messages/schema.capnp.c++" "$GEN/common/messages/schema.capnp.cc"
fi

# An object is stale when its source or any header of the tree is newer (coarse, but the
# tree's headers change rarely and a stale sanitizer build would hide findings).
newest_header="$(find "$ROOT/common" "$ROOT/server" "$ROOT/worker/data" "$ROOT/algorithms/optimizers" \
  "$ROOT/algorithms/compressors" "$GEN" -name '*.h' -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -1 | cut -d' ' -f2-)"
compile() {  # src obj
  if [[ -f "$2" && "$2" -nt "$1" && ( -z "$newest_header" || "$2" -nt "$newest_header" ) ]]; then return 0; fi
  "$CXX" "${CXXFLAGS[@]}" -fsanitize=fuzzer-no-link -c "$1" -o "$2.tmp" && mv "$2.tmp" "$2"
}
objs=()
jobs=()
for s in "${SRCS[@]}" "$GEN/common/messages/schema.capnp.cc"; do
  [[ "$s" == /* ]] || s="$ROOT/$s"
  o="$OBJ/$(echo "${s#$ROOT/}" | tr '/' '_').o"
  objs+=("$o")
  compile "$s" "$o" &
  jobs+=($!)
  # Two at a time: CI machines (and the shared development one) have two cores.
  if (( ${#jobs[@]} >= ${FUZZ_JOBS:-2} )); then wait "${jobs[0]}"; jobs=("${jobs[@]:1}"); fi
done
for j in "${jobs[@]}"; do wait "$j"; done

for src in "$ROOT"/tests/fuzz/*_fuzzer.cc; do
  t="$(basename "$src" _fuzzer.cc)"
  o="$OBJ/fuzz_${t}.o"
  compile "$src" "$o"
  "$CXX" "${SAN[@]}" -fsanitize=fuzzer "$o" "${objs[@]}" "${LIBS[@]}" -o "$OUT/${t}_fuzzer"
done
