"""FC and MatMul float32 products against PyTorch (and between builds of ours).

    BENCH_TORCH_PATH=/tmp/torchenv:/tmp/torchenv-cuda:/tmp/torchenv-cuda2 \\
        PYTHONPATH=python python benches/bench_fc_peer.py [--rounds 5] [--threads 1,2] \\
        [label=DIR ...]

Shapes: FC at batch 1 and 4 on VGG's fc6 (1 x 25088 -> 4096: y = x W^T, W
4096 x 25088 row-major, a matrix-vector product bound by reading W), the
same product's gradient with respect to X (MatMul 1 x 4096 times 4096 x
25088, B not transposed), an LSTM's per-step recurrent product (FC 32 x 256
-> 1024) and its backward products (MatMul 32 x 1024 times 1024 x 256, and
dW = dY^T X, 1024 x 32 times 32 x 256), and 1024^3.

Each side runs in its own child process per round and thread count (ours:
``_core.set_num_threads``, which sizes the kernel pool, set before any op
runs; PyTorch: ``torch.set_num_threads``). Each ``label=DIR`` names a folder
holding a ``ferrocaffe`` package (a copy of ``python/`` with that build's
``_core.abi3.so``); with none, the ``ferrocaffe`` on PYTHONPATH is "ours".
Rounds alternate the sides, so load elsewhere lands on all; per shape a
child times batches of calls (ours: ``workspace.RunNet`` of a one-op net,
``num_iter`` calls at a time; PyTorch: ``torch.nn.functional.linear`` or
``torch.matmul``) and keeps the best batch; the table shows each side's
best over the rounds in GFLOP/s and PyTorch's time / ours (> 1: ours faster).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# (name, op, M, K, N, B transposed): C (M x N) = A (M x K) op(B).
SHAPES = [
    ("fc 1x25088->4096", "FC", 1, 25088, 4096, True),
    ("fc 4x25088->4096", "FC", 4, 25088, 4096, True),
    ("dX 1x4096 . 4096x25088", "MatMul", 1, 4096, 25088, False),
    ("fc 1x1024->1024", "FC", 1, 1024, 1024, True),
    ("lstm fc 32x256->1024", "FC", 32, 256, 1024, True),
    ("lstm dX 32x1024 . 1024x256", "MatMul", 32, 1024, 256, False),
    ("lstm dW 1024x32 . 32x256", "MatMulTA", 1024, 32, 256, False),
    ("1024^3", "MatMul", 1024, 1024, 1024, False),
]

CHILD = r"""
import json, sys, time
import numpy as np
which, threads, names = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
SHAPES = json.loads(sys.argv[4])
rng = np.random.default_rng(0)
out = {}
def timed(call, once_arg):
    # Batches of about 0.1 s; the best of 5.
    t0 = time.perf_counter(); call(1); once = time.perf_counter() - t0
    iters = max(2, min(1000, int(0.1 / max(once, 1e-7))))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter(); call(iters)
        best = min(best, (time.perf_counter() - t0) / iters)
    return best
if which == "torch":
    sys.path[:0] = [p for p in __import__("os").environ.get("BENCH_TORCH_PATH", "").split(":") if p]
    import torch
    torch.set_num_threads(threads)
    for name, op, m, k, n, tb in SHAPES:
        if op == "MatMulTA":
            a = torch.from_numpy(rng.standard_normal((k, m)).astype(np.float32))
            b = torch.from_numpy(rng.standard_normal((k, n)).astype(np.float32))
            f = lambda a=a, b=b: torch.matmul(a.t(), b)
        elif tb:
            a = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
            b = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
            bias = torch.zeros(n)
            f = lambda a=a, b=b, bias=bias: torch.nn.functional.linear(a, b, bias)
        else:
            a = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
            b = torch.from_numpy(rng.standard_normal((k, n)).astype(np.float32))
            f = lambda a=a, b=b: torch.matmul(a, b)
        def call(iters, f=f):
            for _ in range(iters):
                f()
        with torch.no_grad():
            out[name] = timed(call, None)
else:
    from ferrocaffe import _core, core, workspace
    _core.set_num_threads(threads)
    for name, op, m, k, n, tb in SHAPES:
        workspace.ResetWorkspace()
        if op == "MatMulTA":
            workspace.FeedBlob("A", rng.standard_normal((k, m)).astype(np.float32))
            workspace.FeedBlob("B", rng.standard_normal((k, n)).astype(np.float32))
            o = core.CreateOperator("MatMul", ["A", "B"], ["Y"], trans_a=1)
        elif op == "FC":
            workspace.FeedBlob("A", rng.standard_normal((m, k)).astype(np.float32))
            workspace.FeedBlob("B", rng.standard_normal((n, k)).astype(np.float32))
            workspace.FeedBlob("b", np.zeros(n, np.float32))
            o = core.CreateOperator("FC", ["A", "B", "b"], ["Y"])
        else:
            workspace.FeedBlob("A", rng.standard_normal((m, k)).astype(np.float32))
            workspace.FeedBlob("B", rng.standard_normal((k, n)).astype(np.float32))
            o = core.CreateOperator("MatMul", ["A", "B"], ["Y"])
        net = core.Net("fc_peer")
        net.Proto().op.extend([o])
        workspace.CreateNet(net)
        out[name] = timed(lambda iters: workspace.RunNet(net.Name(), iters), None)
print(json.dumps(out))
"""


def run_child(which, path, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS="1",
               RAYON_NUM_THREADS=str(threads))
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([path] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    done = subprocess.run(
        [sys.executable, "-c", CHILD, which, str(threads), "[]", json.dumps(SHAPES)],
        env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{which} child failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("builds", nargs="*", help="label=DIR")
    args = ap.parse_args()
    sides = [(lbl, ("ours", d)) for lbl, d in (b.split("=", 1) for b in args.builds)]
    if not sides:
        sides = [("ours", ("ours", None))]
    if not args.no_torch:
        sides.append(("torch", ("torch", None)))
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    print(f"load average before: {load}")
    for threads in [int(t) for t in args.threads.split(",")]:
        best = {lbl: {} for lbl, _ in sides}
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for lbl, (which, path) in order:
                for name, t in run_child(which, path, threads).items():
                    best[lbl][name] = min(best[lbl].get(name, float("inf")), t)
        print(f"\n{threads} thread(s), best of {args.rounds} rounds: GFLOP/s"
              + ("; torch time / ours" if not args.no_torch else ""))
        lbls = [lbl for lbl, _ in sides]
        print(f"{'shape':30s}" + "".join(f"{lbl:>10s}" for lbl in lbls)
              + "".join(f"{'t/' + lbl:>10s}" for lbl in lbls if lbl != "torch" and "torch" in lbls))
        for name, op, m, k, n, tb in SHAPES:
            fl = 2 * m * k * n
            row = f"{name:30s}" + "".join(f"{fl / best[lbl][name] / 1e9:10.1f}" for lbl in lbls)
            if "torch" in lbls:
                row += "".join(f"{best['torch'][name] / best[lbl][name]:10.2f}" for lbl in lbls if lbl != "torch")
            print(row)
    try:
        print(f"\nload average after: {os.getloadavg()}")
    except OSError:
        pass


if __name__ == "__main__":
    main()
