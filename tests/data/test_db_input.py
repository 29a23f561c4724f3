"""Input from key-value dbs (issue 14): CreateDB, TensorProtosDBInput and
brew.db_input over minidb files of TensorProtos records, and the writer
Caffe2 programs used (workspace.C.create_db, Mode, transactions).
Expected batches are computed here from the records written."""

import struct

import numpy as np
import pytest

from ferrocaffe import brew, core, model_helper, utils, workspace
from ferrocaffe.errors import (
    CorruptCheckpointError, DataTypeError, FerrocaffeIOError,
    InvalidArgumentError, ShapeError)
from ferrocaffe.proto import caffe2_pb2

C = workspace.C


def records(n, seed=0):
    """n records: a float32 [2, 3] image and an int32 label each."""
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((n, 2, 3)).astype(np.float32)
    ys = rng.integers(0, 10, n).astype(np.int32)
    return xs, ys


def tensor_protos(*arrays):
    p = caffe2_pb2.TensorProtos()
    p.protos.extend([utils.NumpyArrayToCaffe2Tensor(a) for a in arrays])
    return p.SerializeToString()


def write_with_caffe2_api(path, xs, ys, mode=None):
    db = C.create_db("minidb", str(path), C.Mode.write if mode is None else mode)
    transaction = db.new_transaction()
    for i, (x, y) in enumerate(zip(xs, ys)):
        transaction.put("rec_%04d" % i, tensor_protos(x, np.array(y, np.int32)))
    del transaction
    del db


def write_by_hand(path, values):
    """The minidb layout, written here: int32 key and value lengths, the
    key, the value."""
    with open(path, "wb") as f:
        for i, v in enumerate(values):
            key = b"%06d" % i
            f.write(struct.pack("=ii", len(key), len(v)) + key + v)


def read_by_hand(path):
    data = open(path, "rb").read()
    out, at = [], 0
    while at < len(data):
        kl, vl = struct.unpack_from("=ii", data, at)
        at += 8
        out.append((data[at:at + kl], data[at + kl:at + kl + vl]))
        at += kl + vl
    return out


def test_db_input_batches_equal_the_records_written_and_cycle(fresh, tmp_path):
    path = tmp_path / "train.minidb"
    xs, ys = records(10)
    write_with_caffe2_api(path, xs, ys)
    model = model_helper.ModelHelper(name="reader")
    data, label = brew.db_input(model, ["data", "label"], batch_size=4, db=str(path), db_type="minidb")
    assert [op.type for op in model.param_init_net.Proto().op] == ["CreateDB"]
    assert model.param_init_net.Proto().op[0].output == ["dbreader_" + str(path)]
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    order = np.arange(12) % 10  # three batches of 4: the third wraps around
    for b in range(3):
        workspace.RunNet(model.net)
        idx = order[4 * b:4 * b + 4]
        got_x, got_y = workspace.FetchBlob("data"), workspace.FetchBlob("label")
        assert got_x.shape == (4, 2, 3) and got_x.dtype == np.float32
        assert got_y.shape == (4,) and got_y.dtype == np.int32
        np.testing.assert_array_equal(got_x, xs[idx])
        np.testing.assert_array_equal(got_y, ys[idx])


def test_batch_size_zero_reads_one_record_as_it_is(fresh, tmp_path):
    path = tmp_path / "db"
    xs, ys = records(3, seed=1)
    write_with_caffe2_api(path, xs, ys)
    workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["r"], db=str(path), db_type="minidb"))
    op = core.CreateOperator("TensorProtosDBInput", ["r"], ["x", "y"])
    for i in [0, 1, 2, 0]:
        workspace.RunOperatorOnce(op)
        np.testing.assert_array_equal(workspace.FetchBlob("x"), xs[i])
        assert workspace.FetchBlob("y").shape == () and workspace.FetchBlob("y") == ys[i]


def test_shards_take_every_nth_record(fresh, tmp_path):
    path = tmp_path / "db"
    write_by_hand(path, [tensor_protos(np.array([i], np.int64)) for i in range(7)])
    workspace.RunOperatorOnce(core.CreateOperator(
        "CreateDB", [], ["r"], db=str(path), db_type="minidb", num_shards=3, shard_id=1))
    workspace.RunOperatorOnce(core.CreateOperator("TensorProtosDBInput", ["r"], ["v"], batch_size=5))
    # Shard 1 of 3 holds records 1 and 4; it starts over after the last.
    np.testing.assert_array_equal(workspace.FetchBlob("v")[:, 0], [1, 4, 1, 4, 1])


def test_the_writer_writes_caffe2s_minidb_layout(tmp_path):
    path = tmp_path / "db"
    xs, ys = records(3, seed=2)
    write_with_caffe2_api(path, xs, ys, mode=C.Mode.new)
    got = read_by_hand(path)
    assert [k for k, _ in got] == [b"rec_0000", b"rec_0001", b"rec_0002"]
    for (_, v), x, y in zip(got, xs, ys):
        p = caffe2_pb2.TensorProtos()
        p.ParseFromString(v)
        np.testing.assert_array_equal(utils.Caffe2TensorToNumpyArray(p.protos[0]), x)
        assert utils.Caffe2TensorToNumpyArray(p.protos[1]) == y
    # Mode.write appends (as Caffe2's minidb did); Mode.new starts over.
    write_with_caffe2_api(path, xs[:1], ys[:1])
    assert len(read_by_hand(path)) == 4
    write_with_caffe2_api(path, xs[:2], ys[:2], mode=C.Mode.new)
    assert len(read_by_hand(path)) == 2
    # A cursor walks the records; explicit commit and close work too.
    db = C.create_db("minidb", str(path), C.Mode.read)
    cursor = db.new_cursor()
    keys = []
    while cursor.valid():
        keys.append(cursor.key())
        cursor.next()
    assert keys == [b"rec_0000", b"rec_0001"]
    with pytest.raises(InvalidArgumentError, match="reading"):
        db.new_transaction()
    db.close()
    db = C.create_db("minidb", str(path), C.Mode.write)
    t = db.new_transaction()
    t.put(b"k", b"v")
    t.commit()
    db.close()
    assert read_by_hand(path)[-1] == (b"k", b"v")
    assert "minidb" in C.registered_dbs()


def test_errors_name_the_problem(fresh, tmp_path):
    path = tmp_path / "db"
    write_by_hand(path, [tensor_protos(np.zeros(2, np.float32)), tensor_protos(np.zeros(3, np.float32))])
    # The default db_type is Caffe2's "leveldb": a minidb file is not a LevelDB directory.
    with pytest.raises(FerrocaffeIOError, match="not a LevelDB"):
        workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["r"], db=str(path)))
    with pytest.raises(InvalidArgumentError, match="db name"):
        workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["r"], db_type="minidb"))
    with pytest.raises(FerrocaffeIOError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "CreateDB", [], ["r"], db=str(tmp_path / "missing"), db_type="minidb"))
    workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["r"], db=str(path), db_type="minidb"))
    with pytest.raises(InvalidArgumentError, match="holds 1 tensors but the op has 2 outputs"):
        workspace.RunOperatorOnce(core.CreateOperator("TensorProtosDBInput", ["r"], ["a", "b"], batch_size=1))
    # Records of different shapes cannot be stacked into one batch.
    with pytest.raises(ShapeError, match="one shape"):
        workspace.RunOperatorOnce(core.CreateOperator("TensorProtosDBInput", ["r"], ["a"], batch_size=2))
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        workspace.RunOperatorOnce(core.CreateOperator("TensorProtosDBInput", ["r"], ["a"], batch_size=-1))
    workspace.FeedBlob("t", np.zeros(1, np.float32))
    with pytest.raises(DataTypeError, match="DBReader"):
        workspace.RunOperatorOnce(core.CreateOperator("TensorProtosDBInput", ["t"], ["a"]))
    bad = tmp_path / "bad"
    write_by_hand(bad, [b"\xff\xff not a proto"])
    workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["q"], db=str(bad), db_type="minidb"))
    with pytest.raises(CorruptCheckpointError, match="TensorProtos"):
        workspace.RunOperatorOnce(core.CreateOperator("TensorProtosDBInput", ["q"], ["a"]))


def test_a_db_reader_is_saved_and_restored_with_its_position(fresh, tmp_path):
    path = tmp_path / "db"
    xs, ys = records(5, seed=3)
    write_with_caffe2_api(path, xs, ys)
    workspace.RunOperatorOnce(core.CreateOperator("CreateDB", [], ["r"], db=str(path), db_type="minidb"))
    read = core.CreateOperator("TensorProtosDBInput", ["r"], ["x", "y"], batch_size=2)
    workspace.RunOperatorOnce(read)
    ckpt = str(tmp_path / "ckpt")
    workspace.RunOperatorOnce(core.CreateOperator("Save", ["r"], [], db=ckpt, db_type="ferro", absolute_path=True))
    workspace.RunOperatorOnce(read)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), ys[[2, 3]])
    workspace.RunOperatorOnce(core.CreateOperator("Load", [], ["r"], db=ckpt, db_type="ferro", absolute_path=True))
    workspace.RunOperatorOnce(read)
    np.testing.assert_array_equal(workspace.FetchBlob("y"), ys[[2, 3]])


def test_a_model_trains_on_db_input_without_stop_gradient(fresh, tmp_path):
    # As in Caffe2, TensorProtosDBInput has no gradient (NO_GRADIENT): a
    # gradient reaching its outputs stops there, so a model reading its
    # data with brew.db_input needs no StopGradient. The SGD step on the
    # one batch read is checked against numpy.
    path = tmp_path / "db"
    xs, _ = records(4, seed=5)
    xs = xs.reshape(4, 6)
    targets = np.arange(4, dtype=np.float32).reshape(4, 1)
    db = C.create_db("minidb", str(path), C.Mode.new)
    t = db.new_transaction()
    for i in range(4):
        t.put("r%d" % i, tensor_protos(xs[i], targets[i]))
    t.commit()
    db.close()
    model = model_helper.ModelHelper(name="db_sgd")
    data, target = brew.db_input(model, ["data", "target"], batch_size=4, db=str(path), db_type="minidb")
    pred = brew.fc(model, data, "pred", dim_in=6, dim_out=1)
    dist = model.SquaredL2Distance([pred, target], "dist")
    loss = model.AveragedLoss(dist, "loss")
    grads = model.AddGradientOperators([loss])
    assert not any(op.type == "TensorProtosDBInput" for op in model.net.Proto().op[3:])
    assert str(grads[core.BlobReference("pred_w")]) == "pred_w_grad"
    for name in ("data", "target"):
        assert core.BlobReference(name) in grads  # FC's maker still names one
    workspace.RunNetOnce(model.param_init_net)
    w0, b0 = workspace.FetchBlob("pred_w"), workspace.FetchBlob("pred_b")
    workspace.RunNetOnce(model.net)
    # loss = mean over rows of 0.5 * (x w + b - t)^2
    r = xs.astype(np.float64) @ w0.T.astype(np.float64) + b0 - targets
    np.testing.assert_allclose(workspace.FetchBlob("pred_w_grad"), (r * xs).mean(0, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("pred_b_grad"), r.mean(0), rtol=1e-5)
    for op_type in ("TensorProtosDBInput", "DiagonalFill", "GivenTensorIntFill",
                    "GivenTensorInt64Fill", "GivenTensorBoolFill", "GivenTensorDoubleFill"):
        op = core.CreateOperator(op_type, ["a"], ["b"])
        assert core.GradientRegistry.GetGradientForOp(op, ["b_grad"]) == ([], [None])


def test_blobs_queue_db_feeds_tensor_protos_db_input(fresh):
    """CreateBlobsQueueDB: records taken from a blobs queue, each value a
    byte string or a one-element string tensor, in queue order."""
    xs, ys = records(6, seed=3)
    init = core.Net("init")
    q = init.CreateBlobsQueue([], "q", capacity=10, num_blobs=1)
    reader = init.CreateBlobsQueueDB([q], "qreader", value_blob_index=0, timeout_secs=0.5)
    workspace.RunNetOnce(init)
    for i, (x, y) in enumerate(zip(xs, ys)):
        value = tensor_protos(x, np.array(y, np.int32))
        workspace.FeedBlob("rec", value if i % 2 else np.array([value], dtype=object))
        workspace.RunOperatorOnce(core.CreateOperator("EnqueueBlobs", [q, "rec"], ["rec"]))
    net = core.Net("read")
    net.TensorProtosDBInput([reader], ["x", "y"], batch_size=3)
    for b in range(2):
        workspace.RunNetOnce(net)
        np.testing.assert_array_equal(workspace.FetchBlob("x"), xs[3 * b:3 * b + 3])
        np.testing.assert_array_equal(workspace.FetchBlob("y"), ys[3 * b:3 * b + 3])
    # Empty and closed: the read fails instead of waiting.
    workspace.RunOperatorOnce(core.CreateOperator("CloseBlobsQueue", [q], []))
    with pytest.raises(RuntimeError, match="closed and empty"):
        workspace.RunNetOnce(net)
    with pytest.raises(InvalidArgumentError, match="out of range"):
        workspace.RunOperatorOnce(core.CreateOperator("CreateBlobsQueueDB", [q], ["r2"], value_blob_index=1))
    workspace.FeedBlob("rec", np.zeros(2, np.float32))
    q2 = core.Net("q2")
    q2.CreateBlobsQueue([], "q2", capacity=2, num_blobs=1)
    q2.CreateBlobsQueueDB(["q2"], "r3")
    workspace.RunNetOnce(q2)
    workspace.RunOperatorOnce(core.CreateOperator("EnqueueBlobs", ["q2", "rec"], ["rec"]))
    with pytest.raises(DataTypeError, match="byte string"):
        workspace.RunOperatorOnce(core.CreateOperator("TensorProtosDBInput", ["r3"], ["x", "y"], batch_size=1))
