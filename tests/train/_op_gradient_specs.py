"""The table of the generic gradient check (tests/train/test_op_gradients.py):
one ``Spec`` per op that has a gradient maker, and the ops left unchecked,
each with its reason.

A spec lists cases: how to draw the op's inputs (shapes, dtypes, a value
domain away from kinks and poles), its arguments, which inputs are
differentiable (``wrt``; by default every input drawn as a float), which
outputs get a seeded gradient (``seeds``; by default all) and how many
outputs the op has. A spec's ``dtype`` is the float dtype its float inputs
are drawn in: float64 where the kernel has it (then the differences are
taken with eps 1e-6 and must agree to about 1e-6), float32 where it has only
float32 (eps 1e-3, agreement to about 1e-2).

Inputs are drawn from fixed seeds, so a case is the same every run.
"""

from dataclasses import dataclass, field

import numpy as np

# -------------------------------------------------------------- inputs --


class Draw:
    """An input: ``draw(rng, dtype)`` gives its value; ``float`` inputs
    are differentiable unless the case says otherwise."""

    float = True

    def draw(self, rng, dtype):
        raise NotImplementedError


class F(Draw):
    """Uniform floats in [lo, hi] of ``shape``, redrawn within ``margin`` of
    any point of ``away`` (a kink or a pole); ``dtype`` overrides the spec's."""

    def __init__(self, *shape, lo=-1.0, hi=1.0, away=(), margin=0.1, dtype=None):
        self.shape, self.lo, self.hi = shape, lo, hi
        self.away, self.margin, self.dtype = tuple(away), margin, dtype

    def draw(self, rng, dtype):
        x = rng.uniform(self.lo, self.hi, self.shape)
        for _ in range(100):
            bad = np.zeros(x.shape, bool)
            for p in self.away:
                bad |= np.abs(x - p) < self.margin
            if not bad.any():
                break
            x[bad] = rng.uniform(self.lo, self.hi, int(bad.sum()))
        else:
            raise AssertionError(f"no values in [{self.lo}, {self.hi}] away from {self.away}")
        return np.asarray(x, self.dtype or dtype)


class Distinct(Draw):
    """Floats of ``shape`` in [-1, 1], no two closer than 1.5 / size (for
    max, min, top-k and max pooling: no ties within eps)."""

    def __init__(self, *shape, dtype=None):
        self.shape, self.dtype = shape, dtype

    def draw(self, rng, dtype):
        n = int(np.prod(self.shape))
        grid = (rng.permutation(n) + rng.uniform(0.25, 0.75, n)) * (2.0 / n) - 1.0
        return np.asarray(grid.reshape(self.shape), self.dtype or dtype)


class Grid(Draw):
    """Floats k/64 in [-1, 1] (exact in float16): with eps 1/64, dtype
    conversions are differenced exactly."""

    def __init__(self, *shape, dtype=None):
        self.shape, self.dtype = shape, dtype

    def draw(self, rng, dtype):
        return np.asarray(rng.integers(-48, 49, self.shape) / 64.0, self.dtype or dtype)


class Const(Draw):
    """A fixed value (indices, lengths, labels, masks, shapes)."""

    def __init__(self, value, dtype=np.int32):
        self.value = np.asarray(value, dtype)
        self.float = self.value.dtype.kind == "f"

    def draw(self, rng, dtype):
        return self.value.copy()


def Ints(*values, dtype=np.int32):
    return Const(list(values), dtype)


def Probs(*shape):
    """Rows of probabilities (soft labels), each summing to 1; not differentiated."""

    class _P(Draw):
        float = False

        def draw(self, rng, dtype):
            p = rng.uniform(0.1, 1.0, shape)
            return np.asarray(p / p.sum(axis=-1, keepdims=True), dtype)

    return _P()


def Fixed(d):
    """Draw ``d`` but never differentiate it (a float input that only gives
    a shape, targets, labels, statistics...)."""
    d.float = False
    return d


# -------------------------------------------------------------- specs --


@dataclass
class Case:
    inputs: list
    args: dict = field(default_factory=dict)
    wrt: tuple = None  # differentiable inputs (default: the float ones)
    seeds: tuple = None  # outputs whose gradient is seeded (default: all)
    outputs: object = None  # output count, or names (an input's name: in place)
    label: str = ""
    random_seed: int = None  # the op's device option random_seed


@dataclass
class Spec:
    op: str
    cases: list
    dtype: str = "float64"  # float32: the kernel has no float64
    eps: float = None
    rtol: float = None
    atol: float = None


def C(*inputs, **kw):
    return Case(list(inputs), **kw)


SPECS = []


def spec(op, *cases, **kw):
    SPECS.append(Spec(op, list(cases), **kw))


def ops(names, *cases, **kw):
    for name in names:
        spec(name, *cases, **kw)


# ---------------------------------------------- unary elementwise ops --

ops(["Cos", "Sin", "Cosh", "Sinh", "Cube", "Erf", "Exp", "Mish", "Swish", "Softplus", "Tanh",
     "Sigmoid", "Negative", "Sqr", "Alias", "Copy", "FlattenToVec"],
    C(F(3, 4, lo=-2, hi=2)))
spec("Atan", C(F(3, 4, lo=-2, hi=2)))
spec("Tan", C(F(3, 4, lo=-1.2, hi=1.2)))
ops(["Acos", "Asin"], C(F(3, 4, lo=-0.8, hi=0.8)))
spec("Abs", C(F(3, 4, away=[0])))
spec("Cbrt", C(F(3, 4, away=[0], margin=0.2)))
spec("Softsign", C(F(3, 4, lo=-2, hi=2, away=[0])))
spec("Gelu", C(F(3, 4, lo=-2, hi=2)), C(F(3, 4, lo=-2, hi=2), args={"fast_gelu": 1}))
spec("Elu", C(F(3, 4, lo=-2, hi=2, away=[0])), C(F(3, 4, lo=-2, hi=2, away=[0]), args={"alpha": 0.5}))
spec("Selu", C(F(3, 4, lo=-2, hi=2, away=[0])),
     C(F(3, 4, lo=-2, hi=2, away=[0]), args={"alpha": 1.2, "scale": 1.3}))
spec("LeakyRelu", C(F(3, 4, away=[0])), C(F(3, 4, away=[0]), args={"alpha": 0.2}))
spec("Relu", C(F(3, 4, away=[0])))
spec("ReluN", C(F(3, 4, lo=-2, hi=2, away=[0])), C(F(3, 4, away=[0, 0.5]), args={"n": 0.5}))
spec("HardSigmoid", C(F(3, 4, lo=-2, hi=2)),
     C(F(3, 4, lo=-2, hi=2, away=[-1, 1]), args={"alpha": 0.5, "beta": 0.5}))
spec("ThresholdedRelu", C(F(3, 4, lo=-2, hi=2, away=[1])),
     C(F(3, 4, away=[0.3]), args={"alpha": 0.3}))
ops(["Log", "Sqrt", "Rsqrt"], C(F(3, 4, lo=0.2, hi=2)))
spec("Reciprocal", C(F(3, 4, lo=-2, hi=2, away=[0], margin=0.4)))
spec("Log1p", C(F(3, 4, lo=-0.5, hi=1)))
spec("Logit", C(F(3, 4, lo=0.1, hi=0.9)), C(F(3, 4, lo=0.1, hi=0.9), args={"eps": 0.05}))
spec("Scale", C(F(3, 4)), C(F(3, 4), args={"scale": -0.7}))
spec("Clip",
     C(F(3, 4, lo=-1, hi=1, away=[-0.5, 0.5]), args={"min": -0.5, "max": 0.5}),
     C(F(3, 4, away=[0.2]), args={"min": 0.2}),
     C(F(3, 4, away=[-0.2]), args={"max": -0.2}))
spec("NanCheck", C(F(3, 4)), C(F(3, 4), F(2), wrt=(0,), label="extra inputs only named"))
spec("Flatten", C(F(2, 3, 4)), C(F(2, 3, 4), args={"axis": 2}), C(F(2, 3, 4), args={"axis": 3}))
spec("Reshape",
     C(F(2, 3, 4), args={"shape": [4, 6]}, outputs=2),
     C(F(2, 3, 4), args={"shape": [-1, 4]}, outputs=1),
     C(F(2, 3, 4), args={"shape": [0, -1]}, outputs=1, label="0 keeps a dim"),
     C(F(2, 3, 4), Ints(6, 4, dtype=np.int64), outputs=2, label="shape input"))
spec("ExpandDims", C(F(2, 3), args={"dims": [0, 2]}))
spec("Squeeze", C(F(2, 1, 3, 1), args={"dims": [1, 3]}))
spec("Transpose", C(F(2, 3, 4)), C(F(2, 3, 4), args={"axes": [1, 2, 0]}))
spec("NHWC2NCHW", C(F(2, 3, 4)), C(F(2, 3, 4, 5)), C(F(1, 2, 3, 2, 3)))
spec("NCHW2NHWC", C(F(2, 3, 4)), C(F(2, 3, 4, 5)), C(F(1, 2, 3, 2, 3)))
spec("Tile", C(F(2, 3), args={"tiles": 3, "axis": 1}),
     C(F(2, 3), Ints(2), Ints(0), label="tiles and axis inputs"))
spec("Expand", C(F(3, 1), Ints(2, 3, 4, dtype=np.int64)), C(F(4), Ints(2, 1, dtype=np.int64)))
spec("Slice",
     C(F(3, 4, 5), args={"starts": [1, 0], "ends": [3, -2]}),
     C(F(3, 4, 5), args={"starts": [-3, 1, 0], "ends": [-1, 2, 9]}, label="negative, clipped"),
     C(F(3, 4), Ints(0, 1), Ints(2, -1), label="starts and ends inputs"),
     C(F(3, 4), Ints(1, 1, dtype=np.int64), Ints(-1, 1, dtype=np.int64), label="an empty slice"))
spec("SumReduceLike",
     C(F(2, 3, 4), Fixed(F(3, 4))),
     C(F(2, 3, 4), Fixed(F(2, 3)), args={"axis": 0}),
     C(F(2, 3, 4), Fixed(F(3)), args={"axis": 1}),
     C(F(2, 3, 4), Fixed(F(1)), label="one element"),
     C(F(2, 3, 4), Fixed(F(1, 3, 1)), args={"axis": 0}, label="leading and trailing 1s"))
spec("Cast",
     C(Grid(2, 3), args={"to": 1, "from_type": 13}, label="float64 to float32"),
     C(Grid(2, 3, dtype=np.float32), args={"to": 13, "from_type": 1}, label="float32 to float64"),
     C(Grid(2, 3), args={"to": "float", "from_type": "double"}, label="dtype names"),
     eps=1 / 64)
spec("FloatToHalf", C(Grid(2, 3)), dtype="float32", eps=1 / 64, rtol=1e-6, atol=1e-6)
# The gradient of a float16 input is float16: the seed rounded to half precision.
spec("HalfToFloat", C(Grid(2, 3, dtype=np.float16)), dtype="float32", eps=1 / 64, rtol=1e-3, atol=1e-6)
spec("Pow",
     C(F(3, 4, lo=-2, hi=2), args={"exponent": 3.0}),
     C(F(3, 4, lo=0.5, hi=2), args={"exponent": 2.5}),
     C(F(3, 4, lo=0.5, hi=2), F(3, 4), label="exponent input"),
     C(F(3, 4, lo=0.5, hi=2), F(1), label="one exponent"),
     C(F(2, 3, 4, lo=0.5, hi=2), F(3), args={"broadcast": 1, "axis": 1}, label="broadcast exponent"))
spec("PRelu",
     C(F(2, 3, 2, 2, away=[0]), F(3)),
     C(F(2, 3, 2, 2, away=[0]), F(1), label="one slope"),
     C(F(2, 2, 2, 3, away=[0]), F(3), args={"order": "NHWC"}))

# ------------------------------------------------------ binary and n-ary --

_BROADCAST = [
    C(F(2, 3), F(2, 3)),
    C(F(2, 3, 4), F(4), label="numpy: trailing"),
    C(F(2, 3, 4), F(3, 1), label="numpy: inner 1"),
    C(F(2, 1, 4), F(3, 1), label="numpy: both broadcast"),
    C(F(4), F(2, 3, 4), label="numpy: A broadcast"),
    C(F(2, 3, 4), F(3), args={"broadcast": 1, "axis": 1}, label="legacy axis"),
    C(F(2, 3, 4), F(3, 4), args={"broadcast": 1}, label="legacy"),
    C(F(2, 3, 4, 5), F(5), args={"broadcast": 1, "axis_str": "C", "order": "NHWC"},
      label="legacy axis_str"),
]
ops(["Add", "Sub", "Mul"], *_BROADCAST)
spec("Div", *[C(c.inputs[0], F(*c.inputs[1].shape, lo=-2, hi=2, away=[0], margin=0.5), args=c.args,
                label=c.label) for c in _BROADCAST])
spec("Sum", C(F(2, 3)), C(F(2, 3), F(2, 3), F(2, 3)))
spec("Mean", C(F(2, 3)), C(F(2, 3), F(2, 3), F(2, 3)))
ops(["Max", "Min"], C(F(2, 3)), C(F(2, 3), F(2, 3), F(2, 3)))
spec("WeightedSum", C(F(2, 3), F(1), F(2, 3), F(1), wrt=(0, 2)),
     C(F(2, 3), F(1), F(2, 3), F(1), args={"grad_on_w": 1}), dtype="float32")

# --------------------------------------------------------- losses, rows --

spec("Softmax", C(F(2, 5, lo=-2, hi=2)), C(F(2, 3, 4, lo=-2, hi=2), args={"axis": 2}),
     C(F(2, 3, 4, lo=-2, hi=2), args={"axis": 0}))
spec("SoftmaxWithLoss",
     C(F(3, 4, lo=-2, hi=2), Ints(0, 3, 1), outputs=2),
     C(F(3, 4, lo=-2, hi=2), Ints(0, 3, 1), outputs=2, seeds=(1,), label="the loss only"),
     C(F(3, 4, lo=-2, hi=2), Ints(0, 3, 1), outputs=2, seeds=(0,), label="P only"),
     C(F(3, 4, lo=-2, hi=2), Ints(0, 3, 1), F(3, lo=0.2, hi=1), wrt=(0,), outputs=2,
       args={"scale": 0.5}, label="weights, scale"),
     C(F(3, 4, lo=-2, hi=2), Probs(3, 4), outputs=2, args={"label_prob": 1}, label="label_prob"),
     C(F(2, 3, 2, lo=-2, hi=2), Ints(0, 5), outputs=2, label="3-d logits"))
spec("SpatialSoftmaxWithLoss",
     C(F(2, 3, 2, 2, lo=-2, hi=2), Const([[[0, 2], [1, -1]], [[2, 2], [0, 1]]]), outputs=2),
     C(F(2, 3, 2, 2, lo=-2, hi=2), Const([[[0, 2], [1, -1]], [[2, 2], [0, 1]]]), outputs=2,
       seeds=(0,), label="P only"),
     C(F(2, 3, 2, 2, lo=-2, hi=2), Const([[[0, 2], [1, -1]], [[2, 2], [0, 1]]]),
       F(2, 2, 2, lo=0.2, hi=1), wrt=(0,), outputs=2, seeds=(1,), args={"scale": 2.0},
       label="weights"))
spec("LabelCrossEntropy", C(F(3, 4, lo=0.1, hi=1), Ints(0, 3, 1)))
spec("MakeTwoClass", C(F(3, lo=0.05, hi=0.95)), C(F(2, 3, lo=0.05, hi=0.95)))
spec("CrossEntropy", C(F(3, 4, lo=0.1, hi=0.9), Probs(3, 4)), C(F(4, lo=0.1, hi=0.9), Probs(4)))
spec("SigmoidCrossEntropyWithLogits",
     C(F(3, 4, lo=-2, hi=2), Fixed(F(3, 4, lo=0, hi=1))),
     C(F(3, 4, lo=-2, hi=2), Fixed(Const([[0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 1]], np.float64)),
       args={"log_D_trick": 1}, label="log_D_trick"),
     C(F(3, 4, lo=-2, hi=2), Fixed(F(3, 4, lo=0, hi=1)), args={"unjoined_lr_loss": 1},
       label="unjoined_lr_loss"))
spec("WeightedSigmoidCrossEntropyWithLogits",
     C(F(3, 4, lo=-2, hi=2), Fixed(F(3, 4, lo=0, hi=1)), Fixed(F(3, 4, lo=0.2, hi=1))))
spec("AveragedLoss", C(F(3, 4)))
spec("SumElements", C(F(3, 4)), C(F(3, 4), args={"average": 1}))
spec("SquaredL2Distance", C(F(3, 4), F(3, 4)), C(F(4), F(4)))
spec("L1Distance", C(F(3, 4), F(3, 4)), C(F(4), F(4)))
ops(["DotProduct", "CosineSimilarity"], C(F(3, 4), F(3, 4)), C(F(4), F(4)),
    C(F(2, 3, 2), F(2, 3, 2)))
spec("DotProductWithPadding", C(F(3, 4), F(3, 2)), C(F(3, 2), F(3, 4), args={"pad_value": 0.5}),
     C(F(3, 4), F(3, 2), args={"replicate": 1}))
spec("Normalize", C(F(2, 3)), C(F(3, 2, 2), args={"axis": 0}))

# ------------------------------------------------------- matrix products --

spec("FC", C(F(2, 3), F(4, 3), F(4)), C(F(2, 3, 4), F(5, 4), F(5), args={"axis": 2}),
     C(F(2, 4), F(5, 2, 2), F(5), args={"axis_w": 1}), C(F(2, 2, 2), F(5, 2, 2), F(5),
                                                          args={"axis": 1, "axis_w": 1}))
spec("FCTransposed", C(F(2, 3), F(3, 4), F(4)), C(F(2, 3, 4), F(4, 5), F(5), args={"axis": 2}))
spec("MatMul",
     C(F(2, 3), F(3, 4)),
     C(F(3, 2), F(3, 4), args={"trans_a": 1}),
     C(F(2, 3), F(4, 3), args={"trans_b": 1}),
     C(F(3, 2), F(4, 3), args={"trans_a": 1, "trans_b": 1}),
     C(F(2, 2, 3), F(3, 2, 2), args={"axis_a": 2, "axis_b": 1}, label="N-d, axes"))
spec("BatchMatMul",
     C(F(2, 2, 3), F(2, 3, 4)),
     C(F(2, 3, 2), F(2, 3, 4), args={"trans_a": 1}),
     C(F(2, 2, 3), F(2, 4, 3), args={"trans_b": 1}),
     C(F(2, 3, 2), F(2, 4, 3), args={"trans_a": 1, "trans_b": 1}),
     C(F(2, 2, 2, 3), F(2, 2, 3, 2), label="4-d"),
     C(F(2, 1, 2, 3), F(3, 3, 2), args={"broadcast": 1}, label="broadcast batch"),
     C(F(2, 3, 2), F(1, 4, 3), args={"broadcast": 1, "trans_a": 1, "trans_b": 1},
       label="broadcast, transposed"),
     C(F(2, 3), F(2, 3, 4), args={"broadcast": 1}, label="broadcast matrix"),
     C(F(3), F(2, 3, 4), args={"broadcast": 1, "trans_a": 1}, label="1-d A"),
     C(F(2, 2, 3), F(3), args={"broadcast": 1, "trans_b": 1}, label="1-d B"),
     C(F(3), F(3), args={"broadcast": 1}, label="1-d A and B"))

# -------------------------------------------------------- convolutional --

spec("Conv",
     C(F(2, 2, 4, 4), F(3, 2, 3, 3), F(3), args={"pad": 1}),
     C(F(2, 4, 4, 2), F(3, 3, 3, 2), F(3), args={"stride": 2, "pad": 1, "order": "NHWC"}),
     C(F(1, 4, 3, 3), F(4, 2, 2, 2), F(4), args={"group": 2}),
     C(F(1, 2, 5, 5), F(2, 2, 2, 2), args={"dilation": 2, "pad_t": 1, "pad_l": 0, "pad_b": 0,
                                           "pad_r": 1}, label="no bias, dilation, pads"),
     C(F(1, 2, 3, 3), F(2, 2, 2, 2), F(2), args={"no_gradient_to_input": 1}, wrt=(1, 2)))
spec("Conv2D", C(F(1, 2, 4, 4), F(3, 2, 3, 3), F(3), args={"stride": 2}))
spec("Conv1D", C(F(2, 2, 5), F(3, 2, 3), F(3)), C(F(2, 5, 2), F(3, 3, 2), args={"order": "NHWC"}))
spec("Conv3D", C(F(1, 2, 3, 3, 3), F(2, 2, 2, 2, 2), F(2)),
     C(F(1, 3, 3, 4, 2), F(2, 2, 2, 2, 2), F(2), args={"stride": 2, "pad": 1, "order": "NHWC"}))
spec("ConvTranspose",
     C(F(1, 2, 3, 3), F(2, 3, 2, 2), F(3), args={"stride": 2}),
     C(F(1, 2, 3, 3), F(2, 3, 3, 3), F(3), args={"stride": 2, "pad": 1, "adj": 1}),
     C(F(1, 3, 3, 2), F(2, 2, 2, 3), F(3), args={"order": "NHWC"}),
     C(F(1, 2, 3, 3), F(2, 2, 2, 2), label="no bias"),
     C(F(1, 4, 2, 2), F(4, 1, 2, 2), F(2), args={"group": 2, "stride": 2}, label="group"))

_POOL2 = [
    C(Distinct(1, 2, 4, 4), args={"kernel": 2, "stride": 2}),
    C(Distinct(1, 2, 4, 4), args={"kernel": 3, "pad": 1}),
    C(Distinct(1, 4, 4, 2), args={"kernel": 2, "order": "NHWC"}),
    C(Distinct(2, 2, 3, 3), args={"global_pooling": 1}),
    C(Distinct(1, 1, 5, 5), args={"kernel": 2, "dilation": 2, "pad_t": 1, "pad_b": 0, "pad_l": 0,
                                  "pad_r": 1, "stride_h": 2, "stride_w": 1}, label="dilation, pads"),
]
ops(["MaxPool", "MaxPool2D"], *_POOL2)
ops(["AveragePool", "AveragePool2D"], *_POOL2,
    C(F(1, 2, 4, 4), args={"kernel": 3, "pad": 1, "count_include_pad": 1}))
ops(["MaxPool1D", "AveragePool1D"], C(Distinct(1, 2, 5), args={"kernel": 2}))
ops(["MaxPool3D", "AveragePool3D"], C(Distinct(1, 1, 4, 4, 4), args={"kernel": 2, "stride": 2}))
spec("LpPool", C(F(1, 2, 4, 4), args={"kernel": 2, "stride": 2}),
     C(F(1, 2, 4, 4, away=[0]), args={"kernel": 2, "p": 3.0}))
# RoIAlign is linear in X: differences are exact whatever the RoIs (fixed;
# they get no gradient), samples falling between pixels, on the border
# and outside the image included.
_ROIS = Fixed(Const([[0, 0.3, 0.7, 4.1, 3.6], [1, 1.2, 0.4, 5.3, 5.1], [0, -1.5, 2.0, 6.5, 7.0]],
                    np.float32))
spec("RoIAlign",
     C(F(2, 2, 6, 6), _ROIS, args={"pooled_h": 2, "pooled_w": 2, "sampling_ratio": 2}, wrt=(0,)),
     C(F(2, 6, 6, 3), _ROIS, args={"pooled_h": 3, "pooled_w": 2, "order": "NHWC"}, wrt=(0,)),
     C(F(2, 2, 6, 6), _ROIS, args={"pooled_h": 2, "pooled_w": 3, "spatial_scale": 0.5, "aligned": 1},
       wrt=(0,), label="aligned"))
spec("ResizeNearest",
     C(F(1, 2, 3, 4), args={"height_scale": 2.0, "width_scale": 1.5}),
     C(F(2, 4, 3, 2), args={"height_scale": 0.5, "width_scale": 2.0, "order": "NHWC"}),
     C(F(1, 2, 3, 3), Fixed(Const([2.0, 3.0], np.float32)), wrt=(0,), label="scales input"))
spec("SpatialBN",
     C(F(2, 3, 2, 2), F(3), F(3), Fixed(F(3)), Fixed(F(3, lo=0.5, hi=1.5)), wrt=(0, 1, 2),
       outputs=["Y", "in3", "in4", "saved_mean", "saved_inv_std"], seeds=(0,)),
     C(F(2, 2, 2, 3), F(3), F(3), Fixed(F(3)), Fixed(F(3, lo=0.5, hi=1.5)), wrt=(0, 1, 2),
       outputs=["Y", "in3", "in4", "saved_mean", "saved_inv_std"], seeds=(0,),
       args={"order": "NHWC", "epsilon": 1e-3}),
     C(F(2, 3, 2, 2), F(3), F(3), Fixed(F(3)), Fixed(F(3, lo=0.5, hi=1.5)), wrt=(0, 1, 2),
       args={"is_test": 1}, label="is_test"))
spec("LRN", C(F(1, 4, 2, 2), args={"size": 3, "alpha": 0.1, "beta": 0.75, "bias": 1.0}),
     C(F(1, 2, 2, 5), args={"size": 3, "alpha": 0.1, "beta": 0.75, "bias": 1.0, "order": "NHWC"},
       outputs=2, seeds=(0,)))
spec("LayerNorm",
     C(F(2, 3, 4), outputs=3),
     C(F(2, 3, 4), args={"axis": 2, "epsilon": 1e-3}, outputs=3),
     C(F(2, 3, 4), args={"axis": 0}, outputs=3),
     C(F(2, 3, 4), args={"axis": -1}, outputs=3, seeds=(1,), label="the mean only"),
     C(F(2, 3, 4), outputs=3, seeds=(0, 2), label="no mean"),
     C(F(2, 3, 4), F(3, 4), F(3, 4), args={"elementwise_affine": 1}, outputs=3),
     # gamma and beta do not move the std: no gradient
     C(F(2, 3, 4), F(3, 4), F(3, 4), args={"elementwise_affine": 1}, outputs=3, seeds=(2,),
       wrt=(0,), label="affine, the std only"))
spec("Moments",
     C(F(2, 3, 4)),
     C(F(2, 3, 4), args={"axes": [1], "keepdims": 0}),
     C(F(2, 3, 4), args={"axes": [0, 2]}),
     C(F(2, 3, 4), args={"axes": [1]}, seeds=(0,), label="only the mean"),
     C(F(2, 3, 4), args={"axes": [0, 2], "keepdims": 0}, seeds=(1,), label="only the variance"))
spec("ChannelShuffle", C(F(1, 4, 2, 2), args={"group": 2}),
     C(F(1, 2, 2, 6), args={"group": 3, "order": "NHWC"}))

# ------------------------------------------------------------- reductions --

_AXES = [C(F(2, 3, 4)), C(F(2, 3, 4), args={"axes": [1]}),
         C(F(2, 3, 4), args={"axes": [0, 2], "keepdims": 0})]
ops(["ReduceSum", "ReduceMean", "ReduceL2"], *_AXES)
spec("ReduceL1", *[C(F(2, 3, 4, away=[0]), args=c.args) for c in _AXES])
ops(["ReduceMax", "ReduceMin"], *[C(Distinct(2, 3, 4), args=c.args) for c in _AXES])
ops(["ReduceFrontSum", "ReduceFrontMean", "ReduceBackSum", "ReduceBackMean"],
    C(F(2, 3, 4)), C(F(2, 3, 4), args={"num_reduce_dim": 2}))
ops(["ReduceFrontSum", "ReduceFrontMean"],
    C(F(3, 4), Ints(1, 3, 0, 2), label="lengths"))
ops(["ReduceBackSum", "ReduceBackMean"], C(F(4, 3), Ints(1, 3, 0, 2), label="lengths"))
ops(["ReduceFrontMax", "ReduceBackMax"], C(Distinct(2, 3, 4)),
    C(Distinct(2, 3, 4), args={"num_reduce_dim": 2}))
spec("ReduceFrontMax", C(Distinct(3, 4), Ints(1, 3, 2, 2), label="lengths"))
spec("ReduceBackMax", C(Distinct(4, 3), Ints(1, 3, 2, 2), label="lengths"))

# ------------------------------------------------------ segments, sparse --

ops(["SortedSegmentSum", "SortedSegmentMean"], C(F(5, 2), Ints(0, 0, 1, 2, 2)),
    C(F(5), Ints(0, 1, 1, 1, 2), label="1-d data"))
ops(["UnsortedSegmentSum", "UnsortedSegmentMean"], C(F(5, 2), Ints(1, 0, 1, 2, 0)),
    C(F(5, 2), Ints(1, 0, 1, 2, 0), args={"num_segments": 4}))
ops(["SparseSortedSegmentSum", "SparseSortedSegmentMean"],
    C(F(4, 2), Ints(3, 0, 3, 1, 2), Ints(0, 0, 1, 1, 2)))
ops(["SparseUnsortedSegmentSum", "SparseUnsortedSegmentMean"],
    C(F(4, 2), Ints(3, 0, 3, 1, 2), Ints(1, 0, 1, 2, 0)),
    C(F(4, 2), Ints(3, 0, 3, 1, 2), Ints(1, 0, 1, 2, 0), args={"num_segments": 4}))
ops(["SortedSegmentRangeSum", "SortedSegmentRangeMean", "SortedSegmentRangeLogSumExp",
     "SortedSegmentRangeLogMeanExp"], C(F(5, 2), Ints(0, 0, 1, 1, 1)))
spec("SortedSegmentRangeMax", C(Distinct(5, 2), Ints(0, 0, 1, 1, 1)))
ops(["LengthsSum", "LengthsMean"], C(F(5, 2), Ints(2, 0, 3)))
spec("LengthsMax", C(Distinct(5, 2), Ints(2, 1, 2)))
spec("LengthsWeightedSum", C(F(5, 2), F(5), Ints(2, 0, 3), wrt=(0,)),
     C(F(5, 2), F(5), Ints(2, 0, 3), args={"grad_on_weights": 1}))
ops(["SparseLengthsSum", "SparseLengthsMean"], C(F(4, 2), Ints(3, 0, 3, 1, 2), Ints(2, 3)),
    C(F(4, 2), Ints(3, 0, 3, 1, 2, dtype=np.int64), Ints(2, 0, 3), label="int64 indices"))
spec("SparseLengthsWeightedSum", C(F(4, 2), F(5), Ints(3, 0, 3, 1, 2), Ints(2, 3), wrt=(0,)),
     C(F(4, 2), F(5), Ints(3, 0, 3, 1, 2), Ints(2, 3), args={"grad_on_weights": 1}))
spec("Gather",
     C(F(4, 3), Ints(2, 0, 2)),
     C(F(4, 3), Const([[2, 0], [3, 2]]), args={"dense_gradient": 1}),
     C(F(3, 4), Ints(3, 0, 3), args={"axis": 1}),
     C(F(2, 4, 2), Const([[3, 0, 3], [1, 1, 2]]), args={"axis": 1, "match_outer": 1}),
     C(F(4, 3), Ints(-1, 0, 3), args={"wrap_indices": 1}, label="wrapped indices"),
     C(F(4, 3), Ints(-1, 0, -1), args={"wrap_indices": 1, "dense_gradient": 1},
       label="wrapped indices, dense"),
     C(F(3, 4), Ints(-1, 0), args={"axis": 1, "wrap_indices": 1}, label="wrapped, axis 1"))
spec("BatchGather", C(F(2, 4, 3), Ints(3, 0, 3)), C(F(2, 3, 4), Ints(3, 0), args={"axis": 2}))
spec("SparseToDense", C(Ints(2, 0, 2), F(3, 2)), C(Ints(2, 0, 2), F(3, 2), Fixed(F(5, 2)),
                                                    label="data to infer dim"))
spec("BooleanMask", C(F(4, 2), Const([True, False, True, True], bool)),
     C(F(4), Const([False, True, True, False], bool), outputs=2, seeds=(0,)))
spec("SequenceMask",
     C(F(3, 4), Ints(1, 3, 0), args={"mode": "sequence", "fill_val": 0.5}),
     C(F(2, 3, 2), Ints(2, 0, 3), args={"mode": "window", "radius": 1, "axis": 2, "batch": 0,
                                        "fill_val": 0.0}, label="window, batch"),
     C(F(4, 4), args={"mode": "upperdiag", "fill_val": 0.0}, label="upperdiag"))
spec("TopK", C(Distinct(3, 5), args={"k": 2}, outputs=2, seeds=(0,)),
     C(Distinct(4, 3), args={"k": 3, "axis": 0}, outputs=3, seeds=(0,)))
spec("PackSegments", C(Ints(2, 0, 3), F(5, 2)),
     C(Ints(2, 0, 3), F(5, 2), args={"return_presence_mask": 1}, outputs=2, seeds=(0,)),
     C(Ints(2, 1, 3), F(6), args={"max_length": 4}, label="max_length"))
spec("UnpackSegments", C(Ints(2, 0, 3), F(3, 3, 2)),
     C(Ints(2, 1, 3), F(3, 4), args={"max_length": 4}, label="max_length"))

# ------------------------------------------------ concat, split, dropout --

ops(["Concat", "DepthConcat"],
    C(F(2, 3), F(2, 1), outputs=2, seeds=(0,)),
    C(F(2, 3), F(1, 3), F(2, 3), args={"axis": 0}, outputs=2, seeds=(0,)),
    C(F(2, 3), F(2, 3), args={"axis": 1, "add_axis": 1}, outputs=2, seeds=(0,)),
    C(F(1, 2, 2, 3), F(1, 2, 2, 1), args={"order": "NHWC"}, outputs=2, seeds=(0,)))
ops(["Split", "DepthSplit"],
    C(F(2, 6), outputs=2),
    C(F(2, 6), args={"split": [1, 2, 3]}, outputs=3, seeds=(0, 2), label="an unused output"),
    C(F(4, 3), Ints(1, 3), args={"axis": 0}, outputs=2, label="split input"),
    C(F(2, 3), args={"axis": 0, "add_axis": 1}, outputs=2))
spec("SplitByLengths",
     C(F(5, 2), Ints(2, 3), outputs=2),
     C(F(6, 2), Ints(1, 2, 0, 3), outputs=2, seeds=(1,)),
     C(F(2, 5), Ints(2, 3), args={"axis": 1}, outputs=2))
spec("Dropout", C(F(3, 4), args={"is_test": 1}),
     C(F(3, 4), args={"ratio": 0.5}, outputs=2, seeds=(0,), random_seed=7, label="training, seeded"))
spec("ElementwiseLinear",
     C(F(3, 4), F(4), F(4)),
     C(F(2, 3, 2), F(6), F(6), args={"axis": 1}, label="axis 1 of 3 dims"),
     C(F(2, 3, 2), F(2), F(2), args={"axis": 2}, label="axis 2"))
spec("LSTMUnit",
     C(F(1, 3, 2), F(1, 3, 2), F(1, 3, 8, lo=-2, hi=2), Ints(3, 1, 0), Ints(1)),
     C(F(1, 3, 2), F(1, 3, 2), F(1, 3, 8, lo=-2, hi=2), Ints(3, 1, 0), Ints(1),
       args={"drop_states": True, "forget_bias": 1.0}, label="drop_states"),
     C(F(1, 2, 3), F(1, 2, 3), F(1, 2, 12, lo=-2, hi=2), Ints(0),
       args={"sequence_lengths": False}, label="no seq_lengths"))
spec("GRUUnit",
     C(F(1, 3, 2), F(1, 3, 6, lo=-2, hi=2), Ints(3, 1, 0), Ints(1)),
     C(F(1, 3, 2), F(1, 3, 6, lo=-2, hi=2), Ints(3, 1, 0), Ints(1),
       args={"drop_states": True}, label="drop_states"),
     C(F(1, 2, 3), F(1, 2, 9, lo=-2, hi=2), Ints(4), args={"sequence_lengths": False},
       label="no seq_lengths"))

# ------------------------------------------------------------ unchecked --

#: Ops with a gradient maker and no spec, with the reason.
UNCHECKED = {
    "Python": "its gradient is the user's function; the PythonGradient plumbing is checked in "
              "tests/train/test_python_op_gradient.py",
}
UNCHECKED["RecurrentNetwork"] = ("runs a step net given as an argument: checked through "
                                 "recurrent_net in tests/train/test_recurrent_network.py")
UNCHECKED["ZeroGradient"] = ("no output: its maker gives its input a zero gradient, checked in "
                             "tests/train/test_recurrent_units.py")
CONTROL = "checked in tests/train/test_control_gradients.py"
for _op in ("If", "While", "Do"):
    UNCHECKED[_op] = CONTROL

#: Why the makers that give no gradient give none (Caffe2's NO_GRADIENT).
NOT_DIFFERENTIABLE = {
    **{t: "comparison or logic: boolean output" for t in
       ("EQ", "NE", "LT", "LE", "GT", "GE", "And", "Or", "Xor", "Not")},
    **{t: "integer-only: bit operations" for t in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")},
    **{t: "integer output: indices, one-hot codes or a shape" for t in
       ("ArgMax", "ArgMin", "OneHot", "LengthsToShape", "IndexGet")},
    **{t: "a fill: its output depends on no input's value" for t in
       ("ConstantFill", "GivenTensorFill", "GivenTensorBoolFill", "GivenTensorIntFill",
        "GivenTensorInt64Fill", "GivenTensorDoubleFill", "DiagonalFill", "Float16ConstantFill")},
    **{t: "random output" for t in
       ("UniformFill", "UniformIntFill", "GaussianFill", "XavierFill", "MSRAFill",
        "Float16UniformFill")},
    **{t: "a counter or schedule" for t in ("Iter", "AtomicIter", "LearningRate")},
    **{t: "an index: maps keys to ids" for t in
       ("IntIndexCreate", "LongIndexCreate", "StringIndexCreate")},
    "TensorProtosDBInput": "needs a db; its records are data",
    "Accuracy": "a metric: piecewise constant",
    "Sign": "piecewise constant: zero gradient almost everywhere",
    "StopGradient": "stops the gradient by design",
    "FloatToFused8BitRowwiseQuantized": "quantized (integer) output",
    **{t: "quantised (integer) inference: nothing to differentiate" for t in
       ("Int8Quantize", "Int8Dequantize", "Int8GivenTensorFill", "Int8GivenIntTensorFill",
        "Int8Conv", "Int8ConvRelu", "Int8FC", "Int8Sum", "Int8SumRelu", "Int8AveragePool",
        "Int8AveragePoolRelu", "Int8MaxPool", "Int8MaxPoolRelu", "Int8Softmax",
        "Int8ResizeNearest", "Int8Add", "Int8AddRelu", "Int8Relu", "Int8LeakyRelu",
        "Int8Sigmoid", "Int8Reshape", "Int8Flatten", "Int8Concat", "Int8Slice",
        "Int8Transpose", "Int8ChannelShuffle", "Int8ConvTranspose", "Int8RoIAlign")},
}
