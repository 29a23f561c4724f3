"""A model: its init net, its training net and its parameters (Caffe2's
``model_helper.ModelHelper``).

``param_init_net`` creates and fills the parameters once; ``net`` computes
the model (and, after ``AddGradientOperators``, its gradients, then the
optimizer's updates). ``brew`` helpers add layers and record their
parameters in ``params``; ``optimizer.build_*`` read ``param_to_grad``.
"""

from collections import namedtuple

from ferrocaffe import core, scope

__all__ = ["ModelHelper", "ParameterInfo"]

#: A parameter and its gradient (a blob, or a core.GradientSlice for a
#: sparse one), as GetOptimizationParamInfo gives them; unpacks as a pair.
ParameterInfo = namedtuple("ParameterInfo", ["blob", "grad"])


class ModelHelper:
    def __init__(
        self,
        name=None,
        init_params=True,
        allow_not_known_ops=True,
        skip_sparse_optim=False,
        param_model=None,
        arg_scope=None,
    ):
        self.name = name or "model"
        self.net = core.Net(self.name)
        if param_model is not None:
            self.param_init_net = param_model.param_init_net
            self.param_to_grad = param_model.param_to_grad
            self.params = param_model.params
            self._computed_params = param_model._computed_params
        else:
            self.param_init_net = core.Net(self.name + "_init")
            self.param_to_grad = {}
            self.params = []
            self._computed_params = []
        self.init_params = init_params
        self.allow_not_known_ops = allow_not_known_ops
        self.skip_sparse_optim = skip_sparse_optim
        self.weights = []
        self.biases = []
        self.grad_map = {}
        self.gradient_ops_added = False
        # Caffe2's defaults; brew's helpers take them as keyword defaults.
        self._arg_scope = {"order": "NCHW", "use_cudnn": True, "cudnn_exhaustive_search": False}
        self._arg_scope.update(arg_scope or {})

    @property
    def arg_scope(self):
        return self._arg_scope

    def _scoped(self, params, namescope, top_scope):
        if namescope is None:
            namescope = scope.CurrentNameScope()
        if namescope and not namescope.endswith(scope._NAMESCOPE_SEPARATOR):
            namescope += scope._NAMESCOPE_SEPARATOR
        if not namescope:
            return list(params)
        if top_scope:
            return [p for p in params if str(p).startswith(namescope)]
        return [p for p in params if namescope in str(p)]

    def GetParams(self, namescope=None, top_scope=False):
        """The trainable parameters under ``namescope`` (default: the
        current name scope; all of them at the top level)."""
        return self._scoped(self.params, namescope, top_scope)

    def GetComputedParams(self, namescope=None):
        """Parameters that are computed, not trained (none of the helpers
        here make any yet)."""
        return self._scoped(self._computed_params, namescope, False)

    def GetAllParams(self, namescope=None):
        return self.GetParams(namescope) + self.GetComputedParams(namescope)

    def AddParameter(self, param, tags=None):
        """Records ``param`` as trainable (brew's layers call this)."""
        self.params.append(core.BlobReference(str(param)) if not isinstance(param, core.BlobReference) else param)

    def AddGradientOperators(self, *args, **kwargs):
        """``net.AddGradientOperators`` once; fills ``param_to_grad`` and
        returns the blob-to-gradient map."""
        if self.gradient_ops_added:
            raise RuntimeError("You cannot run AddGradientOperators twice.")
        self.gradient_ops_added = True
        self.grad_map = self.net.AddGradientOperators(*args, **kwargs)
        self.param_to_grad = self.get_param_to_grad(self.params)
        return self.grad_map

    def get_param_to_grad(self, params):
        """{param: its gradient} for the params that have one (a blob, or a
        core.GradientSlice for a sparse one)."""
        if not self.gradient_ops_added:
            raise RuntimeError("You need to run AddGradientOperators first.")
        return {p: self.grad_map[p] for p in params if p in self.grad_map}

    def GetOptimizationParamInfo(self, params=None):
        """ParameterInfo(blob, grad) of each param with a gradient (of
        ``params``, default all), leaving out the sparse ones when the model
        was made with ``skip_sparse_optim=True``."""
        if not self.gradient_ops_added:
            raise RuntimeError("Need to call AddGradientOperators first")
        param_to_grad = self.get_param_to_grad(params) if params else self.param_to_grad
        return [
            ParameterInfo(p, g) for p, g in param_to_grad.items()
            if not (self.skip_sparse_optim and isinstance(g, core.GradientSlice))
        ]

    def Proto(self):
        return self.net.Proto()

    def __getattr__(self, op_type):
        # Ops called on the model go to its net (model.Accuracy(...)).
        if op_type.startswith("_"):
            raise AttributeError(op_type)
        if not core.IsOperator(op_type):
            raise AttributeError(f"Method {op_type} is not a registered operator.")
        return getattr(self.net, op_type)
