"""The older model class for convolutional nets (Caffe2's
``cnn.CNNModelHelper``, deprecated there in favour of ``ModelHelper`` and
``brew``). Its layer methods are brew's helpers; the storage order and the
cuDNN hints are the model's ``arg_scope``, which brew passes to every
helper that takes them."""

import logging

from ferrocaffe import brew
from ferrocaffe.model_helper import ModelHelper
from ferrocaffe.proto import caffe2_pb2

__all__ = ["CNNModelHelper"]


def _method(helper_name, doc):
    def method(self, *args, **kwargs):
        return getattr(brew, helper_name)(self, *args, **kwargs)
    method.__name__ = helper_name
    method.__doc__ = doc
    return method


class CNNModelHelper(ModelHelper):
    def __init__(self, order="NCHW", name=None, use_cudnn=True, cudnn_exhaustive_search=False,
                 ws_nbytes_limit=None, init_params=True, skip_sparse_optim=False, param_model=None):
        logging.warning("CNNModelHelper is deprecated (as in Caffe2): use ModelHelper with brew")
        if order not in ("NCHW", "NHWC"):
            raise ValueError("Cannot understand the CNN storage order %s." % order)
        scope = {"order": order, "use_cudnn": use_cudnn, "cudnn_exhaustive_search": cudnn_exhaustive_search}
        if ws_nbytes_limit:
            scope["ws_nbytes_limit"] = ws_nbytes_limit
        super().__init__(name="CNN" if name is None else name, init_params=init_params,
                         skip_sparse_optim=skip_sparse_optim, param_model=param_model, arg_scope=scope)
        self.order = order
        self.use_cudnn = use_cudnn
        self.cudnn_exhaustive_search = cudnn_exhaustive_search
        self.ws_nbytes_limit = ws_nbytes_limit

    ConvNd = _method("conv_nd", "brew.conv_nd on this model.")
    Conv = _method("conv", "brew.conv on this model.")
    ConvTranspose = _method("conv_transpose", "brew.conv_transpose on this model.")
    GroupConv = _method("group_conv", "brew.group_conv on this model.")
    FC = _method("fc", "brew.fc on this model.")
    Dropout = _method("dropout", "brew.dropout on this model.")
    LRN = _method("lrn", "brew.lrn on this model.")
    Softmax = _method("softmax", "brew.softmax on this model.")
    SpatialBN = _method("spatial_bn", "brew.spatial_bn on this model.")
    Relu = _method("relu", "brew.relu on this model.")
    Concat = _method("concat", "brew.concat on this model.")
    Sum = _method("sum", "brew.sum on this model.")
    Transpose = _method("transpose", "brew.transpose on this model.")
    Accuracy = _method("accuracy", "brew.accuracy on this model.")
    MaxPool = _method("max_pool", "brew.max_pool on this model.")
    AveragePool = _method("average_pool", "brew.average_pool on this model.")

    @property
    def XavierInit(self):
        return ("XavierFill", {})

    def ConstantInit(self, value):
        return ("ConstantFill", dict(value=value))

    @property
    def MSRAInit(self):
        return ("MSRAFill", {})

    @property
    def ZeroInit(self):
        return ("ConstantFill", {})

    def AddWeightDecay(self, weight_decay):
        return brew.add_weight_decay(self, weight_decay)

    @property
    def CPU(self):
        option = caffe2_pb2.DeviceOption()
        option.device_type = caffe2_pb2.CPU
        return option
