"""Checks an op's gradient against central differences (Caffe2's
``gradient_checker.GradientChecker``).

The loss is half the sum of squares of the checked outputs, so each output's
gradient is the output itself. The analytic gradient comes from the op's
registered gradient ops; the estimate perturbs each element of the checked
input by ``+-stepsize`` and takes (loss+ - loss-) / (2 stepsize). They agree
when ``numpy.isclose(grad, estimate, atol=threshold, rtol=threshold)`` holds
everywhere. The runs happen in a workspace of their own
(``workspace_name``); the caller's current workspace is restored after.
"""

import numpy as np

from ferrocaffe import core, errors, workspace

__all__ = ["GradientChecker"]


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
