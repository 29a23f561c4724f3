"""Hard edges: inputs that used to abort the process, read wrong blobs,
run pickled code, or raise untyped Python errors (issue 17).

Cases that crashed the process run in a child process, so that a
regression fails one test instead of killing the run.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from _support import PKG_PARENT as PYTHON_DIR
from ferrocaffe import core, errors, workspace

CHILD_TIMEOUT = 120.0


def run_child(code):
    """Runs ``code`` in a fresh interpreter that imports this ferrocaffe;
    returns its CompletedProcess (a crash shows as a negative returncode)."""
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)


def child_results(code):
    """Runs ``code``, which prints one JSON line ``RESULT <json>`` at the end;
    returns the decoded object, or fails naming how the child died."""
    p = run_child(code)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, (
        f"the child exited with {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


# ------------------------------------------------- 1: allocation failure --

OOM_CHILD = r"""
import json, resource
import numpy as np
from ferrocaffe import core, errors, workspace

GIB = 1 << 30
ws = workspace.Workspace()
ws.feed_blob("x", np.array([5.0], np.float32))
ws.feed_blob("dims", np.array([1 << 16, 1 << 16], np.int64))
ws.feed_blob("col", np.zeros((1 << 16, 1), np.float32))
ws.feed_blob("row", np.zeros((1, 1 << 16), np.float32))
ws.feed_blob("mib", np.zeros(1 << 18, np.float32))  # 1 MiB

# Address space for what is mapped now plus 1 GiB: each case below asks
# for 16 GiB (or 4 GiB), under the element-count caps but unallocatable.
with open("/proc/self/status") as f:
    vm = [int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:")][0]
limit = vm + GIB
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

def net(name, build):
    n = core.Net(name)
    build(n)
    return n

cases = {
    "ConstantFill": lambda n: n.ConstantFill([], "x", shape=[1 << 32], value=1.0),
    "ConstantFill_int64": lambda n: n.ConstantFill([], "x", shape=[1 << 31], value=3, dtype=core.DataType.INT64),
    "ConstantFill_input_as_shape": lambda n: n.ConstantFill(["dims"], "x", input_as_shape=1),
    "UniformFill": lambda n: n.UniformFill([], "x", shape=[1 << 32]),
    "UniformIntFill": lambda n: n.UniformIntFill([], "x", shape=[1 << 32]),
    "GaussianFill": lambda n: n.GaussianFill([], "x", shape=[1 << 32]),
    "GaussianFill_input_as_shape": lambda n: n.GaussianFill(["dims"], "x", input_as_shape=1),
    "Add_broadcast": lambda n: n.Add(["col", "row"], "x"),
    "Concat_repeated": lambda n: n.Concat(["mib"] * 5000, ["x", "split"], axis=0),
}
out = {}
for name, build in cases.items():
    try:
        ws.run(net("big_" + name, build))
        out[name] = "ran"
    except errors.FerrocaffeError as e:
        out[name] = dict(cls=type(e).__name__, memory=isinstance(e, MemoryError),
                         op=e.op, net=e.net, blob=e.blob, msg=str(e))
    # The failed op wrote nothing and the workspace still works.
    assert ws.blobs["x"].fetch().tolist() == [5.0]
    ok = core.Net("ok_" + name)
    ok.ConstantFill([], "small", shape=[3], value=2.0)
    ws.run(ok)
    assert ws.blobs["small"].fetch().tolist() == [2.0, 2.0, 2.0]
print("RESULT " + json.dumps(out))
"""


def test_outputs_that_cannot_be_allocated_raise_out_of_memory_errors():
    got = child_results(OOM_CHILD)
    for name, r in got.items():
        assert r != "ran", name
        op = name.split("_")[0]
        assert r["cls"] == "OutOfMemoryError" and r["memory"], (name, r)
        assert (r["op"], r["net"], r["blob"]) == (op, "big_" + name, "x"), (name, r)
        assert "cannot allocate" in r["msg"] and "bytes" in r["msg"], (name, r)
    # The sizes asked for, in bytes (computed here, not read back).
    assert str(4 << 32) in got["ConstantFill"]["msg"]
    assert str(8 << 31) in got["ConstantFill_int64"]["msg"]
    assert str(4 << 32) in got["Add_broadcast"]["msg"]
    assert str(5000 << 20) in got["Concat_repeated"]["msg"]


FETCH_OOM_CHILD = """
import json, resource
from ferrocaffe import core, errors, workspace

n = 64 << 20                       # float32 elements: 256 MiB
net = core.Net("big_fetch")
net.ConstantFill([], "big", shape=[n], value=1.5)
workspace.RunNetOnce(net)
with open("/proc/self/status") as f:
    vm = int(next(l for l in f if l.startswith("VmSize")).split()[1]) * 1024
# Room for small things, not for a second copy of the tensor.
resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), resource.RLIM_INFINITY))
r = {}
try:
    workspace.FetchBlob("big")
    r["fetch"] = "ran"
except BaseException as e:
    r["fetch"] = dict(cls=type(e).__name__, memory=isinstance(e, MemoryError),
                      runtime=isinstance(e, RuntimeError), blob=getattr(e, "blob", None), msg=str(e))
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
a = workspace.FetchBlob("big")     # the blob and the workspace are intact
r["after"] = [a.shape[0], float(a[0]), float(a[-1])]
print("RESULT " + json.dumps(r))
"""


def test_a_fetch_that_cannot_be_allocated_is_an_out_of_memory_error():
    got = child_results(FETCH_OOM_CHILD)
    r = got["fetch"]
    assert r != "ran"
    assert (r["cls"], r["memory"], r["runtime"], r["blob"]) == ("OutOfMemoryError", True, True, "big"), r
    assert str(4 * (64 << 20)) in r["msg"] and "'big'" in r["msg"], r
    assert got["after"] == [64 << 20, 1.5, 1.5]


def test_out_of_memory_error_is_a_memory_error():
    assert issubclass(errors.OutOfMemoryError, errors.FerrocaffeError)
    assert issubclass(errors.OutOfMemoryError, MemoryError)


# ------------------------------------- 9: pickled builders need trust --

def _marker_builder(path):
    """A pickled builder whose unpickling-and-calling leaves a trace: the
    builder tuple is (exec, (code,), {}), as a hostile file could hold."""
    code = f"open({str(path)!r}, 'w').write('ran')"
    return (exec, (code,), {})


def test_a_pickled_builder_not_made_here_is_not_unpickled(tmp_path):
    import pickle
    marker = tmp_path / "marker"
    # An op as it would come from a file: pickled_builder made elsewhere.
    net = core.Net("loaded")
    net.Proto().op.add().CopyFrom(core.CreateOperator(
        "Python", [], [], pickled_builder=pickle.dumps(_marker_builder(marker))))
    data = net.Proto().SerializeToString()
    ws = workspace.Workspace()
    for run in (lambda: ws.create_net(data), lambda: ws.run(net),
                lambda: ws._core.run_net_once(data)):
        with pytest.raises(errors.InvalidArgumentError, match="TrustPickledBuilders") as info:
            run()
        assert info.value.op == "Python" and info.value.net == "loaded"
        assert "'loaded'" in str(info.value) or "net 'loaded'" in str(info.value)
        assert not marker.exists()
    # The explicit opt-in: the same bytes now build (and run the builder).
    from ferrocaffe.proto import NetDef
    assert core.TrustPickledBuilders(NetDef.FromString(data)) == 1
    with pytest.raises(errors.FerrocaffeError):
        ws.run(net)  # exec() returns None, which is not callable ...
    assert marker.read_text() == "ran"  # ... but the builder did run


def test_nested_nets_and_plans_are_walked_for_builders(tmp_path):
    import pickle
    pb = pickle.dumps((eval, ("lambda inputs, outputs: None",), {}))
    inner = core.Net("inner")
    inner.Proto().op.add().CopyFrom(core.CreateOperator("Python", [], [], pickled_builder=pb))
    outer = core.Net("outer")
    outer.Do([], [], net=inner.Proto())
    plan = core.Plan("p")
    plan.AddStep(core.execution_step("s", outer))
    from ferrocaffe import _python_ops
    assert not _python_ops.is_trusted(pb)
    assert core.TrustPickledBuilders(plan) == 1
    assert _python_ops.is_trusted(pb)


def test_builders_made_by_net_python_keep_working_through_bytes():
    from ferrocaffe.proto import NetDef
    net = core.Net("made_here")
    net.Python((eval, ("lambda inputs, outputs: None",), {}))([], [])
    reloaded = NetDef.FromString(net.Proto().SerializeToString())
    assert workspace.Workspace().run(reloaded) is True


def test_a_net_file_from_another_process_needs_the_opt_in(tmp_path):
    path = tmp_path / "net.pb"
    marker = tmp_path / "marker"
    net = core.Net("from_file")
    net.Python(_marker_builder(marker))([], [])
    path.write_bytes(net.Proto().SerializeToString())
    code = f"""
        import json
        from ferrocaffe import core, errors, workspace
        from ferrocaffe.proto import NetDef
        net = NetDef.FromString(open({str(path)!r}, 'rb').read())
        out = {{}}
        try:
            workspace.Workspace().run(net)
        except errors.FerrocaffeError as e:
            out['refused'] = [type(e).__name__, e.net]
        out['marker_before'] = __import__('os').path.exists({str(marker)!r})
        out['trusted'] = core.TrustPickledBuilders(net)
        try:
            workspace.Workspace().run(net)
        except errors.FerrocaffeError as e:
            out['after'] = type(e).__name__
        out['marker_after'] = __import__('os').path.exists({str(marker)!r})
        print('RESULT ' + json.dumps(out))
    """
    got = child_results(code)
    assert got["refused"] == ["InvalidArgumentError", "from_file"]
    assert got["marker_before"] is False
    assert got["trusted"] == 1 and got["marker_after"] is True


# ---------------------------------- 16: typed errors, bounded nesting --

def assert_typed(exc_info, cls, builtin=None, **attrs):
    e = exc_info.value
    assert type(e) is cls, f"{type(e).__name__}: {e}"
    assert isinstance(e, errors.FerrocaffeError)
    if builtin is not None:
        assert isinstance(e, builtin)
    for key, value in attrs.items():
        assert getattr(e, key) == value, (key, getattr(e, key))
    str(e)


@pytest.mark.parametrize("name", ["x\udcff", "\ud800", b"\xffx", b"ok\xc3"])
def test_blob_and_net_names_that_cannot_be_utf8(name):
    ws = workspace.Workspace()
    for call in (lambda: ws.feed_blob(name, np.array([1.0])),
                 lambda: ws.fetch_blob(name), lambda: ws.has_blob(name),
                 lambda: ws.create_blob(name), lambda: ws.run_net(name)):
        with pytest.raises(errors.InvalidArgumentError) as info:
            call()
        assert "UTF-8" in str(info.value)
    if isinstance(name, str):
        with pytest.raises(errors.InvalidArgumentError, match="net name") as info:
            core.Net(name)
        with pytest.raises(errors.InvalidArgumentError, match="step name"):
            core.ExecutionStep(name)
        net = core.Net("surrogates")
        with pytest.raises(errors.InvalidArgumentError, match="UTF-8"):
            net.ConstantFill([], name, shape=[1])
        with pytest.raises(errors.InvalidArgumentError, match="argument 'db' of a Save op"):
            net.Save(["x"], [], db=name, db_type="ferro")
    # The workspace is fine afterwards.
    ws.feed_blob("fine", np.array([2.0]))
    assert ws.fetch_blob("fine").tolist() == [2.0]


def test_non_utf8_bytes_in_serialised_names_are_typed_errors():
    from ferrocaffe.proto import NetDef
    net = NetDef(name="n")
    net.op.add().CopyFrom(core.CreateOperator("ConstantFill", [], ["xx"], shape=[1]))
    data = net.SerializeToString().replace(b"xx", b"\xff\xfe")
    # protobuf's proto2 parser keeps such a string as its bytes...
    assert NetDef.FromString(data).op[0].output[0] == b"\xff\xfe"
    # ...the runtime refuses it, with a typed error.
    ws = workspace.Workspace()
    for call in (ws._core.run_net_once, ws._core.create_net):
        with pytest.raises(errors.InvalidPlanError, match="UTF-8"):
            call(data)


def test_a_step_cannot_contain_itself():
    step = core.ExecutionStep("loop", core.Net("body"))
    outer = core.ExecutionStep("outer")
    outer.AddSubstep(step)
    with pytest.raises(errors.InvalidPlanError) as info:
        outer.AddSubstep(outer)
    assert_typed(info, errors.InvalidPlanError, ValueError, step="outer")
    # Unchanged: one substep, and it runs.
    assert len(outer.Proto().substep) == 1
    assert workspace.Workspace().run(core.Plan(outer)) is True


def test_thousands_of_nested_steps_are_refused_naming_the_step():
    step = core.ExecutionStep("leaf", core.Net("leaf_net"))
    with pytest.raises(errors.InvalidPlanError) as info:
        for i in range(3000):
            outer = core.ExecutionStep(f"level{i}")
            outer.AddSubstep(step)
            step = outer
    assert info.value.step is not None and info.value.step.startswith("level")
    assert "100 levels" in str(info.value)
    # What was built below the limit runs.
    assert workspace.Workspace().run(core.Plan(step)) is True


def test_deep_protos_are_refused_by_the_runtime():
    from ferrocaffe.proto import DecodeError, ExecutionStep, MAX_NESTING, PlanDef
    top = ExecutionStep(name="top")
    cur = top
    for _ in range(5000):  # built in place: no copy, no limit yet
        cur = cur.substep.add()
        cur.name = "s"
    # protobuf's own walks are C code: any depth, no RecursionError.
    data = top.SerializeToString()
    assert top.SerializePartialToString() == data
    assert top.FindInitializationErrors() == []
    assert top != ExecutionStep()
    copy = ExecutionStep()
    copy.CopyFrom(top)
    assert copy == top
    assert str(top).count("substep {") == 5000
    # The runtime refuses it, saying what the limit is.
    with pytest.raises(errors.InvalidPlanError, match="100 levels"):
        workspace.Workspace().run(top)
    # Bytes nested past the limit: protobuf's parser and the runtime's refuse them.
    inner = b""
    for _ in range(MAX_NESTING + 50):
        inner = b"\x12" + _varint(len(inner)) + inner  # ExecutionStep.substep
    with pytest.raises(DecodeError):
        ExecutionStep.FromString(inner)
    plan = b"\x1a" + _varint(len(inner)) + inner  # PlanDef.execution_step
    with pytest.raises(errors.InvalidPlanError, match="recursion limit") as info:
        workspace.Workspace()._core.run_plan(plan)
    assert "100 levels" in str(info.value)
    assert len(str(info.value)) < 300
    with pytest.raises(DecodeError):
        PlanDef.FromString(plan)


def _varint(n):
    out = bytearray()
    while n > 127:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def test_ints_that_do_not_fit_are_typed_errors_naming_what_they_are():
    ws = workspace.Workspace()
    net = core.Net("counting")  # Net names are unique per process: another test may own "counting"
    name = net.Name()
    net.ConstantFill([], "x", shape=[1])
    ws.create_net(net)
    for n in (1 << 64, 1 << 63, -(1 << 63) - 1):
        with pytest.raises(errors.InvalidArgumentError) as info:
            ws.run_net(name, num_iter=n)
        assert info.value.net == name and str(n) in str(info.value)
    with pytest.raises(errors.DataTypeError) as info:
        ws.run_net(name, num_iter=1.5)
    assert isinstance(info.value, TypeError) and info.value.net == name
    assert ws.run_net(name, num_iter=2) is True
    with pytest.raises(errors.InvalidArgumentError, match="argument 'shape' of a ConstantFill op") as info:
        core.Net("big").ConstantFill([], "y", shape=[1 << 64])
    assert info.value.op == "ConstantFill"
    with pytest.raises(errors.InvalidArgumentError, match="argument 'value'"):
        core.CreateOperator("ConstantFill", [], ["y"], value=-(1 << 70))
    with pytest.raises(errors.InvalidArgumentError, match="step 'many'") as info:
        core.ExecutionStep("many", core.Net("m"), num_iter=1 << 64)
    assert info.value.step == "many"
    step = core.ExecutionStep("later", core.Net("l"))
    for setter in (step.SetIter, step.SetNumConcurrentInstances, step.RunEveryMillis):
        with pytest.raises(errors.InvalidArgumentError, match="step 'later'"):
            setter(1 << 64)


# ---------------------------------------------------------- Cast to STRING --

def test_cast_to_string_writes_what_cpp_to_string_wrote():
    """Caffe2's CPU Cast to STRING used std::to_string: integers and bool in
    decimal, floats as printf's %f (six decimals); from STRING is refused."""
    ws = workspace.Workspace()
    ints = np.array([[0, -7], [2 ** 31 - 1, 42]], dtype=np.int32)
    floats = np.array([1.5, -0.25, 1e10, np.inf], dtype=np.float32)
    ws.create_blob('i').feed(ints)
    ws.create_blob('f').feed(floats)
    ws.create_blob('b').feed(np.array([True, False]))
    net = core.Net('cast_to_string')
    net.Cast(['i'], ['si'], to=core.DataType.STRING)
    net.Cast(['f'], ['sf'], to='STRING')
    net.Cast(['b'], ['sb'], to=core.DataType.STRING)
    assert ws.run(net)
    si = ws.blobs['si'].fetch()
    assert si.shape == (2, 2)
    assert si.ravel().tolist() == [str(int(x)).encode() for x in ints.ravel()]
    assert ws.blobs['sf'].fetch().tolist() == [('%f' % x).encode() for x in floats.astype(float)]
    assert ws.blobs['sb'].fetch().tolist() == [b'1', b'0']
    bad = core.Net('cast_from_string')
    bad.Cast(['si'], ['x'], to=core.DataType.INT32)
    with pytest.raises(errors.DataTypeError, match='from strings') as e:
        ws.run(bad)
    assert e.value.blob == 'si' and e.value.op == 'Cast'
