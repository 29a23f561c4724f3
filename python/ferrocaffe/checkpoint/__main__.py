"""``python -m ferrocaffe.checkpoint``: see :mod:`ferrocaffe.checkpoint.cli`."""

import sys

from ferrocaffe.checkpoint.cli import run

sys.exit(run())
