#!/usr/bin/env python3
"""What the Python binding costs the training loop's thread for each batch: the time in
Loader._take (the batch's tensors made from its slot, its keys, its release), which counts no wait
for the loader, and the whole next_batch call beside it (its wait too, where the workers are not
ahead of the 30 ms steps). Each --binding (a folder holding a `ringfeed` package, e.g.
an older version's) runs in its own process, in turn, ROUNDS times; the median of each run.

Usage: python_batch_cost.py SOURCE [--binding DIR]... [--batch-size N] [--batches N] [--rounds N]
                            [--device cuda:N] [--workers N]
(--device: batches on a GPU, their stream wait and release counted too.)
(RINGFEED_LIBRARY names the library, as for the binding itself.)
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def one_run(source, batch_size, batches, device, workers):
    import ringfeed
    from ringfeed import _loader
    extra = {"device": device} if device else {}
    loader = ringfeed.Loader(source, framework="torch", batch_size=batch_size, image_size=16, workers=workers,
                             prefetch=4, **extra)
    take, spent, whole = _loader.Loader._take, [], []

    def timed(self, *args):
        t = time.perf_counter()
        try:
            return take(self, *args)
        finally:
            spent.append(time.perf_counter() - t)

    _loader.Loader._take = timed
    for _ in range(batches):
        time.sleep(0.03)  # a step: the loader gets ahead
        t = time.perf_counter()
        batch = loader.next_batch()
        whole.append(time.perf_counter() - t)
        del batch
    loader.close()
    return statistics.median(spent[batches // 8:]) * 1e3, statistics.median(whole[batches // 8:]) * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("source")
    p.add_argument("--binding", action="append", default=[])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(*one_run(a.source, a.batch_size, a.batches, a.device, a.workers))
        return
    bindings = a.binding or [os.path.join(HERE, "..", "bindings", "python")]
    medians = {b: [] for b in bindings}
    for _ in range(a.rounds):
        for b in bindings:
            env = dict(os.environ, PYTHONPATH=b)
            out = subprocess.run([sys.executable, __file__, a.source, "--one", "--batch-size", str(a.batch_size),
                                  "--batches", str(a.batches), "--device", a.device, "--workers", str(a.workers)],
                                 env=env, check=True, capture_output=True, text=True)
            medians[b].append([float(x) for x in out.stdout.split()[-2:]])
    for b, ms in medians.items():
        print(f"{b}: {', '.join(f'{m[0]:.3f}' for m in ms)} ms a batch of {a.batch_size} in Loader._take; "
              f"next_batch {', '.join(f'{m[1]:.3f}' for m in ms)} ms")


if __name__ == "__main__":
    main()
