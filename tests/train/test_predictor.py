"""workspace.Predictor (issue 15): init/predict nets exported from a model
(NetDef, binary and text bytes), run with a list or a dict, giving the
same outputs as the model's own net; bad inputs are typed errors."""

import numpy as np
import pytest
from google.protobuf import text_format
from ferrocaffe import brew, errors, model_helper, workspace


def small_resnet():
    """conv -> bn -> relu, then a residual block (two 3x3 convs, Sum), global
    average pooling and an FC: test-mode nets."""
    m = model_helper.ModelHelper(name="resnet", init_params=True)
    c = brew.conv(m, "data", "conv1", 2, 4, kernel=3, pad=1, no_bias=1)
    c = brew.spatial_bn(m, c, "bn1", 4, is_test=1)
    c = brew.relu(m, c, "relu1")
    r = brew.conv(m, c, "res_a", 4, 4, kernel=3, pad=1)
    r = brew.relu(m, r, "res_a_relu")
    r = brew.conv(m, r, "res_b", 4, 4, kernel=3, pad=1)
    s = brew.sum(m, [c, r], "res_sum")
    s = brew.relu(m, s, "res_out")
    p = brew.average_pool(m, s, "pool", global_pooling=1)
    m.net.AddExternalOutput(brew.fc(m, p, "pred", 4, 3))
    return m


def test_predictor_gives_the_models_outputs(fresh):
    m = small_resnet()
    for i, op in enumerate(m.param_init_net.Proto().op):
        op.device_option.random_seed = 11 + i
    workspace.RunNetOnce(m.param_init_net)
    # Non-trivial batch-norm statistics and biases, written into the init net.
    rng = np.random.default_rng(0)
    init = m.param_init_net.Proto()
    for op in init.op:
        if op.output[0] in ("bn1_rm", "bn1_b", "res_a_b"):
            for a in op.arg:
                if a.name == "value":
                    a.f = 0.3
    workspace.RunNetOnce(init)
    x = rng.standard_normal((2, 2, 6, 6)).astype(np.float32)
    workspace.FeedBlob("data", x)
    workspace.RunNetOnce(m.net)
    expected = workspace.FetchBlob("pred")
    assert expected.shape == (2, 3)

    # Exported nets, reloaded in a fresh workspace, three ways.
    pred_net = m.net.Proto()
    for init_arg, pred_arg in [
        (init, pred_net),
        (init.SerializeToString(), pred_net.SerializeToString()),
        (text_format.MessageToString(init).encode(), text_format.MessageToString(pred_net)),
    ]:
        workspace.SwitchWorkspace("predictor_test_" + str(id(init_arg)), True)
        p = workspace.Predictor(init_arg, pred_arg)
        assert p.input_names == ["data"]
        (y,) = p.run([x])
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
        (y2,) = p.run({"data": x[:1]})
        np.testing.assert_allclose(y2, expected[:1], rtol=1e-5, atol=1e-6)
        # The parameters stay in the predictor's child workspace.
        assert not workspace.HasBlob("conv1_w")


def test_predictor_bad_inputs(fresh):
    m = small_resnet()
    p = workspace.Predictor(m.param_init_net.Proto(), m.net.Proto())
    with pytest.raises(errors.InvalidArgumentError, match="inputs"):
        p.run([np.zeros((1, 2, 4, 4), np.float32)] * 2)
    with pytest.raises(errors.InvalidArgumentError, match="not inputs"):
        p.run({"datum": np.zeros((1, 2, 4, 4), np.float32)})
    with pytest.raises(errors.ShapeError):
        p.run([np.zeros((1, 3, 4, 4), np.float32)])
    with pytest.raises(errors.InvalidArgumentError, match="cannot read"):
        workspace.Predictor(b"\xff\xfe not a net", m.net.Proto())
