"""Paths and small helpers shared by test modules in every area folder.

Imported as a top-level module (`from _support import ...`), like
`_child`: tests/conftest.py puts this folder on sys.path."""

import importlib.util
import os
import shutil
import threading

import pytest

import ferrocaffe

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
EXAMPLES = os.path.join(REPO, 'examples')
# The folder holding the ferrocaffe this process imported (python/ with a dev
# build in a checkout, site-packages when installed): child processes are
# given it on PYTHONPATH so that they import the same package.
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(ferrocaffe.__file__)))


def load_example(name):
    """Imports examples/<name> (a file name) as a fresh module."""
    spec = importlib.util.spec_from_file_location(
        name.replace('.py', ''), os.path.join(EXAMPLES, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_in_thread(fn, timeout=None):
    """Runs fn() on a new thread (fresh thread-local defaults: Node, Cluster)
    and returns its result or re-raises what it raised. With a `timeout`,
    a call still running after that many seconds fails the test (a hang)."""
    box = {}

    def target():
        try:
            box['value'] = fn()
        except BaseException as e:  # re-raised below, in the test's thread
            box['error'] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f'the call did not finish within {timeout} s'
    if 'error' in box:
        raise box['error']
    return box.get('value')


# CI (.ci/run installs the system programs some tests need) sets this, so
# that a missing program fails those tests there instead of skipping them.
REQUIRE_PROGRAMS = bool(os.environ.get('FERROCAFFE_REQUIRE_PROGRAMS')
                        or os.environ.get('FERROCAFFE_REQUIRE_BROWSER')
                        or os.environ.get('CI'))


def needs_program(name, install):
    """A mark that skips a test (with a one-line reason) when the system
    program `name` is not on PATH, unless CI requires the program: then the
    test runs and fails on its absence. `install` says how to get it."""
    missing = shutil.which(name) is None
    return pytest.mark.skipif(missing and not REQUIRE_PROGRAMS,
                              reason=f'needs the {name} program ({install})')
