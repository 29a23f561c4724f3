"""Whole nets both ways: Caffe2 nets built here (the LeNet that
examples/lenet_digits.py trains, the small ResNet of
examples/resnet_predictor.py, and a net with each op pattern of the Caffe2
model zoo's classification nets), with weights from a fixed seed, are

1. run on ferrocaffe,
2. exported with the frontend and run by onnx's ReferenceEvaluator: the
   same outputs (allclose) and the same argmax,
3. brought back with the backend (``prepare(model).run`` and the NetDef
   pair of ``onnx_graph_to_caffe2_net``) and run on ferrocaffe again: the
   evaluator's outputs.

The zoo's own nets (whose weights are not in the public repository) are
run the same way by a script outside the repository; docs/porting.md has
its results."""

import numpy as np
import onnx  # the test extra installs it
from _onnx_nets import netdef, op, run_reference
from _support import load_example

from ferrocaffe import brew, model_helper, workspace
from ferrocaffe.onnx import backend, frontend
from ferrocaffe.proto import caffe2_pb2

RTOL, ATOL = 1e-4, 1e-5


def seeded(init):
    for i, o in enumerate(init.op):
        o.device_option.random_seed = 1000 + i
    return init


def run_ours(init, pred, feeds):
    ws = workspace.Workspace()
    ws.run(init)
    for k, v in feeds.items():
        ws.feed_blob(k, v)
    ws.run(pred)
    return [ws.fetch_blob(o) for o in pred.external_output]


def round_trip(init, pred, feeds):
    ours = run_ours(init, pred, feeds)
    vi = {k: (onnx.TensorProto.FLOAT, list(v.shape)) for k, v in feeds.items()}
    model = frontend.caffe2_net_to_onnx_model(pred, init, vi)
    onnx.checker.check_model(model, full_check=True)
    read = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    assert [t.name for t in model.graph.initializer if t.name not in read] == []
    ref = run_reference(model, feeds)
    for o, r in zip(ours, ref):
        np.testing.assert_allclose(o, r, rtol=RTOL, atol=ATOL)
        if o.ndim == 2:
            np.testing.assert_array_equal(o.argmax(axis=1), r.argmax(axis=1))
    back = backend.prepare(model).run(feeds)
    for b, r in zip(back, ref):
        np.testing.assert_allclose(b, r, rtol=RTOL, atol=ATOL)
    init2, pred2 = backend.onnx_graph_to_caffe2_net(model)
    again = run_ours(init2, pred2, feeds)
    for a, r in zip(again, ref):
        np.testing.assert_allclose(a, r, rtol=RTOL, atol=ATOL)
    return model, ours


def test_lenet_of_the_digits_example():
    lenet = load_example("lenet_digits.py")
    m = model_helper.ModelHelper(name="lenet_deploy")
    scores = lenet.LeNet().add_layers(m, "data")
    m.net.AddExternalOutput(brew.softmax(m, scores, "softmax"))
    x = np.random.default_rng(0).uniform(0, 16, (5, 64)).astype(np.float32)
    model, (probs,) = round_trip(seeded(m.param_init_net.Proto()), m.net.Proto(), {"data": x})
    assert probs.shape == (5, 10)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 2 and ops.count("MaxPool") == 2 and ops.count("Gemm") == 2


def test_small_resnet_of_the_predictor_example():
    ex = load_example("resnet_predictor.py")
    m = ex.build(width=8, blocks=2)
    init = seeded(m.param_init_net.Proto())
    # Batch-norm statistics that make BN more than the identity.
    rng = np.random.default_rng(1)
    for o in init.op:
        if "bn" in o.output[0] and o.output[0].endswith(("_rm", "_riv", "_s", "_b")):
            shape = [a for a in o.arg if a.name == "shape"][0].ints
            vals = np.abs(rng.standard_normal(list(shape))) + 0.5
            o.type = "GivenTensorFill"
            del o.arg[:]
            o.arg.add(name="shape", ints=list(shape))
            o.arg.add(name="values", floats=vals.ravel().tolist())
    x = np.random.default_rng(2).standard_normal((3, 3, 16, 16)).astype(np.float32)
    model, (prob,) = round_trip(init, m.net.Proto(), {"data": x})
    ops = {n.op_type for n in model.graph.node}
    assert {"BatchNormalization", "Sum", "GlobalAveragePool", "Gemm", "Softmax"} <= ops


def zoo_patterns_net():
    """A small net with each op pattern of the zoo's classification nets:
    AlexNet's LRN (scale output unused), grouped conv and asymmetric pool
    pads; GoogLeNet's inception module (Concat with split info) and
    FC with axis_w; BN-Inception and DenseNet's Mul/Add broadcast scale;
    ResNet's Sum; legacy Caffe pooling; global and strided average pools;
    DepthConcat; Dropout in test mode; Softmax."""
    rng = np.random.default_rng(3)
    params = {}

    def w(name, *shape, scale=0.3):
        params[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
        return name

    ops = [
        op("Conv", ["data", w("c1_w", 8, 3, 5, 5), w("c1_b", 8)], ["c1"], stride=2, pad=2, kernel=5),
        op("Relu", ["c1"], ["c1"]),
        op("LRN", ["c1"], ["n1", "_n1_scale"], size=5, alpha=1e-4, beta=0.75, bias=1.0, order="NCHW"),
        op("MaxPool", ["n1"], ["p1"], kernel=3, stride=2, pad_t=0, pad_l=0, pad_b=1, pad_r=1),
        op("Conv", ["p1", w("c2_w", 8, 4, 3, 3), w("c2_b", 8)], ["c2"], kernel=3, pad=1, group=2),
        op("SpatialBN", ["c2", w("bn_s", 8), w("bn_b", 8), w("bn_m", 8), "bn_v"], ["bn"],
           is_test=1, epsilon=1e-5),
        op("Mul", ["bn", w("sc_w", 8)], ["bn_int"], broadcast=1, axis=1),
        op("Add", ["bn_int", w("sc_b", 8)], ["bn_sc"], broadcast=1, axis=1),
        op("Relu", ["bn_sc"], ["bn_sc"]),
        # an inception module
        op("Conv", ["bn_sc", w("i1_w", 4, 8, 1, 1), w("i1_b", 4)], ["i1"], kernel=1),
        op("Conv", ["bn_sc", w("i3_w", 6, 8, 3, 3), w("i3_b", 6)], ["i3"], kernel=3, pad=1),
        op("Conv", ["bn_sc", w("i5_w", 2, 8, 5, 5), w("i5_b", 2)], ["i5"], kernel=5, pad=2),
        op("MaxPool", ["bn_sc"], ["ip"], kernel=3, stride=1, pad=1),
        op("Conv", ["ip", w("ipp_w", 4, 8, 1, 1), w("ipp_b", 4)], ["ipp"], kernel=1),
        op("Concat", ["i1", "i3", "i5", "ipp"], ["inc", "_inc_dims"], order="NCHW"),
        # a residual sum and a DenseNet-style transition
        op("Conv", ["inc", w("r_w", 16, 16, 3, 3), w("r_b", 16)], ["r"], kernel=3, pad=1),
        op("Sum", ["inc", "r"], ["res"]),
        op("AveragePool", ["res"], ["t"], kernel=2, stride=2, pad=0),
        op("MaxPool", ["t"], ["lp"], kernel=3, stride=2, pad=1, legacy_pad=3),
        op("DepthConcat", ["lp", "lp"], ["dc", "_dc_dims"], order="NCHW"),
        op("AveragePool", ["dc"], ["g"], global_pooling=1),
        op("Dropout", ["g"], ["g_drop"], ratio=0.4, is_test=1),
        op("FC", ["g_drop", "fc_w", w("fc_b", 10)], ["fc"], axis_w=3),
        op("Softmax", ["fc"], ["prob"]),
    ]
    params["bn_v"] = rng.uniform(0.5, 1.5, 8).astype(np.float32)
    params["fc_w"] = (rng.standard_normal((10, 1, 1, 32)) * 0.3).astype(np.float32)
    init = netdef("zoo_init", [op("GivenTensorFill", [], [k], shape=list(v.shape),
                                  values=v.ravel().tolist()) for k, v in params.items()],
                  [], list(params))
    pred = netdef("zoo_patterns", ops, ["data"] + list(params), ["prob"])
    return init, pred


def test_a_net_of_the_zoo_op_patterns():
    init, pred = zoo_patterns_net()
    x = np.random.default_rng(4).standard_normal((2, 3, 33, 33)).astype(np.float32)
    model, (prob,) = round_trip(init, pred, {"data": x})
    assert prob.shape == (2, 10)
    ops = [n.op_type for n in model.graph.node]
    assert "LRN" in ops and "Concat" in ops and "Dropout" in ops
    # The legacy pool got explicit pads: Caffe's extra tail window.
    (legacy,) = [n for n in model.graph.node if n.output[0] == "lp"]
    pads = [a for a in legacy.attribute if a.name == "pads"][0].ints
    assert list(pads) == [1, 1, 3, 3]


def test_concat_split_info_feeding_a_split():
    # Caffe2's Concat/Split pair: the split sizes travel in split_info.
    a = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    b = np.arange(9, dtype=np.float32).reshape(1, 3, 3)
    pred = netdef("cat_split", [op("Concat", ["a", "b"], ["y", "info"], axis=1),
                                op("Relu", ["y"], ["y"]),
                                op("Split", ["y", "info"], ["p", "q"], axis=1)],
                  ["a", "b"], ["p", "q"])
    init = caffe2_pb2.NetDef()
    model, (p, q) = round_trip(init, pred, {"a": a, "b": b})
    np.testing.assert_array_equal(p, a)
    np.testing.assert_array_equal(q, b)
