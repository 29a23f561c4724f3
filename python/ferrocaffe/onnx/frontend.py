"""Caffe2 nets to ONNX (Caffe2's ``caffe2.python.onnx.frontend``).

    model = caffe2_net_to_onnx_model(predict_net, init_net,
                                     {"data": (TensorProto.FLOAT, [1, 3, 224, 224])})

``value_info`` maps each input of the predict net that the init net does not
make to ``(ONNX element type, shape)``. The init net's outputs become the
graph's initializers (the init net is run, so any fill op works); the
shapes of the other blobs come from ferrocaffe's shape inference, and where
that leaves one unknown, from running the net once on random inputs of the
given shapes (as Caffe2 did). In-place ops are renamed to single
assignment. Every Caffe2 op has its own conversion (``Caffe2Frontend.
supported_ops()`` lists them); an op without one, or with an argument value
ONNX cannot express, raises ``UnsupportedOperatorError`` naming the op and
net. The model targets ``target_opset_version`` (17) of the default domain
and passes ``onnx.checker``. Differences from Caffe2's frontend are listed
in docs/porting.md ("ONNX").
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np

from . import _common
from ._common import (
    C2_TO_ONNX_TYPE,
    NUMPY_OF_ONNX,
    ONNX_OF_NUMPY,
    ONNX_TO_C2_TYPE,
    ConversionError,
    NameGen,
    UnsupportedOperatorError,
    where,
)

import onnx
from onnx import TensorProto, checker, helper, numpy_helper

from .. import _core, errors, workspace
from ..proto import caffe2_pb2

__all__ = [
    "ONNX_OPS_EMITTED",
    "Caffe2Frontend",
    "caffe2_net_to_onnx_graph",
    "caffe2_net_to_onnx_model",
    "caffe2_init_net_to_initializer",
    "ssa_rewrite",
]

_INT64_MAX = np.iinfo(np.int64).max

#: Every ONNX op a conversion below may emit (the tests hold the converters
#: to it, and ONNX's node tests of each of these to passing on the backend).
ONNX_OPS_EMITTED = frozenset("""
    Abs Acos Add And ArgMax ArgMin Asin Atan AveragePool BatchNormalization Cast Clip Concat
    Constant ConstantOfShape Conv ConvTranspose Cos Cosh Div Dropout Elu Equal Erf Exp Expand
    Flatten Gather Gelu Gemm GlobalAveragePool GlobalMaxPool Greater
    GreaterOrEqual HardSigmoid Identity LayerNormalization LeakyRelu Less LessOrEqual Log LpPool
    LRN MatMul Max MaxPool Mean Min Mul Neg Not Or Pow PRelu Reciprocal ReduceL1 ReduceL2
    ReduceMax ReduceMean ReduceMin ReduceSum Relu Reshape Selu Shape Sigmoid Sign Sin Sinh Size
    Slice Softmax Softplus Softsign Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile
    TopK Transpose Unsqueeze Where Xor
""".split())

# Arguments that only steer Caffe2's engines or gradients: no effect on the
# values an op computes, so they are dropped.
_IGNORED_ARGS = {
    "use_cudnn", "cudnn_exhaustive_search", "exhaustive_search", "ws_nbytes_limit",
    "shared_buffer", "engine", "float16_compute", "no_gradient_to_input", "no_bias",
    "init_params", "deterministic", "enable_tensor_core", "default_engine",
    # Ops whose values depend on the layout read `order` themselves (and refuse NHWC).
    "order",
}

_WINDOW_ARGS = {
    "kernel", "kernels", "kernel_h", "kernel_w", "stride", "strides", "stride_h", "stride_w",
    "pad", "pads", "pad_t", "pad_l", "pad_b", "pad_r", "dilation", "dilations",
    "dilation_h", "dilation_w", "legacy_pad", "global_pooling", "order",
}


def _arg_value(arg) -> Any:
    if arg.HasField("f"):
        return arg.f
    if arg.HasField("i"):
        return arg.i
    if arg.HasField("s"):
        return arg.s.decode("utf-8", "replace")
    if arg.floats:
        return list(arg.floats)
    if arg.ints:
        return list(arg.ints)
    if arg.strings:
        return [s.decode("utf-8", "replace") for s in arg.strings]
    if arg.HasField("n") or arg.nets:
        return arg.n if arg.HasField("n") else list(arg.nets)
    return []


def _as_netdef(net, what: str):
    if net is None:
        return None
    if isinstance(net, caffe2_pb2.NetDef):
        out = caffe2_pb2.NetDef()
        out.CopyFrom(net)
        return out
    if hasattr(net, "Proto") and callable(net.Proto):
        out = caffe2_pb2.NetDef()
        out.CopyFrom(net.Proto())
        return out
    if isinstance(net, (bytes, bytearray)) or type(net).__name__ == "NetDef":
        # A serialised NetDef, or a NetDef of another caffe2_pb2 (Caffe2's own).
        data = net if isinstance(net, (bytes, bytearray)) else net.SerializeToString()
        out = caffe2_pb2.NetDef()
        try:
            out.ParseFromString(bytes(data))
        except Exception as e:  # noqa: BLE001 - a DecodeError of either protobuf
            raise ConversionError(f"the {what} is not a NetDef: {e}") from None
        return out
    raise errors.DataTypeError(
        f"the {what} must be a NetDef or a core.Net, not {type(net).__name__}")


def _value_info_entry(name: str, entry, net: str) -> tuple[int, list[int]]:
    """(ONNX element type, dims) from a value_info entry: (type, shape), the
    type an ONNX TensorProto.DataType number or a numpy dtype."""
    try:
        elem_type, shape = entry
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError(
            f"value_info[{name!r}] must be (element type, shape), got {entry!r}"
            + where(net=net, blob=name), net=net, blob=name) from None
    if not isinstance(elem_type, (int, np.integer)):
        try:
            elem_type = ONNX_OF_NUMPY[np.dtype(elem_type)]
        except (TypeError, KeyError):
            raise errors.InvalidArgumentError(
                f"value_info[{name!r}]: unknown element type {elem_type!r}"
                + where(net=net, blob=name), net=net, blob=name) from None
    if int(elem_type) not in NUMPY_OF_ONNX:
        raise errors.InvalidArgumentError(
            f"value_info[{name!r}]: element type {_common.onnx_type_name(int(elem_type))} "
            f"has no ferrocaffe tensor type" + where(net=net, blob=name), net=net, blob=name)
    try:
        dims = [int(d) for d in shape]
    except (TypeError, ValueError):
        raise errors.InvalidArgumentError(
            f"value_info[{name!r}]: the shape must be a list of ints, got {shape!r}"
            + where(net=net, blob=name), net=net, blob=name) from None
    if any(d < 0 for d in dims):
        raise errors.InvalidArgumentError(
            f"value_info[{name!r}]: negative dim in {dims}" + where(net=net, blob=name),
            net=net, blob=name)
    return int(elem_type), dims


class _OpContext:
    """What one op's conversion sees: its arguments, the blobs' shapes and
    types, and the means to add nodes and constants."""

    def __init__(self, conv: "_NetConverter", op, index: int):
        self.conv = conv
        self.op = op
        self.index = index
        self.args: dict[str, Any] = {}
        for a in op.arg:
            self.args[a.name] = _arg_value(a)
        self.used_args: set[str] = set()
        self.nodes: list = []
        self.opset = conv.opset

    # -- errors
    def where(self, blob=None) -> str:
        return where(self.op.type, self.index, self.conv.net_name, blob)

    def error(self, message: str, blob=None, cls=ConversionError):
        return cls(message + self.where(blob), op=self.op.type, op_index=self.index,
                   net=self.conv.net_name, blob=blob)

    def unsupported(self, message: str, blob=None):
        return self.error(message, blob, UnsupportedOperatorError)

    # -- arguments
    def arg(self, name: str, default=None):
        self.used_args.add(name)
        return self.args.get(name, default)

    def has(self, name: str) -> bool:
        return name in self.args

    def mark(self, *names: str) -> None:
        self.used_args.update(names)

    # -- blobs
    def shape(self, name: str):
        s = self.conv.shapes.get(name)
        return None if s is None else list(s[0])

    def need_shape(self, name: str) -> list[int]:
        s = self.shape(name)
        if s is None:
            raise self.error(f"the shape of blob '{name}' is needed and could not be inferred "
                             "(give it in value_info)", blob=name)
        return s

    def rank(self, name: str) -> int:
        return len(self.need_shape(name))

    def dtype(self, name: str) -> int:
        """The ONNX element type of a blob (FLOAT when unknown)."""
        s = self.conv.shapes.get(name)
        if s is None:
            return TensorProto.FLOAT
        return C2_TO_ONNX_TYPE.get(s[1], TensorProto.FLOAT)

    def value(self, name: str):
        """The value of an initializer (None for any other blob)."""
        return self.conv.init_values.get(name)

    def used(self, name: str) -> bool:
        """Whether a later op reads the blob or the net outputs it."""
        return bool(name) and (name in self.conv.read_after.get(self.index, set())
                               or name in self.conv.external_outputs)

    def fresh(self, hint: str) -> str:
        return self.conv.names.new(hint)

    # -- building
    def node(self, op_type: str, inputs, outputs, **attrs) -> list[str]:
        outputs = list(outputs)
        name = self.op.name or f"{self.op.type}_{self.index}"
        if self.nodes:
            name = f"{name}/{len(self.nodes)}"
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return outputs

    def tmp(self, op_type: str, inputs, hint: str = "", **attrs) -> str:
        """A node with one fresh output; its name."""
        return self.node(op_type, inputs, [self.fresh(hint or op_type.lower())], **attrs)[0]

    def const(self, value, hint: str = "const", dtype=None) -> str:
        arr = np.asarray(value, dtype=dtype)
        name = self.fresh(hint)
        self.conv.extra_initializers.append(numpy_helper.from_array(arr, name))
        return name

    def ints(self, values, hint: str = "ints") -> str:
        return self.const(np.asarray(list(values), dtype=np.int64), hint)


class _NetConverter:
    def __init__(self, predict_net, opset: int, shapes: dict, init_values: dict):
        self.net = predict_net
        self.net_name = predict_net.name
        self.opset = opset
        self.shapes = shapes
        self.init_values = init_values
        self.extra_initializers: list = []
        # Initializers the conversions made (split info), dropped if unread.
        self.made_values: set[str] = set()
        self.external_outputs = set(predict_net.external_output)
        names = set(predict_net.external_input) | set(predict_net.external_output) | set(init_values)
        for op in predict_net.op:
            names.update(op.input)
            names.update(op.output)
        self.names = NameGen(names, "_onnx_")
        self.readers: dict[str, int] = {}
        for op in predict_net.op:
            for i in set(op.input):
                self.readers[i] = self.readers.get(i, 0) + 1
        # For each op index, the blobs that some later op reads.
        self.read_after: dict[int, set[str]] = {}
        later: set[str] = set()
        for i in range(len(predict_net.op) - 1, -1, -1):
            self.read_after[i] = set(later)
            later.update(predict_net.op[i].input)

    def convert_op(self, op, index: int) -> list:
        conv = _CONVERTERS.get(op.type)
        cx = _OpContext(self, op, index)
        if conv is None:
            raise cx.unsupported(f"Caffe2 op '{op.type}' has no ONNX conversion")
        conv(cx)
        leftover = sorted(set(cx.args) - cx.used_args - _IGNORED_ARGS)
        if leftover:
            raise cx.unsupported(
                f"argument(s) {', '.join(leftover)} of '{op.type}' have no ONNX conversion")
        return cx.nodes


# --------------------------------------------------------------- converters

_CONVERTERS: dict[str, Callable[[_OpContext], None]] = {}


def _converts(*types: str):
    def register(fn):
        for t in types:
            _CONVERTERS[t] = fn
        return fn
    return register


def _order(cx: _OpContext) -> None:
    order = cx.arg("order", "NCHW")
    if order != "NCHW":
        raise cx.unsupported(f"order {order!r}: only NCHW has an ONNX conversion")


def _dims_arg(cx, list_name, one, parts, nd, default):
    if cx.has(list_name):
        v = [int(x) for x in cx.arg(list_name)]
        return v
    if cx.has(one):
        return [int(cx.arg(one))] * (nd * (2 if list_name == "pads" else 1))
    if any(cx.has(p) for p in parts):
        return [int(cx.arg(p, default)) for p in parts]
    return None


def _window(cx: _OpContext, x: str, filter_name: str | None = None):
    """ONNX kernel_shape/strides/pads/dilations of a conv or pooling op."""
    _order(cx)
    nd = cx.rank(x) - 2
    if nd < 1:
        raise cx.error(f"input '{x}' has {nd + 2} dims; a window needs at least 3", blob=x)
    kernel = _dims_arg(cx, "kernels", "kernel", ["kernel_h", "kernel_w"], nd, None)
    strides = _dims_arg(cx, "strides", "stride", ["stride_h", "stride_w"], nd, 1) or [1] * nd
    dilations = _dims_arg(cx, "dilations", "dilation", ["dilation_h", "dilation_w"], nd, 1) or [1] * nd
    pads = _dims_arg(cx, "pads", "pad", ["pad_t", "pad_l", "pad_b", "pad_r"], nd, 0) or [0] * (2 * nd)
    if kernel is None:
        if filter_name is None:
            raise cx.error("no kernel size given (kernel, kernels or kernel_h/kernel_w)")
        kernel = cx.need_shape(filter_name)[2:]
    for what, v, per in (("kernels", kernel, 1), ("strides", strides, 1),
                         ("dilations", dilations, 1), ("pads", pads, 2)):
        if len(v) != nd * per:
            raise cx.error(f"{what} has {len(v)} values; input '{x}' has {nd} spatial dims", blob=x)
    legacy = int(cx.arg("legacy_pad", 0))
    ins = cx.shape(x)
    if legacy in (1, 2) and cx.has("pads") | cx.has("pad") | any(
            cx.has(p) for p in ("pad_t", "pad_l", "pad_b", "pad_r")):
        raise cx.error("legacy_pad VALID or SAME takes no explicit pads")
    auto_pad = None
    if legacy == 1:
        pads = [0] * (2 * nd)
    elif legacy == 2:
        if any(d != 1 for d in dilations):
            raise cx.error("legacy_pad SAME with dilation (Caffe2 refused it too)")
        if ins is None:
            auto_pad, pads = "SAME_UPPER", None
        else:
            pads = [0] * (2 * nd)
            for i in range(nd):
                n, k, s = ins[2 + i], kernel[i], strides[i]
                target = -(-n // s)
                needed = max((max(target, 1) - 1) * s + k - n, 0)
                pads[i], pads[nd + i] = needed // 2, needed - needed // 2
    elif legacy == 3:
        ins = cx.need_shape(x)
        for i in range(nd):
            n, k, s, ph = ins[2 + i], kernel[i], strides[i], pads[i]
            avail = n + 2 * ph
            out = -(-(avail - k) // s) + 1
            if ph > 0 and (out - 1) * s >= n + ph:
                out -= 1
            standard = (avail - k) // s + 1
            pads[nd + i] = ph + s * (out - standard)
    elif legacy != 0:
        raise cx.error(f"legacy_pad must be 0 to 3, got {legacy}")
    attrs = {"kernel_shape": list(kernel), "strides": list(strides)}
    if auto_pad:
        attrs["auto_pad"] = auto_pad
    else:
        attrs["pads"] = list(pads)
    if any(d != 1 for d in dilations):
        attrs["dilations"] = list(dilations)
    return attrs


@_converts("Conv", "Conv1D", "Conv2D", "Conv3D")
def _conv(cx: _OpContext) -> None:
    x, w = cx.op.input[0], cx.op.input[1]
    attrs = _window(cx, x, filter_name=w)
    attrs["group"] = int(cx.arg("group", 1))
    cx.mark("global_pooling")
    if cx.arg("global_pooling", 0):
        raise cx.error("global_pooling is for pooling ops")
    cx.node("Conv", list(cx.op.input[:3]), [cx.op.output[0]], **attrs)


@_converts("ConvTranspose")
def _conv_transpose(cx: _OpContext) -> None:
    x, w = cx.op.input[0], cx.op.input[1]
    if int(cx.arg("legacy_pad", 0)) != 0:
        raise cx.unsupported("ConvTranspose with legacy_pad")
    attrs = _window(cx, x, filter_name=w)
    if "dilations" in attrs:
        raise cx.unsupported("ConvTranspose with dilation (Caffe2's ConvTranspose has none)")
    nd = len(attrs["kernel_shape"])
    adjs = _dims_arg(cx, "adjs", "adj", ["adj_h", "adj_w"], nd, 0)
    cx.mark("adjs", "adj", "adj_h", "adj_w")
    if adjs and any(adjs):
        attrs["output_padding"] = adjs
    attrs["group"] = int(cx.arg("group", 1))
    cx.node("ConvTranspose", list(cx.op.input[:3]), [cx.op.output[0]], **attrs)


def _global_pool(cx: _OpContext) -> bool:
    if not cx.arg("global_pooling", 0):
        return False
    _order(cx)
    # Caffe2 took stride 1, zero pads and dilation 1 with global pooling.
    for name in ("pad", "pad_t", "pad_l", "pad_b", "pad_r", "pads"):
        v = cx.arg(name)
        if v is not None and any(int(p) != 0 for p in (v if isinstance(v, list) else [v])):
            raise cx.error("global pooling with non-zero pads")
    for name in ("stride", "strides", "stride_h", "stride_w", "dilation", "dilations",
                 "dilation_h", "dilation_w"):
        v = cx.arg(name)
        if v is not None and any(int(p) != 1 for p in (v if isinstance(v, list) else [v])):
            raise cx.error("global pooling with a stride or dilation other than 1")
    cx.mark(*_WINDOW_ARGS)
    return True


@_converts("MaxPool", "MaxPool1D", "MaxPool2D", "MaxPool3D")
def _max_pool(cx: _OpContext) -> None:
    x = cx.op.input[0]
    if _global_pool(cx):
        cx.node("GlobalMaxPool", [x], [cx.op.output[0]])
        return
    cx.node("MaxPool", [x], [cx.op.output[0]], **_window(cx, x))


@_converts("AveragePool", "AveragePool1D", "AveragePool2D", "AveragePool3D")
def _average_pool(cx: _OpContext) -> None:
    x = cx.op.input[0]
    include = int(bool(cx.arg("count_include_pad", 0)))
    if _global_pool(cx):
        cx.node("GlobalAveragePool", [x], [cx.op.output[0]])
        return
    attrs = _window(cx, x)
    if "dilations" in attrs and cx.opset < 19:
        raise cx.unsupported("AveragePool with dilation needs opset 19")
    cx.node("AveragePool", [x], [cx.op.output[0]], count_include_pad=include, **attrs)


@_converts("LpPool")
def _lp_pool(cx: _OpContext) -> None:
    x = cx.op.input[0]
    p = float(cx.arg("p", 2.0))
    if p != int(p):
        raise cx.unsupported(f"LpPool with p = {p}: ONNX's p is an integer")
    if _global_pool(cx):
        # A window of the whole image (ONNX's reference has no GlobalLpPool).
        spatial = cx.need_shape(x)[2:]
        cx.node("LpPool", [x], [cx.op.output[0]], p=int(p), kernel_shape=spatial,
                strides=[1] * len(spatial))
        return
    cx.node("LpPool", [x], [cx.op.output[0]], p=int(p), **_window(cx, x))


@_converts("SpatialBN")
def _spatial_bn(cx: _OpContext) -> None:
    _order(cx)
    if not cx.arg("is_test", 0) and len(cx.op.output) > 1:
        raise cx.unsupported("SpatialBN in training mode (is_test=0): export a test-mode net")
    if int(cx.arg("num_batches", 1)) != 1:
        raise cx.unsupported("SpatialBN with num_batches")
    cx.node("BatchNormalization", list(cx.op.input[:5]), [cx.op.output[0]],
            epsilon=float(cx.arg("epsilon", 1e-5)), momentum=float(cx.arg("momentum", 0.9)))


def _flatten_to_2d(cx: _OpContext, name: str, axis: int) -> str:
    shape = cx.shape(name)
    if shape is not None and len(shape) == 2 and axis == 1:
        return name
    return cx.tmp("Flatten", [name], "flat", axis=axis)


@_converts("FC", "FCTransposed")
def _fc(cx: _OpContext) -> None:
    x, w, b = cx.op.input[0], cx.op.input[1], cx.op.input[2]
    axis, axis_w = int(cx.arg("axis", 1)), int(cx.arg("axis_w", 1))
    xs = cx.need_shape(x)
    if axis < 0:
        axis += len(xs)
    a = _flatten_to_2d(cx, x, axis)
    bw = _flatten_to_2d(cx, w, axis_w)
    out = cx.op.output[0]
    if axis == 1:
        cx.node("Gemm", [a, bw, b], [out], transB=int(cx.op.type == "FC"))
        return
    y = cx.tmp("Gemm", [a, bw, b], "gemm", transB=int(cx.op.type == "FC"))
    n = cx.need_shape(out)[-1] if cx.shape(out) else None
    if n is None:
        raise cx.error("the output width is unknown", blob=out)
    cx.node("Reshape", [y, cx.ints(xs[:axis] + [n], "shape")], [out])


def _legacy_broadcast(cx: _OpContext, a: str, b: str) -> str:
    """B reshaped so that numpy broadcasting lines it up with A at `axis`,
    as Caffe2's broadcast=1 did."""
    if not cx.arg("broadcast", 0):
        cx.mark("axis")  # numpy broadcasting: Caffe2 ignored axis without broadcast
        return b
    ra, sb = cx.rank(a), cx.need_shape(b)
    rb = len(sb)
    axis = int(cx.arg("axis", -1))
    if axis == -1:
        axis = ra - rb
    if axis < 0 or axis + rb > ra:
        raise cx.error(f"B's {rb} dims do not fit in A's {ra} from axis {axis}", blob=b)
    trailing = ra - axis - rb
    if trailing == 0:
        return b
    value = cx.value(b)
    if value is not None and cx.conv.readers.get(b) == 1 and b not in cx.conv.external_outputs:
        # An initializer only this op reads: reshaped in place, keeping its name.
        cx.conv.init_values[b] = value.reshape(list(value.shape) + [1] * trailing)
        return b
    return cx.tmp("Unsqueeze", [b, cx.ints(range(rb, rb + trailing), "axes")], "bcast")


_BINARY = {"Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div",
           "EQ": "Equal", "LT": "Less", "LE": "LessOrEqual", "GT": "Greater",
           "GE": "GreaterOrEqual", "And": "And", "Or": "Or", "Xor": "Xor"}


@_converts(*_BINARY, "NE")
def _binary(cx: _OpContext) -> None:
    a, b = cx.op.input[0], cx.op.input[1]
    b = _legacy_broadcast(cx, a, b)
    if cx.op.type == "NE":
        eq = cx.tmp("Equal", [a, b], "eq")
        cx.node("Not", [eq], [cx.op.output[0]])
        return
    cx.node(_BINARY[cx.op.type], [a, b], [cx.op.output[0]])


@_converts("Pow")
def _pow(cx: _OpContext) -> None:
    x = cx.op.input[0]
    if len(cx.op.input) == 1:
        e = cx.arg("exponent")
        if e is None:
            raise cx.error("Pow needs the exponent argument or a second input")
        dt = NUMPY_OF_ONNX[cx.dtype(x)]
        cx.node("Pow", [x, cx.const(np.array(e, dtype=dt), "exponent")], [cx.op.output[0]])
        return
    b = _legacy_broadcast(cx, x, cx.op.input[1])
    cx.node("Pow", [x, b], [cx.op.output[0]])


_UNARY = {
    "Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log",
    "Sqrt": "Sqrt", "Abs": "Abs", "Negative": "Neg", "Reciprocal": "Reciprocal",
    "Sign": "Sign", "Sin": "Sin", "Cos": "Cos", "Tan": "Tan", "Asin": "Asin",
    "Acos": "Acos", "Atan": "Atan", "Sinh": "Sinh", "Cosh": "Cosh", "Erf": "Erf",
    "Softplus": "Softplus", "Softsign": "Softsign", "Not": "Not",
    "Copy": "Identity", "Alias": "Identity", "EnsureCPUOutput": "Identity",
}


@_converts(*_UNARY)
def _unary(cx: _OpContext) -> None:
    cx.node(_UNARY[cx.op.type], [cx.op.input[0]], [cx.op.output[0]])


@_converts("CopyOnDeviceLike")
def _copy_like(cx: _OpContext) -> None:
    cx.node("Identity", [cx.op.input[0]], [cx.op.output[0]])


@_converts("LeakyRelu")
def _leaky_relu(cx):
    cx.node("LeakyRelu", [cx.op.input[0]], [cx.op.output[0]], alpha=float(cx.arg("alpha", 0.01)))


@_converts("Elu")
def _elu(cx):
    cx.node("Elu", [cx.op.input[0]], [cx.op.output[0]], alpha=float(cx.arg("alpha", 1.0)))


@_converts("Selu")
def _selu(cx):
    cx.node("Selu", [cx.op.input[0]], [cx.op.output[0]],
            alpha=float(cx.arg("alpha", 1.6732632423543772)),
            gamma=float(cx.arg("scale", 1.0507009873554805)))


@_converts("HardSigmoid")
def _hard_sigmoid(cx):
    cx.node("HardSigmoid", [cx.op.input[0]], [cx.op.output[0]],
            alpha=float(cx.arg("alpha", 0.2)), beta=float(cx.arg("beta", 0.5)))


@_converts("ThresholdedRelu")
def _thresholded_relu(cx):
    cx.node("ThresholdedRelu", [cx.op.input[0]], [cx.op.output[0]],
            alpha=float(cx.arg("alpha", 1.0)))


@_converts("ReluN")
def _relu_n(cx):
    x = cx.op.input[0]
    dt = NUMPY_OF_ONNX[cx.dtype(x)]
    cx.node("Clip", [x, cx.const(np.array(0, dt), "min"),
                     cx.const(np.array(cx.arg("n", 6.0), dt), "max")], [cx.op.output[0]])


@_converts("PRelu")
def _prelu(cx):
    _order(cx)
    x, slope = cx.op.input[0], cx.op.input[1]
    r = cx.rank(x)
    ss = cx.need_shape(slope)
    if len(ss) == 1 and ss[0] != 1 and r > 2:
        value = cx.value(slope)
        if value is not None:
            slope = cx.const(value.reshape([ss[0]] + [1] * (r - 2)), slope + "_nchw")
        else:
            slope = cx.tmp("Unsqueeze", [slope, cx.ints(range(1, r - 1), "axes")], "slope")
    cx.node("PRelu", [x, slope], [cx.op.output[0]])


@_converts("Sqr")
def _sqr(cx):
    x = cx.op.input[0]
    cx.node("Mul", [x, x], [cx.op.output[0]])


@_converts("Cube")
def _cube(cx):
    x = cx.op.input[0]
    cx.node("Mul", [cx.tmp("Mul", [x, x], "sqr"), x], [cx.op.output[0]])


@_converts("Rsqrt")
def _rsqrt(cx):
    cx.node("Reciprocal", [cx.tmp("Sqrt", [cx.op.input[0]], "sqrt")], [cx.op.output[0]])


@_converts("Swish")
def _swish(cx):
    x = cx.op.input[0]
    cx.node("Mul", [x, cx.tmp("Sigmoid", [x], "sigmoid")], [cx.op.output[0]])


@_converts("Mish")
def _mish(cx):
    x = cx.op.input[0]
    t = cx.tmp("Tanh", [cx.tmp("Softplus", [x], "softplus")], "tanh")
    cx.node("Mul", [x, t], [cx.op.output[0]])


@_converts("Gelu")
def _gelu(cx):
    x = cx.op.input[0]
    fast = bool(cx.arg("fast_gelu", 0))
    if cx.opset >= 20:
        cx.node("Gelu", [x], [cx.op.output[0]], approximate="tanh" if fast else "none")
        return
    dt = NUMPY_OF_ONNX[cx.dtype(x)]

    def c(v, hint):
        return cx.const(np.array(v, dt), hint)
    if fast:
        x3 = cx.tmp("Mul", [cx.tmp("Mul", [x, x], "sqr"), x], "cube")
        inner = cx.tmp("Add", [x, cx.tmp("Mul", [x3, c(0.044715, "k")], "k")], "inner")
        t = cx.tmp("Tanh", [cx.tmp("Mul", [inner, c(np.sqrt(2 / np.pi), "k")], "scaled")], "tanh")
    else:
        t = cx.tmp("Erf", [cx.tmp("Mul", [x, c(1 / np.sqrt(2), "k")], "scaled")], "erf")
    one_plus = cx.tmp("Add", [t, c(1.0, "one")], "one_plus")
    half_x = cx.tmp("Mul", [x, c(0.5, "half")], "half_x")
    cx.node("Mul", [half_x, one_plus], [cx.op.output[0]])


@_converts("Softmax")
def _softmax(cx):
    x = cx.op.input[0]
    r = cx.rank(x)
    axis = int(cx.arg("axis", 1))
    if axis < 0:
        axis += r
    if axis == r - 1:
        cx.node("Softmax", [x], [cx.op.output[0]], axis=axis)
        return
    flat = cx.tmp("Flatten", [x], "flat", axis=axis)
    sm = cx.tmp("Softmax", [flat], "softmax", axis=1)
    cx.node("Reshape", [sm, cx.tmp("Shape", [x], "shape")], [cx.op.output[0]])


@_converts("Dropout")
def _dropout(cx):
    if not cx.arg("is_test", 0):
        raise cx.unsupported("Dropout in training mode (is_test=0): export a test-mode net")
    if len(cx.op.output) > 1 and cx.used(cx.op.output[1]):
        raise cx.unsupported("Dropout's mask output (Caffe2 does not write it in test mode)",
                             blob=cx.op.output[1])
    ratio = cx.const(np.array(cx.arg("ratio", 0.5), np.float32), "ratio")
    cx.node("Dropout", [cx.op.input[0], ratio], [cx.op.output[0]])


def _axis_or_order(cx) -> int:
    if cx.has("axis"):
        cx.mark("order")
        return int(cx.arg("axis"))
    order = cx.arg("order", "NCHW")
    if order not in ("NCHW", "NHWC"):
        raise cx.error(f"unknown order {order!r}")
    return 1 if order == "NCHW" else 3


@_converts("Concat", "DepthConcat")
def _concat(cx):
    axis = _axis_or_order(cx)
    add_axis = bool(cx.arg("add_axis", 0))
    inputs = list(cx.op.input)
    if add_axis:
        r = cx.rank(inputs[0])
        if axis < 0:
            axis += r + 1
        axes = cx.ints([axis], "axes")
        inputs = [cx.tmp("Unsqueeze", [i, axes], "unsq") for i in inputs]
    cx.node("Concat", inputs, [cx.op.output[0]], axis=axis)
    if len(cx.op.output) > 1 and cx.used(cx.op.output[1]):
        if add_axis:
            sizes = [1] * len(inputs)
        else:
            sizes = []
            for i in cx.op.input:
                s = cx.need_shape(i)
                sizes.append(s[axis if axis >= 0 else axis + len(s)])
        # An initializer: a later op (a Split) can read its value.
        cx.conv.init_values[cx.op.output[1]] = np.array(sizes, np.int32)
        cx.conv.made_values.add(cx.op.output[1])


@_converts("Split", "DepthSplit")
def _split(cx):
    axis = _axis_or_order(cx)
    x = cx.op.input[0]
    add_axis = bool(cx.arg("add_axis", 0))
    split = cx.arg("split")
    if len(cx.op.input) > 1:
        v = cx.value(cx.op.input[1])
        if v is None:
            raise cx.unsupported("Split with sizes from a computed input", blob=cx.op.input[1])
        split = [int(s) for s in v.reshape(-1)]
    inputs = [x]
    if split is not None:
        inputs.append(cx.ints(split, "split"))
    elif cx.opset >= 18:
        n = cx.need_shape(x)[axis]
        k = len(cx.op.output)
        if n % k:
            raise cx.error(f"dim {axis} ({n}) does not split into {k} equal parts", blob=x)
        inputs.append(cx.ints([n // k] * k, "split"))
    outs = list(cx.op.output)
    if add_axis:
        tmp = [cx.fresh("split") for _ in outs]
        cx.node("Split", inputs, tmp, axis=axis)
        axes = cx.ints([axis], "axes")
        for t, o in zip(tmp, outs):
            cx.node("Squeeze", [t, axes], [o])
        return
    cx.node("Split", inputs, outs, axis=axis)


@_converts("Reshape")
def _reshape(cx):
    x = cx.op.input[0]
    if len(cx.op.input) > 1:
        if cx.has("shape"):
            raise cx.error("give the shape as the argument or as input 1, not both")
        v = cx.value(cx.op.input[1])
        if v is not None:
            shape = cx.ints(v.reshape(-1), "shape")
        else:
            shape = cx.op.input[1]
            if cx.dtype(shape) != TensorProto.INT64:
                shape = cx.tmp("Cast", [shape], "shape", to=TensorProto.INT64)
    else:
        if not cx.has("shape"):
            raise cx.error("Reshape needs the shape argument or input 1")
        shape = cx.ints(cx.arg("shape"), "shape")
    cx.node("Reshape", [x, shape], [cx.op.output[0]])
    if len(cx.op.output) > 1 and cx.used(cx.op.output[1]):
        cx.node("Shape", [x], [cx.op.output[1]])


@_converts("Flatten")
def _flatten(cx):
    cx.node("Flatten", [cx.op.input[0]], [cx.op.output[0]], axis=int(cx.arg("axis", 1)))


@_converts("FlattenToVec")
def _flatten_to_vec(cx):
    cx.node("Reshape", [cx.op.input[0], cx.ints([-1], "shape")], [cx.op.output[0]])


def _caffe2_index_to_onnx(i: int) -> int:
    """Caffe2's Slice takes a negative index i as dim + 1 + i; ONNX as dim + i."""
    if i >= 0:
        return i
    return i + 1 if i + 1 < 0 else _INT64_MAX


@_converts("Slice")
def _slice(cx):
    x = cx.op.input[0]
    if len(cx.op.input) > 1:
        if len(cx.op.input) != 3:
            raise cx.error("Slice takes starts and ends as inputs 1 and 2 together")
        vs, ve = cx.value(cx.op.input[1]), cx.value(cx.op.input[2])
        if vs is None or ve is None:
            raise cx.unsupported("Slice with starts/ends computed by the net",
                                 blob=cx.op.input[1] if vs is None else cx.op.input[2])
        starts, ends = [int(v) for v in vs.reshape(-1)], [int(v) for v in ve.reshape(-1)]
    else:
        starts, ends = cx.arg("starts"), cx.arg("ends")
        if starts is None or ends is None:
            raise cx.error("Slice needs starts and ends")
    if len(starts) != len(ends):
        raise cx.error(f"starts has {len(starts)} values, ends {len(ends)}")
    axes, s_on, e_on = [], [], []
    for d, (s, e) in enumerate(zip(starts, ends)):
        if s == 0 and e == -1:
            continue
        axes.append(d)
        s_on.append(_caffe2_index_to_onnx(int(s)))
        e_on.append(_caffe2_index_to_onnx(int(e)))
    if not axes:
        cx.node("Identity", [x], [cx.op.output[0]])
        return
    cx.node("Slice", [x, cx.ints(s_on, "starts"), cx.ints(e_on, "ends"), cx.ints(axes, "axes")],
            [cx.op.output[0]])


@_converts("Transpose")
def _transpose(cx):
    axes = cx.arg("axes")
    cx.node("Transpose", [cx.op.input[0]], [cx.op.output[0]],
            perm=[int(a) for a in axes] if axes else None)


@_converts("Squeeze")
def _squeeze(cx):
    dims = cx.arg("dims", [])
    cx.node("Squeeze", [cx.op.input[0], cx.ints(dims, "axes")], [cx.op.output[0]])


@_converts("ExpandDims")
def _expand_dims(cx):
    dims = cx.arg("dims")
    if not dims:
        raise cx.error("ExpandDims needs dims")
    cx.node("Unsqueeze", [cx.op.input[0], cx.ints(dims, "axes")], [cx.op.output[0]])


@_converts("Sum", "Mean", "Max", "Min")
def _variadic(cx):
    cx.node(cx.op.type, list(cx.op.input), [cx.op.output[0]])


@_converts("LRN")
def _lrn(cx):
    _order(cx)
    if len(cx.op.output) > 1 and cx.used(cx.op.output[1]):
        raise cx.unsupported("LRN's scale output (ONNX's LRN has one output)",
                             blob=cx.op.output[1])
    size = cx.arg("size")
    if size is None:
        raise cx.error("LRN needs size")
    cx.node("LRN", [cx.op.input[0]], [cx.op.output[0]], size=int(size),
            alpha=float(cx.arg("alpha", 0.0)), beta=float(cx.arg("beta", 0.0)),
            bias=float(cx.arg("bias", 1.0)))


@_converts("MatMul")
def _matmul(cx):
    a, b = cx.op.input[0], cx.op.input[1]
    aa = _flatten_to_2d(cx, a, int(cx.arg("axis_a", 1)))
    bb = _flatten_to_2d(cx, b, int(cx.arg("axis_b", 1)))
    cx.node("Gemm", [aa, bb], [cx.op.output[0]], transA=int(cx.arg("trans_a", 0)),
            transB=int(cx.arg("trans_b", 0)))


@_converts("BatchMatMul")
def _batch_matmul(cx):
    cx.mark("broadcast")
    ins = []
    for name, flag in ((cx.op.input[0], "trans_a"), (cx.op.input[1], "trans_b")):
        if cx.arg(flag, 0):
            r = cx.rank(name)
            if r >= 2:
                perm = list(range(r - 2)) + [r - 1, r - 2]
                name = cx.tmp("Transpose", [name], "t", perm=perm)
        ins.append(name)
    cx.node("MatMul", ins, [cx.op.output[0]])


_C2_TYPE_BY_NAME = {n: v for n, v in caffe2_pb2.TensorProto.DataType.items()}


@_converts("Cast")
def _cast(cx):
    to = cx.arg("to")
    cx.mark("from_type")
    if isinstance(to, str):
        if to.upper() not in _C2_TYPE_BY_NAME:
            raise cx.error(f"unknown dtype {to!r}")
        to = _C2_TYPE_BY_NAME[to.upper()]
    if to not in C2_TO_ONNX_TYPE:
        raise cx.unsupported(f"Cast to Caffe2 type {to}")
    cx.node("Cast", [cx.op.input[0]], [cx.op.output[0]], to=C2_TO_ONNX_TYPE[to])


@_converts("Clip")
def _clip(cx):
    x = cx.op.input[0]
    dt = NUMPY_OF_ONNX[cx.dtype(x)]
    lo, hi = cx.arg("min"), cx.arg("max")
    ins = [x, cx.const(np.array(lo, dt), "min") if lo is not None else "",
           cx.const(np.array(hi, dt), "max") if hi is not None else ""]
    while ins[-1] == "":
        ins.pop()
    cx.node("Clip", ins, [cx.op.output[0]])


def _fill_dtype(cx) -> np.dtype:
    if cx.has("dtype"):
        t = int(cx.arg("dtype"))
        if t not in C2_TO_ONNX_TYPE:
            raise cx.unsupported(f"fill of Caffe2 dtype {t}")
        return NUMPY_OF_ONNX[C2_TO_ONNX_TYPE[t]]
    v = next((a for a in cx.op.arg if a.name == "value"), None)
    if v is not None and v.HasField("i"):
        return np.dtype(np.int64)
    return np.dtype(np.float32)


@_converts("ConstantFill")
def _constant_fill(cx):
    dt = _fill_dtype(cx)
    value = np.array(cx.arg("value", 0), dtype=dt)
    out = cx.op.output[0]
    if len(cx.op.input) == 0:
        arr = np.full([int(d) for d in cx.arg("shape", [])], value, dtype=dt)
        cx.node("Constant", [], [out], value=numpy_helper.from_array(arr, "value"))
        return
    if len(cx.op.input) > 1:
        raise cx.unsupported("ConstantFill with a value input")
    x = cx.op.input[0]
    if cx.arg("input_as_shape", 0):
        shape = x
        if cx.dtype(x) != TensorProto.INT64:
            shape = cx.tmp("Cast", [x], "shape", to=TensorProto.INT64)
    else:
        shape = cx.tmp("Shape", [x], "shape")
    extra = cx.arg("extra_shape")
    if extra:
        shape = cx.tmp("Concat", [shape, cx.ints(extra, "extra")], "shape", axis=0)
    cx.node("ConstantOfShape", [shape], [out],
            value=numpy_helper.from_array(value.reshape([1]), "value"))


@_converts("GivenTensorFill", "GivenTensorDoubleFill", "GivenTensorIntFill",
           "GivenTensorInt64Fill", "GivenTensorBoolFill", "GivenTensorInt16Fill")
def _given_fill(cx):
    dt = {"GivenTensorFill": np.float32, "GivenTensorDoubleFill": np.float64,
          "GivenTensorIntFill": np.int32, "GivenTensorInt64Fill": np.int64,
          "GivenTensorBoolFill": np.bool_, "GivenTensorInt16Fill": np.int16}[cx.op.type]
    if cx.op.input:
        raise cx.unsupported(f"{cx.op.type} with an input")
    cx.mark("dtype")
    values = np.array(cx.arg("values", []), dtype=dt).reshape([int(d) for d in cx.arg("shape", [])])
    cx.node("Constant", [], [cx.op.output[0]], value=numpy_helper.from_array(values, "value"))


_REDUCE = {"ReduceMean": "ReduceMean", "ReduceSum": "ReduceSum", "ReduceMax": "ReduceMax",
           "ReduceMin": "ReduceMin", "ReduceL1": "ReduceL1", "ReduceL2": "ReduceL2"}


def _reduce_node(cx, onnx_type, x, out, axes, keepdims):
    if axes is not None and (onnx_type == "ReduceSum" or cx.opset >= 18):
        cx.node(onnx_type, [x, cx.ints(axes, "axes")], [out], keepdims=keepdims)
    else:
        cx.node(onnx_type, [x], [out], keepdims=keepdims, axes=axes)


@_converts(*_REDUCE)
def _reduce(cx):
    axes = cx.arg("axes")
    _reduce_node(cx, _REDUCE[cx.op.type], cx.op.input[0], cx.op.output[0],
                 [int(a) for a in axes] if axes is not None else None,
                 int(cx.arg("keepdims", 1)))


@_converts("Moments")
def _moments(cx):
    x = cx.op.input[0]
    axes = cx.arg("axes")
    axes = [int(a) for a in axes] if axes is not None else None
    keep = int(cx.arg("keepdims", 1))
    mean_k = cx.fresh("mean")
    _reduce_node(cx, "ReduceMean", x, mean_k if not keep else cx.op.output[0], axes, 1)
    if keep:
        mean_k = cx.op.output[0]
    d = cx.tmp("Sub", [x, mean_k], "centred")
    _reduce_node(cx, "ReduceMean", cx.tmp("Mul", [d, d], "sq"), cx.op.output[1], axes, keep)
    if not keep:
        _reduce_node(cx, "ReduceMean", x, cx.op.output[0], axes, 0)


@_converts("ArgMax", "ArgMin")
def _argmax(cx):
    cx.node(cx.op.type, [cx.op.input[0]], [cx.op.output[0]], axis=int(cx.arg("axis", -1)),
            keepdims=int(cx.arg("keepdims", 1)))


@_converts("Gather")
def _gather(cx):
    cx.mark("wrap_indices", "dense_gradient")
    if cx.arg("match_outer", 0):
        raise cx.unsupported("Gather with match_outer")
    cx.node("Gather", list(cx.op.input[:2]), [cx.op.output[0]], axis=int(cx.arg("axis", 0)))


@_converts("Tile")
def _tile(cx):
    x = cx.op.input[0]
    tiles, axis = cx.arg("tiles", 1), cx.arg("axis", 0)
    if len(cx.op.input) > 1:
        vals = [cx.value(n) for n in cx.op.input[1:]]
        if any(v is None for v in vals):
            raise cx.unsupported("Tile with tiles/axis computed by the net")
        tiles = int(vals[0].reshape(-1)[0])
        if len(vals) > 1:
            axis = int(vals[1].reshape(-1)[0])
    r = cx.rank(x)
    axis = int(axis) + (r if int(axis) < 0 else 0)
    reps = [1] * r
    reps[axis] = int(tiles)
    cx.node("Tile", [x, cx.ints(reps, "repeats")], [cx.op.output[0]])


@_converts("Where")
def _where(cx):
    if cx.arg("broadcast_on_rows", 0):
        raise cx.unsupported("Where with broadcast_on_rows")
    cx.node("Where", list(cx.op.input[:3]), [cx.op.output[0]])


@_converts("Shape")
def _shape(cx):
    axes = cx.arg("axes")
    if axes:
        s = cx.tmp("Shape", [cx.op.input[0]], "shape")
        cx.node("Gather", [s, cx.ints(axes, "axes")], [cx.op.output[0]], axis=0)
        return
    cx.node("Shape", [cx.op.input[0]], [cx.op.output[0]])


@_converts("Size")
def _size(cx):
    cx.node("Size", [cx.op.input[0]], [cx.op.output[0]])


@_converts("Scale")
def _scale(cx):
    x = cx.op.input[0]
    dt = NUMPY_OF_ONNX[cx.dtype(x)]
    cx.node("Mul", [x, cx.const(np.array(cx.arg("scale", 1.0), dt), "scale")], [cx.op.output[0]])


@_converts("Expand")
def _expand(cx):
    x, shape = cx.op.input[0], cx.op.input[1]
    v = cx.value(shape)
    if v is not None:
        shape = cx.ints(v.reshape(-1), "shape")
    elif cx.dtype(shape) != TensorProto.INT64:
        shape = cx.tmp("Cast", [shape], "shape", to=TensorProto.INT64)
    cx.node("Expand", [x, shape], [cx.op.output[0]])


@_converts("LayerNorm")
def _layer_norm(cx):
    x = cx.op.input[0]
    xs = cx.need_shape(x)
    r = len(xs)
    axis = int(cx.arg("axis", 1))
    axis += r if axis < 0 else 0
    eps = float(cx.arg("epsilon", 1e-5))
    dt = NUMPY_OF_ONNX[cx.dtype(x)]
    if cx.arg("elementwise_affine", 0):
        scale, bias = cx.op.input[1], cx.op.input[2]
    else:
        scale, bias = cx.const(np.ones(xs[axis:], dt), "ones"), ""
    outs = list(cx.op.output)
    want_mean = len(outs) > 1 and cx.used(outs[1])
    want_std = len(outs) > 2 and cx.used(outs[2])
    mean = cx.fresh("mean") if want_mean or want_std else None
    inv = cx.fresh("inv_std") if want_std else None
    node_outs = [outs[0]] + ([mean] if mean else []) + ([inv] if inv else [])
    cx.node("LayerNormalization", [x, scale] + ([bias] if bias else []), node_outs,
            axis=axis, epsilon=eps)
    stat_shape = cx.ints(xs[:axis] + [1], "shape")
    if want_mean:
        cx.node("Reshape", [mean, stat_shape], [outs[1]])
    if want_std:
        cx.node("Reshape", [cx.tmp("Reciprocal", [inv], "std"), stat_shape], [outs[2]])


@_converts("TopK")
def _topk(cx):
    x = cx.op.input[0]
    axis = int(cx.arg("axis", -1))
    k = int(cx.arg("k", -1))
    if k == -1:
        k = cx.need_shape(x)[axis]
    if len(cx.op.output) > 2 and cx.used(cx.op.output[2]):
        raise cx.unsupported("TopK's flattened-indices output", blob=cx.op.output[2])
    outs = list(cx.op.output[:2])
    if len(outs) == 1:
        outs.append(cx.fresh("indices"))
    cx.node("TopK", [x, cx.ints([k], "k")], outs, axis=axis, largest=1, sorted=1)


# ------------------------------------------------------------------ the API


def _ssa(net, init_names: set[str]) -> None:
    """Renames blobs written more than once (or written after being given as
    an input) so that each name has one producer, in place. The net's inputs
    keep their names; a blob that is an output of the net keeps its name on
    its last write (unless it is also an input); any other blob keeps its
    name on its first write. Other writes become ``name_N`` (the N-th)."""
    inputs = set(net.external_input) | set(init_names)
    outputs = set(net.external_output)
    writes: dict[str, int] = {}
    taken = set(inputs) | outputs
    for op in net.op:
        taken.update(op.input)
        for o in op.output:
            writes[o] = writes.get(o, 0) + 1
            taken.add(o)

    def fresh(base: str, j: int) -> str:
        cand = f"{base}_{j}"
        while cand in taken:
            cand += "_"
        taken.add(cand)
        return cand

    current = {name: name for name in inputs}
    count: dict[str, int] = {}
    for op in net.op:
        op.input[:] = [current.get(i, i) for i in op.input]
        renamed = []
        for o in op.output:
            j = count[o] = count.get(o, 0) + 1
            if o in inputs:
                name = fresh(o, j)
            elif o in outputs:
                name = o if j == writes[o] else fresh(o, j)
            else:
                name = o if j == 1 else fresh(o, j)
            current[o] = name
            renamed.append(name)
        op.output[:] = renamed
    net.external_output[:] = [current.get(o, o) for o in net.external_output]


class Caffe2Frontend:
    """Caffe2's frontend class: the conversions as classmethods."""

    #: The ONNX opset (default domain) of the models made.
    target_opset_version = 17

    @classmethod
    def supported_ops(cls) -> list[str]:
        """The Caffe2 op types with a conversion."""
        return sorted(_CONVERTERS)

    @classmethod
    def caffe2_init_net_to_initializer(cls, init_net) -> list:
        """The blobs the init net makes, as ONNX TensorProtos (the net is
        run in a private workspace)."""
        init = _as_netdef(init_net, "init net")
        return [numpy_helper.from_array(v, n) for n, v in _run_init_net(init).items()]

    @classmethod
    def ssa_rewrite(cls, net, init_net=None, value_info=None) -> None:
        """Renames the blobs of ``net`` (a NetDef, in place) to single
        assignment, as the conversion does."""
        init = _as_netdef(init_net, "init net")
        names = set()
        if init is not None:
            for op in init.op:
                names.update(op.output)
        _ssa(net, names)

    @classmethod
    def caffe2_net_to_onnx_graph(cls, predict_net, init_net=None, value_info=None,
                                 opset_version: int | None = None):
        graph, _ = cls._convert(predict_net, init_net, value_info,
                                opset_version or cls.target_opset_version)
        return graph

    @classmethod
    def caffe2_net_to_onnx_model(cls, predict_net, init_net=None, value_info=None,
                                 opset_version: int | None = None, check: bool = True):
        opset = opset_version or cls.target_opset_version
        graph, _ = cls._convert(predict_net, init_net, value_info, opset)
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)],
            producer_name="ferrocaffe", producer_version=_core.__version__)
        model.ir_version = _ir_version_for(opset)
        if check:
            checker.check_model(model)
        return model

    @classmethod
    def _convert(cls, predict_net, init_net, value_info, opset: int):
        if not onnx.defs.onnx_opset_version() >= opset >= 13:
            raise errors.InvalidArgumentError(
                f"opset {opset} is not supported: give 13 to {onnx.defs.onnx_opset_version()}")
        pred = _as_netdef(predict_net, "predict net")
        init = _as_netdef(init_net, "init net")
        net_name = pred.name or "predict_net"
        if value_info is None:
            value_info = {}
        if not isinstance(value_info, dict):
            raise errors.InvalidArgumentError(
                "value_info must be a dict: name -> (ONNX element type, shape)")
        vi = {str(k): _value_info_entry(str(k), v, net_name) for k, v in value_info.items()}

        # Fills in the init net of blobs that value_info describes are
        # stand-ins for the real inputs (Caffe2 dropped them too).
        if init is not None:
            kept = [op for op in init.op if not (len(op.output) == 1 and op.output[0] in vi)]
            del init.op[:]
            init.op.extend(kept)
            init.external_output[:] = [o for o in init.external_output if o not in vi]
        init_values = _run_init_net(init) if init is not None else {}

        # The graph's inputs: the net's external inputs that no initializer
        # gives and that some op reads or the net outputs (a declared input
        # nothing uses, like a data queue left in a deploy net, is left out).
        read = set(pred.external_output)
        for op in pred.op:
            read.update(op.input)
        inputs = [n for n in pred.external_input if n not in init_values and n in read]
        missing = [n for n in inputs if n not in vi]
        if missing:
            raise errors.InvalidArgumentError(
                "no value_info (element type and shape) for the input(s) "
                f"{', '.join(repr(m) for m in missing)} of the predict net" + where(net=net_name),
                net=net_name, blob=missing[0])

        # An op without conversion is refused before anything runs.
        for i, op in enumerate(pred.op):
            if op.type not in _CONVERTERS:
                raise UnsupportedOperatorError(
                    f"Caffe2 op '{op.type}' has no ONNX conversion" + where(op.type, i, net_name),
                    op=op.type, op_index=i, net=net_name)
        original = caffe2_pb2.NetDef()
        original.CopyFrom(pred)
        _ssa(pred, set(init_values))
        shapes = _shapes(original, pred, init_values, vi)

        conv = _NetConverter(pred, opset, shapes, init_values)
        conv.net_name = net_name
        nodes = []
        for i, op in enumerate(pred.op):
            nodes.extend(conv.convert_op(op, i))

        read = {i for n in nodes for i in n.input} | set(pred.external_output)
        for name in conv.made_values - read:
            del init_values[name]
        produced = set(init_values) | set(inputs)
        for n in nodes:
            produced.update(n.output)
        outputs = []
        for name in pred.external_output:
            if name not in produced:
                warnings.warn(f"output '{name}' of net '{net_name}' is made by no op, "
                              "initializer or input: left out of the ONNX graph", stacklevel=3)
                continue
            outputs.append(_tensor_value_info(name, shapes.get(name), net_name))
        graph = helper.make_graph(
            nodes, net_name,
            [helper.make_tensor_value_info(n, vi[n][0], vi[n][1]) for n in inputs],
            outputs,
            initializer=[numpy_helper.from_array(v, n) for n, v in init_values.items()]
            + conv.extra_initializers)
        return graph, pred


def _ir_version_for(opset: int) -> int:
    """The lowest IR version that carries the opset (older runtimes read it)."""
    best = None
    for _release, ir, op, _ml, *_ in helper.VERSION_TABLE:
        if op >= opset and (best is None or ir < best):
            best = ir
    return best or onnx.IR_VERSION


def _tensor_value_info(name, shape, net_name):
    if shape is None:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
    dims, c2type = shape
    if c2type not in C2_TO_ONNX_TYPE:
        raise ConversionError(f"output '{name}' has Caffe2 type {c2type}, which ONNX lacks"
                              + where(net=net_name, blob=name), net=net_name, blob=name)
    return helper.make_tensor_value_info(name, C2_TO_ONNX_TYPE[c2type], list(dims))


def _run_init_net(init) -> dict[str, np.ndarray]:
    """{blob: value} of every blob the init net's ops write, in order."""
    if init is None:
        return {}
    ws = workspace.Workspace()
    net = caffe2_pb2.NetDef()
    net.CopyFrom(init)
    net.name = net.name or "init_net"
    ws._core.run_net_once(net.SerializeToString())
    out: dict[str, np.ndarray] = {}
    for op in init.op:
        for name in op.output:
            value = ws.fetch_blob(name)
            if not isinstance(value, np.ndarray):
                raise ConversionError(
                    f"init net blob '{name}' is not a tensor ({type(value).__name__}): "
                    "it cannot be an initializer" + where(op.type, None, net.name, name),
                    op=op.type, net=net.name, blob=name)
            out[name] = value
    return out


def _shapes(original, pred, init_values, vi) -> dict:
    """{blob: (dims, Caffe2 type)} for every blob of the SSA net `pred`:
    inferred, else read from one run of the `original` net (before the
    renaming: ops that update in place keep their form) on random inputs
    of the given shapes, each op's outputs recorded under their SSA names."""
    known: dict[str, Any] = {}
    for name, v in init_values.items():
        known[name] = (list(v.shape), _caffe2_type_of(v))
    for name, (t, dims) in vi.items():
        known[name] = (list(dims), ONNX_TO_C2_TYPE[t])
    try:
        inferred = _core.infer_shapes([pred.SerializeToString()], known)
    except errors.FerrocaffeError:
        inferred = {}  # the run below reports what is wrong, naming the op
    shapes = {n: (list(s[0]), s[1]) for n, s in inferred.items() if s is not None}
    for name, s in known.items():
        shapes.setdefault(name, s)
    needed = set(pred.external_output)
    for op in pred.op:
        needed.update(op.input)
    if all(n in shapes for n in needed if n):
        return shapes
    # Some op has no shape inference: run the net once, as Caffe2 did.
    ws = workspace.Workspace()
    rng = np.random.default_rng(0)
    for name, v in init_values.items():
        ws.feed_blob(name, v)
    for name in pred.external_input:
        if name in init_values or name not in vi:
            continue
        t, dims = vi[name]
        dt = NUMPY_OF_ONNX[t]
        if dt.kind == "f":
            ws.feed_blob(name, rng.standard_normal(dims).astype(dt))
        elif dt.kind == "b":
            ws.feed_blob(name, np.zeros(dims, dt))
        else:
            ws.feed_blob(name, np.zeros(dims, dt))
    net_name = pred.name or "predict_net"
    for i, (op, renamed) in enumerate(zip(original.op, pred.op)):
        try:
            ws._core.run_operator_once(op.SerializeToString())
        except errors.FerrocaffeError as e:
            # Named as a run of the net names it (the op ran on its own).
            msg = str(e).replace(f"[op #0 '{op.type}', net ''", f"[op #{i} '{op.type}', net '{net_name}'")
            raise type(e)(msg, op=op.type, op_index=i, net=net_name, blob=e.blob) from None
        for name, ssa_name in zip(op.output, renamed.output):
            if ssa_name in shapes or not ws.has_blob(name):
                continue
            v = ws.fetch_blob(name)
            if isinstance(v, np.ndarray):
                shapes[ssa_name] = (list(v.shape), _caffe2_type_of(v))
    return shapes


def _caffe2_type_of(v: np.ndarray) -> int:
    t = ONNX_OF_NUMPY.get(v.dtype)
    if t is None:
        raise ConversionError(f"numpy dtype {v.dtype} has no ONNX type")
    return ONNX_TO_C2_TYPE[t]


caffe2_net_to_onnx_graph = Caffe2Frontend.caffe2_net_to_onnx_graph
caffe2_net_to_onnx_model = Caffe2Frontend.caffe2_net_to_onnx_model
caffe2_init_net_to_initializer = Caffe2Frontend.caffe2_init_net_to_initializer
ssa_rewrite = Caffe2Frontend.ssa_rewrite
