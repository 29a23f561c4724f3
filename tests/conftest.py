"""Settings and fixtures shared by every test module.

The Ray clusters the tests start (tests/test_distributed*.py) live on
loopback addresses only; they use no token authentication (nothing outside
this machine can reach them) and send no usage reports. Set before Ray is
imported.
"""

import os

os.environ.setdefault('RAY_AUTH_MODE', 'disabled')
os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')

import itertools  # noqa: E402

import pytest  # noqa: E402

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
