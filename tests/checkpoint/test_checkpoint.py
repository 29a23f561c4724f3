"""Tests of ferrocaffe.checkpoint: Job, the checkpoint managers, JobRunner,
epoch_limiter, metadata handlers and the built-in manifest, the progress
display, the command line, Save/Load round trips of every blob kind, and
the example job (examples/linear_job.py).

The pipeline job reads a file of numbers, three records per epoch, and
adds them to a total; every expected value is computed here in plain
Python from those numbers.
"""

import filecmp
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

from _support import EXAMPLES, PKG_PARENT
from ferrocaffe import _core, core, workspace
from ferrocaffe.checkpoint import (
    INTERNAL_PREFIX, LATEST, CheckpointManager, FileMetadataHandler, Job, JobRunner,
    MetadataHandler, MultiNodeCheckpointManager, UploadTaskGroupBuilder,
    _NoProgress, _make_progress, _progress_wanted, db_name, epoch_limiter,
    get_ckpt_filename, latest_valid_epoch, main as checkpoint_cli,
    read_manifest)
from ferrocaffe.dataio import ReaderWithLimit
from ferrocaffe.dataset import Dataset
from ferrocaffe.file_reader import NpyReader, ParquetReader
from ferrocaffe.net_builder import ops
from ferrocaffe.pipeline import pipe
from ferrocaffe.schema import ConstRecord, Struct
from ferrocaffe.session import CompiledRunnable, LocalSession
from ferrocaffe.task import Cluster, Node, Task, TaskGroup, WorkspaceType

EXAMPLE = os.path.join(EXAMPLES, 'linear_job.py')

PER_EPOCH = 3
START = 100


# ======================================================= pipeline job ==

def node_values(node_id):
    """The numbers node ``node_id`` reads (different on every node)."""
    return [v * (node_id + 1) + node_id for v in range(10)]


def expected_totals(values):
    """The total after each epoch: START plus the records read so far,
    PER_EPOCH records per epoch."""
    totals, total = [], START
    for i in range(0, len(values), PER_EPOCH):
        total += sum(values[i:i + PER_EPOCH])
        totals.append(total)
    return totals


def test_expected_totals_match_caffe2s():
    # Caffe2's checkpoint_test.py read range(10) the same way.
    assert expected_totals(node_values(0)) == [103, 115, 136, 145]


def build_pipeline(node_id, data_dir, track=False):
    """Adds node ``node_id``'s part to the active Job: a reader over a .npy
    file and a running total created by the init group, and an epoch group
    task adding PER_EPOCH records to the total."""
    path = os.path.join(data_dir, 'node%d' % node_id, 'val.npy')
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.save(path, np.array(node_values(node_id), np.int64))
    with Node('trainer_%d' % node_id):
        with Job.current().init_group, Task():
            reader = NpyReader([path], batch_size=1,
                               name='reader_%d' % node_id)
            reader.setup_ex(ops, None)
            total = ops.Const(np.array([START], np.int64))
            rows = ops.Const(np.array([0], np.int64)) if track else None

        def inc_total(rec):
            ops.Add([total, rec.val()], [total])
            if track:
                ops.Add([rows, ops.Const(np.array([1], np.int64))], [rows])

        epoch_reader = ReaderWithLimit(reader, num_iter=PER_EPOCH)
        pipe(epoch_reader, processor=inc_total)
        Job.current().add_stop_condition(epoch_reader.data_finished())
        if track:
            Job.current().track_progress(batches=rows, rows=rows)
    return [total]


def make_fetcher(outputs):
    fetcher = Task(step=core.Net('empty'), outputs=outputs)

    def fetch(session):
        session.run(fetcher)
        values = [fetcher.outputs()[i].fetch() for i in range(len(outputs))]
        return [int(np.asarray(v).reshape(-1)[0]) for v in values]
    return fetch


MANAGERS = {
    'single': lambda d, t, h=None: CheckpointManager(d, 'temp_node', t, h),
    'multi': lambda d, t, h=None: MultiNodeCheckpointManager(d, t, h),
}


@pytest.mark.parametrize('db_type', ['minidb', 'ferro', 'leveldb'])
@pytest.mark.parametrize('kind', ['single', 'multi'])
def test_pipeline_job_trains_resumes_and_loads_every_epoch(
        tmp_path, kind, db_type):
    ckpt_dir = str(tmp_path / 'ckpt')
    os.makedirs(ckpt_dir)
    expected = expected_totals(node_values(0))

    def builder():
        return (LocalSession(workspace.Workspace()),
                MANAGERS[kind](ckpt_dir, db_type))

    with Cluster():
        with Job() as job:
            outputs = build_pipeline(0, str(tmp_path))
        fetch = make_fetcher(outputs)
        session, checkpoint = builder()
        assert job.compile(LocalSession) is job
        num_epochs = JobRunner(job, checkpoint).train(session)
        assert num_epochs == len(expected)
        assert fetch(session) == [expected[-1]]
        node = 'temp_node' if kind == 'single' else 'trainer_0'
        assert sorted(os.listdir(ckpt_dir)) == sorted(
            get_ckpt_filename(node, e) for e in range(num_epochs + 1))

        # Resuming from any epoch ends in the same state.
        for initial_epoch in range(0, num_epochs + 1):
            session, checkpoint = builder()
            JobRunner(job, checkpoint,
                      resume_from_epoch=initial_epoch).train(session)
            assert fetch(session) == [expected[-1]], initial_epoch

        # Each epoch's checkpoint holds that epoch's total.
        session.run(checkpoint.load(0))
        assert fetch(session) == [START]
        for epoch in range(1, num_epochs + 1):
            session.run(checkpoint.load(epoch))
            assert fetch(session) == [expected[epoch - 1]]


def test_caffe2_dataset_pipeline_job_with_tree_cursor(tmp_path):
    """Caffe2's own job: an in-memory Dataset read through a TreeCursor,
    which must be checkpointed; 17 global blobs after the run."""
    def build(node_id):
        with Node('trainer_%d' % node_id):
            with Job.current().init_group, Task():
                data = ConstRecord(ops, Struct(
                    ('val', np.array(node_values(0)))))
                ds = Dataset(data, name='dataset:%d' % node_id)
                full_reader = ds.reader(ops)
                total = ops.Const([START])

            def inc_total(rec):
                ops.Add([total, rec.val()], [total])

            epoch_reader = ReaderWithLimit(full_reader, num_iter=PER_EPOCH)
            pipe(epoch_reader, processor=inc_total)
            Job.current().add_stop_condition(epoch_reader.data_finished())
        return [total]

    expected = expected_totals(node_values(0))
    with Cluster():
        with Job() as job:
            outputs = build(0)
        fetch = make_fetcher(outputs)
        job.compile(LocalSession)
        ws = workspace.Workspace()
        runner = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path),
                                                           'minidb'))
        assert runner.train(LocalSession(ws)) == len(expected)
        assert runner.failed_saves == []
        # Caffe2 counted 17: these 7, and two timer blobs left by every
        # save (so one more pair per epoch).  The runtime's own blobs are
        # now three, reused by every save.
        assert len([b for b in ws.blobs
                    if not b.startswith(INTERNAL_PREFIX)]) == 7
        assert sorted(b for b in ws.blobs if b.startswith(INTERNAL_PREFIX)) == [
            INTERNAL_PREFIX + 'trainer_0/' + name
            for name in ('checkpoint_save_ns', 'job_state', 'timer')]
        for epoch in range(1, len(expected) + 1):
            session = LocalSession(workspace.Workspace())
            JobRunner(job, MultiNodeCheckpointManager(str(tmp_path), 'minidb'),
                      resume_from_epoch=epoch).train(session)
            assert fetch(session) == [expected[-1]]


def build_three_node_job(data_dir, num_nodes=3):
    with Job() as job:
        totals = [build_pipeline(i, data_dir)[0] for i in range(num_nodes)]
    return job, [str(t) for t in totals]


def test_multi_node_job_checkpoints_every_node(tmp_path):
    ckpt_dir = str(tmp_path / 'ckpt')
    os.makedirs(ckpt_dir)
    expected = [expected_totals(node_values(i)) for i in range(3)]
    nodes = ['trainer_0', 'trainer_1', 'trainer_2']
    with Cluster():
        job, totals = build_three_node_job(str(tmp_path))
        job.compile(LocalSession)
        assert job.nodes_to_checkpoint() == nodes
        manager = MultiNodeCheckpointManager(ckpt_dir, 'minidb')
        ws = workspace.Workspace()
        num_epochs = JobRunner(job, manager).train(LocalSession(ws))
        assert num_epochs == 4
        for name, want in zip(totals, expected):
            assert int(ws.fetch_blob(name)[0]) == want[-1]

        # One db per node and epoch, named <node>.<epoch> in db_prefix.
        for node in nodes:
            assert manager.get_ckpt_db_name(node, 5) == os.path.join(
                ckpt_dir, node + '.5')
            for epoch in range(num_epochs + 1):
                assert os.path.isfile(os.path.join(ckpt_dir, '%s.%d' % (
                    node, epoch)))
        assert manager.get_ckpt_db_name('nobody', 1) is None

        # Every node keeps its blob list in a blob of its own (Caffe2's
        # managers all wrote 'blob_names').
        names_blobs = [str(m._blob_names) for _, m in manager.managers()]
        assert names_blobs == [n + '/blob_names' for n in nodes]
        for node, blob in zip(nodes, names_blobs):
            stored = [e['name'] for e in _core.list_db(
                os.path.join(ckpt_dir, node + '.2'), 'minidb')]
            assert blob in stored
            assert 'blob_names' not in stored

        # Partial loads of the totals into a new session, epoch by epoch.
        ws2 = workspace.Workspace()
        session = LocalSession(ws2)
        runner = JobRunner(job, MultiNodeCheckpointManager(ckpt_dir, 'minidb'))
        for epoch in range(1, num_epochs + 1):
            assert runner.load_blobs_from_checkpoints(
                blob_names=totals, epoch=epoch, session=session)
            for name, want in zip(totals, expected):
                assert int(ws2.fetch_blob(name)[0]) == want[epoch - 1]
        assert not runner.load_blobs_from_checkpoints(
            blob_names=totals, epoch=num_epochs + 1, session=session)


def test_single_node_manager_can_load_blobs_from_checkpoints(tmp_path):
    # Caffe2's JobRunner needed load_blobs_locally, which only the
    # multi-node manager had.
    expected = expected_totals(node_values(0))
    with Cluster():
        with Job() as job:
            outputs = build_pipeline(0, str(tmp_path))
        job.compile(LocalSession)
        manager = CheckpointManager(str(tmp_path), 'temp_node', 'ferro')
        JobRunner(job, manager).train(LocalSession(workspace.Workspace()))
        ws = workspace.Workspace()
        runner = JobRunner(job, CheckpointManager(str(tmp_path), 'temp_node',
                                                  'ferro'))
        for epoch in (1, 3):
            assert runner.load_blobs_from_checkpoints(
                [str(outputs[0])], epoch, LocalSession(ws))
            total = int(ws.fetch_blob(str(outputs[0]))[0])
            assert total == expected[epoch - 1]
        assert not runner.load_blobs_from_checkpoints(
            [str(outputs[0])], 9, LocalSession(ws))


def test_a_reused_multi_node_manager(tmp_path):
    expected = expected_totals(node_values(0))
    ws = workspace.Workspace()
    session = LocalSession(ws)
    checkpoint = MultiNodeCheckpointManager(str(tmp_path / 'ckpt'), 'minidb')
    os.makedirs(str(tmp_path / 'ckpt'))
    with Job() as job:
        outputs = build_pipeline(0, str(tmp_path))
    fetch = make_fetcher(outputs)
    job.compile(LocalSession)
    num_epochs = JobRunner(job, checkpoint).train(session)
    assert num_epochs == len(expected)
    for initial_epoch in range(1, num_epochs + 1):
        runner = JobRunner(job, checkpoint, resume_from_epoch=initial_epoch)
        # Caffe2 ran one more epoch when resumed from the last one
        # (max(num_epochs, initial_epoch + 1)); the job state in the
        # checkpoint says the job stopped there, so no epoch runs.
        assert runner.train(session) == num_epochs
        assert (runner.epoch is None) == (initial_epoch == num_epochs)
        assert fetch(session) == [expected[-1]]
    # The node list of a reused manager cannot change; an init returns an
    # empty group.
    group = checkpoint.init(['trainer_0'])
    assert isinstance(group, TaskGroup) and group.num_registered_tasks() == 0
    with pytest.raises(AssertionError):
        checkpoint.init(['trainer_0', 'trainer_1'])


def copy_file_op(src, dest):
    def copy(inputs, outputs):
        shutil.copyfile(src, dest)
    return copy


class UploadToLocalDir(UploadTaskGroupBuilder):
    """Copies every node's db of the last epoch to ``dest_dir/<node>``."""

    def __init__(self, dest_dir):
        self.dest_dir = dest_dir
        self.epochs = []

    def build(self, epoch, checkpoint_manager):
        self.epochs.append(epoch)
        with TaskGroup(WorkspaceType.GLOBAL) as upload_group:
            for node, manager in checkpoint_manager.managers():
                with Node(str(node)), Task():
                    src = db_name(epoch, manager._node_name,
                                  manager._db_prefix)
                    dest = os.path.join(self.dest_dir, str(node))
                    ops.Python((copy_file_op, [src, dest], {}))([], [])
        return upload_group


@pytest.mark.parametrize('kind', ['single', 'multi'])
def test_upload_builder_tasks_copy_each_nodes_db(tmp_path, kind):
    ckpt_dir = str(tmp_path / 'ckpt')
    upload_dir = str(tmp_path / 'upload')
    os.makedirs(ckpt_dir)
    os.makedirs(upload_dir)
    with Cluster():
        if kind == 'multi':
            job, _ = build_three_node_job(str(tmp_path))
            nodes = ['trainer_0', 'trainer_1', 'trainer_2']
        else:
            with Job() as job:
                build_pipeline(0, str(tmp_path))
            nodes = ['temp_node']
        job.compile(LocalSession)
        uploader = UploadToLocalDir(upload_dir)
        for node in nodes:
            assert not os.path.exists(os.path.join(upload_dir, node))
        runner = JobRunner(job, MANAGERS[kind](ckpt_dir, 'ferro'),
                           upload_task_group_builder=uploader)
        num_epochs = runner.train(LocalSession(workspace.Workspace()))
    assert uploader.epochs == [num_epochs]
    assert sorted(os.listdir(upload_dir)) == nodes
    for node in nodes:
        uploaded = os.path.join(upload_dir, node)
        assert filecmp.cmp(uploaded, os.path.join(
            ckpt_dir, '%s.%d' % (node, num_epochs)), shallow=False)
        _core.verify_db(uploaded, 'ferro')


class _FailingWrite(MetadataHandler):
    """A handler whose write fails for one epoch."""

    def __init__(self, bad_epoch):
        self.bad_epoch = bad_epoch
        self.written = []

    def write(self, epoch):
        if epoch == self.bad_epoch:
            raise IOError('metadata store unavailable')
        self.written.append(epoch)


@pytest.mark.parametrize('handler', [None, 'file'])
@pytest.mark.parametrize('kind', ['single', 'multi'])
def test_a_failing_save_is_reported_and_training_goes_on(
        tmp_path, caplog, kind, handler):
    # A folder that cannot be created, even by root: its parent is a file.
    blocker = tmp_path / 'a_file'
    blocker.write_text('not a directory')
    ckpt_dir = str(blocker / 'checkpoints')
    expected = expected_totals(node_values(0))
    caplog.set_level(logging.WARNING, logger='ferrocaffe.checkpoint')
    with Cluster():
        with Job() as job:
            outputs = build_pipeline(0, str(tmp_path))
        fetch = make_fetcher(outputs)
        job.compile(LocalSession)
        session = LocalSession(workspace.Workspace())
        runner = JobRunner(job, MANAGERS[kind](
            ckpt_dir, 'minidb',
            FileMetadataHandler() if handler else None))
        assert runner.train(session) == len(expected)
        assert fetch(session) == [expected[-1]]
    assert [e for e, _ in runner.failed_saves] == list(
        range(len(expected) + 1))
    assert runner.last_checkpoint_epoch is None
    messages = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING]
    for epoch in range(len(expected) + 1):
        assert any('Unable to write checkpoint for epoch %d' % epoch in m
                   for m in messages), messages


def test_one_failed_save_does_not_stop_the_next_ones(tmp_path, caplog):
    handler = _FailingWrite(bad_epoch=2)
    with Job() as job:
        build_pipeline(0, str(tmp_path))
    runner = JobRunner(job, CheckpointManager(str(tmp_path), 'n', 'ferro',
                                              handler))
    assert runner.train(LocalSession(workspace.Workspace())) == 4
    assert [e for e, _ in runner.failed_saves] == [2]
    assert 'metadata store unavailable' in str(runner.failed_saves[0][1])
    assert handler.written == [0, 1, 3, 4]
    assert runner.last_checkpoint_epoch == 4
    assert sorted(runner.save_seconds) == [0, 1, 3, 4]
    assert any('epoch 2' in r.getMessage() for r in caplog.records)


# ================================================= metadata handlers ==

class RecordingHandler(MetadataHandler):
    """Records the protocol calls; ``resume`` overrides the user's
    epoch."""

    def __init__(self, resume=None):
        self.calls = []
        self.resume = resume

    def set_params(self, **kwargs):
        self.calls.append(('set_params', kwargs))

    def last_epoch(self, user_epoch=None):
        self.calls.append(('last_epoch', user_epoch))
        return self.resume if self.resume is not None else user_epoch

    def cp_accessible(self, epoch=None):
        self.calls.append(('cp_accessible', epoch))
        return True

    def write(self, epoch):
        self.calls.append(('write', epoch))

    def report(self, action_name, stats):
        self.calls.append(('report', action_name, stats))


@pytest.mark.parametrize('kind', ['single', 'multi'])
def test_metadata_handler_protocol(tmp_path, kind):
    expected = expected_totals(node_values(0))
    ckpt_dir = str(tmp_path)
    node = 'temp_node' if kind == 'single' else 'trainer_0'
    with Job() as job:
        outputs = build_pipeline(0, str(tmp_path))
    fetch = make_fetcher(outputs)
    job.compile(LocalSession)

    handler = RecordingHandler()
    session = LocalSession(workspace.Workspace())
    JobRunner(job, MANAGERS[kind](ckpt_dir, 'ferro', handler)).train(session)
    params = dict(db_prefix=ckpt_dir, db_type='ferro', node_names=[node],
                  path_prefix=None, path_type=None)
    assert handler.calls[:2] == [('set_params', params),
                                 ('last_epoch', None)]
    rest = handler.calls[2:]
    assert len(rest) == 3 * (len(expected) + 1)
    for epoch in range(len(expected) + 1):
        accessible, write, report = rest[3 * epoch:3 * epoch + 3]
        assert accessible == ('cp_accessible', None)
        assert write == ('write', epoch)
        assert report[:2] == ('report', 'checkpoint_save')
        stats = report[2]
        assert list(stats) == [db_name(epoch, node, ckpt_dir)]
        assert int(list(stats.values())[0]) > 0  # the save's duration, ns

    # The handler's last_epoch overrides the user's choice.
    handler = RecordingHandler(resume=2)
    session = LocalSession(workspace.Workspace())
    runner = JobRunner(job, MANAGERS[kind](ckpt_dir, 'ferro', handler))
    assert runner.train(session) == len(expected)
    assert runner.resumed_from_epoch == 2
    assert fetch(session) == [expected[-1]]
    assert handler.calls[1] == ('last_epoch', None)
    assert handler.calls[2][:2] == ('report', 'checkpoint_load')
    assert list(handler.calls[2][2]) == [db_name(2, node, ckpt_dir)]
    assert [c[1] for c in handler.calls if c[0] == 'write'] == [3, 4]


def test_cp_accessible_false_skips_the_save_with_a_warning(tmp_path, caplog):
    class Unreachable(RecordingHandler):
        def cp_accessible(self, epoch=None):
            return False

    with Job() as job:
        build_pipeline(0, str(tmp_path))
    runner = JobRunner(job, CheckpointManager(str(tmp_path / 'c'), 'n',
                                              'ferro', Unreachable()))
    assert runner.train(LocalSession(workspace.Workspace())) == 4
    assert len(runner.failed_saves) == 5
    assert not os.path.exists(str(tmp_path / 'c'))
    assert any('cannot be accessed' in r.getMessage()
               for r in caplog.records)


class PipelineJob(object):
    """Node 0's pipeline job, built once and run as often as needed: a
    resumed run must use the blob names of the run that saved."""

    def __init__(self, data_dir):
        with Job() as job:
            outputs = build_pipeline(0, data_dir)
        self.job = job
        self.fetch = make_fetcher(outputs)

    def __call__(self, ckpt_dir, handler=None, resume=None, kind='single',
                 db_type='ferro'):
        """``(runner, last epoch, final total)`` of a run."""
        session = LocalSession(workspace.Workspace())
        runner = JobRunner(self.job,
                           MANAGERS[kind](ckpt_dir, db_type, handler),
                           resume_from_epoch=resume, progress=False)
        last = runner.train(session)
        return runner, last, self.fetch(session)[0]


@pytest.fixture
def run_pipeline(tmp_path):
    return PipelineJob(str(tmp_path))


@pytest.mark.parametrize('db_type', ['ferro', 'minidb', 'leveldb'])
def test_manifest_lists_the_completed_epochs(tmp_path, db_type, run_pipeline):
    ckpt_dir = str(tmp_path / 'ckpt')
    runner, last, total = run_pipeline(ckpt_dir,
                                       FileMetadataHandler(), db_type=db_type)
    assert (last, total) == (4, 145)
    manifest = read_manifest(ckpt_dir)
    assert manifest['latest'] == 4
    assert manifest['nodes'] == ['temp_node']
    assert [e['epoch'] for e in manifest['epochs']] == [0, 1, 2, 3, 4]
    for entry in manifest['epochs']:
        assert entry['db_type'] == db_type
        assert entry.get('finished', False) == (entry['epoch'] == 4)
        info = entry['dbs']['temp_node']
        path = os.path.join(ckpt_dir, info['file'])
        assert info['file'] == 'temp_node.%d' % entry['epoch']
        if db_type == 'leveldb':
            # A LevelDB directory: the bytes of its files.
            assert os.path.isfile(os.path.join(path, 'CURRENT'))
            assert info['bytes'] == sum(
                os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        else:
            assert info['bytes'] == os.path.getsize(path)
        if db_type == 'minidb':
            assert info['crc32'] == zlib.crc32(open(path, 'rb').read())
        else:
            assert 'crc32' not in info
    # The manifest was replaced atomically: no temporaries are left.
    assert sorted(os.listdir(ckpt_dir)) == ['manifest.json'] + [
        'temp_node.%d' % e for e in range(5)]


@pytest.mark.parametrize('kind', ['single', 'multi'])
def test_checkpoint_directories_may_be_pathlike(tmp_path, kind):
    # A pathlib.Path for the data, the checkpoint directory and a
    # path_prefix, where str was needed.
    run_pipeline = PipelineJob(tmp_path)
    ckpt_dir = tmp_path / 'ckpt'
    runner, last, total = run_pipeline(ckpt_dir, FileMetadataHandler(),
                                       kind=kind)
    assert (last, total) == (4, 145)
    assert read_manifest(ckpt_dir)['latest'] == 4
    _, last, total = run_pipeline(ckpt_dir, FileMetadataHandler(),
                                  resume='latest', kind=kind)
    assert (last, total) == (4, 145)
    node = 'temp_node' if kind == 'single' else 'trainer_0'
    assert db_name(2, node, 'unused', path_prefix=ckpt_dir / 'x_') == \
        str(ckpt_dir / 'x_') + node + '.2'


@pytest.mark.parametrize('kind', ['single', 'multi'])
def test_max_to_keep_keeps_the_newest_epochs(tmp_path, kind, run_pipeline):
    ckpt_dir = str(tmp_path / 'ckpt')
    run_pipeline(ckpt_dir, FileMetadataHandler(max_to_keep=2),
                 kind=kind)
    node = 'temp_node' if kind == 'single' else 'trainer_0'
    assert sorted(os.listdir(ckpt_dir)) == [
        'manifest.json', node + '.3', node + '.4']
    assert [e['epoch'] for e in read_manifest(ckpt_dir)['epochs']] == [3, 4]
    with pytest.raises(ValueError):
        FileMetadataHandler(max_to_keep=0)


def test_latest_after_a_finished_run_only_finishes_again(tmp_path,
                                                         run_pipeline):
    ckpt_dir = str(tmp_path / 'ckpt')
    run_pipeline(ckpt_dir, FileMetadataHandler())
    runner, last, total = run_pipeline(ckpt_dir,
                                       FileMetadataHandler(), resume=LATEST)
    assert runner.resumed_from_epoch == 4
    assert (last, total) == (4, 145)
    assert runner.epoch is None  # no epoch ran
    assert read_manifest(ckpt_dir)['latest'] == 4


def simulate_a_kill_after(ckpt_dir, epoch):
    """The directory as a run killed right after saving ``epoch`` would
    have left it: later dbs and manifest entries gone."""
    path = os.path.join(ckpt_dir, 'manifest.json')
    manifest = json.load(open(path))
    for entry in manifest['epochs']:
        if entry['epoch'] > epoch:
            for info in entry['dbs'].values():
                os.unlink(os.path.join(ckpt_dir, info['file']))
        entry.pop('finished', None)
    manifest['epochs'] = [e for e in manifest['epochs']
                          if e['epoch'] <= epoch]
    with open(path, 'w') as f:
        json.dump(manifest, f)


@pytest.mark.parametrize('kind', ['single', 'multi'])
def test_latest_resumes_an_interrupted_run(tmp_path, kind, run_pipeline):
    ckpt_dir = str(tmp_path / 'ckpt')
    run_pipeline(ckpt_dir, FileMetadataHandler(), kind=kind)
    simulate_a_kill_after(ckpt_dir, 2)
    runner, last, total = run_pipeline(
        ckpt_dir, FileMetadataHandler(), resume=LATEST, kind=kind)
    assert runner.resumed_from_epoch == 2
    assert (last, total) == (4, 145)
    assert [e['epoch'] for e in read_manifest(ckpt_dir)['epochs']] == [
        0, 1, 2, 3, 4]


def test_latest_needs_every_node_of_an_epoch(tmp_path, caplog):
    ckpt_dir = str(tmp_path / 'ckpt')
    expected = [expected_totals(node_values(i)) for i in range(3)]
    with Cluster():
        job, totals = build_three_node_job(str(tmp_path))
        JobRunner(job, MultiNodeCheckpointManager(
            ckpt_dir, 'ferro', FileMetadataHandler())).train(
                LocalSession(workspace.Workspace()))
        simulate_a_kill_after(ckpt_dir, 3)
        os.unlink(os.path.join(ckpt_dir, 'trainer_1.3'))
        ws = workspace.Workspace()
        runner = JobRunner(job, MultiNodeCheckpointManager(
            ckpt_dir, 'ferro', FileMetadataHandler()),
            resume_from_epoch=LATEST)
        assert runner.train(LocalSession(ws)) == 4
    assert runner.resumed_from_epoch == 2
    for name, want in zip(totals, expected):
        assert int(ws.fetch_blob(name)[0]) == want[-1]
    assert any('epoch 3 cannot be used' in r.getMessage()
               for r in caplog.records)


def test_a_run_from_scratch_forgets_the_epochs_of_an_older_run(tmp_path):
    ckpt_dir = str(tmp_path / 'ckpt')
    os.makedirs(ckpt_dir)
    # An older run went to epoch 6 (files and manifest entries).
    handler = FileMetadataHandler()
    handler.set_params(ckpt_dir, 'ferro', ['n'])
    for epoch in range(7):
        _core_save(os.path.join(ckpt_dir, 'n.%d' % epoch), epoch)
        handler.write(epoch)
    assert handler.epochs() == list(range(7))
    # A new run writes epoch 2: epochs 3..6 belong to the abandoned run.
    handler.write(2)
    assert handler.epochs() == [0, 1, 2]
    assert sorted(os.listdir(ckpt_dir)) == ['manifest.json', 'n.0', 'n.1',
                                            'n.2']


def _core_save(path, value):
    ws = workspace.Workspace()
    ws.feed_blob('v', np.array([value], np.int64))
    ws.run(core.CreateOperator('Save', ['v'], [], db=path, db_type='ferro',
                               absolute_path=True))


def test_latest_without_a_handler_looks_at_the_files(tmp_path, caplog,
                                                      run_pipeline):
    ckpt_dir = str(tmp_path / 'ckpt')
    os.makedirs(ckpt_dir)
    run_pipeline(ckpt_dir)
    for epoch in (3, 4):
        os.unlink(os.path.join(ckpt_dir, 'temp_node.%d' % epoch))
    assert latest_valid_epoch(ckpt_dir, ['temp_node']) == 2
    assert latest_valid_epoch(ckpt_dir, ['temp_node', 'other']) is None
    runner, last, total = run_pipeline(ckpt_dir, resume=LATEST)
    assert runner.resumed_from_epoch == 2
    assert (last, total) == (4, 145)


def test_latest_with_no_checkpoint_starts_from_scratch(tmp_path, run_pipeline):
    ckpt_dir = str(tmp_path / 'ckpt')
    os.makedirs(ckpt_dir)
    for handler in (None, FileMetadataHandler()):
        shutil.rmtree(ckpt_dir)
        os.makedirs(ckpt_dir)
        runner, last, total = run_pipeline(ckpt_dir, handler,
                                           resume=LATEST)
        assert runner.resumed_from_epoch is None
        assert (last, total) == (4, 145)


def test_latest_needs_a_checkpoint_manager(tmp_path):
    with Job() as job:
        build_pipeline(0, str(tmp_path))
    with pytest.raises(ValueError):
        JobRunner(job, resume_from_epoch=LATEST).train(
            LocalSession(workspace.Workspace()))


def test_file_handler_creates_the_directory(tmp_path):
    handler = FileMetadataHandler()
    with pytest.raises(RuntimeError):
        handler.cp_accessible()
    target = str(tmp_path / 'a' / 'b')
    handler.set_params(target, 'ferro', ['n'])
    assert handler.cp_accessible()
    assert os.path.isdir(target)
    assert not handler.cp_accessible(epoch=1)
    _core_save(os.path.join(target, 'n.1'), 1)
    assert handler.cp_accessible(epoch=1)
    assert handler.last_epoch(None) is None
    assert handler.last_epoch(7) == 7
    assert handler.last_epoch(LATEST) == 1  # no manifest: the files


# ===================================== epoch limiter and group order ==

def test_epoch_limiter_stops_after_n_epochs_and_survives_resume(tmp_path):
    def build(num_epochs):
        with Job() as job:
            with job.init_group, Task():
                ops.Const(np.array([0], np.int64), 'epochs_run')
            with Task():
                ops.Add(['epochs_run', ops.Const(np.array([1], np.int64))],
                        ['epochs_run'])
            epoch_limiter(job, num_epochs)
        return job

    for n in (1, 3):
        ws = workspace.Workspace()
        job = build(n)
        assert job.num_epochs == n
        assert JobRunner(job).train(LocalSession(ws)) == n
        assert int(ws.fetch_blob('epochs_run')[0]) == n

    # The counter is in the checkpoint: resuming goes on to the limit.
    ckpt_dir = str(tmp_path)
    job = build(5)
    JobRunner(job, CheckpointManager(ckpt_dir, 'n', 'ferro')).train(
        LocalSession(workspace.Workspace()))
    for resume in (0, 2, 4):
        ws = workspace.Workspace()
        runner = JobRunner(job, CheckpointManager(ckpt_dir, 'n', 'ferro'),
                           resume_from_epoch=resume)
        assert runner.train(LocalSession(ws)) == 5
        assert int(ws.fetch_blob('epochs_run')[0]) == 5


def test_download_group_runs_between_the_epochs_and_the_exit_group():
    # Caffe2's test_download_group_simple.
    init_net = core.Net('param_init')
    train_net = core.Net('train')
    download_net = core.Net('download_net')
    for name in ['input1', 'input2', 'output', 'download_result']:
        init_net.ConstantFill([], [name], shape=[8], value=1.0, run_once=0)
    train_net.Add(['input1', 'input2'], ['output'])
    download_net.Copy(['output'], ['download_result'])
    with Job() as job:
        with Node('trainer:0'):
            with job.init_group:
                Task(step=init_net)
            with job.epoch_group:
                with Task():
                    with ops.loop(1):
                        ops.net(train_net)
            with job.download_group:
                Task(step=download_net)
            epoch_limiter(job, 1)
    ws = workspace.Workspace()
    assert JobRunner(job).train(LocalSession(ws)) == 1
    expected = np.full(8, 2.0, np.float32)
    np.testing.assert_array_equal(ws.fetch_blob('output'), expected)
    np.testing.assert_array_equal(ws.fetch_blob('download_result'), expected)


class _Log(object):
    def __init__(self):
        self.events = []

    def op(self, event):
        events = self.events

        def record(inputs, outputs):
            events.append(event)
        return record

    def task(self, event):
        with Task():
            ops.Python(self.op(event))([], [])


class _LoggingUpload(UploadTaskGroupBuilder):
    def __init__(self, log):
        self.log = log

    def build(self, epoch, checkpoint_manager):
        with TaskGroup(WorkspaceType.GLOBAL) as group:
            self.log.task('upload %d' % epoch)
        return group


@pytest.mark.parametrize('resume', [None, 1])
def test_the_groups_run_in_order(tmp_path, resume):
    log = _Log()
    with Job() as job:
        with job.init_group:
            log.task('init')
        log.task('epoch')
        with job.download_group:
            log.task('download')
        with job.exit_group:
            log.task('exit')
        epoch_limiter(job, 3)
    job.compile(LocalSession)
    ckpt_dir = str(tmp_path)
    if resume is not None:
        JobRunner(job, CheckpointManager(ckpt_dir, 'n', 'ferro')).train(
            LocalSession(workspace.Workspace()))
        del log.events[:]
    runner = JobRunner(job, CheckpointManager(ckpt_dir, 'n', 'ferro'),
                       resume_from_epoch=resume,
                       upload_task_group_builder=_LoggingUpload(log))
    assert runner.train(LocalSession(workspace.Workspace())) == 3
    if resume is None:
        assert log.events == ['init', 'epoch', 'epoch', 'epoch', 'upload 3',
                              'download', 'exit']
    else:
        # The init group is not run: its blobs come from the checkpoint.
        assert log.events == ['epoch', 'epoch', 'upload 3', 'download',
                              'exit']


# ================================================================ Job ==

def test_job_groups_and_context():
    job = Job()
    assert job.init_group.workspace_type() == WorkspaceType.GLOBAL
    for group in (job.epoch_group, job.download_group, job.exit_group):
        assert isinstance(group, TaskGroup)
        assert group.workspace_type() is None
    assert job.stop_conditions == []
    with job:
        assert Job.current() is job
        assert TaskGroup.current() is job.epoch_group
        task = Task(step=core.Net('x'))
        with job.init_group:
            assert TaskGroup.current() is job.init_group
    assert Job.current(required=False) is None
    assert task in job.epoch_group._tasks_to_add


def test_nodes_to_checkpoint_and_compile(tmp_path):
    with Job() as job:
        with Node('a'), job.init_group:
            Task(step=core.Net('a_init'))
        with Node('b'), job.init_group:
            Task(step=core.Net('b_init'))
        with Node('c'):
            Task(step=core.Net('c_epoch'))
    assert job.nodes_to_checkpoint() == ['a', 'b']
    assert Job(nodes_to_checkpoint=['x']).nodes_to_checkpoint() == ['x']
    assert job.compile(LocalSession) is job
    for group in (job.init_group, job.epoch_group, job.download_group,
                  job.exit_group):
        assert isinstance(group, CompiledRunnable)
    assert job.nodes_to_checkpoint() == ['a', 'b']
    assert job.compile(LocalSession) is job  # compiling again is harmless

    # Caffe2 crashed here: a compiled job with an empty init group.
    empty = Job()
    empty.compile(LocalSession)
    assert empty.nodes_to_checkpoint() == []
    ws = workspace.Workspace()
    with Job() as job:
        Task(step=core.Net('nothing'))
        epoch_limiter(job, 2)
    job.compile(LocalSession)
    assert JobRunner(job, CheckpointManager(
        str(tmp_path), 'n', 'ferro'))(LocalSession(ws)) == 2


def test_stop_conditions_and_old_names():
    assert Job.add_stop_signal is Job.add_stop_condition
    assert JobRunner.__call__ is JobRunner.train
    job = Job()
    flag = core.BlobReference('flag')
    job.add_stop_signal(flag)
    (output,) = job.stop_conditions
    assert output.names == [flag]
    (task,) = job.epoch_group._tasks_to_add
    assert task.outputs() == [output]
    with pytest.raises(AssertionError):
        job.add_stop_condition(42)


def test_file_names():
    assert get_ckpt_filename('trainer_1', 7) == 'trainer_1.7'
    assert db_name(3, 'node', '/ckpt') == '/ckpt/node.3'
    # A path prefix is concatenated as it is.
    assert db_name(3, 'node', '/ckpt', 'hdfs://bucket/run_') == (
        'hdfs://bucket/run_node.3')


def test_manager_argument_checks(tmp_path):
    manager = CheckpointManager(str(tmp_path), 'n', 'ferro')
    with pytest.raises(AssertionError):
        manager.init(['a', 'b'])
    with pytest.raises(AssertionError):
        MultiNodeCheckpointManager(str(tmp_path)).save(1)
    with pytest.raises(NotImplementedError):
        UploadTaskGroupBuilder().build(1, manager)
    runner = JobRunner(Job())
    with pytest.raises(ValueError):
        runner.save_checkpoints(1, LocalSession(workspace.Workspace()))
    with pytest.raises(ValueError):
        runner.load_blobs_from_checkpoints(['x'], 1, None)
    assert manager.cp_accessible() is True
    assert manager.get_resume_from_epoch_id(5) == 5


def test_load_and_partial_load_from_a_path_prefix(tmp_path):
    """load, the partial load and the existence check all read from a
    path prefix (Caffe2's partial load and check ignored it)."""
    expected = expected_totals(node_values(0))
    ckpt_dir = str(tmp_path / 'ckpt')
    os.makedirs(ckpt_dir)
    with Job() as job:
        outputs = build_pipeline(0, str(tmp_path))
    fetch = make_fetcher(outputs)
    JobRunner(job, CheckpointManager(ckpt_dir, 'n', 'ferro')).train(
        LocalSession(workspace.Workspace()))
    mirror = str(tmp_path / 'mirror')
    os.makedirs(mirror)
    for name in os.listdir(ckpt_dir):
        shutil.copy(os.path.join(ckpt_dir, name),
                    os.path.join(mirror, 'copy_' + name))
    shutil.rmtree(ckpt_dir)
    prefix = os.path.join(mirror, 'copy_')

    manager = CheckpointManager(ckpt_dir, 'n', 'ferro')
    session = LocalSession(workspace.Workspace())
    session.run(manager.init(['n'], retrieve_from_epoch=2,
                             path_prefix=prefix))
    session.run(manager.load(2, path_prefix=prefix))
    assert fetch(session) == [expected[1]]

    ws = workspace.Workspace()
    assert manager.load_blobs_locally(['n'], [str(outputs[0])], 3,
                                      LocalSession(ws), path_prefix=prefix)
    assert int(ws.fetch_blob(str(outputs[0]))[0]) == expected[2]
    assert not manager.load_blobs_locally(['n'], [str(outputs[0])], 3,
                                          LocalSession(ws))


# ================================================ save/load round trips ==

def run_in_session(session, build):
    with Task() as task:
        build()
    session.run(task)


TENSORS = {
    'f32': (np.arange(12, dtype=np.float32).reshape(3, 4) / 7),
    'f64': np.array([1.5, -2.25, np.pi, np.inf]),
    'i8': np.array([-128, 0, 127], np.int8),
    'i16': np.array([-32768, 7, 32767], np.int16),
    'i32': np.array([[-2 ** 31, 0], [5, 2 ** 31 - 1]], np.int32),
    'i64': np.array([-2 ** 63, 0, 2 ** 63 - 1], np.int64),
    'u8': np.array([0, 200, 255], np.uint8),
    'u16': np.array([0, 40000, 65535], np.uint16),
    'bool': np.array([True, False, True]),
    'str': np.array([b'', b'caffe2', u'\u00fcml\u00e4ut'.encode('utf-8'),
                     b'\x00\xff'], dtype=object),
    'scalar': np.array(3.5, np.float32),
    'empty': np.zeros((0, 3), np.int32),
    # More elements than a minidb record holds: stored in 2 chunks.
    'big': np.arange(1500000, dtype=np.float32),
}


@pytest.mark.parametrize('db_type', ['minidb', 'ferro'])
def test_save_load_round_trip_of_every_blob_kind(tmp_path, db_type):
    src = workspace.Workspace()
    for name, value in TENSORS.items():
        src.feed_blob(name, value)
    src.feed_blob('text', b'a byte string blob \x00\x01')
    session = LocalSession(src)

    npy = str(tmp_path / 'col.npy')
    np.save(npy, np.arange(10, dtype=np.int64) * 3)
    npy_reader = NpyReader([npy], batch_size=2, name='npy_reader')
    pq_path = str(tmp_path / 'data.parquet')
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({'v': np.arange(10, dtype=np.float32) / 2}),
                   pq_path)
    pq_reader = ParquetReader(pq_path, ['v'], batch_size=3, name='pq_reader')

    def setup():
        ops.CreateCounter([], ['counter'], init_count=7)
        ops.CountUp(['counter'], ['previous'])
        ops.CountUp(['counter'], ['previous'])
        ops.CreateMutex([], ['mutex'])
        npy_reader.setup_ex(ops, None)
        pq_reader.setup_ex(ops, None)
        ops.ReadNpyBatch(['npy_reader'], ['npy_first'])
        ops.ReadParquetBatch(['pq_reader'], ['pq_first'])
    run_in_session(session, setup)
    np.testing.assert_array_equal(src.fetch_blob('npy_first'), [0, 3])

    names = sorted(TENSORS) + ['text', 'counter', 'mutex', 'npy_reader',
                               'pq_reader']
    db = str(tmp_path / ('all.' + db_type))
    run_in_session(session, lambda: ops.Save(
        names, [], db=db, db_type=db_type, absolute_path=True))
    _core.verify_db(db, db_type)
    listed = {e['name']: e for e in _core.list_db(db, db_type)}
    assert sorted(listed) == sorted(names)

    dst = workspace.Workspace()
    session2 = LocalSession(dst)
    run_in_session(session2, lambda: ops.Load(
        [], names, db=db, db_type=db_type, absolute_path=True))
    for name, want in TENSORS.items():
        got = dst.fetch_blob(name)
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert dst.fetch_blob('text') == b'a byte string blob \x00\x01'
    assert dst.blobs['mutex'].kind() == src.blobs['mutex'].kind()

    def after_load():
        ops.RetrieveCount(['counter'], ['count'])
        ops.ReadNpyBatch(['npy_reader'], ['npy_next'])
        ops.ReadParquetBatch(['pq_reader'], ['pq_next'])
    run_in_session(session2, after_load)
    assert int(dst.fetch_blob('count')) == 9
    # The readers go on where they were when saved.
    np.testing.assert_array_equal(dst.fetch_blob('npy_next'), [6, 9])
    np.testing.assert_array_equal(dst.fetch_blob('pq_next'),
                                  np.array([1.5, 2.0, 2.5], np.float32))


@pytest.mark.parametrize('db_type', ['minidb', 'ferro'])
def test_tree_cursor_round_trip(tmp_path, db_type):
    src = workspace.Workspace()
    session = LocalSession(src)
    values = np.arange(20, dtype=np.int64) * 5
    with Task() as task:
        ds = Dataset(ConstRecord(ops, Struct(('val', values))), name='ds')
        reader = ds.reader(ops, batch_size=4)
        reader.read_record(ops)
    session.run(task)
    cursor = 'ds_cursor'
    assert src.has_blob(cursor)
    db = str(tmp_path / 'cursor')
    run_in_session(session, lambda: ops.Save(
        [cursor], [], db=db, db_type=db_type, absolute_path=True))
    dst = workspace.Workspace()
    dst.feed_blob('val', values)
    session2 = LocalSession(dst)
    run_in_session(session2, lambda: ops.Load(
        [], [cursor], db=db, db_type=db_type, absolute_path=True))
    run_in_session(session2, lambda: ops.ReadNextBatch(
        [cursor, 'val'], ['next'], batch_size=4))
    np.testing.assert_array_equal(dst.fetch_blob('next'), values[4:8])


# ============================================================ progress ==

class _FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_shown_only_on_a_terminal_outside_ci(monkeypatch):
    monkeypatch.delenv('CI', raising=False)
    monkeypatch.setenv('TERM', 'xterm')
    assert _progress_wanted(_FakeTerminal())
    assert not _progress_wanted(io.StringIO())
    monkeypatch.setenv('TERM', 'dumb')
    assert not _progress_wanted(_FakeTerminal())
    monkeypatch.setenv('TERM', 'xterm')
    monkeypatch.setenv('CI', 'true')
    assert not _progress_wanted(_FakeTerminal())
    job = Job()
    assert isinstance(_make_progress(False, job), _NoProgress)
    monkeypatch.setattr(sys, 'stderr', _FakeTerminal())
    assert isinstance(_make_progress(None, job), _NoProgress)  # CI
    monkeypatch.delenv('CI')
    progress = _make_progress(None, job)
    assert not isinstance(progress, _NoProgress)
    progress.close()


def test_progress_shows_epoch_batches_rate_and_last_checkpoint(tmp_path):
    stream = io.StringIO()
    with Job() as job:
        build_pipeline(0, str(tmp_path), track=True)
    runner = JobRunner(job, CheckpointManager(str(tmp_path), 'n', 'ferro'),
                       progress=stream)
    assert runner.train(LocalSession(workspace.Workspace())) == 4
    text = stream.getvalue()
    assert 'epoch 4' in text
    assert 'batches 10' in text
    assert 'rows/s' in text
    assert 'checkpoint of epoch 4 saved in' in text


def test_no_progress_output_when_not_on_a_terminal(tmp_path, capsys):
    with Job() as job:
        build_pipeline(0, str(tmp_path), track=True)
    JobRunner(job, CheckpointManager(str(tmp_path), 'n', 'ferro')).train(
        LocalSession(workspace.Workspace()))
    captured = capsys.readouterr()
    assert captured.err == '' and captured.out == ''


# ======================================================= command line ==

def test_cli_ls_and_verify(tmp_path):
    ckpt_dir = str(tmp_path / 'ckpt')
    with Job() as job:
        outputs = build_pipeline(0, str(tmp_path))
    manager = CheckpointManager(ckpt_dir, 'n', 'ferro',
                                FileMetadataHandler(max_to_keep=3))
    JobRunner(job, manager).train(LocalSession(workspace.Workspace()))
    out = io.StringIO()
    assert checkpoint_cli(['ls', ckpt_dir], out=out) == 0
    text = out.getvalue()
    assert 'manifest lists epochs 2, 3, 4 (latest 4, max_to_keep 3)' in text
    for epoch in (2, 3, 4):
        assert 'epoch %d' % epoch in text
        assert 'n.%d' % epoch in text
    assert 'epoch 1' not in text
    assert 'reader_0' in text and 'int64' in text
    # The job's runtime blobs (task outputs, the list of names) are left
    # out unless asked for.
    assert 'blob_names' not in text and 'runtime blobs not shown' in text
    out = io.StringIO()
    assert checkpoint_cli(['ls', '--all', ckpt_dir], out=out) == 0
    assert 'blob_names' in out.getvalue() and str(outputs[0]) in out.getvalue()
    # Every blob row's columns line up (one table per db).
    first_db = out.getvalue().split('job state')[1].split('\n  n')[0]
    rows = [line for line in first_db.splitlines()[1:] if ' tensor ' in line or ' object ' in line]
    kind_at = {r.index(' tensor ' if ' tensor ' in r else ' object ') for r in rows}
    assert len(rows) > 3 and len(kind_at) == 1, rows
    # A work dir that holds the checkpoint directory is enough.
    out = io.StringIO()
    assert checkpoint_cli(['ls', str(tmp_path)], out=out) == 0
    assert 'showing %s' % ckpt_dir in out.getvalue() and 'n.4' in out.getvalue()

    out = io.StringIO()
    assert checkpoint_cli(['verify', ckpt_dir], out=out) == 0
    assert 'all 3 checkpoint files verify' in out.getvalue()

    path = os.path.join(ckpt_dir, 'n.3')
    data = bytearray(open(path, 'rb').read())
    data[len(data) // 3] ^= 0x04
    open(path, 'wb').write(bytes(data))
    out = io.StringIO()
    assert checkpoint_cli(['verify', ckpt_dir], out=out) == 1
    assert 'DAMAGED  epoch 3 node n (n.3)' in out.getvalue()
    out = io.StringIO()
    assert checkpoint_cli(['ls', ckpt_dir], out=out) == 0
    assert 'UNREADABLE' in out.getvalue() or 'n.3' in out.getvalue()

    # A directory without a manifest: the files are found by name.
    os.unlink(os.path.join(ckpt_dir, 'manifest.json'))
    out = io.StringIO()
    assert checkpoint_cli(['verify', ckpt_dir], out=out) == 1
    os.unlink(path)
    out = io.StringIO()
    assert checkpoint_cli(['verify', ckpt_dir], out=out) == 0
    out = io.StringIO()
    assert checkpoint_cli(['ls', ckpt_dir], out=out) == 0
    assert 'no manifest' in out.getvalue()

    empty = str(tmp_path / 'empty')
    os.makedirs(empty)
    out = io.StringIO()
    assert checkpoint_cli(['ls', empty], out=out) == 2
    assert 'no checkpoints in %s or the directories below it' % empty in out.getvalue()
    assert checkpoint_cli(['verify', empty], out=io.StringIO()) == 2
    assert checkpoint_cli(['verify', str(tmp_path / 'nope')],
                          out=io.StringIO()) == 2


def test_cli_as_a_module(tmp_path):
    ckpt_dir = str(tmp_path / 'ckpt')
    with Job() as job:
        build_pipeline(0, str(tmp_path))
    JobRunner(job, CheckpointManager(ckpt_dir, 'n', 'minidb',
                                     FileMetadataHandler())).train(
        LocalSession(workspace.Workspace()))
    env = dict(os.environ, PYTHONPATH=PKG_PARENT)
    cmd = [sys.executable, '-m', 'ferrocaffe.checkpoint']
    ok = subprocess.run(cmd + ['verify', ckpt_dir], env=env,
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    listing = subprocess.run(cmd + ['ls', ckpt_dir], env=env,
                             capture_output=True, text=True)
    assert listing.returncode == 0 and 'n.4' in listing.stdout
    with open(os.path.join(ckpt_dir, 'n.2'), 'r+b') as f:
        f.truncate(os.path.getsize(os.path.join(ckpt_dir, 'n.2')) - 3)
    bad = subprocess.run(cmd + ['verify', ckpt_dir], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert 'DAMAGED' in bad.stdout and 'n.2' in bad.stdout


@pytest.mark.parametrize('command', ['ls', 'verify'])
def test_cli_whose_reader_stops_early_exits_quietly(tmp_path, command):
    """``python -m ferrocaffe.checkpoint ls DIR | head``: once the reader
    has gone, the command ends as a Unix tool does (the status of a
    SIGPIPE death, 128 + 13), with no BrokenPipeError traceback."""
    ckpt_dir = tmp_path / 'ckpt'
    ckpt_dir.mkdir()
    ws = workspace.Workspace()
    ws.feed_blob('w', np.arange(4, dtype=np.float32))
    for epoch in range(3):
        ws.run(core.CreateOperator('Save', ['w'], [],
                                   db=str(ckpt_dir / ('n.%d' % epoch)),
                                   db_type='ferro', absolute_path=True))
    # The read end is closed before the child starts, so its first write
    # (or the flush at exit) meets a pipe without a reader, as it does once
    # `head` has read its lines: no race on how much fits the pipe.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, '-m', 'ferrocaffe.checkpoint', command,
             str(ckpt_dir)],
            stdout=write_end, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=PKG_PARENT), timeout=120)
    finally:
        os.close(write_end)
    assert done.stderr == ''
    assert done.returncode == 141


# ========================================================= the example ==

def example_cmd(workdir, *extra):
    return [sys.executable, EXAMPLE, '--workdir', workdir, '--rows', '2400',
            '--batches-per-epoch', '400', '--no-progress'] + list(extra)


def example_env():
    env = dict(os.environ)
    env.pop('CI', None)
    return env


def read_example_model(workdir):
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import linear_job as train_job
    finally:
        sys.path.pop(0)
    return train_job.read_model(os.path.join(workdir, 'model'))


def test_example_job_resumes_after_ctrl_c_with_the_same_model(tmp_path):
    reference = str(tmp_path / 'reference')
    done = subprocess.run(example_cmd(reference, '--threads', '1'),
                          env=example_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert 'trained through epoch 7' in done.stdout
    assert os.path.exists(os.path.join(reference, 'data', 'train.parquet'))

    workdir = str(tmp_path / 'interrupted')
    # A slow source (0.5 ms per record), so that the signal lands in an
    # epoch whatever the build's speed.
    proc = subprocess.Popen(example_cmd(workdir, '--threads', '1',
                                        '--verbose', '--read-delay', '0.0005'),
                            env=example_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if 'Starting epoch 3' in line:
            break
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert 'run the same command again to resume' in err

    again = subprocess.run(example_cmd(workdir, '--threads', '1'),
                           env=example_env(), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr
    assert 'checkpoints found up to epoch' in again.stdout
    resumed = int(again.stdout.split('resumed from epoch ')[1].split()[0])
    assert resumed >= 2
    assert 'trained through epoch 7' in again.stdout

    w_ref, b_ref = read_example_model(reference)
    w, b = read_example_model(workdir)
    np.testing.assert_array_equal(w, w_ref)
    assert b == b_ref


def test_example_job_extended_with_more_epochs_equals_one_longer_run(
        tmp_path):
    def example(workdir, *extra):
        run = subprocess.run(example_cmd(workdir, '--threads', '1', *extra),
                             env=example_env(), capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        return run.stdout

    extended = str(tmp_path / 'extended')
    assert 'trained through epoch 2' in example(extended, '--epochs', '2')
    out = example(extended, '--epochs', '4')
    assert 'resumed from epoch 2' in out
    assert 'trained through epoch 4' in out
    reference = str(tmp_path / 'reference')
    assert 'trained through epoch 4' in example(reference, '--epochs', '4')
    w_ref, b_ref = read_example_model(reference)
    w, b = read_example_model(extended)
    np.testing.assert_array_equal(w, w_ref)
    assert b == b_ref
    # Run again with the same limit: finished, no epoch runs.
    out = example(extended, '--epochs', '4')
    assert 'the job had finished' in out
    np.testing.assert_array_equal(read_example_model(extended)[0], w_ref)

    # --fresh deletes the checkpoints, the model and the data, then starts
    # over.
    for sub in ('checkpoints', 'data'):
        open(os.path.join(extended, sub, 'marker'), 'w').close()
    out = example(extended, '--fresh', '--epochs', '1')
    assert 'resumed' not in out and 'trained through epoch 1' in out
    assert not os.path.exists(os.path.join(extended, 'data', 'marker'))
    assert sorted(os.listdir(os.path.join(extended, 'checkpoints'))) == [
        'manifest.json', 'trainer.0', 'trainer.1']
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import linear_job as train_job
    finally:
        sys.path.pop(0)
    train_job.remove_outputs(train_job.Config(workdir=extended))
    assert not os.path.exists(extended)


def test_example_job_with_threads_learns_the_model(tmp_path):
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import linear_job as train_job
    finally:
        sys.path.pop(0)
    workdir = str(tmp_path / 'threads')
    run = subprocess.run(example_cmd(workdir, '--threads', '4',
                                     '--data-format', 'npy', '--epochs', '4'),
                         env=example_env(), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert 'trained through epoch 4' in run.stdout
    w, b = read_example_model(workdir)
    w_true, b_true = train_job.true_model(8, 0)
    assert np.max(np.abs(w - w_true)) < 0.1
    assert abs(b - b_true) < 0.1
    manifest = read_manifest(os.path.join(workdir, 'checkpoints'))
    assert [e['epoch'] for e in manifest['epochs']] == [2, 3, 4]
    assert manifest['epochs'][-1]['finished']


# ================================================= LevelDB checkpoints ==

def _damage_leveldb(path):
    """Flips a bit inside the first table's data (a block its CRC covers)."""
    table = sorted(f for f in os.listdir(path) if f.endswith('.ldb'))[0]
    t = os.path.join(path, table)
    data = bytearray(open(t, 'rb').read())
    data[len(data) // 4] ^= 0x10
    open(t, 'wb').write(bytes(data))


@pytest.mark.parametrize('db_type', ['leveldb', 'LevelDB'])
def test_leveldb_checkpoints_resume_rotate_and_verify(tmp_path, db_type,
                                                      run_pipeline):
    """Checkpoints as LevelDB directories: max_to_keep removes old ones
    whole, a run resumes from the latest, a lost manifest is rebuilt from
    the directories, a damaged one is skipped, and the command line lists
    and verifies them."""
    ckpt_dir = str(tmp_path / 'ckpt')
    runner, last, total = run_pipeline(
        ckpt_dir, FileMetadataHandler(max_to_keep=3), db_type=db_type)
    assert (last, total) == (4, 145)
    assert sorted(os.listdir(ckpt_dir)) == [
        'manifest.json', 'temp_node.2', 'temp_node.3', 'temp_node.4']
    for e in (2, 3, 4):
        assert os.path.isfile(os.path.join(ckpt_dir, 'temp_node.%d' % e,
                                           'CURRENT'))
    assert latest_valid_epoch(ckpt_dir, ['temp_node'], db_type) == 4
    # Each epoch's LevelDB holds that epoch's total (the same blobs a
    # ferro run saves).
    runner, last, total = run_pipeline(
        ckpt_dir, FileMetadataHandler(max_to_keep=3), resume=LATEST,
        db_type=db_type)
    assert runner.resumed_from_epoch == 4 and total == 145

    out = io.StringIO()
    assert checkpoint_cli(['ls', ckpt_dir], out=out) == 0
    assert 'temp_node.3' in out.getvalue()
    out = io.StringIO()
    assert checkpoint_cli(['verify', ckpt_dir, '--db-type', db_type],
                          out=out) == 0
    assert 'all 3 checkpoint files verify' in out.getvalue()

    # Damage epoch 4 and lose the manifest: the directories are found by
    # name, epoch 4 fails to verify, and a resumed run starts from 3.
    _damage_leveldb(os.path.join(ckpt_dir, 'temp_node.4'))
    os.unlink(os.path.join(ckpt_dir, 'manifest.json'))
    out = io.StringIO()
    assert checkpoint_cli(['verify', ckpt_dir], out=out) == 1
    assert 'DAMAGED  epoch 4 node temp_node (temp_node.4)' in out.getvalue()
    assert latest_valid_epoch(ckpt_dir, ['temp_node'], db_type) == 3
    runner, last, total = run_pipeline(
        ckpt_dir, FileMetadataHandler(max_to_keep=3), resume=LATEST,
        db_type=db_type)
    assert runner.resumed_from_epoch == 3
    assert (last, total) == (4, 145)


def test_the_interrupt_warning_names_the_epoch_resume_goes_on_with():
    # Ctrl-C after an epoch's checkpoint was saved but before the next
    # epoch began once read "interrupted during epoch 4; the last complete
    # checkpoint is epoch 4".
    from ferrocaffe.checkpoint.job import _interrupted_message as msg

    assert msg(4, 4) == ("interrupted after the checkpoint of epoch 4 was complete; "
                         "resume_from_epoch='latest' goes on with epoch 5")
    assert msg(5, 4) == ("interrupted during epoch 5; the last complete checkpoint is "
                         "epoch 4; resume_from_epoch='latest' goes on with epoch 5")
    assert msg(None, 0).startswith('interrupted before the first epoch; the last complete '
                                   'checkpoint is epoch 0')
    assert 'starts from scratch' in msg(None, None)
