"""TensorBoard logs: ScalarLogger's scalars and graphs, and a JobRunner
given one (summary=...). The event files are read back here with a
TFRecord reader of our own and tensorboardX's Event message, not with the
logger."""

import glob
import os
import struct

import numpy as np
import pytest
from tensorboardX.proto import event_pb2, graph_pb2

import ferrocaffe
from _support import load_example
from ferrocaffe import core
from ferrocaffe.checkpoint import JobRunner
from ferrocaffe.proto import caffe2_pb2
from ferrocaffe.session import LocalSession
from ferrocaffe import workspace
from ferrocaffe.tensorboard import ScalarLogger, nets_to_graph_def


def read_events(logdir):
    """Every Event of every event file under logdir (TFRecord framing:
    length, its CRC, the data, its CRC)."""
    events = []
    for path in sorted(glob.glob(os.path.join(logdir, '**', 'events.out.tfevents.*'),
                                 recursive=True)):
        data = open(path, 'rb').read()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack('<Q', data[pos:pos + 8])
            pos += 12
            events.append(event_pb2.Event.FromString(data[pos:pos + length]))
            pos += length + 4
    return events


def scalars(logdir):
    """{tag: [(step, value)]}."""
    out = {}
    for e in read_events(logdir):
        for v in e.summary.value:
            out.setdefault(v.tag, []).append((e.step, v.simple_value))
    return out


def test_scalars_reach_the_log_directory(tmp_path):
    with ScalarLogger(str(tmp_path / 'run')) as tb:
        for step, loss in enumerate([1.0, 0.5, 0.25]):
            tb.add_scalar('loss', np.float32(loss), step)
        tb.add_scalars({'lr': 0.1, 'accuracy': np.array([0.75])}, step=3)
        with tb.timed('epoch_seconds', step=3):
            pass
        with pytest.raises(TypeError, match="scalar 'bad'"):
            tb.add_scalar('bad', np.zeros(3), 0)
    got = scalars(str(tmp_path / 'run'))
    assert got['loss'] == [(0, 1.0), (1, 0.5), (2, 0.25)]
    assert got['lr'] == [(3, pytest.approx(0.1))]
    assert got['accuracy'] == [(3, 0.75)]
    assert got['epoch_seconds'][0][0] == 3 and got['epoch_seconds'][0][1] >= 0


def test_nets_become_a_tensorboard_graph_in_ssa_form(tmp_path):
    net = caffe2_pb2.NetDef(name='g')
    net.op.add(type='ConstantFill', output=['m/x'])
    net.op.add(type='Add', input=['m/x', 'ext'], output=['m/y'])
    net.op.add(type='Mul', input=['m/y', 'm/x'], output=['m/x'])
    net.op.add(type='Relu', input=['m/x'], output=['m/x_grad'], name='named')
    graph = nets_to_graph_def([net])
    nodes = {n.name: n for n in graph.node}
    assert {n: nodes[n].op for n in nodes} == {
        'm/ConstantFill': 'ConstantFill', 'm/Add': 'Add', 'm/Mul': 'Mul', 'named': 'Relu',
        'm/x': 'Blob', 'm/x_1': 'Blob', 'm/y': 'Blob', 'ext': 'Placeholder',
        'GRADIENTS/m/x_grad': 'Blob'}
    assert list(nodes['m/Add'].input) == ['m/x', 'ext']
    assert list(nodes['m/Mul'].input) == ['m/y', 'm/x']
    assert list(nodes['m/x_1'].input) == ['m/Mul:0']
    assert list(nodes['named'].input) == ['m/x_1']
    with ScalarLogger(str(tmp_path / 'g')) as tb:
        tb.add_graph(core.Net(net))
    written = [e.graph_def for e in read_events(str(tmp_path / 'g')) if e.graph_def]
    assert len(written) == 1
    assert {n.name for n in graph_pb2.GraphDef.FromString(written[0]).node} == set(nodes)


def test_a_job_logs_its_curves_and_checkpoint_times(tmp_path):
    example = load_example('linear_job.py')
    cfg = example.Config(workdir=str(tmp_path / 'job'), rows=60, features=2,
                         batches_per_epoch=20, threads=1, epochs=2)
    job = example.build_job(cfg)
    job.track_scalars(sq_error='stats/sq_error')
    logdir = str(tmp_path / 'logs')
    with ScalarLogger(logdir) as tb, ferrocaffe.profile() as trace:
        runner = JobRunner(job, example.checkpoint_manager(cfg), summary=tb,
                           progress=False)
        session = LocalSession(workspace.Workspace())
        try:
            assert runner.train(session) == 2
        finally:
            session.close()
    got = scalars(logdir)
    # One record per SGD step, 20 per epoch: the counter is cumulative.
    assert got['job/rows'] == [(1, 20.0), (2, 40.0)]
    assert [s for s, _ in got['job/epoch_seconds']] == [1, 2]
    assert [s for s, _ in got['job/rows_per_second']] == [1, 2]
    assert all(v > 0 for _, v in got['job/rows_per_second'])
    assert [s for s, _ in got['job/checkpoint_save_seconds']] == [0, 1, 2]
    assert [s for s, _ in got['sq_error']] == [1, 2]
    # The same run's timeline holds the epochs and the saves.
    names = [(e['cat'], e['name']) for e in trace.events if e['ph'] == 'X']
    for epoch in (1, 2):
        assert ('epoch', 'epoch %d' % epoch) in names
    for epoch in (0, 1, 2):
        assert ('checkpoint', 'checkpoint save (epoch %d)' % epoch) in names
    assert any(c == 'op' and n == 'Save' for c, n in names)


def test_a_jobs_nets_go_to_the_graph_view(tmp_path):
    from ferrocaffe import net_drawer
    example = load_example('linear_job.py')
    cfg = example.Config(workdir=str(tmp_path / 'job'), rows=20, features=2,
                         batches_per_epoch=5, threads=1, epochs=1)
    plan = net_drawer.plan_def(example.build_job(cfg))
    with ScalarLogger(str(tmp_path / 'g')) as tb:
        graph = tb.add_graph(plan)
    op_types = sorted(n.op for n in graph.node if n.op not in ('Blob', 'Placeholder'))
    assert op_types == sorted(op.type for net in plan.network for op in net.op)
    assert 'WeightedSum' in op_types and 'Save' in op_types
