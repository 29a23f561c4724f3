"""ferrocaffe.onnx.frontend: Caffe2 nets to ONNX models.

Each conversion is checked by running the Caffe2 op on ferrocaffe and the
exported model on onnx's ReferenceEvaluator (an independent
implementation of ONNX's semantics): the two must agree. Where the
conversion carries a rule of its own (legacy pads, legacy broadcasting,
Caffe2's negative Slice ends, Concat's split info), the expected values
are also written here in numpy."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import onnx  # noqa: E402  (the test extra installs it)

from _onnx_nets import (  # noqa: E402
    FLOAT, export, init_net, netdef, op, run_caffe2, run_reference, value_info,
)
from _support import PKG_PARENT  # noqa: E402

from ferrocaffe import errors  # noqa: E402
from ferrocaffe.onnx import frontend  # noqa: E402

R = np.random.default_rng(1234)


def f32(*shape, low=-2.0, high=2.0):
    return R.uniform(low, high, shape).astype(np.float32)


def case(op_type, inputs, params=None, outputs=("y",), **args):
    """(op_type, ordered input names, feeds, params, outputs, args)."""
    params = params or {}
    names = list(inputs) + list(params)
    return (op_type, names, dict(inputs), dict(params), list(outputs), args)


X4 = f32(2, 4, 7, 7)
CASES = {
    "conv": case("Conv", {"x": X4}, {"w": f32(6, 4, 3, 3), "b": f32(6)}, kernel=3, pad=1),
    "conv_stride_hw": case("Conv", {"x": X4}, {"w": f32(3, 4, 3, 2), "b": f32(3)},
                           kernel_h=3, kernel_w=2, stride_h=2, stride_w=1, pad_t=1, pad_l=0,
                           pad_b=0, pad_r=1),
    "conv_group_dilation_nobias": case("Conv", {"x": X4}, {"w": f32(6, 2, 3, 3)}, kernel=3,
                                       group=2, dilation=2, pad=2),
    "conv_kernel_from_filter": case("Conv", {"x": X4}, {"w": f32(2, 4, 5, 5), "b": f32(2)}),
    "conv_legacy_valid": case("Conv", {"x": X4}, {"w": f32(2, 4, 3, 3), "b": f32(2)},
                              kernel=3, stride=2, legacy_pad=1),
    "conv_legacy_same": case("Conv", {"x": X4}, {"w": f32(2, 4, 4, 4), "b": f32(2)},
                             kernel=4, stride=2, legacy_pad=2),
    "conv_1d": case("Conv", {"x": f32(2, 3, 9)}, {"w": f32(4, 3, 3), "b": f32(4)},
                    kernels=[3], strides=[2], pads=[1, 0]),
    "conv_3d": case("Conv3D", {"x": f32(1, 2, 5, 5, 5)}, {"w": f32(3, 2, 2, 2, 2), "b": f32(3)},
                    kernels=[2, 2, 2]),
    "conv_transpose": case("ConvTranspose", {"x": f32(1, 3, 4, 4)},
                           {"w": f32(3, 2, 3, 3), "b": f32(2)}, kernel=3, stride=2, pad=1, adj=1),
    "max_pool": case("MaxPool", {"x": X4}, kernel=3, stride=2),
    "max_pool_legacy_caffe": case("MaxPool", {"x": f32(1, 2, 8, 8)}, kernel=3, stride=2, pad=1,
                                  legacy_pad=3),
    "max_pool_global": case("MaxPool", {"x": X4}, global_pooling=1),
    "avg_pool_pads": case("AveragePool", {"x": X4}, kernel=3, stride=2, pad=1),
    "avg_pool_include_pad": case("AveragePool", {"x": X4}, kernel=3, stride=2, pad=1,
                                 count_include_pad=1),
    "avg_pool_legacy_caffe": case("AveragePool", {"x": f32(1, 2, 6, 6)}, kernel=3, stride=2,
                                  legacy_pad=3),
    "avg_pool_global": case("AveragePool", {"x": X4}, global_pooling=1),
    "lp_pool": case("LpPool", {"x": X4}, kernel=2, stride=2, p=2.0),
    "lp_pool_global": case("LpPool", {"x": X4}, global_pooling=1, p=2.0),
    "spatial_bn": case("SpatialBN", {"x": X4}, {"s": f32(4), "b": f32(4), "m": f32(4),
                                                "v": f32(4, low=0.5, high=2)},
                       is_test=1, epsilon=1e-3),
    "fc_4d": case("FC", {"x": X4}, {"w": f32(5, 4 * 49), "b": f32(5)}),
    "fc_axis2": case("FC", {"x": f32(2, 3, 4)}, {"w": f32(5, 4), "b": f32(5)}, axis=2),
    "fc_axis_w": case("FC", {"x": f32(2, 6)}, {"w": f32(5, 1, 1, 6), "b": f32(5)}, axis_w=3),
    "fc_transposed": case("FCTransposed", {"x": f32(3, 6)}, {"w": f32(6, 4), "b": f32(4)}),
    "add_broadcast_axis": case("Add", {"x": X4}, {"c": f32(4)}, broadcast=1, axis=1),
    "mul_broadcast_input": case("Mul", {"x": X4, "c": f32(4, 7)}, broadcast=1, axis=1),
    "sub_numpy": case("Sub", {"x": f32(3, 4), "c": f32(4)}),
    "div": case("Div", {"x": f32(3, 4), "c": f32(3, 4, low=0.5, high=2)}),
    "eq": case("EQ", {"x": np.array([1, 2, 3], np.int32), "c": np.array([1, 0, 3], np.int32)}),
    "ne": case("NE", {"x": np.array([1, 2, 3], np.int64), "c": np.array([1, 0, 3], np.int64)}),
    "lt": case("LT", {"x": f32(3, 4), "c": f32(3, 4)}),
    "ge": case("GE", {"x": f32(3, 4), "c": f32(4)}),
    "and": case("And", {"x": np.array([True, False, True]), "c": np.array([True, True, False])}),
    "xor": case("Xor", {"x": np.array([True, False, True]), "c": np.array([True, True, False])}),
    "not": case("Not", {"x": np.array([True, False])}),
    "pow_exponent": case("Pow", {"x": f32(3, 4, low=0.1)}, exponent=2.5),
    "pow_inputs": case("Pow", {"x": f32(3, 4, low=0.1), "c": f32(4)}, broadcast=1),
    "softmax_4d": case("Softmax", {"x": X4}),
    "softmax_2d": case("Softmax", {"x": f32(3, 5)}),
    "softmax_last": case("Softmax", {"x": f32(2, 3, 5)}, axis=2),
    "dropout_test": case("Dropout", {"x": f32(3, 4)}, is_test=1, ratio=0.3),
    "reshape_arg": case("Reshape", {"x": X4}, outputs=("y", "old"), shape=[0, -1]),
    "reshape_input": case("Reshape", {"x": X4}, {"s": np.array([2, 4, 49], np.int64)},
                          outputs=("y", "old")),
    "flatten": case("Flatten", {"x": X4}, axis=2),
    "flatten_to_vec": case("FlattenToVec", {"x": X4}),
    "slice_negative": case("Slice", {"x": f32(5, 6, 7)}, starts=[1, 0, -3], ends=[-2, -1, -1]),
    "slice_inputs": case("Slice", {"x": f32(5, 6)}, {"st": np.array([0, 2], np.int32),
                                                     "en": np.array([3, -1], np.int32)}),
    "transpose": case("Transpose", {"x": X4}, axes=[0, 2, 3, 1]),
    "transpose_default": case("Transpose", {"x": f32(2, 3, 4)}),
    "squeeze": case("Squeeze", {"x": f32(2, 1, 3, 1)}, dims=[1, 3]),
    "expand_dims": case("ExpandDims", {"x": f32(2, 3)}, dims=[0, 3]),
    "sum3": case("Sum", {"a": f32(3, 4), "b": f32(3, 4), "c": f32(3, 4)}),
    "mean": case("Mean", {"a": f32(3, 4), "b": f32(3, 4)}),
    "max": case("Max", {"a": f32(3, 4), "b": f32(3, 4)}),
    "min": case("Min", {"a": f32(3, 4), "b": f32(3, 4)}),
    "lrn": case("LRN", {"x": X4}, size=3, alpha=0.5, beta=0.75, bias=2.0),
    "matmul": case("MatMul", {"a": f32(3, 4), "b": f32(5, 4)}, trans_b=1),
    "batch_matmul": case("BatchMatMul", {"a": f32(2, 4, 3), "b": f32(2, 4, 5)}, trans_a=1),
    "cast_int": case("Cast", {"x": f32(3, 4)}, to=2),
    "cast_name": case("Cast", {"x": np.array([1, 0, 3], np.int32)}, to="BOOL"),
    "clip": case("Clip", {"x": f32(3, 4)}, min=-0.5, max=0.7),
    "clip_min_only": case("Clip", {"x": f32(3, 4)}, min=-0.5),
    "reduce_mean": case("ReduceMean", {"x": X4}, axes=[2, 3], keepdims=0),
    "reduce_sum": case("ReduceSum", {"x": X4}, axes=[1], keepdims=1),
    "reduce_max_all": case("ReduceMax", {"x": f32(3, 4)}, keepdims=0),
    "reduce_l2": case("ReduceL2", {"x": f32(3, 4)}, axes=[0], keepdims=0),
    "moments": case("Moments", {"x": f32(3, 4)}, outputs=("m", "v"), axes=[1]),
    "argmax": case("ArgMax", {"x": f32(3, 4)}, axis=1, keepdims=0),
    "gather": case("Gather", {"x": f32(5, 3), "i": np.array([[0, 4], [2, 2]], np.int64)}),
    "tile": case("Tile", {"x": f32(2, 3)}, tiles=3, axis=1),
    "where": case("Where", {"c": np.array([True, False, True]), "a": f32(3), "b": f32(3)}),
    "shape": case("Shape", {"x": X4}),
    "shape_axes": case("Shape", {"x": X4}, axes=[3, 0]),
    "size": case("Size", {"x": X4}),
    "scale": case("Scale", {"x": f32(3, 4)}, scale=-1.5),
    "expand": case("Expand", {"x": f32(3, 1)}, {"s": np.array([2, 3, 4], np.int64)}),
    "layer_norm": case("LayerNorm", {"x": f32(2, 3, 4)}, outputs=("y", "mean", "std"), axis=1),
    "layer_norm_affine": case("LayerNorm", {"x": f32(2, 3, 4)}, {"g": f32(4), "bb": f32(4)},
                              outputs=("y", "m", "s"), axis=2, elementwise_affine=1,
                              epsilon=1e-3),
    "top_k": case("TopK", {"x": f32(3, 6)}, outputs=("v", "i"), k=2),
    "prelu": case("PRelu", {"x": X4}, {"s": f32(4)}),
    "copy": case("Copy", {"x": f32(3)}),
    "constant_fill": case("ConstantFill", {}, shape=[2, 3], value=1.5),
    "constant_fill_like": case("ConstantFill", {"x": X4}, value=2, dtype=10),
    "constant_fill_extra": case("ConstantFill", {"x": f32(2)}, extra_shape=[3], value=0.5),
    "given_tensor_fill": case("GivenTensorIntFill", {}, shape=[3], values=[4, 5, 6]),
    "relu_n": case("ReluN", {"x": f32(3, 4, low=-3, high=8)}, n=6.0),
}
UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Sqrt", "Abs", "Negative", "Reciprocal", "Sign",
         "Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Erf", "Softplus", "Softsign", "Log",
         "Asin", "Acos", "Sqr", "Cube", "Rsqrt", "Swish", "Mish", "Gelu", "Elu", "Selu",
         "LeakyRelu", "HardSigmoid", "ThresholdedRelu"]
for u in UNARY:
    positive = u in ("Sqrt", "Log", "Rsqrt", "Reciprocal")
    unit = u in ("Asin", "Acos")
    x = f32(3, 4, low=0.2 if positive else (-0.9 if unit else -2), high=0.9 if unit else 2)
    CASES[f"unary_{u}"] = case(u, {"x": x})
CASES["unary_LeakyRelu_alpha"] = case("LeakyRelu", {"x": f32(3, 4)}, alpha=0.3)
CASES["unary_Gelu_fast"] = case("Gelu", {"x": f32(3, 4)}, fast_gelu=1)
CASES["unary_Selu_args"] = case("Selu", {"x": f32(3, 4)}, alpha=1.2, scale=1.5)


def build(name):
    op_type, names, feeds, params, outputs, args = CASES[name]
    pred = netdef(f"{name}_net", [op(op_type, names, outputs, **args)], list(names), outputs)
    return pred, feeds, params


@pytest.mark.parametrize("name", sorted(CASES))
def test_export_agrees_with_reference_evaluator(name):
    pred, feeds, params = build(name)
    want = run_caffe2(pred, params, feeds)
    model = export(pred, params, feeds)
    onnx.checker.check_model(model, full_check=True)
    got = run_reference(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        else:
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)


def test_every_exported_op_is_one_the_frontend_declares():
    used = set()
    for name in CASES:
        pred, feeds, params = build(name)
        used |= {n.op_type for n in export(pred, params, feeds).graph.node}
    assert used <= frontend.ONNX_OPS_EMITTED, used - frontend.ONNX_OPS_EMITTED


# -- the conversions' own rules, against numpy


def test_legacy_caffe_pooling_pads_the_tail_as_caffe_did():
    # Caffe's output size rounds up: (8 + 2 - 3) / 2 -> 4 (+1) = 5 windows
    # where the floor gives 4; Caffe2 then pads the tail by pad + stride.
    pred, feeds, params = build("max_pool_legacy_caffe")
    model = export(pred, params, feeds)
    (node,) = model.graph.node
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["pads"] == [1, 1, 3, 3]
    x = feeds["x"]
    padded = np.pad(x, ((0, 0), (0, 0), (1, 3), (1, 3)), constant_values=-np.inf)
    want = np.empty((1, 2, 5, 5), np.float32)
    for i in range(5):
        for j in range(5):
            want[:, :, i, j] = padded[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(2, 3))
    np.testing.assert_array_equal(run_reference(model, feeds)[0], want)


def test_legacy_broadcast_lines_b_up_with_a_at_axis():
    x, c = feeds = (f32(2, 3, 4, 5), f32(3, 4))
    pred = netdef("bcast", [op("Mul", ["x", "c"], ["y"], broadcast=1, axis=1)], ["x", "c"], ["y"])
    model = export(pred, {}, {"x": x, "c": c})
    np.testing.assert_allclose(run_reference(model, {"x": x, "c": c})[0],
                               x * c[None, :, :, None], rtol=1e-6)


def test_a_broadcast_parameter_is_reshaped_in_place_keeping_its_name():
    pred, feeds, params = build("add_broadcast_axis")
    model = export(pred, params, feeds)
    (init,) = [t for t in model.graph.initializer if t.name == "c"]
    assert list(init.dims) == [4, 1, 1]


def test_slice_takes_caffe2s_negative_ends():
    # Caffe2: a negative index i is dim + 1 + i, so end -1 is the end.
    x = f32(5, 6, 7)
    pred, feeds, params = build("slice_negative")
    got = run_reference(export(pred, params, {"x": x}), {"x": x})[0]
    np.testing.assert_array_equal(got, x[1:4, 0:6, 5:7])


def test_concat_split_info_is_a_constant_when_used():
    a, b = f32(2, 3, 4), f32(2, 5, 4)
    pred = netdef("cat", [op("Concat", ["a", "b"], ["y", "info"], axis=1)], ["a", "b"], ["y", "info"])
    model = export(pred, {}, {"a": a, "b": b})
    y, info = run_reference(model, {"a": a, "b": b})
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=1))
    assert info.dtype == np.int32 and info.tolist() == [3, 5]
    # Unused, it is left out.
    pred = netdef("cat", [op("Concat", ["a", "b"], ["y", "info"], order="NCHW")], ["a", "b"], ["y"])
    assert [n.op_type for n in export(pred, {}, {"a": a, "b": b}).graph.node] == ["Concat"]


def test_concat_add_axis_and_split_add_axis():
    a, b = f32(2, 3), f32(2, 3)
    pred = netdef("stack", [op("Concat", ["a", "b"], ["y", "info"], axis=1, add_axis=1),
                            op("Split", ["y"], ["p", "q"], axis=1, add_axis=1)],
                  ["a", "b"], ["y", "info", "p", "q"])
    y, info, p, q = run_reference(export(pred, {}, {"a": a, "b": b}), {"a": a, "b": b})
    np.testing.assert_array_equal(y, np.stack([a, b], axis=1))
    assert info.tolist() == [1, 1]
    np.testing.assert_array_equal(p, a)
    np.testing.assert_array_equal(q, b)


def test_depth_concat_and_split_sizes():
    a, b = f32(1, 2, 3, 3), f32(1, 4, 3, 3)
    pred = netdef("dc", [op("DepthConcat", ["a", "b"], ["y", "info"], order="NCHW"),
                         op("Split", ["y"], ["p", "q", "r"], split=[1, 2, 3])],
                  ["a", "b"], ["p", "q", "r"])
    p, q, r = run_reference(export(pred, {}, {"a": a, "b": b}), {"a": a, "b": b})
    cat = np.concatenate([a, b], axis=1)
    np.testing.assert_array_equal(p, cat[:, :1])
    np.testing.assert_array_equal(r, cat[:, 3:])


def test_softmax_flattens_at_axis_as_caffe2():
    x = f32(2, 3, 4)
    pred, feeds, params = build("softmax_4d")
    x = feeds["x"]
    flat = x.reshape(2, -1)
    e = np.exp(flat - flat.max(axis=1, keepdims=True))
    want = (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)
    np.testing.assert_allclose(run_reference(export(pred, params, feeds), feeds)[0], want,
                               rtol=1e-5, atol=1e-7)


def test_fc_with_axis_2_keeps_the_leading_dims():
    pred, feeds, params = build("fc_axis2")
    want = feeds["x"] @ params["w"].T + params["b"]
    got = run_reference(export(pred, params, feeds), feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- nets: SSA, init nets, shapes


def test_in_place_ops_are_renamed_to_single_assignment():
    x = f32(2, 3)
    pred = netdef("inplace", [op("Relu", ["x"], ["h"]), op("Scale", ["h"], ["h"], scale=2.0),
                              op("Add", ["h", "x"], ["h"]), op("Sigmoid", ["h"], ["out"]),
                              op("Scale", ["out"], ["out"], scale=3.0)],
                  ["x"], ["out", "h"])
    model = export(pred, {}, {"x": x})
    outputs = [n for node in model.graph.node for n in node.output]
    assert len(outputs) == len(set(outputs))
    assert [o.name for o in model.graph.output] == ["out", "h"]
    out, h = run_reference(model, {"x": x})
    want_h = np.maximum(x, 0) * 2 + x
    np.testing.assert_allclose(h, want_h, rtol=1e-6)
    np.testing.assert_allclose(out, 3 / (1 + np.exp(-want_h)), rtol=1e-5)


def test_an_input_overwritten_in_place_keeps_its_name_as_the_input():
    x = f32(3)
    pred = netdef("overwrite", [op("Relu", ["x"], ["x"])], ["x"], ["x"])
    model = export(pred, {}, {"x": x})
    assert [i.name for i in model.graph.input] == ["x"]
    (out,) = model.graph.output
    assert out.name != "x"
    np.testing.assert_array_equal(run_reference(model, {"x": x})[0], np.maximum(x, 0))


def test_init_net_outputs_become_initializers_with_their_values():
    from ferrocaffe import workspace
    init = netdef("init", [op("XavierFill", [], ["w"], shape=[4, 3]),
                           op("ConstantFill", [], ["b"], shape=[4], value=0.25),
                           op("GivenTensorInt64Fill", [], ["s"], shape=[2], values=[3, 4])],
                  [], ["w", "b", "s"])
    init.op[0].device_option.random_seed = 7
    tensors = {t.name: onnx.numpy_helper.to_array(t)
               for t in frontend.caffe2_init_net_to_initializer(init)}
    ws = workspace.Workspace()
    ws.run(init)
    np.testing.assert_array_equal(tensors["w"], ws.fetch_blob("w"))
    np.testing.assert_array_equal(tensors["b"], np.full(4, 0.25, np.float32))
    assert tensors["s"].dtype == np.int64 and tensors["s"].tolist() == [3, 4]


def test_a_fill_of_an_input_in_the_init_net_is_dropped():
    # Caffe2's rule: a stand-in fill of a blob value_info describes.
    x = f32(2, 3)
    pred = netdef("p", [op("Relu", ["x"], ["y"])], ["x"], ["y"])
    init = netdef("i", [op("ConstantFill", [], ["x"], shape=[2, 3], value=9.0)], [], ["x"])
    model = frontend.caffe2_net_to_onnx_model(pred, init, {"x": (FLOAT, [2, 3])})
    assert [i.name for i in model.graph.input] == ["x"] and not model.graph.initializer
    np.testing.assert_array_equal(run_reference(model, {"x": x})[0], np.maximum(x, 0))


def test_the_callers_nets_are_not_changed():
    pred = netdef("p", [op("Relu", ["x"], ["x"])], ["x"], ["x"])
    before = pred.SerializeToString()
    frontend.caffe2_net_to_onnx_model(pred, None, {"x": (FLOAT, [2])})
    assert pred.SerializeToString() == before


def test_graph_outputs_carry_inferred_shapes_and_types():
    pred, feeds, params = build("conv")
    model = export(pred, params, feeds)
    (out,) = model.graph.output
    t = out.type.tensor_type
    assert t.elem_type == FLOAT and [d.dim_value for d in t.shape.dim] == [2, 6, 7, 7]
    assert model.opset_import[0].version == frontend.Caffe2Frontend.target_opset_version == 17
    assert model.ir_version == 8


def test_an_unused_declared_input_is_left_out():
    pred = netdef("p", [op("Relu", ["x"], ["y"])], ["x", "queue"], ["y"])
    model = frontend.caffe2_net_to_onnx_model(pred, None, {"x": (FLOAT, [2])})
    assert [i.name for i in model.graph.input] == ["x"]


def test_a_numpy_dtype_in_value_info():
    pred = netdef("p", [op("Relu", ["x"], ["y"])], ["x"], ["y"])
    model = frontend.caffe2_net_to_onnx_model(pred, None, {"x": (np.float32, [2])})
    assert model.graph.input[0].type.tensor_type.elem_type == FLOAT


def test_opset_18_gives_reductions_their_axes_as_inputs():
    pred, feeds, params = build("reduce_mean")
    model = export(pred, params, feeds, opset_version=18)
    assert model.opset_import[0].version == 18
    (node,) = [n for n in model.graph.node if n.op_type == "ReduceMean"]
    assert len(node.input) == 2
    np.testing.assert_allclose(run_reference(model, feeds)[0], feeds["x"].mean(axis=(2, 3)),
                               rtol=1e-5)


def test_caffe2_net_to_onnx_graph_and_a_core_net():
    from ferrocaffe import core
    net = core.Net("coreish")
    net.AddExternalOutput(net.Relu(["x"], ["y"]))
    graph = frontend.caffe2_net_to_onnx_graph(net, None, {"x": (FLOAT, [3])})
    assert isinstance(graph, onnx.GraphProto) and graph.name == "coreish"
    assert [n.op_type for n in graph.node] == ["Relu"]


# -- errors


def test_an_op_without_conversion_is_a_typed_error_naming_it():
    pred = netdef("lossy", [op("SoftmaxWithLoss", ["x", "l"], ["p", "loss"])], ["x", "l"], ["loss"])
    with pytest.raises(errors.UnsupportedOperatorError) as info:
        frontend.caffe2_net_to_onnx_model(
            pred, None, {"x": (FLOAT, [2, 3]), "l": (onnx.TensorProto.INT32, [2])})
    e = info.value
    assert isinstance(e, NotImplementedError) and isinstance(e, RuntimeError)
    assert e.op == "SoftmaxWithLoss" and e.net == "lossy" and e.op_index == 0
    assert "SoftmaxWithLoss" in str(e) and "lossy" in str(e)


@pytest.mark.parametrize("ops,what", [
    ([op("SpatialBN", ["x", "s", "b", "m", "v"], ["y", "m", "v", "sm", "siv"])], "training"),
    ([op("Dropout", ["x"], ["y", "mask"], ratio=0.5)], "training"),
    ([op("MaxPool", ["x"], ["y"], kernel=2, order="NHWC")], "NHWC"),
    ([op("Relu", ["x"], ["y"], some_new_arg=3)], "some_new_arg"),
])
def test_what_has_no_conversion_is_refused_naming_op_and_net(ops, what):
    ins = sorted({i for o in ops for i in o.input})
    pred = netdef("bad", ops, ins, [ops[-1].output[0]])
    vi = {i: (FLOAT, [2, 3, 4, 4]) if i == "x" else (FLOAT, [3]) for i in ins}
    with pytest.raises(errors.UnsupportedOperatorError) as info:
        frontend.caffe2_net_to_onnx_model(pred, None, vi)
    assert what in str(info.value) and "net 'bad'" in str(info.value)


def test_a_missing_value_info_names_the_input():
    pred = netdef("p", [op("Add", ["x", "z"], ["y"])], ["x", "z"], ["y"])
    with pytest.raises(errors.InvalidArgumentError) as info:
        frontend.caffe2_net_to_onnx_model(pred, None, {"x": (FLOAT, [2])})
    assert info.value.blob == "z" and "'z'" in str(info.value)
    with pytest.raises(errors.InvalidArgumentError):
        frontend.caffe2_net_to_onnx_model(pred, None, {"x": (FLOAT, [2]), "z": "nonsense"})
    with pytest.raises(errors.InvalidArgumentError):
        frontend.caffe2_net_to_onnx_model(pred, None, [("x", FLOAT, [2])])


def test_a_net_ferrocaffe_refuses_is_refused_with_its_error():
    # The shapes come from running the net: a bad net fails as it would run.
    pred = netdef("p", [op("Add", ["x", "z"], ["y"])], ["x", "z"], ["y"])
    with pytest.raises(errors.ShapeError):
        frontend.caffe2_net_to_onnx_model(pred, None, {"x": (FLOAT, [2]), "z": (FLOAT, [3])})


def test_not_a_net_is_a_type_error():
    with pytest.raises(errors.DataTypeError):
        frontend.caffe2_net_to_onnx_model(42, None, {})


# -- the Caffe2 alias


def test_caffe2_import_paths_reach_the_onnx_modules():
    source = textwrap.dedent("""
        import ferrocaffe
        ferrocaffe.register_caffe2_alias()
        from caffe2.python.onnx import frontend, backend
        from caffe2.python.onnx.backend import Caffe2Backend
        from caffe2.python.onnx.bin.conversion import caffe2_to_onnx, onnx_to_caffe2
        import caffe2.python.onnx.backend_rep
        import ferrocaffe.onnx.frontend as ff
        print("same =", frontend is ff, Caffe2Backend is backend.Caffe2Backend)
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PKG_PARENT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "same = True True" in proc.stdout
