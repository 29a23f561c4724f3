"""Caffe2's ``dyndep``: loading operator libraries at run time.

ferrocaffe's operators are all built in (the collectives of Caffe2's Gloo
library included, ``ferrocaffe.collective``), so there is nothing to load:
``InitOpsLibrary`` accepts Caffe2's library names and returns, as Caffe2
did for a library it could not find ("Ignored ... as it is not found").
A path to a shared object that exists is refused: ferrocaffe cannot load
Caffe2's compiled operators.
"""

from __future__ import annotations

import logging
import os

from . import errors

__all__ = ['InitOpsLibrary', 'GetImportedOpsLibraries']

log = logging.getLogger(__name__)
_imported: set[str] = set()


def InitOpsLibrary(name: str, trigger_lazy: bool = True) -> None:
    """Accepts a Caffe2 operator library name (``'@/caffe2/caffe2/contrib/
    gloo:gloo_ops'``): its operators are ferrocaffe's own."""
    if not name.startswith('@/') and os.path.exists(name):
        raise errors.InvalidArgumentError(
            "dyndep.InitOpsLibrary('%s'): ferrocaffe cannot load compiled "
            "Caffe2 operator libraries; its operators are built in" % name)
    log.info('dyndep.InitOpsLibrary(%r): nothing to load (built in)', name)
    _imported.add(name)


def GetImportedOpsLibraries() -> set[str]:
    return set(_imported)
