"""examples/caffe2_mlp_tutorial.py: Caffe2's MNIST-tutorial code (an MLP)
with only the alias line added, on the digits written to minidb files and
read with brew.db_input. It reaches its stated accuracy; the accuracy is
checked here with a numpy forward pass over the test records read from
the db file by hand."""

import os
import struct
import subprocess
import sys

import numpy as np

from _support import EXAMPLES, PKG_PARENT, load_example
from ferrocaffe import utils, workspace
from ferrocaffe.proto import caffe2_pb2


def read_db(path):
    data = open(path, 'rb').read()
    xs, ys, at = [], [], 0
    while at < len(data):
        kl, vl = struct.unpack_from('=ii', data, at)
        record = caffe2_pb2.TensorProtos()
        record.ParseFromString(data[at + 8 + kl:at + 8 + kl + vl])
        xs.append(utils.Caffe2TensorToNumpyArray(record.protos[0]))
        ys.append(utils.Caffe2TensorToNumpyArray(record.protos[1]))
        at += 8 + kl + vl
    return np.stack(xs), np.array(ys)


def test_the_tutorial_reaches_its_stated_accuracy(fresh, tmp_path):
    tutorial = load_example('caffe2_mlp_tutorial.py')
    reported = tutorial.main(['--iters', '200', '--root-folder', str(tmp_path)])
    x, y = read_db(os.path.join(tmp_path, 'digits_test.minidb'))
    assert x.shape == (360, 1, 8, 8) and x.dtype == np.uint8 and x.max() == 16
    h = x.reshape(360, 64).astype(np.float64) / 16
    for i in range(3):
        w = workspace.FetchBlob('dense_%d_w' % i).astype(np.float64)
        h = h @ w.T + workspace.FetchBlob('dense_%d_b' % i)
        if i < 2:
            h = np.maximum(h, 0)
    accuracy = float(np.mean(np.argmax(h, axis=1) == y))
    assert abs(accuracy - reported) < 1e-6
    assert accuracy >= 0.95
    x_train, _ = read_db(os.path.join(tmp_path, 'digits_train.minidb'))
    assert x_train.shape == (1437, 1, 8, 8)


def test_the_tutorial_runs_as_a_script(tmp_path):
    done = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, 'caffe2_mlp_tutorial.py'),
         '--iters', '30', '--root-folder', str(tmp_path)],
        env=dict(os.environ, PYTHONPATH=PKG_PARENT), capture_output=True,
        text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert 'test_accuracy: ' in done.stdout
    # Apart from the alias lines, the script imports Caffe2's names only.
    source = open(os.path.join(EXAMPLES, 'caffe2_mlp_tutorial.py')).read()
    assert 'from ferrocaffe' not in source
    assert source.count('ferrocaffe.') == 1  # register_caffe2_alias()
