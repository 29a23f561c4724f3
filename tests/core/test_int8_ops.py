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


# ============================================ the second set (issue 29) ==
# Int8Add(Relu), Int8Relu, Int8LeakyRelu, Int8Sigmoid, Int8Reshape,
# Int8Flatten, Int8Concat, Int8Slice, Int8Transpose, Int8ChannelShuffle,
# Int8ConvTranspose, Int8RoIAlign, and shape inference of the int8 ops.


def add_model(a, sa, za, b, sb, zb, sy, zy, relu):
    twice = 2 * max(sa, sb)
    ra = requant((a.astype(np.int64) - za) << 20, sa / twice)
    rb = requant((b.astype(np.int64) - zb) << 20, sb / twice)
    return np.clip(requant(ra + rb, twice / (2**20 * sy)) + zy, zy if relu else 0, 255)


@pytest.mark.parametrize("op", ["Int8Add", "Int8AddRelu"])
def test_add_matches_the_integer_model(fresh, op):
    a, b = u8(3, 5, 4), u8(3, 5, 4)
    sa, za, sb, zb, sy, zy = f32(0.031), 120, f32(0.052), 7, f32(0.06), 100
    feed_q("A", a, sa, za)
    feed_q("B", b, sb, zb)
    y = run(op, ["A", "B"], Y_scale=sy, Y_zero_point=zy)
    np.testing.assert_array_equal(y.data, add_model(a, sa, za, b, sb, zb, sy, zy,
                                                     op.endswith("Relu")))
    assert (y.scale, y.zero_point) == (sy, zy)
    # broadcast is accepted; equal shapes give the same result.
    y1 = run(op, ["A", "B"], broadcast=1, Y_scale=sy, Y_zero_point=zy)
    np.testing.assert_array_equal(y1.data, y.data)


def test_add_does_not_broadcast(fresh):
    feed_q("A", u8(2, 3, 4), 0.1, 0)
    feed_q("B", u8(4), 0.1, 0)
    with pytest.raises(errors.ShapeError, match="Int8Add.*'B'.*does not broadcast"):
        run("Int8Add", ["A", "B"], broadcast=1, Y_scale=0.2)
    feed_q("C", u8(2, 3, 4), 0.1, 0)
    with pytest.raises(errors.InvalidArgumentError, match="broadcast"):
        run("Int8Add", ["A", "C"], broadcast=2, Y_scale=0.2)
    workspace.FeedBlob("F", np.zeros((2, 3, 4), np.float32))
    with pytest.raises(errors.DataTypeError, match="Int8AddRelu.*'F'"):
        run("Int8AddRelu", ["A", "F"], Y_scale=0.2)


# ------------------------------------------------------- activations --


def test_relu(fresh):
    x = u8(4, 9)
    feed_q("X", x, 0.05, 131)
    y = run("Int8Relu", ["X"], Y_scale=f32(0.05), Y_zero_point=131)
    np.testing.assert_array_equal(y.data, np.maximum(x, 131))
    assert (y.scale, y.zero_point) == (f32(0.05), 131)
    with pytest.raises(errors.InvalidArgumentError, match="Int8Relu.*'X'"):
        run("Int8Relu", ["X"], Y_scale=f32(0.05), Y_zero_point=0)


@pytest.mark.parametrize("alpha", [0.01, 0.2, 0.7])
def test_leaky_relu(fresh, alpha):
    x = np.arange(256, dtype=np.uint8).reshape(16, 16)
    zp = 140
    feed_q("X", x, 0.02, zp)
    y = run("Int8LeakyRelu", ["X"], alpha=alpha, Y_scale=f32(0.02), Y_zero_point=zp)
    xi = x.astype(np.int64)
    below = requant(xi - zp, float(np.float32(alpha))) + zp
    want = np.where(xi < zp, below, xi)
    np.testing.assert_array_equal(y.data, want)
    # About alpha x the real value below zero: rounded once to the Q31
    # multiplier's grid (2^-shift), then to an integer.
    real = np.where(xi < zp, alpha * (xi - zp), xi - zp)
    shift = q31(float(np.float32(alpha)))[1]
    assert np.abs(y.data.astype(np.int64) - zp - real).max() <= 0.5 + 0.5 / 2**shift + 1e-5


def test_leaky_relu_arguments(fresh):
    feed_q("X", u8(3), 0.02, 0)
    for alpha in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(errors.InvalidArgumentError, match="alpha"):
            run("Int8LeakyRelu", ["X"], alpha=alpha, Y_scale=f32(0.02))


def sigmoid_model(x, scale, zp):
    f = np.float32
    table = np.empty(256, np.uint8)
    for i in range(256):
        v = f(scale) * f(i - zp)
        s = f(256.0) / (f(1.0) + np.exp(-v))
        table[i] = np.rint(np.clip(s, f(0), f(255)))
    return table[x]


@pytest.mark.parametrize("scale,zp", [(0.05, 128), (0.2, 30), (0.011, 255)])
def test_sigmoid(fresh, scale, zp):
    x = np.arange(256, dtype=np.uint8).reshape(4, 64)
    feed_q("X", x, scale, zp)
    y = run("Int8Sigmoid", ["X"], Y_scale=1.0 / 256, Y_zero_point=0)
    assert (y.scale, y.zero_point) == (1.0 / 256, 0)
    np.testing.assert_array_equal(y.data, sigmoid_model(x, scale, zp))
    real = 1 / (1 + np.exp(-(x - float(zp)) * f32(scale)))
    assert np.abs(y.data / 256.0 - np.minimum(real, 255 / 256)).max() <= 0.5 / 256 + 1e-6
    with pytest.raises(errors.InvalidArgumentError, match="1/256"):
        run("Int8Sigmoid", ["X"], Y_scale=0.1, Y_zero_point=0)


# ---------------------------------------------------- data movement --


def test_reshape(fresh):
    x = u8(2, 3, 4)
    feed_q("X", x, 0.1, 9)
    workspace.RunOperatorOnce(core.CreateOperator(
        "Int8Reshape", ["X"], ["Y", "old"], shape=[0, -1], Y_scale=f32(0.1), Y_zero_point=9))
    y = workspace.FetchBlob("Y")
    np.testing.assert_array_equal(y.data, x.reshape(2, 12))
    assert (y.scale, y.zero_point) == (f32(0.1), 9)
    np.testing.assert_array_equal(workspace.FetchBlob("old"), [2, 3, 4])
    assert workspace.FetchBlob("old").dtype == np.int64
    # The shape as a second input.
    workspace.FeedBlob("S", np.array([4, 6], np.int64))
    y = run("Int8Reshape", ["X", "S"], Y_scale=f32(0.1), Y_zero_point=9)
    np.testing.assert_array_equal(y.data, x.reshape(4, 6))
    with pytest.raises(errors.InvalidArgumentError, match="do not pass in the argument"):
        run("Int8Reshape", ["X", "S"], shape=[4, 6], Y_scale=f32(0.1), Y_zero_point=9)
    with pytest.raises(errors.ShapeError, match="Int8Reshape.*'X'"):
        run("Int8Reshape", ["X"], shape=[5, 5], Y_scale=f32(0.1), Y_zero_point=9)
    with pytest.raises(errors.InvalidArgumentError, match="Int8Reshape.*'X'"):
        run("Int8Reshape", ["X"], shape=[24], Y_scale=0.2, Y_zero_point=9)


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1])
def test_flatten(fresh, axis):
    x = u8(2, 3, 4)
    feed_q("X", x, 0.1, 0)
    y = run("Int8Flatten", ["X"], axis=axis, Y_scale=f32(0.1))
    ax = axis % 3 if axis < 0 else axis
    want = x.reshape(int(np.prod(x.shape[:ax])), -1)
    np.testing.assert_array_equal(y.data, want)


def test_flatten_errors(fresh):
    feed_q("X", u8(2, 3), 0.1, 0)
    with pytest.raises(errors.InvalidArgumentError, match="Int8Flatten.*axis"):
        run("Int8Flatten", ["X"], axis=5, Y_scale=f32(0.1))


def test_concat(fresh):
    a, b, c = u8(1, 2, 3, 2), u8(1, 2, 3, 5), u8(1, 2, 3, 1)
    for name, v in zip("ABC", (a, b, c)):
        feed_q(name, v, 0.25, 4)
    q = dict(Y_scale=0.25, Y_zero_point=4)
    # NHWC: the channels by default; split_info gives each input's size.
    workspace.RunOperatorOnce(core.CreateOperator(
        "Int8Concat", ["A", "B", "C"], ["Y", "split"], order="NHWC", **q))
    y = workspace.FetchBlob("Y")
    np.testing.assert_array_equal(y.data, np.concatenate([a, b, c], axis=3))
    assert (y.scale, y.zero_point) == (0.25, 4)
    np.testing.assert_array_equal(workspace.FetchBlob("split"), [2, 5, 1])
    assert workspace.FetchBlob("split").dtype == np.int32
    # No order: axis 0 by default; an explicit axis, negative too.
    y = run("Int8Concat", ["A", "A"], **q)
    np.testing.assert_array_equal(y.data, np.concatenate([a, a], axis=0))
    y = run("Int8Concat", ["A", "A"], axis=-2, **q)
    np.testing.assert_array_equal(y.data, np.concatenate([a, a], axis=2))
    # add_axis stacks.
    y = run("Int8Concat", ["A", "A", "A"], axis=1, add_axis=1, **q)
    np.testing.assert_array_equal(y.data, np.stack([a, a, a], axis=1))


def test_concat_errors(fresh):
    feed_q("A", u8(1, 2, 3, 2), 0.25, 4)
    feed_q("B", u8(1, 2, 3, 2), 0.5, 4)
    feed_q("C", u8(1, 2, 4, 2), 0.25, 4)
    feed_q("V", u8(6), 0.25, 4)
    q = dict(Y_scale=0.25, Y_zero_point=4)
    with pytest.raises(errors.InvalidArgumentError, match="Int8Concat.*'B'.*requantise"):
        run("Int8Concat", ["A", "B"], order="NHWC", **q)
    with pytest.raises(errors.ShapeError, match="Int8Concat.*'C'"):
        run("Int8Concat", ["A", "C"], order="NHWC", **q)
    with pytest.raises(errors.ShapeError, match="Int8Concat.*'V'.*4-D"):
        run("Int8Concat", ["A", "V"], order="NHWC", **q)
    with pytest.raises(errors.InvalidArgumentError, match="axis"):
        run("Int8Concat", ["A", "A"], order="NHWC", axis=4, **q)
    with pytest.raises(errors.InvalidArgumentError, match="Int8Concat.*'A'"):
        run("Int8Concat", ["A", "A"], order="NHWC", Y_scale=0.5, Y_zero_point=4)


def test_slice(fresh):
    x = u8(4, 5, 6)
    feed_q("X", x, 0.3, 17)
    q = dict(Y_scale=f32(0.3), Y_zero_point=17)
    y = run("Int8Slice", ["X"], starts=[1, 0, 2], ends=[3, -1, -2], **q)
    np.testing.assert_array_equal(y.data, x[1:3, :, 2:5])
    assert (y.scale, y.zero_point) == (f32(0.3), 17)
    workspace.FeedBlob("s", np.array([0, 2], np.int32))
    workspace.FeedBlob("e", np.array([2, 4], np.int32))
    y = run("Int8Slice", ["X", "s", "e"], **q)
    np.testing.assert_array_equal(y.data, x[0:2, 2:4])
    with pytest.raises(errors.InvalidArgumentError, match="starts and ends"):
        run("Int8Slice", ["X"], starts=[0], **q)
    with pytest.raises(errors.InvalidArgumentError, match="Int8Slice.*'X'"):
        run("Int8Slice", ["X"], starts=[3], ends=[1], **q)


@pytest.mark.parametrize("axes", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(fresh, axes):
    x = u8(2, 3, 4)
    feed_q("X", x, 0.3, 1)
    kw = {} if axes is None else dict(axes=axes)
    y = run("Int8Transpose", ["X"], Y_scale=f32(0.3), Y_zero_point=1, **kw)
    np.testing.assert_array_equal(y.data, np.transpose(x, axes))
    with pytest.raises(errors.InvalidArgumentError, match="Int8Transpose.*permutation"):
        run("Int8Transpose", ["X"], axes=[0, 0, 1], Y_scale=f32(0.3), Y_zero_point=1)


@pytest.mark.parametrize("group", [1, 2, 3, 6])
def test_channel_shuffle(fresh, group):
    x = u8(2, 3, 2, 6)
    feed_q("X", x, 0.1, 3)
    y = run("Int8ChannelShuffle", ["X"], group=group, order="NHWC", Y_scale=f32(0.1),
            Y_zero_point=3)
    n, h, w, c = x.shape
    want = x.reshape(n, h, w, group, c // group).swapaxes(3, 4).reshape(x.shape)
    np.testing.assert_array_equal(y.data, want)


def test_channel_shuffle_errors(fresh):
    feed_q("X", u8(1, 2, 2, 6), 0.1, 3)
    q = dict(Y_scale=f32(0.1), Y_zero_point=3)
    with pytest.raises(errors.ShapeError, match="Int8ChannelShuffle.*'X'.*group"):
        run("Int8ChannelShuffle", ["X"], group=4, order="NHWC", **q)
    with pytest.raises(errors.InvalidArgumentError, match="NHWC"):
        run("Int8ChannelShuffle", ["X"], group=2, **q)
    feed_q("X3", u8(2, 6), 0.1, 3)
    with pytest.raises(errors.ShapeError, match="Int8ChannelShuffle.*'X3'.*4-D"):
        run("Int8ChannelShuffle", ["X3"], group=2, order="NHWC", **q)


# ---------------------------------------------- transposed convolution --


def conv_transpose_model(x, xs, xz, w, ws, wz, b, ys, yz, stride, pad, adj):
    n, h, wd, c = x.shape
    _, kh, kw, m = w.shape
    fh, fw = (h - 1) * stride + kh + adj, (wd - 1) * stride + kw + adj
    full = np.zeros((n, fh, fw, m), np.int64)
    xc = x.astype(np.int64) - xz
    wc = w.astype(np.int64) - wz
    for iy in range(h):
        for ix in range(wd):
            for ky in range(kh):
                for kx in range(kw):
                    full[:, iy * stride + ky, ix * stride + kx, :] += xc[:, iy, ix, :] @ wc[:, ky, kx, :]
    acc = full[:, pad:fh - pad, pad:fw - pad, :] + b
    y = requant(acc, float(np.float64(xs) * np.float64(ws) / np.float64(ys))) + yz
    return np.clip(y, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("k,stride,pad,adj", [(1, 1, 0, 0), (3, 1, 1, 0), (3, 2, 1, 1),
                                              (2, 2, 0, 0), (4, 3, 2, 2)])
def test_conv_transpose(fresh, k, stride, pad, adj):
    x = u8(2, 4, 3, 5)
    wt = u8(5, k, k, 3)
    b = RNG.integers(-2000, 2000, 3).astype(np.int32)
    xs, xz, ws, wz, ys, yz = 0.02, 117, 0.004, 125, 0.05 * k, 128
    feed_q("X", x, xs, xz)
    feed_q("W", wt, ws, wz)
    workspace.FeedBlob("B", Int8Tensor(b, f32(xs) * f32(ws), 0))
    y = run("Int8ConvTranspose", ["X", "W", "B"], kernel=k, stride=stride, pad=pad, adj=adj,
            order="NHWC", Y_scale=ys, Y_zero_point=yz)
    want = conv_transpose_model(x, f32(xs), xz, wt, f32(ws), wz, b, f32(ys), yz, stride, pad, adj)
    assert y.data.shape == want.shape
    assert (y.scale, y.zero_point) == (f32(ys), yz)
    np.testing.assert_array_equal(y.data, want)


def test_conv_transpose_errors(fresh):
    feed_q("X", u8(1, 3, 3, 4), 0.02, 0)
    feed_q("W", u8(4, 3, 3, 2), 0.01, 128)
    feed_q("W5", u8(5, 3, 3, 2), 0.01, 128)
    workspace.FeedBlob("B", Int8Tensor(np.zeros(2, np.int32), 0.0002, 0))
    workspace.FeedBlob("F", np.zeros((1, 3, 3, 4), np.float32))
    ct = dict(kernel=3, stride=2, order="NHWC", Y_scale=0.1)
    with pytest.raises(errors.DataTypeError, match="Int8ConvTranspose.*'F'"):
        run("Int8ConvTranspose", ["F", "W", "B"], **ct)
    with pytest.raises(errors.ShapeError, match="Int8ConvTranspose.*'W5'"):
        run("Int8ConvTranspose", ["X", "W5", "B"], **ct)
    with pytest.raises(errors.InvalidArgumentError, match="adj"):
        run("Int8ConvTranspose", ["X", "W", "B"], adj=2, **ct)
    with pytest.raises(errors.InvalidArgumentError, match="NHWC"):
        run("Int8ConvTranspose", ["X", "W", "B"], kernel=3, Y_scale=0.1)
    with pytest.raises(errors.InvalidArgumentError, match="group"):
        run("Int8ConvTranspose", ["X", "W", "B"], group=2, **ct)
    with pytest.raises(errors.InvalidArgumentError, match="Int8ConvTranspose.*multiplier"):
        run("Int8ConvTranspose", ["X", "W", "B"], kernel=3, stride=2, order="NHWC",
            Y_scale=1e-7)


# ------------------------------------------------------------ RoIAlign --


def roi_align_model(x, xs, xz, rois, ys, yz, ph, pw, spatial_scale, sampling):
    """Caffe2's Int8RoIAlign in float32 and integers, written out."""
    f = np.float32
    n, h, w, c = x.shape
    out = np.zeros((len(rois), ph, pw, c), np.uint8)
    for r, row in enumerate(np.asarray(rois, np.float32)):
        bi = int(row[0]) if len(row) == 5 else 0
        x1, y1, x2, y2 = (v * f(spatial_scale) for v in row[-4:])
        rw, rh = max(x2 - x1, f(1)), max(y2 - y1, f(1))
        bh, bw = rh / f(ph), rw / f(pw)
        gh = sampling if sampling > 0 else int(np.ceil(bh))
        gw = sampling if sampling > 0 else int(np.ceil(bw))
        real = float(np.float64(f(xs)) / (np.float64(f(ys)) * 255.0 * (gh * gw)))
        img = x[bi].astype(np.int64)
        for py in range(ph):
            for px in range(pw):
                acc = np.zeros(c, np.int64)
                for iy in range(gh):
                    yy = y1 + f(py) * bh + (f(iy) + f(0.5)) * bh / f(gh)
                    for ix in range(gw):
                        xx = x1 + f(px) * bw + (f(ix) + f(0.5)) * bw / f(gw)
                        acc -= 255 * xz
                        if yy < -1 or yy > h or xx < -1 or xx > w:
                            continue
                        yv, xv = max(yy, f(0)), max(xx, f(0))
                        y0, x0 = int(yv), int(xv)
                        if y0 >= h - 1:
                            y0 = y1_ = h - 1
                            yv = f(y0)
                        else:
                            y1_ = y0 + 1
                        if x0 >= w - 1:
                            x0 = x1_ = w - 1
                            xv = f(x0)
                        else:
                            x1_ = x0 + 1
                        ly, lx = yv - f(y0), xv - f(x0)
                        hy, hx = f(1) - ly, f(1) - lx
                        wts = [int(np.rint(v * f(255))) for v in (hy * hx, hy * lx, ly * hx, ly * lx)]
                        acc += (wts[0] * img[y0, x0] + wts[1] * img[y0, x1_]
                                + wts[2] * img[y1_, x0] + wts[3] * img[y1_, x1_])
                out[r, py, px] = np.clip(requant(acc, real) + yz, 0, 255)
    return out


ROIS = np.array([
    [0, 0.0, 0.0, 7.0, 5.0],
    [1, 1.3, 2.2, 6.9, 7.7],
    [0, -2.0, -1.5, 3.5, 2.0],     # partly outside
    [1, 5.5, 4.0, 5.7, 4.1],       # smaller than a pixel: taken as 1 x 1
    [0, 20.0, 20.0, 30.0, 30.0],   # wholly outside
], np.float32)


@pytest.mark.parametrize("sampling", [2, 0, -1])
@pytest.mark.parametrize("spatial_scale,ph,pw", [(1.0, 2, 2), (0.5, 3, 2), (1.25, 1, 4)])
def test_roi_align(fresh, sampling, spatial_scale, ph, pw):
    x = u8(2, 8, 9, 3)
    xs, xz, ys, yz = 0.05, 100, 0.04, 90
    feed_q("X", x, xs, xz)
    workspace.FeedBlob("R", ROIS)
    y = run("Int8RoIAlign", ["X", "R"], spatial_scale=spatial_scale, pooled_h=ph, pooled_w=pw,
            sampling_ratio=sampling, Y_scale=ys, Y_zero_point=yz)
    want = roi_align_model(x, xs, xz, ROIS, ys, yz, ph, pw, spatial_scale, sampling)
    assert y.data.shape == (len(ROIS), ph, pw, 3)
    assert (y.scale, y.zero_point) == (f32(ys), yz)
    np.testing.assert_array_equal(y.data, want)


def test_roi_align_approximates_the_float_op(fresh):
    x = u8(1, 10, 10, 2)
    xs, xz = f32(0.05), 100
    feed_q("X", x, xs, xz)
    rois = np.array([[1.0, 1.5, 8.0, 7.2], [0.0, 0.0, 9.0, 9.0]], np.float32)
    workspace.FeedBlob("R", rois)
    y = run("Int8RoIAlign", ["X", "R"], pooled_h=3, pooled_w=3, sampling_ratio=2,
            Y_scale=xs, Y_zero_point=xz)
    workspace.FeedBlob("Xf", ((x.astype(np.float32) - xz) * xs))
    yf = run("RoIAlign", ["Xf", "R"], ["Yf"], pooled_h=3, pooled_w=3, sampling_ratio=2,
             order="NHWC")
    got = (y.data.astype(np.float64) - xz) * xs
    # Weights rounded to 255ths: within two steps of the output's scale.
    assert np.abs(got - yf).max() <= 2 * xs


def test_roi_align_empty_and_errors(fresh):
    feed_q("X", u8(1, 4, 4, 3), 0.1, 0)
    workspace.FeedBlob("R0", np.zeros((0, 5), np.float32))
    y = run("Int8RoIAlign", ["X", "R0"], pooled_h=2, pooled_w=3, Y_scale=0.1)
    assert y.data.shape == (0, 2, 3, 3)
    workspace.FeedBlob("R3", np.zeros((2, 3), np.float32))
    with pytest.raises(errors.ShapeError, match="Int8RoIAlign.*'R3'"):
        run("Int8RoIAlign", ["X", "R3"], Y_scale=0.1)
    workspace.FeedBlob("Rb", np.array([[2, 0, 0, 1, 1]], np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="Int8RoIAlign.*'Rb'.*batch index"):
        run("Int8RoIAlign", ["X", "Rb"], Y_scale=0.1)
    workspace.FeedBlob("Rn", np.array([[0, np.nan, 0, 1, 1]], np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="Int8RoIAlign.*'Rn'"):
        run("Int8RoIAlign", ["X", "Rn"], Y_scale=0.1)
    workspace.FeedBlob("Rd", np.zeros((1, 5), np.float64))
    with pytest.raises(errors.DataTypeError, match="Int8RoIAlign.*'Rd'"):
        run("Int8RoIAlign", ["X", "Rd"], Y_scale=0.1)
    workspace.FeedBlob("F", np.zeros((1, 4, 4, 3), np.float32))
    workspace.FeedBlob("R", np.array([[0, 0, 0, 1, 1]], np.float32))
    with pytest.raises(errors.DataTypeError, match="Int8RoIAlign.*'F'"):
        run("Int8RoIAlign", ["F", "R"], Y_scale=0.1)
    with pytest.raises(errors.InvalidArgumentError, match="NHWC"):
        run("Int8RoIAlign", ["X", "R"], order="NCHW", Y_scale=0.1)
    with pytest.raises(errors.InvalidArgumentError, match="pooled_h"):
        run("Int8RoIAlign", ["X", "R"], pooled_h=0, Y_scale=0.1)
    with pytest.raises(errors.InvalidArgumentError, match="Int8RoIAlign.*multiplier"):
        run("Int8RoIAlign", ["X", "R"], sampling_ratio=1, Y_scale=1e-6)


# ----------------------------------------------------- shape inference --


def test_shape_inference_of_the_int8_ops(fresh):
    net = core.Net("q")
    net.Int8Quantize(["X"], ["Xq"], Y_scale=0.1, Y_zero_point=128)
    net.Int8Relu(["Xq"], ["R"], Y_scale=0.1, Y_zero_point=128)
    net.Int8Sigmoid(["Xq"], ["S"], Y_scale=1.0 / 256)
    net.Int8Add(["Xq", "R"], ["A"], Y_scale=0.2, Y_zero_point=128)
    net.Int8Concat(["Xq", "R"], ["C", "split"], order="NHWC", Y_scale=0.1, Y_zero_point=128)
    net.Int8Flatten(["C"], ["Fl"], axis=2, Y_scale=0.1, Y_zero_point=128)
    net.Int8Reshape(["Xq"], ["Re", "old"], shape=[2, -1], Y_scale=0.1, Y_zero_point=128)
    net.Int8Transpose(["Xq"], ["T"], axes=[0, 3, 1, 2], Y_scale=0.1, Y_zero_point=128)
    net.Int8Slice(["Xq"], ["Sl"], starts=[0, 1], ends=[-1, 3], Y_scale=0.1, Y_zero_point=128)
    net.Int8ChannelShuffle(["Xq"], ["Sh"], group=2, order="NHWC", Y_scale=0.1,
                           Y_zero_point=128)
    net.Int8RoIAlign(["Xq", "rois"], ["RA"], pooled_h=2, pooled_w=3, Y_scale=0.1)
    net.Int8Dequantize(["A"], ["D"])
    net.Int8GivenIntTensorFill([], ["b"], shape=[7], values=[0] * 7)
    net.Int8GivenTensorFill([], ["w"], shape=[7, 4], values=bytes(28))
    net.Int8FC(["Fl", "w", "b"], ["fc"], Y_scale=1.0)
    shapes, types = workspace.InferShapesAndTypes(
        [net], {"X": [2, 5, 6, 4], "rois": [9, 5]})
    T = core.DataType
    want = {
        "Xq": [2, 5, 6, 4], "R": [2, 5, 6, 4], "S": [2, 5, 6, 4], "A": [2, 5, 6, 4],
        "C": [2, 5, 6, 8], "split": [2], "Fl": [10, 48], "Re": [2, 120], "old": [4],
        "T": [2, 4, 5, 6], "Sl": [2, 2, 6, 4], "Sh": [2, 5, 6, 4], "RA": [9, 2, 3, 4],
        "D": [2, 5, 6, 4], "b": [7], "w": [7, 4], "fc": [10, 7],
    }
    for name, dims in want.items():
        assert shapes[name] == dims, name
    assert types["Xq"] == T.UINT8 and types["C"] == T.UINT8 and types["RA"] == T.UINT8
    assert types["split"] == T.INT32 and types["old"] == T.INT64 and types["b"] == T.INT32
    assert types["D"] == T.FLOAT and types["fc"] == T.UINT8
    # From the workspace: a fed Int8TensorCPU is known by its data.
    feed_q("Q", u8(3, 4), 0.1, 0)
    net2 = core.Net("q2")
    net2.Int8Relu(["Q"], ["Qr"], Y_scale=0.1)
    shapes, types = workspace.InferShapesAndTypes([net2])
    assert shapes["Q"] == [3, 4] and shapes["Qr"] == [3, 4]
    assert types["Qr"] == T.UINT8
