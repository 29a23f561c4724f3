"""Memory-mapped loading of ferro dbs (ferrocaffe.checkpoint.mmap_db).

Every expected value here is the numpy array that was fed and saved, so the
check does not go through ferrocaffe's own Load.
"""

import gc
import mmap
import os
import pathlib
import struct

import numpy as np
import pytest

from ferrocaffe import _core, core, workspace
from ferrocaffe.checkpoint import mmap_db
from ferrocaffe.errors import (
    CorruptCheckpointError,
    DataTypeError,
    FerrocaffeIOError,
    InvalidArgumentError,
)

MAPPABLE = ['float32', 'float64', 'int32', 'int64', 'uint8', 'int8', 'int16',
            'uint16', 'bool']


def save(path, blobs, db_type='ferro', objects=()):
    """Feeds ``blobs`` (name -> array/bytes) into a new workspace, creates a
    counter for each name in ``objects`` and saves them all, in that order."""
    ws = workspace.Workspace()
    for name, value in blobs.items():
        ws.feed_blob(name, value)
    for name in objects:
        ws.run(core.CreateOperator('CreateCounter', [], [name], init_count=5))
    names = list(blobs) + list(objects)
    ws.run(core.CreateOperator('Save', names, [], db=str(path),
                               db_type=db_type, absolute_path=True))
    return names


def random_array(rng, dtype, shape):
    if dtype == 'bool':
        return rng.random(shape) < 0.5
    if dtype.startswith('float'):
        return (rng.standard_normal(shape) * 1e3).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype,
                        endpoint=True)


def every_dtype():
    rng = np.random.default_rng(5)
    blobs = {}
    for dtype in MAPPABLE:
        blobs[dtype] = random_array(rng, dtype, (7, 5, 3))
        blobs[dtype + '_scalar'] = random_array(rng, dtype, ())
        blobs[dtype + '_empty'] = np.zeros((0,), dtype)
        blobs[dtype + '_empty_2d'] = np.zeros((4, 0), dtype)
    # Extremes and bit patterns that must survive unchanged.
    blobs['floats_special'] = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, np.finfo(np.float32).tiny,
         np.finfo(np.float32).max], np.float32)
    blobs['int64_extremes'] = np.array([np.iinfo(np.int64).min, -1, 0,
                                        np.iinfo(np.int64).max], np.int64)
    # A non-contiguous source array is saved in row-major order.
    blobs['transposed'] = np.arange(12, dtype=np.float64).reshape(3, 4).T
    return blobs


def mapped_base(a):
    """The object at the end of an array's .base chain."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


@pytest.fixture
def tmp(tmp_path):
    return tmp_path


def test_values_equal_what_was_saved_for_every_dtype(tmp):
    path = tmp / 'all.ferro'
    blobs = every_dtype()
    names = save(path, blobs)
    got = mmap_db(path)
    assert list(got) == names  # ordered as stored
    for name, want in blobs.items():
        a = got[name]
        assert isinstance(a, np.ndarray), name
        assert a.dtype == want.dtype and a.shape == want.shape, name
        # Bit for bit (-0.0, NaN), element by element in row-major order.
        assert a.tobytes() == np.ascontiguousarray(want).tobytes(), name
        assert isinstance(mapped_base(a), mmap.mmap), name
        assert a.ctypes.data % 64 == 0, name
    assert got['float32_scalar'].ndim == 0
    assert got['int16_empty_2d'].shape == (4, 0)
    # verify=True gives the same arrays.
    again = mmap_db(path, verify=True)
    for name, want in blobs.items():
        assert again[name].tobytes() == np.ascontiguousarray(want).tobytes()


def test_arrays_are_read_only_views(tmp):
    path = tmp / 'db'
    save(path, {'w': np.arange(10, dtype=np.float32),
                's': np.array([b'a', b'bc'], dtype=object)})
    got = mmap_db(path)
    for a in got.values():
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0] = a[1]
        with pytest.raises(ValueError):
            a.flags.writeable = True
    # Copies are writable, the mapping is not affected.
    c = got['w'].copy()
    c[0] = 42
    assert got['w'][0] == 0
    # The views keep the mapping alive on their own.
    w = got['w']
    del got
    gc.collect()
    assert w.tolist() == list(range(10))


def test_large_tensors_are_not_read_to_open(tmp):
    path = tmp / 'big'
    big = np.arange(1 << 22, dtype=np.float32).reshape(1024, 4096)
    save(path, {'a': big, 'b': big[::-1].copy()})
    got = mmap_db(path)
    assert got['a'].base is not None and got['b'].base is not None
    assert np.array_equal(got['b'][0], big[-1])
    assert got['a'][1023, 4095] == big[1023, 4095]


def test_strings_and_bytes_are_decoded_copies(tmp):
    path = tmp / 'db'
    strings = np.array([[b'x', b''], [b'\x00\xff', b'hello world']],
                       dtype=object)
    save(path, {'names': strings, 'raw': b'\x00bytes\xff', 'empty': b'',
                'scalar': np.array(b'one', dtype=object)})
    got = mmap_db(path)
    assert got['names'].dtype == object
    assert got['names'].tolist() == strings.tolist()
    assert got['raw'] == b'\x00bytes\xff' and got['empty'] == b''
    assert got['scalar'].shape == () and got['scalar'][()] == b'one'


def test_objects_raise_unless_skipped(tmp):
    path = tmp / 'db'
    save(path, {'w': np.ones(3, np.float32)}, objects=['counter'])
    with pytest.raises(DataTypeError) as e:
        mmap_db(path)
    assert isinstance(e.value, TypeError)
    assert e.value.blob == 'counter' and e.value.file == str(path)
    assert 'skip_objects=True' in str(e.value)
    got = mmap_db(path, skip_objects=True)
    assert list(got) == ['w'] and got['w'].tolist() == [1, 1, 1]


def index_offset(data):
    """The index offset stored in a ferro file's trailer (its last 48
    bytes: u64 index offset, u64 index length, ...)."""
    return struct.unpack_from('<Q', data, len(data) - 48)[0]


def damaged(path, tmp, edit, name='damaged'):
    data = bytearray(path.read_bytes())
    edit(data)
    out = tmp / name
    out.write_bytes(bytes(data))
    return out


@pytest.fixture
def good(tmp):
    path = tmp / 'good'
    save(path, {'w': np.arange(64, dtype=np.float32),
                'flags': np.array([True, False, True]),
                's': np.array([b'abc'], dtype=object)})
    return path


@pytest.mark.parametrize('verify', [False, True])
def test_truncated_files_are_corrupt(good, tmp, verify):
    size = good.stat().st_size
    for keep in (0, 7, 64, 200, size // 2, size - 48, size - 1):
        cut = damaged(good, tmp, lambda d: d.__delitem__(slice(keep, None)),
                      'cut%d' % keep)
        with pytest.raises(CorruptCheckpointError) as e:
            mmap_db(cut, verify=verify)
        assert e.value.file == str(cut), keep
        assert str(cut) in str(e.value)
    empty = tmp / 'cut0'
    with pytest.raises(CorruptCheckpointError, match='empty'):
        mmap_db(empty)


@pytest.mark.parametrize('verify', [False, True])
def test_flipped_byte_in_the_index_header_or_trailer(good, tmp, verify):
    def flip(at):
        def edit(d):
            d[at(d)] ^= 0x04
        return edit
    cases = {
        'index': (lambda d: index_offset(d) + 5, 'index'),
        'header': (lambda d: 9, 'header'),
        'trailer': (lambda d: len(d) - 20, 'trailer'),
    }
    for where, (at, word) in cases.items():
        bad = damaged(good, tmp, flip(at), where)
        with pytest.raises(CorruptCheckpointError, match=word) as e:
            mmap_db(bad, verify=verify)
        assert e.value.file == str(bad)


def test_flipped_byte_in_a_payload_is_caught_only_with_verify(good, tmp):
    # 'w' is the first blob: its payload starts right after the 64-byte
    # header; element 25 is at byte 64 + 100.
    bad = damaged(good, tmp, lambda d: d.__setitem__(164, d[164] ^ 0x80))
    quick = mmap_db(bad)  # the payload is not read: the damage shows
    want = np.arange(64, dtype=np.float32)
    assert quick['w'][25] != want[25]
    assert np.array_equal(np.delete(quick['w'], 25), np.delete(want, 25))
    with pytest.raises(CorruptCheckpointError, match='CRC mismatch') as e:
        mmap_db(bad, verify=True)
    assert e.value.blob == 'w' and e.value.file == str(bad)


def test_bool_bytes_other_than_0_and_1_fail_verify(good, tmp):
    data = good.read_bytes()
    at = data.index(b'\x01\x00\x01', 64 + 256)  # the 'flags' payload
    bad = damaged(good, tmp, lambda d: d.__setitem__(at, 2))
    with pytest.raises(CorruptCheckpointError) as e:
        mmap_db(bad, verify=True)
    assert e.value.blob == 'flags'


def test_decoded_blobs_are_always_checked(good, tmp):
    data = good.read_bytes()
    at = data.index(b'abc', 64)
    bad = damaged(good, tmp, lambda d: d.__setitem__(at, ord('x')))
    with pytest.raises(CorruptCheckpointError) as e:
        mmap_db(bad)
    assert e.value.blob == 's'


def test_minidb_needs_the_ferro_format(tmp):
    path = tmp / 'db.minidb'
    save(path, {'w': np.ones(3, np.float32)}, db_type='minidb')
    with pytest.raises(InvalidArgumentError) as e:
        mmap_db(path)
    assert isinstance(e.value, ValueError)
    assert 'minidb' in str(e.value) and "'ferro'" in str(e.value)
    assert e.value.file == str(path)


def test_foreign_file_is_corrupt(tmp):
    path = tmp / 'text'
    path.write_bytes(b'hello, this is not a db at all' * 10)
    with pytest.raises(CorruptCheckpointError):
        mmap_db(path)


def test_missing_file_and_directory(tmp):
    for path in (tmp / 'missing', tmp):
        with pytest.raises(FerrocaffeIOError) as e:
            mmap_db(path)
        assert isinstance(e.value, OSError)
        assert e.value.file == str(path)


def test_replacing_or_removing_the_file_keeps_the_mapping(tmp):
    path = tmp / 'db'
    save(path, {'w': np.full(1000, 1.0, np.float32)})
    old = mmap_db(str(path))['w']
    save(path, {'w': np.full(1000, 2.0, np.float32)})  # temp + rename
    assert old.tolist() == [1.0] * 1000
    assert mmap_db(pathlib.Path(path))['w'].tolist() == [2.0] * 1000
    os.unlink(path)
    assert old.sum() == 1000.0


def test_core_map_ferro_lists_offsets(good):
    data = np.fromfile(good, np.uint8)
    blobs = _core.map_ferro(data, str(good))
    assert [(n, k) for n, k, _ in blobs] == [
        ('w', 'mapped'), ('flags', 'mapped'), ('s', 'value')]
    assert blobs[0][2] == ('float32', [64], 64)
    assert blobs[1][2][:2] == ('bool', [3]) and blobs[1][2][2] % 64 == 0
    assert blobs[2][2].tolist() == [b'abc']
