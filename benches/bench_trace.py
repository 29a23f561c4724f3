"""What recording a timeline costs: the dispatch workloads of
bench_dispatch.py (W1, N100, W2; benches/workloads.py) timed with no
profile, inside ``ferrocaffe.profile()`` (every op timed) and inside
``ferrocaffe.profile(ops=False)`` (net runs, steps and iterations only),
each in fresh processes, interleaved round by round.

    PYTHONPATH=python python benches/bench_trace.py
    PYTHONPATH=python python benches/bench_trace.py --processes 8 --cases W1,W2

Prints per case and mode the median over processes of each process's
median time per unit, and each mode's ratio to ``off`` measured in the
same run. (What the flag costs when no profile is open is measured by
bench_dispatch.py --compare against the build before it: BENCHMARKS.md.)
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
MODES = ("off", "ops", "nets")


def child(case, mode):
    import contextlib

    import numpy as np

    import ferrocaffe
    from ferrocaffe import core, workspace
    sys.path.insert(0, HERE)
    import workloads

    kind, n, runs, warmup, _ = CASES[case]
    run, value = getattr(workloads, kind)(np, core, workspace, n)
    got = value(run())
    assert abs(got - n) < 0.5, (case, got)
    scope = (contextlib.nullcontext() if mode == "off"
             else ferrocaffe.profile(ops=(mode == "ops")))
    with scope as trace:
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
    events = len(trace.events) if trace is not None else 0
    print(MARK + json.dumps({"per_unit": statistics.median(samples) / n,
                             "events": events}), flush=True)


def spawn(case, mode):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", case, "--mode", mode]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{case}/{mode} failed: {out.stderr[-2000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith(MARK)][-1]
    return json.loads(line[len(MARK):])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child")
    ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--cases", default="W1,N100,W2")
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.mode)
    cases = args.cases.split(",")
    got = {}
    events = {}
    print(f"{len(os.sched_getaffinity(0))} CPUs; {args.processes} fresh processes per case and mode; "
          f"load average at start {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(args.processes):
        order = [(c, m) for c in cases for m in MODES]
        k = r % len(order)
        for case, mode in order[k:] + order[:k]:
            res = spawn(case, mode)
            got.setdefault((case, mode), []).append(res["per_unit"])
            events[(case, mode)] = res["events"]
        print(f"  round {r + 1}/{args.processes} done", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}\n")
    print("| case | mode | median | processes min..max | / off | events recorded |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        unit = CASES[case][4]
        off = statistics.median(got[(case, "off")])
        for mode in MODES:
            vals = got[(case, mode)]
            med = statistics.median(vals)
            print(f"| {case} | {mode} | {med:.1f} {unit} | {min(vals):.1f}..{max(vals):.1f} | "
                  f"{med / off:.3f} | {events[(case, mode)]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
