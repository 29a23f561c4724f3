"""Consistency of an op or a net across device options (Caffe2's
``device_checker``): the same computation is run once per device option,
in a scratch workspace, and every output is compared with the first
device's.

On this CPU build every device option runs on the CPU, so the check is that
an op gives the same answer however its device option is written (a CPU
option, a GPU option falling back to the CPU, an engine hint). The API and
the printed report are Caffe2's."""

import copy

import numpy as np

from ferrocaffe import workspace
from ferrocaffe.core import InferOpBlobDevicesAsDict

__all__ = ["DeviceChecker"]

_SCRATCH = "_device_check_"


class DeviceChecker:
    """Checks that an op (``CheckSimple``) or a net (``CheckNet``) computes
    the same values under each of ``device_options``, to within
    ``threshold`` (absolute and relative)."""

    def __init__(self, threshold, device_options):
        self._threshold = threshold
        self._device_options = device_options

    def _agree(self, results, names):
        ok = True
        for i in range(1, len(results)):
            for j, name in enumerate(names):
                got, want = results[i][j], results[0][j]
                if not np.allclose(got, want, atol=self._threshold, rtol=self._threshold):
                    print(f"Failure in checking device option {i} and output {name}. "
                          "The outputs are:")
                    print(np.asarray(got).flatten())
                    print(np.asarray(want).flatten())
                    print(np.max(np.abs(np.asarray(got) - np.asarray(want))))
                    ok = False
        return ok

    def CheckSimple(self, op, inputs, outputs_to_check, input_device_options=None):
        """Runs ``op`` on ``inputs`` (numpy arrays, in the order of its
        inputs) under each device option; True when the outputs at indices
        ``outputs_to_check`` agree. ``input_device_options`` maps an input
        name to the device to feed it on (else where the op reads it)."""
        op = copy.deepcopy(op)
        previous = workspace.CurrentWorkspace()
        results = []
        workspace.SwitchWorkspace(_SCRATCH, True)
        try:
            for device_option in self._device_options:
                op.device_option.CopyFrom(device_option)
                feed_on = input_device_options or InferOpBlobDevicesAsDict(op)[0]
                for name, value in zip(op.input, inputs):
                    workspace.FeedBlob(name, np.array(value), feed_on.get(name, device_option))
                workspace.RunOperatorOnce(op)
                results.append([workspace.FetchBlob(op.output[k]) for k in outputs_to_check])
                workspace.ResetWorkspace()
            return self._agree(results, [op.output[k] for k in outputs_to_check])
        finally:
            workspace.SwitchWorkspace(previous)

    def CheckNet(self, net, inputs=None, blobs_to_check=None, ignore=None):
        """Runs ``net`` (a NetDef) on ``inputs`` ({name: array}) under each
        device option; True when ``blobs_to_check`` (every op output by
        default, less ``ignore``) agree."""
        inputs = inputs or {}
        ignore = set(ignore or ())
        if blobs_to_check is None:
            blobs_to_check = [o for op in net.op for o in op.output]
        blobs_to_check = [b for b in blobs_to_check if b not in ignore]
        previous = workspace.CurrentWorkspace()
        results = []
        workspace.SwitchWorkspace(_SCRATCH, True)
        try:
            for device_option in self._device_options:
                for name, value in inputs.items():
                    workspace.FeedBlob(name, value, device_option)
                for op in net.op:
                    op.device_option.CopyFrom(device_option)
                workspace.RunNetOnce(net)
                results.append([workspace.FetchBlob(b) for b in blobs_to_check])
            return self._agree(results, blobs_to_check)
        finally:
            workspace.SwitchWorkspace(previous)
