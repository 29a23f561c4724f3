"""float16 tensors (issue 13): feed, fetch, Cast, FloatToHalf/HalfToFloat,
the float16 fillers, Save/Load in both formats (minidb with Caffe2's
encoding: a half's 16 bits as a uint16 in int32_data), BlobProto bytes and
TensorProto feeds. Expected values come from numpy's float16."""

import os

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace
from ferrocaffe.checkpoint import mmap_db
from ferrocaffe.proto import caffe2_pb2

# Values that exercise rounding, the extremes and the special values.
HALVES = np.array(
    [0.0, -0.0, 1.0, -2.5, 0.1, 65504.0, -65504.0, 6e-8, 1e-5, np.inf, -np.inf, 3.14159],
    np.float16,
)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint16)


def test_feed_and_fetch_keep_every_bit(fresh):
    for a in (HALVES, HALVES.reshape(3, 4), np.float16(7.5), np.zeros((0, 3), np.float16),
              np.array([np.nan], np.float16), HALVES.reshape(4, 3).T):
        workspace.FeedBlob("h", a)
        got = workspace.FetchBlob("h")
        assert got.dtype == np.float16 and got.shape == np.shape(a)
        assert bits(got).tolist() == bits(np.asarray(a)).tolist()


def test_feed_over_an_existing_half_tensor_replaces_its_values(fresh):
    workspace.FeedBlob("h", np.zeros(3, np.float16))
    workspace.FeedBlob("h", np.array([1, 2, 3], np.float16))
    assert workspace.FetchBlob("h").tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("src", [np.float32, np.float64, np.int32, np.int64, np.uint8, np.int16, np.bool_])
def test_cast_to_float16_rounds_as_numpy_does(fresh, src):
    x = np.array([0, 1, -3, 2049, 70000, 0.1, -0.33333, 1e-6], np.float64)
    x = x.astype(src) if src is not np.bool_ else x != 0
    if src is np.uint8:
        x = np.array([0, 1, 200, 255], np.uint8)
    workspace.FeedBlob("x", x)
    workspace.RunOperatorOnce(core.CreateOperator("Cast", ["x"], ["y"], to=core.DataType.FLOAT16))
    y = workspace.FetchBlob("y")
    assert y.dtype == np.float16
    with np.errstate(over="ignore"):
        assert bits(y).tolist() == bits(x.astype(np.float16)).tolist()


@pytest.mark.parametrize("to,np_type", [
    (core.DataType.FLOAT, np.float32), (core.DataType.DOUBLE, np.float64),
    (core.DataType.INT32, np.int32), (core.DataType.INT64, np.int64),
    (core.DataType.BOOL, np.bool_), ("FLOAT16", np.float16),
])
def test_cast_from_float16(fresh, to, np_type):
    finite = np.array([0.0, -0.0, 1.5, -2.75, 1000.0, 0.099975586, -7.9], np.float16)
    workspace.FeedBlob("h", finite)
    workspace.RunOperatorOnce(core.CreateOperator("Cast", ["h"], ["y"], to=to))
    y = workspace.FetchBlob("y")
    assert y.dtype == np_type
    np.testing.assert_array_equal(y, finite.astype(np_type))


def test_cast_of_non_finite_halves_to_int_saturates(fresh):
    workspace.FeedBlob("h", np.array([np.inf, -np.inf, np.nan], np.float16))
    workspace.RunOperatorOnce(core.CreateOperator("Cast", ["h"], ["y"], to=core.DataType.INT32))
    assert workspace.FetchBlob("y").tolist() == [2**31 - 1, -2**31, 0]


def test_float_to_half_and_back(fresh):
    x = np.array([1.0, 0.1, -70000.0, 70000.0, 3.0e-5], np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunOperatorOnce(core.CreateOperator("FloatToHalf", ["x"], ["h"]))
    h = workspace.FetchBlob("h")
    with np.errstate(over="ignore"):
        assert bits(h).tolist() == bits(x.astype(np.float16)).tolist()
    assert np.isinf(h[2]) and np.isinf(h[3])
    workspace.RunOperatorOnce(core.CreateOperator("FloatToHalf", ["x"], ["c"], clip=1))
    c = workspace.FetchBlob("c")
    assert c.tolist()[2:4] == [-65504.0, 65504.0]
    workspace.RunOperatorOnce(core.CreateOperator("HalfToFloat", ["h"], ["f"]))
    f = workspace.FetchBlob("f")
    assert f.dtype == np.float32
    np.testing.assert_array_equal(f, h.astype(np.float32))


def test_conversion_ops_name_the_dtype_they_need(fresh):
    workspace.FeedBlob("d", np.zeros(2, np.float64))
    with pytest.raises(errors.DataTypeError, match="float32") as e:
        workspace.RunOperatorOnce(core.CreateOperator("FloatToHalf", ["d"], ["h"]))
    assert e.value.blob == "d"
    with pytest.raises(errors.DataTypeError, match="float16"):
        workspace.RunOperatorOnce(core.CreateOperator("HalfToFloat", ["d"], ["f"]))


def test_conversion_gradients_are_the_opposite_conversions(fresh):
    net = core.Net("g")
    net.HalfToFloat(["h"], ["f"])
    net.FloatToHalf(["f"], ["h2"])
    net.HalfToFloat(["h2"], ["loss"])
    grads = net.AddGradientOperators(["loss"])
    types = [op.type for op in net.Proto().op[3:]]
    assert types[1:] == ["FloatToHalf", "HalfToFloat", "FloatToHalf"]
    assert str(grads["h"]) == "h_grad"


def test_float16_constant_fill(fresh):
    workspace.RunOperatorOnce(core.CreateOperator(
        "Float16ConstantFill", [], ["c"], shape=[2, 3], value=0.1))
    c = workspace.FetchBlob("c")
    assert c.dtype == np.float16 and c.shape == (2, 3)
    assert set(bits(c).ravel().tolist()) == {int(bits(np.array([0.1], np.float16))[0])}
    workspace.RunOperatorOnce(core.CreateOperator("Float16ConstantFill", [], ["z"], shape=[4]))
    assert workspace.FetchBlob("z").tolist() == [0.0] * 4


def test_float16_uniform_fill(fresh):
    op = core.CreateOperator("Float16UniformFill", [], ["u"], shape=[50, 40], min=-2.0, max=3.0)
    workspace.RunOperatorOnce(op)
    u = workspace.FetchBlob("u")
    assert u.dtype == np.float16 and u.shape == (50, 40)
    assert u.min() >= -2.0 and u.max() <= 3.0
    assert u.min() < -1.5 and u.max() > 2.5  # 2,000 draws spread over the range
    with pytest.raises(errors.InvalidArgumentError, match="bigger than min"):
        workspace.RunOperatorOnce(core.CreateOperator(
            "Float16UniformFill", [], ["u"], shape=[2], min=1.0, max=1.0))


def test_arithmetic_on_float16_is_a_typed_error_naming_the_supported_dtypes(fresh):
    workspace.FeedBlob("a", np.ones(2, np.float16))
    with pytest.raises(errors.DataTypeError, match="float32") as e:
        workspace.RunOperatorOnce(core.CreateOperator("Add", ["a", "a"], ["c"]))
    assert "float16" in str(e.value)


def test_generic_ops_move_halves_untouched(fresh):
    a = HALVES[:6].reshape(2, 3)
    workspace.FeedBlob("a", a)
    workspace.RunOperatorOnce(core.CreateOperator("Concat", ["a", "a"], ["c", "info"], axis=0))
    assert bits(workspace.FetchBlob("c")).tolist() == bits(np.concatenate([a, a])).tolist()
    workspace.RunOperatorOnce(core.CreateOperator("Copy", ["a"], ["b"]))
    assert bits(workspace.FetchBlob("b")).tolist() == bits(a).tolist()
    workspace.RunOperatorOnce(core.CreateOperator("Transpose", ["a"], ["t"]))
    assert bits(workspace.FetchBlob("t")).tolist() == bits(a.T).tolist()


def _minidb_records(path):
    """``[(key, value bytes)]`` of a minidb, parsed by hand."""
    data = open(path, "rb").read()
    records, at = [], 0
    while at < len(data):
        klen, vlen = np.frombuffer(data[at:at + 8], np.int32)
        at += 8
        records.append((data[at:at + klen].decode(), data[at + klen:at + klen + vlen]))
        at += klen + vlen
    return records


def _write_minidb(path, records):
    with open(path, "wb") as f:
        for key, value in records:
            key = key.encode()
            f.write(np.array([len(key), len(value)], np.int32).tobytes())
            f.write(key)
            f.write(value)


@pytest.mark.parametrize("db_type", ["ferro", "minidb"])
def test_save_and_load_keep_every_bit(fresh, tmp_path, db_type):
    path = str(tmp_path / ("h." + db_type))
    workspace.FeedBlob("h", HALVES.reshape(2, 6))
    workspace.FeedBlob("n", np.array([np.nan, 1.0], np.float16))
    workspace.RunOperatorOnce(core.CreateOperator(
        "Save", ["h", "n"], [], db=path, db_type=db_type, absolute_path=1))
    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator(
        "Load", [], ["h", "n"], db=path, db_type=db_type, absolute_path=1))
    h = workspace.FetchBlob("h")
    assert h.dtype == np.float16 and h.shape == (2, 6)
    assert bits(h).ravel().tolist() == bits(HALVES).tolist()
    assert bits(workspace.FetchBlob("n")).tolist() == bits(np.array([np.nan, 1.0], np.float16)).tolist()
    if db_type == "ferro":
        mapped = mmap_db(path, verify=True)
        assert bits(mapped["h"]).ravel().tolist() == bits(HALVES).tolist()


def test_minidb_holds_caffe2s_encoding(fresh, tmp_path):
    path = str(tmp_path / "h.minidb")
    workspace.FeedBlob("h", HALVES)
    workspace.RunOperatorOnce(core.CreateOperator(
        "Save", ["h"], [], db=path, db_type="minidb", absolute_path=1))
    ((key, value),) = _minidb_records(path)
    assert key == "h#%0"
    blob = caffe2_pb2.BlobProto()
    blob.ParseFromString(value)
    assert blob.type == "Tensor"
    t = blob.tensor
    assert t.data_type == caffe2_pb2.TensorProto.FLOAT16
    assert list(t.dims) == [len(HALVES)]
    assert list(t.int32_data) == bits(HALVES).tolist()


@pytest.mark.parametrize("as_bytes", [False, True])
def test_a_minidb_written_as_caffe2_did_loads(fresh, tmp_path, as_bytes):
    """Caffe2 wrote halves into int32_data, or with its
    caffe2_serialize_fp16_as_bytes flag, as little-endian byte_data."""
    values = np.array([1.0, -0.5, 0.1, 1024.0, -np.inf, 2.0], np.float16)
    records = []
    for chunk, (begin, end) in enumerate([(0, 4), (4, 6)]):
        blob = caffe2_pb2.BlobProto(name="h", type="Tensor")
        t = blob.tensor
        t.dims.extend([2, 3])
        t.data_type = caffe2_pb2.TensorProto.FLOAT16
        t.segment.begin, t.segment.end = begin, end
        if as_bytes:
            t.byte_data = values[begin:end].astype("<f2").tobytes()
        else:
            t.int32_data.extend(bits(values[begin:end]).tolist())
        records.append(("h#%%%d" % chunk, blob.SerializeToString()))
    path = str(tmp_path / "caffe2.minidb")
    _write_minidb(path, records)
    workspace.RunOperatorOnce(core.CreateOperator(
        "Load", [], ["h"], db=path, db_type="minidb", absolute_path=1))
    h = workspace.FetchBlob("h")
    assert h.dtype == np.float16
    assert bits(h).ravel().tolist() == bits(values).tolist()


def test_a_half_bit_pattern_out_of_range_is_a_corrupt_checkpoint(fresh, tmp_path):
    blob = caffe2_pb2.BlobProto(name="h", type="Tensor")
    blob.tensor.dims.append(1)
    blob.tensor.data_type = caffe2_pb2.TensorProto.FLOAT16
    blob.tensor.int32_data.append(70000)  # not a 16-bit pattern
    path = str(tmp_path / "bad.minidb")
    _write_minidb(path, [("h", blob.SerializeToString())])
    with pytest.raises(errors.CorruptCheckpointError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "Load", [], ["h"], db=path, db_type="minidb", absolute_path=1))


def test_blob_proto_bytes_and_tensor_proto_feeds(fresh):
    workspace.FeedBlob("h", HALVES)
    data = workspace.SerializeBlob("h")
    blob = caffe2_pb2.BlobProto()
    blob.ParseFromString(data)
    assert list(blob.tensor.int32_data) == bits(HALVES).tolist()
    workspace.DeserializeBlob("copy", data)
    assert bits(workspace.FetchBlob("copy")).tolist() == bits(HALVES).tolist()
    proto = caffe2_pb2.TensorProto(dims=[2], data_type=caffe2_pb2.TensorProto.FLOAT16)
    proto.int32_data.extend(bits(np.array([0.25, -8.0], np.float16)).tolist())
    workspace.FeedBlob("fed", proto)
    fed = workspace.FetchBlob("fed")
    assert fed.dtype == np.float16 and fed.tolist() == [0.25, -8.0]


def test_print_shows_half_values(fresh, capfd):
    workspace.FeedBlob("h", np.array([1.5, -2.0], np.float16))
    workspace.RunOperatorOnce(core.CreateOperator("Print", ["h"], []))
    err = capfd.readouterr().err
    assert "of type float16" in err and "1.5,-2" in err


def test_float16_round_trips_through_a_saved_dataset_like_blob_list(fresh, tmp_path):
    path = os.fspath(tmp_path / "many")
    names = ["h%d" % i for i in range(3)]
    for i, n in enumerate(names):
        workspace.FeedBlob(n, (np.arange(5) * (i + 1) / 7).astype(np.float16))
    workspace.RunOperatorOnce(core.CreateOperator(
        "Save", names, [], db=path, db_type="minidb", absolute_path=1, chunk_size=2))
    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator(
        "Load", [], [], db=path, db_type="minidb", absolute_path=1, load_all=1))
    for i, n in enumerate(names):
        want = (np.arange(5) * (i + 1) / 7).astype(np.float16)
        assert bits(workspace.FetchBlob(n)).tolist() == bits(want).tolist()


def test_cast_gradient_casts_back_to_from_type(fresh):
    net = core.Net("g")
    net.Cast(["x"], ["h"], to=core.DataType.FLOAT16, from_type="FLOAT")
    net.Cast(["h"], ["y"], to=core.DataType.FLOAT, from_type=core.DataType.FLOAT16)
    net.AveragedLoss(["y"], ["loss"])
    grads = net.AddGradientOperators(["loss"])
    casts = [op for op in net.Proto().op[4:] if op.type == "Cast"]
    assert [{a.name: a.i for a in op.arg} for op in casts] == [
        {"to": core.DataType.FLOAT16, "from_type": core.DataType.FLOAT},
        {"to": core.DataType.FLOAT, "from_type": core.DataType.FLOAT16},
    ]
    workspace.FeedBlob("x", np.arange(4, dtype=np.float32))
    workspace.RunNetOnce(net)
    g = workspace.FetchBlob(grads["x"])
    assert g.dtype == np.float32 and g.tolist() == [0.25] * 4
    bare = core.Net("bare")
    bare.Cast(["x"], ["z"], to=core.DataType.DOUBLE)
    bare.AveragedLoss(["z"], ["l"])
    with pytest.raises(errors.InvalidArgumentError, match="from_type"):
        bare.AddGradientOperators(["l"])


def test_scatter_assign_moves_halves(fresh):
    data = np.zeros((4, 2), np.float16)
    workspace.FeedBlob("d", data)
    workspace.FeedBlob("i", np.array([2, 0], np.int64))
    workspace.FeedBlob("s", np.array([[1.5, -2.0], [0.25, 8.0]], np.float16))
    workspace.RunOperatorOnce(core.CreateOperator("ScatterAssign", ["d", "i", "s"], ["d"]))
    want = data.copy()
    want[[2, 0]] = np.array([[1.5, -2.0], [0.25, 8.0]], np.float16)
    got = workspace.FetchBlob("d")
    assert got.dtype == np.float16 and bits(got).tolist() == bits(want).tolist()
