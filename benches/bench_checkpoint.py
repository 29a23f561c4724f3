"""Checkpoint benchmarks, each printed as a ratio against a baseline measured
in the same run.

    python benches/bench_checkpoint.py                 # all
    python benches/bench_checkpoint.py save load mmap  # some
    python benches/bench_checkpoint.py --dir /data/tmp --repeat 5

save  64 float32 tensors (2048 x 1024 each, 512 MiB of random data) written
      by a Save op (db_type 'ferro', then 'minidb'), which fsyncs the file
      and its directory; baseline: ``dd if=/dev/zero of=F bs=1M count=512
      conv=fsync`` (its own reported time).  Target: save >= 0.80 x dd.
load  the same data read back by a Load op into a new workspace, alone,
      followed by ``fetch_blob`` of every tensor (the default: a writable
      numpy copy each, what the peer harness's W5 times), and followed by
      ``fetch_blob(name, copy=False)`` of every tensor (a read-only view of
      the tensor's copy-on-write buffer); baselines: ``dd if=F
      of=/dev/null bs=1M`` (its own reported time), one ``readinto`` of
      the whole file into a new bytearray, and ``np.load`` of the 64
      tensors saved as .npy files.  Both cold (the files evicted from the
      page cache with posix_fadvise(DONTNEED) after an fsync) and warm (the
      files read through the page cache with plain reads first: a cold Load
      reads its large payloads with direct I/O and leaves them out of the
      cache), all interleaved.  Targets: Load >= np.load; Load + fetch cold
      >= 0.90 x dd, warm >= 5 GB/s (both fetches are reported against them).
mmap  the same ferro file opened with ``ferrocaffe.checkpoint.mmap_db``
      (read-only numpy views of the mapped file, nothing copied); baseline:
      ``np.load(mmap_mode='r')`` of the 64 .npy files.  The open is timed
      alone, then touching one byte per 4 KiB page of every tensor (as
      shared/peerbench's touch_pages) is timed separately; cold and warm as
      for load; ``mmap_db(verify=True)`` (every CRC, so a full read) is
      reported too.  Target: the open <= 10 ms.
job   examples/linear_job.py at its default size: the wall time of the
      checkpoint saves (Save, fsyncs, manifest rewrite) over the wall time
      of the epochs, and the time per epoch with vs without a checkpoint
      manager.  Target: overhead <= 5% of the epoch time.

Before each timed step 1.5 GiB is touched and freed: this VM's host takes
back memory left free for a couple of seconds, and first touches of it run
at a fraction of the normal speed (shared/peerbench/RESULTS.md, caveats).
Run it with a release build of the extension
(``PROFILE=release scripts/dev_build.sh``) on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
try:
    import ferrocaffe  # noqa: F401
except ImportError:  # run from a checkout
    sys.path.insert(0, os.path.join(REPO, 'python'))

from ferrocaffe import _core, core, workspace  # noqa: E402

NUM_TENSORS = 64
SHAPE = (2048, 1024)
PREWARM_BYTES = 1536 << 20


def prewarm():
    """Touches and frees 1.5 GiB so that timed allocations get memory the
    host has not taken back."""
    a = np.ones(PREWARM_BYTES // 8)
    a[::512] = 2.0
    del a


def evict(path):
    """Drops a file's pages from the page cache (they are clean after the
    fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cache_file(path):
    """Reads a file through the page cache."""
    with open(path, 'rb', buffering=0) as f:
        while f.read(8 << 20):
            pass


def summary(values):
    return statistics.median(values), min(values), max(values)


def fmt_rate(nbytes, seconds):
    return '%.2f GB/s' % (nbytes / seconds / 1e9)


def show(label, nbytes, times):
    med, lo, hi = summary(times)
    print('  %-34s %s  [%s .. %s]  (median %.3f s)' % (
        label, fmt_rate(nbytes, med), fmt_rate(nbytes, hi),
        fmt_rate(nbytes, lo), med))
    return med


# ------------------------------------------------------------ save/load --

def make_tensors():
    rng = np.random.default_rng(0)
    return ['t%02d' % i for i in range(NUM_TENSORS)], [
        rng.random(SHAPE, dtype=np.float32) for _ in range(NUM_TENSORS)]


def dd_seconds(path, mib):
    """dd's own time for writing ``mib`` MiB of zeros with conv=fsync."""
    out = subprocess.run(
        ['dd', 'if=/dev/zero', 'of=' + path, 'bs=1M', 'count=%d' % mib,
         'conv=fsync'], capture_output=True, text=True,
        env=dict(os.environ, LC_ALL='C'), check=True)
    m = re.search(r'copied, ([0-9.eE+-]+) s', out.stderr)
    if not m:
        raise RuntimeError('cannot parse dd output: %r' % out.stderr)
    return float(m.group(1))


def save_op(names, path, db_type):
    return core.CreateOperator('Save', names, [], db=path, db_type=db_type,
                               absolute_path=True)


def load_op(names, path, db_type):
    return core.CreateOperator('Load', [], names, db=path, db_type=db_type,
                               absolute_path=True)


def remove(path):
    if os.path.exists(path):
        os.unlink(path)


def bench_save(args, ws, names, nbytes):
    print('save: %d float32 tensors, %d MiB, fsync' % (
        NUM_TENSORS, nbytes >> 20))
    mib = nbytes >> 20
    dd_path = os.path.join(args.dir, 'dd.bin')
    paths = {t: os.path.join(args.dir, 'ckpt.' + t) for t in ('ferro',
                                                              'minidb')}
    times = {'dd': [], 'ferro': [], 'minidb': []}
    ops = {t: save_op(names, p, t) for t, p in paths.items()}
    for _ in range(args.repeat):
        remove(dd_path)
        prewarm()
        times['dd'].append(dd_seconds(dd_path, mib))
        for t in ('ferro', 'minidb'):
            remove(paths[t])
            prewarm()
            start = time.perf_counter()
            ws.run(ops[t])
            times[t].append(time.perf_counter() - start)
    remove(dd_path)
    dd = show('dd bs=1M conv=fsync (baseline)', nbytes, times['dd'])
    ferro = show('Save, ferro', nbytes, times['ferro'])
    minidb = show('Save, minidb', nbytes, times['minidb'])
    print('  ratio Save(ferro) / dd  = %.2f  (target >= 0.80)' % (dd / ferro))
    print('  ratio Save(minidb) / dd = %.2f' % (dd / minidb))
    return paths


def write_npy(args, names, arrays):
    """The tensors as .npy files (fsynced), for the numpy baselines."""
    npy_dir = os.path.join(args.dir, 'npy')
    os.makedirs(npy_dir, exist_ok=True)
    npy_paths = []
    for name, arr in zip(names, arrays):
        p = os.path.join(npy_dir, name + '.npy')
        with open(p, 'wb') as f:
            np.save(f, arr)
            f.flush()
            os.fsync(f.fileno())
        npy_paths.append(p)
    return npy_dir, npy_paths


def dd_read_seconds(path):
    """dd's own time for reading ``path`` to /dev/null in 1 MiB blocks."""
    out = subprocess.run(
        ['dd', 'if=' + path, 'of=/dev/null', 'bs=1M'], capture_output=True,
        text=True, env=dict(os.environ, LC_ALL='C'), check=True)
    m = re.search(r'copied, ([0-9.eE+-]+) s', out.stderr)
    if not m:
        raise RuntimeError('cannot parse dd output: %r' % out.stderr)
    return float(m.group(1))


def readinto_seconds(path):
    """One unbuffered readinto of the whole file into a new bytearray."""
    start = time.perf_counter()
    buf = bytearray(os.path.getsize(path))
    with open(path, 'rb', buffering=0) as f:
        f.readinto(buf)
    elapsed = time.perf_counter() - start
    del buf
    return elapsed


LOAD_KEYS = ('dd', 'readinto', 'numpy', 'ferro', 'ferro+fetch', 'ferro+view',
             'ferro+view,nocache', 'ferro+view,after', 'minidb')


def bench_load(args, ws, names, arrays, nbytes, paths):
    print('load: the same %d MiB' % (nbytes >> 20))
    npy_dir, npy_paths = write_npy(args, names, arrays)
    for t, p in paths.items():
        if not os.path.exists(p):
            ws.run(save_op(names, p, t))
    ops = {t: load_op(names, p, t) for t, p in paths.items()}
    fetch_split = {True: [], False: []}

    def load_ferrocaffe(t, fetch=False, copy=True, cache=True):
        if not cache:  # fresh memory, as in the first Load of a process
            limit = _core.set_buffer_cache_limit(0)
        target = workspace.Workspace()
        start = time.perf_counter()
        target.run(ops[t])
        loaded = time.perf_counter()
        if fetch:
            out = [target.fetch_blob(n, copy=copy) for n in names]
            fetch_split[copy].append(time.perf_counter() - loaded)
            assert out[7][5, 9] == arrays[7][5, 9]
            del out
        elapsed = time.perf_counter() - start
        assert target.blobs['t07'].fetch()[5, 9] == arrays[7][5, 9]
        del target
        if not cache:
            _core.set_buffer_cache_limit(limit)
        return elapsed

    def load_numpy():
        start = time.perf_counter()
        out = [np.load(p) for p in npy_paths]
        elapsed = time.perf_counter() - start
        assert out[7][5, 9] == arrays[7][5, 9]
        del out
        return elapsed

    def run(key):
        if key == 'dd':
            return dd_read_seconds(paths['ferro'])
        if key == 'readinto':
            return readinto_seconds(paths['ferro'])
        if key == 'numpy':
            return load_numpy()
        if key == 'ferro+fetch':
            return load_ferrocaffe('ferro', fetch=True)
        if key in ('ferro+view', 'ferro+view,after'):
            return load_ferrocaffe('ferro', fetch=True, copy=False)
        if key == 'ferro+view,nocache':
            return load_ferrocaffe('ferro', fetch=True, copy=False,
                                   cache=False)
        return load_ferrocaffe(key)

    def files(key):
        if key == 'numpy':
            return npy_paths
        return [paths['minidb' if key == 'minidb' else 'ferro']]

    results = {}
    for cold in (True, False):
        times = {k: [] for k in LOAD_KEYS}
        for split in fetch_split.values():
            del split[:]
        for _ in range(args.repeat):
            for key in LOAD_KEYS:
                if cold:
                    for p in files(key):
                        evict(p)
                else:
                    # Into the page cache with plain reads (a cold Load
                    # reads large payloads directly and leaves nothing
                    # there, so loading once would not warm the file).
                    for p in files(key):
                        if key == 'ferro+view,after':
                            # Warm as a cold Load leaves it (the peer
                            # harness's W5 order: cold Load, then warm).
                            evict(p)
                            load_ferrocaffe('ferro')
                        else:
                            cache_file(p)
                prewarm()
                times[key].append(run(key))
        state = 'cold' if cold else 'warm'
        print('  bytes read with direct I/O by the Loads so far: %d MiB' % (
            _core.direct_io_bytes() >> 20))
        dd = show('dd bs=1M to /dev/null, %s' % state, nbytes, times['dd'])
        raw = show('readinto a new bytearray, %s' % state, nbytes,
                   times['readinto'])
        base = show('np.load of .npy files, %s' % state, nbytes,
                    times['numpy'])
        ferro = show('Load, ferro, %s' % state, nbytes, times['ferro'])
        both = show('Load + fetch_blob x %d, ferro, %s' % (
            NUM_TENSORS, state), nbytes, times['ferro+fetch'])
        print('    of which fetch_blob: median %.3f s' % (
            statistics.median(fetch_split[True])))
        view = show('Load + fetch_blob(copy=False), %s' % state, nbytes,
                    times['ferro+view'])
        print('    of which fetch_blob(copy=False): median %.6f s' % (
            statistics.median(fetch_split[False])))
        nocache = show('  the same, buffer cache off, %s' % state, nbytes,
                       times['ferro+view,nocache'])
        if not cold:
            after = show('  the same, the file as a cold Load left it', nbytes,
                         times['ferro+view,after'])
            print('  Load+fetch(copy=False) right after a cold Load = %.2f GB/s'
                  '  (target >= 5)' % (nbytes / after / 1e9))
        minidb = show('Load, minidb, %s' % state, nbytes, times['minidb'])
        print('  ratio Load(ferro) / np.load, %s  = %.2f  (target >= 1.0)' % (
            state, base / ferro))
        print('  ratio Load(ferro) / dd, %s       = %.2f' % (state, dd / ferro))
        for label, t in (('Load+fetch', both), ('Load+fetch(copy=False)', view),
                         ('Load+fetch(copy=False), cache off', nocache)):
            print('  ratio %s / dd, %s = %.2f%s' % (
                label, state, dd / t, '  (target >= 0.90)' if cold else ''))
            print('  ratio %s / readinto, %s = %.2f' % (label, state, raw / t))
            if not cold:
                print('  %s, warm = %.2f GB/s  (target >= 5)' % (
                    label, nbytes / t / 1e9))
        print('  ratio Load(minidb) / np.load, %s = %.2f' % (
            state, base / minidb))
        results[state] = base / ferro
    shutil.rmtree(npy_dir, ignore_errors=True)
    return results


# ----------------------------------------------------------------- mmap --

def touch_pages(arrays):
    """Reads one byte of every 4 KiB page of every array (as
    shared/peerbench's touch_pages), so that lazily mapped data is read."""
    total = 0
    for a in arrays:
        total += int(a.reshape(-1).view(np.uint8)[::4096].sum())
    return total


def show_ms(label, times, extra=''):
    med, lo, hi = summary(times)
    print('  %-40s %8.3f ms  [%.3f .. %.3f]%s' % (
        label, med * 1e3, lo * 1e3, hi * 1e3, extra))
    return med


def bench_mmap(args, ws, names, arrays, nbytes, paths):
    from ferrocaffe.checkpoint import mmap_db

    print('mmap: the same %d MiB, opened memory-mapped' % (nbytes >> 20))
    path = paths['ferro']
    if not os.path.exists(path):
        ws.run(save_op(names, path, 'ferro'))
    npy_dir, npy_paths = write_npy(args, names, arrays)

    def run(key, cold, verify=False):
        """(open seconds, touch seconds) of one load."""
        files = npy_paths if key == 'numpy' else [path]
        if cold:
            for p in files:
                evict(p)
        prewarm()
        start = time.perf_counter()
        if key == 'numpy':
            out = [np.load(p, mmap_mode='r') for p in npy_paths]
        else:
            out = list(mmap_db(path, verify=verify).values())
        opened = time.perf_counter()
        touch_pages(out)
        touched = time.perf_counter()
        assert out[7][5, 9] == arrays[7][5, 9]
        assert not out[7].flags.writeable
        del out
        return opened - start, touched - opened

    results = {}
    for cold in (True, False):
        state = 'cold' if cold else 'warm'
        if not cold:  # into the page cache
            run('numpy', False)
            run('ferro', False)
        times = {k: ([], []) for k in ('numpy', 'ferro')}
        verify_times = []
        for _ in range(args.repeat):
            for key in ('numpy', 'ferro'):
                o, t = run(key, cold)
                times[key][0].append(o)
                times[key][1].append(t)
            verify_times.append(run('ferro', cold, verify=True)[0])
        base = show_ms("np.load(mmap_mode='r') x %d, %s, open" % (
            len(npy_paths), state), times['numpy'][0])
        ferro = show_ms('mmap_db, %s, open' % state, times['ferro'][0],
                        '  (target <= 10 ms)')
        base_t = show_ms('  + touch 1 byte/4 KiB page, .npy, %s' % state,
                         times['numpy'][1])
        ferro_t = show_ms('  + touch 1 byte/4 KiB page, mmap_db, %s' % state,
                          times['ferro'][1])
        show('mmap_db(verify=True), %s' % state, nbytes, verify_times)
        print('  ratio open np.load(mmap) / mmap_db, %s           = %.2f' % (
            state, base / ferro))
        print('  ratio open+touch np.load(mmap) / mmap_db, %s     = %.2f' % (
            state, (base + base_t) / (ferro + ferro_t)))
        results[state] = ferro
    shutil.rmtree(npy_dir, ignore_errors=True)
    return results


# ------------------------------------------------------------------ job --

def bench_job(args):
    sys.path.insert(0, os.path.join(REPO, 'examples'))
    import linear_job as train_job
    from ferrocaffe.checkpoint import JobRunner
    from ferrocaffe.session import LocalSession

    base = os.path.join(args.dir, 'train_job')
    data_cfg = train_job.Config(workdir=base)
    print('job: examples/linear_job.py at its default size (%d rows, %d per '
          'epoch, %d threads, %d features)' % (
              data_cfg.rows, data_cfg.batches_per_epoch, data_cfg.threads,
              data_cfg.features))
    train_job.make_data(data_cfg)
    ratios, with_ckpt, without = [], [], []
    for trial in range(args.repeat):
        for checkpointed in (True, False):
            cfg = train_job.Config(workdir=base)
            shutil.rmtree(cfg.checkpoint_dir, ignore_errors=True)
            job = train_job.build_job(cfg)
            manager = train_job.checkpoint_manager(cfg) if checkpointed \
                else None
            runner = JobRunner(job, manager, progress=False)
            prewarm()
            start = time.perf_counter()
            last = runner.train(LocalSession(workspace.Workspace()))
            wall = time.perf_counter() - start
            epochs = sum(runner.epoch_seconds.values())
            if checkpointed:
                assert not runner.failed_saves, runner.failed_saves
                saves = sum(runner.save_seconds.values())
                ratios.append(saves / epochs)
                with_ckpt.append(wall / last)
                print('  run %d: %d epochs, epochs %.2f s, %d saves %.3f s '
                      '(%.1f%% of the epoch time), wall %.2f s' % (
                          trial, last, epochs, len(runner.save_seconds),
                          saves, 100 * saves / epochs, wall))
            else:
                without.append(wall / last)
                print('  run %d without checkpoints: %d epochs, wall %.2f s'
                      % (trial, last, wall))
    overhead = statistics.median(ratios)
    print('  checkpoint time / epoch time = %.2f%%  [%.2f%% .. %.2f%%]  '
          '(target <= 5%%)' % (100 * overhead, 100 * min(ratios),
                               100 * max(ratios)))
    w, wo = statistics.median(with_ckpt), statistics.median(without)
    print('  wall time per epoch: %.3f s with checkpoints, %.3f s without '
          '(ratio %.3f)' % (w, wo, w / wo))
    shutil.rmtree(base, ignore_errors=True)
    return overhead


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('which', nargs='*',
                        help='save, load, mmap and/or job (default: all)')
    parser.add_argument('--dir', default=None,
                        help='where the files go (default: a new folder in '
                             'the temp dir, removed afterwards)')
    parser.add_argument('--repeat', type=int, default=3)
    args = parser.parse_args(argv)
    args.which = args.which or ['save', 'load', 'mmap', 'job']
    unknown = set(args.which) - {'save', 'load', 'mmap', 'job'}
    if unknown:
        parser.error('unknown benchmark(s): %s' % ', '.join(sorted(unknown)))
    own_dir = args.dir is None
    if own_dir:
        args.dir = tempfile.mkdtemp(prefix='ferrocaffe-bench-ckpt-',
                                    dir=os.environ.get('TMPDIR', '/var/tmp'))
    os.makedirs(args.dir, exist_ok=True)
    print('ferrocaffe %s (%s); files in %s' % (
        _core.__version__, _core.__file__, args.dir))
    try:
        if {'save', 'load', 'mmap'} & set(args.which):
            names, arrays = make_tensors()
            nbytes = sum(a.nbytes for a in arrays)
            ws = workspace.Workspace()
            for name, arr in zip(names, arrays):
                ws.feed_blob(name, arr)
            paths = {t: os.path.join(args.dir, 'ckpt.' + t)
                     for t in ('ferro', 'minidb')}
            if 'save' in args.which:
                paths = bench_save(args, ws, names, nbytes)
            if 'load' in args.which:
                bench_load(args, ws, names, arrays, nbytes, paths)
            if 'mmap' in args.which:
                bench_mmap(args, ws, names, arrays, nbytes, paths)
            del ws
        if 'job' in args.which:
            bench_job(args)
    finally:
        if own_dir:
            shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == '__main__':
    main()
