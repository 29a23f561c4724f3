"""Dispatch cost with and without a spare core (issue 18), in fresh processes.

    PYTHONPATH=python python benches/bench_dispatch.py
    PYTHONPATH=python python benches/bench_dispatch.py --processes 8 --cases W1,N100,W2
    PYTHONPATH=python python benches/bench_dispatch.py --compare /tmp/old   # another build, interleaved

Cases (benches/workloads.py, shared/peerbench's definitions; a run is feed
x = 0, run, fetch x):

W1    a created net of 1000 scalar float32 Adds, ``Workspace.run_net``;
      ns/op = median over 200 runs of one run's time / 1000.
N100  the same with 100 Adds (2000 runs): the fixed cost of a run weighs 10x
      more per op.
W2    a plan whose one step runs a 1-op net 100,000 times (5 runs); ns/iter.

Each case runs in ``--processes`` fresh processes per placement: ``pinned``
(the process and every thread it starts on one CPU, as ``taskset -c 0``:
a container with one CPU, a Ray actor with ``num_cpus=1``) and ``free``
(every CPU this script may use). Processes of all cases, placements and
builds are interleaved, so a burst of load elsewhere on the machine lands
on all of them. Printed per case and placement: the median over processes,
their range, and the largest distance of a process from the median; then
pinned / free per case (the issue's targets: N100 <= 2x, W1 <= 1.2x) and,
with ``--compare``, this build / the other one.

``--compare DIR``: DIR holds another ``ferrocaffe`` package (a copy of
python/ferrocaffe with its extension, e.g. a build of the previous commit);
its processes run with ``PYTHONPATH=DIR``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = "RESULT "

CASES = {
    # name: (workload, size, timed runs, warmup runs, unit)
    "W1": ("chain", 1000, 200, 20, "ns/op"),
    "N100": ("chain", 100, 2000, 200, "ns/op"),
    "W2": ("loop", 100_000, 5, 1, "ns/iter"),
}


def child(case, pin):
    if pin is not None:
        os.sched_setaffinity(0, {pin})       # before any thread starts
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy as np
    from ferrocaffe import core, workspace
    sys.path.insert(0, HERE)
    import workloads

    kind, n, runs, warmup, _ = CASES[case]
    run, value = getattr(workloads, kind)(np, core, workspace, n)
    got = value(run())
    assert abs(got - n) < 0.5, (case, got)
    for _ in range(warmup):
        run()
    gc.collect()
    gc.disable()
    clock = time.perf_counter_ns
    samples = []
    for _ in range(runs):
        t0 = clock()
        run()
        samples.append(clock() - t0)
    gc.enable()
    print(MARK + json.dumps({"per_unit": statistics.median(samples) / n,
                             "best": min(samples) / n}), flush=True)


def spawn(build_path, case, pin):
    env = dict(os.environ)
    if build_path:
        env["PYTHONPATH"] = os.pathsep.join([build_path] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, os.path.abspath(__file__), "--child", case]
    if pin is not None:
        cmd += ["--pin", str(pin)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{case} failed: {out.stderr[-2000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith(MARK)][-1]
    return json.loads(line[len(MARK):])["per_unit"]


def summary(values):
    med = statistics.median(values)
    worst = max(abs(v / med - 1) for v in values)
    return med, min(values), max(values), worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child")
    ap.add_argument("--pin", type=int)
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--cases", default="W1,N100,W2")
    ap.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)),
                    help="the CPU of the pinned processes")
    ap.add_argument("--compare", help="a directory holding another ferrocaffe package")
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.pin)

    cases = args.cases.split(",")
    builds = [("this", None)] + ([("other", os.path.abspath(args.compare))] if args.compare else [])
    placements = [("pinned", args.cpu), ("free", None)]
    got = {}
    print(f"{len(os.sched_getaffinity(0))} CPUs; {args.processes} fresh processes per case, placement and build; "
          f"load average at start {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(args.processes):
        # Rotate the order from round to round, so no configuration always
        # runs first (or right after the same neighbour).
        order = [(b, c, p) for b in builds for c in cases for p in placements]
        k = r % len(order)
        for (bname, bpath), case, (pname, pin) in order[k:] + order[:k]:
            got.setdefault((bname, case, pname), []).append(spawn(bpath, case, pin))
        print(f"  round {r + 1}/{args.processes} done", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}\n")

    print("| build | case | placement | median | processes min..max | worst distance from median |")
    print("|---|---|---|---|---|---|")
    for bname, _ in builds:
        for case in cases:
            unit = CASES[case][4]
            for pname, _ in placements:
                med, lo, hi, worst = summary(got[(bname, case, pname)])
                print(f"| {bname} | {case} | {pname} | {med:.1f} {unit} | {lo:.1f}..{hi:.1f} | {worst * 100:.0f}% |")
    print()
    for bname, _ in builds:
        ratios = []
        for case in cases:
            pinned = statistics.median(got[(bname, case, "pinned")])
            free = statistics.median(got[(bname, case, "free")])
            ratios.append(f"{case} {pinned / free:.2f}x")
        print(f"{bname}: pinned / free: " + ", ".join(ratios) + "   (targets: N100 <= 2x, W1 <= 1.2x)")
    if args.compare:
        for case in cases:
            parts = []
            for pname, _ in placements:
                a = statistics.median(got[("this", case, pname)])
                b = statistics.median(got[("other", case, pname)])
                parts.append(f"{pname} {a / b:.2f}x")
            print(f"this / other, {case}: " + ", ".join(parts))


if __name__ == "__main__":
    main()
