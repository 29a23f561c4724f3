//! Utility ops: Copy, EnsureCPUOutput, Print, GetAllBlobNames, IsEmpty,
//! LengthsToRanges, ScatterAssign, Concat and Split (and their old names
//! DepthConcat and DepthSplit).

use super::kit::by_dtype;
use super::kit::kernel;
use crate::arg;
use crate::args::Args;
use crate::blob::BlobValue;
use crate::error::{Error, ErrorKind, Result};
use crate::num::Number;
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator, ShapeInfo, MANY};
use crate::shapes::rules;
use crate::tensor::{concatenate, copy_array, try_vec, DataType, Element, Tensor};
use ndarray::{ArrayViewD, Axis};
use std::io::Write;

fn in_place_0_0(i: usize, o: usize) -> bool {
    i == 0 && o == 0
}

const CONCAT_ARGS: &[crate::operator::ArgDoc] = &[
    arg!(
        "axis",
        "int",
        "1",
        "the axis to join along (negative counts from the end)"
    ),
    arg!(
        "order",
        "string",
        "NCHW",
        "instead of axis: NCHW joins along 1, NHWC along 3"
    ),
    arg!(
        "add_axis",
        "int",
        "0",
        "non-zero: join along a new axis inserted at `axis` (only with axis)"
    ),
];

const SPLIT_ARGS: &[crate::operator::ArgDoc] = &[
    arg!(
        "axis",
        "int",
        "1",
        "the axis to split along (negative counts from the end)"
    ),
    arg!(
        "order",
        "string",
        "NCHW",
        "instead of axis: NCHW splits along 1, NHWC along 3"
    ),
    arg!(
        "split",
        "ints",
        "equal parts",
        "the size of each output along the axis (not with a second input)"
    ),
    arg!(
        "add_axis",
        "int",
        "0",
        "non-zero: each output is one index of `axis`, which is removed (only with axis)"
    ),
];

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("StopGradient", build_stop_gradient)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Y = X; the backward pass stops here."),
        OpSchema::new("Free", build_free)
            .inputs(1, MANY)
            .outputs(1, MANY)
            .inplace(InPlace::Enforce(|i, o| i == o))
            .doc("Empties its outputs, which are its inputs one to one (the inputs only order the op after the ops that write them); no gradient."),
        OpSchema::new("ZeroGradient", build_zero_gradient)
            .inputs(1, 1)
            .outputs(0, 0)
            .doc("Does nothing when run; in the backward pass its input gets a zero gradient (a ConstantFill shaped like it), for an output whose gradient an op's maker needs but no loss gives."),
        OpSchema::new("Copy", copy)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .doc("Deep copy of a tensor (same dtype and shape). A non-tensor input is a type error."),
        OpSchema::new("EnsureCPUOutput", copy)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .doc("Copies a tensor to a CPU tensor; everything is on the CPU here, so this is Copy."),
        OpSchema::new("CopyFromCPUInput", copy)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .doc("Copies a CPU tensor to the op's device; everything is on the CPU here, so this is Copy (recurrent cells use it on the timestep)."),
        OpSchema::new("CopyOnDeviceLike", copy)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Copies input 0 to the device of input 1; everything is on the CPU here, so this is Copy of input 0 \
                  (Copy's gradient op)."),
        OpSchema::new("Print", print)
            .inputs(1, 1)
            .outputs(0, 0)
            .args(&[
                arg!("to_file", "int", "0", "non-zero: append to '<workspace root>/<input name>.log' (truncated when the op is built) instead of stderr"),
                arg!("limit", "int", "0 (means 1000)", "most values printed; >= 0"),
                arg!("every_n", "int", "1", "print on runs 1, 1 + n, 1 + 2n, ...; >= 1"),
            ])
            .doc(
                "Prints 'Tensor <name> of type <dtype>. Dims: (d0,d1,): v0,v1,...'. A non-tensor input prints \
                 'Blob of type: <kind>'. Supported dtypes: float32, float64, int32, int64, bool, uint8, string.",
            ),
        OpSchema::new("GetAllBlobNames", get_all_blob_names)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[arg!("include_shared", "bool", "true", "also list the blobs visible from parent workspaces")])
            .doc("Outputs the sorted names of the blobs in the op's workspace as a 1-D string tensor."),
        OpSchema::new("NanCheck", nan_check)
            .inputs(1, MANY)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .infer(|_, ins, n| Ok(rules::same_as_input(ins, 0, n)))
            .doc(
                "Y = X (input 0, float32, float64 or float16), after checking that X holds no NaN or infinity: one \
                 that does is an InvalidArgumentError naming the first such element. Further inputs are only named \
                 in that error (Caffe2 printed them).",
            ),
        OpSchema::new("LengthsGather", lengths_gather)
            .inputs(3, 3)
            .outputs(1, 1)
            .doc(
                "Inputs (ITEMS, LENGTHS int32/int64, INDICES int32/int64): LENGTHS cuts ITEMS' rows into consecutive \
                 segments (they must add up to its first dim); the output is the segments INDICES names, one after \
                 another (any dtype).",
            ),
        OpSchema::new("SplitByLengths", split_by_lengths)
            .inputs(2, 2)
            .outputs(1, MANY)
            .args(&[
                arg!("axis", "int", "0", "the axis to split along (negative counts from the end)"),
                arg!("use_scaling_lengths", "bool", "false", "scale the lengths up so that they add up to the axis (by the whole factor dim / sum)"),
            ])
            .doc(
                "Inputs (DATA, LENGTHS int32/int64): the lengths, whose count must be a multiple k of the outputs' \
                 count n, cut DATA along axis into consecutive parts; output i takes the parts i*k/n .. (i+1)*k/n. \
                 The lengths must add up to the axis.",
            ),
        OpSchema::new("IsEmpty", is_empty)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Outputs a bool scalar: whether the input tensor has no elements."),
        OpSchema::new("LengthsToRanges", lengths_to_ranges)
            .inputs(1, 1)
            .outputs(1, 1)
            .infer(lengths_to_ranges_infer)
            .doc("1-D int32 lengths -> int32 [N, 2] rows (offset, length), offsets a running sum from 0."),
        OpSchema::new("ScatterAssign", scatter_assign)
            .inputs(3, 3)
            .outputs(1, 1)
            .inplace(InPlace::Enforce(in_place_0_0))
            .infer(|_, ins, n| Ok(rules::same_as_input(ins, 0, n)))
            .doc(
                "Inputs (DATA, INDICES, SLICES), output DATA (in place): row INDICES[i] of DATA becomes slice i. \
                 Indices are int32 or int64 and bounds-checked; the last of duplicate indices wins.",
            ),
        OpSchema::new("Concat", concat)
            .inputs(1, MANY)
            .outputs(2, 2)
            .args(CONCAT_ARGS)
            .infer(concat_infer)
            .doc("Joins the inputs along an axis; outputs (concat, split_info: int32 size of each input along the axis)."),
        OpSchema::new("DepthConcat", concat)
            .inputs(1, MANY)
            .outputs(2, 2)
            .args(CONCAT_ARGS)
            .infer(concat_infer)
            .doc("Caffe2's old name for Concat."),
        OpSchema::new("Split", split)
            .inputs(1, 2)
            .outputs(1, MANY)
            .args(SPLIT_ARGS)
            .infer(split_infer)
            .doc(
                "Splits the input along an axis into the outputs. The sizes come from the `split` argument, or from an \
                 optional second input (int32, one per output), or else are equal (the axis must divide evenly). With \
                 add_axis each output is one index of the axis, which is removed (undoes Concat's add_axis).",
            ),
        OpSchema::new("DepthSplit", split)
            .inputs(1, 2)
            .outputs(1, MANY)
            .args(SPLIT_ARGS)
            .infer(split_infer)
            .doc("Caffe2's old name for Split."),
    ]
}

// ------------------------------------------------------------------ Copy --

fn copy(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ensure_cpu = ctx.op_type() == "EnsureCPUOutput";
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let t = match l.input(0) {
            BlobValue::Tensor(t) => t,
            other if ensure_cpu => {
                return Err(Error::type_error(format!(
                    "unexpected input blob: it holds {} but a Tensor was expected",
                    other.kind_name()
                ))
                .with_blob(l.input_name(0)))
            }
            _ => l.tensor(0)?,
        };
        if l.aliases(0, 0) {
            return Ok(true);
        }
        let t = t.try_clone()?;
        l.set_output(0, t);
        Ok(true)
    }))
}

// ----------------------------------------------------------------- Print --

/// Formats like a C++ ostream with default flags (`%g`, 6 significant digits).
fn fmt_g(v: f64) -> String {
    const P: i32 = 6;
    if v.is_nan() {
        return if v.is_sign_negative() { "-nan" } else { "nan" }.to_string();
    }
    if v.is_infinite() {
        return if v < 0.0 { "-inf" } else { "inf" }.to_string();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    fn strip(s: &str) -> &str {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.')
        } else {
            s
        }
    }
    let sci = format!("{:.*e}", (P - 1) as usize, v);
    let (mantissa, exp) = sci.split_once('e').expect("exponent format");
    let x: i32 = exp.parse().expect("exponent");
    if (-4..P).contains(&x) {
        strip(&format!("{:.*}", (P - 1 - x) as usize, v)).to_string()
    } else {
        format!(
            "{}e{}{:02}",
            strip(mantissa),
            if x < 0 { '-' } else { '+' },
            x.abs()
        )
    }
}

/// The dtypes Print writes (Caffe2's Print took no int8, int16 or uint16).
const PRINTED: &[DataType] = &[
    DataType::Float,
    DataType::Double,
    DataType::Int32,
    DataType::Int64,
    DataType::Bool,
    DataType::Uint8,
    DataType::String,
    DataType::Float16,
];

/// The meta prefix: `Tensor <name> of type <dtype>. Dims: (d0,d1,): `.
fn print_meta(name: &str, t: &Tensor) -> String {
    let dims: String = t.shape().iter().map(|d| format!("{d},")).collect();
    format!("Tensor {name} of type {}. Dims: ({dims}): ", t.dtype())
}

/// One Print line for a tensor, with at most `limit` values.
fn print_line(name: &str, t: &Tensor, limit: usize) -> Result<String> {
    let mut s = print_meta(name, t);
    if t.numel() == 0 {
        return Ok(s);
    }
    fn join<T>(a: &ndarray::ArrayD<T>, limit: usize, f: impl Fn(&T) -> String) -> String {
        a.iter().take(limit).map(f).collect::<Vec<_>>().join(",")
    }
    if !PRINTED.contains(&t.dtype()) {
        return Err(Error::type_error(format!(
            "Print does not support tensors of dtype {}",
            t.dtype()
        ))
        .with_blob(name));
    }
    // Integers in decimal, floats as C++'s `%g`, bool as 1 or 0.
    let values = crate::with_match_dtype!(tensor pod t, |a: T| {
        if T::INT {
            join(a, limit, |x: &T| x.to_i64().to_string())
        } else {
            join(a, limit, |x: &T| fmt_g(x.to_f64()))
        }
    }, else Tensor::Bool(a) => join(a, limit, |&x| if x { "1" } else { "0" }.to_string()),
        Tensor::Str(a) => join(a, limit, |x| String::from_utf8_lossy(x).into_owned()));
    s.push_str(&values);
    Ok(s)
}

fn print(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let name = ctx.input_name(0).to_string();
    let to_file = ctx.args.int::<i32>("to_file", 0)? != 0;
    let limit = ctx.args.int::<i32>("limit", 0)?;
    let every_n = ctx.args.int::<i32>("every_n", 1)?;
    if limit < 0 {
        return Err(ctx.bad_arg(format!("limit must be >= 0, got {limit}")));
    }
    if every_n < 1 {
        return Err(ctx.bad_arg(format!("every_n must be >= 1, got {every_n}")));
    }
    let limit = if limit == 0 { 1000 } else { limit as usize };
    let every_n = every_n as u64;
    let mut file = if to_file {
        let path = format!("{}/{}.log", ctx.ws.root_folder(), name);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| {
                Error::io(&e, &path)
                    .with_blob(&name)
                    .with_op(ctx.op_type(), None)
            })?;
        Some((f, path))
    } else {
        None
    };
    let mut occurrence: u64 = 0;
    Ok(kernel(move |cx| {
        occurrence += 1;
        if occurrence > every_n {
            occurrence -= every_n;
        }
        if occurrence != 1 {
            return Ok(true);
        }
        let line = {
            let l = cx.lock();
            match l.input(0) {
                BlobValue::Tensor(t) => print_line(&name, t, limit)?,
                other => {
                    // As in Caffe2, a non-tensor goes to the log even with to_file.
                    eprintln!("Blob of type: {}", other.kind_name());
                    return Ok(true);
                }
            }
        };
        match &mut file {
            Some((f, path)) => {
                writeln!(f, "{line}").map_err(|e| Error::io(&e, path).with_blob(&name))?
            }
            None => eprintln!("{line}"),
        }
        Ok(true)
    }))
}

// ------------------------------------------------------- GetAllBlobNames --

fn get_all_blob_names(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let include_shared = ctx.args.bool("include_shared", true)?;
    Ok(kernel(move |cx| {
        let names = if include_shared {
            cx.ws.blob_names()
        } else {
            cx.ws.local_blob_names()
        };
        let n = names.len();
        let t = Tensor::from_vec(&[n], names.into_iter().map(String::into_bytes).collect())?;
        cx.lock().set_output(0, t);
        Ok(true)
    }))
}

// --------------------------------------------------------------- IsEmpty --

fn is_empty(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let empty = l.tensor(0)?.numel() == 0;
        l.set_output(0, Tensor::scalar(empty));
        Ok(true)
    }))
}

// --------------------------------------------------------------- NanCheck --

fn first_bad<T: Copy + Into<f64>>(a: &ndarray::ArrayD<T>) -> Option<(usize, f64)> {
    a.iter()
        .map(|&v| v.into())
        .enumerate()
        .find(|(_, v)| !v.is_finite())
}

fn nan_check(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let others: Vec<String> = ctx.def.input[1..].to_vec();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let name = l.input_name(0);
        let t = l.tensor(0)?;
        let bad = match t {
            Tensor::F32(a) => first_bad(&**a),
            Tensor::F64(a) => first_bad(&**a),
            Tensor::F16(a) => a
                .iter()
                .map(|v| f64::from(v.to_f32()))
                .enumerate()
                .find(|(_, v)| !v.is_finite()),
            other => {
                return Err(Error::type_error(format!(
                    "NanCheck takes float32, float64 or float16, got {}",
                    other.dtype()
                ))
                .with_blob(name))
            }
        };
        if let Some((i, v)) = bad {
            return Err(Error::invalid_arg(format!(
                "the tensor holds {v} at flat index {i} (of {} elements){}",
                t.numel(),
                if others.is_empty() {
                    String::new()
                } else {
                    format!("; also checked with: {}", others.join(", "))
                }
            ))
            .with_blob(name));
        }
        if !l.aliases(0, 0) {
            let t = t.clone();
            l.set_output(0, t);
        }
        Ok(true)
    }))
}

// ---------------------------------------------------------- LengthsGather --

/// Input `i` as non-negative integers (int32 or int64), naming `what`.
fn non_negative(l: &Locked<'_>, i: usize, what: &str) -> Result<Vec<usize>> {
    let name = l.input_name(i);
    let raw: Vec<i64> = match l.tensor(i)? {
        Tensor::I32(a) => {
            crate::tensor::try_collect(a.iter().map(|&v| i64::from(v)), "a kernel buffer")?
        }
        Tensor::I64(a) => crate::tensor::try_collect(a.iter().copied(), "a kernel buffer")?,
        other => {
            return Err(Error::type_error(format!(
                "the {what} must be int32 or int64, got {}",
                other.dtype()
            ))
            .with_blob(name))
        }
    };
    raw.iter()
        .enumerate()
        .map(|(k, &v)| {
            usize::try_from(v).map_err(|_| {
                Error::invalid_arg(format!("{what} #{k} is negative: {v}")).with_blob(name)
            })
        })
        .collect()
}

fn take_rows<T: Element>(t: &Tensor, axis: usize, ranges: &[(usize, usize)]) -> Result<Tensor> {
    let a = t.array::<T>()?;
    let views: Vec<_> = crate::tensor::try_collect(
        ranges
            .iter()
            .map(|&(lo, len)| a.slice_axis(Axis(axis), ndarray::Slice::from(lo..lo + len))),
        "a kernel buffer",
    )?;
    if views.is_empty() {
        let mut shape = a.shape().to_vec();
        shape[axis] = 0;
        return Tensor::zeros(T::DTYPE, &shape);
    }
    Ok(T::wrap(concatenate(axis, &views)?))
}

fn lengths_gather(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let lens = non_negative(&l, 1, "length")?;
        let idx = non_negative(&l, 2, "index")?;
        let out = {
            let name = l.input_name(0);
            let items = l.tensor(0)?;
            if items.ndim() == 0 {
                return Err(Error::shape("the items must be at least 1-D").with_blob(name));
            }
            let mut starts = Vec::with_capacity(lens.len());
            let mut total = 0usize;
            for &n in &lens {
                starts.push(total);
                total = total.saturating_add(n);
            }
            if total != items.shape()[0] {
                return Err(Error::invalid_arg(format!(
                    "the lengths add up to {total} but the items have {} rows",
                    items.shape()[0]
                ))
                .with_blob(l.input_name(1)));
            }
            let ranges = idx
                .iter()
                .map(|&i| {
                    lens.get(i).map(|&n| (starts[i], n)).ok_or_else(|| {
                        Error::new(
                            ErrorKind::IndexOutOfRange,
                            format!("index {i} is out of range for {} lengths", lens.len()),
                        )
                        .with_blob(l.input_name(2))
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            by_dtype!(items.dtype(), take_rows(items, 0, &ranges)).map_err(|e| e.with_blob(name))?
        };
        l.set_output(0, out);
        Ok(true)
    }))
}

// --------------------------------------------------------- SplitByLengths --

fn split_by_lengths(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 0)?;
    let scaling = ctx.args.bool("use_scaling_lengths", false)?;
    let no = ctx.num_outputs();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let mut lens = non_negative(&l, 1, "length")?;
        let outs = {
            let name = l.input_name(0);
            let data = l.tensor(0)?;
            let canon = rules::canonical_axis(axis, data.ndim()).map_err(|e| e.with_blob(name))?;
            let dim = data.shape()[canon];
            let lname = l.input_name(1);
            if lens.len() % no != 0 {
                return Err(Error::invalid_arg(format!(
                    "the number of lengths ({}) must be a multiple of the number of outputs ({no})",
                    lens.len()
                ))
                .with_blob(lname));
            }
            let sum = lens
                .iter()
                .try_fold(0usize, |a, &b| a.checked_add(b))
                .unwrap_or(usize::MAX);
            if scaling && sum > 0 && sum != dim {
                if dim % sum != 0 {
                    return Err(Error::invalid_arg(format!(
                        "with use_scaling_lengths the lengths' sum ({sum}) must divide dim {canon} ({dim})"
                    ))
                    .with_blob(lname));
                }
                let f = dim / sum;
                lens.iter_mut().for_each(|n| *n *= f);
            } else if sum != dim {
                return Err(Error::invalid_arg(format!(
                    "the lengths add up to {sum} but dim {canon} of the data is {dim}"
                ))
                .with_blob(lname));
            }
            let per = lens.len() / no;
            let mut start = 0;
            let mut outs = Vec::with_capacity(no);
            for chunk in 0..no {
                let len: usize = lens[chunk * per..(chunk + 1) * per].iter().sum();
                outs.push(
                    by_dtype!(data.dtype(), take_rows(data, canon, &[(start, len)]))
                        .map_err(|e| e.with_blob(name))?,
                );
                start += len;
            }
            outs
        };
        for (o, t) in outs.into_iter().enumerate() {
            l.set_output(o, t);
        }
        Ok(true)
    }))
}

// ------------------------------------------------------- LengthsToRanges --

fn lengths_to_ranges_infer(
    _: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    Ok(vec![rules::known(ins, 0).map(|t| {
        let mut dims = t.dims.clone();
        dims.push(2);
        ShapeInfo::new(dims, DataType::Int32)
    })])
}

fn lengths_to_ranges(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let name = l.input_name(0);
        let a = l.tensor(0)?.array::<i32>().map_err(|e| e.with_blob(name))?;
        if a.ndim() != 1 {
            return Err(Error::shape(format!(
                "the lengths must be a 1-D tensor, got shape {:?}",
                a.shape()
            ))
            .with_blob(name));
        }
        let mut out = try_vec(2 * a.len(), format_args!("{} int32 ranges", a.len()))?;
        let mut next = Some(0i32);
        for (i, &len) in a.iter().enumerate() {
            if len < 0 {
                return Err(
                    Error::invalid_arg(format!("length #{i} is negative: {len}")).with_blob(name),
                );
            }
            let offset = next.ok_or_else(|| {
                Error::invalid_arg(format!("the offset of length #{i} overflows int32"))
                    .with_blob(name)
            })?;
            out.push(offset);
            out.push(len);
            next = offset.checked_add(len);
        }
        let t = Tensor::from_vec(&[a.len(), 2], out)?;
        l.set_output(0, t);
        Ok(true)
    }))
}

// --------------------------------------------------------- ScatterAssign --

/// Copies slice `i` (rows of `block` elements, flat) over row `rows[i]` of `data`.
fn scatter_rows<T: Element>(
    data: &mut Tensor,
    slices: &Tensor,
    rows: &[usize],
    block: usize,
) -> Result<()> {
    let a = data.array_mut::<T>()?;
    if !a.is_standard_layout() {
        *a = copy_array(a.view())?;
    }
    let dst = a.as_slice_mut().expect("standard layout");
    let s = slices.array::<T>()?;
    let owned;
    let src: &[T] = match s.as_slice() {
        Some(x) => x,
        None => {
            owned = copy_array(s.view())?;
            owned.as_slice().expect("a copy is in standard layout")
        }
    };
    for (i, &r) in rows.iter().enumerate() {
        dst[r * block..(r + 1) * block].clone_from_slice(&src[i * block..(i + 1) * block]);
    }
    Ok(())
}

fn scatter_assign(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let (dn, iname, sname) = (
            l.input_name(0).to_string(),
            l.input_name(1).to_string(),
            l.input_name(2).to_string(),
        );
        if !l.aliases(0, 0) {
            return Err(Error::invalid_arg(
                "ScatterAssign must run in place: its output must be the DATA blob",
            )
            .with_blob(l.output_name(0)));
        }
        let (dtype, rows, block) = {
            let data = l.tensor(0)?;
            let indices = l.tensor(1)?;
            let slices = l.tensor(2)?;
            let dtype = data.dtype();
            if slices.dtype() != dtype {
                return Err(Error::type_error(format!(
                    "the data and slice dtypes must match: DATA is {dtype} but SLICES is {}",
                    slices.dtype()
                ))
                .with_blob(&sname));
            }
            if !matches!(
                dtype,
                DataType::Float
                    | DataType::Float16
                    | DataType::Double
                    | DataType::Uint8
                    | DataType::Int32
                    | DataType::Int64
            ) {
                return Err(Error::type_error(format!(
                    "ScatterAssign does not support DATA of dtype {dtype} (float32, float16, float64, uint8, int32, int64)"
                ))
                .with_blob(&dn));
            }
            let Some((&n, inner)) = data.shape().split_first() else {
                return Err(Error::shape(
                    "DATA must have at least one dimension, got a 0-dim tensor",
                )
                .with_blob(&dn));
            };
            let block: usize = inner.iter().product();
            let k = indices.numel();
            if slices.numel() != k * block {
                return Err(Error::shape(format!(
                    "SLICES must hold {} elements ({k} indices x {block} per row of DATA {:?}), got {}",
                    k * block,
                    data.shape(),
                    slices.numel()
                ))
                .with_blob(&sname));
            }
            let check = |(i, v): (usize, i64)| -> Result<usize> {
                usize::try_from(v).ok().filter(|&r| r < n).ok_or_else(|| {
                    Error::new(
                        ErrorKind::IndexOutOfRange,
                        format!("index {v} at position {i} is out of range [0, {n}) for the first dim of '{dn}'"),
                    )
                    .with_blob(&iname)
                })
            };
            let rows = crate::with_match_dtype!(tensor ints indices, |a: T| a
                .iter()
                .map(|&v| i64::from(v))
                .enumerate()
                .map(check)
                .collect::<Result<Vec<_>>>()?,
            else other => {
                return Err(Error::type_error(format!(
                    "INDICES must be {}, got {}",
                    crate::tensor::dtype_choice(DataType::INTS),
                    other.dtype()
                ))
                .with_blob(&iname))
            });
            (dtype, rows, block)
        };
        let (out, slices) = l.output_and_input(0, 2).ok_or_else(|| {
            Error::invalid_arg("SLICES cannot be the DATA blob").with_blob(&sname)
        })?;
        let slices = slices.tensor().map_err(|e| e.with_blob(&sname))?;
        let data = out.tensor_mut().map_err(|e| e.with_blob(&dn))?;
        by_dtype!(dtype, scatter_rows(data, slices, &rows, block)).map_err(|e| e.with_blob(&dn))?;
        Ok(true)
    }))
}

// ---------------------------------------------------------------- Concat --

fn concat_typed<T: Element>(
    inputs: &[(&str, &Tensor)],
    axis: usize,
    add_axis: bool,
) -> Result<Tensor> {
    if let Some(t) = concat_plain::<T>(inputs, axis, add_axis)? {
        return Ok(t);
    }
    let views = inputs
        .iter()
        .map(|(name, t)| {
            let v = t.array::<T>().map_err(|e| e.with_blob(name))?.view();
            Ok(if add_axis {
                v.insert_axis(Axis(axis))
            } else {
                v
            })
        })
        .collect::<Result<Vec<ArrayViewD<'_, T>>>>()?;
    Ok(T::wrap(concatenate(axis, &views)?))
}

/// [`concat_typed`] for row-major inputs of a plain dtype (numbers,
/// bool), checked by [`join`]: the output is made of each input's rows
/// (its elements from the axis on) in turn, copied as bytes, on the kernel
/// pool when they are long ([`crate::threads::copy_spans`]: DenseNet-121
/// joins feature maps of up to 4 MiB at every layer). `None`: another
/// dtype or layout, for the general path.
fn concat_plain<T: Element>(
    inputs: &[(&str, &Tensor)],
    axis: usize,
    add_axis: bool,
) -> Result<Option<Tensor>> {
    if !crate::tensor::plain::<T>() {
        return Ok(None);
    }
    let mut slices = Vec::with_capacity(inputs.len());
    for (name, t) in inputs {
        match t.array::<T>().map_err(|e| e.with_blob(name))?.as_slice() {
            Some(s) => slices.push(s),
            None => return Ok(None),
        }
    }
    let first = inputs[0].1.shape();
    let mut shape = first.to_vec();
    if add_axis {
        shape.insert(axis, inputs.len());
    } else {
        shape[axis] = inputs.iter().map(|(_, t)| t.shape()[axis]).sum();
    }
    let outer: usize = shape[..axis].iter().product();
    let n = crate::tensor::checked_numel::<T>(&shape, "Concat's output")?;
    // SAFETY: the spans below cover the n elements once each: for each of
    // the `outer` leading indices, each input's row (its len / outer
    // elements) in input order, the rows summing to n / outer.
    let v = unsafe {
        crate::tensor::written_vec::<T>(n, "Concat's output", |out| {
            let base = out.as_mut_ptr().cast::<u8>();
            let size = std::mem::size_of::<T>();
            let mut spans = Vec::with_capacity(outer * slices.len());
            let mut at = 0;
            for o in 0..outer {
                for s in &slices {
                    let row = s.len() / outer.max(1);
                    spans.push(crate::threads::Span {
                        dst: base.add(at * size),
                        src: s.as_ptr().add(o * row).cast(),
                        len: row * size,
                    });
                    at += row;
                }
            }
            crate::threads::copy_spans(&spans);
        })?
    };
    Ok(Some(T::wrap(super::kit::array(&shape, v)?)))
}

/// Concat's and Split's axis: `axis` (with `add_axis`), or the channel axis
/// of `order` (NCHW: 1, NHWC: 3; `add_axis` is then ignored, as in Caffe2);
/// giving both is an error. `verb` names the op's action in the message.
fn axis_args(ctx: &OpDefCtx<'_>, verb: &str) -> Result<(i64, bool)> {
    axis_of(&ctx.args, verb).map_err(|e| e.with_op(ctx.op_type(), None))
}

/// [`axis_args`] from the arguments alone (shape inference has no context).
fn axis_of(args: &Args<'_>, verb: &str) -> Result<(i64, bool)> {
    if args.has("axis") && args.has("order") {
        return Err(Error::invalid_arg(format!(
            "you cannot give both the axis to {verb} along and the order"
        )));
    }
    if args.has("axis") {
        return Ok((
            i64::from(args.int::<i32>("axis", -1)?),
            args.int::<i32>("add_axis", 0)? != 0,
        ));
    }
    let order = args.string("order", "NCHW")?;
    let axis = if order.eq_ignore_ascii_case("NCHW") {
        1
    } else if order.eq_ignore_ascii_case("NHWC") {
        3
    } else {
        return Err(Error::invalid_arg(format!(
            "unsupported storage order '{order}' (NCHW or NHWC)"
        )));
    };
    Ok((axis, false))
}

/// Concat's outputs: the inputs joined along the axis, and one int32 size
/// per input.
fn concat_infer(
    args: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    n_out: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    let (axis, add_axis) = axis_of(args, "concat")?;
    let Some(ins) = ins.iter().cloned().collect::<Option<Vec<ShapeInfo>>>() else {
        return Ok(vec![None; n_out]);
    };
    let first = &ins[0];
    let canon = rules::canonical_axis(axis, first.dims.len() + usize::from(add_axis))?;
    let mut dims = first.dims.clone();
    for t in &ins[1..] {
        let same = t.dims.len() == first.dims.len()
            && (0..dims.len()).all(|i| (i == canon && !add_axis) || t.dims[i] == first.dims[i]);
        if t.dtype != first.dtype || !same {
            return Err(Error::shape("the inputs cannot be joined"));
        }
        if !add_axis {
            dims[canon] += t.dims[canon];
        }
    }
    if add_axis {
        dims.insert(canon, ins.len() as i64);
    }
    Ok(vec![
        Some(ShapeInfo::new(dims, first.dtype)),
        Some(ShapeInfo::new(vec![ins.len() as i64], DataType::Int32)),
    ][..n_out.min(2)]
        .to_vec())
}

/// Split's outputs, when the sizes are arguments or equal parts (with a
/// sizes input they depend on its values: unknown, as in Caffe2).
fn split_infer(
    args: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    n_out: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    let (axis, add_axis) = axis_of(args, "split")?;
    let input = match rules::known(ins, 0) {
        Some(t) if ins.len() == 1 => t,
        _ => return Ok(vec![None; n_out]),
    };
    let canon = rules::canonical_axis(axis, input.dims.len())?;
    let channels = input.dims[canon];
    let no = n_out as i64;
    let mut out = Vec::with_capacity(n_out);
    if add_axis {
        if channels != no {
            return Err(Error::invalid_arg("one output per index of the axis"));
        }
        let mut dims = input.dims.clone();
        dims.remove(canon);
        return Ok(vec![Some(ShapeInfo::new(dims, input.dtype)); n_out]);
    }
    let sizes = match args.ints("split")?.filter(|v| !v.is_empty()) {
        Some(v) => v,
        None if no > 0 && channels % no == 0 => vec![channels / no; n_out],
        None => return Err(Error::invalid_arg("the axis does not divide evenly")),
    };
    if sizes.len() != n_out || sizes.iter().sum::<i64>() != channels {
        return Err(Error::invalid_arg("the split sizes do not match"));
    }
    for s in sizes {
        let mut dims = input.dims.clone();
        dims[canon] = s;
        out.push(Some(ShapeInfo::new(dims, input.dtype)));
    }
    Ok(out)
}

/// The inputs joined along `axis` (negative: from the end; with
/// `add_axis`, a new axis there), and split_info, each input's int32 size
/// along the axis; errors name the blob at fault (`out`: the output's).
pub(crate) fn join(
    inputs: &[(&str, &Tensor)],
    axis: i64,
    add_axis: bool,
    out: &str,
) -> Result<(Tensor, Tensor)> {
    let (name0, first) = inputs[0];
    let ndim = first.ndim();
    let adj = ndim + usize::from(add_axis);
    let canon = if axis < 0 { axis + adj as i64 } else { axis };
    if canon < 0 || canon >= adj as i64 {
        return Err(Error::invalid_arg(format!(
            "axis {axis} is out of range for inputs of {ndim} dims{}",
            if add_axis {
                " (plus the added axis)"
            } else {
                ""
            }
        ))
        .with_blob(name0));
    }
    let canon = canon as usize;
    for &(name, t) in &inputs[1..] {
        if t.dtype() != first.dtype() {
            return Err(Error::type_error(format!(
                "all inputs must have the same dtype: expected {} but got {}",
                first.dtype(),
                t.dtype()
            ))
            .with_blob(name));
        }
        let dims_match = t.ndim() == ndim
            && (0..ndim).all(|i| (i == canon && !add_axis) || t.shape()[i] == first.shape()[i]);
        if !dims_match {
            return Err(Error::shape(format!(
                "the inputs may differ only along axis {canon}{}: {:?} ('{name0}') vs {:?}",
                if add_axis {
                    " (none may differ with add_axis)"
                } else {
                    ""
                },
                first.shape(),
                t.shape()
            ))
            .with_blob(name));
        }
    }
    let split = inputs
        .iter()
        .map(|&(name, t)| {
            if add_axis {
                Ok(1)
            } else {
                i32::try_from(t.shape()[canon]).map_err(|_| {
                    Error::shape(format!(
                        "dim {canon} of size {} does not fit int32",
                        t.shape()[canon]
                    ))
                    .with_blob(name)
                })
            }
        })
        .collect::<Result<Vec<i32>>>()?;
    let joined = by_dtype!(first.dtype(), concat_typed(inputs, canon, add_axis))
        .map_err(|e| e.with_blob(out))?;
    Ok((joined, Tensor::from_vec(&[inputs.len()], split)?))
}

fn concat(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (axis, add_axis) = axis_args(ctx, "concat")?;
    let ni = ctx.num_inputs();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let (out, split) = {
            let inputs = (0..ni)
                .map(|i| Ok((l.input_name(i), l.tensor(i)?)))
                .collect::<Result<Vec<_>>>()?;
            join(&inputs, axis, add_axis, l.output_name(0))?
        };
        l.set_output(0, out);
        l.set_output(1, split);
        Ok(true)
    }))
}

// ----------------------------------------------------------------- Split --

/// Where Split's sizes come from.
#[derive(Clone)]
enum SplitSizes {
    /// The `split` argument (one size per output).
    Arg(Vec<i64>),
    /// The second input, an int32 tensor with one size per output.
    Input,
    /// Equal parts.
    Equal,
}

/// Slices `lo..lo + len` of `axis` (or, with `drop_axis`, the single index
/// `lo` with the axis removed), one per part.
fn split_typed<T: Element>(
    t: &Tensor,
    axis: usize,
    parts: &[(usize, usize)],
    drop_axis: bool,
) -> Result<Vec<Tensor>> {
    let a = t.array::<T>()?;
    Ok(parts
        .iter()
        .map(|&(lo, len)| {
            let out = if drop_axis {
                a.index_axis(Axis(axis), lo).to_owned()
            } else {
                a.slice_axis(Axis(axis), ndarray::Slice::from(lo..lo + len))
                    .to_owned()
            };
            T::wrap(out)
        })
        .collect())
}

fn split(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (axis, add_axis) = axis_args(ctx, "split")?;
    let no = ctx.num_outputs();
    // An empty `split` list counts as none (Caffe2 tested its size).
    let sizes = match ctx.args.ints("split")?.filter(|v| !v.is_empty()) {
        Some(_) if ctx.num_inputs() == 2 => {
            return Err(ctx.bad_arg(
                "if you set split with an input blob, do not pass in split in the argument",
            ));
        }
        Some(v) => {
            if v.len() != no {
                return Err(ctx.bad_arg(format!(
                    "the number of splits specified ({}) should be equal to the number of outputs ({no})",
                    v.len()
                )));
            }
            if let Some(bad) = v.iter().find(|&&x| x < 0) {
                return Err(ctx.bad_arg(format!("split sizes must be >= 0, got {bad}")));
            }
            SplitSizes::Arg(v)
        }
        None if ctx.num_inputs() == 2 => SplitSizes::Input,
        None => SplitSizes::Equal,
    };
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let outs = {
            let name = l.input_name(0);
            let input = l.tensor(0)?;
            let ndim = input.ndim();
            let canon = if axis < 0 { axis + ndim as i64 } else { axis };
            if canon < 0 || canon >= ndim as i64 {
                return Err(Error::invalid_arg(format!(
                    "axis {axis} is out of range for an input of {ndim} dims"
                ))
                .with_blob(name));
            }
            let canon = canon as usize;
            let channels = input.shape()[canon];
            let sizes: Vec<usize> = match &sizes {
                SplitSizes::Arg(v) => v.iter().map(|&x| x as usize).collect(),
                SplitSizes::Input => {
                    let sname = l.input_name(1);
                    let st = l.tensor(1)?;
                    let v = st.array::<i32>().map_err(|e| {
                        Error::type_error(format!(
                            "the split sizes input must be int32 ({})",
                            e.message
                        ))
                        .with_blob(sname)
                    })?;
                    if v.len() != no {
                        return Err(Error::invalid_arg(format!(
                            "the split sizes input holds {} sizes but the op has {no} outputs",
                            v.len()
                        ))
                        .with_blob(sname));
                    }
                    v.iter()
                        .map(|&x| {
                            usize::try_from(x).map_err(|_| {
                                Error::invalid_arg(format!("split sizes must be >= 0, got {x}"))
                                    .with_blob(sname)
                            })
                        })
                        .collect::<Result<_>>()?
                }
                SplitSizes::Equal => {
                    if channels % no != 0 {
                        return Err(Error::invalid_arg(format!(
                            "if you did not specify split explicitly, the number of input channels \
                             ({channels} along axis {canon}) should be divisible by the output size ({no})"
                        ))
                        .with_blob(name));
                    }
                    vec![channels / no; no]
                }
            };
            // With add_axis each output is one index of the axis (the sizes
            // are not used, as in Caffe2).
            let total = if add_axis {
                no
            } else {
                sizes
                    .iter()
                    .try_fold(0usize, |a, &b| a.checked_add(b))
                    .unwrap_or(usize::MAX)
            };
            if total != channels {
                return Err(Error::invalid_arg(format!(
                    "sum of split dimensions do not match: should be {channels} (dim {canon} of {:?}), got {}",
                    input.shape(),
                    if add_axis {
                        format!("{no} outputs with add_axis")
                    } else {
                        format!("{sizes:?}")
                    }
                ))
                .with_blob(name));
            }
            let mut parts = Vec::with_capacity(no);
            let mut lo = 0;
            for &size in &sizes {
                let len = if add_axis { 1 } else { size };
                parts.push((lo, len));
                lo += len;
            }
            by_dtype!(input.dtype(), split_typed(input, canon, &parts, add_axis))
                .map_err(|e| e.with_blob(name))?
        };
        for (j, t) in outs.into_iter().enumerate() {
            l.set_output(j, t);
        }
        Ok(true)
    }))
}

fn build_free(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    if ctx.num_inputs() != ctx.num_outputs() {
        return Err(ctx.bad_arg(format!(
            "Free needs as many outputs as inputs, got {} and {}",
            ctx.num_inputs(),
            ctx.num_outputs()
        )));
    }
    Ok(kernel(|cx| {
        for i in 0..cx.num_outputs() {
            cx.output_blob(i).set(BlobValue::Empty);
        }
        Ok(true)
    }))
}

fn build_zero_gradient(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|_| Ok(true)))
}

fn build_stop_gradient(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        if !l.aliases(0, 0) {
            let t = l.tensor(0)?.try_clone()?;
            l.set_output(0, t);
        }
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use super::{fmt_g, print_line};
    use crate::blob::{BlobValue, Counter};
    use crate::cancel::CancelToken;
    use crate::error::{Error, ErrorKind, Result};
    use crate::ir::{Argument, NetDef, OperatorDef};
    use crate::operator::create_operator;
    use crate::tensor::Tensor;
    use crate::test_util::{get as out, int_arg, ints_arg, op, run, string_arg, tensor, ws_with};
    use crate::workspace::Workspace;
    use ndarray::{ArrayD, IxDyn};
    use std::sync::Arc;

    fn strs(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }
    fn kind_blob(e: &Error) -> (ErrorKind, Option<&str>) {
        (e.kind, e.context.blob.as_deref())
    }
    fn build_err(ws: &Arc<Workspace>, d: &OperatorDef) -> Error {
        create_operator(d, ws).err().expect("building should fail")
    }

    // ------------------------------------------------------------- Copy --

    #[test]
    fn copy_is_deep() {
        let x = tensor(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]);
        let ws = ws_with(&[("x", x.clone()), ("s", tensor(&[2], strs(&["a", "b"])))]);
        run(&ws, &op("Copy", &["x"], &["y"], vec![])).unwrap();
        run(&ws, &op("EnsureCPUOutput", &["s"], &["s2"], vec![])).unwrap();
        ws.feed("x", BlobValue::Tensor(Tensor::scalar(0i32)));
        assert_eq!(out(&ws, "y"), x);
        assert_eq!(out(&ws, "s2"), tensor(&[2], strs(&["a", "b"])));
        // In place leaves the tensor as it was.
        run(&ws, &op("Copy", &["y"], &["y"], vec![])).unwrap();
        assert_eq!(out(&ws, "y"), x);
    }

    #[test]
    fn copy_of_a_non_tensor_is_a_type_error() {
        let ws = Workspace::new();
        ws.feed("c", BlobValue::Object(Arc::new(Counter::new(1))));
        ws.create_blob("empty");
        for ty in ["Copy", "EnsureCPUOutput"] {
            for (src, dst) in [("c", "y"), ("empty", "y"), ("c", "c")] {
                let e = run(&ws, &op(ty, &[src], &[dst], vec![])).unwrap_err();
                assert_eq!(kind_blob(&e), (ErrorKind::Type, Some(src)), "{ty} {e}");
            }
        }
        let e = run(&ws, &op("EnsureCPUOutput", &["c"], &["y"], vec![])).unwrap_err();
        assert_eq!(
            e.message,
            "unexpected input blob: it holds Counter but a Tensor was expected"
        );
        let e = run(&ws, &op("Copy", &["c"], &["y"], vec![])).unwrap_err();
        assert_eq!(
            e.message,
            "wrong kind of blob: it holds Counter but a Tensor was expected"
        );
        assert!(
            ws.fetch("y").unwrap().is_empty(),
            "nothing is written on failure"
        );
    }

    // ------------------------------------------------------------ Print --

    #[test]
    fn floats_print_like_a_cpp_stream() {
        let cases: &[(f64, &str)] = &[
            (1.0, "1"),
            (f64::from(0.1f32), "0.1"),
            (-2.5, "-2.5"),
            (0.5, "0.5"),
            (1.23456789, "1.23457"),
            (1234.5678, "1234.57"),
            (100000.0, "100000"),
            (1000000.0, "1e+06"),
            (999999.5, "1e+06"),
            (123456789.0, "1.23457e+08"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e-7, "1e-07"),
            (1.5e300, "1.5e+300"),
            (0.0, "0"),
            (-0.0, "-0"),
            (f64::NAN, "nan"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for &(v, want) in cases {
            assert_eq!(fmt_g(v), want, "{v}");
        }
    }

    #[test]
    fn print_line_format() {
        let x = tensor(&[2, 2], vec![1.0f32, 2.5, 3.0, 4.0]);
        assert_eq!(
            print_line("x", &x, 1000).unwrap(),
            "Tensor x of type float32. Dims: (2,2,): 1,2.5,3,4"
        );
        assert_eq!(
            print_line("x", &x, 2).unwrap(),
            "Tensor x of type float32. Dims: (2,2,): 1,2.5"
        );
        assert_eq!(
            print_line("s", &Tensor::scalar(5i64), 1000).unwrap(),
            "Tensor s of type int64. Dims: (): 5"
        );
        assert_eq!(
            print_line("b", &tensor(&[2], vec![true, false]), 9).unwrap(),
            "Tensor b of type bool. Dims: (2,): 1,0"
        );
        assert_eq!(
            print_line("u", &tensor(&[2], vec![7u8, 200]), 9).unwrap(),
            "Tensor u of type uint8. Dims: (2,): 7,200"
        );
        assert_eq!(
            print_line("d", &tensor(&[1], vec![1e-7f64]), 9).unwrap(),
            "Tensor d of type float64. Dims: (1,): 1e-07"
        );
        assert_eq!(
            print_line("i", &tensor(&[3], vec![-1i32, 0, 1]), 9).unwrap(),
            "Tensor i of type int32. Dims: (3,): -1,0,1"
        );
        assert_eq!(
            print_line("w", &tensor(&[2], strs(&["hello", "a b"])), 9).unwrap(),
            "Tensor w of type string. Dims: (2,): hello,a b"
        );
        // Empty tensors print only the meta, whatever their dtype.
        assert_eq!(
            print_line("e", &tensor(&[0, 3], Vec::<i8>::new()), 9).unwrap(),
            "Tensor e of type int8. Dims: (0,3,): "
        );
        for bad in [
            tensor(&[1], vec![1i8]),
            tensor(&[1], vec![1i16]),
            tensor(&[1], vec![1u16]),
        ] {
            let e = print_line("z", &bad, 9).unwrap_err();
            assert_eq!(kind_blob(&e), (ErrorKind::Type, Some("z")));
        }
    }

    fn temp_root(tag: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ferrocaffe-utility-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn print_to_file_every_n() {
        let root = temp_root("print");
        let ws = Workspace::with_root(root.to_str().unwrap());
        ws.feed("x", BlobValue::Tensor(tensor(&[3], vec![1i64, 2, 3])));
        let log = root.join("x.log");
        std::fs::write(&log, "stale\n").unwrap();
        let net = NetDef {
            name: Some("p".into()),
            op: vec![op(
                "Print",
                &["x"],
                &[],
                vec![
                    int_arg("to_file", 1),
                    int_arg("every_n", 2),
                    int_arg("limit", 2),
                ],
            )],
            ..Default::default()
        };
        ws.create_net(&net, false).unwrap();
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "",
            "truncated when the op is built"
        );
        for k in 1..=5i64 {
            ws.feed("x", BlobValue::Tensor(tensor(&[3], vec![k, 2, 3])));
            ws.run_net("p", 1, &CancelToken::new()).unwrap();
        }
        let text = std::fs::read_to_string(&log).unwrap();
        let want = "Tensor x of type int64. Dims: (3,): 1,2\n\
                    Tensor x of type int64. Dims: (3,): 3,2\n\
                    Tensor x of type int64. Dims: (3,): 5,2\n";
        assert_eq!(text, want, "runs 1, 3 and 5 print");
        // A non-tensor input logs its kind (not to the file) and succeeds.
        ws.feed("x", BlobValue::Object(Arc::new(Counter::new(0))));
        ws.run_net("p", 2, &CancelToken::new()).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), want);
        // Run 8 is not a printing run; run 9 is, and a non-supported dtype fails it.
        ws.run_net("p", 1, &CancelToken::new()).unwrap();
        ws.feed("x", BlobValue::Tensor(tensor(&[1], vec![1i8])));
        let e = ws.run_net("p", 1, &CancelToken::new()).unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Type, Some("x")));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn print_to_stderr_and_construction_errors() {
        let ws = ws_with(&[
            ("x", tensor(&[2], vec![0.25f32, 1.0])),
            ("e", tensor(&[0], Vec::<f32>::new())),
        ]);
        assert!(run(&ws, &op("Print", &["x"], &[], vec![])).unwrap());
        assert!(run(&ws, &op("Print", &["e"], &[], vec![])).unwrap());
        let e = build_err(&ws, &op("Print", &["x"], &[], vec![int_arg("every_n", 0)]));
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("every_n must be >= 1, got 0"), "{e}");
        let e = build_err(&ws, &op("Print", &["x"], &[], vec![int_arg("limit", -1)]));
        assert!(e.message.contains("limit must be >= 0"), "{e}");
        let e = build_err(
            &ws,
            &op("Print", &["x"], &[], vec![string_arg("to_file", "yes")]),
        );
        assert!(e.message.contains("expected field i"), "{e}");
        let e = build_err(&ws, &op("Print", &["x"], &["y"], vec![]));
        assert!(e.message.contains("takes 0 outputs"), "{e}");
        // A file that cannot be opened fails the construction.
        let missing = Workspace::with_root("/nonexistent-ferrocaffe-dir/sub");
        missing.feed("x", BlobValue::Tensor(Tensor::scalar(1.0f32)));
        let e = build_err(
            &missing,
            &op("Print", &["x"], &[], vec![int_arg("to_file", 1)]),
        );
        assert_eq!(kind_blob(&e), (ErrorKind::Io, Some("x")));
        assert_eq!(
            e.context.file.as_deref(),
            Some("/nonexistent-ferrocaffe-dir/sub/x.log")
        );
    }

    // -------------------------------------------------- GetAllBlobNames --

    #[test]
    fn get_all_blob_names() {
        let parent = ws_with(&[("p", Tensor::scalar(1i32)), ("a", Tensor::scalar(1i32))]);
        run(&parent, &op("GetAllBlobNames", &[], &["names"], vec![])).unwrap();
        assert_eq!(
            out(&parent, "names"),
            tensor(&[3], strs(&["a", "names", "p"]))
        );
        let child = Workspace::new_child(&parent);
        child.feed("c", BlobValue::Tensor(Tensor::scalar(1i32)));
        run(
            &child,
            &op(
                "GetAllBlobNames",
                &[],
                &["all"],
                vec![int_arg("include_shared", 1)],
            ),
        )
        .unwrap();
        assert_eq!(
            out(&child, "all"),
            tensor(&[5], strs(&["a", "all", "c", "names", "p"]))
        );
        run(
            &child,
            &op(
                "GetAllBlobNames",
                &[],
                &["local"],
                vec![int_arg("include_shared", 0)],
            ),
        )
        .unwrap();
        assert_eq!(
            out(&child, "local"),
            tensor(&[3], strs(&["all", "c", "local"]))
        );
        let e = build_err(&child, &op("GetAllBlobNames", &["c"], &["n"], vec![]));
        assert!(e.message.contains("takes 0 inputs"), "{e}");
    }

    // ---------------------------------------------------------- IsEmpty --

    #[test]
    fn is_empty() {
        let ws = ws_with(&[
            ("e", tensor(&[0, 3], Vec::<f32>::new())),
            ("s", Tensor::scalar(1i64)),
            ("v", tensor(&[2], strs(&["", ""]))),
        ]);
        for (x, want) in [("e", true), ("s", false), ("v", false)] {
            run(&ws, &op("IsEmpty", &[x], &["r"], vec![])).unwrap();
            assert_eq!(out(&ws, "r"), Tensor::scalar(want), "{x}");
        }
        ws.feed("c", BlobValue::Object(Arc::new(Counter::new(1))));
        let e = run(&ws, &op("IsEmpty", &["c"], &["r"], vec![])).unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Type, Some("c")));
        assert!(
            create_operator(&op("IsEmpty", &["e"], &["e"], vec![]), &ws).is_err(),
            "no in place"
        );
    }

    // -------------------------------------------------- LengthsToRanges --

    #[test]
    fn lengths_to_ranges() {
        let ws = ws_with(&[
            ("l", tensor(&[4], vec![2i32, 3, 0, 1])),
            ("z", tensor(&[0], Vec::<i32>::new())),
        ]);
        run(&ws, &op("LengthsToRanges", &["l"], &["r"], vec![])).unwrap();
        assert_eq!(
            out(&ws, "r"),
            tensor(&[4, 2], vec![0i32, 2, 2, 3, 5, 0, 5, 1])
        );
        run(&ws, &op("LengthsToRanges", &["z"], &["r"], vec![])).unwrap();
        assert_eq!(out(&ws, "r"), tensor(&[0, 2], Vec::<i32>::new()));
        // The last offset may be i32::MAX; only offsets that are written must fit.
        ws.feed("m", BlobValue::Tensor(tensor(&[2], vec![i32::MAX, 1])));
        run(&ws, &op("LengthsToRanges", &["m"], &["r"], vec![])).unwrap();
        assert_eq!(
            out(&ws, "r"),
            tensor(&[2, 2], vec![0, i32::MAX, i32::MAX, 1])
        );
        let bad: [(Tensor, ErrorKind); 4] = [
            (tensor(&[1, 2], vec![1i32, 2]), ErrorKind::Shape),
            (tensor(&[2], vec![1i64, 2]), ErrorKind::Type),
            (tensor(&[2], vec![1i32, -2]), ErrorKind::InvalidArgument),
            (
                tensor(&[3], vec![i32::MAX, 1, 1]),
                ErrorKind::InvalidArgument,
            ),
        ];
        for (x, kind) in bad {
            ws.feed("b", BlobValue::Tensor(x));
            let e = run(&ws, &op("LengthsToRanges", &["b"], &["r"], vec![])).unwrap_err();
            assert_eq!(kind_blob(&e), (kind, Some("b")), "{e}");
        }
    }

    // ---------------------------------------------------- ScatterAssign --

    fn scatter(data: Tensor, idx: Tensor, slices: Tensor) -> (Arc<Workspace>, Result<bool>) {
        let ws = ws_with(&[("d", data), ("i", idx), ("s", slices)]);
        let r = run(&ws, &op("ScatterAssign", &["d", "i", "s"], &["d"], vec![]));
        (ws, r)
    }

    #[test]
    fn scatter_assign_rows() {
        let data = tensor(&[4, 2], vec![0.0f32; 8]);
        let slices = tensor(&[3, 2], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let (ws, r) = scatter(data.clone(), tensor(&[3], vec![3i64, 1, 3]), slices.clone());
        r.unwrap();
        assert_eq!(
            out(&ws, "d"),
            tensor(&[4, 2], vec![0.0f32, 0.0, 3.0, 4.0, 0.0, 0.0, 5.0, 6.0]),
            "last duplicate wins"
        );
        // int32 indices, int64 data, slices of another shape with the right count.
        let (ws, r) = scatter(
            tensor(&[3], vec![0i64; 3]),
            tensor(&[1, 2], vec![2i32, 0]),
            tensor(&[2], vec![7i64, 8]),
        );
        r.unwrap();
        assert_eq!(out(&ws, "d"), tensor(&[3], vec![8i64, 0, 7]));
        // A DATA tensor that is not in standard layout is handled in logical order.
        let transposed = Tensor::from(
            ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
                .unwrap()
                .reversed_axes(),
        );
        let (ws, r) = scatter(
            transposed,
            tensor(&[1], vec![1i32]),
            tensor(&[1, 2], vec![9.0f64, 9.5]),
        );
        r.unwrap();
        assert_eq!(
            out(&ws, "d"),
            tensor(&[3, 2], vec![1.0f64, 4.0, 9.0, 9.5, 3.0, 6.0])
        );
        // Every DATA dtype Caffe2 supports on the CPU.
        let (ws, r) = scatter(
            tensor(&[2], vec![0u8, 0]),
            tensor(&[1], vec![1i32]),
            tensor(&[1], vec![5u8]),
        );
        r.unwrap();
        assert_eq!(out(&ws, "d"), tensor(&[2], vec![0u8, 5]));
        let (ws, r) = scatter(
            tensor(&[2], vec![0i32, 0]),
            tensor(&[0], Vec::<i32>::new()),
            tensor(&[0], Vec::<i32>::new()),
        );
        r.unwrap();
        assert_eq!(out(&ws, "d"), tensor(&[2], vec![0i32, 0]));
    }

    #[test]
    fn scatter_assign_checks_indices() {
        let data = tensor(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]);
        for idx in [
            tensor(&[2], vec![0i64, 2]),
            tensor(&[1], vec![-1i64]),
            tensor(&[1], vec![2i32]),
        ] {
            let n = idx.numel();
            let (ws, r) = scatter(data.clone(), idx, tensor(&[n, 2], vec![9.0f32; 2 * n]));
            let e = r.unwrap_err();
            assert_eq!(
                kind_blob(&e),
                (ErrorKind::IndexOutOfRange, Some("i")),
                "{e}"
            );
            assert_eq!(out(&ws, "d"), data, "no partial write");
        }
        // An empty first dim makes every index out of range.
        let (_, r) = scatter(
            tensor(&[0, 2], Vec::<f32>::new()),
            tensor(&[1], vec![0i64]),
            tensor(&[2], vec![1.0f32, 2.0]),
        );
        assert_eq!(
            kind_blob(&r.unwrap_err()),
            (ErrorKind::IndexOutOfRange, Some("i"))
        );
    }

    #[test]
    fn scatter_assign_type_and_shape_errors() {
        let data = tensor(&[2, 2], vec![0.0f32; 4]);
        let cases: [(Tensor, Tensor, Tensor, ErrorKind, &str); 6] = [
            (
                data.clone(),
                tensor(&[1], vec![0i64]),
                tensor(&[3], vec![1.0f32; 3]),
                ErrorKind::Shape,
                "s",
            ),
            (
                data.clone(),
                tensor(&[1], vec![0i64]),
                tensor(&[2], vec![1.0f64; 2]),
                ErrorKind::Type,
                "s",
            ),
            (
                data.clone(),
                tensor(&[1], vec![0.0f32]),
                tensor(&[2], vec![1.0f32; 2]),
                ErrorKind::Type,
                "i",
            ),
            (
                tensor(&[2], vec![true, false]),
                tensor(&[1], vec![0i64]),
                tensor(&[1], vec![true]),
                ErrorKind::Type,
                "d",
            ),
            (
                Tensor::scalar(1.0f32),
                tensor(&[1], vec![0i64]),
                tensor(&[1], vec![1.0f32]),
                ErrorKind::Shape,
                "d",
            ),
            (
                tensor(&[2], strs(&["a", "b"])),
                tensor(&[1], vec![0i64]),
                tensor(&[1], strs(&["c"])),
                ErrorKind::Type,
                "d",
            ),
        ];
        for (d, i, s, kind, blob) in cases {
            let (_, r) = scatter(d, i, s);
            let e = r.unwrap_err();
            assert_eq!(kind_blob(&e), (kind, Some(blob)), "{e}");
        }
        // In place is enforced by the schema.
        let ws = ws_with(&[
            ("d", data.clone()),
            ("i", tensor(&[1], vec![0i64])),
            ("s", tensor(&[2], vec![1.0f32; 2])),
        ]);
        let e = build_err(&ws, &op("ScatterAssign", &["d", "i", "s"], &["o"], vec![]));
        assert!(
            e.message
                .contains("requires output 0 to be the same blob as input 0"),
            "{e}"
        );
        let e = build_err(&ws, &op("ScatterAssign", &["d", "i", "d"], &["d"], vec![]));
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    // ----------------------------------------------------------- Concat --

    fn concat(inputs: &[(&str, Tensor)], args: Vec<Argument>) -> Result<(Tensor, Tensor)> {
        let ws = ws_with(inputs);
        let names: Vec<&str> = inputs.iter().map(|(n, _)| *n).collect();
        run(&ws, &op("Concat", &names, &["y", "split"], args))?;
        Ok((out(&ws, "y"), out(&ws, "split")))
    }

    #[test]
    fn concat_along_an_axis() {
        let a = tensor(&[2, 1], vec![1i32, 2]);
        let b = tensor(&[2, 2], vec![3i32, 4, 5, 6]);
        let (y, s) = concat(&[("a", a.clone()), ("b", b.clone())], vec![]).unwrap();
        assert_eq!(
            y,
            tensor(&[2, 3], vec![1i32, 3, 4, 2, 5, 6]),
            "axis 1 by default"
        );
        assert_eq!(s, tensor(&[2], vec![1i32, 2]));
        let (y, _) = concat(
            &[("a", a.clone()), ("b", b.clone())],
            vec![int_arg("axis", -1)],
        )
        .unwrap();
        assert_eq!(y, tensor(&[2, 3], vec![1i32, 3, 4, 2, 5, 6]));
        let (y, s) = concat(
            &[("b", b.clone()), ("c", tensor(&[1, 2], vec![7i32, 8]))],
            vec![int_arg("axis", 0)],
        )
        .unwrap();
        assert_eq!(y, tensor(&[3, 2], vec![3i32, 4, 5, 6, 7, 8]));
        assert_eq!(s, tensor(&[2], vec![2i32, 1]));
        let (y, s) = concat(
            &[("a", tensor(&[2], strs(&["x", "y"])))],
            vec![int_arg("axis", 0)],
        )
        .unwrap();
        assert_eq!(
            (y, s),
            (tensor(&[2], strs(&["x", "y"])), tensor(&[1], vec![2i32]))
        );
        // add_axis stacks along a new axis.
        let p = tensor(&[2], vec![1.0f32, 2.0]);
        let q = tensor(&[2], vec![3.0f32, 4.0]);
        let (y, s) = concat(
            &[("p", p.clone()), ("q", q.clone())],
            vec![int_arg("axis", 1), int_arg("add_axis", 1)],
        )
        .unwrap();
        assert_eq!(
            (y, s),
            (
                tensor(&[2, 2], vec![1.0f32, 3.0, 2.0, 4.0]),
                tensor(&[2], vec![1i32, 1])
            )
        );
        let (y, _) = concat(
            &[("p", p), ("q", q)],
            vec![int_arg("axis", 0), int_arg("add_axis", 1)],
        )
        .unwrap();
        assert_eq!(y, tensor(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]));
        let (y, _) = concat(
            &[("p", Tensor::scalar(1u8)), ("q", Tensor::scalar(2u8))],
            vec![int_arg("axis", 0), int_arg("add_axis", 1)],
        )
        .unwrap();
        assert_eq!(y, tensor(&[2], vec![1u8, 2]));
        // order NHWC joins along axis 3.
        let n1 = tensor(&[1, 1, 1, 2], vec![1i64, 2]);
        let n2 = tensor(&[1, 1, 1, 1], vec![3i64]);
        let (y, s) = concat(&[("n1", n1), ("n2", n2)], vec![string_arg("order", "NHWC")]).unwrap();
        assert_eq!(
            (y, s),
            (
                tensor(&[1, 1, 1, 3], vec![1i64, 2, 3]),
                tensor(&[2], vec![2i32, 1])
            )
        );
    }

    #[test]
    fn concat_errors() {
        let a = tensor(&[2, 1], vec![1i32, 2]);
        type Case<'a> = (Vec<(&'a str, Tensor)>, Vec<Argument>, ErrorKind, &'a str);
        let cases: [Case<'_>; 6] = [
            (
                vec![("a", a.clone()), ("b", tensor(&[2, 1], vec![1i64, 2]))],
                vec![],
                ErrorKind::Type,
                "b",
            ),
            (
                vec![("a", a.clone()), ("b", tensor(&[3, 1], vec![1i32, 2, 3]))],
                vec![],
                ErrorKind::Shape,
                "b",
            ),
            (
                vec![("a", a.clone()), ("b", tensor(&[2], vec![1i32, 2]))],
                vec![],
                ErrorKind::Shape,
                "b",
            ),
            (
                vec![("a", a.clone()), ("b", a.clone())],
                vec![int_arg("axis", 2)],
                ErrorKind::InvalidArgument,
                "a",
            ),
            (
                vec![("a", a.clone()), ("b", a.clone())],
                vec![int_arg("axis", -3)],
                ErrorKind::InvalidArgument,
                "a",
            ),
            (
                vec![("a", Tensor::scalar(1i32)), ("b", Tensor::scalar(2i32))],
                vec![int_arg("axis", 0)],
                ErrorKind::InvalidArgument,
                "a",
            ),
        ];
        for (inputs, args, kind, blob) in cases {
            let e = concat(&inputs, args).unwrap_err();
            assert_eq!(kind_blob(&e), (kind, Some(blob)), "{e}");
        }
        let e = concat(
            &[("a", a.clone()), ("b", tensor(&[2, 2], vec![0i32; 4]))],
            vec![int_arg("axis", 1), int_arg("add_axis", 1)],
        )
        .unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Shape, Some("b")));
        // Construction errors.
        let ws = ws_with(&[("a", a)]);
        let e = build_err(
            &ws,
            &op(
                "Concat",
                &["a"],
                &["y", "s"],
                vec![int_arg("axis", 0), string_arg("order", "NCHW")],
            ),
        );
        assert!(e.message.contains("both the axis"), "{e}");
        let e = build_err(
            &ws,
            &op(
                "Concat",
                &["a"],
                &["y", "s"],
                vec![string_arg("order", "CHWN")],
            ),
        );
        assert!(
            e.message.contains("unsupported storage order 'CHWN'"),
            "{e}"
        );
        let e = build_err(
            &ws,
            &op("Concat", &["a"], &["y", "s"], vec![string_arg("axis", "1")]),
        );
        assert!(e.message.contains("expected field i"), "{e}");
        let e = build_err(&ws, &op("Concat", &["a"], &["y"], vec![]));
        assert!(e.message.contains("takes 2 outputs"), "{e}");
        let e = build_err(&ws, &op("Concat", &["a"], &["a", "s"], vec![]));
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    // ------------------------------------------------------------ Split --

    fn split(inputs: &[(&str, Tensor)], outs: &[&str], args: Vec<Argument>) -> Result<Vec<Tensor>> {
        let ws = ws_with(inputs);
        let names: Vec<&str> = inputs.iter().map(|(n, _)| *n).collect();
        run(&ws, &op("Split", &names, outs, args))?;
        Ok(outs.iter().map(|o| out(&ws, o)).collect())
    }

    #[test]
    fn split_by_argument_input_or_equal_parts() {
        // [[0 1 2 3 4], [5 6 7 8 9]]
        let x = tensor(&[2, 5], (0..10).collect::<Vec<i32>>());
        // Axis 1 by default; sizes from the argument.
        let got = split(
            &[("x", x.clone())],
            &["a", "b"],
            vec![ints_arg("split", &[2, 3])],
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                tensor(&[2, 2], vec![0, 1, 5, 6]),
                tensor(&[2, 3], vec![2, 3, 4, 7, 8, 9])
            ]
        );
        // Sizes from a second input; a zero size gives an empty part.
        let got = split(
            &[("x", x.clone()), ("s", tensor(&[3], vec![4i32, 0, 1]))],
            &["a", "b", "c"],
            vec![int_arg("axis", -1)],
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                tensor(&[2, 4], vec![0, 1, 2, 3, 5, 6, 7, 8]),
                tensor(&[2, 0], Vec::<i32>::new()),
                tensor(&[2, 1], vec![4, 9])
            ]
        );
        // Equal parts along axis 0; strings too.
        let w = tensor(&[4], strs(&["a", "b", "c", "d"]));
        let got = split(&[("w", w)], &["p", "q"], vec![int_arg("axis", 0)]).unwrap();
        assert_eq!(
            got,
            vec![
                tensor(&[2], strs(&["a", "b"])),
                tensor(&[2], strs(&["c", "d"]))
            ]
        );
        // add_axis removes the axis: undoes Concat(add_axis=1).
        let got = split(
            &[("x", x.clone())],
            &["r0", "r1"],
            vec![int_arg("axis", 0), int_arg("add_axis", 1)],
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                tensor(&[5], vec![0, 1, 2, 3, 4]),
                tensor(&[5], vec![5, 6, 7, 8, 9])
            ]
        );
        // NHWC splits along axis 3.
        let n = tensor(&[1, 1, 1, 4], vec![1.0f64, 2.0, 3.0, 4.0]);
        let got = split(
            &[("n", n)],
            &["u", "v"],
            vec![string_arg("order", "NHWC"), ints_arg("split", &[3, 1])],
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                tensor(&[1, 1, 1, 3], vec![1.0f64, 2.0, 3.0]),
                tensor(&[1, 1, 1, 1], vec![4.0f64])
            ]
        );
    }

    #[test]
    fn split_then_concat_round_trips() {
        let x = tensor(&[3, 4], (0..12).map(|v| v as f32).collect::<Vec<_>>());
        let ws = ws_with(&[("x", x.clone())]);
        let args = || vec![int_arg("axis", 1), ints_arg("split", &[1, 3])];
        run(&ws, &op("Split", &["x"], &["a", "b"], args())).unwrap();
        run(
            &ws,
            &op(
                "Concat",
                &["a", "b"],
                &["y", "info"],
                vec![int_arg("axis", 1)],
            ),
        )
        .unwrap();
        assert_eq!(out(&ws, "y"), x);
        assert_eq!(out(&ws, "info"), tensor(&[2], vec![1i32, 3]));
        // The old names are the same ops.
        run(
            &ws,
            &op(
                "DepthSplit",
                &["x", "info"],
                &["c", "d"],
                vec![int_arg("axis", 1)],
            ),
        )
        .unwrap();
        run(
            &ws,
            &op(
                "DepthConcat",
                &["c", "d"],
                &["z", "info2"],
                vec![int_arg("axis", 1)],
            ),
        )
        .unwrap();
        assert_eq!(out(&ws, "z"), x);
    }

    #[test]
    fn split_errors_name_the_blob_and_leave_outputs_alone() {
        let x = tensor(&[2, 5], (0..10).collect::<Vec<i32>>());
        type Case<'a> = (
            Vec<(&'a str, Tensor)>,
            Vec<&'a str>,
            Vec<Argument>,
            ErrorKind,
            &'a str,
        );
        let cases: Vec<Case<'_>> = vec![
            // sizes do not add up to the axis
            (
                vec![("x", x.clone())],
                vec!["a", "b"],
                vec![ints_arg("split", &[2, 2])],
                ErrorKind::InvalidArgument,
                "x",
            ),
            // not divisible into equal parts
            (
                vec![("x", x.clone())],
                vec!["a", "b"],
                vec![],
                ErrorKind::InvalidArgument,
                "x",
            ),
            // axis out of range
            (
                vec![("x", x.clone())],
                vec!["a"],
                vec![int_arg("axis", 2)],
                ErrorKind::InvalidArgument,
                "x",
            ),
            (
                vec![("x", x.clone())],
                vec!["a"],
                vec![int_arg("axis", -3)],
                ErrorKind::InvalidArgument,
                "x",
            ),
            (
                vec![("x", Tensor::scalar(1i32))],
                vec!["a"],
                vec![int_arg("axis", 0)],
                ErrorKind::InvalidArgument,
                "x",
            ),
            // the sizes input: wrong dtype, wrong count, negative
            (
                vec![("x", x.clone()), ("s", tensor(&[2], vec![2i64, 3]))],
                vec!["a", "b"],
                vec![],
                ErrorKind::Type,
                "s",
            ),
            (
                vec![("x", x.clone()), ("s", tensor(&[1], vec![5i32]))],
                vec!["a", "b"],
                vec![],
                ErrorKind::InvalidArgument,
                "s",
            ),
            (
                vec![("x", x.clone()), ("s", tensor(&[2], vec![-1i32, 6]))],
                vec!["a", "b"],
                vec![],
                ErrorKind::InvalidArgument,
                "s",
            ),
            // add_axis needs one output per index
            (
                vec![("x", x.clone())],
                vec!["a", "b", "c"],
                vec![int_arg("axis", 0), int_arg("add_axis", 1)],
                ErrorKind::InvalidArgument,
                "x",
            ),
            // not a tensor
            (
                vec![("x", x.clone())],
                vec!["a"],
                vec![],
                ErrorKind::Type,
                "x",
            ),
        ];
        for (k, (inputs, outs, args, kind, blob)) in cases.into_iter().enumerate() {
            let ws = ws_with(&inputs);
            if k == 9 {
                ws.feed("x", BlobValue::Object(Arc::new(Counter::new(1))));
            }
            ws.feed("a", BlobValue::Tensor(Tensor::scalar(7i32)));
            let names: Vec<&str> = inputs.iter().map(|(n, _)| *n).collect();
            let e = run(&ws, &op("Split", &names, &outs, args)).unwrap_err();
            assert_eq!(kind_blob(&e), (kind, Some(blob)), "case {k}: {e}");
            assert_eq!(
                out(&ws, "a"),
                Tensor::scalar(7i32),
                "case {k}: output changed"
            );
        }
        // Construction errors.
        let ws = ws_with(&[("x", x.clone()), ("s", tensor(&[2], vec![2i32, 3]))]);
        let cases: Vec<(Vec<&str>, Vec<&str>, Vec<Argument>, &str)> = vec![
            (
                vec!["x", "s"],
                vec!["a", "b"],
                vec![ints_arg("split", &[2, 3])],
                "do not pass in split",
            ),
            (
                vec!["x"],
                vec!["a", "b"],
                vec![ints_arg("split", &[5])],
                "should be equal to the number of outputs",
            ),
            (
                vec!["x"],
                vec!["a", "b"],
                vec![ints_arg("split", &[6, -1])],
                "must be >= 0",
            ),
            (
                vec!["x"],
                vec!["a"],
                vec![int_arg("axis", 0), string_arg("order", "NCHW")],
                "both the axis to split",
            ),
            (
                vec!["x"],
                vec!["a"],
                vec![string_arg("order", "HWCN")],
                "unsupported storage order",
            ),
            (vec!["x"], vec![], vec![], "takes at least 1 outputs"),
            (vec!["x"], vec!["x"], vec![], "in-place"),
        ];
        for (ins, outs, args, msg) in cases {
            let e = build_err(&ws, &op("Split", &ins, &outs, args));
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
            assert!(e.message.contains(msg), "{msg}: {e}");
        }
    }
}
