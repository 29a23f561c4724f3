"""Timelines (ferrocaffe.profile, RunPlan(trace=...)) checked against the
trace-event format: complete events whose intervals nest per lane, with the
names of the ops, nets and steps that ran, one lane per concurrent
instance; and workspace.BenchmarkNet's times."""

import json
import time

import numpy as np
import pytest

import ferrocaffe
from ferrocaffe import core, profiler, workspace
from ferrocaffe.proto import caffe2_pb2


def ns(us_value):
    """Microseconds as written (3 decimals) -> integer nanoseconds."""
    return int(round(float(us_value) * 1000))


def check_format(events):
    """Every event is a complete event or a thread-name record; intervals on
    one lane nest (a span that starts inside another ends inside it).
    Returns {tid: lane name}."""
    names = {}
    spans = {}
    for e in events:
        assert e['ph'] in ('X', 'M'), e
        assert isinstance(e['tid'], int) and e['pid'] == 1
        if e['ph'] == 'M':
            assert e['name'] == 'thread_name'
            names[e['tid']] = e['args']['name']
            continue
        assert e['name'] and e['cat']
        start, dur = ns(e['ts']), ns(e['dur'])
        assert dur >= 0, e
        spans.setdefault(e['tid'], []).append((start, start + dur, e))
    for tid, items in spans.items():
        assert tid in names, 'lane %d has no name' % tid
        # Enclosing spans first: by start, longer first.
        items.sort(key=lambda s: (s[0], -(s[1] - s[0])))
        stack = []
        for start, end, e in items:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack:
                assert end <= stack[-1][1], (
                    'span %r [%d, %d] overlaps %r [%d, %d] on lane %d'
                    % (e['name'], start, end, stack[-1][2]['name'],
                       stack[-1][0], stack[-1][1], tid))
            stack.append((start, end, e))
    return names


def loop_instances_report_plan():
    init = core.Net('tl_init')
    init.ConstantFill([], ['acc'], shape=[1], value=0.0)
    init.ConstantFill([], ['one'], shape=[1], value=1.0)
    tick = core.Net('tl_tick')
    tick.Add(['acc', 'one'], ['acc'])
    work = core.Net('tl_work')
    work.ConstantFill([], ['w'], shape=[4], value=2.0)
    work.Mul(['w', 'w'], ['w2'])
    report = core.Net('tl_report')
    report.Scale(['acc'], ['acc_scaled'], scale=2.0)
    loop = core.execution_step('tl_loop', [tick], num_iter=4)
    # Instances are of substeps (as in Caffe2): each runs in a workspace of
    # its own.
    worker = core.execution_step('tl_worker', [work], create_workspace=True)
    workers = core.execution_step('tl_workers', [worker], num_concurrent_instances=3)
    main = core.execution_step('tl_main', [loop, workers])
    main.SetReportNet(report, 1)
    return core.Plan(core.execution_step('tl_plan', [
        core.execution_step('tl_init_step', [init]), main]))


def test_a_plan_with_a_loop_instances_and_a_report_net(tmp_path, fresh):
    path = tmp_path / 'trace.json'
    with ferrocaffe.profile(str(path)) as trace:
        workspace.RunPlan(loop_instances_report_plan())
    data = json.loads(path.read_text())
    assert data['traceEvents'] == trace.events
    events = trace.events
    lanes = check_format(events)
    spans = [e for e in events if e['ph'] == 'X']

    def named(cat, name=None):
        return [e for e in spans if e['cat'] == cat and (name is None or e['name'] == name)]

    # Steps, each once.
    for step in ('tl_plan', 'tl_init_step', 'tl_main', 'tl_loop'):
        assert len(named('step', step)) == 1, step
    # The loop's iterations 0..3, each running the tick net once.
    iters = named('iteration', 'tl_loop')
    assert sorted(e['args']['iteration'] for e in iters) == [0, 1, 2, 3]
    assert len(named('net', 'tl_tick')) == 4
    # Ops by type, with their net and index.
    adds = named('op', 'Add')
    assert len(adds) == 4 and all(e['args'] == {'net': 'tl_tick', 'index': 0} for e in adds)
    muls = named('op', 'Mul')
    assert len(muls) == 3 and all(e['args']['net'] == 'tl_work' for e in muls)
    # Three instances, one lane each, named after the step and instance.
    inst = named('instance', 'tl_worker')
    assert sorted(e['args']['instance'] for e in inst) == [0, 1, 2]
    assert all(e['args']['of'] == 3 for e in inst)
    inst_lanes = {e['tid'] for e in inst}
    assert len(inst_lanes) == 3
    assert sorted(lanes[t] for t in inst_lanes) == [
        'tl_worker #0', 'tl_worker #1', 'tl_worker #2']
    # Each instance ran its net (and ops) on its own lane.
    for tid in inst_lanes:
        assert [e['name'] for e in spans if e['tid'] == tid and e['cat'] == 'net'] == ['tl_work']
        assert sorted(e['name'] for e in spans if e['tid'] == tid and e['cat'] == 'op') == [
            'ConstantFill', 'Mul']
    # The report net ran at least once (its final run), on a reporter lane.
    reports = named('report', 'report net tl_report')
    assert reports
    assert all('report net' in lanes[e['tid']] for e in reports)
    assert len(named('net', 'tl_report')) == len(reports)
    # The slowest-ops table covers every op that ran.
    rows = profiler.slowest_ops(trace, n=100)
    assert sorted((r['net'], r['type'], r['calls']) for r in rows) == sorted([
        ('tl_init', 'ConstantFill', 1), ('tl_init', 'ConstantFill', 1),
        ('tl_tick', 'Add', 4), ('tl_work', 'ConstantFill', 3), ('tl_work', 'Mul', 3),
        ('tl_report', 'Scale', len(reports))])
    assert abs(sum(r['percent'] for r in rows) - 100.0) < 1e-6
    assert 'Mul' in trace.table()


def test_nothing_is_recorded_outside_a_profile(fresh):
    net = core.Net('tl_quiet')
    net.ConstantFill([], ['q'], shape=[1], value=1.0)
    workspace.RunNetOnce(net)           # before: not recorded
    assert not profiler.is_profiling()
    with ferrocaffe.profile() as trace:
        assert profiler.is_profiling()
    assert not profiler.is_profiling()
    assert [e for e in trace.events if e['ph'] == 'X'] == []


def test_per_call_trace_of_run_net_and_nested_profiles(tmp_path, fresh):
    net = core.Net('tl_percall')
    net.ConstantFill([], ['p'], shape=[2], value=3.0)
    net.Relu(['p'], ['r'])
    workspace.CreateNet(net)
    with ferrocaffe.profile() as outer:
        workspace.RunNet('tl_percall', 2, trace=str(tmp_path / 'inner.json'))
        workspace.RunNet('tl_percall')
    inner = json.loads((tmp_path / 'inner.json').read_text())['traceEvents']
    check_format(inner)
    assert [e['name'] for e in inner if e.get('cat') == 'net'] == ['tl_percall'] * 2
    assert len([e for e in outer.events if e.get('cat') == 'net']) == 3
    assert not profiler.is_profiling()


def test_python_spans_and_a_queue_wait(fresh):
    init = core.Net('tl_qinit')
    q = init.CreateBlobsQueue([], ['tl_queue'], capacity=2, num_blobs=1)
    producer = core.Net('tl_producer')
    producer.Python(lambda inputs, outputs: time.sleep(0.3))([], [])
    producer.ConstantFill([], ['item'], shape=[1], value=5.0)
    producer.EnqueueBlobs([q, 'item'], ['item'])
    consumer = core.Net('tl_consumer')
    consumer.DequeueBlobs([q], ['got'])
    plan = core.Plan(core.execution_step('tl_qplan', [
        core.execution_step('tl_qinit_step', [init]),
        core.execution_step('tl_qpar', [
            core.execution_step('tl_consume', [consumer]),
            core.execution_step('tl_produce', [producer])], concurrent_substeps=True)]))
    with ferrocaffe.profile() as trace:
        with profiler.span('setup', 'python', detail='made in the test'):
            pass
        workspace.RunPlan(plan)
    check_format(trace.events)
    waits = [e for e in trace.events if e.get('cat') == 'queue']
    assert [e['name'] for e in waits] == ['queue wait (empty)']
    assert ns(waits[0]['dur']) > 0
    [setup] = [e for e in trace.events if e.get('name') == 'setup']
    assert setup['cat'] == 'python' and setup['args'] == {'detail': 'made in the test'}
    np.testing.assert_array_equal(workspace.FetchBlob('got'), [5.0])


def test_benchmark_net_times_the_net_and_each_op(fresh, capsys):
    net = core.Net('tl_bench')
    net.ConstantFill([], ['b'], shape=[64, 64], value=1.0)
    net.MatMul(['b', 'b'], ['c'])
    net.Relu(['c'], ['d'])
    workspace.CreateNet(net)
    times = workspace.BenchmarkNet('tl_bench', 2, 5, True)
    assert len(times) == 4 and all(t > 0 for t in times)
    out = capsys.readouterr().out
    assert "net 'tl_bench'" in out and 'MatMul' in out and 'time per op type' in out
    assert workspace.BenchmarkNet('tl_bench', 0, 3, False).__len__() == 1
    np.testing.assert_allclose(workspace.FetchBlob('d'), np.full((64, 64), 64.0))


def test_benchmark_net_errors_are_typed(fresh):
    with pytest.raises(ferrocaffe.errors.NetNotFoundError):
        workspace.BenchmarkNet('tl_missing', 1, 1, False)
    net = core.Net('tl_bench2')
    net.ConstantFill([], ['x'], shape=[1], value=1.0)
    workspace.CreateNet(net)
    with pytest.raises(ferrocaffe.errors.InvalidArgumentError, match='main_runs'):
        workspace.BenchmarkNet('tl_bench2', 1, -1, False)


def test_a_profile_without_ops_records_net_runs_only(fresh):
    net = core.Net('tl_noops')
    net.ConstantFill([], ['n'], shape=[1], value=1.0)
    net.Relu(['n'], ['n2'])
    workspace.CreateNet(net)
    with ferrocaffe.profile(ops=False) as trace:
        workspace.RunNet('tl_noops', 3)
    check_format(trace.events)
    spans = [e for e in trace.events if e['ph'] == 'X']
    assert [e['cat'] for e in spans] == ['net'] * 3
    assert all(e['args']['ops'] == 2 for e in spans)


def loop_trace_summary(events, n):
    """Checks a trace of one run of a loop of `n` iterations over a one-Add
    net; returns the iteration numbers seen."""
    check_format(events)
    spans = [e for e in events if e['ph'] == 'X']
    iters = [e for e in spans if e['cat'] == 'iteration']
    assert all(e['name'] == 'tl_many' for e in iters)
    nets = [e for e in spans if e['cat'] == 'net']
    assert len(nets) == n and all(e['name'] == 'tl_count' for e in nets)
    adds = [e for e in spans if e['cat'] == 'op']
    assert len(adds) == n and all(e['name'] == 'Add' for e in adds)
    assert sorted(e['cat'] for e in spans if e['cat'] not in ('iteration', 'net', 'op')) == [
        'step']
    return sorted(e['args']['iteration'] for e in iters)


def test_two_profiles_in_a_row_each_record_their_own_loop(fresh):
    # 40,000 iterations write more than one buffer chunk (4 MiB); the
    # second profile writes into the chunks the first one left.
    ws_blob = np.zeros([1], dtype=np.float32)
    workspace.FeedBlob('tl_c', ws_blob)
    workspace.FeedBlob('tl_one', np.ones([1], dtype=np.float32))
    net = core.Net('tl_count')
    net.Add(['tl_c', 'tl_one'], ['tl_c'])
    for n in (40_000, 30_000):
        plan = core.Plan(core.execution_step('tl_many', [net], num_iter=n))
        with ferrocaffe.profile() as trace:
            workspace.RunPlan(plan)
        assert loop_trace_summary(trace.events, n) == list(range(n))
    assert workspace.FetchBlob('tl_c')[0] == 70_000


def test_a_loop_over_one_net_writes_each_iteration_its_run_and_ops(fresh):
    # A step whose iteration is one run of one net shares its records
    # between iterations (trace.rs, LoopRecord); the trace still has every
    # iteration, net run and op, nested and back to back.
    workspace.FeedBlob('tl_v', np.zeros([3], dtype=np.float32))
    workspace.FeedBlob('tl_d', np.full([3], 2.0, dtype=np.float32))
    net = core.Net('tl_body')
    net.Add(['tl_v', 'tl_d'], ['tl_v'])
    net.Mul(['tl_v', 'tl_d'], ['tl_w'])
    net.Relu(['tl_w'], ['tl_r'])
    n = 300
    plan = core.Plan(core.execution_step('tl_steps', [net], num_iter=n))
    for ops in (True, False):
        with ferrocaffe.profile(ops=ops) as trace:
            workspace.RunPlan(plan)
        check_format(trace.events)
        spans = [e for e in trace.events if e['ph'] == 'X']
        iters = [e for e in spans if e['cat'] == 'iteration']
        nets = [e for e in spans if e['cat'] == 'net']
        op_spans = [e for e in spans if e['cat'] == 'op']
        assert [e['args']['iteration'] for e in iters] == list(range(n))
        assert all(e['name'] == 'tl_steps' for e in iters)
        assert [(e['name'], e['args']) for e in nets] == [('tl_body', {'ops': 3})] * n
        assert len({e['tid'] for e in spans}) == 1
        if not ops:
            assert op_spans == []
        else:
            assert [(e['name'], e['args']) for e in op_spans] == [
                ('Add', {'net': 'tl_body', 'index': 0}),
                ('Mul', {'net': 'tl_body', 'index': 1}),
                ('Relu', {'net': 'tl_body', 'index': 2})] * n
        for k in range(n):
            it, run = iters[k], nets[k]
            it_start, it_end = ns(it['ts']), ns(it['ts']) + ns(it['dur'])
            run_start, run_end = ns(run['ts']), ns(run['ts']) + ns(run['dur'])
            # Written to the ns: equal clock values give equal times.
            assert it_start <= run_start and abs(it_end - run_end) <= 1
            if k > 0:
                prev = iters[k - 1]
                assert abs(it_start - (ns(prev['ts']) + ns(prev['dur']))) <= 1
            if ops:
                trio = op_spans[3 * k:3 * k + 3]
                assert abs(ns(trio[0]['ts']) - run_start) <= 1
                for a, b in zip(trio, trio[1:]):
                    assert abs(ns(a['ts']) + ns(a['dur']) - ns(b['ts'])) <= 1
                last = trio[2]
                assert abs(ns(last['ts']) + ns(last['dur']) - run_end) <= 1
    # 2 * n additions of 2.0 to zeros, then times 2, then relu.
    np.testing.assert_array_equal(workspace.FetchBlob('tl_r'), np.full([3], 4.0 * 2 * n))


def test_a_loop_over_one_net_left_by_its_stop_blob_or_a_failure(fresh):
    workspace.FeedBlob('tl_acc', np.zeros([1], dtype=np.float32))
    workspace.FeedBlob('tl_one', np.ones([1], dtype=np.float32))
    workspace.FeedBlob('tl_three', np.full([1], 3.0, dtype=np.float32))
    net = core.Net('tl_count3')
    net.Add(['tl_acc', 'tl_one'], ['tl_acc'])
    net.GE(['tl_acc', 'tl_three'], ['tl_stop'])
    step = core.execution_step('tl_until3', [net],
                               should_stop_blob=core.BlobReference('tl_stop'))
    with ferrocaffe.profile() as trace:
        workspace.RunPlan(core.Plan(step))
    check_format(trace.events)
    spans = [e for e in trace.events if e['ph'] == 'X']
    iters = [e for e in spans if e['cat'] == 'iteration']
    nets = [e for e in spans if e['cat'] == 'net']
    assert [e['args']['iteration'] for e in iters] == [0, 1, 2]
    assert [e['args'] for e in nets] == [{'ops': 2}] * 3
    assert [e['name'] for e in spans if e['cat'] == 'op'] == ['Add', 'GE'] * 3
    # The last iteration ends after its run (it read the stop blob).
    assert ns(iters[2]['ts']) + ns(iters[2]['dur']) >= ns(nets[2]['ts']) + ns(nets[2]['dur'])
    assert workspace.FetchBlob('tl_acc')[0] == 3.0

    # A run that fails in its second op ends the loop: its net run is
    # marked failed, counts the ops that ran, and its iteration is written.
    workspace.FeedBlob('tl_two', np.ones([2], dtype=np.float32))
    workspace.FeedBlob('tl_bad', np.ones([3], dtype=np.float32))
    bad = core.Net('tl_fails')
    bad.Add(['tl_acc', 'tl_one'], ['tl_acc'])
    bad.Add(['tl_two', 'tl_bad'], ['tl_sum'])    # [2] + [3]: no broadcast
    bad.Relu(['tl_sum'], ['tl_relu'])
    with ferrocaffe.profile() as trace:
        with pytest.raises(ferrocaffe.errors.FerrocaffeError):
            workspace.RunPlan(core.Plan(core.execution_step('tl_failing', [bad], num_iter=5)))
    check_format(trace.events)
    spans = [e for e in trace.events if e['ph'] == 'X']
    assert [e['args'] for e in spans if e['cat'] == 'iteration'] == [{'iteration': 0}]
    assert [e['args'] for e in spans if e['cat'] == 'net'] == [{'ops': 2, 'failed': True}]
    assert [e['name'] for e in spans if e['cat'] == 'op'] == ['Add', 'Add']
