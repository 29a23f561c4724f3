"""Caffe2's ``workspace`` module: a process-wide registry of named workspaces
and the functions that feed, fetch and run in the current one.

``Workspace`` is Caffe2's ``C.Workspace`` (also reachable as
``workspace.C.Workspace``): an object you can hold, run plans in, and give
children (``Workspace(parent)``) that see their parent's blobs.
"""

from __future__ import annotations

import collections
import contextlib
import operator
import os
import shutil
import tempfile
import threading
import time
import types
from collections.abc import Mapping
from typing import Any, Iterable

import numpy as np

from . import _core, db, errors, profiler, proto, scope

__all__ = [
    "Workspace",
    "Int8Tensor",
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
    "BenchmarkNet",
    "StringifyProto",
    "StringifyBlobName",
    "StringifyNetName",
    "current_workspace",
    "NetHandle",
    "GetNetName",
    "RegisteredOperators",
    "GetNameScope",
    "GlobalInit",
    "GetGlobalInitArgs",
    "is_asan",
    "has_cuda_support",
    "has_hip_support",
    "has_gpu_support",
    "has_fbgemm",
    "GpuDeviceType",
    "NumCudaDevices",
    "NumGpuDevices",
    "GetCUDAVersion",
    "GetCuDNNVersion",
    "GetDeviceProperties",
    "GetGpuPeerAccessPattern",
    "GetGPUMemoryInfo",
    "blobs",
    "OpSchema",
    "TensorHandle",
    "IsImmediate",
    "WorkspaceGuard",
    "StartImmediate",
    "StopImmediate",
    "ImmediateBlobs",
    "RunOperatorImmediate",
    "FetchImmediate",
    "FeedImmediate",
    "Predictor",
]


def StringifyProto(obj: Any, message_type: Any = None) -> bytes:
    """Serialises a proto, a ``core.Net``/``Plan``/``ExecutionStep`` or bytes.
    A ``str`` is returned as it is (as Caffe2 did): the calls that need bytes
    then refuse it with a TypeError. A path (``os.PathLike``, e.g. a
    ``pathlib.Path``) names a file holding a ``message_type`` (NetDef,
    PlanDef...) in protobuf binary or text format (``.pbtxt``)."""
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj)
    if isinstance(obj, str):
        return obj
    if isinstance(obj, os.PathLike):
        if message_type is None:
            with open(obj, "rb") as f:
                return f.read()
        return proto.ReadProtoFromFile(obj, message_type()).SerializeToString()
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


def _stringify_name(name: Any, expected: str, kind: str, **context) -> str:
    """``name`` (str, UTF-8 bytes, or an object of type ``expected``) as a
    str; TypeError for another type, InvalidArgumentError for a name with no
    UTF-8 form."""
    if not isinstance(name, (str, bytes, bytearray)):
        if type(name).__name__ != expected:
            raise TypeError(f"expected a string or a {expected} as a name, not {type(name).__name__}")
        name = str(name)
    return proto._utf8(name, kind, **context)


def StringifyBlobName(name: Any) -> str:
    """The name of a blob given as str, bytes or BlobReference (TypeError
    for anything else)."""
    return _stringify_name(name, "BlobReference", "blob", blob=name if isinstance(name, str) else repr(name))


def StringifyNetName(name: Any) -> str:
    """The name of a net given as str, bytes, Net or NetDef (TypeError for
    anything else)."""
    if hasattr(name, "Name"):
        return name.Name()
    if hasattr(name, "name") and not isinstance(name, (str, bytes)):
        return name.name
    return _stringify_name(name, "Net", "net", net=name if isinstance(name, str) else repr(name))


def GetNetName(net: Any) -> str:
    """The name of a net given as a name, Net, NetDef or serialised NetDef
    (whose bytes are parsed for it, not decoded as text)."""
    if isinstance(net, str):
        return net
    if isinstance(net, bytes):
        from .proto import NetDef

        proto = NetDef()
        try:
            proto.ParseFromString(net)
        except Exception:
            return "<unparsable NetDef>"
        return proto.name
    return StringifyNetName(net)


# A quantised tensor as FetchBlob returns it and FeedBlob takes it (Caffe2's
# name): `data` a uint8 array (int32 for a bias), its reals
# scale * (data - zero_point).
Int8Tensor = collections.namedtuple("Int8Tensor", ["data", "scale", "zero_point"])


def _int8_blob_proto(name: str, value: Int8Tensor) -> bytes:
    """The serialised ``BlobProto`` of an ``Int8Tensor`` (Caffe2's
    ``Int8TensorCPU`` form), or FeedError."""
    data = np.asarray(value.data)
    codes = {np.dtype(np.uint8): proto.TensorProto.UINT8, np.dtype(np.int32): proto.TensorProto.INT32}
    if data.dtype not in codes:
        raise errors.FeedError(
            f"an Int8Tensor fed into blob '{name}' must hold uint8 (or int32) data, got {data.dtype}",
            blob=name,
        )
    scale, zero_point = float(value.scale), value.zero_point
    if not (np.isfinite(scale) and scale > 0) or int(zero_point) != zero_point:
        raise errors.FeedError(
            f"an Int8Tensor fed into blob '{name}' needs a positive scale and an integer "
            f"zero point, got {value.scale!r} and {value.zero_point!r}",
            blob=name,
        )
    blob = proto.BlobProto(name=name, type="Int8TensorCPU")
    q = blob.qtensor
    q.dims.extend(data.shape)
    q.precision = 8
    q.scale = scale
    q.bias = int(zero_point)
    q.is_signed = False
    q.data_type = codes[data.dtype]
    q.data.extend(data.astype(np.int32).ravel().tolist())
    return blob.SerializeToString()


def _is_tensor_proto(value: Any) -> bool:
    """A ``caffe2.TensorProto`` message, of our caffe2_pb2 or another's."""
    descriptor = getattr(type(value), "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", None) == "caffe2.TensorProto"


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


# Caffe2 TensorProto.DataType numbers -> numpy dtypes of tensors Python can make.
_NUMPY_OF_CAFFE2 = {
    1: np.float32, 2: np.int32, 5: np.bool_, 6: np.uint8, 7: np.int8,
    8: np.uint16, 9: np.int16, 10: np.int64, 12: np.float16, 13: np.float64,
}


class Blob:
    """A handle to one blob of a workspace (Caffe2's ``C.Blob``)."""

    __slots__ = ("_ws", "_name")

    def __init__(self, ws: "Workspace", name: str):
        self._ws = ws
        self._name = name

    def fetch(self, copy: bool = True):
        """The blob's content, as a copy; ``copy=False``: a read-only view
        of a tensor's buffer (see ``Workspace.fetch_blob``)."""
        return self._ws.fetch_blob(self._name, copy=copy)

    def feed(self, arr, device_option=None) -> bool:
        """Feeds ``arr`` into the blob (see ``Workspace.feed_blob``)."""
        return self._ws.feed_blob(self._name, arr, device_option)

    def is_tensor(self) -> bool:
        """Whether the blob holds a tensor."""
        return self._ws._core.blob_kind(self._name).startswith("Tensor")

    def kind(self) -> str:
        """What the blob holds: ``"Tensor<float32>"``, ``"Counter"``,
        ``"bytes"``, ..."""
        return self._ws._core.blob_kind(self._name)

    def serialize(self, name=None) -> bytes:
        """The blob as Caffe2's serialised ``BlobProto``, named ``name``
        (default: the blob's own name)."""
        data = self._ws._core.serialize_blob(self._name)
        if name is None or StringifyBlobName(name) == self._name:
            return data
        from .proto import BlobProto

        proto = BlobProto()
        proto.ParseFromString(data)
        proto.name = StringifyBlobName(name)
        return proto.SerializeToString()

    def deserialize(self, serialized: bytes) -> None:
        """Sets the blob to the content of a serialised ``BlobProto``."""
        self._ws._core.deserialize_blob(self._name, serialized)

    def tensor(self) -> "TensorHandle":
        """The blob's tensor (Caffe2's ``Blob.tensor()``)."""
        return TensorHandle(self)


class _WriteThrough(np.ndarray):
    """``TensorHandle.data``: a copy of the blob's tensor whose item and
    slice assignments (``data[i] = x``, also through views of it) are
    written back to the blob at once, as writes to Caffe2's view of the
    tensor memory were seen in the blob."""

    def __array_finalize__(self, obj):
        self._root = getattr(obj, "_root", None)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        root = self._root
        # Only the array handed out and views of it (a copy made from
        # them keeps the attribute, not the memory).
        if root is not None and (self is root or np.may_share_memory(self, root)):
            root._handle.feed(np.asarray(root))


class TensorHandle:
    """The tensor in a blob (Caffe2's ``TensorCPU``). ``data`` is a numpy
    copy whose item and slice assignments are written to the blob (Caffe2
    handed out a view of the memory); other in-place writes to it (``out=``,
    ``np.copyto``) stay in the copy: feed the array to write those.
    ``fetch()`` gives a plain copy, ``feed(array)`` replaces the content,
    ``shape`` is its dims, ``init(dims, dtype)`` makes it a zero tensor,
    ``reshape(dims)`` (``_reshape``) changes its dims."""

    __slots__ = ("_blob",)

    def __init__(self, blob: Blob):
        self._blob = blob

    def fetch(self):
        """A copy of the tensor (see ``Workspace.fetch_blob``)."""
        return self._blob.fetch()

    @property
    def data(self):
        value = self._blob.fetch()
        if not isinstance(value, np.ndarray):
            raise errors.DataTypeError(
                f"blob '{self._blob._name}' holds no tensor", blob=self._blob._name)
        array = value.view(_WriteThrough)
        array._root = array
        array._handle = self
        return array

    @data.setter
    def data(self, value) -> None:
        self.feed(np.asarray(value))

    @property
    def _shape(self) -> list:
        return list(np.shape(self._blob.fetch()))

    @property
    def shape(self) -> tuple:
        """The tensor's dims."""
        return tuple(np.shape(self._blob.fetch(copy=False)))

    def feed(self, arr) -> bool:
        """Replaces the tensor's content with ``arr``."""
        return self._blob.feed(arr)

    def init(self, dims, caffe_type) -> None:
        """Makes the tensor ``dims`` of Caffe2 dtype ``caffe_type``, zeros
        (Caffe2 left the memory uninitialised). Strings cannot be made here,
        as in Caffe2 (``DataTypeError``, a ``RuntimeError``)."""
        dtype = _NUMPY_OF_CAFFE2.get(int(caffe_type))
        if dtype is None:
            raise errors.DataTypeError(
                f"cannot initialise blob '{self._blob._name}' as a tensor of data type "
                f"{int(caffe_type)} from Python (numbers and bool only)", blob=self._blob._name)
        self.feed(np.zeros([int(d) for d in dims], dtype))

    def _reshape(self, dims) -> None:
        """New dims: the same values when the element count is the same,
        else zeros of the same dtype (Caffe2 left them undefined)."""
        dims = [int(d) for d in dims]
        current = self._blob.fetch()
        if not isinstance(current, np.ndarray):
            raise errors.DataTypeError(
                f"blob '{self._blob._name}' holds no tensor", blob=self._blob._name)
        if int(np.prod(dims)) == current.size:
            self.feed(current.reshape(dims))
        else:
            self.feed(np.zeros(dims, current.dtype))

    def reshape(self, dims) -> None:
        self._reshape(list(dims))

    def __repr__(self) -> str:
        return f"TensorCPU(blob={self._blob._name!r})"


class _BlobMap(Mapping):
    """``ws.blobs``: a read-only mapping of name to :class:`Blob` (a
    ``Mapping``, so it compares equal to a dict of the same items, as
    Caffe2's dict did: ``ws.blobs == {}`` for an empty workspace)."""

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


class NetHandle:
    """A net created in a workspace (Caffe2's ``C.Net``)."""

    __slots__ = ("_ws", "_name")

    def __init__(self, ws: "Workspace", name: str):
        self._ws = ws
        self._name = name

    @property
    def name(self) -> str:
        """The net's name."""
        return self._name

    def Name(self) -> str:
        """The net's name (Caffe2's spelling)."""
        return self._name

    def run(self) -> bool:
        """Runs the net once (an op failure raises)."""
        return self._ws.run_net(self._name)

    def __eq__(self, other) -> bool:
        return isinstance(other, NetHandle) and other._ws._core is self._ws._core and other._name == self._name

    def __hash__(self) -> int:
        return hash(self._name)

    def __repr__(self) -> str:
        return f"Net({self._name!r})"


class _CurrentWorkspace:
    """``Workspace.current``: the current workspace, read on the class or
    on an instance."""

    def __get__(self, obj, owner=None) -> "Workspace":
        return current_workspace()


class Workspace:
    """A workspace object (Caffe2's ``C.Workspace``).

    ``Workspace()`` is a fresh root workspace; ``Workspace(parent)`` a child
    that sees every blob of ``parent`` and writes through to blobs that already
    exist there, while new names stay local to the child.
    """

    def __init__(self, parent: "Workspace | None" = None, root_folder: str | None = None):
        if isinstance(parent, (str, os.PathLike)) and root_folder is None:  # Workspace(root_folder)
            parent, root_folder = None, parent
        self._core = _core.Workspace(parent._core if parent is not None else None, root_folder)
        self._parent = parent

    @classmethod
    def _wrap(cls, core_ws) -> "Workspace":
        ws = cls.__new__(cls)
        ws._core = core_ws
        ws._parent = None
        return ws

    #: The current workspace (Caffe2's ``C.Workspace.current``), on the
    #: class as on any instance.
    current = _CurrentWorkspace()

    @property
    def root_folder(self) -> str:
        """The folder relative db paths of Save and Load resolve against."""
        return self._core.root_folder

    @property
    def parent(self) -> "Workspace | None":
        """The parent workspace (None for a root workspace)."""
        return self._parent

    @property
    def blobs(self) -> _BlobMap:
        """``{name: Blob}`` of every visible blob (a read-only mapping)."""
        return _BlobMap(self)

    @property
    def nets(self) -> dict[str, "NetHandle"]:
        """``{name: net}`` of the nets created in this workspace."""
        return {name: NetHandle(self, name) for name in self._core.nets()}

    def create_blob(self, name) -> Blob:
        """Creates an empty blob (nothing if one of that name is visible)
        and returns its handle."""
        name = StringifyBlobName(name)
        self._core.create_blob(name)
        return Blob(self, name)

    def has_blob(self, name) -> bool:
        """Whether a blob of that name is visible here (own or a parent's)."""
        return self._core.has_blob(StringifyBlobName(name))

    def fetch_blob(self, name, copy: bool = True):
        """A copy of the blob's content, as Caffe2 returned it: a numpy array
        for a tensor (an object array of bytes for strings), bytes for a byte
        string. The array is writable and its own: writing to it does not
        change the blob (feed it back with ``feed_blob``).

        ``copy=False`` (new in ferrocaffe) copies nothing for a numeric
        tensor: the array is a read-only view of the tensor's buffer, kept
        alive by the array's ``base``. Tensor storage is copy-on-write, so
        later writes to the blob (ops in place, ``Load``, feeds) copy the
        buffer first and never change an array already handed out; the blob
        may be reset or the workspace dropped while the array lives. Writing
        to the array raises numpy's read-only ``ValueError`` (``np.array(a)``
        makes a writable copy). String tensors come as read-only copies."""
        return self._core.fetch_blob(StringifyBlobName(name), copy)

    def feed_blob(self, name, arr, device_option=None) -> bool:
        """Feeds a numpy array, Python scalar, str, bytes or ``TensorProto``
        into blob ``name`` (created if needed); True. Wrong types raise
        ``FeedError``."""
        name = StringifyBlobName(name)
        if isinstance(arr, Int8Tensor):
            self._core.deserialize_blob(name, _int8_blob_proto(name, arr))
            return True
        if _is_tensor_proto(arr):
            # Decoded by the runtime with Caffe2's rules (dims, data_type,
            # the data field of that type, segment). Passed serialised, so a
            # TensorProto of another caffe2_pb2 (Caffe2's own) feeds too.
            blob = proto.BlobProto(name=name, type="Tensor")
            blob.tensor.MergeFromString(arr.SerializePartialToString())
            # Partial: a required field the tensor lacks (a segment's begin)
            # is the runtime's to refuse, as a typed error.
            self._core.deserialize_blob(name, blob.SerializePartialToString())
            return True
        self._core.feed_blob(name, _to_feedable(name, arr))
        return True

    def serialize_blob(self, name) -> bytes:
        """The blob as one serialised ``BlobProto``."""
        return self._core.serialize_blob(StringifyBlobName(name))

    def deserialize_blob(self, name, serialized_blob: bytes) -> None:
        """Stores the value of a serialised ``BlobProto`` in blob ``name``;
        malformed bytes raise a typed error and leave the blob as it was."""
        self._core.deserialize_blob(StringifyBlobName(name), bytes(serialized_blob))

    def reset_blob(self, name) -> None:
        """Empties the blob (it keeps existing)."""
        self._core.reset_blob(StringifyBlobName(name))

    def remove_blob(self, name) -> bool:
        """Removes the blob from this workspace; whether it existed."""
        return self._core.remove_blob(StringifyBlobName(name))

    def create_net(self, net, overwrite: bool = False, input_blobs: Iterable | None = None) -> "NetHandle":
        """Creates ``net`` (a Net, NetDef or serialised NetDef) here and
        returns it (Caffe2 returned the C.Net)."""
        for b in input_blobs or []:
            self._core.create_blob(StringifyBlobName(b))
        data = StringifyProto(net, proto.NetDef)
        self._core.create_net(data, overwrite)
        return NetHandle(self, GetNetName(net if not isinstance(net, (str, os.PathLike)) else data))

    def run_net(self, name, num_iter: int = 1, allow_fail: bool = False, trace=None) -> bool:
        """Runs the net created here as ``name`` ``num_iter`` times. False
        if an op failed softly and ``allow_fail``; otherwise that raises
        ``PlanFailedError``. ``trace``: a path to write a timeline of this
        call to (``ferrocaffe.profile``)."""
        name = StringifyNetName(name)
        num_iter = _int64(num_iter, "num_iter", net=name)
        if trace is None:  # the hot path: no context manager
            ok = self._core.run_net(name, num_iter)
        else:
            with profiler.profile(trace):
                ok = self._core.run_net(name, num_iter)
        return _check(ok, allow_fail, f"net '{name}'")

    def benchmark_net(self, name, warmup_runs: int, main_runs: int, run_individual: bool) -> list[float]:
        """See :func:`BenchmarkNet`; times the net created here."""
        return _benchmark(self, name, warmup_runs, main_runs, run_individual)

    def _run_plan_bytes(self, data: bytes) -> bool:
        """Runs a serialised PlanDef (what ``run`` does with a Plan, minus
        the serialising)."""
        return _check(self._core.run_plan(data), False, "plan")

    def run(self, obj, trace=None, progress=False) -> bool:
        """Runs a Plan, ExecutionStep, Net or one of their protos once.
        ``trace``: a path to write a timeline of this call to.
        ``progress`` (plans and steps): a tqdm bar as ``RunPlan`` draws it;
        False (the default) never, None on a terminal when the plan's
        length is known, True whenever it is known."""
        if trace is not None:
            with profiler.profile(trace):
                return self.run(obj, progress=progress)
        kind = _kind_of(obj)
        if kind == "plan":
            data = StringifyProto(obj)
            counted = _progress_plan(data, progress)
            if counted is not None:
                return _check(_run_with_progress(self, *counted), False, "plan")
            return _check(self._core.run_plan(data), False, "plan")
        if kind == "step":
            return self.run(_plan_from_step(obj), progress=progress)
        if kind == "net":
            ok = self._core.run_net_once(StringifyProto(obj))
            return ok or _check(ok, False, f"net '{GetNetName(obj)}'")
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
    # A core.ExecutionStep makes its own plan, nets included: core sits
    # above this module, which never imports it.
    as_plan = getattr(step, "_as_plan", None)
    if as_plan is not None:
        return as_plan()
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


# --------------------------------------------------------------- Predictor --


def _read_netdef(net: Any, what: str) -> Any:
    """A NetDef from a NetDef, a ``core.Net``, a path, or its serialised
    bytes in protobuf binary or text format (a ``str`` is text)."""
    if isinstance(net, proto.NetDef):
        return net
    if hasattr(net, "Proto") and not isinstance(net, (bytes, bytearray, str)):
        return net.Proto()
    if isinstance(net, os.PathLike):
        return proto.ReadProtoFromFile(net, proto.NetDef())
    if isinstance(net, str):
        net = net.encode("utf-8")
    if not isinstance(net, (bytes, bytearray)):
        raise errors.DataTypeError(
            f"Predictor: {what} must be a NetDef, a Net, a path or its serialised bytes, not {type(net).__name__}")
    data = bytes(net)
    m = proto.NetDef()
    failures = []
    # Text first: binary parsing of text bytes can succeed with garbage,
    # text parsing of binary bytes fails.
    try:
        from google.protobuf import text_format

        text_format.Parse(data.decode("utf-8"), m)
        return m
    except Exception as e:  # noqa: BLE001 - any text failure: try binary
        failures.append(f"as text: {e}")
        m.Clear()
    try:
        m.ParseFromString(data)
        return m
    except Exception as e:  # noqa: BLE001
        failures.append(f"as binary: {e}")
    raise errors.InvalidArgumentError(f"Predictor: cannot read the {what} NetDef: " + "; ".join(failures))


class Predictor:
    """Caffe2's ``Predictor``: ``Predictor(init_net, predict_net)`` runs
    ``init_net`` once in a child of the current workspace (the parameters
    stay there) and creates ``predict_net``; ``run(inputs)`` feeds the inputs
    (a list, in the order of ``predict_net``'s external inputs that
    ``init_net`` did not make, or a dict by name), runs the net (in the
    runtime: no Python per op) and returns its external outputs, in order.
    The nets are NetDefs, ``core.Net``s, or their serialised bytes (protobuf
    binary or text format)."""

    def __init__(self, init_net: Any, predict_net: Any) -> None:
        init = _read_netdef(init_net, "init")
        pred = _read_netdef(predict_net, "predict")
        self._ws = Workspace(current_workspace())
        self._ws._core.run_net_once(init.SerializeToString())
        made = set(self._ws._core.local_blobs())
        self.input_names = [n for n in pred.external_input if n not in made]
        self.output_names = list(pred.external_output)
        if not pred.name:
            pred.name = "predict_net"
        for name in self.input_names:
            self._ws._core.create_blob(name)
        self._ws._core.create_net(pred.SerializeToString(), True)
        self._net = pred.name

    def run(self, inputs: Any) -> list:
        if isinstance(inputs, dict):
            unknown = [k for k in inputs if k not in self.input_names]
            if unknown:
                raise errors.InvalidArgumentError(
                    f"Predictor.run: {unknown} are not inputs of the predict net (its inputs: {self.input_names})")
            items = list(inputs.items())
        else:
            inputs = list(inputs)
            if len(inputs) > len(self.input_names):
                raise errors.InvalidArgumentError(
                    f"Predictor.run: {len(inputs)} inputs given, the predict net takes {len(self.input_names)} "
                    f"({self.input_names})")
            items = list(zip(self.input_names, inputs))
        for name, value in items:
            if not isinstance(value, np.ndarray):
                raise errors.FeedError(
                    f"Predictor.run: input '{name}' must be a numpy array, not {type(value).__name__}",
                    blob=name)
            self._ws._core.feed_blob(name, _to_feedable(name, value))
        _check(self._ws._core.run_net(self._net, 1), False, f"net '{self._net}'")
        return [self._ws._core.fetch_blob(n) for n in self.output_names]


# ---------------------------------------------------- process-wide registry --

_lock = threading.RLock()
_workspaces: dict[str, Workspace] = {"default": Workspace()}
_current_name = "default"


def current_workspace() -> Workspace:
    """The current workspace object."""
    return _workspaces[_current_name]


def CurrentWorkspace() -> str:
    """The name of the current workspace."""
    return _current_name


def Workspaces() -> list[str]:
    """The names of every workspace of the process-wide registry."""
    return list(_workspaces)


def SwitchWorkspace(name: str, create_if_missing: bool = False) -> None:
    """Makes the named workspace current; ``create_if_missing`` creates an
    empty one, otherwise an unknown name raises ``WorkspaceNotFoundError``."""
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
    """The root folder of the current workspace (where relative db paths
    of Save and Load resolve)."""
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
    """Feeds ``arr`` (a numpy array, a Python scalar, str, bytes or a
    ``TensorProto``) into blob ``name`` of the current workspace, creating
    it if needed; True. Wrong types raise ``FeedError``."""
    return current_workspace().feed_blob(name, arr, device_option)


def SerializeBlob(name) -> bytes:
    """The blob as a serialised ``BlobProto`` (Caffe2's ``SerializeBlob``)."""
    return current_workspace().serialize_blob(name)


def DeserializeBlob(name, serialized_blob: bytes) -> None:
    """Stores the value of a serialised ``BlobProto`` in blob ``name``
    (Caffe2's ``DeserializeBlob``)."""
    current_workspace().deserialize_blob(name, serialized_blob)


def FetchBlob(name, copy: bool = True):
    """A copy of blob ``name`` of the current workspace (a writable numpy
    array of its own for a tensor, as in Caffe2); writing to it does not
    change the blob. ``copy=False`` (new in ferrocaffe): a read-only numpy
    view of the tensor's buffer, nothing copied, unchanged by later writes
    to the blob (see ``Workspace.fetch_blob``)."""
    return current_workspace().fetch_blob(name, copy=copy)


# The size Caffe2 counted for each string element besides its characters
# (sizeof(std::string) in a 64-bit libstdc++ build).
_STRING_HEADER_BYTES = 32


def GetBlobSizeBytes(name) -> int:
    """The bytes a tensor blob's content takes: element count times element
    size, plus, for strings, their lengths (each element counted as
    Caffe2's 64-bit ``std::string`` header and its characters); 0 for a
    blob that holds no tensor, as in Caffe2."""
    value = FetchBlob(name)
    if not isinstance(value, np.ndarray):
        return 0
    if value.dtype == object:
        return value.size * _STRING_HEADER_BYTES + sum(len(v) for v in value.flat)
    return int(value.nbytes)


def _caffe2_type_of(value) -> int | None:
    """The TensorProto.DataType of a fetched tensor (None for non-tensors)."""
    if not isinstance(value, np.ndarray):
        return None
    if value.dtype == object:
        return proto.TensorProto.STRING
    for code, dtype in _NUMPY_OF_CAFFE2.items():
        if value.dtype == dtype:
            return code
    return None


def _net_protos(nets, nets_proto: bool) -> list:
    out = []
    for n in nets:
        net = n if nets_proto else n.Proto()
        if isinstance(net, (bytes, str)):
            parsed = proto.NetDef()
            try:
                parsed.ParseFromString(net if isinstance(net, bytes) else net.encode())
            except proto.DecodeError as e:
                raise errors.ProtoDecodeError(
                    f"net {len(out)} of {len(nets)} is not a serialised NetDef: {e}") from None
            net = parsed
        out.append(net)
    return out


def _infer_shapes(net_protos, known: dict) -> bytes:
    """The serialised ``TensorShapes`` of every blob after the nets' ops,
    from ``known`` ({name: (dims, type)}, or None for a blob whose shape is
    unknown): each op's schema infers its outputs (``_core.infer_shapes``;
    an op without inference makes its outputs unknown, as in Caffe2)."""
    inferred = _core.infer_shapes([n.SerializeToString() for n in net_protos], known)
    shapes = proto.TensorShapes()
    for name in sorted(inferred):
        known_shape = inferred[name]
        if known_shape is None:
            shapes.shapes.add(name=name, unknown_shape=True)
        else:
            dims, dtype = known_shape
            shapes.shapes.add(name=name, dims=list(dims), data_type=dtype)
    return shapes.SerializeToString()


def _known_from_workspace() -> dict:
    """Every blob of the current workspace, as Caffe2 started: a tensor's
    dims and type, None for anything else."""
    return current_workspace()._core.blob_shapes()


def _infer_from_workspace(net_protos_bytes) -> bytes:
    return _infer_shapes(_net_protos(net_protos_bytes, True), _known_from_workspace())


def _infer_from_map(net_protos_bytes, blob_dimensions, blob_types=None) -> bytes:
    """As Caffe2: without ``blob_types`` every blob is FLOAT; with them, a
    blob they leave out is UNDEFINED. Dims must be >= 0."""
    nets = _net_protos(net_protos_bytes, True)
    known = {}
    for name, dims in blob_dimensions.items():
        dims = [int(d) for d in dims]
        if any(d < 0 for d in dims):
            raise errors.InvalidArgumentError(
                "blob %r has a negative dim: %r" % (name, dims))
        if blob_types is None:
            dtype = proto.TensorProto.FLOAT
        else:
            dtype = int(blob_types.get(name, proto.TensorProto.UNDEFINED))
        known[name] = (dims, dtype)
    return _infer_shapes(nets, known)


def InferShapesAndTypes(nets, blob_dimensions=None, nets_proto=False, blob_types=None):
    """``(shapes, types)``: dicts keyed by blob name of the dims and
    TensorProto.DataType of every blob known after the nets' ops, starting
    from the workspace's tensors or from ``blob_dimensions`` (with
    ``blob_types``), as Caffe2 returned them. Each op's schema infers its
    outputs; a blob whose shape cannot be known without running the nets
    is left out."""
    net_protos = _net_protos(nets, nets_proto)
    if blob_dimensions is None:
        if blob_types is not None:
            raise errors.InvalidArgumentError("blob_types needs blob_dimensions")
        data = _infer_shapes(net_protos, _known_from_workspace())
    else:
        data = _infer_from_map([n.SerializeToString() for n in net_protos],
                               blob_dimensions, blob_types)
    parsed = proto.TensorShapes()
    parsed.ParseFromString(data)
    shapes, types = {}, {}
    for ts in parsed.shapes:
        if not ts.unknown_shape:
            shapes[ts.name] = list(ts.dims)
            types[ts.name] = ts.data_type
    return shapes, types


def FetchBlobs(names, copy: bool = True):
    """The blobs, as ``FetchBlob`` (copies unless ``copy=False``)."""
    return [FetchBlob(n, copy=copy) for n in names]


def HasBlob(name) -> bool:
    """Whether blob ``name`` is visible in the current workspace (its own
    or a parent's)."""
    return current_workspace().has_blob(name)


def Blobs() -> list[str]:
    """The names of every blob visible in the current workspace, sorted."""
    return current_workspace()._core.blobs()


def CreateBlob(name) -> bool:
    """Creates an empty blob ``name`` in the current workspace (nothing if
    one is visible already); True."""
    current_workspace().create_blob(name)
    return True


def ResetBlob(name) -> None:
    """Empties blob ``name`` of the current workspace (it keeps existing)."""
    current_workspace().reset_blob(name)


def RemoveBlob(name) -> bool:
    """Removes blob ``name`` from the current workspace; whether it existed."""
    return current_workspace().remove_blob(name)


def CreateNet(net, overwrite: bool = False, input_blobs=None) -> bool:
    """Creates ``net`` in the current workspace; True (``Workspace.create_net``
    returns the net itself)."""
    current_workspace().create_net(net, overwrite, input_blobs)
    return True


def Nets() -> list[str]:
    """The names of the nets created in the current workspace."""
    return current_workspace()._core.nets()


def RunNet(name, num_iter: int = 1, allow_fail: bool = False, trace=None) -> bool:
    """Runs the net ``name`` (a name, Net or NetDef of a net created with
    CreateNet) of the current workspace ``num_iter`` times. A soft failure
    returns False with ``allow_fail``, else raises ``PlanFailedError``.
    ``trace``: a path to write a timeline of this call to."""
    return current_workspace().run_net(name, num_iter, allow_fail, trace=trace)


def RunNetOnce(net) -> bool:
    """Creates ``net`` (a Net or NetDef) in the current workspace, runs it
    once and drops it; True, or the failed op's error (``PlanFailedError``
    for a soft failure)."""
    data = StringifyProto(net, proto.NetDef)
    ok = current_workspace()._core.run_net_once(data)
    # The net's name is worked out only for the message of a failure.
    return ok or _check(ok, False, f"net '{GetNetName(data if isinstance(net, os.PathLike) else net)}'")


def RunOperatorOnce(operator) -> bool:
    """Runs one operator (an OperatorDef) once in the current workspace;
    True, or its error."""
    return _check(
        current_workspace()._core.run_operator_once(StringifyProto(operator, proto.OperatorDef)),
        False, "operator")


def RunOperatorsOnce(operators) -> bool:
    """Runs each OperatorDef of ``operators`` once, in order; True, or the
    first error."""
    for op in operators:
        RunOperatorOnce(op)
    return True


def RunPlan(plan_or_step, trace=None, progress=None) -> bool:
    """Runs a Plan or ExecutionStep (or a PlanDef, serialised or not) in
    the current workspace until it ends; True, or an exception (a failed
    op's error, ``PlanFailedError`` for a soft failure, KeyboardInterrupt
    on Ctrl-C).

    ``trace``: a path to write a timeline of this call to (see
    ``ferrocaffe.profile``). ``progress``: a tqdm bar over the iterations
    of the plan's looping top-level steps (``num_iter``), shown after a
    second; None (the default) shows it only on a terminal (stderr, not
    in CI) and only when those steps have a known length; False never."""
    if _kind_of(plan_or_step) == "step":
        plan_or_step = _plan_from_step(plan_or_step)
    data = StringifyProto(plan_or_step, proto.PlanDef)
    ws = current_workspace()
    if trace is not None:
        with profiler.profile(trace):
            return RunPlan(data, progress=progress)
    counted = _progress_plan(data, progress)
    if counted is None:
        ok = ws._core.run_plan(data)
    else:
        ok = _run_with_progress(ws, *counted)
    return _check(ok, False, "plan")


_progress_ids = iter(range(1, 1 << 62))


_progress_on_terminal: bool | None = None


def _progress_wanted() -> bool:
    """Whether bars are drawn by default: stderr is a terminal, not in CI
    (decided once per process: RunPlan's hot path pays no system call)."""
    global _progress_on_terminal
    if _progress_on_terminal is None:
        import sys
        if os.environ.get("CI") or os.environ.get("TERM") == "dumb":
            _progress_on_terminal = False
        else:
            try:
                _progress_on_terminal = bool(sys.stderr.isatty())
            except (AttributeError, ValueError):
                _progress_on_terminal = False
    return _progress_on_terminal


def _progress_plan(data: bytes, progress):
    """``(plan bytes with a counter, total, counter, net)`` when a bar is to
    be shown, else None. The plan gets a first step creating a counter and
    a net counting it up at the end of each iteration of its top-level
    steps with a ``num_iter`` (steps with concurrent substeps or instances
    are not counted: their units run at once)."""
    if progress is False or (progress is None and not _progress_wanted()):
        return None
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return None
    plan = proto.PlanDef.FromString(data)
    counted = [s for s in plan.execution_step
               if s.HasField("num_iter") and s.num_iter > 1 and not s.concurrent_substeps
               and s.num_concurrent_instances <= 1]
    total = sum(s.num_iter for s in counted)
    if total <= 1:
        return None
    n = next(_progress_ids)
    counter = "__ferrocaffe_progress_%d" % n
    net_name = "__ferrocaffe_progress_net_%d" % n
    init_name = "__ferrocaffe_progress_init_%d" % n
    init = plan.network.add(name=init_name)
    init.op.add(type="CreateCounter", output=[counter])
    tick = plan.network.add(name=net_name)
    tick.op.add(type="CountUp", input=[counter], output=[counter + "_prev"])
    for step in counted:
        if step.substep:
            step.substep.add(name="progress", network=[net_name])
        else:
            step.network.append(net_name)
    first = proto.ExecutionStep(name="progress_init", network=[init_name])
    steps = [first] + list(plan.execution_step)
    del plan.execution_step[:]
    plan.execution_step.extend(steps)
    return plan.SerializeToString(), total, counter, (init_name, net_name, counter + "_prev")


def _run_with_progress(ws, data, total, counter, made):
    import sys
    import tqdm
    handle = _core.run_plan_in_background(ws._core, data)
    bar = tqdm.tqdm(total=total, unit="it", file=sys.stderr, delay=1.0, leave=False)
    try:
        while not handle.is_done():
            time.sleep(0.1)
            if ws._core.has_blob(counter):
                try:
                    bar.n = ws._core.fetch_counter(counter)
                    bar.refresh()
                except errors.FerrocaffeError:
                    pass
        ok = handle.wait()
        with contextlib.suppress(errors.FerrocaffeError):
            bar.n = ws._core.fetch_counter(counter)     # the last count, at the end
            bar.refresh()
        return ok
    except KeyboardInterrupt:
        handle.cancel()
        with contextlib.suppress(BaseException):
            handle.wait()
        raise
    finally:
        bar.close()
        for name in made[:2]:
            ws._core.delete_net(name)
        for name in (counter, made[2]):
            ws._core.remove_blob(name)


def BenchmarkNet(name, warmup_runs: int, main_runs: int, run_individual: bool) -> list[float]:
    """Times the net ``name`` of the current workspace, as Caffe2 did:
    ``warmup_runs`` untimed runs, ``main_runs`` timed runs and, with
    ``run_individual``, ``main_runs`` more runs timing every op. Prints a
    table (the run time, then the ops slowest first and the time per op
    type) and returns the milliseconds per run, followed by each op's mean
    milliseconds per run (in net order) when ``run_individual``."""
    return _benchmark(current_workspace(), name, warmup_runs, main_runs, run_individual)


def _benchmark(ws, name, warmup_runs, main_runs, run_individual):
    name = StringifyNetName(name)
    warmup_runs = _int64(warmup_runs, "warmup_runs", net=name)
    main_runs = _int64(main_runs, "main_runs", net=name)
    if warmup_runs < 0 or main_runs < 0:
        raise errors.InvalidArgumentError(
            f"BenchmarkNet of net '{name}': warmup_runs and main_runs must be >= 0, "
            f"got {warmup_runs} and {main_runs}")
    times, types_ = ws._core.benchmark_net(name, warmup_runs, main_runs, bool(run_individual))
    per_run = times[0]
    print(f"net '{name}': {per_run:.6f} ms per run over {main_runs} runs "
          f"({(1000.0 / per_run) if per_run else float('inf'):.1f} runs/s; {warmup_runs} warmup)")
    if run_individual:
        total = sum(times[1:])
        rows = [{"type": t, "net": name, "index": k, "calls": main_runs,
                 "total_ms": ms * main_runs, "mean_ms": ms,
                 "percent": 100.0 * ms / total if total else 0.0}
                for k, (t, ms) in enumerate(zip(types_, times[1:]))]
        rows.sort(key=lambda r: -r["mean_ms"])
        print(profiler.format_op_table(rows))
        by_type: dict[str, float] = {}
        for r in rows:
            by_type[r["type"]] = by_type.get(r["type"], 0.0) + r["mean_ms"]
        print("time per op type (ms per run):")
        for t, ms in sorted(by_type.items(), key=lambda kv: -kv[1]):
            print(f"  {t:<24} {ms:12.6f} {100.0 * ms / total if total else 0.0:6.1f}%")
    return list(times)


def RunPlanInBackground(plan_or_step):
    """Starts the plan on a background thread; the handle has ``is_done()``,
    ``is_succeeded()``, ``wait()`` and ``cancel()``."""
    if _kind_of(plan_or_step) == "step":
        plan_or_step = _plan_from_step(plan_or_step)
    return _core.run_plan_in_background(current_workspace()._core, StringifyProto(plan_or_step, proto.PlanDef))


def RegisteredOperators() -> list[str]:
    """The operator types this build can run."""
    return list(_core.registered_operators())


def GetNameScope() -> str:
    """The current name scope (the prefix of new blob names)."""
    return scope.CurrentNameScope()


# ---------------------------------------------------------- immediate mode --
#
# For debugging, as in Caffe2: between StartImmediate() and StopImmediate(),
# every operator made by core.CreateOperator (so every op a Net adds) also
# runs at once in a workspace of its own; FeedImmediate/FetchImmediate reach
# it. A failing op raises where it was created.

_IMMEDIATE_WORKSPACE = "_CAFFE2_IMMEDIATE"
_immediate_mode = False
_immediate_root_folder = ""


def IsImmediate() -> bool:
    """True between StartImmediate() and StopImmediate()."""
    return _immediate_mode


@contextlib.contextmanager
def WorkspaceGuard(workspace_name: str):
    """Makes ``workspace_name`` current (created if missing) for the
    ``with`` block, then switches back, also on an error."""
    previous = CurrentWorkspace()
    SwitchWorkspace(workspace_name, True)
    try:
        yield
    finally:
        SwitchWorkspace(previous)


def StartImmediate(i_know: bool = False) -> None:
    """Enters immediate mode with an empty immediate workspace (restarting
    it if already on). Prints a caution unless ``i_know``."""
    global _immediate_mode, _immediate_root_folder
    if _immediate_mode:
        StopImmediate()
    _immediate_root_folder = tempfile.mkdtemp(prefix="ferrocaffe-immediate-")
    with WorkspaceGuard(_IMMEDIATE_WORKSPACE):
        ResetWorkspace(_immediate_root_folder)
    _immediate_mode = True
    if not i_know:
        print(
            "Immediate mode: every operator you create also runs now, in a workspace of its own "
            "(FeedImmediate/FetchImmediate). Its inputs must exist there. This is for debugging; "
            "call StopImmediate() when done."
        )


def StopImmediate() -> None:
    """Leaves immediate mode and frees the immediate workspace."""
    global _immediate_mode, _immediate_root_folder
    if not _immediate_mode:
        return
    with WorkspaceGuard(_IMMEDIATE_WORKSPACE):
        ResetWorkspace()
    shutil.rmtree(_immediate_root_folder, ignore_errors=True)
    _immediate_root_folder = ""
    _immediate_mode = False


def ImmediateBlobs() -> list[str]:
    """The blobs of the immediate-mode workspace."""
    with WorkspaceGuard(_IMMEDIATE_WORKSPACE):
        return Blobs()


def RunOperatorImmediate(op) -> None:
    """Runs ``op`` once in the immediate-mode workspace."""
    with WorkspaceGuard(_IMMEDIATE_WORKSPACE):
        RunOperatorOnce(op)


def FetchImmediate(*args, **kwargs):
    """``FetchBlob`` in the immediate-mode workspace."""
    with WorkspaceGuard(_IMMEDIATE_WORKSPACE):
        return FetchBlob(*args, **kwargs)


def FeedImmediate(*args, **kwargs):
    """``FeedBlob`` in the immediate-mode workspace."""
    with WorkspaceGuard(_IMMEDIATE_WORKSPACE):
        return FeedBlob(*args, **kwargs)


# ------------------------------------------------ process set-up and build --
#
# ferrocaffe is a CPU-only build: the flags a CPU-only Caffe2 build exposed,
# which tests and programs read at import time.

_GLOBAL_INIT_ARGS: list[str] = []


def GlobalInit(args) -> bool:
    """Process set-up with command-line style flags (Caffe2's
    ``GlobalInit(['prog', '--caffe2_log_level=0', ...])``). The flags are
    recorded (see :func:`GetGlobalInitArgs`); none changes ferrocaffe's
    behaviour. Every element after the program name must be a ``--flag`` or
    ``--flag=value`` string (InvalidArgumentError otherwise)."""
    if isinstance(args, (str, bytes)) or not all(isinstance(a, str) for a in args):
        raise TypeError("GlobalInit takes a list of strings, the first being the program name")
    args = list(args)
    for arg in args[1:]:
        if not arg.startswith("--") or len(arg) == 2:
            raise errors.InvalidArgumentError(f"GlobalInit: '{arg}' is not a --flag or --flag=value argument")
    _GLOBAL_INIT_ARGS.extend(args[1:])
    return True


def GetGlobalInitArgs() -> list[str]:
    """The flags given to :func:`GlobalInit` so far."""
    return list(_GLOBAL_INIT_ARGS)


is_asan = False
has_cuda_support = False
has_hip_support = False
has_gpu_support = False
# No fbgemm kernels (Caffe2's fbgemm-only ops are not provided); Save's
# bfloat16 storage (BlobSerializationOptions.FLOAT_BFLOAT16), which needed
# fbgemm in Caffe2, works here regardless.
has_fbgemm = False
# As in a CPU-only Caffe2 build: code builds CUDA device options even
# without a GPU (ops placed on one are refused when a net is created).
GpuDeviceType = 1  # caffe2_pb2.CUDA


def NumCudaDevices() -> int:
    """Always 0: ferrocaffe runs on CPUs only."""
    return 0


def NumGpuDevices() -> int:
    """Always 0: ferrocaffe runs on CPUs only."""
    return 0


def GetCUDAVersion() -> int:
    """Always 0: there is no CUDA build."""
    return 0


def GetCuDNNVersion() -> int:
    """Always 0: there is no cuDNN build."""
    return 0


def GetDeviceProperties(device_id):
    """None: there are no GPU devices."""
    return None


def GetGpuPeerAccessPattern():
    """An empty pattern: there are no GPU devices."""
    return np.array([])


def GetGPUMemoryInfo():
    """None: there are no GPU devices."""
    return None


class _BlobDict:
    """``workspace.blobs``: the current workspace's blobs as a dict-like
    object (``blobs['x']`` fetches, ``blobs['x'] = arr`` feeds)."""

    def __getitem__(self, name):
        return FetchBlob(name)

    def __setitem__(self, name, value):
        FeedBlob(name, value)

    def __contains__(self, name) -> bool:
        return HasBlob(name)

    def __iter__(self):
        return iter(Blobs())

    def __len__(self) -> int:
        return len(Blobs())


blobs = _BlobDict()


class OpSchemaArgument:
    """One argument of an operator schema (``name``, ``type``, ``default``,
    ``description``, ``required``)."""

    __slots__ = ("name", "type", "default", "description", "required")

    def __init__(self, name, type_, default, description):
        self.name = name
        self.type = type_
        self.default = default
        self.description = description
        self.required = default == "required"

    def __repr__(self) -> str:
        return f"OpSchemaArgument({self.name!r}, {self.type!r})"


class OpSchema:
    """An operator's schema as Caffe2's ``C.OpSchema`` exposed it:
    ``OpSchema.get('Add')`` (None for an unknown type), with input and output
    counts, ``doc`` and ``args``."""

    #: What Caffe2 reported as an unbounded count.
    inf = 2**31 - 1

    def __init__(self, raw: dict):
        self.name = raw["name"]
        self.doc = raw["doc"]
        self.min_input = raw["min_inputs"]
        self.max_input = self.inf if raw["max_inputs"] is None else raw["max_inputs"]
        self.min_output = raw["min_outputs"]
        self.max_output = self.inf if raw["max_outputs"] is None else raw["max_outputs"]
        self.args = [OpSchemaArgument(*a) for a in raw["args"]]
        self.ignored_args = [OpSchemaArgument(*a) for a in raw.get("ignored", [])]
        self.private = False
        self.file = ""
        self.line = 0
        self.input_desc: list = []
        self.output_desc: list = []

    @staticmethod
    def get(op_type: str) -> "OpSchema | None":
        """The schema of ``op_type``, or None when no such op is registered."""
        raw = _core.operator_schema(op_type)
        return None if raw is None else OpSchema(raw)

    def num_inputs_allowed(self, n: int) -> bool:
        """Whether the op accepts ``n`` inputs."""
        return self.min_input <= n <= self.max_input

    def num_outputs_allowed(self, n: int) -> bool:
        """Whether the op accepts ``n`` outputs."""
        return self.min_output <= n <= self.max_output

    def num_inputs_outputs_allowed(self, n_in: int, n_out: int) -> bool:
        """Whether the op accepts ``n_in`` inputs with ``n_out`` outputs."""
        return self.num_inputs_allowed(n_in) and self.num_outputs_allowed(n_out)

    def __repr__(self) -> str:
        return f"OpSchema({self.name!r})"


# Caffe2 code reaches the compiled module as ``workspace.C``.
C = types.SimpleNamespace(
    Workspace=Workspace,
    Blob=Blob,
    Net=NetHandle,
    OpSchema=OpSchema,
    registered_operators=_core.registered_operators,
    operator_schema=_core.operator_schema,
    global_init=GlobalInit,
    registered_dbs=_core.registered_dbs,
    create_db=db.create_db,
    infer_shapes_and_types_from_workspace=lambda nets: _infer_from_workspace(nets),
    infer_shapes_and_types_from_map=lambda nets, dims, types=None: _infer_from_map(nets, dims, types),
    Mode=db.Mode,
    DB=db.DB,
    Transaction=db.Transaction,
    Cursor=db.Cursor,
    has_mkldnn=False,
    use_mkldnn=False,
    has_cuda_support=False,
    has_hip_support=False,
    has_gpu_support=False,
    has_fbgemm=False,
    is_asan=False,
)
