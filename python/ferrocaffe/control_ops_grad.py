"""Gradients of the control-flow operators ``If``, ``While`` and ``Do``
(Caffe2's ``caffe2.python.control_ops_grad``), registered in the gradient
registry when ``core`` imports this module, as Caffe2's core did.

How each is differentiated:

- ``Do`` runs its net in an inner workspace. Its gradient is a ``Do``
  marked ``is_gradient_op`` that runs the backward pass of that net in the
  workspace the forward ``Do`` ran in, which the scope blob kept (Caffe2's
  workspace stack; the runtime keeps it only when the net also holds the
  gradient ``Do``), so the net's own blobs are there. The output gradients
  come in and the input gradients go out through blob bindings, the latter
  written by copies at the end of its net (``<inner>/_DO_OPERATOR_INNER_GRAD_``
  and ``<inner>/_DO_OPERATOR_INNER_GRAD_COPY_``, Caffe2's names). A kept
  workspace also holds the forwarded blobs' values as the run found them
  (``<inner>/_DO_OPERATOR_FORWARD_INPUT_``) and as it left them, so the net
  may read a blob and then overwrite it.
- ``If``: an ``If`` on the same condition whose branches run the backward
  passes of the forward branches; an input one branch gives no gradient
  gets zeros there. A branch not run by a ``Do`` runs in the If's
  workspace, so its gradient may not need a value it overwrote (an error
  says so).
- ``While`` whose loop body is one ``Do`` (as ``add_while_op``,
  ``NetBuilder``'s ``WhileNet`` and ``brew.loop`` build it): each iteration's
  workspace is kept, and the gradient ``While`` runs the body's gradient
  ``Do`` once per kept workspace, last iteration first (``HasScope`` is its
  condition). A blob the body reads and writes carries its gradient from
  one iteration to the one before; a blob the body only reads (a weight)
  adds up its gradients over the iterations; a blob the body writes without
  reading it passes nothing back. The ``cond_net`` is not differentiated: a
  gradient that would flow through it is an error.

Names written here carry a placeholder (``_fresh``) that the backward pass
strips, so that they differ from every name read: the blobs are still
called ``x_grad`` wherever that name is free.
"""

import itertools

from ferrocaffe import errors
from ferrocaffe.gradients import (
    GradientRegistry, GradientSlice, IR, _carries_nets, _op, _rename_in_nets, _strip, grad_name,
)
from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "gen_do_gradient", "gen_if_gradient", "gen_while_gradient", "dedupe_g_output",
    "disambiguate_grad_if_op_output", "getNetArgument",
]

_INNER_GRAD = "/_DO_OPERATOR_INNER_GRAD_"
_INNER_GRAD_COPY = "/_DO_OPERATOR_INNER_GRAD_COPY_"
_FORWARD_INPUT = "/_DO_OPERATOR_FORWARD_INPUT_"

_count = itertools.count(1000)


def _fresh(name):
    return f"{name}\x00{next(_count)}\x00"


def _error(op, message):
    return errors.InvalidArgumentError(f"{op.type}'s gradient: {message}", op=op.type)


def _net_arg(op, name):
    for a in op.arg:
        if a.name == name:
            if not a.HasField("n"):
                raise _error(op, f"argument '{name}' is not a net")
            return a.n
    return None


def getNetArgument(op, net_name):
    """The net in ``op``'s argument ``net_name``, or None (Caffe2's)."""
    return _net_arg(op, net_name)


def _arg_int(op, name):
    for a in op.arg:
        if a.name == name:
            return a.i
    return 0


def _net(template, suffix, ops):
    """A net named after ``template`` holding ``ops`` (and no declared
    external blobs: the ops read and write the op's blobs)."""
    net = caffe2_pb2.NetDef()
    net.name = (template.name + suffix) if template is not None and template.name else ""
    if template is not None:
        if template.HasField("device_option"):
            net.device_option.CopyFrom(template.device_option)
        if template.type:
            net.type = template.type
    net.op.extend(ops)
    return net


def _gradient_op(fwd, op_type, inputs, outputs, nets):
    g = caffe2_pb2.OperatorDef()
    g.type = op_type
    g.input.extend(inputs)
    g.output.extend(outputs)
    if fwd.name:
        g.name = fwd.name + "_grad"
    if fwd.HasField("device_option"):
        g.device_option.CopyFrom(fwd.device_option)
    if fwd.engine:
        g.engine = fwd.engine
    for name, net in nets:
        g.arg.add(name=name).n.CopyFrom(net)
    g.is_gradient_op = True
    return g


def _reads_writes(ops):
    """The names ``ops`` read before writing them, and the names they
    write, each in order of first use."""
    reads, writes = {}, {}
    for op in ops:
        for n in op.input:
            if n not in writes:
                reads.setdefault(n, None)
        for n in op.output:
            writes.setdefault(n, None)
    return list(reads), list(writes)


def _rename(ops, renamed):
    """Renames blobs in ``ops`` and in the nets they share the workspace
    with (not in a Do's own net)."""
    for op in ops:
        for field in (op.input, op.output):
            for i, n in enumerate(field):
                if n in renamed:
                    field[i] = renamed[n]
        _rename_in_nets(op, renamed, other=lambda n: n)


def _dense(op, grad_map, what):
    for name, g in grad_map.items():
        if isinstance(g, GradientSlice):
            raise _error(op, f"the gradient of '{name}' in {what} is sparse (a GradientSlice); "
                             "control ops pass dense gradients only (Gather: dense_gradient=1)")


def _output_gradients(op, g_output, skip_last=False):
    """output name -> its gradient's name (given ones only)."""
    outs = list(op.output)
    given = {}
    for k, (o, g) in enumerate(zip(outs, g_output)):
        if g is None or (skip_last and k == len(outs) - 1):
            continue
        if isinstance(g, GradientSlice):
            raise _error(op, f"the gradient of output '{o}' is sparse (a GradientSlice); "
                             "control ops take dense gradients only (Gather: dense_gradient=1)")
        given[str(o)] = str(g)
    return given


def dedupe_g_output(op, g_output):
    """Caffe2's helper: where one gradient blob is given for several outputs,
    the later ones get a copy ``<output>_<grad>_DEDUP``. Returns
    ``(copy ops, g_output)``. (The makers here bind one inner name per
    gradient blob instead and do not need it.)"""
    ops, out, first = [], [], {}
    for o, g in zip(op.output, g_output):
        if not g:
            out.append(g)
            continue
        if g not in first.values():
            first[o] = g
            out.append(g)
        else:
            dedup = f"{o}_{g}_DEDUP"
            ops.append(_op("Copy", [g], [dedup]))
            first[o] = dedup
            out.append(dedup)
    return ops, out


def disambiguate_grad_if_op_output(grad_op, idx, new_grad_output):
    """Renames output ``idx`` of a gradient ``If`` to ``new_grad_output``,
    in its nets too (Caffe2's helper for its autosplit; the backward pass
    here renames through ``_rename_in_nets``). Each net's writes of the old
    name, and its reads after such a write, take the new name."""
    old = grad_op.output[idx]
    for name in ("then_net", "else_net"):
        net = _net_arg(grad_op, name)
        if net is None:
            continue
        written = False
        for op in net.op:
            if written:
                for i, n in enumerate(op.input):
                    if n == old:
                        op.input[i] = new_grad_output
            for i, n in enumerate(op.output):
                if n == old:
                    op.output[i] = new_grad_output
                    written = True
    grad_op.output[idx] = new_grad_output


def _start_ops(net_ops, inputs):
    """A net's ops as the backward pass sees them, and for each of
    ``inputs`` that the net writes, the name under which its ops read it
    before that: ``<name>/_DO_OPERATOR_FORWARD_INPUT_``, its value as the
    net started. So the gradient of that value is the gradient under that
    name (a blob's later values have gradients of their own), and a Do's
    kept workspace holds the value under that name, so that a loop body may
    read a blob it then overwrites (``h = tanh(h w)``). An op holding nets
    that reads and writes the blob keeps its name (its maker reads inside
    its nets): a first op makes the blob from the start value, so that all
    of that value's gradient gathers there."""
    ops = [caffe2_pb2.OperatorDef() for _ in net_ops]
    for new, old in zip(ops, net_ops):
        new.CopyFrom(old)
    written = {n for op in ops for n in op.output}
    start = {n: n + _FORWARD_INPUT for n in sorted(set(inputs) & written)}
    seen, merge = set(), []
    for op in ops:
        if not _carries_nets(op):
            for i, n in enumerate(op.input):
                if n in start and n not in seen:
                    op.input[i] = start[n]
        else:
            reads = {n: start[n] for n in op.input if n in start and n not in seen}
            merge += [n for n in reads if n in op.output]
            _rename([op], {n: s for n, s in reads.items() if n not in op.output})
        seen.update(op.output)
    return [_op("Sum", [start[n]], [n]) for n in dict.fromkeys(merge)] + ops, start


# ------------------------------------------------------------------ Do --


class _Do:
    """A Do op's net and blob bindings (Caffe2's sanity checks)."""

    def __init__(self, op):
        if op.type != "Do":
            raise _error(op, "expected a Do op")
        self.net = _net_arg(op, "net")
        if self.net is None:
            raise _error(op, "Do has no 'net' argument")
        inner, idx = [], []
        for a in op.arg:
            if a.name == "inner_blobs":
                inner = [s.decode() if isinstance(s, bytes) else s for s in a.strings]
            elif a.name == "outer_blobs_idx":
                idx = list(a.ints)
        if len(inner) != len(idx):
            raise _error(op, "inner_blobs and outer_blobs_idx differ in length")
        if not op.input or not op.output or _strip(op.input[-1]) != op.output[-1]:
            raise _error(op, "the last input and output of Do must be its scope blob")
        self.scope = op.output[-1]
        outer = [_strip(n) for n in op.input[:-1]] + list(op.output[:-1])
        self.inner_of, self.outer_of = {}, {}
        for name, k in zip(inner, idx):
            if not 0 <= k < len(outer):
                raise _error(op, f"outer_blobs_idx {k} is out of range")
            self.inner_of.setdefault(outer[k], name)
            self.outer_of[name] = outer[k]
        self.inputs = {self.inner_of[a] for a in outer[:len(op.input) - 1] if a in self.inner_of}
        self.reuse = bool(_arg_int(op, "reuse_workspace"))


def _do_backward(op, g_output, out_name=None):
    d = _Do(op)
    if d.reuse:
        raise _error(op, "a Do with reuse_workspace has no gradient: its workspace is kept for "
                         "the next run, not for the gradient")
    given = _output_gradients(op, g_output, skip_last=True)
    # one inner name per outer gradient blob, bound to it
    init, inner_given, outer_given = {}, {}, {}
    for o, g in given.items():
        ig = inner_given.get(g)
        if ig is None:
            ig = inner_given[g] = d.inner_of[o] + _INNER_GRAD
            outer_given[ig] = g
        init[d.inner_of[o]] = ig
    if not init:
        return None
    fwd_ops, start = _start_ops(d.net.op, d.inputs)
    grad_ops, grad_map = IR(fwd_ops).GetBackwardPass(init)
    _dense(op, grad_map, "the net of Do")

    g_input = [None] * len(op.input)
    copies, published, seen = [], [], set()
    for k, raw in enumerate(op.input[:-1]):
        a = _strip(raw)
        ia = d.inner_of.get(a)
        g = None if ia is None else grad_map.get(start.get(ia, ia))
        if a in seen or g is None:
            continue
        seen.add(a)
        out = out_name(a) if out_name else grad_name(raw)
        pub = ia + _INNER_GRAD_COPY
        # Written last, so that no bound gradient is overwritten while the
        # net still reads it.
        copies.append(_op("Copy", [g], [pub]))
        published.append((pub, out))
        g_input[k] = out
    if not published:
        return None
    inner_ops = list(grad_ops) + copies

    # The net reads the output gradients through bindings, and every other
    # blob in the kept workspace: the net's own blobs, and the forwarded
    # blobs' values as the run left them (not the outer blobs, which later
    # ops may have changed).
    reads, _ = _reads_writes(inner_ops)
    bound = [(n, outer_given[n]) for n in reads if n in outer_given]
    saved = [n for n in reads if n not in outer_given]
    in_names = list(dict.fromkeys(o for _, o in bound))
    out_names = [o for _, o in published]
    inner_blobs = [n for n, _ in bound] + [p for p, _ in published]
    idx = [in_names.index(o) for _, o in bound] + [len(in_names) + j for j in range(len(published))]

    gd = _gradient_op(op, "Do", in_names + [d.scope], out_names,
                      [("net", _net(d.net, "_grad", inner_ops))])
    gd.arg.add(name="inner_blobs").strings.extend(n.encode() for n in inner_blobs)
    gd.arg.add(name="outer_blobs_idx").ints.extend(idx)
    gd.arg.add(name="saved_fwd_blobs").strings.extend(n.encode() for n in saved)
    return [gd], g_input


def gen_do_gradient(op, g_output):
    """Do's gradient: a gradient Do that runs the backward pass of the net
    in the forward Do's kept workspace (see the module docstring)."""
    made = _do_backward(op, g_output)
    if made is None:
        return [], [None] * len(op.input)
    return made


# ------------------------------------------------------------------ If --


def gen_if_gradient(op, g_output):
    """If's gradient: an If on the same condition whose branches run the
    backward passes of the forward branches."""
    then_net, else_net = _net_arg(op, "then_net"), _net_arg(op, "else_net")
    if then_net is None:
        raise _error(op, "If has no then_net")
    given = _output_gradients(op, g_output)
    if not given:
        return [], [None] * len(op.input)
    cond = op.input[0]
    # The branches' backward passes see the output gradients under private
    # names, so that they never write over one; the names are put back below.
    private = {g: _fresh(g) for g in dict.fromkeys(given.values())}
    init = {o: private[g] for o, g in given.items()}
    inputs = [_strip(n) for n in op.input[1:]]
    branches = []
    for net, what in ((then_net, "then_net"), (else_net, "else_net")):
        if net is None:
            branches.append(([], dict(init)))  # no else: the outputs pass through
            continue
        fwd_ops, start = _start_ops(net.op, inputs)
        ops, grad_map = IR(fwd_ops).GetBackwardPass(dict(init))
        _dense(op, grad_map, f"the If's {what}")
        # The branches run in the If's workspace, which keeps no value a
        # branch overwrote.
        gone = {s: n for n, s in start.items()}
        for g in ops:
            for n in g.input:
                if n in gone:
                    raise _error(op, f"the gradient of its {what} needs '{gone[n]}' as it was "
                                     "before the branch overwrote it, and the If's workspace keeps "
                                     "no copy (a branch run by a Do, as IfNet and add_if_op make, "
                                     "keeps one)")
        grad_map = {a: grad_map.get(start.get(a, a)) for a in inputs + list(given)}
        branches.append((list(ops), {a: g for a, g in grad_map.items() if g is not None}))

    # A blob a branch writes must not be one the gradient If reads.
    shown = set(given.values())
    read = set(shown)
    for ops, _ in branches:
        read.update(_reads_writes(ops)[0])
    for ops, grad_map in branches:
        clash = {n: _fresh(n) for n in _reads_writes(ops)[1] if n in read}
        _rename(ops, clash)
        for a, g in grad_map.items():
            grad_map[a] = clash.get(g, g)
    back = {p: g for g, p in private.items()}
    for ops, grad_map in branches:
        _rename(ops, back)
        for a, g in grad_map.items():
            grad_map[a] = back.get(g, g)

    # The input gradients: each branch writes all of them (zeros for an
    # input it gives none).
    g_input = [None] * len(op.input)
    result = {}
    for k, raw in enumerate(op.input):
        a = _strip(raw)
        if k == 0 or a in result or a == _strip(cond):
            continue
        if any(grad_map.get(a) is not None for _, grad_map in branches):
            result[a] = _fresh(grad_name(a))
            g_input[k] = result[a]
    if not result:
        return [], g_input
    for ops, grad_map in branches:
        written = set(_reads_writes(ops)[1])
        uses = {}
        for a in result:
            if grad_map.get(a) is not None:
                uses[grad_map[a]] = uses.get(grad_map[a], 0) + 1
        for a, out in result.items():
            g = grad_map.get(a)
            if g is None:
                ops.append(_op("ConstantFill", [a], [out], value=0.0))
            elif g in written and uses[g] == 1:
                _rename(ops, {g: out})
            else:
                ops.append(_op("Copy", [g], [out]))

    (then_ops, _), (else_ops, _) = branches
    reads, writes = _reads_writes(then_ops + else_ops)
    inputs = [cond] + [n for n in reads if n != cond]
    nets = [("then_net", _net(then_net, "_grad", then_ops))]
    if else_ops or else_net is not None:
        nets.append(("else_net", _net(else_net if else_net is not None else then_net,
                                      "_grad" if else_net is not None else "_auto_else_zero_blobs_",
                                      else_ops)))
    return [_gradient_op(op, "If", inputs, writes, nets)], g_input


# --------------------------------------------------------------- While --


def _written_by(net):
    names = set()
    if net is not None:
        for op in net.op:
            names.update(op.output)
    return names


def gen_while_gradient(op, g_output):
    """While's gradient, for a loop body that is one Do (see the module
    docstring): a While that runs the body's gradient Do once per kept
    iteration, last first."""
    loop_net = _net_arg(op, "loop_net")
    if loop_net is None:
        raise _error(op, "While has no loop_net")
    if len(loop_net.op) != 1 or loop_net.op[0].type != "Do":
        raise _error(op, "the loop body must be one Do op (as add_while_op, NetBuilder's WhileNet "
                         "and brew.loop build it), which keeps each iteration's workspace for the "
                         f"gradient; this loop_net has ops {[o.type for o in loop_net.op]}")
    body = loop_net.op[0]
    d = _Do(body)
    if d.reuse:
        raise _error(op, "the loop body Do must not set reuse_workspace (each iteration's "
                         "workspace is kept for the gradient)")
    cond = _strip(op.input[0])
    cond_writes = _written_by(_net_arg(op, "cond_net")) | {cond}
    body_out = list(body.output[:-1])
    given = _output_gradients(op, g_output)
    for o in given:
        if o not in body_out:
            raise _error(op, f"output '{o}' has a gradient, but only the cond_net writes it; "
                             "gradients do not flow through the cond_net")

    def body_gradient(carried):
        temps, names = {}, {}

        def out_name(a):
            if a not in carried:
                names[a] = _fresh(grad_name(a))
                temps[a] = _fresh(grad_name(a) + "_iteration")
                return temps[a]
            return carried[a]

        made = _do_backward(body, [carried.get(o) for o in body_out] + [None], out_name)
        return made, temps, names

    # Which blobs carry a gradient from iteration to iteration: those with
    # an output gradient, and those the body reads (differentiably) and writes.
    every = {o: _fresh(grad_name(o)) for o in body_out}
    made, _, _ = body_gradient(every)
    got = set() if made is None else {_strip(body.input[k]) for k, g in enumerate(made[1]) if g}
    carried = {o: every[o] for o in body_out if o in given or o in got}
    if not carried:
        return [], [None] * len(op.input)
    made, temps, read_only = body_gradient(carried)
    if made is None:
        return [], [None] * len(op.input)
    body_grad_ops, body_g_input = made
    got = {_strip(body.input[k]) for k, g in enumerate(body_g_input) if g}
    for a in sorted(got | set(carried)):
        if a in cond_writes:
            raise _error(op, f"the loop body's gradient flows into '{a}', which the cond_net "
                             "writes; gradients do not flow through the cond_net")

    ops = []
    for v, c in carried.items():
        if v in given:
            ops.append(_op("Copy", [given[v]], [c]))
        else:
            ops.append(_op("ConstantFill", [v], [c], value=0.0))
    for w, c in read_only.items():
        ops.append(_op("ConstantFill", [w], [c], value=0.0))
    has = _fresh(d.scope + "/grad_cond")
    ops.append(_op("HasScope", [d.scope], [has]))

    loop_ops = list(body_grad_ops)
    for w, t in temps.items():
        loop_ops.append(_op("Sum", [read_only[w], t], [read_only[w]]))
    for v, c in carried.items():
        if v not in got:
            # overwritten without being read: nothing flows to the iteration before
            loop_ops.append(_op("ConstantFill", [c], [c], value=0.0))
    cond_ops = [_op("HasScope", [d.scope], [has])]

    state = [has] + list(carried.values()) + list(read_only.values())
    reads, writes = _reads_writes(loop_ops + cond_ops)
    inputs = state + [n for n in reads if n not in state]
    outputs = state + [n for n in writes if n not in state]
    cond_template = caffe2_pb2.NetDef()
    cond_template.name = "gradient_loop_cond_net"
    ops.append(_gradient_op(op, "While", inputs, outputs, [
        ("loop_net", _net(loop_net, "_grad", loop_ops)),
        ("cond_net", _net(cond_template, "", cond_ops)),
    ]))

    g_input, seen = [None] * len(op.input), set()
    for k, raw in enumerate(op.input):
        a = _strip(raw)
        if k == 0 or a in seen:
            continue
        seen.add(a)
        if a in carried:
            g_input[k] = carried[a]
        elif a in read_only:
            g_input[k] = read_only[a]
    return ops, g_input


GradientRegistry.RegisterGradient("Do")(gen_do_gradient)
GradientRegistry.RegisterGradient("If")(gen_if_gradient)
GradientRegistry.RegisterGradient("While")(gen_while_gradient)
