"""The gradient fuzzer (issue 27): random nets of differentiable ops, with
repeated inputs, blobs read by several ops, ops in place, pass-through ops
(Sum, Copy, Reshape), broadcasting, unused outputs and StopGradient; the
gradient AddGradientOperators gives every parameter is compared with central
differences of the same forward net in float64.

The loss is a random mix of several blobs: ``sum_y sum(y * R_y)``, given to
the backward pass as the gradients ``R_y`` of the chosen blobs (some of them
also read by later ops). For each parameter the check is on two random
directions ``v``: ``(f(p + e v) - f(p - e v)) / 2e`` against ``<grad, v>``;
a mismatch is then reported element by element. A parameter the loss
depends on must have a gradient.

Bounded here (a few seconds); FERROCAFFE_FUZZ_SECONDS runs it longer, and
FERROCAFFE_GRADIENT_FUZZ_EXAMPLES sets the examples per round
(scripts/fuzz.sh). A failing net found that way is shrunk by hypothesis and
kept in test_gradient_reads.py as a test of its own.
"""

import os
import time

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ferrocaffe import _core, core, errors, workspace

FUZZ_SECONDS = float(os.environ.get("FERROCAFFE_FUZZ_SECONDS", "0") or 0)
EXAMPLES = int(os.environ.get("FERROCAFFE_GRADIENT_FUZZ_EXAMPLES", "60"))
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# The parameters and their shapes: two matrices, a row (broadcast onto
# them) and a square matrix (matrix products).
PARAMS = {"P0": (2, 3), "P1": (2, 3), "p2": (3,), "W": (3, 3)}
EPS = 1e-6
BOUND = 50.0  # examples with larger values are redrawn (differences lose accuracy)


class Blob:
    def __init__(self, name, shape, positive=False):
        self.name, self.shape, self.positive = name, tuple(shape), positive


# ---------------------------------------------------------------- ops --
# Each maker takes (draw, net, blobs, out) and adds ops reading blobs (with
# repeats), returning the Blob it wrote or None when it does not apply.

SMOOTH_UNARY = ["Sqr", "Tanh", "Sigmoid", "Negative", "Softsign", "Sin", "Cos", "Erf", "Softplus",
                "Swish", "Cube", "Exp"]
POSITIVE_UNARY = ["Log", "Sqrt", "Reciprocal", "Rsqrt"]


def same_shape(blobs, shape):
    return [b for b in blobs if b.shape == shape]


def pick(draw, choices):
    return choices[draw(st.integers(0, len(choices) - 1))]


def unary(draw, net, blobs, out):
    x = pick(draw, blobs)
    if x.positive and draw(st.booleans()):
        t = pick(draw, POSITIVE_UNARY)
    else:
        t = pick(draw, SMOOTH_UNARY)
        if t == "Exp" and not x.positive:
            t = "Tanh"
    getattr(net, t)([x.name], [out])
    return Blob(out, x.shape, positive=t in ("Sigmoid", "Exp", "Softplus", "Sqrt", "Rsqrt"))


def scale(draw, net, blobs, out):
    x = pick(draw, blobs)
    s = draw(st.sampled_from([-1.5, 0.5, 2.0, 3.0]))
    net.Scale([x.name], [out], scale=s)
    return Blob(out, x.shape, positive=x.positive and s > 0)


def binary(draw, net, blobs, out):
    t = draw(st.sampled_from(["Add", "Sub", "Mul", "Div"]))
    a = pick(draw, blobs)
    # the second operand: the same blob, one of its shape, or a row that
    # broadcasts onto it
    cands = same_shape(blobs, a.shape)
    if len(a.shape) == 2:
        cands = cands + [b for b in blobs if b.shape == a.shape[1:]]
    if t == "Div":
        cands = [b for b in cands if b.positive]
        if not cands:
            return None
    b = pick(draw, cands)
    kwargs = {"broadcast": 1} if b.shape != a.shape else {}
    getattr(net, t)([a.name, b.name], [out], **kwargs)
    return Blob(out, a.shape, positive=t in ("Mul", "Div") and a.positive and b.positive
                or t == "Add" and a.positive and b.positive)


def nary(draw, net, blobs, out):
    t = draw(st.sampled_from(["Sum", "Mean"]))
    a = pick(draw, blobs)
    group = same_shape(blobs, a.shape)
    k = draw(st.integers(1, 4))
    ins = [a] + [pick(draw, group) for _ in range(k - 1)]
    getattr(net, t)([b.name for b in ins], [out])
    return Blob(out, a.shape, positive=all(b.positive for b in ins))


def copy(draw, net, blobs, out):
    # pass-through gradients (Copy's, Reshape's, StopGradient's none)
    x = pick(draw, blobs)
    t = draw(st.sampled_from(["Copy", "FlattenToVec", "StopGradient", "Sum"]))
    if t == "FlattenToVec":
        net.FlattenToVec([x.name], [out])
        return Blob(out, (int(np.prod(x.shape)),), x.positive)
    getattr(net, t)([x.name], [out])
    return Blob(out, x.shape, x.positive)


def concat(draw, net, blobs, out):
    mats = [b for b in blobs if len(b.shape) == 2 and b.shape[1] == 3]
    if not mats:
        return None
    ins = [pick(draw, mats) for _ in range(draw(st.integers(2, 3)))]
    # the split-info output is left unused
    net.Concat([b.name for b in ins], [out, out + "_info"], axis=0)
    return Blob(out, (sum(b.shape[0] for b in ins), 3), all(b.positive for b in ins))


def split(draw, net, blobs, out):
    mats = [b for b in blobs if len(b.shape) == 2 and b.shape[1] == 3]
    if not mats:
        return None
    x = pick(draw, mats)
    # three columns: the first part is used, the others maybe not
    net.Split([x.name], [out, out + "_b", out + "_c"], axis=1)
    return Blob(out, (x.shape[0], 1), x.positive)


def matmul(draw, net, blobs, out):
    mats = [b for b in blobs if len(b.shape) == 2]
    a = pick(draw, mats) if mats else None
    if a is None:
        return None
    bs = [b for b in mats if b.shape[0] == a.shape[1]]
    if not bs:
        return None
    b = pick(draw, bs)
    net.MatMul([a.name, b.name], [out])
    return Blob(out, (a.shape[0], b.shape[1]))


def reduce(draw, net, blobs, out):
    x = pick(draw, blobs)
    if len(x.shape) < 2 or draw(st.booleans()):
        net.SumElements([x.name], [out])
        return Blob(out, ())
    axis = draw(st.integers(0, 1))
    t = draw(st.sampled_from(["ReduceSum", "ReduceMean"]))
    getattr(net, t)([x.name], [out], axes=[axis], keepdims=0)
    return Blob(out, tuple(d for i, d in enumerate(x.shape) if i != axis), x.positive)


def softmax(draw, net, blobs, out):
    mats = [b for b in blobs if len(b.shape) == 2]
    if not mats:
        return None
    x = pick(draw, mats)
    net.Softmax([x.name], [out])
    return Blob(out, x.shape, positive=True)


MAKERS = [unary, unary, scale, binary, binary, nary, copy, concat, split, matmul, reduce, softmax]


@st.composite
def random_nets(draw):
    net = core.Net("fuzz")
    blobs = [Blob(n, s) for n, s in PARAMS.items()]
    written = []
    for k in range(draw(st.integers(3, 8))):
        maker = pick(draw, MAKERS)
        out = f"b{k}"
        # in place: write over a blob of the right shape instead (not a
        # parameter, whose value the check perturbs)
        made = maker(draw, net, blobs, out)
        if made is None:
            continue
        inplace = [b for b in written if b.shape == made.shape and b.name != made.name]
        if inplace and draw(st.integers(0, 3)) == 0:
            target = pick(draw, inplace)
            last = net.Proto().op[-1]
            ok = all(_core.operator_allows_inplace(last.type, i, 0)
                     for i, name in enumerate(last.input) if name == target.name)
            if len(last.output) == 1 and ok:
                last.output[0] = target.name
                blobs = [b for b in blobs if b.name != target.name]
                made = Blob(target.name, made.shape, made.positive)
        blobs = [b for b in blobs if b.name != made.name] + [made]
        written = [b for b in written if b.name != made.name] + [made]
    assume(written)
    # the loss: sum(y * R_y) over one to three of the written blobs
    ys = [pick(draw, written) for _ in range(draw(st.integers(1, 3)))]
    ys = list({y.name: y for y in ys}.values())
    seed = draw(st.integers(0, 2**31 - 1))
    return net, ys, seed


def forward_loss(net, feeds, ys, weights):
    for name, v in feeds.items():
        workspace.FeedBlob(name, v)
    workspace.RunNetOnce(net)
    total = 0.0
    for y in ys:
        total += float(np.sum(workspace.FetchBlob(y.name) * weights[y.name]))
    return total


def check_net(net, ys, seed):
    rng = np.random.default_rng(seed)
    feeds = {n: rng.uniform(-1.0, 1.0, s) for n, s in PARAMS.items()}
    weights = {y.name: rng.uniform(-1.0, 1.0, y.shape) for y in ys}
    forward_loss(net, feeds, ys, weights)
    for op in net.Proto().op:
        for o in op.output:
            v = workspace.FetchBlob(o)
            assume(np.all(np.isfinite(v)) and np.all(np.abs(v) < BOUND))
    # The differences are taken of the forward net with each StopGradient's
    # output held at its value (a Copy of a blob fed with it): their
    # derivative is the one the backward pass gives, which stops there. The
    # values are read right after each StopGradient runs (an op in place
    # may overwrite them later).
    values = {}
    for name, v in feeds.items():
        workspace.FeedBlob(name, v)
    for k, op in enumerate(net.Proto().op):
        workspace.RunOperatorOnce(op)
        if op.type == "StopGradient":
            values[k] = workspace.FetchBlob(op.output[0])
    numeric_net = core.Net("fuzz_frozen")
    numeric_net.Proto().external_input.extend(net.Proto().external_input)
    for k, op in enumerate(net.Proto().op):
        if k in values:
            held = f"_held_{k}"
            workspace.FeedBlob(held, values[k])
            numeric_net.AddExternalInput(held)
            numeric_net.Copy([held], list(op.output))
        else:
            numeric_net.Proto().op.add().CopyFrom(op)
    grad_net = net.Clone("fuzz_grad")
    seeds = {}
    for y in ys:
        workspace.FeedBlob(y.name + "_seed", weights[y.name])
        seeds[y.name] = y.name + "_seed"
        grad_net.AddExternalInput(y.name + "_seed")
    try:
        grads = grad_net.AddGradientOperators(seeds)
    except errors.InvalidArgumentError as e:
        # Caffe2's rules, kept: a gradient op may not need a blob version an
        # op in place overwrote, and a StopGradient's output must be read.
        assume("version" not in str(e) and "orphan" not in str(e))
        raise
    for name, v in feeds.items():
        workspace.FeedBlob(name, v)
    workspace.RunNetOnce(grad_net)
    got = {}
    for name in PARAMS:
        g = grads.get(name)
        got[name] = np.zeros(PARAMS[name]) if g is None else np.array(workspace.FetchBlob(g), np.float64)
        assert got[name].shape == PARAMS[name], (name, got[name].shape, str(net.Proto()))
    for name in PARAMS:
        for _ in range(2):
            v = rng.standard_normal(PARAMS[name])
            up = dict(feeds, **{name: feeds[name] + EPS * v})
            down = dict(feeds, **{name: feeds[name] - EPS * v})
            num = (forward_loss(numeric_net, up, ys, weights)
                   - forward_loss(numeric_net, down, ys, weights)) / (2 * EPS)
            ana = float(np.sum(got[name] * v))
            if abs(num - ana) > 1e-5 * (1.0 + abs(num)):
                raise AssertionError(
                    f"d loss/d {name}: directional {ana} from the backward pass, {num} by central "
                    f"differences\nforward net:\n{net.Proto()}\nys: {[y.name for y in ys]}\n"
                    f"backward ops:\n{grad_net.Proto()}"
                )
    CHECKED.append(len(net.Proto().op))


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(random_nets())
def _fuzz_gradients(case):
    net, ys, seed = case
    workspace.ResetWorkspace()
    check_net(net, ys, seed)


CHECKED = []  # one entry per net checked to the end (redrawn ones not counted)


def test_random_nets_have_the_gradients_of_central_differences(fresh):
    deadline = time.monotonic() + FUZZ_SECONDS
    _fuzz_gradients()
    while time.monotonic() < deadline:
        _fuzz_gradients()
    print(f"gradient fuzzer: {len(CHECKED)} random nets checked against central differences")
    assert CHECKED
