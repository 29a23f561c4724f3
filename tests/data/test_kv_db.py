"""Key-value dbs (issue 13): Caffe2's ``workspace.C.create_db`` with
transactions and cursors over minidb files, TensorProtos records as
Caffe2's data tools wrote them, and minidbs written by ``Save`` read back
record by record. The file layout is checked by hand-parsing."""

import os

import numpy as np
import pytest

from ferrocaffe import core, errors, utils, workspace
from ferrocaffe.proto import caffe2_pb2

C = workspace.C


def parse_minidb(path):
    data = open(path, "rb").read()
    out, at = [], 0
    while at < len(data):
        klen, vlen = np.frombuffer(data[at:at + 8], np.int32)
        at += 8
        out.append((data[at:at + klen], data[at + klen:at + klen + vlen]))
        at += klen + vlen
    return out


def test_write_then_read_in_order(tmp_path):
    path = os.fspath(tmp_path / "kv.minidb")
    records = [(b"key%d" % i, b"value%d" % i * i) for i in range(1, 8)]
    db = C.create_db("minidb", path, C.Mode.write)
    for k, v in records:
        t = db.new_transaction()
        t.put(k, v)
        t.commit()
    assert not os.path.exists(path)  # not there until closed
    db.close()
    assert parse_minidb(path) == records
    db = C.create_db("minidb", path, C.Mode.read)
    cursor = db.new_cursor()
    got = []
    while cursor.valid():
        got.append((cursor.key(), cursor.value()))
        cursor.next()
    assert got == records
    cursor.seek(b"key5")
    assert cursor.value() == b"value5" * 5
    cursor.seek_to_first()
    assert cursor.key() == b"key1"
    db.close()


def test_dropping_a_db_closes_it(tmp_path):
    path = os.fspath(tmp_path / "kv.minidb")
    db = C.create_db("minidb", path, C.Mode.new)
    db.new_transaction().put("k", "v")
    del db
    assert parse_minidb(path) == [(b"k", b"v")]
    assert [f for f in os.listdir(tmp_path)] == ["kv.minidb"]  # no temporary left


def test_tensor_protos_records_as_caffe2_data_tools_wrote_them(tmp_path):
    """A data db: each record a TensorProtos of (image, label)."""
    path = os.fspath(tmp_path / "data.minidb")
    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (4, 2, 3)).astype(np.uint8)
    labels = np.arange(4, dtype=np.int32)
    with C.create_db("minidb", path, C.Mode.write) as db:
        for i in range(4):
            protos = caffe2_pb2.TensorProtos()
            protos.protos.extend([utils.NumpyArrayToCaffe2Tensor(images[i]),
                                  utils.NumpyArrayToCaffe2Tensor(labels[i:i + 1])])
            db.new_transaction().put("%08d" % i, protos.SerializeToString())
    db = C.create_db("minidb", path, C.Mode.read)
    cursor = db.new_cursor()
    n = 0
    while cursor.valid():
        protos = caffe2_pb2.TensorProtos()
        protos.ParseFromString(cursor.value())
        image, label = (utils.Caffe2TensorToNumpyArray(p) for p in protos.protos)
        np.testing.assert_array_equal(image, images[n])
        assert label.tolist() == [n] and cursor.key() == b"%08d" % n
        n += 1
        cursor.next()
    assert n == 4


def test_a_saved_minidb_reads_as_blob_protos(fresh, tmp_path):
    path = os.fspath(tmp_path / "saved.minidb")
    workspace.FeedBlob("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    workspace.RunOperatorOnce(core.CreateOperator(
        "Save", ["x"], [], db=path, db_type="minidb", absolute_path=1))
    cursor = C.create_db("minidb", path, C.Mode.read).new_cursor()
    assert cursor.key() == b"x#%0"
    blob = caffe2_pb2.BlobProto()
    blob.ParseFromString(cursor.value())
    assert utils.Caffe2TensorToNumpyArray(blob.tensor).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_bad_input_is_a_typed_error(tmp_path):
    with pytest.raises(errors.InvalidArgumentError, match="leveldb"):
        C.create_db("leveldb", os.fspath(tmp_path / "x"), C.Mode.read)
    with pytest.raises(FileNotFoundError):
        C.create_db("minidb", os.fspath(tmp_path / "missing"), C.Mode.read)
    path = tmp_path / "trunc.minidb"
    path.write_bytes(np.array([3, 100], np.int32).tobytes() + b"abc")
    with pytest.raises(errors.CorruptCheckpointError, match="trunc.minidb"):
        C.create_db("minidb", os.fspath(path), C.Mode.read).new_cursor()
    path.write_bytes(b"\x01\x02")
    with pytest.raises(errors.CorruptCheckpointError):
        C.create_db("minidb", os.fspath(path), C.Mode.read).new_cursor()
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(errors.FerrocaffeIOError, match="FIFO"):
        C.create_db("minidb", os.fspath(tmp_path / "fifo"), C.Mode.read)
    w = C.create_db("minidb", os.fspath(tmp_path / "w.minidb"), C.Mode.write)
    with pytest.raises(errors.InvalidArgumentError):
        w.new_cursor()
    with pytest.raises(TypeError):
        w.new_transaction().put(1, b"v")
    w.close()
    r = C.create_db("minidb", os.fspath(tmp_path / "w.minidb"), C.Mode.read)
    with pytest.raises(errors.InvalidArgumentError):
        r.new_transaction()
    c = r.new_cursor()
    assert not c.valid()
    with pytest.raises(errors.InvalidArgumentError):
        c.key()
