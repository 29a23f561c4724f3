"""Caffe2's ``hip_test_util``: whether a test's device options ask for
HIP (ROCm). This build has no HIP device, so a test that asks is one to
skip or to run on the CPU."""

from ferrocaffe.proto import caffe2_pb2

__all__ = ["run_in_hip"]


def run_in_hip(gc, dc):
    """True when the gradient checker's device ``gc`` or one of the device
    checker's ``dc`` is a HIP device."""
    return gc.device_type == caffe2_pb2.HIP or any(d.device_type == caffe2_pb2.HIP for d in dc)
