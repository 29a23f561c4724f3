"""Ctrl-C while a plan runs: the call raises KeyboardInterrupt, the run is
cancelled and joined, and the same workspace keeps working.

Each scenario runs in a child interpreter that prints "started" from inside
the running plan, gets SIGINT, prints "interrupted" from its
`except KeyboardInterrupt`, then runs a small net and a small plan in the same
workspace and prints "usable". The bounds are hang checks, not timings."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

START_BOUND_S = 120.0
FINISH_BOUND_S = 20.0

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
}


def child_source(name):
    body = textwrap.dedent(SCENARIOS[name])
    return PRELUDE + body + EPILOGUE


def spawn(source):
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if env.get("PYTHONPATH"):
        # Passed through, made absolute so the child's cwd does not matter.
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    return subprocess.Popen(
        [sys.executable, "-c", source],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )


def wait_for_line(proc, wanted, bound):
    """Reads stdout lines until `wanted`; returns the lines read."""
    lines = []
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
        if line.strip() == wanted:
            return lines
    proc.kill()
    out, err = proc.communicate()
    raise AssertionError(f"never printed {wanted!r}; stdout={lines + out.splitlines()!r} stderr={err[-3000:]}")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ctrl_c_interrupts_and_leaves_the_workspace_usable(name):
    proc = spawn(child_source(name))
    try:
        wait_for_line(proc, "started", START_BOUND_S)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=FINISH_BOUND_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"still running {FINISH_BOUND_S}s after SIGINT; stderr={err[-3000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = [line.strip() for line in out.splitlines()]
    assert proc.returncode == 0, f"exit {proc.returncode}; stdout={lines}; stderr={err[-3000:]}"
    assert "finished" not in lines
    assert "interrupted" in lines, f"stdout={lines}; stderr={err[-3000:]}"
    assert lines[-1] == "usable", f"stdout={lines}; stderr={err[-3000:]}"
    assert lines.index("interrupted") < lines.index("usable")


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
    proc = spawn(source)
    out, err = proc.communicate(timeout=START_BOUND_S)
    lines = [line.strip() for line in out.splitlines()]
    assert proc.returncode == 0, err
    assert lines == ["finished", "usable"]
