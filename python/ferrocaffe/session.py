"""Sessions: running Nets, steps, Plans, Tasks and TaskGroups (Caffe2's
``caffe2.python.session``).

    net = core.Net('my_net')
    net.Add([net.Const(1), net.Const(2)])

    with TaskGroup(WorkspaceType.GLOBAL) as init_tg:
        with Node('node1'):
            n1setup = core.Net('n1setup')
            n1msg = n1setup.Const('Hello from node 1.')
            Task(step=n1setup)

    with TaskGroup() as private_tg:
        with Node('node1'):
            n1 = core.Net('n1')
            n1.Print(n1msg, [])
            Task(step=n1)
        with Node('node2'):
            n2 = core.Net('n2')
            n2.Print(n2.Const('Hello from node 2.'), [])
            Task(step=n2)

    session = LocalSession()
    session.run(net)
    session.run(init_tg)
    session.run(private_tg)

Global workspace: a session keeps one workspace alive for its whole life.
Private workspace: a task either runs directly in the global workspace, or in
a child workspace created for the run and released after it.
Blob visibility: tasks on different nodes must be assumed unable to see each
other's blobs; tasks on one node follow the workspace hierarchy.
"""

from __future__ import annotations

import collections
import threading
from types import TracebackType
from typing import Any, Sequence, TypeVar, Union

from ferrocaffe import core, errors, workspace
from ferrocaffe.task import Cluster, Node, Task, TaskGroup, TaskOutput, WorkspaceType

__all__ = ['CompiledRunnable', 'Session', 'LocalSession']


_S = TypeVar('_S', bound='Session')


class CompiledRunnable(object):
    """What ``Session.compile`` returns: the compiled object and the session
    class it was compiled for."""

    def __init__(self, obj: Any, session_class: type[Session]) -> None:
        self.obj = obj
        self.session_class = session_class


# What Session.run and Session.compile take.
Runnable = Union[TaskGroup, Task, core.Plan, core.ExecutionStep, core.Net,
                 Sequence[Any], CompiledRunnable]


class _CompileCache(object):
    """Compiled forms by runnable identity and session class.

    Caffe2 kept every runnable ever compiled in a class-level dict, so a
    job that builds a new Task per epoch (as checkpointing does) grew
    without bound.  Here a runnable that can hold attributes (Net, step,
    Plan, Task, TaskGroup) keeps its compiled forms itself, so they live
    exactly as long as it does; anything else (a list of nets) goes to a
    small LRU of strong references, which keeps its id from being reused
    while it is there."""

    ATTR = '_ferrocaffe_compiled'
    LRU_SIZE = 64

    def __init__(self):
        self._lock = threading.Lock()
        self._lru = collections.OrderedDict()

    def get(self, cls, runnable):
        own = getattr(runnable, '__dict__', None)
        if own is not None:
            return own.get(self.ATTR, {}).get(cls)
        with self._lock:
            entry = self._lru.get((cls, id(runnable)))
            if entry is None or entry[0] is not runnable:
                return None
            self._lru.move_to_end((cls, id(runnable)))
            return entry[1]

    def put(self, cls, runnable, compiled):
        own = getattr(runnable, '__dict__', None)
        if own is not None:
            own.setdefault(self.ATTR, {})[cls] = compiled
            return
        with self._lock:
            self._lru[(cls, id(runnable))] = (runnable, compiled)
            while len(self._lru) > self.LRU_SIZE:
                self._lru.popitem(last=False)


_compile_cache = _CompileCache()


class Session(object):
    """
    Runs Nets, ExecutionSteps, Plans, Tasks and TaskGroups, possibly on
    several nodes concurrently.  Subclasses implement ``_run_compiled`` (and
    usually ``_compile_task_group``).

    Compilation is cached per session class and keyed by the identity of the
    runnable: running the same object again reuses its compiled form, even
    if the object was modified in between.  The cache holds nothing that
    outlives its runnable (bounded memory, however many are run).
    """

    def __init__(self) -> None:
        self._open = True

    def is_open(self) -> bool:
        return self._open

    @classmethod
    def compile(
        cls,
        runnable: Runnable,
        workspace_type: str | None = None,
        setup_net_list: list[Any] | None = None,
    ) -> CompiledRunnable:
        if isinstance(runnable, CompiledRunnable):
            assert cls == runnable.session_class, (
                'Runnable was compiled for different session type. ' +
                'Need: %s, got: %s' % (
                    cls.__name__, runnable.session_class.__name__))
            return runnable

        cached = _compile_cache.get(cls, runnable)
        if cached is not None:
            return cached

        if isinstance(runnable, TaskGroup):
            if workspace_type:
                if runnable.workspace_type():
                    assert runnable.workspace_type() == workspace_type, \
                        'Require {} but already have {}'.format(
                            workspace_type, runnable.workspace_type())
                else:
                    runnable._workspace_type = workspace_type
            tg = runnable
        else:
            if workspace_type is None:
                workspace_type = WorkspaceType.GLOBAL
            tg = TaskGroup(workspace_type=workspace_type)
            # The wrapping tasks are created directly in `tg` (Caffe2's also
            # joined whatever TaskGroup was active).
            if isinstance(runnable, Task):
                tg.add(runnable)
            elif isinstance(runnable, core.ExecutionStep):
                Task(step=runnable, group=tg)
            elif isinstance(runnable, core.Plan):
                # A Plan's steps run one after the other, so several steps
                # become the substeps of one root step.
                steps = runnable.Steps()
                assert len(steps) > 0
                if len(steps) == 1:
                    Task(step=steps[0], group=tg)
                else:
                    Task(step=list(steps), group=tg)
            else:
                step = core.execution_step('runnable', runnable)
                Task(step=step, group=tg)
        compiled = CompiledRunnable(
            cls._compile_task_group(tg, setup_net_list), session_class=cls)
        _compile_cache.put(cls, runnable, compiled)
        return compiled

    def run(
        self,
        runnable: Runnable,
        workspace_type: str | None = None,
        setup_net_list: list[Any] | None = None,
    ) -> None:
        """Runs `runnable`: a TaskGroup, Task, Plan, ExecutionStep, Net or a
        list of nets or steps.

        Args:
            runnable: the object to run.
            workspace_type: a WorkspaceType value; for anything but a
                TaskGroup the default is GLOBAL.
            setup_net_list: nets (or NetDefs) a distributed session runs to
                set up its master; unused by LocalSession.
        """
        # Real exceptions, not asserts: under `python -O` a closed session
        # must not run.
        if not self.is_open():
            raise errors.SessionClosedError('Session is closed.')
        if runnable is None:
            raise errors.InvalidArgumentError('Got a none runnable.')
        self._run_compiled(self.compile(runnable, workspace_type,
                                        setup_net_list).obj)

    def close(self) -> None:
        if self.is_open():
            self._do_close()
            self._open = False

    def fetch_output(self, output: TaskOutput) -> Any:
        raise NotImplementedError()

    def _run_compiled(self, task_group):
        raise NotImplementedError()

    @classmethod
    def _compile_task_group(cls, task_group, setup_net_list=None):
        return task_group

    def _do_close(self):
        pass

    def __enter__(self: _S) -> _S:
        if not self._open:
            raise errors.SessionClosedError('Session already closed.')
        return self

    def __exit__(
        self,
        ex_type: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if ex_type is None:
            self.close()


class _CompiledPlan(tuple):
    """What LocalSession compiles a TaskGroup to: the tuple ``(plan,
    output_list, workspace_type)``, which also keeps the plan's serialised
    form, made once at compile time (a compiled plan never changes:
    ``Plan.AddStep`` copies what it is given), so runs skip serialising it."""

    def __new__(cls, compiled):
        self = super().__new__(cls, compiled)
        self.serialized = workspace.StringifyProto(self[0])
        return self


class _NodePlan(object):
    """One node's share of a TaskGroup compiled with isolated nodes, with
    its plan serialised once (as in :class:`_CompiledPlan`)."""

    def __init__(self, node, plan, output_list):
        self.node = node
        self.plan = plan
        self.output_list = output_list
        self.serialized = workspace.StringifyProto(plan)


class _NodePlans(object):
    def __init__(self, node_plans):
        self.node_plans = node_plans


class _SessionCompile(object):
    """``compile`` of LocalSession: a classmethod which, called on a
    session created with ``isolate_nodes=True``, compiles for isolated
    nodes instead."""

    def __init__(self, func):
        self._func = func

    def __get__(self, obj, objtype=None):
        if obj is not None and getattr(obj, '_isolate_nodes', False):
            cls = _NodeIsolatedLocalSession
        else:
            cls = objtype if objtype is not None else type(obj)
        return self._func.__get__(cls, type(cls))


def _default_workspace():
    current = getattr(workspace, 'current_workspace', None)
    if current is not None:
        return current()
    return workspace.C.Workspace.current


class LocalSession(Session):
    """
    Session running in this process.

    By default (as in Caffe2) every task runs in the session workspace:
    all nodes are remapped to a single node and share it.  With
    ``isolate_nodes=True`` each node gets its own child workspace of the
    session workspace, created the first time the node is used and kept for
    the session's life; the nodes of a TaskGroup then run concurrently, each
    in its own workspace, and a task output is read from the workspace of
    the node that produced it.

    Args:
        ws: the session workspace (default: the current workspace).
        isolate_nodes: give each node its own workspace.
    """

    def __init__(self, ws: workspace.Workspace | None = None, isolate_nodes: bool = False) -> None:
        Session.__init__(self)
        self._ws = ws if ws is not None else _default_workspace()
        self._isolate_nodes = bool(isolate_nodes)
        self._node_workspaces: dict[str, workspace.Workspace] = {}
        self._node_ws_lock = threading.Lock()

    compile = _SessionCompile(vars(Session)['compile'].__func__)

    def __repr__(self) -> str:
        ws = self._ws._core
        parts = ['open' if self.is_open() else 'closed',
                 'workspace with %d blobs, %d nets' % (len(ws.local_blobs()), len(ws.nets()))]
        if self._isolate_nodes:
            with self._node_ws_lock:
                nodes = sorted(self._node_workspaces)
            parts.append('isolated nodes: %s' % (', '.join(nodes) or 'none yet'))
        return '<%s %s>' % (type(self).__name__, ', '.join(parts))

    def node_workspace(self, node: Node | str) -> workspace.Workspace:
        """The workspace of `node` (the session workspace unless the session
        isolates nodes)."""
        if not self._isolate_nodes:
            return self._ws
        name = str(node)
        with self._node_ws_lock:
            ws = self._node_workspaces.get(name)
            if ws is None:
                ws = workspace.Workspace(self._ws)
                self._node_workspaces[name] = ws
        return ws

    @classmethod
    def _compile_task_group(cls, task_group, setup_net_list=None):
        with Cluster():
            task = task_group.to_task()
        plan = core.Plan('task_group_plan')
        plan.AddStep(task.get_step())
        # Caffe2 stores the bound method, not its result: the PRIVATE test
        # in _run_compiled never holds, and the plan always runs in the
        # session workspace.
        return _CompiledPlan((plan, task.output_list(), task.workspace_type))

    def _run_compiled(self, compiled):
        if isinstance(compiled, _NodePlans):
            return self._run_node_plans(compiled)
        plan, output_list, workspace_type = compiled
        if not isinstance(compiled, _CompiledPlan):
            # Compiled by an override of _compile_task_group.
            compiled = _CompiledPlan(compiled)

        # Outputs must live in the session workspace, so that tasks running
        # in child workspaces write them there.
        outputs = []
        for name in output_list.names():
            self._ws.create_blob(str(name))
            outputs.append(core.BlobReference(str(name)))
        output_list.set_values(outputs, _fetch_func=self._fetch_output)
        task_ws = (
            workspace.Workspace(self._ws)
            if workspace_type == WorkspaceType.PRIVATE else self._ws)
        task_ws._run_plan_bytes(compiled.serialized)

    def _run_node_plans(self, compiled):
        runs = []
        for node_plan in compiled.node_plans:
            node_ws = self.node_workspace(node_plan.node)
            outputs = []
            for name in node_plan.output_list.names():
                node_ws.create_blob(str(name))
                outputs.append(core.BlobReference(str(name)))
            node_plan.output_list.set_values(
                outputs, _fetch_func=_Fetcher(node_ws))
            runs.append((node_ws, node_plan))

        if len(runs) == 1:
            ws, node_plan = runs[0]
            ws._run_plan_bytes(node_plan.serialized)
            return
        errors = [None] * len(runs)

        def run_one(i, ws, node_plan):
            try:
                ws._run_plan_bytes(node_plan.serialized)
            except BaseException as e:  # re-raised in the calling thread
                errors[i] = e

        threads = [
            threading.Thread(target=run_one, args=(i, ws, node_plan),
                             name='ferrocaffe-node-%d' % i)
            for i, (ws, node_plan) in enumerate(runs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for e in errors:
            if e is not None:
                raise e

    def _fetch_output(self, output):
        return self._ws.fetch_blob(str(output))

    def fetch_output(self, output: TaskOutput | str | core.BlobReference) -> Any:
        """The value of a TaskOutput, or of a blob of the session
        workspace: a copy (writing to it does not change the blob)."""
        if hasattr(output, 'fetch'):
            return output.fetch()
        return self._fetch_output(output)


class _Fetcher(object):
    def __init__(self, ws):
        self._ws = ws

    def __call__(self, output):
        return self._ws.fetch_blob(str(output))


class _NodeIsolatedLocalSession(LocalSession):
    """Compiles TaskGroups for a LocalSession with isolated nodes: one plan
    per node, each running in that node's workspace."""

    @classmethod
    def _compile_task_group(cls, task_group, setup_net_list=None):
        node_plans = []
        with Cluster():
            grouped = task_group.tasks_by_node()
            tasks = grouped.tasks()
        for task in tasks:
            plan = core.Plan('task_group_plan')
            plan.AddStep(task.get_step())
            node_plans.append(
                _NodePlan(task.node, plan, task.output_list()))
        return _NodePlans(node_plans)
