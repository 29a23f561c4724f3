"""core.Net.AddGradientOperators and core.GradientRegistry (issue 14): the
ops the backward pass adds (names as Caffe2 made them), and the gradients it
computes against central differences of the whole net."""

import numpy as np
import pytest
from ferrocaffe import core, errors, workspace
from ferrocaffe.gradient_checker import GradientChecker


def ops_of(net, start=0):
    return [(op.type, list(op.input), list(op.output)) for op in net.Proto().op[start:]]


def numeric_grad(net, loss, blob, eps=1e-6):
    """d loss / d blob by central differences, rerunning the forward net."""
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


def test_mlp_backward_ops_and_values(fresh):
    rng = np.random.default_rng(0)
    net = core.Net("mlp")
    h = net.FC(["x", "w1", "b1"], "h")
    r = net.Relu(h, "r")
    y = net.FC([r, "w2", "b2"], "y")
    _, loss = net.SoftmaxWithLoss([y, "label"], ["p", "loss"])
    n_fwd = len(net.Proto().op)
    forward = net.Clone("mlp_forward")
    grads = net.AddGradientOperators([loss])
    assert ops_of(net, n_fwd) == [
        ("ConstantFill", ["loss"], ["loss_autogen_grad"]),
        ("SoftmaxWithLossGradient", ["y", "label", "p", "loss_autogen_grad"], ["y_grad"]),
        ("FCGradient", ["r", "w2", "y_grad"], ["w2_grad", "b2_grad", "r_grad"]),
        ("ReluGradient", ["r", "r_grad"], ["h_grad"]),
        ("FCGradient", ["x", "w1", "h_grad"], ["w1_grad", "b1_grad", "x_grad"]),
    ]
    # As Caffe2: the built-in makers' ops are marked, the seed is not.
    assert [op.is_gradient_op for op in net.Proto().op[n_fwd:]] == [False, True, True, True, True]
    assert {str(k): str(v) for k, v in grads.items()} == {
        "loss": "loss_autogen_grad", "y": "y_grad", "r": "r_grad", "h": "h_grad",
        "w2": "w2_grad", "b2": "b2_grad", "x": "x_grad", "w1": "w1_grad", "b1": "b1_grad",
    }
    assert str(grads[core.BlobReference("w1")]) == "w1_grad"
    assert "label" not in {str(k) for k in grads}
    feeds = {
        "x": rng.standard_normal((4, 3)), "w1": rng.standard_normal((5, 3)), "b1": rng.standard_normal(5),
        "w2": rng.standard_normal((2, 5)), "b2": rng.standard_normal(2),
        "label": np.array([0, 1, 1, 0], np.int32),
    }
    for k, v in feeds.items():
        workspace.FeedBlob(k, v)
    workspace.RunNetOnce(net)
    for blob in ("w1", "b1", "w2", "b2", "x"):
        np.testing.assert_allclose(
            workspace.FetchBlob(blob + "_grad"), numeric_grad(forward, "loss", blob), rtol=1e-5, atol=1e-6
        )


def test_blob_read_twice_gets_summed_gradients(fresh):
    net = core.Net("split")
    a = net.Relu("x", "a")
    b = net.Sigmoid("x", "b")
    s = net.Mul([a, b], "s")
    loss = net.AveragedLoss(s, "loss")
    forward = net.Clone("split_forward")
    n = len(net.Proto().op)
    net.AddGradientOperators([loss])
    got = ops_of(net, n)
    # The later reader's gradient keeps x_grad; the earlier one's is renamed.
    assert got[-3:] == [
        ("SigmoidGradient", ["b", "b_grad"], ["x_grad"]),
        ("ReluGradient", ["a", "a_grad"], ["_x_grad_autosplit_0"]),
        ("Sum", ["x_grad", "_x_grad_autosplit_0"], ["x_grad"]),
    ]
    x = np.array([[0.5, -1.0, 2.0]])
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob("x_grad"), numeric_grad(forward, "loss", "x"), rtol=1e-5)


def test_in_place_ops_use_the_right_versions(fresh):
    net = core.Net("inplace")
    net.FC(["x", "w", "b"], "h")
    net.Scale("h", "h", scale=2.0)
    net.Tanh("h", "h")
    loss = net.AveragedLoss("h", "loss")
    forward = net.Clone("inplace_forward")
    n = len(net.Proto().op)
    net.AddGradientOperators([loss])
    assert ops_of(net, n)[1:4] == [
        ("AveragedLossGradient", ["h", "loss_autogen_grad"], ["h_grad"]),
        ("TanhGradient", ["h", "h_grad"], ["h_grad"]),
        ("Scale", ["h_grad"], ["h_grad"]),
    ]
    rng = np.random.default_rng(1)
    for k, v in {"x": rng.standard_normal((3, 4)), "w": rng.standard_normal((2, 4)), "b": rng.standard_normal(2)}.items():
        workspace.FeedBlob(k, v)
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob("w_grad"), numeric_grad(forward, "loss", "w"), rtol=1e-5, atol=1e-7)


def test_a_gradient_that_needs_an_overwritten_version_is_refused(fresh):
    # Relu's gradient reads Relu's output, which Tanh then overwrote in
    # place: Caffe2's rule (and ours) is an error naming the versions, not
    # a gradient computed from the wrong values.
    net = core.Net("overwritten")
    net.FC(["x", "w", "b"], "h")
    net.Relu("h", "h")
    net.Tanh("h", "h")
    loss = net.AveragedLoss("h", "loss")
    with pytest.raises(errors.InvalidArgumentError, match='needs output "h" at version 1, but currently we have version 2'):
        net.AddGradientOperators([loss])


def test_stop_gradient_and_skip(fresh):
    net = core.Net("stop")
    net.ConstantFill([], "c", shape=[2], value=3.0)
    s = net.StopGradient("x", "xs")
    a = net.Add([s, "y"], "a")
    loss = net.AveragedLoss(a, "loss")
    grads = net.AddGradientOperators([loss], skip=1)
    names = {str(k) for k in grads}
    assert "y" in names and "xs" in names and "x" not in names
    assert not any(op.type == "ConstantFill" and op.output[0] == "c_grad" for op in net.Proto().op)


def test_given_initial_gradient(fresh):
    net = core.Net("given")
    y = net.Scale("x", "y", scale=3.0)
    # As in Caffe2, a given gradient blob must be known to the net.
    net.AddExternalInput("dy")
    grads = net.AddGradientOperators({y: "dy"})
    assert str(grads[core.BlobReference("x")]) == "x_grad"
    assert ops_of(net, 1) == [("Scale", ["dy"], ["x_grad"])]
    workspace.FeedBlob("x", np.ones(3, np.float32))
    workspace.FeedBlob("dy", np.array([1.0, 2.0, 3.0], np.float32))
    workspace.RunNetOnce(net)
    np.testing.assert_allclose(workspace.FetchBlob("x_grad"), [3.0, 6.0, 9.0])


def test_sum_passes_gradients_through(fresh):
    net = core.Net("sum")
    s = net.Sum(["a", "b"], "s")
    loss = net.AveragedLoss(s, "loss")
    grads = net.AddGradientOperators([loss])
    assert str(grads[core.BlobReference("a")]) == "s_grad" == str(grads[core.BlobReference("b")])


def test_missing_gradient_is_a_typed_error(fresh):
    net = core.Net("nograd")
    c = net.EnsureCPUOutput("x", "c")
    loss = net.AveragedLoss(c, "loss")
    with pytest.raises(errors.InvalidArgumentError, match="no gradient is registered for operator type EnsureCPUOutput"):
        net.AddGradientOperators([loss])


def test_python_registered_gradient(fresh):
    # A Python maker for an op without one (Negative-like via Scale).
    @core.GradientRegistry.RegisterGradient("EnsureCPUOutput")
    def copy_grad(op, g_output):
        return [core.CreateOperator("Copy", [g_output[0]], [op.input[0] + "_grad"])], [op.input[0] + "_grad"]

    try:
        net = core.Net("pygrad")
        c = net.EnsureCPUOutput("x", "c")
        loss = net.AveragedLoss(c, "loss")
        grads = net.AddGradientOperators([loss])
        assert str(grads[core.BlobReference("x")]) == "x_grad"
        workspace.FeedBlob("x", np.ones(4, np.float32))
        workspace.RunNetOnce(net)
        np.testing.assert_allclose(workspace.FetchBlob("x_grad"), np.full(4, 0.25))
    finally:
        del core.GradientRegistry.gradient_registry_["EnsureCPUOutput"]


def test_gradient_checker_catches_a_wrong_gradient(fresh):
    @core.GradientRegistry.RegisterGradient("Tanh")
    def wrong(op, g_output):
        # Sigmoid's formula: wrong for Tanh.
        return [core.CreateOperator("SigmoidGradient", [op.output[0], g_output[0]], ["X_grad"])], ["X_grad"]

    from ferrocaffe import gradients

    try:
        with pytest.raises(AssertionError, match="gradient check failed"):
            GradientChecker(1e-6, 1e-4).CheckSimple(
                core.CreateOperator("Tanh", ["X"], ["Y"]), [np.array([0.3, -0.7])], 0, [0]
            )
    finally:
        core.GradientRegistry._builtin("Tanh")(gradients._output_based("TanhGradient"))
