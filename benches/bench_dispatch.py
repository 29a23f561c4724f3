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
import os
import statistics
import sys

from dispatch_runner import CASES, interleaved, report, spawn, summary, time_case


def child(case, pin):
    if pin is not None:
        os.sched_setaffinity(0, {pin})       # before any thread starts
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    result, _ = time_case(case)
    report(result)


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

    def run_one(config):
        (_, bpath), case, (_, pin) = config
        extra = ["--pin", str(pin)] if pin is not None else []
        return spawn(__file__, [case] + extra, bpath)["per_unit"]

    configs = [(b, c, p) for b in builds for c in cases for p in placements]
    got = {(b[0], c, p[0]): v for (b, c, p), v in
           interleaved(configs, args.processes, run_one).items()}

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
    sys.exit(main())
