"""workspace.InferShapesAndTypes (issue 13): the shapes and types of the
blobs nets read, from the workspace or a given map; blobs the ops write are
unknown (no per-op inference yet), never reported wrong."""

import numpy as np

from ferrocaffe import core, workspace
from ferrocaffe.proto import caffe2_pb2

TP = caffe2_pb2.TensorProto


def test_from_the_workspace(fresh):
    workspace.FeedBlob("x", np.zeros((2, 3), np.float32))
    workspace.FeedBlob("i", np.zeros(4, np.int64))
    workspace.FeedBlob("h", np.zeros(1, np.float16))
    net = core.Net("n")
    net.Relu("x", "y")
    net.Copy("i", "j")
    net.Copy("h", "h")  # written in place: unknown afterwards
    shapes, types = workspace.InferShapesAndTypes([net])
    assert shapes == {"x": [2, 3], "i": [4]}
    assert types == {"x": TP.FLOAT, "i": TP.INT64}


def test_from_a_map_and_protos(fresh):
    net = core.Net("n")
    net.Relu("a", "b")
    shapes, types = workspace.InferShapesAndTypes(
        [net.Proto()], {"a": [5, 1], "c": [2]}, nets_proto=True, blob_types={"c": TP.INT32})
    assert shapes == {"a": [5, 1], "c": [2]}
    assert types == {"a": TP.FLOAT, "c": TP.INT32}


def test_the_c_functions_return_tensor_shapes(fresh):
    workspace.FeedBlob("x", np.zeros((3,), np.float64))
    net = core.Net("n")
    net.Relu("x", "y")
    data = workspace.C.infer_shapes_and_types_from_workspace([net.Proto().SerializeToString()])
    parsed = caffe2_pb2.TensorShapes()
    parsed.ParseFromString(data)
    by_name = {s.name: s for s in parsed.shapes}
    assert list(by_name["x"].dims) == [3] and by_name["x"].data_type == TP.DOUBLE
    assert by_name["y"].unknown_shape
