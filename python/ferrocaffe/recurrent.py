"""Caffe2's ``recurrent``: ``recurrent_net`` turns a step net (one
timestep of a recurrent cell) into one ``RecurrentNetwork`` op of a net,
with the backward step net its gradient runs.

The op's arguments are Caffe2's (see ``rust/core/src/ops/recurrent``):
each recurrent input of the cell has a *state*, a ``(T + 1, N, D)`` tensor
``<scope>/<input>_states`` whose row 0 is the initial value and row ``t + 1``
the cell's output at step ``t``; *links* bind the cell's blobs to rows of the
states and of the input sequence, *aliases* copy the states' rows 1.. and
last row to the outputs ``<output>_all`` and ``<output>_last``. The
backward step net is the gradient of the cell's ops, its links bind the
gradients the same way, and the gradient op sums the parameters' gradients
over the steps.
"""

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

__all__ = ["recurrent_net", "set_rnn_executor_config", "retrieve_step_blobs"]


def _triples(items):
    items = list(items)
    if not items:
        return [], [], []
    a, b, c = zip(*items)
    return list(a), list(b), list(c)


def _read_before_written(ops):
    """The blobs the ops read before any of them writes them."""
    written, undefined = set(), set()
    for op in ops:
        undefined.update(i for i in op.input if i not in written)
        written.update(op.output)
    return undefined


def recurrent_net(net, cell_net, inputs, initial_cell_inputs, links, timestep=None,
                  scope=None, outputs_with_grads=(0,), recompute_blobs_on_backward=None,
                  forward_only=False):
    """Adds a RecurrentNetwork op running ``cell_net`` over a sequence to
    ``net`` and returns its outputs (for each recurrent input, the cell
    output's values at every step and at the last step).

    - ``inputs``: ``[(cell_input, sequence)]``, one sequence ``(T, N, ...)``;
    - ``initial_cell_inputs``: ``[(cell_input, initial_value_blob)]``;
    - ``links``: ``{cell_input: cell_output}``, the output at ``t`` that is
      the input at ``t + 1``;
    - ``timestep``: the cell's timestep blob (default ``"timestep"``);
    - ``scope``: prefix of the op's internal blobs (default: a fresh name);
    - ``outputs_with_grads``: the outputs whose gradients reach the op;
    - ``recompute_blobs_on_backward``: cell blobs the backward step computes
      again instead of keeping one per step;
    - ``forward_only``: no backward step net (and no gradient).
    """
    if len(inputs) != 1:
        raise ValueError("recurrent_net: exactly one input sequence is supported, got %d"
                         % len(inputs))
    op_name = net.NextName("recurrent")
    prefix = str(scope) if scope is not None else op_name

    def scoped(name):
        return "%s/%s" % (prefix, name)

    cell = cell_net.Proto()
    sequences = [(str(i), str(b)) for i, b in inputs]
    initials = [(str(i), str(b)) for i, b in initial_cell_inputs]
    known = {i for i, _ in sequences} | {b for _, b in initials} | {i for i, _ in initials}
    if timestep is not None:
        known.add(str(timestep))
    # The cell's other inputs are the op's extra inputs (parameters).
    references = [core.BlobReference(b) for b in cell.external_input if b not in known]
    cell_outputs = list(cell.external_output)

    backward = None
    grad_map = {}
    if not forward_only:
        # The gradients given from outside are those of the states (the
        # op's outputs); any other blob the step declares as an output gets
        # its gradient from the step's own readers.
        state_outputs = {str(v) for v in links.values()}
        bwd_ops, grad_map = core.GradientRegistry.GetBackwardPass(
            cell.op, {o: o + "_grad" for o in cell_outputs if o in state_outputs})
        grad_map = {str(k): v for k, v in grad_map.items()}
        backward = core.Net("RecurrentBackwardStep")
        bproto = backward.Proto()
        del bproto.op[:]
        if recompute_blobs_on_backward is not None:
            recompute_blobs_on_backward = {str(b) for b in recompute_blobs_on_backward}
            for op in cell.op:
                if recompute_blobs_on_backward.intersection(op.output):
                    if not set(op.output) <= recompute_blobs_on_backward:
                        raise ValueError(
                            "recurrent_net: op %s writes %s, not all of which are recomputed"
                            % (op.type, list(op.output)))
                    bproto.op.extend([op])
        bproto.op.extend(bwd_ops)
        # Blobs of the forward step the backward step reads: kept per step.
        forward_written = {o for op in cell.op for o in op.output}
        scratch = sorted((_read_before_written(bproto.op) & forward_written) - set(cell_outputs))
        bproto.external_input.extend(scratch)
        bproto.type = "simple"
    backward_written = ({o for op in backward.Proto().op for o in op.output}
                        if backward is not None else set())

    linked = {str(k): v for k, v in links.items()}
    forward_links, backward_links, aliases, states, outputs = [], [], [], [], []
    for cell_input, _ in initials:
        state = scoped(cell_input + "_states")
        link = linked[cell_input]
        cell_output = str(link)
        forward_links += [(cell_input, state, 0), (cell_output, state, 1)]
        aliases += [(state, cell_output + "_all", 1), (state, cell_output + "_last", -1)]
        # A BlobReference's outputs stay references (an active name scope
        # does not prefix them again); a name is scoped, as in Caffe2.
        outputs += [link + "_all", link + "_last"]
        states.append(state)
        if backward is not None:
            backward_links.append((cell_output + "_grad", state + "_grad", 1))
            backward.Proto().external_input.append(cell_output + "_grad")
            own = cell_input + "_grad"
            into = own if own in backward_written else str(grad_map[cell_input])
            backward_links.append((into, state + "_grad", 0))
    for cell_input, sequence in sequences:
        forward_links.append((cell_input, sequence, 0))
    if backward is not None:
        for cell_input, sequence in sequences:
            backward_links.append((str(grad_map[cell_input]), sequence + "_grad", 0))
        bproto = backward.Proto()
        bproto.external_input.extend(cell.external_input)
        bproto.external_input.extend(cell.external_output)
        # An op writing a blob the backward step gets from outside adds to
        # it instead: rename the output and sum it in after the op.
        # An op rewriting such a blob in place (a Reshape of a gradient)
        # makes another value: it gets a name of its own, read by the ops
        # after it, so that the blob linked from outside keeps its shape.
        ops = list(bproto.op)
        del bproto.op[:]
        external = set(bproto.external_input)
        renamed = {}
        for op in ops:
            bproto.op.extend([op])
            new = bproto.op[-1]
            for j, name in enumerate(new.input):
                if name in renamed:
                    new.input[j] = renamed[name]
            for j, out in enumerate(op.output):
                if out in external and out in op.input:
                    renamed[out] = new.output[j] = out + "_inplace"
                elif out in external:
                    accum = out + "_accum"
                    new.output[j] = accum
                    backward.Sum([out, accum], [out])
                else:
                    renamed.pop(out, None)

    # References, not names: an active name scope must not prefix them again.
    all_inputs = ([core.BlobReference(b) for _, b in sequences]
                  + [core.BlobReference(b) for _, b in initials] + references)
    link_internal, link_external, link_offset = _triples(forward_links)
    alias_src, alias_dst, alias_offset = _triples(aliases)
    kwargs = {}
    if backward is not None:
        b_internal, b_external, b_offset = _triples(backward_links)
        params = [p for p in references if str(p) in grad_map]
        kwargs = dict(
            param=[[str(x) for x in all_inputs].index(str(p)) for p in params],
            param_grads=[str(grad_map[str(p)]) for p in params],
            backward_link_internal=[str(x) for x in b_internal],
            backward_link_external=[str(x) for x in b_external],
            backward_link_offset=list(b_offset),
            outputs_with_grads=list(outputs_with_grads),
            recompute_blobs_on_backward=sorted(recompute_blobs_on_backward or ()),
        )
        if len(backward.Proto().op):
            kwargs["backward_step_net"] = backward.Proto()
    cell.type = "simple"
    results = net.RecurrentNetwork(
        all_inputs,
        outputs + [scoped("step_workspaces")],
        alias_src=alias_src,
        alias_dst=[str(a) for a in alias_dst],
        alias_offset=alias_offset,
        recurrent_states=states,
        initial_recurrent_state_ids=[[str(x) for x in all_inputs].index(b) for _, b in initials],
        link_internal=[str(x) for x in link_internal],
        link_external=[str(x) for x in link_external],
        link_offset=list(link_offset),
        enable_rnn_executor=1,
        step_net=cell,
        timestep="timestep" if timestep is None else str(timestep),
        **kwargs
    )
    return results[:-1]


def set_rnn_executor_config(rnn_op, num_threads=None, max_cuda_streams=None):
    """Caffe2's RNN executor settings on a RecurrentNetwork(Gradient) op;
    accepted and ignored here (the step net runs as a plain net)."""
    if rnn_op.type not in ("RecurrentNetwork", "RecurrentNetworkGradient"):
        raise ValueError("set_rnn_executor_config: not a RecurrentNetwork op: %s" % rnn_op.type)
    for name, value in (("num_threads", num_threads), ("max_cuda_streams", max_cuda_streams)):
        if value is not None:
            a = caffe2_pb2.Argument()
            a.name = "rnn_executor." + name
            a.i = value
            rnn_op.arg.extend([a])


def retrieve_step_blobs(net, prefix="rnn"):
    """Copies the blobs every timestep of each RecurrentNetwork op of ``net``
    kept into the current workspace, named ``<prefix>_<blob><t>``, and
    returns their names (bytes). Only an op with a backward step net keeps
    its steps."""
    names = []
    count = 0
    for op in net.Proto().op:
        if op.type != "RecurrentNetwork":
            continue
        count += 1
        listing = "%s_%d" % (prefix, count)
        workspace.RunOperatorOnce(core.CreateOperator(
            "RecurrentNetworkBlobFetcher", [op.output[-1]], [listing], prefix=prefix))
        names += workspace.FetchBlob(listing).tolist()
    return names
