"""Two or more builds of ferrocaffe on the same ops, interleaved in one run.

    PYTHONPATH=python python benches/bench_ops_ab.py ROUNDS label=DIR [label=DIR ...]

Each DIR holds a ``ferrocaffe`` package (a copy of ``python/`` with that
build's ``_core.abi3.so``). For a refactor that must leave speed alone
(issue 33: ops moved by concept, one numeric trait), every build runs the
same workloads: convolutions (3x3 stride 1, 1x1, a strided 7x7), pooling,
SpatialBN, Relu, Sigmoid, Tanh and Exp (issue 30), an LSTM and a GRU cell,
Add with broadcasting, Softmax, FC and a SumReduce, each as a net run many times in one child process per build and
round. Rounds alternate the builds, so load elsewhere on the machine lands
on all of them; the table shows each build's best time per workload over the
rounds and its ratio to the first build (< 1: faster than the first).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
from ferrocaffe import core, workspace

rng = np.random.default_rng(0)
def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)

WORK = {
    "conv3x3 (8,64,56,56)": ("Conv", {"X": f32(8, 64, 56, 56), "W": f32(64, 64, 3, 3), "b": f32(64)},
                             dict(kernel=3, pad=1)),
    "conv1x1 (8,256,28,28)->128": ("Conv", {"X": f32(8, 256, 28, 28), "W": f32(128, 256, 1, 1), "b": f32(128)},
                                   dict(kernel=1)),
    "conv7x7/2 (4,3,224,224)": ("Conv", {"X": f32(4, 3, 224, 224), "W": f32(64, 3, 7, 7), "b": f32(64)},
                                dict(kernel=7, stride=2, pad=3)),
    "maxpool3/2 (8,64,112,112)": ("MaxPool", {"X": f32(8, 64, 112, 112)}, dict(kernel=3, stride=2, pad=1)),
    "spatialbn test (8,64,112,112)": ("SpatialBN", {"X": f32(8, 64, 112, 112), "s": f32(64), "b": f32(64),
                                                     "m": f32(64), "v": np.abs(f32(64)) + 1},
                                      dict(is_test=1)),
    "relu (8,64,112,112)": ("Relu", {"X": f32(8, 64, 112, 112)}, {}),
    "sigmoid (4M)": ("Sigmoid", {"X": f32(1 << 22)}, {}),
    "tanh (4M)": ("Tanh", {"X": f32(1 << 22)}, {}),
    "exp (4M)": ("Exp", {"X": f32(1 << 22)}, {}),
    "lstm unit (1,64,512)": ("LSTMUnit", {"H": f32(1, 64, 512), "C": f32(1, 64, 512), "G": f32(1, 64, 2048),
                                          "T": np.array([0], np.int32)},
                             dict(sequence_lengths=False), ["Ht", "Ct"]),
    "gru unit (1,64,512)": ("GRUUnit", {"H": f32(1, 64, 512), "G": f32(1, 64, 1536),
                                        "T": np.array([0], np.int32)},
                            dict(sequence_lengths=False)),
    "add broadcast (256,1024)+(1024)": ("Add", {"A": f32(256, 1024), "B": f32(1024)}, dict(broadcast=1)),
    "softmax (512,1000)": ("Softmax", {"X": f32(512, 1000)}, {}),
    "fc (64,1024)x(1024,1024)": ("FC", {"X": f32(64, 1024), "W": f32(1024, 1024), "b": f32(1024)}, {}),
    "reduce sum (64,4096) axis 1": ("ReduceSum", {"X": f32(64, 4096)}, dict(axes=[1], keepdims=0)),
}

out = {}
for name, (op, feeds, args, *outs) in WORK.items():
    workspace.ResetWorkspace()
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    net = core.Net("ab_" + op)
    net.Proto().op.extend([core.CreateOperator(op, list(feeds), outs[0] if outs else ["Y"], **args)])
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
    print(f"load average {os.getloadavg()[0]:.1f}, {rounds} rounds, best ms per run")
    print("| workload | " + " | ".join(labels) + " |")
    print("|---" * (len(labels) + 1) + "|")
    for k in best[first]:
        cells = [f"{best[first][k] * 1e3:.2f}"]
        cells += [f"{best[label][k] * 1e3:.2f} ({best[label][k] / best[first][k]:.2f}x)" for label in labels[1:]]
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
