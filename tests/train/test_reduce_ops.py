"""The reductions added after issue 14: ReduceMax, ReduceMin, ReduceL1,
ReduceL2 (and their gradient ops), SumReduceLike, DotProduct and LpPool;
with the Add/Sub/Mul/Div gradients under Caffe2's legacy broadcasting.

Forward values are compared with numpy references written here over
hypothesis-drawn shapes and axes; every gradient op is checked against
central differences (gradient_checker), through the gradient makers that
core.Net.AddGradientOperators uses. Bad dtypes, axes and shapes raise the
typed errors naming the op and the blob.
"""

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = dict(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
GRAD_SETTINGS = dict(SETTINGS, max_examples=12)

REDUCERS = {
    "ReduceMax": np.max,
    "ReduceMin": np.min,
    "ReduceL1": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
    "ReduceL2": lambda x, axis, keepdims: np.sqrt(np.sum(x * x, axis=axis, keepdims=keepdims)),
    "ReduceSum": np.sum,
    "ReduceMean": np.mean,
}


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


def check_grad(op, inputs, which, step=1e-3, tol=1e-2):
    gc = GradientChecker(stepsize=step, threshold=tol)
    for i in which:
        ok, grad, _est = gc.CheckSimple(op, inputs, i, [0])
        assert ok and grad.shape == np.shape(inputs[i])


@st.composite
def reduce_cases(draw, max_dims=4):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=max_dims)))
    nd = len(shape)
    axes = draw(st.none() | st.lists(st.integers(-nd, nd - 1), min_size=1, max_size=nd, unique=True))
    # Distinct values a step apart: max, min and |x| are differentiable there.
    x = np.random.RandomState(draw(st.integers(0, 2**16))).permutation(int(np.prod(shape)))
    x = ((x - x.size / 2.0 + 0.5) * 0.25).reshape(shape)
    return x, axes, draw(st.booleans())


def np_axes(axes, ndim):
    """The axes for numpy: canonical and distinct (the op takes -1 and
    ndim - 1 as the same axis, once)."""
    return None if axes is None else tuple(sorted({a % ndim for a in axes}))


def reduce_kwargs(axes, keepdims):
    kw = dict(keepdims=int(keepdims))
    if axes is not None:
        kw["axes"] = axes
    return kw


# --------------------------------------------------------------- forward --


@pytest.mark.parametrize("op_type", sorted(REDUCERS))
@settings(**SETTINGS)
@given(c=reduce_cases())
def test_reduce_forward_matches_numpy(fresh, op_type, c):
    x, axes, keepdims = c
    for dtype in (np.float32, np.float64):
        (y,) = run(op_type, {"X": x.astype(dtype)}, ["Y"], **reduce_kwargs(axes, keepdims))
        want = REDUCERS[op_type](x, axis=np_axes(axes, x.ndim), keepdims=keepdims)
        assert y.dtype == dtype
        assert y.shape == np.shape(want)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_reduce_keepdims_defaults_to_1_and_axes_to_all(fresh):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 11.5
    (y,) = run("ReduceL1", {"X": x}, ["Y"])
    assert y.shape == (1, 1, 1) and y.item() == np.abs(x).sum()
    (y,) = run("ReduceMax", {"X": x}, ["Y"], axes=[0, 2], keepdims=0)
    np.testing.assert_array_equal(y, x.max(axis=(0, 2)))
    # An empty axes list reduces every dim, as Caffe2.
    (y,) = run("ReduceMin", {"X": x}, ["Y"], axes=[], keepdims=0)
    assert y.shape == () and y.item() == x.min()


@pytest.mark.parametrize("op_type", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_max_min_take_integers(fresh, op_type, dtype):
    x = np.array([[3, -7, 2**30], [9, 2, -(2**30)]], dtype=dtype)
    (y,) = run(op_type, {"X": x}, ["Y"], axes=[1], keepdims=0)
    want = x.max(axis=1) if op_type == "ReduceMax" else x.min(axis=1)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, want)


def test_reduce_max_min_of_nothing_and_of_nan(fresh):
    empty = np.zeros((2, 0), dtype=np.float32)
    (y,) = run("ReduceMax", {"X": empty}, ["Y"], axes=[1], keepdims=0)
    np.testing.assert_array_equal(y, [-np.inf, -np.inf])
    (y,) = run("ReduceMin", {"X": empty}, ["Y"], axes=[1], keepdims=0)
    np.testing.assert_array_equal(y, [np.inf, np.inf])
    x = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, 3.0]], dtype=np.float32)
    for op_type in ("ReduceMax", "ReduceMin"):
        (y,) = run(op_type, {"X": x}, ["Y"], axes=[1], keepdims=0)
        assert np.isnan(y[0]) and not np.isnan(y[1])


# -------------------------------------------------------------- gradient --


@pytest.mark.parametrize("op_type", ["ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2"])
@settings(**GRAD_SETTINGS)
@given(c=reduce_cases(max_dims=3))
def test_reduce_gradient(fresh, op_type, c):
    x, axes, keepdims = c
    op = core.CreateOperator(op_type, ["X"], ["Y"], **reduce_kwargs(axes, keepdims))
    check_grad(op, [x.astype(np.float64)], [0], step=1e-3, tol=1e-4)
    check_grad(op, [x.astype(np.float32)], [0], step=0.05, tol=1e-2)


def run_gradient(op_type, x, dy, **kwargs):
    """Runs the op and the gradient ops its maker builds; returns dX."""
    net = core.Net("g")
    getattr(net, op_type)(["X"], ["Y"], **kwargs)
    workspace.FeedBlob("X", x)
    workspace.RunNetOnce(net)
    workspace.FeedBlob("Y_grad", dy)
    ops, g_in = core.GradientRegistry.GetGradientForOp(net.Proto().op[0], ["Y_grad"])
    workspace.RunOperatorsOnce(ops)
    return workspace.FetchBlob(str(g_in[0]))


def test_reduce_gradient_ops_take_dy_x_y(fresh):
    x = np.array([[2.0, 2.0, -1.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    dy = np.array([[10.0], [20.0]], dtype=np.float32)
    op = core.CreateOperator("ReduceMax", ["X"], ["Y"], axes=[1])
    ops, _ = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert [(g.type, list(g.input), list(g.output)) for g in ops] == [
        ("ReduceMaxGradient", ["Y_grad", "X", "Y"], ["X_grad"])
    ]
    assert {a.name for a in ops[0].arg} == {"axes"}
    # Ties each get dY (as Caffe2); a row of zeros ties everywhere.
    np.testing.assert_array_equal(run_gradient("ReduceMax", x, dy, axes=[1]), [[10, 10, 0], [20, 20, 20]])
    np.testing.assert_array_equal(run_gradient("ReduceMin", x, dy, axes=[1]), [[0, 0, 10], [20, 20, 20]])
    # |x|' is the sign, 0 at 0; the L2 norm's is x / norm, 0 at a zero norm.
    np.testing.assert_array_equal(run_gradient("ReduceL1", x, dy, axes=[1]), [[10, 10, -10], [0, 0, 0]])
    np.testing.assert_allclose(
        run_gradient("ReduceL2", x, dy, axes=[1]), [[20 / 3, 20 / 3, -10 / 3], [0, 0, 0]], rtol=1e-6
    )


def test_reduce_gradient_through_add_gradient_operators(fresh):
    x = np.random.RandomState(0).randn(3, 4).astype(np.float32)
    net = core.Net("train")
    y = net.ReduceL2(["X"], ["Y"], axes=[1], keepdims=0)
    loss = net.ReduceSum([y], ["loss"], keepdims=0)
    net.AddGradientOperators([loss])
    workspace.FeedBlob("X", x)
    workspace.RunNetOnce(net)
    want = x / np.sqrt((x * x).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(workspace.FetchBlob("X_grad"), want, rtol=1e-5)


# ---------------------------------------------------------------- errors --


def test_reduce_bad_arguments(fresh):
    x = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(errors.InvalidArgumentError, match="ReduceMax: axis 2 is out of range") as e:
        run("ReduceMax", {"X": x}, ["Y"], axes=[2])
    assert e.value.blob == "X"
    with pytest.raises(errors.InvalidArgumentError, match="axis -3"):
        run("ReduceL2", {"X": x}, ["Y"], axes=[-3])
    for op_type in ("ReduceL1", "ReduceL2"):
        with pytest.raises(errors.DataTypeError, match=f"{op_type}: input 0 \\('I'\\) must be a float32 or float64") as e:
            run(op_type, {"I": np.ones(3, dtype=np.int32)}, ["Y"])
        assert e.value.blob == "I"
    with pytest.raises(errors.DataTypeError, match="ReduceMax: .*int32, int64, float32 or float64.* got bool"):
        run("ReduceMax", {"B": np.ones(3, dtype=bool)}, ["Y"])
    with pytest.raises(errors.InvalidArgumentError, match="unknown argument 'axis'"):
        run("ReduceMin", {"X": x}, ["Y"], axis=1)
    # A gradient op's dY must have the reduced X's size.
    workspace.FeedBlob("Y", np.ones((2, 1), dtype=np.float32))
    workspace.FeedBlob("dY", np.ones(5, dtype=np.float32))
    with pytest.raises(errors.ShapeError, match="ReduceL2Gradient") as e:
        workspace.RunOperatorOnce(core.CreateOperator("ReduceL2Gradient", ["dY", "X", "Y"], ["dX"], axes=[1]))
    assert e.value.blob == "dY"


def test_reduce_shape_inference(fresh):
    net = core.Net("infer")
    net.ReduceMax(["X"], ["a"], axes=[-1])
    net.ReduceL1(["X"], ["b"], axes=[0, 2], keepdims=0)
    net.ReduceMin(["X"], ["c"], keepdims=0)
    net.DotProduct(["X", "X"], ["d"])
    net.SumReduceLike(["X", "S"], ["e"], axis=1)
    workspace.FeedBlob("X", np.zeros((2, 3, 4), dtype=np.float64))
    workspace.FeedBlob("S", np.zeros((3,), dtype=np.float32))
    shapes, types = workspace.InferShapesAndTypes([net])
    assert shapes["a"] == [2, 3, 1] and shapes["b"] == [3] and shapes["c"] == []
    assert shapes["d"] == [2] and shapes["e"] == [3]
    assert types["e"] == core.DataType.DOUBLE


# --------------------------------------------------------- SumReduceLike --


@st.composite
def like_cases(draw):
    """A and B placed in A at `axis` (None: at A's end), B's leading and
    trailing dims possibly 1."""
    a_shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    nb = draw(st.integers(1, len(a_shape)))
    axis = draw(st.integers(0, len(a_shape) - nb))
    b_shape = list(a_shape[axis:axis + nb])
    if draw(st.booleans()):
        b_shape[0] = 1
    if draw(st.booleans()):
        b_shape[-1] = 1
    default = axis == len(a_shape) - nb and draw(st.booleans())
    return a_shape, tuple(b_shape), None if default else axis


def sum_reduce_like_ref(a, b_shape, axis):
    if int(np.prod(b_shape)) == 1:
        return np.full(b_shape, a.sum())
    axis = a.ndim - len(b_shape) if axis is None else axis
    lead = 0
    while b_shape[lead] == 1:
        lead += 1
    end = len(b_shape)
    while b_shape[end - 1] == 1:
        end -= 1
    keep = set(range(axis + lead, axis + end))
    return a.sum(axis=tuple(d for d in range(a.ndim) if d not in keep)).reshape(b_shape)


@settings(**SETTINGS)
@given(c=like_cases())
def test_sum_reduce_like_matches_numpy(fresh, c):
    a_shape, b_shape, axis = c
    a = np.random.RandomState(1).randn(*a_shape)
    kw = {} if axis is None else dict(axis=axis)
    for dtype in (np.float32, np.float64):
        (out,) = run("SumReduceLike", {"A": a.astype(dtype), "B": np.zeros(b_shape, np.float32)}, ["C"], **kw)
        assert out.dtype == dtype and out.shape == b_shape
        np.testing.assert_allclose(out, sum_reduce_like_ref(a, b_shape, axis), rtol=1e-4, atol=1e-4)


def test_sum_reduce_like_arguments_and_errors(fresh):
    a = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    feeds = {"A": a, "B": np.zeros(5, np.float32)}
    # axis_str C: NCHW's dim 1, NHWC's dim 3; Caffe2's tests pass broadcast=1.
    (c,) = run("SumReduceLike", {"A": a, "B": np.zeros(3, np.float32)}, ["C"], axis_str="C", broadcast=1)
    np.testing.assert_allclose(c, a.sum(axis=(0, 2, 3)))
    (c,) = run("SumReduceLike", feeds, ["C"], axis_str="C", order="NHWC")
    np.testing.assert_allclose(c, a.sum(axis=(0, 1, 2)))
    with pytest.raises(errors.InvalidArgumentError, match="cannot be used simultaneously"):
        run("SumReduceLike", feeds, ["C"], axis=1, axis_str="C")
    with pytest.raises(errors.ShapeError, match="mismatch") as e:
        run("SumReduceLike", feeds, ["C"], axis=1)
    assert e.value.blob == "B"
    with pytest.raises(errors.DataTypeError, match="SumReduceLike") as e:
        run("SumReduceLike", {"I": np.ones((2, 3), np.int32), "B": np.ones(3, np.int32)}, ["C"])
    assert e.value.blob == "I"
    with pytest.raises(errors.InvalidArgumentError):
        run("SumReduceLike", {"A": a, "B": np.zeros(5, np.float32)}, ["B"])
    # An empty B: an empty result of its shape.
    (c,) = run("SumReduceLike", {"A": np.zeros((2, 0, 5), np.float32), "B": np.zeros((2, 0), np.float32)},
               ["C"], axis=0)
    assert c.shape == (2, 0)


# ------------------------------------------- legacy-broadcast gradients --


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize(
    "b_shape, kwargs",
    [
        ((4, 5), {}),
        ((3, 4), dict(axis=1)),
        ((2,), dict(axis=0)),
        ((1, 4, 1), dict(axis=1)),
        ((3,), dict(axis_str="C")),
        ((5,), dict(axis_str="C", order="NHWC")),
        ((1,), {}),
        ((1, 1, 1, 1, 1), {}),
    ],
)
def test_legacy_broadcast_gradients(fresh, op_type, b_shape, kwargs):
    rs = np.random.RandomState(3)
    a = rs.rand(2, 3, 4, 5) + 1.0
    b = rs.rand(*b_shape) + 1.0
    op = core.CreateOperator(op_type, ["A", "B"], ["C"], broadcast=1, **kwargs)
    # The forward value against numpy with B placed by hand.
    (c,) = run(op_type, {"A": a, "B": b}, ["C"], broadcast=1, **kwargs)
    if b.size == 1:
        bb = b.reshape(())
    else:
        axis = kwargs.get("axis", {"C": 1 if kwargs.get("order", "NCHW") == "NCHW" else 3}.get(kwargs.get("axis_str"), 4 - b.ndim))
        bb = b.reshape((1,) * axis + b.shape + (1,) * (4 - axis - b.ndim))
    fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op_type]
    np.testing.assert_allclose(c, fn(a, bb), rtol=1e-12)
    check_grad(op, [a, b], [0, 1], step=1e-6, tol=1e-5)


# ------------------------------------------------------------ DotProduct --


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 1000))
def test_dot_product_matches_numpy_and_gradient(fresh, shape, seed):
    rs = np.random.RandomState(seed)
    x, y = rs.randn(*shape), rs.randn(*shape)
    (z,) = run("DotProduct", {"X": x, "Y": y}, ["Z"])
    want = (x * y).reshape(shape[0], -1).sum(axis=1)
    assert z.shape == (shape[0],)
    np.testing.assert_allclose(z, want, rtol=1e-10)
    op = core.CreateOperator("DotProduct", ["X", "Y"], ["Z"])
    check_grad(op, [x, y], [0, 1], step=1e-6, tol=1e-5)
    check_grad(op, [x.astype(np.float32), y.astype(np.float32)], [0, 1])


def test_dot_product_backprop_and_self_product(fresh):
    # Caffe2's reshape test: DotProduct after a Reshape, through AddGradientOperators.
    x = np.random.RandomState(4).rand(4, 2, 1).astype(np.float32)
    y = np.random.RandomState(5).rand(1, 8).astype(np.float32)
    net = core.Net("net")
    net.GivenTensorFill([], "X", shape=x.shape, values=x.flatten())
    net.GivenTensorFill([], "Y", shape=y.shape, values=y.flatten())
    net.Reshape(["X"], ["X_out", "old_shape"], shape=(1, 8))
    net.DotProduct(["X_out", "Y"], "Z")
    net.AddGradientOperators(["Z"])
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob("Z"), [x.reshape(-1) @ y.reshape(-1)], rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("X_grad"), y.reshape(x.shape), rtol=1e-5)
    # x . x: both gradients land in one blob, summed (2x).
    net = core.Net("sq")
    net.DotProduct(["V", "V"], "W")
    net.AddGradientOperators(["W"])
    v = np.array([[1.0, 2.0], [3.0, -1.0]], dtype=np.float32)
    workspace.FeedBlob("V", v)
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob("V_grad"), 2 * v)


def test_dot_product_errors(fresh):
    with pytest.raises(errors.ShapeError, match="DotProduct: X \\('X', shape \\[2, 3\\]\\) and Y") as e:
        run("DotProduct", {"X": np.ones((2, 3), np.float32), "Y": np.ones((3, 2), np.float32)}, ["Z"])
    assert e.value.blob == "Y"
    with pytest.raises(errors.DataTypeError, match="DotProduct"):
        run("DotProduct", {"X": np.ones(3, np.int64), "Y": np.ones(3, np.int64)}, ["Z"])
    with pytest.raises(errors.DataTypeError, match="'Y'"):
        run("DotProduct", {"X": np.ones(3, np.float32), "Y": np.ones(3, np.float64)}, ["Z"])
    with pytest.raises(errors.ShapeError, match="dZ"):
        run("DotProductGradient", {"X": np.ones((2, 3)), "Y": np.ones((2, 3)), "dZ": np.ones(3)}, ["dX", "dY"])


# ---------------------------------------------------------------- LpPool --


def lp_pool_ref(x, p, k, s, pads):
    """NCHW 2-D: (sum over the window's taps inside the image of |x|^p)^(1/p)."""
    n, c, h, w = x.shape
    pt, pl, pb, pr = pads
    oh = (h + pt + pb - k) // s + 1
    ow = (w + pl + pr - k) // s + 1
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * s - pt, j * s - pl
            win = x[:, :, max(h0, 0):min(h0 + k, h), max(w0, 0):min(w0 + k, w)]
            y[:, :, i, j] = (np.abs(win) ** p).sum(axis=(2, 3)) ** (1.0 / p)
    return y


@st.composite
def lp_cases(draw):
    k = draw(st.integers(1, 3))
    pads = tuple(draw(st.lists(st.integers(0, k - 1), min_size=4, max_size=4)))
    h, w = draw(st.integers(k, 5)), draw(st.integers(k, 5))
    x = np.random.RandomState(draw(st.integers(0, 1000))).randn(draw(st.integers(1, 2)), draw(st.integers(1, 3)), h, w)
    p = draw(st.sampled_from([1.0, 2.0, 3.0, 1.5]))
    return x, p, k, draw(st.integers(1, 2)), pads, draw(st.sampled_from(["NCHW", "NHWC"]))


def lp_kwargs(p, k, s, pads, order):
    return dict(p=p, kernel=k, stride=s, pad_t=pads[0], pad_l=pads[1], pad_b=pads[2], pad_r=pads[3], order=order)


@settings(**SETTINGS)
@given(c=lp_cases())
def test_lp_pool_matches_numpy(fresh, c):
    x, p, k, s, pads, order = c
    xin = x if order == "NCHW" else np.moveaxis(x, 1, -1)
    (y,) = run("LpPool", {"X": xin}, ["Y"], **lp_kwargs(p, k, s, pads, order))
    want = lp_pool_ref(x, p, k, s, pads)
    if order == "NHWC":
        want = np.moveaxis(want, 1, -1)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)


@settings(**GRAD_SETTINGS)
@given(c=lp_cases())
def test_lp_pool_gradient(fresh, c):
    x, p, k, s, pads, order = c
    xin = x if order == "NCHW" else np.moveaxis(x, 1, -1)
    op = core.CreateOperator("LpPool", ["X"], ["Y"], **lp_kwargs(p, k, s, pads, order))
    check_grad(op, [xin], [0], step=1e-6, tol=1e-4)


def test_lp_pool_default_p_global_and_errors(fresh):
    x = np.random.RandomState(6).randn(2, 3, 4, 4).astype(np.float32)
    (y,) = run("LpPool", {"X": x}, ["Y"], global_pooling=1)
    np.testing.assert_allclose(y, np.sqrt((x * x).sum(axis=(2, 3), keepdims=True)), rtol=1e-5)
    op = core.CreateOperator("LpPool", ["X"], ["Y"], kernel=2)
    ops, _ = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert [(g.type, list(g.input)) for g in ops] == [("LpPoolGradient", ["X", "Y", "Y_grad"])]
    # The gradient at a window of zeros is 0 (not NaN).
    z = np.zeros((1, 1, 2, 2), np.float32)
    run("LpPool", {"X": z}, ["Y"], kernel=2)
    workspace.FeedBlob("Y_grad", np.ones((1, 1, 1, 1), np.float32))
    workspace.RunOperatorsOnce(ops)
    np.testing.assert_array_equal(workspace.FetchBlob("X_grad"), np.zeros_like(z))
    with pytest.raises(errors.InvalidArgumentError, match="`p` must be a positive"):
        run("LpPool", {"X": x}, ["Y"], kernel=2, p=-1.0)
    with pytest.raises(errors.DataTypeError, match="LpPool"):
        run("LpPool", {"X": x.astype(np.int32)}, ["Y"], kernel=2)


# -------------------------------------------------------- LengthsToShape --


def test_lengths_to_shape_feeds_reshape(fresh):
    (s,) = run("LengthsToShape", {"L": np.array([4, 4, 4], dtype=np.int32)}, ["S"])
    assert s.dtype == np.int32
    np.testing.assert_array_equal(s, [3, 4])
    (y, _old) = run("Reshape", {"X": np.arange(12, dtype=np.float32), "S": s}, ["Y", "old"])
    assert y.shape == (3, 4)
    with pytest.raises(errors.InvalidArgumentError, match="all lengths must be the same") as e:
        run("LengthsToShape", {"L": np.array([4, 5], dtype=np.int32)}, ["S"])
    assert e.value.blob == "L"
    with pytest.raises(errors.DataTypeError, match="1-D int32"):
        run("LengthsToShape", {"L": np.array([[4]], dtype=np.int32)}, ["S"])
    net = core.Net("no_grad")
    net.LengthsToShape(["L"], ["S"])
    ops, g_in = core.GradientRegistry.GetGradientForOp(net.Proto().op[0], ["S_grad"])
    assert ops == [] and g_in == [None]


# ---------------------------------- CosineSimilarity, DotProductWithPadding --


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 1000))
def test_cosine_similarity_matches_numpy_and_gradient(fresh, shape, seed):
    rs = np.random.RandomState(seed)
    x, y = rs.randn(*shape), rs.randn(*shape)
    (z,) = run("CosineSimilarity", {"X": x, "Y": y}, ["Z"])
    xr, yr = x.reshape(shape[0], -1), y.reshape(shape[0], -1)
    want = (xr * yr).sum(1) / np.sqrt((xr * xr).sum(1) * (yr * yr).sum(1))
    np.testing.assert_allclose(z, want, rtol=1e-10)
    op = core.CreateOperator("CosineSimilarity", ["X", "Y"], ["Z"])
    check_grad(op, [x, y], [0, 1], step=1e-6, tol=1e-5)


def test_cosine_similarity_of_zero_rows(fresh):
    # The squared norms have a floor of 1e-12 (Caffe2's): a zero row gives 0.
    x = np.array([[0.0, 0.0], [1.0, 2.0]], dtype=np.float32)
    (z,) = run("CosineSimilarity", {"X": x, "Y": x}, ["Z"])
    np.testing.assert_allclose(z, [0.0, 1.0], rtol=1e-6)


def padded_dot_ref(x, y, pad_value, replicate):
    n = x.shape[0]
    xr, yr = x.reshape(n, -1), y.reshape(n, -1)
    if xr.shape[1] < yr.shape[1]:
        xr, yr = yr, xr
    d = yr.shape[1]
    if replicate:
        return np.array([sum(xr[i, j:j + d] @ yr[i] for j in range(0, xr.shape[1], d)) for i in range(n)])
    return (xr[:, :d] * yr).sum(1) + pad_value * xr[:, d:].sum(1)


@settings(**SETTINGS)
@given(
    n=st.integers(1, 3),
    short=st.integers(1, 3),
    times=st.integers(1, 3),
    extra=st.integers(0, 2),
    x_longer=st.booleans(),
    replicate=st.booleans(),
    pad_value=st.sampled_from([0.0, 1.5]),
    seed=st.integers(0, 1000),
)
def test_dot_product_with_padding(fresh, n, short, times, extra, x_longer, replicate, pad_value, seed):
    rs = np.random.RandomState(seed)
    long = short * times if replicate else short + extra
    x, y = rs.randn(n, long), rs.randn(n, short)
    if not x_longer:
        x, y = y, x
    kw = dict(pad_value=pad_value, replicate=int(replicate))
    (z,) = run("DotProductWithPadding", {"X": x, "Y": y}, ["Z"], **kw)
    np.testing.assert_allclose(z, padded_dot_ref(x, y, pad_value, replicate), rtol=1e-10)
    op = core.CreateOperator("DotProductWithPadding", ["X", "Y"], ["Z"], **kw)
    ops, _ = core.GradientRegistry.GetGradientForOp(op, ["Z_grad"])
    assert {a.name for a in ops[0].arg} == {"pad_value", "replicate"}
    check_grad(op, [x, y], [0, 1], step=1e-6, tol=1e-5)


def test_dot_product_with_padding_errors(fresh):
    x, y = np.ones((2, 3), np.float32), np.ones((2, 2), np.float32)
    with pytest.raises(errors.ShapeError, match="whole number") as e:
        run("DotProductWithPadding", {"X": x, "Y": y}, ["Z"], replicate=1)
    assert e.value.blob == "Y"
    with pytest.raises(errors.ShapeError, match="first dim"):
        run("DotProductWithPadding", {"X": x, "Y": np.ones((3, 2), np.float32)}, ["Z"])


# --------------------------------------------- SumElements, Mean, Moments --


@pytest.mark.parametrize("average", [False, True])
def test_sum_elements_and_its_gradient(fresh, average):
    x = np.random.default_rng(1).standard_normal((2, 3, 2))
    workspace.FeedBlob("x", x)
    workspace.RunOperatorOnce(core.CreateOperator("SumElements", ["x"], ["s"], average=int(average)))
    s = workspace.FetchBlob("s")
    assert s.shape == ()
    np.testing.assert_allclose(s, x.mean() if average else x.sum(), rtol=1e-12)
    op = core.CreateOperator("SumElements", ["x"], ["s"], average=int(average))
    ok, grad, est = GradientChecker(stepsize=1e-6, threshold=1e-6).CheckSimple(op, [x], 0, [0])
    assert ok, (grad, est)


def test_mean_of_inputs_and_its_gradient(fresh):
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((3, 2)) for _ in range(3)]
    for i, x in enumerate(xs):
        workspace.FeedBlob("x%d" % i, x)
    workspace.RunOperatorOnce(core.CreateOperator("Mean", ["x0", "x1", "x2"], ["m"]))
    np.testing.assert_allclose(workspace.FetchBlob("m"), (xs[0] + xs[1] + xs[2]) / 3, rtol=1e-12)
    op = core.CreateOperator("Mean", ["x0", "x1", "x2"], ["m"])
    for i in range(3):
        ok, grad, est = GradientChecker(stepsize=1e-6, threshold=1e-6).CheckSimple(op, xs, i, [0])
        assert ok, (i, grad, est)
    workspace.FeedBlob("bad", np.ones((2, 2)))
    with pytest.raises(errors.ShapeError, match="input 1"):
        workspace.RunOperatorOnce(core.CreateOperator("Mean", ["x0", "bad"], ["m"]))


@pytest.mark.parametrize("axes,keep", [(None, 1), ([1], 1), ([0, 2], 0), ([-1], 0)])
def test_moments_and_its_gradient(fresh, axes, keep):
    x = np.random.default_rng(3).standard_normal((2, 3, 4))
    kw = dict(keepdims=keep) if axes is None else dict(axes=axes, keepdims=keep)
    workspace.FeedBlob("x", x)
    workspace.RunOperatorOnce(core.CreateOperator("Moments", ["x"], ["m", "v"], **kw))
    ax = None if axes is None else tuple(axes)
    np.testing.assert_allclose(workspace.FetchBlob("m"), x.mean(axis=ax, keepdims=bool(keep)), rtol=1e-12)
    np.testing.assert_allclose(workspace.FetchBlob("v"), x.var(axis=ax, keepdims=bool(keep)), rtol=1e-12)
    # Both outputs feed the checked loss.
    op = core.CreateOperator("Moments", ["x"], ["m", "v"], **kw)
    ok, grad, est = GradientChecker(stepsize=1e-6, threshold=1e-5).CheckSimple(op, [x], 0, [0, 1])
    assert ok, (grad, est)
