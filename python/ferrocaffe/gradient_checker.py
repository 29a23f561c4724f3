"""Checks an op's gradient against central differences (Caffe2's
``gradient_checker.GradientChecker``).

The loss is half the sum of squares of the checked outputs, so each output's
gradient is the output itself. The analytic gradient comes from the op's
registered gradient ops; the estimate perturbs each element of the checked
input by ``+-stepsize`` and takes (loss+ - loss-) / (2 stepsize). They agree
when ``numpy.isclose(grad, estimate, atol=threshold, rtol=threshold)`` holds
everywhere. The runs happen in a workspace of their own
(``workspace_name``); the caller's current workspace is restored after.

``NetGradientChecker`` does the same for whole nets (in the current
workspace, as Caffe2's did): ``Check`` compares the backward pass of a net
with central differences of the sum of its chosen outputs, ``CompareNets``
checks that several nets computing one function agree on their outputs and
gradients.
"""

import numpy as np

from ferrocaffe import core, errors, workspace

__all__ = ["GradientChecker", "NetGradientChecker"]


class GradientChecker:
    def __init__(
        self,
        stepsize,
        threshold,
        device_option=None,
        workspace_name="gradient_check",
        input_device_options=None,
    ):
        self._stepsize = stepsize
        self._threshold = threshold
        self._device_option = device_option
        self._workspace_name = workspace_name
        self._input_device_options = input_device_options or {}

    def _loss(self, op, outputs_with_grads):
        workspace.RunOperatorOnce(op)
        loss = 0.0
        for i in outputs_with_grads:
            y = np.asarray(workspace.FetchBlob(op.output[i]), dtype=np.float64)
            loss += 0.5 * float(np.sum(y * y))
        return loss

    def _feed(self, input_names, inputs):
        for name, value in zip(input_names, inputs):
            workspace.FeedBlob(name, value)

    def GetLossAndGrad(self, op, grad_ops, inputs, input_names, input_to_check,
                       grad_name, outputs_with_grads):
        self._feed(input_names, inputs)
        loss = self._loss(op, outputs_with_grads)
        for i in outputs_with_grads:
            y = workspace.FetchBlob(op.output[i])
            workspace.FeedBlob(op.output[i] + "_grad", y)
        workspace.RunOperatorsOnce(grad_ops)
        if isinstance(grad_name, core.GradientSlice):
            # A sparse gradient is compared densely: its values summed into
            # the rows its indices name (as Caffe2's checker did).
            x = inputs[input_to_check]
            idx = np.asarray(workspace.FetchBlob(str(grad_name.indices))).reshape(-1)
            vals = np.asarray(workspace.FetchBlob(str(grad_name.values)), dtype=np.float64)
            dense = np.zeros(x.shape, dtype=np.float64)
            np.add.at(dense, idx, vals.reshape((idx.size,) + tuple(x.shape[1:])))
            return loss, dense
        return loss, np.array(workspace.FetchBlob(grad_name))

    def CheckSimple(
        self,
        op,
        inputs,
        input_to_check,
        outputs_with_grads,
        grad_ops=None,
        input_device_options=None,
        ensure_outputs_are_inferred=False,
    ):
        """Returns (True, gradient, estimate); raises AssertionError (with
        both arrays) when they disagree."""
        if self._device_option is not None:
            op.device_option.CopyFrom(self._device_option)
        if grad_ops is None:
            g_output = [
                op.output[i] + "_grad" if i in outputs_with_grads else None
                for i in range(len(op.output))
            ]
            grad_ops, g_input = core.GradientRegistry.GetGradientForOp(op, g_output)
        else:
            # Given gradient ops follow the naming convention.
            g_input = [name + "_grad" for name in op.input]
        grad_name = g_input[input_to_check]
        if grad_name is None:
            raise errors.InvalidArgumentError(
                f"{op.type} has no gradient for its input {input_to_check} ('{op.input[input_to_check]}')",
                op=op.type,
            )
        if not isinstance(grad_name, core.GradientSlice):
            grad_name = str(grad_name)
        input_names = list(op.input)
        previous = workspace.CurrentWorkspace()
        workspace.SwitchWorkspace(self._workspace_name, True)
        try:
            # C order: the perturbations below write through reshape(-1).
            inputs = [np.array(x, order="C") for x in inputs]
            _loss, grad = self.GetLossAndGrad(
                op, grad_ops, inputs, input_names, input_to_check, grad_name, outputs_with_grads
            )
            x = inputs[input_to_check]
            estimate = np.zeros(x.shape, dtype=np.float64)
            flat = x.reshape(-1)
            # Every input is fed before each run, as Caffe2's checker did: an
            # op that writes one of its inputs in place would otherwise see
            # its own output the next time.
            for k in range(flat.size):
                orig = flat[k]
                flat[k] = orig + self._stepsize
                self._feed(input_names, inputs)
                pos = self._loss(op, outputs_with_grads)
                flat[k] = orig - self._stepsize
                self._feed(input_names, inputs)
                neg = self._loss(op, outputs_with_grads)
                flat[k] = orig
                estimate.reshape(-1)[k] = (pos - neg) / (2 * self._stepsize)
        finally:
            workspace.ResetWorkspace()
            workspace.SwitchWorkspace(previous)
        if grad.shape != estimate.shape:
            raise AssertionError(
                f"{op.type}: the gradient of input {input_to_check} has shape {grad.shape}, "
                f"the input {estimate.shape}"
            )
        fail = ~np.isclose(grad, estimate, atol=self._threshold, rtol=self._threshold)
        if np.any(fail):
            idx = np.flatnonzero(fail)
            raise AssertionError(
                f"{op.type}: gradient check failed for input {input_to_check} at flat indices "
                f"{idx[:10].tolist()}: analytic {grad.reshape(-1)[idx[:10]].tolist()}, "
                f"numerical {estimate.reshape(-1)[idx[:10]].tolist()}"
            )
        return True, grad, estimate


def _dense_gradient(grad, like):
    """The value of a gradient from a backward map: a blob, or a
    GradientSlice made dense with SparseToDense, shaped like ``like``."""
    if isinstance(grad, core.GradientSlice):
        dense = "_net_gradient_checker_dense"
        workspace.RunOperatorOnce(core.CreateOperator(
            "SparseToDense", [grad.indices, grad.values, like], [dense]))
        return workspace.FetchBlob(dense)
    return workspace.FetchBlob(grad)


def _net_gradients(net, outputs, outputs_with_grad, input_values, inputs_to_check):
    """Runs a clone of ``net`` with its backward pass for
    ``outputs_with_grad``: ``([(output, value)], {input: gradient}, the
    net run)``."""
    grad_net = net.Clone(net.Name() + "_copy")
    grad_map = grad_net.AddGradientOperators(outputs_with_grad)
    for name, value in (input_values or {}).items():
        workspace.FeedBlob(name, value)
    for name in inputs_to_check:
        if name not in grad_map:
            raise errors.InvalidArgumentError(
                f"{name} has no gradient, cannot check net gradient.", blob=str(name))
        if not workspace.HasBlob(str(name)):
            raise errors.BlobNotFoundError(f"the checked input '{name}' was not fed", blob=str(name))
    workspace.RunNetOnce(grad_net)
    results = [(o, workspace.FetchBlob(o)) for o in outputs]
    grads = {name: _dense_gradient(grad_map[name], name) for name in inputs_to_check}
    return results, grads, grad_net


def _assert_close(a, b, threshold, err_msg=""):
    np.testing.assert_allclose(a, b, atol=threshold, rtol=threshold, err_msg=err_msg)
    delta = np.abs(np.asarray(a) - np.asarray(b)).flatten()
    return np.mean(delta), max(delta)


class NetGradientChecker:
    """Gradient checks of whole nets (Caffe2's API)."""

    @staticmethod
    def CompareNets(nets, outputs, outputs_with_grad_ids, inputs_with_grads, input_values=None,
                    threshold=0.0000001, print_net_images=False):
        """Asserts that ``nets`` (with their ``outputs``, one list per net)
        give the same outputs and the same gradients of
        ``inputs_with_grads``, the loss being the outputs at
        ``outputs_with_grad_ids``. ``print_net_images`` writes each
        forward and backward net as a PNG (needs Graphviz)."""
        if print_net_images:
            from ferrocaffe import net_drawer

        results = []
        for i, (net, net_outputs) in enumerate(zip(nets, outputs)):
            if print_net_images:
                with open(f"caffe2_net_forward_{i}{net.Name()}.png", "wb") as f:
                    f.write(net_drawer.GetPydotGraph(net).create_png())
            with_grad = [net_outputs[k] for k in outputs_with_grad_ids]
            results.append(_net_gradients(net, net_outputs, with_grad, input_values, inputs_with_grads))
            if print_net_images:
                backward = results[-1][2]
                with open(f"caffe2_net_{i}{backward.Name()}.png", "wb") as f:
                    f.write(net_drawer.GetPydotGraph(backward).create_png())
        first_results, first_grads, _ = results[0]
        for net_results, net_grads, _ in results[1:]:
            assert len(net_results) == len(first_results)
            for k, ((b1, v1), (b2, v2)) in enumerate(zip(first_results, net_results)):
                _assert_close(v1, v2, threshold,
                              err_msg=f"Different forward pass results for output id {k}. "
                                      f"Corresponding output blobs: {b1} and {b2}")
            assert net_grads.keys() == first_grads.keys()
            for blob, value in net_grads.items():
                _assert_close(first_grads[blob], value, threshold,
                              err_msg=f"Different gradients for input {blob}")

    @staticmethod
    def Check(net, outputs_with_grad, input_values, input_to_check, step_size=0.0001,
              threshold=0.05, print_net=True):
        """Compares ``input_to_check``'s gradient from the backward pass of
        ``net`` (the loss: the sum of ``outputs_with_grad``) with central
        differences of step ``step_size``; asserts they agree within
        ``threshold`` and returns (mean, max) of the differences."""
        _, grads, full_net = _net_gradients(net, [], outputs_with_grad, input_values,
                                            [input_to_check])
        analytic = grads[input_to_check]
        base = np.asarray(input_values[input_to_check])

        def loss(value):
            workspace.FeedBlob(input_to_check, value)
            workspace.RunNetOnce(full_net)
            return sum(workspace.FetchBlob(o) for o in outputs_with_grad).sum()

        estimate = np.zeros_like(base)
        for k in range(base.size):
            up, down = base.copy(), base.copy()
            up.flat[k] += step_size
            down.flat[k] -= step_size
            estimate.flat[k] = (loss(up) - loss(down)) / step_size / 2
        workspace.FeedBlob(input_to_check, base)
        err_msg = f"Error in gradient check for net_copy {net.Name()}"
        if print_net:
            err_msg += f": {net.Proto()}"
        return _assert_close(analytic, estimate, threshold, err_msg)
