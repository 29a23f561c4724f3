"""Caffe2's name and device scopes (``caffe2.python.scope``).

Both are per thread: a new thread starts with an empty name scope and no
device scope. ``NameScope("a")`` makes new blob names start with ``"a/"``;
``DeviceScope(option)`` gives new operators that device option.
"""

from __future__ import annotations

import contextlib
import threading

from ferrocaffe.proto import caffe2_pb2

__all__ = [
    "CurrentNameScope",
    "CurrentDeviceScope",
    "NameScope",
    "DeviceScope",
    "EmptyNameScope",
    "EmptyDeviceScope",
]

_NAMESCOPE_SEPARATOR = "/"

class _Scopes(threading.local):
    # Class attributes: what a thread that has set no scope reads.
    namescope = ""
    devicescope = None


_threadlocal_scope = _Scopes()


def CurrentNameScope():
    """The current name prefix: ``""`` or a string ending in ``"/"``."""
    return _threadlocal_scope.namescope


def CurrentDeviceScope():
    """The current DeviceOption, or None."""
    return _threadlocal_scope.devicescope


@contextlib.contextmanager
def NameScope(prefix, reset=False):
    """Appends ``prefix + "/"`` to the name scope (or replaces the whole scope
    with it if ``reset``). An empty or None prefix adds nothing."""
    assert isinstance(prefix, str) or prefix is None, (
        "NameScope takes in a string as its argument."
    )
    previous = CurrentNameScope()
    added = prefix + _NAMESCOPE_SEPARATOR if prefix else ""
    _threadlocal_scope.namescope = added if reset else previous + added
    try:
        yield
    finally:
        assert _threadlocal_scope.namescope.endswith(added), (
            "The namescope variable is changed from outside NameScope() calls."
        )
        _threadlocal_scope.namescope = previous


@contextlib.contextmanager
def DeviceScope(scope, node_name=None):
    """Makes a copy of ``scope`` (a DeviceOption) the current device scope.

    ``node_name``, if given, overrides the option's node name; otherwise a
    nested scope inherits the enclosing scope's node name. ``extra_info``
    entries accumulate across nesting and are kept sorted.
    """
    new_scope = caffe2_pb2.DeviceOption()
    if scope:
        assert isinstance(scope, caffe2_pb2.DeviceOption), (
            "DeviceScope takes in a caffe2_pb2.DeviceOption as its argument."
        )
        new_scope.CopyFrom(scope)
    else:
        assert node_name, "At least one argument should be non-null in DeviceScope"

    if node_name:
        new_scope.node_name = node_name
    previous = CurrentDeviceScope()
    if (
        previous is not None
        and previous.HasField("node_name")
        and not new_scope.HasField("node_name")
    ):
        new_scope.node_name = previous.node_name
    if previous is not None:
        new_scope.extra_info.extend(previous.extra_info)
    new_scope.extra_info.sort()

    _threadlocal_scope.devicescope = new_scope
    try:
        yield
    finally:
        assert _threadlocal_scope.devicescope == new_scope, (
            "The device scope is changed from outside DeviceScope() calls."
        )
        _threadlocal_scope.devicescope = previous


@contextlib.contextmanager
def EmptyNameScope():
    """Clears the name scope inside the block."""
    previous = CurrentNameScope()
    _threadlocal_scope.namescope = ""
    try:
        yield
    finally:
        _threadlocal_scope.namescope = previous


@contextlib.contextmanager
def EmptyDeviceScope():
    """Clears the device scope inside the block (so that a net-level device
    option applies to the ops created there)."""
    previous = CurrentDeviceScope()
    _threadlocal_scope.devicescope = None
    try:
        yield
    finally:
        _threadlocal_scope.devicescope = previous
