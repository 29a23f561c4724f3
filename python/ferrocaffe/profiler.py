"""Timelines of runs, in Chrome's trace-event JSON (open the file in
https://ui.perfetto.dev or ``chrome://tracing``), and tables of where the
time went.

::

    import ferrocaffe
    with ferrocaffe.profile('/tmp/run.json') as trace:
        workspace.RunPlan(plan)            # or session.run(...), runner.train(...)
    print(trace.table())                   # the slowest ops

    workspace.RunPlan(plan, trace='/tmp/one_run.json')   # one call

While a profile is open every run in the process records: each op (named
by its type; its net and index in ``args``), each net run, each iteration
of a step's loop, each step, each concurrent substep and instance (on a
lane of its own, named ``<step> #<k>``: instance k of every iteration
shares it), each report step or report net run, each wait of a queue
(full or empty), and what Python marks with :func:`span` (JobRunner's
epochs and checkpoint saves). Events are complete events (``"ph": "X"``,
``ts`` and ``dur`` in microseconds) on the lane (``tid``) of the thread
that ran them, plus a ``thread_name`` event per lane.

Off, a net run costs one relaxed atomic load more; on, each op is timed
(BENCHMARKS.md has the figures). Profiles nest: each sees the spans of its
own window.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import defaultdict
from typing import Any, Iterator

from ._core import trace_json, trace_now, trace_on, trace_record, trace_start, trace_stop

__all__ = ["profile", "span", "Trace", "slowest_ops", "format_op_table", "is_profiling"]


class Trace:
    """The events a :func:`profile` recorded (``events``: trace-event
    dicts), available once the ``with`` block has ended."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = os.fspath(path) if path is not None else None
        self.events: list[dict[str, Any]] = []

    def to_json(self) -> dict[str, Any]:
        """The trace as Chrome's JSON object format."""
        return {"traceEvents": self.events, "displayTimeUnit": "ms"}

    def save(self, path: str | os.PathLike[str]) -> str:
        """Writes the trace (atomically: a complete file or none)."""
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".trace-", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_json(), f)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return path

    def slowest_ops(self, n: int = 10) -> list[dict[str, Any]]:
        """See :func:`slowest_ops`."""
        return slowest_ops(self.events, n)

    def table(self, n: int = 10) -> str:
        """The :func:`slowest_ops` as a text table."""
        return format_op_table(self.slowest_ops(n))

    def __repr__(self) -> str:
        return "<Trace %s: %d events>" % (self.path or "(not saved)", len(self.events))


def is_profiling() -> bool:
    """Whether a timeline is being recorded."""
    return bool(trace_on())


@contextlib.contextmanager
def profile(path: str | os.PathLike[str] | None = None, ops: bool = True) -> Iterator[Trace]:
    """Records a timeline of every run in this process while the block
    runs; on leaving it the :class:`Trace` holds the events and, given a
    ``path``, they are written there (also when the block raised).
    ``ops=False`` records each net run as one span, without its ops (the
    cheaper choice for nets of many tiny ops)."""
    trace = Trace(path)
    ops = bool(ops)
    since = trace_start(ops)
    try:
        yield trace
    finally:
        try:
            trace.events = json.loads(trace_json(since))
        finally:
            trace_stop(ops)
        if trace.path is not None:
            trace.save(trace.path)


@contextlib.contextmanager
def span(name: str, cat: str = "python", detail: str | None = None) -> Iterator[None]:
    """Marks the block as a span named ``name`` on this thread's lane of
    the timeline being recorded (nothing when none is)."""
    if not trace_on():
        yield
        return
    start = trace_now()
    try:
        yield
    finally:
        trace_record(str(name), cat, start, detail)


def _events_of(trace: Any) -> list[dict[str, Any]]:
    if isinstance(trace, Trace):
        return trace.events
    if isinstance(trace, (str, os.PathLike)):
        with open(trace) as f:
            trace = json.load(f)
    if isinstance(trace, dict):
        return trace.get("traceEvents", [])
    return list(trace)


def slowest_ops(trace: Any, n: int = 10) -> list[dict[str, Any]]:
    """The ``n`` ops that took the most time in a trace (a :class:`Trace`,
    its events, or a trace file), one row per (net, index): ``type``,
    ``net``, ``index``, ``calls``, ``total_ms``, ``mean_ms`` and
    ``percent`` (of all op time), slowest first."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    total = 0.0
    for e in _events_of(trace):
        if e.get("cat") != "op" or e.get("ph") != "X":
            continue
        args = e.get("args", {})
        key = (args.get("net", ""), int(args.get("index", -1)))
        row = rows.get(key)
        if row is None:
            row = rows[key] = {"type": e["name"], "net": key[0], "index": key[1],
                               "calls": 0, "total_ms": 0.0}
        ms = float(e["dur"]) / 1000.0
        row["calls"] += 1
        row["total_ms"] += ms
        total += ms
    out = sorted(rows.values(), key=lambda r: -r["total_ms"])[:n]
    for r in out:
        r["mean_ms"] = r["total_ms"] / r["calls"]
        r["percent"] = 100.0 * r["total_ms"] / total if total else 0.0
    return out


def format_op_table(rows: list[dict[str, Any]]) -> str:
    """Rows of :func:`slowest_ops` (or of ``workspace.BenchmarkNet``'s
    table) as aligned text."""
    head = "%-24s %-28s %5s %8s %12s %12s %6s" % (
        "op", "net", "index", "calls", "total ms", "mean ms", "%")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append("%-24s %-28s %5d %8d %12.4f %12.6f %6.1f" % (
            r["type"][:24], r["net"][-28:], r["index"], r["calls"], r["total_ms"],
            r["mean_ms"], r["percent"]))
    return "\n".join(lines)

