"""Tasks, task groups, nodes and task outputs (Caffe2's
``caffe2.python.task``).

A :class:`Task` is an execution step plus the blobs it returns to the client.
Tasks are gathered in a :class:`TaskGroup`; a Session runs the group, all of
its tasks concurrently.  Each task is placed on a :class:`Node` (by name):
tasks of one node share that node's workspace.
"""

from collections import OrderedDict
from copy import copy

from ferrocaffe import context, core, errors, net_builder, schema

__all__ = [
    'NODE_KWARGS',
    'check_node_kwargs',
    'Cluster',
    'Node',
    'WorkspaceType',
    'get_setup_nets',
    'add_setup_steps',
    'TaskGroup',
    'TaskOutput',
    'TaskOutputList',
    'final_output',
    'Task',
    'SetupNets',
]


#: The keyword arguments a Node takes: where a distributed session places
#: it (see ``ferrocaffe.distributed``; LocalSession runs every node here and
#: ignores them).
NODE_KWARGS = ('num_cpus', 'num_gpus', 'memory', 'resources',
               'label_selector', 'node_id', 'soft', 'num_threads')


def check_node_kwargs(node, kwargs):
    """Raises InvalidArgumentError, naming the node, for a keyword that is
    not in NODE_KWARGS (with the closest names) or a value of the wrong
    type. ``None`` values mean "not given"."""
    import difflib

    for key in sorted(kwargs):
        if key not in NODE_KWARGS:
            close = difflib.get_close_matches(key, NODE_KWARGS, n=3, cutoff=0.6)
            raise errors.InvalidArgumentError(
                "Node '%s': unknown keyword argument %s%s; accepted: %s"
                % (node, key,
                   " (did you mean %s?)" % ' or '.join(close) if close else '',
                   ', '.join(NODE_KWARGS)),
                node=str(node))

    def number(key, minimum):
        value = kwargs[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not value >= minimum:
            raise errors.InvalidArgumentError(
                "Node '%s': %s must be a number >= %s, got %r"
                % (node, key, minimum, value), node=str(node))

    for key, minimum in (('num_cpus', 0), ('num_gpus', 0), ('memory', 0),
                         ('num_threads', 1)):
        if kwargs.get(key) is not None:
            number(key, minimum)
    for key in ('resources', 'label_selector'):
        if kwargs.get(key) is not None and not isinstance(kwargs[key], dict):
            raise errors.InvalidArgumentError(
                "Node '%s': %s must be a dict, got %r"
                % (node, key, kwargs[key]), node=str(node))


def _merge_node_kwargs(new, old):
    # The newest value of each keyword wins (Caffe2 kept the first, so a
    # node described wrongly once stayed wrong in the process-wide Cluster).
    if new is None:
        return old
    if old is None:
        return new
    merged = copy(old)
    merged.update(new)
    return merged


class Cluster(context.DefaultManaged):
    """
    Records the names of the nodes used while it is active.  A default
    Cluster is created the first time a Node is needed, so users rarely have
    to create one.
    """

    def __init__(self):
        # A list, not a set, to keep the order of first use.
        self._nodes = []
        self._node_kwargs = {}

    def add_node(self, node):
        name = str(node)
        if name not in self._nodes:
            self._nodes.append(name)
        self._node_kwargs[name] = _merge_node_kwargs(
            node.kwargs(), self._node_kwargs.get(name))

    def nodes(self):
        """The unique node names used within this context, in order."""
        return self._nodes

    def node_kwargs(self):
        return self._node_kwargs

    def __repr__(self):
        return 'Cluster(nodes={}, node_kwargs={})'.format(
            self.nodes(), self.node_kwargs())


class Node(context.DefaultManaged):
    """
    Tasks created while a Node is active run on that node.  Only the name
    matters: two Node objects with the same name are the same node.

        with TaskGroup() as tg:
            with Node('node1'):
                Task(step=s1)
            with Node('node2'):
                Task(step=s2)
            with Node('node1'):
                Task(step=s3)

    All three tasks run concurrently; s1 and s3 share node1's workspace.
    Keyword arguments (NODE_KWARGS: ``num_cpus``, ``resources``, ...)
    place the node in a distributed session; any other keyword, or a value
    of the wrong type, raises InvalidArgumentError here. Given again for a
    name, a keyword's newest value wins.
    """

    def __init__(self, node='local', **kwargs):
        self._name = str(node)
        # Checked here, before the Cluster records them, so that a typo
        # fails where it is written and never sticks to the node's name.
        check_node_kwargs(self._name, kwargs)
        self._kwargs = kwargs
        Cluster.current().add_node(self)

    def __str__(self):
        return self._name

    def __repr__(self):
        return 'Node(name={}, kwargs={})'.format(self._name, self._kwargs)

    def kwargs(self):
        return self._kwargs


class WorkspaceType(object):
    """
    Whether the tasks of a TaskGroup run directly in the node's global
    workspace, kept across runs (GLOBAL), or in a child workspace created for
    the run and destroyed after it (PRIVATE).
    """
    PRIVATE = 'private'
    GLOBAL = 'global'


def _collect_setup(result, into):
    if isinstance(result, (list, tuple)):
        into.extend(result)
    elif isinstance(result, (core.Net, core.ExecutionStep)):
        into.append(result)
    elif result is not None:
        raise TypeError('Unsupported type for setup: %s' % type(result))


def get_setup_nets(key, steps_or_nets, target):
    """
    Gathers the setup objects attached under ``key`` to the given steps or
    nets and returns ``(init_nets, exit_nets)``.

    Each object's ``setup(init_net)`` and ``exit(exit_net)`` may add ops to
    the shared scratch nets or return a Net, a step, or a list of them.  An
    object is used once only, and is skipped if its ``_setup_target`` is not
    ``target``.
    """
    init_net = core.Net(key + '/init')
    exit_net = core.Net(key + '/exit')
    init_nets = []
    exit_nets = []
    objs = []
    for step_or_net in steps_or_nets:
        if hasattr(step_or_net, 'get_all_attributes'):
            objs += step_or_net.get_all_attributes(key)
        elif hasattr(step_or_net, 'get_attributes'):
            objs += step_or_net.get_attributes(key)
    for obj in objs:
        if getattr(obj, '_setup_used', False):
            continue
        if hasattr(obj, '_setup_target') and obj._setup_target != target:
            continue
        if hasattr(obj, 'setup'):
            _collect_setup(obj.setup(init_net), init_nets)
            obj._setup_used = True
        if hasattr(obj, 'exit'):
            _collect_setup(obj.exit(exit_net), exit_nets)
            obj._setup_used = True

    if len(init_net.Proto().op) > 0:
        init_nets.insert(0, init_net)
    if len(exit_net.Proto().op) > 0:
        exit_nets.insert(0, exit_net)
    return init_nets, exit_nets


def add_setup_steps(step, init_nets, exit_nets, name):
    """Wraps ``step`` between ``<name>:init`` and ``<name>:exit`` steps."""
    if not init_nets and not exit_nets:
        return step
    steps = []
    if init_nets:
        steps.append(core.execution_step('%s:init' % name, init_nets))
    steps.append(step)
    if exit_nets:
        steps.append(core.execution_step('%s:exit' % name, exit_nets))
    return core.execution_step(name, steps)


class TaskGroup(context.Managed):
    """
    Gathers tasks that run concurrently, possibly on several nodes.  Tasks
    of one node share a workspace; tasks of different nodes cannot see each
    other's blobs.  The group finishes when its last task finishes.

        with TaskGroup() as tg:
            Task(step=s1)              # node 'local'
            with Node('n1'):
                Task(step=s2)
            with Node('n2'):
                Task(step=s3)
        session.run(tg)                # s1, s2 and s3 run in parallel
    """
    LOCAL_SETUP = net_builder.LOCAL_SETUP

    def __init__(self, workspace_type=None):
        self._plan_cache = None
        self._tasks = []
        self._already_used = False
        self._prev_active = None
        self._tasks_to_add = []
        self._report_nets = {}
        self._report_steps = []
        self._workspace_type = workspace_type
        self._tasks_by_node = None
        self._remote_nets = []

    def add_remote_net(self, net):
        self._remote_nets.append(net)

    def remote_nets(self):
        return self._remote_nets

    def add(self, task):
        assert not self._already_used, (
            'Cannot add Task to an already used TaskGroup.')
        assert (
            self._workspace_type is None or
            task._workspace_type is None or
            self._workspace_type == task._workspace_type)
        if task._workspace_type is None:
            task._workspace_type = (
                self._workspace_type or WorkspaceType.PRIVATE)
        if self._workspace_type is None:
            self._workspace_type = task._workspace_type
        task._notify_used()
        self._tasks.append(task)

    def tasks(self):
        """Adds the pending tasks, marks the group used and returns them."""
        for task in self._tasks_to_add:
            self.add(task)
        self._tasks_to_add = []
        self._already_used = True
        return self._tasks

    def num_registered_tasks(self):
        return len(self._tasks_to_add) + len(self._tasks)

    def used_nodes(self):
        used = []
        for task in self._tasks + self._tasks_to_add:
            if task.node not in used:
                used.append(task.node)
        return used

    def report_step(self, step=None, node=None, interval_ms=1000):
        """
        Adds a step run every `interval_ms` milliseconds on the node while
        the group runs there, and once more after all its tasks finished.
        """
        step = core.to_execution_step(step)
        step.RunEveryMillis(interval_ms)
        self._report_steps.append((str(node or Node.current(node)), step))

    def report_net(self, net=None, node=None, report_interval=5):
        """
        DEPRECATED. Use report_step instead.
        """
        node = str(node or Node.current(node))
        assert net is None or node not in self._report_nets
        if node not in self._report_nets:
            self._report_nets[node] = (
                net if net else core.Net('%s/reporter' % node),
                report_interval)
        return self._report_nets[node][0]

    def tasks_by_node(self, node_remap=None):
        """
        Returns a new TaskGroup holding one task per (remapped) node, which
        runs that node's tasks concurrently between the node's local init
        and exit.  Can only be computed once: a later call must use the same
        mapping and gets the same group back.
        """
        node_map = {}
        for task in self.tasks():
            node_map[task.node] = (
                node_remap(task.node) if node_remap else task.node)
        if self._tasks_by_node is not None:
            tasks_by_node, prev_node_map = self._tasks_by_node
            assert prev_node_map == node_map, (
                'Cannot call tasks_by_node multiple times.')
            return tasks_by_node

        # report_net is deprecated: turn its nets into report steps.
        for node, (net, interval) in list(self._report_nets.items()):
            self.report_step(net, node=node, interval_ms=interval * 1000)
        self._report_nets = {}

        tasks_by_node = OrderedDict()
        for task in self.tasks():
            tasks_by_node.setdefault(node_map[task.node], []).append(task)

        report_steps_by_node = {}
        for original_node, step in self._report_steps:
            mapped = node_map.get(original_node, original_node)
            report_steps_by_node.setdefault(mapped, []).append(step)

        grouped_by_node = TaskGroup()
        for node, tasks in tasks_by_node.items():
            report_steps = report_steps_by_node.get(node, [])
            node_inits, node_exits = get_setup_nets(
                TaskGroup.LOCAL_SETUP,
                [t.get_step() for t in tasks] + report_steps,
                self)
            steps = list(report_steps)
            outputs = []
            grouped_workspace_type = WorkspaceType.PRIVATE
            for task in tasks:
                step = task.get_step()
                step.SetCreateWorkspace(
                    task.workspace_type() == WorkspaceType.PRIVATE)
                steps.append(step)
                outputs += task.outputs()
                # One GLOBAL task makes the whole node GLOBAL.
                if task.workspace_type() == WorkspaceType.GLOBAL:
                    grouped_workspace_type = WorkspaceType.GLOBAL
            if len(steps) == 0:
                steps.append(core.execution_step('empty', []))
            if len(steps) == 1:
                step = steps[0]
            else:
                step = core.execution_step(
                    '%s:body' % node, steps, concurrent_substeps=True)
            step = add_setup_steps(step, node_inits, node_exits, node)
            Task(
                node=node, step=step, outputs=outputs,
                name='grouped_by_node',
                group=grouped_by_node, workspace_type=grouped_workspace_type)
        self._tasks_by_node = (grouped_by_node, node_map)
        return grouped_by_node

    def to_task(self, node=None):
        """All tasks of the group as a single task running on `node`."""
        node = str(Node.current(node))
        tasks = self.tasks_by_node(lambda x: node).tasks()
        if len(tasks) == 0:
            # An empty task of its own (Caffe2's would join whatever
            # TaskGroup happens to be active).
            return Task(node=node, group=TaskGroup())
        return tasks[0]

    def workspace_type(self):
        return self._workspace_type

    def __repr__(self):
        return 'TaskGroup(tasks={}, workspace_type={}, remote_nets={})'.format(
            self._tasks + self._tasks_to_add,
            self.workspace_type(),
            self.remote_nets())


class TaskOutput(object):
    """
    The output of a task: a blob, a list of blobs, or a schema record.
    After the session ran the task, `get()` returns the value set by the
    session and `fetch()` fetches the current value from the workspace.
    """

    def __init__(self, names):
        self._schema = None
        self._is_scalar = False
        if isinstance(names, schema.Field):
            self._schema = names
            names = self._schema.field_blobs()
        self._is_scalar = type(names) not in (tuple, list)
        if self._is_scalar:
            names = [names]
        self.names = names
        self._values = None
        self._fetch_func = None

    def set(self, values, _fetch_func=None):
        if len(values) != len(self.names):
            raise errors.InvalidArgumentError(
                'TaskOutput of %d blobs given %d values'
                % (len(self.names), len(values)))
        self._values = values
        self._fetch_func = _fetch_func

    # Real exceptions, not asserts: under `python -O` a read before the run
    # must not return None.
    def get(self):
        if self._values is None:
            raise errors.OutputNotReadyError('Output value not set yet.')
        if self._is_scalar:
            return self._values[0]
        elif self._schema:
            return schema.from_blob_list(self._schema, self._values)
        else:
            return self._values

    def fetch(self):
        """The current value of the output's blobs, fetched again from the
        workspace of the node that ran the task: numpy copies, which a write
        does not change."""
        if self._fetch_func is None:
            raise errors.OutputNotReadyError(
                'Cannot fetch value for this output.')
        fetched_vals = [self._fetch_func(v) for v in self._values]
        if self._is_scalar:
            return fetched_vals[0]
        elif self._schema:
            return schema.from_blob_list(self._schema, fetched_vals)
        else:
            return fetched_vals

    def __repr__(self):
        return 'TaskOutput(names={}, values={})'.format(
            self.names, self._values)


def final_output(blob_or_record):
    """
    Adds an output to the active Task (or to a new task if none is active).
    Its value is available once the TaskGroup ran on the task's node.
    """
    cur_task = Task.current(required=False) or Task()
    return cur_task.add_output(blob_or_record)


class TaskOutputList(object):
    """The list of outputs of a task."""

    def __init__(self, outputs=None):
        self.outputs = outputs or []

    def names(self):
        """All the blob names of the outputs, in order."""
        names = []
        for o in self.outputs:
            names += o.names
        return names

    def set_values(self, values, _fetch_func=None):
        # Checked before any output is set (a real exception, not an assert).
        if sum(len(o.names) for o in self.outputs) != len(values):
            raise errors.InvalidArgumentError('Wrong number of output values.')
        offset = 0
        for o in self.outputs:
            num = len(o.names)
            o.set(values[offset:offset + num], _fetch_func)
            offset += num

    def __repr__(self):
        return 'TaskOutputList(outputs={})'.format(self.outputs)


class Task(context.Managed):
    """
    An execution step plus zero or more outputs, run as part of a TaskGroup.

    The usual way to build one is as a context, with `net_builder.ops`:

        with Node('trainer'), Task(name='my_task', num_instances=2):
            with ops.task_init():
                globl = ops.Const(0)
            with ops.task_instance_init():
                local = ops.Const(0)
            with ops.loop(100):
                ops.Copy(globl, local)
            with ops.task_instance_exit():
                ops.Add([globl, local], [globl])
            with ops.task_exit():
                ops.Mul([globl, globl], [globl])

    Both instances run in parallel, each in its own child workspace; the
    task-level init runs before them and the task-level exit after both.
    """

    # Runs once per task, before/after all of its concurrent instances.
    TASK_SETUP = net_builder.TASK_SETUP
    # Runs once in each instance of the task.
    TASK_INSTANCE_SETUP = net_builder.TASK_INSTANCE_SETUP
    REPORT_STEP = net_builder.REPORT_STEP
    # Full names of the tasks created outside of any TaskGroup.
    _global_names_used = set()

    @staticmethod
    def _get_next_name(node, group, name):
        basename = str(node) + '/' + str(name)
        if group is None:
            names_used = Task._global_names_used
        else:
            names_used = set(t.name for t in group._tasks_to_add)
        cur_name = basename
        i = 0
        while cur_name in names_used:
            i += 1
            cur_name = '%s:%d' % (basename, i)
        if group is None:
            Task._global_names_used.add(cur_name)
        return cur_name

    def __init__(
            self, step=None, outputs=None,
            workspace_type=None, group=None, node=None, name=None,
            num_instances=None):
        """
        Creates a Task and registers it with the current TaskGroup.

        Args:
           step:    the ExecutionStep (or anything `to_execution_step`
                    accepts) the task runs.
           outputs: blobs or records returned to the client at the end.
           workspace_type: WorkspaceType of the task.
           group:   the TaskGroup to join (default: the active one).
           node:    the node to run on (default: the active Node).
           name:    name of the task (default: the step's name, or 'task').
           num_instances: number of concurrent copies run at runtime.
        """
        if not name and isinstance(step, core.ExecutionStep):
            name = step.Proto().name
        if not name:
            name = 'task'
        node_obj = Node.current(None if node is None else Node(node))
        self.node = str(node_obj)
        # What the user said about the node, for distributed sessions.
        self._node_kwargs = dict(node_obj.kwargs() or {})
        self.group = TaskGroup.current(group, required=False)

        self.name = Task._get_next_name(self.node, self.group, name)

        # Removed again while the task is used as a context.
        if self.group is not None:
            self.group._tasks_to_add.append(self)

        self._already_used = False
        self._step = None
        self._step_with_setup = None
        self._outputs = []
        self._net_builder = None
        if step is not None:
            self.set_step(step)
        if outputs is not None:
            self.add_outputs(outputs)

        self._pipeline = None
        self._is_pipeline_context = False
        self._workspace_type = workspace_type
        self._report_net = None
        self._num_instances = num_instances

    def __enter__(self):
        # Checked before entering, so that a refused Task does not stay
        # active.
        self._assert_not_used()
        assert self._step is None, 'This Task already has an execution step.'
        super(Task, self).__enter__()
        # Tasks created inside this one must come before it in the group.
        if self.group is not None:
            self.group._tasks_to_add.remove(self)
        self._net_builder = net_builder.NetBuilder(_fullname=self.name)
        self._net_builder.__enter__()
        return self

    def __exit__(self, type, value, traceback):
        super(Task, self).__exit__(type, value, traceback)
        self._net_builder.__exit__(type, value, traceback)
        if type is None:
            self.set_step(self._net_builder)
        if self.group is not None:
            self.group._tasks_to_add.append(self)
        self._net_builder = None

    def workspace_type(self):
        return self._workspace_type

    def _assert_not_used(self):
        assert not self._already_used, (
            'Cannot modify task since it is already been used.')

    def add_output(self, output):
        self._assert_not_used()
        output = (
            output if isinstance(output, TaskOutput) else TaskOutput(output))
        self._outputs.append(output)
        return output

    def add_outputs(self, outputs):
        self._assert_not_used()
        if type(outputs) not in (list, tuple):
            return self.add_output(outputs)
        return [self.add_output(output) for output in outputs]

    def set_step(self, step):
        self._assert_not_used()
        self._step = core.to_execution_step(step)

    def get_step(self):
        """
        The task's complete step (computed once):

            <name>                 task init, then the instances, then exit
              <name>:instance      per instance: init, body, exit
                <name>:body        report steps + the task's step
        With num_instances > 1 the instance step runs in a fresh workspace,
        num_instances times concurrently, inside `<name>:parallel`.
        """
        if self._step_with_setup is not None:
            return self._step_with_setup

        if self._step is None:
            self._step_with_setup = core.execution_step(self.name, [])
            return self._step_with_setup

        report_steps = [
            s
            for s in self._step.get_all_attributes(Task.REPORT_STEP)
            if not hasattr(s, '_report_step_used')
        ]
        for step in report_steps:
            step._report_step_used = True
            if not step.Proto().run_every_ms:
                step.RunEveryMillis(1000)
        task_init_nets, task_exit_nets = get_setup_nets(
            Task.TASK_SETUP, [self._step] + report_steps, self)
        instance_init_nets, instance_exit_nets = get_setup_nets(
            Task.TASK_INSTANCE_SETUP, [self._step] + report_steps, self)
        if len(self._outputs) == 0:
            # Every task returns something: a dummy int32 scalar.
            output_net = core.Net('%s:output' % self.name)
            self.add_output(output_net.ConstantFill(
                [], 1, dtype=core.DataType.INT32, value=0))
            task_exit_nets.append(output_net)

        body = self._step if not report_steps else core.execution_step(
            '%s:body' % self.name, report_steps + [self._step])
        step_with_instance_setup = add_setup_steps(
            body, instance_init_nets, instance_exit_nets,
            self.name + ':instance')
        if self._num_instances and self._num_instances > 1:
            step_with_instance_setup.SetCreateWorkspace(True)
            step_with_instance_setup = core.execution_step(
                '%s:parallel' % self.name,
                [step_with_instance_setup],
                num_concurrent_instances=self._num_instances)
        self._step_with_setup = add_setup_steps(
            step_with_instance_setup, task_init_nets, task_exit_nets,
            self.name)
        return self._step_with_setup

    def output_list(self):
        return TaskOutputList(self._outputs)

    def outputs(self):
        return self._outputs

    def _notify_used(self):
        self.get_step()
        self._already_used = True

    def __repr__(self):
        return 'Task(name={}, node={}, outputs={})'.format(
            self.name, self.node, self.outputs())


class SetupNets(object):
    """
    A setup object running fixed nets at the start and the end of a Task or
    of a TaskGroup's run on a node.  Attach it to a net:

        net.add_attribute(Task.TASK_SETUP, SetupNets([init_net]))
        net.add_attribute(TaskGroup.LOCAL_SETUP, SetupNets([init_net]))

    The first form runs `init_net` once at the start of the task using `net`;
    the second once per node, before any task of the group starts there.
    One SetupNets object runs only once even if attached to several nets.
    """

    def __init__(self, init_nets=None, exit_nets=None):
        self.init_nets = init_nets
        self.exit_nets = exit_nets

    def setup(self, init_net):
        return self.init_nets

    def exit(self, exit_net):
        return self.exit_nets

    def __repr__(self):
        return 'SetupNets(init_nets={}, exit_nets={})'.format(
            self.init_nets, self.exit_nets)
