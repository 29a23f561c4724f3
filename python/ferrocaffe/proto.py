"""Caffe2's protobuf messages (``caffe2_pb2``) in plain Python.

The classes here have Caffe2's message and field names, field numbers and
proto2 presence rules, and speak the protobuf wire format, so that what they
serialise is what the Rust runtime (``rust/ir.rs``) decodes, and what Caffe2
itself would read. They implement the part of the protobuf-python message API
that Caffe2 code uses: keyword construction, field attributes with
``HasField``/``ClearField`` and defaults, repeated fields that behave like
lists, sub-messages created on first access, ``CopyFrom``/``MergeFrom``,
``SerializeToString``/``ParseFromString``/``FromString``, ``ListFields`` and
``str()`` in protobuf text format.

Differences from protobuf-python, all deliberate:

* unknown fields met while parsing are dropped, not kept for re-serialising;
* enum fields accept any int32 (the runtime treats them as plain integers);
* bytes fields also accept ``str`` (encoded as UTF-8); they read back as bytes;
* there is no text-format parser and no reflection beyond ``DESCRIPTOR``.
"""

from __future__ import annotations

import math
import numbers
import struct
from array import array
from collections.abc import MutableSequence
from operator import index as _index

from . import errors

__all__ = [
    "DecodeError",
    "EncodeError",
    "Message",
    "FieldDescriptor",
    "Descriptor",
    "EnumTypeWrapper",
    "TensorProto",
    "TensorProtos",
    "Argument",
    "DeviceOption",
    "OperatorDef",
    "NetDef",
    "ExecutionStep",
    "PlanDef",
    "BlobProto",
    "DBReaderProto",
    "DeviceTypeProto",
]


class DecodeError(errors.FerrocaffeError, ValueError):
    """The bytes given to ``ParseFromString`` are not a valid message."""


class EncodeError(errors.FerrocaffeError, ValueError):
    """A message cannot be serialised (a required field is missing, or it
    nests too deeply)."""


#: How deeply messages may nest below the one serialised, parsed, copied,
#: compared or printed: protobuf's default recursion limit, which the Rust
#: runtime's decoder (prost) enforces too. Deeper messages give a typed
#: error here rather than a RecursionError (the walks are recursive).
MAX_NESTING = 100


def _too_deep(cls, what):
    return cls(
        "cannot {} a message nested more than {} levels deep (protobuf's limit)".format(
            what, MAX_NESTING))


# ----------------------------------------------------------------- enums --


class EnumTypeWrapper:
    """A protobuf enum: ``Name(number)``, ``Value(name)``, ``items()``, and
    attribute access to the values (``TensorProto.DataType.FLOAT``)."""

    def __init__(self, name, pairs):
        self._name = name
        self._by_name = dict(pairs)
        self._by_number = {}
        for key, number in pairs:
            self._by_number.setdefault(number, key)

    def Name(self, number):
        try:
            return self._by_number[number]
        except (KeyError, TypeError):
            raise ValueError(
                "Enum {} has no name defined for value {!r}".format(self._name, number)
            ) from None

    def Value(self, name):
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            raise ValueError(
                "Enum {} has no value defined for name {!r}".format(self._name, name)
            ) from None

    def keys(self):
        return list(self._by_name)

    def values(self):
        return list(self._by_name.values())

    def items(self):
        return list(self._by_name.items())

    def __getattr__(self, name):
        try:
            return self.__dict__["_by_name"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self):
        return "<EnumTypeWrapper {}>".format(self._name)


_DATA_TYPES = [
    ("UNDEFINED", 0),
    ("FLOAT", 1),
    ("INT32", 2),
    ("BYTE", 3),
    ("STRING", 4),
    ("BOOL", 5),
    ("UINT8", 6),
    ("INT8", 7),
    ("UINT16", 8),
    ("INT16", 9),
    ("INT64", 10),
    ("FLOAT16", 12),
    ("DOUBLE", 13),
    ("ZERO_COLLISION_HASH", 14),
    ("REBATCHING_BUFFER", 15),
]
_STORAGE_TYPES = [("TYPED", 1), ("RAW", 2), ("EXTERNAL", 3), ("NO_CONTENT", 4)]
_DEVICE_TYPES = [
    ("PROTO_CPU", 0),
    ("PROTO_CUDA", 1),
    ("PROTO_MKLDNN", 2),
    ("PROTO_OPENGL", 3),
    ("PROTO_OPENCL", 4),
    ("PROTO_IDEEP", 5),
    ("PROTO_HIP", 6),
    ("PROTO_FPGA", 7),
    ("PROTO_MAIA", 8),
    ("PROTO_XLA", 9),
    ("PROTO_MPS", 10),
    ("PROTO_COMPILE_TIME_MAX_DEVICE_TYPES", 11),
]

DeviceTypeProto = EnumTypeWrapper("DeviceTypeProto", _DEVICE_TYPES)
# caffe2_pb2 exposes the device types both with and without the PROTO_ prefix.
for _key, _number in _DEVICE_TYPES:
    globals()[_key] = _number
    globals()[_key[len("PROTO_"):]] = _number
del _key, _number


# ------------------------------------------------------------ descriptors --


class FieldDescriptor:
    """What protobuf reflection tells about a field (the useful subset)."""

    TYPE_DOUBLE = 1
    TYPE_FLOAT = 2
    TYPE_INT64 = 3
    TYPE_UINT64 = 4
    TYPE_INT32 = 5
    TYPE_BOOL = 8
    TYPE_STRING = 9
    TYPE_MESSAGE = 11
    TYPE_BYTES = 12
    TYPE_UINT32 = 13
    TYPE_ENUM = 14

    CPPTYPE_INT32 = 1
    CPPTYPE_INT64 = 2
    CPPTYPE_UINT32 = 3
    CPPTYPE_UINT64 = 4
    CPPTYPE_DOUBLE = 5
    CPPTYPE_FLOAT = 6
    CPPTYPE_BOOL = 7
    CPPTYPE_ENUM = 8
    CPPTYPE_STRING = 9
    CPPTYPE_MESSAGE = 10

    LABEL_OPTIONAL = 1
    LABEL_REQUIRED = 2
    LABEL_REPEATED = 3

    def __init__(self, name, number, kind, label, default, packed, full_name):
        self.name = name
        self.number = number
        self.kind = kind
        self.type = _KIND_TYPE[kind]
        self.cpp_type = _KIND_CPPTYPE[kind]
        self.label = label
        self.default_value = [] if label == self.LABEL_REPEATED else default
        self.has_default_value = False
        self.packed = packed
        self.full_name = full_name
        self.message_type = None  # a Descriptor, for message fields
        self.enum_type = None  # an EnumTypeWrapper, for enum fields
        self.containing_type = None
        self.index = 0

    def __repr__(self):
        return "<FieldDescriptor {}>".format(self.full_name)


class Descriptor:
    """A message type's reflection: its name and fields."""

    def __init__(self, name, full_name, fields, concrete_class):
        self.name = name
        self.full_name = full_name
        self.fields = list(fields)
        self.fields_by_name = {f.name: f for f in fields}
        self.fields_by_number = {f.number: f for f in fields}
        self._concrete_class = concrete_class
        self.enum_types_by_name = {}
        self.nested_types_by_name = {}
        self.oneofs = []

    def __repr__(self):
        return "<Descriptor {}>".format(self.full_name)


_KIND_TYPE = {
    "double": FieldDescriptor.TYPE_DOUBLE,
    "float": FieldDescriptor.TYPE_FLOAT,
    "int64": FieldDescriptor.TYPE_INT64,
    "uint64": FieldDescriptor.TYPE_UINT64,
    "int32": FieldDescriptor.TYPE_INT32,
    "bool": FieldDescriptor.TYPE_BOOL,
    "string": FieldDescriptor.TYPE_STRING,
    "message": FieldDescriptor.TYPE_MESSAGE,
    "bytes": FieldDescriptor.TYPE_BYTES,
    "uint32": FieldDescriptor.TYPE_UINT32,
    "enum": FieldDescriptor.TYPE_ENUM,
}
_KIND_CPPTYPE = {
    "double": FieldDescriptor.CPPTYPE_DOUBLE,
    "float": FieldDescriptor.CPPTYPE_FLOAT,
    "int64": FieldDescriptor.CPPTYPE_INT64,
    "uint64": FieldDescriptor.CPPTYPE_UINT64,
    "int32": FieldDescriptor.CPPTYPE_INT32,
    "bool": FieldDescriptor.CPPTYPE_BOOL,
    "string": FieldDescriptor.CPPTYPE_STRING,
    "message": FieldDescriptor.CPPTYPE_MESSAGE,
    "bytes": FieldDescriptor.CPPTYPE_STRING,
    "uint32": FieldDescriptor.CPPTYPE_UINT32,
    "enum": FieldDescriptor.CPPTYPE_ENUM,
}

# Wire types.
_VARINT, _FIXED64, _LENGTH, _START_GROUP, _END_GROUP, _FIXED32 = 0, 1, 2, 3, 4, 5
_KIND_WIRETYPE = {
    "double": _FIXED64,
    "float": _FIXED32,
    "int64": _VARINT,
    "uint64": _VARINT,
    "int32": _VARINT,
    "uint32": _VARINT,
    "bool": _VARINT,
    "enum": _VARINT,
    "string": _LENGTH,
    "bytes": _LENGTH,
    "message": _LENGTH,
}
_NUMERIC = frozenset(["double", "float", "int64", "uint64", "int32", "uint32", "bool", "enum"])


# ---------------------------------------------------------- type checks --

_F32 = struct.Struct("<f")
_INT_RANGES = {
    "int32": (-(1 << 31), (1 << 31) - 1),
    "enum": (-(1 << 31), (1 << 31) - 1),
    "uint32": (0, (1 << 32) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "uint64": (0, (1 << 64) - 1),
}


def _type_error(value, expected):
    return TypeError(
        "{!r} has type {}, but expected one of: {}".format(value, type(value).__name__, expected)
    )


def _is_ndarray(value):
    t = type(value)
    return t.__name__ == "ndarray" and t.__module__ == "numpy"


def _make_int_check(kind, field):
    lo, hi = _INT_RANGES[kind]

    def check(value):
        if type(value) is int:
            n = value
        else:
            if not hasattr(value, "__index__") or _is_ndarray(value):
                raise _type_error(value, "int")
            n = _index(value)
        if n < lo or n > hi:
            raise errors.InvalidArgumentError(
                "Value out of range: {} (field {} is {}, [{}, {}])".format(n, field, kind, lo, hi))
        return n

    return check


def _check_float(value):
    if type(value) is not float:
        if not isinstance(value, numbers.Real):
            raise _type_error(value, "int, float")
        value = float(value)
    try:
        return _F32.unpack(_F32.pack(value))[0]
    except OverflowError:  # protobuf saturates out-of-range floats to inf
        return math.inf if value > 0 else -math.inf


def _check_double(value):
    if type(value) is float:
        return value
    if not isinstance(value, numbers.Real):
        raise _type_error(value, "int, float")
    return float(value)


def _check_bool(value):
    if type(value) is bool:
        return value
    if hasattr(value, "__index__") and not _is_ndarray(value):
        return bool(_index(value))
    t = type(value)
    if t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"):  # no __index__
        return bool(value)
    raise _type_error(value, "bool, int")


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


def _check_string(value):
    if isinstance(value, str):
        return _utf8(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise errors.InvalidArgumentError(
                "{!r} has type bytes, but isn't valid UTF-8 encoding. Non-UTF-8 strings "
                "must be converted to unicode objects before being added.".format(value)
            ) from None
    raise _type_error(value, "bytes, str")


def _check_bytes(value):
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        return _utf8(value).encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise _type_error(value, "bytes, str")


def _checker(kind, field):
    if kind in _INT_RANGES:
        return _make_int_check(kind, field)
    return {
        "float": _check_float,
        "double": _check_double,
        "bool": _check_bool,
        "string": _check_string,
        "bytes": _check_bytes,
    }[kind]


# -------------------------------------------------------------- wire out --
#
# Each message class gets an encoder and a decoder generated from its field
# table (see _compile below): straight-line code with the tags as constants is
# several times faster than a generic loop, which matters for nets of
# thousands of ops. The generic _decode_field handles everything the fast path
# does not expect (unknown fields, packed/unpacked variants, odd wire types).

_SMALL_VARINTS = [bytes((i,)) for i in range(128)]


def _varint(n):
    if n < 128:
        if n >= 0:
            return _SMALL_VARINTS[n]
        n += 1 << 64  # negative ints are sign-extended to 64 bits
    out = bytearray()
    while n > 127:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _MissingRequired(EncodeError):
    pass


def _missing_required(msg, names):
    raise _MissingRequired(
        "Message {} is missing required fields: {}".format(
            type(msg).DESCRIPTOR.full_name, ",".join(n for n in names if n not in msg._values)
        )
    )


# --------------------------------------------------------------- wire in --


def _read_varint(data, pos):
    result = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 128:
            return result, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("Too many bytes when decoding varint.")


def _skip_field(data, pos, end, wire_type, number):
    if wire_type == _VARINT:
        _, pos = _read_varint(data, pos)
    elif wire_type == _FIXED64:
        pos += 8
    elif wire_type == _FIXED32:
        pos += 4
    elif wire_type == _LENGTH:
        n, pos = _read_varint(data, pos)
        pos += n
    elif wire_type == _START_GROUP:
        while True:
            if pos >= end:
                raise DecodeError("Unterminated group.")
            tag, pos = _read_varint(data, pos)
            if tag & 7 == _END_GROUP:
                if tag >> 3 != number:
                    raise DecodeError("Mismatched end-group tag.")
                break
            pos = _skip_field(data, pos, end, tag & 7, tag >> 3)
    else:
        raise DecodeError("Tag had invalid wire type.")
    if pos > end:
        raise DecodeError("Truncated message.")
    return pos


def _signed64(v):
    v &= 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >= (1 << 63) else v


def _signed32(v):
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


_VARINT_CONVERT = {
    "int64": _signed64,
    "int32": _signed32,
    "enum": _signed32,
    "uint32": lambda v: v & 0xFFFFFFFF,
    "uint64": lambda v: v & 0xFFFFFFFFFFFFFFFF,
    "bool": bool,
}


def _container(msg, name):
    c = msg._values.get(name)
    if c is None:
        c = getattr(msg, name)
    return c


def _present_child(msg, name, cls):
    """The sub-message ``name`` of ``msg``, made present (adopting a lazily
    created child, so that references to it stay valid)."""
    lazy = msg._lazy
    sub = lazy.pop(name, None) if lazy else None
    if sub is None:
        sub = cls()
    else:
        sub._parent = None
    msg._values[name] = sub
    return sub


def _decode_field(msg, data, pos, end, tag, depth):
    """Decodes one field whose tag has been read; returns the new position.
    ``depth``: how deeply ``msg`` is nested in the message being parsed."""
    number = tag >> 3
    wire_type = tag & 7
    if number == 0:
        raise DecodeError("Field number 0 is illegal.")
    fd = type(msg)._by_number.get(number)
    if fd is None:
        return _skip_field(data, pos, end, wire_type, number)
    kind = fd.kind
    name = fd.name
    repeated = fd.label == FieldDescriptor.LABEL_REPEATED
    expected = _KIND_WIRETYPE[kind]
    if wire_type == _LENGTH and kind in _NUMERIC and repeated:
        # A packed run of numbers (accepted whatever the declaration).
        n, pos = _read_varint(data, pos)
        stop = pos + n
        if stop > end:
            raise DecodeError("Truncated message.")
        items = _container(msg, name)._items
        if kind == "float" or kind == "double":
            size = 4 if kind == "float" else 8
            if n % size:
                raise DecodeError("Packed field length is not a multiple of its size.")
            code = "<%d%s" % (n // size, "f" if kind == "float" else "d")
            items.extend(struct.unpack_from(code, data, pos))
            return stop
        convert = _VARINT_CONVERT[kind]
        while pos < stop:
            v, pos = _read_varint(data, pos)
            items.append(convert(v))
        if pos != stop:
            raise DecodeError("Truncated packed field.")
        return stop
    if wire_type != expected:
        # protobuf treats a field with an unexpected wire type as unknown
        return _skip_field(data, pos, end, wire_type, number)
    if expected == _VARINT:
        v, pos = _read_varint(data, pos)
        v = _VARINT_CONVERT[kind](v)
    elif expected == _FIXED32:
        if pos + 4 > end:
            raise DecodeError("Truncated message.")
        v = _F32.unpack_from(data, pos)[0]
        pos += 4
    elif expected == _FIXED64:
        if pos + 8 > end:
            raise DecodeError("Truncated message.")
        v = struct.unpack_from("<d", data, pos)[0]
        pos += 8
    else:
        n, pos = _read_varint(data, pos)
        stop = pos + n
        if stop > end:
            raise DecodeError("Truncated message.")
        if kind == "message":
            if depth >= MAX_NESTING:
                raise _too_deep(DecodeError, "parse")
            if repeated:
                sub = fd._sub_cls()
                _container(msg, name)._items.append(sub)
            else:
                sub = msg._values.get(name)
                if sub is None:
                    sub = _present_child(msg, name, fd._sub_cls)
            fd._sub_cls._decode_fields(sub, data, pos, stop, depth + 1)
            return stop
        if kind == "string":
            v = str(data[pos:stop], "utf-8")
        else:
            v = data[pos:stop]
        pos = stop
    if repeated:
        _container(msg, name)._items.append(v)
    else:
        msg._values[name] = v
    return pos


# ------------------------------------------------------- code generation --


class _Code:
    def __init__(self):
        self.lines = []
        self.depth = 0

    def __call__(self, line):
        self.lines.append("    " * self.depth + line)

    def indent(self):
        self.depth += 1

    def dedent(self):
        self.depth -= 1


def _emit_varint_append(code, expr, out="out"):
    code("{o} += SMALL[{e}] if 0 <= {e} < 128 else _varint({e})".format(o=out, e=expr))


def _emit_encoder(cls, code):
    fields = cls.DESCRIPTOR.fields
    code("def _enc_{}(msg, out, partial, depth=0):".format(cls.__name__))
    code.indent()
    code("values = msg._values")
    if cls._required:
        cond = " or ".join("{!r} not in values".format(n) for n in cls._required)
        code("if not partial and ({}):".format(cond))
        code("    _missing_required(msg, {!r})".format(cls._required))
    code("if not values:")
    code("    return")
    code("get = values.get")
    for fd in fields:
        kind = fd.kind
        repeated = fd.label == FieldDescriptor.LABEL_REPEATED
        tag = _varint((fd.number << 3) | _KIND_WIRETYPE[kind])
        ptag = _varint((fd.number << 3) | _LENGTH)
        code("v = get({!r})".format(fd.name))
        code("if v is not None:")
        code.indent()
        if repeated:
            if fd.packed:
                code("items = v._items")
                code("if items:")
                code.indent()
                if kind in ("float", "double"):
                    letter = "f" if kind == "float" else "d"
                    code("payload = struct.pack('<%d{}' % len(items), *items)".format(letter))
                else:
                    code("payload = b''.join([SMALL[x] if 0 <= x < 128 else _varint(x) for x in items])")
                code("n = len(payload)")
                code("out += {!r}".format(ptag))
                _emit_varint_append(code, "n")
                code("out += payload")
                code.dedent()
                code.dedent()
                continue
            code("for x in v._items:")
            code.indent()
        item = "x" if repeated else "v"
        if kind == "message":
            code("if depth >= MAX_NESTING:")
            code("    raise TOO_DEEP(EncodeError, 'serialise')")
            code("sub = bytearray()")
            code("_enc_{}({}, sub, partial, depth + 1)".format(fd._sub_cls.__name__, item))
            code("n = len(sub)")
            code("out += {!r}".format(tag))
            _emit_varint_append(code, "n")
            code("out += sub")
        elif kind in ("string", "bytes"):
            code("b = {}.encode('utf-8')".format(item) if kind == "string" else "b = " + item)
            code("n = len(b)")
            code("out += {!r}".format(tag))
            _emit_varint_append(code, "n")
            code("out += b")
        elif kind == "float":
            code("out += {!r}".format(tag))
            code("out += PACK_F({})".format(item))
        elif kind == "double":
            code("out += {!r}".format(tag))
            code("out += PACK_D({})".format(item))
        else:
            code("out += {!r}".format(tag))
            _emit_varint_append(code, item)
        if repeated:
            code.dedent()
        code.dedent()
    code.dedent()
    code("")


def _emit_length(code):
    code("n = data[pos]")
    code("if n < 128:")
    code("    pos += 1")
    code("else:")
    code("    n, pos = _read_varint(data, pos)")
    code("stop = pos + n")
    code("if stop > end:")
    code("    raise DecodeError('Truncated message.')")


def _emit_append(code, name, expr):
    code("c = values.get({!r})".format(name))
    code("if c is None:")
    code("    c = _container(msg, {!r})".format(name))
    code("c._items.append({})".format(expr))


def _emit_decoder(cls, code):
    code("def _dec_{}(msg, data, pos, end, depth=0):".format(cls.__name__))
    code.indent()
    code("values = msg._values")
    code("while pos < end:")
    code.indent()
    code("tag = data[pos]")
    code("if tag < 128:")
    code("    pos += 1")
    code("else:")
    code("    tag, pos = _read_varint(data, pos)")
    first = True
    for fd in cls.DESCRIPTOR.fields:
        kind = fd.kind
        name = fd.name
        repeated = fd.label == FieldDescriptor.LABEL_REPEATED
        if repeated and fd.packed:
            continue  # packed runs go through _decode_field
        tag = (fd.number << 3) | _KIND_WIRETYPE[kind]
        code("{} tag == {}:".format("if" if first else "elif", tag))
        first = False
        code.indent()
        if kind == "message":
            code("if depth >= MAX_NESTING:")
            code("    raise TOO_DEEP(DecodeError, 'parse')")
            _emit_length(code)
            sub_cls = fd._sub_cls.__name__
            if repeated:
                code("sub = {}()".format(sub_cls))
                _emit_append(code, name, "sub")
            else:
                code("sub = values.get({!r})".format(name))
                code("if sub is None:")
                code("    sub = _present_child(msg, {!r}, {})".format(name, sub_cls))
            code("_dec_{}(sub, data, pos, stop, depth + 1)".format(sub_cls))
            code("pos = stop")
        else:
            if kind in ("string", "bytes"):
                _emit_length(code)
                if kind == "string":
                    code("v = str(data[pos:stop], 'utf-8')")
                else:
                    code("v = data[pos:stop]")
                code("pos = stop")
            elif kind == "float":
                code("if pos + 4 > end:")
                code("    raise DecodeError('Truncated message.')")
                code("v = UNPACK_F(data, pos)[0]")
                code("pos += 4")
            elif kind == "double":
                code("if pos + 8 > end:")
                code("    raise DecodeError('Truncated message.')")
                code("v = UNPACK_D(data, pos)[0]")
                code("pos += 8")
            else:
                code("v = data[pos]")
                code("if v < 128:")
                code("    pos += 1")
                code("else:")
                code("    v, pos = _read_varint(data, pos)")
                if kind != "bool":
                    code("    v = CONVERT_{}(v)".format(kind))
                if kind == "bool":
                    code("v = v != 0")
            if repeated:
                _emit_append(code, name, "v")
            else:
                code("values[{!r}] = v".format(name))
        code.dedent()
    if first:
        code("pos = _decode_field(msg, data, pos, end, tag, depth)")
    else:
        code("else:")
        code("    pos = _decode_field(msg, data, pos, end, tag, depth)")
    code.dedent()
    code("if pos != end:")
    code("    raise DecodeError('Truncated message.')")
    code.dedent()
    code("")


def _compile(classes):
    namespace = {
        "SMALL": _SMALL_VARINTS,
        "_varint": _varint,
        "_read_varint": _read_varint,
        "_container": _container,
        "_present_child": _present_child,
        "_decode_field": _decode_field,
        "_missing_required": _missing_required,
        "DecodeError": DecodeError,
        "EncodeError": EncodeError,
        "MAX_NESTING": MAX_NESTING,
        "TOO_DEEP": _too_deep,
        "struct": struct,
        "PACK_F": struct.Struct("<f").pack,
        "PACK_D": struct.Struct("<d").pack,
        "UNPACK_F": struct.Struct("<f").unpack_from,
        "UNPACK_D": struct.Struct("<d").unpack_from,
    }
    for kind, convert in _VARINT_CONVERT.items():
        namespace["CONVERT_" + kind] = convert
    code = _Code()
    for cls in classes:
        namespace[cls.__name__] = cls
        _emit_encoder(cls, code)
        _emit_decoder(cls, code)
    source = "\n".join(code.lines)
    exec(compile(source, "<ferrocaffe.proto generated codecs>", "exec"), namespace)
    for cls in classes:
        cls._encode_fields = staticmethod(namespace["_enc_" + cls.__name__])
        cls._decode_fields = staticmethod(namespace["_dec_" + cls.__name__])
    return source


# ------------------------------------------------------------ text format --

_ESCAPES = []
for _c in range(256):
    if _c == 9:
        _ESCAPES.append(r"\t")
    elif _c == 10:
        _ESCAPES.append(r"\n")
    elif _c == 13:
        _ESCAPES.append(r"\r")
    elif _c == 34:
        _ESCAPES.append(r"\"")
    elif _c == 39:
        _ESCAPES.append(r"\'")
    elif _c == 92:
        _ESCAPES.append("\\\\")
    elif 32 <= _c < 127:
        _ESCAPES.append(chr(_c))
    else:
        _ESCAPES.append("\\%03o" % _c)
del _c


def _c_escape(data):
    return "".join([_ESCAPES[c] for c in data])


def _shortest_float(value):
    """The shortest decimal that reads back as the same float32."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    precision = 6
    while True:
        rounded = float("{0:.{1}g}".format(value, precision))
        if _check_float(rounded) == value or precision >= 17:
            return str(rounded)
        precision += 1


def _text_value(fd, value):
    kind = fd.kind
    if kind == "string":
        return '"' + _c_escape(value.encode("utf-8")) + '"'
    if kind == "bytes":
        return '"' + _c_escape(value) + '"'
    if kind == "bool":
        return "true" if value else "false"
    if kind == "float":
        return _shortest_float(value)
    if kind == "double":
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if kind == "enum":
        name = fd.enum_type._by_number.get(value)
        return name if name is not None else str(value)
    return str(value)


def _text(msg, indent, lines):
    if indent > 2 * MAX_NESTING:
        raise _too_deep(errors.InvalidArgumentError, "print")
    pad = " " * indent
    for fd, value in msg.ListFields():
        if fd.label == FieldDescriptor.LABEL_REPEATED:
            items = value._items
        else:
            items = (value,)
        for item in items:
            if fd.kind == "message":
                lines.append(pad + fd.name + " {\n")
                _text(item, indent + 2, lines)
                lines.append(pad + "}\n")
            else:
                lines.append(pad + fd.name + ": " + _text_value(fd, item) + "\n")


# ------------------------------------------------------------- containers --


class RepeatedScalarFieldContainer(MutableSequence):
    """A repeated scalar field: a type-checked list."""

    __slots__ = ("_items", "_check", "_owner")

    def __init__(self, owner, check):
        self._items = []
        self._check = check
        self._owner = owner

    def _changed(self):
        if self._owner._parent is not None:
            self._owner._modified()

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def __contains__(self, value):
        return value in self._items

    def __getitem__(self, key):
        return self._items[key]

    def __setitem__(self, key, value):
        if isinstance(key, slice):
            self._items[key] = [self._check(v) for v in value]
        else:
            self._items[key] = self._check(value)
        self._changed()

    def __delitem__(self, key):
        del self._items[key]
        self._changed()

    def insert(self, key, value):
        self._items.insert(key, self._check(value))
        self._changed()

    def append(self, value):
        self._items.append(self._check(value))
        self._changed()

    def extend(self, values):
        if values is None:
            return
        check = self._check
        if check is _check_float and not isinstance(values, (str, bytes)):
            # one bulk float32 rounding (saturating to inf, like protobuf)
            values = list(values)
            for v in values:
                if type(v) is not float:
                    check(v)  # raises on a non-number
            new = array("f", [float(v) for v in values]).tolist()
        else:
            new = [check(v) for v in values]
        if new:
            self._items.extend(new)
        self._changed()

    def remove(self, value):
        self._items.remove(value)
        self._changed()

    def pop(self, key=-1):
        value = self._items.pop(key)
        self._changed()
        return value

    def clear(self):
        del self._items[:]
        self._changed()

    def sort(self, *args, **kwargs):
        if "sort_function" in kwargs:  # the legacy protobuf keyword
            kwargs["cmp"] = kwargs.pop("sort_function")
        self._items.sort(*args, **kwargs)

    def reverse(self):
        self._items.reverse()

    def MergeFrom(self, other):
        self.extend(other)

    def __eq__(self, other):
        if self is other:
            return True
        if isinstance(other, RepeatedScalarFieldContainer):
            return self._items == other._items
        return other == self._items

    __hash__ = None

    def __repr__(self):
        return repr(self._items)

    def __deepcopy__(self, memo=None):
        return list(self._items)


class RepeatedCompositeFieldContainer(MutableSequence):
    """A repeated message field. Elements are owned: ``append``/``extend``
    add copies, ``add()`` creates one in place."""

    __slots__ = ("_items", "_cls", "_owner")

    def __init__(self, owner, cls):
        self._items = []
        self._cls = cls
        self._owner = owner

    def _changed(self):
        if self._owner._parent is not None:
            self._owner._modified()

    def _copy_of(self, value):
        if isinstance(value, dict):
            return self._cls(**value)
        if not isinstance(value, self._cls):
            raise TypeError(
                "Parameter to add/append must be instance of {}, got {}".format(
                    self._cls.__name__, type(value).__name__
                )
            )
        return value._deepcopy()

    def add(self, **kwargs):
        new = self._cls(**kwargs)
        self._items.append(new)
        self._changed()
        return new

    def append(self, value):
        self._items.append(self._copy_of(value))
        self._changed()

    def insert(self, key, value):
        self._items.insert(key, self._copy_of(value))
        self._changed()

    def extend(self, values):
        if values is None:
            return
        self._items.extend([self._copy_of(v) for v in values])
        self._changed()

    def MergeFrom(self, other):
        self.extend(other)

    def remove(self, value):
        self._items.remove(value)
        self._changed()

    def pop(self, key=-1):
        value = self._items.pop(key)
        self._changed()
        return value

    def clear(self):
        del self._items[:]
        self._changed()

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def __getitem__(self, key):
        return self._items[key]

    def __setitem__(self, key, value):
        raise TypeError(
            "Does not support assignment to repeated message fields; use add(), "
            "append() or CopyFrom() on the element."
        )

    def __delitem__(self, key):
        del self._items[key]
        self._changed()

    def sort(self, *args, **kwargs):
        if "sort_function" in kwargs:
            kwargs["cmp"] = kwargs.pop("sort_function")
        self._items.sort(*args, **kwargs)

    def reverse(self):
        self._items.reverse()

    def __eq__(self, other):
        if self is other:
            return True
        if isinstance(other, RepeatedCompositeFieldContainer):
            return self._items == other._items
        if isinstance(other, (list, tuple)):
            return self._items == list(other)
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return repr(self._items)

    def __deepcopy__(self, memo=None):
        return [m._deepcopy() for m in self._items]


# ---------------------------------------------------------------- message --

_SCALAR, _REPEATED_SCALAR, _REPEATED_MESSAGE, _MESSAGE = 0, 1, 2, 3


def _unpickle(cls, data):
    msg = cls()
    msg.MergeFromString(data)
    return msg


class Message:
    """Base of every message class. Values live in ``_values`` (present
    scalars, repeated containers, present sub-messages); sub-messages read but
    not yet written live in ``_lazy`` and become present when modified."""

    __slots__ = ("_values", "_lazy", "_parent")

    DESCRIPTOR = None
    _required = ()
    _by_number = {}
    _kinds = {}

    def __init__(self, **kwargs):
        self._values = {}
        self._lazy = None
        self._parent = None
        if kwargs:
            self._init_fields(kwargs)

    def _init_fields(self, kwargs):
        fields = self.DESCRIPTOR.fields_by_name
        kinds = self._kinds
        for name, value in kwargs.items():
            if name not in fields:
                raise ValueError(
                    'Protocol message {} has no "{}" field.'.format(type(self).__name__, name)
                )
            if value is None:
                continue
            kind = kinds[name]
            if kind == _SCALAR:
                setattr(self, name, value)
            elif kind == _MESSAGE:
                sub = getattr(self, name)
                if isinstance(value, dict):
                    sub._init_fields(value)
                    sub._modified()
                else:
                    sub.CopyFrom(value)
            else:
                getattr(self, name).extend(value)

    # -- presence bookkeeping

    def _modified(self):
        """Makes this (lazily created) sub-message present in its parent."""
        link = self._parent
        if link is not None:
            self._parent = None
            parent, name = link
            lazy = parent._lazy
            if lazy is not None and lazy.get(name) is self:
                del lazy[name]
            parent._values[name] = self
            if parent._parent is not None:
                parent._modified()

    def _detach_lazy(self):
        lazy = self._lazy
        if lazy:
            for child in lazy.values():
                child._parent = None
        self._lazy = None

    # -- field access

    def HasField(self, field_name):
        kind = self._kinds.get(field_name)
        if kind is None:
            raise ValueError(
                'Protocol message {} has no field "{}".'.format(type(self).__name__, field_name)
            )
        if kind == _REPEATED_SCALAR or kind == _REPEATED_MESSAGE:
            raise ValueError(
                'Protocol message has no singular "{}" field.'.format(field_name)
            )
        return field_name in self._values

    def ClearField(self, field_name):
        if field_name not in self._kinds:
            raise ValueError(
                'Protocol message {} has no "{}" field.'.format(type(self).__name__, field_name)
            )
        self._values.pop(field_name, None)
        lazy = self._lazy
        if lazy and field_name in lazy:
            lazy.pop(field_name)._parent = None
        if self._parent is not None:
            self._modified()

    def Clear(self):
        self._detach_lazy()
        self._values = {}
        if self._parent is not None:
            self._modified()

    def SetInParent(self):
        if self._parent is not None:
            self._modified()

    def ListFields(self):
        by_name = self.DESCRIPTOR.fields_by_name
        kinds = self._kinds
        out = []
        for name, value in self._values.items():
            kind = kinds[name]
            if (kind == _REPEATED_SCALAR or kind == _REPEATED_MESSAGE) and not value._items:
                continue
            out.append((by_name[name], value))
        out.sort(key=lambda pair: pair[0].number)
        return out

    def IsInitialized(self):
        return not self.FindInitializationErrors()

    def FindInitializationErrors(self):
        errors = []
        self._find_missing("", errors, 0)
        return errors

    def _find_missing(self, prefix, errors, depth):
        if depth > MAX_NESTING:
            raise _too_deep(EncodeError, "check")
        values = self._values
        for name in self._required:
            if name not in values:
                errors.append(prefix + name)
        kinds = self._kinds
        for name, value in values.items():
            kind = kinds[name]
            if kind == _MESSAGE:
                value._find_missing(prefix + name + ".", errors, depth + 1)
            elif kind == _REPEATED_MESSAGE:
                for i, m in enumerate(value._items):
                    m._find_missing("{}{}[{}].".format(prefix, name, i), errors, depth + 1)

    def WhichOneof(self, oneof_group):
        raise ValueError('Protocol message has no oneof "{}" field.'.format(oneof_group))

    def DiscardUnknownFields(self):
        pass

    # -- copying and merging

    def _merge(self, other, depth=0):
        if depth > MAX_NESTING:
            raise _too_deep(errors.InvalidArgumentError, "copy")
        kinds = self._kinds
        values = self._values
        for name, value in other._values.items():
            kind = kinds[name]
            if kind == _SCALAR:
                values[name] = value
            elif kind == _REPEATED_SCALAR:
                if value._items:
                    _container(self, name)._items.extend(value._items)
            elif kind == _REPEATED_MESSAGE:
                if value._items:
                    _container(self, name)._items.extend(
                        [m._deepcopy(depth + 1) for m in value._items])
            else:
                sub = values.get(name)
                if sub is None:
                    sub = getattr(self, name)  # may be a lazy child
                    sub._modified()
                sub._merge(value, depth + 1)

    def _deepcopy(self, depth=0):
        new = type(self)()
        new._merge(self, depth)
        return new

    def MergeFrom(self, other):
        if type(other) is not type(self):
            raise TypeError(
                "Parameter to MergeFrom() must be instance of same class: expected {} got {}.".format(
                    type(self).__name__, type(other).__name__
                )
            )
        if other is self:
            other = self._deepcopy()
        self._merge(other)
        if self._parent is not None:
            self._modified()

    def CopyFrom(self, other):
        if other is self:
            return
        if type(other) is not type(self):
            raise TypeError(
                "Parameter to CopyFrom() must be instance of same class: expected {} got {}.".format(
                    type(self).__name__, type(other).__name__
                )
            )
        self._detach_lazy()
        self._values = {}
        self._merge(other)
        if self._parent is not None:
            self._modified()

    def __deepcopy__(self, memo=None):
        return self._deepcopy()

    def __copy__(self):
        return self._deepcopy()

    def __reduce__(self):
        return (_unpickle, (type(self), self.SerializePartialToString()))

    # -- comparison and printing

    def _present(self):
        kinds = self._kinds
        out = {}
        for name, value in self._values.items():
            kind = kinds[name]
            if kind == _REPEATED_SCALAR or kind == _REPEATED_MESSAGE:
                if value._items:
                    out[name] = value._items
            else:
                out[name] = value
        return out

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, Message):
            return NotImplemented
        if type(other) is not type(self):
            return False
        return self._equal(other, 0)

    def _equal(self, other, depth):
        """Field-by-field equality, sub-messages compared with a nesting
        bound (a plain ``==`` of nested values recurses without one)."""
        if depth > MAX_NESTING:
            raise _too_deep(errors.InvalidArgumentError, "compare")
        mine, theirs = self._present(), other._present()
        if mine.keys() != theirs.keys():
            return False
        kinds = self._kinds
        for name, a in mine.items():
            b = theirs[name]
            kind = kinds[name]
            if kind == _MESSAGE:
                if not a._equal(b, depth + 1):
                    return False
            elif kind == _REPEATED_MESSAGE:
                if len(a) != len(b) or not all(x._equal(y, depth + 1) for x, y in zip(a, b)):
                    return False
            elif not (a is b or a == b):  # as dict equality compares values
                return False
        return True

    __hash__ = None

    def __str__(self):
        lines = []
        _text(self, 0, lines)
        return "".join(lines)

    __repr__ = __str__

    # -- wire format

    def SerializeToString(self, deterministic=None):
        out = bytearray()
        try:
            type(self)._encode_fields(self, out, False)
        except _MissingRequired:
            raise EncodeError(
                "Message {} is missing required fields: {}".format(
                    self.DESCRIPTOR.full_name, ",".join(self.FindInitializationErrors())
                )
            ) from None
        return bytes(out)

    def SerializePartialToString(self, deterministic=None):
        out = bytearray()
        type(self)._encode_fields(self, out, True)
        return bytes(out)

    def ByteSize(self):
        return len(self.SerializePartialToString())

    def MergeFromString(self, serialized):
        if isinstance(serialized, str):
            raise TypeError("memoryview: a bytes-like object is required, not 'str'")
        data = bytes(serialized)
        try:
            type(self)._decode_fields(self, data, 0, len(data))
        except (IndexError, struct.error):
            raise DecodeError("Truncated message.") from None
        except UnicodeDecodeError:
            raise DecodeError("A string field holds invalid UTF-8.") from None
        if self._parent is not None:
            self._modified()
        return len(data)

    def ParseFromString(self, serialized):
        self.Clear()
        return self.MergeFromString(serialized)

    @classmethod
    def FromString(cls, serialized):
        msg = cls()
        msg.MergeFromString(serialized)
        return msg


# ---------------------------------------------------------- field access --


def _scalar_property(name, default, check):
    def getter(self):
        return self._values.get(name, default)

    def setter(self, value):
        self._values[name] = check(value)
        if self._parent is not None:
            self._modified()

    return property(getter, setter, doc="optional field {!r}".format(name))


def _forbid_assignment(name):
    def setter(self, value):
        raise AttributeError(
            'Assignment not allowed to field "{}" in protocol message object.'.format(name)
        )

    return setter


def _repeated_scalar_property(name, check):
    def getter(self):
        c = self._values.get(name)
        if c is None:
            c = self._values[name] = RepeatedScalarFieldContainer(self, check)
        return c

    return property(getter, _forbid_assignment(name), doc="repeated field {!r}".format(name))


def _repeated_message_property(name, fd):
    def getter(self):
        c = self._values.get(name)
        if c is None:
            c = self._values[name] = RepeatedCompositeFieldContainer(self, fd._sub_cls)
        return c

    return property(getter, _forbid_assignment(name), doc="repeated field {!r}".format(name))


def _message_property(name, fd):
    def getter(self):
        m = self._values.get(name)
        if m is not None:
            return m
        lazy = self._lazy
        if lazy is None:
            lazy = self._lazy = {}
        else:
            m = lazy.get(name)
            if m is not None:
                return m
        m = fd._sub_cls()
        m._parent = (self, name)
        lazy[name] = m
        return m

    return property(getter, _forbid_assignment(name), doc="optional field {!r}".format(name))


_DEFAULTS = {
    "double": 0.0,
    "float": 0.0,
    "int64": 0,
    "uint64": 0,
    "int32": 0,
    "uint32": 0,
    "bool": False,
    "string": "",
    "bytes": b"",
    "enum": 0,
}
_LABELS = {
    "optional": FieldDescriptor.LABEL_OPTIONAL,
    "required": FieldDescriptor.LABEL_REQUIRED,
    "repeated": FieldDescriptor.LABEL_REPEATED,
}


def _define(cls, full_name, spec):
    """Installs fields on a message class. ``spec`` rows are
    ``(name, number, label, kind[, option])`` where option is the default
    value, the sub-message class name, the EnumTypeWrapper, or "packed"."""
    fields = []
    for row in spec:
        name, number, label, kind = row[:4]
        option = row[4] if len(row) > 4 else None
        packed = option == "packed"
        default = _DEFAULTS.get(kind)
        if kind not in ("message", "enum") and option is not None and not packed:
            default = option
        fd = FieldDescriptor(
            name, number, kind, _LABELS[label], default, packed, full_name + "." + name
        )
        if kind == "enum":
            fd.enum_type = option[0]
            default = fd.default_value = option[1]
        fd.has_default_value = default != _DEFAULTS.get(kind)
        fd._sub_cls = option if kind == "message" else None  # a name until resolved
        fields.append(fd)
    fields.sort(key=lambda f: f.number)
    for i, fd in enumerate(fields):
        fd.index = i
    cls.DESCRIPTOR = Descriptor(cls.__name__, full_name, fields, cls)
    cls._pending = True


def _resolve(classes):
    by_name = {c.__name__: c for c in classes}
    for cls in classes:
        kinds = {}
        required = []
        for fd in cls.DESCRIPTOR.fields:
            fd.containing_type = cls.DESCRIPTOR
            name = fd.name
            repeated = fd.label == FieldDescriptor.LABEL_REPEATED
            if fd.kind == "message":
                fd._sub_cls = by_name[fd._sub_cls]
                fd.message_type = fd._sub_cls.DESCRIPTOR
                if repeated:
                    prop = _repeated_message_property(name, fd)
                    kinds[name] = _REPEATED_MESSAGE
                else:
                    prop = _message_property(name, fd)
                    kinds[name] = _MESSAGE
            elif repeated:
                prop = _repeated_scalar_property(name, _checker(fd.kind, fd.full_name))
                kinds[name] = _REPEATED_SCALAR
            else:
                prop = _scalar_property(name, fd.default_value, _checker(fd.kind, fd.full_name))
                kinds[name] = _SCALAR
            if fd.label == FieldDescriptor.LABEL_REQUIRED:
                required.append(name)
            setattr(cls, name, prop)
            setattr(cls, name.upper() + "_FIELD_NUMBER", fd.number)
        cls._kinds = kinds
        cls._required = tuple(required)
        cls._by_number = dict(cls.DESCRIPTOR.fields_by_number)
        del cls._pending
    _compile(classes)


# --------------------------------------------------------------- messages --


class TensorProto(Message):
    """A serialised tensor: dims, data type and one of the data fields."""

    __slots__ = ()
    DataType = EnumTypeWrapper("DataType", _DATA_TYPES)
    StorageType = EnumTypeWrapper("StorageType", _STORAGE_TYPES)


for _key, _number in _DATA_TYPES + _STORAGE_TYPES:
    setattr(TensorProto, _key, _number)
del _key, _number


class _Segment(Message):
    """Where a chunk of a tensor goes in the whole (``begin``/``end`` on dim 0)."""

    __slots__ = ()


_Segment.__name__ = "Segment"
_Segment.__qualname__ = "TensorProto.Segment"
TensorProto.Segment = _Segment


class TensorProtos(Message):
    """Several TensorProtos in one message."""

    __slots__ = ()


class Argument(Message):
    """A named operator argument holding one kind of value."""

    __slots__ = ()


class DeviceOption(Message):
    """Where an operator runs, and its random seed."""

    __slots__ = ()


class OperatorDef(Message):
    """One operator: type, inputs, outputs, arguments."""

    __slots__ = ()


class NetDef(Message):
    """A network: an ordered list of operators plus its external blobs."""

    __slots__ = ()


class ExecutionStep(Message):
    """A step of a plan: nets or substeps, run under iteration rules."""

    __slots__ = ()


class PlanDef(Message):
    """A plan: the nets it uses and the steps that run them."""

    __slots__ = ()


class BlobProto(Message):
    """A serialised blob: a tensor, or typed opaque content."""

    __slots__ = ()


class DBReaderProto(Message):
    """A serialised DB reader."""

    __slots__ = ()


_DATA_TYPE_ENUM = (TensorProto.DataType, 1)

_define(TensorProto, "caffe2.TensorProto", [
    ("dims", 1, "repeated", "int64"),
    ("data_type", 2, "optional", "enum", _DATA_TYPE_ENUM),
    ("float_data", 3, "repeated", "float", "packed"),
    ("int32_data", 4, "repeated", "int32", "packed"),
    ("byte_data", 5, "optional", "bytes"),
    ("string_data", 6, "repeated", "bytes"),
    ("name", 7, "optional", "string"),
    ("device_detail", 8, "optional", "message", "DeviceOption"),
    ("double_data", 9, "repeated", "double", "packed"),
    ("int64_data", 10, "repeated", "int64", "packed"),
    ("segment", 11, "optional", "message", "Segment"),
    ("storage_type", 12, "optional", "enum", (TensorProto.StorageType, 1)),
    ("raw_data", 13, "optional", "bytes"),
    ("data_format", 15, "optional", "uint32"),
])
_define(_Segment, "caffe2.TensorProto.Segment", [
    ("begin", 1, "required", "int64"),
    ("end", 2, "required", "int64"),
])
_define(TensorProtos, "caffe2.TensorProtos", [
    ("protos", 1, "repeated", "message", "TensorProto"),
])
_define(Argument, "caffe2.Argument", [
    ("name", 1, "optional", "string"),
    ("f", 2, "optional", "float"),
    ("i", 3, "optional", "int64"),
    ("s", 4, "optional", "bytes"),
    ("floats", 5, "repeated", "float"),
    ("ints", 6, "repeated", "int64"),
    ("strings", 7, "repeated", "bytes"),
    ("n", 8, "optional", "message", "NetDef"),
    ("nets", 9, "repeated", "message", "NetDef"),
    ("t", 10, "optional", "message", "TensorProto"),
    ("tensors", 11, "repeated", "message", "TensorProto"),
])
_define(DeviceOption, "caffe2.DeviceOption", [
    ("device_type", 1, "optional", "int32"),
    ("device_id", 2, "optional", "int32"),
    ("random_seed", 3, "optional", "uint32"),
    ("node_name", 4, "optional", "string"),
    ("numa_node_id", 5, "optional", "int32"),
    ("extra_info", 6, "repeated", "string"),
])
_define(OperatorDef, "caffe2.OperatorDef", [
    ("input", 1, "repeated", "string"),
    ("output", 2, "repeated", "string"),
    ("name", 3, "optional", "string"),
    ("type", 4, "optional", "string"),
    ("arg", 5, "repeated", "message", "Argument"),
    ("device_option", 6, "optional", "message", "DeviceOption"),
    ("engine", 7, "optional", "string"),
    ("control_input", 8, "repeated", "string"),
    ("is_gradient_op", 9, "optional", "bool"),
    ("debug_info", 10, "optional", "string"),
    ("domain", 11, "optional", "string"),
    ("op_version", 12, "optional", "int64"),
])
_define(NetDef, "caffe2.NetDef", [
    ("name", 1, "optional", "string"),
    ("op", 2, "repeated", "message", "OperatorDef"),
    ("type", 3, "optional", "string"),
    ("num_workers", 4, "optional", "int32"),
    ("device_option", 5, "optional", "message", "DeviceOption"),
    ("arg", 6, "repeated", "message", "Argument"),
    ("external_input", 7, "repeated", "string"),
    ("external_output", 8, "repeated", "string"),
])
_define(ExecutionStep, "caffe2.ExecutionStep", [
    ("name", 1, "optional", "string"),
    ("substep", 2, "repeated", "message", "ExecutionStep"),
    ("network", 3, "repeated", "string"),
    ("num_iter", 4, "optional", "int64"),
    ("criteria_network", 5, "optional", "string"),
    ("concurrent_substeps", 6, "optional", "bool"),
    ("report_net", 7, "optional", "string"),
    ("report_interval", 8, "optional", "int32"),
    ("should_stop_blob", 9, "optional", "string"),
    ("only_once", 10, "optional", "bool"),
    ("run_every_ms", 11, "optional", "int64"),
    ("create_workspace", 12, "optional", "bool"),
    ("num_concurrent_instances", 13, "optional", "int32"),
])
_define(PlanDef, "caffe2.PlanDef", [
    ("name", 1, "optional", "string"),
    ("network", 2, "repeated", "message", "NetDef"),
    ("execution_step", 3, "repeated", "message", "ExecutionStep"),
])
_define(BlobProto, "caffe2.BlobProto", [
    ("name", 1, "optional", "string"),
    ("type", 2, "optional", "string"),
    ("tensor", 3, "optional", "message", "TensorProto"),
    ("content", 4, "optional", "bytes"),
    ("content_num_chunks", 6, "optional", "int32"),
    ("content_chunk_id", 7, "optional", "int32"),
])
_define(DBReaderProto, "caffe2.DBReaderProto", [
    ("name", 1, "optional", "string"),
    ("source", 2, "optional", "string"),
    ("db_type", 3, "optional", "string"),
    ("key", 4, "optional", "string"),
])

_resolve([
    TensorProto,
    _Segment,
    TensorProtos,
    Argument,
    DeviceOption,
    OperatorDef,
    NetDef,
    ExecutionStep,
    PlanDef,
    BlobProto,
    DBReaderProto,
])
TensorProto.DESCRIPTOR.enum_types_by_name = {
    "DataType": TensorProto.DataType,
    "StorageType": TensorProto.StorageType,
}
TensorProto.DESCRIPTOR.nested_types_by_name = {"Segment": _Segment.DESCRIPTOR}
