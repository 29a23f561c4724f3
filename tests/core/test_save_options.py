"""Save's ``options`` argument (Caffe2's SerializationOptions: per-blob
chunk sizes and bfloat16 storage of float32 tensors), checked by reading
the minidb records by hand and decoding bfloat16 with numpy.
"""

import math
import struct

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace
from ferrocaffe.proto import caffe2_pb2

Opt = caffe2_pb2.BlobSerializationOptions


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def records(path):
    """{blob name: [BlobProto of each record]} of a minidb, parsed by hand."""
    data = open(path, 'rb').read()
    out, at = {}, 0
    while at < len(data):
        kl, vl = struct.unpack_from('=ii', data, at)
        at += 8
        key = data[at:at + kl].decode()
        proto = caffe2_pb2.BlobProto()
        proto.ParseFromString(data[at + kl:at + kl + vl])
        out.setdefault(key.rsplit('#%', 1)[0], []).append(proto)
        at += kl + vl
    return out


def save(path, names, **kwargs):
    workspace.RunOperatorOnce(core.CreateOperator(
        'Save', names, [], db=path, db_type='minidb', absolute_path=1, **kwargs))


def load(path, names):
    workspace.RunOperatorOnce(core.CreateOperator(
        'Load', [], names, db=path, db_type='minidb', absolute_path=1))


def test_first_matching_rule_sets_the_chunk_size(tmp_path):
    n = 103
    blobs = {
        'int16_data': np.arange(n, dtype=np.int16),
        'uint16_data': np.arange(n, dtype=np.uint16),
        'float16_data': np.linspace(0, 1, n).astype(np.float16),
        'int64_data': np.arange(n, dtype=np.int64) * 3,
        'whole': np.arange(n, dtype=np.float64),
    }
    for k, v in blobs.items():
        workspace.FeedBlob(k, v)
    path = str(tmp_path / 'db')
    options = caffe2_pb2.SerializationOptions(options=[
        Opt(blob_name_regex='int16_data', chunk_size=10),
        Opt(blob_name_regex='.*16_data', chunk_size=20),
        Opt(blob_name_regex='float16_data', chunk_size=30),  # shadowed
        Opt(blob_name_regex='whole', chunk_size=-1),           # no chunking
        # A pattern must match the whole name: this matches no blob.
        Opt(blob_name_regex='int64', chunk_size=1),
    ])
    save(path, list(blobs), chunk_size=40, options=options)
    got = {k: len(v) for k, v in records(path).items()}
    assert got == {
        'int16_data': math.ceil(n / 10),
        'uint16_data': math.ceil(n / 20),
        'float16_data': math.ceil(n / 20),
        'int64_data': math.ceil(n / 40),  # the chunk_size argument
        'whole': 1,
    }
    workspace.ResetWorkspace()
    load(path, list(blobs))
    for k, v in blobs.items():
        np.testing.assert_array_equal(workspace.FetchBlob(k), v)


def test_a_rule_without_pattern_matches_everything_and_zero_is_the_default(tmp_path):
    workspace.FeedBlob('a', np.zeros(2_500_000, dtype=np.int8))
    path = str(tmp_path / 'db')
    save(path, ['a'], chunk_size=7,
         options=caffe2_pb2.SerializationOptions(options=[Opt(chunk_size=0)]))
    # 0 in an option is the default size (1,000,000), not the argument's 7.
    assert len(records(path)['a']) == 3


def bfloat16_model(x):
    """float32 -> nearest bfloat16 (ties to even), back to float32, in numpy."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return (rounded.astype(np.uint32) << 16).view(np.float32)


def test_bfloat16_storage_halves_the_record_and_rounds_to_nearest(tmp_path):
    rng = np.random.default_rng(5)
    x = np.concatenate([
        rng.standard_normal(997).astype(np.float32) * 100,
        # Exact ties either way, and values bfloat16 holds exactly.
        np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1.5, -2.0, 0.0, np.inf], np.float32),
    ])
    workspace.FeedBlob('f1', x)
    workspace.FeedBlob('f2', x)
    workspace.FeedBlob('d', x.astype(np.float64))
    path = str(tmp_path / 'db')
    save(path, ['f1', 'f2', 'd'], options=caffe2_pb2.SerializationOptions(options=[
        Opt(blob_name_regex='f1|d', float_format=Opt.FLOAT_BFLOAT16)]))
    recs = records(path)
    t1, t2 = recs['f1'][0].tensor, recs['f2'][0].tensor
    assert t1.data_type == caffe2_pb2.TensorProto.FLOAT
    assert t1.data_format == caffe2_pb2.TensorProto.FMT_BFLOAT16
    assert len(t1.raw_data) == 2 * x.size and len(t1.float_data) == 0
    assert len(recs['f1'][0].SerializeToString()) < 0.6 * len(recs['f2'][0].SerializeToString())
    # Only float32 is affected: the float64 blob is stored exactly.
    assert len(recs['d'][0].tensor.double_data) == x.size
    workspace.ResetWorkspace()
    load(path, ['f1', 'f2', 'd'])
    f1 = workspace.FetchBlob('f1')
    assert f1.dtype == np.float32
    np.testing.assert_array_equal(f1, bfloat16_model(x))
    assert f1[-6] == 1.0 and f1[-5] == 1 + 2 ** -6  # ties to even
    np.testing.assert_array_equal(workspace.FetchBlob('f2'), x)
    np.testing.assert_array_equal(workspace.FetchBlob('d'), x.astype(np.float64))


def test_bfloat16_chunks_and_nan(tmp_path):
    x = np.array([np.nan, 1.0, -np.nan, 3.0, 5.0], np.float32)
    workspace.FeedBlob('x', x)
    path = str(tmp_path / 'db')
    save(path, ['x'], options=caffe2_pb2.SerializationOptions(options=[
        Opt(chunk_size=2, float_format=Opt.FLOAT_BFLOAT16)]))
    assert len(records(path)['x']) == 3
    load(path, ['x'])
    got = workspace.FetchBlob('x')
    assert np.isnan(got[0]) and np.isnan(got[2])
    np.testing.assert_array_equal(got[[1, 3, 4]], [1.0, 3.0, 5.0])


def test_bfloat16_blob_proto_written_by_hand_loads(tmp_path):
    # A record the way Caffe2 wrote one: little-endian bfloat16 in raw_data.
    proto = caffe2_pb2.BlobProto(name='w', type='Tensor')
    proto.tensor.dims.extend([2])
    proto.tensor.data_type = caffe2_pb2.TensorProto.FLOAT
    proto.tensor.data_format = caffe2_pb2.TensorProto.FMT_BFLOAT16
    proto.tensor.raw_data = np.array([0x3FC0, 0xC020], '<u2').tobytes()  # 1.5, -2.5
    workspace.DeserializeBlob('w', proto.SerializeToString())
    np.testing.assert_array_equal(workspace.FetchBlob('w'), np.array([1.5, -2.5], np.float32))
    proto.tensor.raw_data = b'\x00'
    with pytest.raises(errors.CorruptCheckpointError, match='bfloat16'):
        workspace.DeserializeBlob('w', proto.SerializeToString())


def test_bad_options_are_typed_errors_naming_save(tmp_path):
    workspace.FeedBlob('x', np.zeros(3, np.float32))
    path = str(tmp_path / 'db')
    with pytest.raises(errors.InvalidArgumentError, match='unable to parse serialization options') as e:
        save(path, ['x'], options=b'\xff\xff')
    assert 'Save' in str(e.value)
    with pytest.raises(errors.InvalidArgumentError, match='blob_name_regex'):
        save(path, ['x'], options=caffe2_pb2.SerializationOptions(options=[Opt(blob_name_regex='(')]))
    with pytest.raises(errors.InvalidArgumentError, match='chunk_size'):
        save(path, ['x'], options=caffe2_pb2.SerializationOptions(options=[Opt(chunk_size=-5)]))
