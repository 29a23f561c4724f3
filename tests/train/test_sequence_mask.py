"""SequenceMask (issue 30: attention over encoder outputs of several
lengths) against a numpy model of Caffe2's rules written here: every mode,
axis, batch and repeat_from_axis, the gradient mode, its gradient maker
through AddGradientOperators, and malformed arguments."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace


def model(x, mode, per_row=None, axis=1, radius=10, fill=-np.inf, batch=None, repeat_from=None):
    """Caffe2's SequenceMask as a plain loop over (batch, row, column)."""
    shape = x.shape
    nd = len(shape)
    axis %= nd
    prod = lambda dims: int(np.prod(dims, dtype=np.int64))
    if batch is not None:
        batch %= nd
        b, r, c, d = prod(shape[:batch + 1]), prod(shape[batch + 1:axis]), prod(shape[axis:]), 1
    elif repeat_from is not None:
        repeat_from %= nd
        b, r, c, d = 1, prod(shape[:axis]), prod(shape[axis:repeat_from]), prod(shape[repeat_from:])
    else:
        b, r, c, d = 1, prod(shape[:axis]), prod(shape[axis:]), 1
    y = x.reshape(b, r, c, d).copy()
    rules = {
        "sequence": lambda i, j: j >= per_row[i],
        "window": lambda i, j: j > per_row[i] + radius or j < per_row[i] - radius,
        "upper": lambda i, j: j > i,
        "lower": lambda i, j: j < i,
        "upperdiag": lambda i, j: j >= i,
        "lowerdiag": lambda i, j: j <= i,
    }
    for bi in range(b):
        for i in range(r):
            for j in range(c):
                if rules[mode](i, j):
                    y[bi, i, j, :] = fill
    return y.reshape(shape)


def mask(x, *extra, **args):
    ws = workspace.Workspace()
    ws.feed_blob("x", x)
    names = ["x"]
    for k, e in enumerate(extra):
        ws.feed_blob("e%d" % k, e)
        names.append("e%d" % k)
    ws.run(core.CreateOperator("SequenceMask", names, ["y"], **args))
    return ws.fetch_blob("y")


rng = np.random.default_rng(0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sequence_mode_masks_past_each_rows_length(dtype):
    x = rng.standard_normal((4, 6)).astype(dtype)
    lengths = np.array([0, 2, 6, 3], np.int32)
    y = mask(x, lengths, mode="sequence")
    np.testing.assert_array_equal(y, model(x, "sequence", lengths))
    assert y.dtype == dtype and np.isneginf(y[0]).all() and (y[2] == x[2]).all()


@pytest.mark.parametrize("mode", ["upper", "lower", "upperdiag", "lowerdiag"])
def test_triangular_modes(mode):
    x = rng.standard_normal((5, 5)).astype(np.float32)
    np.testing.assert_array_equal(mask(x, mode=mode, fill_val=7.0), model(x, mode, fill=7.0))


def test_window_mode_keeps_columns_within_radius_of_the_center():
    x = rng.standard_normal((3, 8)).astype(np.float32)
    centers = np.array([0, 4, 7], np.int64)
    y = mask(x, centers, mode="window", radius=2)
    np.testing.assert_array_equal(y, model(x, "window", centers, radius=2))
    # Caffe2's default radius is 10: nothing masked in 8 columns.
    np.testing.assert_array_equal(mask(x, centers, mode="window"), x)


def test_axis_splits_rows_from_columns():
    # Rows are the dims before axis (2 x 3 = 6), columns the dims from it.
    x = rng.standard_normal((2, 3, 4, 2)).astype(np.float32)
    lengths = np.array([0, 1, 8, 5, 3, 2], np.int32)
    y = mask(x, lengths, mode="sequence", axis=2)
    np.testing.assert_array_equal(y, model(x, "sequence", lengths, axis=2))
    y = mask(x, np.array([1, 7], np.int32), mode="sequence", axis=-3)
    np.testing.assert_array_equal(y, model(x, "sequence", [1, 7], axis=1))


def test_batch_masks_each_batch_as_its_own_matrix():
    x = rng.standard_normal((3, 4, 4)).astype(np.float32)
    y = mask(x, mode="lowerdiag", batch=0, axis=2)
    np.testing.assert_array_equal(y, model(x, "lowerdiag", batch=0, axis=2))
    lengths = np.array([1, 0, 4, 2], np.int32)
    y = mask(x, lengths, mode="sequence", batch=0, axis=2, fill_val=-1.0)
    np.testing.assert_array_equal(y, model(x, "sequence", lengths, batch=0, axis=2, fill=-1.0))


def test_repeat_from_axis_repeats_the_mask_over_trailing_dims():
    x = rng.standard_normal((3, 5, 2)).astype(np.float32)
    lengths = np.array([5, 0, 2], np.int32)
    y = mask(x, lengths, mode="sequence", axis=1, repeat_from_axis=-1, fill_val=1e-9)
    np.testing.assert_array_equal(y, model(x, "sequence", lengths, axis=1, repeat_from=2, fill=1e-9))


def test_grad_mode_fills_zero_whatever_fill_val():
    x = rng.standard_normal((3, 4)).astype(np.float32)
    lengths = np.array([1, 4, 2], np.int32)
    y = mask(x, lengths, mode="sequence", grad=True, fill_val=5.0)
    np.testing.assert_array_equal(y, model(x, "sequence", lengths, fill=0.0))


def test_gradient_maker_masks_the_gradient_with_the_same_lengths():
    # fill_val 0 keeps the loss finite.
    net = core.Net("seqmask_grad")
    y = net.SequenceMask(["x", "lengths"], "y", mode="sequence", fill_val=0.0)
    w = net.Mul([y, "w"], "yw")
    loss = net.SumElements(w, "loss")
    net.AddGradientOperators([loss])
    ops = [op for op in net.Proto().op if op.type == "SequenceMask"]
    assert len(ops) == 2 and list(ops[1].input)[1] == "lengths"
    args = {a.name: a for a in ops[1].arg}
    assert args["grad"].i == 1 and args["mode"].s == b"sequence"
    x = rng.standard_normal((3, 4)).astype(np.float32)
    wv = rng.standard_normal((3, 4)).astype(np.float32)
    lengths = np.array([2, 0, 4], np.int32)
    ws = workspace.Workspace()
    for name, v in (("x", x), ("w", wv), ("lengths", lengths)):
        ws.feed_blob(name, v)
    ws.run(net)
    want = np.where(np.arange(4)[None, :] < lengths[:, None], wv, 0.0)
    np.testing.assert_array_equal(ws.fetch_blob("x_grad"), want)


@pytest.mark.parametrize("args, extra, message", [
    ({}, 1, "mode"),
    ({"mode": "diagonal"}, 1, "unsupported mode"),
    ({"mode": "sequence"}, 0, "takes 2 inputs"),
    ({"mode": "upper", "axis": 3}, 0, "out of range"),
    ({"mode": "upper", "batch": 1, "axis": 1}, 0, "batch"),
    ({"mode": "upper", "repeat_from_axis": 1}, 0, "repeat_from_axis"),
])
def test_malformed_arguments_raise_typed_errors(args, extra, message):
    x = np.zeros((2, 3), np.float32)
    extras = [np.array([1, 2], np.int32)] * extra
    with pytest.raises(errors.InvalidArgumentError, match=message):
        mask(x, *extras, **args)


def test_too_few_lengths_and_float_lengths_are_refused():
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(errors.ShapeError, match="2 values for 3 rows"):
        mask(x, np.array([1, 2], np.int32), mode="sequence")
    with pytest.raises(TypeError, match="int32 or int64 lengths"):
        mask(x, np.array([1.0, 2.0, 1.0], np.float32), mode="sequence")
    with pytest.raises(TypeError):
        mask(np.zeros((2, 2), np.int32), mode="upper")
