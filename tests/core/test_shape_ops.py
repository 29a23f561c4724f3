"""Shape, Size, Alias, Range, Transpose, Slice and LengthsToSegmentIds
(ops/shape.rs) driven from Python as Caffe2 programs call them.

Expected values come from numpy.
"""

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


def check_error(exc_info, cls, blob):
    assert isinstance(exc_info.value, cls)
    assert isinstance(exc_info.value, RuntimeError)
    assert blob in str(exc_info.value)


def test_shape_and_size():
    x = np.zeros((2, 5, 3), dtype=np.float64)
    workspace.FeedBlob('x', x)
    run_op('Shape', ['x'], ['s'])
    s = workspace.FetchBlob('s')
    assert s.dtype == np.int64
    np.testing.assert_array_equal(s, np.array(x.shape))
    run_op('Shape', ['x'], ['s'], axes=[2, 0])
    np.testing.assert_array_equal(workspace.FetchBlob('s'), [x.shape[2], x.shape[0]])
    run_op('Shape', ['x'], ['s'], axes=[])
    np.testing.assert_array_equal(workspace.FetchBlob('s'), np.array(x.shape))
    run_op('Size', ['x'], ['n'])
    n = workspace.FetchBlob('n')
    assert n.dtype == np.int64 and n.shape == () and n == x.size
    with pytest.raises(errors.InvalidArgumentError) as ei:
        run_op('Shape', ['x'], ['s'], axes=[3])
    check_error(ei, errors.InvalidArgumentError, 'x')


def test_alias_is_a_copy():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    workspace.FeedBlob('x', x)
    run_op('Alias', ['x'], ['y'])
    np.testing.assert_array_equal(workspace.FetchBlob('y'), x)


@pytest.mark.parametrize('args,dtype', [
    ((5,), np.int32), ((-2, 7, 3), np.int64), ((7, -2, -3), np.int64),
    ((7, -2), np.int64), ((0.5, 1.5, 0.25), np.float32), ((1.0, 0.0, -0.3), np.float64),
])
def test_range_is_numpy_arange(args, dtype):
    names = []
    for i, a in enumerate(args):
        workspace.FeedBlob('r%d' % i, np.array(a, dtype=dtype))
        names.append('r%d' % i)
    run_op('Range', names, ['y'])
    y = workspace.FetchBlob('y')
    want = np.arange(*[dtype(a) for a in args], dtype=dtype)
    assert y.dtype == want.dtype
    np.testing.assert_allclose(y, want, rtol=1e-6)


def test_range_errors():
    workspace.FeedBlob('a', np.array(1, dtype=np.int64))
    workspace.FeedBlob('b', np.array(5, dtype=np.int32))
    workspace.FeedBlob('z', np.array(0, dtype=np.int64))
    with pytest.raises(errors.DataTypeError) as ei:
        run_op('Range', ['a', 'b'], ['y'])
    check_error(ei, errors.DataTypeError, 'b')
    with pytest.raises(errors.InvalidArgumentError, match='Step size cannot be 0') as ei:
        run_op('Range', ['a', 'a', 'z'], ['y'])  # Caffe2's message
    check_error(ei, errors.InvalidArgumentError, 'z')


@pytest.mark.parametrize('dtype', [np.float32, np.float64, np.int32, np.int64, np.bool_,
                                   np.uint8, np.int8, np.int16, np.uint16, object])
def test_transpose_every_dtype(dtype):
    base = np.arange(24).reshape(2, 3, 4)
    x = base.astype(str).astype(object) if dtype is object else base.astype(dtype)
    if dtype is object:
        x = np.vectorize(lambda s: s.encode())(x).astype(object)
    workspace.FeedBlob('x', x)
    run_op('Transpose', ['x'], ['y'])
    np.testing.assert_array_equal(workspace.FetchBlob('y'), np.transpose(x))
    run_op('Transpose', ['x'], ['y'], axes=[1, 2, 0])
    np.testing.assert_array_equal(workspace.FetchBlob('y'), np.transpose(x, (1, 2, 0)))


def test_transpose_bad_axes():
    workspace.FeedBlob('x', np.zeros((2, 3), dtype=np.float32))
    for axes in ([0, 0], [0], [0, 2]):
        with pytest.raises(errors.InvalidArgumentError) as ei:
            run_op('Transpose', ['x'], ['y'], axes=axes)
        check_error(ei, errors.InvalidArgumentError, 'x')


def caffe2_slice_model(x, starts, ends):
    """numpy slicing with Caffe2's rule: a negative index i means dim + 1 + i."""
    idx = []
    for d, (s, e) in enumerate(zip(starts, ends)):
        n = x.shape[d]
        s = n + 1 + s if s < 0 else s
        e = n + 1 + e if e < 0 else e
        idx.append(slice(min(s, n), min(e, n)))
    return x[tuple(idx)]


@pytest.mark.parametrize('starts,ends', [
    ([0, 1], [2, -1]), ([1], [9]), ([-2], [-1]), ([0, 0, 1], [-1, 2, 3]), ([2, 3, 0], [3, 3, -1]),
])
def test_slice_by_args_and_by_inputs(starts, ends):
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    want = caffe2_slice_model(x, starts, ends)
    workspace.FeedBlob('x', x)
    run_op('Slice', ['x'], ['y'], starts=starts, ends=ends)
    np.testing.assert_array_equal(workspace.FetchBlob('y'), want)
    workspace.FeedBlob('s', np.array(starts, dtype=np.int32))
    workspace.FeedBlob('e', np.array(ends, dtype=np.int64))
    run_op('Slice', ['x', 's', 'e'], ['y'])
    np.testing.assert_array_equal(workspace.FetchBlob('y'), want)


def test_slice_errors():
    workspace.FeedBlob('x', np.zeros((3, 4), dtype=np.int32))
    with pytest.raises(errors.InvalidArgumentError) as ei:
        run_op('Slice', ['x'], ['y'], starts=[2], ends=[1])
    check_error(ei, errors.InvalidArgumentError, 'x')
    workspace.FeedBlob('f', np.zeros(2, dtype=np.float32))
    workspace.FeedBlob('e', np.zeros(2, dtype=np.int64))
    with pytest.raises(errors.DataTypeError) as ei:
        run_op('Slice', ['x', 'f', 'e'], ['y'])
    check_error(ei, errors.DataTypeError, 'f')
    with pytest.raises(errors.InvalidArgumentError):
        run_op('Slice', ['x'], ['y'])


def test_lengths_to_segment_ids():
    lengths = np.array([2, 0, 3, 1], dtype=np.int32)
    workspace.FeedBlob('l', lengths)
    run_op('LengthsToSegmentIds', ['l'], ['y'])
    y = workspace.FetchBlob('y')
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, np.repeat(np.arange(len(lengths)), lengths))
    workspace.FeedBlob('n', np.array([1, -1], dtype=np.int32))
    with pytest.raises(errors.InvalidArgumentError) as ei:
        run_op('LengthsToSegmentIds', ['n'], ['y'])
    check_error(ei, errors.InvalidArgumentError, 'n')


@pytest.mark.parametrize('cshape,xshape,yshape', [
    ((2, 3), (2, 3), (2, 3)), ((2, 1), (3,), (2, 3)), ((), (4,), (1,)), ((3, 1, 2), (1, 4, 1), (2,)),
])
@pytest.mark.parametrize('dtype', [np.float32, np.int64, np.uint8, object])
def test_where_is_numpy_where(cshape, xshape, yshape, dtype):
    rng = np.random.RandomState(0)
    c = rng.rand(*cshape) > 0.5
    if dtype is object:
        x = np.full(xshape, b'x', dtype=object)
        y = np.full(yshape, b'y', dtype=object)
    else:
        x = (rng.rand(*xshape) * 100).astype(dtype)
        y = (rng.rand(*yshape) * 100).astype(dtype)
    workspace.FeedBlob('c', np.asarray(c))
    workspace.FeedBlob('x', x)
    workspace.FeedBlob('y', y)
    run_op('Where', ['c', 'x', 'y'], ['o'])
    np.testing.assert_array_equal(workspace.FetchBlob('o'), np.where(c, x, y))


def test_where_on_rows_and_errors():
    c = np.array([True, False, True])
    x = np.arange(6, dtype=np.float64).reshape(3, 2)
    y = -x
    workspace.FeedBlob('c', c)
    workspace.FeedBlob('x', x)
    workspace.FeedBlob('y', y)
    run_op('Where', ['c', 'x', 'y'], ['o'], broadcast_on_rows=1)
    np.testing.assert_array_equal(workspace.FetchBlob('o'), np.where(c[:, None], x, y))
    workspace.FeedBlob('i', np.array([1, 0, 1], dtype=np.int32))
    with pytest.raises(errors.DataTypeError) as ei:
        run_op('Where', ['i', 'x', 'y'], ['o'], broadcast_on_rows=1)
    check_error(ei, errors.DataTypeError, 'i')
    workspace.FeedBlob('f', y.astype(np.float32))
    with pytest.raises(errors.DataTypeError) as ei:
        run_op('Where', ['c', 'x', 'f'], ['o'], broadcast_on_rows=1)
    check_error(ei, errors.DataTypeError, 'f')
    with pytest.raises(errors.ShapeError):
        run_op('Where', ['c', 'x', 'y'], ['o'])
