#!/usr/bin/env bash
# ./shoal bench allreduce: Shoal's ring vs PyTorch gloo vs Open MPI, same sizes/processes.
set -uo pipefail
BIN="${1:-bazel-bin}"
HERE="$(cd "$(dirname "$0")" && pwd)"
REPS="${REPS:-10}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$BIN/bench/allreduce/ring_bench" "$REPS" > "$TMP/ring.txt"
if /usr/bin/python3 -c "import torch.distributed" 2>/dev/null; then
  timeout 900 /usr/bin/python3 "$HERE/gloo_allreduce.py" "$REPS" > "$TMP/gloo.txt" 2>"$TMP/gloo.err" || echo "gloo baseline failed: $(tail -2 "$TMP/gloo.err")" >&2
fi
if command -v mpicxx >/dev/null && command -v mpirun >/dev/null; then
  if mpicxx -O2 -o "$TMP/mpi_allreduce" "$HERE/mpi_allreduce.cc" 2>"$TMP/mpi.err"; then
    for np in 2 4; do
      timeout 600 mpirun --allow-run-as-root --oversubscribe --mca btl self,vader,tcp -np "$np" "$TMP/mpi_allreduce" "$REPS" >> "$TMP/mpi.txt" 2>>"$TMP/mpi.err" || true
    done
  fi
fi
/usr/bin/python3 - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
def load(name):
    out = {}
    try:
        for line in open(f"{d}/{name}.txt"):
            p, n, g = line.split()
            out[(int(p), int(n))] = float(g)
    except FileNotFoundError:
        pass
    return out
ring, gloo, mpi = load("ring"), load("gloo"), load("mpi")
print(f"{'procs':>5} {'size':>8} {'shoal GB/s':>11} {'gloo GB/s':>10} {'ratio':>6} {'MPI GB/s':>9}")
last = None
for (p, n), g in sorted(ring.items()):
    gl, mp = gloo.get((p, n)), mpi.get((p, n))
    r = g / gl if gl else None
    print(f"{p:>5} {n >> 20:>6}Mi {g:>11.3f} {gl if gl else float('nan'):>10.3f} {r if r else float('nan'):>6.2f} {mp if mp else float('nan'):>9.3f}")
    last = {"bench": "allreduce", "size_bytes": n, "procs": p, "gbps": round(g, 4),
            "gloo_gbps": round(gl, 4) if gl else None, "ratio": round(r, 3) if r else None,
            "mpi_gbps": round(mp, 4) if mp else None}
print(json.dumps(last))
PY
