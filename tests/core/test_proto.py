"""Tests of ferrocaffe.proto: caffe2_pb2 as real protobuf classes made from
proto/caffe2.proto, and the NetDefs core.Net builds with them.

Expected bytes are assembled by hand from the protobuf wire format: a tag is
the varint ``(field_number << 3) | wire_type`` with wire types 0 (varint),
1 (fixed64), 2 (length-delimited) and 5 (fixed32). The field numbers in them
are Caffe2's (its caffe2.proto), so these tests check the schema too.
"""

import copy
import math
import pickle
import struct
import sys
import threading
import weakref

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, text_format
from google.protobuf import message as pb_message

from ferrocaffe import _core, core, errors, proto, workspace
from ferrocaffe.proto import (
    Argument,
    BlobProto,
    DBReaderProto,
    DecodeError,
    DeviceOption,
    EncodeError,
    ExecutionStep,
    NetDef,
    OperatorDef,
    PlanDef,
    QTensorProto,
    TensorProto,
    TensorProtos,
    caffe2_pb2,
)


# ------------------------------------------------------------ wire format --


def test_small_operator_encodes_to_exact_bytes():
    op = OperatorDef(type="Add", input=["a", "b"], output=["c"], name="")
    op.arg.add(name="axis", i=1)
    op.device_option.random_seed = 7
    expected = (
        b"\x0a\x01a"  # 1: input "a"
        b"\x0a\x01b"  # 1: input "b"
        b"\x12\x01c"  # 2: output "c"
        b"\x1a\x00"  # 3: name "" (present, so written)
        b"\x22\x03Add"  # 4: type
        b"\x2a\x08"  # 5: arg, 8 bytes
        b"\x0a\x04axis"  # arg 1: name
        b"\x18\x01"  # arg 3: i = 1
        b"\x32\x02"  # 6: device_option, 2 bytes
        b"\x18\x07"  # device_option 3: random_seed = 7
    )
    assert op.SerializeToString() == expected
    assert OperatorDef.FromString(expected) == op


@pytest.mark.parametrize(
    "arg, expected",
    [
        (Argument(i=0), b"\x18\x00"),
        (Argument(i=300), b"\x18\xac\x02"),
        # negative ints are sign-extended to 64 bits: ten bytes
        (Argument(i=-1), b"\x18" + b"\xff" * 9 + b"\x01"),
        (Argument(f=1.5), b"\x15\x00\x00\xc0\x3f"),
        (Argument(s=b"\x00\xff"), b"\x22\x02\x00\xff"),
        # repeated ints and floats of Argument are not packed
        (Argument(ints=[1, 2]), b"\x30\x01\x30\x02"),
        (Argument(floats=[1.0]), b"\x2d\x00\x00\x80\x3f"),
        (Argument(strings=[b"x", b"y"]), b"\x3a\x01x\x3a\x01y"),
        (Argument(name="n", n=NetDef(name="m")), b"\x0a\x01n\x42\x03\x0a\x01m"),
        (Argument(t=TensorProto()), b"\x52\x00"),
        (Argument(qtensors=[QTensorProto(precision=8, scale=1.0, bias=0.0, is_signed=False)]),
         b"\x62\x16\x10\x08\x19" + struct.pack("<d", 1.0) + b"\x21" + struct.pack("<d", 0.0)
         + b"\x28\x00"),
    ],
)
def test_argument_encoding(arg, expected):
    assert arg.SerializeToString() == expected
    assert Argument.FromString(expected) == arg


def test_tensor_encoding_packs_the_data_fields_but_not_dims():
    t = TensorProto(dims=[2, 3], data_type=TensorProto.INT64, int64_data=[1, 300])
    assert t.SerializeToString() == (
        b"\x08\x02\x08\x03"  # 1: dims, one tag per value
        b"\x10\x0a"  # 2: data_type = 10
        b"\x52\x03\x01\xac\x02"  # 10: int64_data packed, 3 bytes
    )
    t = TensorProto(float_data=[1.0, 2.0], double_data=[1.0], int32_data=[-1])
    assert t.SerializeToString() == (
        b"\x1a\x08" + struct.pack("<2f", 1.0, 2.0)  # 3: packed floats
        + b"\x22\x0a" + b"\xff" * 9 + b"\x01"  # 4: packed int32 (-1 takes 10 bytes)
        + b"\x4a\x08" + struct.pack("<d", 1.0)  # 9: packed doubles
    )
    t = TensorProto(raw_data=b"\x01", storage_type=TensorProto.RAW, data_format=1,
                    device_detail=DeviceOption(device_type=1))
    assert t.SerializeToString() == b"\x42\x02\x08\x01\x60\x02\x6a\x01\x01\x78\x01"


def test_false_and_zero_survive_a_round_trip_when_set():
    step = ExecutionStep(name="s", only_once=False, num_iter=0)
    data = step.SerializeToString()
    assert data == b"\x0a\x01s\x20\x00\x50\x00"
    back = ExecutionStep.FromString(data)
    assert back.HasField("only_once") and back.only_once is False
    assert back.HasField("num_iter") and back.num_iter == 0
    assert not back.HasField("create_workspace")


def test_every_execution_step_and_blob_field_has_caffe2s_number():
    step = ExecutionStep(
        name="a", substep=[ExecutionStep()], network=["n"], num_iter=1, criteria_network="c",
        concurrent_substeps=True, report_net="r", report_interval=2, should_stop_blob="s",
        only_once=True, run_every_ms=3, create_workspace=True, num_concurrent_instances=4)
    assert step.SerializeToString() == (
        b"\x0a\x01a\x12\x00\x1a\x01n\x20\x01\x2a\x01c\x30\x01\x3a\x01r\x40\x02"
        b"\x4a\x01s\x50\x01\x58\x03\x60\x01\x68\x04")
    blob = BlobProto(name="b", type="T", tensor=TensorProto(), content=b"c",
                     content_num_chunks=2, content_chunk_id=1)
    assert blob.SerializeToString() == b"\x0a\x01b\x12\x01T\x1a\x00\x22\x01c\x30\x02\x38\x01"
    reader = DBReaderProto(name="r", source="s", db_type="minidb", key="k")
    assert reader.SerializeToString() == b"\x0a\x01r\x12\x01s\x1a\x06minidb\x22\x01k"
    op = OperatorDef(engine="E", control_input=["c"], is_gradient_op=True, debug_info="d",
                     domain="x", op_version=2)
    assert op.SerializeToString() == b"\x3a\x01E\x42\x01c\x48\x01\x52\x01d\x5a\x01x\x60\x02"
    net = NetDef(type="dag", num_workers=2, device_option=DeviceOption(), arg=[Argument()],
                 external_input=["i"], external_output=["o"])
    assert net.SerializeToString() == b"\x1a\x03dag\x20\x02\x2a\x00\x32\x00\x3a\x01i\x42\x01o"


def test_required_fields_of_segment():
    t = TensorProto(segment=dict(begin=1))
    with pytest.raises(EncodeError, match="segment.end"):
        t.SerializeToString()
    assert t.FindInitializationErrors() == ["segment.end"]
    assert t.SerializePartialToString() == b"\x5a\x02\x08\x01"
    t.segment.end = 4
    assert t.SerializeToString() == b"\x5a\x04\x08\x01\x10\x04"


@pytest.mark.parametrize(
    "data", [b"\x0a\x05ab", b"\x18", b"\x15\x00\x00", b"\x2a\x05\x0a\x01", b"\x18\xff", b"\x07"])
def test_truncated_or_malformed_input_raises_decode_error(data):
    with pytest.raises(DecodeError):
        Argument.FromString(data)


# ------------------------------------------------------------------ schema --


def test_the_classes_come_from_the_runtimes_descriptor():
    files = descriptor_pb2.FileDescriptorSet.FromString(_core.CAFFE2_FILE_DESCRIPTOR_SET).file
    assert [f.name for f in files] == ["caffe2.proto"]
    assert files[0].package == "caffe2" and files[0].syntax in ("", "proto2")
    described = descriptor_pb2.FileDescriptorProto()
    caffe2_pb2.DESCRIPTOR.CopyToProto(described)
    compiled = descriptor_pb2.FileDescriptorProto()
    compiled.CopyFrom(files[0])
    compiled.ClearField("source_code_info")  # comments: not kept by the pool
    assert described == compiled
    # Every message of the schema has its class, under its own name.
    for name, desc in caffe2_pb2.DESCRIPTOR.message_types_by_name.items():
        cls = getattr(caffe2_pb2, name)
        assert cls.DESCRIPTOR is desc and issubclass(cls, pb_message.Message)
    for name in ["NetDef", "OperatorDef", "Argument", "DeviceOption", "ExecutionStep", "PlanDef",
                 "TensorProto", "QTensorProto", "TensorProtos", "TensorShape", "TensorShapes",
                 "BlobProto", "DBReaderProto", "BlobSerializationOptions", "SerializationOptions"]:
        assert name in caffe2_pb2.DESCRIPTOR.message_types_by_name, name
        # ferrocaffe.proto re-exports the same classes.
        assert getattr(proto, name) is getattr(caffe2_pb2, name)


def test_the_runtime_and_python_agree_on_tensor_fields():
    # A TensorProto made in Python, decoded by the runtime, serialised back
    # by it: the fields come back as they were sent.
    ws = workspace.Workspace()
    sent = {
        "f": (TensorProto(dims=[2], data_type=TensorProto.FLOAT, float_data=[1.5, -2.0]),
              np.array([1.5, -2.0], np.float32)),
        "i": (TensorProto(dims=[1, 2], data_type=TensorProto.INT64, int64_data=[7, -(2**40)]),
              np.array([[7, -(2**40)]], np.int64)),
        "s": (TensorProto(dims=[2], data_type=TensorProto.STRING, string_data=[b"a", b"\xff"]),
              np.array([b"a", b"\xff"], object)),
        "d": (TensorProto(dims=[], data_type=TensorProto.DOUBLE, double_data=[0.25]),
              np.array(0.25)),
    }
    for name, (tensor, expected) in sent.items():
        ws.feed_blob(name, tensor)
        got = ws.fetch_blob(name)
        assert got.dtype == expected.dtype and got.tolist() == expected.tolist(), name
        back = BlobProto.FromString(ws.serialize_blob(name))
        assert back.name == name and back.type == "Tensor"
        assert list(back.tensor.dims) == list(tensor.dims)
        assert back.tensor.data_type == tensor.data_type


def test_enums():
    assert TensorProto.FLOAT == 1 and TensorProto.INT64 == 10 and TensorProto.DOUBLE == 13
    assert TensorProto.DataType.Name(10) == "INT64"
    assert TensorProto.DataType.Value("BOOL") == 5
    assert ("FLOAT16", 12) in TensorProto.DataType.items()
    with pytest.raises(ValueError):
        TensorProto.DataType.Name(11)
    assert TensorProto.StorageType.Value("RAW") == 2 and TensorProto.TYPED == 1
    assert caffe2_pb2.CPU == caffe2_pb2.PROTO_CPU == 0 and caffe2_pb2.CUDA == 1
    assert caffe2_pb2.HIP == 6 and proto.CPU == 0
    assert caffe2_pb2.DeviceTypeProto.Name(0) == "PROTO_CPU"


def test_defaults_when_unset():
    t = TensorProto()
    assert t.data_type == TensorProto.FLOAT and not t.HasField("data_type")
    assert t.storage_type == TensorProto.TYPED and t.data_format == 0
    op = OperatorDef()
    assert op.is_gradient_op is False and op.type == "" and op.op_version == 0
    assert QTensorProto().data_type == TensorProto.INT32


# -------------------------------------------------- the protobuf API works --


def _sample_net():
    net = core.Net("sample")
    x = net.AddExternalInput("x")
    y = net.Add([x, x], "y", broadcast=1)
    z = net.Scale(y, "z", scale=0.5)
    net.AddExternalOutput(z)
    return net


def test_net_proto_is_a_real_netdef():
    net = _sample_net()
    nd = net.Proto()
    assert isinstance(nd, NetDef) and isinstance(nd, pb_message.Message)
    copy_ = NetDef()
    copy_.CopyFrom(nd)
    assert copy_ == nd and copy_ is not nd
    merged = NetDef(name="m", external_input=["w"])
    merged.MergeFrom(nd)
    assert list(merged.external_input) == ["w", "x"] and len(merged.op) == 2
    data = nd.SerializeToString()
    assert NetDef.FromString(data) == nd
    text = text_format.MessageToString(nd)
    assert 'type: "Add"' in text and "f: 0.5" in text
    assert text_format.Parse(text, NetDef()) == nd
    assert pickle.loads(pickle.dumps(nd)) == nd
    assert copy.deepcopy(nd) == nd


def test_text_format_of_a_plan_round_trips():
    net = _sample_net()
    plan = core.Plan("p")
    plan.AddStep(core.execution_step("s", net, num_iter=3))
    text = str(plan.Proto())
    back = text_format.Parse(text, PlanDef())
    assert back == plan.Proto()
    assert back.execution_step[0].num_iter == 3


def test_messages_from_threads_do_not_interfere():
    results = []

    def work(k):
        net = NetDef(name="t%d" % k)
        for i in range(200):
            net.op.add(type="Op", input=["%d_%d" % (k, i)])
        results.append(NetDef.FromString(net.SerializeToString()) == net)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 4


# --------------------------------------------- core.Net's queued op path --


def _expected_ops(calls):
    """The ops CreateOperator makes for ``calls`` (op_type, inputs, outputs,
    kwargs): what the op methods must produce, byte for byte."""
    return [core.CreateOperator(t, i, o, **kw) for t, i, o, kw in calls]


def test_op_methods_serialise_as_create_operator_does():
    calls = [
        ("ConstantFill", [], ["a"], dict(shape=[2, 3], value=1.0)),
        ("ConstantFill", [], ["b"], dict(shape=[1], value=-0.0, dtype=core.DataType.INT64)),
        ("Add", ["a", "b"], ["c"], dict(broadcast=1)),
        ("Add", ["a", "b"], ["d"], dict(broadcast=True)),
        ("Scale", ["c"], ["e"], dict(scale=1)),
        ("Scale", ["c"], ["f"], dict(scale=1.0)),
        ("Scale", ["c"], ["g"], dict(scale=0.0)),
        ("Scale", ["c"], ["h"], dict(scale=float("nan"))),
        ("Copy", ["c"], ["é"], dict(unknown=None)),
        ("Print", ["c"], [], dict(to_file=b"bytes", limit=np.int64(3))),
        ("ConstantFill", [], ["z"], dict(shape=[1], value=2.0, name="named")),
    ]
    net = core.Net("same")
    for op_type, inputs, outputs, kwargs in calls:
        getattr(net, op_type)(inputs, outputs, **kwargs)
    got = net.Proto().op
    want = _expected_ops(calls)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.SerializeToString() == w.SerializeToString(), (g, w)
    # 1, 1.0 and True, 0.0 and -0.0: the argument cache keeps them apart.
    assert got[4].arg[0].HasField("i") and got[5].arg[0].HasField("f")
    assert math.copysign(1.0, got[1].arg[1].f) == -1.0 and got[6].arg[0].f == 0.0
    assert math.isnan(got[7].arg[0].f)


def _build(add):
    """Ops of many shapes through ``add(net, op_type, *args, **kwargs)``;
    returns the net and what each call returned."""
    core.Net._reset_used_names()  # both nets are named "paths"
    net = core.Net("paths")
    x = net.AddExternalInput("x")
    out = []
    out.append(add(net, "Add", [x, "x"], "a", broadcast=1))
    out.append(add(net, "Relu", x))  # one automatic name
    out.append(add(net, "Relu", x, None))
    out.append(add(net, "Split", "a", 2, axis=0))  # two automatic names
    out.append(add(net, "Add", ("a", x), core.BlobReference("ref"), broadcast=True))
    out.append(add(net, "Copy", "a", ["b"], tag="é", blob=b"\xff", neg=-(2 ** 63), f=1e-3))
    out.append(add(net, "Copy", "undefined", "c"))  # becomes an external input
    with core.NameScope("s"):
        out.append(add(net, "Copy", "b", "d"))  # names get the scope
        out.append(add(net, "Relu", "s/d"))
    out.append(add(net, "Split", x, ["e", "f"]))
    out.append(add(net, "Print", "e", []))
    out.append(add(net, "Scale", "e", "g", scale=1e300))  # beyond float32: inf
    out.append(add(net, "Scale", "e", "h", scale=np.float32(2), shape=[1, 2], names=["a"]))
    out.append(add(net, "Scale", "e", "i", shape=(1, True), floats=[1.5, -0.0], names=["a", b"\xff"],
                   empty=[], skipped=None, big=[2 ** 62], neg=[-1]))
    with core.DeviceScope(caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CPU, random_seed=5)):
        out.append(add(net, "Relu", "i"))  # the device option, an automatic name
        with core.NameScope("t"):
            out.append(add(net, "Copy", "i", ["j", core.BlobReference("k")], f=[1e300]))
    return net, out


def test_op_methods_do_what_create_and_add_to_self_does():
    fast, got = _build(lambda net, t, *a, **kw: getattr(net, t)(*a, **kw))
    slow, want = _build(lambda net, t, *a, **kw: net._CreateAndAddToSelf(t, *a, **kw))
    assert fast.Proto().SerializeToString() == slow.Proto().SerializeToString()

    def shape(r):
        if isinstance(r, tuple):
            return tuple(shape(x) for x in r)
        if r is None:
            return None
        assert type(r) is core.BlobReference and r.Net() is not None
        return str(r)

    assert [shape(r) for r in got] == [shape(r) for r in want]
    assert got[0] == "a" and got[3] == ("paths/Split:0", "paths/Split:1")
    assert got[7] == "s/d" and got[10] is None
    assert all(r.Net() is fast for r in got[:3])
    # Names given as str inside the scope get it, inputs too (s/b is not
    # defined, so it becomes an external input, as "undefined" does).
    assert set(fast.Proto().external_input) == {"x", "undefined", "s/b", "s/s/d", "t/i"}
    assert sorted(fast._op_tracebacks) == list(range(len(fast.Proto().op)))
    fast.PopulateProtoWithFileName()
    assert all(op.name.startswith(__file__ + ":") for op in fast.Proto().op)


def test_op_methods_refuse_what_create_and_add_to_self_refuses():
    net = core.Net("bad")
    x = net.AddExternalInput("x")
    with pytest.raises(errors.InvalidArgumentError, match="'big'"):
        net.Copy(x, "y", big=2 ** 64)
    with pytest.raises(errors.InvalidArgumentError, match="'bad'"):
        net.Copy(x, "y", bad="\ud800")
    with pytest.raises(TypeError):
        net.Copy([x, 3], "y")
    with pytest.raises(TypeError):
        net.Copy(x, "y", "z")
    assert not net.BlobIsDefined("y") and len(net.Proto().op) == 0
    # A device scope, an engine or an op name take the general path.
    with core.DeviceScope(core.DeviceOption(caffe2_pb2.CPU)):
        net.Copy(x, "d")
    net.Copy(x, "e", engine="E", name="n")
    ops = net.Proto().op
    assert ops[0].HasField("device_option") and (ops[1].engine, ops[1].name) == ("E", "n")


def test_edits_between_op_calls_keep_the_order():
    net = core.Net("order")
    net.ConstantFill([], "a", shape=[1])
    net.Proto().op[0].name = "first"  # the live NetDef
    net.ConstantFill([], "b", shape=[1])
    extra = core.CreateOperator("Copy", ["a"], ["c"])
    net.Proto().op.extend([extra])
    net.Copy("b", "d")
    assert [op.output[0] for op in net.Proto().op] == ["a", "b", "c", "d"]
    assert net.Proto().op[0].name == "first"
    assert net.BlobIsDefined("d") and net.BlobIsDefined("c")


def test_copies_and_pickles_of_a_net_with_queued_ops():
    net = core.Net("queued")
    net.ConstantFill([], "a", shape=[1])
    deep = copy.deepcopy(net)
    shallow = copy.copy(net)  # shares the NetDef, as it always did
    net.ConstantFill([], "b", shape=[1])
    shallow.ConstantFill([], "c", shape=[1])
    deep.ConstantFill([], "d", shape=[1])
    assert [op.output[0] for op in shallow.Proto().op] == ["a", "b", "c"]
    assert [op.output[0] for op in net.Proto().op] == ["a", "b", "c"]
    assert [op.output[0] for op in deep.Proto().op] == ["a", "d"]
    net.ConstantFill([], "q", shape=[1])
    back = pickle.loads(pickle.dumps(net))
    assert [op.output[0] for op in back.Proto().op] == ["a", "b", "c", "q"]


def test_creation_sites_of_queued_ops_name_the_user_lines():
    net = core.Net("sites")
    x = net.AddExternalInput("x")
    lines = []
    net.Relu(x, "a")
    lines.append(sys._getframe().f_lineno - 1)
    net.Proto().op[0].type = "Relu"  # flushed: the next op's index follows
    net.Copy("a", "b")
    lines.append(sys._getframe().f_lineno - 1)
    net.Copy(x, "c", engine="E")  # the general path, straight into the NetDef
    lines.append(sys._getframe().f_lineno - 1)
    net.Copy("c", "d")  # still queued when the names are filled in
    lines.append(sys._getframe().f_lineno - 1)
    net.PopulateProtoWithFileName()
    here = "test_creation_sites_of_queued_ops_name_the_user_lines"
    assert [op.name for op in net.Proto().op] == [
        "%s:%d:%s" % (__file__, line, here) for line in lines]
    # A pickled net keeps the sites as locations; ops added after unpickling
    # get theirs.
    back = pickle.loads(pickle.dumps(net))
    back.Copy("d", "e")
    line = sys._getframe().f_lineno - 1
    back.PopulateProtoWithFileName()
    assert [op.name for op in back.Proto().op] == [
        "%s:%d:%s" % (__file__, n, here) for n in lines + [line]]


class _NamedRef(core.BlobReference):
    pass


def test_blob_reference_keeps_caffe2s_attributes():
    ref = core.BlobReference("a")
    assert ref.meta == {} and ref.meta is ref.meta
    ref.meta["shape"] = [2]
    ref.note = "any attribute"
    assert weakref.ref(ref)() is ref
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(ref, protocol=protocol))
        assert (back, back.meta, back.note, back.Net()) == ("a", {"shape": [2]}, "any attribute", None)
    deep = copy.deepcopy(ref)
    assert deep.meta == {"shape": [2]} and deep.meta is not ref.meta
    shallow = copy.copy(ref)
    assert shallow.meta is ref.meta and shallow == "a"
    net = core.Net("refs")
    sub = _NamedRef("b", net)
    sub.extra = 1
    assert isinstance(sub, core.BlobReference) and sub.Net() is net
    back = pickle.loads(pickle.dumps(sub))
    assert type(back) is _NamedRef and back.extra == 1 and back == "b"
    assert core.BlobReference(b"c") == "c" and str(core.BlobReference(3)) == "3"


def test_a_net_built_by_op_methods_runs():
    net = core.Net("runs")
    x = net.ConstantFill([], "x", shape=[2], value=2.0)
    y = x
    for _ in range(5):
        y = net.Add([y, x], 1)  # auto-named outputs
    ws = workspace.Workspace()
    ws.run(net)
    assert ws.fetch_blob(y).tolist() == [12.0, 12.0]


def test_file_location_names_follow_queued_ops():
    net = core.Net("where")
    net.ConstantFill([], "a", shape=[1])
    net.ConstantFill([], "b", shape=[1])
    net.PopulateProtoWithFileName()
    names = [op.name for op in net.Proto().op]
    assert all(n.startswith(__file__ + ":") for n in names)
    assert names[0] != names[1]  # two lines


# ------------------------------------------------------- .pb and .pbtxt files --


def test_nets_and_plans_load_from_binary_and_text_files(tmp_path):
    net = core.Net("proto_file_test")  # not "from_file": names are unique per process
    x = net.ConstantFill([], "x", shape=[2], value=3.0)
    net.Scale(x, "y", scale=2.0)
    plan = core.Plan("plan_from_file")
    plan.AddStep(core.execution_step("once", net))
    paths = {}
    for kind, message in (("net", net.Proto()), ("plan", plan.Proto())):
        paths[kind, "pb"] = tmp_path / f"{kind}.pb"
        paths[kind, "pbtxt"] = tmp_path / f"{kind}.pbtxt"
        proto.WriteProtoToBinaryFile(message, paths[kind, "pb"])
        proto.WriteProtoToTextFile(message, paths[kind, "pbtxt"])
        assert paths[kind, "pbtxt"].read_text().startswith('name: "')
        for suffix in ("pb", "pbtxt"):
            read = proto.ReadProtoFromFile(paths[kind, suffix], type(message)())
            assert read == message, (kind, suffix)
    # A text file without a text suffix, and a binary one with it, still read.
    swapped = tmp_path / "net.bin"
    swapped.write_bytes(paths["net", "pbtxt"].read_bytes())
    assert proto.ReadProtoFromFile(swapped, NetDef()) == net.Proto()
    for suffix in ("pb", "pbtxt"):
        workspace.ResetWorkspace()
        assert workspace.RunNetOnce(paths["net", suffix]) is True
        assert workspace.FetchBlob("y").tolist() == [6.0, 6.0]
        workspace.ResetWorkspace()
        assert workspace.RunPlan(paths["plan", suffix]) is True
        assert workspace.FetchBlob("y").tolist() == [6.0, 6.0]
        workspace.ResetWorkspace()
        assert workspace.CreateNet(paths["net", suffix]) is True
        assert workspace.RunNet(net.Name()) is True
        assert workspace.FetchBlob("y").tolist() == [6.0, 6.0]
    workspace.ResetWorkspace()


def test_a_file_that_is_no_message_is_a_decode_error_naming_it(tmp_path):
    bad = tmp_path / "bad.pbtxt"
    bad.write_text("this is { not a NetDef")
    with pytest.raises(DecodeError, match="bad.pbtxt"):
        proto.ReadProtoFromFile(bad, NetDef())
    with pytest.raises(DecodeError, match="NetDef"):
        workspace.RunNetOnce(bad)


def test_the_op_list_encodes_what_protobuf_would_and_refuses_bad_items_with_type_errors():
    ops = _core.NetOps(core.BlobReference)
    ops.push("Copy", ["a"], ["b"], [Argument(name="n", i=1).SerializeToString()], "site-1")
    ops.push_encoded(OperatorDef(type="X", output=["c"]).SerializeToString(), ["c"], None)
    # The common op: plain values in, output names out; "b" is defined now.
    assert ops.add("Relu", ("b",), {"alpha": [1, True]}, "s/", None, "site-3", "n") is None  # s/b
    dev = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CPU, random_seed=3).SerializeToString()
    assert ops.add("Relu", (core.BlobReference("b"),), {"k": [0.5, 2.0]}, "s/", dev, "site-3", "n") == "s/n/Relu"
    assert ops.add("Split", ("c", ["d", "e"]), None, "", None, "site-4", "n") == ("d", "e")
    assert ops.queued == 4 and ops.is_defined("s/n/Relu") and not ops.is_defined("a")
    data, sites = ops.take()
    assert ops.queued == 0 and sites == ["site-1", None, "site-3", "site-4"]
    want = NetDef()
    want.op.add(type="Copy", input=["a"], output=["b"], name="").arg.add(name="n", i=1)
    want.op.add(type="X", output=["c"])
    relu = want.op.add(type="Relu", input=["b"], output=["s/n/Relu"], name="")
    relu.arg.add(name="k", floats=[0.5, 2.0])
    relu.device_option.CopyFrom(caffe2_pb2.DeviceOption.FromString(dev))
    want.op.add(type="Split", input=["c"], output=["d", "e"], name="")
    assert data == want.SerializeToString()
    # What it does not take is a TypeError, and nothing is queued.
    for bad in ((["a"], [1], []), ("a", "b", [b"x"]), (["a"], ["b"], ["s"])):
        with pytest.raises(TypeError):
            ops.push("Copy", *bad, None)
    with pytest.raises(TypeError):
        ops.push_encoded("not bytes", [], None)
    assert ops.queued == 0


def test_an_argument_missing_a_required_field_fails_only_when_serialised():
    net = core.Net("partial")
    inner = NetDef(name="inner")
    # segment.end is required
    inner.op.add(type="X").arg.add(name="t", t=TensorProto(segment=dict(begin=1)))
    net.ConstantFill([], "a", shape=[1], inner=inner)  # a NetDef goes into Argument.n
    assert net.Proto().op[0].arg[1].n.op[0].arg[0].t.segment.begin == 1
    with pytest.raises(EncodeError, match="segment.end"):
        net.Proto().SerializeToString()
