"""Control flow built from execution steps (Caffe2's ``caffe2.python.control``):
``Do``, ``DoParallel``, ``For``, ``While``, ``Until``, ``DoWhile``,
``DoUntil``, ``Switch``, ``SwitchNot``, ``If`` and ``IfNot``.

Each function returns a ``core.ExecutionStep``. A *condition* is a boolean
scalar blob, or a ``core.Net`` whose last external output is that blob (the
net is run first, every time the condition is evaluated). The body
``nets_or_steps`` is a Net, an ExecutionStep, or a list of either kind.

Everything here is plain step structure: a condition becomes a stop blob
(checked by the plan executor after every net or substep), a loop count a
counter. Nothing runs until the step is run.

One difference from Caffe2: ``If``/``IfNot`` with both branches copy the
condition before the first branch runs, so a first branch that changes the
condition blob cannot also start the second (Caffe2 evaluated it again).
"""

from ferrocaffe import core

__all__ = [
    'GetConditionBlobFromNet', 'BoolNet', 'NotNet', 'MergeConditionNets',
    'CombineConditions', 'Do', 'DoParallel', 'For', 'While', 'Until',
    'DoWhile', 'DoUntil', 'Switch', 'SwitchNot', 'If', 'IfNot',
]

# Step names are made unique within the process: '<base>/<control>', then
# '<base>/<control>_<n>' with a process-wide counter.
_next_suffix = 1
_step_names_used = set()


def _step_name(control, base):
    global _next_suffix
    stem = '%s/%s' % (base, control)
    name = stem
    while name in _step_names_used:
        name = '%s_%d' % (stem, _next_suffix)
        _next_suffix += 1
    _step_names_used.add(name)
    return name


def _as_list(items):
    """The varargs of a control function as one list: ``f(a, b)`` and
    ``f([a, b])`` mean the same; ``f(a)`` is ``[a]``."""
    if not items:
        raise ValueError('input cannot be empty.')
    if len(items) == 1:
        only = items[0]
        return list(only) if isinstance(only, list) else [only]
    return list(items)


def _all_nets(nets_or_steps):
    if isinstance(nets_or_steps, list):
        return all(isinstance(n, core.Net) for n in nets_or_steps)
    return isinstance(nets_or_steps, core.Net)


def _with_nets(body, nets, before):
    """``body`` with ``nets`` run before (or after) it: merged into the list
    when the body is nets, else as a step of their own."""
    body = _as_list((body,))
    nets = _as_list(tuple(nets))
    if _all_nets(body):
        return nets + body if before else body + nets
    wrapped = Do('prepend' if before else 'append', nets)
    return [wrapped] + body if before else body + [wrapped]


def GetConditionBlobFromNet(condition_net):
    """The condition blob of a condition net: its last external output."""
    outputs = condition_net.Proto().external_output
    if len(outputs) == 0:
        raise ValueError(
            'Condition net %s must has at least one external output' %
            condition_net.Name())
    # A BlobReference, so that ops built on it later get no name scope.
    return core.BlobReference(outputs[-1])


def BoolNet(*blobs_with_bool_value):
    """A net setting each ``(blob, value)`` pair's blob to the bool scalar
    ``value`` (to give condition blobs a value before their first use);
    every blob is an external output."""
    net = core.Net('bool_net')
    for blob, value in _as_list(blobs_with_bool_value):
        out = net.ConstantFill([], [blob], shape=[], value=bool(value),
                               dtype=core.DataType.BOOL)
        net.AddExternalOutput(out)
    return net


def NotNet(condition_blob_or_net):
    """``(net, blob)``: a net computing the negation of the condition into
    a new blob, its external output."""
    condition = (GetConditionBlobFromNet(condition_blob_or_net)
                 if isinstance(condition_blob_or_net, core.Net)
                 else condition_blob_or_net)
    net = core.Net('not_net')
    out = net.Not(condition)
    net.AddExternalOutput(out)
    return net, out


def _copy_condition_net(condition_blob):
    net = core.Net('copy_condition_blob_net')
    out = net.Copy(condition_blob)
    net.AddExternalOutput(out)
    return net, out


def _relate(net, relation, left, right):
    if relation not in ('And', 'Or'):
        raise ValueError("relation must be 'And' or 'Or', not %r" % (relation,))
    return getattr(net, relation)([left, right])


def MergeConditionNets(name, condition_nets, relation):
    """One condition net running every net of ``condition_nets`` (their
    ops, in order) and combining their conditions with ``relation``
    (``'And'`` or ``'Or'``). A single net (not a list) is returned as is."""
    if not isinstance(condition_nets, list):
        return condition_nets
    if len(condition_nets) <= 1:
        return condition_nets[0] if condition_nets else None
    merged = core.Net(name)
    combined = None
    for net in condition_nets:
        proto = net.Proto()
        merged.Proto().op.extend(proto.op)
        merged.Proto().external_input.extend(proto.external_input)
        condition = GetConditionBlobFromNet(net)
        combined = (condition if combined is None
                    else _relate(merged, relation, combined, condition))
        for key, values in net._attr_dict.items():
            merged._attr_dict[key] += values
    merged.AddExternalOutput(combined)
    return merged


def CombineConditions(name, condition_nets, relation):
    """A condition net combining the conditions of ``condition_nets`` with
    ``relation`` *without* running those nets (they are run elsewhere, e.g.
    readers whose 'done' blobs are combined)."""
    if not condition_nets:
        return None
    if not isinstance(condition_nets, list):
        raise ValueError('condition_nets must be a list of nets.')
    if len(condition_nets) == 1:
        net, _ = _copy_condition_net(
            GetConditionBlobFromNet(condition_nets[0]))
        return net
    combined_net = core.Net(name)
    combined = None
    for net in condition_nets:
        condition = GetConditionBlobFromNet(net)
        combined = (condition if combined is None
                    else _relate(combined_net, relation, combined, condition))
    combined_net.AddExternalOutput(combined)
    return combined_net


def Do(name, *nets_or_steps):
    """Runs the nets or steps once, in order (a single step is returned as
    is)."""
    items = _as_list(nets_or_steps)
    if len(items) == 1 and isinstance(items[0], core.ExecutionStep):
        return items[0]
    return core.scoped_execution_step(_step_name('Do', name), items)


def DoParallel(name, *nets_or_steps):
    """Runs the nets or steps concurrently and waits for all of them."""
    items = _as_list(nets_or_steps)
    if len(items) == 1 and isinstance(items[0], core.ExecutionStep):
        return items[0]
    return core.scoped_execution_step(
        _step_name('DoParallel', name), items, concurrent_substeps=True)


def _once_if(name, condition, body):
    """Runs ``body`` once when the condition is true."""
    not_net, stop = NotNet(condition)
    if isinstance(condition, core.Net):
        body = _with_nets(body, [condition, not_net], before=True)
    else:
        body = _with_nets(body, [not_net], before=True)

    def step(control):
        return core.scoped_execution_step(
            _step_name(control, name), body, should_stop_blob=stop,
            only_once=True)

    if _all_nets(body):
        # A stop blob left true by an earlier run would end the step after
        # its first net: start it false.
        return Do(name + '/_RunOnceIf', BoolNet((stop, False)),
                  step('_RunOnceIf-inner'))
    return step('_RunOnceIf')


def _once_if_not(name, condition, body):
    """Runs ``body`` once when the condition is false."""
    if isinstance(condition, core.Net):
        stop = GetConditionBlobFromNet(condition)
        body = _with_nets(body, [condition], before=True)
    else:
        copy_net, stop = _copy_condition_net(condition)
        body = _with_nets(body, [copy_net], before=True)
    return core.scoped_execution_step(
        _step_name('_RunOnceIfNot', name), body, should_stop_blob=stop,
        only_once=True)


def For(name, nets_or_steps, iter_num):
    """Runs the nets or steps ``iter_num`` times."""
    init_net = core.Net('init-net')
    counter = init_net.CreateCounter([], init_count=iter_num)
    iter_net = core.Net('For-iter')
    done = iter_net.CountDown([counter])
    loop = core.scoped_execution_step(
        _step_name('For-inner', name),
        _with_nets(nets_or_steps, [iter_net], before=True),
        should_stop_blob=done)
    return Do(name + '/For', Do(name + '/For-init-net', init_net), loop)


def While(name, condition_blob_or_net, nets_or_steps):
    """Runs the nets or steps while the condition (evaluated first) is
    true."""
    not_net, stop = NotNet(condition_blob_or_net)
    before = ([condition_blob_or_net, not_net]
              if isinstance(condition_blob_or_net, core.Net) else [not_net])
    body = _with_nets(nets_or_steps, before, before=True)

    def step(control):
        return core.scoped_execution_step(
            _step_name(control, name), body, should_stop_blob=stop)

    if _all_nets(body):
        return Do(name + '/While', BoolNet((stop, False)),
                  step('While-inner'))
    return step('While')


def Until(name, condition_blob_or_net, nets_or_steps):
    """Runs the nets or steps until the condition (evaluated first) is
    true."""
    if isinstance(condition_blob_or_net, core.Net):
        stop = GetConditionBlobFromNet(condition_blob_or_net)
        nets_or_steps = _with_nets(
            nets_or_steps, [condition_blob_or_net], before=True)
    else:
        stop = core.BlobReference(str(condition_blob_or_net))
    return core.scoped_execution_step(
        _step_name('Until', name), nets_or_steps, should_stop_blob=stop)


def DoWhile(name, condition_blob_or_net, nets_or_steps):
    """Runs the nets or steps, then again while the condition (evaluated
    after each pass) is true."""
    not_net, stop = NotNet(condition_blob_or_net)
    after = ([condition_blob_or_net, not_net]
             if isinstance(condition_blob_or_net, core.Net) else [not_net])
    body = _with_nets(nets_or_steps, after, before=False)
    return Do(name + '/DoWhile', BoolNet((stop, False)),
              core.scoped_execution_step(
                  _step_name('DoWhile-inner', name), body,
                  should_stop_blob=stop))


def DoUntil(name, condition_blob_or_net, nets_or_steps):
    """Runs the nets or steps, then again until the condition (evaluated
    after each pass) is true. With a condition *blob* that is already true,
    the loop ends after the first net or step, as in Caffe2."""
    if not isinstance(condition_blob_or_net, core.Net):
        return core.scoped_execution_step(
            _step_name('DoUntil', name), nets_or_steps,
            should_stop_blob=core.BlobReference(condition_blob_or_net))
    stop = GetConditionBlobFromNet(condition_blob_or_net)
    body = _with_nets(nets_or_steps, [condition_blob_or_net], before=False)
    return Do(name + '/DoUntil', BoolNet((stop, False)),
              core.scoped_execution_step(
                  _step_name('DoUntil-inner', name), body,
                  should_stop_blob=stop))


def Switch(name, *conditions):
    """``(condition, nets_or_steps)`` pairs: runs every body whose condition
    is true, in order (each condition net runs once)."""
    pairs = _as_list(conditions)
    return core.scoped_execution_step(
        _step_name('Switch', name),
        [_once_if(name + '/Switch', c, body) for c, body in pairs])


def SwitchNot(name, *conditions):
    """Like :func:`Switch`, for the bodies whose condition is false."""
    pairs = _as_list(conditions)
    return core.scoped_execution_step(
        _step_name('SwitchNot', name),
        [_once_if_not(name + '/SwitchNot', c, body) for c, body in pairs])


def _snapshot(name, condition):
    """(net, blob): evaluates the condition (running its net) and copies it
    into a blob of its own, read by both branches of an if/else."""
    net = core.Net(name + '/condition')
    if isinstance(condition, core.Net):
        net.Proto().op.extend(condition.Proto().op)
        net.Proto().external_input.extend(condition.Proto().external_input)
        condition = GetConditionBlobFromNet(condition)
    snapshot = net.Copy(condition)
    net.AddExternalOutput(snapshot)
    return net, snapshot


def _if_else(name, control, condition, first_once, first, second_once, second):
    """``first`` once by ``first_once``'s rule, else ``second`` by
    ``second_once``'s, both reading one snapshot of the condition."""
    net, snapshot = _snapshot(name + '/' + control, condition)
    return Do(name + '/' + control,
              Do(name + '/' + control + '-condition', net),
              first_once(name + '/' + control + '-true', snapshot, first),
              second_once(name + '/' + control + '-false', snapshot, second))


def If(name, condition_blob_or_net, true_nets_or_steps,
       false_nets_or_steps=None):
    """Runs ``true_nets_or_steps`` once if the condition is true, else
    ``false_nets_or_steps`` (if given)."""
    if not false_nets_or_steps:
        return _once_if(name + '/If', condition_blob_or_net,
                        true_nets_or_steps)
    return _if_else(name, 'If', condition_blob_or_net, _once_if,
                    true_nets_or_steps, _once_if_not, false_nets_or_steps)


def IfNot(name, condition_blob_or_net, true_nets_or_steps,
          false_nets_or_steps=None):
    """Runs ``true_nets_or_steps`` once if the condition is false, else
    ``false_nets_or_steps`` (if given)."""
    if not false_nets_or_steps:
        return _once_if_not(name + '/IfNot', condition_blob_or_net,
                            true_nets_or_steps)
    return _if_else(name, 'IfNot', condition_blob_or_net, _once_if_not,
                    true_nets_or_steps, _once_if, false_nets_or_steps)
