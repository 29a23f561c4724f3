"""Parameter updates added to a model's net (Caffe2's ``optimizer``):
``build_sgd``, ``build_multi_precision_sgd``, ``build_fp16_sgd``,
``build_adam``, ``build_adagrad``, ``build_rms_prop``, ``build_adadelta``,
``build_wngrad``, ``build_storm``, ``build_decay_adagrad``, ``build_ftrl``,
``build_gftrl``, ``build_yellowfin`` and ``add_weight_decay``.

``max_gradient_norm`` multiplies the learning rate by
``clip / max(clip, global norm of every gradient)`` (blobs under
``norm_clipped_grad_update/``), and ``allow_lr_injection`` by the blob
``lr_injection`` (``set_lr_injection``), as Caffe2's ``_build`` did.

Each run of the net advances the shared iteration counter
(``optimizer_iteration``, an ``AtomicIter`` under ``iteration_mutex``),
computes the learning rate with ``LearningRate`` from it, and updates every
parameter that has a gradient (``model.param_to_grad``, filled by
``model.AddGradientOperators``). As in Caffe2, ``LearningRate`` gets
``base_lr = -base_learning_rate``: plain SGD adds ``lr * grad`` with
``WeightedSum`` and Adam adds its step times ``lr``, while
``MomentumSGDUpdate``, which subtracts, gets the rate's sign flipped back.

A parameter whose gradient is sparse (a ``core.GradientSlice`` of indices
and values, from Gather or SparseLengthsSum) is updated on those rows only:
SGD with ``ScatterWeightedSum``, Adagrad with ``SparseAdagrad`` (or
``RowWiseSparseAdagrad`` with ``rowWise=True``), momentum SGD with
``SparseMomentumSGDUpdate`` and Adam with ``SparseAdam``; duplicate indices are not
merged first (Caffe2's default, ``sparse_dedup_aggregator=None``).
"""

from collections import defaultdict, namedtuple

import numpy as np

from ferrocaffe import core, scope, utils, workspace

__all__ = [
    "AdadeltaOptimizer", "AdagradOptimizer", "AdamOptimizer", "AuxOptimizerParams", "DecayAdagradOptimizer",
    "FP16SgdOptimizer", "FtrlOptimizer", "GFtrlOptimizer", "MultiPrecisionSgdOptimizer",
    "YellowFinOptimizer",
    "Optimizer", "RmsPropOptimizer", "SgdOptimizer", "StormOptimizer", "WngradOptimizer",
    "WeightDecayBuilder", "add_weight_decay", "build_adadelta", "build_adagrad", "build_adam",
    "build_decay_adagrad", "build_fp16_sgd", "build_ftrl", "build_gftrl", "build_multi_precision_sgd",
    "build_rms_prop", "build_sgd", "build_storm", "build_wngrad", "build_yellowfin",
    "get_lr_injection", "get_param_device", "set_lr_injection",
]

#: The blob ``allow_lr_injection`` multiplies every learning rate by
#: (Caffe2's name); ``set_lr_injection`` feeds it.
_LEARNING_RATE_INJECTION = "lr_injection"

#: The blobs an optimizer adds besides the parameters: ``local`` ones (one
#: per parameter, such as moments) and ``shared`` ones (such as the
#: iteration), as Caffe2's ``get_auxiliary_parameters()`` gives them.
AuxOptimizerParams = namedtuple("AuxOptimizerParams", ["local", "shared"])


#: How many optimizers of each class were made (Caffe2's
#: ``_optimizer_instance_count``): the number in an optimizer's blob names.
_optimizer_instance_count = defaultdict(int)


class Optimizer:
    def __init__(self):
        cls = type(self).__name__
        self._instance_num = _optimizer_instance_count[cls]
        _optimizer_instance_count[cls] += 1
        self._lr_multiplier = None
        self._local_lr_multiplier = None
        self._aux_params = AuxOptimizerParams(local=[], shared=[])

    def add_lr_multiplier(self, lr_multiplier):
        """Every learning rate this optimizer builds from now on is
        multiplied by the blob ``lr_multiplier`` (one element), as Caffe2's;
        None removes the multiplier."""
        self._lr_multiplier = lr_multiplier

    def get_auxiliary_parameters(self):
        """AuxOptimizerParams(local, shared): the moments and other blobs
        this optimizer added, for checkpointing or inspection."""
        return self._aux_params

    def _shared(self, blob):
        if str(blob) not in {str(b) for b in self._aux_params.shared}:
            self._aux_params.shared.append(blob)

    def __call__(self, net, param_init_net, param, grad=None):
        if grad is None:
            # A ParameterInfo-like object (model.GetOptimizationParamInfo()).
            param, grad = param.blob, param.grad
        if isinstance(param, str):
            param = core.BlobReference(param)
        return self._run(net, param_init_net, param, grad)

    def get_cpu_blob_name(self, base_str, node_name=""):
        """``<class>_<instance>_<base_str><node_name>_cpu``: a blob name of
        this optimizer's (Caffe2's naming)."""
        return f"{type(self).__name__}_{self._instance_num}_{base_str}{node_name}_cpu"

    def make_unique_blob_name(self, base_str):
        """A blob name unique to this optimizer instance (every device is
        the CPU here; a device scope's node name is kept)."""
        current = scope.CurrentDeviceScope()
        return self.get_cpu_blob_name(base_str, getattr(current, "node_name", "") if current else "")

    def build_lr(self, net, param_init_net, base_learning_rate, learning_rate_blob=None, policy="fixed",
                 iter_val=0, **kwargs):
        """The learning rate blob for the next update, and the iteration.
        The rate (``LearningRate`` with ``base_lr = -base_learning_rate``)
        is made once per optimizer, then scaled by the global multiplier
        (``add_lr_multiplier``) and by the current parameter's local one
        (LARS's factor), as Caffe2's."""
        if learning_rate_blob is None:
            learning_rate_blob = self.make_unique_blob_name("lr")
        iteration = utils.BuildUniqueMutexIter(param_init_net, net, iter_val=iter_val)
        if not net.BlobIsDefined(learning_rate_blob):
            lr = net.LearningRate(
                [iteration], learning_rate_blob, base_lr=-base_learning_rate, policy=policy, **kwargs
            )
        else:
            lr = net.GetBlobRef(learning_rate_blob)
        if self._lr_multiplier is not None:
            scaled = self.make_unique_blob_name("scaled_lr")
            if net.BlobIsDefined(scaled):
                lr = net.GetBlobRef(scaled)
            else:
                lr = net.Mul([lr, self._lr_multiplier], scaled, broadcast=1)
        if self._local_lr_multiplier is not None:
            lr = net.Mul([lr, self._local_lr_multiplier], self.make_unique_blob_name("local_scaled_lr"),
                         broadcast=1)
        return lr, iteration

    def _add_local_lr_multiplier(self, local_lr_multiplier, is_gpu_blob=False):
        """The learning rate of the updates built next is also multiplied by
        this blob (LARS's per-layer factor), until cleared."""
        self._local_lr_multiplier = local_lr_multiplier

    def _clear_local_lr_multiplier(self):
        self._local_lr_multiplier = None

    def create_lars_inputs(self, param_init_net, weight_decay, trust, lr_max):
        """The constant inputs of ``Lars``: blobs ``weight_decay``, ``trust``
        and ``lr_max`` of one element each."""
        wd = param_init_net.ConstantFill([], "weight_decay", shape=[1], value=float(weight_decay))
        trust = param_init_net.ConstantFill([], "trust", shape=[1], value=float(trust))
        lr_max = param_init_net.ConstantFill([], "lr_max", shape=[1], value=float(lr_max))
        return wd, trust, lr_max

    def _lars(self, net, param_init_net, param, grad, lars):
        """Multiplies the next update's rate by ``Lars`` of the parameter
        and its dense gradient (offset ``lars``, trust 1, no ceiling, no
        floor), as Caffe2's optimizers with ``lars`` did; sparse gradients
        are left alone (as in Caffe2)."""
        self._clear_local_lr_multiplier()
        if lars is None or isinstance(grad, core.GradientSlice):
            return
        assert lars >= 0, f"Lars offset must be nonnegative, got {lars}"
        wd, trust, lr_max = self.create_lars_inputs(param_init_net, 0.0, 1.0, float(np.finfo(np.float32).max))
        factor = net.Lars([param, grad, wd, trust, lr_max], self.make_unique_blob_name(str(param) + "_lars"),
                          offset=float(lars), lr_min=0.0)
        self._add_local_lr_multiplier(factor)

    @staticmethod
    def ones(param_init_net):
        name = "ONE_0_0"
        if param_init_net.BlobIsDefined(name):
            return param_init_net.GetBlobRef(name)
        return param_init_net.ConstantFill([], name, shape=[1], value=1.0)


class SgdOptimizer(Optimizer):
    def __init__(self, base_learning_rate=0.01, policy="fixed", momentum=0.0, nesterov=True,
                 sparse_dedup_aggregator=None, lars=None, **kwargs):
        super().__init__()
        if sparse_dedup_aggregator is not None:
            raise NotImplementedError("SgdOptimizer: sparse_dedup_aggregator is not supported")
        self.base_learning_rate = base_learning_rate
        self.policy = policy
        self.momentum = momentum
        self.nesterov = nesterov
        self.lars = lars
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param, grad):
        if self.base_learning_rate == 0:
            return
        assert self.base_learning_rate > 0, (
            f"Expect positive base learning rate, got {self.base_learning_rate}")
        self._lars(net, param_init_net, param, grad, self.lars)
        # MomentumSGDUpdate subtracts; WeightedSum adds (build_lr negates).
        sign = -1 if self.momentum else 1
        lr, _ = self.build_lr(
            net, param_init_net, self.base_learning_rate * sign, policy=self.policy, **self.init_kwargs
        )
        self._shared(self.ones(param_init_net))
        if isinstance(grad, core.GradientSlice):
            if self.momentum > 0:
                m = param_init_net.ConstantFill([param], str(param) + "_momentum", value=0.0)
                self._aux_params.local.append(m)
                net.SparseMomentumSGDUpdate(
                    [grad.values, m, lr, param, grad.indices], [grad.values, m, param],
                    momentum=self.momentum, nesterov=int(bool(self.nesterov)),
                )
                return
            one = self.ones(param_init_net)
            net.ScatterWeightedSum([param, one, grad.indices, grad.values, lr], param)
            return
        if self.momentum > 0:
            m = param_init_net.ConstantFill([param], str(param) + "_momentum", value=0.0)
            self._aux_params.local.append(m)
            net.MomentumSGDUpdate(
                [grad, m, lr, param], [grad, m, param],
                momentum=self.momentum, nesterov=int(bool(self.nesterov)),
            )
        else:
            one = self.ones(param_init_net)
            net.WeightedSum([param, one, grad, lr], param)


class MultiPrecisionSgdOptimizer(SgdOptimizer):
    """SGD for float16 parameters kept with a float32 master copy (Caffe2's
    multi-precision SGD): given a parameter-info object whose ``blob_copy``
    maps ``core.DataType.FLOAT`` to the float32 copy, the float16 gradient is
    converted (``HalfToFloat``, ``<grad>_fp32``), ``MomentumSGDUpdate``
    updates the copy and its ``<param>_momentum``, and ``FloatToHalf``
    writes the parameter back. Any other parameter (every one
    ``model.GetOptimizationParamInfo()`` gives here, as ferrocaffe's
    ``ParameterInfo`` has no ``blob_copy``) gets ``SgdOptimizer``'s update,
    as in Caffe2."""

    def __init__(self, base_learning_rate=0.1, momentum=0.0, policy="fixed", nesterov=True,
                 sparse_dedup_aggregator=None, **kwargs):
        super().__init__(base_learning_rate=base_learning_rate, policy=policy, momentum=momentum,
                         nesterov=nesterov, sparse_dedup_aggregator=sparse_dedup_aggregator, **kwargs)

    def __call__(self, net, param_init_net, param, grad=None):
        copies = getattr(param, "blob_copy", None) if grad is None else None
        fp32 = copies.get(core.DataType.FLOAT) if copies else None
        if fp32 is None:
            return super().__call__(net, param_init_net, param, grad)
        param, grad = param.blob, param.grad
        if self.base_learning_rate == 0:
            return None
        assert self.base_learning_rate > 0, (
            f"Expect positive base learning rate, got {self.base_learning_rate}")
        assert not isinstance(grad, core.GradientSlice), "MultiPrecisionSgd does not support sparse gradients"
        # MomentumSGDUpdate subtracts: the rate stays positive.
        lr, _ = self.build_lr(net, param_init_net, -self.base_learning_rate, policy=self.policy,
                              **self.init_kwargs)
        momentum = param_init_net.ConstantFill([fp32], str(param) + "_momentum", value=0.0)
        self._aux_params.local.append(momentum)
        grad_fp32 = net.HalfToFloat(grad, str(grad) + "_fp32")
        net.MomentumSGDUpdate([grad_fp32, momentum, lr, fp32], [grad_fp32, momentum, fp32],
                              momentum=float(self.momentum), nesterov=int(bool(self.nesterov)))
        net.FloatToHalf(fp32, param)
        return None


class FP16SgdOptimizer(SgdOptimizer):
    """Momentum SGD with weight decay fused into the update (Caffe2's FP16
    SGD). A parameter-info object whose ``blob_copy`` holds a float32 copy
    (``core.DataType.FLOAT``) or a float16 one (``FLOAT16``) is updated in
    float16 with ``FP16MomentumSGDUpdate``; any other parameter (a name
    containing ``spatbn``, ``fp32_update=True``, or no ``blob_copy``, which
    is every one ``model.GetOptimizationParamInfo()`` gives here) in float32
    with ``FP32MomentumSGDUpdate`` and ``<param>_momentum_fp32``. As in
    Caffe2 the float16 ``<param>_momentum`` made from it is the local
    auxiliary blob. Dense gradients only."""

    def __init__(self, base_learning_rate=0.1, momentum=0.0, policy="fixed", nesterov=True, weight_decay=0.0001,
                 sparse_dedup_aggregator=None, **kwargs):
        super().__init__(base_learning_rate=base_learning_rate, policy=policy, momentum=momentum,
                         nesterov=nesterov, sparse_dedup_aggregator=sparse_dedup_aggregator, **kwargs)
        self.weight_decay = weight_decay

    def __call__(self, net, param_init_net, param, grad=None, fp32_update=False):
        copies = None
        if grad is None:
            copies = getattr(param, "blob_copy", None)
            param, grad = param.blob, param.grad
        if isinstance(param, str):
            param = core.BlobReference(param)
        if "spatbn" in str(param):
            fp32_update = True
        half = False
        param_fp32 = param
        if not fp32_update and copies:
            if core.DataType.FLOAT in copies:
                param_fp32, half = copies[core.DataType.FLOAT], True
            elif core.DataType.FLOAT16 in copies:
                param, half = copies[core.DataType.FLOAT16], True
            else:
                raise AssertionError(
                    f"Unrecognized parameter format to be updated by FP16 Optimizer. Parameter: {param}")
        if self.base_learning_rate == 0:
            return None
        assert self.base_learning_rate > 0, (
            f"Expect positive base learning rate, got {self.base_learning_rate}")
        assert not isinstance(grad, core.GradientSlice), "FP16Sgd does not support sparse gradients"
        lr, _ = self.build_lr(net, param_init_net, -self.base_learning_rate, policy=self.policy,
                              **self.init_kwargs)
        momentum_fp32 = param_init_net.ConstantFill([param_fp32], str(param) + "_momentum_fp32", value=0.0)
        momentum = param_init_net.FloatToHalf(momentum_fp32, str(param) + "_momentum")
        self._aux_params.local.append(momentum)
        args = dict(momentum=float(self.momentum), nesterov=int(bool(self.nesterov)),
                    weight_decay=float(self.weight_decay))
        if half:
            net.FP16MomentumSGDUpdate([grad, momentum, lr, param], [grad, momentum, param], **args)
        else:
            net.FP32MomentumSGDUpdate([grad, momentum_fp32, lr, param], [grad, momentum_fp32, param], **args)
        return None


class AdamOptimizer(Optimizer):
    """Adam (dense: ``Adam``; sparse: ``SparseAdam``, or
    ``RowWiseSparseAdam`` with ``rowWise=True``, whose second moment
    ``<param>_avg_second_moment`` is one value per row). ``enableRAdam``
    rectifies the step (RAdam) in ``Adam`` and ``SparseAdam``; Caffe2 passed
    it to ``SparseAdam`` only, silently running plain Adam for dense
    gradients. ``use_lr_adaption`` (Caffe2's LearningRateAdaption op) and
    ``sparse_dedup_aggregator`` are not supported."""

    def __init__(self, alpha=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, policy="fixed", use_lr_adaption=False,
                 lr_alpha=0.01, normalized_lr_adaption=True, sparse_dedup_aggregator=None, rowWise=False, engine="",
                 enableRAdam=False, **kwargs):
        super().__init__()
        if use_lr_adaption:
            raise NotImplementedError("AdamOptimizer: use_lr_adaption is not supported")
        if sparse_dedup_aggregator is not None:
            raise NotImplementedError("AdamOptimizer: sparse_dedup_aggregator is not supported")
        self.alpha = alpha
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.policy = policy
        self.use_lr_adaption = use_lr_adaption
        self.lr_alpha = lr_alpha
        self.normalized_lr_adaption = normalized_lr_adaption
        self.rowWise = rowWise
        self.engine = engine
        self.enableRAdam = enableRAdam
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param, grad):
        if self.alpha <= 0:
            return
        lr, iteration = self.build_lr(net, param_init_net, self.alpha, policy=self.policy, **self.init_kwargs)
        m1 = param_init_net.ConstantFill([param], str(param) + "_first_moment", value=0.0)
        if self.rowWise:
            shape = param_init_net.Shape(param, str(param) + "_shape")
            num_rows = param_init_net.Slice([shape], str(shape) + "_numrows", starts=[0], ends=[1])
            m2 = param_init_net.ConstantFill(num_rows, str(param) + "_avg_second_moment", input_as_shape=1,
                                             value=0.0)
        else:
            m2 = param_init_net.ConstantFill([param], str(param) + "_second_moment", value=0.0)
        self._shared(iteration)
        self._aux_params.local.extend([m1, m2])
        if self.rowWise:
            assert isinstance(grad, core.GradientSlice), (
                "AdamOptimizer: rowWise=True needs a sparse gradient (RowWiseSparseAdam); "
                "dense Adam has no row-wise form")
        args = dict(beta1=float(self.beta1), beta2=float(self.beta2), epsilon=float(self.epsilon))
        if isinstance(grad, core.GradientSlice):
            if self.rowWise:
                assert not self.enableRAdam, "RowWiseSparseAdam does not support RAdam"
                net.RowWiseSparseAdam([param, m1, m2, grad.indices, grad.values, lr, iteration], [param, m1, m2],
                                      **args)
            else:
                net.SparseAdam([param, m1, m2, grad.indices, grad.values, lr, iteration], [param, m1, m2],
                               enableRAdam=bool(self.enableRAdam), **args)
            return
        net.Adam([param, m1, m2, grad, lr, iteration], [param, m1, m2], enableRAdam=bool(self.enableRAdam),
                 **args)

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class AdagradOptimizer(Optimizer):
    """Adagrad (dense: ``Adagrad``; sparse: ``SparseAdagrad``, or
    ``RowWiseSparseAdagrad`` with ``rowWise=True``, whose moment is one
    value per row). ``weight_decay`` adds ``weight_decay * param`` to the
    gradient inside the update op; ``lars`` (an offset) scales each dense
    update's rate by ``Lars``. ``counter_halflife`` > 0 keeps each row's
    decayed update count (``<param>_update_counter``, float64, and
    ``<param>_prev_update_iter``, int64) with ``RowWiseCounter`` after
    each sparse update, as Caffe2's; with a ``weight_decay`` too, the
    sparse op also reads the count (its weight decay scaled by
    ``counter_halflife / count`` per row, later Caffe2's rule)."""

    def __init__(self, alpha=0.01, epsilon=1e-4, decay=1, weight_decay=0.0, policy="fixed",
                 sparse_dedup_aggregator=None, rowWise=False, engine="", lars=None, counter_halflife=-1,
                 **kwargs):
        super().__init__()
        if sparse_dedup_aggregator is not None:
            raise NotImplementedError("AdagradOptimizer: sparse_dedup_aggregator is not supported")
        self.alpha = alpha
        self.epsilon = epsilon
        self.decay = decay
        self.weight_decay = weight_decay
        self.policy = policy
        self.rowWise = rowWise
        self.engine = engine
        self.lars = lars
        self.counter_halflife = counter_halflife
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param, grad):
        if self.alpha <= 0:
            return
        if self.lars is not None and not isinstance(grad, core.GradientSlice):
            assert self.weight_decay == 0, "weight decay is not implemented for LARS yet"
        self._lars(net, param_init_net, param, grad, self.lars)
        lr, iteration = self.build_lr(net, param_init_net, self.alpha, policy=self.policy, **self.init_kwargs)
        if self.counter_halflife > 0:
            self._shared(iteration)
        if self.rowWise:
            # One moment per row: the parameter's first dim, read at init.
            shape = param_init_net.Shape(param, str(param) + "_shape")
            num_rows = param_init_net.Slice([shape], str(shape) + "_numrows", starts=[0], ends=[1])
            moment = param_init_net.ConstantFill(
                num_rows, str(param) + "_avg_squared_sum", input_as_shape=1, value=0.0
            )
        else:
            moment = param_init_net.ConstantFill([param], str(param) + "_squared_sum", value=0.0)
        self._aux_params.local.append(moment)
        counters = None
        if self.counter_halflife > 0:
            # Each row's decayed update count and last update's iteration.
            shape = param_init_net.Shape(param, str(param) + "_shape")
            num_rows = param_init_net.Slice([shape], str(shape) + "_numrows", starts=[0], ends=[1])
            counter = param_init_net.ConstantFill(num_rows, str(param) + "_update_counter", input_as_shape=1,
                                                  value=0.0, dtype=core.DataType.DOUBLE)
            prev_iter = param_init_net.ConstantFill(num_rows, str(param) + "_prev_update_iter", input_as_shape=1,
                                                    value=0, dtype=core.DataType.INT64)
            self._aux_params.local.extend([counter, prev_iter])
            counters = (prev_iter, counter)
        args = dict(epsilon=float(self.epsilon), weight_decay=float(self.weight_decay))
        if isinstance(grad, core.GradientSlice):
            op = "RowWiseSparseAdagrad" if self.rowWise else "SparseAdagrad"
            inputs = [param, moment, grad.indices, grad.values, lr]
            if counters is not None and self.weight_decay > 0:
                # Later Caffe2: a row's weight decay scaled by
                # counter_halflife / its update count.
                inputs.append(counters[1])
                args["counter_halflife"] = int(self.counter_halflife)
            getattr(net, op)(inputs, [param, moment], **args)
            if counters is not None:
                net.RowWiseCounter([counters[0], counters[1], grad.indices, iteration], list(counters),
                                   counter_halflife=int(self.counter_halflife))
        else:
            if self.rowWise:
                raise NotImplementedError(
                    "AdagradOptimizer: rowWise needs a sparse gradient (as Caffe2's RowWiseSparseAdagrad)"
                )
            net.Adagrad([param, moment, grad, lr], [param, moment], decay=float(self.decay), **args)

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class RmsPropOptimizer(Optimizer):
    """RMSProp: the ``RmsProp`` op turns each gradient into a step
    (``mom = momentum * mom + grad / sqrt(epsilon + mean_squares)``, its
    rate 1) and the parameter moves by ``-lr`` times it. Dense gradients
    only, as in Caffe2. Caffe2 then applied the step with
    ``MomentumSGDUpdate`` writing into the same ``_momentum`` blob, which
    replaced RMSProp's moment with ``lr`` times it on every run (wrong with
    ``momentum`` > 0); here the moment stays RMSProp's own and the step is
    applied with ``WeightedSum`` (the same parameters when ``momentum`` is
    0, Caffe2's default)."""

    def __init__(self, alpha=0.01, decay=0.9, momentum=0.0, epsilon=1e-5, policy="fixed", engine="",
                 **kwargs):
        super().__init__()
        self.alpha = alpha
        self.decay = decay
        self.momentum = momentum
        self.epsilon = epsilon
        self.policy = policy
        self.engine = engine
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param, grad):
        assert self.alpha > 0
        assert not isinstance(grad, core.GradientSlice), "RmsPropOptimizer doesn't support sparse gradients"
        one = self.ones(param_init_net)
        lr, _ = self.build_lr(net, param_init_net, self.alpha, policy=self.policy, **self.init_kwargs)
        step = str(param) + "_grad_o"
        ms = param_init_net.ConstantFill([param], str(param) + "_mean_squares", value=0.0)
        mom = param_init_net.ConstantFill([param], str(param) + "_momentum", value=0.0)
        self._aux_params.local.extend([ms, mom])
        net.RmsProp([grad, ms, mom, one], [step, ms, mom], decay=float(self.decay),
                    momentum=float(self.momentum), epsilon=float(self.epsilon))
        net.WeightedSum([param, one, step, lr], param)

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class AdadeltaOptimizer(Optimizer):
    """Adadelta (``Adadelta``; sparse gradients: ``SparseAdadelta`` on
    their rows, duplicates applied in turn): two moments per parameter,
    ``_squared_moment`` and ``_squared_moment_update``.
    ``sparse_dedup_aggregator`` is not supported (as for Adagrad)."""

    def __init__(self, alpha=0.01, epsilon=1e-4, decay=0.95, policy="fixed", sparse_dedup_aggregator=None,
                 engine="", **kwargs):
        super().__init__()
        if sparse_dedup_aggregator is not None:
            raise NotImplementedError("AdadeltaOptimizer: sparse_dedup_aggregator is not supported")
        self.alpha = alpha
        self.epsilon = epsilon
        self.decay = decay
        self.policy = policy
        self.engine = engine
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param, grad):
        if self.alpha <= 0:
            return
        lr, _ = self.build_lr(net, param_init_net, self.alpha, policy=self.policy, **self.init_kwargs)
        moment = param_init_net.ConstantFill([param], str(param) + "_squared_moment", value=0.0)
        moment_update = param_init_net.ConstantFill([param], str(param) + "_squared_moment_update", value=0.0)
        self._aux_params.local.extend([moment, moment_update])
        args = dict(epsilon=float(self.epsilon), decay=float(self.decay))
        if isinstance(grad, core.GradientSlice):
            net.SparseAdadelta([param, moment, moment_update, grad.indices, grad.values, lr],
                               [param, moment, moment_update], **args)
        else:
            net.Adadelta([param, moment, moment_update, grad, lr], [param, moment, moment_update], **args)

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class WngradOptimizer(Optimizer):
    """WNGrad: one accumulator per parameter (``<param>_moment``, shape [1],
    starting at ``moment_init``); each step moves the parameter by
    ``lr / (b + epsilon) * grad`` and grows ``b`` by
    ``sum(grad^2) / (b + epsilon)`` (op ``Wngrad``; sparse gradients:
    ``SparseWngrad`` on their rows). ``output_effective_lr`` (and
    ``output_effective_lr_and_update``) add the outputs
    ``<param>_effective_lr`` (and ``<param>_update``) to dense updates;
    ``lars`` scales dense updates' rates, as Caffe2's."""

    def __init__(self, alpha=1.0, epsilon=1e-9, policy="fixed", sparse_dedup_aggregator=None, engine="",
                 moment_init=100.0, lars=None, output_effective_lr=False,
                 output_effective_lr_and_update=False, **kwargs):
        super().__init__()
        if sparse_dedup_aggregator is not None:
            raise NotImplementedError("WngradOptimizer: sparse_dedup_aggregator is not supported")
        self.alpha = alpha
        self.epsilon = epsilon
        self.policy = policy
        self.engine = engine
        self.moment_init = moment_init
        self.lars = lars
        self.output_effective_lr = output_effective_lr
        self.output_effective_lr_and_update = output_effective_lr_and_update
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param, grad):
        if self.alpha <= 0:
            return
        self._lars(net, param_init_net, param, grad, self.lars)
        lr, _ = self.build_lr(net, param_init_net, self.alpha, policy=self.policy, **self.init_kwargs)
        moment = param_init_net.ConstantFill([], str(param) + "_moment", shape=[1],
                                             value=float(self.moment_init))
        self._aux_params.local.append(moment)
        if isinstance(grad, core.GradientSlice):
            net.SparseWngrad([param, moment, grad.indices, grad.values, lr], [param, moment],
                             epsilon=float(self.epsilon))
            return
        outputs = [param, moment]
        if self.output_effective_lr_and_update:
            outputs += [str(param) + "_effective_lr", str(param) + "_update"]
        elif self.output_effective_lr:
            outputs.append(str(param) + "_effective_lr")
        net.Wngrad([param, moment, grad, lr], outputs, epsilon=float(self.epsilon))

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class StormOptimizer(Optimizer):
    """STORM (op ``Storm``; sparse gradients: ``SparseStorm`` on their
    rows): a moment per parameter (``<param>_moment``) and a running sum of
    squared gradients (``<param>_grad_sq_sum``, shape [1], starting at
    ``grad_sq_init``); the rate is ``lr * (beta + grad_sq_sum)^(-1/3)``.
    ``lr`` is the paper's k, ``momentum`` its c; ``lars`` scales dense
    updates' rates, as Caffe2's."""

    def __init__(self, lr=0.1, momentum=10.0, beta=0.1, grad_sq_init=0.01, policy="fixed",
                 sparse_dedup_aggregator=None, lars=None, **kwargs):
        super().__init__()
        if sparse_dedup_aggregator is not None:
            raise NotImplementedError("StormOptimizer: sparse_dedup_aggregator is not supported")
        self.lr = lr
        self.momentum = momentum
        self.beta = beta
        self.grad_sq_init = grad_sq_init
        self.policy = policy
        self.lars = lars
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param, grad):
        if self.lr <= 0:
            return
        self._lars(net, param_init_net, param, grad, self.lars)
        lr, _ = self.build_lr(net, param_init_net, self.lr, policy=self.policy, **self.init_kwargs)
        moment = param_init_net.ConstantFill([param], str(param) + "_moment", value=0.0)
        grad_sq_sum = param_init_net.ConstantFill([], str(param) + "_grad_sq_sum", shape=[1],
                                                  value=float(self.grad_sq_init))
        self._aux_params.local.extend([moment, grad_sq_sum])
        args = dict(momentum=float(self.momentum), beta=float(self.beta))
        if isinstance(grad, core.GradientSlice):
            net.SparseStorm([param, moment, grad_sq_sum, grad.values, grad.indices, lr],
                            [param, moment, grad_sq_sum], **args)
        else:
            net.Storm([param, moment, grad_sq_sum, grad, lr], [param, moment, grad_sq_sum], **args)

    def scale_learning_rate(self, scale):
        self.lr *= scale


class DecayAdagradOptimizer(Optimizer):
    """Decay Adagrad (op ``DecayAdagrad``): a first moment decayed by
    ``beta1`` and bias-corrected (``bias_correction_first``), a second
    moment summing ``grad^2`` and ``weight_decay`` applied with the step;
    the moments are ``<param>_first_mo1ment`` (Caffe2's spelling, kept so
    checkpoints match) and ``<param>_second_moment``, the iteration shared.
    A sparse gradient gets ``SparseAdagrad`` with ``<param>_squared_sum``,
    as Caffe2's. ``ema_options`` (Caffe2's EMA op) is not supported
    (``NotImplementedError``)."""

    def __init__(self, alpha=0.01, beta1=0.0, beta2=0.999, epsilon=0.1, weight_decay=0.0, ema_options=None,
                 bias_correction_first=True, policy="fixed", engine="", **kwargs):
        super().__init__()
        if ema_options:
            raise NotImplementedError("DecayAdagradOptimizer: ema_options is not supported")
        self.alpha = alpha
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.weight_decay = weight_decay
        self.bias_correction_first = bias_correction_first
        self.policy = policy
        self.engine = engine
        self.ema_enabled = False
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param, grad):
        if self.alpha <= 0:
            return
        lr, iteration = self.build_lr(net, param_init_net, self.alpha, policy=self.policy, **self.init_kwargs)
        if isinstance(grad, core.GradientSlice):
            moment = param_init_net.ConstantFill([param], str(param) + "_squared_sum", value=0.0)
            self._aux_params.local.append(moment)
            net.SparseAdagrad([param, moment, grad.indices, grad.values, lr], [param, moment],
                              epsilon=float(self.epsilon))
            return
        m1 = param_init_net.ConstantFill([param], str(param) + "_first_mo1ment", value=0.0)
        m2 = param_init_net.ConstantFill([param], str(param) + "_second_moment", value=0.0)
        self._shared(iteration)
        self._aux_params.local.extend([m1, m2])
        net.DecayAdagrad([param, m1, m2, grad, lr, iteration], [param, m1, m2], beta1=float(self.beta1),
                         beta2=float(self.beta2), epsilon=float(self.epsilon),
                         weight_decay=float(self.weight_decay),
                         bias_correction_first=int(bool(self.bias_correction_first)))

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class FtrlOptimizer(Optimizer):
    """FTRL-proximal (op ``Ftrl``; sparse gradients: ``SparseFtrl`` on their
    rows): one blob ``<param>_ftrl_nz`` of the parameter's shape plus a
    last dim of 2, holding each coordinate's (n, z). No learning-rate
    schedule: ``alpha`` goes to the op, as Caffe2's. ``engine`` is passed
    on (every engine runs the same kernel here)."""

    _op = "Ftrl"
    _suffix = "_ftrl_nz"

    def __init__(self, alpha=0.01, beta=1e-4, lambda1=0, lambda2=0, sparse_dedup_aggregator=None, engine=""):
        super().__init__()
        if sparse_dedup_aggregator is not None:
            raise NotImplementedError(f"{type(self).__name__}: sparse_dedup_aggregator is not supported")
        self.alpha = alpha
        self.beta = beta
        self.lambda1 = lambda1
        self.lambda2 = lambda2
        self.engine = engine

    def _run(self, net, param_init_net, param, grad):
        if self.alpha <= 0:
            return
        nz = param_init_net.ConstantFill([param], str(param) + self._suffix, extra_shape=[2], value=0.0)
        self._aux_params.local.append(nz)
        args = dict(alpha=float(self.alpha), beta=float(self.beta), lambda1=float(self.lambda1),
                    lambda2=float(self.lambda2))
        if self.engine:
            args["engine"] = self.engine
        if isinstance(grad, core.GradientSlice):
            if self._op != "Ftrl":
                raise NotImplementedError(f"{type(self).__name__} doesn't support sparse gradients")
            net.SparseFtrl([param, nz, grad.indices, grad.values], [param, nz], **args)
        else:
            getattr(net, self._op)([param, nz, grad], [param, nz], **args)

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class GFtrlOptimizer(FtrlOptimizer):
    """Group-lasso FTRL (op ``GFtrl``, dense gradients only): the L1 term
    acts on each input feature's column of the parameter as a group;
    state ``<param>_gftrl_nz``."""

    _op = "GFtrl"
    _suffix = "_gftrl_nz"


class YellowFinOptimizer(Optimizer):
    """YellowFin (arXiv 1706.03471; op ``YellowFin``): momentum SGD whose
    rate and momentum are tuned per parameter from moving averages kept in
    ``<param>_moment``, ``_lr_avg`` (from ``alpha``), ``_mu_avg`` (from
    ``mu``), ``_curv_win`` (``curv_win_width`` values), ``_g_avg``,
    ``_g2_avg`` and ``_scalars_memory`` (5 values); the iteration is
    shared. Dense gradients only (``AssertionError``, as Caffe2)."""

    def __init__(self, alpha=0.1, mu=0.0, beta=0.999, curv_win_width=20, zero_debias=True, epsilon=0.1 ** 6,
                 policy="fixed", sparse_dedup_aggregator=None, **kwargs):
        super().__init__()
        self.alpha = alpha
        self.mu = mu
        self.beta = beta
        self.curv_win_width = curv_win_width
        self.zero_debias = zero_debias
        self.epsilon = epsilon
        self.policy = policy
        self.sparse_dedup_aggregator = sparse_dedup_aggregator
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param, grad):
        name = str(param)
        moment = param_init_net.ConstantFill([param], name + "_moment", value=0.0)
        curv_win = param_init_net.ConstantFill([], name + "_curv_win", shape=[self.curv_win_width], value=0.0)
        g_avg = param_init_net.ConstantFill([param], name + "_g_avg", value=0.0)
        g2_avg = param_init_net.ConstantFill([param], name + "_g2_avg", value=0.0)
        lr_avg = param_init_net.ConstantFill([], name + "_lr_avg", shape=[1], value=float(self.alpha))
        mu_avg = param_init_net.ConstantFill([], name + "_mu_avg", shape=[1], value=float(self.mu))
        scalars = param_init_net.ConstantFill([], name + "_scalars_memory", shape=[5], value=0.0)
        assert self.alpha > 0
        assert not isinstance(grad, core.GradientSlice), "YellowFin does not support sparse gradients"
        iteration = utils.BuildUniqueMutexIter(param_init_net, net, iter_val=0)
        self._shared(iteration)
        self._aux_params.local.extend([moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, scalars])
        state = [param, moment, lr_avg, mu_avg, curv_win, g_avg, g2_avg, scalars]
        net.YellowFin(state + [grad, iteration], state, beta=float(self.beta), epsilon=float(self.epsilon),
                      curv_win_width=int(self.curv_win_width), zero_debias=bool(self.zero_debias))

    def scale_learning_rate(self, scale):
        self.alpha *= scale


class WeightDecayBuilder(Optimizer):
    """Adds ``weight_decay * param`` to each weight's gradient (L2
    regularisation), before an optimizer's update."""

    def __init__(self, weight_decay):
        super().__init__()
        self.weight_decay = weight_decay

    def _run(self, net, param_init_net, param, grad):
        if isinstance(grad, core.GradientSlice):
            raise ValueError("Weight decay does not yet support sparse gradients")
        one = self.ones(param_init_net)
        name = "wd_0_0"
        if param_init_net.BlobIsDefined(name):
            wd = param_init_net.GetBlobRef(name)
        else:
            wd = param_init_net.ConstantFill([], name, shape=[1], value=float(self.weight_decay))
        net.WeightedSum([grad, one, param, wd], grad)


def _get_param_to_device(model):
    """Each blob's device, as the ops of the model's nets place it
    (Caffe2's helper; every device is the CPU here)."""
    param_to_device = core.InferBlobDevices(model.net)
    param_to_device.update(core.InferBlobDevices(model.param_init_net))
    return param_to_device


def get_param_device(param_name, grad, param_to_device=None, default_device=None):
    """The device of a parameter: its own, else its gradient's (the values,
    then the indices, of a sparse one), else ``default_device``; an
    AssertionError if none is known (Caffe2's)."""
    device = default_device
    param_to_device = param_to_device or {}
    if str(param_name) in param_to_device:
        device = param_to_device[str(param_name)]
    elif isinstance(grad, core.GradientSlice):
        for name in (str(grad.values), str(grad.indices)):
            if name in param_to_device:
                device = param_to_device[name]
                break
    elif str(grad) in param_to_device:
        device = param_to_device[str(grad)]
    assert device is not None, f"Cannot infer device for {param_name}: no op creates it"
    return device


def _calc_norm_ratio(model, params, name_scope, max_gradient_norm):
    """``clip_norm / max(clip_norm, global norm of the gradients)``, a blob
    (Caffe2's global-norm clipping: the learning rate is multiplied by it)."""
    with core.NameScope(name_scope):
        squared_sums = []
        for i, (_param, grad) in enumerate(params):
            values = grad.values if isinstance(grad, core.GradientSlice) else grad
            squared_sums.append(model.net.SumSqrElements(values, f"grad_{i}_squared_sum"))
        full_sum = model.net.Sum(squared_sums, "grad_squared_full_sum")
        global_norm = model.net.Pow(full_sum, "global_norm", exponent=0.5)
        clip_norm = model.param_init_net.ConstantFill(
            [], "clip_norm", shape=[], value=float(max_gradient_norm))
        max_norm = model.net.Max([global_norm, clip_norm], "max_norm")
        return model.net.Div([clip_norm, max_norm], "norm_ratio")


def _build(model, optimizer, weights_only=False, use_param_info_optim=True,
           max_gradient_norm=None, allow_lr_injection=False):
    params = [(param, grad) for param, grad in model.GetOptimizationParamInfo()
              if not (weights_only and param not in model.weights)]
    lr_multiplier = None
    if max_gradient_norm is not None:
        lr_multiplier = _calc_norm_ratio(model, params, "norm_clipped_grad_update", max_gradient_norm)
    if allow_lr_injection:
        if model.param_init_net.BlobIsDefined(_LEARNING_RATE_INJECTION):
            lr_injection = model.param_init_net.GetBlobRef(_LEARNING_RATE_INJECTION)
        else:
            lr_injection = model.param_init_net.ConstantFill(
                [], _LEARNING_RATE_INJECTION, shape=[1], value=1.0)
        if lr_multiplier is None:
            lr_multiplier = lr_injection
        else:
            lr_multiplier = model.net.Mul([lr_multiplier, lr_injection], "lr_multiplier", broadcast=1)
    if lr_multiplier is not None:
        optimizer.add_lr_multiplier(lr_multiplier)
    for param, grad in params:
        # A parameter made in a UseOptimizer block keeps that optimizer.
        info = (model.get_param_info(param) if use_param_info_optim
                and isinstance(param, core.BlobReference) and hasattr(model, "get_param_info")
                else None)
        if info is not None and info.optimizer:
            info.optimizer(model.net, model.param_init_net, param, grad)
        else:
            optimizer(model.net, model.param_init_net, param, grad)
    return optimizer


def get_lr_injection():
    """The current learning-rate injection (``allow_lr_injection``)."""
    return workspace.FetchBlob(_LEARNING_RATE_INJECTION)


def set_lr_injection(lr_injection_value):
    """Sets the learning-rate injection that every rate of an optimizer
    built with ``allow_lr_injection=True`` is multiplied by."""
    workspace.FeedBlob(_LEARNING_RATE_INJECTION,
                       np.array([float(lr_injection_value)], dtype=np.float32))


def add_weight_decay(model, weight_decay):
    """Adds a decay to the model's weights (``brew.fc``'s ``_w``, not its
    biases): each weight's gradient += weight_decay * weight."""
    _build(model, WeightDecayBuilder(weight_decay=weight_decay), weights_only=True,
           use_param_info_optim=False)


def build_sgd(model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs):
    """Adds SGD updates (``momentum`` > 0: MomentumSGDUpdate) of every
    parameter with a gradient; returns the optimizer."""
    return _build(model, SgdOptimizer(base_learning_rate, **kwargs),
                  max_gradient_norm=max_gradient_norm, allow_lr_injection=allow_lr_injection)


def build_adam(model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs):
    """Adds Adam updates (``base_learning_rate`` is Adam's alpha)."""
    return _build(model, AdamOptimizer(alpha=base_learning_rate, **kwargs),
                  max_gradient_norm=max_gradient_norm, allow_lr_injection=allow_lr_injection)


def build_adagrad(model, base_learning_rate, parameters=None, max_gradient_norm=None,
                  allow_lr_injection=False, **kwargs):
    """Adds Adagrad updates (``base_learning_rate`` is its alpha; sparse
    gradients get SparseAdagrad, or RowWiseSparseAdagrad with
    ``rowWise=True``; ``weight_decay`` goes to the update ops)."""
    return _build(model, AdagradOptimizer(alpha=base_learning_rate, **kwargs),
                  max_gradient_norm=max_gradient_norm, allow_lr_injection=allow_lr_injection)


def build_rms_prop(model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs):
    """Adds RMSProp updates (``decay``, ``momentum``, ``epsilon``) of every
    parameter with a dense gradient; returns the optimizer."""
    return _build(model, RmsPropOptimizer(alpha=base_learning_rate, **kwargs),
                  max_gradient_norm=max_gradient_norm, allow_lr_injection=allow_lr_injection)


def build_adadelta(model, base_learning_rate, parameters=None, max_gradient_norm=None,
                   allow_lr_injection=False, **kwargs):
    """Adds Adadelta updates (``epsilon``, ``decay``; sparse gradients on
    their rows); returns the optimizer."""
    return _build(model, AdadeltaOptimizer(alpha=base_learning_rate, **kwargs),
                  max_gradient_norm=max_gradient_norm, allow_lr_injection=allow_lr_injection)


def build_wngrad(model, base_learning_rate, parameters=None, max_gradient_norm=None, allow_lr_injection=False,
                 **kwargs):
    """Adds WNGrad updates (``base_learning_rate`` is its alpha;
    ``epsilon``, ``moment_init``; sparse gradients on their rows)."""
    return _build(model, WngradOptimizer(alpha=base_learning_rate, **kwargs),
                  max_gradient_norm=max_gradient_norm, allow_lr_injection=allow_lr_injection)


def build_storm(model, base_learning_rate, parameters=None, max_gradient_norm=None, allow_lr_injection=False,
                **kwargs):
    """Adds STORM updates (``base_learning_rate`` is its lr, the paper's
    k; ``momentum``, ``beta``, ``grad_sq_init``)."""
    return _build(model, StormOptimizer(lr=base_learning_rate, **kwargs),
                  max_gradient_norm=max_gradient_norm, allow_lr_injection=allow_lr_injection)


def build_decay_adagrad(model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs):
    """Adds Decay Adagrad updates (``beta1``, ``epsilon``,
    ``weight_decay``, ``bias_correction_first``)."""
    return _build(model, DecayAdagradOptimizer(alpha=base_learning_rate, **kwargs),
                  max_gradient_norm=max_gradient_norm, allow_lr_injection=allow_lr_injection)


def build_ftrl(model, engine="SIMD", **kwargs):
    """Adds FTRL updates (``alpha``, ``beta``, ``lambda1``, ``lambda2``).
    Caffe2 asserted that the ``SIMD`` engine was built; here every engine
    runs the same kernel."""
    return _build(model, FtrlOptimizer(engine=engine, **kwargs))


def build_gftrl(model, engine="", **kwargs):
    """Adds group-lasso FTRL updates (dense gradients)."""
    return _build(model, GFtrlOptimizer(engine=engine, **kwargs))


def build_multi_precision_sgd(model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False,
                              **kwargs):
    """Adds multi-precision SGD updates (``MultiPrecisionSgdOptimizer``);
    returns the optimizer."""
    return _build(model, MultiPrecisionSgdOptimizer(base_learning_rate, **kwargs),
                  max_gradient_norm=max_gradient_norm, allow_lr_injection=allow_lr_injection)


def build_fp16_sgd(model, base_learning_rate, **kwargs):
    """Adds FP16 SGD updates (``FP16SgdOptimizer``: momentum SGD with
    ``weight_decay``, default 1e-4, in the update op); returns the
    optimizer."""
    return _build(model, FP16SgdOptimizer(base_learning_rate, **kwargs))


def build_yellowfin(model, base_learning_rate=0.1, **kwargs):
    """Adds YellowFin updates (``base_learning_rate`` is the initial rate;
    ``mu``, ``beta``, ``curv_win_width``, ``zero_debias``, ``epsilon``)."""
    return _build(model, YellowFinOptimizer(alpha=base_learning_rate, **kwargs))
