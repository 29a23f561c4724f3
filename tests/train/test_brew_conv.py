"""brew's convolutional helpers (issue 15): parameter names and shapes,
the model's arg_scope and brew.arg_scope, and a small CNN (conv, LRN,
pooling, batch norm) that trains: the loss must fall."""

import numpy as np
from ferrocaffe import brew, model_helper, optimizer, workspace


def op_args(op):
    return {a.name: (a.s.decode() if a.HasField("s") else a.i) for a in op.arg if a.HasField("s") or a.HasField("i")}


def test_conv_params_and_arg_scope(fresh):
    model = model_helper.ModelHelper(name="m", arg_scope={"order": "NHWC"})
    brew.conv(model, "data", "c1", dim_in=3, dim_out=8, kernel=5, pad=2)
    brew.conv(model, "c1", "c2", dim_in=8, dim_out=4, kernel=[3, 1], no_bias=1)
    brew.group_conv(model, "c2", "c3", dim_in=4, dim_out=4, kernel=3, group=2)
    brew.conv_transpose(model, "c3", "ct", dim_in=4, dim_out=2, kernel=2, stride=2)
    with brew.arg_scope([brew.max_pool], kernel=2, stride=2):
        brew.max_pool(model, "ct", "p1")
        brew.max_pool(model, "p1", "p2", kernel=3)
    assert [str(p) for p in model.params] == ["c1_w", "c1_b", "c2_w", "c3_w", "c3_b", "ct_w", "ct_b"]
    shapes = {op.output[0]: list(next(a for a in op.arg if a.name == "shape").ints)
              for op in model.param_init_net.Proto().op}
    assert shapes["c1_w"] == [8, 5, 5, 3] and shapes["c2_w"] == [4, 3, 1, 8]
    assert shapes["c3_w"] == [4, 3, 3, 2] and shapes["ct_w"] == [4, 2, 2, 2]
    ops = model.net.Proto().op
    assert [o.type for o in ops] == ["Conv", "Conv", "Conv", "ConvTranspose", "MaxPool", "MaxPool"]
    assert list(ops[1].input) == ["c1", "c2_w"]
    a0, a1, a2 = op_args(ops[0]), op_args(ops[1]), op_args(ops[2])
    assert a0["order"] == "NHWC" and a0["kernel"] == 5 and a0["pad"] == 2
    assert a1["kernel_h"] == 3 and a1["kernel_w"] == 1 and "no_bias" not in a1
    assert a2["group"] == 2
    assert ops[0].engine == "CUDNN"  # Caffe2's default use_cudnn; ignored on CPU
    assert op_args(ops[4])["kernel"] == 2 and op_args(ops[5])["kernel"] == 3
    assert op_args(ops[5])["stride"] == 2


def test_small_cnn_trains(fresh):
    rng = np.random.default_rng(0)
    # Two classes: a bright square in the top-left or bottom-right corner.
    def batch(n):
        y = rng.integers(0, 2, n).astype(np.int32)
        x = rng.standard_normal((n, 1, 8, 8)).astype(np.float32) * 0.3
        for i, c in enumerate(y):
            if c:
                x[i, 0, 4:, 4:] += 1.0
            else:
                x[i, 0, :4, :4] += 1.0
        return x, y

    model = model_helper.ModelHelper(name="cnn")
    c = brew.conv(model, "data", "conv1", dim_in=1, dim_out=4, kernel=3, pad=1)
    c = brew.spatial_bn(model, c, "bn1", dim_in=4, epsilon=1e-3)
    c = brew.relu(model, c, c)
    c = brew.lrn(model, c, "lrn1", size=3, alpha=1e-4, beta=0.75)
    c = brew.max_pool(model, c, "pool1", kernel=2, stride=2)
    c = brew.average_pool(model, c, "pool2", kernel=2, stride=2)
    pred = brew.fc(model, c, "pred", dim_in=4 * 2 * 2, dim_out=2)
    softmax, loss = model.net.SoftmaxWithLoss([pred, "label"], ["softmax", "loss"])
    model.AddGradientOperators([loss])
    optimizer.build_sgd(model, base_learning_rate=0.1)
    assert {"conv1_w_grad", "bn1_s_grad", "bn1_b_grad"} <= {str(g) for g in model.param_to_grad.values()}
    assert [str(p) for p in model.GetComputedParams()] == ["bn1_rm", "bn1_riv"]
    for i, op in enumerate(model.param_init_net.Proto().op):
        op.device_option.random_seed = 7 + i
    x, y = batch(32)
    workspace.FeedBlob("data", x)
    workspace.FeedBlob("label", y)
    workspace.RunNetOnce(model.param_init_net)
    workspace.CreateNet(model.net)
    losses = []
    for _ in range(40):
        x, y = batch(32)
        workspace.FeedBlob("data", x)
        workspace.FeedBlob("label", y)
        workspace.RunNet(model.net)
        losses.append(float(workspace.FetchBlob("loss")))
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    # The running mean moved from its zeros towards the batches' means.
    assert np.abs(workspace.FetchBlob("bn1_rm")).sum() > 0
