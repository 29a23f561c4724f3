"""RaySession benchmarks (issue: past one machine).

D1  Overhead of ``RaySession.run`` for a compiled trivial TaskGroup on 2
    nodes, against the baseline of one synchronous Ray actor call measured
    in the same run (target: <= 3 ms).
D2  A pipeline job on 1, 2 and 4 nodes of a 2-CPU Ray cluster, each node
    reading its own shard of .npy files with NpyReader and running a
    processor over every batch through pipe(); throughput (rows/s) against
    the single node's (target: 4 nodes >= 1.7x one node). Every node asks
    for 0.5 CPU, so its kernel pool has one thread, whatever the number of
    nodes. Batches are large (40,000 rows): with tiny ops the four node
    processes sharing two CPUs lose their caches at every switch (see
    BENCHMARKS.md).

Run:  python benches/bench_ray.py            (both)
      python benches/bench_ray.py D1         (one)
Starts its own Ray cluster (``ray.init(num_cpus=2)``) on a loopback
address and shuts it down at the end.
"""

import os
import statistics
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
import ray  # noqa: E402

from ferrocaffe.distributed import RaySession  # noqa: E402
from ferrocaffe.file_reader import NpyReader  # noqa: E402
from ferrocaffe.net_builder import ops  # noqa: E402
from ferrocaffe.pipeline import pipe  # noqa: E402
from ferrocaffe.task import (  # noqa: E402
    Cluster, Node, Task, TaskGroup, WorkspaceType)

ROWS_PER_SHARD = 4_000_000
FEATURES = 4
BATCH = 40000  # divides ROWS_PER_SHARD: every batch is full
PASSES = 60  # processor rounds per batch: enough work to be CPU-bound


def d1_overhead(runs=300):
    @ray.remote(num_cpus=0)
    class Ping(object):
        def ping(self):
            return 0

    actor = Ping.remote()
    ray.get(actor.ping.remote())
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        ray.get(actor.ping.remote())
        samples.append(time.perf_counter() - t0)
    ray.kill(actor)
    base = statistics.median(samples)

    with Cluster():
        with TaskGroup() as tg:
            for node in ('node_a', 'node_b'):
                with Node(node, num_cpus=0.5), Task():
                    ops.Const(1)
    session = RaySession()
    compiled = RaySession.compile(tg)
    for _ in range(10):
        session.run(compiled)
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(compiled)
        samples.append(time.perf_counter() - t0)
    session.close()
    run = statistics.median(samples)
    print('D1 run of a compiled trivial TaskGroup on 2 nodes: %.3f ms '
          '(median of %d; best %.3f ms)' % (run * 1e3, runs, min(samples) * 1e3))
    print('D1 baseline: one synchronous Ray actor call: %.3f ms' % (base * 1e3))
    print('D1 ratio run / actor call: %.2fx; target run <= 3 ms: %s'
          % (run / base, 'met' if run <= 3e-3 else 'NOT met'))


def make_shards(root, n):
    rng = np.random.default_rng(7)
    shards = []
    for i in range(n):
        d = os.path.join(root, 'shard%d' % i)
        os.makedirs(d, exist_ok=True)
        cols = []
        for f in range(FEATURES):
            path = os.path.join(d, 'x%d.npy' % f)
            if not os.path.exists(path):
                np.save(path, rng.random(ROWS_PER_SHARD, dtype=np.float32))
            cols.append(('x%d' % f, path))
        shards.append(cols)
    return shards


def pipeline_groups(shards, k):
    """(init group, work group) for k nodes."""
    with Cluster():
        with TaskGroup(WorkspaceType.GLOBAL) as init:
            readers = []
            for i in range(k):
                with Node('worker_%d' % i, num_cpus=0.5), Task():
                    reader = NpyReader(shards[i], batch_size=BATCH,
                                       name='reader_%d' % i)
                    reader.setup_ex(ops, None)
                    ops.Const(np.zeros(BATCH, np.float32), 'acc')
                    readers.append(reader)
        with TaskGroup(WorkspaceType.GLOBAL) as work:
            for i in range(k):
                with Node('worker_%d' % i, num_cpus=0.5), Task():
                    def process(rec):
                        for f in range(FEATURES):
                            x = rec['x%d' % f]()
                            y = x
                            for _ in range(PASSES):
                                y = ops.Add([ops.Mul([y, x]), x])
                            ops.Add(['acc', y], ['acc'])
                    pipe(readers[i], processor=process, num_threads=1)
    return init, work


def expected_acc(shard):
    """What a node's 'acc' holds after the job, computed with numpy."""
    acc = np.zeros(BATCH, np.float32)
    for _, path in shard:
        x = np.load(path).reshape(-1, BATCH)
        y = x
        for _ in range(PASSES):
            y = y * x + x
        acc += y.sum(axis=0, dtype=np.float32)
    return acc


def d2_scaling(trials=5):
    root = os.path.join(tempfile.gettempdir(), 'ferrocaffe-bench-ray')
    shards = make_shards(root, 4)
    expected = expected_acc(shards[0])
    times = {1: [], 2: [], 4: []}
    # One session for every size, its four nodes started before timing:
    # starting actors (and Ray prestarting worker processes after actors
    # die) would otherwise burn CPU inside the timed runs. Trials of 1, 2
    # and 4 nodes are interleaved, so that a slow spell of this shared
    # machine does not fall on one size only.
    session = RaySession()
    session.run(pipeline_groups(shards, 4)[0])
    time.sleep(2.0)  # let Ray's worker pool settle
    for _ in range(trials):
        for k in (1, 2, 4):
            init, work = pipeline_groups(shards, k)
            session.run(init)  # new readers at the start of each shard
            t0 = time.perf_counter()
            session.run(work)
            times[k].append(time.perf_counter() - t0)
            got = session.fetch_blob('worker_0', 'acc')
            np.testing.assert_allclose(got, expected, rtol=1e-3)
    session.close()
    rate = {}
    for k in (1, 2, 4):
        med = statistics.median(times[k])
        rate[k] = k * ROWS_PER_SHARD / med
        print('D2 %d node(s): %.2f s for %d rows (median of %d; all %s) = '
              '%.2f M rows/s' % (k, med, k * ROWS_PER_SHARD, trials,
                                 ', '.join('%.2f' % t for t in times[k]),
                                 rate[k] / 1e6))
    for k in (2, 4):
        print('D2 scaling %d nodes / 1 node: %.2fx' % (k, rate[k] / rate[1]))
    print('D2 target 4 nodes >= 1.7x one node: %s'
          % ('met' if rate[4] / rate[1] >= 1.7 else 'NOT met'))


def main(argv):
    which = set(argv) or {'D1', 'D2'}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address='127.0.0.3')
    try:
        print('# Ray %s, cluster CPUs %s, load average %s'
              % (ray.__version__, ray.cluster_resources().get('CPU'),
                 os.getloadavg()))
        if 'D1' in which:
            d1_overhead()
        if 'D2' in which:
            d2_scaling()
    finally:
        ray.shutdown()


if __name__ == '__main__':
    main(sys.argv[1:])
