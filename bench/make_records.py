#!/usr/bin/env python3
"""Writes ringfeed shards of tensor records for the benchmarks: COUNT records of SIZE bytes of
uint8 (a .npy payload each), raw or zstd. The content is a random walk, which compresses about as
well as sensor or feature data. Prints the shards' brace pattern.
Usage: make_records.py OUT_PREFIX COUNT SIZE raw|zstd [PER_SHARD]"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import numpy as np  # noqa: E402
import ringfeed  # noqa: E402


def main():
    prefix, count, size, codec = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    per_shard = int(sys.argv[5]) if len(sys.argv) > 5 else 512
    rng = np.random.default_rng(0)
    walk = (np.cumsum(rng.integers(-2, 3, size + 4096), dtype=np.int64) % 256).astype(np.uint8)
    side = int(size ** 0.5)
    shards = (count + per_shard - 1) // per_shard
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    for s in range(shards):
        with ringfeed.Writer(f"{prefix}-{s:06d}.rfs") as w:
            for i in range(s * per_shard, min(count, (s + 1) * per_shard)):
                start = (i * 977) % 4096
                data = walk[start:start + size].reshape(side, size // side)
                w.add(f"{i:08d}", label=i % 1000, fields={"data": (codec, data)})
    print(f"{prefix}-{{000000..{shards - 1:06d}}}.rfs")


if __name__ == "__main__":
    main()
