"""The memory-bound CNN ops on tensors large enough to be split across the
kernel pool (issue 29): MaxPool and AveragePool by planes, SpatialBN,
Relu and its gradient, and Concat of contiguous inputs.

The small-shape tests (test_conv_ops.py and the elementwise tests) check
the values against numpy; here the split must give the same values: each
op on a large tensor is compared with numpy and with the same op run plane
by plane (a plane alone is below the split's threshold and runs on the
calling thread), bit for bit where the op's values are exact.
"""

import numpy as np
import pytest
from ferrocaffe import core, workspace

# (2, 16, 130, 129): 536,640 elements, past the 2^18 from which work is split.
SHAPE = (2, 16, 130, 129)


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


def pool_ref(x, k, s, p, mode, cip=False):
    """2-D NCHW pooling by numpy: the windows' taps inside the image."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    y = np.zeros((n, c, oh, ow), x.dtype)
    for i in range(oh):
        r0, r1 = max(i * s - p, 0), min(i * s - p + k, h)
        for j in range(ow):
            c0, c1 = max(j * s - p, 0), min(j * s - p + k, w)
            win = x[:, :, r0:r1, c0:c1]
            if mode == "max":
                y[:, :, i, j] = win.max(axis=(2, 3))
            else:
                count = k * k if cip else (r1 - r0) * (c1 - c0)
                y[:, :, i, j] = win.sum(axis=(2, 3)) / count
    return y


def per_plane(op_type, inputs, **kwargs):
    """The op's output built from runs on one (1, 1, H, W) plane at a time."""
    names = list(inputs)
    first = inputs[names[0]]
    out = None
    for b in range(first.shape[0]):
        for ch in range(first.shape[1]):
            (y,) = run(op_type, {k: v[b:b + 1, ch:ch + 1] for k, v in inputs.items()}, ["plane"], **kwargs)
            if out is None:
                out = np.zeros(first.shape[:2] + y.shape[2:], y.dtype)
            out[b, ch] = y[0, 0]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 2, 0), (3, 1, 1)])
def test_large_pooling_split_over_the_pool_matches_numpy_and_the_planes(fresh, dtype, mode, k, s, p):
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(dtype)
    op = "MaxPool" if mode == "max" else "AveragePool"
    (y,) = run(op, {"x": x}, ["y"], kernel=k, stride=s, pad=p)
    ref = pool_ref(x, k, s, p, mode)
    if mode == "max":
        np.testing.assert_array_equal(y, ref)
    else:
        tol = 1e-6 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(y, ref, rtol=tol, atol=tol)
    np.testing.assert_array_equal(y, per_plane(op, {"x": x}, kernel=k, stride=s, pad=p))


def test_large_average_pooling_counts_the_padding_when_asked(fresh):
    x = np.random.default_rng(1).standard_normal(SHAPE)
    (y,) = run("AveragePool", {"x": x}, ["y"], kernel=3, stride=2, pad=1, count_include_pad=1)
    np.testing.assert_allclose(y, pool_ref(x, 3, 2, 1, "avg", cip=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_large_global_pooling_matches_numpy(fresh, op):
    x = np.random.default_rng(2).standard_normal(SHAPE)
    (y,) = run(op, {"x": x}, ["y"], global_pooling=1)
    if op == "MaxPool":
        np.testing.assert_array_equal(y, x.max(axis=(2, 3), keepdims=True))
    else:
        np.testing.assert_allclose(y, x.mean(axis=(2, 3), keepdims=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_large_pooling_gradient_split_over_the_pool_matches_the_planes(fresh, op):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(SHAPE)
    (y,) = run(op, {"x": x}, ["y"], kernel=3, stride=2, pad=1)
    dy = rng.standard_normal(y.shape)
    grad = op + "Gradient"
    (dx,) = run(grad, {"x": x, "y": y, "dy": dy}, ["dx"], kernel=3, stride=2, pad=1)
    np.testing.assert_array_equal(dx, per_plane(grad, {"x": x, "y": y, "dy": dy}, kernel=3, stride=2, pad=1))
    # Each window's gradient is shared out over its taps in the image (all of
    # it to one for MaxPool): per plane the totals agree.
    np.testing.assert_allclose(dx.sum(axis=(2, 3)), dy.sum(axis=(2, 3)), rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_spatial_bn_matches_numpy(fresh, dtype):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(SHAPE) * 2 + 1).astype(dtype)
    c = SHAPE[1]
    scale, bias, mean = (rng.standard_normal(c).astype(dtype) for _ in range(3))
    var = (rng.random(c) + 0.5).astype(dtype)
    eps = float(np.float32(1e-5))
    b = (1, c, 1, 1)
    tol = 1e-5 if dtype == np.float32 else 1e-10
    (yt,) = run("SpatialBN", {"x": x, "s": scale, "b": bias, "m": mean, "v": var}, ["yt"], is_test=1, epsilon=eps)
    want = (x - mean.reshape(b)) / np.sqrt(var.reshape(b) + eps) * scale.reshape(b) + bias.reshape(b)
    np.testing.assert_allclose(yt, want, rtol=tol, atol=tol)
    y, _rm, _rv, sm, sis = run("SpatialBN", {"x": x, "s": scale, "b": bias, "rm": mean, "rv": var},
                               ["y", "rm", "rv", "sm", "sis"], epsilon=eps)
    x64 = x.astype(np.float64)
    mu, v = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))
    np.testing.assert_allclose(sm, mu, rtol=tol, atol=tol)
    np.testing.assert_allclose(sis, 1 / np.sqrt(v + eps), rtol=tol)
    want = (x64 - mu.reshape(b)) / np.sqrt(v.reshape(b) + eps) * scale.reshape(b) + bias.reshape(b)
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol)


def test_large_relu_and_its_gradient_are_exact(fresh):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    (y,) = run("Relu", {"x": x}, ["y"])
    np.testing.assert_array_equal(y, np.where(x > 0, x, np.float32(0)))
    dy = rng.standard_normal(SHAPE).astype(np.float32)
    (dx,) = run("ReluGradient", {"y": y, "dy": dy}, ["dx"])
    np.testing.assert_array_equal(dx, np.where(y > 0, dy, np.float32(0)))


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_concat_of_contiguous_inputs_matches_numpy(fresh, axis):
    rng = np.random.default_rng(6)
    shapes = [list(SHAPE) for _ in range(3)]
    for i, s in enumerate(shapes):
        s[axis] = [1, 3, 2][i]
    parts = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    y, split = run("Concat", {f"p{i}": p for i, p in enumerate(parts)}, ["y", "split"], axis=axis)
    np.testing.assert_array_equal(y, np.concatenate(parts, axis=axis))
    np.testing.assert_array_equal(split, [1, 3, 2])


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 2, 0), (3, 1, 1), (2, 1, 0), (3, 3, 0)])
def test_nchw_planes_give_the_bits_of_the_general_path(fresh, op, k, s, p):
    # NHWC goes through the general window loop; NCHW through the planes.
    # Same bits, NaN and signed zeros included (the first largest value of
    # a window wins).
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 5, 37, 70)).astype(np.float32)
    x[0, 0, 3, 3] = np.nan
    x[0, 1, :4, :4] = np.nan
    x[1, 2] = 0.0
    x[1, 2, ::2, ::3] = -0.0
    (y,) = run(op, {"x": x}, ["y"], kernel=k, stride=s, pad=p)
    (yh,) = run(op, {"xh": np.ascontiguousarray(np.moveaxis(x, 1, -1))}, ["yh"], kernel=k, stride=s, pad=p,
                order="NHWC")
    np.testing.assert_array_equal(y.view(np.uint32), np.moveaxis(yh, -1, 1).view(np.uint32))
