"""Gradients users hit that were missing or wrong (issue 27): each as a
user meets it, through AddGradientOperators, against central differences.
The generic checker (test_op_gradients.py) covers every argument variant;
these are the cases as reported."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace

EPS = 1e-6


def _numeric(net, loss, name, feeds):
    """d loss / d name by central differences of ``net`` (the forward)."""
    x = feeds[name]
    g = np.zeros(x.shape)
    for j in np.ndindex(x.shape):
        vals = []
        for step in (EPS, -EPS):
            moved = x.copy()
            moved[j] += step
            for n, v in dict(feeds, **{name: moved}).items():
                workspace.FeedBlob(n, v)
            workspace.RunNetOnce(net)
            vals.append(float(workspace.FetchBlob(loss)))
        g[j] = (vals[0] - vals[1]) / (2 * EPS)
    return g


def _check(build, feeds, wrt, loss="L"):
    """Builds the forward with ``build(net)``, adds the gradient of ``loss``
    and compares the gradient of each of ``wrt`` with central differences."""
    fwd = core.Net("fwd")
    build(fwd)
    train = fwd.Clone("train")
    grads = train.AddGradientOperators([loss])
    for n, v in feeds.items():
        workspace.FeedBlob(n, v)
    workspace.RunNetOnce(train)
    for name in wrt:
        got = workspace.FetchBlob(grads[name])
        want = _numeric(fwd, loss, name, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8, err_msg=name)
    return grads


def test_slice_has_caffe2s_slice_gradient(fresh):
    rng = np.random.default_rng(0)

    def build(n):
        n.Slice(["X"], ["S"], starts=[1, 0], ends=[3, -2])
        n.Sqr(["S"], ["S2"])
        n.SumElements(["S2"], ["L"])

    _check(build, {"X": rng.standard_normal((4, 5))}, ["X"])

    def build_inputs(n):
        n.Slice(["X", "starts", "ends"], ["S"])
        n.Sqr(["S"], ["S2"])
        n.SumElements(["S2"], ["L"])

    feeds = {"X": rng.standard_normal((4, 5)), "starts": np.array([0, 2], np.int32),
             "ends": np.array([-1, 4], np.int32)}
    grads = _check(build_inputs, feeds, ["X"])
    assert "starts" not in grads and "ends" not in grads
    # Caffe2's signature: (data[, starts, ends], dY) -> d data.
    op = core.CreateOperator("Slice", ["X", "starts", "ends"], ["S"])
    g_ops, _ = core.GradientRegistry.GetGradientForOp(op, ["S_grad"])
    assert [(g.type, list(g.input), list(g.output)) for g in g_ops] == [
        ("SliceGradient", ["X", "starts", "ends", "S_grad"], ["X_grad"])]


def test_slice_gradient_names_a_wrong_dy(fresh):
    workspace.FeedBlob("X", np.zeros((3, 4)))
    workspace.FeedBlob("dY", np.zeros((2, 2)))
    op = core.CreateOperator("SliceGradient", ["X", "dY"], ["dX"], starts=[0, 0], ends=[1, 2])
    with pytest.raises(errors.ShapeError, match="SliceGradient") as e:
        workspace.RunOperatorOnce(op)
    assert "dY" in str(e.value)


def test_sum_reduce_like_gives_a_its_gradient_broadcast_back(fresh):
    rng = np.random.default_rng(1)

    def build(n):
        n.SumReduceLike(["A", "B"], ["C"], axis=1)
        n.Sqr(["C"], ["C2"])
        n.SumElements(["C2"], ["L"])

    grads = _check(build, {"A": rng.standard_normal((2, 3, 4)), "B": np.zeros(3)}, ["A"])
    assert "B" not in grads


@pytest.mark.parametrize("a_shape, b_shape, args", [
    ((2, 1, 2, 3), (3, 3, 2), {}),
    ((3,), (2, 3, 4), {}),
    ((2, 2, 3), (3,), {}),
    ((2, 3, 2), (1, 4, 3), {"trans_a": 1, "trans_b": 1}),
])
def test_broadcast_batch_matmul_has_a_gradient(fresh, a_shape, b_shape, args):
    rng = np.random.default_rng(2)

    def build(n):
        n.BatchMatMul(["A", "B"], ["Y"], broadcast=1, **args)
        n.Sqr(["Y"], ["Y2"])
        n.SumElements(["Y2"], ["L"])

    feeds = {"A": rng.standard_normal(a_shape), "B": rng.standard_normal(b_shape)}
    _check(build, feeds, ["A", "B"])


@pytest.mark.parametrize("used", ["mean", "variance"])
def test_moments_with_only_one_output_used(fresh, used):
    # Before: "source for input 'None' is unknown" when the backward net ran.
    rng = np.random.default_rng(3)

    def build(n):
        n.Moments(["X"], ["mean", "variance"], axes=[1])
        n.Sqr([used], ["sq"])
        n.SumElements(["sq"], ["L"])

    _check(build, {"X": rng.standard_normal((3, 4))}, ["X"])


def test_softmax_with_loss_gradient_takes_the_probabilities_gradient_too(fresh):
    # Caffe2's maker dropped the gradient of P: a loss reading P got a
    # wrong X gradient, silently.
    rng = np.random.default_rng(4)

    def build(n):
        n.SoftmaxWithLoss(["X", "label"], ["P", "xent"])
        n.Sqr(["P"], ["P2"])
        n.SumElements(["P2"], ["penalty"])
        n.Sum(["xent", "penalty"], ["L"])

    _check(build, {"X": rng.standard_normal((3, 4)), "label": np.array([0, 3, 1], np.int32)}, ["X"])


def test_spatial_softmax_with_loss_scale_scales_the_loss_it_differentiates(fresh):
    rng = np.random.default_rng(5)
    labels = np.array([[[0, 2], [1, -1]]], np.int32)

    def build(n):
        n.SpatialSoftmaxWithLoss(["X", "label"], ["P", "xent"], scale=3.0)
        n.Sqr(["P"], ["P2"])
        n.SumElements(["P2"], ["penalty"])
        n.Sum(["xent", "penalty"], ["L"])

    x = rng.standard_normal((1, 3, 2, 2))
    _check(build, {"X": x, "label": labels}, ["X"])
    # The loss itself is scaled (Caffe2 scaled only its gradient).
    for scale in (1.0, 3.0):
        workspace.FeedBlob("X", x)
        workspace.FeedBlob("label", labels)
        workspace.RunOperatorOnce(core.CreateOperator(
            "SpatialSoftmaxWithLoss", ["X", "label"], ["P", f"loss{scale}"], scale=scale))
    np.testing.assert_allclose(workspace.FetchBlob("loss3.0"), 3 * workspace.FetchBlob("loss1.0"))


def test_layer_norm_mean_and_std_outputs_have_gradients(fresh):
    rng = np.random.default_rng(6)

    def build(n):
        n.LayerNorm(["X"], ["Y", "mean", "std"], axis=1)
        n.Sum(["mean", "std"], ["ms"])
        n.Sqr(["ms"], ["ms2"])
        n.SumElements(["ms2"], ["L"])

    _check(build, {"X": rng.standard_normal((2, 3, 4))}, ["X"])


def test_gather_with_wrapped_indices(fresh):
    # Caffe2's maker left wrap_indices out: a negative index was an error
    # in the dense gradient, and a GradientSlice row -1 in the sparse one.
    rng = np.random.default_rng(7)
    for args in ({}, {"dense_gradient": 1}, {"axis": 1}):
        def build(n):
            n.Gather(["D", "I"], ["G"], wrap_indices=1, **args)
            n.Sqr(["G"], ["G2"])
            n.SumElements(["G2"], ["L"])

        _check(build, {"D": rng.standard_normal((4, 4)), "I": np.array([-1, 0, 3], np.int32)}, ["D"])


@pytest.mark.parametrize("op_type, outputs, extra", [
    ("SpatialBN", ["Y", "rm", "rv", "sm", "siv"], {"used": "sm"}),
    ("LRN", ["Y", "scale"], {"used": "scale"}),
])
def test_gradient_of_an_output_a_maker_cannot_use_is_an_error(fresh, op_type, outputs, extra):
    # Caffe2 dropped such a gradient silently.
    n = core.Net("n")
    if op_type == "SpatialBN":
        n.SpatialBN(["X", "s", "b", "rm", "rv"], outputs, is_test=0)
    else:
        n.LRN(["X"], outputs, size=3, alpha=0.1, beta=0.75)
    n.SumElements([extra["used"]], ["L"])
    with pytest.raises(errors.InvalidArgumentError, match=f"output '{extra['used']}'"):
        n.AddGradientOperators(["L"])
