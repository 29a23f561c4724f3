"""Parameter tags and the record a model keeps per parameter (Caffe2's
``modeling.parameter_info``)."""

import numpy as np

from ferrocaffe import core

__all__ = ["ParameterInfo", "ParameterTags"]


class ParameterTags:
    """Tags ``ModelHelper.AddParameter``/``create_param`` take: a WEIGHT goes
    to ``model.weights``, a BIAS to ``model.biases``, a COMPUTED_PARAM (not
    trained, e.g. running statistics) to the computed params."""

    BIAS = "BIAS"
    WEIGHT = "WEIGHT"
    COMPUTED_PARAM = "COMPUTED_PARAM"


class ParameterInfo:
    """One parameter: its blob, shape, gradient and, optionally, copies of it
    in other precisions (``blob_copy``: {dtype: blob}) and an optimizer of
    its own (set once)."""

    def __init__(self, param_id, param, key=None, shape=None, length=None, grad=None,
                 blob_copy=None):
        if not isinstance(param, core.BlobReference):
            raise TypeError(f"ParameterInfo: param must be a BlobReference, got {type(param).__name__}")
        self.param_id = param_id
        self.name = str(param)
        self.blob = param
        self.key = key
        self.shape = shape
        self.size = None if shape is None else int(np.prod(shape))
        self.length = 1 if length is None else max(1, length)
        self.grad = grad
        self.blob_copy = blob_copy
        self._optimizer = None

    @property
    def parameter(self):
        return self.blob

    @property
    def optimizer(self):
        return self._optimizer

    @optimizer.setter
    def optimizer(self, value):
        if self._optimizer is not None:
            raise AssertionError("optimizer has already been set")
        self._optimizer = value

    def __str__(self):
        return self.name
