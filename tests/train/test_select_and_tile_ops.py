"""Tile, Expand, ArgMax/ArgMin, TopK, OneHot and BooleanMask against numpy
written here, and their gradients by central differences."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker

SETTINGS = dict(deadline=None, max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


def check_grad(op, inputs, i=0):
    ok, grad, est = GradientChecker(stepsize=1e-6, threshold=1e-5).CheckSimple(op, inputs, i, [0])
    assert ok, (grad, est)


shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3)


@settings(**SETTINGS)
@given(shape=shapes, data=st.data(), tiles=st.integers(0, 3))
def test_tile_repeats_along_the_axis(fresh, shape, data, tiles):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    reps = [1] * len(shape)
    reps[axis] = tiles
    (y,) = run("Tile", {"x": x}, ["y"], tiles=tiles, axis=axis)
    np.testing.assert_array_equal(y, np.tile(x, reps))
    # tiles and axis from inputs; an int tensor tiles too.
    (y2,) = run("Tile", {"xi": x.astype(np.int64), "t": np.array([tiles], np.int32),
                         "a": np.array([axis], np.int64)}, ["y2"])
    np.testing.assert_array_equal(y2, np.tile(x, reps).astype(np.int64))


def test_tile_gradient_sums_the_copies(fresh):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3))
    check_grad(core.CreateOperator("Tile", ["x"], ["y"], tiles=3, axis=1), [x])
    dy = rng.standard_normal((2, 9))
    (dx,) = run("TileGradient", {"dy": dy}, ["dx"], tiles=3, axis=1)
    np.testing.assert_allclose(dx, dy[:, 0:3] + dy[:, 3:6] + dy[:, 6:9])
    grads = core.GradientRegistry.GetGradientForOp(core.CreateOperator("Tile", ["x", "t"], ["y"]), ["y_grad"])
    assert [list(o.input) for o in grads[0]] == [["y_grad", "t"]] and grads[1] == ["x_grad", None]
    with pytest.raises(errors.InvalidArgumentError, match="tiles must be >= 0"):
        run("Tile", {"x": x}, ["y"], tiles=-1)
    with pytest.raises(errors.ShapeError, match="one element"):
        run("Tile", {"x": x, "t": np.array([1, 2], np.int64)}, ["y"])


@pytest.mark.parametrize("xs,shape", [((3, 1), (3, 4)), ((1,), (2, 3)), ((2, 1, 3), (4, 1)), ((3,), (1, 1, 3))])
def test_expand_broadcasts_like_numpy(fresh, xs, shape):
    x = np.arange(np.prod(xs), dtype=np.float64).reshape(xs) + 1
    (y,) = run("Expand", {"x": x, "s": np.array(shape, np.int64)}, ["y"])
    want = x * np.ones(shape)
    np.testing.assert_array_equal(y, want)
    check_grad(core.CreateOperator("Expand", ["x", "s"], ["y"]), [x, np.array(shape, np.int64)])


def test_expand_errors(fresh):
    with pytest.raises(errors.ShapeError, match="cannot broadcast"):
        run("Expand", {"x": np.ones((3, 2)), "s": np.array([4, 3], np.int64)}, ["y"])
    with pytest.raises(errors.DataTypeError, match="int32 or int64"):
        run("Expand", {"x": np.ones(3), "s": np.array([3.0])}, ["y"])


@settings(**SETTINGS)
@given(shape=shapes, data=st.data(), keep=st.booleans(), dtype=st.sampled_from([np.float32, np.int64]))
def test_argmax_and_argmin_match_numpy(fresh, shape, data, keep, dtype):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = np.random.default_rng(len(shape)).integers(0, 3, shape).astype(dtype)  # many ties
    for op, ref in (("ArgMax", np.argmax), ("ArgMin", np.argmin)):
        (y,) = run(op, {"x": x}, ["y"], axis=axis, keepdims=int(keep))
        want = ref(x, axis=axis)  # numpy also takes the first of equal ones
        if keep:
            want = np.expand_dims(want, axis)
        assert y.dtype == np.int64
        np.testing.assert_array_equal(y, want)


@settings(**SETTINGS)
@given(shape=shapes, data=st.data())
def test_top_k_matches_a_stable_descending_sort(fresh, shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(1, shape[axis]))
    x = np.random.default_rng(sum(shape)).integers(0, 4, shape).astype(np.float32)
    vals, idx, flat = run("TopK", {"x": x}, ["v", "i", "f"], k=k, axis=axis)
    order = np.argsort(-x, axis=axis, kind="stable")
    want_idx = np.take(order, np.arange(k), axis=axis)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, want_idx, axis=axis))
    np.testing.assert_array_equal(x.reshape(-1)[flat], vals.reshape(-1))


def test_top_k_gradient_and_errors(fresh):
    x = np.random.default_rng(3).standard_normal((3, 5))
    check_grad(core.CreateOperator("TopK", ["x"], ["v", "i"], k=2), [x])
    with pytest.raises(errors.InvalidArgumentError, match="larger than dim"):
        run("TopK", {"x": x}, ["v", "i"], k=6)
    with pytest.raises(errors.InvalidArgumentError, match="k must be"):
        run("TopK", {"x": x}, ["v", "i"], k=0)


def test_one_hot(fresh):
    (y,) = run("OneHot", {"i": np.array([2, 0, 2], np.int64), "n": np.array([4], np.int64)}, ["y"])
    np.testing.assert_array_equal(y, np.eye(4, dtype=np.float32)[[2, 0, 2]])
    assert y.dtype == np.float32
    with pytest.raises(errors.InvalidArgumentError, match=r"out of range \[0, 4\)"):
        run("OneHot", {"i": np.array([4], np.int64), "n": np.array([4], np.int64)}, ["y"])


def test_boolean_mask_and_its_gradient(fresh):
    x = np.arange(12, dtype=np.float64).reshape(4, 3)
    m = np.array([True, False, True, True])
    y, idx = run("BooleanMask", {"x": x, "m": m}, ["y", "idx"])
    np.testing.assert_array_equal(y, x[m])
    np.testing.assert_array_equal(idx, [0, 2, 3])
    check_grad(core.CreateOperator("BooleanMask", ["x", "m"], ["y"]), [x, m])
    with pytest.raises(errors.ShapeError, match="first dim is 4"):
        run("BooleanMask", {"x": x, "m": np.array([True, False])}, ["y"])
    with pytest.raises(errors.DataTypeError, match="bool"):
        run("BooleanMask", {"x": x, "m": np.array([1, 0, 1, 1], np.int32)}, ["y"])


@pytest.mark.parametrize("op,ref", [("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or),
                                    ("BitwiseXor", np.bitwise_xor)])
@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.int64])
def test_bitwise_ops_match_numpy(fresh, op, ref, dtype):
    rng = np.random.default_rng(5)
    a = rng.integers(-50, 50, (3, 4)).astype(dtype)
    b = rng.integers(-50, 50, (4,)).astype(dtype)  # broadcast over rows
    (c,) = run(op, {"a": a, "b": b}, ["c"])
    assert c.dtype == a.dtype
    np.testing.assert_array_equal(c, ref(a, b))
    with pytest.raises(errors.DataTypeError):
        run(op, {"a": a.astype(np.float32), "b": b.astype(np.float32)}, ["c"])
