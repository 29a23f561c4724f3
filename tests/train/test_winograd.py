"""Float32 3x3 stride-1 convolutions (issue 15), which run on the Winograd
F(2x2, 3x3) path (rust/core/src/ops/conv/winograd.rs) when the batch has at
least 256 tiles of 2x2 outputs and an image at most 64 output pixels, or at
least 2500 with 16 to 256 channels each side: Conv, ConvGradient's dX, ConvTranspose and
ConvTransposeGradient's dX, against the float64 numpy references of
test_conv_ops (sums of strided slices, no im2col, no Winograd). The kernel
itself is also checked against the direct sum at every edge shape in its
Rust unit test (`ops::winograd::tests`).

Tolerance: Winograd adds and subtracts transformed values before the
products, so its rounding error is a few times that of a direct sum. With
standard normal inputs an output is a sum of 9 * C products of typical size
sqrt(9 * C); we require |ours - ref| <= 1e-4 * sqrt(9 * C) + 1e-4 *
|ref| elementwise (float32's epsilon is 1.2e-7; im2col lands within 1e-6 of
that scale). Gradient checks (float64, the im2col path) are in
test_conv_ops.
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from test_conv_ops import SETTINGS, conv_ref, conv_transpose_ref, run, to_nchw, to_nhwc


def close(got, ref, channels):
    scale = np.sqrt(9.0 * channels)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * scale)


@st.composite
def cases(draw):
    return dict(
        # 130 images: enough tiles (2x2 outputs) for the Winograd path
        # even at the smallest sizes; 1 and 2 exercise the im2col path of
        # small products, which must agree to the same tolerance.
        n=draw(st.sampled_from([1, 2, 130])),
        c=draw(st.sampled_from([1, 2, 3, 5, 8, 17, 40])),
        m=draw(st.sampled_from([1, 2, 4, 7, 16, 33])),
        h=draw(st.integers(1, 13)),
        w=draw(st.integers(1, 13)),
        pads=[draw(st.integers(0, 2)) for _ in range(4)],
        order=draw(st.sampled_from(["NCHW", "NHWC"])),
        bias=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def inputs(c, transposed=False):
    rng = np.random.default_rng(c["seed"])
    x = rng.standard_normal((c["n"], c["c"], c["h"], c["w"])).astype(np.float32)
    wshape = (c["c"], c["m"], 3, 3) if transposed else (c["m"], c["c"], 3, 3)
    w = rng.standard_normal(wshape).astype(np.float32)
    b = rng.standard_normal(c["m"]).astype(np.float32) if c["bias"] else None
    return x, w, b


def feed(c, x, w, b):
    if c["order"] == "NHWC":
        x, w = to_nhwc(x), to_nhwc(w)
    return {"x": x, "w": w} | ({"b": b} if b is not None else {})


def back(c, a):
    return to_nchw(a) if c["order"] == "NHWC" else a


@settings(**SETTINGS)
@given(c=cases())
def test_conv3x3_forward_and_input_gradient(fresh, c):
    h, w_, (pt, pl, pb, pr) = c["h"], c["w"], c["pads"]
    assume(h + pt + pb >= 3 and w_ + pl + pr >= 3)  # else no output position
    x, w, b = inputs(c)
    args = dict(kernel=3, pads=c["pads"], order=c["order"])
    ref = conv_ref(x.astype(np.float64), w.astype(np.float64), b, [1, 1], c["pads"], [1, 1], 1)
    (y,) = run("Conv", feed(c, x, w, b), ["y"], **args)
    assert y.dtype == np.float32
    close(back(c, y), ref, c["c"])
    # dX is the transposed convolution of dY with the same filter.
    rng = np.random.default_rng(c["seed"] + 1)
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    adj = [h + pt + pb - (ref.shape[2] + 2), w_ + pl + pr - (ref.shape[3] + 2)]
    dx_ref = conv_transpose_ref(dy.astype(np.float64), w.astype(np.float64), None, [1, 1], c["pads"], adj, 1)
    ins = feed(c, x, w, None)
    ins["dy"] = to_nhwc(dy) if c["order"] == "NHWC" else dy
    dw, dx = run("ConvGradient", ins, ["dw", "dx"], no_bias=1, **args)
    assert dx.shape == ins["x"].shape
    close(back(c, dx), dx_ref, c["m"])
    # dW stays on im2col: exact up to float32 sums.
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pt, pb), (pl, pr)])
    oh, ow = ref.shape[2:]
    dw_ref = np.zeros(w.shape)
    for a in range(3):
        for e in range(3):
            dw_ref[:, :, a, e] = np.einsum("nmij,ncij->mc", dy, xp[:, :, a:a + oh, e:e + ow])
    close(back(c, dw), dw_ref, c["n"] * oh * ow / 9)


@settings(**SETTINGS)
@given(c=cases())
def test_conv_transpose3x3_forward_and_input_gradient(fresh, c):
    x, w, b = inputs(c, transposed=True)
    full = [c["h"] + 2, c["w"] + 2]
    pads = list(c["pads"])
    # The cropped output must stay non-empty.
    for i in range(2):
        while pads[i] + pads[2 + i] >= full[i]:
            pads[i], pads[2 + i] = max(0, pads[i] - 1), max(0, pads[2 + i] - 1)
    args = dict(kernel=3, pads=pads, order=c["order"])
    ref = conv_transpose_ref(x.astype(np.float64), w.astype(np.float64), b, [1, 1], pads, [0, 0], 1)
    (y,) = run("ConvTranspose", feed(c, x, w, b), ["y"], **args)
    close(back(c, y), ref, c["c"])
    # ConvTranspose's dX is the convolution of dY with the same filter.
    rng = np.random.default_rng(c["seed"] + 1)
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    ins = feed(c, x, w, None)
    ins["dy"] = to_nhwc(dy) if c["order"] == "NHWC" else dy
    _dw, dx = run("ConvTransposeGradient", ins, ["dw", "dx"], no_bias=1, **args)
    # dX[n, c] = sum over m, a, e of dY_padded[n, m, i + a, j + e] * w[c, m, a, e]
    dyp = np.pad(dy.astype(np.float64), [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    want = np.zeros(x.shape)
    for a in range(3):
        for e in range(3):
            want += np.einsum("nmij,cm->ncij", dyp[:, :, a:a + c["h"], e:e + c["w"]], w[:, :, a, e])
    close(back(c, dx), want, c["m"])


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize(
    "n,c,m,hw",
    [(1, 64, 64, 30), (32, 128, 64, 7), (300, 3, 8, 5), (20, 16, 24, 8), (1, 16, 24, 57), (2, 24, 16, 52),
     (1, 8, 16, 56)],
)
def test_conv3x3_layer_shapes(fresh, order, n, c, m, hw):
    """Layer-sized products: many tiles (several blocks on the kernel pool)
    and many channels; the first and the last (too few channels) on
    im2col, the others on Winograd (the last two of those: large images,
    odd and even sizes)."""
    case = dict(n=n, c=c, m=m, h=hw, w=hw, pads=[1, 1, 1, 1], order=order, bias=True, seed=n * c + m)
    x, w, b = inputs(case)
    ref = conv_ref(x.astype(np.float64), w.astype(np.float64), b, [1, 1], [1] * 4, [1, 1], 1)
    (y,) = run("Conv", feed(case, x, w, b), ["y"], kernel=3, pad=1, order=order)
    close(back(case, y), ref, c)
    rng = np.random.default_rng(1)
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    ins = feed(case, x, w, None)
    ins["dy"] = to_nhwc(dy) if order == "NHWC" else dy
    (dx,) = run("ConvGradient", ins, ["dw", "db", "dx"], kernel=3, pad=1, order=order)[2:]
    dx_ref = conv_transpose_ref(dy.astype(np.float64), w.astype(np.float64), None, [1, 1], [1] * 4, [0, 0], 1)
    close(back(case, dx), dx_ref, m)


def test_float64_stays_exact(fresh):
    """float64 3x3 convolutions keep the im2col path (exact to 1e-10)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 9, 8))
    w = rng.standard_normal((4, 5, 3, 3))
    (y,) = run("Conv", {"x": x, "w": w}, ["y"], kernel=3, pad=1)
    np.testing.assert_allclose(y, conv_ref(x, w, None, [1, 1], [1] * 4, [1, 1], 1), rtol=1e-10, atol=1e-10)
