#!/usr/bin/env python3
"""The kernels of one training step of ResNet-50 (bf16 autocast, channels_last, batch 256, SGD), as
examples/train_imagenet.py runs it, from the PyTorch profiler: how many, and how long. It tells what
a GPU consumer that stands for a model should look like (dlbench --step-ms, --step-kernel-ms): the
loader's GPU work runs between the model's kernels. Prints one JSON object. Needs a CUDA GPU."""

import json
import sys

import torch
import torch.nn.functional as F
import torchvision
from torch.profiler import ProfilerActivity, profile


def main():
    if not torch.cuda.is_available():
        print("model_kernels.py: no CUDA GPU", file=sys.stderr)
        return 77
    model = torchvision.models.resnet50(num_classes=1000).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
    x = torch.randn(256, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(20):  # warm-up: cuDNN's choices, the allocator's pools
        step()
    torch.cuda.synchronize()
    steps = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    us = sorted(getattr(e, "device_time", None) or e.cuda_time for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA
                and "memcpy" not in e.name.lower() and "memset" not in e.name.lower())
    total = sum(us)
    at = lambda f: us[min(len(us) - 1, int(f * len(us)))]
    acc, weighted_median = 0.0, 0.0
    for t in us:  # half of the kernel time is in kernels shorter than this
        acc += t
        if acc >= total / 2:
            weighted_median = t
            break
    print(json.dumps({"kernels_per_step": len(us) / steps, "kernel_ms_per_step": total / steps / 1000,
                      "median_us": at(0.5), "p90_us": at(0.9), "p99_us": at(0.99), "max_us": us[-1],
                      "time_weighted_median_us": weighted_median,
                      "time_share_over_1ms": sum(t for t in us if t > 1000) / total}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
