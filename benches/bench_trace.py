"""What recording a timeline costs: the dispatch workloads of
bench_dispatch.py (W1, N100, W2; benches/workloads.py, run by
benches/dispatch_runner.py) timed with no profile, inside
``ferrocaffe.profile()`` (every op timed) and inside
``ferrocaffe.profile(ops=False)`` (net runs, steps and iterations only),
each in fresh processes, interleaved round by round.

    PYTHONPATH=python python benches/bench_trace.py
    PYTHONPATH=python python benches/bench_trace.py --processes 8 --cases W1,W2
    PYTHONPATH=python python benches/bench_trace.py --compare /tmp/old   # another build too

Prints per build, case and mode the median over processes of each
process's median time per unit, and each mode's ratio to ``off`` of the
same build, measured in the same run. (What the flag costs when no
profile is open is measured by bench_dispatch.py --compare against the
build before it: BENCHMARKS.md.)

``--compare DIR``: DIR holds another ``ferrocaffe`` package (a copy of
python/ferrocaffe with its extension); its processes run with
``PYTHONPATH=DIR``, interleaved with this build's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from dispatch_runner import CASES, interleaved, report, spawn, summary, time_case

MODES = ("off", "ops", "nets")


def child(case, mode):
    import ferrocaffe

    scope = None if mode == "off" else ferrocaffe.profile(ops=(mode == "ops"))
    result, trace = time_case(case, scope)
    result["events"] = len(trace.events) if trace is not None else 0
    report(result)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child")
    ap.add_argument("--mode", choices=MODES)
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--cases", default="W1,N100,W2")
    ap.add_argument("--compare", help="a directory holding another ferrocaffe package")
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.mode)
    cases = args.cases.split(",")
    builds = [("this", None)] + ([("other", os.path.abspath(args.compare))] if args.compare else [])
    events = {}

    def run_one(config):
        (bname, bpath), case, mode = config
        res = spawn(__file__, [case, "--mode", mode], bpath)
        events[(bname, case, mode)] = res["events"]
        return res["per_unit"]

    configs = [(b, c, m) for b in builds for c in cases for m in MODES]
    got = {(b[0], c, m): v for (b, c, m), v in
           interleaved(configs, args.processes, run_one).items()}
    print("| build | case | mode | median | processes min..max | / off | events recorded |")
    print("|---|---|---|---|---|---|---|")
    for bname, _ in builds:
        for case in cases:
            unit = CASES[case][4]
            off = statistics.median(got[(bname, case, "off")])
            for mode in MODES:
                med, lo, hi, _ = summary(got[(bname, case, mode)])
                print(f"| {bname} | {case} | {mode} | {med:.1f} {unit} | {lo:.1f}..{hi:.1f} | "
                      f"{med / off:.3f} | {events[(bname, case, mode)]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
