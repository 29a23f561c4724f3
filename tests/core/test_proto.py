"""Tests of ferrocaffe.proto: the pure-Python caffe2_pb2.

Expected bytes are assembled by hand from the protobuf wire format: a tag is
the varint ``(field_number << 3) | wire_type`` with wire types 0 (varint),
1 (fixed64), 2 (length-delimited) and 5 (fixed32).
"""

import copy
import math
import pickle
import struct
import threading
import time

import pytest

from ferrocaffe import proto
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
    TensorProto,
    TensorProtos,
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


def test_fields_are_written_in_field_number_order_whatever_the_set_order():
    a = OperatorDef()
    a.type = "X"
    a.output.append("o")
    a.input.append("i")
    b = OperatorDef(input=["i"], output=["o"], type="X")
    assert a.SerializeToString() == b.SerializeToString() == b"\x0a\x01i\x12\x01o\x22\x01X"


@pytest.mark.parametrize(
    "arg, expected",
    [
        (Argument(i=0), b"\x18\x00"),
        (Argument(i=127), b"\x18\x7f"),
        (Argument(i=300), b"\x18\xac\x02"),
        # negative ints are sign-extended to 64 bits: ten bytes
        (Argument(i=-1), b"\x18" + b"\xff" * 9 + b"\x01"),
        (Argument(f=1.5), b"\x15\x00\x00\xc0\x3f"),
        (Argument(s=b"\x00\xff"), b"\x22\x02\x00\xff"),
        (Argument(s="é"), b"\x22\x02\xc3\xa9"),
        # repeated ints and floats of Argument are not packed
        (Argument(ints=[1, 2]), b"\x30\x01\x30\x02"),
        (Argument(floats=[1.0]), b"\x2d\x00\x00\x80\x3f"),
        (Argument(strings=["x", b"y"]), b"\x3a\x01x\x3a\x01y"),
        (Argument(name="n", n=NetDef(name="m")), b"\x0a\x01n\x42\x03\x0a\x01m"),
        (Argument(t=TensorProto()), b"\x52\x00"),
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


def test_unset_and_empty_fields_are_not_written():
    assert OperatorDef().SerializeToString() == b""
    op = OperatorDef()
    op.input.extend([])
    _ = op.device_option.device_type  # reading does not make it present
    assert op.SerializeToString() == b""


def test_false_and_zero_survive_a_round_trip_when_set():
    step = ExecutionStep(name="s", only_once=False, num_iter=0)
    data = step.SerializeToString()
    assert data == b"\x0a\x01s\x20\x00\x50\x00"
    back = ExecutionStep.FromString(data)
    assert back.HasField("only_once") and back.only_once is False
    assert back.HasField("num_iter") and back.num_iter == 0
    assert not back.HasField("create_workspace")


def test_parse_accepts_packed_and_unpacked_repeated_scalars():
    unpacked = b"\x1d" + struct.pack("<f", 1.0) + b"\x1d" + struct.pack("<f", 2.0)
    packed = b"\x1a\x08" + struct.pack("<2f", 1.0, 2.0)
    assert list(TensorProto.FromString(unpacked).float_data) == [1.0, 2.0]
    assert list(TensorProto.FromString(packed).float_data) == [1.0, 2.0]
    # dims is declared unpacked, but a packed run is accepted too
    assert list(TensorProto.FromString(b"\x0a\x02\x04\x05").dims) == [4, 5]
    # int32 stays signed; a mix of both forms appends in order
    data = b"\x20\x05" + b"\x22\x0a" + b"\xff" * 9 + b"\x01"
    assert list(TensorProto.FromString(data).int32_data) == [5, -1]


def test_parse_skips_unknown_fields_of_every_wire_type():
    unknown = (
        b"\xa8\x06\x2a"  # 101, varint
        b"\xb1\x06" + b"\x00" * 8  # 102, fixed64
        + b"\xba\x06\x03abc"  # 103, length-delimited
        + b"\xc5\x06" + b"\x00" * 4  # 104, fixed32
        + b"\xcb\x06\xa8\x06\x01\xcc\x06"  # 105, a group holding a varint
    )
    data = b"\x0a\x01x" + unknown + b"\x22\x03Add"
    op = OperatorDef.FromString(data)
    assert op.input == ["x"] and op.type == "Add"
    assert op.SerializeToString() == b"\x0a\x01x\x22\x03Add"
    # a known field with an unexpected wire type is skipped as unknown
    assert not OperatorDef.FromString(b"\x20\x05").HasField("type")


@pytest.mark.parametrize(
    "data",
    [b"\x0a\x05ab", b"\x18", b"\x15\x00\x00", b"\x2a\x05\x0a\x01", b"\x18\xff", b"\x07"],
)
def test_truncated_or_malformed_input_raises_decode_error(data):
    with pytest.raises(DecodeError):
        Argument.FromString(data)


def test_invalid_utf8_in_a_string_field_is_a_decode_error():
    with pytest.raises(DecodeError):
        OperatorDef.FromString(b"\x22\x01\xff")


def test_parse_from_string_replaces_and_merge_from_string_merges():
    op = OperatorDef(type="A", input=["x"])
    assert op.ParseFromString(b"\x0a\x01y") == 3
    assert op.input == ["y"] and not op.HasField("type")
    op.MergeFromString(b"\x0a\x01z\x22\x01B")
    assert op.input == ["y", "z"] and op.type == "B"
    # a singular sub-message seen twice is merged
    net = NetDef.FromString(b"\x2a\x02\x08\x01" + b"\x2a\x02\x10\x03")
    assert net.device_option.device_type == 1 and net.device_option.device_id == 3
    assert OperatorDef.FromString(bytearray(b"\x22\x01C")).type == "C"
    assert OperatorDef.FromString(memoryview(b"\x22\x01C")).type == "C"


def test_nested_round_trip_of_a_plan():
    plan = PlanDef(name="p")
    net = plan.network.add(name="n", external_input=["a"], external_output=["b"])
    op = net.op.add(type="Copy", input=["a"], output=["b"])
    op.arg.add(name="t", t=TensorProto(dims=[1], string_data=[b"s"], data_type=4))
    op.arg.add(name="nets", nets=[NetDef(name="inner")])
    step = plan.execution_step.add(name="s", network=["n"], num_iter=3)
    step.substep.add(name="sub", should_stop_blob="stop", run_every_ms=10)
    back = PlanDef.FromString(plan.SerializeToString())
    assert back == plan
    assert back.network[0].op[0].arg[0].t.string_data == [b"s"]
    assert back.execution_step[0].substep[0].run_every_ms == 10


def test_every_message_type_round_trips():
    messages = [
        TensorProto(name="t", byte_data=b"\x01", raw_data=b"\x02", segment=dict(begin=0, end=2),
                    device_detail=DeviceOption(device_type=1), storage_type=2, data_format=3),
        TensorProtos(protos=[TensorProto(dims=[1]), TensorProto(dims=[2])]),
        DeviceOption(device_type=1, device_id=2, random_seed=2**32 - 1, node_name="n",
                     numa_node_id=0, extra_info=["a", "b"]),
        OperatorDef(control_input=["c"], is_gradient_op=True, debug_info="d", engine="E",
                    domain="dom", op_version=2),
        NetDef(type="dag", num_workers=4, arg=[Argument(name="x", i=1)]),
        ExecutionStep(criteria_network="c", concurrent_substeps=True, report_net="r",
                      report_interval=5, create_workspace=True, num_concurrent_instances=4),
        BlobProto(name="b", type="T", tensor=TensorProto(dims=[0]), content=b"\x00",
                  content_num_chunks=2, content_chunk_id=1),
        DBReaderProto(name="r", source="s", db_type="minidb", key="k"),
    ]
    for m in messages:
        assert type(m).FromString(m.SerializeToString()) == m, type(m).__name__


def test_unsigned_and_large_values():
    d = DeviceOption(random_seed=2**32 - 1)
    assert d.SerializeToString() == b"\x18\xff\xff\xff\xff\x0f"
    a = Argument(i=-(2**63))
    assert Argument.FromString(a.SerializeToString()).i == -(2**63)
    a = Argument(i=2**63 - 1)
    assert Argument.FromString(a.SerializeToString()).i == 2**63 - 1


def test_required_fields_of_segment():
    t = TensorProto(segment=dict(begin=1))
    with pytest.raises(EncodeError, match="segment.end"):
        t.SerializeToString()
    assert not t.IsInitialized()
    assert t.FindInitializationErrors() == ["segment.end"]
    assert t.SerializePartialToString() == b"\x5a\x02\x08\x01"
    t.segment.end = 4
    assert t.IsInitialized()
    assert t.SerializeToString() == b"\x5a\x04\x08\x01\x10\x04"


def test_serialising_a_thousand_op_net_is_fast():
    net = NetDef(name="big")
    for i in range(1000):
        op = net.op.add(type="Add", name="")
        op.input.extend(["a%d" % i, "b%d" % i])
        op.output.append("c%d" % i)
        op.arg.add(name="broadcast", i=1)
    net.SerializeToString()  # warm up
    start = time.perf_counter()
    data = net.SerializeToString()
    elapsed = time.perf_counter() - start
    # a few ms on a slow machine; the bound leaves room for noisy CI
    assert elapsed < 0.05, elapsed
    assert NetDef.FromString(data) == net


# --------------------------------------------------------------- presence --


def test_defaults_when_unset():
    t = TensorProto()
    assert t.data_type == TensorProto.FLOAT == 1
    assert not t.HasField("data_type")
    assert t.storage_type == TensorProto.TYPED
    assert t.name == "" and t.byte_data == b"" and t.data_format == 0
    op = OperatorDef()
    assert op.is_gradient_op is False and op.type == "" and op.op_version == 0
    assert Argument().f == 0.0 and Argument().i == 0 and Argument().s == b""
    assert DeviceOption().device_type == 0


def test_has_field_and_clear_field():
    op = OperatorDef()
    assert not op.HasField("name")
    op.name = ""
    assert op.HasField("name")
    op.ClearField("name")
    assert not op.HasField("name")
    op.ClearField("input")  # repeated fields can be cleared
    with pytest.raises(ValueError):
        op.HasField("input")  # but have no presence
    with pytest.raises(ValueError):
        op.HasField("nonexistent")
    with pytest.raises(ValueError):
        op.ClearField("nonexistent")


def test_sub_messages_are_created_on_access_without_presence():
    op = OperatorDef()
    option = op.device_option
    assert option is op.device_option
    assert not op.HasField("device_option")
    assert option.device_type == 0
    option.random_seed = 1
    assert op.HasField("device_option")
    assert op.device_option is option
    assert op.device_option.random_seed == 1


def test_presence_propagates_through_several_levels():
    arg = Argument()
    arg.n.device_option.extra_info.append("x")
    assert arg.HasField("n") and arg.n.HasField("device_option")
    arg2 = Argument()
    arg2.t.segment.begin = 1
    assert arg2.HasField("t") and arg2.t.HasField("segment")
    arg3 = Argument()
    arg3.n.op.add()
    assert arg3.HasField("n")


def test_copy_from_an_empty_message_and_set_in_parent_set_presence():
    op = OperatorDef()
    op.device_option.CopyFrom(DeviceOption())
    assert op.HasField("device_option")
    op2 = OperatorDef()
    op2.device_option.SetInParent()
    assert op2.HasField("device_option")
    assert op2.SerializeToString() == b"\x32\x00"


def test_clear_field_detaches_the_old_sub_message():
    op = OperatorDef()
    old = op.device_option
    old.device_id = 3
    op.ClearField("device_option")
    assert not op.HasField("device_option")
    old.device_id = 4  # no longer attached
    assert not op.HasField("device_option")
    lazy = op.device_option
    op.ClearField("device_option")
    lazy.device_id = 5
    assert not op.HasField("device_option")


def test_assignment_to_composite_fields_is_refused():
    op = OperatorDef()
    with pytest.raises(AttributeError):
        op.device_option = DeviceOption()
    with pytest.raises(AttributeError):
        op.input = ["a"]
    with pytest.raises(AttributeError):
        op.nonexistent = 1


def test_scalar_type_checks():
    op = OperatorDef()
    with pytest.raises(TypeError):
        op.name = 1
    with pytest.raises(TypeError):
        op.op_version = 1.5
    with pytest.raises(TypeError):
        op.input.append(3)
    with pytest.raises(ValueError):
        DeviceOption().device_id = 2**31
    with pytest.raises(ValueError):
        DeviceOption().random_seed = -1
    with pytest.raises(TypeError):
        Argument().f = "1"
    arg = Argument()
    arg.i = True  # bools are ints
    assert arg.i == 1 and type(arg.i) is int
    arg.f = 3  # ints are floats
    assert arg.f == 3.0 and type(arg.f) is float
    with pytest.raises(ValueError):
        OperatorDef(nonexistent=1)
    with pytest.raises(TypeError):
        OperatorDef("positional")


def test_numpy_scalars_are_accepted():
    np = pytest.importorskip("numpy")
    arg = Argument(i=np.int64(7), f=np.float32(0.5))
    assert arg.i == 7 and type(arg.i) is int and arg.f == 0.5
    arg.ints.extend(np.arange(3))
    assert arg.ints == [0, 1, 2]
    step = ExecutionStep(only_once=np.bool_(True))
    assert step.only_once is True


def test_floats_are_rounded_to_float32_and_saturate():
    arg = Argument(f=0.1)
    assert arg.f == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert Argument.FromString(arg.SerializeToString()) == arg
    arg.f = 1e40
    assert arg.f == math.inf
    arg.floats.extend([0.1, -1e40])
    assert arg.floats[1] == -math.inf
    t = TensorProto(double_data=[0.1])
    assert t.double_data[0] == 0.1  # doubles are kept as they are


def test_string_fields_accept_utf8_bytes_and_bytes_fields_accept_str():
    op = OperatorDef(type=b"Add")
    assert op.type == "Add" and type(op.type) is str
    with pytest.raises(ValueError):
        op.type = b"\xff"
    arg = Argument(s="hé", strings=["a", b"b"])
    assert arg.s == "hé".encode() and type(arg.s) is bytes
    assert arg.strings == [b"a", b"b"]
    t = TensorProto(string_data=["x"])
    assert t.string_data[0] == b"x"
    assert BlobProto(content="c").content == b"c"


def test_keyword_constructor():
    op = OperatorDef(
        type="Add",
        input=("a", "b"),
        arg=[Argument(name="x", i=1), dict(name="y", f=2.0)],
        device_option=DeviceOption(device_type=1),
        name=None,  # None leaves a field unset
    )
    assert op.input == ["a", "b"]
    assert [a.name for a in op.arg] == ["x", "y"]
    assert op.arg[1].f == 2.0
    assert op.HasField("device_option") and op.device_option.device_type == 1
    assert not op.HasField("name")
    t = TensorProto(segment=dict(begin=1, end=2))
    assert t.segment.end == 2


# ---------------------------------------------------------- repeated fields --


def test_repeated_scalar_container_behaves_like_a_list():
    op = OperatorDef()
    c = op.input
    c.append("a")
    c.extend(["b", "c", "d"])
    c.insert(0, "z")
    assert len(c) == 5 and c[0] == "z" and c[-1] == "d"
    assert c[1:3] == ["a", "b"]
    assert c == ["z", "a", "b", "c", "d"] and c != ["z"]
    assert "b" in c and "q" not in c
    c.remove("z")
    assert c.pop() == "d"
    c[0] = "A"
    c[1:2] = ["B", "BB"]
    assert list(c) == ["A", "B", "BB", "c"]
    del c[0]
    assert c.index("c") == 2
    c.sort(reverse=True)
    assert c == ["c", "BB", "B"]
    del c[:]
    assert len(c) == 0 and c == []
    with pytest.raises(TypeError):
        hash(c)
    c.extend(iter(["g", "h"]))
    assert repr(c) == "['g', 'h']"
    assert OperatorDef(input=["g", "h"]).input == c


def test_repeated_message_container():
    net = NetDef()
    op = net.op.add(type="A")
    op.input.append("x")
    assert net.op[0] is op
    other = OperatorDef(type="B")
    net.op.append(other)
    other.type = "changed"  # append stored a copy
    assert net.op[1].type == "B"
    net.op.extend([OperatorDef(type="C"), OperatorDef(type="D")])
    assert [o.type for o in net.op] == ["A", "B", "C", "D"]
    assert [o.type for o in net.op[1:3]] == ["B", "C"]
    net.op.remove(OperatorDef(type="C"))
    assert net.op.pop().type == "D"
    del net.op[0]
    assert len(net.op) == 1 and net.op[0].type == "B"
    with pytest.raises(TypeError):
        net.op[0] = OperatorDef()
    with pytest.raises(TypeError):
        net.op.append(Argument())
    del net.op[:]
    assert len(net.op) == 0
    net.op.sort(key=lambda o: o.type)


# --------------------------------------------------- copying and comparison --


def test_copy_from_merge_from_and_clear():
    a = OperatorDef(type="A", input=["x"], device_option=DeviceOption(device_id=1))
    b = OperatorDef(type="B", input=["y"])
    b.MergeFrom(a)
    assert b.type == "A" and b.input == ["y", "x"] and b.device_option.device_id == 1
    b.CopyFrom(a)
    assert b == a and b is not a and b.input == ["x"]
    b.device_option.device_id = 2  # a deep copy
    assert a.device_option.device_id == 1
    b.Clear()
    assert b == OperatorDef() and b.SerializeToString() == b""
    with pytest.raises(TypeError):
        b.CopyFrom(NetDef())
    with pytest.raises(TypeError):
        b.MergeFrom(NetDef())
    a.MergeFrom(a)
    assert a.input == ["x", "x"]


def test_equality():
    assert OperatorDef(type="A") == OperatorDef(type="A")
    assert OperatorDef(type="A") != OperatorDef(type="B")
    # presence matters: an explicit default differs from unset
    assert OperatorDef(name="") != OperatorDef()
    # an empty repeated field equals an absent one
    op = OperatorDef()
    op.input.extend([])
    assert op == OperatorDef()
    # a lazily created sub-message does not count
    op.device_option.device_type
    assert op == OperatorDef()
    assert OperatorDef() != NetDef()
    assert OperatorDef() != "x"
    with pytest.raises(TypeError):
        hash(OperatorDef())


def test_deepcopy_copy_and_pickle():
    op = OperatorDef(type="A", input=["x"], arg=[Argument(name="a", ints=[1])])
    for clone in (copy.deepcopy(op), copy.copy(op), pickle.loads(pickle.dumps(op))):
        assert clone == op and clone is not op
        clone.arg[0].ints.append(2)
        assert list(op.arg[0].ints) == [1]
    seg = pickle.loads(pickle.dumps(TensorProto.Segment(begin=1, end=2)))
    assert type(seg) is TensorProto.Segment and seg.end == 2


def test_list_fields_and_byte_size():
    op = OperatorDef(type="A", input=["x"])
    op.output.extend([])
    op.device_option.device_id  # not present
    fields = op.ListFields()
    assert [(fd.name, fd.number) for fd, _ in fields] == [("input", 1), ("type", 4)]
    assert fields[1][1] == "A" and list(fields[0][1]) == ["x"]
    assert op.ByteSize() == len(op.SerializeToString()) == 6


def test_descriptor_reflection():
    fd = OperatorDef.DESCRIPTOR.fields_by_name["arg"]
    assert fd.number == 5 and fd.label == fd.LABEL_REPEATED and fd.type == fd.TYPE_MESSAGE
    assert fd.message_type is Argument.DESCRIPTOR
    assert Argument.DESCRIPTOR.fields_by_name["s"].type == proto.FieldDescriptor.TYPE_BYTES
    assert OperatorDef.DESCRIPTOR.full_name == "caffe2.OperatorDef"
    assert OperatorDef.TYPE_FIELD_NUMBER == 4
    assert [f.name for f in DeviceOption.DESCRIPTOR.fields][:4] == [
        "device_type", "device_id", "random_seed", "node_name"]


def test_field_numbers_match_the_runtime_ir():
    expected = {
        TensorProto: dict(dims=1, data_type=2, float_data=3, int32_data=4, byte_data=5,
                          string_data=6, name=7, double_data=9, int64_data=10, segment=11,
                          raw_data=13),
        TensorProto.Segment: dict(begin=1, end=2),
        Argument: dict(name=1, f=2, i=3, s=4, floats=5, ints=6, strings=7, n=8, nets=9,
                       t=10, tensors=11),
        DeviceOption: dict(device_type=1, device_id=2, random_seed=3, node_name=4),
        OperatorDef: dict(input=1, output=2, name=3, type=4, arg=5, device_option=6,
                          engine=7, control_input=8, is_gradient_op=9, debug_info=10),
        NetDef: dict(name=1, op=2, type=3, num_workers=4, device_option=5, arg=6,
                     external_input=7, external_output=8),
        ExecutionStep: dict(name=1, substep=2, network=3, num_iter=4, criteria_network=5,
                            concurrent_substeps=6, report_net=7, report_interval=8,
                            should_stop_blob=9, only_once=10, run_every_ms=11,
                            create_workspace=12, num_concurrent_instances=13),
        PlanDef: dict(name=1, network=2, execution_step=3),
        BlobProto: dict(name=1, type=2, tensor=3, content=4, content_num_chunks=6,
                        content_chunk_id=7),
    }
    for cls, fields in expected.items():
        got = {f.name: f.number for f in cls.DESCRIPTOR.fields}
        for name, number in fields.items():
            assert got[name] == number, (cls.__name__, name)


# ------------------------------------------------------------- text format --


def test_text_format():
    net = NetDef(name="x")
    op = net.op.add(type="Add", input=["a", "b"], output=["c"])
    op.arg.add(name="f", f=0.5)
    op.arg.add(name="s", s=b'q"\n\xff')
    op.device_option.device_type = 1
    net.external_input.append("a")
    assert str(net) == (
        'name: "x"\n'
        "op {\n"
        '  input: "a"\n'
        '  input: "b"\n'
        '  output: "c"\n'
        '  type: "Add"\n'
        "  arg {\n"
        '    name: "f"\n'
        "    f: 0.5\n"
        "  }\n"
        "  arg {\n"
        '    name: "s"\n'
        '    s: "q\\"\\n\\377"\n'
        "  }\n"
        "  device_option {\n"
        "    device_type: 1\n"
        "  }\n"
        "}\n"
        'external_input: "a"\n'
    )
    assert repr(net) == str(net)


def test_text_format_scalars():
    assert str(ExecutionStep(only_once=True, num_iter=-2)) == "num_iter: -2\nonly_once: true\n"
    assert str(TensorProto(data_type=TensorProto.INT64)) == "data_type: INT64\n"
    assert str(TensorProto(data_type=11)) == "data_type: 11\n"  # no name for 11
    # floats print as the shortest decimal that reads back as the float32
    assert str(Argument(f=0.1)) == "f: 0.1\n"
    assert str(Argument(floats=[1.0, math.inf])) == "floats: 1.0\nfloats: inf\n"
    assert str(TensorProto(double_data=[0.1])) == "double_data: 0.1\n"
    assert str(OperatorDef(name="é\t'")) == "name: \"\\303\\251\\t\\'\"\n"
    assert str(OperatorDef()) == ""


# ------------------------------------------------------------------- enums --


def test_enums():
    assert TensorProto.FLOAT == 1 and TensorProto.INT64 == 10 and TensorProto.DOUBLE == 13
    assert TensorProto.DataType.Name(10) == "INT64"
    assert TensorProto.DataType.Value("BOOL") == 5
    assert TensorProto.DataType.STRING == 4
    assert ("FLOAT16", 12) in TensorProto.DataType.items()
    with pytest.raises(ValueError):
        TensorProto.DataType.Name(11)
    assert TensorProto.StorageType.Value("RAW") == 2
    assert proto.CPU == proto.PROTO_CPU == 0 and proto.CUDA == 1 and proto.HIP == 6
    assert proto.DeviceTypeProto.Name(0) == "PROTO_CPU"


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
