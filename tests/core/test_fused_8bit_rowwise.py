"""FloatToFused8BitRowwiseQuantized, Fused8BitRowwiseQuantizedToFloat and
GatherFused8BitRowwise, against a numpy model of Caffe2's fused layout
(per row: the quantized bytes, then scale and bias as little-endian
float32s)."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def run_op(op_type, inputs, outputs, **kwargs):
    workspace.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, **kwargs))


def quantize_model(x):
    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    lo = rows.min(axis=1, keepdims=True)
    rng = rows.max(axis=1, keepdims=True) - lo
    q = np.rint((rows - lo) * (np.float32(255) / (rng + np.float32(1e-8)))).astype(np.uint8)
    scale = (rng / np.float32(255)).astype('<f4').view(np.uint8)
    bias = lo.astype('<f4').view(np.uint8)
    return np.concatenate([q, scale, bias], axis=1).reshape(x.shape[:-1] + (x.shape[-1] + 8,))


def dequantize_model(f):
    rows = f.reshape(-1, f.shape[-1])
    scale = rows[:, -8:-4].copy().view('<f4')
    bias = rows[:, -4:].copy().view('<f4')
    out = rows[:, :-8].astype(np.float32) * scale + bias
    return out.reshape(f.shape[:-1] + (f.shape[-1] - 8,))


def test_round_trip_matches_the_model():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 5, 7)) * 10).astype(np.float32)
    x[0, 0] = 4.0  # a constant row: range 0
    workspace.FeedBlob('x', x)
    run_op('FloatToFused8BitRowwiseQuantized', ['x'], ['q'])
    q = workspace.FetchBlob('q')
    assert q.dtype == np.uint8 and q.shape == (2, 5, 15)
    np.testing.assert_array_equal(q, quantize_model(x))
    run_op('Fused8BitRowwiseQuantizedToFloat', ['q'], ['y'])
    y = workspace.FetchBlob('y')
    np.testing.assert_allclose(y, dequantize_model(q), rtol=1e-6)
    # Each value is within half a step of the original.
    step = (x.max(axis=-1, keepdims=True) - x.min(axis=-1, keepdims=True)) / 255
    assert np.all(np.abs(y - x) <= step / 2 + 1e-5)
    np.testing.assert_array_equal(y[0, 0], np.full(7, 4.0, np.float32))


@pytest.mark.parametrize('idx_dtype', [np.int32, np.int64])
def test_gather_dequantizes_the_rows_at_the_indices(idx_dtype):
    rng = np.random.default_rng(4)
    x = rng.random((6, 3)).astype(np.float32)
    workspace.FeedBlob('x', x)
    run_op('FloatToFused8BitRowwiseQuantized', ['x'], ['q'])
    ind = np.array([5, 0, 5, 2], dtype=idx_dtype)
    workspace.FeedBlob('ind', ind)
    run_op('GatherFused8BitRowwise', ['q', 'ind'], ['g'])
    np.testing.assert_allclose(workspace.FetchBlob('g'),
                               dequantize_model(workspace.FetchBlob('q'))[ind], rtol=1e-6)
    workspace.FeedBlob('ind', np.zeros(0, dtype=idx_dtype))
    run_op('GatherFused8BitRowwise', ['q', 'ind'], ['g'])
    assert workspace.FetchBlob('g').shape == (0, 3)


def test_bad_inputs_are_typed_errors():
    workspace.FeedBlob('x', np.array([[1.0, np.nan]], np.float32))
    with pytest.raises(errors.InvalidArgumentError, match='non-finite') as e:
        run_op('FloatToFused8BitRowwiseQuantized', ['x'], ['q'])
    assert 'x' == e.value.blob
    workspace.FeedBlob('d', np.zeros((2, 3), np.float64))
    with pytest.raises(errors.DataTypeError):
        run_op('FloatToFused8BitRowwiseQuantized', ['d'], ['q'])
    workspace.FeedBlob('short', np.zeros((2, 5), np.uint8))
    with pytest.raises(errors.ShapeError, match='8 bytes') as e:
        run_op('Fused8BitRowwiseQuantizedToFloat', ['short'], ['y'])
    assert e.value.blob == 'short'
    workspace.FeedBlob('q', np.zeros((2, 10), np.uint8))
    workspace.FeedBlob('ind', np.array([2], np.int32))
    with pytest.raises(errors.InvalidArgumentError, match="out of range") as e:
        run_op('GatherFused8BitRowwise', ['q', 'ind'], ['g'])
    assert e.value.op == 'GatherFused8BitRowwise' and e.value.blob == 'ind'


def test_shape_inference_agrees_with_a_run():
    workspace.FeedBlob('x', np.random.default_rng(1).random((4, 3)).astype(np.float32))
    workspace.FeedBlob('ind', np.array([1, 3], np.int64))
    net = core.Net('fused_shapes')
    net.FloatToFused8BitRowwiseQuantized('x', 'q')
    net.Fused8BitRowwiseQuantizedToFloat('q', 'y')
    net.GatherFused8BitRowwise(['q', 'ind'], 'g')
    shapes, types = workspace.InferShapesAndTypes([net])
    workspace.RunNetOnce(net)
    for name in ('q', 'y', 'g'):
        got = workspace.FetchBlob(name)
        assert shapes[name] == list(got.shape)
    assert shapes['q'] == [4, 11] and shapes['y'] == [4, 3] and shapes['g'] == [2, 3]
