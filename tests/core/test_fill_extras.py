"""DiagonalFill and LengthsRangeFill (issue 13), against numpy."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace


@pytest.mark.parametrize("shape", [[3, 3], [2, 5], [5, 2], [3, 3, 3], [2, 2, 2, 2]])
def test_diagonal_fill_matches_numpy(fresh, shape):
    workspace.RunOperatorOnce(core.CreateOperator("DiagonalFill", [], ["d"], shape=shape, value=2.5))
    want = np.zeros(shape, np.float32)
    np.fill_diagonal(want, 2.5)
    got = workspace.FetchBlob("d")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_diagonal_fill_dtype_and_input_shape(fresh):
    workspace.RunOperatorOnce(core.CreateOperator(
        "DiagonalFill", [], ["d"], shape=[3, 4], dtype=core.DataType.INT32, value=7))
    want = np.zeros((3, 4), np.int32)
    np.fill_diagonal(want, 7)
    got = workspace.FetchBlob("d")
    assert got.dtype == np.int32 and got.tolist() == want.tolist()
    workspace.FeedBlob("like", np.zeros((2, 2), np.float64))
    workspace.RunOperatorOnce(core.CreateOperator("DiagonalFill", ["like"], ["e"], value=1.0))
    assert workspace.FetchBlob("e").tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_diagonal_fill_needs_square_cubes(fresh):
    for shape in ([4], [2, 3, 3]):
        with pytest.raises(errors.ShapeError):
            workspace.RunOperatorOnce(core.CreateOperator("DiagonalFill", [], ["d"], shape=shape))


def test_lengths_range_fill(fresh):
    lengths = np.array([3, 0, 1, 4], np.int32)
    workspace.FeedBlob("l", lengths)
    workspace.RunOperatorOnce(core.CreateOperator("LengthsRangeFill", ["l"], ["r"]))
    got = workspace.FetchBlob("r")
    assert got.dtype == np.int32
    assert got.tolist() == [i for n in lengths for i in range(n)]
    workspace.FeedBlob("bad", np.array([1, -1], np.int32))
    with pytest.raises(errors.InvalidArgumentError):
        workspace.RunOperatorOnce(core.CreateOperator("LengthsRangeFill", ["bad"], ["r"]))
