"""How long Ctrl-C takes to return control (issue 17: within 1 s).

    PYTHONPATH=python python benches/bench_interrupt.py [--repeat 3] [--only NAME,...]

Runs every scenario of tests/plan/test_interrupt.py (a long loop, concurrent
steps, report steps, While, a Python op blocked in ``time.sleep``,
``Event().wait()`` or a busy loop on the calling thread and on a plan's
thread, nested runs) in a fresh child process: once the child says the run
is under way, it is sent SIGINT, and the time until its
``except KeyboardInterrupt`` prints is measured (by this process, so it
includes the pipe). Prints the median and the worst per scenario, against
the 1 s bar. The baseline in the same run is the child's own reaction time:
a plain-Python ``time.sleep`` interrupted the same way.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from _child import Child  # noqa: E402
import test_interrupt as scenarios  # noqa: E402

BASELINE = """
import time
try:
    print("started", flush=True)
    time.sleep(1000)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def latency(source):
    child = Child(source)
    try:
        child.wait_for("started", scenarios.START_BOUND_S)
        t = time.perf_counter()
        child.proc.send_signal(signal.SIGINT)
        child.wait_for("interrupted", scenarios.INTERRUPT_BOUND_S)
        return time.perf_counter() - t
    finally:
        child.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated scenario names")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(scenarios.SCENARIOS)
    print(f"load average {os.getloadavg()[0]:.2f}")
    base = [latency(BASELINE) for _ in range(args.repeat)]
    print(f"{'plain Python time.sleep (baseline)':55s} median {statistics.median(base) * 1e3:7.1f} ms  "
          f"worst {max(base) * 1e3:7.1f} ms")
    worst_all = 0.0
    for name in names:
        src = scenarios.child_source(name)
        ts = [latency(src) for _ in range(args.repeat)]
        worst_all = max(worst_all, max(ts))
        print(f"{name:55s} median {statistics.median(ts) * 1e3:7.1f} ms  worst {max(ts) * 1e3:7.1f} ms  "
              f"({statistics.median(ts) / statistics.median(base):.1f}x the baseline)")
    print(f"worst of all: {worst_all * 1e3:.0f} ms (bar: 1000 ms)")


if __name__ == "__main__":
    main()
