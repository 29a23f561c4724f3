"""GEMM crates against numpy's matmul (issue 14): float32 C = A * B.

    cargo build --release --manifest-path benches/gemm/Cargo.toml
    python benches/bench_gemm.py [REPS]

For each shape and thread count (1 and 2), alternates three trials of
numpy's ``matmul`` (OpenBLAS, in a child process started with
OPENBLAS_NUM_THREADS set, since OpenBLAS fixes its threads at load) with
three of the Rust binary (benches/gemm: ``matrixmultiply`` single-threaded,
``gemm`` on that many rayon threads), keeps each one's best time and prints
GFLOP/s and the ratio numpy time / crate time (1.0 = as fast as numpy).
"""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "gemm", "target", "release", "gemm-bench")

NUMPY_CHILD = r"""
import sys, time
import numpy as np
m, n, k, reps = map(int, sys.argv[1:5])
a = np.random.rand(m, k).astype(np.float32)
b = np.random.rand(k, n).astype(np.float32)
c = np.empty((m, n), np.float32)
np.matmul(a, b, out=c)
best = float("inf")
for _ in range(reps):
    t = time.perf_counter()
    np.matmul(a, b, out=c)
    best = min(best, time.perf_counter() - t)
print(best)
"""

# Square sizes, then the shapes of an MLP on 8x8 digits (64 -> 128 -> 10)
# at batch 64 and 256: forward X*W^T, and the weight gradient dY^T*X.
SHAPES = [(s, s, s) for s in (64, 128, 256, 512, 1024)] + [
    (64, 128, 64),
    (256, 128, 64),
    (256, 10, 128),
    (128, 64, 256),
]


def reps_for(m, n, k, base):
    # About the same total work per trial at every size.
    return max(3, min(base * 50, int(base * 2e8 / (2 * m * n * k))))


def numpy_time(m, n, k, reps, threads):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run(
        [sys.executable, "-c", NUMPY_CHILD, str(m), str(n), str(k), str(reps)],
        env=env, capture_output=True, text=True, check=True,
    )
    return float(out.stdout)


def crate_times(m, n, k, reps, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run(
        [BIN, str(m), str(n), str(k), str(reps), str(threads)],
        env=env, capture_output=True, text=True, check=True,
    )
    f = out.stdout.split()
    return float(f[1]), float(f[3])


def main():
    base = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    if not os.path.exists(BIN):
        sys.exit(f"build the Rust side first: cargo build --release --manifest-path {HERE}/gemm/Cargo.toml")
    print(f"{'M x N x K':>16} thr  numpy GF/s  mm GF/s (ratio)  gemm GF/s (ratio)")
    for threads in (1, 2):
        for m, n, k in SHAPES:
            reps = reps_for(m, n, k, base)
            tn, tm, tg = float("inf"), float("inf"), float("inf")
            for _ in range(3):
                tn = min(tn, numpy_time(m, n, k, reps, threads))
                a, b = crate_times(m, n, k, reps, threads)
                tm, tg = min(tm, a), min(tg, b)
            gf = lambda t: 2 * m * n * k / t / 1e9  # noqa: E731
            # matrixmultiply runs single-threaded by design; its 2-thread row
            # is still measured against numpy on 2 threads.
            print(
                f"{m:>4} x{n:>5} x{k:>5} {threads:>3} {gf(tn):10.1f}  {gf(tm):7.1f} ({tn / tm:4.2f})"
                f"  {gf(tg):8.1f} ({tn / tg:4.2f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
