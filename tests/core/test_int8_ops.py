"""The quantised uint8 ops (issue 29): Int8Quantize, Int8Dequantize, the
Int8 fills, Int8Conv(Relu), Int8FC, Int8Sum(Relu), Int8AveragePool,
Int8MaxPool, Int8Softmax and Int8ResizeNearest, with Caffe2's names,
arguments and Int8TensorCPU blobs (FetchBlob gives
``workspace.Int8Tensor(data, scale, zero_point)``).

Expected values come from integer numpy models written here from the
rules Caffe2 documented (gemmlowp's fixed-point requantisation: a Q31
multiplier and a right shift, a rounding doubling high multiply, a rounding
right shift; QNNPACK's table softmax), not from ferrocaffe: every result
must be equal, not close. Bad inputs and arguments raise typed errors that
name the op and the blob.
"""

import math

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace
from ferrocaffe.workspace import Int8Tensor

# ------------------------------------------------------ integer models --


def q31(real):
    """(multiplier, shift) of a real in [0, 1): real = m / 2^31 / 2^shift."""
    assert 0 <= real < 1
    if real == 0:
        return 0, 0
    frac, exp = math.frexp(real)
    shift = -exp
    m = round(frac * 2**31)  # Python rounds halves to even, as nearbyint
    if m == 2**31:
        m //= 2
        shift -= 1
    return m, shift


def high_mul(a, m):
    """round(a * m / 2^31), halves up, toward +inf (int64 arrays)."""
    a = np.asarray(a, np.int64)
    p = a * np.int64(m)
    nudge = np.where(p >= 0, 1 << 30, 1 - (1 << 30))
    v = p + nudge
    q = np.sign(v) * (np.abs(v) >> 31)  # division truncating toward zero
    return np.where((a == -2**31) & (m == -2**31), 2**31 - 1, q)


def round_shift(x, e):
    """round(x / 2^e), halves away from zero."""
    x = np.asarray(x, np.int64)
    mask = (1 << e) - 1
    rem = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> e) + (rem > threshold)


def requant(acc, real):
    m, s = q31(real)
    acc = np.clip(np.asarray(acc, np.int64), -2**31, 2**31 - 1)
    return round_shift(high_mul(acc, m), s)


def quantize(x, scale, zp):
    r = np.rint(np.asarray(x, np.float32) / np.float32(scale))  # halves to even
    return np.clip(zp + r.astype(np.int64), 0, 255).astype(np.uint8)


def conv_model(x, xs, xz, w, ws, wz, b, ys, yz, stride=1, pad=0, group=1, relu=False):
    n, h, wd, c = x.shape
    m, kh, kw, cg = w.shape
    xp = np.full((n, h + 2 * pad, wd + 2 * pad, c), xz, np.int64)
    xp[:, pad:pad + h, pad:pad + wd, :] = x
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    xc = xp - xz
    wc = w.astype(np.int64) - wz
    mg = m // group
    acc = np.zeros((n, oh, ow, m), np.int64)
    for oy in range(oh):
        for ox in range(ow):
            patch = xc[:, oy * stride:oy * stride + kh, ox * stride:ox * stride + kw, :]
            for g in range(group):
                p = patch[..., g * cg:(g + 1) * cg]
                f = wc[g * mg:(g + 1) * mg]
                acc[:, oy, ox, g * mg:(g + 1) * mg] = np.einsum("nijc,mijc->nm", p, f)
    acc += b
    y = requant(acc, float(np.float64(xs) * np.float64(ws) / np.float64(ys))) + yz
    lo = yz if relu else 0
    return np.clip(y, lo, 255).astype(np.uint8)


def f32(v):
    return float(np.float32(v))


# ----------------------------------------------------------- helpers --


def feed_q(name, data, scale, zp):
    workspace.FeedBlob(name, Int8Tensor(np.asarray(data), f32(scale), zp))


def run(op_type, inputs, outputs=("Y",), **kwargs):
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), list(outputs), **kwargs))
    return workspace.FetchBlob(outputs[0])


RNG = np.random.default_rng(29)


def u8(*shape):
    return RNG.integers(0, 256, shape, dtype=np.uint8)


# ------------------------------------------------ quantize, dequantize --


def test_quantize_matches_the_rounding_rule(fresh):
    x = np.concatenate([RNG.normal(0, 3, 200), [0.5, 1.5, 2.5, -0.5, -1.5, 1e9, -1e9]]).astype(
        np.float32)
    workspace.FeedBlob("X", x)
    y = run("Int8Quantize", ["X"], Y_scale=0.5, Y_zero_point=100)
    assert isinstance(y, Int8Tensor)
    assert y.data.dtype == np.uint8 and y.data.shape == x.shape
    assert y.scale == 0.5 and y.zero_point == 100
    np.testing.assert_array_equal(y.data, quantize(x, 0.5, 100))
    # Halves go to even: 0.25 / 0.5 = 0.5 -> 0, 0.75 / 0.5 = 1.5 -> 2.
    workspace.FeedBlob("X", np.array([0.25, 0.75, 1.25], np.float32))
    np.testing.assert_array_equal(run("Int8Quantize", ["X"], Y_scale=0.5).data, [0, 2, 2])


def test_dequantize_and_round_trip(fresh):
    scale = f32(0.037)
    x = RNG.uniform(-4, 4, (3, 5, 7)).astype(np.float32)
    workspace.FeedBlob("X", x)
    run("Int8Quantize", ["X"], ["Xq"], Y_scale=scale, Y_zero_point=128)
    back = run("Int8Dequantize", ["Xq"], ["Xf"])
    q = quantize(x, scale, 128)
    want = (q.astype(np.int32) - 128).astype(np.float32) * np.float32(scale)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, want)
    assert np.abs(back - x).max() <= scale / 2 + 1e-6


def test_feed_fetch_int8_tensor(fresh):
    data = u8(2, 3)
    feed_q("q", data, 0.25, 7)
    got = workspace.FetchBlob("q")
    assert isinstance(got, Int8Tensor)
    np.testing.assert_array_equal(got.data, data)
    assert (got.scale, got.zero_point) == (0.25, 7)
    bias = np.array([-5, 0, 123456], np.int32)
    workspace.FeedBlob("b", Int8Tensor(bias, 0.01, 0))
    assert workspace.FetchBlob("b").data.dtype == np.int32
    with pytest.raises(errors.FeedError, match="uint8"):
        workspace.FeedBlob("bad", Int8Tensor(np.zeros(3, np.float32), 1.0, 0))
    with pytest.raises(errors.FeedError, match="positive scale"):
        workspace.FeedBlob("bad", Int8Tensor(data, 0.0, 0))


def test_given_fills(fresh):
    vals = bytes(range(6))
    y = run("Int8GivenTensorFill", [], ["W"], values=vals, shape=[2, 3], Y_scale=0.5,
            Y_zero_point=3)
    np.testing.assert_array_equal(y.data, np.arange(6, dtype=np.uint8).reshape(2, 3))
    assert (y.scale, y.zero_point) == (0.5, 3)
    b = run("Int8GivenIntTensorFill", [], ["B"], values=[-1, 2, 70000], shape=[3], Y_scale=0.125)
    assert b.data.dtype == np.int32
    np.testing.assert_array_equal(b.data, [-1, 2, 70000])
    with pytest.raises(errors.InvalidArgumentError, match="Int8GivenTensorFill"):
        run("Int8GivenTensorFill", [], ["W"], values=b"abc", shape=[1 << 20, 1 << 20])


# ------------------------------------------------------- convolution --


CONV_CASES = [
    # (N, H, W, C, M, k, stride, pad, group)
    (1, 5, 5, 3, 4, 1, 1, 0, 1),
    (2, 6, 7, 4, 5, 3, 1, 1, 1),
    (1, 7, 6, 3, 8, 3, 2, 1, 1),
    (1, 6, 6, 8, 8, 3, 1, 1, 8),   # depthwise
    (2, 5, 5, 6, 4, 3, 2, 0, 2),   # two groups, no pad
]


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_matches_the_integer_model(fresh, case, relu):
    n, h, w, c, m, k, stride, pad, group = case
    x, wt = u8(n, h, w, c), u8(m, k, k, c // group)
    b = RNG.integers(-3000, 3000, m).astype(np.int32)
    xs, xz, ws, wz = 0.02, 120, 0.005, 128
    ys, yz = 0.05 * k, 110
    feed_q("X", x, xs, xz)
    feed_q("W", wt, ws, wz)
    workspace.FeedBlob("B", Int8Tensor(b, f32(xs) * f32(ws), 0))
    op = "Int8ConvRelu" if relu else "Int8Conv"
    y = run(op, ["X", "W", "B"], kernel=k, stride=stride, pad=pad, group=group, order="NHWC",
            Y_scale=ys, Y_zero_point=yz)
    want = conv_model(x, f32(xs), xz, wt, f32(ws), wz, b, f32(ys), yz, stride, pad, group, relu)
    assert y.data.shape == want.shape
    assert (y.scale, y.zero_point) == (f32(ys), yz)
    np.testing.assert_array_equal(y.data, want)
    if relu:
        assert y.data.min() >= yz


def test_conv_approximates_the_float_conv(fresh):
    # The quantised result is the float one within a step or two of Y_scale.
    x = u8(1, 4, 4, 2)
    wt = u8(3, 1, 1, 2)
    feed_q("X", x, 0.1, 128)
    feed_q("W", wt, 0.01, 128)
    workspace.FeedBlob("B", Int8Tensor(np.zeros(3, np.int32), f32(0.1) * f32(0.01), 0))
    y = run("Int8Conv", ["X", "W", "B"], kernel=1, order="NHWC", Y_scale=0.02, Y_zero_point=128)
    real = np.einsum("nhwc,mc->nhwm", (x.astype(np.float64) - 128) * f32(0.1),
                     (wt[:, 0, 0, :].astype(np.float64) - 128) * f32(0.01))
    got = (y.data.astype(np.float64) - 128) * f32(0.02)
    inside = np.abs(real) < 2.4
    assert np.abs(got - real)[inside].max() <= 0.0101


# ---------------------------------------------------- fully connected --


def test_fc_matches_the_integer_model(fresh):
    x, wt = u8(4, 1, 1, 6), u8(5, 6)
    b = RNG.integers(-500, 500, 5).astype(np.int32)
    feed_q("X", x, 0.03, 10)
    feed_q("W", wt, 0.004, 131)
    workspace.FeedBlob("B", Int8Tensor(b, f32(0.03) * f32(0.004), 0))
    y = run("Int8FC", ["X", "W", "B"], order="NHWC", Y_scale=0.07, Y_zero_point=80)
    acc = (x.reshape(4, 6).astype(np.int64) - 10) @ (wt.astype(np.int64) - 131).T + b
    want = np.clip(requant(acc, float(np.float64(f32(0.03)) * f32(0.004) / f32(0.07))) + 80,
                   0, 255)
    assert y.data.shape == (4, 5)
    np.testing.assert_array_equal(y.data, want)


# ---------------------------------------------------------------- sum --


@pytest.mark.parametrize("relu", [False, True])
def test_sum_matches_the_integer_model(fresh, relu):
    a, b = u8(2, 3, 3, 4), u8(2, 3, 3, 4)
    sa, za, sb, zb, sy, zy = f32(0.0448), 132, f32(0.0197), 0, f32(0.0463), 128
    feed_q("A", a, sa, za)
    feed_q("B", b, sb, zb)
    y = run("Int8SumRelu" if relu else "Int8Sum", ["A", "B"], Y_scale=sy, Y_zero_point=zy)
    twice = 2 * max(sa, sb)
    ra = requant((a.astype(np.int64) - za) << 20, sa / twice)
    rb = requant((b.astype(np.int64) - zb) << 20, sb / twice)
    want = np.clip(requant(ra + rb, twice / (2**20 * sy)) + zy, zy if relu else 0, 255)
    np.testing.assert_array_equal(y.data, want)
    # Close to the real sum.
    real = (a - float(za)) * sa + (b - float(zb)) * sb
    got = (y.data - float(zy)) * sy
    ok = (real > -zy * sy) & (real < (255 - zy) * sy)
    if relu:
        ok &= real > 0
    assert np.abs(got - real)[ok].max() <= sy


# -------------------------------------------------------------- pools --


def pool_model(x, k, stride, pad, kind):
    n, h, w, c = x.shape
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    y = np.zeros((n, oh, ow, c), np.uint8)
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * stride - pad, ox * stride - pad
            win = x[:, max(y0, 0):min(y0 + k, h), max(x0, 0):min(x0 + k, w), :].astype(np.int64)
            if kind == "max":
                y[:, oy, ox] = win.max(axis=(1, 2))
            else:
                cnt = win.shape[1] * win.shape[2]
                y[:, oy, ox] = (win.sum(axis=(1, 2)) + cnt // 2) // cnt
    return y


@pytest.mark.parametrize("k,stride,pad", [(3, 1, 0), (3, 2, 1), (2, 2, 0)])
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_pools(fresh, kind, k, stride, pad):
    x = u8(2, 6, 5, 3)
    feed_q("X", x, 0.04, 5)
    op = "Int8AveragePool" if kind == "avg" else "Int8MaxPool"
    y = run(op, ["X"], kernel=k, stride=stride, pad=pad, order="NHWC", Y_scale=f32(0.04),
            Y_zero_point=5)
    np.testing.assert_array_equal(y.data, pool_model(x, k, stride, pad, kind))
    assert (y.scale, y.zero_point) == (f32(0.04), 5)


def test_global_average_pool(fresh):
    x = u8(2, 3, 3, 4)
    feed_q("X", x, 0.04, 0)
    y = run("Int8AveragePool", ["X"], global_pooling=1, order="NHWC", Y_scale=f32(0.04))
    np.testing.assert_array_equal(y.data, pool_model(x, 3, 1, 0, "avg"))


def test_pool_refuses_requantisation(fresh):
    feed_q("X", u8(1, 3, 3, 1), 0.04, 5)
    with pytest.raises(errors.InvalidArgumentError, match="Int8AveragePool.*'X'"):
        run("Int8AveragePool", ["X"], kernel=3, order="NHWC", Y_scale=0.05, Y_zero_point=5)


# ------------------------------------------------------------ softmax --


def softmax_model(x, scale):
    rows = x.reshape(x.shape[0], -1).astype(np.int64)
    n = rows.shape[1]
    s = min((2**32 - 1) / n, 8388607.0)
    table = np.array([int(np.rint(s * math.exp((i - 255) * float(np.float32(scale)))))
                      for i in range(256)], np.int64)
    out = np.zeros_like(rows)
    for r, row in enumerate(rows):
        e = table[row + 255 - row.max()]
        total = int(e.sum())
        out[r] = np.minimum((e * 256 + total // 2) // total, 255)
    return out.reshape(x.shape).astype(np.uint8)


@pytest.mark.parametrize("shape,scale", [((3, 81), 0.08), ((2, 10), 0.5), ((4, 2, 3), 0.01)])
def test_softmax(fresh, shape, scale):
    x = u8(*shape)
    feed_q("X", x, scale, 80)
    y = run("Int8Softmax", ["X"], order="NHWC", Y_scale=1.0 / 256, Y_zero_point=0)
    assert (y.scale, y.zero_point) == (1.0 / 256, 0)
    np.testing.assert_array_equal(y.data, softmax_model(x, scale))
    z = (x.reshape(shape[0], -1) - 80.0) * f32(scale)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert np.abs(y.data.reshape(shape[0], -1) / 256.0 - p).max() <= 2 / 256


def test_softmax_output_quantisation_is_fixed(fresh):
    feed_q("X", u8(1, 4), 0.1, 0)
    with pytest.raises(errors.InvalidArgumentError, match="1/256"):
        run("Int8Softmax", ["X"], Y_scale=0.01, Y_zero_point=0)


# ------------------------------------------------------------- resize --


def test_resize_nearest(fresh):
    x = u8(1, 3, 4, 2)
    feed_q("X", x, 0.003, 0)
    y = run("Int8ResizeNearest", ["X"], width_scale=2.0, height_scale=2.0, order="NHWC",
            Y_scale=f32(0.003), Y_zero_point=0)
    np.testing.assert_array_equal(y.data, x.repeat(2, axis=1).repeat(2, axis=2))
    # NHWC is its default order (it is no window op); NCHW is refused.
    y = run("Int8ResizeNearest", ["X"], width_scale=0.5, height_scale=1.0, Y_scale=f32(0.003))
    np.testing.assert_array_equal(y.data, x[:, :, ::2])
    with pytest.raises(errors.InvalidArgumentError, match="NHWC"):
        run("Int8ResizeNearest", ["X"], order="NCHW", Y_scale=f32(0.003))


# ---------------------------------------------------------- save/load --


@pytest.mark.parametrize("db_type", ["minidb", "ferro", "leveldb"])
def test_save_and_load(fresh, tmp_path, db_type):
    w, b = u8(4, 3, 3, 2), np.array([1, -2, 3, 4], np.int32)
    feed_q("W", w, 0.0125, 128)
    workspace.FeedBlob("B", Int8Tensor(b, 0.001, 0))
    path = str(tmp_path / "int8.db")
    workspace.RunOperatorOnce(core.CreateOperator(
        "Save", ["W", "B"], [], db=path, db_type=db_type, absolute_path=1))
    workspace.ResetWorkspace()
    workspace.RunOperatorOnce(core.CreateOperator(
        "Load", [], ["W", "B"], db=path, db_type=db_type, absolute_path=1))
    gw, gb = workspace.FetchBlob("W"), workspace.FetchBlob("B")
    np.testing.assert_array_equal(gw.data, w)
    assert gw.data.dtype == np.uint8 and (gw.scale, gw.zero_point) == (f32(0.0125), 128)
    np.testing.assert_array_equal(gb.data, b)
    assert gb.data.dtype == np.int32 and (gb.scale, gb.zero_point) == (f32(0.001), 0)


def test_serialized_form_is_caffe2s(fresh):
    from ferrocaffe.proto import caffe2_pb2
    feed_q("W", np.array([[0, 255]], np.uint8), 0.5, 9)
    blob = caffe2_pb2.BlobProto()
    blob.ParseFromString(workspace.SerializeBlob("W"))
    assert blob.type == "Int8TensorCPU"
    q = blob.qtensor
    assert list(q.dims) == [1, 2] and list(q.data) == [0, 255]
    assert (q.scale, q.bias, q.precision, q.is_signed) == (0.5, 9.0, 8, False)
    assert q.data_type == caffe2_pb2.TensorProto.UINT8


# ------------------------------------------------------------- errors --


def test_typed_errors(fresh):
    feed_q("X", u8(1, 4, 4, 3), 0.02, 0)
    feed_q("W", u8(2, 3, 3, 3), 0.01, 128)
    workspace.FeedBlob("B", Int8Tensor(np.zeros(2, np.int32), 0.0002, 0))
    workspace.FeedBlob("F", np.zeros((1, 4, 4, 3), np.float32))
    conv = dict(kernel=3, pad=1, order="NHWC", Y_scale=0.1)
    # A float input where an Int8TensorCPU is needed.
    with pytest.raises(errors.DataTypeError, match="Int8Conv.*'F'.*Int8Quantize"):
        run("Int8Conv", ["F", "W", "B"], **conv)
    # Wrong rank.
    feed_q("X3", u8(4, 4, 3), 0.02, 0)
    with pytest.raises(errors.ShapeError, match="Int8Conv.*'X3'"):
        run("Int8Conv", ["X3", "W", "B"], **conv)
    # Channels that do not match the filter.
    feed_q("W4", u8(2, 3, 3, 4), 0.01, 128)
    with pytest.raises(errors.ShapeError, match="Int8Conv.*'W4'"):
        run("Int8Conv", ["X", "W4", "B"], **conv)
    # A bias of the wrong type or length.
    with pytest.raises(errors.DataTypeError, match="'X'.*int32"):
        run("Int8Conv", ["X", "W", "X"], **conv)
    workspace.FeedBlob("B3", Int8Tensor(np.zeros(3, np.int32), 0.0002, 0))
    with pytest.raises(errors.ShapeError, match="'B3'"):
        run("Int8Conv", ["X", "W", "B3"], **conv)
    # Scales: zero, or a requantisation multiplier >= 1.
    with pytest.raises(errors.InvalidArgumentError, match="Y_scale"):
        run("Int8Conv", ["X", "W", "B"], kernel=3, order="NHWC", Y_scale=0.0)
    with pytest.raises(errors.InvalidArgumentError, match="Int8Conv.*multiplier"):
        run("Int8Conv", ["X", "W", "B"], kernel=3, pad=1, order="NHWC", Y_scale=1e-6)
    with pytest.raises(errors.InvalidArgumentError, match="NHWC"):
        run("Int8Conv", ["X", "W", "B"], kernel=3, order="NCHW", Y_scale=0.1)
    with pytest.raises(errors.InvalidArgumentError, match="Y_zero_point"):
        run("Int8Quantize", ["F"], Y_scale=0.1, Y_zero_point=300)
    # Quantize takes float32 only; Dequantize an Int8TensorCPU only.
    workspace.FeedBlob("I", np.zeros(3, np.int64))
    with pytest.raises(errors.DataTypeError, match="Int8Quantize.*'I'"):
        run("Int8Quantize", ["I"], Y_scale=0.1)
    with pytest.raises(errors.DataTypeError, match="Int8Dequantize.*'F'"):
        run("Int8Dequantize", ["F"])
    # Sum of two shapes.
    feed_q("S", u8(1, 4, 4, 2), 0.02, 0)
    with pytest.raises(errors.ShapeError, match="Int8Sum.*'S'"):
        run("Int8Sum", ["X", "S"], Y_scale=0.1)
    # The workspace stays usable.
    assert run("Int8Dequantize", ["X"]).shape == (1, 4, 4, 3)


def test_loaded_corrupt_qtensor_is_a_typed_error(fresh):
    from ferrocaffe.proto import caffe2_pb2
    blob = caffe2_pb2.BlobProto(name="q", type="Int8TensorCPU")
    q = blob.qtensor
    q.dims.extend([2])
    q.precision, q.scale, q.bias, q.is_signed = 8, 0.5, 0, False
    q.data_type = caffe2_pb2.TensorProto.UINT8
    q.data.extend([1, 300])
    with pytest.raises(errors.CorruptCheckpointError, match="0..=255"):
        workspace.DeserializeBlob("q", blob.SerializeToString())
