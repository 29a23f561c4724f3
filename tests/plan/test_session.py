"""Tests of ferrocaffe.session: Session / LocalSession, compilation and its
cache, multi-node runs and node isolation."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from _support import PKG_PARENT, load_example
from ferrocaffe import core, errors, workspace
from ferrocaffe.net_builder import ops
from ferrocaffe.session import CompiledRunnable, LocalSession, Session
from ferrocaffe.task import (
    Node, Task, TaskGroup, WorkspaceType, final_output)


def as_int(value):
    return int(np.asarray(value).reshape(-1)[0])


# ------------------------------------------------------- base behaviour --

def test_default_workspace_is_the_current_one():
    session = LocalSession()
    assert session._ws is workspace.current_workspace()


def test_session_assertions_and_close():
    session = LocalSession(workspace.Workspace())
    assert session.is_open()
    with pytest.raises(errors.InvalidArgumentError) as e:
        session.run(None)
    assert str(e.value) == 'Got a none runnable.'
    session.close()
    assert not session.is_open()
    session.close()  # idempotent
    with pytest.raises(errors.SessionClosedError) as e:
        session.run(core.Net('never_runs'))
    assert str(e.value) == 'Session is closed.'
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(errors.SessionClosedError) as e:
        with session:
            pass
    assert str(e.value) == 'Session already closed.'


def test_closed_session_and_unready_outputs_raise_under_python_O():
    # These were asserts: `python -O` strips them, and a closed session ran.
    script = textwrap.dedent("""
        import sys
        import numpy as np
        from ferrocaffe import core, errors, workspace
        from ferrocaffe.net_builder import ops
        from ferrocaffe.session import LocalSession
        from ferrocaffe.task import Task, TaskGroup, final_output

        assert sys.flags.optimize == 1
        ws = workspace.Workspace()
        session = LocalSession(ws)
        session.close()
        net = core.Net('would_run')
        net.ConstantFill([], ['ran'], shape=[1], value=1.0)
        try:
            session.run(net)
        except errors.SessionClosedError as e:
            print('closed:', e)
        print('ran:', ws.has_blob('ran'))
        with TaskGroup() as tg:
            with Task():
                out = final_output(ops.Const(np.array([3], np.int64)))
        for read in (out.get, out.fetch):
            try:
                read()
            except errors.OutputNotReadyError as e:
                print('not ready:', e)
    """)
    # The child imports the ferrocaffe this process imported (the repo's
    # python/ in a dev build, site-packages once installed).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in [PKG_PARENT, os.environ.get('PYTHONPATH')] if p))
    done = subprocess.run([sys.executable, '-O', '-c', script], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        'closed: Session is closed.',
        'ran: False',
        'not ready: Output value not set yet.',
        'not ready: Cannot fetch value for this output.',
    ]


def test_context_manager_closes_only_on_success():
    with LocalSession(workspace.Workspace()) as s1:
        assert s1.is_open()
    assert not s1.is_open()
    s2 = LocalSession(workspace.Workspace())
    with pytest.raises(RuntimeError):
        with s2:
            raise RuntimeError('fail inside')
    assert s2.is_open()


def test_base_session_is_abstract():
    s = Session()
    with pytest.raises(NotImplementedError):
        s.fetch_output(None)
    with pytest.raises(NotImplementedError):
        s.run(core.Net('abstract_net'))


def test_close_calls_do_close_once():
    calls = []

    class Closing(LocalSession):
        def _do_close(self):
            calls.append(1)

    s = Closing(workspace.Workspace())
    s.close()
    s.close()
    assert calls == [1]


# -------------------------------------------------------- runnables ----

def test_run_net_step_plan_and_list():
    ws = workspace.Workspace()
    session = LocalSession(ws)

    net = core.Net('session_net')
    net.CreateCounter([], ['c_net'])
    session.run(net)
    assert ws.has_blob('c_net')

    step_net = core.Net('session_step_net')
    step_net.CountUp(['c_net'], ['prev_step'])
    session.run(core.execution_step('a_step', [step_net], num_iter=3))
    assert as_int(ws.fetch_blob('prev_step')) == 2

    n1 = core.Net('plan_net_1')
    n1.CountUp(['c_net'], ['prev_p1'])
    n2 = core.Net('plan_net_2')
    n2.CountUp(['c_net'], ['prev_p2'])
    plan = core.Plan('two_step_plan')
    plan.AddStep(core.execution_step('p1', [n1]))
    plan.AddStep(core.execution_step('p2', [n2]))
    session.run(plan)
    assert as_int(ws.fetch_blob('prev_p1')) == 3
    assert as_int(ws.fetch_blob('prev_p2')) == 4

    l1 = core.Net('list_net_1')
    l1.CountUp(['c_net'], ['prev_l1'])
    l2 = core.Net('list_net_2')
    l2.CountUp(['c_net'], ['prev_l2'])
    session.run([l1, l2])
    assert as_int(ws.fetch_blob('prev_l1')) == 5
    assert as_int(ws.fetch_blob('prev_l2')) == 6


def test_run_task_outputs_and_fetch_output():
    session = LocalSession(workspace.Workspace())
    with Task() as task:
        c = ops.CreateCounter([], init_count=5)
        ops.CountDown(c)
        out = final_output(ops.RetrieveCount(c))
    session.run(task)
    assert as_int(out.get() and out.fetch()) == 4
    assert str(out.get()) == str(out.names[0])
    assert as_int(session.fetch_output(out)) == 4


def test_outputs_are_precreated_in_session_workspace():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    with TaskGroup() as tg:  # PRIVATE tasks
        with Task():
            out = final_output(ops.CreateCounter([], init_count=2))
            local = ops.CreateCounter([], init_count=3)
    session.run(tg)
    assert ws.has_blob(str(out.names[0]))
    assert not ws.has_blob(str(local))


def test_dummy_output_of_task_without_outputs():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    with Task(name='nothing') as task:
        ops.CreateCounter([], init_count=1)
    session.run(task)
    assert len(task.outputs()) == 1
    name = str(task.outputs()[0].names[0])
    assert name == 'local/nothing:output/ConstantFill:0'
    value = ws.fetch_blob(name)
    assert np.asarray(value).dtype == np.int32
    assert as_int(value) == 0


# --------------------------------------------------------- compile ----

def test_compile_cache_is_identity_keyed_and_stale():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    init = core.Net('stale_init')
    init.CreateCounter([], ['stale_c'])
    session.run(init)

    net = core.Net('stale_net')
    net.CountUp(['stale_c'])
    c1 = LocalSession.compile(net)
    assert LocalSession.compile(net) is c1
    session.run(net)
    # Modifying the object after compilation is not seen: the cached plan
    # is reused (Caffe2 behaviour).
    net.CountUp(['stale_c'])
    session.run(net)
    check = core.Net('stale_check')
    check.RetrieveCount(['stale_c'], ['stale_count'])
    session.run(check)
    assert as_int(ws.fetch_blob('stale_count')) == 2


def test_compile_cache_is_per_session_class():
    class OtherSession(LocalSession):
        pass

    net = core.Net('per_class_net')
    net.CreateCounter([], ['per_class_c'])
    a = LocalSession.compile(net)
    b = OtherSession.compile(net)
    assert a is not b
    assert a.session_class is LocalSession
    assert b.session_class is OtherSession
    assert OtherSession.compile(b) is b
    with pytest.raises(AssertionError) as e:
        LocalSession.compile(b)
    assert str(e.value) == (
        'Runnable was compiled for different session type. '
        'Need: LocalSession, got: OtherSession')


def test_compiled_runnable_runs():
    ws = workspace.Workspace()
    net = core.Net('precompiled')
    net.CreateCounter([], ['precompiled_c'])
    compiled = LocalSession.compile(net)
    assert isinstance(compiled, CompiledRunnable)
    LocalSession(ws).run(compiled)
    assert ws.has_blob('precompiled_c')


def test_compile_workspace_type_of_group():
    with TaskGroup(WorkspaceType.PRIVATE) as tg:
        Task(step=core.execution_step('s', [core.Net('wt_net')]))
    with pytest.raises(AssertionError) as e:
        LocalSession.compile(tg, workspace_type=WorkspaceType.GLOBAL)
    assert str(e.value) == 'Require global but already have private'

    with TaskGroup() as tg2:
        Task(step=core.execution_step('s2', [core.Net('wt_net2')]))
    LocalSession.compile(tg2, workspace_type=WorkspaceType.GLOBAL)
    assert tg2.workspace_type() == WorkspaceType.GLOBAL


def test_compile_does_not_join_active_group():
    with TaskGroup() as active:
        LocalSession.compile(core.Net('not_joining'))
        LocalSession.compile(core.execution_step(
            'not_joining_step', [core.Net('nj')]))
    assert active.num_registered_tasks() == 0


def test_empty_group_runs():
    session = LocalSession(workspace.Workspace())
    session.run(TaskGroup())


# ------------------------------------------------------- multi-node ----

def test_multi_node_tasks_share_the_session_workspace():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    with TaskGroup(WorkspaceType.GLOBAL) as init_tg:
        with Node('node1'):
            setup = core.Net('n1_setup')
            counter = setup.CreateCounter([], ['cross_node_counter'])
            Task(step=setup)
    session.run(init_tg)
    with TaskGroup() as tg:
        for node in ('node1', 'node2', 'node3'):
            with Node(node):
                net = core.Net('%s_work' % node)
                net.CountUp([counter])
                Task(step=net)
    session.run(tg)
    check = core.Net('cross_check')
    check.RetrieveCount([counter], ['cross_count'])
    session.run(check)
    # every node counted up the one counter of the session workspace
    assert as_int(ws.fetch_blob('cross_count')) == 3


def test_multi_node_outputs():
    session = LocalSession(workspace.Workspace())
    outs = {}
    with TaskGroup() as tg:
        for k, node in enumerate(['a', 'b']):
            with Node(node):
                with Task():
                    c = ops.CreateCounter([], init_count=10 * (k + 1))
                    outs[node] = final_output(ops.RetrieveCount(c))
    session.run(tg)
    assert as_int(outs['a'].fetch()) == 10
    assert as_int(outs['b'].fetch()) == 20


# ---------------------------------------------------- isolated nodes ----

def test_isolated_nodes_have_their_own_persistent_workspaces():
    ws = workspace.Workspace()
    session = LocalSession(ws, isolate_nodes=True)
    with TaskGroup(WorkspaceType.GLOBAL) as init_tg:
        for k, node in enumerate(['iso1', 'iso2']):
            with Node(node):
                net = core.Net('%s_init' % node)
                net.CreateCounter([], ['node_counter'], init_count=100 * (k + 1))
                Task(step=net)
    session.run(init_tg)
    # the same blob name lives separately in each node's workspace
    assert not ws.has_blob('node_counter')
    ws1 = session.node_workspace('iso1')
    ws2 = session.node_workspace('iso2')
    assert ws1 is not ws2
    assert ws1.has_blob('node_counter') and ws2.has_blob('node_counter')

    outs = {}
    for run in range(2):
        with TaskGroup() as tg:
            for node in ('iso1', 'iso2'):
                with Node(node):
                    with Task():
                        ops.CountUp(['node_counter'])
                        outs[(run, node)] = final_output(
                            ops.RetrieveCount(['node_counter']))
        session.run(tg)
    # node state persists across runs of the session
    assert as_int(outs[(0, 'iso1')].fetch()) == 101
    assert as_int(outs[(0, 'iso2')].fetch()) == 201
    assert as_int(outs[(1, 'iso1')].fetch()) == 102
    assert as_int(outs[(1, 'iso2')].fetch()) == 202
    assert session.node_workspace('iso1') is ws1


def test_isolated_nodes_see_the_session_workspace():
    ws = workspace.Workspace()
    ws.feed_blob('base_value', np.array(7, dtype=np.int64))
    session = LocalSession(ws, isolate_nodes=True)
    outs = []
    with TaskGroup() as tg:
        for k, node in enumerate(['see1', 'see2']):
            with Node(node):
                with Task():
                    c = ops.CreateCounter([], init_count=k + 1)
                    outs.append(final_output(ops.RetrieveCount(c)))
    session.run(tg)
    assert [as_int(o.fetch()) for o in outs] == [1, 2]
    # a private task of a node reads blobs of the session workspace
    with TaskGroup() as tg2:
        with Node('see1'):
            with Task():
                copy = ops.Copy(['base_value'])
                out = final_output(copy)
    session.run(tg2)
    assert as_int(out.fetch()) == 7


def test_default_session_does_not_isolate_same_blob_names():
    ws = workspace.Workspace()
    session = LocalSession(ws)
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        with Node('x1'):
            net = core.Net('x1_init')
            net.CreateCounter([], ['same_name_counter'], init_count=1)
            Task(step=net)
    session.run(tg)
    assert ws.has_blob('same_name_counter')
    assert session.node_workspace('x1') is ws


def test_isolated_nodes_run_concurrently():
    started = threading.Event()
    observed = []

    def waiter(inputs, outputs):
        observed.append(started.wait(timeout=20))

    def setter(inputs, outputs):
        started.set()

    session = LocalSession(workspace.Workspace(), isolate_nodes=True)
    with TaskGroup() as tg:
        with Node('waits'):
            net = core.Net('waiting_net')
            net.Python(waiter)([], [])
            Task(step=net)
        with Node('sets'):
            net2 = core.Net('setting_net')
            net2.Python(setter)([], [])
            Task(step=net2)
    session.run(tg)
    assert observed == [True]


def test_isolated_node_error_is_raised():
    def boom(inputs, outputs):
        raise ValueError('node failure')

    def fine(inputs, outputs):
        pass

    session = LocalSession(workspace.Workspace(), isolate_nodes=True)
    with TaskGroup() as tg:
        with Node('bad'):
            net = core.Net('bad_net')
            net.Python(boom)([], [])
            Task(step=net)
        with Node('good'):
            net2 = core.Net('good_net')
            net2.Python(fine)([], [])
            Task(step=net2)
    with pytest.raises(Exception) as e:
        session.run(tg)
    assert 'node failure' in str(e.value)


def test_isolated_session_compile_uses_its_mode():
    session = LocalSession(workspace.Workspace(), isolate_nodes=True)
    net = core.Net('iso_compile_net')
    net.CreateCounter([], ['iso_compile_c'])
    compiled = session.compile(net)
    assert compiled is session.compile(net)
    assert compiled is not LocalSession.compile(net)
    session.run(compiled)
    assert session.node_workspace('local').has_blob('iso_compile_c')
    assert not session._ws.has_blob('iso_compile_c')


# ------------------------------------------------------------- example --

def _as_text(value):
    value = np.asarray(value).reshape(-1)[0] if not isinstance(
        value, (bytes, str)) else value
    return value.decode() if isinstance(value, bytes) else str(value)


def test_session_example_runs():
    example = load_example('session_example.py')
    ws = workspace.Workspace()
    session, net, n1msg = example.main(LocalSession(ws))
    # the plain net ran in the session workspace: 1 + 2
    add_out = net.Proto().op[-1].output[0]
    assert as_int(ws.fetch_blob(add_out)) == 3
    # node1's setup message is in the session workspace, shared by all nodes
    assert _as_text(ws.fetch_blob(str(n1msg))) == 'Hello from node 1.'


def test_session_example_with_isolated_nodes():
    example = load_example('session_example.py')
    ws = workspace.Workspace()
    session, net, n1msg = example.main(LocalSession(ws, isolate_nodes=True))
    # the message lives in node1's workspace, where the private task of
    # node1 read it
    assert not ws.has_blob(str(n1msg))
    node1_ws = session.node_workspace('node1')
    assert _as_text(node1_ws.fetch_blob(str(n1msg))) == 'Hello from node 1.'
    assert not session.node_workspace('node2').has_blob(str(n1msg))
