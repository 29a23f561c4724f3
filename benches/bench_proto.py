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
package in DIR (e.g. the previous commit's python/ with its extension), in
a child of its own per trial, alternating with this package's children.
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
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def child(n, reps, only_net):
    """One trial: prints one result line, {case: [seconds per rep]}."""
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
    other = []
    for _ in range(args.trials):
        for name, ts in _child_times(here, n, args.reps).items():
            times.setdefault(name, []).extend(ts)
        if args.compare:
            other.extend(_child_times(args.compare, n, args.reps, only_net=True)["net"])
    load_after = os.getloadavg()

    def ms(ts):
        return min(ts) * 1e3, statistics.median(ts) * 1e3

    print("%d ops, %d child processes x %d rounds, protobuf %s (%s), load average %s -> %s" % (
        n, args.trials, args.reps, _protobuf_version(), _protobuf_impl(),
        "/".join("%.1f" % x for x in load_before), "/".join("%.1f" % x for x in load_after)))
    print("%-16s %9s %9s" % ("case", "min ms", "median ms"))
    for name, ts in times.items():
        print("%-16s %9.2f %9.2f" % ((name,) + ms(ts)))
    if other:
        print("%-16s %9.2f %9.2f" % (("compare: net",) + ms(other)))

    lo = {k: min(v) * 1e3 for k, v in times.items()}
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print()
    print("ratios, same run (min / median):")
    for base in ("parse", "serialise", "floor"):
        print("  net / %-10s %6.2fx %6.2fx" % (base, lo["net"] / lo[base], med["net"] / med[base]))
    print("  the issue's target is 20 ms = %.1fx parse (0.78 ms) = %.1fx serialise (0.66 ms)" % (
        TARGET_MS / ISSUE_PARSE_MS, TARGET_MS / ISSUE_SERIALISE_MS))
    print()
    print("target (build + serialise), medians:")
    print("  absolute   %6.2f ms against %.0f ms: %s" % (
        med["net"], TARGET_MS, "met" if med["net"] <= TARGET_MS else "NOT met"))
    for base, issue_ms in (("parse", ISSUE_PARSE_MS), ("serialise", ISSUE_SERIALISE_MS)):
        equiv = TARGET_MS * med[base] / issue_ms
        print("  by %-9s %6.2f ms against %.1f ms here (%.0f ms x %.2f / %.2f ms): %s" % (
            base, med["net"], equiv, TARGET_MS, med[base], issue_ms,
            "met" if med["net"] <= equiv else "NOT met"))
    print("  parse      %6.2f ms against %.0f ms: %s" % (
        med["parse"], PARSE_TARGET_MS, "met" if med["parse"] <= PARSE_TARGET_MS else "NOT met"))
    if other:
        print("compare / net (medians): %.2fx" % (statistics.median(other) * 1e3 / med["net"]))


def _protobuf_impl():
    from google.protobuf.internal import api_implementation

    return api_implementation.Type()


def _protobuf_version():
    import google.protobuf

    return google.protobuf.__version__


if __name__ == "__main__":
    main()
