"""The convolutional-net ops (issue 15): Conv, ConvTranspose, MaxPool,
AveragePool, SpatialBN, LRN and ChannelShuffle.

Forward values are compared with plain-numpy references written here (a
sum over the kernel's offsets of strided slices of the padded input, and
einsum over channels: no im2col), over hypothesis-drawn shapes, strides,
pads, dilations, groups and both orders; every gradient op is checked
against float64 central differences (gradient_checker). Only numpy is the
reference: no ONNX Runtime or PyTorch in the test extra (see porting.md).
"""

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

SETTINGS = dict(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
GRAD_SETTINGS = dict(SETTINGS, max_examples=8)


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


def check_grad(op, inputs, which, outputs_with_grads=(0,), step=1e-6, tol=1e-5):
    gc = GradientChecker(stepsize=step, threshold=tol)
    for i in which:
        ok, grad, _est = gc.CheckSimple(op, inputs, i, list(outputs_with_grads))
        assert ok and grad.shape == np.shape(inputs[i])


def to_nhwc(a):
    return np.moveaxis(a, 1, -1)


def to_nchw(a):
    return np.moveaxis(a, -1, 1)


# ------------------------------------------------------------ references --


def window_slices(kk, dils, strides, out):
    return tuple(slice(k * d, k * d + (o - 1) * s + 1, s) for k, d, s, o in zip(kk, dils, strides, out))


def conv_ref(x, w, b, strides, pads, dils, group):
    """NCHW convolution: x (N, C, *sp), w (M, C/group, *k)."""
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nd + i]) for i in range(nd)])
    k = w.shape[2:]
    out = [(xp.shape[2 + i] - dils[i] * (k[i] - 1) - 1) // strides[i] + 1 for i in range(nd)]
    n, c = x.shape[:2]
    m = w.shape[0]
    cg, mg = c // group, m // group
    y = np.zeros((n, m, *out))
    for kk in np.ndindex(*k):
        patch = xp[(slice(None), slice(None)) + window_slices(kk, dils, strides, out)]
        for g in range(group):
            wk = w[(slice(g * mg, (g + 1) * mg), slice(None)) + kk]
            y[:, g * mg:(g + 1) * mg] += np.einsum("nc...,mc->nm...", patch[:, g * cg:(g + 1) * cg], wk)
    if b is not None:
        y += b.reshape((1, m) + (1,) * nd)
    return y


def conv_transpose_ref(x, w, b, strides, pads, adjs, group):
    """NCHW transposed convolution: x (N, C, *sp), w (C, M/group, *k): every
    input pixel scatters its kernel into the output."""
    nd = x.ndim - 2
    n, c = x.shape[:2]
    k = w.shape[2:]
    mg = w.shape[1]
    m, cg = mg * group, c // group
    full = [(x.shape[2 + i] - 1) * strides[i] + k[i] + adjs[i] for i in range(nd)]
    y = np.zeros((n, m, *full))
    for kk in np.ndindex(*k):
        sl = tuple(slice(kk[i], kk[i] + (x.shape[2 + i] - 1) * strides[i] + 1, strides[i]) for i in range(nd))
        for g in range(group):
            wk = w[(slice(g * cg, (g + 1) * cg), slice(None)) + kk]
            y[(slice(None), slice(g * mg, (g + 1) * mg)) + sl] += np.einsum(
                "nc...,cm->nm...", x[:, g * cg:(g + 1) * cg], wk)
    crop = tuple(slice(pads[i], full[i] - pads[nd + i]) for i in range(nd))
    y = y[(slice(None), slice(None)) + crop]
    if b is not None:
        y = y + b.reshape((1, m) + (1,) * nd)
    return y


def pool_ref(x, kernel, strides, pads, mode, count_include_pad=False):
    """NCHW pooling over windows inside the padded input; pads are skipped."""
    nd = x.ndim - 2
    width = [(0, 0), (0, 0)] + [(pads[i], pads[nd + i]) for i in range(nd)]
    xp = np.pad(x, width)
    inside = np.pad(np.ones_like(x), width)
    out = [(xp.shape[2 + i] - kernel[i]) // strides[i] + 1 for i in range(nd)]
    ones = [1] * nd
    patches = [xp[(slice(None), slice(None)) + window_slices(kk, ones, strides, out)] for kk in np.ndindex(*kernel)]
    masks = [inside[(slice(None), slice(None)) + window_slices(kk, ones, strides, out)] for kk in np.ndindex(*kernel)]
    p, m = np.stack(patches), np.stack(masks)
    if mode == "max":
        return np.where(m > 0, p, -np.inf).max(axis=0)
    count = np.full(m.shape[1:], m.shape[0]) if count_include_pad else m.sum(axis=0)
    return (p * m).sum(axis=0) / count


# ------------------------------------------------------------ strategies --


@st.composite
def conv_cases(draw, transposed=False, max_nd=3):
    nd = draw(st.integers(1, max_nd))
    group = draw(st.sampled_from([1, 1, 2]))
    cg = draw(st.integers(1, 3))
    mg = draw(st.integers(1, 3))
    n = draw(st.integers(1, 2))
    small = nd == 3
    k = [draw(st.integers(1, 2 if small else 3)) for _ in range(nd)]
    s = [draw(st.integers(1, 2)) for _ in range(nd)]
    d = [1] * nd if transposed else [draw(st.integers(1, 2)) for _ in range(nd)]
    p = [draw(st.integers(0, k[i % nd] - 1)) for i in range(2 * nd)]
    sp = []
    for i in range(nd):
        dk = d[i] * (k[i] - 1) + 1
        lo = 1 if transposed else max(1, dk - p[i] - p[nd + i])
        sp.append(draw(st.integers(lo, lo + (2 if small else 4))))
    if transposed:
        adj = [draw(st.integers(0, s[i] - 1)) for i in range(nd)]
        # The cropped output must stay non-empty.
        for i in range(nd):
            full = (sp[i] - 1) * s[i] + k[i] + adj[i]
            while p[i] + p[nd + i] >= full:
                p[i] = max(0, p[i] - 1)
                p[nd + i] = max(0, p[nd + i] - 1)
    else:
        adj = None
    order = draw(st.sampled_from(["NCHW", "NHWC"]))
    bias = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    return dict(nd=nd, group=group, cg=cg, mg=mg, n=n, k=k, s=s, d=d, p=p, sp=sp, adj=adj,
                order=order, bias=bias, seed=seed)


def conv_inputs(c, transposed=False, dtype=np.float64):
    rng = np.random.default_rng(c["seed"])
    cin = c["cg"] * c["group"]
    x = rng.standard_normal((c["n"], cin, *c["sp"]))
    if transposed:
        w = rng.standard_normal((cin, c["mg"], *c["k"]))
    else:
        w = rng.standard_normal((c["mg"] * c["group"], c["cg"], *c["k"]))
    b = rng.standard_normal(c["mg"] * c["group"]) if c["bias"] else None
    return x.astype(dtype), w.astype(dtype), None if b is None else b.astype(dtype)


def conv_args(c):
    args = dict(kernels=c["k"], strides=c["s"], pads=c["p"], order=c["order"])
    if c["adj"] is None:
        args["dilations"] = c["d"]
    else:
        args["adjs"] = c["adj"]
    if c["group"] != 1:
        args["group"] = c["group"]
    return args


def layout(c, x, w):
    """x and w in the case's order (NHWC: channels last; the filter's
    per-group channels last too)."""
    if c["order"] == "NHWC":
        return to_nhwc(x), to_nhwc(w)
    return x, w


# ----------------------------------------------------------------- Conv --


@settings(**SETTINGS)
@given(c=conv_cases())
def test_conv_forward_matches_numpy(fresh, c):
    x, w, b = conv_inputs(c)
    expected = conv_ref(x, w, b, c["s"], c["p"], c["d"], c["group"])
    xs, ws = layout(c, x, w)
    inputs = {"x": xs, "w": ws} | ({"b": b} if b is not None else {})
    (y,) = run("Conv", inputs, ["y"], **conv_args(c))
    if c["order"] == "NHWC":
        y = to_nchw(y)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-10)


@settings(**SETTINGS)
@given(c=conv_cases(max_nd=2))
def test_conv_float32_matches_numpy(fresh, c):
    x, w, b = conv_inputs(c, dtype=np.float32)
    expected = conv_ref(x.astype(np.float64), w.astype(np.float64), b, c["s"], c["p"], c["d"], c["group"])
    xs, ws = layout(c, x, w)
    inputs = {"x": xs, "w": ws} | ({"b": b} if b is not None else {})
    (y,) = run("Conv", inputs, ["y"], **conv_args(c))
    assert y.dtype == np.float32
    if c["order"] == "NHWC":
        y = to_nchw(y)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)


@settings(**GRAD_SETTINGS)
@given(c=conv_cases(max_nd=2))
def test_conv_gradient(fresh, c):
    x, w, b = conv_inputs(c)
    xs, ws = layout(c, x, w)
    inputs = [xs, ws] + ([b] if b is not None else [])
    names = ["x", "w"] + (["b"] if b is not None else [])
    op = core.CreateOperator("Conv", names, ["y"], **conv_args(c))
    check_grad(op, inputs, range(len(inputs)))


def test_conv_gradient_blob_names_and_no_bias(fresh):
    net = core.Net("n")
    net.Conv(["x", "w", "b"], "y", kernel=3)
    net.Conv(["y", "w2"], "z", kernel=1)
    net.AddGradientOperators(["z"])
    g2, g1 = net.Proto().op[3], net.Proto().op[4]
    assert g2.type == "ConvGradient" and list(g2.input) == ["y", "w2", "z_autogen_grad"]
    assert list(g2.output) == ["w2_grad", "y_grad"]
    assert any(a.name == "no_bias" and a.i == 1 for a in g2.arg)
    assert g1.type == "ConvGradient" and list(g1.input) == ["x", "w", "y_grad"]
    assert list(g1.output) == ["w_grad", "b_grad", "x_grad"]
    assert any(a.name == "kernel" and a.i == 3 for a in g1.arg)
    # no_gradient_to_input: no dX, so nothing flows further back.
    net2 = core.Net("n2")
    net2.Conv(["x", "w", "b"], "y", kernel=3)
    net2.Conv(["y", "w2"], "z", kernel=1, no_gradient_to_input=1)
    net2.AddGradientOperators(["z"])
    ops = net2.Proto().op
    assert [o.type for o in ops[2:]] == ["ConstantFill", "ConvGradient"]
    assert list(ops[3].output) == ["w2_grad"]


def test_conv_2d_arguments_and_kernel_from_filter(fresh):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 7, 6))
    w = rng.standard_normal((4, 3, 3, 2))
    expected = conv_ref(x, w, None, [2, 1], [1, 0, 2, 1], [1, 2], 1)
    (y,) = run("Conv", {"x": x, "w": w}, ["y"], kernel_h=3, kernel_w=2, stride_h=2, stride_w=1,
               pad_t=1, pad_l=0, pad_b=2, pad_r=1, dilation_h=1, dilation_w=2)
    np.testing.assert_allclose(y, expected, rtol=1e-12)
    # No kernel argument: the filter's spatial dims; engine hints accepted.
    (y2,) = run("Conv", {"x": x, "w": w}, ["y2"], stride_h=2, stride_w=1, pad_t=1, pad_l=0,
                pad_b=2, pad_r=1, dilations=[1, 2], use_cudnn=True, cudnn_exhaustive_search=False,
                ws_nbytes_limit=1 << 20, exhaustive_search=False, shared_buffer=1)
    np.testing.assert_allclose(y2, expected, rtol=1e-12)
    # Legacy padding SAME keeps the size at stride 1.
    (y3,) = run("Conv", {"x": x, "w": w}, ["y3"], kernel_h=3, kernel_w=2, legacy_pad=2)
    assert y3.shape == (2, 4, 7, 6)
    np.testing.assert_allclose(y3, conv_ref(x, w, None, [1, 1], [1, 0, 1, 1], [1, 1], 1), rtol=1e-12)


def test_conv_bad_input_is_a_typed_error(fresh):
    x = np.zeros((1, 3, 5, 5), np.float32)
    with pytest.raises(errors.ShapeError, match="channels"):
        run("Conv", {"x": x, "w": np.zeros((2, 2, 3, 3), np.float32)}, ["y"], kernel=3)
    with pytest.raises(errors.ShapeError, match="bias"):
        run("Conv", {"x": x, "w": np.zeros((2, 3, 3, 3), np.float32), "b": np.zeros(3, np.float32)},
            ["y"], kernel=3)
    with pytest.raises(errors.ShapeError, match="smaller than the dilated kernel"):
        run("Conv", {"x": x, "w": np.zeros((2, 3, 3, 3), np.float32)}, ["y"], kernel=3, dilation=3)
    with pytest.raises(errors.DataTypeError):
        run("Conv", {"x": x, "w": np.zeros((2, 3, 3, 3), np.float64)}, ["y"], kernel=3)
    with pytest.raises(errors.InvalidArgumentError, match="order"):
        run("Conv", {"x": x, "w": np.zeros((2, 3, 3, 3), np.float32)}, ["y"], kernel=3, order="CHWN")
    with pytest.raises(errors.InvalidArgumentError, match="stride"):
        run("Conv", {"x": x, "w": np.zeros((2, 3, 3, 3), np.float32)}, ["y"], kernel=3, stride=0)
    with pytest.raises(errors.InvalidArgumentError):
        run("Conv", {"x": x, "w": np.zeros((2, 3, 3, 3), np.float32)}, ["y"], kernel=3, pad=1, pads=[1] * 4)
    with pytest.raises(errors.ShapeError, match="dims"):
        run("Conv", {"x": np.zeros((3, 5), np.float32), "w": np.zeros((2, 3, 3), np.float32)}, ["y"])


# -------------------------------------------------------- ConvTranspose --


@settings(**SETTINGS)
@given(c=conv_cases(transposed=True))
# A tap of the window that no output pixel reaches (pad 2 on one side of a
# one-pixel image).
@example(c=dict(nd=1, group=1, cg=1, mg=1, n=1, k=[3], s=[1], d=[1], p=[0, 2], sp=[1], adj=[0], order="NCHW",
                bias=False, seed=0))
def test_conv_transpose_forward_matches_numpy(fresh, c):
    x, w, b = conv_inputs(c, transposed=True)
    expected = conv_transpose_ref(x, w, b, c["s"], c["p"], c["adj"], c["group"])
    xs, ws = layout(c, x, w)
    inputs = {"x": xs, "w": ws} | ({"b": b} if b is not None else {})
    (y,) = run("ConvTranspose", inputs, ["y"], **conv_args(c))
    if c["order"] == "NHWC":
        y = to_nchw(y)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-10)


@settings(**GRAD_SETTINGS)
@given(c=conv_cases(transposed=True, max_nd=2))
def test_conv_transpose_gradient(fresh, c):
    x, w, b = conv_inputs(c, transposed=True)
    xs, ws = layout(c, x, w)
    inputs = [xs, ws] + ([b] if b is not None else [])
    names = ["x", "w"] + (["b"] if b is not None else [])
    op = core.CreateOperator("ConvTranspose", names, ["y"], **conv_args(c))
    check_grad(op, inputs, range(len(inputs)))


# -------------------------------------------------------------- pooling --


@st.composite
def pool_cases(draw, max_nd=3):
    nd = draw(st.integers(1, max_nd))
    k = [draw(st.integers(1, 3)) for _ in range(nd)]
    s = [draw(st.integers(1, 3)) for _ in range(nd)]
    p = [draw(st.integers(0, k[i % nd] - 1)) for i in range(2 * nd)]
    sp = [draw(st.integers(max(1, k[i] - p[i] - p[nd + i]), 6 if nd < 3 else 4)) for i in range(nd)]
    return dict(nd=nd, k=k, s=s, p=p, sp=[max(a, 1) for a in sp], n=draw(st.integers(1, 2)),
                c=draw(st.integers(1, 3)), order=draw(st.sampled_from(["NCHW", "NHWC"])),
                cip=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)))


def pool_input(c):
    rng = np.random.default_rng(c["seed"])
    return rng.standard_normal((c["n"], c["c"], *c["sp"]))


@settings(**SETTINGS)
@given(c=pool_cases(), mode=st.sampled_from(["max", "avg"]))
def test_pool_forward_matches_numpy(fresh, c, mode):
    x = pool_input(c)
    expected = pool_ref(x, c["k"], c["s"], c["p"], mode, c["cip"])
    xs = to_nhwc(x) if c["order"] == "NHWC" else x
    op = "MaxPool" if mode == "max" else "AveragePool"
    (y,) = run(op, {"x": xs}, ["y"], kernels=c["k"], strides=c["s"], pads=c["p"], order=c["order"],
               count_include_pad=c["cip"])
    if c["order"] == "NHWC":
        y = to_nchw(y)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)


@settings(**GRAD_SETTINGS)
@given(c=pool_cases(max_nd=2), mode=st.sampled_from(["max", "avg"]))
def test_pool_gradient(fresh, c, mode):
    x = pool_input(c)
    xs = to_nhwc(x) if c["order"] == "NHWC" else x
    op = core.CreateOperator("MaxPool" if mode == "max" else "AveragePool", ["x"], ["y"], kernels=c["k"],
                             strides=c["s"], pads=c["p"], order=c["order"], count_include_pad=c["cip"])
    check_grad(op, [xs], [0])


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_global_pooling_and_2d_arguments(fresh, order):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4, 5))
    xs = to_nhwc(x) if order == "NHWC" else x
    (ymax, yavg) = (run(t, {"x": xs}, ["y" + t], global_pooling=1, order=order)[0]
                    for t in ("MaxPool", "AveragePool"))
    if order == "NHWC":
        ymax, yavg = to_nchw(ymax), to_nchw(yavg)
    np.testing.assert_allclose(ymax, x.max(axis=(2, 3), keepdims=True))
    np.testing.assert_allclose(yavg, x.mean(axis=(2, 3), keepdims=True))
    (y,) = run("MaxPool", {"x": x}, ["y2"], kernel=2, stride=2)
    np.testing.assert_allclose(y, pool_ref(x, [2, 2], [2, 2], [0] * 4, "max"))
    # Caffe's legacy pooling rounds the output size up.
    (y3,) = run("MaxPool", {"x": x}, ["y3"], kernel=3, stride=2, legacy_pad=3)
    assert y3.shape == (2, 3, 2, 2)
    np.testing.assert_allclose(y3, pool_ref(x, [3, 3], [2, 2], [0, 0, 1, 0], "max"))


@pytest.mark.parametrize("op_type", ["AveragePool", "MaxPool", "LpPool"])
def test_global_pooling_takes_neutral_window_values(fresh, op_type):
    # Caffe2 checks the values with global_pooling, not their presence:
    # DenseNet-121's last AveragePool has kernel 0, stride 1 and pad 0.
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5) / 7.0
    (y,) = run(op_type, {"x": x}, ["y"], global_pooling=1, kernel=0, stride=1, pad=0)
    (ref,) = run(op_type, {"x": x}, ["ref"], global_pooling=1)
    assert y.shape == (2, 3, 1, 1)
    np.testing.assert_array_equal(y, ref)
    for extra in ({"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1]},
                  {"stride_h": 1, "stride_w": 1, "pad_t": 0, "pad_l": 0, "pad_b": 0, "pad_r": 0}):
        (y2,) = run(op_type, {"x": x}, ["y2"], global_pooling=1, **extra)
        np.testing.assert_array_equal(y2, ref)
    for bad in ({"stride": 2}, {"pad": 1}, {"pads": [0, 0, 1, 0]}, {"dilation": 2}, {"strides": [1, 2]}):
        with pytest.raises(errors.InvalidArgumentError, match="global_pooling"):
            workspace.RunOperatorOnce(core.CreateOperator(op_type, ["x"], ["z"], global_pooling=1, **bad))


def test_max_pool_gradient_goes_to_one_max(fresh):
    x = np.array([[[[1.0, 1.0], [0.0, 1.0]]]])
    (y,) = run("MaxPool", {"x": x}, ["y"], kernel=2)
    (dx,) = run("MaxPoolGradient", {"x": x, "y": y, "dy": np.ones((1, 1, 1, 1))}, ["dx"], kernel=2)
    assert dx.sum() == 1.0 and dx[0, 0, 0, 0] == 1.0


# ------------------------------------------------------------ SpatialBN --


def bn_inputs(seed, shape, order):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2 + 1
    c = shape[1] if order == "NCHW" else shape[-1]
    return (x, rng.standard_normal(c), rng.standard_normal(c), rng.standard_normal(c), rng.random(c) + 0.5)


bn_shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(lambda s: s)


@settings(**SETTINGS)
@given(n=st.integers(2, 3), c=st.integers(1, 3), sp=st.lists(st.integers(1, 3), min_size=0, max_size=2),
       order=st.sampled_from(["NCHW", "NHWC"]), seed=st.integers(0, 2**31 - 1))
def test_spatial_bn_training_and_test(fresh, n, c, sp, order, seed):
    shape = (n, c, *sp) if order == "NCHW" else (n, *sp, c)
    x, scale, bias, mean, var = bn_inputs(seed, shape, order)
    axes = tuple(i for i in range(len(shape)) if i != (1 if order == "NCHW" else len(shape) - 1))
    bshape = [1] * len(shape)
    bshape[1 if order == "NCHW" else -1] = c
    mu, v = x.mean(axis=axes), x.var(axis=axes)
    # The op reads float arguments as float32.
    eps, mom = float(np.float32(1e-3)), float(np.float32(0.8))
    y, rm, rv, sm, sis = run("SpatialBN", {"x": x, "s": scale, "b": bias, "rm": mean, "rv": var},
                             ["y", "rm", "rv", "sm", "sis"], epsilon=eps, momentum=mom, order=order)
    np.testing.assert_allclose(
        y, (x - mu.reshape(bshape)) / np.sqrt(v.reshape(bshape) + eps) * scale.reshape(bshape) + bias.reshape(bshape),
        rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(rm, mom * mean + (1 - mom) * mu, rtol=1e-12)
    # The running variance takes the unbiased estimate (Caffe2's rule).
    size = x.size // c
    unbiased = v * size / (size - 1) if size > 1 else v
    np.testing.assert_allclose(rv, mom * var + (1 - mom) * unbiased, rtol=1e-12)
    np.testing.assert_allclose(sm, mu, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sis, 1 / np.sqrt(v + eps), rtol=1e-12)
    (yt,) = run("SpatialBN", {"x": x, "s": scale, "b": bias, "m": mean, "v": var}, ["yt"], is_test=1,
                epsilon=eps, order=order)
    np.testing.assert_allclose(
        yt, (x - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape) + eps) * scale.reshape(bshape)
        + bias.reshape(bshape), rtol=1e-10, atol=1e-10)


@settings(**GRAD_SETTINGS)
@given(n=st.integers(2, 3), c=st.integers(1, 3), sp=st.lists(st.integers(1, 3), min_size=1, max_size=2),
       order=st.sampled_from(["NCHW", "NHWC"]), is_test=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_spatial_bn_gradient(fresh, n, c, sp, order, is_test, seed):
    shape = (n, c, *sp) if order == "NCHW" else (n, *sp, c)
    inputs = list(bn_inputs(seed, shape, order))
    outs = ["y"] if is_test else ["y", "rm", "rv", "sm", "sis"]
    ins = ["x", "s", "b", "rm", "rv"]
    op = core.CreateOperator("SpatialBN", ins, outs, order=order, is_test=int(is_test), epsilon=1e-3)
    check_grad(op, inputs, [0, 1, 2], step=1e-5, tol=1e-4)


def test_spatial_bn_needs_in_place_running_stats(fresh):
    x = np.ones((2, 3, 2, 2))
    with pytest.raises(errors.InvalidArgumentError, match="in-place"):
        run("SpatialBN", {"x": x, "s": np.ones(3), "b": np.ones(3), "m": np.ones(3), "v": np.ones(3)},
            ["y", "m2", "v", "sm", "sis"])
    with pytest.raises(errors.InvalidArgumentError, match="5 without"):
        run("SpatialBN", {"x": x, "s": np.ones(3), "b": np.ones(3), "m": np.ones(3), "v": np.ones(3)}, ["y"])
    with pytest.raises(errors.ShapeError, match="scale"):
        run("SpatialBN", {"x": x, "s": np.ones(2), "b": np.ones(3), "m": np.ones(3), "v": np.ones(3)},
            ["y"], is_test=1)


def test_spatial_bn_writes_y_over_x_and_saved_statistics_over_the_sums(fresh):
    # Caffe2's schema allows Y in place on X, and (several batches) the
    # saved mean and inverse std in place on the sums.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 4))
    scale, bias = np.array([1.5, -0.5]), np.array([0.25, 2.0])
    mu, v = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    want = (x - mu[None, :, None]) / np.sqrt(v[None, :, None] + 1.0) * scale[None, :, None] + bias[None, :, None]
    y, rm, rv, sm, sis = run("SpatialBN", {"x": x, "s": scale, "b": bias, "rm": np.zeros(2), "rv": np.ones(2)},
                             ["x", "rm", "rv", "sm", "sis"], epsilon=1.0, momentum=0.5)
    np.testing.assert_allclose(y, want, rtol=1e-12)
    np.testing.assert_allclose(rv, 0.5 + 0.5 * v * 12 / 11, rtol=1e-12)
    sums, sumsq = x.sum(axis=(0, 2)) * 2, (x * x).sum(axis=(0, 2)) * 2
    y, _, _, sm, sis = run(
        "SpatialBN", {"x": x, "s": scale, "b": bias, "rm": np.zeros(2), "rv": np.ones(2), "bm": sums, "bv": sumsq},
        ["y", "rm", "rv", "bm", "bv"], epsilon=1.0, momentum=0.5, num_batches=2)
    np.testing.assert_allclose(y, want, rtol=1e-9)
    np.testing.assert_allclose(sm, mu, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(sis, 1 / np.sqrt(v + 1.0), rtol=1e-9)


def test_spatial_bn_on_an_empty_batch_keeps_the_running_statistics(fresh):
    x = np.zeros((0, 3, 2))
    ins = {"x": x, "s": np.ones(3), "b": np.ones(3), "rm": np.array([1.0, 2.0, 3.0]), "rv": np.array([4.0, 5.0, 6.0])}
    y, rm, rv, sm, sis = run("SpatialBN", ins, ["y", "rm", "rv", "sm", "sis"], momentum=0.5)
    assert y.shape == (0, 3, 2)
    np.testing.assert_array_equal(rm, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(rv, [4.0, 5.0, 6.0])
    np.testing.assert_array_equal(sm, np.zeros(3))
    np.testing.assert_array_equal(sis, np.zeros(3))
    (yt,) = run("SpatialBN", ins, ["yt"], is_test=1)
    assert yt.shape == (0, 3, 2)
    # Backward, an empty batch has zero scale and bias gradients, even when
    # it is given other batches' sums.
    grad_ins = {"x": x, "s": np.ones(3), "dy": x, "sm": np.ones(3), "sis": np.ones(3),
                "dss": np.full(3, 7.0), "dbs": np.full(3, 9.0)}
    dx, ds, db = run("SpatialBNGradient", grad_ins, ["dx", "ds", "db"], num_batches=2)
    assert dx.shape == (0, 3, 2)
    np.testing.assert_array_equal(ds, np.zeros(3))
    np.testing.assert_array_equal(db, np.zeros(3))


def test_spatial_bn_starts_uninitialised_running_statistics_at_zero(fresh):
    # One element per channel: no unbiased variance exists, the biased one
    # (0) is kept (Caffe2 multiplied it by infinity).
    x = np.array([[[2.0]], [[4.0]]]).reshape(2, 1, 1)
    y, rm, rv, sm, sis = run("SpatialBN", {"x": x, "s": np.ones(1), "b": np.zeros(1), "rm": np.zeros(0),
                                           "rv": np.zeros(0)}, ["y", "rm", "rv", "sm", "sis"], momentum=0.75,
                             epsilon=1e-5)
    np.testing.assert_allclose(rm, [0.25 * 3.0])
    np.testing.assert_allclose(rv, [0.25 * 1.0 * 2 / 1])
    x1 = np.array([[[7.0]]])
    _, _, rv1, _, _ = run("SpatialBN", {"x": x1, "s": np.ones(1), "b": np.zeros(1), "rm": np.zeros(1),
                                        "rv": np.ones(1)}, ["y", "rm", "rv", "sm", "sis"], momentum=0.75)
    np.testing.assert_allclose(rv1, [0.75])


def bn_over_batches_ref(xs, scale, bias, eps, order):
    """numpy: batch normalisation of the batches xs concatenated along N
    (statistics over all of them), split back into the batches."""
    x = np.concatenate(xs)
    ch = 1 if order == "NCHW" else x.ndim - 1
    axes = tuple(i for i in range(x.ndim) if i != ch)
    shape = [1] * x.ndim
    shape[ch] = -1
    mu, var = x.mean(axis=axes), x.var(axis=axes)
    y = (x - mu.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)
    return np.split(y, len(xs)), mu, var


@settings(**GRAD_SETTINGS)
@given(k=st.integers(2, 3), n=st.integers(1, 2), c=st.integers(1, 3), sp=st.lists(st.integers(1, 3), min_size=1, max_size=2),
       order=st.sampled_from(["NCHW", "NHWC"]), seed=st.integers(0, 2**31 - 1))
def test_spatial_bn_over_several_batches(fresh, k, n, c, sp, order, seed):
    # Caffe2's multi-batch batch normalisation (data_parallel_model's
    # combined SpatialBN): each of k batches adds its ChannelStats, every
    # SpatialBN(num_batches=k) normalises with the statistics of all of
    # them; backward, each batch's ChannelBackpropStats are summed into the
    # blobs the gradient maker names for the scale and bias gradients.
    # Checked against numpy over the concatenated batches, the input
    # gradient by central differences of that numpy forward pass.
    rng = np.random.default_rng(seed)
    shape = (n, c, *sp) if order == "NCHW" else (n, *sp, c)
    xs = [rng.standard_normal(shape) * 2 + 1 for _ in range(k)]
    gs = [rng.standard_normal(shape) for _ in range(k)]
    scale, bias = rng.standard_normal(c), rng.standard_normal(c)
    eps, mom = float(np.float32(1e-3)), float(np.float32(0.8))
    args = dict(order=order, epsilon=eps, momentum=mom, num_batches=k)
    fwd, ops = [], []
    for b in range(k):
        workspace.FeedBlob("x%d" % b, xs[b])
        workspace.FeedBlob("y%d_grad" % b, gs[b])
        for name, v in (("s", scale), ("b", bias), ("rm", np.zeros(c)), ("rv", np.ones(c))):
            workspace.FeedBlob("%s%d" % (name, b), v)
        fwd.append(core.CreateOperator("ChannelStats", ["x%d" % b], ["sum%d" % b, "sumsq%d" % b], order=order))
    fwd.append(core.CreateOperator("Sum", ["sum%d" % b for b in range(k)], "sums"))
    fwd.append(core.CreateOperator("Sum", ["sumsq%d" % b for b in range(k)], "sumsq"))
    for b in range(k):
        op = core.CreateOperator(
            "SpatialBN", ["x%d" % b, "s%d" % b, "b%d" % b, "rm%d" % b, "rv%d" % b, "sums", "sumsq"],
            ["y%d" % b, "rm%d" % b, "rv%d" % b, "sm%d" % b, "sis%d" % b], **args)
        fwd.append(op)
        ops.append(op)
    for op in fwd:
        workspace.RunOperatorOnce(op)
    want, mu, var = bn_over_batches_ref(xs, scale, bias, eps, order)
    for b in range(k):
        np.testing.assert_allclose(workspace.FetchBlob("y%d" % b), want[b], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(workspace.FetchBlob("sm%d" % b), mu, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(workspace.FetchBlob("sis%d" % b), 1 / np.sqrt(var + eps), rtol=1e-9)
        np.testing.assert_allclose(workspace.FetchBlob("rm%d" % b), (1 - mom) * mu, rtol=1e-9, atol=1e-12)
        size = k * xs[0].size // c
        np.testing.assert_allclose(workspace.FetchBlob("rv%d" % b), mom + (1 - mom) * var * size / (size - 1),
                                   rtol=1e-9)

    bwd = [core.CreateOperator("ChannelBackpropStats", ["x%d" % b, "sm%d" % b, "sis%d" % b, "y%d_grad" % b],
                               ["ds%d" % b, "db%d" % b], order=order) for b in range(k)]
    for b in range(k):
        grad_ops, g = core.GradientRegistry.GetGradientForOp(ops[b], ["y%d_grad" % b, None, None, None, None])
        assert [list(o.input) for o in grad_ops] == [
            ["x%d" % b, "s%d" % b, "y%d_grad" % b, "sm%d" % b, "sis%d" % b, "s%d_grad" % b, "b%d_grad" % b]]
        assert g == ["x%d_grad" % b, "s%d_grad" % b, "b%d_grad" % b, None, None, None, None]
        bwd.append(core.CreateOperator("Sum", ["ds%d" % i for i in range(k)], "s%d_grad" % b))
        bwd.append(core.CreateOperator("Sum", ["db%d" % i for i in range(k)], "b%d_grad" % b))
        bwd.extend(grad_ops)
    for op in bwd:
        workspace.RunOperatorOnce(op)

    def loss(x_all):
        ys, _, _ = bn_over_batches_ref(np.split(x_all, k), scale, bias, eps, order)
        return sum(float((y * g).sum()) for y, g in zip(ys, gs))

    x_all, h = np.concatenate(xs), 1e-6
    numeric = np.zeros_like(x_all)
    for i in np.ndindex(*x_all.shape):
        up, down = x_all.copy(), x_all.copy()
        up[i] += h
        down[i] -= h
        numeric[i] = (loss(up) - loss(down)) / (2 * h)
    ch = 1 if order == "NCHW" else len(shape) - 1
    axes = tuple(i for i in range(len(shape)) if i != ch)
    xhat = (x_all - mu.reshape([-1 if i == ch else 1 for i in range(len(shape))])) / np.sqrt(
        var.reshape([-1 if i == ch else 1 for i in range(len(shape))]) + eps)
    g_all = np.concatenate(gs)
    for b, numeric_b in enumerate(np.split(numeric, k)):
        np.testing.assert_allclose(workspace.FetchBlob("x%d_grad" % b), numeric_b, rtol=1e-5, atol=1e-6)
        # Each batch's share of the scale and bias gradients.
        np.testing.assert_allclose(workspace.FetchBlob("s%d_grad" % b), (g_all * xhat).sum(axis=axes) / k, rtol=1e-9)
        np.testing.assert_allclose(workspace.FetchBlob("b%d_grad" % b), g_all.sum(axis=axes) / k, rtol=1e-9)


def test_spatial_bn_several_batches_errors(fresh):
    x = np.ones((2, 3, 2))
    ins = {"x": x, "s": np.ones(3), "b": np.ones(3), "m": np.ones(3), "v": np.ones(3)}
    with pytest.raises(errors.InvalidArgumentError, match="7 inputs"):
        run("SpatialBN", ins, ["y", "m", "v", "sm", "sis"], num_batches=2)
    with pytest.raises(errors.InvalidArgumentError, match="num_batches must be >= 1"):
        run("SpatialBN", ins, ["y", "m", "v", "sm", "sis"], num_batches=0)
    with pytest.raises(errors.ShapeError, match="sums"):
        run("SpatialBN", dict(ins, sums=np.ones(2), sumsq=np.ones(3)), ["y", "m", "v", "sm", "sis"], num_batches=2)
    with pytest.raises(errors.InvalidArgumentError, match="7 inputs"):
        core.GradientRegistry.GetGradientForOp(
            core.CreateOperator("SpatialBN", list(ins), ["y", "m", "v", "sm", "sis"], num_batches=2),
            ["y_grad", None, None, None, None])
    # With is_test the statistics are the given ones, whatever num_batches.
    (y,) = run("SpatialBN", ins, ["y"], is_test=1, num_batches=2, epsilon=1.0)
    np.testing.assert_allclose(y, np.full_like(x, 1.0))


# ------------------------------------------------------------------ LRN --


def lrn_ref(x, size, alpha, beta, bias):
    c = x.shape[1]
    pre = (size - 1) // 2
    scale = np.full_like(x, bias)
    for ch in range(c):
        lo, hi = max(0, ch - pre), min(c, ch - pre + size)
        scale[:, ch] += alpha / size * (x[:, lo:hi] ** 2).sum(axis=1)
    return x * scale ** -beta, scale


@settings(**SETTINGS)
@given(n=st.integers(1, 2), c=st.integers(1, 6), hw=st.integers(1, 3), size=st.sampled_from([1, 3, 5]),
       order=st.sampled_from(["NCHW", "NHWC"]), seed=st.integers(0, 2**31 - 1))
def test_lrn_forward_and_gradient(fresh, n, c, hw, size, order, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, hw, hw))
    args = dict(size=size, alpha=0.3, beta=0.75, bias=2.0, order=order)
    y_ref, s_ref = lrn_ref(x, size, 0.3, 0.75, 2.0)
    xs = to_nhwc(x) if order == "NHWC" else x
    y, s = run("LRN", {"x": xs}, ["y", "scale"], **args)
    if order == "NHWC":
        y, s = to_nchw(y), to_nchw(s)
    np.testing.assert_allclose(y, y_ref, rtol=1e-6)
    np.testing.assert_allclose(s, s_ref, rtol=1e-6)
    check_grad(core.CreateOperator("LRN", ["x"], ["y"], **args), [xs], [0])


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_lrn_on_a_tensor_split_across_the_pool(fresh, order):
    # 2 x 16 x 40 x 40 float32 (past the size LRN splits across the kernel
    # pool, by planes or pixels): the float64 reference's values.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 16, 40, 40)).astype(np.float32)
    y_ref, s_ref = lrn_ref(x.astype(np.float64), 5, 1e-2, 0.75, 1.0)
    xs = to_nhwc(x) if order == "NHWC" else x
    y, s = run("LRN", {"x": xs}, ["y", "scale"], size=5, alpha=1e-2, beta=0.75, bias=1.0, order=order)
    if order == "NHWC":
        y, s = to_nchw(y), to_nchw(s)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, y_ref, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(s, s_ref, rtol=2e-6)


# ------------------------------------------------------- ChannelShuffle --


@settings(**SETTINGS)
@given(n=st.integers(1, 2), group=st.integers(1, 3), k=st.integers(1, 3), hw=st.integers(1, 3),
       order=st.sampled_from(["NCHW", "NHWC"]))
def test_channel_shuffle_and_gradient(fresh, n, group, k, hw, order):
    c = group * k
    x = np.random.default_rng(n * 100 + c).standard_normal((n, c, hw))
    ref = x.reshape(n, group, k, hw).transpose(0, 2, 1, 3).reshape(n, c, hw)
    xs = to_nhwc(x) if order == "NHWC" else x
    (y,) = run("ChannelShuffle", {"x": xs}, ["y"], group=group, order=order)
    np.testing.assert_array_equal(to_nchw(y) if order == "NHWC" else y, ref)
    check_grad(core.CreateOperator("ChannelShuffle", ["x"], ["y"], group=group, order=order), [xs], [0])


@pytest.mark.parametrize("n,order,group", [(1, "NCHW", 1), (4, "NCHW", 2), (1, "NHWC", 1), (3, "NHWC", 1)])
def test_conv_large_shapes_forward_and_gradients_match_numpy(fresh, n, order, group):
    """Shapes large enough for the parallel paths (the images of a batch on
    the kernel pool; one image's products split by rows); the gradients
    against numpy: dW by einsum over the input's windows, dX as the
    transposed convolution of dY."""
    rng = np.random.default_rng(n)
    c, m, h, k, s, p = 16, 32, 17, 3, 2, 1
    x = rng.standard_normal((n, c, h, h))
    w = rng.standard_normal((m, c // group, k, k))
    b = rng.standard_normal(m)
    y_ref = conv_ref(x, w, b, [s, s], [p] * 4, [1, 1], group)
    o = y_ref.shape[-1]
    dy = rng.standard_normal(y_ref.shape)
    xp = np.pad(x, [(0, 0), (0, 0), (p, p), (p, p)])
    cg, mg = c // group, m // group
    dw_ref = np.zeros_like(w)
    for kk in np.ndindex(k, k):
        patch = xp[(slice(None), slice(None)) + window_slices(kk, [1, 1], [s, s], [o, o])]
        for g in range(group):
            dw_ref[(slice(g * mg, (g + 1) * mg), slice(None)) + kk] = np.einsum(
                "nmij,ncij->mc", dy[:, g * mg:(g + 1) * mg], patch[:, g * cg:(g + 1) * cg])
    adj = h + 2 * p - ((o - 1) * s + k)
    # Conv's filter (M, C/group, k, k) is the transposed conv's from M to C.
    dx_ref = conv_transpose_ref(dy, w, None, [s, s], [p] * 4, [adj, adj], group)
    if order == "NHWC":
        x, w, dy = to_nhwc(x), to_nhwc(w), to_nhwc(dy)
    args = dict(kernel=k, stride=s, pad=p, order=order, group=group)
    (y,) = run("Conv", {"x": x, "w": w, "b": b}, ["y"], **args)
    dw, db, dx = run("ConvGradient", {"x": x, "w": w, "dy": dy}, ["dw", "db", "dx"], **args)
    if order == "NHWC":
        y, dw, dx, dy = to_nchw(y), to_nchw(dw), to_nchw(dx), to_nchw(dy)
    np.testing.assert_allclose(y, y_ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dw, dw_ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 2, 3)), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dx, dx_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "c, m, hw, k, stride, pad, group",
    [
        (16, 32, (32, 32), 3, 1, 1, 1),  # two line blocks
        (8, 24, (45, 37), 3, 2, 0, 1),  # odd sizes, stride 2
        (12, 12, (40, 40), 5, 1, 2, 3),  # groups
        (3, 64, (64, 64), 7, 2, 3, 1),  # a ResNet stem on a small image
    ],
)
@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
def test_a_single_large_image_split_over_the_pool_matches_numpy(fresh, order, dtype, c, m, hw, k, stride, pad, group):
    # One image with a large enough product goes to the kernel pool block
    # by block (NCHW: of output lines; NHWC: of output pixels), im2col and
    # product each; every block must land in its own columns (NCHW) or
    # rows (NHWC) of the output.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, c, *hw)).astype(dtype)
    w = rng.standard_normal((m, c // group, k, k)).astype(dtype)
    b = rng.standard_normal(m).astype(dtype)
    xs, ws = (to_nhwc(x), to_nhwc(w)) if order == "NHWC" else (x, w)
    (y,) = run("Conv", {"x": xs, "w": ws, "b": b}, ["y"], kernel=k, stride=stride, pad=pad, group=group, order=order)
    if order == "NHWC":
        y = to_nchw(y)
    ref = conv_ref(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), [stride] * 2, [pad] * 4, [1, 1], group)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(y, ref, rtol=tol, atol=tol * np.sqrt(c * k * k))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "c, m, hw, k, stride, pad, group",
    [
        (16, 32, (32, 32), 3, 1, 1, 1),  # several line blocks
        (5, 64, (45, 37), 3, 2, 0, 1),  # odd sizes, stride 2, channel blocks of unequal size
        (12, 12, (40, 40), 5, 1, 2, 3),  # groups
        (3, 64, (64, 64), 7, 2, 3, 1),  # a ResNet stem on a small image
    ],
)
def test_a_single_large_image_gradients_split_over_the_pool_match_numpy(
        fresh, dtype, c, m, hw, k, stride, pad, group):
    # One image with a large enough product computes dX and dW on the
    # kernel pool in blocks of input channels (each its own rows of the
    # window matrix, its own channels of dX and its own columns of dW); dX
    # is the transposed convolution of dY, dW an einsum over the windows.
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, c, *hw)).astype(dtype)
    w = rng.standard_normal((m, c // group, k, k)).astype(dtype)
    out = [(s + 2 * pad - k) // stride + 1 for s in hw]
    dy = rng.standard_normal((1, m, *out)).astype(dtype)
    args = dict(kernel=k, stride=stride, pad=pad, group=group)
    dw, db, dx = run("ConvGradient", {"x": x, "w": w, "dy": dy}, ["dw", "db", "dx"], **args)
    adjs = [s + 2 * pad - ((o - 1) * stride + k) for s, o in zip(hw, out)]
    ref = conv_transpose_ref(dy.astype(np.float64), w.astype(np.float64), None, [stride] * 2, [pad] * 4, adjs, group)
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    cg, mg = c // group, m // group
    dw_ref = np.zeros(w.shape)
    for kk in np.ndindex(k, k):
        patch = xp[(slice(None), slice(None)) + window_slices(kk, [1, 1], [stride] * 2, out)]
        for g in range(group):
            dw_ref[(slice(g * mg, (g + 1) * mg), slice(None)) + kk] = np.einsum(
                "nmij,ncij->mc", dy[:, g * mg:(g + 1) * mg].astype(np.float64), patch[:, g * cg:(g + 1) * cg])
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(dx, ref, rtol=tol, atol=tol * np.sqrt(m * k * k))
    np.testing.assert_allclose(dw, dw_ref, rtol=tol, atol=tol * np.sqrt(np.prod(out)))
    np.testing.assert_allclose(db, dy.astype(np.float64).sum(axis=(0, 2, 3)), rtol=tol, atol=tol * np.sqrt(np.prod(out)))
