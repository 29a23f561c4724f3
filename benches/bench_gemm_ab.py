"""Several builds (or settings) of our MatMul op against numpy in one run.

    PYTHONPATH=python python benches/bench_gemm_ab.py REPS THREADS SHAPES CONFIG...

SHAPES: comma-separated MxNxK (as bench_gemm.py prints them), e.g.
``256x256x256,256x128x64``. Each CONFIG is ``label=DIR[,VAR=value...]``: a
child started with ``PYTHONPATH=DIR`` (a directory holding a ``ferrocaffe``
package, e.g. a copy of ``python/`` with another build's ``_core.abi3.so``)
and those environment variables. Per shape, the parent alternates REPS
trials of numpy and of every config (as bench_gemm.py does, with its pause
before each request), keeps each side's best and prints GF/s and the
ratio numpy time / config time, so builds are compared with the same
numpy baseline on the same (possibly busy) machine.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from bench_gemm import NUMPY_CHILD, OURS_CHILD, ask, calls_for, start  # noqa: E402


def main():
    reps, threads = int(sys.argv[1]), str(int(sys.argv[2]))
    shapes = [tuple(map(int, s.split("x"))) for s in sys.argv[3].split(",")]
    base = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads,
                RAYON_NUM_THREADS=threads)
    configs = []
    for spec in sys.argv[4:]:
        label, rest = spec.split("=", 1)
        path, *envs = rest.split(",")
        env = dict(base, PYTHONPATH=path, **dict(e.split("=", 1) for e in envs))
        configs.append((label, start(OURS_CHILD, env)))
    npc = start(NUMPY_CHILD, base)
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}, {threads} threads",
          flush=True)
    print(f"{'M x N x K':>16}  numpy GF/s  " + "  ".join(f"{c[0]:>14}" for c in configs))
    for m, n, k in shapes:
        calls = calls_for(m, n, k)
        tn, best = float("inf"), [float("inf")] * len(configs)
        for _ in range(reps):
            tn = min(tn, ask(npc, m, n, k, calls))
            for i, (_, proc) in enumerate(configs):
                best[i] = min(best[i], ask(proc, m, n, k, calls))
        gf = lambda s: 2 * m * n * k / s / 1e9  # noqa: E731
        cells = "  ".join(f"{gf(t):7.1f} ({tn / t:4.2f})" for t in best)
        print(f"{m:>4} x{n:>5} x{k:>5}  {gf(tn):10.1f}  {cells}", flush=True)
    for proc in [npc] + [c[1] for c in configs]:
        proc.stdin.close()
        if proc.wait() != 0:
            raise SystemExit("a child failed")
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}", flush=True)


if __name__ == "__main__":
    main()
