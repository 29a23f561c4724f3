"""Key-value dbs (Caffe2's ``C.create_db``, ``C.Mode``): the records of a
db, written through transactions and read through cursors, as Caffe2's
Python binding exposed its C++ ``DB`` classes. Every type of
``registered_dbs()`` opens, through the core's formats (minidb, LevelDB and
ferro are known in Rust only): read whole when opened and written whole,
crash-safely, when the db is closed. A
LevelDB keeps its keys sorted (a cursor walks them in that order, ``seek``
finds the first key at or after the one given; a key put twice keeps its
last value); a ``ferro`` db holds blobs, so its records are those a minidb
of the same blobs would hold (a serialized ``BlobProto`` per blob, keyed by
its name) and only such records can be written to it.

A record is a key and a value, both bytes: a serialised ``BlobProto`` in
the dbs ``Save`` writes, a serialised ``TensorProtos`` in the data dbs
Caffe2's tools made (``utils.Caffe2TensorToNumpyArray`` converts each of
its tensors).

Differences from Caffe2: a db opened for writing is written when it is
closed (``close()``, or when the db object is dropped), to a temporary file
renamed over its path, so a reader never sees half a db (its records are
held in memory until then); reading checks every length against the file
and raises ``CorruptCheckpointError`` naming the file; paths that are not
regular files (a FIFO) are refused at once.
"""

from __future__ import annotations

import enum
import os
import stat

from . import _core
from .errors import FerrocaffeIOError, InvalidArgumentError, io_error

__all__ = ["Mode", "DB", "Cursor", "Transaction", "create_db", "open_regular"]

class Mode(enum.IntEnum):
    """How a db is opened (Caffe2's ``db::Mode``)."""
    read = 0
    write = 1
    new = 2


def open_regular(path):
    """Opens ``path`` for binary reading if it is a regular file; anything
    else (a FIFO, whose open would wait for a writer where Ctrl-C cannot
    reach it, a device, a directory) raises ``FerrocaffeIOError`` (an
    ``OSError``) at once. The type is checked on the open file, so nothing
    can be swapped in between. A file that cannot be opened raises
    ``FerrocaffeIOError`` naming it (``MissingFileError``, also a
    ``FileNotFoundError``, when it does not exist)."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0)
                     | getattr(os, 'O_NOCTTY', 0))
    except OSError as e:
        raise io_error(e, path) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ('a FIFO' if stat.S_ISFIFO(mode) else
                    'a directory' if stat.S_ISDIR(mode) else
                    'a socket' if stat.S_ISSOCK(mode) else 'a device')
            raise FerrocaffeIOError(
                '%s: not a regular file (%s)' % (path, kind), file=path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, 'rb')
    except BaseException:
        os.close(fd)
        raise


def _bytes(x, what):
    if isinstance(x, str):
        return x.encode("utf-8")
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    raise TypeError(f"a db {what} must be bytes or str, not {type(x).__name__}")


class Cursor:
    """Walks the records of a db opened for reading, in the db's order (a
    LevelDB's keys are sorted, so ``seek`` finds the first key at or after
    the one given; in other formats the first record with that key). Keys
    are known when the db is opened; a value is read when asked (from the
    file, for a minidb: a db larger than memory can be walked)."""

    def __init__(self, db: "DB"):
        self._db = db
        self._records = db._cursor
        self._sorted = db._type.lower() == "leveldb"
        self._at = 0

    def seek_to_first(self) -> None:
        self._at = 0

    def seek(self, key) -> None:
        key = _bytes(key, "key")
        records = self._records
        n = len(records)
        if self._sorted:
            lo, hi = 0, n
            while lo < hi:
                mid = (lo + hi) // 2
                if records.key(mid) < key:
                    lo = mid + 1
                else:
                    hi = mid
            self._at = lo
            return
        self._at = next((i for i in range(n) if records.key(i) == key), n)

    def _check(self):
        if self._at >= len(self._records):
            raise InvalidArgumentError(f"{self._db._path}: the cursor is past the last record")

    def next(self) -> None:
        self._check()
        self._at += 1

    def valid(self) -> bool:
        return self._at < len(self._records)

    def key(self) -> bytes:
        self._check()
        return self._records.key(self._at)

    def value(self) -> bytes:
        self._check()
        return self._records.value(self._at)


class Transaction:
    """Adds records to a db opened for writing."""

    def __init__(self, db: "DB"):
        self._db = db

    def put(self, key, value) -> None:
        self._db._put(_bytes(key, "key"), _bytes(value, "value"))

    def commit(self) -> None:
        self._db._check_writable()


class DB:
    """A db opened for reading or writing (``create_db``). Read, it walks
    the db through a cursor of the core (keys indexed when opened, values
    read when asked); written, its records are written whole,
    crash-safely, when it is closed: the formats themselves are the core's (storage::read_kv,
    storage::write_kv), known in Rust only."""

    def __init__(self, db_type: str, source, mode: Mode):
        if db_type not in _core.registered_dbs():
            raise InvalidArgumentError(
                f"unknown key-value db type {db_type!r} (supported: "
                + ", ".join(repr(n) for n in _core.registered_dbs()) + ")")
        self._type = db_type
        self._path = os.fspath(source)
        self._mode = Mode(mode)
        self._open = self._mode != Mode.read
        if self._mode == Mode.read:
            self._cursor = _core.open_kv_cursor(self._path, db_type)
            self._records = []
        elif self._mode == Mode.write and _core.db_exists(self._path, db_type):
            # Mode.write adds to an existing db, as Caffe2's did; Mode.new
            # starts over.
            self._records = [(bytes(k), bytes(v)) for k, v in _core.read_kv_db(self._path, db_type)]
        else:
            self._records = []

    def _check_writable(self) -> None:
        if self._mode == Mode.read:
            raise InvalidArgumentError(
                f"{self._path}: the db is open for reading, not writing")
        if not self._open:
            raise InvalidArgumentError(f"{self._path}: the db is closed")

    def _put(self, key: bytes, value: bytes) -> None:
        self._check_writable()
        self._records.append((key, value))

    def new_cursor(self) -> Cursor:
        if self._mode != Mode.read:
            raise InvalidArgumentError(f"{self._path}: the db is open for writing, not reading")
        return Cursor(self)

    def new_transaction(self) -> Transaction:
        self._check_writable()
        return Transaction(self)

    def close(self) -> None:
        """Closes the db; one open for writing is written now, under its
        final name."""
        if self._open:
            self._open = False
            records, self._records = self._records, []
            _core.write_kv_db(self._path, self._type, records)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def create_db(db_type: str, source, mode) -> DB:
    """Opens the db of type ``db_type`` (any of ``registered_dbs()``) at
    ``source``: ``Mode.read`` reads it, ``Mode.write`` adds to it (or
    starts it), ``Mode.new`` starts it empty."""
    return DB(db_type, source, mode)
