"""The registry behind ``Net.Python``: functions are registered here under a
token, which the ``Python`` operator carries as an argument; builder tuples
travel pickled and are called once per operator instance."""

from __future__ import annotations

import itertools
import pickle
import threading

_lock = threading.Lock()
_registry: dict[str, tuple[object, bool]] = {}
_ids = itertools.count()


def register(func, pass_workspace: bool = False, name: str | None = None) -> str:
    """Registers ``func(inputs, outputs[, workspace])``; returns its token."""
    with _lock:
        token = name or f"python_op:{next(_ids)}:{getattr(func, '__name__', 'f')}"
        _registry[token] = (func, bool(pass_workspace))
    return token


def build(token: str | None, pickled_builder: bytes | None, pass_workspace: bool):
    """Returns ``(callable, pass_workspace)`` for one operator instance."""
    if token:
        try:
            return _registry[token]
        except KeyError:
            raise KeyError(f"no Python function is registered under token '{token}'") from None
    if pickled_builder is not None:
        builder, args, kwargs = pickle.loads(pickled_builder)
        return builder(*args, **kwargs), bool(pass_workspace)
    raise ValueError("a Python op needs a 'token' or a 'pickled_builder' argument")


def _wrap_workspace(core_ws):
    from .workspace import Workspace

    return Workspace._wrap(core_ws)
