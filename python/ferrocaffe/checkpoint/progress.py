"""The progress display of :class:`~ferrocaffe.checkpoint.JobRunner`
(``progress=``): a tqdm bar on a terminal, nothing otherwise."""

import collections
import os
import sys
import threading
import time

import numpy as np

from ferrocaffe.checkpoint.state import logger


def _progress_wanted(stream):
    """Progress is drawn only for a person: on a terminal, outside CI."""
    if os.environ.get('CI') or os.environ.get('TERM') == 'dumb':
        return False
    try:
        return bool(stream.isatty())
    except Exception:
        return False


def _make_progress(setting, job):
    """The progress display of a run: ``setting`` is None (automatic), a
    bool, or a text stream to draw on."""
    if setting is False:
        return _NoProgress()
    stream = sys.stderr if setting in (None, True) else setting
    if setting is None and not _progress_wanted(stream):
        return _NoProgress()
    try:
        import tqdm
    except ImportError:
        if setting is not None:
            logger.warning('progress display needs the tqdm package')
        return _NoProgress()
    return _Progress(job, stream, tqdm.tqdm)


class _NoProgress(object):
    def start(self, epochs_done):
        pass

    def epoch_started(self, epoch):
        pass

    def epoch_finished(self, epoch):
        pass

    def checkpoint(self, epoch, seconds, ok):
        pass

    def close(self):
        pass


def _duration(seconds):
    if seconds < 1.0:
        return '%d ms' % int(round(seconds * 1000))
    return '%.1f s' % seconds


def _count(value):
    arr = np.asarray(value)
    if arr.size == 0 or arr.dtype == object:
        return None
    return int(arr.reshape(-1)[0])


class _Progress(object):
    """A tqdm bar over epochs; its text shows the job's ``track_scalars``
    values after the last epoch (a loss, an accuracy), the batches and rows
    counted by its ``track_progress`` blobs (polled while an epoch runs),
    the rows per second and the last checkpoint with its save time."""

    POLL_SECONDS = 0.5
    RATE_WINDOW = 5.0

    def __init__(self, job, stream, tqdm_cls):
        self._job = job
        self._stream = stream
        self._tqdm = tqdm_cls
        self._lock = threading.Lock()
        self._bar = None  # drawn from the first epoch on
        self._epoch = None
        self._counts = {}
        self._samples = collections.deque()
        self._ckpt = None
        self._scalars = {}  # the track_scalars values after the last epoch
        self._stop = threading.Event()
        self._thread = None

    def start(self, epochs_done):
        if self._job.num_epochs:
            bar_format = ('{desc} {bar} {n_fmt}/{total_fmt} epochs '
                          '[{elapsed}<{remaining}{postfix}]')
        else:
            bar_format = '{desc} [{elapsed}{postfix}]'
        with self._lock:
            self._bar = self._tqdm(
                total=self._job.num_epochs, initial=epochs_done,
                unit='epoch', file=self._stream, dynamic_ncols=True,
                leave=True, desc='epoch %d' % (epochs_done + 1),
                bar_format=bar_format)
            self._redraw()

    def epoch_started(self, epoch):
        with self._lock:
            self._epoch = epoch
            self._redraw()
        if self._thread is None and self._job.progress_outputs:
            self._thread = threading.Thread(
                target=self._poll, name='ferrocaffe-progress', daemon=True)
            self._thread.start()

    def epoch_finished(self, epoch):
        self._sample()
        scalars = {}
        for key, output in list(self._job.scalar_outputs.items()):
            try:
                value = np.asarray(output.fetch(), dtype=np.float64).reshape(-1)
            except Exception:  # not set, or not a number
                continue
            if value.size == 1:
                scalars[key] = float(value[0])
        with self._lock:
            self._scalars = scalars
            if self._bar is not None:
                self._bar.update(1)
            self._redraw()

    def checkpoint(self, epoch, seconds, ok):
        with self._lock:
            self._ckpt = (epoch, seconds, ok)
            self._redraw()

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def _poll(self):
        while not self._stop.wait(self.POLL_SECONDS):
            self._sample()
            with self._lock:
                self._redraw()

    def _sample(self):
        counts = {}
        for key, output in list(self._job.progress_outputs.items()):
            try:
                value = _count(output.fetch())
            except Exception:  # not set yet, or not a number
                value = None
            if value is not None:
                counts[key] = value
        now = time.monotonic()
        with self._lock:
            self._counts.update(counts)
            if 'rows' in counts or 'batches' in counts:
                self._samples.append((now, dict(self._counts)))
                while (len(self._samples) > 2 and
                       now - self._samples[0][0] > self.RATE_WINDOW):
                    self._samples.popleft()

    def _rate(self, key):
        if len(self._samples) < 2:
            return None
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        if key not in c0 or key not in c1 or t1 <= t0:
            return None
        return (c1[key] - c0[key]) / (t1 - t0)

    def _redraw(self):
        if self._bar is None:
            return
        if self._epoch is not None:
            self._bar.set_description_str('epoch %d' % self._epoch,
                                          refresh=False)
        parts = ['%s %.4g' % (key, value) for key, value in self._scalars.items()]
        if 'batches' in self._counts:
            parts.append('batches %s' % format(self._counts['batches'], ','))
        rate_key = 'rows' if 'rows' in self._counts else 'batches'
        rate = self._rate(rate_key)
        if rate is not None:
            parts.append('%s %s/s' % (format(int(round(rate)), ','),
                                      rate_key))
        if self._ckpt is not None:
            epoch, seconds, ok = self._ckpt
            if ok:
                parts.append('checkpoint of epoch %d saved in %s' % (
                    epoch, _duration(seconds)))
            else:
                parts.append('checkpoint epoch %d FAILED' % epoch)
        self._bar.set_postfix_str(', '.join(parts), refresh=True)
