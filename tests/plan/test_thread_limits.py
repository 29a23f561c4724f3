"""A thread the OS will not start (a process at its thread or memory
limit) is a typed error, FerrocaffeIOError (an OSError) naming what the
thread was for; the threads already started are cancelled and joined, and
the workspace keeps working once threads can be had again.

Each case runs in a child process that caps its address space
(RLIMIT_AS, which also binds root, unlike RLIMIT_NPROC) just above what it
uses, so that a thread stack cannot be mapped. Before these were typed, a
spawn failure panicked inside the scope of running threads that nobody
cancelled: the child hung or aborted."""

import textwrap

import pytest
from _child import Child

BOUND_S = 120.0

PRELUDE = textwrap.dedent(
    """
    import resource
    import numpy as np
    from ferrocaffe import core, workspace
    from ferrocaffe.errors import FerrocaffeIOError

    def used():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024

    def limited(headroom_mib):
        # Address space for a few more heap pages, not for a thread stack
        # once `headroom_mib` is used up (a stack takes at least 2 MiB).
        resource.setrlimit(resource.RLIMIT_AS, (used() + (headroom_mib << 20), resource.RLIM_INFINITY))

    def unlimited():
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    def expect_io_error(run, *words):
        try:
            run()
        except FerrocaffeIOError as e:
            assert isinstance(e, OSError)
            for w in words:
                assert w in str(e), (w, str(e))
            return e
        raise AssertionError("no error")

    def plan_of(*steps):
        p = core.Plan("p")
        for s in steps:
            p.AddStep(s)
        return p

    # Blocking instances: each waits on an empty queue until cancelled, so
    # all of them are alive when the next one is started.
    init = core.Net("init")
    init.CreateBlobsQueue([], ["q"], capacity=1, num_blobs=1)
    body = core.Net("body")
    body.SafeDequeueBlobs(["q"], ["y", "status"])
    workspace.RunNetOnce(init)
    """
)

CASES = {
    "concurrent_instances": """
        par = core.execution_step("par", [core.execution_step("inst", body)],
                                  num_concurrent_instances=400)
        plan = plan_of(par)
        limited(48)
        e = expect_io_error(lambda: workspace.RunPlan(plan), "cannot start a thread", "substep 'inst'")
        unlimited()
        assert e.step == "par", e.step
        # Threads can be had again: the same workspace runs a plan that needs
        # two (one instance enqueues, one dequeues).
        feed = core.Net("feed"); feed.ConstantFill([], ["x"], shape=[], value=1.0)
        feed.EnqueueBlobs(["q", "x"], ["x"])
        take = core.Net("take"); take.DequeueBlobs(["q"], ["got"])
        both = core.execution_step("both", [core.execution_step("f", feed), core.execution_step("t", take)],
                                   concurrent_substeps=True)
        assert workspace.RunPlan(plan_of(both))
        assert workspace.FetchBlob("got").item() == 1.0
    """,
    "concurrent_substeps": """
        subs = [core.execution_step("sub%d" % k, body) for k in range(400)]
        plan = plan_of(core.execution_step("top", subs, concurrent_substeps=True))
        limited(48)
        e = expect_io_error(lambda: workspace.RunPlan(plan), "cannot start a thread", "substep 'sub")
        unlimited()
        assert e.step == "top", e.step
    """,
    "report_steps": """
        tick = core.Net("tick"); tick.Iter([], ["ticks"])
        steps = [core.execution_step("main", body)]
        for k in range(400):
            r = core.execution_step("rep%d" % k, tick)
            r.RunEveryMillis(1000)
            steps.append(r)
        plan = plan_of(core.execution_step("top", steps))
        limited(48)
        e = expect_io_error(lambda: workspace.RunPlan(plan), "cannot start a thread", "report step 'rep")
        unlimited()
        assert e.step == "top", e.step
    """,
    # A plan with a Python op on a thread of its own runs on a runner
    # thread; none is idle in a fresh process.
    "runner_thread": """
        py = core.Net("py"); py.Python(lambda i, o: None)([], [])
        two = core.execution_step("two", [core.execution_step("a", py), core.execution_step("b", py)],
                                  concurrent_substeps=True)
        plan = plan_of(two)
        limited(1)
        expect_io_error(lambda: workspace.RunPlan(plan), "cannot start a thread for a plan run")
        unlimited()
        assert workspace.RunPlan(plan)
    """,
    "background_plan": """
        tick = core.Net("tick"); tick.Iter([], ["ticks"])
        plan = plan_of(core.execution_step("t", tick))
        limited(1)
        expect_io_error(lambda: workspace.RunPlanInBackground(plan), "cannot start a thread for a background plan")
        unlimited()
        assert workspace.RunPlanInBackground(plan).wait()
    """,
    # The kernel pool (large elementwise ops) cannot start: the kernel runs
    # on the calling thread instead, and asking for a size says why not.
    "kernel_pool": """
        from ferrocaffe import _core
        workspace.FeedBlob("a", np.ones(1 << 20, np.float32))
        workspace.FeedBlob("b", np.full(1 << 20, 2.0, np.float32))
        workspace.FeedBlob("c", np.zeros(1 << 20, np.float32))  # written in place
        add = core.Net("add"); add.Add(["a", "b"], ["c"])
        workspace.CreateNet(add)
        limited(1)
        workspace.RunNet("add")
        assert _core.num_threads() == 1
        expect_io_error(lambda: _core.set_num_threads(2), "kernel pool")
        unlimited()
        assert (workspace.FetchBlob("c") == 3.0).all()
    """,
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_thread_that_cannot_start_is_a_typed_error(name):
    source = PRELUDE + textwrap.dedent(CASES[name]) + textwrap.dedent(
        """
        # The workspace still runs a net (on the calling thread).
        n = core.Net("after"); n.ConstantFill([], ["z"], shape=[2], value=3.0)
        workspace.RunNetOnce(n)
        assert workspace.FetchBlob("z").tolist() == [3.0, 3.0]
        print("ok", flush=True)
        """
    )
    child = Child(source)
    try:
        child.wait_for("ok", BOUND_S)
        assert child.finish(BOUND_S) == 0, child.describe()
    finally:
        child.kill()
    assert "panicked" not in "".join(child.stderr), child.describe()
