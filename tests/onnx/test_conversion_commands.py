"""The commands Caffe2 installed: convert-caffe2-to-onnx and
convert-onnx-to-caffe2 (ferrocaffe.onnx.conversion; [project.scripts] in
pyproject.toml). Run as child processes (python -m) where exit status and
output are the point, in process otherwise."""

import json
import os
import subprocess
import sys
import tomllib

import numpy as np
import pytest

import onnx  # noqa: E402  (the test extra installs it)

from _onnx_nets import init_net, netdef, op, run_reference  # noqa: E402
from _support import PKG_PARENT, REPO  # noqa: E402
from google.protobuf import text_format  # noqa: E402

from ferrocaffe import workspace  # noqa: E402
from ferrocaffe.onnx import conversion  # noqa: E402


def command(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PKG_PARENT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, "-m", "ferrocaffe.onnx.conversion", *map(os.fspath, args)],
                          env=env, capture_output=True, text=True, timeout=120)


def net_files(tmp_path, text=False):
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((4, 3)).astype(np.float32),
              "b": rng.standard_normal(4).astype(np.float32)}
    pred = netdef("tiny", [op("FC", ["x", "w", "b"], ["h"]), op("Relu", ["h"], ["h"]),
                           op("Softmax", ["h"], ["y"])], ["x", "w", "b"], ["y"])
    init = init_net(params)
    suffix = ".pbtxt" if text else ".pb"
    paths = tmp_path / f"predict{suffix}", tmp_path / f"init{suffix}"
    for path, net in zip(paths, (pred, init)):
        path.write_bytes(text_format.MessageToString(net).encode() if text else net.SerializeToString())
    return paths, pred, params


def expected(pred, params, x):
    ws = workspace.Workspace()
    for k, v in {**params, "x": x}.items():
        ws.feed_blob(k, v)
    ws.run(pred)
    return ws.fetch_blob("y")


def test_the_scripts_are_declared():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    scripts = project["scripts"]
    assert scripts["convert-caffe2-to-onnx"] == "ferrocaffe.onnx.conversion:caffe2_to_onnx"
    assert scripts["convert-onnx-to-caffe2"] == "ferrocaffe.onnx.conversion:onnx_to_caffe2"
    for name in ("convert-caffe2-to-onnx", "convert-onnx-to-caffe2"):
        module, func = scripts[name].split(":")
        assert module == conversion.__name__ and callable(getattr(conversion, func))
    extras = project["optional-dependencies"]
    assert any(d.startswith("onnx") for d in extras["onnx"])
    assert not any(d.startswith("onnx") for d in project["dependencies"])
    assert not any(d.startswith(("onnxruntime", "torch")) for d in extras["test"])


@pytest.mark.parametrize("sub", ["caffe2-to-onnx", "onnx-to-caffe2"])
def test_help(sub):
    proc = command(sub, "--help")
    assert proc.returncode == 0
    assert "--output" in proc.stdout and ("--value-info" in proc.stdout or "--init-net-output" in proc.stdout)


@pytest.mark.parametrize("text", [False, True])
def test_both_ways_through_files(tmp_path, text):
    (pred_path, init_path), pred, params = net_files(tmp_path, text)
    info = tmp_path / "value_info.json"
    info.write_text(json.dumps({"x": [1, [2, 3]]}))  # as the model zoo ships it
    model_path = tmp_path / "tiny.onnx"
    proc = command("caffe2-to-onnx", pred_path, "--caffe2-init-net", init_path,
                   "--value-info", info, "-o", model_path)
    assert proc.returncode == 0, proc.stderr
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    model = onnx.load(model_path)
    want = expected(pred, params, x)
    np.testing.assert_allclose(run_reference(model, {"x": x})[0], want, rtol=1e-5)

    out_pred, out_init = tmp_path / "back_predict.pb", tmp_path / "back_init.pbtxt"
    proc = command("onnx-to-caffe2", model_path, "-o", out_pred, "--init-net-output", out_init)
    assert proc.returncode == 0, proc.stderr
    from ferrocaffe import proto
    pred2 = proto.ReadProtoFromFile(out_pred, proto.NetDef())
    init2 = proto.ReadProtoFromFile(out_init, proto.NetDef())
    assert out_init.read_text().startswith(("name:", "op {"))  # text for a .pbtxt name
    ws = workspace.Workspace()
    ws.run(init2)
    ws.feed_blob("x", x)
    ws.run(pred2)
    np.testing.assert_allclose(ws.fetch_blob("y"), want, rtol=1e-5)


def test_inline_value_info_and_a_net_name(tmp_path):
    (pred_path, init_path), pred, params = net_files(tmp_path)
    pred.name = ""
    pred_path.write_bytes(pred.SerializeToString())
    out = tmp_path / "m.onnx"
    assert conversion.caffe2_to_onnx([str(pred_path), "--caffe2-init-net", str(init_path),
                                      "--value-info", '{"x": [1, [5, 3]]}', "-o", str(out)]) == 1
    assert conversion.caffe2_to_onnx([str(pred_path), "--caffe2-init-net", str(init_path),
                                      "--caffe2-net-name", "named", "--value-info",
                                      '{"x": [1, [5, 3]]}', "-o", str(out), "--opset", "18"]) == 0
    model = onnx.load(out)
    assert model.graph.name == "named" and model.opset_import[0].version == 18


def one_line_error(proc, *needles):
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_bad_inputs_exit_1_with_one_line(tmp_path):
    (pred_path, init_path), _, _ = net_files(tmp_path)
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(b"\xff\xfe not a protobuf \x00\x01\x02")
    out = tmp_path / "out.onnx"
    vi = '{"x": [1, [2, 3]]}'
    one_line_error(command("caffe2-to-onnx", tmp_path / "missing.pb", "--value-info", vi, "-o", out),
                   "missing.pb")
    one_line_error(command("caffe2-to-onnx", garbage, "--value-info", vi, "-o", out), "garbage.pb")
    one_line_error(command("caffe2-to-onnx", pred_path, "--caffe2-init-net", init_path,
                           "--value-info", "{not json", "-o", out), "JSON")
    one_line_error(command("caffe2-to-onnx", pred_path, "--caffe2-init-net", init_path, "-o", out),
                   "'x'")
    lossy = tmp_path / "lossy.pb"
    lossy.write_bytes(netdef("lossy", [op("SoftmaxWithLoss", ["x", "l"], ["p", "loss"])],
                             ["x", "l"], ["loss"]).SerializeToString())
    one_line_error(command("caffe2-to-onnx", lossy, "--value-info",
                           '{"x": [1, [2, 3]], "l": [6, [2]]}', "-o", out), "SoftmaxWithLoss", "lossy")
    assert not out.exists()
    back = [tmp_path / "p.pb", "--init-net-output", tmp_path / "i.pb"]
    one_line_error(command("onnx-to-caffe2", tmp_path / "missing.onnx", "-o", *back), "missing.onnx")
    one_line_error(command("onnx-to-caffe2", garbage, "-o", *back), "garbage.pb")
    cum = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("CumSum", ["x", "a"], ["y"])], "cum",
        [onnx.helper.make_tensor_value_info("x", 1, [3]), onnx.helper.make_tensor_value_info("a", 7, [])],
        [onnx.helper.make_tensor_value_info("y", 1, [3])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)])
    onnx.save(cum, tmp_path / "cum.onnx")
    one_line_error(command("onnx-to-caffe2", tmp_path / "cum.onnx", "-o", *back), "CumSum")
