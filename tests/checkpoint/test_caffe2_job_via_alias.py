"""examples/caffe2_job_via_alias.py (issue 14): a Caffe2 program (only the
alias line added) that builds a model with model_helper/brew, adds its
gradients and Adam, and trains it in a checkpointed Job (init, epoch,
download and exit groups) run by JobRunner in a LocalSession.

Checked here, in child processes running the unmodified script: the
training loss (computed with numpy from the weights of every epoch's
checkpoint) falls, the test accuracy (a numpy forward pass over the
held-out digits, prepared here from scikit-learn) reaches the stated 95%,
and a run killed (SIGKILL) after epoch 5 and rerun with
``--resume-from-epoch`` ends with exactly the weights of the uninterrupted
run."""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from _support import EXAMPLES, PKG_PARENT
from ferrocaffe import _core, core, workspace

SCRIPT = os.path.join(EXAMPLES, 'caffe2_job_via_alias.py')
EPOCHS = 10
KILL_AFTER = 5  # epoch 5 runs, then the process dies before its checkpoint
LAYERS = ['fc1', 'fc2', 'pred']

# Runs the script unmodified in this process, after arranging that the
# process kills itself (SIGKILL: no cleanup, no exit handlers) as soon as
# the JobRunner logs that epoch KILL_AFTER has finished.
KILLER = '''
import logging, os, runpy, signal, sys
class Kill(logging.Handler):
    def emit(self, record):
        if record.getMessage() == 'Finished epoch %d':
            os.kill(os.getpid(), signal.SIGKILL)
logging.getLogger().addHandler(Kill())
logging.getLogger().setLevel(logging.INFO)
sys.argv = [%r] + sys.argv[1:]
runpy.run_path(%r, run_name='__main__')
''' % (KILL_AFTER, SCRIPT, SCRIPT)


def run(args, killer=False):
    command = ([sys.executable, '-c', KILLER] if killer
               else [sys.executable, SCRIPT])
    return subprocess.run(
        command + [str(a) for a in args],
        env=dict(os.environ, PYTHONPATH=PKG_PARENT, OPENBLAS_NUM_THREADS='1'),
        capture_output=True, text=True, timeout=900)


def digits():
    """The split the script states: pixels / 16 as float32, int32 labels,
    shuffled by numpy's RandomState(0), the last 360 held out."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int32)
    order = np.random.RandomState(0).permutation(len(y))
    x, y = x[order], y[order]
    return (x[:-360], y[:-360]), (x[-360:], y[-360:])


def load(path, names=None):
    """The named blobs (all, by default) of a minidb."""
    ws = workspace.Workspace()
    if names is None:
        names = [e['name'] for e in _core.list_db(path, 'minidb')]
    ws.run(core.CreateOperator('Load', [], names, db=path, db_type='minidb',
                               absolute_path=True))
    return {n: ws.fetch_blob(n) for n in names}


def scores(weights, x):
    h = x.astype(np.float64)
    for layer in LAYERS:
        h = h @ weights[layer + '_w'].T.astype(np.float64) + weights[layer + '_b']
        if layer != 'pred':
            h = np.maximum(h, 0.0)
    return h


def mean_cross_entropy(weights, x, y):
    s = scores(weights, x)
    s = s - s.max(axis=1, keepdims=True)
    log_p = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
    return float(-log_p[np.arange(len(y)), y].mean())


def param_names():
    return [layer + suffix for layer in LAYERS for suffix in ('_w', '_b')]


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp('digits_dbs')


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory, data_dir):
    workdir = tmp_path_factory.mktemp('uninterrupted')
    done = run(['--workdir', workdir, '--data-dir', data_dir])
    assert done.returncode == 0, done.stdout + done.stderr
    return workdir, done.stdout


def test_the_script_is_a_caffe2_program():
    source = open(SCRIPT).read()
    assert 'from ferrocaffe' not in source
    assert re.findall(r'^import ferrocaffe.*$|^ferrocaffe\..*$', source,
                      re.M) == ['import ferrocaffe',
                                'ferrocaffe.register_caffe2_alias()']


def test_the_loss_falls_and_the_accuracy_reaches_95_percent(uninterrupted):
    workdir, out = uninterrupted
    assert 'trained through epoch %d' % EPOCHS in out
    (x_train, y_train), (x_test, y_test) = digits()

    # Every epoch's checkpoint (epoch 0: before training) holds the
    # weights: the training loss computed from them falls.
    losses = []
    for epoch in range(EPOCHS + 1):
        path = os.path.join(workdir, 'checkpoints', 'trainer.%d' % epoch)
        losses.append(mean_cross_entropy(load(path, param_names()),
                                         x_train, y_train))
    assert abs(losses[0] - np.log(10)) < 0.2  # untrained: about uniform
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.1, losses

    # The model the download group wrote is the last epoch's weights, and
    # the numpy forward pass over the 360 held-out digits agrees with the
    # accuracy the exit group's Task output reported.
    model = load(os.path.join(workdir, 'model.minidb'))
    assert sorted(model) == sorted(param_names())
    last = load(os.path.join(workdir, 'checkpoints', 'trainer.%d' % EPOCHS),
                param_names())
    for name in model:
        np.testing.assert_array_equal(model[name], last[name])
    accuracy = float(np.mean(np.argmax(scores(model, x_test), 1) == y_test))
    printed = float(out.split('test accuracy ')[1].split()[0])
    assert abs(accuracy - printed) < 1e-4
    assert accuracy >= 0.95


def test_killed_then_resumed_ends_with_the_uninterrupted_weights(
        tmp_path, data_dir, uninterrupted):
    reference_dir, _ = uninterrupted
    killed = run(['--workdir', tmp_path, '--data-dir', data_dir], killer=True)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    checkpoints = os.path.join(tmp_path, 'checkpoints')
    epochs = sorted(int(f.split('.')[1]) for f in os.listdir(checkpoints)
                    if f.startswith('trainer.'))
    # Epoch 5 ran, but the process died before saving its checkpoint.
    assert epochs == list(range(KILL_AFTER))
    assert not os.path.exists(os.path.join(tmp_path, 'model.minidb'))

    resumed = run(['--workdir', tmp_path, '--data-dir', data_dir,
                   '--resume-from-epoch', epochs[-1]])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert 'trained through epoch %d' % EPOCHS in resumed.stdout
    got = load(os.path.join(tmp_path, 'model.minidb'))
    want = load(os.path.join(reference_dir, 'model.minidb'))
    assert sorted(got) == sorted(want) == sorted(param_names())
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # And every checkpoint written after the resume matches the
    # uninterrupted run's (the weights, Adam's moments and iteration).
    for epoch in range(KILL_AFTER, EPOCHS + 1):
        name = 'trainer.%d' % epoch
        a = load(os.path.join(checkpoints, name), None)
        b = load(os.path.join(reference_dir, 'checkpoints', name), None)
        for blob in a:
            if blob.startswith('!!') or 'dbreader' in blob or 'mutex' in blob:
                continue
            np.testing.assert_array_equal(a[blob], b[blob],
                                          err_msg='%s %s' % (name, blob))
