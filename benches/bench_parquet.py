"""Parquet read throughput: ferrocaffe's ParquetReader vs pyarrow on the
same file.

    python benches/bench_parquet.py                  # 4M rows, default columns
    python benches/bench_parquet.py --rows 2000000 --batch-size 16384
    python benches/bench_parquet.py --strings        # add a string column

Writes (once, cached under the temp dir) a Parquet file written by pyarrow
with its defaults (snappy, dictionary encoding, 1Mi-row row groups):
``id`` int64, ``label`` int32, ``x`` float32, ``y`` float64 and ``items``
list<int64> (0-4 items per row); ``--strings`` adds ``name`` (string). Then,
alternating runs and keeping each one's best of ``--repeat``:

* pyarrow: ``ParquetFile(path).iter_batches(batch_size)`` over every batch
  (the baseline; pyarrow decodes columns on its own thread pool);
* ferrocaffe, reader: a plan step looping ``ReadParquetBatch`` + ``IsEmpty``
  until the end, i.e. batches decoded into workspace tensors;
* ferrocaffe, pipeline: ``pipe(reader, processor=..., num_threads=N)``, a
  Task reading the file on N threads through the pipeline machinery;
* pyarrow -> workspace: what a pyarrow-backed reader would do per batch
  (``iter_batches``, columns to numpy, lists to lengths + values, FeedBlob),
  the alternative considered for the dependency.

Prints rows/s and MB/s (file bytes on disk per second, and decoded bytes
per second, the Arrow table's ``nbytes``) and each ratio to pyarrow. The
target is ferrocaffe >= 0.8 x pyarrow. Run it on a quiet machine with a
release build (``PROFILE=release scripts/dev_build.sh``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

# numpy does no BLAS here; an idle OpenBLAS pool would still spin its threads
# for a while, taking CPU from the readers measured on a 2-vCPU machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError:  # pragma: no cover - the benchmark needs pyarrow
    sys.exit('bench_parquet.py needs pyarrow (pip install pyarrow)')

from ferrocaffe import core, workspace
from ferrocaffe.file_reader import ParquetReader
from ferrocaffe.pipeline import pipe
from ferrocaffe.session import LocalSession
from ferrocaffe.task import TaskGroup


def make_file(path, rows, strings):
    rng = np.random.default_rng(0)
    lens = rng.integers(0, 5, rows)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    values = rng.integers(0, 1000, int(offsets[-1])).astype(np.int64)
    cols = {
        'id': np.arange(rows, dtype=np.int64),
        'label': rng.integers(0, 2, rows).astype(np.int32),
        'x': rng.standard_normal(rows).astype(np.float32),
        'y': rng.standard_normal(rows),
        'items': pa.ListArray.from_arrays(pa.array(offsets),
                                          pa.array(values)),
    }
    if strings:
        cols['name'] = pa.array(['user%07d' % (i % 100000)
                                 for i in range(rows)])
    pq.write_table(pa.table(cols), path)


def bench_pyarrow(path, batch_size):
    n = 0
    for b in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
        n += b.num_rows
    return n


def bench_pyarrow_to_workspace(path, batch_size, ws):
    n = 0
    for b in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
        for name, col in zip(b.schema.names, b.columns):
            if pa.types.is_list(col.type):
                off = col.offsets.to_numpy()
                ws.feed_blob(name + ':lengths', np.diff(off).astype(np.int32))
                ws.feed_blob(name + ':values', col.values.to_numpy())
            elif pa.types.is_string(col.type):
                ws.feed_blob(name, np.array(col.to_pylist(), dtype=object))
            else:
                ws.feed_blob(name, col.to_numpy(zero_copy_only=False))
        n += b.num_rows
    return n


class FerroReader:
    """A plan looping ReadParquetBatch until the end; reset between runs."""

    def __init__(self, path, batch_size):
        self.ws = workspace.Workspace()
        self.reader = ParquetReader(path, batch_size=batch_size)
        init = core.Net('init')
        self.reader.setup_ex(init, core.Net('finish'))
        self.ws.run(init)
        net = core.Net('read')
        stop, self.fields = self.reader.read(net)
        self.plan = core.Plan('read_all')
        self.plan.AddStep(core.execution_step('loop', net,
                                              should_stop_blob=stop))
        self.reset = core.Net('reset')
        self.reader.reset(self.reset)

    def __call__(self):
        self.ws.run(self.reset)
        self.ws.run(self.plan)


def bench_pipeline(path, batch_size, threads):
    ws = workspace.Workspace()
    session = LocalSession(ws)
    reader = ParquetReader(path, batch_size=batch_size)
    with TaskGroup() as tg:
        # The processor adds nothing: the Task reads until the end.
        pipe(reader, processor=lambda rec: None, num_threads=threads)
    session.run(tg)


def best_of(fn, repeat):
    best = float('inf')
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rows', type=int, default=4_000_000)
    p.add_argument('--batch-size', type=int, default=65536)
    p.add_argument('--repeat', type=int, default=5)
    p.add_argument('--threads', type=int, default=2,
                   help='pipeline threads (default 2)')
    p.add_argument('--strings', action='store_true',
                   help='add a string column')
    p.add_argument('--file', default=None,
                   help='the Parquet file (written if missing)')
    args = p.parse_args()

    path = args.file or os.path.join(
        tempfile.gettempdir(), 'ferrocaffe-bench-%d%s.parquet' % (
            args.rows, '-strings' if args.strings else ''))
    if not os.path.exists(path):
        print('writing %s ...' % path, flush=True)
        make_file(path, args.rows, args.strings)
    meta = pq.ParquetFile(path).metadata
    rows = meta.num_rows
    file_mb = os.path.getsize(path) / 1e6
    decoded_mb = pq.read_table(path).nbytes / 1e6
    print('file: %s  %d rows, %d row groups, %.1f MB on disk, %.1f MB '
          'decoded' % (path, rows, meta.num_row_groups, file_mb, decoded_mb))
    print('batch size %d, best of %d, pyarrow %s, %d cpus' % (
        args.batch_size, args.repeat, pa.__version__, os.cpu_count()))

    ferro = FerroReader(path, args.batch_size)
    ws_feed = workspace.Workspace()
    runs = {
        'pyarrow iter_batches': lambda: bench_pyarrow(path, args.batch_size),
        'ferrocaffe ReadParquetBatch': ferro,
        'ferrocaffe pipe(%d threads)' % args.threads:
            lambda: bench_pipeline(path, args.batch_size, args.threads),
        'pyarrow -> numpy -> FeedBlob': lambda: bench_pyarrow_to_workspace(
            path, args.batch_size, ws_feed),
    }
    # Check once that ferrocaffe reads every row.
    ferro()
    assert bench_pyarrow(path, args.batch_size) == rows
    best = {k: float('inf') for k in runs}
    for _ in range(args.repeat):  # interleaved, so load hits all alike
        for k, fn in runs.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    base = best['pyarrow iter_batches']
    print('%-32s %12s %10s %12s %8s' % ('', 'Mrows/s', 'file MB/s',
                                         'decoded MB/s', 'ratio'))
    for k, t in best.items():
        print('%-32s %12.2f %10.1f %12.1f %8.2f' % (
            k, rows / t / 1e6, file_mb / t, decoded_mb / t, base / t))
    ratio = base / best['ferrocaffe ReadParquetBatch']
    print('ferrocaffe / pyarrow = %.2f (target >= 0.80): %s' % (
        ratio, 'met' if ratio >= 0.8 else 'NOT met'))


if __name__ == '__main__':
    main()
