#!/usr/bin/env python3
"""Train a torchvision ResNet-50 on WebDataset shards fed by ringfeed: mixed precision, DDP under
torchrun, batches decoded straight to the GPU as normalised bfloat16.

    torchrun --nproc_per_node=8 examples/train_imagenet.py --data 'train-{000000..000146}.tar'
    python3 examples/train_imagenet.py --data "$(build/dlbench --make-synthetic)" --steps 300

Each rank gets its own disjoint share of every epoch (RANK/WORLD_SIZE from torchrun) and the
same number of batches; --resume continues from a saved loader state.
"""

import argparse
import gc
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bindings", "python"))
import ringfeed  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="shards: a path, a glob or a brace pattern")
    p.add_argument("--batch-size", type=int, default=256, help="per GPU")
    p.add_argument("--workers", type=int, help="default: the loader's own choice (its CPUs, shared by the "
                   "LOCAL_WORLD_SIZE ranks of the host)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: all epochs)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--resume", help="a loader state file written by --save-state")
    p.add_argument("--save-state", help="write the loader state here at the end")
    p.add_argument("--keys-out", help="write every key this rank saw, one per line (%%RANK%% is replaced)")
    p.add_argument("--decode", default="auto", choices=["auto", "cpu", "gpu", "hybrid"],
                   help="where JPEGs are decoded (auto: the GPU's JPEG engines beside the CPU workers)")
    p.add_argument("--held", action="store_true",
                   help="train on the first batch over and over, kept on the GPU: the model's own rate, no loader "
                        "in the way (needs --steps)")
    p.add_argument("--model", default="resnet50", choices=["resnet50", "vit_tiny"],
                   help="vit_tiny: a 12-layer ViT of width 192, whose step is bound by the host's launches")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a further loader option, e.g. --option prefetch=8 (repeatable)")
    p.add_argument("--beside", action="store_true",
                   help="with --held: the loader keeps running beside the model, each of its batches taken and "
                        "dropped; the cost of its work on the CPUs and the GPU, without its batches in the step")
    p.add_argument("--alternate", type=int, default=0, metavar="N",
                   help="after the warm-up, blocks of N steps held and fed in turn in this one process, each timed: "
                        "the fed/held ratio without what moves from one process or host to the next, for a model "
                        "that pauses between its fed blocks (needs --steps)")
    p.add_argument("--loader-first", action="store_true",
                   help="open the loader before building the model, so that nvJPEG (decode=auto) starts and the "
                        "workers fill the first batches meanwhile; for ResNet-50 on an H100 it cost 1.2%% of the "
                        "steady rate and brought the first step no sooner (docs/measurements.md, 2026-12-07)")
    args = p.parse_args()
    start = time.perf_counter()
    if (args.held or args.alternate) and not args.steps:
        p.error("--held and --alternate need --steps")
    if args.held and args.alternate:
        p.error("--held or --alternate, not both")
    if args.beside and not args.held:
        p.error("--beside needs --held")

    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    if world > 1:
        dist.init_process_group("nccl")

    def build_model():
        import torchvision
        if args.model == "vit_tiny":
            net = torchvision.models.VisionTransformer(image_size=224, patch_size=16, num_layers=12, num_heads=3,
                                                       hidden_dim=192, mlp_dim=768, num_classes=args.classes)
        else:
            net = torchvision.models.resnet50(num_classes=args.classes)
        model = net.cuda().to(memory_format=torch.channels_last)
        if world > 1:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
        return model

    if not args.loader_first:
        model = build_model()
    state = json.load(open(args.resume)) if args.resume else None
    options = dict(batch_size=args.batch_size, workers=args.workers, image_size=224, crop="random_resized",
                   flip=True, epochs=args.epochs, device="cuda", dtype="bfloat16", layout="channels_last", seed=0,
                   state=state, decode=args.decode,
                   # every step one shape: a short last batch has the model choose kernels for a new
                   # shape once (0.2 s for a ViT on an H200) and weighs its few images as a full batch
                   drop_last=True)
    options.update(o.split("=", 1) for o in args.option)  # --option decode=cpu wins over --decode's default
    loader = ringfeed.Loader(args.data, **options)
    if args.loader_first:
        model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-5)
    keys = open(args.keys_out.replace("%RANK%", str(rank)), "w") if args.keys_out else None
    step, seen, t0 = 0, 0, time.perf_counter()
    warm, warm_seen, warm_t = 30, 0, None  # the steady rate counts from step 30 on
    done = False
    def held(loader):
        first = next(iter(loader))
        kept = {"image": first["image"].clone(), "label": first["label"].clone(), "key": first["key"]}
        del first
        while True:
            if args.beside:
                loader.next_batch()
            yield kept

    blocks = {"held": [], "fed": []}  # --alternate: each block's images/s
    kinds = []  # --alternate: each step's batch, "held" or "fed" ("" for a block's first, which waits for the GPU)

    def alternating(loader, n):
        """The held batch through the warm-up, then blocks of N steps fed and held in turn; each
        block timed from a GPU with no work left to the end of its last step's work."""
        first = loader.next_batch()
        kept = {"image": first["image"].clone(), "label": first["label"].clone(), "key": first["key"]}
        del first
        for _ in range(warm):
            kinds.append("")
            yield kept
        fed = True
        while True:
            torch.cuda.synchronize()
            t = time.perf_counter()
            for i in range(n):
                batch = loader.next_batch() if fed else kept
                if batch is None:
                    return
                kinds.append(("fed" if fed else "held") if i else "")
                yield batch
                del batch
            torch.cuda.synchronize()
            blocks["fed" if fed else "held"].append(n * args.batch_size / (time.perf_counter() - t))
            fed = not fed

    next_s = 0.0  # the host's time getting batches, from step `warm` on
    step_ms = []  # each step's time from step `warm` on: a few slow ones differ from a slow step
    gc_time = {"ms": 0.0, "runs": [0, 0, 0], "t": 0.0}  # Python's collector, from step `warm` on

    def count_gc(phase, info):
        if phase == "start":
            gc_time["t"] = time.perf_counter()
        elif warm_t is not None:
            gc_time["ms"] += (time.perf_counter() - gc_time["t"]) * 1e3
            gc_time["runs"][info["generation"]] += 1
    gc.callbacks.append(count_gc)
    last_t = None
    warm_wait = None  # the loader's count of the consumer's waits, at step `warm`
    warm_usage = None  # this thread's CPU time and context switches, at step `warm`
    first_step_s = None  # from the arguments read to the end of the first step
    while not done:  # each `for` over the loader is one epoch; none left: it yields nothing
        batches = 0
        it = iter(held(loader) if args.held else alternating(loader, args.alternate) if args.alternate else loader)
        while True:
            t = time.perf_counter()
            batch = next(it, None)
            if step >= warm:
                next_s += time.perf_counter() - t
            if batch is None:
                break
            batches += 1
            # layout=channels_last delivers what the model reads: this copies only under another --option layout
            images = batch["image"].contiguous(memory_format=torch.channels_last)
            labels = batch["label"].clamp_(0, args.classes - 1)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if keys:
                keys.write("\n".join(batch["key"]) + "\n")
            step += 1
            seen += images.shape[0]
            if step == 1:
                torch.cuda.synchronize()
                first_step_s = time.perf_counter() - start
            now = time.perf_counter()
            if warm_t is not None:
                step_ms.append((step, (now - last_t) * 1e3))
            last_t = now
            if step == warm:
                torch.cuda.synchronize()
                warm_seen, warm_t = seen, time.perf_counter()
                warm_wait = loader.stats()["consumer_wait_s"]
                warm_usage = resource.getrusage(resource.RUSAGE_THREAD)
            if step % 50 == 0 and rank == 0:
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                print(f"step {step} loss {loss.item():.3f} {seen * world / dt:.0f} images/s", flush=True)
            if args.steps and step >= args.steps:
                done = True
                break
            del batch  # the slot is the loader's again once the step's queued work has read it
        done = done or batches == 0
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    steady = (seen - warm_seen) / (time.perf_counter() - warm_t) if warm_t and seen > warm_seen else None
    stats = loader.stats()
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    per_step = max(1, step - warm)
    # The training thread's own time: on a CPU (a step that launches kernels runs there) and how
    # often it left it, by waiting (voluntary) or taken off for another thread (involuntary).
    thread = {"thread_cpu_ms_per_step": (usage.ru_utime + usage.ru_stime - warm_usage.ru_utime - warm_usage.ru_stime)
              * 1e3 / per_step,
              "thread_waits_per_step": (usage.ru_nvcsw - warm_usage.ru_nvcsw) / per_step,
              "thread_preempted_per_step": (usage.ru_nivcsw - warm_usage.ru_nivcsw) / per_step} if warm_usage else {}
    gc.callbacks.remove(count_gc)
    slowest = sorted(step_ms, key=lambda s: -s[1])[:6]
    result = {"rank": rank, "world": world, "steps": step, "images": seen, "seconds": dt,
              "images_per_s_per_gpu": seen / dt, "steady_images_per_s_per_gpu": steady,
              "final_loss": float(loss.item()), "decode": args.decode, "model": args.model,
              "decode_backend": stats["decode_backend"], "gpu_share": stats["gpu_share"],
              "gpu_decoded": stats["gpu_decoded"], "cpu_decoded": stats["cpu_decoded"],
              "held": args.held, "beside": args.beside, "loader_first": args.loader_first,
              # the start-up: from the arguments read to the first step's end, and the loader's own
              # times from its open (its first batch taken, nvJPEG ready under decode=auto)
              "first_step_s": first_step_s, "first_batch_ms": stats["first_batch_ms"],
              "open_index_ms": stats["open_index_ms"],  # of it: the shards' index (built at a first open)
              "gpu_decoders_start_ms": stats.get("gpu_decoders_start_ms"),
              "next_ms_per_step": next_s * 1e3 / max(1, step - warm),
              "step_ms": (time.perf_counter() - warm_t) * 1e3 / per_step if warm_t else None, **thread,
              "slowest_steps": [[k, round(ms, 2)] for k, ms in slowest],
              "gc_ms_per_step": gc_time["ms"] / per_step, "gc_runs": gc_time["runs"],
              "bottleneck": stats["bottleneck"], "consumer_wait_frac": stats["consumer_wait_frac"],
              "bottleneck_why": stats["bottleneck_why"], "workers": stats["workers"],
              "workers_active": stats["workers_active"], "parked_s": stats["parked_s"],
              # next()'s time split: the loader's own count of the host waiting for a batch (the
              # rest of next_ms is the binding's work), and the GPU stage's waits and nvJPEG's time
              "loader_wait_ms_per_step": (stats["consumer_wait_s"] - warm_wait) * 1e3 / max(1, step - warm)
              if warm_wait is not None else None,
              **{k: stats[k] for k in ("gpu_stage_wait_consumer_ms", "gpu_stage_wait_workers_ms",
                                       "gpu_decode_host_ms", "gpu_decode_ms", "device_slots") if k in stats}}
    if args.alternate:
        def median(v):
            v = sorted(v)
            return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2 if v else None
        pairs = [f / h for f, h in zip(blocks["fed"], blocks["held"])]
        # each kind's median step, from step to step: what a burst on the host moves least
        steps = {k: median([ms for s, ms in step_ms if s <= len(kinds) and kinds[s - 1] == k]) for k in ("held", "fed")}
        result["alternate"] = {"steps": args.alternate, "fed": [round(v) for v in blocks["fed"]],
                               "held": [round(v) for v in blocks["held"]], "pair_ratios": [round(r, 4) for r in pairs],
                               "median_pair_ratio": median(pairs), "median_step_ms": steps,
                               "ratio_of_median_steps": steps["held"] / steps["fed"] if steps["fed"] else None,
                               "ratio_of_medians": median(blocks["fed"]) / median(blocks["held"])
                               if blocks["fed"] and blocks["held"] else None,
                               # how far the model's own rate moved: a host on which it moves more than
                               # a few percent cannot show a loss of 1%
                               "held_moved": round(max(blocks["held"]) / min(blocks["held"]) - 1, 4)
                               if blocks["held"] else None}
    print(json.dumps(result), flush=True)
    if args.save_state and rank == 0:
        json.dump(loader.state_dict(), open(args.save_state, "w"))
    if keys:
        keys.close()
    loader.close()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
