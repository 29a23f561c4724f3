"""Parameter updates added to a model's net (Caffe2's ``optimizer``):
``build_sgd`` and ``build_adam``.

Each run of the net advances the shared iteration counter
(``optimizer_iteration``, an ``AtomicIter`` under ``iteration_mutex``),
computes the learning rate with ``LearningRate`` from it, and updates every
parameter that has a gradient (``model.param_to_grad``, filled by
``model.AddGradientOperators``). As in Caffe2, ``LearningRate`` gets
``base_lr = -base_learning_rate``: plain SGD adds ``lr * grad`` with
``WeightedSum`` and Adam adds its step times ``lr``, while
``MomentumSGDUpdate``, which subtracts, gets the rate's sign flipped back.
"""

from ferrocaffe import core, utils

__all__ = ["AdamOptimizer", "Optimizer", "SgdOptimizer", "build_adam", "build_sgd"]


class Optimizer:
    _instance_counts = {}

    def __init__(self):
        cls = type(self).__name__
        self._instance_num = Optimizer._instance_counts.get(cls, 0)
        Optimizer._instance_counts[cls] = self._instance_num + 1
        self._lr = None

    def __call__(self, net, param_init_net, param, grad):
        if isinstance(grad, core.GradientSlice):
            raise NotImplementedError(f"{type(self).__name__}: sparse gradients are not supported yet")
        return self._run(net, param_init_net, param, grad)

    def build_lr(self, net, param_init_net, base_learning_rate, policy="fixed", **kwargs):
        """The learning rate blob (one per optimizer), and the iteration."""
        iteration = utils.BuildUniqueMutexIter(param_init_net, net)
        if self._lr is None:
            name = f"{type(self).__name__}_{self._instance_num}_lr_cpu"
            self._lr = net.LearningRate(
                [iteration], name, base_lr=-base_learning_rate, policy=policy, **kwargs
            )
        return self._lr, iteration

    @staticmethod
    def ones(param_init_net):
        name = "ONE_0_0"
        if param_init_net.BlobIsDefined(name):
            return param_init_net.GetBlobRef(name)
        return param_init_net.ConstantFill([], name, shape=[1], value=1.0)


class SgdOptimizer(Optimizer):
    def __init__(self, base_learning_rate=0.01, policy="fixed", momentum=0.0, nesterov=True, **kwargs):
        super().__init__()
        self.base_learning_rate = base_learning_rate
        self.policy = policy
        self.momentum = momentum
        self.nesterov = nesterov
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param, grad):
        if self.base_learning_rate == 0:
            return
        # MomentumSGDUpdate subtracts; WeightedSum adds (build_lr negates).
        sign = -1 if self.momentum else 1
        lr, _ = self.build_lr(
            net, param_init_net, self.base_learning_rate * sign, policy=self.policy, **self.init_kwargs
        )
        if self.momentum > 0:
            m = param_init_net.ConstantFill([param], str(param) + "_momentum", value=0.0)
            net.MomentumSGDUpdate(
                [grad, m, lr, param], [grad, m, param],
                momentum=self.momentum, nesterov=int(bool(self.nesterov)),
            )
        else:
            one = self.ones(param_init_net)
            net.WeightedSum([param, one, grad, lr], param)


class AdamOptimizer(Optimizer):
    def __init__(self, alpha=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8, policy="fixed", **kwargs):
        super().__init__()
        self.alpha = alpha
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.policy = policy
        self.init_kwargs = kwargs

    def _run(self, net, param_init_net, param, grad):
        lr, iteration = self.build_lr(net, param_init_net, self.alpha, policy=self.policy, **self.init_kwargs)
        m1 = param_init_net.ConstantFill([param], str(param) + "_first_moment", value=0.0)
        m2 = param_init_net.ConstantFill([param], str(param) + "_second_moment", value=0.0)
        net.Adam(
            [param, m1, m2, grad, lr, iteration], [param, m1, m2],
            beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
        )


def _build(model, optimizer):
    for param, grad in model.GetOptimizationParamInfo():
        optimizer(model.net, model.param_init_net, param, grad)
    return optimizer


def build_sgd(model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs):
    """Adds SGD updates (``momentum`` > 0: MomentumSGDUpdate) of every
    parameter with a gradient; returns the optimizer."""
    if max_gradient_norm is not None or allow_lr_injection:
        raise NotImplementedError("build_sgd: max_gradient_norm and allow_lr_injection are not supported yet")
    return _build(model, SgdOptimizer(base_learning_rate, **kwargs))


def build_adam(model, base_learning_rate, max_gradient_norm=None, allow_lr_injection=False, **kwargs):
    """Adds Adam updates (``base_learning_rate`` is Adam's alpha)."""
    if max_gradient_norm is not None or allow_lr_injection:
        raise NotImplementedError("build_adam: max_gradient_norm and allow_lr_injection are not supported yet")
    return _build(model, AdamOptimizer(alpha=base_learning_rate, **kwargs))
