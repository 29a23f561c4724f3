"""Tests of ferrocaffe.file_reader: Parquet and .npy files read in batches,
directly and through pipelines, with bad files failing clearly.

The Parquet files are written with pyarrow and the .npy files with numpy;
every expected value is computed here in plain Python from the data
written.
"""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _support import run_in_thread
from ferrocaffe import core, errors, workspace
from ferrocaffe.dataset import Dataset
from ferrocaffe.file_reader import (
    NpyReader, ParquetReader, ParquetWriter, parquet_columns)
from ferrocaffe.pipeline import pipe
from ferrocaffe.schema import FeedRecord, List, NewRecord, Scalar, Struct
from ferrocaffe.session import LocalSession
from ferrocaffe.task import TaskGroup

TIMEOUT = 60.0


# ---------------------------------------------------------------- data --

def records(lo, hi):
    """Plain-Python records lo..hi-1: uid, score, name, items, flag, small."""
    out = []
    for i in range(lo, hi):
        out.append(dict(
            uid=i * 7 + 3,
            score=float(np.float32(i) / np.float32(4)),
            name='u%d' % i,
            items=[i * 10 + k for k in range(i % 4)],
            flag=(i % 3 == 0),
            small=(i % 200) - 100,
        ))
    return out


def write_parquet(path, recs, row_group_size=None, compression='snappy'):
    table = pa.table({
        'uid': pa.array([r['uid'] for r in recs], pa.int64()),
        'score': pa.array([r['score'] for r in recs], pa.float32()),
        'name': pa.array([r['name'] for r in recs], pa.string()),
        'items': pa.array([r['items'] for r in recs], pa.list_(pa.int64())),
        'flag': pa.array([r['flag'] for r in recs], pa.bool_()),
        'small': pa.array([r['small'] for r in recs], pa.int8()),
    })
    pq.write_table(table, path, row_group_size=row_group_size,
                   compression=compression)
    return path


def run_with_timeout(fn, timeout=TIMEOUT):
    """Runs fn() on a thread; fails the test if it does not finish in
    time (a hang), re-raises what it raised."""
    return run_in_thread(fn, timeout)


def read_net(reader, ws, setup=True):
    """Sets ``reader`` up in ``ws`` (unless ``setup`` is false) and builds
    its read net: ``(net, stop, fields)``."""
    if setup:
        init = core.Net('init')
        reader.setup_ex(init, core.Net('finish'))
        ws.run(init)
    net = core.Net('read')
    stop, fields = reader.read(net)
    return net, stop, fields


def read_batches(reader, ws=None, setup=True):
    """Every batch of a reader, read by running its read net until it
    stops: a list of lists of arrays (one per field)."""
    ws = ws or workspace.Workspace()
    net, stop, fields = read_net(reader, ws, setup)
    batches = []
    for _ in range(100000):
        ws.run(net)
        values = [ws.blobs[str(f)].fetch() for f in fields]
        if bool(np.asarray(ws.blobs[str(stop)].fetch()).reshape(-1)[0]):
            assert all(len(v) == 0 for v in values)
            return batches
        batches.append(values)
    raise AssertionError('the reader never stopped')


def as_records(batches):
    """Batches of the full sample schema back to plain records (field
    order: uid, score, name, items:lengths, items:values, flag, small)."""
    out = []
    for uid, score, name, lengths, values, flag, small in batches:
        assert uid.dtype == np.int64 and score.dtype == np.float32
        assert lengths.dtype == np.int32 and values.dtype == np.int64
        assert flag.dtype == np.bool_ and small.dtype == np.int8
        assert int(lengths.sum()) == len(values)
        at = 0
        for k in range(len(uid)):
            n = int(lengths[k])
            out.append(dict(
                uid=int(uid[k]), score=float(score[k]),
                name=name[k].decode('utf-8'),
                items=[int(v) for v in values[at:at + n]],
                flag=bool(flag[k]), small=int(small[k])))
            at += n
    return out


# ------------------------------------------------------------- parquet --

def test_a_file_larger_than_one_batch_is_read_in_batches(tmp_path):
    recs = records(0, 2500)
    path = write_parquet(str(tmp_path / 'a.parquet'), recs,
                         row_group_size=700)
    reader = ParquetReader(path, batch_size=256)
    assert reader.schema().field_names() == [
        'uid', 'score', 'name', 'items:lengths', 'items:values', 'flag',
        'small']
    batches = read_batches(reader)
    assert [len(b[0]) for b in batches] == [256] * 9 + [196]
    assert as_records(batches) == recs


@pytest.mark.parametrize('batch_size', [3, 5000, 20000])
def test_string_batches_of_changing_lengths_come_out_whole(tmp_path,
                                                           batch_size):
    # Each batch is written over the previous batch's string buffers:
    # strings of every length in no order (empty, short, long, unicode),
    # a list-of-strings column, a short last batch, and batches large
    # enough to be decoded on several threads.
    rng = np.random.default_rng(7)
    n = 45001
    lens = rng.integers(0, 60, n)
    lens[::17] = 0
    lens[::101] = 300
    words = [('\u00e9' if i % 5 == 0 else 'w') * int(lens[i]) + str(i)
             for i in range(n)]
    tags = [[words[(i * 7 + k) % n] for k in range(i % 3)] for i in range(n)]
    path = str(tmp_path / 's.parquet')
    pq.write_table(pa.table({
        'word': pa.array(words, pa.string()),
        'tags': pa.array(tags, pa.list_(pa.string())),
        'id': pa.array(np.arange(n, dtype=np.int64)),
    }), path, row_group_size=16000)
    batches = read_batches(ParquetReader(path, batch_size=batch_size))
    sizes = [len(b[0]) for b in batches]
    assert sizes == [batch_size] * (n // batch_size) + [n % batch_size]
    got_words, got_tags, got_ids = [], [], []
    for word, lengths, values, ids in batches:
        got_words += [w.decode('utf-8') for w in word]
        at = 0
        for k in lengths:
            got_tags.append([t.decode('utf-8') for t in values[at:at + k]])
            at += int(k)
        assert at == len(values)
        got_ids += ids.tolist()
    assert got_words == words
    assert got_tags == tags
    assert got_ids == list(range(n))


@pytest.mark.parametrize('compression', ['none', 'snappy', 'gzip', 'zstd',
                                         'lz4'])
def test_every_supported_codec(tmp_path, compression):
    recs = records(0, 300)
    path = write_parquet(str(tmp_path / 'c.parquet'), recs,
                         row_group_size=128, compression=compression)
    assert as_records(read_batches(ParquetReader(path, batch_size=100))) \
        == recs


def test_selected_columns_and_their_schema(tmp_path):
    recs = records(0, 50)
    path = write_parquet(str(tmp_path / 'a.parquet'), recs)
    reader = ParquetReader(path, ['items', 'uid'], batch_size=20)
    assert reader.schema().field_names() == [
        'items:lengths', 'items:values', 'uid']
    got_uid, got_items = [], []
    for lengths, values, uid in read_batches(reader):
        got_uid.extend(uid.tolist())
        at = 0
        for n in lengths.tolist():
            got_items.append(values[at:at + n].tolist())
            at += n
    assert got_uid == [r['uid'] for r in recs]
    assert got_items == [r['items'] for r in recs]
    assert parquet_columns(path, ['score', 'name']) == [
        ('score', np.float32, False), ('name', object, False)]


def test_a_schema_maps_fields_to_columns_and_checks_types(tmp_path):
    recs = records(0, 30)
    path = write_parquet(str(tmp_path / 'a.parquet'), recs)
    schema = Struct(('score', np.float32), ('items', List(np.int64)),
                    ('flag', bool))
    reader = ParquetReader(path, schema, batch_size=8)
    assert reader.schema() == schema
    got = []
    for score, lengths, values, flag in read_batches(reader):
        got.extend(zip(score.tolist(), lengths.tolist(), flag.tolist()))
    assert got == [(r['score'], len(r['items']), r['flag']) for r in recs]
    # A field of unknown type takes the file's.
    reader = ParquetReader(path, Struct(('small', Scalar())))
    assert reader.schema().small.field_type() == np.int8


def test_nested_struct_columns_become_nested_fields(tmp_path):
    path = str(tmp_path / 'nested.parquet')
    table = pa.table({
        'a': pa.array([{'b': i, 'c': 'x%d' % i} for i in range(5)]),
        'z': pa.array([0.5 * i for i in range(5)], pa.float64()),
    })
    pq.write_table(table, path)
    reader = ParquetReader(path, batch_size=10)
    assert reader.schema().field_names() == ['a:b', 'a:c', 'z']
    ((b, c, z),) = read_batches(reader)
    assert b.tolist() == list(range(5))
    assert [v.decode() for v in c] == ['x%d' % i for i in range(5)]
    assert z.tolist() == [0.5 * i for i in range(5)]


def test_a_wrong_column_type_names_the_file_and_column(tmp_path):
    path = write_parquet(str(tmp_path / 'a.parquet'), records(0, 10))
    with pytest.raises(TypeError) as info:
        ParquetReader(path, Struct(('uid', np.float32)))
    msg = str(info.value)
    assert path in msg and "column 'uid'" in msg
    assert 'holds int64 values but float32 values were expected' in msg
    assert info.value.file == path
    with pytest.raises(TypeError, match="column 'items'.*lists of int64"):
        ParquetReader(path, Struct(('items', np.int64)))
    with pytest.raises(ValueError, match="no column 'nope'"):
        ParquetReader(path, ['uid', 'nope'])
    # Not checked up front (validate=False): the run fails, naming both.
    reader = ParquetReader(path, Struct(('score', np.float64)),
                           validate=False)
    init = core.Net('init')
    reader.setup_ex(init, core.Net('finish'))
    with pytest.raises(TypeError, match="column 'score'.*float32 values "
                       "but float64"):
        workspace.Workspace().run(init)


def test_files_with_different_column_types_are_refused(tmp_path):
    folder = tmp_path / 'mixed'
    folder.mkdir()
    write_parquet(str(folder / 'p0.parquet'), records(0, 5))
    pq.write_table(pa.table({'uid': pa.array([1.5], pa.float64())}),
                   str(folder / 'p1.parquet'))
    with pytest.raises(TypeError) as info:
        ParquetReader(str(folder), ['uid'])
    assert 'p1.parquet' in str(info.value) and "column 'uid'" in str(
        info.value)


def test_a_folder_of_files_reads_every_file_in_name_order(tmp_path):
    folder = tmp_path / 'table'
    (folder / 'date=2').mkdir(parents=True)
    write_parquet(str(folder / 'part-1.parquet'), records(100, 250),
                  row_group_size=64)
    write_parquet(str(folder / 'part-0.parquet'), records(0, 100),
                  row_group_size=64)
    write_parquet(str(folder / 'part-00.parquet'), records(0, 0))  # empty
    write_parquet(str(folder / 'date=2' / 'part-0.parquet'),
                  records(250, 260))
    (folder / '_SUCCESS').write_bytes(b'')
    (folder / '.part-0.parquet.crc').write_bytes(b'not parquet')
    reader = ParquetReader(str(folder), batch_size=33)
    got = as_records(read_batches(reader))
    # date=2/ sorts before part-*; the empty file adds nothing.
    assert got == records(250, 260) + records(0, 100) + records(100, 250)
    # A list of files is read in the order given.
    reader = ParquetReader([str(folder / 'part-1.parquet'),
                            str(folder / 'part-0.parquet')], batch_size=64)
    assert as_records(read_batches(reader)) == (records(100, 250) +
                                                records(0, 100))


def test_an_empty_file_gives_one_empty_batch_and_stops(tmp_path):
    path = write_parquet(str(tmp_path / 'empty.parquet'), records(0, 0))
    reader = ParquetReader(path, batch_size=10)
    assert reader.schema().field_names()[:2] == ['uid', 'score']
    assert read_batches(reader) == []


def test_a_missing_file_is_an_os_error_naming_it(tmp_path):
    path = str(tmp_path / 'nope.parquet')
    with pytest.raises(OSError) as info:
        ParquetReader(path)
    assert path in str(info.value) and 'No such file' in str(info.value)
    assert isinstance(info.value, errors.FerrocaffeIOError)
    assert info.value.file == path
    with pytest.raises(OSError, match='holds no data files'):
        os.mkdir(str(tmp_path / 'empty_dir'))
        ParquetReader(str(tmp_path / 'empty_dir'))


def test_corrupt_files_are_os_errors_naming_them(tmp_path):
    junk = tmp_path / 'junk.parquet'
    junk.write_bytes(b'PAR1 this is not really a parquet file PAR1')
    with pytest.raises(OSError, match='not a valid Parquet file') as info:
        ParquetReader(str(junk))
    assert str(junk) in str(info.value)
    zero = tmp_path / 'zero.parquet'
    zero.write_bytes(b'')
    with pytest.raises(OSError, match='empty'):
        ParquetReader(str(zero))
    good = write_parquet(str(tmp_path / 'good.parquet'), records(0, 400))
    data = open(good, 'rb').read()
    cut = tmp_path / 'cut.parquet'
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(OSError, match='cut.parquet'):
        ParquetReader(str(cut))


def damaged_copy(good, bad, row_group, column):
    """Writes to ``bad`` a copy of the Parquet file ``good`` with the pages
    of one column chunk overwritten with 0xFF bytes; returns ``bad``."""
    data = bytearray(open(good, 'rb').read())
    meta = pq.ParquetFile(good).metadata.row_group(row_group)
    [col] = [meta.column(i) for i in range(meta.num_columns)
             if meta.column(i).path_in_schema == column]
    start = col.dictionary_page_offset or col.data_page_offset
    data[start:start + col.total_compressed_size] = (
        b'\xff' * col.total_compressed_size)
    bad.write_bytes(bytes(data))
    return bad


def test_damaged_pages_fail_the_read_naming_file_and_column(tmp_path):
    good = write_parquet(str(tmp_path / 'good.parquet'), records(0, 400),
                         compression='none')
    # The first column's pages are damaged; the footer is kept, so the
    # file opens and reading it fails.
    bad = damaged_copy(good, tmp_path / 'bad.parquet', 0, 'uid')
    reader = ParquetReader(str(bad), batch_size=50)
    with pytest.raises(OSError) as info:
        run_with_timeout(lambda: read_batches(reader))
    assert str(bad) in str(info.value) and "column 'uid'" in str(info.value)


def test_a_flipped_bit_in_a_checksummed_page_fails_the_read(tmp_path):
    # pyarrow stores a CRC-32 per page when asked; plain, uncompressed
    # pages, so the flipped bit changes a value rather than the encoding.
    uids = [i * 7 + 3 for i in range(400)]
    good = str(tmp_path / 'good.parquet')
    pq.write_table(pa.table({'uid': pa.array(uids, pa.int64()),
                             'score': pa.array(range(400), pa.float32())}),
                   good, compression='none', use_dictionary=False,
                   write_page_checksum=True)
    [[uid, _]] = read_batches(ParquetReader(good, batch_size=1000))
    assert uid.tolist() == uids
    meta = pq.ParquetFile(good).metadata.row_group(0).column(0)
    data = bytearray(open(good, 'rb').read())
    # A bit of the last uid's third byte (the page ends with the values).
    data[meta.data_page_offset + meta.total_compressed_size - 6] ^= 0x10
    bad = tmp_path / 'bad.parquet'
    bad.write_bytes(bytes(data))
    with pytest.raises(OSError, match='CRC checksum'):
        pq.read_table(str(bad), page_checksum_verification=True)
    reader = ParquetReader(str(bad), batch_size=1000)
    with pytest.raises(errors.FerrocaffeIOError, match='checksum') as info:
        run_with_timeout(lambda: read_batches(reader))
    assert str(bad) in str(info.value) and "column 'uid'" in str(info.value)


def test_a_failed_read_leaves_the_last_batch_in_its_outputs(tmp_path):
    recs = records(0, 400)
    good = write_parquet(str(tmp_path / 'good.parquet'), recs,
                         row_group_size=200, compression='none')
    # The string column of the second row group only.
    bad = damaged_copy(good, tmp_path / 'bad.parquet', 1, 'name')
    reader = ParquetReader(str(bad), batch_size=50)
    ws = workspace.Workspace()
    net, _, fields = read_net(reader, ws)
    for _ in range(4):  # the first row group: records 0..199
        ws.run(net)
    before = [ws.blobs[str(f)].fetch() for f in fields]
    with pytest.raises(OSError) as info:
        ws.run(net)
    assert "column 'name'" in str(info.value)
    after = [ws.blobs[str(f)].fetch() for f in fields]
    assert as_records([after]) == recs[150:200]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_four_pipeline_threads_read_every_record_once(tmp_path):
    folder = tmp_path / 'data'
    folder.mkdir()
    recs = records(0, 3000)
    for k in range(3):
        write_parquet(str(folder / ('part-%d.parquet' % k)),
                      recs[k * 1000:(k + 1) * 1000], row_group_size=300)
    reader = ParquetReader(str(folder), ['uid', 'items', 'small'],
                           batch_size=64)
    ws = workspace.Workspace()
    session = LocalSession(ws)
    init = core.Net('dst_init')
    with core.NameScope('dst'):
        dst = Dataset(reader.schema().clone_schema())
        dst.init_empty(init)
    session.run(init)
    with TaskGroup() as tg:
        pipe(reader, dst.writer(), num_threads=4)
    run_with_timeout(lambda: session.run(tg))
    uid, lengths, values, small = [ws.blobs[str(b)].fetch()
                                   for b in dst.get_blobs()]
    assert len(uid) == len(recs)
    assert sorted(uid.tolist()) == sorted(r['uid'] for r in recs)
    assert int(uid.sum()) == sum(r['uid'] for r in recs)
    assert int(lengths.sum()) == sum(len(r['items']) for r in recs)
    assert int(values.sum()) == sum(sum(r['items']) for r in recs)
    assert int(small.astype(np.int64).sum()) == sum(r['small'] for r in recs)
    # Each record arrived whole: its items belong to its uid.
    by_uid = {r['uid']: r for r in recs}
    at = 0
    for u, n, s in zip(uid.tolist(), lengths.tolist(), small.tolist()):
        assert values[at:at + n].tolist() == by_uid[u]['items']
        assert s == by_uid[u]['small']
        at += n


def test_reset_reads_the_data_again(tmp_path):
    recs = records(0, 90)
    path = write_parquet(str(tmp_path / 'a.parquet'), recs)
    reader = ParquetReader(path, ['uid'], batch_size=40)
    ws = workspace.Workspace()
    first = read_batches(reader, ws)
    reset = core.Net('reset')
    reader.reset(reset)
    ws.run(reset)
    second = read_batches(reader, ws, setup=False)
    want = [r['uid'] for r in recs]
    assert [u for (b,) in first for u in b.tolist()] == want
    assert [u for (b,) in second for u in b.tolist()] == want


def test_a_saved_reader_resumes_where_it_stood(tmp_path):
    recs = records(0, 500)
    path = write_parquet(str(tmp_path / 'a.parquet'), recs,
                         row_group_size=128)
    db = str(tmp_path / 'ckpt.db')
    reader = ParquetReader(path, ['uid', 'items'], batch_size=70,
                           name='pq_reader')
    ws = workspace.Workspace()
    net, stop, fields = read_net(reader, ws)
    for _ in range(3):
        ws.run(net)
    save = core.Net('save')
    save.Save([reader.reader_blob], [], db=db, db_type='ferro',
              absolute_path=1)
    ws.run(save)
    rest = []
    for _ in range(100):
        ws.run(net)
        uid = ws.blobs[str(fields[0])].fetch()
        if len(uid) == 0:
            break
        rest.extend(uid.tolist())
    assert rest == [r['uid'] for r in recs[210:]]
    # A new workspace loads the reader and continues at record 210.
    ws2 = workspace.Workspace()
    load = core.Net('load')
    load.Load([], [reader.reader_blob], db=db, db_type='ferro',
              absolute_path=1)
    ws2.run(load)
    resumed = read_batches(reader, ws2, setup=False)
    got = []
    for uid, lengths, values in resumed:
        got.extend(uid.tolist())
    assert got == rest


# ----------------------------------------------------------------- npy --

def make_npy(tmp_path, n):
    x = (np.arange(n * 3, dtype=np.float32) / 8).reshape(n, 3)
    label = (np.arange(n, dtype=np.int64) * 5) % 17
    word = np.array(['w%d' % (i % 11) for i in range(n)])
    paths = {}
    for name, arr in (('x', x), ('label', label), ('word', word)):
        paths[name] = str(tmp_path / (name + '.npy'))
        np.save(paths[name], arr)
    return paths, x, label, word


def test_npy_files_read_as_one_dataset(tmp_path):
    paths, x, label, word = make_npy(tmp_path, 1000)
    reader = NpyReader(paths, batch_size=128)
    assert reader.schema().field_names() == ['x', 'label', 'word']
    assert reader.schema().x.field_type() == np.dtype((np.float32, (3,)))
    batches = read_batches(reader)
    assert [len(b[0]) for b in batches] == [128] * 7 + [104]
    got_x = np.concatenate([b[0] for b in batches])
    got_label = np.concatenate([b[1] for b in batches])
    got_word = [w.decode() for b in batches for w in b[2]]
    assert got_x.dtype == np.float32 and got_x.shape == (1000, 3)
    assert got_x.tolist() == x.tolist()
    assert got_label.tolist() == label.tolist()
    assert got_word == word.tolist()


def test_npy_big_endian_bool_and_bytes(tmp_path):
    a = np.arange(10, dtype='>i4')
    b = np.array([i % 2 == 0 for i in range(10)])
    c = np.array([b'k%d' % i for i in range(10)])
    for name, arr in (('a', a), ('b', b), ('c', c)):
        np.save(str(tmp_path / (name + '.npy')), arr)
    reader = NpyReader([str(tmp_path / 'a.npy'), str(tmp_path / 'b.npy'),
                        str(tmp_path / 'c.npy')], batch_size=4)
    assert reader.schema().field_names() == ['a', 'b', 'c']
    batches = read_batches(reader)
    assert np.concatenate([x[0] for x in batches]).tolist() == list(range(10))
    assert np.concatenate([x[1] for x in batches]).tolist() == b.tolist()
    assert [v for x in batches for v in x[2]] == c.tolist()


def test_npy_through_a_pipeline_with_four_threads(tmp_path):
    paths, x, label, word = make_npy(tmp_path, 2000)
    reader = NpyReader({'label': paths['label'], 'x': paths['x']},
                       batch_size=50)
    ws = workspace.Workspace()
    session = LocalSession(ws)
    init = core.Net('dst_init')
    with core.NameScope('dst'):
        dst = Dataset(reader.schema().clone_schema())
        dst.init_empty(init)
    session.run(init)
    with TaskGroup() as tg:
        pipe(reader, dst.writer(), num_threads=4)
    run_with_timeout(lambda: session.run(tg))
    got_label, got_x = [ws.blobs[str(b)].fetch() for b in dst.get_blobs()]
    assert int(got_label.sum()) == sum(int(v) for v in label)
    assert got_x.shape == (2000, 3)
    # Rows arrive whole: sort both by x's first column (unique).
    order = np.argsort(got_x[:, 0])
    assert got_x[order].tolist() == x.tolist()
    assert got_label[order].tolist() == label.tolist()


def test_npy_errors_name_the_file(tmp_path):
    paths, _, _, _ = make_npy(tmp_path, 10)
    missing = str(tmp_path / 'missing.npy')
    with pytest.raises(OSError, match='No such file') as info:
        NpyReader({'x': paths['x'], 'm': missing})
    assert missing in str(info.value)
    junk = tmp_path / 'junk.npy'
    junk.write_bytes(b'\x93NUMPY garbage')
    with pytest.raises(OSError, match='junk.npy'):
        NpyReader([str(junk)])
    short = tmp_path / 'short.npy'
    short.write_bytes(open(paths['label'], 'rb').read()[:-8])
    with pytest.raises(OSError, match='short.npy.*truncated'):
        NpyReader([str(short)])
    np.save(str(tmp_path / 'obj.npy'), np.array([{'a': 1}], dtype=object))
    with pytest.raises(OSError, match='obj.npy.*object arrays'):
        NpyReader([str(tmp_path / 'obj.npy')])
    np.save(str(tmp_path / 'other.npy'), np.zeros(11, np.int32))
    with pytest.raises(ValueError, match='same number of rows'):
        NpyReader([paths['label'], str(tmp_path / 'other.npy')])


def test_a_saved_npy_reader_resumes_where_it_stood(tmp_path):
    paths, x, label, word = make_npy(tmp_path, 300)
    db = str(tmp_path / 'npy.db')
    reader = NpyReader({'label': paths['label']}, batch_size=64,
                       name='npy_reader')
    ws = workspace.Workspace()
    net, _, _ = read_net(reader, ws)
    ws.run(net)
    ws.run(net)
    save = core.Net('save')
    save.Save([reader.reader_blob], [], db=db, db_type='ferro',
              absolute_path=1)
    ws.run(save)
    ws2 = workspace.Workspace()
    load = core.Net('load')
    load.Load([], [reader.reader_blob], db=db, db_type='ferro',
              absolute_path=1)
    ws2.run(load)
    got = [v for (b,) in read_batches(reader, ws2, setup=False)
           for v in b.tolist()]
    assert got == label[128:].tolist()


# -------------------------------------------------------------- writer --

def test_a_pipeline_copies_parquet_to_parquet_with_four_threads(tmp_path):
    recs = records(0, 1500)
    src = write_parquet(str(tmp_path / 'in.parquet'), recs,
                        row_group_size=400)
    out = str(tmp_path / 'out.parquet')
    reader = ParquetReader(src, batch_size=100)
    ws = workspace.Workspace()
    with TaskGroup() as tg:
        pipe(reader, ParquetWriter(out, row_group_size=500), num_threads=4)
    run_with_timeout(lambda: LocalSession(ws).run(tg))
    # Read back with pyarrow (the writer's output is standard Parquet).
    table = pq.read_table(out)
    assert table.schema.field('uid').type == pa.int64()
    assert table.schema.field('items').type == pa.list_(
        pa.field('element', pa.int64(), nullable=False))
    assert table.schema.field('name').type == pa.string()
    assert table.schema.field('small').type == pa.int8()
    got = table.to_pylist()
    assert len(got) == len(recs)
    got.sort(key=lambda r: r['uid'])
    assert got == recs
    assert pq.ParquetFile(out).metadata.num_row_groups >= 2
    assert not [n for n in os.listdir(str(tmp_path)) if '.tmp-' in n]


def test_a_written_record_schema_round_trips(tmp_path):
    out = str(tmp_path / 'w.parquet')
    schema = Struct(('a', Struct(('b', np.float64), ('c', str))),
                    ('tags', List(np.int32)), ('ok', bool))
    writer = ParquetWriter(out, schema, compression='zstd')
    ws = workspace.Workspace()
    init, finish = core.Net('init'), core.Net('finish')
    writer.setup_ex(init, finish)
    net = core.Net('write')
    record = NewRecord(net, schema)
    writer.write_record(net, record)
    ws.run(init)
    want = []
    for k in range(3):
        b = [0.5 * k, 1.5 * k]
        c = ['x%d' % k, 'y%d' % k]
        tags = [[k] * k, [7]]
        ok = [True, k % 2 == 0]
        FeedRecord(record, [np.array(b), np.array(c, dtype=object),
                            np.array([len(t) for t in tags], np.int32),
                            np.array(sum(tags, []), np.int32),
                            np.array(ok)], ws)
        ws.run(net)
        for i in range(2):
            want.append({'a': {'b': b[i], 'c': c[i]}, 'tags': tags[i],
                         'ok': ok[i]})
    assert not os.path.exists(out)
    ws.run(finish)
    assert pq.read_table(out).to_pylist() == want
    # And back through the reader, with the same schema.
    reader = ParquetReader(out, schema, batch_size=4)
    batches = read_batches(reader)
    assert [len(b[0]) for b in batches] == [4, 2]


def test_an_empty_input_still_writes_the_schema(tmp_path):
    src = write_parquet(str(tmp_path / 'empty.parquet'), records(0, 0))
    out = str(tmp_path / 'out.parquet')
    ws = workspace.Workspace()
    with TaskGroup() as tg:
        pipe(ParquetReader(src, ['uid', 'items']), ParquetWriter(out),
             num_threads=2)
    run_with_timeout(lambda: LocalSession(ws).run(tg))
    table = pq.read_table(out)
    assert table.num_rows == 0
    assert table.schema.names == ['uid', 'items']


def test_writer_errors_name_the_file_and_column(tmp_path):
    missing = str(tmp_path / 'no_such_dir' / 'x.parquet')
    writer = ParquetWriter(missing, Struct(('v', np.int64)))
    init, finish = core.Net('init'), core.Net('finish')
    writer.setup_ex(init, finish)
    with pytest.raises(OSError) as info:
        workspace.Workspace().run(init)
    assert missing in str(info.value)

    out = str(tmp_path / 'typed.parquet')
    writer = ParquetWriter(out, Struct(('v', np.int64)))
    init, finish = core.Net('init'), core.Net('finish')
    writer.setup_ex(init, finish)
    ws = workspace.Workspace()
    ws.run(init)
    net = core.Net('write')
    writer.write(net, ['v'])
    ws.feed_blob('v', np.array([1.5], np.float32))
    with pytest.raises(TypeError) as info:
        ws.run(net)
    assert "column 'v'" in str(info.value) and out in str(info.value)
    assert 'float32 values but the file' in str(info.value)
    ws.feed_blob('v', np.array([4, 5], np.int64))
    ws.run(net)
    ws.run(finish)
    assert pq.read_table(out).column('v').to_pylist() == [4, 5]
