"""An in-memory dataset with a structured schema (Caffe2's
``caffe2.python.dataset``).

The data is held as one tensor per schema leaf (see :mod:`schema`), in the
workspace, so reading it needs no conversion: a reader walks a TreeCursor
over the columns (``ReadNextBatch``), a writer appends batches under a mutex
(``AtomicAppend``).

    ds = Dataset(schema.Struct(('label', np.int64)))
    ds.init_empty(init_net)            # empty columns
    writer = ds.writer(init_net)       # or let a pipe() set it up
    reader = ds.reader(init_net, batch_size=10)

Appending while a reader of the same dataset runs is not supported.
"""

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.dataio import Reader, Writer
from ferrocaffe.schema import (
    InitEmptyRecord, Struct, data_type_for_dtype, from_blob_list,
    from_column_list)

__all__ = ['Dataset', 'Const', 'execution_step_with_progress']


class _DatasetReader(Reader):
    def __init__(self, dataset, name, batch_size=1, enforce_batch_size=False):
        """Use Dataset.reader() instead."""
        Reader.__init__(self, dataset.content())
        self.dataset = dataset
        self.name = name or (dataset.name + '_cursor')
        self.batch_size = batch_size
        self.enforce_batch_size = enforce_batch_size
        self.cursor = None

    def setup_ex(self, init_net, exit_net):
        if self.cursor is None:
            self.cursor = init_net.CreateTreeCursor(
                [], [self.name], fields=self.dataset.fields)

    def read(self, read_net):
        assert self.cursor, 'setup not called.'
        content = self.dataset.content()
        with core.NameScope(read_net.NextName(self.name)):
            fields = read_net.ReadNextBatch(
                [self.cursor] + content.field_blobs(),
                content.field_names(),
                batch_size=self.batch_size,
                enforce_batch_size=self.enforce_batch_size)
            fields = core.output_to_list(fields)
            return (read_net.IsEmpty([fields[0]]), fields)

    def reset(self, net):
        net.ResetCursor([self.cursor], [])


class _DatasetRandomReader(Reader):
    def __init__(self, dataset, name, indices, batch_size=1, loop_over=False,
                 enforce_batch_size=False):
        """Use Dataset.random_reader() instead."""
        Reader.__init__(self, dataset.content())
        self.dataset = dataset
        self.cursor = None
        self.name = name or (dataset.name + '_cursor')
        self.indices = indices
        self.batch_size = batch_size
        self.loop_over = loop_over
        self.enforce_batch_size = enforce_batch_size
        self.offsets = None

    def setup_ex(self, init_net, exit_net):
        if self.cursor is None:
            self.cursor = init_net.CreateTreeCursor(
                [], [self.name], fields=self.dataset.fields)

    def reset(self, net):
        net.ResetCursor([self.cursor], [])

    def computeoffset(self, net):
        """Adds to ``net`` the computation of the record offsets that
        ReadRandomBatch needs (and a cursor reset)."""
        self.reset(net)
        self.offsets = net.ComputeOffset(
            [self.cursor] + self.dataset.content().field_blobs(), 'offsets')

    def sort_and_shuffle(self, net, sort_by_field=None, shuffle_size=1,
                         batch_size=1):
        """Adds to ``net`` the computation of the reading order: optionally
        sorted by ``sort_by_field``, shuffled in blocks of
        ``shuffle_size`` batches."""
        content = self.dataset.content()
        sort_by_field_idx = -1
        if sort_by_field:
            assert sort_by_field in content.field_names(), (
                'Must be valid field.')
            sort_by_field_idx = content.field_names().index(sort_by_field)
        self.reset(net)
        self.indices = net.SortAndShuffle(
            [self.cursor] + content.field_blobs(), 'indices',
            sort_by_field_idx=sort_by_field_idx,
            shuffle_size=shuffle_size,
            batch_size=batch_size)

    def read(self, read_net):
        assert self.cursor, 'setup_ex not called'
        assert self.indices, 'sort_and_shuffle not called'
        assert self.offsets, 'computeoffset not called'
        content = self.dataset.content()
        with core.NameScope(read_net.NextName(self.name)):
            fields = read_net.ReadRandomBatch(
                [self.cursor, self.indices, self.offsets]
                + content.field_blobs(),
                content.field_names(),
                batch_size=self.batch_size,
                enforce_batch_size=self.enforce_batch_size,
                loop_over=self.loop_over)
            fields = core.output_to_list(fields)
            return (read_net.IsEmpty([fields[0]]), fields)


class _DatasetWriter(Writer):
    def __init__(self, content):
        """Use Dataset.writer() instead."""
        self._content = content
        self.mutex = None

    def setup_ex(self, init_net, exit_net):
        if self.mutex is None:
            self.mutex = init_net.CreateMutex([])

    def write(self, writer_net, fields):
        """Adds to ``writer_net`` a check of ``fields`` against the schema
        (each field of a declared dtype must have it, and the lengths must
        be consistent) and their atomic append to the dataset."""
        assert self.mutex is not None, 'setup not called.'
        field_blobs = self._content.field_blobs()
        assert len(fields) == len(field_blobs), (
            'Expected %s fields, got %s.' % (len(field_blobs), len(fields)))
        # Caffe2 let the first write into an empty column set its dtype, so a
        # processor that swapped two fields silently retyped the dataset.
        writer_net.CheckDatasetConsistency(
            fields, [], fields=self._content.field_names(),
            dtypes=[_declared_data_type(t)
                    for t in self._content.field_types()])
        writer_net.AtomicAppend(
            [self.mutex] + field_blobs + list(fields), field_blobs)

    def commit(self, finish_net):
        """Nothing to do for an in-memory dataset."""
        pass


def _declared_data_type(dtype):
    """The ``core.DataType`` a schema declares for a field; UNDEFINED (any)
    for a field of unknown type (a dataset built from names only)."""
    if np.dtype(dtype) == np.void:
        return core.DataType.UNDEFINED
    try:
        return data_type_for_dtype(dtype)
    except TypeError:  # stored as InitEmptyRecord's untyped placeholder
        return core.DataType.UNDEFINED


def Const(net, value, dtype=None, name=None):
    """An external input of ``net``, with a fresh name, fed with ``value``
    in the current workspace now."""
    assert isinstance(net, core.Net), 'net must be a core.Net instance.'
    value = np.array(value, dtype=dtype)
    blob = net.AddExternalInput(net.NextName(prefix=name))
    workspace.FeedBlob(str(blob), value)
    return blob


def execution_step_with_progress(name, init_net, substeps, rows_read):
    """Runs ``substeps`` concurrently, printing ``rows_read`` every 5 s."""
    report_net = core.Net('report_net')
    report_net.Print([rows_read], [])
    return core.execution_step(
        name, substeps, report_net=report_net, concurrent_substeps=True,
        report_interval=5)


class Dataset(object):
    """An in-memory dataset of fixed schema.

    Args:
        fields: a ``schema.Struct`` (if it holds blobs, they become the
            dataset's storage) or a list of column names.
        name: prefix of the cursor names (default ``'dataset'``).

    Unless ``fields`` holds blobs, initialise it with ``init_empty`` or
    ``init_from_dataframe`` before use.
    """

    def __init__(self, fields, name=None):
        assert isinstance(fields, list) or isinstance(fields, Struct), (
            'fields must be either a Struct or a list of raw field names.')
        if isinstance(fields, list):
            fields = from_column_list(fields)
        self.schema = fields
        self.fields = fields.field_names()
        self.field_types = fields.field_types()
        self.name = name or 'dataset'
        self.field_blobs = fields.field_blobs() if fields.has_blobs() else None

    def trim(self, net, multiple_of):
        """Adds to ``net`` the trimming of the dataset to a multiple of
        ``multiple_of`` records (operator ``TrimDataset``)."""
        net.TrimDataset(self.field_blobs, self.field_blobs,
                        fields=self.fields, multiple_of=multiple_of)

    def init_empty(self, init_net):
        """Adds to ``init_net`` the creation of empty columns (new blobs,
        named after the fields under the current name scope)."""
        self.field_blobs = InitEmptyRecord(
            init_net, self.schema.clone_schema()).field_blobs()

    def init_from_dataframe(self, net, dataframe):
        """Feeds each column of a pandas DataFrame (in field order) into a
        new blob now; the blobs are external inputs of ``net``."""
        assert len(self.fields) == len(dataframe.columns)
        self.field_blobs = [
            Const(net, np.asarray(dataframe.iloc[:, col]).flatten(),
                  name=field)
            for col, field in enumerate(self.fields)]

    def get_blobs(self):
        """The blobs holding the columns."""
        assert self
        return self.field_blobs

    def content(self):
        """The full content, as a record of the column blobs."""
        return from_blob_list(self.schema, self.field_blobs)

    def field_names(self):
        return self.fields

    def field_types(self):
        """The dtypes of the columns (np.void when built from names)."""
        return self.field_types

    def reader(self, init_net=None, cursor_name=None, batch_size=1,
               enforce_batch_size=False):
        """A reader of ``batch_size`` records per read.

        Its cursor (blob ``cursor_name``, default ``<name>_cursor``) is
        created in ``init_net`` if given, else by ``setup_ex`` (which a
        ``pipe`` calls).  With ``enforce_batch_size`` a last, partial batch
        is not returned.
        """
        assert self.field_blobs, 'Dataset not initialized.'
        reader = _DatasetReader(self, cursor_name, batch_size,
                                enforce_batch_size)
        if init_net is not None:
            reader.setup_ex(init_net, None)
        return reader

    def random_reader(self, init_net=None, indices=None, cursor_name=None,
                      batch_size=1, loop_over=False,
                      enforce_batch_size=False):
        """A reader following the order in ``indices`` (see
        ``sort_and_shuffle`` and ``computeoffset`` of the reader);
        ``loop_over`` starts again at the end."""
        assert self.field_blobs, 'Dataset not initialized.'
        reader = _DatasetRandomReader(self, cursor_name, indices, batch_size,
                                      loop_over, enforce_batch_size)
        if init_net is not None:
            reader.setup_ex(init_net, None)
        return reader

    def writer(self, init_net=None):
        """A writer appending to the dataset.  Its mutex is created in
        ``init_net`` if given, else by ``setup_ex``."""
        assert self.field_blobs, 'Dataset not initialized.'
        writer = _DatasetWriter(self.content())
        if init_net is not None:
            writer.setup_ex(init_net, None)
        return writer
