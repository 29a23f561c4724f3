"""Memory-mapped loading of ferro dbs (:func:`mmap_db`, a ferrocaffe
addition): read-only numpy views of the checked bytes, nothing copied."""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from ferrocaffe import _core
from ferrocaffe.checkpoint.state import INTERNAL_PREFIX
from ferrocaffe.errors import DataTypeError, FerrocaffeIOError
from ferrocaffe.file_reader import open_regular


# numpy dtypes of the tensors that can be mapped: the ferro format stores
# their elements little-endian (bool: one byte, 0 or 1).
_MAPPED_DTYPES = {
    name: np.dtype(name).newbyteorder('<')
    for name in ('float32', 'float64', 'int32', 'int64', 'uint8', 'int8',
                 'int16', 'uint16', 'float16')
}
_MAPPED_DTYPES['bool'] = np.dtype(np.bool_)


def _advise_random(memory):
    """Prepares a cold map for reading just the header, trailer and index.

    A page fault in a mapped file normally reads the kernel's read-around
    window (``read_ahead_kb``, 8 MiB on some disks) around the page, so
    checking three small pieces would read MiBs from disk.  MADV_RANDOM
    makes each fault read its page alone, and MADV_WILLNEED starts reading
    the index range (where the trailer says it is; a wrong value only wastes
    the hint).  The caller restores MADV_NORMAL for the user's accesses.
    Returns False where madvise is not available.
    """
    if not hasattr(mmap, 'MADV_RANDOM') or not hasattr(memory, 'madvise'):
        return False
    memory.madvise(mmap.MADV_RANDOM)
    size = len(memory)
    if size >= 48 and hasattr(mmap, 'MADV_WILLNEED'):
        index_at = int.from_bytes(memory[size - 48:size - 40], 'little')
        if index_at < size:
            start = index_at - index_at % mmap.PAGESIZE
            memory.madvise(mmap.MADV_WILLNEED, start, size - start)
    return True


def mmap_db(
    path: str | os.PathLike[str],
    verify: bool = False,
    skip_objects: bool = False,
) -> dict[str, Any]:
    """Opens a ``'ferro'`` db (the default format of Save and of checkpoints)
    memory-mapped: ``{blob name: read-only numpy array}``, in the order the
    blobs are stored.  A ferrocaffe addition (Caffe2 had no such call).

    Numeric and bool tensors are *views of the mapped file*: nothing is
    copied, and a page is read from disk (or the page cache) only when it is
    first touched, so opening takes about as long as reading the index,
    however large the tensors.  The arrays are read-only (``writeable`` is
    False and cannot be set); copy one (``a.copy()``) to modify it.  The file
    stays mapped while any returned array is alive.  Deleting the file or
    replacing it (as every ferrocaffe save does: write a temporary, rename it
    over the old file) leaves the mapping intact; modifying or truncating the
    file *in place* while it is mapped changes the arrays or crashes the
    process on access, as with any memory map.

    Always checked: the header, the trailer and the index, with their CRCs,
    and that every blob's offset and size lie inside the file and fit its
    dtype and shape.  A truncated or damaged file raises
    ``errors.CorruptCheckpointError`` naming the file (and the blob when the
    damage is in one).  The tensor data themselves are *not* read, so a
    flipped bit inside them goes unnoticed unless ``verify=True``, which also
    checks every blob's CRC-32, the padding between blobs and that bool
    tensors hold only 0 and 1; that reads the whole file (and brings it into
    the page cache), so it takes as long as a full load.

    The job state a checkpoint db holds (a reserved entry named under
    ``'!!ferrocaffe/'``) is left out: :func:`read_job_state` reads it.

    Blobs that have no fixed-size element layout cannot be mapped:

    * string tensors are decoded into object arrays of ``bytes`` and byte
      strings into ``bytes``, as ``FetchBlob`` returns them: copies (their
      CRCs are always checked);
    * runtime objects (counters, mutexes, dataset cursors, reader positions)
      raise ``errors.DataTypeError`` naming the blob, unless
      ``skip_objects=True``, which leaves them out of the result.  Restore
      them with a Load op.

    A Caffe2 ``minidb`` raises ``errors.InvalidArgumentError`` (a
    ``ValueError``): only the ferro format lays tensors out so that they can
    be mapped; read a minidb with a Load op, or save it again as ferro.  A
    file that cannot be opened raises ``errors.FerrocaffeIOError`` (an
    ``OSError``).

        params = mmap_db('/ckpts/trainer_0.0010', skip_objects=True)
        w = params['fc_w']          # np.ndarray, read-only, no copy made
    """
    path = os.fspath(path)
    try:
        f = open_regular(path)
    except OSError as e:
        raise FerrocaffeIOError('%s: %s' % (path, e.strerror or e),
                                file=path) from e
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            memory = None  # mmap refuses empty files; _core says "empty"
            data = np.empty(0, np.uint8)
        else:
            memory = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            data = np.frombuffer(memory, np.uint8)
    # Checks the header, trailer and index in the mapped bytes themselves, so
    # the arrays below view exactly what was checked.
    quick = memory is not None and not verify and _advise_random(memory)
    try:
        blobs = _core.map_ferro(data, path, verify)
    finally:
        if quick and memory is not None:
            memory.madvise(mmap.MADV_NORMAL)
    out = {}
    for name, kind, info in blobs:
        if name.startswith(INTERNAL_PREFIX):
            continue  # the job state of a checkpoint: see read_job_state
        if kind == 'mapped':
            dtype, shape, offset = info
            out[name] = np.ndarray(shape, _MAPPED_DTYPES[dtype], memory,
                                   offset)
        elif kind == 'value':
            if isinstance(info, np.ndarray):
                info.flags.writeable = False
            out[name] = info
        elif not skip_objects:
            raise DataTypeError(
                "blob '%s' of %s holds a runtime object (Caffe2 type '%s'), "
                "which cannot be memory-mapped: pass skip_objects=True to "
                "leave objects out, or restore it with a Load op"
                % (name, path, info), blob=name, file=path)
    return out
