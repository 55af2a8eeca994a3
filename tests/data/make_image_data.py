#!/usr/bin/python3
"""Makes image data sets from Fashion-MNIST for the image data tests (python3-pil).

  make_image_data.py folder OUT TRAIN_N TEST_N   OUT/train/<class>/*.{png,jpg}, OUT/test/...
  make_image_data.py shards OUT TRAIN_N TEST_N K OUT/train-{000000..K-1}.tar, OUT/test-000000.tar
  make_image_data.py decode FILE CHANNELS OUT    PIL's decode of FILE (mode L or RGB), raw bytes
  make_image_data.py resize FILE W H X0 Y0 X1 Y1 OUT   PIL's bilinear resize of a box, raw bytes
  make_image_data.py photo OUT W H QUALITY       a photo-like RGB JPEG or PNG (by OUT's suffix)

Images alternate between PNG and JPEG (quality 95) so both decoders are exercised; the
first TRAIN_N / TEST_N samples of each IDX file are used (Fashion-MNIST's order is mixed).
"""
import gzip
import io
import os
import struct
import sys
import tarfile

from PIL import Image

FMNIST = "/usr/share/datasets/fashion-mnist"
CLASSES = ["0-tshirt", "1-trouser", "2-pullover", "3-dress", "4-coat", "5-sandal", "6-shirt", "7-sneaker", "8-bag",
           "9-boot"]


def idx(prefix, n):
    with gzip.open(f"{FMNIST}/{prefix}-images-idx3-ubyte.gz") as f:
        _, count, h, w = struct.unpack(">IIII", f.read(16))
        pixels = f.read(min(n, count) * h * w)
    with gzip.open(f"{FMNIST}/{prefix}-labels-idx1-ubyte.gz") as f:
        f.read(8)
        labels = f.read(min(n, count))
    return [(Image.frombytes("L", (w, h), pixels[i * h * w:(i + 1) * h * w]), labels[i]) for i in range(len(labels))]


def encode(img, i):
    b = io.BytesIO()
    if i % 2:
        img.save(b, "JPEG", quality=95)
        return b.getvalue(), "jpg"
    img.save(b, "PNG")
    return b.getvalue(), "png"


def folder(out, train_n, test_n):
    for split, prefix, n in (("train", "train", train_n), ("test", "t10k", test_n)):
        for c in CLASSES:
            os.makedirs(f"{out}/{split}/{c}", exist_ok=True)
        for i, (img, label) in enumerate(idx(prefix, n)):
            data, ext = encode(img, i)
            with open(f"{out}/{split}/{CLASSES[label]}/{i:06d}.{ext}", "wb") as f:
                f.write(data)


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def shards(out, train_n, test_n, k):
    os.makedirs(out, exist_ok=True)
    samples = idx("train", train_n)
    per = (len(samples) + k - 1) // k
    for s in range(k):
        with tarfile.open(f"{out}/train-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
            for i in range(s * per, min(len(samples), (s + 1) * per)):
                img, label = samples[i]
                data, ext = encode(img, i)
                add(t, f"s{i:06d}.{ext}", data)
                add(t, f"s{i:06d}.cls", str(label).encode())
    with tarfile.open(f"{out}/test-000000.tar", "w", format=tarfile.USTAR_FORMAT) as t:
        for i, (img, label) in enumerate(idx("t10k", test_n)):
            data, ext = encode(img, i)
            add(t, f"t{i:06d}.{ext}", data)
            add(t, f"t{i:06d}.cls", str(label).encode())


def photo(out, w, h, quality):
    # Smooth gradients plus a few hard-edged shapes: compresses like a photo, not like noise.
    img = Image.new("RGB", (w, h))
    px = img.load()
    for y in range(h):
        for x in range(w):
            px[x, y] = ((x * 255) // w, (y * 255) // h, ((x + y) * 97 // 7) % 256)
    for k in range(6):
        x0, y0 = (k * 53) % w, (k * 71) % h
        img.paste((40 * k % 256, 255 - 30 * k, 90), (x0, y0, min(w, x0 + w // 5), min(h, y0 + h // 4)))
    if out.endswith(".png"):
        img.save(out, "PNG")
    else:
        img.save(out, "JPEG", quality=quality)


def main():
    cmd = sys.argv[1]
    if cmd == "folder":
        folder(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "shards":
        shards(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "decode":
        img = Image.open(sys.argv[2])
        img = img.convert("L" if sys.argv[3] == "1" else "RGB")
        with open(sys.argv[4], "wb") as f:
            f.write(struct.pack("<ii", img.width, img.height) + img.tobytes())
    elif cmd == "resize":
        img = Image.open(sys.argv[2]).convert("RGB")
        w, h = int(sys.argv[3]), int(sys.argv[4])
        box = tuple(float(v) for v in sys.argv[5:9])
        img = img.resize((w, h), Image.BILINEAR, box=box)
        with open(sys.argv[9], "wb") as f:
            f.write(img.tobytes())
    elif cmd == "photo":
        photo(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
