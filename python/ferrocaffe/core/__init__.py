"""Nets, execution steps and plans: Caffe2's ``caffe2.python.core``.

Code written for Caffe2 ports by replacing ``from caffe2.python import core``
with ``from ferrocaffe import core``. The names, signatures, defaults,
automatic blob naming and assertion messages follow Caffe2; the few places
where ferrocaffe deliberately differs are marked "Caffe2 bug fixed" in the
modules below.

``core`` is a package of one module per job, each importing only those
before it; every name is also here, as in Caffe2's one ``core`` module:

- ``registry``: operator types known to the runtime, engine preferences,
  devices, ``DataType``;
- ``blobs``: ``BlobReference``, scoped names;
- ``operators``: ``CreateOperator`` and its arguments, Python ops, trusted
  pickled builders;
- ``net``: ``Net`` (op methods, cloning, ``AddGradientOperators``), the
  gradient glue over gradients.py (``GradientRegistry``, ``IR``);
- ``steps``: ``ExecutionStep``, ``Plan``, ``execution_step``.

Out of scope: ``ClonePartial``, device-copy injection.
"""

from __future__ import annotations

from typing import Any

from ferrocaffe import scope, utils, workspace  # noqa: F401 (Caffe2's core exposes both)
from ferrocaffe.core import blobs, net, operators, registry, steps
from ferrocaffe.core.blobs import *  # noqa: F401,F403
from ferrocaffe.core.net import *  # noqa: F401,F403
from ferrocaffe.core.operators import *  # noqa: F401,F403
from ferrocaffe.core.registry import *  # noqa: F401,F403
from ferrocaffe.core.steps import *  # noqa: F401,F403
from ferrocaffe.workspace import C, GetGlobalInitArgs, GlobalInit  # noqa: F401 (as in Caffe2)

__all__ = [
    "DataType",
    "BlobReference",
    "ScopedName",
    "ScopedBlobReference",
    "NameScope",
    "DeviceScope",
    "DeviceOption",
    "CreateOperator",
    "CreatePythonOperator",
    "IsOperator",
    "IsOperatorWithEngine",
    "InferOpBlobDevices",
    "InferOpBlobDevicesAsDict",
    "InferOpDeviceAsBlobDevices",
    "InjectCrossDeviceCopies",
    "GlobalInit",
    "GetGlobalInitArgs",
    "SetPerOpEnginePref",
    "SetGlobalEnginePref",
    "SetEnginePref",
    "SetOpEnginePref",
    "RegisteredOperators",
    "RefreshRegisteredOperators",
    "Net",
    "ExecutionStep",
    "Plan",
    "execution_step",
    "scoped_execution_step",
    "to_execution_step",
    "add_nets_in_order",
    "get_net_name",
    "output_to_list",
    "allow_unknown_arguments",
    "ALLOW_UNKNOWN_ARGUMENTS",
    "TrustPickledBuilders",
    "GradientRegistry",
    "IR",
]

# Convenience redirections, as in Caffe2.
DeviceScope = scope.DeviceScope
NameScope = scope.NameScope

_PARTS = (registry, blobs, operators, net, steps)


def __getattr__(name: str) -> Any:
    """The private names of the parts, read live: Caffe2 programs read
    ``core._REGISTERED_OPERATORS`` (re-read when the registry changes)."""
    for part in _PARTS:
        if name in part.__dict__:
            return part.__dict__[name]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


# Read at import, as Caffe2 did (registry.py).
RefreshRegisteredOperators()  # noqa: F405
