"""The training ops (issue 14): forward values against numpy references
written here, and every gradient op against central differences through
gradient_checker (float64, random shapes from hypothesis)."""

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = dict(deadline=None, max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])


def run(op_type, inputs, outputs, **kwargs):
    """Feeds {name: array}, runs one op, returns the outputs' values."""
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


def check_grad(op, inputs, which, outputs_with_grads=(0,), step=1e-6, tol=1e-5):
    gc = GradientChecker(stepsize=step, threshold=tol)
    for i in which:
        ok, grad, _est = gc.CheckSimple(op, inputs, i, list(outputs_with_grads))
        assert ok and grad.shape == np.shape(inputs[i])


def softmax_ref(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


dims = st.integers(1, 5)
seeds = st.integers(0, 2**31 - 1)


# ------------------------------------------------------------- forward --


def test_fc_forward_matches_numpy(fresh):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    w = rng.standard_normal((5, 12)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    (y,) = run("FC", {"x": x, "w": w, "b": b}, ["y"])
    assert y.shape == (2, 5) and y.dtype == np.float32
    np.testing.assert_allclose(y, x.reshape(2, 12) @ w.T + b, rtol=1e-5, atol=1e-5)
    # axis=2 keeps the first two dims.
    w2 = rng.standard_normal((6, 4)).astype(np.float32)
    (y2,) = run("FC", {"x": x, "w": w2, "b": b[:1].repeat(6)}, ["y2"], axis=2)
    np.testing.assert_allclose(y2, x @ w2.T + b[0], rtol=1e-5, atol=1e-5)
    (yt,) = run("FCTransposed", {"x": x, "wt": np.ascontiguousarray(w.T), "b": b}, ["yt"])
    np.testing.assert_allclose(yt, y, rtol=1e-5, atol=1e-5)
    # A large Y: the bias goes in by blocks of rows (shared with the pool
    # threads the product used), the last block short.
    x = rng.standard_normal((301, 70)).astype(np.float32)
    w = rng.standard_normal((1003, 70)).astype(np.float32)
    b = rng.standard_normal(1003).astype(np.float32)
    (y,) = run("FC", {"x": x, "w": w, "b": b}, ["y"])
    ref = x.astype(np.float64) @ w.astype(np.float64).T + b
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
def test_fc_and_matmul_with_few_rows_match_numpy(fresh, m):
    # float32 products with at most 4 rows of C run on their own kernels
    # (dot products along W's rows, or multiples of B's rows added up):
    # K not a multiple of the vector width, N past the kernels' blocks and
    # large enough to be split across the kernel pool.
    rng = np.random.default_rng(m)
    for k, n in [(7, 3), (33, 17), (1030, 600), (4100, 700)]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        tol = dict(rtol=1e-4, atol=1e-4 * np.sqrt(k))
        (y,) = run("FC", {"x": x, "w": w, "b": b}, ["y"])
        np.testing.assert_allclose(y, x64 @ w64.T + b, **tol)
        dy = rng.standard_normal((m, n)).astype(np.float32)
        dw, db, dx = run("FCGradient", {"x": x, "w": w, "dy": dy}, ["dw", "db", "dx"])
        np.testing.assert_allclose(dx, dy.astype(np.float64) @ w64, **tol)
        np.testing.assert_allclose(dw, dy.T.astype(np.float64) @ x64, **tol)
        np.testing.assert_allclose(db, dy.sum(0), rtol=1e-5, atol=1e-5)
        for ta, tb in [(0, 0), (1, 0), (0, 1), (1, 1)]:
            a = np.ascontiguousarray(x.T) if ta else x
            bb = w if tb else np.ascontiguousarray(w.T)
            (c,) = run("MatMul", {"a": a, "b": bb}, ["c"], trans_a=ta, trans_b=tb)
            np.testing.assert_allclose(c, x64 @ w64.T, **tol)
            # The same bits on a second run.
            (c2,) = run("MatMul", {"a": a, "b": bb}, ["c"], trans_a=ta, trans_b=tb)
            assert c.tobytes() == c2.tobytes()


def test_fc_bad_shapes_are_typed_errors(fresh):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(errors.ShapeError, match="dimension mismatch"):
        run("FC", {"x": x, "w": np.zeros((4, 5), np.float32), "b": np.zeros(4, np.float32)}, ["y"])
    with pytest.raises(errors.ShapeError, match="bias"):
        run("FC", {"x": x, "w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}, ["y"])
    with pytest.raises(errors.DataTypeError):
        run("FC", {"x": x, "w": np.zeros((4, 3), np.float64), "b": np.zeros(4, np.float32)}, ["y"])
    # The workspace stays usable.
    (y,) = run("FC", {"x": x, "w": np.ones((4, 3), np.float32), "b": np.ones(4, np.float32)}, ["y"])
    assert (y == 1).all()


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_matmul_forward(fresh, ta, tb):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4) if not ta else (4, 3))
    b = rng.standard_normal((4, 5) if not tb else (5, 4))
    (y,) = run("MatMul", {"a": a, "b": b}, ["y"], trans_a=ta, trans_b=tb)
    np.testing.assert_allclose(y, (a.T if ta else a) @ (b.T if tb else b), rtol=1e-12)
    with pytest.raises(errors.ShapeError, match="dimension mismatch"):
        run("MatMul", {"a": a, "b": b}, ["y"], trans_a=1 - ta, trans_b=tb)


def test_activations_forward(fresh):
    x = np.array([[-2.0, -0.5, 0.0, 0.5, 3.0]], np.float32)
    (r, s, t, sm) = [run(op, {"x": x}, [op.lower()])[0] for op in ("Relu", "Sigmoid", "Tanh", "Softmax")]
    np.testing.assert_array_equal(r, np.maximum(x, 0))
    np.testing.assert_allclose(s, 1 / (1 + np.exp(-x)), rtol=1e-6)
    np.testing.assert_allclose(t, np.tanh(x), rtol=1e-6)
    np.testing.assert_allclose(sm, softmax_ref(x), rtol=1e-6)
    # Large logits do not overflow.
    (sm2,) = run("Softmax", {"z": np.array([[1000.0, 0.0]], np.float32)}, ["sm2"])
    np.testing.assert_allclose(sm2, [[1.0, 0.0]])
    # In place.
    workspace.FeedBlob("x", x)
    workspace.RunOperatorOnce(core.CreateOperator("Relu", ["x"], ["x"]))
    np.testing.assert_array_equal(workspace.FetchBlob("x"), np.maximum(x, 0))


def test_softmax_with_loss_forward(fresh):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    label = np.array([0, 2, 1, 2], np.int32)
    p, loss = run("SoftmaxWithLoss", {"x": x, "label": label}, ["p", "loss"])
    ref = softmax_ref(x.astype(np.float64))
    np.testing.assert_allclose(p, ref, rtol=1e-5)
    assert loss.shape == ()
    np.testing.assert_allclose(loss, -np.log(ref[np.arange(4), label]).mean(), rtol=1e-5)
    w = np.array([1.0, 0.0, 2.0, 1.0], np.float32)
    _, wl = run("SoftmaxWithLoss", {"x": x, "label": label, "w": w}, ["p2", "wl"], scale=0.5)
    want = 0.5 * (w * -np.log(ref[np.arange(4), label])).sum() / w.sum()
    np.testing.assert_allclose(wl, want, rtol=1e-5)
    probs = np.full((4, 3), 1 / 3, np.float32)
    _, pl = run("SoftmaxWithLoss", {"x": x, "probs": probs}, ["p3", "pl"], label_prob=1)
    np.testing.assert_allclose(pl, (-(probs * np.log(ref)).sum(axis=1)).mean(), rtol=1e-5)
    with pytest.raises(errors.InvalidArgumentError, match="label"):
        run("SoftmaxWithLoss", {"x": x, "label": np.array([0, 3, 1, 2], np.int32)}, ["p", "loss"])
    with pytest.raises(errors.DataTypeError, match="int32"):
        run("SoftmaxWithLoss", {"x": x, "label": label.astype(np.int64)}, ["p", "loss"])


def test_losses_forward(fresh):
    p = np.array([[0.2, 0.8], [0.6, 0.4], [0.0, 1.0]], np.float32)
    label = np.array([1, 0, 0], np.int32)
    (xent,) = run("LabelCrossEntropy", {"p": p, "label": label}, ["xent"])
    np.testing.assert_allclose(xent, [-np.log(0.8), -np.log(0.6), -np.log(1e-20)], rtol=1e-5)
    (avg,) = run("AveragedLoss", {"v": np.array([1.0, 2.0, 6.0], np.float32)}, ["avg"])
    assert avg.shape == () and avg == pytest.approx(3.0)
    x = np.array([[1.0, 2.0], [0.0, 0.0]], np.float32)
    y = np.array([[0.0, 0.0], [3.0, 4.0]], np.float32)
    (d,) = run("SquaredL2Distance", {"x": x, "y": y}, ["d"])
    np.testing.assert_allclose(d, [2.5, 12.5])


def test_accuracy(fresh):
    pred = np.array([[0.1, 0.9, 0.0], [0.5, 0.2, 0.3], [0.3, 0.3, 0.4], [0.4, 0.4, 0.2]], np.float32)
    label = np.array([1, 2, 2, 1], np.int32)
    (acc,) = run("Accuracy", {"pred": pred, "label": label}, ["acc"])
    # Row 3 ties: the lower index (0) ranks first, so label 1 is second.
    assert acc.shape == () and acc == pytest.approx(2 / 4)
    (acc2,) = run("Accuracy", {"pred": pred, "label": label}, ["acc2"], top_k=2)
    assert acc2 == pytest.approx(4 / 4)


def test_stop_gradient_copies(fresh):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = run("StopGradient", {"x": x}, ["y"])
    np.testing.assert_array_equal(y, x)


def test_xavier_and_msra_fill(fresh):
    (w,) = run("XavierFill", {}, ["w"], shape=[200, 50])
    s = np.sqrt(3.0 / 50)
    assert w.shape == (200, 50) and w.dtype == np.float32
    assert np.abs(w).max() <= s and np.abs(w).max() > 0.9 * s
    assert abs(w.std() - s / np.sqrt(3)) < 0.05 * s
    (m,) = run("MSRAFill", {}, ["m"], shape=[50, 400])
    assert abs(m.std() - np.sqrt(2.0 / 50)) < 0.05 * np.sqrt(2.0 / 50)
    with pytest.raises(errors.ShapeError):
        run("MSRAFill", {}, ["m"], shape=[5])


@pytest.mark.parametrize(
    "policy,kw,f",
    [
        ("fixed", {}, lambda i: 1.0),
        ("step", {"gamma": 0.5, "stepsize": 3}, lambda i: 0.5 ** (i // 3)),
        ("exp", {"gamma": 0.9}, lambda i: 0.9**i),
        ("inv", {"gamma": 0.1, "power": 0.75}, lambda i: (1 + 0.1 * i) ** -0.75),
        ("poly", {"power": 2.0, "max_iter": 10}, lambda i: (1 - i / 10) ** 2),
        ("multistep", {"gamma": 0.1, "stepsizes": [2, 5]}, lambda i: 0.1 ** ((i >= 2) + (i >= 5))),
    ],
)
def test_learning_rate_policies(fresh, policy, kw, f):
    for it in (0, 1, 4, 7):
        (lr,) = run("LearningRate", {"it": np.array([it], np.int64)}, ["lr"], base_lr=-0.1, policy=policy, **kw)
        assert lr.shape == (1,) and lr.dtype == np.float32
        assert lr[0] == pytest.approx(-0.1 * f(it), rel=1e-5)


def test_learning_rate_errors(fresh):
    with pytest.raises(errors.InvalidArgumentError, match="policy"):
        run("LearningRate", {"it": np.array([0], np.int64)}, ["lr"], base_lr=0.1, policy="nope")
    with pytest.raises(errors.InvalidArgumentError, match="base_lr"):
        run("LearningRate", {"it": np.array([0], np.int64)}, ["lr"], policy="fixed")
    with pytest.raises(errors.DataTypeError, match="int64"):
        run("LearningRate", {"it": np.array([0], np.int32)}, ["lr"], base_lr=0.1, policy="fixed")


@pytest.mark.parametrize("nesterov", [0, 1])
def test_momentum_sgd_update(fresh, nesterov):
    rng = np.random.default_rng(3)
    g, m, p = (rng.standard_normal(5).astype(np.float32) for _ in range(3))
    lr = np.array([0.1], np.float32)
    names = {"g": g, "m": m, "lr": lr, "p": p}
    for n, v in names.items():
        workspace.FeedBlob(n, v)
    workspace.RunOperatorOnce(core.CreateOperator(
        "MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g", "m", "p"], momentum=0.9, nesterov=nesterov))
    m_new = 0.9 * m + 0.1 * g
    step = (1.9 * m_new - 0.9 * m) if nesterov else m_new
    np.testing.assert_allclose(workspace.FetchBlob("m"), m_new, rtol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("g"), step, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("p"), p - step, rtol=1e-5)
    # Outputs may be other blobs (Caffe2 allowed in place, did not enforce
    # it); an output may not overwrite another input, though.
    workspace.RunOperatorOnce(core.CreateOperator(
        "MomentumSGDUpdate", ["g", "m", "lr", "p"], ["g2", "m2", "p2"], momentum=0.0))
    np.testing.assert_allclose(workspace.FetchBlob("g2"), 0.1 * step, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("p2"), p - step - 0.1 * step, rtol=1e-5)
    with pytest.raises(errors.InvalidArgumentError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "MomentumSGDUpdate", ["g", "m", "lr", "p"], ["m", "g", "p"]))


def test_adam(fresh):
    rng = np.random.default_rng(4)
    p, g = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    m1 = rng.standard_normal(4).astype(np.float32) * 0.1
    m2 = np.abs(rng.standard_normal(4)).astype(np.float32) * 0.1
    for n, v in {"p": p, "m1": m1, "m2": m2, "g": g, "lr": np.array([-0.01], np.float32),
                 "it": np.array([2], np.int64)}.items():
        workspace.FeedBlob(n, v)
    workspace.RunOperatorOnce(core.CreateOperator(
        "Adam", ["p", "m1", "m2", "g", "lr", "it"], ["p", "m1", "m2"], beta1=0.8, beta2=0.99, epsilon=1e-6))
    a = 0.8 * m1 + 0.2 * g
    b = 0.99 * m2 + 0.01 * g * g
    corr = np.sqrt(1 - 0.99**3) / (1 - 0.8**3)
    np.testing.assert_allclose(workspace.FetchBlob("m1"), a, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("m2"), b, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("p"), p - 0.01 * corr * a / (np.sqrt(b) + 1e-6), rtol=1e-5)


# ---------------------------------------------------------- gradients --


@settings(**SETTINGS)
@given(m=dims, k=dims, n=dims, seed=seeds, transposed=st.booleans())
def test_fc_gradient(fresh, m, k, n, seed, transposed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k))
    w = rng.standard_normal((k, n) if transposed else (n, k))
    b = rng.standard_normal(n)
    op = core.CreateOperator("FCTransposed" if transposed else "FC", ["X", "W", "b"], ["Y"])
    check_grad(op, [x, w, b], [0, 1, 2])


@settings(**SETTINGS)
@given(m=dims, k=dims, n=dims, seed=seeds, ta=st.booleans(), tb=st.booleans())
def test_matmul_gradient(fresh, m, k, n, seed, ta, tb):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if ta else (m, k))
    b = rng.standard_normal((n, k) if tb else (k, n))
    op = core.CreateOperator("MatMul", ["A", "B"], ["Y"], trans_a=int(ta), trans_b=int(tb))
    check_grad(op, [a, b], [0, 1])


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=1, max_size=3), seed=seeds,
       op_type=st.sampled_from(["Relu", "Sigmoid", "Tanh", "Softmax"]))
def test_activation_gradients(fresh, shape, seed, op_type):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if op_type == "Relu":
        # Keep away from the kink, where the difference quotient is wrong.
        x = np.where(np.abs(x) < 0.05, 0.5, x)
    if op_type == "Softmax" and len(shape) == 1:
        x = x.reshape(1, -1)
    check_grad(core.CreateOperator(op_type, ["X"], ["Y"]), [x], [0])


@settings(**SETTINGS)
@given(n=dims, d=st.integers(2, 5), seed=seeds, weighted=st.booleans(), scale=st.sampled_from([1.0, 0.5]))
def test_softmax_with_loss_gradient(fresh, n, d, seed, weighted, scale):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    label = rng.integers(0, d, n).astype(np.int32)
    inputs, names = [x, label], ["X", "label"]
    if weighted:
        inputs.append(rng.uniform(0.5, 2.0, n))
        names.append("w")
    op = core.CreateOperator("SoftmaxWithLoss", names, ["P", "loss"], scale=scale)
    check_grad(op, inputs, [0], outputs_with_grads=(1,))


@settings(**SETTINGS)
@given(n=dims, d=st.integers(2, 5), seed=seeds)
def test_softmax_with_loss_prob_labels_gradient(fresh, n, d, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    t = rng.uniform(0.1, 1.0, (n, d))
    t /= t.sum(axis=1, keepdims=True)
    op = core.CreateOperator("SoftmaxWithLoss", ["X", "T"], ["P", "loss"], label_prob=1)
    check_grad(op, [x, t], [0], outputs_with_grads=(1,))


@settings(**SETTINGS)
@given(n=dims, d=st.integers(2, 5), seed=seeds)
def test_label_cross_entropy_and_averaged_loss_gradients(fresh, n, d, seed):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.2, 1.0, (n, d))
    label = rng.integers(0, d, n).astype(np.int32)
    check_grad(core.CreateOperator("LabelCrossEntropy", ["P", "label"], ["Y"]), [p, label], [0])
    check_grad(core.CreateOperator("AveragedLoss", ["P"], ["L"]), [p], [0])


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=1, max_size=3), seed=seeds)
def test_squared_l2_distance_gradient(fresh, shape, seed):
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal(shape), rng.standard_normal(shape)
    check_grad(core.CreateOperator("SquaredL2Distance", ["X", "Y"], ["D"]), [x, y], [0, 1])


@st.composite
def broadcast_pair(draw):
    a = draw(st.lists(dims, min_size=1, max_size=3))
    k = draw(st.integers(0, len(a)))
    b = [1 if draw(st.booleans()) else d for d in a[len(a) - k:]]
    if draw(st.booleans()):
        return b, a  # the broadcast side may be either
    return a, b


@settings(**SETTINGS)
@given(shapes=broadcast_pair(), seed=seeds, op_type=st.sampled_from(["Add", "Sub", "Mul"]))
def test_elementwise_gradients_with_broadcast(fresh, shapes, seed, op_type):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1])
    check_grad(core.CreateOperator(op_type, ["A", "B"], ["C"]), [a, b], [0, 1])


@settings(**SETTINGS)
@given(a=st.lists(dims, min_size=2, max_size=3), seed=seeds, op_type=st.sampled_from(["Add", "Mul"]))
def test_elementwise_gradients_legacy_broadcast(fresh, a, seed, op_type):
    rng = np.random.default_rng(seed)
    b_shape = a[1:2]  # B's dims start at axis 1
    x, y = rng.standard_normal(a), rng.standard_normal(b_shape)
    op = core.CreateOperator(op_type, ["A", "B"], ["C"], broadcast=1, axis=1)
    check_grad(op, [x, y], [0, 1])


def test_gradient_ops_reject_bad_shapes(fresh):
    with pytest.raises(errors.ShapeError):
        run("AddGradient", {"dc": np.zeros((2, 3)), "a": np.zeros((2, 3)), "b": np.zeros((4,))}, ["da", "db"])
    with pytest.raises(errors.ShapeError):
        run("ReluGradient", {"y": np.zeros((2, 3)), "dy": np.zeros((3, 2))}, ["dx"])
    with pytest.raises(errors.ShapeError):
        run("FCGradient", {"x": np.zeros((2, 3)), "w": np.zeros((4, 3)), "dy": np.zeros((2, 5))},
            ["dw", "db", "dx"])


def test_math_ops_forward(fresh):
    x = np.array([[0.5, 1.0, 4.0], [2.0, 0.25, 9.0]], np.float32)
    n = -x + 1.0
    for op_type, arg, want in [
        ("Exp", x, np.exp(x)), ("Log", x, np.log(x)), ("Sqrt", x, np.sqrt(x)),
        ("Negative", x, -x), ("Abs", n, np.abs(n)),
    ]:
        (y,) = run(op_type, {"x": arg}, ["y"])
        np.testing.assert_allclose(y, want, rtol=1e-6, err_msg=op_type)
    (lr,) = run("LeakyRelu", {"x": n}, ["lr"], alpha=0.2)
    np.testing.assert_allclose(lr, np.where(n > 0, n, 0.2 * n), rtol=1e-6)
    (lr0,) = run("LeakyRelu", {"x": n}, ["lr0"])
    np.testing.assert_allclose(lr0, np.where(n > 0, n, 0.01 * n), rtol=1e-6)


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=1, max_size=3), seed=seeds,
       op_type=st.sampled_from(["Exp", "Log", "Sqrt", "Negative", "Abs", "LeakyRelu"]))
def test_math_op_gradients(fresh, shape, seed, op_type):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 2.0, shape)
    if op_type in ("Abs", "LeakyRelu", "Negative"):
        x = x * rng.choice([-1.0, 1.0], shape)  # both signs, away from the kink at 0
    kwargs = {"alpha": 0.3} if op_type == "LeakyRelu" else {}
    check_grad(core.CreateOperator(op_type, ["X"], ["Y"], **kwargs), [x], [0])


# ------------------------------------------------- SpatialSoftmaxWithLoss --


def spatial_swl_ref(x, labels, weights=None):
    """numpy: softmax over dim 1 at each pixel; loss = weighted mean of
    -log p[label] over the pixels whose label is not -1."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    w = np.ones(labels.shape) if weights is None else weights
    total = wsum = 0.0
    for i, y, xx in np.ndindex(*labels.shape):
        t = labels[i, y, xx]
        if t != -1:
            total += -np.log(max(p[i, t, y, xx], 1e-20)) * w[i, y, xx]
            wsum += w[i, y, xx]
    return p, (total / wsum if wsum else 0.0)


@pytest.mark.parametrize("weighted", [False, True])
def test_spatial_softmax_with_loss_and_its_gradient(fresh, weighted):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 2, 2))
    labels = rng.integers(0, 3, (2, 2, 2)).astype(np.int32)
    labels[0, 1, 1] = -1  # a pixel that does not count
    inputs = {"x": x, "t": labels}
    w = None
    if weighted:
        w = rng.random((2, 2, 2)) + 0.5
        inputs["w"] = w
    p, loss = run("SpatialSoftmaxWithLoss", inputs, ["p", "loss"])
    want_p, want_loss = spatial_swl_ref(x, labels, w)
    np.testing.assert_allclose(p, want_p, rtol=1e-12)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-12)
    op = core.CreateOperator("SpatialSoftmaxWithLoss", list(inputs), ["p", "loss"])
    ok, grad, est = GradientChecker(stepsize=1e-6, threshold=1e-5).CheckSimple(op, list(inputs.values()), 0, [1])
    assert ok, (grad, est)
    # The -1 pixel gets no gradient.
    assert np.all(grad[0, :, 1, 1] == 0)


def test_spatial_softmax_with_loss_errors(fresh):
    x = np.zeros((1, 2, 2, 2))
    with pytest.raises(errors.InvalidArgumentError, match="label 2 is outside"):
        run("SpatialSoftmaxWithLoss", {"x": x, "t": np.full((1, 2, 2), 2, np.int32)}, ["p", "l"])
    with pytest.raises(errors.ShapeError, match=r"must have shape \[1, 2, 2\]"):
        run("SpatialSoftmaxWithLoss", {"x": x, "t": np.zeros((1, 2), np.int32)}, ["p", "l"])
    with pytest.raises(errors.ShapeError, match="4 dims"):
        run("SpatialSoftmaxWithLoss", {"x": np.zeros((2, 2)), "t": np.zeros((2,), np.int32)}, ["p", "l"])
    # Every pixel ignored: the loss is 0.
    _, loss = run("SpatialSoftmaxWithLoss", {"x": x, "t": np.full((1, 2, 2), -1, np.int32)}, ["p", "l"])
    assert loss == 0.0
