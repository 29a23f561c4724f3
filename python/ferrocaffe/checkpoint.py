"""Jobs that checkpoint every epoch and resume after a crash (Caffe2's
``caffe2.python.checkpoint``).

A :class:`Job` is four TaskGroups and some stop conditions:

* ``init_group`` runs once, at the start, and creates the state worth
  keeping: model weights, readers' cursors, counters;
* ``epoch_group`` runs again and again; after each run every stop condition
  is fetched and the job stops when one of them is true;
* ``download_group`` runs once after the last epoch (gather the results);
* ``exit_group`` runs last (write the results).

A :class:`JobRunner` runs the groups in that order.  Given a checkpoint
manager it saves, per node, every blob that existed after the init group:
once before the first epoch (epoch 0) and after every epoch, *before* the
stop test, so the last epoch is saved too.  Resuming from epoch ``e`` loads
that checkpoint instead of running the init group and goes on with epoch
``e + 1``::

    with Job() as job:
        with job.init_group, Task():
            w = ops.Const(np.zeros(4, np.float32))
        ...                                  # tasks of the epoch group
        epoch_limiter(job, 10)

    manager = CheckpointManager('/ckpts', 'local', 'ferro',
                                metadata_handler=FileMetadataHandler(
                                    max_to_keep=3))
    JobRunner(job, manager, resume_from_epoch='latest').train(
        LocalSession())

Storage never loses a checkpoint: every db is written to a temporary file
that is fsynced and renamed into place (see ``rust/storage.rs``), so a db
that exists is complete, and the default ``'ferro'`` format checks every
byte on load (``errors.CorruptCheckpointError``).  Each db also holds the
job state (:func:`read_job_state`: its epoch, and whether the job stopped
after it), written in the same save, so the dbs alone say where a job is:
``resume_from_epoch='latest'`` resumes from the newest epoch that verifies,
skipping damaged ones with a warning, and a job that had stopped runs no
more epochs.  :class:`FileMetadataHandler` adds a manifest of the saved
epochs (a cache, rebuilt from the dbs when lost) and retention.  A save
that fails is logged with its path and reason and recorded in
``JobRunner.failed_saves``; training goes on (unless
``raise_on_save_failure``).

:func:`mmap_db` opens a ferro db memory-mapped: read-only numpy views of
its tensors, nothing copied (a ferrocaffe addition).

From a shell::

    python -m ferrocaffe.checkpoint ls DIR       # epochs, nodes, blobs, sizes
    python -m ferrocaffe.checkpoint verify DIR   # exit status 1 on damage
"""

import argparse
import collections
import errno
import inspect
import json
import logging
import mmap
import operator
import os
import re
import stat
import sys
import threading
import time
import zlib

import numpy as np

from ferrocaffe import _core, context, core, workspace
from ferrocaffe.errors import (
    CorruptCheckpointError,
    DataTypeError,
    FerrocaffeError,
    FerrocaffeIOError,
)
from ferrocaffe.file_reader import open_regular
from ferrocaffe.net_builder import ops
from ferrocaffe.task import (
    Node,
    Task,
    TaskGroup,
    TaskOutput,
    WorkspaceType,
)

__all__ = [
    'LATEST',
    'Job',
    'get_ckpt_filename',
    'db_name',
    'CheckpointManager',
    'MultiNodeCheckpointManager',
    'UploadTaskGroupBuilder',
    'JobRunner',
    'epoch_limiter',
    'MetadataHandler',
    'FileMetadataHandler',
    'find_checkpoints',
    'latest_valid_epoch',
    'read_manifest',
    'read_job_state',
    'JOB_STATE_BLOB',
    'mmap_db',
    'main',
]

logger = logging.getLogger('ferrocaffe.checkpoint')

# ``resume_from_epoch=LATEST``: the newest epoch whose checkpoint verifies.
LATEST = 'latest'

DEFAULT_DB_TYPE = 'ferro'


# =================================================================== Job ==

class Job(context.Managed):
    """
    The TaskGroups of a checkpointed job: ``init_group`` (run once at the
    start, unless the job resumes from a checkpoint), ``epoch_group`` (run
    until a stop condition is true), ``download_group`` (run once after the
    last epoch) and ``exit_group`` (run once at the very end).

    Entering a Job enters its epoch group, so Tasks created inside
    ``with job:`` go there; use ``with job.init_group:`` (and so on) for the
    other groups.  ``Job.current()`` is the active Job::

        def build_reader(path):
            with Job.current().init_group, Task():
                reader = ParquetReader(path, batch_size=64)
                reader.setup_ex(ops, None)
            with Job.current().epoch_group:
                limited = ReaderWithLimit(reader, num_iter=100)
                queue = pipe(limited, num_threads=4)
                Job.current().add_stop_condition(limited.data_finished())
            return queue

        with Job() as job:
            queue = build_reader('/data/train.parquet')
            ...

    Args:
        init_group, epoch_group, download_group, exit_group: TaskGroups
            (default: new ones; the init group is GLOBAL).
        stop_conditions: TaskOutputs fetched after every epoch.
        nodes_to_checkpoint: node names to checkpoint (default: the nodes
            the init group uses).
    """

    def __init__(self,
                 init_group=None, epoch_group=None,
                 download_group=None, exit_group=None,
                 stop_conditions=None, nodes_to_checkpoint=None):
        self.init_group = init_group or TaskGroup(
            workspace_type=WorkspaceType.GLOBAL)
        self.epoch_group = epoch_group or TaskGroup()
        self.download_group = download_group or TaskGroup()
        self.exit_group = exit_group or TaskGroup()
        self.stop_conditions = stop_conditions or []
        self._nodes_to_checkpoint = nodes_to_checkpoint
        # Shown by JobRunner's progress display: the epoch limit set by
        # epoch_limiter, and the outputs given to track_progress.
        self.num_epochs = None
        self.progress_outputs = collections.OrderedDict()

    def nodes_to_checkpoint(self):
        """The nodes whose global workspaces are checkpointed."""
        if self._nodes_to_checkpoint:
            return self._nodes_to_checkpoint
        if isinstance(self.init_group, TaskGroup):
            return self.init_group.used_nodes()
        # Compiled with an empty init group (Caffe2 crashed here).
        return []

    def compile(self, session_class):
        """Compiles the four groups for ``session_class``, in place.  Returns
        the Job itself (Caffe2's newest version returned None, older ones a
        new Job)."""
        self._nodes_to_checkpoint = list(self.nodes_to_checkpoint())
        self.init_group = session_class.compile(self.init_group)
        self.epoch_group = session_class.compile(self.epoch_group)
        self.download_group = session_class.compile(self.download_group)
        self.exit_group = session_class.compile(self.exit_group)
        return self

    def __enter__(self):
        super(Job, self).__enter__()
        self.epoch_group.__enter__()
        return self

    def __exit__(self, *args):
        self.epoch_group.__exit__(*args)
        super(Job, self).__exit__(*args)

    def _epoch_output(self, output):
        if isinstance(output, (core.BlobReference, str)):
            t = Task(outputs=[output], group=self.epoch_group)
            output = t.outputs()[0]
        assert isinstance(output, TaskOutput)
        return output

    def add_stop_condition(self, output):
        """Stops the job after the first epoch at whose end ``output`` (a
        TaskOutput, or a blob, fetched through a new empty Task of the epoch
        group) is true."""
        self.stop_conditions.append(self._epoch_output(output))

    # Caffe2's older name.
    add_stop_signal = add_stop_condition

    def track_progress(self, batches=None, rows=None):
        """Names the blobs (int tensors, cumulative) that count the batches
        and the rows processed, for JobRunner's progress display.  Must be
        called before the job is compiled."""
        for key, value in (('batches', batches), ('rows', rows)):
            if value is not None:
                self.progress_outputs[key] = self._epoch_output(value)


# ========================================================== file names ==

def get_ckpt_filename(node_name, epoch):
    """The file name of ``node_name``'s checkpoint of ``epoch``:
    ``'<node_name>.<epoch>'``."""
    return '%s.%s' % (node_name, epoch)


def db_name(epoch, node_name, db_prefix, path_prefix=None):
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


def read_job_state(path, db_type=None):
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


# ======================================================== node manager ==

def _to_str(name):
    return name.decode('utf-8') if isinstance(name, bytes) else str(name)


class CheckpointManager(object):
    """
    Saves and loads one node's workspace at epoch boundaries, for a
    JobRunner.

    ``init`` records which blobs to checkpoint: every blob of the node's
    global workspace right after the init group ran (or, when resuming, the
    list stored in the checkpoint), less the runtime's own (named under
    ``'!!ferrocaffe/'``).  ``save(epoch)`` and ``load(epoch)`` build the
    Tasks that write and read ``db_name(epoch, node_name, db_prefix)``.
    Each db also holds the job state (see :func:`read_job_state`) in a
    reserved entry, written in the same atomic save as the blobs; a load
    reads it back so that the runner can check that the db is the one of
    that epoch and node.

    Args:
        db_prefix: the directory of the checkpoints.
        node_name: the node checkpointed.
        db_type: ``'ferro'`` (ferrocaffe's checked format, the default) or
            ``'minidb'`` (Caffe2's).
        metadata_handler: an object with ``report``, ``write``,
            ``last_epoch``, ``set_params`` and ``cp_accessible`` (see
            :class:`MetadataHandler`), or None.
    """

    BLOB_NAMES = 'blob_names'

    def __init__(self, db_prefix, node_name, db_type=DEFAULT_DB_TYPE,
                 metadata_handler=None, _names_blob=None):
        self._db_prefix = db_prefix
        self._node_name = node_name
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._net = core.Net('!!checkpoint_mngr')
        self._blob_names = self._net.AddExternalInput(
            _names_blob or self.BLOB_NAMES)
        self._names_output = None
        self._path_prefix = None
        self._path_type = None
        self._current_db_name = None
        self._current_checkpoint_duration = None
        self._state_output = None
        # This node's internal blobs (nodes may share one workspace).
        self._internal = INTERNAL_PREFIX + str(node_name) + '/'

    def init(self, nodes=None, retrieve_from_epoch=None, path_prefix=None,
             path_type=None):
        """
        A Task, run once after the init group, that records the blobs to
        checkpoint: all of the workspace's (from scratch), or the list stored
        in the checkpoint of ``retrieve_from_epoch``.
        """
        assert nodes is None or len(nodes) <= 1, (
            'CheckpointManager only supports single node.')
        with Task(outputs=[self._blob_names]) as task:
            if retrieve_from_epoch is None:
                ops.GetAllBlobNames([], self._blob_names, include_shared=False)
            else:
                full_db_name = db_name(retrieve_from_epoch, self._node_name,
                                       self._db_prefix, path_prefix)
                db_type = path_type or self._db_type
                logger.info('Initializing checkpoints from %s', full_db_name)
                kwargs = {}
                stored = _stored_names_key(
                    full_db_name, db_type, str(self._blob_names))
                if stored != str(self._blob_names):
                    kwargs['source_blob_names'] = [stored]
                ops.Load([], self._blob_names, db=full_db_name,
                         db_type=db_type, absolute_path=True,
                         keep_device=True, **kwargs)
        self._names_output = task.outputs()[0]
        return task

    def blob_list(self):
        """The names of the checkpointed blobs (known once ``init``'s Task
        ran), less the runtime's own."""
        assert self._names_output
        names = (_to_str(n) for n in self._names_output.fetch().tolist())
        return [n for n in names if not n.startswith(INTERNAL_PREFIX)]

    def managers(self):
        """``[(node name, manager)]``: this manager, for its node."""
        return [(self._node_name, self)]

    def _timed_task(self, cp_op_name, body):
        """A Task named ``cp_op_name`` running a TimerBegin, the ops
        ``body(net)`` adds to a net, and a TimerGetAndEnd whose output (ns)
        is kept for ``collect_checkpoint_stats``.  The Task's outputs are
        that duration and the blobs ``body`` returns.

        Its nets and blobs have the same names every time, under
        ``'!!ferrocaffe/<node>/'``: each run replaces the previous run's
        in the workspace.  (Nets built the usual way get fresh names, and
        the workspace would keep one set per save: memory growing with
        every epoch.)"""
        prefix = self._internal + cp_op_name
        nets = []
        for suffix in ('/timer_begin', '', '/timer_end'):
            net = core.Net(prefix + suffix)
            net.Proto().name = prefix + suffix  # as given: not uniquified
            nets.append(net)
        begin, main, end = nets
        timer = begin.TimerBegin([], self._internal + 'timer',
                                 counter_name=self._node_name)
        outputs = body(main) or []
        duration = end.TimerGetAndEnd(timer, prefix + '_ns')
        # Outside a TaskGroup a Task takes a new name from a process-wide
        # set each time; in its own group the name stays the same.
        group = (None if TaskGroup.current(required=False) is not None
                 else TaskGroup(WorkspaceType.GLOBAL))
        task = Task(step=core.execution_step(prefix, nets), name=cp_op_name,
                    outputs=[duration] + outputs, group=group)
        self._current_checkpoint_duration = task.outputs()[0]
        return task

    def collect_checkpoint_stats(self, stats):
        """Adds ``{db name: duration in ns}`` of the last timed Task."""
        if self._current_db_name and self._current_checkpoint_duration:
            stats[self._current_db_name] = (
                self._current_checkpoint_duration.fetch()[0])
        else:
            logger.info('Failed to collect checkpoint stats: %s',
                        self._current_db_name)

    def _load_task(self, cp_op_name, blob_names, db_type, **load_args):
        """A timed Task loading ``blob_names`` and the job state (read by
        ``loaded_job_states``) from ``self._current_db_name``."""
        path = self._current_db_name
        state_blob = self._internal + 'loaded_job_state'

        def body(net):
            for op in _state_load_ops(state_blob, path, db_type):
                net.Proto().op.extend([op])
            net.Load([], blob_names, db=path, db_type=db_type,
                     absolute_path=True, **load_args)
            return [state_blob]

        task = self._timed_task(cp_op_name, body)
        self._state_output = task.outputs()[1]
        return task

    def loaded_job_states(self):
        """``[(node, db path, job state or None)]`` of the last load Task
        run (see ``load``)."""
        assert self._state_output is not None, 'no load Task was built'
        return [(str(self._node_name), self._current_db_name,
                 _decode_job_state(self._state_output.fetch(),
                                   self._current_db_name))]

    def load(self, epoch, path_prefix=None, path_type=None):
        """A Task that loads every checkpointed blob from the checkpoint of
        ``epoch``, and its job state (see ``loaded_job_states``)."""
        self._current_db_name = db_name(
            epoch, self._node_name, self._db_prefix, path_prefix)
        db_type = path_type or self._db_type
        logger.info('Loading checkpoints from %s', self._current_db_name)

        return self._load_task('checkpoint_load', self.blob_list(), db_type,
                               keep_device=True)

    def load_blobs_from_checkpoint(self, blob_names, epoch, path_prefix=None,
                                   path_type=None):
        """A Task that loads only ``blob_names`` (those the checkpoint has)
        from the checkpoint of ``epoch``, and its job state."""
        self._current_db_name = db_name(
            epoch, self._node_name, self._db_prefix, path_prefix)
        db_type = path_type or self._db_type
        logger.info('Load from %s', self._current_db_name)

        return self._load_task('checkpoint_partial_load', blob_names,
                               db_type, allow_incomplete=True)

    def check_db_exists(self, epoch, path_prefix=None, path_type=None):
        """A Task whose output is whether the checkpoint of ``epoch``
        exists."""
        name = db_name(epoch, self._node_name, self._db_prefix, path_prefix)
        logger.info('Check existence of %s', name)
        with Task() as task:
            existence = ops.Const(False)
            ops.DBExists([], [existence], db_name=name,
                         db_type=path_type or self._db_type,
                         absolute_path=True)
            task.add_output(existence)
        return task

    def load_blobs_locally(self, nodes, blob_names, epoch, session,
                           path_prefix=None, path_type=None):
        """Loads ``blob_names`` from the checkpoint of ``epoch`` into the
        session; False (nothing loaded) when that checkpoint does not
        exist."""
        assert nodes is None or len(nodes) <= 1, (
            'CheckpointManager only supports single node.')
        return _load_locally(self, blob_names, epoch, session, path_prefix,
                             path_type)

    def report_checkpoint_stats(self, action_name):
        """Hands the last timed Task's duration to the metadata handler."""
        all_stats = {}
        self.collect_checkpoint_stats(all_stats)
        if self._metadata_handler:
            self._metadata_handler.report(action_name, all_stats)

    def save(self, epoch, job_state=None):
        """A Task that saves every checkpointed blob to the checkpoint of
        ``epoch``, with the job state (``job_state``: fields of
        :func:`read_job_state` to set; a JobRunner gives them) in the same
        atomic write."""
        self._current_db_name = db_name(epoch, self._node_name,
                                        self._db_prefix)
        logger.info('Saving to %s', self._current_db_name)
        state = json.dumps(_new_job_state(
            epoch, self._node_name, **(job_state or {})), sort_keys=True)

        def body(net):
            state_blob = self._internal + 'job_state'
            net.GivenTensorStringFill([], [state_blob], shape=[1],
                                      values=[state])
            names = self.blob_list()
            net.Save([state_blob] + names, [], db=self._current_db_name,
                     db_type=self._db_type, absolute_path=True,
                     blob_name_overrides=[JOB_STATE_BLOB] + names)

        return self._timed_task('checkpoint_save', body)

    def write_checkpoint_metadata(self, epoch):
        if self._metadata_handler is not None:
            self._metadata_handler.write(epoch=epoch)

    def get_resume_from_epoch_id(self, user_epoch=None):
        """The epoch to resume from (None: start from scratch).  A metadata
        handler has the last word; ``'latest'`` without one is the newest
        epoch whose checkpoint verifies."""
        last_epoch = user_epoch
        if self._metadata_handler is not None:
            last_epoch = self._metadata_handler.last_epoch(
                user_epoch=user_epoch)
        if last_epoch == LATEST:
            last_epoch = latest_valid_epoch(
                self._db_prefix, [str(self._node_name)], self._db_type)
        return last_epoch

    def set_params(self, nodes, path_prefix=None, path_type=None):
        if path_prefix:
            self._path_prefix = path_prefix
        if path_type:
            self._path_type = path_type
        if self._metadata_handler:
            self._metadata_handler.set_params(
                db_prefix=self._db_prefix,
                db_type=self._db_type,
                node_names=[str(self._node_name)],
                path_prefix=self._path_prefix,
                path_type=self._path_type)

    def cp_accessible(self, epoch=None):
        """Whether the checkpoints (of ``epoch``, or the directory) can be
        reached; True without a metadata handler."""
        if self._metadata_handler is not None:
            return self._metadata_handler.cp_accessible(epoch)
        return True


def _stored_names_key(path, db_type, wanted):
    """The key under which a checkpoint stores its blob list: ``wanted``,
    or Caffe2's ``'blob_names'`` in a checkpoint a Caffe2 multi-node
    manager wrote.  Only a readable local db is looked into."""
    if wanted == CheckpointManager.BLOB_NAMES:
        return wanted
    try:
        names = [e['name'] for e in _core.list_db(path, db_type)]
    except Exception:
        return wanted  # the Load op reports the problem
    if wanted not in names and CheckpointManager.BLOB_NAMES in names:
        return CheckpointManager.BLOB_NAMES
    return wanted


def _check_loaded_states(manager, epoch):
    """The job states a load Task of ``epoch`` read, ``{node: state or
    None}``; raises CorruptCheckpointError when a db holds another epoch's
    or node's checkpoint (a file copied or renamed over it), or when the
    nodes' dbs come from different runs."""
    states = {}
    for node, path, state in manager.loaded_job_states():
        problem = _state_problem(state, path, epoch, node)
        if problem is not None:
            raise CorruptCheckpointError(problem, file=path)
        states[node] = state
    generations = set(s['generation'] for s in states.values()
                      if s is not None)
    if len(generations) > 1:
        raise CorruptCheckpointError(
            'the checkpoints of epoch %s were written by different runs '
            '(generations %s)' % (epoch, sorted(generations)))
    return states


def _load_locally(manager, blob_names, epoch, session, path_prefix,
                  path_type):
    existence_task = manager.check_db_exists(epoch, path_prefix, path_type)
    session.run(existence_task)
    if not existence_task.outputs()[0].fetch():
        logger.info('DB %s does not exist!', db_name(
            epoch, manager._node_name, manager._db_prefix, path_prefix))
        return False
    session.run(manager.load_blobs_from_checkpoint(
        blob_names, epoch, path_prefix, path_type))
    _check_loaded_states(manager, epoch)
    return True


# ================================================== multi-node manager ==

class MultiNodeCheckpointManager(object):
    """
    Checkpoints several nodes: ``init``, ``load`` and ``save`` return
    TaskGroups with one :class:`CheckpointManager` Task per node.  Each node
    keeps its blob list in its own blob, ``'<node>/blob_names'`` (Caffe2's
    managers all used ``'blob_names'`` and overwrote each other's when the
    nodes shared a workspace).

    Args: as for :class:`CheckpointManager`, less ``node_name``.
    """

    def __init__(self, db_prefix, db_type=DEFAULT_DB_TYPE,
                 metadata_handler=None):
        self._node_managers = None
        self._db_prefix = db_prefix
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._path_prefix = None
        self._path_type = None
        self._node_names = None

    def _create_managers(self, nodes):
        self._node_managers = []
        for node in nodes:
            with Node(node):
                manager = CheckpointManager(
                    db_prefix=self._db_prefix,
                    node_name=str(node),
                    db_type=self._db_type,
                    _names_blob='%s/%s' % (node, CheckpointManager.BLOB_NAMES))
                self._node_managers.append((node, manager))

    def _same_nodes(self, nodes):
        return ([str(n) for n, _ in self._node_managers] ==
                [str(n) for n in nodes])

    def _task_group(self, func):
        assert self._node_managers is not None, 'init must be called first.'
        with TaskGroup(WorkspaceType.GLOBAL) as task_group:
            for node, manager in self._node_managers:
                with Node(node):
                    func(node, manager)
            return task_group

    def init(self, nodes, retrieve_from_epoch=None, path_prefix=None,
             path_type=None):
        """A TaskGroup recording every node's blob list.  A manager that was
        initialized before keeps its lists and returns an empty group (the
        nodes must be the same)."""
        if self._node_managers is not None:
            assert self._same_nodes(nodes), (
                'the manager was initialized for nodes %s, not %s' % (
                    [str(n) for n, _ in self._node_managers],
                    [str(n) for n in nodes]))
            return TaskGroup(WorkspaceType.GLOBAL)
        self._create_managers(nodes)
        return self._task_group(lambda node, manager: manager.init(
            nodes=[node], retrieve_from_epoch=retrieve_from_epoch,
            path_prefix=path_prefix, path_type=path_type))

    def load(self, epoch, path_prefix=None, path_type=None):
        return self._task_group(lambda node, manager: manager.load(
            epoch, path_prefix=path_prefix, path_type=path_type))

    def load_blobs_locally(self, nodes, blob_names, epoch, session,
                           path_prefix=None, path_type=None):
        """Loads ``blob_names`` from every node's checkpoint of ``epoch``
        into the session; False as soon as one of them does not exist."""
        if self._node_managers is not None:
            assert self._same_nodes(nodes), 'the nodes changed'
        else:
            self._create_managers(nodes)
        for _, manager in self._node_managers:
            if not _load_locally(manager, blob_names, epoch, session,
                                 path_prefix, path_type):
                return False
        logger.info('Successfully loaded from checkpoints.')
        return True

    def get_ckpt_db_name(self, node_name, epoch):
        """The checkpoint path of ``node_name`` for ``epoch`` (None for an
        unknown node)."""
        for node, manager in self._node_managers or []:
            if str(node) == node_name:
                return db_name(epoch, manager._node_name, manager._db_prefix)
        return None

    def managers(self):
        """``[(node, CheckpointManager)]``, once ``init`` was called."""
        return list(self._node_managers or [])

    def report_checkpoint_stats(self, action_name):
        """Hands every node's last duration to the metadata handler, so
        that the slowest node shows."""
        all_stats = {}
        for _, manager in self._node_managers or []:
            manager.collect_checkpoint_stats(all_stats)
        logger.debug('checkpoint stats: %s', all_stats)
        if self._metadata_handler:
            self._metadata_handler.report(action_name, all_stats)

    def save(self, epoch, job_state=None):
        """A TaskGroup saving every node's checkpoint of ``epoch``, each
        with the job state (see ``CheckpointManager.save``)."""
        return self._task_group(
            lambda node, manager: manager.save(epoch, job_state))

    def loaded_job_states(self):
        """``[(node, db path, job state or None)]`` of the last load."""
        states = []
        for _, manager in self._node_managers or []:
            states.extend(manager.loaded_job_states())
        return states

    def write_checkpoint_metadata(self, epoch):
        if self._metadata_handler is not None:
            self._metadata_handler.write(epoch=epoch)

    def get_resume_from_epoch_id(self, user_epoch=None):
        last_epoch = user_epoch
        if self._metadata_handler is not None:
            last_epoch = self._metadata_handler.last_epoch(
                user_epoch=user_epoch)
        if last_epoch == LATEST:
            last_epoch = latest_valid_epoch(
                self._db_prefix, self._node_names or [], self._db_type)
        return last_epoch

    def set_params(self, nodes, path_prefix=None, path_type=None):
        self._node_names = [str(node) for node in nodes]
        if path_prefix:
            self._path_prefix = path_prefix
        if path_type:
            self._path_type = path_type
        if self._metadata_handler:
            self._metadata_handler.set_params(
                db_prefix=self._db_prefix,
                db_type=self._db_type,
                node_names=self._node_names,
                path_prefix=self._path_prefix,
                path_type=self._path_type)

    def cp_accessible(self, epoch=None):
        if self._metadata_handler is not None:
            return self._metadata_handler.cp_accessible(epoch)
        return True


class UploadTaskGroupBuilder(object):
    """Builds the TaskGroup that uploads the checkpoints after the last
    epoch.  Subclasses implement ``build``."""

    def build(self, epoch, checkpoint_manager):
        """A TaskGroup uploading the checkpoints of ``epoch``, made by
        ``checkpoint_manager`` (single- or multi-node)."""
        raise NotImplementedError()


# ==================================================== metadata handlers ==

class MetadataHandler(object):
    """
    The protocol of checkpoint metadata handlers (any object with these
    methods will do).  A manager calls ``set_params`` first, then
    ``last_epoch`` to learn where to resume, ``cp_accessible`` before each
    save, ``write`` after each successful save and ``report`` with the
    duration of each save or load.
    """

    def set_params(self, db_prefix, db_type, node_names, path_prefix=None,
                   path_type=None):
        pass

    def last_epoch(self, user_epoch=None):
        """The epoch to resume from, given the user's choice (None, an
        epoch, or ``'latest'``)."""
        return user_epoch

    def cp_accessible(self, epoch=None):
        return True

    def write(self, epoch):
        pass

    def report(self, action_name, stats):
        pass


MANIFEST_NAME = 'manifest.json'
MANIFEST_FORMAT = 'ferrocaffe-checkpoints'
# A manifest larger than this is not one of ours.
_MANIFEST_MAX_BYTES = 64 << 20


def _file_crc32(path):
    crc = 0
    with open_regular(path) as f:
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                return crc
            crc = zlib.crc32(chunk, crc)


def _plain_name(name):
    """Whether ``name`` names a file directly inside a directory (no
    separator, not absolute, not ``.`` or ``..``)."""
    return (isinstance(name, str) and name not in ('', '.', '..') and
            '/' not in name and '\\' not in name and '\0' not in name and
            not os.path.isabs(name))


def _file_kind(mode):
    """What a non-regular file is, for messages."""
    if stat.S_ISFIFO(mode):
        return 'a FIFO'
    if stat.S_ISDIR(mode):
        return 'a directory'
    if stat.S_ISSOCK(mode):
        return 'a socket'
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return 'a device'
    return 'not a file'


def _read_regular_file(path, limit):
    """The bytes of the regular file at ``path``.  Opened without blocking,
    so that a FIFO there does not hang the caller; anything but a regular
    file, or a file over ``limit`` bytes, raises OSError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0))
    with os.fdopen(fd, 'rb') as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, 'not a regular file (%s)' % _file_kind(st.st_mode), path)
        if st.st_size > limit:
            raise OSError(errno.EFBIG, 'larger than %d bytes' % limit, path)
        return f.read(limit + 1)


def _check_manifest(manifest, path):
    """Checks a parsed manifest's structure and field types (ValueError or
    TypeError when one is wrong).  A db record whose ``file`` is not a plain
    name inside the directory is dropped with a warning: the manifest must
    never make ferrocaffe read or delete a file elsewhere."""
    if not isinstance(manifest, dict) or (
            manifest.get('format') != MANIFEST_FORMAT):
        raise ValueError('not a %s manifest' % MANIFEST_FORMAT)
    if not isinstance(manifest.get('epochs'), list):
        raise TypeError("'epochs' is not a list")
    seen = set()
    for entry in manifest['epochs']:
        if not isinstance(entry, dict) or not _is_count(entry.get('epoch')):
            raise TypeError('bad epoch record %.80r' % (entry,))
        epoch = entry['epoch']
        if epoch in seen:
            raise ValueError('epoch %d is listed twice' % epoch)
        seen.add(epoch)
        if entry.get('db_type', 'ferro') not in ('ferro', 'minidb'):
            raise ValueError('epoch %d: bad db_type' % epoch)
        dbs = entry.get('dbs')
        if not isinstance(dbs, dict):
            raise TypeError("epoch %d: 'dbs' is not an object" % epoch)
        for node, info in list(dbs.items()):
            if not isinstance(info, dict):
                raise TypeError('epoch %d: bad record of node %.80r' % (
                    epoch, node))
            if not _plain_name(info.get('file')):
                logger.warning(
                    'checkpoint manifest %s: ignoring the db %.200r of node '
                    '%.80r, epoch %d: not a file name inside the checkpoint '
                    'directory', path, info.get('file'), node, epoch)
                del dbs[node]
                continue
            if 'bytes' in info and not _is_count(info['bytes']):
                raise TypeError('epoch %d: bad size' % epoch)
            crc = info.get('crc32')
            if crc is not None and not (_is_count(crc) and crc < 1 << 32):
                raise TypeError('epoch %d: bad crc32' % epoch)
            if 'state' in info:
                _check_job_state(info['state'])


def read_manifest(directory):
    """The manifest of a checkpoint directory as a dict; None when there is
    none.  A manifest that cannot be used (unreadable, not JSON, not a
    manifest, a field of the wrong type or range) raises
    CorruptCheckpointError; the handlers then fall back to the dbs, which
    hold everything the manifest caches."""
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        raw = _read_regular_file(path, _MANIFEST_MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CorruptCheckpointError(
            'checkpoint manifest %s cannot be read: %s' % (
                path, e.strerror or e), file=path) from None
    try:
        manifest = json.loads(raw.decode('utf-8'))
        _check_manifest(manifest, path)
    except (ValueError, KeyError, TypeError, AttributeError,
            RecursionError, OverflowError) as e:
        raise CorruptCheckpointError(
            'checkpoint manifest %s is damaged: %s' % (path, e),
            file=path) from None
    return manifest


class _Db(object):
    """One node's checkpoint file of one epoch, as found in a directory:
    its path, its manifest record (None if unlisted), and its stored job
    state (``problem`` says why it could not be read)."""

    def __init__(self, path, info):
        self.path = path
        self.info = info
        self.state = None
        self.problem = None

    def read_state(self, db_type):
        try:
            self.state = read_job_state(self.path, db_type)
            self.problem = None
        except FerrocaffeError as e:
            self.state, self.problem = None, str(e)


def _scan(directory, node_names, db_type, manifest=None):
    """``{epoch: {node: _Db}}``: the checkpoint files of ``node_names`` in
    ``directory``, with their job states: taken from the manifest's record
    while the file still has the recorded size (a cache; the epoch chosen
    is checked against the file itself), else read from the file."""
    listed = {}
    for entry in (manifest or {}).get('epochs', []):
        for node, info in entry['dbs'].items():
            listed[info['file']] = info
    found = {}
    wanted = set(node_names)
    for epoch, nodes in find_checkpoints(directory).items():
        for node, path in nodes.items():
            if node not in wanted:
                continue
            db = _Db(path, listed.get(os.path.basename(path)))
            cached = db.info is not None and 'state' in db.info
            if cached:
                try:
                    cached = os.stat(path).st_size == db.info.get('bytes')
                except OSError:
                    cached = False
            if cached:
                db.state = db.info['state']
            else:
                db.read_state(db_type)
            found.setdefault(epoch, {})[node] = db
    return found


def _generation(dbs, unknown=0):
    """The run (generation) an epoch's dbs belong to: 0 for dbs without a
    job state, ``unknown`` when none could be read."""
    generations = [db.state['generation'] for db in dbs.values()
                   if db.state is not None]
    if generations:
        return max(generations)
    if any(db.problem is not None for db in dbs.values()):
        return unknown
    return 0


def _epoch_problem(directory, epoch, dbs, node_names, db_type, verify):
    """None if every node's checkpoint of ``epoch`` is there, sound, and
    holds that epoch's job state (read from the file itself), all of the
    same run; else what is wrong."""
    missing = [n for n in node_names if n not in dbs]
    if missing:
        return 'no checkpoint of node(s) %s' % ', '.join(missing)
    generations = set()
    for node in node_names:
        db = dbs[node]
        problem = _check_db(db.path, db_type, db.info, verify)
        if problem is not None:
            return problem
        try:
            state = read_job_state(db.path, db_type)
        except FerrocaffeError as e:
            return str(e)
        problem = _state_problem(state, db.path, epoch, node)
        if problem is not None:
            return problem
        generations.add(state['generation'] if state else 0)
    if len(generations) > 1:
        return 'the nodes\' checkpoints were written by different runs'
    return None


def _latest(directory, node_names, db_type, manifest=None, verify=True,
            warn=True):
    """The newest epoch, of the newest run, whose checkpoints of every node
    are sound (see ``_epoch_problem``); None if there is none."""
    node_names = [str(n) for n in node_names]
    if not node_names:
        return None
    found = _scan(directory, node_names, db_type, manifest)
    # Unreadable dbs are tried (and reported) in their place in the newest
    # run: by their file names, that is where they belong.
    newest = max([_generation(dbs) for dbs in found.values()] or [0])
    order = sorted(((_generation(dbs, newest), epoch)
                    for epoch, dbs in found.items()), reverse=True)
    for _, epoch in order:
        problem = _epoch_problem(directory, epoch, found[epoch], node_names,
                                 db_type, verify)
        if problem is None:
            return epoch
        if warn:
            logger.warning('checkpoint of epoch %d cannot be used (%s); '
                           'trying an earlier epoch', epoch, problem)
    if order and warn:
        logger.warning('no usable checkpoint in %s: starting from scratch',
                       directory)
    return None


class FileMetadataHandler(MetadataHandler):
    """
    Keeps ``manifest.json`` in the checkpoint directory: the saved epochs,
    each with its dbs (file, size, job state, and a CRC-32 for formats
    without checksums of their own), rewritten atomically after each save.

    The manifest is a cache: each db holds its job state, written with its
    blobs in one atomic save, so a manifest that is missing or damaged is
    rebuilt from the dbs, and a db saved just before a kill that prevented
    the manifest write still counts.

    * ``last_epoch('latest')``: the newest epoch, of the newest run, whose
      dbs (every node's) verify, have the size and CRC the manifest records
      for them, and hold that epoch's job state; a damaged one is skipped
      with a warning.  ``None`` (start from scratch) and an epoch number are
      returned as they are.
    * ``write(epoch)`` records ``epoch`` and forgets the later epochs (left
      by an earlier run that went further) and those of older runs (a run
      from scratch replaces them): their dbs are deleted.
    * ``max_to_keep``: only the newest ``max_to_keep`` epochs are kept; the
      dbs of older ones are deleted once the manifest no longer lists them.
      The epoch just saved is always kept, an epoch counts only when every
      node's db of it is there and readable, and a write that had to
      rebuild the manifest deletes nothing (the next one does).  Only dbs
      the manifest listed, or that hold a job state of one of this job's
      nodes, are ever deleted.
    * ``cp_accessible()`` creates the directory if needed and tells whether
      it can be written; when it cannot, ``access_error`` is the OSError
      saying why (with the path).

    One job per directory: two jobs writing one manifest lose each other's
    entries.
    """

    def __init__(self, max_to_keep=None, verify=True):
        if max_to_keep is not None and int(max_to_keep) < 1:
            raise ValueError('max_to_keep must be None or >= 1, got %r' %
                             (max_to_keep,))
        self.max_to_keep = None if max_to_keep is None else int(max_to_keep)
        self.verify = verify
        self.db_prefix = None
        self.db_type = DEFAULT_DB_TYPE
        self.node_names = []
        self.path_prefix = None
        self.path_type = None
        self.stats = {}
        self.access_error = None

    def set_params(self, db_prefix, db_type, node_names, path_prefix=None,
                   path_type=None):
        self.db_prefix = db_prefix
        self.db_type = db_type
        self.node_names = [str(n) for n in node_names]
        self.path_prefix = path_prefix
        self.path_type = path_type

    def _require_params(self):
        if self.db_prefix is None:
            raise RuntimeError('FileMetadataHandler.set_params was not called')

    def manifest_path(self):
        self._require_params()
        return os.path.join(self.db_prefix, MANIFEST_NAME)

    def _read_manifest(self, what):
        """The manifest, or None (with a warning saying ``what`` happens
        instead) when it is damaged."""
        try:
            return read_manifest(self.db_prefix)
        except CorruptCheckpointError as e:
            logger.warning('%s; %s', e, what)
            return None

    def manifest(self):
        """The current manifest (a new, empty one if there is none, or if
        it is damaged: it is then rebuilt by the next save)."""
        self._require_params()
        manifest = self._read_manifest('starting a new one')
        if manifest is None:
            manifest = {'format': MANIFEST_FORMAT, 'version': 1, 'epochs': []}
        return manifest

    def epochs(self):
        """The epochs the manifest lists, oldest first."""
        return sorted(e['epoch'] for e in self.manifest()['epochs'])

    def cp_accessible(self, epoch=None):
        self._require_params()
        if epoch is not None:
            return all(os.path.isfile(db_name(epoch, n, self.db_prefix))
                       for n in self.node_names)
        self.access_error = None
        try:
            os.makedirs(self.db_prefix, exist_ok=True)
        except OSError as e:
            if e.filename is None:
                e.filename = self.db_prefix
            self.access_error = e
        else:
            if not os.access(self.db_prefix, os.W_OK | os.X_OK):
                self.access_error = OSError(
                    errno.EACCES, 'cannot create files in it',
                    self.db_prefix)
        if self.access_error is not None:
            logger.warning('cannot use the checkpoint directory %s: %s',
                           self.access_error.filename,
                           self.access_error.strerror or self.access_error)
            return False
        return True

    def _record(self, db, new):
        """The manifest record of a db (``new``: just saved, so nothing
        cached about it holds)."""
        info = None if new else db.info
        size = os.stat(db.path).st_size
        if info is not None and info.get('bytes') == size:
            info = dict(info)
        else:
            info = {'file': os.path.basename(db.path), 'bytes': size}
            if self.db_type != 'ferro':
                # minidb has no checksums of its own.
                info['crc32'] = _file_crc32(db.path)
        if db.state is not None:
            info['state'] = db.state
        else:
            info.pop('state', None)
        return info

    def write(self, epoch):
        """Records the (already saved) checkpoints of ``epoch``, reading
        their job states from the dbs, and applies the retention rules (see
        the class)."""
        self._require_params()
        epoch = int(epoch)
        old = self._read_manifest('rebuilding it from the checkpoint files')
        rebuilding = old is None
        found = _scan(self.db_prefix, self.node_names, self.db_type, old)
        saved = found.get(epoch, {})
        generations = set()
        for node in self.node_names:
            db = saved.get(node)
            if db is None:
                path = db_name(epoch, node, self.db_prefix)
                raise FerrocaffeIOError(
                    'the checkpoint %s just saved is not there' % path,
                    file=path)
            db.read_state(self.db_type)  # never the cached one
            problem = db.problem or _state_problem(
                db.state, db.path, epoch, node)
            if problem is not None:
                raise CorruptCheckpointError(problem, file=db.path)
            generations.add(db.state['generation'] if db.state else 0)
        generation = max(generations)

        def counts(ep, dbs):
            return (ep < epoch and _generation(dbs) == generation and
                    all(n in dbs and dbs[n].problem is None
                        for n in self.node_names))

        kept = sorted(ep for ep, dbs in found.items() if counts(ep, dbs))
        kept.append(epoch)
        if self.max_to_keep is not None:
            kept = kept[-self.max_to_keep:]
        written = {e['epoch']: e.get('written_at')
                   for e in (old or {}).get('epochs', [])}
        written[epoch] = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())
        entries = []
        for ep in kept:
            dbs = {n: self._record(found[ep][n], ep == epoch)
                   for n in self.node_names}
            entry = {'epoch': ep, 'db_type': self.db_type, 'dbs': dbs}
            if written.get(ep) is not None:
                entry['written_at'] = written[ep]
            states = [d.get('state') for d in dbs.values()]
            if all(states):
                entry['finished'] = any(s['stopped'] for s in states)
            entries.append(entry)
        manifest = {
            'format': MANIFEST_FORMAT,
            'version': 1,
            'db_type': self.db_type,
            'nodes': self.node_names,
            'max_to_keep': self.max_to_keep,
            'latest': epoch,
            'epochs': entries,
        }
        data = json.dumps(manifest, indent=1, sort_keys=True).encode('utf-8')
        _core.write_file_atomically(self.manifest_path(), data + b'\n')
        if rebuilding:
            # The dbs were just listed from the files: deleting any on that
            # basis could lose a good one; the next write does it.
            return
        listed = set()
        for entry in old['epochs']:
            listed.update(info['file'] for info in entry['dbs'].values())
        kept = set(kept)
        for ep, dbs in found.items():
            if ep in kept:
                continue
            for node, db in dbs.items():
                ours = os.path.basename(db.path) in listed or (
                    db.state is not None and db.state['node'] == node)
                if ours:
                    self._remove(db.path)

    def is_finished(self, epoch):
        """Whether the manifest records that the job stopped after
        ``epoch`` (the job state in the db says so too; this is for dbs
        written before job states existed)."""
        try:
            manifest = (read_manifest(self.db_prefix) if self.db_prefix
                        else None)
        except CorruptCheckpointError:
            return False
        for entry in (manifest or {}).get('epochs', []):
            if entry['epoch'] == int(epoch):
                return entry.get('finished') is True
        return False

    @staticmethod
    def _remove(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.warning('cannot remove old checkpoint %s: %s', path,
                           e.strerror or e)

    def last_epoch(self, user_epoch=None):
        if user_epoch != LATEST:
            return user_epoch
        self._require_params()
        manifest = self._read_manifest('looking at the checkpoint files '
                                       'instead')
        return _latest(self.db_prefix, self.node_names, self.db_type,
                       manifest, self.verify)

    def report(self, action_name, stats):
        self.stats[action_name] = dict(stats)
        logger.debug('%s: %s', action_name, stats)


def _check_db(path, db_type, info=None, verify=True):
    """None if the db at ``path`` is sound, else a description of the
    problem.  ``info`` is its manifest record (size, CRC)."""
    try:
        size = os.stat(path).st_size
    except OSError as e:
        return '%s: %s' % (path, e.strerror or e)
    if info is not None and 'bytes' in info and size != info['bytes']:
        return '%s has %d bytes, the manifest says %d' % (
            path, size, info['bytes'])
    if not verify:
        return None
    try:
        _core.verify_db(path, db_type)
    except FerrocaffeError as e:
        return str(e)
    if info is not None and info.get('crc32') is not None:
        if _file_crc32(path) != info['crc32']:
            return ('%s: CRC-32 differs from the one recorded in the '
                    'manifest' % path)
    return None


_CKPT_FILE = re.compile(r'^(?P<node>[^.].*)\.(?P<epoch>[0-9]+)$')


def find_checkpoints(directory):
    """``{epoch: {node: path}}`` of the regular files in ``directory``
    named like checkpoints (``<node>.<epoch>``), whatever their content."""
    found = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        m = _CKPT_FILE.match(name)
        path = os.path.join(directory, name)
        if m and os.path.isfile(path):
            found.setdefault(int(m.group('epoch')), {})[m.group('node')] = path
    return found


def latest_valid_epoch(directory, node_names, db_type=DEFAULT_DB_TYPE,
                       verify=True):
    """The newest epoch, of the newest run, for which every node in
    ``node_names`` has a checkpoint in ``directory`` that verifies and holds
    that epoch's job state; None if there is none.  Damaged checkpoints are
    skipped with a warning."""
    return _latest(directory, node_names, db_type, None, verify)


# ============================================================= progress ==

def _progress_wanted(stream):
    """Progress is drawn only for a person: on a terminal, outside CI."""
    if os.environ.get('CI') or os.environ.get('TERM') == 'dumb':
        return False
    try:
        return bool(stream.isatty())
    except Exception:
        return False


def _make_progress(setting, job):
    """The progress display of a run: ``setting`` is None (automatic), a
    bool, or a text stream to draw on."""
    if setting is False:
        return _NoProgress()
    stream = sys.stderr if setting in (None, True) else setting
    if setting is None and not _progress_wanted(stream):
        return _NoProgress()
    try:
        import tqdm
    except ImportError:
        if setting is not None:
            logger.warning('progress display needs the tqdm package')
        return _NoProgress()
    return _Progress(job, stream, tqdm.tqdm)


class _NoProgress(object):
    def start(self, epochs_done):
        pass

    def epoch_started(self, epoch):
        pass

    def epoch_finished(self, epoch):
        pass

    def checkpoint(self, epoch, seconds, ok):
        pass

    def close(self):
        pass


def _duration(seconds):
    if seconds < 1.0:
        return '%d ms' % int(round(seconds * 1000))
    return '%.1f s' % seconds


def _count(value):
    arr = np.asarray(value)
    if arr.size == 0 or arr.dtype == object:
        return None
    return int(arr.reshape(-1)[0])


class _Progress(object):
    """A tqdm bar over epochs; its text shows the batches and rows counted
    by the job's ``track_progress`` blobs (polled while an epoch runs), the
    rows per second and the last checkpoint with its save time."""

    POLL_SECONDS = 0.5
    RATE_WINDOW = 5.0

    def __init__(self, job, stream, tqdm_cls):
        self._job = job
        self._stream = stream
        self._tqdm = tqdm_cls
        self._lock = threading.Lock()
        self._bar = None  # drawn from the first epoch on
        self._epoch = None
        self._counts = {}
        self._samples = collections.deque()
        self._ckpt = None
        self._stop = threading.Event()
        self._thread = None

    def start(self, epochs_done):
        if self._job.num_epochs:
            bar_format = ('{desc} {bar} {n_fmt}/{total_fmt} epochs '
                          '[{elapsed}<{remaining}{postfix}]')
        else:
            bar_format = '{desc} [{elapsed}{postfix}]'
        with self._lock:
            self._bar = self._tqdm(
                total=self._job.num_epochs, initial=epochs_done,
                unit='epoch', file=self._stream, dynamic_ncols=True,
                leave=True, desc='epoch %d' % (epochs_done + 1),
                bar_format=bar_format)
            self._redraw()

    def epoch_started(self, epoch):
        with self._lock:
            self._epoch = epoch
            self._redraw()
        if self._thread is None and self._job.progress_outputs:
            self._thread = threading.Thread(
                target=self._poll, name='ferrocaffe-progress', daemon=True)
            self._thread.start()

    def epoch_finished(self, epoch):
        self._sample()
        with self._lock:
            if self._bar is not None:
                self._bar.update(1)
            self._redraw()

    def checkpoint(self, epoch, seconds, ok):
        with self._lock:
            self._ckpt = (epoch, seconds, ok)
            self._redraw()

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def _poll(self):
        while not self._stop.wait(self.POLL_SECONDS):
            self._sample()
            with self._lock:
                self._redraw()

    def _sample(self):
        counts = {}
        for key, output in list(self._job.progress_outputs.items()):
            try:
                value = _count(output.fetch())
            except Exception:  # not set yet, or not a number
                value = None
            if value is not None:
                counts[key] = value
        now = time.monotonic()
        with self._lock:
            self._counts.update(counts)
            if 'rows' in counts or 'batches' in counts:
                self._samples.append((now, dict(self._counts)))
                while (len(self._samples) > 2 and
                       now - self._samples[0][0] > self.RATE_WINDOW):
                    self._samples.popleft()

    def _rate(self, key):
        if len(self._samples) < 2:
            return None
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        if key not in c0 or key not in c1 or t1 <= t0:
            return None
        return (c1[key] - c0[key]) / (t1 - t0)

    def _redraw(self):
        if self._bar is None:
            return
        if self._epoch is not None:
            self._bar.set_description_str('epoch %d' % self._epoch,
                                          refresh=False)
        parts = []
        if 'batches' in self._counts:
            parts.append('batches %s' % format(self._counts['batches'], ','))
        rate_key = 'rows' if 'rows' in self._counts else 'batches'
        rate = self._rate(rate_key)
        if rate is not None:
            parts.append('%s %s/s' % (format(int(round(rate)), ','),
                                      rate_key))
        if self._ckpt is not None:
            epoch, seconds, ok = self._ckpt
            if ok:
                parts.append('checkpoint of epoch %d saved in %s' % (
                    epoch, _duration(seconds)))
            else:
                parts.append('checkpoint epoch %d FAILED' % epoch)
        self._bar.set_postfix_str(', '.join(parts), refresh=True)


# ============================================================ JobRunner ==

class JobRunner(object):
    """
    Runs a Job: the init group (unless resuming), then epochs until a stop
    condition is true, then the upload, download and exit groups.

    With a checkpoint manager, a checkpoint is saved before the first epoch
    (epoch 0) and after each epoch, before the stop test.  Each node's db
    holds, besides its blobs, the job state: the epoch, and whether the job
    stopped after it (see :func:`read_job_state`).  With
    ``resume_from_epoch`` (an epoch, or ``'latest'``: the newest epoch
    whose checkpoints verify, or a fresh start if there is none) the init
    group is not run: its blobs come from that checkpoint, and training
    goes on with the next epoch, unless the job had stopped there (a stop
    condition was true, or the epoch limit is reached): then no epoch
    runs, only the groups that follow the epochs.  A db holding another
    epoch's or node's checkpoint raises CorruptCheckpointError.

    A save that fails is logged as a warning naming the file or directory
    and the operating system's reason, and recorded in ``failed_saves``;
    training goes on (Caffe2's contract), unless ``raise_on_save_failure``
    is set: then the first failure stops the run with its exception.
    Ctrl-C stops the run (KeyboardInterrupt is raised again); the last
    complete checkpoint stays valid, and ``resume_from_epoch='latest'``
    continues from it.

    After ``train``: ``resumed_from_epoch`` (None for a fresh start),
    ``epoch`` (the last epoch run), ``last_checkpoint_epoch``,
    ``failed_saves`` (``[(epoch, exception)]``, the last ``KEEP`` of them;
    ``failed_save_count`` counts them all), and ``epoch_seconds`` and
    ``save_seconds`` (wall time of each of the last ``KEEP`` epochs and
    saves: a run of any length keeps a bounded amount).

    Args:
        job: the Job.
        checkpoint_manager: a CheckpointManager or
            MultiNodeCheckpointManager, or None.
        resume_from_epoch: None (from scratch), an epoch, or ``'latest'``.
        upload_task_group_builder: an UploadTaskGroupBuilder run after the
            last epoch.
        progress: None (a progress bar on stderr when it is a terminal and
            not in CI; needs tqdm), True, False, or a text stream to draw
            the bar on.
        raise_on_save_failure: raise the first failed save's exception
            instead of going on without that checkpoint.
    """

    # How many epochs' timings and failed saves are kept.
    KEEP = 1000

    def __init__(self, job, checkpoint_manager=None, resume_from_epoch=None,
                 upload_task_group_builder=None, progress=None,
                 raise_on_save_failure=False):
        self.resume_from_epoch = resume_from_epoch
        self.checkpoint_manager = checkpoint_manager
        self.job = job
        self.upload_task_group_builder = upload_task_group_builder
        self.progress = progress
        self.raise_on_save_failure = bool(raise_on_save_failure)
        self._reset()
        self._progress = _NoProgress()

    def _reset(self):
        self.resumed_from_epoch = None
        self.epoch = None
        self.last_checkpoint_epoch = None
        self.epoch_seconds = {}
        self.save_seconds = {}
        self.failed_saves = []
        self.failed_save_count = 0
        self._generation = 0

    def train(self, session):
        """Runs the job in ``session``; returns the last epoch run."""
        cm = self.checkpoint_manager
        job = self.job
        resume = self.resume_from_epoch
        if resume == LATEST and not cm:
            raise ValueError(
                "resume_from_epoch='latest' needs a checkpoint manager")
        self._reset()
        self._progress = _make_progress(self.progress, job)
        try:
            return self._train(session, cm, job, resume)
        except KeyboardInterrupt:
            self._progress.close()
            if cm:
                # Ctrl-C may land between a save's commit and our
                # bookkeeping: the files say what the last complete
                # checkpoint is (sizes and job states only: no data read).
                try:
                    committed = _latest(
                        cm._db_prefix, [str(n) for n, _ in cm.managers()],
                        cm._db_type, verify=False, warn=False)
                except Exception:  # report what we know instead
                    committed = None
                if committed is not None and (
                        self.last_checkpoint_epoch is None
                        or committed > self.last_checkpoint_epoch):
                    self.last_checkpoint_epoch = committed
                logger.warning(
                    'interrupted during epoch %s; the last complete '
                    "checkpoint is epoch %s; resume_from_epoch='latest' goes "
                    'on from there', self.epoch, self.last_checkpoint_epoch)
            raise
        finally:
            self._progress.close()
            self._progress = _NoProgress()

    __call__ = train

    def _train(self, session, cm, job, resume):
        if cm:
            cm.set_params(nodes=job.nodes_to_checkpoint())
            resume = cm.get_resume_from_epoch_id(resume)
            if resume is not None:
                logger.info('Resuming from epoch %s', resume)
        self.resumed_from_epoch = resume

        from_scratch = resume is None
        if from_scratch:
            session.run(job.init_group)

        finished = False
        if cm:
            logger.info('Preparing checkpoints ...')
            session.run(cm.init(job.nodes_to_checkpoint(),
                                retrieve_from_epoch=resume))
            if from_scratch:
                self._generation = _next_generation(cm)
                self.save_checkpoints(0, session)
            else:
                logger.info('Loading checkpoints for epoch %s ...', resume)
                session.run(cm.load(resume))
                cm.report_checkpoint_stats('checkpoint_load')
                states = (_check_loaded_states(cm, resume)
                          if hasattr(cm, 'loaded_job_states') else {})
                self.last_checkpoint_epoch = resume
                logger.info('Checkpoint loaded')
                finished = self._stopped_at(cm, resume, states)
        logger.info('Finished initializing')

        if finished:
            # The job had stopped: no more epochs, only what follows them.
            epoch = resume
        else:
            epoch = self._run_epochs(
                session, cm, job, 1 if from_scratch else resume + 1)
        logger.info('Finished training')
        self._progress.close()

        if self.upload_task_group_builder:
            session.run(self.upload_task_group_builder.build(epoch, cm))
            logger.info('Finished uploading the checkpoints')
        session.run(job.download_group)
        logger.info('Finished downloading the parameters')
        session.run(job.exit_group)
        logger.info('Finished running the exit group')
        return epoch

    def _epoch_limit(self):
        """The last epoch the job's epoch limit allows (None: no limit).
        A limit below 1 still lets one epoch run, as Caffe2's counter did."""
        if self.job.num_epochs is None:
            return None
        return max(int(self.job.num_epochs), 1)

    def _stopped_at(self, cm, epoch, states):
        """Whether the job stopped after ``epoch``, whose checkpoints hold
        ``states`` (``{node: job state or None}``); sets the run's
        generation from them."""
        known = [s for s in states.values() if s is not None]
        if known:
            self._generation = known[0]['generation']
            met = any(s['conditions_met'] for s in known)
        else:
            # Dbs without a job state (Caffe2's, or an older ferrocaffe's):
            # an older manifest may say whether the job stopped there.
            handler = _handler_of(cm)
            met = (isinstance(handler, FileMetadataHandler) and
                   handler.is_finished(epoch))
        if met:
            logger.info('The job stopped after epoch %s', epoch)
            return True
        limit = self._epoch_limit()
        if limit is not None and epoch >= limit:
            if epoch > limit:
                logger.warning(
                    'the checkpoint of epoch %d is past the epoch limit %d: '
                    'no epoch runs', epoch, limit)
            else:
                logger.info('The job reached its epoch limit at epoch %s',
                            epoch)
            return True
        return False

    def _run_epochs(self, session, cm, job, epoch):
        self._progress.start(epoch - 1)
        limit = self._epoch_limit()
        while True:
            self.epoch = epoch
            logger.info('Starting epoch %d', epoch)
            self._progress.epoch_started(epoch)
            start = time.perf_counter()
            session.run(job.epoch_group)
            self._note(self.epoch_seconds, epoch, time.perf_counter() - start)
            logger.info('Finished epoch %d', epoch)
            met = any(o.fetch() for o in job.stop_conditions)
            stop = bool(met) or (limit is not None and epoch >= limit)
            self._progress.epoch_finished(epoch)
            if cm:
                self.save_checkpoints(epoch, session, _state={
                    'stopped': stop, 'conditions_met': bool(met)})
            if stop:
                logger.info('Stopping')
                return epoch
            epoch += 1

    def _note(self, record, epoch, value):
        """Records ``value`` for ``epoch``, keeping the last KEEP."""
        record[epoch] = value
        while len(record) > self.KEEP:
            del record[next(iter(record))]

    def load_blobs_from_checkpoints(self, blob_names, epoch, session):
        """Loads only ``blob_names`` from every node's checkpoint of
        ``epoch`` into the session (e.g. a model for evaluation).  False if
        a checkpoint is missing; CorruptCheckpointError if one holds another
        epoch's checkpoint."""
        if not self.checkpoint_manager:
            raise ValueError('Checkpoint manager is None')
        logger.info('Loading checkpoint for epoch %s ...', epoch)
        result = self.checkpoint_manager.load_blobs_locally(
            self.job.nodes_to_checkpoint(), blob_names, epoch, session)
        self.checkpoint_manager.report_checkpoint_stats(
            'checkpoint_partial_load')
        return result

    def save_checkpoints(self, epoch, session, _state=None):
        """Saves the checkpoints of ``epoch``, with the job state.  A
        failure is logged (with the path and the operating system's
        reason), recorded in ``failed_saves`` and reported by the return
        value (True when saved); it is raised only with
        ``raise_on_save_failure`` (and Ctrl-C always is)."""
        cm = self.checkpoint_manager
        if not cm:
            raise ValueError('Checkpoint manager is None')
        state = {'stopped': False, 'conditions_met': False}
        state.update(_state or {})
        state['num_epochs'] = self._epoch_limit()
        state['generation'] = self._generation
        start = time.perf_counter()
        try:
            if not cm.cp_accessible(epoch=None):
                raise _inaccessible(cm)
            logger.info('Saving checkpoints for epoch %d', epoch)
            if _takes_job_state(cm.save):
                session.run(cm.save(epoch, job_state=state))
            else:  # a manager written for Caffe2's protocol
                session.run(cm.save(epoch))
            cm.write_checkpoint_metadata(epoch)
            self.last_checkpoint_epoch = epoch
            logger.info('Checkpoints saved')
            cm.report_checkpoint_stats('checkpoint_save')
        except Exception as ex:
            logger.warning('Unable to write checkpoint for epoch %d: %s',
                           epoch, ex)
            self.failed_saves.append((epoch, ex))
            del self.failed_saves[:-self.KEEP]
            self.failed_save_count += 1
            self._progress.checkpoint(epoch, None, False)
            if self.raise_on_save_failure:
                raise
            return False
        seconds = time.perf_counter() - start
        self._note(self.save_seconds, epoch, seconds)
        self._progress.checkpoint(epoch, seconds, True)
        return True


def _handler_of(checkpoint_manager):
    return getattr(checkpoint_manager, '_metadata_handler', None)


def _takes_job_state(save):
    try:
        return 'job_state' in inspect.signature(save).parameters
    except (TypeError, ValueError):
        return False


def _inaccessible(cm):
    """The error of a save skipped because ``cp_accessible()`` said no: the
    handler's reason (``access_error``) when it gives one, with the path."""
    reason = getattr(_handler_of(cm), 'access_error', None)
    path = getattr(cm, '_db_prefix', None)
    if isinstance(reason, OSError):
        path = reason.filename or path
        text = reason.strerror or str(reason)
    else:
        text = 'the metadata handler says they cannot (cp_accessible)'
    error = FerrocaffeIOError(
        'checkpoint files cannot be accessed: %s: %s' % (path, text),
        file=path)
    if isinstance(reason, OSError):
        error.errno, error.strerror = reason.errno, reason.strerror
    error.filename = path
    return error


def _next_generation(cm):
    """The generation of a run from scratch: one above any found in the
    job state of its nodes' checkpoints in the directory, so that
    ``'latest'`` prefers this run's epochs to an earlier run's.  Warns
    when there are such checkpoints."""
    directory = getattr(cm, '_db_prefix', None)
    if directory is None or not hasattr(cm, 'managers'):
        return 1
    nodes = [str(n) for n, _ in cm.managers()]
    found = _scan(directory, nodes, cm._db_type)
    if not found:
        return 1
    newest = max(_generation(dbs) for dbs in found.values())
    logger.warning(
        "starting from scratch in %s, which holds checkpoints of an "
        "earlier run (up to epoch %d); this run's take precedence over "
        "them (resume_from_epoch='latest' would have continued it)",
        directory, max(found))
    return newest + 1


def epoch_limiter(job, num_epochs):
    """Stops ``job`` after epoch ``num_epochs``: the JobRunner stops when
    the number of the epoch that ended (epochs count from 1 and keep their
    numbers across resumes) reaches the limit, kept in ``job.num_epochs``
    (the smallest one, if called twice).  The limit is part of the job, not
    of its checkpoints: resumed with a larger limit, a job that stopped at
    its limit goes on to the new one (Caffe2 kept a counter in the
    checkpoint, which made that impossible)."""
    num_epochs = operator.index(num_epochs)
    with job.init_group:
        # Caffe2 created its counter here, which made the current node one
        # of the nodes the job checkpoints: an empty net keeps that.
        Task(step=core.Net('epoch_counter_init'))
    job.num_epochs = (num_epochs if job.num_epochs is None
                      else min(job.num_epochs, num_epochs))


# ====================================================== memory-mapped load ==

# numpy dtypes of the tensors that can be mapped: the ferro format stores
# their elements little-endian (bool: one byte, 0 or 1).
_MAPPED_DTYPES = {
    name: np.dtype(name).newbyteorder('<')
    for name in ('float32', 'float64', 'int32', 'int64', 'uint8', 'int8',
                 'int16', 'uint16')
}
_MAPPED_DTYPES['bool'] = np.dtype(np.bool_)


def _advise_random(memory):
    """Prepares a cold map for reading just the header, trailer and index.

    A page fault in a mapped file normally reads the kernel's read-around
    window (``read_ahead_kb``, 8 MiB on some disks) around the page, so
    checking three small pieces would read MiBs from disk.  MADV_RANDOM
    makes each fault read its page alone, and MADV_WILLNEED starts reading
    the index range (where the trailer says it is; a wrong value only wastes
    the hint).  The caller restores MADV_NORMAL for the user's accesses.
    Returns False where madvise is not available.
    """
    if not hasattr(mmap, 'MADV_RANDOM') or not hasattr(memory, 'madvise'):
        return False
    memory.madvise(mmap.MADV_RANDOM)
    size = len(memory)
    if size >= 48 and hasattr(mmap, 'MADV_WILLNEED'):
        index_at = int.from_bytes(memory[size - 48:size - 40], 'little')
        if index_at < size:
            start = index_at - index_at % mmap.PAGESIZE
            memory.madvise(mmap.MADV_WILLNEED, start, size - start)
    return True


def mmap_db(path, verify=False, skip_objects=False):
    """Opens a ``'ferro'`` db (the default format of Save and of checkpoints)
    memory-mapped: ``{blob name: read-only numpy array}``, in the order the
    blobs are stored.  A ferrocaffe addition (Caffe2 had no such call).

    Numeric and bool tensors are *views of the mapped file*: nothing is
    copied, and a page is read from disk (or the page cache) only when it is
    first touched, so opening takes about as long as reading the index,
    however large the tensors.  The arrays are read-only (``writeable`` is
    False and cannot be set); copy one (``a.copy()``) to modify it.  The file
    stays mapped while any returned array is alive.  Deleting the file or
    replacing it (as every ferrocaffe save does: write a temporary, rename it
    over the old file) leaves the mapping intact; modifying or truncating the
    file *in place* while it is mapped changes the arrays or crashes the
    process on access, as with any memory map.

    Always checked: the header, the trailer and the index, with their CRCs,
    and that every blob's offset and size lie inside the file and fit its
    dtype and shape.  A truncated or damaged file raises
    ``errors.CorruptCheckpointError`` naming the file (and the blob when the
    damage is in one).  The tensor data themselves are *not* read, so a
    flipped bit inside them goes unnoticed unless ``verify=True``, which also
    checks every blob's CRC-32, the padding between blobs and that bool
    tensors hold only 0 and 1; that reads the whole file (and brings it into
    the page cache), so it takes as long as a full load.

    The job state a checkpoint db holds (a reserved entry named under
    ``'!!ferrocaffe/'``) is left out: :func:`read_job_state` reads it.

    Blobs that have no fixed-size element layout cannot be mapped:

    * string tensors are decoded into object arrays of ``bytes`` and byte
      strings into ``bytes``, as ``FetchBlob`` returns them: copies (their
      CRCs are always checked);
    * runtime objects (counters, mutexes, dataset cursors, reader positions)
      raise ``errors.DataTypeError`` naming the blob, unless
      ``skip_objects=True``, which leaves them out of the result.  Restore
      them with a Load op.

    A Caffe2 ``minidb`` raises ``errors.InvalidArgumentError`` (a
    ``ValueError``): only the ferro format lays tensors out so that they can
    be mapped; read a minidb with a Load op, or save it again as ferro.  A
    file that cannot be opened raises ``errors.FerrocaffeIOError`` (an
    ``OSError``).

        params = mmap_db('/ckpts/trainer_0.0010', skip_objects=True)
        w = params['fc_w']          # np.ndarray, read-only, no copy made
    """
    path = os.fspath(path)
    try:
        f = open_regular(path)
    except OSError as e:
        raise FerrocaffeIOError('%s: %s' % (path, e.strerror or e),
                                file=path) from e
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            memory = None  # mmap refuses empty files; _core says "empty"
            data = np.empty(0, np.uint8)
        else:
            memory = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            data = np.frombuffer(memory, np.uint8)
    # Checks the header, trailer and index in the mapped bytes themselves, so
    # the arrays below view exactly what was checked.
    quick = memory is not None and not verify and _advise_random(memory)
    try:
        blobs = _core.map_ferro(data, path, verify)
    finally:
        if quick:
            memory.madvise(mmap.MADV_NORMAL)
    out = {}
    for name, kind, info in blobs:
        if name.startswith(INTERNAL_PREFIX):
            continue  # the job state of a checkpoint: see read_job_state
        if kind == 'mapped':
            dtype, shape, offset = info
            out[name] = np.ndarray(shape, _MAPPED_DTYPES[dtype], memory,
                                   offset)
        elif kind == 'value':
            if isinstance(info, np.ndarray):
                info.flags.writeable = False
            out[name] = info
        elif not skip_objects:
            raise DataTypeError(
                "blob '%s' of %s holds a runtime object (Caffe2 type '%s'), "
                "which cannot be memory-mapped: pass skip_objects=True to "
                "leave objects out, or restore it with a Load op"
                % (name, path, info), blob=name, file=path)
    return out


# ================================================================== CLI ==

def _detect_db_type(path, default=None):
    try:
        with open_regular(path) as f:
            magic = f.read(8)
    except OSError:
        return default or DEFAULT_DB_TYPE
    if magic == b'FERROCKP':
        return 'ferro'
    return default or 'minidb'


def _human(n):
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if n < 1024 or unit == 'GiB':
            return ('%d %s' % (n, unit)) if unit == 'B' else (
                '%.1f %s' % (n, unit))
        n /= 1024.0


def _inventory(directory, db_type=None):
    """``(manifest or None, [(epoch, node, path, db type, manifest record or
    None, listed)])`` of a checkpoint directory, oldest epoch first."""
    manifest = read_manifest(directory)
    rows = []
    listed = set()
    if manifest is not None:
        for entry in sorted(manifest['epochs'], key=lambda e: int(e['epoch'])):
            et = db_type or entry.get('db_type') or manifest.get('db_type')
            for node, info in sorted(entry['dbs'].items()):
                path = os.path.join(directory, info['file'])
                listed.add(os.path.abspath(path))
                rows.append((int(entry['epoch']), node, path,
                             et or _detect_db_type(path), info, True))
    for epoch, nodes in sorted(find_checkpoints(directory).items()):
        for node, path in sorted(nodes.items()):
            if os.path.abspath(path) in listed:
                continue
            rows.append((epoch, node, path, db_type or _detect_db_type(path),
                         None, manifest is None))
    rows.sort(key=lambda r: (r[0], r[1]))
    return manifest, rows


def _cmd_ls(directory, db_type, out):
    manifest, rows = _inventory(directory, db_type)
    if not rows:
        print('no checkpoints in %s' % directory, file=out)
        return 0
    if manifest is not None:
        print('%s: manifest lists epochs %s (latest %s, max_to_keep %s)' % (
            directory,
            ', '.join(str(e) for e in sorted(
                int(x['epoch']) for x in manifest['epochs'])) or 'none',
            manifest.get('latest'), manifest.get('max_to_keep')), file=out)
    else:
        print('%s: no manifest; checkpoint files found by name' % directory,
              file=out)
    current = None
    for epoch, node, path, dtype, info, listed in rows:
        if epoch != current:
            current = epoch
            print('epoch %d%s' % (epoch, '' if listed else
                                  '  (not in the manifest)'), file=out)
        size = os.path.getsize(path) if os.path.exists(path) else None
        try:
            entries = _core.list_db(path, dtype)
        except Exception as e:
            print('  %s  %s  %s  %s  UNREADABLE: %s' % (
                node, os.path.basename(path), dtype,
                'missing' if size is None else _human(size), e), file=out)
            continue
        entries = [e for e in entries if e['name'] != JOB_STATE_BLOB]
        print('  %s  %s  %s  %s  %d blobs' % (
            node, os.path.basename(path), dtype, _human(size), len(entries)),
            file=out)
        print('    %s' % _describe_state(path, dtype), file=out)
        for e in entries:
            kind = e['kind'].lower()
            what = e['dtype'] if e['dtype'] else e['type']
            shape = ('[%s]' % ', '.join(str(d) for d in e['shape'])
                     if kind == 'tensor' else '')
            print('    %-40s %-7s %-10s %-14s %s' % (
                e['name'], kind, what, shape, _human(e['bytes'])), file=out)
    return 0


def _describe_state(path, db_type):
    """One line about the job state stored in a db, for ``ls``."""
    try:
        state = read_job_state(path, db_type)
    except FerrocaffeError as e:
        return 'job state: UNREADABLE: %s' % e
    if state is None:
        return 'job state: none (written by Caffe2 or an older ferrocaffe)'
    text = 'job state: epoch %d, run %d, %s' % (
        state['epoch'], state['generation'],
        'stopped' if state['stopped'] else 'running')
    if state['num_epochs'] is not None:
        text += ', epoch limit %d' % state['num_epochs']
    return text


def _cmd_verify(directory, db_type, out):
    try:
        manifest, rows = _inventory(directory, db_type)
    except CorruptCheckpointError as e:
        print('DAMAGED  %s' % e, file=out)
        return 1
    if not rows:
        print('no checkpoints in %s' % directory, file=out)
        return 2
    damaged = 0
    for epoch, node, path, dtype, info, listed in rows:
        problem = _check_db(path, dtype, info)
        if problem is None:
            try:
                problem = _state_problem(read_job_state(path, dtype), path,
                                         epoch, node)
            except FerrocaffeError as e:
                problem = str(e)
        label = 'epoch %d node %s (%s)' % (epoch, node, os.path.basename(path))
        if problem is None:
            print('ok       %s' % label, file=out)
        else:
            damaged += 1
            print('DAMAGED  %s: %s' % (label, problem), file=out)
    if damaged:
        print('%d of %d checkpoint files are damaged' % (damaged, len(rows)),
              file=out)
        return 1
    print('all %d checkpoint files verify' % len(rows), file=out)
    return 0


def main(argv=None, out=None):
    """``python -m ferrocaffe.checkpoint {ls,verify} DIR``."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(
        prog='python -m ferrocaffe.checkpoint',
        description='Inspect a checkpoint directory.')
    sub = parser.add_subparsers(dest='command', required=True)
    for name, text in (
            ('ls', 'list epochs, nodes, blobs and sizes'),
            ('verify', 'check every checkpoint; exit status 1 on damage')):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument('directory')
        p.add_argument('--db-type', choices=['ferro', 'minidb'], default=None,
                       help='the db format (default: from the manifest or '
                            'the files)')
    args = parser.parse_args(argv)
    if not os.path.isdir(args.directory):
        print('%s is not a directory' % args.directory, file=sys.stderr)
        return 2
    try:
        if args.command == 'ls':
            return _cmd_ls(args.directory, args.db_type, out)
        return _cmd_verify(args.directory, args.db_type, out)
    except CorruptCheckpointError as e:
        print('error: %s' % e, file=sys.stderr)
        return 1


if __name__ == '__main__':
    sys.exit(main())
