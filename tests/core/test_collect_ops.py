"""Split, Concat, PackRecords/UnPackRecords, the tensor vector ops and
LastNWindowCollector, driven from Python the way Caffe2 programs use them
(nets, plans, the schema helpers).

Expected values come from plain numpy models written here.
"""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace
from ferrocaffe.schema import (
    FeedRecord, List, Map, NewRecord, Scalar, Struct, from_blob_list)


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def run_op(op_type, inputs, outputs, **kwargs):
    workspace.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, **kwargs))


# ------------------------------------------------------------ Split/Concat --

def test_split_and_concat_match_numpy():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    workspace.FeedBlob('x', x)
    run_op('Split', ['x'], ['a', 'b', 'c'], axis=2, split=[1, 2, 1])
    for name, want in zip('abc', np.split(x, [1, 3], axis=2)):
        np.testing.assert_array_equal(workspace.FetchBlob(name), want)
    run_op('Concat', ['a', 'b', 'c'], ['y', 'split_info'], axis=2)
    np.testing.assert_array_equal(workspace.FetchBlob('y'), x)
    np.testing.assert_array_equal(workspace.FetchBlob('split_info'),
                                  np.array([1, 2, 1], dtype=np.int32))
    # The sizes as a second input; equal parts by default (axis 1).
    workspace.FeedBlob('sizes', np.array([2, 1], dtype=np.int32))
    run_op('Split', ['x', 'sizes'], ['p', 'q'], axis=1)
    np.testing.assert_array_equal(workspace.FetchBlob('q'), x[:, 2:, :])
    run_op('Split', ['x'], ['r', 's', 't'])
    np.testing.assert_array_equal(workspace.FetchBlob('t'), x[:, 2:3, :])
    # Concat(add_axis) stacks; Split(add_axis) unstacks.
    run_op('Concat', ['r', 's', 't'], ['st', 'info'], axis=0, add_axis=1)
    np.testing.assert_array_equal(workspace.FetchBlob('st'),
                                  np.stack([x[:, i:i + 1, :] for i in range(3)]))
    np.testing.assert_array_equal(workspace.FetchBlob('info'),
                                  np.ones(3, dtype=np.int32))
    run_op('Split', ['st'], ['u0', 'u1', 'u2'], axis=0, add_axis=1)
    np.testing.assert_array_equal(workspace.FetchBlob('u1'), x[:, 1:2, :])


def test_split_errors_are_typed():
    workspace.FeedBlob('x', np.zeros((2, 5), dtype=np.float32))
    with pytest.raises(errors.InvalidArgumentError, match='should be divisible') as e:
        run_op('Split', ['x'], ['a', 'b'])
    assert e.value.blob == 'x' and e.value.op == 'Split'
    with pytest.raises(errors.InvalidArgumentError, match='do not match'):
        run_op('Split', ['x'], ['a', 'b'], split=[1, 1])
    workspace.FeedBlob('sizes', np.array([2, 3], dtype=np.int64))
    with pytest.raises(errors.DataTypeError, match='int32') as e:
        run_op('Split', ['x', 'sizes'], ['a', 'b'])
    assert e.value.blob == 'sizes'
    with pytest.raises(errors.InvalidArgumentError, match='do not pass in split'):
        run_op('Split', ['x', 'sizes'], ['a', 'b'], split=[2, 3])
    # Caffe2's code catches RuntimeError.
    with pytest.raises(RuntimeError):
        run_op('Split', ['x'], ['a'], axis=0, order='NCHW')


# ---------------------------------------------------- PackRecords/UnPack --

def test_pack_unpack_is_an_identity_on_a_nested_dataset():
    schema = Struct(
        ('floats', Map(Scalar(np.int32), Scalar(np.float32))),
        ('int_lists', Map(Scalar(np.int32), List(Scalar(np.int64)))),
        ('text', Scalar(str)),
    )
    contents = from_blob_list(schema, [
        np.array([1, 2, 0], dtype=np.int32),
        np.array([11, 21, 22], dtype=np.int32),
        np.array([1.5, 2.5, 2.75], dtype=np.float32),
        np.array([2, 0, 1], dtype=np.int32),
        np.array([7, 8, 9], dtype=np.int32),
        np.array([1, 3, 0], dtype=np.int32),
        np.array([100, 200, 201, 202], dtype=np.int64),
        np.array([b'a', b'bc', b''], dtype=object),
    ])
    fields = schema.field_names()
    net = core.Net('pack_unpack')
    batch = NewRecord(net, contents)
    FeedRecord(batch, contents)
    packed = net.PackRecords(batch.field_blobs(), 1, fields=fields)
    unpacked = packed.UnPackRecords([], len(fields), fields=fields)
    workspace.RunNetOnce(net)
    for before, after in zip(batch.field_blobs(), unpacked):
        np.testing.assert_array_equal(workspace.FetchBlob(before),
                                      workspace.FetchBlob(after))


def test_unpacking_nothing_needs_prototypes():
    workspace.FeedBlob('label', np.zeros((0, 2), dtype=np.float32))
    run_op('PackRecords', ['label'], ['packed'], fields=['label'])
    with pytest.raises(errors.InvalidArgumentError, match='without shape'):
        run_op('UnPackRecords', ['packed'], ['out'], fields=['label'])
    run_op('UnPackRecords', ['packed', 'label'], ['out'], fields=['label'])
    out = workspace.FetchBlob('out')
    assert out.shape == (0, 2) and out.dtype == np.float32


# ------------------------------------------------------- tensor vectors --

def test_collect_tensor_samples_whole_runs():
    # Caffe2's usage: three blobs counted up each iteration, collected
    # together into three vectors, then concatenated.
    init = core.Net('init')
    blobs = ['blob_1', 'blob_2', 'blob_3']
    one = init.ConstantFill([], 'ONE', shape=[1, 2], value=1.0)
    for b in blobs:
        init.ConstantFill([], [b], shape=[1, 2], value=0.0)
        init.CreateTensorVector([], [b + '_vec'])
    reader = core.Net('reader')
    for b in blobs:
        reader.Add([b, one], [b])
    collect = core.Net('collect')
    limit, total = 50, 2000
    vecs = [b + '_vec' for b in blobs]
    collect.CollectTensor(vecs + blobs, vecs, num_to_collect=limit)
    plan = core.Plan('collect_data')
    plan.AddStep(core.execution_step('init', init))
    plan.AddStep(core.execution_step('collect', [reader, collect], num_iter=total))
    workspace.RunPlan(plan)

    concat = core.Net('concat')
    for b in blobs:
        concat.ConcatTensorVector([b + '_vec'], [b + '_all'])
        concat.TensorVectorSize([b + '_vec'], [b + '_size'])
    workspace.RunNetOnce(concat)
    first = workspace.FetchBlob('blob_1_all')
    assert first.shape == (limit, 2)
    size = workspace.FetchBlob('blob_1_size')
    assert size.shape == () and size.dtype == np.int32 and size.item() == limit
    values = first[:, 0]
    assert len(set(values.tolist())) == limit
    assert values.min() >= 1 and values.max() <= total
    hist, _ = np.histogram(values, bins=5, range=(1, total))
    assert (hist > 0.4 * limit / 5).all(), hist
    for b in blobs[1:]:
        np.testing.assert_array_equal(workspace.FetchBlob(b + '_all'), first)


def test_tensor_vector_errors():
    workspace.FeedBlob('x', np.ones(3, dtype=np.float32))
    with pytest.raises(errors.DataTypeError, match='TensorVector') as e:
        run_op('TensorVectorSize', ['x'], ['n'])
    assert e.value.blob == 'x'
    run_op('CreateTensorVector', [], ['v'])
    with pytest.raises(errors.InvalidArgumentError, match='empty tensor vector'):
        run_op('ConcatTensorVector', ['v'], ['c'])
    with pytest.raises(errors.InvalidArgumentError, match='num_to_collect'):
        run_op('CollectTensor', ['v', 'x'], ['v'])
    with pytest.raises(errors.DataTypeError, match='cannot be saved'):
        run_op('Save', ['v'], [], db='/nonexistent/never', db_type='minidb',
               absolute_path=True)


# ------------------------------------------------- LastNWindowCollector --

def last_n_model(batches, n):
    """Caffe2's buffer layout: a batch longer than the window leaves its
    last n rows at 0..n; otherwise rows go to the next slot, the buffer
    growing to n rows and then wrapping."""
    buf, nxt = [], 0
    for batch in batches:
        if len(batch) > n:
            buf, nxt = list(batch[-n:]), 0
            continue
        for row in batch:
            if nxt == len(buf):
                buf.append(row)
            else:
                buf[nxt] = row
            nxt = (nxt + 1) % n
    return np.array(buf), nxt


def test_last_n_window_through_plans():
    # As Caffe2's test: an empty buffer, next = 0, a 3 x 2 input, N = 7.
    net = core.Net('collect_net')
    net.GivenTensorFill([], 'input', shape=[3, 2], values=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    workspace.CreateBlob('output')
    workspace.FeedBlob('next', np.array(0, dtype=np.int32))
    net.LastNWindowCollector(['output', 'next', 'input'], ['output', 'next'],
                             num_to_collect=7)
    rows = np.arange(1, 7, dtype=np.float32).reshape(3, 2)
    done = 0
    for iters in (1, 2, 3):
        plan = core.Plan('collect_data')
        plan.AddStep(core.execution_step('collect_data', [net], num_iter=iters))
        workspace.RunPlan(plan)
        done += iters
        want, nxt = last_n_model([rows] * done, 7)
        np.testing.assert_array_equal(workspace.FetchBlob('output'), want)
        assert workspace.FetchBlob('next') == nxt


def test_last_n_window_with_mutex_and_num_visited():
    workspace.RunOperatorOnce(core.CreateOperator('CreateMutex', [], ['mutex']))
    workspace.CreateBlob('buf')
    workspace.FeedBlob('next', np.array(0, dtype=np.int32))
    workspace.FeedBlob('visited', np.array([0], dtype=np.int64))
    workspace.FeedBlob('data', np.zeros((0, 3), dtype=np.int64))
    op = core.CreateOperator(
        'LastNWindowCollector', ['buf', 'next', 'data', 'mutex', 'visited'],
        ['buf', 'next', 'visited'], num_to_collect=4)
    batches, v = [], 0
    for size in (0, 3, 2, 6, 1, 0, 3):
        # (np.zeros for the empty batch: feeding an empty np.arange(...)
        # .reshape(0, 3) panics in the feed path, reported separately.)
        batch = (np.arange(v, v + 3 * size, dtype=np.int64).reshape(size, 3)
                 if size else np.zeros((0, 3), dtype=np.int64))
        v += 3 * size
        batches.append(batch)
        workspace.FeedBlob('data', batch)
        workspace.RunOperatorOnce(op)
        want, nxt = last_n_model(batches, 4)
        got = workspace.FetchBlob('buf')
        if len(want):
            np.testing.assert_array_equal(got, want)
            assert workspace.FetchBlob('next') == nxt
        else:
            assert got.shape == (0, 3)
        assert workspace.FetchBlob('visited').tolist() == [sum(len(b) for b in batches)]
    # A buffer of another dtype is refused and left as it was.
    workspace.FeedBlob('data', np.ones((1, 3), dtype=np.float32))
    before = workspace.FetchBlob('buf')
    with pytest.raises(errors.DataTypeError) as e:
        workspace.RunOperatorOnce(op)
    assert e.value.blob == 'buf'
    np.testing.assert_array_equal(workspace.FetchBlob('buf'), before)
    with pytest.raises(errors.InvalidArgumentError, match='num_to_collect'):
        workspace.RunOperatorOnce(core.CreateOperator(
            'LastNWindowCollector', ['buf', 'next', 'data'], ['buf', 'next']))
