//! Shape and layout ops: Shape, Size, Alias, Range, Transpose, Slice, Where,
//! LengthsToSegmentIds, Tile and Expand (and the gradients of Slice, Tile and
//! Expand).

use super::elementwise::{numpy_shape, Shape};
use super::kit::canonical_axis;
use super::kit::kernel;
use crate::arg;
use crate::error::{Error, Result};
use crate::num::Number;
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::{checked_numel, copy_array, try_collect, try_vec, DataType, Element, Tensor};
use ndarray::{ArrayD, ArrayViewD, IxDyn, Slice};

fn in_place_0_0(i: usize, o: usize) -> bool {
    i == 0 && o == 0
}

pub fn schemas() -> Vec<OpSchema> {
    let mut v = vec![
        OpSchema::new("Shape", shape)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(&[arg!(
                "axes",
                "ints",
                "all",
                "only these dims, in this order (each in [0, ndim))"
            )])
            .doc("Outputs the input's dims as a 1-D int64 tensor."),
        OpSchema::new("Size", size)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Outputs the input's number of elements as an int64 scalar."),
        OpSchema::new("Alias", alias)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .doc(
                "Makes the output hold the input's content. Caffe2 shares the memory; here the output is a \
                 copy (see porting.md), so later writes to one are not seen in the other.",
            ),
        OpSchema::new("Range", range)
            .inputs(1, 3)
            .outputs(1, 1)
            .doc(
                "numpy.arange over scalar inputs: (stop), (start, stop) or (start, stop, step), all of one dtype \
                 (int32, int64, float32 or float64), which the 1-D output has. step must not be 0.",
            ),
        OpSchema::new("Transpose", transpose)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(&[arg!(
                "axes",
                "ints",
                "reversed dims",
                "a permutation of the input's dims: output dim i is input dim axes[i]"
            )])
            .doc("Permutes the input's dims (any dtype)."),
        OpSchema::new("NHWC2NCHW", order_switch)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Moves the last dim to dim 1: (N, spatial..., C) -> (N, C, spatial...), for 3 or more dims (any dtype). Its gradient is NCHW2NHWC."),
        OpSchema::new("NCHW2NHWC", order_switch)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Moves dim 1 last: (N, C, spatial...) -> (N, spatial..., C), for 3 or more dims (any dtype). Its gradient is NHWC2NCHW."),
        OpSchema::new("Slice", slice)
            .inputs(1, 3)
            .outputs(1, 1)
            .args(SLICE_ARGS)
            .doc(
                "Copies data[starts[0]:ends[0], starts[1]:ends[1], ...]; dims past the given ones are kept whole. \
                 starts and ends come from the arguments or from int32/int64 1-D inputs 1 and 2. A negative index \
                 i means dim + 1 + i; indices past the dim are clipped; end must not be before start.",
            ),
        OpSchema::new("SliceGradient", slice)
            .inputs(2, 4)
            .outputs(1, 1)
            .args(SLICE_ARGS)
            .doc(
                "Gradient of Slice (Caffe2's SliceGradient): inputs (data, dY) or (data, starts, ends, dY), \
                 output dX, zeros of data's shape with dY written where Slice took its output from (float32 or \
                 float64 dY; data gives only the shape).",
            ),
        OpSchema::new("Where", where_op)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(&[arg!(
                "broadcast_on_rows",
                "bool",
                "false",
                "C is 1-D and picks whole rows (its length is X's first dim)"
            )])
            .doc(
                "Inputs (C, X, Y): C[i] ? X[i] : Y[i], with numpy broadcasting of the three (Caffe2 required equal \
                 shapes; equal shapes give its result). C is bool; X and Y share a dtype, which the output has.",
            ),
        OpSchema::new("LengthsToSegmentIds", lengths_to_segment_ids)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("1-D int32 lengths -> int32 segment ids: i repeated lengths[i] times."),
        OpSchema::new("LengthsRangeFill", lengths_to_segment_ids)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("1-D int32 lengths -> int32 ranges 0..lengths[i], concatenated."),
        OpSchema::new("Tile", tile)
            .inputs(1, 3)
            .outputs(1, 1)
            .args(TILE_ARGS)
            .doc("Repeats X `tiles` times along `axis` (X concatenated with itself), any dtype; tiles and axis from the arguments or from one-element int32/int64 inputs 1 and 2."),
        OpSchema::new("TileGradient", tile)
            .inputs(1, 3)
            .outputs(1, 1)
            .args(TILE_ARGS)
            .doc("Gradient of Tile: input dY (and Tile's tiles and axis inputs), output dX, the sum of dY's `tiles` blocks along `axis` (float32 or float64)."),
        OpSchema::new("Expand", expand)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Broadcasts X (any dtype) to numpy's broadcast of X's shape with input 1, a 1-D int32/int64 shape (Caffe2's Expand: a 1 in the shape keeps X's dim)."),
        OpSchema::new("ExpandGradient", expand_grad)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Gradient of Expand: inputs (dY, X), output dX: dY summed over the dims X was broadcast along (float32 or float64)."),
    ];
    v.extend(reshape_schemas());
    v
}

const SLICE_ARGS: &[crate::operator::ArgDoc] = &[
    arg!(
        "starts",
        "ints",
        "none",
        "first index of each leading dim (or input 1)"
    ),
    arg!(
        "ends",
        "ints",
        "none",
        "end of each leading dim, exclusive; negative e means dim + 1 + e, so -1 is the end (or input 2)"
    ),
];

const TILE_ARGS: &[crate::operator::ArgDoc] = &[
    arg!(
        "tiles",
        "int",
        "1",
        "how many copies (>= 0), unless input 1 gives it"
    ),
    arg!(
        "axis",
        "int",
        "0",
        "the dim tiled (negative: from the end), unless input 2 gives it"
    ),
];

// ------------------------------------------------------------ Shape, Size --

fn shape(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    // An empty list means every dim, as in Caffe2.
    let axes = ctx.args.ints("axes")?.filter(|a| !a.is_empty());
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let name = l.input_name(0);
        let dims = l.tensor(0)?.shape();
        let out: Vec<i64> = match &axes {
            None => dims.iter().map(|&d| d as i64).collect(),
            Some(axes) => axes
                .iter()
                .map(|&a| {
                    if a < 0 || a >= dims.len() as i64 {
                        Err(Error::invalid_arg(format!(
                            "axis {a} is out of range for an input of {} dims",
                            dims.len()
                        ))
                        .with_blob(name))
                    } else {
                        Ok(dims[a as usize] as i64)
                    }
                })
                .collect::<Result<_>>()?,
        };
        let t = Tensor::from_vec(&[out.len()], out)?;
        l.set_output(0, t);
        Ok(true)
    }))
}

fn size(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let n = l.tensor(0)?.numel() as i64;
        l.set_output(0, Tensor::scalar(n));
        Ok(true)
    }))
}

// ----------------------------------------------------------------- Alias --

fn alias(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let t = l.tensor(0)?;
        if l.aliases(0, 0) {
            return Ok(true);
        }
        let t = t.try_clone()?;
        l.set_output(0, t);
        Ok(true)
    }))
}

// ----------------------------------------------------------------- Range --

/// ceil((stop - start) / step) values of Range, or None when they do not
/// fit (integers counted exactly, floats in float64).
fn range_count<T: Number>(start: T, stop: T, step: T) -> Option<usize> {
    if T::INT {
        let (d, s) = (
            i128::from(stop.to_i64()) - i128::from(start.to_i64()),
            i128::from(step.to_i64()),
        );
        // ceil(d / s), computed with a positive divisor.
        let (d, s) = if s < 0 { (-d, -s) } else { (d, s) };
        let n = (d + s - 1).div_euclid(s);
        usize::try_from(n.max(0)).ok()
    } else {
        let n = ((stop.to_f64() - start.to_f64()) / step.to_f64()).ceil();
        if n.is_nan() || n >= usize::MAX as f64 {
            None
        } else {
            Some(n.max(0.0) as usize)
        }
    }
}

/// Range's value `i`: start + step * i (integers computed exactly, then
/// wrapped to the type; floats in the type's arithmetic).
fn range_nth<T: Number>(start: T, step: T, i: usize) -> T {
    if T::INT {
        let v = i128::from(start.to_i64()) + i128::from(step.to_i64()) * i as i128;
        T::of_wrapped(v as i64)
    } else {
        start.wrapping_plus(step.wrapping_times(T::of(i as f64)))
    }
}

fn range_of<T: Number>(l: &crate::operator::Locked<'_>, n: usize) -> Result<Tensor> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let t = l.tensor(i)?;
        if t.numel() != 1 || t.ndim() > 1 {
            return Err(Error::shape(format!(
                "Range's inputs must be scalars, got shape {:?}",
                t.shape()
            ))
            .with_blob(l.input_name(i)));
        }
        let a = t.array::<T>().map_err(|e| e.with_blob(l.input_name(i)))?;
        v.push(*a.iter().next().expect("one element"));
    }
    let (start, stop, step) = match v[..] {
        [stop] => (T::ZERO, stop, None),
        [start, stop] => (start, stop, None),
        [start, stop, step] => (start, stop, Some(step)),
        _ => unreachable!("the schema allows 1 to 3 inputs"),
    };
    let step = match step {
        Some(s) if s == T::ZERO => {
            return Err(Error::invalid_arg("Step size cannot be 0").with_blob(l.input_name(2)))
        }
        Some(s) => s,
        None => T::ONE,
    };
    let count = range_count(start, stop, step).ok_or_else(|| {
        Error::invalid_arg(format!(
            "the range {start:?}..{stop:?} by {step:?} is too long"
        ))
        .with_blob(l.input_name(0))
    })?;
    let mut out = try_vec(count, format_args!("a range of {count} elements"))?;
    out.extend((0..count).map(|i| range_nth(start, step, i)));
    Tensor::from_vec(&[count], out)
}

fn range(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let n = ctx.num_inputs();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let dt = l.tensor(0)?.dtype();
        let t = crate::with_match_dtype!(arith dt, |T| range_of::<T>(&l, n)?, else other => {
            return Err(Error::type_error(format!(
                "Range supports {}, got {other}",
                crate::tensor::dtype_list(DataType::ARITH)
            ))
            .with_blob(l.input_name(0)));
        });
        l.set_output(0, t);
        Ok(true)
    }))
}

// ------------------------------------------------------------- Transpose --

fn transpose_of<T: Element>(t: &Tensor, axes: &[usize]) -> Result<Tensor> {
    let a = t.array::<T>()?.view().permuted_axes(IxDyn(axes));
    Ok(T::wrap(copy_array(a)?))
}

/// Transpose's `axes` for an input of `nd` dims: the permutation (the dims
/// reversed when not given), or an error naming the input blob.
pub(crate) fn permutation(axes: Option<&[i64]>, nd: usize, name: &str) -> Result<Vec<usize>> {
    let Some(axes) = axes else {
        return Ok((0..nd).rev().collect());
    };
    let mut seen = vec![false; nd];
    let ok = axes.len() == nd
        && axes.iter().all(|&a| {
            a >= 0 && (a as usize) < nd && !std::mem::replace(&mut seen[a as usize], true)
        });
    if !ok {
        return Err(Error::invalid_arg(format!(
            "axes {axes:?} is not a permutation of the {nd} dims of the input"
        ))
        .with_blob(name));
    }
    Ok(axes.iter().map(|&a| a as usize).collect())
}

/// `t` with its dims permuted (any dtype).
pub(crate) fn transposed(t: &Tensor, perm: &[usize]) -> Result<Tensor> {
    crate::with_match_dtype!(t.dtype(), |T| transpose_of::<T>(t, perm),
        else other => Err(crate::tensor::unsupported_dtype(other)))
}

fn transpose(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axes = ctx.args.ints("axes")?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let name = l.input_name(0);
        let t = l.tensor(0)?;
        let perm = permutation(axes.as_deref(), t.ndim(), name)?;
        let out = transposed(t, &perm)?;
        l.set_output(0, out);
        Ok(true)
    }))
}

/// NHWC2NCHW and NCHW2NHWC: a transpose moving the channel dim.
fn order_switch(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let to_nchw = ctx.op_type() == "NHWC2NCHW";
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let name = l.input_name(0);
        let t = l.tensor(0)?;
        let nd = t.ndim();
        if nd < 3 {
            return Err(Error::shape(format!(
                "{op}: the input ('{name}', shape {:?}) must have at least 3 dims",
                t.shape()
            ))
            .with_blob(name));
        }
        let perm: Vec<usize> = if to_nchw {
            [0, nd - 1].into_iter().chain(1..nd - 1).collect()
        } else {
            [0].into_iter().chain(2..nd).chain([1]).collect()
        };
        let out = crate::with_match_dtype!(t.dtype(), |T| transpose_of::<T>(t, &perm),
            else other => Err(crate::tensor::unsupported_dtype(other)))?;
        l.set_output(0, out);
        Ok(true)
    }))
}

// ------------------------------------------------------- Tile and Expand --

/// The one int32/int64 value of input `i` (Tile's tiles and axis inputs).
fn scalar_int(l: &crate::operator::Locked<'_>, op: &str, i: usize, what: &str) -> Result<i64> {
    let name = l.input_name(i);
    let t = l.tensor(i)?;
    let v: Vec<i64> = crate::with_match_dtype!(ints t.dtype(), |T| t.array::<T>()?.iter().map(|&v| i64::from(v)).collect(),
        else other => return Err(Error::type_error(format!("{op}: {what} ('{name}') must be int32 or int64, got {other}")).with_blob(name)));
    match v.as_slice() {
        [x] => Ok(*x),
        _ => Err(Error::shape(format!(
            "{op}: {what} ('{name}') must have one element, got shape {:?}",
            t.shape()
        ))
        .with_blob(name)),
    }
}

/// (outer, block, inner) of X viewed as [outer, block at `axis`, inner].
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

fn tile_of<T: Element>(t: &Tensor, axis: usize, tiles: usize) -> Result<Tensor> {
    let a = t.array::<T>()?;
    let mut shape = a.shape().to_vec();
    let too_large = || {
        Error::invalid_arg(format!(
            "Tile: tiles = {tiles} is too large: {tiles} copies of the input (shape {:?}) along axis {axis} are more elements than any tensor can hold",
            a.shape()
        ))
    };
    shape[axis] = shape[axis].checked_mul(tiles).ok_or_else(too_large)?;
    let n = checked_numel::<T>(&shape, "Tile's output").map_err(|_| too_large())?;
    let (outer, d, inner) = around(a.shape(), axis);
    let chunk = d * inner;
    let mut y: Vec<T> = try_vec(n, format_args!("Tile's output (shape {shape:?})"))?;
    if chunk > 0 {
        let x = a.as_slice();
        let x: std::borrow::Cow<'_, [T]> = match x {
            Some(x) => x.into(),
            None => crate::tensor::try_collect(a.iter().cloned(), "Tile's input")?.into(),
        };
        for o in 0..outer {
            for _ in 0..tiles {
                y.extend_from_slice(&x[o * chunk..(o + 1) * chunk]);
            }
        }
    }
    Ok(T::wrap(
        ndarray::ArrayD::from_shape_vec(IxDyn(&shape), y)
            .map_err(|e| Error::internal(e.to_string()))?,
    ))
}

fn tile_grad_of<T: Element + std::ops::Add<Output = T>>(
    t: &Tensor,
    axis: usize,
    tiles: usize,
) -> Result<Tensor> {
    let a = t.array::<T>()?;
    let dy = crate::tensor::try_collect(a.iter().cloned(), "TileGradient's dY")?;
    let mut shape = a.shape().to_vec();
    let (outer, d, inner) = around(&shape, axis);
    if tiles == 0 || d % tiles != 0 {
        return Err(Error::shape(format!(
            "TileGradient: dim {axis} of dY (shape {shape:?}) is not a multiple of tiles = {tiles}"
        )));
    }
    let chunk = d / tiles * inner;
    let mut dx: Vec<T> = try_vec(outer * chunk, "TileGradient's output")?;
    for o in 0..outer {
        let base = o * d * inner;
        let mut acc: Vec<T> = try_collect(dy[base..base + chunk].iter().cloned(), "a tile")?;
        for r in 1..tiles {
            let from = base + r * chunk;
            for (s, v) in acc.iter_mut().zip(&dy[from..from + chunk]) {
                *s = s.clone() + v.clone();
            }
        }
        dx.extend(acc);
    }
    shape[axis] /= tiles;
    Ok(T::wrap(
        ndarray::ArrayD::from_shape_vec(IxDyn(&shape), dx)
            .map_err(|e| Error::internal(e.to_string()))?,
    ))
}

fn tile(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    let (tiles_arg, axis_arg) = (ctx.args.i64("tiles", 1)?, ctx.args.i64("axis", 0)?);
    let n = ctx.num_inputs();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let op = op.as_str();
        let tiles = if n > 1 {
            scalar_int(&l, op, 1, "tiles")?
        } else {
            tiles_arg
        };
        let axis = if n > 2 {
            scalar_int(&l, op, 2, "axis")?
        } else {
            axis_arg
        };
        let name = l.input_name(0);
        let t = l.tensor(0)?;
        if tiles < 0 {
            return Err(
                Error::invalid_arg(format!("{op}: tiles must be >= 0, got {tiles}"))
                    .with_blob(name),
            );
        }
        if t.ndim() == 0 {
            return Err(Error::shape(format!(
                "{op}: the input ('{name}') must have at least one dim"
            ))
            .with_blob(name));
        }
        let axis = super::kit::canonical_axis(op, "axis", axis, t.ndim(), name)?;
        let out = if op == "Tile" {
            crate::with_match_dtype!(t.dtype(), |T| tile_of::<T>(t, axis, tiles as usize),
                else other => Err(crate::tensor::unsupported_dtype(other)))
        } else {
            crate::with_match_dtype!(arith t.dtype(), |T| tile_grad_of::<T>(t, axis, tiles as usize),
                else other => Err(crate::tensor::unsupported_dtype(other)))
        }
        .map_err(|e| e.with_blob(name))?;
        l.set_output(0, out);
        Ok(true)
    }))
}

fn expand(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let shape_name = l.input_name(1);
        let st = l.tensor(1)?;
        if st.ndim() != 1 {
            return Err(Error::shape(format!(
                "Expand: the shape ('{shape_name}') must be 1-D, got shape {:?}",
                st.shape()
            ))
            .with_blob(shape_name));
        }
        let dims: Vec<i64> = crate::with_match_dtype!(ints st.dtype(), |T| st.array::<T>()?.iter().map(|&v| i64::from(v)).collect(),
            else other => return Err(Error::type_error(format!("Expand: the shape ('{shape_name}') must be int32 or int64, got {other}")).with_blob(shape_name)));
        let want: Vec<usize> = dims
            .into_iter()
            .map(|d| {
                usize::try_from(d).map_err(|_| {
                    Error::invalid_arg(format!(
                        "Expand: the shape must not have negative dims, got {d}"
                    ))
                    .with_blob(l.input_name(1))
                })
            })
            .collect::<Result<_>>()?;
        let name = l.input_name(0);
        let t = l.tensor(0)?;
        let mut out = Shape::new();
        numpy_shape("Expand", t.shape(), &want, name, l.input_name(1), &mut out)?;
        let y = crate::with_match_dtype!(t.dtype(), |T| {
            let a = t.array::<T>()?;
            let v = a.broadcast(IxDyn(&out)).ok_or_else(|| {
                Error::shape(format!("Expand: cannot broadcast shape {:?} to {:?}", a.shape(), &out[..]))
            })?;
            copy_array(v).map(T::wrap)
        }, else other => Err(crate::tensor::unsupported_dtype(other)))?;
        l.set_output(0, y);
        Ok(true)
    }))
}

fn expand_grad_of<T: Element + std::ops::Add<Output = T> + Default>(
    dy: &Tensor,
    xs: &[usize],
) -> Result<Tensor> {
    let a = dy.array::<T>()?;
    let nd = a.ndim();
    if xs.len() > nd {
        return Err(Error::shape(format!(
            "ExpandGradient: X (shape {xs:?}) has more dims than dY (shape {:?})",
            a.shape()
        )));
    }
    let pad: Vec<usize> = std::iter::repeat_n(1, nd - xs.len())
        .chain(xs.iter().copied())
        .collect();
    // Folded from a view of dY: nothing is copied until the first fold.
    let mut g: Option<ndarray::ArrayD<T>> = None;
    for ax in (0..nd).rev() {
        let len = g.as_ref().map_or(a.shape()[ax], |g| g.shape()[ax]);
        if pad[ax] == 1 && len != 1 {
            let v = g.as_ref().map_or_else(|| a.view(), |g| g.view());
            g = Some(crate::tensor::fold_axis_array(
                v,
                ax,
                T::default(),
                |s, v| s.clone() + v.clone(),
            )?);
        } else if pad[ax] != len {
            return Err(Error::shape(format!(
                "ExpandGradient: dY (shape {:?}) is not X's shape {xs:?} broadcast",
                dy.shape()
            )));
        }
    }
    let v: Vec<T> = match &g {
        Some(g) => try_collect(g.iter().cloned(), "ExpandGradient's output")?,
        None => try_collect(a.iter().cloned(), "ExpandGradient's output")?,
    };
    Ok(T::wrap(
        ndarray::ArrayD::from_shape_vec(IxDyn(xs), v)
            .map_err(|e| Error::internal(e.to_string()))?,
    ))
}

fn expand_grad(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let name = l.input_name(0);
        let xs = l.tensor(1)?.shape().to_vec();
        let dy = l.tensor(0)?;
        let out = crate::with_match_dtype!(arith dy.dtype(), |T| expand_grad_of::<T>(dy, &xs),
            else other => Err(crate::tensor::unsupported_dtype(other)))
        .map_err(|e| e.with_blob(name))?;
        l.set_output(0, out);
        Ok(true)
    }))
}

// ----------------------------------------------------------------- Slice --

/// The index list of Slice input `i` (int32 or int64, 1-D).
fn index_input(l: &crate::operator::Locked<'_>, i: usize) -> Result<Vec<i64>> {
    let name = l.input_name(i);
    let t = l.tensor(i)?;
    if t.ndim() != 1 {
        return Err(Error::shape(format!(
            "starts and ends must be 1-D, got shape {:?}",
            t.shape()
        ))
        .with_blob(name));
    }
    super::kit::int_values(t)?.ok_or_else(|| {
        Error::type_error(format!(
            "starts and ends must be {}, got {}",
            crate::tensor::dtype_choice(DataType::INTS),
            t.dtype()
        ))
        .with_blob(name)
    })
}

fn slice_of<T: Element>(t: &Tensor, ranges: &[(usize, usize)]) -> Result<Tensor> {
    let mut v = t.array::<T>()?.view();
    for (d, &(s, e)) in ranges.iter().enumerate() {
        v.slice_axis_inplace(ndarray::Axis(d), Slice::from(s..e));
    }
    Ok(T::wrap(copy_array(v)?))
}

/// The range Slice takes along each dim of an input of shape `dims`.
pub(crate) fn slice_ranges(
    dims: &[usize],
    starts: &[i64],
    ends: &[i64],
    name: &str,
) -> Result<Vec<(usize, usize)>> {
    if starts.len() != ends.len() || starts.len() > dims.len() {
        return Err(Error::invalid_arg(format!(
            "{} starts and {} ends for an input of {} dims: they must have one length, at most the dims",
            starts.len(),
            ends.len(),
            dims.len()
        ))
        .with_blob(name));
    }
    let mut ranges = Vec::with_capacity(dims.len());
    for (d, &dim) in dims.iter().enumerate() {
        let Some((&s, &e)) = starts.get(d).zip(ends.get(d)) else {
            ranges.push((0, dim));
            continue;
        };
        if dim == 0 {
            ranges.push((0, 0));
            continue;
        }
        let fix = |i: i64| {
            let i = if i < 0 { dim as i64 + 1 + i } else { i };
            i.min(dim as i64)
        };
        let (s2, e2) = (fix(s), fix(e));
        if s2 < 0 || e2 < 0 || e2 < s2 {
            return Err(Error::invalid_arg(format!(
                "dim {d} (size {dim}): start {s} and end {e} do not give a valid range"
            ))
            .with_blob(name));
        }
        ranges.push((s2 as usize, e2 as usize));
    }
    Ok(ranges)
}

/// SliceGradient: zeros of the data's shape, dY written over the ranges.
fn slice_grad_of<T: Element>(
    dims: &[usize],
    dy: &Tensor,
    ranges: &[(usize, usize)],
) -> Result<Tensor> {
    let mut dx = Tensor::zeros(T::DTYPE, dims)?;
    {
        let a = dx.array_mut::<T>()?;
        let mut v = a.view_mut();
        for (d, &(s, e)) in ranges.iter().enumerate() {
            v.slice_axis_inplace(ndarray::Axis(d), Slice::from(s..e));
        }
        let g = dy.array::<T>()?;
        if g.shape() != v.shape() {
            return Err(Error::shape(format!(
                "SliceGradient: dY has shape {:?}, but the slice of data (shape {dims:?}) has shape {:?}",
                g.shape(),
                v.shape()
            )));
        }
        v.assign(g);
    }
    Ok(dx)
}

/// Slice's starts and ends as arguments (`Some`), or `None` when they come
/// from inputs 1 and 2; `n` is the number of Slice inputs the op has.
pub(crate) fn slice_args(ctx: &OpDefCtx<'_>, n: usize) -> Result<Option<(Vec<i64>, Vec<i64>)>> {
    let (starts, ends) = (ctx.args.ints("starts")?, ctx.args.ints("ends")?);
    let what = ctx.op_type();
    match (n, &starts, &ends) {
        (1, Some(_), Some(_)) | (3, None, None) => {}
        (2, ..) => {
            return Err(ctx.bad_arg(format!(
                "{what} takes starts and ends both as inputs or both as arguments"
            )))
        }
        (1, ..) => {
            return Err(ctx.bad_arg(format!(
                "{what} needs the starts and ends arguments (or inputs 1 and 2)"
            )))
        }
        _ => {
            return Err(ctx.bad_arg(format!(
                "{what} takes starts and ends either as arguments or as inputs, not both"
            )))
        }
    }
    Ok(starts.zip(ends))
}

/// The starts and ends of a Slice: the arguments, or inputs 1 and 2.
pub(crate) fn slice_bounds(
    l: &Locked<'_>,
    args: &Option<(Vec<i64>, Vec<i64>)>,
) -> Result<(Vec<i64>, Vec<i64>)> {
    match args {
        Some((s, e)) => Ok((s.clone(), e.clone())),
        None => Ok((index_input(l, 1)?, index_input(l, 2)?)),
    }
}

/// `t` sliced (any dtype) to `ranges`, one per leading dim.
pub(crate) fn sliced(t: &Tensor, ranges: &[(usize, usize)]) -> Result<Tensor> {
    crate::with_match_dtype!(t.dtype(), |T| slice_of::<T>(t, ranges),
        else other => Err(crate::tensor::unsupported_dtype(other)))
}

fn slice(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let grad = ctx.op_type() == "SliceGradient";
    // SliceGradient's inputs are Slice's, then dY.
    let n = ctx.num_inputs() - usize::from(grad);
    let bounds = slice_args(ctx, n)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let name = l.input_name(0);
        let (starts, ends) = slice_bounds(&l, &bounds)?;
        let t = l.tensor(0)?;
        let ranges = slice_ranges(t.shape(), &starts, &ends, name)?;
        let out = if grad {
            let dims = t.shape().to_vec();
            let dy_name = l.input_name(n);
            let dy = l.tensor(n)?;
            crate::with_match_dtype!(floats dy.dtype(), |T| slice_grad_of::<T>(&dims, dy, &ranges),
            else other => Err(Error::type_error(format!(
                "SliceGradient: dY must be float32 or float64, got {other}"
            ))))
            .map_err(|e| e.with_blob(dy_name))?
        } else {
            sliced(t, &ranges)?
        };
        l.set_output(0, out);
        Ok(true)
    }))
}

// ----------------------------------------------------------------- Where --

fn where_of<T: Element>(
    c: ArrayViewD<'_, bool>,
    x: &Tensor,
    y: &Tensor,
    shape: &[usize],
) -> Result<Tensor> {
    let (x, y) = (x.array::<T>()?, y.array::<T>()?);
    let sh = IxDyn(shape);
    let (c, x, y) = match (
        c.broadcast(sh.clone()),
        x.broadcast(sh.clone()),
        y.broadcast(sh),
    ) {
        (Some(c), Some(x), Some(y)) => (c, x, y),
        _ => return Err(Error::internal("Where: broadcast shape checked before")),
    };
    let mut out = try_vec(c.len(), format_args!("{} Where results", c.len()))?;
    // Iterators of views run in logical (row-major) order, broadcast or not.
    out.extend(
        c.iter()
            .zip(x.iter().zip(y.iter()))
            .map(|(&c, (x, y))| if c { x.clone() } else { y.clone() }),
    );
    Tensor::from_vec(shape, out)
}

fn where_op(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let on_rows = ctx.args.bool("broadcast_on_rows", false)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let (cn, xn, yn) = (l.input_name(0), l.input_name(1), l.input_name(2));
        let (c, x, y) = (l.tensor(0)?, l.tensor(1)?, l.tensor(2)?);
        let c = c.array::<bool>().map_err(|e| e.with_blob(cn))?.view();
        if x.dtype() != y.dtype() {
            return Err(Error::type_error(format!(
                "Where: X ('{xn}') is {} but Y ('{yn}') is {}; they must have one dtype",
                x.dtype(),
                y.dtype()
            ))
            .with_blob(yn));
        }
        let mut xy = Shape::new();
        numpy_shape("Where", x.shape(), y.shape(), xn, yn, &mut xy)?;
        // On rows, C of shape [n] is seen as [n, 1, 1, ...] against X.
        let c = if on_rows {
            if c.ndim() != 1 || x.ndim() == 0 || c.len() != x.shape()[0] {
                return Err(Error::shape(format!(
                    "Where with broadcast_on_rows: C must be 1-D with X's first dim, got C {:?} and X {:?}",
                    c.shape(),
                    x.shape()
                ))
                .with_blob(cn));
            }
            let mut s = vec![1; x.ndim()];
            s[0] = c.len();
            c.into_shape_with_order(IxDyn(&s))
                .map_err(|e| Error::internal(e.to_string()))?
        } else {
            c
        };
        let mut shape = Shape::new();
        numpy_shape("Where", c.shape(), &xy, cn, xn, &mut shape)?;
        let out = crate::with_match_dtype!(x.dtype(), |T| where_of::<T>(c, x, y, &shape),
            else other => Err(crate::tensor::unsupported_dtype(other)))?;
        l.set_output(0, out);
        Ok(true)
    }))
}

// --------------------------------------------------- LengthsToSegmentIds --

/// LengthsToSegmentIds (segment `i` repeated `lengths[i]` times) and
/// LengthsRangeFill (`0..lengths[i]` for each segment).
fn lengths_to_segment_ids(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ranges = ctx.op_type() == "LengthsRangeFill";
    Ok(kernel(move |cx| {
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
        let mut total = 0usize;
        for (i, &len) in a.iter().enumerate() {
            if len < 0 {
                return Err(
                    Error::invalid_arg(format!("length #{i} is negative: {len}")).with_blob(name),
                );
            }
            total += len as usize;
        }
        let mut out = try_vec(total, format_args!("{total} int32 segment ids"))?;
        for (i, &len) in a.iter().enumerate() {
            if ranges {
                out.extend(0..len);
            } else {
                out.extend(std::iter::repeat(i as i32).take(len as usize));
            }
        }
        let t = Tensor::from_vec(&[total], out)?;
        l.set_output(0, t);
        Ok(true)
    }))
}

// ------------------------------------------------ reshapes (issue 14) --

/// Reshape, Flatten, FlattenToVec, ExpandDims, Squeeze, LengthsToShape and
/// ResizeLike: any dtype, copied (Caffe2 shared the buffer).
fn reshape_schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("Reshape", build_reshape)
            .inputs(1, 2)
            .outputs(1, 2)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[arg!("shape", "ints", "(none)", "the new shape: 0 copies the input's dim, one -1 is inferred; or give it as the second input")])
            .doc("Outputs (the data with a new shape, old_shape: the input's dims as int64). The shape comes from the `shape` argument or the second input (int32 or int64), not both."),
        OpSchema::new("Flatten", build_flatten)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[arg!("axis", "int", "1", "the 2-D output is (prod of dims before axis, prod of the rest); in [-ndim, ndim]")])
            .doc("Reshapes the input to 2-D at `axis`."),
        OpSchema::new("FlattenToVec", build_flatten_to_vec)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .doc("Reshapes the input to 1-D."),
        OpSchema::new("ExpandDims", build_expand_squeeze)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[arg!("dims", "ints", "(required)", "the output dims (sorted, deduplicated, >= 0) that are new dims of size 1")])
            .doc("Inserts dims of size 1 at `dims`."),
        OpSchema::new("Squeeze", build_expand_squeeze)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[arg!("dims", "ints", "[]", "the input dims (each of size 1, >= 0) to remove")])
            .doc("Removes the dims `dims`, each of which must have size 1."),
        OpSchema::new("LengthsToShape", build_lengths_to_shape)
            .inputs(1, 1)
            .outputs(1, 1)
            .infer(|_, _, _| Ok(vec![Some(crate::operator::ShapeInfo::new(vec![2], DataType::Int32))]))
            .doc("The shape [len(lengths), lengths[0]] (int32) of 1-D int32 lengths that are all equal (a shape for Reshape); [0, 0] for no lengths."),
        OpSchema::new("ResizeLike", build_resize_like)
            .inputs(2, 2)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .infer(|_, ins, _| {
                Ok(vec![match (&ins[0], &ins[1]) {
                    (Some(x), Some(like)) => Some(crate::operator::ShapeInfo::new(like.dims.clone(), x.dtype)),
                    _ => None,
                }])
            })
            .doc("Y = X reshaped to the shape of the second input (same number of elements)."),
    ]
}

// ------------------------------------------------------------- reshapes --

fn reshaped_of<T: Element>(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let a = t.array::<T>()?;
    let v: Vec<T> = crate::tensor::try_collect(a.iter().cloned(), "a kernel buffer")?;
    let r = ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| Error::internal(e.to_string()))?;
    Ok(T::wrap(r))
}

/// `t` with the new shape `shape` (same element count, checked by callers).
pub(crate) fn reshaped(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    crate::with_match_dtype!(t.dtype(), |T| reshaped_of::<T>(t, shape),
        else other => Err(crate::tensor::unsupported_dtype(other)))
}

/// Sets output 0 to input 0 with `shape`.
fn set_reshaped(l: &mut Locked<'_>, shape: &[usize]) -> Result<()> {
    let out = reshaped(l.tensor(0)?, shape)?;
    l.set_output(0, out);
    Ok(())
}

/// Caffe2's shape rules: 0 copies the input's dim (a 0 past the input's
/// dims stays 0, and so does every 0 when the input is empty), one -1 is
/// inferred (0 for an empty input when the other dims multiply to 0).
pub(crate) fn resolve_shape(
    op: &str,
    want: &[i64],
    old: &[usize],
    blob: &str,
) -> Result<Vec<usize>> {
    let total: usize = old.iter().product();
    // Caffe2's documented rule: "When the tensor is empty, dimension of 0
    // will remain to be 0" ([4, 0] reshaped to [0, -1] is [0, 0]).
    let copy_zeros = total != 0;
    let mut out = Vec::with_capacity(want.len());
    let mut infer = None;
    for (i, &d) in want.iter().enumerate() {
        match d {
            -1 => {
                if infer.replace(i).is_some() {
                    return Err(Error::invalid_arg(format!(
                        "{op}: argument `shape` has more than one missing dimension: {want:?}"
                    ))
                    .with_blob(blob));
                }
                out.push(1);
            }
            // 0 copies the input's dim; past the input's dims it is a 0 (Caffe2).
            0 if copy_zeros => out.push(old.get(i).copied().unwrap_or(0)),
            0 => out.push(0),
            d if d > 0 => out.push(d as usize),
            d => {
                return Err(Error::invalid_arg(format!(
                    "{op}: the new shape {want:?} has a negative dim {d} other than -1"
                ))
                .with_blob(blob))
            }
        }
    }
    // The new shape is the user's (an argument or an input): one whose
    // size overflows is refused as such, not multiplied (Caffe2's int64
    // product wrapped).
    let known = crate::tensor::checked_numel::<u8>(&out, "").map_err(|_| {
        Error::invalid_arg(format!(
            "{op}: the new shape {want:?} has too many elements (more than any tensor can hold)"
        ))
        .with_blob(blob)
    })?;
    if let Some(i) = infer {
        if known == 0 && total == 0 {
            // An empty input: the missing dim is 0 too (Caffe2).
            out[i] = 0;
            return Ok(out);
        }
        if known == 0 || total % known != 0 {
            return Err(Error::shape(format!(
                "{op}: cannot infer the -1 of {want:?} for an input of shape {old:?} ({total} elements)"
            ))
            .with_blob(blob));
        }
        out[i] = total / known;
    } else if known != total {
        return Err(Error::shape(format!(
            "{op}: the new shape {want:?} has {known} elements, the input {old:?} has {total}"
        ))
        .with_blob(blob));
    }
    Ok(out)
}

pub(crate) fn shape_input(l: &Locked<'_>, op: &str, i: usize) -> Result<Vec<i64>> {
    let t = l.tensor(i)?;
    super::kit::int_vector(t)?.ok_or_else(|| {
        let name = l.input_name(i);
        Error::type_error(format!(
            "{op}: the new shape ('{name}') must be a 1-D int32 or int64 tensor, got {} of shape {:?}",
            t.dtype(),
            t.shape()
        ))
        .with_blob(name)
    })
}

/// The dims of a shape as a 1-D int64 tensor (Reshape's old_shape).
pub(crate) fn dims_tensor(dims: &[usize]) -> Result<Tensor> {
    let v: Vec<i64> =
        crate::tensor::try_collect(dims.iter().map(|&d| d as i64), "a kernel buffer")?;
    Tensor::from_vec(&[v.len()], v)
}

/// Reshape's `shape` argument, or `None` when the second input gives it
/// (one of the two, not both).
pub(crate) fn reshape_arg(ctx: &OpDefCtx<'_>) -> Result<Option<Vec<i64>>> {
    let arg = ctx.args.ints("shape")?;
    let two_in = ctx.num_inputs() == 2;
    match (&arg, two_in) {
        (Some(_), true) => {
            return Err(ctx.bad_arg(
                "new shape is specified by the input blob, do not pass in the argument `shape`",
            ))
        }
        (None, false) => {
            return Err(
                ctx.bad_arg("argument `shape` is missing (or give the shape as a second input)")
            )
        }
        _ => {}
    }
    Ok(arg)
}

fn build_reshape(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let arg = reshape_arg(ctx)?;
    let old_out = ctx.num_outputs() == 2;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let want = match &arg {
            Some(a) => a.clone(),
            None => shape_input(&l, "Reshape", 1)?,
        };
        let old = l.tensor(0)?.shape().to_vec();
        let name = l.input_name(0).to_string();
        let new = resolve_shape("Reshape", &want, &old, &name)?;
        set_reshaped(&mut l, &new)?;
        if old_out {
            l.set_output(1, dims_tensor(&old)?);
        }
        Ok(true)
    }))
}

fn build_flatten(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let shape = l.tensor(0)?.shape().to_vec();
        // Caffe2 allows axis == ndim (an inner size of 1).
        let ax = if axis == shape.len() as i64 {
            shape.len()
        } else {
            canonical_axis("Flatten", "axis", axis, shape.len(), l.input_name(0))?
        };
        let new = [shape[..ax].iter().product(), shape[ax..].iter().product()];
        set_reshaped(&mut l, &new)?;
        Ok(true)
    }))
}

fn build_flatten_to_vec(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let n = l.tensor(0)?.numel();
        set_reshaped(&mut l, &[n])?;
        Ok(true)
    }))
}

fn build_expand_squeeze(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let expand = ctx.op_type() == "ExpandDims";
    let mut dims = ctx.args.ints("dims")?.unwrap_or_default();
    dims.sort_unstable();
    dims.dedup();
    if expand && dims.is_empty() {
        return Err(ctx.bad_arg("argument `dims` is required"));
    }
    if let Some(&d) = dims.first() {
        if d < 0 {
            return Err(ctx.bad_arg(format!("dimension must be non-negative, got dims {dims:?}")));
        }
    }
    let dims: Vec<usize> =
        crate::tensor::try_collect(dims.into_iter().map(|d| d as usize), "a kernel buffer")?;
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let old = l.tensor(0)?.shape().to_vec();
        let name = l.input_name(0).to_string();
        let new = if expand {
            let mut s = old.clone();
            for &d in &dims {
                if d > s.len() {
                    return Err(Error::invalid_arg(format!(
                        "{op}: dim {d} is out of range for an output of {} dims (input shape {old:?}, dims {dims:?})",
                        s.len() + 1
                    ))
                    .with_blob(&name));
                }
                s.insert(d, 1);
            }
            s
        } else {
            for &d in &dims {
                if d >= old.len() || old[d] != 1 {
                    return Err(Error::invalid_arg(format!(
                        "{op}: dimension {d} of the input {old:?} is not 1 (dims {dims:?})"
                    ))
                    .with_blob(&name));
                }
            }
            old.iter()
                .enumerate()
                .filter(|(i, _)| !dims.contains(i))
                .map(|(_, &v)| v)
                .collect()
        };
        set_reshaped(&mut l, &new)?;
        Ok(true)
    }))
}

fn build_lengths_to_shape(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let t = l.tensor(0)?;
        let name = l.input_name(0);
        let lengths = match t {
            Tensor::I32(a) if a.ndim() == 1 => a,
            _ => {
                return Err(Error::type_error(format!(
                    "LengthsToShape: the lengths ('{name}') must be a 1-D int32 tensor, got {} of shape {:?}",
                    t.dtype(),
                    t.shape()
                ))
                .with_blob(name))
            }
        };
        let first = lengths.first().copied().unwrap_or(0);
        if let Some(other) = lengths.iter().find(|&&v| v != first) {
            return Err(Error::invalid_arg(format!(
                "LengthsToShape: all lengths must be the same, got {first} and {other}"
            ))
            .with_blob(name));
        }
        let n = i32::try_from(lengths.len()).map_err(|_| {
            Error::invalid_arg(format!(
                "LengthsToShape: {} lengths do not fit an int32 shape",
                lengths.len()
            ))
            .with_blob(name)
        })?;
        let out = ArrayD::from_shape_vec(IxDyn(&[2]), vec![n, first])
            .map_err(|e| Error::internal(e.to_string()))?;
        l.set_output(0, Tensor::from(out));
        Ok(true)
    }))
}

fn build_resize_like(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let like = l.tensor(1)?.shape().to_vec();
        let n = l.tensor(0)?.numel();
        if like.iter().product::<usize>() != n {
            return Err(Error::shape(format!(
                "ResizeLike: '{}' has {n} elements, '{}' has shape {like:?}",
                l.input_name(0),
                l.input_name(1)
            ))
            .with_blob(l.input_name(1)));
        }
        set_reshaped(&mut l, &like)?;
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use crate::error::{Error, ErrorKind};
    use crate::ir::Argument;
    use crate::tensor::Tensor;
    use crate::test_util::{f32s, feed, get, ints_arg, op, run, strs, tensor, ws_with};

    fn kind_blob(e: &Error) -> (ErrorKind, Option<&str>) {
        (e.kind, e.context.blob.as_deref())
    }

    #[test]
    fn shape_and_size() {
        let ws = ws_with(&[
            ("x", tensor(&[2, 3, 0], Vec::<f32>::new())),
            ("s", strs(&["a", "b"])),
        ]);
        run(&ws, op("Shape", &["x"], &["y"], vec![])).unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[3], vec![2i64, 3, 0]));
        run(
            &ws,
            op("Shape", &["x"], &["y"], vec![ints_arg("axes", &[1, 0])]),
        )
        .unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[2], vec![3i64, 2]));
        run(
            &ws,
            op("Shape", &["x"], &["y"], vec![ints_arg("axes", &[])]),
        )
        .unwrap();
        assert_eq!(
            get(&ws, "y"),
            tensor(&[3], vec![2i64, 3, 0]),
            "no axes: all"
        );
        let e = run(
            &ws,
            op("Shape", &["x"], &["y"], vec![ints_arg("axes", &[3])]),
        )
        .unwrap_err();
        assert_eq!(
            kind_blob(&e),
            (ErrorKind::InvalidArgument, Some("x")),
            "{e}"
        );
        run(&ws, op("Size", &["x"], &["n"], vec![])).unwrap();
        assert_eq!(get(&ws, "n"), Tensor::scalar(0i64));
        run(&ws, op("Size", &["s"], &["n"], vec![])).unwrap();
        assert_eq!(get(&ws, "n"), Tensor::scalar(2i64));
    }

    #[test]
    fn alias_copies() {
        let ws = ws_with(&[("x", tensor(&[2], vec![1i32, 2]))]);
        run(&ws, op("Alias", &["x"], &["y"], vec![])).unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[2], vec![1i32, 2]));
        run(&ws, op("Alias", &["x"], &["x"], vec![])).unwrap();
        assert_eq!(get(&ws, "x"), tensor(&[2], vec![1i32, 2]));
    }

    #[test]
    fn range_like_arange() {
        let ws = ws_with(&[
            ("a", Tensor::scalar(5i32)),
            ("b", Tensor::scalar(-2i64)),
            ("c", Tensor::scalar(7i64)),
            ("d", Tensor::scalar(3i64)),
            ("e", Tensor::scalar(-3i64)),
            ("z", Tensor::scalar(0i64)),
            ("f", Tensor::scalar(0.5f32)),
            ("g", Tensor::scalar(1.5f32)),
            ("h", Tensor::scalar(0.25f32)),
        ]);
        run(&ws, op("Range", &["a"], &["y"], vec![])).unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[5], vec![0i32, 1, 2, 3, 4]));
        run(&ws, op("Range", &["b", "c", "d"], &["y"], vec![])).unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[3], vec![-2i64, 1, 4]));
        run(&ws, op("Range", &["c", "b", "e"], &["y"], vec![])).unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[3], vec![7i64, 4, 1]));
        run(&ws, op("Range", &["c", "b"], &["y"], vec![])).unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[0], Vec::<i64>::new()));
        run(&ws, op("Range", &["f", "g", "h"], &["y"], vec![])).unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[4], vec![0.5f32, 0.75, 1.0, 1.25]));
        let e = run(&ws, op("Range", &["b", "c", "z"], &["y"], vec![])).unwrap_err();
        assert_eq!(
            kind_blob(&e),
            (ErrorKind::InvalidArgument, Some("z")),
            "{e}"
        );
        let e = run(&ws, op("Range", &["b", "a"], &["y"], vec![])).unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Type, Some("a")), "{e}");
        feed(&ws, "v", tensor(&[2], vec![1i64, 2]));
        let e = run(&ws, op("Range", &["v"], &["y"], vec![])).unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Shape, Some("v")), "{e}");
        feed(&ws, "u", Tensor::scalar(3u8));
        let e = run(&ws, op("Range", &["u"], &["y"], vec![])).unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Type, Some("u")), "{e}");
    }

    #[test]
    fn transpose_every_dtype() {
        let ws = ws_with(&[
            ("x", tensor(&[2, 3], vec![1i64, 2, 3, 4, 5, 6])),
            (
                "s",
                tensor(
                    &[1, 2],
                    strs(&["a", "b"])
                        .array::<Vec<u8>>()
                        .unwrap()
                        .iter()
                        .cloned()
                        .collect(),
                ),
            ),
        ]);
        run(&ws, op("Transpose", &["x"], &["y"], vec![])).unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[3, 2], vec![1i64, 4, 2, 5, 3, 6]));
        run(&ws, op("Transpose", &["s"], &["y"], vec![])).unwrap();
        assert_eq!(
            get(&ws, "y"),
            tensor(&[2, 1], vec![b"a".to_vec(), b"b".to_vec()])
        );
        feed(
            &ws,
            "c",
            tensor(&[2, 1, 3], (0..6).map(|v| v as f32).collect()),
        );
        run(
            &ws,
            op(
                "Transpose",
                &["c"],
                &["y"],
                vec![ints_arg("axes", &[1, 2, 0])],
            ),
        )
        .unwrap();
        assert_eq!(
            get(&ws, "y"),
            tensor(&[1, 3, 2], vec![0f32, 3.0, 1.0, 4.0, 2.0, 5.0])
        );
        for bad in [&[0, 0, 1][..], &[0, 1], &[0, 1, 3], &[-1, 0, 1]] {
            let e = run(
                &ws,
                op("Transpose", &["c"], &["y"], vec![ints_arg("axes", bad)]),
            )
            .unwrap_err();
            assert_eq!(
                kind_blob(&e),
                (ErrorKind::InvalidArgument, Some("c")),
                "{e}"
            );
        }
    }

    #[test]
    fn slice_by_args_and_inputs() {
        let x = tensor(&[3, 4], (0..12).collect::<Vec<i32>>());
        let ws = ws_with(&[
            ("x", x),
            ("s", tensor(&[2], vec![1i64, 0])),
            ("e", tensor(&[2], vec![-1i64, 2])),
            ("f", tensor(&[2], vec![0.0f32, 1.0])),
        ]);
        run(
            &ws,
            op(
                "Slice",
                &["x"],
                &["y"],
                vec![ints_arg("starts", &[0, 1]), ints_arg("ends", &[2, -1])],
            ),
        )
        .unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[2, 3], vec![1i32, 2, 3, 5, 6, 7]));
        run(&ws, op("Slice", &["x", "s", "e"], &["y"], vec![])).unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[2, 2], vec![4i32, 5, 8, 9]));
        run(
            &ws,
            op(
                "Slice",
                &["x"],
                &["y"],
                vec![ints_arg("starts", &[1]), ints_arg("ends", &[9])],
            ),
        )
        .unwrap();
        assert_eq!(
            get(&ws, "y"),
            tensor(&[2, 4], (4..12).collect::<Vec<i32>>()),
            "clipped, rest whole"
        );
        run(
            &ws,
            op(
                "Slice",
                &["x"],
                &["y"],
                vec![ints_arg("starts", &[-2]), ints_arg("ends", &[-1])],
            ),
        )
        .unwrap();
        assert_eq!(
            get(&ws, "y"),
            tensor(&[1, 4], (8..12).collect::<Vec<i32>>())
        );
        let e = run(
            &ws,
            op(
                "Slice",
                &["x"],
                &["y"],
                vec![ints_arg("starts", &[2]), ints_arg("ends", &[1])],
            ),
        )
        .unwrap_err();
        assert_eq!(
            kind_blob(&e),
            (ErrorKind::InvalidArgument, Some("x")),
            "{e}"
        );
        let e = run(
            &ws,
            op(
                "Slice",
                &["x"],
                &["y"],
                vec![ints_arg("starts", &[0, 0, 0]), ints_arg("ends", &[1, 1, 1])],
            ),
        )
        .unwrap_err();
        assert_eq!(
            kind_blob(&e),
            (ErrorKind::InvalidArgument, Some("x")),
            "{e}"
        );
        let e = run(&ws, op("Slice", &["x", "f", "e"], &["y"], vec![])).unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Type, Some("f")), "{e}");
        let e = run(&ws, op("Slice", &["x"], &["y"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    }

    #[test]
    fn slice_gradient_puts_dy_where_slice_took_it() {
        let ws = ws_with(&[
            ("x", tensor(&[2, 3], vec![0.0f64; 6])),
            ("dy", tensor(&[1, 2], vec![7.0f64, 8.0])),
            ("s", tensor(&[2], vec![1i32, 1])),
            ("e", tensor(&[2], vec![2i32, -1])),
            ("i", tensor(&[2, 3], vec![0i32; 6])),
        ]);
        run(
            &ws,
            op(
                "SliceGradient",
                &["x", "dy"],
                &["dx"],
                vec![ints_arg("starts", &[1, 1]), ints_arg("ends", &[2, -1])],
            ),
        )
        .unwrap();
        let want = tensor(&[2, 3], vec![0.0f64, 0.0, 0.0, 0.0, 7.0, 8.0]);
        assert_eq!(get(&ws, "dx"), want);
        run(
            &ws,
            op("SliceGradient", &["x", "s", "e", "dy"], &["dx"], vec![]),
        )
        .unwrap();
        assert_eq!(get(&ws, "dx"), want, "starts and ends as inputs");
        // DATA gives only the shape: an int32 DATA is fine.
        run(
            &ws,
            op("SliceGradient", &["i", "s", "e", "dy"], &["dx"], vec![]),
        )
        .unwrap();
        assert_eq!(get(&ws, "dx"), want);
        let e = run(
            &ws,
            op(
                "SliceGradient",
                &["x", "dy"],
                &["dx"],
                vec![ints_arg("starts", &[0, 0]), ints_arg("ends", &[2, -1])],
            ),
        )
        .unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Shape, Some("dy")), "{e}");
        let e = run(&ws, op("SliceGradient", &["x", "s", "dy"], &["dx"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    }

    #[test]
    fn where_broadcasts() {
        let ws = ws_with(&[
            ("c", tensor(&[2, 1], vec![true, false])),
            ("x", tensor(&[3], vec![1i32, 2, 3])),
            ("y", tensor(&[2, 3], vec![10i32, 20, 30, 40, 50, 60])),
            ("r", tensor(&[2], vec![false, true])),
            ("f", tensor(&[3], vec![1.0f32, 2.0, 3.0])),
            ("i", tensor(&[2], vec![1i32, 0])),
        ]);
        run(&ws, op("Where", &["c", "x", "y"], &["o"], vec![])).unwrap();
        assert_eq!(get(&ws, "o"), tensor(&[2, 3], vec![1i32, 2, 3, 40, 50, 60]));
        let on_rows = Argument {
            name: Some("broadcast_on_rows".into()),
            i: Some(1),
            ..Default::default()
        };
        run(
            &ws,
            op("Where", &["r", "y", "x"], &["o"], vec![on_rows.clone()]),
        )
        .unwrap();
        assert_eq!(get(&ws, "o"), tensor(&[2, 3], vec![1i32, 2, 3, 40, 50, 60]));
        let e = run(&ws, op("Where", &["i", "x", "x"], &["o"], vec![])).unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Type, Some("i")), "{e}");
        let e = run(&ws, op("Where", &["c", "x", "f"], &["o"], vec![])).unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Type, Some("f")), "{e}");
        let e = run(&ws, op("Where", &["r", "x", "x"], &["o"], vec![])).unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Shape, Some("x")), "{e}");
        let e = run(&ws, op("Where", &["c", "x", "y"], &["o"], vec![on_rows])).unwrap_err();
        assert_eq!(kind_blob(&e), (ErrorKind::Shape, Some("c")), "{e}");
    }

    #[test]
    fn lengths_to_segment_ids() {
        let ws = ws_with(&[
            ("l", tensor(&[4], vec![2i32, 0, 3, 1])),
            ("n", tensor(&[2], vec![1i32, -1])),
        ]);
        run(&ws, op("LengthsToSegmentIds", &["l"], &["y"], vec![])).unwrap();
        assert_eq!(get(&ws, "y"), tensor(&[6], vec![0i32, 0, 2, 2, 2, 3]));
        run(&ws, op("LengthsRangeFill", &["l"], &["r"], vec![])).unwrap();
        assert_eq!(get(&ws, "r"), tensor(&[6], vec![0i32, 1, 0, 1, 2, 0]));
        let e = run(&ws, op("LengthsToSegmentIds", &["n"], &["y"], vec![])).unwrap_err();
        assert_eq!(
            kind_blob(&e),
            (ErrorKind::InvalidArgument, Some("n")),
            "{e}"
        );
    }

    #[test]
    fn reshape_copies_dims_infers_one_and_reports_the_old_shape() {
        let ws = ws_with(&[("x", f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]))]);
        run(
            &ws,
            op(
                "Reshape",
                &["x"],
                &["y", "old"],
                vec![ints_arg("shape", &[0, -1, 1])],
            ),
        )
        .unwrap();
        assert_eq!(get(&ws, "y").shape(), &[2, 3, 1]);
        let old: Vec<i64> = get(&ws, "old")
            .array::<i64>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(old, vec![2, 3]);
        let e = run(
            &ws,
            op("Reshape", &["x"], &["y"], vec![ints_arg("shape", &[4, -1])]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
    }
    #[test]
    fn lengths_to_shape_by_hand() {
        let ws = ws_with(&[
            ("l", crate::test_util::i32s(&[200, 200, 200])),
            ("bad", crate::test_util::i32s(&[2, 3])),
            ("none", crate::test_util::i32s(&[])),
        ]);
        run(&ws, op("LengthsToShape", &["l"], &["s"], vec![])).unwrap();
        let s: Vec<i32> = get(&ws, "s")
            .array::<i32>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(s, vec![3, 200]);
        run(&ws, op("LengthsToShape", &["none"], &["s"], vec![])).unwrap();
        let s: Vec<i32> = get(&ws, "s")
            .array::<i32>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(s, vec![0, 0]);
        let e = run(&ws, op("LengthsToShape", &["bad"], &["s"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }
}
