"""The index ops (IntIndexCreate, LongIndexCreate, StringIndexCreate,
IndexGet, IndexLoad, IndexStore, IndexFreeze, IndexSize) and saving an
index with Save/Load, checked against a plain-Python model of Caffe2's
index: ids 1, 2, ... in order of first appearance, 0 for unknown keys once
frozen, at most max_elements ids counting the reserved 0.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ferrocaffe import core, errors, workspace


@pytest.fixture(autouse=True)
def _fresh_workspace():
    workspace.ResetWorkspace()
    yield
    workspace.ResetWorkspace()


def run_op(op_type, inputs, outputs, **kwargs):
    workspace.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, **kwargs))


class ModelIndex:
    """Caffe2's index, in plain Python."""

    def __init__(self, max_elements=2 ** 31 - 1):
        self.max_elements = max_elements
        self.keys = []
        self.frozen = False

    def get(self, query):
        ids = {k: i + 1 for i, k in enumerate(self.keys)}
        if self.frozen:
            return [ids.get(k, 0) for k in query]
        out, new = [], []
        for k in query:
            if k not in ids:
                new.append(k)
                ids[k] = len(self.keys) + len(new)
            out.append(ids[k])
        if len(self.keys) + len(new) + 1 > self.max_elements:
            raise OverflowError
        self.keys.extend(new)
        return out

    def size(self):
        return len(self.keys) + 1


CASES = [
    ('IntIndexCreate', np.int32, lambda i: i * 7 - 20),
    ('LongIndexCreate', np.int64, lambda i: i * 2 ** 40),
    ('StringIndexCreate', object, lambda i: ('key%d' % i).encode()),
]


@pytest.mark.parametrize('create,dtype,key', CASES)
def test_get_freeze_store_size_follow_the_model(create, dtype, key):
    model = ModelIndex(max_elements=10)
    run_op(create, [], ['ix'], max_elements=10)
    q1 = [key(i) for i in (3, 1, 3, 0, 1)]
    workspace.FeedBlob('q', np.array(q1, dtype=dtype))
    run_op('IndexGet', ['ix', 'q'], ['ids'])
    got = workspace.FetchBlob('ids')
    assert got.dtype == np.int64
    assert got.tolist() == model.get(q1) == [1, 2, 1, 3, 2]

    run_op('IndexFreeze', ['ix'], ['ix'])
    model.frozen = True
    q2 = np.array([key(i) for i in (5, 0, 1, 9)], dtype=dtype).reshape(2, 2)
    workspace.FeedBlob('q', q2)
    run_op('IndexGet', ['ix', 'q'], ['ids'])
    got = workspace.FetchBlob('ids')
    assert got.shape == (2, 2)
    assert got.ravel().tolist() == model.get(list(q2.ravel())) == [0, 3, 2, 0]

    run_op('IndexSize', ['ix'], ['n'])
    n = workspace.FetchBlob('n')
    assert n.shape == () and n.dtype == np.int64 and int(n) == model.size() == 4

    run_op('IndexStore', ['ix'], ['stored'])
    stored = workspace.FetchBlob('stored')
    assert list(stored) == model.keys == [key(3), key(1), key(0)]


@pytest.mark.parametrize('create,dtype,key', CASES)
def test_load_skip_first_entry_and_reload_into_a_frozen_index(create, dtype, key):
    run_op(create, [], ['ix'])
    run_op('IndexFreeze', ['ix'], ['ix'])
    items = [key(i) for i in (10, 11, 12, 13)]
    workspace.FeedBlob('items', np.array(items, dtype=dtype))
    run_op('IndexLoad', ['ix', 'items'], ['ix'], skip_first_entry=1)
    workspace.FeedBlob('q', np.array([key(10), key(13), key(11)], dtype=dtype))
    run_op('IndexGet', ['ix', 'q'], ['ids'])
    # Still frozen: the skipped key stays unknown.
    assert workspace.FetchBlob('ids').tolist() == [0, 3, 1]
    run_op('IndexSize', ['ix'], ['n'])
    assert int(workspace.FetchBlob('n')) == 4


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(-5, 5), max_size=6), max_size=6),
       st.integers(1, 12))
def test_random_gets_match_the_model(batches, max_elements):
    workspace.ResetWorkspace()
    model = ModelIndex(max_elements)
    run_op('LongIndexCreate', [], ['ix'], max_elements=max_elements)
    for b in batches:
        workspace.FeedBlob('q', np.array(b, dtype=np.int64))
        try:
            want = model.get(b)
        except OverflowError:
            with pytest.raises(errors.OperatorError, match='max_elements'):
                run_op('IndexGet', ['ix', 'q'], ['ids'])
        else:
            run_op('IndexGet', ['ix', 'q'], ['ids'])
            assert workspace.FetchBlob('ids').tolist() == want
        run_op('IndexSize', ['ix'], ['n'])
        assert int(workspace.FetchBlob('n')) == model.size()
    run_op('IndexStore', ['ix'], ['stored'])
    assert workspace.FetchBlob('stored').tolist() == model.keys


@pytest.mark.parametrize('db_type', ['minidb', 'ferro'])
@pytest.mark.parametrize('create,dtype,key', CASES)
def test_save_and_load_keep_keys_limit_and_frozen_flag(tmp_path, db_type, create, dtype, key):
    run_op(create, [], ['ix'], max_elements=4)
    run_op(create, [], ['open'], max_elements=4)
    workspace.FeedBlob('items', np.array([key(1), key(2)], dtype=dtype))
    run_op('IndexLoad', ['ix', 'items'], ['ix'])
    run_op('IndexLoad', ['open', 'items'], ['open'])
    run_op('IndexFreeze', ['ix'], ['ix'])
    db = str(tmp_path / 'index.db')
    run_op('Save', ['ix', 'open'], [], db=db, db_type=db_type, absolute_path=1)
    workspace.ResetWorkspace()
    workspace.FeedBlob('ix', np.zeros(3, dtype=np.float32))
    run_op('Load', [], ['ix', 'open'], db=db, db_type=db_type, absolute_path=1)
    workspace.FeedBlob('q', np.array([key(2), key(7), key(1)], dtype=dtype))
    run_op('IndexGet', ['ix', 'q'], ['ids'])
    assert workspace.FetchBlob('ids').tolist() == [2, 0, 1]
    # The unfrozen copy adds key 7 as id 3; a fourth id passes max_elements 4.
    run_op('IndexGet', ['open', 'q'], ['ids'])
    assert workspace.FetchBlob('ids').tolist() == [2, 3, 1]
    workspace.FeedBlob('q', np.array([key(8)], dtype=dtype))
    with pytest.raises(errors.OperatorError, match='max_elements 4'):
        run_op('IndexGet', ['open', 'q'], ['ids'])


def test_caffe2_blob_proto_layout():
    from ferrocaffe.proto import caffe2_pb2
    run_op('IntIndexCreate', [], ['ix'], max_elements=9)
    workspace.FeedBlob('items', np.array([4, 2], dtype=np.int32))
    run_op('IndexLoad', ['ix', 'items'], ['ix'])
    run_op('IndexFreeze', ['ix'], ['ix'])
    proto = caffe2_pb2.BlobProto()
    proto.ParseFromString(workspace.SerializeBlob('ix'))
    assert proto.type == 'std::unique_ptr<caffe2::IndexBase>'
    assert proto.content == b'9 1'
    assert list(proto.tensor.dims) == [2]
    assert proto.tensor.data_type == caffe2_pb2.TensorProto.INT32
    assert list(proto.tensor.int32_data) == [4, 2]
    # A BlobProto written by hand the way Caffe2 wrote one loads back.
    proto.content = b'4 0'
    workspace.DeserializeBlob('copy', proto.SerializeToString())
    workspace.FeedBlob('q', np.array([2, 5], dtype=np.int32))
    run_op('IndexGet', ['copy', 'q'], ['ids'])
    assert workspace.FetchBlob('ids').tolist() == [2, 3]


def test_bad_input_is_a_typed_error_naming_op_and_blob():
    run_op('LongIndexCreate', [], ['ix'], max_elements=3)
    workspace.FeedBlob('ints', np.array([1, 2], dtype=np.int32))
    with pytest.raises(errors.DataTypeError, match=r"int64 keys.*int32") as e:
        run_op('IndexGet', ['ix', 'ints'], ['ids'])
    assert 'IndexGet' in str(e.value) and 'ints' in str(e.value)
    workspace.FeedBlob('dup', np.array([5, 6, 5], dtype=np.int64))
    with pytest.raises(errors.InvalidArgumentError, match='repeated') as e:
        run_op('IndexLoad', ['ix', 'dup'], ['ix'])
    assert 'IndexLoad' in str(e.value) and 'dup' in str(e.value)
    workspace.FeedBlob('many', np.arange(4, dtype=np.int64))
    with pytest.raises(errors.InvalidArgumentError, match='max_elements'):
        run_op('IndexLoad', ['ix', 'many'], ['ix'])
    workspace.FeedBlob('empty', np.zeros(0, dtype=np.int64))
    with pytest.raises(errors.ShapeError, match='skip_first_entry'):
        run_op('IndexLoad', ['ix', 'empty'], ['ix'], skip_first_entry=1)
    # Failed loads left the index empty.
    run_op('IndexSize', ['ix'], ['n'])
    assert int(workspace.FetchBlob('n')) == 1
    workspace.FeedBlob('t', np.zeros(2, dtype=np.float32))
    with pytest.raises(errors.DataTypeError, match='Index') as e:
        run_op('IndexSize', ['t'], ['n'])
    assert "'t'" in str(e.value)
    with pytest.raises(errors.InvalidArgumentError, match='max_elements'):
        run_op('IntIndexCreate', [], ['bad'], max_elements=0)
    with pytest.raises(errors.InvalidArgumentError, match='in-place'):
        run_op('IndexFreeze', ['ix'], ['other'])


def test_shape_inference_of_get_and_size():
    from ferrocaffe.proto import caffe2_pb2
    workspace.FeedBlob('keys', np.zeros((2, 3), np.int64))
    net = core.Net('index_shapes')
    net.LongIndexCreate([], 'ix')
    net.IndexGet(['ix', 'keys'], 'ids')
    net.IndexSize('ix', 'n')
    shapes, types = workspace.InferShapesAndTypes([net])
    assert shapes['ids'] == [2, 3] and types['ids'] == caffe2_pb2.TensorProto.INT64
    assert shapes['n'] == [] and types['n'] == caffe2_pb2.TensorProto.INT64
    workspace.RunNetOnce(net)
    assert workspace.FetchBlob('ids').shape == (2, 3) and workspace.FetchBlob('n').shape == ()
