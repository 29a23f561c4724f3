"""Tests of ferrocaffe.dataio and ferrocaffe.dataset: the reader/writer
protocols, an in-memory Dataset written and read back, and the limiting and
composite readers run through plans and sessions.

Expected values are computed here in plain Python from the input data.
"""

import threading

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace
from ferrocaffe.dataio import (
    CompositeReader, CompositeReaderBuilder, CountUntil, CounterReader, Pipe,
    PipedReaderBuilder, Reader, ReaderBuilder, ReaderWithLimit,
    ReaderWithTimeLimit, Writer)
from ferrocaffe.dataset import Const, Dataset
from ferrocaffe.net_builder import ops
from ferrocaffe.pipeline import ProcessingReader, pipe
from ferrocaffe.schema import (
    FeedRecord, FetchRecord, List, Map, NewRecord, Scalar, Struct,
    from_blob_list)
from ferrocaffe.session import LocalSession
from ferrocaffe.task import TaskGroup, WorkspaceType, final_output


def scalar(value):
    return np.asarray(value).reshape(-1)[0]


def fetch_dataset(ws, ds):
    return [ws.blobs[str(b)].fetch() for b in ds.get_blobs()]


def source_dataset(ws, name='src', **columns):
    values = Struct(*columns.items())
    init = core.Net(name + '_init')
    with core.NameScope(name):
        blobs = NewRecord(init, values)
    FeedRecord(blobs, values, ws)
    return Dataset(blobs, name=name)


def empty_dataset(session, schema, name='dst'):
    init = core.Net(name + '_init')
    with core.NameScope(name):
        ds = Dataset(schema.clone_schema(), name=name)
        ds.init_empty(init)
    session.run(init)
    return ds, init


class Collector(object):
    """A processor that records, thread-safely, the arrays it is given."""

    def __init__(self):
        self.batches = []
        self._lock = threading.Lock()

    def net_op(self, net, blobs):
        def keep(inputs, outputs):
            with self._lock:
                self.batches.append(
                    [np.atleast_1d(i.data).copy() for i in inputs])
        net.Python(keep)(list(blobs), [])

    def __call__(self, rec):
        self.net_op(ops, rec.field_blobs())

    def column(self, i=0):
        return [v for batch in self.batches for v in batch[i].tolist()]


# --------------------------------------------------------- base classes --

def test_reader_and_writer_base_classes():
    with pytest.raises(AssertionError):
        Reader(schema='not a field')
    reader = Reader()
    with pytest.raises(AssertionError, match='Schema not provided'):
        reader.schema()
    with pytest.raises(NotImplementedError, match='must implement `read`'):
        reader.read(core.Net('r'))
    with pytest.raises(NotImplementedError, match='cannot be resetted'):
        reader.reset(core.Net('r'))
    assert reader.setup_ex(core.Net('i'), core.Net('e')) is None

    writer = Writer()
    assert writer.schema() is None
    with pytest.raises(NotImplementedError, match='must implement write'):
        writer.write(core.Net('w'), [])

    class ListWriter(Writer):
        def __init__(self):
            self.written = []

        def write(self, writer_net, fields):
            self.written.append(list(fields))

    w = ListWriter()
    rec = Struct(('a', Scalar(np.int32, core.BlobReference('x'))))
    local_init = core.Net('local_init')
    nets, status = w.write_record_ex(rec, local_init, core.Net('e'))
    assert w.schema() is rec
    assert w.written == [[core.BlobReference('x')]]
    assert len(nets) == 1 and isinstance(nets[0], core.Net)
    assert 'dequeue_status' in str(status)
    nets, status = w.write_record_ex([core.BlobReference('y')], local_init,
                                     core.Net('e'), 'given_status')
    assert status == 'given_status'
    w.write_record(core.Net('w2'), rec)
    assert w.written[-1] == [core.BlobReference('x')]


def test_pipe_counts_and_registers_readers_and_writers():
    p = Pipe(obj_key='my_key')
    init = core.Net('i')
    schema = Struct(('a', np.int32))
    p._new_writer(schema, init)
    p._new_reader(init)
    p._new_reader(init)
    assert p.num_writers() == 1 and p.num_readers() == 2
    assert p.schema() is schema
    assert init.get_attributes('my_key') == [p, p, p]
    quiet = Pipe()
    quiet._new_reader(init)
    assert init.get_attributes('my_key') == [p, p, p]
    with pytest.raises(NotImplementedError):
        Pipe().reader()


def test_reader_builders():
    class DsBuilder(ReaderBuilder):
        def __init__(self, ds):
            self.ds = ds
            self.setups = 0

        def schema(self):
            return self.ds.schema

        def setup(self, **kwargs):
            self.setups += 1

        def new_reader(self, **kwargs):
            return self.ds.reader()

    ws = workspace.Workspace()
    a = source_dataset(ws, 'a', x=np.arange(3, dtype=np.int64))
    b = source_dataset(ws, 'b', y=np.arange(3, dtype=np.float32))
    ba, bb = DsBuilder(a), DsBuilder(b)
    composite = CompositeReaderBuilder(['first', 'second'], [ba, bb])
    assert composite.schema().field_names() == ['first:x', 'second:y']
    composite.setup()
    assert ba.setups == 1 and bb.setups == 1
    reader = composite.new_reader()
    assert isinstance(reader, CompositeReader)
    assert reader.schema() == composite.schema()

    piped = PipedReaderBuilder(
        ba, lambda reader, **kw: pipe(reader, processor=lambda r: r,
                                      num_threads=0))
    assert piped.schema() is a.schema
    assert isinstance(piped.new_reader(), ProcessingReader)


# ------------------------------------------------------------- datasets --

RECORDS = [
    # (id, tags, score)
    (10, [1, 2], 0.5),
    (11, [], 1.5),
    (12, [3], 2.5),
    (13, [4, 5, 6], 3.5),
    (14, [7], 4.5),
]
SCHEMA = Struct(('id', np.int64), ('tags', List(np.int32)),
                ('score', np.float32))


def columns(records):
    """The dataset columns of a list of records, in field order."""
    return [
        np.array([r[0] for r in records], dtype=np.int64),
        np.array([len(r[1]) for r in records], dtype=np.int32),
        np.array([t for r in records for t in r[1]], dtype=np.int32),
        np.array([r[2] for r in records], dtype=np.float32),
    ]


def assert_columns(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert g.tolist() == w.tolist()


def write_records(ws, ds, writer, batches):
    """Appends each batch of records with one run of a write net."""
    net = core.Net('write')
    with core.NameScope('batch'):  # not the dataset's own column names
        blobs = NewRecord(net, SCHEMA)
    writer.write_record(net, blobs)
    for batch in batches:
        FeedRecord(blobs, columns(batch), ws)
        ws.run(net)


def test_dataset_written_and_read_back():
    ws = workspace.Workspace()
    ds = Dataset(SCHEMA)
    assert ds.field_names() == ['id', 'tags:lengths', 'tags:values', 'score']
    init = core.Net('init')
    ds.init_empty(init)
    writer = ds.writer(init)
    ws.run(init)
    assert_columns(fetch_dataset(ws, ds), columns([]))

    write_records(ws, ds, writer, [RECORDS[:2], RECORDS[2:]])
    assert_columns(fetch_dataset(ws, ds), columns(RECORDS))
    content = FetchRecord(ds.content(), ws=ws)
    assert content.tags.lengths().tolist() == [2, 0, 1, 3, 1]

    read_init = core.Net('read_init')
    reader = ds.reader(read_init, batch_size=2)
    ws.run(read_init)
    collector = Collector()
    read_step, batch = reader.execution_step()
    consume = core.Net('consume')
    collector.net_op(consume, batch.field_blobs())
    read_step.AddNet(consume)
    ws.run(read_step)
    expected = [RECORDS[0:2], RECORDS[2:4], RECORDS[4:5]]
    assert len(collector.batches) == len(expected)
    for got, want in zip(collector.batches, expected):
        assert_columns(got, columns(want))

    # after a reset the same reader reads everything again
    reset = core.Net('reset')
    reader.reset(reset)
    ws.run(reset)
    collector.batches = []
    ws.run(read_step)
    assert [b[0].tolist() for b in collector.batches] == [
        [10, 11], [12, 13], [14]]


def test_reading_past_the_end_gives_empty_batches():
    ws = workspace.Workspace()
    ds = source_dataset(ws, 'src', id=np.array([1, 2, 3], dtype=np.int64))
    init = core.Net('init')
    reader = ds.reader(init, batch_size=2)
    read = core.Net('read')
    should_stop, fields = reader.read_record(read)
    ws.run(init)
    seen = []
    for _ in range(4):
        ws.run(read)
        seen.append((FetchRecord(fields, ws=ws).id().tolist(),
                     bool(scalar(ws.fetch_blob(str(should_stop))))))
    assert seen == [([1, 2], False), ([3], False), ([], True), ([], True)]


def test_enforce_batch_size_drops_the_partial_batch():
    ws = workspace.Workspace()
    ds = source_dataset(ws, 'src', id=np.arange(10, dtype=np.int64))
    init = core.Net('init')
    reader = ds.reader(init, batch_size=4, enforce_batch_size=True)
    ws.run(init)
    collector = Collector()
    read_step, batch = reader.execution_step('full_batches')
    consume = core.Net('consume')
    collector.net_op(consume, batch.field_blobs())
    read_step.AddNet(consume)
    ws.run(read_step)
    assert [b[0].tolist() for b in collector.batches] == [
        [0, 1, 2, 3], [4, 5, 6, 7]]


def test_random_reader_follows_the_given_indices():
    ws = workspace.Workspace()
    ids = np.array([100, 101, 102, 103], dtype=np.int64)
    ds = source_dataset(ws, 'src', id=ids)
    order = [2, 0, 3, 1]
    init = core.Net('init')
    indices = init.Const(np.array(order, dtype=np.int64))
    reader = ds.random_reader(init, indices, batch_size=1)
    reader.computeoffset(init)
    read = core.Net('read')
    should_stop, fields = reader.read_record(read)
    ws.run(init)
    seen = []
    for _ in range(len(order) + 1):
        ws.run(read)
        seen.append(FetchRecord(fields, ws=ws).id().tolist())
    assert seen == [[int(ids[i])] for i in order] + [[]]
    assert scalar(ws.fetch_blob(str(should_stop)))


def test_dataset_const_feeds_the_current_workspace():
    net = core.Net('const_net')
    blob = Const(net, [4, 5], dtype=np.int32, name='k')
    try:
        assert str(blob) in [str(b) for b in net.external_inputs]
        got = workspace.FetchBlob(str(blob))
        assert got.dtype == np.int32 and got.tolist() == [4, 5]
    finally:
        workspace.RemoveBlob(str(blob))


def test_pipe_from_dataset_to_dataset_with_a_list_field():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    src = Dataset(SCHEMA, name='src')
    init = core.Net('init')
    src.init_empty(init)
    writer = src.writer(init)
    ws.run(init)
    write_records(ws, src, writer, [RECORDS])
    dst, _ = empty_dataset(session, SCHEMA)
    with TaskGroup() as tg:
        pipe(src.reader(batch_size=2), dst.writer())
    session.run(tg)
    assert_columns(fetch_dataset(ws, dst), columns(RECORDS))


def test_writing_a_dtype_other_than_the_declared_schema_is_an_error():
    # A processor that swaps two fields of different dtypes: Caffe2 let the
    # first write into the empty columns take the new dtypes, silently.
    ws = workspace.Workspace()
    session = LocalSession(ws)
    src = source_dataset(ws, 'swap_src', a=np.arange(4, dtype=np.int64),
                         b=np.linspace(0, 1, 4).astype(np.float32))
    schema = Struct(('a', np.int64), ('b', np.float32))
    dst, _ = empty_dataset(session, schema, name='swap_dst')

    def swap(record):
        return Struct(('a', record.b), ('b', record.a))

    with TaskGroup() as tg:
        pipe(src.reader(batch_size=2), dst.writer(), processor=swap)
    with pytest.raises(errors.DataTypeError) as e:
        session.run(tg)
    assert "dataset field 'a' is float32, but the dataset's schema declares int64" in str(e.value)
    assert e.value.op == 'CheckDatasetConsistency'
    # Nothing was appended; the columns keep their declared dtypes.
    a, b = fetch_dataset(ws, dst)
    assert (a.dtype, a.shape, b.dtype, b.shape) == (np.int64, (0,), np.float32, (0,))
    # The same pipe without the swap writes.
    with TaskGroup() as ok:
        pipe(src.reader(batch_size=2), dst.writer())
    session.run(ok)
    a, b = fetch_dataset(ws, dst)
    assert a.tolist() == [0, 1, 2, 3] and a.dtype == np.int64


def test_a_dataset_of_names_only_takes_any_dtype():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    src = source_dataset(ws, 'named_src', x=np.array([5, 6], np.int32))
    dst, _ = empty_dataset(session, Struct(('x', Scalar())), name='named_dst')
    with TaskGroup() as tg:
        pipe(src.reader(batch_size=2), dst.writer())
    session.run(tg)
    (x,) = fetch_dataset(ws, dst)
    assert x.tolist() == [5, 6] and x.dtype == np.int32


# -------------------------------------------------------- limit readers --

def run_limited(session, tg, reader, ws):
    session.run(tg)
    return bool(scalar(ws.blobs[str(reader.data_finished())].fetch()))


@pytest.mark.parametrize('n,num_iter', [(10, 4), (8, 4), (3, 5)])
def test_reader_with_limit_resumes_across_runs(n, num_iter):
    ws = workspace.Workspace()
    session = LocalSession(ws)
    src = source_dataset(ws, 'src', label=np.arange(n, dtype=np.int64))
    dst, _ = empty_dataset(session, src.content())
    # The cursor is made once, outside the TaskGroup, so that each run of
    # the group continues where the previous one stopped.
    cursor_init = core.Net('cursor_init')
    reader = ReaderWithLimit(src.reader(cursor_init), num_iter=num_iter)
    session.run(cursor_init)
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        pipe(reader, dst.writer())

    written = 0
    runs = 0
    while True:
        finished = run_limited(session, tg, reader, ws)
        runs += 1
        (got,) = fetch_dataset(ws, dst)
        expected_total = min(n, runs * num_iter)
        assert got.tolist() == list(range(expected_total))
        assert len(got) - written == min(num_iter, n - written)
        written = len(got)
        # finished only once a read found no data left
        assert finished == (runs * num_iter > n), (runs, finished)
        if finished:
            break
        assert runs < 20
    # every later run reads nothing and reports the end again
    assert run_limited(session, tg, reader, ws)
    assert fetch_dataset(ws, dst)[0].tolist() == list(range(n))


def test_reader_with_limit_concurrent_threads():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    n = 100
    src = source_dataset(ws, 'src', label=np.arange(n, dtype=np.int64))

    # 1. a limit smaller than the data, 8 static threads
    dst, dst_init = empty_dataset(session, src.content())
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        reader = ReaderWithLimit(src.reader(), num_iter=10)
        pipe(reader, dst.writer(), num_threads=8)
    assert not run_limited(session, tg, reader, ws)
    assert sorted(fetch_dataset(ws, dst)[0].tolist()) == list(range(10))

    # 2. a limit larger than the data, 8 runtime threads
    session.run(dst_init)
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        reader = ReaderWithLimit(src.reader(), num_iter=110)
        pipe(reader, dst.writer(), num_runtime_threads=8)
    assert run_limited(session, tg, reader, ws)
    assert sorted(fetch_dataset(ws, dst)[0].tolist()) == list(range(n))

    # 3. no limit; running the group again restarts the reader (its cursor
    #    is created by the task's own setup)
    session.run(dst_init)
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        reader = ReaderWithLimit(src.reader(), num_iter=None)
        pipe(reader, dst.writer(), num_threads=8)
    assert run_limited(session, tg, reader, ws)
    assert sorted(fetch_dataset(ws, dst)[0].tolist()) == list(range(n))
    session.run(tg)
    assert sorted(fetch_dataset(ws, dst)[0].tolist()) == sorted(
        list(range(n)) * 2)


def test_runtime_threads_with_task_and_instance_setup():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    n = 100
    src = source_dataset(ws, 'src', label=np.arange(n, dtype=np.int64))
    totals = [None] * 3

    def proc(rec):
        with ops.task_init():
            counter1 = ops.CreateCounter([], ['global_counter'])
            counter2 = ops.CreateCounter([], ['global_counter2'])
            counter3 = ops.CreateCounter([], ['global_counter3'])
        with ops.task_instance_init():
            task_counter = ops.CreateCounter([], ['task_counter'])
        ops.CountUp(counter1)
        ops.CountUp(task_counter)
        with ops.task_instance_exit():
            with ops.loop(ops.RetrieveCount(task_counter)):
                ops.CountUp(counter2)
            ops.CountUp(counter3)
        with ops.task_exit():
            totals[0] = final_output(ops.RetrieveCount(counter1))
            totals[1] = final_output(ops.RetrieveCount(counter2))
            totals[2] = final_output(ops.RetrieveCount(counter3))
        return rec

    with TaskGroup() as tg:
        pipe(src.reader(), num_runtime_threads=8, processor=proc)
    session.run(tg)
    assert [int(scalar(t.fetch())) for t in totals] == [n, n, 8]

    with TaskGroup() as tg:
        q1 = pipe(src.reader(), num_runtime_threads=2)
        q2 = pipe(ReaderWithLimit(q1.reader(), num_iter=25),
                  num_runtime_threads=3)
        pipe(q2, processor=proc, num_runtime_threads=6)
    session.run(tg)
    assert [int(scalar(t.fetch())) for t in totals] == [25, 25, 6]


def test_count_until_and_counter_reader():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    collector = Collector()
    counter = CountUntil(6)
    assert counter.schema().field_names() == ['iter']
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        pipe(counter, processor=collector)
    session.run(tg)
    assert collector.column() == [0, 1, 2, 3, 4, 5]
    assert not scalar(ws.blobs[str(counter.data_finished())].fetch())

    plain = CounterReader()
    init = core.Net('init')
    plain.setup_ex(init, core.Net('exit'))
    first_counter = plain.counter
    plain.setup_ex(init, core.Net('exit'))  # set up once only
    assert plain.counter is first_counter
    nets, stop, fields = plain.read_ex(core.Net('li'), core.Net('le'))
    ws.run(init)
    for _ in range(3):
        ws.run(nets[0])
    assert int(scalar(ws.fetch_blob(str(fields[0])))) == 2
    assert not scalar(ws.fetch_blob(str(stop)))


def test_reader_with_time_limit_stops_an_endless_reader():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    collector = Collector()
    reader = ReaderWithTimeLimit(CounterReader(), duration=0.3)
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        pipe(reader, processor=collector)
    session.run(tg)
    values = collector.column()
    assert len(values) >= 1
    assert values == list(range(len(values)))
    assert not scalar(ws.blobs[str(reader.data_finished())].fetch())


def test_reader_with_time_limit_without_duration_reads_everything():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    src = source_dataset(ws, 'src', label=np.arange(7, dtype=np.int64))
    collector = Collector()
    reader = ReaderWithTimeLimit(src.reader(), duration=0)
    with TaskGroup(workspace_type=WorkspaceType.GLOBAL) as tg:
        pipe(reader, processor=collector)
    session.run(tg)
    assert collector.column() == list(range(7))
    assert scalar(ws.blobs[str(reader.data_finished())].fetch())


def test_composite_reader_stops_with_the_shortest_source():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    a = source_dataset(ws, 'a', x=np.arange(5, dtype=np.int64))
    b = source_dataset(ws, 'b', y=(np.arange(7) * 2.0).astype(np.float32))
    composite = CompositeReader(['a', 'b'], [a.reader(), b.reader()])
    assert composite.schema().field_names() == ['a:x', 'b:y']
    dst, _ = empty_dataset(session, composite.schema())
    with TaskGroup() as tg:
        pipe(composite, dst.writer())
    session.run(tg)
    x, y = fetch_dataset(ws, dst)
    assert x.tolist() == list(range(5))
    assert y.tolist() == [2.0 * i for i in range(5)]


def test_reader_execution_step_with_external_stop():
    ws = workspace.Workspace()
    ds = source_dataset(ws, 'src', id=np.arange(10, dtype=np.int64))
    init = core.Net('init')
    reader = ds.reader(init)
    stop_flag = init.ConstantFill([], 'external_stop', shape=[],
                                  dtype=core.DataType.BOOL, value=False)
    ws.run(init)
    collector = Collector()
    read_step, batch = reader.execution_step('ext', stop_flag)
    consume = core.Net('consume')
    collector.net_op(consume, batch.field_blobs())

    def stop_at_three(inputs, outputs):
        outputs[0].feed(np.array(bool(inputs[0].data[0] == 3)))
    consume.Python(stop_at_three)([batch.id()], [stop_flag])
    read_step.AddNet(consume)
    ws.run(read_step)
    # the flag set while consuming 3 stops the loop before the next read
    assert collector.column() == [0, 1, 2, 3]


def test_dataset_from_column_names_and_record_views():
    ds = Dataset(['a', 'b:lengths', 'b:values'])
    assert ds.field_names() == ['a', 'b:lengths', 'b:values']
    assert isinstance(ds.schema.b, List)
    assert ds.field_types == [np.dtype(np.void)] * 3
    assert ds.get_blobs() is None
    with pytest.raises(AssertionError, match='Dataset not initialized'):
        ds.reader()
    with pytest.raises(AssertionError, match='Struct or a list'):
        Dataset(Scalar(np.int32))
    rec = from_blob_list(SCHEMA, [core.BlobReference('c%d' % i)
                                  for i in range(4)])
    preset = Dataset(rec, name='preset')
    assert [str(b) for b in preset.get_blobs()] == ['c0', 'c1', 'c2', 'c3']
    assert preset.content()['tags:values']() == core.BlobReference('c2')
    assert preset.content().tags.value() == core.BlobReference('c2')
    reader = preset.reader()
    assert reader.cursor is None and reader.name == 'preset_cursor'
    init = core.Net('i')
    reader.setup_ex(init, None)
    reader.setup_ex(init, None)
    assert [op.type for op in init.Proto().op] == ['CreateTreeCursor']
    writer = preset.writer()
    with pytest.raises(AssertionError, match='setup not called'):
        writer.write(core.Net('w'), [])


NESTED = Struct(
    ('dense', Scalar((np.float32, 2))),
    ('tags', List(np.int64)),
    ('groups', List(List(np.int32))),
    ('kv', Map(np.int32, np.float32)),
    ('name', str),
)
NESTED_RECORDS = [
    {'dense': [1.0, 2.0], 'tags': [7, 8], 'groups': [[1], [2, 3]],
     'kv': [(1, 0.5)], 'name': 'first'},
    {'dense': [3.0, 4.0], 'tags': [], 'groups': [],
     'kv': [(2, 1.5), (3, 2.5)], 'name': 'second'},
    {'dense': [5.0, 6.0], 'tags': [9], 'groups': [[], [4, 5, 6]],
     'kv': [], 'name': 'third'},
]


def nested_columns(records):
    """The columns of NESTED for a list of records, in field order."""
    return [
        np.array([r['dense'] for r in records],
                 dtype=np.float32).reshape(-1, 2),
        np.array([len(r['tags']) for r in records], dtype=np.int32),
        np.array([t for r in records for t in r['tags']], dtype=np.int64),
        np.array([len(r['groups']) for r in records], dtype=np.int32),
        np.array([len(g) for r in records for g in r['groups']],
                 dtype=np.int32),
        np.array([v for r in records for g in r['groups'] for v in g],
                 dtype=np.int32),
        np.array([len(r['kv']) for r in records], dtype=np.int32),
        np.array([k for r in records for k, _ in r['kv']], dtype=np.int32),
        np.array([v for r in records for _, v in r['kv']], dtype=np.float32),
        np.array([r['name'] for r in records], dtype=object),
    ]


def as_python(array):
    return [v.decode() if isinstance(v, bytes) else v
            for v in np.asarray(array).tolist()]


def test_nested_dataset_round_trip_record_by_record():
    assert NESTED.field_names() == [
        'dense', 'tags:lengths', 'tags:values', 'groups:lengths',
        'groups:values:lengths', 'groups:values:values', 'kv:lengths',
        'kv:values:keys', 'kv:values:values', 'name']
    ws = workspace.Workspace()
    ds = Dataset(NESTED, name='nested')
    init = core.Net('init')
    ds.init_empty(init)
    writer = ds.writer(init)
    ws.run(init)

    write = core.Net('write')
    with core.NameScope('batch'):
        batch_in = NewRecord(write, NESTED)
    writer.write_record(write, batch_in)
    for part in (NESTED_RECORDS[:1], NESTED_RECORDS[1:]):
        FeedRecord(batch_in, nested_columns(part), ws)
        ws.run(write)
    for got, want in zip(fetch_dataset(ws, ds), nested_columns(NESTED_RECORDS)):
        assert as_python(got) == as_python(want)

    read_init = core.Net('read_init')
    read = core.Net('read')
    reader = ds.reader(read_init)
    should_stop, batch = reader.read_record(read)
    ws.run(read_init)
    for record in NESTED_RECORDS + [None]:
        ws.run(read)
        got = FetchRecord(batch, ws=ws).field_blobs()
        want = nested_columns([] if record is None else [record])
        for name, g, w in zip(NESTED.field_names(), got, want):
            assert as_python(g) == as_python(w), name
        assert bool(scalar(ws.fetch_blob(str(should_stop)))) == (
            record is None)


def test_inconsistent_batch_is_refused():
    ws = workspace.Workspace()
    ds = Dataset(SCHEMA)
    init = core.Net('init')
    ds.init_empty(init)
    writer = ds.writer(init)
    ws.run(init)
    net = core.Net('write_bad')
    with core.NameScope('batch'):
        blobs = NewRecord(net, SCHEMA)
    writer.write_record(net, blobs)
    bad = columns(RECORDS[:2])
    bad[1] = np.array([2, 5], dtype=np.int32)  # lengths sum to 7, 2 values
    FeedRecord(blobs, bad, ws)
    with pytest.raises(Exception):
        ws.run(net)
    # nothing was appended
    assert_columns(fetch_dataset(ws, ds), columns([]))


def test_random_reader_after_sort_and_shuffle_reads_a_permutation():
    ws = workspace.Workspace()
    ds = Dataset(SCHEMA, name='shuffled')
    init = core.Net('init')
    ds.init_empty(init)
    writer = ds.writer(init)
    ws.run(init)
    write_records(ws, ds, writer, [RECORDS])

    read_init = core.Net('read_init')
    reader = ds.random_reader(read_init, batch_size=2)
    reader.sort_and_shuffle(read_init, 'tags:lengths', shuffle_size=2,
                            batch_size=2)
    reader.computeoffset(read_init)
    with pytest.raises(AssertionError, match='Must be valid field'):
        reader.sort_and_shuffle(core.Net('x'), 'nope')
    ws.run(read_init)
    collector = Collector()
    read_step, batch = reader.execution_step('random')
    consume = core.Net('consume')
    collector.net_op(consume, batch.field_blobs())
    read_step.AddNet(consume)
    ws.run(read_step)
    ids = collector.column(0)
    assert sorted(ids) == [r[0] for r in RECORDS]
    by_id = {r[0]: r for r in RECORDS}
    for got in collector.batches:  # each batch keeps its records whole
        assert_columns(got, columns([by_id[i] for i in got[0].tolist()]))


def test_init_from_dataframe_feeds_each_column():
    class Frame(object):
        """The part of a pandas DataFrame that init_from_dataframe uses."""

        def __init__(self, data):
            self.columns = list(data)
            self._rows = np.array([data[c] for c in self.columns]).T

        @property
        def iloc(self):
            return self._rows

    ds = Dataset(['a', 'b'], name='framed')
    net = core.Net('frame_net')
    ds.init_from_dataframe(net, Frame({'a': [1, 2, 3], 'b': [4, 5, 6]}))
    try:
        assert [workspace.FetchBlob(str(b)).tolist()
                for b in ds.get_blobs()] == [[1, 2, 3], [4, 5, 6]]
        assert all(str(b) in [str(x) for x in net.external_inputs]
                   for b in ds.get_blobs())
    finally:
        for b in ds.get_blobs():
            workspace.RemoveBlob(str(b))
