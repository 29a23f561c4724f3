"""How parameters are described and created (Caffe2's ``caffe2.python.modeling``):
``parameter_info`` (tags and ``ParameterInfo``) and ``initializers``."""
