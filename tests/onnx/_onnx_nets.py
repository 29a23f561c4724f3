"""Helpers of the ONNX tests: Caffe2 nets built op by op, run on
ferrocaffe, exported with the frontend and run by onnx's own
ReferenceEvaluator (the independent model the exports are checked
against)."""

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ferrocaffe import workspace
from ferrocaffe.onnx import frontend
from ferrocaffe.proto import caffe2_pb2
from ferrocaffe.utils import MakeArgument

FLOAT = onnx.TensorProto.FLOAT


def op(op_type, inputs, outputs, **args):
    o = caffe2_pb2.OperatorDef()
    o.type = op_type
    o.input.extend(inputs)
    o.output.extend(outputs)
    for k, v in args.items():
        o.arg.append(MakeArgument(k, v))
    return o


def netdef(name, ops, inputs, outputs):
    n = caffe2_pb2.NetDef()
    n.name = name
    n.op.extend(ops)
    n.external_input.extend(inputs)
    n.external_output.extend(outputs)
    return n


def init_net(params, name="init"):
    """GivenTensor*Fill ops making `params` ({name: array})."""
    kinds = {np.dtype(np.float32): ("GivenTensorFill", "values"),
             np.dtype(np.int64): ("GivenTensorInt64Fill", "values"),
             np.dtype(np.int32): ("GivenTensorIntFill", "values")}
    ops = []
    for k, v in params.items():
        kind, field = kinds[v.dtype]
        vals = v.reshape(-1).tolist()
        ops.append(op(kind, [], [k], shape=list(v.shape), **{field: vals}))
    return netdef(name, ops, [], list(params))


def run_caffe2(pred, params, feeds):
    """The predict net's outputs on ferrocaffe (a private workspace)."""
    ws = workspace.Workspace()
    for k, v in list(params.items()) + list(feeds.items()):
        ws.feed_blob(k, v)
    ws.run(pred)
    return [ws.fetch_blob(o) for o in pred.external_output]


def value_info(feeds):
    return {k: (onnx.helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
            for k, v in feeds.items()}


def export(pred, params, feeds, **kwargs):
    init = init_net(params) if params else None
    return frontend.caffe2_net_to_onnx_model(pred, init, value_info(feeds), **kwargs)


class _LRN(OpRun):
    """LRN as ONNX's spec defines it. onnx 1.23's reference loops over the
    batch dim where it means the channels (channel c >= N gets the sum of
    the wrong window), so the tests give the evaluator this one."""

    op_domain = ""

    def _run(self, x, alpha=None, beta=None, bias=None, size=None):
        c = x.shape[1]
        sq = np.zeros_like(x)
        for i in range(c):
            lo, hi = max(0, i - (size - 1) // 2), min(c - 1, i + size // 2)
            sq[:, i] = np.sum(x[:, lo:hi + 1] ** 2, axis=1)
        return ((x / (bias + (alpha / size) * sq) ** beta).astype(x.dtype),)


_LRN.__name__ = "LRN"


def run_reference(model, feeds):
    return ReferenceEvaluator(model, new_ops=[_LRN]).run(None, feeds)


def single_op_net(op_type, inputs, outputs=("y",), params=None, **args):
    """A net of one op whose inputs are `inputs` ({name: array}); names
    in `params` come from the init net."""
    params = params or {}
    pred = netdef(f"{op_type.lower()}_net", [op(op_type, list(inputs) + list(params), list(outputs), **args)],
                  list(inputs) + list(params), list(outputs))
    return pred
