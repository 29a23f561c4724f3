"""A Caffe2 training Job with checkpoints, run through the caffe2 alias.

Written as a Caffe2 (2018) program: the only ferrocaffe lines are the two
below that register the alias (ferrocaffe installed, or python/ on
PYTHONPATH), so that ``from caffe2.python import ...`` imports ferrocaffe's
modules. Everything else is Caffe2's API:

* the digits (scikit-learn's 8x8 images, shipped in its wheel) are written
  to two minidb files of ``TensorProtos`` records (``core.C.create_db``),
  read back with ``brew.db_input``;
* a model built with ``model_helper.ModelHelper`` and ``brew`` (two
  ``fc`` + ``relu`` layers, ``softmax``, ``LabelCrossEntropy``,
  ``AveragedLoss``), ``AddGradientOperators`` and ``optimizer.build_adam``;
* a ``checkpoint.Job`` on one ``Node``: the init group runs the
  ``param_init_net`` (parameters, Adam's moments and iteration, the db
  reader); each epoch is a ``Task`` looping ``ops.net(model.net)`` over one
  pass of the training db; ``epoch_limiter`` stops it; the download group
  writes the trained parameters to a minidb; the exit group evaluates the
  360 held-out digits (a ``Task`` with an output);
* ``JobRunner`` with a ``CheckpointManager`` (minidb, one db per epoch) and
  a ``LocalSession`` on a workspace of its own.

Run it; kill it; run it again with ``--resume-from-epoch N`` (an epoch whose
checkpoint exists, ``<workdir>/checkpoints/trainer.N``): it loads that
checkpoint (the parameters, Adam's state and the reader's position) and
ends with the same weights as an uninterrupted run::

    python examples/caffe2_job_via_alias.py --workdir /tmp/c2job
    python examples/caffe2_job_via_alias.py --workdir /tmp/c2job \\
        --resume-from-epoch 3

With the defaults (10 epochs, Adam at 0.005) it reaches 97.8% test
accuracy (at least 95%).
"""

import argparse
import logging
import os
import tempfile

import numpy as np

import ferrocaffe
ferrocaffe.register_caffe2_alias()

from caffe2.proto import caffe2_pb2  # noqa: E402
from caffe2.python import (  # noqa: E402
    brew, core, model_helper, optimizer, utils, workspace)
from caffe2.python.checkpoint import (  # noqa: E402
    CheckpointManager, Job, JobRunner, epoch_limiter)
from caffe2.python.net_builder import ops  # noqa: E402
from caffe2.python.session import LocalSession  # noqa: E402
from caffe2.python.task import Node, Task  # noqa: E402

NODE = 'trainer'
TEST_SIZE = 360
BATCH_SIZE = 64
HIDDEN = [64, 32]


def digits_to_minidb(path, images, labels):
    """One TensorProtos record (image, label) per digit."""
    db = core.C.create_db('minidb', path, core.C.Mode.new)
    txn = db.new_transaction()
    for n, (image, label) in enumerate(zip(images, labels)):
        record = caffe2_pb2.TensorProtos()
        record.protos.extend([utils.NumpyArrayToCaffe2Tensor(image),
                              utils.NumpyArrayToCaffe2Tensor(label)])
        txn.put('digit_%05d' % n, record.SerializeToString())
    txn.commit()
    db.close()


def write_data(folder):
    """The digits as float32 rows of 64 pixels in [0, 1] and int32 labels,
    shuffled (seed 0); the last 360 are the test split."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    images = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int32)
    order = np.random.RandomState(0).permutation(len(labels))
    images, labels = images[order], labels[order]
    train = os.path.join(folder, 'train.minidb')
    test = os.path.join(folder, 'test.minidb')
    if not os.path.exists(train):
        digits_to_minidb(train, images[:-TEST_SIZE], labels[:-TEST_SIZE])
    if not os.path.exists(test):
        digits_to_minidb(test, images[-TEST_SIZE:], labels[-TEST_SIZE:])
    return train, test, len(labels) - TEST_SIZE


def mlp(model, data):
    dims = [64] + HIDDEN
    blob = data
    for i in range(len(HIDDEN)):
        blob = brew.fc(model, blob, 'fc%d' % (i + 1), dims[i], dims[i + 1])
        blob = brew.relu(model, blob, blob)
    pred = brew.fc(model, blob, 'pred', dims[-1], 10)
    return brew.softmax(model, pred, 'softmax')


def build_train_model(train_db, lr):
    model = model_helper.ModelHelper(name='train')
    data, label = brew.db_input(model, blobs_out=['data', 'label'],
                                batch_size=BATCH_SIZE, db=train_db,
                                db_type='minidb')
    softmax = mlp(model, data)
    xent = model.LabelCrossEntropy([softmax, label], 'xent')
    loss = model.AveragedLoss(xent, 'loss')
    brew.accuracy(model, [softmax, label], 'accuracy')
    model.AddGradientOperators([loss])
    optimizer.build_adam(model, base_learning_rate=lr)
    # Seeded fillers: the same initial weights in every run.
    for i, op in enumerate(model.param_init_net.Proto().op):
        op.device_option.random_seed = 100 + i
    return model


def build_test_model(test_db):
    model = model_helper.ModelHelper(name='test', init_params=False)
    data, label = brew.db_input(model, blobs_out=['test_data', 'test_label'],
                                batch_size=TEST_SIZE, db=test_db,
                                db_type='minidb')
    softmax = mlp(model, data)
    brew.accuracy(model, [softmax, label], 'test_accuracy')
    return model


def build_job(train_model, test_model, batches_per_epoch, epochs,
              model_path):
    params = [str(p) for p in train_model.params]
    export = core.Net('export_model')
    export.Save(params, [], db=model_path, db_type='minidb',
                absolute_path=True)
    with Job() as job:
        with Node(NODE):
            with job.init_group:
                Task(step=train_model.param_init_net)
            with job.epoch_group:
                with Task():
                    with ops.loop(batches_per_epoch):
                        ops.net(train_model.net)
            epoch_limiter(job, epochs)
            with job.download_group:
                Task(step=export)
            with job.exit_group:
                with Task() as evaluation:
                    ops.net(test_model.param_init_net)
                    ops.net(test_model.net)
                    evaluation.add_output('test_accuracy')
    return job, evaluation


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--workdir', default=os.path.join(
        tempfile.gettempdir(), 'caffe2_job_via_alias'))
    parser.add_argument('--data-dir', default=None,
                        help='where the digits dbs are written (default: '
                             'the workdir)')
    parser.add_argument('--epochs', type=int, default=10)
    parser.add_argument('--lr', type=float, default=0.005)
    parser.add_argument('--resume-from-epoch', type=int, default=None)
    parser.add_argument('--verbose', action='store_true')
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO)
    data_dir = args.data_dir or args.workdir
    for folder in (args.workdir, data_dir):
        if not os.path.isdir(folder):
            os.makedirs(folder)
    train_db, test_db, train_size = write_data(data_dir)
    batches_per_epoch = train_size // BATCH_SIZE

    train_model = build_train_model(train_db, args.lr)
    test_model = build_test_model(test_db)
    model_path = os.path.join(args.workdir, 'model.minidb')
    job, evaluation = build_job(train_model, test_model, batches_per_epoch,
                                args.epochs, model_path)

    job.compile(LocalSession)
    session = LocalSession(workspace.C.Workspace())
    checkpoint_dir = os.path.join(args.workdir, 'checkpoints')
    if not os.path.isdir(checkpoint_dir):
        os.makedirs(checkpoint_dir)
    checkpoint = CheckpointManager(checkpoint_dir, NODE, 'minidb')
    runner = JobRunner(job, checkpoint,
                       resume_from_epoch=args.resume_from_epoch)
    last_epoch = runner.train(session)

    accuracy = float(evaluation.outputs()[0].fetch())
    print('trained through epoch %d' % last_epoch)
    print('model written to %s' % model_path)
    print('test accuracy %.4f' % accuracy)
    return accuracy


if __name__ == '__main__':
    main()
