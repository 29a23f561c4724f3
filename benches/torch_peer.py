"""Finds PyTorch for the benchmarks that use it as a peer.

``pip install ".[bench]"`` puts torch where Python finds it. Where it was
instead installed with ``pip install --no-deps --target DIR`` (one or more
folders: the torch wheel, its pure-Python dependencies, and the CUDA
libraries it loads at import), name the folders in ``BENCH_TORCH_PATH``
(separated by ``os.pathsep``, as PYTHONPATH is) and they are put on
``sys.path`` before ``import torch``; the variable is inherited by the
benchmarks' child processes. No GPU is used.
"""

import os
import sys


def import_torch():
    """Returns the ``torch`` module, or None when it does not import."""
    for folder in reversed(os.environ.get('BENCH_TORCH_PATH', '').split(os.pathsep)):
        if folder and folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        import torch
    except ImportError:
        return None
    return torch
