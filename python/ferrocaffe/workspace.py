"""Caffe2's ``workspace`` module: a process-wide registry of named workspaces
and the functions that feed, fetch and run in the current one.

``Workspace`` is Caffe2's ``C.Workspace`` (also reachable as
``workspace.C.Workspace``): an object you can hold, run plans in, and give
children (``Workspace(parent)``) that see their parent's blobs.
"""

from __future__ import annotations

import operator
import os
import threading
import types
from typing import Any, Iterable

import numpy as np

from . import _core, errors, proto

__all__ = [
    "Workspace",
    "Blob",
    "C",
    "FeedBlob",
    "FetchBlob",
    "FetchBlobs",
    "SerializeBlob",
    "DeserializeBlob",
    "HasBlob",
    "Blobs",
    "CreateBlob",
    "ResetBlob",
    "RemoveBlob",
    "ResetWorkspace",
    "SwitchWorkspace",
    "CurrentWorkspace",
    "Workspaces",
    "RootFolder",
    "CreateNet",
    "Nets",
    "RunNet",
    "RunNetOnce",
    "RunOperatorOnce",
    "RunOperatorsOnce",
    "RunPlan",
    "RunPlanInBackground",
    "StringifyProto",
    "StringifyBlobName",
    "StringifyNetName",
    "current_workspace",
]


def StringifyProto(obj: Any) -> bytes:
    """Serialises a proto, a ``core.Net``/``Plan``/``ExecutionStep`` or bytes."""
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj)
    if hasattr(obj, "SerializeToString"):
        return obj.SerializeToString()
    if hasattr(obj, "Proto"):
        return obj.Proto().SerializeToString()
    raise ValueError(f"Unexpected argument to StringifyProto of type {type(obj).__name__}")


def _int64(value: Any, what: str, **context) -> int:
    """``value`` as an int in int64's range, or a typed error naming it."""
    try:
        n = operator.index(value)
    except TypeError:
        raise errors.DataTypeError(
            f"{what} must be an int, got {type(value).__name__}", **context) from None
    if not -(1 << 63) <= n < (1 << 63):
        raise errors.InvalidArgumentError(f"{what} {n} does not fit in int64", **context)
    return n


def StringifyBlobName(name: Any) -> str:
    return proto._utf8(name, "blob", blob=name if isinstance(name, str) else repr(name))


def StringifyNetName(name: Any) -> str:
    if hasattr(name, "Name"):
        return name.Name()
    if hasattr(name, "name") and not isinstance(name, str):
        return name.name
    return proto._utf8(name, "net", net=name if isinstance(name, str) else repr(name))


def _to_feedable(name: str, arr: Any):
    """Turns a user value into what the core accepts (one numpy array,
    bytes or str), or raises FeedError."""
    if isinstance(arr, (str, bytes)):
        return arr
    if isinstance(arr, np.ndarray):
        if arr.dtype.kind in "SU":
            return arr.astype(object)
        return arr
    if isinstance(arr, (bool, int, float, np.generic)):
        return np.asarray(arr)
    raise errors.FeedError(
        f"cannot feed an object of type {type(arr).__name__} into blob '{name}': "
        "feed a numpy array, a Python scalar, str or bytes (wrap lists with np.array)",
        blob=name,
    )


class Blob:
    """A handle to one blob of a workspace (Caffe2's ``C.Blob``)."""

    __slots__ = ("_ws", "_name")

    def __init__(self, ws: "Workspace", name: str):
        self._ws = ws
        self._name = name

    def fetch(self):
        return self._ws.fetch_blob(self._name)

    def feed(self, arr, device_option=None) -> bool:
        return self._ws.feed_blob(self._name, arr, device_option)

    def is_tensor(self) -> bool:
        return self._ws._core.blob_kind(self._name).startswith("Tensor")

    def kind(self) -> str:
        return self._ws._core.blob_kind(self._name)

    def __repr__(self) -> str:
        return f"Blob({self._name!r})"


class _BlobMap:
    """``ws.blobs``: a read-only mapping of name to :class:`Blob`."""

    def __init__(self, ws: "Workspace"):
        self._ws = ws

    def __getitem__(self, name: str) -> Blob:
        name = StringifyBlobName(name)
        if not self._ws._core.has_blob(name):
            raise errors.BlobNotFoundError(f"blob '{name}' does not exist", blob=name)
        return Blob(self._ws, name)

    def __contains__(self, name) -> bool:
        return self._ws._core.has_blob(StringifyBlobName(name))

    def __iter__(self):
        return iter(self._ws._core.blobs())

    def __len__(self) -> int:
        return len(self._ws._core.blobs())

    def keys(self):
        return self._ws._core.blobs()

    def items(self):
        return [(n, Blob(self._ws, n)) for n in self._ws._core.blobs()]

    def values(self):
        return [Blob(self._ws, n) for n in self._ws._core.blobs()]


class Workspace:
    """A workspace object (Caffe2's ``C.Workspace``).

    ``Workspace()`` is a fresh root workspace; ``Workspace(parent)`` a child
    that sees every blob of ``parent`` and writes through to blobs that already
    exist there, while new names stay local to the child.
    """

    def __init__(self, parent: "Workspace | None" = None, root_folder: str | None = None):
        if isinstance(parent, str) and root_folder is None:  # Workspace(root_folder)
            parent, root_folder = None, parent
        self._core = _core.Workspace(parent._core if parent is not None else None, root_folder)
        self._parent = parent

    @classmethod
    def _wrap(cls, core_ws) -> "Workspace":
        ws = cls.__new__(cls)
        ws._core = core_ws
        ws._parent = None
        return ws

    # Caffe2's C.Workspace.current
    current = property(lambda self: current_workspace())

    @property
    def root_folder(self) -> str:
        return self._core.root_folder

    @property
    def parent(self) -> "Workspace | None":
        return self._parent

    @property
    def blobs(self) -> _BlobMap:
        return _BlobMap(self)

    @property
    def nets(self) -> list[str]:
        return self._core.nets()

    def create_blob(self, name) -> Blob:
        name = StringifyBlobName(name)
        self._core.create_blob(name)
        return Blob(self, name)

    def has_blob(self, name) -> bool:
        return self._core.has_blob(StringifyBlobName(name))

    def fetch_blob(self, name):
        return self._core.fetch_blob(StringifyBlobName(name))

    def feed_blob(self, name, arr, device_option=None) -> bool:
        name = StringifyBlobName(name)
        if isinstance(arr, proto.TensorProto):
            # Decoded by the runtime with Caffe2's rules (dims, data_type,
            # the data field of that type, segment).
            blob = proto.BlobProto(name=name, type="Tensor", tensor=arr)
            self._core.deserialize_blob(name, blob.SerializeToString())
            return True
        self._core.feed_blob(name, _to_feedable(name, arr))
        return True

    def serialize_blob(self, name) -> bytes:
        return self._core.serialize_blob(StringifyBlobName(name))

    def deserialize_blob(self, name, serialized_blob: bytes) -> None:
        self._core.deserialize_blob(StringifyBlobName(name), bytes(serialized_blob))

    def reset_blob(self, name) -> None:
        self._core.reset_blob(StringifyBlobName(name))

    def remove_blob(self, name) -> bool:
        return self._core.remove_blob(StringifyBlobName(name))

    def create_net(self, net, overwrite: bool = False, input_blobs: Iterable | None = None) -> bool:
        for b in input_blobs or []:
            self._core.create_blob(StringifyBlobName(b))
        self._core.create_net(StringifyProto(net), overwrite)
        return True

    def run_net(self, name, num_iter: int = 1, allow_fail: bool = False) -> bool:
        name = StringifyNetName(name)
        num_iter = _int64(num_iter, "num_iter", net=name)
        ok = self._core.run_net(name, num_iter)
        return _check(ok, allow_fail, f"net '{name}'")

    def _run_plan_bytes(self, data: bytes) -> bool:
        """Runs a serialised PlanDef (what ``run`` does with a Plan, minus
        the serialising)."""
        return _check(self._core.run_plan(data), False, "plan")

    def run(self, obj) -> bool:
        """Runs a Plan, ExecutionStep, Net or one of their protos once."""
        kind = _kind_of(obj)
        if kind == "plan":
            return _check(self._core.run_plan(StringifyProto(obj)), False, "plan")
        if kind == "step":
            return self.run(_plan_from_step(obj))
        if kind == "net":
            return _check(self._core.run_net_once(StringifyProto(obj)), False, f"net '{StringifyNetName(obj)}'")
        if kind == "op":
            return _check(self._core.run_operator_once(StringifyProto(obj)), False, "operator")
        raise TypeError(f"Workspace.run takes a Plan, ExecutionStep, Net or their protos, not {type(obj).__name__}")

    def __repr__(self) -> str:
        return f"Workspace(blobs={len(self._core.local_blobs())}, nets={len(self._core.nets())})"


def _kind_of(obj) -> str:
    name = type(obj).__name__
    if name in ("Plan", "PlanDef"):
        return "plan"
    if name == "ExecutionStep":
        return "step"
    if name in ("Net", "NetDef"):
        return "net"
    if name == "OperatorDef":
        return "op"
    return "unknown"


def _plan_from_step(step):
    from . import core  # lazy: workspace sits below core

    if isinstance(step, core.ExecutionStep):
        return core.Plan(step)
    # A bare ExecutionStep proto carries no net definitions: the plan holds
    # only the step, and any net it names fails as undefined.
    from .proto import PlanDef

    p = PlanDef()
    p.name = step.name
    p.execution_step.add().CopyFrom(step)
    return p


def _check(ok: bool, allow_fail: bool, what: str) -> bool:
    if not ok and not allow_fail:
        raise errors.PlanFailedError(f"{what} failed: an operator reported failure")
    return ok


# ---------------------------------------------------- process-wide registry --

_lock = threading.RLock()
_workspaces: dict[str, Workspace] = {"default": Workspace()}
_current_name = "default"


def current_workspace() -> Workspace:
    """The current workspace object."""
    return _workspaces[_current_name]


def CurrentWorkspace() -> str:
    return _current_name


def Workspaces() -> list[str]:
    return list(_workspaces)


def SwitchWorkspace(name: str, create_if_missing: bool = False) -> None:
    global _current_name
    name = StringifyBlobName(name)
    with _lock:
        if name not in _workspaces:
            if not create_if_missing:
                raise errors.WorkspaceNotFoundError(
                    f"Workspace {name} does not exist; pass create_if_missing=True to create it"
                )
            _workspaces[name] = Workspace()
        _current_name = name


def RootFolder() -> str:
    return current_workspace().root_folder


def ResetWorkspace(root_folder: str | None = None) -> bool:
    """Replaces the current workspace with a fresh one (all blobs and nets
    gone). ``None`` keeps the root folder; a new folder is created if missing.
    Child workspaces of the old one stay valid (they keep it alive)."""
    with _lock:
        old = _workspaces[_current_name]
        if root_folder is None:
            root_folder = old.root_folder
        elif not os.path.exists(root_folder):
            os.makedirs(root_folder)
        _workspaces[_current_name] = Workspace(root_folder=root_folder)
    return True


def FeedBlob(name, arr, device_option=None) -> bool:
    return current_workspace().feed_blob(name, arr, device_option)


def SerializeBlob(name) -> bytes:
    """The blob as a serialised ``BlobProto`` (Caffe2's ``SerializeBlob``)."""
    return current_workspace().serialize_blob(name)


def DeserializeBlob(name, serialized_blob: bytes) -> None:
    """Stores the value of a serialised ``BlobProto`` in blob ``name``
    (Caffe2's ``DeserializeBlob``)."""
    current_workspace().deserialize_blob(name, serialized_blob)


def FetchBlob(name):
    return current_workspace().fetch_blob(name)


def FetchBlobs(names):
    return [FetchBlob(n) for n in names]


def HasBlob(name) -> bool:
    return current_workspace().has_blob(name)


def Blobs() -> list[str]:
    return current_workspace()._core.blobs()


def CreateBlob(name) -> bool:
    current_workspace().create_blob(name)
    return True


def ResetBlob(name) -> None:
    current_workspace().reset_blob(name)


def RemoveBlob(name) -> bool:
    return current_workspace().remove_blob(name)


def CreateNet(net, overwrite: bool = False, input_blobs=None) -> bool:
    return current_workspace().create_net(net, overwrite, input_blobs)


def Nets() -> list[str]:
    return current_workspace().nets


def RunNet(name, num_iter: int = 1, allow_fail: bool = False) -> bool:
    return current_workspace().run_net(name, num_iter, allow_fail)


def RunNetOnce(net) -> bool:
    ws = current_workspace()
    return _check(ws._core.run_net_once(StringifyProto(net)), False, f"net '{StringifyNetName(net)}'")


def RunOperatorOnce(operator) -> bool:
    return _check(current_workspace()._core.run_operator_once(StringifyProto(operator)), False, "operator")


def RunOperatorsOnce(operators) -> bool:
    for op in operators:
        RunOperatorOnce(op)
    return True


def RunPlan(plan_or_step) -> bool:
    if _kind_of(plan_or_step) == "step":
        plan_or_step = _plan_from_step(plan_or_step)
    return _check(current_workspace()._core.run_plan(StringifyProto(plan_or_step)), False, "plan")


def RunPlanInBackground(plan_or_step):
    """Starts the plan on a background thread; the handle has ``is_done()``,
    ``is_succeeded()``, ``wait()`` and ``cancel()``."""
    if _kind_of(plan_or_step) == "step":
        plan_or_step = _plan_from_step(plan_or_step)
    return _core.run_plan_in_background(current_workspace()._core, StringifyProto(plan_or_step))


# Caffe2 code reaches the compiled module as ``workspace.C``.
C = types.SimpleNamespace(
    Workspace=Workspace,
    Blob=Blob,
    registered_operators=_core.registered_operators,
    operator_schema=_core.operator_schema,
)
