"""The detection ops (issue 29): RoIAlign, BBoxTransform, BoxWithNMSLimit
and GenerateProposals, with Caffe2's names, arguments and outputs.

Expected values come from plain-numpy models of each op's rules written
here (loops over RoIs, bins and samples; Detectron's box formulas; greedy
NMS), not from ferrocaffe. RoIAlign's gradient is checked by central
differences in tests/train/_op_gradient_specs.py and through
AddGradientOperators below. Bad inputs and arguments raise typed errors
naming the op.
"""

import math

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace

CLIP = math.log(1000.0 / 16.0)


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


# ------------------------------------------------------------ RoIAlign --


def bilinear_ref(plane, y, x):
    h, w = plane.shape
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return 0.0
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(math.floor(y)), int(math.floor(x))
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * plane[y0, x0] + (1 - ly) * lx * plane[y0, x1]
            + ly * (1 - lx) * plane[y1, x0] + ly * lx * plane[y1, x1])


def roi_align_ref(x, rois, scale, ph, pw, sampling, aligned):
    """x in NCHW, float64; every bin the mean of its grid of samples."""
    n, c, h, w = x.shape
    out = np.zeros((len(rois), c, ph, pw))
    off = 0.5 if aligned else 0.0
    for r, roi in enumerate(rois):
        b, box = (int(roi[0]), roi[1:]) if len(roi) == 5 else (0, roi)
        x1, y1, x2, y2 = (v * scale - off for v in box)
        rw, rh = x2 - x1, y2 - y1
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / ph, rw / pw
        gh = sampling if sampling > 0 else int(math.ceil(rh / ph))
        gw = sampling if sampling > 0 else int(math.ceil(rw / pw))
        count = max(gh * gw, 1)
        for ch in range(c):
            for i in range(ph):
                for j in range(pw):
                    acc = 0.0
                    for iy in range(gh):
                        yy = y1 + i * bh + (iy + 0.5) * bh / gh
                        for ix in range(gw):
                            xx = x1 + j * bw + (ix + 0.5) * bw / gw
                            acc += bilinear_ref(x[b, ch], yy, xx)
                    out[r, ch, i, j] = acc / count
    return out


ROIS = np.array([[0, 0.3, 0.7, 4.1, 3.6], [1, 1.2, 0.4, 7.3, 5.1], [0, -1.5, 2.0, 9.5, 8.0],
                 [1, 3.0, 3.0, 3.2, 3.1], [0, 6.0, 6.5, 7.0, 7.9]], np.float32)


@pytest.mark.parametrize("order", ["NCHW", "NHWC"])
@pytest.mark.parametrize("args", [
    dict(pooled_h=2, pooled_w=2, sampling_ratio=2),
    dict(pooled_h=3, pooled_w=2, spatial_scale=0.5),
    dict(pooled_h=2, pooled_w=3, sampling_ratio=0, aligned=1),
    dict(pooled_h=1, pooled_w=1, spatial_scale=0.75, sampling_ratio=3, aligned=1),
])
def test_roi_align_matches_numpy_model(fresh, order, args):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 8, 7)).astype(np.float32)
    xs = np.ascontiguousarray(np.moveaxis(x, 1, -1)) if order == "NHWC" else x
    (y,) = run("RoIAlign", {"X": xs, "R": ROIS}, ["Y"], order=order, **args)
    ref = roi_align_ref(x.astype(np.float64), ROIS.astype(np.float64), args.get("spatial_scale", 1.0),
                        args["pooled_h"], args["pooled_w"], args.get("sampling_ratio", -1),
                        args.get("aligned", 0))
    if order == "NHWC":
        ref = np.moveaxis(ref, 1, -1)
    assert y.dtype == np.float32 and y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_roi_align_four_columns_and_empty_rois(fresh):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    r4 = ROIS[[0, 2], 1:]
    (y,) = run("RoIAlign", {"X": x, "R": r4}, ["Y"], pooled_h=2, pooled_w=2)
    np.testing.assert_allclose(y, roi_align_ref(x.astype(float), r4.astype(float), 1.0, 2, 2, -1, 0),
                               rtol=1e-5, atol=1e-5)
    (e,) = run("RoIAlign", {"X": x, "R": np.zeros((0, 5), np.float32)}, ["E"], pooled_h=3, pooled_w=2)
    assert e.shape == (0, 2, 3, 2)


def test_roi_align_gradient_through_the_backward_pass(fresh):
    # AddGradientOperators finds RoIAlign's maker; dX is the adjoint of the
    # linear map X -> Y, so <dX, X'> = <dY, RoIAlign(X')> for any X'.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 2, 6, 6)).astype(np.float32)
    net = core.Net("roi")
    y = net.RoIAlign(["X", "R"], "Y", pooled_h=2, pooled_w=3, sampling_ratio=2)
    loss = net.SumElements(net.Mul([y, "W"], "wy"), "loss")
    net.AddGradientOperators([loss])
    assert "RoIAlignGradient" in [op.type for op in net.Proto().op]
    wts = rng.standard_normal((len(ROIS), 2, 2, 3)).astype(np.float32)
    for k, v in {"X": x, "R": ROIS, "W": wts}.items():
        workspace.FeedBlob(k, v)
    workspace.RunNetOnce(net)
    dx = workspace.FetchBlob("X_grad")
    x2 = rng.standard_normal(x.shape)
    lhs = float((dx.astype(np.float64) * x2).sum())
    rhs = float((wts * roi_align_ref(x2, ROIS.astype(float), 1.0, 2, 3, 2, 0)).sum())
    assert abs(lhs - rhs) < 1e-4 * max(1.0, abs(rhs))


def test_roi_align_bad_inputs_are_typed_errors(fresh):
    x = np.zeros((1, 2, 4, 4), np.float32)
    with pytest.raises(errors.ShapeError, match="RoIAlign"):
        run("RoIAlign", {"X": x, "R": np.zeros((2, 3), np.float32)}, ["Y"])
    with pytest.raises(errors.ShapeError, match="RoIAlign"):
        run("RoIAlign", {"X": np.zeros((2, 4, 4), np.float32), "R": ROIS[:1]}, ["Y"])
    with pytest.raises(errors.InvalidArgumentError, match="RoIAlign"):
        run("RoIAlign", {"X": x, "R": np.array([[3, 0, 0, 1, 1]], np.float32)}, ["Y"])
    with pytest.raises(errors.InvalidArgumentError, match="pooled_h"):
        run("RoIAlign", {"X": x, "R": ROIS[:1]}, ["Y"], pooled_h=0)
    with pytest.raises(errors.InvalidArgumentError, match="order"):
        run("RoIAlign", {"X": x, "R": ROIS[:1]}, ["Y"], order="NCWH")
    with pytest.raises(errors.DataTypeError, match="RoIAlign"):
        run("RoIAlign", {"X": x.astype(np.int32), "R": ROIS[:1]}, ["Y"])
    with pytest.raises(errors.ShapeError, match="RoIAlignGradient"):
        run("RoIAlignGradient", {"X": x, "R": ROIS[:1], "dY": np.zeros((1, 2, 3, 3), np.float32)},
            ["dX"])


# -------------------------------------------------------- BBoxTransform --


def xform_ref(boxes, deltas, weights, plus, correct):
    wx, wy, ww, wh = weights
    w = boxes[:, 2] - boxes[:, 0] + plus
    h = boxes[:, 3] - boxes[:, 1] + plus
    cx, cy = boxes[:, 0] + 0.5 * w, boxes[:, 1] + 0.5 * h
    dx, dy = deltas[:, 0] / wx, deltas[:, 1] / wy
    dw = np.minimum(deltas[:, 2] / ww, CLIP)
    dh = np.minimum(deltas[:, 3] / wh, CLIP)
    pcx, pcy, pw, ph = dx * w + cx, dy * h + cy, np.exp(dw) * w, np.exp(dh) * h
    return np.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw - correct,
                     pcy + 0.5 * ph - correct], axis=1)


def bbox_transform_ref(rois, deltas, im_info, weights=(1, 1, 1, 1), apply_scale=True,
                       correct=False, plus=1.0):
    rois, deltas, im_info = (a.astype(np.float64) for a in (rois, deltas, im_info))
    batch = rois[:, 0].astype(int) if rois.shape[1] == 5 else np.zeros(len(rois), int)
    boxes = rois[:, -4:]
    k = deltas.shape[1] // 4
    out = np.zeros_like(deltas)
    for i in range(len(rois)):
        hh, ww, s = im_info[batch[i]]
        after = s if apply_scale else 1.0
        ih, iw = round(hh / s), round(ww / s)
        for j in range(k):
            b = xform_ref(boxes[i:i + 1] / s, deltas[i:i + 1, 4 * j:4 * j + 4], weights, plus,
                          1.0 if correct else 0.0)[0]
            b[[0, 2]] = np.clip(b[[0, 2]], 0, iw - plus)
            b[[1, 3]] = np.clip(b[[1, 3]], 0, ih - plus)
            out[i, 4 * j:4 * j + 4] = b * after
    splits = np.bincount(batch, minlength=len(im_info)).astype(np.float32)
    return out, splits


def random_rois(rng, n, nimg, size=60.0):
    x1 = rng.uniform(0, size * 0.7, n)
    y1 = rng.uniform(0, size * 0.7, n)
    w = rng.uniform(2, size * 0.4, n)
    h = rng.uniform(2, size * 0.4, n)
    b = np.sort(rng.integers(0, nimg, n))
    return np.stack([b, x1, y1, x1 + w, y1 + h], axis=1).astype(np.float32)


@pytest.mark.parametrize("kw", [
    {},
    {"weights": [10.0, 10.0, 5.0, 5.0], "correct_transform_coords": 1},
    {"apply_scale": 0, "weights": [2.0, 3.0, 1.5, 0.5]},
    {"legacy_plus_one": 0},
])
def test_bbox_transform_matches_numpy_model(fresh, kw):
    rng = np.random.default_rng(7)
    rois = random_rois(rng, 12, 2)
    deltas = rng.normal(0, 0.6, (12, 4 * 3)).astype(np.float32)
    deltas[0, 2] = 9.0  # clipped in log space
    im_info = np.array([[60, 50, 1.0], [90, 75, 1.5]], np.float32)
    box, splits = run("BBoxTransform", {"rois": rois, "deltas": deltas, "im_info": im_info},
                      ["box", "splits"], **kw)
    ref, ref_splits = bbox_transform_ref(
        rois, deltas, im_info, kw.get("weights", (1, 1, 1, 1)), bool(kw.get("apply_scale", 1)),
        bool(kw.get("correct_transform_coords", 0)), float(kw.get("legacy_plus_one", 1)))
    assert box.dtype == np.float32 and box.shape == deltas.shape
    np.testing.assert_allclose(box, ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(splits, ref_splits)
    # Without a batch column the RoIs are one image's.
    (one,) = run("BBoxTransform", {"r4": rois[:5, 1:], "d": deltas[:5], "i": im_info[:1]}, ["one"], **kw)
    rois0 = rois[:5].copy()
    rois0[:, 0] = 0
    np.testing.assert_allclose(one, bbox_transform_ref(rois0, deltas[:5], im_info[:1],
                                                       kw.get("weights", (1, 1, 1, 1)),
                                                       bool(kw.get("apply_scale", 1)),
                                                       bool(kw.get("correct_transform_coords", 0)),
                                                       float(kw.get("legacy_plus_one", 1)))[0],
                               rtol=1e-5, atol=1e-4)


def test_bbox_transform_rotated(fresh):
    # (ctr_x, ctr_y, w, h, angle): centres shift by dx * w, sizes scale by
    # exp(d), angles add da in degrees and wrap into [-90, 90]; boxes within
    # clip_angle_thresh of upright are clipped to the image.
    rois = np.array([[0, 20, 20, 10, 6, 0.5], [0, 30, 25, 8, 4, 80.0], [0, 2, 3, 10, 10, -30.0]],
                    np.float32)
    deltas = np.array([[0.1, -0.2, 0.3, 0.0, 0.01], [0.0, 0.0, 0.0, 0.0, 0.5],
                       [0.0, 0.0, 0.0, 0.0, -0.2]], np.float32)
    im_info = np.array([[40, 40, 1.0]], np.float32)
    (box,) = run("BBoxTransform", {"rois": rois, "deltas": deltas, "im_info": im_info}, ["box"],
                 rotated=1)
    r = rois[:, 1:].astype(np.float64)
    d = deltas.astype(np.float64)
    ref = np.stack([d[:, 0] * r[:, 2] + r[:, 0], d[:, 1] * r[:, 3] + r[:, 1],
                    np.exp(d[:, 2]) * r[:, 2], np.exp(d[:, 3]) * r[:, 3],
                    r[:, 4] + np.degrees(d[:, 4])], axis=1)
    ref[:, 4] = np.where(ref[:, 4] > 90, ref[:, 4] - 180, np.where(ref[:, 4] < -90, ref[:, 4] + 180,
                                                                   ref[:, 4]))
    # Box 0 is upright within 1 degree: clip its corners (plus one) to 40 x 40.
    cx, cy, w, h = ref[0, :4]
    x1, x2 = np.clip([cx - (w - 1) / 2, cx + (w - 1) / 2], 0, 39)
    y1, y2 = np.clip([cy - (h - 1) / 2, cy + (h - 1) / 2], 0, 39)
    ref[0, :4] = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1 + 1, y2 - y1 + 1]
    np.testing.assert_allclose(box, ref, rtol=1e-5, atol=1e-4)


def test_bbox_transform_bad_inputs(fresh):
    rois = np.zeros((3, 5), np.float32)
    info = np.array([[10, 10, 1]], np.float32)
    with pytest.raises(errors.ShapeError, match="BBoxTransform"):
        run("BBoxTransform", {"r": rois, "d": np.zeros((3, 6), np.float32), "i": info}, ["b"])
    with pytest.raises(errors.ShapeError, match="BBoxTransform"):
        run("BBoxTransform", {"r": rois, "d": np.zeros((2, 4), np.float32), "i": info}, ["b"])
    with pytest.raises(errors.ShapeError, match="BBoxTransform"):
        run("BBoxTransform", {"r": rois, "d": np.zeros((3, 4), np.float32), "i": info[:, :2]}, ["b"])
    bad = rois.copy()
    bad[1, 0] = 4
    with pytest.raises(errors.InvalidArgumentError, match="BBoxTransform"):
        run("BBoxTransform", {"r": bad, "d": np.zeros((3, 4), np.float32), "i": info}, ["b"])
    with pytest.raises(errors.InvalidArgumentError, match="weights"):
        run("BBoxTransform", {"r": rois, "d": np.zeros((3, 4), np.float32), "i": info}, ["b"],
            weights=[1.0, 1.0, 1.0])
    with pytest.raises(errors.InvalidArgumentError, match="angle_bound"):
        run("BBoxTransform", {"r": rois, "d": np.zeros((3, 4), np.float32), "i": info}, ["b"],
            angle_bound_lo=-90, angle_bound_hi=0)
    with pytest.raises(errors.DataTypeError, match="BBoxTransform"):
        run("BBoxTransform", {"r": rois.astype(np.float64), "d": np.zeros((3, 4), np.float32),
                              "i": info}, ["b"])


# ------------------------------------------------------ BoxWithNMSLimit --


def iou_ref(a, b, plus=1.0):
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]) + plus)
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]) + plus)
    inter = iw * ih
    area = lambda x: (x[2] - x[0] + plus) * (x[3] - x[1] + plus)  # noqa: E731
    return inter / (area(a) + area(b) - inter)


def nms_ref(boxes, scores, idx, thresh, limit=None):
    idx = sorted(idx, key=lambda i: -scores[i])
    keep = []
    while idx and (limit is None or len(keep) < limit):
        i = idx.pop(0)
        keep.append(i)
        idx = [j for j in idx if iou_ref(boxes[i], boxes[j]) <= thresh]
    return keep


def soft_nms_ref(boxes, scores, idx, thresh, sigma, min_score, method):
    s = {i: float(scores[i]) for i in idx}
    pending, keep = list(idx), []
    while pending:
        i = max(pending, key=lambda j: (s[j], -pending.index(j)))
        pending.remove(i)
        keep.append(i)
        nxt = []
        for j in pending:
            o = iou_ref(boxes[i], boxes[j])
            if method == "linear":
                s[j] *= (1 - o) if o > thresh else 1.0
            else:
                s[j] *= math.exp(-o * o / sigma)
            if s[j] > min_score:
                nxt.append(j)
        pending = nxt
    return keep, s


def nms_limit_ref(scores, boxes, splits, thresh=0.05, nms=0.3, per_im=100, soft=None):
    out_s, out_b, out_c, out_split = [], [], [], []
    off = 0
    nc = scores.shape[1]
    for cnt in splits:
        sc = scores[off:off + cnt].astype(np.float64)
        bx = boxes[off:off + cnt].astype(np.float64)
        kept = {}
        final = {}
        for j in range(1, nc):
            # The threshold is a float32 argument, compared with float32 scores.
            cand = [i for i in range(cnt) if scores[off + i, j] > np.float32(thresh)]
            cb = bx[:, 4 * j:4 * j + 4]
            if soft:
                k, s = soft_nms_ref(cb, sc[:, j], cand, nms, soft["sigma"], soft["min"], soft["method"])
                kept[j] = k
                final.update({(j, i): s[i] for i in k})
            else:
                kept[j] = nms_ref(cb, sc[:, j], cand, nms, per_im if per_im > 0 else None)
                final.update({(j, i): sc[i, j] for i in kept[j]})
        allk = [(j, i) for j in range(1, nc) for i in kept[j]]
        if per_im > 0 and len(allk) > per_im:
            best = set(sorted(allk, key=lambda p: -final[p])[:per_im])
            kept = {j: [i for i in kept[j] if (j, i) in best] for j in kept}
        n = 0
        for j in range(1, nc):
            for i in kept[j]:
                out_s.append(final[(j, i)])
                out_b.append(bx[i, 4 * j:4 * j + 4])
                out_c.append(j)
                n += 1
        out_split.append(n)
        off += cnt
    return (np.array(out_s), np.array(out_b).reshape(-1, 4), np.array(out_c), np.array(out_split))


def detections(rng, n, nc):
    base = random_rois(rng, n, 1, size=40.0)[:, 1:]
    boxes = np.concatenate([base + rng.normal(0, 1.5, base.shape) for _ in range(nc)], axis=1)
    # Near-duplicates so NMS has work: every third box copies the previous one, shifted.
    boxes[2::3] = boxes[1::3][:len(boxes[2::3])] + 0.7
    boxes[:, 2::4] = np.maximum(boxes[:, 2::4], boxes[:, 0::4] + 1)
    boxes[:, 3::4] = np.maximum(boxes[:, 3::4], boxes[:, 1::4] + 1)
    scores = rng.permutation(n * nc).reshape(n, nc) / float(n * nc)
    return scores.astype(np.float32), boxes.astype(np.float32)


@pytest.mark.parametrize("kw", [
    {},
    {"score_thresh": 0.2, "nms": 0.5, "detections_per_im": 7},
    {"detections_per_im": 0, "nms": 0.1},
    {"soft_nms_enabled": 1, "soft_nms_method": "linear", "nms": 0.3, "detections_per_im": 9},
    {"soft_nms_enabled": 1, "soft_nms_method": "gaussian", "soft_nms_sigma": 0.5,
     "soft_nms_min_score_thres": 0.1},
])
def test_box_with_nms_limit_matches_numpy_model(fresh, kw):
    rng = np.random.default_rng(11)
    scores, boxes = detections(rng, 30, 4)
    splits = np.array([18, 12], np.float32)
    outs = run("BoxWithNMSLimit", {"s": scores, "b": boxes, "sp": splits},
               ["os", "ob", "oc", "osp", "ok", "oks"], **kw)
    soft = None
    if kw.get("soft_nms_enabled"):
        soft = {"method": kw["soft_nms_method"], "sigma": kw.get("soft_nms_sigma", 0.5),
                "min": kw.get("soft_nms_min_score_thres", 0.001)}
    ref = nms_limit_ref(scores, boxes, [18, 12], kw.get("score_thresh", 0.05), kw.get("nms", 0.3),
                        kw.get("detections_per_im", 100), soft)
    os_, ob, oc, osp, ok, oks = outs
    assert len(os_) > 0
    np.testing.assert_allclose(os_, ref[0], rtol=1e-5)
    np.testing.assert_allclose(ob, ref[1], rtol=1e-6)
    np.testing.assert_array_equal(oc, ref[2])
    np.testing.assert_array_equal(osp, ref[3])
    assert ok.dtype == np.int32 and len(ok) == len(os_)
    assert oks.shape == (2, 4) and oks.sum() == len(os_) and (oks[:, 0] == 0).all()
    # keeps index each image's rows: the kept boxes are those rows' boxes.
    first = int(oks[0].sum())
    rows = np.concatenate([ok[:first], ok[first:] + 18])
    cls = oc.astype(int)
    np.testing.assert_array_equal(ob, boxes[rows][np.arange(len(rows))[:, None], 4 * cls[:, None] + np.arange(4)])


def test_box_with_nms_limit_class_layouts(fresh):
    rng = np.random.default_rng(12)
    scores, boxes = detections(rng, 10, 3)
    # Boxes without the background class; classes counted from 0.
    os_, ob, oc = run("BoxWithNMSLimit", {"s": scores, "b": boxes[:, 4:]}, ["os", "ob", "oc"],
                      input_boxes_include_bg_cls=0, output_classes_include_bg_cls=0)
    # Without bg boxes, class j's scores start at column j - 1 (the last
    # column would be the background).
    sc = np.concatenate([scores[:, :2], np.zeros((10, 1), np.float32)], axis=1)
    ref = nms_limit_ref(np.concatenate([np.zeros((10, 1), np.float32), sc[:, :2]], axis=1),
                        boxes, [10])
    np.testing.assert_allclose(os_, ref[0], rtol=1e-6)
    np.testing.assert_allclose(ob, ref[1], rtol=1e-6)
    np.testing.assert_array_equal(oc, ref[2] - 1)
    # Class-agnostic regression: one box per row for every class.
    os2, ob2, oc2 = run("BoxWithNMSLimit", {"s": scores, "b": boxes[:, :4]}, ["os2", "ob2", "oc2"],
                        cls_agnostic_bbox_reg=1)
    ref2 = nms_limit_ref(scores, np.tile(boxes[:, :4], (1, 3)), [10])
    np.testing.assert_allclose(os2, ref2[0], rtol=1e-6)
    np.testing.assert_allclose(ob2, ref2[1], rtol=1e-6)


def test_box_with_nms_limit_bad_inputs(fresh):
    s = np.zeros((4, 3), np.float32)
    with pytest.raises(errors.ShapeError, match="BoxWithNMSLimit"):
        run("BoxWithNMSLimit", {"s": s, "b": np.zeros((4, 8), np.float32)}, ["a", "b2", "c"])
    with pytest.raises(errors.ShapeError, match="BoxWithNMSLimit"):
        run("BoxWithNMSLimit", {"s": s, "b": np.zeros((4, 12), np.float32),
                                "sp": np.array([1, 2], np.float32)}, ["a", "b2", "c"])
    with pytest.raises(errors.InvalidArgumentError, match="soft_nms_method"):
        run("BoxWithNMSLimit", {"s": s, "b": np.zeros((4, 12), np.float32)}, ["a", "b2", "c"],
            soft_nms_enabled=1, soft_nms_method="hard")
    with pytest.raises(errors.ShapeError, match="BoxWithNMSLimit"):
        run("BoxWithNMSLimit", {"s": s, "b": np.zeros((4, 12), np.float32)}, ["a", "b2", "c"],
            rotated=1)


# Rotated boxes: (ctr_x, ctr_y, w, h, angle in degrees), the angle turning
# the box counter-clockwise as seen in an image (y down).


def rotated_corners(b):
    cx, cy, w, h, a = b
    t = math.radians(a)
    # The box's own axes in image coordinates (y down).
    ax = np.array([math.cos(t), -math.sin(t)])
    ay = np.array([math.sin(t), math.cos(t)])
    return [np.array([cx, cy]) + sx * w / 2 * ax + sy * h / 2 * ay
            for sx, sy in ((-1, -1), (1, -1), (1, 1), (-1, 1))]


def inside(p, poly):
    # p is inside (or on) the convex polygon when it is on one side of every edge.
    signs = []
    for i in range(len(poly)):
        a, b = poly[i], poly[(i + 1) % len(poly)]
        signs.append((b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0]))
    return all(x >= -1e-9 for x in signs) or all(x <= 1e-9 for x in signs)


def segment_hits(p1, p2, q1, q2):
    d = (p2[0] - p1[0]) * (q2[1] - q1[1]) - (p2[1] - p1[1]) * (q2[0] - q1[0])
    if abs(d) < 1e-12:
        return []
    t = ((q1[0] - p1[0]) * (q2[1] - q1[1]) - (q1[1] - p1[1]) * (q2[0] - q1[0])) / d
    u = ((q1[0] - p1[0]) * (p2[1] - p1[1]) - (q1[1] - p1[1]) * (p2[0] - p1[0])) / d
    return [p1 + t * (p2 - p1)] if 0 <= t <= 1 and 0 <= u <= 1 else []


def rotated_iou_ref(a, b):
    """The overlap polygon from its vertices (corners inside the other box and
    edge crossings) sorted by angle around their mean."""
    pa, pb = rotated_corners(a), rotated_corners(b)
    pts = [p for p in pa if inside(p, pb)] + [p for p in pb if inside(p, pa)]
    for i in range(4):
        for j in range(4):
            pts += segment_hits(pa[i], pa[(i + 1) % 4], pb[j], pb[(j + 1) % 4])
    inter = 0.0
    if len(pts) >= 3:
        c = np.mean(pts, axis=0)
        pts = sorted(pts, key=lambda p: math.atan2(p[1] - c[1], p[0] - c[0]))
        inter = 0.5 * abs(sum(pts[i][0] * pts[(i + 1) % len(pts)][1]
                              - pts[(i + 1) % len(pts)][0] * pts[i][1] for i in range(len(pts))))
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def nms_rotated_ref(boxes, scores, idx, thresh, limit=None):
    idx = sorted(idx, key=lambda i: -scores[i])
    keep = []
    while idx and (limit is None or len(keep) < limit):
        i = idx.pop(0)
        keep.append(i)
        idx = [j for j in idx if rotated_iou_ref(boxes[i], boxes[j]) <= thresh]
    return keep


def test_rotated_iou_reference_by_hand():
    # A square and itself turned 45 degrees about its centre: the overlap is
    # an octagon of area 2 (sqrt 2 - 1) s^2.
    s = 2.0
    octagon = 2 * (math.sqrt(2) - 1) * s * s
    assert abs(rotated_iou_ref([0, 0, s, s, 0], [0, 0, s, s, 45]) - octagon / (2 * s * s - octagon)) < 1e-9
    # Upright boxes: the plain rectangle overlap (no plus one).
    assert abs(rotated_iou_ref([1, 1, 2, 2, 0], [2, 1, 2, 2, 0]) - 2 / 6) < 1e-9


@pytest.mark.parametrize("nms", [0.1, 0.3, 0.6])
def test_box_with_nms_limit_rotated(fresh, nms):
    rng = np.random.default_rng(17)
    n, nc = 24, 3
    ctr = rng.uniform(10, 40, (n, 2))
    boxes = []
    for _ in range(nc):
        wh = rng.uniform(4, 14, (n, 2))
        ang = rng.uniform(-90, 90, (n, 1))
        boxes.append(np.concatenate([ctr + rng.normal(0, 1.5, ctr.shape), wh, ang], axis=1))
    boxes = np.concatenate(boxes, axis=1).astype(np.float32)
    scores = (rng.permutation(n * nc).reshape(n, nc) / float(n * nc)).astype(np.float32)
    os_, ob, oc = run("BoxWithNMSLimit", {"s": scores, "b": boxes}, ["os", "ob", "oc"], rotated=1,
                      nms=nms, detections_per_im=12)
    b64 = boxes.astype(np.float64)
    kept = {j: nms_rotated_ref([b64[i, 5 * j:5 * j + 5] for i in range(n)], scores[:, j],
                               [i for i in range(n) if scores[i, j] > np.float32(0.05)], nms, 12)
            for j in range(1, nc)}
    allk = sorted(((j, i) for j in kept for i in kept[j]), key=lambda p: -scores[p[1], p[0]])[:12]
    best = set(allk)
    ref = [(j, i) for j in range(1, nc) for i in kept[j] if (j, i) in best]
    assert ob.shape == (len(ref), 5)
    np.testing.assert_array_equal(oc, [j for j, _ in ref])
    np.testing.assert_allclose(os_, [scores[i, j] for j, i in ref])
    np.testing.assert_allclose(ob, [boxes[i, 5 * j:5 * j + 5] for j, i in ref])


def test_generate_proposals_rotated(fresh):
    rng = np.random.default_rng(19)
    n, a, h, w = 1, 3, 4, 5
    anchors = np.array([[7.5, 7.5, 16, 16, 0], [7.5, 7.5, 24, 12, 30], [7.5, 7.5, 12, 24, -60]],
                       np.float32)
    scores = (rng.permutation(a * h * w).reshape(n, a, h, w) / float(a * h * w)).astype(np.float32)
    deltas = rng.normal(0, 0.2, (n, 5 * a, h, w)).astype(np.float32)
    im_info = np.array([[60, 70, 1.0]], np.float32)
    kw = dict(spatial_scale=0.0625, pre_nms_topN=40, post_nms_topN=15, nms_thresh=0.5, min_size=4.0)
    rois, probs = run("GenerateProposals", {"s": scores, "d": deltas, "i": im_info, "a": anchors},
                      ["rois", "probs"], **kw)
    stride = 16.0
    cand = []
    for y in range(h):
        for x in range(w):
            for k in range(a):
                anc = anchors[k].astype(np.float64).copy()
                anc[0] += x * stride
                anc[1] += y * stride
                d = deltas[0, 5 * k:5 * k + 5, y, x].astype(np.float64)
                box = np.array([d[0] * anc[2] + anc[0], d[1] * anc[3] + anc[1],
                                np.exp(min(d[2], CLIP)) * anc[2], np.exp(min(d[3], CLIP)) * anc[3],
                                anc[4] + math.degrees(d[4])])
                box[4] = box[4] - 180 if box[4] > 90 else box[4] + 180 if box[4] < -90 else box[4]
                if abs(box[4]) <= 1.0:  # nearly upright: clipped like an upright box
                    x1, x2 = np.clip([box[0] - (box[2] - 1) / 2, box[0] + (box[2] - 1) / 2], 0, 69)
                    y1, y2 = np.clip([box[1] - (box[3] - 1) / 2, box[1] + (box[3] - 1) / 2], 0, 59)
                    box[:4] = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1 + 1, y2 - y1 + 1]
                cand.append((float(scores[0, k, y, x]), box))
    order = sorted(range(len(cand)), key=lambda i: -cand[i][0])[:40]
    ok = [i for i in order if cand[i][1][2] >= 4 and cand[i][1][3] >= 4 and cand[i][1][0] < 70
          and cand[i][1][1] < 60]
    keep = nms_rotated_ref({i: cand[i][1] for i in ok}, {i: cand[i][0] for i in ok}, ok, 0.5, 15)
    assert rois.shape == (len(keep), 6)
    np.testing.assert_allclose(rois[:, 1:], [cand[i][1] for i in keep], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(probs, [cand[i][0] for i in keep])
    assert (rois[:, 0] == 0).all()


# ---------------------------------------------------- GenerateProposals --


def proposals_ref(scores, deltas, im_info, anchors, scale, pre, post, thresh, min_size):
    n, a, h, w = scores.shape
    stride = 1.0 / scale
    rois, probs = [], []
    for b in range(n):
        sx, sy = np.meshgrid(np.arange(w) * stride, np.arange(h) * stride)
        shifts = np.stack([sx.ravel(), sy.ravel(), sx.ravel(), sy.ravel()], axis=1)
        all_anchors = (shifts[:, None, :] + anchors[None, :, :]).reshape(-1, 4)
        d = deltas[b].reshape(a, 4, h, w).transpose(2, 3, 0, 1).reshape(-1, 4)
        sc = scores[b].transpose(1, 2, 0).ravel()
        order = np.argsort(-sc, kind="stable")
        if 0 < pre < len(order):
            order = order[:pre]
        props = xform_ref(all_anchors[order].astype(np.float64), d[order].astype(np.float64),
                          (1, 1, 1, 1), 1.0, 0.0)
        ih, iw, s = (float(v) for v in im_info[b])
        props[:, [0, 2]] = np.clip(props[:, [0, 2]], 0, int(iw) - 1)
        props[:, [1, 3]] = np.clip(props[:, [1, 3]], 0, int(ih) - 1)
        ws, hs = props[:, 2] - props[:, 0] + 1, props[:, 3] - props[:, 1] + 1
        ok = ((ws >= min_size * s) & (hs >= min_size * s) & (props[:, 0] + ws / 2 < iw)
              & (props[:, 1] + hs / 2 < ih))
        cand = [i for i in range(len(order)) if ok[i]]
        psc = sc[order]
        keep = nms_ref(props, psc, cand, thresh, post if post > 0 else None)
        for i in keep:
            rois.append([b, *props[i]])
            probs.append(psc[i])
    return np.array(rois).reshape(-1, 5), np.array(probs)


@pytest.mark.parametrize("kw", [
    dict(spatial_scale=0.25, pre_nms_topN=60, post_nms_topN=20, nms_thresh=0.6, min_size=2.0),
    dict(spatial_scale=0.5, pre_nms_topN=-1, post_nms_topN=-1, nms_thresh=0.3, min_size=0.0),
    dict(spatial_scale=0.25, pre_nms_topN=1000, post_nms_topN=5, nms_thresh=0.7, min_size=8.0),
])
def test_generate_proposals_matches_numpy_model(fresh, kw):
    rng = np.random.default_rng(13)
    n, a, h, w = 2, 3, 5, 6
    anchors = np.array([[-4, -4, 3, 3], [-8, -4, 7, 3], [-6, -10, 5, 9]], np.float32)
    scores = rng.permutation(n * a * h * w).reshape(n, a, h, w).astype(np.float32) / (n * a * h * w)
    deltas = rng.normal(0, 0.3, (n, 4 * a, h, w)).astype(np.float32)
    im_info = np.array([[20, 24, 1.0], [18, 22, 1.2]], np.float32)
    rois, probs = run("GenerateProposals", {"s": scores, "d": deltas, "i": im_info, "a": anchors},
                      ["rois", "probs"], **kw)
    ref_rois, ref_probs = proposals_ref(scores, deltas, im_info, anchors, kw["spatial_scale"],
                                        kw["pre_nms_topN"], kw["post_nms_topN"], kw["nms_thresh"],
                                        kw["min_size"])
    assert rois.shape == ref_rois.shape and len(rois) > 0
    np.testing.assert_allclose(rois, ref_rois, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(probs, ref_probs, rtol=1e-6)


def test_generate_proposals_bad_inputs(fresh):
    scores = np.zeros((1, 2, 3, 3), np.float32)
    anchors = np.zeros((2, 4), np.float32)
    info = np.array([[10, 10, 1]], np.float32)
    with pytest.raises(errors.ShapeError, match="GenerateProposals"):
        run("GenerateProposals", {"s": scores, "d": np.zeros((1, 4, 3, 3), np.float32), "i": info,
                                  "a": anchors}, ["r", "p"])
    with pytest.raises(errors.ShapeError, match="GenerateProposals"):
        run("GenerateProposals", {"s": scores, "d": np.zeros((1, 8, 3, 3), np.float32), "i": info,
                                  "a": np.zeros((3, 4), np.float32)}, ["r", "p"])
    with pytest.raises(errors.ShapeError, match="GenerateProposals"):
        run("GenerateProposals", {"s": scores, "d": np.zeros((1, 8, 3, 3), np.float32), "i": info,
                                  "a": np.zeros((2, 5), np.float32)}, ["r", "p"])
    with pytest.raises(errors.ShapeError, match="GenerateProposals"):
        run("GenerateProposals", {"s": scores, "d": np.zeros((1, 8, 3, 3), np.float32), "i": info,
                                  "a": np.zeros((2, 3), np.float32)}, ["r", "p"])
    with pytest.raises(errors.InvalidArgumentError, match="spatial_scale"):
        run("GenerateProposals", {"s": scores, "d": np.zeros((1, 8, 3, 3), np.float32), "i": info,
                                  "a": anchors}, ["r", "p"], spatial_scale=0.0)


def test_detection_ops_have_no_gradient_but_roi_align(fresh):
    net = core.Net("det")
    net.BBoxTransform(["r", "d", "i"], ["b", "sp"])
    with pytest.raises(errors.FerrocaffeError, match="BBoxTransform"):
        net.AddGradientOperators(["b"])


def test_a_faster_rcnn_head_runs_as_a_net(fresh):
    # The detection ops chained as Detectron's exported Faster R-CNN net
    # chains them (its arguments, the misspelt `nms_thres` included), built
    # with CreateNet and run twice: the second run gives the same results.
    rng = np.random.default_rng(23)
    a, h, w = 3, 6, 6
    feeds = {
        "feat": rng.standard_normal((1, 4, h, w)).astype(np.float32),
        "rpn_probs": rng.uniform(0, 1, (1, a, h, w)).astype(np.float32),
        "rpn_deltas": rng.normal(0, 0.1, (1, 4 * a, h, w)).astype(np.float32),
        "im_info": np.array([[96, 96, 1.0]], np.float32),
        "anchor": np.array([[-8, -8, 23, 23], [-16, -8, 31, 23], [-8, -16, 23, 31]], np.float32),
        "fc_w": rng.normal(0, 0.3, (5 * 4, 4 * 2 * 2)).astype(np.float32),
        "fc_b": np.zeros(20, np.float32),
        "cls_w": rng.normal(0, 1.0, (5, 4 * 2 * 2)).astype(np.float32),
        "cls_b": np.zeros(5, np.float32),
    }
    net = core.Net("frcnn_head")
    net.GenerateProposals(["rpn_probs", "rpn_deltas", "im_info", "anchor"], ["rois", "roi_probs"],
                          nms_thres=0.7, min_size=0.0, spatial_scale=0.0625,
                          correct_transform_coords=1, post_nms_topN=20, pre_nms_topN=100)
    net.RoIAlign(["feat", "rois"], "pool", pooled_h=2, pooled_w=2, sampling_ratio=0,
                 spatial_scale=0.0625)
    net.FC(["pool", "fc_w", "fc_b"], "bbox_pred")
    net.FC(["pool", "cls_w", "cls_b"], "cls_score")
    net.Softmax("cls_score", "cls_prob")
    net.BBoxTransform(["rois", "bbox_pred", "im_info"], "pred_bbox", correct_transform_coords=1,
                      apply_scale=0, weights=[10.0, 10.0, 5.0, 5.0])
    net.BoxWithNMSLimit(["cls_prob", "pred_bbox"], ["score_nms", "bbox_nms", "class_nms"],
                        score_thresh=0.05, nms=0.5, detections_per_im=10, soft_nms_enabled=0,
                        soft_nms_method="linear", soft_nms_sigma=0.5)
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    workspace.CreateNet(net)
    workspace.RunNet(net.Name())
    first = [workspace.FetchBlob(b) for b in ("score_nms", "bbox_nms", "class_nms")]
    rois = workspace.FetchBlob("rois")
    assert 0 < len(rois) <= 20 and rois.shape[1] == 5
    assert 0 < len(first[0]) <= 10 and first[1].shape == (len(first[0]), 4)
    np.testing.assert_allclose(workspace.FetchBlob("pool"), roi_align_ref(
        feeds["feat"].astype(float), rois.astype(float), 0.0625, 2, 2, 0, 0), rtol=1e-5, atol=1e-5)
    workspace.RunNet(net.Name())
    for a_, b_ in zip(first, [workspace.FetchBlob(b) for b in ("score_nms", "bbox_nms", "class_nms")]):
        np.testing.assert_array_equal(a_, b_)
