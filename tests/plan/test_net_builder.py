"""Tests of ferrocaffe.net_builder and ferrocaffe.control_ops_util.

Expected values come from small plain-Python models of each program."""

import threading
import time

import pytest

from ferrocaffe import core, workspace
from ferrocaffe.control_ops_util import (
    add_if_op, add_while_op, get_external_blob_names)
from ferrocaffe.net_builder import NetBuilder, ops
from ferrocaffe.session import LocalSession
from ferrocaffe.task import Task, TaskGroup, final_output


def run_builder(nb):
    """Runs the builder's step as a plan in a fresh workspace."""
    plan = core.Plan('test_plan')
    plan.AddStep(core.to_execution_step(nb))
    ws = workspace.Workspace()
    ws.run(plan)
    return ws


def fetch(ws, blob):
    return ws.fetch_blob(str(blob))


def scalar(ws, blob):
    value = fetch(ws, blob)
    return value.item() if hasattr(value, 'item') else value


def arg_map(op):
    return {a.name: a for a in op.arg}


# ------------------------------------------------------------- stop-blob --

def test_loop_with_stop_if_counts_down():
    with NetBuilder('nbt') as nb:
        x = ops.Const(4)
        total = ops.Const(0)
        iters = ops.Const(0)
        with ops.loop():
            ops.stop_if(ops.LE([x, ops.Const(0)]))
            ops.Add([total, x], [total])
            ops.Add([x, ops.Const(-1)], [x])
            ops.Add([iters, ops.Const(1)], [iters])
    ws = run_builder(nb)
    # model: x = 4, 3, 2, 1 enter the body
    assert scalar(ws, total) == 4 + 3 + 2 + 1
    assert scalar(ws, iters) == 4
    assert scalar(ws, x) == 0


def test_loop_with_count_and_iter():
    with NetBuilder('nbt') as nb:
        acc = ops.Const(0)
        with ops.loop(6) as loop:
            sq = ops.Mul([loop.iter(), loop.iter()])
            ops.Add([acc, sq], [acc])
    ws = run_builder(nb)
    assert scalar(ws, acc) == sum(i * i for i in range(6))


def test_loop_with_blob_count_zero_runs_nothing():
    with NetBuilder('nbt') as nb:
        n = ops.Const(0)
        acc = ops.Const(7)
        with ops.loop(n):
            ops.Add([acc, ops.Const(1)], [acc])
    ws = run_builder(nb)
    assert scalar(ws, acc) == 7


def _model_nested_totals():
    big = mid = small = total = count = 0
    for i in range(6):
        for j in range(i + 1):
            v = 3 * i + j
            if v >= 12:
                big += v
            elif v >= 5:
                mid += v
            else:
                small += v
            total += v
            count += 1
    return total, big, mid, small, count


def _build_nested_totals():
    total = ops.Const(0)
    big = ops.Const(0)
    mid = ops.Const(0)
    small = ops.Const(0)
    count = ops.Const(0)
    with ops.loop(6) as outer:
        base = ops.Mul([outer.iter(), ops.Const(3)])
        n_inner = ops.Add([outer.iter(), ops.Const(1)])
        with ops.loop(n_inner) as inner:
            v = ops.Add([base, inner.iter()])
            with ops.If(ops.GE([v, ops.Const(12)])) as branch:
                ops.Add([big, v], [big])
            with branch.Elif(ops.GE([v, ops.Const(5)])) as branch:
                ops.Add([mid, v], [mid])
            with branch.Else():
                ops.Add([small, v], [small])
            ops.Add([total, v], [total])
            ops.Add([count, ops.Const(1)], [count])
    return total, big, mid, small, count


def test_nested_loops_with_if_elif_else_in_plan():
    with NetBuilder('nbt') as nb:
        blobs = _build_nested_totals()
    ws = run_builder(nb)
    assert tuple(scalar(ws, b) for b in blobs) == _model_nested_totals()


def test_nested_loops_with_if_elif_else_in_task():
    with Task() as task:
        outputs = [final_output(b) for b in _build_nested_totals()]
    with LocalSession(workspace.Workspace()) as session:
        session.run(task)
        got = tuple(int(o.fetch()) for o in outputs)
    assert got == _model_nested_totals()


def test_elif_not_taken_after_true_if():
    with NetBuilder('nbt') as nb:
        hits = ops.Const(0)
        with ops.If(ops.Const(True)) as b:
            ops.Add([hits, ops.Const(1)], [hits])
        with b.Elif(ops.Const(True)) as b:
            ops.Add([hits, ops.Const(10)], [hits])
        with b.Else():
            ops.Add([hits, ops.Const(100)], [hits])
        # a false If, whose Elif is taken
        with ops.If(ops.Const(False)) as b:
            ops.Add([hits, ops.Const(1000)], [hits])
        with b.Elif(ops.Const(True)) as b:
            ops.Add([hits, ops.Const(10000)], [hits])
        with b.Else():
            ops.Add([hits, ops.Const(100000)], [hits])
        # everything false: the Else is taken
        with ops.If(ops.Const(False)) as b:
            ops.Add([hits, ops.Const(1000000)], [hits])
        with b.Else():
            ops.Add([hits, ops.Const(10000000)], [hits])
    ws = run_builder(nb)
    assert scalar(ws, hits) == 1 + 10000 + 10000000


def test_stop_guard_reports_whether_it_stopped():
    with NetBuilder('nbt') as nb:
        ten = ops.Const(10)
        three = ops.Const(3)
        after = ops.Const(0)
        with ops.stop_guard() as g_no_stop:
            ops.stop_if(ops.LT([ten, ops.Const(5)]))
            ops.Add([after, ops.Const(1)], [after])
        with ops.stop_guard() as g_stop:
            ops.stop_if(ops.LT([three, ops.Const(5)]))
            ops.Add([after, ops.Const(10)], [after])
        with ops.stop_guard() as g_plain:
            ops.Const(0)
        with ops.stop_guard() as g_empty:
            pass
        with ops.stop_guard() as g_unconditional:
            ops.stop()
            ops.Add([after, ops.Const(100)], [after])
        # execution continues after a stopped guard
        ops.Add([after, ops.Const(1000)], [after])
    ws = run_builder(nb)
    assert bool(fetch(ws, g_no_stop.has_stopped())) is False
    assert bool(fetch(ws, g_stop.has_stopped())) is True
    assert bool(fetch(ws, g_plain.has_stopped())) is False
    assert bool(fetch(ws, g_empty.has_stopped())) is False
    assert bool(fetch(ws, g_unconditional.has_stopped())) is True
    assert scalar(ws, after) == 1 + 1000


def test_stop_guard_with_given_blob():
    with NetBuilder('nbt') as nb:
        flag = ops.Const(False)
        with ops.stop_guard(has_stopped_blob=flag) as g:
            ops.stop()
    assert str(g.has_stopped()) == str(flag)
    ws = run_builder(nb)
    assert bool(fetch(ws, flag)) is True


def test_stop_inside_if_ends_only_the_if_block():
    with NetBuilder('nbt') as nb:
        acc = ops.Const(0)
        with ops.loop(5) as loop:
            with ops.If(ops.GE([loop.iter(), ops.Const(2)])):
                ops.Add([acc, ops.Const(10)], [acc])
                ops.stop()
                ops.Add([acc, ops.Const(1000)], [acc])
            ops.Add([acc, ops.Const(1)], [acc])
    ws = run_builder(nb)
    # model: every iteration adds 1; iterations 2, 3, 4 add 10 as well
    assert scalar(ws, acc) == 5 * 1 + 3 * 10


def test_stop_inside_if_selects_value():
    def body(x):
        y = ops.Const(1)
        with ops.If(ops.GT([x, ops.Const(50)])):
            ops.Const(2, blob_out=y)
        with ops.If(ops.LT([x, ops.Const(50)])):
            ops.Const(3, blob_out=y)
            ops.stop()
            ops.Const(4, blob_out=y)
        return y

    with NetBuilder('nbt') as nb:
        high = body(ops.Const(80))
        low = body(ops.Const(20))
        equal = body(ops.Const(50))
    ws = run_builder(nb)
    assert scalar(ws, high) == 2
    assert scalar(ws, low) == 3
    assert scalar(ws, equal) == 1


def test_stop_ends_the_builder_step():
    with NetBuilder('nbt') as nb:
        acc = ops.Const(0)
        ops.Add([acc, ops.Const(1)], [acc])
        ops.stop()
        ops.Add([acc, ops.Const(100)], [acc])
    ws = run_builder(nb)
    assert scalar(ws, acc) == 1


def test_net_added_twice_runs_twice():
    with Task() as task:
        total = ops.Const(0)
        net = core.Net('my_counting_net')
        net.Add([total, net.Const(5)], [total])
        ops.net(net)
        ops.net(net)
        out = final_output(total)
    with LocalSession(workspace.Workspace()) as session:
        session.run(task)
        assert int(out.fetch()) == 10


def test_ops_after_user_net_go_into_it():
    with NetBuilder():
        net = core.Net('user_net')
        ops.net(net)
        ops.Const(1)
        assert ops.net() is net
        assert len(net.Proto().op) == 1
        other = ops.net(name='second')
        assert other is not net
        assert ops.net() is other


# --------------------------------------------------- control operators --

def test_if_net_else_and_local_blobs():
    with NetBuilder('nbt') as nb:
        a = ops.Const(0)
        b = ops.Const(1)
        c = ops.Const(2)
        r0 = ops.Const(0)
        r1 = ops.Const(0)
        with ops.IfNet(ops.Const(True)):
            ops.Const(11, blob_out=r0)
        with ops.Else():
            ops.Const(12, blob_out=r0)
        with ops.IfNet(ops.Const(False)):
            ops.Const(21, blob_out=r1)
        with ops.Else():
            ops.Const(22, blob_out=r1)

        out = ops.Const(0)
        out2 = ops.Const(5)
        with ops.IfNet(ops.LT([a, b])):
            # branch-local blob, never visible outside
            local = ops.Const(40)
            ops.Add([local, c], [out])               # out = 42
            with ops.IfNet(ops.GT([b, c])):
                pass                                 # empty then
            with ops.Else():
                ops.Add([local, b], [local])         # local = 41
                ops.Add([out2, b], [out2])           # out2 = 6
            with ops.IfNet(ops.EQ([local, ops.Const(41)])):
                ops.Mul([out2, c], [out2])           # out2 = 12
        with ops.Else():
            pass                                     # empty else
    ws = run_builder(nb)
    assert scalar(ws, r0) == 11
    assert scalar(ws, r1) == 22
    assert scalar(ws, out) == 42
    assert scalar(ws, out2) == 12
    assert not ws.has_blob(str(local))


def test_while_net_with_condition():
    with NetBuilder('nbt') as nb:
        x = ops.Const(0)
        total = ops.Const(0)
        with ops.WhileNet():
            with ops.Condition():
                ops.Add([x, ops.Const(1)], [x])
                ops.LT([x, ops.Const(6)])
            tmp = ops.Mul([x, x])
            ops.Add([total, tmp], [total])
    ws = run_builder(nb)
    # model: the condition increments x first; the body sees x = 1..5
    assert scalar(ws, x) == 6
    assert scalar(ws, total) == sum(i * i for i in range(1, 6))
    assert not ws.has_blob(str(tmp))


def test_while_net_that_never_runs():
    with NetBuilder('nbt') as nb:
        x = ops.Const(10)
        hits = ops.Const(0)
        with ops.WhileNet():
            with ops.Condition():
                ops.LT([x, ops.Const(3)])
            ops.Add([hits, ops.Const(1)], [hits])
    ws = run_builder(nb)
    assert scalar(ws, hits) == 0


def test_if_net_structure():
    with NetBuilder('nbt') as nb:
        x = ops.Const(1)
        y = ops.Const(2)
        with ops.IfNet(ops.GT([x, y]), name='cmp') as if_block:
            ops.Add([x, y], [y])
        with ops.Else():
            ops.Sub([y, x], [y])
    children = nb.get()
    assert if_block in children
    assert len(if_block.get()) == 1
    if_net = if_block.get()[0]
    assert isinstance(if_net, core.Net)
    op_types = [op.type for op in if_net.Proto().op]
    assert op_types == ['CreateScope', 'CreateScope', 'If']
    if_op = if_net.Proto().op[-1]
    args = arg_map(if_op)
    assert set(args) == {'then_net', 'else_net'}
    then_do = args['then_net'].n.op[0]
    assert then_do.type == 'Do'
    do_args = arg_map(then_do)
    assert {'net', 'inner_blobs', 'outer_blobs_idx'} <= set(do_args)
    # the inner net is the branch body, passed in the `n` field
    assert [op.type for op in do_args['net'].n.op] == ['Add']
    inner = [s.decode() if isinstance(s, bytes) else s
             for s in do_args['inner_blobs'].strings]
    assert sorted(inner) == sorted([str(x), str(y)])
    # each inner name is bound to the outer blob of the same name
    io_names = list(then_do.input) + list(then_do.output)
    for name, idx in zip(inner, do_args['outer_blobs_idx'].ints):
        assert io_names[idx] == name
    # the workspace blob is the last input and the last output
    assert then_do.input[-1] == then_do.output[-1]
    assert if_op.input[-1] == if_op.output[-1]
    assert str(y) in if_net.Proto().external_output


def test_while_net_structure():
    with NetBuilder('nbt') as nb:
        i = ops.Const(0)
        with ops.WhileNet() as w:
            with ops.Condition():
                ops.LT([i, ops.Const(3)])
            ops.Add([i, ops.Const(1)], [i])
    while_net = w.get()[0]
    ops_ = while_net.Proto().op
    assert [op.type for op in ops_][-3:] == ['CreateScope', 'CreateScope', 'While']
    args = arg_map(ops_[-1])
    assert set(args) == {'loop_net', 'cond_net'}
    body_do = args['loop_net'].n.op[0]
    assert body_do.type == 'Do'
    assert arg_map(body_do)['copy_external_blobs'].i == 1
    cond_do = args['cond_net'].n.op[0]
    assert cond_do.type == 'Do'
    assert 'copy_external_blobs' not in arg_map(cond_do)
    # the condition blob is declared out of scope, so it is initialised
    assert ops_[0].type == 'ConstantFill'
    assert w in nb.get()
    assert isinstance(while_net, core.Net)


def test_get_external_blob_names():
    net = core.Net('ext_names')
    net.AddExternalInput('a', 'b')
    net.Add(['a', 'b'], ['c'])
    net.Add(['c', 'a'], ['a'])
    net.Copy(['c'], ['d'])
    inputs, outputs = get_external_blob_names(net, {'a', 'b', 'd', 'zz'})
    assert set(inputs) == {'a', 'b'}
    assert set(outputs) == {'a', 'd'}


def test_get_external_blob_names_undefined_input():
    net = core.Net('ext_undefined')
    net.Copy(['missing'], ['x'])
    with pytest.raises(AssertionError) as e:
        get_external_blob_names(net, set())
    assert str(e.value) == 'Input blob missing is undefined'


def test_add_while_op_requires_condition_write():
    body = core.Net('w_body')
    body.Copy(['a'], ['b'])
    cond_net = core.Net('w_cond')
    cond_net.Copy(['a'], ['other'])
    while_net = core.Net('w_net')
    with pytest.raises(AssertionError) as e:
        add_while_op(while_net, core.BlobReference('cond'), {'a', 'b'},
                     body, cond_net)
    assert str(e.value) == 'Condition net does not write into condition blob'


def test_add_if_op_without_else():
    then_net = core.Net('t_body')
    then_net.Copy(['src'], ['dst'])
    if_net = core.Net('if_only')
    add_if_op(if_net, core.BlobReference('flag'), {'src', 'dst', 'flag'},
              then_net)
    assert [op.type for op in if_net.Proto().op] == ['CreateScope', 'If']
    assert set(a.name for a in if_net.Proto().op[-1].arg) == {'then_net'}
    assert if_net.Proto().op[-1].input[0] == 'flag'


# ------------------------------------------------------- builder basics --

def test_ops_outside_builder():
    assert not hasattr(ops, 'Add')
    with pytest.raises(AttributeError) as e:
        ops.Add
    assert str(e.value) == 'No active NetBuilder.'
    with pytest.raises(AttributeError):
        ops.__foo__


def test_any_net_method_through_proxy():
    with NetBuilder():
        name = ops.NextScopedBlob('thing')
        assert str(name) == 'thing'
        assert hasattr(ops, 'Python')
        assert hasattr(ops, 'LogInfo')
        c = ops.Const(7)
        assert ops.net().BlobIsDefined(c)


def test_builder_names():
    assert str(NetBuilder()) == 'Un-named NetBuilder'
    with NetBuilder('outer') as outer:
        with NetBuilder('inner') as inner:
            pass
        with NetBuilder(_fullname='exact') as exact:
            pass
        with NetBuilder() as anonymous:
            pass
    assert outer.name == 'outer'
    assert inner.name == 'outer/inner'
    assert str(inner) == 'outer/inner'
    assert exact.name == 'exact'
    assert anonymous.name == 'outer'
    with pytest.raises(AssertionError) as e:
        NetBuilder(name='a', _fullname='b')
    assert str(e.value) == 'Cannot set both _fullname and name'
    with pytest.raises(AssertionError) as e:
        NetBuilder(_use_control_ops=True, _stop_blob_required=True)
    assert str(e.value) == 'Stop blobs are not used with control operators'


def test_nets_are_named_after_the_builder():
    with NetBuilder('nb_named'):
        default_net = ops.net()
        named = ops.net(name='body')
    assert default_net.Name().split('_')[0] == 'nb'
    assert default_net.Name().startswith('nb_named')
    assert named.Name().startswith('nb_named/body')


def test_frozen_builder():
    with NetBuilder('frozen_one') as nb:
        ops.Const(1)
    with pytest.raises(AssertionError) as e:
        nb.add(core.Net('late'))
    assert str(e.value) == (
        'This NetBuilder (frozen_one) has been built already.')


def test_loop_requires_stop_condition():
    with NetBuilder():
        with pytest.raises(AssertionError) as e:
            with ops.loop(name='endless'):
                ops.Const(1)
    assert str(e.value) == (
        'This NetBuilder (endless) requires a stop condition '
        'to be set with `stop` or `stop_if`')


def test_loop_iter_without_count():
    with NetBuilder():
        with ops.loop() as loop:
            with pytest.raises(AssertionError) as e:
                loop.iter()
            ops.stop()
    assert str(e.value) == 'This loop does not have a number of iterations.'


def test_has_stopped_before_use():
    with NetBuilder():
        guard = ops.stop_guard()
        with pytest.raises(AssertionError) as e:
            guard.has_stopped()
    assert str(e.value) == 'Context not used yet.'


def test_else_chain_misuse():
    with NetBuilder():
        with ops.If(ops.Const(True)) as b:
            pass
        with b.Else() as e_block:
            pass
        with pytest.raises(AssertionError) as e:
            e_block.Else()
        assert str(e.value) == 'Elif not allowed for an Else.'
        with pytest.raises(AssertionError) as e:
            e_block.Elif(ops.Const(True))
        assert str(e.value) == 'Else not allowed for an Else.'


def test_control_op_misuse():
    with NetBuilder():
        with pytest.raises(AssertionError) as e:
            ops.Else()
        assert str(e.value) == 'Invalid use of Else builder'
        with pytest.raises(AssertionError) as e:
            ops.Condition()
        assert str(e.value) == 'Use of Condition outside of WhileNet'
        with pytest.raises(AssertionError) as e:
            with ops.WhileNet():
                ops.Const(1)
        assert str(e.value) == 'Condition builder must be specified in While op'
    with NetBuilder():
        with ops.IfNet(ops.Const(True)) as block:
            with pytest.raises(AssertionError) as e:
                block.add(core.ExecutionStep('not_a_net'))
            assert str(e.value) == 'Expected Net or NetBuilder with control ops'
        with pytest.raises(AssertionError) as e:
            block.stop_blob()
        assert str(e.value) == 'Stop blobs are not used with control operators'


def test_condition_must_come_first():
    with NetBuilder():
        with pytest.raises(AssertionError) as e:
            with ops.WhileNet():
                ops.Const(1)
                with ops.Condition():
                    ops.Const(True)
        assert str(e.value) == (
            "Condition definition must be specified before the loop's body")


def test_stop_blob_is_initialised_first():
    with NetBuilder('nbt') as nb:
        ops.Const(1)
        first = ops.net()
        second = ops.net(name='second')
        ops.stop_if(ops.Const(False))
        ops.Const(3)
    children = nb.get()
    assert children[0].Name() == 'nbt/stop_blob_init'
    init_ops = children[0].Proto().op
    assert len(init_ops) == 1
    assert init_ops[0].output[0] == str(nb._stop_blob)
    assert children[1] is first
    assert children[2] is second
    # the stop flag is reset in the net that created it, ...
    outputs = [o for op in second.Proto().op for o in op.output]
    assert str(nb._stop_blob) in outputs
    # ... and ops after stop_if go into a new net
    assert len(children) == 4
    step = core.to_execution_step(nb)
    assert step.Proto().should_stop_blob == str(nb._stop_blob)


def test_stop_blob_in_first_net_needs_no_init_net():
    with NetBuilder('nbt') as nb:
        ops.Const(1)
        first = ops.net()
        ops.stop_if(ops.Const(False))
    children = nb.get()
    assert children[0] is first
    assert len(children) == 1


def test_builder_without_stop_blob_runs_once():
    with NetBuilder('nbt') as nb:
        ops.Const(1)
    step = core.to_execution_step(nb)
    assert not step.Proto().should_stop_blob
    assert step.Proto().num_iter == 1


# ------------------------------------------------------- setup blocks --

def test_setup_blocks_attach_to_current_net():
    with NetBuilder():
        net = ops.net()
        with ops.task_init() as t_init:
            ops.Const(1)
        with ops.task_exit() as t_exit:
            ops.Const(2)
        with ops.task_instance_init() as i_init:
            ops.Const(3)
        with ops.task_instance_exit() as i_exit:
            ops.Const(4)
        with ops.local_init() as l_init:
            ops.Const(5)
        with ops.local_exit(name='bye') as l_exit:
            ops.Const(6)
    assert net.get_attributes(Task.TASK_SETUP) == [t_init, t_exit]
    assert net.get_attributes(Task.TASK_INSTANCE_SETUP) == [i_init, i_exit]
    assert net.get_attributes(TaskGroup.LOCAL_SETUP) == [l_init, l_exit]
    assert isinstance(t_init.setup(None), core.ExecutionStep)
    assert t_init.exit(None) is None
    assert t_exit.setup(None) is None
    assert isinstance(t_exit.exit(None), core.ExecutionStep)
    assert 'bye' in str(l_exit)
    # setup ops never go into the body net
    assert len(net.Proto().op) == 0


def test_task_reporter_attaches_report_step():
    with NetBuilder():
        net = ops.net()
        with ops.task_reporter(interval_ms=250, name='rep'):
            ops.Const(1)
    steps = net.get_attributes(Task.REPORT_STEP)
    assert len(steps) == 1
    assert steps[0].Proto().run_every_ms == 250


def test_local_reporter_needs_task_group():
    with NetBuilder():
        with pytest.raises(AssertionError) as e:
            with ops.local_reporter():
                ops.Const(1)
    assert 'is required but none is active.' in str(e.value)


def test_local_reporter_registers_with_group():
    with TaskGroup() as tg:
        with Task():
            with ops.local_reporter(interval_ms=30):
                ops.Const(1)
            ops.Const(2)
    assert len(tg._report_steps) == 1
    node, step = tg._report_steps[0]
    assert node == 'local'
    assert step.Proto().run_every_ms == 30


# ------------------------------------------------------------ task group --

def test_task_group_inside_builder_runs():
    ws = workspace.Workspace()
    with NetBuilder('with_tg') as nb:
        a = ops.Const(0)
        b = ops.Const(0)
        with ops.task_group():
            # the two tasks run concurrently: each writes its own blob
            with Task(workspace_type='global'):
                ops.Add([a, ops.Const(3)], [a])
            with Task(workspace_type='global'):
                ops.Add([b, ops.Const(4)], [b])
        total = ops.Add([a, b])
        ops.Add([total, ops.Const(100)], [total])
    plan = core.Plan('with_task_group')
    plan.AddStep(core.to_execution_step(nb))
    ws.run(plan)
    assert scalar(ws, total) == 107


def test_task_group_inside_builder_private_tasks():
    ws = workspace.Workspace()
    with NetBuilder('with_private_tg') as nb:
        c = ops.CreateCounter([], init_count=0)
        with ops.task_group():
            for _ in range(3):
                with Task():
                    ops.CountUp(c)
                    ops.CreateCounter([], ['private_only'])
        n = ops.RetrieveCount(c)
    plan = core.Plan('with_private_tg')
    plan.AddStep(core.to_execution_step(nb))
    ws.run(plan)
    assert scalar(ws, n) == 3
    assert not ws.has_blob('private_only')


def test_unnamed_builder_runs():
    # Caffe2 code commonly runs unnamed builders, whose first net is
    # named '' (Caffe2 accepts an empty net name).
    core.Net._reset_used_names()
    with NetBuilder() as nb:
        c = ops.CreateCounter([], init_count=0)
        ops.CountUp(c)
        n = ops.RetrieveCount(c)
    ws = run_builder(nb)
    assert scalar(ws, n) == 1


# ----------------------------------------------------- concurrency use --

def test_builders_in_threads_are_independent():
    errors = []

    def worker(k):
        try:
            for _ in range(20):
                with NetBuilder('t%d' % k) as nb:
                    ops.Const(k)
                    assert NetBuilder.current() is nb
                assert NetBuilder.current(required=False) is None
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_python_op_through_proxy_runs_in_loop():
    calls = []
    lock = threading.Lock()

    def record(inputs, outputs):
        with lock:
            calls.append(time.monotonic())

    with NetBuilder('nbt') as nb:
        with ops.loop(3):
            ops.Python(record)([], [])
    run_builder(nb)
    assert len(calls) == 3
