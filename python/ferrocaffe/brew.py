"""Layer helpers that add ops and parameters to a ModelHelper (Caffe2's
``brew``): ``brew.fc(model, "x", "y", dim_in, dim_out)`` and the like.

Each helper is ``f(model, blob_in, blob_out, ...)``; ``Register`` adds
more. Parameters are named from the output blob (``y_w``, ``y_b``) in the
current name scope, created and filled in ``model.param_init_net``
(unless the model was made with ``init_params=False``), and recorded in
``model.params``.
"""

from ferrocaffe import core, scope

__all__ = [
    "Register", "accuracy", "add_weight_decay", "concat", "db_input", "dropout", "fc", "has_helper",
    "relu", "sigmoid", "softmax", "sum", "tanh", "transpose",
]

_HELPERS = {}


def Register(helper):
    """Adds ``helper`` as ``brew.<its name>``."""
    _HELPERS[helper.__name__] = helper
    globals()[helper.__name__] = helper
    return helper


def has_helper(helper_or_name):
    name = helper_or_name if isinstance(helper_or_name, str) else helper_or_name.__name__
    return name in _HELPERS


def _param(model, name, shape, init):
    """A parameter blob filled by ``init`` = (op type, kwargs)."""
    op_type, kwargs = init
    full = scope.CurrentNameScope() + name
    if model.init_params:
        blob = getattr(model.param_init_net, op_type)([], full, shape=list(shape), **kwargs)
    else:
        blob = core.BlobReference(full)
    model.AddParameter(blob)
    return blob


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
    b (dim_out, zeros by default)."""
    if WeightInitializer is not None or BiasInitializer is not None:
        raise NotImplementedError("brew.fc: WeightInitializer/BiasInitializer are not supported yet; use weight_init/bias_init")
    w = _param(model, str(blob_out) + "_w", [dim_out, dim_in], _init(weight_init, ("XavierFill", {})))
    b = _param(model, str(blob_out) + "_b", [dim_out], _init(bias_init, ("ConstantFill", {})))
    model.weights.append(w)
    model.biases.append(b)
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
