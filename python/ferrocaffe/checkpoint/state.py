"""What every part of the checkpoint package shares: db file names, the
``resume_from_epoch`` constant, and the job state each checkpoint db holds
in a reserved entry (:func:`read_job_state`)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import numpy as np

from ferrocaffe import _core, core, workspace
from ferrocaffe.errors import CorruptCheckpointError


logger = logging.getLogger('ferrocaffe.checkpoint')

# ``resume_from_epoch=LATEST``: the newest epoch whose checkpoint verifies.
LATEST = 'latest'

DEFAULT_DB_TYPE = 'ferro'


# ========================================================== file names ==

def get_ckpt_filename(node_name: str, epoch: int | str) -> str:
    """The file name of ``node_name``'s checkpoint of ``epoch``:
    ``'<node_name>.<epoch>'``."""
    return '%s.%s' % (node_name, epoch)


def db_name(
    epoch: int | str,
    node_name: str,
    db_prefix: str,
    path_prefix: str | os.PathLike[str] | None = None,
) -> str:
    """The db path of a checkpoint: ``path_prefix`` followed directly by the
    file name when a path prefix is given (plain concatenation), else the
    file name inside the directory ``db_prefix``."""
    if path_prefix:
        return os.fspath(path_prefix) + get_ckpt_filename(node_name, epoch)
    return os.path.join(db_prefix, get_ckpt_filename(node_name, epoch))


# ============================================================ job state ==

# The runtime's own blobs (job state, checkpoint timers) are named under this
# prefix; they never enter a checkpoint's blob list.
INTERNAL_PREFIX = '!!ferrocaffe/'
# The reserved entry of every checkpoint db holding the job state: a string
# tensor of one JSON text (Caffe2's reader skips it, or loads it as a string
# tensor, harmlessly).
JOB_STATE_BLOB = INTERNAL_PREFIX + 'job_state'
JOB_STATE_FORMAT = 'ferrocaffe-job-state'
JOB_STATE_VERSION = 1


def _is_count(value):
    """A non-negative int (not a bool, not a float)."""
    return type(value) is int and value >= 0


# Field: check.  Unknown extra fields are kept (a newer writer's).
_STATE_FIELDS = {
    'epoch': _is_count,
    'node': lambda v: isinstance(v, str),
    'stopped': lambda v: isinstance(v, bool),
    'conditions_met': lambda v: isinstance(v, bool),
    'num_epochs': lambda v: v is None or _is_count(v),
    'generation': _is_count,
}


def _new_job_state(epoch, node, **fields):
    """The job state saved with ``node``'s checkpoint of ``epoch``:

    * ``stopped``: the job stopped after this epoch;
    * ``conditions_met``: the job's stop conditions were true (the epoch
      limit aside: a run with a larger limit goes on from here unless this
      is true);
    * ``num_epochs``: the epoch limit in force (None: none);
    * ``generation``: which run wrote it: a run from scratch takes a number
      above any found in the directory, a resumed run keeps its checkpoint's,
      so ``'latest'`` prefers the newest run's epochs.
    """
    state = {'format': JOB_STATE_FORMAT, 'version': JOB_STATE_VERSION,
             'epoch': int(epoch), 'node': str(node), 'stopped': False,
             'conditions_met': False, 'num_epochs': None, 'generation': 0}
    state.update(fields)
    return state


def _check_job_state(state):
    """``state`` if it is a well-formed job state; else ValueError."""
    if not isinstance(state, dict) or state.get('format') != JOB_STATE_FORMAT:
        raise ValueError('not a %s record' % JOB_STATE_FORMAT)
    version = state.get('version')
    if type(version) is not int or version < 1:
        raise ValueError('bad version %r' % (version,))
    for field, ok in _STATE_FIELDS.items():
        if field not in state or not ok(state[field]):
            raise ValueError('bad field %r: %r' % (field, state.get(field)))
    return state


def _decode_job_state(value, path):
    """The job state in a fetched state blob (an array of one JSON text);
    None for an empty array (a db without one: Caffe2's, or an older
    ferrocaffe's).  A malformed one raises CorruptCheckpointError."""
    values = np.asarray(value, dtype=object).reshape(-1)
    if values.size == 0:
        return None
    try:
        if values.size != 1:
            raise ValueError('%d values instead of one' % values.size)
        text = values[0]
        if isinstance(text, bytes):
            text = text.decode('utf-8')
        return _check_job_state(json.loads(text))
    except (ValueError, TypeError, RecursionError) as e:
        raise CorruptCheckpointError(
            'the job state stored in %s is damaged: %s' % (path, e),
            file=path, blob=JOB_STATE_BLOB) from None


def read_job_state(
    path: str | os.PathLike[str],
    db_type: str | None = None,
) -> dict[str, Any] | None:
    """The job state stored in the checkpoint db at ``path`` (a dict with
    ``epoch``, ``node``, ``stopped``, ``conditions_met``, ``num_epochs`` and
    ``generation``), or None for a db without one (written by Caffe2 or an
    older ferrocaffe).  Only that entry is read.  A db that cannot be read
    raises ``FerrocaffeIOError`` or ``CorruptCheckpointError``."""
    path = os.fspath(path)
    db_type = db_type or _detect_db_type(path)
    ws = workspace.Workspace()
    for op in _state_load_ops('state', path, db_type):
        ws.run(op)
    return _decode_job_state(ws.fetch_blob('state'), path)


def _state_load_ops(blob, path, db_type):
    """OperatorDefs loading the job state entry of a db into ``blob``,
    which stays an empty string tensor when the db has none."""
    return [
        core.CreateOperator('GivenTensorStringFill', [], [blob], shape=[0],
                            values=[]),
        core.CreateOperator('Load', [], [blob], db=path, db_type=db_type,
                            absolute_path=True, allow_incomplete=True,
                            source_blob_names=[JOB_STATE_BLOB]),
    ]


def _state_problem(state, path, epoch, node):
    """What is wrong with a db's stored job state for ``node``'s checkpoint
    of ``epoch`` (None: nothing, or no state)."""
    if state is None:
        return None
    if state['epoch'] != int(epoch) or state['node'] != str(node):
        return ('%s holds the checkpoint of epoch %d of node %s, not of '
                'epoch %d of node %s' % (path, state['epoch'], state['node'],
                                         int(epoch), node))
    return None


# What is at a path, and how big it is, is the core's to say: the formats
# (ferro's magic, LevelDB's directory layout, minidb's records) are known in
# Rust only (storage::detect_db_type, storage::db_info).

def _db_present(path) -> bool:
    """Whether a db is at ``path`` (a ferro or minidb file, a LevelDB
    directory)."""
    return _core.detect_db_type(path) is not None


def _db_size(path, db_type=None) -> int:
    """The bytes of the db at ``path`` (a LevelDB's: all its files).  A
    missing db, or something else there (a FIFO), raises
    ``FerrocaffeIOError`` (an OSError) saying so."""
    return _core.db_info(path, db_type)['bytes']


def _detect_db_type(path, default=None):
    """The format of the db at ``path``; ``default`` (else the default
    format) where there is none, or where the file could be of any format
    but ferro (a file that is not a ferro db is read as the type the caller
    expected)."""
    found = _core.detect_db_type(path)
    if found is None or (found == 'minidb' and default):
        return default or DEFAULT_DB_TYPE
    return found
