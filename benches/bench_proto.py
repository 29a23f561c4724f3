"""Building, serialising and parsing a 10,000-op NetDef (issue 12).

    PYTHONPATH=python python benches/bench_proto.py
    PYTHONPATH=python python benches/bench_proto.py --ops 10000 --trials 21
    PYTHONPATH=python python benches/bench_proto.py --compare /tmp/old/python   # another build

Every trial is a fresh child process (a process that has built many nets
pays more for garbage collection, and a shared machine moves a long-lived
process's figures together): it builds the net once to warm up (imports,
registry, caches), then times ``--reps`` interleaved rounds of the cases
below; the parent prints each case's minimum and median over every trial.

net        ``core.Net`` op methods build the net (each op: two inputs, one
           output, one argument, as ``net.Add([x, y], "b_i", broadcast=1)``),
           then ``net.Proto().SerializeToString()``. The issue's target:
           <= 20 ms.
floor      the same NetDef made straight through the protobuf API
           (``net.op.add(type=..., input=..., ...)``) and serialised: what
           the protobuf package costs with no ``core`` on top.
parse      ``caffe2_pb2.NetDef.FromString`` of that NetDef (upb). Target
           <= 5 ms; also a baseline (below).
serialise  ``SerializeToString`` of the parsed NetDef (upb): a baseline.
wrap       ``core.Net(netdef)`` of the parsed NetDef (a copy plus the
           lookup tables), for reference.

The issue's 20 ms was set on a machine where upb parsed this NetDef in
0.78 ms and serialised it in 0.66 ms, i.e. 20 ms is 25.6x that parse and
30.3x that serialise. Measured here in the same run on the same NetDef,
those baselines turn the target into this machine's equivalent (20 ms x
parse here / 0.78 ms, and likewise for serialise), and ``net / parse``,
``net / serialise`` and ``net / floor`` are printed beside the absolute
times. ``--compare DIR`` also times the ``net`` case with the ``ferrocaffe``
package in DIR (e.g. the previous commit's python/ with its extension) and
with this one, in children that run only that case (``net (alone)``: a
child that runs every case has more on its heap, so its ``net`` is slower),
alternating.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MARK = "RESULT "

# The issue's machine: upb's parse and serialise of this NetDef, and the
# target for building and serialising it through core.Net.
ISSUE_PARSE_MS = 0.78
ISSUE_SERIALISE_MS = 0.66
TARGET_MS = 20.0
PARSE_TARGET_MS = 5.0


def build_with_core(n):
    from ferrocaffe import core

    net = core.Net("bench")
    x = net.AddExternalInput("x")
    b = x
    for i in range(n):
        b = net.Add([b, x], "b_%d" % i, broadcast=1)
    return net.Proto().SerializeToString()


def build_floor(n):
    from ferrocaffe.proto import caffe2_pb2

    net = caffe2_pb2.NetDef(name="bench", external_input=["x"])
    prev = "x"
    for i in range(n):
        out = "b_%d" % i
        op = net.op.add(type="Add", input=[prev, "x"], output=[out], name="")
        op.arg.add(name="broadcast", i=1)
        prev = out
    return net.SerializeToString()


def timed(fn, *args):
    """(wall seconds, CPU seconds of this process) of ``fn(*args)``."""
    start, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - start, time.process_time() - cpu


def child(n, reps, only_net):
    """One trial: prints one result line, {case: [[wall, cpu] per rep]}."""
    data = build_with_core(n)  # warm up
    if only_net:
        print(MARK + json.dumps({"net": [timed(build_with_core, n) for _ in range(reps)]}),
              flush=True)
        return
    from ferrocaffe import core
    from ferrocaffe.proto import caffe2_pb2

    floor_data = build_floor(n)
    parsed = caffe2_pb2.NetDef.FromString(data)
    assert len(parsed.op) == n and parsed.op[n - 1].output[0] == "b_%d" % (n - 1)
    # Same ops, inputs, outputs and arguments (core names the net uniquely).
    floor = caffe2_pb2.NetDef.FromString(floor_data)
    assert [(o.type, list(o.input), list(o.output), len(o.arg)) for o in parsed.op] == [
        (o.type, list(o.input), list(o.output), len(o.arg)) for o in floor.op]
    cases = {
        "net": lambda: build_with_core(n),
        "floor": lambda: build_floor(n),
        "parse": lambda: caffe2_pb2.NetDef.FromString(data),
        "serialise": lambda: parsed.SerializeToString(),
        "wrap": lambda: core.Net(parsed),
    }
    times = {name: [] for name in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            times[name].append(timed(fn))
    print(MARK + json.dumps(times), flush=True)


def _child_times(package_dir, n, reps, only_net=False):
    env = dict(os.environ, PYTHONPATH=package_dir)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--ops", str(n),
           "--reps", str(reps)] + (["--only-net"] if only_net else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise RuntimeError("no result from the child: %r" % out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=15, help="child processes")
    parser.add_argument("--reps", type=int, default=3, help="rounds per child")
    parser.add_argument("--compare", help="a directory holding another ferrocaffe package")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only-net", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.ops, args.reps, args.only_net)

    import ferrocaffe

    here = os.path.dirname(os.path.dirname(os.path.abspath(ferrocaffe.__file__)))
    n = args.ops
    load_before = os.getloadavg()
    times = {}
    mine, other = [], []
    for _ in range(args.trials):
        for name, ts in _child_times(here, n, args.reps).items():
            times.setdefault(name, []).extend(ts)
        if args.compare:
            # Children that time only the net case (a child that also runs
            # the other cases has more on its heap), this package's and the
            # other's alternately.
            mine.extend(_child_times(here, n, args.reps, only_net=True)["net"])
            other.extend(_child_times(args.compare, n, args.reps, only_net=True)["net"])
    if other:
        times["net (alone)"] = mine
        times["compare: net"] = other
    load_after = os.getloadavg()

    # ms[clock][stat][case], clock 0 wall, 1 CPU; stat "min" or "median"
    ms = [{stat: {name: f([t[clock] for t in ts]) * 1e3 for name, ts in times.items()}
           for stat, f in (("min", min), ("median", statistics.median))}
          for clock in (0, 1)]
    print("%d ops, %d child processes x %d rounds, protobuf %s (%s), load average %s -> %s" % (
        n, args.trials, args.reps, _protobuf_version(), _protobuf_impl(),
        "/".join("%.1f" % x for x in load_before), "/".join("%.1f" % x for x in load_after)))
    if n != 10_000:
        print("(the absolute targets are for 10,000 ops)")
    print("%-14s %10s %10s %10s %10s" % ("case, ms", "wall min", "wall med", "CPU min", "CPU med"))
    for name in times:
        print("%-14s %10.2f %10.2f %10.2f %10.2f" % (
            name, ms[0]["min"][name], ms[0]["median"][name],
            ms[1]["min"][name], ms[1]["median"][name]))

    print()
    print("net / baseline, same run:  wall min  wall med   CPU min   CPU med")
    for base in ("parse", "serialise", "floor"):
        print("  net / %-10s        " % base + "".join(
            "%9.2fx" % (ms[c][st]["net"] / ms[c][st][base])
            for c in (0, 1) for st in ("min", "median")))
    if other:
        print("  compare / net (alone)   " + "".join(
            "%9.2fx" % (ms[c][st]["compare: net"] / ms[c][st]["net (alone)"])
            for c in (0, 1) for st in ("min", "median")))
    print("  (the issue's 20 ms is %.1fx its parse, 0.78 ms, and %.1fx its serialise, 0.66 ms)" % (
        TARGET_MS / ISSUE_PARSE_MS, TARGET_MS / ISSUE_SERIALISE_MS))
    print()
    print("targets (build + serialise <= 20 ms; parse <= 5 ms):")
    for clock, label in ((1, "CPU"), (0, "wall")):
        for st in ("median", "min"):
            m = ms[clock][st]
            line = ["%s %s: net %.2f ms" % (label, st, m["net"]),
                    "absolute 20 ms %s" % ("met" if m["net"] <= TARGET_MS else "NOT met")]
            for base, issue_ms in (("parse", ISSUE_PARSE_MS), ("serialise", ISSUE_SERIALISE_MS)):
                equiv = TARGET_MS * m[base] / issue_ms
                line.append("by %s %.1f ms %s" % (
                    base, equiv, "met" if m["net"] <= equiv else "NOT met"))
            line.append("parse %.2f ms %s" % (
                m["parse"], "met" if m["parse"] <= PARSE_TARGET_MS else "NOT met"))
            print("  " + "; ".join(line))


def _protobuf_impl():
    from google.protobuf.internal import api_implementation

    return api_implementation.Type()


def _protobuf_version():
    import google.protobuf

    return google.protobuf.__version__


if __name__ == "__main__":
    main()
