"""rnn_cell and gru_cell: LSTM, GRU and BasicRNN over a sequence through one
RecurrentNetwork op, against numpy models of the cells written here with
the parameters the model made; a gradient of the whole LSTM against
central differences; the names Caffe2 scripts look for; cudnn_LSTM's
error."""

import numpy as np
import pytest
from ferrocaffe import core, gru_cell, rnn_cell, workspace
from ferrocaffe.model_helper import ModelHelper


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _fc(x, w, b):
    return x @ w.T + b


def _masked(t, lengths, new, old, drop):
    live = (t < np.asarray(lengths))[:, None]
    return np.where(live, new, np.zeros_like(old) if drop else old)


def _model_inputs(steps, n, d_in, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (steps, n, d_in)).astype(np.float32)
    lengths = rng.integers(0, steps + 1, n).astype(np.int32)
    lengths[0] = steps
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("lengths", lengths)
    return x, lengths


def _states(n, d, seed=1):
    rng = np.random.default_rng(seed)
    h0 = rng.uniform(-1, 1, (1, n, d)).astype(np.float32)
    c0 = rng.uniform(-1, 1, (1, n, d)).astype(np.float32)
    workspace.FeedBlob("h0", h0)
    workspace.FeedBlob("c0", c0)
    return h0, c0


def _p(name):
    return workspace.FetchBlob(name).astype(np.float64)


@pytest.mark.parametrize("drop_states", [False, True])
def test_lstm_matches_numpy(fresh, drop_states):
    steps, n, d_in, d = 4, 3, 5, 2
    x, lengths = _model_inputs(steps, n, d_in)
    h0, c0 = _states(n, d)
    model = ModelHelper(name="m")
    h_all, h_last, c_all, c_last = rnn_cell.LSTM(
        model, "x", "lengths", ("h0", "c0"), d_in, d, scope="lstm", forget_bias=0.5,
        drop_states=drop_states)
    assert [str(b) for b in (h_all, h_last, c_all, c_last)] == [
        "lstm/hidden_state_all", "lstm/hidden_state_last", "lstm/cell_state_all",
        "lstm/cell_state_last"]
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    proj = _fc(x.astype(np.float64), _p("lstm/i2h_w"), _p("lstm/i2h_b"))
    w, b = _p("lstm/gates_t_w"), _p("lstm/gates_t_b")
    h, c = h0[0].astype(np.float64), c0[0].astype(np.float64)
    hs = []
    for t in range(steps):
        g = (_fc(h, w, b) + proj[t]).reshape(n, 4, d)
        c_new = _sig(g[:, 1] + 0.5) * c + _sig(g[:, 0]) * np.tanh(g[:, 3])
        h_new = _sig(g[:, 2]) * np.tanh(c_new)
        h, c = (_masked(t, lengths, h_new, h, drop_states),
                _masked(t, lengths, c_new, c, drop_states))
        hs.append(h)
    np.testing.assert_allclose(workspace.FetchBlob(h_all), np.stack(hs), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob(c_last), c[None], rtol=1e-5, atol=1e-6)


def test_lstm_gradient_matches_differences(fresh):
    steps, n, d_in, d = 3, 2, 2, 2
    _model_inputs(steps, n, d_in)
    _states(n, d)
    model = ModelHelper(name="g")
    h_all, _, _, _ = rnn_cell.LSTM(model, "x", "lengths", ("h0", "c0"), d_in, d, scope="l")
    loss = model.net.SumElements(model.net.Sqr(h_all, "sq"), "loss")
    model.AddGradientOperators([loss])
    workspace.RunNetOnce(model.param_init_net)
    params = ["l/i2h_w", "l/gates_t_w", "l/gates_t_b"]
    # float32 nets: float64 copies of the parameters differenced by hand.
    fwd = ModelHelper(name="f")
    h2, _, _, _ = rnn_cell.LSTM(fwd, "x", "lengths", ("h0", "c0"), d_in, d, scope="l2",
                                forward_only=True)
    workspace.RunNetOnce(model.net)
    analytic = {p: workspace.FetchBlob(p + "_grad") for p in params + ["x", "h0"]}

    def loss_of(values):
        for k, v in values.items():
            workspace.FeedBlob(k.replace("l/", "l2/") if k.startswith("l/") else k,
                               v.astype(np.float32))
        workspace.RunNetOnce(fwd.net)
        return float(np.sum(workspace.FetchBlob(h2).astype(np.float64) ** 2))

    workspace.RunNetOnce(fwd.param_init_net)
    base = {p: workspace.FetchBlob(p).astype(np.float64) for p in params + ["x", "h0"]}
    for k in base:
        eps = 1e-2
        num = np.zeros_like(base[k])
        for idx in np.ndindex(base[k].shape):
            up, down = dict(base), dict(base)
            up[k] = base[k].copy()
            up[k][idx] += eps
            down[k] = base[k].copy()
            down[k][idx] -= eps
            num[idx] = (loss_of(up) - loss_of(down)) / (2 * eps)
        np.testing.assert_allclose(analytic[k], num, rtol=2e-2, atol=2e-3, err_msg=k)


@pytest.mark.parametrize("linear_before_reset", [False, True])
def test_gru_matches_numpy(fresh, linear_before_reset):
    steps, n, d_in, d = 3, 2, 4, 3
    x, lengths = _model_inputs(steps, n, d_in, seed=2)
    h0, _ = _states(n, d, seed=3)
    model = ModelHelper(name="gru")
    out = gru_cell.GRU(model, "x", "lengths", ("h0",), d_in, d, scope="gru",
                       linear_before_reset=linear_before_reset)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    proj = _fc(x.astype(np.float64), _p("gru/i2h_w"), _p("gru/i2h_b"))
    h = h0[0].astype(np.float64)
    hs = []
    for t in range(steps):
        xr, xu, xo = np.split(proj[t], 3, axis=1)
        r = _sig(_fc(h, _p("gru/reset_gate_t_w"), _p("gru/reset_gate_t_b")) + xr)
        u = _sig(_fc(h, _p("gru/update_gate_t_w"), _p("gru/update_gate_t_b")) + xu)
        wo, bo = _p("gru/output_gate_t_w"), _p("gru/output_gate_t_b")
        o = np.tanh((r * _fc(h, wo, bo) if linear_before_reset else _fc(r * h, wo, bo)) + xo)
        h = _masked(t, lengths, u * h + (1 - u) * o, h, False)
        hs.append(h)
    np.testing.assert_allclose(workspace.FetchBlob(out[0]), np.stack(hs), rtol=1e-5, atol=1e-6)


def test_basic_rnn_matches_numpy(fresh):
    steps, n, d_in, d = 3, 2, 3, 2
    x, lengths = _model_inputs(steps, n, d_in, seed=4)
    h0, _ = _states(n, d, seed=5)
    model = ModelHelper(name="rnn")
    # forward_only, as in Caffe2's test: with seq_lengths the cell's masks
    # (Cast of a comparison) have no gradient, in Caffe2 as here.
    out = rnn_cell.BasicRNN(model, "x", "lengths", ("h0",), d_in, d, scope="rnn",
                            activation="tanh", forward_only=True)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    proj = _fc(x.astype(np.float64), _p("rnn/i2h_w"), _p("rnn/i2h_b"))
    h = h0[0].astype(np.float64)
    hs = []
    for t in range(steps):
        new = np.tanh(_fc(h, _p("rnn/gates_t_w"), _p("rnn/gates_t_b")) + proj[t])
        h = _masked(t, lengths, new, h, False)
        hs.append(h)
    np.testing.assert_allclose(workspace.FetchBlob(out[0]), np.stack(hs), rtol=1e-5, atol=1e-6)


def test_names_and_cuda_only_functions():
    assert rnn_cell.GetLSTMParamNames()["weights"][0] == "input_gate_w"
    with pytest.raises(NotImplementedError, match="needs CUDA"):
        rnn_cell.cudnn_LSTM(None, "x", None, 1, 1, "s")
    # The attention cells are provided (tests/train/test_attention_cells.py).
    assert issubclass(rnn_cell.LSTMWithAttentionCell, rnn_cell.AttentionCell)
