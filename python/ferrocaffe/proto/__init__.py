"""Caffe2's protobuf messages: :mod:`ferrocaffe.proto.caffe2_pb2` (real
protobuf classes made from ``rust/core/proto/caffe2.proto``, the schema the Rust
runtime is generated from too).

This package also re-exports the classes and enums of ``caffe2_pb2`` (so
``from ferrocaffe import proto; proto.NetDef()`` works), the protobuf
errors, and the limits and checks the rest of ferrocaffe shares.
"""

from __future__ import annotations

import os

from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, EncodeError, Message

from .. import errors
from ..db import open_regular
from . import caffe2_pb2
from .caffe2_pb2 import (  # noqa: F401  (re-exported)
    CPU,
    CUDA,
    HIP,
    PROTO_CPU,
    PROTO_CUDA,
    PROTO_HIP,
    Argument,
    BlobProto,
    BlobSerializationOptions,
    DBReaderProto,
    DeviceOption,
    DeviceTypeProto,
    ExecutionStep,
    NetDef,
    OperatorDef,
    PlanDef,
    QTensorProto,
    SerializationOptions,
    TensorProto,
    TensorProtos,
    TensorShape,
    TensorShapes,
)

__all__ = [
    "caffe2_pb2",
    "DecodeError",
    "EncodeError",
    "FieldDescriptor",
    "Message",
    "MAX_NESTING",
    "ReadProtoFromFile",
    "WriteProtoToBinaryFile",
    "WriteProtoToTextFile",
    "Argument",
    "BlobProto",
    "BlobSerializationOptions",
    "DBReaderProto",
    "DeviceOption",
    "DeviceTypeProto",
    "ExecutionStep",
    "NetDef",
    "OperatorDef",
    "PlanDef",
    "QTensorProto",
    "SerializationOptions",
    "TensorProto",
    "TensorProtos",
    "TensorShape",
    "TensorShapes",
]

#: How deeply messages may nest: protobuf's default recursion limit, which
#: the Rust runtime's decoder (prost) enforces too, and the bound ``core``
#: holds steps to.
MAX_NESTING = 100


def _utf8(value, what=None, **context):
    """``value`` (a str, or UTF-8 bytes) as a str that has a UTF-8 form,
    else an InvalidArgumentError (``what``: the kind of name it is, for the
    message; ``context``: the error's attributes). Every string the runtime
    keeps is UTF-8; a lone surrogate or a stray byte would otherwise
    surface later as a Unicode error."""
    label = "the {} name {!r}".format(what, value) if what else repr(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise errors.InvalidArgumentError(
                "{} is not valid UTF-8".format(label), **context) from None
    value = str(value)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise errors.InvalidArgumentError(
                "{} has no UTF-8 encoding (it holds a lone surrogate); protobuf strings, "
                "and so every blob, net, step and argument name, are UTF-8".format(label),
                **context) from None
    return value


#: File name endings read as protobuf text format first.
_TEXT_SUFFIXES = (".pbtxt", ".prototxt", ".txt")


def ReadProtoFromFile(path, message):
    """Reads the file at ``path`` into ``message`` (a NetDef, PlanDef, ...)
    and returns it: protobuf binary, or text format (Caffe2's
    ``ReadProtoFromFile`` tries both). A name ending in ``.pbtxt``,
    ``.prototxt`` or ``.txt`` is tried as text first. A file that is neither
    raises ``errors.ProtoDecodeError`` (also protobuf's ``DecodeError``)
    naming it; one that cannot be opened, or is not a regular file (a FIFO
    would block), ``errors.FerrocaffeIOError`` (``MissingFileError``, a
    ``FileNotFoundError``, when it does not exist)."""
    path = os.fspath(path)
    # A regular file only: a FIFO's open would wait for a writer forever.
    with open_regular(path) as f:
        data = f.read()

    def binary():
        message.ParseFromString(data)

    def text():
        text_format.Parse(data.decode("utf-8"), message)

    readers = (text, binary) if str(path).endswith(_TEXT_SUFFIXES) else (binary, text)
    failures = []
    for read in readers:
        try:
            read()
            return message
        except (DecodeError, text_format.ParseError, UnicodeDecodeError) as e:
            message.Clear()
            failures.append(f"as {read.__name__}: {e}")
    raise errors.ProtoDecodeError(
        "cannot read a {} from {!r}: {}".format(message.DESCRIPTOR.name, path, "; ".join(failures)),
        file=str(path))


def WriteProtoToTextFile(message, path):
    """Writes ``message`` to ``path`` in protobuf text format."""
    with open(os.fspath(path), "w", encoding="utf-8") as f:
        f.write(text_format.MessageToString(message))


def WriteProtoToBinaryFile(message, path):
    """Writes ``message`` to ``path`` serialised (protobuf binary)."""
    with open(os.fspath(path), "wb") as f:
        f.write(message.SerializeToString())
