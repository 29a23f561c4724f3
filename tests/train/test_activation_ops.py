"""Caffe2's activations and elementwise math ops (ops/unary.rs; PRelu in
ops/activation.rs): forward values against numpy references written here
(float32 and float64), every gradient against float64 central differences
through gradient_checker (shapes from hypothesis), the gradient ops the
makers add (Caffe2's inputs), in-place rules, shape inference and typed errors."""

import math

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = dict(deadline=None, max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture])

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3)
seeds = st.integers(0, 2**31 - 1)

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _phi(x):
    return 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))


def _fast_gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _softplus(x):
    return np.logaddexp(0.0, x)


# op -> (numpy reference of X (float64) and the op's arguments, the domain
# X is drawn from, the arguments to test with: float32 values, as an
# Argument holds them)
REFS = {
    "Elu": (lambda x, alpha=1.0: np.where(x < 0, alpha * (np.exp(x) - 1.0), x), (-3, 3), {"alpha": 0.75}),
    "Swish": (lambda x: x / (1.0 + np.exp(-x)), (-4, 4), {}),
    "Gelu": (lambda x, fast_gelu=False: _fast_gelu(x) if fast_gelu else x * _phi(x), (-3, 3), {}),
    "ReluN": (lambda x, n=6.0: np.minimum(np.maximum(x, 0.0), n), (-2, 8), {"n": 2.5}),
    "ThresholdedRelu": (lambda x, alpha=1.0: np.where(x > alpha, x, 0.0), (-3, 3), {"alpha": -0.5}),
    "Softsign": (lambda x: x / (1.0 + np.abs(x)), (-5, 5), {}),
    "HardSigmoid": (lambda x, alpha=0.2, beta=0.5: np.clip(alpha * x + beta, 0.0, 1.0), (-5, 5), {"alpha": 0.25, "beta": 0.375}),
    "Mish": (lambda x: x * np.tanh(_softplus(x)), (-4, 4), {}),
    "Selu": (lambda x, alpha=1.6732632, scale=1.050701: scale * np.where(x > 0, x, alpha * (np.exp(x) - 1.0)),
             (-3, 3), {"alpha": 1.5, "scale": 1.25}),
    "Softplus": (_softplus, (-5, 5), {}),
    "Logit": (lambda x, eps=1e-6: np.log(np.clip(x, eps, 1 - eps) / (1 - np.clip(x, eps, 1 - eps))),
              (0.01, 0.99), {"eps": 0.125}),
    "Sqr": (lambda x: x * x, (-3, 3), {}),
    "Cube": (lambda x: x**3, (-3, 3), {}),
    "Cbrt": (np.cbrt, (0.5, 8), {}),
    "Rsqrt": (lambda x: 1.0 / np.sqrt(x), (0.2, 5), {}),
    "Reciprocal": (lambda x: 1.0 / x, (0.5, 3), {}),
    "Log1p": (np.log1p, (-0.5, 3), {}),
    "Sin": (np.sin, (-3, 3), {}),
    "Cos": (np.cos, (-3, 3), {}),
    "Tan": (np.tan, (-1.2, 1.2), {}),
    "Asin": (np.arcsin, (-0.9, 0.9), {}),
    "Acos": (np.arccos, (-0.9, 0.9), {}),
    "Atan": (np.arctan, (-4, 4), {}),
    "Sinh": (np.sinh, (-3, 3), {}),
    "Cosh": (np.cosh, (-3, 3), {}),
    "Erf": (_erf, (-2.5, 2.5), {}),
    "Sign": (np.sign, (-3, 3), {}),
}

# Caffe2's gradient op inputs, of X, Y (the forward output) and dY.
GRAD_READS = {
    "Elu": ("Y", "dY"), "ReluN": ("Y", "dY"), "Selu": ("Y", "dY"), "Softplus": ("Y", "dY"),
    "HardSigmoid": ("Y", "dY"), "Reciprocal": ("Y", "dY"), "Logit": ("X", "dY"), "ThresholdedRelu": ("Y", "dY"),
    "Swish": ("X", "Y", "dY"), "Mish": ("X", "Y", "dY"),
    "Gelu": ("dY", "X"), "Cube": ("dY", "X"), "Sinh": ("dY", "X"), "Cosh": ("dY", "X"),
    "Cbrt": ("dY", "Y"), "Rsqrt": ("dY", "Y"),
    "Softsign": ("X", "dY"), "Log1p": ("X", "dY"), "Sin": ("X", "dY"), "Cos": ("X", "dY"),
    "Tan": ("X", "dY"), "Asin": ("X", "dY"), "Acos": ("X", "dY"), "Atan": ("X", "dY"), "Erf": ("X", "dY"),
}

# Where Caffe2's schema allowed Y over X.
INPLACE = {"Elu", "Selu", "ThresholdedRelu", "Softplus", "Logit", "ReluN", "Softsign", "HardSigmoid", "Sqr", "Cbrt", "Rsqrt",
           "Reciprocal"}

# Points where the function has a kink: inputs are moved away from them
# before a gradient check.
KINKS = {"Elu": [0.0], "Selu": [0.0], "ThresholdedRelu": [-0.5, 0.0], "Logit": [0.125, 0.875], "ReluN": [0.0, 2.5], "HardSigmoid": [-1.5, 2.5],
         "Softsign": [0.0]}


def draw(rng, shape, lo, hi, dtype=np.float64):
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def away_from_kinks(x, kinks, gap=0.05):
    for k in kinks:
        near = np.abs(x - k) < gap
        x[near] = k + np.where(x[near] >= k, gap, -gap)
    return x


def run(op, feeds):
    for name, v in feeds.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(op)
    return [workspace.FetchBlob(o) for o in op.output]


@pytest.mark.parametrize("op_type", sorted(REFS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(**SETTINGS)
@given(shape=shapes, seed=seeds)
def test_forward_matches_numpy(fresh, op_type, dtype, shape, seed):
    ref, (lo, hi), args = REFS[op_type]
    x = draw(np.random.default_rng(seed), shape, lo, hi, dtype)
    (y,) = run(core.CreateOperator(op_type, ["X"], ["Y"], **args), {"X": x})
    assert y.dtype == dtype and y.shape == x.shape
    want = ref(x.astype(np.float64), **args)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol)


def test_default_arguments(fresh):
    x = np.linspace(-8, 8, 33)
    # Caffe2's defaults, float32 as its arguments are.
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    defaults = {"Elu": {"alpha": 1.0}, "ThresholdedRelu": {"alpha": 1.0}, "ReluN": {"n": 6.0}, "Gelu": {"fast_gelu": False},
                "Selu": {"alpha": f32(1.6732632423543772), "scale": f32(1.0507009873554805)},
                "Logit": {"eps": f32(1e-6)},
                "HardSigmoid": {"alpha": float(np.float32(0.2)), "beta": 0.5}}
    for op_type, args in defaults.items():
        xs = 1 / (1 + np.exp(-x)) if op_type == "Logit" else x
        (y,) = run(core.CreateOperator(op_type, ["X"], ["Y"]), {"X": xs})
        np.testing.assert_allclose(y, REFS[op_type][0](xs, **args), rtol=1e-12, atol=1e-12)
    (y,) = run(core.CreateOperator("Gelu", ["X"], ["Y"], fast_gelu=True), {"X": x})
    np.testing.assert_allclose(y, _fast_gelu(x), rtol=1e-12, atol=1e-12)
    # The approximation is close to the exact function, and not equal.
    assert 0 < np.max(np.abs(y - x * _phi(x))) < 1e-3


@pytest.mark.parametrize("op_type", sorted(GRAD_READS))
@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=3), seed=seeds)
def test_gradient_checks(fresh, op_type, shape, seed):
    _, (lo, hi), args = REFS[op_type]
    x = away_from_kinks(draw(np.random.default_rng(seed), shape, lo, hi), KINKS.get(op_type, []))
    op = core.CreateOperator(op_type, ["X"], ["Y"], **args)
    ok, grad, _ = GradientChecker(stepsize=1e-6, threshold=1e-5).CheckSimple(op, [x], 0, [0])
    assert ok and grad.shape == x.shape


@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 3), min_size=1, max_size=3), seed=seeds)
def test_fast_gelu_gradient_and_sqr_gradient(fresh, shape, seed):
    x = draw(np.random.default_rng(seed), shape, -3, 3)
    for op in (core.CreateOperator("Gelu", ["X"], ["Y"], fast_gelu=True), core.CreateOperator("Sqr", ["X"], ["Y"])):
        ok, _, _ = GradientChecker(stepsize=1e-6, threshold=1e-5).CheckSimple(op, [x], 0, [0])
        assert ok


@pytest.mark.parametrize("op_type", sorted(GRAD_READS))
def test_gradient_ops_read_what_caffe2_read(fresh, op_type):
    net = core.Net("g")
    y = getattr(net, op_type)("x", "y", **REFS[op_type][2])
    net.AddGradientOperators({y: "dy"})
    g = net.Proto().op[-1]
    names = {"X": "x", "Y": "y", "dY": "dy"}
    assert g.type == op_type + "Gradient"
    assert list(g.input) == [names[r] for r in GRAD_READS[op_type]]
    assert list(g.output) == ["x_grad"]
    # The forward op's arguments travel to its gradient op.
    assert {a.name for a in g.arg} == set(REFS[op_type][2])


def test_gradient_values_through_a_net(fresh):
    # loss = mean(Elu(x) * dY-weights) through AddGradientOperators: the
    # gradient op's own values, against the derivative written here.
    x = np.array([-2.0, -0.5, 0.3, 1.7])
    net = core.Net("elu")
    y = net.Elu("x", "y", alpha=0.5)
    net.AddExternalInput("dy")
    net.AddGradientOperators({y: "dy"})
    dy = np.array([1.0, 2.0, 3.0, 4.0])
    run_feeds = {"x": x, "dy": dy}
    for k, v in run_feeds.items():
        workspace.FeedBlob(k, v)
    workspace.RunNetOnce(net)
    want = dy * np.where(x < 0, 0.5 * np.exp(x), 1.0)
    np.testing.assert_allclose(workspace.FetchBlob("x_grad"), want, rtol=1e-12)


def test_sign_has_no_gradient_and_sqr_leaves_dy_alone(fresh):
    net = core.Net("s")
    s = net.Sign("x", "s")
    q = net.Sqr("x", "q")
    net.Sum([s, q], "t")
    net.AddExternalInput("dt")
    n = len(net.Proto().op)
    net.AddGradientOperators({"t": "dt"})
    ops = [(op.type, list(op.input), list(op.output)) for op in net.Proto().op[n:]]
    assert ("Scale", ["dt"], ["x_grad"]) in ops and ("Mul", ["x_grad", "x"], ["x_grad"]) in ops
    assert not any(op[0].startswith("Sign") for op in ops)
    x, dt = np.array([-1.5, 0.0, 2.0]), np.array([1.0, 2.0, 3.0])
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("dt", dt)
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob("x_grad"), 2 * x * dt)
    np.testing.assert_array_equal(workspace.FetchBlob("dt"), dt)


@pytest.mark.parametrize("op_type", sorted(REFS))
def test_in_place_where_caffe2_allowed_it(fresh, op_type):
    ref, (lo, hi), args = REFS[op_type]
    x = np.linspace(lo, hi, 7)[1:-1]
    op = core.CreateOperator(op_type, ["X"], ["X"], **args)
    if op_type in INPLACE:
        (y,) = run(op, {"X": x})
        np.testing.assert_allclose(y, ref(x, **args), rtol=1e-12, atol=1e-12)
    else:
        with pytest.raises(errors.InvalidArgumentError, match="in-place"):
            run(op, {"X": x})


def test_gradient_ops_in_place_over_dy(fresh):
    x = np.array([0.2, -0.7, 1.1])
    y = x / (1 + np.exp(-x))
    dy = np.array([1.0, -2.0, 0.5])
    (dx,) = run(core.CreateOperator("SwishGradient", ["X", "Y", "dY"], ["dY"]), {"X": x, "Y": y, "dY": dy})
    np.testing.assert_allclose(dx, dy * (y + (1 - y) / (1 + np.exp(-x))), rtol=1e-12)
    with pytest.raises(errors.InvalidArgumentError, match="in-place"):
        run(core.CreateOperator("GeluGradient", ["dY", "X"], ["dY"]), {"X": x, "dY": dy})


def test_shape_inference(fresh):
    net = core.Net("infer")
    net.Elu("x", "a")
    net.Cube("a", "b")
    net.PRelu(["b", "w"], "c")
    net.CubeGradient(["b", "a"], "d")
    shapes, types = workspace.InferShapesAndTypes(
        [net], blob_dimensions={"x": [2, 3], "w": [3]},
        blob_types={"x": core.DataType.DOUBLE, "w": core.DataType.DOUBLE},
    )
    for b in "abcd":
        assert list(shapes[b]) == [2, 3] and types[b] == core.DataType.DOUBLE


# ---------------------------------------------------------------- PRelu --


def prelu_ref(x, w, order):
    if w.size == 1:
        ws = w.reshape(())
    elif order == "NCHW":
        ws = w.reshape((1, -1) + (1,) * (x.ndim - 2))
    else:
        ws = w
    return np.where(x > 0, x, ws * x)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@settings(**SETTINGS)
@given(shape=st.lists(st.integers(1, 3), min_size=2, max_size=4), shared=st.booleans(), seed=seeds)
def test_prelu_forward_and_gradients(fresh, order, shape, shared, seed):
    rng = np.random.default_rng(seed)
    x = away_from_kinks(rng.uniform(-2, 2, size=shape), [0.0])
    c = shape[1] if order == "NCHW" else shape[-1]
    w = rng.uniform(-1, 1, size=1 if shared else c)
    for dtype in (np.float32, np.float64):
        (y,) = run(core.CreateOperator("PRelu", ["X", "W"], ["Y"], order=order),
                   {"X": x.astype(dtype), "W": w.astype(dtype)})
        assert y.dtype == dtype
        np.testing.assert_allclose(y, prelu_ref(x, w, order), rtol=1e-6)
    op = core.CreateOperator("PRelu", ["X", "W"], ["Y"], order=order)
    gc = GradientChecker(stepsize=1e-6, threshold=1e-5)
    for i in (0, 1):
        ok, grad, _ = gc.CheckSimple(op, [x, w], i, [0])
        assert ok and grad.shape == [x, w][i].shape


def test_prelu_gradient_op_and_errors(fresh):
    net = core.Net("p")
    net.PRelu(["x", "w"], "y", order="NHWC")
    net.AddGradientOperators({"y": "dy"})
    g = net.Proto().op[-1]
    assert (g.type, list(g.input), list(g.output)) == ("PReluGradient", ["y", "dy", "x", "w"], ["x_grad", "w_grad"])
    assert [(a.name, a.s) for a in g.arg] == [("order", b"NHWC")]
    x = np.ones((2, 3, 4))
    # A slope of neither one element nor one per channel.
    with pytest.raises(errors.ShapeError, match="slope"):
        run(core.CreateOperator("PRelu", ["X", "W"], ["Y"]), {"X": x, "W": np.ones(4)})
    with pytest.raises(errors.DataTypeError, match="'W'"):
        run(core.CreateOperator("PRelu", ["X", "W"], ["Y"]), {"X": x, "W": np.ones(3, np.float32)})
    with pytest.raises(errors.InvalidArgumentError, match="order"):
        run(core.CreateOperator("PRelu", ["X", "W"], ["Y"], order="NCWH"), {"X": x, "W": np.ones(3)})
    # In place: its gradient cannot recover X.
    (y,) = run(core.CreateOperator("PRelu", ["X", "W"], ["X"]), {"X": -x, "W": np.full(3, 0.5)})
    np.testing.assert_allclose(y, -0.5 * x)
    with pytest.raises(errors.InvalidArgumentError, match="in place"):
        run(core.CreateOperator("PReluGradient", ["X", "dY", "X", "W"], ["dX", "dW"]),
            {"X": y, "dY": x, "W": np.full(3, 0.5)})
    # Caffe2's tests pass an alpha, which PRelu ignores.
    (y,) = run(core.CreateOperator("PRelu", ["X", "W"], ["Y"], alpha=3.0), {"X": -x, "W": np.full(1, 0.25)})
    np.testing.assert_allclose(y, -0.25 * x)


# ---------------------------------------------------------------- errors --


@pytest.mark.parametrize("op_type", ["Elu", "Swish", "Cube", "Sign", "Erf"])
def test_bad_dtype_is_a_typed_error(fresh, op_type):
    with pytest.raises(errors.DataTypeError, match=f"{op_type}: input 0 \\('X'\\) must be a float32 or float64") as e:
        run(core.CreateOperator(op_type, ["X"], ["Y"]), {"X": np.arange(4, dtype=np.int32)})
    assert e.value.op == op_type and e.value.blob == "X"
    assert isinstance(e.value, TypeError)


def test_gradient_op_errors(fresh):
    y32, dy64 = np.ones(3, np.float32), np.ones(3)
    with pytest.raises(errors.DataTypeError, match="'Y'"):
        run(core.CreateOperator("EluGradient", ["Y", "dY"], ["dX"]), {"Y": y32, "dY": dy64})
    with pytest.raises(errors.ShapeError, match="same shape"):
        run(core.CreateOperator("MishGradient", ["X", "Y", "dY"], ["dX"]),
            {"X": np.ones(3), "Y": np.ones(4), "dY": np.ones(3)})
    with pytest.raises(errors.InvalidArgumentError, match="n must be greater than 0"):
        run(core.CreateOperator("ReluN", ["X"], ["Y"], n=0.0), {"X": np.ones(3)})
    with pytest.raises(errors.InvalidArgumentError, match="scale must be greater than 1"):
        run(core.CreateOperator("Selu", ["X"], ["Y"], scale=1.0), {"X": np.ones(3)})
    with pytest.raises(errors.InvalidArgumentError, match="eps must be in"):
        run(core.CreateOperator("Logit", ["X"], ["Y"], eps=0.5), {"X": np.ones(3)})


def test_extreme_inputs_stay_finite(fresh):
    x = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0])
    for op_type in ("Mish", "Swish", "Softsign", "Gelu"):
        (y,) = run(core.CreateOperator(op_type, ["X"], ["Y"]), {"X": x})
        assert np.all(np.isfinite(y)), op_type
    (dx,) = run(core.CreateOperator("MishGradient", ["X", "Y", "dY"], ["dX"]),
                {"X": x, "Y": x, "dY": np.ones_like(x)})
    np.testing.assert_allclose(dx[[0, 4]], [0.0, 1.0], atol=1e-12)
    (y,) = run(core.CreateOperator("Sign", ["X"], ["Y"]), {"X": np.array([np.nan, -0.0, 2.0])})
    assert np.isnan(y[0]) and y[1] == 0 and y[2] == 1


def test_brew_prelu_learns_its_slope(fresh):
    from ferrocaffe import brew, model_helper

    model = model_helper.ModelHelper(name="prelu")
    y = brew.prelu(model, "x", "y", num_channels=3)
    loss = model.net.AveragedLoss(y, "loss")
    model.AddGradientOperators([loss])
    assert [str(p) for p in model.params] == ["y_slope"]
    x = np.random.default_rng(3).uniform(-2, 2, size=(2, 3, 4))
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(model.param_init_net)
    np.testing.assert_array_equal(workspace.FetchBlob("y_slope"), np.full(3, 0.25, np.float32))
    workspace.FeedBlob("x", x.astype(np.float32))
    workspace.RunNetOnce(model.net)
    np.testing.assert_allclose(workspace.FetchBlob("y"), np.where(x > 0, x, 0.25 * x), rtol=1e-6)
    # d mean(y) / d slope[c] = the sum of channel c's negative inputs / size.
    want = np.where(x < 0, x, 0.0).sum(axis=(0, 2)) / x.size
    np.testing.assert_allclose(workspace.FetchBlob("y_slope_grad"), want, rtol=1e-5)
    model2 = model_helper.ModelHelper(name="prelu2")
    brew.prelu(model2, "x", "z", slope_init=("ConstantFill", {"value": 0.5}))
    workspace.RunNetOnce(model2.param_init_net)
    np.testing.assert_array_equal(workspace.FetchBlob("z_slope"), np.full(1, 0.5, np.float32))


@pytest.mark.parametrize("op_type", ["ReluN", "HardSigmoid", "Logit", "Elu", "Softsign", "Gelu"])
def test_nan_propagates(fresh, op_type):
    (y,) = run(core.CreateOperator(op_type, ["X"], ["Y"]), {"X": np.array([np.nan, 0.25])})
    assert np.isnan(y[0]) and np.isfinite(y[1])


def test_large_tensors_split_across_threads(fresh):
    # 2^17 + 3 elements: computed in chunks on the kernel pool, in order.
    rng = np.random.default_rng(11)
    x = rng.uniform(-3, 3, size=(2**17 + 3,))
    dy = rng.uniform(-1, 1, size=x.shape)
    (y,) = run(core.CreateOperator("Elu", ["X"], ["Y"], alpha=0.5), {"X": x})
    np.testing.assert_allclose(y, np.where(x < 0, 0.5 * np.expm1(x), x), rtol=1e-12)
    (dx,) = run(core.CreateOperator("SwishGradient", ["X", "Y", "dY"], ["dX"]),
                {"X": x.reshape(-1, 1), "Y": x.reshape(-1, 1), "dY": dy.reshape(-1, 1)})
    s = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(dx.ravel(), dy * (x + s * (1 - x)), rtol=1e-10, atol=1e-12)
    assert dx.shape == (2**17 + 3, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [7, 70_000])  # below and above the size split across the kernel pool
def test_in_place_overwrites_only_what_no_one_else_holds(fresh, dtype, n):
    # An in-place Relu writes X's own buffer when nothing else holds it: the
    # result is Relu's, a NumPy array fetched earlier keeps its values, and a
    # blob aliasing X (Alias shares the buffer) keeps the old values too.
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(dtype)
    workspace.FeedBlob("X", x)
    before = workspace.FetchBlob("X")
    workspace.RunOperatorOnce(core.CreateOperator("Alias", ["X"], ["A"]))
    workspace.RunOperatorOnce(core.CreateOperator("Relu", ["X"], ["X"]))
    np.testing.assert_array_equal(workspace.FetchBlob("X"), np.maximum(x, 0))
    np.testing.assert_array_equal(before, x)
    np.testing.assert_array_equal(workspace.FetchBlob("A"), x)
    # Now alone: overwritten in place, twice (Relu of Relu), as Caffe2 did.
    workspace.RunOperatorOnce(core.CreateOperator("Elu", ["X"], ["X"], alpha=0.5))
    workspace.RunOperatorOnce(core.CreateOperator("Relu", ["X"], ["X"]))
    np.testing.assert_array_equal(workspace.FetchBlob("X"), np.maximum(x, 0))
    assert workspace.FetchBlob("X").dtype == dtype
