"""Key-value dbs (issue 13): Caffe2's ``workspace.C.create_db`` with
transactions and cursors over minidb files, TensorProtos records as
Caffe2's data tools wrote them, and minidbs written by ``Save`` read back
record by record. The file layout is checked by hand-parsing. Every other
type of ``registered_dbs()`` (LevelDB directories, ferro files) opens too."""

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
    with pytest.raises(errors.InvalidArgumentError, match="lmdb"):
        C.create_db("lmdb", os.fspath(tmp_path / "x"), C.Mode.read)
    with pytest.raises(errors.FerrocaffeIOError, match="missing"):
        C.create_db("leveldb", os.fspath(tmp_path / "missing"), C.Mode.read)
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


def read_records(db_type, path):
    cursor = C.create_db(db_type, path, C.Mode.read).new_cursor()
    got = []
    while cursor.valid():
        got.append((cursor.key(), cursor.value()))
        cursor.next()
    return got


def test_every_registered_db_type_opens():
    assert {"ferro", "minidb", "leveldb", "LevelDB"} <= set(C.registered_dbs())


@pytest.mark.parametrize("db_type", ["leveldb", "LevelDB"])
def test_leveldb_records_round_trip_on_disk(tmp_path, db_type):
    """Any bytes as keys and values; LevelDB keeps its keys sorted bytewise,
    so a cursor walks them in that order whatever order they were put in."""
    path = os.fspath(tmp_path / "kv.leveldb")
    rng = np.random.default_rng(3)
    records = {b"key%02d" % i: rng.bytes(int(rng.integers(0, 40))) for i in range(20)}
    records[b"\xff\x00binary"] = b"\x00\x01"
    records[b""] = b"empty key"
    order = list(records)
    rng.shuffle(order)
    db = C.create_db(db_type, path, C.Mode.new)
    for k in order:
        t = db.new_transaction()
        t.put(k, records[k])
        t.commit()
    assert not os.path.exists(path)  # written whole when closed
    db.close()
    assert os.path.isfile(os.path.join(path, "CURRENT"))  # a LevelDB directory
    expected = sorted(records.items())
    assert read_records("leveldb", path) == expected
    cursor = C.create_db("LevelDB", path, C.Mode.read).new_cursor()
    cursor.seek(b"key05")
    assert (cursor.key(), cursor.value()) == (b"key05", records[b"key05"])
    cursor.seek(b"key05a")  # the first key at or after it
    assert cursor.key() == b"key06"
    cursor.seek(b"\xff\xff")
    assert not cursor.valid()
    # Mode.write adds to the db (a key put again keeps its last value);
    # Mode.new starts over.
    with C.create_db(db_type, path, C.Mode.write) as db:
        db.new_transaction().put(b"key03", b"new")
        db.new_transaction().put("zzz", "last")
    records[b"key03"] = b"new"
    records[b"zzz"] = b"last"
    assert read_records("leveldb", path) == sorted(records.items())
    with C.create_db(db_type, path, C.Mode.new) as db:
        db.new_transaction().put(b"only", b"one")
    assert read_records("leveldb", path) == [(b"only", b"one")]


def test_tensor_protos_written_to_a_leveldb_feed_tensor_protos_db_input(fresh, tmp_path):
    path = os.fspath(tmp_path / "data.leveldb")
    images = np.arange(24, dtype=np.float32).reshape(4, 2, 3) / 5
    with C.create_db("leveldb", path, C.Mode.new) as db:
        for i in (2, 0, 3, 1):  # put out of order: read back in key order
            protos = caffe2_pb2.TensorProtos()
            protos.protos.extend([utils.NumpyArrayToCaffe2Tensor(images[i]),
                                  utils.NumpyArrayToCaffe2Tensor(np.array([i], np.int32))])
            db.new_transaction().put("%08d" % i, protos.SerializeToString())
    workspace.RunOperatorOnce(core.CreateOperator(
        "CreateDB", [], ["reader"], db=path, db_type="leveldb"))
    workspace.RunOperatorOnce(core.CreateOperator(
        "TensorProtosDBInput", ["reader"], ["x", "y"], batch_size=4))
    np.testing.assert_array_equal(workspace.FetchBlob("x"), images)
    assert workspace.FetchBlob("y").tolist() == [[0], [1], [2], [3]]


@pytest.mark.parametrize("db_type", ["ferro", "minidb", "leveldb"])
def test_saved_blobs_copied_record_by_record_load_in_every_format(fresh, tmp_path, db_type):
    """A db written by Save, read with a cursor and written record by record
    into a db of another type, loads the same blobs (a ferro db's records are
    its blobs as serialized BlobProtos, as in a minidb)."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3) * 1.5
    b = np.array([7, -8], dtype=np.int64)
    workspace.FeedBlob("w", w)
    workspace.FeedBlob("b", b)
    src = os.fspath(tmp_path / ("src." + db_type))
    workspace.RunOperatorOnce(core.CreateOperator(
        "Save", ["w", "b"], [], db=src, db_type=db_type, absolute_path=1))
    records = read_records(db_type, src)
    assert sorted(k for k, _ in records) == [b"b#%0", b"w#%0"]
    for target in C.registered_dbs():
        dst = os.fspath(tmp_path / ("dst-" + db_type + "-" + target))
        with C.create_db(target, dst, C.Mode.new) as db:
            for k, v in records:
                db.new_transaction().put(k, v)
        workspace.ResetWorkspace()
        workspace.RunOperatorOnce(core.CreateOperator(
            "Load", [], ["w", "b"], db=dst, db_type=target, absolute_path=1))
        np.testing.assert_array_equal(workspace.FetchBlob("w"), w)
        np.testing.assert_array_equal(workspace.FetchBlob("b"), b)


def test_a_ferro_db_takes_only_blob_records(tmp_path):
    path = os.fspath(tmp_path / "x.ferro")
    db = C.create_db("ferro", path, C.Mode.new)
    db.new_transaction().put(b"k", b"\xff\xff not a BlobProto")
    with pytest.raises(errors.InvalidArgumentError, match="BlobProto"):
        db.close()
    assert not os.path.exists(path)


def test_minidb_keys_are_any_bytes(tmp_path):
    # The minidb codec is the core's only (issue 33); Caffe2's minidb keys
    # are bytes, not necessarily UTF-8.
    path = os.fspath(tmp_path / "bytes.minidb")
    records = [(b"\xff\x00binary", b"\x00\x01"), (b"", b"empty key"), (b"plain", b"")]
    with C.create_db("minidb", path, C.Mode.new) as db:
        for k, v in records:
            db.new_transaction().put(k, v)
    assert parse_minidb(path) == records
    assert read_records("minidb", path) == records
    # Mode.write appends to what is there
    with C.create_db("minidb", path, C.Mode.write) as db:
        db.new_transaction().put(b"more", b"\xfe")
    assert read_records("minidb", path) == records + [(b"more", b"\xfe")]


def test_what_a_db_is_comes_from_the_core(tmp_path, fresh):
    # Format, size and (for minidb) checksum, as the checkpoint manifest
    # records them, without Python knowing the layouts.
    import zlib
    from ferrocaffe import _core

    workspace.FeedBlob("w", np.arange(6, dtype=np.float32))
    for db_type in ("ferro", "minidb", "leveldb"):
        path = os.fspath(tmp_path / db_type)
        workspace.RunOperatorOnce(core.CreateOperator(
            "Save", ["w"], [], db=path, db_type=db_type, absolute_path=True))
        assert _core.detect_db_type(path) == db_type
        info = _core.db_info(path, checksum=True)
        assert info["db_type"] == db_type
        if db_type == "leveldb":
            assert info["bytes"] == sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
            assert info["checksum"] is None
        else:
            assert info["bytes"] == os.path.getsize(path)
            want = zlib.crc32(open(path, "rb").read()) if db_type == "minidb" else None
            assert info["checksum"] == want
        _core.remove_db(path, db_type)
        assert _core.detect_db_type(path) is None and not os.path.exists(path)
    with pytest.raises(errors.MissingFileError):
        _core.db_info(os.fspath(tmp_path / "none"))


def test_a_minidb_read_through_a_cursor_reads_each_value_when_asked(tmp_path):
    path = os.fspath(tmp_path / "big.minidb")
    sizes = [10, 1 << 20, 3, 1 << 16]
    records = [(b"k%d" % i, bytes([i]) * n) for i, n in enumerate(sizes)]
    db = C.create_db("minidb", path, C.Mode.write)
    t = db.new_transaction()
    for k, v in records:
        t.put(k, v)
    t.commit()
    db.close()
    cursor = C.create_db("minidb", path, C.Mode.read).new_cursor()
    # Cut the file inside the second value after the db was opened: every
    # key is still there (they were indexed), the first value reads, the
    # second is a typed error naming the record, not a crash or short read.
    cut = 8 + 2 + 10 + 8 + 2 + 100
    with open(path, "r+b") as f:
        f.truncate(cut)
    assert cursor.key() == b"k0" and cursor.value() == records[0][1]
    cursor.next()
    assert cursor.key() == b"k1"
    with pytest.raises(errors.CorruptCheckpointError, match=r"record #1"):
        cursor.value()
    keys = []
    cursor.seek_to_first()
    while cursor.valid():
        keys.append(cursor.key())
        cursor.next()
    assert keys == [k for k, _ in records]


def test_leveldb_seek_finds_the_first_key_at_or_after(tmp_path):
    path = os.fspath(tmp_path / "kv.leveldb")
    db = C.create_db("leveldb", path, C.Mode.new)
    t = db.new_transaction()
    for k in [b"d", b"b", b"f"]:
        t.put(k, k * 2)
    t.commit()
    db.close()
    cursor = C.create_db("leveldb", path, C.Mode.read).new_cursor()
    for key, want in [(b"a", b"b"), (b"b", b"b"), (b"c", b"d"), (b"e", b"f")]:
        cursor.seek(key)
        assert cursor.key() == want and cursor.value() == want * 2
    cursor.seek(b"g")
    assert not cursor.valid()
