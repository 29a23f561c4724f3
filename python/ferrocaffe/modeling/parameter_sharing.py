"""Parameter sharing across name scopes (Caffe2's
``caffe2.python.modeling.parameter_sharing``).

Inside ``with ParameterSharing({"timestep_3": ""}):`` a parameter that
``ModelHelper.create_param`` would name ``timestep_3/fc_w`` is named
``fc_w`` instead, so code run under several name scopes (the steps of an
unrolled RNN, the towers of a model) creates or reuses one parameter. The
mapping is from a scope to the scope its parameters live in, both relative
to the name scope the block starts in; the longest matching prefix of the
current name scope is replaced, and the result is resolved again (so
mappings chain). Blocks nest; inner mappings add to the outer ones. A scope
may not map to one inside itself (AssertionError, as in Caffe2).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

from ferrocaffe import scope

__all__ = ["ParameterSharing", "ParameterSharingContext", "parameter_sharing_context"]

_SEP = scope._NAMESCOPE_SEPARATOR


def _as_scope(name: str) -> str:
    """``"a"`` -> ``"a/"``; ``""`` stays empty."""
    return name if not name or name.endswith(_SEP) else name + _SEP


class ParameterSharingContext(object):
    """The active scope mappings (a stack of ``ParameterSharing`` blocks)."""

    def __init__(self) -> None:
        self._stack: list[dict[str, str]] = []
        self._overrides: dict[str, str] = {}

    def add_scope_overrides(self, shared_scopes: Mapping[str, str]) -> None:
        self._stack.append(dict(self._overrides))
        self._overrides.update({_as_scope(k): _as_scope(v) for k, v in shared_scopes.items()})

    def pop(self) -> None:
        self._overrides = self._stack.pop()

    def _resolve(self, candidate: str) -> str:
        # Walk the scope's prefixes ("a/", "a/b/", ...); the longest one that
        # is mapped decides, and what it maps to is resolved in turn.
        parts = candidate.split(_SEP)
        prefix, best, rest_from = "", None, 0
        for i, part in enumerate(parts[:-1]):
            prefix += part + _SEP
            if prefix in self._overrides:
                best, rest_from = self._overrides[prefix], i + 1
        if best is None:
            return candidate
        rest = _SEP.join(parts[rest_from:])
        if best == prefix:  # a scope mapped to itself
            return best + rest
        return self._resolve(best) + rest

    def get_parameter_name(self, name: str) -> str:
        """The name of parameter ``name`` created in the current name scope."""
        return self._resolve(scope.CurrentNameScope()) + name


parameter_sharing_context = ParameterSharingContext()


@contextlib.contextmanager
def ParameterSharing(shared_scopes: Mapping[str, str]) -> Iterator[None]:
    """Maps name scopes to the scope whose parameters they use, for the block."""
    if not isinstance(shared_scopes, Mapping):
        raise TypeError("ParameterSharing takes a dict from scope to scope, not %s"
                        % type(shared_scopes).__name__)
    # Both sides are relative to the name scope the block starts in.
    current = scope.CurrentNameScope()
    overrides = {}
    for k, v in shared_scopes.items():
        if v.startswith(k):
            raise AssertionError("Illegal override for parameter sharing. {} is prefix of {}"
                                 .format(k, v))
        overrides[current + k] = current + v
    parameter_sharing_context.add_scope_overrides(overrides)
    try:
        yield
    finally:
        parameter_sharing_context.pop()
