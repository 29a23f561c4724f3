"""Caffe2's collective ops (its Gloo ops' names and arguments) over Ray.

``CreateCommonWorld``, ``CloneCommonWorld``, ``DestroyCommonWorld``,
``Allreduce``, ``Broadcast``, ``Allgather`` and ``Barrier`` are op types
implemented here in Python; their schemas are registered by the extension
(``rust/python/src/python_op.rs``), so nets holding them are checked at
creation like any other, and this module is imported when the first such op
is made (``build_op``).

The members of a common world are the Nodes of a
:class:`~ferrocaffe.distributed.RaySession`: each node is a Ray actor, and
the session gives every actor the handles of the others (``_set_peers``).
A message to a member is a call of its actor's ``deliver`` method carrying
the numpy array: Ray moves it (through its object store when it is large,
zero-copy between processes of one machine), and the receiving actor puts
it in this module's mailbox, where the member's op takes it. No server,
rendezvous service or socket of ferrocaffe's own is involved: the
rendezvous of ``CreateCommonWorld`` is a message from every member to every
node of the session, naming its rank.

Every wait has the world's ``timeout_ms`` (Caffe2's default 30 s) and polls,
every 20 ms, the run's cancellation (a failing sibling, the session
cancelling the node, Ctrl-C on the main thread) and the calls it sent (a
peer whose actor died fails them at once). A collective that fails raises
:class:`~ferrocaffe.errors.CollectiveError` (a ``ConnectionError``),
:class:`~ferrocaffe.errors.CollectiveTimeoutError` (also a
``TimeoutError``) or ``CancelledError``, naming the collective, the common
world, and the node and rank it waited for.

A world of one member (``size=1``) needs no transport and works in any
process.

Members must issue the collectives of one common world in the same order
(as with Gloo): each call has a sequence number within its world.
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np

from . import errors

__all__ = ['CommonWorld', 'build_op']

DEFAULT_TIMEOUT_MS = 30000
_POLL = 0.02


# ------------------------------------------------------- this process's end --

class _Local(object):
    """This process's place in a session: its node, the session, the peers'
    actor handles, and the mailbox the peers deliver into."""

    def __init__(self):
        self.cond = threading.Condition()
        self.session = None
        self.node = None
        self.peers = {}
        self.messages = {}
        self.destroyed = {}
        self.generations = {}

    def reset(self, session, node, peers):
        with self.cond:
            if session != self.session:
                self.messages.clear()
                self.destroyed.clear()
                self.generations.clear()
            self.session = session
            self.node = node
            self.peers = dict(peers)
            self.cond.notify_all()

    def deliver(self, key, value):
        with self.cond:
            if key[0] == 'destroyed':
                self.destroyed[key[1]] = value
            else:
                self.messages[key] = value
            self.cond.notify_all()


_local = _Local()


def _set_peers(session, node, peers):
    """Called in a node's actor by its RaySession: the session's id, this
    node's name, and ``{node name: actor handle}`` of every node."""
    _local.reset(session, node, peers)


def _deliver(key, value):
    """Called by a peer (through this node's actor) with a message."""
    _local.deliver(key, value)


# -------------------------------------------------------------- the world --

class CommonWorld(object):
    """The members of a common world, as the blob written by
    ``CreateCommonWorld`` holds it."""

    def __init__(self, name, key, rank, size, members, timeout):
        self.name = name
        self.key = key
        self.rank = rank
        self.size = size
        #: node name of each rank
        self.members = list(members)
        self.timeout = timeout
        self._seq = itertools.count()
        self._clones = itertools.count()
        self._lock = threading.Lock()
        self.closed = False

    def __repr__(self):
        return '<CommonWorld %r rank %d of %d: %s>' % (
            self.name, self.rank, self.size, ', '.join(self.members))

    def next_seq(self):
        return next(self._seq)


class _Call(object):
    """One collective on one member: sends, and the waits for its peers."""

    def __init__(self, cw, what, context, op_name=''):
        self.cw = cw
        self.what = what
        self.context = context
        self.op_name = op_name
        self.seq = cw.next_seq()
        self.sent = {}  # ObjectRef -> rank

    def _error(self, cls, message, rank=None, **extra):
        node = self.cw.members[rank] if rank is not None else None
        exc = cls(message, node=node, collective=self.what,
                  common_world=self.cw.name, rank=rank, **extra)
        exc._wants_op_context = True
        return exc

    def _check_open(self):
        if self.cw.closed:
            raise self._error(errors.CollectiveError,
                              "%s on common world '%s': the world was "
                              "destroyed (DestroyCommonWorld)"
                              % (self.what, self.cw.name))

    def send(self, rank, tag, value):
        self._check_open()
        key = (self.cw.key, self.seq, tag, self.cw.rank)
        if rank == self.cw.rank:
            _local.deliver(key, value)
            return
        handle = _local.peers.get(self.cw.members[rank])
        if handle is None:
            raise self._error(
                errors.CollectiveError,
                "%s on common world '%s': node '%s' (rank %d) is not a node of "
                "this session" % (self.what, self.cw.name,
                                  self.cw.members[rank], rank), rank)
        self.sent[handle.deliver.remote(key, value)] = rank

    def _check_sent(self):
        if not self.sent:
            return
        import ray
        ready, _ = ray.wait(list(self.sent), num_returns=len(self.sent),
                            timeout=0)
        for ref in ready:
            rank = self.sent.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                raise self._error(
                    errors.CollectiveError,
                    "%s on common world '%s' (rank %d of %d): node '%s' (rank "
                    "%d) failed: %s" % (self.what, self.cw.name, self.cw.rank,
                                        self.cw.size, self.cw.members[rank],
                                        rank, str(exc).splitlines()[0]
                                        if str(exc) else type(exc).__name__),
                    rank) from exc

    def receive(self, ranks, tag):
        """``{rank: value}`` from each of ``ranks``, waiting at most the
        world's timeout in all."""
        wanted = {(self.cw.key, self.seq, tag, r): r for r in ranks}
        got = {}
        deadline = time.monotonic() + self.cw.timeout
        while True:
            with _local.cond:
                for key in [k for k in wanted if k in _local.messages]:
                    got[wanted.pop(key)] = _local.messages.pop(key)
                if not wanted:
                    return got
                destroyed = _local.destroyed.get(self.cw.key)
                if destroyed is None:
                    left = deadline - time.monotonic()
                    if left > 0:
                        _local.cond.wait(min(left, _POLL))
            if destroyed is not None:
                self.cw.closed = True
                raise self._error(
                    errors.CollectiveError,
                    "%s on common world '%s': node '%s' (rank %d) destroyed "
                    "the world" % (self.what, self.cw.name,
                                   self.cw.members[destroyed], destroyed),
                    destroyed)
            self._check_sent()
            missing = sorted(wanted.values())
            if self.context is not None and self.context.is_cancelled():
                raise self._error(
                    errors.CancelledError,
                    "the run was cancelled while %s on common world '%s' "
                    "(rank %d of %d) waited for %s"
                    % (self.what, self.cw.name, self.cw.rank, self.cw.size,
                       _describe(self.cw, missing)), missing[0])
            if time.monotonic() >= deadline:
                raise self._error(
                    errors.CollectiveTimeoutError,
                    "%s on common world '%s' (rank %d of %d) timed out after "
                    "%d ms waiting for %s" % (
                        self.what, self.cw.name, self.cw.rank, self.cw.size,
                        int(self.cw.timeout * 1000),
                        _describe(self.cw, missing)), missing[0])


def _describe(cw, ranks):
    return ', '.join("node '%s' (rank %d)" % (cw.members[r], r) for r in ranks)


# ------------------------------------------------------------ the kernels --

def _args(op):
    out = {}
    for a in op.arg:
        for field in ('i', 'f', 's'):
            if a.HasField(field):
                v = getattr(a, field)
                out[a.name] = v.decode() if isinstance(v, bytes) else v
                break
        else:
            out[a.name] = list(a.ints) or list(a.floats) or [
                s.decode() for s in a.strings]
    return out


def _refuse_status_blob(op, args):
    if 'status_blob' in args:
        raise errors.InvalidArgumentError(
            "%s: 'status_blob' is not supported: a failed collective raises a "
            "CollectiveError instead" % op.type, op=op.type)


def _world(inputs, what):
    cw = inputs[0].data
    if not isinstance(cw, CommonWorld):
        raise errors.DataTypeError(
            "%s: input 0 ('%s') must be a common world (made by "
            "CreateCommonWorld), got %s" % (what, inputs[0].name,
                                            type(cw).__name__),
            op=what, blob=inputs[0].name)
    return cw


def _tensors(inputs, what):
    arrays = [np.asarray(t.data) for t in inputs[1:]]
    first = arrays[0]
    for t, a in zip(inputs[1:], arrays):
        if a.dtype != first.dtype or a.shape != first.shape:
            raise errors.ShapeError(
                "%s: every tensor must have the dtype and shape of the first "
                "('%s': %s %s), but '%s' is %s %s" % (
                    what, inputs[1].name, first.dtype, list(first.shape),
                    t.name, a.dtype, list(a.shape)), op=what, blob=t.name)
        if a.dtype.kind not in 'fiu':
            raise errors.DataTypeError(
                "%s: tensor '%s' has dtype %s; collectives take numeric "
                "tensors" % (what, t.name, a.dtype), op=what, blob=t.name)
    return arrays


def _create_common_world(op):
    args = _args(op)
    _refuse_status_blob(op, args)
    if 'size' not in args or 'rank' not in args:
        raise errors.InvalidArgumentError(
            "CreateCommonWorld needs the arguments 'size' and 'rank'",
            op=op.type)
    size, rank = int(args['size']), int(args['rank'])
    if size < 1 or not 0 <= rank < size:
        raise errors.InvalidArgumentError(
            'CreateCommonWorld: rank %d is not in a world of size %d'
            % (rank, size), op=op.type)
    if args.get('mpi_rendezvous'):
        raise errors.InvalidArgumentError(
            'CreateCommonWorld: mpi_rendezvous is not supported (members '
            'meet through Ray)', op=op.type)
    transport = args.get('transport', 'tcp')
    if transport not in ('tcp', ''):
        raise errors.InvalidArgumentError(
            "CreateCommonWorld: transport '%s' is not supported; members "
            "talk through Ray ('tcp' is accepted)" % transport, op=op.type)
    timeout = int(args.get('timeout_ms', DEFAULT_TIMEOUT_MS)) / 1000.0
    if timeout <= 0:
        raise errors.InvalidArgumentError(
            'CreateCommonWorld: timeout_ms must be > 0', op=op.type)
    name = op.output[0]

    def run(inputs, outputs, context):
        if size == 1:
            cw = CommonWorld(name, ('local', name, id(outputs)), 0, 1,
                             [_local.node or 'local'], timeout)
        else:
            cw = _rendezvous(name, rank, size, timeout, context)
        context.workspace._core.feed_object(outputs[0].name, cw)
    return run


def _rendezvous(name, rank, size, timeout, context):
    if _local.session is None:
        raise errors.InvalidArgumentError(
            "CreateCommonWorld '%s' of size %d: collectives between processes "
            "run on the Nodes of a ferrocaffe.distributed.RaySession, and this "
            "process is not one (a world of size 1 works anywhere)"
            % (name, size), op='CreateCommonWorld', blob=name)
    with _local.cond:
        gen = _local.generations.get(name, 0)
        _local.generations[name] = gen + 1
        node, peers = _local.node, dict(_local.peers)
    key = (_local.session, name, gen)
    # Rank -> node is not known yet: tell every node of the session.
    hello = CommonWorld(name, ('hello',) + key, rank, size,
                        sorted(peers), timeout)
    call = _Call(hello, 'CreateCommonWorld', context)
    call.seq = 0
    for i, peer in enumerate(hello.members):
        if peer != node:
            call.sent[peers[peer].deliver.remote(
                (hello.key, 0, 'hello', rank), (node, size))] = i
    _local.deliver((hello.key, 0, 'hello', rank), (node, size))
    # Waits for every rank; a failure names the node by session order.
    members = [None] * size
    hello.members = ['rank %d' % r for r in range(size)]
    call.sent = {}
    got = call.receive(range(size), 'hello')
    for r, (peer, peer_size) in got.items():
        if peer_size != size:
            raise errors.InvalidArgumentError(
                "CreateCommonWorld '%s': node '%s' (rank %d) made a world of "
                "size %d, this node (rank %d) one of size %d"
                % (name, peer, r, peer_size, rank, size),
                op='CreateCommonWorld', blob=name)
        members[r] = peer
    if len(set(members)) != size:
        raise errors.InvalidArgumentError(
            "CreateCommonWorld '%s': one node holds several ranks (%s)"
            % (name, members), op='CreateCommonWorld', blob=name)
    return CommonWorld(name, key, rank, size, members, timeout)


def _clone_common_world(op):
    _refuse_status_blob(op, _args(op))
    name = op.output[0]

    def run(inputs, outputs, context):
        cw = _world(inputs, op.type)
        clone = CommonWorld(name, cw.key + ('clone', next(cw._clones)),
                            cw.rank, cw.size, cw.members, cw.timeout)
        context.workspace._core.feed_object(outputs[0].name, clone)
    return run


def _destroy_common_world(op):
    def run(inputs, outputs, context):
        cw = _world(inputs, op.type)
        if cw.closed:
            return
        cw.closed = True
        for r, member in enumerate(cw.members):
            handle = _local.peers.get(member)
            if r != cw.rank and handle is not None:
                handle.deliver.remote(('destroyed', cw.key), cw.rank)
    return run


def _allreduce(op):
    _refuse_status_blob(op, _args(op))

    def run(inputs, outputs, context):
        cw = _world(inputs, op.type)
        arrays = _tensors(inputs, op.type)
        local = arrays[0].copy()
        for a in arrays[1:]:
            local += a
        total = allreduce(cw, local, context, op.type)
        for out in outputs:
            out.feed(total)
    return run


def allreduce(cw, array, context=None, what='Allreduce'):
    """The element-wise sum of ``array`` over the members of ``cw``
    (identical on every member): each member sums one slice of the buffer,
    adding the members' slices in rank order, and sends it to the others
    (a direct reduce-scatter, then an all-gather)."""
    if cw.size == 1:
        return array
    call = _Call(cw, what, context)
    flat = array.reshape(-1)
    bounds = np.linspace(0, flat.size, cw.size + 1).astype(np.int64)
    for r in range(cw.size):
        if r != cw.rank:
            call.send(r, 'part', flat[bounds[r]:bounds[r + 1]])
    others = [r for r in range(cw.size) if r != cw.rank]
    parts = call.receive(others, 'part')
    mine = flat[bounds[cw.rank]:bounds[cw.rank + 1]]
    parts[cw.rank] = mine
    acc = np.array(parts[0], copy=True)
    for r in range(1, cw.size):
        acc += parts[r]
    for r in others:
        call.send(r, 'sum', acc)
    sums = call.receive(others, 'sum')
    sums[cw.rank] = acc
    out = np.empty_like(flat)
    for r in range(cw.size):
        out[bounds[r]:bounds[r + 1]] = sums[r]
    call._check_sent()
    return out.reshape(array.shape)


def _broadcast(op):
    args = _args(op)
    _refuse_status_blob(op, args)
    root = int(args.get('root', 0))

    def run(inputs, outputs, context):
        cw = _world(inputs, op.type)
        if not 0 <= root < cw.size:
            raise errors.InvalidArgumentError(
                'Broadcast: root %d is not a rank of common world %r (size %d)'
                % (root, cw.name, cw.size), op=op.type)
        arrays = _tensors(inputs, op.type)
        value = broadcast(cw, arrays[0], root, context, op.type)
        for out in outputs:
            out.feed(value)
    return run


def broadcast(cw, array, root=0, context=None, what='Broadcast'):
    """The root member's ``array`` on every member of ``cw``."""
    if cw.size == 1:
        return array
    call = _Call(cw, what, context)
    if cw.rank == root:
        for r in range(cw.size):
            if r != root:
                call.send(r, 'value', array)
        call.receive([], 'value')
        call._check_sent()
        return array
    value = call.receive([root], 'value')[root]
    if value.dtype != array.dtype or value.shape != array.shape:
        raise errors.ShapeError(
            "Broadcast on common world '%s': the root's tensor is %s %s, this "
            "member's %s %s" % (cw.name, value.dtype, list(value.shape),
                                array.dtype, list(array.shape)), op=what)
    return np.array(value, copy=True)


def _allgather(op):
    _refuse_status_blob(op, _args(op))

    def run(inputs, outputs, context):
        cw = _world(inputs, op.type)
        arrays = _tensors(inputs, op.type)
        mine = np.concatenate([a.reshape(-1) for a in arrays])
        outputs[0].feed(allgather(cw, mine, context, op.type))
    return run


def allgather(cw, array, context=None, what='Allgather'):
    """The members' 1-D ``array``s concatenated in rank order (their
    lengths may differ)."""
    if cw.size == 1:
        return array.reshape(-1).copy()
    call = _Call(cw, what, context)
    for r in range(cw.size):
        if r != cw.rank:
            call.send(r, 'value', array)
    got = call.receive([r for r in range(cw.size) if r != cw.rank], 'value')
    got[cw.rank] = array
    for r in range(cw.size):
        if got[r].dtype != array.dtype:
            raise errors.DataTypeError(
                "Allgather on common world '%s': node '%s' (rank %d) sent %s, "
                "this member has %s" % (cw.name, cw.members[r], r,
                                        got[r].dtype, array.dtype), op=what)
    call._check_sent()
    return np.concatenate([np.asarray(got[r]).reshape(-1)
                           for r in range(cw.size)])


def _barrier(op):
    _refuse_status_blob(op, _args(op))

    def run(inputs, outputs, context):
        barrier(_world(inputs, op.type), context, op.type)
    return run


def barrier(cw, context=None, what='Barrier'):
    """Returns once every member of ``cw`` called it."""
    if cw.size == 1:
        return
    call = _Call(cw, what, context)
    for r in range(cw.size):
        if r != cw.rank:
            call.send(r, 'here', None)
    call.receive([r for r in range(cw.size) if r != cw.rank], 'here')
    call._check_sent()


_BUILDERS = {
    'CreateCommonWorld': _create_common_world,
    'CloneCommonWorld': _clone_common_world,
    'DestroyCommonWorld': _destroy_common_world,
    'Allreduce': _allreduce,
    'Broadcast': _broadcast,
    'Allgather': _allgather,
    'Barrier': _barrier,
}


def build_op(op):
    """The kernel of one collective op (called by the extension when a net
    holding it is created)."""
    try:
        return _BUILDERS[op.type](op)
    except KeyError:
        raise errors.UnknownOperatorError(
            "ferrocaffe.collective implements no op type '%s'" % op.type,
            op=op.type) from None
