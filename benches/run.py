"""Python-side benchmarks for the foundation targets, each printed as a ratio
against a baseline measured in the same run.

    python benches/run.py            # all
    python benches/run.py B1 B5      # some

B1 dispatch   net of 1000 scalar Add, run 1000 times; baselines: a plain-Python
              interpreter of the same net over numpy, and onnxruntime on a
              1000-node Add chain when onnxruntime is installed.
B2 loop       ExecutionStep with num_iter=1,000,000 over a one-op net; baseline:
              the plain-Python interpreter running a 1-op net in a loop.
B3 instances  compute-bound body, num_concurrent_instances 1 vs 2.
B4 kernels    Add of two 2^24 float32 tensors vs np.add(a, b, out=c).
B5 feed/fetch FeedBlob + FetchBlob of 256 MiB vs np.copyto of the same data.
B6 reports    report step every 10 ms for 2 s: median lateness; baseline: a
              Python thread ticking on the same grid with time.sleep.
S1 session    LocalSession.run of a compiled trivial TaskGroup (target <= 50 us)
              and of a TaskGroup of 16 tasks on 4 nodes; baseline: the same
              plan run directly with workspace.RunPlan.
S2 python op  cost of one Python op call over the Python function itself
              (target <= 2 us); baseline: calling the function from Python.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import numpy as np

from ferrocaffe import core, workspace


def timed(fn, runs, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def touch(nbytes):
    """Touch and free memory so the host has given it back before timing."""
    a = np.ones(nbytes // 8)
    del a


# ------------------------------------------------------ reference interpreter --
# The naive Python runtime the issue measures against (the peers' W1.pyinterp
# design): a list of op dicts, a table of numpy functions, a dict of blobs,
# 0-d numpy arrays as values.

REF_TABLE = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def ref_run(ops, blobs):
    for op in ops:
        fn = REF_TABLE[op["type"]]
        blobs[op["output"][0]] = fn(*[blobs[name] for name in op["input"]])


def ref_net(n):
    return [{"type": "Add", "input": ["x", "one"], "output": ["x"]} for _ in range(n)]


def b1():
    ws = workspace.Workspace()
    ws.feed_blob("x", np.float32(0))
    ws.feed_blob("one", np.float32(1))
    net = core.Net("b1_chain")
    for _ in range(1000):
        net.Add(["x", "one"], ["x"])
    ws.create_net(net)
    name = net.Name()
    t_fc = timed(lambda: ws.run_net(name), 1000, 20)
    assert float(ws.fetch_blob("x")) > 1000
    ops = ref_net(1000)
    blobs = {"x": np.zeros((), np.float32), "one": np.ones((), np.float32)}
    t_py = timed(lambda: ref_run(ops, blobs), 200, 20)
    print(f"B1 dispatch: ferrocaffe {t_fc * 1e6:.1f} ns/op ({t_fc * 1e3:.3f} ms per 1000-op run, Python call included); "
          f"plain-Python interpreter {t_py * 1e6:.1f} ns/op; speedup {t_py / t_fc:.1f}x (target >= 6x)")
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        print("B1 dispatch: onnxruntime not installed; pip install onnx onnxruntime for that baseline")
        return
    nodes, prev = [], "x0"
    for i in range(1000):
        nodes.append(helper.make_node("Add", [prev, "one"], [f"x{i + 1}"]))
        prev = f"x{i + 1}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [])],
                              [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {"x0": np.array(0, np.float32)}
    t_ort = timed(lambda: sess.run([prev], feed), 500, 20)
    print(f"B1 dispatch: onnxruntime {t_ort * 1e6:.1f} ns/node; ferrocaffe speedup {t_ort / t_fc:.2f}x (target >= 2x)")


def b2():
    n = 1_000_000
    ws = workspace.Workspace()
    ws.feed_blob("it", np.zeros(1, np.int64))
    net = core.Net("b2_tick")
    net.Iter(["it"], ["it"])
    plan = core.Plan("b2")
    plan.AddStep(core.execution_step("loop", [net], num_iter=n))
    t = timed(lambda: ws.run(plan), 3, 1)
    m = 100_000
    ops = ref_net(1)
    blobs = {"x": np.zeros((), np.float32), "one": np.ones((), np.float32)}

    def py_loop():
        for _ in range(m):
            ref_run(ops, blobs)

    t_py = timed(py_loop, 3, 1)
    ns, ns_py = t / n * 1e9, t_py / m * 1e9
    print(f"B2 loop: ferrocaffe {ns:.1f} ns/iteration (target <= 150); plain-Python step loop {ns_py:.1f} ns/iteration; "
          f"speedup {ns_py / ns:.1f}x")


def b3_plan(instances):
    init = core.Net("b3_init")
    # 128x128 stays below the kernels' parallel threshold: one core per instance.
    init.ConstantFill([], ["a"], shape=[128, 128], value=1.0001)
    body = core.Net("b3_body")
    body.Mul(["a", "a"], ["b"])
    body.Mul(["b", "a"], ["c"])
    inst = core.execution_step("inst", [core.execution_step("init", [init]),
                                        core.execution_step("loop", [body], num_iter=1600)])
    inst.SetCreateWorkspace(True)
    plan = core.Plan(f"b3_{instances}")
    plan.AddStep(core.execution_step("par", [inst], num_concurrent_instances=instances))
    return plan


def b3():
    ws = workspace.Workspace()
    p1, p2 = b3_plan(1), b3_plan(2)
    t1s, t2s = [], []
    for _ in range(5):
        t1s.append(timed(lambda: ws.run(p1), 1, 0))
        t2s.append(timed(lambda: ws.run(p2), 1, 0))
    t1, t2 = statistics.median(t1s), statistics.median(t2s)
    print(f"B3 instances: 1 instance {t1 * 1e3:.1f} ms, 2 instances {t2 * 1e3:.1f} ms; "
          f"throughput ratio {2 * t1 / t2:.2f} (target >= 1.8)")


def b4(rounds=5):
    n = 1 << 24
    touch(1 << 30)
    a = np.random.rand(n).astype(np.float32)
    b = np.random.rand(n).astype(np.float32)
    c = np.empty_like(a)
    ws = workspace.Workspace()
    ws.feed_blob("a", a)
    ws.feed_blob("b", b)
    ws.feed_blob("c", c)
    net = core.Net("b4_add")
    net.Add(["a", "b"], ["c"])
    ws.create_net(net)
    name = net.Name()
    # Interleaved rounds: on a shared machine the memory bandwidth and the
    # second core come and go, so both sides of a ratio are timed together.
    t_fcs, t_nps = [], []
    for _ in range(rounds):
        t_fcs.append(timed(lambda: ws.run_net(name), 20, 3))
        t_nps.append(timed(lambda: np.add(a, b, out=c), 20, 3))
    assert np.array_equal(ws.fetch_blob("c"), a + b)
    ratios = sorted(tn / tf for tf, tn in zip(t_fcs, t_nps))
    t_fc, t_np = statistics.median(t_fcs), statistics.median(t_nps)
    gbps = lambda t: 3 * 4 * n / t / 1e9
    print(f"B4 kernels: ferrocaffe Add {t_fc * 1e3:.2f} ms ({gbps(t_fc):.1f} GB/s); numpy np.add(out=) "
          f"{t_np * 1e3:.2f} ms ({gbps(t_np):.1f} GB/s); speedup {statistics.median(ratios):.2f}x "
          f"(median of {rounds} interleaved rounds, {ratios[0]:.2f}-{ratios[-1]:.2f}; target >= 1.6x)")


def b5():
    n = (256 << 20) // 4
    touch(1 << 30)
    src = np.random.rand(n).astype(np.float32)
    dst = np.empty_like(src)
    # Two numpy baselines: a copy into an existing array (what FeedBlob over a
    # blob of the same shape does) and a copy into a new array (what FetchBlob
    # must do: the caller gets a fresh array).
    t_copyto = timed(lambda: np.copyto(dst, src), 10, 2)
    touch(1 << 30)
    t_copy = timed(lambda: src.copy(), 10, 2)
    ws = workspace.Workspace()
    ws.feed_blob("big", src)
    touch(1 << 30)
    t_feed = timed(lambda: ws.feed_blob("big", src), 10, 2)
    touch(1 << 30)
    t_fetch = timed(lambda: ws.fetch_blob("big"), 10, 2)
    assert np.array_equal(ws.fetch_blob("big"), src)
    print(f"B5 feed 256 MiB: {t_feed * 1e3:.1f} ms vs np.copyto {t_copyto * 1e3:.1f} ms ({t_feed / t_copyto:.2f}x); "
          f"fetch {t_fetch * 1e3:.1f} ms vs src.copy() {t_copy * 1e3:.1f} ms ({t_fetch / t_copy:.2f}x) "
          f"(target <= 1.5x each way)")


def b6(interval_ms=10, seconds=2.0):
    ticks = []

    def record(inputs, outputs):
        ticks.append(time.perf_counter())

    rep = core.Net("b6_report")
    rep.Python(record)([], [])
    body = core.Net("b6_body")
    body.Iter(["it"], ["it"])
    ws = workspace.Workspace()
    ws.feed_blob("it", np.zeros(1, np.int64))
    # A body that runs for about `seconds`: a Python-free loop of Iter.
    t = time.perf_counter()
    ws.run(_loop_plan(body, 200_000))
    per_iter = (time.perf_counter() - t) / 200_000
    iters = int(seconds / per_iter)
    reporter = core.execution_step("reporter", [rep])
    reporter.RunEveryMillis(interval_ms)
    main = core.execution_step("main", [core.execution_step("work", [body], num_iter=iters), reporter],
                               concurrent_substeps=True)
    plan = core.Plan("b6")
    plan.AddStep(main)
    ws.run(plan)
    late = [(tk - ticks[0]) * 1e3 - k * interval_ms for k, tk in enumerate(ticks[:-1])]

    py_ticks = []

    def py_reporter(stop):
        start = time.perf_counter()
        k = 0
        while not stop.is_set():
            k += 1
            nxt = start + k * interval_ms / 1e3
            time.sleep(max(0.0, nxt - time.perf_counter()))
            py_ticks.append(time.perf_counter())

    stop = threading.Event()
    th = threading.Thread(target=py_reporter, args=(stop,))
    th.start()
    time.sleep(seconds)
    stop.set()
    th.join()
    py_late = [(tk - py_ticks[0]) * 1e3 - k * interval_ms for k, tk in enumerate(py_ticks)]
    med, py_med = statistics.median(late), statistics.median(py_late)
    print(f"B6 reports at {interval_ms} ms over {seconds:.0f} s: {len(ticks)} runs, median lateness {med:.3f} ms "
          f"(target <= 1 ms); Python sleep-loop baseline {py_med:.3f} ms")


def _loop_plan(net, n):
    plan = core.Plan(f"loop_{net.Name()}_{n}")
    plan.AddStep(core.execution_step("loop", [net], num_iter=n))
    return plan


def s1():
    from ferrocaffe import session, task
    from ferrocaffe.net_builder import ops

    ws = workspace.Workspace()
    sess = session.LocalSession(ws)
    with task.TaskGroup() as tg:
        with task.Node("n0"), task.Task():
            ops.ConstantFill([], ["x"], shape=[], value=1.0)
    sess.run(tg)  # compile once
    t_sess = timed(lambda: sess.run(tg), 2000, 50)
    plan = core.Plan("s1")
    net = core.Net("s1_net")
    net.ConstantFill([], ["x"], shape=[], value=1.0)
    plan.AddStep(core.execution_step("s", [net]))
    t_plan = timed(lambda: ws.run(plan), 2000, 50)
    print(f"S1 session: LocalSession.run of a compiled trivial TaskGroup {t_sess * 1e6:.1f} us (target <= 50 us); "
          f"workspace.run of a one-net plan {t_plan * 1e6:.1f} us; ratio {t_sess / t_plan:.2f}")
    with task.TaskGroup() as big:
        for k in range(16):
            with task.Node(f"node{k % 4}"), task.Task():
                ops.ConstantFill([], [f"y{k}"], shape=[4], value=float(k))
    sess.run(big)
    t_big = timed(lambda: sess.run(big), 500, 20)
    print(f"S1 session: TaskGroup of 16 tasks on 4 nodes {t_big * 1e6:.1f} us per run")


def s2(calls=20000):
    count = [0]

    def f(inputs, outputs):
        count[0] += 1

    net = core.Net("s2_python")
    net.Python(f)([], [])
    plan = core.Plan("s2")
    plan.AddStep(core.execution_step("loop", [net], num_iter=calls))
    ws = workspace.Workspace()
    t_op = timed(lambda: ws.run(plan), 5, 1) / calls
    empty = core.Net("s2_empty")
    empty.ConstantFill([], ["z"], shape=[], value=0.0)
    plan0 = core.Plan("s2_0")
    plan0.AddStep(core.execution_step("loop", [empty], num_iter=calls))
    t_empty = timed(lambda: ws.run(plan0), 5, 1) / calls

    def direct():
        for _ in range(calls):
            f([], [])

    t_direct = timed(direct, 5, 1) / calls
    over = (t_op - t_direct) * 1e6
    print(f"S2 python op: {t_op * 1e6:.2f} us per op call, {t_direct * 1e6:.3f} us per direct call "
          f"(a one-op native loop costs {t_empty * 1e6:.3f} us/iteration); overhead {over:.2f} us (target <= 2 us)")


BENCHES = {"B1": b1, "B2": b2, "B3": b3, "B4": b4, "B5": b5, "B6": b6, "S1": s1, "S2": s2}

if __name__ == "__main__":
    chosen = sys.argv[1:] or list(BENCHES)
    for key in chosen:
        BENCHES[key]()
