//! Every elementwise unary op and its gradient op, one row each of
//! [`OPS`]: the activations (Relu, Sigmoid, Tanh, LeakyRelu, Elu, Swish,
//! Gelu, ReluN, Softsign, HardSigmoid, Mish, Selu, Softplus, Logit,
//! ThresholdedRelu) and the math functions (Exp, Log, Sqrt, Negative, Abs,
//! Clip, Sqr, Cube, Cbrt, Rsqrt, Reciprocal, Log1p, Sin, Cos, Tan, Asin,
//! Acos, Atan, Sinh, Cosh, Erf, Sign). A new one is a row here; the
//! activations that are not elementwise (Softmax, PRelu, Dropout) are in
//! `activation.rs`.
//!
//! A row holds the forward function, the inputs its gradient op reads
//! (Caffe2's: some read X, some Y, in Caffe2's order), the gradient's
//! function, where Caffe2 allowed the op in place, its arguments (read by
//! [`params`]) and whether shape inference knows its output. The kernels
//! take float32 or float64 (any other dtype is a `DataTypeError` naming the
//! op and blob). Three kinds of rows, kept as they were written:
//! - `native!`/`native_bwd!` (issue 14's ops): the expression is compiled
//!   for float32 and float64 and computed in the input's own type
//!   (`map_t`, `grad_map_t`: on the widest vectors, in chunks on the kernel
//!   pool when large, in place over an unshared X when Y is X);
//! - `fwd!`/`bwd!` (issue 21's): one kernel per function over the generic
//!   loops `forward_t` and `backward_t`, which evaluate the function in
//!   float64 (so float32 results are the exactly rounded values of the
//!   formula) and split large tensors across the kernel pool;
//! - `vector!` (issue 30's Sigmoid, Tanh, Exp, Log): float32 through a
//!   function of `crate::vmath` (branch-free, auto-vectorised, within a few
//!   ulps of the exact value: its doc states the bounds), float64 through
//!   std's functions, both through `map_t`.
//!
//! The output has its input's shape and type (Caffe2's
//! `IdenticalTypeAndShape`); a gradient op's inputs must all have one shape.
//! Which gradient ops an op's gradient takes is decided in Python
//! (`ferrocaffe/gradients.py`), as for the other families.

#![allow(clippy::result_large_err)]

use super::kit::kernel;
use super::kit::{
    array, dense, float_dtype, in_place_0_0, in_place_1_0, in_place_2_0, input, same_shape,
};
use crate::arg;
use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{ArgDoc, InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::shapes::rules::same_as_input;
use crate::tensor::written_vec;
use crate::tensor::DataType;
use std::mem::MaybeUninit;

/// An op's arguments, read once when the op is created.
#[derive(Clone, Copy, Debug, Default)]
struct Params {
    a: f64,
    b: f64,
    flag: bool,
}

/// Y = f(X, params).
type Fwd = fn(f64, &Params) -> f64;
/// dX = g(v0, v1, dY, params): v0 and v1 the gradient op's value inputs in
/// the order it takes them (v1 is 0 for an op that reads one).
type Bwd = fn(f64, f64, f64, &Params) -> f64;
/// A forward kernel: Y from X (input 0), by a row's function.
type FwdRun = fn(&mut Locked<'_>, &str, &Params) -> Result<()>;
/// A gradient kernel: dX from the gradient op's inputs.
type BwdRun = fn(&mut Locked<'_>, &str, &GradDef, &Params) -> Result<()>;

/// `(function, kernel)` of a row: the kernel is compiled for this function
/// (so a simple one is inlined into the loop), dispatched on X's dtype.
macro_rules! fwd {
    (|$x:tt, $p:tt| $e:expr) => {{
        #[allow(unused_variables)]
        fn scalar($x: f64, $p: &Params) -> f64 {
            $e
        }
        fn run(l: &mut Locked<'_>, op: &str, p: &Params) -> Result<()> {
            crate::with_match_dtype!(floats float_dtype(l, op, 0)?,
                |T| forward_t::<T>(l, op, |x| scalar(x, p)),
                else other => Err(crate::tensor::unsupported_dtype(other)))
        }
        (scalar as Fwd, run as FwdRun)
    }};
}

/// `(function, kernel)` of a gradient row, dispatched on dY's dtype.
macro_rules! bwd {
    (|$a:tt, $b:tt, $d:tt, $p:tt| $e:expr) => {{
        #[allow(unused_variables)]
        fn scalar($a: f64, $b: f64, $d: f64, $p: &Params) -> f64 {
            $e
        }
        fn run(l: &mut Locked<'_>, op: &str, gd: &GradDef, p: &Params) -> Result<()> {
            crate::with_match_dtype!(floats float_dtype(l, op, gd.reads.dy())?,
                |T| backward_t::<T>(l, op, gd, |a, b, d| scalar(a, b, d, p)),
                else other => Err(crate::tensor::unsupported_dtype(other)))
        }
        (scalar as Bwd, run as BwdRun)
    }};
}

/// Float parameters converted once to the kernel's type (the rows that
/// compute in their input's own type).
struct Typed<T> {
    a: T,
    b: T,
}

impl<T: Float> Typed<T> {
    fn of(p: &Params) -> Typed<T> {
        Typed {
            a: T::of(p.a),
            b: T::of(p.b),
        }
    }
}

/// `(function, kernel)` of a row computed in its input's own type (float32
/// in float32): the expression is compiled once per type, and applied
/// element by element on the calling thread.
macro_rules! native {
    (|$x:tt, $p:tt| $e:expr) => {{
        #[allow(unused_variables)]
        fn f32_($x: f32, $p: &Typed<f32>) -> f32 {
            $e
        }
        #[allow(unused_variables)]
        fn f64_($x: f64, $p: &Typed<f64>) -> f64 {
            $e
        }
        fn scalar(x: f64, p: &Params) -> f64 {
            f64_(x, &Typed::of(p))
        }
        fn run(l: &mut Locked<'_>, op: &str, p: &Params) -> Result<()> {
            match float_dtype(l, op, 0)? {
                DataType::Float => {
                    let q = Typed::of(p);
                    map_t::<f32>(l, |v| f32_(v, &q))
                }
                _ => {
                    let q = Typed::of(p);
                    map_t::<f64>(l, |v| f64_(v, &q))
                }
            }
        }
        (scalar as Fwd, run as FwdRun)
    }};
}

/// `(function, kernel)` of a row with a vectorised float32 form: float32
/// inputs go through `$f32` (one of `crate::vmath`'s functions, a few ulps
/// from the exact value: its doc), float64 ones through the expression
/// (std's functions); both through `map_t` (in place when X is unshared,
/// on the kernel pool when large).
macro_rules! vector {
    ($f32:path, |$x:tt| $e:expr) => {{
        fn f64_($x: f64) -> f64 {
            $e
        }
        fn scalar(x: f64, _: &Params) -> f64 {
            f64_(x)
        }
        fn run(l: &mut Locked<'_>, op: &str, _: &Params) -> Result<()> {
            match float_dtype(l, op, 0)? {
                DataType::Float => map_t::<f32>(l, $f32),
                _ => map_t::<f64>(l, f64_),
            }
        }
        (scalar as Fwd, run as FwdRun)
    }};
}

/// `(function, kernel)` of a gradient row computed in its inputs' own
/// type, from inputs (V, dY): V the forward op's output or input.
macro_rules! native_bwd {
    (|$v:tt, $d:tt, $p:tt| $e:expr) => {{
        #[allow(unused_variables)]
        fn g32($v: f32, $d: f32, $p: &Typed<f32>) -> f32 {
            $e
        }
        #[allow(unused_variables)]
        fn g64($v: f64, $d: f64, $p: &Typed<f64>) -> f64 {
            $e
        }
        fn scalar(v: f64, _: f64, d: f64, p: &Params) -> f64 {
            g64(v, d, &Typed::of(p))
        }
        fn run(l: &mut Locked<'_>, op: &str, _: &GradDef, p: &Params) -> Result<()> {
            match float_dtype(l, op, 0)? {
                DataType::Float => {
                    let q = Typed::of(p);
                    grad_map_t::<f32>(l, op, |v, d| g32(v, d, &q))
                }
                _ => {
                    let q = Typed::of(p);
                    grad_map_t::<f64>(l, op, |v, d| g64(v, d, &q))
                }
            }
        }
        (scalar as Bwd, run as BwdRun)
    }};
}

/// Y = f(X) elementwise.
/// Large contiguous tensors are computed in chunks on the kernel pool
/// (`map1`).
/// Run in place (Y is X), X's buffer is overwritten when nothing else holds
/// it (as Caffe2's in-place activations do), with no new buffer.
fn map_t<T: Float>(l: &mut Locked<'_>, f: impl Fn(T) -> T + Sync) -> Result<()> {
    if l.aliases(0, 0) {
        if let crate::blob::BlobValue::Tensor(t) = l.output(0) {
            if let Some(s) = T::shared_mut(t)
                .and_then(std::sync::Arc::get_mut)
                .and_then(|a| a.as_slice_mut())
            {
                map_in_place(s, f);
                return Ok(());
            }
        }
    }
    let y = l.tensor(0)?;
    let x = T::view(y).ok_or_else(|| Error::internal("dtype checked"))?;
    let y = match x.as_slice() {
        Some(s) => array(x.shape(), map1(s, f)?)?,
        _ => crate::tensor::map_array(x.view(), |&v| f(v))?,
    };
    l.set_output(0, T::wrap(y));
    Ok(())
}

/// dX = g(Y, dY) elementwise, inputs (Y, dY).
fn grad_map_t<T: Float>(l: &mut Locked<'_>, op: &str, g: impl Fn(T, T) -> T + Sync) -> Result<()> {
    same_shape(op, l, 0, 1)?;
    let (y, dy) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let dx = match (y.as_slice(), dy.as_slice()) {
        (Some(a), Some(b)) => array(dy.shape(), map2(a, b, g)?)?,
        _ => crate::tensor::zip_map_array(y.view(), dy.view(), |&y, &d| g(y, d))?,
    };
    l.set_output(0, T::wrap(dx));
    Ok(())
}

/// What a gradient op reads, in its input order.
#[derive(Clone, Copy)]
enum Reads {
    /// (Y, dY)
    YDy,
    /// (X, dY)
    XDy,
    /// (dY, X)
    DyX,
    /// (dY, Y)
    DyY,
    /// (X, Y, dY)
    XYDy,
}

impl Reads {
    fn n_inputs(self) -> usize {
        match self {
            Reads::XYDy => 3,
            _ => 2,
        }
    }
    /// The position of dY.
    fn dy(self) -> usize {
        match self {
            Reads::YDy | Reads::XDy => 1,
            Reads::DyX | Reads::DyY => 0,
            Reads::XYDy => 2,
        }
    }
    /// The positions of the values the gradient function takes.
    fn values(self) -> &'static [usize] {
        match self {
            Reads::YDy | Reads::XDy => &[0],
            Reads::DyX | Reads::DyY => &[1],
            Reads::XYDy => &[0, 1],
        }
    }
}

struct GradDef {
    name: &'static str,
    /// The output's shape and type are dY's (shape inference).
    infer: bool,
    reads: Reads,
    /// Caffe2 allowed dX to be written over dY.
    inplace: bool,
    /// The function, and the kernel that applies it (`bwd!`).
    g: (Bwd, BwdRun),
    doc: &'static str,
}

struct UnaryDef {
    name: &'static str,
    /// The output's shape and type are X's (shape inference).
    infer: bool,
    /// The function, and the kernel that applies it (`fwd!`).
    f: (Fwd, FwdRun),
    /// Caffe2 allowed Y to be written over X.
    inplace: bool,
    args: &'static [ArgDoc],
    doc: &'static str,
    grad: Option<GradDef>,
}

const LEAKY_ARGS: &[ArgDoc] = &[arg!("alpha", "float", "0.01", "the slope for X <= 0")];
const CLIP_ARGS: &[ArgDoc] = &[
    arg!("min", "float", "lowest float", "the lower bound"),
    arg!("max", "float", "largest float", "the upper bound"),
];
const ELU_ARGS: &[ArgDoc] = &[arg!(
    "alpha",
    "float",
    "1.0",
    "Y = alpha * (exp(X) - 1) for X < 0"
)];
const THRESHOLDED_ARGS: &[ArgDoc] = &[arg!(
    "alpha",
    "float",
    "1.0",
    "Y = X where X > alpha, else 0"
)];
const RELU_N_ARGS: &[ArgDoc] = &[arg!(
    "n",
    "float",
    "6.0",
    "the cap of the output (must be > 0)"
)];
const HARD_SIGMOID_ARGS: &[ArgDoc] = &[
    arg!("alpha", "float", "0.2", "the slope"),
    arg!("beta", "float", "0.5", "the offset"),
];
const SELU_ARGS: &[ArgDoc] = &[
    arg!(
        "alpha",
        "float",
        "1.6732632",
        "Y = scale * alpha * (exp(X) - 1) for X <= 0"
    ),
    arg!(
        "scale",
        "float",
        "1.0507010",
        "the factor of both branches (must be > 1)"
    ),
];
const LOGIT_ARGS: &[ArgDoc] = &[arg!(
    "eps",
    "float",
    "1e-6",
    "X is clamped to [eps, 1 - eps] (0 <= eps < 0.5)"
)];
const GELU_ARGS: &[ArgDoc] = &[arg!(
    "fast_gelu",
    "bool",
    "false",
    "use the tanh approximation 0.5 X (1 + tanh(sqrt(2/pi) (X + 0.044715 X^3)))"
)];

/// The op's arguments (a gradient op reads its forward op's).
fn params(ctx: &OpDefCtx<'_>, name: &str) -> Result<Params> {
    let a = &ctx.args;
    Ok(match name {
        "Elu" => Params {
            a: f64::from(a.f32("alpha", 1.0)?),
            ..Params::default()
        },
        "ReluN" => {
            let n = a.f32("n", 6.0)?;
            if n.is_nan() || n <= 0.0 {
                return Err(ctx.bad_arg(format!("n must be greater than 0, got {n}")));
            }
            Params {
                a: f64::from(n),
                ..Params::default()
            }
        }
        "ThresholdedRelu" => Params {
            a: f64::from(a.f32("alpha", 1.0)?),
            ..Params::default()
        },
        "HardSigmoid" => Params {
            a: f64::from(a.f32("alpha", 0.2)?),
            b: f64::from(a.f32("beta", 0.5)?),
            ..Params::default()
        },
        "Selu" => {
            let scale = a.f32("scale", 1.050_701)?;
            if scale.is_nan() || scale <= 1.0 {
                return Err(ctx.bad_arg(format!("scale must be greater than 1, got {scale}")));
            }
            Params {
                a: f64::from(a.f32("alpha", 1.673_263_2)?),
                b: f64::from(scale),
                ..Params::default()
            }
        }
        "Logit" => {
            let eps = a.f32("eps", 1e-6)?;
            if !(0.0..0.5).contains(&eps) {
                return Err(ctx.bad_arg(format!("eps must be in [0, 0.5), got {eps}")));
            }
            Params {
                a: f64::from(eps),
                ..Params::default()
            }
        }
        "LeakyRelu" => Params {
            a: f64::from(a.f32("alpha", 0.01)?),
            ..Params::default()
        },
        "Clip" => {
            let lo = a.f32("min", f32::MIN)?;
            let hi = a.f32("max", f32::MAX)?;
            if lo > hi {
                return Err(ctx.bad_arg(format!("min ({lo}) must not exceed max ({hi})")));
            }
            Params {
                a: f64::from(lo),
                b: f64::from(hi),
                ..Params::default()
            }
        }
        "Gelu" => Params {
            flag: a.bool("fast_gelu", false)?,
            ..Params::default()
        },
        _ => Params::default(),
    })
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// ln(1 + e^x) without overflow.
fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044_715;
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// The standard normal CDF.
fn norm_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

fn gelu(x: f64, p: &Params) -> f64 {
    if p.flag {
        0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + GELU_C * x * x * x)).tanh())
    } else {
        x * norm_cdf(x)
    }
}

fn gelu_grad(x: f64, _: f64, d: f64, p: &Params) -> f64 {
    if p.flag {
        let t = (SQRT_2_OVER_PI * (x + GELU_C * x * x * x)).tanh();
        0.5 * d * (1.0 + t + x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x))
    } else {
        d * (norm_cdf(x) + x * (-0.5 * x * x).exp() * INV_SQRT_2PI)
    }
}

fn mish_grad(x: f64, _y: f64, d: f64, _: &Params) -> f64 {
    let t = softplus(x).tanh();
    d * (t + x * (1.0 - t * t) * sigmoid(x))
}

/// The ops, in Caffe2's names, with their gradients' inputs and in-place rules.
static OPS: &[UnaryDef] = &[
    // Issue 14's, computed in their input's own type.
    UnaryDef {
        name: "Relu",
        infer: true,
        f: native!(|x, _| if x > 0.0 { x } else { 0.0 }),
        inplace: true,
        args: &[],
        doc: "Y = max(X, 0) elementwise.",
        grad: Some(GradDef {
            name: "ReluGradient",
            infer: true,
            reads: Reads::YDy,
            inplace: true,
            g: native_bwd!(|y, d, _| if y > 0.0 { d } else { 0.0 }),
            doc: "Gradient of Relu: inputs (Y, dY), dX = dY where Y > 0, else 0.",
        }),
    },
    UnaryDef {
        name: "Sigmoid",
        infer: true,
        f: vector!(crate::vmath::sigmoid, |x| 1.0 / (1.0 + (-x).exp())),
        inplace: true,
        args: &[],
        doc: "Y = 1 / (1 + exp(-X)) elementwise; float32 within 2.5 ulp (vmath::sigmoid, vectorised), float64 from std's exp.",
        grad: Some(GradDef {
            name: "SigmoidGradient",
            infer: true,
            reads: Reads::YDy,
            inplace: true,
            g: native_bwd!(|y, d, _| d * y * (1.0 - y)),
            doc: "Gradient of Sigmoid: inputs (Y, dY), dX = dY * Y * (1 - Y).",
        }),
    },
    UnaryDef {
        name: "Tanh",
        infer: true,
        f: vector!(crate::vmath::tanh, |x| x.tanh()),
        inplace: true,
        args: &[],
        doc: "Y = tanh(X) elementwise; float32 within 5 ulp (vmath::tanh: Eigen's rational function, as Caffe2 computed it, vectorised), float64 from std's tanh.",
        grad: Some(GradDef {
            name: "TanhGradient",
            infer: true,
            reads: Reads::YDy,
            inplace: true,
            g: native_bwd!(|y, d, _| d * (1.0 - y * y)),
            doc: "Gradient of Tanh: inputs (Y, dY), dX = dY * (1 - Y^2).",
        }),
    },
    UnaryDef {
        name: "Exp",
        infer: true,
        f: vector!(crate::vmath::exp, |x| x.exp()),
        inplace: true,
        args: &[],
        doc: "Y = exp(X) elementwise; float32 within 1.5 ulp (vmath::exp, vectorised), float64 from std's exp.",
        grad: None,
    },
    UnaryDef {
        name: "Log",
        infer: true,
        f: vector!(crate::vmath::log, |x| x.ln()),
        inplace: true,
        args: &[],
        doc: "Y = ln(X) elementwise (IEEE: ln 0 = -inf, ln of a negative is NaN); float32 within 1 ulp (vmath::log, vectorised), float64 exact.",
        grad: None,
    },
    UnaryDef {
        name: "Sqrt",
        infer: true,
        f: native!(|x, _| x.sqrt()),
        inplace: true,
        args: &[],
        doc: "Y = sqrt(X) elementwise (IEEE: NaN for negatives).",
        grad: None,
    },
    UnaryDef {
        name: "Negative",
        infer: true,
        f: native!(|x, _| -x),
        inplace: true,
        args: &[],
        doc: "Y = -X elementwise.",
        grad: None,
    },
    UnaryDef {
        name: "Abs",
        infer: true,
        f: native!(|x, _| x.abs()),
        inplace: true,
        args: &[],
        doc: "Y = |X| elementwise.",
        grad: Some(GradDef {
            name: "AbsGradient",
            infer: false,
            reads: Reads::XDy,
            inplace: true,
            g: native_bwd!(|x, d, _| if x > 0.0 {
                d
            } else if x < 0.0 {
                -d
            } else {
                0.0
            }),
            doc: "Gradient of Abs: inputs (X, dY), dX = sign(X) * dY.",
        }),
    },
    UnaryDef {
        name: "LeakyRelu",
        infer: true,
        f: native!(|x, p| if x > 0.0 { x } else { p.a * x }),
        inplace: true,
        args: LEAKY_ARGS,
        doc: "Y = X where X > 0, else alpha * X.",
        grad: Some(GradDef {
            name: "LeakyReluGradient",
            infer: true,
            reads: Reads::YDy,
            inplace: true,
            g: native_bwd!(|y, d, p| if y > 0.0 { d } else { p.a * d }),
            doc: "Gradient of LeakyRelu: inputs (Y, dY), dX = dY where Y > 0, else alpha * dY.",
        }),
    },
    UnaryDef {
        name: "Clip",
        infer: false,
        f: native!(|x, p| {
            if x < p.a {
                p.a
            } else if x > p.b {
                p.b
            } else {
                x
            }
        }),
        inplace: true,
        args: CLIP_ARGS,
        doc: "Y = min(max(X, min), max) elementwise.",
        grad: Some(GradDef {
            name: "ClipGradient",
            infer: false,
            reads: Reads::YDy,
            inplace: true,
            g: native_bwd!(|y, d, p| if y > p.a && y < p.b { d } else { 0.0 }),
            doc: "Gradient of Clip: inputs (Y, dY), dX = dY where min < Y < max, else 0.",
        }),
    },
    // Issue 21's, computed in float64.
    UnaryDef {
        name: "Elu",
        infer: true,
        f: fwd!(|x, p| if x < 0.0 { p.a * x.exp_m1() } else { x }),
        inplace: true,
        args: ELU_ARGS,
        doc: "Y = X for X >= 0, alpha * (exp(X) - 1) below.",
        grad: Some(GradDef {
            name: "EluGradient",
            infer: true,
            reads: Reads::YDy,
            inplace: true,
            g: bwd!(|y, _, d, p| if y < 0.0 { d * (y + p.a) } else { d }),
            doc: "Gradient of Elu, inputs (Y, dY): dX = dY where Y >= 0, else dY * (Y + alpha).",
        }),
    },
    UnaryDef {
        name: "Swish",
        infer: true,
        f: fwd!(|x, _| x * sigmoid(x)),
        inplace: false,
        args: &[],
        doc: "Y = X / (1 + exp(-X)) elementwise.",
        grad: Some(GradDef {
            name: "SwishGradient",
            infer: true,
            reads: Reads::XYDy,
            inplace: true,
            g: bwd!(|x, y, d, _| d * (y + sigmoid(x) * (1.0 - y))),
            doc: "Gradient of Swish, inputs (X, Y, dY): dX = dY * (Y + sigmoid(X) * (1 - Y)).",
        }),
    },
    UnaryDef {
        name: "Gelu",
        infer: true,
        f: fwd!(|x, p| gelu(x, p)),
        inplace: false,
        args: GELU_ARGS,
        doc: "Y = X * P(N(0, 1) <= X) elementwise, or its tanh approximation with fast_gelu.",
        grad: Some(GradDef {
            name: "GeluGradient",
            infer: true,
            reads: Reads::DyX,
            inplace: false,
            g: bwd!(|x, b, d, p| gelu_grad(x, b, d, p)),
            doc: "Gradient of Gelu, inputs (dY, X) (of its approximation with fast_gelu).",
        }),
    },
    UnaryDef {
        name: "ReluN",
        infer: true,
        f: fwd!(|x, p| x.clamp(0.0, p.a)),
        inplace: true,
        args: RELU_N_ARGS,
        doc: "Y = min(max(X, 0), n) elementwise.",
        grad: Some(GradDef {
            name: "ReluNGradient",
            infer: true,
            reads: Reads::YDy,
            inplace: true,
            g: bwd!(|y, _, d, p| if y > 0.0 && y < p.a { d } else { 0.0 }),
            doc: "Gradient of ReluN, inputs (Y, dY): dX = dY where 0 < Y < n, else 0.",
        }),
    },
    UnaryDef {
        name: "ThresholdedRelu",
        infer: true,
        f: fwd!(|x, p| if x > p.a || x.is_nan() { x } else { 0.0 }),
        inplace: true,
        args: THRESHOLDED_ARGS,
        doc: "Y = X where X > alpha, else 0.",
        grad: Some(GradDef {
            name: "ThresholdedReluGradient",
            infer: true,
            reads: Reads::YDy,
            inplace: true,
            // Y is 0 exactly where X <= alpha (or X = 0): also right for a
            // negative alpha, where Caffe2's `Y > 0` dropped X in (alpha, 0).
            g: bwd!(|y, _, d, _| if y != 0.0 { d } else { 0.0 }),
            doc: "Gradient of ThresholdedRelu, inputs (Y, dY): dX = dY where Y != 0, else 0.",
        }),
    },
    UnaryDef {
        name: "Softsign",
        infer: true,
        f: fwd!(|x, _| x / (1.0 + x.abs())),
        inplace: true,
        args: &[],
        doc: "Y = X / (1 + |X|) elementwise.",
        grad: Some(GradDef {
            name: "SoftsignGradient",
            infer: true,
            reads: Reads::XDy,
            inplace: true,
            g: bwd!(|x, _, d, _| {
                let s = 1.0 + x.abs();
                d / (s * s)
            }),
            doc: "Gradient of Softsign, inputs (X, dY): dX = dY / (1 + |X|)^2.",
        }),
    },
    UnaryDef {
        name: "HardSigmoid",
        infer: true,
        f: fwd!(|x, p| (x * p.a + p.b).clamp(0.0, 1.0)),
        inplace: true,
        args: HARD_SIGMOID_ARGS,
        doc: "Y = max(0, min(1, alpha * X + beta)) elementwise.",
        grad: Some(GradDef {
            name: "HardSigmoidGradient",
            infer: true,
            reads: Reads::YDy,
            inplace: true,
            g: bwd!(|y, _, d, p| if y > 0.0 && y < 1.0 { d * p.a } else { 0.0 }),
            doc: "Gradient of HardSigmoid, inputs (Y, dY): dX = alpha * dY where 0 < Y < 1, else 0.",
        }),
    },
    UnaryDef {
        name: "Mish",
        infer: true,
        f: fwd!(|x, _| x * softplus(x).tanh()),
        inplace: false,
        args: &[],
        doc: "Y = X * tanh(ln(1 + exp(X))) elementwise.",
        grad: Some(GradDef {
            name: "MishGradient",
            infer: true,
            reads: Reads::XYDy,
            inplace: true,
            g: bwd!(|x, y, d, p| mish_grad(x, y, d, p)),
            doc: "Gradient of Mish, inputs (X, Y, dY): dX = dY * (t + X * (1 - t^2) * sigmoid(X)), t = tanh(ln(1 + exp(X))).",
        }),
    },
    UnaryDef {
        name: "Selu",
        infer: true,
        f: fwd!(|x, p| if x > 0.0 { p.b * x } else { p.b * p.a * x.exp_m1() }),
        inplace: true,
        args: SELU_ARGS,
        doc: "Y = scale * X for X > 0, scale * alpha * (exp(X) - 1) elsewhere.",
        grad: Some(GradDef {
            name: "SeluGradient",
            infer: true,
            reads: Reads::YDy,
            inplace: true,
            g: bwd!(|y, _, d, p| if y > 0.0 { p.b * d } else { d * (y + p.a * p.b) }),
            doc: "Gradient of Selu, inputs (Y, dY): dX = scale * dY where Y > 0, else dY * (Y + scale * alpha).",
        }),
    },
    UnaryDef {
        name: "Softplus",
        infer: true,
        f: fwd!(|x, _| softplus(x)),
        inplace: true,
        args: &[],
        doc: "Y = ln(1 + exp(X)) elementwise.",
        grad: Some(GradDef {
            name: "SoftplusGradient",
            infer: true,
            reads: Reads::YDy,
            inplace: true,
            g: bwd!(|y, _, d, _| -d * (-y).exp_m1()),
            doc: "Gradient of Softplus, inputs (Y, dY): dX = dY * (1 - exp(-Y)).",
        }),
    },
    UnaryDef {
        name: "Logit",
        infer: true,
        f: fwd!(|x, p| {
            let x = x.clamp(p.a, 1.0 - p.a);
            (x / (1.0 - x)).ln()
        }),
        inplace: true,
        args: LOGIT_ARGS,
        doc: "Y = ln(X / (1 - X)) elementwise, X clamped to [eps, 1 - eps].",
        grad: Some(GradDef {
            name: "LogitGradient",
            infer: true,
            reads: Reads::XDy,
            inplace: false,
            g: bwd!(|x, _, d, p| {
                if x < p.a || x > 1.0 - p.a {
                    0.0
                } else {
                    d / (x * (1.0 - x))
                }
            }),
            doc: "Gradient of Logit, inputs (X, dY): dX = dY / (X * (1 - X)) inside [eps, 1 - eps], else 0.",
        }),
    },
    UnaryDef {
        name: "Sqr",
        infer: true,
        f: fwd!(|x, _| x * x),
        inplace: true,
        args: &[],
        doc: "Y = X^2 elementwise (its gradient is made of Scale and Mul).",
        grad: None,
    },
    UnaryDef {
        name: "Cube",
        infer: true,
        f: fwd!(|x, _| x * x * x),
        inplace: false,
        args: &[],
        doc: "Y = X^3 elementwise.",
        grad: Some(GradDef {
            name: "CubeGradient",
            infer: true,
            reads: Reads::DyX,
            inplace: false,
            g: bwd!(|x, _, d, _| 3.0 * d * x * x),
            doc: "Gradient of Cube, inputs (dY, X): dX = 3 * dY * X^2.",
        }),
    },
    UnaryDef {
        name: "Cbrt",
        infer: true,
        f: fwd!(|x, _| x.cbrt()),
        inplace: true,
        args: &[],
        doc: "Y = the cube root of X elementwise (negative for negative X).",
        grad: Some(GradDef {
            name: "CbrtGradient",
            infer: true,
            reads: Reads::DyY,
            inplace: true,
            g: bwd!(|y, _, d, _| d / (3.0 * y * y)),
            doc: "Gradient of Cbrt, inputs (dY, Y): dX = dY / (3 * Y^2).",
        }),
    },
    UnaryDef {
        name: "Rsqrt",
        infer: true,
        f: fwd!(|x, _| 1.0 / x.sqrt()),
        inplace: true,
        args: &[],
        doc: "Y = 1 / sqrt(X) elementwise (IEEE: inf at 0, NaN for negatives).",
        grad: Some(GradDef {
            name: "RsqrtGradient",
            infer: true,
            reads: Reads::DyY,
            inplace: true,
            g: bwd!(|y, _, d, _| -0.5 * d * y * y * y),
            doc: "Gradient of Rsqrt, inputs (dY, Y): dX = -0.5 * dY * Y^3.",
        }),
    },
    UnaryDef {
        name: "Reciprocal",
        infer: true,
        f: fwd!(|x, _| 1.0 / x),
        inplace: true,
        args: &[],
        doc: "Y = 1 / X elementwise (IEEE: inf at 0).",
        grad: Some(GradDef {
            name: "ReciprocalGradient",
            infer: true,
            reads: Reads::YDy,
            inplace: true,
            g: bwd!(|y, _, d, _| -d * y * y),
            doc: "Gradient of Reciprocal, inputs (Y, dY): dX = -dY * Y^2.",
        }),
    },
    UnaryDef {
        name: "Log1p",
        infer: true,
        f: fwd!(|x, _| x.ln_1p()),
        inplace: false,
        args: &[],
        doc: "Y = ln(1 + X) elementwise, accurate for small X.",
        grad: Some(GradDef {
            name: "Log1pGradient",
            infer: true,
            reads: Reads::XDy,
            inplace: false,
            g: bwd!(|x, _, d, _| d / (1.0 + x)),
            doc: "Gradient of Log1p, inputs (X, dY): dX = dY / (1 + X).",
        }),
    },
    UnaryDef {
        name: "Sin",
        infer: true,
        f: fwd!(|x, _| x.sin()),
        inplace: false,
        args: &[],
        doc: "Y = sin(X) elementwise.",
        grad: Some(GradDef {
            name: "SinGradient",
            infer: true,
            reads: Reads::XDy,
            inplace: false,
            g: bwd!(|x, _, d, _| d * x.cos()),
            doc: "Gradient of Sin, inputs (X, dY): dX = dY * cos(X).",
        }),
    },
    UnaryDef {
        name: "Cos",
        infer: true,
        f: fwd!(|x, _| x.cos()),
        inplace: false,
        args: &[],
        doc: "Y = cos(X) elementwise.",
        grad: Some(GradDef {
            name: "CosGradient",
            infer: true,
            reads: Reads::XDy,
            inplace: false,
            g: bwd!(|x, _, d, _| -d * x.sin()),
            doc: "Gradient of Cos, inputs (X, dY): dX = -dY * sin(X).",
        }),
    },
    UnaryDef {
        name: "Tan",
        infer: true,
        f: fwd!(|x, _| x.tan()),
        inplace: false,
        args: &[],
        doc: "Y = tan(X) elementwise.",
        grad: Some(GradDef {
            name: "TanGradient",
            infer: true,
            reads: Reads::XDy,
            inplace: false,
            g: bwd!(|x, _, d, _| {
                let c = x.cos();
                d / (c * c)
            }),
            doc: "Gradient of Tan, inputs (X, dY): dX = dY / cos(X)^2.",
        }),
    },
    UnaryDef {
        name: "Asin",
        infer: true,
        f: fwd!(|x, _| x.asin()),
        inplace: false,
        args: &[],
        doc: "Y = arcsin(X) elementwise (NaN outside [-1, 1]).",
        grad: Some(GradDef {
            name: "AsinGradient",
            infer: true,
            reads: Reads::XDy,
            inplace: false,
            g: bwd!(|x, _, d, _| d / (1.0 - x * x).sqrt()),
            doc: "Gradient of Asin, inputs (X, dY): dX = dY / sqrt(1 - X^2).",
        }),
    },
    UnaryDef {
        name: "Acos",
        infer: true,
        f: fwd!(|x, _| x.acos()),
        inplace: false,
        args: &[],
        doc: "Y = arccos(X) elementwise (NaN outside [-1, 1]).",
        grad: Some(GradDef {
            name: "AcosGradient",
            infer: true,
            reads: Reads::XDy,
            inplace: false,
            g: bwd!(|x, _, d, _| -d / (1.0 - x * x).sqrt()),
            doc: "Gradient of Acos, inputs (X, dY): dX = -dY / sqrt(1 - X^2).",
        }),
    },
    UnaryDef {
        name: "Atan",
        infer: true,
        f: fwd!(|x, _| x.atan()),
        inplace: false,
        args: &[],
        doc: "Y = arctan(X) elementwise.",
        grad: Some(GradDef {
            name: "AtanGradient",
            infer: true,
            reads: Reads::XDy,
            inplace: false,
            g: bwd!(|x, _, d, _| d / (1.0 + x * x)),
            doc: "Gradient of Atan, inputs (X, dY): dX = dY / (1 + X^2).",
        }),
    },
    UnaryDef {
        name: "Sinh",
        infer: true,
        f: fwd!(|x, _| x.sinh()),
        inplace: false,
        args: &[],
        doc: "Y = sinh(X) elementwise.",
        grad: Some(GradDef {
            name: "SinhGradient",
            infer: true,
            reads: Reads::DyX,
            inplace: false,
            g: bwd!(|x, _, d, _| d * x.cosh()),
            doc: "Gradient of Sinh, inputs (dY, X): dX = dY * cosh(X).",
        }),
    },
    UnaryDef {
        name: "Cosh",
        infer: true,
        f: fwd!(|x, _| x.cosh()),
        inplace: false,
        args: &[],
        doc: "Y = cosh(X) elementwise.",
        grad: Some(GradDef {
            name: "CoshGradient",
            infer: true,
            reads: Reads::DyX,
            inplace: false,
            g: bwd!(|x, _, d, _| d * x.sinh()),
            doc: "Gradient of Cosh, inputs (dY, X): dX = dY * sinh(X).",
        }),
    },
    UnaryDef {
        name: "Erf",
        infer: true,
        f: fwd!(|x, _| libm::erf(x)),
        inplace: false,
        args: &[],
        doc: "Y = erf(X) elementwise (the Gauss error function).",
        grad: Some(GradDef {
            name: "ErfGradient",
            infer: true,
            reads: Reads::XDy,
            inplace: false,
            g: bwd!(|x, _, d, _| d * std::f64::consts::FRAC_2_SQRT_PI * (-x * x).exp()),
            doc: "Gradient of Erf, inputs (X, dY): dX = dY * 2 / sqrt(pi) * exp(-X^2).",
        }),
    },
    UnaryDef {
        name: "Sign",
        infer: true,
        f: fwd!(|x, _| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x * 0.0
            }
        }),
        inplace: false,
        args: &[],
        doc: "Y = -1, 0 or 1 by the sign of X elementwise (NaN stays NaN, -0 stays -0); no gradient.",
        grad: None,
    },
];

/// The row of a forward op, or of the forward op of a gradient op.
fn lookup(op_type: &str) -> Result<(&'static UnaryDef, bool)> {
    OPS.iter()
        .find_map(|d| {
            if d.name == op_type {
                Some((d, false))
            } else {
                d.grad
                    .as_ref()
                    .filter(|g| g.name == op_type)
                    .map(|_| (d, true))
            }
        })
        .ok_or_else(|| Error::internal(format!("{op_type}: not an op of ops/unary.rs")))
}

/// Tensors of at least this many elements may be computed in chunks on
/// the kernel pool (when the work pays for it, [`POOL_PAYS`]).
const PAR_MIN: usize = 1 << 15;
/// Work (timed on the first chunk) from which the pool's threads are
/// woken: twice the wake-up of a sleeping pool thread measured on the
/// 2-core VM (an in-place Relu of 200K float32 took 5 us on the calling
/// thread and 19 us on the pool, of 800K 33 and 24 us; BENCHMARKS.md "The
/// pool's wake-up and the small ops").
const POOL_PAYS: std::time::Duration = std::time::Duration::from_micros(40);
/// What the activations' buffers are named in an `OutOfMemory` error.
const OUTPUT: &str = "an activation's output";
const CHUNK: usize = 1 << 13;

fn parallel(n: usize) -> bool {
    n >= PAR_MIN && rayon::current_num_threads() > 1
}

/// Chunk `k` of `s`, or `s` when it is empty (an unused input).
fn part<T>(s: &[T], k: usize) -> &[T] {
    if s.is_empty() {
        s
    } else {
        &s[k * CHUNK..(k * CHUNK + CHUNK).min(s.len())]
    }
}

/// `body` over the chunks of `out` and the matching chunks of the inputs
/// `ins` (each of `out`'s length, or empty when unused): on the kernel pool
/// when large ([`parallel`]), else at once on the calling thread; each call
/// compiled for the widest vectors ([`crate::vmath::wide`]).
fn chunked<T: Float, O: Send>(
    out: &mut [O],
    ins: [&[T]; 3],
    body: impl Fn(&mut [O], [&[T]; 3]) + Sync,
) {
    #[inline(always)]
    fn run<T, O>(o: &mut [O], i: [&[T]; 3], body: &impl Fn(&mut [O], [&[T]; 3])) {
        crate::vmath::wide(
            #[inline(always)]
            || body(o, i),
        )
    }
    if !parallel(out.len()) {
        return run(out, ins, &body);
    }
    // The first chunk here, timed: the pool pays only when the rest would
    // take longer than waking its threads (`POOL_PAYS`), which depends on
    // the op (a Relu is 20 times as cheap as a Tanh).
    let start = std::time::Instant::now();
    let (first, rest) = out.split_at_mut(CHUNK);
    run(first, ins.map(|s| part(s, 0)), &body);
    let left = rest.len().div_ceil(CHUNK) as u32;
    if start.elapsed().saturating_mul(left) < POOL_PAYS {
        return run(rest, ins.map(|s| s.get(CHUNK..).unwrap_or(s)), &body);
    }
    use rayon::prelude::*;
    rest.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(k, o)| run(o, ins.map(|s| part(s, k + 1)), &body));
}

/// A new buffer of the inputs' length, each element written by `fill` over
/// matching chunks of itself and of the inputs (`chunked`); the first
/// `used` inputs must have one length, the others be empty.
fn map_n<T: Float>(
    ins: [&[T]; 3],
    used: usize,
    fill: impl Fn(&mut [MaybeUninit<T>], [&[T]; 3]) + Sync,
) -> Result<Vec<T>> {
    let n = ins[0].len();
    let (full, unused) = ins.split_at(used);
    if full.iter().any(|s| s.len() != n) || unused.iter().any(|s| !s.is_empty()) {
        return Err(Error::internal("unary map: operands of different lengths"));
    }
    // SAFETY: `chunked` hands each chunk of the output to `fill` once, and
    // every caller's `fill` writes each element of its chunk (its loop
    // zips the output chunk with input chunks of the same length).
    unsafe { written_vec(n, OUTPUT, |out| chunked(out, ins, fill)) }
}

/// `f` of each element of `a`.
fn map1<T: Float>(a: &[T], f: impl Fn(T) -> T + Sync) -> Result<Vec<T>> {
    map_n(
        [a, &[], &[]],
        1,
        #[inline(always)]
        |o, [a, _, _]| {
            for (o, &u) in o.iter_mut().zip(a) {
                o.write(f(u));
            }
        },
    )
}

/// Each element of `a` replaced by `f` of it.
fn map_in_place<T: Float>(a: &mut [T], f: impl Fn(T) -> T + Sync) {
    let none: &[T] = &[];
    chunked(
        a,
        [none; 3],
        #[inline(always)]
        |c, _| c.iter_mut().for_each(|v| *v = f(*v)),
    );
}

/// `f` of each pair of elements of `a` and `b` (one length).
fn map2<T: Float>(a: &[T], b: &[T], f: impl Fn(T, T) -> T + Sync) -> Result<Vec<T>> {
    map_n(
        [a, b, &[]],
        2,
        #[inline(always)]
        |o, [a, b, _]| {
            for ((o, &u), &v) in o.iter_mut().zip(a).zip(b) {
                o.write(f(u, v));
            }
        },
    )
}

/// `f` of each triple of elements of `a`, `b` and `c` (one length).
fn map3<T: Float>(a: &[T], b: &[T], c: &[T], f: impl Fn(T, T, T) -> T + Sync) -> Result<Vec<T>> {
    map_n(
        [a, b, c],
        3,
        #[inline(always)]
        |o, [a, b, c]| {
            for (((o, &u), &v), &w) in o.iter_mut().zip(a).zip(b).zip(c) {
                o.write(f(u, v, w));
            }
        },
    )
}

fn forward_t<T: Float>(l: &mut Locked<'_>, op: &str, f: impl Fn(f64) -> f64 + Sync) -> Result<()> {
    let x = input::<T>(l, op, 0)?;
    let y = map1(&dense(x), |v| T::of(f(v.to_f64())))?;
    let y = array(x.shape(), y)?;
    l.set_output(0, T::wrap(y));
    Ok(())
}

fn backward_t<T: Float>(
    l: &mut Locked<'_>,
    op: &str,
    gd: &GradDef,
    g: impl Fn(f64, f64, f64) -> f64 + Sync,
) -> Result<()> {
    let (dyi, vals) = (gd.reads.dy(), gd.reads.values());
    for &i in vals {
        same_shape(op, l, dyi, i)?;
    }
    let dy = input::<T>(l, op, dyi)?;
    let (ds, v0s) = (dense(dy), dense(input::<T>(l, op, vals[0])?));
    let dx = if let [_, i1] = vals {
        let v1s = dense(input::<T>(l, op, *i1)?);
        map3(&v0s, &v1s, &ds, |a, b, d| {
            T::of(g(a.to_f64(), b.to_f64(), d.to_f64()))
        })?
    } else {
        map2(&v0s, &ds, |a, d| T::of(g(a.to_f64(), 0.0, d.to_f64())))?
    };
    let dx = array(dy.shape(), dx)?;
    l.set_output(0, T::wrap(dx));
    Ok(())
}

fn build(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (def, grad) = lookup(ctx.op_type())?;
    let p = params(ctx, def.name)?;
    let op = ctx.op_type().to_string();
    if grad {
        let gd = def
            .grad
            .as_ref()
            .ok_or_else(|| Error::internal("no gradient"))?;
        let run = gd.g.1;
        Ok(kernel(move |cx| {
            let mut l = cx.lock();
            run(&mut l, &op, gd, &p)?;
            Ok(true)
        }))
    } else {
        let run = def.f.1;
        Ok(kernel(move |cx| {
            let mut l = cx.lock();
            run(&mut l, &op, &p)?;
            Ok(true)
        }))
    }
}

type InferFn = crate::operator::InferFn;
const LIKE: [InferFn; 3] = [
    |_, ins, n| Ok(same_as_input(ins, 0, n)),
    |_, ins, n| Ok(same_as_input(ins, 1, n)),
    |_, ins, n| Ok(same_as_input(ins, 2, n)),
];
const ALLOW: [fn(usize, usize) -> bool; 3] = [in_place_0_0, in_place_1_0, in_place_2_0];

pub fn schemas() -> Vec<OpSchema> {
    let mut v = Vec::new();
    for d in OPS {
        let mut s = OpSchema::new(d.name, build)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(d.args)
            .doc(d.doc);
        if d.infer {
            s = s.infer(LIKE[0]);
        }
        if d.inplace {
            s = s.inplace(InPlace::Allow(in_place_0_0));
        }
        v.push(s);
        if let Some(g) = &d.grad {
            let n = g.reads.n_inputs();
            let mut s = OpSchema::new(g.name, build)
                .inputs(n, n)
                .outputs(1, 1)
                .args(d.args)
                .doc(g.doc);
            if g.infer {
                s = s.infer(LIKE[g.reads.dy()]);
            }
            if g.inplace {
                s = s.inplace(InPlace::Allow(ALLOW[g.reads.dy()]));
            }
            v.push(s);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str) -> Fwd {
        lookup(name).unwrap().0.f.0
    }
    fn g(name: &str) -> Bwd {
        lookup(name).unwrap().0.grad.as_ref().unwrap().g.0
    }

    #[test]
    fn elu_and_its_gradient() {
        let p = Params {
            a: 1.5,
            ..Params::default()
        };
        assert_eq!(f("Elu")(2.0, &p), 2.0);
        let y = f("Elu")(-1.0, &p);
        assert!((y - 1.5 * ((-1.0f64).exp() - 1.0)).abs() < 1e-15);
        // dY * (Y + alpha) = dY * alpha * exp(X) below 0.
        assert!((g("Elu")(y, 0.0, 2.0, &p) - 2.0 * 1.5 * (-1.0f64).exp()).abs() < 1e-12);
        assert_eq!(g("Elu")(3.0, 0.0, 2.0, &p), 2.0);
    }

    #[test]
    fn gelu_exact_matches_known_values() {
        let p = Params::default();
        // Phi(1) = 0.8413447460685429.
        assert!((f("Gelu")(1.0, &p) - 0.841_344_746_068_542_9).abs() < 1e-14);
        assert_eq!(f("Gelu")(0.0, &p), 0.0);
        // d/dx at 0 is Phi(0) = 0.5.
        assert!((g("Gelu")(0.0, 0.0, 1.0, &p) - 0.5).abs() < 1e-15);
        let fast = Params {
            flag: true,
            ..Params::default()
        };
        assert!((f("Gelu")(1.0, &fast) - 0.841_191_990_607_477_2).abs() < 1e-12);
    }

    #[test]
    fn gradients_match_central_differences() {
        let p = Params {
            a: 0.05,
            b: 1.25,
            flag: false,
        };
        let h = 1e-6;
        for name in [
            "Elu",
            "Swish",
            "Gelu",
            "Softsign",
            "Mish",
            "Cube",
            "Cbrt",
            "Rsqrt",
            "Reciprocal",
            "Log1p",
            "Sin",
            "Cos",
            "Tan",
            "Asin",
            "Acos",
            "Atan",
            "Sinh",
            "Cosh",
            "Erf",
        ] {
            let (d, _) = lookup(name).unwrap();
            let gd = d.grad.as_ref().unwrap();
            for &x in &[0.3, 0.7, -0.45] {
                let (xv, yv) = (x, (d.f.0)(x, &p));
                let num = ((d.f.0)(x + h, &p) - (d.f.0)(x - h, &p)) / (2.0 * h);
                if num.is_nan() {
                    // Outside the domain (Rsqrt of a negative).
                    assert!(yv.is_nan(), "{name} at {x}");
                    continue;
                }
                let (a, b) = match gd.reads {
                    Reads::YDy | Reads::DyY => (yv, 0.0),
                    Reads::XDy | Reads::DyX => (xv, 0.0),
                    Reads::XYDy => (xv, yv),
                };
                let got = (gd.g.0)(a, b, 1.0, &p);
                assert!(
                    (got - num).abs() < 1e-6 * (1.0 + num.abs()),
                    "{name} at {x}: {got} vs {num}"
                );
            }
        }
    }

    #[test]
    fn clipping_ops_and_sign() {
        let p = Params {
            a: 6.0,
            ..Params::default()
        };
        assert_eq!(f("ReluN")(7.0, &p), 6.0);
        assert_eq!(f("ReluN")(-1.0, &p), 0.0);
        assert_eq!(g("ReluN")(6.0, 0.0, 1.0, &p), 0.0);
        assert_eq!(g("ReluN")(3.0, 0.0, 1.0, &p), 1.0);
        let hs = Params {
            a: 0.2,
            b: 0.5,
            flag: false,
        };
        assert_eq!(f("HardSigmoid")(10.0, &hs), 1.0);
        assert!((f("HardSigmoid")(1.0, &hs) - 0.7).abs() < 1e-15);
        assert!((g("HardSigmoid")(0.7, 0.0, 2.0, &hs) - 0.4).abs() < 1e-15);
        assert_eq!(f("Sign")(-3.0, &p), -1.0);
        assert_eq!(f("Sign")(0.0, &p), 0.0);
        assert!(f("Sign")(f64::NAN, &p).is_nan());
    }

    #[test]
    fn mish_does_not_overflow() {
        let p = Params::default();
        assert_eq!(f("Mish")(1000.0, &p), 1000.0);
        assert_eq!(g("Mish")(1000.0, 0.0, 1.0, &p), 1.0);
        assert_eq!(f("Mish")(-1000.0, &p), 0.0);
    }

    #[test]
    fn every_gradient_op_has_a_schema() {
        let names: Vec<&str> = schemas().iter().map(|s| s.name).collect();
        for d in OPS {
            assert!(names.contains(&d.name));
            if d.grad.is_some() {
                assert!(names.iter().any(|n| *n == format!("{}Gradient", d.name)));
            }
        }
    }
}
