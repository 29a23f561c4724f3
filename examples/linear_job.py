"""A checkpointed training job: the Job that Caffe2's checkpoint.py
describes, made real.

* The **init group** creates the model (a linear model: one weight per
  feature and a bias) and a reader over a real file: a Parquet file of
  ``rows`` records (y = x . w_true + b_true + noise) that the first run
  writes with ferrocaffe's ParquetWriter (``--data-format npy``: .npy
  files instead).
* The **epoch group** pipes ``batches_per_epoch`` records per epoch from
  the reader through ``threads`` threads into a processor that takes one
  SGD step per record on the shared model (Hogwild!, as Caffe2's trainers
  did), with the arithmetic operators Mul, Sum, Sub, Scale, WeightedSum and
  Add.
* **Stop condition**: the file is exhausted (and, with ``--epochs``, an
  epoch limit).
* The **exit group** writes the trained model to ``<workdir>/model`` (a
  ferro db).
* A checkpoint is saved after every epoch (``<workdir>/checkpoints``, the
  newest 3 kept); the reader's position is part of it.

Run it; press Ctrl-C during training; run it again: it resumes from the
last complete checkpoint::

    python examples/linear_job.py
    python examples/linear_job.py --fresh          # start over
    python -m ferrocaffe.checkpoint ls /tmp/ferrocaffe_linear_job/checkpoints

A finished run can be extended: run it again with a larger ``--epochs``
and it goes on from its last epoch (the epoch limit belongs to the job,
not to its checkpoints; each checkpoint records whether the job had
stopped there, and why)::

    python examples/linear_job.py --epochs 5
    python examples/linear_job.py --epochs 8       # epochs 6, 7 and 8

A run that stopped because its data was exhausted stays finished: running
it again only writes the model again.  ``--fresh`` deletes everything the
example made in its workdir (checkpoints, model and data) before starting
over.

With ``--threads 1`` the run is deterministic: an interrupted and resumed
run, or an extended one, ends with exactly the model of an uninterrupted
one.  The default size (10 epochs of 100,000 records) takes a few seconds
with a release build; ``--rows 100000 --batches-per-epoch 10000`` is
quicker with a debug build.
"""

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import ferrocaffe  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:  # run from a checkout
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), 'python'))

from ferrocaffe import _core, core, workspace  # noqa: E402
from ferrocaffe.checkpoint import (  # noqa: E402
    CheckpointManager, FileMetadataHandler, Job, JobRunner, epoch_limiter,
    find_checkpoints)
from ferrocaffe.dataio import ReaderWithDelay, ReaderWithLimit  # noqa: E402
from ferrocaffe.file_reader import (  # noqa: E402
    NpyReader, ParquetReader, ParquetWriter)
from ferrocaffe.net_builder import ops  # noqa: E402
from ferrocaffe.pipeline import pipe  # noqa: E402
from ferrocaffe.schema import Scalar, Struct  # noqa: E402
from ferrocaffe.session import LocalSession  # noqa: E402
from ferrocaffe.task import Node, Task  # noqa: E402

DEFAULT_WORKDIR = os.path.join(tempfile.gettempdir(), 'ferrocaffe_linear_job')
NODE = 'trainer'


class Config(object):
    """The job's sizes and paths (the defaults are the example's default
    size)."""

    def __init__(self, workdir=DEFAULT_WORKDIR, rows=1000000, features=8,
                 batches_per_epoch=100000, threads=4, epochs=None, lr=0.01,
                 seed=0, data_format='parquet', max_to_keep=3, read_delay=0.0):
        self.workdir = workdir
        self.rows = rows
        self.features = features
        self.batches_per_epoch = batches_per_epoch
        self.threads = threads
        self.epochs = epochs
        self.lr = lr
        self.seed = seed
        self.data_format = data_format
        self.max_to_keep = max_to_keep
        self.read_delay = read_delay

    @property
    def data_dir(self):
        return os.path.join(self.workdir, 'data')

    @property
    def checkpoint_dir(self):
        return os.path.join(self.workdir, 'checkpoints')

    @property
    def model_path(self):
        return os.path.join(self.workdir, 'model')

    def columns(self):
        return ['x%d' % i for i in range(self.features)] + ['y']


# ------------------------------------------------------------------ data --

def true_model(features, seed):
    """The weights and bias the data is generated from."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(-2.0, 2.0, size=features).astype(np.float32)
    b = np.float32(rng.uniform(-1.0, 1.0))
    return w, b


def make_data(cfg):
    """Writes the data file(s) unless they exist; returns their paths."""
    os.makedirs(cfg.data_dir, exist_ok=True)
    if cfg.data_format == 'parquet':
        paths = [os.path.join(cfg.data_dir, 'train.parquet')]
    else:
        paths = [os.path.join(cfg.data_dir, c + '.npy') for c in cfg.columns()]
    if all(os.path.exists(p) for p in paths):
        return paths
    rng = np.random.default_rng(cfg.seed + 1)
    x = rng.normal(size=(cfg.rows, cfg.features)).astype(np.float32)
    w, b = true_model(cfg.features, cfg.seed)
    noise = rng.normal(scale=0.1, size=cfg.rows).astype(np.float32)
    y = (x @ w + b + noise).astype(np.float32)
    columns = {('x%d' % i): x[:, i] for i in range(cfg.features)}
    columns['y'] = y
    if cfg.data_format == 'parquet':
        write_parquet(paths[0], [(c, columns[c]) for c in cfg.columns()])
    else:
        for column, path in zip(cfg.columns(), paths):
            with open(path + '.partial', 'wb') as f:
                np.save(f, columns[column])
            os.replace(path + '.partial', path)
    return paths


def write_parquet(path, columns):
    """Writes ``[(name, 1-D array)]`` as a Parquet file with ferrocaffe's own
    ParquetWriter (the file appears complete, or not at all)."""
    writer = ParquetWriter(path, Struct(*[
        (name, Scalar(values.dtype)) for name, values in columns]))
    ws = workspace.Workspace()
    init, write = core.Net('init'), core.Net('write')
    finish = core.Net('finish')
    writer.setup_ex(init, finish)
    for name, values in columns:
        ws.feed_blob('data/' + name, values)
    writer.write(write, ['data/' + name for name, _ in columns])
    for net in (init, write, finish):
        ws.run(net)


def make_reader(cfg, paths):
    if cfg.data_format == 'parquet':
        return ParquetReader(paths[0], cfg.columns(), batch_size=1,
                             name='train_reader')
    return NpyReader(list(zip(cfg.columns(), paths)), batch_size=1,
                     name='train_reader')


# ------------------------------------------------------------------- job --

def model_blobs(cfg):
    return ['model/w%d' % i for i in range(cfg.features)] + ['model/b']


def build_job(cfg):
    """The Job, and the names of its model blobs."""
    paths = make_data(cfg)
    reader = make_reader(cfg, paths)
    weights = model_blobs(cfg)[:-1]
    bias = 'model/b'

    with Job() as job, Node(NODE):
        with job.init_group, Task(name='init'):
            # The model and the reader are state: created once, then
            # carried from epoch to epoch by the checkpoints.
            for blob in weights + [bias]:
                ops.ConstantFill([], [blob], shape=[1], value=0.0)
            ops.ConstantFill([], ['stats/rows'], shape=[1], value=0,
                             dtype=core.DataType.INT64)
            ops.ConstantFill([], ['stats/sq_error'], shape=[1], value=0.0)
            reader.setup_ex(ops, None)

        def sgd_step(rec):
            """One SGD step on one record: pred = x . w + b, then
            w -= lr * (pred - y) * x and b -= lr * (pred - y)."""
            xs = [rec[c]() for c in cfg.columns()[:-1]]
            y = rec['y']()
            terms = [ops.Mul([w, x]) for w, x in zip(weights, xs)]
            pred = ops.Sum(terms + [bias])
            err = ops.Sub([pred, y])
            step = ops.Scale(err, scale=-cfg.lr)
            one = ops.ConstantFill([], shape=[1], value=1.0)
            for w, x in zip(weights, xs):
                ops.WeightedSum([w, one, x, step], [w])
            ops.Add([bias, step], [bias])
            ops.Add(['stats/sq_error', ops.Mul([err, err])],
                    ['stats/sq_error'])
            ops.Add(['stats/rows', ops.ConstantFill(
                [], shape=[1], value=1, dtype=core.DataType.INT64)],
                ['stats/rows'])

        source = reader
        if cfg.read_delay:
            source = ReaderWithDelay(reader, cfg.read_delay)
        limited = ReaderWithLimit(source, num_iter=cfg.batches_per_epoch)
        pipe(limited, num_threads=cfg.threads, processor=sgd_step,
             name='sgd')
        job.add_stop_condition(limited.data_finished())
        if cfg.epochs:
            epoch_limiter(job, cfg.epochs)
        job.track_progress(batches='stats/rows', rows='stats/rows')

        with job.exit_group, Task(name='write_model'):
            ops.Save(weights + [bias], [], db=cfg.model_path,
                     db_type='ferro', absolute_path=True)
    return job


def checkpoint_manager(cfg):
    return CheckpointManager(
        cfg.checkpoint_dir, NODE, 'ferro',
        metadata_handler=FileMetadataHandler(max_to_keep=cfg.max_to_keep))


def read_model(path):
    """``(weights, bias)`` from the db the exit group wrote."""
    ws = workspace.Workspace()
    names = [e['name'] for e in _core.list_db(path, 'ferro')]
    ws.run(core.CreateOperator('Load', [], names, db=path, db_type='ferro',
                               absolute_path=True))
    weights = [float(ws.fetch_blob(n)[0]) for n in sorted(
        (n for n in names if n.startswith('model/w')),
        key=lambda n: int(n[len('model/w'):]))]
    return np.array(weights, np.float32), float(ws.fetch_blob('model/b')[0])


# ------------------------------------------------------------------ main --

def remove_outputs(cfg):
    """Deletes what the example makes in its workdir: the checkpoints, the
    model and the data (and the workdir itself once empty)."""
    for path in (cfg.checkpoint_dir, cfg.data_dir, cfg.model_path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
    try:
        os.rmdir(cfg.workdir)
    except OSError:  # missing, or holding files the example did not make
        pass


def parse_args(argv=None):
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--workdir', default=d.workdir,
                   help='data, checkpoints and model (default: %(default)s)')
    p.add_argument('--rows', type=int, default=d.rows)
    p.add_argument('--features', type=int, default=d.features)
    p.add_argument('--batches-per-epoch', type=int,
                   default=d.batches_per_epoch)
    p.add_argument('--threads', type=int, default=d.threads)
    p.add_argument('--epochs', type=int, default=None,
                   help='stop after this many epochs (default: when the '
                        'data is exhausted)')
    p.add_argument('--lr', type=float, default=d.lr)
    p.add_argument('--seed', type=int, default=d.seed)
    p.add_argument('--data-format', choices=['parquet', 'npy'],
                   default=d.data_format)
    p.add_argument('--read-delay', type=float, default=0.0,
                   help='seconds to wait before reading each record (a slow '
                        'source: time to try Ctrl-C)')
    p.add_argument('--fresh', action='store_true',
                   help='delete what earlier runs made in the workdir '
                        '(checkpoints, model, data) and start over')
    p.add_argument('--no-progress', action='store_true')
    p.add_argument('--session', choices=['local', 'ray'], default='local',
                   help="'ray' runs the job's node as a Ray actor (needs "
                        "pip install 'ferrocaffe[ray]'; joins the cluster "
                        "of RAY_ADDRESS, or starts a local one)")
    p.add_argument('--verbose', action='store_true')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format='%(levelname)s %(name)s: %(message)s')
    cfg = Config(workdir=args.workdir, rows=args.rows,
                 features=args.features,
                 batches_per_epoch=args.batches_per_epoch,
                 threads=args.threads, epochs=args.epochs, lr=args.lr,
                 seed=args.seed, data_format=args.data_format,
                 read_delay=args.read_delay)
    if args.fresh:
        remove_outputs(cfg)
    print('workdir %s' % cfg.workdir, flush=True)
    epochs = [e for e, nodes in find_checkpoints(cfg.checkpoint_dir).items()
              if NODE in nodes]
    if epochs:
        print('checkpoints found up to epoch %d: resuming from the newest '
              'one that verifies' % max(epochs), flush=True)

    job = build_job(cfg)
    runner = JobRunner(job, checkpoint_manager(cfg),
                       resume_from_epoch='latest',
                       progress=False if args.no_progress else None)
    if args.session == 'ray':
        from ferrocaffe.distributed import RaySession
        session = RaySession()
    else:
        session = LocalSession(workspace.Workspace())
    start = time.time()
    try:
        last_epoch = runner.train(session)
    except KeyboardInterrupt:
        print('run the same command again to resume from the last complete '
              'checkpoint (epoch %s)' % runner.last_checkpoint_epoch,
              file=sys.stderr, flush=True)
        return 130
    finally:
        session.close()
    elapsed = time.time() - start

    w, b = read_model(cfg.model_path)
    w_true, b_true = true_model(cfg.features, cfg.seed)
    if runner.resumed_from_epoch is not None:
        print('resumed from epoch %d' % runner.resumed_from_epoch)
        if runner.epoch is None:
            print('the job had finished; its exit group ran again (a larger '
                  '--epochs extends a run that stopped at its limit)')
    print('trained through epoch %d in %.1fs; %d failed checkpoint saves' % (
        last_epoch, elapsed, len(runner.failed_saves)))
    print('model written to %s' % cfg.model_path)
    print('weights %s' % np.array2string(w, precision=3))
    print('true    %s' % np.array2string(w_true, precision=3))
    print('bias %.3f (true %.3f); max |w - w_true| = %.4f' % (
        b, b_true, float(np.max(np.abs(w - w_true)))))
    return 0


if __name__ == '__main__':
    sys.exit(main())
