#!/usr/bin/env python3
"""Where a training step's time goes beside the loader, from traces of bench/gpu_timeline.c.

    train_timeline.py held.tsv fed.tsv [--skip 0.4]

Each trace is one examples/train_imagenet.py run. The model's stream is the one whose kernels
took the most GPU time; its thread is the host thread that launched most of them. The first
--skip of the model's span (start-up, cuDNN's choices) is left out. For each run it prints the
model stream's span, busy time and idle gaps, each gap put down to the host (the kernel after it
was launched after the gap began) or to the GPU (it was queued: held by a wait or by other work);
the other streams' kernels and how much of them ran while a model kernel did; copies; and the
model thread's time in calls that can wait for the GPU (synchronisations, copies, queries). Side by
side, the difference says what the fed run pays that the held one does not.
"""
import argparse
import bisect
import collections
import gzip

# Calls of the model thread that can wait for the GPU: synchronisations, copies (a pageable or
# device-to-host one waits), and the queries that poll it.
WAITS = ("Synchronize", "Memcpy", "Query")


def load(path):
    kernels, copies, apis = [], [], {}
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if p[0] == "K":
                kernels.append((int(p[1]), int(p[2]), int(p[3]), int(p[4]), p[5]))
            elif p[0] == "M":
                copies.append((int(p[1]), int(p[2]), int(p[3]), int(p[5]), p[6]))
            elif p[0] in ("R", "D"):
                corr = int(p[4])
                if corr not in apis or p[0] == "R":
                    apis[corr] = (int(p[1]), int(p[2]), int(p[3]), p[5])
    return kernels, copies, apis


def overlap(a, b):
    """Total time of intervals A that lies inside intervals B (both sorted lists of (start, end))."""
    total, j = 0, 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            total += max(0, min(e, b[k][1]) - max(s, b[k][0]))
            k += 1
    return total


def summary(path, skip):
    kernels, copies, apis = load(path)
    by_stream = collections.Counter()
    for s, e, st, _, _ in kernels:
        by_stream[st] += e - s
    model = by_stream.most_common(1)[0][0]
    mine = sorted(k for k in kernels if k[2] == model)
    t0 = mine[0][0] + int((mine[-1][1] - mine[0][0]) * skip)
    t1 = mine[-1][1]
    mine = [k for k in mine if k[0] >= t0]
    threads = collections.Counter(apis[k[3]][2] for k in mine if k[3] in apis)
    thread = threads.most_common(1)[0][0]
    busy = sum(e - s for s, e, _, _, _ in mine)
    gaps = {"host": [0, 0], "gpu": [0, 0]}
    late = []  # the host-late gaps: (start, end)
    late_before = collections.Counter()  # their time by the kernel that ended them
    for prev, nxt in zip(mine, mine[1:]):
        g = nxt[0] - prev[1]
        if g <= 0:
            continue
        launch = apis.get(nxt[3])
        cause = "host" if launch is not None and launch[1] > prev[1] else "gpu"
        gaps[cause][0] += 1
        gaps[cause][1] += g
        if cause == "host":
            late.append((prev[1], nxt[0]))
            late_before[nxt[4][:60]] += g
    # What the model thread was in while the model's stream idled for it: each of its calls' share
    # of the host-late gaps, and the rest (Python, the loader's binding, the framework's host code).
    calls = sorted((s, e, n) for s, e, th, n in apis.values() if th == thread and e >= t0 and s <= t1)
    starts = [c[0] for c in calls]
    in_late = collections.Counter()
    for gs, ge in late:
        i = max(0, bisect.bisect_left(starts, gs) - 1)
        covered = 0
        while i < len(calls) and calls[i][0] < ge:
            o = max(0, min(ge, calls[i][1]) - max(gs, calls[i][0]))
            in_late[calls[i][2]] += o
            covered += o
            i += 1
        in_late["(no CUDA call)"] += (ge - gs) - covered
    spans = [(s, e) for s, e, _, _, _ in mine]
    other = sorted((s, e) for s, e, st, _, _ in kernels if st != model and s >= t0 and e <= t1)
    names = collections.Counter()
    for s, e, st, _, n in kernels:
        if st != model and s >= t0 and e <= t1:
            names[n[:60]] += e - s
    cp = [c for c in copies if c[0] >= t0 and c[1] <= t1]
    waits = collections.defaultdict(lambda: [0, 0])
    for s, e, th, n in apis.values():
        if th == thread and s >= t0 and e <= t1 and any(w in n for w in WAITS):
            waits[n][0] += 1
            waits[n][1] += e - s
    # Every call of the model thread in the window, by time: what a step costs its host thread.
    thread_calls = collections.defaultdict(lambda: [0, 0])
    for s, e, th, n in apis.values():
        if th == thread and s >= t0 and e <= t1:
            thread_calls[n][0] += 1
            thread_calls[n][1] += e - s
    # Host launch pace: how far ahead of the GPU the model thread was when each kernel was launched.
    ahead = sorted(k[0] - apis[k[3]][1] for k in mine if k[3] in apis)
    span = t1 - t0
    return {
        "span_ms": span / 1e6, "busy_ms": busy / 1e6, "kernels": len(mine),
        "idle_host_ms": gaps["host"][1] / 1e6, "idle_host_gaps": gaps["host"][0],
        "idle_gpu_ms": gaps["gpu"][1] / 1e6, "idle_gpu_gaps": gaps["gpu"][0],
        "other_kernels_ms": sum(e - s for s, e in other) / 1e6,
        "other_during_model_ms": overlap(other, spans) / 1e6,
        "other_top": [(n, round(t / 1e6, 2)) for n, t in names.most_common(4)],
        "copies": len(cp), "copy_ms": sum(c[1] - c[0] for c in cp) / 1e6,
        "copy_during_model_ms": overlap(sorted((c[0], c[1]) for c in cp), spans) / 1e6,
        "thread_waits": {n: (c, round(t / 1e6, 2)) for n, (c, t) in waits.items()},
        "late_in": [(n, round(t / 1e6, 2)) for n, t in in_late.most_common(6)],
        "late_before": [(n, round(t / 1e6, 2)) for n, t in late_before.most_common(6)],
        "largest_late_ms": sorted(round((e - s) / 1e6, 3) for s, e in late)[-8:],
        "thread_calls": {n: (c, t / 1e6) for n, (c, t) in thread_calls.items()},
        "launch_ahead_ms_p10_p50": (ahead[len(ahead) // 10] / 1e6, ahead[len(ahead) // 2] / 1e6) if ahead else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--skip", type=float, default=0.4)
    a = ap.parse_args()
    runs = []
    for path in a.traces:
        r = summary(path, a.skip)
        runs.append(r)
        print("%s: model stream %.1f ms, busy %.4f of it (%d kernels, %.2f us each); idle %.2f ms host-late in %d gaps, %.2f ms "
              "GPU-held in %d; other streams' kernels %.2f ms (%.2f ms beside the model's); copies %d, %.2f ms "
              "(%.2f ms beside the model's); launches ahead of the GPU p10/p50 %s ms" % (
                  path, r["span_ms"], r["busy_ms"] / r["span_ms"], r["kernels"], r["busy_ms"] * 1e3 / r["kernels"],
                  r["idle_host_ms"],
                  r["idle_host_gaps"], r["idle_gpu_ms"], r["idle_gpu_gaps"], r["other_kernels_ms"],
                  r["other_during_model_ms"], r["copies"], r["copy_ms"], r["copy_during_model_ms"],
                  r["launch_ahead_ms_p10_p50"]))
        print("  other streams' kernels by time: %s" % r["other_top"])
        print("  the model thread's calls that can wait for the GPU (count, ms): %s" % r["thread_waits"])
        print("  the model thread, while the model's stream waited for it: %s" % r["late_in"])
        print("  the kernels that ended those waits, by their time: %s" % r["late_before"])
        print("  the largest of those waits, ms: %s" % r["largest_late_ms"])
    if len(runs) == 2:  # held, fed: the calls the fed run's model thread makes more of, a second
        held, fed = runs
        per_s = [1e3 / r["span_ms"] for r in runs]
        rows = []
        for n, (c, t) in fed["thread_calls"].items():
            hc, ht = held["thread_calls"].get(n, (0, 0.0))
            rows.append((t * per_s[1] - ht * per_s[0], n, c * per_s[1] - hc * per_s[0]))
        rows.sort(reverse=True)
        print("the model thread's calls, fed against held, a second of the model stream (ms more, calls more): %s" % [
            (n, round(dt, 2), round(dc, 1)) for dt, n, dc in rows[:10]])


if __name__ == "__main__":
    main()
