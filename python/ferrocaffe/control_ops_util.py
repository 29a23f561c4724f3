"""Helpers emitting Caffe2's control-flow operators (``If``, ``While``,
``Do``, ``CreateScope``), as in ``caffe2.python.control_ops_util``.

Each branch or loop body runs through a ``Do`` operator in its own
workspace.  Which blobs cross that boundary is decided by the *lexical
scope*, the set of blob names visible outside the block:

* a blob the body reads before writing it is an input; it must be in scope;
* a blob the body writes is an output if its name is in scope;
* every other blob stays local to the body's workspace.
"""

from ferrocaffe import core

__all__ = ['get_external_blob_names', 'add_if_op', 'add_while_op']


def _ordered(names):
    # Sets of names are turned into lists in a fixed order so that the
    # generated operators do not depend on string hashing.
    return sorted(str(n) for n in names)


def get_external_blob_names(net, lexical_scope):
    """
    Returns ``(input_names, output_names)`` for ``net``: the set of blobs it
    reads before writing them, and the set of blobs it writes that belong to
    ``lexical_scope``.  Every input must be in ``lexical_scope``.
    """
    net_proto = net.Proto()
    written = set()
    input_names = set()
    for op in net_proto.op:
        for name in op.input:
            if name not in written:
                input_names.add(str(name))
        for name in op.output:
            written.add(str(name))
    for input_name in _ordered(input_names):
        assert input_name in lexical_scope, \
            'Input blob ' + input_name + ' is undefined'

    output_names = set()
    for op in net_proto.op:
        for output in op.output:
            if output in lexical_scope:
                output_names.add(str(output))
    return input_names, output_names


def _blob_refs(names):
    return [core.BlobReference(name=b, net=None) for b in _ordered(names)]


def _add_do_net(do_net_name, body_net, input_names, output_names,
                workspace_blob, copy_external_blobs=False):
    """
    Builds a net holding a single Do op that runs ``body_net`` in the
    workspace held by ``workspace_blob``, forwarding the given blobs.
    Returns ``(net, inputs, outputs)``; inputs and outputs end with the
    workspace blob.
    """
    do_inputs = _blob_refs(input_names)
    do_outputs = _blob_refs(output_names)
    ordered_names = [str(b) for b in do_inputs + do_outputs]
    inner_blobs = _ordered(set(input_names) | set(output_names))
    outer_blobs_idx = [ordered_names.index(b) for b in inner_blobs]

    do_inputs.append(workspace_blob)
    do_outputs.append(workspace_blob)

    do_net = core.Net(do_net_name)
    kwargs = dict(
        net=body_net.Proto(),
        inner_blobs=inner_blobs,
        outer_blobs_idx=outer_blobs_idx,
    )
    if copy_external_blobs:
        kwargs['copy_external_blobs'] = True
    do_net.Do(do_inputs, do_outputs, **kwargs)
    do_net.AddExternalOutput(*do_outputs)
    return do_net, do_inputs, do_outputs


def add_if_op(if_net, cond_blob, lexical_scope, then_net, else_net=None):
    """
    Adds to ``if_net`` an ``If`` op running ``then_net`` when the scalar bool
    ``cond_blob`` is True and ``else_net`` (if any) otherwise.

    Blobs of the branches are outer (read from and written back to the
    workspace of ``if_net``) when they are read before being written, or
    when their name is in ``lexical_scope``; all other blobs only exist in
    the branch's own workspace.
    """
    then_inputs, then_outputs = get_external_blob_names(
        then_net, lexical_scope)
    else_inputs, else_outputs = set(), set()
    if else_net:
        else_inputs, else_outputs = get_external_blob_names(
            else_net, lexical_scope)

    if_inputs = [cond_blob] + _blob_refs(then_inputs | else_inputs)
    if_outputs = _blob_refs(then_outputs | else_outputs)

    # The workspace blobs carry the net's name so that they are unique
    # across several control ops in one workspace.
    then_ws_blob = if_net.NextScopedBlob(if_net.Name() + '/workspace_if_then')
    do_then_net, _, _ = _add_do_net(
        'do_then_net', then_net, then_inputs, then_outputs, then_ws_blob)
    if_inputs.append(then_ws_blob)
    if_outputs.append(then_ws_blob)
    if_args = {'then_net': do_then_net.Proto()}

    else_ws_blob = None
    if else_net:
        else_ws_blob = if_net.NextScopedBlob(
            if_net.Name() + '/workspace_if_else')
        do_else_net, _, _ = _add_do_net(
            'do_else_net', else_net, else_inputs, else_outputs, else_ws_blob)
        if_inputs.append(else_ws_blob)
        if_outputs.append(else_ws_blob)
        if_args['else_net'] = do_else_net.Proto()

    if_net.CreateScope([], [then_ws_blob])
    if else_ws_blob:
        if_net.CreateScope([], [else_ws_blob])
    if_net.If(if_inputs, if_outputs, **if_args)
    if_net.AddExternalOutput(*if_outputs)


def add_while_op(
        while_net, cond_blob, lexical_scope, loop_body_net,
        condition_body_net=None):
    """
    Adds to ``while_net`` a ``While`` op running ``loop_body_net`` for as long
    as the scalar bool ``cond_blob`` is True.  ``condition_body_net``, if
    given, computes ``cond_blob`` before each iteration (it must write it);
    it runs in a workspace of its own.  The outer/local rules of
    :func:`add_if_op` apply to both nets.
    """
    input_names, output_names = get_external_blob_names(
        loop_body_net, lexical_scope)
    # The body may run zero times, so what it writes must also come in.
    input_names = input_names | output_names

    while_inputs = [cond_blob] + _blob_refs(input_names)
    while_outputs = _blob_refs(output_names)

    body_ws_blob = while_net.NextScopedBlob(
        while_net.Name() + '/workspace_loop_body')
    do_loop_body_net, _, _ = _add_do_net(
        'do_loop_body_net', loop_body_net, input_names, output_names,
        body_ws_blob, copy_external_blobs=True)
    while_inputs.append(body_ws_blob)
    while_outputs.append(body_ws_blob)
    while_args = {'loop_net': do_loop_body_net.Proto()}

    cond_ws_blob = None
    if condition_body_net:
        cond_inputs, cond_outputs = get_external_blob_names(
            condition_body_net, lexical_scope)
        writes_cond = any(
            str(cond_blob) in op.output
            for op in condition_body_net.Proto().op)
        assert writes_cond, 'Condition net does not write into condition blob'
        cond_outputs.add(str(cond_blob))

        cond_ws_blob = while_net.NextScopedBlob(
            while_net.Name() + '/workspace_loop_cond')
        condition_net, cond_in_refs, cond_out_refs = _add_do_net(
            'do_loop_condition_net', condition_body_net,
            cond_inputs, cond_outputs, cond_ws_blob)
        while_args['cond_net'] = condition_net.Proto()

        while_inputs += [b for b in cond_in_refs
                         if str(b) not in input_names]
        while_outputs += [b for b in cond_out_refs
                          if str(b) not in output_names]

        if str(cond_blob) not in lexical_scope:
            while_net.ConstantFill(
                [], cond_blob, dtype=core.DataType.BOOL, value=False)

    while_net.CreateScope([], [body_ws_blob])
    if cond_ws_blob:
        while_net.CreateScope([], [cond_ws_blob])
    while_net.While(while_inputs, while_outputs, **while_args)
    while_net.AddExternalOutput(*while_outputs)
