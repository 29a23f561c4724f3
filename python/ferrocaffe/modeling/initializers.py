"""Parameter creation strategies (Caffe2's ``modeling.initializers``):
an ``Initializer`` names a fill op and its arguments and adds it to the
init net; brew's ``WeightInitializer=``/``BiasInitializer=`` take the class
and ``weight_init=``/``bias_init=`` give the (op, kwargs) it fills with."""

from ferrocaffe import core
from ferrocaffe.modeling.parameter_info import ParameterInfo

__all__ = [
    "ExternalInitializer", "Initializer", "PseudoFP16Initializer",
    "ReversePseudoFP16Initializer", "update_initializer",
]


class Initializer:
    """Fills the parameter with ``operator_name(shape=shape, **kwargs)``."""

    def __init__(self, operator_name=None, **kwargs):
        self.operator_name = operator_name
        self.operator_kwargs = kwargs

    def update(self, operator_name, kwargs):
        if self.operator_name is not None:
            raise Exception("Operator name overwrites are not allowed")
        self.operator_name = operator_name
        self.operator_kwargs = kwargs

    def _fill(self, init_net, name, shape):
        return getattr(init_net, self.operator_name)([], name, shape=shape, **self.operator_kwargs)

    def create_param(self, param_name, init_net, shape):
        return ParameterInfo(param_id=None, param=self._fill(init_net, param_name, shape), shape=shape)


class ExternalInitializer:
    """Adds nothing to the init net: the blob is expected in the workspace."""

    def create_param(self, param_name, init_net, shape):
        if isinstance(param_name, core.BlobReference):
            param = core.BlobReference(str(param_name), init_net)
        elif isinstance(param_name, str):
            param = core.ScopedBlobReference(param_name, init_net)
        else:
            raise TypeError("Unsupported type for param_name")
        return ParameterInfo(param_id=None, param=param, shape=shape)


class PseudoFP16Initializer(Initializer):
    """A float16 parameter for compute, kept and trained as a float32 master
    copy ``<name>_fp32`` (in ``blob_copy[DataType.FLOAT]``)."""

    def create_param(self, param_name, init_net, shape):
        master = self._fill(init_net, str(param_name) + "_fp32", shape)
        param = init_net.FloatToHalf(master, param_name)
        return ParameterInfo(param_id=None, param=param, shape=shape,
                             blob_copy={core.DataType.FLOAT: master})


class ReversePseudoFP16Initializer(Initializer):
    """A float32 parameter with a float16 copy ``<name>_fp16`` (in
    ``blob_copy[DataType.FLOAT16]``)."""

    def create_param(self, param_name, init_net, shape):
        param = self._fill(init_net, param_name, shape)
        half = init_net.FloatToHalf(param, str(param_name) + "_fp16")
        return ParameterInfo(param_id=None, param=param, shape=shape,
                             blob_copy={core.DataType.FLOAT16: half})


def update_initializer(initializer_class, operator_name_and_kwargs, default_operator_name_and_kwargs):
    """An instance of ``initializer_class`` (default ``Initializer``) filling
    with ``operator_name_and_kwargs``, or the default (op, kwargs) when that
    is None."""
    op_name, kwargs = operator_name_and_kwargs or default_operator_name_and_kwargs
    return (initializer_class or Initializer)(op_name, **(kwargs or {}))
