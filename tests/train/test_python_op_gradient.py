"""Gradients of Python ops (Caffe2's PythonGradient): AddGradientOperators
calls the op's grad_f with [inputs, outputs, output gradients] and gets the
input gradients back, narrowed by grad_output_indices / grad_input_indices."""

import numpy as np

from ferrocaffe import core, workspace


def cube(inputs, outputs):
    outputs[0].reshape(inputs[0].shape)
    outputs[0].data[...] = inputs[0].data ** 3


def cube_grad(inputs, outputs):
    x, _y, dy = inputs
    outputs[0].reshape(x.shape)
    outputs[0].data[...] = 3 * x.data ** 2 * dy.data


def make_cube():
    return cube


def make_cube_grad():
    return cube_grad


def loss_gradient_of_cube(net, x):
    net.AveragedLoss(["y"], ["loss"])
    grads = net.AddGradientOperators(["loss"])
    workspace.FeedBlob("x", x)
    workspace.RunNetOnce(net)
    return grads, workspace.FetchBlob(str(grads["x"]))


def test_a_registered_gradient_function_gives_the_input_gradient():
    net = core.Net("cube_token")
    net.Python(cube, cube_grad)(["x"], ["y"])
    x = np.array([1.0, 2.0, -1.5, 0.5], np.float32)
    grads, gx = loss_gradient_of_cube(net, x)
    # d/dx mean(x^3) = 3 x^2 / n, by hand.
    np.testing.assert_allclose(gx, 3 * x.astype(np.float64) ** 2 / 4, rtol=1e-6)
    g = net.Proto().op[-1]
    assert g.type == "PythonGradient"
    assert list(g.input) == ["x", "y", "y_grad"] and list(g.output) == ["x_grad"]
    assert str(grads["x"]) == "x_grad"


def test_builder_tuples_make_the_gradient_function_too():
    net = core.Net("cube_builder")
    net.Python((make_cube, [], {}), (make_cube_grad, [], {}))(["x"], ["y"])
    x = np.array([0.5, -2.0], np.float32)
    _grads, gx = loss_gradient_of_cube(net, x)
    np.testing.assert_allclose(gx, 3 * x.astype(np.float64) ** 2 / 2, rtol=1e-6)


def test_only_the_chosen_gradients_are_passed_and_made():
    seen = {}

    def scale_by(inputs, outputs):
        a, b = inputs
        outputs[0].reshape(a.shape)
        outputs[0].data[...] = a.data * b.data

    def scale_grad(inputs, outputs):
        seen["inputs"] = len(inputs)
        seen["outputs"] = len(outputs)
        a, _b, _y, dy = inputs
        outputs[0].reshape(a.shape)
        outputs[0].data[...] = a.data * dy.data  # d(a*b)/db = a

    net = core.Net("scale_only_b")
    net.Python(scale_by, scale_grad, grad_input_indices=[1])(["a", "b"], ["y"])
    net.AveragedLoss(["y"], ["loss"])
    grads = net.AddGradientOperators(["loss"])
    assert "a" not in grads or grads["a"] is None
    a = np.array([2.0, 4.0], np.float32)
    workspace.FeedBlob("a", a)
    workspace.FeedBlob("b", np.array([1.0, 1.0], np.float32))
    workspace.RunNetOnce(net)
    g = net.Proto().op[-1]
    assert list(g.input) == ["a", "b", "y", "y_grad"] and list(g.output) == ["b_grad"]
    assert seen == {"inputs": 4, "outputs": 1}
    np.testing.assert_allclose(workspace.FetchBlob("b_grad"), a / 2)


def test_a_python_func_type_gives_forward_and_backward():
    class Cube:
        def __init__(self, _f):
            pass

        def forward(self, inputs, outputs):
            cube(inputs, outputs)

        def backward(self, inputs, outputs):
            cube_grad(inputs, outputs)

    net = core.Net("cube_type")
    net.Python(None, python_func_type=Cube)(["x"], ["y"])
    x = np.array([3.0], np.float32)
    _grads, gx = loss_gradient_of_cube(net, x)
    np.testing.assert_allclose(gx, [27.0], rtol=1e-6)
