"""The Caffe2 model zoo's classification nets (issue 29), ferrocaffe against
PyTorch on the same weights, batch 1 and 16, 1 and 2 threads.

    # fetch the predict nets yourself (github caffe2/models: <net>/predict_net.pbtxt),
    # as ZOO/<net>.pbtxt; nothing of the zoo is kept in this repository
    PROFILE=release bash scripts/dev_build.sh
    BENCH_TORCH_PATH=... PYTHONPATH=python python benches/bench_zoo.py ZOO [NET ...]

Weights come from a fixed seed (benches/zoo_weights.py: each parameter's
shape from the op that reads it). Ours: the unmodified predict net through
``CreateNet``/``RunNet`` on fed weights. PyTorch: the same NetDef read op by
op into ``torch.nn.functional`` calls (Conv, pools with Caffe's ceil-mode
``legacy_pad``, LRN, SpatialBN in test mode, FC, Concat, Sum, broadcast
Mul/Add, Softmax; Dropout is the identity) under ``inference_mode``, so
both run the same arithmetic; the outputs are compared before timing.
Each (framework, net, batch, threads) is a fresh child process; time = the
median of ``--repeats`` runs after one warm-up, best of ``--rounds``
interleaved rounds; ratio = PyTorch's time / ours (above 1: ferrocaffe is
faster).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_peer import import_torch  # noqa: E402

NETS = ["resnet50", "vgg19", "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2",
        "zfnet512"]
MARK = "RESULT "


def args_of(op):
    out = {}
    for a in op.arg:
        if a.HasField("i"):
            out[a.name] = a.i
        elif a.HasField("f"):
            out[a.name] = a.f
        elif a.ints:
            out[a.name] = list(a.ints)
        elif a.HasField("s"):
            out[a.name] = a.s.decode()
    return out


def _window(a, name, default):
    if name in a:
        return a[name], a[name]
    if name + "s" in a:
        return tuple(a[name + "s"])
    return (a.get(name + "_h", default), a.get(name + "_w", default))


def _pads(a):
    if "pad" in a:
        return (a["pad"],) * 4
    if "pads" in a:
        return tuple(a["pads"])
    return (a.get("pad_t", 0), a.get("pad_l", 0), a.get("pad_b", 0), a.get("pad_r", 0))


def torch_forward(torch, nd, blobs):
    """Runs NetDef ``nd`` with torch.nn.functional over ``blobs`` (name ->
    tensor), in place."""
    F = torch.nn.functional
    for op in nd.op:
        a = args_of(op)
        x = [blobs[i] for i in op.input]
        t = op.type
        if t == "Conv":
            pt, pl, pb, pr = _pads(a)
            y = x[0]
            if (pt, pl) != (pb, pr):
                y = F.pad(y, (pl, pr, pt, pb))
                pt = pl = 0
            y = F.conv2d(y, x[1], x[2] if len(x) > 2 else None, stride=_window(a, "stride", 1),
                         padding=(pt, pl), dilation=_window(a, "dilation", 1),
                         groups=a.get("group", 1))
        elif t in ("MaxPool", "AveragePool"):
            if a.get("global_pooling"):
                y = (F.adaptive_max_pool2d if t == "MaxPool" else F.adaptive_avg_pool2d)(x[0], 1)
            else:
                k, s = _window(a, "kernel", 1), _window(a, "stride", 1)
                pt, pl, pb, pr = _pads(a)
                ceil = a.get("legacy_pad", 0) == 3
                include = bool(a.get("count_include_pad", 0))
                if (pt, pl) != (pb, pr) and t == "MaxPool":
                    x[0] = F.pad(x[0], (pl, pr, pt, pb), value=float("-inf"))
                    pt = pl = pb = pr = 0
                if (pt, pl) != (pb, pr):
                    # Padded by hand: the mean over the window's real
                    # elements is the window's mean over the zero-padded
                    # input divided by the share of real elements in it.
                    pad = (pl, pr, pt, pb)
                    mean = F.avg_pool2d(F.pad(x[0], pad), k, s, 0, ceil_mode=ceil,
                                        count_include_pad=True)
                    real = F.avg_pool2d(F.pad(torch.ones_like(x[0][:1, :1]), pad), k, s, 0,
                                        ceil_mode=ceil, count_include_pad=True)
                    y = mean if include else mean / real
                elif t == "MaxPool":
                    y = F.max_pool2d(x[0], k, s, (pt, pl), ceil_mode=ceil)
                else:
                    y = F.avg_pool2d(x[0], k, s, (pt, pl), ceil_mode=ceil,
                                     count_include_pad=include)
        elif t == "Relu":
            y = F.relu(x[0])
        elif t == "LRN":
            y = F.local_response_norm(x[0], a["size"], a.get("alpha", 0.0), a.get("beta", 0.0),
                                      a.get("bias", 1.0))
        elif t == "SpatialBN":
            y = F.batch_norm(x[0], x[3], x[4], x[1], x[2], False, 0.0, a.get("epsilon", 1e-5))
        elif t == "FC":
            w = x[1].reshape(x[1].shape[0], -1)
            y = F.linear(x[0].reshape(x[0].shape[0], -1), w, x[2])
        elif t == "Concat":
            y = torch.cat(x, dim=a.get("axis", 1))
        elif t == "Sum":
            y = x[0]
            for other in x[1:]:
                y = y + other
        elif t in ("Mul", "Add"):
            other = x[1].reshape(1, -1, 1, 1) if a.get("broadcast") else x[1]
            y = x[0] * other if t == "Mul" else x[0] + other
        elif t == "Dropout":
            y = x[0]
        elif t == "Softmax":
            y = F.softmax(x[0], dim=a.get("axis", 1))
        else:
            raise SystemExit("bench_zoo: no PyTorch form for op %s" % t)
        blobs[op.output[0]] = y
    return blobs


def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def child(which, path, name, batch, threads, repeats):
    import numpy as np
    import zoo_weights
    nd = zoo_weights.load(path)
    x, params = zoo_weights.make_weights(name, nd, batch=batch)
    data = zoo_weights.INPUT.get(name, "data")
    out = nd.external_output[-1] if nd.external_output else nd.op[-1].output[0]
    if which == "ours":
        from ferrocaffe import _core, workspace
        _core.set_num_threads(threads)
        ws = workspace.Workspace()
        for k, v in params.items():
            ws.feed_blob(k, v)
        ws.feed_blob(data, x)
        ws.create_net(nd)
        seconds = timed(lambda: ws.run_net(nd.name), repeats)
        y = ws.fetch_blob(out)
    else:
        torch = import_torch()
        if torch is None:
            print(MARK + json.dumps(None), flush=True)
            return
        torch.set_num_threads(threads)
        blobs = {k: torch.from_numpy(v) for k, v in params.items()}
        blobs[data] = torch.from_numpy(x)
        with torch.inference_mode():
            seconds = timed(lambda: torch_forward(torch, nd, dict(blobs)), repeats)
            y = torch_forward(torch, nd, dict(blobs))[out].numpy()
    print(MARK + json.dumps({"seconds": seconds, "out": np.asarray(y, np.float64).tolist()}),
          flush=True)


def run_child(which, path, name, batch, threads, repeats):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS="1", RAYON_NUM_THREADS=str(threads))
    done = subprocess.run(
        [sys.executable, __file__, "--child", which, "--net", name, "--batch", str(batch),
         "--threads", str(threads), "--repeats", str(repeats), path],
        env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise SystemExit("child %s %s failed:\n%s%s" % (which, name, done.stdout, done.stderr))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("zoo", help="a folder of <net>.pbtxt predict nets (or one file with --child)")
    p.add_argument("nets", nargs="*", default=None)
    p.add_argument("--child")
    p.add_argument("--net")
    p.add_argument("--batch", type=int, nargs="*", default=[1, 16])
    p.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.zoo, args.net, args.batch[0], args.threads[0], args.repeats)
    import numpy as np
    nets = args.nets or [n for n in NETS if os.path.exists(os.path.join(args.zoo, n + ".pbtxt"))]
    print("load average %.1f/%.1f/%.1f" % os.getloadavg())
    print("%-14s %5s %7s %10s %10s %9s  %s" % ("net", "batch", "threads", "ours ms", "torch ms",
                                              "torch/ours", "agree (max rel. diff)"))
    for name in nets:
        path = os.path.join(args.zoo, name + ".pbtxt")
        for batch in args.batch:
            for threads in args.threads:
                best = {}
                outs = {}
                for _ in range(args.rounds):
                    for which in ("ours", "torch"):
                        got = run_child(which, path, name, batch, threads, args.repeats)
                        if got is None:
                            continue
                        best[which] = min(got["seconds"], best.get(which, got["seconds"]))
                        outs[which] = np.array(got["out"])
                agree = "-"
                if "torch" in outs:
                    a, b = outs["ours"], outs["torch"]
                    rel = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
                    same = bool((a.reshape(len(a), -1).argmax(1) == b.reshape(len(b), -1).argmax(1)).all())
                    agree = "%s (%.1e)" % ("yes" if rel < 1e-3 and same else "NO", rel)
                t = best.get("torch")
                print("%-14s %5d %7d %10.1f %10s %9s  %s" % (
                    name, batch, threads, 1e3 * best["ours"], "-" if t is None else "%.1f" % (1e3 * t),
                    "-" if t is None else "%.2fx" % (t / best["ours"]), agree), flush=True)


if __name__ == "__main__":
    main()
