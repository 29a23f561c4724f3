"""ResizeNearest (issue 29: Mask R-CNN 2Go's upsampling) against a numpy
model of Caffe2's rule: output side floor(side * scale), output pixel
(y, x) reads (min(floor(y / hs), H - 1), min(floor(x / ws), W - 1)). Its
gradient is in the gradient table (tests/train/_op_gradient_specs.py)."""

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


def resize_ref(x, hs, ws):
    n, c, h, w = x.shape
    oh, ow = int(np.float32(h) * np.float32(hs)), int(np.float32(w) * np.float32(ws))
    out = np.zeros((n, c, oh, ow), x.dtype)
    for y in range(oh):
        for xx in range(ow):
            out[:, :, y, xx] = x[:, :, min(int(np.float32(y) / np.float32(hs)), h - 1),
                                  min(int(np.float32(xx) / np.float32(ws)), w - 1)]
    return out


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("hs,ws", [(2.0, 2.0), (1.5, 0.5), (3.0, 1.0), (0.7, 2.5)])
def test_resize_nearest_matches_numpy_model(fresh, order, hs, ws):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    xs = np.ascontiguousarray(np.moveaxis(x, 1, -1)) if order == "NHWC" else x
    (y,) = run("ResizeNearest", {"X": xs}, ["Y"], height_scale=hs, width_scale=ws, order=order)
    ref = resize_ref(x, hs, ws)
    if order == "NHWC":
        ref = np.moveaxis(ref, 1, -1)
    np.testing.assert_array_equal(y, ref)
    # The scales as an input override the arguments.
    (y2,) = run("ResizeNearest", {"X": xs, "S": np.array([hs, ws], np.float32)}, ["Y2"], order=order)
    np.testing.assert_array_equal(y2, ref)


def test_resize_nearest_gradient_sums_what_each_pixel_gave(fresh):
    x = np.arange(6, dtype=np.float64).reshape(1, 1, 2, 3)
    dy = np.arange(24, dtype=np.float64).reshape(1, 1, 4, 6)
    (dx,) = run("ResizeNearestGradient", {"dY": dy, "X": x}, ["dX"], height_scale=2.0, width_scale=2.0)
    ref = dy.reshape(1, 1, 2, 2, 3, 2).sum(axis=(3, 5))
    np.testing.assert_array_equal(dx, ref)
    net = core.Net("up")
    y = net.ResizeNearest(["X"], "Y", height_scale=2.0, width_scale=2.0)
    net.AddGradientOperators([net.SumElements(y, "loss")])
    assert "ResizeNearestGradient" in [op.type for op in net.Proto().op]


def test_resize_nearest_bad_inputs(fresh):
    with pytest.raises(errors.InvalidArgumentError, match="height_scale"):
        run("ResizeNearest", {"X": np.zeros((1, 1, 2, 2), np.float32)}, ["Y"], height_scale=0.0)
    with pytest.raises(errors.ShapeError, match="ResizeNearest"):
        run("ResizeNearest", {"X": np.zeros((1, 2, 2), np.float32)}, ["Y"])
    with pytest.raises(errors.ShapeError, match="ResizeNearest"):
        run("ResizeNearest", {"X": np.zeros((1, 1, 2, 2), np.float32), "S": np.ones(3, np.float32)}, ["Y"])
    with pytest.raises(errors.DataTypeError, match="ResizeNearest"):
        run("ResizeNearest", {"X": np.zeros((1, 1, 2, 2), np.int32)}, ["Y"])
    with pytest.raises(errors.ShapeError, match="ResizeNearestGradient"):
        run("ResizeNearestGradient", {"dY": np.zeros((1, 1, 3, 3), np.float32),
                                      "X": np.zeros((1, 1, 2, 2), np.float32)}, ["dX"], height_scale=2.0,
            width_scale=2.0)
