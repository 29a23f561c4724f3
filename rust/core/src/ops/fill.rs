//! Fillers: ConstantFill, the GivenTensor*Fill family, UniformFill,
//! UniformIntFill, GaussianFill, Float16ConstantFill and Float16UniformFill.
//!
//! All of them share Caffe2's filler shape rules (see [`FillShape`]): with no
//! input the output shape is the `shape` argument (missing or empty means a
//! 0-dim scalar); with an input it is the input's shape, or its contents when
//! `input_as_shape` is set, followed by `extra_shape`. Every rule that depends
//! only on the definition is checked when the op is built.

use super::kit::by_dtype;
use super::kit::in_place_0_0;
use super::kit::kernel;
use crate::arg;
use crate::args::Args;
use crate::error::{Error, ErrorKind, Result};
use crate::num::Number;
use crate::operator::{ArgDoc, InPlace, InferFn, Locked, OpDefCtx, OpSchema, Operator, ShapeInfo};
use crate::tensor::{collect_array, copy_array, f16, filled_array, DataType, Element, Tensor};
use ndarray::{ArrayD, IxDyn};
use rand::distr::uniform::SampleUniform;
use rand::distr::{Distribution, Uniform};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::Normal;

pub(super) const SHAPE: ArgDoc = arg!(
    "shape",
    "list of int",
    "[] (a 0-dim scalar)",
    "output shape; only without an input"
);
pub(super) const EXTRA_SHAPE: ArgDoc = arg!(
    "extra_shape",
    "list of int",
    "[]",
    "dims appended to the shape taken from the input; only with an input"
);
pub(super) const INPUT_AS_SHAPE: ArgDoc = arg!(
    "input_as_shape",
    "bool",
    "false",
    "take the shape from the contents of input 0 (a non-empty 1-D int64 tensor) rather than from its shape"
);

/// Caffe2's model-building code marks init ops with `run_once` (its own
/// tests fill with `run_once=0`); no filler reads it.
pub(super) const FILLER_IGNORED: &[ArgDoc] = &[arg!(
    "run_once",
    "int",
    "none",
    "a model-building mark on init ops; accepted and ignored"
)];

/// What the typed GivenTensor*Fill variants accept and ignore: as in Caffe2,
/// their name fixes the dtype, and a `dtype` argument has no effect.
const TYPED_GIVEN_IGNORED: &[ArgDoc] = &[
    FILLER_IGNORED[0],
    arg!(
        "dtype",
        "int or string",
        "none",
        "accepted and ignored, as in Caffe2: the op's name fixes the dtype"
    ),
];

/// Inference for a filler whose name fixes its dtype.
macro_rules! infer_as {
    ($dtype:expr) => {
        |args: &Args<'_>, ins: &[Option<ShapeInfo>], _: usize| infer_fill(args, ins, $dtype)
    };
}

/// The schema shared by the typed GivenTensor*Fill variants.
fn given(
    name: &'static str,
    values: &'static [ArgDoc],
    infer: InferFn,
    doc: &'static str,
) -> OpSchema {
    OpSchema::new(name, given_tensor_fill)
        .infer(infer)
        .inputs(0, 1)
        .outputs(1, 1)
        .inplace(InPlace::Allow(in_place_0_0))
        .args(values)
        .ignores(TYPED_GIVEN_IGNORED)
        .doc(doc)
}

const FLOAT_VALUES_ARGS: &[ArgDoc] = &[VALUES_FLOATS, SHAPE, EXTRA_SHAPE, INPUT_AS_SHAPE];
const INT_VALUES_ARGS: &[ArgDoc] = &[VALUES_INTS, SHAPE, EXTRA_SHAPE, INPUT_AS_SHAPE];
const STRING_VALUES_ARGS: &[ArgDoc] = &[VALUES_STRINGS, SHAPE, EXTRA_SHAPE, INPUT_AS_SHAPE];

pub fn schemas() -> Vec<OpSchema> {
    let mut v = vec![
        OpSchema::new("ConstantFill", constant_fill)
            .inputs(0, 2)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[
                arg!("value", "float, int or string", "0", "the fill value, read with the field rule of its dtype"),
                arg!(
                    "dtype",
                    "int (TensorProto.DataType)",
                    "FLOAT, or inferred from value's field (f: FLOAT, i: INT64)",
                    "output dtype"
                ),
                SHAPE,
                EXTRA_SHAPE,
                INPUT_AS_SHAPE,
            ])
            .infer(|a, ins, _| {
                let like = ins.first().and_then(|i| i.as_ref()).map(|i| i.dtype);
                let dtype = match like {
                    Some(DataType::Double)
                        if !a.has("dtype")
                            && !a.bool("input_as_shape", false)?
                            && a.field_of("value") != Some("i") =>
                    {
                        DataType::Double
                    }
                    _ => constant_fill_dtype(a)?,
                };
                infer_fill(a, ins, dtype)
            })
            .ignores(FILLER_IGNORED)
            .doc(
                "Fills the output with one value. Input 0 (optional) gives the shape; input 1 (optional, one \
                 element of the output dtype, not for strings) overrides `value`.",
            ),
        OpSchema::new("GivenTensorFill", given_tensor_fill)
            .inputs(0, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[
                VALUES_FLOATS,
                arg!(
                    "dtype",
                    "int or string",
                    "FLOAT",
                    "re-types `values`: FLOAT, DOUBLE (floats), BOOL, INT16, UINT16, INT32, INT64 (ints), STRING (strings)"
                ),
                SHAPE,
                EXTRA_SHAPE,
                INPUT_AS_SHAPE,
            ])
            .infer(|a, ins, _| infer_fill(a, ins, given_fill_dtype(a)?))
            .ignores(FILLER_IGNORED)
            .doc("Fills the output (float32 unless `dtype` says otherwise) with the given flat values, row-major."),
        given("GivenTensorDoubleFill", FLOAT_VALUES_ARGS, infer_as!(DataType::Double), "Fills a float64 output with the given flat values."),
        given("GivenTensorInt16Fill", INT_VALUES_ARGS, infer_as!(DataType::Int16), "Fills an int16 output with the given flat values."),
        given("GivenTensorIntFill", INT_VALUES_ARGS, infer_as!(DataType::Int32), "Fills an int32 output with the given flat values."),
        given("GivenTensorInt64Fill", INT_VALUES_ARGS, infer_as!(DataType::Int64), "Fills an int64 output with the given flat values."),
        given("GivenTensorBoolFill", INT_VALUES_ARGS, infer_as!(DataType::Bool), "Fills a bool output with the given flat values (non-zero is true)."),
        given("GivenTensorStringFill", STRING_VALUES_ARGS, infer_as!(DataType::String), "Fills a string output with the given flat values."),
        OpSchema::new("UniformFill", uniform_fill::<f32>)
            .inputs(0, 3)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[
                arg!("min", "float", "0", "lower bound (inclusive)"),
                arg!("max", "float", "1", "upper bound (exclusive); must exceed min"),
                SHAPE,
                EXTRA_SHAPE,
                INPUT_AS_SHAPE,
            ])
            .infer(infer_uniform::<{ DataType::Float as i32 }>)
            .ignores(FILLER_IGNORED)
            .doc(
                "Fills a float32 output with samples uniform on [min, max). Takes 0, 1 or 3 inputs: (shape source, \
                 min, max); with 3 inputs a min above max gives an output whose first dim is 0.",
            ),
        OpSchema::new("UniformIntFill", uniform_fill::<i32>)
            .inputs(0, 3)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[
                arg!("min", "int", "0", "lower bound (inclusive)"),
                arg!("max", "int", "1", "upper bound (inclusive); must exceed min"),
                SHAPE,
                EXTRA_SHAPE,
                INPUT_AS_SHAPE,
            ])
            .infer(infer_uniform::<{ DataType::Int32 as i32 }>)
            .ignores(FILLER_IGNORED)
            .doc("UniformFill for int32, with both bounds included."),
        OpSchema::new("GaussianFill", gaussian_fill)
            .inputs(0, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[
                arg!("mean", "float", "0", "mean of the normal distribution"),
                arg!("std", "float", "1", "standard deviation, finite and >= 0"),
                SHAPE,
                EXTRA_SHAPE,
                INPUT_AS_SHAPE,
            ])
            .infer(infer_as!(DataType::Float))
            .ignores(FILLER_IGNORED)
            .doc("Fills a float32 output with normal samples."),
        OpSchema::new("DiagonalFill", diagonal_fill)
            .inputs(0, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[
                arg!("value", "float or int", "0", "the value on the diagonal, read with the field rule of its dtype"),
                arg!("dtype", "int (TensorProto.DataType)", "FLOAT, or inferred from value's field", "output dtype (numbers and bool)"),
                SHAPE,
                EXTRA_SHAPE,
                INPUT_AS_SHAPE,
            ])
            .infer(|a, ins, _| {
                let like = ins.first().and_then(|i| i.as_ref()).map(|i| i.dtype);
                let dtype = match like {
                    Some(DataType::Double)
                        if !a.has("dtype")
                            && !a.bool("input_as_shape", false)?
                            && a.field_of("value") != Some("i") =>
                    {
                        DataType::Double
                    }
                    _ => constant_fill_dtype(a)?,
                };
                infer_fill(a, ins, dtype)
            })
            .ignores(FILLER_IGNORED)
            .doc(
                "A zero tensor of at least 2 dims (all equal when more than 2) with `value` on its main diagonal \
                 (elements whose indices are all equal). Shape rules as ConstantFill.",
            ),
        OpSchema::new("Float16ConstantFill", float16_constant_fill)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[
                arg!("value", "float", "0", "the fill value, rounded to the nearest float16"),
                SHAPE,
            ])
            .infer(infer_as!(DataType::Float16))
            .ignores(FILLER_IGNORED)
            .doc("Fills a float16 output of shape `shape` with one value."),
        OpSchema::new("Float16UniformFill", float16_uniform_fill)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[
                SHAPE,
                arg!("min", "float", "0", "lower bound (inclusive)"),
                arg!("max", "float", "1", "upper bound; must exceed min"),
            ])
            .infer(infer_as!(DataType::Float16))
            .ignores(FILLER_IGNORED)
            .doc(
                "Fills a float16 output of shape `shape` with float32 samples uniform on [min, max), each \
                 rounded to the nearest float16 (so max itself can occur).",
            ),
    ];
    v.extend(weight_filler_schemas());
    v
}

const VALUES_FLOATS: ArgDoc = arg!(
    "values",
    "list of float",
    "[]",
    "the values, flat and row-major"
);
const VALUES_INTS: ArgDoc = arg!(
    "values",
    "list of int",
    "[]",
    "the values, flat and row-major"
);
const VALUES_STRINGS: ArgDoc = arg!(
    "values",
    "list of string",
    "[]",
    "the values, flat and row-major"
);

// ------------------------------------------------------------ shape rules --

/// The fillers' output dims as shape inference sees them: the `shape`
/// argument without an input, the input's dims and `extra_shape` with one,
/// unknown when the shape is the input's contents (`input_as_shape`).
fn fill_dims(args: &Args<'_>, ins: &[Option<ShapeInfo>]) -> Result<Option<Vec<i64>>> {
    let dims = if ins.is_empty() {
        args.ints("shape")?.unwrap_or_default()
    } else if args.bool("input_as_shape", false)? {
        return Ok(None);
    } else {
        let Some(input) = &ins[0] else {
            return Ok(None);
        };
        let mut d = input.dims.clone();
        d.extend(args.ints("extra_shape")?.unwrap_or_default());
        d
    };
    if dims.iter().any(|&d| d < 0) {
        return Err(Error::invalid_arg("a negative dimension"));
    }
    Ok(Some(dims))
}

/// A filler's inference, for an output dtype that the op's arguments decide.
fn infer_fill(
    args: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    dtype: DataType,
) -> Result<Vec<Option<ShapeInfo>>> {
    Ok(vec![fill_dims(args, ins)?.map(|d| ShapeInfo::new(d, dtype))])
}

/// UniformFill's and UniformIntFill's inference: with bounds as inputs, a
/// min above max empties the output, so the shape is then unknown.
fn infer_uniform<const DTYPE: i32>(
    args: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    if ins.len() == 3 {
        return Ok(vec![None]);
    }
    let dtype = DataType::from_i32(DTYPE).unwrap_or(DataType::Undefined);
    infer_fill(args, ins, dtype)
}

/// Largest element count a filler will allocate (keeps byte counts in isize).
const MAX_NUMEL: usize = (isize::MAX as usize) / 32;

fn dims_from(ctx: &OpDefCtx<'_>, name: &str, v: &[i64]) -> Result<Vec<usize>> {
    v.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                ctx.bad_arg(format!(
                    "argument '{name}' has a negative dimension {d}: {v:?}"
                ))
            })
        })
        .collect()
}

/// Caffe2's filler shape rules, parsed once at construction.
#[derive(Clone, Debug)]
pub(super) struct FillShape {
    /// The output shape when there is no input.
    fixed: Vec<usize>,
    extra: Vec<usize>,
    input_as_shape: bool,
    from_input: bool,
}

impl FillShape {
    pub(super) fn parse(ctx: &OpDefCtx<'_>) -> Result<FillShape> {
        let args = &ctx.args;
        let from_input = ctx.num_inputs() > 0;
        let input_as_shape = args.bool("input_as_shape", false)?;
        if !from_input && args.field_of("shape") == Some("i") {
            return Err(ctx.bad_arg("the fill 'shape' argument was a scalar, a list was expected"));
        }
        let shape = args.ints("shape")?.unwrap_or_default();
        let extra = args.ints("extra_shape")?.unwrap_or_default();
        if from_input {
            if !shape.is_empty() {
                return Err(ctx.bad_arg(
                    "cannot set the shape argument and pass in an input at the same time",
                ));
            }
        } else {
            if !extra.is_empty() {
                return Err(ctx.bad_arg("cannot set extra_shape when there is no input"));
            }
            if input_as_shape {
                return Err(ctx.bad_arg("an input must be given if input_as_shape is true"));
            }
        }
        let fixed = dims_from(ctx, "shape", &shape)?;
        let extra = dims_from(ctx, "extra_shape", &extra)?;
        if !from_input {
            check_numel(&fixed).map_err(|e| ctx.bad_arg(e.into_message()))?;
        }
        Ok(FillShape {
            fixed,
            extra,
            input_as_shape,
            from_input,
        })
    }

    /// Whether the input is read as the shape (else its shape is used).
    pub(super) fn input_as_shape(&self) -> bool {
        self.input_as_shape
    }

    /// The output shape for this run.
    pub(super) fn resolve(&self, l: &Locked<'_>) -> Result<Vec<usize>> {
        if !self.from_input {
            return Ok(self.fixed.clone());
        }
        let name = l.input_name(0);
        let t = l.tensor(0)?;
        let mut shape = if self.input_as_shape {
            let a = match t {
                Tensor::I64(a) if a.ndim() == 1 && !a.is_empty() => a,
                _ => {
                    let kind = if t.dtype() == DataType::Int64 {
                        ErrorKind::Shape
                    } else {
                        ErrorKind::Type
                    };
                    return Err(Error::new(
                        kind,
                        format!(
                            "when input_as_shape is true, the input must be a non-empty 1-D int64 tensor, got {} of shape {:?}",
                            t.dtype(),
                            t.shape()
                        ),
                    )
                    .with_blob(name));
                }
            };
            a.iter()
                .map(|&d| {
                    usize::try_from(d).map_err(|_| {
                        Error::invalid_arg(format!(
                            "the shape input holds a negative dimension {d}"
                        ))
                        .with_blob(name)
                    })
                })
                .collect::<Result<Vec<usize>>>()?
        } else {
            t.shape().to_vec()
        };
        shape.extend_from_slice(&self.extra);
        check_numel(&shape).map_err(|e| e.with_blob(name))?;
        Ok(shape)
    }
}

fn check_numel(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= MAX_NUMEL)
        .ok_or_else(|| Error::shape(format!("the fill shape {shape:?} has too many elements")))
}

/// A tensor of `shape` holding `v` everywhere; a shape the system cannot
/// allocate is an `OutOfMemory` error (the net names the op and output).
fn filled<T: Element>(shape: &[usize], v: T) -> Result<Tensor> {
    filled_array(shape, v).map(T::wrap)
}

/// Each random filler owns its generator: seeded from the device option's
/// `random_seed` when set (reproducible), else from the OS.
pub(super) fn make_rng(ctx: &OpDefCtx<'_>) -> StdRng {
    match ctx.random_seed() {
        Some(s) => StdRng::seed_from_u64(u64::from(s)),
        None => StdRng::from_os_rng(),
    }
}

// ----------------------------------------------------------- ConstantFill --

/// A ConstantFill value of the op's dtype: a tensor of one element.
#[derive(Clone, Debug, PartialEq)]
struct Value(Tensor);

impl Value {
    /// Reads `value` with the field rule of `dtype` (float types need `f`,
    /// integer and bool types need `i`, strings need `s`).
    fn from_args(args: &Args<'_>, dtype: DataType) -> Result<Value> {
        let v = crate::with_match_dtype!(integers dtype,
        |T| Tensor::scalar::<T>(args.int("value", 0)?),
        else other => match other {
            DataType::Float => Tensor::scalar(args.f32("value", 0.0)?),
            DataType::Double => Tensor::scalar(f64::from(args.f32("value", 0.0)?)),
            DataType::Bool => Tensor::scalar(args.bool("value", false)?),
            DataType::String => Tensor::scalar(args.bytes_opt("value")?.unwrap_or_default()),
            other => {
                return Err(Error::invalid_arg(format!(
                    "ConstantFill does not support dtype {other}"
                )))
            }
        });
        Ok(Value(v))
    }

    /// The single element of a value tensor, which must have the same dtype.
    fn overridden_by(&self, t: &Tensor) -> Result<Value> {
        crate::with_match_dtype!(tensor numeric_and_bool &self.0,
        |_a: T| Ok(Value(Tensor::scalar(t.scalar_value::<T>()?))),
        else _strings => Err(Error::invalid_arg(
            "ConstantFill cannot take a string value from a tensor input",
        )))
    }

    /// A value of the same dtype holding its zero (`None` for strings).
    fn zero(&self) -> Option<Value> {
        crate::with_match_dtype!(tensor numeric_and_bool &self.0,
            |_a: T| Some(Value(Tensor::scalar(T::default()))),
            else _strings => None)
    }

    fn fill(self, shape: &[usize]) -> Result<Tensor> {
        crate::with_match_dtype!(tensor & self.0, |_a: T| filled(
            shape,
            self.0.scalar_value::<T>()?
        ))
    }
}

/// ConstantFill's output dtype: the `dtype` argument, else inferred from the
/// field `value` is given in, else FLOAT.
fn constant_fill_dtype(args: &Args<'_>) -> Result<DataType> {
    if !args.has("dtype") && args.has("value") {
        return match args.field_of("value") {
            Some("f") => Ok(DataType::Float),
            Some("i") => Ok(DataType::Int64),
            _ => Err(Error::invalid_arg(
                "argument 'value' is of unexpected type: without 'dtype' it must be a float (f) or an int (i); \
                 a string value needs dtype STRING",
            )),
        };
    }
    let code = args.int::<i32>("dtype", DataType::Float as i32)?;
    match DataType::from_i32(code) {
        Some(DataType::Undefined) => Err(Error::invalid_arg(
            "ConstantFill cannot have an undefined 'dtype' argument",
        )),
        Some(
            dt @ (DataType::Float
            | DataType::Double
            | DataType::Bool
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Uint8
            | DataType::Uint16
            | DataType::String),
        ) => Ok(dt),
        _ => Err(Error::invalid_arg(format!(
            "unexpected 'dtype' argument value: {code}"
        ))),
    }
}

fn constant_fill(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let shape = FillShape::parse(ctx)?;
    let dtype = constant_fill_dtype(&ctx.args).map_err(|e| e.with_op(ctx.op_type(), None))?;
    // As in Caffe2, a `value` in the wrong field for the dtype (or one that
    // does not fit it) only fails when the op runs.
    let value = Value::from_args(&ctx.args, dtype);
    // Ones (or any float value) shaped like a float64 input, with no dtype
    // asked for, are float64: the backward pass seeds a loss's gradient
    // this way (Caffe2 made them float32 whatever the input).
    let like_double = (ctx.num_inputs() > 0
        && !shape.input_as_shape()
        && !ctx.args.has("dtype")
        && ctx.args.field_of("value") != Some("i"))
    .then(|| Value::from_args(&ctx.args, DataType::Double));
    let has_value_input = ctx.num_inputs() == 2;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let out = l.output_name(0).to_string();
        let shape = shape.resolve(&l)?;
        let mut v = match &like_double {
            Some(d) if l.tensor(0)?.dtype() == DataType::Double => d.clone(),
            _ => value.clone(),
        }
        .map_err(|e| e.with_blob(&out))?;
        if has_value_input {
            let name = l.input_name(1);
            v = v
                .overridden_by(l.tensor(1)?)
                .map_err(|e| e.with_blob(name))?;
        }
        let t = v.fill(&shape).map_err(|e| e.with_blob(&out))?;
        l.set_output(0, t);
        Ok(true)
    }))
}

// ------------------------------------------------------ GivenTensor*Fill --

/// A repeated int argument converted losslessly to `T`.
fn ints_as<T: TryFrom<i64>>(ctx: &OpDefCtx<'_>, name: &str) -> Result<Vec<T>> {
    ctx.args
        .ints(name)?
        .unwrap_or_default()
        .into_iter()
        .map(|v| {
            T::try_from(v).map_err(|_| {
                ctx.bad_arg(format!(
                    "argument '{name}' holds {v}, which does not fit its type {}",
                    std::any::type_name::<T>()
                ))
            })
        })
        .collect()
}

fn flat<T: Element>(v: Vec<T>) -> Tensor {
    T::wrap(ArrayD::from_shape_vec(IxDyn(&[v.len()]), v).expect("a 1-D shape fits its own length"))
}

/// The `values` argument read as `dtype`, as a 1-D tensor.
fn given_values(ctx: &OpDefCtx<'_>, dtype: DataType) -> Result<Tensor> {
    let args = &ctx.args;
    Ok(match dtype {
        DataType::Float => flat(args.floats("values")?.unwrap_or_default()),
        DataType::Double => flat(
            args.floats("values")?
                .unwrap_or_default()
                .into_iter()
                .map(f64::from)
                .collect(),
        ),
        DataType::Bool => flat(
            args.ints("values")?
                .unwrap_or_default()
                .into_iter()
                .map(|v| v != 0)
                .collect(),
        ),
        DataType::Int16 => flat(ints_as::<i16>(ctx, "values")?),
        DataType::Uint16 => flat(ints_as::<u16>(ctx, "values")?),
        DataType::Int32 => flat(ints_as::<i32>(ctx, "values")?),
        DataType::Int64 => flat(ints_as::<i64>(ctx, "values")?),
        DataType::String => flat(args.strings("values")?.unwrap_or_default()),
        DataType::Undefined => {
            return Err(ctx.bad_arg("GivenTensorFill cannot have an undefined 'dtype' argument"))
        }
        other => {
            return Err(ctx.bad_arg(format!(
                "unexpected 'dtype' argument value: {} ({other})",
                other as i32
            )))
        }
    })
}

/// GivenTensorFill's optional `dtype`: an int enum or a name such as "INT64".
fn given_fill_dtype(args: &Args<'_>) -> Result<DataType> {
    match args.field_of("dtype") {
        None if !args.has("dtype") => Ok(DataType::Float),
        Some("s") => {
            let name = args.string("dtype", "FLOAT")?;
            DataType::from_name(&name).ok_or_else(|| {
                Error::invalid_arg(format!("unknown 'dtype' argument value: '{name}'"))
            })
        }
        _ => {
            let code = args.int::<i32>("dtype", DataType::Float as i32)?;
            DataType::from_i32(code).ok_or_else(|| {
                Error::invalid_arg(format!("unexpected 'dtype' argument value: {code}"))
            })
        }
    }
}

fn given_tensor_fill(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let shape = FillShape::parse(ctx)?;
    let dtype = match ctx.op_type() {
        "GivenTensorFill" => {
            given_fill_dtype(&ctx.args).map_err(|e| e.with_op(ctx.op_type(), None))?
        }
        "GivenTensorDoubleFill" => DataType::Double,
        "GivenTensorInt16Fill" => DataType::Int16,
        "GivenTensorIntFill" => DataType::Int32,
        "GivenTensorInt64Fill" => DataType::Int64,
        "GivenTensorBoolFill" => DataType::Bool,
        "GivenTensorStringFill" => DataType::String,
        other => {
            return Err(ctx.bad_arg(format!("given_tensor_fill cannot build op type '{other}'")))
        }
    };
    let values = given_values(ctx, dtype)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let out = l.output_name(0).to_string();
        let shape = shape.resolve(&l)?;
        let n: usize = shape.iter().product();
        if n != values.numel() {
            return Err(Error::shape(format!(
                "the output shape {shape:?} holds {n} elements but {} values were given",
                values.numel()
            ))
            .with_blob(&out));
        }
        let t = crate::with_array!(&values, a => Tensor::from(
            copy_array(a.view())
                .map_err(|e| e.with_blob(&out))?
                .into_shape_with_order(IxDyn(&shape))
                .map_err(|e| Error::shape(e.to_string()).with_blob(&out))?
        ));
        l.set_output(0, t);
        Ok(true)
    }))
}

// ------------------------------------------------------- random fillers --

/// A bound of UniformFill (float32) or UniformIntFill (int32), read with
/// its type's field rule (f for float, i for int).
fn bound_arg<T: Number>(args: &Args<'_>, name: &str, default: T) -> Result<T> {
    Ok(if T::INT {
        T::of(f64::from(args.int(name, default.to_i32())?))
    } else {
        T::of(f64::from(args.f32(name, default.to_f32())?))
    })
}

/// Samples between `min` and `max` (`min <= max`, both finite), endlessly:
/// integers on [min, max], both ends included; floats on [min, max)
/// (`min == max` gives min).
fn uniform_samples<T: Number + SampleUniform>(
    rng: &mut StdRng,
    min: T,
    max: T,
) -> impl Iterator<Item = T> + '_ {
    let d = if T::INT {
        Uniform::new_inclusive(min, max).ok()
    } else {
        Uniform::new(min, max).ok()
    };
    // Rounding can (rarely) produce a float `max`; draw again so the bound
    // stays open.
    std::iter::repeat_with(move || match &d {
        None => min,
        Some(d) => loop {
            let v = d.sample(rng);
            if T::INT || v < max {
                break v;
            }
        },
    })
}

fn uniform_fill<T: Number + SampleUniform>(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ni = ctx.num_inputs();
    if ni == 2 {
        return Err(ctx.bad_arg(format!(
            "operator def did not pass schema checking: {} takes 0, 1 or 3 inputs, got 2",
            ctx.op_type()
        )));
    }
    let shape = FillShape::parse(ctx)?;
    let min = bound_arg(&ctx.args, "min", T::ZERO)?;
    let max = bound_arg(&ctx.args, "max", T::ONE)?;
    let from_inputs = ni == 3;
    if from_inputs {
        if ctx.args.has("min") {
            return Err(ctx.bad_arg("cannot set both the min argument and the min input blob"));
        }
        if ctx.args.has("max") {
            return Err(ctx.bad_arg("cannot set both the max argument and the max input blob"));
        }
    } else {
        if !(min.to_f64().is_finite() && max.to_f64().is_finite()) {
            return Err(ctx.bad_arg(format!("min ({min}) and max ({max}) must be finite")));
        }
        if min.partial_cmp(&max) != Some(std::cmp::Ordering::Less) {
            return Err(ctx.bad_arg(format!(
                "max value should be bigger than min value: min {min}, max {max}"
            )));
        }
    }
    let mut rng = make_rng(ctx);
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let mut shape = shape.resolve(&l)?;
        let (mut lo, mut hi) = (min, max);
        if from_inputs {
            let bound = |i: usize| -> Result<T> {
                let name = l.input_name(i);
                let v = l
                    .tensor(i)?
                    .scalar_value::<T>()
                    .map_err(|e| e.with_blob(name))?;
                if !v.to_f64().is_finite() {
                    return Err(
                        Error::invalid_arg(format!("the bound {v} is not finite")).with_blob(name)
                    );
                }
                Ok(v)
            };
            lo = bound(1)?;
            hi = bound(2)?;
            if lo > hi {
                // An empty range gives an output whose first dim is 0.
                let Some(d0) = shape.first_mut() else {
                    return Err(Error::shape(format!(
                        "min ({lo}) is above max ({hi}), so the first dim would be set to 0, but the output is 0-dim"
                    ))
                    .with_blob(l.input_name(0)));
                };
                *d0 = 0;
                l.set_output(0, filled(&shape, T::default())?);
                return Ok(true);
            }
        }
        let out = l.output_name(0);
        let a = collect_array(&shape, uniform_samples(&mut rng, lo, hi))
            .map_err(|e| e.with_blob(out))?;
        l.set_output(0, T::wrap(a));
        Ok(true)
    }))
}

// ----------------------------------------------------------- DiagonalFill --

fn diagonal_fill(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let shape = FillShape::parse(ctx)?;
    let dtype = constant_fill_dtype(&ctx.args).map_err(|e| e.with_op(ctx.op_type(), None))?;
    if dtype == DataType::String {
        return Err(ctx.bad_arg("DiagonalFill fills numbers and bool, not strings"));
    }
    let value = Value::from_args(&ctx.args, dtype);
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let out = l.output_name(0).to_string();
        let shape = shape.resolve(&l)?;
        if shape.len() < 2 || (shape.len() > 2 && shape.iter().any(|&d| d != shape[0])) {
            return Err(Error::shape(format!(
                "DiagonalFill needs at least 2 dims, all equal when more than 2; got {shape:?}"
            ))
            .with_blob(&out));
        }
        // Element k of the diagonal is at k * step in row-major order.
        let n = *shape.iter().min().expect("two dims at least");
        let step = if shape.len() == 2 {
            shape[1] + 1
        } else {
            (0..shape.len()).fold(0usize, |acc, _| acc * shape[0] + 1)
        };
        let v = value.clone().map_err(|e| e.with_blob(&out))?;
        let Some(zero) = v.zero() else {
            return Err(Error::type_error("DiagonalFill cannot fill strings").with_blob(&out));
        };
        let mut t = zero.fill(&shape).map_err(|e| e.with_blob(&out))?;
        let diag = v.fill(&[n]).map_err(|e| e.with_blob(&out))?;
        fn put<T: Element>(t: &mut Tensor, diag: &Tensor, step: usize) -> Result<()> {
            let d = diag.array::<T>()?;
            let a = t.array_mut::<T>()?;
            let flat = a
                .as_slice_mut()
                .ok_or_else(|| Error::internal("a fresh tensor is contiguous"))?;
            for (k, x) in d.iter().enumerate() {
                flat[k * step] = x.clone();
            }
            Ok(())
        }
        by_dtype!(t.dtype(), put(&mut t, &diag, step)).map_err(|e| e.with_blob(&out))?;
        l.set_output(0, t);
        Ok(true)
    }))
}

// -------------------------------------------------------- float16 fills --

/// The `shape` argument of a filler that takes no input (a missing or empty
/// list is a 0-dim scalar).
fn shape_only(ctx: &OpDefCtx<'_>) -> Result<Vec<usize>> {
    if ctx.args.field_of("shape") == Some("i") {
        return Err(ctx.bad_arg("the fill 'shape' argument was a scalar, a list was expected"));
    }
    let shape = dims_from(ctx, "shape", &ctx.args.ints("shape")?.unwrap_or_default())?;
    check_numel(&shape).map_err(|e| ctx.bad_arg(e.into_message()))?;
    Ok(shape)
}

fn float16_constant_fill(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let shape = shape_only(ctx)?;
    let v = f16::from_f32(ctx.args.f32("value", 0.0)?);
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let out = l.output_name(0);
        let t = filled(&shape, v).map_err(|e| e.with_blob(out))?;
        l.set_output(0, t);
        Ok(true)
    }))
}

fn float16_uniform_fill(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let shape = shape_only(ctx)?;
    let min = ctx.args.f32("min", 0.0)?;
    let max = ctx.args.f32("max", 1.0)?;
    if !(min.is_finite() && max.is_finite()) {
        return Err(ctx.bad_arg(format!("min ({min}) and max ({max}) must be finite")));
    }
    if min >= max {
        return Err(ctx.bad_arg(format!(
            "max value should be bigger than min value: min {min}, max {max}"
        )));
    }
    let mut rng = make_rng(ctx);
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let out = l.output_name(0);
        let samples = uniform_samples(&mut rng, min, max).map(f16::from_f32);
        let a = collect_array(&shape, samples).map_err(|e| e.with_blob(out))?;
        l.set_output(0, Tensor::from(a));
        Ok(true)
    }))
}

fn gaussian_fill(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let shape = FillShape::parse(ctx)?;
    let mean = ctx.args.f32("mean", 0.0)?;
    let std = ctx.args.f32("std", 1.0)?;
    if !mean.is_finite() {
        return Err(ctx.bad_arg(format!("mean must be finite, got {mean}")));
    }
    if !(std.is_finite() && std >= 0.0) {
        return Err(ctx.bad_arg(format!(
            "the standard deviation must be finite and >= 0, got {std}"
        )));
    }
    let normal = Normal::new(mean, std).map_err(|e| ctx.bad_arg(e.to_string()))?;
    let mut rng = make_rng(ctx);
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let shape = shape.resolve(&l)?;
        let out = l.output_name(0);
        let samples = std::iter::repeat_with(|| normal.sample(&mut rng));
        let a = collect_array(&shape, samples).map_err(|e| e.with_blob(out))?;
        l.set_output(0, Tensor::from(a));
        Ok(true)
    }))
}

// ------------------------------------------------------- weight fillers --

/// XavierFill and MSRAFill (issue 14): float32 weights scaled by their fan.
fn weight_filler_schemas() -> Vec<OpSchema> {
    const FILL_ARGS: &[ArgDoc] = &[SHAPE, EXTRA_SHAPE, INPUT_AS_SHAPE];
    let filler = |name: &'static str, build: crate::operator::BuildFn, doc: &'static str| {
        OpSchema::new(name, build)
            .inputs(0, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(FILL_ARGS)
            .ignores(FILLER_IGNORED)
            .doc(doc)
    };
    vec![
        filler(
            "XavierFill",
            build_xavier,
            "Fills a float32 output with samples uniform on [-s, s], s = sqrt(3 / fan_in), fan_in = size / dim 0.",
        ),
        filler(
            "MSRAFill",
            build_msra,
            "Fills a float32 output with normal samples of mean 0 and std sqrt(2 / fan_out), fan_out = size / dim 1.",
        ),
    ]
}

/// Product of the dims after `skip` (the fan) for a filler of `shape`.
fn fan(op: &str, shape: &[usize], dim: usize, blob: &str) -> Result<usize> {
    if shape.len() <= dim || shape[dim] == 0 {
        return Err(Error::shape(format!(
            "{op}: the output shape {shape:?} needs a non-zero dim {dim} to compute its fan"
        ))
        .with_blob(blob));
    }
    Ok(shape.iter().product::<usize>() / shape[dim])
}

fn build_xavier(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let shape = FillShape::parse(ctx)?;
    let mut rng = make_rng(ctx);
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let shape = shape.resolve(&l)?;
        let out = l.output_name(0).to_string();
        let fan_in = fan("XavierFill", &shape, 0, &out)?;
        let s = (3.0f32 / fan_in as f32).sqrt();
        let d = Uniform::new_inclusive(-s, s).map_err(|e| Error::internal(e.to_string()))?;
        let a = collect_array(&shape, std::iter::repeat_with(|| d.sample(&mut rng)))
            .map_err(|e| e.with_blob(&out))?;
        l.set_output(0, Tensor::from(a));
        Ok(true)
    }))
}

fn build_msra(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let shape = FillShape::parse(ctx)?;
    let mut rng = make_rng(ctx);
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let shape = shape.resolve(&l)?;
        let out = l.output_name(0).to_string();
        let fan_out = fan("MSRAFill", &shape, 1, &out)?;
        let std = (2.0f32 / fan_out as f32).sqrt();
        let d = Normal::new(0.0f32, std).map_err(|e| Error::internal(e.to_string()))?;
        let a = collect_array(&shape, std::iter::repeat_with(|| d.sample(&mut rng)))
            .map_err(|e| e.with_blob(&out))?;
        l.set_output(0, Tensor::from(a));
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use crate::cancel::CancelToken;
    use crate::error::{Error, ErrorKind, Result};
    use crate::ir::{Argument, NetDef, OperatorDef};
    use crate::operator::create_operator;
    use crate::tensor::Tensor;
    use crate::test_util::{
        feed, float_arg, floats_arg, get as out, int_arg, ints_arg, named, op, run, seeded,
        string_arg, strings_arg, tensor,
    };
    use crate::workspace::Workspace;
    use ndarray::{ArrayD, IxDyn};

    /// Runs one op in a fresh workspace holding `inputs`; returns its output 0.
    fn fill(d: OperatorDef, inputs: &[(&str, Tensor)]) -> Result<Tensor> {
        let ws = Workspace::new();
        for (n, v) in inputs {
            feed(&ws, n, v.clone());
        }
        run(&ws, &d)?;
        Ok(out(&ws, &d.output[0]))
    }
    /// A construction error: building the op alone must fail.
    fn build_err(d: OperatorDef, inputs: &[&str]) -> Error {
        let ws = Workspace::new();
        for n in inputs {
            feed(&ws, n, Tensor::scalar(1.0f32));
        }
        match create_operator(&d, &ws) {
            Ok(_) => panic!("building {} should fail", d.op_type()),
            Err(e) => e,
        }
    }
    /// A run-time error: the op builds but fails when it runs.
    fn run_err(d: OperatorDef, inputs: &[(&str, Tensor)]) -> Error {
        let ws = Workspace::new();
        for (n, v) in inputs {
            feed(&ws, n, v.clone());
        }
        assert!(
            create_operator(&d, &ws).is_ok(),
            "building {} should succeed",
            d.op_type()
        );
        run(&ws, &d).unwrap_err()
    }
    fn assert_bad_arg(e: &Error, needle: &str) {
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(
            e.message.contains(needle),
            "'{}' does not contain '{needle}'",
            e.message
        );
    }

    // ------------------------------------------------------ ConstantFill --

    #[test]
    fn constant_fill_defaults_to_a_float_zero_scalar() {
        let r = fill(op("ConstantFill", &[], &["y"], vec![]), &[]).unwrap();
        assert_eq!(r, Tensor::scalar(0.0f32));
        let r = fill(op("ConstantFill", &[], &["y"], vec![named("shape")]), &[]).unwrap();
        assert_eq!(r, Tensor::scalar(0.0f32));
    }

    #[test]
    fn constant_fill_infers_dtype_from_the_value_field() {
        let r = fill(
            op(
                "ConstantFill",
                &[],
                &["y"],
                vec![ints_arg("shape", &[2, 3]), float_arg("value", 1.5)],
            ),
            &[],
        )
        .unwrap();
        assert_eq!(r, tensor(&[2, 3], vec![1.5f32; 6]));
        let r = fill(
            op(
                "ConstantFill",
                &[],
                &["y"],
                vec![ints_arg("shape", &[2]), int_arg("value", 7)],
            ),
            &[],
        )
        .unwrap();
        assert_eq!(r, tensor(&[2], vec![7i64, 7]));
    }

    #[test]
    fn constant_fill_every_dtype() {
        let c = |dtype: i64, value: Argument| {
            fill(
                op(
                    "ConstantFill",
                    &[],
                    &["y"],
                    vec![ints_arg("shape", &[2]), int_arg("dtype", dtype), value],
                ),
                &[],
            )
            .unwrap()
        };
        assert_eq!(
            c(1, float_arg("value", 2.5)),
            tensor(&[2], vec![2.5f32, 2.5])
        );
        assert_eq!(
            c(13, float_arg("value", 2.5)),
            tensor(&[2], vec![2.5f64, 2.5])
        );
        assert_eq!(c(5, int_arg("value", 1)), tensor(&[2], vec![true, true]));
        assert_eq!(c(7, int_arg("value", -3)), tensor(&[2], vec![-3i8, -3]));
        assert_eq!(
            c(9, int_arg("value", -300)),
            tensor(&[2], vec![-300i16, -300])
        );
        assert_eq!(
            c(2, int_arg("value", 70000)),
            tensor(&[2], vec![70000i32, 70000])
        );
        assert_eq!(
            c(10, int_arg("value", 1 << 40)),
            tensor(&[2], vec![1i64 << 40, 1 << 40])
        );
        assert_eq!(c(6, int_arg("value", 200)), tensor(&[2], vec![200u8, 200]));
        assert_eq!(
            c(8, int_arg("value", 60000)),
            tensor(&[2], vec![60000u16, 60000])
        );
        assert_eq!(
            c(4, string_arg("value", "ab")),
            tensor(&[2], vec![b"ab".to_vec(), b"ab".to_vec()])
        );
        // Defaults when `value` is absent: 0, false, "".
        let r = fill(
            op("ConstantFill", &[], &["y"], vec![int_arg("dtype", 5)]),
            &[],
        )
        .unwrap();
        assert_eq!(r, Tensor::scalar(false));
        let r = fill(
            op("ConstantFill", &[], &["y"], vec![int_arg("dtype", 4)]),
            &[],
        )
        .unwrap();
        assert_eq!(r, Tensor::scalar(Vec::<u8>::new()));
        // A zero dim gives an empty tensor.
        let r = fill(
            op(
                "ConstantFill",
                &[],
                &["y"],
                vec![ints_arg("shape", &[3, 0]), int_arg("value", 1)],
            ),
            &[],
        )
        .unwrap();
        assert_eq!(r, Tensor::from(ArrayD::<i64>::zeros(IxDyn(&[3, 0]))));
    }

    #[test]
    fn constant_fill_construction_errors() {
        let cf = |args: Vec<Argument>| build_err(op("ConstantFill", &[], &["y"], args), &[]);
        assert_bad_arg(
            &cf(vec![string_arg("value", "x")]),
            "argument 'value' is of unexpected type",
        );
        assert_bad_arg(&cf(vec![int_arg("dtype", 0)]), "undefined 'dtype'");
        assert_bad_arg(
            &cf(vec![int_arg("dtype", 12)]),
            "unexpected 'dtype' argument value: 12",
        );
        assert_bad_arg(
            &cf(vec![int_arg("dtype", 3)]),
            "unexpected 'dtype' argument value: 3",
        );
        assert_bad_arg(
            &cf(vec![int_arg("dtype", 99)]),
            "unexpected 'dtype' argument value: 99",
        );
        assert_bad_arg(&cf(vec![float_arg("dtype", 1.0)]), "expected field i");
        assert_bad_arg(&cf(vec![int_arg("dtype", 1 << 40)]), "does not fit");
        assert_bad_arg(
            &cf(vec![int_arg("shape", 3)]),
            "was a scalar, a list was expected",
        );
        assert_bad_arg(
            &cf(vec![ints_arg("shape", &[2, -1])]),
            "negative dimension -1",
        );
        assert_bad_arg(
            &cf(vec![ints_arg("extra_shape", &[2])]),
            "cannot set extra_shape when there is no input",
        );
        assert_bad_arg(
            &cf(vec![int_arg("input_as_shape", 1)]),
            "an input must be given if input_as_shape is true",
        );
        assert_bad_arg(
            &cf(vec![float_arg("input_as_shape", 1.0)]),
            "expected field i",
        );
        assert_bad_arg(
            &cf(vec![ints_arg("shape", &[1 << 40, 1 << 40])]),
            "too many elements",
        );
        let e = build_err(
            op(
                "ConstantFill",
                &["x"],
                &["y"],
                vec![ints_arg("shape", &[2])],
            ),
            &["x"],
        );
        assert_bad_arg(
            &e,
            "cannot set the shape argument and pass in an input at the same time",
        );
        let e = build_err(
            op(
                "ConstantFill",
                &["x"],
                &["y"],
                vec![ints_arg("extra_shape", &[-2])],
            ),
            &["x"],
        );
        assert_bad_arg(&e, "negative dimension -2");
        // The op is named in construction errors.
        assert_eq!(
            cf(vec![int_arg("dtype", 0)]).context.op_type.as_deref(),
            Some("ConstantFill")
        );
        // Three inputs is a schema error.
        let e = build_err(
            op("ConstantFill", &["a", "b", "c"], &["y"], vec![]),
            &["a", "b", "c"],
        );
        assert!(e.message.contains("takes 0 to 2 inputs"), "{e}");
    }

    #[test]
    fn constant_fill_takes_its_shape_from_the_input() {
        let x = tensor(&[2, 3], vec![0.0f32; 6]);
        let r = fill(
            op("ConstantFill", &["x"], &["y"], vec![int_arg("value", 2)]),
            &[("x", x.clone())],
        )
        .unwrap();
        assert_eq!(r, tensor(&[2, 3], vec![2i64; 6]));
        let d = op(
            "ConstantFill",
            &["x"],
            &["y"],
            vec![ints_arg("extra_shape", &[4]), float_arg("value", 1.0)],
        );
        assert_eq!(
            fill(d, &[("x", x.clone())]).unwrap(),
            tensor(&[2, 3, 4], vec![1.0f32; 24])
        );
        // An empty `shape` list is allowed with an input.
        let d = op("ConstantFill", &["x"], &["y"], vec![named("shape")]);
        assert_eq!(
            fill(d, &[("x", x)]).unwrap(),
            tensor(&[2, 3], vec![0.0f32; 6])
        );
        // A non-tensor input is a type error naming it.
        let ws = Workspace::new();
        ws.create_blob("e");
        let e = run(&ws, &op("ConstantFill", &["e"], &["y"], vec![])).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Type, Some("e"))
        );
    }

    #[test]
    fn constant_fill_input_as_shape() {
        let d = || {
            op(
                "ConstantFill",
                &["s"],
                &["y"],
                vec![int_arg("input_as_shape", 1), ints_arg("extra_shape", &[1])],
            )
        };
        let r = fill(d(), &[("s", tensor(&[2], vec![2i64, 3]))]).unwrap();
        assert_eq!(r, tensor(&[2, 3, 1], vec![0.0f32; 6]));
        let e = run_err(d(), &[("s", tensor(&[2], vec![2i32, 3]))]);
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Type, Some("s"))
        );
        assert!(e.message.contains("1-D int64"), "{e}");
        let e = run_err(d(), &[("s", tensor(&[1, 2], vec![2i64, 3]))]);
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("s"))
        );
        let e = run_err(d(), &[("s", tensor(&[0], Vec::<i64>::new()))]);
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("s"))
        );
        let e = run_err(d(), &[("s", tensor(&[2], vec![2i64, -3]))]);
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::InvalidArgument, Some("s"))
        );
        let e = run_err(d(), &[("s", tensor(&[2], vec![1i64 << 40, 1 << 40]))]);
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("s"))
        );
    }

    #[test]
    fn constant_fill_in_place() {
        let ws = Workspace::new();
        feed(&ws, "x", tensor(&[2], vec![5i32, 6]));
        run(
            &ws,
            &op(
                "ConstantFill",
                &["x"],
                &["x"],
                vec![float_arg("value", 0.5)],
            ),
        )
        .unwrap();
        assert_eq!(out(&ws, "x"), tensor(&[2], vec![0.5f32, 0.5]));
    }

    #[test]
    fn constant_fill_second_input_overrides_value() {
        let x = tensor(&[3], vec![0i32; 3]);
        let d = |dtype: i64| {
            op(
                "ConstantFill",
                &["x", "v"],
                &["y"],
                vec![int_arg("dtype", dtype), int_arg("value", 1)],
            )
        };
        let r = fill(d(2), &[("x", x.clone()), ("v", Tensor::scalar(9i32))]).unwrap();
        assert_eq!(r, tensor(&[3], vec![9i32; 3]));
        let r = fill(
            d(2),
            &[("x", x.clone()), ("v", tensor(&[1, 1], vec![4i32]))],
        )
        .unwrap();
        assert_eq!(r, tensor(&[3], vec![4i32; 3]));
        let e = run_err(d(2), &[("x", x.clone()), ("v", Tensor::scalar(9i64))]);
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Type, Some("v"))
        );
        let e = run_err(
            d(2),
            &[("x", x.clone()), ("v", tensor(&[2], vec![1i32, 2]))],
        );
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("v"))
        );
        let d = op(
            "ConstantFill",
            &["x", "v"],
            &["y"],
            vec![int_arg("dtype", 4)],
        );
        let e = run_err(d, &[("x", x), ("v", Tensor::scalar(b"s".to_vec()))]);
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::InvalidArgument, Some("v"))
        );
        assert!(e.message.contains("string"), "{e}");
    }

    #[test]
    fn constant_fill_value_field_errors_surface_at_run_time() {
        // As in Caffe2: the dtype is valid, so the op builds; reading `value` fails.
        let cases = [
            (
                int_arg("dtype", 2),
                float_arg("value", 1.0),
                "expected field i, got field f",
            ),
            (
                int_arg("dtype", 13),
                int_arg("value", 1),
                "expected field f, got field i",
            ),
            (int_arg("dtype", 7), int_arg("value", 300), "does not fit"),
            (int_arg("dtype", 4), int_arg("value", 3), "expected field s"),
        ];
        for (dtype, value, want) in cases {
            let e = run_err(op("ConstantFill", &[], &["y"], vec![dtype, value]), &[]);
            assert_eq!(
                (e.kind, e.context.blob.as_deref()),
                (ErrorKind::InvalidArgument, Some("y"))
            );
            assert!(e.message.contains(want), "{e}");
        }
    }

    // --------------------------------------------------- GivenTensor*Fill --

    #[test]
    fn given_tensor_fill_float() {
        let d = op(
            "GivenTensorFill",
            &[],
            &["y"],
            vec![
                ints_arg("shape", &[2, 2]),
                floats_arg("values", &[1.0, 2.0, 3.0, 4.5]),
            ],
        );
        assert_eq!(
            fill(d, &[]).unwrap(),
            tensor(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.5])
        );
        // `shape` missing: a 0-dim scalar.
        let d = op(
            "GivenTensorFill",
            &[],
            &["y"],
            vec![floats_arg("values", &[7.0])],
        );
        assert_eq!(fill(d, &[]).unwrap(), Tensor::scalar(7.0f32));
        // No values and a zero dim: an empty tensor.
        let d = op(
            "GivenTensorFill",
            &[],
            &["y"],
            vec![ints_arg("shape", &[0])],
        );
        assert_eq!(fill(d, &[]).unwrap(), tensor(&[0], Vec::<f32>::new()));
    }

    #[test]
    fn net_const_emits_an_empty_shape_list() {
        // Python's Net.Const(5): GivenTensorInt64Fill, shape=[] (no field set), values=[5].
        let d = op(
            "GivenTensorInt64Fill",
            &[],
            &["c"],
            vec![named("shape"), ints_arg("values", &[5])],
        );
        assert_eq!(fill(d, &[]).unwrap(), Tensor::scalar(5i64));
    }

    #[test]
    fn given_tensor_fill_variants() {
        let g = |ty: &str, values: Argument| {
            fill(
                op(ty, &[], &["y"], vec![ints_arg("shape", &[2]), values]),
                &[],
            )
            .unwrap()
        };
        assert_eq!(
            g("GivenTensorDoubleFill", floats_arg("values", &[0.5, -1.0])),
            tensor(&[2], vec![0.5f64, -1.0])
        );
        assert_eq!(
            g("GivenTensorInt16Fill", ints_arg("values", &[-7, 300])),
            tensor(&[2], vec![-7i16, 300])
        );
        assert_eq!(
            g("GivenTensorIntFill", ints_arg("values", &[1, -2])),
            tensor(&[2], vec![1i32, -2])
        );
        assert_eq!(
            g("GivenTensorInt64Fill", ints_arg("values", &[1 << 40, 3])),
            tensor(&[2], vec![1i64 << 40, 3])
        );
        assert_eq!(
            g("GivenTensorBoolFill", ints_arg("values", &[0, 2])),
            tensor(&[2], vec![false, true])
        );
        assert_eq!(
            g("GivenTensorStringFill", strings_arg("values", &["a", "bc"])),
            tensor(&[2], vec![b"a".to_vec(), b"bc".to_vec()])
        );
        // The typed variants ignore `dtype`.
        let d = op(
            "GivenTensorIntFill",
            &[],
            &["y"],
            vec![
                ints_arg("shape", &[1]),
                ints_arg("values", &[3]),
                int_arg("dtype", 1),
            ],
        );
        assert_eq!(fill(d, &[]).unwrap(), tensor(&[1], vec![3i32]));
    }

    #[test]
    fn given_tensor_fill_dtype_retypes_values() {
        let g = |dtype: Argument, values: Argument| {
            fill(
                op(
                    "GivenTensorFill",
                    &[],
                    &["y"],
                    vec![ints_arg("shape", &[2]), dtype, values],
                ),
                &[],
            )
            .unwrap()
        };
        assert_eq!(
            g(int_arg("dtype", 10), ints_arg("values", &[4, 5])),
            tensor(&[2], vec![4i64, 5])
        );
        assert_eq!(
            g(string_arg("dtype", "INT64"), ints_arg("values", &[4, 5])),
            tensor(&[2], vec![4i64, 5])
        );
        assert_eq!(
            g(string_arg("dtype", "int32"), ints_arg("values", &[4, 5])),
            tensor(&[2], vec![4i32, 5])
        );
        assert_eq!(
            g(string_arg("dtype", "INT16"), ints_arg("values", &[4, 5])),
            tensor(&[2], vec![4i16, 5])
        );
        assert_eq!(
            g(string_arg("dtype", "UINT16"), ints_arg("values", &[4, 5])),
            tensor(&[2], vec![4u16, 5])
        );
        assert_eq!(
            g(string_arg("dtype", "BOOL"), ints_arg("values", &[0, 1])),
            tensor(&[2], vec![false, true])
        );
        assert_eq!(
            g(int_arg("dtype", 13), floats_arg("values", &[0.25, 2.0])),
            tensor(&[2], vec![0.25f64, 2.0])
        );
        assert_eq!(
            g(
                string_arg("dtype", "FLOAT"),
                floats_arg("values", &[0.25, 2.0])
            ),
            tensor(&[2], vec![0.25f32, 2.0])
        );
        assert_eq!(
            g(
                string_arg("dtype", "STRING"),
                strings_arg("values", &["x", "y"])
            ),
            tensor(&[2], vec![b"x".to_vec(), b"y".to_vec()])
        );
    }

    #[test]
    fn given_tensor_fill_construction_errors() {
        let g = |ty: &str, args: Vec<Argument>| build_err(op(ty, &[], &["y"], args), &[]);
        assert_bad_arg(
            &g("GivenTensorFill", vec![string_arg("dtype", "FOO")]),
            "unknown 'dtype' argument value: 'FOO'",
        );
        assert_bad_arg(
            &g("GivenTensorFill", vec![int_arg("dtype", 0)]),
            "undefined 'dtype'",
        );
        assert_bad_arg(
            &g("GivenTensorFill", vec![int_arg("dtype", 7)]),
            "unexpected 'dtype' argument value: 7",
        );
        assert_bad_arg(
            &g("GivenTensorFill", vec![int_arg("dtype", 77)]),
            "unexpected 'dtype' argument value: 77",
        );
        assert_bad_arg(
            &g("GivenTensorFill", vec![float_arg("dtype", 1.0)]),
            "expected field i",
        );
        assert_bad_arg(
            &g("GivenTensorFill", vec![ints_arg("values", &[1])]),
            "expected field floats",
        );
        assert_bad_arg(
            &g("GivenTensorIntFill", vec![floats_arg("values", &[1.0])]),
            "expected field ints",
        );
        assert_bad_arg(
            &g("GivenTensorStringFill", vec![ints_arg("values", &[1])]),
            "expected field strings",
        );
        assert_bad_arg(
            &g("GivenTensorInt16Fill", vec![ints_arg("values", &[40000])]),
            "40000, which does not fit",
        );
        assert_bad_arg(
            &g("GivenTensorIntFill", vec![ints_arg("values", &[1 << 40])]),
            "does not fit",
        );
        assert_bad_arg(
            &g(
                "GivenTensorFill",
                vec![string_arg("dtype", "UINT16"), ints_arg("values", &[-1])],
            ),
            "does not fit",
        );
        // The shared filler rules.
        assert_bad_arg(
            &g("GivenTensorInt64Fill", vec![int_arg("shape", 1)]),
            "list was expected",
        );
        assert_bad_arg(
            &g("GivenTensorBoolFill", vec![ints_arg("extra_shape", &[1])]),
            "no input",
        );
        assert_bad_arg(
            &g("GivenTensorDoubleFill", vec![int_arg("input_as_shape", 1)]),
            "input_as_shape",
        );
        let e = build_err(
            op(
                "GivenTensorFill",
                &["x"],
                &["y"],
                vec![ints_arg("shape", &[1])],
            ),
            &["x"],
        );
        assert_bad_arg(&e, "at the same time");
    }

    #[test]
    fn given_tensor_fill_count_mismatch_fails_at_run_time() {
        let d = op(
            "GivenTensorFill",
            &[],
            &["y"],
            vec![
                ints_arg("shape", &[2, 2]),
                floats_arg("values", &[1.0, 2.0, 3.0]),
            ],
        );
        let e = run_err(d, &[]);
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("y"))
        );
        assert!(e.message.contains("holds 4 elements but 3 values"), "{e}");
        // A scalar needs exactly one value.
        let e = run_err(op("GivenTensorInt64Fill", &[], &["y"], vec![]), &[]);
        assert_eq!(e.kind, ErrorKind::Shape);
    }

    #[test]
    fn given_tensor_fill_with_an_input() {
        let x = tensor(&[2, 3], vec![0u8; 6]);
        let d = op(
            "GivenTensorIntFill",
            &["x"],
            &["x"],
            vec![ints_arg("values", &[1, 2, 3, 4, 5, 6])],
        );
        assert_eq!(
            fill(d, &[("x", x.clone())]).unwrap(),
            tensor(&[2, 3], vec![1i32, 2, 3, 4, 5, 6])
        );
        let d = op(
            "GivenTensorFill",
            &["s"],
            &["y"],
            vec![
                int_arg("input_as_shape", 1),
                floats_arg("values", &[1.0, 2.0]),
            ],
        );
        assert_eq!(
            fill(d, &[("s", tensor(&[2], vec![1i64, 2]))]).unwrap(),
            tensor(&[1, 2], vec![1.0f32, 2.0])
        );
    }

    // ------------------------------------------------------ random fills --

    fn floats(t: &Tensor) -> Vec<f32> {
        t.array::<f32>().unwrap().iter().copied().collect()
    }

    #[test]
    fn uniform_fill_is_seeded_and_in_range() {
        let d = || {
            seeded(
                op(
                    "UniformFill",
                    &[],
                    &["y"],
                    vec![
                        ints_arg("shape", &[10, 10]),
                        float_arg("min", -2.0),
                        float_arg("max", 3.0),
                    ],
                ),
                7,
            )
        };
        let a = fill(d(), &[]).unwrap();
        let b = fill(d(), &[]).unwrap();
        assert_eq!(a, b, "the same seed gives the same values");
        assert_eq!(a.shape(), &[10, 10]);
        let v = floats(&a);
        assert!(v.iter().all(|&x| (-2.0..3.0).contains(&x)), "{v:?}");
        assert!(
            v.iter().any(|&x| x < 0.0) && v.iter().any(|&x| x > 1.0),
            "spread over the range: {v:?}"
        );
        let c = fill(
            seeded(
                op(
                    "UniformFill",
                    &[],
                    &["y"],
                    vec![ints_arg("shape", &[10, 10])],
                ),
                8,
            ),
            &[],
        )
        .unwrap();
        assert_ne!(
            floats(&c),
            floats(
                &fill(
                    seeded(
                        op(
                            "UniformFill",
                            &[],
                            &["y"],
                            vec![ints_arg("shape", &[10, 10])]
                        ),
                        9
                    ),
                    &[]
                )
                .unwrap()
            )
        );
        assert!(
            floats(&c).iter().all(|&x| (0.0..1.0).contains(&x)),
            "defaults are [0, 1)"
        );
        // Without a seed, two ops draw different values.
        let u = || op("UniformFill", &[], &["y"], vec![ints_arg("shape", &[64])]);
        assert_ne!(fill(u(), &[]).unwrap(), fill(u(), &[]).unwrap());
    }

    #[test]
    fn each_op_owns_its_generator() {
        let ws = Workspace::new();
        let net = NetDef {
            name: Some("n".into()),
            op: vec![seeded(
                op(
                    "UniformIntFill",
                    &[],
                    &["y"],
                    vec![ints_arg("shape", &[32]), int_arg("max", 1000)],
                ),
                3,
            )],
            ..Default::default()
        };
        ws.create_net(&net, false).unwrap();
        ws.run_net("n", 1, &CancelToken::new()).unwrap();
        let first = out(&ws, "y");
        ws.run_net("n", 1, &CancelToken::new()).unwrap();
        let second = out(&ws, "y");
        assert_ne!(first, second, "the stream advances between runs");
        // A fresh op with the same seed replays the first run.
        let again = fill(
            seeded(
                op(
                    "UniformIntFill",
                    &[],
                    &["y"],
                    vec![ints_arg("shape", &[32]), int_arg("max", 1000)],
                ),
                3,
            ),
            &[],
        );
        assert_eq!(again.unwrap(), first);
    }

    #[test]
    fn uniform_int_fill_includes_both_ends() {
        let d = seeded(
            op(
                "UniformIntFill",
                &[],
                &["y"],
                vec![
                    ints_arg("shape", &[400]),
                    int_arg("min", -1),
                    int_arg("max", 1),
                ],
            ),
            1,
        );
        let r = fill(d, &[]).unwrap();
        let v: Vec<i32> = r.array::<i32>().unwrap().iter().copied().collect();
        for want in [-1, 0, 1] {
            assert!(v.contains(&want), "{want} missing");
        }
        assert!(v.iter().all(|x| (-1..=1).contains(x)));
    }

    #[test]
    fn uniform_fill_construction_errors() {
        let u =
            |ty: &str, ins: &[&str], args: Vec<Argument>| build_err(op(ty, ins, &["y"], args), ins);
        assert_bad_arg(
            &u(
                "UniformFill",
                &[],
                vec![float_arg("min", 1.0), float_arg("max", 1.0)],
            ),
            "max value should be bigger",
        );
        assert_bad_arg(
            &u("UniformFill", &[], vec![float_arg("min", 2.0)]),
            "min 2, max 1",
        );
        assert_bad_arg(
            &u("UniformFill", &[], vec![float_arg("max", f32::NAN)]),
            "must be finite",
        );
        assert_bad_arg(
            &u(
                "UniformFill",
                &[],
                vec![float_arg("min", f32::NEG_INFINITY)],
            ),
            "must be finite",
        );
        assert_bad_arg(
            &u(
                "UniformIntFill",
                &[],
                vec![int_arg("min", 5), int_arg("max", 5)],
            ),
            "max value should be bigger",
        );
        assert_bad_arg(
            &u("UniformIntFill", &[], vec![float_arg("min", 0.0)]),
            "expected field i",
        );
        assert_bad_arg(
            &u("UniformFill", &[], vec![int_arg("max", 3)]),
            "expected field f",
        );
        assert_bad_arg(
            &u("UniformIntFill", &[], vec![int_arg("max", 1 << 40)]),
            "does not fit",
        );
        assert_bad_arg(
            &u("UniformFill", &["a", "b"], vec![]),
            "takes 0, 1 or 3 inputs, got 2",
        );
        assert_bad_arg(
            &u("UniformIntFill", &["a", "b", "c"], vec![int_arg("min", 0)]),
            "min argument and the min input",
        );
        assert_bad_arg(
            &u("UniformFill", &["a", "b", "c"], vec![float_arg("max", 9.0)]),
            "max argument and the max input",
        );
        // With 3 inputs the argument check does not apply.
        let ws = Workspace::new();
        for n in ["a", "b", "c"] {
            feed(&ws, n, Tensor::scalar(0.0f32));
        }
        assert!(create_operator(&op("UniformFill", &["a", "b", "c"], &["y"], vec![]), &ws).is_ok());
        assert_bad_arg(
            &u("UniformFill", &[], vec![int_arg("shape", 3)]),
            "list was expected",
        );
        assert_bad_arg(
            &u("UniformIntFill", &[], vec![ints_arg("extra_shape", &[3])]),
            "no input",
        );
    }

    #[test]
    fn uniform_fill_bounds_from_inputs() {
        let x = tensor(&[4, 2], vec![0i64; 8]);
        let d = || seeded(op("UniformFill", &["x", "lo", "hi"], &["y"], vec![]), 5);
        let r = fill(
            d(),
            &[
                ("x", x.clone()),
                ("lo", Tensor::scalar(2.0f32)),
                ("hi", tensor(&[1], vec![3.0f32])),
            ],
        )
        .unwrap();
        assert_eq!(r.shape(), &[4, 2]);
        assert!(floats(&r).iter().all(|&v| (2.0..3.0).contains(&v)));
        // min == max gives min; min > max empties the first dim.
        let r = fill(
            d(),
            &[
                ("x", x.clone()),
                ("lo", Tensor::scalar(2.0f32)),
                ("hi", Tensor::scalar(2.0f32)),
            ],
        )
        .unwrap();
        assert_eq!(r, tensor(&[4, 2], vec![2.0f32; 8]));
        let r = fill(
            d(),
            &[
                ("x", x.clone()),
                ("lo", Tensor::scalar(3.0f32)),
                ("hi", Tensor::scalar(2.0f32)),
            ],
        )
        .unwrap();
        assert_eq!(r, tensor(&[0, 2], Vec::<f32>::new()));
        let di = op("UniformIntFill", &["x", "lo", "hi"], &["y"], vec![]);
        let r = fill(
            di.clone(),
            &[
                ("x", x.clone()),
                ("lo", Tensor::scalar(4i32)),
                ("hi", Tensor::scalar(4i32)),
            ],
        )
        .unwrap();
        assert_eq!(r, tensor(&[4, 2], vec![4i32; 8]));
        let r = fill(
            di.clone(),
            &[
                ("x", x.clone()),
                ("lo", Tensor::scalar(5i32)),
                ("hi", Tensor::scalar(4i32)),
            ],
        )
        .unwrap();
        assert_eq!(r, tensor(&[0, 2], Vec::<i32>::new()));
        // Bad bound tensors name their blob.
        let e = run_err(
            di.clone(),
            &[
                ("x", x.clone()),
                ("lo", Tensor::scalar(1.0f32)),
                ("hi", Tensor::scalar(4i32)),
            ],
        );
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Type, Some("lo"))
        );
        let e = run_err(
            di,
            &[
                ("x", x.clone()),
                ("lo", Tensor::scalar(1i32)),
                ("hi", tensor(&[2], vec![4i32, 5])),
            ],
        );
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("hi"))
        );
        let e = run_err(
            d(),
            &[
                ("x", x),
                ("lo", Tensor::scalar(f32::NAN)),
                ("hi", Tensor::scalar(1.0f32)),
            ],
        );
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::InvalidArgument, Some("lo"))
        );
        // An empty range needs a first dim to empty.
        let e = run_err(
            d(),
            &[
                ("x", Tensor::scalar(0i64)),
                ("lo", Tensor::scalar(3.0f32)),
                ("hi", Tensor::scalar(2.0f32)),
            ],
        );
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("x"))
        );
    }

    #[test]
    fn gaussian_fill_moments() {
        let d = seeded(
            op(
                "GaussianFill",
                &[],
                &["y"],
                vec![
                    ints_arg("shape", &[20000]),
                    float_arg("mean", 0.5),
                    float_arg("std", 2.0),
                ],
            ),
            11,
        );
        let v = floats(&fill(d, &[]).unwrap());
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!((mean - 0.5).abs() < 0.1, "mean {mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.1, "std {}", var.sqrt());
        // std 0 gives the mean everywhere; the input gives the shape.
        let d = op(
            "GaussianFill",
            &["x"],
            &["y"],
            vec![float_arg("mean", 3.0), float_arg("std", 0.0)],
        );
        assert_eq!(
            fill(d, &[("x", tensor(&[2], vec![1u8, 2]))]).unwrap(),
            tensor(&[2], vec![3.0f32, 3.0])
        );
    }

    #[test]
    fn gaussian_fill_construction_errors() {
        let g = |args: Vec<Argument>| build_err(op("GaussianFill", &[], &["y"], args), &[]);
        assert_bad_arg(&g(vec![float_arg("std", -1.0)]), "finite and >= 0, got -1");
        assert_bad_arg(&g(vec![float_arg("std", f32::INFINITY)]), "finite and >= 0");
        assert_bad_arg(&g(vec![float_arg("mean", f32::NAN)]), "mean must be finite");
        assert_bad_arg(&g(vec![int_arg("mean", 1)]), "expected field f");
        assert_bad_arg(&g(vec![ints_arg("shape", &[-1])]), "negative dimension");
        let e = build_err(
            op(
                "GaussianFill",
                &["x"],
                &["y"],
                vec![ints_arg("shape", &[1])],
            ),
            &["x"],
        );
        assert_bad_arg(&e, "at the same time");
    }

    #[test]
    fn fill_schemas_are_registered() {
        for ty in [
            "ConstantFill",
            "GivenTensorFill",
            "GivenTensorDoubleFill",
            "GivenTensorInt16Fill",
            "GivenTensorIntFill",
            "GivenTensorInt64Fill",
            "GivenTensorBoolFill",
            "GivenTensorStringFill",
            "UniformFill",
            "UniformIntFill",
            "GaussianFill",
        ] {
            assert!(crate::operator::schema(ty).is_some(), "{ty}");
        }
        // In place is allowed only as input 0 -> output 0.
        let ws = Workspace::new();
        feed(&ws, "x", Tensor::scalar(1.0f32));
        feed(&ws, "v", Tensor::scalar(1.0f32));
        let e = create_operator(&op("ConstantFill", &["x", "v"], &["v"], vec![]), &ws)
            .err()
            .expect("in place on input 1");
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(create_operator(&op("ConstantFill", &["x", "v"], &["x"], vec![]), &ws).is_ok());
    }

    #[test]
    fn fills_the_system_cannot_allocate_are_out_of_memory_errors() {
        // 2**46 float32s (256 TiB) pass the element-count cap but exceed any
        // x86-64 or aarch64 address space: the allocation fails for sure.
        // Before allocation was fallible, this aborted the process.
        crate::test_util::in_child(
            "ops::fill::tests::fills_the_system_cannot_allocate_are_out_of_memory_errors",
            || {
                let huge: i64 = 1 << 46;
                let ws = Workspace::new();
                feed(&ws, "x", tensor(&[1], vec![5.0f32]));
                feed(&ws, "dims", tensor(&[2], vec![1i64 << 23, 1 << 23]));
                let cases = vec![
                    op(
                        "ConstantFill",
                        &[],
                        &["x"],
                        vec![ints_arg("shape", &[huge]), float_arg("value", 1.0)],
                    ),
                    op(
                        "ConstantFill",
                        &[],
                        &["x"],
                        vec![
                            ints_arg("shape", &[huge]),
                            int_arg("dtype", 8),
                            int_arg("value", 3),
                        ],
                    ),
                    op(
                        "ConstantFill",
                        &[],
                        &["x"],
                        vec![
                            ints_arg("shape", &[huge]),
                            int_arg("dtype", 4),
                            string_arg("value", "s"),
                        ],
                    ),
                    op(
                        "ConstantFill",
                        &["dims"],
                        &["x"],
                        vec![int_arg("input_as_shape", 1)],
                    ),
                    op("UniformFill", &[], &["x"], vec![ints_arg("shape", &[huge])]),
                    op(
                        "UniformIntFill",
                        &[],
                        &["x"],
                        vec![ints_arg("shape", &[huge])],
                    ),
                    op(
                        "GaussianFill",
                        &[],
                        &["x"],
                        vec![ints_arg("shape", &[huge])],
                    ),
                    op(
                        "GaussianFill",
                        &["dims"],
                        &["x"],
                        vec![int_arg("input_as_shape", 1)],
                    ),
                ];
                for d in cases {
                    let net = NetDef {
                        name: Some("big".into()),
                        op: vec![d.clone()],
                        ..Default::default()
                    };
                    let e = ws.run_net_once(&net, &CancelToken::new()).unwrap_err();
                    assert_eq!(e.kind, ErrorKind::OutOfMemory, "{}", e.full_message());
                    assert_eq!(e.context.op_type.as_deref(), Some(d.op_type()));
                    assert_eq!(e.context.net.as_deref(), Some("big"));
                    assert_eq!(e.context.blob.as_deref(), Some("x"));
                    assert!(e.message.contains("cannot allocate"), "{}", e.message);
                    // Nothing was written; the workspace still works.
                    assert_eq!(out(&ws, "x"), tensor(&[1], vec![5.0f32]));
                }
                run(
                    &ws,
                    &op("ConstantFill", &[], &["y"], vec![ints_arg("shape", &[2])]),
                )
                .unwrap();
                assert_eq!(out(&ws, "y"), tensor(&[2], vec![0.0f32, 0.0]));
            },
        );
    }
}
