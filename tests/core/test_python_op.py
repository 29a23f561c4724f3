"""Tests of the Python operator: ``Net.Python(f)`` (a function registered
under a token) and ``Net.Python((builder, args, kwargs))`` (the builder is
pickled into the op and called once per operator instance).

Builders are module-level functions so that they pickle; what they build
and how often they are called is recorded in module-level dictionaries,
keyed by a name unique to each test."""

import collections
import gc
import itertools
import sys
import threading
import traceback
import weakref

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.proto import NetDef

_ids = itertools.count()
_lock = threading.Lock()
BUILT = collections.Counter()              # key -> builder calls
CALLS = collections.Counter()              # key -> op calls
OBJECTS = collections.defaultdict(list)    # key -> objects built
REFS = collections.defaultdict(list)       # key -> weakrefs to them


def uid(prefix):
    return '%s_%d' % (prefix, next(_ids))


def count_call(key):
    with _lock:
        CALLS[key] += 1
        return CALLS[key]


class OpFailure(LookupError):
    """A user exception type that no library code raises."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


class BuilderFailure(ArithmeticError):
    pass


# ------------------------------------------------------------- builders --

class InstanceCounter:
    """Counts up the scalar in its output blob, recording what it read."""

    def __init__(self, key):
        self.key = key
        self.seen = []

    def __call__(self, inputs, outputs):
        out = outputs[0]
        value = int(out.data) if out.shape == () else 0   # empty at first
        self.seen.append(value)
        out.feed(np.array(value + 1, dtype=np.int64))
        count_call(self.key)


def make_instance_counter(key):
    with _lock:
        BUILT[key] += 1
    obj = InstanceCounter(key)
    with _lock:
        OBJECTS[key].append(obj)
    return obj


class Affine:
    def __init__(self, factor, offset):
        self.factor = factor
        self.offset = offset

    def __call__(self, inputs, outputs):
        outputs[0].feed(inputs[0].data * self.factor + self.offset)


def make_affine(factor, offset=0.0):
    return Affine(factor, offset)


def raise_from_instance(key, k):
    raise OpFailure('instance call %d failed' % k, code=k)


class FailingAt:
    def __init__(self, key, fail_at):
        self.key = key
        self.fail_at = fail_at

    def __call__(self, inputs, outputs):
        k = count_call(self.key)
        if k == self.fail_at:
            raise_from_instance(self.key, k)


def make_failing_at(key, fail_at):
    return FailingAt(key, fail_at)


def failing_builder(key):
    raise BuilderFailure('builder for %s refused' % key)


class Tracked:
    def __init__(self, key):
        self.key = key

    def __call__(self, inputs, outputs):
        count_call(self.key)


def make_tracked(key):
    obj = Tracked(key)
    with _lock:
        REFS[key].append(weakref.ref(obj))
    return obj


def alive(key):
    gc.collect()
    return sum(r() is not None for r in REFS[key])


def concurrent_plan(net, instances, iterations):
    """`instances` concurrent copies of a step running `net` `iterations`
    times, each copy in a child workspace of its own."""
    inst = core.execution_step(uid('inst'), net, num_iter=iterations,
                               create_workspace=True)
    return core.execution_step(uid('par'), [inst],
                               num_concurrent_instances=instances)


def frame_names(exc):
    return [f.name for f in traceback.extract_tb(exc.__traceback__)]


# --------------------------------------------------------- concurrency --

@pytest.mark.parametrize('ops_per_net', [1, 2])
def test_builder_once_per_op_instance_under_64_instances(ops_per_net):
    instances, iterations = 64, 5
    key = uid('conc')
    net = core.Net(uid('conc_net'))
    for j in range(ops_per_net):
        net.Python((make_instance_counter, [key], {}))([], ['mine_%d' % j])
    ws = workspace.Workspace()
    ws.run(concurrent_plan(net, instances, iterations))

    assert BUILT[key] == instances * ops_per_net
    assert CALLS[key] == instances * ops_per_net * iterations
    objs = OBJECTS[key]
    assert len(objs) == instances * ops_per_net
    assert len(set(map(id, objs))) == len(objs)
    # every op instance counted through its own, instance-local blob
    for obj in objs:
        assert obj.seen == list(range(iterations))
    for j in range(ops_per_net):
        assert not ws.has_blob('mine_%d' % j)


def test_registered_function_called_instances_times_iterations():
    instances, iterations = 64, 7
    calls = []
    threads = set()

    def counted(inputs, outputs):
        with _lock:
            calls.append(1)
            threads.add(threading.get_ident())

    net = core.Net(uid('tok_net'))
    net.Python(counted)([], [])
    ws = workspace.Workspace()
    ws.run(concurrent_plan(net, instances, iterations))
    assert len(calls) == instances * iterations
    assert len(threads) >= 2           # the instances really ran on threads


def test_concurrent_instances_share_parent_blobs_through_workspace():
    instances, iterations = 64, 3
    ws = workspace.Workspace()
    ws.feed_blob('base', np.array([2.0, 3.0], dtype=np.float32))
    totals = []

    def add_base(inputs, outputs, w):
        base = w.fetch_blob('base')
        local = w.fetch_blob('acc') if w.has_blob('acc') else np.zeros(2, np.float32)
        w.feed_blob('acc', local + base)       # a new name: child-local
        with _lock:
            totals.append(float(w.fetch_blob('acc').sum()))

    net = core.Net(uid('shared_net'))
    net.Python(add_base, pass_workspace=True)([], [])
    ws.run(concurrent_plan(net, instances, iterations))
    # each instance sees 5, 10, 15: its own 'acc', the parent's 'base'
    assert sorted(totals) == sorted([5.0, 10.0, 15.0] * instances)
    assert not ws.has_blob('acc')


# ------------------------------------------------------------ wrappers --

def test_inputs_and_outputs_wrappers_read_and_write_blobs():
    ws = workspace.Workspace()
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    ws.feed_blob('a', a)
    ws.feed_blob('b', np.array([10, 20, 30], dtype=np.int32))
    ws.feed_blob('s', np.array(7, dtype=np.int64))
    ws.feed_blob('e', np.array([1, 2, 3], dtype=np.int32))
    seen = {}

    def body(inputs, outputs):
        ia, ib, i_s = inputs
        seen['names'] = [w.name for w in inputs] + [w.name for w in outputs]
        seen['shapes'] = [ia.shape, ib.shape, i_s.shape]
        seen['a'] = ia.data.copy()
        seen['b'] = ib.data
        seen['s'] = i_s.data
        seen['out_shape_before'] = outputs[0].shape
        outputs[0].feed(ia.data * 2 + 1)
        seen['out_shape_after'] = outputs[0].shape
        outputs[1].reshape([2, 2])             # no dtype yet: float32 zeros
        outputs[2].feed(ib.data[::-1] + i_s.data)
        outputs[3].reshape([4])                # keeps the int32 dtype
        outputs[4].feed(b'raw bytes')
        # Caffe2's meaning: a write through .data reaches the blob (when the
        # function returns); every .data of a blob in one call is one array.
        d = ia.data
        d[...] = -1
        seen['same_array'] = ia.data is d

    net = core.Net(uid('wrap_net'))
    net.Python(body)(['a', 'b', 's'], ['c', 'd', 'f', 'e', 'g'])
    ws.run(net)

    assert seen['names'] == ['a', 'b', 's', 'c', 'd', 'f', 'e', 'g']
    # Tuples, as numpy and Caffe2 give them.
    assert seen['shapes'] == [(2, 3), (3,), ()]
    np.testing.assert_array_equal(seen['a'], a)
    assert seen['a'].dtype == np.float32
    np.testing.assert_array_equal(seen['b'], [10, 20, 30])
    assert seen['b'].dtype == np.int32
    assert int(seen['s']) == 7
    assert seen['out_shape_before'] == (0,)     # not written yet
    assert seen['out_shape_after'] == (2, 3)
    assert seen['same_array']

    c = ws.fetch_blob('c')
    np.testing.assert_array_equal(c, [[1, 3, 5], [7, 9, 11]])
    assert c.dtype == np.float32
    d = ws.fetch_blob('d')
    assert d.shape == (2, 2) and d.dtype == np.float32 and not d.any()
    f = ws.fetch_blob('f')
    np.testing.assert_array_equal(f, [37, 27, 17])
    e = ws.fetch_blob('e')
    assert e.shape == (4,) and e.dtype == np.int32 and not e.any()
    assert ws.fetch_blob('g') == b'raw bytes'
    np.testing.assert_array_equal(ws.fetch_blob('a'), np.full((2, 3), -1, np.float32))


def run_python_op(f, inputs, outputs, ws=None, pass_workspace=False):
    ws = ws or workspace.Workspace()
    net = core.Net(uid('data_net'))
    net.Python(f, pass_workspace=pass_workspace)(inputs, outputs)
    ws.run(net)
    return ws


def test_writes_through_data_reach_the_blob():
    # The example: this used to leave the blob unchanged, silently.
    ws = workspace.Workspace()
    ws.feed_blob('y', np.zeros(3, np.float32))

    def f(i, o):
        o[0].data[...] = 5
    run_python_op(f, [], ['y'], ws)
    np.testing.assert_array_equal(ws.fetch_blob('y'), [5, 5, 5])
    assert ws.fetch_blob('y').dtype == np.float32


def test_caffe2_idiom_reshape_then_write_data():
    def f(i, o):
        o[0].reshape((2, 2))
        o[0].data[...] = i[0].data.reshape(2, 2) * 10
        o[1].reshape((3,))           # an int64 tensor of zeros after the feed
        o[1].feed(np.zeros(3, np.int64))
        o[1].data[1] = 7
        o[1].data[2] = 8             # a second .data: the same array
    ws = workspace.Workspace()
    ws.feed_blob('x', np.arange(4, dtype=np.float32))
    run_python_op(f, ['x'], ['a', 'b'], ws)
    np.testing.assert_array_equal(ws.fetch_blob('a'), [[0, 10], [20, 30]])
    np.testing.assert_array_equal(ws.fetch_blob('b'), [0, 7, 8])
    assert ws.fetch_blob('b').dtype == np.int64


def test_in_place_input_and_output_share_one_array():
    def f(i, o):
        assert i[0].data is o[0].data
        i[0].data[0] = 1.5
        o[0].data[1] = 2.5
    ws = workspace.Workspace()
    ws.feed_blob('x', np.zeros(2, np.float64))
    run_python_op(f, ['x'], ['x'], ws)
    np.testing.assert_array_equal(ws.fetch_blob('x'), [1.5, 2.5])


def test_every_bit_of_a_write_counts():
    # -0.0 == 0.0 and NaN != NaN for ==; the write-back compares bits.
    def f(i, o):
        o[0].data[0] = -0.0
        o[1].data[...] = o[1].data  # rewriting a NaN with itself: no change
        o[2].data[0] = b'changed'
    ws = workspace.Workspace()
    ws.feed_blob('z', np.zeros(2, np.float32))
    ws.feed_blob('n', np.array([np.nan], np.float32))
    ws.feed_blob('s', np.array([b'one', b'two'], dtype=object))
    run_python_op(f, [], ['z', 'n', 's'], ws)
    z = ws.fetch_blob('z')
    assert np.signbit(z[0]) and not np.signbit(z[1])
    assert np.isnan(ws.fetch_blob('n')[0])
    assert ws.fetch_blob('s').tolist() == [b'changed', b'two']


def test_an_unchanged_array_does_not_overwrite_the_blob():
    # Only changed arrays are written back: a blob fed meanwhile (here
    # through the workspace) keeps the new value.
    def f(i, o, ws):
        assert o[0].data[0] == 1
        ws.feed_blob(o[0].name, np.array([2], np.int32))
    ws = workspace.Workspace()
    ws.feed_blob('v', np.array([1], np.int32))
    run_python_op(f, [], ['v'], ws, pass_workspace=True)
    assert ws.fetch_blob('v').tolist() == [2]


def test_writes_that_cannot_reach_the_blob_raise():
    kept = []

    def f(i, o):
        before = o[0].data
        o[0].feed(np.array([1.0, 2.0], np.float32))
        kept.append(o[0].data)
        with pytest.raises(ValueError, match='read-only'):
            before[0] = 3            # superseded by the feed
        before2 = o[1].data
        o[1].reshape((2,))
        with pytest.raises(ValueError, match='read-only'):
            before2[0] = 3           # superseded by the reshape
        with pytest.raises(ValueError, match='read-only'):
            o[2].data[...] = 1       # an empty blob: reshape or feed first
        kept.append(o)
    ws = workspace.Workspace()
    ws.feed_blob('p', np.zeros(1, np.float32))
    ws.feed_blob('q', np.zeros(1, np.float32))
    run_python_op(f, [], ['p', 'q', 'r'], ws)
    # After the call, the arrays handed out and any new .data are read-only.
    with pytest.raises(ValueError, match='read-only'):
        kept[0][0] = 9
    with pytest.raises(ValueError, match='read-only'):
        kept[1][0].data[0] = 9
    np.testing.assert_array_equal(ws.fetch_blob('p'), [1.0, 2.0])
    np.testing.assert_array_equal(ws.fetch_blob('q'), [0.0, 0.0])


def test_a_failing_function_writes_nothing_back():
    def f(i, o):
        o[0].data[...] = 9
        raise OpFailure('late', 1)
    ws = workspace.Workspace()
    ws.feed_blob('w', np.zeros(2, np.int64))
    with pytest.raises(OpFailure):
        run_python_op(f, [], ['w'], ws)
    assert ws.fetch_blob('w').tolist() == [0, 0]


def test_fetch_returns_a_copy():
    ws = workspace.Workspace()
    ws.feed_blob('c', np.arange(3, dtype=np.int32))
    got = ws.fetch_blob('c')
    got[0] = 99
    assert ws.fetch_blob('c').tolist() == [0, 1, 2]
    for fetch in (workspace.FetchBlob, workspace.Workspace.fetch_blob,
                  workspace.Blob.fetch):
        assert 'copy' in fetch.__doc__


def test_in_place_python_op_in_a_created_net():
    ws = workspace.Workspace()
    ws.feed_blob('x', np.array([1, 2], dtype=np.int64))

    def double_plus_one(inputs, outputs):
        outputs[0].feed(inputs[0].data * 2 + 1)

    net = core.Net(uid('inplace_net'))
    net.Python(double_plus_one)(['x'], ['x'])
    ws.create_net(net)
    ws.run_net(net.Name(), num_iter=3)
    # 1 -> 3 -> 7 -> 15, 2 -> 5 -> 11 -> 23
    np.testing.assert_array_equal(ws.fetch_blob('x'), [15, 23])


def test_builder_tuple_passes_args_and_kwargs():
    ws = workspace.Workspace()
    ws.feed_blob('u', np.array([1.0, -2.0, 0.5], dtype=np.float64))
    net = core.Net(uid('affine_net'))
    net.Python((make_affine, [3.0], {'offset': 0.25}))(['u'], ['v'])
    net.Python((make_affine, (-1.0,), {}))(['v'], ['w'])
    ws.run(net)
    np.testing.assert_array_equal(ws.fetch_blob('v'), [3.25, -5.75, 1.75])
    np.testing.assert_array_equal(ws.fetch_blob('w'), [-3.25, 5.75, -1.75])


# ------------------------------------------------------ pass_workspace --

def test_pass_workspace_gives_a_workspace_with_fetchable_blobs():
    ws = workspace.Workspace()
    ws.feed_blob('p', np.array([1.5, 2.5], dtype=np.float32))
    seen = {}

    def body(inputs, outputs, w):
        seen['type'] = type(w)
        seen['p'] = w.fetch_blob('p')
        seen['k'] = w.fetch_blob('k')           # written earlier in this net
        seen['has'] = (w.has_blob('p'), w.has_blob('no_such_blob'))
        w.feed_blob('q', np.array([7], dtype=np.int64))
        outputs[0].feed(inputs[0].data + w.fetch_blob('p'))

    net = core.Net(uid('pw_net'))
    net.Const(np.array([4, 5, 6], dtype=np.int32), blob_out='k')
    net.Python(body, pass_workspace=True)(['p'], ['r'])
    ws.run(net)

    assert seen['type'] is workspace.Workspace
    np.testing.assert_array_equal(seen['p'], [1.5, 2.5])
    np.testing.assert_array_equal(seen['k'], [4, 5, 6])
    assert seen['has'] == (True, False)
    np.testing.assert_array_equal(ws.fetch_blob('q'), [7])
    np.testing.assert_array_equal(ws.fetch_blob('r'), [3.0, 5.0])


def _read_into_seen(key):
    def body(inputs, outputs, w):
        with _lock:
            OBJECTS[key].append(sorted(b for b in w.blobs.keys()
                                       if b.startswith('pw_')))
        w.feed_blob('pw_child_only', np.array(1, dtype=np.int64))
        w.feed_blob('pw_parent', np.array(99, dtype=np.int64))
    return body


def make_workspace_reader(key):
    return _read_into_seen(key)


def test_pass_workspace_with_builder_in_child_workspace():
    key = uid('pwb')
    ws = workspace.Workspace()
    ws.feed_blob('pw_parent', np.array(1, dtype=np.int64))
    net = core.Net(uid('pwb_net'))
    net.Python((make_workspace_reader, [key], {}), pass_workspace=True)([], [])
    ws.run(concurrent_plan(net, 4, 2))
    # each instance: first call sees the parent's blob only, second call
    # also its own child-local blob
    assert sorted(map(tuple, OBJECTS[key])) == sorted(
        [('pw_parent',)] * 4 + [('pw_child_only', 'pw_parent')] * 4)
    assert not ws.has_blob('pw_child_only')
    # an existing parent blob is written through
    assert int(ws.fetch_blob('pw_parent')) == 99


# ---------------------------------------------------------- exceptions --

def test_exception_keeps_type_object_and_traceback():
    raised = []

    def raising_function(inputs, outputs):
        e = OpFailure('user code failed', code=41)
        raised.append(e)
        raise e

    ws = workspace.Workspace()
    net = core.Net(uid('raise_net'))
    net.Python(raising_function)([], [])
    for run in (lambda: ws.run(net),
                lambda: (ws.create_net(net, overwrite=True),
                         ws.run_net(net.Name())),
                lambda: ws.run(core.execution_step(uid('s'), net, num_iter=3))):
        with pytest.raises(OpFailure) as ei:
            run()
        assert ei.value is raised[-1]
        assert ei.value.code == 41
        assert str(ei.value) == 'user code failed'
        assert 'raising_function' in frame_names(ei.value)
    assert len(raised) == 3
    # the workspace still works afterwards
    ok = core.Net(uid('ok_net'))
    ok.Const(np.array([1], dtype=np.int64), blob_out='after')
    ws.run(ok)
    np.testing.assert_array_equal(ws.fetch_blob('after'), [1])


def test_exception_from_a_concurrent_instance_builder_form():
    key = uid('fail')
    net = core.Net(uid('fail_net'))
    net.Python((make_failing_at, [key, 100], {}))([], [])
    ws = workspace.Workspace()
    with pytest.raises(OpFailure) as ei:
        ws.run(concurrent_plan(net, 64, 3))
    assert str(ei.value) == 'instance call 100 failed'
    assert ei.value.code == 100
    names = frame_names(ei.value)
    assert 'raise_from_instance' in names and '__call__' in names
    assert 100 <= CALLS[key] <= 64 * 3


def test_exception_from_a_concurrent_instance_token_form():
    calls = []

    def fails_on_call_50(inputs, outputs):
        with _lock:
            calls.append(1)
            k = len(calls)
        if k == 50:
            raise OpFailure('call %d failed' % k, code=k)

    net = core.Net(uid('tok_fail_net'))
    net.Python(fails_on_call_50)([], [])
    ws = workspace.Workspace()
    with pytest.raises(OpFailure) as ei:
        ws.run(concurrent_plan(net, 64, 2))
    assert str(ei.value) == 'call 50 failed'
    assert 'fails_on_call_50' in frame_names(ei.value)


def test_exception_in_the_builder_keeps_its_type():
    key = uid('bfail')
    net = core.Net(uid('bfail_net'))
    net.Python((failing_builder, [key], {}))([], [])
    ws = workspace.Workspace()
    with pytest.raises(BuilderFailure) as ei:
        ws.create_net(net)
    assert str(ei.value) == 'builder for %s refused' % key
    assert 'failing_builder' in frame_names(ei.value)
    with pytest.raises(BuilderFailure):
        ws.run(net)
    # also when the nets are created by 64 concurrent instances
    with pytest.raises(BuilderFailure) as ei:
        ws.run(concurrent_plan(net, 64, 2))
    assert 'failing_builder' in frame_names(ei.value)


# ------------------------------------------------------------ releases --

def test_builder_callable_released_when_the_net_is_deleted():
    key = uid('rel')
    net = core.Net(uid('rel_net'))
    net.Python((make_tracked, [key], {}))([], [])
    ws = workspace.Workspace()

    ws.create_net(net)
    ws.run_net(net.Name(), num_iter=3)
    assert CALLS[key] == 3
    assert len(REFS[key]) == 1 and alive(key) == 1
    # replacing the net deletes the old one, and its op
    empty = NetDef()
    empty.name = net.Name()
    ws.create_net(empty, overwrite=True)
    assert alive(key) == 0

    # a net run once is deleted after the run
    ws.run(net)
    assert len(REFS[key]) == 2 and alive(key) == 0

    # a net that lives in a workspace dies with it
    ws.create_net(net, overwrite=True)
    assert alive(key) == 1
    del ws
    assert alive(key) == 0
    assert CALLS[key] == 4


def test_builder_callables_of_64_instances_released_after_the_plan():
    key = uid('rel64')
    net = core.Net(uid('rel64_net'))
    net.Python((make_tracked, [key], {}))([], [])
    ws = workspace.Workspace()
    ws.run(concurrent_plan(net, 64, 2))
    assert len(REFS[key]) == 64
    assert CALLS[key] == 128
    assert alive(key) == 0


def test_registered_callable_not_kept_by_deleted_nets():
    # A token-registered function stays in the process-wide registry (as in
    # Caffe2); the op instances must not keep further references to it.
    class Callable:
        def __call__(self, inputs, outputs):
            pass

    f = Callable()
    net = core.Net(uid('tok_rel_net'))
    net.Python(f)([], [])
    gc.collect()
    baseline = sys.getrefcount(f)
    ws = workspace.Workspace()
    for _ in range(20):
        ws.create_net(net, overwrite=True)
        ws.run_net(net.Name())
    ws.run(concurrent_plan(net, 64, 2))
    ws.run(net)
    del ws
    gc.collect()
    assert sys.getrefcount(f) == baseline
