"""Nets, execution steps and plans: Caffe2's ``caffe2.python.core``.

Code written for Caffe2 ports by replacing ``from caffe2.python import core``
with ``from ferrocaffe import core``. The names, signatures, defaults,
automatic blob naming and assertion messages follow Caffe2; the few places
where ferrocaffe deliberately differs are marked "Caffe2 bug fixed" below.

Out of scope here: ``ClonePartial``, device-copy injection. Gradients:
gradients.py (``GradientRegistry`` below, ``Net.AddGradientOperators``).
"""

from __future__ import annotations

import collections.abc
import difflib
import importlib
import inspect
import os
import pickle
import re
import sys
import threading
import traceback
from collections import OrderedDict, defaultdict
from itertools import chain
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ferrocaffe import _core, errors, gradients
# The gradient makers of If, While and Do register themselves (Caffe2's core
# imported control_ops_grad too).
from ferrocaffe import control_ops_grad  # noqa: F401
from ferrocaffe.proto import MAX_NESTING, Message, _utf8, caffe2_pb2
from ferrocaffe import scope, utils, workspace  # noqa: F401 (Caffe2's core exposes both)
from ferrocaffe.workspace import GetGlobalInitArgs, GlobalInit  # noqa: F401 (core.GlobalInit, as in Caffe2)
from ferrocaffe.workspace import C  # noqa: F401 (Caffe2's core exposes its compiled module as core.C)

__all__ = [
    "DataType",
    "BlobReference",
    "ScopedName",
    "ScopedBlobReference",
    "NameScope",
    "DeviceScope",
    "DeviceOption",
    "CreateOperator",
    "CreatePythonOperator",
    "IsOperator",
    "IsOperatorWithEngine",
    "InferOpBlobDevices",
    "InferOpBlobDevicesAsDict",
    "InferOpDeviceAsBlobDevices",
    "InjectCrossDeviceCopies",
    "GlobalInit",
    "GetGlobalInitArgs",
    "SetPerOpEnginePref",
    "SetGlobalEnginePref",
    "SetEnginePref",
    "SetOpEnginePref",
    "RegisteredOperators",
    "RefreshRegisteredOperators",
    "Net",
    "ExecutionStep",
    "Plan",
    "execution_step",
    "scoped_execution_step",
    "to_execution_step",
    "add_nets_in_order",
    "get_net_name",
    "output_to_list",
    "allow_unknown_arguments",
    "ALLOW_UNKNOWN_ARGUMENTS",
    "TrustPickledBuilders",
    "GradientRegistry",
    "IR",
]

# Convenience redirections, as in Caffe2.
DeviceScope = scope.DeviceScope
NameScope = scope.NameScope


class DataType:
    """TensorProto data types, as plain ints (``core.DataType.INT64 == 10``)."""

    UNDEFINED = 0
    FLOAT = 1
    INT32 = 2
    BYTE = 3
    STRING = 4
    BOOL = 5
    UINT8 = 6
    INT8 = 7
    UINT16 = 8
    INT16 = 9
    INT64 = 10
    FLOAT16 = 12
    DOUBLE = 13
    ZERO_COLLISION_HASH = 14
    REBATCHING_BUFFER = 15


GradientSlice = gradients.GradientSlice


# ------------------------------------------------------ operator registry --
#
# The list of operator types comes from the compiled runtime. It is read at
# import, as Caffe2's core did (programs read `core._REGISTERED_OPERATORS`
# directly), and re-read on a miss, because the
# bindings may register operators (the Python op) after the first read. Only
# when the registry cannot be read at all (a compiled module without it) is
# every CamelCase name accepted, so that nets can still be built and
# serialised. (The compiled module itself is needed at import: it carries the
# schema of caffe2_pb2 and the encoder of queued ops.)

_REGISTERED_OPERATORS = None  # a set, loaded lazily; None = not loaded yet
_REGISTRY_AVAILABLE = None  # False when the compiled registry is missing
_OP_TYPE_RE = re.compile(r"[A-Z][A-Za-z0-9_]*\Z")


def _load_registry():
    """The operator types registered in the runtime, or None if the compiled
    module (or its registry) is not available."""
    try:
        _core = importlib.import_module("ferrocaffe._core")
    except ImportError:
        return None
    registered_operators = getattr(_core, "registered_operators", None)
    if registered_operators is None:
        return None
    return set(registered_operators())


def _GetRegisteredOperators():
    """The registered operator types, as a set (empty if unavailable)."""
    return _load_registry() or set()


def _registry():
    if _REGISTERED_OPERATORS is None:
        RefreshRegisteredOperators()
    return _REGISTERED_OPERATORS


def RefreshRegisteredOperators(trigger_lazy: bool = True) -> None:
    """Re-reads the list of registered operators from the runtime."""
    global _REGISTERED_OPERATORS, _REGISTRY_AVAILABLE
    _forget_op_methods()
    registered = _load_registry()
    _REGISTRY_AVAILABLE = registered is not None
    _REGISTERED_OPERATORS = registered if registered is not None else set()


def RegisteredOperators() -> list[str]:
    """The registered operator types, sorted."""
    return sorted(_registry())


def _op_registry_key(op_type, engine):
    if not engine or engine == "DEFAULT":
        return op_type
    return op_type + "_ENGINE_" + engine


# ------------------------------------------------- engine preferences --
#
# Caffe2 picked an operator's implementation (engine) per device type from
# these preferences. ferrocaffe has one CPU implementation per operator, so
# they are checked and recorded, and change nothing.

_PER_OP_ENGINE_PREF: dict = {}
_GLOBAL_ENGINE_PREF: dict = {}


def _check_engine_list(what, engines):
    if isinstance(engines, (str, bytes)) or not all(isinstance(e, str) for e in engines):
        raise TypeError(f"{what}: engines must be a list of strings, got {engines!r}")
    return list(engines)


def SetPerOpEnginePref(op_engine_pref: Mapping[Any, Mapping[str, Sequence[str]]]) -> None:
    """``{device_type: {op_type: [engine, ...]}}``: recorded, no effect."""
    checked = {}
    for device_type, per_op in dict(op_engine_pref).items():
        checked[int(device_type)] = {
            str(op): _check_engine_list(f"engine preference of {op}", engines) for op, engines in dict(per_op).items()
        }
    _PER_OP_ENGINE_PREF.clear()
    _PER_OP_ENGINE_PREF.update(checked)


def SetGlobalEnginePref(global_engine_pref: Mapping[Any, Sequence[str]]) -> None:
    """``{device_type: [engine, ...]}``: recorded, no effect."""
    checked = {
        int(device_type): _check_engine_list("global engine preference", engines)
        for device_type, engines in dict(global_engine_pref).items()
    }
    _GLOBAL_ENGINE_PREF.clear()
    _GLOBAL_ENGINE_PREF.update(checked)


def SetEnginePref(
    per_op_engine_pref: Mapping[Any, Mapping[str, Sequence[str]]] | None = None,
    global_engine_pref: Mapping[Any, Sequence[str]] | None = None,
) -> None:
    """Sets both engine preferences (see :func:`SetPerOpEnginePref` and
    :func:`SetGlobalEnginePref`)."""
    SetPerOpEnginePref(per_op_engine_pref or {})
    SetGlobalEnginePref(global_engine_pref or {})


def SetOpEnginePref(op_type: str, op_pref: Mapping[Any, Sequence[str]]) -> None:
    """``op_pref`` is ``{device_type: [engine, ...]}`` for ``op_type``."""
    for device_type, engines in dict(op_pref).items():
        _PER_OP_ENGINE_PREF.setdefault(int(device_type), {})[str(op_type)] = _check_engine_list(
            f"engine preference of {op_type}", engines
        )


def IsOperator(op_type: str) -> bool:
    return IsOperatorWithEngine(op_type, engine="DEFAULT")


def InferOpBlobDevices(op: caffe2_pb2.OperatorDef) -> tuple[list[Any], list[Any]]:
    """``(input devices, output devices)`` of an OperatorDef, one
    DeviceOption per input and output: every blob of an op lives where the
    op runs (its device option; all CPU here)."""
    device = caffe2_pb2.DeviceOption()
    if op.HasField("device_option"):
        device.CopyFrom(op.device_option)

    def copies(n):
        result = []
        for _ in range(n):
            option = caffe2_pb2.DeviceOption()
            option.CopyFrom(device)
            result.append(option)
        return result

    return copies(len(op.input)), copies(len(op.output))


def InferOpBlobDevicesAsDict(op: caffe2_pb2.OperatorDef) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`InferOpBlobDevices` as ``({input: device}, {output: device})``."""
    inputs, outputs = InferOpBlobDevices(op)
    return dict(zip(op.input, inputs)), dict(zip(op.output, outputs))


def InferOpDeviceAsBlobDevices(op: caffe2_pb2.OperatorDef) -> tuple[list[Any], list[Any]]:
    """Like :func:`InferOpBlobDevices`, from the op's own device option."""
    return InferOpBlobDevices(op)


def IsOperatorWithEngine(op_type: str, engine: str) -> bool:
    registered = _registry()
    if not _REGISTRY_AVAILABLE:
        return (not engine or engine == "DEFAULT") and bool(_OP_TYPE_RE.match(op_type))
    key = _op_registry_key(op_type, engine)
    if key in registered:
        return True
    if _OP_TYPE_RE.match(op_type):
        RefreshRegisteredOperators()
        return key in (_REGISTERED_OPERATORS or ())
    return False


def _nearby_opnames(op_type):
    return difflib.get_close_matches(op_type, sorted(_registry()), n=5, cutoff=0.6)


class _NotRegisteredError(AttributeError):
    """The AttributeError for ``net.Name`` when ``Name`` is no operator. Its
    "Did you mean" list is worked out when the message is first read:
    ``hasattr(net, name)`` probes, which never read it, then cost no fuzzy
    search through every operator name."""

    def __init__(self, op_type):
        super().__init__(op_type)
        self.op_type = op_type
        self._message = None

    def _full_message(self):
        if self._message is None:
            self._message = (
                "Method " + self.op_type + " is not a registered operator."
                + " Did you mean: [" + ",".join(_nearby_opnames(self.op_type)) + "]"
            )
        return self._message

    @property
    def args(self):
        return (self._full_message(),)

    @args.setter
    def args(self, value):
        # Only the message made here is kept (BaseException.__init__ sets
        # args to the bare operator name first).
        pass

    def __str__(self):
        return self._full_message()

    def __repr__(self):
        return "AttributeError(%r)" % self._full_message()


def _not_registered(op_type):
    return _NotRegisteredError(op_type)


# --------------------------------------------------------------- devices --


def IsGPUDeviceType(device_type: int) -> bool:
    return device_type in {caffe2_pb2.CUDA, caffe2_pb2.HIP}


def DeviceOption(
    device_type: int,
    device_id: int = 0,
    random_seed: int | None = None,
    node_name: str | None = None,
    numa_node_id: int | None = None,
    extra_info: Sequence[str] | None = None,
) -> caffe2_pb2.DeviceOption:
    """Builds a DeviceOption proto (``device_id`` is always set)."""
    option = caffe2_pb2.DeviceOption()
    option.device_type = device_type
    option.device_id = device_id
    if node_name is not None:
        option.node_name = node_name
    if random_seed is not None:
        option.random_seed = random_seed
    if numa_node_id is not None:
        assert device_type == caffe2_pb2.CPU
        option.numa_node_id = numa_node_id
    if extra_info is not None:
        option.extra_info.extend(extra_info)
    return option


def device_option_equal(
    opt1: caffe2_pb2.DeviceOption | None,
    opt2: caffe2_pb2.DeviceOption | None,
    ignore_node_name: bool = True,
    ignore_random_seed: bool = True,
) -> bool:
    if not opt1 or not opt2:
        return opt1 == opt2
    if not ignore_node_name and opt1.node_name != opt2.node_name:
        return False
    if not ignore_random_seed and opt1.random_seed != opt2.random_seed:
        return False
    if not opt1.device_type or not opt2.device_type:
        # at least one is CPU: equal only if both are
        return not opt1.device_type and not opt2.device_type
    return opt1.device_id == opt2.device_id


def InferBlobDevices(net: Net) -> dict[str, Any]:
    """Maps each blob an op of ``net`` writes to that op's device option."""
    mapping = {}
    for op in net.Proto().op:
        for b in op.output:
            mapping[b] = op.device_option
    return mapping


def InjectCrossDeviceCopies(
    net: Net,
    blob_to_device: Mapping[str, Any] | None = None,
    blob_remap: Mapping[str, str] | None = None,
    placeHolderOps: Sequence[str] | None = None,
) -> tuple[Net, dict[str, Any]]:
    """``(new_net, blob_to_device)``: a copy of ``net`` with the copies a
    blob needs to reach another device, and each blob's device after it.
    Every device here is the CPU, so no copy is ever needed: the ops are
    kept as they are (a non-CPU op is an ``InvalidArgumentError``, as when
    such a net is created). ``blob_to_device`` carries the devices of
    blobs made by earlier nets; ``blob_remap`` and ``placeHolderOps``
    (op types without a schema, such as send/receive markers) are accepted
    for Caffe2's signature."""
    devices = dict(blob_to_device or {})
    for op in net.Proto().op:
        if op.device_option.device_type != caffe2_pb2.CPU:
            raise errors.InvalidArgumentError(
                "op %s of net %r runs on device type %d: ferrocaffe runs on the CPU only"
                % (op.type, net.Name(), op.device_option.device_type),
                op=op.type,
            )
        for b in list(op.input) + list(op.output):
            devices[b] = op.device_option
    new_net = net.Clone(net.Name() + "_cross_device", keep_schema=True)
    return new_net, devices


# -------------------------------------------------------- blob references --


class BlobReference:
    """A blob name, optionally tied to the net that produces it.

    It compares and hashes like its name. ``ref.Relu([...])`` adds a Relu op
    to the ref's net with the ref as first input.
    """

    # Slots (and a ``meta`` dict made when first read): a net's op methods
    # return one reference per op, so each costs one object, not three, to
    # make and for the garbage collector to visit. ``__dict__`` keeps
    # arbitrary attributes working, as on Caffe2's class.
    __slots__ = ("_name", "_from_net", "_meta", "__dict__", "__weakref__")
    _name: str
    _from_net: Net | None
    _meta: dict[str, Any]

    def __init__(self, name: str | bytes, net: Net | None = None) -> None:
        # No name scope is added here; ScopedBlobReference does that.
        if type(name) is not str:
            name = (name.decode("utf-8") if isinstance(name, bytes)
                    else name if isinstance(name, str) else str(name))
        self._name = name
        self._from_net = net

    @property
    def meta(self) -> dict[str, Any]:
        """Free-form metadata that helpers may attach."""
        try:
            return self._meta
        except AttributeError:
            self._meta = {}
            return self._meta

    @meta.setter
    def meta(self, value: dict[str, Any]) -> None:
        self._meta = value

    def __getstate__(self):
        state = dict(getattr(self, "__dict__", ()))
        state["_name"] = self._name
        state["_from_net"] = self._from_net
        if hasattr(self, "_meta"):
            state["meta"] = self._meta
        return state

    def __setstate__(self, state):
        # (Also the plain __dict__ the class pickled before it had slots.)
        for key, value in state.items():
            setattr(self, key, value)

    def __hash__(self):
        return hash(self._name)

    def __eq__(self, other):
        if isinstance(other, str):
            return self._name == other
        if isinstance(other, bytes):
            return self._name == other.decode("utf-8")
        if isinstance(other, BlobReference):
            return self._name == other._name
        return False

    def __ne__(self, other):
        return not self == other

    def __str__(self):
        return self._name

    def __repr__(self):
        return 'BlobReference("{}")'.format(self._name)

    def __add__(self, other):
        if not isinstance(other, str):
            raise RuntimeError("Cannot add BlobReference to a non-string.")
        return BlobReference(self._name + other, self._from_net)

    def __radd__(self, other):
        if not isinstance(other, str):
            raise RuntimeError("Cannot add a non-string to BlobReference.")
        return BlobReference(other + self._name, self._from_net)

    def Net(self) -> Net | None:
        return self._from_net

    def GetNameScope(self) -> str:
        return self._name[: self._name.rfind(scope._NAMESCOPE_SEPARATOR) + 1]

    def GetUnscopedName(self) -> str:
        return self._name[self._name.rfind(scope._NAMESCOPE_SEPARATOR) + 1 :]

    def _CreateAndAddToNet(self, op_type, inputs=None, *args, **kwargs):
        inputs = [] if inputs is None else inputs
        if isinstance(inputs, (BlobReference, str)):
            inputs = [inputs]
        # a new list: the caller's list is left alone
        inputs = [self] + list(inputs)
        return self._from_net.__getattr__(op_type)(inputs, *args, **kwargs)

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        # Private names are never op types; refusing them also keeps copy and
        # pickle from recursing here before __init__ has run.
        if op_type.startswith("_"):
            raise AttributeError("Attribute {} not found.".format(op_type))
        if self._from_net is None:
            raise AttributeError(
                "You cannot use a blob reference that does not have a net "
                "source to create operators. Create the operator from an "
                "explicit net object."
            )
        if not IsOperator(op_type):
            raise _not_registered(op_type)
        return lambda *args, **kwargs: self._CreateAndAddToNet(op_type, *args, **kwargs)

    def __dir__(self):
        additional = [
            op for op in _registry() if "_ENGINE_" not in op or "_ENGINE_CUDNN" in op
        ]
        return sorted(set(chain(dir(type(self)), self.__dict__.keys(), additional)))


def ScopedName(name: str) -> str:
    """``name`` with the current name scope in front."""
    if isinstance(name, bytes):
        name = name.decode("ascii")
    return scope.CurrentNameScope() + name


def ScopedBlobReference(name: str, *args: Any, **kwargs: Any) -> BlobReference:
    """A BlobReference to ``ScopedName(name)``."""
    return BlobReference(ScopedName(name), *args, **kwargs)


def _RectifyInputOutput(blobs, net=None):
    """Normalises an op's inputs or outputs to a list of BlobReferences.
    Strings get the name scope; BlobReferences are kept as they are."""
    if type(blobs) is str:  # the common case first (every op has outputs)
        return [BlobReference(scope.CurrentNameScope() + blobs, net)]
    if isinstance(blobs, (bytes, str)):
        return [ScopedBlobReference(blobs, net=net)]
    if type(blobs) is BlobReference:
        return [blobs]
    if type(blobs) in (list, tuple):
        rectified = []
        for blob in blobs:
            if isinstance(blob, (bytes, str)):
                rectified.append(ScopedBlobReference(blob, net=net))
            elif type(blob) is BlobReference:
                rectified.append(blob)
            else:
                raise TypeError(
                    "I/O blob #{} of unsupported type: {} of type {}".format(
                        len(rectified), str(blob), type(blob)
                    )
                )
        return rectified
    raise TypeError(
        "Unknown input/output type: %s of type %s." % (str(blobs), type(blobs))
    )


def _get_blob_ref(blob_name_or_ref):
    # Caffe2 bug fixed: upstream tested the builtin `input` here, so a
    # BlobReference given to AddExternalInput came back without its net.
    if isinstance(blob_name_or_ref, BlobReference):
        return blob_name_or_ref
    return BlobReference(blob_name_or_ref)


# ---------------------------------------------------------- op creation --


def _is_float(v):
    return isinstance(v, (float, np.floating))


def _is_int(v):
    return isinstance(v, (int, np.integer, np.bool_))


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


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
    if isinstance(obj, (Net, Plan)):
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


# ------------------------------------------------------------------ nets --


def get_net_name(netlike: Net | caffe2_pb2.NetDef | str) -> str:
    if isinstance(netlike, Net):
        return netlike.Proto().name
    if isinstance(netlike, caffe2_pb2.NetDef):
        return netlike.name
    return netlike


def output_to_list(op_output: Any) -> list[Any]:
    """An op's return value (one ref or a tuple of refs) as a list."""
    assert type(op_output) in (list, tuple, BlobReference)
    return [op_output] if isinstance(op_output, BlobReference) else list(op_output)


def _add_net_to_dict(net_dict, net):
    name = get_net_name(net)
    if name in net_dict:
        assert net_dict[name] is None or net == net_dict[name], (
            "Different nets with same name: " + name
        )
        return False
    net_dict[name] = net if isinstance(net, Net) else None
    return True


def remap_input(op: caffe2_pb2.OperatorDef, blob_name_remapping: Mapping[str, str]) -> None:
    new_list = [blob_name_remapping.get(b, b) for b in op.input]
    del op.input[:]
    op.input.extend(new_list)


def _autogen_index(name, prefix):
    """k for a name ``<prefix><k>...``, else None."""
    digits = re.match(r"\d+", name[len(prefix):])
    return int(digits.group()) if digits else None


# The op methods Net.__getattr__ has made (``net.Add``), kept on the class:
# a later ``net.Add`` is then a plain method lookup, not a failed lookup
# (an AttributeError built and caught), a registry check and a new closure,
# which cost more than the rest of adding a small op. Forgotten whenever the
# registry is re-read, so that an op type no longer registered is refused.
_OP_METHODS = set()


_P = inspect.Parameter
_OP_SIGNATURE = inspect.Signature([
    _P("self", _P.POSITIONAL_OR_KEYWORD), _P("inputs", _P.POSITIONAL_OR_KEYWORD),
    _P("outputs", _P.POSITIONAL_OR_KEYWORD, default=None), _P("args", _P.VAR_KEYWORD)])


def _op_doc(op_type):
    """The doc of ``Net.<op_type>`` (what ``help(net.Add)`` shows): the
    registry's schema of the op, its input and output counts and its
    arguments."""
    schema = _core.operator_schema(op_type)
    head = (
        "Adds %s '%s' operator to the net and returns its outputs "
        "(BlobReferences): inputs and outputs are blob names or "
        "BlobReferences (outputs may be omitted, or a count), ``args`` the "
        "op's arguments.\n\n" % ("an" if op_type[:1] in "AEIOU" else "a", op_type))
    if schema is None:
        return head

    def count(lo, hi):
        if hi is None:
            return "%d or more" % lo
        return str(lo) if lo == hi else "%d to %d" % (lo, hi)

    lines = [head + (schema["doc"] or "").strip(), "",
             "Inputs: %s. Outputs: %s." % (
                 count(schema["min_inputs"], schema["max_inputs"]),
                 count(schema["min_outputs"], schema["max_outputs"]))]
    if schema["args"]:
        lines += ["", "Arguments:"]
        for name, ty, default, doc in schema["args"]:
            extra = ", required" if default == "required" else (
                ", default %s" % default if default not in (None, "") else "")
            lines.append("    %s (%s%s)%s" % (name, ty, extra, ": " + doc if doc else ""))
    return "\n".join(lines)


# What the op methods (``_core.OpMethod``, in rust/python/src/proto.rs) read
# from Python, made once when the first one is made.
_NET_OP_HELPERS: _core.NetOpHelpers | None = None


def _op_method(op_type):
    # net.Add(...) adds the common op in one call into the extension (the
    # inputs and outputs named, the arguments encoded, the op queued in
    # _pending as a serialised OperatorDef, exactly as _CreateAndAddToSelf
    # would); any other op goes through _CreateAndAddToSelf.
    global _NET_OP_HELPERS
    if _NET_OP_HELPERS is None:
        _NET_OP_HELPERS = _core.NetOpHelpers(
            BlobReference,
            _user_frame,
            _argument_bytes,
            scope._threadlocal_scope,
            scope.CurrentNameScope,
            _ENVIRON_DATA,
            _CAFFE2_DEBUG_KEY,
            _OPERATOR_FIELD_KEYWORDS | {"inputs", "outputs"},
            sys.modules,
            _PACKAGE_DIR,
        )
    call = _core.OpMethod(op_type, _NET_OP_HELPERS).call

    # A plain function around the fast method, so that help(net.Add) and
    # inspect show the op's schema and signature.
    def op_method(self, *args, **kwargs):
        return call(self, args, kwargs)

    op_method.__name__ = op_method.__qualname__ = op_type
    op_method.__doc__ = _op_doc(op_type)
    op_method.__signature__ = _OP_SIGNATURE
    if op_type not in Net.__dict__:
        setattr(Net, op_type, op_method)
        _OP_METHODS.add(op_type)
    return op_method


def _forget_op_methods():
    for op_type in list(_OP_METHODS):
        if Net.__dict__.get(op_type) is not None:
            delattr(Net, op_type)
    _OP_METHODS.clear()


class Net:
    """A network under construction: a NetDef plus naming state.

    ``net.Add([a, b], "c")`` adds an ``Add`` op; any registered operator type
    works as a method. Outputs may be omitted (one auto-named output), an int
    (that many auto-named outputs), or names/refs.
    """

    # process-wide: per base name asked for, where the search for a free
    # "<base>_<k>" resumes (every "<base>_<k>" below it is taken)
    _net_names_used_counters: dict[str, int] = {}
    _names_lock = threading.Lock()
    operator_registry_: dict[str, Any] = {}

    @staticmethod
    def current_prefix() -> str:
        # NetBuilder lives in a higher module; it can only be active if that
        # module has been imported, so look for it without importing it.
        net_builder = sys.modules.get("ferrocaffe.net_builder")
        if net_builder is None:
            return ""
        builder = net_builder.NetBuilder.current(required=False)
        return builder.name if builder else ""

    @staticmethod
    def _reset_used_names():
        with Net._names_lock:
            Net._net_names_used_counters = {}

    @staticmethod
    def _name_taken(name):
        """Whether a net of this process had ``name``: it was asked for as
        a base name, or it is ``<base>_<k>`` below its base's counter. (The
        memory this takes grows with the base names, not with the nets.)"""
        counters = Net._net_names_used_counters
        if name in counters:
            return True
        base, _, k = name.rpartition("_")
        return bool(base) and k.isdigit() and str(int(k)) == k and 0 < int(k) < counters.get(base, 0)

    @staticmethod
    def _get_next_net_name(basename):
        """``basename``, or ``<basename>_<k>`` for the smallest k free: a
        name no net of this process had (as in Caffe2 1.x; its later
        counter per base name could hand out "test_1" twice, once for the
        second "test" and once for a net named "test_1")."""
        basename = "/".join(x for x in [Net.current_prefix(), basename] if x)
        with Net._names_lock:
            idx = Net._net_names_used_counters.get(basename, 0)
            name = basename if idx == 0 else "{}_{}".format(basename, idx)
            while Net._name_taken(name):
                idx += 1
                name = "{}_{}".format(basename, idx)
            Net._net_names_used_counters[basename] = idx + 1
        return name

    def __init__(
        self,
        name_or_proto: str | caffe2_pb2.NetDef | Net | None,
        inplace: bool = False,
    ) -> None:
        """A new empty net named ``name_or_proto``, or a net over a copy of
        the NetDef ``name_or_proto`` (the NetDef itself if ``inplace``). The
        name is made unique either way."""
        self._input_record: Any = None  # schema records (schema sits above core)
        self._output_record: Any = None
        # names handed out by NextBlob, so that they are never reused
        self._registered_blob_names = set()
        self._recreate_lookup_tables = False
        self._op_outputs = set()
        self._external_input_map = set()
        self._attr_dict = defaultdict(list)
        # Ops made by the op methods, not yet in the NetDef (see _flush),
        # and where the user's code made each (see _user_frame).
        self._pending = []
        self._pending_sites = []
        # NetDef op index -> creation site, for PopulateProtoWithFileName.
        # Kept on the net (Caffe2's process-wide table grew forever).
        self._op_tracebacks = {}
        if isinstance(name_or_proto, caffe2_pb2.NetDef):
            proto = name_or_proto
            if inplace:
                self._net = proto
            else:
                self._net = caffe2_pb2.NetDef()
                self._net.CopyFrom(proto)
            self._external_input_map.update(self._net.external_input)
            existing_names = set()
            for op in self._net.op:
                existing_names.update(op.input)
                existing_names.update(op.output)
                self._op_outputs.update(op.output)
            # Resume automatic naming after the highest <name>_blob_<k>.
            # (Caffe2 bug fixed: it parsed a single digit of k.)
            prefix = self._net.name + "_blob_"
            indices = [
                k
                for k in (_autogen_index(s, prefix) for s in existing_names if s.startswith(prefix))
                if k is not None
            ]
            self._next_name_index = max(indices) + 1 if indices else 0
            name = self._proto.name
        else:
            name = name_or_proto
            if isinstance(name, str):
                name = _utf8(name, "net", net=repr(name))
            self._net = caffe2_pb2.NetDef()
            self._next_name_index = 0

        self._proto.name = Net._get_next_net_name(name)
        # cache of the next free _<k> suffix per NextName key
        self._next_blob_name_ids = {}

    # -- identity

    def Name(self) -> str:
        return self._proto.name

    def __str__(self):
        return self.Name()

    def __repr__(self):
        n = len(self.Proto().op)
        return "<Net %r: %d op%s>" % (self.Name(), n, "" if n == 1 else "s")

    def Proto(self) -> caffe2_pb2.NetDef:
        """The live NetDef. Callers may edit it, so the lookup tables are
        rebuilt on next use."""
        self._InvalidateLookupTables()
        return self._net

    # The NetDef lives in _proto. The op methods do not build a protobuf
    # message per op (that cost several microseconds an op, most of a large
    # net's build time): they queue the op's fields in _pending, and the
    # first read of _net (Proto(), a lookup, pickling) serialises the queue
    # in one call into the runtime and merges it into the NetDef, which
    # protobuf parses in C. Code that needs only the name or the external
    # lists reads _proto and does not flush.

    @property
    def _net(self):
        if self._pending:
            self._flush()
        return self._proto

    @_net.setter
    def _net(self, proto):
        self._proto = proto

    def _flush(self):
        # Emptied in place: a shallow copy of the net shares the queue, as
        # it shares the NetDef.
        # The creation sites get their op indices here, not per op (the
        # length of the NetDef's op list costs as much as half an op).
        base = len(self._proto.op)
        data = _core.encode_net_ops(self._pending)
        del self._pending[:]
        self._proto.MergeFromString(data)
        sites = self._pending_sites
        self._op_tracebacks.update(zip(range(base, base + len(sites)), sites))
        del sites[:]

    # -- attributes (opaque hooks used by task.py)

    def add_attribute(self, name: str, obj: Any) -> None:
        """Appends ``obj`` to this net's attribute list ``name``."""
        self._attr_dict[name].append(obj)

    def get_attributes(self, name: str) -> list[Any]:
        """The attribute list ``name`` (``[]`` if there is none)."""
        return self._attr_dict.get(name, [])

    # -- blob lookups

    def BlobIsDefined(self, blob: str | BlobReference) -> bool:
        """True if an op of this net writes ``blob`` or it is an external input."""
        if self._recreate_lookup_tables:
            self._RecreateLookupTables()
        name = str(blob)
        return name in self._op_outputs or name in self._external_input_map

    def UsesBlob(self, blob: str | BlobReference) -> bool:
        """True if an op of this net reads ``blob`` or it is an external input."""
        if self._recreate_lookup_tables:
            self._RecreateLookupTables()
        blob_name = str(blob)
        for op in self._net.op:
            if blob_name in op.input:
                return True
        return blob_name in self._external_input_map

    def UsedBlobNames(self) -> set[str]:
        """Every blob name an op reads or writes, plus the external lists."""
        blob_names = set()
        for op in self._net.op:
            blob_names |= set(op.input)
            blob_names |= set(op.output)
        blob_names |= set(self._net.external_input)
        blob_names |= set(self._net.external_output)
        return blob_names

    def GetBlobRef(self, blob_name: str | BlobReference) -> BlobReference:
        """A reference to a blob this net defines; KeyError otherwise."""
        blob_name = str(blob_name)
        if not self.BlobIsDefined(blob_name):
            raise KeyError("Net does not define blob %s" % blob_name)
        return BlobReference(blob_name, self)

    def is_external_input(self, blob: str | BlobReference) -> bool:
        if self._recreate_lookup_tables:
            self._RecreateLookupTables()
        return str(blob) in self._external_input_map

    # -- automatic names

    def NextScopedBlob(self, prefix: str = "unnamed") -> BlobReference:
        """NextBlob of the name-scoped ``prefix``."""
        return self.NextBlob(ScopedName(prefix))

    def NextBlob(self, prefix: str = "unnamed") -> BlobReference:
        """A blob name not defined in this net nor handed out before:
        ``prefix`` itself, else ``prefix_auto_<i>``."""
        output_blob_base = BlobReference(prefix)
        output_blob = output_blob_base
        index = 0
        while str(output_blob) in self._registered_blob_names or self.BlobIsDefined(output_blob):
            output_blob = output_blob_base + "_auto_" + str(index)
            index += 1
        self._registered_blob_names.add(str(output_blob))
        return output_blob

    def NextName(self, prefix: str | None = None, output_id: int | None = None) -> str:
        """An automatic blob name: ``<net>/<prefix>[:<output_id>]``, with a
        ``_<k>`` suffix (k from 2) when the name-scoped form is already
        defined, or ``<net>_blob_<n>`` without a prefix. No scope is added."""
        if prefix:
            output_name_base = self._proto.name + "/" + prefix
            output_name = output_name_base
            if output_id is not None:
                output_name += ":" + str(output_id)
            key = output_name
            index = self._next_blob_name_ids.get(key, 2)
            while self.BlobIsDefined(str(ScopedBlobReference(output_name))):
                output_name = output_name_base + "_" + str(index)
                if output_id is not None:
                    output_name += ":" + str(output_id)
                index += 1
                self._next_blob_name_ids[key] = index
        else:
            output_name = self._proto.name + "_blob_" + str(self._next_name_index)
            self._next_name_index += 1
        return str(output_name)

    # -- lookup tables

    def PopulateProtoWithFileName(self) -> None:
        """Names every op this net created through its op methods after the
        line of user code that created it: ``'<file>:<line>:<function>'``."""
        ops = self._net.op  # the queued ops first: they get their indices
        for index, frame in getattr(self, "_op_tracebacks", {}).items():
            if frame is not None and index < len(ops):
                ops[index].name = ":".join(map(str, _frame_location(*frame)))

    def __getstate__(self):
        # Code objects do not pickle: keep the creation sites as locations.
        self._net  # the queued ops go into the NetDef first
        state = dict(self.__dict__)
        if "_op_tracebacks" in state:
            state["_op_tracebacks"] = {
                i: None if f is None else _frame_location(*f) for i, f in state["_op_tracebacks"].items()
            }
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        # (A net pickled before creation sites were queued with the ops.)
        self.__dict__.setdefault("_pending_sites", [])
        self.__dict__.setdefault("_op_tracebacks", {})

    def _ExtendOps(self, new_ops):
        self._net.op.extend(new_ops)
        for op in new_ops:
            self._op_outputs.update([str(o) for o in op.output])

    def extend_ops(self, new_ops: Sequence[caffe2_pb2.OperatorDef]) -> None:
        return self._ExtendOps(new_ops)

    def _CheckLookupTables(self):
        """Asserts the lookup tables cover the proto (for tests)."""
        outputs = {o for op in self._net.op for o in op.output}
        inputs = set(self._net.external_input)
        assert outputs.difference(self._op_outputs) == set()
        assert inputs.difference(self._external_input_map) == set()

    def _InvalidateLookupTables(self):
        self._recreate_lookup_tables = True

    def _RecreateLookupTables(self):
        self._op_outputs = {o for op in self._net.op for o in op.output}
        self._external_input_map = set(self._net.external_input)
        self._recreate_lookup_tables = False

    # -- external inputs and outputs

    def AddExternalInput(self, *inputs: Any) -> Any:
        """Declares external inputs. Returns one ref, or a list of refs."""
        assert len(inputs) > 0
        if self._recreate_lookup_tables:
            self._RecreateLookupTables()
        input_name_set = set()
        for input in inputs:
            input_name = str(input)
            assert (
                input_name not in self._external_input_map
                and input_name not in input_name_set
            ), "Net already contains an input named %s" % input_name
            input_name_set.add(input_name)
        refs = []
        for input in inputs:
            input_name = str(input)
            self._proto.external_input.extend([input_name])
            self._external_input_map.update([input_name])
            refs.append(_get_blob_ref(input))
        return refs[0] if len(refs) == 1 else refs

    def AddExternalOutput(self, *outputs: Any) -> None:
        """Declares external outputs: BlobReferences this net defines."""
        for output in outputs:
            assert isinstance(output, BlobReference)
            assert self.BlobIsDefined(output), "{} is not defined".format(output)
        for output in outputs:
            self.Proto().external_output.extend([str(output)])

    def AddExternalInputs(self, *inputs: Any) -> Any:
        return self.AddExternalInput(*inputs)

    def AddExternalOutputs(self, *outputs: Any) -> None:
        self.AddExternalOutput(*outputs)

    def AddScopedExternalInputs(self, *inputs: Any) -> Any:
        res = self.AddExternalInput(*[ScopedBlobReference(b) for b in inputs])
        if not isinstance(res, list):
            res = [res]
        return res

    def AddScopedExternalOutputs(self, *outputs: Any) -> None:
        return self.AddExternalOutput(*[ScopedBlobReference(b) for b in outputs])

    @property
    def external_inputs(self) -> list[BlobReference]:
        return [_get_blob_ref(x) for x in self._proto.external_input]

    @property
    def external_outputs(self) -> list[BlobReference]:
        return [_get_blob_ref(x) for x in self._proto.external_output]

    # -- records (schema lives in a higher module, imported on use)

    def input_record(self) -> Any:
        return self._input_record

    def output_record(self) -> Any:
        return self._output_record

    def set_input_record(self, input_record: Any) -> Any:
        assert self._input_record is None or (
            input_record.has_blobs()
            and set(input_record.field_blobs()) == set(self._input_record.field_blobs())
        ), "Input schema cannot be reset"
        if not input_record.has_blobs():
            with NameScope(self.Name()):
                # schema builds on core: the record makes its own blobs
                self._input_record = input_record._new_record(self)
        else:
            self._input_record = input_record
        for blob in self._input_record.field_blobs():
            if not self.is_external_input(blob):
                self.AddExternalInput(blob)
        return self._input_record

    def set_output_record(self, record: Any) -> None:
        assert self._output_record is None or (
            record.has_blobs()
            and set(record.field_blobs()) == set(self._output_record.field_blobs())
        ), "Output schema cannot be reset"
        for blob in record.field_blobs():
            assert self.BlobIsDefined(blob), "{} is not defined in net {}".format(
                blob, self.Proto()
            )
        for blob in record.field_blobs():
            if blob not in self.external_outputs:
                self.AddExternalOutput(blob)
        self._output_record = record

    # -- whole-net operations

    def AddArgument(self, arg_name: str, arg_value: Any) -> None:
        self._net.arg.extend([_MakeArgument(arg_name, arg_value)])

    def set_rand_seed(
        self,
        seed: int = 100,
        sequence_seed: bool = True,
        seed_on_op_def: bool = False,
    ) -> None:
        """Sets a random seed on every op: ``seed + i`` for op i by default."""
        assert not (sequence_seed and seed_on_op_def), (
            "sequence_seed and seed_on_op_def cannot be both set to True."
        )
        for i, op in enumerate(self.Proto().op):
            if sequence_seed:
                curr_seed = seed + i
            elif seed_on_op_def:
                curr_seed = hash(str(op) + str(seed)) % np.iinfo(np.uint32).max
            else:
                curr_seed = seed
            op.device_option.random_seed = curr_seed

    def AppendNet(
        self,
        net: Net | caffe2_pb2.NetDef,
        device_option: caffe2_pb2.DeviceOption | None = None,
    ) -> Net:
        """Appends ``net``'s ops (copies carrying ``device_option`` if given)
        and merges its external lists. Returns self."""
        assert isinstance(net, Net)
        if self._recreate_lookup_tables:
            self._RecreateLookupTables()
        for i in net.Proto().external_input:
            if i not in self.Proto().external_input and i not in self._op_outputs:
                self.Proto().external_input.append(i)
        self.Proto().external_output.extend(
            [o for o in net.Proto().external_output if o not in self.Proto().external_output]
        )
        ops = net.Proto().op
        if device_option is not None:
            ops = [op.__deepcopy__() for op in ops]
            for op in ops:
                op.device_option.CopyFrom(device_option)
        self._ExtendOps(ops)
        return self

    def Clone(
        self,
        name: str,
        blob_remap: Mapping[str, str] | None = None,
        op_id_mask: Sequence[int] | None = None,
        remap_funcs: Mapping[str, Callable[..., Any]] | None = None,
        keep_schema: bool = True,
        update_external_list: bool = False,
    ) -> Net:
        """A copy of this net named ``name`` (made unique).

        ``blob_remap`` renames blobs (inputs, outputs, external lists);
        ``op_id_mask`` keeps only the listed ops, in that order;
        ``remap_funcs`` maps op types to ``f(op, prefix, blob_remap)`` for ops
        that hold blob names elsewhere. ``update_external_list`` recomputes
        the external lists from the kept ops.
        """
        # Caffe2's default: the nets an If or While op holds are renamed too.
        remap_funcs = dict(DEFAULT_REMAP_FUNCS if remap_funcs is None else remap_funcs)
        proto = self._net
        new_proto = caffe2_pb2.NetDef()
        new_proto.CopyFrom(proto)
        new_proto.name = name

        if blob_remap is None:
            blob_remap = {}
        if op_id_mask is None:
            op_id_mask = list(range(0, len(proto.op)))

        def get_remapped_str(blob):
            blob_str = str(blob)
            return str(blob_remap.get(blob_str, blob_str))

        def remap_list(proto_list):
            new_list = [get_remapped_str(b) for b in proto_list]
            del proto_list[:]
            proto_list.extend(new_list)

        def remap_op(op):
            new_op = caffe2_pb2.OperatorDef()
            new_op.CopyFrom(op)
            remap_list(new_op.input)
            remap_list(new_op.output)
            if new_op.type in remap_funcs:
                remap_funcs[new_op.type](new_op, (name + "/") if name else "", blob_remap)
            return new_op

        del new_proto.op[:]
        new_proto.op.extend([remap_op(proto.op[op_id]) for op_id in op_id_mask])
        remap_list(new_proto.external_input)
        remap_list(new_proto.external_output)
        new_net = Net(new_proto)

        if keep_schema and (self._input_record or self._output_record):
            # schema builds on core: the records copy themselves
            if self._input_record:
                new_net._input_record = self._input_record._with_blobs(
                    [
                        BlobReference(get_remapped_str(blob), net=new_net)
                        for blob in self._input_record.field_blobs()
                    ],
                )
            if self._output_record:
                new_net._output_record = self._output_record._with_blobs(
                    [
                        BlobReference(get_remapped_str(blob), net=new_net)
                        for blob in self._output_record.field_blobs()
                    ],
                )

        # Caffe2 bug fixed: the attribute lists were shared with the original.
        for key, attrs in self._attr_dict.items():
            new_net._attr_dict[key] = list(attrs)

        if update_external_list:
            existing_outputs = set()
            used_outputs = set()
            del new_net.Proto().external_input[:]
            del new_net.Proto().external_output[:]
            for op in new_net.Proto().op:
                for ib in op.input:
                    if ib not in existing_outputs:
                        new_net.Proto().external_input.extend([ib])
                    else:
                        used_outputs.add(ib)
                for ob in op.output:
                    existing_outputs.add(ob)
            for ob in existing_outputs:
                if ob not in used_outputs:
                    new_net.Proto().external_output.extend([ob])
        return new_net

    def ClonePartial(
        self,
        name: str,
        inputs: Mapping[Any, Any] | Sequence[Any],
        outputs: Sequence[Any],
        remap_funcs: Mapping[str, Callable[..., Any]] | None = None,
    ) -> tuple[Net, list[BlobReference]]:
        """A net named ``name`` holding only the ops needed to compute
        ``outputs`` from ``inputs``, and references to its outputs.

        ``inputs`` is a dict (or a list of pairs) from blobs of this net to
        the names they take in the clone, or a list of blobs keeping their
        names; each means the blob's last value in this net. Blobs the kept
        ops read that nothing kept writes (and that are not inputs) keep
        their names and become external inputs; every other blob is renamed
        ``name/<blob>``. An input that a kept op would have to compute is an
        ``AssertionError``, as in Caffe2.
        """
        if isinstance(inputs, Mapping):
            input_map = {str(k): str(v) for k, v in inputs.items()}
        elif all(isinstance(i, tuple) and len(i) == 2 for i in inputs):
            input_map = {str(k): str(v) for k, v in inputs}
        else:
            input_map = {str(i): str(i) for i in inputs}
        output_names = [str(o) for o in outputs]
        for o in output_names:
            assert self.BlobIsDefined(o), "{} is not defined".format(o)
        ops = list(self._net.op)
        # Each blob version is (name, n): n counts the writes before it.
        version: dict[str, int] = {}
        reads, writer = [], {}
        for i, op in enumerate(ops):
            reads.append([(b, version.get(b, 0)) for b in op.input])
            for b in op.output:
                version[b] = version.get(b, 0) + 1
                writer[(b, version[b])] = i
        given = {(b, version.get(b, 0)) for b in input_map}

        def needed(targets, stop):
            seen, todo = set(), list(targets)
            while todo:
                v = todo.pop()
                if v in stop or v not in writer or writer[v] in seen:
                    continue
                seen.add(writer[v])
                todo.extend(reads[writer[v]])
            return seen

        used = needed([(o, version.get(o, 0)) for o in output_names], given)
        assert not used & needed(given, set()), (
            "Cannot partially clone net: some of the ops required would generate the given input."
        )
        kept = sorted(used)
        produced = {(b, v) for (b, v), i in writer.items() if i in used}
        undefined = []
        for i in kept:
            for v in reads[i]:
                if v not in produced and v not in given and v[0] not in undefined:
                    undefined.append(v[0])
        prefix = (name + "/") if name else ""
        every = set(version) | {b for r in reads for b, _ in r} | set(self._net.external_input)
        mapping = {
            b: input_map[b] if b in input_map else b if b in undefined else prefix + b
            for b in every
        }
        new_net = self.Clone(name, mapping, kept, remap_funcs)
        new_in = [mapping[b] for b in input_map] + undefined
        new_out = [mapping[o] for o in output_names]
        proto = new_net.Proto()
        del proto.external_input[:]
        proto.external_input.extend(new_in)
        new_net._external_input_map = set(new_in)
        del proto.external_output[:]
        proto.external_output.extend(new_out)
        return new_net, [new_net.GetBlobRef(o) for o in new_out]

    def reroute_tensor(
        self,
        tensor: str | BlobReference,
        new_producer: caffe2_pb2.OperatorDef,
        can_modify: Sequence[caffe2_pb2.OperatorDef] | None = None,
    ) -> int:
        """Puts ``new_producer`` (an op reading ``tensor``) right after the op
        that writes ``tensor`` (first, if it is an external input), and makes
        the ops equal to one in ``can_modify`` read the new op's first output
        instead of ``tensor``. Returns how many ops were changed."""
        name = str(tensor)
        ops = list(self._net.op)
        if name in self._external_input_map:
            at = 0
        else:
            writers = [i for i, op in enumerate(ops) if name in op.output]
            if not writers:
                raise errors.BlobNotFoundError(
                    "net %r has no op that writes %r and it is not an external input" % (self.Name(), name),
                    blob=name,
                )
            at = writers[-1] + 1
        new_name = new_producer.output[0]
        changed = 0
        modifiable = list(can_modify or [])
        for op in ops:
            if op in modifiable:
                remap_input(op, {name: new_name})
                changed += 1
        producer = caffe2_pb2.OperatorDef()
        producer.CopyFrom(new_producer)
        ops.insert(at, producer)
        proto = self._net
        del proto.op[:]
        proto.op.extend(ops)
        self._InvalidateLookupTables()
        return changed

    # -- convenience ops

    def Const(
        self,
        array: Any,
        blob_out: str | BlobReference | None = None,
        dtype: Any = None,
    ) -> BlobReference:
        """A constant: a Python bool becomes a 0-dim BOOL ConstantFill;
        anything else goes through ``np.array(array, dtype)`` and a
        GivenTensor*Fill chosen by the resulting dtype."""
        if isinstance(array, bool):
            return self.ConstantFill([], blob_out or 1, dtype=DataType.BOOL, value=array)

        array = np.array(array) if dtype is None else np.array(array, dtype=dtype)
        kind, size = array.dtype.kind, array.dtype.itemsize
        values = array.flatten().tolist()
        # Caffe2 bug fixed: strings and bools were detected by dtype
        # comparisons that depend on the numpy version; use dtype.kind.
        if kind == "i" and size == 4:
            operator = self.GivenTensorIntFill
        elif kind == "i" and size == 8:
            operator = self.GivenTensorInt64Fill
        elif kind in ("U", "S"):
            operator = self.GivenTensorStringFill
        elif kind == "b":
            operator = self.GivenTensorBoolFill
        else:
            operator = self.GivenTensorFill
            values = [float(v) for v in values]
        return operator([], blob_out or 1, shape=array.shape, values=values)

    def LogInfo(self, *msg_or_blobs: Any) -> None:
        """Prints each item when the net runs: blobs as they are, anything
        else as a string constant."""
        for msg_or_blob in msg_or_blobs:
            if not isinstance(msg_or_blob, BlobReference):
                blob = self.GivenTensorStringFill(
                    [], self.NextName("log"), shape=[], values=[msg_or_blob]
                )
            else:
                blob = msg_or_blob
            self.Print(blob, [])

    def AddGradientOperators(self, ys: Any, skip: int = 0) -> dict[BlobReference, Any]:
        """Appends the backward pass of ``ys`` (a list of losses, or a dict
        giving some of their gradients) through this net's ops after the
        first ``skip``; returns {blob: its gradient} (gradients.py)."""
        grad_ops, input_to_grad = GradientRegistry.GetBackwardPass(self._net.op[skip:], ys)
        self._ExtendOps(grad_ops)
        return input_to_grad

    def Python(
        self,
        f: Any,
        grad_f: Any = None,
        python_func_type: Any = None,
        pass_workspace: bool = False,
        grad_output_indices: Sequence[int] | None = None,
        grad_input_indices: Sequence[int] | None = None,
    ) -> Callable[..., Any]:
        """Returns ``op(inputs, outputs, **kwargs)`` that adds a ``Python`` op.

        ``f`` is a callable ``f(inputs, outputs)`` (``f(inputs, outputs,
        workspace)`` with ``pass_workspace``), registered process-wide under
        a token; or a tuple ``(builder, args, kwargs)``, pickled into the op,
        so that ``builder(*args, **kwargs)`` makes the callable once per op
        instance (in each workspace, on each node). ``grad_f`` (a callable,
        or a builder tuple when ``f`` is one) is what the op's gradient, a
        ``PythonGradient`` op, calls with inputs ``[inputs..., outputs...,
        output gradients...]`` and outputs ``[input gradients...]``, narrowed
        by ``grad_output_indices`` and ``grad_input_indices``.
        """
        assert IsOperator("Python")

        def make_builder(t):
            if not isinstance(t, tuple):
                return ""
            assert len(t) == 3, "Expected builder tuple (func, args, kwargs)"
            func, args, kwargs = t
            return pickle.dumps((func, tuple(args), dict(kwargs)))

        from ferrocaffe import _python_ops

        f_builder = make_builder(f)
        if f_builder:
            # Made here from the caller's own objects: safe to unpickle when
            # the op is built (builders from anywhere else are not).
            _python_ops.trust(f_builder)
        grad_f_builder = make_builder(grad_f)
        assert (not grad_f) or ((not f_builder) == (not grad_f_builder)), (
            "A tuple has to be passed to both f and grad_f or neither."
        )
        core_kwargs = {}
        if f_builder:
            core_kwargs["pickled_builder"] = f_builder
            core_kwargs["pass_workspace"] = pass_workspace
            if grad_f_builder:
                _python_ops.trust(grad_f_builder)
                core_kwargs["pickled_grad_builder"] = grad_f_builder
        else:
            core_kwargs["token"] = _RegisterPythonImpl(
                f, grad_f, python_func_type, pass_workspace=pass_workspace
            )

        grad_output_indices = grad_output_indices or []
        grad_input_indices = grad_input_indices or []
        return lambda *args, **kwargs: self._CreateAndAddToSelf(
            "Python",
            grad_output_indices=grad_output_indices,
            grad_input_indices=grad_input_indices,
            *args,
            **dict(chain(kwargs.items(), core_kwargs.items()))
        )

    # -- op creation by attribute

    def _CreateAndAddToSelf(self, op_type, inputs, outputs=None, **kwargs):
        inputs = _RectifyInputOutput(inputs)
        if self._recreate_lookup_tables:
            self._RecreateLookupTables()
        for input in inputs:
            # BlobIsDefined, inlined: this runs for every input of every op.
            name = input._name
            if name not in self._op_outputs and name not in self._external_input_map:
                assert input.Net() != self
                self.AddExternalInput(input)
        if outputs is None:
            # one output, named automatically
            outputs = self.NextName(prefix=op_type)
        elif type(outputs) is int:
            outputs = [self.NextName(prefix=op_type, output_id=i) for i in range(outputs)]
        # A single name becomes a reference made here, for this net: it can
        # be returned as it is (no second BlobReference per op).
        single_name = type(outputs) is str
        outputs = _RectifyInputOutput(outputs, net=self)
        if (
            _OPERATOR_FIELD_KEYWORDS.isdisjoint(kwargs)
            and scope.CurrentDeviceScope() is None
            and not _caffe2_debug()
            and not getattr(sys.modules.get("ferrocaffe.workspace"), "_immediate_mode", False)
        ):
            # The common op: queued as its fields and serialised Arguments
            # (see _flush), with what CreateOperator would check.
            args = []
            for key, value in kwargs.items():
                if value is not None:
                    args.append(_argument_bytes(key, value, op_type))
            input_names = _blob_names(inputs)
            output_names = _blob_names(outputs)
            self._pending.append((op_type, input_names, output_names, args))
            # Where the user's code made the op: its index is known when
            # the queue is flushed.
            self._pending_sites.append(_user_frame())
            self._op_outputs.update(output_names)
        else:
            op = CreateOperator(op_type, inputs, outputs, **kwargs)
            self._ExtendOps([op])
            output_names = op.output
            self._op_tracebacks[len(self._proto.op) - 1] = _user_frame()
        if len(output_names) == 0:
            return None
        if len(output_names) == 1:
            return outputs[0] if single_name else BlobReference(output_names[0], self)
        return tuple(BlobReference(o, self) for o in output_names)

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        # Private names are never op types (and refusing them keeps copy and
        # pickle from recursing here before __init__ has run).
        if op_type.startswith("_"):
            raise AttributeError("Attribute {} not found.".format(op_type))
        if not IsOperator(op_type) and not IsOperatorWithEngine(op_type, "CUDNN"):
            raise _not_registered(op_type)
        return _op_method(op_type).__get__(self, type(self))

    def __dir__(self):
        additional = [op for op in _registry() if "_ENGINE_" not in op]
        return sorted(set(chain(dir(type(self)), self.__dict__.keys(), additional)))


# ------------------------------------------------------- execution steps --


#: How many levels of substeps a step may have below it: a PlanDef holding
#: it is then at most protobuf's MAX_NESTING levels deep.
_MAX_STEP_DEPTH = MAX_NESTING - 1


def _step_depth(step_proto):
    """Levels of substeps below an ExecutionStep proto (iterative)."""
    depth, level = 0, list(step_proto.substep)
    while level:
        depth += 1
        level = [sub for s in level for sub in s.substep]
    return depth


class ExecutionStep:
    """A step of a plan: nets to run, or substeps, with iteration rules.

    A step becomes immutable once added to a plan or another step.
    """

    _step_names_used: set[str] = set()
    _names_lock = threading.Lock()

    @staticmethod
    def _get_next_step_name(basename):
        with ExecutionStep._names_lock:
            name = basename
            next_idx = 1
            while name in ExecutionStep._step_names_used:
                name = basename + "_" + str(next_idx)
                next_idx += 1
            ExecutionStep._step_names_used.add(name)
        return name

    def __init__(
        self,
        name: str | bytes | None,
        nets: Net | Sequence[Net] | None = None,
        num_iter: int | None = None,
    ) -> None:
        self._step = caffe2_pb2.ExecutionStep()
        if isinstance(name, str):
            name = _utf8(name, "step", step=repr(name))
        self._step.name = name or ExecutionStep._get_next_step_name("step")
        self._net_dict = OrderedDict()
        self._is_used = False
        self._substeps = []
        self._depth = 0  # levels of substeps below this step
        if nets is not None:
            if isinstance(nets, Net):
                nets = [nets]
            for net in nets:
                if _add_net_to_dict(self._net_dict, net):
                    self._step.network.extend([get_net_name(net)])
        if num_iter is not None:
            self._set("num_iter", num_iter)

    def _set(self, field, value):
        """Sets a field of the step's proto; a value the field cannot hold
        (an int out of its range) is an error naming the step."""
        try:
            setattr(self._step, field, value)
        except (TypeError, ValueError) as e:  # protobuf's checks of the value
            name = self._step.name
            cls = errors.DataTypeError if isinstance(e, TypeError) else errors.InvalidArgumentError
            raise cls(f"step '{name}', field {field}: {e}", step=name) from None

    def get_net(self, name: str) -> Net:
        return self._net_dict[name]

    def _as_plan(self):
        # workspace.RunPlan(step) asks the step: workspace sits below core.
        return Plan(self)

    def Name(self) -> str:
        return self._step.name

    def __str__(self):
        return self._step.name

    def __repr__(self):
        step = self._step
        fields = [
            "%s=%r" % (f.name, v) for f, v in step.ListFields()
            if f.name not in ("name", "substep", "network")
        ]
        fields.append("%d net%s" % (len(step.network), "" if len(step.network) == 1 else "s"))
        fields.append("%d substep%s" % (len(step.substep), "" if len(step.substep) == 1 else "s"))
        return "<ExecutionStep %r: %s>" % (step.name, ", ".join(fields))

    def _assert_can_mutate(self):
        assert not self._is_used, (
            "Cannot mutate a step that has already been added to a plan/step."
        )

    def _notify_is_used(self):
        self._is_used = True

    def Proto(self) -> caffe2_pb2.ExecutionStep:
        return self._step

    def HasNets(self) -> bool:
        return len(self._step.network) > 0

    def HasSubsteps(self) -> bool:
        return len(self._step.substep) > 0

    def Nets(self) -> list[Net]:
        return list(self._net_dict.values())

    def Substeps(self) -> list[ExecutionStep]:
        return self._substeps

    def SetIter(self, num_iter: int) -> None:
        self._assert_can_mutate()
        self._set("num_iter", num_iter)

    def SetCreateWorkspace(self, create_workspace: bool) -> None:
        self._assert_can_mutate()
        self._set("create_workspace", create_workspace)

    def SetNumConcurrentInstances(self, num_concurrent_instances: int) -> None:
        self._assert_can_mutate()
        self._set("num_concurrent_instances", num_concurrent_instances)

    def SetOnlyOnce(self, only_once: bool) -> None:
        self._assert_can_mutate()
        self._set("only_once", only_once)

    def SetShouldStopBlob(self, should_stop_blob: str | BlobReference) -> None:
        assert isinstance(should_stop_blob, BlobReference), (
            "expects BlobReference here, got {}".format(type(should_stop_blob))
        )
        self._assert_can_mutate()
        self._step.should_stop_blob = str(should_stop_blob)

    def RunEveryMillis(self, interval: int) -> None:
        """Runs this step every ``interval`` ms while its sibling substeps
        run, and once more after they finish. Ignored for a top-level step."""
        # Caffe2 bug fixed: upstream skipped the mutability check here.
        self._assert_can_mutate()
        self._set("run_every_ms", interval)

    def SetReportNet(self, report_net: Net, report_interval: int) -> None:
        """Deprecated: use RunEveryMillis."""
        self._assert_can_mutate()
        _add_net_to_dict(self._net_dict, report_net)
        self._step.report_net = get_net_name(report_net)
        self._set("report_interval", report_interval)

    def AddSubstep(self, substep: ExecutionStep) -> ExecutionStep:
        """Adds a step (or ExecutionStep proto) as a substep; an empty step
        is dropped. Returns self."""
        self._assert_can_mutate()
        assert not self.HasNets(), "Cannot have both network and substeps."
        if substep is self:
            # Caffe2 recursed forever walking such a step.
            raise errors.InvalidPlanError(
                f"step '{self.Name()}' cannot be a substep of itself", step=self.Name())
        if isinstance(substep, ExecutionStep):
            if not substep.HasNets() and not substep.HasSubsteps():
                substep._notify_is_used()
                return self
            proto, sub_depth = substep.Proto(), substep._depth
        else:
            proto, sub_depth = substep, _step_depth(substep)
        depth = max(self._depth, sub_depth + 1)
        if depth > _MAX_STEP_DEPTH:
            # Protobuf (and the runtime's decoder) stop at 100 levels of
            # messages; a PlanDef holding this step would be refused.
            raise errors.InvalidPlanError(
                f"cannot add step '{proto.name}' to step '{self.Name()}': steps may nest at "
                f"most {_MAX_STEP_DEPTH} levels deep (protobuf's limit of "
                f"{MAX_NESTING} levels of messages, inside a plan)",
                step=self.Name())
        if isinstance(substep, ExecutionStep):
            substep._notify_is_used()
            for net in substep.Nets():
                _add_net_to_dict(self._net_dict, net)
            self._substeps.append(substep)
        self._step.substep.add().CopyFrom(proto)
        self._depth = depth
        return self

    def SetConcurrentSubsteps(self, concurrent_substeps: bool) -> None:
        self._assert_can_mutate()
        assert not self.HasNets(), "Cannot have both network and substeps."
        self._step.concurrent_substeps = concurrent_substeps

    def AddNet(self, net: Net) -> ExecutionStep:
        """Adds a net to run (a net added twice runs twice). Returns self."""
        self._assert_can_mutate()
        assert not self.HasSubsteps(), "Cannot have both network and substeps."
        assert isinstance(net, Net)
        _add_net_to_dict(self._net_dict, net)
        self._step.network.extend([get_net_name(net)])
        return self

    def get_all_attributes(self, name: str) -> list[Any]:
        """The attributes ``name`` of every net this step (and its substeps) uses."""
        return [attr for net in self._net_dict.values() for attr in net.get_attributes(name)]

    @classmethod
    def create_from_proto(
        cls,
        step_proto: caffe2_pb2.ExecutionStep,
        net_obj_dict: dict[str, Net],
        net_proto_dict: Mapping[str, caffe2_pb2.NetDef],
    ) -> ExecutionStep:
        """Rebuilds a step (recursively) from its proto. Nets come from
        ``net_obj_dict`` by name, else are created from ``net_proto_dict``."""
        assert isinstance(step_proto, caffe2_pb2.ExecutionStep)
        assert (len(step_proto.network) > 0 and len(step_proto.substep) == 0) or (
            len(step_proto.network) == 0 and len(step_proto.substep) > 0
        )

        steps_or_nets: list[Any] = []
        if len(step_proto.substep) > 0:
            for substep_proto in step_proto.substep:
                steps_or_nets.append(
                    ExecutionStep.create_from_proto(substep_proto, net_obj_dict, net_proto_dict)
                )
        else:
            for net_name in step_proto.network:
                if net_name not in net_obj_dict:
                    assert net_name in net_proto_dict
                    net_obj_dict[net_name] = Net(net_proto_dict[net_name])
                net = net_obj_dict[net_name]
                assert isinstance(net, Net)
                steps_or_nets.append(net)

        def field(name, convert=None):
            if not step_proto.HasField(name):
                return None
            value = getattr(step_proto, name)
            return convert(value) if convert else value

        return execution_step(
            step_proto.name,
            steps_or_nets,
            num_iter=field("num_iter"),
            report_net=None,
            report_interval=None,
            concurrent_substeps=field("concurrent_substeps"),
            should_stop_blob=field("should_stop_blob", BlobReference),
            only_once=field("only_once"),
            num_concurrent_instances=field("num_concurrent_instances"),
            create_workspace=field("create_workspace"),
            run_every_ms=field("run_every_ms"),
        )


def add_nets_in_order(step: ExecutionStep, net_list: list[str]) -> None:
    """Appends to ``net_list`` the names of the nets ``step`` runs, depth
    first (substeps, own nets, report net), skipping names already there."""
    proto = step.Proto()
    for substep in step.Substeps():
        add_nets_in_order(substep, net_list)
    for net in proto.network:
        if net not in net_list:
            net_list.append(net)
    # Report nets come last, though they may run first; callers rely on it.
    if proto.report_net and proto.report_net not in net_list:
        net_list.append(proto.report_net)


class Plan:
    """A plan: steps plus snapshots of the nets they run."""

    def __init__(self, name_or_step: str | bytes | ExecutionStep) -> None:
        self._plan = caffe2_pb2.PlanDef()
        self._net_dict = OrderedDict()
        self._steps = []
        if isinstance(name_or_step, ExecutionStep):
            self._plan.name = name_or_step.Name()
            self.AddStep(name_or_step)
        elif isinstance(name_or_step, (str, bytes)):
            self._plan.name = name_or_step
        else:
            raise ValueError("name_or_step must be a string or ExecutionStep")

    def __str__(self):
        return self._plan.name

    def __repr__(self):
        n = len(self._plan.execution_step)
        return "<Plan %r: %d step%s, %d net%s>" % (
            self._plan.name, n, "" if n == 1 else "s",
            len(self._plan.network), "" if len(self._plan.network) == 1 else "s")

    def Proto(self) -> caffe2_pb2.PlanDef:
        return self._plan

    def AddNets(self, nets: Sequence[Net]) -> None:
        """Adds copies of the nets' NetDefs as they are now (once per name)."""
        for net in nets:
            if _add_net_to_dict(self._net_dict, net):
                assert isinstance(net, Net)
                self._plan.network.add().CopyFrom(net.Proto())

    def Nets(self) -> list[Net]:
        return list(self._net_dict.values())

    def AddStep(self, step: ExecutionStep) -> None:
        """Adds a copy of ``step`` (an empty step is dropped) and the nets it
        runs, in order of first use. The step becomes immutable."""
        assert isinstance(step, ExecutionStep)
        step._notify_is_used()
        if not step.HasNets() and not step.HasSubsteps():
            return
        self._plan.execution_step.add().CopyFrom(step.Proto())
        self._steps.append(step)
        net_list = []
        add_nets_in_order(step, net_list)
        self.AddNets([step.get_net(n) for n in net_list])

    def Steps(self) -> list[ExecutionStep]:
        return self._steps

    def get_all_attributes(self, name: str) -> list[Any]:
        """The attributes ``name`` of every net of this plan."""
        return [attr for net in self._net_dict.values() for attr in net.get_attributes(name)]

    @classmethod
    def create_from_proto(cls, plan_proto: caffe2_pb2.PlanDef) -> Plan:
        assert isinstance(plan_proto, caffe2_pb2.PlanDef)
        plan = Plan(plan_proto.name)
        plan._plan.CopyFrom(plan_proto)
        del plan._plan.network[:]
        del plan._plan.execution_step[:]

        net_obj_dict = {}
        net_proto_dict = {}
        for net_proto in plan_proto.network:
            assert net_proto.name not in net_proto_dict
            net_proto_dict[net_proto.name] = net_proto

        for step_proto in plan_proto.execution_step:
            step = ExecutionStep.create_from_proto(step_proto, net_obj_dict, net_proto_dict)
            plan.AddStep(step)
        return plan


def to_execution_step(step_or_nets: Any, default_name: str | None = None) -> ExecutionStep:
    """A step as is; a NetBuilder as a step over its children that stops on
    its stop blob; anything else through ``execution_step``."""
    if isinstance(step_or_nets, ExecutionStep):
        return step_or_nets

    stop_blob = None
    if not default_name and hasattr(step_or_nets, "name"):
        default_name = step_or_nets.name
    net_builder = sys.modules.get("ferrocaffe.net_builder")
    if net_builder is not None and isinstance(step_or_nets, net_builder.NetBuilder):
        stop_blob = step_or_nets._stop_blob
        step_or_nets = step_or_nets.get()
    return execution_step(default_name, step_or_nets, should_stop_blob=stop_blob)


def execution_step(
    default_name: str | None,
    steps_or_nets: Any,
    num_iter: int | None = None,
    report_net: Net | None = None,
    report_interval: int | None = None,
    concurrent_substeps: bool | None = None,
    should_stop_blob: str | BlobReference | None = None,
    only_once: bool | None = None,
    num_concurrent_instances: int | None = None,
    create_workspace: bool = False,
    run_every_ms: int | None = None,
) -> ExecutionStep:
    """Builds an ExecutionStep.

    ``steps_or_nets`` may be None, a Net, a step, a list of Nets (each added,
    duplicates included) or a list of steps and step-likes (each added as a
    substep). ``should_stop_blob`` is checked after every net or substep;
    without it or ``num_iter`` the step runs once.
    """
    assert should_stop_blob is None or num_iter is None, (
        "Cannot set both should_stop_blob and num_iter."
    )
    if should_stop_blob is None and num_iter is None:
        num_iter = 1

    step = ExecutionStep(default_name)
    if should_stop_blob is not None:
        step.SetShouldStopBlob(should_stop_blob)
    if num_iter is not None:
        step.SetIter(num_iter)
    if only_once is not None:
        step.SetOnlyOnce(only_once)
    if concurrent_substeps is not None:
        step.SetConcurrentSubsteps(concurrent_substeps)
    if report_net is not None:
        assert report_interval is not None
        step.SetReportNet(report_net, report_interval)
    if num_concurrent_instances is not None:
        step.SetNumConcurrentInstances(num_concurrent_instances)
    if create_workspace:
        step.SetCreateWorkspace(True)
    if run_every_ms:
        step.RunEveryMillis(run_every_ms)

    if isinstance(steps_or_nets, ExecutionStep):
        step.AddSubstep(steps_or_nets)
    elif isinstance(steps_or_nets, Net):
        step.AddNet(steps_or_nets)
    elif isinstance(steps_or_nets, list):
        if all(isinstance(x, Net) for x in steps_or_nets):
            for x in steps_or_nets:
                step.AddNet(x)
        else:
            for x in steps_or_nets:
                step.AddSubstep(to_execution_step(x))
    elif steps_or_nets:
        raise ValueError("steps_or_nets must be a step, a net, or a list of nets or steps.")
    return step


def scoped_execution_step(name: str | None, *args: Any, **kwargs: Any) -> ExecutionStep:
    """``execution_step`` with the name scope added to the step name."""
    default_name = ScopedName(name) if name else name
    return execution_step(default_name, *args, **kwargs)


IR = gradients.IR
GradientWrapper = gradients.GradientWrapper


class GradientRegistry(gradients.GradientRegistry):
    """The gradient makers (gradients.py; one registry shared with it),
    whose backward pass names blobs with BlobReferences, as Caffe2's does."""

    @classmethod
    def GetBackwardPass(
        cls, operators: Sequence[Any], ys: Any, ys_generate_gradient: bool = False
    ) -> tuple[list[Any], dict[BlobReference, Any]]:
        ops, grads = IR(operators).GetBackwardPass(ys)

        def ref(g: Any) -> Any:
            if isinstance(g, gradients.GradientSlice):
                return gradients.GradientSlice(BlobReference(g.indices), BlobReference(g.values))
            return BlobReference(g)

        return ops, {BlobReference(name): ref(g) for name, g in grads.items()}


def control_op_remap(op: caffe2_pb2.OperatorDef, prefix: str, blob_remap: Mapping[str, str]) -> None:
    """Applies ``blob_remap`` inside the nets a control op holds (If and
    AsyncIf: ``then_net``/``else_net``; While: ``loop_net``/``cond_net``),
    as ``Net.Clone`` does by default; each such net is renamed
    ``<name>_remapped``."""
    names = ("then_net", "else_net") if op.type in ("If", "AsyncIf") else ("loop_net", "cond_net")
    for arg in op.arg:
        if arg.name in names and arg.HasField("n"):
            inner = Net(arg.n)
            remapped = inner.Clone((arg.n.name or "") + "_remapped", blob_remap=blob_remap)
            arg.n.CopyFrom(remapped.Proto())


DEFAULT_REMAP_FUNCS: dict[str, Callable[..., Any]] = {
    "If": control_op_remap,
    "AsyncIf": control_op_remap,
    "While": control_op_remap,
}


# Read at import, as Caffe2 did (see "operator registry" above).
RefreshRegisteredOperators()
