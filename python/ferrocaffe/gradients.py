"""Gradients: the registry of gradient makers and the backward pass.

This module sits below ``core``: ``core.IR`` and ``core.GradientSlice``
are the ones here, ``core.GradientRegistry`` is the registry here with the
backward pass's map in BlobReferences, and ``core.Net.AddGradientOperators``
calls it.
As in Caffe2:

- a gradient maker is ``f(op, g_output) -> (gradient_ops, g_input)``:
  ``g_output`` holds, per output of the forward op, the name of its
  gradient blob (or None), and ``g_input`` one entry per input (a name,
  a ``GradientSlice`` or None); ``gradient_ops`` is a list of ops, one op,
  or None;
- the gradient of a blob ``x`` is named ``x_grad``; the gradient of a loss
  ``y`` that the caller does not give is ``y_autogen_grad``, a
  ``ConstantFill`` of ones shaped like ``y``;
- a blob version read by several ops gets one gradient from each; they are
  summed by a ``Sum`` op placed after the gradient ops of its first reader,
  the extra gradients renamed ``_x_grad_autosplit_<n>``;
- ops are played forward in SSA form (an in-place op makes a new version of
  its output), so the gradient of each version is the one used; a gradient
  op that needs a version an op later overwrote is an error naming it;
- a sparse gradient is a ``GradientSlice`` (indices, values), as Gather's and
  SparseLengthsSum's makers give; several for one blob are summed by
  concatenating their indices and their values
  (``x_grad_indices_concat``, ``x_grad_values_concat``); a blob may not get
  both sparse and dense gradients, nor a maker a sparse output gradient
  unless it takes one.

One rule is kept by the backward pass itself, not by each maker: **every
read of a blob contributes its own gradient, and no gradient op overwrites
a gradient that is still needed**. Repeated inputs of one op (``Mul(x, x)``,
``Concat(x, x)``, ``Sum(x, x, x)``) are shown to the maker under distinct
names, so each read gets its own gradient and they are summed like any
others; the gradient ops are built over values and named at the end, so a
maker that writes in place into an output gradient another reader shares
(Caffe2's ``Sqr`` scaled ``dY`` so) gets a fresh blob instead (see "The
backward pass" below).

Caffe2 kept most makers in C++ beside the kernels; here every maker is
Python, registered below, so built-in and user gradients go through one
registry (``RegisterGradient`` replaces a maker). Gradient ops of the
built-in makers get the forward op's device option, engine and (unless the
maker says otherwise) arguments, and are marked ``is_gradient_op``, as
Caffe2's C++ makers' were; makers registered from Python return their ops
as they are (as in Caffe2).
"""

import re
from collections import defaultdict, namedtuple

from ferrocaffe import _core, _python_ops, errors
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
    op.name = ""  # set, as Caffe2's CreateOperator and C++ makers set it
    op.input.extend(str(i) for i in inputs)
    op.output.extend(str(o) for o in outputs)
    for name, value in args.items():
        a = op.arg.add()
        a.name = name
        if isinstance(value, float):
            a.f = value
        elif isinstance(value, (str, bytes)):
            a.s = value.encode() if isinstance(value, str) else value
        elif isinstance(value, (list, tuple)):
            a.ints.extend(int(v) for v in value)
        else:
            a.i = int(value)
    return op


def _check_schema(op):
    """A forward op must fit its schema before its gradient is made (Caffe2's
    C++ makers check it)."""
    s = _core.operator_schema(op.type)
    if s is None:
        return
    for what, n, lo, hi in (("inputs", len(op.input), s["min_inputs"], s["max_inputs"]),
                            ("outputs", len(op.output), s["min_outputs"], s["max_outputs"])):
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
            raise errors.InvalidArgumentError(
                f"Operator def did not pass schema checking: {op.type} takes {want} {what}, "
                f"got {n} (op {list(op.input)} -> {list(op.output)}); its gradient cannot be made",
                op=op.type,
            )


class GradientRegistry:
    """Maps an op type to its gradient maker."""

    gradient_registry_ = {}
    # Built-in makers whose gradient ops take the forward op's arguments
    # (Caffe2's C++ makers, CopyArguments() true); makers registered with
    # RegisterGradient return their ops as they are, as in Caffe2.
    _copy_args = set()
    # The built-in makers (Caffe2's C++ ones), as opposed to those
    # registered with RegisterGradient.
    _builtins = set()
    # Makers that take a GradientSlice as an output's gradient.
    _sparse_aware = {"StopGradient"}

    @classmethod
    def RegisterGradient(cls, op_type):
        """Decorator: ``@GradientRegistry.RegisterGradient("MyOp")`` registers
        ``f(op, g_output) -> (ops, g_input)`` as MyOp's gradient maker
        (replacing any maker it had)."""

        def wrapper(func):
            cls.gradient_registry_[op_type] = func
            cls._builtins.discard(op_type)
            cls._copy_args.discard(op_type)
            return func

        return wrapper

    @classmethod
    def _builtin(cls, op_type, copy_arguments=True):
        def wrapper(func):
            cls.RegisterGradient(op_type)(func)
            cls._builtins.add(op_type)
            if copy_arguments:
                cls._copy_args.add(op_type)
            return func

        return wrapper

    @classmethod
    def GetGradientForOp(cls, op, g_output):
        """The gradient ops of ``op`` and the gradients of its inputs, given
        the gradients of its outputs. A maker may return one op, a list of
        ops or None (Caffe2's protocol)."""
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
        builtin = op.type in cls._builtins
        if builtin:
            _check_schema(op)
        for name, g in zip(op.output, g_output):
            if isinstance(g, GradientSlice) and op.type not in cls._sparse_aware:
                raise errors.InvalidArgumentError(
                    f"{op.type}: the gradient of output '{name}' is sparse (a GradientSlice), "
                    "expected dense; turn it dense with SparseToDense (Gather: dense_gradient=1)",
                    op=op.type,
                )
        gradient_ops, g_input = maker(op, g_output)
        if gradient_ops is None:
            gradient_ops = []
        elif isinstance(gradient_ops, caffe2_pb2.OperatorDef):
            gradient_ops = [gradient_ops]
        else:
            gradient_ops = list(gradient_ops)
        g_input = list(g_input) if g_input is not None else [None] * len(op.input)
        if len(g_input) != len(op.input):
            raise errors.InvalidArgumentError(
                f"the gradient maker of {op.type} returned {len(g_input)} input gradients "
                f"for {len(op.input)} inputs",
                op=op.type,
            )
        if builtin:
            # As Caffe2's C++ makers: gradient ops are marked, and take the
            # forward op's device option and engine (and its arguments,
            # unless the maker says otherwise); makers registered from
            # Python return their ops as they are.
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


# ------------------------------------------------------------ backward pass --
#
# The backward pass. It follows Caffe2's IR (SSA versions of the forward blobs, one
# gradient generator per read of a blob version, a Sum where a version has
# several) with one change of representation: the gradient ops are built
# over *values*, not names. A maker still sees and returns names (Caffe2's
# protocol); each maker's ops are read as a small program (a name it wrote
# means the value it wrote last, a name of an output gradient means that
# gradient, any other name a blob that exists), so two reads of one blob,
# in one op or in several, are always two values. Names are given at the
# end by one pass (``_Naming``) that hands each value the name Caffe2 would
# have given it unless a value still needed holds that name (a forward
# blob, a gradient another blob shares, a gradient the map returns, a
# contribution not yet summed): then it gets a fresh one. So no gradient op
# can overwrite a gradient that another reader still sees, whatever its
# maker does in place, and the names stay Caffe2's everywhere Caffe2 was
# right. An op carrying nets (a gradient If, While or Do, control_ops_grad)
# is read as its maker wrote it: its nets are renamed with its inputs and
# outputs by the names the maker gave (``_rename_in_nets``; a Do's net has
# names of its own), and since its nets may write an output before their
# last read of an input, it writes in place only where the maker wrote one
# name as both (a loop carries that blob).

# A repeated input's later occurrences, and an input the op overwrites in
# place, are shown to the maker under a placeholder name ("x\0<k>\0"), so
# that each read gets gradient names of its own and a read of the input is
# told from a read of the output; the placeholder is taken out of every
# name afterwards.
_DUP = re.compile("\x00[0-9]+\x00")


def _strip(name):
    return _DUP.sub("", name)


class _Value:
    """A gradient value of the backward pass. ``cell`` holds its wanted
    name and is shared by the values a maker wrote under one name (renaming
    the last renames the chain); a ``fixed`` value is a blob that exists
    already (a forward blob, a given gradient) and keeps its name."""

    __slots__ = ("cell", "fixed", "name")

    def __init__(self, want=None, fixed=False, cell=None):
        self.cell = cell if cell is not None else [want]
        self.fixed = fixed
        self.name = self.cell[0] if fixed else None

    @property
    def want(self):
        return self.cell[0]


# An op of the backward pass: the OperatorDef (names filled in at the end)
# and the values it reads and writes; for an op carrying nets, ``raw`` is
# the names its maker gave its inputs and outputs (the nets use them).
_Step = namedtuple("_Step", ["op", "ins", "outs", "raw"], defaults=(None,))
# One contribution to a blob version's gradient: the value (a _Value, or a
# GradientSlice of two), whether this reader's gradient ops made it (else it
# passed through; for a GradientSlice, a flag per part), and the device
# option of what made it.
_Gen = namedtuple("_Gen", ["value", "made", "device_option"])


def _device_equal(a, b):
    """Caffe2's device_option_equal, node name and seed ignored."""
    if not a.device_type or not b.device_type:
        return not a.device_type and not b.device_type
    return a.device_type == b.device_type and a.device_id == b.device_id


class IR:
    """The forward ops in SSA form, and the backward pass over them."""

    IS_AUTO_GEN_SUM_OPS_TAG = "is_auto_gen_sum_ops"
    ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG = "only_keep_is_auto_gen_sum_ops_tag"
    AUTOGEN_GRAD_SUFFIX = AUTOGEN_GRAD_SUFFIX

    def __init__(self, operators):
        self.ssa = []
        self.frontier = defaultdict(int)
        # name -> version -> indices of the ops that read it (once per read)
        self.input_usages = defaultdict(lambda: defaultdict(list))
        # name -> version -> the contributions to its gradient (_Gen)
        self.gradient_generators = defaultdict(lambda: defaultdict(list))
        # name -> the version its current gradient belongs to
        self.gradient_frontier = {}
        self.out_version_history = defaultdict(list)
        self.in_version_history = defaultdict(list)
        for op in operators:
            self.Play(op)
        self.SanityCheck(operators)

    def SanityCheck(self, operators):
        """A StopGradient whose output nothing reads stops nothing (Caffe2's
        check)."""
        for op in operators:
            if op.type == "StopGradient" and op.output[0] not in self.input_usages:
                raise errors.InvalidArgumentError(
                    f"StopGradient's output '{op.output[0]}' is orphan: nothing reads it. You "
                    f"typically want the same input and output for StopGradient. Op:\n\n{op}",
                    op=op.type, blob=op.output[0],
                )

    def Play(self, op):
        in_versions = {}
        for name in op.input:
            in_versions[name] = self.frontier[name]
            self.input_usages[name][self.frontier[name]].append(len(self.ssa))
            self.in_version_history[name].append((op, self.frontier[name]))
        out_versions = {}
        for name in op.output:
            if name in self.frontier:
                self.frontier[name] += 1
            out_versions[name] = self.frontier[name]
            self.out_version_history[name].append((op, self.frontier[name]))
        self.ssa.append((op, in_versions, out_versions))

    # -- values --

    def _fixed(self, name):
        v = self._fixed_values.get(name)
        if v is None:
            v = self._fixed_values[name] = _Value(name, fixed=True)
        return v

    def _emit(self, op, ins, outs, raw=None):
        self._steps.append(_Step(op, ins, outs, raw))

    # -- the seeds --

    def _init_gradients(self, ys):
        all_to_grad = {}
        for y, g in ys.items():
            y = str(y)
            self.gradient_frontier[y] = self.frontier[y]
            self.input_usages[y][self.frontier[y]].append(len(self.ssa))
            if g is None:
                # Ones shaped like y (and of its dtype: ConstantFill with an
                # input and no dtype takes the input's float dtype).
                op = _op("ConstantFill", [y], [y + AUTOGEN_GRAD_SUFFIX], value=1.0)
                value = _Value(op.output[0])
                self._emit(op, [self._fixed(y)], [value])
                made, device = True, op.device_option
            elif isinstance(g, GradientSlice):
                value = GradientSlice(self._fixed(str(g.indices)), self._fixed(str(g.values)))
                made, device = False, caffe2_pb2.DeviceOption()
            else:
                value = self._fixed(str(g))
                made, device = False, caffe2_pb2.DeviceOption()
            all_to_grad[y] = value
            # A given gradient joins the other readers' (Caffe2 dropped it
            # when y was also read by an op).
            self.gradient_generators[y][self.frontier[y]].append(_Gen(value, made, device))
        return all_to_grad

    # -- one forward op --

    def _present(self, op, g_values):
        """The names the maker sees for the output gradients, and the value
        behind each name."""
        by_name, shown = {}, []

        def show(v):
            if v.fixed:
                by_name[v.name] = v
                return v.name
            held = by_name.get(v.want)
            if held is not None and held is not v:
                v.cell[0] = self._fresh(v.want)
            by_name[v.want] = v
            return v.want

        for g in g_values:
            if g is None:
                shown.append(None)
            elif isinstance(g, GradientSlice):
                shown.append(GradientSlice(show(g.indices), show(g.values)))
            else:
                shown.append(show(g))
        return shown, by_name

    def _check_read(self, fwd_idx, raw, go_of):
        """Caffe2's version checks for a gradient op's read of ``raw`` (a
        placeholder name is an input of the op)."""
        op, in_versions, out_versions = self.ssa[fwd_idx]
        name = _strip(raw)
        if raw != name:
            out_versions = {}
        if name in go_of:
            out = go_of[name]
            have = self.gradient_frontier.get(out)
            if out_versions[out] != have:
                raise errors.InvalidArgumentError(
                    f'Gradient name "{name}" is expected to correspond to version '
                    f'{out_versions[out]} of "{out}", but currently we have version {have}.\n\n'
                    + self._history(out, self.out_version_history, "out"),
                    op=op.type, blob=out,
                )
        elif name in out_versions:
            if self.frontier[name] != out_versions[name]:
                raise errors.InvalidArgumentError(
                    f'Gradient operator needs output "{name}" at version {out_versions[name]}, '
                    f"but currently we have version {self.frontier[name]}.\n\n"
                    + self._history(name, self.out_version_history, "out"),
                    op=op.type, blob=name,
                )
        elif name in in_versions:
            if self.frontier[name] != in_versions[name]:
                raise errors.InvalidArgumentError(
                    f'Gradient operator needs input "{name}" at version {in_versions[name]}, '
                    f"but currently we have version {self.frontier[name]}.\n\n"
                    + self._history(name, self.in_version_history, "in"),
                    op=op.type, blob=name,
                )

    @staticmethod
    def _history(name, history, kind):
        lines = [f"Was the blob '{name}' written by another op? Its versions ({kind}):"]
        lines += [f"  version {v} <- {o.type} {list(o.input)} -> {list(o.output)}" for o, v in history[name]]
        return "\n".join(lines)

    def _gradients_of(self, fwd_idx, all_to_grad):
        op, in_versions, out_versions = self.ssa[fwd_idx]
        g_values = [all_to_grad.get(name) for name in op.output]
        if all(g is None for g in g_values) and op.type != "ZeroGradient":
            return {}
        shown, go_values = self._present(op, g_values)
        # which output each shown gradient name belongs to (version checks)
        go_of = {}
        for name, g in zip(op.output, shown):
            for n in (g if isinstance(g, GradientSlice) else (g,)):
                if n is not None:
                    go_of.setdefault(n, name)
        # The maker sees placeholder names for the later occurrences of a
        # repeated input (so that each gets gradient names of its own) and
        # for an input the op overwrites in place (so that a read of it is
        # told from a read of the output, and checked against its version).
        call, seen, outs = op, defaultdict(int), set(op.output)
        if len(set(op.input)) < len(op.input) or outs.intersection(op.input):
            call = caffe2_pb2.OperatorDef()
            call.CopyFrom(op)
            for i, name in enumerate(op.input):
                if seen[name] or name in outs:
                    call.input[i] = f"{name}\x00{seen[name]}\x00"
                seen[name] += 1
        grad_ops, g_input = GradientRegistry.GetGradientForOp(call, shown)

        local, cells, made = {}, {}, {}
        for gop in grad_ops:
            ins = []
            for raw in gop.input:
                v = local.get(raw)
                if v is None:
                    self._check_read(fwd_idx, raw, go_of)
                    v = go_values.get(raw) or self._fixed(_strip(raw))
                ins.append(v)
            outs = []
            for raw in gop.output:
                cell = cells.setdefault(raw, [_strip(raw)])
                v = local[raw] = _Value(cell=cell)
                made[id(v)] = gop.device_option
                outs.append(v)
            # The nets an op carries name blobs as its maker did.
            raw_names = list(gop.input) + list(gop.output) if _carries_nets(gop) else None
            for i, raw in enumerate(gop.input):
                gop.input[i] = _strip(raw)
            for i, raw in enumerate(gop.output):
                gop.output[i] = _strip(raw)
            self._emit(gop, ins, outs, raw_names)

        def resolve(raw):
            raw = str(raw)
            if raw in local:
                return local[raw]
            if raw in go_of:
                # passed through: it must belong to this version too (Caffe2
                # passed a later version's gradient on, silently)
                self._check_read(fwd_idx, raw, go_of)
            return go_values.get(raw) or self._fixed(_strip(raw))

        g_in = []
        for g in g_input:
            if g is None:
                g_in.append(None)
            elif isinstance(g, GradientSlice):
                g_in.append(GradientSlice(resolve(g.indices), resolve(g.values)))
            else:
                g_in.append(resolve(g))

        # One contribution per read (Caffe2's generators).
        for name, g in zip(op.input, g_in):
            if g is None:
                continue
            parts = g if isinstance(g, GradientSlice) else (g,)
            flags = tuple(id(p) in made for p in parts)
            devs = [made[id(p)] for p in parts if id(p) in made]
            gen = _Gen(g, flags if len(flags) == 2 else flags[0], devs[0] if devs else op.device_option)
            self.gradient_generators[name][in_versions[name]].append(gen)
            self.gradient_frontier[name] = in_versions[name]

        new = {}
        for name, g in zip(op.input, g_in):
            # Keep a gradient already known unless this op rewrote the blob.
            if g is not None or name not in all_to_grad or name in op.output:
                new[name] = g
        return new

    # -- sums --

    def _accumulate(self, fwd_idx):
        op, in_versions, _ = self.ssa[fwd_idx]
        grad_map = {}
        for name in dict.fromkeys(op.input):
            version = in_versions[name]
            usage = self.input_usages[name][version]
            if len(usage) <= 1 or usage[0] != fwd_idx:
                continue
            gens = self.gradient_generators[name][version]
            kinds = {isinstance(g.value, GradientSlice) for g in gens}
            if len(kinds) > 1:
                raise errors.InvalidArgumentError(
                    f"Gradients for param '{name}' failed to verify: Automatic aggregation of a "
                    "mix of sparse and dense gradients is not supported yet", blob=name,
                )
            if len(gens) < 2:
                continue
            devs = [g.device_option for g in gens if g.device_option.ByteSize()]
            if any(not _device_equal(d, devs[0]) for d in devs[1:]):
                raise errors.InvalidArgumentError(
                    f"Gradients for param '{name}' failed to verify: Unexpected behavior: not all "
                    "grad ops have the same device option.", blob=name,
                )
            if kinds == {True}:
                grad_map[name] = self._sparse_sum(name, gens)
            else:
                grad_map[name] = self._dense_sum(name, gens)
        return grad_map

    def _sum_device(self, op, gens):
        tag = f"{self.ONLY_KEEP_IS_AUTO_GEN_SUM_OPS_TAG}:1"
        if not any(tag in g.device_option.extra_info for g in gens):
            op.device_option.CopyFrom(gens[0].device_option)
        op.device_option.extra_info.append(f"{self.IS_AUTO_GEN_SUM_OPS_TAG}:1")

    def _dense_sum(self, name, gens):
        made = [g.value for g in gens if g.made]
        base = made[0].want if made else grad_name(name)
        ins, cnt = [], 0
        for g in gens:
            if g.made and g.value is not made[0]:
                g.value.cell[0] = f"_{g.value.want}_autosplit_{cnt}"
                cnt += 1
            ins.append(g.value)
        # Sum works in place on its first input only.
        for k, v in enumerate(ins):
            if (v.name if v.fixed else v.want) == base:
                ins[0], ins[k] = ins[k], ins[0]
                break
        out = _Value(base)
        s = _op("Sum", [], [])
        self._sum_device(s, gens)
        self._emit(s, ins, [out])
        return out

    def _sparse_sum(self, name, gens):
        """Caffe2's sum of sparse gradients: their indices and their values
        concatenated (duplicates are left for the optimizer)."""
        base = grad_name(name)
        for g in gens:
            k = next((k for k in (0, 1) if g.made[k]), None)
            if k is not None:
                w, suffix = g.value[k].want, ("_indices", "_values")[k]
                base = w[: -len(suffix)] if w.endswith(suffix) else w
                break
        outs = []
        for k, suffix in enumerate(("_indices", "_values")):
            ins, cnt = [], 0
            for g in gens:
                part = g.value[k]
                if g.made[k]:
                    part.cell[0] = f"_{part.want}_autosplit_{cnt}"
                    cnt += 1
                ins.append(part)
            cat = _Value(base + suffix + "_concat")
            c = _op("Concat", [], [], axis=0)
            self._sum_device(c, gens)
            self._emit(c, ins, [cat, _Value(base + suffix + "_concat_split")])
            outs.append(cat)
        return GradientSlice(*outs)

    # -- the whole pass --

    def GetBackwardPass(self, ys):
        if isinstance(ys, (list, tuple)):
            ys = {y: None for y in ys}
        elif not isinstance(ys, dict):
            raise TypeError("ys should either be a list or a dict.")
        self._steps, self._fixed_values, self._wanted = [], {}, set()
        all_to_grad = self._init_gradients(ys)
        for idx in reversed(range(len(self.ssa))):
            all_to_grad.update(self._gradients_of(idx, all_to_grad))
            all_to_grad.update(self._accumulate(idx))
        grads = {name: g for name, g in all_to_grad.items() if g is not None}
        returned = [p for g in grads.values() for p in (g if isinstance(g, GradientSlice) else (g,))]
        forward = {n for op, _, _ in self.ssa for n in list(op.input) + list(op.output)}
        _Naming(self._steps, returned, forward).run()

        def name_of(g):
            if isinstance(g, GradientSlice):
                return GradientSlice(g.indices.name, g.values.name)
            return g.name

        return [s.op for s in self._steps], {name: name_of(g) for name, g in grads.items()}

    def _fresh(self, want):
        k = 1
        while f"_{want}_{k}" in self._wanted:
            k += 1
        self._wanted.add(f"_{want}_{k}")
        return f"_{want}_{k}"


class _Naming:
    """Gives every value of the backward pass a blob name: the name it
    wants, unless a value still needed holds that name (a forward blob,
    always; a gradient until its last reader, or to the end when the map
    returns it); an op may take over the name of an input it is the last
    reader of when its schema allows that pair in place. Otherwise the
    value gets a fresh name."""

    FORWARD = object()

    def __init__(self, steps, returned, forward):
        self.steps = steps
        self.last = {}
        for t, st in enumerate(steps):
            for v in st.ins:
                self.last[id(v)] = t
        for v in returned:
            self.last[id(v)] = len(steps)
        self.holder = {name: self.FORWARD for name in forward}
        self.used = set(forward)
        for st in steps:
            for v in st.ins:
                if v.fixed:
                    self.holder.setdefault(v.name, v)
                    self.used.add(v.name)
            for v in st.outs:
                self.used.add(v.want)
        for v in returned:
            if v.fixed:
                self.holder.setdefault(v.name, v)

    def _free(self, name, t, st, j, taken):
        if name in taken:
            return False
        cur = self.holder.get(name)
        if cur is None:
            return True
        if cur is self.FORWARD:
            return False
        last = self.last.get(id(cur), -1)
        if last < t:
            return True
        if last > t:
            return False
        # The op reads the holder's value for the last time: in place, if
        # its schema allows each such pair. An op carrying nets may write
        # an output before its nets' last read of an input, so it writes in
        # place only where its maker said so (``_in_place_pairs``).
        if st.raw is not None:
            return False
        for i, v in enumerate(st.ins):
            if v is cur and _inplace_ok(st.op.type, i, j) is False:
                return False
        return True

    def _in_place_pairs(self, t, st):
        """For an op carrying nets: output index -> the input value it
        must overwrite, where the maker wrote one name as both (a loop
        carries it: its nets read and write it under that name)."""
        n_in = len(st.ins)
        raw_in, raw_out = st.raw[:n_in], st.raw[n_in:]
        pairs = {}
        for j, raw in enumerate(raw_out):
            if raw in raw_in:
                v = st.ins[raw_in.index(raw)]
                held = self.holder.get(v.name)
                if held is not v or self.last.get(id(v), -1) != t:
                    raise errors.InvalidArgumentError(
                        f"the gradient op {st.op.type} reads and writes '{_strip(raw)}' in its nets, "
                        f"but the value it reads (blob '{v.name}') is "
                        + ("a forward blob" if held is self.FORWARD else "still needed after it")
                        + "; its gradient maker must write such a blob through a copy of its own",
                        op=st.op.type, blob=v.name,
                    )
                pairs[j] = v
        return pairs

    def run(self):
        for t, st in enumerate(self.steps):
            taken = set()
            pairs = self._in_place_pairs(t, st) if st.raw is not None else {}
            for j, v in enumerate(st.outs):
                name = v.want
                if j in pairs:
                    name = pairs[j].name
                elif not self._free(name, t, st, j, taken):
                    k = 1
                    while f"_{name}_{k}" in self.used:
                        k += 1
                    name = f"_{name}_{k}"
                    self.used.add(name)
                v.name = name
                self.holder[name] = v
                taken.add(name)
            if st.raw is not None:
                # Every name the maker gave, renamed or not (its nets may
                # use placeholder names, which are stripped).
                renamed = {old: v.name for old, v in zip(st.raw, st.ins + st.outs)}
            else:
                renamed = {old: v.name for old, v in zip(list(st.op.input) + list(st.op.output),
                                                         st.ins + st.outs) if old != v.name}
            del st.op.input[:]
            st.op.input.extend(v.name for v in st.ins)
            del st.op.output[:]
            st.op.output.extend(v.name for v in st.outs)
            if renamed:
                _rename_in_nets(st.op, renamed)


def _carries_nets(op):
    """Whether an op holds nets among its arguments (If, While, Do, ...)."""
    return any(a.HasField("n") or len(a.nets) for a in op.arg)


def _rename_in_nets(op, renamed, other=_strip):
    """Applies ``renamed`` (old name -> new) inside the nets an op carries
    as arguments (If's then_net/else_net, While's loop_net, ...), which read
    and write the op's blobs by name; another name becomes ``other(name)``
    (a placeholder name left in them is stripped). A ``Do``'s net has names
    of its own (its inner blobs), bound to the op's inputs and outputs: only
    those are renamed."""
    if op.type == "Do":
        return

    def new(name):
        return renamed[name] if name in renamed else other(name)

    for a in op.arg:
        nets = ([a.n] if a.HasField("n") else []) + list(a.nets)
        for net in nets:
            for inner in net.op:
                for field in (inner.input, inner.output):
                    for i, name in enumerate(field):
                        field[i] = new(name)
                _rename_in_nets(inner, renamed, other)
            for field in (net.external_input, net.external_output):
                for i, name in enumerate(field):
                    field[i] = new(name)


def _inplace_ok(op_type, i, o):
    """Whether ``op_type`` allows input ``i`` and output ``o`` in place
    (None: not a registered op; its maker's word is taken)."""
    return _core.operator_allows_inplace(op_type, i, o)


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
    "DiagonalFill", "GivenTensorBoolFill", "GivenTensorIntFill", "GivenTensorInt64Fill",
    "GivenTensorDoubleFill",
    # A db's records: brew.db_input's data need no StopGradient, as in Caffe2.
    "TensorProtosDBInput",
    # Indices map keys to ids: nothing to differentiate.
    "IntIndexCreate", "LongIndexCreate", "StringIndexCreate", "IndexGet",
    "FloatToFused8BitRowwiseQuantized",
    # Indices, one-hot codes and bit patterns: nothing to differentiate.
    "ArgMax", "ArgMin", "OneHot", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
    # A shape made of lengths.
    "LengthsToShape",
    # Quantised (integer) inference ops and their fills.
    "Int8Quantize", "Int8Dequantize", "Int8GivenTensorFill", "Int8GivenIntTensorFill",
    "Int8Conv", "Int8ConvRelu", "Int8FC", "Int8Sum", "Int8SumRelu", "Int8AveragePool",
    "Int8AveragePoolRelu", "Int8MaxPool", "Int8MaxPoolRelu", "Int8Softmax",
    "Int8ResizeNearest", "Int8Add", "Int8AddRelu", "Int8Relu", "Int8LeakyRelu", "Int8Sigmoid",
    "Int8Reshape", "Int8Flatten", "Int8Concat", "Int8Slice", "Int8Transpose",
    "Int8ChannelShuffle", "Int8ConvTranspose", "Int8RoIAlign",
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
    """As Caffe2: each gradient is a MatMul with the forward input it
    replaces as third input, so that it takes that input's (N-d) shape."""
    w = GradientWrapper(op, g_output)
    a, b, dy = w.I(0), w.I(1), w.GO(0)
    ta, tb = _arg_i(op, "trans_a"), _arg_i(op, "trans_b")
    ax_a, ax_b = _arg_i(op, "axis_a", 1), _arg_i(op, "axis_b", 1)
    if ta and tb:  # A'B': dA = B'G', dB = G'A'
        da = _op("MatMul", [b, dy, a], [w.GI(0)], trans_a=1, trans_b=1, axis_a=ax_b)
        db = _op("MatMul", [dy, a, b], [w.GI(1)], trans_a=1, trans_b=1, axis_b=ax_a)
    elif ta:  # A'B: dA = BG', dB = AG
        da = _op("MatMul", [b, dy, a], [w.GI(0)], trans_b=1, axis_a=ax_b)
        db = _op("MatMul", [a, dy, b], [w.GI(1)], axis_a=ax_a)
    elif tb:  # AB': dA = GB, dB = G'A
        da = _op("MatMul", [dy, b, a], [w.GI(0)], axis_b=ax_b)
        db = _op("MatMul", [dy, a, b], [w.GI(1)], trans_a=1, axis_b=ax_a)
    else:  # AB: dA = GB', dB = A'G
        da = _op("MatMul", [dy, b, a], [w.GI(0)], trans_b=1, axis_b=ax_b)
        db = _op("MatMul", [a, dy, b], [w.GI(1)], trans_a=1, axis_a=ax_a)
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


def _args_of(op, names):
    """The forward op's arguments among ``names`` (for a gradient op that
    takes only those)."""
    return [a for a in op.arg if a.name in names]


def _summed(ops, parts, out):
    """``ops`` then the Sum of ``parts`` (gradient blobs) into ``out``; one
    part is written to ``out`` directly by the op that makes it."""
    if len(parts) == 1:
        for g in ops:
            g.output[:] = [out if o == parts[0] else o for o in g.output]
        return ops
    return ops + [_op("Sum", parts, [out])]


@_register("SoftmaxWithLoss", copy_arguments=False)
def _softmax_with_loss_grad(op, g_output):
    """Caffe2's SoftmaxWithLossGradient for the loss; the gradient of the
    softmax output P (Caffe2 dropped it) adds SoftmaxGradient(P, dP)."""
    w = GradientWrapper(op, g_output)
    tmp = "_" + w.GI(0)
    ops, parts = [], []
    if w.GO(1) is not None:
        g = _op("SoftmaxWithLossGradient", list(op.input) + [w.O(0), w.GO(1)], [tmp + "_loss"])
        g.arg.extend(_args_of(op, ("scale", "label_prob", "axis", "only_loss")))
        ops.append(g)
        parts.append(tmp + "_loss")
    if w.GO(0) is not None:
        g = _op("SoftmaxGradient", [w.O(0), w.GO(0)], [tmp + "_P"])
        g.arg.extend(_args_of(op, ("axis",)))
        ops.append(g)
        parts.append(tmp + "_P")
    if not parts:
        return [], [None] * len(op.input)
    return _summed(ops, parts, w.GI(0)), [w.GI(0)] + [None] * (len(op.input) - 1)


@_register("SpatialSoftmaxWithLoss", copy_arguments=False)
def _spatial_softmax_with_loss_grad(op, g_output):
    """(X, labels[, weights], P, dLoss) -> dX, as Caffe2's maker; the
    gradient of P (Caffe2 dropped it) adds P * (dP - sum over D of P dP)."""
    w = GradientWrapper(op, g_output)
    tmp = "_" + w.GI(0)
    ops, parts = [], []
    if w.GO(1) is not None:
        g = _op("SpatialSoftmaxWithLossGradient", list(op.input) + [w.O(0), w.GO(1)], [tmp + "_loss"])
        g.arg.extend(_args_of(op, ("scale",)))
        ops.append(g)
        parts.append(tmp + "_loss")
    if w.GO(0) is not None:
        p, dp = w.O(0), w.GO(0)
        ops += [
            _op("Mul", [p, dp], [tmp + "_P_dP"]),
            _op("ReduceSum", [tmp + "_P_dP"], [tmp + "_P_dP_sum"], axes=[1], keepdims=1),
            _op("Sub", [dp, tmp + "_P_dP_sum"], [tmp + "_dP_centred"]),
            _op("Mul", [p, tmp + "_dP_centred"], [tmp + "_P"]),
        ]
        parts.append(tmp + "_P")
    if not parts:
        return [], [None] * len(op.input)
    return _summed(ops, parts, w.GI(0)), [w.GI(0)] + [None] * (len(op.input) - 1)


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
    # x op x needs nothing here: the backward pass gives each read of x
    # its own gradient and sums them.
    def maker(op, g_output):
        w = GradientWrapper(op, g_output)
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


# ------------------------------- activations and math (ops/activation.rs) --


def _reads_maker(grad_type, reads):
    """One gradient op reading ``reads`` (of "X", the forward input, "Y", its
    output, and "dY"), in Caffe2's order for that op, and writing dX."""

    def maker(op, g_output):
        w = GradientWrapper(op, g_output)
        pick = {"X": w.I(0), "Y": w.O(0), "dY": w.GO(0)}
        return [_op(grad_type, [pick[r] for r in reads], [w.GI(0)])], [w.GI(0)]

    return maker


for _t, _reads in (
    ("Elu", ("Y", "dY")),
    ("ReluN", ("Y", "dY")),
    ("HardSigmoid", ("Y", "dY")),
    ("Reciprocal", ("Y", "dY")),
    ("Selu", ("Y", "dY")),
    ("ThresholdedRelu", ("Y", "dY")),
    ("Softplus", ("Y", "dY")),
    ("Logit", ("X", "dY")),
    ("Swish", ("X", "Y", "dY")),
    ("Mish", ("X", "Y", "dY")),
    ("Gelu", ("dY", "X")),
    ("Cube", ("dY", "X")),
    ("Sinh", ("dY", "X")),
    ("Cosh", ("dY", "X")),
    ("Cbrt", ("dY", "Y")),
    ("Rsqrt", ("dY", "Y")),
    ("Softsign", ("X", "dY")),
    ("Log1p", ("X", "dY")),
    ("Sin", ("X", "dY")),
    ("Cos", ("X", "dY")),
    ("Tan", ("X", "dY")),
    ("Asin", ("X", "dY")),
    ("Acos", ("X", "dY")),
    ("Atan", ("X", "dY")),
    ("Erf", ("X", "dY")),
):
    _register(_t)(_reads_maker(_t + "Gradient", _reads))

_register("Sign")(_no_gradient)


@_register("PRelu")
def _prelu_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    ops = [_op("PReluGradient", [w.O(0), w.GO(0), w.I(0), w.I(1)], [w.GI(0), w.GI(1)])]
    return ops, [w.GI(0), w.GI(1)]


@_register("Sqr", copy_arguments=False)
def _sqr_grad(op, g_output):
    # d x^2 = 2 x dx. Caffe2 scaled dY in place, changing a blob other
    # readers of dY may use; here the scaled copy is dX's.
    w = GradientWrapper(op, g_output)
    ops = [
        _op("Scale", [w.GO(0)], [w.GI(0)], scale=2.0),
        _op("Mul", [w.GI(0), w.I(0)], [w.GI(0)]),
    ]
    return ops, [w.GI(0)]


# --------------------------------------- makers of the second slice (#14) --


def _arg(op, name):
    for a in op.arg:
        if a.name == name:
            return a
    return None


def _arg_f(op, name, default=0.0):
    a = _arg(op, name)
    if a is None:
        return default
    return a.f if a.HasField("f") else float(a.i)


@_register("BatchMatMul", copy_arguments=False)
def _batch_matmul_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    a, b, dy = w.I(0), w.I(1), w.GO(0)
    ta, tb = _arg_i(op, "trans_a"), _arg_i(op, "trans_b")
    if _arg_i(op, "broadcast"):
        # Caffe2 refused broadcast=1. The products of each batch summed over
        # the batch dims an operand was broadcast along, a 1-D operand taken
        # as BatchMatMul takes it: one op, as the ranks are not known here.
        g = _op("BatchMatMulGradient", [a, b, dy], [w.GI(0), w.GI(1)], trans_a=ta, trans_b=tb,
                broadcast=1)
        return [g], [w.GI(0), w.GI(1)]
    if ta and tb:  # A'B': dA = B'G', dB = G'A'
        da = _op("BatchMatMul", [b, dy], [w.GI(0)], trans_a=1, trans_b=1)
        db = _op("BatchMatMul", [dy, a], [w.GI(1)], trans_a=1, trans_b=1)
    elif ta:  # A'B: dA = BG', dB = AG
        da = _op("BatchMatMul", [b, dy], [w.GI(0)], trans_b=1)
        db = _op("BatchMatMul", [a, dy], [w.GI(1)])
    elif tb:  # AB': dA = GB, dB = G'A
        da = _op("BatchMatMul", [dy, b], [w.GI(0)])
        db = _op("BatchMatMul", [dy, a], [w.GI(1)], trans_a=1)
    else:  # AB: dA = GB', dB = A'G
        da = _op("BatchMatMul", [dy, b], [w.GI(0)], trans_b=1)
        db = _op("BatchMatMul", [a, dy], [w.GI(1)], trans_a=1)
    return [da, db], [w.GI(0), w.GI(1)]


@_register("CrossEntropy")
def _cross_entropy_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("CrossEntropyGradient", [w.I(0), w.I(1), w.GO(0)], [w.GI(0)])], [w.GI(0), None]


@_register("MakeTwoClass")
def _make_two_class_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("MakeTwoClassGradient", [w.GO(0)], [w.GI(0)])], [w.GI(0)]


@_register("SigmoidCrossEntropyWithLogits")
def _sigmoid_xent_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    ops = [_op("SigmoidCrossEntropyWithLogitsGradient", [w.GO(0), w.I(0), w.I(1)], [w.GI(0)])]
    return ops, [w.GI(0), None]


@_register("WeightedSigmoidCrossEntropyWithLogits")
def _weighted_sigmoid_xent_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    ins = [w.GO(0), w.I(0), w.I(1), w.I(2)]
    return [_op("WeightedSigmoidCrossEntropyWithLogitsGradient", ins, [w.GI(0)])], [w.GI(0), None, None]


@_register("L1Distance")
def _l1_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    ops = [_op("L1DistanceGradient", [w.I(0), w.I(1), w.GO(0)], [w.GI(0), w.GI(1)])]
    return ops, [w.GI(0), w.GI(1)]


@_register("Dropout")
def _dropout_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    if _arg_i(op, "is_test"):
        return [_op("DropoutGrad", [w.GO(0)], [w.GI(0)])], [w.GI(0)]
    if len(op.output) < 2:
        raise errors.InvalidArgumentError(
            "Dropout: the gradient of a training Dropout needs its mask output", op=op.type
        )
    return [_op("DropoutGrad", [w.GO(0), w.O(1)], [w.GI(0)])], [w.GI(0)]


def _dense_go(w, i):
    """The dense gradient of output ``i``, which the maker cannot do without
    (Caffe2's C++ ``GO`` refused a missing or sparse one): stop the other
    outputs' gradients with ``ZeroGradient`` when no loss reaches them."""
    g = w.GO(i)
    if g is None or isinstance(g, GradientSlice):
        what = "is sparse (expected dense)" if g is not None else "is not provided"
        raise errors.InvalidArgumentError(
            f"{w.op.type}: the gradient of output {i} ('{w.O(i)}') {what}; its gradient "
            f"needs the gradients of all its outputs (give the others a zero gradient with "
            f"ZeroGradient)", op=w.op.type, blob=w.O(i),
        )
    return g


@_register("LSTMUnit")
def _lstm_unit_grad(op, g_output):
    # Inputs (h_prev, c_prev, gates, [seq_lengths,] timestep): the gradient
    # op reads them all, then the outputs and their gradients.
    w = GradientWrapper(op, g_output)
    ins = list(op.input) + [w.O(0), w.O(1), _dense_go(w, 0), _dense_go(w, 1)]
    ops = [_op("LSTMUnitGradient", ins, [w.GI(0), w.GI(1), w.GI(2)])]
    return ops, [w.GI(0), w.GI(1), w.GI(2)] + [None] * (len(op.input) - 3)


@_register("GRUUnit")
def _gru_unit_grad(op, g_output):
    # Inputs (h_prev, gates, [seq_lengths,] timestep).
    w = GradientWrapper(op, g_output)
    ins = list(op.input) + [w.O(0), _dense_go(w, 0)]
    ops = [_op("GRUUnitGradient", ins, [w.GI(0), w.GI(1)])]
    return ops, [w.GI(0), w.GI(1)] + [None] * (len(op.input) - 2)


@_register("RecurrentNetwork")
def _recurrent_network_grad(op, g_output):
    # The gradient op reads the gradients of the outputs named by
    # outputs_with_grads, then every input and output of the forward op (the
    # last output holds the step workspace and each step's blobs); it gives
    # the gradients of the sequence (input 0), of the params and of the
    # initial states.
    w = GradientWrapper(op, g_output)
    a = _arg(op, "outputs_with_grads")
    with_grads = list(a.ints) if a is not None and len(a.ints) else [0]
    a = _arg(op, "param")
    params = list(a.ints) if a is not None else []
    a = _arg(op, "initial_recurrent_state_ids")
    states = list(a.ints) if a is not None else []
    ins = [_dense_go(w, k) for k in with_grads] + list(op.input) + list(op.output)
    wrt = [0] + params + states
    g_input = [None] * len(op.input)
    for i in wrt:
        g_input[i] = w.GI(i)
    return [_op("RecurrentNetworkGradient", ins, [w.GI(i) for i in wrt])], g_input


@_register("ElementwiseLinear")
def _elementwise_linear_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    outs = [w.GI(0), w.GI(1), w.GI(2)]
    return [_op("ElementwiseLinearGradient", [w.GO(0), w.I(0), w.I(1)], outs)], outs


@_register("ZeroGradient", copy_arguments=False)
def _zero_gradient_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("ConstantFill", [w.I(0)], [w.GI(0)], value=0.0)], [w.GI(0)]


@_register("Reshape", copy_arguments=False)
def _reshape_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    if len(op.output) > 1:
        ops = [_op("Reshape", [w.GO(0), w.O(1)], [w.GI(0), "_" + w.GI(0) + "_dims"])]
    else:
        ops = [_op("ResizeLike", [w.GO(0), w.I(0)], [w.GI(0)])]
    return ops, [w.GI(0)] + [None] * (len(op.input) - 1)


def _resize_like_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("ResizeLike", [w.GO(0), w.I(0)], [w.GI(0)])], [w.GI(0)]


_register("Flatten", copy_arguments=False)(_resize_like_grad)
_register("FlattenToVec", copy_arguments=False)(_resize_like_grad)


@_register("ExpandDims")
def _expand_dims_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("Squeeze", [w.GO(0)], [w.GI(0)])], [w.GI(0)]


@_register("Slice")
def _slice_grad(op, g_output):
    """Caffe2's SliceGradient: (data[, starts, ends], dY) -> d data, with
    Slice's arguments."""
    w = GradientWrapper(op, g_output)
    ins = [w.I(i) for i in range(len(op.input))] + [w.GO(0)]
    return [_op("SliceGradient", ins, [w.GI(0)])], [w.GI(0)] + [None] * (len(op.input) - 1)


@_register("SumReduceLike", copy_arguments=False)
def _sum_reduce_like_grad(op, g_output):
    """Caffe2 had no maker. C = A summed down to B's shape, so A's gradient
    is C's broadcast back onto A's shape (zeros shaped like A plus dC, with
    the legacy broadcast of SumReduceLike's axis); B gives only a shape."""
    w = GradientWrapper(op, g_output)
    zeros = "_" + w.GI(0) + "_zeros"
    add = _op("Add", [zeros, w.GO(0)], [w.GI(0)], broadcast=1)
    add.arg.extend(a for a in op.arg if a.name in ("axis", "axis_str", "order"))
    return [_op("ConstantFill", [w.I(0)], [zeros], value=0.0), add], [w.GI(0), None]


@_register("Squeeze")
def _squeeze_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("ExpandDims", [w.GO(0)], [w.GI(0)])], [w.GI(0)]


def _reduce_maker(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op(op.type + "Gradient", [w.GO(0), w.I(0), w.O(0)], [w.GI(0)])], [w.GI(0)]


def _front_back_maker(op, g_output):
    # With the optional lengths input, the gradient op gets it too.
    w = GradientWrapper(op, g_output)
    ins = [w.GO(0), w.I(0)] + list(op.input[1:])
    return [_op(op.type + "Gradient", ins, [w.GI(0)])], [w.GI(0)] + [None] * (len(op.input) - 1)


def _front_back_max_maker(op, g_output):
    w = GradientWrapper(op, g_output)
    ins = [w.GO(0), w.I(0), w.O(0)] + list(op.input[1:])
    return [_op(op.type + "Gradient", ins, [w.GI(0)])], [w.GI(0)] + [None] * (len(op.input) - 1)


_register("ReduceFrontMax")(_front_back_max_maker)
_register("ReduceBackMax")(_front_back_max_maker)

for _t in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2"):
    _register(_t)(_reduce_maker)


def _pair_maker(grad_type):
    """Row-wise ops of (X, Y): the gradient op takes (X, Y, dZ) and gives
    (dX, dY)."""

    def maker(op, g_output):
        w = GradientWrapper(op, g_output)
        ins = [w.I(0), w.I(1), w.GO(0)]
        return [_op(grad_type, ins, [w.GI(0), w.GI(1)])], [w.GI(0), w.GI(1)]

    return maker


for _t in ("DotProduct", "CosineSimilarity", "DotProductWithPadding"):
    _register(_t)(_pair_maker(_t + "Gradient"))
for _t in ("ReduceFrontSum", "ReduceBackSum", "ReduceFrontMean", "ReduceBackMean"):
    _register(_t)(_front_back_maker)


def _match_outer(op):
    """The gather's ``match_outer``, for its gradient op (only when set)."""
    return {"match_outer": 1} if _arg_i(op, "match_outer", 0) else {}


@_register("Gather", copy_arguments=False)
def _gather_grad(op, g_output):
    """Caffe2's: for axis 0 a GradientSlice (the indices, the output's
    gradient), or with dense_gradient a SparseToDense shaped like DATA; for
    another axis a dense BatchGatherGradient."""
    w = GradientWrapper(op, g_output)
    axis = _arg_i(op, "axis", 0)
    if axis != 0:
        if _arg(op, "dense_gradient") is not None and not _arg_i(op, "dense_gradient"):
            raise errors.InvalidArgumentError(
                "Gather with axis > 0 must use dense_gradient", op=op.type
            )
    if axis != 0 or _arg_i(op, "wrap_indices"):
        # With wrap_indices (which Caffe2's maker left out) the gradient is
        # dense whatever the axis: a GradientSlice's indices name rows.
        wrap = {"wrap_indices": 1} if _arg_i(op, "wrap_indices") else {}
        g = _op("BatchGatherGradient", [w.I(0), w.I(1), w.GO(0)], [w.GI(0)], axis=axis,
                **_match_outer(op), **wrap)
        return [g], [w.GI(0), None]
    if _arg_i(op, "dense_gradient"):
        return [_op("SparseToDense", [w.I(1), w.GO(0), w.I(0)], [w.GI(0)])], [w.GI(0), None]
    return [], [GradientSlice(w.I(1), w.GO(0)), None]


@_register("BatchGather", copy_arguments=False)
def _batch_gather_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    g = _op("BatchGatherGradient", [w.I(0), w.I(1), w.GO(0)], [w.GI(0)], axis=_arg_i(op, "axis", 1),
            **_match_outer(op))
    return [g], [w.GI(0), None]


def _sls_grad(op, g_output):
    """Sparse: the values of a GradientSlice over the indices (Caffe2's
    ``GI_V``, ``<data>_grad_values``); dense Lengths*: the data's gradient."""
    w = GradientWrapper(op, g_output)
    if op.type.startswith("Sparse"):
        values = w.I(0) + GRAD_SUFFIX + "_values"
        ops = [_op(op.type + "Gradient", [w.GO(0), w.I(2)], [values])]
        return ops, [GradientSlice(w.I(1), values), None, None]
    return [_op(op.type + "Gradient", [w.GO(0), w.I(1)], [w.GI(0)])], [w.GI(0), None]


for _t in ("SparseLengthsSum", "SparseLengthsMean", "LengthsSum", "LengthsMean"):
    _register(_t, copy_arguments=False)(_sls_grad)


def _segment_grad(op, g_output):
    """{Sorted,Unsorted}Segment{Sum,Mean}: the data's gradient from (dY,
    SEGMENT_IDS); the Sparse* forms give it as the values of a GradientSlice
    over INDICES (Caffe2's makers)."""
    w = GradientWrapper(op, g_output)
    sparse = op.type.startswith("Sparse")
    name = (op.type[len("Sparse"):] if sparse else op.type) + "Gradient"
    ids = w.I(2 if sparse else 1)
    if sparse:
        values = w.I(0) + GRAD_SUFFIX + "_values"
        return [_op(name, [w.GO(0), ids], [values])], [GradientSlice(w.I(1), values), None, None]
    return [_op(name, [w.GO(0), ids], [w.GI(0)])], [w.GI(0), None]


for _t in ("SortedSegmentSum", "SortedSegmentMean", "UnsortedSegmentSum", "UnsortedSegmentMean"):
    _register(_t)(_segment_grad)
    _register("Sparse" + _t)(_segment_grad)


def _segment_range_grad(op, g_output):
    # (DATA, Y, dY, SEGMENT_IDS) -> dDATA.
    w = GradientWrapper(op, g_output)
    return [_op(op.type + "Gradient", [w.I(0), w.O(0), w.GO(0), w.I(1)], [w.GI(0)])], [w.GI(0), None]


for _t in ("Sum", "Mean", "Max", "LogSumExp", "LogMeanExp"):
    _register("SortedSegmentRange" + _t)(_segment_range_grad)


@_register("LengthsMax")
def _lengths_max_grad(op, g_output):
    # (Y, dY, LENGTHS, DATA) -> dDATA.
    w = GradientWrapper(op, g_output)
    return ([_op("LengthsMaxWithMainInputAndForwardOutputGradient", [w.O(0), w.GO(0), w.I(1), w.I(0)],
                 [w.GI(0)])], [w.GI(0), None])


def _weighted_sls_grad(op, g_output):
    """(Sparse)LengthsWeightedSum: the DATA gradient from (SCALARS, dY,
    LENGTHS), sparse over the indices for the Sparse op; with
    ``grad_on_weights`` the ``...WithMainInputGradient`` op also reads
    DATA (and INDICES) and gives SCALARS' gradient."""
    w = GradientWrapper(op, g_output)
    sparse = op.type.startswith("Sparse")
    lengths = w.I(3 if sparse else 2)
    d_data = w.I(0) + GRAD_SUFFIX + "_values" if sparse else w.GI(0)
    g_input = [None] * len(op.input)
    g_input[0] = GradientSlice(w.I(2), d_data) if sparse else d_data
    if _arg_i(op, "grad_on_weights", 0):
        ins = [w.I(1), w.GO(0), lengths, w.I(0)] + ([w.I(2)] if sparse else [])
        g_input[1] = w.GI(1)
        return [_op(op.type + "WithMainInputGradient", ins, [d_data, w.GI(1)])], g_input
    return [_op(op.type + "Gradient", [w.I(1), w.GO(0), lengths], [d_data])], g_input


for _t in ("SparseLengthsWeightedSum", "LengthsWeightedSum"):
    _register(_t)(_weighted_sls_grad)


@_register("SparseToDense", copy_arguments=False)
def _sparse_to_dense_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    g = [None] * len(op.input)
    g[1] = w.GI(1)
    return [_op("Gather", [w.GO(0), w.I(0)], [w.GI(1)])], g


@_register("Pow")
def _pow_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    if _arg(op, "exponent") is not None:
        # In place, X is gone: the gradient op reads Y only.
        in_place = _strip(w.I(0)) == w.O(0)
        ins = [w.GO(0), w.O(0)] if in_place else [w.GO(0), w.I(0), w.O(0)]
        return [_op("PowGradient", ins, [w.GI(0)])], [w.GI(0)]
    ops = [_op("PowGradient", [w.GO(0), w.I(0), w.I(1), w.O(0)], [w.GI(0), w.GI(1)])]
    return ops, [w.GI(0), w.GI(1)]


@_register("Clip")
def _clip_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("ClipGradient", [w.O(0), w.GO(0)], [w.GI(0)])], [w.GI(0)]


def _concat_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    if w.GO(0) is None:
        return [], [None] * len(op.input)
    grads = [w.GI(i) for i in range(len(op.input))]
    return [_op("Split", [w.GO(0), w.O(1)], grads)], grads


_register("Concat")(_concat_grad)
_register("DepthConcat")(_concat_grad)


def _split_grad(op, g_output):
    """Concat of the outputs' gradients; an output without one contributes
    zeros shaped like it (Caffe2 left it out, which misplaces the rest;
    the zeros are the output scaled by 0, so an inf or NaN in it stays)."""
    w = GradientWrapper(op, g_output)
    if all(g is None for g in g_output):
        return [], [None] * len(op.input)
    ops, parts = [], []
    for i, g in enumerate(g_output):
        if g is None:
            z = "_" + w.O(i) + "_grad_zeros"
            # Zeros of the output's shape and dtype (ConstantFill would be float32).
            ops.append(_op("Scale", [w.O(i)], [z], scale=0.0))
            parts.append(z)
        else:
            parts.append(g)
    keep = {a.name: a for a in op.arg if a.name in ("axis", "order", "add_axis")}
    cat = _op("Concat", parts, [w.GI(0), "_" + w.GI(0) + "_dims"])
    for a in keep.values():
        cat.arg.add().CopyFrom(a)
    ops.append(cat)
    return ops, [w.GI(0)] + [None] * (len(op.input) - 1)


_register("Split", copy_arguments=False)(_split_grad)
_register("DepthSplit", copy_arguments=False)(_split_grad)


def _order_switch_grad(inverse):
    def maker(op, g_output):
        w = GradientWrapper(op, g_output)
        return [_op(inverse, [w.GO(0)], [w.GI(0)])], [w.GI(0)]
    return maker


_register("NHWC2NCHW", copy_arguments=False)(_order_switch_grad("NCHW2NHWC"))
_register("NCHW2NHWC", copy_arguments=False)(_order_switch_grad("NHWC2NCHW"))


@_register("Transpose", copy_arguments=False)
def _transpose_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    axes = _arg(op, "axes")
    if axes is not None and len(axes.ints):
        inverse = [0] * len(axes.ints)
        for i, a in enumerate(axes.ints):
            inverse[a] = i
        return [_op("Transpose", [w.GO(0)], [w.GI(0)], axes=inverse)], [w.GI(0)]
    return [_op("Transpose", [w.GO(0)], [w.GI(0)])], [w.GI(0)]


@_register("Div")
def _div_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    ins = [w.GO(0), w.I(0), w.I(1), w.O(0)]
    return [_op("DivGradient", ins, [w.GI(0), w.GI(1)])], [w.GI(0), w.GI(1)]


@_register("Cast", copy_arguments=False)
def _cast_grad(op, g_output):
    """A Cast back (Caffe2: the forward op must say its ``from_type``)."""
    w = GradientWrapper(op, g_output)
    to, from_type = _arg(op, "to"), _arg(op, "from_type")
    if from_type is None:
        raise errors.InvalidArgumentError(
            "Argument 'from_type' of type int or string is required to get the gradient of CastOp",
            op=op.type,
        )
    def number(a):  # a DataType number, also when the op gave its name
        if a.HasField("s"):
            return caffe2_pb2.TensorProto.DataType.Value(a.s.decode().upper())
        return a.i

    # As Caffe2's maker: both arguments as DataType numbers.
    g = _op("Cast", [w.GO(0)], [w.GI(0)], to=number(from_type))
    if to is not None:
        g.arg.add(name="from_type", i=number(to))
    return [g], [w.GI(0)]


@_register("Alias", copy_arguments=False)
def _alias_grad(op, g_output):
    return [], [g_output[0]]


@_register("WeightedSum")
def _weighted_sum_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    on_w = bool(_arg_i(op, "grad_on_w"))
    n = len(op.input)
    outs = [w.GI(i) for i in range(0, n, 2)]
    if on_w:
        outs += [w.GI(i) for i in range(1, n, 2)]
    grads = [w.GI(i) if (i % 2 == 0 or on_w) else None for i in range(n)]
    return [_op("WeightedSumGradient", [w.GO(0)] + list(op.input), outs)], grads

# ------------------------------------------------ convolutional nets (issue 15) --
# Caffe2's makers for Conv, ConvTranspose, pooling, SpatialBN, LRN and
# ChannelShuffle; the gradient ops take the forward op's arguments.


def _conv_maker(grad_type):
    def maker(op, g_output):
        w = GradientWrapper(op, g_output)
        dx = not _arg_i(op, "no_gradient_to_input", 0)
        ins = [w.I(0), w.I(1), w.GO(0)]
        if len(op.input) == 3:
            outs = [w.GI(1), w.GI(2)] + ([w.GI(0)] if dx else [])
            g = _op(grad_type or op.type + "Gradient", ins, outs)
            return [g], [w.GI(0) if dx else None, w.GI(1), w.GI(2)]
        outs = [w.GI(1)] + ([w.GI(0)] if dx else [])
        g = _op(grad_type or op.type + "Gradient", ins, outs, no_bias=1)
        return [g], [w.GI(0) if dx else None, w.GI(1)]

    return maker


for _t in ("Conv", "Conv1D", "Conv2D", "Conv3D", "ConvTranspose"):
    _register(_t)(_conv_maker(None))


def _pool_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op(op.type + "Gradient", [w.I(0), w.O(0), w.GO(0)], [w.GI(0)])], [w.GI(0)]


for _t in ("MaxPool", "AveragePool"):
    for _d in ("", "1D", "2D", "3D"):
        _register(_t + _d)(_pool_grad)
_register("LpPool")(_pool_grad)


# ------------------------------------------------- detection (issue 29) --
# RoIAlign differentiates X only (Caffe2's maker: inputs X, RoIs, dY);
# the RoIs get no gradient. BBoxTransform, BoxWithNMSLimit and
# GenerateProposals have none (Caffe2's SHOULD_NOT_DO_GRADIENT): asking for
# one is the registry's "no gradient is registered" error.


@_register("RoIAlign")
def _roi_align_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("RoIAlignGradient", [w.I(0), w.I(1), w.GO(0)], [w.GI(0)])], [w.GI(0), None]


@_register("ResizeNearest")
def _resize_nearest_grad(op, g_output):
    # Inputs dY, X (and the scales input if the op has one); the scales get
    # no gradient.
    w = GradientWrapper(op, g_output)
    ins = [w.GO(0), w.I(0)] + [w.I(i) for i in range(1, len(op.input))]
    return [_op("ResizeNearestGradient", ins, [w.GI(0)])], [w.GI(0)] + [None] * (len(op.input) - 1)



def _only_first_output(op, g_output, what):
    """A maker that differentiates output 0 only: a gradient given for
    another output is an error (Caffe2 dropped it silently)."""
    for name, g in zip(op.output[1:], g_output[1:]):
        if g is not None:
            raise errors.InvalidArgumentError(
                f"{op.type}: output '{name}' ({what}) has a gradient, but {op.type}'s gradient "
                f"takes only that of output '{op.output[0]}'; stop it with StopGradient",
                op=op.type, blob=name,
            )


@_register("SpatialBN")
def _spatial_bn_grad(op, g_output):
    _only_first_output(op, g_output, "a statistic")
    w = GradientWrapper(op, g_output)
    if w.GO(0) is None:
        return [], [None] * len(op.input)
    if _arg_i(op, "is_test", 0):
        # Inference statistics: the estimated mean and variance.
        ins = [w.I(0), w.I(1), w.GO(0), w.I(3), w.I(4)]
    elif _arg_i(op, "num_batches", 1) > 1:
        # Statistics of several batches: as in Caffe2, the scale and bias
        # gradients of all of them (ChannelBackpropStats, summed) must be
        # in the blobs named for this op's scale and bias gradients; the
        # gradient op replaces them by this batch's share.
        if len(op.input) != 7:
            raise errors.InvalidArgumentError(
                f"SpatialBN with num_batches > 1 takes 7 inputs (the sums and sums of squares), got {len(op.input)}",
                op=op.type,
            )
        ins = [w.I(0), w.I(1), w.GO(0), w.O(3), w.O(4), w.GI(1), w.GI(2)]
    else:
        ins = [w.I(0), w.I(1), w.GO(0), w.O(3), w.O(4)]
    g = _op("SpatialBNGradient", ins, [w.GI(0), w.GI(1), w.GI(2)])
    return [g], [w.GI(0), w.GI(1), w.GI(2)] + [None] * (len(op.input) - 3)


@_register("Tile")
def _tile_grad(op, g_output):
    # TileGradient gets Tile's tiles and axis inputs too, when it had them.
    w = GradientWrapper(op, g_output)
    ins = [w.GO(0)] + [w.I(i) for i in range(1, len(op.input))]
    return [_op("TileGradient", ins, [w.GI(0)])], [w.GI(0)] + [None] * (len(op.input) - 1)


@_register("Expand")
def _expand_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("ExpandGradient", [w.GO(0), w.I(0)], [w.GI(0)])], [w.GI(0), None]


@_register("TopK")
def _top_k_grad(op, g_output):
    # (dValues, indices, X) -> dX; the indices carry no gradient.
    w = GradientWrapper(op, g_output)
    return [_op("TopKGradient", [w.GO(0), w.O(1), w.I(0)], [w.GI(0)])], [w.GI(0)]


@_register("BooleanMask")
def _boolean_mask_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("BooleanMaskGradient", [w.I(1), w.GO(0)], [w.GI(0)])], [w.GI(0), None]


@_register("SequenceMask")
def _sequence_mask_grad(op, g_output):
    # The op is its own gradient: the same mask, 0 where masked (grad=1);
    # the forward op's other arguments are copied.
    w = GradientWrapper(op, g_output)
    ins = [w.GO(0)] + ([w.I(1)] if len(op.input) > 1 else [])
    return ([_op("SequenceMask", ins, [w.GI(0)], grad=1)],
            [w.GI(0)] + [None] * (len(op.input) - 1))


@_register("Normalize")
def _normalize_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("NormalizeGradient", [w.I(0), w.GO(0)], [w.GI(0)])], [w.GI(0)]


@_register("SumElements")
def _sum_elements_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("SumElementsGradient", [w.I(0), w.GO(0)], [w.GI(0)])], [w.GI(0)]


@_register("Mean")
def _mean_grad(op, g_output):
    # One gradient op gives every input its share, dY / n.
    w = GradientWrapper(op, g_output)
    outs = [w.GI(i) for i in range(len(op.input))]
    return [_op("MeanGradient", [w.GO(0)], outs)], outs


@_register("Moments", copy_arguments=False)
def _moments_grad(op, g_output):
    """(dmean, dvariance, X, mean) -> dX, as Caffe2; an output without a
    gradient (only the mean, or only the variance, used) gets zeros shaped
    like it (Caffe2 passed None on and the backward net failed)."""
    w = GradientWrapper(op, g_output)
    if w.GO(0) is None and w.GO(1) is None:
        return [], [None]
    ops, gos = [], []
    for i in range(2):
        if w.GO(i) is None:
            z = "_" + w.O(i) + "_grad_zeros"
            ops.append(_op("ConstantFill", [w.O(i)], [z], value=0.0))
            gos.append(z)
        else:
            gos.append(w.GO(i))
    g = _op("MomentsGradient", gos + [w.I(0), w.O(0)], [w.GI(0)])
    g.arg.extend(a for a in op.arg if a.name in ("axes", "keepdims"))
    return ops + [g], [w.GI(0)]


@_register("LayerNorm", copy_arguments=False)
def _layer_norm_grad(op, g_output):
    """Inputs (dY, Y, mean, std, X[, gamma]) -> (dX[, dgamma, dbeta]), as
    Caffe2's maker. The gradients of the mean and std outputs (Caffe2
    dropped them) add, on X and the statistics flattened to 2-D at
    ``axis``, MomentsGradient's dX for dmean and dvariance = dstd / (2 std)."""
    w = GradientWrapper(op, g_output)
    affine = _arg_i(op, "elementwise_affine", 0)
    tmp = "_" + w.GI(0)
    ops, parts = [], []
    outs = [w.GI(0)] + ([w.GI(1), w.GI(2)] if affine else [])
    if w.GO(0) is not None:
        ins = [w.GO(0), w.O(0), w.O(1), w.O(2), w.I(0)] + ([w.I(1)] if affine else [])
        g = _op("LayerNormGradient", ins, [tmp + "_Y"] + outs[1:])
        g.arg.extend(_args_of(op, ("axis", "epsilon", "elementwise_affine")))
        ops.append(g)
        parts.append(tmp + "_Y")
    if w.GO(1) is not None or w.GO(2) is not None:
        flat = {}
        for name in (w.I(0), w.O(1), w.O(2), w.GO(1), w.GO(2)):
            if name is not None:
                f = _op("Flatten", [name], [tmp + "_flat_" + _strip(name)])
                f.arg.extend(_args_of(op, ("axis",)))
                ops.append(f)
                flat[name] = f.output[0]
        mean2, std2 = flat[w.O(1)], flat[w.O(2)]
        if w.GO(1) is None:
            dmean = tmp + "_dmean_zeros"
            ops.append(_op("ConstantFill", [mean2], [dmean], value=0.0))
        else:
            dmean = flat[w.GO(1)]
        if w.GO(2) is None:
            dvar = tmp + "_dvar_zeros"
            ops.append(_op("ConstantFill", [std2], [dvar], value=0.0))
        else:
            dvar = tmp + "_dvar"
            ops += [_op("Div", [flat[w.GO(2)], std2], [dvar]), _op("Scale", [dvar], [dvar], scale=0.5)]
        ops += [
            _op("MomentsGradient", [dmean, dvar, flat[w.I(0)], mean2], [tmp + "_stats_flat"],
                axes=[1], keepdims=1),
            _op("ResizeLike", [tmp + "_stats_flat", w.I(0)], [tmp + "_stats"]),
        ]
        parts.append(tmp + "_stats")
    if not parts:
        return [], [None] * len(op.input)
    # gamma and beta move Y only
    grads = [w.GI(0)] + (outs[1:] if w.GO(0) is not None else [])
    return _summed(ops, parts, w.GI(0)), grads + [None] * (len(op.input) - len(grads))


@_register("LRN")
def _lrn_grad(op, g_output):
    _only_first_output(op, g_output, "the scale")
    w = GradientWrapper(op, g_output)
    if w.GO(0) is None:
        return [], [None]
    return [_op("LRNGradient", [w.I(0), w.O(0), w.GO(0)], [w.GI(0)])], [w.GI(0)]


@_register("ChannelShuffle")
def _channel_shuffle_grad(op, g_output):
    w = GradientWrapper(op, g_output)
    return [_op("ChannelShuffleGradient", [w.GO(0)], [w.GI(0)])], [w.GI(0)]


@_register("PackSegments")
def _pack_segments_grad(op, g_output):
    """UnpackSegments of the packed gradient (the presence mask has none),
    with PackSegments' arguments, as Caffe2."""
    w = GradientWrapper(op, g_output)
    if w.GO(0) is None:
        return [], [None, None]
    return [_op("UnpackSegments", [w.I(0), w.GO(0)], [w.GI(1)])], [None, w.GI(1)]


@_register("UnpackSegments")
def _unpack_segments_grad(op, g_output):
    """PackSegments of the gradient, with UnpackSegments' arguments, as Caffe2."""
    w = GradientWrapper(op, g_output)
    return [_op("PackSegments", [w.I(0), w.GO(0)], [w.GI(1)])], [None, w.GI(1)]


def _min_max_grad(op, g_output):
    """``<Op>Gradient(Y, dY, X0, X1, ...)``: each input equal to the result
    gets the whole gradient, as Caffe2."""
    w = GradientWrapper(op, g_output)
    if w.GO(0) is None:
        return [], [None] * len(op.input)
    grads = [w.GI(i) for i in range(len(op.input))]
    ins = [w.O(0), w.GO(0)] + [w.I(i) for i in range(len(op.input))]
    return [_op(op.type + "Gradient", ins, grads)], grads


_register("Max")(_min_max_grad)
_register("Min")(_min_max_grad)


@_register("NanCheck", copy_arguments=False)
def _nan_check_grad(op, g_output):
    """The gradient is checked the same way on its way back, as Caffe2."""
    w = GradientWrapper(op, g_output)
    if w.GO(0) is None:
        return [], [None] * len(op.input)
    return [_op("NanCheck", [w.GO(0)], [w.GI(0)])], [w.GI(0)] + [None] * (len(op.input) - 1)


@_register("SplitByLengths", copy_arguments=False)
def _split_by_lengths_grad(op, g_output):
    """Split's gradient: the outputs' gradients joined along the axis
    (SplitByLengths' default axis is 0, Concat's 1)."""
    ops, grads = _split_grad(op, g_output)
    if ops and _arg(op, "axis") is None:
        ops[-1].arg.add(name="axis", i=0)
    return ops, grads
