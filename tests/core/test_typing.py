"""The public API of core, task, session and checkpoint is annotated, and
the annotations hold: mypy (configured in pyproject.toml, [tool.mypy])
reports no error on those modules. The package says it is typed
(py.typed), so its annotations are what users' type checkers read."""

import ast
import os
import subprocess
import sys

from _support import REPO

PACKAGE = os.path.join(REPO, 'python', 'ferrocaffe')
ANNOTATED = ['task.py', 'session.py'] + [
    os.path.join(package, name)
    for package in ('core', 'checkpoint')
    for name in sorted(os.listdir(os.path.join(PACKAGE, package)))
    if name.endswith('.py')]
# Dunder methods that are part of the API (the rest follow the protocols).
PUBLIC_DUNDERS = {'__init__', '__call__', '__enter__', '__exit__',
                  '__getattr__'}


def public_functions(tree):
    """(qualified name, FunctionDef) of the module's public functions and
    the public methods of its public classes."""
    def public(name):
        return not name.startswith('_') or name in PUBLIC_DUNDERS

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and public(node.name):
            yield node.name, node
        if isinstance(node, ast.ClassDef) and not node.name.startswith('_'):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and public(item.name):
                    yield node.name + '.' + item.name, item


def unannotated(function):
    """What of the signature lacks an annotation: parameter names, and
    'return'."""
    args = function.args
    params = (args.posonlyargs + args.args + args.kwonlyargs
              + [a for a in (args.vararg, args.kwarg) if a is not None])
    first = (args.posonlyargs + args.args)[:1]
    is_method_receiver = [a.arg for a in first] in (['self'], ['cls'])
    missing = [a.arg for a in params
               if a.annotation is None
               and not (is_method_receiver and a is first[0])]
    if function.returns is None:
        missing.append('return')
    return missing


def test_the_public_api_is_annotated():
    missing = {}
    count = 0
    for rel in ANNOTATED:
        with open(os.path.join(PACKAGE, rel), encoding='utf-8') as f:
            tree = ast.parse(f.read())
        for name, function in public_functions(tree):
            count += 1
            gaps = unannotated(function)
            if gaps:
                missing['%s:%s' % (rel, name)] = gaps
    assert count > 200  # the check saw the API (core alone has ~100)
    assert missing == {}


def test_the_annotations_type_check(tmp_path):
    done = subprocess.run(
        [sys.executable, '-m', 'mypy', '--cache-dir', str(tmp_path / 'cache')],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith('Success: no issues found'), done.stdout


def test_the_checker_sees_a_missing_annotation():
    # The annotation check itself, on functions whose answer is known.
    tree = ast.parse(
        'def f(a: int, b, *c, d: str = "", **e) -> None: pass\n'
        'class K:\n'
        '    def m(self, x: int): pass\n'
        '    @classmethod\n'
        '    def k(cls) -> "K": pass\n'
        '    def _private(self, y): pass\n')
    found = {name: unannotated(fn) for name, fn in public_functions(tree)}
    assert found == {'f': ['b', 'c', 'e'], 'K.m': ['return'], 'K.k': []}
