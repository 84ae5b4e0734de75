"""Soak from Python: many epochs through one Loader, then as many Loaders opened, read and closed
in turn, with resident memory, open descriptors, threads, Python objects and the pinned memory
the library holds sampled after each. They must stay flat once warm.

    python3 soak.py [--epochs N] [--framework numpy|torch] [--device cuda] [SOURCE]

`make soak` runs 50 epochs; test_soak.py runs a short one in make test.
"""
import argparse
import gc
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.abspath(os.path.join(HERE, "..")))
import ringfeed  # noqa: E402


def sample(loader=None):
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    gc.collect()
    return {"rss_mb": rss, "fds": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task")), "objects": len(gc.get_objects()),
            "pinned": loader.stats()["pinned_bytes_in_process"] if loader else 0}


def flat(what, warm, last, slack_mb=6, slack_objects=200):
    exact = ("fds", "threads", "pinned")
    if (any(last[k] != warm[k] for k in exact) or last["rss_mb"] > warm["rss_mb"] + slack_mb
            or last["objects"] > warm["objects"] + slack_objects):
        raise AssertionError(f"{what}: not flat: warm {warm}, last {last}")


def soak(source, epochs, framework="numpy", device="cpu", log=print):
    kw = dict(batch_size=16, image_size=32, crop="random_resized", flip=True, drop_last=True,
              framework=framework, workers=4, prefetch=4)
    if device != "cpu":
        kw["device"] = device
    before = sample()
    loader = ringfeed.Loader(source, epochs=epochs, **kw)
    per_epoch = len(loader)
    warm = last = None
    for e in range(epochs):
        for _ in range(per_epoch):
            batch = next(loader)
            assert batch["image"].shape[0] == 16
            del batch
        s = sample(loader)
        warm = s if e == 1 else warm
        last = s if e == epochs - 2 else last  # after the last epoch the workers have left
        if e < 3 or e >= epochs - 2 or e % 10 == 0:
            log(f"epoch  {e:4d} {s}")
    flat("epochs of one Loader", warm, last)
    loader.close()
    del loader
    for c in range(epochs):
        with ringfeed.Loader(source, epochs=1, **kw) as loader:
            for batch in loader:
                del batch
            pinned = loader.stats()["pinned_bytes_in_process"]
        del loader
        s = sample()
        s["pinned"] = pinned
        warm = s if c == 1 else warm
        if c < 3 or c == epochs - 1 or c % 10 == 0:
            log(f"reopen {c:4d} {s}")
    flat("Loaders opened and closed", warm, s)
    assert s["threads"] == before["threads"] and s["fds"] == before["fds"], (before, s)
    log(f"soak: {epochs} epochs of one Loader and {epochs} Loaders in turn ({framework}, {device}): "
        "memory, descriptors, threads, objects and pinned bytes flat")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--framework", default="numpy")
    p.add_argument("--device", default="cpu")
    p.add_argument("source", nargs="?", default=os.path.join(
        os.environ.get("DL_TESTDATA") or os.path.join(HERE, "..", "..", "..", "..", "shared", "testdata"),
        "webdataset", "WebDataset.jl-test-sample.tar"))
    a = p.parse_args()
    soak(a.source, a.epochs, a.framework, a.device)


if __name__ == "__main__":
    main()
