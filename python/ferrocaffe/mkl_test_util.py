"""Caffe2's ``mkl_test_util``: hypothesis strategies over the device
options a test of an MKL-DNN op runs on. This build has no MKL-DNN device
(``workspace.C.has_mkldnn`` is False), so the option lists hold the CPU
(and a GPU where there is one), as Caffe2's did on such a build; tests that
need MKL-DNN itself skip on ``has_mkldnn``. Needs the hypothesis package
(in the test extra)."""

import hypothesis.strategies as st

from ferrocaffe import workspace
from ferrocaffe.proto import caffe2_pb2

__all__ = ["cpu_do", "gpu_do", "mkl_do", "device_options", "gcs", "gcs_cpu_only",
           "gcs_gpu_only", "gcs_mkl_only", "gcs_cpu_mkl",
           "device_checker_device_options", "gradient_checker_device_option"]

cpu_do = caffe2_pb2.DeviceOption()
gpu_do = caffe2_pb2.DeviceOption(device_type=workspace.GpuDeviceType)
mkl_do = caffe2_pb2.DeviceOption(device_type=caffe2_pb2.MKLDNN)
device_options = ([cpu_do] + ([gpu_do] if workspace.has_gpu_support else [])
                  + ([mkl_do] if workspace.C.has_mkldnn else []))


def device_checker_device_options():
    return st.just(device_options)


def gradient_checker_device_option():
    return st.sampled_from(device_options)


gcs = dict(gc=gradient_checker_device_option(), dc=device_checker_device_options())
gcs_cpu_only = dict(gc=st.sampled_from([cpu_do]), dc=st.just([cpu_do]))
gcs_gpu_only = dict(gc=st.sampled_from([gpu_do]), dc=st.just([gpu_do]))
gcs_mkl_only = dict(gc=st.sampled_from([mkl_do]), dc=st.just([mkl_do]))
gcs_cpu_mkl = dict(gc=st.sampled_from([cpu_do, mkl_do]), dc=st.just([cpu_do, mkl_do]))
