#!/usr/bin/env bash
# Shoal under a real Slurm on this machine: munged, slurmctld and slurmd started here with a
# private configuration (no systemd), the bundle unpacked, and whole jobs started by one
# srun step: the shipped docs/examples/slurm/train.sbatch through `sbatch --wait` (a ps_sync
# job: tasks 0-1 shards, 2-3 workers, ending by itself) and an allreduce job by srun.
# Everything started here is stopped on every exit path.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
T="$TEST_TMPDIR"
source "$R/tests/cluster/harness.sh"
for b in munged slurmctld slurmd sbatch srun; do
  command -v "$b" > /dev/null || { echo "FAIL: $b is missing (./shoal test installs slurm-wlm and munge)"; echo "0 passed, 1 failed"; exit 1; }
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

S="$(mktemp -d /tmp/shoal-slurm.XXXXXX)"  # short: munge's socket path has a 108-byte limit
mkdir -p "$S/state" "$S/spool"
HOST="$(hostname -s)"
cleanup() {
  for p in slurmd slurmctld munged; do
    [[ -f "$S/$p.pid" ]] && kill "$(cat "$S/$p.pid")" 2> /dev/null || true
  done
  sleep 0.5
  for p in slurmd slurmctld munged; do
    [[ -f "$S/$p.pid" ]] && kill -9 "$(cat "$S/$p.pid")" 2> /dev/null || true
  done
  rm -rf "$S"
}
trap cleanup EXIT
[[ -n "${KEEP_SLURM_LOGS:-}" ]] && trap 'cp -r "$S" "$KEEP_SLURM_LOGS"; cleanup' EXIT
head -c 1024 /dev/urandom > "$S/munge.key"
chmod 600 "$S/munge.key"
munged --force --key-file="$S/munge.key" --socket="$S/munge.sock" --pid-file="$S/munged.pid" \
  --log-file="$S/munged.log" --seed-file="$S/munge.seed"
cat > "$S/slurm.conf" << CONF
ClusterName=shoaltest
SlurmctldHost=$HOST
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$S/munge.sock
CryptoType=crypto/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
MpiDefault=none
ReturnToService=2
NodeName=$HOST CPUs=$(nproc) State=UNKNOWN
PartitionName=shoal Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF="$S/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for i in $(seq 1 100); do
  sinfo -h -o %t 2> /dev/null | grep -q idle && break
  sleep 0.1
done
sinfo -h -o %t | grep -q idle || { bad "Slurm did not come up: $(tail -3 "$S/slurmctld.log")"; echo "$passed passed, $failed failed"; exit 1; }

unpack_bundle "$T/node"
export SHOAL="$(echo "$T/node"/shoal-*)"

job() {  # name algorithm cluster_lines
  cat > "$T/$1.toml" << JOB
[job]
name = "$1"
output_dir = "$T/$1"
[cluster]
$3
workers = 2
[model]
name = "mlp"
[data]
format = "idx"
train = "/usr/share/datasets/fashion-mnist/train"
test = "/usr/share/datasets/fashion-mnist/t10k"
batch_size = 32
max_train_samples = 6000
max_test_samples = 2000
[algorithm]
name = "$2"
[optimizer]
name = "momentum"
lr = 0.05
[train]
epochs = 2
target_accuracy = 0.75
threads = 1
JOB
}

job ps ps_sync "servers = [\"127.0.0.1:$(free_port)\", \"127.0.0.1:$(free_port)\"]"
cd "$T"
if timeout -s KILL 200 sbatch --wait --ntasks=4 --overcommit -o "$T/ps-%j.out" "$R/docs/examples/slurm/train.sbatch" \
  "$T/ps.toml" > "$T/sbatch.log" 2>&1; then
  out="$(cat "$T"/ps-*.out)"
  if grep -q "worker 0/2" <<< "$out" && grep -q "worker 1/2" <<< "$out" &&
    [[ $(grep -c "every worker has finished" <<< "$out") -eq 2 ]]; then
    ok "sbatch train.sbatch: ps_sync, 2 shards + 2 workers from one srun step, ended by itself"
  else
    bad "sbatch: $(tail -5 <<< "$out")"
  fi
else
  bad "sbatch failed: $(cat "$T/sbatch.log") $(tail -5 "$T"/ps-*.out 2> /dev/null)"
fi

job ar allreduce "coordinator = \"127.0.0.1:$(free_port)\""
if timeout -s KILL 200 srun --ntasks=2 --overcommit "$SHOAL/shoal" task --config "$T/ar.toml" > "$T/ar.out" 2>&1; then
  hashes=$(grep '"event":"end"' "$T/ar/metrics.jsonl" | sed -E 's/.*"weights_hash":"([0-9a-f]+)".*/\1/' | sort -u | wc -l)
  [[ $hashes == 1 ]] && ok "srun: allreduce over 2 tasks met at the coordinator, identical final weights" ||
    bad "srun allreduce: $hashes distinct final weights"
else
  bad "srun allreduce failed: $(tail -5 "$T/ar.out")"
fi

finish
