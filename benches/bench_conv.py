"""Conv forward and backward (issue 15) against ONNX Runtime's CPU Conv and
PyTorch's (oneDNN / ATen) conv2d with autograd.

    PROFILE=release bash scripts/dev_build.sh
    pip install '.[bench]'        # onnxruntime, onnx and torch
    PYTHONPATH=python python benches/bench_conv.py [REPS]
    BENCH_TORCH_PATH=/tmp/torchenv:/tmp/torchenv-cuda:/tmp/torchenv-cuda2 ...  # torch from pip --target folders
    BENCH_ONLY=3x3 PYTHONPATH=python python benches/bench_conv.py   # shapes whose name has "3x3"

Shapes: LeNet's two convolutions (Caffe2's MNIST tutorial) and ResNet-18's
(conv1 7x7/2, a 3x3 of each stage, the 3x3/2 into stage 2), float32 NCHW,
batch 1 and 32, on 1 and 2 threads. Each thread count runs in a child
process (our kernel pool is sized by RAYON_NUM_THREADS when it starts;
ONNX Runtime gets intra_op_num_threads; PyTorch torch.set_num_threads and
OMP_NUM_THREADS). Per case the child alternates REPS trials of ours and of
each peer and keeps each one's best time.

Printed: GFLOP/s (2 * multiply-adds / time) of our Conv forward, of ONNX
Runtime's Conv (MLAS) and of PyTorch's conv2d (no_grad), the ratios (peer
time / our time: above 1 we are faster); then our backward (ConvGradient:
dW, db and dX) and PyTorch's (torch.autograd.grad of the conv's output for
dX, dW and db, the same three), with the ratio against PyTorch's backward
and, as before, against twice ONNX Runtime's forward time (ORT inference
has no gradient; the backward is two products of the forward's size).
Both outputs and all three gradients are checked against PyTorch (the
forward also against ONNX Runtime) before timing. Without torch (see
torch_peer.py for BENCH_TORCH_PATH) the PyTorch columns print "-".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

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


def best_of(f, reps):
    f()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def rel_err(a, b):
    import numpy as np
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12))


def child(threads, reps, batches):
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from ferrocaffe import core, workspace

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_peer import import_torch
    torch = import_torch()
    if torch is not None:
        torch.set_num_threads(threads)
        F = torch.nn.functional

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    rng = np.random.default_rng(0)
    only = os.environ.get("BENCH_ONLY", "")
    for name, ci, co, h, k, s, p in SHAPES:
        if only not in name:
            continue
        for n in batches:
            x = rng.standard_normal((n, ci, h, h), dtype=np.float32)
            w = rng.standard_normal((co, ci, k, k), dtype=np.float32) * 0.1
            b = rng.standard_normal(co, dtype=np.float32)
            o = out_size(h, k, s, p)
            dy = rng.standard_normal((n, co, o, o), dtype=np.float32)
            for blob, v in (("x", x), ("w", w), ("b", b), ("dy", dy)):
                workspace.FeedBlob(blob, v)
            fwd = core.Net(f"fwd_{name}_{n}")
            fwd.Conv(["x", "w", "b"], "y", kernel=k, stride=s, pad=p)
            bwd = core.Net(f"bwd_{name}_{n}")
            bwd.ConvGradient(["x", "w", "dy"], ["dw", "db", "dx"], kernel=k, stride=s, pad=p)
            workspace.CreateNet(fwd)
            workspace.CreateNet(bwd)
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
            # Same answer first.
            workspace.RunNet(fwd.Name())
            ref = sess.run(None, feeds)[0]
            err = rel_err(workspace.FetchBlob("y"), ref)
            pt_fwd = pt_bwd = None
            if torch is not None:
                tx, tw, tb = (torch.from_numpy(v).requires_grad_() for v in (x, w, b))
                tdy = torch.from_numpy(dy)
                ty = F.conv2d(tx, tw, tb, stride=s, padding=p)

                def pt_fwd():
                    with torch.no_grad():
                        F.conv2d(tx, tw, tb, stride=s, padding=p)

                def pt_bwd():
                    return torch.autograd.grad(ty, (tx, tw, tb), tdy, retain_graph=True)

                err = max(err, rel_err(workspace.FetchBlob("y"), ty.detach().numpy()))
                workspace.RunNet(bwd.Name())
                gx, gw, gb = pt_bwd()
                for blob, g in (("dx", gx), ("dw", gw), ("db", gb)):
                    err = max(err, rel_err(workspace.FetchBlob(blob), g.numpy()))
            ours, peer, back = float("inf"), float("inf"), float("inf")
            tfwd, tbwd = float("inf"), float("inf")
            r = max(1, reps if flops(n, ci, co, h, k, s, p) < 2e9 else max(2, reps // 2))
            for _ in range(r):
                ours = min(ours, best_of(lambda: workspace.RunNet(fwd.Name()), 1))
                peer = min(peer, best_of(lambda: sess.run(None, feeds), 1))
                back = min(back, best_of(lambda: workspace.RunNet(bwd.Name()), 1))
                if torch is not None:
                    tfwd = min(tfwd, best_of(pt_fwd, 1))
                    tbwd = min(tbwd, best_of(pt_bwd, 1))
            print(json.dumps(dict(name=name, n=n, threads=threads, ours=ours, peer=peer, back=back,
                                  torch_fwd=tfwd if torch is not None else None,
                                  torch_bwd=tbwd if torch is not None else None,
                                  gflop=flops(n, ci, co, h, k, s, p) / 1e9, err=err)), flush=True)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    reps = int(args[0]) if args else 5
    if "--child" in sys.argv:
        threads = int(os.environ["BENCH_THREADS"])
        batches = [int(b) for b in os.environ["BENCH_BATCHES"].split(",")]
        child(threads, reps, batches)
        return
    batches = "1,32"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_peer import import_torch
    import onnxruntime
    torch = import_torch()
    print(f"onnxruntime {onnxruntime.__version__}; torch "
          + (f"{torch.__version__} (oneDNN {torch.backends.mkldnn.is_available()})" if torch else "not importable"))
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}", flush=True)
    print(f"{'shape':18} {'N':>3} {'thr':>3} {'ours GF/s':>9} {'ORT GF/s':>8} {'xORT':>5} {'PT GF/s':>7} "
          f"{'xPT':>5} | {'bwd GF/s':>8} {'PT bwd':>7} {'xPT':>5} {'x2ORT':>5}")
    for threads in (1, 2):
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads), BENCH_THREADS=str(threads),
                   BENCH_BATCHES=batches, OMP_NUM_THREADS=str(threads))
        proc = subprocess.Popen([sys.executable, __file__, str(reps), "--child"], env=env,
                                stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            r = json.loads(line)
            g = r["gflop"]
            tf, tb = r["torch_fwd"], r["torch_bwd"]
            pt = (f"{g / tf:>7.1f} {tf / r['ours']:>5.2f}" if tf else f"{'-':>7} {'-':>5}")
            ptb = (f"{2 * g / tb:>7.1f} {tb / r['back']:>5.2f}" if tb else f"{'-':>7} {'-':>5}")
            print(f"{r['name']:18} {r['n']:>3} {r['threads']:>3} {g / r['ours']:>9.1f} {g / r['peer']:>8.1f} "
                  f"{r['peer'] / r['ours']:>5.2f} {pt} | {2 * g / r['back']:>8.1f} {ptb} "
                  f"{2 * r['peer'] / r['back']:>5.2f}"
                  + ("" if r["err"] < 1e-4 else f"  MISMATCH {r['err']:.1e}"), flush=True)
        if proc.wait() != 0:
            raise SystemExit(f"the {threads}-thread child failed")
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}", flush=True)


if __name__ == "__main__":
    main()
