"""net_printer: readable text of jobs, groups, tasks, steps and nets, and the
static check of a job's blobs (Caffe2's net_printer.analyze)."""

import pytest

from ferrocaffe import core, net_printer
from ferrocaffe.checkpoint import Job
from ferrocaffe.net_builder import ops
from ferrocaffe.task import Node, Task, TaskGroup, WorkspaceType


def counting_job():
    """An init group that makes a counter, an epoch group that reads it."""
    with Job() as job:
        with job.init_group, Node('trainer'):
            with Task(workspace_type=WorkspaceType.GLOBAL):
                ops.ConstantFill([], ['count'], shape=[], value=0.0)
                ops.ConstantFill([], ['one'], shape=[], value=1.0)
        with Node('trainer'):
            with Task(workspace_type=WorkspaceType.GLOBAL):
                ops.Add(['count', 'one'], ['count'])
    return job


def test_a_job_whose_blobs_are_all_written_first_passes():
    net_printer.analyze(counting_job())


def test_a_blob_read_before_it_is_written_is_named():
    job = counting_job()
    with job, Node('trainer'), Task(workspace_type=WorkspaceType.GLOBAL):
        ops.Add(['count', 'never_written'], ['total'])
    with pytest.raises(AssertionError) as e:
        net_printer.analyze(job)
    assert str(e.value) == 'Blob undefined: never_written'


def test_runtime_set_up_blobs_are_not_reported():
    job = counting_job()
    with job, Node('trainer'), Task(workspace_type=WorkspaceType.GLOBAL):
        ops.Add(['distributed_ctx_init_a', 'count'], ['total'])
    net_printer.analyze(job)


def test_a_task_does_not_see_what_a_concurrent_private_task_writes():
    group = TaskGroup()
    with group, Node('n'):
        with Task(workspace_type=WorkspaceType.PRIVATE):
            ops.ConstantFill([], ['scratch'], shape=[], value=0.0)
        with Task(workspace_type=WorkspaceType.PRIVATE):
            ops.Copy(['scratch'], ['y'])
    with pytest.raises(AssertionError) as e:
        net_printer.analyze(group)
    assert str(e.value) == 'Blob undefined: scratch'


def test_two_concurrent_global_tasks_creating_one_blob_are_refused():
    group = TaskGroup()
    for value in (1.0, 2.0):
        with group, Node('n'), Task(workspace_type=WorkspaceType.GLOBAL):
            ops.ConstantFill([], ['out1'], shape=[], value=value)
    with pytest.raises(AssertionError) as e:
        net_printer.analyze(group)
    assert str(e.value) == 'Blobs created by multiple parallel steps: out1'


def test_two_private_tasks_may_use_the_same_names():
    group = TaskGroup()
    for value in (1.0, 2.0):
        with group, Node('n'), Task(workspace_type=WorkspaceType.PRIVATE):
            ops.ConstantFill([], ['out1'], shape=[], value=value)
    net_printer.analyze(group)


def test_a_net_reading_its_inputs_in_order():
    net = core.Net('fine')
    net.ConstantFill([], ['a'], shape=[2], value=1.0)
    net.Add(['a', 'a'], ['b'])
    net_printer.analyze(net)
    bad = core.Net('bad')
    bad.Add(['a', 'a'], ['b'])
    with pytest.raises(AssertionError, match='^Blob undefined: a$'):
        net_printer.analyze(bad)


def test_to_string_nests_as_the_job_nests_with_the_given_names():
    text = net_printer.to_string(counting_job())
    lines = [line for line in text.splitlines()]
    assert lines[0] == 'with Job():'
    assert '  with init_group:' in lines and '  with epoch_group:' in lines
    assert "    with Node('trainer'):" in lines
    # The epoch's op, as the user wrote it, indented under its net.
    op_line = next(line for line in lines if line.strip().startswith('count = Add('))
    assert op_line.strip() == 'count = Add(count, one)'
    net_line = lines[lines.index(op_line) - 1]
    assert net_line.strip().startswith('net ') and net_line.strip().endswith(':')
    assert len(op_line) - len(op_line.lstrip()) == len(net_line) - len(net_line.lstrip()) + 2
    # Groups with no tasks are left out.
    assert 'download_group' not in text and 'exit_group' not in text


def test_to_string_of_a_step_shows_its_fields_and_nets():
    net = core.Net('body')
    net.ConstantFill([], ['x'], shape=[3], value=2.5)
    step = core.execution_step('loop', net, num_iter=7)
    assert net_printer.to_string(step).splitlines() == [
        "with step('loop', num_iter=7):",
        "  net 'body':",
        "    x = ConstantFill(shape=[3], value=2.5)",
    ]


def test_debug_net_shows_engines_and_control_inputs():
    net = core.Net('dbg')
    net.ConstantFill([], ['x'], shape=[1], value=1.0)
    net.Copy(['x'], ['y'], engine='SIMPLE', control_input=['x'])
    lines = net_printer.debug_net(net).splitlines()
    assert lines[0] == "net 'dbg':"
    assert lines[2] == "  y = Copy(x, engine='SIMPLE', control_input=['x'])"


def test_what_cannot_be_printed_or_analyzed_is_a_type_error():
    with pytest.raises(TypeError):
        net_printer.to_string(42)
    with pytest.raises(TypeError):
        net_printer.analyze(42)
