"""Training curves and net graphs in TensorBoard.

:class:`ScalarLogger` writes scalars (loss, accuracy, learning rate, epoch
time, rows/s, checkpoint save time) to a TensorBoard log directory through
`tensorboardX <https://github.com/lanpa/tensorboardX>`_ (``pip install
'ferrocaffe[tensorboard]'``; TensorBoard itself, ``pip install
tensorboard``, only to look at them)::

    from ferrocaffe.tensorboard import ScalarLogger
    with ScalarLogger('/tmp/logs/run1') as tb:
        runner = JobRunner(job, cm, summary=tb)      # job/epoch_seconds, ...
        runner.train(session)
        # or in a loop of your own:
        tb.add_scalar('loss', float(workspace.FetchBlob('loss')), step)
        tb.add_graph([model.param_init_net, model.net])

    tensorboard --logdir /tmp/logs                   # then open localhost:6006

:func:`nets_to_graph_def` turns nets into the ``GraphDef`` TensorBoard's
graph view draws, as Caffe2's ``caffe2/contrib/tensorboard`` exporter did:
each op a node named after the scope of its outputs and its type, each
blob version a node (``Blob``, or ``Placeholder`` when nothing in the nets
writes it) fed by the op that wrote it (``op:<output index>``), blobs
renamed to one version each (``x``, ``x_1``, ...: SSA), gradient blobs and
ops under ``GRADIENTS/``, and ``:`` replaced (TensorBoard reads ``a:1`` as
output 1 of ``a``).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ferrocaffe.proto import caffe2_pb2

__all__ = ["ScalarLogger", "nets_to_graph_def", "ops_to_graph_def",
           "cnn_to_graph_def", "INSTALL_HINT"]

INSTALL_HINT = ("TensorBoard logging needs tensorboardX: pip install tensorboardX "
                "(or pip install 'ferrocaffe[tensorboard]')")


def _tbx():
    try:
        import tensorboardX
    except ImportError as e:  # pragma: no cover - an optional dependency
        raise ImportError(INSTALL_HINT) from e
    return tensorboardX


class ScalarLogger:
    """Scalars (and net graphs) to a TensorBoard log directory.

    ``logdir``: the run's directory (created). ``flush_secs``: how often
    events reach the file. A ``JobRunner(..., summary=logger)`` logs each
    epoch's time, rows/s and tracked values, and each checkpoint's save
    time; any loop can call :meth:`add_scalar` itself."""

    def __init__(self, logdir: str | os.PathLike[str], flush_secs: int = 10,
                 comment: str = "") -> None:
        tbx = _tbx()
        self.logdir = os.fspath(logdir)
        os.makedirs(self.logdir, exist_ok=True)
        self._writer = tbx.SummaryWriter(logdir=self.logdir, flush_secs=flush_secs,
                                         comment=comment)

    @property
    def writer(self) -> Any:
        """The tensorboardX ``SummaryWriter`` (histograms, images, text...)."""
        return self._writer

    def add_scalar(self, tag: str, value: Any, step: int | None = None,
                   walltime: float | None = None) -> None:
        """Logs one number (a Python or numpy number, or a one-element
        array) under ``tag`` at ``step``."""
        self._writer.add_scalar(tag, _number(tag, value), global_step=step, walltime=walltime)

    def add_scalars(self, values: Mapping[str, Any], step: int | None = None) -> None:
        """Logs each ``{tag: value}`` at ``step`` (each its own curve)."""
        now = time.time()
        for tag, value in values.items():
            self.add_scalar(tag, value, step, walltime=now)

    @contextmanager
    def timed(self, tag: str, step: int | None = None) -> Iterator[None]:
        """Logs the seconds the block took under ``tag``."""
        start = time.perf_counter()
        yield
        self.add_scalar(tag, time.perf_counter() - start, step)

    def add_graph(self, nets: Any, **kwargs: Any) -> Any:
        """Writes nets (a Net, NetDef, a list of them, a Plan or PlanDef,
        or a model with ``param_init_net`` and ``net``) for TensorBoard's
        graph view; ``kwargs`` go to :func:`nets_to_graph_def`. Returns
        the GraphDef. (A Job's or TaskGroup's nets:
        ``add_graph(net_drawer.plan_def(job))``.)"""
        if hasattr(nets, "param_init_net") and hasattr(nets, "net"):
            nets = [nets.param_init_net, nets.net]
        elif hasattr(nets, "Proto") and isinstance(nets.Proto(), caffe2_pb2.PlanDef):
            nets = list(nets.Proto().network)
        elif isinstance(nets, caffe2_pb2.PlanDef):
            nets = list(nets.network)
        elif not isinstance(nets, (list, tuple)):
            nets = [nets]
        graph = nets_to_graph_def(nets, **kwargs)
        from tensorboardX.proto import event_pb2
        self._writer._get_file_writer().add_event(
            event_pb2.Event(graph_def=graph.SerializeToString(), wall_time=time.time()))
        return graph

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> ScalarLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "<ScalarLogger %s>" % self.logdir


def _number(tag: str, value: Any) -> float:
    import numpy as np
    arr = np.asarray(value)
    if arr.size != 1 or arr.dtype.kind not in "biuf":
        raise TypeError("scalar '%s' must be one number, got %r" % (tag, value))
    return float(arr.reshape(-1)[0])


# ------------------------------------------------------------ graph export --

def _unique(seen: set[str], name: str, first: int = 0) -> str:
    i = first
    out = "%s_%d" % (name, i) if i else name
    while out in seen:
        i += 1
        out = "%s_%d" % (name, i)
    seen.add(out)
    return out


def _netdef(net: Any) -> Any:
    if isinstance(net, caffe2_pb2.NetDef):
        return net
    if hasattr(net, "Proto"):
        return net.Proto()
    raise TypeError("expected a Net or NetDef, got %s" % type(net).__name__)


def _device(op: Any) -> str:
    d = op.device_option
    if not d.HasField("device_type"):
        return ""
    return "/cpu:*" if d.device_type == caffe2_pb2.CPU else "/gpu:%d" % d.device_id


def _set_attr(attrs: Any, arg: Any, shape_of: Any) -> None:
    k = arg.name
    if k == "shape" and arg.ints:
        shape_of(attrs, arg.ints)
    elif arg.HasField("f"):
        attrs[k].f = arg.f
    elif arg.HasField("i"):
        attrs[k].i = arg.i
    elif arg.HasField("s"):
        attrs[k].s = arg.s
    elif arg.floats:
        attrs[k].list.f.extend(arg.floats)
    elif arg.ints:
        attrs[k].list.i.extend(arg.ints)
    elif arg.strings:
        attrs[k].list.s.extend(arg.strings)
    else:
        attrs[k].list.s.extend([])


def ops_to_graph_def(ops: Sequence[Any], shapes: Mapping[str, Sequence[int]] | None = None,
                     replace_colons: str = "$", with_ssa: bool = True,
                     with_gradient_scope: bool = True) -> Any:
    """A TensorBoard ``GraphDef`` of OperatorDefs (see the module's doc).
    ``shapes``: ``{blob: dims}`` shown on the nodes."""
    _tbx()
    from tensorboardX.proto import graph_pb2
    shapes = dict(shapes or {})

    def shape_of(attrs, dims):
        sh = attrs["_output_shapes"].list.shape.add()
        for d in dims:
            sh.dim.add(size=int(d))

    def rename(name):
        if replace_colons:
            name = name.replace(":", replace_colons)
        if with_gradient_scope and "_grad" in name:
            name = "GRADIENTS/" + name
        return name

    # Blob versions: the n-th write of a blob is version n.
    seen_blobs: set[str] = set()
    version_names: dict[tuple[str, int], str] = {}
    current: dict[str, int] = {}
    shape_by_node: dict[str, Sequence[int]] = {}

    def blob_node_name(blob, version):
        key = (blob, version)
        if key not in version_names:
            version_names[key] = _unique(seen_blobs, rename(blob), version)
            if blob in shapes:
                shape_by_node[version_names[key]] = shapes[blob]
        return version_names[key]

    renamed_ops = []
    for op in ops:
        ins = [blob_node_name(b, current.setdefault(b, 0)) for b in op.input]
        outs = []
        for b in op.output:
            if b in current and with_ssa:
                current[b] += 1  # a write to a blob already seen: a new version
            else:
                current.setdefault(b, 0)
            outs.append(blob_node_name(b, current[b]))
        renamed_ops.append((op, ins, outs))

    taken = set(seen_blobs) | {n for _, i, o in renamed_ops for n in i + o}
    graph = graph_pb2.GraphDef()
    producers: dict[str, list[tuple[str, int, str]]] = {}
    blobs: list[str] = []
    listed: set[str] = set()
    for op, ins, outs in renamed_ops:
        if op.name:
            base = rename(op.name)
        else:
            scopes = [os.path.dirname(n) for n in (outs or ins)]
            scope = os.path.commonprefix(scopes) if scopes else ""
            base = os.path.join(scope, op.type) if scope else op.type
        name = _unique(taken, base)
        node = graph.node.add(name=name, op=op.type, device=_device(op))
        node.input.extend(ins)
        for o in outs:
            if o in shape_by_node:
                shape_of(node.attr, shape_by_node[o])
        for arg in op.arg:
            _set_attr(node.attr, arg, shape_of)
        for i, o in enumerate(outs):
            producers.setdefault(o, []).append((name, i, _device(op)))
        for b in ins + outs:
            if b not in listed:
                listed.add(b)
                blobs.append(b)
    for b in blobs:
        made_by = producers.get(b, [])
        node = graph.node.add(name=b, op="Blob" if made_by else "Placeholder")
        node.input.extend("%s:%d" % (n, i) for n, i, _ in made_by)
        devices = {d for _, _, d in made_by}
        if len(devices) == 1:
            node.device = devices.pop()
        if b in shape_by_node:
            shape_of(node.attr, shape_by_node[b])
    return graph


def nets_to_graph_def(nets: Iterable[Any], shapes: Mapping[str, Sequence[int]] | None = None,
                      **kwargs: Any) -> Any:
    """A TensorBoard ``GraphDef`` of the ops of ``nets`` (Nets or NetDefs),
    in order; a net's device option applies to its ops without one."""
    ops = []
    for net in nets:
        nd = _netdef(net)
        for op in nd.op:
            if nd.HasField("device_option") and not op.HasField("device_option"):
                op = caffe2_pb2.OperatorDef.FromString(op.SerializeToString())
                op.device_option.CopyFrom(nd.device_option)
            ops.append(op)
    return ops_to_graph_def(ops, shapes, **kwargs)


def cnn_to_graph_def(model: Any, **kwargs: Any) -> Any:
    """:func:`nets_to_graph_def` of a model's ``param_init_net`` and ``net``."""
    return nets_to_graph_def([model.param_init_net, model.net], **kwargs)

