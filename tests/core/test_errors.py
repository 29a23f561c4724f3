"""The exception tree: every ferrocaffe error is a RuntimeError (as Caffe2's
C++ failures were in Python) and keeps its natural builtin, so code written
for Caffe2 (`except RuntimeError`) and code written for Python (`except
KeyError`) both catch it."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace

BUILTIN = {
    'BlobNotFoundError': KeyError, 'NetNotFoundError': KeyError,
    'WorkspaceNotFoundError': KeyError, 'DataTypeError': TypeError,
    'FeedError': TypeError, 'ShapeError': ValueError,
    'InvalidArgumentError': ValueError, 'UnknownOperatorError': ValueError,
    'InvalidPlanError': ValueError, 'IndexOutOfRangeError': IndexError,
    'DivisionByZeroError': ZeroDivisionError, 'FerrocaffeIOError': OSError,
    'CorruptCheckpointError': ValueError,
    'ConversionError': ValueError, 'UnsupportedOperatorError': NotImplementedError,
}


@pytest.mark.parametrize('name', [n for n in errors.__all__])
def test_every_error_class_is_a_runtime_error(name):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.FerrocaffeError)
    assert issubclass(cls, RuntimeError)
    if name in BUILTIN:
        assert issubclass(cls, BUILTIN[name])
    err = cls('boom', blob='b')
    assert str(err) == 'boom' and err.blob == 'b'


def _raises_runtime_error(fn):
    with pytest.raises(RuntimeError) as info:
        fn()
    assert isinstance(info.value, errors.FerrocaffeError)
    return info.value


def test_caffe2_style_handlers_catch_runtime_failures(tmp_path):
    ws = workspace.Workspace()
    # A Load of a db file that does not exist.
    load = core.Net('load')
    load.Load([], ['x'], db=str(tmp_path / 'missing.db'), db_type='minidb')
    err = _raises_runtime_error(lambda: ws.run(load))
    assert isinstance(err, OSError)
    # A Copy of a blob that does not exist.
    copy = core.Net('copy')
    copy.Copy(['nowhere'], ['y'])
    err = _raises_runtime_error(lambda: ws.run(copy))
    assert isinstance(err, KeyError) and err.blob == 'nowhere'
    # Fetching a missing blob; switching to a missing workspace.
    _raises_runtime_error(lambda: ws.fetch_blob('nowhere'))
    _raises_runtime_error(lambda: workspace.SwitchWorkspace('no such ws'))
    # An op failing on a wrong dtype.
    ws.feed_blob('f', np.ones(2, np.float32))
    ws.feed_blob('d', np.ones(2, np.float64))
    add = core.Net('add')
    add.Add(['f', 'd'], ['s'])
    err = _raises_runtime_error(lambda: ws.run(add))
    assert isinstance(err, TypeError)
