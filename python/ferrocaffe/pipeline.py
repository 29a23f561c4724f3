"""Tasks that move records from a reader to a writer, optionally through
a processor (Caffe2's ``caffe2.python.pipeline``).

    with TaskGroup() as tg:
        q1 = pipe(dataset.reader(), processor=parse)     # -> a new Queue
        q2 = pipe(q1, num_runtime_threads=4, processor=featurize)
        pipe(q2, out_dataset.writer())
    session.run(tg)

Each ``pipe`` call adds one Task to the active TaskGroup.  The Task loops
read -> process -> write until the reader reports the end of its data or the
writer reports that its output was closed, on ``num_runtime_threads``
concurrent instances (or ``num_threads`` statically built copies).

A processor is called once per thread while the Task is *built*, with the
record the reader yields (a ``schema`` record of blobs), and adds the ops
that compute the output.  It may:

* use ``net_builder.ops`` and return a record (or nothing);
* return an :class:`Output`, a record, ``(record, stop_blob)``,
  ``(nets, record)`` / ``(nets, record, stop_blob)``, or a list of nets;
* be a ``core.Net`` with input and output records set: it is cloned for
  every thread (:class:`NetProcessor`).

A stop blob returned by the processor (or set with ``ops.stop_if``) ends
the Task's loop when it becomes true.

With several threads (``num_threads`` or ``num_runtime_threads`` > 1) every
loop runs in a child workspace: the blobs a thread's nets create are its own
(a processor may name its outputs as it likes), and blobs that exist before
the loops start (setup state, queues, counters from ``task_init`` or an
earlier net) are shared.
"""

import sys

import numpy as np

from ferrocaffe import core, queue_util, schema
from ferrocaffe.dataio import Reader, Writer
from ferrocaffe.net_builder import NetBuilder, ops
from ferrocaffe.schema import Field, as_record
from ferrocaffe.task import Node, Task, TaskGroup

__all__ = [
    'Output', 'DEFAULT_QUEUE_CAPACITY', 'make_processor',
    'normalize_processor_output', 'pipe', 'pipe_and_output',
    'processor_name', 'ProcessingReader', 'NetProcessor', 'Pipeline',
]


class Output(object):
    """
    What a processor produced: the nets to run (default: whatever the
    processor added through ``ops``), the output record (or None) and an
    optional stop blob.
    """

    def __init__(self, nets=None, record=None, should_stop=None):
        builder_children = NetBuilder.current().get()
        assert nets is None or len(builder_children) == 0, (
            'Cannot both use `ops` syntax and return a list of nets.')
        if nets is None:
            nets = builder_children
        if isinstance(nets, core.Net):
            nets = [nets]
        self.nets = [] if nets is None else list(nets)
        self.record = None if record is None else as_record(record)
        self.should_stop = should_stop


DEFAULT_QUEUE_CAPACITY = 100


def _init_output(output, capacity, global_init_net, global_exit_net):
    """(queue or None, writer) for a pipe's ``output``: a new Queue of
    ``capacity`` (default 100) when None, a Writer as is, or anything with
    a ``writer()`` method (a Queue, a stream)."""
    if output is None:
        out_queue = queue_util.Queue(
            capacity=(capacity if capacity is not None
                      else DEFAULT_QUEUE_CAPACITY))
        writer = out_queue.writer()
    elif isinstance(output, Writer):
        assert capacity is None, 'capacity would not be used.'
        out_queue = None
        writer = output
    elif hasattr(output, 'writer'):
        assert capacity is None, 'capacity would not be used.'
        out_queue = output
        writer = output.writer()
    else:
        raise ValueError('output must be a reader, queue or stream.')
    writer.setup_ex(global_init_net, global_exit_net)
    return out_queue, writer


def make_processor(processor):
    """The callable used for ``processor``: identity for None, a
    NetProcessor for a ``core.Net``, else the processor itself."""
    if processor is None:
        return lambda rec: rec
    if isinstance(processor, core.Net):
        return NetProcessor(processor)
    return processor


def normalize_processor_output(output):
    """Turns whatever a processor returned into an :class:`Output`.  Must
    be called inside the NetBuilder the processor ran in."""
    if isinstance(output, Output):
        return output
    if isinstance(output, Field):
        return Output(record=output)
    if isinstance(output, tuple):
        if (len(output) == 2 and isinstance(output[0], Field)
                and isinstance(output[1], core.BlobReference)):
            # (record, stop_blob)
            return Output(None, *output)
        # (nets, record[, stop_blob])
        return Output(*output)
    # nets only (or None: the processor used `ops`), no output record
    return Output(output)


def pipe(input, output=None, num_threads=1, processor=None, name=None,
         capacity=None, group=None, num_runtime_threads=1, progress=False):
    """
    Adds a Task that reads ``input`` until it ends, passes each record
    through ``processor`` and writes the result to ``output``.

    Args:
        input: a Reader, or anything with ``reader()`` (a Queue, a stream).
        output: a Writer, or anything with ``writer()``.  If None and the
            processor yields records, a new ``Queue(capacity or 100)`` is
            created and returned.
        num_threads: copies of the read/process/write loop built in Python
            (deprecated in favour of ``num_runtime_threads``).  0 builds no
            Task and returns a reader of the processed records instead.
        processor: see the module doc.
        name: the Task's name (default: derived from the processor, the
            output or the input).
        capacity: capacity of the queue created when ``output`` is None.
        group: the TaskGroup to add the Task to (default: the active one).
        num_runtime_threads: concurrent instances of the Task at run time.
        progress: True draws a tqdm bar of the records piped (and their
            rate) on stderr while the Task runs, when stderr is a terminal;
            a text stream draws it there. The bar is updated by a report
            net of the Task (every 0.2 s) whose Python op lives in this
            process: not for Tasks run on other processes (RaySession).

    Returns:
        The output queue, a Reader (``num_threads=0``) or None.
    """
    result, _ = _pipe_step(input, output, num_threads, processor, name,
                           capacity, group, num_runtime_threads,
                           progress=progress)
    return result


def pipe_and_output(input, output=None, num_threads=1, processor=None,
                    name=None, capacity=None, group=None,
                    num_runtime_threads=1, final_outputs=None):
    """
    Like :func:`pipe`, and the Task also returns ``final_outputs`` (a blob,
    a record, or a list of them) to the session once done.

    Returns:
        ``(out_queue, task_outputs)``: the result of ``pipe``, and the
        TaskOutput (a list of them if ``final_outputs`` was a list or
        tuple; None without ``final_outputs``).
    """
    assert num_threads > 0
    result, task = _pipe_step(input, output, num_threads, processor, name,
                              capacity, group, num_runtime_threads,
                              final_outputs)
    output = None
    if final_outputs is not None:
        output = task.outputs()
        if type(final_outputs) not in (list, tuple):
            output = output[0]
    return result, output


def processor_name(processor):
    """A name for a processor, reader or writer: its ``name`` attribute,
    else (as in Caffe2 on Python 3) its class name."""
    if hasattr(processor, 'name'):
        return processor.name
    if hasattr(processor, 'func_name'):
        if processor.func_name == '<lambda>':
            return processor.__module__
        if hasattr(processor, 'im_class'):
            return '%s.%s' % (processor.im_class.__name__, processor.func_name)
        return processor.func_name
    return processor.__class__.__name__


def _profiler_name(name, input, output):
    # Caffe2 bug fixed: the builtin `input` was named instead of the pipe's.
    return '{0}/{1}/{2}/{3}/{4}'.format(
        str(Node.current()), 'pipe', name,
        processor_name(input) if input else 'NoInput',
        processor_name(output) if output else 'NoOutput')


def _timer_nets(profiler_name):
    timer_start_net = core.Net('timer_start')
    timer = timer_start_net.TimerBegin([], counter_name=profiler_name)
    timer_end_net = core.Net('timer_end')
    timer_end_net.TimerEnd(timer, [])
    return timer_start_net, timer_end_net


class _PipeBar(object):
    """The tqdm bar of a pipe's records, drawn by the Task's reporter."""

    def __init__(self, name, progress):
        self.name = name
        self.progress = progress
        self.bar = None
        self.closed = False

    def update(self, inputs, outputs):
        count = int(np.asarray(inputs[0].data).reshape(-1)[0])
        if self.closed:
            return
        if self.bar is None:
            import tqdm
            forced = self.progress is not True
            self.bar = tqdm.tqdm(
                desc=self.name, unit='rec', file=self.progress if forced else sys.stderr,
                disable=False if forced else None, leave=True)
        self.bar.n = count
        self.bar.refresh()

    def close(self, inputs, outputs):
        if self.bar is not None and not self.closed:
            self.bar.close()
        self.closed = True


def _add_progress(name, progress, end_net):
    """Counts the pipe's records (a counter bumped by ``end_net``, the
    loop body's last net, which the iteration that finds no more data does
    not reach) and reports them to a bar."""
    init_net = core.Net('progress_init')
    counter = init_net.CreateCounter([], [core.ScopedBlobReference('pipe_progress')],
                                     init_count=0)
    with ops.task_init():  # before the reporter starts
        ops.net(init_net)
    end_net.CountUp([counter], 1)
    bar = _PipeBar(name, progress)
    with ops.task_reporter(interval_ms=200, name='pipe_progress'):
        ops.Python(bar.update)([ops.RetrieveCount([counter])], [])
    with ops.task_exit():
        ops.Python(bar.close)([], [])
    return counter


def _runtime_threads_task(name, group, final_outputs, reader, num_threads,
                          output, capacity, input=None, progress=False):
    """One Task whose loop runs as ``num_threads`` concurrent instances."""
    profiler_name = _profiler_name(name, input, output)

    with Task(name=name, group=group, outputs=final_outputs,
              num_instances=num_threads) as task:
        global_exit_net = core.Net('pipe:exit')
        global_init_net = core.Net('pipe:init')
        reader.setup_ex(global_init_net, global_exit_net)

        init_net = core.Net('pipe:instance:init')
        exit_net = core.Net('pipe:instance:exit')
        read_nets, status, rec = reader.read_record_ex(init_net, exit_net)
        init_net.ConstantFill([], [status], shape=[], value=False,
                              dtype=core.DataType.BOOL)

        if rec is not None:
            out_queue, writer = _init_output(
                output, capacity, global_init_net, global_exit_net)
            write_nets, _ = writer.write_record_ex(
                rec, init_net, exit_net, status)
        else:
            out_queue = None
            write_nets = []

        with ops.task_init():
            ops.net(global_init_net)
        with ops.task_instance_init():
            ops.net(init_net)

        timer_start_net, timer_end_net = _timer_nets(profiler_name)
        progress_end = []
        if progress:
            progress_end = [core.Net('progress_end')]
            _add_progress(name, progress, progress_end[0])
        ops.net(core.execution_step(
            'body',
            [timer_start_net] + list(read_nets) + list(write_nets)
            + [timer_end_net] + progress_end,
            should_stop_blob=status))
        ops.net(timer_end_net)

        with ops.task_instance_exit():
            ops.net(exit_net)
        with ops.task_exit():
            ops.net(global_exit_net)

    return out_queue, task


def _static_threads_task(name, group, final_outputs, reader, num_threads,
                         output, capacity, input=None, progress=False):
    """One Task running ``num_threads`` loops, each built separately (the
    processor is called once per loop), as concurrent substeps."""
    profiler_name = _profiler_name(name, input, output)

    with Task(name=name, group=group, outputs=final_outputs) as task:
        global_exit_net = core.Net('exit')
        global_init_net = core.Net('init')
        reader.setup_ex(global_init_net, global_exit_net)

        out_queue = None
        writer = None

        steps = []
        progress_end = core.Net('progress_end') if progress else None
        for thread_id in range(num_threads):
            with NetBuilder(name='t:%d' % thread_id) as nb:
                init_net = core.Net('init')
                exit_net = core.Net('exit')
                read_nets, status, rec = reader.read_record_ex(
                    init_net, exit_net)
                init_net.ConstantFill([], [status], shape=[], value=False,
                                      dtype=core.DataType.BOOL)

                if rec is not None:
                    if writer is None:
                        # Build the output under the task's own name, not
                        # the thread's, so that a new queue is named after
                        # the task.
                        with NetBuilder(_fullname=task.name):
                            out_queue, writer = _init_output(
                                output, capacity, global_init_net,
                                global_exit_net)
                    write_nets, _ = writer.write_record_ex(
                        rec, init_net, exit_net, status)
                else:
                    write_nets = []

                timer_start_net, timer_end_net = _timer_nets(profiler_name)
                ops.net(init_net)
                ops.net(core.execution_step(
                    'body',
                    [timer_start_net] + list(read_nets) + list(write_nets)
                    + [timer_end_net] + ([progress_end] if progress else []),
                    should_stop_blob=status))
                ops.net(timer_end_net)
                ops.net(exit_net)
            # Each loop runs in a child workspace of its own: the blobs its
            # read, process and write nets create are the thread's, so two
            # threads whose processors name an output alike cannot write
            # each other's batch between "compute" and "append" (Caffe2's
            # threads shared one workspace and raced here).  Blobs that
            # exist before the loops start (the reader's and writer's
            # state from setup, queues, counters made by task_init or an
            # earlier net) resolve to the parent and stay shared.
            thread_step = core.to_execution_step(nb)
            thread_step.SetCreateWorkspace(True)
            steps.append(thread_step)
        ops.net(global_init_net)
        if progress:
            _add_progress(name, progress, progress_end)
        ops.net(core.execution_step('body', steps, concurrent_substeps=True))
        ops.net(global_exit_net)
    return out_queue, task


def _pipe_step(input, output=None, num_threads=1, processor=None, name=None,
               capacity=None, group=None, num_runtime_threads=None,
               final_outputs=None, progress=False):
    assert num_threads <= 1 or num_runtime_threads <= 1, (
        'Only one of num_threads or num_runtime_threads must be set.')

    if isinstance(input, Reader):
        reader = input
    elif hasattr(input, 'reader'):
        reader = input.reader()
    else:
        raise ValueError('in must be a reader, queue or stream.')

    if processor is not None:
        reader = ProcessingReader(reader, processor)

    if num_threads == 0 or num_runtime_threads == 0:
        assert output is None
        return reader, None

    if name is None and processor is not None:
        name = processor_name(processor)
    if name is None and output is not None:
        name = 'pipe_into:%s' % processor_name(output)
    if name is None:
        name = 'pipe_from:%s' % processor_name(input)

    if num_threads > 1:
        return _static_threads_task(name, group, final_outputs, reader,
                                    num_threads, output, capacity, input,
                                    progress)
    return _runtime_threads_task(name, group, final_outputs, reader,
                                 num_runtime_threads, output, capacity, input,
                                 progress)


class ProcessingReader(Reader):
    """Reads from ``reader`` and passes each record through ``processor``
    (see the module doc); its records are the processor's output."""

    def __init__(self, reader, processor):
        Reader.__init__(self)
        self.reader = reader
        self.processor = make_processor(processor)

    def setup_ex(self, init_net, finish_net):
        self.reader.setup_ex(init_net, finish_net)

    def read_ex(self, init_net, exit_net):
        read_nets, status, rec = self.reader.read_record_ex(init_net, exit_net)
        read_nets = list(read_nets)
        # The reader's status is not used as the builder's stop blob: a
        # reader may copy into its status rather than pass it through
        # (ReaderWithLimit does), so a processor's stop condition is or-ed
        # into it afterwards instead.
        with NetBuilder() as nb:
            # The processor may add ops through `ops`; Output collects them.
            result = normalize_processor_output(self.processor(rec))
        read_nets += result.nets
        if result.should_stop is not None or nb._stop_blob is not None:
            stop_net = core.Net('stop_net')
            if result.should_stop is not None:
                stop_net.Or([status, result.should_stop], [status])
            if nb._stop_blob is not None:
                stop_net.Or([status, nb._stop_blob], [status])
            read_nets.append(stop_net)
        if hasattr(self.processor, 'setup'):
            init_net.add_attribute(TaskGroup.LOCAL_SETUP, self.processor)
        self._set_schema(result.record)
        fields = result.record.field_blobs() if result.record else None
        return read_nets, status, fields


def _ssa_blob_versions(proto):
    """(undefined, all_blobs) of a NetDef: the blobs some op reads before
    any op wrote them (or that are external inputs), and every blob named
    by the net's ops or external inputs."""
    written = set()
    undefined = set(str(b) for b in proto.external_input)
    all_blobs = list(str(b) for b in proto.external_input)
    seen = set(all_blobs)
    for op in proto.op:
        for name in op.input:
            name = str(name)
            if name not in written:
                undefined.add(name)
            if name not in seen:
                seen.add(name)
                all_blobs.append(name)
        for name in op.output:
            name = str(name)
            written.add(name)
            if name not in seen:
                seen.add(name)
                all_blobs.append(name)
    return undefined, all_blobs


def _clone_and_bind_net(net, name, prefix, blob_remap=None, inputs=None,
                        keep_schema=True):
    """Caffe2's ``core.clone_and_bind_net``: a clone of ``net`` named
    ``name`` whose input record is bound to the ``inputs`` record and whose
    internal blobs get ``prefix`` in front.  Returns (net, blob_remap)."""
    assert isinstance(net, core.Net)
    if blob_remap is None:
        blob_remap = {}
    if inputs is not None:
        assert isinstance(inputs, schema.Field)
        original = net.input_record()
        assert original is not None
        diff = set(original.field_names()) - set(inputs.field_names())
        assert len(diff) == 0, (
            "Schemas don't match, extra fields {diff} found in the net {name}. "
            'original: {original}; inputs: {inputs}'.format(
                diff=diff, name=net.Name(), original=original.field_names(),
                inputs=inputs.field_names()))
        original_mapping = dict(zip(original.field_names(),
                                    original.field_blobs()))
        for field_name, blob in zip(inputs.field_names(),
                                    inputs.field_blobs()):
            if field_name in original_mapping:
                blob_remap[str(original_mapping[field_name])] = str(blob)
    undefined, all_blobs = _ssa_blob_versions(net.Proto())
    for blob in all_blobs:
        if blob in blob_remap:
            continue
        blob_remap[blob] = blob if blob in undefined else prefix + blob
    cloned = net.Clone(name, blob_remap, keep_schema=keep_schema)
    if not keep_schema and inputs:
        cloned.set_input_record(inputs)
    return cloned, blob_remap


def _clone_and_bind(*args, **kwargs):
    impl = getattr(core, 'clone_and_bind_net', None) or _clone_and_bind_net
    return impl(*args, **kwargs)


class NetProcessor(object):
    """
    A processor made of a ``core.Net`` whose input record (and optionally
    output record) are set (``net.set_input_record`` /
    ``set_output_record``).  Each call clones the net, binding its input
    record to the record read and prefixing its internal blobs with the
    current builder's name, so every thread gets its own copy.

    Args:
        net: the net.
        stop_signal: a blob of the net that stops the pipe when true.
        thread_init_nets: nets cloned the same way for each thread and run
            (through ``setup``) once per node before the pipe starts.
        name: the processor's name (default: the net's).
    """

    def __init__(self, net, stop_signal=None, thread_init_nets=None,
                 name=None):
        assert isinstance(net, core.Net)
        assert stop_signal is None or isinstance(
            stop_signal, core.BlobReference)
        self.name = name or str(net)
        self.thread_init_nets = thread_init_nets or []
        self.net = net
        self._stop_signal = stop_signal
        self._blob_maps = []
        self._frozen = False
        self._cloned_init_nets = []

    def setup(self, init_net):
        self._frozen = True
        cloned_init_nets = self._cloned_init_nets
        self._cloned_init_nets = []
        return cloned_init_nets

    def __call__(self, rec):
        assert not self._frozen
        prefix = NetBuilder.current().name + '/'
        blob_remap = {}
        for net in self.thread_init_nets:
            new_net, _ = _clone_and_bind(
                net, str(net) + prefix, prefix, blob_remap)
            self._cloned_init_nets.append(new_net)

        new_net, remappings = _clone_and_bind(
            self.net, str(self.net) + prefix, prefix, blob_remap, rec)

        if self._stop_signal is None:
            stop_signal = None
        elif str(self._stop_signal) in remappings:
            stop_signal = core.BlobReference(
                remappings[str(self._stop_signal)], net=new_net)
        else:
            stop_signal = self._stop_signal

        self._blob_maps.append(remappings)
        return Output([new_net], new_net.output_record(), stop_signal)

    def blob_maps(self):
        self._frozen = True
        return self._blob_maps


class Pipeline(object):
    """
    A chain of pipes built step by step inside one TaskGroup:

        p = Pipeline(dataset.reader())
        p.pipe(processor=parse)
        p.pipe(processor=featurize, num_runtime_threads=4)
        p.pipe(out_dataset.writer())

    ``output()`` is what the last pipe returned (a queue, a reader or None).
    This convenience class is not part of Caffe2's module.
    """

    def __init__(self, input, group=None):
        self._output = input
        self._group = group
        self._tasks = []

    def pipe(self, output=None, **kwargs):
        assert self._output is not None, (
            'The previous pipe produced no output to read from.')
        kwargs.setdefault('group', self._group)
        result, task = _pipe_step(
            self._output, output,
            kwargs.pop('num_threads', 1),
            kwargs.pop('processor', None),
            kwargs.pop('name', None),
            kwargs.pop('capacity', None),
            kwargs.pop('group'),
            kwargs.pop('num_runtime_threads', 1),
            kwargs.pop('final_outputs', None))
        assert not kwargs, 'Unexpected arguments: %s' % sorted(kwargs)
        if task is not None:
            self._tasks.append(task)
        self._output = result
        return self

    def output(self):
        return self._output

    def tasks(self):
        return list(self._tasks)
