"""The ferrocaffe tour: one plan with a loop, concurrent instances and a
periodic report step, run on the Rust core and checked against plain Python.

    python examples/plan_demo.py [--workers 4] [--iters 200] [--report-ms 20]

Four workers (concurrent instances, each in its own child workspace) each run
a loop of `iters` iterations. Every iteration squares a local random vector
(real work for the cores), bumps a shared iteration counter with AtomicIter,
and adds 1.5 in place into a shared float accumulator. A report step prints
progress every `report-ms` milliseconds while the workers run, and once more
after they finish.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ferrocaffe import core, workspace


def build_plan(workers: int, iters: int, report_ms: int, vector: int):
    init = core.Net("init")
    init.CreateMutex([], ["mutex"])
    init.ConstantFill([], ["done_iters"], shape=[1], value=0, dtype=core.DataType.INT64)
    init.ConstantFill([], ["acc"], shape=[], value=0.0)
    init.ConstantFill([], ["step_size"], shape=[], value=1.5)

    # Per-instance setup: a random vector local to the instance's workspace.
    instance_init = core.Net("instance_init")
    instance_init.GaussianFill([], ["x"], shape=[vector], mean=0.0, std=1.0)

    body = core.Net("body")
    body.Mul(["x", "x"], ["x_squared"])
    body.Sum(["x_squared"], ["checksum"])
    body.AtomicIter(["mutex", "done_iters"], ["done_iters"])
    body.Add(["acc", "step_size"], ["acc"])

    reports = []

    def report(inputs, outputs):
        reports.append((time.perf_counter(), int(inputs[0].data[0])))
        print(f"  report #{len(reports)}: {int(inputs[0].data[0])} iterations done")

    report_net = core.Net("report")
    report_net.Python(report)(["done_iters"], [])

    loop = core.execution_step("loop", [body], num_iter=iters)
    instance = core.execution_step("instance", [core.execution_step("instance_init", [instance_init]), loop])
    instance.SetCreateWorkspace(True)
    workers_step = core.execution_step("workers", [instance], num_concurrent_instances=workers)
    reporter = core.execution_step("reporter", [report_net])
    reporter.RunEveryMillis(report_ms)
    main = core.execution_step("main", [workers_step, reporter], concurrent_substeps=True)

    plan = core.Plan("demo")
    plan.AddStep(core.execution_step("init", [init]))
    plan.AddStep(main)
    return plan, reports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--report-ms", type=int, default=20)
    parser.add_argument("--vector", type=int, default=1 << 16)
    args = parser.parse_args()

    plan, reports = build_plan(args.workers, args.iters, args.report_ms, args.vector)
    print(f"running plan '{plan.Proto().name}': {args.workers} concurrent instances x "
          f"{args.iters} iterations, report every {args.report_ms} ms")
    start = time.perf_counter()
    workspace.RunPlan(plan)
    elapsed = time.perf_counter() - start

    done = int(workspace.FetchBlob("done_iters")[0])
    acc = float(workspace.FetchBlob("acc"))
    expected_iters = args.workers * args.iters
    expected_acc = 1.5 * expected_iters  # exact in float32 at these sizes
    print(f"finished in {elapsed * 1000:.1f} ms")
    print(f"iterations: {done} (expected {expected_iters})")
    print(f"accumulator: {acc} (expected {expected_acc})")
    print(f"report runs: {len(reports)} (the last saw {reports[-1][1] if reports else 'nothing'})")
    print(f"instance-local blobs left in the workspace: "
          f"{sorted(set(workspace.Blobs()) & {'x', 'x_squared', 'checksum'}) or 'none'}")
    ok = done == expected_iters and acc == expected_acc and reports and reports[-1][1] == expected_iters
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
