"""Max and Min over any number of inputs, and their gradients (issue 13):
Caffe2's identical-shape rule; expected values from numpy."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_max_and_min_match_numpy(fresh, dtype):
    rng = np.random.default_rng(3)
    xs = {n: (rng.standard_normal((3, 4)) * 10).astype(dtype) for n in "abc"}
    (mx,) = run("Max", xs, ["mx"])
    (mn,) = run("Min", xs, ["mn"])
    np.testing.assert_array_equal(mx, np.maximum(np.maximum(xs["a"], xs["b"]), xs["c"]))
    np.testing.assert_array_equal(mn, np.minimum(np.minimum(xs["a"], xs["b"]), xs["c"]))
    assert mx.dtype == dtype
    (one,) = run("Max", {"a": xs["a"]}, ["one"])
    np.testing.assert_array_equal(one, xs["a"])
    # In place on the first input.
    workspace.RunOperatorOnce(core.CreateOperator("Min", ["a", "b"], ["a"]))
    np.testing.assert_array_equal(workspace.FetchBlob("a"), np.minimum(xs["a"], xs["b"]))


def test_gradient_goes_to_every_input_equal_to_the_result(fresh):
    x = np.array([1.0, 5.0, 3.0], np.float32)
    y = np.array([2.0, 5.0, 1.0], np.float32)
    go = np.array([10.0, 20.0, 30.0], np.float32)
    mx = np.maximum(x, y)
    gx, gy = run("MaxGradient", {"mx": mx, "go": go, "x": x, "y": y}, ["gx", "gy"])
    np.testing.assert_array_equal(gx, [0.0, 20.0, 30.0])  # by hand: x wins at 1 (tie) and 2
    np.testing.assert_array_equal(gy, [10.0, 20.0, 0.0])
    gx, gy = run("MinGradient", {"mn": np.minimum(x, y), "go": go, "x": x, "y": y}, ["gx", "gy"])
    np.testing.assert_array_equal(gx, [10.0, 20.0, 0.0])
    np.testing.assert_array_equal(gy, [0.0, 20.0, 30.0])
    # The maker, through a numeric check (no ties: distinct random values).
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, 4, 3)).astype(np.float64)
    gc = GradientChecker(stepsize=1e-4, threshold=1e-3)
    for op_type in ("Max", "Min"):
        for i in (0, 1):
            ok, _, _ = gc.CheckSimple(core.CreateOperator(op_type, ["a", "b"], ["m"]), [a, b], i, [0])
            assert ok


def test_bad_inputs(fresh):
    with pytest.raises(errors.ShapeError, match="identical shapes"):
        run("Max", {"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)}, ["m"])
    with pytest.raises(errors.DataTypeError):
        run("Max", {"a": np.ones(3, np.float32), "b": np.ones(3, np.float64)}, ["m"])
    with pytest.raises(errors.DataTypeError, match="Unsupported type"):
        run("Min", {"a": np.ones(3, bool)}, ["m"])
    with pytest.raises(errors.InvalidArgumentError, match="one gradient per X"):
        run("MaxGradient", {"y": np.ones(2), "g": np.ones(2), "a": np.ones(2)}, ["ga", "gb"])
