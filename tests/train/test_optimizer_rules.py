"""RmsProp, Adadelta and LARS (ops and optimizers), against plain numpy
models of Caffe2's update rules written here."""

import numpy as np
import pytest
from ferrocaffe import brew, core, errors, model_helper, optimizer, workspace


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        v = np.asarray(v)
        workspace.FeedBlob(name, v if v.dtype.kind == "i" else v.astype(np.float32))
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


def rmsprop_ref(g, ms, mom, lr, decay, momentum, eps):
    ms = ms + (1 - decay) * (g * g - ms)
    mom = momentum * mom + lr * g / np.sqrt(eps + ms)
    return mom, ms, mom


def adadelta_ref(w, h, d, g, lr, eps, decay):
    h = decay * h + (1 - decay) * g * g
    step = np.sqrt(d + eps) / np.sqrt(h + eps) * g
    return w + lr * step, h, decay * d + (1 - decay) * step * step


@pytest.mark.parametrize("in_place", [False, True])
def test_rmsprop_op_matches_the_rule(fresh, in_place):
    rng = np.random.default_rng(0)
    g, ms, mom = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3))
    ms = np.abs(ms)
    outs = ["g", "ms", "mom"] if in_place else ["g_o", "ms_o", "mom_o"]
    got = run("RmsProp", {"g": g, "ms": ms, "mom": mom, "lr": [0.5]}, outs, decay=0.8, momentum=0.3, epsilon=1e-3)
    for a, b in zip(got, rmsprop_ref(g, ms, mom, 0.5, 0.8, 0.3, 1e-3)):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    # Defaults: decay 0.9, momentum 0, epsilon 1e-5.
    g1 = np.array([2.0], np.float32)
    (g_o,) = run("RmsProp", {"g1": g1, "z1": [0.0], "z2": [5.0], "one": [1.0]}, ["s", "z1", "z2"])[:1]
    np.testing.assert_allclose(g_o, [2.0 / np.sqrt(1e-5 + 0.1 * 4.0)], rtol=1e-5)


@pytest.mark.parametrize("in_place", [False, True])
def test_adadelta_op_matches_the_rule(fresh, in_place):
    rng = np.random.default_rng(1)
    w, g = (rng.standard_normal(6).astype(np.float32) for _ in range(2))
    h, d = (np.abs(rng.standard_normal(6)).astype(np.float32) for _ in range(2))
    outs = ["w", "h", "d"] if in_place else ["w_o", "h_o", "d_o"]
    got = run("Adadelta", {"w": w, "h": h, "d": d, "g": g, "lr": [-0.25]}, outs, epsilon=1e-4, decay=0.9)
    for a, b in zip(got, adadelta_ref(w, h, d, g, -0.25, 1e-4, 0.9)):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_sparse_adadelta_updates_the_rows_at_the_indices_in_turn(fresh):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    h = np.abs(rng.standard_normal((4, 2))).astype(np.float32)
    d = np.abs(rng.standard_normal((4, 2))).astype(np.float32)
    idx = np.array([2, 0, 2], np.int64)
    g = rng.standard_normal((3, 2)).astype(np.float32)
    got = run("SparseAdadelta", {"w": w, "h": h, "d": d, "idx": idx, "g": g, "lr": [-0.5]}, ["w", "h", "d"],
              epsilon=1e-3, decay=0.8)
    ew, eh, ed = w.copy(), h.copy(), d.copy()
    for i, r in enumerate(idx):  # a duplicate index is applied twice
        ew[r], eh[r], ed[r] = adadelta_ref(ew[r], eh[r], ed[r], g[i], -0.5, 1e-3, 0.8)
    for a, b in zip(got, (ew, eh, ed)):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    np.testing.assert_array_equal(got[0][[1, 3]], w[[1, 3]])


def test_bad_arguments_and_shapes_are_typed_errors(fresh):
    ins = {"w": np.ones(3), "h": np.ones(3), "d": np.ones(3), "g": np.ones(3), "lr": [0.1]}
    with pytest.raises(errors.InvalidArgumentError, match="decay must be in"):
        run("Adadelta", ins, ["w", "h", "d"], decay=1.0)
    with pytest.raises(errors.ShapeError, match="'g'"):
        run("Adadelta", dict(ins, g=np.ones(4)), ["w", "h", "d"])
    with pytest.raises(errors.ShapeError, match="learning rate"):
        run("RmsProp", {"g": np.ones(3), "ms": np.ones(3), "mom": np.ones(3), "lr": [0.1, 0.2]},
            ["g", "ms", "mom"])
    with pytest.raises(errors.InvalidArgumentError):
        core.GradientRegistry.GetGradientForOp(
            core.CreateOperator("RmsProp", ["g", "ms", "mom", "lr"], ["g", "ms", "mom"]), ["g_grad", None, None])


def _linear(build, **kwargs):
    model = model_helper.ModelHelper(name="lin")
    y = brew.fc(model, "x", "y", dim_in=3, dim_out=1, weight_init=("ConstantFill", {"value": 0.5}))
    dist = model.net.SquaredL2Distance([y, "t"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    model.AddGradientOperators([loss])
    opt = build(model, **kwargs)
    x = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, -1.0]], np.float32)
    t = np.array([[1.0], [2.0]], np.float32)
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("t", t)
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    return model, opt, x, t


def _grads(w, b, x, t):
    """dL/dw, dL/db of L = mean(0.5 * (x w^T + b - t)^2)."""
    r = (x @ w.T + b - t) / len(x)
    return r.T @ x, r.sum(axis=0)


def test_build_rms_prop_takes_rmsprop_steps_with_momentum(fresh):
    model, opt, x, t = _linear(optimizer.build_rms_prop, base_learning_rate=0.1, decay=0.5, momentum=0.5,
                               epsilon=0.01)
    w, b = np.full((1, 3), 0.5), np.zeros(1)
    state = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in (("w", w), ("b", b))}
    for _ in range(4):
        workspace.RunNet(model.net.Proto().name)
        gw, gb = _grads(w, b, x, t)
        for name, g in (("w", gw), ("b", gb)):
            step, ms, mom = rmsprop_ref(g, *state[name], 1.0, 0.5, 0.5, 0.01)
            state[name] = (ms, mom)
            if name == "w":
                w = w - 0.1 * step
            else:
                b = b - 0.1 * step
    np.testing.assert_allclose(workspace.FetchBlob("y_w"), w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("y_b"), b, rtol=1e-4, atol=1e-6)
    # The moments are the optimizer's local auxiliary blobs; nothing shared.
    assert not opt.get_auxiliary_parameters().shared
    assert {str(p) for p in opt.get_auxiliary_parameters().local} == {
        "y_w_mean_squares", "y_w_momentum", "y_b_mean_squares", "y_b_momentum"}
    np.testing.assert_allclose(workspace.FetchBlob("y_w_momentum"), state["w"][1], rtol=1e-4)


def test_build_adadelta_takes_adadelta_steps(fresh):
    model, opt, x, t = _linear(optimizer.build_adadelta, base_learning_rate=2.0, decay=0.9, epsilon=1e-3)
    w, b = np.full((1, 3), 0.5), np.zeros(1)
    state = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in (("w", w), ("b", b))}
    for _ in range(4):
        workspace.RunNet(model.net.Proto().name)
        gw, gb = _grads(w, b, x, t)
        w, *state["w"] = adadelta_ref(w, *state["w"], gw, -2.0, 1e-3, 0.9)
        b, *state["b"] = adadelta_ref(b, *state["b"], gb, -2.0, 1e-3, 0.9)
    np.testing.assert_allclose(workspace.FetchBlob("y_w"), w, rtol=1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("y_b"), b, rtol=1e-4, atol=1e-6)
    assert {str(p) for p in opt.get_auxiliary_parameters().local} == {
        "y_w_squared_moment", "y_w_squared_moment_update", "y_b_squared_moment", "y_b_squared_moment_update"}


def _sparse_table_model():
    """A 4 x 2 table of ones read by Gather at the blob "idx", averaged into
    the loss: its gradient is a GradientSlice."""
    model = model_helper.ModelHelper(name="emb")
    table = model.param_init_net.ConstantFill([], "table", shape=[4, 2], value=1.0)
    model.params.append(table)
    rows = model.net.Gather([table, "idx"], "rows")
    loss = model.net.AveragedLoss(rows, "loss")
    model.AddGradientOperators([loss])
    return model


def test_rms_prop_refuses_sparse_gradients(fresh):
    model = _sparse_table_model()
    with pytest.raises(AssertionError, match="sparse"):
        optimizer.build_rms_prop(model, base_learning_rate=0.1)


def test_lars_factor_by_hand(fresh):
    ins = {"x": [3.0, 4.0], "dx": [0.0, 1.0], "wd": [0.1], "trust": [2.0], "lr_max": [10.0]}
    # |x| = 5, |dx| = 1: 2 / (1/5 + 0.1 + 0.5) = 2.5.
    (f,) = run("Lars", ins, ["f"], offset=0.5, lr_min=0.0)
    np.testing.assert_allclose(f, [2.5], rtol=1e-6)
    (f,) = run("Lars", dict(ins, lr_max=[1.0]), ["f"], offset=0.5, lr_min=0.0)
    np.testing.assert_allclose(f, [1.0])
    (f,) = run("Lars", ins, ["f"], offset=0.5, lr_min=3.0)
    np.testing.assert_allclose(f, [3.0])
    # A zero parameter: the factor is 1 (then clipped); defaults offset 0.5, lr_min 0.02.
    (f,) = run("Lars", dict(ins, x=[0.0, 0.0]), ["f"])
    np.testing.assert_allclose(f, [1.0])
    with pytest.raises(errors.ShapeError, match="as many elements"):
        run("Lars", dict(ins, dx=[1.0, 2.0, 3.0]), ["f"])
    with pytest.raises(errors.InvalidArgumentError, match="offset"):
        run("Lars", ins, ["f"], offset=-1.0)


@pytest.mark.parametrize("build", ["build_sgd", "build_adagrad"])
def test_lars_scales_each_layers_rate(fresh, build):
    # One step from w = 0.5 (b = 0): w's rate is lr / (|dw| / |w| + 0.5);
    # b's norm is 0, so its factor is 1.
    model, _, x, t = _linear(getattr(optimizer, build), base_learning_rate=0.1, lars=0.5)
    workspace.RunNet(model.net.Proto().name)
    w, b = np.full((1, 3), 0.5), np.zeros(1)
    gw, gb = _grads(w, b, x, t)
    fw = 1.0 / (np.linalg.norm(gw) / np.linalg.norm(w) + 0.5)
    if build == "build_sgd":
        want_w, want_b = w - 0.1 * fw * gw, b - 0.1 * gb
    else:  # Adagrad's first step: g / (sqrt(g^2) + eps)
        want_w = w - 0.1 * fw * gw / (np.abs(gw) + 1e-4)
        want_b = b - 0.1 * gb / (np.abs(gb) + 1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("y_w"), want_w, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("y_b"), want_b, rtol=1e-5, atol=1e-7)


# ------------------------------------------------ Wngrad, Storm, DecayAdagrad --

def wngrad_ref(w, b, g, lr, eps):
    rate = lr / (b + eps)
    return w + rate * g, b + np.sum(g.astype(np.float64) ** 2) / (b + eps), rate


def storm_ref(w, m, s, g, lr, momentum, beta):
    s = s + np.sum(g.astype(np.float64) ** 2)
    nlr = lr * (beta + s) ** (-1.0 / 3.0)
    a = momentum * nlr * nlr
    m = g + (1 - a) * (m - g)
    return w + nlr * m, m, s


def decay_adagrad_ref(w, m1, m2, g, lr, t, beta1, eps, wd, correct=True):
    m1 = beta1 * m1 + (1 - beta1) * g
    m2 = m2 + g * g
    c = 1 - beta1 ** t if correct else 1.0
    return w + lr * (m1 / c / (np.sqrt(m2) + eps) + wd * w), m1, m2


@pytest.mark.parametrize("in_place", [False, True])
def test_wngrad_op_matches_the_rule(fresh, in_place):
    rng = np.random.default_rng(3)
    w, g = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    outs = ["w", "b", "elr", "upd"] if in_place else ["w_o", "b_o", "elr", "upd"]
    got = run("Wngrad", {"w": w, "b": [2.5], "g": g, "lr": [-0.5]}, outs, epsilon=0.1)
    ew, eb, rate = wngrad_ref(w, 2.5, g, -0.5, 0.1)
    np.testing.assert_allclose(got[0], ew, rtol=1e-5)
    np.testing.assert_allclose(got[1], [eb], rtol=1e-5)
    np.testing.assert_allclose(got[2], [rate], rtol=1e-6)
    np.testing.assert_allclose(got[3], rate * g, rtol=1e-5)
    # Default epsilon 1e-5; two outputs.
    w_o, b_o = run("Wngrad", {"w": [1.0, 2.0], "b": [1.0], "g": [3.0, 4.0], "lr": [1.0]}, ["w2", "b2"])
    np.testing.assert_allclose(w_o, [1 + 3 / (1 + 1e-5), 2 + 4 / (1 + 1e-5)], rtol=1e-6)
    np.testing.assert_allclose(b_o, [1 + 25 / (1 + 1e-5)], rtol=1e-6)


def test_sparse_wngrad_updates_rows_and_the_accumulator(fresh):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    idx = np.array([3, 1, 3], np.int32)
    g = rng.standard_normal((3, 2)).astype(np.float32)
    got = run("SparseWngrad", {"w": w, "b": [4.0], "idx": idx, "g": g, "lr": [-1.0]}, ["w", "b"], epsilon=0.5)
    ew = w.copy()
    for i, r in enumerate(idx):  # the old accumulator for every row; duplicates add twice
        ew[r] += -1.0 / 4.5 * g[i]
    np.testing.assert_allclose(got[0], ew, rtol=1e-5)
    np.testing.assert_allclose(got[1], [4.0 + np.sum(g.astype(np.float64) ** 2) / 4.5], rtol=1e-5)
    np.testing.assert_array_equal(got[0][[0, 2]], w[[0, 2]])


@pytest.mark.parametrize("in_place", [False, True])
def test_storm_op_matches_the_rule(fresh, in_place):
    rng = np.random.default_rng(5)
    w, m, g = (rng.standard_normal(5).astype(np.float32) for _ in range(3))
    outs = ["w", "m", "s"] if in_place else ["w_o", "m_o", "s_o"]
    got = run("Storm", {"w": w, "m": m, "s": [0.3], "g": g, "lr": [-0.2]}, outs, momentum=5.0, beta=0.2)
    for a, b in zip(got, storm_ref(w, m, 0.3, g, -0.2, 5.0, 0.2)):
        np.testing.assert_allclose(a, np.reshape(b, np.shape(a)), rtol=1e-5)
    # Defaults momentum 10, beta 0.1.
    got = run("Storm", {"w1": [1.0], "m1": [0.0], "s1": [0.0], "g1": [0.5], "lr1": [1.0]}, ["a", "b", "c"])
    for a, b in zip(got, storm_ref(np.array([1.0]), np.array([0.0]), 0.0, np.array([0.5]), 1.0, 10.0, 0.1)):
        np.testing.assert_allclose(a, np.reshape(b, np.shape(a)), rtol=1e-5)


def test_sparse_storm_updates_rows_in_turn(fresh):
    rng = np.random.default_rng(6)
    w, m = (rng.standard_normal((4, 3)).astype(np.float32) for _ in range(2))
    idx = np.array([0, 2, 0], np.int64)
    g = rng.standard_normal((3, 3)).astype(np.float32)
    # Inputs (param, moment, grad_sq_sum, grad, indices, lr): grad before indices.
    got = run("SparseStorm", {"w": w, "m": m, "s": [1.0], "g": g, "idx": idx, "lr": [-0.1]}, ["w", "m", "s"],
              momentum=2.0, beta=0.5)
    s = 1.0 + np.sum(g.astype(np.float64) ** 2)
    nlr = -0.1 * (0.5 + s) ** (-1.0 / 3.0)
    a = 2.0 * nlr * nlr
    ew, em = w.copy(), m.copy()
    for i, r in enumerate(idx):
        em[r] = g[i] + (1 - a) * (em[r] - g[i])
        ew[r] += nlr * em[r]
    np.testing.assert_allclose(got[0], ew, rtol=1e-5)
    np.testing.assert_allclose(got[1], em, rtol=1e-5)
    np.testing.assert_allclose(got[2], [s], rtol=1e-6)
    np.testing.assert_array_equal(got[0][[1, 3]], w[[1, 3]])


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("correct", [True, False])
def test_decay_adagrad_op_matches_the_rule(fresh, in_place, correct):
    rng = np.random.default_rng(7)
    w, m1, g = (rng.standard_normal(6).astype(np.float32) for _ in range(3))
    m2 = np.abs(rng.standard_normal(6)).astype(np.float32)
    outs = ["w", "m1", "m2"] if in_place else ["w_o", "m1_o", "m2_o"]
    got = run("DecayAdagrad", {"w": w, "m1": m1, "m2": m2, "g": g, "lr": [-0.3], "it": np.array([2], np.int64)},
              outs, beta1=0.5, epsilon=0.01, weight_decay=0.1, bias_correction_first=correct)
    for a, b in zip(got, decay_adagrad_ref(w, m1, m2, g, -0.3, 3, 0.5, 0.01, 0.1, correct)):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    # Defaults beta1 0.9, epsilon 1e-5, weight decay 0, corrected; beta2 is unused.
    for beta2 in (0.999, 0.5):
        got = run("DecayAdagrad", {"w": w, "m1": m1, "m2": m2, "g": g, "lr": [-0.3],
                                   "it": np.array([0], np.int64)}, ["a", "b", "c"], beta2=beta2)
        np.testing.assert_allclose(got[0], decay_adagrad_ref(w, m1, m2, g, -0.3, 1, 0.9, 1e-5, 0.0)[0], rtol=1e-5)


def test_new_rules_typed_errors(fresh):
    with pytest.raises(errors.ShapeError, match="seq_b"):
        run("Wngrad", {"w": np.ones(3), "b": [1.0, 2.0], "g": np.ones(3), "lr": [0.1]}, ["w", "b"])
    with pytest.raises(errors.ShapeError, match="'g'"):
        run("Wngrad", {"w": np.ones(3), "b": [1.0], "g": np.ones(4), "lr": [0.1]}, ["w", "b"])
    with pytest.raises(errors.ShapeError, match="one row"):
        run("SparseWngrad", {"w": np.ones((3, 2)), "b": [1.0], "i": np.array([0, 1]), "g": np.ones((3, 2)),
                             "lr": [0.1]}, ["w", "b"])
    with pytest.raises(errors.InvalidArgumentError):
        run("SparseWngrad", {"w": np.ones((3, 2)), "b": [1.0], "i": np.array([0]), "g": np.ones((1, 2)),
                             "lr": [0.1]}, ["w2", "b"])
    with pytest.raises(errors.ShapeError, match="grad_sq_sum"):
        run("Storm", {"w": np.ones(3), "m": np.ones(3), "s": np.ones(2), "g": np.ones(3), "lr": [0.1]},
            ["w", "m", "s"])
    with pytest.raises(errors.ShapeError, match="'m'"):
        run("Storm", {"w": np.ones(3), "m": np.ones(2), "s": [1.0], "g": np.ones(3), "lr": [0.1]},
            ["w", "m", "s"])
    with pytest.raises(errors.InvalidArgumentError, match="out of range"):
        run("SparseStorm", {"w": np.ones((2, 2)), "m": np.ones((2, 2)), "s": [1.0], "g": np.ones((1, 2)),
                            "i": np.array([5]), "lr": [0.1]}, ["w", "m", "s"])
    ins = {"w": np.ones(3), "m1": np.ones(3), "m2": np.ones(3), "g": np.ones(3), "lr": [0.1],
           "it": np.array([1], np.int32)}
    with pytest.raises(errors.DataTypeError, match="iteration"):
        run("DecayAdagrad", ins, ["w", "m1", "m2"])
    with pytest.raises(errors.DataTypeError, match="moment_2"):
        run("DecayAdagrad", dict(ins, m2=np.ones(3, np.int64), it=np.array([1], np.int64)), ["w", "m1", "m2"])


def test_build_wngrad_takes_wngrad_steps(fresh):
    model, opt, x, t = _linear(optimizer.build_wngrad, base_learning_rate=0.5, moment_init=2.0, epsilon=1e-3,
                               output_effective_lr_and_update=True)
    w, b = np.full((1, 3), 0.5), np.zeros(1)
    acc = {"w": 2.0, "b": 2.0}
    for _ in range(4):
        workspace.RunNet(model.net.Proto().name)
        gw, gb = _grads(w, b, x, t)
        w, acc["w"], rate_w = wngrad_ref(w, acc["w"], gw, -0.5, 1e-3)
        b, acc["b"], _ = wngrad_ref(b, acc["b"], gb, -0.5, 1e-3)
    np.testing.assert_allclose(workspace.FetchBlob("y_w"), w, rtol=1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("y_b"), b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("y_w_moment"), [acc["w"]], rtol=1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("y_w_effective_lr"), [rate_w], rtol=1e-4)
    assert workspace.FetchBlob("y_w_update").shape == (1, 3)
    assert {str(p) for p in opt.get_auxiliary_parameters().local} == {"y_w_moment", "y_b_moment"}


def test_build_storm_takes_storm_steps(fresh):
    model, opt, x, t = _linear(optimizer.build_storm, base_learning_rate=0.2, momentum=3.0, beta=0.5,
                               grad_sq_init=0.1)
    w, b = np.full((1, 3), 0.5), np.zeros(1)
    st = {"w": (np.zeros((1, 3)), 0.1), "b": (np.zeros(1), 0.1)}
    for _ in range(4):
        workspace.RunNet(model.net.Proto().name)
        gw, gb = _grads(w, b, x, t)
        w, *st["w"] = storm_ref(w, *st["w"], gw, -0.2, 3.0, 0.5)
        b, *st["b"] = storm_ref(b, *st["b"], gb, -0.2, 3.0, 0.5)
    np.testing.assert_allclose(workspace.FetchBlob("y_w"), w, rtol=1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("y_b"), b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("y_w_grad_sq_sum"), [st["w"][1]], rtol=1e-4)
    assert {str(p) for p in opt.get_auxiliary_parameters().local} == {
        "y_w_moment", "y_w_grad_sq_sum", "y_b_moment", "y_b_grad_sq_sum"}


def test_build_decay_adagrad_takes_steps_with_the_iteration(fresh):
    model, opt, x, t = _linear(optimizer.build_decay_adagrad, base_learning_rate=0.1, beta1=0.5, epsilon=0.01,
                               weight_decay=0.05)
    w, b = np.full((1, 3), 0.5), np.zeros(1)
    st = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in (("w", w), ("b", b))}
    for it in range(1, 5):
        workspace.RunNet(model.net.Proto().name)
        # The iteration blob reads `it` after the net's AtomicIter: t = it + 1.
        assert workspace.FetchBlob("optimizer_iteration")[0] == it
        gw, gb = _grads(w, b, x, t)
        w, *st["w"] = decay_adagrad_ref(w, *st["w"], gw, -0.1, it + 1, 0.5, 0.01, 0.05)
        b, *st["b"] = decay_adagrad_ref(b, *st["b"], gb, -0.1, it + 1, 0.5, 0.01, 0.05)
    np.testing.assert_allclose(workspace.FetchBlob("y_w"), w, rtol=1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("y_b"), b, rtol=1e-4, atol=1e-6)
    aux = opt.get_auxiliary_parameters()
    assert {str(p) for p in aux.local} == {
        "y_w_first_mo1ment", "y_w_second_moment", "y_b_first_mo1ment", "y_b_second_moment"}
    assert [str(p) for p in aux.shared] == ["optimizer_iteration"]
    with pytest.raises(NotImplementedError, match="ema_options"):
        optimizer.DecayAdagradOptimizer(ema_options={"ema_start": 1})


@pytest.mark.parametrize("build", ["build_wngrad", "build_storm", "build_decay_adagrad"])
def test_new_optimizers_update_sparse_rows_only(fresh, build):
    model = _sparse_table_model()
    getattr(optimizer, build)(model, base_learning_rate=0.1)
    workspace.FeedBlob("idx", np.array([2, 0, 2], np.int32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    got = workspace.FetchBlob("table")
    np.testing.assert_array_equal(got[[1, 3]], np.ones((2, 2)))
    assert (got[[0, 2]] < 1).all() and (got[2] < got[0]).all()  # row 2 stepped twice


# ------------------------------------------------------------ Ftrl, GFtrl --

def ftrl_ref(w, nz, g, alpha, beta, l1, l2):
    n, z = nz[..., 0], nz[..., 1]
    nn = n + g * g
    z = z + g - (np.sqrt(nn) - np.sqrt(n)) / alpha * w
    denom = (beta + np.sqrt(nn)) / alpha + l2
    nw = np.where(np.abs(z) > l1, (l1 * np.sign(z) - z) / denom, 0.0)
    return nw, np.stack([nn, z], axis=-1)


def gftrl_ref(w, nz, g, alpha, beta, l1, l2):
    n, z = nz[..., 0], nz[..., 1]
    nn = n + g * g
    z = z + g - (np.sqrt(nn) - np.sqrt(n)) / alpha * w
    d = w.shape[0]
    norm = np.sqrt((z.reshape(d, -1) ** 2).sum(axis=0))  # one per column
    zc = z.reshape(d, -1)
    safe = np.where(norm > 0, norm, 1.0)
    nw = np.where(norm > l1 * np.sqrt(d), zc * (l1 * np.sqrt(d) / safe - 1), 0.0)
    nw = nw / ((beta + np.sqrt(nn.reshape(d, -1))) / alpha + l2)
    return nw.reshape(w.shape), np.stack([nn, z], axis=-1)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("alpha_input", [False, True])
def test_ftrl_op_matches_the_rule(fresh, in_place, alpha_input):
    rng = np.random.default_rng(8)
    w, g = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    nz = np.stack([np.abs(rng.standard_normal((2, 3))), rng.standard_normal((2, 3))], -1).astype(np.float32)
    w[0, 0] = 0.0
    g[0, 0] = 0.01  # |z| under lambda1: the weight is 0
    nz[0, 0] = [1.0, 0.0]
    ins = {"w": w, "nz": nz, "g": g}
    args = dict(beta=0.5, lambda1=0.1, lambda2=0.2)
    if alpha_input:
        ins["a"] = [0.3]
    else:
        args["alpha"] = 0.3
    outs = ["w", "nz"] if in_place else ["w_o", "nz_o"]
    got = run("Ftrl", ins, outs, **args)
    ew, enz = ftrl_ref(w, nz, g, 0.3, 0.5, 0.1, 0.2)
    assert got[0][0, 0] == 0.0
    np.testing.assert_allclose(got[0], ew, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[1], enz, rtol=1e-5, atol=1e-7)
    # Defaults alpha 0.005, beta 1, lambda1 = lambda2 = 0.001.
    got = run("Ftrl", {"w": w, "nz": nz, "g": g}, ["w2", "nz2"])
    np.testing.assert_allclose(got[0], ftrl_ref(w, nz, g, 0.005, 1.0, 0.001, 0.001)[0], rtol=1e-5, atol=1e-7)


def test_sparse_ftrl_updates_rows_in_turn(fresh):
    rng = np.random.default_rng(9)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    nz = np.zeros((4, 2, 2), np.float32)
    idx = np.array([1, 3, 1], np.int64)
    g = rng.standard_normal((3, 2)).astype(np.float32)
    got = run("SparseFtrl", {"w": w, "nz": nz, "i": idx, "g": g}, ["w", "nz"], alpha=0.5, beta=0.1,
              lambda1=0.0, lambda2=0.0)
    ew, enz = w.copy(), nz.copy()
    for k, r in enumerate(idx):
        ew[r], enz[r] = ftrl_ref(ew[r], enz[r], g[k], 0.5, 0.1, 0.0, 0.0)
    np.testing.assert_allclose(got[0], ew, rtol=1e-5)
    np.testing.assert_allclose(got[1], enz, rtol=1e-5)
    np.testing.assert_array_equal(got[0][[0, 2]], w[[0, 2]])


def test_gftrl_op_zeroes_whole_columns(fresh):
    rng = np.random.default_rng(10)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    g = rng.standard_normal((3, 4)).astype(np.float32)
    g[:, 1] = 0.0
    w[:, 1] = 1e-3  # column 1's z stays tiny: the group is zeroed
    nz = np.zeros((3, 4, 2), np.float32)
    got = run("GFtrl", {"w": w, "nz": nz, "g": g}, ["w_o", "nz_o"], alpha=0.5, beta=1.0, lambda1=0.1, lambda2=0.0)
    ew, enz = gftrl_ref(w, nz, g, 0.5, 1.0, 0.1, 0.0)
    np.testing.assert_allclose(got[0], ew, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[1], enz, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got[0][:, 1], 0.0)
    assert (got[0][:, [0, 2, 3]] != 0).all()


def test_ftrl_typed_errors(fresh):
    ins = {"w": np.ones(3), "nz": np.zeros((3, 2)), "g": np.ones(3)}
    with pytest.raises(errors.InvalidArgumentError, match="both input and argument"):
        run("Ftrl", dict(ins, a=[0.1]), ["w", "nz"], alpha=0.2)
    with pytest.raises(errors.InvalidArgumentError, match="alpha"):
        run("Ftrl", ins, ["w", "nz"], alpha=0.0)
    with pytest.raises(errors.InvalidArgumentError, match="alpha"):
        run("Ftrl", dict(ins, a=[-1.0]), ["w", "nz"])
    with pytest.raises(errors.ShapeError, match="n_z"):
        run("Ftrl", dict(ins, nz=np.zeros(3)), ["w", "nz"])
    with pytest.raises(errors.ShapeError, match="'g'"):
        run("GFtrl", dict(ins, g=np.ones(2)), ["w", "nz"])
    with pytest.raises(errors.InvalidArgumentError):  # SparseFtrl is in place
        run("SparseFtrl", {"w": np.ones((3, 1)), "nz": np.zeros((3, 1, 2)), "i": np.array([0]),
                           "g": np.ones((1, 1))}, ["w2", "nz"])


@pytest.mark.parametrize("build", ["build_ftrl", "build_gftrl"])
def test_build_ftrl_takes_ftrl_steps(fresh, build):
    ref = ftrl_ref if build == "build_ftrl" else gftrl_ref
    model, opt, x, t = _linear(getattr(optimizer, build), alpha=0.5, beta=0.1, lambda1=0.01, lambda2=0.01)
    w, b = np.full((1, 3), 0.5), np.zeros(1)
    nzw, nzb = np.zeros((1, 3, 2)), np.zeros((1, 2))
    for _ in range(3):
        workspace.RunNet(model.net.Proto().name)
        gw, gb = _grads(w, b, x, t)
        w, nzw = ref(w, nzw, gw, 0.5, 0.1, 0.01, 0.01)
        b, nzb = ref(b, nzb, gb, 0.5, 0.1, 0.01, 0.01)
    np.testing.assert_allclose(workspace.FetchBlob("y_w"), w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("y_b"), b, rtol=1e-4, atol=1e-6)
    suffix = "_ftrl_nz" if build == "build_ftrl" else "_gftrl_nz"
    assert {str(p) for p in opt.get_auxiliary_parameters().local} == {"y_w" + suffix, "y_b" + suffix}


# ------------------------------------------------- RAdam, RowWiseSparseAdam --

def radam_step(m1, m2, t, b1, b2, eps, radam=True):
    """What lr multiplies: Adam's bias-corrected step, rectified (RAdam)."""
    first = 1 / (1 - b1 ** t)
    corr = np.sqrt(1 - b2 ** t) * first
    if not radam:
        return corr * m1 / (np.sqrt(m2) + eps)
    rho_inf = 2 / (1 - b2) - 1
    rho_t = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
    if rho_t < 5:
        return first * m1
    r_t = np.sqrt((rho_t - 4) * (rho_t - 2) / rho_t * rho_inf / ((rho_inf - 4) * (rho_inf - 2)))
    return r_t * corr * m1 / (np.sqrt(m2) + eps)


@pytest.mark.parametrize("it", [0, 3, 10, 500])  # rho_t < 5 for the first iterations, then rectified
def test_adam_with_radam_matches_the_rule(fresh, it):
    rng = np.random.default_rng(11)
    w, m1, g = (rng.standard_normal(5).astype(np.float32) for _ in range(3))
    m2 = np.abs(rng.standard_normal(5)).astype(np.float32)
    ins = {"w": w, "m1": m1, "m2": m2, "g": g, "lr": [-0.1], "it": np.array([it], np.int64)}
    got = run("Adam", ins, ["w_o", "m1_o", "m2_o", "step"], beta1=0.8, beta2=0.9, epsilon=1e-3, enableRAdam=True)
    em1 = 0.8 * m1 + 0.2 * g
    em2 = 0.9 * m2 + 0.1 * g * g
    step = radam_step(em1, em2, it + 1, 0.8, 0.9, 1e-3)
    np.testing.assert_allclose(got[3], step, rtol=1e-5)
    np.testing.assert_allclose(got[0], w - 0.1 * step, rtol=1e-5)
    np.testing.assert_allclose(got[1], em1, rtol=1e-6)
    np.testing.assert_allclose(got[2], em2, rtol=1e-6)
    # Without the flag: plain Adam.
    got = run("Adam", ins, ["w2", "a", "b"], beta1=0.8, beta2=0.9, epsilon=1e-3)
    np.testing.assert_allclose(got[0], w - 0.1 * radam_step(em1, em2, it + 1, 0.8, 0.9, 1e-3, False), rtol=1e-5)


@pytest.mark.parametrize("it", [1, 40])
def test_sparse_adam_with_radam_updates_rows_in_turn(fresh, it):
    rng = np.random.default_rng(12)
    w, m1 = (rng.standard_normal((4, 2)).astype(np.float32) for _ in range(2))
    m2 = np.abs(rng.standard_normal((4, 2))).astype(np.float32)
    idx = np.array([2, 0, 2], np.int64)
    g = rng.standard_normal((3, 2)).astype(np.float32)
    got = run("SparseAdam", {"w": w, "m1": m1, "m2": m2, "i": idx, "g": g, "lr": [-0.5],
                             "it": np.array([it], np.int64)}, ["w", "m1", "m2"], beta2=0.9, enableRAdam=True)
    ew, em1, em2 = w.copy(), m1.copy(), m2.copy()
    for k, r in enumerate(idx):
        em1[r] = 0.9 * em1[r] + 0.1 * g[k]
        em2[r] = 0.9 * em2[r] + 0.1 * g[k] ** 2
        ew[r] -= 0.5 * radam_step(em1[r], em2[r], it + 1, 0.9, 0.9, 1e-5)
    for a, b in zip(got, (ew, em1, em2)):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_row_wise_sparse_adam_keeps_one_second_moment_per_row(fresh):
    rng = np.random.default_rng(13)
    w, m1 = (rng.standard_normal((4, 3)).astype(np.float32) for _ in range(2))
    m2 = np.abs(rng.standard_normal(4)).astype(np.float32)
    idx = np.array([1, 3, 1], np.int32)
    g = rng.standard_normal((3, 3)).astype(np.float32)
    got = run("RowWiseSparseAdam", {"w": w, "m1": m1, "m2": m2, "i": idx, "g": g, "lr": [-0.2],
                                    "it": np.array([4], np.int64)}, ["w", "m1", "m2", "step"], epsilon=1e-4)
    ew, em1, em2 = w.copy(), m1.copy(), m2.copy()
    steps = np.zeros_like(g)
    for k, r in enumerate(idx):
        em2[r] = 0.999 * em2[r] + 0.001 * np.mean(g[k] ** 2)
        em1[r] = 0.9 * em1[r] + 0.1 * g[k]
        steps[k] = radam_step(em1[r], em2[r], 5, 0.9, 0.999, 1e-4, radam=False)
        ew[r] -= 0.2 * steps[k]
    for a, b in zip(got, (ew, em1, em2, steps)):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    np.testing.assert_array_equal(got[0][[0, 2]], w[[0, 2]])
    with pytest.raises(errors.ShapeError, match="one value per row"):
        run("RowWiseSparseAdam", {"w": w, "m1": m1, "m2": np.ones((4, 3)), "i": idx, "g": g, "lr": [-0.2],
                                  "it": np.array([4], np.int64)}, ["w", "m1", "m2"])
    with pytest.raises(errors.DataTypeError, match="iteration"):
        run("RowWiseSparseAdam", {"w": w, "m1": m1, "m2": m2, "i": idx, "g": g, "lr": [-0.2],
                                  "it": np.array([4.0])}, ["w", "m1", "m2"])


def test_build_adam_with_radam_takes_rectified_steps(fresh):
    model, opt, x, t = _linear(optimizer.build_adam, base_learning_rate=0.1, beta2=0.9, enableRAdam=True)
    w, b = np.full((1, 3), 0.5), np.zeros(1)
    st = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in (("w", w), ("b", b))}
    for it in range(1, 9):  # the first steps are unrectified (rho_t < 5), the later ones rectified
        workspace.RunNet(model.net.Proto().name)
        gw, gb = _grads(w, b, x, t)
        for name, g in (("w", gw), ("b", gb)):
            m1, m2 = st[name]
            m1, m2 = 0.9 * m1 + 0.1 * g, 0.9 * m2 + 0.1 * g * g
            st[name] = (m1, m2)
            step = radam_step(m1, m2, it + 1, 0.9, 0.9, 1e-8)
            if name == "w":
                w = w - 0.1 * step
            else:
                b = b - 0.1 * step
    np.testing.assert_allclose(workspace.FetchBlob("y_w"), w, rtol=1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("y_b"), b, rtol=1e-4, atol=1e-6)


def test_build_adam_row_wise_on_a_sparse_table(fresh):
    model = _sparse_table_model()
    opt = optimizer.build_adam(model, base_learning_rate=0.1, rowWise=True)
    workspace.FeedBlob("idx", np.array([2, 0], np.int32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("table_avg_second_moment").shape == (4,)
    got = workspace.FetchBlob("table")
    np.testing.assert_array_equal(got[[1, 3]], np.ones((2, 2)))
    assert (got[[0, 2]] < 1).all()
    assert {str(p) for p in opt.get_auxiliary_parameters().local} == {"table_first_moment",
                                                                       "table_avg_second_moment"}
    model2, *_ = _linear(lambda m, **kw: m, )
    with pytest.raises(AssertionError, match="rowWise"):
        optimizer.build_adam(model2, base_learning_rate=0.1, rowWise=True)


# ------------------------------------------------------- multi-precision SGD --

def test_build_multi_precision_sgd_on_float32_params_is_momentum_sgd(fresh):
    model, opt, x, t = _linear(optimizer.build_multi_precision_sgd, base_learning_rate=0.1, momentum=0.5)
    w, b = np.full((1, 3), 0.5), np.zeros(1)
    mom = {"w": np.zeros((1, 3)), "b": np.zeros(1)}
    for _ in range(3):
        workspace.RunNet(model.net.Proto().name)
        gw, gb = _grads(w, b, x, t)
        steps = {}
        for name, g in (("w", gw), ("b", gb)):
            new = 0.5 * mom[name] + 0.1 * g
            steps[name] = 1.5 * new - 0.5 * mom[name]  # Nesterov, the default
            mom[name] = new
        w, b = w - steps["w"], b - steps["b"]
    np.testing.assert_allclose(workspace.FetchBlob("y_w"), w, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("y_b"), b, rtol=1e-5, atol=1e-7)
    assert isinstance(opt, optimizer.MultiPrecisionSgdOptimizer)


def test_multi_precision_sgd_updates_the_float32_copy_of_a_half_param(fresh):
    from collections import namedtuple
    info = namedtuple("Info", ["blob", "grad", "blob_copy"])
    net, init = core.Net("mp"), core.Net("mp_init")
    opt = optimizer.MultiPrecisionSgdOptimizer(base_learning_rate=0.25, momentum=0.5, nesterov=False)
    opt(net, init, info(core.BlobReference("w16"), core.BlobReference("g16"),
                        {core.DataType.FLOAT: core.BlobReference("w32")}))
    w32 = np.array([1.0, -2.0, 0.5], np.float32)
    g = np.array([0.5, 1.0, -4.0], np.float16)
    workspace.FeedBlob("w32", w32)
    workspace.FeedBlob("w16", w32.astype(np.float16))
    workspace.RunNetOnce(init)
    m = np.zeros(3, np.float32)
    for _ in range(2):
        workspace.FeedBlob("g16", g)
        workspace.RunNetOnce(net)
        m = 0.5 * m + 0.25 * g.astype(np.float32)
        w32 = w32 - m
    np.testing.assert_allclose(workspace.FetchBlob("w32"), w32, rtol=1e-6)
    got16 = workspace.FetchBlob("w16")
    assert got16.dtype == np.float16
    np.testing.assert_array_equal(got16, w32.astype(np.float16))
    assert [str(p) for p in opt.get_auxiliary_parameters().local] == ["w16_momentum"]


# ------------------------------------------ FP32/FP16MomentumSGDUpdate, FP16 SGD --

def wd_momentum_ref(g, m, lr, p, mu, nesterov, wd):
    g = g + wd * p
    new = mu * m + lr * g
    step = (1 + mu) * new - mu * m if nesterov else new
    return step, new, p - step


@pytest.mark.parametrize("nesterov", [0, 1])
@pytest.mark.parametrize("in_place", [False, True])
def test_fp32_momentum_sgd_update_matches_the_rule(fresh, nesterov, in_place):
    rng = np.random.default_rng(14)
    g, m, p = (rng.standard_normal(5).astype(np.float32) for _ in range(3))  # odd: every element is updated
    outs = ["g", "m", "p"] if in_place else ["g_o", "m_o", "p_o"]
    got = run("FP32MomentumSGDUpdate", {"g": g, "m": m, "lr": [0.3], "p": p}, outs, momentum=0.7,
              nesterov=nesterov, weight_decay=0.05)
    for a, b in zip(got, wd_momentum_ref(g, m, 0.3, p, 0.7, nesterov, 0.05)):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_fp16_momentum_sgd_update_rounds_a_float32_computation(fresh):
    rng = np.random.default_rng(15)
    g, m, p = (rng.standard_normal((2, 3)).astype(np.float16) for _ in range(3))
    workspace.FeedBlob("lr", np.array([0.3], np.float32))
    for name, v in (("g", g), ("m", m), ("p", p)):
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator("FP16MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"],
                                                  momentum=0.5, nesterov=1, weight_decay=0.1))
    want = wd_momentum_ref(*(v.astype(np.float32) for v in (g, m)), np.float32(0.3), p.astype(np.float32),
                           np.float32(0.5), 1, np.float32(0.1))
    for name, w in zip(("g", "m", "p"), want):
        got = workspace.FetchBlob(name)
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, w.astype(np.float16))
    with pytest.raises(errors.DataTypeError, match="float16"):
        run("FP16MomentumSGDUpdate", {"g2": np.ones(2), "m2": np.ones(2), "lr2": [0.1], "p2": np.ones(2)},
            ["g2", "m2", "p2"])
    with pytest.raises(errors.ShapeError, match="'m3'"):
        run("FP32MomentumSGDUpdate", {"g3": np.ones(2), "m3": np.ones(3), "lr3": [0.1], "p3": np.ones(2)},
            ["g3", "m3", "p3"])


def test_build_fp16_sgd_on_float32_params_decays_weights_in_the_update(fresh):
    model, opt, x, t = _linear(optimizer.build_fp16_sgd, base_learning_rate=0.1, momentum=0.5, weight_decay=0.01)
    w, b = np.full((1, 3), 0.5), np.zeros(1)
    mom = {"w": np.zeros((1, 3)), "b": np.zeros(1)}
    for _ in range(3):
        workspace.RunNet(model.net.Proto().name)
        gw, gb = _grads(w, b, x, t)
        _, mom["w"], w = wd_momentum_ref(gw, mom["w"], 0.1, w, 0.5, True, 0.01)
        _, mom["b"], b = wd_momentum_ref(gb, mom["b"], 0.1, b, 0.5, True, 0.01)
    np.testing.assert_allclose(workspace.FetchBlob("y_w"), w, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("y_b"), b, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(workspace.FetchBlob("y_w_momentum_fp32"), mom["w"], rtol=1e-5)
    assert {str(p) for p in opt.get_auxiliary_parameters().local} == {"y_w_momentum", "y_b_momentum"}


def test_fp16_sgd_updates_a_half_param_with_a_float32_copy(fresh):
    from collections import namedtuple
    info = namedtuple("Info", ["blob", "grad", "blob_copy"])
    net, init = core.Net("h"), core.Net("h_init")
    opt = optimizer.FP16SgdOptimizer(base_learning_rate=0.5, momentum=0.0, weight_decay=0.0)
    opt(net, init, info(core.BlobReference("w16"), core.BlobReference("g16"),
                        {core.DataType.FLOAT: core.BlobReference("w32")}))
    workspace.FeedBlob("w32", np.array([1.0, 2.0], np.float32))
    workspace.FeedBlob("w16", np.array([1.0, 2.0], np.float16))
    workspace.RunNetOnce(init)
    workspace.FeedBlob("g16", np.array([0.5, -1.0], np.float16))
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob("w16"), np.array([0.75, 2.5], np.float16))
    assert workspace.FetchBlob("w16_momentum").dtype == np.float16


# ---------------------------------------------------------- RowWiseCounter --

def test_row_wise_counter_decays_each_rows_count(fresh):
    prev = np.array([0, 3, 10, 0], np.int64)
    counter = np.array([0.0, 2.0, 1.0, 5.0])
    idx = np.array([1, 2, 1], np.int32)
    workspace.FeedBlob("prev", prev)
    workspace.FeedBlob("cnt", counter)
    workspace.FeedBlob("idx", idx)
    workspace.FeedBlob("it", np.array([7], np.int64))
    workspace.RunOperatorOnce(core.CreateOperator("RowWiseCounter", ["prev", "cnt", "idx", "it"], ["prev", "cnt"],
                                                  counter_halflife=4))
    ep, ec = prev.copy(), counter.copy()
    for r in idx:  # in order: the repeat sees delta 0
        delta = max(0, 7 - ep[r])
        ec[r] = 1.0 + 0.5 ** (delta / 4) * ec[r]
        ep[r] = max(7, ep[r])
    got_c = workspace.FetchBlob("cnt")
    assert got_c.dtype == np.float64
    np.testing.assert_allclose(got_c, ec, rtol=1e-12)
    np.testing.assert_array_equal(workspace.FetchBlob("prev"), ep)
    assert ec[2] == 2.0  # row 2 was updated "later" (10 > 7): no decay, prev kept
    # counter_halflife <= 0 (the default) leaves both alone.
    workspace.RunOperatorOnce(core.CreateOperator("RowWiseCounter", ["prev", "cnt", "idx", "it"], ["prev", "cnt"]))
    np.testing.assert_array_equal(workspace.FetchBlob("cnt"), got_c)
    workspace.FeedBlob("idx", np.array([4], np.int32))  # one past the end
    with pytest.raises(errors.InvalidArgumentError, match="out of range"):
        workspace.RunOperatorOnce(core.CreateOperator("RowWiseCounter", ["prev", "cnt", "idx", "it"],
                                                      ["prev", "cnt"], counter_halflife=4))
    workspace.FeedBlob("cnt32", counter.astype(np.float32))
    with pytest.raises(errors.DataTypeError, match="float64"):
        workspace.RunOperatorOnce(core.CreateOperator("RowWiseCounter", ["prev", "cnt32", "idx", "it"],
                                                      ["prev", "cnt32"], counter_halflife=4))


def test_row_wise_adagrad_with_counter_counts_row_updates(fresh):
    model = _sparse_table_model()
    opt = optimizer.build_adagrad(model, base_learning_rate=0.1, rowWise=True, counter_halflife=2)
    workspace.FeedBlob("idx", np.array([2, 0], np.int32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    for _ in range(3):
        workspace.RunNet(model.net.Proto().name)
    # Three runs at iterations 1, 2, 3: c = 1 + 2^(-1/2) c each time.
    c = 0.0
    for _ in range(3):
        c = 1 + 0.5 ** 0.5 * c
    np.testing.assert_allclose(workspace.FetchBlob("table_update_counter"), [c, 0, c, 0], rtol=1e-12)
    np.testing.assert_array_equal(workspace.FetchBlob("table_prev_update_iter"), [3, 0, 3, 0])
    aux = opt.get_auxiliary_parameters()
    assert "optimizer_iteration" in {str(p) for p in aux.shared}
    assert {"table_update_counter", "table_prev_update_iter"} <= {str(p) for p in aux.local}


def test_adagrad_with_counter_and_weight_decay_feeds_the_count_to_the_update(fresh):
    # With weight decay, each row's decay is scaled by counter_halflife /
    # its count (later Caffe2): the sparse op reads the counter as input 5.
    model = _sparse_table_model()
    optimizer.build_adagrad(model, base_learning_rate=0.1, rowWise=True, counter_halflife=2,
                            weight_decay=0.5)
    ops = [op for op in model.net.Proto().op if op.type == "RowWiseSparseAdagrad"]
    assert len(ops) == 1 and len(ops[0].input) == 6
    assert ops[0].input[5] == "table_update_counter"
    assert {a.name: a.i for a in ops[0].arg}["counter_halflife"] == 2
    workspace.FeedBlob("idx", np.array([2, 0], np.int32))
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    for _ in range(2):
        workspace.RunNet(model.net.Proto().name)
    assert np.isfinite(workspace.FetchBlob("table")).all()


# --------------------------------------------------------------- YellowFin --

def yellowfin_ref(state, g, it, beta, eps, width, nesterov=False, zero_debias=True):
    """One YellowFin step in float64, written from the paper's tuner as
    Caffe2 applies it: step with the current (lr, mu), then the averages."""
    w, m, lr, mu, curv, g_avg, g2_avg, mem = (np.array(v, np.float64).ravel() for v in state)
    g = g.astype(np.float64).ravel()
    new = mu * m + lr * g
    w = w - ((1 + mu) * new - mu * m if nesterov else new)
    m = new
    f = 1 / (1 - beta ** it) if zero_debias else 1.0

    def ma(avg, x):
        avg = beta * avg + (1 - beta) * x
        return avg, f * avg

    g_avg, g_deb = ma(g_avg, g)
    g2_avg, _ = ma(g2_avg, g * g)
    n2 = max(eps, float(g @ g))
    mem[1], n2_deb = ma(mem[1], n2)
    mem[0], _ = ma(mem[0], np.sqrt(n2))
    curv = curv.copy()
    curv[(it - 1) % width] = np.log(n2)
    valid = curv[:min(width, it)]
    mem[2], lo = ma(mem[2], valid.min())
    mem[3], hi = ma(mem[3], valid.max())
    lo, hi = max(eps, np.exp(lo)), max(eps, np.exp(hi))
    var = max(eps, n2_deb - float(g_deb @ g_deb))
    mem[4], dist = ma(mem[4], mem[0] / mem[1])
    if it > 1:
        ratio = np.sqrt(hi / lo)
        limit = (ratio - 1) / (ratio + 1)
        p = (dist * lo) ** 2 / (2 * var)
        w3 = (-np.sqrt(p * p + 4 / 27 * p ** 3) - p) / 2
        root = np.cbrt(w3) - p / 3 / np.cbrt(w3) + 1
        new_mu = max(root ** 2, limit ** 2)
        new_lr = (1 - np.sqrt(new_mu)) ** 2 / lo
        mu, _ = ma(mu, new_mu)
        lr, _ = ma(lr, new_lr)
    return [w, m, lr, mu, curv, g_avg, g2_avg, mem]


@pytest.mark.parametrize("nesterov", [0, 1])
def test_yellowfin_op_matches_the_rule_over_steps(fresh, nesterov):
    rng = np.random.default_rng(16)
    names = ["w", "m", "lr", "mu", "curv", "ga", "g2a", "mem"]
    state = [rng.standard_normal(4), np.zeros(4), [0.1], [0.2], np.zeros(3), np.zeros(4), np.zeros(4), np.zeros(5)]
    for name, v in zip(names, state):
        workspace.FeedBlob(name, np.asarray(v, np.float32))
    ref = [np.asarray(v, np.float64) for v in state]
    for it in range(1, 6):  # past the 3-wide curvature window
        g = rng.standard_normal(4).astype(np.float32)
        workspace.FeedBlob("g", g)
        workspace.FeedBlob("it", np.array([it], np.int64))
        workspace.RunOperatorOnce(core.CreateOperator("YellowFin", names + ["g", "it"], names, beta=0.9,
                                                      curv_win_width=3, epsilon=1e-6, nesterov=nesterov))
        ref = yellowfin_ref(ref, g, it, 0.9, 1e-6, 3, nesterov=bool(nesterov))
        for name, want in zip(names, ref):
            np.testing.assert_allclose(workspace.FetchBlob(name), np.reshape(want, -1), rtol=2e-4, atol=1e-6,
                                       err_msg=f"{name} at iteration {it}")
    assert workspace.FetchBlob("lr")[0] != np.float32(0.1)  # tuned from iteration 2 on


def test_yellowfin_typed_errors(fresh):
    names = ["w", "m", "lr", "mu", "curv", "ga", "g2a", "mem"]
    vals = [np.ones(2), np.zeros(2), [0.1], [0.0], np.zeros(20), np.zeros(2), np.zeros(2), np.zeros(5)]
    for name, v in zip(names, vals):
        workspace.FeedBlob(name, np.asarray(v, np.float32))
    workspace.FeedBlob("g", np.ones(2, np.float32))
    workspace.FeedBlob("it", np.array([0], np.int64))
    op = core.CreateOperator("YellowFin", names + ["g", "it"], names)
    with pytest.raises(errors.InvalidArgumentError, match=">= 1"):
        workspace.RunOperatorOnce(op)
    workspace.FeedBlob("it", np.array([1], np.int64))
    workspace.FeedBlob("curv", np.zeros(3, np.float32))
    with pytest.raises(errors.ShapeError, match="curv_win"):
        workspace.RunOperatorOnce(op)
    with pytest.raises(errors.InvalidArgumentError, match="curv_win_width"):
        workspace.RunOperatorOnce(core.CreateOperator("YellowFin", names + ["g", "it"], names, curv_win_width=0))


def test_build_yellowfin_state_blobs(fresh):
    model, opt, x, t = _linear(optimizer.build_yellowfin, base_learning_rate=0.05, curv_win_width=4)
    w, b = np.full((1, 3), 0.5), np.zeros(1)
    st = {"w": [w, np.zeros((1, 3)), [0.05], [0.0], np.zeros(4), np.zeros((1, 3)), np.zeros((1, 3)), np.zeros(5)],
          "b": [b, np.zeros(1), [0.05], [0.0], np.zeros(4), np.zeros(1), np.zeros(1), np.zeros(5)]}
    for it in range(1, 4):
        workspace.RunNet(model.net.Proto().name)
        gw, gb = _grads(st["w"][0], st["b"][0], x, t)
        st["w"] = yellowfin_ref(st["w"], gw, it, 0.999, 1e-6, 4)
        st["w"][0] = st["w"][0].reshape(1, 3)
        st["b"] = yellowfin_ref(st["b"], gb, it, 0.999, 1e-6, 4)
    np.testing.assert_allclose(workspace.FetchBlob("y_w"), st["w"][0], rtol=1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("y_w_lr_avg"), np.reshape(st["w"][2], -1), rtol=1e-3)
    assert {str(p) for p in opt.get_auxiliary_parameters().local} >= {
        "y_w_moment", "y_w_lr_avg", "y_w_mu_avg", "y_w_curv_win", "y_w_g_avg", "y_w_g2_avg", "y_w_scalars_memory"}
    assert [str(p) for p in opt.get_auxiliary_parameters().shared] == ["optimizer_iteration"]
