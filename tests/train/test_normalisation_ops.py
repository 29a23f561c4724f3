"""LayerNorm, Normalize and NormalizeL1 (and the gradients) against numpy
models written here, and brew.layer_norm."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ferrocaffe import brew, core, errors, model_helper, workspace
from ferrocaffe.gradient_checker import GradientChecker


def ln_ref(x, axis, eps, gamma=None, beta=None):
    lead = x.shape[:axis]
    rows = x.reshape(int(np.prod(lead)), -1)
    mean = rows.mean(axis=1, keepdims=True)
    std = np.sqrt(rows.var(axis=1, keepdims=True) + eps)
    y = ((rows - mean) / std).reshape(x.shape)
    if gamma is not None:
        y = y * gamma + beta
    return y, mean.reshape(lead + (1,)), std.reshape(lead + (1,))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data(), affine=st.booleans(),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_layer_norm_matches_numpy(fresh, shape, data, affine, dtype):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    ax = axis % len(shape)
    rng = np.random.default_rng(len(shape) * 7 + ax)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    workspace.FeedBlob("x", x)
    ins = ["x"]
    gamma = beta = None
    if affine:
        gamma = rng.standard_normal(shape[ax:]).astype(dtype)
        beta = rng.standard_normal(shape[ax:]).astype(dtype)
        workspace.FeedBlob("g", gamma)
        workspace.FeedBlob("b", beta)
        ins += ["g", "b"]
    workspace.RunOperatorOnce(core.CreateOperator("LayerNorm", ins, ["y", "mean", "std"], axis=axis,
                                                  epsilon=1e-3, elementwise_affine=int(affine)))
    want = ln_ref(x.astype(np.float64), ax, np.float64(np.float32(1e-3)), gamma, beta)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for name, w in zip(("y", "mean", "std"), want):
        got = workspace.FetchBlob(name)
        assert got.dtype == dtype and got.shape == w.shape
        np.testing.assert_allclose(got, w, rtol=tol, atol=tol)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 3), cols=st.integers(2, 5), affine=st.booleans(), seed=st.integers(0, 1000))
def test_layer_norm_gradients_match_central_differences(fresh, rows, cols, affine, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 2, cols))
    inputs = [x]
    names = ["x"]
    if affine:
        inputs += [rng.standard_normal((2, cols)), rng.standard_normal((2, cols))]
        names += ["g", "b"]
    op = core.CreateOperator("LayerNorm", names, ["y", "mean", "std"], axis=1, epsilon=1e-2,
                             elementwise_affine=int(affine))
    gc = GradientChecker(stepsize=1e-6, threshold=1e-5)
    for i in range(len(inputs)):
        ok, grad, est = gc.CheckSimple(op, inputs, i, [0])
        assert ok, (i, grad, est)


def test_layer_norm_by_hand_and_bad_inputs(fresh):
    # One row [1, 3]: mean 2, variance 1, epsilon 1e-30 (1 + 1e-30 is 1)
    # -> y = [-1, 1], std 1. (An epsilon must be > 0: test_hostile_arguments.)
    workspace.FeedBlob("x", np.array([[1.0, 3.0]], np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("LayerNorm", ["x"], ["y", "m", "s"], epsilon=1e-30))
    np.testing.assert_allclose(workspace.FetchBlob("y"), [[-1.0, 1.0]])
    np.testing.assert_allclose(workspace.FetchBlob("m"), [[2.0]])
    np.testing.assert_allclose(workspace.FetchBlob("s"), [[1.0]])
    with pytest.raises(errors.InvalidArgumentError, match="3 inputs"):
        workspace.RunOperatorOnce(core.CreateOperator("LayerNorm", ["x"], ["y", "m", "s"], elementwise_affine=1))
    workspace.FeedBlob("g", np.ones(3, np.float32))
    workspace.FeedBlob("b", np.ones(2, np.float32))
    with pytest.raises(errors.ShapeError, match="gamma"):
        workspace.RunOperatorOnce(core.CreateOperator("LayerNorm", ["x", "g", "b"], ["y", "m", "s"],
                                                      elementwise_affine=1))
    with pytest.raises(errors.InvalidArgumentError, match="axis"):
        workspace.RunOperatorOnce(core.CreateOperator("LayerNorm", ["x"], ["y", "m", "s"], axis=3))
    workspace.FeedBlob("i", np.ones((2, 2), np.int32))
    with pytest.raises(errors.DataTypeError):
        workspace.RunOperatorOnce(core.CreateOperator("LayerNorm", ["i"], ["y", "m", "s"]))


def test_brew_layer_norm_trains_its_scale_and_bias(fresh):
    model = model_helper.ModelHelper(name="ln")
    y, mean, std = brew.layer_norm(model, "x", "ln", dim_in=3, epsilon=1e-4, initial_scale=2.0, initial_bias=0.5)
    assert [str(p) for p in model.params] == ["ln_scale", "ln_bias"]
    assert (str(mean), str(std)) == ("ln_mean", "ln_std")
    loss = model.net.AveragedLoss(y, "loss")
    grads = model.AddGradientOperators([loss])
    x = np.array([[0.0, 1.0, 5.0], [2.0, 2.0, -1.0]], np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    z, _, _ = ln_ref(x.astype(np.float64), 1, np.float64(np.float32(1e-4)))
    np.testing.assert_allclose(workspace.FetchBlob("ln"), 2.0 * z + 0.5, rtol=1e-5, atol=1e-6)
    # loss = mean(y): dscale = sum over rows of z / 6, dbias = 2 / 6.
    np.testing.assert_allclose(workspace.FetchBlob(str(grads["ln_scale"])), z.sum(axis=0) / 6, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob(str(grads["ln_bias"])), np.full(3, 2 / 6), rtol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_normalize_and_normalize_l1_match_numpy(fresh, axis):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 4, 2))
    x[1, :, 0] = 0.0 if axis == 1 else x[1, :, 0]  # a zero row along axis 1
    workspace.FeedBlob("x", x)
    workspace.RunOperatorOnce(core.CreateOperator("Normalize", ["x"], ["y"], axis=axis))
    n = np.maximum(np.sqrt((x * x).sum(axis=axis, keepdims=True)), 1e-12)
    np.testing.assert_allclose(workspace.FetchBlob("y"), x / n, rtol=1e-12)
    workspace.RunOperatorOnce(core.CreateOperator("NormalizeL1", ["x"], ["z"], axis=axis))
    n1 = np.abs(x).sum(axis=axis, keepdims=True)
    np.testing.assert_allclose(workspace.FetchBlob("z"), np.where(n1 == 0, x, x / np.where(n1 == 0, 1, n1)),
                               rtol=1e-12)
    op = core.CreateOperator("Normalize", ["x"], ["y"], axis=axis)
    ok, grad, est = GradientChecker(stepsize=1e-6, threshold=1e-5).CheckSimple(op, [rng.standard_normal((3, 4, 2))],
                                                                           0, [0])
    assert ok, (grad, est)
