"""Direct I/O for cold loads (issue 11 item 6): with
``FERROCAFFE_DIRECT_IO=1``, a ferro checkpoint that is not in the page cache
has its large numeric payloads read by the disk straight into the tensors
(``O_DIRECT``), while a warm one is copied from the page cache; unset (the
default) or ``0``, every read goes through the page cache. Whichever path a
Load takes, it returns the saved values and still detects damage. Expected
values are the numpy arrays saved."""

import os
import sys

import numpy as np
import pytest

from ferrocaffe import _core, core, errors, workspace

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith('linux'),
    reason='direct I/O and posix_fadvise eviction are Linux-only')

MIB = 1 << 20


def evict(path):
    """Writes the file's pages and drops them from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def direct_possible(path):
    """Whether this file system takes O_DIRECT reads at all."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    return True


def arrays():
    rng = np.random.default_rng(5)
    return {
        # 6 MiB + 4 bytes of float32 (its last page is read the ordinary
        # way), 2 MiB of int64, and small blobs around them.
        'big': rng.standard_normal(6 * MIB // 4 + 1).astype(np.float32),
        'small': np.arange(7, dtype=np.int32),
        'ids': rng.integers(-2**40, 2**40, size=(512, 512), dtype=np.int64),
        'flags': np.array([True, False, True]),
    }


def save(path, values):
    ws = workspace.Workspace()
    for k, v in values.items():
        ws.feed_blob(k, v)
    ws.run(core.CreateOperator('Save', list(values), [], db=path,
                               db_type='ferro', absolute_path=True))


def load(path, names):
    ws = workspace.Workspace()
    ws.run(core.CreateOperator('Load', [], names, db=path, db_type='ferro',
                               absolute_path=True))
    return {n: ws.fetch_blob(n) for n in names}


@pytest.fixture
def saved(tmp_path):
    values = arrays()
    path = str(tmp_path / 'ck.ferro')
    save(path, values)
    return path, values


def expected_direct_bytes(values):
    # The whole 4 KiB pages of each numeric payload of at least 1 MiB.
    return sum(v.nbytes // 4096 * 4096 for v in values.values()
               if v.nbytes >= MIB)


def test_a_cold_load_reads_large_payloads_directly(saved, monkeypatch):
    monkeypatch.setenv('FERROCAFFE_DIRECT_IO', '1')
    path, values = saved
    evict(path)
    before = _core.direct_io_bytes()
    got = load(path, list(values))
    for k, v in values.items():
        np.testing.assert_array_equal(got[k], v)
        assert got[k].dtype == v.dtype
    read = _core.direct_io_bytes() - before
    if direct_possible(path):
        assert read == expected_direct_bytes(values)
    else:
        assert read == 0


def test_a_warm_load_copies_from_the_page_cache(saved, monkeypatch):
    monkeypatch.setenv('FERROCAFFE_DIRECT_IO', '1')
    path, values = saved
    with open(path, 'rb') as f:  # into the page cache
        f.read()
    before = _core.direct_io_bytes()
    got = load(path, list(values))
    assert _core.direct_io_bytes() == before
    np.testing.assert_array_equal(got['big'], values['big'])


@pytest.mark.parametrize('off', [None, '0', 'off'])
def test_direct_reads_are_off_unless_asked_for(saved, monkeypatch, off):
    if off is None:
        monkeypatch.delenv('FERROCAFFE_DIRECT_IO', raising=False)
    else:
        monkeypatch.setenv('FERROCAFFE_DIRECT_IO', off)
    path, values = saved
    evict(path)
    before = _core.direct_io_bytes()
    got = load(path, list(values))
    assert _core.direct_io_bytes() == before
    np.testing.assert_array_equal(got['ids'], values['ids'])


@pytest.mark.parametrize('where', [0, 3 * MIB + 17, -1])
def test_damage_in_a_directly_read_payload_is_a_crc_error(
        saved, monkeypatch, where):
    monkeypatch.setenv('FERROCAFFE_DIRECT_IO', '1')
    path, values = saved
    raw = bytearray(open(path, 'rb').read())
    start = raw.find(values['big'][:16].tobytes())
    assert start > 0 and start % 4096 == 0  # a page-aligned payload
    at = start + (where % values['big'].nbytes)
    raw[at] ^= 0x10
    with open(path, 'wb') as f:
        f.write(raw)
    evict(path)
    ws = workspace.Workspace()
    ws.feed_blob('big', np.zeros(3, np.float32))
    with pytest.raises(errors.CorruptCheckpointError) as e:
        ws.run(core.CreateOperator('Load', [], ['big'], db=path,
                                   db_type='ferro', absolute_path=True))
    assert 'big' in str(e.value) and 'CRC' in str(e.value)
    # A failed Load leaves the blob as it was.
    np.testing.assert_array_equal(ws.fetch_blob('big'),
                                  np.zeros(3, np.float32))
