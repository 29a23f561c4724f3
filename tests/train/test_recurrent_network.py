"""RecurrentNetwork and its gradient (ops/recurrent/network.rs), built by
recurrent.recurrent_net from an LSTM step net written here (an FC of the
previous hidden state plus the projected input, then LSTMUnit): outputs
against a numpy LSTM unrolled over the sequence, gradients of the
sequence, the weights and the initial states against central differences
of the forward net (1, 2 and several timesteps, variable sequence lengths,
drop_states, the last output's gradient), reruns, forward-only nets, and
the single step workspace the op keeps."""

import numpy as np
import pytest
from ferrocaffe import core, recurrent, workspace


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_lstm(x, h0, c0, w, b, lengths, forget_bias=0.0, drop_states=False):
    """x (T, N, 4D) projected inputs; h0, c0 (1, N, D); w (4D, D); b (4D)."""
    steps, n = x.shape[0], x.shape[1]
    d = h0.shape[2]
    h, c = h0[0], c0[0]
    hs, cs = [], []
    for t in range(steps):
        g = (h @ w.T + b + x[t]).reshape(n, 4, d)
        i, f, o = _sig(g[:, 0]), _sig(g[:, 1] + forget_bias), _sig(g[:, 2])
        c_new = f * c + i * np.tanh(g[:, 3])
        h_new = o * np.tanh(c_new)
        live = (t < np.asarray(lengths))[:, None]
        keep_h = np.zeros_like(h) if drop_states else h
        keep_c = np.zeros_like(c) if drop_states else c
        h, c = np.where(live, h_new, keep_h), np.where(live, c_new, keep_c)
        hs.append(h)
        cs.append(c)
    return np.stack(hs), np.stack(cs)


def lstm_net(name, forward_only=False, outputs_with_grads=(0,), after_fc=None, fc="FC",
             **unit_args):
    """The LSTM over `input`; `after_fc(cell, W)` adds ops to the step net
    right after its FC (`fc`: "FCTransposed" takes W as (D, 4D))."""
    cell = core.Net(name + "_cell")
    h_prev, c_prev, x_t, seq, ts, w, b = cell.AddExternalInputs(
        "hidden_t_prev", "cell_t_prev", "input_t", "seq_lengths", "timestep", "W", "b")
    gates_h = getattr(cell, fc)([h_prev, w, b], "gates_h", axis=2)
    if after_fc is not None:
        after_fc(cell, w)
    gates = cell.Sum([gates_h, x_t], "gates")
    h, c = cell.LSTMUnit([h_prev, c_prev, gates, seq, ts], ["hidden_t", "cell_t"], **unit_args)
    cell.AddExternalOutputs(h, c)
    net = core.Net(name)
    net.AddExternalInputs("input", "h0", "c0", "seq_lengths", "W", "b")
    outs = recurrent.recurrent_net(
        net, cell, inputs=[(x_t, "input")],
        initial_cell_inputs=[(h_prev, "h0"), (c_prev, "c0")],
        links={h_prev: h, c_prev: c}, timestep=ts, scope=name,
        outputs_with_grads=outputs_with_grads, forward_only=forward_only)
    return net, [str(o) for o in outs]


def _draw(steps, n, d, seed=0):
    rng = np.random.default_rng(seed)
    return dict(
        input=rng.uniform(-1, 1, (steps, n, 4 * d)),
        h0=rng.uniform(-1, 1, (1, n, d)),
        c0=rng.uniform(-1, 1, (1, n, d)),
        W=rng.uniform(-0.8, 0.8, (4 * d, d)),
        b=rng.uniform(-0.5, 0.5, (4 * d,)),
    )


def _feed(values, lengths):
    for k, v in values.items():
        workspace.FeedBlob(k, v)
    workspace.FeedBlob("seq_lengths", np.array(lengths, np.int32))


@pytest.mark.parametrize("steps,lengths,args", [
    (1, [1, 1], {}),
    (2, [2, 1], {}),
    (5, [5, 3, 0], {"forget_bias": 1.0}),
    (4, [4, 2, 1], {"drop_states": True}),
])
def test_outputs_match_a_numpy_lstm(fresh, steps, lengths, args):
    n, d = len(lengths), 3
    values = _draw(steps, n, d)
    net, outs = lstm_net("fwd", forward_only=True, **args)
    _feed(values, lengths)
    workspace.RunNetOnce(net)
    hs, cs = numpy_lstm(values["input"], values["h0"], values["c0"], values["W"], values["b"],
                        lengths, args.get("forget_bias", 0.0), args.get("drop_states", False))
    h_all, h_last, c_all, c_last = (workspace.FetchBlob(o) for o in outs)
    np.testing.assert_allclose(h_all, hs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(c_all, cs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h_last, hs[-1:], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(c_last, cs[-1:], rtol=1e-12, atol=1e-12)


def _loss_and_grads(steps, lengths, args, seeds_of, seed, fc="FC", edit_backward=None,
                    factors=None):
    """Checks the gradients against central differences of the forward
    net; `edit_backward(step_net)` edits the backward step net first, and
    the gradient of each input named in `factors` is then expected times
    its factor."""
    n, d = len(lengths), 2
    values = _draw(steps, n, d, seed)
    if fc == "FCTransposed":
        values["W"] = np.ascontiguousarray(values["W"].T)
    net, outs = lstm_net("bwd", outputs_with_grads=tuple(sorted(seeds_of)), fc=fc, **args)
    rng = np.random.default_rng(seed + 100)
    seeds = {outs[k]: rng.uniform(-1, 1, (steps if k in (0, 2) else 1, n, d)) for k in seeds_of}
    for k, name in enumerate(seeds):
        workspace.FeedBlob("R%d" % k, seeds[name])
    net.AddExternalInputs(*["R%d" % k for k in range(len(seeds))])
    grads = net.AddGradientOperators({name: "R%d" % k for k, name in enumerate(seeds)})
    if edit_backward is not None:
        op = next(o for o in net.Proto().op if o.type == "RecurrentNetworkGradient")
        edit_backward(next(a for a in op.arg if a.name == "backward_step_net").n)
    fwd, fwd_outs = lstm_net("plain", forward_only=True, fc=fc, **args)

    def loss(vals):
        _feed(vals, lengths)
        workspace.RunNetOnce(fwd)
        got = dict(zip(outs, (workspace.FetchBlob(o) for o in fwd_outs)))
        return sum(float(np.sum(got[name] * r)) for name, r in seeds.items())

    _feed(values, lengths)
    workspace.RunNetOnce(net)
    analytic = {k: workspace.FetchBlob(str(grads[k])) for k in values}
    eps = 1e-6
    for k, v in values.items():
        num = np.zeros_like(v)
        for idx in np.ndindex(v.shape):
            moved = {kk: vv.copy() for kk, vv in values.items()}
            moved[k][idx] += eps
            up = loss(moved)
            moved[k][idx] -= 2 * eps
            num[idx] = (up - loss(moved)) / (2 * eps)
        num *= (factors or {}).get(k, 1.0)
        np.testing.assert_allclose(analytic[k], num, rtol=1e-5, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("steps,lengths,args", [
    (1, [1, 1], {}),
    (2, [2, 1], {}),
    (4, [4, 2, 0], {"forget_bias": 0.5}),
    (3, [3, 1], {"drop_states": True}),
])
def test_gradients_match_differences(fresh, steps, lengths, args):
    _loss_and_grads(steps, lengths, args, seeds_of=(0,), seed=steps)


def test_gradients_through_fc_transposed(fresh):
    _loss_and_grads(3, [3, 2], {}, seeds_of=(0,), seed=5, fc="FCTransposed")


@pytest.mark.parametrize("blob,factors", [
    # The gradient of the projected input is gates_grad's rows.
    ("gates_grad", {"input": 3.0}),
    ("hidden_t_prev", {}),
])
def test_a_blob_the_step_fc_gradient_read_then_written_in_place(fresh, blob, factors):
    # The gradient op makes the step FC's weight gradient once over the
    # sequence from the rows of X and dY the step ended with (ops/matmul.rs
    # FcGradSteps); an op after FCGradient that writes one of them in place
    # must leave the weight gradient what FCGradient computed at each step.
    def scale_after(step_net):
        assert step_net.op[-2].type == "FCGradient"
        step_net.op.add().CopyFrom(core.CreateOperator("Scale", [blob], [blob], scale=3.0))

    _loss_and_grads(3, [3, 1], {}, seeds_of=(0,), seed=9, edit_backward=scale_after,
                    factors=factors)


def test_gradient_of_the_last_hidden_state_and_all_cells(fresh):
    # outputs_with_grads (0, 1, 2): hidden_all, hidden_last, cell_all.
    _loss_and_grads(3, [3, 2], {}, seeds_of=(0, 1, 2), seed=7)


def test_reruns_reuse_one_step_workspace(fresh):
    values = _draw(6, 2, 3)
    net, outs = lstm_net("again")
    net.AddExternalInputs("R")
    net.AddGradientOperators({outs[0]: "R"})
    workspace.FeedBlob("R", np.ones((6, 2, 3)))
    _feed(values, [6, 4])
    workspace.CreateNet(net)
    workspace.RunNet(net.Proto().name)
    first = workspace.FetchBlob("W_grad").copy()
    ws_blob = "again/step_workspaces"
    workspace.RunNet(net.Proto().name)
    np.testing.assert_array_equal(workspace.FetchBlob("W_grad"), first)
    # A shorter sequence next: the kept steps are reused, nothing stale.
    values = _draw(2, 2, 3, seed=3)
    workspace.FeedBlob("R", np.ones((2, 2, 3)))
    _feed(values, [2, 1])
    workspace.RunNet(net.Proto().name)
    hs, _ = numpy_lstm(values["input"], values["h0"], values["c0"], values["W"], values["b"],
                       [2, 1])
    np.testing.assert_allclose(workspace.FetchBlob(outs[0]), hs, rtol=1e-12, atol=1e-12)
    assert workspace.HasBlob(ws_blob)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_step_fc_reads_the_weight_each_step_holds(fresh, dtype):
    # The step net's FC lays W out once per sequence (ops/matmul.rs
    # with_plain_weights); a W written in place between steps, between
    # runs, or fed anew must still be the W each product reads.
    steps, lengths, d = 4, [4, 3], 5
    values = {k: v.astype(dtype) for k, v in _draw(steps, len(lengths), d, seed=7).items()}
    tol = dict(rtol=2e-5, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)

    def numpy_scaled(w, scale):
        # Step t reads w * scale^t: unroll numpy_lstm one step at a time.
        h, c, hs = values["h0"], values["c0"], []
        for t in range(steps):
            hh, cc = numpy_lstm(values["input"][t:t + 1], h, c, w * scale ** t, values["b"],
                                [1 if t < n else 0 for n in lengths])
            h, c = hh, cc
            hs.append(hh[0])
        return np.stack(hs)

    # W scaled in place after each step's FC: step t reads W * 0.5^t.
    net, outs = lstm_net("scaled", forward_only=True,
                         after_fc=lambda cell, w: cell.Scale(w, w, scale=0.5))
    _feed(values, lengths)
    workspace.CreateNet(net)
    workspace.RunNet(net.Proto().name)
    np.testing.assert_allclose(workspace.FetchBlob(outs[0]), numpy_scaled(values["W"], 0.5), **tol)
    # The run left W scaled by 0.5^steps; the next run starts from there.
    w_now = workspace.FetchBlob("W")
    np.testing.assert_allclose(w_now, values["W"] * 0.5 ** steps, **tol)
    workspace.RunNet(net.Proto().name)
    np.testing.assert_allclose(workspace.FetchBlob(outs[0]), numpy_scaled(w_now, 0.5), **tol)
    # A W fed anew between runs.
    w_new = (np.random.default_rng(8).uniform(-0.8, 0.8, values["W"].shape)).astype(dtype)
    workspace.FeedBlob("W", w_new)
    workspace.RunNet(net.Proto().name)
    np.testing.assert_allclose(workspace.FetchBlob(outs[0]), numpy_scaled(w_new, 0.5), **tol)


@pytest.mark.parametrize("n,d", [(1, 64), (5, 8), (32, 256)])
def test_the_step_fc_agrees_to_the_bit_with_the_same_ops_unrolled(fresh, n, d):
    # Caffe2's own test_unroll_lstm compares RecurrentNetwork with the
    # statically unrolled net at 1e-7: the step net's FC (which may read
    # W laid out once per sequence) must give the bits FC gives outside.
    # One row (thin kernels), a few, and 32 x 256 -> 1024 (the panel kernel
    # where the CPU has AVX-512F: W packed once for the steps, at each call
    # outside).
    steps = 3
    values = {k: v.astype(np.float32) for k, v in _draw(steps, n, d, seed=11).items()}
    net, outs = lstm_net("rolled", forward_only=True)
    _feed(values, [steps] * n)
    workspace.RunNetOnce(net)
    rolled = workspace.FetchBlob(outs[0])
    flat = core.Net("unrolled")
    h, c = "h0", "c0"
    for t in range(steps):
        workspace.FeedBlob("x%d" % t, values["input"][t:t + 1])
        workspace.FeedBlob("t%d" % t, np.array([t], np.int32))
        g = flat.FC([h, "W", "b"], "gh%d" % t, axis=2)
        g = flat.Sum([g, "x%d" % t], "g%d" % t)
        h, c = flat.LSTMUnit([h, c, g, "seq_lengths", "t%d" % t], ["h%d" % (t + 1), "c%d" % (t + 1)])
    workspace.RunNetOnce(flat)
    unrolled = np.concatenate([workspace.FetchBlob("h%d" % (t + 1)) for t in range(steps)])
    np.testing.assert_array_equal(rolled, unrolled)



def test_a_backward_run_stopped_part_way_leaves_nothing_for_the_next(fresh):
    # The gradient op keeps each step's rows for the weight gradient it
    # makes after the last step; a run that fails at a middle step must
    # not leave its steps' rows to be summed into the next run's.
    values = _draw(3, 2, 3)
    net, outs = lstm_net("stop")
    net.AddExternalInputs("R")
    net.AddGradientOperators({outs[0]: "R"})
    op = next(o for o in net.Proto().op if o.type == "RecurrentNetworkGradient")
    step = next(a for a in op.arg if a.name == "backward_step_net").n
    # Gather fails at the steps where timestep - fail_from is negative.
    step.op.add().CopyFrom(core.CreateOperator("Sub", ["timestep", "fail_from"], ["fail_i"]))
    step.op.add().CopyFrom(core.CreateOperator("Gather", ["fail_data", "fail_i"], ["fail_o"]))
    step.external_input.extend(["fail_from", "fail_data"])
    workspace.FeedBlob("R", np.ones((3, 2, 3)))
    workspace.FeedBlob("fail_data", np.zeros(3))
    _feed(values, [3, 2])
    workspace.CreateNet(net)
    workspace.FeedBlob("fail_from", np.array([0], np.int32))
    workspace.RunNet(net.Proto().name)
    first = {k: workspace.FetchBlob(k).copy() for k in ("W_grad", "b_grad")}
    workspace.FeedBlob("fail_from", np.array([2], np.int32))
    with pytest.raises(RuntimeError, match="Gather"):
        workspace.RunNet(net.Proto().name)
    workspace.FeedBlob("fail_from", np.array([0], np.int32))
    workspace.RunNet(net.Proto().name)
    for k, v in first.items():
        np.testing.assert_array_equal(workspace.FetchBlob(k), v, err_msg=k)


def _grad_net(name, steps, fail=False, seeds_of=(0,)):
    """The LSTM and its gradient (outputs `seeds_of` seeded by R0, R1, ...,
    which the caller feeds); `fail`: the backward step net fails at the
    steps below `fail_from`."""
    net, outs = lstm_net(name, outputs_with_grads=seeds_of)
    seeds = ["R%d" % k for k in range(len(seeds_of))]
    net.AddExternalInputs(*seeds)
    grads = net.AddGradientOperators({outs[k]: r for k, r in zip(seeds_of, seeds)})
    if fail:
        op = next(o for o in net.Proto().op if o.type == "RecurrentNetworkGradient")
        step = next(a for a in op.arg if a.name == "backward_step_net").n
        step.op.add().CopyFrom(core.CreateOperator("Sub", ["timestep", "fail_from"], ["fail_i"]))
        step.op.add().CopyFrom(core.CreateOperator("Gather", ["fail_data", "fail_i"], ["fail_o"]))
        step.external_input.extend(["fail_from", "fail_data"])
        workspace.FeedBlob("fail_data", np.zeros(steps))
        workspace.FeedBlob("fail_from", np.array([0], np.int32))
    return net, outs + [str(grads[k]) for k in ("input", "W", "b", "h0", "c0")]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reruns_on_new_values_give_what_a_new_workspace_gives(fresh, dtype):
    # The ops may reuse the last run's states and sequence gradient (every
    # row is written again), and the gradient op reads the step FC's dY
    # rows from the latter: a run on new values, after a run stopped part
    # way, must give the bits a new workspace gives.
    steps, lengths = 5, [5, 2, 0]
    first = {k: v.astype(dtype) for k, v in _draw(steps, 3, 4, seed=21).items()}
    second = {k: v.astype(dtype) for k, v in _draw(steps, 3, 4, seed=22).items()}
    # Seeds of the hidden states, the last one and the cells: the outer
    # gradients join the states' gradients between steps and at the end.
    rng = np.random.default_rng(5)
    seeds = [rng.uniform(-1, 1, (rows, 3, 4)).astype(dtype) for rows in (steps, 1, steps)]

    def feed_seeds():
        for k, v in enumerate(seeds):
            workspace.FeedBlob("R%d" % k, v)

    def run(net, values, lengths):
        _feed(values, lengths)
        feed_seeds()
        workspace.RunNet(net.Proto().name)

    net, names = _grad_net("again2", steps, fail=True, seeds_of=(0, 1, 2))
    _feed(first, lengths)
    feed_seeds()
    workspace.CreateNet(net)
    run(net, first, lengths)
    workspace.FeedBlob("fail_from", np.array([3], np.int32))
    with pytest.raises(RuntimeError, match="Gather"):
        run(net, second, [3, 3, 1])
    workspace.FeedBlob("fail_from", np.array([0], np.int32))
    run(net, second, [4, 1, 2])
    got = {k: workspace.FetchBlob(k).copy() for k in names}
    workspace.ResetWorkspace()
    net, names = _grad_net("again2", steps, fail=True, seeds_of=(0, 1, 2))
    _feed(second, [4, 1, 2])
    feed_seeds()
    workspace.CreateNet(net)
    run(net, second, [4, 1, 2])
    for k in names:
        np.testing.assert_array_equal(got[k], workspace.FetchBlob(k), err_msg=k)


def test_a_step_that_leaves_the_input_gradient_empty_leaves_zero_rows(fresh):
    # A backward step that leaves the linked gradient of the input empty
    # writes nothing into its rows, which stay zero: also where the
    # sequence gradient's blob held other values before the run.
    steps, lengths = 4, [4, 2]
    net, names = _grad_net("empty", steps)
    op = next(o for o in net.Proto().op if o.type == "RecurrentNetworkGradient")
    args = {a.name: a for a in op.arg}
    step = args["backward_step_net"].n
    links = dict(zip((s.decode() for s in args["backward_link_external"].strings),
                     (s.decode() for s in args["backward_link_internal"].strings)))
    seq_grad = names[4]
    internal = links[seq_grad]
    step.op.add().CopyFrom(core.CreateOperator("Free", [internal], [internal]))
    values = _draw(steps, 2, 3, seed=4)
    _feed(values, lengths)
    workspace.FeedBlob("R0", np.ones((steps, 2, 3)))
    workspace.CreateNet(net)
    for _ in range(2):
        workspace.FeedBlob(seq_grad, np.full((steps, 2, 12), 5.0))
        workspace.RunNet(net.Proto().name)
        np.testing.assert_array_equal(workspace.FetchBlob(seq_grad), np.zeros((steps, 2, 12)))


def test_a_step_that_leaves_the_hidden_state_empty_leaves_zero_rows(fresh):
    # A step that leaves its linked hidden state empty writes nothing into
    # the states' rows, which stay zero (the next step reads a zero hidden
    # state): also where the states' blob held other values before the run.
    steps, lengths, n, d = 4, [4, 2], 2, 3
    net, outs = lstm_net("free_h", forward_only=True)
    op = next(o for o in net.Proto().op if o.type == "RecurrentNetwork")
    args = {a.name: a for a in op.arg}
    step = args["step_net"].n
    step.op.add().CopyFrom(core.CreateOperator("Free", ["hidden_t"], ["hidden_t"]))
    states = next(e.decode() for e, i in zip(args["link_external"].strings,
                                             args["link_internal"].strings)
                  if i.decode() == "hidden_t")
    values = _draw(steps, n, d, seed=6)
    _feed(values, lengths)
    workspace.CreateNet(net)
    c, cs = values["c0"], []
    for t in range(steps):
        _, cc = numpy_lstm(values["input"][t:t + 1], np.zeros((1, n, d)) if t else values["h0"],
                           c, values["W"], values["b"], [1 if t < k else 0 for k in lengths])
        c = cc
        cs.append(cc[0])
    for _ in range(2):
        workspace.FeedBlob(states, np.full((steps + 1, n, d), 5.0))
        workspace.RunNet(net.Proto().name)
        np.testing.assert_array_equal(workspace.FetchBlob(outs[0]), np.zeros((steps, n, d)))
        np.testing.assert_allclose(workspace.FetchBlob(outs[2]), np.stack(cs), rtol=1e-12,
                                   atol=1e-12)


def test_an_empty_batch_gives_zero_weight_gradients(fresh):
    # No rows at any step: the weight gradient over the sequence is a
    # product over nothing, zeros of W's shape.
    net, names = _grad_net("empty_batch", 3)
    values = _draw(3, 0, 2)
    _feed(values, [])
    workspace.FeedBlob("R0", np.ones((3, 0, 2)))
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob("W_grad"), np.zeros((8, 2)))
    np.testing.assert_array_equal(workspace.FetchBlob("b_grad"), np.zeros(8))
    assert workspace.FetchBlob(names[4]).shape == (3, 0, 8)


def _fail_in(net, op_type, arg, steps):
    """Makes the step net `arg` of the `op_type` op fail at the steps below
    the int blob `fail_from` (a Gather of a negative index)."""
    op = next(o for o in net.Proto().op if o.type == op_type)
    step = next(a for a in op.arg if a.name == arg).n
    step.op.add().CopyFrom(core.CreateOperator("Sub", ["timestep", "fail_from"], ["fail_i"]))
    step.op.add().CopyFrom(core.CreateOperator("Gather", ["fail_data", "fail_i"], ["fail_o"]))
    step.external_input.extend(["fail_from", "fail_data"])
    workspace.FeedBlob("fail_data", np.zeros(steps, np.float32))
    workspace.FeedBlob("fail_from", np.array([0], np.int32))


def _big_run(name, values, lengths, where=None):
    """An LSTM of 32 x 128 and its gradient: a step's rows are 16 KiB and
    more, so they go out to the sequences (and the next step's input rows
    come in) on the pool's idle thread while the next step runs."""
    steps = values["input"].shape[0]
    net, outs = lstm_net(name, outputs_with_grads=(0,))
    net.AddExternalInputs("R0")
    grads = net.AddGradientOperators({outs[0]: "R0"})
    if where is not None:
        _fail_in(net, *where, steps)
    names = outs + [str(grads[k]) for k in ("input", "W", "b", "h0", "c0")]
    _feed(values, lengths)
    workspace.FeedBlob("R0", np.linspace(-1, 1, values["input"].size // 4,
                                         dtype=np.float32).reshape(steps, -1, values["h0"].shape[2]))
    return net, names


@pytest.mark.parametrize("where", [("RecurrentNetwork", "step_net"),
                                   ("RecurrentNetworkGradient", "backward_step_net")])
def test_a_run_stopped_while_rows_go_out_on_the_pool_leaves_the_next_right(fresh, where):
    # A run that fails part way waits for the copies still on the pool; the
    # next run, on new values, gives the bits a new workspace gives, and
    # its hidden states what a numpy LSTM gives.
    steps, n, d = 6, 32, 128
    lengths = [steps] * (n - 2) + [3, 0]
    first = {k: v.astype(np.float32) for k, v in _draw(steps, n, d, seed=31).items()}
    second = {k: v.astype(np.float32) for k, v in _draw(steps, n, d, seed=32).items()}
    net, names = _big_run("pooled", first, lengths, where)
    workspace.CreateNet(net)
    workspace.RunNet(net.Proto().name)
    workspace.FeedBlob("fail_from", np.array([3], np.int32))
    with pytest.raises(RuntimeError, match="Gather"):
        workspace.RunNet(net.Proto().name)
    workspace.FeedBlob("fail_from", np.array([0], np.int32))
    _feed(second, lengths)
    workspace.RunNet(net.Proto().name)
    got = {k: workspace.FetchBlob(k).copy() for k in names}
    hs, _ = numpy_lstm(second["input"].astype(np.float64), second["h0"], second["c0"],
                       second["W"], second["b"], lengths)
    np.testing.assert_allclose(got[names[0]], hs, rtol=1e-4, atol=1e-5)
    workspace.ResetWorkspace()
    net, names = _big_run("pooled", second, lengths, where)
    workspace.RunNetOnce(net)
    for k in names:
        np.testing.assert_array_equal(got[k], workspace.FetchBlob(k), err_msg=k)
    # The gradients against the same ops unrolled, one set per step.
    want = _unrolled_grads(second, lengths, workspace.FetchBlob("R0"))
    for k, name in zip(("input", "W", "b", "h0", "c0"), names[4:]):
        np.testing.assert_allclose(got[name], want[k], rtol=1e-3, atol=1e-4, err_msg=k)


def _unrolled_grads(values, lengths, seed):
    """The gradients of sum(hidden states * seed) through FC, Sum and
    LSTMUnit written out for each step (no recurrent op)."""
    steps = values["input"].shape[0]
    flat = core.Net("unrolled_grads")
    h, c, hs = "h0", "c0", []
    for t in range(steps):
        workspace.FeedBlob("x%d" % t, values["input"][t:t + 1])
        workspace.FeedBlob("t%d" % t, np.array([t], np.int32))
        g = flat.FC([h, "W", "b"], "gh%d" % t, axis=2)
        g = flat.Sum([g, "x%d" % t], "g%d" % t)
        h, c = flat.LSTMUnit([h, c, g, "seq_lengths", "t%d" % t],
                             ["h%d" % (t + 1), "c%d" % (t + 1)])
        hs.append(h)
    flat.ZeroGradient([c], [])
    all_h, _ = flat.Concat(hs, ["all_h", "all_h_dims"], axis=0)
    workspace.FeedBlob("seed", seed)
    loss = flat.SumElements([flat.Mul([all_h, "seed"], "weighted")], "loss")
    grads = flat.AddGradientOperators([loss])
    _feed(values, lengths)
    workspace.RunNetOnce(flat)
    got = {k: workspace.FetchBlob(str(grads[k])) for k in ("W", "b", "h0", "c0")}
    got["input"] = np.concatenate([workspace.FetchBlob(str(grads["x%d" % t]))
                                   for t in range(steps)])
    return got


_POOL_RUN = """
import sys
import numpy as np
from ferrocaffe import _core, workspace
sys.path.insert(0, sys.argv[3])
import test_recurrent_network as m
_core.set_num_threads(int(sys.argv[1]))
steps, n, d = 5, 32, 128
values = {k: v.astype(np.float32) for k, v in m._draw(steps, n, d, seed=41).items()}
net, names = m._big_run("pool", values, [steps] * (n - 1) + [2])
workspace.CreateNet(net)
for _ in range(3):
    workspace.RunNet(net.Proto().name)
np.savez(sys.argv[2], **{"o%d" % i: workspace.FetchBlob(k) for i, k in enumerate(names)})
"""


def test_a_pool_of_two_gives_the_bits_of_one_thread(tmp_path):
    # The copies handed to the pool's idle thread change where they run,
    # not what they write: forward and gradients on pools of one and two
    # threads (each its own process: the pool is built once) agree to the
    # bit.
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    got = []
    for threads in (1, 2):
        out = tmp_path / ("pool%d.npz" % threads)
        subprocess.run([sys.executable, "-c", _POOL_RUN, str(threads), str(out), here],
                       check=True, timeout=300)
        got.append(np.load(out))
    assert len(got[0].files) == 9
    for k in got[0].files:
        np.testing.assert_array_equal(got[0][k], got[1][k], err_msg=k)


@pytest.mark.parametrize("n,d", [(2, 3), (32, 128)])
def test_a_step_that_resizes_a_linked_blob_gets_a_shape_error(fresh, n, d):
    # The step writes its hidden state with another shape: the copy into
    # the states fails with a shape error naming the states' blob, whether
    # it is made at once (a few rows) or by the pool's idle thread during
    # the next step (32 x 128: 16 KiB a step), and the workspace runs the
    # net again once the step is mended.
    steps = 4
    values = {k: v.astype(np.float32) for k, v in _draw(steps, n, d, seed=51).items()}
    net, outs = lstm_net("resized", forward_only=True)
    op = next(o for o in net.Proto().op if o.type == "RecurrentNetwork")
    args = {a.name: a for a in op.arg}
    step = args["step_net"].n
    step.op.add().CopyFrom(core.CreateOperator(
        "ConstantFill", [], ["hidden_t"], shape=[1, n, d + 1], value=0.5))
    states = next(e.decode() for e, i in zip(args["link_external"].strings,
                                             args["link_internal"].strings)
                  if i.decode() == "hidden_t")
    _feed(values, [steps] * n)
    with pytest.raises(ValueError, match="does not fit rows") as err:
        workspace.RunNetOnce(net)
    assert isinstance(err.value, RuntimeError)
    assert states in str(err.value)
    del step.op[-1]
    workspace.RunNetOnce(net)
    hs, _ = numpy_lstm(values["input"].astype(np.float64), values["h0"], values["c0"],
                       values["W"], values["b"], [steps] * n)
    np.testing.assert_allclose(workspace.FetchBlob(outs[0]), hs, rtol=1e-4, atol=1e-5)
