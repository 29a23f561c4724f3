"""Our MatMul op against numpy's matmul (issue 14): float32 C = A * B.

    PROFILE=release bash scripts/dev_build.sh
    PYTHONPATH=python python benches/bench_gemm.py [REPS]

For each thread count (1 and 2) two children run side by side: numpy
(OpenBLAS, started with OPENBLAS_NUM_THREADS, since OpenBLAS fixes its
threads at load) and ferrocaffe (started with RAYON_NUM_THREADS, which sizes
the kernel pool our ops split large products across). Per shape the parent
alternates REPS trials of each; a trial times a batch of calls (numpy's
``np.matmul(a, b)``, which allocates its result as our op does, against
``workspace.RunNet`` of a net holding one ``MatMul`` op, run ``num_iter``
times in one call) and divides by their number. Each side keeps its best
trial. Printed: GFLOP/s of both and the ratio numpy time / our time (1.0 =
as fast as numpy; issue 14 asks for >= 0.9).

The crates compared before the choice of ``matrixmultiply`` are measured by
``benches/gemm`` (its own Cargo workspace; see BENCHMARKS.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

NUMPY_CHILD = r"""
import sys, time
import numpy as np
for line in sys.stdin:
    m, n, k, calls = map(int, line.split())
    a = np.random.rand(m, k).astype(np.float32)
    b = np.random.rand(k, n).astype(np.float32)
    np.matmul(a, b)
    t = time.perf_counter()
    for _ in range(calls):
        np.matmul(a, b)
    print((time.perf_counter() - t) / calls, flush=True)
"""

OURS_CHILD = r"""
import sys, time
import numpy as np
from ferrocaffe import core, workspace
for line in sys.stdin:
    m, n, k, calls = map(int, line.split())
    name = f"mm_{m}_{n}_{k}"
    if not workspace.HasBlob(f"a_{name}"):
        workspace.FeedBlob(f"a_{name}", np.random.rand(m, k).astype(np.float32))
        workspace.FeedBlob(f"b_{name}", np.random.rand(k, n).astype(np.float32))
        net = core.Net(name)
        net.MatMul([f"a_{name}", f"b_{name}"], f"c_{name}")
        workspace.CreateNet(net)
        workspace.RunNet(name)
        a, b, c = (workspace.FetchBlob(f"{x}_{name}") for x in "abc")
        assert np.allclose(c, a @ b, rtol=1e-4, atol=1e-4), name
    workspace.RunNet(name)
    t = time.perf_counter()
    workspace.RunNet(name, num_iter=calls)
    print((time.perf_counter() - t) / calls, flush=True)
"""

# Square sizes, then the shapes of an MLP on 8x8 digits (64 -> 128 -> 10)
# at batch 64 and 256: forward X*W^T, and the weight gradient dY^T*X.
SHAPES = [(s, s, s) for s in (64, 128, 256, 512, 1024)] + [
    (64, 128, 64),
    (256, 128, 64),
    (256, 10, 128),
    (128, 64, 256),
]


def calls_for(m, n, k):
    # About 20 ms of work per trial at 100 GFLOP/s, at least 3 calls.
    return max(3, int(2e9 / (2 * m * n * k)))


def start(code, env):
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


# The two children live side by side, and OpenBLAS's workers keep spinning
# for a while after a call (rayon's too, briefly): a trial that followed the
# other child's at once would share the second vCPU with those spinning
# threads. Each request waits this long first.
SETTLE = 0.3


def ask(proc, m, n, k, calls):
    time.sleep(SETTLE)
    proc.stdin.write(f"{m} {n} {k} {calls}\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}", flush=True)
    print(f"{'M x N x K':>16} thr  numpy GF/s  ours GF/s  ratio")
    for threads in (1, 2):
        t = str(threads)
        env = dict(os.environ, OPENBLAS_NUM_THREADS=t, OMP_NUM_THREADS=t, RAYON_NUM_THREADS=t)
        npc, ours = start(NUMPY_CHILD, env), start(OURS_CHILD, env)
        for m, n, k in SHAPES:
            calls = calls_for(m, n, k)
            tn, to = float("inf"), float("inf")
            for _ in range(reps):
                tn = min(tn, ask(npc, m, n, k, calls))
                to = min(to, ask(ours, m, n, k, calls))
            gf = lambda s: 2 * m * n * k / s / 1e9  # noqa: E731
            print(f"{m:>4} x{n:>5} x{k:>5} {threads:>3} {gf(tn):10.1f} {gf(to):10.1f}  {tn / to:5.2f}",
                  flush=True)
        for p in (npc, ours):
            p.stdin.close()
            if p.wait() != 0:
                raise SystemExit("a child failed")
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}", flush=True)


if __name__ == "__main__":
    main()
