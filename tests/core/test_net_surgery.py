"""Net.ClonePartial, Net.reroute_tensor and core.InjectCrossDeviceCopies
(issue 13), with expected nets written out by hand."""

import numpy as np
import pytest

from ferrocaffe import core, errors, workspace
from ferrocaffe.proto import caffe2_pb2


def chain():
    n = core.Net("chain")
    x = n.AddExternalInput("x")
    y = n.Scale(x, "y", scale=2.0)
    z = n.Add([y, "w"], "z")
    n.Scale(z, z, scale=3.0)  # in place: z's last value
    u = n.Scale(y, "u", scale=5.0)
    return n, x, y, z, u


def test_clone_partial_keeps_only_the_path(fresh):
    n, x, y, z, u = chain()
    part, (z2,) = n.ClonePartial("p", {x: "x2"}, [z])
    ops = part.Proto().op
    assert [op.type for op in ops] == ["Scale", "Add", "Scale"]
    assert [list(op.input) for op in ops] == [["x2"], ["p/y", "w"], ["p/z"]]
    assert [list(op.output) for op in ops] == [["p/y"], ["p/z"], ["p/z"]]
    # w is read but nothing kept writes it: an input under its own name.
    assert list(part.Proto().external_input) == ["x2", "w"]
    assert list(part.Proto().external_output) == ["p/z"]
    assert str(z2) == "p/z" and z2.Net() is part
    # It runs: z = 3 * (2 * x + w), by hand.
    workspace.FeedBlob("x2", np.array([1.0, 2.0], np.float32))
    workspace.FeedBlob("w", np.array([10.0, 20.0], np.float32))
    workspace.RunNetOnce(part)
    np.testing.assert_allclose(workspace.FetchBlob("p/z"), [36.0, 72.0])


def test_clone_partial_from_an_intermediate_blob(fresh):
    n, x, y, z, u = chain()
    part, (u2,) = n.ClonePartial("q", [y], [u])
    assert [list(op.input) for op in part.Proto().op] == [["y"]]
    assert list(part.Proto().external_input) == ["y"] and str(u2) == "q/u"
    # An input that a needed op would have to compute is refused.
    with pytest.raises(AssertionError):
        n.ClonePartial("r", [x, u], [z])  # z needs y, which u is made from


def test_reroute_tensor_inserts_after_the_producer(fresh):
    net = core.Net("r")
    net.Scale("a", "b", scale=2.0)
    net.Relu("b", "c")
    net.Sigmoid("b", "d")
    new = core.CreateOperator("Scale", ["b"], ["b2"], scale=-1.0)
    changed = net.reroute_tensor("b", new, [net.Proto().op[1]])
    ops = net.Proto().op
    assert changed == 1
    assert [op.type for op in ops] == ["Scale", "Scale", "Relu", "Sigmoid"]
    assert ops[1] == new
    assert list(ops[2].input) == ["b2"] and list(ops[3].input) == ["b"]
    # Before the first op when the tensor is an external input.
    net2 = core.Net("r2")
    a = net2.AddExternalInput("a")
    net2.Relu(a, "c")
    net2.reroute_tensor(a, core.CreateOperator("Scale", ["a"], ["a2"]), list(net2.Proto().op))
    assert [op.type for op in net2.Proto().op] == ["Scale", "Relu"]
    assert list(net2.Proto().op[1].input) == ["a2"]
    with pytest.raises(errors.BlobNotFoundError):
        net2.reroute_tensor("nowhere", core.CreateOperator("Relu", ["nowhere"], ["n2"]))


def test_inject_cross_device_copies_changes_nothing_on_the_cpu(fresh):
    net = core.Net("n")
    net.ConstantFill([], "w", shape=[2])
    net.Relu("w", "r")
    new, devices = core.InjectCrossDeviceCopies(net)
    assert [op.type for op in new.Proto().op] == ["ConstantFill", "Relu"]
    assert devices["w"].device_type == caffe2_pb2.CPU and set(devices) == {"w", "r"}
    gpu = core.Net("g")
    gpu.Proto().op.extend([core.CreateOperator(
        "Relu", ["w"], ["r"], device_option=caffe2_pb2.DeviceOption(device_type=caffe2_pb2.CUDA))])
    with pytest.raises(errors.InvalidArgumentError, match="CPU only"):
        core.InjectCrossDeviceCopies(gpu)
