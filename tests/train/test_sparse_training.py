"""Sparse gradients end to end (issue 14): the backward pass gives
Gather and SparseLengthsSum parameters a core.GradientSlice, sums several
of them by concatenation as Caffe2 did, and the optimizers update only the
rows named (SparseAdagrad, RowWiseSparseAdagrad, ScatterWeightedSum); an
embedding model trained with them converges. Also weight decay and the new
brew helpers."""

import numpy as np
import pytest
from ferrocaffe import brew, core, errors, model_helper, optimizer, workspace

V, N = 20, 64


def bags(rng):
    """N bags of 1 to 4 token ids out of V, their lengths, and the
    (bag x token) count matrix."""
    lengths = rng.integers(1, 5, N).astype(np.int32)
    idx = rng.integers(0, V, int(lengths.sum())).astype(np.int64)
    counts = np.zeros((N, V))
    k = 0
    for i, n in enumerate(lengths):
        np.add.at(counts[i], idx[k:k + n], 1)
        k += n
    return idx, lengths, counts


def embedding_model(build, **kw):
    """pred = SparseLengthsSum(E, idx, lengths) + b; loss = mean squared error / 2."""
    model = model_helper.ModelHelper(name="emb")
    e = model.param_init_net.ConstantFill([], "E", shape=[V, 1], value=0.0)
    b = model.param_init_net.ConstantFill([], "b", shape=[1], value=0.0)
    model.AddParameter(e)
    model.AddParameter(b)
    s = model.net.SparseLengthsSum([e, "idx", "lengths"], "s")
    pred = model.net.Add([s, b], "pred")
    dist = model.net.SquaredL2Distance([pred, "target"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    grads = model.AddGradientOperators([loss])
    build(model, **kw)
    return model, grads


def test_backward_pass_gives_gradient_slices(fresh):
    model, grads = embedding_model(lambda m: None)
    g = grads[core.BlobReference("E")]
    assert isinstance(g, core.GradientSlice)
    assert (str(g.indices), str(g.values)) == ("idx", "E_grad_values")
    assert not isinstance(grads[core.BlobReference("b")], core.GradientSlice)
    info = {str(p.blob): p.grad for p in model.GetOptimizationParamInfo()}
    assert isinstance(info["E"], core.GradientSlice) and str(info["b"]) == "b_grad"


def test_two_gathers_sum_by_concatenation(fresh):
    net = core.Net("two")
    a = net.Gather(["W", "i1"], "a")
    b = net.Gather(["W", "i2"], "b")
    s = net.Sum([a, b], "s")
    loss = net.AveragedLoss(s, "loss")
    grads = net.AddGradientOperators([loss])
    g = grads[core.BlobReference("W")]
    assert (str(g.indices), str(g.values)) == ("W_grad_indices_concat", "W_grad_values_concat")
    concat = [op for op in net.Proto().op if op.type == "Concat"]
    assert [list(op.input) for op in concat] == [["i2", "i1"], ["s_grad", "s_grad"]]
    # The gradient it computes: rows i1 and i2 each get d loss / d a.
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    i1, i2 = np.array([0, 2], np.int32), np.array([2], np.int32)
    for n, v in {"W": w, "i1": i1, "i2": np.array([2, 3], np.int32)}.items():
        workspace.FeedBlob(n, v)
    workspace.RunNetOnce(net)
    idx = workspace.FetchBlob("W_grad_indices_concat")
    vals = workspace.FetchBlob("W_grad_values_concat")
    dense = np.zeros_like(w)
    np.add.at(dense, idx, vals)
    np.testing.assert_allclose(dense, [[1 / 6] * 3, [0] * 3, [2 / 6] * 3, [1 / 6] * 3], rtol=1e-6)
    del i1, i2


def test_mixed_sparse_and_dense_gradients_are_refused(fresh):
    net = core.Net("mixed")
    a = net.Gather(["W", "i"], "a")
    c = net.MatMul(["x", "W"], "c")
    s = net.Sum([net.AveragedLoss(a, "la"), net.AveragedLoss(c, "lc")], "s")
    with pytest.raises(errors.InvalidArgumentError, match="mix of sparse and dense"):
        net.AddGradientOperators([s])


def test_sparse_output_gradient_into_a_dense_maker_is_refused(fresh):
    net = core.Net("sp")
    y = net.Relu("x", "y")
    with pytest.raises(errors.InvalidArgumentError, match="sparse"):
        net.AddGradientOperators({y: core.GradientSlice("gi", "gv")})


@pytest.mark.parametrize("row_wise", [False, True, "adam", "momentum"])
def test_embedding_model_converges_with_sparse_optimizers(fresh, row_wise):
    rng = np.random.default_rng(0)
    idx, lengths, counts = bags(rng)
    truth = rng.standard_normal(V)
    target = (counts @ truth + 0.5).astype(np.float32).reshape(N, 1)
    # The bag-count matrix with a ones column has full column rank, so
    # (truth, 0.5) is the only zero-loss point: a convex quadratic whose
    # minimum is 0, which each optimizer approaches at a small enough step
    # (full batch, no noise); we ask for 1% of the start after 300 steps.
    assert np.linalg.matrix_rank(np.hstack([counts, np.ones((N, 1))])) == V + 1
    if row_wise == "adam":
        model, _ = embedding_model(optimizer.build_adam, base_learning_rate=0.02)
        sparse_op = "SparseAdam"
    elif row_wise == "momentum":
        model, _ = embedding_model(optimizer.build_sgd, base_learning_rate=0.02, momentum=0.9)
        sparse_op = "SparseMomentumSGDUpdate"
    elif row_wise:
        # RowWise is for sparse parameters only (as in Caffe2): one
        # optimizer per kind, called with ParameterInfo objects.
        def build(model):
            sparse = optimizer.AdagradOptimizer(alpha=0.3, rowWise=True)
            dense = optimizer.AdagradOptimizer(alpha=0.3)
            for info in model.GetOptimizationParamInfo():
                opt = sparse if isinstance(info.grad, core.GradientSlice) else dense
                opt(model.net, model.param_init_net, info)

        model, _ = embedding_model(build)
        sparse_op = "RowWiseSparseAdagrad"
    else:
        model, _ = embedding_model(optimizer.build_adagrad, base_learning_rate=0.3)
        sparse_op = "SparseAdagrad"
    types = [op.type for op in model.net.Proto().op]
    assert sparse_op in types
    for n, v in {"idx": idx, "lengths": lengths, "target": target}.items():
        workspace.FeedBlob(n, v)
    workspace.RunNetOnce(model.param_init_net)
    if row_wise is True:
        assert workspace.FetchBlob("E_avg_squared_sum").shape == (V,)
    workspace.CreateNet(model.net)
    first = None
    for _ in range(300):
        workspace.RunNet(model.net)
        if first is None:
            first = float(workspace.FetchBlob("loss"))
    last = float(workspace.FetchBlob("loss"))
    assert first == pytest.approx(0.5 * float((target**2).mean()), rel=1e-5)
    assert last < 0.01 * first, (first, last)


def test_weighted_bags_train_with_sparse_adagrad(fresh):
    # SparseLengthsWeightedSum over per-token weights: E gets a
    # GradientSlice (values = weight x dY of the bag), updated by
    # SparseAdagrad; grad_on_weights gives the fed weights a gradient
    # (dY of the bag . E's row), checked against numpy after one step.
    rng = np.random.default_rng(1)
    idx, lengths, _ = bags(rng)
    weights = rng.uniform(0.5, 2.0, len(idx)).astype(np.float32)
    counts = np.zeros((N, V))
    bag = np.repeat(np.arange(N), lengths)
    np.add.at(counts, (bag, idx), weights)
    assert np.linalg.matrix_rank(np.hstack([counts, np.ones((N, 1))])) == V + 1
    truth = rng.standard_normal(V)
    target = (counts @ truth + 0.5).astype(np.float32).reshape(N, 1)

    model = model_helper.ModelHelper(name="weighted_emb")
    e = model.param_init_net.GaussianFill([], "E", shape=[V, 1], std=0.1)
    b = model.param_init_net.ConstantFill([], "b", shape=[1], value=0.0)
    model.AddParameter(e)
    model.AddParameter(b)
    s = model.net.SparseLengthsWeightedSum([e, "w", "idx", "lengths"], "s", grad_on_weights=1)
    pred = model.net.Add([s, b], "pred")
    dist = model.net.SquaredL2Distance([pred, "target"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    grads = model.AddGradientOperators([loss])
    g = grads[core.BlobReference("E")]
    assert (str(g.indices), str(g.values)) == ("idx", "E_grad_values")
    assert str(grads[core.BlobReference("w")]) == "w_grad"
    optimizer.build_adagrad(model, base_learning_rate=0.3)
    assert "SparseAdagrad" in [op.type for op in model.net.Proto().op]
    for n, v in {"idx": idx, "lengths": lengths, "target": target, "w": weights}.items():
        workspace.FeedBlob(n, v)
    workspace.RunNetOnce(model.param_init_net)
    e0 = workspace.FetchBlob("E")[:, 0].astype(np.float64)
    workspace.CreateNet(model.net)
    workspace.RunNet(model.net)
    dy = (counts @ e0 - target[:, 0]) / N  # d loss / d pred (b starts at 0)
    np.testing.assert_allclose(workspace.FetchBlob("w_grad"), dy[bag] * e0[idx], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(workspace.FetchBlob("E_grad_values")[:, 0], dy[bag] * weights, rtol=1e-4, atol=1e-7)
    first = float(workspace.FetchBlob("loss"))
    for _ in range(300):
        workspace.RunNet(model.net)
    last = float(workspace.FetchBlob("loss"))
    assert last < 0.01 * first, (first, last)


def test_sparse_sgd_updates_only_the_rows(fresh):
    rng = np.random.default_rng(1)
    idx, lengths, _ = bags(rng)
    target = rng.standard_normal((N, 1)).astype(np.float32)
    model, _ = embedding_model(optimizer.build_sgd, base_learning_rate=0.1)
    assert "ScatterWeightedSum" in [op.type for op in model.net.Proto().op]
    for n, v in {"idx": idx, "lengths": lengths, "target": target}.items():
        workspace.FeedBlob(n, v)
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    # One step from E = 0, b = 0: d loss / d pred = target * -1 / N per bag.
    dpred = -target[:, 0] / N
    want = np.zeros(V)
    k = 0
    for i, n in enumerate(lengths):
        np.add.at(want, idx[k:k + n], -0.1 * dpred[i])
        k += n
    np.testing.assert_allclose(workspace.FetchBlob("E")[:, 0], want, rtol=1e-4, atol=1e-7)
    untouched = np.setdiff1d(np.arange(V), idx)
    assert (workspace.FetchBlob("E")[untouched] == 0).all()


def mlp(weight_decay, how):
    model = model_helper.ModelHelper(name="wd")
    h = brew.fc(model, "data", "h", dim_in=3, dim_out=4)
    pred = brew.fc(model, h, "pred", dim_in=4, dim_out=1)
    dist = model.net.SquaredL2Distance([pred, "target"], "dist")
    loss = model.net.AveragedLoss(dist, "loss")
    model.AddGradientOperators([loss])
    if weight_decay and how == "optimizer":
        optimizer.add_weight_decay(model, weight_decay)
    elif weight_decay:
        brew.add_weight_decay(model, weight_decay)
    optimizer.build_sgd(model, base_learning_rate=0.1)
    for i, op in enumerate(model.param_init_net.Proto().op):
        op.device_option.random_seed = 100 + i
    return model


@pytest.mark.parametrize("how", ["optimizer", "brew"])
def test_weight_decay_adds_wd_times_weight_to_weight_gradients(fresh, how):
    rng = np.random.default_rng(2)
    x, t = rng.standard_normal((8, 3)).astype(np.float32), rng.standard_normal((8, 1)).astype(np.float32)
    after = {}
    for wd in (0.0, 0.5):
        workspace.ResetWorkspace()
        workspace.FeedBlob("data", x)
        workspace.FeedBlob("target", t)
        model = mlp(wd, how)
        workspace.RunNetOnce(model.param_init_net)
        before = {p: workspace.FetchBlob(p) for p in ("h_w", "h_b", "pred_w", "pred_b")}
        workspace.RunNetOnce(model.net)
        after[wd] = {p: workspace.FetchBlob(p) for p in before}
    # SGD: w -= lr * (g + wd * w): the decayed run differs by lr * wd * w on weights only.
    for p in ("h_w", "pred_w"):
        np.testing.assert_allclose(after[0.5][p], after[0.0][p] - 0.1 * 0.5 * before[p], rtol=1e-5, atol=1e-6)
    for p in ("h_b", "pred_b"):
        np.testing.assert_allclose(after[0.5][p], after[0.0][p], rtol=1e-6)


def test_brew_dropout_concat_transpose(fresh):
    model = model_helper.ModelHelper(name="b")
    with pytest.raises(AssertionError, match="is_test"):
        brew.dropout(model, "x", "d")
    d = brew.dropout(model, "x", "d", ratio=0.5, is_test=1)
    c = brew.concat(model, [d, "x"], "c", axis=1)
    t = brew.transpose(model, c, "t", axes=[1, 0])
    ops = model.net.Proto().op
    assert [(op.type, list(op.output)) for op in ops] == [
        ("Dropout", ["d", "_d_mask"]), ("Concat", ["c", "_c_concat_dims"]), ("Transpose", ["t"])]
    assert str(t) == "t"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(model.net)
    np.testing.assert_array_equal(workspace.FetchBlob("t"), np.concatenate([x, x], axis=1).T)
    assert all(brew.has_helper(h) for h in ("dropout", "concat", "transpose", "add_weight_decay"))


def test_skip_sparse_optim_and_order_of_calls(fresh):
    model = model_helper.ModelHelper(name="skip", skip_sparse_optim=True)
    with pytest.raises(RuntimeError, match="AddGradientOperators"):
        model.GetOptimizationParamInfo()
    w = model.param_init_net.ConstantFill([], "W", shape=[5, 2], value=1.0)
    model.AddParameter(w)
    v = brew.fc(model, model.net.Gather([w, "i"], "g"), "y", dim_in=2, dim_out=1)
    model.AddGradientOperators([model.net.AveragedLoss(v, "loss")])
    assert isinstance(model.param_to_grad[w], core.GradientSlice)
    assert [str(p.blob) for p in model.GetOptimizationParamInfo()] == ["y_w", "y_b"]


def test_optimizers_report_their_auxiliary_blobs(fresh):
    def aux(build, **kw):
        model = model_helper.ModelHelper(name="aux")
        pred = brew.fc(model, "data", "pred", dim_in=3, dim_out=1)
        model.AddGradientOperators([model.net.AveragedLoss(pred, "loss")])
        p = build(model, **kw).get_auxiliary_parameters()
        return sorted(map(str, p.local)), sorted(map(str, p.shared))

    assert aux(optimizer.build_adagrad, base_learning_rate=0.1) == (
        ["pred_b_squared_sum", "pred_w_squared_sum"], [])
    assert aux(optimizer.build_adam, base_learning_rate=0.1) == (
        ["pred_b_first_moment", "pred_b_second_moment", "pred_w_first_moment", "pred_w_second_moment"],
        ["optimizer_iteration"])
    assert aux(optimizer.build_sgd, base_learning_rate=0.1, momentum=0.9) == (
        ["pred_b_momentum", "pred_w_momentum"], ["ONE_0_0"])
