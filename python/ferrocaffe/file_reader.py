"""Readers of data on disk: Parquet files or folders (:class:`ParquetReader`)
and ``.npy`` arrays (:class:`NpyReader`), and a Parquet writer
(:class:`ParquetWriter`).  They stand where Caffe2's examples used a Hive
reader and writer.

Both are :class:`dataio.Reader` s: ``pipe(reader, ...)`` reads them from any
number of threads, each record exactly once.  Reading is done by Rust
operators (``ReadParquetBatch``, ``ReadNpyBatch``) that stream the files in
batches: a Parquet file is decoded page by page with the ``parquet`` crate's
typed column readers, straight into the batch's tensors, never loaded
whole; ``.npy`` rows are read with positioned reads.  No pyarrow is needed.

    reader = ParquetReader('/data/events/', ['uid', 'score', 'items'],
                           batch_size=4096)
    with TaskGroup() as tg:
        out = pipe(reader, processor=featurize, num_threads=4)
    session.run(tg)

A Parquet column becomes a schema field: a primitive column a ``Scalar``, a
list column a ``List`` (``lengths`` int32 + ``values``); a column ``a.b``
is the field ``a:b``.  The reader's position lives in its blob
(``reader.reader_blob``): ``Save`` writes it with a checkpoint and ``Load``
restores a reader that resumes there (the files must be unchanged).

Errors name the file and the column: a missing or unreadable file is an
``OSError`` (``FerrocaffeIOError``), as is a corrupt one; a column whose type
is not the one the schema asks for is a ``TypeError`` (``DataTypeError``).
By default the files are checked when the reader is made (only their
footers are read); pass ``validate=False`` for files that a plan writes
first.
"""

import itertools
import os

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.dataio import Reader, Writer
from ferrocaffe.db import open_regular
from ferrocaffe.schema import (
    Field, List, Scalar, Struct, data_type_for_dtype, dtype_for_core_type)

__all__ = ['ParquetReader', 'ParquetWriter', 'NpyReader', 'parquet_columns']

DEFAULT_BATCH_SIZE = 1024

_names = itertools.count()


def _paths(path):
    """A path, or a list of them, as a list of str."""
    if isinstance(path, (str, bytes, os.PathLike)):
        path = [path]
    out = [os.fsdecode(p) for p in path]
    if not out:
        raise ValueError('no path given')
    return out


def _scratch_run(op):
    """Runs one operator in a throw-away workspace and returns it."""
    ws = workspace.Workspace()
    ws.run(op)
    return ws


def _np_dtype(core_type):
    t = dtype_for_core_type(core_type)
    return object if t is str else t


def parquet_columns(path, columns=None, dtypes=None, is_list=None):
    """The columns a :class:`ParquetReader` of ``path`` would read, as
    ``[(name, numpy dtype, is_list)]``.  Reads only the files' footers;
    raises as the reader would (missing, corrupt or mistyped columns)."""
    kwargs = dict(paths=_paths(path))
    if columns:
        kwargs['columns'] = list(columns)
    if dtypes is not None:
        kwargs['dtypes'] = list(dtypes)
    if is_list is not None:
        kwargs['is_list'] = list(is_list)
    ws = _scratch_run(core.CreateOperator(
        'ParquetSchema', [], ['names', 'dtypes', 'is_list'], **kwargs))
    names = [n.decode('utf-8') for n in ws.blobs['names'].fetch().tolist()]
    types = ws.blobs['dtypes'].fetch().tolist()
    lists = ws.blobs['is_list'].fetch().tolist()
    return [(n, _np_dtype(t), bool(l)) for n, t, l in zip(names, types, lists)]


def _field_for(dtype, is_list):
    scalar = Scalar(str if dtype is object else dtype)
    return List(scalar) if is_list else scalar


def _schema_columns(field, prefix=()):
    """``[(column path, core dtype or None, is_list)]`` of a schema, in the
    order of its ``field_names()``."""
    if isinstance(field, List):
        items = field._items
        if not isinstance(items, Scalar) or items.field_type().shape:
            raise TypeError(
                "field '%s': only lists of plain scalars can be read from "
                'Parquet' % ':'.join(prefix))
        return [(prefix, _core_type(items), True)]
    if isinstance(field, Struct):
        out = []
        for name, child in field.get_children():
            out.extend(_schema_columns(child, prefix + (name,)))
        return out
    if isinstance(field, Scalar):
        if not prefix:
            raise TypeError('a ParquetReader schema must be a Struct')
        if field.field_type().shape:
            raise TypeError(
                "field '%s': Parquet columns hold one value per record, not "
                'a shape %s' % (':'.join(prefix), field.field_type().shape))
        return [(prefix, _core_type(field), False)]
    raise TypeError('cannot read a %s from Parquet' % type(field).__name__)


def _core_type(scalar):
    dtype = scalar.field_type()
    if dtype.base == np.void:
        return None
    return data_type_for_dtype(dtype)


class _FileReader(Reader):
    """What the file readers share: a reader blob made in the init net by
    ``Create<kind>Reader``, batches read by ``Read<kind>Batch``, rewound by
    ``Reset<kind>Reader`` (the Rust readers behind them share one batch
    source interface). Subclasses set ``_kind`` and ``_create_args()``."""

    _kind = None

    def _start(self, batch_size, name, prefix):
        if int(batch_size) < 1:
            raise ValueError('batch_size must be >= 1, got %r' % batch_size)
        self.batch_size = int(batch_size)
        self.name = name or '%s_%d' % (prefix, next(_names))
        self.reader_blob = None

    def _create_args(self):
        raise NotImplementedError

    def setup_ex(self, init_net, finish_net):
        if self.reader_blob is None:
            create = getattr(init_net, 'Create%sReader' % self._kind)
            self.reader_blob = create([], [self.name], **self._create_args())

    def read(self, read_net):
        assert self.reader_blob is not None, 'setup_ex not called'
        with core.NameScope(read_net.NextName(self.name)):
            fields = getattr(read_net, 'Read%sBatch' % self._kind)(
                [self.reader_blob], self.schema().field_names())
            fields = core.output_to_list(fields)
            return (read_net.IsEmpty([fields[0]]), fields)

    def reset(self, net):
        getattr(net, 'Reset%sReader' % self._kind)([self.reader_blob], [])


class ParquetReader(_FileReader):
    """Reads a Parquet file, a folder of them (every file under it, in name
    order, skipping names starting with ``.`` or ``_``) or a list of files
    and folders, ``batch_size`` records at a time.

    ``schema_or_columns``: ``None`` for every column; a list of column names
    (dotted paths; a list column by its name); or a ``schema.Struct`` whose
    fields name the columns and give their types (``Scalar`` for a
    primitive column, ``List(Scalar)`` for a list column), which the files
    must match.
    """

    def __init__(self, path, schema_or_columns=None,
                 batch_size=DEFAULT_BATCH_SIZE, name=None, validate=True):
        self._start(batch_size, name, 'parquet_reader')
        self.paths = _paths(path)
        if isinstance(schema_or_columns, Field):
            cols = _schema_columns(schema_or_columns)
            self.columns = ['.'.join(p) for p, _, _ in cols]
            known = all(t is not None for _, t, _ in cols)
            self._dtypes = [t for _, t, _ in cols] if known else None
            self._is_list = [int(l) for _, _, l in cols]
            if known:
                schema = schema_or_columns.clone_schema()
                if validate:
                    parquet_columns(self.paths, self.columns, self._dtypes,
                                    self._is_list)
            else:
                # Some types are unknown: take them from the files.
                found = parquet_columns(self.paths, self.columns,
                                        is_list=self._is_list)
                self._dtypes = [data_type_for_dtype(
                    str if t is object else t) for _, t, _ in found]
                schema = Struct(*[
                    (':'.join(p), _field_for(t, l))
                    for (p, _, _), (_, t, l) in zip(cols, found)])
        else:
            if isinstance(schema_or_columns, str):
                schema_or_columns = [schema_or_columns]
            found = parquet_columns(self.paths, schema_or_columns)
            schema = Struct(*[(n.replace('.', ':'), _field_for(t, l))
                              for n, t, l in found])
            # A Struct groups 'a:b' with a later 'a:c': read the columns in
            # the schema's order.
            by_field = {n.replace('.', ':'): (n, t, l) for n, t, l in found}
            ordered = [by_field[':'.join(p)]
                       for p, _, _ in _schema_columns(schema)]
            self.columns = [n for n, _, _ in ordered]
            self._dtypes = [data_type_for_dtype(str if t is object else t)
                            for _, t, _ in ordered]
            self._is_list = [int(l) for _, _, l in ordered]
        Reader.__init__(self, schema)

    _kind = 'Parquet'

    def _create_args(self):
        return dict(paths=self.paths, columns=self.columns,
                    batch_size=self.batch_size, dtypes=self._dtypes,
                    is_list=self._is_list)


def _npy_header(path):
    with open_regular(path) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    return shape, dtype


class NpyReader(_FileReader):
    """Reads ``.npy`` files as the columns of one dataset: row ``i`` of each
    file is record ``i``, ``batch_size`` records at a time.

    ``paths_by_field``: a dict (or list of pairs) field name -> path; the
    field's type is the array's dtype and its per-record shape the array's
    shape without the first dimension.  A list of paths names each field by
    its file name without ``.npy``.
    """

    def __init__(self, paths_by_field, batch_size=DEFAULT_BATCH_SIZE,
                 name=None, validate=True):
        self._start(batch_size, name, 'npy_reader')
        if isinstance(paths_by_field, (str, bytes, os.PathLike)):
            paths_by_field = [paths_by_field]
        if isinstance(paths_by_field, dict):
            pairs = list(paths_by_field.items())
        else:
            pairs = []
            for item in paths_by_field:
                if isinstance(item, (tuple, list)):
                    pairs.append((item[0], os.fsdecode(item[1])))
                else:
                    p = os.fsdecode(item)
                    stem = os.path.basename(p)
                    if stem.endswith('.npy'):
                        stem = stem[:-4]
                    pairs.append((stem, p))
        if not pairs:
            raise ValueError('an NpyReader needs at least one file')
        pairs = [(n, os.fsdecode(p)) for n, p in pairs]
        if validate:
            # The Rust reader's checks (header, size, rows, dtypes), now.
            _scratch_run(core.CreateOperator(
                'CreateNpyReader', [], ['r'], paths=[p for _, p in pairs],
                batch_size=self.batch_size))
        fields = []
        for field, path in pairs:
            shape, dtype = _npy_header(path)
            base = str if dtype.kind in 'SU' else dtype.type
            inner = tuple(shape[1:])
            fields.append((field, Scalar((base, inner) if inner else base)))
        schema = Struct(*fields)
        by_field = dict(pairs)
        self.paths = [by_field[n] for n in schema.field_names()]
        Reader.__init__(self, schema)

    _kind = 'Npy'

    def _create_args(self):
        return dict(paths=self.paths, batch_size=self.batch_size)


class ParquetWriter(Writer):
    """Writes the records it is given to a new Parquet file at ``path``.

    Each schema field becomes a column (``a:b`` a column ``b`` in a group
    ``a``); a ``List`` of scalars becomes a Parquet LIST column.  Records
    are buffered into row groups of about ``row_group_size``; the file is
    written next to ``path`` and moved there, complete, when the writer is
    committed (the ``finish_net`` of ``setup_ex``, i.e. when a pipe's Task
    ends).  String tensors are written as UTF-8 strings (checked), or as
    raw bytes with ``binary=True``.  Thread safe: ``pipe(..., num_threads=N)``
    appends each batch whole.

    ``schema``: the record's schema, if known now; otherwise the first
    record written fixes it (``write_record`` / a pipe).
    """

    def __init__(self, path, schema=None, compression='snappy',
                 row_group_size=131072, binary=False, name=None):
        self.path = os.fsdecode(path)
        self._schema = schema
        self.compression = compression
        self.row_group_size = int(row_group_size)
        self.binary = bool(binary)
        self.name = name or 'parquet_writer_%d' % next(_names)
        self.writer_blob = None

    def _declared(self):
        """(fields, dtypes) of the schema, or None if a type is unknown."""
        if self._schema is None:
            return None
        names = self._schema.field_names()
        types = []
        for t in self._schema.field_types():
            if t.base == np.void:
                return None
            types.append(data_type_for_dtype(t))
        return names, types

    def setup_ex(self, init_net, finish_net):
        if self.writer_blob is None:
            kwargs = dict(path=self.path, compression=self.compression,
                          row_group_size=self.row_group_size,
                          binary=int(self.binary))
            declared = self._declared()
            if declared is not None:
                kwargs.update(fields=declared[0], dtypes=declared[1])
            self.writer_blob = init_net.CreateParquetWriter(
                [], [self.name], **kwargs)
            self.commit(finish_net)

    def write_ex(self, fields, local_init_net, local_finish_net, stop_blob):
        declared = self._declared()
        if declared is not None:
            # Fixes the columns before any record arrives, so an empty input
            # still makes a file with the schema.
            local_init_net.SetParquetWriterSchema(
                [self.writer_blob], [], fields=declared[0],
                dtypes=declared[1])
        write_net = core.Net('parquet_write')
        self.write(write_net, fields)
        return [write_net]

    def write(self, writer_net, fields):
        assert self.writer_blob is not None, 'setup_ex not called'
        assert self._schema is not None, (
            'ParquetWriter needs a schema: give one or write records')
        names = self._schema.field_names()
        assert len(names) == len(fields), (
            'Expected %d fields, got %d.' % (len(names), len(fields)))
        writer_net.WriteParquetBatch([self.writer_blob] + list(fields), [],
                                     fields=names)

    def commit(self, finish_net):
        finish_net.CloseParquetWriter([self.writer_blob], [])
