"""Tests of ferrocaffe.workspace: feeding and fetching every dtype, blob
management, the named-workspace registry, child workspaces, nets and plans
run through the module-level functions.

Expected values are written out by hand or computed with numpy from the
inputs, never read back from the runtime."""

import gc
import os
import threading

import numpy as np
import pytest

from ferrocaffe import core, errors, proto, workspace


def counter_net(name, counter, init):
    """A net that makes a counter with `init` and bumps it once."""
    net = core.Net(name)
    net.CreateCounter([], [counter], init_count=init)
    net.CountUp([counter], [counter + "_prev"])
    return net


# ------------------------------------------------------------ FeedBlob --

NUMERIC_DTYPES = [
    np.float32,
    np.float64,
    np.int32,
    np.int64,
    np.bool_,
    np.uint8,
    np.int8,
    np.int16,
    np.uint16,
]
SHAPES = [(0,), (1,), (5,), (2, 3), (2, 0, 4), (3, 1, 2, 2)]


def sample(dtype, shape):
    n = int(np.prod(shape))
    if dtype is np.bool_:
        flat = np.array([i % 3 == 0 for i in range(n)], dtype=np.bool_)
    elif np.issubdtype(dtype, np.floating):
        flat = (np.arange(n, dtype=np.float64) * 1.25 - 3.5).astype(dtype)
    else:
        info = np.iinfo(dtype)
        # Include both extremes of the type.
        vals = [info.min, info.max] + [i * 7 % 100 for i in range(max(n - 2, 0))]
        flat = np.array(vals[:n], dtype=dtype)
    return flat.reshape(shape)


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_feed_fetch_round_trip(fresh, dtype, shape):
    arr = sample(dtype, shape)
    assert workspace.FeedBlob("x", arr) is True
    out = workspace.FetchBlob("x")
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.dtype(dtype)
    assert out.shape == shape
    assert np.array_equal(out, arr)


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES, ids=lambda d: np.dtype(d).name)
def test_zero_dim_scalars(fresh, dtype):
    value = np.array(1, dtype=dtype)
    workspace.FeedBlob("s", value)
    out = workspace.FetchBlob("s")
    assert out.shape == ()
    assert out.dtype == np.dtype(dtype)
    assert out == value
    # numpy scalars (np.generic) are fed as 0-dim arrays too.
    workspace.FeedBlob("g", dtype(0))
    out = workspace.FetchBlob("g")
    assert out.shape == () and out.dtype == np.dtype(dtype) and out == dtype(0)


def test_float_extremes_survive(fresh):
    arr = np.array([np.inf, -np.inf, -0.0, np.finfo(np.float32).tiny, np.finfo(np.float32).max], dtype=np.float32)
    workspace.FeedBlob("f", arr)
    out = workspace.FetchBlob("f")
    assert np.array_equal(out, arr)
    assert np.signbit(out[2])
    nan = np.array([np.nan, 1.0], dtype=np.float64)
    workspace.FeedBlob("n", nan)
    out = workspace.FetchBlob("n")
    assert np.isnan(out[0]) and out[1] == 1.0


def test_non_contiguous_arrays(fresh):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    views = {
        "strided": base[:, ::2],
        "transposed": base.T,
        "reversed": base[::-1, ::-3],
        "fortran": np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)),
        "column": base[:, 1],
    }
    for name, view in views.items():
        expected = np.array(view, copy=True, order="C")
        workspace.FeedBlob(name, view)
        out = workspace.FetchBlob(name)
        assert out.shape == expected.shape, name
        assert out.dtype == expected.dtype, name
        assert np.array_equal(out, expected), name


def test_string_arrays_become_object_arrays_of_bytes(fresh):
    workspace.FeedBlob("u", np.array(["a", "bc", "", "héllo"]))
    out = workspace.FetchBlob("u")
    assert out.dtype == object
    assert out.shape == (4,)
    assert list(out) == [b"a", b"bc", b"", "héllo".encode("utf-8")]

    workspace.FeedBlob("b", np.array([[b"x", b"yz"], [b"", b"\x00\xff"]]))
    out = workspace.FetchBlob("b")
    assert out.dtype == object and out.shape == (2, 2)
    assert out.tolist() == [[b"x", b"yz"], [b"", b"\x00\xff"]]

    mixed = np.array(["s", b"b"], dtype=object)
    workspace.FeedBlob("m", mixed)
    assert workspace.FetchBlob("m").tolist() == [b"s", b"b"]

    workspace.FeedBlob("z", np.array("scalar"))
    out = workspace.FetchBlob("z")
    assert out.shape == () and out.dtype == object and out.item() == b"scalar"


def test_str_and_bytes_blobs_fetch_as_bytes(fresh):
    workspace.FeedBlob("s", "héllo")
    assert workspace.FetchBlob("s") == "héllo".encode("utf-8")
    workspace.FeedBlob("b", b"\x00raw\xff")
    assert workspace.FetchBlob("b") == b"\x00raw\xff"
    workspace.FeedBlob("e", "")
    assert workspace.FetchBlob("e") == b""


def test_python_scalars_go_through_np_asarray(fresh):
    for name, value in [("i", 3), ("neg", -7), ("f", 2.5), ("t", True), ("n", False)]:
        workspace.FeedBlob(name, value)
        out = workspace.FetchBlob(name)
        expected = np.asarray(value)
        assert isinstance(out, np.ndarray), name
        assert out.dtype == expected.dtype, name
        assert out.shape == (), name
        assert out == expected, name


def test_feed_overwrites_with_a_new_dtype_and_shape(fresh):
    workspace.FeedBlob("x", np.ones((2, 2), np.float32))
    workspace.FeedBlob("x", np.array([7], np.int16))
    out = workspace.FetchBlob("x")
    assert out.dtype == np.int16 and out.tolist() == [7]
    workspace.FeedBlob("x", "now bytes")
    assert workspace.FetchBlob("x") == b"now bytes"


def test_fetch_returns_a_copy(fresh):
    arr = np.arange(6, dtype=np.int32)
    workspace.FeedBlob("x", arr)
    arr[0] = 100  # the blob was fed a copy
    first = workspace.FetchBlob("x")
    assert first.tolist() == [0, 1, 2, 3, 4, 5]
    first.fill(9)  # mutating a fetched array does not touch the blob
    second = workspace.FetchBlob("x")
    assert second.tolist() == [0, 1, 2, 3, 4, 5]
    assert not np.shares_memory(first, second)


def test_feed_blob_accepts_blob_references_and_bytes_names(fresh):
    workspace.FeedBlob(core.BlobReference("r"), np.array([1.5], np.float32))
    assert workspace.FetchBlob("r").tolist() == [1.5]
    assert workspace.FetchBlob(b"r").tolist() == [1.5]
    assert workspace.HasBlob(core.BlobReference("r"))


UNSUPPORTED = {
    "list": [1, 2, 3],
    "dict": {"a": 1},
    "object_ints": np.array([1, 2], dtype=object),
    "object_none": np.array([None], dtype=object),
    "none": None,
    "complex": np.zeros(2, np.complex64),
    "tuple": (1, 2),
    "set": {1},
    "uint64": np.zeros(2, np.uint64),
    "structured": np.zeros(2, dtype=[("a", "i4")]),
    "bytearray": bytearray(b"xy"),
    # str that has no UTF-8 encoding (a lone surrogate), alone or in an array
    "lone_surrogate": "\ud800",
    "lone_surrogate_array": np.array(["ok", "\ud800"], dtype=object),
}


@pytest.mark.parametrize("what", list(UNSUPPORTED))
def test_unsupported_objects_raise_feed_error(fresh, what):
    name = f"bad_{what}"
    workspace.FeedBlob(name, np.array([4, 5], np.int64))
    with pytest.raises(errors.FeedError) as info:
        workspace.FeedBlob(name, UNSUPPORTED[what])
    e = info.value
    assert isinstance(e, TypeError)
    assert isinstance(e, errors.FerrocaffeError)
    assert e.blob == name
    assert name in str(e)
    # A failed feed leaves the old content alone.
    assert workspace.FetchBlob(name).tolist() == [4, 5]


# ------------------------------------------------------- blob management --


def test_has_blobs_create_reset(fresh):
    assert workspace.Blobs() == []
    assert not workspace.HasBlob("a")
    assert workspace.CreateBlob("a") is True
    assert workspace.HasBlob("a")
    # An empty blob fetches as a description, not an array.
    assert isinstance(workspace.FetchBlob("a"), bytes)
    workspace.FeedBlob("b", np.array([1.0], np.float32))
    workspace.FeedBlob("c", "text")
    assert sorted(workspace.Blobs()) == ["a", "b", "c"]
    # CreateBlob of an existing blob keeps its content.
    workspace.CreateBlob("b")
    assert workspace.FetchBlob("b").tolist() == [1.0]
    # ResetBlob empties the content but the blob stays.
    workspace.ResetBlob("b")
    assert workspace.HasBlob("b")
    assert isinstance(workspace.FetchBlob("b"), bytes)
    assert sorted(workspace.Blobs()) == ["a", "b", "c"]
    with pytest.raises(errors.BlobNotFoundError) as info:
        workspace.ResetBlob("never")
    assert isinstance(info.value, KeyError) and info.value.blob == "never"


def test_fetch_missing_blob(fresh):
    with pytest.raises(errors.BlobNotFoundError) as info:
        workspace.FetchBlob("missing")
    assert isinstance(info.value, KeyError)
    assert info.value.blob == "missing"
    assert "missing" in str(info.value)


def test_counter_fetches_as_a_description(fresh):
    workspace.RunNetOnce(counter_net("mk", "cnt", 4))
    out = workspace.FetchBlob("cnt")
    assert isinstance(out, bytes)
    assert b"cnt" in out


# --------------------------------------------------- named workspaces --


def test_switch_workspace_and_registry(fresh):
    assert workspace.CurrentWorkspace() == fresh
    assert fresh in workspace.Workspaces()
    assert "default" in workspace.Workspaces()
    workspace.FeedBlob("only_here", np.array([1], np.int32))

    other = fresh + "_other"
    with pytest.raises(errors.WorkspaceNotFoundError) as info:
        workspace.SwitchWorkspace(other)
    assert isinstance(info.value, KeyError)
    assert other in str(info.value)
    assert workspace.CurrentWorkspace() == fresh  # unchanged by the failure
    assert other not in workspace.Workspaces()

    workspace.SwitchWorkspace(other, True)
    assert workspace.CurrentWorkspace() == other
    assert other in workspace.Workspaces()
    assert not workspace.HasBlob("only_here")
    workspace.FeedBlob("there", np.array([2], np.int32))

    workspace.SwitchWorkspace(fresh)
    assert workspace.FetchBlob("only_here").tolist() == [1]
    assert not workspace.HasBlob("there")
    # create_if_missing on an existing workspace keeps its content.
    workspace.SwitchWorkspace(other, True)
    assert workspace.FetchBlob("there").tolist() == [2]
    workspace.SwitchWorkspace(fresh)


def test_reset_workspace_keeps_root_folder(fresh, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    workspace.ResetWorkspace(str(root))
    assert workspace.RootFolder() == str(root)
    workspace.FeedBlob("x", np.array([1.0], np.float32))
    made = counter_net("n", "c", 0)
    workspace.CreateNet(made)
    assert workspace.Nets() == [made.Name()]
    assert workspace.ResetWorkspace() is True
    assert workspace.Blobs() == []
    assert workspace.Nets() == []
    assert workspace.RootFolder() == str(root)
    assert workspace.CurrentWorkspace() == fresh


def test_reset_workspace_creates_a_missing_root_folder(fresh, tmp_path):
    target = tmp_path / "a" / "b" / "c"
    assert not target.exists()
    workspace.FeedBlob("x", np.array([1.0], np.float32))
    workspace.ResetWorkspace(str(target))
    assert target.is_dir()
    assert workspace.RootFolder() == str(target)
    assert not workspace.HasBlob("x")


# ------------------------------------------------------ child workspaces --


def test_child_reads_parent_blobs():
    parent = workspace.Workspace()
    parent.feed_blob("a", np.array([1, 2, 3], np.int64))
    child = workspace.Workspace(parent)
    assert child.has_blob("a")
    assert child.blobs["a"].fetch().tolist() == [1, 2, 3]
    # Blobs added to the parent later are visible too.
    parent.feed_blob("late", np.array([9], np.int32))
    assert child.blobs["late"].fetch().tolist() == [9]
    assert "late" in child.blobs
    # A grandchild sees through the whole chain.
    grandchild = workspace.Workspace(child)
    assert grandchild.blobs["a"].fetch().tolist() == [1, 2, 3]


def test_child_writes_to_existing_parent_blobs_land_in_the_parent():
    parent = workspace.Workspace()
    parent.feed_blob("shared", np.array([0.0], np.float32))
    child = workspace.Workspace(parent)
    net = core.Net("w")
    net.ConstantFill([], ["shared"], shape=[2], value=5.0)
    net.ConstantFill([], ["local"], shape=[1], value=1.0)
    child.run(net)
    assert parent.blobs["shared"].fetch().tolist() == [5.0, 5.0]
    assert child.blobs["local"].fetch().tolist() == [1.0]
    assert not parent.has_blob("local")
    assert "local" not in parent.blobs
    # Feeding through the child also writes the parent's blob.
    child.feed_blob("shared", np.array([7], np.int32))
    assert parent.blobs["shared"].fetch().tolist() == [7]
    # The child lists its own and its parent's blobs.
    assert sorted(child.blobs.keys()) == ["local", "shared"]
    assert sorted(parent.blobs.keys()) == ["shared"]


def test_child_local_blobs_vanish_with_the_child():
    parent = workspace.Workspace()
    parent.feed_blob("keep", np.array([1], np.int32))
    child = workspace.Workspace(parent)
    child.feed_blob("temp", np.array([2], np.int32))
    child.run(counter_net("cn", "child_counter", 3))
    assert child.has_blob("temp") and child.has_blob("child_counter")
    del child
    gc.collect()
    assert sorted(parent.blobs.keys()) == ["keep"]
    # A new child does not see the old child's blobs.
    again = workspace.Workspace(parent)
    assert not again.has_blob("temp")


def test_child_nets_are_not_inherited():
    parent = workspace.Workspace()
    made = counter_net("pn", "pc", 0)
    parent.create_net(made)
    child = workspace.Workspace(parent)
    assert list(parent.nets) == [made.Name()]
    assert child.nets == {}
    with pytest.raises(errors.NetNotFoundError):
        child.run_net(made.Name())


def test_missing_blob_in_child_names_it():
    child = workspace.Workspace(workspace.Workspace())
    with pytest.raises(errors.BlobNotFoundError) as info:
        child.blobs["nope"]
    assert info.value.blob == "nope"


# ------------------------------------------------------------------ nets --


def test_create_net_and_run_net_num_iter(fresh):
    init = core.Net("init")
    init.CreateCounter([], ["c"], init_count=10)
    workspace.RunNetOnce(init)
    body = core.Net("body")
    body.CountDown(["c"], ["done"])
    body.Iter([], ["it"])
    assert workspace.CreateNet(body) is True
    assert workspace.Nets() == [body.Name()]
    assert workspace.RunNet(body.Name()) is True
    assert workspace.FetchBlob("it").tolist() == [1]
    assert workspace.RunNet(body.Name(), num_iter=4) is True
    assert workspace.FetchBlob("it").tolist() == [5]
    # A Net object or its name both work.
    assert workspace.RunNet(body, 5) is True
    assert workspace.FetchBlob("it").tolist() == [10]
    # 10 CountDowns from 10: the previous value was 1, not yet done.
    assert workspace.FetchBlob("done").item() is False
    workspace.RunNet(body.Name())
    assert workspace.FetchBlob("done").item() is True


def test_create_net_overwrite_rules(fresh):
    first = core.Net("n")
    first.ConstantFill([], ["v"], shape=[1], value=1.0)
    workspace.CreateNet(first)
    second = core.Net("n")
    second.ConstantFill([], ["v"], shape=[1], value=2.0)
    second.Proto().name = first.Name()  # core.Net made the name unique
    with pytest.raises(errors.FerrocaffeError) as info:
        workspace.CreateNet(second)
    assert isinstance(info.value, ValueError)
    assert info.value.net == first.Name()
    workspace.RunNet(first.Name())
    assert workspace.FetchBlob("v").tolist() == [1.0]  # the old net is kept
    assert workspace.CreateNet(second, overwrite=True) is True
    workspace.RunNet(first.Name())
    assert workspace.FetchBlob("v").tolist() == [2.0]
    assert workspace.Nets() == [first.Name()]


def test_failed_overwrite_destroys_the_old_net(fresh):
    good = core.Net("n")
    good.ConstantFill([], ["v"], shape=[1], value=1.0)
    workspace.CreateNet(good)
    bad = core.Net("n")
    bad.Copy(["not_there"], ["y"])
    bad.Proto().name = good.Name()
    with pytest.raises(errors.BlobNotFoundError):
        workspace.CreateNet(bad, overwrite=True)
    # As in Caffe2, the old net was destroyed before the new one was built.
    with pytest.raises(errors.NetNotFoundError):
        workspace.RunNet(good.Name())


def test_create_net_input_blobs(fresh):
    net = core.Net("reads")
    net.IsEmpty(["in"], ["empty"])
    with pytest.raises(errors.BlobNotFoundError) as info:
        workspace.CreateNet(net)
    assert info.value.blob == "in"
    assert net.Name() not in workspace.Nets()
    workspace.CreateNet(net, input_blobs=["in"])
    assert workspace.HasBlob("in")
    workspace.FeedBlob("in", np.zeros((0, 3), np.float32))
    workspace.RunNet(net.Name())
    assert workspace.FetchBlob("empty").item() is True
    workspace.FeedBlob("in", np.zeros((2, 3), np.float32))
    workspace.RunNet(net.Name())
    assert workspace.FetchBlob("empty").item() is False


def test_run_net_zero_or_negative_iterations_run_nothing(fresh):
    # Caffe2's run_net loops `for (i = 0; i < num_iter; i++)`.
    net = core.Net("it")
    net.Iter([], ["it"])
    workspace.CreateNet(net)
    workspace.RunNet(net.Name())
    assert workspace.RunNet(net.Name(), 0) is True
    assert workspace.RunNet(net.Name(), -1) is True
    assert workspace.FetchBlob("it").tolist() == [1]


def test_run_net_missing(fresh):
    with pytest.raises(errors.NetNotFoundError) as info:
        workspace.RunNet("ghost")
    assert isinstance(info.value, KeyError)
    assert info.value.net == "ghost"
    assert "ghost" in str(info.value)


def test_run_net_once_does_not_keep_the_net(fresh):
    net = core.Net("once")
    net.Iter([], ["it"])
    assert workspace.RunNetOnce(net) is True
    assert workspace.RunNetOnce(net.Proto()) is True
    assert workspace.FetchBlob("it").tolist() == [2]
    assert workspace.Nets() == []


def test_run_operator_once_and_operators_once(fresh):
    op = core.CreateOperator("ConstantFill", [], ["x"], shape=[2, 2], value=3, dtype=core.DataType.INT32)
    assert workspace.RunOperatorOnce(op) is True
    out = workspace.FetchBlob("x")
    assert out.dtype == np.int32 and out.tolist() == [[3, 3], [3, 3]]
    ops = [
        core.CreateOperator("CreateCounter", [], ["c"], init_count=2),
        core.CreateOperator("CountDown", ["c"], ["d1"]),
        core.CreateOperator("CountDown", ["c"], ["d2"]),
        core.CreateOperator("CountDown", ["c"], ["d3"]),
        core.CreateOperator("RetrieveCount", ["c"], ["left"]),
    ]
    assert workspace.RunOperatorsOnce(ops) is True
    # Counter 2: previous values 2, 1, 0 -> done only on the third.
    assert [workspace.FetchBlob(n).item() for n in ("d1", "d2", "d3")] == [False, False, True]
    assert workspace.FetchBlob("left").item() == -1
    assert workspace.Nets() == []


# ----------------------------------------------------------------- plans --


def test_run_plan_and_run_plan_of_a_step(fresh):
    init = core.Net("init")
    init.CreateCounter([], ["c"], init_count=0)
    body = core.Net("body")
    body.CountUp(["c"], ["prev"])
    plan = core.Plan("p")
    plan.AddStep(core.execution_step("init", init))
    plan.AddStep(core.execution_step("body", body, num_iter=6))
    assert workspace.RunPlan(plan) is True
    assert workspace.FetchBlob("prev").item() == 5
    # A bare step is wrapped into a plan; the plan's nets stay in the workspace.
    assert workspace.RunPlan(core.execution_step("more", body, num_iter=3)) is True
    assert workspace.FetchBlob("prev").item() == 8
    assert sorted(workspace.Nets()) == sorted([body.Name(), init.Name()])
    # The proto works as well as the Plan object.
    assert workspace.RunPlan(plan.Proto()) is True
    assert workspace.FetchBlob("prev").item() == 5


def test_workspace_object_run_dispatch():
    ws = workspace.Workspace()
    net = core.Net("n")
    net.Iter([], ["it"])
    ws.run(net)
    ws.run(core.execution_step("s", net, num_iter=3))
    plan = core.Plan("p")
    plan.AddStep(core.execution_step("s2", net, num_iter=2))
    ws.run(plan)
    ws.run(core.CreateOperator("Iter", ["it"], ["it"]))
    assert ws.blobs["it"].fetch().tolist() == [1 + 3 + 2 + 1]


def test_run_plan_in_background_success(fresh):
    release = threading.Event()
    entered = threading.Event()

    def wait_for_release(inputs, outputs):
        entered.set()
        if not release.wait(30):
            raise RuntimeError("never released")

    gate = core.Net("gate")
    gate.Python(wait_for_release)([], [])
    body = core.Net("body")
    body.Iter([], ["it"])
    plan = core.Plan("bg")
    plan.AddStep(core.execution_step("gate", gate))
    plan.AddStep(core.execution_step("body", body, num_iter=4))
    handle = workspace.RunPlanInBackground(plan)
    assert entered.wait(30)
    assert handle.is_done() is False
    assert handle.is_succeeded() is False
    release.set()
    assert handle.wait() is True
    assert handle.is_done() is True
    assert handle.is_succeeded() is True
    assert workspace.FetchBlob("it").tolist() == [4]


def test_run_plan_in_background_failure(fresh):
    body = core.Net("bad")
    body.Copy(["missing"], ["y"])
    handle = workspace.RunPlanInBackground(core.execution_step("s", body))
    with pytest.raises(errors.BlobNotFoundError) as info:
        handle.wait()
    assert info.value.blob == "missing"
    assert handle.is_done() is True
    assert handle.is_succeeded() is False


def test_run_plan_in_background_cancel(fresh):
    workspace.CreateBlob("never_set")
    spin = core.Net("spin")
    spin.Iter([], ["it"])
    step = core.execution_step("forever", spin, should_stop_blob=core.BlobReference("never_set"))
    handle = workspace.RunPlanInBackground(step)
    handle.cancel()
    with pytest.raises(errors.CancelledError):
        handle.wait()
    assert handle.is_done() is True
    assert handle.is_succeeded() is False
    # The workspace still runs plans.
    assert workspace.RunPlan(core.execution_step("after", counter_net("ok", "okc", 7))) is True
    assert workspace.FetchBlob("okc_prev").item() == 7


# ---------------------------------------------------------- foreign nets --


def foreign_netdef(name):
    """A NetDef as a Caffe2 build with other operators might have written
    it: engine hints (always accepted) and arguments ferrocaffe does not know
    (`is_test`, `float16_compute`)."""
    net = core.Net(name)
    net.ConstantFill([], ["fx"], shape=[2], value=3.0, use_cudnn=1, order="NHWC",
                     cudnn_exhaustive_search=0, exhaustive_search=0,
                     ws_nbytes_limit=1 << 20, is_test=1)
    net.Scale(["fx"], ["fy"], scale=2.0, float16_compute=1)
    loaded = proto.NetDef()  # as read from a .pb file
    loaded.ParseFromString(net.Proto().SerializeToString())
    return loaded


def test_schemas_list_what_an_op_reads_and_what_it_ignores():
    schema = workspace.C.operator_schema("ConstantFill")
    assert [a[0] for a in schema["args"]] == [
        "value", "dtype", "shape", "extra_shape", "input_as_shape"]
    assert [a[0] for a in schema["ignored"]] == [
        "run_once", "order", "use_cudnn", "cudnn_exhaustive_search",
        "exhaustive_search", "ws_nbytes_limit"]
    # Concat reads `order`: it is not listed as ignored there.
    concat = workspace.C.operator_schema("Concat")
    assert "order" in [a[0] for a in concat["args"]]
    assert "order" not in [a[0] for a in concat["ignored"]]


def test_a_foreign_net_is_refused_until_allowed(fresh):
    netdef = foreign_netdef("foreign")
    with pytest.raises(errors.InvalidArgumentError, match="'is_test'") as e:
        workspace.RunNetOnce(netdef)
    assert e.value.op == "ConstantFill" and e.value.net == "foreign"
    assert not workspace.HasBlob("fx")
    assert core.allow_unknown_arguments(netdef) is netdef
    core.allow_unknown_arguments(netdef)  # idempotent: one mark
    assert [a.name for a in netdef.arg] == [core.ALLOW_UNKNOWN_ARGUMENTS]
    workspace.RunNetOnce(netdef)
    np.testing.assert_array_equal(workspace.FetchBlob("fy"), [6.0, 6.0])
    # CreateNet too, and the mark can be taken off again.
    workspace.CreateNet(netdef)
    core.allow_unknown_arguments(netdef, allow=False)
    assert list(netdef.arg) == []
    with pytest.raises(errors.InvalidArgumentError, match="'is_test'"):
        workspace.CreateNet(netdef, overwrite=True)


def test_allowing_unknown_arguments_per_op_net_plan_and_nested_net(fresh):
    from ferrocaffe.session import LocalSession

    # One OperatorDef, for RunOperatorOnce.
    op = core.CreateOperator("ConstantFill", [], ["o"], shape=[1], value=1.0, is_test=1)
    with pytest.raises(errors.InvalidArgumentError):
        workspace.RunOperatorOnce(op)
    workspace.RunOperatorOnce(core.allow_unknown_arguments(op))
    assert workspace.FetchBlob("o").tolist() == [1.0]

    # A Plan (every net it holds), run directly and through a session.
    inner = core.Net("plan_net")
    inner.ConstantFill([], ["p"], shape=[1], value=2.0, is_test=1)
    plan = core.Plan(core.execution_step("plan_step", inner))
    with pytest.raises(errors.InvalidArgumentError):
        workspace.RunPlan(plan)
    workspace.RunPlan(core.allow_unknown_arguments(plan))
    assert workspace.FetchBlob("p").tolist() == [2.0]
    net = core.allow_unknown_arguments(core.Net(foreign_netdef("via_session")))
    LocalSession(workspace.current_workspace()).run(net)
    np.testing.assert_array_equal(workspace.FetchBlob("fy"), [6.0, 6.0])

    # A net nested in an If follows its enclosing net.
    then_net = core.Net("then")
    then_net.ConstantFill([], ["q"], shape=[1], value=4.0, is_test=1)
    workspace.FeedBlob("cond", np.array(True))
    outer = core.Net("outer")
    outer.If(["cond"], [], then_net=then_net.Proto())
    with pytest.raises(errors.InvalidArgumentError, match="'is_test'"):
        workspace.RunNetOnce(outer)
    workspace.RunNetOnce(core.allow_unknown_arguments(outer))
    assert workspace.FetchBlob("q").tolist() == [4.0]
    with pytest.raises(TypeError, match="allow_unknown_arguments takes"):
        core.allow_unknown_arguments("not a net")


# ---------------------------------------------------------------- paths --


def test_every_path_may_be_a_pathlike(fresh, tmp_path):
    import pathlib

    from ferrocaffe import _core
    from ferrocaffe.checkpoint import mmap_db

    root = tmp_path / "root"
    root.mkdir()
    ws = workspace.Workspace(root_folder=root)
    assert ws.root_folder == str(root)
    assert workspace.Workspace(root).root_folder == str(root)
    x = np.arange(3, dtype=np.int64)
    ws.feed_blob("x", x)
    # Op arguments: a path, and a list of paths.
    absolute = tmp_path / "abs.minidb"
    ws.run(core.CreateOperator("Save", ["x"], [], db=absolute, db_type="minidb", absolute_path=1))
    ws.run(core.CreateOperator("Save", ["x"], [], db=pathlib.Path("rel.ferro"), db_type="ferro"))
    assert (root / "rel.ferro").is_file()
    ws.run(core.CreateOperator("DBExists", [], ["e"], db_name=absolute, db_type="minidb", absolute_path=1))
    assert ws.fetch_blob("e")
    other = workspace.Workspace()
    other.run(core.CreateOperator("Load", [], ["x"], dbs=[absolute], db_type="minidb", absolute_path=1))
    np.testing.assert_array_equal(other.fetch_blob("x"), x)
    # The functions of the compiled module.
    assert [e["name"] for e in _core.list_db(absolute, "minidb")] == ["x"]
    _core.verify_db(root / "rel.ferro", "ferro")
    assert _core.db_exists(absolute, "minidb")
    assert _core.sweep_stale_temporaries(tmp_path) == 0
    np.testing.assert_array_equal(mmap_db(root / "rel.ferro")["x"], x)
    # ResetWorkspace keeps the new root folder.
    elsewhere = tmp_path / "elsewhere"
    workspace.ResetWorkspace(elsewhere)
    assert workspace.RootFolder() == str(elsewhere) and elsewhere.is_dir()


def test_feed_a_tensor_proto_and_serialize_deserialize_blobs(fresh):
    from ferrocaffe import proto
    t = proto.TensorProto(dims=[2, 2], data_type=proto.TensorProto.INT64, int64_data=[1, 2, 3, 4])
    workspace.FeedBlob("t", t)
    got = workspace.FetchBlob("t")
    assert got.dtype == np.int64 and got.tolist() == [[1, 2], [3, 4]]
    data = workspace.SerializeBlob("t")
    back = proto.BlobProto.FromString(data)
    assert back.name == "t" and back.type == "Tensor" and list(back.tensor.dims) == [2, 2]
    workspace.DeserializeBlob("u", data)
    assert workspace.FetchBlob("u").tolist() == [[1, 2], [3, 4]]
    workspace.FeedBlob("s", b"bytes blob")
    workspace.DeserializeBlob("s2", workspace.SerializeBlob("s"))
    assert workspace.FetchBlob("s2") == b"bytes blob"
    # Too few values for the dims: a typed error, the blob unchanged.
    bad = proto.TensorProto(dims=[3], data_type=proto.TensorProto.FLOAT, float_data=[1.0])
    with pytest.raises(errors.FerrocaffeError) as info:
        workspace.FeedBlob("u", bad)
    assert info.value.blob == "u" and isinstance(info.value, ValueError)
    assert workspace.FetchBlob("u").tolist() == [[1, 2], [3, 4]]
    with pytest.raises(errors.CorruptCheckpointError):
        workspace.DeserializeBlob("u", b"\xff\x01")


def test_feed_a_tensor_proto_of_another_caffe2_pb2(fresh):
    # Another build's caffe2_pb2 (as Caffe2's own would be): the same schema
    # in a pool of its own, so its classes are not ours.
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from ferrocaffe import _core, proto
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString(_core.CAFFE2_FILE_DESCRIPTOR_SET).file:
        pool.Add(f)
    Foreign = message_factory.GetMessageClass(pool.FindMessageTypeByName("caffe2.TensorProto"))
    assert Foreign is not proto.TensorProto
    t = Foreign(dims=[3], data_type=2, int32_data=[1, -2, 3])  # INT32
    workspace.FeedBlob("foreign", t)
    got = workspace.FetchBlob("foreign")
    assert got.dtype == np.int32 and got.tolist() == [1, -2, 3]
    # What is no TensorProto is still refused with FeedError.
    with pytest.raises(errors.FeedError):
        workspace.FeedBlob("foreign", proto.NetDef(name="n"))


@pytest.mark.parametrize("make", [
    lambda: np.arange(0, 0, dtype=np.int64).reshape(0, 3),
    lambda: np.zeros((0, 3), np.int64),
    lambda: np.zeros((3, 0), np.float32)[:, ::2],
    lambda: np.zeros((0, 3))[::-1],
])
def test_empty_arrays_of_any_layout_feed_and_refeed(fresh, make):
    # Empty arrays come with odd strides (0, or of a reshape); each must feed,
    # also over a blob already holding one of the same dtype and shape.
    for _ in range(2):
        arr = make()
        workspace.FeedBlob("empty", arr)
        got = workspace.FetchBlob("empty")
        assert got.shape == arr.shape and got.dtype == arr.dtype


def test_c_workspace_blobs_compare_equal_to_a_dict():
    # Caffe2's workspace_test: ws.blobs == {} on a new C.Workspace.
    from ferrocaffe import workspace

    ws = workspace.C.Workspace()
    assert ws.blobs == {} and ws.nets == {}
    ws.create_blob("a")
    assert ws.blobs != {} and "a" in ws.blobs and list(ws.blobs) == ["a"]
    assert dict(ws.blobs).keys() == {"a"}
