"""The test helpers Caffe2's own test tree imports from caffe2.python
(issue 35): device_checker, hip_test_util, mkl_test_util, on this CPU
build, through the alias as Caffe2's tests import them."""

import numpy as np
import pytest

import ferrocaffe
from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

ferrocaffe.register_caffe2_alias()
from caffe2.python import device_checker, hip_test_util, mkl_test_util  # noqa: E402

CPU = caffe2_pb2.DeviceOption()
# A second way to write a CPU device (this build runs no other device).
CPU_NAMED = caffe2_pb2.DeviceOption(device_id=0, extra_info=["checked"])
GPU = caffe2_pb2.DeviceOption(device_type=workspace.GpuDeviceType)
HIP = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.HIP)


def test_device_checker_agrees_on_a_deterministic_op_and_keeps_the_workspace(fresh, capsys):
    workspace.FeedBlob("mine", np.ones(2, np.float32))
    dc = device_checker.DeviceChecker(1e-6, [CPU, CPU_NAMED])
    op = core.CreateOperator("Add", ["a", "b"], ["c"])
    a, b = np.arange(6.0).reshape(2, 3), np.full((2, 3), 0.5)
    assert dc.CheckSimple(op, [a, b], [0])
    # the caller's workspace is current again, untouched
    assert workspace.HasBlob("mine") and not workspace.HasBlob("c")
    assert capsys.readouterr().out == ""


def test_device_checker_reports_outputs_that_differ(fresh, capsys):
    # Unseeded random fills differ from one run to the next.
    dc = device_checker.DeviceChecker(1e-6, [CPU, CPU])
    op = core.CreateOperator("GaussianFill", [], ["r"], shape=[50])
    assert not dc.CheckSimple(op, [], [0])
    assert "Failure in checking device option 1 and output r" in capsys.readouterr().out


def test_device_checker_checks_every_blob_of_a_net(fresh):
    net = core.Net("dc")
    net.Relu(["x"], ["y"])
    net.Scale(["y"], ["z"], scale=2.0)
    dc = device_checker.DeviceChecker(1e-6, [CPU, CPU_NAMED])
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    assert dc.CheckNet(net.Proto(), {"x": x})
    assert dc.CheckNet(net.Proto(), {"x": x}, blobs_to_check=["z"], ignore={"y"})
    noisy = core.Net("noisy")
    noisy.UniformFill([], ["u"], shape=[20], min=0.0, max=1.0)
    assert not dc.CheckNet(noisy.Proto())


def test_hip_and_mkl_options_on_a_cpu_build():
    assert hip_test_util.run_in_hip(HIP, [CPU]) and hip_test_util.run_in_hip(CPU, [CPU, HIP])
    assert not hip_test_util.run_in_hip(CPU, [CPU, GPU])
    assert not workspace.C.has_mkldnn
    assert mkl_test_util.device_options == [CPU]
    assert mkl_test_util.mkl_do.device_type == caffe2_pb2.MKLDNN
    assert set(mkl_test_util.gcs) == {"gc", "dc"}
    from hypothesis import given, settings

    seen = []

    @settings(max_examples=5, deadline=None)
    @given(**mkl_test_util.gcs)
    def draw(gc, dc):
        seen.append((gc, dc))

    draw()
    assert seen and all(gc == CPU and dc == [CPU] for gc, dc in seen)
