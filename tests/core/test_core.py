"""Tests of ferrocaffe.core (nets, steps, plans) and ferrocaffe.scope.

The operator registry is replaced by a fixed list for every test, so the
results do not depend on which operators the compiled runtime provides (or
whether it is there at all).
"""

import pickle
import sys
import threading
import types

import numpy as np
import pytest

import ferrocaffe
from ferrocaffe import core, proto, scope
from ferrocaffe.core import BlobReference, Net, Plan, execution_step

OPS = {
    "Add", "Sum", "Relu", "RecurrentNetwork", "Copy", "Print", "Concat", "ConstantFill", "Python",
    "GivenTensorFill", "GivenTensorIntFill", "GivenTensorInt64Fill",
    "GivenTensorBoolFill", "GivenTensorStringFill", "Conv_ENGINE_CUDNN",
}


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(core.registry, "_load_registry", lambda: set(OPS))
    core.RefreshRegisteredOperators()
    Net._reset_used_names()
    monkeypatch.setattr(core.ExecutionStep, "_step_names_used", set())
    monkeypatch.delitem(sys.modules, "ferrocaffe.net_builder", raising=False)
    yield
    monkeypatch.undo()
    core.RefreshRegisteredOperators()
    Net._reset_used_names()


def args_of(op):
    """{name: (field, value)} for the fields each argument sets."""
    out = {}
    for a in op.arg:
        fields = [(fd.name, v) for fd, v in a.ListFields() if fd.name != "name"]
        if not fields:
            out[a.name] = None
        else:
            (field, value), = fields
            if not isinstance(value, (int, float, bytes, proto.Message)):
                value = list(value)
            out[a.name] = (field, value)
    return out


# ------------------------------------------------------------------ basics --


def test_data_type_values():
    assert (core.DataType.UNDEFINED, core.DataType.FLOAT, core.DataType.INT32) == (0, 1, 2)
    assert (core.DataType.BYTE, core.DataType.STRING, core.DataType.BOOL) == (3, 4, 5)
    assert (core.DataType.UINT8, core.DataType.INT8, core.DataType.UINT16) == (6, 7, 8)
    assert (core.DataType.INT16, core.DataType.INT64, core.DataType.FLOAT16) == (9, 10, 12)
    assert (core.DataType.DOUBLE, core.DataType.ZERO_COLLISION_HASH) == (13, 14)
    assert core.DataType.REBATCHING_BUFFER == 15
    for name, value in proto.TensorProto.DataType.items():
        assert getattr(core.DataType, name) == value


def test_device_option_helper():
    d = core.DeviceOption(proto.CUDA, 1, random_seed=3, node_name="n", extra_info=["x"])
    assert (d.device_type, d.device_id, d.random_seed, d.node_name) == (1, 1, 3, "n")
    assert d.extra_info == ["x"]
    d = core.DeviceOption(proto.CPU)
    assert d.HasField("device_id") and not d.HasField("random_seed")
    with pytest.raises(AssertionError):
        core.DeviceOption(proto.CUDA, numa_node_id=0)
    assert core.DeviceOption(proto.CPU, numa_node_id=1).numa_node_id == 1


# ---------------------------------------------------------- blob references --


def test_blob_reference_names_equality_and_hash():
    assert str(BlobReference("a")) == "a"
    assert str(BlobReference(b"b")) == "b"
    assert str(BlobReference(3)) == "3"
    r = BlobReference("x/y/z")
    assert r == "x/y/z" and r == b"x/y/z" and r == BlobReference("x/y/z")
    assert r != "x" and r != 3
    assert hash(r) == hash("x/y/z")
    assert {r: 1}["x/y/z"] == 1
    assert repr(r) == 'BlobReference("x/y/z")'
    assert r.GetNameScope() == "x/y/" and r.GetUnscopedName() == "z"
    assert BlobReference("z").GetNameScope() == "" and r.meta == {}
    with core.NameScope("s"):
        assert str(BlobReference("v")) == "v"  # no scope added


def test_blob_reference_concatenation():
    net = Net("n")
    r = BlobReference("a", net)
    assert str(r + "_x") == "a_x" and (r + "_x").Net() is net
    assert str("p_" + r) == "p_a" and ("p_" + r).Net() is net
    with pytest.raises(RuntimeError, match="Cannot add BlobReference to a non-string."):
        r + 1
    with pytest.raises(RuntimeError, match="Cannot add a non-string to BlobReference."):
        1 + r


def test_blob_reference_creates_ops_on_its_net():
    net = Net("n")
    x = net.AddExternalInput("x")
    x = BlobReference(x, net)
    inputs = ["w"]
    y = x.Relu(inputs, "y")
    assert inputs == ["w"]  # the caller's list is left alone
    assert y == "y" and y.Net() is net
    assert list(net.Proto().op[0].input) == ["x", "w"]
    z = y.Relu([])
    assert z == "n/Relu"
    with pytest.raises(AttributeError, match="not a registered operator"):
        x.NoSuchOp
    with pytest.raises(AttributeError, match="does not have a net"):
        BlobReference("free").Relu
    with pytest.raises(AttributeError):
        BlobReference("free").__foo__
    assert not hasattr(BlobReference("free", net), "_private")
    pickle.loads(pickle.dumps(BlobReference("p")))


# ------------------------------------------------------------------- scope --


def test_name_scope_nesting_and_reset():
    assert scope.CurrentNameScope() == ""
    with core.NameScope("foo"):
        assert scope.CurrentNameScope() == "foo/"
        assert core.ScopedName("x") == "foo/x"
        with core.NameScope("bar"):
            assert scope.CurrentNameScope() == "foo/bar/"
        with core.NameScope("bar", reset=True):
            assert scope.CurrentNameScope() == "bar/"
        with core.NameScope(""):
            assert scope.CurrentNameScope() == "foo/"
        with core.NameScope(None):
            assert scope.CurrentNameScope() == "foo/"
        with scope.EmptyNameScope():
            assert scope.CurrentNameScope() == ""
        assert scope.CurrentNameScope() == "foo/"
    assert scope.CurrentNameScope() == ""
    assert scope._NAMESCOPE_SEPARATOR == "/"
    with pytest.raises(AssertionError, match="NameScope takes in a string"):
        with core.NameScope(3):
            pass


def test_name_scope_is_per_thread():
    seen = []
    with core.NameScope("main"):
        t = threading.Thread(target=lambda: seen.append(scope.CurrentNameScope()))
        t.start()
        t.join()
    assert seen == [""]


def test_scoped_blob_reference():
    with core.NameScope("s"):
        r = core.ScopedBlobReference("b")
        assert str(r) == "s/b" and r.Net() is None
        assert core.ScopedName(b"c") == "s/c"


def test_device_scope():
    assert scope.CurrentDeviceScope() is None
    cuda = core.DeviceOption(proto.CUDA, 1, extra_info=["b"])
    with core.DeviceScope(cuda, node_name="node1"):
        current = scope.CurrentDeviceScope()
        assert current is not cuda and current.device_id == 1
        assert current.node_name == "node1" and not cuda.HasField("node_name")
        inner_option = proto.DeviceOption(device_type=0, extra_info=["a"])
        with core.DeviceScope(inner_option):
            inner = scope.CurrentDeviceScope()
            assert inner.node_name == "node1"  # inherited
            assert inner.extra_info == ["a", "b"]  # merged and sorted
        with core.DeviceScope(None, node_name="only"):
            assert scope.CurrentDeviceScope().node_name == "only"
        with scope.EmptyDeviceScope():
            assert scope.CurrentDeviceScope() is None
        assert scope.CurrentDeviceScope() is current
    assert scope.CurrentDeviceScope() is None
    with pytest.raises(AssertionError, match="DeviceScope takes in a caffe2_pb2.DeviceOption"):
        with core.DeviceScope("cpu"):
            pass
    with pytest.raises(AssertionError, match="At least one argument should be non-null"):
        with core.DeviceScope(None):
            pass


# --------------------------------------------------------- CreateOperator --


def test_create_operator_fields():
    option = core.DeviceOption(proto.CUDA, 1)
    op = core.CreateOperator(
        "Ludicrous", "x", "y", name="ludicrous", control_input="z",
        device_option=option, engine="WARP", debug_info="here",
        arg=[proto.Argument(name="pre", i=9)], arg1=1, arg2="2", arg3=[1, 2, 3],
    )
    assert op.type == "Ludicrous"  # types are not checked here
    assert op.name == "ludicrous" and op.engine == "WARP" and op.debug_info == "here"
    assert op.input == ["x"] and op.output == ["y"] and op.control_input == ["z"]
    assert op.device_option == option
    assert [a.name for a in op.arg] == ["pre", "arg1", "arg2", "arg3"]
    assert args_of(op)["arg3"] == ("ints", [1, 2, 3])
    assert args_of(op)["arg2"] == ("s", b"2")


def test_create_operator_presence_and_bytes():
    op = core.CreateOperator("Relu", "x", "y")
    assert op.HasField("name") and op.name == ""
    assert not op.HasField("device_option") and not op.HasField("engine")
    assert op.SerializeToString() == b"\x0a\x01x\x12\x01y\x1a\x00\x22\x04Relu"


def test_create_operator_name_scope_applies_to_strings_only():
    with core.NameScope("foo"):
        op = core.CreateOperator("Relu", ["x", b"w"], ("y",), control_input=["c"])
        assert op.input == ["foo/x", "foo/w"] and op.output == ["foo/y"]
        assert op.control_input == ["foo/c"]
        op = core.CreateOperator("Relu", BlobReference("x"), [BlobReference("y")])
        assert op.input == ["x"] and op.output == ["y"]


def test_create_operator_rejects_bad_io_types():
    with pytest.raises(TypeError, match="Unknown input/output type"):
        core.CreateOperator("Relu", 3, "y")
    with pytest.raises(TypeError, match="I/O blob #1 of unsupported type"):
        core.CreateOperator("Relu", ["x", 3], "y")


def test_create_operator_device_scope_and_random_seed():
    cuda = core.DeviceOption(proto.CUDA, 1)
    with core.DeviceScope(cuda):
        op = core.CreateOperator("Relu", "x", "y")
        assert op.device_option.device_type == proto.CUDA and op.device_option.device_id == 1
        op = core.CreateOperator("Relu", "x", "y", device_option=proto.DeviceOption(device_type=0))
        assert op.device_option.device_type == 0 and not op.device_option.HasField("device_id")
    op = core.CreateOperator("Relu", "x", "y", random_seed=5)
    assert op.device_option.random_seed == 5
    assert "random_seed" not in args_of(op)


@pytest.mark.parametrize(
    "value, expected",
    [
        (1.5, ("f", 1.5)),
        (2, ("i", 2)),
        (True, ("i", 1)),
        (False, ("i", 0)),
        ("abc", ("s", b"abc")),
        (b"\x00", ("s", b"\x00")),
        ([1.0, 2.5], ("floats", [1.0, 2.5])),
        ((1, 2), ("ints", [1, 2])),
        ([True, 3], ("ints", [1, 3])),
        (["a", b"b"], ("strings", [b"a", b"b"])),
        (np.array([[1.0, 2.0]], dtype=np.float32), ("floats", [1.0, 2.0])),
        (np.array([[1, 2], [3, 4]]), ("ints", [1, 2, 3, 4])),
        (np.array([0.5]), ("floats", [0.5])),
        (np.int32(7), ("i", 7)),
        (np.float64(0.25), ("f", 0.25)),
        ([np.int64(1), np.int64(2)], ("ints", [1, 2])),
        ([], None),  # an empty list: an argument with no value
        (range(3), ("ints", [0, 1, 2])),
    ],
)
def test_argument_mapping(value, expected):
    op = core.CreateOperator("X", [], [], v=value)
    assert args_of(op) == {"v": expected}


def test_argument_mapping_of_protos():
    net = proto.NetDef(name="inner")
    op = core.CreateOperator("X", [], [], n=net, nets=[net, net])
    assert op.arg[0].n == net and op.arg[0].HasField("n")
    assert [n.name for n in op.arg[1].nets] == ["inner", "inner"]
    option = proto.DeviceOption(device_type=1)
    op = core.CreateOperator("X", [], [], d=option, ds=[option])
    assert op.arg[0].s == option.SerializeToString() == b"\x08\x01"
    assert op.arg[1].strings == [b"\x08\x01"]


def test_argument_mapping_errors_and_none():
    op = core.CreateOperator("X", [], [], skipped=None, kept=0)
    assert [a.name for a in op.arg] == ["kept"]
    with pytest.raises(ValueError, match="Unknown iterable argument type"):
        core.CreateOperator("X", [], [], v=[1, 2.5])
    with pytest.raises(ValueError, match="Unknown argument type"):
        core.CreateOperator("X", [], [], v=object())


# ------------------------------------------------------------ net naming --


def test_net_names_are_made_unique_process_wide():
    assert Net("a").Name() == "a"
    assert Net("a").Name() == "a_1"
    assert str(Net("a")) == "a_2"
    assert Net("b").Name() == "b"
    Net._reset_used_names()
    assert Net("a").Name() == "a"


def test_net_from_proto_copies_and_renames():
    original = Net("orig")
    original.Relu("x", "y")
    copy_net = Net(original.Proto())
    assert copy_net.Name() == "orig_1"
    assert copy_net.Proto() is not original.Proto()
    assert copy_net.BlobIsDefined("y") and copy_net.BlobIsDefined("x")
    assert copy_net.Proto().external_input == ["x"]
    adopted_proto = proto.NetDef(name="own")
    adopted = Net(adopted_proto, inplace=True)
    assert adopted.Proto() is adopted_proto and adopted_proto.name == "own"


def test_net_from_proto_resumes_automatic_names_after_multi_digit_index():
    netdef = proto.NetDef(name="foo")
    netdef.op.add(type="Relu", input=["foo_blob_3"], output=["foo_blob_12"])
    netdef.op.add(type="Relu", input=["foo_blob_x"], output=["foo_blob_7:0"])
    net = Net(netdef)
    assert net.Name() == "foo"
    assert net.NextName() == "foo_blob_13"  # Caffe2 read one digit and gave foo_blob_2


def test_net_names_with_an_active_net_builder_prefix(monkeypatch):
    class FakeBuilder:
        active = None

        @classmethod
        def current(cls, required=True):
            return cls.active

    fake = types.ModuleType("ferrocaffe.net_builder")
    fake.NetBuilder = FakeBuilder
    monkeypatch.setitem(sys.modules, "ferrocaffe.net_builder", fake)
    builder = FakeBuilder()
    builder.name = "trainer_1/task_2"
    FakeBuilder.active = builder
    assert Net("x").Name() == "trainer_1/task_2/x"
    assert Net(None).Name() == "trainer_1/task_2"
    assert Net(None).Name() == "trainer_1/task_2_1"
    net = Net("y")
    assert str(net.Const(1)) == "trainer_1/task_2/y/GivenTensorInt64Fill:0"
    assert Net(net.Proto()).Name() == "trainer_1/task_2/trainer_1/task_2/y"
    FakeBuilder.active = None
    assert Net("x").Name() == "x"


# --------------------------------------------------------- automatic names --


def test_next_name_sequences():
    net = Net("net")
    assert net.NextName() == "net_blob_0"
    assert net.NextName() == "net_blob_1"
    a = net.AddExternalInput("a")
    assert str(net.Add([a, a])) == "net/Add"
    assert str(net.Add([a, a])) == "net/Add_2"
    assert str(net.Add([a, a])) == "net/Add_3"
    assert net.NextName("Add") == "net/Add_4"  # not registered until used
    outs = net.Sum([a], 2)
    assert outs == (BlobReference("net/Sum:0"), BlobReference("net/Sum:1"))
    assert net.Sum([a], 2) == (BlobReference("net/Sum_2:0"), BlobReference("net/Sum_2:1"))
    assert net.NextName("Sum", 0) == "net/Sum_3:0"
    assert net.NextName("Sum", 1) == "net/Sum_3:1"


def test_next_name_takes_the_name_scope_into_account():
    net = Net("net")
    a = net.AddExternalInput("a")
    assert str(net.Add([a, a])) == "net/Add"
    with core.NameScope("s"):
        # the scoped name s/net/Add is free, so no suffix; the scope is added
        # when the op is created
        assert net.NextName("Add") == "net/Add"
        assert str(net.Add([a, a])) == "s/net/Add"
        assert str(net.Add([a, a])) == "s/net/Add_2"
    # the suffix cache for "net/Add" moved on inside the scope
    assert str(net.Add([a, a])) == "net/Add_3"


def test_next_blob_and_next_scoped_blob():
    net = Net("net")
    assert net.NextBlob("b") == "b"
    assert net.NextBlob("b") == "b_auto_0"
    assert net.NextBlob("b") == "b_auto_1"
    net.Relu("x", "defined")
    assert net.NextBlob("defined") == "defined_auto_0"
    assert net.NextBlob() == "unnamed"
    with core.NameScope("s"):
        assert net.NextScopedBlob("c") == "s/c"
        assert net.NextScopedBlob("c") == "s/c_auto_0"
    net2 = Net("net")
    with core.NameScope("foo"):
        net2.Add(["a", "b"], net2.NextScopedBlob("ab"))
    assert net2.Proto().op[0].output == ["foo/ab"]


# ----------------------------------------------------------- op creation --


def test_op_creation_adds_external_inputs_and_returns_refs():
    net = Net("net")
    y = net.Relu("x", "y")
    assert isinstance(y, BlobReference) and y.Net() is net and y == "y"
    assert net.Proto().external_input == ["x"]
    net.Relu(y, "z")  # y is defined: not an external input
    assert net.Proto().external_input == ["x"]
    assert net.Print(["z"], []) is None
    outs = net.Concat(["y", "z"], ["c", "split"])
    assert outs == (BlobReference("c"), BlobReference("split"))
    assert all(o.Net() is net for o in outs)
    with pytest.raises(AssertionError):
        net.Relu(BlobReference("undefined_here", net), "w")


def test_unregistered_op_types_raise_attribute_error():
    net = Net("net")
    with pytest.raises(AttributeError, match=r"Method Ad is not a registered operator. Did you mean: \[Add\]"):
        net.Ad
    assert not hasattr(net, "name")  # duck typing on Net stays False
    assert not hasattr(net, "__foo__") and not hasattr(net, "_foo")
    assert hasattr(net, "Relu")
    assert hasattr(net, "Conv")  # only registered with the CUDNN engine
    assert "Relu" in dir(net) and "Conv_ENGINE_CUDNN" not in dir(net)


def test_operator_registry_queries():
    assert core.IsOperator("Add") and not core.IsOperator("Nope")
    assert core.IsOperatorWithEngine("Conv", "CUDNN") and not core.IsOperator("Conv")
    assert core.IsOperatorWithEngine("Add", "DEFAULT")
    assert core._GetRegisteredOperators() == OPS
    assert core.RegisteredOperators() == sorted(OPS)


def test_registry_is_read_from_the_compiled_module(monkeypatch):
    monkeypatch.undo()  # drop the fixture's fixed list
    fake = types.ModuleType("ferrocaffe._core")
    fake.registered_operators = lambda: ["Only"]
    monkeypatch.setitem(sys.modules, "ferrocaffe._core", fake)
    core.RefreshRegisteredOperators()
    assert core._REGISTRY_AVAILABLE
    assert core.IsOperator("Only") and not core.IsOperator("Add")
    # a miss re-reads the registry, which may have grown
    fake.registered_operators = lambda: ["Only", "Add"]
    assert core.IsOperator("Add")
    with pytest.raises(AttributeError):
        Net("n").Relu


def test_without_the_compiled_module_any_camel_case_name_is_accepted(monkeypatch):
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "ferrocaffe._core", None)  # import fails
    core.RefreshRegisteredOperators()
    assert core._REGISTRY_AVAILABLE is False
    assert core._GetRegisteredOperators() == set()
    net = Net("n")
    assert str(net.Whatever(["a"])) == "n/Whatever"
    assert not hasattr(net, "name") and not hasattr(net, "lower_case")
    assert not core.IsOperatorWithEngine("Whatever", "CUDNN")


# ---------------------------------------------------------------- Const --


def test_const_dtypes():
    net = Net("net")
    five = net.Const(5)
    assert str(five) == "net/GivenTensorInt64Fill:0"
    op = net.Proto().op[0]
    assert op.type == "GivenTensorInt64Fill" and op.input == []
    assert args_of(op) == {"shape": None, "values": ("ints", [5])}  # 0-dim
    hundred = net.Const([100])
    assert str(hundred) == "net/GivenTensorInt64Fill_2:0"
    assert args_of(net.Proto().op[1]) == {"shape": ("ints", [1]), "values": ("ints", [100])}

    flag = net.Const(True)
    op = net.Proto().op[2]
    assert str(flag) == "net/ConstantFill:0" and op.type == "ConstantFill"
    assert args_of(op) == {"dtype": ("i", core.DataType.BOOL), "value": ("i", 1)}

    cases = [
        (np.array([1, 2], dtype=np.int32), "GivenTensorIntFill", ("ints", [1, 2])),
        ([[1.5], [2.0]], "GivenTensorFill", ("floats", [1.5, 2.0])),
        (["a", "bc"], "GivenTensorStringFill", ("strings", [b"a", b"bc"])),
        ([b"x"], "GivenTensorStringFill", ("strings", [b"x"])),
        ([True, False], "GivenTensorBoolFill", ("ints", [1, 0])),
        (np.array([3], dtype=np.uint8), "GivenTensorFill", ("floats", [3.0])),
    ]
    for value, op_type, values in cases:
        before = len(net.Proto().op)
        net.Const(value)
        op = net.Proto().op[before]
        assert op.type == op_type, value
        assert args_of(op)["values"] == values, value
    assert args_of(net.Proto().op[-5])["shape"] == ("ints", [2, 1])


def test_const_with_dtype_and_blob_out():
    net = Net("net")
    out = net.Const([1, 2], blob_out="c", dtype=np.float32)
    assert out == "c" and out.Net() is net
    op = net.Proto().op[0]
    assert op.type == "GivenTensorFill" and op.output == ["c"]
    net.Const(7, dtype=np.int32)
    assert net.Proto().op[1].type == "GivenTensorIntFill"
    net.Const(False, blob_out=BlobReference("stop"))
    assert net.Proto().op[2].output == ["stop"]
    assert args_of(net.Proto().op[2])["value"] == ("i", 0)


def test_log_info():
    net = Net("net")
    x = net.Relu("a", "x")
    net.LogInfo("hello", x)
    ops = net.Proto().op
    assert [o.type for o in ops] == ["Relu", "GivenTensorStringFill", "Print", "Print"]
    assert ops[1].output == ["net/log"]
    assert args_of(ops[1]) == {"shape": None, "values": ("strings", [b"hello"])}
    assert ops[2].input == ["net/log"] and ops[2].output == []
    assert ops[3].input == ["x"]
    net.LogInfo("again")
    assert net.Proto().op[4].output == ["net/log_2"]


# ---------------------------------------------------------- Python op --


@pytest.fixture
def python_ops(monkeypatch):
    calls = []
    fake = types.ModuleType("ferrocaffe._python_ops")

    def register(f, pass_workspace=False):
        calls.append((f, pass_workspace))
        return "token:%d" % len(calls)

    fake.register = register
    fake.calls = calls
    fake.trusted = []
    fake.trust = fake.trusted.append
    monkeypatch.setitem(sys.modules, "ferrocaffe._python_ops", fake)
    monkeypatch.setattr(ferrocaffe, "_python_ops", fake, raising=False)
    return fake


def test_python_op_with_a_callable(python_ops):
    net = Net("net")

    def f(inputs, outputs, ws):
        pass

    out = net.Python(f, pass_workspace=True)(["x"], ["y"], extra=2)
    assert out == "y"
    assert python_ops.calls == [(f, True)]
    op = net.Proto().op[0]
    assert op.type == "Python" and op.input == ["x"] and op.output == ["y"]
    assert [a.name for a in op.arg] == [
        "grad_output_indices", "grad_input_indices", "extra", "token"]
    assert args_of(op)["token"] == ("s", b"token:1")
    assert args_of(op)["grad_output_indices"] is None
    net.Python(f, grad_output_indices=[0])(["x"], 1)
    assert args_of(net.Proto().op[1])["grad_output_indices"] == ("ints", [0])
    assert net.Proto().op[1].output == ["net/Python:0"]


def test_python_op_with_a_builder_tuple(python_ops):
    net = Net("net")
    net.Python((dict, [[("a", 1)]], {"b": 2}))(["x"], ["y"])
    assert python_ops.calls == []  # built per op instance, not registered
    op = net.Proto().op[0]
    values = args_of(op)
    assert values["pass_workspace"] == ("i", 0)
    func, args, kwargs = pickle.loads(values["pickled_builder"][1])
    assert func is dict and args == ([("a", 1)],) and kwargs == {"b": 2}
    # Made here, so trusted to be unpickled when the op is built.
    assert python_ops.trusted == [values["pickled_builder"][1]]
    assert func(*args, **kwargs) == {"a": 1, "b": 2}
    with pytest.raises(AssertionError, match=r"Expected builder tuple \(func, args, kwargs\)"):
        net.Python((dict, []))


def test_python_op_gradient_and_function_are_of_one_kind(python_ops):
    net = Net("net")
    with pytest.raises(AssertionError, match="A tuple has to be passed to both f and grad_f"):
        net.Python((dict, [], {}), grad_f=lambda i, o: None)


# ------------------------------------------------------ attributes, lookups --


def test_attributes():
    net = Net("net")
    assert net.get_attributes("k") == []
    assert "k" not in net._attr_dict  # reading does not create it
    net.add_attribute("k", 1)
    net.add_attribute("k", 2)
    assert net.get_attributes("k") == [1, 2]


def test_blob_lookups():
    net = Net("net")
    net.AddExternalInput("ext")
    net.Relu("ext", "mid")
    net.Relu("mid", "out")
    net.AddExternalOutput(net.GetBlobRef("out"))
    assert net.BlobIsDefined("ext") and net.BlobIsDefined("mid")
    assert net.BlobIsDefined(BlobReference("out")) and not net.BlobIsDefined("nope")
    assert net.UsesBlob("mid") and net.UsesBlob("ext") and not net.UsesBlob("out")
    assert net.UsedBlobNames() == {"ext", "mid", "out"}
    ref = net.GetBlobRef("mid")
    assert ref == "mid" and ref.Net() is net
    with pytest.raises(KeyError, match="Net does not define blob nope"):
        net.GetBlobRef("nope")
    # editing the proto directly is seen by later lookups
    net.Proto().op.add(type="Relu", input=["out"], output=["late"])
    net.Proto().external_input.append("late_ext")
    assert net.BlobIsDefined("late") and net.BlobIsDefined("late_ext")
    net._CheckLookupTables()


def test_external_inputs_and_outputs():
    net = Net("net")
    a = net.AddExternalInput("a")
    assert isinstance(a, BlobReference) and a == "a"
    b, c = net.AddExternalInputs("b", BlobReference("c", net))
    assert c.Net() is net  # a given ref comes back as given (Caffe2 bug fixed)
    assert b.Net() is None
    assert net.external_inputs == ["a", "b", "c"]
    with pytest.raises(AssertionError, match="Net already contains an input named a"):
        net.AddExternalInput("a")
    with pytest.raises(AssertionError, match="Net already contains an input named d"):
        net.AddExternalInput("d", "d")
    assert net.external_inputs == ["a", "b", "c"]
    with pytest.raises(AssertionError):
        net.AddExternalInput()
    y = net.Relu(a, "y")
    net.AddExternalOutput(y)
    net.AddExternalOutputs(y, a)  # no de-duplication
    assert net.external_outputs == ["y", "y", "a"]
    assert all(isinstance(r, BlobReference) for r in net.external_outputs)
    with pytest.raises(AssertionError):
        net.AddExternalOutput("y")  # must be a BlobReference
    with pytest.raises(AssertionError, match="zz is not defined"):
        net.AddExternalOutput(BlobReference("zz"))
    with core.NameScope("s"):
        refs = net.AddScopedExternalInputs("q")
    assert refs == ["s/q"]


# ------------------------------------------------------------ AppendNet --


def test_append_net_merges_external_inputs():
    a = Net("A")
    a.Sum(["in1", "in2"], ["sum1"])
    b = Net("B")
    b.Sum(["in3", "in4"], ["in1"])
    assert b.AppendNet(a) is b
    # in1 is produced in B, so it does not become an external input
    assert b.Proto().external_input == ["in3", "in4", "in2"]
    assert [list(o.output) for o in b.Proto().op] == [["in1"], ["sum1"]]

    a2 = Net("A")
    a2.Sum(["in1", "in2"], ["sum1"])
    b2 = Net("B")
    b2.Sum(["in3", "in4"], ["in1"])
    a2.AppendNet(b2)  # the other order: in1 stays external
    assert "in1" in a2.external_inputs
    assert a2.Proto().external_input == ["in1", "in2", "in3", "in4"]


def test_append_net_external_outputs_and_device_option():
    a = Net("a")
    x = a.Relu("i", "x")
    a.AddExternalOutput(x)
    b = Net("b")
    bx = b.Relu("i", "x")
    b.AddExternalOutput(bx)
    b.Relu("x", "z")
    option = core.DeviceOption(proto.CUDA, 2)
    a.AppendNet(b, device_option=option)
    assert a.Proto().external_output == ["x"]
    assert len(a.Proto().op) == 3
    assert a.Proto().op[1].device_option == option
    assert not b.Proto().op[0].HasField("device_option")  # copies were changed
    assert a.BlobIsDefined("z")


# ---------------------------------------------------------------- Clone --


def test_clone():
    net = Net("orig")
    a = net.AddExternalInput("a")
    b = net.Relu(a, "b")
    c = net.Relu(b, "c")
    net.Relu(c, "d")
    net.AddExternalOutput(net.GetBlobRef("d"))
    net.add_attribute("k", "v")

    clone = net.Clone("copy", blob_remap={"a": "A", "d": "D"})
    assert clone.Name() == "copy"
    p = clone.Proto()
    assert [list(o.input) for o in p.op] == [["A"], ["b"], ["c"]]
    assert p.op[2].output == ["D"]
    assert p.external_input == ["A"] and p.external_output == ["D"]
    assert clone.BlobIsDefined("D") and not clone.BlobIsDefined("d")
    assert net.Proto().op[0].input == ["a"]  # the original is untouched

    assert clone.get_attributes("k") == ["v"]
    clone.add_attribute("k", "w")
    assert net.get_attributes("k") == ["v"]  # Caffe2 bug fixed: no longer shared

    assert net.Clone("copy").Name() == "copy_1"


def test_clone_with_mask_remap_funcs_and_external_update():
    net = Net("orig")
    net.Relu("a", "b")
    net.Relu("b", "c")
    net.Copy("c", "e")
    seen = []

    def remap_copy(op, prefix, blob_remap):
        seen.append((op.type, prefix))
        op.arg.add(name="remapped", i=1)

    clone = net.Clone("part", op_id_mask=[2, 1], remap_funcs={"Copy": remap_copy},
                      update_external_list=True)
    p = clone.Proto()
    assert [o.type for o in p.op] == ["Copy", "Relu"]
    assert seen == [("Copy", "part/")]
    assert args_of(p.op[0]) == {"remapped": ("i", 1)}
    # c is read before anything writes it among the kept ops
    assert p.external_input == ["c", "b"]
    assert sorted(p.external_output) == ["c", "e"]


# -------------------------------------------------------- ExecutionStep --


def test_step_default_names_are_unique():
    assert core.ExecutionStep(None).Name() == "step"
    assert core.ExecutionStep("").Name() == "step_1"
    assert core.ExecutionStep("named").Name() == "named"
    assert str(core.ExecutionStep(None)) == "step_2"


def test_step_constructor_deduplicates_nets_but_add_net_does_not():
    net = Net("n")
    step = core.ExecutionStep("s", [net, net], num_iter=3)
    assert step.Proto().network == ["n"] and step.Proto().num_iter == 3
    assert step.AddNet(net) is step
    assert step.Proto().network == ["n", "n"]  # runs twice
    assert step.Nets() == [net] and step.get_net("n") is net
    assert core.ExecutionStep("t", net).Proto().network == ["n"]
    with pytest.raises(AssertionError, match="Different nets with same name: n"):
        step.AddNet(_same_name_net("n"))


def _same_name_net(name):
    other = Net("other")
    other.Proto().name = name
    return other


def test_step_setters():
    step = core.ExecutionStep("s")
    step.SetIter(4)
    step.SetCreateWorkspace(True)
    step.SetNumConcurrentInstances(8)
    step.SetOnlyOnce(True)
    step.SetShouldStopBlob(BlobReference("stop"))
    step.SetConcurrentSubsteps(True)
    step.RunEveryMillis(100)
    p = step.Proto()
    assert (p.num_iter, p.create_workspace, p.num_concurrent_instances) == (4, True, 8)
    assert (p.only_once, p.should_stop_blob, p.concurrent_substeps) == (True, "stop", True)
    assert p.run_every_ms == 100
    with pytest.raises(AssertionError, match="expects BlobReference here, got <class 'str'>"):
        step.SetShouldStopBlob("stop")
    report = Net("report")
    step.SetReportNet(report, 5)
    assert (p.report_net, p.report_interval) == ("report", 5)
    assert step.Nets() == [report]


MUTATORS = [
    ("SetIter", (1,)),
    ("SetCreateWorkspace", (True,)),
    ("SetNumConcurrentInstances", (2,)),
    ("SetOnlyOnce", (True,)),
    ("SetShouldStopBlob", (BlobReference("s"),)),
    ("SetConcurrentSubsteps", (True,)),
    ("RunEveryMillis", (10,)),  # Caffe2 bug fixed: it was not checked
    ("SetReportNet", ("r", 1)),
    ("AddNet", None),
    ("AddSubstep", None),
]


@pytest.mark.parametrize("method, args", MUTATORS)
def test_a_used_step_cannot_be_mutated(method, args):
    step = core.ExecutionStep("s", Net("n"))
    core.ExecutionStep("parent").AddSubstep(step)
    if args is None:
        args = (Net("m"),) if method == "AddNet" else (core.ExecutionStep("x", Net("k")),)
    with pytest.raises(
        AssertionError, match="Cannot mutate a step that has already been added to a plan/step."
    ):
        getattr(step, method)(*args)


def test_nets_and_substeps_are_exclusive():
    with_nets = core.ExecutionStep("a", Net("n"))
    with pytest.raises(AssertionError, match="Cannot have both network and substeps."):
        with_nets.AddSubstep(core.ExecutionStep("b", Net("m")))
    with pytest.raises(AssertionError, match="Cannot have both network and substeps."):
        with_nets.SetConcurrentSubsteps(True)
    with_sub = core.ExecutionStep("c").AddSubstep(core.ExecutionStep("d", Net("k")))
    with pytest.raises(AssertionError, match="Cannot have both network and substeps."):
        with_sub.AddNet(Net("j"))
    with pytest.raises(AssertionError):
        core.ExecutionStep("e").AddNet("not a net")


def test_add_substep():
    n1, n2 = Net("n1"), Net("n2")
    child = core.ExecutionStep("child", n1)
    parent = core.ExecutionStep("parent")
    assert parent.AddSubstep(child) is parent
    assert child._is_used
    assert parent.Proto().substep[0] == child.Proto()
    assert parent.Proto().substep[0] is not child.Proto()  # a copy
    empty = core.ExecutionStep("empty")
    parent.AddSubstep(empty)
    assert empty._is_used and len(parent.Proto().substep) == 1  # dropped
    parent.AddSubstep(proto.ExecutionStep(name="raw", network=["n2"]))
    assert [s.name for s in parent.Proto().substep] == ["child", "raw"]
    assert parent.Substeps() == [child]
    assert parent.Nets() == [n1]
    assert parent.HasSubsteps() and not parent.HasNets()
    n1.add_attribute("a", 1)
    n2.add_attribute("a", 2)
    other = core.ExecutionStep("other", n2)
    parent.AddSubstep(other)
    assert parent.get_all_attributes("a") == [1, 2]


# -------------------------------------------------------- execution_step --


def test_execution_step_iteration_rules():
    net = Net("n")
    step = execution_step("s", net)
    assert step.Proto().num_iter == 1 and not step.Proto().HasField("should_stop_blob")
    stop = BlobReference("stop")
    step = execution_step("s2", net, should_stop_blob=stop)
    assert not step.Proto().HasField("num_iter") and step.Proto().should_stop_blob == "stop"
    with pytest.raises(AssertionError, match="Cannot set both should_stop_blob and num_iter."):
        execution_step("s3", net, num_iter=2, should_stop_blob=stop)


def test_execution_step_options():
    net, report = Net("n"), Net("report")
    step = execution_step(
        "s", [core.ExecutionStep("x", net)], num_iter=5, report_net=report, report_interval=3,
        concurrent_substeps=True, only_once=False, num_concurrent_instances=2,
        create_workspace=True, run_every_ms=50)
    p = step.Proto()
    assert (p.num_iter, p.report_net, p.report_interval) == (5, "report", 3)
    assert (p.concurrent_substeps, p.only_once, p.num_concurrent_instances) == (True, False, 2)
    assert (p.create_workspace, p.run_every_ms) == (True, 50)
    plain = execution_step("t", net, create_workspace=False, run_every_ms=0).Proto()
    assert not plain.HasField("create_workspace") and not plain.HasField("run_every_ms")
    assert not plain.HasField("only_once") and not plain.HasField("concurrent_substeps")
    with pytest.raises(AssertionError):
        execution_step("u", net, report_net=report)


def test_execution_step_contents():
    a, b = Net("a"), Net("b")
    assert execution_step("s", [a, b, a]).Proto().network == ["a", "b", "a"]
    child = core.ExecutionStep("child", b)
    step = execution_step("m", [child, a])  # mixed: every item becomes a substep
    assert [s.name for s in step.Proto().substep] == ["child", "step"]
    assert step.Proto().substep[1].network == ["a"]
    assert execution_step("sub", core.ExecutionStep("only", a)).Proto().substep[0].name == "only"
    for empty in (None, []):
        p = execution_step("e", empty).Proto()
        assert len(p.network) == 0 and len(p.substep) == 0
    with pytest.raises(ValueError, match="steps_or_nets must be a step, a net, or a list"):
        execution_step("bad", "net-name")
    with core.NameScope("scope"):
        assert core.scoped_execution_step("s", a).Name() == "scope/s"
        assert core.scoped_execution_step(None, a).Name() == "step_1"


def test_to_execution_step():
    net = Net("n")
    step = core.ExecutionStep("s", net)
    assert core.to_execution_step(step) is step
    made = core.to_execution_step(net, "named")
    assert made.Name() == "named" and made.Proto().network == ["n"]
    assert core.to_execution_step([net]).Name() == "step"


def test_to_execution_step_with_a_net_builder(monkeypatch):
    class FakeBuilder:
        @classmethod
        def current(cls, required=True):
            return None

        def __init__(self, name, children, stop_blob):
            self.name = name
            self._children = children
            self._stop_blob = stop_blob
            self.frozen = False

        def get(self):
            self.frozen = True
            return self._children

    fake = types.ModuleType("ferrocaffe.net_builder")
    fake.NetBuilder = FakeBuilder
    monkeypatch.setitem(sys.modules, "ferrocaffe.net_builder", fake)
    net = Net("n")
    stop = BlobReference("stop")
    looping = FakeBuilder("loop", [net], stop)
    step = core.to_execution_step(looping)
    assert looping.frozen
    assert step.Name() == "loop" and step.Proto().should_stop_blob == "stop"
    assert not step.Proto().HasField("num_iter")  # loops until the stop blob
    once = core.to_execution_step(FakeBuilder("once", [net], None), "given")
    assert once.Name() == "given" and once.Proto().num_iter == 1
    # builders inside a list become substeps
    outer = execution_step("outer", [FakeBuilder("inner", [net], None), net])
    assert [s.name for s in outer.Proto().substep] == ["inner", "step"]


def test_create_step_from_proto():
    a, b = Net("a"), Net("b")
    original = execution_step(
        "root", [execution_step("x", [a, b], num_iter=3),
                 execution_step("y", b, should_stop_blob=BlobReference("s"), only_once=True,
                                run_every_ms=7, create_workspace=True)],
        concurrent_substeps=True)
    nets = {"a": a}
    protos = {"b": b.Proto()}
    step = core.ExecutionStep.create_from_proto(original.Proto(), nets, protos)
    assert step.Name() == "root"  # explicit step names are kept
    p = step.Proto()
    assert p.concurrent_substeps and [s.name for s in p.substep] == ["x", "y"]
    assert p.num_iter == 1
    assert p.substep[0].num_iter == 3
    x = p.substep[0]
    assert x.network == ["a", "b_1"]  # a net created from its proto is renamed
    y = p.substep[1]
    assert (y.should_stop_blob, y.only_once, y.run_every_ms, y.create_workspace) == (
        "s", True, 7, True)
    assert nets["a"] is a and nets["b"].Name() == "b_1"


def test_add_nets_in_order():
    a, b, c, r = Net("a"), Net("b"), Net("c"), Net("r")
    first = execution_step("first", [b, a])
    second = execution_step("second", [a, c])
    top = execution_step("top", [first, second], report_net=r, report_interval=1)
    names = ["c"]
    core.add_nets_in_order(top, names)
    assert names == ["c", "b", "a", "r"]


# ------------------------------------------------------------------ Plan --


def test_plan_collects_nets_in_order_of_use():
    a, b, c = Net("a"), Net("b"), Net("c")
    plan = Plan("p")
    step1 = execution_step("s1", [execution_step("x", [b, a]), execution_step("y", [a])])
    plan.AddStep(step1)
    plan.AddStep(execution_step("s2", [c, a]))
    p = plan.Proto()
    assert p.name == "p" and str(plan) == "p"
    assert [n.name for n in p.network] == ["b", "a", "c"]
    assert [s.name for s in p.execution_step] == ["s1", "s2"]
    assert plan.Nets() == [b, a, c] and plan.Steps()[0] is step1
    with pytest.raises(AssertionError, match="Cannot mutate a step"):
        step1.SetIter(2)


def test_plan_snapshots_nets_and_drops_empty_steps():
    net = Net("n")
    net.Relu("x", "y")
    plan = Plan(execution_step("main", net))
    assert plan.Proto().name == "main"
    net.Relu("y", "z")  # after the plan took its copy
    assert len(plan.Proto().network[0].op) == 1
    empty = execution_step("empty", [])
    plan.AddStep(empty)
    assert empty._is_used and len(plan.Proto().execution_step) == 1
    with pytest.raises(ValueError, match="name_or_step must be a string or ExecutionStep"):
        Plan(3)
    with pytest.raises(AssertionError, match="Different nets with same name: n"):
        plan.AddNets([_same_name_net("n")])
    plan.AddNets([net])  # the same object: already there, not re-copied
    assert len(plan.Proto().network) == 1


def test_plan_attributes_and_round_trips():
    a = Net("a")
    a.add_attribute("setup", "A")
    a.Relu("x", "y")
    plan = Plan("p")
    plan.AddStep(execution_step("s", [a, a], num_iter=2))
    assert plan.get_all_attributes("setup") == ["A"]

    data = plan.Proto().SerializeToString()
    assert proto.PlanDef.FromString(data) == plan.Proto()

    rebuilt = Plan.create_from_proto(plan.Proto())
    p = rebuilt.Proto()
    assert p.name == "p"
    assert [n.name for n in p.network] == ["a_1"]
    assert p.execution_step[0].network == ["a_1", "a_1"]
    assert p.execution_step[0].name == "s" and p.execution_step[0].num_iter == 2
    assert p.network[0].op == plan.Proto().network[0].op


def test_net_of_a_thousand_ops_round_trips():
    # (Its speed is benches/bench_proto.py's business, not a test's.)
    net = Net("big")
    x = net.AddExternalInput("x")
    for _ in range(1000):
        x = net.Relu(x)
    data = net.Proto().SerializeToString()
    assert proto.NetDef.FromString(data) == net.Proto()
    assert net.Proto().op[999].output == ["big/Relu_1000"]


def test_nets_steps_and_plans_say_what_they_are_in_repr():
    net = Net("repr_train")
    net.ConstantFill([], "x", shape=[1], value=1.0)
    net.Add(["x", "x"], "y")
    assert repr(net) == "<Net 'repr_train': 2 ops>"
    assert repr(Net("repr_one_op_less")) == "<Net 'repr_one_op_less': 0 ops>"
    step = core.execution_step("repr_loop", net, num_iter=5)
    assert repr(step) == "<ExecutionStep 'repr_loop': num_iter=5, 1 net, 0 substeps>"
    other = Net("repr_other")
    other.ConstantFill([], "z", shape=[1], value=0.0)
    outer = core.execution_step("repr_outer", [step, core.execution_step("repr_b", other)],
                                concurrent_substeps=True)
    # execution_step runs a step once unless told otherwise (num_iter=1), as Caffe2's did.
    assert repr(outer) == "<ExecutionStep 'repr_outer': num_iter=1, concurrent_substeps=True, 0 nets, 2 substeps>"
    plan = core.Plan("repr_plan")
    plan.AddStep(outer)
    assert repr(plan) == "<Plan 'repr_plan': 1 step, 2 nets>"


def test_net_names_are_unique_in_the_process_even_against_suffixed_names():
    # Caffe2's later counter per base name gave "test_1" twice: to the
    # second "test" and to a net named "test_1" (optimizer_test's testSparse
    # then failed: a net named 'test_1' already exists in this workspace).
    names = [Net(n).Name() for n in ("test", "test", "test_1", "test", "test_1")]
    assert names == ["test", "test_1", "test_1_1", "test_2", "test_1_2"]
    assert len(set(names)) == len(names)
    # nets made from a NetDef (Clone too) get a free name as well
    proto = Net("x").Proto()
    assert Net(proto).Name() == "x_1"
    assert Net("n").Clone("test").Name() == "test_3"


def test_run_all_on_gpu_places_the_net_and_recurrent_step_nets():
    step = Net("step")
    step.Relu(["x"], "y")
    net = Net("outer")
    net.RecurrentNetwork(["x"], ["y"], step_net=step.Proto())
    net.Relu(["y"], "z")
    net.RunAllOnGPU(gpu_id=2, use_cudnn=True)
    netdef = net.Proto()
    for n in (netdef, netdef.op[0].arg[0].n):
        assert (n.device_option.device_type, n.device_option.device_id) == (proto.caffe2_pb2.CUDA, 2)
    assert [op.engine for op in netdef.op] == ["CUDNN", "CUDNN"]
    assert [op.engine for op in netdef.op[0].arg[0].n.op] == ["CUDNN"]
    net.RunAllOnMKL()
    assert netdef.device_option.device_type == proto.caffe2_pb2.MKLDNN
    net.RunAllOnIDEEP()
    assert netdef.device_option.device_type == proto.caffe2_pb2.IDEEP
    # It builds and serialises; running it here is refused, naming the device.
    assert netdef.SerializeToString()


def test_a_net_run_all_on_gpu_is_refused_when_created(monkeypatch):
    monkeypatch.undo()  # the real registry
    core.RefreshRegisteredOperators()
    from ferrocaffe import errors, workspace
    net = Net("on_gpu")
    net.Relu(["x"], "y")
    net.RunAllOnGPU()
    workspace.FeedBlob("x", np.ones(3, np.float32))
    with pytest.raises(errors.InvalidArgumentError, match=r"device type 1.*op #0 'Relu'"):
        workspace.RunNetOnce(net)
