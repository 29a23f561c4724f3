"""What a checkpoint writes and what it trusts.

* Saves replace only regular files and sweep only their own temporaries
  (issue 17, items 7 and 8).
* The job state lives in each db: a finished job stays finished, with or
  without a manifest; the manifest is a rebuildable cache whose damage
  (fields, names outside the directory) never crashes or deletes anything
  good; a db of another epoch is refused (issue 11 item 1; issue 17 items
  6, 14, 15 and "Also").
* Failed saves name the path and the reason; an opt-in raises.
* Memory stays flat over thousands of epochs (issue 11 item 4).
* Large tensors round trip through the parallel load and fetch.
"""

import contextlib
import io
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from _support import PKG_PARENT as PYTHON_DIR, run_in_thread
from ferrocaffe import _core, core, errors, workspace

DEAD_PID = 4000000000  # above any pid_max: no live process has it


def save_op(path, db_type='ferro'):
    return core.CreateOperator('Save', ['v'], [], db=str(path),
                               db_type=db_type, absolute_path=True)


def fed_workspace():
    ws = workspace.Workspace()
    ws.feed_blob('v', np.arange(4, dtype=np.int64))
    return ws


# ============================================= what a save may replace ==

def _run_with_timeout(fn, timeout=20.0):
    """Runs ``fn`` in a thread; fails (instead of hanging) if it blocks."""
    return run_in_thread(fn, timeout)


@pytest.mark.parametrize('db_type', ['ferro', 'minidb'])
@pytest.mark.parametrize('kind', ['fifo', 'symlink', 'directory'])
def test_save_refuses_to_replace_anything_but_a_regular_file(
        tmp_path, kind, db_type):
    target = tmp_path / 'db'
    real = tmp_path / 'real'
    real.write_bytes(b'keep me')
    if kind == 'fifo':
        os.mkfifo(str(target))
    elif kind == 'symlink':
        os.symlink(str(real), str(target))
    else:
        target.mkdir()
    ws = fed_workspace()
    with pytest.raises(errors.FerrocaffeIOError) as info:
        _run_with_timeout(lambda: ws.run(save_op(target, db_type)))
    assert isinstance(info.value, OSError)
    assert info.value.file == str(target)
    assert 'only replaces regular files' in str(info.value)
    # Nothing was replaced, and no temporary is left behind.
    mode = os.lstat(str(target)).st_mode
    assert {'fifo': stat.S_ISFIFO, 'symlink': stat.S_ISLNK,
            'directory': stat.S_ISDIR}[kind](mode)
    assert real.read_bytes() == b'keep me'
    assert sorted(os.listdir(str(tmp_path))) == ['db', 'real']
    # The workspace is still usable: a save to a plain path works.
    ws.run(save_op(tmp_path / 'plain', db_type))
    assert os.path.isfile(str(tmp_path / 'plain'))


def test_save_replaces_a_regular_file(tmp_path):
    target = tmp_path / 'db'
    target.write_bytes(b'old')
    fed_workspace().run(save_op(target))
    assert target.read_bytes()[:8] == b'FERROCKP'


# ========================================================= temporaries ==

def _temp_name(target, host, pid, n):
    return '.%s.tmp-ferrocaffe-%s-%d-%d' % (target, host, pid, n)


def test_a_save_sweeps_only_its_own_stale_temporaries(tmp_path):
    d = str(tmp_path)
    foreign = ['.thesis.docx.tmp-1-2', '.db.tmp-%d-0' % DEAD_PID,
               '.db.tmp-ferrocaffe-zz-1-2', 'db.tmp-ferrocaffe-00000000-1-2']
    for name in foreign:
        with open(os.path.join(d, name), 'wb') as f:
            f.write(b'not ours')
        old = time.time() - 7 * 24 * 3600
        os.utime(os.path.join(d, name), (old, old))
    # A week-old temporary of another db of ferrocaffe's: not this save's.
    other = _temp_name('other', '00000000', DEAD_PID, 3)
    with open(os.path.join(d, other), 'wb') as f:
        f.write(b'x')
    old = time.time() - 7 * 24 * 3600
    os.utime(os.path.join(d, other), (old, old))
    # Temporaries of this db: an hour-old one of any host, and a fresh one
    # of a dead process of this host (a SIGKILLed save a moment ago).
    stale_any_host = _temp_name('db', 'ffffffff', 1, 4)
    with open(os.path.join(d, stale_any_host), 'wb') as f:
        f.write(b'x' * 1000)
    os.utime(os.path.join(d, stale_any_host), (old, old))

    fed_workspace().run(save_op(tmp_path / 'db'))
    left = sorted(os.listdir(d))
    assert left == sorted(foreign + [other, 'db'])


def _kill_during_a_save(target, env):
    """Starts a child saving a 64 MiB db to ``target`` over and over and
    SIGKILLs it while a temporary exists; True if one was left behind."""
    child = r'''
import sys, numpy as np
from ferrocaffe import core, workspace
ws = workspace.Workspace()
ws.feed_blob('v', np.ones(1 << 26, np.uint8))
op = core.CreateOperator('Save', ['v'], [], db=sys.argv[1], db_type='ferro',
                         absolute_path=True)
print('READY', flush=True)
while True:
    ws.run(op)
'''
    directory = os.path.dirname(target)
    prefix = '.%s.' % os.path.basename(target)  # a temporary of it
    proc = subprocess.Popen([sys.executable, '-c', child, target],
                            stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline().strip() == b'READY'
        deadline = time.monotonic() + 60
        while not any(n.startswith(prefix) for n in os.listdir(directory)):
            assert time.monotonic() < deadline, 'no temporary appeared'
        proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
    return any(n.startswith(prefix) for n in os.listdir(directory))


def test_a_killed_saves_temporary_is_swept_by_the_next_save_at_once(
        tmp_path):
    """A SIGKILLed save of a large db leaves its temporary; the next save
    of that db removes it when it starts, however recent it is."""
    env = dict(os.environ)
    env['PYTHONPATH'] = PYTHON_DIR + os.pathsep + env.get('PYTHONPATH', '')
    target = str(tmp_path / 'db')
    for _ in range(10):
        if _kill_during_a_save(target, env):
            break
    else:
        pytest.fail('no kill landed during a save in 10 tries')
    fed_workspace().run(save_op(target))
    assert [n for n in os.listdir(str(tmp_path)) if n.startswith('.')] == []


# ======================================= the job state inside each db ==

from ferrocaffe import proto  # noqa: E402
from ferrocaffe.checkpoint import (  # noqa: E402
    INTERNAL_PREFIX, JOB_STATE_BLOB, LATEST, CheckpointManager,
    FileMetadataHandler, Job, JobRunner, MultiNodeCheckpointManager,
    epoch_limiter, main as checkpoint_cli, mmap_db,
    read_job_state, read_manifest)
from ferrocaffe.net_builder import ops  # noqa: E402
from ferrocaffe.session import LocalSession  # noqa: E402
from ferrocaffe.task import Cluster, Node, Task  # noqa: E402

STEP = 0.25


def build_job(num_epochs, nodes=('trainer',), crash_in_exit=False):
    """Each node's ``w_<node>`` starts at 0 and grows by STEP per epoch
    (after epoch e it is e * STEP: an extra epoch shows)."""
    with Job() as job:
        for node in nodes:
            with Node(node):
                with job.init_group, Task():
                    ops.Const(np.array([0.0], np.float32), 'w_' + node)
                with Task():
                    ops.Add(['w_' + node,
                             ops.Const(np.array([STEP], np.float32))],
                            ['w_' + node])
        with Node(nodes[0]):
            epoch_limiter(job, num_epochs)
            if crash_in_exit:
                with job.exit_group, Task():
                    ops.Python(_crash)([], [])
    return job


def _crash(inputs, outputs):
    raise RuntimeError('killed after the last save')


def run(ckpt_dir, num_epochs, handler=None, db_type='ferro', resume=LATEST,
        nodes=('trainer',), **kwargs):
    """``(runner, last epoch, {node: w})`` of one run in a new workspace."""
    job = build_job(num_epochs, nodes, kwargs.pop('crash_in_exit', False))
    if len(nodes) == 1:
        manager = CheckpointManager(ckpt_dir, nodes[0], db_type, handler)
    else:
        manager = MultiNodeCheckpointManager(ckpt_dir, db_type, handler)
    ws = workspace.Workspace()
    runner = JobRunner(job, manager, resume_from_epoch=resume,
                       progress=False, **kwargs)
    with Cluster():
        last = runner.train(LocalSession(ws))
    return runner, last, {n: float(ws.fetch_blob('w_' + n)[0])
                          for n in nodes}


HANDLERS = {
    'none': lambda: None,
    'manifest': lambda: FileMetadataHandler(),
    'keep2': lambda: FileMetadataHandler(max_to_keep=2),
}


@pytest.mark.parametrize('db_type', ['ferro', 'minidb'])
@pytest.mark.parametrize('handler', sorted(HANDLERS))
def test_a_finished_job_run_again_runs_no_epoch(tmp_path, db_type, handler):
    """Issue 11: w = 3.5, then 3.75, 4.0 ... on every run of a finished
    12-epoch job (minidb, no metadata handler)."""
    d = str(tmp_path)
    for attempt in range(3):
        runner, last, w = run(d, 12, HANDLERS[handler](), db_type)
        assert (last, w) == (12, {'trainer': 12 * STEP}), attempt
        if attempt:
            assert runner.resumed_from_epoch == 12
            assert runner.epoch is None
    # Resuming explicitly from the last epoch runs no epoch either.
    runner, last, w = run(d, 12, HANDLERS[handler](), db_type, resume=12)
    assert (last, w, runner.epoch) == (12, {'trainer': 12 * STEP}, None)


@pytest.mark.parametrize('db_type', ['ferro', 'minidb'])
@pytest.mark.parametrize('handler', sorted(HANDLERS))
def test_a_kill_after_the_last_save_resumes_to_the_end(tmp_path, db_type,
                                                      handler):
    """Killed between the last epoch's save and the end of the job (here:
    its exit group fails), the job finishes without another epoch."""
    d = str(tmp_path)
    with pytest.raises(Exception, match='killed after the last save'):
        run(d, 5, HANDLERS[handler](), db_type, resume=None,
            crash_in_exit=True)
    runner, last, w = run(d, 5, HANDLERS[handler](), db_type)
    assert runner.resumed_from_epoch == 5
    assert (last, w, runner.epoch) == (5, {'trainer': 5 * STEP}, None)


def _minidb_records(path):
    """``[(key, value bytes)]`` of a minidb, parsed by hand (native-endian
    i32 key length, i32 value length, key, value)."""
    data = open(path, 'rb').read()
    records, at = [], 0
    while at < len(data):
        klen, vlen = np.frombuffer(data[at:at + 8], np.int32)
        at += 8
        key = data[at:at + klen].decode('utf-8')
        records.append((key, data[at + klen:at + klen + vlen]))
        at += klen + vlen
    return records


@pytest.mark.parametrize('db_type', ['ferro', 'minidb'])
def test_each_db_holds_the_job_state_in_a_reserved_entry(tmp_path, db_type):
    d = str(tmp_path)
    run(d, 3, None, db_type, resume=None)
    for epoch in range(4):
        path = os.path.join(d, 'trainer.%d' % epoch)
        state = read_job_state(path)
        assert state['epoch'] == epoch and state['node'] == 'trainer'
        assert state['stopped'] == (epoch == 3)
        assert state['conditions_met'] is False  # only the limit stopped it
        assert state['num_epochs'] == 3
        assert state['generation'] == 1
    path = os.path.join(d, 'trainer.3')
    if db_type == 'minidb':
        # Caffe2's format: a record holding a string tensor, which Caffe2's
        # reader loads as a string tensor or skips (its key is not a blob
        # of the job).
        (value,) = [v for k, v in _minidb_records(path)
                    if k == JOB_STATE_BLOB + '#%0']
        blob = proto.BlobProto()
        blob.ParseFromString(value)
        assert blob.type == 'Tensor'
        assert blob.tensor.data_type == proto.TensorProto.STRING
        assert list(blob.tensor.dims) == [1]
        (text,) = blob.tensor.string_data
        assert json.loads(text.decode('utf-8'))['epoch'] == 3
    else:
        assert JOB_STATE_BLOB not in mmap_db(path)
    # Loading everything (Caffe2's load_all) gives a harmless string blob.
    ws = workspace.Workspace()
    ws.run(core.CreateOperator('Load', [], [], db=path, db_type=db_type,
                               absolute_path=True, load_all=1))
    assert json.loads(ws.fetch_blob(JOB_STATE_BLOB)[0])['epoch'] == 3
    # The checkpointed blob list never includes the runtime's own blobs.
    names = [n.decode() for n in ws.fetch_blob('blob_names')]
    assert not [n for n in names if n.startswith(INTERNAL_PREFIX)]


@pytest.mark.parametrize('how', ['deleted', 'truncated', 'garbage', 'empty'])
def test_a_lost_manifest_is_rebuilt_and_nothing_good_is_deleted(tmp_path,
                                                                 how):
    """Issue 11: with max_to_keep=2, deleting or truncating manifest.json
    after a finished job made the next run train past the limit and delete
    the kept dbs."""
    d = str(tmp_path)
    run(d, 6, FileMetadataHandler(max_to_keep=2), resume=None)
    assert sorted(os.listdir(d)) == ['manifest.json', 'trainer.5',
                                     'trainer.6']
    manifest = os.path.join(d, 'manifest.json')
    if how == 'deleted':
        os.unlink(manifest)
    else:
        data = open(manifest, 'rb').read()
        data = {'truncated': data[:len(data) // 2], 'garbage': b'\x00\xff{',
                'empty': b''}[how]
        open(manifest, 'wb').write(data)
    runner, last, w = run(d, 6, FileMetadataHandler(max_to_keep=2))
    assert (runner.resumed_from_epoch, last, runner.epoch) == (6, 6, None)
    assert w == {'trainer': 6 * STEP}
    assert {'trainer.5', 'trainer.6'} <= set(os.listdir(d))
    # A job with a larger limit goes on from there; the first save rebuilds
    # the manifest and deletes nothing; the next one applies retention.
    runner, last, w = run(d, 7, FileMetadataHandler(max_to_keep=2))
    assert (runner.resumed_from_epoch, last, w) == (6, 7, {'trainer': 7 * STEP})
    assert {'trainer.5', 'trainer.6', 'trainer.7'} <= set(os.listdir(d))
    assert [e['epoch'] for e in read_manifest(d)['epochs']] == [6, 7]
    runner, last, w = run(d, 8, FileMetadataHandler(max_to_keep=2))
    assert (last, w) == (8, {'trainer': 8 * STEP})
    assert sorted(os.listdir(d)) == ['manifest.json', 'trainer.7',
                                     'trainer.8']


def test_a_write_that_rebuilds_the_manifest_deletes_nothing(tmp_path):
    d = str(tmp_path)
    with pytest.raises(Exception):
        # Killed after epoch 3: keeps 2 and 3.
        run(d, 3, FileMetadataHandler(max_to_keep=2), resume=None,
            crash_in_exit=True)
    os.unlink(os.path.join(d, 'manifest.json'))
    run(d, 4, FileMetadataHandler(max_to_keep=2))
    assert sorted(os.listdir(d)) == ['manifest.json', 'trainer.2',
                                     'trainer.3', 'trainer.4']
    assert [e['epoch'] for e in read_manifest(d)['epochs']] == [3, 4]


def test_retention_counts_an_epoch_only_when_every_node_has_it(tmp_path):
    d = str(tmp_path)
    nodes = ('a', 'b')
    run(d, 5, FileMetadataHandler(), resume=None, nodes=nodes)
    # Node b's dbs of epochs 3 and 4 are lost.
    for epoch in (3, 4):
        os.unlink(os.path.join(d, 'b.%d' % epoch))
    handler = FileMetadataHandler(max_to_keep=2)
    handler.set_params(d, 'ferro', list(nodes))
    handler.write(5)
    assert [e['epoch'] for e in read_manifest(d)['epochs']] == [2, 5]
    assert sorted(os.listdir(d)) == ['a.2', 'a.5', 'b.2', 'b.5',
                                     'manifest.json']


@pytest.mark.parametrize('handler', ['none', 'manifest'])
@pytest.mark.parametrize('db_type', ['ferro', 'minidb'])
def test_a_db_of_another_epoch_swapped_in_is_refused(tmp_path, caplog,
                                                     handler, db_type):
    """Issue 17: a same-size valid db from another epoch, copied over the
    newest one, was accepted (the manifest kept sizes for ferro dbs
    only).  The epoch stored inside the db is checked."""
    d = str(tmp_path)
    run(d, 6, HANDLERS[handler](), db_type, resume=None)
    for epoch in (5, 6):  # as a run killed after its save of epoch 4
        os.unlink(os.path.join(d, 'trainer.%d' % epoch))
    newest = os.path.join(d, 'trainer.4')
    other = os.path.join(d, 'trainer.2')
    assert os.path.getsize(newest) == os.path.getsize(other)
    shutil.copyfile(other, newest)
    caplog.set_level(logging.WARNING, logger='ferrocaffe.checkpoint')
    runner, last, w = run(d, 6, HANDLERS[handler](), db_type)
    assert runner.resumed_from_epoch == 3
    assert (last, w) == (6, {'trainer': 6 * STEP})
    warnings = [r.getMessage() for r in caplog.records]
    assert any('epoch 4 cannot be used' in m for m in warnings), warnings
    if handler == 'none' or db_type == 'ferro':
        # (The manifest's CRC-32 of a minidb tells first.)
        assert any('holds the checkpoint of epoch 2' in m for m in warnings)


@pytest.mark.parametrize('db_type', ['ferro', 'minidb'])
def test_loading_a_swapped_db_explicitly_raises(tmp_path, db_type):
    d = str(tmp_path)
    run(d, 5, None, db_type, resume=None)
    shutil.copyfile(os.path.join(d, 'trainer.3'), os.path.join(d, 'trainer.5'))
    with pytest.raises(errors.CorruptCheckpointError) as info:
        run(d, 7, None, db_type, resume=5)
    assert info.value.file == os.path.join(d, 'trainer.5')
    assert 'epoch 3' in str(info.value)
    # So does a partial load (a model read for evaluation).
    job = build_job(7)
    runner = JobRunner(job, CheckpointManager(d, 'trainer', db_type))
    with pytest.raises(errors.CorruptCheckpointError):
        runner.load_blobs_from_checkpoints(['w_trainer'], 5, LocalSession(
            workspace.Workspace()))
    assert checkpoint_cli(['verify', d], out=_Sink()) == 1


class _Sink(object):
    def write(self, s):
        pass

    def flush(self):
        pass


# ============================================ what a manifest may name ==

def _edit_manifest(d, edit):
    path = os.path.join(d, 'manifest.json')
    manifest = json.load(open(path))
    edit(manifest)
    with open(path, 'w') as f:
        f.write(json.dumps(manifest).replace('"<1e400>"', '1e400'))


@pytest.mark.parametrize('where', ['absolute', 'dotdot', 'subdir'])
def test_manifest_entries_outside_the_directory_are_ignored(tmp_path, caplog,
                                                            where):
    """Issue 17 item 6: a manifest entry whose file was absolute or held
    '..' was deleted by the next save and read by ls and verify."""
    d = str(tmp_path / 'ckpt')
    victim = tmp_path / 'victim.1'
    victim.write_bytes(b'precious')
    run(d, 2, FileMetadataHandler(max_to_keep=1), resume=None)
    name = {'absolute': str(victim), 'dotdot': '../victim.1',
            'subdir': 'sub/../../victim.1'}[where]

    def point_outside(manifest):
        manifest['epochs'].insert(0, {
            'epoch': 1, 'db_type': 'ferro',
            'dbs': {'trainer': {'file': name, 'bytes': 8}}})
    _edit_manifest(d, point_outside)
    caplog.set_level(logging.WARNING, logger='ferrocaffe.checkpoint')
    out = io.StringIO()
    assert checkpoint_cli(['ls', d], out=out) == 0
    assert 'victim' not in out.getvalue()
    out = io.StringIO()
    assert checkpoint_cli(['verify', d], out=out) == 0
    assert 'victim' not in out.getvalue()
    # A job extended by an epoch saves, and its retention drops epoch 1.
    runner, last, w = run(d, 3, FileMetadataHandler(max_to_keep=1))
    assert (runner.resumed_from_epoch, last) == (2, 3)
    assert victim.read_bytes() == b'precious'
    assert any('not a file name inside the checkpoint directory'
               in r.getMessage() for r in caplog.records)


DAMAGED_MANIFESTS = {
    'epoch Infinity': lambda m: m['epochs'][-1].update(epoch=float('inf')),
    'epoch NaN': lambda m: m['epochs'][-1].update(epoch=float('nan')),
    # Written as the bare number 1e400, which json reads as inf.
    'epoch 1e400': lambda m: m['epochs'][-1].update(epoch='<1e400>'),
    'epoch a string': lambda m: m['epochs'][-1].update(epoch='7'),
    'epoch a bool': lambda m: m['epochs'][-1].update(epoch=True),
    'negative epoch': lambda m: m['epochs'][-1].update(epoch=-1),
    'epochs not a list': lambda m: m.update(epochs={'a': 1}),
    'dbs a list': lambda m: m['epochs'][-1].update(dbs=[1, 2]),
    'db record a number': lambda m: m['epochs'][-1]['dbs'].update(trainer=3),
    'file a number': lambda m: m['epochs'][-1]['dbs']['trainer'].update(
        file=12),
    'bytes a float': lambda m: m['epochs'][-1]['dbs']['trainer'].update(
        bytes=1.5),
    'state damaged': lambda m: m['epochs'][-1]['dbs']['trainer'].update(
        state={'format': 'ferrocaffe-job-state', 'epoch': 'x'}),
    'duplicate epoch': lambda m: m['epochs'].append(m['epochs'][-1]),
    'not a dict': lambda m: (m.clear(), m.update(format=None)),
}


@pytest.mark.parametrize('how', sorted(DAMAGED_MANIFESTS) + ['deep nesting'])
def test_a_damaged_manifest_field_falls_back_to_the_files(tmp_path, caplog,
                                                          how):
    """Issue 17 item 15: OverflowError, TypeError, RecursionError from
    resume_from_epoch='latest'."""
    d = str(tmp_path)
    run(d, 6, FileMetadataHandler(), resume=None)
    for epoch in (5, 6):  # as a run killed after its save of epoch 4
        os.unlink(os.path.join(d, 'trainer.%d' % epoch))
    if how == 'deep nesting':
        with open(os.path.join(d, 'manifest.json'), 'w') as f:
            f.write('{"format": "ferrocaffe-checkpoints", "epochs": ' +
                    '[' * 100000 + ']' * 100000 + '}')
    else:
        _edit_manifest(d, DAMAGED_MANIFESTS[how])
    caplog.set_level(logging.WARNING, logger='ferrocaffe.checkpoint')
    runner, last, w = run(d, 6, FileMetadataHandler())
    assert (runner.resumed_from_epoch, last, w) == (4, 6, {'trainer': 6 * STEP})
    assert any('manifest' in r.getMessage() and 'damaged' in r.getMessage()
               for r in caplog.records)
    # The next save replaced it with a sound one.
    assert [e['epoch'] for e in read_manifest(d)['epochs']] == list(range(7))


@pytest.mark.parametrize('how', ['deep nesting', 'epoch Infinity'])
def test_the_cli_reports_a_damaged_manifest(tmp_path, how):
    d = str(tmp_path)
    run(d, 2, FileMetadataHandler(), resume=None)
    if how == 'deep nesting':
        open(os.path.join(d, 'manifest.json'), 'w').write('[' * 100000)
    else:
        _edit_manifest(d, DAMAGED_MANIFESTS[how])
    for command in ('ls', 'verify'):
        err = io.StringIO()
        out = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = checkpoint_cli([command, d], out=out)
        assert status == 1
        assert 'manifest' in (out.getvalue() + err.getvalue())


def test_a_manifest_that_is_a_fifo_does_not_block(tmp_path):
    d = str(tmp_path)
    run(d, 2, FileMetadataHandler(), resume=None)
    os.unlink(os.path.join(d, 'manifest.json'))
    os.mkfifo(os.path.join(d, 'manifest.json'))
    runner, last, w = _run_with_timeout(
        lambda: run(d, 3, FileMetadataHandler()))
    assert (runner.resumed_from_epoch, last) == (2, 3)
    # Its save could not replace the FIFO: reported, training went on.
    assert [e for e, _ in runner.failed_saves] == [3]
    assert 'only replaces regular files' in str(runner.failed_saves[0][1])
    assert stat.S_ISFIFO(os.lstat(os.path.join(d, 'manifest.json')).st_mode)


# ============================= runtime blobs and a second job in a ws ==

def test_a_second_checkpointed_job_in_the_same_workspace_checkpoints(
        tmp_path):
    """Issue 17 item 14: each save left Timer blobs, which the next job's
    blob list included; Timers cannot be saved, so all its saves failed."""
    ws = workspace.Workspace()
    for i in range(2):
        job = build_job(3)
        os.makedirs(str(tmp_path / ('job%d' % i)))
        runner = JobRunner(job, CheckpointManager(
            str(tmp_path / ('job%d' % i)), 'trainer', 'ferro'),
            progress=False, raise_on_save_failure=True)
        assert runner.train(LocalSession(ws)) == 3
        assert runner.failed_saves == []
    names = [e['name'] for e in _core.list_db(
        str(tmp_path / 'job1' / 'trainer.3'), 'ferro')]
    assert not [n for n in names if n.startswith(INTERNAL_PREFIX)
                and n != JOB_STATE_BLOB]
    assert JOB_STATE_BLOB in names


# ======================================================= failed saves ==

@pytest.mark.parametrize('handler', ['none', 'manifest'])
def test_failed_saves_name_the_path_and_the_reason(tmp_path, caplog, handler):
    # Under /proc nothing can be created, even by root.
    d = '/proc/ferrocaffe-no-such-dir/ckpt'
    caplog.set_level(logging.WARNING, logger='ferrocaffe.checkpoint')
    runner, last, w = run(d, 2, HANDLERS[handler](), resume=None)
    assert (last, w) == (2, {'trainer': 2 * STEP})  # training went on
    assert [e for e, _ in runner.failed_saves] == [0, 1, 2]
    assert runner.failed_save_count == 3
    for epoch, error in runner.failed_saves:
        assert isinstance(error, errors.FerrocaffeIOError)
        assert '/proc/ferrocaffe-no-such-dir' in str(error)
        assert 'No such file or directory' in str(error)
    messages = [r.getMessage() for r in caplog.records]
    assert any('Unable to write checkpoint for epoch 1' in m and
               '/proc/ferrocaffe-no-such-dir' in m and
               'No such file or directory' in m for m in messages), messages


@pytest.mark.parametrize('handler', ['none', 'manifest'])
def test_raise_on_save_failure_stops_at_the_first_failure(tmp_path, handler):
    blocker = tmp_path / 'a_file'
    blocker.write_text('not a directory')
    d = str(blocker / 'ckpt')
    with pytest.raises(errors.FerrocaffeIOError) as info:
        run(d, 3, HANDLERS[handler](), resume=None,
            raise_on_save_failure=True)
    assert str(blocker) in str(info.value)
    assert 'Not a directory' in str(info.value) or (
        'File exists' in str(info.value))


# ================================================== flat memory usage ==

MEMORY_CHILD = r'''
import gc, json, os, resource, sys
import numpy as np
from ferrocaffe import workspace
from ferrocaffe.checkpoint import (
    CheckpointManager, FileMetadataHandler, Job, JobRunner, epoch_limiter)
from ferrocaffe.net_builder import ops
from ferrocaffe.session import LocalSession
from ferrocaffe.task import Node, Task

ckpt_dir, num_epochs, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def rss_kib():
    try:
        with open('/proc/self/statm') as f:
            return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') // 1024
    except OSError:  # no /proc: the peak, which a leak also raises
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


with Job() as job, Node('trainer'):
    with job.init_group, Task():
        ops.Const(np.zeros(16, np.float32), 'w')
    with Task():
        ops.Add(['w', ops.Const(np.full(16, 0.25, np.float32))], ['w'])
    epoch_limiter(job, num_epochs)
samples = []


class Sampling(JobRunner):
    def save_checkpoints(self, epoch, session, **kwargs):
        if epoch % every == 0:
            gc.collect()
            samples.append((epoch, rss_kib()))
        return JobRunner.save_checkpoints(self, epoch, session, **kwargs)


runner = Sampling(job, CheckpointManager(
    ckpt_dir, 'trainer', 'ferro', FileMetadataHandler(max_to_keep=2)),
    progress=False)
ws = workspace.Workspace()
assert runner.train(LocalSession(ws)) == num_epochs
assert runner.failed_saves == []
print(json.dumps({'samples': samples, 'nets': len(ws.nets),
                  'blobs': len(ws.blobs)}))
'''


def _scratch_dir(tmp_path):
    """A directory for thousands of saves: in memory when the machine has
    /dev/shm (fsyncs on a disk would make the test slow, not different)."""
    shm = '/dev/shm'
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        import tempfile
        return tempfile.mkdtemp(prefix='ferrocaffe-memory-', dir=shm)
    return str(tmp_path / 'ckpt')


def test_memory_stays_flat_over_thousands_of_epochs(tmp_path):
    """Issue 11: a 3,000-epoch job grew from 35 MB to 139 MB (a compiled
    plan, nets and timer blobs kept for every save)."""
    num_epochs, every = 3000, 250
    d = _scratch_dir(tmp_path)
    env = dict(os.environ)
    env['PYTHONPATH'] = PYTHON_DIR + os.pathsep + env.get('PYTHONPATH', '')
    try:
        out = subprocess.run(
            [sys.executable, '-c', MEMORY_CHILD, d, str(num_epochs),
             str(every)], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, timeout=900)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    result = json.loads(out.stdout.decode().strip().splitlines()[-1])
    samples = dict(result['samples'])
    assert sorted(samples) == list(range(0, num_epochs + 1, every))
    # After a warm-up of 1,000 epochs, 2,000 more add less than 2 MiB
    # (Caffe2's layout: about 70 MiB, 35 KiB per epoch).
    growth = samples[num_epochs] - samples[1000]
    assert growth < 2048, result['samples']
    # The workspace holds a fixed number of nets and blobs.
    assert result['nets'] < 20 and result['blobs'] < 20, result


# ========================================== the parallel load and fetch ==

@pytest.mark.parametrize('dtype', ['float32', 'float64', 'int64', 'uint8',
                                   'int16', 'bool'])
def test_large_tensors_save_load_and_fetch_exactly(tmp_path, dtype):
    """Tensors over the sizes at which Load reads in parallel pieces (8 MiB)
    and fetch_blob copies in parallel (4 MiB), between small ones."""
    rng = np.random.default_rng(5)
    n = (9 << 20) + 12345
    if dtype == 'bool':
        big = rng.integers(0, 2, n).astype(bool)
    elif dtype.startswith('float'):
        big = rng.standard_normal(n).astype(dtype)
    else:
        big = rng.integers(0, 100, n).astype(dtype)
    big = big[:n - n % 3].reshape(-1, 3)
    blobs = {'a': np.arange(3, dtype=np.int32), 'big': big,
             'z': np.array([b'x', b'yz'], dtype=object)}
    ws = workspace.Workspace()
    for name, value in blobs.items():
        ws.feed_blob(name, value)
    path = str(tmp_path / 'db')
    ws.run(core.CreateOperator('Save', list(blobs), [], db=path,
                               db_type='ferro', absolute_path=True))
    target = workspace.Workspace()
    target.run(core.CreateOperator('Load', [], list(blobs), db=path,
                                   db_type='ferro', absolute_path=True))
    for name, value in blobs.items():
        got = target.fetch_blob(name)
        assert got.dtype == value.dtype and got.shape == value.shape
        np.testing.assert_array_equal(got, value)
    # A fetched array is a copy of its own.
    got = target.fetch_blob('big')
    got[0] = got[1]
    np.testing.assert_array_equal(target.fetch_blob('big'), big)
