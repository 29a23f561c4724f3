"""The `.pyi` stub of the compiled module matches what the module exports."""

import ast
import pathlib

import ferrocaffe
from ferrocaffe import _core

STUB = pathlib.Path(ferrocaffe.__file__).with_name("_core.pyi")


def _stub_tree():
    return ast.parse(STUB.read_text())


def _public(names):
    return {n for n in names if not n.startswith("_") or n == "__version__"}


def test_stub_ships_with_the_package():
    assert STUB.is_file()
    assert pathlib.Path(ferrocaffe.__file__).with_name("py.typed").is_file()


def test_module_level_names_match():
    tree = _stub_tree()
    stubbed = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            stubbed.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            stubbed.add(node.target.id)
    exported = _public(dir(_core)) - {"__doc__", "__file__", "__loader__", "__name__", "__package__", "__spec__", "__all__"}
    assert stubbed == exported


def test_class_members_match():
    tree = _stub_tree()
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        stubbed = set()
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name != "__init__":
                stubbed.add(item.name)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                stubbed.add(item.target.id)
        cls = getattr(_core, node.name)
        real = {n for n in vars(cls) if not n.startswith("_")}
        assert stubbed == real, node.name
