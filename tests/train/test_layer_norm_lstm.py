"""``rnn_cell.LayerNormLSTM`` / ``LayerNormLSTMCell`` (issue 30): an LSTM
whose gates go through a LayerNorm over the gate axis (learned scale and
bias) before the cell. Outputs against a numpy model written here, the
input gradient against central differences; ``LayerNormMILSTM`` builds and
runs with its own parameters."""

import numpy as np
import pytest

from ferrocaffe import model_helper, rnn_cell, workspace


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_ln_lstm(x, h0, c0, p, eps=1e-4):
    steps, n = x.shape[:2]
    d = h0.shape[2]
    h, c = h0[0], c0[0]
    hs = []
    for t in range(steps):
        g = x[t] @ p["i2h_w"].T + p["i2h_b"] + h @ p["gates_t_w"].T + p["gates_t_b"]
        mean = g.mean(axis=-1, keepdims=True)
        std = np.sqrt(((g - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
        g = (g - mean) / std * p["gates_t_norm_scale"] + p["gates_t_norm_bias"]
        g = g.reshape(n, 4, d)
        i, f, o = _sig(g[:, 0]), _sig(g[:, 1]), _sig(g[:, 2])
        c = f * c + i * np.tanh(g[:, 3])
        h = o * np.tanh(c)
        hs.append(h)
    return np.stack(hs)


def build(steps, n, d_in, d, cell=rnn_cell.LayerNormLSTM):
    model = model_helper.ModelHelper(name="ln_lstm")
    x, lengths, h0, c0 = model.net.AddExternalInputs("x", "lengths", "h0", "c0")
    outs = cell(model, x, lengths, (h0, c0), d_in, d, scope="ln")
    rng = np.random.default_rng(3)
    feeds = dict(x=rng.uniform(-1, 1, (steps, n, d_in)).astype(np.float32),
                 h0=rng.uniform(-1, 1, (1, n, d)).astype(np.float32),
                 c0=rng.uniform(-1, 1, (1, n, d)).astype(np.float32),
                 lengths=np.full(n, steps, np.int32))
    return model, outs, feeds


def test_outputs_match_a_numpy_layer_norm_lstm(fresh):
    steps, n, d_in, d = 3, 2, 3, 2
    model, (h_all, *_), feeds = build(steps, n, d_in, d)
    params = sorted(str(p) for p in model.GetParams())
    assert "ln/gates_t_norm_scale" in params and "ln/gates_t_norm_bias" in params
    workspace.RunNetOnce(model.param_init_net)
    rng = np.random.default_rng(4)
    # A scale and bias other than their initial 1 and 0.
    workspace.FeedBlob("ln/gates_t_norm_scale", rng.uniform(0.5, 1.5, 4 * d).astype(np.float32))
    workspace.FeedBlob("ln/gates_t_norm_bias", rng.uniform(-0.5, 0.5, 4 * d).astype(np.float32))
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    workspace.RunNetOnce(model.net)
    p = {name.split("/")[-1]: workspace.FetchBlob(name).astype(np.float64) for name in params}
    want = numpy_ln_lstm(feeds["x"].astype(np.float64), feeds["h0"], feeds["c0"], p)
    np.testing.assert_allclose(workspace.FetchBlob(h_all), want, rtol=1e-4, atol=1e-5)


def test_input_gradient_matches_differences(fresh):
    steps, n, d_in, d = 2, 2, 2, 2
    model, (h_all, *_), feeds = build(steps, n, d_in, d)
    loss = model.net.SumElements(h_all, "loss")
    model.AddGradientOperators([loss])
    workspace.RunNetOnce(model.param_init_net)
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net)
    grad = workspace.FetchBlob("x_grad").astype(np.float64)
    x = feeds["x"].astype(np.float64)

    def f(v):
        workspace.FeedBlob("x", v.astype(np.float32))
        workspace.RunNet(model.net)
        return float(workspace.FetchBlob("loss"))

    eps = 1e-2
    for idx in [(0, 0, 0), (1, 1, 1), (0, 1, 0)]:
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        assert grad[idx] == pytest.approx((f(up) - f(down)) / (2 * eps), abs=3e-3), idx


def test_the_layer_norm_milstm_runs_with_its_parameters(fresh):
    model, (h_all, *_), feeds = build(2, 2, 3, 2, cell=rnn_cell.LayerNormMILSTM)
    params = {str(p) for p in model.GetParams()}
    assert {"ln/alpha", "ln/beta1", "ln/beta2", "ln/b", "ln/gates_t_norm_scale",
            "ln/gates_t_norm_bias"} <= params
    workspace.RunNetOnce(model.param_init_net)
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    workspace.RunNetOnce(model.net)
    out = workspace.FetchBlob(h_all)
    assert out.shape == (2, 2, 2) and np.all(np.abs(out) < 1)
