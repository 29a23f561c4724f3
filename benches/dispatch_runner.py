"""The runner bench_dispatch.py and bench_trace.py share: the dispatch
cases (benches/workloads.py), timing one case in a fresh child process,
spawning those children (with another build on PYTHONPATH if asked), and
interleaving every configuration round by round, so a burst of load
elsewhere on the machine lands on all of them.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = "RESULT "

CASES = {
    # name: (workload, size, timed runs, warmup runs, unit)
    "W1": ("chain", 1000, 200, 20, "ns/op"),
    "N100": ("chain", 100, 2000, 200, "ns/op"),
    "W2": ("loop", 100_000, 5, 1, "ns/iter"),
}


def time_case(case, scope=None):
    """Builds ``case``'s workload, checks its answer, runs the warmup and
    times each of the timed runs, all inside the context manager ``scope``
    (if any). Returns ``({"per_unit": median ns per unit, "best": ...},
    what the scope's ``with`` gave)``. Runs in the child."""
    import contextlib

    import numpy as np
    from ferrocaffe import core, workspace
    sys.path.insert(0, HERE)
    import workloads

    kind, n, runs, warmup, _ = CASES[case]
    run, value = getattr(workloads, kind)(np, core, workspace, n)
    got = value(run())
    assert abs(got - n) < 0.5, (case, got)
    with (scope if scope is not None else contextlib.nullcontext()) as inside:
        for _ in range(warmup):
            run()
        gc.collect()
        gc.disable()
        clock = time.perf_counter_ns
        samples = []
        for _ in range(runs):
            t0 = clock()
            run()
            samples.append(clock() - t0)
        gc.enable()
    return {"per_unit": statistics.median(samples) / n, "best": min(samples) / n}, inside


def report(result):
    """Prints a child's result where :func:`spawn` finds it."""
    print(MARK + json.dumps(result), flush=True)


def spawn(script, args, build_path=None, timeout=900):
    """Runs ``script --child ARGS`` in a fresh interpreter (``build_path``
    first on its PYTHONPATH) and returns the dict it reported."""
    env = dict(os.environ)
    if build_path:
        env["PYTHONPATH"] = os.pathsep.join(
            [build_path] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, os.path.abspath(script), "--child"] + list(args)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {out.stderr[-2000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith(MARK)][-1]
    return json.loads(line[len(MARK):])


def interleaved(configs, processes, run_one):
    """Runs ``run_one(config)`` ``processes`` times for each config, one
    round at a time, rotating the order from round to round (no config
    always runs first, or after the same neighbour). Returns ``{config:
    [results]}``."""
    got = {}
    print(f"{len(os.sched_getaffinity(0))} CPUs; {processes} fresh processes per configuration; "
          f"load average at start {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(processes):
        k = r % len(configs)
        for config in configs[k:] + configs[:k]:
            got.setdefault(config, []).append(run_one(config))
        print(f"  round {r + 1}/{processes} done", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}\n")
    return got


def summary(values):
    """Median, min, max, and the largest relative distance from the median."""
    med = statistics.median(values)
    worst = max(abs(v / med - 1) for v in values)
    return med, min(values), max(values), worst
