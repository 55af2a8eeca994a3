#!/usr/bin/env python3
"""Writes the seed corpus under tests/fuzz/corpus/<target>/ (committed; rerun after a
schema or input-layout change). Message headers are encoded by `capnp encode` from the
real schema, so the seeds are what a worker really sends."""
import gzip
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
SCHEMA = os.path.join(ROOT, "common", "messages", "schema.capnp")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def header(text):
    return subprocess.run(["capnp", "encode", "-I/usr/include", SCHEMA, "Header"], input=text.encode(),
                          stdout=subprocess.PIPE, check=True).stdout


def message(text, frames=()):
    h = header(text)
    out = struct.pack("<BH", len(frames), len(h)) + b"".join(struct.pack("<H", len(f)) for f in frames)
    return out + h + b"".join(frames)


def meta(name, shape, dtype="fp32"):
    n = 1
    for d in shape:
        n *= d
    size = n * (4 if dtype == "fp32" else 2)
    return '(name = "%s", dtype = %s, shape = %s, byteSize = %d)' % (name, dtype, list(shape), size), size


def messages():
    w, wsize = meta("fc.weight", [2, 3])
    b, bsize = meta("fc.bias", [3])
    h16, h16size = meta("emb", [4], "fp16")
    fw, fb, f16 = bytes(range(wsize)), b"\0" * bsize, b"\x01\x3c" * (h16size // 2)
    reg = message('(kind = register, requestId = 1, role = worker, rank = 0, tensors = [%s, %s])' % (w, b))
    plan = message('(kind = plan, requestId = 2, role = worker, rank = 0, plan = (stepsPerEpoch = 10, '
                   'totalSteps = 100, rule = applyEach, workers = 2, globalBatch = 64))')
    assign = message('(kind = push, requestId = 3, op = assign, tensors = [%s, %s])' % (w, b), [fw, fb])
    apply_ = message('(kind = push, requestId = 4, op = apply, tensors = [%s])' % w, [fw])
    add16 = message('(kind = push, requestId = 5, op = add, tensors = [%s])' % h16, [f16])
    pull = message('(kind = pull, requestId = 6, names = ["fc.weight", "fc.bias"])')
    pushpull = message('(kind = pushPull, requestId = 7, op = add, tensors = [%s])' % b, [fb])
    barrier = message('(kind = barrier, requestId = 8, role = worker, rank = 0, barrierName = "init")')
    heartbeat = message('(kind = heartbeat, role = server, rank = 1)')
    store = message('(kind = storeSet, requestId = 9, key = "ring/0", value = "tcp://127.0.0.1:1")') + \
        message('(kind = storeGet, requestId = 10, key = "ring/0")')
    ckpt = message('(kind = checkpointCommit, requestId = 11, checkpoint = (id = 5, step = 5, shards = 2))') + \
        message('(kind = resumeQuery, requestId = 12)')
    leave = message('(kind = leave, requestId = 13, role = worker, rank = 1)')
    put("message", "register_plan_push_pull", reg + plan + assign + apply_ + pull + pushpull)
    put("message", "push_fp16", add16)
    put("message", "barrier_heartbeat", reg + barrier + heartbeat)
    put("message", "store", store)
    put("message", "checkpoint_leave", ckpt + leave)
    put("message", "bad_byte_size", message('(kind = push, op = add, tensors = [%s])' % w, [fw[:5]]))
    put("message", "not_capnp", struct.pack("<BH", 0, 7) + b"garbage")


def configs():
    for name in ["quickstart.toml", "fmnist_ps_sync_lamb.toml", "fmnist_bmuf.toml", "fmnist_dgc.toml"]:
        path = os.path.join(ROOT, "configs", name)
        if os.path.exists(path):
            put("config", name, open(path, "rb").read())
    put("config", "minimal.toml", b'[job]\nname = "x"\n[cluster]\nworkers = 2\n[data]\nformat = "synthetic"\n')
    put("config", "bad_type.toml", b'[job]\nname = 3\n[optimizer]\nname = "lars"\nlr = "fast"\n')


def idx_file(dims, payload):
    return bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


def idx():
    images = idx_file([3, 2, 2], bytes(range(12)))
    labels = idx_file([3], bytes([0, 1, 2]))
    put("idx", "plain", struct.pack("<BI", 0, len(images)) + images + labels)
    gz = gzip.compress(images, mtime=0)
    put("idx", "gzip_images", struct.pack("<BI", 1, len(gz)) + gz + gzip.compress(labels, mtime=0))
    put("idx", "count_mismatch", struct.pack("<BI", 2, len(images)) + images + idx_file([2], b"\0\1"))
    put("idx", "truncated", struct.pack("<BI", 0, len(images) - 3) + images[:-3] + labels)


def cifar():
    rec = lambda label: bytes([label]) + bytes((i * 7 + label) & 255 for i in range(3072))
    put("cifar", "two_records", b"\0" + rec(3) + rec(9))
    put("cifar", "gzip_one_record", b"\x04" + gzip.compress(rec(1), mtime=0))
    put("cifar", "label_too_big", b"\x02" + rec(200))
    put("cifar", "truncated", b"\0" + rec(1)[:100])
    # CIFAR-100 (options bits 4-5: 1 fine, 2 coarse): coarse label, fine label, pixels.
    rec100 = lambda coarse, fine: bytes([coarse, fine]) + rec(fine)[1:]
    put("cifar", "cifar100_fine", b"\x10" + rec100(19, 99) + rec100(0, 3))
    put("cifar", "cifar100_coarse_gzip", b"\x20" + gzip.compress(rec100(7, 42), mtime=0))
    put("cifar", "cifar100_fine_too_big", b"\x10" + rec100(1, 100))


def dgc_pairs(e, values, indices, bits):
    """One tensor's encoding: exponent byte, fp16 values, indices packed low bits first."""
    acc = sum(i << (k * bits) for k, i in enumerate(indices))
    nbits = bits * len(indices)
    return (struct.pack("<b", e) + b"".join(struct.pack("<e", v) for v in values) +
            acc.to_bytes((nbits + 7) // 8, "little"))


def dgc():
    layout = struct.pack("<BIH", 0, 800, 3)  # one tensor of 800 elements (10-bit indices), 3 pairs
    # Largest |value| 1: exponent -14 scales it to 2^14.
    good = dgc_pairs(-14, [8192.0, -16384.0, 4096.0], [5, 100, 700], 10)
    put("dgc", "lenet_conv1", layout + good)
    put("dgc", "index_outside", layout + dgc_pairs(-14, [1.0, 2.0, 3.0], [5, 100, 1000], 10))
    put("dgc", "truncated", layout + good[:-1])
    put("dgc", "two_tensors", struct.pack("<BIHIH", 1, 262144, 2, 10, 1) +
        struct.pack("<bb", -20, -14) + b"".join(struct.pack("<e", v) for v in [20000.0, -30000.0, 16384.0]) +
        (7 | (262000 << 18) | (9 << 36)).to_bytes(5, "little"))


def block_quant():
    # 300 values: a full block of 256 and one of 44; int8 a byte each, int4 a nibble (q + 8).
    int8 = (struct.pack("<f", 0.01) + bytes((i % 255) - 127 & 255 for i in range(256)) +
            struct.pack("<f", 0.5) + bytes(range(44)))
    put("block_quant", "int8_two_blocks", struct.pack("<BI", 0, 300) + int8)
    int4 = struct.pack("<f", 0.25) + bytes(0x9f for _ in range(128)) + struct.pack("<f", 1.0) + bytes([0x18] * 22)
    put("block_quant", "int4_two_blocks", struct.pack("<BI", 1, 300) + int4)
    put("block_quant", "int4_odd_padding", struct.pack("<BI", 1, 3) + struct.pack("<f", 2.0) + bytes([0x19, 0x0a]))
    put("block_quant", "negative_scale", struct.pack("<BI", 0, 2) + struct.pack("<f", -1.0) + bytes([1, 2]))
    put("block_quant", "truncated", struct.pack("<BI", 0, 300) + int8[:-1])


if __name__ == "__main__":
    for what in sys.argv[1:] or ["message", "config", "idx", "cifar", "dgc", "block_quant"]:
        {"message": messages, "config": configs, "idx": idx, "cifar": cifar, "dgc": dgc,
         "block_quant": block_quant}[what]()
