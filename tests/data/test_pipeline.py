"""Tests of ferrocaffe.queue_util and ferrocaffe.pipeline: queue semantics
through plans, and pipes between datasets and queues run by a LocalSession.

Every expected value is computed here in plain Python from the input data.
"""

import threading
import time

import numpy as np
import pytest

from ferrocaffe import core, workspace
from ferrocaffe.dataio import Reader
from ferrocaffe.dataset import Dataset
from ferrocaffe.net_builder import NetBuilder, ops
from ferrocaffe.pipeline import (
    NetProcessor, Output, Pipeline, ProcessingReader, make_processor,
    normalize_processor_output, pipe, pipe_and_output, processor_name)
from ferrocaffe.queue_util import Queue, close_queue, dequeue, enqueue
from ferrocaffe.schema import (
    FeedRecord, FetchRecord, InitEmptyRecord, NewRecord, Scalar, Struct)
from ferrocaffe.session import LocalSession
from ferrocaffe.task import Task, TaskGroup

# A run that should finish quickly must not hang the suite.
TIMEOUT = 60.0


class Runner(object):
    """Runs ``ws.run(obj)`` on a thread and keeps the outcome."""

    def __init__(self, ws, obj):
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(ws, obj))
        self.thread.daemon = True
        self.thread.start()

    def _run(self, ws, obj):
        try:
            ws.run(obj)
        except BaseException as e:  # checked by the test
            self.error = e

    def join(self, timeout=TIMEOUT):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), 'the run did not finish in time'
        return self

    def running(self):
        return self.thread.is_alive()


def wait_until(predicate, timeout=TIMEOUT):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def scalar(value):
    return np.asarray(value).reshape(-1)[0]


# ============================================================= queues ==

class QueueFixture(object):
    """A queue of int64 records of one field, created in ``self.ws``, with
    nets to enqueue the next number of a sequence and to dequeue."""

    def __init__(self, capacity, num_dequeue_records=1):
        self.ws = workspace.Workspace()
        self.queue = Queue(capacity, schema=Struct(('v', np.int64)),
                           num_dequeue_records=num_dequeue_records)
        init = core.Net('queue_init')
        self.queue.setup(init)
        counter = init.CreateCounter([], init_count=0)
        self.ws.run(init)
        self.counter = counter
        self._next = iter(range(10 ** 6))
        self._lock = threading.Lock()
        self.dequeued = []

    def producer(self, name='produce'):
        """A net enqueuing the next number; counts successful enqueues."""
        net = core.Net(name)

        def next_value(inputs, outputs):
            with self._lock:
                value = next(self._next)
            outputs[0].feed(np.array([value], dtype=np.int64))

        value = net.Python(next_value)([], [net.NextName('value')])
        status = enqueue(net, self.queue.queue(), [value])
        net.CountUp([self.counter], 1)
        return net, status

    def consumer(self, name='consume', record=True):
        """A net dequeuing; the numbers read go to ``self.dequeued``."""
        net = core.Net(name)
        fields, status = dequeue(net, self.queue.queue(), 1,
                                 num_records=self.queue._num_dequeue_records)

        def keep(inputs, outputs):
            # the status comes second; nothing is read once it is set
            if not scalar(inputs[1].data):
                with self._lock:
                    self.dequeued.append(list(inputs[0].data))

        if record:
            net.Python(keep)([fields[0], status], [])
        return net, status

    def enqueued(self):
        net = core.Net('count')
        out = net.RetrieveCount([self.counter], 1)
        self.ws.run(net)
        return int(scalar(self.ws.fetch_blob(str(out))))

    def close_net(self):
        net = core.Net('close')
        net.CloseBlobsQueue([self.queue.queue()], 0)
        return net


def test_queue_setup_creates_the_blobs_queue():
    q = Queue(capacity=7, schema=Struct(('a', np.int32), ('b', np.float32)))
    assert str(q.queue()).startswith('queue')
    init = core.Net('init')
    q.setup(init)
    op = init.Proto().op[0]
    assert op.type == 'CreateBlobsQueue'
    assert list(op.output) == [str(q.queue())]
    args = {a.name: a for a in op.arg}
    assert args['capacity'].i == 7
    assert args['num_blobs'].i == 2
    assert [s.decode() if isinstance(s, bytes) else s
            for s in args['field_names'].strings] == ['a', 'b']
    with pytest.raises(AssertionError, match='does not have a schema'):
        Queue(3).setup(core.Net('x'))
    # two queues never share a blob
    assert str(Queue(1).queue()) != str(Queue(1).queue())


def test_enqueue_copies_a_blob_listed_twice():
    net = core.Net('dup')
    enqueue(net, core.BlobReference('q'), [core.BlobReference('x'),
                                           core.BlobReference('x')])
    types = [op.type for op in net.Proto().op]
    assert types == ['Copy', 'SafeEnqueueBlobs']
    enq = net.Proto().op[1]
    assert enq.input[1] == 'x' and enq.input[2] != 'x'
    assert list(enq.output[:2]) == list(enq.input[1:])


def test_writer_blocks_at_capacity_and_resumes_after_a_read():
    f = QueueFixture(capacity=3)
    produce, _ = f.producer()
    writer = Runner(f.ws, core.execution_step('w', produce, num_iter=5))
    assert wait_until(lambda: f.enqueued() == 3)
    time.sleep(0.3)
    assert f.enqueued() == 3 and writer.running()  # blocked on a full queue
    consume, _ = f.consumer()
    f.ws.run(consume)
    assert wait_until(lambda: f.enqueued() == 4)
    time.sleep(0.2)
    assert f.enqueued() == 4 and writer.running()
    for _ in range(4):
        f.ws.run(consume)
    writer.join()
    assert writer.error is None
    assert f.dequeued == [[0], [1], [2], [3], [4]]  # first in, first out


def test_reader_blocks_on_an_empty_queue_until_a_write():
    f = QueueFixture(capacity=2)
    consume, status = f.consumer()
    reader = Runner(f.ws, core.execution_step('r', consume, num_iter=2))
    time.sleep(0.3)
    assert reader.running() and f.dequeued == []
    produce, _ = f.producer()
    f.ws.run(produce)
    assert wait_until(lambda: f.dequeued == [[0]])
    assert reader.running()
    f.ws.run(produce)
    reader.join()
    assert reader.error is None
    assert f.dequeued == [[0], [1]]
    assert not scalar(f.ws.fetch_blob(str(status)))


def test_close_wakes_every_waiting_reader():
    f = QueueFixture(capacity=2)
    runners = []
    statuses = []
    for i in range(3):
        consume, status = f.consumer('consume_%d' % i)
        statuses.append(status)
        runners.append(Runner(f.ws, core.execution_step(
            'loop_%d' % i, consume, should_stop_blob=status)))
    time.sleep(0.3)
    assert all(r.running() for r in runners)
    f.ws.run(f.close_net())
    for r in runners:
        assert r.join().error is None
    assert f.dequeued == []
    assert all(scalar(f.ws.fetch_blob(str(s))) for s in statuses)


def test_readers_drain_a_closed_queue_then_stop():
    f = QueueFixture(capacity=5)
    produce, _ = f.producer()
    f.ws.run(core.execution_step('fill', produce, num_iter=4))
    f.ws.run(f.close_net())
    consume, status = f.consumer()
    f.ws.run(core.execution_step('drain', consume, should_stop_blob=status))
    assert f.dequeued == [[0], [1], [2], [3]]
    assert scalar(f.ws.fetch_blob(str(status)))
    # a closed and empty queue keeps answering "closed"
    f.ws.run(consume)
    assert scalar(f.ws.fetch_blob(str(status)))


def test_writer_status_reports_a_closed_queue():
    f = QueueFixture(capacity=1)
    produce, status = f.producer()
    f.ws.run(produce)
    assert not scalar(f.ws.fetch_blob(str(status)))
    f.ws.run(f.close_net())
    # closed and full: the write is refused, and the status says so
    f.ws.run(produce)
    assert scalar(f.ws.fetch_blob(str(status)))
    assert f.enqueued() == 2  # the net itself ran to the end


def test_close_unblocks_a_writer_waiting_on_a_full_queue():
    f = QueueFixture(capacity=1)
    produce, status = f.producer()
    writer = Runner(f.ws, core.execution_step(
        'w', produce, should_stop_blob=status))
    assert wait_until(lambda: f.enqueued() >= 1)
    time.sleep(0.2)
    assert writer.running()
    f.ws.run(f.close_net())
    assert writer.join().error is None
    assert scalar(f.ws.fetch_blob(str(status)))


def test_dequeue_many_records_at_once():
    f = QueueFixture(capacity=10, num_dequeue_records=3)
    produce, _ = f.producer()
    f.ws.run(core.execution_step('fill', produce, num_iter=7))
    f.ws.run(f.close_net())
    consume, status = f.consumer()
    f.ws.run(core.execution_step('drain', consume, should_stop_blob=status))
    assert f.dequeued == [[0, 1, 2], [3, 4, 5], [6]]


def test_close_queue_step_runs_the_step_then_closes():
    f = QueueFixture(capacity=4)
    produce, _ = f.producer()
    step = close_queue(core.execution_step('fill', produce, num_iter=2),
                       f.queue.queue())
    assert [s.name for s in step.Proto().substep][1].endswith('_step')
    f.ws.run(step)
    consume, status = f.consumer()
    f.ws.run(core.execution_step('drain', consume, should_stop_blob=status))
    assert f.dequeued == [[0], [1]]
    assert scalar(f.ws.fetch_blob(str(status)))


def test_an_error_cancels_blocked_queue_operations():
    # A writer blocked on a full queue (nobody reads it) and a reader
    # blocked on another, empty queue (nobody writes it) run next to a step
    # that fails: the failure must stop both and reach the caller.
    f = QueueFixture(capacity=1)
    produce, wstatus = f.producer()
    blocked_writer = core.execution_step('writer', produce,
                                         should_stop_blob=wstatus)
    other = Queue(1, schema=Struct(('v', np.int64)), name='other')
    init = core.Net('other_init')
    other.setup(init)
    f.ws.run(init)
    wait_net = core.Net('wait_other')
    _, other_status = dequeue(wait_net, other.queue(), 1)
    blocked_reader = core.execution_step('reader', wait_net,
                                         should_stop_blob=other_status)

    def explode(inputs, outputs):
        time.sleep(0.3)
        raise ValueError('boom in a sibling')

    bad = core.Net('bad')
    bad.Python(explode)([], [])
    plan = core.execution_step(
        'all', [blocked_reader, blocked_writer,
                core.execution_step('fail', bad)],
        concurrent_substeps=True)
    start = time.time()
    with pytest.raises(ValueError, match='boom in a sibling'):
        f.ws.run(plan)
    assert time.time() - start < 20
    assert f.enqueued() >= 1


# ========================================================== pipelines ==

def make_source(ws, session, **columns):
    """A Dataset holding the given columns (name -> array)."""
    values = Struct(*columns.items())
    init = core.Net('src_init')
    with core.NameScope('src'):
        blobs = NewRecord(init, values)
    FeedRecord(blobs, values, ws)
    return Dataset(blobs)


def make_destination(session, schema, scope='dst'):
    init = core.Net('dst_init')
    with core.NameScope(scope):
        ds = Dataset(schema.clone_schema())
        ds.init_empty(init)
    session.run(init)
    return ds


def fetch_dataset(ws, ds):
    return [ws.blobs[str(b)].fetch() for b in ds.get_blobs()]


def python_map(fn, inputs, out_names, dtype=None):
    """Adds through ``ops`` a Python op computing ``fn(*input_arrays)``
    (one array per output)."""
    def run(ins, outs):
        results = fn(*[i.data for i in ins])
        if len(outs) == 1:
            results = [results]
        for out, value in zip(outs, results):
            out.feed(np.asarray(value))
    outputs = ops.Python(run)(list(inputs), list(out_names))
    return outputs


def test_three_stage_pipeline_reproduces_plain_python():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    n = 37
    uids = np.arange(n, dtype=np.int64)
    prices = (np.arange(n) * 0.5).astype(np.float32)
    src = make_source(ws, session, uid=uids, price=prices)

    def stage1(rec):
        # uid -> 3 * uid + 1, price kept
        with core.NameScope('stage1'):
            out = NewRecord(ops, rec)
        python_map(lambda u: u * 3 + 1, [rec.uid()], [out.uid()])
        out.price.set(blob=rec.price(), unsafe=True)
        return out

    def stage2(rec):
        # price -> price * uid (of the new uid), uid kept
        with core.NameScope('stage2'):
            out = NewRecord(ops, rec)
        python_map(lambda p, u: (p * u).astype(np.float32),
                   [rec.price(), rec.uid()], [out.price()])
        out.uid.set(blob=rec.uid(), unsafe=True)
        return out

    dst = make_destination(session, src.content())
    with TaskGroup() as tg:
        q1 = pipe(src.reader(batch_size=4), processor=stage1, capacity=3)
        q2 = pipe(q1, processor=stage2, capacity=2)
        assert isinstance(q1, Queue) and isinstance(q2, Queue)
        assert q1.capacity == 3 and q2.capacity == 2
        assert pipe(q2, dst.writer()) is None
    session.run(tg)

    want_uid = [3 * u + 1 for u in range(n)]
    want_price = [np.float32(u * 0.5) * np.float32(3 * u + 1)
                  for u in range(n)]
    got_uid, got_price = fetch_dataset(ws, dst)
    assert got_uid.tolist() == want_uid
    np.testing.assert_array_equal(got_price,
                                  np.array(want_price, dtype=np.float32))
    assert got_uid.dtype == np.int64 and got_price.dtype == np.float32


def caffe2_pipeline_processors(counter, one):
    """The two processors of Caffe2's pipeline test: uid doubled (value kept),
    then value zeroed (uid kept) with ``counter += one`` per batch. Outputs
    are named under fixed scopes, so every thread names them alike."""
    def proc1(rec):
        with core.NameScope('proc1'):
            out = NewRecord(ops, rec)
        ops.Add([rec.uid(), rec.uid()], [out.uid()])
        out.value.set(blob=rec.value(), unsafe=True)
        return out

    def proc2(rec):
        with core.NameScope('proc2'):
            out = NewRecord(ops, rec)
        out.uid.set(blob=rec.uid(), unsafe=True)
        ops.Sub([rec.value(), rec.value()], [out.value()])
        ops.Add([counter, one], [counter])
        return out

    return proc1, proc2


def test_pipeline_with_arithmetic_ops_and_dequeue_many():
    # Caffe2's own scenario: Add/Sub processors, a queue read 3 records at
    # a time, and a counter bumped once per dequeue.
    n = 17
    per_dequeue = 3
    init_net = core.Net('init')
    src_values = Struct(('uid', np.array(range(n))),
                        ('value', 0.1 * np.array(range(n))))
    with core.NameScope('init'):
        src_blobs = NewRecord(init_net, src_values)
        dst_blobs = InitEmptyRecord(init_net, src_values.clone_schema())
        counter = init_net.Const(0)
        one = init_net.Const(1)

    proc1, proc2 = caffe2_pipeline_processors(counter, one)

    src_ds = Dataset(src_blobs)
    dst_ds = Dataset(dst_blobs)
    with TaskGroup() as tg:
        out1 = pipe(src_ds.reader(),
                    output=Queue(capacity=11,
                                 num_dequeue_records=per_dequeue),
                    processor=proc1)
        out2 = pipe(out1, processor=proc2)
        pipe(out2, dst_ds.writer())

    ws = workspace.Workspace()
    FeedRecord(src_blobs, src_values, ws)
    session = LocalSession(ws)
    session.run(init_net)
    session.run(tg)
    output = FetchRecord(dst_blobs, ws=ws)
    assert int(scalar(ws.blobs[str(counter)].fetch())) == -(-n // per_dequeue)
    assert output.uid().tolist() == [2 * i for i in range(n)]
    assert output.value().tolist() == [0.0] * n


@pytest.mark.parametrize('threads', [1, 4, 16])
@pytest.mark.parametrize('mode', ['num_threads', 'num_runtime_threads'])
def test_every_record_is_processed_exactly_once(threads, mode):
    ws = workspace.Workspace()
    session = LocalSession(ws)
    n = 200
    src = make_source(ws, session, uid=np.arange(n, dtype=np.int64))
    seen = []
    lock = threading.Lock()

    def record_seen(u):
        with lock:
            seen.extend(int(x) for x in u)
        return u * 2

    def proc(rec):
        # Every thread names its output alike; each still gets its own.
        with core.NameScope('proc'):
            out = NewRecord(ops, rec)
        python_map(record_seen, [rec.uid()], [out.uid()])
        return out

    dst = make_destination(session, src.content())
    with TaskGroup() as tg:
        pipe(src.reader(batch_size=3), dst.writer(), processor=proc,
             **{mode: threads})
    session.run(tg)
    assert sorted(seen) == list(range(n))
    (got,) = fetch_dataset(ws, dst)
    assert sorted(got.tolist()) == [2 * i for i in range(n)]
    assert int(got.sum()) == n * (n - 1)


@pytest.mark.parametrize('mode', ['num_threads', 'num_runtime_threads'])
def test_two_threads_append_a_large_dataset_row_by_row_intact(mode):
    # Enough rows for the destination columns to outgrow their first
    # buffers (appends then go to large, prefaulted buffers), in batches that
    # do not divide the row count; each output row must be one whole input
    # row (uid, its value and its pair), each input row must appear once.
    ws = workspace.Workspace()
    session = LocalSession(ws)
    n = 70001
    rng = np.random.RandomState(7)
    uid = rng.permutation(n).astype(np.int64)
    value = (uid * 0.25).astype(np.float32)
    pair = np.stack([uid, -uid], axis=1).astype(np.int32)
    src = make_source(ws, session, uid=uid, value=value, pair=pair)

    def proc(rec):
        with core.NameScope(NetBuilder.current().name):
            return Struct(('uid', Scalar(np.int64, ops.Copy(rec.uid()))),
                          ('value', Scalar(np.float32, ops.Copy(rec.value()))),
                          ('pair', Scalar((np.int32, (2,)), ops.Copy(rec.pair()))))

    dst = make_destination(session, src.content())
    with TaskGroup() as tg:
        pipe(src.reader(batch_size=997), dst.writer(), processor=proc,
             **{mode: 2})
    session.run(tg)
    got_uid, got_value, got_pair = fetch_dataset(ws, dst)
    assert len(got_uid) == len(got_value) == len(got_pair) == n
    order = np.argsort(got_uid, kind='stable')
    assert got_uid[order].tolist() == list(range(n))
    expected = {int(u): (float(v), tuple(int(x) for x in p))
                for u, v, p in zip(uid, value, pair)}
    for u, v, p in zip(got_uid.tolist(), got_value.tolist(),
                       got_pair.tolist()):
        assert expected[u] == (v, tuple(p))


def test_batches_read_earlier_stay_as_fetched():
    # The reader refills its output blobs in place from one batch to the
    # next; what was fetched before must not change.
    ws = workspace.Workspace()
    session = LocalSession(ws)
    ids = np.arange(10, dtype=np.int64) * 3
    src = make_source(ws, session, id=ids)
    init = core.Net('reader_init')
    reader = src.reader(init, batch_size=4)
    session.run(init)
    read = core.Net('read')
    _, (batch,) = reader.read(read)
    fetched = []
    for _ in range(4):
        ws.run(read)
        fetched.append(ws.blobs[str(batch)].fetch())
    assert [f.tolist() for f in fetched] == [
        [0, 3, 6, 9], [12, 15, 18, 21], [24, 27], []]


def test_a_failing_processor_fails_the_whole_run_promptly():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    n = 5000
    src = make_source(ws, session, uid=np.arange(n, dtype=np.int64))

    def check(u):
        if 13 in u.tolist():
            raise ValueError('record 13 is bad')
        return u

    def proc(rec):
        out = NewRecord(ops, rec)
        python_map(check, [rec.uid()], [out.uid()])
        return out

    dst = make_destination(session, src.content())
    with TaskGroup() as tg:
        q1 = pipe(src.reader(), capacity=2)
        q2 = pipe(q1, processor=proc, capacity=2, num_runtime_threads=2)
        pipe(q2, dst.writer())
    start = time.time()
    with pytest.raises(ValueError, match='record 13 is bad'):
        session.run(tg)
    assert time.time() - start < 20
    (got,) = fetch_dataset(ws, dst)
    assert 13 not in got.tolist()


class ListReader(Reader):
    """A reader of the numbers of a Python list, one per batch, written on
    the plain ``Reader.read`` protocol with a Python op."""

    def __init__(self, values):
        Reader.__init__(self, Struct(('uid', np.int64)))
        self._values = list(values)
        self._lock = threading.Lock()

    def read(self, read_net):
        def next_batch(inputs, outputs):
            with self._lock:
                value = self._values.pop(0) if self._values else None
            if value is None:
                outputs[0].feed(np.zeros(0, dtype=np.int64))
            else:
                outputs[0].feed(np.array([value], dtype=np.int64))
            outputs[1].feed(np.array(value is None))

        uid, stop = read_net.Python(next_batch)(
            [], [read_net.NextName('uid'), read_net.NextName('stop')])
        return stop, [uid]


class Sink(object):
    """A processor keeping (thread-safely) every uid it sees."""

    def __init__(self):
        self.seen = []
        self._lock = threading.Lock()

    def __call__(self, rec):
        def keep(inputs, outputs):
            with self._lock:
                self.seen.extend(int(v) for v in inputs[0].data)
        ops.Python(keep)([rec.uid()], [])


@pytest.mark.parametrize('threads', [1, 4, 16])
def test_custom_reader_through_queues_exactly_once(threads):
    ws = workspace.Workspace()
    session = LocalSession(ws)
    n = 300
    sink = Sink()

    def square(rec):
        out = NewRecord(ops, rec)
        python_map(lambda u: u * u, [rec.uid()], [out.uid()])
        return out

    with TaskGroup() as tg:
        q1 = pipe(ListReader(range(n)), processor=square, capacity=5,
                  num_runtime_threads=threads)
        q2 = pipe(q1, capacity=5, num_threads=threads)
        assert pipe(q2, processor=sink, num_runtime_threads=threads) is None
    session.run(tg)
    assert sorted(sink.seen) == [i * i for i in range(n)]
    assert sum(sink.seen) == sum(i * i for i in range(n))


def test_a_failing_processor_behind_a_custom_reader():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    sink = Sink()

    def check(u):
        if 13 in u.tolist():
            raise ValueError('record 13 is bad')
        return u

    def proc(rec):
        out = NewRecord(ops, rec)
        python_map(check, [rec.uid()], [out.uid()])
        return out

    with TaskGroup() as tg:
        q1 = pipe(ListReader(range(10000)), capacity=2)
        q2 = pipe(q1, processor=proc, capacity=2, num_runtime_threads=3)
        pipe(q2, processor=sink, num_threads=2)
    start = time.time()
    with pytest.raises(ValueError, match='record 13 is bad'):
        session.run(tg)
    assert time.time() - start < 20
    assert 13 not in sink.seen and len(sink.seen) < 10000


# --------------------------------------------------- processor forms --

def run_single_pipe(n, processor, **kwargs):
    """Pipes 0..n-1 (int64 'uid') through ``processor``, then into a Sink;
    returns the uids that reached the sink, and the pipe's result."""
    ws = workspace.Workspace()
    session = LocalSession(ws)
    sink = Sink()
    with TaskGroup() as tg:
        result = pipe(ListReader(range(n)), processor=processor, **kwargs)
        if result is not None:
            pipe(result, processor=sink)
    session.run(tg)
    return sink.seen, result


def plus(k):
    return lambda u: u + k


def test_processor_returning_an_output():
    def proc(rec):
        out = NewRecord(ops, rec)
        python_map(plus(100), [rec.uid()], [out.uid()])
        return Output(record=out)
    got, q = run_single_pipe(6, proc)
    assert got == [100 + i for i in range(6)]


def test_processor_returning_record_and_stop_blob():
    def proc(rec):
        out = NewRecord(ops, rec)
        python_map(plus(1), [rec.uid()], [out.uid()])
        stop = ops.NextScopedBlob('stop')
        python_map(lambda u: np.array(bool((u >= 4).any())), [rec.uid()],
                   [stop])
        return out, stop
    got, _ = run_single_pipe(10, proc)
    assert got == [1, 2, 3, 4]  # the record that raised the flag is dropped


def test_processor_returning_nets_and_record():
    def proc(rec):
        net = core.Net('own_net')
        out = NewRecord(net, rec)
        net.Python(lambda i, o: o[0].feed(i[0].data * 10))(
            [rec.uid()], [out.uid()])
        return [net], out
    got, _ = run_single_pipe(5, proc)
    assert got == [0, 10, 20, 30, 40]


def test_processor_returning_nets_record_and_stop():
    def proc(rec):
        net = core.Net('own_net')
        out = NewRecord(net, rec)
        net.Python(lambda i, o: o[0].feed(i[0].data - 1))(
            [rec.uid()], [out.uid()])
        stop = net.NextScopedBlob('stop')
        net.Python(lambda i, o: o[0].feed(np.array(bool(i[0].data[0] == 3))))(
            [rec.uid()], [stop])
        return [net], out, stop
    got, _ = run_single_pipe(8, proc)
    assert got == [-1, 0, 1]


def test_processor_returning_only_nets_has_no_output():
    seen = []

    def proc(rec):
        net = core.Net('sink')
        net.Python(lambda i, o: seen.extend(i[0].data.tolist()))(
            [rec.uid()], [])
        return [net]
    got, q = run_single_pipe(7, proc)
    assert q is None and got == []
    assert seen == list(range(7))


def test_processor_using_ops_and_returning_none():
    seen = []

    def proc(rec):
        ops.Python(lambda i, o: seen.extend(i[0].data.tolist()))(
            [rec.uid()], [])
    got, q = run_single_pipe(4, proc)
    assert q is None
    assert seen == [0, 1, 2, 3]


def test_processor_stopping_with_ops_stop_if():
    def proc(rec):
        out = NewRecord(ops, rec)
        python_map(plus(0), [rec.uid()], [out.uid()])
        big = ops.NextScopedBlob('big')
        python_map(lambda u: np.array(bool((u >= 3).any())), [rec.uid()],
                   [big])
        ops.stop_if(big)
        return out
    got, _ = run_single_pipe(9, proc)
    assert got == [0, 1, 2]


@pytest.mark.parametrize('threads', [1, 3])
def test_net_processor_clones_the_net_per_thread(threads):
    net = core.Net('triple_net')
    rec_in = net.set_input_record(Struct(('uid', np.int64)))
    tripled = net.Python(lambda i, o: o[0].feed(i[0].data * 3))(
        [rec_in.uid()], [net.NextScopedBlob('tripled')])
    net.set_output_record(Struct(('uid', Scalar(np.int64, tripled))))

    processor = make_processor(net)
    assert isinstance(processor, NetProcessor)
    assert processor_name(processor) == str(net)
    got, _ = run_single_pipe(12, processor, num_threads=threads)
    assert sorted(got) == [3 * i for i in range(12)]
    maps = processor.blob_maps()
    assert len(maps) == threads
    # each clone writes its own copy of the internal blob
    assert len(set(m[str(tripled)] for m in maps)) == threads
    assert all(m[str(rec_in.uid())] != str(rec_in.uid()) for m in maps)


def test_a_core_net_is_accepted_directly_as_processor():
    net = core.Net('negate_net')
    rec_in = net.set_input_record(Struct(('uid', np.int64)))
    neg = net.Python(lambda i, o: o[0].feed(-i[0].data))(
        [rec_in.uid()], [net.NextScopedBlob('neg')])
    net.set_output_record(Struct(('uid', Scalar(np.int64, neg))))
    got, _ = run_single_pipe(5, net)
    assert got == [0, -1, -2, -3, -4]


def test_identity_pipe_and_reader_returned_by_zero_threads():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    sink = Sink()

    def proc(rec):
        out = NewRecord(ops, rec)
        python_map(plus(5), [rec.uid()], [out.uid()])
        return out

    with TaskGroup() as tg:
        reader = pipe(ListReader(range(9)), processor=proc, num_threads=0)
        assert isinstance(reader, ProcessingReader)
        q = pipe(reader)  # no processor: records pass through unchanged
        pipe(q, processor=sink)
    session.run(tg)
    assert sink.seen == [i + 5 for i in range(9)]
    with pytest.raises(AssertionError):
        pipe(ListReader([]), Queue(1), num_threads=0)


def test_pipe_and_output_returns_final_outputs():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    total = core.BlobReference('pipe_total')

    def proc(rec):
        with ops.task_init():
            counter = ops.CreateCounter([], ['records_seen'])
        ops.CountUp([counter], 1)
        with ops.task_exit():
            ops.RetrieveCount([counter], [total])

    with TaskGroup() as tg:
        q, out = pipe_and_output(ListReader(range(11)), processor=proc,
                                 final_outputs=total)
    assert q is None
    session.run(tg)
    assert int(scalar(out.fetch())) == 11
    with TaskGroup():
        _, outs = pipe_and_output(ListReader([]), final_outputs=[total])
        assert isinstance(outs, list) and len(outs) == 1
        assert pipe_and_output(ListReader([]), num_threads=1)[1] is None
        with pytest.raises(AssertionError):
            pipe_and_output(ListReader([]), num_threads=0)


def test_pipe_task_names():
    class Named(object):
        name = 'my_proc'

        def __call__(self, rec):
            return rec

    with TaskGroup() as tg:
        q = pipe(ListReader([1]), processor=Named())
        pipe(q, Queue(2), name='explicit')
        pipe(ListReader([2]), Queue(5))
        pipe(ListReader([3]))
    names = [t.name for t in tg.tasks()]
    assert names == ['local/my_proc', 'local/explicit',
                     'local/pipe_into:Queue', 'local/pipe_from:ListReader']
    # as in Caffe2 on Python 3, plain functions are named by their class
    assert processor_name(lambda r: r) == 'function'
    ds = Dataset(Struct(('uid', Scalar(np.int64, core.BlobReference('u')))))
    assert processor_name(ds.reader()) == 'dataset_cursor'
    with pytest.raises(AssertionError, match='Only one of num_threads'):
        pipe(ListReader([]), num_threads=2, num_runtime_threads=2)
    with pytest.raises(ValueError, match='in must be a reader'):
        pipe(object())


def test_normalize_processor_output_forms():
    blob = core.BlobReference('stop')
    rec = Struct(('a', Scalar(np.int32, core.BlobReference('a'))))
    with NetBuilder():
        out = normalize_processor_output(rec)
        assert out.record is rec and out.nets == [] and out.should_stop is None
    with NetBuilder():
        out = normalize_processor_output((rec, blob))
        assert out.record is rec and out.should_stop is blob
    net = core.Net('n')
    with NetBuilder():
        out = normalize_processor_output(([net], rec, blob))
        assert out.nets == [net] and out.should_stop is blob
    with NetBuilder():
        out = normalize_processor_output(net)
        assert out.nets == [net] and out.record is None
    with NetBuilder():
        ops.Copy('x', 'y')
        out = normalize_processor_output(None)
        assert len(out.nets) == 1 and out.nets[0].Proto().op[0].type == 'Copy'
    with NetBuilder():
        ops.Copy('x', 'y')
        with pytest.raises(AssertionError, match='Cannot both use `ops`'):
            normalize_processor_output([net])


def test_pipeline_helper_chains_pipes():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    sink = Sink()

    def double(rec):
        out = NewRecord(ops, rec)
        python_map(lambda u: u * 2, [rec.uid()], [out.uid()])
        return out

    with TaskGroup() as tg:
        p = Pipeline(ListReader(range(6)))
        p.pipe(processor=double).pipe(processor=double)
        assert isinstance(p.output(), Queue)
        p.pipe(processor=sink)
        assert p.output() is None and len(p.tasks()) == 3
    session.run(tg)
    assert sink.seen == [4 * i for i in range(6)]


def test_reader_base_requires_read():
    class NoRead(Reader):
        pass
    with pytest.raises(NotImplementedError, match='must implement `read`'):
        NoRead().read_ex(core.Net('i'), core.Net('e'))


# ======================================== blobs of one thread stay its own ==
#
# A processor that names its outputs (as Caffe2's own pipeline tests do)
# gives every thread's nets the same blob names.  Each thread's loop must
# still compute into blobs of its own, or one thread appends a batch another
# thread has just overwritten: right row count, some rows lost and others
# doubled.  Blobs that exist before the loops start stay shared.

def _doubling_source(session, ws, rows):
    src = make_source(ws, session, v=np.arange(rows, dtype=np.int64))
    return src, make_destination(session, Struct(('v', np.int64)))


def _twice_named(rec):
    # The processor: its own net, outputs named under a scope.
    net = core.Net('twice')
    with core.NameScope('twice'):
        out = NewRecord(net, rec)
    net.Add([rec.v(), rec.v()], [out.v()])
    return [net], out


def _twice_auto_named(rec):
    # Outputs named by the builder's net: alike in every thread.
    return Struct(('v', Scalar(np.int64, ops.Add([rec.v(), rec.v()]))))


def _twice_counting(counter, one):
    # Caffe2's pipeline test's shape: named outputs, and an in-place update
    # of a counter every thread shares.
    def proc(rec):
        with core.NameScope('twice'):
            out = NewRecord(ops, rec)
        ops.Add([rec.v(), rec.v()], [out.v()])
        ops.Add([counter, one], [counter])
        return out
    return proc


THREAD_TRIALS = 5


@pytest.mark.parametrize('rows', [300, 3000])
@pytest.mark.parametrize('threads', [1, 2, 4, 16])
@pytest.mark.parametrize('mode', ['num_threads', 'num_runtime_threads'])
@pytest.mark.parametrize('kind', ['named', 'auto_named', 'shared_counter'])
def test_threads_process_every_record_exactly_once_whatever_the_names(
        kind, mode, threads, rows):
    expected = sorted(2 * v for v in range(rows))
    for _ in range(THREAD_TRIALS):
        Task._global_names_used.clear()
        ws = workspace.Workspace()
        session = LocalSession(ws)
        src, dst = _doubling_source(session, ws, rows)
        counter = one = None
        if kind == 'named':
            processor = _twice_named
        elif kind == 'auto_named':
            processor = _twice_auto_named
        else:
            init = core.Net('counter_init')
            with core.NameScope('init'):
                counter = init.Const(np.int64(0))
                one = init.Const(np.int64(1))
            session.run(init)
            processor = _twice_counting(counter, one)
        with TaskGroup() as tg:
            # Batches of one row: the threads contend on every record.
            pipe(src.reader(), dst.writer(), processor=processor,
                 **{mode: threads})
        session.run(tg)
        (got,) = fetch_dataset(ws, dst)
        assert got.dtype == np.int64
        assert sorted(got.tolist()) == expected
        if counter is not None:
            assert int(scalar(ws.blobs[str(counter)].fetch())) == rows


@pytest.mark.parametrize('threads', [1, 2, 4, 16])
def test_caffe2_pipeline_counter_is_exact_at_any_thread_count(threads):
    # Caffe2's pipeline test with its middle stage on several threads: the
    # processor's counter (created by an init net, before the pipes) is
    # shared by every thread, and batches of one record make its final
    # value the number of records.
    n = 17
    init_net = core.Net('init')
    src_values = Struct(('uid', np.arange(n, dtype=np.int64)),
                        ('value', 0.1 * np.arange(n)))
    with core.NameScope('init'):
        src_blobs = NewRecord(init_net, src_values)
        dst_blobs = InitEmptyRecord(init_net, src_values.clone_schema())
        counter = init_net.Const(0)
        one = init_net.Const(1)

    proc1, proc2 = caffe2_pipeline_processors(counter, one)

    with TaskGroup() as tg:
        out1 = pipe(Dataset(src_blobs).reader(), output=Queue(capacity=11),
                    processor=proc1, num_threads=threads)
        out2 = pipe(out1, processor=proc2, num_threads=threads)
        pipe(out2, Dataset(dst_blobs).writer())

    ws = workspace.Workspace()
    FeedRecord(src_blobs, src_values, ws)
    session = LocalSession(ws)
    session.run(init_net)
    session.run(tg)
    output = FetchRecord(dst_blobs, ws=ws)
    assert int(scalar(ws.blobs[str(counter)].fetch())) == n
    assert sorted(output.uid().tolist()) == [2 * i for i in range(n)]
    assert output.value().tolist() == [0.0] * n


def test_blobs_a_thread_creates_do_not_outlive_the_run():
    # Per-thread blobs live in the thread's child workspace; what existed
    # before (the destination, the counter) is where the run left it.
    ws = workspace.Workspace()
    session = LocalSession(ws)
    src, dst = _doubling_source(session, ws, 10)
    with TaskGroup() as tg:
        pipe(src.reader(), dst.writer(), processor=_twice_named,
             num_threads=3)
    session.run(tg)
    assert 'twice/v' not in ws.blobs
    (got,) = fetch_dataset(ws, dst)
    assert sorted(got.tolist()) == [2 * v for v in range(10)]


@pytest.mark.parametrize('num_threads,num_runtime_threads', [(1, 1), (1, 3), (2, 1)])
def test_pipe_progress_counts_the_records_piped(num_threads, num_runtime_threads):
    import io
    ws = workspace.Workspace()
    session = LocalSession(ws)
    n = 23
    uids = np.arange(n, dtype=np.int64)
    src = make_source(ws, session, uid=uids)
    dst = make_destination(session, src.content(), scope='dst_progress')
    stream = io.StringIO()
    with TaskGroup() as tg:
        pipe(src.reader(batch_size=1), dst.writer(), num_threads=num_threads,
             num_runtime_threads=num_runtime_threads, progress=stream,
             name='progress_pipe')
    session.run(tg)
    # Every record reached the destination, once.
    assert sorted(fetch_dataset(ws, dst)[0].tolist()) == uids.tolist()
    # The bar's last line counts them all (the reporter's final run).
    last = stream.getvalue().replace('\r', '\n').strip().splitlines()[-1]
    assert last.startswith('progress_pipe: %drec' % n), stream.getvalue()
