#!/usr/bin/env python3
"""ringfeed against the PyTorch DataLoader on the same WebDataset shards, in one run.

Three loaders, each in a fresh process (so peak memory is its own), the same shards, workers,
batch size and work: RandomResizedCrop(224) + horizontal flip, uint8 batches delivered to the
device (pinned memory and non-blocking copies for the DataLoader):
  ringfeed      ringfeed.Loader(..., device=DEVICE)
  torch-pil     a map-style Dataset over the tar member index, decoding with PIL
  torch-tvio    the same Dataset decoding with torchvision.io.decode_jpeg
With --mds the same samples are an MDS dataset (MosaicML Streaming's format, written here from the
shards: a jpeg column and an int label): ringfeed reads the folder, and the Datasets read each
sample's image column by the shard's offsets, the per-sample work of a StreamingDataset whose
shards are local (read, decode, transform).
Prints images/s, first-batch latency, peak RSS and the ratios; writes them as JSON.

Usage: compare_torch.py [--shards PATTERN | --synthetic N] [--mds] [--workers 16] [--batch 256]
                        [--epochs 1] [--device cuda:0] [--json out.json]
"""

import argparse
import glob
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))


def expand(pattern):
    """Shard paths of a brace pattern like dir/train-{000000..000009}.tar (or a glob)."""
    if "{" in pattern:
        pre, rest = pattern.split("{", 1)
        body, post = rest.split("}", 1)
        a, b = body.split("..")
        return [f"{pre}{i:0{len(a)}d}{post}" for i in range(int(a), int(b) + 1)]
    return sorted(glob.glob(pattern))


def member_index(shards):
    """(shard, data offset, size, label) per sample: what a map-style Dataset over tars needs."""
    samples = []
    for path in shards:
        with tarfile.open(path) as t:
            pending = {}
            for m in t.getmembers():
                key, _, ext = m.name.partition(".")
                entry = pending.setdefault(key, {})
                if ext in ("jpg", "jpeg"):
                    entry["jpg"] = (m.offset_data, m.size)
                elif ext == "cls":
                    entry["cls"] = int(t.extractfile(m).read())
            for key, e in pending.items():
                if "jpg" in e:
                    samples.append((path, e["jpg"][0], e["jpg"][1], e.get("cls", -1)))
    return samples


def write_mds(samples, folder, per_shard=1000):
    """SAMPLES (from member_index) as an MDS dataset in FOLDER: columns image (jpeg) and label
    (int), each shard the sample count, the offsets, its settings and the samples."""
    import struct
    os.makedirs(folder, exist_ok=True)
    shards, fds = [], {}
    for s in range(0, len(samples), per_shard):
        body = []
        for path, off, size, label in samples[s:s + per_shard]:
            fd = fds.setdefault(path, os.open(path, os.O_RDONLY))
            body.append(struct.pack("<I", size) + os.pread(fd, size, off) + struct.pack("<q", label))
        conf = {"column_encodings": ["jpeg", "int"], "column_names": ["image", "label"], "column_sizes": [None, 8],
                "compression": None, "format": "mds", "hashes": [], "samples": len(body), "size_limit": 1 << 26,
                "version": 2, "zip_data": None}
        settings = json.dumps(conf, sort_keys=True).encode()
        at = 4 + 4 * (len(body) + 1) + len(settings)
        offsets = [at]
        for b in body:
            offsets.append(offsets[-1] + len(b))
        base = f"shard.{s // per_shard:05d}.mds"
        with open(os.path.join(folder, base), "wb") as f:
            f.write(struct.pack(f"<{len(offsets) + 1}I", len(body), *offsets) + settings + b"".join(body))
        shards.append(dict(conf, raw_data={"basename": base, "bytes": offsets[-1], "hashes": {}}))
    with open(os.path.join(folder, "index.json"), "w") as f:
        json.dump({"shards": shards, "version": 2}, f)


def mds_index(folder):
    """(shard, image offset, size, label) per sample of an MDS dataset written by write_mds."""
    import struct
    samples = []
    for sh in json.load(open(os.path.join(folder, "index.json")))["shards"]:
        path = os.path.join(folder, sh["raw_data"]["basename"])
        data = open(path, "rb").read()
        n = struct.unpack_from("<I", data)[0]
        for start in struct.unpack_from(f"<{n}I", data, 4):
            size = struct.unpack_from("<I", data, start)[0]
            label = struct.unpack_from("<q", data, start + 4 + size)[0]
            samples.append((path, start + 4, size, label))
    return samples


class TarSamples:
    """Map-style dataset: reads one member with pread, decodes and augments it."""

    def __init__(self, samples, decoder):
        self.samples = samples
        self.decoder = decoder
        self.fds = {}
        self.tf = None

    def __len__(self):
        return len(self.samples)

    def _transform(self):
        import torchvision.transforms as T
        if self.decoder == "pil":
            return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
        return T.Compose([T.RandomResizedCrop(224, antialias=True), T.RandomHorizontalFlip()])

    def __getitem__(self, i):
        import torch
        path, off, size, label = self.samples[i]
        fd = self.fds.get(path)
        if fd is None:
            fd = self.fds[path] = os.open(path, os.O_RDONLY)
        data = os.pread(fd, size, off)
        if self.tf is None:
            self.tf = self._transform()
        if self.decoder == "pil":
            from PIL import Image
            img = Image.open(io.BytesIO(data)).convert("RGB")
        else:
            from torchvision.io import decode_jpeg
            img = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return self.tf(img), label


def peak_rss_mb():
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, kids


def run_one(args):
    import torch
    import torchvision.transforms  # noqa: F401 - imported once, before the workers fork, as a user would
    device = torch.device(args.device)
    n = 0
    t0 = time.perf_counter()
    first = first_n = None
    if args.only == "ringfeed":
        import ringfeed
        loader = ringfeed.Loader(args.mds or args.shards, batch_size=args.batch, workers=args.workers,
                                 image_size=224, crop="random_resized", flip=True, seed=0,
                                 epochs=args.epochs, device=args.device, framework="torch")
        for b in loader:
            img = b["image"]
            if first is None:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                first = time.perf_counter() - t0
            n += img.shape[0]
            if first_n is None:
                first_n = n
    else:
        samples = mds_index(args.mds) if args.mds else member_index(expand(args.shards))
        ds = TarSamples(samples, "pil" if args.only == "torch-pil" else "tvio")
        dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                         pin_memory=device.type == "cuda", drop_last=False,
                                         persistent_workers=args.epochs > 1, prefetch_factor=4)
        t0 = time.perf_counter()
        for _ in range(args.epochs):
            for img, label in dl:
                img = img.to(device, non_blocking=True)
                label = label.to(device, non_blocking=True)
                if first is None:
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    first = time.perf_counter() - t0
                n += img.shape[0]
                if first_n is None:
                    first_n = n
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    if args.only != "ringfeed":
        del dl  # joins the worker processes, so their peak memory is counted
        import gc
        gc.collect()
    own, kids = peak_rss_mb()
    # Steady state: from the first batch on, so worker start-up does not dominate a short run.
    print(json.dumps({"loader": args.only, "images": n, "wall_s": wall, "images_per_s_total": n / wall,
                      "images_per_s": (n - first_n) / (wall - first), "first_batch_ms": first * 1000,
                      "peak_rss_mb": own, "peak_worker_rss_mb": kids}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", help="shard pattern (default: dlbench's synthetic set)")
    p.add_argument("--synthetic", type=int, default=10000)
    p.add_argument("--dlbench", default=os.path.join(ROOT, "build", "dlbench"))
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--mds", nargs="?", const="", help="read an MDS copy of the shards (made in FOLDER, "
                   "default beside the shards)")
    p.add_argument("--only", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.only:
        return run_one(args)
    if not args.shards:
        args.shards = subprocess.check_output([args.dlbench, "--synthetic", str(args.synthetic),
                                               "--make-synthetic"], text=True).strip()
    for path in expand(args.shards):  # into the page cache, for every contender alike
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass
    if args.mds is not None:
        args.mds = args.mds or os.path.join(os.path.dirname(expand(args.shards)[0]), "mds")
        if not os.path.exists(os.path.join(args.mds, "index.json")):
            write_mds(member_index(expand(args.shards)), args.mds)
        for name in os.listdir(args.mds):
            with open(os.path.join(args.mds, name), "rb") as f:
                while f.read(1 << 24):
                    pass
    results = {}
    for name in ("ringfeed", "torch-pil", "torch-tvio"):
        cmd = [sys.executable, os.path.abspath(__file__), "--only", name, "--shards", args.shards,
               "--workers", str(args.workers), "--batch", str(args.batch), "--epochs", str(args.epochs),
               "--device", args.device] + (["--mds", args.mds] if args.mds else [])
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{name} failed")
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    rf = results["ringfeed"]["images_per_s"]
    summary = {"workers": args.workers, "batch": args.batch, "device": args.device, "shards": args.mds or args.shards,
               "results": results,
               "ratio_vs_pil": rf / results["torch-pil"]["images_per_s"],
               "ratio_vs_tvio": rf / results["torch-tvio"]["images_per_s"]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"\n{args.workers} workers, batch {args.batch}, RandomResizedCrop(224)+flip, uint8 to {args.device}"
          f"{', from an MDS dataset' if args.mds else ''}")
    print("| loader | images/s (steady) | images/s (with start-up) | first batch ms | peak RSS MB (main / largest worker) |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['images_per_s']:.0f} | {r['images_per_s_total']:.0f} | {r['first_batch_ms']:.0f} | "
              f"{r['peak_rss_mb']:.0f} / {r['peak_worker_rss_mb']:.0f} |")
    print(f"| ringfeed / torch-pil | {summary['ratio_vs_pil']:.2f}x | | | |")
    print(f"| ringfeed / torch-tvio | {summary['ratio_vs_tvio']:.2f}x | | | |")


if __name__ == "__main__":
    main()
