"""NHWC2NCHW / NCHW2NHWC, MakeTwoClass and Flatten at axis == ndim
(issue 35), against numpy models written here; their gradients are
checked by central differences in tests/train/test_op_gradients.py."""

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace


def run(op_type, x, n_out=1, **kwargs):
    workspace.FeedBlob("x", x)
    outs = ["y%d" % i for i in range(n_out)]
    workspace.RunOperatorOnce(core.CreateOperator(op_type, ["x"], outs, **kwargs))
    return workspace.FetchBlob(outs[0])


def channels_first(x):
    # (N, spatial..., C) -> (N, C, spatial...), by explicit index copying.
    n, c = x.shape[0], x.shape[-1]
    out = np.empty((n, c) + x.shape[1:-1], x.dtype)
    for i in range(n):
        for k in range(c):
            out[i, k] = x[i, ..., k]
    return out


def channels_last(x):
    n, c = x.shape[0], x.shape[1]
    out = np.empty((n,) + x.shape[2:] + (c,), x.dtype)
    for i in range(n):
        for k in range(c):
            out[i, ..., k] = x[i, k]
    return out


@pytest.mark.parametrize("shape", [(2, 3, 4), (2, 3, 4, 5), (1, 2, 3, 2, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8])
def test_order_switch_moves_the_channel_dim(fresh, shape, dtype):
    x = (np.arange(np.prod(shape)) % 251).astype(dtype).reshape(shape)
    y = run("NHWC2NCHW", x)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, channels_first(x))
    z = run("NCHW2NHWC", x)
    np.testing.assert_array_equal(z, channels_last(x))
    np.testing.assert_array_equal(run("NCHW2NHWC", y), x)


@pytest.mark.parametrize("op", ["NHWC2NCHW", "NCHW2NHWC"])
def test_order_switch_needs_three_dims(fresh, op):
    with pytest.raises(errors.ShapeError, match="at least 3 dims"):
        run(op, np.zeros((2, 3), np.float32))


def test_order_switch_gradients_are_each_other(fresh):
    from ferrocaffe import gradients  # noqa: F401  (the makers register on import)
    for fwd, back in (("NHWC2NCHW", "NCHW2NHWC"), ("NCHW2NHWC", "NHWC2NCHW")):
        op = core.CreateOperator(fwd, ["x"], ["y"])
        ops, g_in = core.GradientRegistry.GetGradientForOp(op, ["y_grad"])
        assert [o.type for o in ops] == [back]
        assert list(ops[0].input) == ["y_grad"] and g_in == ["x_grad"]


def test_make_two_class(fresh):
    x = np.array([[0.0, 0.25], [0.5, 1.0], [0.9, 0.125]], np.float64)
    y = run("MakeTwoClass", x)
    assert y.shape == (3, 2, 2) and y.dtype == np.float64
    want = np.empty((3, 2, 2))
    for idx in np.ndindex(x.shape):
        want[idx] = [1.0 - x[idx], x[idx]]
    np.testing.assert_allclose(y, want)
    y32 = run("MakeTwoClass", np.array([0.3], np.float32))
    assert y32.dtype == np.float32 and y32.shape == (1, 2)
    np.testing.assert_allclose(y32, [[0.7, 0.3]], rtol=1e-6)


def test_make_two_class_gradient(fresh):
    dy = np.array([[[1.0, 3.0], [-2.0, 0.5]]])
    dx = run("MakeTwoClassGradient", dy)
    np.testing.assert_allclose(dx, [[2.0, 2.5]])
    op = core.CreateOperator("MakeTwoClass", ["x"], ["y"])
    ops, g_in = core.GradientRegistry.GetGradientForOp(op, ["y_grad"])
    assert [o.type for o in ops] == ["MakeTwoClassGradient"] and g_in == ["x_grad"]


def test_make_two_class_bad_inputs(fresh):
    with pytest.raises(errors.InvalidArgumentError, match=r"\[0, 1\]"):
        run("MakeTwoClass", np.array([0.5, 1.5], np.float32))
    with pytest.raises(errors.DataTypeError):
        run("MakeTwoClass", np.array([0, 1], np.int32))
    with pytest.raises(errors.ShapeError, match="last dim of 2"):
        run("MakeTwoClassGradient", np.zeros((2, 3), np.float32))


def test_flatten_axis_may_be_ndim(fresh):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(run("Flatten", x, axis=3), x.reshape(24, 1))
    np.testing.assert_array_equal(run("Flatten", x, axis=0), x.reshape(1, 24))
    with pytest.raises(errors.InvalidArgumentError):
        run("Flatten", x, axis=4)


def test_lengths_to_shape_takes_int32_lengths_only_as_caffe2(fresh):
    # Caffe2's kernel read the lengths as int32 (one type, no dispatch).
    np.testing.assert_array_equal(run("LengthsToShape", np.array([3, 3], np.int32)), [2, 3])
    with pytest.raises(errors.DataTypeError, match="int32"):
        run("LengthsToShape", np.array([3, 3], np.int64))
