"""workspace.InferShapesAndTypes (issue 13): the shapes and types of the
workspace's blobs or a given map, and of what the nets' ops write where
their schema infers it (Concat, Split, LengthsToRanges, ScatterAssign,
ScatterWeightedSum, ResizeLike, LastNWindowCollector, the elementwise
ops); other ops' outputs
are unknown, never reported wrong. Expected shapes are those numpy gives
for the same operation, checked against a run of the net."""

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

TP = caffe2_pb2.TensorProto


def test_from_the_workspace(fresh):
    workspace.FeedBlob("x", np.zeros((2, 3), np.float32))
    workspace.FeedBlob("i", np.zeros(4, np.int64))
    workspace.FeedBlob("h", np.zeros(1, np.float16))
    net = core.Net("n")
    net.Relu("x", "y")  # elementwise: the input's shape and type
    net.Copy("i", "j")
    net.Copy("h", "h")  # written in place: unknown afterwards
    net.LengthsToSegmentIds("i", "s")  # depends on the data: unknown
    shapes, types = workspace.InferShapesAndTypes([net])
    assert shapes == {"x": [2, 3], "i": [4], "y": [2, 3]}
    assert types == {"x": TP.FLOAT, "i": TP.INT64, "y": TP.FLOAT}


def test_from_a_map_and_protos(fresh):
    net = core.Net("n")
    net.Relu("a", "b")
    shapes, types = workspace.InferShapesAndTypes(
        [net.Proto()], {"a": [5, 1], "c": [2]}, nets_proto=True, blob_types={"c": TP.INT32})
    assert shapes == {"a": [5, 1], "c": [2], "b": [5, 1]}
    # As Caffe2: with blob_types, a blob they leave out is UNDEFINED ...
    assert types == {"a": TP.UNDEFINED, "c": TP.INT32, "b": TP.UNDEFINED}
    # ... and without them every blob is FLOAT.
    _, types = workspace.InferShapesAndTypes([net.Proto()], {"a": [5, 1]}, nets_proto=True)
    assert types == {"a": TP.FLOAT, "b": TP.FLOAT}


def test_the_c_functions_return_tensor_shapes(fresh):
    workspace.FeedBlob("x", np.zeros((3,), np.float64))
    workspace.FeedBlob("l", np.array([2, 1], np.int32))
    net = core.Net("n")
    net.Relu("x", "y")
    net.LengthsToSegmentIds("l", "s")
    data = workspace.C.infer_shapes_and_types_from_workspace([net.Proto().SerializeToString()])
    parsed = caffe2_pb2.TensorShapes()
    parsed.ParseFromString(data)
    by_name = {s.name: s for s in parsed.shapes}
    assert list(by_name["x"].dims) == [3] and by_name["x"].data_type == TP.DOUBLE
    assert list(by_name["y"].dims) == [3] and by_name["y"].data_type == TP.DOUBLE
    assert by_name["s"].unknown_shape


def _check_against_a_run(net, expected):
    """The inferred shapes and types of the ``expected`` blobs, which must
    also be what running the net makes."""
    shapes, types = workspace.InferShapesAndTypes([net])
    workspace.RunNetOnce(net)
    for name, (dims, dtype) in expected.items():
        assert shapes[name] == dims, name
        assert types[name] == dtype, name
        assert list(workspace.FetchBlob(name).shape) == dims, name
    return shapes, types


def test_concat_and_split(fresh):
    a = np.zeros((2, 3, 4), np.float32)
    b = np.zeros((2, 5, 4), np.float32)
    workspace.FeedBlob("a", a)
    workspace.FeedBlob("b", b)
    net = core.Net("n")
    net.Concat(["a", "b"], ["c", "info"], axis=1)
    net.Concat(["a", "a"], ["stacked", "info2"], axis=-1, add_axis=1)
    net.Split(["c"], ["s0", "s1", "s2"], axis=1, split=[1, 2, 5])
    net.Split(["b"], ["e0", "e1"], axis=0)
    _check_against_a_run(net, {
        "c": (list(np.concatenate([a, b], axis=1).shape), TP.FLOAT),
        "info": ([2], TP.INT32),
        "stacked": (list(np.stack([a, a], axis=-1).shape), TP.FLOAT),
        "s0": ([2, 1, 4], TP.FLOAT),
        "s1": ([2, 2, 4], TP.FLOAT),
        "s2": ([2, 5, 4], TP.FLOAT),
        "e0": ([1, 5, 4], TP.FLOAT),
        "e1": ([1, 5, 4], TP.FLOAT),
    })


def test_split_by_a_sizes_input_is_unknown_unless_a_gradient(fresh):
    workspace.FeedBlob("x", np.zeros((6, 2), np.float64))
    workspace.FeedBlob("sizes", np.array([2, 4], np.int32))
    net = core.Net("n")
    net.Split(["x", "sizes"], ["p", "q"], axis=0)
    shapes, _ = workspace.InferShapesAndTypes([net])
    assert "p" not in shapes and "q" not in shapes
    # Concat's gradient is such a Split: its outputs take their variables'
    # shapes (Caffe2's rule for gradient ops).
    workspace.FeedBlob("u", np.zeros((1, 3), np.float32))
    workspace.FeedBlob("v", np.zeros((2, 3), np.float32))
    fwd = core.Net("fwd")
    fwd.Concat(["u", "v"], ["uv", "uv_info"], axis=0)
    fwd.AddGradientOperators(["uv"])
    shapes, types = workspace.InferShapesAndTypes([fwd])
    assert shapes["u_grad"] == [1, 3] and shapes["v_grad"] == [2, 3]
    assert types["u_grad"] == TP.FLOAT


def test_a_net_that_cannot_run_reports_unknown(fresh):
    workspace.FeedBlob("a", np.zeros((2, 3), np.float32))
    workspace.FeedBlob("b", np.zeros((4,), np.float32))
    net = core.Net("n")
    net.Concat(["a", "b"], ["c", "info"], axis=0)  # ranks differ
    net.Split(["a"], ["p", "q"], axis=1)  # 3 is not even
    shapes, _ = workspace.InferShapesAndTypes([net])
    assert not {"c", "info", "p", "q"} & set(shapes)


def test_lengths_to_ranges_scatter_and_resize_like(fresh):
    workspace.FeedBlob("lengths", np.array([1, 0, 3], np.int32))
    workspace.FeedBlob("data", np.zeros((5, 2), np.int64))
    workspace.FeedBlob("idx", np.array([4, 0], np.int32))
    workspace.FeedBlob("slices", np.ones((2, 2), np.int64))
    workspace.FeedBlob("x", np.arange(6, dtype=np.float32))
    workspace.FeedBlob("like", np.zeros((3, 2), np.int32))
    workspace.FeedBlob("f", np.zeros((4, 3), np.float32))
    workspace.FeedBlob("w0", np.array([2.0], np.float32))
    workspace.FeedBlob("fi", np.array([1, 1], np.int64))
    workspace.FeedBlob("fx", np.ones((2, 3), np.float32))
    workspace.FeedBlob("w1", np.array([0.5], np.float32))
    net = core.Net("n")
    net.LengthsToRanges(["lengths"], ["ranges"])
    net.ScatterAssign(["data", "idx", "slices"], ["data"])
    net.ScatterWeightedSum(["f", "w0", "fi", "fx", "w1"], ["f"])
    net.ResizeLike(["x", "like"], ["y"])
    _check_against_a_run(net, {
        "ranges": ([3, 2], TP.INT32),
        "data": ([5, 2], TP.INT64),
        "f": ([4, 3], TP.FLOAT),
        "y": ([3, 2], TP.FLOAT),
    })


def test_last_n_window_collector_infers_a_full_buffer(fresh):
    # Caffe2's rule: the buffer's shape once full (num_to_collect rows).
    workspace.CreateBlob("buf")
    workspace.FeedBlob("next", np.array(0, np.int32))
    workspace.FeedBlob("rows", np.zeros((3, 2, 4), np.float32))
    net = core.Net("n")
    net.LastNWindowCollector(["buf", "next", "rows"], ["buf", "next"], num_to_collect=7)
    shapes, types = workspace.InferShapesAndTypes([net])
    assert shapes["buf"] == [7, 2, 4] and types["buf"] == TP.FLOAT
    assert shapes["next"] == [] and types["next"] == TP.INT32


def test_every_workspace_tensor_is_reported(fresh):
    # As Caffe2: the workspace's tensors whether or not a net reads them;
    # blobs holding no tensor are unknown.
    workspace.FeedBlob("unread", np.zeros((2, 2), np.int32))
    workspace.CreateBlob("empty")
    shapes, types = workspace.InferShapesAndTypes([core.Net("nothing")])
    assert shapes == {"unread": [2, 2]} and types == {"unread": TP.INT32}


def test_the_schema_says_which_ops_infer():
    assert workspace.C.operator_schema("Concat")["infers_shapes"] is True
    assert workspace.C.operator_schema("Print")["infers_shapes"] is False


def test_fillers(fresh):
    workspace.FeedBlob("like", np.zeros((2, 3), np.int32))
    workspace.FeedBlob("dims", np.array([4, 1], np.int64))
    net = core.Net("n")
    net.GivenTensorFill([], "g", shape=[3, 2], values=[1.0] * 6)
    net.GivenTensorFill([], "gd", shape=[2], values=[1.0, 2.0], dtype=core.DataType.DOUBLE)
    net.GivenTensorInt64Fill([], "gi", shape=[1], values=[7])
    net.GivenTensorStringFill([], "gs", shape=[2], values=[b"a", b"b"])
    net.ConstantFill([], "c", shape=[5], value=2)  # an int value: int64
    net.ConstantFill(["like"], "cl", extra_shape=[4], value=1.0)
    net.UniformFill([], "u", shape=[2, 2], min=0.0, max=1.0)
    net.UniformIntFill([], "ui", shape=[3], min=0, max=5)
    net.GaussianFill(["like"], "ga")
    net.Float16ConstantFill([], "h", shape=[2])
    net.ConstantFill(["dims"], "ias", input_as_shape=1)  # contents: unknown
    shapes, types = _check_against_a_run(net, {
        "g": ([3, 2], TP.FLOAT),
        "gd": ([2], TP.DOUBLE),
        "gi": ([1], TP.INT64),
        "gs": ([2], TP.STRING),
        "c": ([5], TP.INT64),
        "cl": ([2, 3, 4], TP.FLOAT),
        "u": ([2, 2], TP.FLOAT),
        "ui": ([3], TP.INT32),
        "ga": ([2, 3], TP.FLOAT),
        "h": ([2], TP.FLOAT16),
    })
    assert "ias" not in shapes
