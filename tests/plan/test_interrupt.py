"""Ctrl-C while a plan runs: the call raises KeyboardInterrupt, the run is
cancelled and joined, and the same workspace keeps working.

Each scenario runs in a child interpreter that prints "started" from inside
the running plan, gets SIGINT, prints "interrupted" from its
`except KeyboardInterrupt`, then runs a small net and a small plan in the same
workspace and prints "usable". The bounds are hang checks, not timings."""

import signal
import textwrap

import pytest
from _child import Child

START_BOUND_S = 120.0
INTERRUPT_BOUND_S = 10.0
FINISH_BOUND_S = 60.0

PRELUDE = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from ferrocaffe import core, workspace

    def watch(blob):
        # Prints "started" from another thread once `blob` (an int64
        # tensor) exists and has moved: the run is under way, and the
        # interrupt lands in its native part, not in a Python op.
        import threading
        ws = workspace.current_workspace()
        def moved():
            if not ws.has_blob(blob):
                return False
            v = ws.fetch_blob(blob)
            return hasattr(v, "reshape") and v.size > 0 and int(v.reshape(-1)[0]) != 0
        def poll():
            while not moved():
                time.sleep(0.01)
            print("started", flush=True)
        threading.Thread(target=poll, daemon=True).start()

    def plan_of(*steps):
        p = core.Plan("p")
        for s in steps:
            p.AddStep(s)
        return p
    """
)

EPILOGUE = textwrap.dedent(
    """
    try:
        RUN()
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    ok = core.Net("ok")
    ok.CreateCounter([], ["ok_counter"], init_count=5)
    ok.CountUp(["ok_counter"], ["ok_prev"])
    workspace.RunNetOnce(ok)
    assert workspace.FetchBlob("ok_prev").item() == 5
    again = core.Net("again")
    again.Iter([], ["again_it"])
    assert workspace.RunPlan(core.execution_step("again", again, num_iter=3)) is True
    assert workspace.FetchBlob("again_it").tolist() == [3]
    CHECK()
    print("usable", flush=True)
    """
)

SCENARIOS = {
    # A Python-free net looping for a huge number of iterations.
    "long_num_iter": """
        spin = core.Net("spin")
        spin.Iter([], ["it"])
        watch("it")
        def RUN():
            workspace.RunPlan(plan_of(core.execution_step("spin", spin, num_iter=10**15)))
        def CHECK():
            assert workspace.FetchBlob("it").item() > 0  # it did run for a while
    """,
    # Concurrent substeps that never finish (their stop blob is never set).
    "blocked_concurrent_substeps": """
        workspace.CreateBlob("never")
        a = core.Net("a"); a.Iter([], ["ia"])
        b = core.Net("b"); b.Iter([], ["ib"])
        forever = lambda name, net: core.execution_step(
            name, net, should_stop_blob=core.BlobReference("never"))
        top = core.execution_step("top", [forever("fa", a), forever("fb", b)], concurrent_substeps=True)
        watch("ib")
        def RUN():
            workspace.RunPlan(plan_of(top))
        def CHECK():
            assert workspace.FetchBlob("ia").item() > 0 and workspace.FetchBlob("ib").item() > 0
    """,
    # Many concurrent instances in child workspaces, each looping.
    "concurrent_instances": """
        workspace.FeedBlob("total", np.array([0], np.int64))
        init = core.Net("init"); init.CreateMutex([], ["mutex"])
        body = core.Net("body"); body.AtomicIter(["mutex", "total"], ["total"])
        inst = core.execution_step("inst", body, num_iter=10**15, create_workspace=True)
        par = core.execution_step("par", [inst], num_concurrent_instances=8)
        watch("total")
        def RUN():
            workspace.RunPlan(plan_of(core.execution_step("init", init), par))
        def CHECK():
            assert workspace.FetchBlob("total").item() > 0
    """,
    # A long body with a report step ticking beside it.
    "with_report_step": """
        init = core.Net("init"); init.CreateCounter([], ["work"])
        body = core.Net("body"); body.CountUp(["work"], ["prev"])
        rep = core.Net("rep"); rep.RetrieveCount(["work"], ["seen"])
        top = core.execution_step("top", [
            core.execution_step("work", body, num_iter=10**15),
            core.execution_step("rep", rep, run_every_ms=5),
        ])
        watch("prev")
        def RUN():
            workspace.RunPlan(plan_of(core.execution_step("init", init), top))
        def CHECK():
            assert workspace.FetchBlob("prev").item() > 0
    """,
    # A loop whose net is a Python op (cancellation between net runs).
    "python_op_loop": """
        calls = []
        def slow(inputs, outputs):
            calls.append(1)
            if len(calls) == 1:
                print("started", flush=True)
            time.sleep(0.001)
        loop = core.Net("loop"); loop.Python(slow)([], [])
        def RUN():
            workspace.RunPlan(plan_of(core.execution_step("loop", loop, num_iter=10**12)))
        def CHECK():
            assert len(calls) > 0
    """,
    # A While op whose condition never turns false, inside a plan.
    "while_op_in_a_plan": """
        workspace.FeedBlob("cond", np.array(True))
        body = core.Net("body"); body.Iter([], ["wit"])
        loop = core.Net("loop")
        loop.While(["cond"], [], loop_net=body.Proto())
        watch("wit")
        def RUN():
            workspace.RunPlan(plan_of(core.execution_step("loop", loop)))
        def CHECK():
            assert workspace.FetchBlob("wit").item() > 0
    """,
    # The same While loop run with RunNetOnce (not a plan).
    "while_op_in_run_net_once": """
        workspace.FeedBlob("cond", np.array(True))
        workspace.FeedBlob("wit", np.array([0], np.int64))
        watch("wit")
        body = core.Net("body"); body.Iter(["wit"], ["wit"])
        loop = core.Net("loop")
        loop.While(["cond"], [], loop_net=body.Proto())
        def RUN():
            workspace.RunNetOnce(loop)
        def CHECK():
            assert workspace.FetchBlob("wit").item() > 0
    """,
    # RunNet with a huge num_iter (not a plan).
    "run_net_num_iter": """
        workspace.FeedBlob("it", np.array([0], np.int64))
        watch("it")
        spin = core.Net("spin")
        spin.Iter(["it"], ["it"])
        workspace.CreateNet(spin)
        def RUN():
            workspace.RunNet("spin", num_iter=10**15)
        def CHECK():
            assert workspace.FetchBlob("it").item() > 0
            workspace.RunNet("spin", 2)
    """,
    # A Python op running a plan of its own (a re-entrant run) on the
    # calling thread: the inner run is stopped with the outer one.
    "nested_run_on_the_calling_thread": """
        workspace.FeedBlob("inner_it", np.array([0], np.int64))
        inner_net = core.Net("inner"); inner_net.Iter(["inner_it"], ["inner_it"])
        inner = plan_of(core.execution_step("inner", inner_net, num_iter=10**15))
        outer = core.Net("outer"); outer.Python(lambda i, o: workspace.RunPlan(inner))([], [])
        watch("inner_it")
        def RUN():
            workspace.RunNetOnce(outer)
        def CHECK():
            a = workspace.FetchBlob("inner_it").item()
            time.sleep(0.2)
            assert a > 0 and workspace.FetchBlob("inner_it").item() == a
    """,
    # The same from a Python op on a thread of the plan (the outer run is on
    # a runner thread): the inner run inherits the outer run's cancellation.
    "nested_run_off_the_calling_thread": """
        workspace.FeedBlob("inner_it", np.array([0], np.int64))
        workspace.CreateBlob("never")
        inner_net = core.Net("inner"); inner_net.Iter(["inner_it"], ["inner_it"])
        inner = plan_of(core.execution_step("inner", inner_net, num_iter=10**15))
        outer = core.Net("outer"); outer.Python(lambda i, o: workspace.RunPlan(inner))([], [])
        spin = core.Net("spin"); spin.Iter([], ["spin_it"])
        top = core.execution_step("top", [
            core.execution_step("o", outer),
            core.execution_step("s", spin, should_stop_blob=core.BlobReference("never")),
        ], concurrent_substeps=True)
        watch("inner_it")
        def RUN():
            workspace.RunPlan(plan_of(top))
        def CHECK():
            a = workspace.FetchBlob("inner_it").item()
            time.sleep(0.2)
            assert a > 0 and workspace.FetchBlob("inner_it").item() == a
    """,
}

# A Python op that blocks: how it blocks on the calling thread, and on a
# thread of the plan (there bounded, or released by the check, so that the
# check can see the run finish once the op returns).
BLOCKERS = {
    "sleep": ("time.sleep(1000)", "time.sleep(5)"),
    "event": ("threading.Event().wait()", "release.wait()"),
    "busy_loop": ("while True: pass", "while True: pass"),
}

BLOCKED_PRELUDE = """
    import threading
    from ferrocaffe.errors import OperatorError
    release = threading.Event()
    calls = []
    def blocked(inputs, outputs):
        calls.append(1)
        if len(calls) == 1:
            print("started", flush=True)
            BLOCK
    workspace.FeedBlob("after", np.array([0], np.int64))
    net = core.Net("blocked")
    net.Python(blocked)([], [])
    net.Iter(["after"], ["after"])
"""

for _kind, (_here, _there) in BLOCKERS.items():
    # RunNetOnce runs the op on the calling thread, where the signal
    # interrupts it as it would plain Python code.
    SCENARIOS[f"python_op_{_kind}_on_the_calling_thread"] = BLOCKED_PRELUDE.replace("BLOCK", _here) + """
    def RUN():
        workspace.RunNetOnce(net)
    def CHECK():
        # The run stopped at the op; the net runs again at once.
        assert workspace.FetchBlob("after").tolist() == [0]
        workspace.RunNetOnce(net)
        assert workspace.FetchBlob("after").tolist() == [1]
    """
    # Concurrent substeps run the op on a thread of the plan: the call
    # returns while the op may still be blocked, and says so until it returns.
    SCENARIOS[f"python_op_{_kind}_off_the_calling_thread"] = BLOCKED_PRELUDE.replace("BLOCK", _there) + """
    workspace.CreateBlob("never")
    spin = core.Net("spin"); spin.Iter([], ["spin_it"])
    top = core.execution_step("top", [
        core.execution_step("b", net),
        core.execution_step("s", spin, should_stop_blob=core.BlobReference("never")),
    ], concurrent_substeps=True)
    def RUN():
        workspace.RunPlan(plan_of(top))
    def CHECK():
        if STILL_BLOCKED:
            # The op is still blocked: running its net says so.
            try:
                workspace.RunNet("blocked")
            except OperatorError as e:
                assert "still held by an interrupted run" in str(e) and e.net == "blocked", e
            else:
                raise AssertionError("the net ran while its op was blocked")
            release.set()
        # Once the op has returned (a busy loop is stopped by the interrupt
        # sent to it), the interrupted run ends there and the net is free.
        deadline = time.monotonic() + 60
        while True:
            try:
                workspace.RunNet("blocked")
                break
            except OperatorError as e:
                assert "still held" in str(e) and time.monotonic() < deadline, e
                time.sleep(0.05)
        assert workspace.FetchBlob("after").tolist() == [1]
    """.replace("STILL_BLOCKED", str(_kind != "busy_loop"))


def child_source(name):
    body = textwrap.dedent(SCENARIOS[name])
    return PRELUDE + body + EPILOGUE


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ctrl_c_interrupts_and_leaves_the_workspace_usable(name):
    child = Child(child_source(name))
    try:
        child.wait_for("started", START_BOUND_S)
        child.proc.send_signal(signal.SIGINT)
        # Control comes back (a hang check: the bar is 1 s, see BENCHMARKS.md).
        child.wait_for("interrupted", INTERRUPT_BOUND_S)
        rc = child.finish(FINISH_BOUND_S)
    finally:
        child.kill()
    assert rc == 0, f"exit {rc}; {child.describe()}"
    assert "finished" not in child.lines
    assert child.lines[-1] == "usable", child.describe()


def test_child_harness_completes_without_a_signal():
    """The harness itself: a short run that nobody interrupts finishes and
    prints 'finished' (so the 'interrupted' above really came from SIGINT)."""
    source = PRELUDE + textwrap.dedent(
        """
        spin = core.Net("spin")
        spin.Iter([], ["it"])
        def RUN():
            workspace.RunPlan(core.execution_step("spin", spin, num_iter=10))
        def CHECK():
            assert workspace.FetchBlob("it").tolist() == [10]
        """
    ) + EPILOGUE
    child = Child(source)
    rc = child.finish(START_BOUND_S)
    assert rc == 0, child.describe()
    assert child.lines == ["finished", "usable"]


def test_a_failing_sibling_stops_a_run_nested_in_a_python_op():
    """A run started by a Python op is cancelled with the op's run, here by a
    failing concurrent substep (no signal): the plan raises that failure
    instead of waiting forever for the nested loop."""
    source = PRELUDE + textwrap.dedent(
        """
        from ferrocaffe.errors import CancelledError
        workspace.FeedBlob("inner_it", np.array([0], np.int64))
        inner_net = core.Net("inner"); inner_net.Iter(["inner_it"], ["inner_it"])
        inner = plan_of(core.execution_step("inner", inner_net, num_iter=10**15))
        seen = []
        def outer_op(inputs, outputs):
            try:
                workspace.RunPlan(inner)
            except CancelledError as e:
                seen.append(e)
                raise
        outer = core.Net("outer"); outer.Python(outer_op)([], [])
        def fail(inputs, outputs):
            while workspace.FetchBlob("inner_it").item() == 0:
                time.sleep(0.01)
            raise ValueError("planned failure")
        failing = core.Net("failing"); failing.Python(fail)([], [])
        top = core.execution_step("top", [core.execution_step("o", outer),
                                          core.execution_step("f", failing)],
                                  concurrent_substeps=True)
        try:
            workspace.RunPlan(plan_of(top))
        except ValueError as e:
            assert "planned failure" in str(e), e
        assert len(seen) == 1, seen
        a = workspace.FetchBlob("inner_it").item()
        time.sleep(0.2)
        assert workspace.FetchBlob("inner_it").item() == a
        print("stopped", flush=True)
        """
    )
    child = Child(source)
    try:
        child.wait_for("stopped", START_BOUND_S)
        assert child.finish(FINISH_BOUND_S) == 0, child.describe()
    finally:
        child.kill()
