"""examples/char_rnn.py (issue 30): Caffe2's character-level LSTM trained in
a checkpointed Job. A run stopped after 4 epochs is resumed to 30; the
script then reports a loss below its bound, and the parameters it wrote
predict the text well: checked with an LSTM written here in numpy (one-hot
input, the i2h and recurrent gate layers, the cell, the output layer,
cross-entropy), run over the text as the example cuts it."""

import os
import subprocess
import sys

import numpy as np

from _support import EXAMPLES, PKG_PARENT, load_example
from ferrocaffe import core, workspace

EXAMPLE = os.path.join(EXAMPLES, 'char_rnn.py')
SMALL = ['--hidden', '64']


def run(workdir, *args):
    done = subprocess.run(
        [sys.executable, EXAMPLE, '--workdir', str(workdir)] + SMALL + list(args),
        env=dict(os.environ, PYTHONPATH=PKG_PARENT), capture_output=True,
        text=True, timeout=900)
    return done.returncode, done.stdout + done.stderr


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_loss(p, text, streams, hidden):
    """Mean cross-entropy per character over one pass, states carried from
    step to step as in training."""
    vocab = len(text.vocab)
    h = np.zeros((streams, hidden))
    c = np.zeros((streams, hidden))
    total, count = 0.0, 0
    for codes, targets in zip(text.inputs, text.targets):
        for t in range(codes.shape[0]):
            x = np.eye(vocab)[codes[t]]
            g = x @ p['LSTM/i2h_w'].T + p['LSTM/i2h_b'] + h @ p['LSTM/gates_t_w'].T + p['LSTM/gates_t_b']
            g = g.reshape(streams, 4, hidden)
            i, f, o, cand = sigmoid(g[:, 0]), sigmoid(g[:, 1]), sigmoid(g[:, 2]), np.tanh(g[:, 3])
            c = f * c + i * cand
            h = o * np.tanh(c)
            scores = h @ p['scores_w'].T + p['scores_b']
            scores -= scores.max(axis=1, keepdims=True)
            logp = scores - np.log(np.exp(scores).sum(axis=1, keepdims=True))
            total -= logp[np.arange(streams), targets[t]].sum()
            count += streams
    return total / count


def test_the_character_lstm_learns_the_text_across_a_resume(tmp_path):
    example = load_example('char_rnn.py')
    code, out = run(tmp_path, '--epochs', '4')
    assert code in (0, 1), out
    assert 'trained through epoch 4' in out
    code, out = run(tmp_path, '--epochs', '30')
    assert code == 0, out
    assert 'resumed from epoch 4' in out and 'trained through epoch 30' in out
    # Text was generated after every epoch of the second run.
    assert sum(line.startswith('loss ') for line in out.splitlines()) == 26
    model = tmp_path / 'model'
    ws = workspace.Workspace()
    names = ['LSTM/i2h_w', 'LSTM/i2h_b', 'LSTM/gates_t_w', 'LSTM/gates_t_b', 'scores_w', 'scores_b']
    ws.run(core.CreateOperator('Load', [], names, db=str(model), db_type='ferro', absolute_path=True))
    p = {n: ws.fetch_blob(n).astype(np.float64) for n in names}
    text = example.Text(example.TEXT, 8, 25)
    loss = numpy_loss(p, text, 8, 64)
    # An untrained model's loss is ln(vocabulary), about 3.6.
    assert np.log(len(text.vocab)) > 3.0
    assert loss < 0.5, loss
