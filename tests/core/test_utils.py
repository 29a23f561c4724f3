"""Tests of ferrocaffe.utils (Caffe2's caffe2.python.utils helpers) and of
feeding a TensorProto, which goes through them."""

import numpy as np
import pytest

from ferrocaffe import errors, utils, workspace
from ferrocaffe import proto as caffe2_pb2

TP = caffe2_pb2.TensorProto


@pytest.mark.parametrize('dtype, data_type, field', [
    (np.float32, TP.FLOAT, 'float_data'),
    (np.float64, TP.DOUBLE, 'double_data'),
    (np.int32, TP.INT32, 'int32_data'),
    (np.int64, TP.INT64, 'int64_data'),
    (np.uint8, TP.UINT8, 'int32_data'),
    (np.int8, TP.INT8, 'int32_data'),
    (np.int16, TP.INT16, 'int32_data'),
    (np.uint16, TP.UINT16, 'int32_data'),
])
def test_numeric_arrays_go_to_caffe2s_field_and_back(dtype, data_type, field):
    values = [[1, 2, 3], [4, 5, 6]]
    tensor = utils.NumpyArrayToCaffe2Tensor(np.array(values, dtype=dtype), 'w')
    assert list(tensor.dims) == [2, 3]
    assert tensor.data_type == data_type
    assert tensor.name == 'w'
    assert list(getattr(tensor, field)) == [1, 2, 3, 4, 5, 6]
    back = utils.Caffe2TensorToNumpyArray(tensor)
    assert back.dtype == dtype and back.shape == (2, 3)
    assert back.tolist() == values


def test_bool_and_string_tensors():
    tensor = utils.NumpyArrayToCaffe2Tensor(np.array([True, False, True]))
    assert tensor.data_type == TP.BOOL
    assert list(tensor.int32_data) == [1, 0, 1]
    assert utils.Caffe2TensorToNumpyArray(tensor).tolist() == [True, False, True]
    strings = utils.NumpyArrayToCaffe2Tensor(np.array(['ab', 'é']))
    assert strings.data_type == TP.STRING
    assert list(strings.string_data) == [b'ab', 'é'.encode('utf-8')]
    assert utils.Caffe2TensorToNumpyArray(strings).tolist() == [b'ab', 'é'.encode()]


def test_float16_travels_as_bit_patterns():
    tensor = utils.NumpyArrayToCaffe2Tensor(np.array([1.0, -2.0], np.float16))
    assert tensor.data_type == TP.FLOAT16
    # IEEE half: 1.0 is 0x3C00, -2.0 is 0xC000.
    assert list(tensor.int32_data) == [0x3C00, 0xC000]
    back = utils.Caffe2TensorToNumpyArray(tensor)
    assert back.dtype == np.float16 and back.tolist() == [1.0, -2.0]


def test_raw_data_and_byte_data_are_read():
    tensor = TP()
    tensor.dims.extend([2])
    tensor.data_type = TP.INT32
    tensor.raw_data = (7).to_bytes(4, 'little') + (-3).to_bytes(4, 'little', signed=True)
    assert utils.Caffe2TensorToNumpyArray(tensor).tolist() == [7, -3]
    byte_tensor = TP()
    byte_tensor.dims.extend([3])
    byte_tensor.data_type = TP.BYTE
    byte_tensor.byte_data = b'\x01\x02\xff'
    assert utils.Caffe2TensorToNumpyArray(byte_tensor).tolist() == [1, 2, 255]


def test_a_scalar_tensor_has_no_dims():
    tensor = utils.NumpyArrayToCaffe2Tensor(np.float32(2.5))
    assert list(tensor.dims) == []
    assert utils.Caffe2TensorToNumpyArray(tensor).shape == ()


def test_mismatched_counts_and_unknown_types_are_refused():
    tensor = TP()
    tensor.dims.extend([3])
    tensor.data_type = TP.FLOAT
    tensor.float_data.extend([1.0, 2.0])
    with pytest.raises(ValueError, match='holds 2 values'):
        utils.Caffe2TensorToNumpyArray(tensor)
    tensor.data_type = TP.ZERO_COLLISION_HASH
    with pytest.raises(TypeError):
        utils.Caffe2TensorToNumpyArray(tensor)
    with pytest.raises(TypeError):
        utils.NumpyArrayToCaffe2Tensor(np.array([1 + 2j]))


def test_feeding_a_tensor_proto_feeds_its_values():
    ws = workspace.Workspace()
    tensor = TP()
    tensor.dims.extend([2, 2])
    tensor.data_type = TP.INT64
    tensor.int64_data.extend([1, 2, 3, 4])
    ws.feed_blob('t', tensor)
    got = ws.fetch_blob('t')
    assert got.dtype == np.int64 and got.tolist() == [[1, 2], [3, 4]]
    tensor.int64_data.append(5)
    with pytest.raises(errors.FerrocaffeError) as info:
        ws.feed_blob('t', tensor)
    assert isinstance(info.value, ValueError)
    assert info.value.blob == 't'
    assert ws.fetch_blob('t').tolist() == [[1, 2], [3, 4]]


def test_make_argument_and_args_to_dict():
    args = [utils.MakeArgument('f', 0.5), utils.MakeArgument('i', 3),
            utils.MakeArgument('s', 'text'), utils.MakeArgument('ints', [1, 2]),
            utils.MakeArgument('floats', [0.5, 1.5]),
            utils.MakeArgument('strings', ['a', b'b'])]
    assert utils.ArgsToDict(args) == {
        'f': 0.5, 'i': 3, 's': b'text', 'ints': [1, 2], 'floats': [0.5, 1.5],
        'strings': [b'a', b'b']}
    empty = caffe2_pb2.Argument()
    empty.name = 'nothing'
    assert utils.ArgsToDict([empty]) == {'nothing': []}


def test_get_content_from_proto_calls_the_set_fields_function():
    functions = {'i': lambda v: ('int', v), 'f': lambda v: ('float', v)}
    arg = utils.MakeArgument('x', 2.0)
    assert utils.GetContentFromProto(arg, functions) == ('float', 2.0)
    serialized = utils.MakeArgument('y', 7).SerializeToString()
    assert utils.GetContentFromProtoString(serialized, functions) == ('int', 7)
    assert utils.GetContentFromProto(caffe2_pb2.Argument(), functions) is None


def test_enum_class_key_vals():
    class Colours:
        RED = 1
        GREEN = 2
        _hidden = 3
        lower = 4
    assert utils.EnumClassKeyVals(Colours) == {'RED': 1, 'GREEN': 2}
