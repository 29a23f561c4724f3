"""Fixed-seed weights for the Caffe2 model zoo's classification predict nets
(github caffe2/models: resnet50, vgg19, bvlc_alexnet, densenet121,
inception_v1, inception_v2, zfnet512), whose published weights are not in a
readable form: each parameter's shape follows from the op that reads it and
its input (the widths from the published architectures where the predict
net does not fix them). Used by benches/bench_zoo.py; nothing of the zoo is
kept in this repository (fetch the predict_net.pbtxt files yourself)."""

import re

import numpy as np
from google.protobuf import text_format

from ferrocaffe import workspace
from ferrocaffe.proto import caffe2_pb2

NETS = ["resnet50", "vgg19", "bvlc_alexnet", "densenet121", "inception_v1",
        "inception_v2", "zfnet512"]
INPUT = {"resnet50": "gpu_0/data", "zfnet512": "gpu_0/data"}

GOOGLENET = {  # module: 1x1, 3x3_reduce, 3x3, 5x5_reduce, 5x5, pool_proj
    "3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128), "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128)}
BN_INCEPTION = {  # module: 1x1, 3x3_reduce, 3x3, double3x3_reduce, double3x3, pool_proj
    "3a": (64, 64, 64, 64, 96, 32), "3b": (64, 64, 96, 64, 96, 64),
    "3c": (0, 128, 160, 64, 96, 0), "4a": (224, 64, 96, 96, 128, 128),
    "4b": (192, 96, 128, 96, 128, 128), "4c": (160, 128, 160, 128, 160, 128),
    "4d": (96, 128, 192, 160, 192, 128), "4e": (0, 128, 192, 192, 256, 0),
    "5a": (352, 192, 320, 160, 224, 128), "5b": (352, 192, 320, 192, 224, 128)}


def width(net, w, in_ch):
    """Output channels of the conv/FC whose weight is `w`."""
    n = w.replace("gpu_0/", "")
    if net in ("bvlc_alexnet", "zfnet512"):
        return {"conv1_w": 96, "conv2_w": 256, "conv3_w": 384, "conv4_w": 384,
                "conv5_w": 256, "fc6_w": 4096, "fc7_w": 4096, "fc8_w": 1000}[n]
    if net == "vgg19":
        m = re.match(r"conv(\d)_", n)
        if m:
            return [64, 128, 256, 512, 512][int(m.group(1)) - 1]
        return {"fc6_w": 4096, "fc7_w": 4096, "fc8_w": 1000}[n]
    if net == "resnet50":
        if n == "conv1_w":
            return 64
        if n == "pred_w":
            return 1000
        m = re.match(r"res(\d)_\d+_branch(2a|2b|2c|1)_w", n)
        planes = 64 * 2 ** (int(m.group(1)) - 2)
        return planes if m.group(2) in ("2a", "2b") else 4 * planes
    if net == "densenet121":
        if n == "conv1_w":
            return 64
        if n == "fc6_w":
            return 1000
        if n.endswith("/x1_w"):
            return 128
        if n.endswith("/x2_w"):
            return 32
        if n.endswith("_blk_w"):
            return in_ch // 2
    if net == "inception_v1":
        fixed = {"conv1/7x7_s2_w": 64, "conv2/3x3_reduce_w": 64, "conv2/3x3_w": 192,
                 "loss3/classifier_w": 1000}
        if n in fixed:
            return fixed[n]
        m = re.match(r"inception_(\w\w)/(1x1|3x3_reduce|3x3|5x5_reduce|5x5|pool_proj)_w", n)
        keys = ["1x1", "3x3_reduce", "3x3", "5x5_reduce", "5x5", "pool_proj"]
        return GOOGLENET[m.group(1)][keys.index(m.group(2))]
    if net == "inception_v2":
        fixed = {"conv1/7x7_s2_w": 64, "conv2/3x3_reduce_w": 64, "conv2/3x3_w": 192,
                 "fc_w": 1000, "loss3/classifier_w": 1000}
        if n in fixed:
            return fixed[n]
        m = re.match(r"inception_(\w\w)/(1x1|3x3_reduce|3x3|double3x3_reduce|double3x3a|"
                     r"double3x3b|pool_proj)_w", n)
        if m:
            keys = ["1x1", "3x3_reduce", "3x3", "double3x3_reduce", "double3x3", "pool_proj"]
            k = m.group(2)
            k = "double3x3" if k.startswith("double3x3") and k != "double3x3_reduce" else k
            return BN_INCEPTION[m.group(1)][keys.index(k)]
    raise KeyError(f"{net}: no width for {w}")


def load(path):
    """The NetDef of a predict_net.pbtxt file."""
    nd = caffe2_pb2.NetDef()
    with open(path) as f:
        text_format.Parse(f.read(), nd)
    return nd


def arg(op, name, default=None):
    for a in op.arg:
        if a.name == name:
            return a.i if a.HasField("i") else a.f
    return default


def make_weights(net, nd, batch=1, seed=0):
    """{param: array} for the predict net `nd`, from a walk through its ops
    (each op run once in a scratch workspace to get the next shapes)."""
    rng = np.random.default_rng(seed)
    data = INPUT.get(net, "data")
    ws = workspace.Workspace()
    x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
    ws.feed_blob(data, x)
    params = {}

    def put(name, value):
        params[name] = value.astype(np.float32)
        ws.feed_blob(name, params[name])

    for op in nd.op:
        ins = list(op.input)
        if op.type == "Conv":
            xs = ws.fetch_blob(ins[0]).shape
            c = xs[1]
            k = arg(op, "kernel")
            g = arg(op, "group", 1)
            m = width(net, ins[1], c)
            put(ins[1], rng.standard_normal((m, c // g, k, k)) * np.sqrt(2.0 / (c // g * k * k)))
            if len(ins) > 2:
                put(ins[2], rng.standard_normal(m) * 0.05)
        elif op.type == "FC":
            xs = ws.fetch_blob(ins[0]).shape
            kdim = int(np.prod(xs[1:]))
            m = width(net, ins[1], kdim)
            w = rng.standard_normal((m, kdim)) * np.sqrt(1.0 / kdim)
            if arg(op, "axis_w", 1) == 3:
                w = w.reshape(m, 1, 1, kdim)
            put(ins[1], w)
            put(ins[2], rng.standard_normal(m) * 0.05)
        elif op.type == "SpatialBN":
            c = ws.fetch_blob(ins[0]).shape[1]
            put(ins[1], rng.uniform(0.5, 1.5, c))
            put(ins[2], rng.standard_normal(c) * 0.1)
            put(ins[3], rng.standard_normal(c) * 0.1)
            put(ins[4], rng.uniform(0.5, 1.5, c))
        elif op.type in ("Mul", "Add") and arg(op, "broadcast", 0) and ins[1] not in params:
            c = ws.fetch_blob(ins[0]).shape[1]
            put(ins[1], rng.uniform(0.5, 1.5, c) if op.type == "Mul" else rng.standard_normal(c) * 0.1)
        ws.run(op)
    return x, params


def init_net(name, params):
    init = caffe2_pb2.NetDef()
    init.name = name + "_init"
    for n, v in params.items():
        op = init.op.add()
        op.type = "GivenTensorFill"
        op.output.append(n)
        a = op.arg.add()
        a.name = "shape"
        a.ints.extend(v.shape)
        a = op.arg.add()
        a.name = "values"
        a.floats.extend(v.reshape(-1).tolist())
    return init
