"""Readers and writers: the interface data pipelines are built from
(Caffe2's ``caffe2.python.dataio``).

A :class:`Reader` adds to nets the operators that read the next batch of a
data source; a :class:`Writer` adds the operators that append a batch to a
sink.  Nothing is read or written when these methods run: they only build
nets, which a plan (usually a ``pipeline.pipe`` Task) runs later, possibly
from several threads at once, so the operators they add must be atomic.

The ``*_ex`` protocol is what pipelines use:

* ``reader.setup_ex(init_net, finish_net)`` once per task (e.g. create a
  cursor), then per thread
  ``reader.read_ex(local_init_net, local_finish_net) -> (nets, stop, fields)``:
  the nets read one batch and set the bool ``stop`` blob once the source is
  exhausted;
* ``writer.setup_ex(init_net, finish_net)`` once per task, then per thread
  ``writer.write_record_ex(fields, local_init_net, local_finish_net, stop)
  -> (nets, stop)``.

Examples: ``queue_util.Queue`` (reader and writer), ``dataset.Dataset``
(reader and writer), :class:`ReaderWithLimit`, :class:`CompositeReader`.
"""

import time

import numpy as np

from ferrocaffe import core
from ferrocaffe.schema import Field, Struct, from_blob_list

__all__ = [
    'Reader', 'Writer', 'ReaderBuilder', 'PipedReaderBuilder', 'Pipe',
    'CounterReader', 'ReaderWithLimitBase', 'ReaderWithLimit', 'CountUntil',
    'ReaderWithTimeLimit', 'ReaderWithDelay', 'CompositeReader',
    'CompositeReaderBuilder',
]


class Reader(object):
    """
    Base class of readers.  Subclasses implement ``read(read_net)`` (or
    ``read_ex``), and optionally ``reset(net)`` to allow another pass.
    """

    def __init__(self, schema=None):
        if schema is not None:
            assert isinstance(schema, Field)
        self._schema = schema

    def schema(self):
        assert self._schema is not None, 'Schema not provided for this reader.'
        return self._schema

    def _set_schema(self, schema):
        self._schema = schema

    def setup_ex(self, init_net, finish_net):
        """Adds what must run once at task start (``init_net``) and end
        (``finish_net``).  Nothing by default."""
        pass

    def read_ex(self, local_init_net, local_finish_net):
        """Returns ``(nets, should_stop, fields)`` for one thread.  The
        default puts ``read()`` into a new net named ``reader_body``."""
        read_net = core.Net('reader_body')
        return ([read_net],) + tuple(self.read(read_net))

    def read_record_ex(self, local_init_net, local_finish_net):
        """``read_ex`` with the fields as a record of the reader's schema
        (when it has one)."""
        nets, should_stop, fields = self.read_ex(
            local_init_net, local_finish_net)
        if self._schema:
            fields = from_blob_list(self._schema, fields)
        return nets, should_stop, fields

    def read(self, read_net):
        """Adds to ``read_net`` the operators reading one batch and returns
        ``(should_stop, fields)``: a bool scalar blob that becomes true at
        the end of the data, and the list of blobs of the batch.  The ops
        must be thread-safe: clones of the net may run concurrently."""
        raise NotImplementedError('Readers must implement `read`.')

    def reset(self, net):
        """Adds to ``net`` the operators restarting the reader from the
        beginning (not every reader supports this)."""
        raise NotImplementedError('This reader cannot be resetted.')

    def read_record(self, read_net):
        should_stop, fields = self.read(read_net)
        if self._schema:
            fields = from_blob_list(self._schema, fields)
        return should_stop, fields

    def execution_step(self, reader_net_name=None, external_should_stop=None):
        """Returns ``(read_step, fields)``: a step looping over a net with
        the read operators until the data ends (or ``external_should_stop``
        becomes true), and the record read on each iteration.  Add nets to
        the step to consume the batch."""
        reader_net = core.Net(reader_net_name or 'reader')
        should_stop, fields = self.read_record(reader_net)
        if external_should_stop is not None:
            should_stop = reader_net.Or([external_should_stop, should_stop])
        read_step = core.execution_step(
            '{}_step'.format(reader_net_name), reader_net,
            should_stop_blob=should_stop)
        return (read_step, fields)


class Writer(object):
    """
    Base class of writers.  Subclasses implement ``write(writer_net,
    fields)`` and, when the sink needs it, ``commit(finish_net)``.
    """
    _schema = None

    def schema(self):
        return self._schema

    def write(self, writer_net, fields):
        """Adds to ``writer_net`` the operators appending one batch
        (``fields``, a list of blobs).  They must be thread-safe."""
        raise NotImplementedError('Writers must implement write.')

    def write_record(self, writer_net, fields):
        if isinstance(fields, Field):
            self._schema = fields
            fields = fields.field_blobs()
        self.write(writer_net, fields)

    def setup_ex(self, init_net, finish_net):
        """Once-per-task setup; by default adds ``commit`` to
        ``finish_net``."""
        self.commit(finish_net)

    def write_ex(self, fields, local_init_net, local_finish_net, stop_blob):
        """Returns the nets writing one batch for one thread."""
        write_net = core.Net('write_net')
        self.write(write_net, fields)
        return [write_net]

    def write_record_ex(self, fields, local_init_net, local_finish_net,
                        stop_blob=None):
        """Returns ``(nets, stop_blob)``; ``fields`` may be a record, which
        becomes this writer's schema."""
        if isinstance(fields, Field):
            self._schema = fields
            fields = fields.field_blobs()
        if stop_blob is None:
            stop_blob = local_init_net.NextName('dequeue_status')
        write_nets = self.write_ex(
            fields, local_init_net, local_finish_net, stop_blob)
        return (write_nets, stop_blob)

    def commit(self, finish_net):
        """Adds to ``finish_net`` what signals the end of the data (nothing
        by default)."""
        pass


class ReaderBuilder(object):
    """Makes readers on demand, e.g. one per node of a distributed job."""

    def schema(self):
        raise NotImplementedError()

    def setup(self, **kwargs):
        """One-time setup before ``new_reader`` is called."""
        raise NotImplementedError()

    def new_reader(self, **kwargs):
        raise NotImplementedError()


class PipedReaderBuilder(ReaderBuilder):
    """A ReaderBuilder passing each new reader through
    ``piper(reader=..., **kwargs)`` (e.g. a ``pipe`` with a processor) and
    returning the result as a Reader.

        PipedReaderBuilder(builder, lambda reader, **kw: pipe(reader, processor=f))
    """

    def __init__(self, builder, piper):
        self._builder = builder
        self._piper = piper

    def schema(self):
        return self._builder.schema()

    def setup(self, **kwargs):
        return self._builder.setup(**kwargs)

    def new_reader(self, **kwargs):
        output = self._piper(reader=self._builder.new_reader(**kwargs),
                             **kwargs)
        return output if isinstance(output, Reader) else output.reader()


class Pipe(object):
    """
    Something that can be both written and read, such as a queue.  With an
    ``obj_key``, every new reader or writer attaches the pipe under that key
    to its init net, so that the pipe's ``setup`` runs (once) when a task
    using it is compiled.
    """

    def __init__(self, schema=None, obj_key=None):
        self._num_writers = 0
        self._num_readers = 0
        self._schema = schema
        self._obj_key = obj_key

    def schema(self):
        return self._schema

    def setup(self, global_init_net):
        pass

    def reader(self):
        raise NotImplementedError()

    def writer(self):
        raise NotImplementedError()

    def num_readers(self):
        return self._num_readers

    def num_writers(self):
        return self._num_writers

    def _new_writer(self, writer_schema, writer_init_net):
        if writer_schema is not None and self._schema is None:
            self._schema = writer_schema
        self._num_writers += 1
        if self._obj_key is not None:
            writer_init_net.add_attribute(self._obj_key, self)

    def _new_reader(self, reader_init_net):
        self._num_readers += 1
        if self._obj_key is not None:
            reader_init_net.add_attribute(self._obj_key, self)


class CounterReader(Reader):
    """A reader of increasing int64 numbers (0, 1, 2, ...) that never
    stops by itself; schema ``Struct(('iter', np.int64))``."""

    def __init__(self):
        Reader.__init__(self, schema=Struct(('iter', np.int64)))
        self.counter = None
        self.should_stop = None

    def setup_ex(self, global_init_net, global_finish_net):
        if self.counter is None:
            self.counter = global_init_net.CreateCounter([], init_count=0)
            self.should_stop = global_init_net.ConstantFill(
                [], shape=[], dtype=core.DataType.BOOL, value=False)

    def read_ex(self, local_init_net, local_finish_net):
        count_net = core.Net('limited_reader_counter')
        value = count_net.CountUp([self.counter], 1)
        return [count_net], self.should_stop, [value]


class ReaderWithLimitBase(Reader):
    """
    A reader wrapping another one that may stop before the data ends.

    ``data_finished()`` is a bool blob, false at setup, that becomes true
    once the wrapped reader reported the end of its data: after a run it
    tells whether the data ran out (true) or the limit was reached (false).
    Subclasses implement ``setup_limiter`` and ``check_limiter_condition``.
    """

    def __init__(self, reader):
        Reader.__init__(self, schema=reader._schema)
        self.reader = reader
        self.net = core.Net('reader_with_limit')
        self._data_finished = self.net.AddExternalInput(
            self.net.NextName('data_finished'))
        self.should_stop = None

    def setup_ex(self, global_init_net, global_finish_net):
        global_init_net.ConstantFill(
            [], [self._data_finished],
            shape=[], value=False, dtype=core.DataType.BOOL)
        self.reader.setup_ex(global_init_net, global_finish_net)
        self.setup_limiter(global_init_net, global_finish_net)

    def read_ex(self, local_init_net, local_finish_net):
        """The nets are: the limit check (its output is the stop blob), the
        wrapped reader's nets, then a net copying the wrapped reader's stop
        flag into the stop blob and or-ing it into ``data_finished``.
        Because the executor tests the stop blob after each net, a batch is
        only read while the limit is not reached."""
        stop_condition_net = core.Net('limited_reader_condition')
        should_stop = self.check_limiter_condition(stop_condition_net)

        nets, local_data_finished, fields = self.reader.read_ex(
            local_init_net, local_finish_net)
        self._set_schema(self.reader._schema)

        check_done_net = core.Net('limited_reader_post')
        check_done_net.Copy(local_data_finished, should_stop)
        check_done_net.Or([self._data_finished, local_data_finished],
                          [self._data_finished])
        return ([stop_condition_net] + list(nets) + [check_done_net],
                should_stop, fields)

    def setup_limiter(self, global_init_net, global_finish_net):
        """Adds the once-per-task setup of the limit."""
        raise NotImplementedError('Subclass must implement `setup_limiter`')

    def check_limiter_condition(self, stop_condition_net):
        """Adds to ``stop_condition_net`` the test of the limit, run before
        each batch; returns the bool blob that is true once it is
        reached."""
        raise NotImplementedError(
            'Subclass must implement `check_limiter_condition')

    def data_finished(self):
        """The bool blob telling whether the wrapped reader ran dry."""
        return self._data_finished


class ReaderWithLimit(ReaderWithLimitBase):
    """Reads at most ``num_iter`` batches per run of its task (summed over
    all threads).  ``num_iter=None`` means no limit: it then only adds
    ``data_finished``.  The counter is created when the task is set up."""

    def __init__(self, reader, num_iter=1):
        ReaderWithLimitBase.__init__(self, reader)
        self.counter = None
        self.num_iter = num_iter
        if self.num_iter is not None:
            self.counter = self.net.AddExternalInput(
                self.net.NextName('counter'))

    def setup_limiter(self, global_init_net, global_finish_net):
        if self.counter:
            global_init_net.CreateCounter(
                [], [self.counter], init_count=int(self.num_iter))

    def check_limiter_condition(self, stop_condition_net):
        if self.counter:
            return stop_condition_net.CountDown([self.counter], 1)
        return stop_condition_net.ConstantFill(
            [], 1, shape=[], value=False, dtype=core.DataType.BOOL)


def CountUntil(num_iter):
    """A reader of 0, 1, ..., num_iter - 1."""
    return ReaderWithLimit(CounterReader(), num_iter)


class ReaderWithTimeLimit(ReaderWithLimitBase):
    """Stops reading once ``duration`` seconds have passed since the task
    was set up.  ``duration`` None or <= 0 means no limit."""

    def __init__(self, reader, duration=0):
        ReaderWithLimitBase.__init__(self, reader)
        self.timer = None
        self.duration = duration
        self.duration_ns_blob = None

    def setup_limiter(self, global_init_net, global_finish_net):
        if self.duration is not None and self.duration > 0:
            duration_ns = int(self.duration * (10 ** 9))
            self.timer = global_init_net.TimerBegin(
                [], counter_name='epoch_timer')
            start_time = global_init_net.TimerGet(self.timer)
            # an int64 scalar shaped like the timer reading
            self.duration_ns_blob = global_init_net.ConstantFill(
                [start_time], value=duration_ns)
            global_finish_net.TimerEnd([self.timer], [])

    def check_limiter_condition(self, stop_condition_net):
        if self.duration is not None and self.duration > 0:
            time_elapsed = stop_condition_net.TimerGet(self.timer)
            # Caffe2 passed str(self.should_stop), i.e. a blob literally
            # named "None"; a fresh name is used instead.
            return stop_condition_net.GE(
                [time_elapsed, self.duration_ns_blob], 1)
        return stop_condition_net.ConstantFill(
            [], 1, shape=[], value=False, dtype=core.DataType.BOOL)


class ReaderWithDelay(Reader):
    """Test helper: sleeps ``delay`` seconds before each batch."""

    def __init__(self, reader, delay):
        Reader.__init__(self, schema=reader._schema)
        self.reader = reader
        self.delay = delay

    def setup_ex(self, global_init_net, global_finish_net):
        self.reader.setup_ex(global_init_net, global_finish_net)

    def read_ex(self, local_init_net, local_finish_net):
        read_net = core.Net('reader_body')
        delay = self.delay

        def sleep_op(inputs, outputs):
            time.sleep(delay)

        read_net.Python(sleep_op)([], [])
        return ([read_net],) + tuple(self.reader.read(read_net))


class CompositeReader(Reader):
    """Reads from several readers in lockstep; the record is a Struct with
    one field per reader (named by ``names``).  Stops as soon as any of the
    readers stops."""

    def __init__(self, names, readers):
        assert len(names) == len(readers)
        Reader.__init__(self, schema=Struct(*[
            (name, reader.schema()) for name, reader in zip(names, readers)]))
        self._names = names
        self._readers = readers

    def setup_ex(self, init_net, finish_net):
        for reader in self._readers:
            reader.setup_ex(init_net, finish_net)

    def read_ex(self, local_init_net, local_finish_net):
        local_should_stop = local_init_net.ConstantFill(
            [], shape=[], dtype=core.DataType.BOOL, value=False)
        read_nets = []
        fields = []
        for name, reader in zip(self._names, self._readers):
            sub_nets, should_stop, record = reader.read_record_ex(
                local_init_net, local_finish_net)
            stop_net = core.Net('{}_stop'.format(name))
            stop_net.Copy(should_stop, local_should_stop)
            read_nets.extend(sub_nets)
            read_nets.append(stop_net)
            fields.extend(record.field_blobs())
        return read_nets, local_should_stop, fields

    def reset(self, net):
        for reader in self._readers:
            reader.reset(net)


class CompositeReaderBuilder(ReaderBuilder):
    """Builds a CompositeReader out of one reader per builder."""

    def __init__(self, names, reader_builders):
        ReaderBuilder.__init__(self)
        self._names = names
        self._reader_builders = reader_builders
        self._schema = Struct(*[
            (name, builder.schema())
            for name, builder in zip(names, reader_builders)])

    def schema(self):
        return self._schema

    def setup(self, **kwargs):
        for builder in self._reader_builders:
            builder.setup(**kwargs)

    def new_reader(self, **kwargs):
        readers = []
        for builder in self._reader_builders:
            reader = builder.new_reader(**kwargs)
            if isinstance(reader, Reader):
                pass
            elif hasattr(reader, 'reader'):
                reader = reader.reader()
            else:
                raise ValueError(
                    'reader must be an instance of Reader or Pipe')
            readers.append(reader)
        multi_reader = CompositeReader(self._names, readers)
        assert multi_reader.schema() == self._schema
        return multi_reader
