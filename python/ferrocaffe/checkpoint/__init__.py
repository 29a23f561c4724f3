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
that is fsynced and renamed into place (by the Rust core's storage), so a db
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

The package's modules, lowest first (each imports only those before it):
``state`` (file names, job state), ``manifest`` (metadata handlers, finding
the latest valid epoch), ``manager`` (checkpoint managers), ``progress``,
``job`` (Job, JobRunner), ``mmap`` (mmap_db) and ``cli``.  Every public
name is importable from here.
"""

from ferrocaffe.checkpoint.state import (
    DEFAULT_DB_TYPE,
    INTERNAL_PREFIX,
    JOB_STATE_BLOB,
    JOB_STATE_FORMAT,
    JOB_STATE_VERSION,
    LATEST,
    db_name,
    get_ckpt_filename,
    read_job_state,
)
from ferrocaffe.checkpoint.manifest import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    FileMetadataHandler,
    MetadataHandler,
    find_checkpoints,
    latest_valid_epoch,
    read_manifest,
)
from ferrocaffe.checkpoint.manager import (
    CheckpointManager,
    MultiNodeCheckpointManager,
    UploadTaskGroupBuilder,
)
from ferrocaffe.checkpoint.progress import (  # private; tests drive them
    _make_progress,
    _NoProgress,
    _progress_wanted,
)
from ferrocaffe.checkpoint.job import Job, JobRunner, epoch_limiter
from ferrocaffe.checkpoint.mmap import mmap_db
from ferrocaffe.checkpoint.cli import main

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
