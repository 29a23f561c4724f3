"""Pictures of nets and plans (Caffe2's ``caffe2.python.net_drawer``).

Graphs are ``pydot.Dot`` objects, as in Caffe2, so everything pydot offers
works on them: ``graph.to_string()`` is the DOT text (no Graphviz needed),
``graph.create_svg()`` / ``graph.write_png(path)`` render it with Graphviz's
``dot`` program. :func:`render` writes a file of either kind and says how to
install Graphviz when ``dot`` is missing.

* :func:`GetPydotGraph` -- a net's ops (boxes) and blobs (octagons); a blob
  written again gets a new node, so the picture is the net's dataflow.
* :func:`GetPydotGraphMinimal` -- ops only, an edge from each op to the ops
  whose outputs it reads (only the nearest ones with
  ``minimal_dependency=True``).
* :func:`GetPlanGraph` -- the steps of a plan (or of a step, Task,
  TaskGroup or Job): one box per step, labelled with what it does (loops and
  their ``num_iter``, stop blobs, report nets and steps, concurrent
  substeps, concurrent instances, ``only_once``, a new workspace), dashed
  edges to its substeps and nets, solid edges from a step to the next one.
* :func:`GetOperatorMapForPlan` -- ``{plan_name + '_' + net_name: ops}``.

From the command line (a ``.pb`` or ``.pbtxt`` NetDef or PlanDef)::

    python -m ferrocaffe.net_drawer --input plan.pbtxt --output_prefix out/ --format svg
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

from ferrocaffe import core
from ferrocaffe.checkpoint import Job
from ferrocaffe.proto import caffe2_pb2
from ferrocaffe.session import LocalSession
from ferrocaffe.task import Task, TaskGroup

try:
    import pydot
except ImportError:  # pragma: no cover - pydot is a declared dependency of the 'draw' extra
    pydot = None

logger = logging.getLogger(__name__)

__all__ = [
    'OP_STYLE', 'BLOB_STYLE', 'NET_STYLE', 'GRAPHVIZ_INSTALL_HINT',
    'GetOpNodeProducer', 'GetBlobNodeProducer', 'GetPydotGraph',
    'GetPydotGraphMinimal', 'GetOperatorMapForPlan', 'GetPlanGraph',
    'GetGraphInJson', 'GetGraphPngSafe', 'render', 'has_graphviz', 'plan_def', 'main',
]

OP_STYLE = {
    'shape': 'box',
    'color': '#0F9D58',
    'style': 'filled',
    'fontcolor': '#FFFFFF',
}
BLOB_STYLE = {'shape': 'octagon'}
NET_STYLE = {'shape': 'ellipse', 'color': '#4285F4'}
_REPORT_STYLE = {'shape': 'box', 'color': '#F4B400', 'style': 'filled'}

PYDOT_INSTALL_HINT = (
    "drawing needs pydot: pip install pydot (or pip install 'ferrocaffe[draw]')")
GRAPHVIZ_INSTALL_HINT = (
    "rendering a picture needs Graphviz's 'dot' program on PATH: install it "
    "with 'apt-get install graphviz' (Debian, Ubuntu), 'dnf install graphviz' "
    "(Fedora), 'brew install graphviz' (macOS) or 'conda install graphviz'; "
    "the DOT text (graph.to_string(), or format='dot') needs no Graphviz")


def _pydot():
    if pydot is None:
        raise ImportError(PYDOT_INSTALL_HINT)
    return pydot


def _escape_label(name: str) -> str:
    """A DOT identifier for any text: a quoted JSON string."""
    return json.dumps(name)


def _rectify_operator_and_name(operators_or_net: Any, name: str | None):
    """``(ops, name)`` of a NetDef, a ``core.Net`` (anything with
    ``Proto()`` returning a NetDef) or a sequence of OperatorDefs."""
    if isinstance(operators_or_net, caffe2_pb2.NetDef):
        ops = operators_or_net.op
        if name is None:
            name = operators_or_net.name
    elif hasattr(operators_or_net, 'Proto'):
        proto = operators_or_net.Proto()
        if not isinstance(proto, caffe2_pb2.NetDef):
            raise TypeError('expected a NetDef from %r.Proto(), got %s'
                            % (operators_or_net, type(proto).__name__))
        ops = proto.op
        if name is None:
            name = proto.name
    else:
        ops = operators_or_net
        if name is None:
            name = 'unnamed'
    return ops, name


def _op_node_name(op: caffe2_pb2.OperatorDef, op_id: int) -> str:
    if op.name:
        return '%s/%s (op#%d)' % (op.name, op.type, op_id)
    return '%s (op#%d)' % (op.type, op_id)


def GetOpNodeProducer(append_output: bool, **kwargs: Any) -> Callable[[Any, int], Any]:
    """A function ``(op, op_id) -> pydot.Node`` naming the node
    ``'<op name>/<type> (op#<id>)'`` (``'<type> (op#<id>)'`` for an op
    without a name), with the output blob names on further lines when
    ``append_output``; ``kwargs`` are the node's Graphviz attributes."""
    def op_node(op, op_id):
        text = _op_node_name(op, op_id)
        if append_output:
            text += ''.join('\n' + o for o in op.output)
        return _pydot().Node(_escape_label(text), **kwargs)
    return op_node


def GetBlobNodeProducer(**kwargs: Any) -> Callable[[str, str], Any]:
    """A function ``(node_name, label) -> pydot.Node`` for blobs;
    ``kwargs`` are the node's Graphviz attributes."""
    def blob_node(node_name, label):
        return _pydot().Node(node_name, label=label, **kwargs)
    return blob_node


def GetPydotGraph(operators_or_net: Any, name: str | None = None, rankdir: str = 'LR',
                  op_node_producer: Callable | None = None,
                  blob_node_producer: Callable | None = None) -> Any:
    """The dataflow graph of a net: an op node per op, a blob node per
    version of a blob (a blob written again gets a new node), edges from the
    blobs an op reads to it and from it to the blobs it writes.

    ``operators_or_net``: a NetDef, a ``core.Net`` or a list of
    OperatorDefs; ``name``: the graph's name (default: the net's);
    ``rankdir``: Graphviz's layout direction ('LR', 'TB', ...)."""
    dot = _pydot()
    if op_node_producer is None:
        op_node_producer = GetOpNodeProducer(False, **OP_STYLE)
    if blob_node_producer is None:
        blob_node_producer = GetBlobNodeProducer(**BLOB_STYLE)
    ops, name = _rectify_operator_and_name(operators_or_net, name)
    graph = dot.Dot(_escape_label(name), graph_type='digraph', rankdir=rankdir)
    current: dict[str, Any] = {}  # blob -> node of its current version
    versions: dict[str, int] = defaultdict(int)

    def blob_node(blob):
        return blob_node_producer(_escape_label('%s%d' % (blob, versions[blob])),
                                  label=_escape_label(blob))

    for op_id, op in enumerate(ops):
        op_node = op_node_producer(op, op_id)
        graph.add_node(op_node)
        for blob in op.input:
            node = current.get(blob)
            if node is None:
                node = current[blob] = blob_node(blob)
                graph.add_node(node)
            graph.add_edge(dot.Edge(node, op_node))
        for blob in op.output:
            if blob in current:
                versions[blob] += 1
            node = current[blob] = blob_node(blob)
            graph.add_node(node)
            graph.add_edge(dot.Edge(op_node, node))
    return graph


def GetPydotGraphMinimal(operators_or_net: Any, name: str | None = None, rankdir: str = 'LR',
                         minimal_dependency: bool = False,
                         op_node_producer: Callable | None = None) -> Any:
    """The ops of a net without their blobs: an edge from op A to op B when
    B reads a blob A wrote last. With ``minimal_dependency`` an edge is left
    out when another parent of B already depends on A (the edge is implied)."""
    dot = _pydot()
    if op_node_producer is None:
        op_node_producer = GetOpNodeProducer(False, **OP_STYLE)
    ops, name = _rectify_operator_and_name(operators_or_net, name)
    graph = dot.Dot(_escape_label(name), graph_type='digraph', rankdir=rankdir)
    _add_minimal_ops(graph, ops, op_node_producer, minimal_dependency)
    return graph


def _add_minimal_ops(graph, ops, op_node_producer, minimal_dependency):
    """Adds the ops of a net to ``graph`` (or a cluster) as in
    GetPydotGraphMinimal; returns their nodes."""
    dot = _pydot()
    writer: dict[str, int] = {}       # blob -> index of the op that wrote it last
    ancestors: list[set[int]] = []   # per op, every op it depends on
    nodes = []
    for op_id, op in enumerate(ops):
        node = op_node_producer(op, op_id)
        graph.add_node(node)
        nodes.append(node)
        parents = sorted({writer[b] for b in op.input if b in writer})
        mine: set[int] = set(parents)
        for p in parents:
            mine |= ancestors[p]
        ancestors.append(mine)
        for p in parents:
            if minimal_dependency and any(p in ancestors[q] for q in parents if q != p):
                continue
            graph.add_edge(dot.Edge(nodes[p], node))
        for b in op.output:
            writer[b] = op_id
    return nodes


def GetOperatorMapForPlan(plan_def: Any) -> dict[str, Any]:
    """``{'<plan name>_<net name>': ops}`` for every net of a PlanDef
    (``'<plan name>_network_<i>'`` for a net without a name)."""
    plan_def = _as_plan_def(plan_def)
    found = {}
    for i, net in enumerate(plan_def.network):
        if net.HasField('name'):
            found[plan_def.name + '_' + net.name] = net.op
        else:
            found[plan_def.name + '_network_%d' % i] = net.op
    return found


# -------------------------------------------------------------------- plans --

def _as_plan_def(obj: Any) -> Any:
    """A PlanDef for a PlanDef, ``core.Plan``, step (ours or a proto), Task,
    TaskGroup or Job (its init, epoch and exit groups, one step each)."""
    if isinstance(obj, caffe2_pb2.PlanDef):
        return obj
    if isinstance(obj, core.Plan):
        return obj.Proto()
    if isinstance(obj, core.ExecutionStep):
        return core.Plan(obj).Proto()
    if isinstance(obj, caffe2_pb2.ExecutionStep):
        plan = caffe2_pb2.PlanDef(name=obj.name)
        plan.execution_step.add().CopyFrom(obj)
        return plan
    if isinstance(obj, Job):
        plan = caffe2_pb2.PlanDef(name='job')
        seen = set()
        for group_name in ('init_group', 'epoch_group', 'exit_group'):
            group = getattr(obj, group_name)
            if not group.tasks():
                continue
            sub = _as_plan_def(group)
            step = plan.execution_step.add()
            step.name = group_name
            step.substep.extend(sub.execution_step)
            for net in sub.network:
                if net.name not in seen:
                    seen.add(net.name)
                    plan.network.add().CopyFrom(net)
        return plan
    if isinstance(obj, TaskGroup):
        return LocalSession._compile_task_group(obj)[0].Proto()
    if isinstance(obj, Task):
        return core.Plan(obj.get_step()).Proto()
    raise TypeError('cannot draw a plan of %s: expected a PlanDef, Plan, '
                    'ExecutionStep, Task, TaskGroup or Job' % type(obj).__name__)


def plan_def(obj: Any) -> Any:
    """The PlanDef a PlanDef, ``core.Plan``, step, Task, TaskGroup or Job
    runs as (a Job: one step per non-empty group, ``init_group``,
    ``epoch_group``, ``exit_group``, and every net of them)."""
    return _as_plan_def(obj)


def _step_label(step) -> str:
    lines = [step.name or '(unnamed step)']
    if step.HasField('num_iter') and step.num_iter != 1:
        lines.append('loop: num_iter=%d' % step.num_iter)
    if step.should_stop_blob:
        lines.append('Stopper: %s' % step.should_stop_blob)
    if step.HasField('run_every_ms'):
        lines.append('report step: every %d ms' % step.run_every_ms)
    if step.report_net:
        lines.append('Reporter: %s (every %d s)' % (step.report_net, step.report_interval))
    if step.concurrent_substeps:
        lines.append('Concurrent')
    if step.num_concurrent_instances > 1:
        lines.append('Instances: %d' % step.num_concurrent_instances)
    if step.only_once:
        lines.append('Once')
    if step.create_workspace:
        lines.append('new workspace')
    return '\n'.join(lines)


class _PlanDrawer:
    def __init__(self, graph, nets: dict[str, Any], include_ops: bool,
                 max_parallel_steps: int | None):
        self.g = graph
        self.nets = nets
        self.include_ops = include_ops
        self.max_parallel = max_parallel_steps
        self.count = 0
        self.dot = _pydot()

    def _id(self, kind: str) -> str:
        self.count += 1
        return '%s_%d' % (kind, self.count)

    def net(self, name: str, style: dict) -> Any:
        node = self.dot.Node(self._id('net'), label=_escape_label('net: ' + name), **style)
        self.g.add_node(node)
        netdef = self.nets.get(name)
        if self.include_ops and netdef is not None and len(netdef.op):
            cluster = self.dot.Cluster(self._id('ops'), label=_escape_label(name),
                                       style='dashed')
            producer = _prefixed_op_producer(self._id('n'))
            op_nodes = _add_minimal_ops(cluster, netdef.op, producer, True)
            self.g.add_subgraph(cluster)
            self.g.add_edge(self.dot.Edge(node, op_nodes[0], style='dotted',
                                          arrowhead='none'))
        return node

    def steps(self, steps: Sequence[Any], chain: bool = True) -> list[Any]:
        nodes = []
        for step in steps:
            node = self.dot.Node(self._id('step'), label=_escape_label(_step_label(step)),
                                 **OP_STYLE)
            self.g.add_node(node)
            if chain and nodes:
                self.g.add_edge(self.dot.Edge(nodes[-1], node))
            nodes.append(node)
            parallel = bool(step.concurrent_substeps)
            if step.substep:
                shown = step.substep
                if parallel and self.max_parallel is not None:
                    shown = step.substep[:self.max_parallel]
                children = self.steps(shown, chain=not parallel)
            else:
                children = self._nets_of(step.network)
            if parallel:
                for child in children:
                    self.g.add_edge(_substep_edge(node, child))
                hidden = len(step.substep) - len(children)
                if hidden > 0:
                    more = self.dot.Node(self._id('more'),
                                         label=_escape_label('%d more steps' % hidden),
                                         **OP_STYLE)
                    self.g.add_node(more)
                    self.g.add_edge(_substep_edge(node, more))
            elif children:
                self.g.add_edge(_substep_edge(node, children[0]))
            if step.report_net:
                report = self.net(step.report_net, _REPORT_STYLE)
                self.g.add_edge(self.dot.Edge(node, report, style='dashed',
                                              label=_escape_label('report')))
        return nodes

    def _nets_of(self, names: Iterable[str]) -> list[Any]:
        nodes = []
        for name in names:
            node = self.net(name, NET_STYLE)
            if nodes:
                self.g.add_edge(self.dot.Edge(nodes[-1], node))
            nodes.append(node)
        return nodes


def _prefixed_op_producer(prefix: str) -> Callable[[Any, int], Any]:
    def op_node(op, op_id):
        return _pydot().Node('%s_%d' % (prefix, op_id),
                             label=_escape_label(_op_node_name(op, op_id)), **OP_STYLE)
    return op_node


def _substep_edge(start, end):
    return _pydot().Edge(start, end, arrowhead='dot', style='dashed')


def GetPlanGraph(plan_def: Any, name: str | None = None, rankdir: str = 'TB',
                 include_ops: bool = False,
                 max_parallel_steps: int | None = None) -> Any:
    """The steps of a plan: a box per step labelled with its name and what
    it does (``loop: num_iter=N``, ``Stopper: <blob>``, ``Reporter: <net>``,
    ``Concurrent``, ``Instances: N``, ``Once``, ``new workspace``), an
    ellipse per net it runs, dashed edges from a step to its substeps and
    nets, solid edges from a step (or net) to the next one.

    ``plan_def``: a PlanDef, ``core.Plan``, ExecutionStep, Task, TaskGroup
    or Job. ``include_ops`` also draws each net's ops (a cluster per net,
    edges as in GetPydotGraphMinimal). ``max_parallel_steps`` draws only the
    first so many substeps of a concurrent step and a node counting the
    rest (Caffe2 always cut at 3; default: all)."""
    dot = _pydot()
    plan = _as_plan_def(plan_def)
    graph = dot.Dot(_escape_label(name if name is not None else plan.name or 'plan'),
                    graph_type='digraph', rankdir=rankdir, compound='true')
    nets = {n.name: n for n in plan.network}
    _PlanDrawer(graph, nets, include_ops, max_parallel_steps).steps(plan.execution_step)
    return graph


def GetGraphInJson(operators_or_net: Any, output_filepath: str) -> None:
    """Writes a net's dataflow graph as JSON: ``{'nodes': [{'id', 'label',
    'type': 'op'|'blob', 'op_id' (ops)}], 'edges': [{'source', 'target'}]}``,
    a blob written again getting a new node, as in GetPydotGraph."""
    ops, _ = _rectify_operator_and_name(operators_or_net, None)
    nodes: list[dict] = []
    edges: list[dict] = []
    current: dict[str, int] = {}

    def new_blob(blob):
        current[blob] = len(nodes)
        nodes.append({'id': len(nodes), 'label': blob, 'type': 'blob'})
        return current[blob]

    for op_id, op in enumerate(ops):
        me = len(nodes)
        nodes.append({'id': me, 'label': op.name + '/' + op.type if op.name else op.type,
                      'op_id': op_id, 'type': 'op'})
        for blob in op.input:
            src = current[blob] if blob in current else new_blob(blob)
            edges.append({'source': src, 'target': me})
        for blob in op.output:
            edges.append({'source': me, 'target': new_blob(blob)})
    with open(output_filepath, 'w') as f:
        json.dump({'nodes': nodes, 'edges': edges}, f)


# A 1x1 PNG, returned by GetGraphPngSafe when drawing fails.
_EMPTY_PNG = bytes.fromhex(
    '89504e470d0a1a0a0000000d4948445200000001000000010100000000376ef924'
    '0000000a49444154789c636000000002000148afa4710000000049454e44ae426082')


def GetGraphPngSafe(func: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
    """``func(*args, **kwargs).create_png()`` (``func``: GetPydotGraph or
    another drawer); when anything fails, logs why and returns a 1x1 PNG."""
    try:
        graph = func(*args, **kwargs)
        if pydot is None or not isinstance(graph, pydot.Dot):
            raise TypeError('%s did not return a pydot.Dot' % getattr(func, '__name__', func))
        _require_dot()
        return graph.create_png()
    except Exception as e:
        logger.error('Failed to draw graph: %s', e)
        return _EMPTY_PNG


# ---------------------------------------------------------------- rendering --

def has_graphviz() -> bool:
    """Whether Graphviz's ``dot`` program is on PATH."""
    return shutil.which('dot') is not None


def _require_dot() -> None:
    if not has_graphviz():
        raise FileNotFoundError(GRAPHVIZ_INSTALL_HINT)


def render(graph: Any, path: str, format: str | None = None) -> str:
    """Writes ``graph`` to ``path`` as DOT text (``format`` 'dot' or 'raw',
    no Graphviz needed) or rendered by ``dot`` ('svg', 'png', 'pdf', ...;
    default: the file's extension). A missing ``dot`` raises
    ``FileNotFoundError`` saying how to install Graphviz. Returns ``path``."""
    if format is None:
        format = os.path.splitext(path)[1].lstrip('.').lower() or 'dot'
    if format in ('dot', 'raw', 'gv'):
        with open(path, 'w') as f:
            f.write(graph.to_string())
        return path
    _require_dot()
    graph.write(path, format=format)
    return path


# --------------------------------------------------------------------- main --

def _read_proto(path: str) -> Any:
    """A PlanDef or NetDef from a text (.pbtxt) or binary (.pb) file."""
    from google.protobuf import text_format
    with open(path, 'rb') as f:
        data = f.read()
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError:
        text = None
    if text is not None:
        for cls in (caffe2_pb2.PlanDef, caffe2_pb2.NetDef):
            try:
                return text_format.Parse(text, cls())
            except text_format.ParseError:
                continue
    # Binary: protobuf parses many byte strings as either message; a plan
    # is one whose steps and nets look like steps and nets.
    errors = []
    try:
        plan = caffe2_pb2.PlanDef.FromString(data)
        if plan.execution_step and all(op.type for n in plan.network for op in n.op):
            return plan
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        errors.append(e)
    try:
        return caffe2_pb2.NetDef.FromString(data)
    except Exception as e:  # noqa: BLE001
        errors.append(e)
    raise ValueError('%s holds neither a PlanDef nor a NetDef (text or binary): %s'
                     % (path, errors[-1] if errors else 'no match'))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ferrocaffe.net_drawer --input FILE``: draws every net of a
    NetDef or PlanDef file (and a plan's steps) as ``<prefix><name>.dot``
    plus a rendered picture (``--format``, default pdf as in Caffe2) when
    Graphviz is installed."""
    p = argparse.ArgumentParser(description='ferrocaffe net drawer (Caffe2 net_drawer).')
    p.add_argument('--input', type=str, required=True,
                   help='the NetDef or PlanDef file (.pb binary or .pbtxt text)')
    p.add_argument('--output_prefix', type=str, default='',
                   help='prefix of the output file names')
    p.add_argument('--minimal', action='store_true',
                   help='draw ops only (no blob nodes)')
    p.add_argument('--minimal_dependency', action='store_true',
                   help='with --minimal, draw only the nearest dependencies')
    p.add_argument('--append_output', action='store_true',
                   help='append the output blob names to the op nodes')
    p.add_argument('--rankdir', type=str, default='LR',
                   help="Graphviz's rank direction (LR, TB, ...)")
    p.add_argument('--format', type=str, default='pdf',
                   help="picture format besides the .dot file (svg, png, pdf, or 'dot' for none)")
    args = p.parse_args(argv)
    proto = _read_proto(args.input)
    graphs = []
    if isinstance(proto, caffe2_pb2.PlanDef):
        operator_map = GetOperatorMapForPlan(proto)
        graphs.append(GetPlanGraph(proto, name=(proto.name or 'plan') + '_plan'))
    else:
        operator_map = {proto.name or 'unnamed': proto.op}
    producer = GetOpNodeProducer(args.append_output, **OP_STYLE)
    for key, ops in operator_map.items():
        if args.minimal:
            graphs.append(GetPydotGraphMinimal(
                ops, name=key, rankdir=args.rankdir,
                minimal_dependency=args.minimal_dependency, op_node_producer=producer))
        else:
            graphs.append(GetPydotGraph(ops, name=key, rankdir=args.rankdir,
                                        op_node_producer=producer))
    warned = False
    for graph in graphs:
        base = args.output_prefix + json.loads(graph.get_name())
        print(render(graph, base + '.dot'))
        if args.format in ('dot', 'raw'):
            continue
        try:
            print(render(graph, base + '.' + args.format, args.format))
        except FileNotFoundError as e:
            if not warned:
                print('wrote the .dot files only: %s' % e, file=sys.stderr)
                warned = True
    return 0


if __name__ == '__main__':
    sys.exit(main())
