"""Gradients: the registry of gradient makers and the backward pass (issue 14).

This module sits below ``core``: ``core.IR`` and ``core.GradientSlice``
are the ones here, ``core.GradientRegistry`` is the registry here with the
backward pass's map in BlobReferences, and ``core.Net.AddGradientOperators``
calls it.
As in Caffe2:

- a gradient maker is ``f(op, g_output) -> (gradient_ops, g_input)``:
  ``g_output`` holds, per output of the forward op, the name of its
  gradient blob (or None), and ``g_input`` one entry per input (a name,
  a ``GradientSlice`` or None);
- the gradient of a blob ``x`` is named ``x_grad``; the gradient of a loss
  ``y`` that the caller does not give is ``y_autogen_grad``, a
  ``ConstantFill`` of ones shaped like ``y``;
- a blob version read by several ops gets one gradient from each; they are
  summed by a ``Sum`` op placed after the gradient ops of its first reader,
  the extra gradients renamed ``_x_grad_autosplit_<n>``;
- ops are played forward in SSA form (an in-place op makes a new version of
  its output), so the gradient of each version is the one used.

Caffe2 kept most makers in C++ beside the kernels; here every maker is
Python, registered below, so built-in and user gradients go through one
registry (``RegisterGradient`` replaces a maker). Gradient ops get the
forward op's device option and engine; those of the built-in makers also
get its arguments unless the maker says otherwise (as Caffe2's C++ makers,
``CopyArguments``), those of makers registered from Python do not (as in
Caffe2).
"""

from collections import defaultdict, namedtuple

from ferrocaffe import _python_ops, errors
from ferrocaffe.proto import caffe2_pb2

__all__ = ["IR", "GradientRegistry", "GradientSlice", "GradientWrapper"]

AUTOGEN_GRAD_SUFFIX = "_autogen_grad"
GRAD_SUFFIX = "_grad"

#: A sparse gradient: the rows (``indices``) and their ``values``.
GradientSlice = namedtuple("GradientSlice", ["indices", "values"])


def grad_name(name):
    """The gradient blob of ``name`` (Caffe2's ``GI`` / ``GradientName``)."""
    return str(name) + GRAD_SUFFIX


def _op(op_type, inputs, outputs, **args):
    """A gradient op. This module sits below ``core`` (whose CreateOperator
    users' makers call), so the built-in makers build their few argument
    kinds (ints and floats) here."""
    op = caffe2_pb2.OperatorDef()
    op.type = op_type
    op.input.extend(str(i) for i in inputs)
    op.output.extend(str(o) for o in outputs)
    for name, value in args.items():
        a = op.arg.add()
        a.name = name
        if isinstance(value, float):
            a.f = value
        else:
            a.i = int(value)
    return op


class GradientRegistry:
    """Maps an op type to its gradient maker."""

    gradient_registry_ = {}
    # Built-in makers whose gradient ops take the forward op's arguments
    # (Caffe2's C++ makers, CopyArguments() true); makers registered with
    # RegisterGradient return their ops as they are, as in Caffe2.
    _copy_args = set()

    @classmethod
    def RegisterGradient(cls, op_type):
        """Decorator: ``@GradientRegistry.RegisterGradient("MyOp")`` registers
        ``f(op, g_output) -> (ops, g_input)`` as MyOp's gradient maker
        (replacing any maker it had)."""

        def wrapper(func):
            cls.gradient_registry_[op_type] = func
            cls._copy_args.discard(op_type)
            return func

        return wrapper

    @classmethod
    def _builtin(cls, op_type, copy_arguments=True):
        def wrapper(func):
            cls.RegisterGradient(op_type)(func)
            if copy_arguments:
                cls._copy_args.add(op_type)
            return func

        return wrapper

    @classmethod
    def GetGradientForOp(cls, op, g_output):
        """The gradient ops of ``op`` and the gradients of its inputs, given
        the gradients of its outputs."""
        maker = cls.gradient_registry_.get(op.type)
        if maker is None:
            raise errors.InvalidArgumentError(
                f"no gradient is registered for operator type {op.type} "
                f"(op '{op.name or op.type}' with outputs {list(op.output)}); register one with "
                "core.GradientRegistry.RegisterGradient or stop the gradient with StopGradient",
                op=op.type,
            )
        g_output = list(g_output)
        if len(g_output) != len(op.output):
            raise errors.InvalidArgumentError(
                f"{op.type}: {len(g_output)} output gradients given for {len(op.output)} outputs",
                op=op.type,
            )
        gradient_ops, g_input = maker(op, g_output)
        gradient_ops = list(gradient_ops or [])
        g_input = list(g_input) if g_input is not None else [None] * len(op.input)
        if len(g_input) != len(op.input):
            raise errors.InvalidArgumentError(
                f"the gradient maker of {op.type} returned {len(g_input)} input gradients "
                f"for {len(op.input)} inputs",
                op=op.type,
            )
        copy_args = op.type in cls._copy_args
        for g in gradient_ops:
            g.is_gradient_op = True
            if op.HasField("device_option") and not g.HasField("device_option"):
                g.device_option.CopyFrom(op.device_option)
            if op.engine and not g.engine:
                g.engine = op.engine
            if copy_args:
                have = {a.name for a in g.arg}
                g.arg.extend(a for a in op.arg if a.name not in have)
        return gradient_ops, g_input

    @classmethod
    def GetBackwardPass(cls, operators, ys, ys_generate_gradient=False):
        """(gradient ops, {blob name: its gradient's name}) for the losses
        ``ys`` (a list, or a dict giving some of their gradients) through
        ``operators``."""
        return IR(operators).GetBackwardPass(ys)


# (the gradient op or None, which of its outputs, the gradient blob name)
_Generator = namedtuple("_Generator", ["grad_op", "idx", "gradient"])


class IR:
    """The forward ops in SSA form, and the backward pass over them."""

    def __init__(self, operators):
        self.ssa = []
        self.frontier = defaultdict(int)
        # name -> version -> indices of the ops that read it
        self.input_usages = defaultdict(lambda: defaultdict(list))
        # name -> version -> the gradients made for it
        self.gradient_generators = defaultdict(lambda: defaultdict(list))
        for op in operators:
            self.Play(op)

    def Play(self, op):
        in_versions = {}
        for name in op.input:
            in_versions[name] = self.frontier[name]
            self.input_usages[name][self.frontier[name]].append(len(self.ssa))
        for name in op.output:
            self.frontier[name] += 1
        out_versions = {name: self.frontier[name] for name in op.output}
        self.ssa.append((op, in_versions, out_versions))

    def _init_gradients(self, ys):
        input_to_grad, ops = {}, []
        for y, g in ys.items():
            y = str(y)
            op = None
            if g is None:
                op = _op("ConstantFill", [y], [y + AUTOGEN_GRAD_SUFFIX], value=1.0)
                op.is_gradient_op = True
                ops.append(op)
                g = op.output[0]
            elif not isinstance(g, GradientSlice):
                g = str(g)
            input_to_grad[y] = g
            # The loss's gradient joins those of its other readers, if any.
            self.input_usages[y][self.frontier[y]].append(len(self.ssa))
            self.gradient_generators[y][self.frontier[y]].append(
                _Generator(op, 0 if op is not None else None, g)
            )
        return input_to_grad, ops

    def _record_generators(self, fwd_idx, grad_ops, g_input):
        op, in_versions, _ = self.ssa[fwd_idx]
        seen = set()
        for name, g in zip(op.input, g_input):
            if g is None or name in seen:
                continue
            seen.add(name)
            if isinstance(g, GradientSlice):
                raise errors.InvalidArgumentError(
                    f"{op.type}: sparse gradients (GradientSlice) are not supported yet", op=op.type
                )
            made_by = None
            for gop in reversed(grad_ops):
                if str(g) in gop.output:
                    made_by = _Generator(gop, list(gop.output).index(str(g)), str(g))
                    break
            self.gradient_generators[name][in_versions[name]].append(
                made_by or _Generator(None, None, str(g))
            )

    def _sum_ops(self, name, version):
        gens = self.gradient_generators[name][version]
        if len(gens) < 2:
            return [], None
        base = grad_name(name)
        inputs, cnt, first = [], 0, True
        for gen in gens:
            if gen.grad_op is not None:
                if first:
                    first = False
                    inputs.append(gen.grad_op.output[gen.idx])
                else:
                    new = "_" + gen.grad_op.output[gen.idx] + f"_autosplit_{cnt}"
                    cnt += 1
                    gen.grad_op.output[gen.idx] = new
                    inputs.append(new)
            else:
                if gen.gradient == base:
                    raise errors.InvalidArgumentError(
                        f"the gradient of '{name}' passed through without an op is named "
                        f"'{base}', the name its summed gradient needs"
                    )
                inputs.append(gen.gradient)
        if base in inputs:
            # Sum may work in place on its first input only.
            k = inputs.index(base)
            inputs[0], inputs[k] = inputs[k], inputs[0]
        s = _op("Sum", inputs, [base])
        s.is_gradient_op = True
        return [s], base

    def GetBackwardPass(self, ys):
        if isinstance(ys, (list, tuple)):
            ys = {y: None for y in ys}
        elif not isinstance(ys, dict):
            raise TypeError("ys should either be a list or a dict.")
        all_to_grad, all_ops = self._init_gradients(ys)
        for idx in reversed(range(len(self.ssa))):
            op, in_versions, _ = self.ssa[idx]
            g_output = [all_to_grad.get(name) for name in op.output]
            if any(g is not None for g in g_output):
                grad_ops, g_input = GradientRegistry.GetGradientForOp(op, g_output)
                self._record_generators(idx, grad_ops, g_input)
                for name, g in zip(op.input, g_input):
                    # Keep a gradient already known unless this op rewrote the blob.
                    if g is not None or name not in all_to_grad or name in op.output:
                        all_to_grad[name] = g
                all_ops += grad_ops
            for name in dict.fromkeys(op.input):
                usage = self.input_usages[name][in_versions[name]]
                if len(usage) > 1 and usage[0] == idx:
                    sum_ops, g = self._sum_ops(name, in_versions[name])
                    if sum_ops:
                        all_ops += sum_ops
                        all_to_grad[name] = g
        # Names here; core.GradientRegistry hands them out as BlobReferences.
        out = {name: g for name, g in all_to_grad.items() if g is not None}
        return all_ops, out


class GradientWrapper:
    """Shortcuts a gradient maker uses: ``I(i)``, ``O(i)``, ``GI(i)``, ``GO(i)``."""

    def __init__(self, op, g_output):
        self.op, self.g_output = op, g_output

    def I(self, i):
        return self.op.input[i]

    def O(self, i):
        return self.op.output[i]

    def GI(self, i):
        return grad_name(self.op.input[i])

    def GO(self, i):
        return self.g_output[i]


# ----------------------------------------------------------------- makers --

_register = GradientRegistry._builtin


def _no_gradient(op, g_output):
    return [], [None] * len(op.input)


# Ops whose outputs carry no gradient back (Caffe2's NO_GRADIENT).
for _t in (
    "StopGradient", "Accuracy", "ConstantFill", "GivenTensorFill", "UniformFill",
    "UniformIntFill", "GaussianFill", "XavierFill", "MSRAFill", "LearningRate",
    "Iter", "AtomicIter", "EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or", "Xor", "Not",
):
    _register(_t)(_no_gradient)
_register("Float16ConstantFill")(_no_gradient)
_register("Float16UniformFill")(_no_gradient)


def _convert_maker(grad_type):
    # A dtype conversion's gradient is the opposite conversion.
    def maker(op, g_output):
        w = GradientWrapper(op, g_output)
        return [_op(grad_type, [w.GO(0)], [w.GI(0)])], [w.GI(0)]
    return maker


@_register("Cast", copy_arguments=False)
def _cast_grad(op, g_output):
    # A Cast back to the input's dtype, which the op must name (from_type).
    args = {a.name: a for a in op.arg}
    if "from_type" not in args or "to" not in args:
        raise errors.InvalidArgumentError(
            "the gradient of Cast needs its argument 'from_type' (the input's dtype)", op="Cast")

    def value(a):  # a DataType number, also when given by name
        if a.HasField("s"):
            return caffe2_pb2.TensorProto.DataType.Value(a.s.decode().upper())
        return a.i
    w = GradientWrapper(op, g_output)
    back = _op("Cast", [w.GO(0)], [w.GI(0)], to=value(args["from_type"]),
               from_type=value(args["to"]))
    return [back], [w.GI(0)]


@_register("Copy", copy_arguments=False)
def _copy_grad(op, g_output):
    # The gradient goes back to the input's device: CopyOnDeviceLike.
    w = GradientWrapper(op, g_output)
    return [_op("CopyOnDeviceLike", [w.GO(0), w.I(0)], [w.GI(0)])], [w.GI(0)]


_register("FloatToHalf", copy_arguments=False)(_convert_maker("HalfToFloat"))
_register("HalfToFloat", copy_arguments=False)(_convert_maker("FloatToHalf"))


def _fc_maker(grad_type):
    def maker(op, g_output):
        w = GradientWrapper(op, g_output)
        ops = [_op(grad_type, [w.I(0), w.I(1), w.GO(0)], [w.GI(1), w.GI(2), w.GI(0)])]
        return ops, [w.GI(0), w.GI(1), w.GI(2)]

    return maker


_register("FC")(_fc_maker("FCGradient"))
_register("FCTransposed")(_fc_maker("FCTransposedGradient"))


def _arg_i(op, name, default=0):
    for a in op.arg:
        if a.name == name:
            return a.i
    return default


@_register("MatMul", copy_arguments=False)
def _matmul_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    a, b, dy = w.I(0), w.I(1), w.GO(0)
    ta, tb = _arg_i(op, "trans_a"), _arg_i(op, "trans_b")
    # dA = dY op(B)^T (transposed back when trans_a); dB = op(A)^T dY likewise.
    if ta:
        da = _op("MatMul", [b, dy], [w.GI(0)], trans_a=1 if tb else 0, trans_b=1)
        db = _op("MatMul", [dy, a], [w.GI(1)], trans_a=1, trans_b=1) if tb else _op("MatMul", [a, dy], [w.GI(1)])
    else:
        da = _op("MatMul", [dy, b], [w.GI(0)], trans_b=0 if tb else 1)
        db = _op("MatMul", [dy, a], [w.GI(1)], trans_a=1) if tb else _op("MatMul", [a, dy], [w.GI(1)], trans_a=1)
    return [da, db], [w.GI(0), w.GI(1)]


def _output_based(grad_type):
    """Gradient ops that read the forward output: (Y, dY) -> dX."""

    def maker(op, g_output):
        w = GradientWrapper(op, g_output)
        return [_op(grad_type, [w.O(0), w.GO(0)], [w.GI(0)])], [w.GI(0)]

    return maker


for _t in ("Relu", "Sigmoid", "Tanh", "Softmax"):
    _register(_t)(_output_based(_t + "Gradient"))


@_register("Python", copy_arguments=False)
def _python_grad(op, g_output):
    """Caffe2's PythonGradient: the gradient function gets the forward
    inputs, outputs and (the chosen) output gradients, and writes the
    chosen input gradients."""
    w = GradientWrapper(op, g_output)
    args = {a.name: a for a in op.arg}
    go = list(args["grad_output_indices"].ints) if "grad_output_indices" in args else []
    gi = list(args["grad_input_indices"].ints) if "grad_input_indices" in args else []
    go = go or list(range(len(op.output)))
    gi = gi or list(range(len(op.input)))
    g = _op("PythonGradient", list(op.input) + list(op.output) + [w.GO(i) for i in go],
            [w.GI(i) for i in gi])
    if "token" in args and args["token"].s:
        a = g.arg.add()
        a.name = "token"
        a.s = _python_ops.gradient_token(args["token"].s.decode()).encode()
    elif "pickled_grad_builder" in args:
        a = g.arg.add()
        a.name = "pickled_builder"
        a.s = args["pickled_grad_builder"].s
    if "pass_workspace" in args:
        g.arg.add().CopyFrom(args["pass_workspace"])
    grads = [None] * len(op.input)
    for i in gi:
        grads[i] = w.GI(i)
    return [g], grads


@_register("SoftmaxWithLoss")
def _softmax_with_loss_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    ins = list(op.input) + [w.O(0), w.GO(1)]
    g_in = [w.GI(0)] + [None] * (len(op.input) - 1)
    if w.GO(1) is None:
        return [], [None] * len(op.input)
    return [_op("SoftmaxWithLossGradient", ins, [w.GI(0)])], g_in


@_register("LabelCrossEntropy")
def _lce_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("LabelCrossEntropyGradient", [w.I(0), w.I(1), w.GO(0)], [w.GI(0)])], [w.GI(0), None]


@_register("AveragedLoss")
def _avg_loss_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("AveragedLossGradient", [w.I(0), w.GO(0)], [w.GI(0)])], [w.GI(0)]


@_register("SquaredL2Distance")
def _l2_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    ops = [_op("SquaredL2DistanceGradient", [w.I(0), w.I(1), w.GO(0)], [w.GI(0), w.GI(1)])]
    return ops, [w.GI(0), w.GI(1)]


def _binary_maker(grad_type):
    def maker(op, g_output):
        w = GradientWrapper(op, g_output)
        if w.I(0) == w.I(1):
            # x op x: both gradients go to one blob, summed here.
            tmp = "_" + w.GI(0) + "_rhs"
            ops = [
                _op(grad_type, [w.GO(0), w.I(0), w.I(1)], [w.GI(0), tmp]),
                _op("Sum", [w.GI(0), tmp], [w.GI(0)]),
            ]
            return ops, [w.GI(0), w.GI(0)]
        ops = [_op(grad_type, [w.GO(0), w.I(0), w.I(1)], [w.GI(0), w.GI(1)])]
        return ops, [w.GI(0), w.GI(1)]

    return maker


for _t in ("Add", "Sub", "Mul"):
    _register(_t)(_binary_maker(_t + "Gradient"))


@_register("Sum")
def _sum_grad(op, g_output):
    # Every input's gradient is the output's: no op needed.
    return [], [g_output[0]] * len(op.input)


@_register("Scale")
def _scale_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("Scale", [w.GO(0)], [w.GI(0)])], [w.GI(0)]


_register("LeakyRelu")(_output_based("LeakyReluGradient"))


@_register("Abs")
def _abs_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("AbsGradient", [w.I(0), w.GO(0)], [w.GI(0)])], [w.GI(0)]


@_register("Exp", copy_arguments=False)
def _exp_grad(op, g_output):
    # d exp(x) = exp(x) dx: the output times its gradient.
    w = GradientWrapper(op, g_output)
    return [_op("Mul", [w.O(0), w.GO(0)], [w.GI(0)])], [w.GI(0)]


@_register("Log", copy_arguments=False)
def _log_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("Div", [w.GO(0), w.I(0)], [w.GI(0)])], [w.GI(0)]


@_register("Sqrt", copy_arguments=False)
def _sqrt_grad(op, g_output):
    # d sqrt(x) = dx / (2 sqrt(x)).
    w = GradientWrapper(op, g_output)
    ops = [
        _op("Scale", [w.GO(0)], [w.GI(0)], scale=0.5),
        _op("Div", [w.GI(0), w.O(0)], [w.GI(0)]),
    ]
    return ops, [w.GI(0)]


@_register("Negative", copy_arguments=False)
def _negative_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("Negative", [w.GO(0)], [w.GI(0)])], [w.GI(0)]
