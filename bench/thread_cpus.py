#!/usr/bin/env python3
"""Which threads a command's thread shared its CPU with: runs the command, looks at its threads in
/proc every few milliseconds, and writes what it saw as JSON.

    bench/thread_cpus.py --watch rf-copy-0 --out cpus.json -- build/dlbench SHARDS --decode hybrid ...

For each thread name (ringfeed names its threads rf-worker-N, rf-copy-N, ...): its time on a CPU and
waiting for one (the kernel's schedstat), and the times it was taken off a CPU it still wanted
(nonvoluntary context switches). For the watched thread: in how many looks it was runnable, and in
how many of those another of the command's threads was runnable on the same CPU, by name. The
command's own output goes where this script's goes.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import time


def look(pid):
    """Each live thread of PID: tid -> (name, state, cpu, run_ns, wait_ns, nonvoluntary switches)."""
    seen = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return seen
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat") as f:
                stat = f.read()
            with open(f"{base}/schedstat") as f:
                run_ns, wait_ns, _ = (int(v) for v in f.read().split())
            with open(f"{base}/status") as f:
                nonvoluntary = next(int(line.split()[1]) for line in f if line.startswith("nonvoluntary_ctxt"))
        except (OSError, ValueError, StopIteration):
            continue  # ended meanwhile
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        after = stat[stat.rindex(")") + 2:].split()
        seen[tid] = (name, after[0], int(after[36]), run_ns, wait_ns, nonvoluntary)
    return seen


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--watch", default="rf-copy-0", help="the thread whose CPU is looked at (default rf-copy-0)")
    p.add_argument("--every-ms", type=float, default=20)
    p.add_argument("--out", required=True, help="the JSON written at the end")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    a = p.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no command given")
    child = subprocess.Popen(cmd)
    last = {}  # tid -> its latest look: the counters of threads that ended stay at their last value
    looks = runnable = 0
    beside = collections.Counter()
    while child.poll() is None:
        now = look(child.pid)
        last.update(now)
        watched = [t for t in now.values() if t[0] == a.watch]
        for name, state, cpu, *_ in watched:
            looks += 1
            if state != "R":
                continue
            runnable += 1
            others = {t[0] for tid, t in now.items() if t[2] == cpu and t[1] == "R" and t[0] != a.watch}
            beside.update(others)
        time.sleep(a.every_ms / 1000)
    per_name = {}
    for name, _, _, run_ns, wait_ns, nonvoluntary in last.values():
        s = per_name.setdefault(name, {"threads": 0, "cpu_ms": 0.0, "cpu_wait_ms": 0.0, "taken_off": 0})
        s["threads"] += 1
        s["cpu_ms"] += run_ns / 1e6
        s["cpu_wait_ms"] += wait_ns / 1e6
        s["taken_off"] += nonvoluntary
    for s in per_name.values():
        s["cpu_ms"], s["cpu_wait_ms"] = round(s["cpu_ms"], 1), round(s["cpu_wait_ms"], 1)
    with open(a.out, "w") as f:
        json.dump({"watch": a.watch, "looks": looks, "runnable": runnable,
                   "runnable_beside": dict(beside.most_common()), "threads": per_name}, f, indent=1)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
