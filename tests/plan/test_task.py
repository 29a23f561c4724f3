"""Tests of ferrocaffe.task: nodes, clusters, task groups, outputs and the
structure and runtime order of a task's step."""


import pytest

from _support import load_example, run_in_thread
from ferrocaffe import core, errors, workspace
from ferrocaffe.net_builder import ops
from ferrocaffe.session import LocalSession
from ferrocaffe.task import (
    Cluster, Node, SetupNets, Task, TaskGroup, TaskOutput, TaskOutputList,
    WorkspaceType, add_setup_steps, final_output, get_setup_nets)


def new_session():
    return LocalSession(workspace.Workspace())


def substep_names(step):
    return [s.name for s in step.Proto().substep]


# ------------------------------------------------------------------ repr --

def test_reprs():
    def body():
        return [
            repr(Cluster()),
            repr(Node()),
            repr(TaskGroup()),
            repr(TaskOutput([])),
            repr(Task()),
            repr(SetupNets()),
            repr(TaskOutputList()),
        ]

    assert run_in_thread(body) == [
        'Cluster(nodes=[], node_kwargs={})',
        'Node(name=local, kwargs={})',
        'TaskGroup(tasks=[], workspace_type=None, remote_nets=[])',
        'TaskOutput(names=[], values=None)',
        'Task(name=local/task, node=local, outputs=[])',
        'SetupNets(init_nets=None, exit_nets=None)',
        'TaskOutputList(outputs=[])',
    ]


def test_repr_with_content():
    def body():
        with Cluster() as cluster:
            Node('trainer', num_cpus=2)
            Node('trainer', num_gpus=1)
            Node('reader')
        with Cluster():
            with TaskGroup(WorkspaceType.GLOBAL) as tg:
                with Node('n1'):
                    t = Task(outputs=[core.BlobReference('b1')])
        return repr(cluster), repr(tg), repr(t)

    cluster_r, tg_r, task_r = run_in_thread(body)
    assert cluster_r == (
        "Cluster(nodes=['trainer', 'reader'], node_kwargs="
        "{'trainer': {'num_cpus': 2, 'num_gpus': 1}, 'reader': {}})")
    assert task_r == (
        'Task(name=n1/task, node=n1, outputs='
        '[TaskOutput(names=[BlobReference("b1")], values=None)])')
    assert tg_r == 'TaskGroup(tasks=[%s], workspace_type=global, ' \
        'remote_nets=[])' % task_r


# ---------------------------------------------------- nodes and clusters --

def test_node_defaults_and_cluster_registration():
    def body():
        assert str(Node.current()) == 'local'
        with Cluster() as c:
            with Node('a'):
                assert str(Node.current()) == 'a'
                with Node('b', memory=3) as b:
                    assert Node.current() is b
                    assert b.kwargs() == {'memory': 3}
            Node('a', num_cpus=1)
        return c.nodes(), c.node_kwargs()

    nodes, kwargs = run_in_thread(body)
    assert nodes == ['a', 'b']
    assert kwargs == {'a': {'num_cpus': 1}, 'b': {'memory': 3}}


def test_node_keywords_are_checked_where_they_are_written():
    # A typo used to be recorded in the process-wide Cluster and poison the
    # node's name for every later session, even after a corrected Node.
    def body():
        cluster = Cluster.current()  # the default, process-wide one
        out = []
        for bad, needle in [
                (dict(num_cpu=4), 'num_cpu (did you mean num_cpus'),
                (dict(num_cpus='four'), 'num_cpus must be a number >= 0'),
                (dict(num_cpus=float('nan')), 'num_cpus must be a number'),
                (dict(num_threads=0), 'num_threads must be a number >= 1'),
                (dict(resources=['big']), 'resources must be a dict')]:
            with pytest.raises(errors.InvalidArgumentError,
                               match="Node 'a'") as e:
                Node('a', **bad)
            assert needle in str(e.value)
            assert e.value.node == 'a'
            out.append(dict(cluster.node_kwargs()))
        Node('a', num_cpus=4)
        out.append(dict(cluster.node_kwargs()))
        # Given again, a keyword's newest value wins.
        Node('a', num_cpus=2, memory=1 << 20)
        Node('a')
        out.append(dict(cluster.node_kwargs()))
        return out, cluster.nodes()

    out, nodes = run_in_thread(body)
    assert out[:5] == [{}] * 5
    assert out[5] == {'a': {'num_cpus': 4}}
    assert out[6] == {'a': {'num_cpus': 2, 'memory': 1 << 20}}
    assert nodes == ['a']


# ------------------------------------------------------------ task names --

def test_task_names_in_group_and_global():
    def body():
        names = []
        with TaskGroup():
            names.append(Task().name)
            names.append(Task().name)
            names.append(Task(name='x').name)
            with Node('n'):
                names.append(Task().name)
        # outside any group the names are unique process-wide
        names.append(Task().name)
        names.append(Task().name)
        names.append(Task(step=core.execution_step('mystep', [])).name)
        return names

    assert run_in_thread(body) == [
        'local/task', 'local/task:1', 'local/x', 'n/task',
        'local/task', 'local/task:1', 'local/mystep']
    assert 'local/task:1' in Task._global_names_used


def test_task_context_builds_step_and_names_nets():
    with TaskGroup() as tg:
        with Node('trainer'):
            with Task(name='train') as task:
                net = ops.net()
                ops.Const(1)
    assert task.name == 'trainer/train'
    assert net.Name().startswith('trainer/train')
    assert tg.tasks() == [task]
    assert isinstance(task.get_step(), core.ExecutionStep)


def test_tasks_created_inside_a_task_come_first():
    with TaskGroup() as tg:
        with Task(name='outer') as outer:
            inner = Task(name='inner', step=core.execution_step('s', []))
            ops.Const(1)
    assert tg.tasks() == [inner, outer]


def test_task_assertions():
    with TaskGroup():
        t = Task(step=core.execution_step('has_step', []))
        with pytest.raises(AssertionError) as e:
            with t:
                pass
        assert str(e.value) == 'This Task already has an execution step.'
        assert Task.current(required=False) is None
    with TaskGroup() as tg:
        t2 = Task(step=core.execution_step('used', []))
    tg.tasks()
    with pytest.raises(AssertionError) as e:
        t2.add_output(core.BlobReference('late'))
    assert str(e.value) == 'Cannot modify task since it is already been used.'
    with pytest.raises(AssertionError) as e:
        tg.add(Task(group=TaskGroup()))
    assert str(e.value) == 'Cannot add Task to an already used TaskGroup.'


def test_workspace_type_agreement():
    tg = TaskGroup(WorkspaceType.GLOBAL)
    t = Task(group=TaskGroup(), workspace_type=WorkspaceType.PRIVATE)
    with pytest.raises(AssertionError):
        tg.add(t)
    tg2 = TaskGroup()
    t2 = Task(group=TaskGroup())
    tg2.add(t2)
    assert t2.workspace_type() == WorkspaceType.PRIVATE
    assert tg2.workspace_type() == WorkspaceType.PRIVATE
    tg3 = TaskGroup()
    tg3.add(Task(group=TaskGroup(), workspace_type=WorkspaceType.GLOBAL))
    assert tg3.workspace_type() == WorkspaceType.GLOBAL


def test_group_bookkeeping():
    with TaskGroup() as tg:
        with Node('n2'):
            Task(name='a')
        with Node('n1'):
            Task(name='b')
        with Node('n2'):
            Task(name='c')
    assert tg.num_registered_tasks() == 3
    assert tg.used_nodes() == ['n2', 'n1']
    tg.add_remote_net('remote')
    assert tg.remote_nets() == ['remote']
    assert len(tg.tasks()) == 3
    assert tg.num_registered_tasks() == 3


# ------------------------------------------------------------ outputs ----

def test_task_output_shapes():
    single = TaskOutput(core.BlobReference('a'))
    many = TaskOutput([core.BlobReference('b'), core.BlobReference('c')])
    with pytest.raises(errors.OutputNotReadyError) as e:
        single.get()
    assert str(e.value) == 'Output value not set yet.'
    assert isinstance(e.value, RuntimeError)
    single.set(['value_a'])
    assert single.get() == 'value_a'
    with pytest.raises(errors.OutputNotReadyError) as e:
        single.fetch()
    assert str(e.value) == 'Cannot fetch value for this output.'
    lst = TaskOutputList([single, many])
    assert [str(n) for n in lst.names()] == ['a', 'b', 'c']
    lst.set_values(['x', 'y', 'z'], _fetch_func=lambda v: v * 2)
    assert single.get() == 'x'
    assert many.get() == ['y', 'z']
    assert single.fetch() == 'xx'
    assert many.fetch() == ['yy', 'zz']
    with pytest.raises(errors.InvalidArgumentError) as e:
        lst.set_values(['x', 'y', 'z', 'extra'])
    assert str(e.value) == 'Wrong number of output values.'


def test_final_output_without_task_creates_one():
    def body():
        with TaskGroup() as tg:
            out = final_output(core.BlobReference('loose'))
        tasks = tg.tasks()
        return len(tasks), tasks[0].outputs() == [out]

    assert run_in_thread(body) == (1, True)


# ------------------------------------------------------ step structure --

def test_get_step_without_step_has_no_dummy_output():
    t = Task(group=TaskGroup())
    step = t.get_step()
    assert step.Proto().name == t.name
    assert t.outputs() == []


def test_get_step_structure_with_instances_and_setup():
    with TaskGroup():
        with Node('trainer'):
            with Task(name='work', num_instances=3) as task:
                with ops.task_init():
                    ops.Const(0, blob_out='g')
                with ops.task_instance_init():
                    ops.Const(0, blob_out='l')
                ops.Const(1)
                with ops.task_instance_exit():
                    ops.Const(2)
                with ops.task_exit():
                    ops.Const(3)
    step = task.get_step()
    assert step is task.get_step()
    proto = step.Proto()
    assert proto.name == 'trainer/work'
    assert substep_names(step) == [
        'trainer/work:init', 'trainer/work:parallel', 'trainer/work:exit']
    parallel = proto.substep[1]
    assert parallel.num_concurrent_instances == 3
    instance = parallel.substep[0]
    assert instance.name == 'trainer/work:instance'
    assert instance.create_workspace
    assert [s.name for s in instance.substep][0] == 'trainer/work:instance:init'
    assert [s.name for s in instance.substep][-1] == 'trainer/work:instance:exit'
    # a task with no output gets a dummy one, made in the exit nets
    assert len(task.outputs()) == 1
    assert [str(n) for n in task.outputs()[0].names] == [
        'trainer/work:output/ConstantFill:0']


def test_single_instance_has_no_parallel_step():
    with TaskGroup():
        with Task(name='solo', num_instances=1) as task:
            ops.Const(1)
    names = [s.name for s in task.get_step().Proto().substep]
    assert not any(n.endswith(':parallel') for n in names)


def test_get_setup_nets_and_add_setup_steps():
    init_a = core.Net('init_a')
    init_a.Const(1)
    exit_a = core.Net('exit_a')
    exit_a.Const(2)
    shared = SetupNets([init_a], [exit_a])

    class AddsOps(object):
        def setup(self, init_net):
            init_net.Const(3)

        def exit(self, exit_net):
            return None

    class Wrong(object):
        def setup(self, init_net):
            return 'not a net'

    class OtherTarget(object):
        _setup_target = 'somebody else'

        def setup(self, init_net):
            raise AssertionError('must be skipped')

    net1 = core.Net('with_setup_1')
    net2 = core.Net('with_setup_2')
    net1.add_attribute('k', shared)
    net1.add_attribute('k', AddsOps())
    net1.add_attribute('k', OtherTarget())
    net2.add_attribute('k', shared)  # the same object: used once only
    inits, exits = get_setup_nets('k', [net1, net2], 'me')
    assert inits[0].Name().startswith('k/init')
    assert inits[1:] == [init_a]
    assert exits == [exit_a]
    assert shared._setup_used
    assert get_setup_nets('k', [net1, net2], 'me') == ([], [])

    net3 = core.Net('with_setup_3')
    net3.add_attribute('k', Wrong())
    with pytest.raises(TypeError) as e:
        get_setup_nets('k', [net3], None)
    assert str(e.value).startswith('Unsupported type for setup: ')

    body = core.execution_step('body', [core.Net('body_net')])
    assert add_setup_steps(body, [], [], 'x') is body
    wrapped = add_setup_steps(body, [init_a], [], 'wrap')
    assert substep_names(wrapped) == ['wrap:init', 'body']
    body2 = core.execution_step('body2', [core.Net('body_net2')])
    wrapped = add_setup_steps(body2, [init_a], [exit_a], 'both')
    assert substep_names(wrapped) == ['both:init', 'body2', 'both:exit']
    assert wrapped.Proto().name == 'both'


def test_tasks_by_node_and_to_task():
    with TaskGroup() as tg:
        with Node('n1'):
            Task(step=core.execution_step('s1', [core.Net('s1net')]))
        with Node('n2'):
            Task(step=core.execution_step('s2', [core.Net('s2net')]))
        with Node('n1'):
            Task(step=core.execution_step('s3', [core.Net('s3net')]))
    grouped = tg.tasks_by_node()
    tasks = grouped.tasks()
    assert [t.node for t in tasks] == ['n1', 'n2']
    assert [t.name for t in tasks] == ['n1/grouped_by_node',
                                       'n2/grouped_by_node']
    assert tasks[0].get_step().Proto().concurrent_substeps
    assert tg.tasks_by_node() is grouped
    with pytest.raises(AssertionError) as e:
        tg.tasks_by_node(lambda n: 'other')
    assert str(e.value) == 'Cannot call tasks_by_node multiple times.'
    # each original task runs in a fresh workspace (PRIVATE by default)
    for t in tg.tasks():
        assert t.get_step().Proto().create_workspace


def test_to_task_of_empty_group_does_not_join_active_group():
    with TaskGroup() as active:
        task = TaskGroup().to_task()
    assert active.num_registered_tasks() == 0
    assert isinstance(task, Task)


def test_report_net_becomes_report_step():
    with TaskGroup() as tg:
        net = tg.report_net(report_interval=2)
        Task(step=core.execution_step('s', [core.Net('body_net')]))
    assert net.Name().startswith('local/reporter')
    assert tg.report_net() is net
    grouped = tg.tasks_by_node()
    step = grouped.tasks()[0].get_step()
    report = [s for s in step.Proto().substep if s.run_every_ms]
    assert [s.run_every_ms for s in report] == [2000]


# ------------------------------------------------------------- runtime --

def test_setup_order_and_dummy_output():
    """Phases record the order in which they run with a shared counter."""
    with TaskGroup() as tg:
        with Task(workspace_type=WorkspaceType.GLOBAL) as task:
            with ops.local_init():
                seq = ops.CreateCounter([], init_count=0)
                local_init_at = ops.CountUp(seq)
            with ops.task_init():
                task_init_at = ops.CountUp(seq)
            with ops.task_instance_init():
                instance_init_at = ops.CountUp(seq)
            body_at = ops.CountUp(seq)
            with ops.task_instance_exit():
                instance_exit_at = ops.CountUp(seq)
            with ops.task_exit():
                task_exit_at = ops.CountUp(seq)
            with ops.local_exit():
                local_exit_at = ops.CountUp(seq)
            outs = [final_output(b) for b in (
                local_init_at, task_init_at, instance_init_at, body_at,
                instance_exit_at, task_exit_at, local_exit_at)]
    with new_session() as session:
        session.run(tg)
        assert [int(o.fetch()) for o in outs] == [0, 1, 2, 3, 4, 5, 6]
    assert task.name == 'local/task'


def test_task_exit_sees_body_results():
    with Task() as task:
        with ops.task_init():
            one = ops.Const(1)
        two = ops.Add([one, one])
        with ops.task_init():
            three = ops.Const(3)
        acc = ops.Add([two, three])               # 5
        with ops.task_exit():
            late = ops.Add([acc, one])            # runs after the body: 7
        early = ops.Add([acc, one])               # 6
        ops.Add([acc, one], [acc])                # acc = 6
        o_early = final_output(early)
        o_late = final_output(late)
        o_acc = final_output(acc)
    with new_session() as session:
        session.run(task)
        assert int(o_early.fetch()) == 6
        assert int(o_late.fetch()) == 7
        assert int(o_acc.fetch()) == 6


def test_instances_with_shared_and_per_instance_counters():
    n_instances, n_iters = 4, 6
    with TaskGroup() as tg:
        with Task(num_instances=n_instances):
            with ops.task_init():
                shared = ops.CreateCounter([], ['shared_c'])
                sq_sum = ops.CreateCounter([], ['sq_sum_c'])
                inits = ops.CreateCounter([], ['inits_c'])
                exits = ops.CreateCounter([], ['exits_c'])
            with ops.task_instance_init():
                mine = ops.CreateCounter([], ['mine_c'])
                ops.CountUp(inits)
            with ops.loop(n_iters):
                ops.CountUp(shared)
                ops.CountUp(mine)
            with ops.task_instance_exit():
                ops.CountUp(exits)
                count = ops.RetrieveCount(mine)
                with ops.loop(ops.Mul([count, count])):
                    ops.CountUp(sq_sum)
            with ops.task_exit():
                out_shared = final_output(ops.RetrieveCount(shared))
                out_sq = final_output(ops.RetrieveCount(sq_sum))
                out_inits = final_output(ops.RetrieveCount(inits))
                out_exits = final_output(ops.RetrieveCount(exits))
    with new_session() as session:
        session.run(tg)
        assert int(out_shared.fetch()) == n_instances * n_iters
        # each instance's own counter reached exactly n_iters
        assert int(out_sq.fetch()) == n_instances * n_iters ** 2
        assert int(out_inits.fetch()) == n_instances
        assert int(out_exits.fetch()) == n_instances


def test_local_setup_runs_once_per_node():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    with TaskGroup(WorkspaceType.GLOBAL) as init_tg:
        init_net = core.Net('counters_init')
        calls = init_net.CreateCounter([], ['local_init_calls'])
        exit_calls = init_net.CreateCounter([], ['local_exit_calls'])
        work = init_net.CreateCounter([], ['work_done'])
        Task(step=init_net)
    session.run(init_tg)

    setup_init = core.Net('node_setup_init')
    setup_init.CountUp([calls])
    setup_exit = core.Net('node_setup_exit')
    setup_exit.CountUp([exit_calls])
    shared_setup = SetupNets([setup_init], [setup_exit])
    with TaskGroup() as tg:
        for i in range(3):
            body = core.Net('body_%d' % i)
            body.CountUp([work])
            body.add_attribute(TaskGroup.LOCAL_SETUP, shared_setup)
            Task(step=body)
    session.run(tg)
    check = core.Net('read_counts')
    check.RetrieveCount([calls], ['n_init'])
    check.RetrieveCount([exit_calls], ['n_exit'])
    check.RetrieveCount([work], ['n_work'])
    session.run(check)
    assert int(ws.fetch_blob('n_init')) == 1
    assert int(ws.fetch_blob('n_exit')) == 1
    assert int(ws.fetch_blob('n_work')) == 3


def test_task_reporter_runs_during_and_after():
    import time

    def slow(inputs, outputs):
        time.sleep(0.01)

    with TaskGroup() as tg:
        with Task(workspace_type=WorkspaceType.GLOBAL):
            with ops.task_init():
                progress = ops.CreateCounter([], ['progress_c'])
                reports = ops.CreateCounter([], ['reports_c'])
                seen = ops.Const(-1, blob_out='seen_progress')
            with ops.loop(20):
                ops.Python(slow)([], [])
                ops.CountUp(progress)
            with ops.task_reporter(interval_ms=20):
                ops.CountUp(reports)
                ops.RetrieveCount(progress, [seen])
            out_reports = final_output(ops.RetrieveCount(reports))
            out_seen = final_output(seen)
    with new_session() as session:
        session.run(tg)
        # the body takes about 200 ms: several periodic runs, plus the
        # final run once the body finished (which sees all 20 iterations)
        assert int(out_reports.fetch()) >= 2
        assert int(out_seen.fetch()) == 20


def test_local_reporter_final_run_sees_all_tasks():
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        with Task(name='a'):
            with ops.local_init():
                done = ops.CreateCounter([], ['tasks_done'])
                reports = ops.CreateCounter([], ['local_reports'])
                seen = ops.Const(-1, blob_out='local_seen')
            ops.CountUp(done)
            with ops.local_reporter(interval_ms=5):
                ops.CountUp(reports)
                ops.RetrieveCount(done, [seen])
        with Task(name='b'):
            ops.CountUp(done)
    with new_session() as session:
        session.run(tg)
        ws = session._ws
        assert int(ws.fetch_blob('local_seen')) == 2
        report = core.Net('count_reports')
        report.RetrieveCount([reports], ['n_reports'])
        session.run(report)
        assert int(ws.fetch_blob('n_reports')) >= 1


def test_private_tasks_write_back_existing_blobs_only():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    init = core.Net('pre_init')
    init.Const(10, blob_out='pre_existing')
    session.run(init)
    with TaskGroup() as tg:  # PRIVATE by default
        with Task():
            ops.Add(['pre_existing', ops.Const(5)], ['pre_existing'])
            ops.Const(1, blob_out='task_local_blob')
    session.run(tg)
    assert int(ws.fetch_blob('pre_existing')) == 15
    assert not ws.has_blob('task_local_blob')


# ------------------------------------------------------------- example --

def test_task_example_structure_and_result():
    example = load_example('task_example.py')
    tg, task, result = example.build()
    assert task.name == 'trainer/my_task'
    step = task.get_step()
    assert substep_names(step) == [
        'trainer/my_task:init', 'trainer/my_task:parallel',
        'trainer/my_task:exit']
    parallel = step.Proto().substep[1]
    assert parallel.num_concurrent_instances == 2
    assert parallel.substep[0].create_workspace
    with new_session() as session:
        session.run(tg)
        # model: globl starts at 0; each instance adds a copy of it (0) and
        # the exit squares it: 0
        assert as_scalar(result.fetch()) == 0


def test_task_example_main_runs():
    example = load_example('task_example.py')
    assert as_scalar(example.main()) == 0


def as_scalar(value):
    import numpy as np
    return np.asarray(value).reshape(-1)[0].item()
