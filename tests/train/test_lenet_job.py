"""examples/lenet_digits.py (issue 15): Caffe2's LeNet trained on the
digits in the checkpointed Job of examples/train_job.py, then exported to
a Predictor. A small LeNet (the script's ``--channels 6 16 --fc 64``),
trained for 3 epochs, then extended to 5 (a resume from the epoch-3
checkpoint), reaches the stated 95%: checked here with a numpy forward pass
(convolutions, pooling and layers written here) over the held-out digits."""

import os
import subprocess
import sys

import numpy as np

from _support import EXAMPLES, PKG_PARENT, load_example

EXAMPLE = os.path.join(EXAMPLES, 'lenet_digits.py')
SMALL = ['--channels', '6', '16', '--fc', '64', '--threads', '1',
         '--no-progress']


def run(workdir, *args, codes=(0,)):
    done = subprocess.run(
        [sys.executable, EXAMPLE, '--workdir', str(workdir)] + list(args),
        env=dict(os.environ, PYTHONPATH=PKG_PARENT), capture_output=True,
        text=True, timeout=900)
    assert done.returncode in codes, done.stdout + done.stderr
    return done.stdout


def conv3x3_pad1(x, w, b):
    """x (N, C, H, W), w (K, C, 3, 3): stride 1, zero pad 1."""
    n, c, h, wd = x.shape
    padded = np.zeros((n, c, h + 2, wd + 2))
    padded[:, :, 1:-1, 1:-1] = x
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            patch = padded[:, :, i:i + h, j:j + wd]  # (N, C, H, W)
            out += np.einsum('nchw,kc->nkhw', patch, w[:, :, i, j])
    return out + b[None, :, None, None]


def max_pool2(x):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def lenet_scores(model, x):
    p = {k: v.astype(np.float64) for k, v in model.items()}
    h = x.reshape(-1, 1, 8, 8).astype(np.float64)
    h = max_pool2(conv3x3_pad1(h, p['conv1_w'], p['conv1_b']))
    h = max_pool2(conv3x3_pad1(h, p['conv2_w'], p['conv2_b']))
    h = h.reshape(len(h), -1) @ p['fc3_w'].T + p['fc3_b']
    return np.maximum(h, 0) @ p['pred_w'].T + p['pred_b']


def test_a_small_lenet_reaches_95_percent_in_the_checkpointed_job(tmp_path):
    train_job = load_example('train_job.py')
    # 3 epochs may be short of the target (the script then exits 1).
    out = run(tmp_path, '--epochs', '3', *SMALL, codes=(0, 1))
    assert 'trained through epoch 3' in out
    out = run(tmp_path, '--epochs', '5', *SMALL)
    assert 'resumed from epoch 3' in out and 'trained through epoch 5' in out
    assert 'LeNet: conv 3x3 6, pool, conv 3x3 16, pool, fc 64, fc 10' in out
    assert sorted(os.listdir(tmp_path / 'checkpoints')) == [
        'manifest.json'] + ['trainer.%d' % e for e in (3, 4, 5)]

    model = train_job.read_model(os.path.join(tmp_path, 'model'))
    assert model['conv1_w'].shape == (6, 1, 3, 3)
    assert model['conv2_w'].shape == (16, 6, 3, 3)
    assert model['fc3_w'].shape == (64, 16 * 2 * 2)
    _, _, x_test, y_test = train_job.digits_split(0)
    accuracy = float(np.mean(np.argmax(lenet_scores(model, x_test), 1)
                             == y_test))
    printed = float(out.split('test accuracy ')[1].split('%')[0]) / 100
    assert abs(accuracy - printed) < 1e-4
    exported = float(out.split('(Predictor, 360 images): ')[1].split()[0])
    assert abs(accuracy - exported) < 1e-4
    assert accuracy >= 0.95


def test_the_network_options_and_defaults():
    lenet = load_example('lenet_digits.py')
    args = lenet.train_job.parse_args([], lenet.DEFAULTS)
    cfg = lenet.train_job.config_from_args(args, lenet.DEFAULTS)
    assert (cfg.epochs, cfg.lr, cfg.network.channels, cfg.network.fc) == (
        12, 0.05, (20, 50), 500)
    assert not hasattr(args, 'hidden')
    args = lenet.train_job.parse_args(
        ['--channels', '4', '8', '--fc', '16'], lenet.DEFAULTS)
    net = lenet.train_job.config_from_args(args, lenet.DEFAULTS).network
    assert (net.channels, net.fc) == ((4, 8), 16)
