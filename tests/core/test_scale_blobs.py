"""ScaleBlobs and the Copy gradient (issue 13): n inputs scaled into n outputs, in place or not,
float32 and float64; expected values from numpy."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace


def test_scale_blobs_matches_numpy(fresh):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(s).astype(t) for s, t in
          (((2, 3), np.float32), ((4,), np.float64), ((1, 1, 1), np.float32))]
    for i, x in enumerate(xs):
        workspace.FeedBlob("x%d" % i, x)
    workspace.RunOperatorOnce(core.CreateOperator(
        "ScaleBlobs", ["x0", "x1", "x2"], ["y0", "y1", "x2"], scale=2.5))
    np.testing.assert_array_equal(workspace.FetchBlob("y0"), xs[0] * np.float32(2.5))
    np.testing.assert_array_equal(workspace.FetchBlob("y1"), xs[1] * 2.5)
    np.testing.assert_array_equal(workspace.FetchBlob("x2"), xs[2] * np.float32(2.5))
    assert workspace.FetchBlob("y1").dtype == np.float64


def test_in_place_only_at_the_same_position(fresh):
    workspace.FeedBlob("a", np.array([1.0], np.float32))
    workspace.FeedBlob("b", np.array([10.0], np.float32))
    with pytest.raises(errors.InvalidArgumentError):  # b -> a is not in place
        workspace.RunOperatorOnce(core.CreateOperator("ScaleBlobs", ["a", "b"], ["b", "a"], scale=2.0))


def test_bad_inputs(fresh):
    workspace.FeedBlob("i", np.array([1], np.int32))
    with pytest.raises(errors.DataTypeError) as e:
        workspace.RunOperatorOnce(core.CreateOperator("ScaleBlobs", ["i"], ["o"], scale=2.0))
    assert e.value.blob == "i"
    with pytest.raises(errors.InvalidArgumentError):
        workspace.RunOperatorOnce(core.CreateOperator("ScaleBlobs", ["i"], ["o", "p"]))


def test_copy_gradient_is_copy_on_device_like(fresh):
    net = core.Net("g")
    net.Copy(["x"], ["y"])
    net.AveragedLoss(["y"], ["loss"])
    grads = net.AddGradientOperators(["loss"])
    ops = net.Proto().op
    assert ops[-1].type == "CopyOnDeviceLike"
    assert list(ops[-1].input) == ["y_grad", "x"] and list(ops[-1].output) == ["x_grad"]
    x = np.arange(6, dtype=np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob(grads["x"]), np.full(6, 1 / 6, np.float32))
