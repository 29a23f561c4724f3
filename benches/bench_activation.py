"""The elementwise activation and math ops (the table of ops/unary.rs: issue
21's rows, and Relu and Sigmoid, issue 14's, for comparison) against numpy's expression of the same
function, float32, in one process, alternating trials.

    PROFILE=release bash scripts/dev_build.sh
    PYTHONPATH=python python benches/bench_activation.py [N] [REPS]

N elements (default 2^20), REPS trials per side (default 7), each timing 20
calls; each side keeps its best trial. An op runs as a net of one op
(``workspace.RunNet``), numpy allocates its result as the op does. Printed:
ms per call of both and the ratio ours / numpy (1.0 = as fast as numpy;
above 1 slower).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from ferrocaffe import core, workspace

CALLS = 20


def cases(x):
    return [
        ("Relu", {}, lambda: np.maximum(x, 0)),
        ("Sigmoid", {}, lambda: 1 / (1 + np.exp(-x))),
        ("Elu", {}, lambda: np.where(x < 0, np.expm1(x), x)),
        ("ReluN", {}, lambda: np.clip(x, 0, 6)),
        ("Sqr", {}, lambda: x * x),
        ("Swish", {}, lambda: x / (1 + np.exp(-x))),
        ("Softsign", {}, lambda: x / (1 + np.abs(x))),
        ("Sin", {}, lambda: np.sin(x)),
        ("Log1p", {}, lambda: np.log1p(np.abs(x))),
    ]


def best(f, reps):
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(CALLS):
            f()
        times.append((time.perf_counter() - t) / CALLS)
    return min(times)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    workspace.FeedBlob("x", x)
    print(f"{n} float32 elements, best of {reps} trials of {CALLS} calls")
    print(f"{'op':10s} {'ours ms':>9s} {'numpy ms':>9s} {'ours/numpy':>10s}")
    for op_type, args, ref in cases(x):
        net = core.Net("bench_" + op_type)
        net.Proto().op.extend([core.CreateOperator(op_type, ["x"], ["y"], **args)])
        workspace.CreateNet(net)
        name = net.Proto().name
        ours_t, numpy_t = float("inf"), float("inf")
        for _ in range(reps):  # alternate, so load changes hit both sides
            ours_t = min(ours_t, best(lambda: workspace.RunNet(name), 1))
            numpy_t = min(numpy_t, best(ref, 1))
        print(f"{op_type:10s} {ours_t * 1e3:9.3f} {numpy_t * 1e3:9.3f} {ours_t / numpy_t:10.2f}")


if __name__ == "__main__":
    main()
