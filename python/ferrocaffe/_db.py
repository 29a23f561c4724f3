"""Key-value dbs from Python: what Caffe2 exposed as ``workspace.C.create_db``
(``core.C.create_db``), ``C.Mode``, and the ``DB``, ``Transaction`` and
``Cursor`` classes, for the ``minidb`` format, the one ``CreateDB`` and
``TensorProtosDBInput`` read.

Caffe2's tutorials wrote their data this way::

    db = core.C.create_db("minidb", path, core.C.Mode.write)
    transaction = db.new_transaction()
    for i, (x, y) in enumerate(zip(features, labels)):
        record = caffe2_pb2.TensorProtos()
        record.protos.extend([utils.NumpyArrayToCaffe2Tensor(x),
                              utils.NumpyArrayToCaffe2Tensor(y)])
        transaction.put("train_%04d" % i, record.SerializeToString())
    del transaction
    del db

A minidb is a sequence of records (int32 key length, int32 value length,
in the machine's byte order, then the key and the value). As in Caffe2,
``Mode.new`` starts an empty db, ``Mode.write`` appends to an existing one
and ``Mode.read`` only reads. Unlike Caffe2, which wrote each record to
the file as it was put, the file is replaced atomically on every
``commit()`` (a temporary file, fsynced, then renamed): a db that exists
holds whole records only, never a half-written one. A transaction commits
when it is deleted, and a db when it is closed (or deleted).
"""

import os
import struct
import weakref

from ferrocaffe import _core
from ferrocaffe.errors import (
    CorruptCheckpointError, FerrocaffeIOError, InvalidArgumentError)

__all__ = ["Cursor", "DB", "Mode", "Transaction", "create_db",
           "registered_dbs"]

_HEAD = struct.Struct("=ii")


class Mode(object):
    """How a db is opened (Caffe2's ``db::Mode``)."""

    read = 0
    write = 1
    new = 2


def registered_dbs():
    """The db types Save/Load take (``ferro`` is ferrocaffe's checkpoint
    format; ``minidb`` is Caffe2's, and the only key-value db here)."""
    return ["ferro", "minidb"]


def _bytes(value, what):
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise InvalidArgumentError(
        "a db record's %s must be bytes or str, got %s"
        % (what, type(value).__name__))


def _read_records(path):
    """``[(key, value)]`` of a minidb file."""
    with open(path, "rb") as f:
        data = f.read()
    records, at = [], 0
    while at < len(data):
        if len(data) - at < _HEAD.size:
            raise CorruptCheckpointError(
                "%s: the db is truncated: record #%d at byte %d is cut off"
                % (path, len(records), at), file=path)
        kl, vl = _HEAD.unpack_from(data, at)
        end = at + _HEAD.size + kl + vl
        if kl < 0 or vl < 0 or end > len(data):
            raise CorruptCheckpointError(
                "%s: record #%d at byte %d is cut off or damaged (not a "
                "minidb?)" % (path, len(records), at), file=path)
        key = data[at + _HEAD.size:at + _HEAD.size + kl]
        records.append((key, data[at + _HEAD.size + kl:end]))
        at = end
    return records


class DB(object):
    """An open minidb (made by :func:`create_db`)."""

    def __init__(self, db_type, source, mode):
        if db_type != "minidb":
            raise InvalidArgumentError(
                "cannot open a db of type '%s': the key-value db here is "
                "'minidb' (Caffe2's leveldb and lmdb are not available)"
                % db_type)
        if mode not in (Mode.read, Mode.write, Mode.new):
            raise InvalidArgumentError("unknown db mode %r" % (mode,))
        self.source = os.fspath(source)
        self.mode = mode
        self._closed = False
        self._transactions = weakref.WeakSet()
        self._records = []
        if mode == Mode.read or mode == Mode.write:
            if mode == Mode.read or os.path.exists(self.source):
                try:
                    self._records = _read_records(self.source)
                except OSError as e:
                    raise FerrocaffeIOError(
                        "%s: cannot open the db: %s"
                        % (self.source, e.strerror or e),
                        file=self.source) from e
        self._committed = len(self._records)
        if mode == Mode.new:
            self._write()  # an empty db, as Caffe2's minidb creates

    def _check_open(self):
        if self._closed:
            raise InvalidArgumentError("the db %s is closed" % self.source)

    def new_transaction(self):
        self._check_open()
        if self.mode == Mode.read:
            raise InvalidArgumentError(
                "the db %s is open for reading: open it with Mode.write "
                "or Mode.new to add records" % self.source)
        transaction = Transaction(self)
        self._transactions.add(transaction)
        return transaction

    def new_cursor(self):
        self._check_open()
        return Cursor(list(self._records[:self._committed]))

    def _add(self, pending):
        self._check_open()
        self._records.extend(pending)
        self._committed = len(self._records)
        self._write()

    def _write(self):
        parts = []
        for key, value in self._records:
            parts.append(_HEAD.pack(len(key), len(value)))
            parts.append(key)
            parts.append(value)
        _core.write_file_atomically(self.source, b"".join(parts))

    def close(self):
        """Commits what its transactions hold, then closes the db."""
        if not self._closed:
            for transaction in list(self._transactions):
                transaction.commit()
        self._closed = True

    def __del__(self):
        try:
            self.close()
        except Exception:  # never raise from a destructor
            pass


class Transaction(object):
    """Records put into a db, written on ``commit()`` (or when the
    transaction is deleted)."""

    def __init__(self, db):
        self._db = db
        self._pending = []

    def put(self, key, value):
        self._pending.append((_bytes(key, "key"), _bytes(value, "value")))

    def commit(self):
        if self._pending:
            pending, self._pending = self._pending, []
            self._db._add(pending)

    def __del__(self):
        if getattr(self, "_pending", None) and not self._db._closed:
            try:
                self.commit()
            except Exception:  # never raise from a destructor
                pass


class Cursor(object):
    """Walks a db's records in order (Caffe2's ``db::Cursor``)."""

    def __init__(self, records):
        self._records = records
        self._at = 0

    def supports_seek(self):
        return False

    def seek_to_first(self):
        self._at = 0

    def next(self):
        self._at += 1

    def valid(self):
        return self._at < len(self._records)

    def key(self):
        return self._records[self._at][0]

    def value(self):
        return self._records[self._at][1]


def create_db(db_type, source, mode):
    """Opens (or, with ``Mode.new``, creates) the db at ``source``."""
    return DB(db_type, source, mode)
