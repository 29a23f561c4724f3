"""Gradients through control flow (issue 27): If, While and Do
(control_ops_grad), in nets built by hand, with NetBuilder's IfNet/WhileNet
and with brew.cond/brew.loop. Every gradient is checked against numpy
written here and against central differences of the forward net, in float64.
"""

import numpy as np
import pytest
from ferrocaffe import brew, control_ops_grad, core, errors, gradients, workspace
from ferrocaffe.model_helper import ModelHelper
from ferrocaffe.net_builder import NetBuilder, ops
from ferrocaffe.proto import caffe2_pb2

DOUBLE = core.DataType.DOUBLE


def feed(values):
    for name, value in values.items():
        workspace.FeedBlob(name, value)


def numeric_grad(net, loss, blob, eps=1e-6):
    """d loss / d blob by central differences of the forward net."""
    x = np.array(workspace.FetchBlob(blob), dtype=np.float64)
    g = np.zeros_like(x)
    for k in range(x.size):
        vals = []
        for d in (eps, -eps):
            xx = x.copy()
            xx.reshape(-1)[k] += d
            workspace.FeedBlob(blob, xx)
            workspace.RunNetOnce(net)
            vals.append(float(workspace.FetchBlob(loss)))
        g.reshape(-1)[k] = (vals[0] - vals[1]) / (2 * eps)
    workspace.FeedBlob(blob, x)
    return g


def check(net, loss, expected, rtol=1e-6, atol=1e-9):
    """Adds the gradient ops of ``loss`` to ``net``, runs it, and compares
    the gradient of each blob of ``expected`` (name -> numpy value) with it
    and with central differences of the forward net."""
    forward = net.Clone(net.Name() + "_forward")
    grads = net.AddGradientOperators([loss])
    inputs = {name: workspace.FetchBlob(name) for name in expected}
    workspace.RunNetOnce(net)
    got = {name: workspace.FetchBlob(str(grads[core.BlobReference(name)])) for name in expected}
    feed(inputs)
    for name, want in expected.items():
        np.testing.assert_allclose(got[name], want, rtol=rtol, atol=atol, err_msg=name)
        np.testing.assert_allclose(got[name], numeric_grad(forward, loss, name), rtol=1e-5,
                                   atol=1e-7, err_msg=name)
    return grads


def grad_ops(net, start):
    return [(op.type, list(op.input), list(op.output)) for op in net.Proto().op[start:]]


# ------------------------------------------------------------------ If --


def raw_if_net():
    """y = x; if c: y = 3y + x*w, z = x*x else: z = x*u;
    loss = sum((y + w) * z). The If writes y in place, and Add passes one
    gradient to both y and w."""
    then_net = core.Net("then")
    then_net.Mul(["x", "w"], "t")
    then_net.Scale("y", "y", scale=3.0)
    then_net.Sum(["y", "t"], "y")
    then_net.Mul(["x", "x"], "z")
    else_net = core.Net("else")
    else_net.Mul(["x", "u"], "z")
    net = core.Net("raw_if")
    net.Copy("x", "y")
    net.ConstantFill([], "z", shape=[3], value=0.0, dtype=DOUBLE)
    net.If(["c", "y", "w", "x", "u"], ["y", "z", "t"],
           then_net=then_net.Proto(), else_net=else_net.Proto())
    net.Add(["y", "w"], "s")
    net.Mul(["s", "z"], "p")
    net.SumElements("p", "loss")
    return net


@pytest.mark.parametrize("c", [True, False])
def test_if_with_branches_in_the_workspace(fresh, c):
    rng = np.random.default_rng(1)
    x, w, u = rng.standard_normal((3, 3))
    feed({"x": x, "w": w, "u": u, "c": np.array(c)})
    if c:  # loss = sum((3x + xw + w) x^2)
        want = {"x": (3 + w) * x * x + (3 * x + x * w + w) * 2 * x, "w": (x + 1) * x * x,
                "u": np.zeros(3)}
    else:  # loss = sum((x + w) x u)
        want = {"x": x * u + (x + w) * u, "w": x * u, "u": (x + w) * x}
    check(raw_if_net(), "loss", want)


def test_if_without_else_passes_gradients_through(fresh):
    then_net = core.Net("then")
    then_net.Mul(["x", "w"], "y")
    net = core.Net("if_only")
    net.Copy("x", "y")
    net.If(["c", "x", "w", "y"], ["y"], then_net=then_net.Proto())
    net.Mul(["y", "y"], "p")
    net.SumElements("p", "loss")
    x, w = np.array([0.5, -1.5]), np.array([2.0, 0.25])
    for c in (True, False):
        feed({"x": x, "w": w, "c": np.array(c)})
        n = net.Clone(f"if_only_{c}")
        if c:  # loss = sum((xw)^2)
            check(n, "loss", {"x": 2 * x * w * w, "w": 2 * x * x * w})
        else:  # loss = sum(x^2); w's gradient is zero
            check(n, "loss", {"x": 2 * x, "w": np.zeros(2)})


@pytest.mark.parametrize("c1,c2", [(True, True), (True, False), (False, True), (False, False)])
def test_if_net_in_net_builder(fresh, c1, c2):
    """IfNet/Else inside an IfNet, with a blob local to the outer branch."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 4))
    feed({"x": x, "w": w, "c1": np.array(c1), "c2": np.array(c2)})
    with NetBuilder(_use_control_ops=True, initial_scope=["x", "w", "c1", "c2"]) as nb:
        ops.ConstantFill([], "y", shape=[4], value=0.0, dtype=DOUBLE)
        with ops.IfNet("c1"):
            ops.Mul(["x", "w"], "a")  # local to the branch
            with ops.IfNet("c2"):
                ops.Tanh("a", "y")
            with ops.Else():
                ops.Sigmoid("a", "y")
        with ops.Else():
            ops.Mul(["x", "x"], "y")
        ops.Mul(["y", "w"], "p")
        ops.SumElements("p", "loss")
    net = nb.get()[0]
    a = x * w
    if c1 and c2:
        dy_da = 1 - np.tanh(a) ** 2
        want = {"x": w * dy_da * w, "w": np.tanh(a) + w * dy_da * x}
    elif c1:
        s = 1 / (1 + np.exp(-a))
        want = {"x": w * s * (1 - s) * w, "w": s + w * s * (1 - s) * x}
    else:
        want = {"x": 2 * x * w, "w": x * x}
    check(net, "loss", want)
    assert not workspace.HasBlob("a")


@pytest.mark.parametrize("c", [True, False])
def test_brew_cond(fresh, c):
    x, w = np.array([1.5, -0.5, 2.0]), np.array([0.5, 2.0, -1.0])
    feed({"x": x, "w": w, "cond": np.array(c), "y": np.zeros(3)})
    model = ModelHelper(name="cond_model")
    then_model = ModelHelper(name="then_model")
    then_model.net.Mul(["x", "w"], "y")
    else_model = ModelHelper(name="else_model")
    else_model.net.Sqr("x", "tmp")
    else_model.net.Add(["tmp", "w"], "y")
    brew.cond(model, "cond", ["x", "w", "y"], then_model, else_model)
    model.net.Mul(["y", "x"], "p")
    model.net.SumElements("p", "loss")
    if c:  # loss = sum(x^2 w)
        want = {"x": 2 * x * w, "w": x * x}
    else:  # loss = sum((x^2 + w) x)
        want = {"x": 3 * x * x + w, "w": x}
    n = len(model.net.Proto().op)
    check(model.net, "loss", want)
    # Mul's gradient for x comes first, so the If's is renamed to be summed
    # with it: in the If's nets too (the gradient Do there writes it).
    (g_if,) = [op for op in model.net.Proto().op[n:] if op.type == "If"]
    assert "_x_grad_autosplit_0" in g_if.output
    for arg in g_if.arg:
        assert "_x_grad_autosplit_0" in [o for op in arg.n.op for o in op.output]


def test_if_training_learns_each_branch(fresh):
    """A shortened Caffe2 TestIf: one linear model per branch, trained by
    SGD on the branch the data chose; each learns its own target."""
    rng = np.random.default_rng(3)
    params = {"Wa": np.zeros((1, 2)), "Ba": np.zeros(1), "Wb": np.zeros((1, 2)), "Bb": np.zeros(1)}
    feed(params)
    with NetBuilder(_use_control_ops=True, initial_scope=list(params) + ["X", "Y", "sw"]) as nb:
        ops.ConstantFill([], "pred", shape=[16, 1], value=0.0, dtype=DOUBLE)
        with ops.IfNet("sw"):
            ops.FC(["X", "Wa", "Ba"], "pred")
        with ops.Else():
            ops.FC(["X", "Wb", "Bb"], "pred")
        dist = ops.SquaredL2Distance(["pred", "Y"], "dist")
        ops.AveragedLoss(dist, "loss")
    net = nb.get()[0]
    grads = net.AddGradientOperators(["loss"])
    for name in params:
        step = net.Scale(grads[core.BlobReference(name)], name + "_step", scale=-0.5)
        net.Sum([name, step], name)
    feed({"X": np.zeros((16, 2)), "Y": np.zeros((16, 1)), "sw": np.array(True)})
    workspace.CreateNet(net)
    true = {True: (np.array([[2.0, -1.0]]), 0.5), False: (np.array([[-3.0, 0.5]]), -1.0)}
    for _ in range(300):
        sw = bool(rng.integers(2))
        X = rng.standard_normal((16, 2))
        W, b = true[sw]
        feed({"X": X, "Y": X @ W.T + b, "sw": np.array(sw)})
        workspace.RunNet(net.Name())
    np.testing.assert_allclose(workspace.FetchBlob("Wa"), true[True][0], atol=1e-3)
    np.testing.assert_allclose(workspace.FetchBlob("Ba"), [true[True][1]], atol=1e-3)
    np.testing.assert_allclose(workspace.FetchBlob("Wb"), true[False][0], atol=1e-3)
    np.testing.assert_allclose(workspace.FetchBlob("Bb"), [true[False][1]], atol=1e-3)


# --------------------------------------------------------------- While --


def rnn_net():
    """h = x; acc = v; repeat n times: h = tanh(h w); acc = acc + h;
    loss = sum(h * acc). The body reads h and then overwrites it, and w is
    read by every iteration."""
    with NetBuilder(_use_control_ops=True, initial_scope=["x", "w", "v", "n"]) as nb:
        ops.Copy(ops.Const(np.array(0, np.int64)), "i")
        ops.Copy(ops.Const(np.array(1, np.int64)), "one")
        ops.Copy("x", "h")
        ops.Copy("v", "acc")
        with ops.WhileNet():
            with ops.Condition():
                ops.Add(["i", "one"], "i")
                ops.LE(["i", "n"])
            ops.Mul(["h", "w"], "t")  # local to the body
            ops.Tanh("t", "h")
            ops.Sum(["acc", "h"], "acc")
        ops.Mul(["h", "acc"], "p")
        ops.SumElements("p", "loss")
    return nb.get()[0]


def rnn_expected(x, w, v, n):
    hs = [x]
    for _ in range(n):
        hs.append(np.tanh(hs[-1] * w))
    acc = v + sum(hs[1:])
    dh, dacc = acc.copy(), hs[-1].copy()  # of the final h and acc
    dw = np.zeros_like(w)
    for k in range(n, 0, -1):
        dh = dh + dacc  # acc = acc + h_k
        dt = dh * (1 - hs[k] ** 2)
        dw += dt * hs[k - 1]
        dh = dt * w
    return {"x": dh, "w": dw, "v": dacc}


@pytest.mark.parametrize("n", [0, 1, 4])
def test_while_net_carries_and_sums_gradients(fresh, n):
    rng = np.random.default_rng(4)
    x, w, v = rng.standard_normal((3, 3))
    feed({"x": x, "w": w, "v": v, "n": np.array(n, np.int64)})
    check(rnn_net(), "loss", rnn_expected(x, w, v, n))


def test_while_net_runs_again_and_keeps_nothing(fresh):
    rng = np.random.default_rng(5)
    x, w, v = rng.standard_normal((3, 3))
    feed({"x": x, "w": w, "v": v, "n": np.array(3, np.int64)})
    net = rnn_net()
    forward = net.Clone("rnn_forward_only")
    grads = net.AddGradientOperators(["loss"])
    want = rnn_expected(x, w, v, 3)
    workspace.CreateNet(net)
    for _ in range(3):
        workspace.RunNet(net.Name())
        for name in ("x", "w", "v"):
            np.testing.assert_allclose(workspace.FetchBlob(str(grads[core.BlobReference(name)])),
                                       want[name], rtol=1e-9)
    # The gradient took every workspace the loop kept; a net without the
    # gradient keeps none.
    scopes = [op.output[0] for op in net.Proto().op if op.type == "CreateScope"]
    assert scopes
    check_net = core.Net("has_scope")
    for k, s in enumerate(scopes):
        check_net.HasScope(s, f"has_{k}")
    for run in (None, forward):
        if run is not None:
            workspace.RunNetOnce(run)
        workspace.RunNetOnce(check_net)
        assert not any(workspace.FetchBlob(f"has_{k}") for k in range(len(scopes)))
    # The net's proto is the one built (the runtime marks its own copy).
    assert all(not op.arg for op in net.Proto().op if op.type == "CreateScope")


def test_while_with_if_in_the_body_as_the_tutorial(fresh):
    """Caffe2's TestWhile (skipped there as flaky) and the last example of its
    Control_Ops tutorial: x^4, y^2 and z^3 through a loop with an If."""
    with NetBuilder(_use_control_ops=True) as nb:
        ops.Copy(ops.Const(0), "i")
        ops.Copy(ops.Const(1), "one")
        ops.Copy(ops.Const(2), "two")
        ops.Copy(ops.Const(2.0), "x")
        ops.Copy(ops.Const(3.0), "y")
        ops.Copy(ops.Const(2.0), "z")
        with ops.WhileNet():
            with ops.Condition():
                ops.Add(["i", "one"], "i")
                ops.LE(["i", "two"])
            ops.Pow("x", "x", exponent=2.0)
            with ops.IfNet(ops.LT(["i", "two"])):
                ops.Pow("y", "y", exponent=2.0)
            with ops.Else():
                ops.Pow("z", "z", exponent=3.0)
        ops.Add(["x", "y"], "x_plus_y")
        ops.Add(["x_plus_y", "z"], "s")
    net = nb.get()[0]
    net.AddGradientOperators(["s"])
    workspace.RunNetOnce(net)
    assert workspace.FetchBlob("x") == 16 and workspace.FetchBlob("x_grad") == 32  # 4x^3
    assert workspace.FetchBlob("y") == 9 and workspace.FetchBlob("y_grad") == 6  # 2y
    assert workspace.FetchBlob("z") == 8 and workspace.FetchBlob("z_grad") == 12  # 3z^2


def test_while_with_if_in_the_body_float64(fresh):
    """As above with inputs of the test's choosing: the If takes either branch
    in different iterations, and the body reads a weight."""
    x, y, w = np.array([0.7, -0.4]), np.array([1.3, 0.2]), np.array([0.9, -1.1])
    feed({"x0": x, "y0": y, "w": w, "n": np.array(4, np.int64)})
    with NetBuilder(_use_control_ops=True, initial_scope=["x0", "y0", "w", "n"]) as nb:
        ops.Copy("x0", "x")
        ops.Copy("y0", "y")
        ops.Copy(ops.Const(np.array(0, np.int64)), "i")
        ops.Copy(ops.Const(np.array(1, np.int64)), "one")
        ops.Copy(ops.Const(np.array(2, np.int64)), "two")
        with ops.WhileNet():
            with ops.Condition():
                ops.Add(["i", "one"], "i")
                ops.LE(["i", "n"])
            ops.Mul(["x", "w"], "x")
            with ops.IfNet(ops.LT(["i", "two"])):
                ops.Sum(["y", "x"], "y")
            with ops.Else():
                ops.Mul(["y", "x"], "y")
        ops.Mul(["x", "y"], "p")
        ops.SumElements("p", "loss")
    # i = 1: x = xw, y = y + xw; i = 2, 3, 4: x = x w, y = y x
    xs = [x * w ** k for k in range(5)]
    ys = [y, y + xs[1]]
    for k in (2, 3, 4):
        ys.append(ys[-1] * xs[k])
    dx, dy, dw = ys[4], xs[4], np.zeros(2)
    for k in (4, 3, 2):
        dx = dx + dy * ys[k - 1]  # y_k = y_{k-1} x_k
        dy = dy * xs[k]
        dw += dx * xs[k - 1]  # x_k = x_{k-1} w
        dx = dx * w
    dx = dx + dy  # y_1 = y_0 + x_1
    dw += dx * xs[0]
    dx = dx * w
    check(nb.get()[0], "loss", {"x0": dx, "y0": dy, "w": dw})


@pytest.mark.parametrize("n", [0, 3])
def test_brew_loop(fresh, n):
    y0, w = np.array([1.5, -0.5]), np.array([0.8, 1.2])
    feed({"y": y0, "w": w, "one": np.array(1, np.int32), "limit": np.array(n, np.int32),
          "cond": np.array(False)})
    model = ModelHelper(name="loop_model")
    model.net.ConstantFill([], "i", shape=[], value=0, dtype=core.DataType.INT32)
    model.net.Copy("y", "h")
    loop_model = ModelHelper(name="loop_body")
    loop_model.net.Mul(["h", "w"], "h")
    cond_model = ModelHelper(name="loop_cond")
    cond_model.net.Add(["i", "one"], "i")
    cond_model.net.LE(["i", "limit"], "cond")
    brew.loop(model, "cond", ["cond", "i", "one", "limit", "h", "w"], loop_model, cond_model)
    model.net.SumElements("h", "loss")
    # loss = sum(y w^n)
    check(model.net, "loss", {"y": w ** n, "w": n * y0 * w ** max(n - 1, 0)})


@pytest.mark.parametrize("c", [True, False])
def test_if_then_while_on_its_outputs(fresh, c):
    """The While overwrites what the If wrote, and the If's gradient reads
    it (Tanh's gradient reads its output): from the branch's kept workspace,
    not the overwritten blob. Sum passes one gradient to both outputs."""
    x, w = np.array([0.4, -0.3]), np.array([0.9, 1.1])
    feed({"x": x, "w": w, "c": np.array(c), "n": np.array(2, np.int64)})
    with NetBuilder(_use_control_ops=True, initial_scope=["x", "w", "c", "n"]) as nb:
        ops.ConstantFill([], "a", shape=[2], value=0.0, dtype=DOUBLE)
        ops.ConstantFill([], "b", shape=[2], value=0.0, dtype=DOUBLE)
        with ops.IfNet("c"):
            ops.Mul(["x", "w"], "a")
            ops.Mul(["x", "x"], "b")
        with ops.Else():
            ops.Tanh("x", "a")
        ops.Copy(ops.Const(np.array(0, np.int64)), "i")
        ops.Copy(ops.Const(np.array(1, np.int64)), "one")
        with ops.WhileNet():
            with ops.Condition():
                ops.Add(["i", "one"], "i")
                ops.LE(["i", "n"])
            ops.Mul(["a", "w"], "a")
            ops.Mul(["b", "w"], "b")
        ops.Sum(["a", "b"], "s")
        ops.SumElements("s", "loss")
    if c:  # loss = sum(x w^3 + x^2 w^2)
        want = {"x": (w + 2 * x) * w * w, "w": 3 * x * w * w + 2 * x * x * w}
    else:  # loss = sum(tanh(x) w^2)
        want = {"x": (1 - np.tanh(x) ** 2) * w * w, "w": 2 * np.tanh(x) * w}
    check(nb.get()[0], "loss", want)


def test_nested_loops(fresh):
    """A WhileNet in a WhileNet's body, and a blob the outer body writes
    without reading it (its gradient reaches the last iteration only)."""
    x, w = np.array([0.4, -0.3]), np.array([0.9, 1.1])
    feed({"x0": x, "w": w, "n": np.array(2, np.int64), "m": np.array(3, np.int64)})
    with NetBuilder(_use_control_ops=True, initial_scope=["x0", "w", "n", "m"]) as nb:
        ops.Copy("x0", "h")
        ops.ConstantFill([], "out", shape=[2], value=0.0, dtype=DOUBLE)
        ops.Copy(ops.Const(np.array(0, np.int64)), "i")
        ops.Copy(ops.Const(np.array(1, np.int64)), "one")
        with ops.WhileNet():
            with ops.Condition():
                ops.Add(["i", "one"], "i")
                ops.LE(["i", "n"])
            ops.Copy(ops.Const(np.array(0, np.int64)), "j")
            with ops.WhileNet():
                with ops.Condition():
                    ops.Add(["j", "one"], "j")
                    ops.LE(["j", "m"])
                ops.Mul(["h", "w"], "t")
                ops.Sin("t", "h")
            ops.Mul(["h", "h"], "out")
        ops.Mul(["out", "w"], "p")
        ops.Sum(["p", "h"], "q")
        ops.SumElements("q", "loss")
    hs = [x]
    for _ in range(6):
        hs.append(np.sin(hs[-1] * w))
    # loss = sum(h6^2 w + h6)
    dh, dw = 2 * hs[6] * w + 1, hs[6] ** 2
    for k in range(6, 0, -1):
        dt = dh * np.cos(hs[k - 1] * w)
        dw = dw + dt * hs[k - 1]
        dh = dt * w
    check(nb.get()[0], "loss", {"x0": dh, "w": dw})


def test_do_with_blobs_of_its_own(fresh):
    x, w = np.array([0.3, -1.2, 2.0]), np.array([1.5, 0.5, -0.5])
    feed({"x": x, "w": w})
    inner = core.Net("inner")
    inner.Mul(["a", "b"], "t")  # t is the inner net's own
    inner.Sigmoid("t", "s")
    inner.Mul(["s", "a"], "out")
    net = core.Net("do")
    net.CreateScope([], "scope")
    net.ConstantFill([], "y", shape=[3], value=0.0, dtype=DOUBLE)
    net.Do(["x", "w", "y", "scope"], ["y", "scope"], net=inner.Proto(),
           inner_blobs=["a", "b", "out"], outer_blobs_idx=[0, 1, 2])
    net.SumElements("y", "loss")
    s = 1 / (1 + np.exp(-x * w))
    ds = x * s * (1 - s)  # d(s a)/dt through s, times a
    check(net, "loss", {"x": s + ds * w, "w": ds * x})


# ------------------------------------------------------- what is refused --


def test_while_whose_body_is_not_a_do_is_refused(fresh):
    body = core.Net("body")
    body.Mul(["h", "w"], "h")
    body.LT(["h", "w"], "c")
    net = core.Net("raw_while")
    net.While(["c", "h", "w"], ["c", "h"], loop_net=body.Proto())
    net.SumElements("h", "loss")
    with pytest.raises(errors.InvalidArgumentError, match="loop body must be one Do op"):
        net.AddGradientOperators(["loss"])


def test_gradient_through_the_cond_net_is_refused(fresh):
    feed({"x": np.array([1.0]), "lim": np.array([4.0]), "c": np.array(True)})
    with NetBuilder(_use_control_ops=True, initial_scope=["x", "lim", "c"]) as nb:
        with ops.WhileNet():
            with ops.Condition():
                ops.Scale("x", "x", scale=2.0)
                ops.LT(["x", "lim"])
            ops.Tanh("x", "y")
    net = nb.get()[0]
    net.SumElements("x", "loss")
    with pytest.raises(errors.InvalidArgumentError, match="do not flow through the cond_net"):
        net.AddGradientOperators(["loss"])


def test_branch_overwriting_what_its_gradient_reads_is_refused(fresh):
    then_net = core.Net("then")
    then_net.Mul(["y", "w"], "t")
    then_net.Tanh("t", "y")  # the If runs in the workspace: y's old value is gone
    net = core.Net("if")
    net.If(["c", "y", "w"], ["y", "t"], then_net=then_net.Proto())
    net.SumElements("y", "loss")
    with pytest.raises(errors.InvalidArgumentError, match="needs 'y' as it was before the branch"):
        net.AddGradientOperators(["loss"])


def test_gradient_do_needs_the_forward_workspace(fresh):
    """A scope keeps workspaces when its net holds the gradient Do (or when
    CreateScope says keep_workspaces); otherwise the gradient Do says why it
    cannot run."""
    feed({"x": np.array([0.5, 2.0])})
    inner = core.Net("inner")
    inner.Sqr("a", "sq")
    inner.Mul(["sq", "a"], "b")
    for keep in (False, True):
        forward = core.Net(f"forward_{keep}")
        forward.CreateScope([], "scope", **({"keep_workspaces": True} if keep else {}))
        forward.Do(["x", "scope"], ["y", "scope"], net=inner.Proto(),
                   inner_blobs=["a", "b"], outer_blobs_idx=[0, 1])
        forward.SumElements("y", "loss")
        backward_ops, grads = core.GradientRegistry.GetBackwardPass(forward.Proto().op, ["loss"])
        backward = core.Net(f"backward_{keep}")
        backward.Proto().op.extend(backward_ops)
        workspace.RunNetOnce(forward)
        if keep:
            workspace.RunNetOnce(backward)
            np.testing.assert_allclose(workspace.FetchBlob("x_grad"), 3 * np.array([0.5, 2.0]) ** 2)
        else:
            with pytest.raises(errors.FerrocaffeError, match="holds no workspace of a forward run"):
                workspace.RunNetOnce(backward)


def test_do_reusing_its_workspace_is_refused(fresh):
    inner = core.Net("inner")
    inner.Sqr("a", "b")
    net = core.Net("reuse")
    net.CreateScope([], "scope")
    net.Do(["x", "scope"], ["y", "scope"], net=inner.Proto(), inner_blobs=["a", "b"],
           outer_blobs_idx=[0, 1], reuse_workspace=True)
    net.SumElements("y", "loss")
    with pytest.raises(errors.InvalidArgumentError, match="reuse_workspace has no gradient"):
        net.AddGradientOperators(["loss"])


def test_sparse_gradient_into_an_if_is_refused(fresh):
    then_net = core.Net("then")
    then_net.Copy("e", "y")
    net = core.Net("if")
    net.If(["c", "e"], ["y"], then_net=then_net.Proto())
    net.Gather(["y", "idx"], "rows")
    net.SumElements("rows", "loss")
    with pytest.raises(errors.InvalidArgumentError, match="is sparse"):
        net.AddGradientOperators(["loss"])


# ------------------------------------------- Caffe2's helpers and names --


def test_disambiguate_grad_if_op_output_as_caffe2():
    """Caffe2's control_ops_grad_test: the output and the else_net op
    writing it take the new name."""
    then_model = ModelHelper(name="then_test_model")
    then_model.net.Copy("then_grad", "input_grad")
    else_model = ModelHelper(name="else_test_model")
    else_model.net.Copy("else_grad", "else_temp_grad")
    else_model.net.Copy("else_temp", "input_grad")
    grad_op = core.CreateOperator(
        "If", ["cond", "then_grad", "else_grad"], ["input_grad", "else_temp_grad"],
        then_net=then_model.net.Proto(), else_net=else_model.net.Proto())
    new_grad_output = "input_grad" + "_autosplit_" + "0"
    control_ops_grad.disambiguate_grad_if_op_output(grad_op, 0, new_grad_output)
    assert grad_op.output[0] == new_grad_output
    names = {a.name: a.n for a in grad_op.arg}
    assert set(names) == {"then_net", "else_net"}
    assert names["else_net"].op[1].output[0] == new_grad_output
    assert names["then_net"].op[0].output[0] == new_grad_output
    assert names["else_net"].op[0].output[0] == "else_temp_grad"


def test_disambiguate_renames_reads_after_the_write():
    net = core.Net("then")
    net.Copy("g", "input_grad")
    net.Scale("input_grad", "scaled")
    grad_op = core.CreateOperator("If", ["cond", "g"], ["input_grad", "scaled"], then_net=net.Proto())
    control_ops_grad.disambiguate_grad_if_op_output(grad_op, 0, "new")
    then = control_ops_grad.getNetArgument(grad_op, "then_net")
    assert [list(o.output) for o in then.op] == [["new"], ["scaled"]]
    assert list(then.op[1].input) == ["new"]


def test_caffe2_module_name_through_the_alias():
    import ferrocaffe

    ferrocaffe.register_caffe2_alias()
    from caffe2.python.control_ops_grad import (  # noqa: F401
        disambiguate_grad_if_op_output, gen_do_gradient, gen_if_gradient, gen_while_gradient,
    )
    from caffe2.python import core as c2core

    assert gen_if_gradient is control_ops_grad.gen_if_gradient
    assert c2core.GradientRegistry.gradient_registry_["If"] is gen_if_gradient
    assert c2core.GradientRegistry.gradient_registry_["While"] is gen_while_gradient
    assert c2core.GradientRegistry.gradient_registry_["Do"] is gen_do_gradient


def test_if_gradient_ops_and_names(fresh):
    """The tutorial's first backward example: one If on the forward
    condition, each branch a gradient Do on its branch's scope; y_grad keeps
    its name."""
    feed({"x": np.array(0.5, np.float32)})
    with NetBuilder(_use_control_ops=True, initial_scope=["x"]) as nb:
        ops.Const(0.0, blob_out="zero")
        ops.Const(4.0, blob_out="y")
        ops.Const(0.0, blob_out="z")
        with ops.IfNet(ops.GT(["x", "zero"])):
            ops.Pow("y", "z", exponent=2.0)
        with ops.Else():
            ops.Pow("y", "z", exponent=3.0)
    net = nb.get()[0]
    n = len(net.Proto().op)
    fwd_if = net.Proto().op[n - 1]
    grads = net.AddGradientOperators(["z"])
    assert str(grads[core.BlobReference("y")]) == "y_grad"
    got = grad_ops(net, n)
    assert got[0] == ("ConstantFill", ["z"], ["z_autogen_grad"])
    op = net.Proto().op[n + 1]
    assert (op.type, list(op.output), op.is_gradient_op) == ("If", ["y_grad"], True)
    assert op.input[0] == fwd_if.input[0]
    for arg, scope in zip(op.arg, fwd_if.input[-2:]):
        (do,) = arg.n.op
        assert (do.type, do.input[-1], list(do.output), do.is_gradient_op) == ("Do", scope, ["y_grad"], True)
    for x, want in ((0.5, 8.0), (-0.5, 48.0)):
        feed({"x": np.array(x, np.float32)})
        workspace.RunNetOnce(net)
        assert workspace.FetchBlob("y_grad") == want


# ------------------------------------------- the backward pass's renaming --


def _fake_control_op(then_ops):
    op = core.CreateOperator("FakeIf", ["c", "y"], ["y"])
    net = caffe2_pb2.NetDef()
    net.op.extend(then_ops)
    op.arg.add(name="then_net").n.CopyFrom(net)
    return op


@pytest.fixture
def fake_if_maker():
    """Registers a maker for a FakeIf op (in the registry for the test only)."""
    registry = gradients.GradientRegistry.gradient_registry_
    yield lambda maker: gradients.GradientRegistry.RegisterGradient("FakeIf")(maker)
    registry.pop("FakeIf", None)


def test_nets_use_the_names_their_maker_gave(fake_if_maker):
    """A maker's nets name blobs as the maker did (placeholders included);
    the backward pass renames them with the op's inputs and outputs. (Before:
    the nets were renamed by the stripped names, so an input and an output
    both called y_grad there took one name, and placeholders stayed.)"""

    def maker(op, g_output):
        gi = gradients.grad_name(op.input[1])  # "y\x000\x00_grad": y is written in place
        inner = core.CreateOperator("Scale", [g_output[0]], [gi], scale=2.0)
        g = core.CreateOperator("If", [op.input[0], g_output[0]], [gi])
        g.arg.add(name="then_net").n.op.extend([inner])
        return [g], [None, gi]

    fake_if_maker(maker)
    fwd = [core.CreateOperator("Scale", "x", "y"), _fake_control_op([]),
           core.CreateOperator("Sum", ["y", "x"], "s")]
    ops_, grads = gradients.IR(fwd).GetBackwardPass(["s"])
    (g_if,) = [o for o in ops_ if o.type == "If"]
    inner = g_if.arg[0].n.op[0]
    # Sum passes s's gradient to both y and x: the If may not write it in place.
    assert list(inner.input) == [g_if.input[1]] and list(inner.output) == list(g_if.output)
    assert g_if.input[1] != g_if.output[0]
    assert "\x00" not in "".join(list(inner.input) + list(inner.output))


def test_a_nets_op_writes_in_place_only_where_its_maker_did(fake_if_maker):
    """An output its maker named as an input (a loop carries it) is that
    input's blob; where the value read is still needed, the maker is told."""

    def maker(op, g_output):
        g = core.CreateOperator("If", [op.input[0], g_output[0]], [g_output[0]])
        g.arg.add(name="then_net").n.op.extend(
            [core.CreateOperator("Scale", [g_output[0]], [g_output[0]], scale=2.0)])
        return [g], [None, g_output[0]]

    fake_if_maker(maker)
    fwd = [_fake_control_op([]), core.CreateOperator("Sum", ["y", "x"], "s")]
    with pytest.raises(errors.InvalidArgumentError, match="still needed after it"):
        gradients.IR(fwd).GetBackwardPass(["s"])

    def private_maker(op, g_output):
        mine = "carried"
        g = core.CreateOperator("If", [op.input[0], mine], [mine])
        g.arg.add(name="then_net").n.op.extend([core.CreateOperator("Scale", [mine], [mine], scale=2.0)])
        return [core.CreateOperator("Copy", [g_output[0]], [mine]), g], [None, mine]

    fake_if_maker(private_maker)
    ops_, grads = gradients.IR(fwd).GetBackwardPass(["s"])
    g_if = ops_[-1]
    (scale,) = g_if.arg[0].n.op
    assert g_if.input[1] == g_if.output[0] == scale.input[0] == scale.output[0] == grads["y"]


def test_rename_in_nets_leaves_a_do_net_alone():
    """A Do's net has names of its own: renaming an If's blobs renames the
    Do's inputs and outputs in the If's nets, not the Do's net."""
    inner = core.Net("inner")
    inner.Copy("x_grad", "out")
    do = core.CreateOperator("Do", ["x_grad", "scope"], ["out_outer", "scope"], net=inner.Proto(),
                             inner_blobs=["x_grad", "out"], outer_blobs_idx=[0, 1])
    g_if = core.CreateOperator("If", ["c", "x_grad"], ["out_outer"])
    g_if.arg.add(name="then_net").n.op.extend([do])
    gradients._rename_in_nets(g_if, {"x_grad": "_x_grad_1", "out_outer": "w_grad"})
    (do,) = g_if.arg[0].n.op
    assert list(do.input) == ["_x_grad_1", "scope"] and list(do.output) == ["w_grad", "scope"]
    net = control_ops_grad.getNetArgument(do, "net")
    assert list(net.op[0].input) == ["x_grad"]
