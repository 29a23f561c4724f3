"""ONNX models on ferrocaffe (Caffe2's ``caffe2.python.onnx.backend``).

    from ferrocaffe.onnx import backend
    rep = backend.prepare(onnx_model)          # or backend.run_model(model, inputs)
    outputs = rep.run([x])

The ``onnx.backend.base`` API: ``prepare``, ``run_model``, ``run_node``,
``supports_device`` (the CPU). Each ONNX node becomes one or more of
ferrocaffe's Caffe2 ops; ONNX's semantics are carried by the conversion,
not by the kernels: numpy broadcasting where an op has none, negative axes,
``auto_pad`` and ``ceil_mode`` as explicit pads, the opset's version of
each op (Softmax's axis before and after opset 13, attributes that became
inputs), and dtypes a kernel lacks through a cast to a wider type and
back. Initializers and constants are fed into the Rep's workspace
directly. ``onnx_graph_to_caffe2_net`` gives the NetDef pair (the init net
fills the initializers), as Caffe2's did.

A conversion that needs a static shape or the value of an input (Slice's
starts given as a graph input, a SAME pad on a symbolic dim) is made at run
time for the shapes and values of each call. An op or attribute value
without a conversion raises ``UnsupportedOperatorError`` naming the node;
``UNSUPPORTED_OPS`` lists the ONNX ops known to have none, with the reason.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import _common  # noqa: F401  (the onnx import check)
from ._common import (
    C2_TO_ONNX_TYPE,
    NUMPY_OF_ONNX,
    ONNX_OF_NUMPY,
    ONNX_TO_C2_TYPE,
    ConversionError,
    NameGen,
    UnsupportedOperatorError,
    onnx_type_name,
    where,
)

import onnx
import onnx.shape_inference
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.base import Backend, Device, DeviceType, namedtupledict

from .. import errors, workspace
from ..proto import caffe2_pb2
from ..utils import MakeArgument
from .backend_rep import Caffe2Rep

__all__ = [
    "Caffe2Backend", "prepare", "run_model", "run_node", "supports_device",
    "is_compatible", "onnx_graph_to_caffe2_net", "UNSUPPORTED_OPS",
]

#: ONNX ops with no conversion, and why. (An op missing from here and from
#: the converters is refused just the same.)
UNSUPPORTED_OPS = {
    "LSTM": "recurrent ops: no conversion to ferrocaffe's ops yet",
    "GRU": "recurrent ops: no conversion to ferrocaffe's ops yet",
    "RNN": "recurrent ops: no conversion to ferrocaffe's ops yet",
    "Loop": "control flow (subgraphs) is not converted",
    "If": "control flow (subgraphs) is not converted",
    "Scan": "control flow (subgraphs) is not converted",
    "Resize": "no resampling kernel (nearest/linear/cubic)",
    "Upsample": "no resampling kernel",
    "Einsum": "no general tensor contraction",
    "CumSum": "no cumulative-sum kernel",
    "CumProd": "no cumulative-product kernel",
    "ReduceProd": "no product reduction kernel",
    "NonZero": "no kernel with a data-dependent output shape of this kind",
    "Unique": "no kernel with a data-dependent output shape of this kind",
    "NonMaxSuppression": "no detection kernels",
    "RoiAlign": "no detection kernels",
    "MaxRoiPool": "no detection kernels",
    "GridSample": "no sampling kernel",
    "AffineGrid": "no sampling kernel",
    "DeformConv": "no deformable convolution",
    "Col2Im": "no col2im kernel",
    "MaxUnpool": "no unpooling kernel",
    "DFT": "no signal-processing kernels",
    "STFT": "no signal-processing kernels",
    "MelWeightMatrix": "no signal-processing kernels",
    "HannWindow": "no signal-processing kernels",
    "HammingWindow": "no signal-processing kernels",
    "BlackmanWindow": "no signal-processing kernels",
    "Det": "no determinant kernel",
    "Bernoulli": "random ops: results could not match any other runtime",
    "RandomNormal": "random ops: results could not match any other runtime",
    "RandomUniform": "random ops: results could not match any other runtime",
    "RandomNormalLike": "random ops: results could not match any other runtime",
    "RandomUniformLike": "random ops: results could not match any other runtime",
    "Multinomial": "random ops: results could not match any other runtime",
    "GatherElements": "no element-wise gather kernel",
    "GatherND": "no N-d gather kernel",
    "ScatterElements": "no element-wise scatter kernel",
    "ScatterND": "no N-d scatter kernel",
    "Scatter": "no element-wise scatter kernel",
    "TensorScatter": "no scatter kernel",
    "ReverseSequence": "no sequence-reversal kernel",
    "BitShift": "no shift kernel (and no unsigned 32/64-bit tensors)",
    "MatMulInteger": "quantized ops are not converted",
    "ConvInteger": "quantized ops are not converted",
    "QLinearConv": "quantized ops are not converted",
    "QLinearMatMul": "quantized ops are not converted",
    "QuantizeLinear": "quantized ops are not converted",
    "DequantizeLinear": "quantized ops are not converted",
    "DynamicQuantizeLinear": "quantized ops are not converted",
    "NegativeLogLikelihoodLoss": "training losses are not converted",
    "SoftmaxCrossEntropyLoss": "training losses are not converted",
    "Adagrad": "training ops (ai.onnx.preview.training) are not converted",
    "Adam": "training ops (ai.onnx.preview.training) are not converted",
    "Momentum": "training ops (ai.onnx.preview.training) are not converted",
    "Gradient": "training ops (ai.onnx.preview.training) are not converted",
    "StringNormalizer": "no string kernels",
    "StringConcat": "no string kernels",
    "StringSplit": "no string kernels",
    "RegexFullMatch": "no string kernels",
    "TfIdfVectorizer": "no string kernels",
    "LabelEncoder": "ai.onnx.ml ops are not converted",
    "TreeEnsemble": "ai.onnx.ml ops are not converted",
    "ArrayFeatureExtractor": "ai.onnx.ml ops are not converted",
    "Binarizer": "ai.onnx.ml ops are not converted",
    "ImageDecoder": "no image decoding",
    "BitCast": "no bit-cast kernel",
    "SequenceInsert": "sequence types are not converted",
    "SequenceMap": "sequence types are not converted",
    "SplitToSequence": "sequence types are not converted",
    "SequenceConstruct": "sequence types are not converted",
    "SequenceAt": "sequence types are not converted",
    "SequenceEmpty": "sequence types are not converted",
    "SequenceLength": "sequence types are not converted",
    "SequenceErase": "sequence types are not converted",
    "ConcatFromSequence": "sequence types are not converted",
    "OptionalGetElement": "optional types are not converted",
    "OptionalHasElement": "optional types are not converted",
    "Optional": "optional types are not converted",
    "Attention": "attention ops are not converted",
    "FlexAttention": "attention ops are not converted",
    "LinearAttention": "attention ops are not converted",
    "RotaryEmbedding": "attention ops are not converted",
    "CausalConvWithState": "no stateful convolution",
    "SwiGLU": "not converted yet",
}

_BOOL_OPS = {"EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or", "Xor", "Not"}
_SMALL_INTS = {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16}
_FLOATS = {TensorProto.FLOAT, TensorProto.DOUBLE}
_ARITH = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT64}


class _NeedsRunTime(Exception):
    """A conversion needs a static shape or an input's value that only a
    run can give."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


@dataclass
class _Converted:
    init_net: Any
    predict_net: Any
    init_values: dict
    inputs: list
    outputs: list
    values_used: set = field(default_factory=set)


def _attrs(node) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        if a.ref_attr_name:
            raise UnsupportedOperatorError(
                f"attribute '{a.name}' refers to a function attribute" + where(node.op_type, None, None, None, node.name))
        out[a.name] = helper.get_attribute_value(a)
    return out


class _NodeCx:
    """What one node's conversion sees and makes."""

    def __init__(self, gc: "_GraphConverter", node, index: int):
        self.gc = gc
        self.node = node
        self.index = index
        self.attrs = _attrs(node)
        self.opset = gc.opset
        self.ins = list(node.input)
        self.outs = list(node.output)
        self.ops: list = []

    # -- errors
    def _where(self, blob=None) -> str:
        return where(self.node.op_type, self.index, self.gc.graph_name, blob, self.node.name)

    def error(self, message: str, blob=None, cls=ConversionError):
        return cls(message + self._where(blob), op=self.node.op_type, op_index=self.index,
                   net=self.gc.graph_name, blob=blob)

    def unsupported(self, message: str, blob=None):
        return self.error(message, blob, UnsupportedOperatorError)

    # -- attributes and inputs
    def attr(self, name: str, default=None):
        v = self.attrs.get(name, default)
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        return v

    def inp(self, i: int) -> str:
        """Input i's name, or '' when absent."""
        return self.ins[i] if i < len(self.ins) else ""

    def out(self, i: int) -> str:
        return self.outs[i] if i < len(self.outs) else ""

    def wants(self, i: int) -> bool:
        return i < len(self.outs) and self.outs[i] != ""

    # -- shapes, types and values
    def shape(self, name: str):
        return self.gc.shape_of(name)

    def rank(self, name: str) -> int:
        s = self.shape(name)
        if s is None:
            raise _NeedsRunTime(f"the rank of '{name}'")
        return len(s)

    def static_shape(self, name: str) -> list[int]:
        s = self.shape(name)
        if s is None or any(d is None for d in s):
            raise _NeedsRunTime(f"the shape of '{name}'")
        return list(s)

    def dim(self, name: str, axis: int) -> int:
        s = self.shape(name)
        if s is None:
            raise _NeedsRunTime(f"the shape of '{name}'")
        d = s[axis]
        if d is None:
            raise _NeedsRunTime(f"dim {axis} of '{name}'")
        return d

    def dtype(self, name: str) -> int:
        t = self.gc.type_of(name)
        if t is None:
            raise _NeedsRunTime(f"the type of '{name}'")
        return t

    def np_dtype(self, name: str) -> np.dtype:
        t = self.dtype(name)
        if t not in NUMPY_OF_ONNX:
            raise self.unsupported(f"type {onnx_type_name(t)} of '{name}' has no ferrocaffe tensor type",
                                   blob=name)
        return NUMPY_OF_ONNX[t]

    def const(self, name: str):
        return self.gc.const_of(name) if name else None

    def need_const(self, name: str) -> np.ndarray:
        v = self.gc.const_of(name, use_inputs=True)
        if v is None:
            if name in self.gc.graph_inputs:
                raise _NeedsRunTime(f"the value of input '{name}'")
            raise self.unsupported(f"'{name}' must be a constant (an initializer, a Constant "
                                   "or computed from them)", blob=name)
        return v

    def set_const(self, name: str, value) -> None:
        """The node's output `name` is this constant (nothing runs)."""
        self.gc.consts[name] = np.asarray(value)
        self.gc.set_info(name, np.asarray(value))

    # -- building
    def fresh(self, hint: str = "t") -> str:
        return self.gc.names.new(hint)

    def op(self, op_type: str, inputs, outputs, **args) -> list[str]:
        od = caffe2_pb2.OperatorDef()
        od.type = op_type
        od.name = self.node.name or f"{self.node.op_type}_{self.index}"
        od.input.extend(inputs)
        od.output.extend(outputs)
        for k, v in args.items():
            if v is not None:
                od.arg.append(MakeArgument(k, v))
        self.ops.append(od)
        self._type_outputs(od, args)
        return list(outputs)

    def _type_outputs(self, od, args) -> None:
        """Records the ONNX types of the op's outputs that inference left
        unknown (the conversions' own blobs), by the op's rule."""
        gc = self.gc
        first = gc.type_of(od.input[0]) if od.input else None
        t = od.type
        if t == "Cast":
            types = [C2_TO_ONNX_TYPE.get(int(args["to"]))]
        elif t in _BOOL_OPS:
            types = [TensorProto.BOOL]
        elif t in ("Shape", "Size", "ArgMax", "ArgMin"):
            types = [TensorProto.INT64]
        elif t in ("TopK", "Reshape"):
            types = [first, TensorProto.INT64]
        elif t == "Concat":
            types = [first, TensorProto.INT32]
        elif t == "ConstantFill":
            types = [C2_TO_ONNX_TYPE.get(int(args.get("dtype", caffe2_pb2.TensorProto.FLOAT)))]
        elif t == "Where":
            types = [gc.type_of(od.input[1])]
        elif t == "LayerNorm":
            types = [first] * 3
        else:
            types = [first] * len(od.output)
        shape = None
        if t in _SAME_SHAPE:
            shape = gc.shape_of(od.input[0])
        elif t in _BROADCASTING:
            shape = _broadcast_dims([gc.shape_of(i) for i in od.input])
        for name, typ in zip(od.output, types):
            if typ is not None and gc.type_of(name) is None:
                gc.infos[name] = (typ, shape)
                shape = None  # only the first output has the input's shape

    def tmp(self, op_type: str, inputs, hint: str = "", **args) -> str:
        return self.op(op_type, inputs, [self.fresh(hint or op_type.lower())], **args)[0]

    def add_const(self, value, hint: str = "c", dtype=None) -> str:
        arr = np.array(value, dtype=dtype)
        name = self.fresh(hint)
        self.gc.consts[name] = arr
        return name

    def scalar(self, value, dtype) -> str:
        return self.add_const(np.array(value, dtype=dtype), "k")

    def cast(self, name: str, to: int, hint: str = "cast") -> str:
        return self.tmp("Cast", [name], hint, to=ONNX_TO_C2_TYPE[to])

    def widened(self, name: str, allowed: set[int]) -> tuple[str, int]:
        """`name` cast to a type a kernel takes when its own is not in
        `allowed` (small ints to int32, float16 to float32, ints to double
        for float-only kernels); (name, the type used)."""
        t = self.dtype(name)
        if t in allowed:
            return name, t
        for cand in _widenings(t):
            if cand in allowed:
                return self.cast(name, cand), cand
        raise self.unsupported(f"type {onnx_type_name(t)} of '{name}'", blob=name)

    def narrowed(self, src: str, t_from: int, t_to: int, out: str) -> None:
        """`src` (of type t_from) cast to t_to into `out`; of one type, the
        op that made `src` (this node's last, nothing reads it) writes
        `out` instead, else a copy."""
        if t_from != t_to:
            self.op("Cast", [src], [out], to=ONNX_TO_C2_TYPE[t_to])
            return
        if src == out:
            return
        last = self.ops[-1] if self.ops else None
        if (last is not None and src in last.output and src not in self.gc.graph_inputs
                and not any(src in o.input for o in self.ops)):
            last.output[list(last.output).index(src)] = out
            self.gc.infos.setdefault(out, self.gc.infos.get(src, (t_to, None)))
            return
        self.op("Copy", [src], [out])

    def normalize_axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < max(rank, 1):
            raise self.error(f"axis {axis} is out of range for rank {rank}")
        return axis + rank if axis < 0 else axis


_SAME_SHAPE = {
    "Cast", "Copy", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos",
    "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Erf", "Softplus", "Softsign", "Mish", "Abs",
    "Negative", "Sign", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "ThresholdedRelu", "Gelu",
    "Not", "Clip", "Softmax", "LRN", "SpatialBN", "Pow",
}
_BROADCASTING = {"Add", "Sub", "Mul", "Div", "EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or",
                 "Xor", "Where", "BitwiseAnd", "BitwiseOr", "BitwiseXor"}


def _broadcast_dims(shapes):
    """numpy's broadcast of shapes whose dims may be None (unknown); None
    when a shape is unknown."""
    if any(s is None for s in shapes):
        return None
    r = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(r):
        dims = [s[len(s) - r + i] for s in shapes if len(s) - r + i >= 0]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            return None
        if known:
            out.append(known.pop())
        elif all(d == 1 for d in dims):
            out.append(1)
        else:
            out.append(None)
    return out


def _widenings(t: int) -> list[int]:
    if t in (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16):
        return [TensorProto.INT32, TensorProto.INT64, TensorProto.DOUBLE]
    if t == TensorProto.FLOAT16:
        return [TensorProto.FLOAT, TensorProto.DOUBLE]
    if t in (TensorProto.INT32, TensorProto.INT64):
        return [TensorProto.INT64, TensorProto.DOUBLE]
    if t == TensorProto.FLOAT:
        return [TensorProto.DOUBLE]
    if t == TensorProto.BOOL:
        return [TensorProto.INT32, TensorProto.INT64]
    return []


_CONVERTERS: dict[str, Callable[[_NodeCx], None]] = {}


def _converts(*types: str):
    def register(fn):
        for t in types:
            _CONVERTERS[t] = fn
        return fn
    return register


# ------------------------------------------------------- the graph converter


class _GraphConverter:
    def __init__(self, model, opset: int, feeds: dict | None = None, device="CPU"):
        self.model = model
        self.opset = opset
        self.feeds = feeds  # run-time values of the graph inputs (None: prepare time)
        graph = model.graph
        self.graph_name = graph.name or "graph"
        self.values_used: set[str] = set()
        self.consts: dict[str, np.ndarray] = {}
        for t in graph.initializer:
            self.consts[t.name] = _tensor_to_array(t, self.graph_name)
        for t in graph.sparse_initializer:
            raise UnsupportedOperatorError("sparse initializers are not converted" + where(net=self.graph_name))
        self.graph_inputs = [vi.name for vi in graph.input if vi.name not in self.consts]
        for vi in graph.input:
            _check_value_type(vi, self.graph_name)
        for vi in graph.output:
            _check_value_type(vi, self.graph_name, unknown_ok=True)
        self.infos: dict[str, tuple[int, list | None]] = {}
        self._ops: list = []  # the ops of the nodes converted so far
        self._made: set[str] = set()
        self._probe_ws = None
        self._probe_done = 0
        self._infer(feeds)
        names = set(self.consts) | set(self.graph_inputs) | {vi.name for vi in graph.output}
        for n in graph.node:
            names.update(n.input)
            names.update(n.output)
        self.names = NameGen(names, "_c2_")

    def _infer(self, feeds) -> None:
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        if feeds is not None:
            for vi in model.graph.input:
                if vi.name in feeds:
                    v = feeds[vi.name]
                    tt = vi.type.tensor_type
                    tt.ClearField("shape")
                    tt.shape.SetInParent()
                    for d in v.shape:
                        tt.shape.dim.add().dim_value = int(d)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception:  # noqa: BLE001 - inference is a help, not a must
            inferred = model
        g = inferred.graph
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            if not vi.type.HasField("tensor_type"):
                continue
            tt = vi.type.tensor_type
            dims = None
            if tt.HasField("shape"):
                dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            elem = tt.elem_type or None
            old = self.infos.get(vi.name)
            if old is not None and dims is None:
                dims = old[1]
            self.infos[vi.name] = (elem if elem else (old[0] if old else None), dims)
        for name, v in self.consts.items():
            self.set_info(name, v)
        if feeds is not None:
            for name, v in feeds.items():
                self.set_info(name, v)

    def set_info(self, name, v: np.ndarray) -> None:
        t = ONNX_OF_NUMPY.get(v.dtype)
        self.infos[name] = (t, list(v.shape))

    def shape_of(self, name):
        info = self.infos.get(name)
        if (info is None or info[1] is None or None in info[1]) and self._probe(name):
            info = self.infos.get(name)
        return None if info is None or info[1] is None else list(info[1])

    def type_of(self, name):
        info = self.infos.get(name)
        if (info is None or info[0] is None) and self._probe(name):
            info = self.infos.get(name)
        return None if info is None else info[0]

    def _probe(self, name) -> bool:
        """At run time, a blob that inference left unknown and that an
        earlier node makes: the ops converted so far run on the inputs in a
        scratch workspace, and the blob's shape and type are read. Whether
        it was found."""
        if self.feeds is None or name not in self._made:
            return False
        if self._probe_ws is None:
            self._probe_ws = workspace.Workspace()
            for n, v in self.feeds.items():
                self._probe_ws._core.feed_blob(n, v)
        core = self._probe_ws._core
        while self._probe_done < len(self._ops):
            op = self._ops[self._probe_done]
            for i in op.input:
                if i in self.consts and not core.has_blob(i):
                    core.feed_blob(i, self.consts[i])
            core.run_operator_once(op.SerializeToString())
            self._probe_done += 1
        if not core.has_blob(name):
            return False
        v = core.fetch_blob(name)
        if not isinstance(v, np.ndarray):
            return False
        self.set_info(name, v)
        return True

    def const_of(self, name, use_inputs=False):
        if name in self.consts:
            return self.consts[name]
        if use_inputs and self.feeds is not None and name in self.feeds:
            self.values_used.add(name)
            return self.feeds[name]
        return None

    def convert(self, fold: bool = True) -> _Converted:
        graph = self.model.graph
        pred = caffe2_pb2.NetDef()
        pred.name = self.graph_name + "_predict"
        for i, node in enumerate(graph.node):
            if node.domain not in ("", "ai.onnx"):
                raise UnsupportedOperatorError(
                    f"op '{node.op_type}' of domain '{node.domain}' is not converted"
                    + where(node.op_type, i, self.graph_name, None, node.name),
                    op=node.op_type, op_index=i, net=self.graph_name)
            conv = _CONVERTERS.get(node.op_type)
            if conv is None:
                reason = UNSUPPORTED_OPS.get(node.op_type, "no conversion to ferrocaffe's ops")
                raise UnsupportedOperatorError(
                    f"ONNX op '{node.op_type}' is not supported: {reason}"
                    + where(node.op_type, i, self.graph_name, None, node.name),
                    op=node.op_type, op_index=i, net=self.graph_name)
            cx = _NodeCx(self, node, i)
            conv(cx)
            if fold and cx.ops and self._foldable(node, cx):
                self._fold(cx)
            else:
                pred.op.extend(cx.ops)
                self._ops.extend(cx.ops)
                for op in cx.ops:
                    self._made.update(op.output)
        # The values the net reads that no op makes: constants, fed once.
        made = set()
        read = set()
        for op in pred.op:
            read.update(i for i in op.input if i not in made)
            made.update(op.output)
        outputs = [vi.name for vi in graph.output]
        for name in outputs:
            if name not in made and name not in self.consts and name not in self.graph_inputs:
                raise ConversionError(f"graph output '{name}' is made by no node"
                                      + where(net=self.graph_name, blob=name),
                                      net=self.graph_name, blob=name)
        init_values = {n: self.consts[n] for n in self.consts
                       if (n in read or n in outputs) and n not in made}
        pred.external_input.extend(self.graph_inputs)
        pred.external_input.extend(init_values)
        pred.external_output.extend(outputs)
        init = caffe2_pb2.NetDef()
        init.name = self.graph_name + "_init"
        return _Converted(init, pred, init_values, list(self.graph_inputs), outputs,
                          set(self.values_used))

    def _foldable(self, node, cx) -> bool:
        """Whether every input the node's ops read is a constant."""
        made = set()
        for op in cx.ops:
            for i in op.input:
                if i and i not in made and i not in self.consts:
                    return False
            made.update(op.output)
        return True

    def _fold(self, cx) -> None:
        ws = workspace.Workspace()
        need = set()
        made = set()
        for op in cx.ops:
            need.update(i for i in op.input if i not in made)
            made.update(op.output)
        for n in need:
            ws._core.feed_blob(n, self.consts[n])
        net = caffe2_pb2.NetDef()
        net.name = "fold"
        net.op.extend(cx.ops)
        ws._core.run_net_once(net.SerializeToString())
        for name in cx.outs:
            if name and ws.has_blob(name):
                v = ws.fetch_blob(name)
                self.consts[name] = v
                self.set_info(name, v)


def _check_value_type(vi, graph_name: str, unknown_ok: bool = False) -> None:
    """Refuses a graph input or output that no ferrocaffe tensor can hold
    (an output may leave its type to inference)."""
    kind = vi.type.WhichOneof("value")
    if unknown_ok and (kind is None or (kind == "tensor_type" and not vi.type.tensor_type.elem_type)):
        return
    if kind != "tensor_type":
        raise UnsupportedOperatorError(
            f"'{vi.name}' is of {kind or 'no'} type: only tensors are converted"
            + where(net=graph_name, blob=vi.name), net=graph_name, blob=vi.name)
    t = vi.type.tensor_type.elem_type
    if t not in NUMPY_OF_ONNX or t == TensorProto.STRING:
        raise UnsupportedOperatorError(
            f"'{vi.name}' has type {onnx_type_name(t)}, which ferrocaffe's tensors cannot hold"
            + where(net=graph_name, blob=vi.name), net=graph_name, blob=vi.name)


def _tensor_to_array(t, graph_name: str) -> np.ndarray:
    if t.data_location == TensorProto.EXTERNAL:
        raise ConversionError(f"initializer '{t.name}' keeps its data in an external file: "
                              "load the model with onnx.load(path) (load_external_data=True)"
                              + where(net=graph_name, blob=t.name), net=graph_name, blob=t.name)
    if t.data_type not in NUMPY_OF_ONNX:
        raise UnsupportedOperatorError(
            f"tensor '{t.name}' has type {onnx_type_name(t.data_type)}, which ferrocaffe's "
            "tensors cannot hold" + where(net=graph_name, blob=t.name), net=graph_name, blob=t.name)
    arr = numpy_helper.to_array(t)
    if arr.dtype == object:
        raise UnsupportedOperatorError(f"string tensor '{t.name}'" + where(net=graph_name, blob=t.name),
                                       net=graph_name, blob=t.name)
    return np.ascontiguousarray(arr)


# ------------------------------------------------------------- converters


def _fill_init_net(init_values: dict, init) -> None:
    """GivenTensor*Fill ops making the values (the init net of
    onnx_graph_to_caffe2_net)."""
    kinds = {
        np.dtype(np.float32): ("GivenTensorFill", "floats"),
        np.dtype(np.float64): ("GivenTensorDoubleFill", "floats"),
        np.dtype(np.int32): ("GivenTensorIntFill", "ints"),
        np.dtype(np.int64): ("GivenTensorInt64Fill", "ints"),
        np.dtype(np.bool_): ("GivenTensorBoolFill", "ints"),
        np.dtype(np.int16): ("GivenTensorInt16Fill", "ints"),
    }
    for name, v in init_values.items():
        op = init.op.add()
        op.output.append(name)
        kind = kinds.get(v.dtype)
        if kind is None:
            # uint8, int8, uint16, float16: filled as int32/float32, then cast.
            wide = np.float32 if v.dtype.kind == "f" else np.int32
            op.type = kinds[np.dtype(wide)][0]
            op.output[0] = name + "_wide"
            op.arg.append(MakeArgument("shape", list(v.shape)))
            a = op.arg.add()
            a.name = "values"
            (a.floats if wide == np.float32 else a.ints).extend(v.astype(wide).reshape(-1).tolist())
            cast = init.op.add()
            cast.type = "Cast"
            cast.input.append(name + "_wide")
            cast.output.append(name)
            cast.arg.append(MakeArgument("to", ONNX_TO_C2_TYPE[ONNX_OF_NUMPY[v.dtype]]))
            continue
        op.type = kind[0]
        op.arg.append(MakeArgument("shape", list(v.shape)))
        a = op.arg.add()
        a.name = "values"
        getattr(a, kind[1]).extend(v.reshape(-1).astype(
            np.float64 if kind[1] == "floats" else np.int64).tolist())


# -- elementwise


def _binary_supported(cx: _NodeCx, c2_type: str, allowed: set[int], out_same_type=True,
                      a=None, b=None, out=None) -> None:
    """A binary op with numpy broadcasting; inputs of a type the kernel lacks
    are cast to a wider one, and the result back (unless it is bool)."""
    a = a if a is not None else cx.inp(0)
    b = b if b is not None else cx.inp(1)
    out = out if out is not None else cx.out(0)
    t = cx.dtype(a)
    args = {}
    if cx.opset < 7 and cx.attr("broadcast", 0):
        args = {"broadcast": 1, "axis": cx.attr("axis")}
    if t in allowed and cx.dtype(b) == t:
        cx.op(c2_type, [a, b], [out], **args)
        return
    wa, wt = cx.widened(a, allowed)
    wb = cx.cast(b, wt) if cx.dtype(b) != wt else b
    if not out_same_type:
        cx.op(c2_type, [wa, wb], [out], **args)
        return
    r = cx.tmp(c2_type, [wa, wb], "wide", **args)
    cx.narrowed(r, wt, t, out)


def _arith(c2: str):
    def conv(cx):
        _binary_supported(cx, c2, _ARITH)
    return conv


for _onnx, _c2 in (("Add", "Add"), ("Sub", "Sub"), ("Mul", "Mul"), ("Div", "Div")):
    _converts(_onnx)(_arith(_c2))


def _compare(c2: str):
    def conv(cx):
        _binary_supported(cx, c2, _ARITH | {TensorProto.BOOL}, out_same_type=False)
    return conv


for _onnx, _c2 in (("Equal", "EQ"), ("Less", "LT"), ("Greater", "GT"),
                   ("LessOrEqual", "LE"), ("GreaterOrEqual", "GE")):
    _converts(_onnx)(_compare(_c2))


def _cmp(cx, c2: str, a: str, b: str) -> str:
    """A bool tensor: a <op> b, casting types the comparison kernels lack."""
    out = cx.fresh("cmp")
    _binary_supported(cx, c2, _ARITH | {TensorProto.BOOL}, out_same_type=False, a=a, b=b, out=out)
    return out


@_converts("And", "Or", "Xor")
def _logic(cx):
    cx.op(cx.node.op_type, [cx.inp(0), cx.inp(1)], [cx.out(0)])


@_converts("Not")
def _not(cx):
    cx.op("Not", [cx.inp(0)], [cx.out(0)])


@_converts("BitwiseAnd", "BitwiseOr", "BitwiseXor")
def _bitwise(cx):
    _binary_supported(cx, cx.node.op_type, {TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL})


@_converts("BitwiseNot")
def _bitwise_not(cx):
    x = cx.inp(0)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, {TensorProto.INT32, TensorProto.INT64})
    r = cx.tmp("BitwiseXor", [wx, cx.scalar(-1, NUMPY_OF_ONNX[wt])], "not")
    cx.narrowed(r, wt, t, cx.out(0))


_FLOAT_UNARY = {
    "Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log",
    "Sqrt": "Sqrt", "Reciprocal": "Reciprocal", "Sin": "Sin", "Cos": "Cos", "Tan": "Tan",
    "Asin": "Asin", "Acos": "Acos", "Atan": "Atan", "Sinh": "Sinh", "Cosh": "Cosh",
    "Erf": "Erf", "Softplus": "Softplus", "Softsign": "Softsign", "Mish": "Mish",
    "Abs": "Abs", "Neg": "Negative", "Sign": "Sign",
}


def _unary_float(cx, c2_type: str, x: str, out: str, **args) -> None:
    t = cx.dtype(x)
    if t in _FLOATS:
        cx.op(c2_type, [x], [out], **args)
        return
    wx, wt = cx.widened(x, _FLOATS)
    r = cx.tmp(c2_type, [wx], "wide", **args)
    cx.narrowed(r, wt, t, out)


@_converts(*_FLOAT_UNARY)
def _unary(cx):
    x, t = cx.inp(0), cx.dtype(cx.inp(0))
    kind = cx.node.op_type
    if t in _FLOATS or t == TensorProto.FLOAT16 or kind not in ("Relu", "Abs", "Neg", "Sign"):
        _unary_float(cx, _FLOAT_UNARY[kind], x, cx.out(0))
        return
    # Integer Relu, Abs, Neg, Sign: exact, in the integer type.
    wx, wt = cx.widened(x, {TensorProto.INT32, TensorProto.INT64})
    dt = NUMPY_OF_ONNX[wt]
    zero = cx.scalar(0, dt)
    if kind == "Neg":
        r = cx.tmp("Sub", [zero, wx], "neg")
    elif kind == "Relu":
        r = cx.tmp("Where", [cx.tmp("GT", [wx, zero], "pos"), wx, zero], "relu")
    elif kind == "Abs":
        r = cx.tmp("Where", [cx.tmp("LT", [wx, zero], "neg"), cx.tmp("Sub", [zero, wx]), wx], "abs")
    else:
        pos = cx.tmp("Cast", [cx.tmp("GT", [wx, zero])], to=ONNX_TO_C2_TYPE[wt])
        neg = cx.tmp("Cast", [cx.tmp("LT", [wx, zero])], to=ONNX_TO_C2_TYPE[wt])
        r = cx.tmp("Sub", [pos, neg], "sign")
    cx.narrowed(r, wt, t, cx.out(0))


@_converts("Identity")
def _identity(cx):
    x = cx.inp(0)
    v = cx.const(x)
    if v is not None:
        cx.set_const(cx.out(0), v)
        return
    cx.op("Copy", [x], [cx.out(0)])


@_converts("LeakyRelu")
def _leaky(cx):
    _unary_float(cx, "LeakyRelu", cx.inp(0), cx.out(0), alpha=float(cx.attr("alpha", 0.01)))


@_converts("Elu")
def _elu(cx):
    _unary_float(cx, "Elu", cx.inp(0), cx.out(0), alpha=float(cx.attr("alpha", 1.0)))


@_converts("Celu")
def _celu(cx):
    x = cx.inp(0)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    alpha = float(cx.attr("alpha", 1.0))
    dt = NUMPY_OF_ONNX[wt]
    scaled = cx.tmp("Div", [wx, cx.scalar(alpha, dt)], "scaled")
    e = cx.tmp("Elu", [scaled], "elu", alpha=1.0)
    r = cx.tmp("Mul", [e, cx.scalar(alpha, dt)], "celu")
    cx.narrowed(r, wt, t, cx.out(0))


@_converts("Selu")
def _selu(cx):
    alpha = float(cx.attr("alpha", 1.67326319217681884765625))
    gamma = float(cx.attr("gamma", 1.05070102214813232421875))
    if gamma <= 1.0:
        # ferrocaffe's Selu takes scales above 1 only: gamma * Elu(x).
        x = cx.inp(0)
        t = cx.dtype(x)
        wx, wt = cx.widened(x, _FLOATS)
        e = cx.tmp("Elu", [wx], "elu", alpha=alpha)
        r = cx.tmp("Mul", [e, cx.scalar(gamma, NUMPY_OF_ONNX[wt])], "selu")
        cx.narrowed(r, wt, t, cx.out(0))
        return
    _unary_float(cx, "Selu", cx.inp(0), cx.out(0), alpha=alpha, scale=gamma)


@_converts("HardSigmoid")
def _hard_sigmoid(cx):
    _unary_float(cx, "HardSigmoid", cx.inp(0), cx.out(0), alpha=float(cx.attr("alpha", 0.2)),
                 beta=float(cx.attr("beta", 0.5)))


@_converts("HardSwish")
def _hard_swish(cx):
    x = cx.inp(0)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    hs = cx.tmp("HardSigmoid", [wx], "hs", alpha=1.0 / 6, beta=0.5)
    cx.narrowed(cx.tmp("Mul", [wx, hs], "hswish"), wt, t, cx.out(0))


@_converts("ThresholdedRelu")
def _thresholded(cx):
    _unary_float(cx, "ThresholdedRelu", cx.inp(0), cx.out(0), alpha=float(cx.attr("alpha", 1.0)))


@_converts("Gelu")
def _gelu(cx):
    approx = cx.attr("approximate", "none")
    _unary_float(cx, "Gelu", cx.inp(0), cx.out(0), fast_gelu=int(approx == "tanh"))


@_converts("Swish")
def _swish(cx):
    x = cx.inp(0)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    alpha = float(cx.attr("alpha", 1.0))
    ax = cx.tmp("Mul", [wx, cx.scalar(alpha, NUMPY_OF_ONNX[wt])], "ax") if alpha != 1.0 else wx
    s = cx.tmp("Sigmoid", [ax], "sig")
    cx.narrowed(cx.tmp("Mul", [wx, s], "swish"), wt, t, cx.out(0))


@_converts("Shrink")
def _shrink(cx):
    x = cx.inp(0)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _ARITH)
    dt = NUMPY_OF_ONNX[wt]
    lambd, bias = float(cx.attr("lambd", 0.5)), float(cx.attr("bias", 0.0))
    lo = cx.tmp("LT", [wx, cx.scalar(-lambd, dt)])
    hi = cx.tmp("GT", [wx, cx.scalar(lambd, dt)])
    plus = cx.tmp("Add", [wx, cx.scalar(bias, dt)])
    minus = cx.tmp("Sub", [wx, cx.scalar(bias, dt)])
    inner = cx.tmp("Where", [hi, minus, cx.scalar(0, dt)])
    r = cx.tmp("Where", [lo, plus, inner], "shrink")
    cx.narrowed(r, wt, t, cx.out(0))


@_converts("PRelu")
def _prelu(cx):
    x, slope = cx.inp(0), cx.inp(1)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _ARITH)
    ws = cx.cast(slope, wt) if cx.dtype(slope) != wt else slope
    ss = cx.shape(slope)
    if cx.opset < 7 and ss is not None and len(ss) == 1 and ss[0] != 1 and cx.rank(x) > 2:
        # Before opset 7 a 1-D slope is per channel (dim 1).
        ws = cx.tmp("ExpandDims", [ws], "slope", dims=list(range(1, cx.rank(x) - 1)))
    dt = NUMPY_OF_ONNX[wt]
    r = cx.tmp("Where", [cx.tmp("GT", [wx, cx.scalar(0, dt)]), wx, cx.tmp("Mul", [wx, ws])], "prelu")
    cx.narrowed(r, wt, t, cx.out(0))


def _trunc(cx, x: str, dt_onnx: int) -> str:
    """Rounding toward zero, exact for every float: values of 2^62 and more
    (already integers), infinities and NaN pass through."""
    dt = NUMPY_OF_ONNX[dt_onnx]
    as_int = cx.tmp("Cast", [x], "int", to=caffe2_pb2.TensorProto.INT64)
    back = cx.tmp("Cast", [as_int], "back", to=ONNX_TO_C2_TYPE[dt_onnx])
    big = cx.tmp("GE", [cx.tmp("Abs", [x]), cx.scalar(2.0 ** 62, dt)], "big")
    nan = cx.tmp("NE", [x, x], "nan")
    keep = cx.tmp("Or", [big, nan], "keep")
    return cx.tmp("Where", [keep, x, back], "trunc")


@_converts("Floor", "Ceil")
def _floor_ceil(cx):
    x = cx.inp(0)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    tr = _trunc(cx, wx, wt)
    if cx.node.op_type == "Floor":
        adj = cx.tmp("Cast", [cx.tmp("GT", [tr, wx])], to=ONNX_TO_C2_TYPE[wt])
        r = cx.tmp("Sub", [tr, adj], "floor")
    else:
        adj = cx.tmp("Cast", [cx.tmp("LT", [tr, wx])], to=ONNX_TO_C2_TYPE[wt])
        r = cx.tmp("Add", [tr, adj], "ceil")
    cx.narrowed(r, wt, t, cx.out(0))


@_converts("Round")
def _round(cx):
    # Half to even: f = floor(x), d = x - f; up when d > 0.5, or d == 0.5 and f odd.
    x = cx.inp(0)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    dt = NUMPY_OF_ONNX[wt]
    c2t = ONNX_TO_C2_TYPE[wt]
    tr = _trunc(cx, wx, wt)
    f = cx.tmp("Sub", [tr, cx.tmp("Cast", [cx.tmp("GT", [tr, wx])], to=c2t)], "floor")
    d = cx.tmp("Sub", [wx, f], "frac")
    half = cx.scalar(0.5, dt)
    h = cx.tmp("Mul", [f, half])
    ht = _trunc(cx, h, wt)
    hfloor = cx.tmp("Sub", [ht, cx.tmp("Cast", [cx.tmp("GT", [ht, h])], to=c2t)])
    odd = cx.tmp("NE", [hfloor, h], "odd")
    up = cx.tmp("Or", [cx.tmp("GT", [d, half]), cx.tmp("And", [cx.tmp("EQ", [d, half]), odd])], "up")
    r = cx.tmp("Add", [f, cx.tmp("Cast", [up], to=c2t)], "round")
    # Infinities and NaN: floor is x itself and d is NaN, so `up` is false.
    cx.narrowed(r, wt, t, cx.out(0))


@_converts("Asinh", "Acosh", "Atanh")
def _inverse_hyperbolic(cx):
    x = cx.inp(0)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    dt = NUMPY_OF_ONNX[wt]
    one = cx.scalar(1.0, dt)
    kind = cx.node.op_type
    if kind == "Atanh":
        ratio = cx.tmp("Div", [cx.tmp("Add", [one, wx]), cx.tmp("Sub", [one, wx])])
        r = cx.tmp("Mul", [cx.tmp("Log", [ratio]), cx.scalar(0.5, dt)], "atanh")
    else:
        sq = cx.tmp("Mul", [wx, wx])
        inner = cx.tmp("Add" if kind == "Asinh" else "Sub", [sq, one])
        r = cx.tmp("Log", [cx.tmp("Add", [wx, cx.tmp("Sqrt", [inner])])], kind.lower())
    cx.narrowed(r, wt, t, cx.out(0))


@_converts("IsNaN")
def _isnan(cx):
    x = cx.inp(0)
    wx, _ = cx.widened(x, _FLOATS)
    cx.op("NE", [wx, wx], [cx.out(0)])


@_converts("IsInf")
def _isinf(cx):
    x = cx.inp(0)
    wx, wt = cx.widened(x, _FLOATS)
    dt = NUMPY_OF_ONNX[wt]
    pos, neg = int(cx.attr("detect_positive", 1)), int(cx.attr("detect_negative", 1))
    parts = []
    if pos:
        parts.append(cx.tmp("EQ", [wx, cx.scalar(np.inf, dt)]))
    if neg:
        parts.append(cx.tmp("EQ", [wx, cx.scalar(-np.inf, dt)]))
    if not parts:
        cx.op("NE", [wx, wx], [cx.fresh("nan")])
        cx.op("ConstantFill", [wx], [cx.out(0)], dtype=caffe2_pb2.TensorProto.BOOL, value=0)
        return
    if len(parts) == 1:
        cx.op("Copy", parts, [cx.out(0)])
    else:
        cx.op("Or", parts, [cx.out(0)])


@_converts("Pow")
def _pow(cx):
    x, y = cx.inp(0), cx.inp(1)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    yv = cx.const(y)
    if yv is not None and yv.size == 1:
        r = cx.tmp("Pow", [wx], "pow", exponent=float(yv.reshape(-1)[0]))
        cx.narrowed(r, wt, t, cx.out(0))
        return
    wy = cx.cast(y, wt) if cx.dtype(y) != wt else y
    sx, sy = cx.shape(x), cx.shape(y)
    if sx != sy or sx is None:
        out_shape = _broadcast_shape(cx, [x, y])
        if cx.static_shape(x) != out_shape:
            wx = cx.tmp("Expand", [wx, cx.add_const(np.array(out_shape, np.int64), "shape")])
        if cx.static_shape(y) != out_shape:
            wy = cx.tmp("Expand", [wy, cx.add_const(np.array(out_shape, np.int64), "shape")])
    r = cx.tmp("Pow", [wx, wy], "pow")
    cx.narrowed(r, wt, t, cx.out(0))


def _broadcast_shape(cx, names) -> list[int]:
    shapes = [cx.static_shape(n) for n in names]
    try:
        return list(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise cx.error(f"shapes {shapes} do not broadcast") from None


@_converts("Sum", "Mean", "Max", "Min")
def _variadic(cx):
    ins = [i for i in cx.ins if i]
    kind = cx.node.op_type
    t = cx.dtype(ins[0])
    allowed = _FLOATS if kind == "Mean" else _ARITH
    if len(ins) == 1:
        cx.op("Copy", ins, [cx.out(0)])
        return
    shapes = [cx.shape(i) for i in ins]
    if any(s is None or s != shapes[0] for s in shapes) or any(d is None for d in shapes[0]):
        out_shape = _broadcast_shape(cx, ins)
        shape_c = cx.add_const(np.array(out_shape, np.int64), "shape")
        ins = [i if cx.static_shape(i) == out_shape else cx.tmp("Expand", [i, shape_c], "bcast")
               for i in ins]
    if t in allowed:
        cx.op(kind, ins, [cx.out(0)])
        return
    wide = []
    wt = None
    for i in ins:
        w, wt = cx.widened(i, allowed) if cx.dtype(i) == t else (i, t)
        wide.append(w)
    r = cx.tmp(kind, wide, kind.lower())
    cx.narrowed(r, wt, t, cx.out(0))


@_converts("Mod")
def _mod(cx):
    a, b = cx.inp(0), cx.inp(1)
    t = cx.dtype(a)
    fmod = int(cx.attr("fmod", 0))
    if t in _FLOATS or t == TensorProto.FLOAT16:
        # C's fmod: a - trunc(a / b) * b, and a itself for a finite a and an
        # infinite b; fmod=0 (numpy's mod) then adds b to a non-zero
        # remainder of the other sign, and gives a zero b's sign.
        wa, wt = cx.widened(a, _FLOATS)
        wb = cx.cast(b, wt) if cx.dtype(b) != wt else b
        dt = NUMPY_OF_ONNX[wt]
        zero = cx.scalar(0, dt)
        q = _trunc(cx, cx.tmp("Div", [wa, wb], "q"), wt)
        r = cx.tmp("Sub", [wa, cx.tmp("Mul", [q, wb])], "rem")
        inf_b = cx.tmp("EQ", [cx.tmp("Abs", [wb]), cx.scalar(np.inf, dt)], "inf_b")
        finite_a = cx.tmp("LT", [cx.tmp("Abs", [wa]), cx.scalar(np.inf, dt)], "finite_a")
        r = cx.tmp("Where", [cx.tmp("And", [inf_b, finite_a]), wa, r], "fmod")
        if not fmod:
            differ = cx.tmp("Xor", [cx.tmp("LT", [r, zero]), cx.tmp("LT", [wb, zero])])
            fix = cx.tmp("And", [cx.tmp("NE", [r, zero]), differ])
            r = cx.tmp("Where", [fix, cx.tmp("Add", [r, wb]), r], "mod")
            signed_zero = cx.tmp("Mul", [cx.tmp("Sign", [wb]), zero], "zero")
            r = cx.tmp("Where", [cx.tmp("EQ", [r, zero]), signed_zero, r], "mod")
        cx.narrowed(r, wt, t, cx.out(0))
        return
    wa, wt = cx.widened(a, {TensorProto.INT32, TensorProto.INT64})
    wb = cx.cast(b, wt) if cx.dtype(b) != wt else b
    dt = NUMPY_OF_ONNX[wt]
    r = cx.tmp("Sub", [wa, cx.tmp("Mul", [cx.tmp("Div", [wa, wb]), wb])], "rem")
    if not fmod:
        zero = cx.scalar(0, dt)
        nonzero = cx.tmp("NE", [r, zero])
        differ = cx.tmp("Xor", [cx.tmp("LT", [r, zero]), cx.tmp("LT", [wb, zero])])
        fix = cx.tmp("And", [nonzero, differ])
        r = cx.tmp("Add", [r, cx.tmp("Where", [fix, wb, zero])], "mod")
    cx.narrowed(r, wt, t, cx.out(0))


@_converts("Clip")
def _clip(cx):
    x = cx.inp(0)
    t = cx.dtype(x)
    if cx.opset < 11:
        lo = cx.attr("min")
        hi = cx.attr("max")
        lo_n = cx.scalar(lo, NUMPY_OF_ONNX[t]) if lo is not None else ""
        hi_n = cx.scalar(hi, NUMPY_OF_ONNX[t]) if hi is not None else ""
    else:
        lo_n, hi_n = cx.inp(1), cx.inp(2)
    lo_v, hi_v = cx.const(lo_n), cx.const(hi_n)
    if t in _FLOATS and (not lo_n or lo_v is not None) and (not hi_n or hi_v is not None):
        cx.op("Clip", [x], [cx.out(0)],
              min=float(lo_v.reshape(-1)[0]) if lo_n else None,
              max=float(hi_v.reshape(-1)[0]) if hi_n else None)
        return
    y = x
    if lo_n:
        y = cx.tmp("Where", [_cmp(cx, "LT", y, lo_n), lo_n, y], "lo")
    if hi_n:
        y = cx.tmp("Where", [_cmp(cx, "GT", y, hi_n), hi_n, y], "hi")
    cx.op("Copy", [y], [cx.out(0)])


# -- reductions


def _reduce_axes(cx, x) -> list[int] | None:
    """The normalised axes of a reduction (None: all), from the attribute
    or (opset 13 for ReduceSum, 18 for the others) input 1."""
    kind = cx.node.op_type
    from_input = cx.opset >= (13 if kind == "ReduceSum" else 18)
    if from_input:
        if not cx.inp(1):
            axes = None
        else:
            axes = [int(a) for a in cx.need_const(cx.inp(1)).reshape(-1)]
    else:
        axes = cx.attr("axes")
        axes = None if axes is None else [int(a) for a in axes]
    if axes is not None and len(axes) == 0:
        axes = None
    r = cx.rank(x)
    if axes is None:
        return None
    return sorted({cx.normalize_axis(a, r) for a in axes})


def _noop_reduce(cx) -> bool:
    kind = cx.node.op_type
    if cx.opset < (13 if kind == "ReduceSum" else 18) or not cx.attr("noop_with_empty_axes", 0):
        return False
    if cx.inp(1):
        v = cx.need_const(cx.inp(1))
        if v.size:
            return False
    cx.op("Copy", [cx.inp(0)], [cx.out(0)])
    return True


def _reduce_op(cx, c2: str, x: str, axes, keepdims: int, out: str, allowed, r: int) -> None:
    """A reduction of `x` (of rank r) over `axes` (None: all)."""
    t = cx.dtype(x)
    all_axes = list(range(r)) if axes is None else axes
    if r == 0:
        cx.op("Copy", [x], [out])
        return
    if t in allowed:
        cx.op(c2, [x], [out], axes=all_axes, keepdims=keepdims)
        return
    wx, wt = cx.widened(x, allowed)
    red = cx.tmp(c2, [wx], "red", axes=all_axes, keepdims=keepdims)
    if t == TensorProto.BOOL and c2 == "ReduceMax":
        # The max of an empty set is the type's lowest value: false.
        cx.op("GT", [red, cx.scalar(0, NUMPY_OF_ONNX[wt])], [out])
        return
    cx.narrowed(red, wt, t, out)


_REDUCE = {"ReduceSum": ("ReduceSum", _ARITH), "ReduceMean": ("ReduceMean", _FLOATS),
           "ReduceMax": ("ReduceMax", _ARITH), "ReduceMin": ("ReduceMin", _ARITH),
           "ReduceL1": ("ReduceL1", _FLOATS), "ReduceL2": ("ReduceL2", _FLOATS)}


@_converts(*_REDUCE)
def _reduce(cx):
    if _noop_reduce(cx):
        return
    x = cx.inp(0)
    c2, allowed = _REDUCE[cx.node.op_type]
    if cx.dtype(x) == TensorProto.BOOL and c2 in ("ReduceMax", "ReduceMin"):
        allowed = _ARITH
    _reduce_op(cx, c2, x, _reduce_axes(cx, x), int(cx.attr("keepdims", 1)), cx.out(0), allowed,
               cx.rank(x))


@_converts("ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")
def _reduce_composite(cx):
    if _noop_reduce(cx):
        x = cx.inp(0)
        kind = cx.node.op_type
        cx.ops.clear()
        if kind == "ReduceSumSquare":
            cx.op("Mul", [x, x], [cx.out(0)])
        elif kind == "ReduceLogSum":
            _unary_float(cx, "Log", x, cx.out(0))
        else:
            cx.op("Copy", [x], [cx.out(0)])
        return
    x = cx.inp(0)
    t = cx.dtype(x)
    axes = _reduce_axes(cx, x)
    keep = int(cx.attr("keepdims", 1))
    kind = cx.node.op_type
    rank = cx.rank(x)
    if kind == "ReduceSumSquare":
        wx, wt = cx.widened(x, _ARITH)
        s = cx.fresh("sumsq")
        _reduce_op(cx, "ReduceSum", cx.tmp("Mul", [wx, wx], "sq"), axes, keep, s, _ARITH, rank)
        cx.narrowed(s, wt, t, cx.out(0))
        return
    wx, wt = cx.widened(x, _FLOATS)
    if kind == "ReduceLogSum":
        s = cx.fresh("sum")
        _reduce_op(cx, "ReduceSum", wx, axes, keep, s, _FLOATS, rank)
        r = cx.tmp("Log", [s], "logsum")
        cx.narrowed(r, wt, t, cx.out(0))
        return
    m = cx.fresh("max")
    _reduce_op(cx, "ReduceMax", wx, axes, 1, m, _FLOATS, rank)
    # A max of -inf (an empty set, or every value -inf) shifts by 0 instead.
    finite = cx.tmp("Where", [cx.tmp("EQ", [m, cx.scalar(-np.inf, NUMPY_OF_ONNX[wt])]),
                              cx.scalar(0, NUMPY_OF_ONNX[wt]), m], "shift")
    e = cx.tmp("Exp", [cx.tmp("Sub", [wx, finite])])
    s = cx.fresh("sum")
    _reduce_op(cx, "ReduceSum", e, axes, keep, s, _FLOATS, rank)
    shift = finite
    if not keep:
        dims = list(range(rank)) if axes is None else axes
        shift = cx.tmp("Squeeze", [finite], "shift", dims=dims)
    r = cx.tmp("Add", [cx.tmp("Log", [s]), shift], "lse")
    cx.narrowed(r, wt, t, cx.out(0))


@_converts("ArgMax", "ArgMin")
def _argmax(cx):
    x = cx.inp(0)
    r = cx.rank(x)
    axis = cx.normalize_axis(int(cx.attr("axis", 0)), r)
    keep = int(cx.attr("keepdims", 1))
    wx, _ = cx.widened(x, _ARITH)
    if int(cx.attr("select_last_index", 0)):
        n = cx.dim(x, axis)
        rev = cx.tmp("Gather", [wx, cx.add_const(np.arange(n - 1, -1, -1, dtype=np.int64), "rev")],
                     "rev", axis=axis)
        idx = cx.tmp(cx.node.op_type, [rev], "idx", axis=axis, keepdims=keep)
        cx.op("Sub", [cx.scalar(n - 1, np.int64), idx], [cx.out(0)])
        return
    cx.op(cx.node.op_type, [wx], [cx.out(0)], axis=axis, keepdims=keep)


@_converts("TopK")
def _topk(cx):
    x = cx.inp(0)
    r = cx.rank(x)
    axis = cx.normalize_axis(int(cx.attr("axis", -1)), r)
    if cx.opset < 10:
        k = int(cx.attr("k"))
    else:
        k = int(cx.need_const(cx.inp(1)).reshape(-1)[0])
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _ARITH)
    largest = int(cx.attr("largest", 1))
    vals, idx = cx.fresh("values"), cx.out(1) or cx.fresh("indices")
    src = wx
    if not largest:
        src = cx.tmp("Sub", [cx.scalar(0, NUMPY_OF_ONNX[wt]), wx], "neg")
    cx.op("TopK", [src], [vals, idx], k=k, axis=axis)
    if not largest:
        vals = cx.tmp("Sub", [cx.scalar(0, NUMPY_OF_ONNX[wt]), vals], "values")
    cx.narrowed(vals, wt, t, cx.out(0))


# -- shapes and data movement


@_converts("Constant")
def _constant(cx):
    a = cx.attrs
    if "value" in a:
        v = _tensor_to_array(a["value"], cx.gc.graph_name)
    elif "value_float" in a:
        v = np.array(a["value_float"], np.float32)
    elif "value_floats" in a:
        v = np.array(a["value_floats"], np.float32)
    elif "value_int" in a:
        v = np.array(a["value_int"], np.int64)
    elif "value_ints" in a:
        v = np.array(a["value_ints"], np.int64)
    else:
        raise cx.unsupported(f"Constant with {', '.join(a) or 'no value'}")
    cx.set_const(cx.out(0), v)


@_converts("ConstantOfShape")
def _constant_of_shape(cx):
    value = cx.attrs.get("value")
    v = _tensor_to_array(value, cx.gc.graph_name) if value is not None else np.zeros(1, np.float32)
    shape = cx.const(cx.inp(0))
    if shape is None and cx.gc.feeds is not None and cx.inp(0) in cx.gc.graph_inputs:
        shape = cx.need_const(cx.inp(0))
    if shape is not None:
        cx.set_const(cx.out(0), np.full([int(d) for d in shape.reshape(-1)], v.reshape(-1)[0], v.dtype))
        return
    if v.dtype not in (np.float32, np.int32, np.int64, np.bool_, np.float64):
        raise cx.unsupported(f"ConstantOfShape of {v.dtype} with a computed shape")
    c2t = ONNX_TO_C2_TYPE[ONNX_OF_NUMPY[v.dtype]]
    val = v.reshape(-1)[0].item()
    cx.op("ConstantFill", [cx.inp(0)], [cx.out(0)], input_as_shape=1, dtype=c2t,
          value=float(val) if v.dtype.kind == "f" else int(val))


@_converts("Shape")
def _shape(cx):
    x = cx.inp(0)
    s = cx.shape(x)
    r = cx.rank(x)
    start = int(cx.attr("start", 0))
    end = cx.attr("end")
    start = min(max(start + r if start < 0 else start, 0), r)
    end = r if end is None else int(end)
    end = min(max(end + r if end < 0 else end, 0), r)
    if s is not None and all(d is not None for d in s[start:end]):
        cx.set_const(cx.out(0), np.array(s[start:end], np.int64))
        return
    cx.op("Shape", [x], [cx.out(0)], axes=list(range(start, end)) if (start, end) != (0, r) else None)


@_converts("Size")
def _size(cx):
    x = cx.inp(0)
    s = cx.shape(x)
    if s is not None and all(d is not None for d in s):
        cx.set_const(cx.out(0), np.array(int(np.prod(s, dtype=np.int64)), np.int64))
        return
    cx.op("Size", [x], [cx.out(0)])


@_converts("Cast")
def _cast(cx):
    to = int(cx.attr("to"))
    if to not in ONNX_TO_C2_TYPE or to == TensorProto.STRING:
        raise cx.unsupported(f"Cast to {onnx_type_name(to)}")
    src = cx.dtype(cx.inp(0))
    if src not in ONNX_TO_C2_TYPE or src == TensorProto.STRING:
        raise cx.unsupported(f"Cast from {onnx_type_name(src)}")
    cx.op("Cast", [cx.inp(0)], [cx.out(0)], to=ONNX_TO_C2_TYPE[to])


@_converts("CastLike")
def _cast_like(cx):
    to = cx.dtype(cx.inp(1))
    src = cx.dtype(cx.inp(0))
    for t in (to, src):
        if t not in ONNX_TO_C2_TYPE or t == TensorProto.STRING:
            raise cx.unsupported(f"CastLike with {onnx_type_name(t)}")
    cx.op("Cast", [cx.inp(0)], [cx.out(0)], to=ONNX_TO_C2_TYPE[to])


@_converts("Reshape")
def _reshape(cx):
    x = cx.inp(0)
    if cx.opset < 5:
        shape = np.array(cx.attr("shape"), np.int64)
    else:
        shape = cx.const(cx.inp(1))
    allowzero = int(cx.attr("allowzero", 0))
    if shape is None:
        if allowzero:
            shape = cx.need_const(cx.inp(1))
        else:
            sh = cx.inp(1)
            cx.op("Reshape", [x, sh], [cx.out(0), cx.fresh("old_shape")])
            return
    shape = [int(d) for d in shape.reshape(-1)]
    if allowzero and 0 in shape:
        # A literal 0 (ferrocaffe's Reshape copies the input's dim for a 0):
        # the result has no elements, so it is a constant.
        if -1 in shape:
            raise cx.error("Reshape with allowzero=1 takes no -1 with a 0")
        total = int(np.prod(cx.static_shape(x)))
        if total != 0:
            raise cx.error(f"cannot reshape {total} elements to {shape}")
        cx.set_const(cx.out(0), np.zeros(shape, cx.np_dtype(x)))
        return
    cx.op("Reshape", [x], [cx.out(0), cx.fresh("old_shape")], shape=shape)


@_converts("Flatten")
def _flatten(cx):
    x = cx.inp(0)
    r = cx.rank(x)
    axis = int(cx.attr("axis", 1))
    axis = axis + r if axis < 0 else axis
    if not 0 <= axis <= r:
        raise cx.error(f"Flatten axis {axis} out of range for rank {r}")
    if axis == r:
        # (prod of every dim, 1): ferrocaffe's Flatten takes axis < rank.
        s = cx.shape(x)
        if s is not None and all(d is not None for d in s) and int(np.prod(s)) == 0:
            cx.set_const(cx.out(0), np.zeros((0, 1), cx.np_dtype(x)))
            return
        flat = cx.op("Reshape", [x], [cx.fresh("flat"), cx.fresh("old_shape")], shape=[-1])[0]
        cx.op("ExpandDims", [flat], [cx.out(0)], dims=[1])
        return
    cx.op("Flatten", [x], [cx.out(0)], axis=axis)


@_converts("Transpose")
def _transpose(cx):
    perm = cx.attr("perm")
    cx.op("Transpose", [cx.inp(0)], [cx.out(0)], axes=[int(p) for p in perm] if perm else None)


def _axes_arg(cx, attr_until: int, idx: int = 1) -> list[int] | None:
    if cx.opset < attr_until:
        a = cx.attr("axes")
        return None if a is None else [int(v) for v in a]
    if not cx.inp(idx):
        return None
    return [int(v) for v in cx.need_const(cx.inp(idx)).reshape(-1)]


@_converts("Squeeze")
def _squeeze(cx):
    x = cx.inp(0)
    axes = _axes_arg(cx, 13)
    r = cx.rank(x)
    if axes is None:
        s = cx.static_shape(x)
        axes = [i for i, d in enumerate(s) if d == 1]
    axes = sorted({cx.normalize_axis(a, r) for a in axes})
    cx.op("Squeeze", [x], [cx.out(0)], dims=axes)


@_converts("Unsqueeze")
def _unsqueeze(cx):
    x = cx.inp(0)
    axes = _axes_arg(cx, 13)
    if axes is None:
        raise cx.error("Unsqueeze needs axes")
    r = cx.rank(x) + len(axes)
    dims = sorted({cx.normalize_axis(a, r) for a in axes})
    if len(dims) != len(axes):
        raise cx.error(f"repeated axes {axes}")
    v = cx.const(x)
    if v is not None:
        cx.set_const(cx.out(0), np.expand_dims(v, tuple(dims)))
        return
    cx.op("ExpandDims", [x], [cx.out(0)], dims=dims)


@_converts("Concat")
def _concat(cx):
    ins = [i for i in cx.ins if i]
    axis = int(cx.attr("axis", 1 if cx.opset < 4 else 0))
    r = cx.rank(ins[0])
    axis = cx.normalize_axis(axis, r)
    # Inputs with a zero-length axis add nothing.
    kept = [i for i in ins if not (cx.shape(i) is not None and cx.shape(i)[axis] == 0)] or ins[:1]
    cx.op("Concat", kept, [cx.out(0), cx.fresh("split_info")], axis=axis)


@_converts("Split")
def _split(cx):
    x = cx.inp(0)
    r = cx.rank(x)
    axis = cx.normalize_axis(int(cx.attr("axis", 0)), r)
    outs = [o for o in cx.outs]
    if cx.opset < 13:
        split = cx.attr("split")
        if split is None and len(cx.ins) > 1 and cx.inp(1):
            split = cx.need_const(cx.inp(1))
    else:
        split = cx.need_const(cx.inp(1)) if cx.inp(1) else None
    if split is not None:
        split = [int(s) for s in np.asarray(split).reshape(-1)]
    elif cx.attr("num_outputs") is not None:
        n = cx.dim(x, axis)
        k = int(cx.attr("num_outputs"))
        size = -(-n // k)
        split = [size] * (n // size) + ([n % size] if n % size else [])
    named = [o if o else cx.fresh("unused") for o in outs]
    cx.op("Split", [x], named, axis=axis, split=split)


@_converts("Slice")
def _slice(cx):
    x = cx.inp(0)
    r = cx.rank(x)
    if cx.opset < 10:
        starts, ends = cx.attr("starts"), cx.attr("ends")
        axes = cx.attr("axes")
        steps = None
    else:
        starts = cx.need_const(cx.inp(1)).reshape(-1).tolist()
        ends = cx.need_const(cx.inp(2)).reshape(-1).tolist()
        axes = cx.need_const(cx.inp(3)).reshape(-1).tolist() if cx.inp(3) else None
        steps = cx.need_const(cx.inp(4)).reshape(-1).tolist() if cx.inp(4) else None
    axes = list(range(len(starts))) if axes is None else [cx.normalize_axis(int(a), r) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    c2_starts, c2_ends = [0] * r, [-1] * r
    gathers = []
    for a, s, e, st in zip(axes, starts, ends, steps):
        n = cx.dim(x, a)
        s, e = int(s), int(e)
        if st == 0:
            raise cx.error("Slice step 0")
        if st > 0:
            s = min(max(s + n if s < 0 else s, 0), n)
            e = min(max(e + n if e < 0 else e, 0), n)
        else:
            s = min(max(s + n if s < 0 else s, -1), n - 1)
            e = min(max(e + n if e < 0 else e, -1), n - 1)
        if st == 1:
            c2_starts[a], c2_ends[a] = s, max(e, s)
        else:
            gathers.append((a, np.arange(s, e, st, dtype=np.int64)))
    y = x
    last = max([a for a in range(r) if (c2_starts[a], c2_ends[a]) != (0, -1)], default=-1)
    if last >= 0:
        y = cx.tmp("Slice", [y], "slice", starts=c2_starts[:last + 1], ends=c2_ends[:last + 1])
    for a, idx in gathers:
        y = cx.tmp("Gather", [y, cx.add_const(idx, "idx")], "strided", axis=a)
    cx.op("Copy", [y], [cx.out(0)])


@_converts("Gather")
def _gather(cx):
    x, idx = cx.inp(0), cx.inp(1)
    r = cx.rank(x)
    axis = cx.normalize_axis(int(cx.attr("axis", 0)), r)
    xv, iv = cx.const(x), cx.const(idx)
    if xv is not None and iv is not None:
        cx.set_const(cx.out(0), np.take(xv, iv, axis=axis))
        return
    cx.op("Gather", [x, idx], [cx.out(0)], axis=axis, wrap_indices=1)


@_converts("Expand")
def _expand(cx):
    x, shape = cx.inp(0), cx.inp(1)
    cx.op("Expand", [x, shape], [cx.out(0)])


@_converts("Tile")
def _tile(cx):
    x = cx.inp(0)
    reps = [int(v) for v in cx.need_const(cx.inp(1)).reshape(-1)]
    y = x
    for axis, n in enumerate(reps):
        if n != 1:
            y = cx.tmp("Tile", [y], "tile", tiles=n, axis=axis)
    cx.op("Copy", [y], [cx.out(0)])


@_converts("Where")
def _where_op(cx):
    cx.op("Where", [cx.inp(0), cx.inp(1), cx.inp(2)], [cx.out(0)])


@_converts("Range")
def _range(cx):
    t = cx.dtype(cx.inp(0))
    if t in _ARITH:
        cx.op("Range", [cx.inp(0), cx.inp(1), cx.inp(2)], [cx.out(0)])
        return
    wide = [cx.widened(cx.inp(i), _ARITH) for i in range(3)]
    r = cx.tmp("Range", [w for w, _ in wide], "range")
    cx.narrowed(r, wide[0][1], t, cx.out(0))


@_converts("EyeLike")
def _eye_like(cx):
    s = cx.static_shape(cx.inp(0))
    k = int(cx.attr("k", 0))
    dt = cx.attr("dtype")
    dt = NUMPY_OF_ONNX[int(dt)] if dt is not None else cx.np_dtype(cx.inp(0))
    cx.set_const(cx.out(0), np.eye(s[0], s[1], k=k, dtype=dt))


@_converts("Trilu")
def _trilu(cx):
    x = cx.inp(0)
    s = cx.static_shape(x)
    k = int(cx.need_const(cx.inp(1)).reshape(-1)[0]) if cx.inp(1) else 0
    upper = int(cx.attr("upper", 1))
    n, m = s[-2], s[-1]
    mask = np.triu(np.ones((n, m), bool), k) if upper else np.tril(np.ones((n, m), bool), k)
    dt = cx.np_dtype(x)
    cx.op("Where", [cx.add_const(mask, "mask"), x, cx.scalar(0, dt)], [cx.out(0)])


@_converts("OneHot")
def _one_hot(cx):
    idx, depth, values = cx.inp(0), cx.inp(1), cx.inp(2)
    d = int(cx.need_const(depth).reshape(-1)[0])
    r = cx.rank(idx) + 1
    axis = cx.normalize_axis(int(cx.attr("axis", -1)), r)
    if cx.dtype(idx) in _FLOATS or cx.dtype(idx) == TensorProto.FLOAT16:
        wi = cx.cast(idx, TensorProto.INT64)  # toward zero, as ONNX's cast
    else:
        wi, _ = cx.widened(idx, {TensorProto.INT64})
    zero = cx.scalar(0, np.int64)
    wrapped = cx.tmp("Where", [cx.tmp("LT", [wi, zero]), cx.tmp("Add", [wi, cx.scalar(d, np.int64)]), wi])
    un = cx.tmp("ExpandDims", [wrapped], dims=[axis])
    ar_shape = [1] * r
    ar_shape[axis] = d
    ar = cx.add_const(np.arange(d, dtype=np.int64).reshape(ar_shape), "range")
    eq = cx.tmp("EQ", [un, ar], "hot")
    vv = cx.need_const(values) if cx.const(values) is None else cx.const(values)
    dt = vv.dtype
    off = cx.add_const(np.array(vv.reshape(-1)[0], dt), "off")
    on = cx.add_const(np.array(vv.reshape(-1)[1], dt), "on")
    cx.op("Where", [eq, on, off], [cx.out(0)])


@_converts("DepthToSpace", "SpaceToDepth")
def _depth_space(cx):
    x = cx.inp(0)
    n, c, h, w = cx.static_shape(x)
    b = int(cx.attr("blocksize"))
    if cx.node.op_type == "DepthToSpace":
        if cx.attr("mode", "DCR") == "DCR":
            shape1, perm = [n, b, b, c // (b * b), h, w], [0, 3, 4, 1, 5, 2]
        else:
            shape1, perm = [n, c // (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3]
        shape2 = [n, c // (b * b), h * b, w * b]
    else:
        shape1 = [n, c, h // b, b, w // b, b]
        perm = [0, 3, 5, 1, 2, 4] if cx.attr("mode", "DCR") == "DCR" else [0, 1, 3, 5, 2, 4]
        shape2 = [n, c * b * b, h // b, w // b]
    a = cx.op("Reshape", [x], [cx.fresh("r"), cx.fresh("old")], shape=shape1)[0]
    t = cx.tmp("Transpose", [a], "t", axes=perm)
    cx.op("Reshape", [t], [cx.out(0), cx.fresh("old")], shape=shape2)


def _gather_window(cx, x: str, s: list[int], sources: dict, fill, mode_constant: bool) -> str:
    """`x` re-indexed along each axis of `sources` ({axis: source index of
    each output position, -1 or dim for positions outside}); outside
    positions take `fill` when `mode_constant`, else the index given."""
    r = len(s)
    y = x
    masks = []
    for a, src in sorted(sources.items()):
        n = s[a]
        if n == 0:
            raise cx.unsupported("padding an empty dim")
        valid = (src >= 0) & (src < n)
        y = cx.tmp("Gather", [y, cx.add_const(np.clip(src, 0, n - 1).astype(np.int64), "idx")],
                   "window", axis=a)
        if mode_constant and not valid.all():
            shape = [1] * r
            shape[a] = len(src)
            masks.append(valid.reshape(shape))
    if masks:
        mask = masks[0]
        for m in masks[1:]:
            mask = mask & m
        y = cx.tmp("Where", [cx.add_const(mask, "mask"), y, cx.scalar(fill, cx.np_dtype(x))], "padded")
    return y


@_converts("Pad")
def _pad(cx):
    x = cx.inp(0)
    s = cx.static_shape(x)
    r = len(s)
    mode = cx.attr("mode", "constant")
    if cx.opset < 11:
        pads = cx.attr("pads", cx.attr("paddings"))
        value = float(cx.attr("value", 0.0))
        axes = None
    else:
        pads = cx.need_const(cx.inp(1)).reshape(-1).tolist()
        value = cx.need_const(cx.inp(2)).reshape(-1)[0] if cx.inp(2) else 0
        axes = cx.need_const(cx.inp(3)).reshape(-1).tolist() if cx.inp(3) else None
    axes = list(range(r)) if axes is None else [cx.normalize_axis(int(a), r) for a in axes]
    k = len(axes)
    sources = {}
    for i, a in enumerate(axes):
        pb, pe = int(pads[i]), int(pads[k + i])
        if pb == 0 and pe == 0:
            continue
        n = s[a]
        src = np.arange(-pb, n + pe, dtype=np.int64)
        if mode == "constant":
            pass
        elif mode == "edge":
            src = np.clip(src, 0, n - 1)
        elif mode == "reflect":
            if n == 1:
                src = np.zeros_like(src)
            else:
                period = 2 * (n - 1)
                m = np.mod(src, period)
                src = np.where(m < n, m, period - m)
        elif mode == "wrap":
            src = np.mod(src, n)
        else:
            raise cx.unsupported(f"Pad mode {mode!r}")
        sources[a] = src
    y = _gather_window(cx, x, s, sources, value, mode == "constant")
    cx.op("Copy", [y], [cx.out(0)])


@_converts("CenterCropPad")
def _center_crop_pad(cx):
    x = cx.inp(0)
    s = cx.static_shape(x)
    r = len(s)
    target = [int(v) for v in cx.need_const(cx.inp(1)).reshape(-1)]
    axes = cx.attr("axes")
    axes = list(range(r)) if axes is None else [cx.normalize_axis(int(a), r) for a in axes]
    sources = {}
    for a, want in zip(axes, target):
        n = s[a]
        if want == n:
            continue
        # A centred window: the odd one left over goes to the end.
        offset = (n - want) // 2 if want < n else -((want - n) // 2)
        sources[a] = np.arange(want, dtype=np.int64) + offset
    y = _gather_window(cx, x, s, sources, 0, True)
    cx.op("Copy", [y], [cx.out(0)])


@_converts("Compress")
def _compress(cx):
    x, cond = cx.inp(0), cx.inp(1)
    s = cx.static_shape(x)
    axis = cx.attr("axis")
    c = cx.static_shape(cond)[0]
    if axis is None:
        y = cx.op("Reshape", [x], [cx.fresh("flat"), cx.fresh("old")], shape=[-1])[0]
        n, front = int(np.prod(s)), None
    else:
        a = cx.normalize_axis(int(axis), len(s))
        n = s[a]
        perm = [a] + [i for i in range(len(s)) if i != a]
        front = perm
        y = cx.tmp("Transpose", [x], "front", axes=perm) if a != 0 else x
    mask = cond if cx.dtype(cond) == TensorProto.BOOL else cx.tmp("Cast", [cond], "mask", to=caffe2_pb2.TensorProto.BOOL)
    if c < n:  # a shorter condition leaves the rest out
        mask = cx.op("Concat", [mask, cx.add_const(np.zeros(n - c, bool), "rest")],
                     [cx.fresh("mask"), cx.fresh("info")], axis=0)[0]
    elif c > n:
        mask = cx.tmp("Slice", [mask], "mask", starts=[0], ends=[n])
    kept = cx.op("BooleanMask", [y, mask], [cx.fresh("kept")])[0]
    if front is not None and front[0] != 0:
        inverse = [front.index(i) for i in range(len(front))]
        kept = cx.tmp("Transpose", [kept], "back", axes=inverse)
    cx.op("Copy", [kept], [cx.out(0)])


# -- neural-net ops


def _window_args(cx, x: str, kernel, pooling: bool):
    """Caffe2 window arguments (kernels, strides, pads, dilations) from
    ONNX's, auto_pad and ceil_mode resolved to explicit pads."""
    r = cx.rank(x)
    nd = r - 2
    if nd < 1 or nd > 3:
        raise cx.unsupported(f"{nd}-D windows (1 to 3 spatial dims are supported)", blob=x)
    strides = list(cx.attr("strides", [1] * nd))
    dil = list(cx.attr("dilations", [1] * nd))
    pads = list(cx.attr("pads", [0] * (2 * nd)))
    auto_pad = cx.attr("auto_pad", "NOTSET")
    ceil = int(cx.attr("ceil_mode", 0)) if pooling else 0
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nd)
        for i in range(nd):
            n = cx.dim(x, 2 + i)
            dk = (kernel[i] - 1) * dil[i] + 1
            out = -(-n // strides[i])
            total = max((out - 1) * strides[i] + dk - n, 0)
            small, big = total // 2, total - total // 2
            pads[i], pads[nd + i] = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        pads = [0] * (2 * nd)
    elif auto_pad != "NOTSET":
        raise cx.unsupported(f"auto_pad {auto_pad!r}")
    extended = False
    if ceil:
        for i in range(nd):
            n = cx.dim(x, 2 + i)
            dk = (kernel[i] - 1) * dil[i] + 1
            avail = n + pads[i] + pads[nd + i]
            out = -(-(avail - dk) // strides[i]) + 1
            # The last window must start inside the input or its head pad.
            if (out - 1) * strides[i] >= n + pads[i]:
                out -= 1
            need = (out - 1) * strides[i] + dk - n - pads[i]
            if need > pads[nd + i]:
                pads[nd + i] = need
                extended = True
    args = {"kernels": list(kernel), "strides": strides, "pads": pads}
    if any(d != 1 for d in dil):
        args["dilations"] = dil
    return args, extended


@_converts("Conv")
def _conv(cx):
    x, w = cx.inp(0), cx.inp(1)
    kernel = cx.attr("kernel_shape")
    if kernel is None:
        kernel = cx.static_shape(w)[2:]
    args, _ = _window_args(cx, x, list(kernel), pooling=False)
    ins = [x, w] + ([cx.inp(2)] if cx.inp(2) else [])
    t = cx.dtype(x)
    if t in _FLOATS:
        cx.op("Conv", ins, [cx.out(0)], group=int(cx.attr("group", 1)), **args)
        return
    wide = [cx.widened(i, _FLOATS)[0] for i in ins]
    r = cx.tmp("Conv", wide, "conv", group=int(cx.attr("group", 1)), **args)
    cx.narrowed(r, cx.widened(x, _FLOATS)[1], t, cx.out(0))


@_converts("ConvTranspose")
def _conv_transpose(cx):
    x, w = cx.inp(0), cx.inp(1)
    r = cx.rank(x)
    nd = r - 2
    kernel = cx.attr("kernel_shape") or cx.static_shape(w)[2:]
    kernel = list(kernel)
    strides = list(cx.attr("strides", [1] * nd))
    dil = list(cx.attr("dilations", [1] * nd))
    adj = list(cx.attr("output_padding", [0] * nd))
    pads = list(cx.attr("pads", [0] * (2 * nd)))
    auto_pad = cx.attr("auto_pad", "NOTSET")
    out_shape = cx.attr("output_shape")
    if out_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        ins = [cx.dim(x, 2 + i) for i in range(nd)]
        if out_shape is None:
            out_shape = [n * s for n, s in zip(ins, strides)]
        out_shape = list(out_shape)[-nd:]
        pads = [0] * (2 * nd)
        for i in range(nd):
            total = strides[i] * (ins[i] - 1) + adj[i] + (kernel[i] - 1) * dil[i] + 1 - out_shape[i]
            if total < 0:
                adj[i] += -total
                total = 0
            if auto_pad == "SAME_UPPER":
                pads[i], pads[nd + i] = total // 2, total - total // 2
            else:
                pads[i], pads[nd + i] = total - total // 2, total // 2
    elif auto_pad == "VALID":
        pads = [0] * (2 * nd)
    if any(d != 1 for d in dil):
        # ferrocaffe's ConvTranspose has no dilation: the same product with
        # the filter's taps spread out (zeros between them).
        wv = cx.need_const(w)
        spread = np.zeros(list(wv.shape[:2]) + [(k - 1) * d + 1 for k, d in zip(kernel, dil)], wv.dtype)
        spread[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in dil)] = wv
        w = cx.add_const(spread, "dilated_w")
        kernel = list(spread.shape[2:])
    args = {"kernels": kernel, "strides": strides, "pads": pads}
    if any(adj):
        args["adjs"] = adj
    ins = [x, w] + ([cx.inp(2)] if cx.inp(2) else [])
    cx.op("ConvTranspose", ins, [cx.out(0)], group=int(cx.attr("group", 1)), **args)


def _pool(cx, c2: str, extra=None):
    x = cx.inp(0)
    if cx.wants(1):
        raise cx.unsupported("MaxPool's Indices output")
    kernel = list(cx.attr("kernel_shape"))
    args, extended = _window_args(cx, x, kernel, pooling=True)
    if c2 == "AveragePool":
        include = int(cx.attr("count_include_pad", 0))
        if include and extended:
            raise cx.unsupported("AveragePool with ceil_mode and count_include_pad whose "
                                 "last window passes the pads")
        args["count_include_pad"] = include
        if "dilations" in args and cx.opset < 19:
            raise cx.error("AveragePool dilations need opset 19")
    if cx.attr("storage_order", 0):
        pass  # only the Indices output depends on it
    args.update(extra or {})
    t = cx.dtype(x)
    if t in _FLOATS:
        cx.op(c2, [x], [cx.out(0)], **args)
        return
    wx, wt = cx.widened(x, _FLOATS)
    r = cx.tmp(c2, [wx], "pool", **args)
    cx.narrowed(r, wt, t, cx.out(0))


@_converts("MaxPool")
def _max_pool(cx):
    _pool(cx, "MaxPool")


@_converts("AveragePool")
def _average_pool(cx):
    _pool(cx, "AveragePool")


@_converts("LpPool")
def _lp_pool(cx):
    _pool(cx, "LpPool", {"p": float(cx.attr("p", 2))})


@_converts("GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool")
def _global_pool(cx):
    x = cx.inp(0)
    c2 = {"GlobalMaxPool": "MaxPool", "GlobalAveragePool": "AveragePool",
          "GlobalLpPool": "LpPool"}[cx.node.op_type]
    r = cx.rank(x)
    if not 3 <= r <= 5:
        raise cx.unsupported(f"global pooling of rank {r}")
    extra = {"p": float(cx.attr("p", 2))} if c2 == "LpPool" else {}
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    if wt == t:
        cx.op(c2, [x], [cx.out(0)], global_pooling=1, **extra)
        return
    red = cx.tmp(c2, [wx], "pool", global_pooling=1, **extra)
    cx.narrowed(red, wt, t, cx.out(0))


@_converts("BatchNormalization")
def _batch_norm(cx):
    if int(cx.attr("training_mode", 0)) or (cx.opset < 14 and any(cx.wants(i) for i in range(1, 5))):
        raise cx.unsupported("BatchNormalization in training mode")
    if cx.opset < 7 and not int(cx.attr("is_test", 1)):
        raise cx.unsupported("BatchNormalization in training mode")
    x = cx.inp(0)
    eps = float(cx.attr("epsilon", 1e-5))
    ins = [cx.inp(i) for i in range(5)]
    t = cx.dtype(x)
    if t in _FLOATS and all(cx.dtype(i) == t for i in ins):
        cx.op("SpatialBN", ins, [cx.out(0)], is_test=1, epsilon=eps)
        return
    wide = [cx.widened(i, {TensorProto.FLOAT})[0] if cx.dtype(i) != TensorProto.FLOAT else i
            for i in ins]
    r = cx.tmp("SpatialBN", wide, "bn", is_test=1, epsilon=eps)
    cx.narrowed(r, TensorProto.FLOAT, t, cx.out(0))


@_converts("InstanceNormalization")
def _instance_norm(cx):
    x, scale, bias = cx.inp(0), cx.inp(1), cx.inp(2)
    r = cx.rank(x)
    eps = float(cx.attr("epsilon", 1e-5))
    axes = list(range(2, r))
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    dt = NUMPY_OF_ONNX[wt]
    mean = cx.tmp("ReduceMean", [wx], "mean", axes=axes, keepdims=1)
    d = cx.tmp("Sub", [wx, mean], "centred")
    var = cx.tmp("ReduceMean", [cx.tmp("Mul", [d, d])], "var", axes=axes, keepdims=1)
    std = cx.tmp("Sqrt", [cx.tmp("Add", [var, cx.scalar(eps, dt)])], "std")
    norm = cx.tmp("Div", [d, std], "norm")
    dims = list(range(1, r - 1))
    sc = cx.tmp("ExpandDims", [cx.widened(scale, {wt})[0]], "scale", dims=dims)
    bi = cx.tmp("ExpandDims", [cx.widened(bias, {wt})[0]], "bias", dims=dims)
    y = cx.tmp("Add", [cx.tmp("Mul", [norm, sc]), bi], "y")
    cx.narrowed(y, wt, t, cx.out(0))


@_converts("MeanVarianceNormalization")
def _mvn(cx):
    x = cx.inp(0)
    r = cx.rank(x)
    axes = [cx.normalize_axis(int(a), r) for a in cx.attr("axes", [0, 2, 3])]
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    dt = NUMPY_OF_ONNX[wt]
    mean = cx.tmp("ReduceMean", [wx], "mean", axes=axes, keepdims=1)
    d = cx.tmp("Sub", [wx, mean], "centred")
    var = cx.tmp("ReduceMean", [cx.tmp("Mul", [d, d])], "var", axes=axes, keepdims=1)
    std = cx.tmp("Sqrt", [cx.tmp("Add", [var, cx.scalar(1e-9, dt)])], "std")
    y = cx.tmp("Div", [d, std], "y")
    cx.narrowed(y, wt, t, cx.out(0))


@_converts("LpNormalization")
def _lp_normalization(cx):
    x = cx.inp(0)
    p = int(cx.attr("p", 2))
    if p not in (1, 2):
        raise cx.unsupported(f"LpNormalization with p = {p}")
    axis = cx.normalize_axis(int(cx.attr("axis", -1)), cx.rank(x))
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    dt = NUMPY_OF_ONNX[wt]
    norm = cx.tmp("ReduceL2" if p == 2 else "ReduceL1", [wx], "norm", axes=[axis], keepdims=1)
    q = cx.tmp("Div", [wx, norm], "q")
    # A zero vector stays zero (ONNX's reference), not 0/0.
    y = cx.tmp("Where", [cx.tmp("EQ", [norm, cx.scalar(0, dt)]), cx.scalar(0, dt), q], "y")
    cx.narrowed(y, wt, t, cx.out(0))


@_converts("RMSNormalization")
def _rms_normalization(cx):
    x, scale = cx.inp(0), cx.inp(1)
    r = cx.rank(x)
    axis = cx.normalize_axis(int(cx.attr("axis", -1)), r)
    eps = float(cx.attr("epsilon", 1e-5))
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    dt = NUMPY_OF_ONNX[wt]
    ms = cx.tmp("ReduceMean", [cx.tmp("Mul", [wx, wx], "sq")], "ms", axes=list(range(axis, r)),
                keepdims=1)
    rms = cx.tmp("Sqrt", [cx.tmp("Add", [ms, cx.scalar(eps, dt)])], "rms")
    ws = cx.widened(scale, {wt})[0] if cx.dtype(scale) != wt else scale
    y = cx.tmp("Mul", [cx.tmp("Div", [wx, rms], "normed"), ws], "y")
    cx.narrowed(y, wt, t, cx.out(0))


@_converts("GroupNormalization")
def _group_normalization(cx):
    x, scale, bias = cx.inp(0), cx.inp(1), cx.inp(2)
    s = cx.static_shape(x)
    r = len(s)
    g = int(cx.attr("num_groups"))
    eps = float(cx.attr("epsilon", 1e-5))
    n, c = s[0], s[1]
    if c % g:
        raise cx.error(f"{c} channels do not split into {g} groups", blob=x)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    dt = NUMPY_OF_ONNX[wt]
    grouped = cx.op("Reshape", [wx], [cx.fresh("grouped"), cx.fresh("old")], shape=[n, g, -1])[0]
    mean = cx.tmp("ReduceMean", [grouped], "mean", axes=[2], keepdims=1)
    d = cx.tmp("Sub", [grouped, mean], "centred")
    var = cx.tmp("ReduceMean", [cx.tmp("Mul", [d, d])], "var", axes=[2], keepdims=1)
    normed = cx.tmp("Div", [d, cx.tmp("Sqrt", [cx.tmp("Add", [var, cx.scalar(eps, dt)])])], "normed")
    back = cx.op("Reshape", [normed], [cx.fresh("y"), cx.fresh("old")], shape=s)[0]
    sc, bi = (cx.widened(v, {wt})[0] if cx.dtype(v) != wt else v for v in (scale, bias))
    if cx.opset < 21:
        # Opset 18: one scale and bias per group, repeated over its channels.
        reps = cx.add_const(np.repeat(np.arange(g, dtype=np.int64), c // g), "per_channel")
        sc = cx.tmp("Gather", [sc, reps], "scale", axis=0)
        bi = cx.tmp("Gather", [bi, reps], "bias", axis=0)
    dims = list(range(1, r - 1))
    sc = cx.tmp("ExpandDims", [sc], "scale", dims=dims)
    bi = cx.tmp("ExpandDims", [bi], "bias", dims=dims)
    y = cx.tmp("Add", [cx.tmp("Mul", [back, sc]), bi], "y")
    cx.narrowed(y, wt, t, cx.out(0))


@_converts("LayerNormalization")
def _layer_norm(cx):
    x, scale, bias = cx.inp(0), cx.inp(1), cx.inp(2)
    s = cx.static_shape(x)
    r = len(s)
    axis = cx.normalize_axis(int(cx.attr("axis", -1)), r)
    eps = float(cx.attr("epsilon", 1e-5))
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    dt = NUMPY_OF_ONNX[wt]
    norm_shape = s[axis:]
    shape_c = cx.add_const(np.array(norm_shape, np.int64), "shape")

    def fit(name):
        w = cx.widened(name, {wt})[0] if cx.dtype(name) != wt else name
        if cx.static_shape(name) != norm_shape:
            w = cx.tmp("Expand", [w, shape_c], "affine")
        return w
    sc = fit(scale)
    bi = fit(bias) if bias else cx.add_const(np.zeros(norm_shape, dt), "zeros")
    y, mean, std = cx.fresh("y"), cx.fresh("mean"), cx.fresh("std")
    cx.op("LayerNorm", [wx, sc, bi], [y, mean, std], axis=axis, epsilon=eps, elementwise_affine=1)
    cx.narrowed(y, wt, t, cx.out(0))
    stat_shape = s[:axis] + [1] * (r - axis)
    stash = TensorProto.FLOAT if int(cx.attr("stash_type", 1)) == 1 else wt
    if cx.wants(1):
        m = cx.op("Reshape", [mean], [cx.fresh("m"), cx.fresh("old")], shape=stat_shape)[0]
        cx.narrowed(m, wt, stash, cx.out(1))
    if cx.wants(2):
        inv = cx.tmp("Reciprocal", [std], "inv")
        m = cx.op("Reshape", [inv], [cx.fresh("m"), cx.fresh("old")], shape=stat_shape)[0]
        cx.narrowed(m, wt, stash, cx.out(2))


@_converts("LRN")
def _lrn(cx):
    size = int(cx.attr("size"))
    if size % 2 == 0:
        raise cx.unsupported(f"LRN size {size}: ferrocaffe's window is centred (odd sizes)")
    x = cx.inp(0)
    _unary_float(cx, "LRN", x, cx.out(0), size=size, alpha=float(cx.attr("alpha", 1e-4)),
                 beta=float(cx.attr("beta", 0.75)), bias=float(cx.attr("bias", 1.0)))


@_converts("Dropout")
def _dropout(cx):
    x = cx.inp(0)
    training = False
    if cx.opset >= 12 and cx.inp(2):
        training = bool(cx.need_const(cx.inp(2)).reshape(-1)[0])
    if cx.opset < 7 and not int(cx.attr("is_test", 0)):
        training = True
    if training:
        ratio = float(cx.need_const(cx.inp(1)).reshape(-1)[0]) if cx.inp(1) else 0.5
        if ratio != 0:
            raise cx.unsupported("Dropout in training mode (random)")
    cx.op("Copy", [x], [cx.out(0)])
    if cx.wants(1):
        cx.op("ConstantFill", [x], [cx.out(1)], dtype=caffe2_pb2.TensorProto.BOOL, value=1)


@_converts("Gemm")
def _gemm(cx):
    a, b, c = cx.inp(0), cx.inp(1), cx.inp(2)
    alpha, beta = float(cx.attr("alpha", 1.0)), float(cx.attr("beta", 1.0))
    ta, tb = int(cx.attr("transA", 0)), int(cx.attr("transB", 0))
    t = cx.dtype(a)
    wa, wt = cx.widened(a, _FLOATS)
    wb = cx.widened(b, {wt})[0] if cx.dtype(b) != wt else b
    wc = (cx.widened(c, {wt})[0] if cx.dtype(c) != wt else c) if c else ""
    cs = cx.shape(c) if c else None
    n = None
    bs = cx.shape(b)
    if bs is not None and bs[0 if tb else 1] is not None:
        n = bs[0 if tb else 1]
    if (not ta and alpha == 1.0 and beta == 1.0 and c and cs is not None and len(cs) == 1
            and n is not None and cs[0] == n):
        r = cx.tmp("FC" if tb else "FCTransposed", [wa, wb, wc], "fc")
        cx.narrowed(r, wt, t, cx.out(0))
        return
    y = cx.tmp("MatMul", [wa, wb], "mm", trans_a=ta, trans_b=tb)
    dt = NUMPY_OF_ONNX[wt]
    if alpha != 1.0:
        y = cx.tmp("Mul", [y, cx.scalar(alpha, dt)], "alpha")
    if c and beta != 0.0:
        cc = wc if beta == 1.0 else cx.tmp("Mul", [wc, cx.scalar(beta, dt)], "beta")
        y = cx.tmp("Add", [y, cc], "gemm")
    cx.narrowed(y, wt, t, cx.out(0))


@_converts("MatMul")
def _matmul(cx):
    a, b = cx.inp(0), cx.inp(1)
    t = cx.dtype(a)
    wa, wt = cx.widened(a, _FLOATS)
    wb = cx.widened(b, {wt})[0] if cx.dtype(b) != wt else b
    r = cx.tmp("BatchMatMul", [wa, wb], "mm", broadcast=1)
    cx.narrowed(r, wt, t, cx.out(0))


def _softmax_family(cx, kind: str):
    x = cx.inp(0)
    r = cx.rank(x)
    t = cx.dtype(x)
    wx, wt = cx.widened(x, _FLOATS)
    if cx.opset < 13:
        # The input is flattened to 2-D at `axis`; the op runs over each row.
        axis = cx.normalize_axis(int(cx.attr("axis", 1)), r) if r else 0
        flat = cx.tmp("Flatten", [wx], "flat", axis=axis) if r != 2 or axis != 1 else wx
        y = _softmax_rows(cx, kind, flat, 1, 2, wt)
        if flat is not wx:
            y = cx.op("Reshape", [y, cx.tmp("Shape", [wx], "shape")], [cx.fresh("y"), cx.fresh("old")])[0]
        cx.narrowed(y, wt, t, cx.out(0))
        return
    axis = cx.normalize_axis(int(cx.attr("axis", -1)), r)
    y = _softmax_rows(cx, kind, wx, axis, r, wt)
    cx.narrowed(y, wt, t, cx.out(0))


def _softmax_rows(cx, kind, x, axis, r, wt):
    dt = NUMPY_OF_ONNX[wt]
    if kind == "Softmax":
        if axis == r - 1:
            return cx.tmp("Softmax", [x], "softmax", axis=axis)
        perm = list(range(r))
        perm[axis], perm[-1] = perm[-1], perm[axis]
        tr = cx.tmp("Transpose", [x], "t", axes=perm)
        sm = cx.tmp("Softmax", [tr], "softmax", axis=r - 1)
        return cx.tmp("Transpose", [sm], "softmax", axes=perm)
    if kind == "LogSoftmax":
        m = cx.tmp("ReduceMax", [x], "max", axes=[axis], keepdims=1)
        d = cx.tmp("Sub", [x, m], "shifted")
        s = cx.tmp("ReduceSum", [cx.tmp("Exp", [d])], "sum", axes=[axis], keepdims=1)
        return cx.tmp("Sub", [d, cx.tmp("Log", [s])], "logsoftmax")
    # Hardmax: 1 at the first largest element along the axis.
    n = cx.dim(x, axis) if cx.shape(x) is not None else None
    if n is None:
        raise _NeedsRunTime("the size of the softmax axis")
    idx = cx.tmp("ArgMax", [x], "argmax", axis=axis, keepdims=1)
    shape = [1] * r
    shape[axis] = n
    ar = cx.add_const(np.arange(n, dtype=np.int64).reshape(shape), "range")
    return cx.tmp("Cast", [cx.tmp("EQ", [idx, ar])], "hardmax", to=ONNX_TO_C2_TYPE[wt])


@_converts("Softmax", "LogSoftmax", "Hardmax")
def _softmax(cx):
    _softmax_family(cx, cx.node.op_type)


# ------------------------------------------------------------------ the API


def _device_ok(device) -> None:
    d = Device(device) if isinstance(device, str) else device
    if d.type != DeviceType.CPU:
        raise errors.InvalidArgumentError(f"device {device!r}: ferrocaffe runs on the CPU only")


class Caffe2Backend(Backend):
    """The backend (Caffe2's class name; ferrocaffe's ops underneath)."""

    #: Newest ONNX opset whose changes the conversions know (the node tests
    #: of onnx 1.23 cover up to it).
    _known_opset_version = 28

    @classmethod
    def _opset(cls, model) -> int:
        opset = None
        for imp in model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                opset = imp.version
        if opset is None:
            for i, n in enumerate(model.graph.node):
                if n.domain not in ("", "ai.onnx"):
                    raise UnsupportedOperatorError(
                        f"op '{n.op_type}' of domain '{n.domain}' is not converted"
                        + where(n.op_type, i, model.graph.name, None, n.name),
                        op=n.op_type, op_index=i, net=model.graph.name)
            if model.ir_version >= 3:
                raise ConversionError("the model names no opset of the default domain")
            opset = 1
        if opset > cls._known_opset_version:
            warnings.warn(f"the model uses opset {opset}; the conversions know up to "
                          f"{cls._known_opset_version}: converting as best we can", stacklevel=3)
        return opset

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs) -> Caffe2Rep:
        """Converts ``model`` (a ModelProto, its bytes, or a path) and returns
        its Rep. The model is checked with ``onnx.checker`` first (as
        ``onnx.backend.base`` does) unless ``check=False``."""
        model = _load_model(model)
        check = kwargs.pop("check", True)
        if check:
            super().prepare(model, device, **kwargs)
        _device_ok(device)
        opset = cls._opset(model)
        try:
            converted = _GraphConverter(model, opset).convert()
        except _NeedsRunTime as e:
            return Caffe2Rep(cls, model, opset, None, deferred=e.what)
        return Caffe2Rep(cls, model, opset, converted)

    @classmethod
    def _convert_for_run(cls, model, opset, feeds) -> _Converted:
        try:
            return _GraphConverter(model, opset, feeds=feeds).convert()
        except _NeedsRunTime as e:  # pragma: no cover - every shape is known at run time
            raise ConversionError(f"could not convert graph '{model.graph.name}': {e.what} "
                                  "is unknown even at run time") from None

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, opset_version=None, **kwargs):
        """Runs one NodeProto on ``inputs`` (a list in the node's input
        order, or a dict by name); the outputs as a named tuple."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info)
        names = [n for n in node.input]
        if isinstance(inputs, dict):
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            present = [n for n in names if n]
            if len(present) != len(inputs):
                raise errors.InvalidArgumentError(
                    f"node '{node.op_type}' takes {len(present)} inputs, got {len(inputs)}")
            feeds = {n: np.asarray(v) for n, v in zip(present, inputs)}
        graph_inputs = []
        for n, v in feeds.items():
            t = ONNX_OF_NUMPY.get(v.dtype)
            if t is None:
                raise errors.DataTypeError(f"input '{n}' of dtype {v.dtype} has no ferrocaffe tensor type",
                                           blob=n)
            graph_inputs.append(helper.make_tensor_value_info(n, t, list(v.shape)))
        outputs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                   for o in node.output if o]
        graph = helper.make_graph([node], "run_node", graph_inputs, outputs)
        opset = opset_version or onnx.defs.onnx_opset_version()
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        rep = cls.prepare(model, device, check=False)
        out = rep.run(feeds)
        return namedtupledict("Outputs", [o for o in node.output if o])(*out)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU

    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs) -> bool:
        """Whether every node has a conversion (attribute values aside)."""
        return cls.supports_device(device) and all(
            n.op_type in _CONVERTERS and n.domain in ("", "ai.onnx") for n in model.graph.node)

    @classmethod
    def supported_ops(cls) -> list[str]:
        """The ONNX op types with a conversion."""
        return sorted(_CONVERTERS)

    @classmethod
    def onnx_graph_to_caffe2_net(cls, model, device="CPU", opset_version=None):
        """``(init_net, predict_net)`` NetDefs: the init net fills the
        initializers and constants (GivenTensor*Fill), the predict net runs
        the graph. Every shape the conversion needs must be static in the
        model."""
        model = _load_model(model)
        _device_ok(device)
        opset = opset_version or cls._opset(model)
        try:
            converted = _GraphConverter(model, opset).convert()
        except _NeedsRunTime as e:
            raise ConversionError(
                f"graph '{model.graph.name}' needs {e.what} to be converted: give static "
                "shapes (and constant shape-like inputs)") from None
        init = converted.init_net
        _fill_init_net(converted.init_values, init)
        pred = converted.predict_net
        return init, pred


def _load_model(model):
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        m = onnx.ModelProto()
        try:
            m.ParseFromString(bytes(model))
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError
            raise ConversionError(f"not an ONNX model: {e}") from None
        return m
    if isinstance(model, str) or hasattr(model, "__fspath__"):
        try:
            return onnx.load(model)
        except OSError as e:
            raise errors.FerrocaffeIOError(str(e), file=str(model)) from None
        except Exception as e:  # noqa: BLE001 - a DecodeError
            raise ConversionError(f"{str(model)!r} is not an ONNX model: {e}",
                                  file=str(model)) from None
    raise errors.DataTypeError(f"expected an ONNX ModelProto, bytes or a path, not {type(model).__name__}")


prepare = Caffe2Backend.prepare
run_model = Caffe2Backend.run_model
run_node = Caffe2Backend.run_node
supports_device = Caffe2Backend.supports_device
is_compatible = Caffe2Backend.is_compatible
onnx_graph_to_caffe2_net = Caffe2Backend.onnx_graph_to_caffe2_net
