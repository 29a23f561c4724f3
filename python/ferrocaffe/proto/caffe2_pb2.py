"""Caffe2's protobuf messages (``caffe2_pb2``) as real protobuf classes.

The schema is ``rust/core/proto/caffe2.proto``, its only copy: the build compiles it
into the extension as a serialised ``FileDescriptorSet``
(``_core.CAFFE2_FILE_DESCRIPTOR_SET``), from which the Rust runtime's types
were generated too. This module loads it into a descriptor pool of its own
and makes the classes with ``message_factory``, so they are what
``protoc --python_out`` would give: ``CopyFrom``, ``MergeFrom``,
``SerializeToString``, ``text_format`` and reflection all work, at the speed
of the ``protobuf`` package's C implementation.

A pool of our own (not the default one) keeps these classes from clashing
with another ``caffe2.proto`` a program may load (Caffe2's own build, or a
different version of it).
"""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import enum_type_wrapper

from .. import _core

_pool = descriptor_pool.DescriptorPool()
for _file in descriptor_pb2.FileDescriptorSet.FromString(_core.CAFFE2_FILE_DESCRIPTOR_SET).file:
    _pool.Add(_file)

DESCRIPTOR = _pool.FindFileByName("caffe2.proto")

TensorProto = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["TensorProto"])
QTensorProto = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["QTensorProto"])
TensorProtos = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["TensorProtos"])
TensorShape = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["TensorShape"])
TensorShapes = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["TensorShapes"])
Argument = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["Argument"])
DeviceOption = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["DeviceOption"])
OperatorDef = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["OperatorDef"])
MapFieldEntry = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["MapFieldEntry"])
BackendOptions = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["BackendOptions"])
PartitionInfo = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["PartitionInfo"])
NetDef = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["NetDef"])
ExecutionStep = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["ExecutionStep"])
PlanDef = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["PlanDef"])
BlobProto = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["BlobProto"])
DBReaderProto = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["DBReaderProto"])
BlobSerializationOptions = message_factory.GetMessageClass(
    DESCRIPTOR.message_types_by_name["BlobSerializationOptions"])
SerializationOptions = message_factory.GetMessageClass(
    DESCRIPTOR.message_types_by_name["SerializationOptions"])

DeviceTypeProto = enum_type_wrapper.EnumTypeWrapper(DESCRIPTOR.enum_types_by_name["DeviceTypeProto"])
# A generated module exposes a top-level enum's values as module attributes
# (PROTO_CPU); Caffe2 adds each device type without its prefix too (CPU).
for _value in DeviceTypeProto.DESCRIPTOR.values:
    globals()[_value.name] = _value.number
    globals()[_value.name[len("PROTO_"):]] = _value.number

_missing = set(DESCRIPTOR.message_types_by_name) - set(globals())
assert not _missing, f"caffe2.proto messages without a class here: {sorted(_missing)}"
del _file, _value, _missing
