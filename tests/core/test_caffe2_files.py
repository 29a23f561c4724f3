"""Caffe2's files (issue 13): NetDef init/predict pairs and PlanDefs in
binary (.pb) and text (.pbtxt) form, written by the tests from the schema,
loaded and run; the run_plan command (python -m ferrocaffe.run_plan and the
console script entry)."""

import os
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from _support import PKG_PARENT, REPO as REPO_ROOT
from ferrocaffe import core, proto, run_plan, workspace
from ferrocaffe.proto import caffe2_pb2

FORMATS = {"binary": (".pb", proto.WriteProtoToBinaryFile),
           "text": (".pbtxt", proto.WriteProtoToTextFile)}


def _arg(name, **value):
    a = caffe2_pb2.Argument(name=name)
    for k, v in value.items():
        if isinstance(v, list):
            getattr(a, k).extend(v)
        else:
            setattr(a, k, v)
    return a


def _op(type_, inputs, outputs, *args):
    return caffe2_pb2.OperatorDef(type=type_, input=inputs, output=outputs, arg=list(args))


def exported_pair(w, b):
    """An init net and a predict net laid out as Caffe2's exporters wrote
    them: parameters filled by GivenTensorFill in the init net, the predict
    net naming its external inputs and outputs."""
    init = caffe2_pb2.NetDef(name="model_init")
    for name, value in (("W", w), ("b", b)):
        init.op.append(_op("GivenTensorFill", [], [name],
                           _arg("shape", ints=list(value.shape)),
                           _arg("values", floats=value.ravel().tolist())))
    init.external_output.extend(["W", "b"])
    predict = caffe2_pb2.NetDef(name="model")
    predict.op.append(_op("FC", ["data", "W", "b"], ["fc"]))
    predict.op.append(_op("Relu", ["fc"], ["out"]))
    predict.external_input.extend(["data", "W", "b"])
    predict.external_output.append("out")
    return init, predict


@pytest.mark.parametrize("form", list(FORMATS))
def test_an_exported_init_and_predict_pair_loads_and_runs(fresh, tmp_path, form):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    suffix, write = FORMATS[form]
    init, predict = exported_pair(w, b)
    init_path, predict_path = tmp_path / ("init_net" + suffix), tmp_path / ("predict_net" + suffix)
    write(init, init_path)
    write(predict, predict_path)
    # As Caffe2 programs read them: into protos, then run.
    init_read = proto.ReadProtoFromFile(init_path, caffe2_pb2.NetDef())
    predict_read = proto.ReadProtoFromFile(predict_path, caffe2_pb2.NetDef())
    assert predict_read == predict
    workspace.RunNetOnce(init_read)
    workspace.FeedBlob("data", x)
    workspace.CreateNet(predict_read)
    workspace.RunNet(predict_read.name)
    want = np.maximum(x @ w.T + b, 0)
    np.testing.assert_allclose(workspace.FetchBlob("out"), want, rtol=1e-5, atol=1e-6)
    # Or straight from the paths.
    workspace.ResetWorkspace()
    workspace.RunNetOnce(init_path)
    workspace.FeedBlob("data", x)
    workspace.CreateNet(predict_path)
    workspace.RunNet("model")
    np.testing.assert_allclose(workspace.FetchBlob("out"), want, rtol=1e-5, atol=1e-6)


def counting_plan(db_path):
    """A plan that counts to 5 in a loop and saves the count to db_path."""
    plan = caffe2_pb2.PlanDef(name="count_and_save")
    init = caffe2_pb2.NetDef(name="init")
    init.op.append(_op("ConstantFill", [], ["n"], _arg("shape", ints=[1]),
                       _arg("value", f=0.0)))
    init.op.append(_op("ConstantFill", [], ["one"], _arg("shape", ints=[1]),
                       _arg("value", f=1.0)))
    body = caffe2_pb2.NetDef(name="body")
    body.op.append(_op("Add", ["n", "one"], ["n"]))
    save = caffe2_pb2.NetDef(name="save")
    save.op.append(_op("Save", ["n"], [], _arg("db", s=os.fspath(db_path).encode()),
                       _arg("db_type", s=b"minidb"), _arg("absolute_path", i=1)))
    plan.network.extend([init, body, save])
    plan.execution_step.append(caffe2_pb2.ExecutionStep(name="init", network=["init"]))
    plan.execution_step.append(caffe2_pb2.ExecutionStep(name="loop", network=["body"], num_iter=5))
    plan.execution_step.append(caffe2_pb2.ExecutionStep(name="save", network=["save"]))
    return plan


def load_count(db_path):
    workspace.RunOperatorOnce(core.CreateOperator(
        "Load", [], ["n"], db=os.fspath(db_path), db_type="minidb", absolute_path=1))
    return workspace.FetchBlob("n").tolist()


@pytest.mark.parametrize("form", list(FORMATS))
def test_a_plan_file_runs(fresh, tmp_path, form):
    suffix, write = FORMATS[form]
    db = tmp_path / "count.minidb"
    path = tmp_path / ("plan" + suffix)
    write(counting_plan(db), path)
    assert workspace.RunPlan(path)
    assert workspace.FetchBlob("n").tolist() == [5.0]
    workspace.ResetWorkspace()
    assert load_count(db) == [5.0]


def test_a_serialised_plan_runs(fresh, tmp_path):
    db = tmp_path / "count.minidb"
    assert workspace.RunPlan(counting_plan(db).SerializeToString())
    assert workspace.FetchBlob("n").tolist() == [5.0]


def run_cli(*args):
    # The child imports the ferrocaffe this process imported (an installed
    # one in a clean clone, whose python/ has no built extension).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PKG_PARENT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "ferrocaffe.run_plan", *map(os.fspath, args)],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("form", list(FORMATS))
def test_run_plan_command_runs_a_plan_file(tmp_path, form):
    suffix, write = FORMATS[form]
    db = tmp_path / "count.minidb"
    path = tmp_path / ("plan" + suffix)
    write(counting_plan(db), path)
    r = run_cli(path)
    assert r.returncode == 0, r.stderr
    assert "running plan 'count_and_save'" in r.stderr and str(path) in r.stderr
    assert "plan 'count_and_save' finished in" in r.stderr
    with workspace.WorkspaceGuard("run_plan_check"):
        assert load_count(db) == [5.0]


def test_run_plan_takes_caffe2s_plan_flag_and_a_root_folder(tmp_path, capsys):
    plan = counting_plan("count.minidb")  # relative: resolves in the root folder
    plan.network[2].op[0].arg[2].i = 0
    path = tmp_path / "plan.pb"
    proto.WriteProtoToBinaryFile(plan, path)
    assert run_plan.main(["--plan", os.fspath(path), "--root-folder", os.fspath(tmp_path)]) == 0
    assert (tmp_path / "count.minidb").is_file()
    assert "finished" in capsys.readouterr().err
    assert run_plan.main(["-q", os.fspath(path), "--root-folder", os.fspath(tmp_path)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("content,what", [
    (b"\xff\xfe not a plan \x00\x01", "garbage"),
    (b"network { name: 'x' op { type: 'Add' ", "truncated text"),
    (b"", "empty"),
])
def test_run_plan_refuses_a_bad_file_naming_it(tmp_path, content, what):
    path = tmp_path / "bad.pbtxt"
    path.write_bytes(content)
    r = run_cli(path)
    assert r.returncode == 2, (what, r.stderr)
    assert "cannot read the plan file" in r.stderr and str(path) in r.stderr
    assert "Traceback" not in r.stderr


def test_run_plan_refuses_a_missing_file(tmp_path):
    r = run_cli(tmp_path / "nope.pb")
    assert r.returncode == 2
    assert "nope.pb" in r.stderr and "No such file" in r.stderr


def test_run_plan_reports_a_failing_plan(tmp_path):
    plan = caffe2_pb2.PlanDef(name="broken")
    net = caffe2_pb2.NetDef(name="n")
    net.op.append(_op("Copy", ["missing"], ["y"]))
    plan.network.append(net)
    plan.execution_step.append(caffe2_pb2.ExecutionStep(name="s", network=["n"]))
    path = tmp_path / "broken.pb"
    proto.WriteProtoToBinaryFile(plan, path)
    r = run_cli(path)
    assert r.returncode == 1
    assert "plan 'broken'" in r.stderr and "failed" in r.stderr and "missing" in r.stderr
    assert "Traceback" not in r.stderr


def test_read_plan_raises_typed_errors(tmp_path):
    path = tmp_path / "x.pb"
    path.write_bytes(b"\x07\x07\x07")
    with pytest.raises(ValueError, match="x.pb"):
        run_plan.read_plan(os.fspath(path))
    with pytest.raises(OSError):
        run_plan.read_plan(os.fspath(tmp_path / "missing.pb"))


def test_the_console_script_is_declared():
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["run_plan"] == "ferrocaffe.run_plan:main"
