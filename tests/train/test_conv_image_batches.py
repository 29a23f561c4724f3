"""Convolutions over many small NCHW images (fewer output pixels than a
wide GEMM wants) run several images through one window matrix (issue 29:
LeNet's 4x4 layer over 64 images made 64 products of 16 columns). The
forward output, the input gradient and the filter and bias gradients of
such batches (full ones, a partial last one, groups, strides, dilations,
pads, 1x1 windows; batches on the kernel pool) must equal a plain numpy model
of the convolution written here: strided slices of the padded input and
einsum over channels, no window matrix."""

import numpy as np
import pytest
from ferrocaffe import core, workspace


def conv_ref(x, w, b, stride, pad, dil, group):
    n, c, h, wd = x.shape
    k, cg, kh, kw = w.shape
    mg = k // group
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    y = np.zeros((n, k, oh, ow), x.dtype)
    for g in range(group):
        for a in range(kh):
            for e in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg,
                           a * dil:a * dil + stride * (oh - 1) + 1:stride,
                           e * dil:e * dil + stride * (ow - 1) + 1:stride]
                y[:, g * mg:(g + 1) * mg] += np.einsum('ncij,kc->nkij', patch, w[g * mg:(g + 1) * mg, :, a, e])
    return y + b[None, :, None, None]


def conv_grads_ref(x, w, dy, stride, pad, dil, group):
    n, c, h, wd = x.shape
    k, cg, kh, kw = w.shape
    mg = k // group
    oh, ow = dy.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    dxp = np.zeros_like(xp)
    dw = np.zeros_like(w)
    for g in range(group):
        dyg = dy[:, g * mg:(g + 1) * mg]
        for a in range(kh):
            for e in range(kw):
                sl = (slice(None), slice(g * cg, (g + 1) * cg),
                      slice(a * dil, a * dil + stride * (oh - 1) + 1, stride),
                      slice(e * dil, e * dil + stride * (ow - 1) + 1, stride))
                dw[g * mg:(g + 1) * mg, :, a, e] = np.einsum('nkij,ncij->kc', dyg, xp[sl])
                dxp[sl] += np.einsum('nkij,kc->ncij', dyg, w[g * mg:(g + 1) * mg, :, a, e])
    return dw, dy.sum(axis=(0, 2, 3)), dxp[:, :, pad:pad + h, pad:pad + wd]


# (images, in channels, side, out channels, kernel, stride, pad, dilation, group)
CASES = [
    (64, 20, 4, 50, 3, 1, 1, 1, 1),   # LeNet's second layer on 8x8 digits
    (64, 1, 8, 20, 3, 1, 1, 1, 1),    # its first
    (37, 6, 12, 10, 5, 1, 0, 1, 1),   # 8x8 outputs, a partial last batch
    (5, 4, 5, 6, 3, 2, 1, 1, 2),      # stride 2, two groups
    (9, 3, 7, 4, 3, 1, 2, 2, 1),      # dilation 2, pad 2
    (11, 8, 6, 12, 1, 1, 0, 1, 4),    # 1x1 window, four groups
    (3, 2, 3, 3, 2, 1, 0, 1, 1),      # 2x2 window, 2x2 outputs
    (2, 64, 7, 64, 3, 1, 1, 1, 1),    # two 7x7 images, wide channels
]


@pytest.mark.parametrize('case', CASES, ids=lambda c: 'n%d_c%d_%dx%d_k%d_w%d_s%d_p%d_d%d_g%d' % (
    c[0], c[1], c[2], c[2], c[3], c[4], c[5], c[6], c[7], c[8]))
@pytest.mark.parametrize('dtype', [np.float64, np.float32])
def test_batched_small_images_match_a_numpy_convolution(case, dtype):
    n, c, side, k, kern, stride, pad, dil, group = case
    rng = np.random.default_rng(sum(case))
    x = rng.standard_normal((n, c, side, side)).astype(dtype)
    w = rng.standard_normal((k, c // group, kern, kern)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype)
    args = dict(kernel=kern, stride=stride, pad=pad, dilation=dil, group=group)
    y_ref = conv_ref(x, w, b, stride, pad, dil, group)
    dy = rng.standard_normal(y_ref.shape).astype(dtype)
    dw_ref, db_ref, dx_ref = conv_grads_ref(x, w, dy, stride, pad, dil, group)
    for name, v in (('x', x), ('w', w), ('b', b), ('dy', dy)):
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator('Conv', ['x', 'w', 'b'], ['y'], **args))
    workspace.RunOperatorOnce(core.CreateOperator('ConvGradient', ['x', 'w', 'dy'], ['dw', 'db', 'dx'], **args))
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(workspace.FetchBlob('y'), y_ref, **tol)
    np.testing.assert_allclose(workspace.FetchBlob('dw'), dw_ref, **tol)
    np.testing.assert_allclose(workspace.FetchBlob('db'), db_ref, **tol)
    np.testing.assert_allclose(workspace.FetchBlob('dx'), dx_ref, **tol)
