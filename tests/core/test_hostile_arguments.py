"""Hostile arguments and values get typed errors naming the op and the
argument, never a caught panic (InternalError), a wrapped size or a
silently wrong result (issue 28, items 2 and 3).

Arguments whose size arithmetic overflowed ran in a child process each:
before the fix a debug build panicked (InternalError) and a release build
wrapped, which could allocate the wrong amount or abort."""

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from _support import PKG_PARENT
from ferrocaffe import _core, core, errors, workspace

CASE_CHILD = r"""
import json, sys
import numpy as np
from ferrocaffe import core, errors, workspace

op_type, inputs, args = json.loads(sys.argv[1])
for name, (values, dtype, shape) in inputs.items():
    workspace.FeedBlob(name, np.array(values, dtype).reshape(shape))
out = dict()
try:
    workspace.RunOperatorOnce(core.CreateOperator(op_type, list(inputs), ["Y"], **args))
    out["result"] = "ran"
    out["shape"] = list(workspace.FetchBlob("Y").shape)
except errors.FerrocaffeError as e:
    out.update(result=type(e).__name__, op=e.op, msg=str(e))
print("RESULT " + json.dumps(out))
"""


def run_case(op_type, inputs, **args):
    """Runs one op in a child process; returns what it ended in."""
    env = dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    spec = {k: (np.asarray(v).ravel().tolist(), str(np.asarray(v).dtype), list(np.shape(v)))
            for k, v in inputs.items()}
    p = subprocess.run([sys.executable, "-c", CASE_CHILD, json.dumps([op_type, spec, args])],
                       env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"the child exited with {p.returncode}: {p.stderr[-2000:]}"
    return json.loads(lines[-1][len("RESULT "):])


IMAGE = np.ones((1, 1, 5, 5), np.float32)
FILTER = np.ones((3, 1, 3, 3), np.float32)

OVERFLOWS = {
    "Conv pad 2^62": ("Conv", dict(X=IMAGE, W=FILTER), dict(kernel=3, pad=1 << 62),
                      "InvalidArgumentError", "`pad`"),
    # This one used to return a (1, 3, 1, 1) output: the pad arithmetic wrapped.
    "Conv pad 2^63-1": ("Conv", dict(X=IMAGE, W=FILTER), dict(kernel=3, pad=2**63 - 1),
                        "InvalidArgumentError", "`pad`"),
    "MaxPool pad 2^63-1": ("MaxPool", dict(X=IMAGE), dict(kernel=2, pad=2**63 - 1),
                           "InvalidArgumentError", "`pad`"),
    "ConvTranspose stride 2^62": ("ConvTranspose", dict(X=IMAGE, W=np.ones((1, 3, 3, 3), np.float32)),
                                  dict(kernel=3, stride=1 << 62), "InvalidArgumentError", "`stride`"),
    "Conv dilation 2^62": ("Conv", dict(X=IMAGE, W=FILTER), dict(kernel=3, dilation=1 << 62),
                           "InvalidArgumentError", "`dilation`"),
    "UnsortedSegmentSum id 2^61": ("UnsortedSegmentSum",
                                   dict(D=np.ones((2, 3), np.float32), I=np.array([0, 2**61], np.int64)),
                                   {}, "ShapeError", "SEGMENT_IDS ('I')"),
    "Reshape [2^62, 2^62, 0]": ("Reshape", dict(D=np.ones((2, 3), np.float32)),
                                dict(shape=[2**62, 2**62, 0]), "InvalidArgumentError", "new shape"),
    "Tile tiles 2^62": ("Tile", dict(D=np.ones((2, 3), np.float32)), dict(tiles=2**62, axis=0),
                        "InvalidArgumentError", "tiles = 4611686018427387904"),
}


@pytest.mark.parametrize("case", sorted(OVERFLOWS))
def test_argument_sizes_that_overflow_are_typed_errors_naming_op_and_argument(case):
    op_type, inputs, args, cls, names = OVERFLOWS[case]
    r = run_case(op_type, inputs, **args)
    assert (r["result"], r.get("op")) == (cls, op_type), r
    assert names in r["msg"] and ("too large" in r["msg"] or "too many" in r["msg"]), r


def test_a_kernel_read_from_a_filter_with_a_zero_dim_is_a_shape_error(fresh):
    # It used to make a (1, 3, 6, 3) output from a 5 x 5 image.
    workspace.FeedBlob("X", np.ones((1, 2, 5, 5), np.float32))
    workspace.FeedBlob("W", np.ones((3, 2, 0, 3), np.float32))
    with pytest.raises(errors.ShapeError, match=r"spatial dims \[0, 3\].*must all be > 0") as info:
        workspace.RunOperatorOnce(core.CreateOperator("Conv", ["X", "W"], ["Y"]))
    assert info.value.op == "Conv" and info.value.blob == "W"


def test_arrays_of_more_dims_than_views_take_feed_and_fetch_whole(fresh):
    # numpy 2 makes arrays of up to 64 dims; rust-numpy's views take 32
    # (FeedBlob raised its PanicException): they are fed through a flat view.
    x = np.arange(6, dtype=np.float32).reshape([1] * 33 + [2, 3])
    assert workspace.FeedBlob("x", x)
    got = workspace.FetchBlob("x")
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, x)
    s = np.array([b"a", b"bc", b"", b"d", b"e", b"f"], dtype=object).reshape([1] * 40 + [3, 2])
    workspace.FeedBlob("s", s)
    got = workspace.FetchBlob("s")
    assert got.shape == s.shape and got.ravel().tolist() == s.ravel().tolist()
    # A second feed of the same shape copies into the existing tensor.
    workspace.FeedBlob("x", x + 1)
    np.testing.assert_array_equal(workspace.FetchBlob("x"), x + 1)


def test_fetching_a_tensor_of_more_dims_than_numpy_allows_is_a_shape_error(fresh):
    max_dims = 64 if int(np.__version__.split(".")[0]) >= 2 else 32
    workspace.FeedBlob("x", np.arange(6, dtype=np.float32))
    workspace.RunOperatorOnce(core.CreateOperator("Reshape", ["x"], ["y", "old"],
                                                  shape=[1] * max_dims + [6]))
    ws = workspace.current_workspace()
    for fetch in (lambda: workspace.FetchBlob("y"), lambda: ws.fetch_blob("y", copy=False)):
        with pytest.raises(errors.ShapeError) as info:
            fetch()
        e = info.value
        assert isinstance(e, ValueError) and isinstance(e, Exception)
        assert e.blob == "y" and f"{max_dims + 1} dims" in str(e) and f"at most {max_dims}" in str(e)
    # One dim fewer fetches.
    workspace.RunOperatorOnce(core.CreateOperator("Reshape", ["x"], ["z", "old"],
                                                  shape=[1] * (max_dims - 1) + [6]))
    assert workspace.FetchBlob("z").ravel().tolist() == list(range(6))


# --------------------------------------------------------------- item 3 --

def _log_sum_exp(rows, mean=False):
    """An independent model: Caffe2's reducer, max(lowest, rows) +
    log(sum(exp(rows - max))) (/ n for the mean)."""
    rows = np.asarray(rows, np.float64)
    m = max(np.finfo(np.float32).min, rows.max())
    s = np.exp(rows - m).sum() / (len(rows) if mean else 1)
    with np.errstate(divide="ignore"):
        return m + np.log(s)


@pytest.mark.parametrize("op_type", ["SortedSegmentRangeLogSumExp", "SortedSegmentRangeLogMeanExp"])
def test_log_sum_exp_of_a_segment_of_minus_infinities_is_minus_infinity(fresh, op_type):
    ninf = -np.inf
    data = np.array([[ninf, 0.5], [ninf, 1.5], [2.0, ninf], [ninf, ninf]], np.float32)
    ids = np.array([0, 0, 1, 1], np.int32)
    workspace.FeedBlob("d", data)
    workspace.FeedBlob("i", ids)
    workspace.RunOperatorOnce(core.CreateOperator(op_type, ["d", "i"], ["y"]))
    got = workspace.FetchBlob("y")
    mean = op_type.endswith("MeanExp")
    want = [[_log_sum_exp(data[ids == s, j], mean) for j in range(2)] for s in range(2)]
    np.testing.assert_allclose(got, np.array(want, np.float32), rtol=1e-6)
    assert got[0, 0] == -np.inf and not np.isnan(got).any()


def _ops_with_an_epsilon():
    return sorted(n for n in workspace.RegisteredOperators()
                  if any(a[0] == "epsilon" for a in _core.operator_schema(n)["args"]))


def test_every_op_with_an_epsilon_refuses_one_that_is_not_positive(fresh):
    ops = _ops_with_an_epsilon()
    # The optimizers, LayerNorm and SpatialBN, and their gradients.
    assert {"LayerNorm", "SpatialBN", "Adam", "Adagrad", "RmsProp"} <= set(ops), ops
    for i in range(12):
        workspace.FeedBlob(f"in{i}", np.ones(2, np.float32))
    for op_type in ops:
        s = _core.operator_schema(op_type)
        ins = [f"in{i}" for i in range(s["min_inputs"])]
        for eps in (-1.0, 0.0, math.nan):
            # Fresh outputs, or the inputs for the ops that update in place.
            for outs in ([f"out{i}" for i in range(s["min_outputs"])], ins[:s["min_outputs"]]):
                with pytest.raises(errors.InvalidArgumentError) as info:
                    workspace.RunOperatorOnce(core.CreateOperator(op_type, ins, outs, epsilon=eps))
                if "in-place" not in str(info.value):
                    break
            assert "epsilon must be > 0" in str(info.value), (op_type, str(info.value))
            assert info.value.op == op_type


def test_layer_norm_with_a_negative_epsilon_no_longer_returns_nans(fresh):
    workspace.FeedBlob("x", np.array([[1.0, 1.0, 1.0]], np.float32))
    with pytest.raises(errors.InvalidArgumentError, match="epsilon must be > 0, got -1"):
        workspace.RunOperatorOnce(core.CreateOperator("LayerNorm", ["x"], ["y", "m", "s"], epsilon=-1.0))
    workspace.RunOperatorOnce(core.CreateOperator("LayerNorm", ["x"], ["y", "m", "s"], epsilon=1e-5))
    np.testing.assert_array_equal(workspace.FetchBlob("y"), [[0.0, 0.0, 0.0]])
