"""Data-pipeline benchmarks, each printed against a baseline from the same run.

    PYTHONPATH=python python benches/bench_pipeline.py

Q1 queue     one producer and one consumer pass 1M scalar records through a
             BlobsQueue (capacity 1000), target >= 1M records/s; baseline:
             Python's queue.Queue with two threads.
P1 pipe      pipe(reader, processor, num_threads=k) over an in-memory Dataset
             of 1M float32 rows with a trivial processor (Copy) into another
             Dataset, k = 1 and 2; target: k=2 >= 1.7x the rows/s of k=1
             (medians of alternating runs, the one-off Python compile of the
             TaskGroup timed apart). Run at two reader batch sizes: 1, the
             default of Dataset.reader (as in Caffe2), where a run takes about
             a second, and 1000, where a whole run takes about 3 ms: that is
             shorter than the time this VM takes to bring an idle second vCPU
             into play (see `cargo bench --bench vcpu_wakeup`), so its ratio
             measures the VM more than ferrocaffe.
"""

from __future__ import annotations

import itertools
import os
import queue
import statistics
import threading
import time

# numpy is only used here to make and check data, never for BLAS; an idle
# OpenBLAS pool still spins its threads for a while after start-up, taking
# CPU time from the worker threads being measured on a 2-vCPU machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from ferrocaffe import core, workspace
from ferrocaffe.dataset import Dataset
from ferrocaffe.net_builder import ops
from ferrocaffe.pipeline import pipe
from ferrocaffe.schema import Scalar, Struct
from ferrocaffe.session import LocalSession
from ferrocaffe.task import TaskGroup


def q1(n=1_000_000, capacity=1000):
    ws = workspace.Workspace()
    init = core.Net("q1_init")
    init.CreateBlobsQueue([], ["q"], capacity=capacity, num_blobs=1)
    init.ConstantFill([], ["x"], shape=[], value=1.0)
    init.ConstantFill([], ["produced_status"], shape=[], value=False, dtype=core.DataType.BOOL)
    init.ConstantFill([], ["consumed_status"], shape=[], value=False, dtype=core.DataType.BOOL)
    produce = core.Net("q1_produce")
    produce.SafeEnqueueBlobs(["q", "x"], ["x", "produced_status"])
    close = core.Net("q1_close")
    close.CloseBlobsQueue(["q"], [])
    consume = core.Net("q1_consume")
    consume.SafeDequeueBlobs(["q"], ["y", "consumed_status"])
    producer = core.execution_step("producer", [core.execution_step("enqueue", [produce], num_iter=n),
                                                core.execution_step("close", [close])])
    consumer = core.execution_step("consumer", [consume], should_stop_blob=core.BlobReference("consumed_status"))
    plan = core.Plan("q1")
    plan.AddStep(core.execution_step("init", [init]))
    plan.AddStep(core.execution_step("both", [producer, consumer], concurrent_substeps=True))
    t = time.perf_counter()
    ws.run(plan)
    fc = n / (time.perf_counter() - t)

    m = 200_000
    pq: queue.Queue = queue.Queue(capacity)

    def prod():
        for i in range(m):
            pq.put(i)
        pq.put(None)

    def cons():
        while pq.get() is not None:
            pass

    t = time.perf_counter()
    threads = [threading.Thread(target=prod), threading.Thread(target=cons)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    py = m / (time.perf_counter() - t)
    print(f"Q1 queue: {fc / 1e6:.2f} M records/s (target >= 1M/s); Python queue.Queue {py / 1e6:.2f} M records/s; "
          f"ratio {fc / py:.1f}x")


def p1(rows=1_000_000, batch=1000, rounds=15):
    """Each round builds both pipes afresh (new workspace, datasets, Task
    group) and times ``session.run`` of the compiled TaskGroup for k = 1 and
    k = 2, alternating; the figures are medians over the rounds. Compiling
    the TaskGroup (Python, once per TaskGroup) is timed apart."""

    def build(threads):
        ws = workspace.Workspace()
        session = LocalSession(ws)
        src = Dataset(Struct(("v", Scalar(np.float32))), name="src")
        dst = Dataset(Struct(("v", Scalar(np.float32))), name="dst")
        init = core.Net("p1_init")
        src.init_empty(init)
        dst.init_empty(init)
        session.run(init)
        ws.feed_blob(src.get_blobs()[0], np.arange(rows, dtype=np.float32))

        thread_ids = itertools.count()

        def proc(rec):
            # Each thread's loop has its own child workspace, so one name for
            # all threads would be safe; distinct scopes keep this benchmark
            # comparable with builds from before that change.
            with core.NameScope(f"t{next(thread_ids)}"):
                out = ops.Copy(rec.v(), ops.NextScopedBlob("copied"))
            return Struct(("v", Scalar(np.float32, out)))

        with TaskGroup() as tg:
            pipe(src.reader(batch_size=batch), dst.writer(), processor=proc, num_threads=threads)
        return ws, session, tg, dst

    def run(threads):
        ws, session, tg, dst = build(threads)
        t = time.perf_counter()
        session.compile(tg)
        compiled = time.perf_counter() - t
        t = time.perf_counter()
        session.run(tg)
        elapsed = time.perf_counter() - t
        got = ws.fetch_blob(dst.get_blobs()[0])
        assert np.array_equal(np.sort(got), np.arange(rows, dtype=np.float32)), "every row exactly once"
        return elapsed, compiled

    runs = {1: [], 2: []}
    run(1), run(2)  # warm-up
    for _ in range(rounds):
        for k in (1, 2):
            runs[k].append(run(k))
    med = {k: statistics.median(e for e, _ in v) for k, v in runs.items()}
    med_c = {k: statistics.median(e + c for e, c in v) for k, v in runs.items()}
    r1, r2 = rows / med[1], rows / med[2]
    print(f"P1 pipe, batch size {batch}: num_threads=1 {r1 / 1e6:.1f} M rows/s ({med[1] * 1e3:.2f} ms), "
          f"num_threads=2 {r2 / 1e6:.1f} M rows/s ({med[2] * 1e3:.2f} ms); ratio {r2 / r1:.2f} (target >= 1.7); "
          f"medians of {rounds} runs. Including the Python compile of the TaskGroup: "
          f"{med_c[1] * 1e3:.2f} ms and {med_c[2] * 1e3:.2f} ms, ratio {med_c[1] / med_c[2]:.2f}")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-size", type=int, action="append", default=None,
                    help="P1 reader batch size, repeatable (default: 1, then 1000)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="P1 rounds, each running k=1 and k=2 once (default: 7 at batch size < 100, else 15)")
    ap.add_argument("--only", choices=["q1", "p1"], default=None)
    a = ap.parse_args()
    if a.only in (None, "q1"):
        q1()
    if a.only in (None, "p1"):
        for b in a.batch_size or [1, 1000]:
            p1(batch=b, rounds=a.rounds or (7 if b < 100 else 15))
