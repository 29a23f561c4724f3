"""The last untyped builtins of the API are typed ferrocaffe errors that
are also the builtin a caller caught before (issue 28, item 3), and the
run_plan command refuses a FIFO and reports a plan that runs out of
memory instead of dying (items 1 and 3)."""

import os
import pathlib
import resource
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from _support import PKG_PARENT
from ferrocaffe import brew, core, errors, model_helper, optimizer, proto, workspace
from ferrocaffe.proto import caffe2_pb2


def _predictor():
    init = core.Net("init")
    init.ConstantFill([], "w", shape=[4], value=2.0)
    pred = core.Net("pred")
    pred.Mul(["x", "w"], "y")
    pred.Proto().external_input.extend(["x", "w"])
    pred.Proto().external_output.append("y")
    return init, pred


def test_predictor_inputs_and_nets_of_the_wrong_kind_are_typed_errors(fresh):
    init, pred = _predictor()
    p = workspace.Predictor(init.Proto(), pred.Proto())
    with pytest.raises(errors.FeedError, match="numpy array, not list") as info:
        p.run([[1, 2, 3, 4]])
    assert isinstance(info.value, TypeError) and info.value.blob == "x"
    # The predictor still runs.
    np.testing.assert_array_equal(p.run([np.arange(4, dtype=np.float32)])[0], [0, 2, 4, 6])
    with pytest.raises(errors.DataTypeError, match="init must be .* not int") as info:
        workspace.Predictor(12345, None)
    assert isinstance(info.value, TypeError)


def test_missing_files_are_missing_file_errors_naming_the_path(fresh, tmp_path):
    _, pred = _predictor()
    missing = tmp_path / "model" / "init_net.pb"
    for call in (lambda: workspace.Predictor(missing, pred.Proto()),
                 lambda: proto.ReadProtoFromFile(missing, proto.NetDef()),
                 lambda: workspace.C.create_db("minidb", str(missing), workspace.C.Mode.read)):
        with pytest.raises(errors.MissingFileError) as info:
            call()
        e = info.value
        assert isinstance(e, FileNotFoundError) and isinstance(e, errors.FerrocaffeIOError)
        assert e.file == str(missing) and e.filename == str(missing) and str(missing) in str(e)
        assert e.strerror == "No such file or directory"


def test_bytes_that_are_no_message_are_proto_decode_errors(fresh, tmp_path):
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(b"\xff\xfe not a net \x00\x01")
    with pytest.raises(errors.ProtoDecodeError, match="NetDef") as info:
        proto.ReadProtoFromFile(garbage, proto.NetDef())
    assert isinstance(info.value, DecodeError) and isinstance(info.value, ValueError)
    assert info.value.file == str(garbage) and str(garbage) in str(info.value)
    with pytest.raises(errors.ProtoDecodeError, match="net 0 of 1 is not a serialised NetDef") as info:
        workspace.C.infer_shapes_and_types_from_map([b"\xff\xff garbage"], {})
    assert isinstance(info.value, DecodeError)


def test_optimizing_a_model_without_gradients_is_an_invalid_argument(fresh):
    model = model_helper.ModelHelper(name="no_grads")
    brew.fc(model, "data", "fc", dim_in=2, dim_out=2)
    with pytest.raises(errors.InvalidArgumentError, match="'no_grads' has no gradients") as info:
        optimizer.build_sgd(model, 0.1)
    assert isinstance(info.value, RuntimeError)  # what Caffe2 raised
    assert model.net.Proto().op[-1].type == "FC"  # nothing was added


def _run_plan_cli(path, limit=None, timeout=60):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PKG_PARENT, os.environ.get("PYTHONPATH", "")]))

    def limit_memory():
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([sys.executable, "-m", "ferrocaffe.run_plan", os.fspath(path)],
                          capture_output=True, text=True, env=env, timeout=timeout,
                          preexec_fn=limit_memory)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo (POSIX)")
def test_run_plan_refuses_a_fifo_as_db_paths_do(tmp_path):
    fifo = tmp_path / "plan.pb"
    os.mkfifo(fifo)
    r = _run_plan_cli(fifo, timeout=30)  # it used to wait for a writer forever
    assert r.returncode == 2, r.stderr
    assert "not a regular file (a FIFO)" in r.stderr and str(fifo) in r.stderr
    with pytest.raises(errors.FerrocaffeIOError, match="not a regular file"):
        proto.ReadProtoFromFile(fifo, proto.PlanDef())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is Linux's")
def test_run_plan_reports_a_plan_that_runs_out_of_memory_and_exits_1(tmp_path):
    # MatMul of [2^18, 1] by [1, 2^18]: a 256 GiB product, under a 16 GiB
    # address-space limit. It used to die with SIGABRT (exit -6).
    net = caffe2_pb2.NetDef(name="big")
    net.op.extend([
        core.CreateOperator("ConstantFill", [], ["a"], shape=[1 << 18, 1], value=1.0),
        core.CreateOperator("ConstantFill", [], ["b"], shape=[1, 1 << 18], value=1.0),
        core.CreateOperator("MatMul", ["a", "b"], ["y"]),
    ])
    plan = caffe2_pb2.PlanDef(name="too_big")
    plan.network.append(net)
    plan.execution_step.append(caffe2_pb2.ExecutionStep(name="s", network=["big"]))
    path = tmp_path / "plan.pb"
    proto.WriteProtoToBinaryFile(plan, path)
    r = _run_plan_cli(path, limit=16 << 30)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "plan 'too_big'" in r.stderr and "failed" in r.stderr
    assert f"cannot allocate {4 << 36} bytes" in r.stderr and "'MatMul'" in r.stderr
    assert "Traceback" not in r.stderr
