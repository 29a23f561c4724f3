"""gradient_checker.NetGradientChecker (Caffe2's API, issue 35): a net's
backward pass against central differences, and nets computing one
function compared on their outputs and gradients."""

import numpy as np
import pytest

from ferrocaffe import brew, core, model_helper, workspace
from ferrocaffe.gradient_checker import NetGradientChecker


def test_check_of_a_net_with_two_losses(fresh):
    model = model_helper.ModelHelper(name="two_losses")
    c1, c2 = model.net.AddExternalInputs("const1", "const2")
    fc = brew.fc(model, "X", "Y", dim_in=3, dim_out=4, axis=0)
    losses = [model.net.AveragedLoss(model.net.SquaredL2Distance([fc, c])) for c in (c1, c2)]
    workspace.RunNetOnce(model.param_init_net)
    values = {"X": np.array([1, 2, 3], np.float32), "const1": np.ones(4, np.float32),
              "const2": np.full(4, 2.0, np.float32)}
    mean, worst = NetGradientChecker.Check(model.net, losses, values, "X", print_net=False)
    assert worst < 0.05
    # the checked input is given back its value
    np.testing.assert_array_equal(workspace.FetchBlob("X"), values["X"])


def test_check_fails_on_a_wrong_gradient(fresh):
    # A gradient maker that doubles: the check must see it.
    net = core.Net("wrong")
    net.Scale(["X"], ["Y"], scale=3.0)
    saved = core.GradientRegistry.gradient_registry_["Scale"]

    def doubled(op, g_output):
        return [core.CreateOperator("Scale", [g_output[0]], ["X_grad"], scale=6.0)], ["X_grad"]

    try:
        core.GradientRegistry.RegisterGradient("Scale")(doubled)
        with pytest.raises(AssertionError, match="Error in gradient check"):
            NetGradientChecker.Check(net, ["Y"], {"X": np.ones(3, np.float32)}, "X")
    finally:
        core.GradientRegistry.gradient_registry_["Scale"] = saved
        core.GradientRegistry._builtins.add("Scale")
        core.GradientRegistry._copy_args.add("Scale")


def test_compare_nets_of_one_function(fresh):
    # (a + b) * (c + d) against the four products summed
    net1 = core.Net("expanded1")
    a, b, c, d = net1.AddExternalInputs("a", "b", "c", "d")
    x = net1.Mul([net1.Sum([a, b], "a+b"), net1.Sum([c, d], "c+d")], "x")
    net2 = core.Net("expanded2")
    y = net2.Sum([net2.Mul([p, q]) for p in (a, b) for q in (c, d)], "y")
    values = {str(k): np.array([v], np.float32) for k, v in zip((a, b, c, d), (1.0, 2.0, 3.0, 5.0))}
    NetGradientChecker.CompareNets([net1, net2], [[x], [y]], [0], [a, b, c, d], values)
    net3 = core.Net("not_the_same")
    z = net3.Mul([net3.Sum([a, b]), c], "z")
    with pytest.raises(AssertionError, match="Different forward pass results"):
        NetGradientChecker.CompareNets([net1, net3], [[x], [z]], [0], [a, b, c], values)
