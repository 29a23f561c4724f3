"""Block-structured construction of nets and steps (Caffe2's
``caffe2.python.net_builder``).

A :class:`NetBuilder` collects nets and nested builders.  The module-level
``ops`` object forwards every call to the current net of the innermost active
builder and offers the control-flow blocks:

    with NetBuilder() as nb:
        count = ops.Const(3)
        total = ops.Const(0)
        with ops.loop(count) as loop:
            ops.Add([total, loop.iter()], [total])
    step = core.to_execution_step(nb)

Two families of control flow exist:

* stop-blob based (``loop``, ``stop_guard``, ``If``/``Elif``/``Else``,
  ``stop``/``stop_if``): each block becomes its own execution step whose
  ``should_stop_blob`` ends it;
* control-operator based (``IfNet``/``Else``, ``WhileNet``/``Condition``):
  the block is compiled into one net that uses the ``If``/``While``/``Do``
  operators (see :mod:`ferrocaffe.control_ops_util`).
"""

import sys

from ferrocaffe import context, core
from ferrocaffe.control_ops_util import add_if_op, add_while_op

__all__ = ['NetBuilder', 'Operations', 'ops']

# Attribute keys under which setup and report objects are attached to nets.
# ``task.Task`` / ``task.TaskGroup`` expose the same values as class
# constants (they are defined here because this module sits below task.py).
TASK_SETUP = 'task_setup'
TASK_INSTANCE_SETUP = 'task_instance_setup'
REPORT_STEP = 'report_step'
LOCAL_SETUP = 'local_setup'


def _task_module():
    # The one documented upward import (docs/python.md): task builds
    # on this module, and Caffe2's ops.task_group() / ops.task_reporter()
    # make or find a TaskGroup, so they import it when called.
    from ferrocaffe import task
    return task


def _is_task_group(obj):
    return (hasattr(obj, 'tasks_by_node') and hasattr(obj, 'to_task')
            and not isinstance(obj, (core.Net, core.ExecutionStep)))


class NetBuilder(context.Managed):
    """
    Collects nets, steps and nested builders into a block of execution.

    Args:
      name: the builder's name; nested builders prefix it with their parent's.
      initial_scope: blob names visible to control-operator blocks besides
        the ones inherited from the parent.

    Once exited (or converted with ``core.to_execution_step``) the builder is
    frozen and cannot be modified.
    """

    def __init__(self, name=None, initial_scope=None, _stop_blob_required=False,
                 _stop_blob=None, _fullname=None, _use_control_ops=False):
        parent = NetBuilder.current(required=False)
        assert not _fullname or not name, 'Cannot set both _fullname and name'
        assert not _use_control_ops or \
            (not _stop_blob_required and not _stop_blob), \
            'Stop blobs are not used with control operators'
        if _fullname:
            self.name = _fullname
        else:
            parts = [parent.name if parent else None, name]
            self.name = '/'.join(p for p in parts if p)
        self._frozen = False
        self._current_net = None
        self._children = []
        if parent:
            # The parent's scope must reflect everything added so far.
            parent._update_lexical_scope()
            self._init_lexical_scope = set(parent._lexical_scope)
        else:
            self._init_lexical_scope = set()
        if initial_scope:
            self._init_lexical_scope |= set(str(b) for b in initial_scope)
        self._lexical_scope = set(self._init_lexical_scope)
        self._stop_blob = _stop_blob
        self._stop_blob_required = _stop_blob_required
        self._use_control_ops = _use_control_ops

    # -- stop blob --------------------------------------------------------

    def stop_blob(self):
        """
        Returns this builder's stop blob, creating it on first use.

        The blob is reset to False in the current net.  If that net is not
        the builder's first child, a ``stop_blob_init`` net doing the same is
        put first, so the flag exists before the step starts.
        """
        assert not self._use_control_ops, \
            'Stop blobs are not used with control operators'
        if self._stop_blob is None:
            net = self.current_net()
            self._stop_blob = core.BlobReference(
                net.NextName('stop_blob'), net=net)
            net.Const(False, blob_out=self._stop_blob)
            if self._current_net is not self._children[0]:
                init_net = core.Net('stop_blob_init')
                init_net.Const(False, blob_out=self._stop_blob)
                self._children.insert(0, init_net)
        return self._stop_blob

    def stop_if(self, blob):
        assert not self._use_control_ops, \
            'Stop blobs are not used with control operators'
        stop_blob = self.stop_blob()
        ops.Or([stop_blob, blob], [stop_blob])
        # Ops added after this go into a new net, so that the executor checks
        # the flag in between.
        self._current_net = None

    # -- children ---------------------------------------------------------

    def _assert_mutable(self):
        assert not self._frozen, (
            'This NetBuilder (%s) has been built already.' % self.name)

    def _update_lexical_scope(self):
        """Recomputes the set of blob names visible at the end of the block."""
        scope = set(self._init_lexical_scope)
        for child in self._children:
            if isinstance(child, core.Net):
                scope |= set(str(b) for b in child.UsedBlobNames())
            elif isinstance(child, NetBuilder) and child._use_control_ops:
                scope |= child._lexical_scope
        self._lexical_scope = scope

    def _reset_children(self):
        self._current_net = None
        self._children = []
        self._lexical_scope = set(self._init_lexical_scope)

    def add(self, child):
        self._assert_mutable()
        if self._use_control_ops:
            assert isinstance(child, core.Net) or (
                isinstance(child, NetBuilder) and child._use_control_ops), \
                'Expected Net or NetBuilder with control ops'
        self._current_net = None
        self._children.append(child)
        if isinstance(child, core.Net):
            self._current_net = child
        self._update_lexical_scope()
        return child

    def current_net(self, name=None):
        self._assert_mutable()
        if self._current_net is None or name is not None:
            self.add(core.Net(name))
        return self._current_net

    def freeze(self):
        for child in self._children:
            if hasattr(child, 'freeze'):
                child.freeze()
        self._current_net = None
        self._frozen = True

    def get(self):
        """Freezes the builder and returns its children."""
        self.freeze()
        # A TaskGroup added with ``ops.task_group()`` runs as the step of its
        # tasks regrouped on one node (Caffe2 could not convert it at all).
        for i, child in enumerate(self._children):
            if _is_task_group(child):
                self._children[i] = _task_group_to_step(child)
        return self._children

    def _before_exit(self):
        """Hook for subclasses: work done on a clean exit, while the
        builder is still the active one."""

    def __exit__(self, etype, *args):
        if etype is None:
            try:
                self._before_exit()
            except BaseException:
                # Leave the context anyway so that it does not stay active.
                super(NetBuilder, self).__exit__(*sys.exc_info())
                self.freeze()
                raise
        super(NetBuilder, self).__exit__(etype, *args)

        if self._use_control_ops and len(self._children) > 0:
            children = self._children
            self._reset_children()
            merged_net = NetBuilder.merge_nets(children, self._lexical_scope)
            assert merged_net, 'Expected a non-empty merge of children'
            self._children = [merged_net]

        self.freeze()
        if etype is not None:
            return
        assert (not self._stop_blob_required) or self._stop_blob is not None, (
            'This NetBuilder (%s) requires a stop condition ' % self.name +
            'to be set with `stop` or `stop_if`')

    @staticmethod
    def merge_nets(nets_or_builders, outer_blob_names):
        """
        Appends the given nets (or single-net control-op builders) to the
        first one and keeps only the external outputs named in
        ``outer_blob_names``: a blob that is an output of an inner block but
        was created inside the enclosing block stays local to it.
        Returns None for an empty list.
        """
        net = None
        for n in nets_or_builders:
            if isinstance(n, NetBuilder):
                assert n._use_control_ops, \
                    'Merging of NetBuilder supported only for control ops'
                nets = n.get()
                assert len(nets) == 1 and isinstance(nets[0], core.Net), \
                    'Invalid control op net builder'
                cur = nets[0]
            else:
                assert isinstance(n, core.Net)
                cur = n
            if net is not None:
                net.AppendNet(cur)
            else:
                net = cur
        if net is not None:
            proto = net.Proto()
            kept = [o for o in proto.external_output if o in outer_blob_names]
            del proto.external_output[:]
            proto.external_output.extend(kept)
        return net

    def __str__(self):
        return self.name or 'Un-named NetBuilder'


def _task_group_to_step(task_group):
    task = _task_module()
    with task.Cluster():
        with task.Node('local'):
            grouped = task_group.to_task()
    return grouped.get_step()


class Operations(object):
    """
    Operations to be used in the context of a NetBuilder.  Any attribute not
    defined here is looked up on the current net of the active builder, so
    ``ops.Add(...)``, ``ops.Const(...)`` or ``ops.NextScopedBlob(...)`` all
    act on that net.
    """

    def net(self, net=None, name=None):
        """
        Returns the current net, or adds a net to the active builder.
        Args:
            net:  if given, this Net (or ExecutionStep) is added to the active
                  builder and returned.
            name: if given, a new Net with this name is created and becomes
                  the current net.  Cannot be combined with `net`.
        """
        assert name is None or net is None, (
            'Cannot provide both `net` and `name`.')
        if net is not None:
            NetBuilder.current().add(net)
            return net
        return NetBuilder.current().current_net(name=name)

    def __getattr__(self, op_type):
        """Forwards to the current net of the active NetBuilder."""
        if op_type.startswith('__'):
            raise AttributeError(op_type)
        # hasattr(ops, X) must be False when no builder is active.
        if NetBuilder.current(required=False) is None:
            raise AttributeError('No active NetBuilder.')
        return getattr(self.net(), op_type)

    def task_group(self):
        """
        Creates a local TaskGroup that runs as the next step of the current
        NetBuilder.  Its tasks are regrouped on a single node when the
        builder is converted into an execution step.
        """
        task = _task_module()
        builder = NetBuilder.current()
        with task.Cluster():
            with task.Node('local'):
                tg = task.TaskGroup()
                builder.add(tg)
                return tg

    def stop(self):
        """
        Stops the execution of the current block unconditionally.
            ops.Print(a, [])
            ops.stop()
            ops.Print(b, [])   # never runs
        """
        return self.stop_if(ops.Const(True))

    def stop_if(self, blob):
        """
        Stops the execution of the current block if the scalar bool `blob`
        is True.  The ops that follow run only when it is False.
        """
        return NetBuilder.current().stop_if(blob)

    def loop(self, iters=None, name=None):
        """
        Block executed repeatedly as the next step of the current builder.
        With `iters` (a number or a blob holding one) it runs that many
        times and `loop.iter()` is the 0-based iteration counter; without it
        the block must end itself with `ops.stop_if` / `ops.stop`.
            with ops.loop(3) as loop:
                ops.Print(loop.iter(), [])    # prints 0, 1, 2
        """
        return NetBuilder.current().add(_Loop(iters, name=name))

    def stop_guard(self, has_stopped_blob=None, name=None):
        """
        Block executed once; a `stop` inside it only ends the block.
        `guard.has_stopped()` is a bool blob telling whether it was stopped.
        """
        return NetBuilder.current().add(
            _StopGuard(has_stopped_blob=has_stopped_blob, name=name))

    def If(self, cond, name=None):
        """
        Block executed once if the scalar bool `cond` is True.  Chain with
        `.Elif(cond)` and `.Else()` on the returned object:
            with ops.If(c1) as b:
                ...
            with b.Elif(c2) as b:
                ...
            with b.Else():
                ...
        """
        return NetBuilder.current().add(_RunIf(cond, name=name))

    def IfNet(self, cond, name=None):
        """Like `If`, but compiled into a net using the `If` operator."""
        return NetBuilder.current().add(_RunIfNet(cond, name=name))

    def Else(self, name=None):
        """Else branch of the `IfNet` block that immediately precedes it."""
        return _RunElseNet(name=name)

    def WhileNet(self, name=None):
        """Loop compiled into a net using the `While` operator; its condition
        is given by an `ops.Condition()` block placed first in the body."""
        return NetBuilder.current().add(_RunWhileNet(name=name))

    def Condition(self, name=None):
        """Condition of the enclosing `WhileNet`; the single output of its
        last operator is the loop condition."""
        assert isinstance(NetBuilder.current(), _RunWhileNet), \
            'Use of Condition outside of WhileNet'
        return _RunWhileCondition(name=name)

    def task_init(self):
        """
        Ops run once when the task starts, before all its instances.  They
        are attached to the current net, so processors that do not see the
        Task can still declare them.
        """
        setup = _SetupBuilder(_SetupBuilder.INIT)
        self.net().add_attribute(TASK_SETUP, setup)
        return setup

    def task_exit(self):
        """Ops run once when the task ends, after all its instances."""
        setup = _SetupBuilder(_SetupBuilder.EXIT)
        self.net().add_attribute(TASK_SETUP, setup)
        return setup

    def task_instance_init(self):
        """Ops run at the start of each instance of the task, after the
        task-level init."""
        setup = _SetupBuilder(_SetupBuilder.INIT)
        self.net().add_attribute(TASK_INSTANCE_SETUP, setup)
        return setup

    def task_instance_exit(self):
        """Ops run at the end of each instance of the task."""
        setup = _SetupBuilder(_SetupBuilder.EXIT)
        self.net().add_attribute(TASK_INSTANCE_SETUP, setup)
        return setup

    def local_init(self):
        """Ops run once per node, before any task of the TaskGroup starts
        there (e.g. to create blobs shared by the node's tasks)."""
        setup = _SetupBuilder(_SetupBuilder.INIT)
        self.net().add_attribute(LOCAL_SETUP, setup)
        return setup

    def local_exit(self, name=None):
        """Ops run once per node, after all tasks of the TaskGroup finished
        there."""
        setup = _SetupBuilder(_SetupBuilder.EXIT, name)
        self.net().add_attribute(LOCAL_SETUP, setup)
        return setup

    def task_reporter(self, interval_ms=1000, name=None):
        """Ops run every `interval_ms` while the task runs, and once more
        after the rest of the task finished."""
        return _ReporterBuilder(interval_ms, net=self.net(), name=name)

    def local_reporter(self, interval_ms=1000, name=None):
        """Like `task_reporter`, but for as long as any task of the current
        TaskGroup runs on the node."""
        return _ReporterBuilder(interval_ms, name=name)


ops = Operations()


class _pop_on_error(object):
    """Leaves the builder's context again if the rest of its __enter__
    fails, since the `with` statement will not call __exit__ then."""

    def __init__(self, builder):
        self._builder = builder

    def __enter__(self):
        return self

    def __exit__(self, etype, value, traceback):
        if etype is not None:
            context.Managed.__exit__(self._builder, etype, value, traceback)
        return False


class _ReporterBuilder(NetBuilder):
    def __init__(self, interval_ms, net=None, name=None):
        NetBuilder.__init__(self, name)
        self._net = net
        self.interval_ms = interval_ms

    def _before_exit(self):
        step = core.to_execution_step(self)
        step.RunEveryMillis(self.interval_ms)
        if self._net:
            self._net.add_attribute(REPORT_STEP, step)
        else:
            _task_module().TaskGroup.current().report_step(
                step, interval_ms=self.interval_ms)


class _SetupBuilder(NetBuilder):
    INIT = 'init'
    EXIT = 'exit'

    def __init__(self, type, name=None):
        NetBuilder.__init__(self, name)
        self.type = type

    def setup(self, net):
        if self.type == _SetupBuilder.INIT:
            return core.to_execution_step(self)

    def exit(self, net):
        if self.type == _SetupBuilder.EXIT:
            return core.to_execution_step(self)


class _RunOnce(NetBuilder):
    def __init__(self, name=None):
        NetBuilder.__init__(self, name)

    def _before_exit(self):
        # A builder with a stop blob loops until the blob is set: make sure
        # this one runs only once.
        if self._stop_blob is not None:
            ops.stop()


class _StopGuard(_RunOnce):
    def __init__(self, has_stopped_blob=None, name=None):
        _RunOnce.__init__(self, name)
        self._stopped = has_stopped_blob
        self._ran = False

    def __enter__(self):
        r = _RunOnce.__enter__(self)
        with _pop_on_error(self):
            self._stopped = ops.Const(True, blob_out=self._stopped)
        return r

    def _before_exit(self):
        self._ran = True
        ops.Const(False, blob_out=self._stopped)
        _RunOnce._before_exit(self)

    def has_stopped(self):
        """
        Bool blob set to True after this block ran iff it was stopped early.
        """
        assert self._ran, 'Context not used yet.'
        return self._stopped


class _Loop(NetBuilder):
    def __init__(self, iters=None, name=None):
        NetBuilder.__init__(self, name, _stop_blob_required=True)
        self._iter = None
        if iters is not None:
            # Created in the parent's current net, before the loop step.
            self._inc = ops.Const(1)
            self._iter = ops.Const(0)
            self._num_iters = (
                iters if isinstance(iters, core.BlobReference)
                else ops.Const(iters))
        else:
            self._num_iters = None

    def iter(self):
        assert self._num_iters is not None, (
            'This loop does not have a number of iterations.')
        assert self._iter is not None, (
            'iter() must be called from inside the loop context')
        return self._iter

    def __enter__(self):
        builder = NetBuilder.__enter__(self)
        with _pop_on_error(self):
            if self._num_iters is not None:
                ops.stop_if(ops.GE([self._iter, self._num_iters]))
        return builder

    def _before_exit(self):
        if self._num_iters is not None:
            self.current_net().Add([self._iter, self._inc], [self._iter])


class _RunIf(_RunOnce):
    def __init__(self, cond_blob=None, name=None, _already_ran=None):
        _RunOnce.__init__(self, name)
        assert cond_blob or _already_ran
        self._is_else = cond_blob is None
        if _already_ran is None:
            self._else_blob = ops.Not(cond_blob)
            self._already_ran = ops.Const(False)
        else:
            self._already_ran = _already_ran
            if cond_blob is None:
                self._else_blob = _already_ran
            else:
                self._else_blob = ops.Or([_already_ran, ops.Not(cond_blob)])

    def __enter__(self):
        r = _RunOnce.__enter__(self)
        with _pop_on_error(self):
            ops.stop_if(self._else_blob)
            ops.Const(True, blob_out=self._already_ran)
        return r

    def Elif(self, cond, name=None):
        assert not self._is_else, 'Else not allowed for an Else.'
        return NetBuilder.current().add(_RunIf(
            cond, name=name or self.name, _already_ran=self._already_ran))

    def Else(self, name=None):
        assert not self._is_else, 'Elif not allowed for an Else.'
        return NetBuilder.current().add(
            _RunIf(name=name or self.name, _already_ran=self._already_ran))


class _RunIfNet(NetBuilder):
    """
    Block compiled into a single net that uses the If operator.
    """
    def __init__(self, cond_blob, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        assert cond_blob, 'Conditional blob is not specified for an If net'
        self._cond_blob = cond_blob
        self._then_net = None
        self._else_net = None

    def _before_exit(self):
        then_nets = self._children
        self._reset_children()
        self._then_net = NetBuilder.merge_nets(
            then_nets, self._lexical_scope)
        if not self._then_net:
            self._then_net = core.Net('empty_then_net')
        if_net = core.Net(self.name + '/if_net')
        add_if_op(if_net, self._cond_blob, self._lexical_scope,
                  self._then_net, self._else_net)
        self._current_net = if_net
        self._children = [if_net]


class _RunElseNet(NetBuilder):
    """
    Else branch of the _RunIfNet block that precedes it.
    """
    def __init__(self, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        parent = NetBuilder.current(required=False)
        assert parent and len(parent._children) > 0 and \
            isinstance(parent._children[-1], _RunIfNet), \
            'Invalid use of Else builder'
        self._if_builder = parent._children[-1]

    def _before_exit(self):
        else_nets = self._children
        self._reset_children()
        if_builder = self._if_builder
        if_builder._else_net = NetBuilder.merge_nets(
            else_nets, self._lexical_scope)
        if if_builder._else_net:
            if_else_net = core.Net(self.name + '/if_else_net')
            add_if_op(
                if_else_net,
                if_builder._cond_blob,
                self._lexical_scope,
                if_builder._then_net,
                if_builder._else_net)
            if_builder._current_net = if_else_net
            if_builder._children = [if_else_net]


class _RunWhileNet(NetBuilder):
    """
    Block compiled into a single net that uses the While operator.
    """
    def __init__(self, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        self._cond_builder = None

    def _before_exit(self):
        assert self._cond_builder, \
            'Condition builder must be specified in While op'
        cond_blob = self._cond_builder._cond_blob
        cond_net = self._cond_builder._cond_net

        loop_body = self._children
        self._reset_children()
        loop_body_net = NetBuilder.merge_nets(
            loop_body, self._lexical_scope)
        if not loop_body_net:
            loop_body_net = core.Net('empty_loop_body_net')

        while_net = core.Net(self.name + '/while_net')
        add_while_op(while_net, cond_blob, self._lexical_scope,
                     loop_body_net, cond_net)
        self._current_net = while_net
        self._children = [while_net]


class _RunWhileCondition(NetBuilder):
    """
    Condition of a WhileNet.  Its last operator must have a single (scalar
    bool) output, which is the loop condition; other blobs it creates stay
    local to the condition net.
    """
    def __init__(self, name=None):
        NetBuilder.__init__(self, name=name, _use_control_ops=True)
        parent = NetBuilder.current(required=False)
        assert parent and isinstance(parent, _RunWhileNet), \
            'Invalid use of loop condition builder'
        assert not parent._cond_builder, \
            'Multiple loop condition builders specified'
        assert len(parent._children) == 0, \
            'Condition definition must be specified before the loop\'s body'
        parent._cond_builder = self
        self._cond_blob = None
        self._cond_net = None

    def _before_exit(self):
        condition_body = self._children
        self._reset_children()
        self._cond_net = NetBuilder.merge_nets(
            condition_body, self._lexical_scope)
        assert self._cond_net, 'Invalid loop condition specified'
        assert len(self._cond_net.Proto().op) > 0, 'Invalid condition net'
        last_op = self._cond_net.Proto().op[-1]
        assert len(last_op.output) == 1, 'Invalid condition net'
        self._cond_blob = core.BlobReference(
            name=last_op.output[0], net=None)
        self._current_net = self._cond_net
        self._children = [self._cond_net]
