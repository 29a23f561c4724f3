"""Runs the model zoo's int8 Mask R-CNN 2Go predict net (github
caffe2/models: mask_rcnn_2go/model/int8/model.pbtxt; fetch it yourself,
nothing of the zoo is kept here) with quantised weights generated from a
fixed seed, since the zoo's init net is not readable (it is stored in Git
LFS): op by op, inferring each layer's width as benches/zoo_detection.py
does (a Conv feeding a grouped Conv gets its group, one feeding a Sum the
other addend's channels, a grouped Conv its input's, the heads from a
table, else its input's channels) and choosing each filter's scale so its
requantisation multiplier is below 1; then whole through CreateNet/RunNet
with an init net of Int8GivenTensorFill / Int8GivenIntTensorFill ops, and
checks the two runs agree exactly (issue 29).

    python benches/zoo_int8.py PREDICT_NET.pbtxt [IMAGE_SIDE]
"""
import sys
import time

import numpy as np
from google.protobuf import text_format

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "python"))
from ferrocaffe import core, workspace  # noqa: E402
from ferrocaffe.proto import caffe2_pb2  # noqa: E402
from ferrocaffe.workspace import Int8Tensor  # noqa: E402

path = sys.argv[1]
size = int(sys.argv[2]) if len(sys.argv) > 2 else 320
net = caffe2_pb2.NetDef()
text_format.Merge(open(path).read(), net)
A = 15
HEADS = {"rpn_cls_logits_w_int8": A, "rpn_bbox_pred_w_int8": 4 * A, "cls_score_w_int8": 81,
         "bbox_pred_w_int8": 324, "mask_fcn_logits_w_int8": 81}
CONVS = ("Int8Conv", "Int8ConvRelu")
KEEP = ("Int8ResizeNearest", "Int8Dequantize", "Int8AveragePool", "Int8MaxPool")
rng = np.random.default_rng(0)
params = {}


def anchors(stride=16, sizes=(32, 64, 128, 256, 512), ratios=(0.5, 1, 2)):
    out = []
    w = h = float(stride)
    cx = cy = 0.5 * (stride - 1)
    for r in ratios:
        ws = np.round(np.sqrt(w * h / r))
        hs = np.round(ws * r)
        for s in sizes:
            sw, sh = ws * s / stride, hs * s / stride
            out.append([cx - 0.5 * (sw - 1), cy - 0.5 * (sh - 1), cx + 0.5 * (sw - 1), cy + 0.5 * (sh - 1)])
    return np.array(out, np.float32)


def arg(op, name, default):
    for a in op.arg:
        if a.name == name:
            return a.f if a.HasField("f") else a.i
    return default


def channels(name):
    v = workspace.FetchBlob(name)
    return v.data.shape[-1] if isinstance(v, Int8Tensor) else v.shape[1]


def width(op, later):
    w = op.input[1]
    if w in HEADS:
        return HEADS[w]
    c = channels(op.input[0])
    if op.type in CONVS and arg(op, "group", 1) > 1:
        return c
    out = op.output[0]
    for o in later:
        if out not in o.input:
            continue
        if o.type in KEEP and o.output[0] != out:
            out = o.output[0]  # channels kept: follow the new name
            continue
        if o.type in CONVS and arg(o, "group", 1) > 1:
            return arg(o, "group", 1)
        if o.type in ("Int8Sum", "Int8SumRelu"):
            others = [i for i in o.input if i != out and workspace.HasBlob(i)]
            if others:
                return channels(others[0])
    return c


def ensure_params(op, later):
    if op.type not in CONVS + ("Int8FC",) or op.input[1] in params:
        return
    x = workspace.FetchBlob(op.input[0])
    m = width(op, later)
    if op.type in CONVS:
        k, g = arg(op, "kernel", 1), arg(op, "group", 1)
        shape = (m, k, k, x.data.shape[-1] // g)
    else:
        shape = (m, int(np.prod(x.data.shape[1:])))
    # Real weights ~ N(0, 2 / fan_in), quantised around 128 with +-4 sigma in
    # range; the scale is cut where the requantisation would reach 1.
    sigma = np.sqrt(2.0 / np.prod(shape[1:]))
    y_scale = arg(op, "Y_scale", 1.0)
    w_scale = min(4 * sigma / 127, 0.9 * y_scale / x.scale)
    w = np.clip(np.rint(rng.standard_normal(shape) * sigma / w_scale) + 128, 0, 255).astype(np.uint8)
    params[op.input[1]] = Int8Tensor(w, float(np.float32(w_scale)), 128)
    b_scale = float(np.float32(x.scale) * np.float32(w_scale))
    if op.input[2] not in params:
        bias = 3.0 if op.input[1] == "cls_score_w_int8" else 0.01  # peaky class scores
        b = np.zeros(m, np.int32) if op.input[2].startswith("b_zero_generated") else \
            np.rint(rng.standard_normal(m) * bias / b_scale).astype(np.int32)
        params[op.input[2]] = Int8Tensor(b, b_scale, 0)
    for k in op.input[1:]:
        workspace.FeedBlob(k, params[k])


def run_opwise(ops):
    ops = list(ops)
    for i, op in enumerate(ops):
        if op.type == "If":
            cond = bool(workspace.FetchBlob(op.input[0]).item())
            for a in op.arg:
                if a.name == ("then_net" if cond else "else_net"):
                    print("  If takes", a.name, a.n.name, len(a.n.op), "ops")
                    run_opwise(a.n.op)
            continue
        ensure_params(op, ops[i + 1:])
        workspace.RunOperatorOnce(op)


feeds = {"data": (rng.standard_normal((1, 3, size, size)) * 40).astype(np.float32),
         "im_info": np.array([[size, size, 1.0]], np.float32), "anchor": anchors()}
workspace.ResetWorkspace()
for k, v in feeds.items():
    workspace.FeedBlob(k, v)
t0 = time.time()
run_opwise(net.op)
print("op by op: %.1fs, %d quantised parameters" % (time.time() - t0, len(params)))
ref = {o: workspace.FetchBlob(o) for o in net.external_output}
for o, v in ref.items():
    print(" ", o, v.shape, v.dtype, v.ravel()[:4])

# The whole net through CreateNet / RunNet, parameters from an init net of
# Int8 fills (as Caffe2's int8 init nets lay them out).
workspace.ResetWorkspace()
init = caffe2_pb2.NetDef()
init.name = "init"
for k, v in params.items():
    if v.data.dtype == np.uint8:
        init.op.extend([core.CreateOperator(
            "Int8GivenTensorFill", [], [k], shape=list(v.data.shape), values=v.data.tobytes(),
            Y_scale=v.scale, Y_zero_point=v.zero_point)])
    else:
        init.op.extend([core.CreateOperator(
            "Int8GivenIntTensorFill", [], [k], shape=list(v.data.shape),
            values=v.data.ravel().tolist(), Y_scale=v.scale, Y_zero_point=v.zero_point)])
workspace.RunNetOnce(init)
for k, v in feeds.items():
    workspace.FeedBlob(k, v)
workspace.CreateNet(net)
t0 = time.time()
workspace.RunNet(net.name)
print("RunNet: %.1fs" % (time.time() - t0))
for o in net.external_output:
    v = workspace.FetchBlob(o)
    same = v.shape == ref[o].shape and np.array_equal(v, ref[o])
    print(" ", o, v.shape, "same as op by op" if same else "DIFFERS")
