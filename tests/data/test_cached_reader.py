"""Tests of ferrocaffe.cached_reader and ferrocaffe.db_file_reader: records
cached in a db file on disk, then read back from it."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace
from ferrocaffe.cached_reader import CachedReader
from ferrocaffe.dataset import Dataset
from ferrocaffe.db_file_reader import DBFileReader
from ferrocaffe.pipeline import pipe
from ferrocaffe.schema import Scalar, Struct
from ferrocaffe.session import LocalSession
from ferrocaffe.task import TaskGroup


def source_reader(ws, values):
    ds = Dataset(Struct(('uid', Scalar(np.int64))), name='source')
    init = core.Net('source_init')
    ds.init_empty(init)
    ws.run(init)
    ws.feed_blob(str(ds.get_blobs()[0]), np.asarray(values, dtype=np.int64))
    return ds.reader(batch_size=7)


def read_all(ws, session, reader, threads=4):
    dst = Dataset(Struct(('uid', Scalar(np.int64))), name='read_back')
    init = core.Net('read_back_init')
    dst.init_empty(init)
    ws.run(init)
    with TaskGroup() as tg:
        pipe(reader, dst.writer(), num_runtime_threads=threads)
    session.run(tg)
    return sorted(ws.fetch_blob(str(dst.get_blobs()[0])).tolist())


@pytest.mark.parametrize('db_type', ['minidb', 'ferro', 'leveldb', 'LevelDB'])
def test_the_cache_is_built_once_and_read_back(tmp_path, db_type):
    ws = workspace.Workspace()
    session = LocalSession(ws)
    path = str(tmp_path / 'cache.db')
    cached = CachedReader(source_reader(ws, range(100)), path, db_type=db_type)
    session.run(cached.build_cache_step())
    assert read_all(ws, session, cached) == list(range(100))

    # A second cache over other data finds the db and keeps it.
    ws2 = workspace.Workspace()
    session2 = LocalSession(ws2)
    again = CachedReader(source_reader(ws2, range(500, 510)), path,
                         db_type=db_type)
    session2.run(again.build_cache_step())
    assert read_all(ws2, session2, again) == list(range(100))
    # ... unless told to overwrite it.
    ws3 = workspace.Workspace()
    session3 = LocalSession(ws3)
    fresh = CachedReader(source_reader(ws3, range(500, 510)), path,
                         db_type=db_type)
    session3.run(fresh.build_cache_step(overwrite=True))
    assert read_all(ws3, session3, fresh) == list(range(500, 510))


def test_a_db_file_reader_finds_its_fields_in_the_db(tmp_path):
    ws = workspace.Workspace()
    session = LocalSession(ws)
    path = str(tmp_path / 'sample.db')
    cached = CachedReader(source_reader(ws, range(30)), path)  # Caffe2's default: LevelDB
    session.run(cached.build_cache_step())

    previous = workspace.CurrentWorkspace()
    workspace.SwitchWorkspace('db_file_reader_test', True)
    try:
        reader = DBFileReader(db_path=path, db_type='LevelDB', batch_size=4)
        assert reader.name == 'sample_db_file_reader'
        assert reader.schema().field_names() == ['uid']
        current = workspace.current_workspace()
        assert read_all(current, LocalSession(current), reader) == list(range(30))
    finally:
        workspace.ResetWorkspace()
        workspace.SwitchWorkspace(previous)


def test_unknown_db_types_and_reads_before_setup_are_refused(tmp_path):
    with pytest.raises(errors.InvalidArgumentError, match='lmdb'):
        DBFileReader(db_path=str(tmp_path / 'x.db'), db_type='lmdb',
                     field_names=['uid'])
    reader = DBFileReader(db_path=str(tmp_path / 'x.db'), db_type='minidb',
                          field_names=['uid'])
    with pytest.raises(errors.InvalidPlanError):
        reader.read(core.Net('read'))
