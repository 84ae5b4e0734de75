#!/usr/bin/env python3
"""One process feeding several GPUs (device="cuda:0,1,..."): each device gets its own disjoint
stream; the consumer takes one batch per device in turn. Prints one JSON object: images, seconds,
images_per_s, and whether every device's keys were disjoint and covered the epoch.
Usage: one_process_gpus.py SOURCE NGPUS WORKERS [EPOCHS [DECODE]]"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import ringfeed  # noqa: E402
import torch  # noqa: E402


def main():
    source, ngpus, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    decode = sys.argv[5] if len(sys.argv) > 5 else "auto"
    devices = ",".join(str(i) for i in range(ngpus))
    loader = ringfeed.Loader(source, batch_size=256, workers=workers, image_size=224, crop="random_resized",
                             flip=True, epochs=epochs, device=f"cuda:{devices}", framework="torch",
                             decode=decode)
    keys = [[] for _ in range(ngpus)]
    images, first = 0, None
    t0 = time.perf_counter()
    done = [False] * ngpus
    while not all(done):
        for d in range(ngpus):
            if done[d]:
                continue
            b = loader.next_batch(d)
            if b is None:
                done[d] = True
                continue
            assert b["image"].device.index == d
            if first is None:
                first = time.perf_counter()
            keys[d] += b["key"]
            images += b["image"].shape[0]
    for d in range(ngpus):
        torch.cuda.synchronize(d)
    wall = time.perf_counter() - t0
    stats = loader.stats()
    per_epoch = [k[: len(k) // epochs] for k in keys]
    union = [k for ks in per_epoch for k in ks]
    print(json.dumps({"images": images, "seconds": wall, "images_per_s": images / wall,
                      "steady_images_per_s": images / (time.perf_counter() - first) if first else 0,
                      "per_device_batches_equal": len({len(k) for k in keys}) == 1,
                      "epoch_keys": len(union), "epoch_keys_distinct": len(set(union)),
                      **{k: stats[k] for k in ("decode_backend", "gpu_decoded", "cpu_decoded", "gpu_share",
                                               "workers", "workers_active", "pin_ms", "gpu_decoders_start_ms",
                                               "open_ms", "first_batch_ms") if k in stats}}))


if __name__ == "__main__":
    main()
