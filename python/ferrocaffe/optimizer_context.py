"""Per-parameter optimizers chosen by context (Caffe2's ``optimizer_context``).

``with UseOptimizer(opt):`` (or ``UseOptimizer({"WEIGHT": w_opt, "BIAS":
b_opt, "DEFAULT": opt})``) makes the parameters that ``model.create_param``
creates inside the block remember that optimizer (by tag, else DEFAULT);
``optimizer.build_*`` then leaves them to it. Blocks nest; an inner block's
keys override the outer's until it ends.
"""

from ferrocaffe import context

__all__ = ["DEFAULT_OPTIM", "OptimizerContext", "UseOptimizer"]

DEFAULT_OPTIM = "DEFAULT"


class OptimizerContext(context.DefaultManaged):
    """The stack of {tag: optimizer} maps ``UseOptimizer`` blocks pushed."""

    def __init__(self):
        self._stack = []

    def _merged(self):
        merged = {}
        for layer in self._stack:
            merged.update(layer)
        return merged

    def has_optimizer(self, name):
        return name in self._merged()

    def get_optimizer(self, name):
        merged = self._merged()
        if name not in merged:
            raise AssertionError(f"{name} optimizer is not provided!")
        return merged[name]

    def push_optimizers(self, optimizers):
        self._stack.append(dict(optimizers))

    def pop_optimizers(self):
        if not self._stack:
            raise AssertionError("no UseOptimizer block is active")
        self._stack.pop()


class UseOptimizer:
    """Context manager: an optimizer (for DEFAULT) or a {tag: optimizer} map."""

    def __init__(self, optim_or_dict):
        self._optimizers = dict(optim_or_dict) if isinstance(optim_or_dict, dict) else {DEFAULT_OPTIM: optim_or_dict}

    def __enter__(self):
        OptimizerContext.current().push_optimizers(self._optimizers)
        return self

    def __exit__(self, *exc):
        OptimizerContext.current().pop_optimizers()
