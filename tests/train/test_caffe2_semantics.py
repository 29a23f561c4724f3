"""Divergences from Caffe2 that its own operator tests found (the training
oracle in docs/porting.md): Pow's legacy broadcast, DivGradient's inputs,
the gradient checker with in-place ops, and shape inference of the
elementwise ops. Expected values are numpy's or worked out by hand."""

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker


def run(op, inputs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(op)
    return [workspace.FetchBlob(o) for o in op.output]


def check_grad(op, inputs, which, step=1e-6, tol=1e-5):
    gc = GradientChecker(stepsize=step, threshold=tol)
    for i in which:
        ok, grad, _ = gc.CheckSimple(op, inputs, i, [0])
        assert ok and grad.shape == np.shape(inputs[i])


# -------------------------------------------------- Pow, legacy broadcast --

# (exponent shape, axis, how numpy sees the exponent against X [2, 3, 4, 5])
POW_CASES = [
    ((4, 5), None, (1, 1, 4, 5)),
    ((3, 4), 1, (1, 3, 4, 1)),
    ((2,), 0, (2, 1, 1, 1)),
    ((1, 4, 1), 1, (1, 1, 4, 1)),
]


@pytest.mark.parametrize("e_shape,axis,seen", POW_CASES)
def test_pow_legacy_broadcast_forward_and_gradient(fresh, e_shape, axis, seen):
    rng = np.random.default_rng(5)
    x = rng.uniform(1.0, 2.0, (2, 3, 4, 5))
    e = rng.uniform(2.0, 3.0, e_shape)
    kw = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
    op = core.CreateOperator("Pow", ["X", "E"], ["Z"], **kw)
    (z,) = run(op, {"X": x, "E": e})
    np.testing.assert_allclose(z, x ** e.reshape(seen), rtol=1e-12)
    # The gradient op, against d/dE sum(Z) = sum over the broadcast dims of
    # Z * ln X, and d/dX = E * X^(E-1).
    g_ops, g_in = core.GradientRegistry.GetGradientForOp(op, ["Z_grad"])
    workspace.FeedBlob("Z_grad", np.ones_like(z))
    workspace.RunOperatorsOnce(g_ops)
    dx, de = workspace.FetchBlob(str(g_in[0])), workspace.FetchBlob(str(g_in[1]))
    np.testing.assert_allclose(dx, e.reshape(seen) * x ** (e.reshape(seen) - 1), rtol=1e-10)
    full = z * np.log(x)
    axes = tuple(i for i, d in enumerate(seen) if d == 1)
    np.testing.assert_allclose(de, full.sum(axis=axes, keepdims=True).reshape(e_shape), rtol=1e-10)


def test_pow_legacy_broadcast_gradient_check(fresh):
    rng = np.random.default_rng(2)
    x = rng.uniform(1.0, 2.0, (2, 3, 2))
    e = rng.uniform(1.5, 2.5, (3,))
    check_grad(core.CreateOperator("Pow", ["X", "E"], ["Z"], broadcast=1, axis=1), [x, e], [0, 1])


def test_pow_broadcast_errors_name_the_exponent(fresh):
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(errors.ShapeError, match="'E'"):
        run(core.CreateOperator("Pow", ["X", "E"], ["Z"], broadcast=1),
            {"X": x, "E": np.ones((3, 5), np.float32)})
    with pytest.raises(errors.ShapeError, match="broadcast=1"):
        run(core.CreateOperator("Pow", ["X", "E"], ["Z"]),
            {"X": x, "E": np.ones((3, 4), np.float32)})
    with pytest.raises(errors.ShapeError):
        run(core.CreateOperator("Pow", ["X", "E"], ["Z"], broadcast=1, axis=2),
            {"X": x, "E": np.ones((3, 4), np.float32)})


# ---------------------------------------------------------- DivGradient --

def test_div_gradient_legacy_three_inputs(fresh):
    # Caffe2's legacy form: inputs (B, C, dC) with C = A / B.
    b = np.array([[2.0, 4.0]], np.float32)
    c = np.array([[3.0, -1.0]], np.float32)
    dc = np.array([[1.0, 2.0]], np.float32)
    da, db = run(core.CreateOperator("DivGradient", ["B", "C", "dC"], ["dA", "dB"]),
                 {"B": b, "C": c, "dC": dc})
    np.testing.assert_allclose(da, [[0.5, 0.5]])        # dC / B
    np.testing.assert_allclose(db, [[-1.5, 0.5]])       # -dC * C / B


def test_div_gradient_uses_the_output_so_in_place_div_is_right(fresh):
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    b = np.array([2.0, -4.0])
    # dB = -sum over rows of dC * C / B with dC = C = A / B (loss 0.5 |C|^2).
    c = a / b
    want_db = -(c * c / b).sum(axis=0)
    op = core.CreateOperator("Div", ["A", "B"], ["A"])  # in place on A
    g_ops, g_in = core.GradientRegistry.GetGradientForOp(op, ["A_grad"])
    (out,) = run(op, {"A": a, "B": b})
    np.testing.assert_allclose(out, c)
    workspace.FeedBlob("A_grad", c)
    workspace.RunOperatorsOnce(g_ops)
    np.testing.assert_allclose(workspace.FetchBlob(str(g_in[1])), want_db)
    np.testing.assert_allclose(workspace.FetchBlob(str(g_in[0])), c / b)


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Div"])
def test_gradient_checker_feeds_every_input_before_each_run(fresh, op_type):
    """An op that writes an input in place must see the inputs it was given
    at every perturbation (Caffe2's checker fed them all each time)."""
    rng = np.random.default_rng(9)
    a = rng.uniform(1.0, 2.0, (3, 2))
    b = rng.uniform(1.0, 2.0, (2,))
    check_grad(core.CreateOperator(op_type, ["A", "B"], ["A"]), [a, b], [0, 1])


# ------------------------------------------------------ shape inference --

def infer(op, inputs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    net = core.Net("infer")
    net.Proto().op.extend([op])
    return workspace.InferShapesAndTypes([net])


@pytest.mark.parametrize("op_type", ["Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt",
                                     "Abs", "Negative", "LeakyRelu", "Softmax"])
def test_unary_ops_infer_their_input_shape(fresh, op_type):
    shapes, types = infer(core.CreateOperator(op_type, ["X"], ["Y"]),
                          {"X": np.ones((2, 0, 3), np.float64)})
    assert shapes["Y"] == [2, 0, 3] and types["Y"] == core.DataType.DOUBLE


def test_gradient_ops_infer_dy_shape(fresh):
    shapes, _ = infer(core.CreateOperator("ReluGradient", ["Y", "dY"], ["dX"]),
                      {"Y": np.ones((4, 5), np.float32), "dY": np.ones((4, 5), np.float32)})
    assert shapes["dX"] == [4, 5]


@pytest.mark.parametrize("a,b,kw,want", [
    ((2, 3, 4), (4,), {}, [2, 3, 4]),
    ((3, 1), (1, 5), {}, [3, 5]),
    ((4,), (2, 1, 4), {}, [2, 1, 4]),
    ((0, 3), (1, 3), {}, [0, 3]),
    ((2, 3, 4), (3,), {"broadcast": 1, "axis": 1}, [2, 3, 4]),
])
def test_binary_ops_infer_the_broadcast_shape(fresh, a, b, kw, want):
    ins = {"A": np.ones(a, np.float32), "B": np.ones(b, np.float32)}
    for op_type in ["Add", "Sub", "Mul", "Div"]:
        shapes, types = infer(core.CreateOperator(op_type, ["A", "B"], ["C"], **kw), ins)
        assert shapes["C"] == want and types["C"] == core.DataType.FLOAT, op_type
        assert list(run(core.CreateOperator(op_type, ["A", "B"], ["C"], **kw), ins)[0].shape) == want
    for op_type in ["EQ", "LT", "GE"]:
        shapes, types = infer(core.CreateOperator(op_type, ["A", "B"], ["C"], **kw), ins)
        assert shapes["C"] == want and types["C"] == core.DataType.BOOL, op_type


def test_binary_ops_that_do_not_broadcast_are_left_unknown(fresh):
    shapes, _ = infer(core.CreateOperator("Add", ["A", "B"], ["C"]),
                      {"A": np.ones((2, 3), np.float32), "B": np.ones((4,), np.float32)})
    assert "C" not in shapes
    shapes, _ = infer(core.CreateOperator("Not", ["X"], ["Y"]), {"X": np.ones((5,), bool)})
    assert shapes["Y"] == [5]


# -------------------------------------------------------------- Reshape --

@pytest.mark.parametrize("old,shape,want", [
    ((4, 0), [0, -1], [0, 0]),    # Caffe2's documented example
    ((0,), [1, -1], [1, 0]),
    ((0,), [0, -1], [0, 0]),
    ((2, 0, 3), [0, 3], [0, 3]),
    ((2, 3), [0, -1], [2, 3]),    # not empty: 0 copies the input's dim
])
def test_reshape_keeps_zeros_of_an_empty_tensor(fresh, old, shape, want):
    x = np.zeros(old, np.float32)
    op = core.CreateOperator("Reshape", ["X"], ["Y", "old_shape"], shape=shape)
    y, old_shape = run(op, {"X": x})
    assert list(y.shape) == want and old_shape.tolist() == list(old)
    # The gradient reshapes dY back to the old shape (whose 0s stay 0).
    g_ops, g_in = core.GradientRegistry.GetGradientForOp(op, ["Y_grad", None])
    workspace.FeedBlob("Y_grad", np.zeros(want, np.float32))
    workspace.RunOperatorsOnce(g_ops)
    assert workspace.FetchBlob(str(g_in[0])).shape == old


# ------------------------------------------------ SoftmaxWithLoss only_loss --

def test_softmax_with_loss_accepts_only_loss(fresh):
    x = np.array([[1.0, 2.0, 3.0], [0.5, 0.5, -1.0]], np.float32)
    label = np.array([2, 0], np.int32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    want_loss = -np.log(p[[0, 1], label]).mean()
    for only_loss in (0, 1):
        op = core.CreateOperator("SoftmaxWithLoss", ["X", "label"], ["P", "loss"],
                                 only_loss=only_loss)
        probs, loss = run(op, {"X": x, "label": label})
        np.testing.assert_allclose(probs, p, rtol=1e-6)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
        # The gradient (only_loss copied to it) is P - onehot, averaged.
        g_ops, g_in = core.GradientRegistry.GetGradientForOp(op, [None, "loss_grad"])
        workspace.FeedBlob("loss_grad", np.array(1.0, np.float32))
        workspace.RunOperatorsOnce(g_ops)
        onehot = np.eye(3)[label]
        np.testing.assert_allclose(workspace.FetchBlob(str(g_in[0])), (p - onehot) / 2, rtol=1e-5,
                                   atol=1e-7)


@pytest.mark.parametrize("label_shape", [(2, 2), (2, 2, 1), (4,)])
def test_softmax_with_loss_labels_shaped_like_x_before_axis(fresh, label_shape):
    """With axis=2, X [2, 2, 3] is 4 rows of 3 classes; Caffe2 took the 4
    labels as X's first two dims (optionally with a trailing 1)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 2, 3)).astype(np.float32)
    label = np.array([0, 2, 1, 1], np.int32)
    rows = x.reshape(4, 3)
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    want = -np.log(p[np.arange(4), label]).mean()
    op = core.CreateOperator("SoftmaxWithLoss", ["X", "label"], ["P", "loss"], axis=2)
    if label_shape == (4,):
        # Neither X's leading dims nor 2 dims: refused, naming the labels.
        with pytest.raises(errors.ShapeError, match="'label'"):
            run(op, {"X": x, "label": label.reshape(label_shape)})
        return
    probs, loss = run(op, {"X": x, "label": label.reshape(label_shape)})
    np.testing.assert_allclose(probs, p.reshape(2, 2, 3), rtol=1e-5)
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    ok, _, _ = GradientChecker(stepsize=1e-6, threshold=1e-5).CheckSimple(
        op, [x.astype(np.float64), label.reshape(label_shape)], 0, [1])
    assert ok


# ------------------------------------ optimizer: gradient clipping, injection --

def test_sum_sqr_elements(fresh):
    x = np.array([[1.0, -2.0], [3.0, 0.5]])
    (s,) = run(core.CreateOperator("SumSqrElements", ["X"], ["S"]), {"X": x})
    assert s.shape == () and s == 1 + 4 + 9 + 0.25
    (m,) = run(core.CreateOperator("SumSqrElements", ["X"], ["M"], average=1), {"X": x})
    assert m == pytest.approx((1 + 4 + 9 + 0.25) / 4)


def _linear_model(build, **kw):
    from ferrocaffe import brew, model_helper, optimizer
    model = model_helper.ModelHelper(name="clip")
    fc = brew.fc(model, "data", "fc", dim_in=3, dim_out=2)
    dist = model.net.SquaredL2Distance([fc, "label"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    model.AddGradientOperators([loss])
    opt = getattr(optimizer, build)(model, base_learning_rate=0.1, **kw)
    rng = np.random.default_rng(0)
    workspace.FeedBlob("data", rng.standard_normal((4, 3)).astype(np.float32) * 5)
    workspace.FeedBlob("label", rng.standard_normal((4, 2)).astype(np.float32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    return model, opt


def test_build_sgd_clips_by_the_global_gradient_norm(fresh):
    model, opt = _linear_model("build_sgd", max_gradient_norm=1.0)
    assert opt._lr_multiplier is not None
    before = {p: workspace.FetchBlob(str(p)).copy() for p in model.params}
    workspace.RunNet(model.net.Proto().name)
    grads = {p: workspace.FetchBlob(str(model.param_to_grad[p])) for p in model.params}
    norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
    ratio = 1.0 / max(1.0, norm)
    assert ratio < 1.0  # the data is large enough for clipping to act
    np.testing.assert_allclose(workspace.FetchBlob("norm_clipped_grad_update/norm_ratio"),
                               ratio, rtol=1e-5)
    for p in model.params:  # plain SGD: p -= lr * ratio * grad
        np.testing.assert_allclose(workspace.FetchBlob(str(p)),
                                   before[p] - 0.1 * ratio * grads[p], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("build", ["build_sgd", "build_adam", "build_adagrad"])
def test_lr_injection_scales_every_update(fresh, build):
    from ferrocaffe import optimizer
    model, opt = _linear_model(build, max_gradient_norm=1.0, allow_lr_injection=True)
    assert optimizer.get_lr_injection() == 1
    optimizer.set_lr_injection(0)
    assert optimizer.get_lr_injection() == 0
    before = {p: workspace.FetchBlob(str(p)).copy() for p in model.params}
    workspace.RunNet(model.net.Proto().name)
    assert workspace.FetchBlob("lr_multiplier") == 0
    for p in model.params:  # a zero rate changes nothing
        np.testing.assert_array_equal(workspace.FetchBlob(str(p)), before[p])


def test_parameters_made_under_use_optimizer_keep_their_optimizer(fresh):
    """Caffe2's _build: a parameter whose info names an optimizer (a
    UseOptimizer block) is updated by it; the others by the one built."""
    from ferrocaffe import brew, model_helper, optimizer
    from ferrocaffe.optimizer_context import UseOptimizer
    count = optimizer._optimizer_instance_count["SgdOptimizer"]
    model = model_helper.ModelHelper(name="ctx")
    with UseOptimizer({"WEIGHT": optimizer.SgdOptimizer(0.5), "BIAS": optimizer.SgdOptimizer(0.25)}):
        fc = brew.fc(model, "data", "a", dim_in=2, dim_out=2)
    out = brew.fc(model, fc, "b", dim_in=2, dim_out=1)
    loss = model.net.AveragedLoss(out, "loss")
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, 0.125)
    rates = {op.output[0]: next(a.f for a in op.arg if a.name == "base_lr")
             for op in model.net.Proto().op if op.type == "LearningRate"}
    assert rates == {"SgdOptimizer_%d_lr_cpu" % count: -0.5,
                     "SgdOptimizer_%d_lr_cpu" % (count + 1): -0.25,
                     "SgdOptimizer_%d_lr_cpu" % (count + 2): -0.125}
    workspace.FeedBlob("data", np.array([[1.0, 2.0]], np.float32))
    workspace.RunNetOnce(model.param_init_net)
    before = {str(p): workspace.FetchBlob(str(p)).copy() for p in model.params}
    workspace.RunNetOnce(model.net)
    lr = {"a_w": 0.5, "a_b": 0.25, "b_w": 0.125, "b_b": 0.125}
    for p in model.params:
        g = workspace.FetchBlob(str(model.param_to_grad[p]))
        np.testing.assert_allclose(workspace.FetchBlob(str(p)), before[str(p)] - lr[str(p)] * g,
                                   rtol=1e-6, atol=1e-7)


def test_param_devices_come_from_the_nets(fresh):
    from ferrocaffe import brew, model_helper, optimizer
    from ferrocaffe.proto import caffe2_pb2
    model = model_helper.ModelHelper(name="dev")
    brew.fc(model, "data", "y", dim_in=2, dim_out=1)
    devices = optimizer._get_param_to_device(model)
    assert devices["y_w"].device_type == caffe2_pb2.CPU
    assert optimizer.get_param_device("y_w", "y_w_grad", devices) == devices["y_w"]
    # Unknown: the gradient's device, else the default, else an error.
    assert optimizer.get_param_device("p", "y_b", devices) == devices["y_b"]
    assert optimizer.get_param_device("p", "g", devices, default_device="d") == "d"
    slice_ = core.GradientSlice(indices="y_b", values="nothing")
    assert optimizer.get_param_device("p", slice_, devices) == devices["y_b"]
    with pytest.raises(AssertionError, match="Cannot infer device for p"):
        optimizer.get_param_device("p", "g", devices)


# A B that covers a run of X's dims followed by others (a per-channel scale
# over NCHW, Caffe2's legacy broadcast with an axis, or numpy's (C, 1, 1)):
# out of place and in place, below and above the size split across the pool.
@pytest.mark.parametrize("x_shape,b_shape,kw", [
    ((2, 3, 4, 5), (3,), {"broadcast": 1, "axis": 1}),
    ((2, 3, 4, 5), (3, 4), {"broadcast": 1, "axis": 1}),
    ((2, 3, 4, 5), (2, 3), {"broadcast": 1, "axis": 0}),
    ((1, 64, 72, 72), (64,), {"broadcast": 1, "axis": 1}),
    ((3, 8, 5), (8, 1), {}),
    ((2, 40, 60, 60), (40, 1, 1), {}),
])
@pytest.mark.parametrize("op_type", ["Add", "Mul", "Sub", "Div"])
@pytest.mark.parametrize("in_place", [False, True])
def test_binary_ops_broadcast_a_run_of_dims_before_others(fresh, x_shape, b_shape, kw, op_type, in_place):
    rng = np.random.default_rng(7)
    x = rng.uniform(-2, 2, x_shape).astype(np.float32)
    b = rng.uniform(0.5, 2, b_shape).astype(np.float32)
    out = "x" if in_place else "y"
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("b", b)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, ["x", "b"], [out], **kw))
    axis = kw.get("axis")
    if axis is None:
        bb = b
    else:
        bb = b.reshape((1,) * axis + b.shape + (1,) * (x.ndim - axis - b.ndim))
    want = {"Add": np.add, "Mul": np.multiply, "Sub": np.subtract, "Div": np.divide}[op_type](x, bb)
    np.testing.assert_array_equal(workspace.FetchBlob(out), want)
