"""``rnn_cell.LSTMWithAttention`` (issue 30): an LSTM decoder attending
over an encoder's outputs at every step, in one RecurrentNetwork op. Its
hidden states and contexts against a numpy model of the Regular and Dot
kinds written here (the decoder's gates read the previous context; the new
hidden state scores every encoder position; softmax; weighted sum), and
the decoder input's gradient against central differences."""

import numpy as np
import pytest

from ferrocaffe import model_helper, rnn_cell, workspace
from ferrocaffe.attention import AttentionType

T, N, D, H, L, E = 2, 2, 3, 2, 3, 2


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_model(p, x, h0, c0, ctx0, enc, kind, enc_lengths=None):
    h, c, ctx = h0[0], c0[0], ctx0[0]
    x_proj = x @ p["A/decoder/i2h_w"].T + p["A/decoder/i2h_b"]
    enc_t = enc.transpose(1, 2, 0)  # (N, E, L)
    hs, ctxs = [], []
    for t in range(x.shape[0]):
        g = (np.concatenate([h, ctx], axis=1) @ p["A/decoder/gates_t_w"].T
             + p["A/decoder/gates_t_b"] + x_proj[t]).reshape(N, 4, H)
        i, f, o = _sig(g[:, 0]), _sig(g[:, 1]), _sig(g[:, 2])
        c = f * c + i * np.tanh(g[:, 3])
        h = o * np.tanh(c)
        if kind == AttentionType.Regular:
            weighted_enc = enc @ p["A/weighted_encoder_outputs_w"].T + p["A/weighted_encoder_outputs_b"]
            wd = h @ p["A/weighted_decoder_hidden_state_w"].T + p["A/weighted_decoder_hidden_state_b"]
            s = np.tanh(weighted_enc + wd[None])  # (L, N, E)
            logits = (s @ p["A/attention_logits_w"].T + p["A/attention_logits_b"])[..., 0].T  # (N, L)
        else:  # Dot, with equal sizes: the hidden state itself
            logits = np.einsum("nel,ne->nl", enc_t, h)
        if enc_lengths is not None:  # positions past each length: weight 0
            logits = np.where(np.arange(logits.shape[1])[None] < enc_lengths[:, None], logits, -np.inf)
        w = np.exp(logits - logits.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        ctx = np.einsum("nel,nl->ne", enc_t, w)
        hs.append(h)
        ctxs.append(ctx)
    return np.stack(hs), np.stack(ctxs)


def build(kind, e_dim=E, enc_lengths=None):
    m = model_helper.ModelHelper(name="att")
    dec, lengths, h0, c0, ctx0, enc = m.net.AddExternalInputs("dec", "lengths", "h0", "c0", "ctx0", "enc")
    enc_len = m.net.AddExternalInput("enc_lengths") if enc_lengths is not None else None
    out = rnn_cell.LSTMWithAttention(m, dec, lengths, h0, c0, ctx0, e_dim, enc, enc_len, D, H, "A",
                                     attention_type=kind, outputs_with_grads=(0, 4))
    rng = np.random.default_rng(5)
    feeds = dict(dec=rng.uniform(-1, 1, (T, N, D)), h0=rng.uniform(-1, 1, (1, N, H)),
                 c0=rng.uniform(-1, 1, (1, N, H)), ctx0=rng.uniform(-1, 1, (1, N, e_dim)),
                 enc=rng.uniform(-1, 1, (L, N, e_dim)))
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    feeds["lengths"] = np.full(N, T, np.int32)
    if enc_lengths is not None:
        feeds["enc_lengths"] = np.asarray(enc_lengths, np.int32)
    return m, out, feeds


@pytest.mark.parametrize("kind,e_dim,enc_lengths", [
    (AttentionType.Regular, E, None), (AttentionType.Dot, H, None),
    (AttentionType.Regular, E, [L, 1]), (AttentionType.Dot, H, [2, L])])
def test_states_and_contexts_match_a_numpy_model(fresh, kind, e_dim, enc_lengths):
    m, out, feeds = build(kind, e_dim, enc_lengths)
    workspace.RunNetOnce(m.param_init_net)
    rng = np.random.default_rng(6)
    for name in m.GetParams():  # other values than the initial zeros and Xavier
        v = workspace.FetchBlob(str(name))
        workspace.FeedBlob(str(name), rng.uniform(-0.8, 0.8, v.shape).astype(np.float32))
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    workspace.RunNetOnce(m.net)
    p = {str(n): workspace.FetchBlob(str(n)).astype(np.float64) for n in m.GetParams()}
    if kind == AttentionType.Regular:
        # A computed parameter (freeze_bias), not trained: zeros.
        assert "A/attention_logits_b" not in p
        p["A/attention_logits_b"] = workspace.FetchBlob("A/attention_logits_b").astype(np.float64)
    f64 = {k: v.astype(np.float64) for k, v in feeds.items()}
    want_h, want_ctx = numpy_model(p, f64["dec"], f64["h0"], f64["c0"], f64["ctx0"], f64["enc"], kind,
                                   None if enc_lengths is None else np.asarray(enc_lengths))
    np.testing.assert_allclose(workspace.FetchBlob(out[0]), want_h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob(out[4]), want_ctx, rtol=1e-4, atol=1e-5)


def test_decoder_input_gradient_matches_differences(fresh):
    m, out, feeds = build(AttentionType.Regular)
    l0 = m.net.SumElements(out[0], "l0")
    l1 = m.net.SumElements(out[4], "l1")
    loss = m.net.Add([l0, l1], "loss")
    m.AddGradientOperators([loss])
    workspace.RunNetOnce(m.param_init_net)
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    workspace.CreateNet(m.net)
    workspace.RunNet(m.net)
    grad = workspace.FetchBlob("dec_grad").astype(np.float64)
    enc_grad = workspace.FetchBlob("enc_grad").astype(np.float64)
    x = feeds["dec"].astype(np.float64)
    enc = feeds["enc"].astype(np.float64)

    def f(name, v):
        workspace.FeedBlob(name, v.astype(np.float32))
        workspace.RunNet(m.net)
        workspace.FeedBlob(name, feeds[name])
        return float(workspace.FetchBlob("loss"))

    eps = 1e-2
    for idx in [(0, 0, 0), (1, 1, 2), (1, 0, 1)]:
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        assert grad[idx] == pytest.approx((f("dec", up) - f("dec", down)) / (2 * eps), abs=3e-3), idx
    for idx in [(0, 0, 0), (2, 1, 1)]:
        up, down = enc.copy(), enc.copy()
        up[idx] += eps
        down[idx] -= eps
        assert enc_grad[idx] == pytest.approx((f("enc", up) - f("enc", down)) / (2 * eps), abs=3e-3), idx
