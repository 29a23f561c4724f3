"""Readable text of nets, execution steps, plans, Tasks, TaskGroups and Jobs,
and a static check of a job's blobs, under Caffe2's names
(``net_printer.to_string``, ``debug_net``, ``analyze``).

``to_string(obj)`` prints what will run, nested as it nests, in a form that
reads like the Python that built it::

    with Job():
      with init_group:
        with Node('trainer'):
          with Task('trainer/train', workspace_type='private'):
            with step('trainer/train', num_iter=10):
              net 'trainer/train_net':
                x = Add(x, one)

``analyze(obj)`` walks a Job (its init and epoch groups), TaskGroup, Task,
step, net or plan in the order they run and raises ``AssertionError`` naming
the first blob that is read before anything writes it ("Blob undefined: x")
or that two concurrent substeps both create ("Blobs created by multiple
parallel steps: ..."), as Caffe2's analyzer did. Steps that create a
workspace, and the substeps of a concurrent step, see a copy of the blobs
around them; the blobs a concurrent substep creates in a shared workspace
are visible after the step. Blob names starting with
``distributed_ctx_init`` are set up by the runtime and never reported.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Iterator

from ferrocaffe import core
from ferrocaffe.checkpoint import Job
from ferrocaffe.proto import caffe2_pb2
from ferrocaffe.task import Node, Task, TaskGroup, WorkspaceType

__all__ = ["analyze", "to_string", "debug_net"]

_IGNORED_PREFIXES = ("distributed_ctx_init",)


# ------------------------------------------------------------------ analyze --

class _Analyzer:
    """The blobs defined so far, per node, while walking a job in order."""

    def __init__(self) -> None:
        self._by_node: dict[str, Counter[str]] = {}
        self._stack: list[Counter[str]] = [Counter()]

    @property
    def ws(self) -> Counter[str]:
        return self._stack[-1]

    @contextlib.contextmanager
    def workspace(self, node: str | None = None, copy: bool = False) -> Iterator[Counter[str]]:
        ws = self._by_node.setdefault(node, Counter()) if node is not None else self.ws
        if copy:
            ws = Counter(ws)
        self._stack.append(ws)
        try:
            yield ws
        finally:
            self._stack.pop()

    def need(self, blob: str) -> None:
        if blob.startswith(_IGNORED_PREFIXES):
            return
        if blob not in self.ws:
            raise AssertionError("Blob undefined: %s" % blob)

    def define(self, blob: str) -> None:
        self.ws[blob] += 1

    def visit(self, obj: Any) -> None:
        if isinstance(obj, Job):
            self.visit(obj.init_group)
            self.visit(obj.epoch_group)
        elif isinstance(obj, TaskGroup):
            for task in obj.tasks_by_node().tasks():
                with self.workspace(node=str(task.node)):
                    self.visit(task)
        elif isinstance(obj, Task):
            with self.workspace(copy=obj.workspace_type() == WorkspaceType.PRIVATE):
                self.visit(obj.get_step())
        elif isinstance(obj, core.Plan):
            for step in obj.Steps():
                self.visit(step)
        elif isinstance(obj, core.ExecutionStep):
            self._step(obj)
        elif isinstance(obj, core.Net):
            for op in obj.Proto().op:
                self._op(op)
        elif isinstance(obj, caffe2_pb2.OperatorDef):
            self._op(obj)
        else:
            raise TypeError("net_printer.analyze: cannot analyze a %s" % type(obj).__name__)

    def _op(self, op: Any) -> None:
        for blob in op.input:
            self.need(blob)
        for blob in op.output:
            self.define(blob)

    def _step(self, step: core.ExecutionStep) -> None:
        proto = step.Proto()
        created: set[str] = set()
        with self.workspace(copy=proto.create_workspace):
            if proto.report_net:
                with self.workspace(copy=True):
                    self.visit(step.get_net(proto.report_net))
            parts: list[Any] = list(step.Substeps()) + [step.get_net(n) for n in proto.network]
            for part in parts:
                with self.workspace(copy=proto.concurrent_substeps) as inner:
                    self.visit(part)
                    if proto.should_stop_blob:
                        self.need(proto.should_stop_blob)
                if proto.concurrent_substeps:
                    new = set(inner) - set(self.ws)
                    both = created & new
                    if both:
                        raise AssertionError(
                            "Blobs created by multiple parallel steps: %s" % ", ".join(sorted(both)))
                    created |= new
            for blob in created:
                self.define(blob)


def analyze(obj: Any) -> None:
    """Raises AssertionError for the first blob ``obj`` reads before it is
    written, or that two concurrent substeps both create."""
    _Analyzer().visit(obj)


# ---------------------------------------------------------------- to_string --

def _arg_value(arg: Any) -> Any:
    for field in ("f", "i", "s", "n"):
        if arg.HasField(field):
            value = getattr(arg, field)
            if field == "s":
                return value.decode("utf-8", "backslashreplace")
            if field == "n":
                return "<net %r>" % value.name
            return value
    for field in ("floats", "ints", "strings", "nets"):
        values = list(getattr(arg, field))
        if values:
            if field == "strings":
                return [v.decode("utf-8", "backslashreplace") for v in values]
            if field == "nets":
                return ["<net %r>" % n.name for n in values]
            return values
    # An empty list (e.g. shape=[] for a scalar): proto2 cannot tell which.
    return []


def _op_line(op: Any, details: bool = False) -> str:
    args = ", ".join(list(op.input) + ["%s=%r" % (a.name, _arg_value(a)) for a in op.arg])
    if details:
        extra = []
        if op.engine:
            extra.append("engine=%r" % op.engine)
        if op.HasField("device_option") and op.device_option.device_type:
            extra.append("device_type=%d" % op.device_option.device_type)
        if op.control_input:
            extra.append("control_input=%r" % list(op.control_input))
        if extra:
            args = ", ".join([a for a in [args] if a] + extra)
    call = "%s(%s)" % (op.type, args)
    outputs = ", ".join(op.output)
    return "%s = %s" % (outputs, call) if outputs else call


class _Printer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def add(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    @contextlib.contextmanager
    def block(self, text: str) -> Iterator[None]:
        self.add(text)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def visit(self, obj: Any) -> None:
        if isinstance(obj, Job):
            with self.block("with Job():"):
                for name in ("init_group", "epoch_group", "download_group", "exit_group"):
                    group = getattr(obj, name)
                    if isinstance(group, TaskGroup) and not group.tasks():
                        continue
                    with self.block("with %s:" % name):
                        self.visit(group)
        elif isinstance(obj, TaskGroup):
            by_node: dict[str, list[Task]] = {}
            for task in obj.tasks():
                by_node.setdefault(str(task.node), []).append(task)
            for node, tasks in by_node.items():
                with self.block("with Node(%r):" % node):
                    for task in tasks:
                        self.visit(task)
        elif isinstance(obj, Task):
            fields = ["%r" % obj.name]
            if obj.workspace_type():
                fields.append("workspace_type=%r" % obj.workspace_type())
            if getattr(obj, "_num_instances", None):
                fields.append("num_instances=%d" % obj._num_instances)
            with self.block("with Task(%s):" % ", ".join(fields)):
                self.visit(obj.get_step())
                outputs = [", ".join(str(n) for n in o.names) for o in obj.outputs()]
                if outputs:
                    self.add("outputs: %s" % ", ".join(outputs))
        elif isinstance(obj, core.Plan):
            with self.block("with Plan(%r):" % obj.Proto().name):
                for step in obj.Steps():
                    self.visit(step)
        elif isinstance(obj, core.ExecutionStep):
            self._step(obj)
        elif isinstance(obj, core.Net):
            self._net(obj.Proto())
        elif isinstance(obj, caffe2_pb2.NetDef):
            self._net(obj)
        elif isinstance(obj, caffe2_pb2.OperatorDef):
            self.add(_op_line(obj))
        elif isinstance(obj, (Node, str)):
            self.add(str(obj))
        else:
            raise TypeError("net_printer.to_string: cannot print a %s" % type(obj).__name__)

    def _net(self, proto: Any) -> None:
        with self.block("net %r:" % proto.name):
            for op in proto.op:
                self.add(_op_line(op))
            if not proto.op:
                self.add("(no ops)")

    def _step(self, step: core.ExecutionStep) -> None:
        proto = step.Proto()
        fields = ["%r" % proto.name]
        for name in ("num_iter", "should_stop_blob", "only_once", "concurrent_substeps",
                     "create_workspace", "num_concurrent_instances", "run_every_ms",
                     "report_interval", "report_net"):
            if proto.HasField(name) and getattr(proto, name):
                fields.append("%s=%r" % (name, getattr(proto, name)))
        with self.block("with step(%s):" % ", ".join(fields)):
            if proto.report_net:
                with self.block("report:"):
                    self.visit(step.get_net(proto.report_net))
            for sub in step.Substeps():
                self.visit(sub)
            for name in proto.network:
                self.visit(step.get_net(name))


def to_string(obj: Any) -> str:
    """A readable, indented text of a Job, TaskGroup, Task, Plan, step, net
    (or NetDef) or op, with the names the user gave."""
    p = _Printer()
    p.visit(obj)
    return "\n".join(p.lines)


def debug_net(net: Any) -> str:
    """A net's ops one per line, with their engine, device and control
    inputs as well as their arguments."""
    proto = net.Proto() if isinstance(net, core.Net) else net
    lines = ["net %r:" % proto.name]
    lines += ["  " + _op_line(op, details=True) for op in proto.op]
    return "\n".join(lines)
