#!/usr/bin/env python3
"""Where a GPU consumer's stream waited, from a trace of bench/gpu_timeline.c.

    timeline_gaps.py trace.tsv[.gz] [--consumer-kernel step] [--gap-us 5] [--show 6]

The consumer's stream is the one that runs kernels named like --consumer-kernel (dlbench's
--step-ms kernel: "step"). Every gap between its steps longer than --gap-us (what dlbench's gpu_idle_frac
counts; gaps inside a step are only totalled) is put down to one of two causes:
  host   the kernel after the gap was launched after the gap began: the stream had nothing queued;
  gpu    it was queued in time, and the GPU held it: the report names the work on other streams
         that ended last before the gap closed (what the stream's event wait was waiting for).
Then, per stream and per kernel or copy, how long work took and how long it sat between being
ready (launched, and its stream's previous work done) and its start, and how often that wait ended
as a consumer kernel ended: work held back by the consumer's, as when two streams share one of
CUDA's hardware queues (CUDA_DEVICE_MAX_CONNECTIONS). The largest gaps and a few typical ones are
shown with everything that ran around them.
"""
import argparse
import bisect
import collections
import gzip
import sys


def load(path):
    ops, apis, events, syncs = [], {}, [], []
    dropped = 0
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            k = p[0]
            if k == "#":
                dropped += int(p[1].split()[1])
            elif k in ("K", "M", "S"):
                what = p[5] if k == "K" else ("copy %s B kind %s" % (p[5], p[6]) if k == "M" else "memset %s B" % p[5])
                ops.append((int(p[1]), int(p[2]), int(p[3]), int(p[4]), k, what))
            elif k == "E":
                events.append((int(p[1]), int(p[3]), int(p[4]), int(p[5])))
            elif k == "Y":
                syncs.append((int(p[1]), int(p[2]), int(p[3]), int(p[4]), int(p[5]), int(p[6])))
            elif k in ("R", "D"):
                # The runtime call and the driver call under it share a correlation: keep the runtime's name.
                corr = int(p[4])
                rec = (int(p[1]), int(p[2]), int(p[3]), p[5], k)
                if corr not in apis or k == "R":
                    apis[corr] = rec
    return ops, apis, events, syncs, dropped


def short(name, width=48):
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--consumer-kernel", default="step")
    ap.add_argument("--gap-us", type=float, default=5.0)
    ap.add_argument("--show", type=int, default=6)
    a = ap.parse_args()
    ops, apis, events, syncs, dropped = load(a.trace)
    if dropped:
        print("warning: CUPTI dropped %d records" % dropped)
    consumer = collections.Counter(s for (_, _, s, _, k, n) in ops if k == "K" and a.consumer_kernel in n
                                   and "spin" not in n)
    if not consumer:
        sys.exit("no kernel named like %r in %s" % (a.consumer_kernel, a.trace))
    cs = consumer.most_common(1)[0][0]
    mine = sorted(o for o in ops if o[2] == cs)
    others = sorted(o for o in ops if o[2] != cs)
    ends = sorted((o[1], o) for o in others)
    ev_other = sorted(e for e in events if e[1] != cs)
    t0, t1 = mine[0][0], mine[-1][1]
    busy = sum(o[1] - o[0] for o in mine)
    # Gaps between steps (the consumer's stream passes an event there: dlbench records one between
    # steps) are what gpu_idle_frac counts; gaps inside a step are its kernels held up by other work.
    ev_cs = sorted(e[0] for e in events if e[1] == cs)
    gaps, inside = [], []
    for prev, nxt in zip(mine, mine[1:]):
        g = nxt[0] - prev[1]
        if g <= a.gap_us * 1e3:
            continue
        at = bisect.bisect_left(ev_cs, prev[1])
        if not (at < len(ev_cs) and ev_cs[at] < nxt[0]):
            inside.append(g)
            continue
        launch = apis.get(nxt[3])
        host_late = launch is not None and launch[1] > prev[1]
        gaps.append((g, prev, nxt, "host" if host_late else "gpu", launch))
    total = sum(g[0] for g in gaps)
    span = t1 - t0
    print("consumer stream %d: %d kernels over %.1f ms, busy %.1f ms; %d gaps between steps over %.0f us: %.2f ms "
          "(%.4f of the span); %d inside steps: %.2f ms" % (cs, len(mine), span / 1e6, busy / 1e6, len(gaps), a.gap_us,
                                                            total / 1e6, total / span if span else 0, len(inside),
                                                            sum(inside) / 1e6))
    by_cause = collections.defaultdict(lambda: [0, 0])
    closer = collections.defaultdict(lambda: [0, 0, 0])
    end_times = [e for e, _ in ends]
    ev_times = [e[0] for e in ev_other]
    for g, prev, nxt, cause, launch in gaps:
        by_cause[cause][0] += 1
        by_cause[cause][1] += g
        if cause != "gpu":
            continue
        # The last work on another stream to end before the consumer went on, and the last event
        # another stream passed: a stream wait is released by an event record.
        i = bisect.bisect_right(end_times, nxt[0]) - 1
        j = bisect.bisect_right(ev_times, nxt[0]) - 1
        what, at = "nothing", prev[1]
        if i >= 0:
            o = ends[i][1]
            what, at = "stream %d %s" % (o[2], short(o[5], 40)), o[1]
        if j >= 0 and (i < 0 or ev_other[j][0] > ends[i][0]):
            what, at = "stream %d event %d (after %s)" % (ev_other[j][1], ev_other[j][3], what), ev_other[j][0]
        closer[what][0] += 1
        closer[what][1] += g
        closer[what][2] += nxt[0] - at
    for cause, (n, g) in sorted(by_cause.items()):
        print("  %-5s %5d gaps, %8.2f ms" % (cause, n, g / 1e6))
    print("gpu-held gaps, by what ended last before the consumer went on (and how long before, on average):")
    for what, (n, g, lag) in sorted(closer.items(), key=lambda x: -x[1][1])[:12]:
        print("  %5d gaps %8.2f ms  %7.1f us before  %s" % (n, g / 1e6, lag / n / 1e3, what))

    # A consumer kernel is the last of its step when the consumer's stream passes an event before
    # its next kernel (dlbench records one between steps).
    mine_ends = [o[1] for o in mine]
    step_last = []
    for k, o in enumerate(mine):
        at = bisect.bisect_left(ev_cs, o[1])
        step_last.append(k + 1 == len(mine) or (at < len(ev_cs) and ev_cs[at] < mine[k + 1][0]))
    print("\nwork per stream: count, mean run ms, mean ms from ready to start; of those that waited over"
          " 30 us, how many started as a consumer kernel ended (mid-step / last of its step)")
    rows = collections.defaultdict(lambda: [0, 0.0, 0.0, 0, 0, 0])
    prev_end = {}
    for o in sorted(ops):
        api = apis.get(o[3])
        ready = max(api[1] if api else 0, prev_end.get(o[2], 0))
        prev_end[o[2]] = max(prev_end.get(o[2], 0), o[1])
        name = short(o[5]) if o[4] == "K" else ("copy kind %s" % o[5].split()[-1] if o[4] == "M" else "memset")
        r = rows[(o[2], name)]
        r[0] += 1
        r[1] += (o[1] - o[0]) / 1e6
        r[2] += max(0, o[0] - ready) / 1e6
        if o[2] != cs and o[0] - ready > 30_000:
            r[3] += 1
            k = bisect.bisect_right(mine_ends, o[0]) - 1
            if k >= 0 and o[0] - mine_ends[k] < 30_000:
                r[5 if step_last[k] else 4] += 1
    for (s, n), r in sorted(rows.items(), key=lambda x: (x[0][0], -x[1][0])):
        print("  stream %3d %-50s %6d %8.3f %8.3f  %5d waited: %d / %d" % (s, n, r[0], r[1] / r[0], r[2] / r[0],
                                                                          r[3], r[4], r[5]))

    def window(g, prev, nxt, cause, launch):
        lo, hi = prev[1] - 2_000_000, nxt[0] + 100_000
        print("\ngap of %.3f ms at %.3f ms (%s): consumer kernel ended %.3f, next started %.3f%s" % (
            g / 1e6, (prev[1] - t0) / 1e6, cause, (prev[1] - t0) / 1e6, (nxt[0] - t0) / 1e6,
            ", launched %.3f-%.3f on thread %d" % ((launch[0] - t0) / 1e6, (launch[1] - t0) / 1e6, launch[2])
            if launch else ""))
        rows = [(o[0], "gpu  s%-3d %8.3f-%8.3f %s" % (o[2], (o[0] - t0) / 1e6, (o[1] - t0) / 1e6, short(o[5], 60)))
                for o in others if o[1] >= lo and o[0] <= hi]
        rows += [(e[0], "evt  s%-3d %8.3f          event %d" % (e[1], (e[0] - t0) / 1e6, e[3]))
                 for e in events if lo <= e[0] <= hi]
        rows += [(y[0], "wait s%-3d %8.3f-%8.3f host sync type %d event %d" % (
            y[2], (y[0] - t0) / 1e6, (y[1] - t0) / 1e6, y[4], y[5])) for y in syncs if y[1] >= lo and y[0] <= hi]
        for _, r in sorted(rows)[:60]:
            print("  " + r)

    shown = sorted(gaps, key=lambda x: -x[0])[: a.show // 2]
    typical = sorted(gaps, key=lambda x: x[0])
    shown += typical[len(typical) // 2: len(typical) // 2 + a.show - len(shown)]
    for g in shown:
        window(*g)


if __name__ == "__main__":
    main()
