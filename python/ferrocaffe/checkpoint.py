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
byte on load (``errors.CorruptCheckpointError``).  :class:`FileMetadataHandler`
adds a manifest of the completed epochs, rewritten atomically after each
save; ``resume_from_epoch='latest'`` resumes from the newest epoch that
verifies, skipping damaged ones with a warning.  A save that fails is
logged and recorded in ``JobRunner.failed_saves``; training goes on.

:func:`mmap_db` opens a ferro db memory-mapped: read-only numpy views of
its tensors, nothing copied (a ferrocaffe addition).

From a shell::

    python -m ferrocaffe.checkpoint ls DIR       # epochs, nodes, blobs, sizes
    python -m ferrocaffe.checkpoint verify DIR   # exit status 1 on damage
"""

import argparse
import collections
import itertools
import json
import logging
import mmap
import os
import re
import sys
import threading
import time
import zlib

import numpy as np

from ferrocaffe import _core, context, core
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
    final_output,
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


# ======================================================== node manager ==

def _to_str(name):
    return name.decode('utf-8') if isinstance(name, bytes) else str(name)


class CheckpointManager(object):
    """
    Saves and loads one node's workspace at epoch boundaries, for a
    JobRunner.

    ``init`` records which blobs to checkpoint: every blob of the node's
    global workspace right after the init group ran (or, when resuming, the
    list stored in the checkpoint).  ``save(epoch)`` and ``load(epoch)``
    build the Tasks that write and read ``db_name(epoch, node_name,
    db_prefix)``.

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
        ran)."""
        assert self._names_output
        return [_to_str(n) for n in self._names_output.fetch().tolist()]

    def managers(self):
        """``[(node name, manager)]``: this manager, for its node."""
        return [(self._node_name, self)]

    def _timed_task(self, cp_op_name, add_op):
        """A Task named ``cp_op_name`` running ``add_op``'s ops between a
        TimerBegin and a TimerGetAndEnd whose output (ns) is kept for
        ``collect_checkpoint_stats``."""
        with Task(name=cp_op_name) as task:
            with ops.task_init():
                timer = ops.TimerBegin([], counter_name=self._node_name)
            add_op()
            with ops.task_exit():
                time_span_blob = ops.TimerGetAndEnd(timer)
            self._current_checkpoint_duration = final_output(time_span_blob)
        return task

    def collect_checkpoint_stats(self, stats):
        """Adds ``{db name: duration in ns}`` of the last timed Task."""
        if self._current_db_name and self._current_checkpoint_duration:
            stats[self._current_db_name] = (
                self._current_checkpoint_duration.fetch()[0])
        else:
            logger.info('Failed to collect checkpoint stats: %s',
                        self._current_db_name)

    def load(self, epoch, path_prefix=None, path_type=None):
        """A Task that loads every checkpointed blob from the checkpoint of
        ``epoch``."""
        self._current_db_name = db_name(
            epoch, self._node_name, self._db_prefix, path_prefix)
        db_type = path_type or self._db_type
        logger.info('Loading checkpoints from %s', self._current_db_name)

        def add_op():
            ops.Load([], self.blob_list(), db=self._current_db_name,
                     db_type=db_type, absolute_path=True, keep_device=True)

        return self._timed_task('checkpoint_load', add_op)

    def load_blobs_from_checkpoint(self, blob_names, epoch, path_prefix=None,
                                   path_type=None):
        """A Task that loads only ``blob_names`` (those the checkpoint has)
        from the checkpoint of ``epoch``."""
        self._current_db_name = db_name(
            epoch, self._node_name, self._db_prefix, path_prefix)
        db_type = path_type or self._db_type
        logger.info('Load from %s', self._current_db_name)

        def add_op():
            ops.Load([], blob_names, db=self._current_db_name,
                     db_type=db_type, absolute_path=True,
                     allow_incomplete=True)

        return self._timed_task('checkpoint_partial_load', add_op)

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

    def save(self, epoch):
        """A Task that saves every checkpointed blob to the checkpoint of
        ``epoch``."""
        self._current_db_name = db_name(epoch, self._node_name,
                                        self._db_prefix)
        logger.info('Saving to %s', self._current_db_name)

        def add_op():
            ops.Save(self.blob_list(), [], db=self._current_db_name,
                     db_type=self._db_type, absolute_path=True)

        return self._timed_task('checkpoint_save', add_op)

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

    def save(self, epoch):
        return self._task_group(
            lambda node, manager: manager.save(epoch))

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
_temp_seq = itertools.count()


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file_atomically(path, data):
    """Writes ``data`` to ``path`` through a temporary in the same directory
    (named as the Rust storage names them, so stale ones are swept), fsynced
    and renamed over ``path``; the directory is fsynced last."""
    directory = os.path.dirname(path) or '.'
    while True:
        tmp = os.path.join(directory, '.%s.tmp-%d-%d' % (
            os.path.basename(path), os.getpid(), next(_temp_seq)))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            # Left by a killed process that had our pid (pids are reused).
            continue
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _file_crc32(path):
    crc = 0
    with open_regular(path) as f:
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                return crc
            crc = zlib.crc32(chunk, crc)


def read_manifest(directory):
    """The manifest of a checkpoint directory as a dict; None when there is
    none.  A manifest that cannot be parsed raises CorruptCheckpointError."""
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        with open_regular(path) as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except FerrocaffeIOError as e:  # a FIFO or a directory, say
        raise CorruptCheckpointError(
            'checkpoint manifest %s is damaged: %s' % (path, e), file=path)
    try:
        manifest = json.loads(raw.decode('utf-8'))
        if manifest.get('format') != MANIFEST_FORMAT:
            raise ValueError('not a %s manifest' % MANIFEST_FORMAT)
        for entry in manifest['epochs']:
            int(entry['epoch'])
            dict(entry['dbs'])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptCheckpointError(
            'checkpoint manifest %s is damaged: %s' % (path, e), file=path)
    return manifest


class FileMetadataHandler(MetadataHandler):
    """
    Keeps ``manifest.json`` in the checkpoint directory: the completed
    epochs, each with its dbs (file, size, and a CRC-32 for formats without
    checksums of their own), rewritten atomically after each save.  The
    manifest is the commit point: a db saved after the last manifest write
    is ignored.

    * ``last_epoch('latest')``: the newest listed epoch whose dbs all
      verify; a damaged one is skipped with a warning.  ``None`` (start
      from scratch) and an epoch number are returned as they are.
    * ``write(epoch)`` records ``epoch`` and forgets any later epoch (left
      by an earlier run that went further); their dbs are deleted.
    * ``max_to_keep``: only the newest ``max_to_keep`` epochs are kept; the
      dbs of older ones are deleted once the manifest no longer lists them.
    * ``cp_accessible()`` creates the directory if needed and tells whether
      it can be written.

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

    def manifest(self):
        """The current manifest (a new, empty one if there is none, or if
        it is damaged: it is then rebuilt by the next saves)."""
        self._require_params()
        try:
            manifest = read_manifest(self.db_prefix)
        except CorruptCheckpointError as e:
            logger.warning('%s; starting a new one', e)
            manifest = None
        if manifest is None:
            manifest = {'format': MANIFEST_FORMAT, 'version': 1, 'epochs': []}
        return manifest

    def epochs(self):
        """The epochs the manifest lists, oldest first."""
        return sorted(int(e['epoch']) for e in self.manifest()['epochs'])

    def cp_accessible(self, epoch=None):
        self._require_params()
        if epoch is not None:
            return all(os.path.isfile(db_name(epoch, n, self.db_prefix))
                       for n in self.node_names)
        try:
            os.makedirs(self.db_prefix, exist_ok=True)
        except OSError as e:
            logger.warning('cannot create the checkpoint directory %s: %s',
                           self.db_prefix, e)
            return False
        return os.access(self.db_prefix, os.W_OK | os.X_OK)

    def _entry(self, epoch):
        dbs = {}
        for node in self.node_names:
            path = db_name(epoch, node, self.db_prefix)
            info = {'file': os.path.basename(path),
                    'bytes': os.stat(path).st_size}
            if self.db_type != 'ferro':
                # minidb has no checksums of its own.
                info['crc32'] = _file_crc32(path)
            dbs[node] = info
        return {
            'epoch': int(epoch),
            'db_type': self.db_type,
            'written_at': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
            'dbs': dbs,
        }

    def write(self, epoch, finished=False):
        """Records the (already saved) checkpoint of ``epoch``; ``finished``:
        the job stopped after this epoch (JobRunner sets it)."""
        self._require_params()
        epoch = int(epoch)
        entry = self._entry(epoch)
        if finished:
            entry['finished'] = True
        old = self.manifest()['epochs']
        kept = [e for e in old if int(e['epoch']) < epoch] + [entry]
        kept.sort(key=lambda e: int(e['epoch']))
        if self.max_to_keep is not None:
            kept = kept[-self.max_to_keep:]
        kept_epochs = set(int(e['epoch']) for e in kept)
        dropped = [e for e in old if int(e['epoch']) not in kept_epochs]
        manifest = {
            'format': MANIFEST_FORMAT,
            'version': 1,
            'db_type': self.db_type,
            'nodes': self.node_names,
            'max_to_keep': self.max_to_keep,
            'latest': epoch,
            'epochs': kept,
        }
        data = json.dumps(manifest, indent=1, sort_keys=True).encode('utf-8')
        _write_file_atomically(self.manifest_path(), data + b'\n')
        # Only now that no manifest lists them can old dbs go.
        for e in dropped:
            for info in e['dbs'].values():
                self._remove(os.path.join(self.db_prefix, info['file']))
        if self.max_to_keep is not None:
            # Leftovers of a run killed between a manifest write and the
            # deletions above.
            oldest = min(kept_epochs)
            for ep, nodes in find_checkpoints(self.db_prefix).items():
                if ep < oldest:
                    for node, path in nodes.items():
                        if node in self.node_names:
                            self._remove(path)

    def is_finished(self, epoch):
        """Whether the job stopped after ``epoch`` (as recorded by
        ``write(epoch, finished=True)``)."""
        try:
            manifest = (read_manifest(self.db_prefix) if self.db_prefix
                        else None)
        except CorruptCheckpointError:
            return False
        for entry in (manifest or {}).get('epochs', []):
            if int(entry['epoch']) == int(epoch):
                return bool(entry.get('finished'))
        return False

    @staticmethod
    def _remove(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.warning('cannot remove old checkpoint %s: %s', path, e)

    def last_epoch(self, user_epoch=None):
        if user_epoch != LATEST:
            return user_epoch
        self._require_params()
        try:
            manifest = read_manifest(self.db_prefix)
        except CorruptCheckpointError as e:
            logger.warning('%s; looking for checkpoint files instead', e)
            return latest_valid_epoch(self.db_prefix, self.node_names,
                                      self.db_type)
        if manifest is None:
            return latest_valid_epoch(self.db_prefix, self.node_names,
                                      self.db_type)
        entries = sorted(manifest['epochs'], key=lambda e: -int(e['epoch']))
        for entry in entries:
            problem = self._check_entry(entry)
            if problem is None:
                return int(entry['epoch'])
            logger.warning(
                'checkpoint of epoch %d cannot be used (%s); trying an '
                'earlier epoch', int(entry['epoch']), problem)
        if entries:
            logger.warning('no usable checkpoint in %s: starting from scratch',
                           self.db_prefix)
        return None

    def _check_entry(self, entry):
        """None if every db of a manifest entry is present and sound, else
        what is wrong."""
        dbs = entry['dbs']
        missing = [n for n in self.node_names if n not in dbs]
        if missing:
            return 'no checkpoint of node(s) %s' % ', '.join(missing)
        db_type = entry.get('db_type', self.db_type)
        for node in self.node_names:
            info = dbs[node]
            path = os.path.join(self.db_prefix, info['file'])
            problem = _check_db(path, db_type, info, self.verify)
            if problem is not None:
                return problem
        return None

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
    """``{epoch: {node: path}}`` of the files in ``directory`` named like
    checkpoints (``<node>.<epoch>``), whatever their content."""
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
    """The newest epoch for which every node in ``node_names`` has a
    checkpoint in ``directory`` that verifies; None if there is none.
    Damaged checkpoints are skipped with a warning."""
    node_names = [str(n) for n in node_names]
    if not node_names:
        return None
    found = find_checkpoints(directory)
    for epoch in sorted(found, reverse=True):
        nodes = found[epoch]
        if not all(n in nodes for n in node_names):
            continue
        problems = [p for p in (_check_db(nodes[n], db_type, verify=verify)
                                for n in node_names) if p is not None]
        if not problems:
            return epoch
        logger.warning('checkpoint of epoch %d cannot be used (%s); trying an '
                       'earlier epoch', epoch, '; '.join(problems))
    return None


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
    (epoch 0) and after each epoch, before the stop test.  With
    ``resume_from_epoch`` (an epoch, or ``'latest'``: the newest epoch
    whose checkpoint verifies, or a fresh start if there is none) the init
    group is not run: its blobs come from that checkpoint, and training
    goes on with the next epoch.

    A save that fails is logged as a warning and recorded in
    ``failed_saves``; training goes on.  Ctrl-C stops the run
    (KeyboardInterrupt is raised again); the last complete checkpoint stays
    valid, and ``resume_from_epoch='latest'`` continues from it.

    After ``train``: ``resumed_from_epoch`` (None for a fresh start),
    ``epoch`` (the last epoch run), ``last_checkpoint_epoch``,
    ``failed_saves`` (``[(epoch, exception)]``), and ``epoch_seconds`` and
    ``save_seconds`` (wall time of each epoch and each save).

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
    """

    def __init__(self, job, checkpoint_manager=None, resume_from_epoch=None,
                 upload_task_group_builder=None, progress=None):
        self.resume_from_epoch = resume_from_epoch
        self.checkpoint_manager = checkpoint_manager
        self.job = job
        self.upload_task_group_builder = upload_task_group_builder
        self.progress = progress
        self._reset()
        self._progress = _NoProgress()

    def _reset(self):
        self.resumed_from_epoch = None
        self.epoch = None
        self.last_checkpoint_epoch = None
        self.epoch_seconds = {}
        self.save_seconds = {}
        self.failed_saves = []

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
                # Ctrl-C may land between a save's commit (the manifest
                # write) and our bookkeeping: ask the handler, which reads
                # the manifest, what the last complete checkpoint is.
                handler = _handler_of(cm)
                if isinstance(handler, FileMetadataHandler):
                    try:
                        committed = handler.last_epoch(user_epoch=LATEST)
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

        if cm:
            logger.info('Preparing checkpoints ...')
            session.run(cm.init(job.nodes_to_checkpoint(),
                                retrieve_from_epoch=resume))
            if from_scratch:
                self.save_checkpoints(0, session)
            else:
                logger.info('Loading checkpoints for epoch %s ...', resume)
                session.run(cm.load(resume))
                cm.report_checkpoint_stats('checkpoint_load')
                self.last_checkpoint_epoch = resume
                logger.info('Checkpoint loaded')
        logger.info('Finished initializing')

        handler = _handler_of(cm)
        if (resume is not None and self.resume_from_epoch == LATEST and
                isinstance(handler, FileMetadataHandler) and
                handler.is_finished(resume)):
            # The job had stopped: no more epochs, only what follows them.
            logger.info('The job stopped after epoch %s', resume)
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

    def _run_epochs(self, session, cm, job, epoch):
        self._progress.start(epoch - 1)
        while True:
            self.epoch = epoch
            logger.info('Starting epoch %d', epoch)
            self._progress.epoch_started(epoch)
            start = time.perf_counter()
            session.run(job.epoch_group)
            self.epoch_seconds[epoch] = time.perf_counter() - start
            logger.info('Finished epoch %d', epoch)
            stop_conditions = [o.fetch() for o in job.stop_conditions]
            stop = any(stop_conditions)
            self._progress.epoch_finished(epoch)
            if cm:
                self.save_checkpoints(epoch, session, _finished=stop)
            if stop:
                logger.info('Stopping')
                return epoch
            epoch += 1

    def load_blobs_from_checkpoints(self, blob_names, epoch, session):
        """Loads only ``blob_names`` from every node's checkpoint of
        ``epoch`` into the session (e.g. a model for evaluation).  False if
        a checkpoint is missing."""
        if not self.checkpoint_manager:
            raise ValueError('Checkpoint manager is None')
        logger.info('Loading checkpoint for epoch %s ...', epoch)
        result = self.checkpoint_manager.load_blobs_locally(
            self.job.nodes_to_checkpoint(), blob_names, epoch, session)
        self.checkpoint_manager.report_checkpoint_stats(
            'checkpoint_partial_load')
        return result

    def save_checkpoints(self, epoch, session, _finished=False):
        """Saves the checkpoints of ``epoch``.  Never raises (but for
        Ctrl-C): a failure is logged, recorded in ``failed_saves`` and
        reported by the return value (True when saved)."""
        cm = self.checkpoint_manager
        if not cm:
            raise ValueError('Checkpoint manager is None')
        start = time.perf_counter()
        try:
            if cm.cp_accessible(epoch=None):
                logger.info('Saving checkpoints for epoch %d', epoch)
                session.run(cm.save(epoch))
                handler = _handler_of(cm)
                if _finished and isinstance(handler, FileMetadataHandler):
                    handler.write(epoch=epoch, finished=True)
                else:
                    cm.write_checkpoint_metadata(epoch)
                self.last_checkpoint_epoch = epoch
                logger.info('Checkpoints saved')
                cm.report_checkpoint_stats('checkpoint_save')
            else:
                raise OSError('checkpoint files cannot be accessed')
        except Exception as ex:
            logger.warning('Unable to write checkpoint for epoch %d: %s',
                           epoch, ex)
            self.failed_saves.append((epoch, ex))
            self._progress.checkpoint(epoch, None, False)
            return False
        seconds = time.perf_counter() - start
        self.save_seconds[epoch] = seconds
        self._progress.checkpoint(epoch, seconds, True)
        return True


def _handler_of(checkpoint_manager):
    return getattr(checkpoint_manager, '_metadata_handler', None)


def epoch_limiter(job, num_epochs):
    """Stops ``job`` after ``num_epochs`` epochs: a counter created in the
    init group (and so checkpointed) is counted down once per epoch."""
    with job.init_group:
        init_net = core.Net('epoch_counter_init')
        counter = init_net.CreateCounter([], init_count=num_epochs - 1)
        Task(step=init_net)

    with job.epoch_group:
        epoch_net = core.Net('epoch_countdown')
        finished = epoch_net.CountDown(counter)
        output = Task(step=epoch_net, outputs=finished).outputs()[0]
    job.add_stop_condition(output)
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
        print('  %s  %s  %s  %s  %d blobs' % (
            node, os.path.basename(path), dtype, _human(size), len(entries)),
            file=out)
        for e in entries:
            kind = e['kind'].lower()
            what = e['dtype'] if e['dtype'] else e['type']
            shape = ('[%s]' % ', '.join(str(d) for d in e['shape'])
                     if kind == 'tensor' else '')
            print('    %-40s %-7s %-10s %-14s %s' % (
                e['name'], kind, what, shape, _human(e['bytes'])), file=out)
    return 0


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
