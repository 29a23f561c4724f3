"""Blob references and scoped names (Caffe2's ``core.BlobReference``; a part
of :mod:`ferrocaffe.core`)."""

from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING, Any, Callable


from ferrocaffe import scope
from ferrocaffe.core.registry import IsOperator, _not_registered, _registry

if TYPE_CHECKING:  # annotations only: net.py builds on this module
    from ferrocaffe.core.net import Net


# -------------------------------------------------------- blob references --


class BlobReference:
    """A blob name, optionally tied to the net that produces it.

    It compares and hashes like its name. ``ref.Relu([...])`` adds a Relu op
    to the ref's net with the ref as first input.
    """

    # Slots (and a ``meta`` dict made when first read): a net's op methods
    # return one reference per op, so each costs one object, not three, to
    # make and for the garbage collector to visit. ``__dict__`` keeps
    # arbitrary attributes working, as on Caffe2's class.
    __slots__ = ("_name", "_from_net", "_meta", "__dict__", "__weakref__")
    _name: str
    _from_net: Net | None
    _meta: dict[str, Any]

    def __init__(self, name: str | bytes, net: Net | None = None) -> None:
        # No name scope is added here; ScopedBlobReference does that.
        if type(name) is not str:
            name = (name.decode("utf-8") if isinstance(name, bytes)
                    else name if isinstance(name, str) else str(name))
        self._name = name
        self._from_net = net

    @property
    def meta(self) -> dict[str, Any]:
        """Free-form metadata that helpers may attach."""
        try:
            return self._meta
        except AttributeError:
            self._meta = {}
            return self._meta

    @meta.setter
    def meta(self, value: dict[str, Any]) -> None:
        self._meta = value

    def __getstate__(self):
        state = dict(getattr(self, "__dict__", ()))
        state["_name"] = self._name
        state["_from_net"] = self._from_net
        if hasattr(self, "_meta"):
            state["meta"] = self._meta
        return state

    def __setstate__(self, state):
        # (Also the plain __dict__ the class pickled before it had slots.)
        for key, value in state.items():
            setattr(self, key, value)

    def __hash__(self):
        return hash(self._name)

    def __eq__(self, other):
        if isinstance(other, str):
            return self._name == other
        if isinstance(other, bytes):
            return self._name == other.decode("utf-8")
        if isinstance(other, BlobReference):
            return self._name == other._name
        return False

    def __ne__(self, other):
        return not self == other

    def __str__(self):
        return self._name

    def __repr__(self):
        return 'BlobReference("{}")'.format(self._name)

    def __add__(self, other):
        if not isinstance(other, str):
            raise RuntimeError("Cannot add BlobReference to a non-string.")
        return BlobReference(self._name + other, self._from_net)

    def __radd__(self, other):
        if not isinstance(other, str):
            raise RuntimeError("Cannot add a non-string to BlobReference.")
        return BlobReference(other + self._name, self._from_net)

    def Net(self) -> Net | None:
        return self._from_net

    def GetNameScope(self) -> str:
        return self._name[: self._name.rfind(scope._NAMESCOPE_SEPARATOR) + 1]

    def GetUnscopedName(self) -> str:
        return self._name[self._name.rfind(scope._NAMESCOPE_SEPARATOR) + 1 :]

    def _CreateAndAddToNet(self, op_type, inputs=None, *args, **kwargs):
        inputs = [] if inputs is None else inputs
        if isinstance(inputs, (BlobReference, str)):
            inputs = [inputs]
        # a new list: the caller's list is left alone
        inputs = [self] + list(inputs)
        return self._from_net.__getattr__(op_type)(inputs, *args, **kwargs)

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        # Private names are never op types; refusing them also keeps copy and
        # pickle from recursing here before __init__ has run.
        if op_type.startswith("_"):
            raise AttributeError("Attribute {} not found.".format(op_type))
        if self._from_net is None:
            raise AttributeError(
                "You cannot use a blob reference that does not have a net "
                "source to create operators. Create the operator from an "
                "explicit net object."
            )
        if not IsOperator(op_type):
            raise _not_registered(op_type)
        return lambda *args, **kwargs: self._CreateAndAddToNet(op_type, *args, **kwargs)

    def __dir__(self):
        additional = [
            op for op in _registry() if "_ENGINE_" not in op or "_ENGINE_CUDNN" in op
        ]
        return sorted(set(chain(dir(type(self)), self.__dict__.keys(), additional)))


def ScopedName(name: str) -> str:
    """``name`` with the current name scope in front."""
    if isinstance(name, bytes):
        name = name.decode("ascii")
    return scope.CurrentNameScope() + name


def ScopedBlobReference(name: str, *args: Any, **kwargs: Any) -> BlobReference:
    """A BlobReference to ``ScopedName(name)``."""
    return BlobReference(ScopedName(name), *args, **kwargs)


def _RectifyInputOutput(blobs, net=None):
    """Normalises an op's inputs or outputs to a list of BlobReferences.
    Strings get the name scope; BlobReferences are kept as they are."""
    if type(blobs) is str:  # the common case first (every op has outputs)
        return [BlobReference(scope.CurrentNameScope() + blobs, net)]
    if isinstance(blobs, (bytes, str)):
        return [ScopedBlobReference(blobs, net=net)]
    if type(blobs) is BlobReference:
        return [blobs]
    if type(blobs) in (list, tuple):
        rectified = []
        for blob in blobs:
            if isinstance(blob, (bytes, str)):
                rectified.append(ScopedBlobReference(blob, net=net))
            elif type(blob) is BlobReference:
                rectified.append(blob)
            else:
                raise TypeError(
                    "I/O blob #{} of unsupported type: {} of type {}".format(
                        len(rectified), str(blob), type(blob)
                    )
                )
        return rectified
    raise TypeError(
        "Unknown input/output type: %s of type %s." % (str(blobs), type(blobs))
    )


def _get_blob_ref(blob_name_or_ref):
    # Caffe2 bug fixed: upstream tested the builtin `input` here, so a
    # BlobReference given to AddExternalInput came back without its net.
    if isinstance(blob_name_or_ref, BlobReference):
        return blob_name_or_ref
    return BlobReference(blob_name_or_ref)
