"""The LevelDB db type (issue 13): Caffe2's "leveldb"/"LevelDB" db, a LevelDB
directory keyed by blob name (or `name#%<chunk>`) holding serialized
BlobProtos. Expected values are the arrays fed in, or computed here."""

import os

import numpy as np
import pytest

from ferrocaffe import _core, core, workspace
from ferrocaffe.db_file_reader import DBFileReader
from ferrocaffe.errors import (
    CorruptCheckpointError, FerrocaffeIOError, InvalidArgumentError)
from ferrocaffe.session import LocalSession

from ferrocaffe.dataset import Dataset
from ferrocaffe.pipeline import pipe
from ferrocaffe.schema import Scalar, Struct
from ferrocaffe.task import TaskGroup

ARRAYS = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "f64": np.array([[1e300, -2.5], [np.pi, 0.0]], dtype=np.float64),
    "f16": np.array([0.5, -1.25, 65504.0], dtype=np.float16),
    "i32": np.array([-(2 ** 31), 0, 2 ** 31 - 1], dtype=np.int32),
    "i64": np.array([[-(2 ** 62)], [7]], dtype=np.int64),
    "u8": np.array([0, 255, 17], dtype=np.uint8),
    "flags": np.array([True, False, True]),
    "words": np.array([b"alpha", b"", b"\x00\xff"], dtype=object),
    "empty": np.zeros((0, 3), dtype=np.float32),
}


def read_all(ws, reader):
    """Every uid the reader yields, sorted."""
    dst = Dataset(Struct(("uid", Scalar(np.int64))), name="read_back")
    init = core.Net("read_back_init")
    dst.init_empty(init)
    ws.run(init)
    with TaskGroup() as tg:
        pipe(reader, dst.writer(), num_runtime_threads=2)
    LocalSession(ws).run(tg)
    return sorted(ws.fetch_blob(str(dst.get_blobs()[0])).tolist())


@pytest.fixture
def ws():
    previous = workspace.CurrentWorkspace()
    workspace.SwitchWorkspace("leveldb_test", True)
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()
    workspace.SwitchWorkspace(previous)


def save(path, names, db_type="leveldb", **kw):
    workspace.RunOperatorOnce(core.CreateOperator(
        "Save", names, [], db=str(path), db_type=db_type, absolute_path=True, **kw))


def load(path, names, db_type="leveldb"):
    workspace.RunOperatorOnce(core.CreateOperator(
        "Load", [], names, db=str(path), db_type=db_type, absolute_path=True))


def test_registered_dbs_come_from_the_core():
    names = workspace.C.registered_dbs()
    assert names == _core.registered_dbs()
    for n in ("ferro", "minidb", "leveldb", "LevelDB"):
        assert n in names
    assert core.C.registered_dbs() == names


@pytest.mark.parametrize("db_type", ["leveldb", "LevelDB"])
def test_save_load_round_trip_of_every_dtype(ws, tmp_path, db_type):
    for name, a in ARRAYS.items():
        workspace.FeedBlob(name, a)
    path = tmp_path / "model"
    save(path, list(ARRAYS), db_type=db_type, chunk_size=2)
    # A LevelDB directory, as LevelDB makes it.
    assert path.is_dir() and (path / "CURRENT").is_file()
    assert _core.db_exists(str(path), "leveldb")
    workspace.ResetWorkspace()
    load(path, list(ARRAYS), db_type="leveldb")
    for name, a in ARRAYS.items():
        got = workspace.FetchBlob(name)
        assert got.dtype == a.dtype and got.shape == a.shape, name
        if a.dtype == object:
            assert got.tolist() == a.tolist()
        else:
            np.testing.assert_array_equal(got, a)


def test_records_are_read_in_bytewise_key_order(ws, tmp_path):
    workspace.FeedBlob("w", np.arange(5, dtype=np.float32))
    workspace.FeedBlob("B", np.arange(3, dtype=np.int64))
    workspace.FeedBlob("a", np.array([b"s"], dtype=object))
    path = tmp_path / "db"
    save(path, ["w", "B", "a"], chunk_size=2)
    # LevelDB keeps keys sorted bytewise ('B' < 'a' < 'w'), whatever the
    # order of the Save's inputs; chunks are reassembled on load.
    listed = [e["name"] for e in _core.list_db(str(path), "leveldb")]
    assert listed == ["B", "a", "w"]
    workspace.RunOperatorOnce(core.CreateOperator(
        "CreateDB", [], ["reader"], db=str(path), db_type="LevelDB"))
    workspace.ResetWorkspace()
    load(path, ["w", "B"])
    np.testing.assert_array_equal(workspace.FetchBlob("w"), np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(workspace.FetchBlob("B"), np.arange(3, dtype=np.int64))


def test_db_file_reader_over_a_leveldb_written_by_save(tmp_path):
    ws = workspace.Workspace()
    path = tmp_path / "cache"
    ws.feed_blob("uid", np.arange(40, dtype=np.int64) * 3)
    ws.run(core.CreateOperator(
        "Save", ["uid"], [], db=str(path), db_type="LevelDB", absolute_path=True))
    reader = DBFileReader(db_path=str(path), db_type="LevelDB", batch_size=6)
    assert reader.schema().field_names() == ["uid"]
    assert read_all(workspace.Workspace(), reader) == [3 * i for i in range(40)]


def test_missing_and_damaged_dbs_are_typed_errors(ws, tmp_path):
    missing = tmp_path / "nothing"
    with pytest.raises(FerrocaffeIOError, match=str(missing)):
        load(missing, ["x"])
    assert not _core.db_exists(str(missing), "leveldb")

    workspace.FeedBlob("x", np.linspace(0, 1, 50_000, dtype=np.float32))
    path = tmp_path / "db"
    save(path, ["x"])
    tables = [f for f in os.listdir(path) if f.endswith((".ldb", ".sst"))]
    assert tables
    for f in tables:
        data = bytearray((path / f).read_bytes())
        mid = len(data) // 2
        data[mid:mid + 16] = bytes(b ^ 0xA5 for b in data[mid:mid + 16])
        (path / f).write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=str(path)):
        load(path, ["x"])

    not_a_db = tmp_path / "plain"
    not_a_db.write_bytes(b"minidb bytes")
    with pytest.raises(FerrocaffeIOError, match="not a LevelDB"):
        load(not_a_db, ["x"])
    # A save replaces a LevelDB, never a file or a foreign directory.
    with pytest.raises(FerrocaffeIOError):
        save(not_a_db, ["x"])
    assert not_a_db.read_bytes() == b"minidb bytes"
    with pytest.raises(InvalidArgumentError, match="lmdb"):
        save(tmp_path / "other", ["x"], db_type="lmdb")


def test_checkpoint_op_writes_every_n_iterations(ws, tmp_path):
    net = core.Net("ckpt")
    net.Iter([], "iter")
    net.ConstantFill([], "value", shape=[2], value=1.5)
    pattern = os.path.join(str(tmp_path), "at_%04d")
    net.Checkpoint(["iter", "value"], [], db=pattern, db_type="leveldb",
                   every=4, absolute_path=True)
    workspace.CreateNet(net)
    for _ in range(10):
        workspace.RunNet("ckpt")
    assert sorted(os.listdir(tmp_path)) == ["at_0004", "at_0008"]
    workspace.ResetWorkspace()
    load(tmp_path / "at_0008", ["iter", "value"])
    np.testing.assert_array_equal(workspace.FetchBlob("iter"), np.array([8], np.int64))
    np.testing.assert_array_equal(workspace.FetchBlob("value"), np.array([1.5, 1.5], np.float32))
