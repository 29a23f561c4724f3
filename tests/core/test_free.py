"""Free (Caffe2's free_op): empties its outputs, which must be its inputs
one to one; the op has no gradient."""

import numpy as np
import pytest
from ferrocaffe import core, workspace


def test_free_empties_each_blob_and_leaves_the_others(fresh):
    workspace.FeedBlob("a", np.arange(3.0))
    workspace.FeedBlob("b", np.ones((2, 2), np.int32))
    workspace.FeedBlob("c", np.zeros(1))
    net = core.Net("free")
    net.Free(["a", "b"], ["a", "b"])
    net.Copy("c", "d")
    workspace.RunNetOnce(net)
    assert workspace.HasBlob("a") and workspace.HasBlob("b")
    # Caffe2's answer for a blob that holds nothing.
    for name in ("a", "b"):
        assert workspace.FetchBlob(name) == (
            "%s, a C++ native class of type nullptr (uninitialized)." % name).encode()
    np.testing.assert_array_equal(workspace.FetchBlob("d"), np.zeros(1))
    # An emptied blob can be written again.
    workspace.FeedBlob("a", np.array([7.0]))
    np.testing.assert_array_equal(workspace.FetchBlob("a"), [7.0])


@pytest.mark.parametrize("ins,outs", [(["a"], ["b"]), (["a", "b"], ["a"]), (["a", "b"], ["b", "a"])])
def test_free_refuses_outputs_that_are_not_its_inputs(fresh, ins, outs):
    workspace.FeedBlob("a", np.zeros(1))
    workspace.FeedBlob("b", np.zeros(1))
    net = core.Net("bad_free")
    net.Free(ins, outs)
    with pytest.raises(RuntimeError):
        workspace.RunNetOnce(net)
    np.testing.assert_array_equal(workspace.FetchBlob("a"), np.zeros(1))

