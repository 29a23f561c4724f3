"""Gather and BatchGather with match_outer (issue 13): each position of
DATA's dims before the axis takes its own indices. Expected values from a
plain-numpy loop."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker


def np_match_outer(data, ind, axis):
    outer = data.shape[:axis]
    out = np.zeros(outer + ind.shape[axis:] + data.shape[axis + 1:], data.dtype)
    for o in np.ndindex(*outer):
        out[o] = np.take(data[o], ind[o], axis=0)
    return out


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


@pytest.mark.parametrize("axis", [1, 2])
def test_gather_match_outer_matches_numpy(fresh, axis):
    rng = np.random.default_rng(axis)
    data = rng.standard_normal((3, 4, 5, 2)).astype(np.float32)
    ind = rng.integers(0, data.shape[axis], size=data.shape[:axis] + (2, 3)).astype(np.int64)
    (out,) = run("Gather", {"d": data, "i": ind}, ["o"], axis=axis, match_outer=True)
    np.testing.assert_array_equal(out, np_match_outer(data, ind, axis))


def test_batch_gather_match_outer_by_hand(fresh):
    data = np.array([[10, 11, 12], [20, 21, 22]], np.int32)
    ind = np.array([[2, 0], [1, 1]], np.int32)
    (out,) = run("BatchGather", {"d": data, "i": ind}, ["o"], match_outer=True)
    np.testing.assert_array_equal(out, [[12, 10], [21, 21]])
    # Without match_outer every row takes all the indices.
    (plain,) = run("BatchGather", {"d": data, "i": ind}, ["p"])
    assert plain.shape == (2, 2, 2)


def test_gradients(fresh):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((2, 3, 2)).astype(np.float64)
    ind = np.array([[0, 2, 2], [1, 1, 0]], np.int32)  # repeats add up
    gc = GradientChecker(stepsize=1e-4, threshold=1e-3)
    for op_type, kw in (("Gather", {"axis": 1}), ("BatchGather", {})):
        op = core.CreateOperator(op_type, ["d", "i"], ["o"], match_outer=True, **kw)
        ok, grad, _ = gc.CheckSimple(op, [data, ind], 0, [0])
        assert ok and grad.shape == data.shape
    # With dY all ones, each row's gradient counts how often it was picked.
    (g,) = run("BatchGatherGradient", {"d": data, "i": ind, "dy": np.ones((2, 3, 2))}, ["g"],
               match_outer=True)
    want = np.zeros_like(data)
    for b in range(2):
        for r in ind[b]:
            want[b, r] += 1.0
    np.testing.assert_array_equal(g, want)


def test_indices_must_match_the_outer_dims(fresh):
    with pytest.raises(errors.ShapeError, match="match_outer"):
        run("Gather", {"d": np.ones((2, 3), np.float32), "i": np.zeros((3, 1), np.int32)}, ["o"],
            axis=1, match_outer=True)
