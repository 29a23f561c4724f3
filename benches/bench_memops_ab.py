"""The memory-bound CNN ops (issue 29) in two or more builds, interleaved in
one run, against a memory-bandwidth baseline measured in the same child.

    python benches/bench_memops_ab.py ROUNDS label=DIR [label=DIR ...]

Each DIR holds a ``ferrocaffe`` package (a copy of ``python/`` with that
build's ``_core.abi3.so``). Every build runs the same workloads on
(8, 64, 112, 112) float32 (25.7 MB): MaxPool and AveragePool (3x3/2 pad 1,
2x2/2, global), MaxPoolGradient, SpatialBN (test and training), Relu, Sum
of 2 inputs and Concat of 2 halves along the channels, each as a net run
many times in one child process per build and round. The baseline is
numpy's ``copyto`` of the same 25.7 MB into a buffer that exists (a read
and a write of every byte: what a Relu or a test-mode SpatialBN must move
at least), timed in each child before its ops. Rounds alternate the builds.
The table shows each build's best time per workload over the rounds, and
that time over the best copy time of that build's children (the copy
ratio: 1 is the memory line of an op that reads and writes X once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import json, time
import numpy as np
from ferrocaffe import core, workspace

rng = np.random.default_rng(0)
def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)

S = (8, 64, 112, 112)
X = f32(*S)
half = (8, 32, 112, 112)
bn = {"X": X, "s": f32(64), "b": f32(64), "m": f32(64), "v": np.abs(f32(64)) + 1}
pooled = np.zeros((8, 64, 56, 56), np.float32)
WORK = {
    "maxpool 3x3/2 pad 1": ("MaxPool", {"X": X}, ["Y"], dict(kernel=3, stride=2, pad=1)),
    "maxpool 2x2/2": ("MaxPool", {"X": X}, ["Y"], dict(kernel=2, stride=2)),
    "avgpool 3x3/2 pad 1": ("AveragePool", {"X": X}, ["Y"], dict(kernel=3, stride=2, pad=1)),
    "global avgpool": ("AveragePool", {"X": X}, ["Y"], dict(global_pooling=1)),
    "maxpool 3x3/2 pad 1 gradient": ("MaxPoolGradient", {"X": X, "Y": pooled, "dY": pooled}, ["dX"],
                                     dict(kernel=3, stride=2, pad=1)),
    "spatialbn test": ("SpatialBN", bn, ["Y"], dict(is_test=1)),
    "spatialbn train": ("SpatialBN", bn, ["Y", "m", "v", "sm", "siv"], dict(is_test=0)),
    "relu": ("Relu", {"X": X}, ["Y"], {}),
    "sum of 2": ("Sum", {"A": X, "B": f32(*S)}, ["Y"], {}),
    "concat 2 halves, axis 1": ("Concat", {"A": f32(*half), "B": f32(*half)}, ["Y", "split"], dict(axis=1)),
}

def best_of(run, seconds=0.3):
    t0 = time.perf_counter(); run(); once = time.perf_counter() - t0
    iters = max(3, min(200, int(seconds / max(once, 1e-6))))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            run()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best

dst = np.empty_like(X)
out = {"numpy copy (baseline)": best_of(lambda: np.copyto(dst, X))}
for name, (op, feeds, outs, args) in WORK.items():
    workspace.ResetWorkspace()
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    net = core.Net("mem_" + op)
    net.Proto().op.extend([core.CreateOperator(op, list(feeds), outs, **args)])
    workspace.CreateNet(net)
    workspace.RunNet(net.Name())
    t0 = time.perf_counter()
    workspace.RunNet(net.Name())
    once = time.perf_counter() - t0
    iters = max(3, min(200, int(0.3 / max(once, 1e-6))))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        workspace.RunNet(net.Name(), iters)
        best = min(best, (time.perf_counter() - t0) / iters)
    out[name] = best
print(json.dumps(out))
"""


def main() -> None:
    rounds = int(sys.argv[1])
    builds = [a.split("=", 1) for a in sys.argv[2:]]
    if not builds:
        raise SystemExit(__doc__)
    best: dict[str, dict[str, float]] = {label: {} for label, _ in builds}
    for r in range(rounds):
        for label, path in builds if r % 2 == 0 else builds[::-1]:
            env = dict(os.environ, PYTHONPATH=path)
            res = json.loads(subprocess.run([sys.executable, "-c", CHILD], env=env, check=True,
                                            capture_output=True, text=True).stdout)
            for k, v in res.items():
                best[label][k] = min(best[label].get(k, float("inf")), v)
    first = builds[0][0]
    labels = [label for label, _ in builds]
    base = "numpy copy (baseline)"
    print(f"load average {os.getloadavg()[0]:.1f}, {rounds} rounds, best ms per run "
          f"(in brackets: over the numpy copy of that build's children; vs {first})")
    print("| workload | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for k in best[first]:
        cells = [f"{best[first][k] * 1e3:.2f} ({best[first][k] / best[first][base]:.1f} copies)"]
        cells += [f"{best[lb][k] * 1e3:.2f} ({best[lb][k] / best[lb][base]:.1f} copies; "
                  f"{best[lb][k] / best[first][k]:.2f}x)" for lb in labels[1:]]
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
