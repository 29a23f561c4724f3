"""RaySession against a real single-node Ray cluster on loopback.

One cluster (``ray.init(num_cpus=2)`` on a loopback address) is shared by the
tests of this module and shut down at its end; every test makes its own
RaySession, whose node actors die with it. The two-Ray-node cases live in
test_distributed_cluster.py (they need ``ray start``).

Expected values are computed here by hand or by running the same
TaskGroup on a LocalSession.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import ray

from ferrocaffe import core, errors, workspace
from ferrocaffe.checkpoint import (
    FileMetadataHandler, Job, JobRunner, MultiNodeCheckpointManager,
    epoch_limiter, read_manifest)
from ferrocaffe.dataio import ReaderWithLimit
from ferrocaffe.distributed import RaySession, node_actor_options
from ferrocaffe.file_reader import NpyReader
from ferrocaffe.net_builder import ops
from ferrocaffe.pipeline import pipe
from ferrocaffe.session import LocalSession
from ferrocaffe.task import (
    Cluster, Node, Task, TaskGroup, WorkspaceType, final_output)

from _support import EXAMPLES, PKG_PARENT  # noqa: E402

sys.path.insert(0, EXAMPLES)

import session_example  # noqa: E402
import task_example  # noqa: E402

LOOPBACK = '127.0.0.3'


@pytest.fixture(scope='module')
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    # Ray swaps 127.0.0.1 for the machine's public address; it leaves the
    # rest of the loopback network (127.0.0.0/8) alone.
    ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                   _node_ip_address=LOOPBACK)
    assert ctx.address_info['node_ip_address'] == LOOPBACK
    yield ctx
    ray.shutdown()


@pytest.fixture
def session(cluster):
    s = RaySession()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _fresh_cluster():
    # (conftest's _fresh_task_names clears the task names around it)
    with Cluster():
        yield


def i64(v):
    return np.array(v, np.int64)


# ===================================================== placement rules ==

def test_node_kwargs_map_to_actor_options():
    opts, threads = node_actor_options('t', dict(
        num_cpus=1.5, num_gpus=0, memory=1 << 20, resources={'big': 1},
        label_selector={'role': 'trainer'}))
    assert opts == {'num_cpus': 1.5, 'num_gpus': 0, 'memory': 1 << 20,
                    'resources': {'big': 1},
                    'label_selector': {'role': 'trainer'}}
    assert threads == 2  # ceil(1.5)
    assert node_actor_options('t', {}) == ({}, None)
    assert node_actor_options('t', dict(num_cpus=0.25))[1] == 1
    assert node_actor_options('t', dict(num_cpus=4, num_threads=3))[1] == 3
    opts, _ = node_actor_options('t', dict(node_id='ab' * 28, soft=True))
    strategy = opts['scheduling_strategy']
    assert strategy.node_id == 'ab' * 28 and strategy.soft is True


@pytest.mark.parametrize('kwargs, needle', [
    (dict(cpus=2), 'unknown keyword argument cpus (did you mean num_cpus?)'),
    (dict(num_cpus='two'), 'num_cpus must be a number'),
    (dict(num_cpus=-1), 'num_cpus must be a number >= 0'),
    (dict(resources=['big']), 'resources must be a dict'),
    (dict(num_threads=0), 'num_threads must be a number >= 1'),
])
def test_bad_node_kwargs_are_refused(kwargs, needle):
    with pytest.raises(errors.InvalidArgumentError, match='Node .trainer.') as e:
        node_actor_options('trainer', kwargs)
    assert needle in str(e.value)
    assert isinstance(e.value, ValueError)


def test_a_bad_node_kwarg_fails_where_it_is_written_and_a_corrected_node_runs(session):
    # Node(...) refuses the typo itself, so it never reaches the process-wide
    # Cluster (where it used to poison the name for every later session).
    with TaskGroup():
        with pytest.raises(errors.InvalidArgumentError, match="Node 'odd'"):
            Node('odd', num_cpu=1)
    with TaskGroup() as ok:
        with Node('odd', num_cpus=1), Task():
            out = final_output(ops.Const(i64(5)))
    session.run(ok)
    assert out.fetch() == 5


def test_a_node_ray_cannot_place_fails_with_a_clear_error(cluster):
    session = RaySession(node_start_timeout=3)
    try:
        with TaskGroup() as tg:
            with Node('needs_gpu_box', resources={'gpu_box': 1}), Task():
                ops.Const(1)
        with pytest.raises(errors.NodeFailedError) as e:
            session.run(tg)
        msg = str(e.value)
        assert "'needs_gpu_box'" in msg and 'could not be started' in msg
        assert 'gpu_box' in msg
        assert e.value.node == 'needs_gpu_box'
    finally:
        session.close()


def test_num_cpus_sizes_the_nodes_kernel_pool(session):
    with TaskGroup() as tg:
        with Node('small', num_cpus=0.5), Task():
            ops.Const(1)
        with Node('big', num_cpus=1.5), Task():
            ops.Const(1)
    session.run(tg)
    assert session.node_info('small')['num_threads'] == 1
    assert session.node_info('big')['num_threads'] == 2


def test_repr_names_the_state_and_the_nodes(session):
    assert repr(session) == '<RaySession open, cluster local/joined, 0 nodes>'
    with TaskGroup() as tg:
        with Node('rep_b'), Task():
            ops.Const(1)
        with Node('rep_a'), Task():
            ops.Const(1)
    session.run(tg)
    assert repr(session) == ('<RaySession open, cluster local/joined, 2 nodes: '
                             'rep_a, rep_b>')
    session.close()
    assert repr(session).startswith('<RaySession closed')


# ==================================================== Caffe2's contract ==

def test_nodes_are_processes_that_do_not_share_blobs(session):
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        with Node('node1'), Task():
            ops.Const(i64(1), 'only_on_node1')
        with Node('node2'), Task():
            ops.Const(i64(2), 'only_on_node2')
    session.run(tg)
    pid1 = session.node_info('node1')['pid']
    pid2 = session.node_info('node2')['pid']
    assert len({pid1, pid2, os.getpid()}) == 3
    assert 'only_on_node1' in session.blobs('node1')
    assert 'only_on_node1' not in session.blobs('node2')
    assert session.fetch_blob('node2', 'only_on_node2') == 2

    # A task on node2 that reads node1's blob fails, naming node2.
    with TaskGroup() as tg2:
        with Node('node2'), Task():
            ops.Copy('only_on_node1', 'copied')
    with pytest.raises(errors.BlobNotFoundError) as e:
        session.run(tg2)
    assert "node 'node2'" in str(e.value) and 'only_on_node1' in str(e.value)
    assert e.value.node == 'node2'


def test_tasks_on_one_node_share_its_workspace_across_runs(session):
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node('worker'), Task():
            ops.Const(i64([0]), 'hits')
    with TaskGroup() as bump:
        # Two tasks on the same node, both GLOBAL: the same blob.
        with Node('worker'), Task(workspace_type='global'):
            ops.Add(['hits', ops.Const(i64([1]))], ['hits'])
        with Node('worker'), Task(workspace_type='global'):
            ops.Add(['hits', ops.Const(i64([10]))], ['hits'])
    with TaskGroup() as read:
        with Node('worker'), Task():
            hits = final_output(ops.Copy('hits'))
    session.run(init)
    pid = session.node_info('worker')['pid']
    for _ in range(3):
        session.run(bump)
    session.run(read)
    assert hits.fetch().tolist() == [33]
    assert session.node_info('worker')['pid'] == pid  # one long-lived actor


def test_outputs_come_back_through_the_object_store(session):
    big = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: a plasma object
    with TaskGroup() as tg:
        with Node('a'), Task():
            out_big = final_output(ops.Scale(ops.Const(big), scale=2.0))
        with Node('b'), Task():
            out_s = final_output(ops.Const('text'))
    session.run(tg)
    got = out_big.fetch()
    np.testing.assert_array_equal(got, big * 2)
    got[0] = -1  # a writable copy, as LocalSession's fetch gives
    assert session.fetch_output(out_s) in ('text', b'text')
    with pytest.raises(errors.InvalidArgumentError, match='ambiguous'):
        session.fetch_output('anything')


def node_blob(session, node, name):
    if isinstance(session, LocalSession):
        return session.node_workspace(node).fetch_blob(name)
    return session.fetch_blob(node, name)


def run_on(session, build, cluster=None):
    """Builds TaskGroups with `build()` (in `cluster`, default a new one),
    runs them on `session` in order, and returns the fetched outputs and
    the blobs `build` names."""
    Task._global_names_used.clear()
    with cluster or Cluster():
        groups, outputs, blobs = build()
        for tg in groups:
            session.run(tg)
        return ([np.asarray(o.fetch()).tolist() for o in outputs],
                [np.asarray(node_blob(session, n, b)).tolist()
                 for n, b in blobs])


def instances_reports_and_queues():
    """On each of two nodes: a task of n_inst instances each doing n_iter
    AtomicIters on a shared counter, with a 5 ms reporter copying the
    counter; and a producer/consumer pair joined by a queue of capacity 2
    (the producer sends n_iter values of n_inst)."""
    outputs, blobs = [], []
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        for node in ('n1', 'n2'):
            with Node(node), Task():
                ops.CreateBlobsQueue([], 'q', capacity=2, num_blobs=1)
                ops.Const(i64(0), 'qtotal')
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        for node, n_inst, n_iter in (('n1', 3, 7), ('n2', 5, 11)):
            with Node(node):
                with Task(num_instances=n_inst):
                    with ops.task_init():
                        it = ops.Const(i64(0), 'iters')
                        ops.Const(i64(-1), 'seen')
                        ops.CreateMutex([], 'mutex')
                    with ops.task_reporter(interval_ms=5):
                        ops.Copy(it, 'seen')
                    with ops.loop(n_iter):
                        ops.AtomicIter(['mutex', it], [it])
                    with ops.task_exit():
                        outputs.append(final_output(ops.Copy(it)))
                with Task():
                    with ops.loop(n_iter):
                        ops.Const(i64(n_inst), 'q_in')
                        ops.EnqueueBlobs(['q', 'q_in'], ['q_in'])
                with Task():
                    with ops.loop(n_iter):
                        got = ops.DequeueBlobs(['q'], 1)
                        ops.Add(['qtotal', got], ['qtotal'])
                    outputs.append(final_output(ops.Copy('qtotal')))
                blobs.append((node, 'seen'))
    return [init, tg], outputs, blobs


def test_same_results_as_local_session_with_instances_and_queues(session):
    want = run_on(LocalSession(workspace.Workspace(), isolate_nodes=True),
                  instances_reports_and_queues)
    # By hand: instances x iterations, and iterations x instances through
    # the queue; the reporter's last run sees the final counter.
    assert want == ([21, 21, 55, 55], [21, 55])
    assert run_on(session, instances_reports_and_queues) == want


def test_task_example_gives_the_same_result(session):
    local = task_example.main()
    Task._global_names_used.clear()
    with Cluster():
        remote = task_example.main(session)
    # By hand: globl starts at 0, every instance copies it into its local
    # and adds the local back (0), and the exit squares it: 0.
    assert np.asarray(local).tolist() == 0
    assert np.asarray(remote).tolist() == np.asarray(local).tolist()
    assert not session.is_open()  # the example closes its session


def test_session_example_runs_on_ray_like_local(session):
    Task._global_names_used.clear()
    local, _, msg_local = session_example.main(
        LocalSession(workspace.Workspace()))
    Task._global_names_used.clear()
    with Cluster():
        remote, net, n1msg = session_example.main(session)
    # node1's global group left its message in node1's workspace only.
    assert session.fetch_blob('node1', str(n1msg)) in (
        'Hello from node 1.', b'Hello from node 1.')
    assert str(n1msg) not in session.blobs('node2')


def test_python_ops_run_in_the_nodes_process(session):
    def record_pid(inputs, outputs):
        outputs[0].feed(np.array([os.getpid()], np.int64))

    with TaskGroup() as tg:
        with Node('py'), Task():
            net = core.Net('pyop')
            pid_blob = net.Python(record_pid)([], ['pid'])
            ops.net(net)
            out = final_output(pid_blob)
    session.run(tg)
    assert int(out.fetch()[0]) == session.node_info('py')['pid']
    assert int(out.fetch()[0]) != os.getpid()


# A Python op's builder, pickled into the op and unpickled on the node
# (stdlib only, so that the node's process can import it).
PID_WRITER = (eval, ("lambda inputs, outputs: outputs[0].feed(__import__('numpy')"
                     ".array([__import__('os').getpid()], 'int64'))",), {})


def test_builder_python_ops_made_here_are_trusted_on_the_node(session):
    with TaskGroup() as tg:
        with Node('py'), Task():
            net = core.Net('pybuilder')
            pid_blob = net.Python(PID_WRITER)([], ['pid'])
            ops.net(net)
            out = final_output(pid_blob)
    session.run(tg)
    assert int(out.fetch()[0]) == session.node_info('py')['pid']


def test_unpicklable_python_op_is_refused_at_compile(session):
    lock = threading.Lock()

    def uses_lock(inputs, outputs):
        with lock:
            pass

    with TaskGroup() as tg:
        with Node('py'), Task():
            net = core.Net('bad_py')
            net.Python(uses_lock)([], [])
            ops.net(net)
    with pytest.raises(errors.InvalidArgumentError, match='cannot be pickled'):
        session.run(tg)


# =========================================================== failures ==

def test_a_failing_node_cancels_the_others_and_names_itself(session):
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        with Node('ok'), Task():
            ops.Const(i64([0]), 'spins')
            # Without cancellation this loop would take minutes.
            with ops.loop(10 ** 9):
                ops.Add(['spins', ops.Const(i64([1]))], ['spins'])
        with Node('bad'), Task():
            with ops.loop(3):
                pass
            ops.Div([ops.Const(np.array([1], np.int32)),
                     ops.Const(np.array([0], np.int32))])
    with pytest.raises(errors.DivisionByZeroError) as e:
        session.run(tg)
    assert "node 'bad'" in str(e.value)
    assert e.value.node == 'bad'
    assert isinstance(e.value, ZeroDivisionError)
    assert 'Traceback' in e.value.remote_traceback
    # 'ok' was cancelled, not run to the end; its workspace survived.
    spins = int(session.fetch_blob('ok', 'spins')[0])
    assert 0 <= spins < 10 ** 9
    # Both nodes still run new work.
    with TaskGroup() as again:
        with Node('ok'), Task():
            a = final_output(ops.Const(i64(1)))
        with Node('bad'), Task():
            b = final_output(ops.Const(i64(2)))
    session.run(again)
    assert (a.fetch(), b.fetch()) == (1, 2)


def test_a_python_exception_keeps_its_class_and_gains_the_node(session):
    def boom(inputs, outputs):
        raise LookupError('no such thing')

    with TaskGroup() as tg:
        with Node('py'), Task():
            net = core.Net('boom')
            net.Python(boom)([], [])
            ops.net(net)
    with pytest.raises(LookupError, match='no such thing') as e:
        session.run(tg)
    assert e.value.node == 'py'


def test_a_dead_node_fails_the_run_and_later_runs_clearly(session):
    with TaskGroup() as tg:
        with Node('victim'), Task():
            ops.Const(i64([0]), 'n')
            with ops.loop(10 ** 9):
                ops.Add(['n', ops.Const(i64([1]))], ['n'])
    pid = None

    def kill_when_started():
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                info = session.node_info('victim')
                break
            except errors.InvalidArgumentError:
                time.sleep(0.05)
        time.sleep(0.5)
        nonlocal pid
        pid = info['pid']
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_started)
    killer.start()
    with pytest.raises(errors.NodeFailedError) as e:
        session.run(tg)
    killer.join()
    assert "node 'victim'" in str(e.value) and 'died' in str(e.value)
    assert e.value.node == 'victim'
    with pytest.raises(errors.NodeFailedError, match='new session'):
        session.run(tg)


def test_ctrl_c_in_the_driver_stops_every_node(cluster, tmp_path):
    script = tmp_path / 'driver.py'
    script.write_text('''
import sys, numpy as np, ray
ray.init(address=sys.argv[1], log_to_driver=False)
from ferrocaffe.distributed import RaySession
from ferrocaffe.net_builder import ops
from ferrocaffe.task import Node, Task, TaskGroup, WorkspaceType
with TaskGroup(WorkspaceType.GLOBAL) as tg:
    for node in ('x', 'y'):
        with Node(node), Task():
            ops.Const(np.array([0], np.int64), 'n')
            with ops.loop(10 ** 9):
                ops.Add(['n', ops.Const(np.array([1], np.int64))], ['n'])
with TaskGroup() as warm_up:
    for node in ('x', 'y'):
        with Node(node), Task():
            ops.Const(1)
s = RaySession()
s.run(warm_up)  # both nodes are up
print('running', flush=True)
try:
    s.run(tg)
except KeyboardInterrupt:
    print('interrupted', int(s.fetch_blob('x', 'n')[0]) < 10 ** 9, flush=True)
    s.close()
    sys.exit(3)
''')
    env = dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep
               + os.environ.get('PYTHONPATH', ''))
    p = subprocess.Popen([sys.executable, str(script), cluster.address_info[
        'address']], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env)
    try:
        assert p.stdout.readline().strip() == 'running'
        time.sleep(1.0)  # the nodes spin
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 3, err[-3000:]
    assert 'interrupted True' in out


def test_importing_without_ray_says_how_to_install_it(tmp_path):
    code = ('import sys; sys.modules["ray"] = None\n'
            'try:\n'
            '    import ferrocaffe.distributed\n'
            'except ImportError as e:\n'
            '    print(str(e))\n')
    env = dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep
               + os.environ.get('PYTHONPATH', ''))
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, env=env, timeout=60).stdout
    assert "pip install 'ferrocaffe[ray]'" in out


# ======================================================== checkpoints ==

EPOCHS = 30
ITERS = 400  # loop iterations per node and epoch


def build_counting_job(nodes=('trainer_0', 'trainer_1')):
    """Every node adds (node index + 1) to its total ITERS times per epoch,
    doing some real work on a vector each time; EPOCHS epochs."""
    totals = []
    with Job() as job:
        for i, node in enumerate(nodes):
            with Node(node):
                with job.init_group, Task():
                    total = ops.Const(i64([0]), 'total_%d' % i)
                    ops.Const(np.ones(20000, np.float32), 'work_%d' % i)
                with job.epoch_group, Task():
                    with ops.loop(ITERS):
                        ops.Add([total, ops.Const(i64([i + 1]))], [total])
                        ops.Scale('work_%d' % i, 'work_%d' % i, scale=1.0)
                totals.append(total)
        epoch_limiter(job, EPOCHS)
    return job, totals


def manager(path):
    """One db per node and epoch under `path`, with the manifest that
    resume_from_epoch='latest' reads (its handler creates `path`)."""
    return MultiNodeCheckpointManager(path, 'ferro', FileMetadataHandler())


def fetch_totals(session, totals):
    with TaskGroup() as tg:
        outs = []
        for i, t in enumerate(totals):
            with Node('trainer_%d' % i), Task():
                outs.append(final_output(ops.Copy(t)))
    session.run(tg)
    return [int(o.fetch()[0]) for o in outs]


def test_job_runner_on_ray_matches_local_and_checkpoints_every_node(
        session, tmp_path):
    want = [EPOCHS * ITERS * 1, EPOCHS * ITERS * 2]
    local_dir, ray_dir = str(tmp_path / 'local'), str(tmp_path / 'ray')
    job, totals = build_counting_job()
    epochs = JobRunner(job, manager(local_dir)) \
        .train(LocalSession(workspace.Workspace()))
    Task._global_names_used.clear()
    with Cluster():
        job, totals = build_counting_job()
        assert job.compile(RaySession) is job  # as a Caffe2 launcher did
        assert JobRunner(job, manager(ray_dir)) \
            .train(session) == epochs == EPOCHS
        assert fetch_totals(session, totals) == want
    # One db per node and epoch, written by the node's own process.
    for node in ('trainer_0', 'trainer_1', 'local'):
        for epoch in range(EPOCHS + 1):
            assert os.path.isfile(os.path.join(ray_dir, '%s.%d' % (node, epoch)))
    assert [e['epoch'] for e in read_manifest(ray_dir)['epochs']][-1] == EPOCHS


def test_killed_node_mid_job_then_a_new_session_resumes(cluster, tmp_path):
    ckpt = str(tmp_path / 'ckpt')
    want = [EPOCHS * ITERS * 1, EPOCHS * ITERS * 2]
    first = RaySession()
    job, totals = build_counting_job()
    killed = {}

    def kill_after_a_few_epochs():
        deadline = time.time() + 120
        while time.time() < deadline:
            manifest = read_manifest(ckpt) if os.path.isdir(ckpt) else None
            if manifest and max(e['epoch'] for e in manifest['epochs']) >= 3:
                break
            time.sleep(0.005)
        killed['pid'] = first.node_info('trainer_1')['pid']
        ray.kill(first.node_actor('trainer_1'))

    killer = threading.Thread(target=kill_after_a_few_epochs)
    killer.start()
    try:
        with pytest.raises(errors.NodeFailedError, match="trainer_1"):
            JobRunner(job, manager(ckpt),
                      resume_from_epoch='latest').train(first)
    finally:
        killer.join()
        first.close()
    done = [e['epoch'] for e in read_manifest(ckpt)['epochs']]
    assert 3 <= max(done) < EPOCHS
    # The kill can land after trainer_1 renamed its db of the next epoch
    # into place but before the runner heard back: that epoch then exists
    # on disk for every node (though not in the manifest), and resuming
    # from it is right. Count an epoch only when all three nodes' dbs exist.
    on_disk = [e for e in range(EPOCHS + 1)
               if all(os.path.isfile(os.path.join(ckpt, '%s.%d' % (n, e)))
                      for n in ('trainer_0', 'trainer_1', 'local'))]
    assert max(on_disk) in (max(done), max(done) + 1)

    second = RaySession()
    try:
        runner = JobRunner(job, manager(ckpt),
                           resume_from_epoch='latest')
        assert runner.train(second) == EPOCHS
        assert runner.resumed_from_epoch == max(on_disk)
        assert second.node_info('trainer_1')['pid'] != killed['pid']
        assert fetch_totals(second, totals) == want
    finally:
        second.close()


def test_reader_pipeline_job_on_two_nodes(session, tmp_path):
    """Each node reads its own .npy shard, 3 records per epoch, through
    pipe(); totals after the run are computed here by hand."""
    values = {i: [v * (i + 1) + i for v in range(10)] for i in range(2)}
    totals = []
    with Job() as job:
        for i in range(2):
            os.makedirs(str(tmp_path / ('shard%d' % i)))
            path = str(tmp_path / ('shard%d' % i) / 'val.npy')
            np.save(path, i64(values[i]))
            with Node('reader_%d' % i):
                with job.init_group, Task():
                    reader = NpyReader([path], batch_size=1,
                                       name='reader_%d' % i)
                    reader.setup_ex(ops, None)
                    total = ops.Const(i64([0]), 'sum_%d' % i)

                def add(rec, total=total):
                    ops.Add([total, rec.val()], [total])

                limited = ReaderWithLimit(reader, num_iter=3)
                pipe(limited, processor=add)
                job.add_stop_condition(limited.data_finished())
                totals.append(total)
    epochs = JobRunner(job, manager(str(tmp_path / 'ckpt'))).train(session)
    assert epochs == 4  # ceil(10 / 3)
    for i in range(2):
        assert int(session.fetch_blob('reader_%d' % i, str(totals[i]))[0]) \
            == sum(values[i])


def test_checkpointing_example_job_gives_the_same_model(cluster, tmp_path,
                                                        capsys):
    """examples/linear_job.py (the Hogwild linear job) on LocalSession and on
    RaySession, deterministic with one thread: the same model, bit for
    bit, and the same number of epochs."""
    import linear_job as train_job
    args = ['--rows', '3000', '--batches-per-epoch', '1000', '--threads',
            '1', '--no-progress']
    models = {}
    for kind in ('local', 'ray'):
        Task._global_names_used.clear()
        workdir = str(tmp_path / kind)
        with Cluster():
            assert train_job.main(args + ['--workdir', workdir,
                                          '--session', kind]) == 0
        models[kind] = train_job.read_model(os.path.join(workdir, 'model'))
        out = capsys.readouterr().out
        # 3000 rows, 1000 per epoch: three epochs of data, and a fourth
        # that finds the file exhausted.
        assert 'trained through epoch 4 ' in out
    w_local, b_local = models['local']
    w_ray, b_ray = models['ray']
    np.testing.assert_array_equal(w_ray, w_local)
    assert b_ray == b_local
    # And the model learned something: closer to the truth than zero.
    w_true, _ = train_job.true_model(8, 0)
    assert np.abs(w_local - w_true).max() < np.abs(w_true).max()
