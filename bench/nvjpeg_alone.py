#!/usr/bin/env python3
"""nvJPEG's batched decode alone, as PyTorch users reach it: torchvision.io.decode_jpeg on a list of
JPEGs with device="cuda". Whole images, no crop or resize: the ceiling that ringfeed's GPU path
(decode, crop, resize, flip into the batch) is compared with. The JPEGs are read from the shards
into memory first, so only decoding is timed.

Usage: nvjpeg_alone.py --shards PATTERN [--batch 256] [--epochs 2] [--json out.json]
"""

import argparse
import json
import os
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import expand  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args()
    import torch
    import torchvision
    from torchvision.io import decode_jpeg
    jpegs = []
    for path in expand(args.shards):
        with tarfile.open(path) as t:
            for m in t:
                if m.name.endswith((".jpg", ".jpeg")):
                    jpegs.append(torch.frombuffer(bytearray(t.extractfile(m).read()), dtype=torch.uint8))
    decode_jpeg(jpegs[: args.batch], device="cuda")  # start-up: CUDA, nvJPEG's handles
    torch.cuda.synchronize()
    n = 0
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        for i in range(0, len(jpegs), args.batch):
            out = decode_jpeg(jpegs[i : i + args.batch], device="cuda")
            n += len(out)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    result = {"images": n, "seconds": dt, "images_per_s": n / dt, "batch": args.batch,
              "torchvision": torchvision.__version__, "mean_jpeg_kb": sum(len(j) for j in jpegs) / len(jpegs) / 1024}
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
