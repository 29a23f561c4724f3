"""The modules of the ferrocaffe package import each other in one direction
only (docs/python.md): the graph of their imports,
read from the source with ast, has no cycle, and a lower module never
reaches a higher one (core knows nothing of net_builder's users, task
nothing of checkpoint).

Imports under `if TYPE_CHECKING:` are for annotations only and never run,
so they are not edges. Imports inside functions (and `importlib.import_module("ferrocaffe.x")`,
and `sys.modules` lookups of a ferrocaffe module) count too. The few that
go upwards on purpose are listed in DOCUMENTED with the reason, as in the
architecture notes; any other import inside a function must name a module
its importer already imports at the top (so it adds no edge)."""

import ast
import os

import ferrocaffe

PACKAGE_DIR = os.path.dirname(os.path.abspath(ferrocaffe.__file__))

# (importer, imported) -> why the edge is lazy and leaves the graph.
DOCUMENTED = {
    ('ferrocaffe.utils', 'ferrocaffe.core'):
        "utils.MakeArgument is core's argument encoding (Caffe2's core "
        "imports utils, so utils cannot import core at the top)",
    ('ferrocaffe.net_builder', 'ferrocaffe.task'):
        "Caffe2's ops.task_group() and ops.task_reporter() make or find a "
        "TaskGroup; task builds on net_builder",
    ('ferrocaffe.core.net', 'ferrocaffe.net_builder'):
        "a sys.modules lookup, never an import: Net names take an active "
        "NetBuilder's prefix",
    ('ferrocaffe.core.steps', 'ferrocaffe.net_builder'):
        "a sys.modules lookup, never an import: to_execution_step takes a "
        "NetBuilder",
    ('ferrocaffe.core.operators', 'ferrocaffe.workspace'):
        "a sys.modules lookup per op (immediate mode); workspace sits below "
        "core, which imports it",
    ('ferrocaffe.onnx.conversion', 'ferrocaffe.onnx.frontend'):
        "the ONNX commands parse their arguments (and print --help) without "
        "the optional onnx package, which the converters import",
    ('ferrocaffe.onnx.conversion', 'ferrocaffe.onnx.backend'):
        "the ONNX commands parse their arguments (and print --help) without "
        "the optional onnx package, which the converters import",
    ('ferrocaffe.core.operators', 'ferrocaffe._python_ops'):
        "the registry is looked up when a Python op is made (the tests "
        "replace it); _python_ops sits below core",
    ('ferrocaffe.core.net', 'ferrocaffe._python_ops'):
        "the registry is looked up when Net.Python makes an op (the tests "
        "replace it); _python_ops sits below core",
    ('ferrocaffe.gradient_checker', 'ferrocaffe.net_drawer'):
        "NetGradientChecker.CompareNets(print_net_images=True) draws the "
        "nets: only then is pydot (an optional package) needed",
}


def module_name(path):
    rel = os.path.relpath(path, os.path.dirname(PACKAGE_DIR))[:-len('.py')]
    parts = rel.split(os.sep)
    if parts[-1] == '__init__':
        parts = parts[:-1]
    return '.'.join(parts)


def package_modules():
    found = {}
    for root, _dirs, files in os.walk(PACKAGE_DIR):
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(root, name)
                found[module_name(path)] = path
    return found


def imported_names(node, importer, is_package, modules):
    """The ferrocaffe modules an import statement or call names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = importer.split('.')
            if not is_package:
                base = base[:-1]
            base = base[:len(base) - (node.level - 1)]
            target = '.'.join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ''
        # `from pkg import mod` imports pkg.mod; `from mod import name`, mod
        return [target + '.' + a.name if target + '.' + a.name in modules
                else target for a in node.names]
    # importlib.import_module('ferrocaffe.x'), sys.modules.get('ferrocaffe.x'),
    # sys.modules['ferrocaffe.x']
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = ast.unparse(node.func)
        if func in ('importlib.import_module', 'sys.modules.get'):
            return [node.args[0].value]
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == 'sys.modules':
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return [key.value]
    return []


def import_graph():
    """{module: (top-level edges, edges made inside functions)}."""
    modules = package_modules()
    graph = {}
    for name, path in modules.items():
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read(), path)
        is_package = path.endswith('__init__.py')
        top, lazy = set(), set()

        def visit(node, in_function):
            if is_type_checking_block(node):
                return  # read by the type checker only, never run
            for target in imported_names(node, name, is_package, modules):
                if target in modules and target != name:
                    (lazy if in_function else top).add(target)
            inner = in_function or isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for child in ast.iter_child_nodes(node):
                visit(child, inner)

        visit(tree, False)
        graph[name] = (top, lazy)
    return graph


def is_type_checking_block(node):
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): imports for
    annotations, which Python never runs."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING') or (
        isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING')


def find_cycle(edges):
    """A cycle of `edges` ({module: set of modules}) as a list, or None."""
    state = {}
    stack = []

    def dfs(node):
        state[node] = 'open'
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 'open':
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 'done'
        return None

    for node in sorted(edges):
        if node not in state:
            found = dfs(node)
            if found:
                return found
    return None


def reach(edges, start):
    seen, todo = set(), [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def counted_edges(graph):
    return {m: top | {t for t in lazy if (m, t) not in DOCUMENTED}
            for m, (top, lazy) in graph.items()}


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert 'ferrocaffe.core' in graph and 'ferrocaffe.checkpoint.job' in graph
    assert find_cycle(counted_edges(graph)) is None


def test_lazy_imports_are_documented_or_add_no_edge():
    graph = import_graph()
    undocumented = sorted(
        (m, t) for m, (top, lazy) in graph.items() for t in lazy
        if t not in top and (m, t) not in DOCUMENTED)
    assert undocumented == []
    # and every documented one is still there (or the list is stale)
    assert sorted(e for e in DOCUMENTED if e[1] not in graph[e[0]][1]) == []


def test_lower_modules_never_reach_higher_ones():
    edges = counted_edges(import_graph())
    below_core = ['ferrocaffe.errors', 'ferrocaffe.proto', 'ferrocaffe.utils',
                  'ferrocaffe.scope', 'ferrocaffe.workspace',
                  'ferrocaffe._python_ops']
    for low in below_core:
        assert 'ferrocaffe.core' not in reach(edges, low), low
    higher_than_core = {'ferrocaffe.schema', 'ferrocaffe.net_builder',
                        'ferrocaffe.task', 'ferrocaffe.session',
                        'ferrocaffe.checkpoint'}
    assert reach(edges, 'ferrocaffe.core') & higher_than_core == set()
    # even counting the documented lazy edges, core never imports task
    assert 'ferrocaffe.task' not in import_graph()['ferrocaffe.core'][1]
    task_reach = reach(edges, 'ferrocaffe.task')
    assert not {m for m in task_reach if m.startswith('ferrocaffe.checkpoint')}
    assert 'ferrocaffe.session' not in task_reach


def test_the_cycle_finder_finds_cycles():
    # The checker itself, on small graphs whose answer is known.
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': set()}) is None
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'a'}}) == ['a', 'a']


def test_type_checking_blocks_are_not_edges():
    tree = ast.parse(
        "import typing\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import a\n"
        "if typing.TYPE_CHECKING:\n    import b\n"
        "if other:\n    import c\n")
    blocks = [n for n in tree.body if isinstance(n, ast.If)]
    assert [is_type_checking_block(n) for n in blocks] == [True, True, False]
