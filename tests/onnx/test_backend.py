"""ferrocaffe.onnx.backend: the onnx.backend.base API on ferrocaffe's ops.

ONNX's own node tests run in test_onnx_backend_suite.py; here: the API
(prepare/run with lists, dicts and one array, run_model, run_node,
supports_device, onnx_graph_to_caffe2_net), typed errors for bad models
and inputs, the conversion made at run time for symbolic shapes, and the
compositions whose edge cases ONNX's tests do not reach, against numpy."""

import numpy as np
import pytest

import onnx  # noqa: E402  (the test extra installs it)

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from ferrocaffe import errors, workspace  # noqa: E402
from ferrocaffe.onnx import backend  # noqa: E402

F = TensorProto.FLOAT


def model_of(nodes, inputs, outputs, inits=(), opset=17, name="g"):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def small_model():
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "w")
    return model_of([helper.make_node("MatMul", ["x", "w"], ["h"]),
                     helper.make_node("Relu", ["h"], ["y"])],
                    [vi("x", [2, 3])], [vi("y", [2, 2])], [w])


def test_prepare_and_run_with_a_list_a_dict_and_one_array():
    x = np.array([[1, -2, 3], [-1, 0, 2]], np.float32)
    want = np.maximum(x @ np.arange(6, dtype=np.float32).reshape(3, 2), 0)
    rep = backend.prepare(small_model())
    assert rep.uninitialized == ["x"]
    for inputs in ([x], {"x": x}, x):
        (y,) = rep.run(inputs)
        np.testing.assert_allclose(y, want)
    assert rep.run([x]).y.shape == (2, 2)  # a named tuple
    np.testing.assert_allclose(backend.run_model(small_model(), [x])[0], want)


def test_prepare_takes_bytes_and_a_path(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(small_model(), path)
    x = np.ones((2, 3), np.float32)
    a = backend.prepare(str(path)).run([x])[0]
    b = backend.prepare(small_model().SerializeToString()).run([x])[0]
    np.testing.assert_array_equal(a, b)


def test_run_node():
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0, transB=1)
    a, b, c = (np.random.default_rng(0).standard_normal(s).astype(np.float32)
               for s in ((2, 3), (4, 3), (4,)))
    (y,) = backend.run_node(node, [a, b, c])
    np.testing.assert_allclose(y, 0.5 * a @ b.T + 2.0 * c, rtol=1e-5)
    out = backend.run_node(helper.make_node("Add", ["p", "q"], ["s"]),
                           {"p": np.int32([1, 2]), "q": np.int32([3])})
    assert out.s.dtype == np.int32 and out.s.tolist() == [4, 5]


def test_supports_only_the_cpu():
    assert backend.supports_device("CPU")
    assert not backend.supports_device("CUDA")
    with pytest.raises(errors.InvalidArgumentError):
        backend.prepare(small_model(), "CUDA:0")


def test_onnx_graph_to_caffe2_net_gives_a_runnable_pair():
    init, pred = backend.onnx_graph_to_caffe2_net(small_model())
    assert [o.type for o in init.op] == ["GivenTensorFill"]
    assert [o.type for o in pred.op] == ["BatchMatMul", "Relu"]
    ws = workspace.Workspace()
    ws.run(init)
    x = np.ones((2, 3), np.float32)
    ws.feed_blob("x", x)
    ws.run(pred)
    np.testing.assert_allclose(ws.fetch_blob("y"), np.maximum(x @ np.arange(6.0).reshape(3, 2), 0))


def test_small_int_and_half_initializers_go_through_the_init_net():
    inits = [numpy_helper.from_array(np.array([1, 2, 250], np.uint8), "u"),
             numpy_helper.from_array(np.array([0.5, -1.5], np.float16), "h")]
    m = model_of([helper.make_node("Identity", ["u"], ["uo"]), helper.make_node("Identity", ["h"], ["ho"])],
                 [], [vi("uo", [3], TensorProto.UINT8), vi("ho", [2], TensorProto.FLOAT16)], inits)
    init, _ = backend.onnx_graph_to_caffe2_net(m)
    ws = workspace.Workspace()
    ws.run(init)
    assert ws.fetch_blob("uo").dtype == np.uint8 and ws.fetch_blob("uo").tolist() == [1, 2, 250]
    assert ws.fetch_blob("ho").dtype == np.float16 and ws.fetch_blob("ho").tolist() == [0.5, -1.5]


# -- run-time conversion


def test_a_symbolic_batch_is_converted_for_each_shape():
    # SAME padding needs the image size: the model leaves it symbolic.
    wv = np.random.default_rng(1).standard_normal((2, 1, 3, 3)).astype(np.float32)
    m = model_of([helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
                 [vi("x", ["N", 1, "H", "W"])], [vi("y", ["N", 2, "A", "B"])],
                 [numpy_helper.from_array(wv, "w")])
    rep = backend.prepare(m)
    assert rep.deferred_reason is not None
    from onnx.reference import ReferenceEvaluator
    ref = ReferenceEvaluator(m)
    for shape in ((1, 1, 5, 5), (3, 1, 6, 4), (1, 1, 5, 5)):
        x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(rep.run([x])[0], ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_slice_bounds_fed_as_inputs_are_read_at_run_time():
    m = model_of([helper.make_node("Slice", ["x", "s", "e"], ["y"])],
                 [vi("x", [4, 5]), vi("s", [2], TensorProto.INT64), vi("e", [2], TensorProto.INT64)],
                 [vi("y", ["A", "B"])])
    rep = backend.prepare(m)
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    np.testing.assert_array_equal(rep.run([x, np.int64([1, 0]), np.int64([3, -1])])[0], x[1:3, 0:-1])
    np.testing.assert_array_equal(rep.run([x, np.int64([0, 2]), np.int64([4, 5])])[0], x[0:4, 2:5])


# -- compositions, against numpy


def test_floor_ceil_round_are_exact_at_the_edges():
    x = np.array([-2.5, -1.5, -0.5, -0.0, 0.5, 1.5, 2.5, 2.4999998, -7.0000005, 1e10 + 0.5,
                  3e38, -np.inf, np.inf, np.nan, 8388609.0], np.float32)
    for op_type, fn in (("Floor", np.floor), ("Ceil", np.ceil), ("Round", np.round)):
        (y,) = backend.run_node(helper.make_node(op_type, ["x"], ["y"]), [x])
        np.testing.assert_array_equal(y, fn(x), err_msg=op_type)


def test_mod_follows_the_divisors_sign_and_fmod_the_dividends():
    a = np.array([5, -5, 5, -5, 7, 0], np.int32)
    b = np.array([3, 3, -3, -3, 7, 4], np.int32)
    (m,) = backend.run_node(helper.make_node("Mod", ["a", "b"], ["m"]), [a, b])
    np.testing.assert_array_equal(m, np.mod(a, b))
    (f,) = backend.run_node(helper.make_node("Mod", ["a", "b"], ["m"], fmod=1), [a, b])
    np.testing.assert_array_equal(f, np.fmod(a, b))
    af, bf = np.float32([5.5, -5.5, 1.0, -1.0]), np.float32([2.0, 2.0, np.inf, np.inf])
    (mf,) = backend.run_node(helper.make_node("Mod", ["a", "b"], ["m"], fmod=0), [af, bf])
    np.testing.assert_array_equal(mf, np.mod(af, bf))


def test_log_softmax_of_large_numbers_is_finite():
    x = np.array([[1000.0, 0.0, -1000.0]], np.float32)
    (y,) = backend.run_node(helper.make_node("LogSoftmax", ["x"], ["y"]), [x])
    np.testing.assert_allclose(y, [[0.0, -1000.0, -2000.0]])


def test_softmax_over_a_middle_axis_and_old_opsets_flatten():
    x = np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)
    (y,) = backend.run_node(helper.make_node("Softmax", ["x"], ["y"], axis=1), [x], opset_version=13)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    (y11,) = backend.run_node(helper.make_node("Softmax", ["x"], ["y"], axis=1), [x], opset_version=11)
    flat = x.reshape(2, 12)
    e = np.exp(flat - flat.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y11, (e / e.sum(axis=1, keepdims=True)).reshape(x.shape), rtol=1e-5)


def test_integer_types_without_kernels_keep_their_wrapping():
    a, b = np.uint8([250, 3]), np.uint8([10, 4])
    (s,) = backend.run_node(helper.make_node("Add", ["a", "b"], ["s"]), [a, b])
    assert s.dtype == np.uint8 and s.tolist() == [4, 7]
    (n,) = backend.run_node(helper.make_node("Neg", ["x"], ["y"]), [np.int8([5, -128])])
    assert n.dtype == np.int8 and n.tolist() == [-5, -128]


def test_pad_modes():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    pads = np.int64([1, 2, 0, 1])
    for mode in ("constant", "reflect", "edge", "wrap"):
        node = helper.make_node("Pad", ["x", "p", "v"], ["y"], mode=mode)
        (y,) = backend.run_node(node, [x, pads, np.float32(9.0)], opset_version=19)
        kw = {"constant_values": 9.0} if mode == "constant" else {}
        np.testing.assert_array_equal(y, np.pad(x, ((1, 0), (2, 1)), mode=mode, **kw), err_msg=mode)


# -- errors


def test_an_op_without_conversion_is_a_typed_error_naming_it():
    m = model_of([helper.make_node("Relu", ["x"], ["h"], name="first"),
                  helper.make_node("CumSum", ["h", "ax"], ["y"], name="cumulative")],
                 [vi("x", [3]), vi("ax", [], TensorProto.INT64)], [vi("y", [3])])
    with pytest.raises(errors.UnsupportedOperatorError) as info:
        backend.prepare(m)
    e = info.value
    assert isinstance(e, NotImplementedError) and isinstance(e, RuntimeError)
    assert e.op == "CumSum" and e.op_index == 1 and e.net == "g"
    assert "cumulative" in str(e) and backend.UNSUPPORTED_OPS["CumSum"] in str(e)
    assert not backend.is_compatible(m)
    assert backend.is_compatible(small_model())


def test_wrong_inputs_are_typed_errors_naming_them():
    rep = backend.prepare(small_model())
    with pytest.raises(errors.DataTypeError) as info:
        rep.run([np.ones((2, 3), np.float64)])
    assert info.value.blob == "x"
    with pytest.raises(errors.ShapeError) as info:
        rep.run([np.ones((2, 4), np.float32)])
    assert "'x'" in str(info.value)
    with pytest.raises(errors.InvalidArgumentError):
        rep.run([np.ones((2, 3), np.float32)] * 2)
    with pytest.raises(errors.InvalidArgumentError):
        rep.run({"nope": np.ones(1, np.float32)})


def test_bad_models_are_typed_errors(tmp_path):
    with pytest.raises(errors.ConversionError):
        backend.prepare(b"\x00\x01 not a model at all", check=False)
    with pytest.raises(errors.FerrocaffeIOError):
        backend.prepare(str(tmp_path / "missing.onnx"))
    m = model_of([helper.make_node("Add", ["x", "x"], ["y"])],
                 [vi("x", [2], TensorProto.UINT32)], [vi("y", [2], TensorProto.UINT32)])
    with pytest.raises(errors.UnsupportedOperatorError) as info:
        backend.prepare(m)
    assert "UINT32" in str(info.value) and info.value.blob == "x"
    ext = small_model()
    ext.graph.initializer[0].data_location = TensorProto.EXTERNAL
    with pytest.raises(errors.ConversionError):
        backend.prepare(ext, check=False)


def test_a_symbolic_shape_is_an_error_for_the_netdef_pair():
    m = model_of([helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_LOWER")],
                 [vi("x", ["N", 1, "H", 5])], [vi("y", ["N", 1, "A", 5])],
                 [numpy_helper.from_array(np.ones((1, 1, 2, 2), np.float32), "w")])
    with pytest.raises(errors.ConversionError) as info:
        backend.onnx_graph_to_caffe2_net(m)
    assert "'x'" in str(info.value)
