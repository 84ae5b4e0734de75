#!/usr/bin/env python3
"""What the Python binding costs the training loop's thread for each batch: the time in
Loader._take (the batch's tensors made from its slot, its keys, its release), which counts no wait
for the loader, and the whole next_batch call beside it (its wait too, where the workers are not
ahead of the 30 ms steps). Each --binding (a folder holding a `ringfeed` package, e.g.
an older version's) runs in its own process, in turn, ROUNDS times; the median of each run.

Usage: python_batch_cost.py SOURCE [--binding DIR]... [--batch-size N] [--batches N] [--rounds N]
                            [--device cuda:N] [--workers N] [--parts] [--step sleep|launch]
(--device: batches on a GPU, their stream wait and release counted too. --parts: where the time in
Loader._take goes, each C call and Python step it makes timed apart, the median a batch of each, in
one process; "the rest" is _take's own code: the dict, the keys' decode. --step: what the thread
does for the 30 ms between batches: sleep (the default), or launch small torch operations all along,
on the GPU where --device names one, as a host-bound training step does.)
(RINGFEED_LIBRARY names the library, as for the binding itself.)
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def step(kind, device):
    """30 ms between two batches: asleep, or launching small operations (a host-bound model)."""
    if kind == "sleep":
        time.sleep(0.03)
        return
    import torch
    x = torch.zeros(256, device=device or "cpu")
    end = time.perf_counter() + 0.03
    while time.perf_counter() < end:
        x.add_(1)


def one_run(source, batch_size, batches, device, workers, step_kind):
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
        step(step_kind, device)  # the loader gets ahead
        t = time.perf_counter()
        batch = loader.next_batch()
        whole.append(time.perf_counter() - t)
        del batch
    loader.close()
    return statistics.median(spent[batches // 8:]) * 1e3, statistics.median(whole[batches // 8:]) * 1e3


# What Loader._take calls, in this binding or an older one, each timed apart by --parts.
LIB_CALLS = ("dl_batch_wait", "dl_batch_size", "dl_batch_field_count", "dl_batch_field_name", "dl_batch_export",
             "dl_batch_copy", "dl_batch_bytes_count", "dl_batch_keys", "dl_batch_keys_text",
             "dl_batch_position", "dl_batches_per_epoch", "dl_batch_errors", "dl_batch_release")


def parts_run(source, batch_size, batches, device, workers, step_kind):
    import torch
    import ringfeed
    from ringfeed import _dlpack, _loader
    extra = {"device": device} if device else {}
    loader = ringfeed.Loader(source, framework="torch", batch_size=batch_size, image_size=224, workers=workers,
                             prefetch=4, **extra)
    spent = {}

    def timed(name, fn):
        def call(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return call
    for name in LIB_CALLS:  # (an older binding may not call them all)
        if hasattr(_loader.lib, name):
            setattr(_loader.lib, name, timed(name, getattr(_loader.lib, name)))
    _loader.Loader._consumer_stream = timed("consumer stream", _loader.Loader._consumer_stream)
    torch.empty = timed("labels' tensor (torch.empty)", torch.empty)
    _dlpack.capsule = timed("capsule (PyCapsule_New)", _dlpack.capsule)
    torch.utils.dlpack.from_dlpack = timed("torch from_dlpack", torch.utils.dlpack.from_dlpack)
    torch.Tensor.clone = timed("labels' clone", torch.Tensor.clone)
    _loader.Loader._take = timed("Loader._take", _loader.Loader._take)
    rows = {}
    for i in range(batches):
        step(step_kind, device)  # the loader gets ahead
        spent.clear()
        batch = loader.next_batch()
        del batch
        if i >= batches // 8:
            take = spent.pop("Loader._take")
            for name, s in list(spent.items()) + [("the rest", take - sum(spent.values())), ("Loader._take", take)]:
                rows.setdefault(name, []).append(s)
    loader.close()
    for name, v in rows.items():
        print(f"{statistics.median(v) * 1e6:9.1f} us  {name}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("source")
    p.add_argument("--binding", action="append", default=[])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--parts", action="store_true")
    p.add_argument("--step", choices=("sleep", "launch"), default="sleep")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.parts:
        parts_run(a.source, a.batch_size, a.batches, a.device, a.workers, a.step)
        return
    if a.one:
        print(*one_run(a.source, a.batch_size, a.batches, a.device, a.workers, a.step))
        return
    bindings = a.binding or [os.path.join(HERE, "..", "bindings", "python")]
    medians = {b: [] for b in bindings}
    for _ in range(a.rounds):
        for b in bindings:
            env = dict(os.environ, PYTHONPATH=b)
            out = subprocess.run([sys.executable, __file__, a.source, "--one", "--batch-size", str(a.batch_size),
                                  "--batches", str(a.batches), "--device", a.device, "--workers", str(a.workers),
                                  "--step", a.step],
                                 env=env, check=True, capture_output=True, text=True)
            medians[b].append([float(x) for x in out.stdout.split()[-2:]])
    for b, ms in medians.items():
        print(f"{b}: {', '.join(f'{m[0]:.3f}' for m in ms)} ms a batch of {a.batch_size} in Loader._take; "
              f"next_batch {', '.join(f'{m[1]:.3f}' for m in ms)} ms")


if __name__ == "__main__":
    main()
