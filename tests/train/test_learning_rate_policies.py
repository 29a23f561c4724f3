"""LearningRate's policies (issue 35) and SparseAdagrad's counter_halflife,
against plain-Python models of Caffe2's rules written here."""

import math

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace


def lr_at(it, **kwargs):
    workspace.FeedBlob("it", np.array([it], np.int64))
    workspace.RunOperatorOnce(core.CreateOperator("LearningRate", ["it"], ["lr"], **kwargs))
    out = workspace.FetchBlob("lr")
    assert out.dtype == np.float32 and out.shape == (1,)
    return float(out[0])


# The models: the multiplier of base_lr at an iteration.


def alter(it, active_first, active, inactive):
    pos = it % (active + inactive)
    first = active if active_first else inactive
    in_first = pos < first
    return 1.0 if in_first == active_first else 0.0


def linear_warmup(it, start, n):
    return 1.0 if it >= n else start + (1 - start) * it / n


def hill(it, n, start, gamma, power, end):
    if it < n:
        return linear_warmup(it, start, n)
    return max(end, (1 + gamma * (it - n)) ** -power)


def slope(it, n1, m1, n2, m2):
    if it < n1:
        return m1
    return max(m2, m1 + (it - n1) * (m2 - m1) / (n2 - n1))


def cyclical(it, base_lr, max_lr, step, decay):
    period = 2 * step
    cycle = it // period
    # Triangle wave: 0 at the start of a cycle, 1 at its middle.
    tri = 1 - abs((it - cycle * period) / step - 1)
    return 1 + (abs(max_lr) / abs(base_lr) - 1) * max(0.0, tri) * decay ** cycle


def cosine(it, lo, hi, period, t_mult, shrink):
    if t_mult == 1:
        k = it // period
        t_i, t_cur = period, it - k * period
    else:
        k, start, t_i = 0, 0, period
        while it >= start + t_i:
            start += t_i
            t_i *= t_mult
            k += 1
        t_cur = it - start
    s = shrink ** k
    return lo * s + 0.5 * (hi - lo) * s * (1 + math.cos(math.pi * t_cur / t_i))


def warmup(it, start, nc, nl):
    if it < nc:
        return start
    return linear_warmup(it - nc, start, nl)


ITERS = [0, 1, 2, 7, 10, 11, 49, 50, 99, 100, 101, 257, 1000, 12345]


@pytest.mark.parametrize("active_first", [True, False])
def test_alter(fresh, active_first):
    for it in ITERS:
        got = lr_at(it, base_lr=0.3, policy="alter", active_first=active_first,
                    active_period=7, inactive_period=4)
        assert got == pytest.approx(0.3 * alter(it, active_first, 7, 4), rel=1e-6)


def test_hill(fresh):
    kw = dict(num_iter=100, start_multiplier=1e-3, gamma=0.5, power=0.75, end_multiplier=0.05)
    for it in ITERS:
        got = lr_at(it, base_lr=0.2, policy="hill", **kw)
        want = 0.2 * hill(it, 100, 1e-3, 0.5, 0.75, 0.05)
        assert got == pytest.approx(want, rel=1e-5)


def test_slope_and_gate(fresh):
    for it in ITERS:
        got = lr_at(it, base_lr=0.5, policy="slope", num_iter_1=10, multiplier_1=1.0,
                    num_iter_2=110, multiplier_2=0.25)
        assert got == pytest.approx(0.5 * slope(it, 10, 1.0, 110, 0.25), rel=1e-5)
        got = lr_at(it, base_lr=-0.5, policy="gate", num_iter=50, multiplier_1=0.2, multiplier_2=-3.0)
        assert got == pytest.approx(-0.5 * (0.2 if it < 50 else -3.0), rel=1e-6)


def test_warmups_and_pieces(fresh):
    for it in ITERS:
        assert lr_at(it, base_lr=2.0, policy="linearWarmup", start_multiplier=0.1, num_iter=100) == \
            pytest.approx(2.0 * linear_warmup(it, 0.1, 100), rel=1e-5)
        assert lr_at(it, base_lr=2.0, policy="constantWarmup", multiplier=0.3, num_iter=11) == \
            pytest.approx(2.0 * (0.3 if it < 11 else 1.0), rel=1e-6)
        want = 0.1 if it < 10 else (0.4 if it < 100 else 0.9)
        assert lr_at(it, base_lr=1.0, policy="pieceWarmup", m1=0.1, n1=10, m2=0.4, n2=100, m3=0.9) == \
            pytest.approx(want, rel=1e-6)
        assert lr_at(it, base_lr=1.0, policy="constantThenLinearWarmup", start_warmup_multiplier=0.2,
                     constant_warmup_num_iter=10, linear_warmup_num_iter=90) == \
            pytest.approx(warmup(it, 0.2, 10, 90), rel=1e-5)


def test_defaults_of_constant_warmup(fresh):
    # multiplier 0.5, num_iter 0: the multiplier never applies.
    assert lr_at(0, base_lr=1.0, policy="constantWarmup") == 1.0
    assert lr_at(3, base_lr=1.0, policy="constantWarmup", num_iter=5) == 0.5


def test_cyclical_and_composite_cyclical(fresh):
    for it in ITERS:
        got = lr_at(it, base_lr=0.01, policy="cyclical", max_lr=0.05, stepsize=25, decay=0.9)
        assert got == pytest.approx(0.01 * cyclical(it, 0.01, 0.05, 25, 0.9), rel=1e-5)
        got = lr_at(it, base_lr=0.01, policy="compositeCyclical", start_warmup_multiplier=0.5,
                    constant_warmup_num_iter=5, linear_warmup_num_iter=20, cyclical_max_lr=0.03,
                    cyclical_step_size=30, cyclical_decay=0.8)
        want = warmup(it, 0.5, 5, 20) if it < 25 else cyclical(it - 25, 0.01, 0.03, 30, 0.8)
        assert got == pytest.approx(0.01 * want, rel=1e-5)


@pytest.mark.parametrize("t_mult", [1.0, 2.0])
def test_cosine_and_composite_cosine(fresh, t_mult):
    for it in ITERS:
        got = lr_at(it, base_lr=1.0, policy="cosine", min_lr=0.1, max_lr=0.9, period=50,
                    t_mult=t_mult, lr_shrink=0.9)
        assert got == pytest.approx(cosine(it, 0.1, 0.9, 50, t_mult, 0.9), rel=1e-5, abs=1e-7)
        got = lr_at(it, base_lr=1.0, policy="compositeCosine", start_warmup_multiplier=0.5,
                    constant_warmup_num_iter=3, linear_warmup_num_iter=7, cosine_min_lr=0.01,
                    cosine_max_lr=0.05, cosine_period=40, cosine_t_mult=t_mult, cosine_lr_shrink=0.99)
        want = warmup(it, 0.5, 3, 7) if it < 10 else cosine(it - 10, 0.01, 0.05, 40, t_mult, 0.99)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7)


def test_lr_scale_multiplies_base_lr(fresh):
    assert lr_at(4, base_lr=0.5, policy="exp", gamma=0.5, lr_scale=3.0) == pytest.approx(1.5 * 0.5 ** 4)


def test_composite_feeds_the_global_iteration_to_each_sub_policy(fresh):
    # Sub-policy i covers [1 + sum(n[:i]), 1 + sum(n[:i+1])); iteration 0
    # belongs to the first.
    n = [5, 7, 3, 4]
    scales = [1.5, 0.5, 2.0, 0.7]
    kw = dict(
        base_lr=0.1, policy="composite", sub_policy_num_iters=n,
        sub_policy_0_policy="exp", sub_policy_0_gamma=0.9, sub_policy_0_lr_scale=scales[0],
        sub_policy_1_policy="step", sub_policy_1_stepsize=3, sub_policy_1_gamma=0.5,
        sub_policy_1_lr_scale=scales[1],
        sub_policy_2_policy="fixed", sub_policy_2_lr_scale=scales[2],
        sub_policy_3_policy="alter", sub_policy_3_active_period=1, sub_policy_3_inactive_period=1,
        sub_policy_3_lr_scale=scales[3],
    )
    models = [lambda it: 0.9 ** it, lambda it: 0.5 ** (it // 3), lambda it: 1.0,
              lambda it: alter(it, True, 1, 1)]
    bounds = np.cumsum([1] + n)
    for it in range(0, 25):
        k = max(0, min(3, int(np.searchsorted(bounds, it, side="right")) - 1))
        want = 0.1 * scales[k] * models[k](it)
        assert lr_at(it, **kw) == pytest.approx(want, rel=1e-5), it


@pytest.mark.parametrize("kwargs", [
    dict(policy="alter", active_period=0, inactive_period=0),
    dict(policy="alter", active_period=-1, inactive_period=3),
    dict(policy="hill", num_iter=0, gamma=1.0, power=1.0),
    dict(policy="hill", num_iter=5, start_multiplier=1.5),
    dict(policy="slope", num_iter_1=10, num_iter_2=10),
    dict(policy="cyclical", stepsize=0),
    dict(policy="cosine", period=0),
    dict(policy="composite"),
    dict(policy="composite", sub_policy_num_iters=[3, 0], sub_policy_0_policy="fixed",
         sub_policy_1_policy="fixed"),
    dict(policy="composite", sub_policy_num_iters=[3], sub_policy_0_policy="composite"),
    dict(policy="composite", sub_policy_num_iters=[3], sub_policy_0_policy="nope"),
    dict(policy="nope"),
])
def test_bad_policy_arguments_are_invalid_argument_errors(fresh, kwargs):
    with pytest.raises(errors.InvalidArgumentError):
        lr_at(1, base_lr=0.1, **kwargs)


def test_unprefixed_unknown_arguments_are_still_refused(fresh):
    with pytest.raises(errors.InvalidArgumentError, match="unknown argument"):
        lr_at(1, base_lr=0.1, policy="fixed", sub_policy=3, bogus=1)


# ---------------------------------------------- SparseAdagrad counters --


def sparse_adagrad_ref(w, h, idx, g, lr, eps, wd, count=None, halflife=-1, row_wise=False):
    w, h = w.astype(np.float64).copy(), h.astype(np.float64).copy()
    for i, r in enumerate(idx):
        freq = halflife / count[r] if halflife > 0 and count is not None and count[r] > 0 else 1.0
        gi = g[i] + wd * freq * w[r]
        if row_wise:
            h[r] += np.mean(gi * gi)
            w[r] += lr * gi / (np.sqrt(h[r]) + eps)
        else:
            h[r] += gi * gi
            w[r] += lr * gi / (np.sqrt(h[r]) + eps)
    return w, h


@pytest.mark.parametrize("row_wise", [False, True])
@pytest.mark.parametrize("halflife", [-1, 4])
def test_sparse_adagrad_weight_decay_scaled_by_counter(fresh, row_wise, halflife):
    rng = np.random.default_rng(35)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    h = np.abs(rng.standard_normal(5 if row_wise else (5, 3))).astype(np.float32)
    idx = np.array([3, 0, 3], np.int64)
    g = rng.standard_normal((3, 3)).astype(np.float32)
    count = np.array([2.0, 0.0, 1.0, 8.0, 0.5])
    for name, v in dict(w=w, h=h, idx=idx, g=g, lr=np.array([0.1], np.float32), c=count).items():
        workspace.FeedBlob(name, v)
    op = "RowWiseSparseAdagrad" if row_wise else "SparseAdagrad"
    workspace.RunOperatorOnce(core.CreateOperator(
        op, ["w", "h", "idx", "g", "lr", "c"], ["w", "h"],
        epsilon=1e-3, weight_decay=0.3, counter_halflife=halflife))
    want_w, want_h = sparse_adagrad_ref(w, h, idx, g, 0.1, 1e-3, 0.3, count, halflife, row_wise)
    np.testing.assert_allclose(workspace.FetchBlob("w"), want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("h"), want_h, rtol=1e-5, atol=1e-6)


def test_counter_halflife_needs_the_count_input(fresh):
    for name, v in dict(w=np.zeros((2, 2), np.float32), h=np.zeros((2, 2), np.float32),
                        idx=np.array([0], np.int64), g=np.zeros((1, 2), np.float32),
                        lr=np.array([0.1], np.float32), c=np.ones(3)).items():
        workspace.FeedBlob(name, v)
    with pytest.raises(errors.InvalidArgumentError, match="count"):
        workspace.RunOperatorOnce(core.CreateOperator(
            "SparseAdagrad", ["w", "h", "idx", "g", "lr"], ["w", "h"], counter_halflife=3))
    with pytest.raises(errors.ShapeError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "SparseAdagrad", ["w", "h", "idx", "g", "lr", "c"], ["w", "h"], counter_halflife=3))
    workspace.FeedBlob("c", np.ones(2, np.int32))
    with pytest.raises(errors.DataTypeError):
        workspace.RunOperatorOnce(core.CreateOperator(
            "SparseAdagrad", ["w", "h", "idx", "g", "lr", "c"], ["w", "h"], counter_halflife=3))
