"""A catalogue of bad inputs.

Each case triggers one error and states:
- the exact ferrocaffe.errors class, and the builtin a Python user would
  catch (checked with isinstance);
- the op / net / step / blob the error must name, both as the exception's
  attributes and in its message;
- and, after the error, the same workspace must still run a good net.

A Python op's own exception is the exception the caller gets (its class and
traceback kept), so those cases expect the user's exception class.
"""

import itertools
import threading
import traceback
from dataclasses import dataclass, field

import numpy as np
import pytest

from ferrocaffe import core, errors, proto, workspace

_ids = itertools.count()


def uid(prefix):
    return f"{prefix}_{next(_ids)}"


@dataclass
class Expect:
    cls: type
    builtin: type
    attrs: dict = field(default_factory=dict)
    # Substrings the message must contain besides the attribute values.
    says: tuple = ()


CASES = {}


def case(fn):
    """Registers `fn(ws) -> (thunk, Expect)` under its name."""
    CASES[fn.__name__] = fn
    return fn


def assert_usable(ws):
    """The workspace still builds and runs a good net and a good plan."""
    good = core.Net(uid("good"))
    good.CreateCounter([], ["__ok_counter"], init_count=41)
    good.CountUp(["__ok_counter"], ["__ok_prev"])
    good.CountUp(["__ok_counter"], ["__ok_prev"])
    assert ws.run(good) is True
    assert ws.blobs["__ok_prev"].fetch().item() == 42
    assert ws.run(core.execution_step(uid("good_step"), good, num_iter=2)) is True
    assert ws.blobs["__ok_prev"].fetch().item() == 42


def check(exc, expect):
    assert type(exc) is expect.cls, f"expected {expect.cls.__name__}, got {type(exc).__name__}: {exc}"
    assert isinstance(exc, expect.builtin)
    if issubclass(expect.cls, errors.FerrocaffeError):
        assert isinstance(exc, errors.FerrocaffeError)
    msg = str(exc)
    for key, value in expect.attrs.items():
        assert getattr(exc, key) == value, f"{key}: {getattr(exc, key)!r} != {value!r} ({msg})"
        if isinstance(value, str):
            assert value in msg, f"message does not name {key} {value!r}: {msg}"
    for needle in expect.says:
        assert needle in msg, f"{needle!r} not in {msg!r}"


# ------------------------------------------------------------- helpers --


def net(*ops, name=None):
    """A net from (type, inputs, outputs, kwargs) tuples."""
    n = core.Net(name or uid("net"))
    for op_type, ins, outs, kw in ops:
        n.Proto().op.add().CopyFrom(core.CreateOperator(op_type, ins, outs, **kw))
    return n


def op(op_type, ins, outs, **kw):
    return core.CreateOperator(op_type, ins, outs, **kw)


def raw_step(name, nets=(), substeps=(), **fields):
    s = proto.ExecutionStep(name=name)
    s.network.extend(nets)
    for sub in substeps:
        s.substep.add().CopyFrom(sub)
    for k, v in fields.items():
        setattr(s, k, v)
    return s


def raw_plan(nets, steps):
    p = proto.PlanDef(name=uid("plan"))
    for n in nets:
        p.network.add().CopyFrom(n.Proto() if hasattr(n, "Proto") else n)
    for s in steps:
        p.execution_step.add().CopyFrom(s)
    return p


def feed(ws, **blobs):
    for k, v in blobs.items():
        ws.feed_blob(k, v)


def make_counter(ws, name, init=0):
    ws.run(op("CreateCounter", [], [name], init_count=init))


def run_net(n):
    return lambda ws: ws.run(n)


# --------------------------------------------------- operator definitions --


@case
def unknown_op_type(ws):
    return lambda: ws.run(op("NoSuchOp", [], ["y"])), Expect(
        errors.UnknownOperatorError, ValueError, {"op": "NoSuchOp"}
    )


@case
def unknown_op_type_inside_a_net(ws):
    n = net(("CreateCounter", [], ["c"], {}), ("Frobnicate", ["c"], ["d"], {}))
    return lambda: ws.run(n), Expect(
        errors.UnknownOperatorError, ValueError, {"op": "Frobnicate", "op_index": 1, "net": n.Name()}
    )


@case
def missing_input_blob(ws):
    n = net(("Copy", ["missing"], ["y"], {}))
    return lambda: ws.run(n), Expect(
        errors.BlobNotFoundError, KeyError, {"blob": "missing", "op": "Copy", "net": n.Name(), "op_index": 0}
    )


@case
def too_many_inputs(ws):
    feed(ws, a=np.ones(2, np.float32), b=np.ones(2, np.float32))
    n = net(("Copy", ["a", "b"], ["y"], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "Copy", "net": n.Name()})


@case
def too_few_outputs(ws):
    make_counter(ws, "c")
    n = net(("CountUp", ["c"], [], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "CountUp", "net": n.Name()})


@case
def too_many_outputs(ws):
    feed(ws, x=np.ones(2, np.float32))
    n = net(("IsEmpty", ["x"], ["y", "z"], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "IsEmpty"})


@case
def in_place_where_forbidden(ws):
    feed(ws, x=np.ones(2, np.float32))
    n = net(("IsEmpty", ["x"], ["x"], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "IsEmpty", "blob": "x"})


@case
def in_place_where_required_iter(ws):
    feed(ws, a=np.zeros(1, np.int64))
    n = net(("Iter", ["a"], ["b"], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "Iter"})


@case
def in_place_where_required_scatter_assign(ws):
    feed(ws, d=np.zeros((3, 2), np.float32), i=np.array([0], np.int64), s=np.ones((1, 2), np.float32))
    n = net(("ScatterAssign", ["d", "i", "s"], ["other"], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "ScatterAssign"})


@case
def float_arg_given_as_int_gaussian_fill(ws):
    n = net(("GaussianFill", [], ["g"], {"shape": [2], "mean": 1}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "GaussianFill"}, ("mean",))


@case
def float_arg_given_as_int_uniform_fill(ws):
    n = net(("UniformFill", [], ["u"], {"shape": [2], "max": 3}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "UniformFill"}, ("max",))


@case
def float_value_given_as_int_constant_fill(ws):
    n = net(("ConstantFill", [], ["y"], {"shape": [1], "dtype": core.DataType.FLOAT, "value": 1}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "ConstantFill"}, ("value",))


@case
def int_arg_given_as_float(ws):
    n = net(("CreateCounter", [], ["ok"], {}), ("CreateCounter", [], ["c"], {"init_count": 1.5}))
    return lambda: ws.run(n), Expect(
        errors.InvalidArgumentError, ValueError, {"op": "CreateCounter", "op_index": 1}, ("init_count",)
    )


@case
def string_arg_given_as_int(ws):
    feed(ws, a=np.ones((1, 2), np.float32))
    n = net(("Concat", ["a", "a"], ["y", "split"], {"order": 1}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "Concat"}, ("order",))


@case
def int_arg_overflow(ws):
    feed(ws, x=np.ones(1, np.float32))
    n = net(("Print", ["x"], [], {"every_n": 1 << 40}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "Print"}, ("every_n",))


@case
def repeated_int_arg_overflow(ws):
    n = net(("GivenTensorIntFill", [], ["y"], {"shape": [1], "values": [1 << 40]}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "GivenTensorIntFill"})


@case
def duplicate_argument_with_different_values(ws):
    o = op("CreateCounter", [], ["c"])
    o.arg.add(name="init_count", i=1)
    o.arg.add(name="init_count", i=2)
    return lambda: ws.run(o), Expect(errors.InvalidArgumentError, ValueError, {"op": "CreateCounter"}, ("init_count",))


@case
def op_on_a_gpu_device(ws):
    o = op("CreateCounter", [], ["c"], device_option=core.DeviceOption(1))
    n = net(name=uid("gpu"))
    n.Proto().op.add().CopyFrom(o)
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "CreateCounter", "net": n.Name()})


@case
def net_on_a_gpu_device(ws):
    n = net(("CreateCounter", [], ["c"], {}))
    n.Proto().device_option.device_type = 1
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "CreateCounter", "net": n.Name()})


@case
def misspelled_constant_fill_shape(ws):
    # `shap` used to be ignored: the fill gave a scalar.
    n = net(("ConstantFill", [], ["c"], {"shap": [2], "value": 1.0}))
    return lambda: ws.run(n), Expect(
        errors.InvalidArgumentError,
        ValueError,
        {"op": "ConstantFill", "op_index": 0, "net": n.Name()},
        ("unknown argument 'shap'", "did you mean 'shape'?", "core.allow_unknown_arguments"),
    )


@case
def misspelled_uniform_fill_min(ws):
    # `minn` used to be ignored: the samples came from [0, 6).
    n = net(("UniformFill", [], ["u"], {"shape": [4], "minn": 5.0, "max": 6.0}))
    return lambda: ws.run(n), Expect(
        errors.InvalidArgumentError, ValueError, {"op": "UniformFill"}, ("'minn'", "did you mean 'min'?")
    )


@case
def misspelled_scale(ws):
    # `scal` used to be ignored: Scale multiplied by 1.
    feed(ws, x=np.ones(2, np.float32))
    n = net(("Copy", ["x"], ["y"], {}), ("Scale", ["y"], ["z"], {"scal": 3.0}))
    return lambda: ws.run(n), Expect(
        errors.InvalidArgumentError, ValueError, {"op": "Scale", "op_index": 1}, ("'scal'", "did you mean 'scale'?")
    )


@case
def unknown_argument_of_a_python_op(ws):
    n = core.Net(uid("py"))
    n.Python(lambda i, o: None)([], [], toke="typo")
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "Python"}, ("'toke'", "'token'"))


@case
def python_op_without_a_function(ws):
    n = net(("Python", [], [], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "Python", "net": n.Name()})


# ------------------------------------------------------------ elementwise --


@case
def add_dtype_mismatch(ws):
    feed(ws, a=np.ones(3, np.float32), b=np.ones(3, np.int32))
    n = net(("Add", ["a", "b"], ["c"], {}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "Add", "net": n.Name()})


@case
def float64_learning_rate_into_a_float32_mul(ws):
    # FeedBlob("lr", 0.1) makes float64: the error says how to fix it.
    feed(ws, w=np.ones(3, np.float32), lr=0.1)
    n = net(("Mul", ["w", "lr"], ["w_scaled"], {}))
    return lambda: ws.run(n), Expect(
        errors.DataTypeError,
        TypeError,
        {"op": "Mul", "blob": "lr"},
        (
            "B ('lr') is float64",
            "feed 'lr' as float32 (np.float32(value) for a scalar",
            "Cast(['lr'], ['lr_float32'], to=core.DataType.FLOAT)",
        ),
    )


@case
def int64_input_of_an_int32_sum(ws):
    # The input converted is the one holding Python's default (int64).
    feed(ws, a=np.array([7], np.int64), b=np.ones(1, np.int32))
    n = net(("Sum", ["a", "b"], ["c"], {}))
    return lambda: ws.run(n), Expect(
        errors.DataTypeError, TypeError, {"op": "Sum", "blob": "b"}, ("feed 'a' as int32", "to=core.DataType.INT32")
    )


@case
def add_broadcast_mismatch(ws):
    feed(ws, a=np.ones((2, 3), np.float32), b=np.ones(4, np.float32))
    n = net(("Add", ["a", "b"], ["c"], {}))
    return lambda: ws.run(n), Expect(errors.ShapeError, ValueError, {"op": "Add", "net": n.Name()})


@case
def integer_division_by_zero(ws):
    feed(ws, a=np.array([4, 5], np.int32), b=np.array([2, 0], np.int32))
    n = net(("Div", ["a", "b"], ["c"], {}))
    return lambda: ws.run(n), Expect(errors.DivisionByZeroError, ZeroDivisionError, {"op": "Div", "net": n.Name()})


@case
def sum_shape_mismatch(ws):
    feed(ws, a=np.ones(2, np.float32), b=np.ones(3, np.float32))
    n = net(("Sum", ["a", "b"], ["c"], {}))
    return lambda: ws.run(n), Expect(errors.ShapeError, ValueError, {"op": "Sum", "net": n.Name()})


@case
def comparison_in_place(ws):
    feed(ws, a=np.ones(2, np.float32), b=np.ones(2, np.float32))
    n = net(("EQ", ["a", "b"], ["a"], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "EQ"})


@case
def not_of_a_float(ws):
    feed(ws, a=np.ones(2, np.float32))
    n = net(("Not", ["a"], ["b"], {}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "Not", "blob": "a"})


@case
def cast_to_an_unknown_type(ws):
    feed(ws, x=np.ones(2, np.float32))
    n = net(("Cast", ["x"], ["y"], {"to": 99}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "Cast"})


# ------------------------------------------------------ counters and iter --


@case
def counter_op_on_a_tensor(ws):
    feed(ws, t=np.zeros(1, np.int64))
    n = net(("CountUp", ["t"], ["y"], {}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "CountUp", "blob": "t", "net": n.Name()})


@case
def counter_op_on_an_empty_blob(ws):
    ws.create_blob("e")
    n = net(("CountDown", ["e"], ["y"], {}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "CountDown", "blob": "e"})


@case
def negative_init_count(ws):
    n = net(("CreateCounter", [], ["ok"], {}), ("CreateCounter", [], ["c"], {"init_count": -1}))
    return lambda: ws.run(n), Expect(
        errors.InvalidArgumentError, ValueError, {"op": "CreateCounter", "op_index": 1, "net": n.Name()}
    )


@case
def reset_counter_negative(ws):
    make_counter(ws, "c", 3)
    n = net(("ResetCounter", ["c"], [], {"init_count": -5}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "ResetCounter"})


@case
def atomic_iter_without_a_mutex(ws):
    feed(ws, m=np.zeros(1, np.int64), it=np.zeros(1, np.int64))
    n = net(("AtomicIter", ["m", "it"], ["it"], {}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "AtomicIter", "blob": "m"})


@case
def atomic_iter_with_one_input(ws):
    feed(ws, it=np.zeros(1, np.int64))
    n = net(("AtomicIter", ["it"], ["it"], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "AtomicIter"})


@case
def iter_on_a_float_blob(ws):
    feed(ws, it=np.zeros(1, np.float32))
    n = net(("Iter", ["it"], ["it"], {}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "Iter", "blob": "it"})


@case
def iter_on_two_elements(ws):
    feed(ws, it=np.zeros(2, np.int64))
    n = net(("Iter", ["it"], ["it"], {}))
    return lambda: ws.run(n), Expect(errors.ShapeError, ValueError, {"op": "Iter", "blob": "it"})


@case
def iter_on_a_negative_count(ws):
    feed(ws, it=np.array([-4], np.int64))
    n = net(("Iter", ["it"], ["it"], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "Iter", "blob": "it"})


@case
def copy_of_a_counter(ws):
    make_counter(ws, "c")
    n = net(("Copy", ["c"], ["y"], {}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "Copy", "blob": "c"})


# ------------------------------------------------------------ fills etc. --


@case
def given_tensor_fill_wrong_number_of_values(ws):
    n = net(("GivenTensorFill", [], ["g"], {"shape": [2, 3], "values": [1.0, 2.0, 3.0, 4.0, 5.0]}))
    return lambda: ws.run(n), Expect(errors.ShapeError, ValueError, {"op": "GivenTensorFill", "blob": "g"})


@case
def given_tensor_fill_unknown_dtype_name(ws):
    n = net(("GivenTensorFill", [], ["g"], {"shape": [1], "values": [1.0], "dtype": "FOO"}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "GivenTensorFill"}, ("FOO",))


@case
def constant_fill_unknown_dtype(ws):
    n = net(("ConstantFill", [], ["y"], {"shape": [1], "dtype": 99}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "ConstantFill"}, ("99",))


@case
def constant_fill_shape_and_input(ws):
    feed(ws, x=np.ones(2, np.float32))
    n = net(("ConstantFill", ["x"], ["y"], {"shape": [3]}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "ConstantFill"})


@case
def uniform_fill_min_not_below_max(ws):
    n = net(("UniformFill", [], ["u"], {"shape": [2], "min": 2.0, "max": 1.0}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "UniformFill"})


@case
def print_every_n_zero(ws):
    feed(ws, x=np.ones(1, np.float32))
    n = net(("IsEmpty", ["x"], ["e"], {}), ("Print", ["x"], [], {"every_n": 0}))
    return lambda: ws.run(n), Expect(
        errors.InvalidArgumentError, ValueError, {"op": "Print", "op_index": 1, "net": n.Name()}, ("every_n",)
    )


@case
def scatter_assign_index_out_of_range(ws):
    feed(ws, d=np.zeros((3, 2), np.float32), i=np.array([0, 3], np.int64), s=np.ones((2, 2), np.float32))
    n = net(("ScatterAssign", ["d", "i", "s"], ["d"], {}))
    return lambda: ws.run(n), Expect(
        errors.IndexOutOfRangeError, IndexError, {"op": "ScatterAssign", "blob": "i", "net": n.Name()}
    )


@case
def scatter_assign_negative_index(ws):
    feed(ws, d=np.zeros((3,), np.int32), i=np.array([-1], np.int32), s=np.ones((1,), np.int32))
    n = net(("ScatterAssign", ["d", "i", "s"], ["d"], {}))
    return lambda: ws.run(n), Expect(errors.IndexOutOfRangeError, IndexError, {"op": "ScatterAssign", "blob": "i"})


@case
def concat_of_mismatched_dims(ws):
    feed(ws, a=np.ones((2, 3), np.float32), b=np.ones((3, 3), np.float32))
    n = net(("Concat", ["a", "b"], ["y", "split"], {"axis": 1}))
    return lambda: ws.run(n), Expect(errors.ShapeError, ValueError, {"op": "Concat", "blob": "b", "net": n.Name()})


@case
def concat_of_mismatched_dtypes(ws):
    feed(ws, a=np.ones((2, 3), np.float32), b=np.ones((2, 3), np.float64))
    n = net(("Concat", ["a", "b"], ["y", "split"], {"axis": 0}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "Concat", "blob": "b"})


@case
def split_sizes_that_do_not_add_up(ws):
    feed(ws, x=np.zeros((2, 5), np.float32))
    n = net(("Split", ["x"], ["a", "b"], {"split": [2, 2]}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "Split", "blob": "x"})


@case
def unpack_records_of_a_plain_blob(ws):
    feed(ws, x=np.zeros(3, np.int32))
    n = net(("UnPackRecords", ["x"], ["a", "b"], {"fields": ["a", "b"]}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "UnPackRecords", "blob": "x"})


@case
def concat_an_empty_tensor_vector(ws):
    n = net(("CreateTensorVector", [], ["v"], {}), ("ConcatTensorVector", ["v"], ["c"], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "ConcatTensorVector", "blob": "v"})


@case
def last_n_window_buffer_of_another_dtype(ws):
    feed(ws, buf=np.ones((2, 1), np.int32), next=np.array(0, np.int32), data=np.ones((1, 1), np.float32))
    n = net(("LastNWindowCollector", ["buf", "next", "data"], ["buf", "next"], {"num_to_collect": 3}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "LastNWindowCollector", "blob": "buf"})


@case
def index_get_with_keys_of_another_dtype(ws):
    feed(ws, keys=np.ones(2, np.int32))
    n = net(("LongIndexCreate", [], ["ix"], {}), ("IndexGet", ["ix", "keys"], ["ids"], {}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "IndexGet", "blob": "keys"})


@case
def index_load_of_repeated_keys(ws):
    feed(ws, items=np.array([3, 4, 3], np.int64))
    n = net(("LongIndexCreate", [], ["ix"], {}), ("IndexLoad", ["ix", "items"], ["ix"], {}))
    return lambda: ws.run(n), Expect(errors.InvalidArgumentError, ValueError, {"op": "IndexLoad", "blob": "items"})


@case
def lengths_to_ranges_of_a_matrix(ws):
    feed(ws, lens=np.ones((2, 2), np.int32))
    n = net(("LengthsToRanges", ["lens"], ["r"], {}))
    return lambda: ws.run(n), Expect(errors.ShapeError, ValueError, {"op": "LengthsToRanges", "blob": "lens"})


@case
def is_empty_of_an_empty_blob(ws):
    ws.create_blob("nothing")
    n = net(("IsEmpty", ["nothing"], ["y"], {}))
    return lambda: ws.run(n), Expect(errors.DataTypeError, TypeError, {"op": "IsEmpty", "blob": "nothing"})


# ------------------------------------------------------------------- nets --


@case
def undeclared_input_with_external_inputs(ws):
    feed(ws, a=np.ones(1, np.float32), b=np.ones(1, np.float32))
    n = net(("Copy", ["a"], ["y"], {}), ("Copy", ["b"], ["z"], {}))
    n.Proto().external_input.append("a")
    return lambda: ws.run(n), Expect(
        errors.InvalidPlanError, ValueError, {"blob": "b", "op": "Copy", "op_index": 1, "net": n.Name()}
    )


@case
def external_output_not_produced(ws):
    n = net(("CreateCounter", [], ["c"], {}))
    n.Proto().external_output.append("ghost_out")
    return lambda: ws.run(n), Expect(errors.InvalidPlanError, ValueError, {"blob": "ghost_out", "net": n.Name()})


@case
def unknown_net_type(ws):
    n = net(("CreateCounter", [], ["c"], {}))
    n.Proto().type = "warp_drive"
    return lambda: ws.run(n), Expect(errors.InvalidPlanError, ValueError, {"net": n.Name()}, ("warp_drive",))


@case
def node_name_on_an_op(ws):
    n = net(("CreateCounter", [], ["c"], {"device_option": core.DeviceOption(0, node_name="elsewhere")}))
    return lambda: ws.run(n), Expect(errors.InvalidPlanError, ValueError, {"op": "CreateCounter", "net": n.Name()})


@case
def create_net_without_a_name(ws):
    n = proto.NetDef()
    n.op.add().CopyFrom(op("CreateCounter", [], ["c"]))
    return lambda: ws.create_net(n), Expect(errors.InvalidPlanError, ValueError)


@case
def create_net_twice_without_overwrite(ws):
    n = net(("CreateCounter", [], ["c"], {}))
    ws.create_net(n)
    return lambda: ws.create_net(n), Expect(errors.InvalidPlanError, ValueError, {"net": n.Name()})


@case
def run_a_missing_net(ws):
    return lambda: ws.run_net("no_such_net"), Expect(errors.NetNotFoundError, KeyError, {"net": "no_such_net"})


@case
def run_a_created_net_whose_op_fails(ws):
    make_counter(ws, "x")
    n = net(("IsEmpty", ["x"], ["y"], {}))
    ws.create_net(n)

    def go():
        try:
            ws.run_net(n.Name())
        finally:
            # The same net runs once its input is fixed.
            ws.feed_blob("x", np.zeros(0, np.float32))
            assert ws.run_net(n.Name()) is True
            assert ws.blobs["y"].fetch().item() is True

    return go, Expect(errors.DataTypeError, TypeError, {"op": "IsEmpty", "blob": "x", "net": n.Name()})


# ------------------------------------------------------------------ steps --


def looping_plan(stop_value_net):
    body = net(("CountUp", ["c"], ["p"], {}))
    init = net(("CreateCounter", [], ["c"], {}))
    steps = [raw_step("init", [init.Name()])]
    nets = [init, body]
    if stop_value_net is not None:
        nets.append(stop_value_net)
        steps.append(raw_step("mkstop", [stop_value_net.Name()]))
    steps.append(raw_step("loop", [body.Name()], should_stop_blob="stop"))
    return raw_plan(nets, steps)


@case
def non_bool_stop_blob(ws):
    ws.feed_blob("stop", np.array([1.0], np.float32))
    return lambda: ws.run(looping_plan(None)), Expect(errors.DataTypeError, TypeError, {"blob": "stop", "step": "loop"})


@case
def stop_blob_with_two_elements(ws):
    ws.feed_blob("stop", np.array([True, False]))
    return lambda: ws.run(looping_plan(None)), Expect(errors.DataTypeError, TypeError, {"blob": "stop", "step": "loop"})


@case
def counter_as_stop_blob(ws):
    mk = net(("CreateCounter", [], ["stop"], {}))
    return lambda: ws.run(looping_plan(mk)), Expect(errors.DataTypeError, TypeError, {"blob": "stop", "step": "loop"})


@case
def missing_stop_blob(ws):
    body = net(("CreateCounter", [], ["c"], {}))
    p = raw_plan([body], [raw_step("loop", [body.Name()], should_stop_blob="nope")])
    return lambda: ws.run(p), Expect(errors.BlobNotFoundError, KeyError, {"blob": "nope", "step": "loop"})


@case
def num_iter_with_should_stop_blob(ws):
    ws.create_blob("stop")
    body = net(("CreateCounter", [], ["c"], {}))
    p = raw_plan([body], [raw_step("both", [body.Name()], num_iter=3, should_stop_blob="stop")])
    return lambda: ws.run(p), Expect(errors.InvalidPlanError, ValueError, {"step": "both"})


@case
def only_once_without_stop_blob(ws):
    body = net(("CreateCounter", [], ["c"], {}))
    p = raw_plan([body], [raw_step("once", [body.Name()], only_once=False)])
    return lambda: ws.run(p), Expect(errors.InvalidPlanError, ValueError, {"step": "once"}, ("only_once",))


@case
def step_with_nets_and_substeps(ws):
    body = net(("CreateCounter", [], ["c"], {}))
    sub = raw_step("sub", [body.Name()])
    p = raw_plan([body], [raw_step("mixed", [body.Name()], substeps=[sub])])
    return lambda: ws.run(p), Expect(errors.InvalidPlanError, ValueError, {"step": "mixed"})


@case
def undefined_net_in_a_step(ws):
    body = net(("CreateCounter", [], ["c"], {}))
    p = raw_plan([body], [raw_step("outer", substeps=[raw_step("inner", [body.Name(), "ghost_net"])])])
    return lambda: ws.run(p), Expect(errors.InvalidPlanError, ValueError, {"step": "inner", "net": "ghost_net"})


@case
def undefined_net_even_if_the_workspace_has_it(ws):
    body = net(("CreateCounter", [], ["c"], {}))
    ws.create_net(body)
    p = raw_plan([], [raw_step("s", [body.Name()])])
    return lambda: ws.run(p), Expect(errors.InvalidPlanError, ValueError, {"step": "s", "net": body.Name()})


@case
def duplicate_net_names_in_a_plan(ws):
    a = net(("CreateCounter", [], ["c"], {}))
    b = net(("CreateCounter", [], ["d"], {}))
    b.Proto().name = a.Name()
    p = raw_plan([a, b], [raw_step("s", [a.Name()])])
    return lambda: ws.run(p), Expect(errors.InvalidPlanError, ValueError, {"net": a.Name()})


@case
def report_net_without_interval(ws):
    body = net(("CreateCounter", [], ["c"], {}))
    p = raw_plan([body], [raw_step("rep", [body.Name()], report_net=body.Name())])
    return lambda: ws.run(p), Expect(errors.InvalidPlanError, ValueError, {"step": "rep"}, ("report_interval",))


@case
def negative_concurrent_instances(ws):
    body = net(("CreateCounter", [], ["c"], {}))
    p = raw_plan([body], [raw_step("neg", substeps=[raw_step("x", [body.Name()])], num_concurrent_instances=-2)])
    return lambda: ws.run(p), Expect(errors.InvalidPlanError, ValueError, {"step": "neg"})


@case
def failure_inside_one_of_50_concurrent_instances(ws):
    # Each instance draws a ticket 0..49 and writes row `ticket` of a 49-row
    # tensor: only ticket 49 is out of range, so exactly one instance fails.
    init = net(
        ("CreateCounter", [], ["calls"], {}),
        ("ConstantFill", [], ["data"], {"shape": [49], "value": 0.0}),
        ("ConstantFill", [], ["slice"], {"shape": [1], "value": 1.0}),
    )
    body = net(("CountUp", ["calls"], ["ticket"], {}), ("ScatterAssign", ["data", "ticket", "slice"], ["data"], {}))
    inst = core.execution_step("inst", body, create_workspace=True)
    par = core.execution_step("par", [inst], num_concurrent_instances=50)
    plan = core.Plan(uid("p"))
    plan.AddStep(core.execution_step("init", init))
    plan.AddStep(par)

    def go():
        try:
            ws.run(plan)
        finally:
            # Every instance drew its ticket and finished its net.
            ws.run(op("RetrieveCount", ["calls"], ["ncalls"]))
            assert ws.blobs["ncalls"].fetch().item() == 50
            assert ws.blobs["data"].fetch().tolist() == [1.0] * 49
            assert not ws.has_blob("ticket")

    return go, Expect(
        errors.IndexOutOfRangeError,
        IndexError,
        {"op": "ScatterAssign", "blob": "ticket", "net": body.Name(), "step": "inst"},
        ("49",),
    )


@case
def failing_report_step(ws):
    init = net(("CreateCounter", [], ["cnt"], {}))
    body = net(("CountUp", ["cnt"], ["p"], {}))
    rep = net(("Copy", ["cnt"], ["copied"], {}))
    top = core.execution_step(
        "top",
        [core.execution_step("body", body, num_iter=3), core.execution_step("rep", rep, run_every_ms=600_000)],
    )
    plan = core.Plan(uid("p"))
    plan.AddStep(core.execution_step("init", init))
    plan.AddStep(top)

    def go():
        try:
            ws.run(plan)
        finally:
            ws.run(op("RetrieveCount", ["cnt"], ["n"]))
            assert ws.blobs["n"].fetch().item() == 3  # the body finished first

    return go, Expect(errors.DataTypeError, TypeError, {"op": "Copy", "blob": "cnt", "net": rep.Name(), "step": "rep"})


@case
def failing_report_net(ws):
    init = net(("CreateCounter", [], ["cnt"], {}))
    body = net(("CountUp", ["cnt"], ["p"], {}))
    rep = net(("IsEmpty", ["cnt"], ["e"], {}))
    plan = core.Plan(uid("p"))
    plan.AddStep(core.execution_step("init", init))
    plan.AddStep(core.execution_step("top", body, num_iter=2, report_net=rep, report_interval=3600))
    return lambda: ws.run(plan), Expect(
        errors.DataTypeError, TypeError, {"op": "IsEmpty", "blob": "cnt", "net": rep.Name(), "step": "top"}
    )


# ----------------------------------------------------------- Python ops --


class UserError(ValueError):
    pass


@case
def python_op_raising_value_error(ws):
    raised = []

    def bad_python_function(inputs, outputs):
        e = UserError("user code failed")
        raised.append(e)
        raise e

    n = core.Net(uid("py"))
    n.Python(bad_python_function)([], [])

    def go():
        try:
            ws.run(n)
        except UserError as e:
            assert e is raised[0]  # the very same exception object
            frames = [f.name for f in traceback.extract_tb(e.__traceback__)]
            assert "bad_python_function" in frames
            raise

    return go, Expect(UserError, ValueError, {}, ("user code failed",))


@case
def python_op_raising_inside_a_concurrent_instance(ws):
    lock = threading.Lock()
    calls = []

    def sometimes_fails(inputs, outputs):
        with lock:
            calls.append(1)
            k = len(calls)
        if k == 17:
            raise UserError(f"instance call {k} failed")

    n = core.Net(uid("py"))
    n.Python(sometimes_fails)([], [])
    inst = core.execution_step("inst", n, num_iter=2, create_workspace=True)
    par = core.execution_step("par", [inst], num_concurrent_instances=20)
    return lambda: ws.run(par), Expect(UserError, ValueError, {}, ("instance call 17 failed",))


@case
def python_failure_cancels_a_looping_sibling(ws):
    ws.create_blob("never")
    spin = net(("Iter", [], ["spins"], {}))

    def fail_later(inputs, outputs):
        raise UserError("sibling failed")

    bad = core.Net(uid("bad"))
    bad.Python(fail_later)([], [])
    forever = core.execution_step("forever", spin, should_stop_blob=core.BlobReference("never"))
    top = core.execution_step("top", [forever, core.execution_step("failing", bad)], concurrent_substeps=True)
    return lambda: ws.run(top), Expect(UserError, ValueError, {}, ("sibling failed",))


# ---------------------------------------------- feeding, fetching, protos --


@case
def feed_a_list(ws):
    return lambda: ws.feed_blob("lst", [1, 2, 3]), Expect(errors.FeedError, TypeError, {"blob": "lst"})


@case
def feed_an_object_array_of_ints(ws):
    return lambda: ws.feed_blob("objs", np.array([1, 2], dtype=object)), Expect(
        errors.FeedError, TypeError, {"blob": "objs"}
    )


@case
def feed_a_dict_through_the_module(ws):
    def go():
        prev = workspace.CurrentWorkspace()
        workspace.SwitchWorkspace(uid("feed_dict"), True)
        try:
            workspace.FeedBlob("d", {"k": 1})
        finally:
            workspace.SwitchWorkspace(prev)

    return go, Expect(errors.FeedError, TypeError, {"blob": "d"})


@case
def fetch_a_missing_blob(ws):
    return lambda: ws.fetch_blob("absent"), Expect(errors.BlobNotFoundError, KeyError, {"blob": "absent"})


@case
def reset_a_missing_blob(ws):
    return lambda: ws.reset_blob("absent2"), Expect(errors.BlobNotFoundError, KeyError, {"blob": "absent2"})


@case
def switch_to_a_missing_workspace(ws):
    missing = uid("no_such_workspace")
    return lambda: workspace.SwitchWorkspace(missing), Expect(errors.WorkspaceNotFoundError, KeyError, {}, (missing,))


@case
def malformed_plan_bytes(ws):
    return lambda: ws._core.run_plan(b"\xff\x01"), Expect(errors.InvalidPlanError, ValueError, {}, ("PlanDef",))


@case
def truncated_plan(ws):
    body = net(("CreateCounter", [], ["c"], {}))
    data = raw_plan([body], [raw_step("s", [body.Name()])]).SerializeToString()
    return lambda: ws._core.run_plan(data[: len(data) - 3]), Expect(errors.InvalidPlanError, ValueError, {}, ("PlanDef",))


@case
def truncated_net(ws):
    data = net(("CreateCounter", [], ["c"], {})).Proto().SerializeToString()
    return lambda: ws._core.create_net(data[:-2]), Expect(errors.InvalidPlanError, ValueError, {}, ("NetDef",))


@case
def garbage_operator(ws):
    return lambda: ws._core.run_operator_once(b"\x0a\xff\xff\xff\xff\x0f"), Expect(
        errors.InvalidPlanError, ValueError, {}, ("OperatorDef",)
    )


# ------------------------------------------------------------------- run --


def _run_case(name):
    ws = workspace.Workspace()
    thunk, expect = CASES[name](ws)
    with pytest.raises(BaseException) as info:
        thunk()
    check(info.value, expect)
    assert_usable(ws)


@pytest.mark.parametrize("name", list(CASES), ids=str)
def test_bad_input(name):
    _run_case(name)


def test_the_catalogue_is_large_enough():
    assert len(CASES) >= 45
    assert len(set(CASES)) == len(CASES)
