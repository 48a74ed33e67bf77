#!/usr/bin/env python3
"""gputrace.py — where a training step's wall time goes, from a gputrace.c trace (a measurement
script, not part of moe). Steps end at the optimizer's kernels (names holding MARK, default 'adamw').
For each step after the first SKIP: wall time, the union of GPU activity (kernels, copies, memsets),
the idle time, and the GPU's idle gaps (> MIN_US) with the kernels around them and the host's CUDA
calls inside them. usage: gputrace.py TRACE [--skip 2] [--min-us 3] [--mark adamw] [--top 25]"""
import argparse
import collections
import re


def short(name):
    name = re.sub(r"\(.*", "", name)          # drop the argument list of C++ names
    name = re.sub(r"<.*", "", name)
    return name.split()[-1] if name.split() else name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--min-us", type=float, default=3.0)
    ap.add_argument("--mark", default="adamw")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    dev, api = [], []   # (start, end, label)
    for line in open(a.trace):
        p = line.split(" ", 3)
        if len(p) < 4:
            continue
        s, e = int(p[1]), int(p[2])
        if p[0] == "K":
            dev.append((s, e, short(p[3].strip())))
        elif p[0] == "C":
            b, kind = p[3].split()
            dev.append((s, e, "memcpy[%s] %sB" % (kind, b)))
        elif p[0] == "S":
            dev.append((s, e, "memset"))
        elif p[0] == "A":
            api.append((s, e, p[3].strip()))
    dev.sort()
    api.sort()
    marks = [x for x in dev if a.mark in x[2]]
    ends = []   # the end of each step's last optimizer kernel (clusters > 5 ms apart)
    for x in marks:
        if ends and x[0] - ends[-1] < 5e6:
            ends[-1] = max(ends[-1], x[1])
        else:
            ends.append(x[1])
    print("steps found: %d (optimizer kernels '%s': %d)" % (len(ends), a.mark, len(marks)))
    tot = collections.Counter()
    gaps_all = []
    nsteps = 0
    for i in range(max(1, a.skip), len(ends)):
        t0, t1 = ends[i - 1], ends[i]
        acts = [x for x in dev if x[1] > t0 and x[0] < t1]
        busy = 0
        ktime = sum(min(x[1], t1) - max(x[0], t0) for x in acts if not x[2].startswith("mem"))
        gaps = []
        last_end, last_name = t0, "(step start)"
        for s, e, n in acts:
            s, e = max(s, t0), min(e, t1)
            if s > last_end:
                gaps.append((s - last_end, last_end, s, last_name, n))
            if e > last_end:
                busy += e - max(s, last_end)
                last_end, last_name = e, n
        wall = t1 - t0
        print("step %d: wall %.2f ms, GPU busy %.2f ms, kernels (sum) %.2f ms, idle %.2f ms in %d gaps > 0"
              % (i + 1, wall / 1e6, busy / 1e6, ktime / 1e6, (wall - busy) / 1e6, len(gaps)))
        nsteps += 1
        for x in acts:
            tot[x[2]] += min(x[1], t1) - max(x[0], t0)
        gaps_all += [g for g in gaps if g[0] > a.min_us * 1e3]
    if not nsteps:
        return
    # the idle gaps: by the pair of activities around them, and the host calls inside them
    pair = collections.Counter()
    pairn = collections.Counter()
    hosts = collections.Counter()
    for g in gaps_all:
        pair[(g[3], g[4])] += g[0]
        pairn[(g[3], g[4])] += 1
    j = 0
    for g in sorted(gaps_all, key=lambda g: g[1]):
        while j < len(api) and api[j][1] < g[1]:
            j += 1
        k = j
        while k < len(api) and api[k][0] < g[2]:
            s, e, n = api[k]
            hosts[n] += min(e, g[2]) - max(s, g[1])
            k += 1
    idle = sum(g[0] for g in gaps_all)
    print("\nidle in gaps > %.0f us, per step: %.2f ms (%d gaps a step)"
          % (a.min_us, idle / nsteps / 1e6, len(gaps_all) // nsteps))
    print("\nper step, ms  gaps  the activity before -> after the gap")
    for (p, n), t in pair.most_common(a.top):
        print("%8.3f %5d  %s -> %s" % (t / nsteps / 1e6, pairn[(p, n)] // nsteps, p, n))
    print("\nhost CUDA calls inside those gaps (time overlapping them, ms per step)")
    for n, t in hosts.most_common(15):
        print("%8.3f  %s" % (t / nsteps / 1e6, n))
    print("\ndevice activity, ms per step (top %d)" % a.top)
    for n, t in tot.most_common(a.top):
        print("%8.3f  %s" % (t / nsteps / 1e6, n))


if __name__ == "__main__":
    main()
