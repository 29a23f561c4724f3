"""Inference on ONNX models exported by ferrocaffe (issue 32): ferrocaffe's
ONNX backend against ONNX Runtime on the same model file.

    pip install '.[onnx]' onnxruntime      # or '.[bench]'
    PYTHONPATH=python python benches/bench_onnx.py [ROUNDS]
    BENCH_ONLY=small PYTHONPATH=python python benches/bench_onnx.py   # models whose name has "small"

Models (float32, NCHW, built here as Caffe2 nets with brew, weights from a
fixed seed, exported with ``ferrocaffe.onnx.frontend``):

- ``resnet50``: ResNet-50 (the Caffe2 model zoo's layout: conv 7x7/2,
  max pool 3x3/2, bottleneck stages of 3, 4, 6 and 3 blocks, 64 to 2048
  channels, batch norm in test mode, global average pool, FC 1000,
  softmax), 224 x 224 images;
- ``small_cnn``: the LeNet of Caffe2's MNIST tutorial (conv 5x5 20, max
  pool, conv 5x5 50, max pool, FC 500, ReLU, FC 10, softmax), 28 x 28.

Each at batch 1 and 16, on 1 and 2 threads. ferrocaffe runs the ONNX model
through ``backend.prepare(model).run`` (the exported graph converted back
to a NetDef); ONNX Runtime (CPUExecutionProvider, all graph
optimisations, intra_op_num_threads = threads, sequential) runs the same
file. Every measurement is a fresh child process running one runtime with
one thread count (our kernel pool is sized by RAYON_NUM_THREADS when it
starts); a child makes one untimed call, then keeps the best of at least
TRIALS timed calls (more while they total under BUDGET seconds). Per row
the parent runs ROUNDS rounds (default 2), each runtime in turn, and keeps
each runtime's best.

Printed: milliseconds per call of each, the ratio (ONNX Runtime's time /
ours: above 1 we are faster), and whether ONNX Runtime agrees with
ferrocaffe (the models output the logits as well as the softmax: the
largest difference of the logits relative to their largest magnitude, below
1e-4, and every row's argmax the same), from the first round's outputs on
one seeded input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

TRIALS, BUDGET = 3, 2.0
BATCHES = (1, 16)
THREADS = (1, 2)
MODELS = ("resnet50", "small_cnn")
IMAGE = {"resnet50": (3, 224, 224), "small_cnn": (1, 28, 28)}


def build_resnet50(brew, model_helper):
    m = model_helper.ModelHelper(name="resnet50")
    x = brew.conv(m, "data", "conv1", 3, 64, kernel=7, stride=2, pad=3, no_bias=1)
    x = brew.spatial_bn(m, x, "conv1_bn", 64, is_test=1)
    x = brew.relu(m, x, x)
    x = brew.max_pool(m, x, "pool1", kernel=3, stride=2, pad=1)
    dim_in = 64
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512)), start=2):
        for b in range(blocks):
            pre = f"res{stage}_{b}"
            stride = 2 if b == 0 and stage > 2 else 1
            r = brew.conv(m, x, f"{pre}_branch2a", dim_in, width, kernel=1, no_bias=1)
            r = brew.spatial_bn(m, r, f"{pre}_branch2a_bn", width, is_test=1)
            r = brew.relu(m, r, r)
            r = brew.conv(m, r, f"{pre}_branch2b", width, width, kernel=3, stride=stride, pad=1, no_bias=1)
            r = brew.spatial_bn(m, r, f"{pre}_branch2b_bn", width, is_test=1)
            r = brew.relu(m, r, r)
            r = brew.conv(m, r, f"{pre}_branch2c", width, 4 * width, kernel=1, no_bias=1)
            r = brew.spatial_bn(m, r, f"{pre}_branch2c_bn", 4 * width, is_test=1)
            if b == 0:
                sc = brew.conv(m, x, f"{pre}_branch1", dim_in, 4 * width, kernel=1, stride=stride, no_bias=1)
                sc = brew.spatial_bn(m, sc, f"{pre}_branch1_bn", 4 * width, is_test=1)
            else:
                sc = x
            x = brew.sum(m, [sc, r], f"{pre}_sum")
            x = brew.relu(m, x, x)
            dim_in = 4 * width
    x = brew.average_pool(m, x, "pool5", global_pooling=1)
    x = brew.fc(m, x, "pred", 2048, 1000)
    m.net.AddExternalOutput(brew.softmax(m, x, "softmax"))
    m.net.AddExternalOutput(x)
    return m


def build_small_cnn(brew, model_helper):
    m = model_helper.ModelHelper(name="small_cnn")
    x = brew.conv(m, "data", "conv1", 1, 20, kernel=5)
    x = brew.max_pool(m, x, "pool1", kernel=2, stride=2)
    x = brew.conv(m, x, "conv2", 20, 50, kernel=5)
    x = brew.max_pool(m, x, "pool2", kernel=2, stride=2)
    x = brew.fc(m, x, "fc3", 50 * 4 * 4, 500)
    x = brew.relu(m, x, x)
    x = brew.fc(m, x, "pred", 500, 10)
    m.net.AddExternalOutput(brew.softmax(m, x, "softmax"))
    m.net.AddExternalOutput(x)
    return m


def export(name, batch, path):
    """Builds the Caffe2 net, gives its parameters seeded values (and the
    batch norms trained-looking statistics) and writes the ONNX model."""
    import numpy as np

    from ferrocaffe import brew, core, model_helper, workspace
    from ferrocaffe.onnx import frontend
    m = (build_resnet50 if name == "resnet50" else build_small_cnn)(brew, model_helper)
    ws = workspace.Workspace()
    init = m.param_init_net.Proto()
    for i, op in enumerate(init.op):
        op.device_option.random_seed = 100 + i
    ws.run(init)
    rng = np.random.default_rng(0)
    fixed = core.Net(f"{name}_init")
    for op in init.op:
        blob = op.output[0]
        v = ws.fetch_blob(blob)
        if "_bn_" in blob:  # batch norm: scale, bias, running mean and variance
            kind = blob.rsplit("_", 1)[1]
            v = {"s": lambda: rng.uniform(0.5, 1.0, v.shape),
                 "b": lambda: rng.normal(0.0, 0.1, v.shape),
                 "rm": lambda: rng.normal(0.0, 0.1, v.shape),
                 "riv": lambda: rng.uniform(0.5, 1.5, v.shape)}[kind]()
        fixed.GivenTensorFill([], blob, shape=list(v.shape), values=v.astype(np.float32).ravel().tolist())
    model = frontend.caffe2_net_to_onnx_model(
        m.net.Proto(), fixed.Proto(), {"data": (1, [batch, *IMAGE[name]])})
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def best_of(f, trials):
    f()
    best, spent, calls = float("inf"), 0.0, 0
    while calls < trials or (spent < BUDGET and calls < 50):
        t = time.perf_counter()
        f()
        t = time.perf_counter() - t
        best, spent, calls = min(best, t), spent + t, calls + 1
    return best


def child(runtime, threads, model_path, batch, save):
    import numpy as np
    name = os.path.basename(model_path).split("_b")[0]
    x = np.random.default_rng(42).standard_normal((batch, *IMAGE[name])).astype(np.float32)
    if runtime == "ours":
        import onnx

        from ferrocaffe.onnx import backend
        rep = backend.prepare(onnx.load(model_path))
        f = lambda: rep.run([x])  # noqa: E731
    else:
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
        f = lambda: sess.run(None, {"data": x})  # noqa: E731
    y = f()[1]  # the logits (a saturated softmax would hide differences)
    if save:
        np.save(save, y)
    return best_of(f, TRIALS)


def run_child(runtime, threads, model_path, batch, save):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, __file__, "--child", runtime, str(threads), model_path,
                          str(batch), save or ""], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"child {runtime} {threads} {model_path} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with tempfile.TemporaryDirectory(prefix="bench_onnx_") as tmp:
        measure(rounds, tmp)


def measure(rounds, tmp):
    import numpy as np
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}, "
          f"{os.cpu_count()} CPUs, {rounds} rounds", flush=True)
    try:
        import onnxruntime
        print(f"onnxruntime {onnxruntime.__version__}", flush=True)
    except ImportError:
        raise SystemExit("bench_onnx.py needs onnxruntime: pip install '.[bench]'") from None
    print(f"{'model':10} {'N':>3} {'thr':>3} {'ours ms':>9} {'ORT ms':>9} {'ratio':>6}  ORT agrees with ours")
    only = os.environ.get("BENCH_ONLY")
    for name in MODELS:
        if only and only not in name:
            continue
        for batch in BATCHES:
            path = os.path.join(tmp, f"{name}_b{batch}.onnx")
            export(name, batch, path)
            for threads in THREADS:
                best = {"ours": float("inf"), "ort": float("inf")}
                saved = {}
                for r in range(rounds):
                    for runtime in ("ours", "ort"):
                        save = os.path.join(tmp, f"{name}_{batch}_{threads}_{runtime}.npy") if r == 0 else None
                        t = run_child(runtime, threads, path, batch, save)["seconds"]
                        best[runtime] = min(best[runtime], t)
                        if save:
                            saved[runtime] = np.load(save)
                a, b = saved["ours"], saved["ort"]
                diff = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
                same = bool((a.argmax(axis=1) == b.argmax(axis=1)).all())
                ok = "agree" if diff < 1e-4 and same else "DISAGREE"
                verdict = f"{ok}: logits rel diff {diff:.1e}, argmax {'same' if same else 'DIFFERENT'}"
                print(f"{name:10} {batch:3} {threads:3} {best['ours'] * 1e3:9.2f} "
                      f"{best['ort'] * 1e3:9.2f} {best['ort'] / best['ours']:6.2f}  {verdict}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, runtime, threads, model_path, batch, save = sys.argv
        seconds = child(runtime, int(threads), model_path, int(batch), save or None)
        print(json.dumps({"seconds": seconds}))
    else:
        main()
