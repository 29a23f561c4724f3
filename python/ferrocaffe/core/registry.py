"""Operator types, engines, devices and data types: what the runtime knows
(Caffe2's ``core`` registry functions; a part of :mod:`ferrocaffe.core`)."""

from __future__ import annotations

import difflib
import importlib
import re
from typing import Any, Callable, Mapping, Sequence


from ferrocaffe.proto import caffe2_pb2


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
# Called when the registry is re-read (net.py forgets the op methods it
# cached on Net).
_ON_REFRESH: list[Callable[[], None]] = []


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
    for hook in _ON_REFRESH:
        hook()
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
