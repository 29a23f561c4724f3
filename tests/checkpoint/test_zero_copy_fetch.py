"""Fetching without a copy (``FetchBlob(name, copy=False)``, issue 11 item 6):
a read-only numpy view of the tensor's shared, copy-on-write buffer. Later
writes to the blob (ops in place, Load, feeds, resets) must never change
an array already handed out; the default fetch stays a writable copy of
its own. Expected values are computed in numpy from the fed arrays."""

import gc
import os

import numpy as np
import pytest

from ferrocaffe import core, workspace


def run(op_type, inputs, outputs, **kwargs):
    workspace.RunOperatorOnce(core.CreateOperator(op_type, inputs, outputs, **kwargs))


def test_zero_copy_fetch_is_read_only_and_equal(fresh):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    workspace.FeedBlob("x", x)
    a = workspace.FetchBlob("x", copy=False)
    assert isinstance(a, np.ndarray)
    assert a.dtype == np.float32 and a.shape == (3, 4)
    np.testing.assert_array_equal(a, x)
    assert not a.flags.writeable
    assert a.flags.c_contiguous
    with pytest.raises(ValueError, match="read-only"):
        a[0, 0] = 5.0
    with pytest.raises(ValueError):
        a.setflags(write=True)  # the base does not own writable memory
    np.testing.assert_array_equal(a, x)


def test_two_zero_copy_fetches_share_one_buffer(fresh):
    workspace.FeedBlob("x", np.ones((64, 64), dtype=np.float64))
    a = workspace.FetchBlob("x", copy=False)
    b = workspace.current_workspace().fetch_blob("x", copy=False)
    c = workspace.current_workspace().blobs["x"].fetch(copy=False)
    assert np.shares_memory(a, b) and np.shares_memory(b, c)
    assert a.ctypes.data == b.ctypes.data
    assert type(a.base).__name__ == "TensorBuffer"
    # The default fetch is a writable array of its own.
    d = workspace.FetchBlob("x")
    assert d.flags.writeable and d.flags.owndata
    assert not np.shares_memory(a, d)
    d[0, 0] = 7.0
    np.testing.assert_array_equal(workspace.FetchBlob("x"), np.ones((64, 64)))
    np.testing.assert_array_equal(a, np.ones((64, 64)))


def test_fetch_blobs_take_the_keyword(fresh):
    workspace.FeedBlob("p", np.array([1, 2], dtype=np.int32))
    workspace.FeedBlob("q", np.array([True, False]))
    p, q = workspace.FetchBlobs(["p", "q"], copy=False)
    assert not p.flags.writeable and not q.flags.writeable
    np.testing.assert_array_equal(p, [1, 2])
    np.testing.assert_array_equal(q, [True, False])
    assert all(a.flags.writeable for a in workspace.FetchBlobs(["p", "q"]))


def test_in_place_ops_leave_a_fetched_array_unchanged(fresh):
    rng = np.random.default_rng(3)
    x = rng.random((128, 33), dtype=np.float32)
    y = rng.random((128, 33), dtype=np.float32)
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("y", y)
    seen = workspace.FetchBlob("x", copy=False)
    run("Add", ["x", "y"], ["x"])  # in place
    after_add = workspace.FetchBlob("x", copy=False)
    run("Scale", ["x"], ["x"], scale=3.0)  # in place
    np.testing.assert_array_equal(seen, x)
    np.testing.assert_allclose(after_add, x + y, rtol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("x"), (x + y) * np.float32(3.0), rtol=1e-6)
    assert not np.shares_memory(seen, after_add)


def test_feeding_over_a_fetched_tensor_leaves_the_array(fresh):
    # Same dtype and shape: the feed would reuse the buffer if it were not
    # shared with the array.
    workspace.FeedBlob("x", np.full((1000,), 2, dtype=np.int64))
    a = workspace.FetchBlob("x", copy=False)
    workspace.FeedBlob("x", np.full((1000,), 5, dtype=np.int64))
    np.testing.assert_array_equal(a, np.full((1000,), 2))
    np.testing.assert_array_equal(workspace.FetchBlob("x"), np.full((1000,), 5))
    # Once the array is gone the buffer is the blob's alone again.
    del a
    gc.collect()
    b = workspace.FetchBlob("x", copy=False)
    np.testing.assert_array_equal(b, np.full((1000,), 5))


def test_load_over_a_fetched_tensor_leaves_the_array(fresh, tmp_path):
    rng = np.random.default_rng(5)
    old = rng.standard_normal((256, 17)).astype(np.float32)
    new = rng.standard_normal((256, 17)).astype(np.float32)
    db = os.path.join(str(tmp_path), "ckpt")
    workspace.FeedBlob("w", new)
    run("Save", ["w"], [], db=db, db_type="ferro", absolute_path=True)
    workspace.FeedBlob("w", old)
    a = workspace.FetchBlob("w", copy=False)
    run("Load", [], ["w"], db=db, db_type="ferro", absolute_path=True)
    np.testing.assert_array_equal(a, old)
    b = workspace.FetchBlob("w", copy=False)
    np.testing.assert_array_equal(b, new)
    # Loading again (same shape and dtype) while b is out: b keeps its values.
    run("Scale", ["w"], ["w"], scale=2.0)
    run("Load", [], ["w"], db=db, db_type="ferro", absolute_path=True)
    np.testing.assert_array_equal(b, new)
    np.testing.assert_array_equal(workspace.FetchBlob("w"), new)


def test_fetched_array_outlives_blob_and_workspace(fresh):
    x = np.linspace(-1, 1, 4096).astype(np.float64).reshape(64, 64)
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("z", x[::-1].copy())
    a = workspace.FetchBlob("x", copy=False)
    z = workspace.FetchBlob("z", copy=False)
    workspace.ResetBlob("x")
    np.testing.assert_array_equal(a, x)
    workspace.ResetWorkspace()
    assert not workspace.HasBlob("z")
    # Memory the blob used is still the array's: allocate over it and look.
    junk = [np.full((64, 64), 9.0) for _ in range(64)]
    gc.collect()
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(z, x[::-1])
    del junk


def test_fetched_array_outlives_a_dropped_workspace():
    ws = workspace.Workspace()
    x = np.arange(100, dtype=np.uint16)
    ws.feed_blob("x", x)
    a = ws.fetch_blob("x", copy=False)
    del ws
    gc.collect()
    np.testing.assert_array_equal(a, x)
    assert a.base is not None


def test_every_numeric_dtype_and_odd_shapes(fresh):
    for dt in (np.float32, np.float64, np.int32, np.int64, np.bool_, np.uint8,
               np.int8, np.int16, np.uint16):
        x = (np.arange(24) % 3).astype(dt).reshape(2, 3, 4)
        workspace.FeedBlob("x", x)
        a = workspace.FetchBlob("x", copy=False)
        assert a.dtype == x.dtype
        np.testing.assert_array_equal(a, x)
        assert not a.flags.writeable
    for x in (np.float32(2.5), np.zeros((0, 3), np.float32), np.zeros((3, 0), np.int64)):
        workspace.FeedBlob("x", x)
        a = workspace.FetchBlob("x", copy=False)
        assert a.shape == np.shape(x) and a.dtype == x.dtype
        np.testing.assert_array_equal(a, x)
        assert not a.flags.writeable


def test_a_transposed_result_is_viewed_with_its_strides(fresh):
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    workspace.FeedBlob("x", x)
    run("Transpose", ["x"], ["t"])
    a = workspace.FetchBlob("t", copy=False)
    np.testing.assert_array_equal(a, x.T)
    np.testing.assert_array_equal(np.ascontiguousarray(a), x.T)


def test_strings_bytes_and_the_default_copy(fresh):
    s = np.array([b"ab", b"", b"xyz"], dtype=object)
    workspace.FeedBlob("s", s)
    a = workspace.FetchBlob("s", copy=False)
    assert a.dtype == object and list(a) == [b"ab", b"", b"xyz"]
    assert not a.flags.writeable
    workspace.FeedBlob("b", b"raw")
    assert workspace.FetchBlob("b", copy=False) == b"raw"
    # Default: writable, independent, unchanged by later ops.
    x = np.arange(10, dtype=np.float32)
    workspace.FeedBlob("x", x)
    c = workspace.FetchBlob("x")
    c += 1
    np.testing.assert_array_equal(workspace.FetchBlob("x"), x)
    run("Scale", ["x"], ["x"], scale=2.0)
    np.testing.assert_array_equal(c, x + 1)


def test_tensor_handle_data_is_a_snapshot_whose_writes_reach_the_blob(fresh):
    # Blob.tensor().data (Caffe2's TensorCPU.data): later ops do not change
    # an array already handed out; item writes through it reach the blob.
    x = np.arange(8, dtype=np.float32)
    ws = workspace.current_workspace()
    ws.feed_blob("x", x)
    h = ws.blobs["x"].tensor()
    d = h.data
    np.testing.assert_array_equal(d, x)
    run("Scale", ["x"], ["x"], scale=-1.0)
    np.testing.assert_array_equal(d, x)
    np.testing.assert_array_equal(h.data, -x)
    h.data[3] = 100.0
    np.testing.assert_array_equal(ws.fetch_blob("x"), [0, -1, -2, 100, -4, -5, -6, -7])
    assert h.shape == (8,)
