#!/usr/bin/env bash
# Shoal across real network hosts: four network namespaces on a bridge, each host with its
# own address, its own tbf-shaped link, its own unpacked bundle and its own output
# directory; nothing shared but the network (the data set is read from the same path on
# every host). Everything made here is torn down on every exit path.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
T="$TEST_TMPDIR"
source "$R/tests/cluster/harness.sh"

if [[ $(id -u) -ne 0 ]] || ! ip netns add "shoalprobe$$" 2> /dev/null; then
  echo "network namespaces need root here; this machine cannot make test hosts" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
ip netns del "shoalprobe$$"

ID=$(($$ % 50000))
NET="10.213.$((ID % 250 + 1))"
BR="shb$ID"
HOSTS=4
ns() { echo "sh${ID}h$1"; }
cleanup() {
  for k in $(seq 0 $((HOSTS - 1))); do
    ip netns pids "$(ns "$k")" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
    ip netns del "$(ns "$k")" 2> /dev/null || true
    ip link del "shv${ID}x$k" 2> /dev/null || true
  done
  ip link del "$BR" 2> /dev/null || true
}
trap cleanup EXIT

ip link add "$BR" type bridge
ip link set "$BR" up
for k in $(seq 0 $((HOSTS - 1))); do
  n="$(ns "$k")"
  ip netns add "$n"
  ip link add "shv${ID}x$k" type veth peer name eth0 netns "$n"
  ip link set "shv${ID}x$k" master "$BR" up
  ip -n "$n" addr add "$NET.$((k + 1))/24" dev eth0
  ip -n "$n" link set eth0 up
  ip -n "$n" link set lo up
  # Each host's uplink: 400 Mbit/s (tbf; this kernel has no netem).
  ip netns exec "$n" tc qdisc add dev eth0 root tbf rate 400mbit burst 512kb latency 100ms
done

unpack_bundle $(for k in $(seq 0 $((HOSTS - 1))); do echo "$T/host$k"; done)
shoal_on() { local k=$1; shift; ip netns exec "$(ns "$k")" env -i PATH=/usr/bin:/bin HOME="$T/host$k" \
  timeout -s KILL 240 "$(echo "$T/host$k"/shoal-*)/shoal" "$@"; }
KEYS="$(shoal_on 0 keygen)"

# A job file every host reads; `servers`, `extra` and `security` vary by case.
write_job() {  # name algorithm servers_line security extra [model]
  cat > "$T/$1.toml" << JOB
[job]
name = "$1"
seed = 42
[cluster]
$3
workers = [{host = "$NET.1"}, {host = "$NET.2"}, {host = "$NET.3"}, {host = "$NET.4"}]
heartbeat_ms = 200
heartbeat_timeout_ms = 3000
[model]
name = "${6:-mlp}"
[data]
format = "idx"
train = "/usr/share/datasets/fashion-mnist/train"
test = "/usr/share/datasets/fashion-mnist/t10k"
batch_size = 32
max_train_samples = 8000
max_test_samples = 2000
[algorithm]
name = "$2"
$5
[optimizer]
name = "momentum"
lr = 0.05
momentum = 0.9
[train]
epochs = 3
target_accuracy = 0.78
threads = 1
log_every_steps = 50
$4
JOB
}

# Starts servers (if any) and one worker per host, waits for all, bounded.
run_job() {  # name num_servers
  local name=$1 servers=$2 pids=() k
  for k in $(seq 0 $((servers - 1))); do
    shoal_on "$k" server --config "$T/$name.toml" --shard "$k" > "$T/$name-server$k.log" 2>&1 &
    pids+=($!)
  done
  for k in $(seq 0 $((HOSTS - 1))); do
    shoal_on "$k" worker --config "$T/$name.toml" --rank "$k" --output_dir "$T/host$k/$name" \
      > "$T/$name-worker$k.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

end_field() {  # name host field
  grep '"event":"end"' "$T/host$2/$1/metrics.jsonl" | sed -E "s/.*\"$3\":\"?([^,\"}]*).*/\1/"
}

check_sync_job() {  # name
  local name=$1 hashes acc
  hashes=$(for k in $(seq 0 $((HOSTS - 1))); do end_field "$name" "$k" weights_hash; done | sort -u | wc -l)
  acc=$(end_field "$name" 0 test_accuracy)
  if [[ "$hashes" == 1 ]] && awk "BEGIN {exit !($acc >= 0.78)}"; then
    ok "$name across $HOSTS hosts: accuracy $acc, final weights identical on every host"
  else
    bad "$name: $hashes distinct final weights, accuracy $acc"
  fi
}

# lenet too: its fully connected layer fills whole ring segments, which a keyed link once
# dropped (CURVE's envelope pushed a full segment over the receiver's size limit).
for job in allreduce:mlp bmuf:mlp allreduce-lenet:lenet; do
  name=${job%%:*} model=${job##*:} algo=${job%%[-:]*} extra=""
  [[ $algo == bmuf ]] && extra="block_steps = 4"
  write_job "$name" "$algo" "" "$KEYS" "$extra" "$model"
  if run_job "$name" 0; then check_sync_job "$name"; else bad "$name failed: $(tail -3 "$T/$name-worker0.log")"; fi
done

write_job adpsgd adpsgd "" "$KEYS" ""
if run_job adpsgd 0; then
  acc=$(end_field adpsgd 0 test_accuracy)
  # Gossip workers hold different models, so rank 0's end figure need not sit at or above
  # the job's target_accuracy (0.78) the way a synchronous job's does: 0.779 was seen twice.
  awk "BEGIN {exit !($acc >= 0.75)}" && ok "adpsgd across $HOSTS hosts: accuracy $acc" || bad "adpsgd: accuracy $acc"
else
  bad "adpsgd failed: $(tail -3 "$T/adpsgd-worker0.log")"
fi

write_job ps_sync ps_sync "servers = [\"$NET.1:7701\", \"$NET.2:7701\"]" "$KEYS" ""
if run_job ps_sync 2; then
  check_sync_job ps_sync
  grep -q "every worker has finished" "$T/ps_sync-server0.log" && grep -q "every worker has finished" "$T/ps_sync-server1.log" &&
    ok "ps_sync: both servers left by themselves" || bad "ps_sync: the servers did not leave by themselves"
else
  bad "ps_sync failed: $(tail -3 "$T/ps_sync-worker0.log")"
fi

# A host whose link goes down mid-training: its silence is named to the others within the
# heartbeat timeout (3 s here), and every process ends; nothing waits out the ring's timeout.
write_job linkdown allreduce "" "$KEYS" "collective_timeout_ms = 600000"
sed -i 's/^epochs = 3/epochs = 50/; s/^target_accuracy = 0.78/target_accuracy = 0.99/' "$T/linkdown.toml"
start=$(date +%s)
run_job linkdown 0 > /dev/null 2>&1 &
RUN=$!
for i in $(seq 1 600); do  # up to 60 s for training to start on host 0
  grep -q '"event":"train"' "$T/host0/linkdown/metrics.jsonl" 2> /dev/null && break
  sleep 0.1
done
down_at=$(date +%s)
ip -n "$(ns 3)" link set eth0 down
wait $RUN || true
took=$(($(date +%s) - down_at))
if grep -q "worker 3 ($NET.4) stopped answering" "$T/linkdown-worker0.log" && [[ $took -le 30 ]]; then
  ok "a host whose link went down was named within ${took} s: $(grep -m1 'cannot go on' "$T/linkdown-worker0.log" | cut -c1-110)..."
else
  bad "link down: after ${took} s: $(tail -2 "$T/linkdown-worker0.log")"
fi
ip -n "$(ns 3)" link set eth0 up

# A server host whose link goes down for good in a ps_sync job: the workers name the shard
# they cannot reach (within timeout_ms) or, at a barrier, the shard or worker on that host
# (whichever the coordinator finds silent first); the
# cut-off shard, whose heartbeats the coordinator no longer answers, stops by itself after
# 3 heartbeat timeouts naming it; nothing is left running on the cut-off host.
write_job cut ps_sync "servers = [\"$NET.1:7721\", \"$NET.2:7721\"]" "$KEYS" "timeout_ms = 3000"
sed -i 's/^epochs = 3/epochs = 50/; s/^target_accuracy = 0.78/target_accuracy = 0.99/' "$T/cut.toml"
run_job cut 2 > /dev/null 2>&1 &
RUN=$!
for i in $(seq 1 600); do  # up to 60 s for training to start on host 0
  grep -q '"event":"train"' "$T/host0/cut/metrics.jsonl" 2> /dev/null && break
  sleep 0.1
done
down_at=$(date +%s)
ip -n "$(ns 1)" link set eth0 down
wait $RUN || true
took=$(($(date +%s) - down_at))
left=$(ip netns pids "$(ns 1)" | wc -l)
if grep -q "shard 1: the job cannot go on: the coordinator at tcp://$NET.1:7721 stopped answering" "$T/cut-server1.log" &&
  grep -Eq "shard\(s\) 1 \($NET.2:7721\) did not answer|server shard 1 stopped answering|worker 1 stopped answering" \
    "$T/cut-worker0.log" &&
  [[ $left == 0 && $took -le 60 ]]; then
  ok "a server host cut off for good: every process ended within ${took} s, the shard saying: $(grep -m1 'cannot go on' "$T/cut-server1.log" | cut -c1-100)..."
else
  bad "server host cut off: after ${took} s, $left processes left there; shard 1: $(tail -1 "$T/cut-server1.log"); worker 0: $(tail -1 "$T/cut-worker0.log")"
fi
ip -n "$(ns 1)" link set eth0 up

# A worker holding a key pair of its own (it knows the servers' public key) is refused by
# the servers and the coordinator, and says whom it could not reach; the refusal is logged.
FOREIGN="$(echo "$KEYS" | grep -v '^client_'; shoal_on 0 keygen | grep '^client_')"
write_job foreign ps_sync "servers = [\"$NET.1:7711\", \"$NET.2:7711\"]" "$FOREIGN" "timeout_ms = 3000"
write_job foreign-servers ps_sync "servers = [\"$NET.1:7711\", \"$NET.2:7711\"]" "$KEYS" ""
shoal_on 0 server --config "$T/foreign-servers.toml" --shard 0 > "$T/foreign-server0.log" 2>&1 &
S0=$!
shoal_on 1 server --config "$T/foreign-servers.toml" --shard 1 > "$T/foreign-server1.log" 2>&1 &
S1=$!
if shoal_on 2 worker --config "$T/foreign.toml" --rank 2 --output_dir "$T/host2/foreign" > "$T/foreign.log" 2>&1; then
  bad "a worker with a foreign key pair trained"
elif grep -q "did not answer" "$T/foreign.log" && grep -q "is not the job's client key" "$T/foreign-server0.log"; then
  ok "a foreign CurveZMQ key pair is refused and logged: $(grep -m1 'refused CURVE' "$T/foreign-server0.log" | cut -c1-100)..."
else
  bad "foreign key: $(tail -2 "$T/foreign.log"); server: $(tail -2 "$T/foreign-server0.log")"
fi
kill "$S0" "$S1" 2> /dev/null || true
wait "$S0" "$S1" 2> /dev/null || true

# Plaintext across hosts without keys or consent: refused, saying both ways out.
write_job plain allreduce "" "" ""
if shoal_on 1 worker --config "$T/plain.toml" --rank 1 > "$T/plain.log" 2>&1; then
  bad "a plaintext job across hosts started"
elif grep -q "allow_plaintext = true" "$T/plain.log" && grep -q "shoal keygen" "$T/plain.log"; then
  ok "plaintext across hosts refused: $(head -1 "$T/plain.log" | cut -c1-120)..."
else
  bad "plaintext refusal unclear: $(cat "$T/plain.log")"
fi

finish
