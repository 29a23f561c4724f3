"""Key-value dbs (Caffe2's ``C.create_db``, ``C.Mode``): the records of a
db, written through transactions and read through cursors, as Caffe2's
Python binding exposed its C++ ``DB`` classes. Every type of
``registered_dbs()`` opens: ``minidb`` here in Python, the others
(``leveldb``/``LevelDB``, ``ferro``) through the core's formats, read whole
when opened and written whole, crash-safely, when the db is closed. A
LevelDB keeps its keys sorted (a cursor walks them in that order, ``seek``
finds the first key at or after the one given; a key put twice keeps its
last value); a ``ferro`` db holds blobs, so its records are those a minidb
of the same blobs would hold (a serialized ``BlobProto`` per blob, keyed by
its name) and only such records can be written to it.

A record is a key and a value, both bytes: a serialised ``BlobProto`` in
the dbs ``Save`` writes, a serialised ``TensorProtos`` in the data dbs
Caffe2's tools made (``utils.Caffe2TensorToNumpyArray`` converts each of
its tensors). The minidb layout is Caffe2's: per record a native-endian
int32 key length, an int32 value length, the key, the value.

Differences from Caffe2: a db opened for writing is written to a temporary
file beside its path and renamed over it when closed (``close()``, or when
the db object is dropped), so a reader never sees half a db; reading checks
every length against the file and raises ``CorruptCheckpointError`` naming
the file; paths that are not regular files (a FIFO) are refused at once.
"""

from __future__ import annotations

import bisect
import enum
import os
import shutil
import stat
import struct
import tempfile

from . import _core
from .errors import CorruptCheckpointError, FerrocaffeIOError, InvalidArgumentError, io_error

__all__ = ["Mode", "DB", "Cursor", "Transaction", "create_db", "open_regular"]

_HEADER = struct.Struct("=ii")


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
    """Walks the records of a db opened for reading, in file order."""

    def __init__(self, db: "DB"):
        self._db = db
        self._at = 0
        self._record = None
        self.seek_to_first()

    def _read(self) -> None:
        data, path = self._db._data, self._db._path
        if self._at >= len(data):
            self._record = None
            return
        if self._at + _HEADER.size > len(data):
            raise CorruptCheckpointError(
                f"{path}: the minidb ends inside a record header at byte {self._at}", file=path)
        klen, vlen = _HEADER.unpack_from(data, self._at)
        start = self._at + _HEADER.size
        if klen < 0 or vlen < 0 or start + klen + vlen > len(data):
            raise CorruptCheckpointError(
                f"{path}: the minidb record at byte {self._at} is truncated or has negative lengths",
                file=path)
        key = data[start:start + klen]
        value = data[start + klen:start + klen + vlen]
        self._record = (key, value, start + klen + vlen)

    def seek_to_first(self) -> None:
        self._at = 0
        self._read()

    def seek(self, key) -> None:
        """Moves to the first record whose key is ``key`` or later (minidb
        is not sorted: the first record from the start with that key, else
        past the end)."""
        key = _bytes(key, "key")
        self.seek_to_first()
        while self.valid() and self.key() != key:
            self.next()

    def next(self) -> None:
        if self._record is None:
            raise InvalidArgumentError(f"{self._db._path}: the cursor is past the last record")
        self._at = self._record[2]
        self._read()

    def valid(self) -> bool:
        return self._record is not None

    def key(self) -> bytes:
        if self._record is None:
            raise InvalidArgumentError(f"{self._db._path}: the cursor is past the last record")
        return self._record[0]

    def value(self) -> bytes:
        if self._record is None:
            raise InvalidArgumentError(f"{self._db._path}: the cursor is past the last record")
        return self._record[1]


class _RecordsCursor(Cursor):
    """A cursor over records read whole from a core format (``_records``);
    ``sorted_keys``: the format keeps its keys sorted (LevelDB), so ``seek``
    finds the first key at or after the one given."""

    def __init__(self, db: "DB", sorted_keys: bool):
        self._sorted = sorted_keys
        super().__init__(db)

    def _read(self) -> None:
        records = self._db._records
        self._record = (*records[self._at], self._at + 1) if self._at < len(records) else None

    def seek(self, key) -> None:
        key = _bytes(key, "key")
        if not self._sorted:
            Cursor.seek(self, key)
            return
        self._at = bisect.bisect_left([k for k, _ in self._db._records], key)
        self._read()


class Transaction:
    """Adds records to a db opened for writing."""

    def __init__(self, db: "DB"):
        self._db = db

    def put(self, key, value) -> None:
        self._db._put(_bytes(key, "key"), _bytes(value, "value"))

    def commit(self) -> None:
        self._db._flush()


class DB:
    """A db opened for reading or writing (``create_db``)."""

    def __init__(self, db_type: str, source, mode: Mode):
        if db_type not in _core.registered_dbs():
            raise InvalidArgumentError(
                f"unknown key-value db type {db_type!r} (supported: "
                + ", ".join(repr(n) for n in _core.registered_dbs()) + ")")
        self._type = db_type
        self._path = os.fspath(source)
        self._mode = Mode(mode)
        self._file = None
        self._tmp = None
        # A db of a core format (not minidb): its records, read whole for
        # reading, or gathered until close for writing (``_open`` while
        # not yet written).
        self._records: list[tuple[bytes, bytes]] | None = None
        self._open = False
        if db_type != "minidb":
            if self._mode == Mode.read:
                self._records = [(bytes(k), bytes(v))
                                 for k, v in _core.read_kv_db(self._path, db_type)]
                return
            # Mode.write adds to an existing db, as Caffe2's did; Mode.new
            # starts over.
            self._records = []
            if self._mode == Mode.write and _core.db_exists(self._path, db_type):
                self._records = list(_core.read_kv_db(self._path, db_type))
            self._open = True
            return
        if self._mode == Mode.read:
            with open_regular(self._path) as f:
                self._data = f.read()
        else:
            folder = os.path.dirname(os.path.abspath(self._path))
            fd, self._tmp = tempfile.mkstemp(
                prefix="." + os.path.basename(self._path) + ".tmp-ferrocaffe-", dir=folder)
            self._file = os.fdopen(fd, "wb")
            if self._mode == Mode.write and os.path.exists(self._path):
                # Mode.write appends to an existing db, as Caffe2's minidb
                # did (Mode.new starts over); the records written so far are
                # copied into the new file, which replaces the old at close.
                with open_regular(self._path) as old:
                    shutil.copyfileobj(old, self._file)

    def _check_writable(self) -> None:
        if self._mode == Mode.read:
            raise InvalidArgumentError(
                f"{self._path}: the db is open for reading, not writing")
        if self._file is None and not self._open:
            raise InvalidArgumentError(f"{self._path}: the db is closed")

    def _put(self, key: bytes, value: bytes) -> None:
        self._check_writable()
        if self._file is None:
            assert self._records is not None
            self._records.append((key, value))
            return
        self._file.write(_HEADER.pack(len(key), len(value)))
        self._file.write(key)
        self._file.write(value)

    def _flush(self) -> None:
        self._check_writable()
        if self._file is not None:
            self._file.flush()

    def new_cursor(self) -> Cursor:
        if self._mode != Mode.read:
            raise InvalidArgumentError(f"{self._path}: the db is open for writing, not reading")
        if self._records is not None:
            return _RecordsCursor(self, sorted_keys=self._type.lower() == "leveldb")
        return Cursor(self)

    def new_transaction(self) -> Transaction:
        self._check_writable()
        return Transaction(self)

    def close(self) -> None:
        """Closes the db; one open for writing gets its final name now."""
        if self._open:
            self._open = False
            records, self._records = self._records or [], None
            _core.write_kv_db(self._path, self._type, records)
            return
        f, self._file = self._file, None
        if f is None:
            return
        try:
            f.flush()
            os.fsync(f.fileno())
        finally:
            f.close()
        os.replace(self._tmp, self._path)

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
