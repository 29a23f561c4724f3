"""Every registered op, given arguments or inputs that demand about 2^40
bytes, fails with a typed error (issue 28): never an abort of the process,
never an ``InternalError`` (a caught panic), never a silently wrapped size.

Each op that can be driven that way has a recipe below; it runs in a child
process under an address-space limit (``RLIMIT_AS``), several recipes per
child, and a child that dies is restarted after the recipe that killed it
(which fails the test, naming the op and how the child died). The ops no
recipe can drive are listed in ``CANNOT_DRIVE`` with the reason; a test
checks that the two lists cover the registry exactly, so a new op must be
given a recipe or a reason. ``test_ops_that_cannot_be_driven_are_listed``
prints that list.
"""

import json
import os
import sys

import numpy as np
import pytest

from _child import Child
from ferrocaffe import workspace

BIG = 1 << 40  # the bytes each recipe asks for, at least
R19 = 1 << 19  # a dim of 2^19: two of them make 2^38 float32 elements (2^40 bytes)

# The typed errors a recipe may end in. The op must name itself, and the
# workspace must stay usable; a memory error is the expected one where the
# request is a well-formed size that cannot be allocated.
OOM = ("OutOfMemoryError",)
TYPED = ("OutOfMemoryError", "ShapeError", "InvalidArgumentError", "IndexOutOfRangeError")

# ------------------------------------------------------------- recipes --
#
# A recipe is the op's inputs ((name, a function making its numpy array in
# the child, or None for a blob the setup ops make)), its outputs, its
# arguments, ops run first (to make queues, cursors, vectors), and the
# results it may end in: typed errors, or "ran" for an op that reads or
# keeps only what exists (a capacity or batch size is a bound, not an
# allocation).


def f32(*shape):
    return lambda: np.zeros(shape, np.float32)


def i32(*values):
    return lambda: np.array(values, np.int32)


def i64(*values):
    return lambda: np.array(values, np.int64)


def zeros_i64(n):
    return lambda: np.zeros(n, np.int64)


def zeros_i32(n):
    return lambda: np.zeros(n, np.int32)


def arange_i64(n):
    return lambda: np.arange(n, dtype=np.int64)


def full_i32(n, v):
    return lambda: np.full(n, v, np.int32)


RECIPES = {}


def recipe(op, inputs=(), outputs=("Y",), expect=OOM, setup=(), files=None, **args):
    """Registers the recipe of `op` (one per op; `op` may be "Name#variant"
    for a second recipe of one op). `setup` holds (type, inputs, outputs,
    args) of ops run first; `files` maps file names to functions that
    write them (given the path) before the setup runs, in a fresh folder
    that "{dir}" in a string argument names."""
    assert op not in RECIPES, op
    RECIPES[op] = dict(inputs=list(inputs), outputs=list(outputs), args=args,
                       expect=expect, setup=list(setup), files=dict(files or {}))


def write_minidb(path):
    """A minidb of one record: TensorProtos holding a float32 [4] tensor."""
    import struct
    from ferrocaffe import utils
    from ferrocaffe.proto import caffe2_pb2
    p = caffe2_pb2.TensorProtos()
    p.protos.extend([utils.NumpyArrayToCaffe2Tensor(np.zeros(4, np.float32))])
    key, value = b"000000", p.SerializeToString()
    with open(path, "wb") as f:
        f.write(struct.pack("=ii", len(key), len(value)) + key + value)


COL, ROW = f32(R19, 1), f32(1, R19)
BOOL_COL = lambda: np.zeros((R19, 1), bool)  # noqa: E731
BOOL_ROW = lambda: np.zeros((1, R19), bool)  # noqa: E731
INT_COL = lambda: np.zeros((R19, 1), np.int32)  # noqa: E731
INT_ROW = lambda: np.zeros((1, R19), np.int32)  # noqa: E731

# Broadcasting: [2^19, 1] with [1, 2^19].
for _op in ("Add", "Sub", "Mul", "Div", "EQ", "NE", "LT", "LE", "GT", "GE"):
    recipe(_op, [("A", COL), ("B", ROW)])
for _op in ("And", "Or", "Xor"):
    recipe(_op, [("A", BOOL_COL), ("B", BOOL_ROW)])
for _op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
    recipe(_op, [("A", INT_COL), ("B", INT_ROW)])
recipe("Where", [("C", BOOL_COL), ("X", ROW), ("Z", f32(1))])
recipe("Expand", [("X", f32(1)), ("S", i64(1 << 38))])

# Products of two inputs' sizes.
recipe("MatMul", [("A", COL), ("B", ROW)])
recipe("BatchMatMul", [("A", COL), ("B", ROW)])
recipe("FC", [("X", COL), ("W", COL), ("b", f32(R19))])
recipe("FCTransposed", [("X", COL), ("W", ROW), ("b", f32(R19))])
recipe("Gather", [("D", ROW), ("I", zeros_i64(R19))])
recipe("BatchGather", [("D", f32(1, 1, R19)), ("I", zeros_i64(R19))])
recipe("GatherFused8BitRowwise",
       [("D", lambda: np.zeros((1, R19 + 8), np.uint8)), ("I", zeros_i64(R19))])
recipe("LengthsGather", [("D", ROW), ("L", i32(1)), ("I", zeros_i64(R19))])
recipe("SparseLengthsSum", [("D", ROW), ("I", zeros_i64(0)), ("L", zeros_i32(R19))])
recipe("SparseLengthsMean", [("D", ROW), ("I", zeros_i64(0)), ("L", zeros_i32(R19))])
recipe("SparseLengthsWeightedSum",
       [("D", ROW), ("W", f32(0)), ("I", zeros_i64(0)), ("L", zeros_i32(R19))])
recipe("SparseSortedSegmentSum", [("D", ROW), ("I", zeros_i64(R19)), ("S", arange_i64(R19))])
recipe("SparseSortedSegmentMean", [("D", ROW), ("I", zeros_i64(R19)), ("S", arange_i64(R19))])
recipe("LengthsSum", [("D", f32(0, R19)), ("L", zeros_i32(R19))])
recipe("LengthsMean", [("D", f32(0, R19)), ("L", zeros_i32(R19))])
recipe("LengthsMax", [("D", f32(0, R19)), ("L", zeros_i32(R19))])
recipe("LengthsWeightedSum", [("D", f32(0, R19)), ("W", f32(0)), ("L", zeros_i32(R19))])
recipe("OneHot", [("I", zeros_i64(R19)), ("N", i64(R19))])
recipe("SparseToDense", [("I", i64(R19 - 1)), ("V", f32(1, R19))])
recipe("BooleanMaskGradient", [("M", lambda: np.zeros(R19, bool)), ("G", f32(0, R19))])
recipe("Concat", [("X", f32(1 << 24))] * (1 << 14), outputs=("Y", "split"), axis=0)
recipe("DepthConcat", [("X", f32(1 << 24))] * (1 << 14), outputs=("Y", "split"), axis=0)
recipe("FloatToFused8BitRowwiseQuantized", [("X", f32(1 << 37, 0))])

# Sizes from arguments or from the values of small inputs.
recipe("Tile", [("X", f32(1))], tiles=1 << 38, axis=0)
recipe("TileGradient", [("G", f32(1))], expect=TYPED, tiles=1 << 38, axis=0)
recipe("Range", [("N", i64(1 << 38))])
recipe("LengthsRangeFill", [("L", full_i32(1 << 10, 1 << 30))])
recipe("LengthsToSegmentIds", [("L", full_i32(1 << 10, 1 << 30))])
recipe("LengthsSumGradient", [("G", f32(1, 1 << 10)), ("L", i32(1 << 30))])
recipe("LengthsMeanGradient", [("G", f32(1, 1 << 10)), ("L", i32(1 << 30))])
recipe("SparseLengthsSumGradient", [("G", f32(1, 1 << 10)), ("L", i32(1 << 30))])
recipe("SparseLengthsMeanGradient", [("G", f32(1, 1 << 10)), ("L", i32(1 << 30))])
recipe("SparseLengthsIndicesInGradientSumGradient",
       [("G", f32(1, 1 << 10)), ("L", i32(1 << 30)), ("I", zeros_i64(1))], expect=TYPED)
recipe("SparseLengthsIndicesInGradientMeanGradient",
       [("G", f32(1, 1 << 10)), ("L", i32(1 << 30)), ("I", zeros_i64(1))], expect=TYPED)
recipe("LengthsWeightedSumGradient",
       [("W", f32(1)), ("G", f32(1, 1 << 10)), ("L", i32(1 << 30))], expect=TYPED)
recipe("SparseLengthsWeightedSumGradient",
       [("W", f32(1)), ("G", f32(1, 1 << 10)), ("L", i32(1 << 30))], expect=TYPED)
recipe("SparseLengthsIndicesInGradientWeightedSumGradient",
       [("W", f32(1)), ("G", f32(1, 1 << 10)), ("L", i32(1 << 30)), ("I", zeros_i64(1))],
       expect=TYPED)
recipe("LengthsWeightedSumWithMainInputGradient",
       [("W", f32(1)), ("G", f32(1, 1 << 10)), ("L", i32(1 << 30)), ("D", f32(1, 1 << 10))],
       outputs=("Y", "Z"), expect=TYPED)
recipe("SparseLengthsWeightedSumWithMainInputGradient",
       [("W", f32(1)), ("G", f32(1, 1 << 10)), ("L", i32(1 << 30)), ("D", f32(1, 1 << 10)),
        ("I", zeros_i64(1))], outputs=("Y", "Z"), expect=TYPED)
recipe("SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient",
       [("W", f32(1)), ("G", f32(1, 1 << 10)), ("L", i32(1 << 30)), ("D", f32(1, 1 << 10)),
        ("I", zeros_i64(1))], outputs=("Y", "Z"), expect=TYPED)
recipe("LengthsMaxWithMainInputAndForwardOutputGradient",
       [("Yf", f32(1, 1 << 10)), ("G", f32(1, 1 << 10)), ("L", i32(1 << 30)),
        ("D", f32(1, 1 << 10))], expect=TYPED)
for _op in ("SortedSegmentSumGradient", "SortedSegmentMeanGradient",
            "UnsortedSegmentSumGradient", "UnsortedSegmentMeanGradient"):
    recipe(_op, [("G", ROW), ("S", zeros_i64(R19))])
recipe("UnsortedSegmentSum", [("D", ROW), ("S", i64(0))], num_segments=R19)
recipe("UnsortedSegmentMean", [("D", ROW), ("S", i64(0))], num_segments=R19)
recipe("UnsortedSegmentSum#id", [("D", ROW), ("S", i64(R19))])
recipe("UnsortedSegmentMean#id", [("D", ROW), ("S", i64(R19))])
recipe("SparseUnsortedSegmentSum", [("D", ROW), ("I", i64(0)), ("S", i64(0))], num_segments=R19)
recipe("SparseUnsortedSegmentMean", [("D", ROW), ("I", i64(0)), ("S", i64(0))], num_segments=R19)
recipe("PackSegments", [("L", i32(0)), ("D", f32(0, 1))], max_length=1 << 38)
recipe("Reshape", [("X", f32(1))], outputs=("Y", "old"), expect=TYPED, shape=[1 << 38])
recipe("TopK", [("X", f32(1, 4))], outputs=("Y", "I"), expect=TYPED, k=1 << 38)

# Fills: a shape of 2^38 elements.
for _op in ("ConstantFill", "GaussianFill", "UniformFill", "UniformIntFill", "XavierFill",
            "Float16ConstantFill", "Float16UniformFill"):
    recipe(_op, shape=[1 << 38])
recipe("MSRAFill", shape=[R19, R19])  # (a fan needs dim 1)
recipe("DiagonalFill", shape=[R19, R19])
for _op, _v in (("GivenTensorFill", [1.0]), ("GivenTensorDoubleFill", [1.0]),
                ("GivenTensorBoolFill", [True]), ("GivenTensorIntFill", [1]),
                ("GivenTensorInt16Fill", [1]), ("GivenTensorInt64Fill", [1]),
                ("GivenTensorStringFill", [b"a"])):
    recipe(_op, expect=TYPED, shape=[1 << 38], values=_v)

# Windows: a huge pad (or stride) makes a huge output from a tiny image.
WIN = dict(kernel=1, pad=R19)
for _op in ("Conv", "Conv2D"):
    recipe(_op, [("X", f32(1, 1, 1, 1)), ("W", f32(1, 1, 1, 1))], **WIN)
recipe("Conv1D", [("X", f32(1, 1, 1)), ("W", f32(1, 1, 1))], kernels=[1], pads=[1 << 38, 1 << 38])
recipe("Conv3D", [("X", f32(1, 1, 1, 1, 1)), ("W", f32(1, 1, 1, 1, 1))], kernels=[1, 1, 1],
       pads=[1 << 13] * 6)
recipe("ConvTranspose", [("X", f32(1, 1, 2, 2)), ("W", f32(1, 1, 1, 1))], kernel=1,
       stride=1 << 20)
for _op in ("MaxPool", "MaxPool2D", "AveragePool", "AveragePool2D", "LpPool"):
    recipe(_op, [("X", f32(1, 1, 1, 1))], **WIN)
for _op in ("MaxPool1D", "AveragePool1D"):
    recipe(_op, [("X", f32(1, 1, 1))], kernels=[1], pads=[1 << 38, 1 << 38])
for _op in ("MaxPool3D", "AveragePool3D"):
    recipe(_op, [("X", f32(1, 1, 1, 1, 1))], kernels=[1, 1, 1], pads=[1 << 13] * 6)
# Detection and resizing (issue 29): pooled sizes and scales are arguments.
RECT = lambda: np.array([[0, 0, 0, 1, 1]], np.float32)  # noqa: E731
recipe("RoIAlign", [("X", f32(1, 1, 1, 1)), ("R", RECT)], pooled_h=R19, pooled_w=R19)
recipe("RoIAlignGradient", [("X", f32(1, 1, 1, 1)), ("R", RECT), ("G", f32(1, 1, 1, 1))],
       expect=TYPED, pooled_h=R19, pooled_w=R19)
recipe("RoIAlign#samples", [("X", f32(1, 1, 1, 1)), ("R", RECT)], expect=TYPED,
       sampling_ratio=R19 * 2)
recipe("ResizeNearest", [("X", f32(1, 1, 1, 1))], height_scale=float(R19), width_scale=float(R19))
recipe("ResizeNearest#rows", [("X", f32(1, 1, 1, 1))], expect=TYPED, height_scale=float(BIG),
       width_scale=1e-3)
recipe("ResizeNearestGradient", [("G", f32(1, 1, 1, 1)), ("X", f32(1, 1, 1, 1))], expect=TYPED,
       height_scale=float(R19), width_scale=float(R19))
# Quantised ops (issue 29): their int8 inputs come from the Int8 fills;
# a huge pad or scale makes a huge uint8 output from a 1-pixel image.
INT8 = [("Int8GivenTensorFill", [], ["X"], dict(shape=[1, 1, 1, 1], values=b"\x00",
                                                Y_scale=0.5)),
        ("Int8GivenTensorFill", [], ["W"], dict(shape=[1, 1, 1, 1], values=b"\x00",
                                                Y_scale=0.5)),
        ("Int8GivenIntTensorFill", [], ["B"], dict(shape=[1], values=[0], Y_scale=0.25))]
for _op in ("Int8Conv", "Int8ConvRelu"):
    recipe(_op, [("X", None), ("W", None), ("B", None)], setup=INT8, kernel=1, pad=R19,
           order="NHWC", Y_scale=1.0)
for _op in ("Int8AveragePool", "Int8AveragePoolRelu", "Int8MaxPool", "Int8MaxPoolRelu"):
    recipe(_op, [("X", None)], setup=INT8, kernel=1, pad=R19, order="NHWC", Y_scale=0.5)
recipe("Int8ResizeNearest", [("X", None)], setup=INT8, height_scale=float(1 << 20),
       width_scale=float(1 << 20), order="NHWC", Y_scale=0.5)
INT8_2x2 = [("Int8GivenTensorFill", [], ["X"], dict(shape=[1, 2, 2, 1], values=bytes(4),
                                                    Y_scale=0.5))] + INT8[1:]
recipe("Int8ConvTranspose", [("X", None), ("W", None), ("B", None)], setup=INT8_2x2, kernel=1,
       stride=1 << 20, order="NHWC", Y_scale=1.0)
recipe("Int8RoIAlign", [("X", None), ("R", RECT)], setup=INT8, pooled_h=1 << 20,
       pooled_w=1 << 20, Y_scale=0.5)
recipe("Int8RoIAlign#samples", [("X", None), ("R", RECT)], setup=INT8, expect=TYPED,
       sampling_ratio=R19 * 2, Y_scale=0.5)
recipe("Int8Concat", [("X", None)] * (1 << 16), setup=[
    ("Int8GivenTensorFill", [], ["X"], dict(shape=[1 << 24], values=bytes(1 << 24), Y_scale=0.5))],
    outputs=("Y", "split"), Y_scale=0.5)
recipe("Int8GivenTensorFill", expect=TYPED, shape=[1 << 20, 1 << 20], values=b"\x00")
recipe("Int8GivenIntTensorFill", expect=TYPED, shape=[1 << 20, 1 << 20], values=[0])
# Gradients: dY cannot have the huge shape the arguments give, so they
# refuse it (or fail to allocate first).
for _op in ("ConvGradient", "Conv2DGradient"):
    recipe(_op, [("X", f32(1, 1, 1, 1)), ("W", f32(1, 1, 1, 1)), ("G", f32(1, 1, 1, 1))],
           outputs=("dW", "db", "dX"), expect=TYPED, **WIN)
recipe("Conv1DGradient", [("X", f32(1, 1, 1)), ("W", f32(1, 1, 1)), ("G", f32(1, 1, 1))],
       outputs=("dW", "db", "dX"), expect=TYPED, kernels=[1], pads=[1 << 38, 1 << 38])
recipe("Conv3DGradient",
       [("X", f32(1, 1, 1, 1, 1)), ("W", f32(1, 1, 1, 1, 1)), ("G", f32(1, 1, 1, 1, 1))],
       outputs=("dW", "db", "dX"), expect=TYPED, kernels=[1, 1, 1], pads=[1 << 13] * 6)
recipe("ConvTransposeGradient",
       [("X", f32(1, 1, 2, 2)), ("W", f32(1, 1, 1, 1)), ("G", f32(1, 1, 2, 2))],
       outputs=("dW", "db", "dX"), expect=TYPED, kernel=1, stride=1 << 20)
for _op in ("MaxPoolGradient", "MaxPool2DGradient", "AveragePoolGradient",
            "AveragePool2DGradient", "LpPoolGradient"):
    recipe(_op, [("X", f32(1, 1, 1, 1)), ("Yf", f32(1, 1, 1, 1)), ("G", f32(1, 1, 1, 1))],
           expect=TYPED, **WIN)
for _op in ("MaxPool1DGradient", "AveragePool1DGradient"):
    recipe(_op, [("X", f32(1, 1, 1)), ("Yf", f32(1, 1, 1)), ("G", f32(1, 1, 1))],
           expect=TYPED, kernels=[1], pads=[1 << 38, 1 << 38])
for _op in ("MaxPool3DGradient", "AveragePool3DGradient"):
    recipe(_op, [("X", f32(1, 1, 1, 1, 1)), ("Yf", f32(1, 1, 1, 1, 1)),
                 ("G", f32(1, 1, 1, 1, 1))],
           expect=TYPED, kernels=[1, 1, 1], pads=[1 << 13] * 6)

# Capacities and batch sizes: bounds on what is kept or read, never
# allocated up front.
BOUND = TYPED + ("ran",)
I32_MAX = (1 << 31) - 1  # (the arguments these ops keep as int32)
for _op in ("IntIndexCreate", "LongIndexCreate", "StringIndexCreate"):
    recipe(_op, outputs=("h",), expect=BOUND, max_elements=I32_MAX)
recipe("CreateBlobsQueue", outputs=("q",), expect=BOUND, capacity=BIG, num_blobs=1)
recipe("CreateRebatchingQueue", outputs=("q",), expect=BOUND, capacity=BIG, num_blobs=1)
recipe("SafeDequeueBlobs", [("q", None)], outputs=("Y", "status"), expect=BOUND,
       setup=[("CreateBlobsQueue", [], ["q"], dict(capacity=2, num_blobs=1)),
              ("ConstantFill", [], ["v"], dict(shape=[4], value=1.0)),
              ("EnqueueBlobs", ["q", "v"], ["v"], {}),
              ("CloseBlobsQueue", ["q"], [], {})],
       num_records=BIG)
recipe("DequeueRebatchingQueue", [("q", None)], expect=BOUND,
       setup=[("CreateRebatchingQueue", [], ["q"], dict(capacity=2, num_blobs=1)),
              ("ConstantFill", [], ["v"], dict(shape=[4], value=1.0)),
              ("EnqueueRebatchingQueue", ["q", "v"], [], {}),
              ("CloseRebatchingQueue", ["q"], [], {})],
       num_elements=BIG)
recipe("LastNWindowCollector", [("last", f32(0, 4)), ("next", lambda: np.array(0, np.int32)),
                                ("D", f32(1, 4))],
       outputs=("last", "next"), expect=BOUND, num_to_collect=I32_MAX)
recipe("CollectTensor", [("vec", None), ("D", f32(1, 4))], outputs=("vec",), expect=BOUND,
       setup=[("CreateTensorVector", [], ["vec"], {})], num_to_collect=I32_MAX)
CURSOR = [("CreateTreeCursor", [], ["c"], dict(fields=["a"]))]
recipe("ReadNextBatch", [("c", None), ("a", f32(4))], expect=BOUND, setup=CURSOR,
       batch_size=BIG)
recipe("SortAndShuffle", [("c", None), ("a", f32(4))], expect=BOUND, setup=CURSOR,
       sort_by_field_idx=0, batch_size=1 << 62, shuffle_size=1 << 62)
recipe("TrimDataset", [("a", f32(4))], outputs=("a",), expect=BOUND, fields=["a"],
       multiple_of=1 << 62)

# Readers: a batch size is a bound on what a read takes (the records a
# file has), except for a db, which is read in a cycle: its batch is
# really that many records.
recipe("TensorProtosDBInput", [("r", None)], files={"db": write_minidb},
       setup=[("CreateDB", [], ["r"], dict(db="{dir}/db", db_type="minidb"))],
       batch_size=BIG)
recipe("ReadNpyBatch", [("r", None)], expect=BOUND,
       files={"a.npy": lambda p: np.save(p, np.zeros(4, np.float32))},
       setup=[("CreateNpyReader", [], ["r"], dict(path="{dir}/a.npy"))], batch_size=BIG)
recipe("TextFileReaderRead", [("r", None)], expect=BOUND,
       files={"t.tsv": lambda p: open(p, "w").write("1.5\n2.5\n")},
       setup=[("CreateTextFileReader", [], ["r"], dict(filename="{dir}/t.tsv", field_types=[1]))],
       batch_size=I32_MAX)
recipe("ReadParquetBatch", [("r", None)], expect=BOUND,
       setup=[("CreateParquetWriter", [], ["w"], dict(path="{dir}/a.parquet", fields=["a"],
                                                       dtypes=[1])),
              ("ConstantFill", [], ["a"], dict(shape=[4], value=1.0)),
              ("WriteParquetBatch", ["w", "a"], [], dict(fields=["a"])),
              ("CloseParquetWriter", ["w"], [], {}),
              ("CreateParquetReader", [], ["r"], dict(path="{dir}/a.parquet", columns=["a"]))],
       batch_size=BIG)

# ------------------------------------------------- ops no recipe drives --

SAME_SIZE = ("its outputs and scratch are no larger than its inputs (elementwise, "
             "reducing, reordering or selecting): 2^40 bytes would need inputs of that size")
INPUT_SHAPE = ("its output has the shape of one of its inputs (a gradient or an update "
               "in place): 2^40 bytes would need an input of that size")
OBJECTS = ("makes or drives a runtime object (counter, mutex, timer, scope, index, "
           "cursor, queue, tensor vector, reader, writer); no buffer is sized by its arguments")
FILES = "reads or writes files or dbs; sizes come from their contents"
CONTROL = "runs nets (its ops are driven on their own) or Python code"

CANNOT_DRIVE = {}
COLLECTIVE = ("a collective (Python kernel, ferrocaffe.collective): its buffers are its "
              "inputs' own, and a world of one member copies them; tested in "
              "tests/distributed/test_data_parallel_ray.py")


def cannot(reason, *ops):
    for op in ops:
        assert op not in CANNOT_DRIVE, op
        CANNOT_DRIVE[op] = reason


cannot("its output is twice its input ([1 - p, p] per probability): 2^40 bytes would need "
       "an input of 2^39", "MakeTwoClass")
cannot("its outputs and buffers are sized by its inputs (RoIs, deltas, scores, anchors "
       "x the feature map)", "BBoxTransform", "BoxWithNMSLimit", "GenerateProposals")
cannot("its output is (rows of X) x (rows of W), both inputs it reads whole", "Int8FC")
cannot(COLLECTIVE, "Allgather", "Allreduce", "Barrier", "Broadcast", "CloneCommonWorld",
       "CreateCommonWorld", "DestroyCommonWorld")
cannot(SAME_SIZE,
       "Abs", "Acos", "Asin", "Atan", "Cbrt", "Cos", "Cosh", "Cube", "Elu", "Erf", "Exp",
       "Gelu", "HardSigmoid", "LeakyRelu", "Log", "Log1p", "Logit", "Mish", "Negative", "Not",
       "Reciprocal", "Relu", "ReluN", "Rsqrt", "Selu", "Sigmoid", "Sign", "Sin", "Sinh",
       "Softplus", "Softsign", "Sqr", "Sqrt", "Swish", "Tan", "Tanh", "ThresholdedRelu",
       "Clip", "Scale", "ScaleBlobs", "Pow", "Cast", "FloatToHalf", "HalfToFloat",
       "Fused8BitRowwiseQuantizedToFloat", "Int8Quantize", "Int8Dequantize", "Int8Sum",
       "Int8SumRelu", "Int8Softmax", "Int8Add", "Int8AddRelu", "Int8Relu", "Int8LeakyRelu",
       "Int8Sigmoid", "Int8Reshape", "Int8Flatten", "Int8Slice", "Int8Transpose",
       "Int8ChannelShuffle", "Dropout", "PRelu", "NanCheck", "Alias", "Copy",
       "CopyOnDeviceLike", "EnsureCPUOutput", "StopGradient", "Max", "Min", "Sum", "Mean",
       "WeightedSum", "Transpose", "NHWC2NCHW", "NCHW2NHWC", "MakeTwoClassGradient", "Flatten", "FlattenToVec", "ExpandDims", "Squeeze",
       "ResizeLike", "ChannelShuffle", "ChannelShuffleGradient", "Slice", "Split",
       "DepthSplit", "SplitByLengths", "BooleanMask", "SequenceMask", "UnpackSegments",
       "Shape", "Size",
       "IsEmpty", "LengthsToShape", "LengthsToRanges", "ArgMax", "ArgMin", "Accuracy",
       "AveragedLoss", "SumElements", "SumSqrElements", "SumReduceLike", "ReduceSum",
       "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceFrontSum",
       "ReduceFrontMean", "ReduceFrontMax", "ReduceBackSum", "ReduceBackMean",
       "ReduceBackMax", "Moments", "ChannelStats", "ChannelBackpropStats", "Normalize",
       "NormalizeL1", "Softmax", "SoftmaxWithLoss", "SpatialSoftmaxWithLoss", "LayerNorm",
       "SpatialBN", "LRN", "CrossEntropy", "LabelCrossEntropy",
       "SigmoidCrossEntropyWithLogits", "WeightedSigmoidCrossEntropyWithLogits",
       "DotProduct", "DotProductWithPadding", "CosineSimilarity", "L1Distance",
       "SquaredL2Distance", "SortedSegmentSum", "SortedSegmentMean",
       "SortedSegmentRangeSum", "SortedSegmentRangeMean", "SortedSegmentRangeMax",
       "SortedSegmentRangeLogSumExp", "SortedSegmentRangeLogMeanExp", "Append",
       "AtomicAppend", "ScatterAssign", "ScatterWeightedSum", "Print")
cannot(INPUT_SHAPE,
       "AbsGradient", "AcosGradient", "AsinGradient", "AtanGradient", "CbrtGradient",
       "CosGradient", "CoshGradient", "CubeGradient", "EluGradient", "ErfGradient",
       "GeluGradient", "HardSigmoidGradient", "LeakyReluGradient", "Log1pGradient",
       "LogitGradient", "MishGradient", "ReciprocalGradient", "ReluGradient",
       "ReluNGradient", "RsqrtGradient", "SeluGradient", "SigmoidGradient", "SinGradient",
       "SinhGradient", "SoftplusGradient", "SoftsignGradient", "SwishGradient",
       "TanGradient", "TanhGradient", "ThresholdedReluGradient", "ClipGradient",
       "PowGradient", "DropoutGrad", "PReluGradient", "AddGradient", "SubGradient",
       "MulGradient", "DivGradient", "MaxGradient", "MinGradient", "MeanGradient",
       "WeightedSumGradient", "ExpandGradient", "BatchGatherGradient", "TopKGradient",
       "AveragedLossGradient", "SumElementsGradient", "ReduceSumGradient",
       "ReduceMeanGradient", "ReduceMaxGradient", "ReduceMinGradient", "ReduceL1Gradient",
       "ReduceL2Gradient", "ReduceFrontSumGradient", "ReduceFrontMeanGradient",
       "ReduceFrontMaxGradient", "ReduceBackSumGradient", "ReduceBackMeanGradient",
       "ReduceBackMaxGradient", "MomentsGradient", "NormalizeGradient", "SoftmaxGradient",
       "SoftmaxWithLossGradient", "SpatialSoftmaxWithLossGradient", "LayerNormGradient",
       "SpatialBNGradient", "LRNGradient", "CrossEntropyGradient",
       "LabelCrossEntropyGradient", "SigmoidCrossEntropyWithLogitsGradient",
       "WeightedSigmoidCrossEntropyWithLogitsGradient", "DotProductGradient",
       "DotProductWithPaddingGradient", "CosineSimilarityGradient", "L1DistanceGradient",
       "SquaredL2DistanceGradient", "FCGradient", "FCTransposedGradient",
       "BatchMatMulGradient", "SliceGradient",
       "SortedSegmentRangeSumGradient", "SortedSegmentRangeMeanGradient",
       "SortedSegmentRangeMaxGradient", "SortedSegmentRangeLogSumExpGradient",
       "SortedSegmentRangeLogMeanExpGradient",
       "Adadelta", "Adagrad", "Adam", "DecayAdagrad", "FP16MomentumSGDUpdate",
       "FP32MomentumSGDUpdate", "Ftrl", "GFtrl", "Lars", "LearningRate", "MomentumSGD",
       "MomentumSGDUpdate", "RmsProp", "RowWiseCounter", "RowWiseSparseAdagrad",
       "RowWiseSparseAdam", "SparseAdadelta", "SparseAdagrad", "SparseAdam", "SparseFtrl",
       "SparseMomentumSGDUpdate", "SparseStorm", "SparseWngrad", "Storm", "Wngrad",
       "YellowFin", "Iter", "AtomicIter")
cannot(OBJECTS,
       "CreateCounter", "CountDown", "CountUp", "CheckCounterDone", "ResetCounter",
       "RetrieveCount", "CreateMutex", "AtomicFetchAdd", "AtomicFetchAdd64", "TimerBegin",
       "TimerEnd", "TimerGet", "TimerGetAndEnd", "CreateScope", "HasScope", "IndexGet",
       "IndexLoad", "IndexStore", "IndexSize", "IndexFreeze", "CreateTreeCursor",
       "ResetCursor", "GetCursorOffset", "ComputeOffset", "ReadRandomBatch",
       "CheckDatasetConsistency", "PackRecords", "UnPackRecords", "CloseBlobsQueue",
       "EnqueueBlobs", "DequeueBlobs", "SafeEnqueueBlobs", "CloseRebatchingQueue",
       "EnqueueRebatchingQueue", "CreateTensorVector", "TensorVectorSize",
       "ConcatTensorVector", "GetAllBlobNames", "CreateBlobsQueueDB")
cannot(FILES,
       "Save", "Load", "Checkpoint", "DBExists", "CreateDB", "CreateNpyReader",
       "ResetNpyReader", "CreateParquetReader", "ResetParquetReader", "ParquetSchema",
       "CreateParquetWriter", "SetParquetWriterSchema", "WriteParquetBatch",
       "CloseParquetWriter", "CreateTextFileReader")
cannot(CONTROL, "Do", "If", "While", "Python", "PythonGradient", "RecurrentNetwork",
       "RecurrentNetworkGradient")
cannot(SAME_SIZE, "LSTMUnit", "GRUUnit", "ElementwiseLinear", "CopyFromCPUInput",
       "ZeroGradient", "Free", "rnn_internal_apply_link", "rnn_internal_write_link",
       "rnn_internal_accumulate_gradient_input")
cannot(INPUT_SHAPE, "LSTMUnitGradient", "GRUUnitGradient", "ElementwiseLinearGradient",
       "rnn_internal_fc_input_gradient")
cannot(OBJECTS, "RecurrentNetworkBlobFetcher")


# --------------------------------------------------------------- child --

CHILD = r"""
import importlib.util, json, os, resource, sys, tempfile, traceback
import numpy as np
sys.path.insert(0, {tests!r})
spec = importlib.util.spec_from_file_location("op_memory", {path!r})
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
from ferrocaffe import core, errors, workspace

with open("/proc/self/status") as f:
    vm = [int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:")][0]
limit = vm + (3 << 30)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

for name in {names!r}:
    r = m.RECIPES[name]
    op_type = name.split("#")[0]
    print("START " + name, flush=True)
    ws = workspace.Workspace()
    out = dict(name=name)
    try:
        for (blob, make) in r["inputs"]:
            if make is not None and not ws.has_blob(blob):
                ws.feed_blob(blob, make())
        folder = tempfile.mkdtemp()
        for fname, write in r["files"].items():
            write(os.path.join(folder, fname))
        def fill(args):
            return {{k: v.replace("{{dir}}", folder) if isinstance(v, str) else v
                    for k, v in args.items()}}
        for (t, i, o, a) in r["setup"]:
            ws.run(core.CreateOperator(t, i, o, **fill(a)))
        ins = {{b for b, _ in r["inputs"]}}
        fresh = [o for o in r["outputs"] if o not in ins]
        for o in fresh:
            ws.feed_blob(o, np.array([7.0], np.float32))
        op = core.CreateOperator(op_type, [b for b, _ in r["inputs"]], r["outputs"], **fill(r["args"]))
        ws.run(op)
        out["result"] = "ran"
        out["shapes"] = [list(np.shape(ws.fetch_blob(o))) for o in r["outputs"]]
    except errors.FerrocaffeError as e:
        out.update(result=type(e).__name__, op=e.op, msg=str(e)[:400])
        # Nothing half-written, and the workspace still runs ops.
        out["outputs_kept"] = all(ws.fetch_blob(o).tolist() == [7.0] for o in fresh)
        ws.feed_blob("small_x", np.ones(3, np.float32))
        ws.run(core.CreateOperator("Relu", ["small_x"], ["small_y"]))
        out["usable"] = ws.fetch_blob("small_y").tolist() == [1.0, 1.0, 1.0]
    except BaseException as e:
        out.update(result="untyped " + type(e).__name__, msg=str(e)[:400])
    print("RESULT " + json.dumps(out), flush=True)
"""


# The ops whose outputs are their inputs' size, each given float32 inputs
# of 16 MiB with 12 MiB of address space to spare (and the allocator's
# cache of freed blocks off): an output or scratch buffer of an input's
# size cannot be had. Generic inputs: many ops refuse them first (a dtype,
# a shape, a missing argument), which is fine; none may abort.
TIGHT_CHILD = r"""
import json, resource, sys
import numpy as np
from ferrocaffe import _core, core, errors, workspace

N = 1 << 22
ws = workspace.Workspace()
x = np.random.default_rng(0).random(N, dtype=np.float32) + 0.5
for i in range(6):
    ws.feed_blob("x%d" % i, x)
# Start the kernel pool's threads before the limit.
ws.feed_blob("w", np.ones((512, 512), np.float32))
ws.run(core.CreateOperator("MatMul", ["w", "w"], ["w2"]))
with open("/proc/self/status") as f:
    vm = [int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:")][0]
limit = vm + (12 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

for name in {names!r}:
    s = _core.operator_schema(name)
    k = min(max(s["min_inputs"], 1), 6 if s["max_inputs"] is None else s["max_inputs"])
    n_out = max(s["min_outputs"], 1)
    print("START " + name, flush=True)
    out = dict(name=name)
    try:
        ws.run(core.CreateOperator(name, ["x%d" % i for i in range(k)],
                                   ["y%d" % i for i in range(n_out)]))
        out["result"] = "ran"
    except errors.FerrocaffeError as e:
        out.update(result=type(e).__name__, msg=str(e)[:300])
    except BaseException as e:
        out.update(result="untyped " + type(e).__name__, msg=str(e)[:300])
    for i in range(n_out):
        if ws.has_blob("y%d" % i):
            ws.remove_blob("y%d" % i)
    print("RESULT " + json.dumps(out), flush=True)
"""


def run_recipes(names, bound=600.0, source=None, **env):
    """Runs the recipes `names` in child processes (`source`: the child's
    program, CHILD by default); returns {name: result}. A child that dies
    is restarted after the recipe it died in."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = {}
    todo = list(names)
    while todo:
        child = Child((source or CHILD).format(tests=tests, path=os.path.abspath(__file__),
                                               names=todo), **env)
        rc = child.finish(bound)
        started = None
        for line in child.lines:
            if line.startswith("START "):
                started = line[len("START "):]
            elif line.startswith("RESULT "):
                r = json.loads(line[len("RESULT "):])
                results[r["name"]] = r
        if rc != 0 or len(results) < len(names) and started is None:
            died = started if started and started not in results else None
            if died is None:
                raise AssertionError(f"the child exited with {rc} outside a recipe; {child.describe()}")
            err = "".join(child.stderr)
            why = [ln for ln in err.splitlines() if "memory allocation" in ln or "panicked" in ln]
            results[died] = dict(name=died, result=f"child died (exit {rc})",
                                 msg=" / ".join(why)[:400] or err[-400:])
        todo = [n for n in todo if n not in results]
    return results


# --------------------------------------------------------------- tests --


def test_every_registered_op_has_a_recipe_or_a_reason():
    ops = set(workspace.RegisteredOperators())
    driven = {name.split("#")[0] for name in RECIPES}
    both = driven & set(CANNOT_DRIVE)
    assert not both, f"ops both driven and listed as not drivable: {sorted(both)}"
    missing = ops - driven - set(CANNOT_DRIVE)
    assert not missing, f"registered ops with neither a recipe nor a reason: {sorted(missing)}"
    unknown = (driven | set(CANNOT_DRIVE)) - ops
    assert not unknown, f"recipes or reasons for ops not registered: {sorted(unknown)}"


def test_ops_that_cannot_be_driven_are_listed(capsys):
    by_reason = {}
    for op, reason in sorted(CANNOT_DRIVE.items()):
        by_reason.setdefault(reason, []).append(op)
    with capsys.disabled():
        print(f"\n{len(CANNOT_DRIVE)} ops not driven to ~2^40 bytes:")
        for reason, ops in by_reason.items():
            print(f"- {reason} ({len(ops)}): {', '.join(ops)}")
    assert all(by_reason)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
def test_every_recipe_ends_in_a_typed_error():
    results = run_recipes(sorted(RECIPES))
    bad = []
    for name, r in sorted(results.items()):
        expect = RECIPES[name]["expect"]
        op_type = name.split("#")[0]
        if r["result"] == "ran" and "ran" in expect:
            continue
        if r["result"] not in expect:
            bad.append(f"{name}: {r['result']} (expected {'/'.join(expect)}): {r.get('msg', r.get('shapes'))}")
        elif r.get("op") != op_type or not r.get("outputs_kept") or not r.get("usable"):
            bad.append(f"{name}: {r}")
    assert not bad, f"{len(bad)} of {len(results)} recipes:\n" + "\n".join(bad)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
def test_ops_with_input_sized_outputs_fail_typed_when_memory_runs_out():
    tight = sorted(op for op, why in CANNOT_DRIVE.items() if why in (SAME_SIZE, INPUT_SHAPE))
    results = run_recipes(tight, source=TIGHT_CHILD, FERROCAFFE_BUFFER_CACHE_MIB="0")
    bad = [f"{name}: {r['result']}: {r.get('msg')}" for name, r in sorted(results.items())
           if r["result"] != "ran" and r["result"] not in TYPED + ("DataTypeError", "BlobNotFoundError")]
    assert not bad, f"{len(bad)} of {len(results)} ops:\n" + "\n".join(bad)
    # About half got as far as their output buffer and found no memory
    # (115 of 239 when this was written); the rest refused the generic
    # inputs first.
    out_of_memory = [name for name, r in results.items() if r["result"] == "OutOfMemoryError"]
    assert len(out_of_memory) >= 100, sorted(out_of_memory)
