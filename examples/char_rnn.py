"""A character-level LSTM (Caffe2's ``char_rnn`` example) trained in a
checkpointed Job, printing text it generates as it learns.

* **Data**: ``examples/data/char_rnn.txt``, a short text written for this
  project. Its characters are the vocabulary. The text is cut into
  ``--streams`` equal streams read side by side; each training step reads
  the next ``--seq-len`` characters of every stream and learns to predict
  each one's successor.
* **Model**, as Caffe2 programs built it: ``OneHot`` inputs,
  ``rnn_cell.LSTM`` (a ``RecurrentNetwork`` op over ``LSTMUnit`` steps),
  ``brew.fc`` over the time axis, ``SoftmaxWithLoss``,
  ``AddGradientOperators`` and ``optimizer.build_adagrad``. The LSTM's last
  hidden and cell states are carried to the next step (truncated
  backpropagation through time) and reset at the start of each epoch.
* **Job**: the init group creates the parameters; an epoch is one pass over
  the streams (a loop of training steps whose batches a ``Python`` op cuts
  by the optimizer's iteration counter, so a resumed run reads on where it
  stopped); after each epoch a ``Python`` op prints text sampled from the
  current parameters, with a net of its own; a checkpoint is saved after
  every epoch; the exit group writes the parameters.

Run it, press Ctrl-C, run it again: it resumes from the last checkpoint::

    python examples/char_rnn.py
    python examples/char_rnn.py --fresh         # start over

It exits with status 1 if the last epoch's mean loss per character is not
below ``--target-loss`` (0.5 by default; an untrained model's is about
ln(vocabulary) = 3.3).
"""

import argparse
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
    brew, core, model_helper, optimizer, rnn_cell, utils, workspace)
from ferrocaffe.checkpoint import (  # noqa: E402
    CheckpointManager, FileMetadataHandler, Job, JobRunner, epoch_limiter)
from ferrocaffe.net_builder import ops  # noqa: E402
from ferrocaffe.session import LocalSession  # noqa: E402
from ferrocaffe.task import Node, Task  # noqa: E402

TEXT = os.path.join(HERE, 'data', 'char_rnn.txt')
DEFAULT_WORKDIR = os.path.join(tempfile.gettempdir(), 'ferrocaffe_char_rnn')
NODE = 'trainer'


class Text(object):
    """The text as character indices, cut into ``streams`` streams, and the
    batches of one epoch: ``inputs[k]`` and ``targets[k]`` (both
    ``(seq_len, streams)``, int64) for step ``k``."""

    def __init__(self, path, streams, seq_len):
        with open(path, encoding='utf-8') as f:
            text = f.read()
        self.vocab = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.vocab)}
        codes = np.array([self.index[c] for c in text], dtype=np.int64)
        per_stream = (len(codes) - 1) // streams
        self.steps = per_stream // seq_len
        if self.steps < 1:
            raise SystemExit('the text is too short for %d streams of %d '
                             'characters' % (streams, seq_len))
        used = self.steps * seq_len
        starts = np.arange(streams) * per_stream
        # (streams, used + 1): stream s reads codes[starts[s]:][:used + 1].
        rows = np.stack([codes[s:s + used + 1] for s in starts])
        self.inputs = [np.ascontiguousarray(rows[:, k * seq_len:(k + 1) * seq_len].T)
                       for k in range(self.steps)]
        self.targets = [np.ascontiguousarray(rows[:, k * seq_len + 1:(k + 1) * seq_len + 1].T)
                        for k in range(self.steps)]


def add_lstm(model, codes, seq_len, streams, vocab, hidden):
    """One-hot characters ``codes`` ((seq_len, streams) int64) -> LSTM ->
    scores ((seq_len * streams, vocab)). Returns the scores and the blobs of
    the LSTM's initial and last hidden and cell states."""
    if model.init_params:
        model.param_init_net.ConstantFill(
            [], 'vocab_size', shape=[], value=vocab, dtype=core.DataType.INT64)
    else:
        model.net.AddExternalInput('vocab_size')
    flat = model.net.Reshape(codes, ['codes_flat', 'codes_shape'], shape=[-1])[0]
    onehot = model.net.OneHot([flat, 'vocab_size'], 'onehot')
    x = model.net.Reshape(onehot, ['x', 'onehot_shape'],
                          shape=[seq_len, streams, vocab])[0]
    lengths = model.net.AddExternalInput('seq_lengths')
    h0 = model.net.AddExternalInput('hidden_init')
    c0 = model.net.AddExternalInput('cell_init')
    output, last_hidden, _, last_cell = rnn_cell.LSTM(
        model, x, lengths, (h0, c0), vocab, hidden, scope='LSTM')
    scores = brew.fc(model, output, 'scores', dim_in=hidden, dim_out=vocab,
                     axis=2)
    flat_scores = model.net.Reshape(scores, ['scores_flat', 'scores_shape'],
                                    shape=[-1, vocab])[0]
    return flat_scores, (h0, c0), (last_hidden, last_cell)


def build_train_model(text, cfg):
    """The training net: the step's loss, gradients and Adagrad updates;
    the last states become the next step's initial ones."""
    model = model_helper.ModelHelper(name='char_rnn')
    codes = model.net.AddExternalInput('codes')
    targets = model.net.AddExternalInput('targets')
    scores, (h0, c0), (h, c) = add_lstm(
        model, codes, cfg.seq_len, cfg.streams, len(text.vocab), cfg.hidden)
    flat_targets = model.net.Reshape(targets, ['targets_flat', 'targets_shape'],
                                     shape=[-1])[0]
    labels = model.net.Cast(flat_targets, 'labels', to=core.DataType.INT32)
    _, loss = model.net.SoftmaxWithLoss([scores, labels], ['softmax', 'loss'])
    model.AddGradientOperators([loss])
    optimizer.build_adagrad(model, base_learning_rate=cfg.lr)
    # Truncated backpropagation through time: the next step starts where
    # this one stopped.
    model.net.Copy(h, h0)
    model.net.Copy(c, c0)
    # The epoch's loss: summed here, averaged when reported.
    model.net.Add([loss, 'loss_sum'], 'loss_sum')
    for i, op in enumerate(model.param_init_net.Proto().op):
        op.device_option.random_seed = cfg.seed * 1000 + i + 1
    return model


class Sampler(object):
    """Generates text from the parameters of a running job: a net of its own
    (the same layers over one character of one stream) in a workspace of
    its own, fed the parameters and run once per character."""

    def __init__(self, text, cfg, params):
        self.text, self.cfg, self.params = text, cfg, params
        model = model_helper.ModelHelper(name='sample', init_params=False)
        scores, _, (h, c) = add_lstm(model, 'codes', 1, 1, len(text.vocab),
                                     cfg.hidden)
        model.net.Softmax(scores, 'probs')
        model.net.Copy(h, 'hidden_init')
        model.net.Copy(c, 'cell_init')
        self.ws = workspace.Workspace()
        self.net = model.net
        self.rng = np.random.default_rng(cfg.seed)

    def __call__(self, inputs, outputs, ws):
        epoch_loss = float(ws.fetch_blob('loss_sum')) / self.text.steps
        for p in self.params + ['vocab_size']:
            self.ws.feed_blob(p, ws.fetch_blob(p))
        hidden = self.cfg.hidden
        self.ws.feed_blob('seq_lengths', np.ones(1, dtype=np.int32))
        self.ws.feed_blob('hidden_init', np.zeros((1, 1, hidden), np.float32))
        self.ws.feed_blob('cell_init', np.zeros((1, 1, hidden), np.float32))
        code = self.text.index['T']
        out = ['T']
        self.ws.feed_blob('codes', np.array([[code]], dtype=np.int64))
        self.ws.create_net(self.net, True)
        for _ in range(self.cfg.sample_chars):
            self.ws.feed_blob('codes', np.array([[code]], dtype=np.int64))
            self.ws.run_net(self.net.Name())
            probs = self.ws.fetch_blob('probs')[0].astype(np.float64)
            code = int(self.rng.choice(len(probs), p=probs / probs.sum()))
            out.append(self.text.vocab[code])
        print('loss %.3f | %s' % (epoch_loss, ''.join(out).replace('\n', ' / ')),
              flush=True)
        outputs[0].feed(np.array(epoch_loss, dtype=np.float32))


class Config(object):
    def __init__(self, workdir=DEFAULT_WORKDIR, epochs=40, streams=8,
                 seq_len=25, hidden=96, lr=0.1, seed=0, sample_chars=80,
                 target_loss=0.5):
        self.workdir = workdir
        self.epochs = epochs
        self.streams = streams
        self.seq_len = seq_len
        self.hidden = hidden
        self.lr = lr
        self.seed = seed
        self.sample_chars = sample_chars
        self.target_loss = target_loss

    @property
    def checkpoint_dir(self):
        return os.path.join(self.workdir, 'checkpoints')

    @property
    def model_path(self):
        return os.path.join(self.workdir, 'model')


def build_job(text, cfg):
    """The Job (see the module's doc) and the training model."""
    model = build_train_model(text, cfg)
    params = [str(p) for p in model.GetParams()]
    steps = text.steps

    def next_batch(inputs, outputs):
        k = int(inputs[0].data.reshape(-1)[0]) % steps
        outputs[0].feed(text.inputs[k])
        outputs[1].feed(text.targets[k])

    with Job() as job, Node(NODE):
        with job.init_group, Task(name='init'):
            ops.net(model.param_init_net)
            ops.ConstantFill([], ['loss_sum'], shape=[], value=0.0)
            ops.ConstantFill([], ['epoch_loss'], shape=[], value=0.0)
            ops.ConstantFill([], ['seq_lengths'], shape=[cfg.streams],
                             value=cfg.seq_len, dtype=core.DataType.INT32)
        with Task(name='epoch'):
            for blob in ('hidden_init', 'cell_init'):
                ops.ConstantFill([], [blob], shape=[1, cfg.streams, cfg.hidden],
                                 value=0.0)
            ops.ConstantFill([], ['loss_sum'], shape=[], value=0.0)
            with ops.loop(steps):
                ops.Python(next_batch)([utils.OPTIMIZER_ITERATION_NAME],
                                       ['codes', 'targets'])
                ops.net(model.net)
            ops.Python(Sampler(text, cfg, params), pass_workspace=True)(
                [], ['epoch_loss'])
        epoch_limiter(job, cfg.epochs)
        job.track_scalars(loss='epoch_loss')
        with job.exit_group, Task(name='write_model'):
            ops.Save(params + ['epoch_loss'], [], db=cfg.model_path,
                     db_type='ferro', absolute_path=True)
    return job, model


def main(argv=None):
    d = Config()
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--workdir', default=d.workdir)
    p.add_argument('--epochs', type=int, default=d.epochs)
    p.add_argument('--streams', type=int, default=d.streams)
    p.add_argument('--seq-len', type=int, default=d.seq_len)
    p.add_argument('--hidden', type=int, default=d.hidden)
    p.add_argument('--lr', type=float, default=d.lr)
    p.add_argument('--seed', type=int, default=d.seed)
    p.add_argument('--target-loss', type=float, default=d.target_loss,
                   help='exit with status 1 unless the last epoch\'s mean '
                        'loss per character is below this (default: %(default)s)')
    p.add_argument('--fresh', action='store_true',
                   help='delete the checkpoints and model and start over')
    args = p.parse_args(argv)
    cfg = Config(workdir=args.workdir, epochs=args.epochs, streams=args.streams,
                 seq_len=args.seq_len, hidden=args.hidden, lr=args.lr,
                 seed=args.seed, target_loss=args.target_loss)
    if args.fresh:
        for path in (cfg.checkpoint_dir, cfg.model_path):
            shutil.rmtree(path, ignore_errors=True)
    text = Text(TEXT, cfg.streams, cfg.seq_len)
    print('workdir %s; %d characters in the vocabulary, %d steps an epoch'
          % (cfg.workdir, len(text.vocab), text.steps), flush=True)
    job, _ = build_job(text, cfg)
    runner = JobRunner(job, CheckpointManager(
        cfg.checkpoint_dir, NODE, 'ferro',
        metadata_handler=FileMetadataHandler(max_to_keep=3)),
        resume_from_epoch='latest', progress=False)
    session = LocalSession(workspace.Workspace())
    start = time.time()
    try:
        last = runner.train(session)
    except KeyboardInterrupt:
        print('run the same command again to resume from the last complete '
              'checkpoint (epoch %s)' % runner.last_checkpoint_epoch,
              file=sys.stderr, flush=True)
        return 130
    finally:
        session.close()
    if runner.resumed_from_epoch is not None:
        print('resumed from epoch %d' % runner.resumed_from_epoch)
    ws = workspace.Workspace()
    ws.run(core.CreateOperator('Load', [], ['epoch_loss'], db=cfg.model_path,
                               db_type='ferro', absolute_path=True))
    loss = float(ws.fetch_blob('epoch_loss'))
    print('trained through epoch %d in %.1fs; last epoch\'s loss %.3f per '
          'character (target: below %.2f)' % (last, time.time() - start, loss,
                                              cfg.target_loss), flush=True)
    return 0 if loss < cfg.target_loss else 1


if __name__ == '__main__':
    sys.exit(main())
