"""Operator creation: OperatorDefs from Python values, arguments, Python ops
(Caffe2's ``core.CreateOperator``; a part of :mod:`ferrocaffe.core`)."""

from __future__ import annotations

import collections.abc
import os
import sys
import traceback
from typing import Any, Sequence

import numpy as np

from ferrocaffe import errors, scope
from ferrocaffe.proto import Message, _utf8, caffe2_pb2
from ferrocaffe.core.blobs import _RectifyInputOutput


# ---------------------------------------------------------- op creation --


def _is_float(v):
    return isinstance(v, (float, np.floating))


def _is_int(v):
    return isinstance(v, (int, np.integer, np.bool_))


# The package's folder (this file is in its core/ subpackage): frames in
# it are ferrocaffe's, not the user's.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _user_frame():
    """``(code, instruction offset)`` of the innermost calling frame outside
    the ferrocaffe package, or None. The line number is worked out only when
    asked (:func:`_frame_location`): this runs for every op a net creates."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return None if frame is None else (frame.f_code, frame.f_lasti)


def _frame_location(code, offset=None, *resolved):
    """``(file, line, function)`` of an instruction offset in ``code`` (or
    the location itself, when it was resolved already)."""
    if isinstance(code, str):
        return (code, offset) + resolved
    line = code.co_firstlineno
    for start, end, number in code.co_lines():
        if start <= offset < end and number is not None:
            line = number
            break
    return code.co_filename, line, code.co_name


def _MakeArgument(key, value):
    """An Argument named ``key`` whose field follows the Python type of
    ``value`` (Caffe2's ``utils.MakeArgument``)."""
    argument = caffe2_pb2.Argument()
    argument.name = key
    # Paths (pathlib.Path, any os.PathLike) are strings to the ops.
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    elif isinstance(value, (list, tuple)) and any(isinstance(v, os.PathLike) for v in value):
        value = [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
    if isinstance(value, np.ndarray):
        if value.dtype.type is np.float32:
            argument.floats.extend(value.flatten().tolist())
            return argument
        value = value.flatten().tolist()
    elif isinstance(value, np.generic):
        value = value.item()

    if type(value) is float:
        argument.f = value
    elif isinstance(value, int):  # bools too: they are stored as ints
        argument.i = int(value)
    elif isinstance(value, bytes):
        argument.s = value
    elif isinstance(value, str):
        argument.s = value.encode("utf-8")
    elif isinstance(value, caffe2_pb2.NetDef):
        argument.n.CopyFrom(value)
    elif isinstance(value, Message):
        argument.s = value.SerializeToString()
    elif isinstance(value, float):
        argument.f = value
    elif isinstance(value, collections.abc.Iterable):
        values = list(value)
        if all(_is_float(v) for v in values):
            argument.floats.extend(float(v) for v in values)
        elif all(_is_int(v) for v in values):
            argument.ints.extend(int(v) for v in values)
        elif all(isinstance(v, (bytes, str)) for v in values):
            argument.strings.extend(
                v.encode("utf-8") if isinstance(v, str) else v for v in values
            )
        elif all(isinstance(v, caffe2_pb2.NetDef) for v in values):
            argument.nets.extend(values)
        elif all(isinstance(v, Message) for v in values):
            argument.strings.extend(v.SerializeToString() for v in values)
        else:
            raise ValueError(
                "Unknown iterable argument type: key={} value={}, value "
                "type={}[{}]".format(key, value, type(value), set(type(v) for v in values))
            )
    else:
        raise ValueError(
            "Unknown argument type: key={} value={}, value type={}".format(
                key, value, type(value)
            )
        )
    return argument


#: The argument :func:`allow_unknown_arguments` sets on a NetDef or an
#: OperatorDef (Caffe2 ignores it, like any argument it does not know).
ALLOW_UNKNOWN_ARGUMENTS = "ferrocaffe_allow_unknown_arguments"


def allow_unknown_arguments(obj: Any, allow: bool = True) -> Any:
    """Lets the ops of ``obj`` carry arguments their schemas do not know,
    which are then ignored; returns ``obj``.

    By default an op argument that the op does not know (a typo such as
    ``shap=`` for ``shape=``) raises InvalidArgumentError when the net is
    created. A net written for a Caffe2 build with other operators (newer
    or internal versions of an op, other engines) may carry such arguments;
    mark it with this function to load it anyway. Engine hints (``order``,
    ``use_cudnn``, ``cudnn_exhaustive_search``, ``exhaustive_search``,
    ``ws_nbytes_limit``) are always accepted and ignored, without this.

    ``obj`` is a ``Net`` or NetDef (every op, and the nets nested in its
    ``If``/``While``/``Do`` ops), a Plan or PlanDef (every net it holds),
    or an OperatorDef (for ``workspace.RunOperatorOnce``). The mark is an
    argument of the proto, so it travels with it (plans, sessions, copies).
    ``allow=False`` removes it.
    """
    if callable(getattr(obj, "Proto", None)):  # a Net or a Plan
        allow_unknown_arguments(obj.Proto(), allow)
        return obj
    if isinstance(obj, caffe2_pb2.PlanDef):
        for net in obj.network:
            allow_unknown_arguments(net, allow)
        return obj
    if not isinstance(obj, (caffe2_pb2.NetDef, caffe2_pb2.OperatorDef)):
        raise TypeError(
            "allow_unknown_arguments takes a Net, NetDef, Plan, PlanDef or "
            "OperatorDef, not {}".format(type(obj).__name__)
        )
    kept = [a for a in obj.arg if a.name != ALLOW_UNKNOWN_ARGUMENTS]
    del obj.arg[:]
    obj.arg.extend(kept)
    if allow:
        obj.arg.append(_MakeArgument(ALLOW_UNKNOWN_ARGUMENTS, 1))
    return obj


def CreateOperator(
    operator_type: str,
    inputs: Any,
    outputs: Any,
    name: str = "",
    control_input: Any = None,
    device_option: caffe2_pb2.DeviceOption | None = None,
    arg: Sequence[Any] | None = None,
    engine: str | None = None,
    debug_info: str | None = None,
    **kwargs: Any,
) -> caffe2_pb2.OperatorDef:
    """Builds an OperatorDef. The type is not checked against the registry.

    String inputs and outputs get the current name scope; BlobReferences are
    used as they are. The device option is ``device_option``, else the
    current DeviceScope, else unset. ``random_seed`` goes into the device
    option, ``arg`` (a list of Arguments) is appended as is, and every other
    keyword becomes an Argument (None values are skipped).
    """
    operator = caffe2_pb2.OperatorDef()
    if _caffe2_debug():
        operator.debug_info = "".join(traceback.format_stack()[:-1])

    operator.type = operator_type
    operator.name = name
    inputs = _RectifyInputOutput(inputs)
    outputs = _RectifyInputOutput(outputs)
    operator.input.extend(_blob_names(inputs))
    operator.output.extend(_blob_names(outputs))
    if control_input:
        control_input = _RectifyInputOutput(control_input)
        operator.control_input.extend([str(i) for i in control_input])
    if device_option is not None:
        operator.device_option.CopyFrom(device_option)
    elif scope.CurrentDeviceScope() is not None:
        operator.device_option.CopyFrom(scope.CurrentDeviceScope())
    if engine is not None:
        operator.engine = engine
    if debug_info is not None:
        operator.debug_info = debug_info
    if "random_seed" in kwargs:
        operator.device_option.random_seed = kwargs.pop("random_seed")
    if arg is not None:
        operator.arg.extend(arg)
    for key, value in kwargs.items():
        if value is not None:
            try:
                operator.arg.append(_MakeArgument(key, value))
            except (errors.FerrocaffeError, UnicodeError, ValueError) as e:
                raise _argument_error(key, operator_type, e) from None

    workspace = sys.modules.get("ferrocaffe.workspace")
    is_immediate = getattr(workspace, "IsImmediate", None)
    if workspace is not None and is_immediate is not None and is_immediate():
        workspace.RunOperatorImmediate(operator)
    return operator


try:
    # os.environ's own dict: a lookup in it costs a tenth of os.environ.get,
    # which Net's op methods would otherwise pay for every op.
    _ENVIRON_DATA = os.environ._data  # type: ignore[attr-defined]  # CPython only
    _CAFFE2_DEBUG_KEY = os.environ.encodekey("CAFFE2_DEBUG")

    def _caffe2_debug():
        return bool(_ENVIRON_DATA.get(_CAFFE2_DEBUG_KEY))
except AttributeError:  # not CPython's os.environ
    _ENVIRON_DATA = os.environ
    _CAFFE2_DEBUG_KEY = "CAFFE2_DEBUG"

    def _caffe2_debug():
        return bool(os.environ.get("CAFFE2_DEBUG"))


def _argument_error(key, operator_type, e):
    """The typed error for an argument protobuf refused (an int out of
    int64's range, a str with no UTF-8 form) or that has no Argument form."""
    return errors.InvalidArgumentError(
        f"argument '{key}' of a {operator_type} op: {e}", op=operator_type)


def _blob_names(refs):
    """The names of BlobReferences, each checked to have a UTF-8 form
    (a typed error naming the blob, rather than protobuf's UnicodeError)."""
    names = [ref._name for ref in refs]
    for name in names:
        if not name.isascii():
            _utf8(name, "blob", blob=repr(name))
    return names


# Serialised Arguments by (name, type, value), for the scalar values ops get
# again and again (``broadcast=1``, ``shape``-free fills...): the fast path of
# Net's op methods then costs a dict lookup per argument. Only types whose
# equal values serialise alike are kept (not tuples: (1, 2) == (1.0, 2.0);
# not 0.0, equal to -0.0).
_ARG_BYTES = {}
_ARG_BYTES_MAX = 4096
_CACHED_ARG_TYPES = frozenset([int, bool, str, bytes, float])


def _argument_bytes(key, value, operator_type):
    """``_MakeArgument(key, value)`` serialised."""
    cacheable = type(value) in _CACHED_ARG_TYPES and not (type(value) is float and value == 0.0)
    if cacheable:
        cached = _ARG_BYTES.get((key, type(value), value))
        if cached is not None:
            return cached
    try:
        # Partial: a nested message missing a required field fails when the
        # net is serialised, as it did when ops were messages.
        data = _MakeArgument(key, value).SerializePartialToString()
    except (errors.FerrocaffeError, UnicodeError, ValueError) as e:
        raise _argument_error(key, operator_type, e) from None
    if cacheable:
        if len(_ARG_BYTES) >= _ARG_BYTES_MAX:
            _ARG_BYTES.clear()
        _ARG_BYTES[(key, type(value), value)] = data
    return data


# CreateOperator's keywords that are fields of the OperatorDef rather than
# Arguments: an op given any of them takes the general path.
_OPERATOR_FIELD_KEYWORDS = frozenset(
    ["name", "control_input", "device_option", "arg", "engine", "debug_info", "random_seed"])


def _RegisterPythonImpl(f, grad_f=None, python_func_type=None, pass_workspace=False):
    """Registers ``f`` (and ``grad_f``, the function the ``PythonGradient`` op
    calls) with the runtime and returns the token."""
    if python_func_type:
        func = python_func_type(f)
        f = func.forward
        grad_f = func.backward
    else:
        if isinstance(f, tuple):
            f = f[0](*f[1], **f[2])
        if isinstance(grad_f, tuple):
            grad_f = grad_f[0](*grad_f[1], **grad_f[2])
    from ferrocaffe import _python_ops

    token = _python_ops.register(f, pass_workspace)
    if grad_f is not None:
        _python_ops.register_gradient(token, grad_f, pass_workspace)
    return token


def CreatePythonOperator(
    f: Any,
    inputs: Any,
    outputs: Any,
    grad_f: Any = None,
    pass_workspace: bool = False,
    python_func_type: Any = None,
    *args: Any,
    **kwargs: Any,
) -> caffe2_pb2.OperatorDef:
    """A ``Python`` op that calls ``f(inputs, outputs)`` (or
    ``f(inputs, outputs, workspace)`` with ``pass_workspace``)."""
    kwargs["token"] = _RegisterPythonImpl(
        f, grad_f, python_func_type, pass_workspace=pass_workspace
    )
    return CreateOperator("Python", inputs, outputs, *args, **kwargs)


def _nets_within(proto):
    """Every NetDef inside ``proto`` (a PlanDef, NetDef or OperatorDef),
    the nets that ops carry in arguments (``Do``, ``If``, ``While``)
    included. Iterative, so how deeply nets nest is no limit."""
    nets, ops = [], []
    kind = type(proto).__name__
    if kind == "PlanDef":
        nets.extend(proto.network)
    elif kind == "NetDef":
        nets.append(proto)
    elif kind == "OperatorDef":
        ops.append(proto)
    else:
        raise TypeError(f"expected a PlanDef, NetDef or OperatorDef, got {kind}")
    i = 0
    while ops or i < len(nets):
        for op in ops:
            for arg in op.arg:
                if arg.HasField("n"):
                    nets.append(arg.n)
                nets.extend(arg.nets)
        ops = list(nets[i].op) if i < len(nets) else []
        i += 1
    return nets


def _ops_within(proto):
    """Every OperatorDef inside ``proto`` (see ``_nets_within``)."""
    ops = [proto] if type(proto).__name__ == "OperatorDef" else []
    for net in _nets_within(proto):
        ops.extend(net.op)
    return ops


def TrustPickledBuilders(net_or_plan: Any) -> int:
    """Lets the ``Python`` ops of ``net_or_plan`` (a Net, Plan, or a NetDef,
    PlanDef or OperatorDef, nested nets included) unpickle their
    ``pickled_builder`` when they are built. Returns how many builders it
    trusted.

    Nets and plans read from files or bytes never unpickle a builder
    otherwise, since unpickling runs arbitrary code; builders that
    ``Net.Python`` made in this process need no call. Call this only on
    nets and plans from a source you trust."""
    from ferrocaffe import _python_ops

    proto = net_or_plan.Proto() if hasattr(net_or_plan, "Proto") else net_or_plan
    count = 0
    for op in _ops_within(proto):
        if op.type not in ("Python", "PythonGradient"):
            continue
        for arg in op.arg:
            if arg.name in ("pickled_builder", "pickled_grad_builder") and arg.HasField("s"):
                _python_ops.trust(arg.s)
                count += 1
    return count
