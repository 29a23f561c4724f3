"""Helpers for protobuf messages and numpy arrays (Caffe2's
``caffe2.python.utils``): arguments, tensors and small conversions that
Caffe2 programs import from there.
"""

import functools

import numpy as np

from ferrocaffe import scope
from ferrocaffe.proto import caffe2_pb2

__all__ = [
    'OPTIMIZER_ITERATION_NAME', 'ITERATION_MUTEX_NAME', 'BuildUniqueMutexIter',
    'MakeArgument', 'ArgsToDict', 'NumpyArrayToCaffe2Tensor',
    'Caffe2TensorToNumpyArray', 'GetContentFromProto',
    'GetContentFromProtoString', 'EnumClassKeyVals', 'NCHW2NHWC', 'NHWC2NCHW',
]

_TensorProto = caffe2_pb2.TensorProto

# numpy type -> (TensorProto data type, the repeated field holding the data).
# Types narrower than 32 bits travel in int32_data, as Caffe2 stored them.
_NUMPY_TO_TENSOR = {
    np.float32: (_TensorProto.FLOAT, 'float_data'),
    np.float64: (_TensorProto.DOUBLE, 'double_data'),
    np.int32: (_TensorProto.INT32, 'int32_data'),
    np.int64: (_TensorProto.INT64, 'int64_data'),
    np.bool_: (_TensorProto.BOOL, 'int32_data'),
    np.uint8: (_TensorProto.UINT8, 'int32_data'),
    np.int8: (_TensorProto.INT8, 'int32_data'),
    np.uint16: (_TensorProto.UINT16, 'int32_data'),
    np.int16: (_TensorProto.INT16, 'int32_data'),
}

# TensorProto data type -> (numpy type, the field Caffe2 writers used).
_TENSOR_TO_NUMPY = {
    _TensorProto.FLOAT: (np.float32, 'float_data'),
    _TensorProto.DOUBLE: (np.float64, 'double_data'),
    _TensorProto.INT32: (np.int32, 'int32_data'),
    _TensorProto.INT64: (np.int64, 'int64_data'),
    _TensorProto.BOOL: (np.bool_, 'int32_data'),
    _TensorProto.UINT8: (np.uint8, 'int32_data'),
    _TensorProto.INT8: (np.int8, 'int32_data'),
    _TensorProto.UINT16: (np.uint16, 'int32_data'),
    _TensorProto.INT16: (np.int16, 'int32_data'),
    # float16 values travel as their 16-bit patterns in int32_data.
    _TensorProto.FLOAT16: (np.float16, 'int32_data'),
    _TensorProto.BYTE: (np.uint8, 'byte_data'),
}


OPTIMIZER_ITERATION_NAME = 'optimizer_iteration'
ITERATION_MUTEX_NAME = 'iteration_mutex'


def BuildUniqueMutexIter(init_net, net, iter=None, iter_mutex=None,
                         iter_val=0):
    """The iteration counter shared by the nets of a model: on first use
    ``init_net`` creates it (an int64 ``[iter_val]`` named ``iter``, default
    'optimizer_iteration') and its mutex, and ``net`` gets an ``AtomicIter``
    that advances it; later calls return the same blob."""
    iter = iter if iter is not None else OPTIMIZER_ITERATION_NAME
    iter_mutex = iter_mutex if iter_mutex is not None else ITERATION_MUTEX_NAME
    if init_net.BlobIsDefined(iter):
        return init_net.GetBlobRef(iter)
    # The counter stays on the CPU whatever device the model uses.
    cpu = caffe2_pb2.DeviceOption()
    cpu.device_type = caffe2_pb2.CPU
    cpu.device_id = 0
    cpu.extra_info.append('device_type_override:cpu')
    with scope.DeviceScope(cpu):
        iteration = init_net.ConstantFill(
            [], iter, shape=[1], value=iter_val, dtype=_TensorProto.INT64)
        mutex = init_net.CreateMutex([], [iter_mutex])
        net.AtomicIter([mutex, iteration], [iteration])
    return iteration


def MakeArgument(key, value):
    """An ``Argument`` named ``key`` holding ``value`` in the field its
    Python type selects (float -> f, int/bool -> i, str/bytes -> s, a NetDef
    -> n, another message -> s serialised, a list -> floats/ints/strings/
    nets; a float32 ndarray -> floats)."""
    # The one documented lazy import of core (docs/python.md): the
    # encoding lives with core's op building, its hot path, and core
    # imports this module (Caffe2's ``core.utils``).
    from ferrocaffe import core
    return core._MakeArgument(key, value)


def ArgsToDict(args):
    """``{name: value}`` of a list of ``Argument`` messages, each value taken
    from the one field that is set (an empty repeated field gives [])."""
    result = {}
    for arg in args:
        value = None
        for field in ('f', 'i', 's', 'n'):
            if arg.HasField(field):
                value = getattr(arg, field)
                break
        else:
            for field in ('floats', 'ints', 'strings', 'nets', 'tensors'):
                if len(getattr(arg, field)):
                    value = list(getattr(arg, field))
                    break
            else:
                value = []
        result[arg.name] = value
    return result


def NumpyArrayToCaffe2Tensor(arr, name=None):
    """A ``TensorProto`` holding a copy of ``arr`` (dims, data type and the
    data field Caffe2 used for that type); strings go to ``string_data``.
    Raises TypeError for a dtype a TensorProto cannot carry."""
    arr = np.asarray(arr)
    tensor = _TensorProto()
    tensor.dims.extend(int(d) for d in arr.shape)
    if name:
        tensor.name = name
    if arr.dtype.kind in ('S', 'U', 'O'):
        tensor.data_type = _TensorProto.STRING
        tensor.string_data.extend(
            v.encode('utf-8') if isinstance(v, str) else bytes(v)
            for v in arr.flatten().tolist())
        return tensor
    if arr.dtype == np.float16:
        tensor.data_type = _TensorProto.FLOAT16
        tensor.int32_data.extend(
            arr.flatten().view(np.uint16).astype(np.int32).tolist())
        return tensor
    try:
        data_type, field = _NUMPY_TO_TENSOR[arr.dtype.type]
    except KeyError:
        raise TypeError(
            'cannot make a TensorProto of a numpy array of dtype %s' %
            arr.dtype)
    tensor.data_type = data_type
    values = arr.flatten()
    if values.dtype == np.bool_:  # int32_data holds ints; protobuf refuses bools
        values = values.astype(np.int32)
    getattr(tensor, field).extend(values.tolist())
    return tensor


def Caffe2TensorToNumpyArray(tensor):
    """A numpy array of a ``TensorProto``'s data, shaped by its dims: from
    the field Caffe2 used for its data type, or from ``raw_data``
    (little-endian) when that is set.  Raises TypeError for a data type
    without a numpy equivalent and ValueError when the element count does
    not match the dims."""
    dims = tuple(int(d) for d in tensor.dims)
    data_type = tensor.data_type
    if data_type == _TensorProto.STRING:
        values = np.empty(len(tensor.string_data), dtype=object)
        values[:] = list(tensor.string_data)
        return _shaped(values, dims, tensor)
    try:
        np_type, field = _TENSOR_TO_NUMPY[data_type]
    except KeyError:
        raise TypeError(
            'TensorProto data type %d has no numpy equivalent' % data_type)
    if tensor.HasField('raw_data'):
        values = np.frombuffer(
            tensor.raw_data, dtype=np.dtype(np_type).newbyteorder('<'))
        return _shaped(values.astype(np_type), dims, tensor)
    if field == 'byte_data':
        values = np.frombuffer(tensor.byte_data, dtype=np.uint8).copy()
    elif data_type == _TensorProto.FLOAT16:
        values = np.asarray(tensor.int32_data, dtype=np.int32).astype(
            np.uint16).view(np.float16)
    else:
        values = np.asarray(getattr(tensor, field)).astype(np_type)
    return _shaped(values, dims, tensor)


def _shaped(values, dims, tensor):
    expected = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if values.size != expected:
        raise ValueError(
            'TensorProto %r holds %d values, but its dims %s need %d' % (
                tensor.name, values.size, list(dims), expected))
    return values.reshape(dims)


def GetContentFromProto(obj, function_map):
    """Calls the function of ``function_map`` keyed by the field set in the
    oneof-like message ``obj`` (the first field listed whose value is set)
    and returns its result, or None when none is set."""
    for field, function in function_map.items():
        if obj.HasField(field):
            return function(getattr(obj, field))
    return None


def GetContentFromProtoString(serialized, function_map):
    """:func:`GetContentFromProto` of an ``Argument`` parsed from bytes."""
    arg = caffe2_pb2.Argument()
    arg.ParseFromString(serialized)
    return GetContentFromProto(arg, function_map)


def EnumClassKeyVals(cls):
    """``{name: value}`` of a class used as an enum: its upper-case
    attributes."""
    return {k: v for k, v in vars(cls).items()
            if k.isupper() and not k.startswith('_')}


def NCHW2NHWC(tensor):
    """The array with its channel axis (1) moved last: (N, C, *spatial) ->
    (N, *spatial, C); a view, as numpy's transpose gives."""
    if tensor.ndim < 2:
        raise ValueError(f"NCHW2NHWC needs at least 2 dims (N, C, ...), got shape {tensor.shape}")
    return tensor.transpose((0,) + tuple(range(2, tensor.ndim)) + (1,))


def NHWC2NCHW(tensor):
    """The array with its last axis (channels) moved to axis 1: (N,
    *spatial, C) -> (N, C, *spatial); a view."""
    if tensor.ndim < 1:
        raise ValueError("NHWC2NCHW needs at least 1 dim, got a scalar")
    return tensor.transpose((0, tensor.ndim - 1) + tuple(range(1, tensor.ndim - 1)))


def debug(f):
    """Caffe2's decorator that opened a post-mortem debugger when ``f``
    raised (its DebugMode); here ``f`` runs unchanged and its exception
    propagates (tests and scripts are not interactive)."""
    @functools.wraps(f)
    def run(*args, **kwargs):
        return f(*args, **kwargs)

    return run
