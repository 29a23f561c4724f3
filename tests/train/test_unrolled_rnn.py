"""Static unrolling (``rnn_cell.LSTM(..., static_rnn_unroll_size=T)``,
``rnn_cell.UnrolledCell``) and the ``ParameterSharing`` it rests on.

The unrolled LSTM's output sequence and last states equal a numpy LSTM
written here (one-hot free: the input projection, the recurrent gates, the
cell), with one set of parameters for every step; its input gradient,
by central differences of the forward net's loss. ParameterSharing's names
follow a plain model of the rule written here."""

import numpy as np
import pytest

from ferrocaffe import core, model_helper, rnn_cell, scope, workspace
from ferrocaffe.modeling.parameter_sharing import ParameterSharing, parameter_sharing_context


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_lstm(x, h0, c0, p, lengths, forget_bias):
    steps, n = x.shape[:2]
    d = h0.shape[2]
    h, c = h0[0], c0[0]
    hs, cs = [], []
    for t in range(steps):
        g = x[t] @ p["i2h_w"].T + p["i2h_b"] + h @ p["gates_t_w"].T + p["gates_t_b"]
        g = g.reshape(n, 4, d)
        i, f, o = _sig(g[:, 0]), _sig(g[:, 1] + forget_bias), _sig(g[:, 2])
        c_new = f * c + i * np.tanh(g[:, 3])
        h_new = o * np.tanh(c_new)
        live = (t < np.asarray(lengths))[:, None]
        h, c = np.where(live, h_new, h), np.where(live, c_new, c)
        hs.append(h)
        cs.append(c)
    return np.stack(hs), np.stack(cs)


def build(steps, d_in, d, forget_bias, unroll):
    model = model_helper.ModelHelper(name="unrolled" if unroll else "dynamic")
    x, lengths, h0, c0 = model.net.AddExternalInputs("x", "lengths", "h0", "c0")
    with scope.NameScope("outer"):
        outs = rnn_cell.LSTM(model, x, lengths, (h0, c0), d_in, d, scope="lstm",
                             forget_bias=forget_bias, outputs_with_grads=(0,),
                             static_rnn_unroll_size=steps if unroll else None)
    return model, outs


@pytest.mark.parametrize("steps,lengths,forget_bias", [(1, [1, 1], 0.0), (4, [4, 2, 1], 1.0)])
def test_the_unrolled_lstm_is_the_numpy_lstm_with_one_set_of_parameters(fresh, steps, lengths,
                                                                        forget_bias):
    d_in, d = 3, 2
    model, (h_all, h_last, c_all, c_last) = build(steps, d_in, d, forget_bias, unroll=True)
    params = sorted(str(p) for p in model.GetParams())
    # One set of parameters, named as the RecurrentNetwork LSTM names them.
    assert params == sorted(str(p) for p in build(steps, d_in, d, forget_bias, False)[0].GetParams())
    assert params == ["outer/lstm/gates_t_b", "outer/lstm/gates_t_w", "outer/lstm/i2h_b",
                      "outer/lstm/i2h_w"]
    # No RecurrentNetwork op: the steps are ops of the net itself.
    types = [op.type for op in model.net.Proto().op]
    assert "RecurrentNetwork" not in types and types.count("LSTMUnit") == steps
    rng = np.random.default_rng(0)
    n = len(lengths)
    x = rng.uniform(-1, 1, (steps, n, d_in)).astype(np.float32)
    h0 = rng.uniform(-1, 1, (1, n, d)).astype(np.float32)
    c0 = rng.uniform(-1, 1, (1, n, d)).astype(np.float32)
    workspace.RunNetOnce(model.param_init_net)
    for k, v in dict(x=x, h0=h0, c0=c0, lengths=np.array(lengths, np.int32)).items():
        workspace.FeedBlob(k, v)
    workspace.RunNetOnce(model.net)
    p = {name.split("/")[-1]: workspace.FetchBlob(name).astype(np.float64) for name in params}
    want_h, want_c = numpy_lstm(x.astype(np.float64), h0, c0, p, lengths, forget_bias)
    np.testing.assert_allclose(workspace.FetchBlob(h_all), want_h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob(c_all), want_c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob(h_last), want_h[-1:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob(c_last), want_c[-1:], rtol=1e-5, atol=1e-6)


def test_the_unrolled_lstms_input_gradient_matches_differences(fresh):
    steps, d_in, d, lengths = 3, 2, 2, [3, 2]
    model, (h_all, _, _, _) = build(steps, d_in, d, 0.5, unroll=True)
    loss = model.net.SumElements(h_all, "loss")
    model.AddGradientOperators([loss])
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (steps, len(lengths), d_in))
    workspace.RunNetOnce(model.param_init_net)
    for name in ("h0", "c0"):
        workspace.FeedBlob(name, rng.uniform(-1, 1, (1, len(lengths), d)).astype(np.float32))
    workspace.FeedBlob("lengths", np.array(lengths, np.int32))
    workspace.FeedBlob("x", x.astype(np.float32))
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net)
    grad = workspace.FetchBlob("x_grad").astype(np.float64)

    def f(v):
        workspace.FeedBlob("x", v.astype(np.float32))
        workspace.RunNet(model.net)
        return float(workspace.FetchBlob("loss"))

    eps = 1e-2
    for idx in [(0, 0, 0), (1, 1, 1), (2, 0, 1), (2, 1, 0)]:
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        assert grad[idx] == pytest.approx((f(up) - f(down)) / (2 * eps), abs=2e-3), idx


def _resolve(overrides, current, name):
    """The sharing rule, modelled: the longest prefix (whole scopes) of the
    current scope that is mapped is replaced by its target, resolved again."""
    parts = [p for p in current.split("/") if p]
    for k in range(len(parts), 0, -1):
        prefix = "/".join(parts[:k]) + "/"
        if prefix in overrides:
            rest = "/".join(parts[k:])
            target = overrides[prefix]
            return _resolve(overrides, target, (rest + "/" if rest else "") + name)
    return current + name


def test_parameter_sharing_maps_scopes_relative_to_where_it_starts(fresh):
    cases = [  # (outer scope, mapping, scope inside the block)
        ([], {"b": "a"}, ["b"]),
        ([], {"b": "a"}, ["b", "c"]),
        ([], {"b": "a"}, ["c"]),
        (["g"], {"b": ""}, ["b", "x"]),
        (["g", "h"], {"b": "a/z"}, ["b"]),
    ]
    for outer, mapping, inner in cases:
        with scope.NameScope("/".join(outer) or None):
            with ParameterSharing(mapping):
                start = scope.CurrentNameScope()
                overrides = {start + k + "/": (start + v + "/" if v else start)
                             for k, v in mapping.items()}
                with scope.NameScope("/".join(inner)):
                    got = parameter_sharing_context.get_parameter_name("w")
                    assert got == _resolve(overrides, scope.CurrentNameScope(), "w"), (outer, mapping, inner)
    with ParameterSharing({"b": "a"}), scope.NameScope("b"):
        assert parameter_sharing_context.get_parameter_name("w") == "a/w"
        # Inside b, its child "shared" maps to b itself, i.e. to a.
        with ParameterSharing({"shared": ""}):
            with scope.NameScope("shared"):
                assert parameter_sharing_context.get_parameter_name("w") == "a/w"
            with scope.NameScope("own"):
                assert parameter_sharing_context.get_parameter_name("w") == "a/own/w"
    assert parameter_sharing_context.get_parameter_name("w") == "w"
    with pytest.raises(AssertionError, match="prefix"):
        with ParameterSharing({"a": "a/b"}):
            pass
    with pytest.raises(TypeError):
        with ParameterSharing([("a", "b")]):
            pass
