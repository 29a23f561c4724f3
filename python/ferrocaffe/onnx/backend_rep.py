"""What ``backend.prepare`` returns (Caffe2's ``caffe2.python.onnx.backend_rep``):
an ONNX model converted to a NetDef pair, held in a private workspace,
run with ``rep.run(inputs)``."""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
from onnx.backend.base import BackendRep, namedtupledict

from .. import errors, workspace
from ..proto import caffe2_pb2
from ._common import NUMPY_OF_ONNX, onnx_type_name

__all__ = ["Caffe2Rep"]

# Conversions kept per Rep when a model is converted at run time for the
# shapes (and shape-like input values) of each call.
_CACHE_SIZE = 8


class _Prepared:
    """One conversion: the nets in their own workspace, the parameters fed."""

    def __init__(self, converted):
        self.init_net: caffe2_pb2.NetDef = converted.init_net
        self.predict_net: caffe2_pb2.NetDef = converted.predict_net
        self.outputs = converted.outputs
        self.ws = workspace.Workspace()
        core = self.ws._core
        for name, value in converted.init_values.items():
            core.feed_blob(name, value)
        if self.init_net.op:
            core.run_net_once(self.init_net.SerializeToString())
        for name in converted.inputs:
            core.create_blob(name)
        core.create_net(self.predict_net.SerializeToString(), True)

    def run(self, feeds: dict[str, np.ndarray]) -> list:
        core = self.ws._core
        for name, value in feeds.items():
            core.feed_blob(name, value)
        if self.predict_net.op:
            if not core.run_net(self.predict_net.name, 1):
                raise errors.PlanFailedError(
                    f"net '{self.predict_net.name}' failed: an operator reported failure",
                    net=self.predict_net.name)
        return [core.fetch_blob(blob) for blob in self.outputs]


class Caffe2Rep(BackendRep):
    """A prepared model. ``run(inputs)`` takes the graph's inputs that no
    initializer gives: a list in their order, a dict by name, or one array;
    it returns the graph's outputs as a named tuple.

    Where the conversion needed a shape the model leaves symbolic, or the
    value of an input (Slice's starts given as an input, say), the model is
    converted at run time for the shapes and those values of each call
    (the last few conversions are kept)."""

    def __init__(self, backend, model, opset: int, converted=None, deferred: str | None = None):
        super().__init__()
        self._backend = backend
        self._model = model
        self._opset = opset
        graph = model.graph
        inits = {t.name for t in graph.initializer}
        self.uninitialized = [vi.name for vi in graph.input if vi.name not in inits]
        self.output_names = [vi.name for vi in graph.output]
        self._declared = {}
        for vi in graph.input:
            if vi.name in inits:
                continue
            tt = vi.type.tensor_type
            dims = None
            if tt.HasField("shape"):
                dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            self._declared[vi.name] = (tt.elem_type, dims)
        self.deferred_reason = deferred
        self._static = _Prepared(converted) if converted is not None else None
        self._cache: collections.OrderedDict = collections.OrderedDict()

    # Caffe2's attributes
    @property
    def init_net(self):
        return self._static.init_net if self._static else None

    @property
    def predict_net(self):
        return self._static.predict_net if self._static else None

    @property
    def workspace(self):
        return self._static.ws if self._static else None

    def _feeds(self, inputs) -> dict[str, np.ndarray]:
        if isinstance(inputs, dict):
            unknown = [k for k in inputs if k not in self._declared]
            if unknown:
                raise errors.InvalidArgumentError(
                    f"{unknown} are not inputs of the model (its inputs: {self.uninitialized})")
            items = list(inputs.items())
        elif isinstance(inputs, (list, tuple)):
            if len(inputs) != len(self.uninitialized):
                raise errors.InvalidArgumentError(
                    f"expected {len(self.uninitialized)} values for the uninitialized graph "
                    f"inputs ({', '.join(self.uninitialized)}), got {len(inputs)}")
            items = list(zip(self.uninitialized, inputs))
        else:
            if len(self.uninitialized) != 1:
                raise errors.InvalidArgumentError(
                    f"one array given; the model takes {len(self.uninitialized)} inputs "
                    f"({', '.join(self.uninitialized)})")
            items = [(self.uninitialized[0], inputs)]
        feeds = {}
        for name, value in items:
            arr = np.asarray(value)
            elem, dims = self._declared[name]
            want = NUMPY_OF_ONNX.get(elem)
            if want is None:
                raise errors.DataTypeError(
                    f"input '{name}' has ONNX type {onnx_type_name(elem)}, which ferrocaffe's "
                    "tensors cannot hold", blob=name)
            if arr.dtype != want and not (want.kind == "O" and arr.dtype.kind in "OUS"):
                raise errors.DataTypeError(
                    f"input '{name}' must be {want} (ONNX {onnx_type_name(elem)}), got {arr.dtype}",
                    blob=name)
            if dims is not None:
                if arr.ndim != len(dims) or any(
                        d is not None and d != s for d, s in zip(dims, arr.shape)):
                    raise errors.ShapeError(
                        f"input '{name}' has shape {list(arr.shape)}; the model declares "
                        f"{['?' if d is None else d for d in dims]}", blob=name)
            feeds[name] = arr
        return feeds

    def _prepared_for(self, feeds) -> _Prepared:
        if self._static is not None:
            return self._static
        shapes = tuple(sorted((n, v.dtype.str, tuple(v.shape)) for n, v in feeds.items()))
        # A conversion for these shapes whose input values (those it read)
        # are this call's too.
        for key, (values, prepared) in self._cache.items():
            if key[0] == shapes and all(feeds[n].tobytes() == b for n, b in values.items()):
                self._cache.move_to_end(key)
                return prepared
        converted = self._backend._convert_for_run(self._model, self._opset, feeds)
        values = {n: feeds[n].tobytes() for n in sorted(converted.values_used)}
        prepared = _Prepared(converted)
        self._cache[(shapes, tuple(values.items()))] = (values, prepared)
        while len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)
        return prepared

    def run(self, inputs: Any, **kwargs) -> Any:
        super().run(inputs, **kwargs)
        feeds = self._feeds(inputs)
        missing = [n for n in self.uninitialized if n not in feeds]
        if missing:
            raise errors.InvalidArgumentError(f"no value given for the input(s) {missing}")
        prepared = self._prepared_for(feeds)
        values = prepared.run(feeds)
        return namedtupledict("Outputs", self.output_names)(*values)
