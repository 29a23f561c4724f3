"""net_drawer: pictures of nets and plans (Caffe2's caffe2.python.net_drawer).

The DOT text is checked by parsing it back with pydot's own DOT parser
(no Graphviz needed); the SVG pictures are rendered by Graphviz's `dot`
(installed by .ci/run) and read as XML. Expected names come from the
protos the job compiles to, walked here, not from the drawer."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pydot
import pytest

from _support import PKG_PARENT, load_example, needs_program
from ferrocaffe import core, net_drawer
from ferrocaffe.proto import caffe2_pb2
from ferrocaffe.session import LocalSession


def parse(graph):
    """The DOT text parsed back: {node id: attributes}, [(src, dst, attrs)]."""
    [parsed] = pydot.graph_from_dot_data(graph.to_string())
    nodes, edges = {}, []

    def walk(g):
        for n in g.get_nodes():
            nodes[n.get_name().strip('"')] = n.get_attributes()
        for e in g.get_edges():
            edges.append((str(e.get_source()).strip('"'),
                          str(e.get_destination()).strip('"'), e.get_attributes()))
        for sub in g.get_subgraphs():
            walk(sub)

    walk(parsed)
    nodes.pop('node', None)
    nodes.pop('edge', None)
    return nodes, edges


def label(attrs):
    return json.loads(attrs['label']) if 'label' in attrs else None


def small_net():
    net = caffe2_pb2.NetDef(name='small')
    for t, i, o in [('ConstantFill', [], ['x']), ('Add', ['x', 'x'], ['y']),
                    ('Mul', ['y', 'x'], ['x']), ('Sub', ['x', 'y'], ['z'])]:
        net.op.add(type=t, input=i, output=o)
    return net


def test_net_graph_has_an_op_node_per_op_and_a_node_per_blob_version():
    nodes, edges = parse(net_drawer.GetPydotGraph(small_net()))
    ops = ['ConstantFill (op#0)', 'Add (op#1)', 'Mul (op#2)', 'Sub (op#3)']
    assert all(o in nodes for o in ops)
    # x is written twice: versions x0 and x1; y once, z once.
    blobs = {n: label(a) for n, a in nodes.items() if n not in ops}
    assert blobs == {'x0': 'x', 'x1': 'x', 'y0': 'y', 'z0': 'z'}
    assert sorted((s, d) for s, d, _ in edges) == sorted([
        ('ConstantFill (op#0)', 'x0'), ('x0', 'Add (op#1)'), ('x0', 'Add (op#1)'),
        ('Add (op#1)', 'y0'),
        ('y0', 'Mul (op#2)'), ('x0', 'Mul (op#2)'), ('Mul (op#2)', 'x1'),
        ('x1', 'Sub (op#3)'), ('y0', 'Sub (op#3)'), ('Sub (op#3)', 'z0')])
    assert nodes['Add (op#1)']['shape'] == 'box'
    assert nodes['x0']['shape'] == 'octagon'


def test_a_core_net_and_named_ops_and_custom_producers():
    net = core.Net('built')
    net.ConstantFill([], ['a'], shape=[1], value=1.0, name='fill')
    net.Relu(['a'], ['b'])
    graph = net_drawer.GetPydotGraph(
        net, rankdir='TB',
        op_node_producer=net_drawer.GetOpNodeProducer(True, shape='ellipse'))
    nodes, _ = parse(graph)
    assert 'fill/ConstantFill (op#0)\na' in {json.loads('"%s"' % n) for n in nodes}
    assert json.loads(graph.get_name()) == 'built'
    assert graph.get_rankdir() == 'TB'


def test_minimal_graph_draws_ops_only_and_drops_implied_edges():
    net = caffe2_pb2.NetDef(name='m')
    net.op.add(type='A', output=['a'])
    net.op.add(type='B', input=['a'], output=['b'])
    net.op.add(type='C', input=['a', 'b'], output=['c'])
    _, all_edges = parse(net_drawer.GetPydotGraphMinimal(net))
    assert sorted((s, d) for s, d, _ in all_edges) == [
        ('A (op#0)', 'B (op#1)'), ('A (op#0)', 'C (op#2)'), ('B (op#1)', 'C (op#2)')]
    nodes, edges = parse(net_drawer.GetPydotGraphMinimal(net, minimal_dependency=True))
    assert sorted((s, d) for s, d, _ in edges) == [
        ('A (op#0)', 'B (op#1)'), ('B (op#1)', 'C (op#2)')]
    assert set(nodes) == {'A (op#0)', 'B (op#1)', 'C (op#2)'}


def test_operator_map_for_plan_names_nets_after_the_plan():
    plan = caffe2_pb2.PlanDef(name='p')
    plan.network.add(name='init').op.add(type='ConstantFill', output=['x'])
    plan.network.add().op.add(type='Relu', input=['x'], output=['y'])
    found = net_drawer.GetOperatorMapForPlan(plan)
    assert sorted(found) == ['p_init', 'p_network_1']
    assert [op.type for op in found['p_network_1']] == ['Relu']


def loop_plan():
    """A loop of 5, three concurrent instances under a concurrent step, a
    report net, a stop blob, an only-once step."""
    init = core.Net('init')
    init.ConstantFill([], ['stop'], shape=[], value=False, dtype=core.DataType.BOOL)
    work = core.Net('work')
    work.ConstantFill([], ['w'], shape=[1], value=1.0)
    report = core.Net('report')
    report.ConstantFill([], ['r'], shape=[1], value=2.0)
    loop = core.execution_step('loop', [work], num_iter=5)
    workers = core.execution_step('workers', [work], num_concurrent_instances=3)
    stopper = core.execution_step('stopper', [work], should_stop_blob=core.BlobReference('stop'))
    par = core.execution_step('parallel', [workers, stopper], concurrent_substeps=True)
    par.SetReportNet(report, 1)
    once = core.execution_step('once', [init], only_once=True)
    return core.Plan(core.execution_step('main', [once, loop, par]))


def test_plan_graph_labels_each_step_with_what_it_does():
    nodes, edges = parse(net_drawer.GetPlanGraph(loop_plan()))
    labels = {label(a): n for n, a in nodes.items()}
    assert 'loop\nloop: num_iter=5' in labels
    assert 'workers\nInstances: 3' in labels
    assert 'stopper\nStopper: stop' in labels
    assert 'parallel\nReporter: report (every 1 s)\nConcurrent' in labels
    assert 'once\nOnce' in labels
    assert 'main' in labels
    assert labels and 'net: report' in labels and 'net: work' in labels
    by_id = {n: label(a) for n, a in nodes.items()}
    named = [(by_id[s].split('\n')[0], by_id[d].split('\n')[0], a.get('style'))
             for s, d, a in edges]
    # main's substeps run one after another: solid edges between them.
    assert ('once', 'loop', None) in named and ('loop', 'parallel', None) in named
    # A concurrent step points to each of its substeps (dashed), and these
    # are not chained.
    assert ('parallel', 'workers', 'dashed') in named
    assert ('parallel', 'stopper', 'dashed') in named
    assert ('workers', 'stopper', None) not in named
    assert ('parallel', 'net: report', 'dashed') in named


def test_plan_graph_with_ops_and_a_cut_of_parallel_steps():
    par = core.execution_step('par', [
        core.execution_step('s%d' % i, [core.Net('n%d' % i)]) for i in range(5)],
        concurrent_substeps=True)
    for i, step in enumerate(par.Substeps()):
        step.Nets()[0].ConstantFill([], ['x%d' % i], shape=[1], value=1.0)
    nodes, _ = parse(net_drawer.GetPlanGraph(par, max_parallel_steps=3, include_ops=True))
    labels = {label(a) for a in nodes.values()}
    assert {'s0', 's1', 's2', '2 more steps'} <= labels
    assert 's3' not in labels
    assert 'ConstantFill (op#0)' in labels


def plan_step_names(step, into):
    into.append(step.name)
    for s in step.substep:
        plan_step_names(s, into)
    return into


# The pictures need Graphviz's `dot`; a machine without it skips them
# (.ci/run installs it, and CI fails them if it is missing).
needs_dot = needs_program('dot', 'apt-get install graphviz')


@pytest.fixture
def linear_job(tmp_path):
    example = load_example('linear_job.py')
    cfg = example.Config(workdir=str(tmp_path / 'job'), rows=50, features=3,
                         batches_per_epoch=10, threads=2)
    return example.build_job(cfg)


@needs_dot
def test_the_main_jobs_plans_and_nets_drawn_hold_every_step_and_op(linear_job, tmp_path):
    job = linear_job
    graph = net_drawer.GetPlanGraph(job)
    nodes, _ = parse(graph)
    step_labels = [label(a).split('\n')[0] for a in nodes.values()]
    svg_text = render_svg_text(graph, tmp_path / 'job.svg')
    for group_name in ('init_group', 'epoch_group', 'exit_group'):
        group = getattr(job, group_name)
        plan = LocalSession._compile_task_group(group)[0].Proto()
        names = []
        for s in plan.execution_step:
            plan_step_names(s, names)
        assert names
        for name in names + [group_name]:
            assert name in step_labels, name
            assert name in svg_text, name
        for net in plan.network:
            assert 'net: ' + net.name in [label(a) for a in nodes.values()]
            net_graph = net_drawer.GetPydotGraph(net)
            net_nodes, _ = parse(net_graph)
            net_svg = render_svg_text(net_graph, tmp_path / (net.name.replace('/', '_') + '.svg'))
            for i, op in enumerate(net.op):
                assert '%s (op#%d)' % (op.type, i) in net_nodes
                assert '%s (op#%d)' % (op.type, i) in net_svg


def render_svg_text(graph, path):
    """Renders with Graphviz and returns every <text> of the SVG, joined."""
    assert net_drawer.has_graphviz(), net_drawer.GRAPHVIZ_INSTALL_HINT
    net_drawer.render(graph, str(path))
    root = ET.parse(path).getroot()
    assert root.tag.endswith('svg')
    return '\n'.join(t.text or '' for t in root.iter() if t.tag.endswith('text'))


def test_without_graphviz_dot_text_works_and_pictures_say_how_to_install(tmp_path, monkeypatch):
    graph = net_drawer.GetPydotGraph(small_net())
    monkeypatch.setenv('PATH', str(tmp_path))  # no `dot` there
    assert not net_drawer.has_graphviz()
    out = net_drawer.render(graph, str(tmp_path / 'g.dot'))
    assert 'Add (op#1)' in open(out).read()
    with pytest.raises(FileNotFoundError, match='apt-get install graphviz'):
        net_drawer.render(graph, str(tmp_path / 'g.svg'))
    png = net_drawer.GetGraphPngSafe(net_drawer.GetPydotGraph, small_net())
    assert png.startswith(b'\x89PNG')


def test_graph_in_json(tmp_path):
    path = tmp_path / 'g.json'
    net_drawer.GetGraphInJson(small_net(), str(path))
    g = json.load(open(path))
    ops = [n['label'] for n in g['nodes'] if n['type'] == 'op']
    blobs = [n['label'] for n in g['nodes'] if n['type'] == 'blob']
    assert ops == ['ConstantFill', 'Add', 'Mul', 'Sub']
    assert sorted(blobs) == ['x', 'x', 'y', 'z']
    assert len(g['edges']) == 10  # Add reads x twice: two edges


@needs_dot
@pytest.mark.parametrize('binary', [False, True])
def test_command_line_draws_a_plan_file(tmp_path, binary):
    plan = loop_plan().Proto()
    src = tmp_path / ('plan.pb' if binary else 'plan.pbtxt')
    if binary:
        src.write_bytes(plan.SerializeToString())
    else:
        from google.protobuf import text_format
        src.write_text(text_format.MessageToString(plan))
    env = dict(os.environ, PYTHONPATH=PKG_PARENT)
    out = subprocess.run(
        [sys.executable, '-m', 'ferrocaffe.net_drawer', '--input', str(src),
         '--output_prefix', str(tmp_path) + '/', '--format', 'svg', '--minimal'],
        env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    written = sorted(os.listdir(tmp_path))
    nets = {n.name: n for n in plan.network}
    assert len(nets) == 3
    for name in ['main_plan'] + ['main_' + n for n in nets]:
        assert name + '.dot' in written and name + '.svg' in written, written
    for net_name, net in nets.items():
        [graph] = pydot.graph_from_dot_file(str(tmp_path / ('main_%s.dot' % net_name)))
        nodes, _ = parse(graph)
        assert set(nodes) == {'%s (op#%d)' % (op.type, i) for i, op in enumerate(net.op)}


def test_caffe2_alias_imports_the_drawer():
    code = ('import ferrocaffe; ferrocaffe.register_caffe2_alias(); '
            'from caffe2.python import net_drawer; print(net_drawer.__name__)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=PKG_PARENT), timeout=120)
    assert out.stdout.strip() == 'ferrocaffe.net_drawer', out.stderr
