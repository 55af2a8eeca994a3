# Every message on the wire: one Header frame (this schema) followed by one raw frame per
# entry of `tensors`, in order. Tensor bytes never pass through Cap'n Proto, so they can be
# sent and received without copying.
@0x8265d148afd1c407;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("shoal::msg");

enum Kind {
  invalid @0;        # zero value: a header that never set its kind
  push @1;           # worker -> shard: tensors + op; answered by pushAck
  pushAck @2;
  pull @3;           # worker -> shard: tensor names; answered by pullReply
  pullReply @4;      # tensors (meta + frames)
  register @5;       # member -> coordinator; answered by clusterMap
  clusterMap @6;
  barrier @7;        # worker -> coordinator; answered by barrierDone once all arrive
  barrierDone @8;
  heartbeat @9;      # member -> coordinator; never answered
  error @10;         # any -> requester: what went wrong, for requestId
  pushPull @11;      # push, answered by a pullReply with the pushed tensors' new values
  checkpoint @12;    # worker -> every shard: write checkpoint `checkpoint.id`; answered by checkpointAck
  checkpointAck @13; # carries `checkpoint` (resumeQuery: id 0 = no complete checkpoint)
  checkpointCommit @14;  # worker -> coordinator: every shard wrote `checkpoint.id`; it is now the newest complete one
  resumeQuery @15;   # member -> coordinator: which checkpoint to resume from; answered by checkpointAck
  plan @16;          # worker -> every shard at registration: `plan`, what the shard's update rule needs; answered by planAck
  planAck @17;
  gossip @18;        # adpsgd active -> passive worker: its model as tensor "model"; answered by gossipReply
  gossipReply @19;   # the passive's model before averaging, as tensor "model"
  gossipBye @20;     # an active worker has finished; never answered
  storeSet @21;      # member -> coordinator: rendezvous `key` = `value`; answered by storeAck
  storeAck @22;
  storeGet @23;      # member -> coordinator: the value of `key`; answered by storeValue (`found` false: not yet set)
  storeValue @24;
  leave @25;         # worker -> coordinator when it has finished; answered by leaveAck
  leaveAck @26;
  jobOver @27;       # coordinator -> server shard, answering its heartbeat once every worker left or died
  heartbeatAck @28;  # rank 0's coordinator (jobs without servers) -> worker: it is alive
  memberDead @29;    # rank 0's coordinator -> worker, answering its heartbeat: `message` names who stopped answering
  members @30;       # worker -> coordinator: who is alive now (ps_ssp leaves dead ranks' clocks out); answered by clusterMap
  reload @31;        # worker rank 0 -> every shard after a shard was restarted alone (ps_sync): load `checkpoint.id`
                     # and serve `generation` from now on; answered by checkpointAck
  storeCompareSet @32;  # member -> coordinator: `key` = `value` only if it holds `expected` ("" also: not set);
                        # answered by storeValue with what `key` holds afterwards
}

enum DType { fp32 @0; fp16 @1; bf16 @2; }

# How a shard combines a pushed tensor with the one it holds.
enum PushOp {
  assign @0;   # replace
  add @1;      # accumulate (elementwise sum)
  apply @2;    # hand to the shard's UpdateRule (server-side optimizer)
}

enum Role { worker @0; server @1; }

struct TensorMeta {
  name @0 :Text;
  dtype @1 :DType;
  shape @2 :List(Int64);
  byteSize @3 :UInt64;   # must equal the size of the matching frame
  version @4 :UInt64;    # pushes applied on the shard (pull replies)
}

struct Placement {
  name @0 :Text;
  shard @1 :UInt32;
  byteSize @2 :UInt64;
}

struct Member {
  role @0 :Role;
  rank @1 :Int32;
  alive @2 :Bool;
}

struct ClusterMap {
  servers @0 :List(Text);        # "host:port", index = shard
  worldSize @1 :Int32;           # number of workers
  placement @2 :List(Placement);
  members @3 :List(Member);
}

# One checkpoint of a job: taken after `step` global steps; the data position the workers
# continue from is (epoch, batch) with batch counted within that epoch.
struct CheckpointInfo {
  id @0 :UInt64;     # 0 = none
  step @1 :Int64;
  epoch @2 :Int64;
  batch @3 :Int64;
  shards @4 :UInt32; # how many shards wrote it (a job must resume with as many)
  keep @5 :UInt64;   # checkpoint requests: the newest committed checkpoint, which the write must not remove
  workers @6 :UInt32; # the coordinator's answers in a PS job: the workers whose steps it counts (0 = not known)
}

# How a shard applies pushes with op = apply (the parameter-server algorithms' optimizer).
enum ServerRule {
  none @0;           # the job runs no optimizer on the servers
  applyEach @1;      # every push is one worker's step (ps_async, ps_ssp)
  meanOfWorkers @2;  # sum the pushes of all `workers`, apply their mean once (ps_sync)
}

# What a shard must know of the training to run the job's optimizer, learned from the
# workers at registration (a server never reads the data set).
struct TrainingPlan {
  stepsPerEpoch @0 :Int64;  # global steps in one epoch
  totalSteps @1 :Int64;     # global steps of the whole run (the LR schedule's horizon)
  rule @2 :ServerRule;
  workers @3 :Int32;        # workers whose pushes make one global step
  globalBatch @4 :Int64;    # samples in one global step (LR scaling)
}

struct Header {
  kind @0 :Kind;
  requestId @1 :UInt64;          # echoed in the answer
  role @2 :Role;                 # of the sender
  rank @3 :Int32;                # worker rank or shard index of the sender
  tensors @4 :List(TensorMeta);  # push, pullReply
  names @5 :List(Text);          # pull
  op @6 :PushOp;                 # push
  cluster @7 :ClusterMap;        # clusterMap
  barrierName @8 :Text;          # barrier, barrierDone
  message @9 :Text;              # error
  checkpoint @10 :CheckpointInfo;  # checkpoint, checkpointAck, checkpointCommit
  plan @11 :TrainingPlan;          # plan
  key @12 :Text;                   # storeSet, storeGet, storeCompareSet
  value @13 :Data;                 # storeSet, storeValue, storeCompareSet (the value wanted)
  found @14 :Bool;                 # storeValue
  generation @15 :UInt32;          # which recovery the sender is in: it goes up by one each time a shard is
                                   # restarted alone; data requests, barriers and commits of an older one are refused
  rejoin @16 :Bool;                # resumeQuery from a shard (or ps_sync worker) restarted alone while the job runs
  inputError @17 :Bool;            # error: the job itself is wrong (e.g. another model than the checkpoints'), so
                                   # the receiver throws InputError and exits 2: a restart would be refused the same way
  liveOnly @18 :Bool;              # barrier: completes once every worker not known dead has arrived, and a death
                                   # does not fail it (asynchronous jobs' finish: the survivors of a death go on)
  expected @19 :Data;              # storeCompareSet: the value `key` must hold for `value` to replace it
}
