"""Every differentiable op gradient-checked by one generic checker (issue 27).

The table (``_op_gradient_specs.SPECS``) has a spec for each op with a
gradient maker; the ops without one are listed with the reason
(``UNCHECKED``, ``NOT_DIFFERENTIABLE``), and a test asserts that together
they cover every op that has a gradient maker, so a new op cannot arrive
unchecked.

The check of one case: the op is built on inputs ``in<i>``; each seeded
output ``k`` gets a fixed random gradient ``R_k`` (a blob the net declares
an external input, given to ``AddGradientOperators``); the net is run; the
gradient of every differentiable input is compared, element by element,
with central differences of ``L = sum_k sum(out_k * R_k)`` obtained by
rerunning the forward op alone with that element moved by +-eps. Expected
values come only from those differences.
"""

import zlib

import numpy as np
import pytest

from _op_gradient_specs import NOT_DIFFERENTIABLE, SPECS, UNCHECKED
from ferrocaffe import _core, core, gradients, workspace
from ferrocaffe.proto import caffe2_pb2

TOLERANCES = {
    # dtype: (eps, rtol, atol)
    "float64": (1e-6, 1e-6, 1e-7),
    "float32": (1e-3, 1e-2, 1e-3),
}


def _cases():
    for s in SPECS:
        for k, case in enumerate(s.cases):
            yield pytest.param(s, case, id=f"{s.op}-{k}" + (f"-{case.label}" if case.label else ""))


def _maker_ops():
    """The ops that have a gradient maker and are registered."""
    reg = set(_core.registered_operators())
    return {t for t in gradients.GradientRegistry.gradient_registry_ if t in reg}


class _Run:
    """One case: the op, its inputs and seeds, and the loss."""

    def __init__(self, s, case):
        self.spec, self.case = s, case
        rng = np.random.default_rng(zlib.crc32(f"{s.op}/{s.cases.index(case)}".encode()))
        dtype = np.dtype(s.dtype)
        self.values = [d.draw(rng, dtype) for d in case.inputs]
        self.names = [f"in{i}" for i in range(len(self.values))]
        schema = _core.operator_schema(s.op)
        outs = case.outputs if case.outputs is not None else schema["min_outputs"]
        self.outputs = list(outs) if not isinstance(outs, int) else [f"out{k}" for k in range(outs)]
        self.op = core.CreateOperator(s.op, self.names, self.outputs, **case.args)
        if case.random_seed is not None:
            self.op.device_option.random_seed = case.random_seed
        if case.wrt is None:
            self.wrt = [i for i, d in enumerate(case.inputs) if d.float]
        else:
            self.wrt = list(case.wrt)
        self.feed(self.values)
        workspace.RunOperatorOnce(self.op)
        # Every float output is seeded unless the case says which.
        ys = [np.asarray(workspace.FetchBlob(y)) for y in self.outputs]
        if case.seeds is None:
            seeds = [k for k, y in enumerate(ys) if y.dtype.kind == "f"]
        else:
            seeds = case.seeds
        self.seeds = {}
        for k in seeds:
            assert ys[k].dtype.kind == "f", f"output {k} of {s.op} is {ys[k].dtype}: not seeded"
            self.seeds[self.outputs[k]] = rng.uniform(-1, 1, ys[k].shape).astype(ys[k].dtype)
        eps, rtol, atol = TOLERANCES["float64" if s.dtype == "float64" else "float32"]
        self.eps = s.eps or eps
        self.rtol = s.rtol if s.rtol is not None else rtol
        self.atol = s.atol if s.atol is not None else atol

    def feed(self, values):
        for name, v in zip(self.names, values):
            workspace.FeedBlob(name, v)

    def loss(self, values):
        self.feed(values)
        workspace.RunOperatorOnce(self.op)
        return sum(float(np.sum(np.asarray(workspace.FetchBlob(y), np.float64) * r.astype(np.float64)))
                   for y, r in self.seeds.items())

    def analytic(self):
        """The gradients AddGradientOperators gives, by input index (None
        for an input without one)."""
        net = core.Net(f"grad_{self.spec.op}")
        net.Proto().op.add().CopyFrom(self.op)
        net.Proto().external_input.extend(self.names)
        given = {}
        for y, r in self.seeds.items():
            workspace.FeedBlob(y + "_seed", r)
            net.AddExternalInput(y + "_seed")
            given[y] = y + "_seed"
        grad_map = net.AddGradientOperators(given)
        self.feed(self.values)
        workspace.RunNetOnce(net)
        self.backward = net.Proto()
        got = []
        for i, name in enumerate(self.names):
            g = grad_map.get(name)
            if g is None:
                got.append(None)
            elif isinstance(g, core.GradientSlice):
                idx = np.asarray(workspace.FetchBlob(str(g.indices))).reshape(-1)
                vals = np.asarray(workspace.FetchBlob(str(g.values)))
                x = self.values[i]
                assert vals.dtype == x.dtype, (name, vals.dtype, x.dtype)
                # A GradientSlice's indices name rows (no wrapping).
                assert ((idx >= 0) & (idx < x.shape[0])).all(), (name, idx)
                dense = np.zeros(x.shape, np.float64)
                np.add.at(dense, idx, vals.reshape((idx.size,) + x.shape[1:]).astype(np.float64))
                got.append(dense)
            else:
                v = np.asarray(workspace.FetchBlob(str(g)))
                x = self.values[i]
                assert v.shape == x.shape and v.dtype == x.dtype, (
                    f"the gradient of input {i} is {v.dtype} {v.shape}, the input {x.dtype} {x.shape}")
                got.append(v.astype(np.float64))
        return got

    def numeric(self, i):
        x = self.values[i]
        g = np.zeros(x.shape, np.float64)
        for j in np.ndindex(x.shape):
            up, down = x.copy(), x.copy()
            up[j] = x[j] + x.dtype.type(self.eps)
            down[j] = x[j] - x.dtype.type(self.eps)
            step = float(up[j]) - float(down[j])
            vals_up = list(self.values)
            vals_up[i] = up
            vals_down = list(self.values)
            vals_down[i] = down
            g[j] = (self.loss(vals_up) - self.loss(vals_down)) / step
        return g


@pytest.mark.parametrize("s, case", list(_cases()))
def test_op_gradient_matches_central_differences(fresh, s, case):
    run = _Run(s, case)
    got = run.analytic()
    for i in range(len(run.names)):
        if i not in run.wrt:
            assert got[i] is None, (
                f"{s.op}: input {i} is not differentiable but got a gradient\n{run.backward}")
    for i in run.wrt:
        assert got[i] is not None, f"{s.op}: no gradient for input {i}\n{run.backward}"
        want = run.numeric(i)
        bad = np.abs(got[i] - want) > run.atol + run.rtol * np.abs(want)
        assert not bad.any(), (
            f"{s.op} {case.args}: d/d input {i} disagrees with central differences at "
            f"{np.argwhere(bad)[:5].tolist()}\nbackward pass:\n{got[i]}\ncentral differences:\n"
            f"{want}\nbackward net:\n{run.backward}")


def test_every_op_with_a_gradient_maker_is_checked_or_listed():
    checked = {s.op for s in SPECS}
    makers = _maker_ops()
    not_diff = {t for t in makers if gradients.GradientRegistry.gradient_registry_[t]
                is gradients._no_gradient}
    missing = makers - checked - set(UNCHECKED) - set(NOT_DIFFERENTIABLE)
    assert not missing, f"ops with a gradient maker and neither a spec nor a reason: {sorted(missing)}"
    # The lists say what the makers do.
    assert not_diff == set(NOT_DIFFERENTIABLE), sorted(not_diff ^ set(NOT_DIFFERENTIABLE))
    assert not checked & set(UNCHECKED), sorted(checked & set(UNCHECKED))
    assert not checked & not_diff, sorted(checked & not_diff)
    # No stale entry: each names a registered op.
    registered = set(_core.registered_operators())
    stale = (checked | set(UNCHECKED) | set(NOT_DIFFERENTIABLE)) - registered
    assert not stale, sorted(stale)


@pytest.mark.parametrize("op_type", sorted(NOT_DIFFERENTIABLE))
def test_makers_of_non_differentiable_ops_give_no_gradient(op_type):
    s = _core.operator_schema(op_type)
    op = caffe2_pb2.OperatorDef(type=op_type, input=[f"x{i}" for i in range(s["min_inputs"])],
                                output=[f"y{k}" for k in range(max(1, s["min_outputs"]))])
    ops, g_input = gradients.GradientRegistry.GetGradientForOp(op, [o + "_grad" for o in op.output])
    assert not ops and all(g is None for g in g_input), (op_type, ops, g_input)
