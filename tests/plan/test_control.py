"""Tests of ferrocaffe.control (Caffe2's control-flow step builders).

Each test runs a built step and compares blob values with what the control
construct means, worked out by hand in plain Python."""

import numpy as np
import pytest

from ferrocaffe import control, core, workspace


@pytest.fixture
def ws():
    return workspace.Workspace()


def int_blob(ws, name, value):
    ws.feed_blob(name, np.array(value, dtype=np.int64))


def bool_blob(ws, name, value):
    ws.feed_blob(name, np.array(value, dtype=bool))


def value(ws, name):
    return np.asarray(ws.fetch_blob(name)).reshape(-1)[0].item()


def increment(name='inc', blob='x', by=1):
    """A net adding ``by`` to the int64 scalar ``blob``."""
    net = core.Net(name)
    step = net.ConstantFill([], shape=[], value=by, dtype=core.DataType.INT64)
    net.Add([blob, step], [blob])
    return net


def below(limit, blob='x', name='below'):
    """A condition net: ``blob < limit``."""
    net = core.Net(name)
    bound = net.ConstantFill([], shape=[], value=limit,
                             dtype=core.DataType.INT64)
    net.AddExternalOutput(net.LT([blob, bound]))
    return net


def at_least(limit, blob='x', name='at_least'):
    net = core.Net(name)
    bound = net.ConstantFill([], shape=[], value=limit,
                             dtype=core.DataType.INT64)
    net.AddExternalOutput(net.GE([blob, bound]))
    return net


def run(ws, step):
    ws.run(core.Plan(step) if isinstance(step, core.ExecutionStep) else step)


def python_while(x, limit, pre_check=True):
    """How many times a `x += 1` body runs under while / do-while."""
    runs = 0
    if not pre_check:
        x += 1
        runs += 1
    while x < limit:
        x += 1
        runs += 1
    return x, runs


@pytest.mark.parametrize('times', [0, 1, 4])
def test_for_runs_the_body_n_times(ws, times):
    int_blob(ws, 'x', 0)
    run(ws, control.For('for', increment(), times))
    assert value(ws, 'x') == times


def test_for_over_a_step_body(ws):
    int_blob(ws, 'x', 0)
    body = control.Do('body', increment('a'), increment('b', by=10))
    run(ws, control.For('for_steps', body, 3))
    assert value(ws, 'x') == 3 * 11


@pytest.mark.parametrize('start', [0, 3, 9])
def test_while_checks_first(ws, start):
    int_blob(ws, 'x', start)
    run(ws, control.While('while', below(5), increment()))
    assert value(ws, 'x') == python_while(start, 5)[0]


def test_while_on_a_blob_condition_and_step_body(ws):
    # The body counts down a budget and recomputes the condition blob.
    int_blob(ws, 'x', 0)
    bool_blob(ws, 'go', True)
    body_net = increment()
    limit = body_net.ConstantFill([], shape=[], value=6,
                                  dtype=core.DataType.INT64)
    body_net.LT(['x', limit], ['go'])
    run(ws, control.While('while_blob', 'go', control.Do('b', body_net)))
    assert value(ws, 'x') == 6


def test_while_can_run_twice(ws):
    # The stop blob from the first run must not end the second one early.
    loop = control.While('again', below(3), increment())
    int_blob(ws, 'x', 0)
    run(ws, loop)
    int_blob(ws, 'x', 1)
    run(ws, loop)
    assert value(ws, 'x') == 3


@pytest.mark.parametrize('start', [0, 4, 8])
def test_until_stops_when_true(ws, start):
    int_blob(ws, 'x', start)
    run(ws, control.Until('until', at_least(4), increment()))
    assert value(ws, 'x') == max(start, 4)


@pytest.mark.parametrize('start', [0, 7])
def test_do_while_runs_at_least_once(ws, start):
    int_blob(ws, 'x', start)
    run(ws, control.DoWhile('dowhile', below(5), increment()))
    assert value(ws, 'x') == python_while(start, 5, pre_check=False)[0]


@pytest.mark.parametrize('start', [0, 9])
def test_do_until_runs_at_least_once(ws, start):
    int_blob(ws, 'x', start)
    run(ws, control.DoUntil('dountil', at_least(3), increment()))
    expected = start + 1 if start + 1 >= 3 else 3
    assert value(ws, 'x') == expected


@pytest.mark.parametrize('flag', [True, False])
def test_if_else_on_a_blob(ws, flag):
    int_blob(ws, 'x', 0)
    bool_blob(ws, 'c', flag)
    run(ws, control.If('if', 'c', increment('t', by=1), increment('f', by=100)))
    assert value(ws, 'x') == (1 if flag else 100)


@pytest.mark.parametrize('start', [0, 10])
def test_if_without_else_on_a_net(ws, start):
    int_blob(ws, 'x', start)
    run(ws, control.If('if_net', below(5), increment(by=7)))
    assert value(ws, 'x') == (start + 7 if start < 5 else start)


def test_if_branches_see_the_condition_as_it_was(ws):
    # The true branch clears the condition blob: the false branch must
    # still not run (Caffe2 re-read the blob and ran both).
    int_blob(ws, 'x', 0)
    bool_blob(ws, 'c', True)
    true_net = increment('t', by=1)
    true_net.ConstantFill([], ['c'], shape=[], value=False,
                          dtype=core.DataType.BOOL)
    run(ws, control.If('flip', 'c', true_net, increment('f', by=100)))
    assert value(ws, 'x') == 1


@pytest.mark.parametrize('flag', [True, False])
def test_if_not(ws, flag):
    int_blob(ws, 'x', 0)
    bool_blob(ws, 'c', flag)
    run(ws, control.IfNot('ifnot', 'c', increment('t', by=1),
                          increment('f', by=100)))
    assert value(ws, 'x') == (100 if flag else 1)
    bool_blob(ws, 'c', flag)
    run(ws, control.IfNot('ifnot_only', 'c', increment('t2', by=1000)))
    assert value(ws, 'x') == (100 if flag else 1001)


def test_switch_runs_every_true_branch(ws):
    int_blob(ws, 'x', 0)
    flags = {'a': True, 'b': False, 'c': True}
    for name, flag in flags.items():
        bool_blob(ws, name, flag)
    run(ws, control.Switch('sw', ('a', increment('ia', by=1)),
                           ('b', increment('ib', by=10)),
                           ('c', increment('ic', by=100))))
    assert value(ws, 'x') == 1 + 100
    run(ws, control.SwitchNot('swn', [('a', increment('na', by=1000)),
                                      ('b', increment('nb', by=10000))]))
    assert value(ws, 'x') == 101 + 10000


def test_do_parallel_runs_every_net(ws):
    int_blob(ws, 'x', 0)
    int_blob(ws, 'y', 0)
    run(ws, control.DoParallel('par', increment('px', 'x', by=2),
                               increment('py', 'y', by=3)))
    assert (value(ws, 'x'), value(ws, 'y')) == (2, 3)


def test_do_of_one_step_is_that_step():
    step = core.execution_step('only', [increment()])
    assert control.Do('wrap', step) is step
    with pytest.raises(ValueError):
        control.Do('empty')


@pytest.mark.parametrize('relation, a, b', [
    ('And', True, True), ('And', True, False),
    ('Or', False, False), ('Or', False, True)])
def test_merged_and_combined_conditions(ws, relation, a, b):
    expected = (a and b) if relation == 'And' else (a or b)

    def const(name, flag):
        net = core.Net(name)
        net.AddExternalOutput(net.ConstantFill(
            [], [name + '_v'], shape=[], value=flag, dtype=core.DataType.BOOL))
        return net

    merged = control.MergeConditionNets('m', [const('ca', a), const('cb', b)],
                                        relation)
    run(ws, merged)
    assert value(ws, str(control.GetConditionBlobFromNet(merged))) == expected
    # Reader-style 'done' nets: never run here; their outputs are fed.
    done_a, done_b = core.Net('da'), core.Net('db')
    done_a.AddExternalOutput(done_a.Copy(['src_a'], ['ra']))
    done_b.AddExternalOutput(done_b.Copy(['src_b'], ['rb']))
    bool_blob(ws, 'ra', a)
    bool_blob(ws, 'rb', b)
    combined = control.CombineConditions('cmb', [done_a, done_b], relation)
    run(ws, combined)
    assert value(ws, str(control.GetConditionBlobFromNet(combined))) == expected
    with pytest.raises(ValueError):
        control.CombineConditions('bad', done_a, relation)


def test_bool_and_not_nets(ws):
    run(ws, control.BoolNet(('p', True), ('q', False)))
    assert (value(ws, 'p'), value(ws, 'q')) == (True, False)
    not_net, out = control.NotNet('p')
    run(ws, not_net)
    assert value(ws, str(out)) is False
    with pytest.raises(ValueError):
        control.GetConditionBlobFromNet(core.Net('no_outputs'))


def test_step_names_are_unique():
    first = control.For('loop', increment(), 1)
    second = control.For('loop', increment(), 1)
    assert first.Proto().name != second.Proto().name
