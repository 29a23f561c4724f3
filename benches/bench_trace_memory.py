"""What a recorded W2 iteration costs in CPU time, on fresh record memory
and on record memory reused from an earlier profile (BENCHMARKS.md,
"Timeline overhead (issue 16)"): in each fresh process, W2's plan
(benches/workloads.py) is run 4 times with no profile (``off``), 4 times
inside one ``ferrocaffe.profile()`` (``fresh``: the records go to memory
the process never touched), then 4 times inside a second one
(``reused``: the first profile's chunks, kept as spares). CPU time is
``ru_utime + ru_stime`` around each run, so load elsewhere on the machine
moves it less than wall time.

    PYTHONPATH=python python benches/bench_trace_memory.py
    PYTHONPATH=python python benches/bench_trace_memory.py --processes 6 --gap 6 --compare /tmp/old

``--gap S`` sleeps S seconds before each process (on a VM whose balloon
reports free memory to the host, freed pages are handed back after about
2 s, and memory touched first after that faults in the host too).
Prints each process's median per phase, then per build the median over
processes and ``fresh`` and ``reused`` against ``off``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
N = 100_000


def child():
    import numpy as np

    import ferrocaffe
    from ferrocaffe import core, workspace
    sys.path.insert(0, HERE)
    import workloads

    run, _ = workloads.loop(np, core, workspace, N)
    run()

    def cpu_ns_per_iter():
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        run()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        return (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * 1e9 / N

    out = {"off": [cpu_ns_per_iter() for _ in range(4)]}
    for phase in ("fresh", "reused"):
        with ferrocaffe.profile():
            out[phase] = [cpu_ns_per_iter() for _ in range(4)]
    print("RESULT " + json.dumps({k: statistics.median(v) for k, v in out.items()}), flush=True)
    os._exit(0)  # the traces' events are not needed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--gap", type=float, default=0.0)
    ap.add_argument("--compare", help="a directory holding another ferrocaffe package")
    args = ap.parse_args()
    if args.child:
        return child()
    builds = [("this", os.environ.get("PYTHONPATH", ""))]
    if args.compare:
        builds.append(("other", os.path.abspath(args.compare)))
    got = {b: [] for b, _ in builds}
    print(f"load average at start {os.getloadavg()[0]:.2f}")
    for _ in range(args.processes):
        for name, path in builds:
            time.sleep(args.gap)
            env = dict(os.environ, PYTHONPATH=path)
            text = subprocess.run([sys.executable, __file__, "--child"], env=env,
                                  capture_output=True, text=True, check=True).stdout
            res = json.loads(text.split("RESULT ", 1)[1])
            got[name].append(res)
            print(f"  {name}: " + ", ".join(f"{k} {v:.0f}" for k, v in res.items()), flush=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    print("| build | off CPU ns/iter | fresh | / off | reused | / off |")
    print("|---|---|---|---|---|---|")
    for name, _ in builds:
        med = {k: statistics.median(r[k] for r in got[name]) for k in ("off", "fresh", "reused")}
        print(f"| {name} | {med['off']:.0f} | {med['fresh']:.0f} | {med['fresh'] / med['off']:.2f} | "
              f"{med['reused']:.0f} | {med['reused'] / med['off']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
