"""The main job: a multi-layer network trained on handwritten digits in a
checkpointed Job (Caffe2's checkpoint.Job, made real), to a stated test
accuracy.

* **Data**: scikit-learn's 8x8 handwritten digits (1,797 images shipped
  inside the scikit-learn wheel: nothing is downloaded), pixels scaled to
  [0, 1], shuffled once and split into 1,437 training and 360 held-out test
  images.  The first run writes both splits to ``<workdir>/data`` as
  ``.npy`` files; every run reads them from there.
* **Model**: built as Caffe2 programs built theirs, with
  ``model_helper.ModelHelper``, ``brew.fc`` / ``brew.relu``,
  ``SoftmaxWithLoss``, ``AddGradientOperators`` and
  ``optimizer.build_sgd`` (momentum 0.9): 64 -> 128 -> 64 -> 10 by default
  (``--hidden``; examples/lenet_digits.py trains LeNet in this same job).
* The **init group** runs the model's ``param_init_net`` (seeded fillers)
  and creates the reader of the training file.
* The **epoch group** pipes the training file through ``--threads``
  threads, in batches of ``--batch-size``, into the training net (a
  ``NetProcessor``: forward, backward and update on the shared parameters,
  Hogwild! with several threads).  The reader is rewound at the start of
  every epoch, so an epoch is one pass over the training images.
* **Stop condition**: the epoch limit (``--epochs``).
* The **exit group** reads the test file, runs the test net (the same
  layers, ``init_params=False``, ``Softmax`` and ``Accuracy``) and writes
  the parameters and the test accuracy to ``<workdir>/model`` (a ferro db).
* A checkpoint is saved after every epoch (``<workdir>/checkpoints``, the
  newest 3 kept, with a manifest).

Run it; press Ctrl-C during training; run it again: it resumes from the
last complete checkpoint::

    python examples/train_job.py
    python examples/train_job.py --fresh          # start over
    python -m ferrocaffe.checkpoint ls /tmp/ferrocaffe_train_job/checkpoints

A finished run can be extended: run it again with a larger ``--epochs``
and it goes on from its last epoch (each checkpoint records the epoch and
whether the job had stopped there; the limit belongs to the job)::

    python examples/train_job.py --epochs 10
    python examples/train_job.py --epochs 20      # epochs 11 to 20

``--fresh`` deletes everything the example made in its workdir
(checkpoints, model and data) before starting over.

With ``--threads 1`` the run is deterministic: an interrupted and resumed
run, or an extended one, ends with exactly the weights of an uninterrupted
one, bit for bit.  With several threads the updates interleave (Hogwild!)
and the weights differ from run to run, the accuracy does not.
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

from ferrocaffe import (  # noqa: E402
    _core, brew, core, model_helper, optimizer, workspace)
from ferrocaffe.checkpoint import (  # noqa: E402
    CheckpointManager, FileMetadataHandler, Job, JobRunner, epoch_limiter,
    find_checkpoints)
from ferrocaffe.dataio import Reader, ReaderWithDelay  # noqa: E402
from ferrocaffe.file_reader import NpyReader  # noqa: E402
from ferrocaffe.net_builder import ops  # noqa: E402
from ferrocaffe.pipeline import NetProcessor, pipe  # noqa: E402
from ferrocaffe.schema import Scalar, Struct  # noqa: E402
from ferrocaffe.session import LocalSession  # noqa: E402
from ferrocaffe.task import Node, Task  # noqa: E402

DEFAULT_WORKDIR = os.path.join(tempfile.gettempdir(), 'ferrocaffe_train_job')
NODE = 'trainer'
PIXELS = 64
CLASSES = 10
TEST_IMAGES = 360
TRAIN_IMAGES = 1797 - TEST_IMAGES


class MLP(object):
    """The example's network: fully connected layers of ``hidden`` widths
    with ReLU, then the 10 class scores.

    A network for the job is any object with ``add_layers(model, data)``
    (from the input rows, ``(N, 64)`` float32, to the class scores; returns
    the scores' blob), ``describe()``, and the class methods
    ``add_arguments(parser, default)`` and ``from_args(args)`` (its command
    line options): examples/lenet_digits.py trains LeNet in this same job.
    """

    def __init__(self, hidden=(128, 64)):
        self.hidden = tuple(hidden)

    def add_layers(self, model, data):
        h, dim = data, PIXELS
        for i, width in enumerate(self.hidden):
            h = brew.fc(model, h, 'fc%d' % (i + 1), dim_in=dim, dim_out=width)
            h = brew.relu(model, h, h)
            dim = width
        return brew.fc(model, h, 'pred', dim_in=dim, dim_out=CLASSES)

    def describe(self):
        return ' -> '.join(
            str(d) for d in (PIXELS,) + self.hidden + (CLASSES,))

    @classmethod
    def add_arguments(cls, parser, default):
        parser.add_argument(
            '--hidden', type=int, nargs='*', default=list(default.hidden),
            help='widths of the hidden layers (default: %(default)s)')

    @classmethod
    def from_args(cls, args):
        return cls(args.hidden)


class Config(object):
    """The job's network, sizes and paths (the defaults are the
    example's)."""

    def __init__(self, workdir=DEFAULT_WORKDIR, epochs=20, threads=2,
                 batch_size=64, network=None, lr=0.1, momentum=0.9,
                 seed=0, max_to_keep=3, read_delay=0.0):
        self.workdir = workdir
        self.epochs = epochs
        self.threads = threads
        self.batch_size = batch_size
        self.network = network if network is not None else MLP()
        self.lr = lr
        self.momentum = momentum
        self.seed = seed
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

    def data_path(self, split, field):
        return os.path.join(self.data_dir, '%s_%s.npy' % (split, field))


# ------------------------------------------------------------------ data --

def digits_split(seed=0):
    """``(x_train, y_train, x_test, y_test)``: scikit-learn's digits, pixels
    scaled to [0, 1] (float32), labels int32, shuffled with ``seed``; the
    last ``TEST_IMAGES`` images are the held-out test split."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    cut = len(y) - TEST_IMAGES
    return x[:cut], y[:cut], x[cut:], y[cut:]


def make_data(cfg):
    """Writes the two splits as .npy files unless they exist (each file
    appears complete or not at all)."""
    os.makedirs(cfg.data_dir, exist_ok=True)
    paths = [cfg.data_path(s, f) for s in ('train', 'test')
             for f in ('data', 'label')]
    if all(os.path.exists(p) for p in paths):
        return
    x_train, y_train, x_test, y_test = digits_split(cfg.seed)
    for path, array in zip(paths, (x_train, y_train, x_test, y_test)):
        with open(path + '.partial', 'wb') as f:
            np.save(f, array)
        os.replace(path + '.partial', path)


def make_reader(cfg, split, batch_size, name):
    return NpyReader([('data', cfg.data_path(split, 'data')),
                      ('label', cfg.data_path(split, 'label'))],
                     batch_size=batch_size, name=name)


class EpochReader(Reader):
    """Reads all of ``reader`` in every epoch: the reader is rewound in the
    init net of the pipe that reads it, which runs at the start of each
    epoch."""

    def __init__(self, reader):
        Reader.__init__(self, schema=reader.schema())
        self.reader = reader

    def setup_ex(self, init_net, finish_net):
        self.reader.setup_ex(init_net, finish_net)
        self.reader.reset(init_net)

    def read_ex(self, init_net, finish_net):
        return self.reader.read_ex(init_net, finish_net)

    def read(self, read_net):
        return self.reader.read(read_net)


# ----------------------------------------------------------------- model --

def build_train_model(cfg):
    """The training model: its net reads its input record (``data``,
    ``label``), computes the loss, the gradients and the SGD updates."""
    model = model_helper.ModelHelper(name='train')
    rec = model.net.set_input_record(Struct(
        ('data', Scalar((np.float32, (PIXELS,)))),
        ('label', Scalar(np.int32))))
    pred = cfg.network.add_layers(model, rec.data())
    softmax, loss = model.net.SoftmaxWithLoss([pred, rec.label()],
                                              ['softmax', 'loss'])
    # The batch's accuracy, for the progress display (no gradient).
    model.Accuracy([softmax, rec.label()], 'accuracy')
    model.AddGradientOperators([loss])
    # The rate drops tenfold every 10 epochs (in iterations: batches).
    batches = -(-TRAIN_IMAGES // cfg.batch_size)
    optimizer.build_sgd(model, base_learning_rate=cfg.lr,
                        momentum=cfg.momentum, policy='step',
                        stepsize=10 * batches, gamma=0.1)
    # Seeded fillers: every run starts from the same weights.
    for i, op in enumerate(model.param_init_net.Proto().op):
        op.device_option.random_seed = cfg.seed * 1000 + i + 1
    return model


def build_test_model(cfg, data, label):
    """The same layers on the trained parameters, and their accuracy."""
    model = model_helper.ModelHelper(name='test', init_params=False)
    pred = cfg.network.add_layers(model, data)
    softmax = brew.softmax(model, pred, 'test_softmax')
    model.Accuracy([softmax, label], 'test_accuracy')
    return model


# ------------------------------------------------------------------- job --

def build_job(cfg, model=None, track_loss=True):
    """The Job, and the names of the blobs the model db holds. ``model``:
    the training model (``build_train_model(cfg)`` when None).
    ``track_loss``: the loss and accuracy of the first pipe thread's last
    batch of each epoch are kept where the job can fetch them, and tracked
    (``Job.track_scalars``: the JobRunner's progress shows them, and a
    JobRunner given a ``summary`` logs them as ``train/loss`` and
    ``train/accuracy``)."""
    make_data(cfg)
    train_reader = make_reader(cfg, 'train', cfg.batch_size, 'train_reader')
    if model is None:
        model = build_train_model(cfg)
    params = [str(p) for p in model.GetParams()]

    with Job() as job, Node(NODE):
        with job.init_group, Task(name='init'):
            # The parameters, the optimizer's state and the reader are
            # created once, then carried from epoch to epoch by the
            # checkpoints.
            ops.net(model.param_init_net)
            train_reader.setup_ex(ops, None)

        source = EpochReader(train_reader)
        if cfg.read_delay:
            source = ReaderWithDelay(source, cfg.read_delay)
        processor = NetProcessor(model.net)
        pipe(source, num_threads=cfg.threads, processor=processor,
             name='train')
        epoch_limiter(job, cfg.epochs)

        if track_loss:
            # Each of the pipe's threads runs a clone of the net whose own
            # blobs are renamed (NetProcessor.blob_maps). A blob made under
            # such a name before the threads start is shared, not made
            # again by the thread: the first thread's loss is tracked.
            names = processor.blob_maps()[0]
            tracked = {'train/loss': names['loss']}
            if 'accuracy' in names:
                tracked['train/accuracy'] = names['accuracy']
            with job.init_group, Task(name='init_loss'):
                for blob in tracked.values():
                    ops.ConstantFill([], [blob], shape=[], value=0.0)
            job.track_scalars(**tracked)

        with job.exit_group, Task(name='evaluate_and_write_model'):
            test_reader = make_reader(cfg, 'test', TEST_IMAGES, 'test_reader')
            evaluate = core.Net('read_test_data')
            test_reader.setup_ex(evaluate, None)
            _, (data, label) = test_reader.read(evaluate)
            test_model = build_test_model(cfg, data, label)
            ops.net(evaluate)
            ops.net(test_model.net)
            ops.Save(params + ['test_accuracy'], [], db=cfg.model_path,
                     db_type='ferro', absolute_path=True)
    return job, params


def checkpoint_manager(cfg):
    return CheckpointManager(
        cfg.checkpoint_dir, NODE, 'ferro',
        metadata_handler=FileMetadataHandler(max_to_keep=cfg.max_to_keep))


def checkpoint_misfits(cfg, model):
    """``[(blob, shape in the newest checkpoint, shape in the model)]`` for
    the model's parameters whose shapes differ (a checkpoint of another
    network, e.g. other ``--hidden`` widths); empty when there is no
    checkpoint or it fits."""
    epochs = {e: n[NODE] for e, n in find_checkpoints(cfg.checkpoint_dir).items()
              if NODE in n}
    if not epochs:
        return []
    path = epochs[max(epochs)]
    try:
        saved = {e['name']: tuple(e['shape']) for e in _core.list_db(path, 'ferro')}
    except Exception:  # a damaged newest checkpoint: the runner skips it
        return []
    ws = workspace.Workspace()
    ws.run(model.param_init_net)
    misfits = []
    for p in model.GetParams():
        want = tuple(ws.fetch_blob(str(p)).shape)
        have = saved.get(str(p))
        if have is not None and have != want:
            misfits.append((str(p), have, want))
    return misfits


def read_model(path):
    """``{blob name: array}`` from the db the exit group wrote (the
    parameters and ``test_accuracy``)."""
    ws = workspace.Workspace()
    names = [e['name'] for e in _core.list_db(path, 'ferro')]
    ws.run(core.CreateOperator('Load', [], names, db=path, db_type='ferro',
                               absolute_path=True))
    return {n: ws.fetch_blob(n) for n in names}


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


def parse_args(argv=None, defaults=None, description=None):
    """The command line; ``defaults`` (a Config) gives the default values
    and the network, whose own options it adds."""
    d = defaults if defaults is not None else Config()
    p = argparse.ArgumentParser(
        description=description or __doc__.split('\n\n')[0])
    p.add_argument('--workdir', default=d.workdir,
                   help='data, checkpoints and model (default: %(default)s)')
    p.add_argument('--epochs', type=int, default=d.epochs,
                   help='passes over the training images (default: '
                        '%(default)s); a larger value extends a finished run')
    p.add_argument('--threads', type=int, default=d.threads,
                   help='pipeline threads (default: %(default)s; 1 is '
                        'deterministic)')
    p.add_argument('--batch-size', type=int, default=d.batch_size)
    type(d.network).add_arguments(p, d.network)
    p.add_argument('--lr', type=float, default=d.lr)
    p.add_argument('--momentum', type=float, default=d.momentum)
    p.add_argument('--seed', type=int, default=d.seed)
    p.add_argument('--read-delay', type=float, default=0.0,
                   help='seconds to wait before reading each batch (a slow '
                        'source: time to try Ctrl-C)')
    p.add_argument('--fresh', action='store_true',
                   help='delete what earlier runs made in the workdir '
                        '(checkpoints, model, data) and start over')
    p.add_argument('--no-progress', action='store_true')
    p.add_argument('--tensorboard', metavar='LOGDIR', default=None,
                   help="write TensorBoard logs to LOGDIR: the training "
                        "loss, epoch times, rows per second, checkpoint "
                        "save times, the test accuracy and the training "
                        "net's graph (needs pip install "
                        "'ferrocaffe[tensorboard]'; then tensorboard "
                        "--logdir LOGDIR)")
    p.add_argument('--session', choices=['local', 'ray'], default='local',
                   help="'ray' runs the job's node as a Ray actor (needs "
                        "pip install 'ferrocaffe[ray]'; joins the cluster "
                        "of RAY_ADDRESS, or starts a local one)")
    p.add_argument('--verbose', action='store_true')
    return p.parse_args(argv)


def config_from_args(args, defaults=None):
    d = defaults if defaults is not None else Config()
    return Config(workdir=args.workdir, epochs=args.epochs,
                  threads=args.threads, batch_size=args.batch_size,
                  network=type(d.network).from_args(args), lr=args.lr,
                  momentum=args.momentum, seed=args.seed,
                  max_to_keep=d.max_to_keep, read_delay=args.read_delay)


def train(cfg, args):
    """Runs the job (from the newest checkpoint that verifies, if any) and
    prints what it did; returns the model db's blobs (``read_model``), or
    None when Ctrl-C stopped it. Checkpoints of another network in the
    workdir stop it before training (SystemExit 2, saying how to start
    over)."""
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format='%(levelname)s %(name)s: %(message)s')
    if args.fresh:
        remove_outputs(cfg)
    print('workdir %s' % cfg.workdir, flush=True)
    model = build_train_model(cfg)
    misfits = checkpoint_misfits(cfg, model)
    if misfits:
        blob, have, want = misfits[0]
        print('the checkpoints in %s were made by another network: %s has '
              'shape %s there and %s in this one (%s); run with --fresh to '
              'start over, or give another --workdir' % (
                  cfg.checkpoint_dir, blob, list(have), list(want),
                  cfg.network.describe()), file=sys.stderr, flush=True)
        raise SystemExit(2)
    epochs = [e for e, nodes in find_checkpoints(cfg.checkpoint_dir).items()
              if NODE in nodes]
    if epochs:
        print('checkpoints found up to epoch %d: resuming from the newest '
              'one that verifies' % max(epochs), flush=True)
    job, params = build_job(cfg, model)
    summary = None
    if args.tensorboard:
        from ferrocaffe.tensorboard import ScalarLogger
        summary = ScalarLogger(args.tensorboard)
        summary.add_graph([model.param_init_net, model.net])
    runner = JobRunner(job, checkpoint_manager(cfg),
                       resume_from_epoch='latest',
                       progress=False if args.no_progress else None,
                       summary=summary)
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
        if summary is not None:
            summary.close()
        return None
    finally:
        session.close()
    elapsed = time.time() - start

    model = read_model(cfg.model_path)
    if summary is not None:
        summary.add_scalar('test/accuracy', float(model['test_accuracy']),
                           last_epoch)
        summary.close()
        print('TensorBoard logs in %s (tensorboard --logdir %s)' % (
            args.tensorboard, args.tensorboard))
    if runner.resumed_from_epoch is not None:
        print('resumed from epoch %d' % runner.resumed_from_epoch)
        if runner.epoch is None:
            print('the job had finished; its exit group ran again (a larger '
                  '--epochs extends it)')
    print('trained through epoch %d in %.1fs; %d failed checkpoint saves' % (
        last_epoch, elapsed, len(runner.failed_saves)))
    print('network %s, %d parameters, model written to %s' % (
        cfg.network.describe(), sum(model[p].size for p in params),
        cfg.model_path))
    print('test accuracy %.2f%% on %d held-out digits' % (
        100.0 * float(model['test_accuracy']), TEST_IMAGES), flush=True)
    return model


def main(argv=None):
    args = parse_args(argv)
    try:
        model = train(config_from_args(args), args)
    except KeyboardInterrupt:
        # Before the job started (writing the data, building the nets):
        # nothing to resume yet, and the data files are whole or absent.
        print('interrupted before training started; run the same command '
              'again to start', file=sys.stderr, flush=True)
        return 130
    return 130 if model is None else 0


if __name__ == '__main__':
    sys.exit(main())
