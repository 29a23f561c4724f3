"""Layer helpers that add ops and parameters to a ModelHelper (Caffe2's
``brew``): ``brew.fc(model, "x", "y", dim_in, dim_out)`` and the like.

Each helper is ``f(model, blob_in, blob_out, ...)``; ``Register`` adds
more. Parameters are named from the output blob (``y_w``, ``y_b``) in the
current name scope, created and filled in ``model.param_init_net``
(unless the model was made with ``init_params=False``), and recorded in
``model.params``.
"""

import contextlib
import copy
import functools
import inspect

from ferrocaffe import control_ops_util, core, scope
from ferrocaffe.modeling import initializers
from ferrocaffe.modeling.parameter_info import ParameterTags

__all__ = [
    "Register", "accuracy", "add_weight_decay", "arg_scope", "average_pool", "batch_mat_mul", "concat", "cond", "conv",
    "conv_nd", "conv_transpose", "db_input", "dropout", "fc", "get_current_scope", "group_conv",
    "has_helper", "layer_norm", "loop", "lrn", "max_pool", "prelu", "relu", "sigmoid", "softmax", "spatial_bn",
    "sum", "tanh",
    "transpose",
]

_HELPERS = {}
_SCOPES = [{}]


def get_current_scope():
    """{helper name: default keyword arguments} set by ``arg_scope``."""
    return _SCOPES[-1]


@contextlib.contextmanager
def arg_scope(single_helper_or_list, **kwargs):
    """Within the block, the given helpers get ``kwargs`` as defaults (the
    call's own arguments win), as Caffe2's ``brew.arg_scope``."""
    helpers = single_helper_or_list if isinstance(single_helper_or_list, list) else [single_helper_or_list]
    new = copy.deepcopy(get_current_scope())
    for helper in helpers:
        if not callable(helper):
            raise TypeError(f"arg_scope is only supported for functions, got {helper!r}")
        new.setdefault(helper.__name__, {}).update(kwargs)
    _SCOPES.append(new)
    try:
        yield
    finally:
        _SCOPES.pop()


def Register(helper):
    """Adds ``helper`` as ``brew.<its name>``. As in Caffe2, a call gets the
    model's ``arg_scope`` (only the names the helper takes, unless it takes
    ``**kwargs``), then ``brew.arg_scope``'s, then its own arguments.
    A name already registered raises AttributeError."""
    name = helper.__name__
    if name in _HELPERS:
        raise AttributeError(f"Helper {name} already exists. Please change your helper name.")
    params = inspect.signature(helper).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    @functools.wraps(helper)
    def scoped(*args, **kwargs):
        model = args[0] if args else kwargs.get("model")
        if model is None:
            raise RuntimeError(f"brew.{name}: the first argument must be the model")
        new = copy.deepcopy(dict(getattr(model, "arg_scope", None) or {}))
        if not takes_any:
            new = {k: v for k, v in new.items() if k in params}
        new.update(get_current_scope().get(name, {}))
        new.update(kwargs)
        return helper(*args, **new)

    _HELPERS[name] = scoped
    globals()[name] = scoped
    return scoped


def has_helper(helper_or_name):
    name = helper_or_name if isinstance(helper_or_name, str) else helper_or_name.__name__
    return name in _HELPERS


def _param(model, name, shape, init, initializer_class=None, tags=None):
    """A parameter blob made by ``model.create_param``: filled by ``init`` =
    (op type, kwargs) through ``initializer_class`` (default
    ``Initializer``), or left to the workspace when the model was made with
    ``init_params=False``."""
    if model.init_params:
        initializer = initializers.update_initializer(initializer_class, init, None)
    else:
        initializer = initializers.ExternalInitializer()
    return model.create_param(param_name=name, shape=list(shape), initializer=initializer, tags=tags)


def _init(init, default):
    if init is None:
        return default
    op_type, kwargs = (init[0], init[1] if len(init) > 1 and init[1] is not None else {})
    return op_type, dict(kwargs)


@Register
def fc(model, blob_in, blob_out, dim_in, dim_out, weight_init=None, bias_init=None,
       WeightInitializer=None, BiasInitializer=None, enable_tensor_core=False,
       float16_compute=False, **kwargs):
    """Y = X W^T + b with W (dim_out x dim_in, XavierFill by default) and
    b (dim_out, zeros by default). ``freeze_bias``: b is a computed
    parameter (not trained), as in Caffe2."""
    bias_tags = [ParameterTags.BIAS]
    if kwargs.pop("freeze_bias", None) is not None:
        bias_tags.append(ParameterTags.COMPUTED_PARAM)
    w = _param(model, str(blob_out) + "_w", [dim_out, dim_in], _init(weight_init, ("XavierFill", {})),
               WeightInitializer, ParameterTags.WEIGHT)
    b = _param(model, str(blob_out) + "_b", [dim_out], _init(bias_init, ("ConstantFill", {})),
               BiasInitializer, bias_tags)
    return model.net.FC([blob_in, w, b], blob_out, **kwargs)


def _unary(op_type, doc):
    def helper(model, blob_in, blob_out=None, **kwargs):
        # No blob_out: the net names the output (as Caffe2's helpers do).
        return getattr(model.net, op_type)(blob_in, blob_out, **kwargs)

    helper.__name__ = op_type.lower()
    helper.__doc__ = doc
    return Register(helper)


relu = _unary("Relu", "Y = max(X, 0).")
sigmoid = _unary("Sigmoid", "Y = 1 / (1 + exp(-X)).")
tanh = _unary("Tanh", "Y = tanh(X).")
softmax = _unary("Softmax", "Softmax over each row (axis=1 by default).")


@Register
def prelu(model, blob_in, blob_out, num_channels=1, slope_init=None, **kwargs):
    """PRelu with a learned slope ``<blob_out>_slope`` (``num_channels``
    values, ConstantFill 0.25 by default; ``slope_init`` = (op type,
    kwargs)). As Caffe2's helper, other keyword arguments are dropped, so
    the op runs in its default NCHW order."""
    slope = _param(model, str(blob_out) + "_slope", [num_channels],
                   _init(slope_init, ("ConstantFill", {"value": 0.25})))
    return model.net.PRelu([blob_in, slope], [blob_out])


@Register
def sum(model, blob_in, blob_out, **kwargs):
    """Y = the sum of the input blobs."""
    return model.net.Sum(blob_in, blob_out, **kwargs)


@Register
def dropout(model, blob_in, blob_out, use_cudnn=False, **kwargs):
    """Dropout (``ratio``; ``is_test`` is required, as in Caffe2); the mask
    goes to ``_<blob_out>_mask``."""
    if "is_test" not in kwargs:
        raise AssertionError("Argument 'is_test' is required")
    kwargs.pop("engine", None)
    return model.net.Dropout(blob_in, [blob_out, "_" + str(blob_out) + "_mask"], **kwargs)[0]


@Register
def concat(model, blobs_in, blob_out, **kwargs):
    """Joins the inputs (along ``axis``, or ``order``'s channel dim); the
    split sizes go to ``_<blob_out>_concat_dims``."""
    if kwargs.get("order") and kwargs.get("axis"):
        kwargs.pop("order")
    return model.net.Concat(blobs_in, [blob_out, "_" + str(blob_out) + "_concat_dims"], **kwargs)[0]


@Register
def batch_mat_mul(model, blob_in, blob_out, enable_tensor_core=False, **kwargs):
    """BatchMatMul of the two inputs (``trans_a``, ``trans_b``, ``broadcast``)."""
    return model.net.BatchMatMul(blob_in, blob_out, **kwargs)


@Register
def transpose(model, blob_in, blob_out, use_cudnn=False, **kwargs):
    """Permutes the dims (``axes``; reversed by default)."""
    kwargs.pop("engine", None)
    return model.net.Transpose(blob_in, blob_out, **kwargs)


@Register
def add_weight_decay(model, weight_decay):
    """grad += weight_decay * param for each weight (``model.weights``) in
    the current name scope; run after AddGradientOperators."""
    if weight_decay <= 0.0:
        return
    wd = model.param_init_net.ConstantFill([], "wd", shape=[1], value=float(weight_decay))
    one = model.param_init_net.ConstantFill([], "ONE", shape=[1], value=1.0)
    namescope = scope.CurrentNameScope()
    weights = [w for w in model.weights if not namescope or str(w).startswith(namescope)]
    for param in weights:
        grad = model.param_to_grad[param]
        model.net.WeightedSum([grad, one, param, wd], grad)


@Register
def db_input(model, blobs_out, batch_size, db, db_type):
    """Reads batches of ``batch_size`` TensorProtos records from the db at
    ``db``: a ``CreateDB`` in ``model.param_init_net`` opens it (the
    reader blob is ``dbreader_<db>``) and a ``TensorProtosDBInput`` in
    ``model.net`` writes one blob of ``blobs_out`` per tensor of a record."""
    reader = model.param_init_net.CreateDB([], "dbreader_" + str(db), db=db, db_type=db_type)
    return model.net.TensorProtosDBInput(reader, blobs_out, batch_size=batch_size)


@Register
def accuracy(model, blob_in, blob_out, **kwargs):
    """The share of rows of ``blob_in[0]`` (scores) whose largest score (or
    one of the ``top_k`` largest) is at the label ``blob_in[1]``."""
    return model.net.Accuracy(blob_in, blob_out, **kwargs)
# ------------------------------------------------ convolutional nets (issue 15) --
# Caffe2's helpers (caffe2/python/helpers/conv.py, pooling.py,
# normalization.py). The model's arg_scope (order, use_cudnn, ...) and
# brew.arg_scope's reach them through Register's wrapper.


def _conv_base(model, is_nd, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=None,
               bias_init=None, WeightInitializer=None, BiasInitializer=None, group=1,
               transform_inputs=None, use_cudnn=False, order="NCHW", cudnn_exhaustive_search=False,
               ws_nbytes_limit=None, float16_compute=False, **kwargs):
    kernels = list(kernel) if is_nd else ([kernel, kernel] if isinstance(kernel, int) else list(kernel))
    use_bias = not kwargs.pop("no_bias", False)
    if order == "NCHW":
        w_shape = [dim_out, int(dim_in / group)] + kernels
    else:
        w_shape = [dim_out] + kernels + [int(dim_in / group)]
    w = _param(model, str(blob_out) + "_w", w_shape, _init(weight_init, ("XavierFill", {})),
               WeightInitializer, ParameterTags.WEIGHT)
    inputs = [blob_in, w]
    if use_bias:
        b = _param(model, str(blob_out) + "_b", [dim_out], _init(bias_init, ("ConstantFill", {})),
                   BiasInitializer, ParameterTags.BIAS)
        inputs.append(b)
    engine = kwargs.get("engine")
    if bool(use_cudnn) != (engine == "CUDNN") and engine is not None:
        # As Caffe2's brew: an engine that contradicts use_cudnn is an error.
        raise ValueError(f"brew.conv: use_cudnn={use_cudnn} contradicts engine={engine!r}")
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
        kwargs["exhaustive_search"] = cudnn_exhaustive_search
        if ws_nbytes_limit:
            kwargs["ws_nbytes_limit"] = ws_nbytes_limit
    if transform_inputs is not None:
        transform_inputs(model, blob_out, inputs)
    if float16_compute:
        kwargs["float16_compute"] = True
    if group != 1:
        kwargs["group"] = group
    if is_nd:
        return model.net.Conv(inputs, blob_out, kernels=kernels, order=order, **kwargs)
    if isinstance(kernel, (list, tuple)):
        return model.net.Conv(inputs, blob_out, kernel_h=kernel[0], kernel_w=kernel[1], order=order, **kwargs)
    return model.net.Conv(inputs, blob_out, kernel=kernel, order=order, **kwargs)


@Register
def conv(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=None, bias_init=None,
         WeightInitializer=None, BiasInitializer=None, group=1, transform_inputs=None, **kwargs):
    """2-D convolution: W (dim_out, dim_in / group, kernel, kernel) in NCHW
    ((dim_out, kernel, kernel, dim_in / group) in NHWC), XavierFill; b
    (dim_out), zeros, unless no_bias. ``kernel`` is an int or [h, w]."""
    return _conv_base(model, False, blob_in, blob_out, dim_in, dim_out, kernel, weight_init, bias_init,
                      WeightInitializer, BiasInitializer, group, transform_inputs, **kwargs)


@Register
def conv_nd(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=None, bias_init=None,
            WeightInitializer=None, BiasInitializer=None, group=1, transform_inputs=None,
            order="NCHW", **kwargs):
    """N-D convolution: ``kernel`` is a list, one size per spatial dim."""
    return _conv_base(model, True, blob_in, blob_out, dim_in, dim_out, kernel, weight_init, bias_init,
                      WeightInitializer, BiasInitializer, group, transform_inputs, order=order, **kwargs)


@Register
def group_conv(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=None, bias_init=None,
               group=1, **kwargs):
    """conv with ``group`` groups of channels."""
    return conv(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=weight_init,
                bias_init=bias_init, group=group, **kwargs)


@Register
def conv_transpose(model, blob_in, blob_out, dim_in, dim_out, kernel, weight_init=None, bias_init=None,
                   use_cudnn=False, order="NCHW", cudnn_exhaustive_search=False, ws_nbytes_limit=None,
                   **kwargs):
    """Transposed convolution: W (dim_in, dim_out, kernel, kernel) in NCHW
    ((dim_in, kernel, kernel, dim_out) in NHWC), b (dim_out)."""
    w_shape = [dim_in, dim_out, kernel, kernel] if order == "NCHW" else [dim_in, kernel, kernel, dim_out]
    w = _param(model, str(blob_out) + "_w", w_shape, _init(weight_init, ("XavierFill", {})),
               tags=ParameterTags.WEIGHT)
    b = _param(model, str(blob_out) + "_b", [dim_out], _init(bias_init, ("ConstantFill", {})),
               tags=ParameterTags.BIAS)
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
        kwargs["exhaustive_search"] = cudnn_exhaustive_search
        if ws_nbytes_limit:
            kwargs["ws_nbytes_limit"] = ws_nbytes_limit
    return model.net.ConvTranspose([blob_in, w, b], blob_out, kernel=kernel, order=order, **kwargs)


@Register
def max_pool(model, blob_in, blob_out, use_cudnn=False, order="NCHW", **kwargs):
    """MaxPool (kernel, stride, pad, ... as the op)."""
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.MaxPool(blob_in, blob_out, order=order, **kwargs)


@Register
def average_pool(model, blob_in, blob_out, use_cudnn=False, order="NCHW", **kwargs):
    """AveragePool (kernel, stride, pad, ... as the op)."""
    if use_cudnn:
        kwargs["engine"] = "CUDNN"
    return model.net.AveragePool(blob_in, blob_out, order=order, **kwargs)


@Register
def lrn(model, blob_in, blob_out, order="NCHW", use_cudnn=False, **kwargs):
    """LRN (size, alpha, beta, bias); on CPU its scale goes to
    ``_<blob_out>_scale``, and Y is returned."""
    out = model.net.LRN(blob_in, [blob_out, "_" + str(blob_out) + "_scale"], order=order, **kwargs)
    return out[0]


@Register
def spatial_bn(model, blob_in, blob_out, dim_in, init_scale=1.0, init_bias=0.0, ScaleInitializer=None,
               BiasInitializer=None, RunningMeanInitializer=None, RunningVarianceInitializer=None,
               order="NCHW", **kwargs):
    """SpatialBN with scale ``<blob_out>_s`` (init_scale), bias ``_b``
    (init_bias), trained; running mean ``_rm`` (zeros) and variance
    ``_riv`` (ones), computed params; saved statistics ``_sm``, ``_siv``.
    With is_test=1 the op has Y only."""
    if any(i is not None for i in (ScaleInitializer, BiasInitializer, RunningMeanInitializer,
                                   RunningVarianceInitializer)):
        raise NotImplementedError("brew.spatial_bn: the *Initializer arguments are not supported yet; use init_scale/init_bias")
    blob_out = blob_out or model.net.NextName()
    name = str(blob_out)

    def blob(suffix, value):
        if model.init_params:
            # The net puts the output under the current name scope.
            return model.param_init_net.ConstantFill([], name + "_" + suffix, shape=[dim_in],
                                                     value=value)
        return core.BlobReference(scope.CurrentNameScope() + name + "_" + suffix)

    scale, bias = blob("s", init_scale), blob("b", init_bias)
    rm, riv = blob("rm", 0.0), blob("riv", 1.0)
    model.AddParameter(scale)
    model.AddParameter(bias)
    model._computed_params.extend([core.BlobReference(str(rm)), core.BlobReference(str(riv))])
    ins = [blob_in, scale, bias, rm, riv]
    if kwargs.get("is_test"):
        return model.net.SpatialBN(ins, [blob_out], order=order, **kwargs)
    outs = [blob_out, rm, riv, name + "_sm", name + "_siv"]
    return model.net.SpatialBN(ins, outs, order=order, **kwargs)[0]


@Register
def layer_norm(model, blob_in, blob_out, dim_in, axis=1, epsilon=1e-4, initial_scale=1.0, initial_bias=0.0):
    """LayerNorm of ``blob_in`` over its dims from ``axis`` with a learned
    scale ``<blob_out>_scale`` (initial_scale, a WEIGHT) and bias
    ``<blob_out>_bias`` (initial_bias, a BIAS), both of shape ``dim_in`` (an
    int or a list); returns (normalised, mean, std), the last two named
    ``<blob_out>_mean`` and ``<blob_out>_std`` (Caffe2's helper)."""
    shape = [dim_in] if isinstance(dim_in, int) else list(dim_in)
    scale = model.create_param(
        param_name=f"{blob_out}_scale", shape=shape,
        initializer=initializers.Initializer("ConstantFill", value=float(initial_scale)),
        tags=ParameterTags.WEIGHT)
    bias = model.create_param(
        param_name=f"{blob_out}_bias", shape=shape,
        initializer=initializers.Initializer("ConstantFill", value=float(initial_bias)),
        tags=ParameterTags.BIAS)
    normalized, mean, std = model.net.LayerNorm(
        [blob_in, scale, bias], [blob_out, f"{blob_out}_mean", f"{blob_out}_std"],
        axis=axis, epsilon=float(epsilon), elementwise_affine=True)
    return normalized, mean, std


@Register
def cond(model, cond_blob, external_blobs, then_model, else_model=None):
    """An ``If`` op in ``model.net`` running ``then_model.net`` (else
    ``else_model.net``) on ``cond_blob``; ``external_blobs`` are the blobs
    the branches share with the outer net."""
    control_ops_util.add_if_op(model.net, cond_blob, external_blobs, then_model.net,
                               else_model.net if else_model else None)


@Register
def loop(model, cond_blob, external_blobs, loop_model, cond_model=None):
    """A ``While`` op in ``model.net``: ``loop_model.net`` runs while
    ``cond_blob`` holds (``cond_model.net`` recomputes it before each
    test)."""
    control_ops_util.add_while_op(model.net, cond_blob, external_blobs, loop_model.net,
                                  cond_model.net if cond_model else None)
