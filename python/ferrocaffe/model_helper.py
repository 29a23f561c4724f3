"""A model: its init net, its training net and its parameters (Caffe2's
``model_helper.ModelHelper``).

``param_init_net`` creates and fills the parameters once; ``net`` computes
the model (and, after ``AddGradientOperators``, its gradients, then the
optimizer's updates). ``brew`` helpers add layers and record their
parameters in ``params``; ``optimizer.build_*`` read ``param_to_grad``.
"""

import logging
from collections import namedtuple

from ferrocaffe import core, errors, scope
from ferrocaffe.modeling.parameter_info import ParameterTags
from ferrocaffe.modeling.parameter_sharing import parameter_sharing_context
from ferrocaffe.optimizer_context import DEFAULT_OPTIM, OptimizerContext

__all__ = ["ModelHelper", "ParameterInfo", "ExtractPredictorNet"]

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
            self._parameters_info = param_model._parameters_info
            self._computed_params = param_model._computed_params
        else:
            self.param_init_net = core.Net(self.name + "_init")
            self.param_to_grad = {}
            self.params = []
            # {param BlobReference: modeling.parameter_info.ParameterInfo}
            # of the parameters create_param made (shared with a
            # param_model's models).
            self._parameters_info = {}
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

    @staticmethod
    def _normalize_tags(tags):
        if tags is None:
            return set()
        return set(tags) if isinstance(tags, (list, tuple, set)) else {tags}

    def AddParameter(self, param, tags=None):
        """Records ``param``: trainable, or computed with the tag
        ``ParameterTags.COMPUTED_PARAM``; WEIGHT and BIAS tags also list it
        in ``weights`` / ``biases``."""
        if not isinstance(param, core.BlobReference):
            param = core.BlobReference(str(param))
        tags = self._normalize_tags(tags)
        if ParameterTags.COMPUTED_PARAM in tags:
            self._computed_params.append(param)
        else:
            self.params.append(param)
        if ParameterTags.WEIGHT in tags:
            self.weights.append(param)
        if ParameterTags.BIAS in tags:
            self.biases.append(param)

    def create_param(self, param_name, shape, initializer, tags=None):
        """Creates (once) the parameter ``param_name`` with ``initializer``
        (a ``modeling.initializers`` object) and returns its blob. A str
        name is taken in the current name scope, a BlobReference as is; a
        name created before returns the same blob (its shape must agree).
        An optimizer chosen by an active ``UseOptimizer`` block (for one of
        the tags, else DEFAULT) is recorded in the parameter's info."""
        if isinstance(param_name, core.BlobReference):
            param_name = str(param_name)
        elif isinstance(param_name, str):
            # In the current name scope, as ParameterSharing maps it.
            param_name = parameter_sharing_context.get_parameter_name(param_name)
        else:
            raise TypeError(f"Unsupported type for param_name: {type(param_name).__name__}")
        key = core.BlobReference(param_name)
        if key in self._parameters_info:
            info = self._parameters_info[key]
            if list(info.shape) != list(shape):
                raise AssertionError(f"parameter {param_name} exists with shape {info.shape}, asked for {shape}")
            return info.blob
        info = initializer.create_param(param_name=key, init_net=self.param_init_net, shape=shape)
        context = OptimizerContext.current()
        for tag in sorted(self._normalize_tags(tags)):
            if context.has_optimizer(tag):
                info.optimizer = context.get_optimizer(tag)
        if not info.optimizer and context.has_optimizer(DEFAULT_OPTIM):
            info.optimizer = context.get_optimizer(DEFAULT_OPTIM)
        self._parameters_info[info.blob] = info
        self.AddParameter(info.blob, tags)
        return info.blob

    def get_param_info(self, param):
        """The ParameterInfo create_param made for ``param`` (or None)."""
        if not isinstance(param, core.BlobReference):
            raise AssertionError(f"Param {param} is not a BlobReference")
        return self._parameters_info.get(param, None)

    def _Validate(self):
        """Names listed more than once in ``params``, sorted."""
        seen, dupes = set(), set()
        for p in map(str, self.params):
            (dupes if p in seen else seen).add(p)
        return sorted(dupes)

    def Validate(self):
        dupes = self._Validate()
        assert dupes == [], "Duplicate params: {}".format(dupes)

    def GetCompleteNet(self):
        """One net: ``param_init_net``'s ops (their ``debug_info`` ending
        in ``/param_init_net``) then ``net``'s, with ``net``'s type."""
        complete = self.param_init_net.Clone(self.name + "_complete_net", keep_schema=True)
        for op in complete.Proto().op:
            op.debug_info = op.debug_info + "/param_init_net"
        complete.AppendNet(self.net)
        if self.net.Proto().HasField("type"):
            complete.Proto().type = self.net.Proto().type
        return complete

    def ConstructInitTrainNetfromNet(self, net):
        """Splits a ``GetCompleteNet`` net back into ``param_init_net`` and
        ``net`` (by the ``/param_init_net`` mark), each with external
        lists recomputed from its ops."""
        init_ops, train_ops = [], []
        for i, op in enumerate(net.Proto().op):
            (init_ops if op.debug_info.endswith("/param_init_net") else train_ops).append(i)
        self.param_init_net = net.Clone(net.Name() + "/generated_param_init_net", keep_schema=True,
                                        op_id_mask=init_ops, update_external_list=True)
        self.net = net.Clone(net.Name() + "/generated_net", keep_schema=True,
                             op_id_mask=train_ops, update_external_list=True)

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
            raise errors.InvalidArgumentError(
                f"model '{self.name}' has no gradients: you need to run AddGradientOperators first.")
        return {p: self.grad_map[p] for p in params if p in self.grad_map}

    def GetOptimizationParamInfo(self, params=None):
        """ParameterInfo(blob, grad) of each param with a gradient (of
        ``params``, default all), leaving out the sparse ones when the model
        was made with ``skip_sparse_optim=True``."""
        if not self.gradient_ops_added:
            raise errors.InvalidArgumentError(
                f"model '{self.name}' has no gradients to optimize: need to call "
                "AddGradientOperators first")
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


def ExtractPredictorNet(net_proto, input_blobs, output_blobs, device=None, renames=None,
                        disabled_inputs=None):
    """A prediction net cut out of a model's net (Caffe2's): the ops from
    the first that reads one of ``input_blobs`` (StopGradient aside) to the
    last that writes one of ``output_blobs``, keeping those whose inputs are
    known (the net's external inputs, ``input_blobs`` and earlier kept
    ops' outputs); so input, loss and gradient ops fall away. ``renames``
    renames blobs, ``device`` sets every kept op's device, and branches
    reading a blob of ``disabled_inputs`` are left out. An op with
    ``is_test=0`` is refused (a train model's op, such as SpatialBN's).
    Returns ``(net, blobs to export)``: the new net (external inputs and
    outputs set) and the external inputs other than the inputs, that is
    the parameters a predictor needs."""
    renames = dict(renames or {})
    predict_net = core.Net(net_proto.name + "_predict")
    proto = predict_net.Proto()
    net_inputs, net_outputs = set(net_proto.external_input), set(net_proto.external_output)
    input_blobs = {str(b) for b in input_blobs}
    output_blobs = {str(b) for b in output_blobs}
    known = (net_inputs | input_blobs) - set(disabled_inputs or ())
    ext_in, ext_out = set(input_blobs), set(output_blobs)
    ops = list(net_proto.op)
    starts = [j for j, op in enumerate(ops) if input_blobs & set(op.input) and op.type != "StopGradient"]
    if not starts:
        raise errors.InvalidArgumentError(f"No ops with input={input_blobs}")
    ends = [j for j, op in enumerate(ops) if output_blobs & set(op.output)]
    if not ends:
        raise errors.InvalidArgumentError(f"No ops with output={output_blobs}")

    def renamed(names):
        new = [renames.get(n, n) for n in names]
        del names[:]
        names.extend(new)

    def place(op):
        if device is not None:
            op.device_option.device_type = device.device_type
            op.device_option.device_id = device.device_id

    for op in ops[min(starts):max(ends) + 1]:
        if not known.issuperset(op.input):
            logging.getLogger(__name__).debug(
                "Op %s had unknown inputs: %s", op.type, set(op.input) - known)
            continue
        op = _copy_op(op)
        if op.type == "RecurrentNetwork":
            for a in op.arg:
                if a.name == "backward_step_net":
                    a.ClearField("n")
                elif a.name == "step_net":
                    for step_op in a.n.op:
                        renamed(step_op.input)
                        renamed(step_op.output)
                        place(step_op)
                    renamed(a.n.external_input)
                    renamed(a.n.external_output)
                    ext_in |= set(a.n.external_input) & net_inputs
        place(op)
        for a in op.arg:
            if a.name == "is_test" and a.i == 0:
                raise errors.InvalidArgumentError(
                    "An operator had is_test=0, did you try to extract a predictor from a "
                    f"train model (instead of test model)? Op was: {op}", op=op.type)
        proto.op.add().CopyFrom(op)
        known |= set(op.output)
        ext_in |= set(op.input) & net_inputs
        ext_out |= set(op.output) & net_outputs
    proto.external_input.extend(sorted(ext_in))
    proto.external_output.extend(sorted(ext_out))
    renamed(proto.external_input)
    renamed(proto.external_output)
    for op in proto.op:
        renamed(op.input)
        renamed(op.output)
    inputs = {renames.get(b, b) for b in input_blobs}
    return predict_net, list(set(proto.external_input) - inputs)


def _copy_op(op):
    copy = type(op)()
    copy.CopyFrom(op)
    return copy
