"""PackSegments and UnpackSegments (issue 13): segments of rows packed
into a padded batch and back, with Caffe2's arguments (max_length,
pad_minf, return_presence_mask) and gradients. Expected values come from
a plain-numpy packing written here."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker


def np_pack(lengths, data, t=None, pad=0):
    t = int(max(lengths, default=0)) if t is None else t
    out = np.full((len(lengths), t) + data.shape[1:], pad, dtype=data.dtype)
    mask = np.zeros((len(lengths), t), dtype=bool)
    start = 0
    for i, n in enumerate(lengths):
        keep = min(int(n), t)
        out[i, :keep] = data[start:start + keep]
        mask[i, :keep] = True
        start += int(n)
    return out, mask


def run(op_type, inputs, outputs, **kwargs):
    for name, v in inputs.items():
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), outputs, **kwargs))
    return [workspace.FetchBlob(o) for o in outputs]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(0, 5), max_size=6), inner=st.lists(st.integers(1, 3), max_size=2),
       ltype=st.sampled_from([np.int32, np.int64]), max_length=st.one_of(st.none(), st.integers(0, 7)),
       seed=st.integers(0, 1000))
def test_pack_and_unpack_match_numpy(fresh, lengths, inner, ltype, max_length, seed):
    lengths = np.array(lengths, dtype=ltype)
    data = np.random.default_rng(seed).standard_normal((int(lengths.sum()),) + tuple(inner)).astype(np.float32)
    kw = {} if max_length is None else {"max_length": max_length}
    packed, mask = run("PackSegments", {"l": lengths, "d": data}, ["p", "m"], return_presence_mask=True, **kw)
    want, want_mask = np_pack(lengths, data, max_length)
    np.testing.assert_array_equal(packed, want)
    np.testing.assert_array_equal(mask, want_mask)
    assert mask.dtype == bool
    (unpacked,) = run("UnpackSegments", {"l": lengths, "p": packed}, ["u"], **kw)
    # Unpacking keeps the rows that survived packing, in order.
    np.testing.assert_array_equal(unpacked, np.concatenate(
        [want[i, :min(int(n), want.shape[1])] for i, n in enumerate(lengths)] or [data[:0]]))


def test_padding_values_and_strings(fresh):
    lengths = np.array([1, 2], np.int32)
    data = np.array([[1.0], [2.0], [3.0]], np.float32)
    (p,) = run("PackSegments", {"l": lengths, "d": data}, ["p"], pad_minf=True)
    np.testing.assert_array_equal(p, [[[1.0], [-np.inf]], [[2.0], [3.0]]])
    (p64,) = run("PackSegments", {"l": lengths, "d": data.astype(np.float64)}, ["p64"], pad_minf=True)
    assert p64[0, 1, 0] == -np.inf
    (pi,) = run("PackSegments", {"l": lengths, "i": np.array([7, 8, 9], np.int32)}, ["pi"])
    np.testing.assert_array_equal(pi, [[7, 0], [8, 9]])
    strs = np.array([b"a", b"bb", b"ccc"], dtype=object)
    (ps,) = run("PackSegments", {"l": lengths, "s": strs}, ["ps"])
    assert ps.tolist() == [[b"a", b""], [b"bb", b"ccc"]]
    (us,) = run("UnpackSegments", {"l": lengths, "ps": ps}, ["us"])
    assert us.tolist() == strs.tolist()


def test_empty_lengths(fresh):
    p, m = run("PackSegments", {"l": np.array([], np.int32), "d": np.array([], np.float32)}, ["p", "m"],
               return_presence_mask=True)
    assert p.shape == (0, 0) and m.shape == (0, 0)


def test_bad_inputs_are_typed_errors(fresh):
    data = np.ones((3, 2), np.float32)
    for lengths in ([1, 1], [2, 2]):  # fewer or more rows than the data has
        with pytest.raises(errors.InvalidArgumentError, match="add up"):
            run("PackSegments", {"l": np.array(lengths, np.int32), "d": data}, ["p"])
    with pytest.raises(errors.InvalidArgumentError, match="negative"):
        run("PackSegments", {"l": np.array([4, -1], np.int64), "d": data}, ["p"])
    with pytest.raises(errors.DataTypeError):
        run("PackSegments", {"l": np.array([3.0], np.float32), "d": data}, ["p"])
    with pytest.raises(errors.DataTypeError, match="-inf"):
        run("PackSegments", {"l": np.array([3], np.int32), "d": np.ones(3, np.int32)}, ["p"], pad_minf=True)
    with pytest.raises(errors.InvalidArgumentError, match="second output"):
        run("PackSegments", {"l": np.array([3], np.int32), "d": data}, ["p"], return_presence_mask=True)
    with pytest.raises(errors.ShapeError):
        run("UnpackSegments", {"l": np.array([1, 1], np.int32), "p": np.ones((3, 2), np.float32)}, ["u"])
    with pytest.raises(errors.InvalidArgumentError, match="positions"):
        run("UnpackSegments", {"l": np.array([3], np.int32), "p": np.ones((1, 2), np.float32)}, ["u"])


def test_gradients(fresh):
    lengths = np.array([2, 0, 3], np.int32)
    data = np.random.default_rng(1).standard_normal((5, 2)).astype(np.float32)
    gc = GradientChecker(stepsize=1e-3, threshold=1e-2)
    ok, grad, _ = gc.CheckSimple(core.CreateOperator("PackSegments", ["l", "d"], ["p"]), [lengths, data], 1, [0])
    assert ok and grad.shape == data.shape
    packed, _ = np_pack(lengths, data)
    ok, grad, _ = gc.CheckSimple(core.CreateOperator("UnpackSegments", ["l", "p"], ["u"]), [lengths, packed], 1, [0])
    assert ok and grad.shape == packed.shape
    # The maker: UnpackSegments of the packed gradient, by hand.
    net = core.Net("g")
    net.PackSegments(["l", "d"], ["p"])
    net.AddGradientOperators({"p": "p_grad_in"})
    net.AddExternalInput("p_grad_in")
    assert [op.type for op in net.Proto().op][-1] == "UnpackSegments"
    workspace.FeedBlob("l", lengths)
    workspace.FeedBlob("d", data)
    g = np.arange(3 * 3 * 2, dtype=np.float32).reshape(3, 3, 2)
    workspace.FeedBlob("p_grad_in", g)
    workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob("d_grad"), np.concatenate([g[0, :2], g[2, :3]]))
