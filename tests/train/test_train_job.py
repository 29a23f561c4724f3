"""examples/train_job.py, the main job (issue 14): a network built with
model_helper/brew/optimizer, trained on scikit-learn's digits in a
checkpointed Job. It reaches its stated test accuracy (checked here with a
numpy forward pass over the held-out split, not with the job's own
Accuracy op); Ctrl-C and a resume, or an extension with a larger --epochs,
end with exactly the weights of one uninterrupted run (one thread); --fresh
removes everything it made."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from _support import EXAMPLES, PKG_PARENT, load_example

EXAMPLE = os.path.join(EXAMPLES, 'train_job.py')
# Small settings keep the runs short (a debug build in the edit-test loop).
SMALL = ['--epochs', '6', '--hidden', '32', '--no-progress']


@pytest.fixture(scope='module')
def train_job():
    return load_example('train_job.py')


def env():
    e = dict(os.environ, PYTHONPATH=PKG_PARENT, OPENBLAS_NUM_THREADS='1')
    e.pop('CI', None)
    return e


def run(workdir, *args):
    done = subprocess.run(
        [sys.executable, EXAMPLE, '--workdir', str(workdir)] + list(args),
        env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def printed_accuracy(stdout):
    return float(stdout.split('test accuracy ')[1].split('%')[0]) / 100


def numpy_accuracy(model, x, y):
    """The network's accuracy computed here: ReLU layers, then the class of
    the largest score."""
    names = sorted((n[:-2] for n in model if n.endswith('_w')),
                   key=lambda n: (n == 'pred', n))
    h = x.astype(np.float64)
    for name in names:
        h = h @ model[name + '_w'].T.astype(np.float64) + model[name + '_b']
        if name != 'pred':
            h = np.maximum(h, 0.0)
    return float(np.mean(np.argmax(h, axis=1) == y))


def assert_same_weights(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.fixture(scope='module')
def reference(tmp_path_factory, train_job):
    """One uninterrupted deterministic run (one thread) of SMALL."""
    workdir = tmp_path_factory.mktemp('reference')
    out = run(workdir, '--threads', '1', *SMALL)
    assert 'trained through epoch 6' in out
    return train_job.read_model(os.path.join(workdir, 'model')), out


@pytest.mark.parametrize('threads', [1, 2])
def test_the_default_network_reaches_the_stated_accuracy(
        tmp_path, train_job, threads):
    out = run(tmp_path, '--threads', str(threads), '--no-progress')
    assert 'trained through epoch 20' in out
    assert '64 -> 128 -> 64 -> 10' in out
    model = train_job.read_model(os.path.join(tmp_path, 'model'))
    _, _, x_test, y_test = train_job.digits_split(0)
    assert len(y_test) == 360
    acc = numpy_accuracy(model, x_test, y_test)
    # The job's own Accuracy op agrees with the forward pass done here.
    assert abs(acc - float(model['test_accuracy'])) < 1e-6
    assert abs(acc - printed_accuracy(out)) < 1e-4
    # The stated accuracy, >= 95% (one thread: deterministic, 98.1%; with
    # two the updates interleave and runs differ: 96.9% to 98.6% seen).
    assert acc >= 0.95
    # The data files were written from the digits, the split as stated.
    x_train = np.load(os.path.join(tmp_path, 'data', 'train_data.npy'))
    y_train = np.load(os.path.join(tmp_path, 'data', 'train_label.npy'))
    assert x_train.shape == (1437, 64) and x_train.dtype == np.float32
    assert y_train.dtype == np.int32 and set(y_train) == set(range(10))
    np.testing.assert_array_equal(
        np.load(os.path.join(tmp_path, 'data', 'test_data.npy')), x_test)


def test_digits_split_is_the_whole_data_set_shuffled(train_job):
    from sklearn.datasets import load_digits
    digits = load_digits()
    x_train, y_train, x_test, y_test = train_job.digits_split(0)
    x = np.concatenate([x_train, x_test]) * 16.0
    y = np.concatenate([y_train, y_test])
    # Same images and labels, as a permutation: sort both by (label, pixels).
    key = lambda xs, ys: np.lexsort(np.column_stack([xs, ys]).T[::-1])
    a, b = key(x, y), key(digits.data, digits.target)
    np.testing.assert_array_equal(x[a], digits.data[b])
    np.testing.assert_array_equal(y[a], digits.target[b])


def test_ctrl_c_then_resume_gives_the_same_weights_bit_for_bit(
        tmp_path, train_job, reference):
    ref_model, _ = reference
    workdir = str(tmp_path / 'interrupted')
    # A slow source (10 ms per batch: 0.23 s per epoch), so that the
    # signal lands inside an epoch whatever the build's speed.
    proc = subprocess.Popen(
        [sys.executable, EXAMPLE, '--workdir', workdir, '--threads', '1',
         '--verbose', '--read-delay', '0.01'] + SMALL,
        env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if 'Starting epoch 3' in line:
                break
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert 'run the same command again to resume' in err
    assert not os.path.exists(os.path.join(workdir, 'model'))

    out = run(workdir, '--threads', '1', *SMALL)
    assert 'checkpoints found up to epoch' in out
    resumed = int(out.split('resumed from epoch ')[1].split()[0])
    assert 2 <= resumed < 6
    assert 'trained through epoch 6' in out
    assert_same_weights(train_job.read_model(os.path.join(workdir, 'model')),
                        ref_model)


def test_a_larger_epochs_extends_a_finished_run(tmp_path, train_job,
                                                reference):
    ref_model, _ = reference
    small = [a for a in SMALL]
    small[small.index('--epochs') + 1] = '3'
    out = run(tmp_path, '--threads', '1', *small)
    assert 'trained through epoch 3' in out
    short = train_job.read_model(os.path.join(tmp_path, 'model'))
    out = run(tmp_path, '--threads', '1', *SMALL)
    assert 'resumed from epoch 3' in out and 'trained through epoch 6' in out
    extended = train_job.read_model(os.path.join(tmp_path, 'model'))
    assert_same_weights(extended, ref_model)
    assert not np.array_equal(short['pred_w'], extended['pred_w'])
    # Run again with the same limit: the job had finished, nothing changes.
    out = run(tmp_path, '--threads', '1', *SMALL)
    assert 'the job had finished' in out
    assert_same_weights(train_job.read_model(os.path.join(tmp_path, 'model')),
                        ref_model)


def test_several_threads_resume_and_keep_learning(tmp_path, train_job):
    small = list(SMALL)
    small[small.index('--epochs') + 1] = '3'
    run(tmp_path, '--threads', '2', *small)
    out = run(tmp_path, '--threads', '2', '--epochs', '12', '--hidden', '32',
              '--no-progress')
    assert 'resumed from epoch 3' in out and 'trained through epoch 12' in out
    model = train_job.read_model(os.path.join(tmp_path, 'model'))
    _, _, x_test, y_test = train_job.digits_split(0)
    assert numpy_accuracy(model, x_test, y_test) >= 0.93


def test_fresh_removes_everything_the_job_made(tmp_path, train_job):
    workdir = tmp_path / 'work'
    run(workdir, '--threads', '1', '--epochs', '1', '--hidden', '8',
        '--no-progress')
    assert sorted(os.listdir(workdir)) == ['checkpoints', 'data', 'model']
    for sub in ('checkpoints', 'data'):
        open(os.path.join(workdir, sub, 'marker'), 'w').close()
    out = run(workdir, '--fresh', '--threads', '1', '--epochs', '1',
              '--hidden', '8', '--no-progress')
    assert 'resumed' not in out and 'trained through epoch 1' in out
    assert not os.path.exists(os.path.join(workdir, 'data', 'marker'))
    assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == [
        'manifest.json', 'trainer.0', 'trainer.1']
    train_job.remove_outputs(train_job.Config(workdir=str(workdir)))
    assert not os.path.exists(workdir)
    # A workdir holding files of its own is kept (only the job's go).
    workdir.mkdir()
    (workdir / 'mine').write_text('x')
    run(workdir, '--threads', '1', '--epochs', '1', '--hidden', '8',
        '--no-progress')
    train_job.remove_outputs(train_job.Config(workdir=str(workdir)))
    assert os.listdir(workdir) == ['mine']


def test_a_checkpoint_of_another_network_is_refused_before_training(tmp_path):
    # Other --hidden widths on an existing workdir: the job stops before
    # training, says which blob differs and how to start over.
    run(tmp_path, '--epochs', '1', '--hidden', '32', '--no-progress')
    done = subprocess.run(
        [sys.executable, EXAMPLE, '--workdir', str(tmp_path), '--epochs', '2',
         '--hidden', '16', '--no-progress'],
        env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stdout + done.stderr
    assert 'fc1_w has shape [32, 64] there and [16, 64] in this one' in done.stderr
    assert '--fresh' in done.stderr and 'Traceback' not in done.stderr
    assert 'trained through' not in done.stdout
    # and --fresh does start over with the new widths
    out = run(tmp_path, '--epochs', '1', '--hidden', '16', '--no-progress', '--fresh')
    assert '64 -> 16 -> 10' in out


def test_ctrl_c_while_the_data_is_written_says_so_without_a_traceback(tmp_path):
    # SIGINT right after start: the first run is still building the nets
    # or writing the data files (the example prints its workdir first).
    p = subprocess.Popen(
        [sys.executable, EXAMPLE, '--workdir', str(tmp_path), '--epochs', '1',
         '--no-progress'],
        env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith('workdir ')
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode in (0, 130), err
    assert 'Traceback' not in err, err
    if p.returncode == 130:
        assert 'run the same command again' in err


def test_progress_shows_the_loss_and_accuracy_of_each_epoch(tmp_path, train_job):
    # The progress bar (drawn on a stream given to the runner) carries the
    # tracked training loss and accuracy once an epoch has finished.
    import io
    from ferrocaffe import workspace
    from ferrocaffe.checkpoint import JobRunner
    from ferrocaffe.session import LocalSession

    cfg = train_job.Config(workdir=str(tmp_path), epochs=2, threads=1,
                           network=train_job.MLP((16,)))
    job, _ = train_job.build_job(cfg)
    stream = io.StringIO()
    runner = JobRunner(job, train_job.checkpoint_manager(cfg), progress=stream)
    runner.train(LocalSession(workspace.Workspace()))
    text = stream.getvalue()
    assert 'train/loss ' in text and 'train/accuracy ' in text, text
    loss = float(text.rsplit('train/loss ', 1)[1].split(',')[0])
    assert 0.0 < loss < 3.0
