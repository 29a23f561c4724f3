"""A queue of records fed from a reader by producer threads, read through a
Reader (Caffe2's ``caffe2.python.record_queue``).

    rq = RecordQueue(['uid', 'value'], capacity=10, num_threads=2)
    reader, producer_step, exit_step, schema = rq.build(source_reader)

Run ``producer_step`` then ``exit_step`` (which closes the queue) alongside
a consumer reading ``reader``; the consumer stops once the queue is closed
and drained.

Unlike Caffe2, each producer thread runs in a child workspace of its own, so
two threads whose ``process`` functions name their outputs alike do not
enqueue each other's records (the queue, created beforehand, is shared).
"""

from ferrocaffe import core, workspace
from ferrocaffe.dataio import Reader, Writer
from ferrocaffe.schema import Field, Struct, from_column_list

__all__ = ['RecordQueue']


class _QueueReader(Reader):
    def __init__(self, blobs_queue, schema, name=None):
        """Use ``RecordQueue(...).reader``."""
        super().__init__(schema)
        self.blobs_queue = blobs_queue
        self.name = name

    def read(self, read_net):
        with core.NameScope(read_net.NextName(self.name)):
            status = read_net.NextName()
            outputs = read_net.SafeDequeueBlobs(
                self.blobs_queue, self._schema.field_names() + [status])
        return outputs[-1], outputs[:-1]


class _QueueWriter(Writer):
    def __init__(self, blobs_queue, schema):
        self.blobs_queue = blobs_queue
        self.schema = schema

    def write(self, writer_net, fields):
        if isinstance(fields, Field):
            fields = fields.field_blobs()
        writer_net.CheckDatasetConsistency(
            fields, [], fields=self.schema.field_names())
        status = writer_net.NextName()
        writer_net.SafeEnqueueBlobs(
            [self.blobs_queue] + list(fields), list(fields) + [status])
        return status


class RecordQueue(object):
    """A queue of records of ``fields`` (a Struct, or a list of field
    names), created in the current workspace at once, with a writer, a
    reader and ``exit_step`` (closes the queue).

    Args:
        fields: the record schema (Struct) or its column names.
        name: prefix of the queue's nets (default 'queue').
        capacity: records the queue holds before a producer blocks.
        enforce_unique_name: passed to CreateBlobsQueue.
        num_threads: producer threads :meth:`build` makes.
    """

    def __init__(self, fields, name=None, capacity=1,
                 enforce_unique_name=False, num_threads=1):
        if not isinstance(fields, (list, Struct)):
            raise TypeError(
                'fields must be either a Struct or a list of raw field names.')
        if isinstance(fields, list):
            fields = from_column_list(fields)
        self.schema = fields
        self.name = name or 'queue'
        self.num_threads = num_threads
        init_net = core.Net(self.name + '/init_net')
        self.blobs_queue = init_net.CreateBlobsQueue(
            [], 1, capacity=capacity, num_blobs=len(self.schema.field_names()),
            enforce_unique_name=enforce_unique_name)
        workspace.RunNetOnce(init_net)

        self.writer = _QueueWriter(self.blobs_queue, self.schema)
        self.reader = _QueueReader(self.blobs_queue, self.schema,
                                   self.name + '_reader')
        exit_net = core.Net(self.name + '/exit_net')
        exit_net.CloseBlobsQueue(self.blobs_queue, 0)
        self.exit_step = core.execution_step(
            '{}_close_step'.format(str(exit_net)), exit_net)

    def build(self, reader, process=None):
        """Builds the producers: ``num_threads`` concurrent loops, each
        reading a record from ``reader``, passing it through
        ``process(net, record) -> record`` if given, and enqueueing it, until
        the reader is done.

        Returns:
            (reader of the queue, producer step, exit step, schema)
        """
        producers = []
        for i in range(self.num_threads):
            read_net = core.Net('reader_' + str(i))
            should_stop, fields = reader.read_record(read_net)
            read_step = core.execution_step('reader_' + str(i), read_net)

            write_net = core.Net('queue_writer' + str(i))
            blobs = fields.field_blobs()
            if process:
                blobs = process(write_net, fields).field_blobs()
            self.writer.write(write_net, blobs)
            write_step = core.execution_step('queue_writer' + str(i),
                                             write_net)
            producer = core.execution_step(
                'producer_' + str(i), [read_step, write_step],
                should_stop_blob=should_stop)
            if self.num_threads > 1:
                # What a thread's nets create is the thread's own.
                producer.SetCreateWorkspace(True)
            producers.append(producer)
        producer_step = core.execution_step(
            'producers', producers, concurrent_substeps=True)
        return self.reader, producer_step, self.exit_step, self.schema
