"""Execution-step semantics through core.execution_step / core.Plan /
workspace.RunPlan, following plan_executor.md §2.

Every expected value is worked out by hand or by a small plain-Python model
of the executor in this file. Report steps are checked on counts and values
only: a body waits (with a generous hang guard) until its reporter has run,
so nothing depends on how fast the machine is."""

import itertools
import threading
import time

import numpy as np
import pytest

from ferrocaffe import core, errors, proto, workspace

_ids = itertools.count()
HANG_GUARD_S = 30.0


def uid(prefix):
    return f"{prefix}_{next(_ids)}"


def plan_of(*steps, name=None):
    p = core.Plan(name or uid("plan"))
    for s in steps:
        p.AddStep(s)
    return p


def step(name, nets_or_steps, **kw):
    return core.execution_step(name, nets_or_steps, **kw)


def net_with(*ops):
    """A net from (type, inputs, outputs, kwargs) tuples."""
    net = core.Net(uid("net"))
    for op_type, ins, outs, kw in ops:
        getattr(net, op_type)(ins, outs, **kw)
    return net


def counters_net(**inits):
    net = core.Net(uid("init"))
    for name, value in inits.items():
        net.CreateCounter([], [name], init_count=value)
    return net


def count(ws, name):
    """The value of counter `name`, read with a RetrieveCount op."""
    tmp = f"__count_of_{name}"
    ws.run(core.CreateOperator("RetrieveCount", [name], [tmp]))
    return int(ws.blobs[tmp].fetch())


def log_net(log, label):
    """A net whose only op appends `label` to `log`."""
    net = core.Net(uid(f"log_{label}"))
    net.Python(lambda inputs, outputs: log.append(label))([], [])
    return net


def run(ws, *steps):
    return ws.run(plan_of(*steps))


# ------------------------------------------------------------- num_iter --


@pytest.mark.parametrize("n", [0, 1, 2, 7, 100, -3])
def test_num_iter(n):
    ws = workspace.Workspace()
    body = net_with(("CountUp", ["c"], ["prev"], {}))
    assert run(ws, step("init", counters_net(c=0)), step("body", body, num_iter=n)) is True
    assert count(ws, "c") == max(n, 0)


def test_num_iter_defaults_to_one_in_a_raw_proto():
    ws = workspace.Workspace()
    init = counters_net(c=0)
    body = net_with(("CountUp", ["c"], ["prev"], {}))
    p = proto.PlanDef(name="raw")
    for n in (init, body):
        p.network.add().CopyFrom(n.Proto())
    s = p.execution_step.add()
    s.name = "init"
    s.network.append(init.Name())
    s = p.execution_step.add()
    s.name = "body"
    s.network.append(body.Name())
    assert not s.HasField("num_iter")
    assert workspace.Workspace.run(ws, p) is True
    assert count(ws, "c") == 1


def test_a_step_with_no_work_still_iterates():
    ws = workspace.Workspace()
    p = proto.PlanDef(name="empty_steps")
    s = p.execution_step.add()
    s.name = "nothing"
    s.num_iter = 1000
    assert ws.run(p) is True


def test_several_nets_in_a_step_run_in_order_each_iteration():
    ws = workspace.Workspace()
    log = []
    a, b, c = log_net(log, "a"), log_net(log, "b"), log_net(log, "c")
    assert run(ws, step("abc", [a, b, c], num_iter=3)) is True
    assert log == ["a", "b", "c"] * 3


def test_a_net_listed_twice_runs_twice():
    ws = workspace.Workspace()
    log = []
    a = log_net(log, "a")
    s = core.ExecutionStep("twice")
    s.AddNet(a)
    s.AddNet(a)
    s.SetIter(2)
    assert run(ws, s) is True
    assert log == ["a"] * 4


# ---------------------------------------------------------- nested steps --


def model_log(spec):
    """Plain-Python model of a sequential step tree: a spec is
    ("net", label) or (num_iter, [child specs])."""
    if spec[0] == "net":
        return [spec[1]]
    n, children = spec
    out = []
    for _ in range(max(n, 0)):
        for child in children:
            out.extend(model_log(child))
    return out


def build(spec, log):
    n, children = spec
    if all(c[0] == "net" for c in children):
        return step(uid("leaf"), [log_net(log, c[1]) for c in children], num_iter=n)
    subs = []
    for c in children:
        if c[0] == "net":
            subs.append(step(uid("wrap"), log_net(log, c[1])))
        else:
            subs.append(build(c, log))
    return step(uid("inner"), subs, num_iter=n)


NESTED_SPECS = [
    (3, [(2, [("net", "a")]), (1, [("net", "b")])]),
    (2, [(3, [(2, [("net", "x")]), ("net", "y")]), (1, [("net", "z")])]),
    (2, [(0, [("net", "never")]), ("net", "w"), (2, [(2, [(2, [("net", "deep")])])])]),
    (1, [(4, [("net", "p"), ("net", "q")])]),
]


@pytest.mark.parametrize("spec", NESTED_SPECS, ids=range(len(NESTED_SPECS)))
def test_nested_steps_follow_the_model(spec):
    ws = workspace.Workspace()
    log = []
    assert run(ws, build(spec, log)) is True
    assert log == model_log(spec)


def test_top_level_steps_run_in_order_and_a_failure_stops_the_rest():
    ws = workspace.Workspace()
    log = []

    def boom(inputs, outputs):
        log.append("boom")
        raise LookupError("stop here")

    bad = core.Net(uid("bad"))
    bad.Python(boom)([], [])
    with pytest.raises(LookupError):
        run(ws, step("a", log_net(log, "a")), step("b", bad), step("c", log_net(log, "c")))
    assert log == ["a", "boom"]


# ------------------------------------------------------ should_stop_blob --


def model_stop_loop(k, nets):
    """Net step over `nets` (each "down" = CountDown c -> stop, "up" =
    CountUp n) with should_stop_blob=stop, counter c starting at k. The stop
    blob is checked after each net, never before the first."""
    c, n = k, 0
    while True:
        for kind in nets:
            if kind == "down":
                prev, c = c, c - 1
                if prev <= 0:
                    return c, n
            else:
                n += 1


def nets_for(kinds):
    out = []
    for kind in kinds:
        if kind == "down":
            out.append(net_with(("CountDown", ["c"], ["stop"], {})))
        else:
            out.append(net_with(("CountUp", ["n"], ["n_prev"], {})))
    return out


@pytest.mark.parametrize("k", [0, 1, 3, 6])
@pytest.mark.parametrize("kinds", [("down", "up"), ("up", "down"), ("up", "down", "up", "up")], ids="-".join)
def test_stop_blob_is_checked_after_each_net(k, kinds):
    ws = workspace.Workspace()
    init = counters_net(c=k, n=0)
    loop = step("loop", nets_for(kinds), should_stop_blob=core.BlobReference("stop"))
    assert run(ws, step("init", init), loop) is True
    c, n = model_stop_loop(k, kinds)
    assert count(ws, "c") == c
    assert count(ws, "n") == n
    assert ws.blobs["stop"].fetch().item() is True


@pytest.mark.parametrize("k", [0, 2, 5])
@pytest.mark.parametrize("kinds", [("down", "up"), ("up", "down")], ids="-".join)
def test_stop_blob_is_checked_after_each_sequential_substep(k, kinds):
    ws = workspace.Workspace()
    init = counters_net(c=k, n=0)
    subs = [step(uid("sub"), net) for net in nets_for(kinds)]
    loop = step("loop", subs, should_stop_blob=core.BlobReference("stop"))
    assert run(ws, step("init", init), loop) is True
    c, n = model_stop_loop(k, kinds)
    assert count(ws, "c") == c
    assert count(ws, "n") == n


def test_parent_stop_blob_is_not_checked_inside_a_child_loop():
    ws = workspace.Workspace()
    init = counters_net(c=1, n=0)
    # The child counts c down three times (1 -> -2) whatever the stop blob says;
    # the parent only looks at it after the child is done, then stops before s2.
    s1 = step("s1", net_with(("CountDown", ["c"], ["stop"], {})), num_iter=3)
    s2 = step("s2", net_with(("CountUp", ["n"], ["n_prev"], {})))
    loop = step("loop", [s1, s2], should_stop_blob=core.BlobReference("stop"))
    assert run(ws, step("init", init), loop) is True
    assert count(ws, "c") == -2
    assert count(ws, "n") == 0


def test_stop_blob_already_true_still_runs_the_first_unit():
    ws = workspace.Workspace()
    ws.feed_blob("stop", np.array(True))
    init = counters_net(n1=0, n2=0)
    first = net_with(("CountUp", ["n1"], ["p1"], {}))
    second = net_with(("CountUp", ["n2"], ["p2"], {}))
    assert run(ws, step("init", init), step("nets", [first, second], should_stop_blob=core.BlobReference("stop"))) is True
    assert (count(ws, "n1"), count(ws, "n2")) == (1, 0)
    subs = step("subs", [step("a", first), step("b", second)], should_stop_blob=core.BlobReference("stop"))
    assert run(ws, subs) is True
    assert (count(ws, "n1"), count(ws, "n2")) == (2, 0)
    # The executor never resets the blob: a re-run stops after one unit again.
    assert run(ws, step("again", [first, second], should_stop_blob=core.BlobReference("stop"))) is True
    assert (count(ws, "n1"), count(ws, "n2")) == (3, 0)


def test_an_uninitialised_stop_blob_means_do_not_stop():
    ws = workspace.Workspace()
    ws.create_blob("stop")  # exists, holds nothing
    init = counters_net(c=2, n=0)
    up = net_with(("CountUp", ["n"], ["n_prev"], {}))
    down = net_with(("CountDown", ["c"], ["stop"], {}))
    # After `up` in the first iteration the stop blob is still empty: go on.
    assert run(ws, step("init", init), step("loop", [up, down], should_stop_blob=core.BlobReference("stop"))) is True
    assert count(ws, "n") == 3
    assert count(ws, "c") == -1


def test_a_one_element_bool_stop_blob_of_any_shape_works():
    ws = workspace.Workspace()
    ws.feed_blob("stop", np.array([[False]]))
    log = []

    def flip(inputs, outputs):
        log.append(len(log))
        if len(log) == 4:
            outputs[0].feed(np.array([[True]]))

    net = core.Net(uid("flip"))
    net.Python(flip)([], ["stop"])
    assert run(ws, step("loop", net, should_stop_blob=core.BlobReference("stop"))) is True
    assert log == [0, 1, 2, 3]


def test_stop_blob_in_the_parent_workspace_is_seen_by_a_child_step():
    ws = workspace.Workspace()
    init = counters_net(c=3, n=0)
    ws.run(init)
    ws.create_blob("stop")
    body = net_with(("CountDown", ["c"], ["stop"], {}), ("CountUp", ["n"], ["local_prev"], {}))
    loop = step("child_loop", body, should_stop_blob=core.BlobReference("stop"), create_workspace=True)
    assert run(ws, loop) is True
    # c: 3 -> -1 over four iterations; n counts the ops after CountDown: the
    # stop check comes after the whole net, so all four iterations count.
    assert count(ws, "c") == -1
    assert count(ws, "n") == 4
    assert not ws.has_blob("local_prev")


# ------------------------------------------------------------- only_once --


def test_only_once_caps_a_stop_loop_at_one_iteration():
    ws = workspace.Workspace()
    init = counters_net(c=10, n=0)
    body = [net_with(("CountDown", ["c"], ["stop"], {})), net_with(("CountUp", ["n"], ["p"], {}))]
    s = step("once", body, should_stop_blob=core.BlobReference("stop"), only_once=True)
    assert run(ws, step("init", init), s) is True
    assert (count(ws, "c"), count(ws, "n")) == (9, 1)


def test_only_once_still_stops_inside_its_iteration():
    ws = workspace.Workspace()
    init = counters_net(c=0, n=0)
    body = [net_with(("CountDown", ["c"], ["stop"], {})), net_with(("CountUp", ["n"], ["p"], {}))]
    s = step("once", body, should_stop_blob=core.BlobReference("stop"), only_once=True)
    assert run(ws, step("init", init), s) is True
    assert (count(ws, "c"), count(ws, "n")) == (-1, 0)


def test_only_once_false_loops_until_the_stop_blob():
    ws = workspace.Workspace()
    init = counters_net(c=4, n=0)
    body = [net_with(("CountDown", ["c"], ["stop"], {})), net_with(("CountUp", ["n"], ["p"], {}))]
    s = step("loop", body, should_stop_blob=core.BlobReference("stop"), only_once=False)
    assert s.Proto().HasField("only_once")
    assert run(ws, step("init", init), s) is True
    assert (count(ws, "c"), count(ws, "n")) == model_stop_loop(4, ("down", "up"))


def test_only_once_with_an_empty_stop_blob_and_substeps():
    ws = workspace.Workspace()
    ws.create_blob("stop")
    log = []
    s = step(
        "once",
        [step("a", log_net(log, "a"), num_iter=2), step("b", log_net(log, "b"))],
        should_stop_blob=core.BlobReference("stop"),
        only_once=True,
    )
    assert run(ws, s) is True
    assert log == ["a", "a", "b"]


# --------------------------------------------------- concurrent_substeps --


def test_concurrent_substeps_really_run_at_the_same_time():
    ws = workspace.Workspace()
    barrier = threading.Barrier(3, timeout=HANG_GUARD_S)
    met = []

    def meet(inputs, outputs):
        barrier.wait()  # raises BrokenBarrierError if the others never come
        met.append(1)

    subs = []
    for i in range(3):
        net = core.Net(uid("meet"))
        net.Python(meet)([], [])
        subs.append(step(uid("party"), net))
    assert run(ws, step("together", subs, concurrent_substeps=True)) is True
    assert len(met) == 3


@pytest.mark.parametrize("outer", [1, 3])
def test_concurrent_substep_totals(outer):
    ws = workspace.Workspace()
    iters = {"a": 5, "b": 7, "c": 9}
    init = counters_net(a=0, b=0, c=0)
    subs = [step(uid(k), net_with(("CountUp", [k], [k + "_p"], {})), num_iter=n) for k, n in iters.items()]
    par = step("par", subs, concurrent_substeps=True, num_iter=outer)
    assert run(ws, step("init", init), par) is True
    for k, n in iters.items():
        assert count(ws, k) == outer * n


@pytest.mark.parametrize("k", [0, 2, 4])
def test_concurrent_stop_blob_is_checked_once_per_iteration(k):
    ws = workspace.Workspace()
    init = counters_net(c=k, n=0)
    down = step("down", net_with(("CountDown", ["c"], ["stop"], {})))
    up = step("up", net_with(("CountUp", ["n"], ["p"], {})))
    par = step("par", [down, up], concurrent_substeps=True, should_stop_blob=core.BlobReference("stop"))
    assert run(ws, step("init", init), par) is True
    # k + 1 iterations (k falses, then true), and `up` ran in every one of
    # them because the check waits for the whole iteration.
    assert count(ws, "c") == -1
    assert count(ws, "n") == k + 1


def test_concurrent_substeps_with_one_substep():
    ws = workspace.Workspace()
    log = []
    par = step("par", [step("only", log_net(log, "x"), num_iter=3)], concurrent_substeps=True, num_iter=2)
    assert run(ws, par) is True
    assert log == ["x"] * 6


# ------------------------------------------------------ create_workspace --


def test_create_workspace_locals_vanish_parent_writes_persist():
    ws = workspace.Workspace()
    ws.feed_blob("shared", np.array([0], np.int64))
    body = net_with(
        ("Iter", ["shared"], ["shared"], {}),
        ("CreateCounter", [], ["local_counter"], {"init_count": 1}),
        ("ConstantFill", [], ["local_fill"], {"shape": [3], "value": 1.0}),
    )
    inner = step("inner", body, num_iter=3, create_workspace=True)
    outer = step("outer", [inner], num_iter=2)
    assert run(ws, outer) is True
    assert ws.blobs["shared"].fetch().tolist() == [6]
    assert not ws.has_blob("local_counter")
    assert not ws.has_blob("local_fill")
    assert body.Name() not in ws.nets  # nets built in the child die with it
    assert sorted(ws.blobs.keys()) == ["shared"]


def test_each_execution_gets_a_fresh_child_workspace():
    ws = workspace.Workspace()
    seen = []
    body = core.Net(uid("fresh"))
    body.Iter([], ["local_it"])
    body.Python(lambda inputs, outputs: seen.append(int(inputs[0].data.reshape(-1)[0])))(["local_it"], [])
    inner = step("inner", body, num_iter=4, create_workspace=True)
    assert run(ws, step("outer", [inner], num_iter=3)) is True
    assert seen == [1, 2, 3, 4] * 3
    assert not ws.has_blob("local_it")


BUILDS = []
CALLS = []


def counted_builder(tag):
    """A Python-op builder: called once per op instance, i.e. once per net
    creation."""
    BUILDS.append(tag)

    def f(inputs, outputs):
        CALLS.append(tag)

    return f


@pytest.mark.parametrize("create_workspace", [True, False])
def test_nets_are_recreated_per_child_workspace(create_workspace):
    BUILDS.clear()
    CALLS.clear()
    ws = workspace.Workspace()
    body = core.Net(uid("built"))
    body.Python((counted_builder, ("t",), {}))([], [])
    inner = step("inner", body, num_iter=4, create_workspace=create_workspace)
    assert run(ws, step("outer", [inner], num_iter=3)) is True
    assert len(CALLS) == 12
    # A child workspace per execution of `inner` (3), else one net for all.
    assert len(BUILDS) == (3 if create_workspace else 1)


def test_a_child_reads_and_writes_parent_blobs():
    ws = workspace.Workspace()
    ws.feed_blob("src", np.array([1.5, 2.5], np.float32))
    ws.feed_blob("dst", np.zeros(1, np.float32))
    body = net_with(("Copy", ["src"], ["dst"], {}), ("Copy", ["src"], ["private"], {}))
    assert run(ws, step("child", body, create_workspace=True)) is True
    assert ws.blobs["dst"].fetch().tolist() == [1.5, 2.5]
    assert not ws.has_blob("private")


def test_global_workspace_id_is_injected_under_node_id():
    ws = workspace.Workspace()
    ws.feed_blob("NODE_ID", np.array(2, np.int32))
    seen = []
    body = core.Net(uid("gwid"))
    body.Python(lambda inputs, outputs: seen.append(int(inputs[0].data)))(["GLOBAL_WORKSPACE_ID"], [])
    inner = step("inner", body, create_workspace=True)
    assert run(ws, step("outer", [inner], num_iter=3)) is True
    assert seen == [(2 << 16) + 0, (2 << 16) + 1, (2 << 16) + 2]
    assert not ws.has_blob("GLOBAL_WORKSPACE_ID")


# ----------------------------------------------- num_concurrent_instances --


def atomic_iter_plan(instances, iters, create_workspace=True):
    init = net_with(
        ("CreateMutex", [], ["mutex"], {}),
        ("ConstantFill", [], ["it"], {"shape": [1], "value": 0, "dtype": core.DataType.INT64}),
    )
    body = net_with(("AtomicIter", ["mutex", "it"], ["it"], {}))
    inst = step("inst", body, num_iter=iters, create_workspace=create_workspace)
    par = step("par", [inst], num_concurrent_instances=instances)
    return plan_of(step("init", init), par)


@pytest.mark.parametrize("instances,iters", [(7, 11), (1, 5), (3, 100), (16, 4), (64, 2), (2, 0)])
def test_concurrent_instances_exact_totals(instances, iters):
    ws = workspace.Workspace()
    assert ws.run(atomic_iter_plan(instances, iters)) is True
    assert ws.blobs["it"].fetch().tolist() == [instances * iters]


def test_zero_instances():
    # Sequential when num_concurrent_instances <= 1 and at most one substep
    # (or no concurrent_substeps): the substep simply runs once.
    ws = workspace.Workspace()
    assert ws.run(atomic_iter_plan(0, 5)) is True
    assert ws.blobs["it"].fetch().tolist() == [5]
    # The concurrent path with zero instances starts zero workers.
    ws = workspace.Workspace()
    init = counters_net(a=0, b=0)
    a = step("a", net_with(("CountUp", ["a"], ["pa"], {})), num_iter=3)
    b = step("b", net_with(("CountUp", ["b"], ["pb"], {})), num_iter=5)
    par = step("par", [a, b], num_concurrent_instances=0, concurrent_substeps=True, num_iter=2)
    assert run(ws, step("init", init), par) is True
    assert (count(ws, "a"), count(ws, "b")) == (0, 0)


@pytest.mark.parametrize("instances,iters", [(7, 11), (5, 20)])
def test_concurrent_instances_sharing_one_net(instances, iters):
    ws = workspace.Workspace()
    assert ws.run(atomic_iter_plan(instances, iters, create_workspace=False)) is True
    assert ws.blobs["it"].fetch().tolist() == [instances * iters]


@pytest.mark.parametrize("instances,outer,concurrent", [(4, 1, False), (3, 2, True), (5, 3, None)])
def test_instances_times_substeps(instances, outer, concurrent):
    ws = workspace.Workspace()
    init = counters_net(a=0, b=0)
    a = step("a", net_with(("CountUp", ["a"], ["pa"], {})), num_iter=3, create_workspace=True)
    b = step("b", net_with(("CountUp", ["b"], ["pb"], {})), num_iter=5)
    par = step("par", [a, b], num_concurrent_instances=instances, num_iter=outer, concurrent_substeps=concurrent)
    assert run(ws, step("init", init), par) is True
    assert count(ws, "a") == outer * instances * 3
    assert count(ws, "b") == outer * instances * 5


def test_concurrent_instances_really_run_at_the_same_time():
    ws = workspace.Workspace()
    barrier = threading.Barrier(4, timeout=HANG_GUARD_S)
    met = []

    def meet(inputs, outputs):
        barrier.wait()
        met.append(threading.get_ident())

    net = core.Net(uid("meet"))
    net.Python(meet)([], [])
    inst = step("inst", net, create_workspace=True)
    assert run(ws, step("par", [inst], num_concurrent_instances=4)) is True
    assert len(met) == 4
    assert len(set(met)) == 4  # four different threads


@pytest.mark.parametrize("create_workspace", [True, False])
def test_python_op_under_64_concurrent_instances(create_workspace):
    ws = workspace.Workspace()
    calls = []
    lock = threading.Lock()

    def tally(inputs, outputs):
        with lock:
            calls.append(threading.get_ident())

    net = core.Net(uid("tally"))
    net.Python(tally)([], [])
    net.CountUp(["c"], ["local_prev"])
    inst = step("inst", net, num_iter=5, create_workspace=create_workspace)
    assert run(ws, step("init", counters_net(c=0)), step("par", [inst], num_concurrent_instances=64)) is True
    assert len(calls) == 64 * 5
    assert count(ws, "c") == 64 * 5


# ------------------------------------------------------------ report steps --


def reporting_plan(parent_kwargs, report_kwargs, want_reports=3, report_kind="step"):
    """A body that loops (CountUp work) until its reporter has run
    `want_reports` times, and a reporter that records what it saw."""
    state = {"reports": [], "body_calls": 0, "gave_up": False}
    start = time.monotonic()

    def check(inputs, outputs):
        state["body_calls"] += 1
        enough = len(state["reports"]) >= want_reports
        if not enough and time.monotonic() - start > HANG_GUARD_S:
            state["gave_up"] = True  # hang guard, asserted below
            enough = True
        outputs[0].feed(np.array(enough))

    def record(inputs, outputs):
        state["reports"].append(int(inputs[0].data))

    body = core.Net(uid("body"))
    body.CountUp(["work"], ["work_prev"])
    body.Python(check)([], ["stop"])
    rep = core.Net(uid("rep"))
    rep.RetrieveCount(["work"], ["seen"])
    rep.Python(record)(["seen"], [])
    init = counters_net(work=0)
    work = step("work", body, should_stop_blob=core.BlobReference("stop"))
    if report_kind == "step":
        top = step("top", [work, step("rep", rep, **report_kwargs)], **parent_kwargs)
    else:
        top = step("top", body, should_stop_blob=core.BlobReference("stop"), report_net=rep, **report_kwargs)
    return plan_of(step("init", init), top), state


@pytest.mark.parametrize("concurrent", [False, True])
def test_report_step_runs_periodically_and_once_at_the_end(concurrent):
    ws = workspace.Workspace()
    plan, state = reporting_plan({"concurrent_substeps": concurrent}, {"run_every_ms": 2})
    assert ws.run(plan) is True
    assert not state["gave_up"], "the report step never ran while the body ran"
    reports = state["reports"]
    final = count(ws, "work")
    assert final == state["body_calls"]
    # At least the periodic runs the body waited for, plus the final run.
    assert len(reports) >= 4
    assert reports == sorted(reports)
    assert all(r <= final for r in reports)
    # The final run saw the body's last write.
    assert reports[-1] == final


def test_report_net_with_interval_runs_periodically_and_once_at_the_end():
    ws = workspace.Workspace()
    plan, state = reporting_plan({}, {"report_interval": 0}, report_kind="net")
    assert ws.run(plan) is True
    assert not state["gave_up"], "the report net never ran while the body ran"
    reports = state["reports"]
    final = count(ws, "work")
    assert final == state["body_calls"]
    assert len(reports) >= 4
    assert reports == sorted(reports)
    assert reports[-1] == final


def final_only_plan(outer, iters, concurrent, report_kind):
    seen = []
    body = net_with(("CountUp", ["work"], ["work_prev"], {}))
    rep = core.Net(uid("rep"))
    rep.RetrieveCount(["work"], ["seen"])
    rep.Python(lambda inputs, outputs: seen.append(int(inputs[0].data)))(["seen"], [])
    if report_kind == "step":
        work = step("work", body, num_iter=iters)
        top = step("top", [work, step("rep", rep, run_every_ms=600_000)], num_iter=outer, concurrent_substeps=concurrent)
    else:
        top = step("top", body, num_iter=outer * iters, report_net=rep, report_interval=3600)
    return plan_of(step("init", counters_net(work=0)), top), seen


@pytest.mark.parametrize("report_kind", ["step", "net"])
@pytest.mark.parametrize("outer,iters,concurrent", [(1, 50, False), (1, 50, True), (3, 20, False), (2, 7, True)])
def test_final_report_sees_the_last_write(report_kind, outer, iters, concurrent):
    ws = workspace.Workspace()
    plan, seen = final_only_plan(outer, iters, concurrent, report_kind)
    for rerun in range(1, 4):
        assert ws.run(plan) is True
        # The interval is far longer than the body: only the final run
        # happens, once per execution of the parent step. (The init step
        # re-creates the counter at 0 on every run.)
        assert seen == [outer * iters] * rerun


def test_two_report_steps_each_run_once_at_the_end():
    ws = workspace.Workspace()
    log = []
    body = step("body", log_net(log, "body"), num_iter=5)
    r1 = step("r1", log_net(log, "r1"), run_every_ms=600_000)
    r2 = step("r2", log_net(log, "r2"), run_every_ms=600_000)
    assert run(ws, step("top", [r1, body, r2])) is True
    assert log[:5] == ["body"] * 5
    assert sorted(log[5:]) == ["r1", "r2"]


def test_report_substeps_are_not_run_as_recurring_substeps():
    ws = workspace.Workspace()
    log = []
    top = step("top", [step("body", log_net(log, "b")), step("rep", log_net(log, "r"), run_every_ms=600_000)], num_iter=4)
    assert run(ws, top) is True
    assert log == ["b"] * 4 + ["r"]


# ---------------------------------------------------- lazy net creation --


def producer_consumer():
    producer = net_with(("ConstantFill", [], ["x"], {"shape": [2], "value": 4.0}))
    consumer = net_with(("Copy", ["x"], ["y"], {}))
    return producer, consumer


def test_a_net_may_read_blobs_of_an_earlier_created_net():
    ws = workspace.Workspace()
    producer, consumer = producer_consumer()
    assert run(ws, step("pc", [producer, consumer])) is True
    assert ws.blobs["y"].fetch().tolist() == [4.0, 4.0]


def test_a_net_cannot_read_blobs_of_a_later_created_net():
    ws = workspace.Workspace()
    producer, consumer = producer_consumer()
    with pytest.raises(errors.BlobNotFoundError) as info:
        run(ws, step("cp", [consumer, producer]))
    assert info.value.blob == "x"
    assert info.value.net == consumer.Name()
    assert info.value.step == "cp"


def test_substeps_are_compiled_depth_first_in_order():
    ws = workspace.Workspace()
    producer, consumer = producer_consumer()
    ok = step("ok", [step("p", [step("pp", producer)]), step("c", consumer)])
    assert run(ws, ok) is True
    ws2 = workspace.Workspace()
    log = []
    bad = step("bad", [step("first", log_net(log, "ran")), step("c", consumer), step("p", producer)])
    with pytest.raises(errors.BlobNotFoundError):
        run(ws2, bad)
    assert log == []  # compilation failed before anything ran


def test_a_report_net_is_compiled_after_the_step_nets():
    ws = workspace.Workspace()
    producer, consumer = producer_consumer()
    s = step("s", producer, report_net=consumer, report_interval=3600)
    assert run(ws, s) is True
    assert ws.blobs["y"].fetch().tolist() == [4.0, 4.0]


def test_top_level_steps_are_compiled_just_before_they_run():
    ws = workspace.Workspace()

    def make_late(inputs, outputs, ws_):
        ws_.feed_blob("late", np.array([3], np.int32))

    maker = core.Net(uid("maker"))
    maker.Python(make_late, pass_workspace=True)([], [])
    reader = net_with(("Copy", ["late"], ["copied"], {}))
    assert run(ws, step("make", maker), step("read", reader)) is True
    assert ws.blobs["copied"].fetch().tolist() == [3]
    # In one step, the reader is built before the maker has run.
    ws2 = workspace.Workspace()
    with pytest.raises(errors.BlobNotFoundError) as info:
        run(ws2, step("both", [maker, reader]))
    assert info.value.blob == "late"


def test_plan_nets_no_step_uses_are_never_created():
    ws = workspace.Workspace()
    unused = net_with(("Copy", ["nowhere"], ["y"], {}))
    used = net_with(("CreateCounter", [], ["c"], {}))
    plan = plan_of(step("s", used))
    plan.AddNets([unused])
    assert ws.run(plan) is True
    assert unused.Name() not in ws.nets
    assert used.Name() in ws.nets


def test_empty_plan_succeeds_and_creates_nothing():
    ws = workspace.Workspace()
    plan = core.Plan(uid("empty"))
    plan.AddNets([net_with(("CreateCounter", [], ["c"], {}))])
    assert ws.run(plan) is True
    assert ws.nets == {}
    assert not ws.has_blob("c")


# --------------------------------------------- net reuse and re-creation --


def test_an_existing_net_is_recreated_once_by_a_plan():
    ws = workspace.Workspace()
    ws.run(counters_net(c1=0, c2=0))
    old = net_with(("CountUp", ["c1"], ["p1"], {}))
    ws.create_net(old)
    new = net_with(("CountUp", ["c2"], ["p2"], {}))
    new.Proto().name = old.Name()
    s = core.ExecutionStep("s")
    s.AddNet(new)
    assert ws.run(plan_of(s)) is True
    assert (count(ws, "c1"), count(ws, "c2")) == (0, 1)
    ws.run_net(old.Name())  # the plan's definition replaced the old net
    assert (count(ws, "c1"), count(ws, "c2")) == (0, 2)


def test_a_plan_reuses_its_nets_across_steps_and_recreates_them_next_run():
    BUILDS.clear()
    CALLS.clear()
    ws = workspace.Workspace()
    body = core.Net(uid("reuse"))
    body.Python((counted_builder, ("r",), {}))([], [])
    plan = plan_of(step("one", body, num_iter=2), step("two", body, num_iter=3))
    assert ws.run(plan) is True
    assert (len(BUILDS), len(CALLS)) == (1, 5)
    assert ws.run(plan) is True  # the net exists now: re-created once
    assert (len(BUILDS), len(CALLS)) == (2, 10)


# ------------------------------------------------------- more combinations --


def test_a_child_step_may_stop_on_its_own_local_blob():
    ws = workspace.Workspace()
    ws.run(counters_net(c=2, n=0))
    body = net_with(("CountDown", ["c"], ["local_stop"], {}), ("CountUp", ["n"], ["p"], {}))
    loop = step("loop", body, should_stop_blob=core.BlobReference("local_stop"), create_workspace=True)
    # The net is built in the child first, creating `local_stop` there; the
    # stop blob is looked up afterwards and found.
    assert run(ws, loop) is True
    assert (count(ws, "c"), count(ws, "n")) == (-1, 3)
    assert not ws.has_blob("local_stop")


def test_create_workspace_steps_compile_when_they_run():
    ws = workspace.Workspace()

    def make_late(inputs, outputs, ws_):
        ws_.feed_blob("late", np.array([5], np.int64))

    maker = core.Net(uid("maker"))
    maker.Python(make_late, pass_workspace=True)([], [])
    ws.feed_blob("out", np.zeros(1, np.int64))
    reader = net_with(("Copy", ["late"], ["out"], {}))
    # Sibling substeps: `reader` is built only when its create_workspace
    # step executes, after `maker` has run and made `late`.
    top = step("top", [step("make", maker), step("read", reader, create_workspace=True)])
    assert run(ws, top) is True
    assert ws.blobs["out"].fetch().tolist() == [5]
    # Compiled eagerly (no create_workspace), the reader fails to build.
    ws2 = workspace.Workspace()
    reader2 = net_with(("Copy", ["late"], ["out"], {}))
    with pytest.raises(errors.BlobNotFoundError):
        run(ws2, step("top", [step("make", maker), step("read", reader2)]))


def test_report_step_with_create_workspace():
    ws = workspace.Workspace()
    seen = []
    rep = core.Net(uid("rep"))
    rep.Iter([], ["rep_local"])  # fresh in each tick's child workspace
    rep.Python(lambda inputs, outputs: seen.append(int(inputs[0].data.reshape(-1)[0])))(["rep_local"], [])
    body = step("body", net_with(("CreateCounter", [], ["c"], {})), num_iter=3)
    top = step("top", [body, step("rep", rep, run_every_ms=600_000, create_workspace=True)])
    for _ in range(3):
        assert run(ws, top) is True
    assert seen == [1, 1, 1]
    assert not ws.has_blob("rep_local")


@pytest.mark.parametrize("branches,instances,iters", [(2, 3, 4), (3, 2, 5), (1, 6, 3)])
def test_concurrent_substeps_of_concurrent_instances(branches, instances, iters):
    ws = workspace.Workspace()
    init = net_with(
        ("CreateMutex", [], ["mutex"], {}),
        ("ConstantFill", [], ["it"], {"shape": [1], "value": 0, "dtype": core.DataType.INT64}),
    )
    body = net_with(("AtomicIter", ["mutex", "it"], ["it"], {}))
    subs = []
    for b in range(branches):
        inst = step(uid("inst"), body, num_iter=iters, create_workspace=True)
        subs.append(step(uid("branch"), [inst], num_concurrent_instances=instances))
    top = step("top", subs, concurrent_substeps=True, num_iter=2)
    assert run(ws, step("init", init), top) is True
    assert ws.blobs["it"].fetch().tolist() == [2 * branches * instances * iters]


def test_soft_failure_stops_the_plan():
    ws = workspace.Workspace()
    log = []
    q = core.Net(uid("q"))
    q.CreateBlobsQueue([], ["queue"], capacity=1, num_blobs=1)
    q.CloseBlobsQueue(["queue"], [])
    q.DequeueBlobs(["queue"], ["x"])  # closed and empty: the op returns false
    q.Python(lambda inputs, outputs: log.append("after dequeue"))([], [])
    later = log_net(log, "later step")
    plan = plan_of(step("fails", q), step("later", later))
    with pytest.raises(errors.PlanFailedError) as info:
        ws.run(plan)
    assert isinstance(info.value, RuntimeError)
    assert log == []  # neither the rest of the net nor later steps ran
    handle = workspace._core.run_plan_in_background(ws._core, plan.Proto().SerializeToString())
    assert handle.wait() is False
    assert handle.is_done() is True
    assert handle.is_succeeded() is False
    assert log == []


def test_run_every_ms_zero_still_makes_a_report_step():
    # Presence matters: run_every_ms = 0 is a report step with a 0 ms period.
    ws = workspace.Workspace()
    plan, state = reporting_plan({}, {"run_every_ms": 2})
    rep = plan.Proto().execution_step[1].substep[1]
    rep.run_every_ms = 0
    assert rep.HasField("run_every_ms")
    assert ws.run(plan) is True
    assert not state["gave_up"], "the report step never ran while the body ran"
    assert len(state["reports"]) >= 4
    assert state["reports"][-1] == count(ws, "work") == state["body_calls"]


def test_criteria_network_is_ignored():
    ws = workspace.Workspace()
    body = net_with(("CountUp", ["c"], ["p"], {}))
    init = counters_net(c=0)
    p = proto.PlanDef(name="criteria")
    for n in (init, body):
        p.network.add().CopyFrom(n.Proto())
    p.execution_step.add(name="init", network=[init.Name()])
    # A criteria net that does not even exist: deprecated and never looked at.
    p.execution_step.add(name="body", network=[body.Name()], num_iter=3, criteria_network="no_such_net")
    assert ws.run(p) is True
    assert count(ws, "c") == 3


def test_run_every_ms_on_a_top_level_step_changes_nothing():
    ws = workspace.Workspace()
    log = []
    s = step("top", log_net(log, "a"), num_iter=3, run_every_ms=5)
    assert run(ws, s) is True
    assert log == ["a"] * 3


def test_a_step_with_only_a_report_substep():
    ws = workspace.Workspace()
    log = []
    rep = step("rep", log_net(log, "r"), run_every_ms=600_000)
    p = proto.PlanDef(name=uid("only_report"))
    p.network.add().CopyFrom(rep.Nets()[0].Proto())
    top = p.execution_step.add(name="top", num_iter=3)
    top.substep.add().CopyFrom(rep.Proto())
    # Three iterations with no recurring work, then the reporter's final run.
    assert ws.run(p) is True
    assert log == ["r"]
