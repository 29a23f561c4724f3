"""What the ONNX frontend and backend share: the ``onnx`` import (with the
install hint), the two data-type numberings, unique names, and the typed
conversion errors."""

from __future__ import annotations

import itertools

import numpy as np

from .. import errors
from ..proto import caffe2_pb2

try:
    import onnx  # noqa: F401  (the optional dependency)
except ImportError as e:  # pragma: no cover - the extra is installed in the tests
    raise ImportError(
        "ferrocaffe.onnx needs the onnx package: pip install \"ferrocaffe[onnx]\" "
        "(or pip install onnx)") from e

from onnx import TensorProto as OnnxType

C2Type = caffe2_pb2.TensorProto

#: Caffe2 TensorProto.DataType -> ONNX TensorProto.DataType (the numbers differ).
C2_TO_ONNX_TYPE = {
    C2Type.FLOAT: OnnxType.FLOAT,
    C2Type.DOUBLE: OnnxType.DOUBLE,
    C2Type.FLOAT16: OnnxType.FLOAT16,
    C2Type.INT32: OnnxType.INT32,
    C2Type.INT64: OnnxType.INT64,
    C2Type.INT16: OnnxType.INT16,
    C2Type.INT8: OnnxType.INT8,
    C2Type.UINT16: OnnxType.UINT16,
    C2Type.UINT8: OnnxType.UINT8,
    C2Type.BYTE: OnnxType.UINT8,
    C2Type.BOOL: OnnxType.BOOL,
    C2Type.STRING: OnnxType.STRING,
}
#: ONNX TensorProto.DataType -> Caffe2's, for the types ferrocaffe's tensors hold.
ONNX_TO_C2_TYPE = {v: k for k, v in C2_TO_ONNX_TYPE.items() if k != C2Type.BYTE}

NUMPY_OF_ONNX = {
    OnnxType.FLOAT: np.dtype(np.float32),
    OnnxType.DOUBLE: np.dtype(np.float64),
    OnnxType.FLOAT16: np.dtype(np.float16),
    OnnxType.INT32: np.dtype(np.int32),
    OnnxType.INT64: np.dtype(np.int64),
    OnnxType.INT16: np.dtype(np.int16),
    OnnxType.INT8: np.dtype(np.int8),
    OnnxType.UINT16: np.dtype(np.uint16),
    OnnxType.UINT8: np.dtype(np.uint8),
    OnnxType.BOOL: np.dtype(np.bool_),
    OnnxType.STRING: np.dtype(object),
}
ONNX_OF_NUMPY = {v: k for k, v in NUMPY_OF_ONNX.items()}


def onnx_type_name(t: int) -> str:
    try:
        return OnnxType.DataType.Name(t)
    except ValueError:
        return str(t)


ConversionError = errors.ConversionError
UnsupportedOperatorError = errors.UnsupportedOperatorError


def where(op_type=None, op_index=None, net=None, blob=None, node=None) -> str:
    """The ``[op #i 'Type', net 'n', blob 'b']`` suffix of the runtime's
    messages."""
    parts = []
    if op_type is not None:
        label = f"op #{op_index} '{op_type}'" if op_index is not None else f"op '{op_type}'"
        if node:
            label += f" (node '{node}')"
        parts.append(label)
    if net is not None:
        parts.append(f"net '{net}'")
    if blob is not None:
        parts.append(f"blob '{blob}'")
    return f" [{', '.join(parts)}]" if parts else ""


class NameGen:
    """Fresh blob names that clash with no name the graph or net uses."""

    def __init__(self, taken, prefix: str):
        self.taken = set(taken)
        self.prefix = prefix
        self._n = itertools.count()

    def new(self, hint: str = "") -> str:
        while True:
            name = f"{self.prefix}{hint}_{next(self._n)}" if hint else f"{self.prefix}{next(self._n)}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def reserve(self, names) -> None:
        self.taken.update(names)
