"""NanCheck, LengthsGather and SplitByLengths (issue 13); expected values
from numpy."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


def test_nan_check_passes_finite_values_and_refuses_others(fresh):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = run("NanCheck", {"x": x, "other": np.ones(2, np.float32)}, ["y"])
    np.testing.assert_array_equal(y, x)
    for bad in (np.nan, np.inf, -np.inf):
        x2 = x.copy()
        x2[1, 1] = bad
        with pytest.raises(errors.InvalidArgumentError, match="flat index 4") as e:
            run("NanCheck", {"x2": x2}, ["y2"])
        assert isinstance(e.value, RuntimeError) and e.value.blob == "x2"
    with pytest.raises(errors.DataTypeError):
        run("NanCheck", {"i": np.ones(2, np.int32)}, ["yi"])
    net = core.Net("g")
    net.NanCheck(["x"], ["y"])
    net.AddGradientOperators({"y": "gy"})
    assert [op.type for op in net.Proto().op] == ["NanCheck", "NanCheck"]


def test_lengths_gather(fresh):
    items = np.arange(10, dtype=np.int64).reshape(5, 2)
    lengths = np.array([2, 0, 3], np.int32)
    idx = np.array([2, 0, 1, 2], np.int64)
    (out,) = run("LengthsGather", {"items": items, "l": lengths, "i": idx}, ["o"])
    ends = np.cumsum(lengths)
    want = np.concatenate([items[ends[i] - lengths[i]:ends[i]] for i in idx])
    np.testing.assert_array_equal(out, want)
    (none,) = run("LengthsGather", {"items": items, "l": lengths, "i": np.array([], np.int32)}, ["n"])
    assert none.shape == (0, 2)
    with pytest.raises(errors.IndexOutOfRangeError):
        run("LengthsGather", {"items": items, "l": lengths, "i": np.array([3], np.int32)}, ["o"])
    with pytest.raises(errors.InvalidArgumentError, match="add up"):
        run("LengthsGather", {"items": items, "l": np.array([1], np.int32), "i": idx[:1]}, ["o"])


def test_split_by_lengths(fresh):
    data = np.arange(12, dtype=np.float32).reshape(6, 2)
    lengths = np.array([1, 2, 0, 3], np.int32)
    a, b = run("SplitByLengths", {"d": data, "l": lengths}, ["a", "b"])
    np.testing.assert_array_equal(a, data[:3])  # lengths 1 + 2
    np.testing.assert_array_equal(b, data[3:])  # lengths 0 + 3
    # Along axis 1, and with lengths scaled up to the axis (2 -> 6: x3).
    wide = np.arange(12, dtype=np.int32).reshape(2, 6)
    p, q = run("SplitByLengths", {"w": wide, "s": np.array([1, 1], np.int64)}, ["p", "q"],
               axis=1, use_scaling_lengths=True)
    np.testing.assert_array_equal(p, wide[:, :3])
    np.testing.assert_array_equal(q, wide[:, 3:])
    with pytest.raises(errors.InvalidArgumentError, match="multiple"):
        run("SplitByLengths", {"d": data, "l": np.array([6], np.int32)}, ["a", "b"])
    with pytest.raises(errors.InvalidArgumentError, match="add up"):
        run("SplitByLengths", {"d": data, "l": np.array([1, 1], np.int32)}, ["a", "b"])
    gc = GradientChecker(stepsize=1e-3, threshold=1e-2)
    op = core.CreateOperator("SplitByLengths", ["d", "l"], ["a", "b"])
    ok, grad, _ = gc.CheckSimple(op, [data, lengths], 0, [0, 1])
    assert ok and grad.shape == data.shape
