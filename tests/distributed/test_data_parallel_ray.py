"""data_parallel_model across the Nodes of a RaySession (real Ray on
loopback), and the collective ops it uses.

Expected values come from the numpy model in _dp_models (one model on the
whole batch), or are worked out here by hand.
"""

import os
import threading
import time

import numpy as np
import pytest
import ray

from ferrocaffe import core, data_parallel_model as dpm, errors, model_helper
from ferrocaffe.checkpoint import (
    FileMetadataHandler, Job, JobRunner, epoch_limiter, read_manifest)
from ferrocaffe.distributed import RaySession
from ferrocaffe.net_builder import ops
from ferrocaffe.task import (
    Cluster, Node, Task, TaskGroup, WorkspaceType, final_output)

from _dp_models import (batches, build, initial_params, param_names,
                        reference, replica_feeds)

LOOPBACK = '127.0.0.3'
SHARDS, DEVICES = 2, [0, 1]


@pytest.fixture(scope='module')
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    ctx = ray.init(address='local', num_cpus=2, include_dashboard=False,
                   log_to_driver=False, _node_ip_address=LOOPBACK)
    yield ctx
    ray.shutdown()


@pytest.fixture
def session(cluster):
    s = RaySession()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _fresh_cluster():
    with Cluster():
        yield


def rendezvous(shard, shards=SHARDS):
    return {'num_shards': shards, 'shard_id': shard, 'engine': 'GLOO',
            'kv_handler': None}


# ============================================================ collectives ==

def run_collective(session, n, build_net):
    """Runs ``build_net(net, rank, cw)`` on n nodes; returns each node's
    outputs (final_output of the blobs it returns)."""
    outs = []
    with TaskGroup() as tg:
        for rank in range(n):
            with Node('c%d' % rank), Task(name='coll_%d' % rank):
                cw = ops.CreateCommonWorld([], 'cw', size=n, rank=rank,
                                           timeout_ms=20000)
                outs.append([final_output(b) for b in build_net(rank, cw)])
    session.run(tg)
    return [[o.fetch() for o in node] for node in outs]


def test_allreduce_broadcast_allgather_barrier_on_three_nodes(session):
    def build_net(rank, cw):
        a = ops.Const(np.full(1000, rank + 1.0, np.float32), 'a')
        b = ops.Const(np.arange(1000, dtype=np.float32) * (rank + 1), 'b')
        ops.Allreduce([cw, a, b], [a, b])  # both inputs are summed, as Gloo's
        c = ops.Const(np.full((2, 3), 10.0 * rank, np.float32), 'c')
        ops.Broadcast([cw, c], [c], root=2)
        g = ops.Allgather([cw, ops.Const(np.array([rank, rank], np.int64))], 'g')
        ops.Barrier([cw], [])
        return [a, b, c, g]

    got = run_collective(session, 3, build_net)
    arange = np.arange(1000, dtype=np.float32)
    for a, b, c, g in got:
        np.testing.assert_array_equal(a, 6.0 + arange * 6)  # (1+2+3) + (1+2+3)*i
        np.testing.assert_array_equal(b, a)
        np.testing.assert_array_equal(c, np.full((2, 3), 20.0, np.float32))
        np.testing.assert_array_equal(g, [0, 0, 1, 1, 2, 2])


def test_a_member_that_never_comes_times_out_naming_it(session):
    with TaskGroup() as tg:
        for rank in range(2):
            with Node('t%d' % rank), Task(name='to_%d' % rank):
                cw = ops.CreateCommonWorld([], 'cw', size=2, rank=rank,
                                           timeout_ms=3000)
                if rank == 0:  # rank 1 never joins the Allreduce
                    ops.Allreduce([cw, ops.Const(np.ones(4, np.float32), 'x')], ['x'])
    with pytest.raises(errors.CollectiveTimeoutError) as info:
        session.run(tg)
    e = info.value
    assert isinstance(e, TimeoutError) and isinstance(e, RuntimeError)
    assert e.collective == 'Allreduce' and e.node == 't1' and e.rank == 1
    assert e.common_world == 'cw' and e.op == 'Allreduce' and e.net
    assert "'t1'" in str(e) and 'Allreduce' in str(e)


def test_a_world_of_one_needs_no_session():
    from ferrocaffe import workspace
    ws = workspace.Workspace()
    net = core.Net('solo')
    cw = net.CreateCommonWorld([], 'cw', size=1, rank=0)
    net.ConstantFill([], 'x', shape=[3], value=2.0)
    net.Allreduce([cw, 'x'], ['x'])
    net.Barrier([cw], [])
    ws.run(net)
    np.testing.assert_array_equal(ws.fetch_blob('x'), [2.0, 2.0, 2.0])
    bad = core.Net('two')
    bad.CreateCommonWorld([], 'cw2', size=2, rank=0)
    with pytest.raises(errors.InvalidArgumentError, match='RaySession'):
        ws.run(bad)


# ============================================= 2 Ray nodes x 2 replicas ==

STEPS, BATCH = 4, 16


@pytest.mark.parametrize('opt,sparse', [('momentum', False), ('adam', False),
                                        ('sgd', True), ('adam', True)])
def test_two_nodes_of_two_replicas_match_one_model(session, opt, sparse):
    steps = batches(STEPS, BATCH, seed=5)
    want = reference(steps, opt, sparse)
    models, nodes = [], ['dp%d' % s for s in range(SHARDS)]
    with TaskGroup(WorkspaceType.GLOBAL) as init_tg:
        for s, node in enumerate(nodes):
            with Node(node), Task(name='init_%d' % s):
                model = build(model_helper.ModelHelper(name='dp'), DEVICES,
                              opt, sparse, rendezvous(s))
                ops.net(model.param_init_net)
                models.append(model)
    session.run(init_tg)
    for node in nodes:
        for name, value in initial_params().items():
            if name != 'emb' or sparse:
                for d in DEVICES:
                    session.feed_blob(node, 'cpu_%d/%s' % (d, name), value)
    with TaskGroup(WorkspaceType.GLOBAL) as train_tg:
        for s, node in enumerate(nodes):
            with Node(node):
                Task(step=dpm.ParallelStep(models[s], 1), name='train_%d' % s)
    for batch in steps:
        for s, node in enumerate(nodes):
            for blob, value in replica_feeds(batch, DEVICES, s, SHARDS).items():
                session.feed_blob(node, blob, value)
        session.run(train_tg)
    assert models[0]._dpm_concurrency == 'concurrent: 2 replicas'
    for node in nodes:
        for name in param_names(sparse):
            for d in DEVICES:
                np.testing.assert_allclose(
                    session.fetch_blob(node, 'cpu_%d/%s' % (d, name)),
                    want[name], rtol=1e-4, atol=2e-6,
                    err_msg='%s cpu_%d/%s' % (node, d, name))


# ========================================================= a killed node ==

EPOCHS, ITERS = 8, 60


def build_job(devices_per_node, shards=SHARDS):
    """A data-parallel Job: every node trains its shard's replicas on a
    fixed batch of its own for ITERS steps per epoch."""
    rows = 8
    data = batches(1, rows * len(devices_per_node) * shards, seed=9)[0]
    models = {}
    with Job() as job:
        for s in range(shards):
            node = 'dp%d' % s
            with Node(node):
                model = build(model_helper.ModelHelper(name='job'),
                              devices_per_node, 'momentum', False,
                              rendezvous(s, shards))
                for i, op in enumerate(model.param_init_net.Proto().op):
                    op.device_option.random_seed = 100 + i
                sync = dpm.CheckpointSyncNet(model)
                with job.init_group, Task(name='init_%d' % s):
                    ops.net(model.param_init_net)
                with job.epoch_group, Task(name='epoch_%d' % s):
                    # (the data: made in every epoch, as a reader would)
                    for blob, value in replica_feeds(
                            data, devices_per_node, s, shards).items():
                        ops.Const(value, blob)
                    ops.net(sync)
                    ops.net(dpm.ParallelStep(model, ITERS))
                models[node] = model
        epoch_limiter(job, EPOCHS)
    return job, models


def final_params(session, models):
    with TaskGroup() as tg:
        outs = {}
        for node in models:
            with Node(node), Task(name='fetch_' + node):
                outs[node] = {n: final_output(ops.Copy('cpu_0/' + n))
                              for n in ('fc_w', 'fc_b')}
    session.run(tg)
    return {node: {n: o.fetch() for n, o in d.items()} for node, d in outs.items()}


def test_killed_node_mid_epoch_then_resume_gives_the_uninterrupted_result(
        cluster, tmp_path):
    full = RaySession()
    try:
        job, models = build_job(DEVICES)
        JobRunner(job, dpm.CheckpointManager(
            models, str(tmp_path / 'full'), metadata_handler=FileMetadataHandler())
        ).train(full)
        want = final_params(full, models)
    finally:
        full.close()
    np.testing.assert_array_equal(want['dp0']['fc_w'], want['dp1']['fc_w'])

    ckpt = str(tmp_path / 'ckpt')
    first = RaySession()
    job, models = build_job(DEVICES)

    def kill_mid_epoch():
        deadline = time.time() + 120
        while time.time() < deadline:
            manifest = read_manifest(ckpt) if os.path.isdir(ckpt) else None
            if manifest and max(e['epoch'] for e in manifest['epochs']) >= 2:
                break
            time.sleep(0.005)
        time.sleep(0.5)  # into the next epoch's iterations (~2 s an epoch)
        ray.kill(first.node_actor('dp1'))

    killer = threading.Thread(target=kill_mid_epoch)
    killer.start()
    try:
        with pytest.raises(errors.NodeFailedError) as info:
            JobRunner(job, dpm.CheckpointManager(
                models, ckpt, metadata_handler=FileMetadataHandler()),
                resume_from_epoch='latest').train(first)
    finally:
        killer.join()
        first.close()
    e = info.value
    assert e.node == 'dp1' and isinstance(e, RuntimeError)
    # The survivor names the collective it was waiting in; when the kill
    # lands while it is outside one (its Python ops, a checkpoint), the
    # session sees the dead actor first and there is no collective to name.
    what = getattr(e, 'collective', None)
    assert what in (None, 'Allreduce', 'Broadcast'), str(e)
    assert what is None or what in str(e)
    done = max(x['epoch'] for x in read_manifest(ckpt)['epochs'])
    assert 2 <= done < EPOCHS

    second = RaySession()
    try:
        job, models = build_job(DEVICES)
        runner = JobRunner(job, dpm.CheckpointManager(
            models, ckpt, metadata_handler=FileMetadataHandler()),
            resume_from_epoch='latest')
        assert runner.train(second) == EPOCHS
        assert runner.resumed_from_epoch is not None
        got = final_params(second, models)
    finally:
        second.close()
    for node in got:
        for n in ('fc_w', 'fc_b'):
            np.testing.assert_allclose(got[node][n], want['dp0'][n],
                                       rtol=1e-5, atol=1e-6)
