"""The recurrent cells LSTMUnit and GRUUnit (ops/recurrent.rs): outputs
against a plain numpy model of one timestep written here (every row live,
rows past their sequence's end, drop_states, no seq_lengths input), their
gradients against central differences of the forward op, the gradient ops
the makers add, the ZeroGradient that supplies an output gradient no loss
gives, and typed errors. The generic checker (test_op_gradients.py) also
runs both ops."""

import time

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm_step(h_prev, c_prev, gates, t, lengths=None, forget_bias=0.0, drop_states=False):
    """One LSTM timestep over (1, N, D) states and (1, N, 4D) gates."""
    n, d = c_prev.shape[1], c_prev.shape[2]
    g = gates.reshape(n, 4, d)
    i, f, o = _sig(g[:, 0]), _sig(g[:, 1] + forget_bias), _sig(g[:, 2])
    cand = np.tanh(g[:, 3])
    c = f * c_prev[0] + i * cand
    h = o * np.tanh(c)
    live = np.ones(n, bool) if lengths is None else t < np.asarray(lengths)
    keep_h = np.zeros_like(h) if drop_states else h_prev[0]
    keep_c = np.zeros_like(c) if drop_states else c_prev[0]
    h = np.where(live[:, None], h, keep_h)
    c = np.where(live[:, None], c, keep_c)
    return h[None], c[None]


def gru_step(h_prev, gates, t, lengths=None, drop_states=False):
    """One GRU timestep over a (1, N, D) state and (1, N, 3D) gates (the
    reset gate is applied before the op)."""
    n, d = h_prev.shape[1], h_prev.shape[2]
    g = gates.reshape(n, 3, d)
    u, o = _sig(g[:, 1]), np.tanh(g[:, 2])
    h = u * h_prev[0] + (1.0 - u) * o
    live = np.ones(n, bool) if lengths is None else t < np.asarray(lengths)
    keep = np.zeros_like(h) if drop_states else h_prev[0]
    return np.where(live[:, None], h, keep)[None]


def _feed(**blobs):
    for k, v in blobs.items():
        workspace.FeedBlob(k, v)


def _draw(n, d, k, dtype, seed=0):
    rng = np.random.default_rng(seed)
    h = rng.uniform(-1, 1, (1, n, d)).astype(dtype)
    c = rng.uniform(-1, 1, (1, n, d)).astype(dtype)
    g = rng.uniform(-2, 2, (1, n, k * d)).astype(dtype)
    return h, c, g


CASES = [
    # (lengths, t, args)
    ([3, 3, 3], 0, {}),
    ([3, 1, 0], 1, {}),
    ([3, 1, 0], 1, {"drop_states": True}),
    ([2, 2, 5], 2, {"drop_states": True, "forget_bias": 1.5}),
    (None, 7, {"forget_bias": -0.5}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lengths,t,args", CASES)
def test_lstm_unit_matches_the_numpy_cell(fresh, dtype, lengths, t, args):
    h, c, g = _draw(3, 4, 4, dtype)
    _feed(h=h, c=c, g=g, t=np.array([t], np.int32))
    ins = ["h", "c", "g", "t"]
    kw = dict(args)
    if lengths is None:
        kw["sequence_lengths"] = False
    else:
        _feed(s=np.array(lengths, np.int32))
        ins = ["h", "c", "g", "s", "t"]
    workspace.RunOperatorOnce(core.CreateOperator("LSTMUnit", ins, ["ht", "ct"], **kw))
    want_h, want_c = lstm_step(h.astype(np.float64), c.astype(np.float64), g.astype(np.float64),
                               t, lengths, args.get("forget_bias", 0.0),
                               args.get("drop_states", False))
    tol = 1e-6 if dtype == np.float32 else 1e-13
    got_h, got_c = workspace.FetchBlob("ht"), workspace.FetchBlob("ct")
    assert got_h.dtype == dtype and got_h.shape == (1, 3, 4)
    np.testing.assert_allclose(got_h, want_h, rtol=tol, atol=tol)
    np.testing.assert_allclose(got_c, want_c, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lengths,t,args", CASES)
def test_gru_unit_matches_the_numpy_cell(fresh, dtype, lengths, t, args):
    args = {k: v for k, v in args.items() if k != "forget_bias"}
    h, _, g = _draw(3, 4, 3, dtype, seed=1)
    _feed(h=h, g=g, t=np.array([t], np.int32))
    ins = ["h", "g", "t"]
    kw = dict(args)
    if lengths is None:
        kw["sequence_lengths"] = False
    else:
        _feed(s=np.array(lengths, np.int32))
        ins = ["h", "g", "s", "t"]
    workspace.RunOperatorOnce(core.CreateOperator("GRUUnit", ins, ["ht"], **kw))
    want = gru_step(h.astype(np.float64), g.astype(np.float64), t, lengths,
                    args.get("drop_states", False))
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(workspace.FetchBlob("ht"), want, rtol=tol, atol=tol)


# ------------------------------------------------------------ gradients --


def _numeric(f, xs, wrt, seeds, eps=1e-6):
    """Central differences of L = sum_k sum(f(xs)[k] * seeds[k]) in xs[wrt]."""
    x = xs[wrt]
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        vals = []
        for s in (eps, -eps):
            moved = [v.copy() for v in xs]
            moved[wrt][idx] += s
            vals.append(sum(float(np.sum(y * r)) for y, r in zip(f(moved), seeds)))
        g[idx] = (vals[0] - vals[1]) / (2 * eps)
    return g


@pytest.mark.parametrize("lengths,t,args", CASES)
def test_lstm_unit_gradient_matches_differences(fresh, lengths, t, args):
    h, c, g = _draw(3, 2, 4, np.float64, seed=5)
    rng = np.random.default_rng(9)
    seeds = [rng.uniform(-1, 1, (1, 3, 2)) for _ in range(2)]
    workspace.FeedBlob("t", np.array([t], np.int32))
    kw = dict(args)
    names = ["h", "c", "g"]
    if lengths is None:
        kw["sequence_lengths"] = False
        ins = names + ["t"]
    else:
        workspace.FeedBlob("s", np.array(lengths, np.int32))
        ins = names + ["s", "t"]

    def f(values):
        _feed(**dict(zip(names, values)))
        workspace.RunOperatorOnce(core.CreateOperator("LSTMUnit", ins, ["ht", "ct"], **kw))
        return [workspace.FetchBlob("ht"), workspace.FetchBlob("ct")]

    net = core.Net("lstm_grad")
    net.AddExternalInputs(*ins, "R0", "R1")
    net.LSTMUnit(ins, ["ht", "ct"], **kw)
    net.AddGradientOperators({"ht": "R0", "ct": "R1"})
    grad_op = net.Proto().op[-1]
    assert grad_op.type == "LSTMUnitGradient"
    assert list(grad_op.input) == ins + ["ht", "ct", "R0", "R1"]
    assert list(grad_op.output) == ["h_grad", "c_grad", "g_grad"]
    _feed(h=h, c=c, g=g, R0=seeds[0], R1=seeds[1])
    workspace.RunNetOnce(net)
    for k, name in enumerate(names):
        want = _numeric(f, [h, c, g], k, seeds)
        np.testing.assert_allclose(workspace.FetchBlob(name + "_grad"), want, rtol=1e-6,
                                   atol=1e-8, err_msg=name)


@pytest.mark.parametrize("lengths,t,args", CASES)
def test_gru_unit_gradient_matches_differences(fresh, lengths, t, args):
    args = {k: v for k, v in args.items() if k != "forget_bias"}
    h, _, g = _draw(3, 2, 3, np.float64, seed=6)
    seeds = [np.random.default_rng(10).uniform(-1, 1, (1, 3, 2))]
    workspace.FeedBlob("t", np.array([t], np.int32))
    kw = dict(args)
    if lengths is None:
        kw["sequence_lengths"] = False
        ins = ["h", "g", "t"]
    else:
        workspace.FeedBlob("s", np.array(lengths, np.int32))
        ins = ["h", "g", "s", "t"]

    def f(values):
        _feed(h=values[0], g=values[1])
        workspace.RunOperatorOnce(core.CreateOperator("GRUUnit", ins, ["ht"], **kw))
        return [workspace.FetchBlob("ht")]

    net = core.Net("gru_grad")
    net.AddExternalInputs(*ins, "R0")
    net.GRUUnit(ins, ["ht"], **kw)
    net.AddGradientOperators({"ht": "R0"})
    grad_op = net.Proto().op[-1]
    assert grad_op.type == "GRUUnitGradient"
    assert list(grad_op.input) == ins + ["ht", "R0"]
    _feed(h=h, g=g, R0=seeds[0])
    workspace.RunNetOnce(net)
    for k, name in enumerate(["h", "g"]):
        want = _numeric(f, [h, g], k, seeds)
        np.testing.assert_allclose(workspace.FetchBlob(name + "_grad"), want, rtol=1e-6,
                                   atol=1e-8, err_msg=name)


def test_lstm_unit_needs_both_output_gradients_until_zero_gradient(fresh):
    net = core.Net("zero_grad")
    hp, c, g, s, t = net.AddExternalInputs("h", "c", "g", "s", "t")
    hidden, cell = net.LSTMUnit([hp, c, g, s, t], ["ht", "ct"])
    with pytest.raises(errors.InvalidArgumentError, match="'ct'.*not provided"):
        net.AddGradientOperators([hidden])
    net.ZeroGradient(cell, [])
    net.AddGradientOperators([hidden])
    types = [op.type for op in net.Proto().op]
    assert types.index("ConstantFill") < types.index("LSTMUnitGradient")
    h0, c0, g0 = _draw(2, 3, 4, np.float32)
    _feed(h=h0, c=c0, g=g0, s=np.array([1, 1], np.int32), t=np.array([0], np.int32))
    workspace.RunNetOnce(net)
    assert np.all(workspace.FetchBlob("ct_grad") == 0)
    assert workspace.FetchBlob("g_grad").shape == (1, 2, 12)


# --------------------------------------------------------------- errors --


def test_wrong_shapes_and_counts_are_typed_errors(fresh):
    h, c, g = _draw(2, 3, 4, np.float32)
    _feed(h=h, c=c, g=g[:, :, :8], s=np.array([1, 1], np.int32), t=np.array([0], np.int32))
    with pytest.raises(errors.ShapeError, match="'g' must have shape"):
        workspace.RunOperatorOnce(core.CreateOperator("LSTMUnit", ["h", "c", "g", "s", "t"],
                                                      ["ht", "ct"]))
    _feed(g=g, s=np.array([1, 1, 1], np.int32))
    with pytest.raises(errors.InvalidArgumentError, match="seq_lengths"):
        workspace.RunOperatorOnce(core.CreateOperator("LSTMUnit", ["h", "c", "g", "s", "t"],
                                                      ["ht", "ct"]))
    with pytest.raises(errors.InvalidArgumentError, match="takes 4 inputs with sequence_lengths=0"):
        workspace.RunOperatorOnce(core.CreateOperator("LSTMUnit", ["h", "c", "g", "s", "t"],
                                                      ["ht", "ct"], sequence_lengths=False))
    _feed(t=np.array([0.5], np.float32), g=g[:, :, :9])
    with pytest.raises(errors.DataTypeError, match="timestep"):
        workspace.RunOperatorOnce(core.CreateOperator("GRUUnit", ["h", "g", "t"], ["ht"],
                                                      sequence_lengths=False))


# Cells of many rows (130 x 37)
# and rows longer than the 16-element blocks of the kernels' inner loops
# (D = 37: two blocks and a tail), some rows past their sequence's end.
# Gradients against central differences of the numpy cell taken a whole
# gate block at a time (each output element depends on its own position of
# each block only).
@pytest.mark.parametrize("drop_states", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_lstm_cells_match_the_numpy_cell(fresh, dtype, drop_states):
    n, d, t = 130, 37, 4
    h, c, g = _draw(n, d, 4, dtype, seed=11)
    lengths = np.arange(n, dtype=np.int32) % 7
    rng = np.random.default_rng(12)
    dh, dc = (rng.uniform(-1, 1, (1, n, d)).astype(dtype) for _ in range(2))
    _feed(h=h, c=c, g=g, s=lengths, t=np.array([t], np.int32), dh=dh, dc=dc)
    kw = {"drop_states": drop_states, "forget_bias": 0.5}
    workspace.RunOperatorOnce(core.CreateOperator("LSTMUnit", ["h", "c", "g", "s", "t"],
                                                  ["ht", "ct"], **kw))
    workspace.RunOperatorOnce(core.CreateOperator(
        "LSTMUnitGradient", ["h", "c", "g", "s", "t", "ht", "ct", "dh", "dc"],
        ["dhp", "dcp", "dg"], **kw))
    f64 = [v.astype(np.float64) for v in (h, c, g, dh, dc)]
    h64, c64, g64, dh64, dc64 = f64

    def loss(hp, cp, gg):
        ht, ct = lstm_step(hp, cp, gg, t, lengths, 0.5, drop_states)
        return ht * dh64 + ct * dc64

    want_h, want_c = lstm_step(h64, c64, g64, t, lengths, 0.5, drop_states)
    tol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(workspace.FetchBlob("ht"), want_h, rtol=tol, atol=tol)
    np.testing.assert_allclose(workspace.FetchBlob("ct"), want_c, rtol=tol, atol=tol)
    eps = 1e-6

    def moved(x, s, block=None):
        y = x.copy()
        if block is None:
            y += s
        else:
            y.reshape(n, 4, d)[:, block] += s
        return y

    want_dh = (loss(moved(h64, eps), c64, g64) - loss(moved(h64, -eps), c64, g64)) / (2 * eps)
    want_dc = (loss(h64, moved(c64, eps), g64) - loss(h64, moved(c64, -eps), g64)) / (2 * eps)
    want_dg = np.concatenate(
        [((loss(h64, c64, moved(g64, eps, q)) - loss(h64, c64, moved(g64, -eps, q))) / (2 * eps))
         .reshape(n, d) for q in range(4)], axis=1).reshape(1, n, 4 * d)
    tol = 2e-5 if dtype == np.float32 else 1e-8
    np.testing.assert_allclose(workspace.FetchBlob("dhp"), want_dh, rtol=tol, atol=tol)
    np.testing.assert_allclose(workspace.FetchBlob("dcp"), want_dc, rtol=tol, atol=tol)
    np.testing.assert_allclose(workspace.FetchBlob("dg"), want_dg, rtol=tol, atol=tol)


# The rows of a large cell run in blocks shared with pool threads that are
# idle, spinning after a split matrix product (threads::fork): right after
# a large MatMul the blocks are shared, after a pause (the pool asleep) they
# run on one thread. Both give the same bits.
@pytest.mark.parametrize("drop_states", [False, True])
def test_cells_shared_with_idle_pool_threads_give_the_same_bits(fresh, drop_states):
    n, d, t = 64, 256, 3
    h, c, g = _draw(n, d, 4, np.float32, seed=21)
    rng = np.random.default_rng(22)
    dh, dc = (rng.uniform(-1, 1, (1, n, d)).astype(np.float32) for _ in range(2))
    a = rng.uniform(-1, 1, (512, 512)).astype(np.float32)
    _feed(h=h, c=c, g=g, s=np.arange(n, dtype=np.int32) % 5, t=np.array([t], np.int32),
          dh=dh, dc=dc, a=a)
    kw = {"drop_states": drop_states, "forget_bias": 0.25}
    ops = [core.CreateOperator("LSTMUnit", ["h", "c", "g", "s", "t"], ["ht", "ct"], **kw),
           core.CreateOperator("LSTMUnitGradient",
                               ["h", "c", "g", "s", "t", "ht", "ct", "dh", "dc"],
                               ["dhp", "dcp", "dg"], **kw)]
    matmul = core.CreateOperator("MatMul", ["a", "a"], ["aa"])
    names = ["ht", "ct", "dhp", "dcp", "dg"]
    runs = []
    for after_product in [False, True, False, True]:
        if after_product:
            workspace.RunOperatorOnce(matmul)
        else:
            time.sleep(0.05)
        for op in ops:
            workspace.RunOperatorOnce(op)
        runs.append([workspace.FetchBlob(b).copy() for b in names])
    want_h, want_c = lstm_step(h.astype(np.float64), c.astype(np.float64),
                               g.astype(np.float64), t, np.arange(n) % 5, 0.25, drop_states)
    np.testing.assert_allclose(runs[0][0], want_h, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(runs[0][1], want_c, rtol=1e-6, atol=1e-6)
    for r in runs[1:]:
        for name, x, y in zip(names, runs[0], r):
            assert x.tobytes() == y.tobytes(), name
