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


def test_rms_prop_refuses_sparse_gradients(fresh):
    model = model_helper.ModelHelper(name="emb")
    table = model.param_init_net.ConstantFill([], "table", shape=[4, 2], value=1.0)
    model.params.append(table)
    rows = model.net.Gather([table, "idx"], "rows")
    loss = model.net.AveragedLoss(rows, "loss")
    model.AddGradientOperators([loss])
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
