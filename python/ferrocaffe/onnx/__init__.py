"""ONNX both ways (Caffe2's ``caffe2.python.onnx``).

``frontend``: Caffe2 nets (a predict net and its init net) to an ONNX model;
``backend``: ONNX models run on ferrocaffe's ops (``onnx.backend.base``'s
API: ``prepare``, ``run_model``, ``run_node``, ``supports_device``), through
a NetDef pair; ``backend_rep``: what ``prepare`` returns; ``conversion``:
the ``convert-caffe2-to-onnx`` and ``convert-onnx-to-caffe2`` commands.

Both need the ``onnx`` package (``pip install "ferrocaffe[onnx]"``), which
the base install does not bring. Importing this package alone does not
import ``onnx``. See docs/onnx.md.
"""

__all__ = ["backend", "backend_rep", "frontend", "conversion"]
