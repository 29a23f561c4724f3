"""The second slice of issue 14's ops: forward values against numpy
references written here, and every gradient against float64 central
differences through gradient_checker (shapes and arguments from hypothesis,
a few examples each)."""

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker
from ferrocaffe.proto import caffe2_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = dict(deadline=None, max_examples=6, suppress_health_check=[HealthCheck.function_scoped_fixture])

dims = st.integers(1, 4)
seeds = st.integers(0, 2**31 - 1)


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


def check_grad(op, inputs, which, outputs_with_grads=(0,), step=1e-6, tol=1e-5):
    gc = GradientChecker(stepsize=step, threshold=tol)
    for i in which:
        ok, grad, _est = gc.CheckSimple(op, inputs, i, list(outputs_with_grads))
        assert ok and grad.shape == np.shape(inputs[i])


def seeded(op, seed=7):
    op.device_option.CopyFrom(caffe2_pb2.DeviceOption(random_seed=seed))
    return op


# --------------------------------------------------------- BatchMatMul --


@settings(**SETTINGS)
@given(batch=st.lists(dims, min_size=0, max_size=2), m=dims, k=dims, n=dims, seed=seeds,
       ta=st.booleans(), tb=st.booleans())
def test_batch_matmul_forward_and_gradient(fresh, batch, m, k, n, seed, ta, tb):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch + ([k, m] if ta else [m, k]))
    b = rng.standard_normal(batch + ([n, k] if tb else [k, n]))
    (y,) = run("BatchMatMul", {"A": a, "B": b}, ["Y"], trans_a=int(ta), trans_b=int(tb))
    want = np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)
    op = core.CreateOperator("BatchMatMul", ["A", "B"], ["Y"], trans_a=int(ta), trans_b=int(tb))
    check_grad(op, [a, b], [0, 1])


@pytest.mark.parametrize("sa,sb", [([3], [3]), ([2, 3], [3]), ([3], [3, 4]), ([2, 1, 2, 3], [5, 3, 4]), ([4, 2, 3], [3, 2])])
def test_batch_matmul_broadcast_is_numpy_matmul(fresh, sa, sb):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    (y,) = run("BatchMatMul", {"A": a, "B": b}, ["Y"], broadcast=1)
    want = np.matmul(a, b)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_batch_matmul_errors(fresh):
    a, b = np.zeros((2, 3, 4), np.float32), np.zeros((3, 4, 5), np.float32)
    with pytest.raises(errors.ShapeError, match="batch dims"):
        run("BatchMatMul", {"A": a, "B": b}, ["Y"])
    with pytest.raises(errors.ShapeError, match="dimension mismatch"):
        run("BatchMatMul", {"A": a, "B": np.zeros((2, 3, 5), np.float32)}, ["Y"])
    # (broadcast=1 has a gradient now: tests/train/test_op_gradients.py)


@settings(**SETTINGS)
@given(m1=dims, m2=dims, k1=dims, k2=dims, n=dims, seed=seeds, ta=st.booleans(), tb=st.booleans())
def test_matmul_nd_with_axes_gradient(fresh, m1, m2, k1, k2, n, seed, ta, tb):
    """A is (m1, m2, k1, k2) flattened at axis 2 (or (k1, k2, m1, m2) when
    transposed); B is (k1*k2, n) stored as (k1, k2, n) at axis 2."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal([k1, k2, m1, m2] if ta else [m1, m2, k1, k2])
    b = rng.standard_normal([n, k1, k2] if tb else [k1, k2, n])
    ax_b = 1 if tb else 2
    (y,) = run("MatMul", {"A": a, "B": b}, ["Y"], axis_a=2, axis_b=ax_b, trans_a=int(ta), trans_b=int(tb))
    a2 = a.reshape(k1 * k2, m1 * m2).T if ta else a.reshape(m1 * m2, k1 * k2)
    b2 = b.reshape(n, k1 * k2).T if tb else b.reshape(k1 * k2, n)
    np.testing.assert_allclose(y, a2 @ b2, rtol=1e-10, atol=1e-12)
    op = core.CreateOperator("MatMul", ["A", "B"], ["Y"], axis_a=2, axis_b=ax_b, trans_a=int(ta), trans_b=int(tb))
    check_grad(op, [a, b], [0, 1])


# ------------------------------------------------------------- losses --


def test_cross_entropy_forward_and_errors(fresh):
    x = np.array([[0.2, 0.8], [0.5, 0.5]], np.float32)
    t = np.array([[0.0, 1.0], [0.3, 0.7]], np.float32)
    (y,) = run("CrossEntropy", {"x": x, "t": t}, ["y"])
    np.testing.assert_allclose(y, -(t * np.log(x)).sum(axis=1), rtol=1e-6)
    with pytest.raises(errors.InvalidArgumentError, match="soft label"):
        run("CrossEntropy", {"x": x, "t": t * 2}, ["y"])
    with pytest.raises(errors.ShapeError):
        run("CrossEntropy", {"x": x, "t": t[:1]}, ["y"])


@settings(**SETTINGS)
@given(n=dims, d=dims, seed=seeds)
def test_cross_entropy_gradient(fresh, n, d, seed):
    rng = np.random.default_rng(seed)
    x, t = rng.uniform(0.2, 1.0, (n, d)), rng.uniform(0.0, 1.0, (n, d))
    check_grad(core.CreateOperator("CrossEntropy", ["X", "T"], ["Y"]), [x, t], [0])


def sigmoid_xent_ref(x, t, mode):
    s = 1 / (1 + np.exp(-x))
    if mode == "plain":
        term = t * np.log(s) + (1 - t) * np.log(1 - s)
    elif mode == "log_D_trick":
        term = (2 * t - 1) * np.log(s)
    else:  # unjoined: t log s + (1 - t) log(1 - s), written without the join
        term = t * x - (1 - t) * np.log1p(np.exp(x))
    return -term.mean(axis=-1)


MODES = {"plain": {}, "log_D_trick": {"log_D_trick": 1}, "unjoined": {"unjoined_lr_loss": 1}}


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=1, max_size=3), seed=seeds, mode=st.sampled_from(sorted(MODES)))
def test_sigmoid_cross_entropy_with_logits(fresh, shape, seed, mode):
    rng = np.random.default_rng(seed)
    x, t = rng.standard_normal(shape) * 2, rng.uniform(0, 1, shape)
    (y,) = run("SigmoidCrossEntropyWithLogits", {"X": x, "T": t}, ["Y"], **MODES[mode])
    assert y.shape == tuple(shape[:-1])
    np.testing.assert_allclose(y, sigmoid_xent_ref(x, t, mode), rtol=1e-9, atol=1e-12)
    op = core.CreateOperator("SigmoidCrossEntropyWithLogits", ["X", "T"], ["Y"], **MODES[mode])
    check_grad(op, [x, t], [0])


def test_sigmoid_cross_entropy_large_logits_and_flags(fresh):
    x = np.array([[1000.0, -1000.0]], np.float32)
    t = np.array([[1.0, 0.0]], np.float32)
    (y,) = run("SigmoidCrossEntropyWithLogits", {"X": x, "T": t}, ["Y"])
    assert y.shape == (1,) and y[0] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(errors.InvalidArgumentError, match="simultaneously"):
        run("SigmoidCrossEntropyWithLogits", {"X": x, "T": t}, ["Y"], log_D_trick=1, unjoined_lr_loss=1)


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=1, max_size=3), seed=seeds)
def test_l1_distance(fresh, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    y = x + rng.choice([-1.0, 1.0], shape) * rng.uniform(0.1, 1.0, shape)  # away from the kink
    (d,) = run("L1Distance", {"X": x, "Y": y}, ["D"])
    np.testing.assert_allclose(d, np.abs(x - y).reshape(shape[0], -1).sum(axis=1), rtol=1e-12)
    check_grad(core.CreateOperator("L1Distance", ["X", "Y"], ["D"]), [x, y], [0, 1])


# ------------------------------------------------------------- Dropout --


def test_dropout_train_and_test(fresh):
    x = np.random.default_rng(0).standard_normal((100, 50)).astype(np.float32)
    workspace.FeedBlob("x", x)
    workspace.RunOperatorOnce(seeded(core.CreateOperator("Dropout", ["x"], ["y", "mask"], ratio=0.3)))
    y, mask = workspace.FetchBlob("y"), workspace.FetchBlob("mask")
    assert mask.dtype == np.bool_ and mask.shape == x.shape
    # 5000 Bernoulli(0.7) draws: the kept fraction is 0.7 within 5 sigma.
    assert abs(mask.mean() - 0.7) < 5 * np.sqrt(0.7 * 0.3 / x.size)
    np.testing.assert_allclose(y, np.where(mask, x / 0.7, 0), rtol=1e-6)
    # The same seed gives the same mask.
    workspace.RunOperatorOnce(seeded(core.CreateOperator("Dropout", ["x"], ["y2", "mask2"], ratio=0.3)))
    np.testing.assert_array_equal(workspace.FetchBlob("mask2"), mask)
    (yt,) = run("Dropout", {"x": x}, ["yt"], ratio=0.3, is_test=1)
    np.testing.assert_array_equal(yt, x)
    (y0, m0) = run("Dropout", {"x": x}, ["y0", "m0"], ratio=0.0)
    np.testing.assert_array_equal(y0, x)
    assert m0.all()
    (g,) = run("DropoutGrad", {"dy": x, "mask": mask}, ["dx"], ratio=0.3)
    np.testing.assert_allclose(g, np.where(mask, x / 0.7, 0), rtol=1e-6)
    with pytest.raises(errors.InvalidArgumentError, match="ratio"):
        run("Dropout", {"x": x}, ["y"], ratio=1.5)


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=1, max_size=3), seed=seeds, is_test=st.booleans())
def test_dropout_gradient(fresh, shape, seed, is_test):
    x = np.random.default_rng(seed).standard_normal(shape)
    op = seeded(core.CreateOperator("Dropout", ["X"], ["Y", "mask"], ratio=0.4, is_test=int(is_test)), seed)
    check_grad(op, [x], [0])


# ------------------------------------------------------------ reshapes --


def test_reshape_forward_and_errors(fresh):
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    y, old = run("Reshape", {"x": x}, ["y", "old"], shape=[0, -1])
    assert y.shape == (2, 12) and old.dtype == np.int64
    np.testing.assert_array_equal(old, [2, 3, 4])
    np.testing.assert_array_equal(y, x.reshape(2, 12))
    y2, _ = run("Reshape", {"x": x, "s": np.array([4, 6], np.int64)}, ["y2", "old2"])
    np.testing.assert_array_equal(y2, x.reshape(4, 6))
    with pytest.raises(errors.InvalidArgumentError, match="more than one"):
        run("Reshape", {"x": x}, ["y", "old"], shape=[-1, -1])
    with pytest.raises(errors.ShapeError):
        run("Reshape", {"x": x}, ["y", "old"], shape=[5, 5])
    with pytest.raises(errors.InvalidArgumentError, match="do not pass"):
        run("Reshape", {"x": x, "s": np.array([4, 6], np.int64)}, ["y", "old"], shape=[4, 6])
    with pytest.raises(errors.InvalidArgumentError, match="missing"):
        run("Reshape", {"x": x}, ["y", "old"])


def test_flatten_squeeze_expand_forward(fresh):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (f,) = run("Flatten", {"x": x}, ["f"])
    np.testing.assert_array_equal(f, x.reshape(2, 12))
    (f2,) = run("Flatten", {"x": x}, ["f2"], axis=2)
    np.testing.assert_array_equal(f2, x.reshape(6, 4))
    (v,) = run("FlattenToVec", {"x": x}, ["v"])
    np.testing.assert_array_equal(v, x.reshape(-1))
    (e,) = run("ExpandDims", {"x": x}, ["e"], dims=[0, 4])
    assert e.shape == (1, 2, 3, 4, 1)
    (s,) = run("Squeeze", {"e": e}, ["s"], dims=[0, 4])
    np.testing.assert_array_equal(s, x)
    with pytest.raises(errors.InvalidArgumentError, match="not 1"):
        run("Squeeze", {"x": x}, ["s"], dims=[1])
    with pytest.raises(errors.InvalidArgumentError):
        run("ExpandDims", {"x": x}, ["e"], dims=[5])


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=2, max_size=3), seed=seeds,
       which=st.sampled_from(["Reshape", "Flatten", "FlattenToVec", "ExpandDims", "Squeeze"]))
def test_reshape_family_gradients(fresh, shape, seed, which):
    rng = np.random.default_rng(seed)
    if which == "Reshape":
        op = core.CreateOperator("Reshape", ["X"], ["Y", "old"], shape=[-1, shape[-1]])
    elif which == "Flatten":
        op = core.CreateOperator("Flatten", ["X"], ["Y"], axis=len(shape) - 1)
    elif which == "Squeeze":
        shape = shape[:1] + [1] + shape[1:]
        op = core.CreateOperator("Squeeze", ["X"], ["Y"], dims=[1])
    elif which == "ExpandDims":
        op = core.CreateOperator("ExpandDims", ["X"], ["Y"], dims=[0, 2])
    else:
        op = core.CreateOperator(which, ["X"], ["Y"])
    check_grad(op, [rng.standard_normal(shape)], [0])


# ---------------------------------------------------------- reductions --


@st.composite
def axes_of(draw):
    shape = draw(st.lists(dims, min_size=1, max_size=4))
    axes = draw(st.none() | st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape)))
    return shape, axes


@settings(**SETTINGS)
@given(sa=axes_of(), keep=st.booleans(), seed=seeds, op_type=st.sampled_from(["ReduceSum", "ReduceMean"]))
def test_reduce_sum_mean(fresh, sa, keep, seed, op_type):
    shape, axes = sa
    x = np.random.default_rng(seed).standard_normal(shape)
    kw = {"keepdims": int(keep)}
    if axes is not None:
        kw["axes"] = axes
    (y,) = run(op_type, {"X": x}, ["Y"], **kw)
    np_axes = None if axes is None else tuple(sorted({a % len(shape) for a in axes}))
    f = np.sum if op_type == "ReduceSum" else np.mean
    want = f(x, axis=np_axes, keepdims=keep)
    assert y.shape == np.shape(want)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)
    check_grad(core.CreateOperator(op_type, ["X"], ["Y"], **kw), [x], [0])


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=1, max_size=4), data=st.data(), seed=seeds,
       op_type=st.sampled_from(["ReduceFrontSum", "ReduceBackSum", "ReduceFrontMean", "ReduceBackMean"]))
def test_reduce_front_back(fresh, shape, data, seed, op_type):
    k = data.draw(st.integers(1, len(shape)))
    x = np.random.default_rng(seed).standard_normal(shape)
    (y,) = run(op_type, {"X": x}, ["Y"], num_reduce_dim=k)
    axes = tuple(range(k)) if "Front" in op_type else tuple(range(len(shape) - k, len(shape)))
    want = (np.sum if "Sum" in op_type else np.mean)(x, axis=axes)
    assert y.shape == np.shape(want)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)
    check_grad(core.CreateOperator(op_type, ["X"], ["Y"], num_reduce_dim=k), [x], [0])


# -------------------------------------------------------------- sparse --


def test_gather_forward(fresh):
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([[3, 0], [1, 1]], np.int64)
    (y,) = run("Gather", {"d": data, "i": idx}, ["y"])
    np.testing.assert_array_equal(y, data[idx])
    (y1,) = run("Gather", {"d": data, "i": np.array([2, 0], np.int32)}, ["y1"], axis=1)
    np.testing.assert_array_equal(y1, data[:, [2, 0]])
    (s,) = run("Gather", {"s": np.array([b"a", b"b", b"c"], object), "i": np.array([2, 2], np.int32)}, ["g"])
    assert list(s) == [b"c", b"c"]
    with pytest.raises(errors.InvalidArgumentError, match="out of range"):
        run("Gather", {"d": data, "i": np.array([4], np.int32)}, ["y"])
    (w,) = run("Gather", {"d": data, "i": np.array([-1], np.int32)}, ["w"], wrap_indices=1)
    np.testing.assert_array_equal(w, data[[-1]])
    # Caffe2's rule for an empty DATA: an empty output shaped like it.
    (e,) = run("Gather", {"e": np.zeros((0, 2, 3), np.float32), "i": np.array([4, 1], np.int32)}, ["eo"])
    assert e.shape == (0, 2, 3)
    (e2,) = run("Gather", {"d": data, "i": np.zeros(0, np.int32)}, ["e2"])
    assert e2.shape == (0, 3)


@settings(**SETTINGS)
@given(n=dims, d=dims, k=st.integers(1, 6), seed=seeds, dense_gradient=st.booleans())
def test_gather_gradient(fresh, n, d, k, seed, dense_gradient):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, d))
    idx = rng.integers(0, n, k).astype(np.int32)  # duplicates sum
    op = core.CreateOperator("Gather", ["D", "I"], ["Y"], dense_gradient=int(dense_gradient))
    _, g = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert isinstance(g[0], core.GradientSlice) != dense_gradient
    check_grad(op, [data, idx], [0])


def sls_ref(data, idx, lengths):
    out, k = [], 0
    for n in lengths:
        out.append(data[idx[k:k + n]].sum(axis=0))
        k += n
    return np.array(out).reshape((len(lengths),) + data.shape[1:])


@settings(**SETTINGS)
@given(n=dims, d=dims, lengths=st.lists(st.integers(0, 3), min_size=1, max_size=4), seed=seeds)
def test_sparse_lengths_sum(fresh, n, d, lengths, seed):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, d))
    idx = rng.integers(0, n, sum(lengths)).astype(np.int64)
    lens = np.array(lengths, np.int32)
    (y,) = run("SparseLengthsSum", {"D": data, "I": idx, "L": lens}, ["Y"])
    np.testing.assert_allclose(y, sls_ref(data, idx, lengths), rtol=1e-12, atol=1e-12)
    op = core.CreateOperator("SparseLengthsSum", ["D", "I", "L"], ["Y"])
    _, g = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert g[0] == core.GradientSlice("I", "D_grad_values") and g[1:] == [None, None]
    check_grad(op, [data, idx, lens], [0])


def test_sparse_lengths_sum_errors(fresh):
    data = np.zeros((3, 2), np.float32)
    with pytest.raises(errors.InvalidArgumentError, match="sum to"):
        run("SparseLengthsSum", {"D": data, "I": np.array([0, 1], np.int32), "L": np.array([3], np.int32)}, ["Y"])
    with pytest.raises(errors.InvalidArgumentError, match="out of range"):
        run("SparseLengthsSum", {"D": data, "I": np.array([3], np.int32), "L": np.array([1], np.int32)}, ["Y"])
    with pytest.raises(errors.DataTypeError):
        run("SparseLengthsSum", {"D": data, "I": np.array([0.0]), "L": np.array([1], np.int32)}, ["Y"])


def test_sparse_to_dense_and_scatter_weighted_sum(fresh):
    idx = np.array([2, 0, 2], np.int32)
    vals = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    (d,) = run("SparseToDense", {"i": idx, "v": vals, "like": np.zeros((4, 2), np.float32)}, ["d"])
    np.testing.assert_array_equal(d, [[3, 4], [0, 0], [6, 8], [0, 0]])
    (d2,) = run("SparseToDense", {"i": idx, "v": vals}, ["d2"])
    assert d2.shape == (3, 2)
    x0 = np.ones((4, 2), np.float32)
    for n, v in {"x0": x0, "w0": np.array([2.0], np.float32), "i": np.array([1, 3], np.int64),
                 "x1": vals[:2], "w1": np.array([-0.5], np.float32)}.items():
        workspace.FeedBlob(n, v)
    workspace.RunOperatorOnce(core.CreateOperator("ScatterWeightedSum", ["x0", "w0", "i", "x1", "w1"], ["x0"]))
    want = x0.copy()
    want[[1, 3]] = 2 * want[[1, 3]] - 0.5 * vals[:2]
    np.testing.assert_allclose(workspace.FetchBlob("x0"), want)


def test_scatter_weighted_sum_scales_a_repeated_row_once_per_index(fresh):
    # Caffe2's order: every indexed row is scaled by W0 (twice for an index
    # given twice), then each W * X[i] is added to row INDICES[i].
    x0 = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    x1 = np.array([[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]], np.float32)
    idx = np.array([0, 0, 1], np.int32)
    for n, v in {"x0": x0, "w0": np.array([3.0], np.float32), "i": idx,
                 "x1": x1, "w1": np.array([0.5], np.float32)}.items():
        workspace.FeedBlob(n, v)
    workspace.RunOperatorOnce(core.CreateOperator("ScatterWeightedSum", ["x0", "w0", "i", "x1", "w1"], ["x0"]))
    want = x0.copy()
    for r in idx:
        want[r] *= 3.0
    for k, r in enumerate(idx):
        want[r] += 0.5 * x1[k]
    # By hand: row 0 = 9 * [1, 2] + 0.5 * ([10, 20] + [30, 40]).
    np.testing.assert_allclose(want[0], [29.0, 48.0])
    np.testing.assert_allclose(workspace.FetchBlob("x0"), want)


# ---------------------------------------------------------- math ops --


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=1, max_size=3), seed=seeds, exponent=st.sampled_from([2.0, 3.0, 0.5, -1.5]))
def test_pow(fresh, shape, seed, exponent):
    x = np.random.default_rng(seed).uniform(0.5, 2.0, shape)
    (y,) = run("Pow", {"X": x}, ["Y"], exponent=exponent)
    np.testing.assert_allclose(y, x**exponent, rtol=1e-12)
    check_grad(core.CreateOperator("Pow", ["X"], ["Y"], exponent=exponent), [x], [0])
    e = np.random.default_rng(seed + 1).uniform(0.5, 2.0, shape)
    (y2,) = run("Pow", {"X": x, "E": e}, ["Y2"])
    np.testing.assert_allclose(y2, x**e, rtol=1e-12)
    check_grad(core.CreateOperator("Pow", ["X", "E"], ["Y"]), [x, e], [0, 1])


def test_pow_errors(fresh):
    with pytest.raises(errors.InvalidArgumentError, match="exponent"):
        run("Pow", {"x": np.ones(3, np.float32)}, ["y"])
    with pytest.raises(errors.ShapeError):
        run("Pow", {"x": np.ones(3, np.float32), "e": np.ones(2, np.float32)}, ["y"])


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=1, max_size=3), seed=seeds)
def test_clip(fresh, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, shape)
    x = np.where(np.abs(np.abs(x) - 1) < 0.05, 0.0, x)  # away from the bounds
    (y,) = run("Clip", {"X": x}, ["Y"], min=-1.0, max=1.0)
    np.testing.assert_array_equal(y, np.clip(x, -1, 1))
    check_grad(core.CreateOperator("Clip", ["X"], ["Y"], min=-1.0, max=1.0), [x], [0])
    (y2,) = run("Clip", {"X": x}, ["Y2"], min=0.0)
    np.testing.assert_array_equal(y2, np.maximum(x, 0))


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=1, max_size=3), seed=seeds)
def test_div_gradient(fresh, shape, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    b = rng.uniform(0.5, 2.0, shape[-1:]) * rng.choice([-1.0, 1.0], shape[-1:])
    check_grad(core.CreateOperator("Div", ["A", "B"], ["C"]), [a, b], [0, 1])


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=2, max_size=3), seed=seeds, data=st.data())
def test_concat_split_transpose_gradients(fresh, shape, seed, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(0, len(shape) - 1))
    other = list(shape)
    other[axis] = data.draw(dims)
    a, b = rng.standard_normal(shape), rng.standard_normal(other)
    check_grad(core.CreateOperator("Concat", ["A", "B"], ["C", "split"], axis=axis), [a, b], [0, 1])
    x = np.concatenate([a, b], axis=axis)
    split = core.CreateOperator("Split", ["X"], ["P", "Q"], axis=axis, split=[shape[axis], other[axis]])
    check_grad(split, [x], [0], outputs_with_grads=(0, 1))
    # Only the second output has a gradient: the first gets zeros.
    check_grad(split, [x], [0], outputs_with_grads=(1,))
    perm = data.draw(st.permutations(range(len(shape))))
    check_grad(core.CreateOperator("Transpose", ["X"], ["Y"], axes=list(perm)), [a], [0])
    check_grad(core.CreateOperator("Transpose", ["X"], ["Y"]), [a], [0])


def test_cast_copy_weighted_sum_gradients(fresh):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3))
    check_grad(core.CreateOperator("Cast", ["X"], ["Y"], to=core.DataType.DOUBLE, from_type=core.DataType.DOUBLE), [x], [0])
    ops, g = core.GradientRegistry.GetGradientForOp(
        core.CreateOperator("Cast", ["X"], ["Y"], to=core.DataType.FLOAT, from_type=core.DataType.DOUBLE), ["Y_grad"])
    assert {a.name: a.i for a in ops[0].arg} == {"to": core.DataType.DOUBLE, "from_type": core.DataType.FLOAT}
    with pytest.raises(errors.InvalidArgumentError, match="from_type"):
        core.GradientRegistry.GetGradientForOp(core.CreateOperator("Cast", ["X"], ["Y"], to=1), ["Y_grad"])
    check_grad(core.CreateOperator("Copy", ["X"], ["Y"]), [x], [0])
    x32 = x.astype(np.float32)
    w0, w1 = np.array([0.5], np.float32), np.array([-2.0], np.float32)
    z = rng.standard_normal((2, 3)).astype(np.float32)
    op = core.CreateOperator("WeightedSum", ["X", "w0", "Z", "w1"], ["Y"], grad_on_w=1)
    check_grad(op, [x32, w0, z, w1], [0, 1, 2, 3], step=1e-2, tol=1e-2)


# ------------------------------------------------------------- Adagrad --


def test_adagrad_ops_against_numpy(fresh):
    rng = np.random.default_rng(9)
    p, g = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    m = np.abs(rng.standard_normal((4, 3))).astype(np.float32)
    lr = np.array([-0.1], np.float32)
    for n, v in {"p": p, "m": m, "g": g, "lr": lr}.items():
        workspace.FeedBlob(n, v)
    workspace.RunOperatorOnce(core.CreateOperator(
        "Adagrad", ["p", "m", "g", "lr"], ["p", "m", "eff", "upd"], epsilon=1e-4, decay=0.9, weight_decay=0.1))
    gg = g + 0.1 * p
    m_new = 0.9 * m + gg * gg
    eff = -0.1 / (np.sqrt(m_new) + 1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("m"), m_new, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("eff"), eff, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("upd"), eff * gg, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("p"), p + eff * gg, rtol=1e-5)

    idx = np.array([2, 0, 2], np.int64)
    sg = rng.standard_normal((3, 3)).astype(np.float32)
    for n, v in {"p": p, "m": m, "i": idx, "sg": sg}.items():
        workspace.FeedBlob(n, v)
    workspace.RunOperatorOnce(core.CreateOperator("SparseAdagrad", ["p", "m", "i", "sg", "lr"], ["p", "m"], epsilon=1e-4))
    wp, wm = p.copy(), m.copy()
    for k, r in enumerate(idx):  # in order: a repeated row is updated twice
        wm[r] += sg[k] ** 2
        wp[r] += -0.1 * sg[k] / (np.sqrt(wm[r]) + 1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("p"), wp, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("m"), wm, rtol=1e-5)

    rm = np.abs(rng.standard_normal(4)).astype(np.float32)
    for n, v in {"p": p, "rm": rm}.items():
        workspace.FeedBlob(n, v)
    workspace.RunOperatorOnce(core.CreateOperator(
        "RowWiseSparseAdagrad", ["p", "rm", "i", "sg", "lr"], ["p", "rm"], epsilon=1e-4))
    wp, wm = p.copy(), rm.copy()
    for k, r in enumerate(idx):
        wm[r] += (sg[k] ** 2).mean()
        wp[r] += -0.1 * sg[k] / (np.sqrt(wm[r]) + 1e-4)
    np.testing.assert_allclose(workspace.FetchBlob("p"), wp, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("rm"), wm, rtol=1e-5)
    with pytest.raises(errors.ShapeError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "RowWiseSparseAdagrad", ["p", "m", "i", "sg", "lr"], ["p", "m"]))
    with pytest.raises(errors.InvalidArgumentError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "Adagrad", ["p", "m", "g", "lr"], ["p2", "m"]))


@pytest.mark.parametrize("nesterov", [0, 1])
def test_sparse_momentum_sgd_update_against_numpy(fresh, nesterov):
    rng = np.random.default_rng(10)
    p, m = rng.standard_normal((4, 2)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    idx = np.array([3, 1, 3], np.int32)
    g = rng.standard_normal((3, 2)).astype(np.float32)
    lr = np.array([0.1], np.float32)
    for n, v in {"g": g, "m": m, "lr": lr, "p": p, "i": idx}.items():
        workspace.FeedBlob(n, v)
    workspace.RunOperatorOnce(core.CreateOperator(
        "SparseMomentumSGDUpdate", ["g", "m", "lr", "p", "i"], ["g", "m", "p"], momentum=0.9, nesterov=nesterov))
    wp, wm, wg = p.copy(), m.copy(), g.copy()
    for k, r in enumerate(idx):
        m_new = 0.9 * wm[r] + 0.1 * g[k]
        step = 1.9 * m_new - 0.9 * wm[r] if nesterov else m_new
        wm[r], wg[k] = m_new, step
        wp[r] -= step
    np.testing.assert_allclose(workspace.FetchBlob("m"), wm, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("g"), wg, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("p"), wp, rtol=1e-5)


def test_sparse_adam_against_numpy(fresh):
    rng = np.random.default_rng(11)
    p = rng.standard_normal((4, 2)).astype(np.float32)
    m1 = rng.standard_normal((4, 2)).astype(np.float32) * 0.1
    m2 = np.abs(rng.standard_normal((4, 2))).astype(np.float32) * 0.1
    idx = np.array([2, 0], np.int64)
    g = rng.standard_normal((2, 2)).astype(np.float32)
    for n, v in {"p": p, "m1": m1, "m2": m2, "i": idx, "g": g, "lr": np.array([-0.01], np.float32),
                 "it": np.array([4], np.int64)}.items():
        workspace.FeedBlob(n, v)
    workspace.RunOperatorOnce(core.CreateOperator(
        "SparseAdam", ["p", "m1", "m2", "i", "g", "lr", "it"], ["p", "m1", "m2"], beta1=0.8, beta2=0.99, epsilon=1e-6))
    wp, w1, w2 = p.copy(), m1.copy(), m2.copy()
    corr = np.sqrt(1 - 0.99**5) / (1 - 0.8**5)
    for k, r in enumerate(idx):
        w1[r] = 0.8 * w1[r] + 0.2 * g[k]
        w2[r] = 0.99 * w2[r] + 0.01 * g[k] ** 2
        wp[r] += -0.01 * corr * w1[r] / (np.sqrt(w2[r]) + 1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("m1"), w1, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("m2"), w2, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("p"), wp, rtol=1e-5)


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=2, max_size=3), seed=seeds, data=st.data())
def test_softmax_with_axis_gradient(fresh, shape, seed, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    x = np.random.default_rng(seed).standard_normal(shape)
    (y,) = run("Softmax", {"X": x}, ["Y"], axis=axis)
    rows = x.reshape(int(np.prod(shape[:axis])), -1)
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, (e / e.sum(axis=1, keepdims=True)).reshape(shape), rtol=1e-10)
    check_grad(core.CreateOperator("Softmax", ["X"], ["Y"], axis=axis), [x], [0])


@settings(**SETTINGS)
@given(outer=dims, n=dims, inner=dims, k=st.integers(1, 5), seed=seeds)
def test_gather_on_axis_1_and_batch_gather(fresh, outer, n, inner, k, seed):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((outer, n, inner))
    idx = rng.integers(0, n, k).astype(np.int64)
    for op_type, kw in (("Gather", {"axis": 1}), ("BatchGather", {})):
        (y,) = run(op_type, {"D": data, "I": idx}, ["Y"], **kw)
        np.testing.assert_array_equal(y, np.take(data, idx, axis=1))
        op = core.CreateOperator(op_type, ["D", "I"], ["Y"], **kw)
        ops, g = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
        assert ops[0].type == "BatchGatherGradient" and g == ["D_grad", None]
        check_grad(op, [data, idx], [0])


@settings(**SETTINGS)
@given(rows=dims, cols=dims, seed=seeds,
       op_type=st.sampled_from(["ReduceFrontSum", "ReduceBackSum", "ReduceFrontMean", "ReduceBackMean"]))
def test_reduce_front_back_with_lengths(fresh, rows, cols, seed, op_type):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols))
    front, mean = "Front" in op_type, "Mean" in op_type
    full, n_out = (rows, cols) if front else (cols, rows)
    lengths = rng.integers(0, full + 1, n_out).astype(np.int32)
    (y,) = run(op_type, {"X": x, "L": lengths}, ["Y"])
    m = x.T if front else x  # one row per output element
    want = np.array([m[o, :n].sum() / (n if mean and n else 1) for o, n in enumerate(lengths)])
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    check_grad(core.CreateOperator(op_type, ["X", "L"], ["Y"]), [x, lengths], [0])
    with pytest.raises(errors.InvalidArgumentError):
        run(op_type, {"X": x, "L": np.full(n_out, full + 1, np.int32)}, ["Y"])


@settings(**SETTINGS)
@given(rows=dims, cols=dims, seed=seeds, front=st.booleans(), with_lengths=st.booleans())
def test_reduce_front_back_max(fresh, rows, cols, seed, front, with_lengths):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols))
    op_type = "ReduceFrontMax" if front else "ReduceBackMax"
    full, n_out = (rows, cols) if front else (cols, rows)
    lengths = rng.integers(1, full + 1, n_out).astype(np.int32)
    m = x.T if front else x
    inputs = {"X": x, "L": lengths} if with_lengths else {"X": x}
    (y,) = run(op_type, inputs, ["Y"])
    want = [m[o, :n].max() for o, n in enumerate(lengths)] if with_lengths else m.max(axis=1)
    np.testing.assert_array_equal(y, want)
    check_grad(core.CreateOperator(op_type, list(inputs), ["Y"]), list(inputs.values()), [0])


@pytest.mark.parametrize("op_type", ["ReduceFrontSum", "ReduceBackMean"])
def test_front_back_gradient_takes_x_or_its_shape(fresh, op_type):
    x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    dy = np.random.default_rng(4).standard_normal((3, 4) if "Front" in op_type else (2, 3)).astype(np.float32)
    (dx,) = run(op_type + "Gradient", {"dY": dy, "X": x}, ["dX"])
    (dx1,) = run(op_type + "Gradient", {"dY": dy, "S": np.array(x.shape, np.int64)}, ["dX1"])
    np.testing.assert_array_equal(dx, dx1)
    assert dx.shape == x.shape


@pytest.mark.parametrize("old,new,want", [
    ((4, 2, 1), (0, -1, 0), (4, 2, 1)),
    ((4, 3, 2), (-1, 0), (8, 3)),
    ((0, 0), (0, 0, 0), (0, 0, 0)),  # a 0 past the input's dims stays 0
    ((2, 0), (-1, 0), (0, 0)),  # empty input: the -1 becomes 0
    ((4, 0), (1, -1), (1, 0)),
    ((0,), (0, -1), (0, 0)),
    ((), (1, -1), (1, 1)),
])
def test_reshape_zero_and_missing_dims(fresh, old, new, want):
    x = np.zeros(old, np.float32)
    for via_input in (False, True):
        if via_input:
            y, s = run("Reshape", {"x": x, "s": np.array(new, np.int64)}, ["y", "s_old"])
        else:
            y, s = run("Reshape", {"x": x}, ["y", "s_old"], shape=list(new))
        assert y.shape == want and list(s) == list(old)
    # The gradient takes the old shape back.
    net = core.Net("rg")
    net.AddExternalInput("x", "dy")
    out, _ = net.Reshape(["x"], ["y", "old"], shape=list(new))
    net.AddGradientOperators({out: "dy"})
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("dy", np.ones(want, np.float32))
    workspace.RunNetOnce(net)
    assert workspace.FetchBlob("x_grad").shape == old


@settings(**SETTINGS)
@given(n=dims, d=dims, lengths=st.lists(st.integers(0, 3), min_size=1, max_size=4), seed=seeds,
       op_type=st.sampled_from(["SparseLengthsMean", "LengthsSum", "LengthsMean"]))
def test_lengths_reducers(fresh, n, d, lengths, seed, op_type):
    rng = np.random.default_rng(seed)
    sparse, mean = op_type.startswith("Sparse"), "Mean" in op_type
    lens = np.array(lengths, np.int32)
    data = rng.standard_normal((n if sparse else int(lens.sum()), d))
    idx = rng.integers(0, n, int(lens.sum())).astype(np.int32) if sparse else np.arange(int(lens.sum()))
    want, k = [], 0
    for m in lengths:
        rows = data[idx[k:k + m]]
        want.append(rows.mean(axis=0) if mean and m else rows.sum(axis=0))
        k += m
    names = ["D", "I", "L"] if sparse else ["D", "L"]
    inputs = [data, idx, lens] if sparse else [data, lens]
    (y,) = run(op_type, dict(zip(names, inputs)), ["Y"])
    np.testing.assert_allclose(y, np.array(want).reshape(len(lengths), d), rtol=1e-12, atol=1e-12)
    op = core.CreateOperator(op_type, names, ["Y"])
    _, g = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    assert isinstance(g[0], core.GradientSlice) == sparse
    check_grad(op, inputs, [0])


def weighted_sls_ref(data, weights, idx, lengths):
    out, k = [], 0
    for n in lengths:
        rows = data[idx[k:k + n]] * weights[k:k + n].reshape((n,) + (1,) * (data.ndim - 1))
        out.append(rows.sum(axis=0))
        k += n
    return np.array(out).reshape((len(lengths),) + data.shape[1:])


@settings(**SETTINGS)
@given(n=dims, inner=st.lists(dims, min_size=0, max_size=2), lengths=st.lists(st.integers(0, 3), min_size=1, max_size=4),
       seed=seeds, sparse=st.booleans(), grad_on_weights=st.booleans())
def test_lengths_weighted_sum(fresh, n, inner, lengths, seed, sparse, grad_on_weights):
    rng = np.random.default_rng(seed)
    lens = np.array(lengths, np.int32)
    total = int(lens.sum())
    data = rng.standard_normal(((n if sparse else total),) + tuple(inner))
    weights = rng.standard_normal(total)
    idx = rng.integers(0, n, total).astype(np.int32) if sparse else np.arange(total)
    op_type = "SparseLengthsWeightedSum" if sparse else "LengthsWeightedSum"
    names = ["D", "W", "I", "L"] if sparse else ["D", "W", "L"]
    inputs = [data, weights, idx, lens] if sparse else [data, weights, lens]
    (y,) = run(op_type, dict(zip(names, inputs)), ["Y"])
    np.testing.assert_allclose(y, weighted_sls_ref(data, weights, idx, lengths), rtol=1e-12, atol=1e-12)

    op = core.CreateOperator(op_type, names, ["Y"], grad_on_weights=int(grad_on_weights))
    ops, g = core.GradientRegistry.GetGradientForOp(op, ["Y_grad"])
    # Caffe2's makers: (SCALARS, dY, LENGTHS) -> the DATA gradient (its
    # values, sparse over INDICES); with grad_on_weights the
    # ...WithMainInputGradient op also reads DATA (and INDICES) and gives
    # SCALARS' gradient.
    d_data = "D_grad_values" if sparse else "D_grad"
    if grad_on_weights:
        want_in = ["W", "Y_grad", names[-1], "D"] + (["I"] if sparse else [])
        assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
            (op_type + "WithMainInputGradient", want_in, [d_data, "W_grad"])]
    else:
        assert [(o.type, list(o.input), list(o.output)) for o in ops] == [
            (op_type + "Gradient", ["W", "Y_grad", names[-1]], [d_data])]
    assert g[0] == (core.GradientSlice("I", d_data) if sparse else d_data)
    assert g[1] == ("W_grad" if grad_on_weights else None)
    assert all(x is None for x in g[2:])
    check_grad(op, inputs, [0, 1] if grad_on_weights else [0])


def test_lengths_weighted_sum_errors(fresh):
    data = np.zeros((3, 2), np.float32)
    ones = np.ones(2, np.float32)
    with pytest.raises(errors.ShapeError, match="SCALARS"):
        run("SparseLengthsWeightedSum", {"D": data, "W": np.ones(3, np.float32), "I": np.array([0, 1], np.int32),
                                         "L": np.array([2], np.int32)}, ["Y"])
    with pytest.raises(errors.ShapeError, match="SCALARS"):
        run("LengthsWeightedSum", {"D": data, "W": ones, "L": np.array([3], np.int32)}, ["Y"])
    with pytest.raises(errors.DataTypeError, match="'W'"):
        run("SparseLengthsWeightedSum", {"D": data, "W": ones.astype(np.float64), "I": np.array([0, 1], np.int32),
                                         "L": np.array([2], np.int32)}, ["Y"])
    with pytest.raises(errors.InvalidArgumentError, match="out of range"):
        run("SparseLengthsWeightedSum", {"D": data, "W": ones, "I": np.array([0, 3], np.int32),
                                         "L": np.array([2], np.int32)}, ["Y"])
    with pytest.raises(errors.InvalidArgumentError, match="sum to"):
        run("SparseLengthsWeightedSum", {"D": data, "W": ones, "I": np.array([0, 1], np.int32),
                                         "L": np.array([1], np.int32)}, ["Y"])
    with pytest.raises(errors.InvalidArgumentError, match="grad_on_weight"):
        workspace.RunOperatorOnce(core.CreateOperator(
            "SparseLengthsWeightedSum", ["D", "W", "I", "L"], ["Y"], grad_on_weight=1))


def test_lengths_sum_checks_the_lengths(fresh):
    with pytest.raises(errors.InvalidArgumentError, match="sum to"):
        run("LengthsSum", {"D": np.zeros((3, 2), np.float32), "L": np.array([1, 1], np.int32)}, ["Y"])


def test_huge_sizes_from_inputs_are_typed_errors(fresh):
    dy = np.ones(3, np.float32)
    with pytest.raises(errors.OutOfMemoryError):
        run("ReduceFrontSumGradient", {"dY": dy, "S": np.array([2**45, 3], np.int64)}, ["dX"])
    with pytest.raises(errors.InvalidArgumentError, match="too many"):
        run("ReduceFrontSumGradient", {"dY": dy, "S": np.array([2**62, 2**62, 3], np.int64)}, ["dX"])
    with pytest.raises((errors.OutOfMemoryError, errors.InvalidArgumentError)):
        run("SparseToDense", {"i": np.array([2**61], np.int64), "v": np.ones((1, 4), np.float32)}, ["d"])
    # The workspace is still usable.
    (y,) = run("ReduceFrontSum", {"X": np.ones((2, 3), np.float32)}, ["Y"])
    np.testing.assert_array_equal(y, [2, 2, 2])


@settings(**SETTINGS)
@given(shape=st.lists(dims, min_size=1, max_size=3), seed=seeds)
def test_weighted_sigmoid_cross_entropy_with_logits(fresh, shape, seed):
    rng = np.random.default_rng(seed)
    x, t, w = rng.standard_normal(shape) * 2, rng.uniform(0, 1, shape), rng.uniform(0, 2, shape)
    (y,) = run("WeightedSigmoidCrossEntropyWithLogits", {"X": x, "T": t, "W": w}, ["Y"])
    s = 1 / (1 + np.exp(-x))
    want = -(w * (t * np.log(s) + (1 - t) * np.log(1 - s))).mean(axis=-1)
    np.testing.assert_allclose(y, want, rtol=1e-9, atol=1e-12)
    op = core.CreateOperator("WeightedSigmoidCrossEntropyWithLogits", ["X", "T", "W"], ["Y"])
    check_grad(op, [x, t, w], [0])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_sum_of_integers(fresh, dtype):
    x = np.arange(24, dtype=dtype).reshape(2, 3, 4)
    (y,) = run("ReduceSum", {"X": x}, ["Y"], axes=[0, 2], keepdims=0)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, x.sum(axis=(0, 2)))
    (z,) = run("ReduceSum", {"X": x}, ["Z"])
    np.testing.assert_array_equal(z, x.sum(keepdims=True))
    with pytest.raises(errors.DataTypeError):
        run("ReduceMean", {"X": x}, ["M"])
