"""The modelling API around ModelHelper that Caffe2's brew, model_helper and
optimizer tests use: parameter tags and create_param with initializers
(modeling.*), UseOptimizer, CNNModelHelper, brew.cond/loop, the complete
net round trip, and the names of the optimizers not supported yet."""

import numpy as np
import pytest
from ferrocaffe import brew, cnn, core, model_helper, optimizer, scope, workspace
from ferrocaffe.modeling.initializers import (
    ExternalInitializer, Initializer, PseudoFP16Initializer, update_initializer,
)
from ferrocaffe.modeling.parameter_info import ParameterInfo, ParameterTags
from ferrocaffe.optimizer_context import OptimizerContext, UseOptimizer


def test_tags_sort_parameters(fresh):
    model = model_helper.ModelHelper(name="tags")
    model.AddParameter(core.BlobReference("a"), tags=ParameterTags.WEIGHT)
    model.AddParameter(core.BlobReference("b"), tags=[ParameterTags.BIAS])
    model.AddParameter(core.BlobReference("c"), tags=ParameterTags.COMPUTED_PARAM)
    with scope.NameScope("s"):
        model.AddParameter(core.ScopedBlobReference("d"), tags=ParameterTags.COMPUTED_PARAM)
        assert [str(p) for p in model.GetComputedParams()] == ["s/d"]
    assert [str(p) for p in model.params] == ["a", "b"]
    assert [str(p) for p in model.weights] == ["a"]
    assert [str(p) for p in model.biases] == ["b"]
    assert sorted(str(p) for p in model.GetAllParams("")) == ["a", "b", "c", "s/d"]


def test_validate_lists_duplicates(fresh):
    model = model_helper.ModelHelper(name="v")
    model.params.extend(["x", "y"])
    assert model._Validate() == []
    model.Validate()
    model.params.extend(["y", "z", "x", "y"])
    assert model._Validate() == ["x", "y"]
    with pytest.raises(AssertionError):
        model.Validate()


def test_create_param_fills_once_and_shares(fresh):
    model = model_helper.ModelHelper(name="cp")
    with scope.NameScope("L"):
        w = model.create_param("w", [2, 3], Initializer("ConstantFill", value=4.0), tags=ParameterTags.WEIGHT)
        again = model.create_param("w", [2, 3], Initializer("ConstantFill", value=9.0))
    assert str(w) == "L/w" and str(again) == "L/w"
    assert [op.type for op in model.param_init_net.Proto().op] == ["ConstantFill"]
    info = model.get_param_info(w)
    assert isinstance(info, ParameterInfo) and info.shape == [2, 3] and info.size == 6
    with pytest.raises(AssertionError):
        model.create_param("L/w", [3, 3], Initializer("ConstantFill"))
    workspace.RunNetOnce(model.param_init_net)
    np.testing.assert_array_equal(workspace.FetchBlob("L/w"), np.full((2, 3), 4.0, np.float32))


def test_brew_fc_with_initializer_classes(fresh):
    model = model_helper.ModelHelper(name="fc16")
    brew.fc(model, "x", "y", 3, 2, ("ConstantFill", {"value": 0.5}), ("ConstantFill", {"value": 0.25}),
            WeightInitializer=PseudoFP16Initializer, BiasInitializer=Initializer)
    workspace.RunNetOnce(model.param_init_net)
    w = workspace.FetchBlob("y_w")
    assert w.dtype == np.float16 and w.shape == (2, 3)
    np.testing.assert_array_equal(w, np.full((2, 3), 0.5, np.float16))
    np.testing.assert_array_equal(workspace.FetchBlob("y_w_fp32"), np.full((2, 3), 0.5, np.float32))
    np.testing.assert_array_equal(workspace.FetchBlob("y_b"), np.full(2, 0.25, np.float32))
    assert model.get_param_info(model.weights[0]).blob_copy[core.DataType.FLOAT] == "y_w_fp32"
    # Without init_params nothing is filled; the blobs are expected in the workspace.
    ext = model_helper.ModelHelper(name="ext", init_params=False)
    brew.fc(ext, "x", "z", 3, 2)
    assert len(ext.param_init_net.Proto().op) == 0 and [str(p) for p in ext.params] == ["z_w", "z_b"]


def test_update_initializer_and_external(fresh):
    init = update_initializer(None, None, ("XavierFill", {}))
    assert (init.operator_name, init.operator_kwargs) == ("XavierFill", {})
    init = update_initializer(Initializer, ("GaussianFill", {"std": 2.0}), ("XavierFill", {}))
    assert (init.operator_name, init.operator_kwargs) == ("GaussianFill", {"std": 2.0})
    with pytest.raises(Exception, match="overwrites are not allowed"):
        init.update("ConstantFill", {})
    net = core.Net("n")
    info = ExternalInitializer().create_param("p", net, [3])
    assert str(info.blob) == "p" and len(net.Proto().op) == 0


def test_use_optimizer_recorded_by_tag(fresh):
    sgd, w_opt = optimizer.SgdOptimizer(0.1), optimizer.SgdOptimizer(0.2)
    model = model_helper.ModelHelper(name="uo")
    with UseOptimizer({"DEFAULT": sgd, ParameterTags.WEIGHT: w_opt}):
        brew.fc(model, "x", "y", 3, 2)
        with UseOptimizer(None):
            brew.fc(model, "x", "y2", 3, 2)
    brew.fc(model, "x", "y3", 3, 2)
    info = model.get_param_info
    assert info(core.BlobReference("y_w")).optimizer is w_opt
    assert info(core.BlobReference("y_b")).optimizer is sgd
    assert info(core.BlobReference("y2_b")).optimizer is None
    assert info(core.BlobReference("y3_w")).optimizer is None
    assert not OptimizerContext.current().has_optimizer("DEFAULT")


def test_complete_net_round_trip(fresh):
    model = model_helper.ModelHelper(name="orig")
    brew.fc(model, "x", "y", 3, 2)
    brew.relu(model, "y", "r")
    model.net.Proto().type = "dag"
    complete = model.GetCompleteNet()
    types = [op.type for op in complete.Proto().op]
    assert types == ["XavierFill", "ConstantFill", "FC", "Relu"]
    assert complete.Proto().type == "dag"
    other = model_helper.ModelHelper(name="new")
    other.ConstructInitTrainNetfromNet(complete)
    assert [op.type for op in other.param_init_net.Proto().op] == ["XavierFill", "ConstantFill"]
    assert [op.type for op in other.net.Proto().op] == ["FC", "Relu"]
    assert sorted(map(str, other.net.Proto().external_input)) == ["x", "y_b", "y_w"]
    # The original model's nets are untouched.
    assert [op.debug_info for op in model.param_init_net.Proto().op] == ["", ""]


def test_cond_and_loop(fresh):
    workspace.FeedBlob("c", np.array(False))
    workspace.FeedBlob("a", np.array(7, np.int32))
    workspace.FeedBlob("b", np.array(9, np.int32))
    then_m, else_m = model_helper.ModelHelper(name="t"), model_helper.ModelHelper(name="e")
    then_m.net.Copy("a", "out")
    else_m.net.Copy("b", "out")
    model = model_helper.ModelHelper(name="m")
    brew.cond(model, "c", ["a", "b", "out"], then_m, else_m)
    workspace.RunNetOnce(model.net)
    assert workspace.FetchBlob("out") == 9
    # acc += 3 while the counter (from 0, +1 before each test) stays below 4.
    for name, v in (("acc", 0), ("i", 0), ("one", 1), ("three", 3), ("four", 4)):
        workspace.FeedBlob(name, np.array(v, np.int64))
    workspace.FeedBlob("go", np.array(True))
    body, test = model_helper.ModelHelper(name="body"), model_helper.ModelHelper(name="test")
    body.net.Add(["acc", "three"], "acc")
    test.net.Add(["i", "one"], "i")
    test.net.LT(["i", "four"], "go")
    loop = model_helper.ModelHelper(name="loop")
    brew.loop(loop, "go", ["go", "acc", "i", "one", "three", "four"], body, test)
    workspace.RunNetOnce(loop.net)
    assert workspace.FetchBlob("acc") == 9  # i = 1, 2, 3 pass, 4 stops


def test_cnn_model_helper(fresh):
    model = cnn.CNNModelHelper(order="NHWC", name="c", use_cudnn=False)
    assert model.arg_scope["order"] == "NHWC" and model.order == "NHWC"
    workspace.FeedBlob("x", np.ones((1, 4, 4, 2), np.float32))
    model.Conv("x", "y", 2, 3, 3, weight_init=model.ConstantInit(1.0))
    workspace.RunNetOnce(model.param_init_net)
    workspace.RunNetOnce(model.net)
    y = workspace.FetchBlob("y")
    assert y.shape == (1, 2, 2, 3)
    np.testing.assert_allclose(y, np.full((1, 2, 2, 3), 18.0))  # 3 x 3 x 2 ones
    with pytest.raises(ValueError):
        cnn.CNNModelHelper(order="CHWN")


def test_register_twice_and_every_optimizer_exists(fresh):
    def helper_once(model):
        return 1

    brew.Register(helper_once)
    with pytest.raises(AttributeError, match="already exists"):
        brew.Register(helper_once)
    # Every one of Caffe2's build_* optimizers exists (none is a stub now).
    for name in ("build_sgd", "build_multi_precision_sgd", "build_fp16_sgd", "build_ftrl", "build_gftrl",
                 "build_adagrad", "build_wngrad", "build_storm", "build_adadelta", "build_adam",
                 "build_decay_adagrad", "build_yellowfin", "build_rms_prop"):
        assert callable(getattr(optimizer, name)) and name in optimizer.__all__


def test_layout_conversions():
    from ferrocaffe import utils
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    y = utils.NCHW2NHWC(x)
    assert y.shape == (2, 4, 5, 3)
    # element (n, c, h, w) lands at (n, h, w, c)
    assert y[1, 2, 4, 0] == x[1, 0, 2, 4] and y[0, 3, 1, 2] == x[0, 2, 3, 1]
    np.testing.assert_array_equal(utils.NHWC2NCHW(y), x)
    z = np.arange(6).reshape(1, 2, 3)  # 1-D spatial
    assert utils.NCHW2NHWC(z).tolist() == [[[0, 3], [1, 4], [2, 5]]]
    with pytest.raises(ValueError):
        utils.NCHW2NHWC(np.zeros(3))


def test_conv_engine_follows_use_cudnn(fresh):
    model = model_helper.ModelHelper(name="eng")
    brew.conv(model, "x", "a", 2, 2, 3, use_cudnn=True)
    brew.conv(model, "x", "b", 2, 2, 3, use_cudnn=False)
    brew.conv(model, "x", "c", 2, 2, 3, use_cudnn=False, engine="")
    assert [op.engine for op in model.net.Proto().op] == ["CUDNN", "", ""]
    with pytest.raises(ValueError):
        brew.conv(model, "x", "d", 2, 2, 3, use_cudnn=False, engine="CUDNN")
    with pytest.raises(ValueError):
        brew.conv(model, "x", "e", 2, 2, 3, use_cudnn=True, engine="")


def test_cudnn_hints_accepted_on_conv_and_pool(fresh):
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    w = np.ones((1, 1, 2, 2), np.float32)
    workspace.FeedBlob("x", x)
    workspace.FeedBlob("w", w)
    workspace.RunOperatorOnce(core.CreateOperator(
        "Conv", ["x", "w"], ["y"], kernel=2, force_algo_fwd=1, force_algo_dgrad=0, force_algo_wgrad=2,
        cudnn_state=3))
    # each output sums a 2x2 window
    expected = np.array([[x[0, 0, i:i + 2, j:j + 2].sum() for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(workspace.FetchBlob("y")[0, 0], expected)
    workspace.RunOperatorOnce(core.CreateOperator("MaxPool", ["x"], ["p"], kernel=2, stride=2, deterministic=1))
    np.testing.assert_array_equal(workspace.FetchBlob("p")[0, 0], [[5, 7], [13, 15]])


def test_alias_of_the_c_extension_module():
    import importlib
    import types

    import ferrocaffe
    ferrocaffe.register_caffe2_alias()
    C = importlib.import_module("caffe2.python._import_c_extension")
    assert isinstance(C, types.ModuleType)
    assert C.has_cuda_support is False and "Conv" in C.registered_operators()
    assert not hasattr(C, "cudnn_convolution_fwd_algo_count")
    assert importlib.import_module("caffe2.python.cnn").CNNModelHelper is cnn.CNNModelHelper


def test_update_ops_write_other_blobs(fresh):
    """Adam and MomentumSGDUpdate may write new blobs (Caffe2 allowed, not
    enforced, in place); SparseMomentumSGDUpdate's gradient output too."""
    p = np.array([1.0, -2.0], np.float32)
    g = np.array([0.5, 0.25], np.float32)
    m1 = np.array([0.1, 0.0], np.float32)
    m2 = np.array([0.01, 0.04], np.float32)
    for name, v in (("p", p), ("g", g), ("m1", m1), ("m2", m2), ("lr", np.array([-0.1], np.float32)),
                    ("it", np.array([0], np.int64))):
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(
        "Adam", ["p", "m1", "m2", "g", "lr", "it"], ["p2", "n1", "n2", "step"], beta1=0.5, beta2=0.75,
        epsilon=0.01))
    e1 = 0.5 * m1 + 0.5 * g
    e2 = 0.75 * m2 + 0.25 * g * g
    step = (np.sqrt(1 - 0.75) / (1 - 0.5)) * e1 / (np.sqrt(e2) + 0.01)
    np.testing.assert_allclose(workspace.FetchBlob("n1"), e1, rtol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("n2"), e2, rtol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("step"), step, rtol=1e-5)
    np.testing.assert_allclose(workspace.FetchBlob("p2"), p - 0.1 * step, rtol=1e-5)
    np.testing.assert_array_equal(workspace.FetchBlob("p"), p)  # inputs untouched
    workspace.FeedBlob("lr", np.array([0.1], np.float32))
    workspace.RunOperatorOnce(core.CreateOperator(
        "MomentumSGDUpdate", ["g", "m1", "lr", "p"], ["adj", "m", "q"], momentum=0.9, nesterov=0))
    adj = 0.1 * g + 0.9 * m1
    np.testing.assert_allclose(workspace.FetchBlob("adj"), adj, rtol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("q"), p - adj, rtol=1e-6)
    # Sparse: rows 1 then 0 of a 2x2 parameter; moment and param stay in place.
    P = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    M = np.zeros((2, 2), np.float32)
    G = np.array([[1.0, 1.0], [2.0, 0.0]], np.float32)
    for name, v in (("P", P), ("M", M), ("G", G), ("I", np.array([1, 0], np.int64))):
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(
        "SparseMomentumSGDUpdate", ["G", "M", "lr", "P", "I"], ["adjusted", "M", "P"], momentum=0.5,
        nesterov=0))
    np.testing.assert_allclose(workspace.FetchBlob("adjusted"), 0.1 * G, rtol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("P"), [[1.0 - 0.2, 2.0], [3.0 - 0.1, 4.0 - 0.1]], rtol=1e-6)
    with pytest.raises(ferrocaffe_errors().InvalidArgumentError, match="in-place"):
        workspace.RunOperatorOnce(core.CreateOperator(
            "SparseMomentumSGDUpdate", ["G", "M", "lr", "P", "I"], ["G", "M2", "P"], momentum=0.5))


def ferrocaffe_errors():
    from ferrocaffe import errors
    return errors


@pytest.mark.parametrize("nesterov", [0, 1])
def test_momentum_sgd_without_parameter(fresh, nesterov):
    g = np.array([1.0, -2.0, 0.5], np.float32)
    m = np.array([0.5, 0.5, -1.0], np.float32)
    for name, v in (("g", g), ("m", m), ("lr", np.array([0.2], np.float32))):
        workspace.FeedBlob(name, v)
    workspace.RunOperatorOnce(core.CreateOperator(
        "MomentumSGD", ["g", "m", "lr"], ["g_out", "m"], momentum=0.5, nesterov=nesterov))
    m_new = 0.5 * m + 0.2 * g  # by hand: [0.45, -0.15, -0.4]
    np.testing.assert_allclose(m_new, [0.45, -0.15, -0.4], rtol=1e-6)
    step = 1.5 * m_new - 0.5 * m if nesterov else m_new
    np.testing.assert_allclose(workspace.FetchBlob("m"), m_new, rtol=1e-6)
    np.testing.assert_allclose(workspace.FetchBlob("g_out"), step, rtol=1e-6)
    np.testing.assert_array_equal(workspace.FetchBlob("g"), g)
