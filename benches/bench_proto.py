"""Building, serialising and parsing a 10,000-op NetDef (issue 12).

    PYTHONPATH=python python benches/bench_proto.py
    PYTHONPATH=python python benches/bench_proto.py --ops 10000 --trials 15
    PYTHONPATH=python python benches/bench_proto.py --compare /tmp/old/python   # another build

Cases, each timed ``--trials`` times, interleaved (one trial of every case,
then the next round), median and range printed:

net     ``core.Net`` op methods build the net (each op: two inputs, one
        output, one argument, as ``net.Add([x, y], "b_i", broadcast=1)``),
        then ``net.Proto().SerializeToString()``. The target: <= 20 ms.
floor   the same NetDef made straight through the protobuf API
        (``net.op.add(type=..., input=..., ...)``) and serialised: what the
        protobuf package costs with no ``core`` on top, the baseline of the
        ratio.
parse   ``caffe2_pb2.NetDef.FromString`` of the serialised net. Target <= 5 ms.
wrap    ``core.Net(netdef)`` of the parsed NetDef (a copy plus the lookup
        tables), for reference.

Printed: ms per case, and net / floor, the price of ``core`` per op relative
to bare protobuf (a ratio measured in the same run, so that load elsewhere on
the machine moves both). ``--compare DIR`` also times the ``net`` case with
the ``ferrocaffe`` package in DIR (e.g. the previous commit's python/ with
its extension) in a child process, interleaved with the others.
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
    result = fn(*args)
    return time.perf_counter() - start, result


def child(n, trials):
    """The ``net`` case alone, for --compare: prints one result line."""
    times = [timed(build_with_core, n)[0] for _ in range(trials)]
    print(MARK + json.dumps(times), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=11)
    parser.add_argument("--compare", help="a directory holding another ferrocaffe package")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.ops, args.trials)

    from ferrocaffe import core
    from ferrocaffe.proto import caffe2_pb2

    n = args.ops
    data = build_with_core(n)  # warm up (imports, registry, caches)
    floor_data = build_floor(n)
    parsed = caffe2_pb2.NetDef.FromString(data)
    assert len(parsed.op) == n and parsed.op[n - 1].output[0] == "b_%d" % (n - 1)
    # Same ops, inputs, outputs and arguments (core names the net uniquely).
    floor = caffe2_pb2.NetDef.FromString(floor_data)
    assert [(o.type, list(o.input), list(o.output), len(o.arg)) for o in parsed.op] == [
        (o.type, list(o.input), list(o.output), len(o.arg)) for o in floor.op]

    times = {"net": [], "floor": [], "parse": [], "wrap": []}
    other = []
    for _ in range(args.trials):
        times["net"].append(timed(build_with_core, n)[0])
        times["floor"].append(timed(build_floor, n)[0])
        times["parse"].append(timed(caffe2_pb2.NetDef.FromString, data)[0])
        times["wrap"].append(timed(core.Net, parsed)[0])
        if args.compare:
            env = dict(os.environ, PYTHONPATH=args.compare)
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--ops", str(n), "--trials", "1"],
                env=env, capture_output=True, text=True, check=True).stdout
            other.extend(json.loads(line[len(MARK):]) for line in out.splitlines()
                         if line.startswith(MARK))
    other = [t for ts in other for t in ts]

    def show(name, ts):
        ms = [t * 1e3 for t in ts]
        print("%-8s median %8.2f ms   range %8.2f - %8.2f ms" % (
            name, statistics.median(ms), min(ms), max(ms)))

    print("%d ops, %d trials, %d bytes serialised, protobuf %s" % (
        n, args.trials, len(data), _protobuf_impl()))
    for name, ts in times.items():
        show(name, ts)
    if other:
        show("compare", other)
    med = {k: statistics.median(v) for k, v in times.items()}
    print("net / floor: %.2fx" % (med["net"] / med["floor"]))
    if other:
        print("compare / net: %.2fx" % (statistics.median(other) / med["net"]))


def _protobuf_impl():
    from google.protobuf.internal import api_implementation

    return api_implementation.Type()


if __name__ == "__main__":
    main()
