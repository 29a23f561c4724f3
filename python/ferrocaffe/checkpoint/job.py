"""Jobs and the runner that trains them: :class:`Job` (four TaskGroups and
stop conditions), :class:`JobRunner` (init, epochs, checkpoints, resume) and
:func:`epoch_limiter`."""

from __future__ import annotations

import collections
import inspect
import operator
import time
from typing import Any, Sequence

import numpy as np

from ferrocaffe import context, core, profiler
from ferrocaffe.checkpoint.manager import (
    CheckpointManager, MultiNodeCheckpointManager, UploadTaskGroupBuilder,
    _check_loaded_states)
from ferrocaffe.checkpoint.manifest import (
    FileMetadataHandler, _generation, _latest, _scan)
from ferrocaffe.checkpoint.progress import _make_progress, _NoProgress
from ferrocaffe.checkpoint.state import LATEST, logger
from ferrocaffe.errors import FerrocaffeIOError
from ferrocaffe.session import Session
from ferrocaffe.task import Task, TaskGroup, TaskOutput, WorkspaceType


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

    def __init__(
        self,
        init_group: TaskGroup | None = None,
        epoch_group: TaskGroup | None = None,
        download_group: TaskGroup | None = None,
        exit_group: TaskGroup | None = None,
        stop_conditions: list[TaskOutput] | None = None,
        nodes_to_checkpoint: Sequence[str] | None = None,
    ) -> None:
        # TaskGroups, each a CompiledRunnable once ``compile`` ran.
        self.init_group: Any = init_group or TaskGroup(
            workspace_type=WorkspaceType.GLOBAL)
        self.epoch_group: Any = epoch_group or TaskGroup()
        self.download_group: Any = download_group or TaskGroup()
        self.exit_group: Any = exit_group or TaskGroup()
        self.stop_conditions = stop_conditions or []
        self._nodes_to_checkpoint = nodes_to_checkpoint
        # Shown by JobRunner's progress display: the epoch limit set by
        # epoch_limiter, and the outputs given to track_progress.
        self.num_epochs: int | None = None
        self.progress_outputs: collections.OrderedDict[str, TaskOutput] = (
            collections.OrderedDict())
        # Logged by JobRunner(summary=...) after every epoch (track_scalars).
        self.scalar_outputs: collections.OrderedDict[str, TaskOutput] = (
            collections.OrderedDict())

    def nodes_to_checkpoint(self) -> list[str]:
        """The nodes whose global workspaces are checkpointed."""
        if self._nodes_to_checkpoint:
            return list(self._nodes_to_checkpoint)
        if isinstance(self.init_group, TaskGroup):
            return self.init_group.used_nodes()
        # Compiled with an empty init group (Caffe2 crashed here).
        return []

    def compile(self, session_class: type[Session]) -> Job:
        """Compiles the four groups for ``session_class``, in place.  Returns
        the Job itself (Caffe2's newest version returned None, older ones a
        new Job)."""
        self._nodes_to_checkpoint = list(self.nodes_to_checkpoint())
        self.init_group = session_class.compile(self.init_group)
        self.epoch_group = session_class.compile(self.epoch_group)
        self.download_group = session_class.compile(self.download_group)
        self.exit_group = session_class.compile(self.exit_group)
        return self

    def __enter__(self) -> Job:
        super(Job, self).__enter__()
        self.epoch_group.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self.epoch_group.__exit__(*args)
        super(Job, self).__exit__(*args)

    def _epoch_output(self, output):
        if isinstance(output, (core.BlobReference, str)):
            t = Task(outputs=[output], group=self.epoch_group)
            output = t.outputs()[0]
        assert isinstance(output, TaskOutput)
        return output

    def add_stop_condition(self, output: TaskOutput | str | core.BlobReference) -> None:
        """Stops the job after the first epoch at whose end ``output`` (a
        TaskOutput, or a blob, fetched through a new empty Task of the epoch
        group) is true."""
        self.stop_conditions.append(self._epoch_output(output))

    # Caffe2's older name.
    add_stop_signal = add_stop_condition

    def track_progress(
        self,
        batches: TaskOutput | str | core.BlobReference | None = None,
        rows: TaskOutput | str | core.BlobReference | None = None,
    ) -> None:
        """Names the blobs (int tensors, cumulative) that count the batches
        and the rows processed, for JobRunner's progress display.  Must be
        called before the job is compiled."""
        for key, value in (('batches', batches), ('rows', rows)):
            if value is not None:
                self.progress_outputs[key] = self._epoch_output(value)

    def track_scalars(self, **outputs: TaskOutput | str | core.BlobReference) -> None:
        """Names blobs (or TaskOutputs) holding one number each, fetched at
        the end of every epoch and logged under their keyword (``loss=``,
        ``accuracy=``, ``lr=``, ...) by a JobRunner given a ``summary``
        logger (``ferrocaffe.tensorboard.ScalarLogger``). Must be called
        before the job is compiled."""
        for key, value in outputs.items():
            self.scalar_outputs[key] = self._epoch_output(value)


def _interrupted_message(epoch, last_checkpoint):
    """What a Ctrl-C left: ``epoch`` is the epoch running (None before the
    first), ``last_checkpoint`` the last complete checkpoint's epoch."""
    if last_checkpoint is None:
        return ('interrupted before any checkpoint was complete; '
                "resume_from_epoch='latest' starts from scratch")
    if epoch is not None and last_checkpoint >= epoch:
        return ('interrupted after the checkpoint of epoch %d was complete; '
                "resume_from_epoch='latest' goes on with epoch %d"
                % (last_checkpoint, last_checkpoint + 1))
    where = ('before the first epoch' if epoch is None
             else 'during epoch %d' % epoch)
    return ('interrupted %s; the last complete checkpoint is epoch %d; '
            "resume_from_epoch='latest' goes on with epoch %d"
            % (where, last_checkpoint, last_checkpoint + 1))


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
        summary: a scalar logger (``ferrocaffe.tensorboard.ScalarLogger``,
            or anything with ``add_scalar(tag, value, step)``): after each
            epoch it gets ``job/epoch_seconds``, ``job/rows_per_second``
            (with ``track_progress(rows=...)``), the ``track_progress``
            counts and every ``track_scalars`` value (under its name); after
            each save ``job/checkpoint_save_seconds``. The step is the
            epoch.

    While a timeline is recorded (``ferrocaffe.profile``), each epoch and
    each checkpoint save is a span of it.
    """

    # How many epochs' timings and failed saves are kept.
    KEEP = 1000

    def __init__(
        self,
        job: Job,
        checkpoint_manager: CheckpointManager | MultiNodeCheckpointManager | None = None,
        resume_from_epoch: int | str | None = None,
        upload_task_group_builder: UploadTaskGroupBuilder | None = None,
        progress: bool | None = None,
        raise_on_save_failure: bool = False,
        summary: Any = None,
    ) -> None:
        self.resume_from_epoch = resume_from_epoch
        self.checkpoint_manager = checkpoint_manager
        self.job = job
        self.upload_task_group_builder = upload_task_group_builder
        self.progress = progress
        self.raise_on_save_failure = bool(raise_on_save_failure)
        self.summary = summary
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
        self._rows_seen = 0

    def train(self, session: Session) -> int:
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
                logger.warning('%s', _interrupted_message(
                    self.epoch, self.last_checkpoint_epoch))
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
        # Rows counted before this run's first epoch (unknown on a resume).
        self._rows_seen = 0 if from_scratch else None
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
            with profiler.span('epoch %d' % epoch, 'epoch'):
                session.run(job.epoch_group)
            self._note(self.epoch_seconds, epoch, time.perf_counter() - start)
            if self.summary is not None:
                self._log_epoch(job, epoch)
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

    def _log_epoch(self, job, epoch):
        """Logs the epoch's scalars to ``self.summary``."""
        seconds = self.epoch_seconds[epoch]
        log = self.summary.add_scalar
        log('job/epoch_seconds', seconds, epoch)
        for key, output in list(job.progress_outputs.items()):
            value = _scalar(output)
            if value is None:
                continue
            log('job/%s' % key, value, epoch)
            if key == 'rows':
                before = self._rows_seen
                self._rows_seen = value
                if before is not None and seconds > 0:
                    log('job/rows_per_second', (value - before) / seconds, epoch)
        for key, output in list(job.scalar_outputs.items()):
            value = _scalar(output)
            if value is not None:
                log(key, value, epoch)

    def _note(self, record, epoch, value):
        """Records ``value`` for ``epoch``, keeping the last KEEP."""
        record[epoch] = value
        while len(record) > self.KEEP:
            del record[next(iter(record))]

    def load_blobs_from_checkpoints(
        self,
        blob_names: Sequence[str],
        epoch: int,
        session: Session,
    ) -> bool:
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

    def save_checkpoints(
        self,
        epoch: int,
        session: Session,
        _state: dict[str, Any] | None = None,
    ) -> bool:
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
            with profiler.span('checkpoint save (epoch %d)' % epoch, 'checkpoint'):
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
            self.failed_save_count += 1
            self._progress.checkpoint(epoch, None, False)
            if self.raise_on_save_failure:
                self.failed_saves.append((epoch, ex))
                raise
            # Kept without its traceback: the frames would keep this
            # save's Tasks, nets and session state alive, ~30 KB a failed
            # save (issue 28). The message and attributes stay.
            self.failed_saves.append((epoch, _detached(ex)))
            del self.failed_saves[:-self.KEEP]
            return False
        seconds = time.perf_counter() - start
        self._note(self.save_seconds, epoch, seconds)
        self._progress.checkpoint(epoch, seconds, True)
        if self.summary is not None:
            self.summary.add_scalar('job/checkpoint_save_seconds', seconds, epoch)
        return True


def _scalar(output):
    """The one number a TaskOutput holds, or None (not set, not a number)."""
    try:
        arr = np.asarray(output.fetch())
    except Exception:  # not fetched yet, or not fetchable
        return None
    if arr.size != 1 or arr.dtype == object:
        return None
    value = arr.reshape(-1)[0]
    return int(value) if arr.dtype.kind in 'iub' else float(value)


def _handler_of(checkpoint_manager):
    return getattr(checkpoint_manager, '_metadata_handler', None)


def _takes_job_state(save):
    try:
        return 'job_state' in inspect.signature(save).parameters
    except (TypeError, ValueError):
        return False


def _detached(ex: BaseException) -> BaseException:
    """``ex`` without its traceback, nor those of the exceptions it
    chains, so that keeping it keeps no frame (and no frame's locals)."""
    seen = set()
    e: BaseException | None = ex
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    return ex


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


def epoch_limiter(job: Job, num_epochs: int) -> None:
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
