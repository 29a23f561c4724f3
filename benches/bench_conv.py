"""Conv forward and backward (issue 15) against ONNX Runtime's CPU Conv and
PyTorch's (oneDNN / ATen) conv2d with autograd.

    PROFILE=release bash scripts/dev_build.sh
    pip install '.[bench]'        # onnxruntime, onnx and torch
    PYTHONPATH=python python benches/bench_conv.py [ROUNDS]
    BENCH_TORCH_PATH=/tmp/torchenv:/tmp/torchenv-cuda:/tmp/torchenv-cuda2 ...  # torch from pip --target folders
    BENCH_ONLY=3x3 PYTHONPATH=python python benches/bench_conv.py   # shapes whose name has "3x3"

Shapes: LeNet's two convolutions (Caffe2's MNIST tutorial) and ResNet-18's
(conv1 7x7/2, a 3x3 of each stage, the 3x3/2 into stage 2), float32 NCHW,
batch 1 and 32, on 1 and 2 threads.

Every measurement is a fresh child process running one framework on one
shape (both batches) with one thread count, and nothing else: our kernel
pool is sized by RAYON_NUM_THREADS when it starts, ONNX Runtime gets
intra_op_num_threads, PyTorch torch.set_num_threads and OMP_NUM_THREADS.
No framework's worker threads exist while another is timed (ONNX
Runtime's, OpenMP's and OpenBLAS's keep spinning after a call, and took
the second vCPU from whatever ran next when the frameworks shared one
process). Per shape the parent runs ROUNDS rounds (default 3), each round
ours, ONNX Runtime and PyTorch one after the other; a child makes untimed calls for
WARMUP seconds, then keeps the best of at least TRIALS timed calls (fewer
above 2 GFLOP; more, up to 100, while they total under BUDGET seconds),
and each framework keeps its best over the rounds.

Printed: GFLOP/s (2 * multiply-adds / time) of our Conv forward, of ONNX
Runtime's Conv (MLAS) and of PyTorch's conv2d (no_grad), the ratios (peer
time / our time: above 1 we are faster); then our backward (ConvGradient:
dW, db and dX) and PyTorch's (torch.autograd.grad of the conv's output for
dX, dW and db, the same three), with the ratio against PyTorch's backward
and, as before, against twice ONNX Runtime's forward time (ORT inference
has no gradient; the backward is two products of the forward's size).
In the first round each child saves its output and gradients (same seeded
inputs in every child), and our forward is checked against both peers and
our three gradients against PyTorch's (a row says MISMATCH above 1e-4
relative). Without torch (see torch_peer.py for BENCH_TORCH_PATH) the
PyTorch columns print "-".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

TRIALS = 3  # timed calls per child at least (fewer above 2 GFLOP)
WARMUP, BUDGET = 0.05, 0.25  # seconds of untimed calls, then of timed ones (see best_of)

# name, C_in, C_out, H (= W), kernel, stride, pad
SHAPES = [
    ("lenet.conv1", 1, 20, 28, 5, 1, 0),
    ("lenet.conv2", 20, 50, 12, 5, 1, 0),
    ("resnet18.conv1", 3, 64, 224, 7, 2, 3),
    ("resnet18.l1.3x3", 64, 64, 56, 3, 1, 1),
    ("resnet18.l2.3x3/2", 64, 128, 56, 3, 2, 1),
    ("resnet18.l2.3x3", 128, 128, 28, 3, 1, 1),
    ("resnet18.l3.3x3", 256, 256, 14, 3, 1, 1),
    ("resnet18.l4.3x3", 512, 512, 7, 3, 1, 1),
]


def out_size(h, k, s, p):
    return (h + 2 * p - k) // s + 1


def flops(n, ci, co, h, k, s, p):
    o = out_size(h, k, s, p)
    return 2.0 * n * co * o * o * ci * k * k


def best_of(f, trials):
    """Best seconds per call of ``f``: untimed calls for WARMUP seconds (at
    least one), then at least ``trials`` timed calls, more (up to 100) while
    their total is under BUDGET seconds (short calls get more chances to
    land in a slice with both vCPUs)."""
    t0 = time.perf_counter()
    f()
    while time.perf_counter() - t0 < WARMUP:
        f()
    best, spent, calls = float("inf"), 0.0, 0
    while calls < trials or (spent < BUDGET and calls < 100):
        t = time.perf_counter()
        f()
        t = time.perf_counter() - t
        best, spent, calls = min(best, t), spent + t, calls + 1
    return best


def rel_err(a, b):
    import numpy as np
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12))


def case_data(shape_index, n):
    """x, w, b, dy of one case, the same in every child (seeded by the case)."""
    import numpy as np
    _, ci, co, h, k, s, p = SHAPES[shape_index]
    rng = np.random.default_rng(1000 * shape_index + n)
    x = rng.standard_normal((n, ci, h, h), dtype=np.float32)
    w = rng.standard_normal((co, ci, k, k), dtype=np.float32) * 0.1
    b = rng.standard_normal(co, dtype=np.float32)
    o = out_size(h, k, s, p)
    dy = rng.standard_normal((n, co, o, o), dtype=np.float32)
    return x, w, b, dy


def trials_for(gflop):
    return TRIALS if gflop < 2 else max(1, TRIALS // 2)


def child_ours(threads, shape_index, n, save):
    import numpy as np

    from ferrocaffe import core, workspace
    name, ci, co, h, k, s, p = SHAPES[shape_index]
    x, w, b, dy = case_data(shape_index, n)
    for blob, v in (("x", x), ("w", w), ("b", b), ("dy", dy)):
        workspace.FeedBlob(blob, v)
    fwd = core.Net("fwd")
    fwd.Conv(["x", "w", "b"], "y", kernel=k, stride=s, pad=p)
    bwd = core.Net("bwd")
    bwd.ConvGradient(["x", "w", "dy"], ["dw", "db", "dx"], kernel=k, stride=s, pad=p)
    workspace.CreateNet(fwd)
    workspace.CreateNet(bwd)
    workspace.RunNet(fwd.Name())
    workspace.RunNet(bwd.Name())
    if save:
        for blob in ("y", "dx", "dw", "db"):
            np.save(f"{save}_{blob}.npy", workspace.FetchBlob(blob))
    r = trials_for(flops(n, ci, co, h, k, s, p) / 1e9)
    return dict(fwd=best_of(lambda: workspace.RunNet(fwd.Name()), r),
                bwd=best_of(lambda: workspace.RunNet(bwd.Name()), r))


def child_ort(threads, shape_index, n, save):
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    name, ci, co, h, k, s, p = SHAPES[shape_index]
    x, w, b, _ = case_data(shape_index, n)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[s, s],
                          pads=[p, p, p, p])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {"x": x}
    y = sess.run(None, feeds)[0]
    if save:
        np.save(f"{save}_y.npy", y)
    r = trials_for(flops(n, ci, co, h, k, s, p) / 1e9)
    return dict(fwd=best_of(lambda: sess.run(None, feeds), r))


def child_torch(threads, shape_index, n, save):
    import numpy as np
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_peer import import_torch
    torch = import_torch()
    torch.set_num_threads(threads)
    F = torch.nn.functional
    name, ci, co, h, k, s, p = SHAPES[shape_index]
    x, w, b, dy = case_data(shape_index, n)
    tx, tw, tb = (torch.from_numpy(v).requires_grad_() for v in (x, w, b))
    tdy = torch.from_numpy(dy)
    ty = F.conv2d(tx, tw, tb, stride=s, padding=p)

    def fwd():
        with torch.no_grad():
            F.conv2d(tx, tw, tb, stride=s, padding=p)

    def bwd():
        return torch.autograd.grad(ty, (tx, tw, tb), tdy, retain_graph=True)

    if save:
        gx, gw, gb = bwd()
        for blob, v in (("y", ty.detach()), ("dx", gx), ("dw", gw), ("db", gb)):
            np.save(f"{save}_{blob}.npy", v.numpy())
    r = trials_for(flops(n, ci, co, h, k, s, p) / 1e9)
    return dict(fwd=best_of(fwd, r), bwd=best_of(bwd, r))


CHILDREN = {"ours": child_ours, "ort": child_ort, "torch": child_torch}


def run_child(framework, threads, shape_index, batches, save_dir):
    """One fresh process: one framework, one shape, every batch; returns {n: times}."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", framework, str(threads), str(shape_index),
           ",".join(map(str, batches)), save_dir or "-"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {framework} child ({threads} threads, {SHAPES[shape_index][0]}) failed:\n"
                         + done.stderr[-3000:])
    return {int(n): t for n, t in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def child_main(argv):
    framework, threads, shape_index, batches, save_dir = argv
    threads, shape_index = int(threads), int(shape_index)
    out = {}
    for n in map(int, batches.split(",")):
        save = None if save_dir == "-" else os.path.join(save_dir, f"{framework}_{n}")
        out[n] = CHILDREN[framework](threads, shape_index, n, save)
    print(json.dumps(out), flush=True)


def agreement(tmp, n, have_torch):
    """Largest relative error of our y (vs ORT and PyTorch) and dx, dw, db (vs PyTorch)."""
    import numpy as np

    def load(fw, blob):
        return np.load(os.path.join(tmp, f"{fw}_{n}_{blob}.npy"))

    err = rel_err(load("ours", "y"), load("ort", "y"))
    if have_torch:
        for blob in ("y", "dx", "dw", "db"):
            err = max(err, rel_err(load("ours", blob), load("torch", blob)))
    return err


def main():
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2:])
        return
    import shutil
    import tempfile
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rounds = int(args[0]) if args else 3
    batches = [1, 32]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import onnxruntime
    from torch_peer import import_torch
    torch = import_torch()
    have_torch = torch is not None
    print(f"onnxruntime {onnxruntime.__version__}; torch "
          + (f"{torch.__version__} (oneDNN {torch.backends.mkldnn.is_available()})" if torch else "not importable"))
    del torch  # the parent times nothing; its torch threads (if any) stay idle
    frameworks = ["ours", "ort"] + (["torch"] if have_torch else [])
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}", flush=True)
    print(f"{'shape':18} {'N':>3} {'thr':>3} {'ours GF/s':>9} {'ORT GF/s':>8} {'xORT':>5} {'PT GF/s':>7} "
          f"{'xPT':>5} | {'bwd GF/s':>8} {'PT bwd':>7} {'xPT':>5} {'x2ORT':>5}")
    only = os.environ.get("BENCH_ONLY", "")
    for threads in (1, 2):
        for si, (name, ci, co, h, k, s, p) in enumerate(SHAPES):
            if only not in name:
                continue
            best = {fw: {n: {} for n in batches} for fw in frameworks}
            tmp = tempfile.mkdtemp(prefix="bench_conv_")
            try:
                for rnd in range(rounds):
                    for fw in frameworks:
                        got = run_child(fw, threads, si, batches, tmp if rnd == 0 else None)
                        for n, times in got.items():
                            for key, t in times.items():
                                best[fw][n][key] = min(best[fw][n].get(key, float("inf")), t)
                errs = {n: agreement(tmp, n, have_torch) for n in batches}
            finally:
                shutil.rmtree(tmp)
            for n in batches:
                g = flops(n, ci, co, h, k, s, p) / 1e9
                ours, back = best["ours"][n]["fwd"], best["ours"][n]["bwd"]
                peer = best["ort"][n]["fwd"]
                tf = best["torch"][n]["fwd"] if have_torch else None
                tb = best["torch"][n]["bwd"] if have_torch else None
                pt = (f"{g / tf:>7.1f} {tf / ours:>5.2f}" if tf else f"{'-':>7} {'-':>5}")
                ptb = (f"{2 * g / tb:>7.1f} {tb / back:>5.2f}" if tb else f"{'-':>7} {'-':>5}")
                print(f"{name:18} {n:>3} {threads:>3} {g / ours:>9.1f} {g / peer:>8.1f} "
                      f"{peer / ours:>5.2f} {pt} | {2 * g / back:>8.1f} {ptb} "
                      f"{2 * peer / back:>5.2f}"
                      + ("" if errs[n] < 1e-4 else f"  MISMATCH {errs[n]:.1e}"), flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}", flush=True)


if __name__ == "__main__":
    main()
