"""The registry behind ``Net.Python``: functions are registered here under a
token, which the ``Python`` operator carries as an argument; builder tuples
travel pickled and are called once per operator instance.

Unpickling runs arbitrary code, so a ``pickled_builder`` is unpickled only
when it is trusted: made by ``Net.Python`` in this process, or named by
``core.TrustPickledBuilders`` (the explicit opt-in for nets and plans read
from files or bytes). Trust is by SHA-256 of the pickled bytes."""

from __future__ import annotations

import hashlib
import importlib
import itertools
import pickle
import threading

from . import _core, errors
from .proto import caffe2_pb2
from .workspace import Workspace

_lock = threading.Lock()
_registry: dict[str, tuple[object, bool]] = {}
_ids = itertools.count()
# SHA-256 digests of the pickled builders that may be unpickled.
_trusted: set[bytes] = set()


def register(func, pass_workspace: bool = False, name: str | None = None) -> str:
    """Registers ``func(inputs, outputs[, workspace])``; returns its token."""
    with _lock:
        token = name or f"python_op:{next(_ids)}:{getattr(func, '__name__', 'f')}"
        _registry[token] = (func, bool(pass_workspace))
    return token


def gradient_token(token: str) -> str:
    """The token of the gradient function registered with ``token``'s (the
    ``PythonGradient`` op carries it)."""
    return token + ":gradient"


def register_gradient(token: str, grad_f, pass_workspace: bool = False) -> str:
    """Registers ``grad_f`` as the gradient of the function under ``token``."""
    return register(grad_f, pass_workspace, name=gradient_token(token))


def digest(pickled_builder: bytes) -> bytes:
    return hashlib.sha256(bytes(pickled_builder)).digest()


def trust(pickled_builder: bytes) -> None:
    """Lets ``pickled_builder`` be unpickled when an op carrying it is built."""
    trust_digests([digest(pickled_builder)])


def trust_digests(digests) -> None:
    with _lock:
        _trusted.update(bytes(d) for d in digests)


def is_trusted(pickled_builder: bytes) -> bool:
    return digest(pickled_builder) in _trusted


def build(token: str | None, pickled_builder: bytes | None, pass_workspace: bool):
    """Returns ``(callable, pass_workspace)`` for one operator instance."""
    if token:
        try:
            return _registry[token]
        except KeyError:
            raise KeyError(f"no Python function is registered under token '{token}'") from None
    if pickled_builder is not None:
        if not is_trusted(pickled_builder):
            raise errors.InvalidArgumentError(
                "refusing to unpickle the Python op's 'pickled_builder': it was not made by "
                "Net.Python in this process, and unpickling runs arbitrary code. If you trust "
                "the net or plan it came from, call "
                "ferrocaffe.core.TrustPickledBuilders(net_or_plan) before running it",
                op="Python",
            )
        builder, args, kwargs = pickle.loads(pickled_builder)
        func = builder(*args, **kwargs)
        if not callable(func):
            raise errors.InvalidArgumentError(
                f"the Python op's builder {builder!r} returned {type(func).__name__}, "
                "which is not callable", op="Python")
        return func, bool(pass_workspace)
    raise ValueError("a Python op needs a 'token' or a 'pickled_builder' argument")


def _wrap_workspace(core_ws):
    return Workspace._wrap(core_ws)


def build_named(spec: str, op_def: bytes):
    """The kernel of one instance of an op type implemented in Python
    (``register_op_type``): ``module.function(op_def)``, with the op's
    ``OperatorDef`` message, returns ``f(inputs, outputs, context)``."""
    module, _, function = spec.partition(":")
    op = caffe2_pb2.OperatorDef()
    op.ParseFromString(bytes(op_def))
    func = getattr(importlib.import_module(module), function)(op)
    if not callable(func):
        raise errors.InvalidArgumentError(
            f"the builder {spec} of op type '{op.type}' returned "
            f"{type(func).__name__}, which is not callable", op=op.type)
    return func


def register_op_type(name: str, builder, inputs=(0, None), outputs=(0, None),
                     inplace: str = "never", args=(), doc: str = "") -> None:
    """Registers op type ``name``, implemented in Python.

    ``builder`` is a module-level function (or its ``"module:function"``
    path): called with each op instance's ``OperatorDef``, it returns the
    kernel ``f(inputs, outputs, context)`` (tensor wrappers as a ``Python``
    op gets, and a ``_core.OpContext``: ``context.workspace``,
    ``context.is_cancelled()``). Every process that runs the op must have
    registered it (a Ray node imports the builder's module by its path).
    ``inputs``/``outputs`` are ``(min, max)`` counts (``None``: no limit);
    ``args`` lists the arguments as ``(name, type, default, doc)``;
    ``inplace`` is ``'never'``, ``'allow'``, ``'same'`` (input i is output
    i) or ``'shift1'`` (input i+1 is output i).
    """
    if callable(builder):
        spec = f"{builder.__module__}:{builder.__qualname__}"
        if "<" in spec or builder.__module__ == "__main__":
            raise errors.InvalidArgumentError(
                f"the builder of op type '{name}' must be a module-level function "
                f"importable by its path, got {builder!r}", op=name)
    else:
        spec = str(builder)
    _core.register_op_type(name, spec, tuple(inputs), tuple(outputs), inplace,
                           [tuple(str(x) for x in a) for a in args], doc)
