"""The dispatch workloads of shared/peerbench, built on ferrocaffe, for the
scripts in this directory (peerbench_ferrocaffe.py, run.py,
bench_dispatch.py).

Each builder returns ``(run, value)``: ``run()`` runs the workload once the
way a user would (feed ``x = 0``, run, fetch ``x``) and ``value(out)`` turns
its result into the float it should equal (``n``).
"""

from __future__ import annotations


def scalar(np, v):
    return np.array(v, np.float32)          # a 0-d float32 tensor


def x_and_one(np, workspace):
    """A workspace holding the scalars x = 0 and one = 1; returns it and the
    zero that resets x before each run."""
    ws = workspace.Workspace()
    zero = scalar(np, 0.0)
    ws.feed_blob("x", zero)
    ws.feed_blob("one", scalar(np, 1.0))
    return ws, zero


def chain(np, core, workspace, n):
    """W1: ``Workspace.run_net`` of a created net of n scalar Adds, x = x + one."""
    ws, zero = x_and_one(np, workspace)
    net = core.Net(f"w1_chain_{n}")
    for _ in range(n):
        net.Add(["x", "one"], ["x"])
    ws.create_net(net)
    name = net.Name()

    def run():
        ws.feed_blob("x", zero)
        ws.run_net(name)
        return ws.fetch_blob("x")
    return run, float


def loop(np, core, workspace, n):
    """W2: a plan with one ExecutionStep, num_iter = n, over a 1-op net."""
    ws, zero = x_and_one(np, workspace)
    net = core.Net("w2_tick")
    net.Add(["x", "one"], ["x"])
    plan = core.Plan(f"w2_{n}")
    plan.AddStep(core.execution_step("loop", [net], num_iter=n))

    def run():
        ws.feed_blob("x", zero)
        ws.run(plan)
        return ws.fetch_blob("x")
    return run, float
