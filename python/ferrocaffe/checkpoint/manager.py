"""Checkpoint managers: the Tasks that save and load one node's blobs
(:class:`CheckpointManager`) or every node's (:class:`MultiNodeCheckpointManager`)."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from ferrocaffe import _core, core
from ferrocaffe.checkpoint.manifest import MetadataHandler, latest_valid_epoch
from ferrocaffe.checkpoint.state import (
    DEFAULT_DB_TYPE, INTERNAL_PREFIX, JOB_STATE_BLOB, LATEST,
    _decode_job_state, _new_job_state, _state_load_ops, _state_problem,
    db_name, logger)
from ferrocaffe.errors import CorruptCheckpointError, io_error
from ferrocaffe.net_builder import ops
from ferrocaffe.session import Session
from ferrocaffe.task import Node, Task, TaskGroup, TaskOutput, WorkspaceType


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
        db_type: any of ``workspace.C.registered_dbs()``: ``'ferro'``
            (ferrocaffe's checked format, the default), ``'minidb'`` or
            ``'leveldb'``/``'LevelDB'`` (Caffe2's; a LevelDB checkpoint is a
            directory).
        metadata_handler: an object with ``report``, ``write``,
            ``last_epoch``, ``set_params`` and ``cp_accessible`` (see
            :class:`MetadataHandler`), or None.
    """

    BLOB_NAMES = 'blob_names'

    def __init__(
        self,
        db_prefix: str,
        node_name: str,
        db_type: str = DEFAULT_DB_TYPE,
        metadata_handler: MetadataHandler | None = None,
        _names_blob: str | None = None,
    ) -> None:
        self._db_prefix = db_prefix
        self._node_name = node_name
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._net = core.Net('!!checkpoint_mngr')
        self._blob_names = self._net.AddExternalInput(
            _names_blob or self.BLOB_NAMES)
        self._names_output: TaskOutput | None = None
        self._path_prefix: str | None = None
        self._path_type: str | None = None
        self._current_db_name: str | None = None
        self._current_checkpoint_duration = None
        self._state_output: TaskOutput | None = None
        # This node's internal blobs (nodes may share one workspace).
        self._internal = INTERNAL_PREFIX + str(node_name) + '/'

    def init(
        self,
        nodes: Sequence[str] | None = None,
        retrieve_from_epoch: int | None = None,
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> Task:
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

    def blob_list(self) -> list[str]:
        """The names of the checkpointed blobs (known once ``init``'s Task
        ran), less the runtime's own."""
        assert self._names_output
        names = (_to_str(n) for n in self._names_output.fetch().tolist())
        return [n for n in names if not n.startswith(INTERNAL_PREFIX)]

    def managers(self) -> list[tuple[str, CheckpointManager]]:
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

    def collect_checkpoint_stats(self, stats: dict[str, Any]) -> None:
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

    def loaded_job_states(self) -> list[tuple[str, str, dict[str, Any] | None]]:
        """``[(node, db path, job state or None)]`` of the last load Task
        run (see ``load``)."""
        assert self._state_output is not None, 'no load Task was built'
        assert self._current_db_name is not None  # set with _state_output
        return [(str(self._node_name), self._current_db_name,
                 _decode_job_state(self._state_output.fetch(),
                                   self._current_db_name))]

    def load(
        self,
        epoch: int,
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> Task:
        """A Task that loads every checkpointed blob from the checkpoint of
        ``epoch``, and its job state (see ``loaded_job_states``)."""
        self._current_db_name = db_name(
            epoch, self._node_name, self._db_prefix, path_prefix)
        db_type = path_type or self._db_type
        logger.info('Loading checkpoints from %s', self._current_db_name)

        return self._load_task('checkpoint_load', self.blob_list(), db_type,
                               keep_device=True)

    def load_blobs_from_checkpoint(
        self,
        blob_names: Sequence[str],
        epoch: int,
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> Task:
        """A Task that loads only ``blob_names`` (those the checkpoint has)
        from the checkpoint of ``epoch``, and its job state."""
        self._current_db_name = db_name(
            epoch, self._node_name, self._db_prefix, path_prefix)
        db_type = path_type or self._db_type
        logger.info('Load from %s', self._current_db_name)

        return self._load_task('checkpoint_partial_load', blob_names,
                               db_type, allow_incomplete=True)

    def check_db_exists(
        self,
        epoch: int,
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> Task:
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

    def load_blobs_locally(
        self,
        nodes: Sequence[str],
        blob_names: Sequence[str],
        epoch: int,
        session: Session,
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> bool:
        """Loads ``blob_names`` from the checkpoint of ``epoch`` into the
        session; False (nothing loaded) when that checkpoint does not
        exist."""
        assert nodes is None or len(nodes) <= 1, (
            'CheckpointManager only supports single node.')
        return _load_locally(self, blob_names, epoch, session, path_prefix,
                             path_type)

    def report_checkpoint_stats(self, action_name: str) -> None:
        """Hands the last timed Task's duration to the metadata handler."""
        all_stats: dict[str, Any] = {}
        self.collect_checkpoint_stats(all_stats)
        if self._metadata_handler:
            self._metadata_handler.report(action_name, all_stats)

    def save(self, epoch: int, job_state: dict[str, Any] | None = None) -> Task:
        """A Task that saves every checkpointed blob to the checkpoint of
        ``epoch``, with the job state (``job_state``: fields of
        :func:`read_job_state` to set; a JobRunner gives them) in the same
        atomic write. The checkpoint directory is created first when it does
        not exist (a FerrocaffeIOError naming it when it cannot be)."""
        self._current_db_name = db_name(epoch, self._node_name,
                                        self._db_prefix)
        _make_folder(self._current_db_name)
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

    def write_checkpoint_metadata(self, epoch: int) -> None:
        if self._metadata_handler is not None:
            self._metadata_handler.write(epoch=epoch)

    def get_resume_from_epoch_id(self, user_epoch: int | str | None = None) -> int | str | None:
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

    def set_params(
        self,
        nodes: Sequence[str],
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> None:
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

    def cp_accessible(self, epoch: int | None = None) -> bool:
        """Whether the checkpoints (of ``epoch``, or the directory) can be
        reached; True without a metadata handler."""
        if self._metadata_handler is not None:
            return self._metadata_handler.cp_accessible(epoch)
        return True


def _make_folder(db_path: str) -> None:
    """Creates the folder a checkpoint is saved into, and its parents, when
    they do not exist (as TensorFlow's and Orbax's checkpoint managers do;
    ``db_prefix`` is a path every node reaches: docs/distributed.md). A
    folder that cannot be made is a FerrocaffeIOError naming it."""
    folder = os.path.dirname(os.path.abspath(db_path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise io_error(e, e.filename or folder,
                       'cannot create the checkpoint directory') from None


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

    def __init__(
        self,
        db_prefix: str,
        db_type: str = DEFAULT_DB_TYPE,
        metadata_handler: MetadataHandler | None = None,
    ) -> None:
        self._node_managers: list[tuple[str, CheckpointManager]] | None = None
        self._db_prefix = db_prefix
        self._db_type = db_type
        self._metadata_handler = metadata_handler
        self._path_prefix: str | None = None
        self._path_type: str | None = None
        self._node_names: list[str] | None = None

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

    def init(
        self,
        nodes: Sequence[str],
        retrieve_from_epoch: int | None = None,
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> TaskGroup:
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

    def load(
        self,
        epoch: int,
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> TaskGroup:
        return self._task_group(lambda node, manager: manager.load(
            epoch, path_prefix=path_prefix, path_type=path_type))

    def load_blobs_locally(
        self,
        nodes: Sequence[str],
        blob_names: Sequence[str],
        epoch: int,
        session: Session,
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> bool:
        """Loads ``blob_names`` from every node's checkpoint of ``epoch``
        into the session; False as soon as one of them does not exist."""
        if self._node_managers is not None:
            assert self._same_nodes(nodes), 'the nodes changed'
        else:
            self._create_managers(nodes)
        for _, manager in self._node_managers or []:
            if not _load_locally(manager, blob_names, epoch, session,
                                 path_prefix, path_type):
                return False
        logger.info('Successfully loaded from checkpoints.')
        return True

    def get_ckpt_db_name(self, node_name: str, epoch: int) -> str | None:
        """The checkpoint path of ``node_name`` for ``epoch`` (None for an
        unknown node)."""
        for node, manager in self._node_managers or []:
            if str(node) == node_name:
                return db_name(epoch, manager._node_name, manager._db_prefix)
        return None

    def managers(self) -> list[tuple[str, CheckpointManager]]:
        """``[(node, CheckpointManager)]``, once ``init`` was called."""
        return list(self._node_managers or [])

    def report_checkpoint_stats(self, action_name: str) -> None:
        """Hands every node's last duration to the metadata handler, so
        that the slowest node shows."""
        all_stats: dict[str, Any] = {}
        for _, manager in self._node_managers or []:
            manager.collect_checkpoint_stats(all_stats)
        logger.debug('checkpoint stats: %s', all_stats)
        if self._metadata_handler:
            self._metadata_handler.report(action_name, all_stats)

    def save(self, epoch: int, job_state: dict[str, Any] | None = None) -> TaskGroup:
        """A TaskGroup saving every node's checkpoint of ``epoch``, each
        with the job state (see ``CheckpointManager.save``)."""
        return self._task_group(
            lambda node, manager: manager.save(epoch, job_state))

    def loaded_job_states(self) -> list[tuple[str, str, dict[str, Any] | None]]:
        """``[(node, db path, job state or None)]`` of the last load."""
        states = []
        for _, manager in self._node_managers or []:
            states.extend(manager.loaded_job_states())
        return states

    def write_checkpoint_metadata(self, epoch: int) -> None:
        if self._metadata_handler is not None:
            self._metadata_handler.write(epoch=epoch)

    def get_resume_from_epoch_id(self, user_epoch: int | str | None = None) -> int | str | None:
        last_epoch = user_epoch
        if self._metadata_handler is not None:
            last_epoch = self._metadata_handler.last_epoch(
                user_epoch=user_epoch)
        if last_epoch == LATEST:
            last_epoch = latest_valid_epoch(
                self._db_prefix, self._node_names or [], self._db_type)
        return last_epoch

    def set_params(
        self,
        nodes: Sequence[str],
        path_prefix: str | None = None,
        path_type: str | None = None,
    ) -> None:
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

    def cp_accessible(self, epoch: int | None = None) -> bool:
        if self._metadata_handler is not None:
            return self._metadata_handler.cp_accessible(epoch)
        return True


class UploadTaskGroupBuilder(object):
    """Builds the TaskGroup that uploads the checkpoints after the last
    epoch.  Subclasses implement ``build``."""

    def build(
        self,
        epoch: int,
        checkpoint_manager: CheckpointManager | MultiNodeCheckpointManager,
    ) -> TaskGroup:
        """A TaskGroup uploading the checkpoints of ``epoch``, made by
        ``checkpoint_manager`` (single- or multi-node)."""
        raise NotImplementedError()
