"""Settings and fixtures shared by every test module (in tests/<area>/).

This folder is put on sys.path so that every area imports the helper
modules `_child` and `_support` by name.

The Ray clusters the tests start (tests/test_distributed*.py) live on
loopback addresses only; they use no token authentication (nothing outside
this machine can reach them) and send no usage reports. Set before Ray is
imported.
"""

import os

os.environ.setdefault('RAY_AUTH_MODE', 'disabled')
os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')

import itertools  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

_TESTS = os.path.dirname(os.path.abspath(__file__))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

_workspace_ids = itertools.count()


@pytest.fixture
def fresh():
    """Makes a new, empty named workspace current for the test (its name is
    the fixture's value) and switches back afterwards."""
    from ferrocaffe import workspace

    previous = workspace.CurrentWorkspace()
    name = f"test_workspace_{os.getpid()}_{next(_workspace_ids)}"
    workspace.SwitchWorkspace(name, True)
    try:
        yield name
    finally:
        workspace.SwitchWorkspace(previous)


@pytest.fixture(autouse=True)
def _fresh_task_names():
    """Task names are unique per process (Caffe2 adds a suffix to a name
    already used): every test starts with none used, so the names it sees
    do not depend on which tests ran before it."""
    _clear_task_names()
    yield
    _clear_task_names()


def _clear_task_names():
    # Only if a test imported ferrocaffe.task: importing it here would change
    # what the tests of import order see.
    task = sys.modules.get('ferrocaffe.task')
    if task is not None:
        task.Task._global_names_used.clear()
