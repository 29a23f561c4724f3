"""Runs a Caffe2 model-zoo detection predict net (github caffe2/models:
detectron/e2e_faster_rcnn_R-50-C4_*/predict_net.pbtxt, or
mask_rcnn_2go/model/fp32/model.pbtxt; fetch it yourself, nothing of the zoo
is kept here) with weights generated from a fixed seed, since the zoo's are
not readable: op by op, inferring the layer widths (a Conv feeding a grouped
Conv gets its group, one feeding a Sum the other addend's channels, a
grouped Conv its input's, the heads from a table, else its input's
channels), then whole through CreateNet/RunNet with an init net of
GivenTensorFill ops, and checks the two runs agree (issue 29).

    python benches/zoo_detection.py PREDICT_NET.pbtxt [IMAGE_SIDE]
"""
import sys
import time

import numpy as np
from google.protobuf import text_format

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "python"))
from ferrocaffe import core, workspace  # noqa: E402
from ferrocaffe.proto import caffe2_pb2  # noqa: E402

path = sys.argv[1]
size = int(sys.argv[2]) if len(sys.argv) > 2 else 320
net = caffe2_pb2.NetDef()
text_format.Merge(open(path).read(), net)
A = 15
HEADS = {"rpn_cls_logits_w": A, "rpn_bbox_pred_w": 4 * A, "cls_score_w": 81, "bbox_pred_w": 324,
         "mask_fcn_logits_w": 81, "conv1_w": 64}
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
            return a.i
    return default


def channels(name):
    return workspace.FetchBlob(name).shape[1]


def width(op, later):
    w = op.input[1]
    if w in HEADS:
        return HEADS[w]
    c = channels(op.input[0])
    if op.type == "Conv" and arg(op, "group", 1) > 1:
        return c
    out = op.output[0]
    for o in later:
        if out not in o.input:
            continue
        if o.type in ("Relu", "ResizeNearest", "Sigmoid") and o.output[0] != out:
            out = o.output[0]  # channels kept: follow the new name
            continue
        if o.type == "Conv" and arg(o, "group", 1) > 1:
            return arg(o, "group", 1)
        if o.type == "Sum":
            others = [i for i in o.input if i != out and workspace.HasBlob(i)]
            if others:
                return channels(others[0])
    return c


def ensure_params(op, later):
    if op.type not in ("Conv", "FC") or op.input[1] in params:
        return
    x = workspace.FetchBlob(op.input[0])
    m = width(op, later)
    if op.type == "Conv":
        k, g = arg(op, "kernel", 1), arg(op, "group", 1)
        shape = (m, x.shape[1] // g, k, k)
    else:
        shape = (m, int(np.prod(x.shape[1:])))
    params[op.input[1]] = (rng.standard_normal(shape) * np.sqrt(1.0 / np.prod(shape[1:]))).astype(np.float32)
    if len(op.input) > 2:
        scale = 3.0 if op.input[1] == "cls_score_w" else 0.01  # peaky class scores: detections
        params[op.input[2]] = (rng.standard_normal(m) * scale).astype(np.float32)
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


feeds = {"data": rng.standard_normal((1, 3, size, size)).astype(np.float32),
         "im_info": np.array([[size, size, 1.0]], np.float32), "anchor": anchors()}
workspace.ResetWorkspace()
for k, v in feeds.items():
    workspace.FeedBlob(k, v)
t0 = time.time()
run_opwise(net.op)
print("op by op: %.1fs, %d parameters" % (time.time() - t0, len(params)))
ref = {o: workspace.FetchBlob(o) for o in net.external_output}
for o, v in ref.items():
    print(" ", o, v.shape, v.dtype, v.ravel()[:4])
print("  rois", workspace.FetchBlob("rpn_rois" if workspace.HasBlob("rpn_rois") else "rois").shape)

# The whole net through CreateNet / RunNet, parameters from an init net of
# GivenTensorFill ops (as the zoo's init_net.pb lays them out).
workspace.ResetWorkspace()
init = caffe2_pb2.NetDef()
init.name = "init"
for k, v in params.items():
    init.op.extend([core.CreateOperator("GivenTensorFill", [], [k], shape=list(v.shape),
                                        values=v.ravel().tolist())])
workspace.RunNetOnce(init)
for k, v in feeds.items():
    workspace.FeedBlob(k, v)
workspace.CreateNet(net)
t0 = time.time()
workspace.RunNet(net.name)
print("RunNet: %.1fs" % (time.time() - t0))
for o in net.external_output:
    v = workspace.FetchBlob(o)
    same = v.shape == ref[o].shape and np.allclose(v, ref[o], rtol=1e-5, atol=1e-6)
    print(" ", o, v.shape, "same as op by op" if same else "DIFFERS")
