"""Gradients of blobs read more than once (issue 27): every read of a blob,
repeated reads inside one op included, contributes its own gradient, and no
gradient op overwrites a gradient another reader still needs.

Each expected value is the analytic derivative written out in numpy here,
and central differences of the same net (run in float64) agree with it."""

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace

X0 = np.array([0.5, -2.0, 3.0], np.float64)
W0 = np.array([1.5, 0.25, -1.0], np.float64)


def central(net, loss, feeds, blob, eps=1e-6):
    """d loss / d blob by central differences of the forward net."""
    x = np.array(feeds[blob])
    g = np.zeros(x.shape, np.float64)
    for k in range(x.size):
        vals = []
        for d in (eps, -eps):
            xx = x.copy()
            xx.reshape(-1)[k] += d
            for name, v in feeds.items():
                workspace.FeedBlob(name, xx if name == blob else v)
            workspace.RunNetOnce(net)
            vals.append(float(np.sum(workspace.FetchBlob(loss))))
        g.reshape(-1)[k] = (vals[0] - vals[1]) / (2 * eps)
    return g


def gradients(build, feeds, dtype=np.float32, numeric=np.float64):
    """Builds the forward net with ``build(net) -> loss``, adds its
    gradient, runs it on ``feeds`` (cast to ``dtype``) and returns the
    gradient of each fed blob, with central differences of the forward net
    (in ``numeric``, float64 unless an op has float32 only)."""
    fwd = core.Net("fwd")
    loss = build(fwd)
    net = fwd.Clone("with_grad")
    grads = net.AddGradientOperators([loss])
    for name, v in feeds.items():
        workspace.FeedBlob(name, np.asarray(v, dtype))
    workspace.RunNetOnce(net)
    got = {name: workspace.FetchBlob(grads[name]) for name in feeds if name in grads}
    eps = 1e-6 if numeric == np.float64 else 1e-2
    num = {name: central(fwd, str(loss), {k: np.asarray(v, numeric) for k, v in feeds.items()}, name, eps)
           for name in got}
    return got, num, grads


CASES = [
    # id, build, feeds, analytic gradients
    ("mul_then_add",
     lambda n: n.SumElements([n.Add([n.Mul(["X", "X"], ["Y"]), "X"], ["Z"])], ["L"]),
     {"X": X0}, {"X": 2 * X0 + 1}),
    ("mul_scale_add",
     lambda n: n.SumElements([n.Add([n.Mul(["X", "X"], ["Y"]), n.Scale(["X"], ["S"], scale=3.0)], ["Z"])], ["L"]),
     {"X": X0}, {"X": 2 * X0 + 3}),
    ("sqr_plus_x_via_add",
     lambda n: n.SumElements([n.Add([n.Sqr(["X"], ["Y"]), "X"], ["Z"])], ["L"]),
     {"X": X0}, {"X": 2 * X0 + 1}),
    ("sqr_plus_x_via_sum",
     lambda n: n.SumElements([n.Sum([n.Sqr(["X"], ["Y"]), "X"], ["Z"])], ["L"]),
     {"X": X0}, {"X": 2 * X0 + 1}),
    ("sqr_times_x",
     lambda n: n.SumElements([n.Mul([n.Sqr(["X"], ["Y"]), "X"], ["Z"])], ["L"]),
     {"X": X0}, {"X": 3 * X0 ** 2}),
    ("concat_x_x",
     lambda n: n.SumElements([n.Concat(["X", "X"], ["C", "C_info"], axis=0)[0]], ["L"]),
     {"X": X0}, {"X": np.full(3, 2.0)}),
    ("sum_x_x_x",
     lambda n: n.SumElements([n.Sum(["X", "X", "X"], ["Y"])], ["L"]),
     {"X": X0}, {"X": np.full(3, 3.0)}),
    ("mean_x_x_squared",
     lambda n: n.SumElements([n.Sqr([n.Mean(["X", "X"], ["M"])], ["Q"])], ["L"]),
     {"X": X0}, {"X": 2 * X0}),
    ("sub_x_x_with_another_reader",
     lambda n: n.SumElements([n.Add([n.Sub(["X", "X"], ["D"]), n.Sqr(["X"], ["Q"])], ["Z"])], ["L"]),
     {"X": X0}, {"X": 2 * X0}),
    ("mul_x_x_with_another_reader",
     lambda n: n.SumElements([n.Sub([n.Mul(["X", "X"], ["P"]), n.Tanh(["X"], ["T"])], ["Z"])], ["L"]),
     {"X": X0}, {"X": 2 * X0 - (1 - np.tanh(X0) ** 2)}),
    ("sqr_w_twice_sum_b0_x_x",
     lambda n: (n.Sqr(["W"], ["b0"]), n.Sqr(["W"], ["b1"]),
                n.SumElements([n.Sum(["b0", "X", "X"], ["b2"])], ["L"]))[-1],
     {"W": W0, "X": X0}, {"W": 2 * W0, "X": np.full(3, 2.0)}),
    ("div_x_x_plus_x",
     lambda n: n.SumElements([n.Add([n.Div(["X", "X"], ["Q"]), "X"], ["Z"])], ["L"]),
     {"X": X0}, {"X": np.ones(3)}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_each_read_contributes_its_gradient(fresh, case, dtype):
    _, build, feeds, want = case
    got, num, _ = gradients(build, feeds, dtype)
    for name, w in want.items():
        np.testing.assert_allclose(num[name], w, rtol=1e-5, atol=1e-6)
        tol = 1e-5 if dtype == np.float32 else 1e-10
        np.testing.assert_allclose(got[name], w, rtol=tol, atol=tol)
        assert got[name].dtype == dtype


def test_weighted_sum_of_x_w_x_w(fresh):
    # WeightedSum is float32 only (as in Caffe2): differences in float32.
    got, num, _ = gradients(lambda n: n.SumElements([n.WeightedSum(["X", "w", "X", "w"], ["Y"])], ["L"]),
                            {"X": X0, "w": np.array([0.75])}, numeric=np.float32)
    np.testing.assert_allclose(num["X"], np.full(3, 1.5), rtol=1e-3)
    np.testing.assert_allclose(got["X"], np.full(3, 1.5), rtol=1e-6)


def test_mul_then_add_is_named_x_grad(fresh):
    # The issue's example, read back by Caffe2's name for the gradient.
    n = core.Net("g")
    n.Mul(["X", "X"], ["Y"])
    n.Add(["Y", "X"], ["Z"])
    n.SumElements(["Z"], ["L"])
    n.AddGradientOperators(["L"])
    workspace.FeedBlob("X", np.array([1.0, 2.0, 3.0], np.float32))
    workspace.RunNetOnce(n)
    np.testing.assert_allclose(workspace.FetchBlob("X_grad"), [3.0, 5.0, 7.0])


def test_matmul_and_batch_matmul_of_x_with_itself(fresh):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 3))
    xb = rng.standard_normal((2, 3, 3))
    got, num, _ = gradients(lambda n: n.SumElements([n.MatMul(["X", "X"], ["Y"])], ["L"]), {"X": x})
    # d sum(X X) / dX = 1 X' + X' 1
    ones = np.ones((3, 3))
    np.testing.assert_allclose(num["X"], ones @ x.T + x.T @ ones, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["X"], ones @ x.T + x.T @ ones, rtol=1e-5, atol=1e-5)
    got, num, _ = gradients(lambda n: n.SumElements([n.BatchMatMul(["X", "X"], ["Y"])], ["L"]), {"X": xb})
    want = np.stack([ones @ m.T + m.T @ ones for m in xb])
    np.testing.assert_allclose(num["X"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["X"], want, rtol=1e-5, atol=1e-5)


def test_a_maker_that_scales_its_output_gradient_in_place_spoils_no_other_reader(fresh):
    """Caffe2's own Sqr maker scaled dY in place; Add's inputs share their
    output's gradient, so the other input's gradient was doubled. A maker
    registered that way now gets a private copy of dY to scale."""
    from ferrocaffe.gradients import GradientRegistry

    saved = GradientRegistry.gradient_registry_["Sqr"]
    builtins = "Sqr" in GradientRegistry._builtins

    def caffe2_sqr(op, g_output):
        dy, dx = g_output[0], op.input[0] + "_grad"
        return [
            core.CreateOperator("Scale", [dy], [dy], scale=2.0),
            core.CreateOperator("Mul", [dy, op.input[0]], [dx]),
        ], [dx]

    try:
        core.GradientRegistry.RegisterGradient("Sqr")(caffe2_sqr)
        got, num, grads = gradients(
            lambda n: n.SumElements([n.Sum([n.Sqr(["X"], ["Q"]), "W"], ["Z"])], ["L"]),
            {"X": X0, "W": W0})
        np.testing.assert_allclose(got["X"], 2 * X0, rtol=1e-6)
        np.testing.assert_allclose(got["W"], np.ones(3), rtol=1e-6)
        np.testing.assert_allclose(num["W"], np.ones(3), rtol=1e-6)
        # the loss's own gradient, returned in the map, is still ones
        np.testing.assert_allclose(workspace.FetchBlob(grads["Z"]), np.ones(3))
    finally:
        GradientRegistry.gradient_registry_["Sqr"] = saved
        if builtins:
            GradientRegistry._builtins.add("Sqr")
            GradientRegistry._copy_args.discard("Sqr")


def test_overwritten_blob_keeps_its_readers_gradient(fresh):
    """Q's gradient is X's (a pass-through of Sum) at the version Sum wrote;
    the older X's gradient, made later in the backward pass under the same
    name, must not overwrite it."""
    def build(n):
        n.Scale(["X"], ["T"], scale=3.0)
        n.Sum(["Q"], ["X"])   # X is overwritten: a new version
        n.Add(["T", "X"], ["Z"])
        return n.SumElements(["Z"], ["L"])

    fwd = core.Net("fwd")
    loss = build(fwd)
    grads = fwd.AddGradientOperators([loss])
    assert str(grads["Q"]) != str(grads["X"])
    workspace.FeedBlob("X", X0.astype(np.float32))
    workspace.FeedBlob("Q", W0.astype(np.float32))
    workspace.RunNetOnce(fwd)
    np.testing.assert_allclose(workspace.FetchBlob(grads["Q"]), np.ones(3))
    np.testing.assert_allclose(workspace.FetchBlob(grads["X"]), np.full(3, 3.0))


def test_a_maker_may_return_one_operator(fresh):
    # Caffe2's protocol: one OperatorDef, a list, or None.
    from ferrocaffe.gradients import GradientRegistry

    n = core.Net("one")
    n.Scale(["X"], ["Y"], scale=2.0)
    op = n.Proto().op[0]

    def one(op, g_output):
        return core.CreateOperator("Scale", [g_output[0]], [op.input[0] + "_grad"], scale=2.0), \
            [op.input[0] + "_grad"]

    saved = GradientRegistry.gradient_registry_["Scale"]
    try:
        core.GradientRegistry.RegisterGradient("Scale")(one)
        ops, g = core.GradientRegistry.GetBackwardPass([op], {"Y": "Y_grad"})
        assert [(o.type, list(o.input), list(o.output)) for o in ops] == [("Scale", ["Y_grad"], ["X_grad"])]
        assert str(g["X"]) == "X_grad"
    finally:
        GradientRegistry.gradient_registry_["Scale"] = saved
        GradientRegistry._builtins.add("Scale")
        GradientRegistry._copy_args.add("Scale")


def test_float64_loss_is_seeded_in_float64(fresh):
    n = core.Net("f64")
    n.SumElements([n.Sqr(["X"], ["Y"])], ["L"])
    n.AddGradientOperators(["L"])
    workspace.FeedBlob("X", X0)
    workspace.RunNetOnce(n)
    assert workspace.FetchBlob("L_autogen_grad").dtype == np.float64
    np.testing.assert_allclose(workspace.FetchBlob("X_grad"), 2 * X0, rtol=1e-12)


# Found by the gradient fuzzer (test_gradient_fuzz.py), shrunk by hypothesis.

def test_in_place_op_whose_gradient_reads_its_input_is_refused(fresh):
    """Sqr(b0) -> b0 in place: Sqr's gradient reads X, which the op itself
    overwrote. Caffe2 took the name for the output and computed 2 Y dY
    (silently wrong); the input's version is checked now."""
    n = core.Net("found1")
    n.Split(["P0"], ["b0", "b0_b", "b0_c"], axis=1)
    n.Sqr(["b0"], ["b0"])
    with pytest.raises(errors.InvalidArgumentError, match='needs input "b0" at version 0, but currently we have version 1'):
        n.AddGradientOperators({"b0": "b0_seed"})


def test_gradient_of_a_later_version_is_not_passed_through(fresh):
    """b5 = Sum(P0) is overwritten by Sqr(P0) before anything reads it; the
    loss's gradient belongs to the second b5. Caffe2 passed it through Sum
    to P0 as well (silently doubling a term); now it is the version error
    Caffe2 gave when a gradient op read it."""
    n = core.Net("found2")
    n.Sum(["P0"], ["b5"])
    n.Sqr(["P0"], ["b5"])
    with pytest.raises(errors.InvalidArgumentError, match='is expected to correspond to version 0 of "b5", but currently we have version 1'):
        n.AddGradientOperators({"b5": "b5_seed"})


def test_in_place_op_whose_gradient_reads_its_output_is_fine(fresh):
    # Tanh's gradient reads Y: in place is as good as not.
    got, num, _ = gradients(
        lambda n: n.SumElements([n.Tanh([n.Scale(["X"], ["H"], scale=2.0)], ["H"])], ["L"]), {"X": X0})
    want = 2 * (1 - np.tanh(2 * X0) ** 2)
    np.testing.assert_allclose(num["X"], want, rtol=1e-5)
    np.testing.assert_allclose(got["X"], want, rtol=1e-5, atol=1e-6)
