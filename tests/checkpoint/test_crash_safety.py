"""Crash safety of checkpointed jobs (ferrocaffe.checkpoint).

A child process runs a job that checkpoints a few MiB of state after every
epoch.  It is killed with SIGKILL at random moments (many of them in the
middle of a save) and started again with ``resume_from_epoch='latest'``;
the final state must equal both an uninterrupted run and the values
computed here in plain Python.  Ctrl-C (SIGINT) must stop a run cleanly.
Damaged dbs (truncated, bit-flipped, empty) must raise
``CorruptCheckpointError``, and ``'latest'`` must fall back to the previous
good epoch.
"""

import logging
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ferrocaffe import _core, workspace
from ferrocaffe.checkpoint import (
    CheckpointManager, FileMetadataHandler, Job, JobRunner, latest_valid_epoch,
    main as checkpoint_cli)
from ferrocaffe.errors import CorruptCheckpointError
from ferrocaffe.net_builder import ops
from ferrocaffe.session import LocalSession
from ferrocaffe.task import Node, Task

# Children import the same ferrocaffe this process imported (the installed
# package in CI, python/ with a dev build in a checkout).
from _support import PKG_PARENT as PYTHON_DIR  # noqa: E402

# The child job: SIZE-element state blobs, PER_EPOCH records per epoch.
ROWS = 32
PER_EPOCH = 4
SIZE = 1 << 18  # acc (int64) + w (float32): 3 MiB per checkpoint
NUM_TRIALS = 40
CHILD_TIMEOUT = 60.0

CHILD = r'''
import logging, sys
import numpy as np
from ferrocaffe import core
from ferrocaffe.checkpoint import (
    CheckpointManager, FileMetadataHandler, Job, JobRunner)
from ferrocaffe.dataio import ReaderWithLimit
from ferrocaffe.file_reader import NpyReader
from ferrocaffe.net_builder import ops
from ferrocaffe.pipeline import pipe
from ferrocaffe.session import LocalSession
from ferrocaffe.task import Node, Task

data_path, ckpt_dir, out_path = sys.argv[1:4]
size, per_epoch = int(sys.argv[4]), int(sys.argv[5])
handler, db_type = sys.argv[6], sys.argv[7]


class Marker(logging.Handler):
    """Every log line of the runner, on stdout, flushed at once: the
    parent kills at chosen points of the run."""

    def emit(self, record):
        sys.stdout.write('LOG %s\n' % record.getMessage())
        sys.stdout.flush()


log = logging.getLogger('ferrocaffe.checkpoint')
log.setLevel(logging.INFO)
log.addHandler(Marker())
log.propagate = False

INT64 = core.DataType.INT64
with Job() as job, Node('node'):
    reader = NpyReader([data_path], batch_size=1, name='reader')
    with job.init_group, Task(name='init'):
        reader.setup_ex(ops, None)
        ops.ConstantFill([], ['acc'], shape=[size], value=0, dtype=INT64)
        ops.ConstantFill([], ['w'], shape=[size], value=1.0)
        ops.ConstantFill([], ['total'], shape=[1], value=100, dtype=INT64)
        ops.ConstantFill([], ['epochs_run'], shape=[1], value=0, dtype=INT64)
    with Task(name='count_epochs'):
        # An epoch run twice, or one too many, shows here.
        ops.Add(['epochs_run', ops.Const(np.array([1], np.int64))],
                ['epochs_run'])

    def process(rec):
        v = rec.val()
        ops.Add(['acc', v], ['acc'])
        ops.Add(['total', v], ['total'])
        # Depends on the order of the records, not only on their sum.
        ops.Add([ops.Scale('w', scale=0.5), ops.Cast(v, to='FLOAT')], ['w'])

    limited = ReaderWithLimit(reader, num_iter=per_epoch)
    pipe(limited, processor=process)
    job.add_stop_condition(limited.data_finished())

manager = CheckpointManager(
    ckpt_dir, 'node', db_type,
    metadata_handler=(FileMetadataHandler(max_to_keep=2)
                      if handler == 'file' else None))
runner = JobRunner(job, manager, resume_from_epoch='latest', progress=False)
session = LocalSession()
try:
    last = runner.train(session)
except KeyboardInterrupt:
    print('INTERRUPTED epoch=%s last_checkpoint=%s' % (
        runner.epoch, runner.last_checkpoint_epoch), flush=True)
    sys.exit(130)
ws = session._ws
np.savez(out_path, acc=ws.fetch_blob('acc'), w=ws.fetch_blob('w'),
         total=ws.fetch_blob('total'), epochs_run=ws.fetch_blob('epochs_run'))
print('DONE last=%d resumed=%s' % (last, runner.resumed_from_epoch),
      flush=True)
'''


def num_epochs():
    """Epochs of the child job: PER_EPOCH records each; the data is found
    exhausted by the epoch that reads its last record, or by one more when
    the last epoch read exactly PER_EPOCH."""
    return -(-ROWS // PER_EPOCH) + (1 if ROWS % PER_EPOCH == 0 else 0)


def expected_state(values, size=SIZE):
    """The child's final blobs, computed in plain Python (float32 steps as
    the operators take them)."""
    w = np.float32(1.0)
    for v in values:
        w = np.float32(np.float32(0.5) * w) + np.float32(v)
    total = 100 + sum(int(v) for v in values)
    return {
        'acc': np.full(size, sum(int(v) for v in values), np.int64),
        'w': np.full(size, w, np.float32),
        'total': np.array([total], np.int64),
        'epochs_run': np.array([num_epochs()], np.int64),
    }


class Child(object):
    """The child job as a subprocess whose log lines are collected by a
    thread."""

    def __init__(self, env, tmp, ckpt_dir, out_path, handler='file',
                 db_type='ferro'):
        self.lines = []
        self._queue = queue.Queue()
        self._stderr = open(os.path.join(tmp, 'child.stderr'), 'ab')
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(tmp, 'child.py'),
             os.path.join(tmp, 'val.npy'), ckpt_dir, out_path, str(SIZE),
             str(PER_EPOCH), handler, db_type],
            stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode('utf-8', 'replace').rstrip('\n')
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, marker, timeout=CHILD_TIMEOUT):
        """Waits for a line containing ``marker``; False if the child ended
        first."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, 'the child did not get to %r' % marker
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                return False
            if marker in line:
                return True

    def finish(self, timeout=CHILD_TIMEOUT):
        rc = self.proc.wait(timeout=timeout)
        self._thread.join(timeout)
        self._stderr.close()
        return rc

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)


def in_save(lines):
    """Whether the last lines show a save that had begun and not ended."""
    for line in reversed(lines):
        if 'Checkpoints saved' in line or 'Unable to write' in line:
            return False
        if 'Saving checkpoints for epoch' in line:
            return True
    return False


@pytest.fixture
def child_env(tmp_path):
    with open(os.path.join(str(tmp_path), 'child.py'), 'w') as f:
        f.write(CHILD)
    values = np.random.default_rng(7).integers(0, 1000, size=ROWS)
    np.save(os.path.join(str(tmp_path), 'val.npy'), values.astype(np.int64))
    env = dict(os.environ)
    env['PYTHONPATH'] = PYTHON_DIR + os.pathsep + env.get('PYTHONPATH', '')
    env.pop('CI', None)
    return env, str(tmp_path), [int(v) for v in values]


def load_state(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def assert_same_state(got, want):
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def run_to_end(env, tmp, ckpt_dir, out_path, handler='file',
               db_type='ferro'):
    child = Child(env, tmp, ckpt_dir, out_path, handler, db_type)
    rc = child.finish()
    assert rc == 0, 'the run failed:\n%s\n%s' % (
        '\n'.join(child.lines[-20:]),
        open(os.path.join(tmp, 'child.stderr')).read()[-3000:])
    done = [l for l in child.lines if l.startswith('DONE')]
    assert done, child.lines[-10:]
    return done[-1], child.lines


def test_sigkill_at_random_moments_then_resume_from_latest(child_env):
    """Kills at random moments (during saves, at the start of epochs, right
    after the last save, anywhere), with and without a metadata handler, in
    both formats, the manifest deleted after some kills: every trial
    resumes to the final state of an uninterrupted run, which is the one
    computed here (the number of epochs run included: an epoch run twice,
    or one run after the job had stopped, shows)."""
    env, tmp, values = child_env
    want = expected_state(values)
    epochs = num_epochs()

    # An uninterrupted run.
    ref_dir = os.path.join(tmp, 'reference')
    done, _ = run_to_end(env, tmp, ref_dir, os.path.join(tmp, 'ref.npz'))
    assert done == 'DONE last=%d resumed=None' % epochs
    reference = load_state(os.path.join(tmp, 'ref.npz'))
    assert_same_state(reference, want)

    rng = random.Random(20261122)
    kills = kills_in_save = kills_after_last_save = manifests_deleted = 0
    modes = set()
    for trial in range(NUM_TRIALS):
        handler = ('file', 'none')[trial % 2]
        db_type = ('ferro', 'ferro', 'minidb', 'minidb')[trial % 4]
        modes.add((handler, db_type))
        ckpt_dir = os.path.join(tmp, 'trial%d' % trial)
        out_path = os.path.join(tmp, 'trial%d.npz' % trial)
        # Without a handler nothing creates the directory (as in Caffe2).
        os.makedirs(ckpt_dir)
        for _ in range(rng.choice([1, 1, 2])):
            child = Child(env, tmp, ckpt_dir, out_path, handler, db_type)
            r = rng.random()
            after_last_save = False
            if r < 0.5:
                # Just after a save began: inside Save, its fsync, the
                # rename, the manifest rewrite or the retention.
                reached = child.wait_for('Saving checkpoints for epoch %d' %
                                         rng.randrange(0, epochs + 1))
                delay = rng.uniform(0.0, 0.03)
            elif r < 0.65:
                # Between the last epoch's save and the end of the job.
                reached = child.wait_for('Stopping')
                after_last_save = True
                delay = rng.uniform(0.0, 0.01)
            elif r < 0.85:
                reached = child.wait_for('Starting epoch %d' %
                                         rng.randrange(1, epochs + 1))
                delay = rng.uniform(0.0, 0.02)
            else:
                reached = True
                delay = rng.uniform(0.0, 1.5)
            if reached:
                time.sleep(delay)
                during_save = in_save(child.lines)
                child.kill()
            rc = child.finish()
            if rc == -signal.SIGKILL:
                kills += 1
                kills_in_save += during_save
                kills_after_last_save += after_last_save
            else:
                assert rc == 0, (trial, child.lines[-10:])
            # Whatever the moment, every checkpoint file there verifies.
            status = checkpoint_cli(['verify', ckpt_dir], out=_Sink())
            assert status in (0, 2), (trial, status)
            manifest = os.path.join(ckpt_dir, 'manifest.json')
            if os.path.exists(manifest) and rng.random() < 0.4:
                os.unlink(manifest)  # the manifest is only a cache
                manifests_deleted += 1

        done, lines = run_to_end(env, tmp, ckpt_dir, out_path, handler,
                                 db_type)
        assert_same_state(load_state(out_path), reference)
        assert not any('cannot be used' in l for l in lines), lines

    print('%d trials, %d SIGKILLs, %d of them during a save, %d after the '
          'last save; %d manifests deleted' % (
              NUM_TRIALS, kills, kills_in_save, kills_after_last_save,
              manifests_deleted))
    assert len(modes) == 4
    assert kills >= NUM_TRIALS * 3 // 4
    assert kills_in_save >= 8, (kills, kills_in_save)
    assert kills_after_last_save >= 3, kills_after_last_save
    assert manifests_deleted >= 3, manifests_deleted


class _Sink(object):
    def write(self, s):
        pass

    def flush(self):
        pass


def test_ctrl_c_during_an_epoch_stops_cleanly_and_the_run_resumes(child_env):
    env, tmp, values = child_env
    want = expected_state(values)
    rng = random.Random(3)
    for trial in range(3):
        ckpt_dir = os.path.join(tmp, 'int%d' % trial)
        out_path = os.path.join(tmp, 'int%d.npz' % trial)
        child = Child(env, tmp, ckpt_dir, out_path)
        epoch = rng.randrange(2, 6)
        assert child.wait_for('Starting epoch %d' % epoch)
        time.sleep(rng.uniform(0.0, 0.01))
        child.kill(signal.SIGINT)
        rc = child.finish()
        assert rc == 130, child.lines[-5:]
        line = [l for l in child.lines if l.startswith('INTERRUPTED')][-1]
        last_checkpoint = int(line.split('last_checkpoint=')[1])
        assert last_checkpoint >= epoch - 1
        # The last complete checkpoint is valid: the next run starts there.
        assert checkpoint_cli(['verify', ckpt_dir], out=_Sink()) == 0
        done, _ = run_to_end(env, tmp, ckpt_dir, out_path)
        assert done.endswith('resumed=%d' % last_checkpoint)
        assert_same_state(load_state(out_path), want)


# ====================================================== damaged files ==

def damage(path, how):
    data = open(path, 'rb').read()
    if how == 'truncated':
        data = data[:len(data) // 2]
    elif how == 'empty':
        data = b''
    elif how == 'bit-flipped':
        # A bit of the tensor data in the middle of the file.
        buf = bytearray(data)
        buf[len(buf) // 2] ^= 0x10
        data = bytes(buf)
    else:
        raise ValueError(how)
    with open(path, 'wb') as f:
        f.write(data)


def build_counting_job(num_epochs):
    """A job whose state after epoch e is known: x = [e, 2e, ..., 1000e]
    (float32) and a counter stopping it after ``num_epochs`` epochs."""
    with Job() as job, Node('node'):
        with job.init_group, Task(name='init'):
            ops.ConstantFill([], ['x'], shape=[1000], value=0.0)
            ops.Const(np.arange(1, 1001, dtype=np.float32), 'step')
            ops.CreateCounter([], ['epochs_left'], init_count=num_epochs - 1)
        with Task(name='train'):
            ops.Add(['x', 'step'], ['x'])
            done = ops.CountDown('epochs_left')
        job.add_stop_condition(done)
    return job


def state_after(epoch):
    return np.arange(1, 1001, dtype=np.float32) * np.float32(epoch)


def run_counting_job(ckpt_dir, num_epochs, handler=None, db_type='ferro',
                     resume=None):
    job = build_counting_job(num_epochs)
    ws = workspace.Workspace()
    manager = CheckpointManager(ckpt_dir, 'node', db_type,
                                metadata_handler=handler)
    runner = JobRunner(job, manager, resume_from_epoch=resume, progress=False)
    last = runner.train(LocalSession(ws))
    return runner, last, ws


@pytest.mark.parametrize('how', ['truncated', 'bit-flipped', 'empty'])
def test_a_damaged_db_raises_corrupt_checkpoint_error(tmp_path, how):
    ckpt_dir = str(tmp_path)
    run_counting_job(ckpt_dir, 3)
    path = os.path.join(ckpt_dir, 'node.3')
    _core.verify_db(path, 'ferro')
    damage(path, how)

    with pytest.raises(CorruptCheckpointError) as info:
        _core.verify_db(path, 'ferro')
    assert info.value.file == path

    # Through a Load op in a session, as JobRunner loads.
    manager = CheckpointManager(ckpt_dir, 'node', 'ferro')
    session = LocalSession(workspace.Workspace())
    session.run(manager.init([str('node')], retrieve_from_epoch=2))
    with pytest.raises(CorruptCheckpointError):
        session.run(manager.load(3))
    if how != 'bit-flipped':
        # Even reading the blob list alone fails (a flipped bit in a
        # tensor's data is found by that tensor's checksum).
        with pytest.raises(CorruptCheckpointError):
            fresh = CheckpointManager(ckpt_dir, 'node', 'ferro')
            LocalSession(workspace.Workspace()).run(
                fresh.init(['node'], retrieve_from_epoch=3))


@pytest.mark.parametrize('with_manifest', [True, False])
@pytest.mark.parametrize('how', ['truncated', 'bit-flipped', 'empty'])
def test_latest_falls_back_to_the_previous_good_epoch(tmp_path, caplog, how,
                                                       with_manifest):
    ckpt_dir = str(tmp_path)
    handler = FileMetadataHandler() if with_manifest else None
    run_counting_job(ckpt_dir, 5, handler)
    # A run killed after epoch 3 whose newest checkpoint was then damaged.
    if with_manifest:
        _truncate_manifest(ckpt_dir, 3)
    for e in (4, 5):
        os.unlink(os.path.join(ckpt_dir, 'node.%d' % e))
    damage(os.path.join(ckpt_dir, 'node.3'), how)

    caplog.set_level(logging.WARNING, logger='ferrocaffe.checkpoint')
    handler = FileMetadataHandler() if with_manifest else None
    runner, last, ws = run_counting_job(ckpt_dir, 5, handler, resume='latest')
    assert runner.resumed_from_epoch == 2
    assert last == 5
    np.testing.assert_array_equal(ws.fetch_blob('x'), state_after(5))
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING]
    assert any('epoch 3 cannot be used' in m for m in warnings), warnings


def _truncate_manifest(ckpt_dir, last_epoch):
    """The manifest as a run killed right after saving ``last_epoch`` left
    it."""
    import json
    path = os.path.join(ckpt_dir, 'manifest.json')
    manifest = json.load(open(path))
    manifest['epochs'] = [e for e in manifest['epochs']
                          if e['epoch'] <= last_epoch]
    for e in manifest['epochs']:
        e.pop('finished', None)
    with open(path, 'w') as f:
        json.dump(manifest, f)


def test_all_checkpoints_damaged_means_a_fresh_start(tmp_path, caplog):
    ckpt_dir = str(tmp_path)
    run_counting_job(ckpt_dir, 2, FileMetadataHandler())
    for e in (0, 1, 2):
        damage(os.path.join(ckpt_dir, 'node.%d' % e), 'truncated')
    caplog.set_level(logging.WARNING, logger='ferrocaffe.checkpoint')
    runner, last, ws = run_counting_job(ckpt_dir, 2, FileMetadataHandler(),
                                        resume='latest')
    assert runner.resumed_from_epoch is None
    assert last == 2
    np.testing.assert_array_equal(ws.fetch_blob('x'), state_after(2))
    assert any('no usable checkpoint' in r.getMessage()
               for r in caplog.records)


def test_minidb_bit_flips_are_caught_by_the_manifest_crc(tmp_path, caplog):
    """minidb has no checksums; the manifest's CRC-32 catches a flipped bit
    that the format cannot."""
    caplog.set_level(logging.WARNING, logger='ferrocaffe.checkpoint')
    ckpt_dir = str(tmp_path)
    run_counting_job(ckpt_dir, 3, FileMetadataHandler(), db_type='minidb')
    _truncate_manifest(ckpt_dir, 3)
    path = os.path.join(ckpt_dir, 'node.3')
    data = bytearray(open(path, 'rb').read())
    # Flip a bit of x's float data: the last 4000 bytes hold x's and
    # step's values, so the minidb still parses.
    x_at = bytes(data).find(np.float32(3 * 500).tobytes())
    assert x_at > 0
    data[x_at] ^= 0x01
    open(path, 'wb').write(bytes(data))
    _core.verify_db(path, 'minidb')  # the format itself cannot tell

    assert checkpoint_cli(['verify', ckpt_dir], out=_Sink()) == 1
    runner, last, ws = run_counting_job(ckpt_dir, 3, FileMetadataHandler(),
                                        db_type='minidb', resume='latest')
    assert runner.resumed_from_epoch == 2
    np.testing.assert_array_equal(ws.fetch_blob('x'), state_after(3))
    assert any('CRC-32' in r.getMessage() for r in caplog.records)


def test_a_damaged_manifest_falls_back_to_the_files(tmp_path, caplog):
    ckpt_dir = str(tmp_path)
    run_counting_job(ckpt_dir, 4, FileMetadataHandler())
    for e in (3, 4):
        os.unlink(os.path.join(ckpt_dir, 'node.%d' % e))
    with open(os.path.join(ckpt_dir, 'manifest.json'), 'wb') as f:
        f.write(b'{"format": "ferrocaffe-checkp')
    caplog.set_level(logging.WARNING, logger='ferrocaffe.checkpoint')
    runner, last, ws = run_counting_job(ckpt_dir, 4, FileMetadataHandler(),
                                        resume='latest')
    assert runner.resumed_from_epoch == 2
    np.testing.assert_array_equal(ws.fetch_blob('x'), state_after(4))
    assert any('manifest' in r.getMessage() for r in caplog.records)


def test_leftover_temporaries_of_a_killed_save_are_ignored(tmp_path):
    ckpt_dir = str(tmp_path)
    run_counting_job(ckpt_dir, 2, FileMetadataHandler())
    # What a save killed half-way leaves: a partial temporary.
    partial = os.path.join(ckpt_dir, '.node.3.tmp-999999-0')
    with open(os.path.join(ckpt_dir, 'node.2'), 'rb') as f:
        open(partial, 'wb').write(f.read()[:100])
    assert latest_valid_epoch(ckpt_dir, ['node']) == 2
    assert checkpoint_cli(['verify', ckpt_dir], out=_Sink()) == 0
    runner, last, ws = run_counting_job(ckpt_dir, 4, None, resume='latest')
    assert runner.resumed_from_epoch == 2
    # The job had stopped after epoch 2 (its counter said so; the job state
    # in the db records it): no epoch runs.
    assert last == 2 and runner.epoch is None
    np.testing.assert_array_equal(ws.fetch_blob('x'), state_after(2))
