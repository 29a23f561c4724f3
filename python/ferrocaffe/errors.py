"""ferrocaffe's exception tree.

Every error raised by the runtime is an instance of :class:`FerrocaffeError`,
which is a ``RuntimeError`` (Caffe2's C++ failures reached Python as
``RuntimeError``, and code written for Caffe2 catches that), and also of the
builtin exception a Python user would naturally catch: a missing blob is a
``KeyError``, a wrong dtype a ``TypeError``, a malformed plan a ``ValueError``,
a file that cannot be read an ``OSError``.

Each error carries where it happened, as attributes (``None`` when unknown):
``op`` (the operator type), ``op_index`` (its position in the net), ``net``,
``step``, ``blob`` and ``file``, and ``node`` for an error raised on a node
of a distributed session. The message names them too.
"""

from __future__ import annotations

import errno as _errno
import os as _os

from google.protobuf.message import DecodeError as _DecodeError

__all__ = [
    "FerrocaffeError",
    "BlobNotFoundError",
    "NetNotFoundError",
    "WorkspaceNotFoundError",
    "DataTypeError",
    "FeedError",
    "ShapeError",
    "InvalidArgumentError",
    "UnknownOperatorError",
    "InvalidPlanError",
    "IndexOutOfRangeError",
    "DivisionByZeroError",
    "OperatorError",
    "PlanFailedError",
    "CancelledError",
    "FerrocaffeIOError",
    "MissingFileError",
    "ProtoDecodeError",
    "CorruptCheckpointError",
    "OutOfMemoryError",
    "InternalError",
    "NodeFailedError",
    "CollectiveError",
    "CollectiveTimeoutError",
    "SessionClosedError",
    "OutputNotReadyError",
    "ConversionError",
    "UnsupportedOperatorError",
]


class FerrocaffeError(RuntimeError):
    """Base class of every ferrocaffe error; a ``RuntimeError``, as Caffe2's
    errors were."""

    op: str | None = None
    op_index: int | None = None
    net: str | None = None
    step: str | None = None
    blob: str | None = None
    file: str | None = None
    #: The TaskGroup node an error came from (distributed sessions only).
    node: str | None = None

    def __init__(self, message: str = "", **context):
        super().__init__(message)
        self.message = message
        for key, value in context.items():
            setattr(self, key, value)

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.message


class BlobNotFoundError(FerrocaffeError, KeyError):
    """A blob name that is not visible in the workspace."""


class NetNotFoundError(FerrocaffeError, KeyError):
    """A net name that was never created in the workspace."""


class WorkspaceNotFoundError(FerrocaffeError, KeyError):
    """A named workspace that does not exist."""


class DataTypeError(FerrocaffeError, TypeError):
    """A blob of the wrong kind, or a tensor of the wrong dtype."""


class FeedError(DataTypeError):
    """An object that cannot be fed into a blob."""


class ShapeError(FerrocaffeError, ValueError):
    """Tensor shapes that do not fit together."""


class InvalidArgumentError(FerrocaffeError, ValueError):
    """A bad operator argument, or wrong input/output counts."""


class UnknownOperatorError(InvalidArgumentError):
    """An operator type that is not registered."""


class InvalidPlanError(FerrocaffeError, ValueError):
    """A malformed net, execution step or plan."""


class IndexOutOfRangeError(FerrocaffeError, IndexError):
    """An index outside a tensor's bounds."""


class DivisionByZeroError(FerrocaffeError, ZeroDivisionError):
    """Integer division by zero inside an operator."""


class OperatorError(FerrocaffeError):
    """An operator failed while running."""


class PlanFailedError(OperatorError):
    """A net, step or plan reported failure (an op returned false)."""


class CancelledError(FerrocaffeError):
    """A run was cancelled by a user (not by Ctrl-C, which raises KeyboardInterrupt)."""


class FerrocaffeIOError(FerrocaffeError, OSError):
    """A file could not be read or written (``filename`` names it, as an
    ``OSError``'s does)."""

    def __init__(self, message: str = "", **context):
        super().__init__(message, **context)
        if self.filename is None and self.file is not None:
            self.filename = self.file


class MissingFileError(FerrocaffeIOError, FileNotFoundError):
    """A file or db that does not exist (also a ``FileNotFoundError``;
    ``errno`` is ``ENOENT``)."""

    def __init__(self, message: str = "", **context):
        super().__init__(message, **context)
        if self.errno is None:
            self.errno = _errno.ENOENT
        if self.strerror is None:
            self.strerror = _os.strerror(_errno.ENOENT)


class ProtoDecodeError(InvalidPlanError, _DecodeError):
    """Bytes, or a file, that hold no protobuf message of the expected type
    (also protobuf's ``DecodeError``, which code written for Caffe2 caught)."""


def io_error(e: OSError, path=None, what: str = "") -> FerrocaffeIOError:
    """``e`` (an ``OSError`` of ``open`` or ``stat``) as a ferrocaffe error
    naming ``path``: a ``MissingFileError`` when it does not exist, else a
    ``FerrocaffeIOError``; ``errno``, ``strerror`` and ``filename`` kept.
    ``what``: what the file is, for the message ("the plan file")."""
    path = e.filename if path is None else path
    cls = MissingFileError if e.errno == _errno.ENOENT else FerrocaffeIOError
    reason = e.strerror or str(e)
    err = cls(f"{what + ' ' if what else ''}{path!r}: {reason}", file=str(path))
    err.errno, err.strerror, err.filename = e.errno, e.strerror, path
    return err


class CorruptCheckpointError(FerrocaffeError, ValueError):
    """A checkpoint or db file failed verification."""


class OutOfMemoryError(FerrocaffeError, MemoryError):
    """A tensor or buffer the system could not allocate (the op, net and
    blob are named; the workspace stays usable)."""


class InternalError(FerrocaffeError):
    """A bug in ferrocaffe (a caught Rust panic). Please report it."""


class NodeFailedError(FerrocaffeError):
    """A node of a distributed session could not be started, or its process
    died (the node's workspace is lost with it)."""


class CollectiveError(FerrocaffeError, ConnectionError):
    """A collective (``Allreduce``, ``Broadcast``, ``Allgather``,
    ``Barrier``, or the meeting of ``CreateCommonWorld``) failed: a member
    died or destroyed the common world. Besides the usual attributes it
    names ``collective`` (the op type), ``common_world`` (its blob) and the
    member at fault: ``node`` and ``rank``. A ``ConnectionError``, as Gloo's
    ``IoError`` was an I/O failure."""

    collective: str | None = None
    common_world: str | None = None
    rank: int | None = None
    # The runtime adds the op, its index, the net and the step it ran in.
    _wants_op_context = True


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A member of a common world did not reach a collective within the
    world's ``timeout_ms``; ``node`` and ``rank`` name it."""


class SessionClosedError(FerrocaffeError, RuntimeError):
    """A Session was used after ``close()`` (Caffe2 asserted, so under
    ``python -O`` a closed session ran)."""


class OutputNotReadyError(FerrocaffeError, RuntimeError):
    """A task output was read before a session ran its task, or fetched
    when no session can fetch it."""


class ConversionError(FerrocaffeError, ValueError):
    """A net or model that cannot be converted between Caffe2 and ONNX
    (``ferrocaffe.onnx``); the message names the op (type and position),
    the net or graph, and the blob at fault."""


class UnsupportedOperatorError(ConversionError, NotImplementedError):
    """An operator with no conversion: a Caffe2 op the ONNX frontend cannot
    express in ONNX, or an ONNX op (or attribute value) the backend cannot
    express with ferrocaffe's ops."""


# Used by the compiled module to pick a class for each Rust error kind.
_BY_KIND = {
    "BlobNotFound": BlobNotFoundError,
    "NetNotFound": NetNotFoundError,
    "Type": DataTypeError,
    "Shape": ShapeError,
    "InvalidArgument": InvalidArgumentError,
    "UnknownOperator": UnknownOperatorError,
    "InvalidPlan": InvalidPlanError,
    "IndexOutOfRange": IndexOutOfRangeError,
    "DivisionByZero": DivisionByZeroError,
    "OperatorFailed": OperatorError,
    "Cancelled": CancelledError,
    "Io": FerrocaffeIOError,
    "MissingFile": MissingFileError,  # an Io error whose file does not exist
    "CorruptCheckpoint": CorruptCheckpointError,
    "OutOfMemory": OutOfMemoryError,
    "Internal": InternalError,
}
