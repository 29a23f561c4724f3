"""ferrocaffe: Caffe2's execution layer on a fast, safe Rust core.

Modules mirror ``caffe2.python``: ``core``, ``workspace``, ``context``,
``net_builder``, ``task``, ``session``, ``checkpoint``, ``dataio``,
``pipeline``, ``schema``, ``dataset``, ``queue_util``, plus ``errors`` and
``file_reader`` (Parquet and ``.npy`` readers), and ``onnx`` (ONNX both
ways: ``onnx.frontend``, ``onnx.backend``; needs the ``onnx`` extra).
``with ferrocaffe.profile(path):`` records a timeline of every run
(``profiler``); ``net_drawer`` draws nets and plans.
Call :func:`register_caffe2_alias` to let unmodified
``from caffe2.python import ...`` code run on ferrocaffe.
"""

# Imported under private names: dir(ferrocaffe) shows the package's API only.
import importlib as _importlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import sys as _sys
import types as _types

from . import errors
from ._core import __version__
from .profiler import profile

__all__ = ["__version__", "errors", "profile", "register_caffe2_alias"]

# caffe2 module path -> ferrocaffe module path
_ALIASES = {
    "caffe2.proto.caffe2_pb2": "ferrocaffe.proto.caffe2_pb2",
    "caffe2.python.core": "ferrocaffe.core",
    "caffe2.python.workspace": "ferrocaffe.workspace",
    "caffe2.python.scope": "ferrocaffe.scope",
    "caffe2.python.context": "ferrocaffe.context",
    "caffe2.python.net_builder": "ferrocaffe.net_builder",
    "caffe2.python.control_ops_util": "ferrocaffe.control_ops_util",
    "caffe2.python.control_ops_grad": "ferrocaffe.control_ops_grad",
    "caffe2.python.task": "ferrocaffe.task",
    "caffe2.python.net_printer": "ferrocaffe.net_printer",
    "caffe2.python.net_drawer": "ferrocaffe.net_drawer",
    "caffe2.python.session": "ferrocaffe.session",
    "caffe2.python.checkpoint": "ferrocaffe.checkpoint",
    "caffe2.python.dataio": "ferrocaffe.dataio",
    "caffe2.python.pipeline": "ferrocaffe.pipeline",
    "caffe2.python.schema": "ferrocaffe.schema",
    "caffe2.python.dataset": "ferrocaffe.dataset",
    "caffe2.python.queue_util": "ferrocaffe.queue_util",
    "caffe2.python.utils": "ferrocaffe.utils",
    "caffe2.python.control": "ferrocaffe.control",
    "caffe2.python.record_queue": "ferrocaffe.record_queue",
    "caffe2.python.db_file_reader": "ferrocaffe.db_file_reader",
    "caffe2.python.cached_reader": "ferrocaffe.cached_reader",
    "caffe2.python.text_file_reader": "ferrocaffe.text_file_reader",
    "caffe2.python.model_helper": "ferrocaffe.model_helper",
    "caffe2.python.brew": "ferrocaffe.brew",
    "caffe2.python.optimizer": "ferrocaffe.optimizer",
    "caffe2.python.gradient_checker": "ferrocaffe.gradient_checker",
    "caffe2.python.device_checker": "ferrocaffe.device_checker",
    "caffe2.python.hip_test_util": "ferrocaffe.hip_test_util",
    "caffe2.python.mkl_test_util": "ferrocaffe.mkl_test_util",
    "caffe2.python.cnn": "ferrocaffe.cnn",
    "caffe2.python.data_parallel_model": "ferrocaffe.data_parallel_model",
    "caffe2.python.dyndep": "ferrocaffe.dyndep",
    "caffe2.python.rnn_cell": "ferrocaffe.rnn_cell",
    "caffe2.python.recurrent": "ferrocaffe.recurrent",
    "caffe2.python.gru_cell": "ferrocaffe.gru_cell",
    "caffe2.python.attention": "ferrocaffe.attention",
    # Caffe2's compiled module (workspace.C there): a module holding the
    # attributes of ferrocaffe's workspace.C namespace.
    "caffe2.python._import_c_extension": "ferrocaffe.workspace:C",
    "caffe2.python.optimizer_context": "ferrocaffe.optimizer_context",
    "caffe2.python.modeling": "ferrocaffe.modeling",
    "caffe2.python.modeling.parameter_info": "ferrocaffe.modeling.parameter_info",
    "caffe2.python.modeling.initializers": "ferrocaffe.modeling.initializers",
    "caffe2.python.modeling.parameter_sharing": "ferrocaffe.modeling.parameter_sharing",
    # ONNX both ways (need the onnx extra).
    "caffe2.python.onnx.frontend": "ferrocaffe.onnx.frontend",
    "caffe2.python.onnx.backend": "ferrocaffe.onnx.backend",
    "caffe2.python.onnx.backend_rep": "ferrocaffe.onnx.backend_rep",
    "caffe2.python.onnx.bin.conversion": "ferrocaffe.onnx.conversion",
}
_PACKAGES = ("caffe2", "caffe2.python", "caffe2.proto", "caffe2.python.onnx", "caffe2.python.onnx.bin")


class _AliasLoader(_importlib_abc.Loader):
    def __init__(self, target: str | None):
        self.target = target

    def create_module(self, spec):
        if self.target is None:
            return None  # a plain namespace package
        if ":" in self.target:
            module_name, attr = self.target.split(":")
            module = _types.ModuleType(spec.name)
            module.__dict__.update(vars(getattr(_importlib.import_module(module_name), attr)))
            return module
        return _importlib.import_module(self.target)

    def exec_module(self, module):
        if self.target is None:
            module.__path__ = []


class _AliasFinder(_importlib_abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in _PACKAGES:
            return _importlib_util.spec_from_loader(fullname, _AliasLoader(None), is_package=True)
        if fullname in _ALIASES:
            return _importlib_util.spec_from_loader(fullname, _AliasLoader(_ALIASES[fullname]))
        return None


def register_caffe2_alias() -> None:
    """Makes ``caffe2.python.<module>`` (and ``caffe2.proto.caffe2_pb2``) import
    the matching ferrocaffe module, so unmodified Caffe2 scripts run. Idempotent."""
    if not any(isinstance(f, _AliasFinder) for f in _sys.meta_path):
        _sys.meta_path.insert(0, _AliasFinder())
