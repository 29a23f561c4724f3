"""Running TaskGroups past one machine: a Session whose Nodes are Ray actors.

    from ferrocaffe.distributed import RaySession

    with TaskGroup() as tg:
        with Node('reader', num_cpus=1):
            ...
        with Node('trainer', num_cpus=4):
            ...

    session = RaySession()            # or RaySession(address='auto')
    session.run(tg)

Every Node name a TaskGroup uses becomes one long-lived Ray actor that holds
the node's workspace for the life of the session. ``run`` compiles the group
into one plan per node (the same plans ``LocalSession(isolate_nodes=True)``
runs), ships each plan to its actor once, runs all nodes at the same time and
gathers the task outputs through Ray's object store, so ``TaskOutput.fetch()``
works as with ``LocalSession``.

The contract is Caffe2's: tasks on different nodes never share a workspace;
tasks on one node share the node's workspace across runs of the session.
The first failure on any node cancels the runs of the other nodes and is
raised in the caller with the node's name; the session stays usable unless
a node's process died (then its workspace is gone and every later run that
needs that node raises :class:`~ferrocaffe.errors.NodeFailedError`: start a
new session and resume from a checkpoint).

Node keyword arguments map to Ray's placement options:

==================  =========================================================
``num_cpus``        CPUs reserved for the actor; its kernel (rayon) pool gets
                    ``ceil(num_cpus)`` threads (at least one)
``num_gpus``        GPUs reserved for the actor
``memory``          bytes of memory reserved for the actor
``resources``       custom resources, e.g. ``{'trainer_host': 1}``
``label_selector``  node labels the actor's Ray node must carry
                    (``ray start --labels='{"role": "trainer"}'``)
``node_id``         pin the actor to one Ray node (hex id); with
                    ``soft=True`` Ray may place it elsewhere
``num_threads``     kernel pool size, overriding the one from ``num_cpus``
==================  =========================================================

Any other keyword raises :class:`~ferrocaffe.errors.InvalidArgumentError`
naming the node, in ``Node(...)`` itself (so a typo never reaches the
process-wide Cluster). A Node without ``num_cpus`` uses Ray's default for actors
(one CPU to be placed, none held while it runs) and a kernel pool as large as
its machine.

Ray is an optional dependency: ``pip install 'ferrocaffe[ray]'``.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import socket
import threading
import time
import uuid

try:
    import ray
    from ray import cloudpickle as _cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "ferrocaffe.distributed needs Ray, which is not installed here. "
        "Install it with:  pip install 'ferrocaffe[ray]'  "
        f"(the import failed with: {_exc})"
    ) from _exc

import ferrocaffe
from ferrocaffe import _core, _python_ops, collective, core, errors, workspace
from ferrocaffe.session import Session, _NodeIsolatedLocalSession
from ferrocaffe.task import NODE_KWARGS, Cluster, check_node_kwargs

__all__ = ['RaySession', 'node_actor_options']

logger = logging.getLogger(__name__)

# NODE_KWARGS (the keywords a RaySession understands) lives in task.py, so
# that Node(...) checks them where they are written; re-exported here.


def node_actor_options(node, kwargs):
    """Ray actor options and kernel-pool size for a Node's keyword arguments.

    Returns ``(options, num_threads)``; ``num_threads`` is ``None`` when the
    pool keeps its default size. Raises InvalidArgumentError for a keyword
    this session does not understand or a value of the wrong type (the
    checks of ``Node(...)`` itself, repeated for keywords that reach a
    session some other way).
    """
    kwargs = dict(kwargs or {})
    check_node_kwargs(node, kwargs)
    options = {}
    num_threads = None

    if kwargs.get('num_cpus') is not None:
        options['num_cpus'] = kwargs['num_cpus']
        num_threads = max(1, int(math.ceil(options['num_cpus'])))
    for key in ('num_gpus', 'memory'):
        if kwargs.get(key) is not None:
            options[key] = kwargs[key]
    for key in ('resources', 'label_selector'):
        if kwargs.get(key) is not None:
            options[key] = dict(kwargs[key])
    if kwargs.get('node_id') is not None:
        options['scheduling_strategy'] = NodeAffinitySchedulingStrategy(
            node_id=str(kwargs['node_id']), soft=bool(kwargs.get('soft', False)))
    if kwargs.get('num_threads') is not None:
        num_threads = int(kwargs['num_threads'])
    return options, num_threads


# ------------------------------------------------------------ the actor --

def _describe_error(exc, node):
    """An exception as something that travels back to the driver."""
    import traceback
    text = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        payload = _cloudpickle.dumps(exc)
        pickle.loads(payload)  # it must also come back out
    except Exception:
        payload = None
    return {'payload': payload, 'type': type(exc).__name__,
            'message': str(exc), 'traceback': text, 'node': node,
            'pid': os.getpid(), 'host': socket.gethostname()}


class _NodeActor(object):
    """One Node: a workspace living in a Ray actor process.

    Threaded (several calls at once) so that ``cancel`` reaches a running
    ``run``; runs of one node are serialised by the driver.
    """

    def __init__(self, node, num_threads):
        self._core = _core
        self._node = node
        self._pool_sized = None
        if num_threads:
            self._pool_sized = _core.set_num_threads(int(num_threads))
        self._ws = workspace.Workspace()
        self._plans = {}
        self._lock = threading.Lock()
        self._running = {}
        self._cancelled = set()

    def info(self):
        try:
            ray_node = ray.get_runtime_context().get_node_id()
        except Exception:
            ray_node = None
        return {'node': self._node, 'pid': os.getpid(),
                'host': socket.gethostname(), 'ray_node_id': ray_node,
                'num_threads': self._core.num_threads(),
                'pool_sized': self._pool_sized}

    def run(self, run_id, key, plan_bytes, python_ops, output_names):
        if plan_bytes is not None:
            functions, builders = python_ops or ({}, ())
            for token, (payload, pass_ws) in functions.items():
                _python_ops.register(pickle.loads(payload), pass_ws, name=token)
            _python_ops.trust_digests(builders)
            self._plans[key] = plan_bytes
        plan = self._plans.get(key)
        if plan is None:
            return ('missing_plan', None)
        try:
            for name in output_names:
                self._ws.create_blob(name)
            handle = self._core.run_plan_in_background(self._ws._core, plan)
            with self._lock:
                self._running[run_id] = handle
                if run_id in self._cancelled:
                    handle.cancel()
            try:
                ok = handle.wait()
            finally:
                with self._lock:
                    self._running.pop(run_id, None)
                    self._cancelled.discard(run_id)
            if not ok:
                raise errors.PlanFailedError(
                    'plan failed: an operator reported failure')
        except BaseException as exc:  # everything goes back to the driver
            return ('error', _describe_error(exc, self._node))
        values = []
        for name in output_names:
            try:
                values.append(('ok', self._ws.fetch_blob(name)))
            except Exception as exc:
                values.append(('error', _describe_error(exc, self._node)))
        return ('ok', values)

    def cancel(self, run_id):
        with self._lock:
            handle = self._running.get(run_id)
            if handle is None:
                self._cancelled.add(run_id)
            else:
                handle.cancel()

    def fetch_blob(self, name):
        try:
            return ('ok', self._ws.fetch_blob(name))
        except Exception as exc:
            return ('error', _describe_error(exc, self._node))

    def feed_blob(self, name, value):
        try:
            return ('ok', self._ws.feed_blob(name, value))
        except Exception as exc:
            return ('error', _describe_error(exc, self._node))

    def blobs(self):
        return sorted(self._ws.blobs.keys())

    # The transport of the collectives (ferrocaffe.collective): the session
    # hands every node the others' handles; a peer's message arrives here
    # on another of the actor's threads while the node's plan runs.
    def set_peers(self, session, peers):
        collective._set_peers(session, self._node, peers)
        return True

    def deliver(self, key, value):
        collective._deliver(key, value)


_RemoteNodeActor = ray.remote(_NodeActor)


def _rebuild_error(desc, node=None):
    """The driver-side exception for an error described by a node."""
    node = node or desc.get('node')
    where = "node '%s' (pid %s on %s)" % (node, desc.get('pid'), desc.get('host'))
    exc = None
    if desc.get('payload') is not None:
        try:
            exc = pickle.loads(desc['payload'])
        except Exception:
            exc = None
    if isinstance(exc, errors.FerrocaffeError):
        exc.message = '%s: %s' % (where, exc.message)
        exc.args = (exc.message,)
    elif exc is None:
        exc = errors.OperatorError(
            '%s: %s: %s' % (where, desc.get('type'), desc.get('message')))
    elif hasattr(exc, 'add_note'):
        exc.add_note('raised on ' + where)
    try:
        if getattr(exc, 'collective', None) is not None and getattr(exc, 'node', None):
            # A collective's error names the member at fault as its node;
            # the node that reported it is kept beside it.
            exc._reporter = node
        else:
            exc.node = node
        exc.remote_traceback = desc.get('traceback')
    except Exception:  # an exception type with __slots__
        pass
    return exc


def _name_collective(first, errors_seen):
    """A node that died or failed while its peers waited for it in a
    collective: the peers' errors name the collective; the first error
    (the node's own) is given that name too (``collective``,
    ``common_world``, and a sentence in its message)."""
    if getattr(first, 'collective', None) is not None:
        return
    node = getattr(first, 'node', None)
    for other in errors_seen:
        what = getattr(other, 'collective', None)
        if other is first or what is None:
            continue
        if getattr(other, 'node', None) not in (None, node):
            continue
        try:
            first.collective = what
            first.common_world = getattr(other, 'common_world', None)
            note = ("; node '%s' was waiting for it in %s on common world "
                    "'%s'" % (getattr(other, '_reporter', None) or '?', what,
                              first.common_world))
            if getattr(other, 'net', None):
                note += " (op #%s of net '%s')" % (other.op_index, other.net)
            if isinstance(first, errors.FerrocaffeError):
                first.message += note
                first.args = (first.message,)
        except Exception:  # an exception type that refuses attributes
            pass
        return


# ----------------------------------------------------------- compilation --

class _RayNodePlan(object):
    """One node's share of a compiled TaskGroup, serialised once."""

    def __init__(self, node, plan, plan_bytes, output_list, kwargs):
        self.node = str(node)
        self.plan_bytes = plan_bytes
        self.output_list = output_list
        self.kwargs = kwargs
        self.key = uuid.uuid4().hex
        self.python_ops = _python_ops_of(plan.Proto())


class _RayPlans(object):
    def __init__(self, node_plans):
        self.node_plans = node_plans


def _python_ops_of(plan_def):
    """What the node's process needs for a plan's Python ops: the functions
    they call, pickled by value so that the node can register them under
    the same tokens, and the digests of the pickled builders trusted here
    (made by Net.Python or named by TrustPickledBuilders), which the node
    then trusts too."""
    found = {}
    builders = set()
    for net in core._nets_within(plan_def):
        for op in net.op:
            if op.type not in ('Python', 'PythonGradient'):
                continue
            token = None
            for arg in op.arg:
                if arg.name == 'token' and arg.HasField('s'):
                    token = arg.s.decode() if isinstance(arg.s, bytes) else arg.s
                if (arg.name in ('pickled_builder', 'pickled_grad_builder') and arg.HasField('s')
                        and _python_ops.is_trusted(arg.s)):
                    builders.add(_python_ops.digest(arg.s))
            if not token or token in found:
                continue
            func, pass_ws = _python_ops._registry.get(token, (None, False))
            if func is None:
                continue  # fails on the node with the usual message
            try:
                payload = _cloudpickle.dumps(func)
            except Exception as exc:
                raise errors.InvalidArgumentError(
                    "Python op '%s' in net '%s': its function %r cannot be "
                    "pickled to run on another process (%s: %s)"
                    % (op.name or token, net.name, func, type(exc).__name__, exc),
                    op='Python', net=net.name) from exc
            found[token] = (payload, pass_ws)
    return found, sorted(builders)


def _node_kwargs_of(task_group):
    """Node keyword arguments, by node name, as the user gave them."""
    merged = {}
    cluster = Cluster.current(required=False)
    if cluster is not None:
        for name, kwargs in cluster.node_kwargs().items():
            if kwargs:
                merged[name] = dict(kwargs)
    for task in task_group.tasks():
        kwargs = getattr(task, '_node_kwargs', None)
        if kwargs:
            merged.setdefault(task.node, {}).update(kwargs)
    return merged


# ------------------------------------------------------------- the session --

class _NodeHandle(object):
    def __init__(self, name, actor, ready_ref, options, num_threads):
        self.name = name
        self.actor = actor
        self.ready_ref = ready_ref
        self.options = options
        self.num_threads = num_threads
        self.info = None
        self.shipped = set()
        self.dead = None  # why, once the actor died
        self.lock = threading.Lock()


class _GatheredFetcher(object):
    """TaskOutput fetch function over the values a node sent back."""

    def __init__(self, node, names, values):
        self._node = node
        self._values = dict(zip(names, values))

    def __call__(self, blob):
        status, value = self._values[str(blob)]
        if status != 'ok':
            raise _rebuild_error(value, self._node)
        if hasattr(value, 'flags') and not value.flags.writeable:
            value = value.copy()  # Ray hands out read-only views
        return value


class RaySession(Session):
    """
    A Session whose Nodes are Ray actors (see the module documentation).

    Args:
        address: the Ray cluster to connect to (``'auto'``, ``'ray://...'``,
            ``'host:port'``); ``None`` connects to the cluster this process
            already joined, or starts a local one.
        node_start_timeout: seconds to wait for a node's actor to start
            before raising NodeFailedError (a node Ray cannot place would
            otherwise wait forever).
        cancel_timeout: seconds to wait for the other nodes to stop after
            one failed.
        ray_init_kwargs: passed to ``ray.init`` when this session starts or
            joins the cluster (for example ``num_cpus=2``).

    The session does not shut Ray down when it closes: it kills its node
    actors and leaves the cluster (and a local Ray started for it) running
    for the next session; ``ray.shutdown()`` stops it.
    """

    def __init__(self, address=None, node_start_timeout=60.0,
                 cancel_timeout=30.0, **ray_init_kwargs):
        Session.__init__(self)
        if not ray.is_initialized():
            ray_init_kwargs.setdefault('include_dashboard', False)
            ray_init_kwargs.setdefault('log_to_driver', True)
            ray.init(address=address, **ray_init_kwargs)
        self._node_start_timeout = float(node_start_timeout)
        self._cancel_timeout = float(cancel_timeout)
        self._nodes = {}
        self._nodes_lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._address = address
        # The collectives' peers: which nodes were last told of each other.
        self._session_id = uuid.uuid4().hex
        self._peers_shared = frozenset()

    def __repr__(self):
        with self._nodes_lock:
            nodes = sorted(self._nodes)
        return '<RaySession %s, cluster %s, %d node%s%s>' % (
            'open' if self.is_open() else 'closed',
            self._address or 'local/joined', len(nodes),
            '' if len(nodes) == 1 else 's',
            (': ' + ', '.join(nodes)) if nodes else '')

    # -- compile ----------------------------------------------------------

    @classmethod
    def _compile_task_group(cls, task_group, setup_net_list=None):
        kwargs = _node_kwargs_of(task_group)
        compiled = _NodeIsolatedLocalSession._compile_task_group(
            task_group, setup_net_list)
        return _RayPlans([
            _RayNodePlan(np.node, np.plan, np.serialized, np.output_list,
                         kwargs.get(str(np.node), {}))
            for np in compiled.node_plans
        ])

    # -- nodes ------------------------------------------------------------

    def _runtime_env(self):
        # A ferrocaffe that is not installed (a source checkout on
        # PYTHONPATH) must be importable in the actor's process too.
        pkg_parent = os.path.dirname(os.path.dirname(
            os.path.abspath(ferrocaffe.__file__)))
        if 'site-packages' in pkg_parent or 'dist-packages' in pkg_parent:
            return None
        path = os.environ.get('PYTHONPATH', '')
        parts = [pkg_parent] + [p for p in path.split(os.pathsep) if p]
        return {'env_vars': {'PYTHONPATH': os.pathsep.join(parts)}}

    def _node(self, name, kwargs):
        with self._nodes_lock:
            handle = self._nodes.get(name)
            if handle is None:
                options, num_threads = node_actor_options(name, kwargs)
                # Threads: a run, its cancel, and the collectives' messages
                # from every peer arriving while the run waits.
                opts = dict(options, max_concurrency=16)
                env = self._runtime_env()
                if env:
                    opts['runtime_env'] = env
                actor = _RemoteNodeActor.options(**opts).remote(name, num_threads)
                handle = _NodeHandle(name, actor, actor.info.remote(),
                                     options, num_threads)
                self._nodes[name] = handle
        if handle.dead is not None:
            raise errors.NodeFailedError(
                "node '%s' died earlier (%s); its workspace is lost. Start "
                "a new session and resume from a checkpoint." % (name, handle.dead),
                node=name)
        return handle

    def _wait_ready(self, handles):
        pending = {h.ready_ref: h for h in handles if h.info is None}
        deadline = time.monotonic() + self._node_start_timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                names = sorted(h.name for h in pending.values())
                for h in pending.values():
                    self._forget(h, 'it could not be started')
                raise errors.NodeFailedError(
                    'node(s) %s could not be started within %.0f s: Ray could '
                    'not place them with the requested options %s; the '
                    'cluster has %s available'
                    % (', '.join("'%s'" % n for n in names),
                       self._node_start_timeout,
                       {h.name: h.options for h in pending.values()},
                       ray.available_resources()),
                    node=names[0])
            ready, _ = ray.wait(list(pending), num_returns=1,
                                timeout=min(left, 0.1))
            for ref in ready:
                h = pending.pop(ref)
                try:
                    h.info = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    self._forget(h, 'its actor failed to start')
                    raise errors.NodeFailedError(
                        "node '%s' failed to start: %s" % (h.name, exc),
                        node=h.name) from exc

    def _forget(self, handle, why):
        handle.dead = why
        try:
            ray.kill(handle.actor)
        except Exception:
            pass

    def nodes(self):
        """Names of the nodes this session has started."""
        with self._nodes_lock:
            return list(self._nodes)

    def _started(self, node):
        handle = self._nodes.get(str(node))
        if handle is None:
            raise errors.InvalidArgumentError(
                "node '%s' has not run anything in this session (nodes: %s)"
                % (node, ', '.join(self._nodes) or 'none'), node=str(node))
        self._wait_ready([handle])
        return handle

    def node_info(self, node):
        """``{'pid', 'host', 'ray_node_id', 'num_threads', ...}`` of a node's
        actor process."""
        return dict(self._started(node).info)

    def node_actor(self, node):
        """The Ray actor handle of a node (for monitoring or fault tests)."""
        return self._started(node).actor

    def _call(self, handle, method, *args):
        try:
            status, value = ray.get(getattr(handle.actor, method).remote(*args))
        except ray.exceptions.RayActorError as exc:
            self._mark_dead(handle, exc)
            raise self._death_error(handle, exc) from exc
        if status != 'ok':
            raise _rebuild_error(value, handle.name)
        return value

    def fetch_blob(self, node, name):
        """A copy of the current value of blob `name` in `node`'s
        workspace (writing to it does not change the blob)."""
        return self._call(self._started(node), 'fetch_blob', str(name))

    def feed_blob(self, node, name, value):
        """Feeds `value` into blob `name` of `node`'s workspace."""
        return self._call(self._started(node), 'feed_blob', str(name), value)

    def blobs(self, node):
        """Names of the blobs in `node`'s workspace."""
        handle = self._started(node)
        return ray.get(handle.actor.blobs.remote())

    def fetch_output(self, output):
        """The value of a TaskOutput (or of a blob, when only one node
        exists)."""
        if hasattr(output, 'fetch'):
            return output.fetch()
        nodes = self.nodes()
        if len(nodes) != 1:
            raise errors.InvalidArgumentError(
                "fetch_output('%s') is ambiguous with nodes %s: use "
                "fetch_blob(node, name)" % (output, nodes), blob=str(output))
        return self.fetch_blob(nodes[0], output)

    # -- run --------------------------------------------------------------

    def _mark_dead(self, handle, exc):
        if handle.dead is None:
            handle.dead = '%s: %s' % (type(exc).__name__, str(exc).splitlines()[0]
                                      if str(exc) else '')

    def _death_error(self, handle, exc):
        info = handle.info or {}
        return errors.NodeFailedError(
            "node '%s' failed: its Ray actor (pid %s on %s) died: %s"
            % (handle.name, info.get('pid'), info.get('host'),
               str(exc).splitlines()[0] if str(exc) else type(exc).__name__),
            node=handle.name)

    def _run_compiled(self, compiled):
        # Runs of one session are serialised, as LocalSession's are.
        with self._run_lock:
            self._run_node_plans(compiled)

    def _run_node_plans(self, compiled):
        plans = compiled.node_plans
        handles = [self._node(p.node, p.kwargs) for p in plans]
        self._wait_ready(handles)
        self._share_peers()
        run_id = uuid.uuid4().hex
        pending = {}
        for p, h in zip(plans, handles):
            pending[self._submit(run_id, p, h)] = (p, h)

        first_error = None
        others = []
        results = {}
        cancel_deadline = None
        try:
            while pending:
                timeout = 0.1
                if cancel_deadline is not None:
                    timeout = min(timeout, max(0.0, cancel_deadline - time.monotonic()))
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
                if not ready:
                    if (cancel_deadline is not None
                            and time.monotonic() >= cancel_deadline):
                        logger.warning(
                            'nodes %s did not stop within %.0f s of the '
                            'cancellation', [p.node for p, _ in pending.values()],
                            self._cancel_timeout)
                        break
                    continue
                for ref in ready:
                    p, h = pending.pop(ref)
                    error = self._collect(ref, p, h, run_id, results)
                    if error is not None:
                        others.append(error)
                    if error is not None and first_error is None:
                        first_error = error
                        cancel_deadline = time.monotonic() + self._cancel_timeout
                        for _, other in pending.values():
                            self._cancel(other, run_id)
        except BaseException:  # Ctrl-C in the driver: stop every node
            for _, h in pending.values():
                self._cancel(h, run_id)
            try:
                ray.wait(list(pending), num_returns=len(pending),
                         timeout=min(self._cancel_timeout, 5.0))
            except BaseException:
                pass
            raise
        if first_error is not None:
            _name_collective(first_error, others)
            raise first_error
        for p in plans:
            names = [str(n) for n in p.output_list.names()]
            p.output_list.set_values(
                [core.BlobReference(n) for n in names],
                _fetch_func=_GatheredFetcher(p.node, names, results[p.node]))

    def _share_peers(self):
        """Gives every started node the actor handles of all of them (the
        members of a common world find each other among these), when the
        set of nodes changed since it was last given."""
        with self._nodes_lock:
            live = {n: h for n, h in self._nodes.items()
                    if h.dead is None and h.info is not None}
        if frozenset(live) == self._peers_shared or len(live) < 2:
            return
        peers = {n: h.actor for n, h in live.items()}
        refs = {h.actor.set_peers.remote(self._session_id, peers): h
                for h in live.values()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs),
                            timeout=self._node_start_timeout)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                h = refs[ref]
                self._mark_dead(h, exc)
                raise self._death_error(h, exc) from exc
        if len(ready) == len(refs):
            self._peers_shared = frozenset(live)

    def _submit(self, run_id, plan, handle):
        ship = plan.key not in handle.shipped
        return handle.actor.run.remote(
            run_id, plan.key,
            plan.plan_bytes if ship else None,
            plan.python_ops if ship else None,
            [str(n) for n in plan.output_list.names()])

    def _collect(self, ref, plan, handle, run_id, results):
        """Stores a node's outputs; returns the error it raised, if any."""
        try:
            status, value = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            self._mark_dead(handle, exc)
            return self._death_error(handle, exc)
        except ray.exceptions.RayError as exc:
            return errors.NodeFailedError(
                "node '%s' failed: %s" % (handle.name, exc), node=handle.name)
        handle.shipped.add(plan.key)
        if status == 'missing_plan':  # the actor lost its plans: resend once
            handle.shipped.discard(plan.key)
            return self._collect(self._submit(run_id, plan, handle), plan,
                                 handle, run_id, results)
        if status == 'error':
            return _rebuild_error(value, handle.name)
        results[plan.node] = value
        return None

    def _cancel(self, handle, run_id):
        try:
            handle.actor.cancel.remote(run_id)
        except Exception:
            pass

    # -- close ------------------------------------------------------------

    def _do_close(self):
        with self._nodes_lock:
            handles = list(self._nodes.values())
            self._nodes = {}
        for h in handles:
            try:
                ray.kill(h.actor)
            except Exception:
                pass
