#!/usr/bin/env python3
"""Whether the GPU's JPEG decoding settles slow for a process or for one set of decoders: opens
LOADERS loaders one after the other in this one process (decode=gpu, 224x224 with flips, batches of
256 on cuda:0), and prints one JSON line per loader with its rate over the epochs after its first
and its GPU decode time per batch.

    RINGFEED_LIBRARY=build/libringfeed.so bench/gpu_decode_settle.py SHARDS [--loaders 4] [--keep 0]

--keep 0 makes every loader start nvJPEG anew (keep_gpu_decoders=0); with 1 (the default) they share
the decoders the first one made. Run it a few times: on H100 hosts, one process in 14 of
decode=gpu ran a third slower for its whole run with every CPU idle (docs/measurements.md).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import ringfeed  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("source")
    p.add_argument("--loaders", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3, help="per loader; the first is not timed")
    p.add_argument("--keep", type=int, default=1, choices=[0, 1], help="keep_gpu_decoders")
    a = p.parse_args()
    for n in range(a.loaders):
        with ringfeed.Loader(a.source, framework="torch", device="cuda:0", decode="gpu", batch_size=256,
                             image_size=224, flip=True, epochs=a.epochs, keep_gpu_decoders=a.keep) as loader:
            images, t0 = 0, None
            for epoch in range(a.epochs):
                for batch in loader:
                    if t0 is not None:
                        images += len(batch["key"])
                if t0 is None:
                    t0 = time.perf_counter()
            rate = images / (time.perf_counter() - t0)
            s = loader.stats()
        print(json.dumps({"pid": os.getpid(), "loader": n, "keep": a.keep, "images_per_s": round(rate),
                          "gpu_decode_ms": s.get("gpu_decode_ms"), "gpu_decoded": s.get("gpu_decoded")}), flush=True)


if __name__ == "__main__":
    main()
