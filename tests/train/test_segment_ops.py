"""Segment reductions (Sorted/Unsorted/Sparse*Segment{Sum,Mean},
SortedSegmentRange*, LengthsMax) against a plain numpy model written here,
and their gradients by central differences."""

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


def segment_ref(rows, seg, k, reduce):
    """Output row s = reduce(rows whose id is s), zeros for an empty one."""
    out = np.zeros((k,) + rows.shape[1:])
    for s in range(k):
        members = rows[seg == s]
        if len(members):
            out[s] = reduce(members)
    return out


def logsumexp(m):
    top = m.max(axis=0)
    return top + np.log(np.exp(m - top).sum(axis=0))


REDUCERS = {
    "Sum": lambda m: m.sum(axis=0),
    "Mean": lambda m: m.mean(axis=0),
    "Max": lambda m: m.max(axis=0),
    "LogSumExp": logsumexp,
    "LogMeanExp": lambda m: logsumexp(m) - np.log(len(m)),
}


@settings(**SETTINGS)
@given(counts=st.lists(st.integers(1, 3), min_size=1, max_size=4), cols=st.integers(1, 3),
       red=st.sampled_from(["Sum", "Mean"]), seed=st.integers(0, 1000))
def test_sorted_and_unsorted_segments_match_numpy(fresh, counts, cols, red, seed):
    rng = np.random.default_rng(seed)
    seg = np.repeat(np.arange(len(counts)), counts).astype(np.int32)
    data = rng.standard_normal((len(seg), cols))
    k = len(counts)
    (y,) = run("SortedSegment" + red, {"d": data, "s": seg}, ["y"])
    np.testing.assert_allclose(y, segment_ref(data, seg, k, REDUCERS[red]), rtol=1e-12)
    perm = rng.permutation(len(seg))
    (y,) = run("UnsortedSegment" + red, {"d": data[perm], "s": seg[perm]}, ["y"], num_segments=k + 2)
    np.testing.assert_allclose(y, segment_ref(data[perm], seg[perm], k + 2, REDUCERS[red]), rtol=1e-12)
    # Sparse: the rows INDICES pick (repeats allowed).
    idx = rng.integers(0, len(seg), len(seg)).astype(np.int64)
    (y,) = run("SparseSortedSegment" + red, {"d": data, "i": idx, "s": seg}, ["y"])
    np.testing.assert_allclose(y, segment_ref(data[idx], seg, k, REDUCERS[red]), rtol=1e-12)
    (y,) = run("SparseUnsortedSegment" + red, {"d": data, "i": idx[perm], "s": seg[perm]}, ["y"])
    np.testing.assert_allclose(y, segment_ref(data[idx[perm]], seg[perm], k, REDUCERS[red]), rtol=1e-12)


@pytest.mark.parametrize("red", sorted(REDUCERS))
def test_sorted_segment_range_ops_and_their_gradients(fresh, red):
    rng = np.random.default_rng(7)
    seg = np.array([0, 0, 1, 2, 2, 2], np.int32)
    data = rng.standard_normal((6, 2))
    (y,) = run("SortedSegmentRange" + red, {"d": data, "s": seg}, ["y"])
    np.testing.assert_allclose(y, segment_ref(data, seg, 3, REDUCERS[red]), rtol=1e-12)
    op = core.CreateOperator("SortedSegmentRange" + red, ["d", "s"], ["y"])
    ok, grad, est = GradientChecker(stepsize=1e-6, threshold=1e-5).CheckSimple(op, [data, seg], 0, [0])
    assert ok, (grad, est)


@pytest.mark.parametrize("op_type", ["SortedSegmentSum", "SortedSegmentMean", "UnsortedSegmentSum",
                                     "UnsortedSegmentMean"])
def test_segment_gradients_match_central_differences(fresh, op_type):
    rng = np.random.default_rng(8)
    seg = np.array([0, 0, 1, 2, 2], np.int64)
    if op_type.startswith("Unsorted"):
        seg = seg[[3, 0, 4, 1, 2]]
    data = rng.standard_normal((5, 3))
    op = core.CreateOperator(op_type, ["d", "s"], ["y"])
    ok, grad, est = GradientChecker(stepsize=1e-6, threshold=1e-5).CheckSimple(op, [data, seg], 0, [0])
    assert ok, (grad, est)


def test_sparse_segment_gradient_is_a_slice_over_the_indices(fresh):
    op = core.CreateOperator("SparseSortedSegmentMean", ["d", "i", "s"], ["y"])
    ops, g = core.GradientRegistry.GetGradientForOp(op, ["y_grad"])
    assert [o.type for o in ops] == ["SortedSegmentMeanGradient"]
    assert list(ops[0].input) == ["y_grad", "s"]
    assert isinstance(g[0], core.GradientSlice) and str(g[0].indices) == "i"
    # The values: each picked row gets dY of its segment / the segment's size.
    dy = np.array([[1.0, 2.0], [3.0, 4.0]])
    (v,) = run("SortedSegmentMeanGradient", {"dy": dy, "s": np.array([0, 0, 1], np.int32)}, ["v"])
    np.testing.assert_allclose(v, [[0.5, 1.0], [0.5, 1.0], [3.0, 4.0]])


def test_lengths_max_and_its_gradient(fresh):
    data = np.array([[1.0, 5.0], [3.0, 5.0], [2.0, -1.0], [0.0, 0.0], [7.0, 1.0]])
    lens = np.array([2, 0, 3], np.int32)
    (y,) = run("LengthsMax", {"d": data, "l": lens}, ["y"])
    np.testing.assert_array_equal(y, [[3.0, 5.0], [0.0, 0.0], [7.0, 1.0]])
    dy = np.array([[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]])
    (dx,) = run("LengthsMaxWithMainInputAndForwardOutputGradient", {"y": y, "dy": dy, "l": lens, "d": data},
                ["dx"])
    # Ties (5 and 5) both get dY, as Caffe2's.
    np.testing.assert_array_equal(dx, [[0, 20], [10, 20], [0, 0], [0, 0], [50, 60]])
    op = core.CreateOperator("LengthsMax", ["d", "l"], ["y"])
    smooth = np.random.default_rng(9).standard_normal((5, 2))
    ok, grad, est = GradientChecker(stepsize=1e-6, threshold=1e-5).CheckSimple(op, [smooth, lens], 0, [0])
    assert ok, (grad, est)


def test_segment_errors_name_the_blob(fresh):
    data = np.ones((3, 2))
    with pytest.raises(errors.InvalidArgumentError, match="sorted, start at 0 and have no gaps"):
        run("SortedSegmentSum", {"d": data, "ids": np.array([0, 2, 2], np.int32)}, ["y"])
    with pytest.raises(errors.InvalidArgumentError, match="sorted"):
        run("SortedSegmentRangeMax", {"d": data, "ids": np.array([1, 0, 0], np.int32)}, ["y"])
    with pytest.raises(errors.InvalidArgumentError, match="negative"):
        run("UnsortedSegmentSum", {"d": data, "ids": np.array([0, -1, 0], np.int32)}, ["y"])
    with pytest.raises(errors.InvalidArgumentError, match="num_segments = 1"):
        run("UnsortedSegmentSum", {"d": data, "ids": np.array([0, 2, 0], np.int32)}, ["y"], num_segments=1)
    with pytest.raises(errors.ShapeError, match="3 ids for 2 rows"):
        run("SortedSegmentSum", {"d": np.ones((2, 2)), "ids": np.array([0, 0, 1], np.int32)}, ["y"])
    with pytest.raises(errors.InvalidArgumentError, match="out of range"):
        run("SparseSortedSegmentSum", {"d": data, "i": np.array([0, 5], np.int64), "ids": np.array([0, 0], np.int32)},
            ["y"])
    with pytest.raises(errors.InvalidArgumentError, match="sum to 4"):
        run("LengthsMax", {"d": data, "l": np.array([2, 2], np.int32)}, ["y"])
