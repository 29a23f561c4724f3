//! Convolutions (issue 15): `Conv` (1-, 2- and 3-D, groups, dilations,
//! NCHW and NHWC, bias optional), `ConvTranspose`, their gradients, and the
//! window geometry (kernel, strides, pads, dilations, Caffe2's legacy pads)
//! that the pooling ops (`ops/pool.rs`) share.
//!
//! A convolution is an im2col (the input's windows laid out as a matrix)
//! and a GEMM per image and group; a 1x1 window with stride 1 and no pad
//! skips the im2col. `ConvTranspose` is the adjoint of `Conv` on the same
//! filter layout, so both ops and both gradients are three routines: the
//! forward product (`fwd`), its adjoint (`adj`, a GEMM then col2im) and
//! the filter gradient (`wgrad`). Images of a batch run on the kernel pool
//! (rayon) when the batch has several and the work is large enough: the
//! pool's size bounds the threads whatever the number of concurrent
//! instances calling it (see BENCHMARKS.md, "Conv (issue 15)"). One large
//! image alone hands blocks to the pool instead: NCHW forward by blocks of
//! output lines, NCHW dX and dW by blocks of input channels, NHWC forward
//! by blocks of output pixels (each block its own part of the output).
//!
//! Like `nn.rs`, every kernel takes float32 or float64 and computes into new
//! buffers before it writes an output.

#![allow(clippy::result_large_err, clippy::too_many_arguments)]

use super::gemm::product;
use super::kit::{array, dense, float_kernel, input, parse_order, Order};
use super::winograd::Wino;
use crate::arg;
use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{ArgDoc, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::DataType;
use rayon::prelude::*;

/// A per-dim argument as given: not at all, one value for every dim, or one
/// per dim.
#[derive(Clone, Debug)]
enum Dims {
    Unset,
    One(usize),
    List(Vec<usize>),
}

impl Dims {
    /// The values for `nd` dims (`per` values per dim: 2 for pads).
    fn resolve(&self, what: &str, nd: usize, per: usize, default: usize) -> Result<Vec<usize>> {
        match self {
            Dims::Unset => Ok(vec![default; nd * per]),
            Dims::One(v) => Ok(vec![*v; nd * per]),
            Dims::List(v) if v.len() == nd * per => Ok(v.clone()),
            Dims::List(v) => Err(Error::invalid_arg(format!(
                "{what} has {} values; a {nd}-D window needs {}",
                v.len(),
                nd * per
            ))),
        }
    }
}

/// Caffe2's `legacy_pad` (caffe2_legacy.proto): explicit pads, VALID, SAME,
/// or Caffe's pooling sizes (rounded up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Legacy {
    NotSet,
    Valid,
    Same,
    CaffePooling,
}

/// The window arguments of a conv or pooling op, parsed at creation.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    kernel: Dims,
    stride: Dims,
    dilation: Dims,
    pads: Dims,
    legacy: Legacy,
    pub(crate) global: bool,
    pub(crate) order: Order,
}

fn non_negative(ctx: &OpDefCtx<'_>, name: &str, v: i64) -> Result<usize> {
    usize::try_from(v).map_err(|_| ctx.bad_arg(format!("{name} must be >= 0, got {v}")))
}

/// `list` (repeated), else `one` (a single int), else the `parts` (each
/// defaulting to `part_default`; all required when `part_default` is None).
fn dims_arg(
    ctx: &OpDefCtx<'_>,
    list: &str,
    one: &str,
    parts: &[&str],
    part_default: Option<usize>,
) -> Result<Dims> {
    let given: Vec<&str> = [list, one]
        .into_iter()
        .chain(parts.iter().copied())
        .filter(|n| ctx.args.has(n))
        .collect();
    if given.len() > 1 && (given.contains(&list) || given.contains(&one)) {
        return Err(ctx.bad_arg(format!(
            "give one of {list}, {one} or {}, not {}",
            parts.join("/"),
            given.join(" and ")
        )));
    }
    if let Some(v) = ctx.args.ints(list)? {
        let v = v
            .into_iter()
            .map(|x| non_negative(ctx, list, x))
            .collect::<Result<Vec<_>>>()?;
        return Ok(Dims::List(v));
    }
    if let Some(v) = ctx.args.i64_opt(one)? {
        return Ok(Dims::One(non_negative(ctx, one, v)?));
    }
    if given.is_empty() {
        return Ok(Dims::Unset);
    }
    let mut v = Vec::with_capacity(parts.len());
    for p in parts {
        match (ctx.args.i64_opt(p)?, part_default) {
            (Some(x), _) => v.push(non_negative(ctx, p, x)?),
            (None, Some(d)) => v.push(d),
            (None, None) => {
                return Err(ctx.bad_arg(format!("{} must be given together", parts.join(" and "))))
            }
        }
    }
    Ok(Dims::List(v))
}

impl Window {
    /// Parses kernel(s), stride(s), pad(s), dilation(s), legacy_pad,
    /// global_pooling and order as Caffe2's ConvPoolOpBase did.
    pub(crate) fn parse(ctx: &OpDefCtx<'_>, dilations: bool) -> Result<Window> {
        let kernel = dims_arg(ctx, "kernels", "kernel", &["kernel_h", "kernel_w"], None)?;
        let stride = dims_arg(ctx, "strides", "stride", &["stride_h", "stride_w"], Some(1))?;
        let dilation = if dilations {
            dims_arg(
                ctx,
                "dilations",
                "dilation",
                &["dilation_h", "dilation_w"],
                Some(1),
            )?
        } else {
            Dims::Unset
        };
        let pads = dims_arg(
            ctx,
            "pads",
            "pad",
            &["pad_t", "pad_l", "pad_b", "pad_r"],
            Some(0),
        )?;
        let legacy = match ctx.args.i64("legacy_pad", 0)? {
            0 => Legacy::NotSet,
            1 => Legacy::Valid,
            2 => Legacy::Same,
            3 => Legacy::CaffePooling,
            other => {
                return Err(ctx.bad_arg(format!(
                    "legacy_pad must be 0 (NOTSET), 1 (VALID), 2 (SAME) or 3 (CAFFE_LEGACY_POOLING), got {other}"
                )))
            }
        };
        if matches!(legacy, Legacy::Valid | Legacy::Same) && !matches!(pads, Dims::Unset) {
            return Err(ctx.bad_arg(
                "If you use legacy padding VALID or SAME, you should not specify any specific padding values.",
            ));
        }
        let global = ctx.args.i64("global_pooling", 0)? != 0;
        if global
            && (!matches!(stride, Dims::Unset)
                || !matches!(pads, Dims::Unset)
                || !matches!(dilation, Dims::Unset))
        {
            return Err(
                ctx.bad_arg("If global_pooling is set pad, dilation and stride shouldn't be set.")
            );
        }
        for (what, d) in [
            ("kernel", &kernel),
            ("stride", &stride),
            ("dilation", &dilation),
        ] {
            let zero = match d {
                Dims::One(v) => *v == 0,
                Dims::List(v) => v.contains(&0),
                Dims::Unset => false,
            };
            if zero && !(what == "kernel" && global) {
                return Err(ctx.bad_arg(format!("{what} must be > 0 in every dim")));
            }
        }
        Ok(Window {
            kernel,
            stride,
            dilation,
            pads,
            legacy,
            global,
            order: parse_order(ctx)?,
        })
    }

    /// The number of spatial dims the arguments fix, if any.
    fn fixed_nd(&self) -> Option<usize> {
        match (&self.kernel, &self.stride, &self.dilation) {
            (Dims::List(v), _, _) | (_, Dims::List(v), _) | (_, _, Dims::List(v)) => Some(v.len()),
            _ => match &self.pads {
                Dims::List(v) => Some(v.len() / 2),
                _ => None,
            },
        }
    }

    /// The geometry for an input of spatial dims `ins`: `filter` is the
    /// filter's spatial dims (conv ops; the kernel may then be left out),
    /// `transposed` computes ConvTranspose's output size (with `adj`).
    pub(crate) fn geometry(
        &self,
        ins: &[usize],
        filter: Option<&[usize]>,
        transposed: Option<&[usize]>,
    ) -> Result<Geo> {
        let nd = ins.len();
        if !(1..=3).contains(&nd) {
            return Err(Error::shape(format!(
                "only 1-, 2- and 3-D windows are supported; the input has {nd} spatial dims"
            )));
        }
        if let Some(f) = self.fixed_nd() {
            if f != nd {
                return Err(Error::invalid_arg(format!(
                    "the window arguments describe {f} spatial dims; the input has {nd}"
                )));
            }
        }
        let kernel = if self.global {
            ins.to_vec()
        } else {
            match (&self.kernel, filter) {
                (Dims::Unset, Some(f)) => f.to_vec(),
                (Dims::Unset, None) => {
                    return Err(Error::invalid_arg(
                        "If you are doing convolution or pooling, you will need to set explicitly the kernel size.",
                    ))
                }
                (k, _) => k.resolve("kernels", nd, 1, 0)?,
            }
        };
        if let Some(f) = filter {
            if f != kernel.as_slice() {
                return Err(Error::shape(format!(
                    "the kernel {kernel:?} does not match the filter's spatial dims {f:?}"
                )));
            }
            // A kernel read from the filter is checked here (the
            // arguments are checked when the op is created).
            if f.contains(&0) && !self.global {
                return Err(Error::shape(format!(
                    "the filter's spatial dims {f:?} (the kernel) must all be > 0"
                )));
            }
        }
        let stride = self.stride.resolve("strides", nd, 1, 1)?;
        let dilation = self.dilation.resolve("dilations", nd, 1, 1)?;
        let mut pads = if self.global {
            vec![0; 2 * nd]
        } else {
            self.pads.resolve("pads", nd, 2, 0)?
        };
        let mut outs = Vec::with_capacity(nd);
        for i in 0..nd {
            let (mut ph, mut pt) = (pads[i], pads[nd + i]);
            // The dilated kernel: dilation * (kernel - 1) + 1.
            let dk = (kernel[i].max(1) - 1)
                .checked_mul(dilation[i])
                .and_then(|v| v.checked_add(1))
                .filter(|&v| v <= isize::MAX as usize)
                .ok_or_else(|| {
                    too_large(
                        "dilations",
                        format!(
                            "the dilated kernel ({} x ({} - 1) + 1) in spatial dim {i}",
                            dilation[i], kernel[i]
                        ),
                    )
                })?;
            let o = match transposed {
                None => out_size(
                    i,
                    ins[i],
                    kernel[i],
                    stride[i],
                    dilation[i],
                    dk,
                    self.legacy,
                    &mut ph,
                    &mut pt,
                )?,
                Some(adj) => {
                    if self.legacy != Legacy::NotSet {
                        return Err(Error::invalid_arg(
                            "ConvTranspose takes explicit pads only (legacy_pad unset)",
                        ));
                    }
                    // (in - 1) * stride + dilated kernel + adj.
                    let full = (ins[i].max(1) - 1)
                        .checked_mul(stride[i])
                        .and_then(|v| v.checked_add(dk))
                        .and_then(|v| v.checked_add(adj[i]))
                        .filter(|&v| v <= isize::MAX as usize)
                        .ok_or_else(|| {
                            too_large(
                                "strides",
                                format!(
                                    "the output size ({} - 1) x {} + {dk} + {} in spatial dim {i}",
                                    ins[i], stride[i], adj[i]
                                ),
                            )
                        })?;
                    if ins[i] == 0 {
                        0
                    } else {
                        ph.checked_add(pt)
                            .and_then(|p| full.checked_sub(p))
                            .ok_or_else(|| {
                                Error::invalid_arg(format!(
                                    "the pads ({ph} + {pt}) are larger than the output ({full}) in spatial dim {i}"
                                ))
                            })?
                    }
                }
            };
            pads[i] = ph;
            pads[nd + i] = pt;
            outs.push(o);
        }
        // Every size the kernels compute from the geometry (the window, the
        // image side and the other side, and their products with the
        // channels, which the conv ops check) fits in memory's addressing:
        // the kernels multiply them unchecked.
        let outs_arg = if transposed.is_some() {
            "strides"
        } else {
            "pads"
        };
        for (arg, what, dims) in [
            (Some("kernel"), "the window", &kernel[..]),
            (None, "the input's spatial dims", ins),
            (Some(outs_arg), "the output's spatial dims", &outs[..]),
        ] {
            crate::tensor::checked_numel::<f64>(dims, what).map_err(|e| match arg {
                Some(arg) => too_large(arg, format!("{what} {dims:?}")),
                None => e,
            })?;
        }
        // Right-align into three dims: a 2-D window is a 3-D one of depth 1.
        let lift = |v: &[usize], fill: usize| -> [usize; 3] {
            let mut a = [fill; 3];
            a[3 - nd..].copy_from_slice(v);
            a
        };
        let (ins3, outs3) = (lift(ins, 1), lift(&outs, 1));
        let g = Geo {
            nd,
            k: lift(&kernel, 1),
            s: lift(&stride, 1),
            d: lift(&dilation, 1),
            ph: lift(&pads[..nd], 0),
            pt: lift(&pads[nd..], 0),
            // For ConvTranspose the image side is its output.
            ins: if transposed.is_some() { outs3 } else { ins3 },
            outs: if transposed.is_some() { ins3 } else { outs3 },
        };
        Ok(g)
    }
}

/// The error for a window argument that makes a size overflow.
fn too_large(arg: &str, what: String) -> Error {
    let names = match arg {
        "pads" => "`pad`/`pads`",
        "strides" => "`stride`/`strides`",
        "dilations" => "`dilation`/`dilations`",
        _ => "`kernel`/`kernels`",
    };
    Error::invalid_arg(format!(
        "the argument {names} is too large: {what} overflows (more elements than any tensor can hold)"
    ))
}

/// The output size along dim `i` (input `len`, kernel `k`, stride `s`,
/// dilation `d`, dilated kernel `dk`), and its pads (which VALID, SAME and Caffe's
/// legacy pooling compute), as Caffe2's ComputeSizeAndPad, in checked
/// arithmetic.
#[allow(clippy::too_many_arguments)]
fn out_size(
    i: usize,
    len: usize,
    k: usize,
    s: usize,
    d: usize,
    dk: usize,
    legacy: Legacy,
    ph: &mut usize,
    pt: &mut usize,
) -> Result<usize> {
    let too_small = |avail: usize| {
        Error::shape(format!(
            "the input ({len} with pads, {avail}) is smaller than the dilated kernel ({dk})"
        ))
    };
    let padded = |a: usize, b: usize| {
        len.checked_add(a)
            .and_then(|v| v.checked_add(b))
            .filter(|&v| v <= isize::MAX as usize)
            .ok_or_else(|| {
                too_large(
                    "pads",
                    format!("the padded input {len} + {a} + {b} in spatial dim {i}"),
                )
            })
    };
    match legacy {
        Legacy::NotSet => {
            let avail = padded(*ph, *pt)?;
            if avail < dk {
                return Err(too_small(avail));
            }
            Ok((avail - dk) / s + 1)
        }
        Legacy::Valid => {
            (*ph, *pt) = (0, 0);
            if len < dk {
                return Err(too_small(len));
            }
            Ok((len - dk) / s + 1)
        }
        Legacy::Same => {
            if d != 1 {
                return Err(Error::invalid_arg(
                    "Dilation not supported for legacy padding.",
                ));
            }
            let target = len.div_ceil(s);
            let needed = (target.max(1) - 1)
                .checked_mul(s)
                .and_then(|v| v.checked_add(k))
                .ok_or_else(|| {
                    too_large("strides", format!("the SAME padding in spatial dim {i}"))
                })?
                .saturating_sub(len);
            *ph = needed / 2;
            *pt = needed - *ph;
            let avail = padded(needed, 0)?;
            if avail < dk {
                return Err(too_small(avail));
            }
            Ok((avail - dk) / s + 1)
        }
        Legacy::CaffePooling => {
            let avail = padded(*ph, *ph)?;
            if avail < k {
                return Err(too_small(avail));
            }
            let mut out = (avail - k).div_ceil(s) + 1;
            if *ph > 0 && (out - 1).checked_mul(s).is_none_or(|v| v >= len + *ph) {
                out -= 1;
            }
            let standard = (avail - k) / s + 1;
            *pt = (out - standard)
                .checked_mul(s)
                .and_then(|v| v.checked_add(*ph))
                .ok_or_else(|| too_large("pads", format!("the tail pad in spatial dim {i}")))?;
            Ok(out)
        }
    }
}

/// A window geometry in three dims (fewer dims are padded with size 1 at
/// the front): `ins` the image side (the input of Conv and pooling, the
/// output of ConvTranspose), `outs` the other side.
#[derive(Clone, Debug)]
pub(crate) struct Geo {
    pub(crate) nd: usize,
    pub(crate) ins: [usize; 3],
    pub(crate) outs: [usize; 3],
    pub(crate) k: [usize; 3],
    pub(crate) s: [usize; 3],
    pub(crate) d: [usize; 3],
    pub(crate) ph: [usize; 3],
    pub(crate) pt: [usize; 3],
}

impl Geo {
    pub(crate) fn ksize(&self) -> usize {
        self.k.iter().product()
    }
    pub(crate) fn in_len(&self) -> usize {
        self.ins.iter().product()
    }
    pub(crate) fn out_len(&self) -> usize {
        self.outs.iter().product()
    }
    /// 1x1 window, stride 1, no pads: the im2col matrix is the image.
    fn identity(&self) -> bool {
        self.k == [1; 3] && self.s == [1; 3] && self.ph == [0; 3] && self.ins == self.outs
    }
    /// The image index of tap `a` of output `o` along dim `dim`, if inside.
    #[inline]
    pub(crate) fn tap(&self, dim: usize, o: usize, a: usize) -> Option<usize> {
        let i = (o * self.s[dim] + a * self.d[dim]) as isize - self.ph[dim] as isize;
        (i >= 0 && (i as usize) < self.ins[dim]).then_some(i as usize)
    }
}

/// The outputs `lo..hi` (of `n`) whose tap `o * s + off` falls in `0..len`.
fn valid_range(n: usize, s: usize, off: isize, len: usize) -> (usize, usize) {
    let lo = if off >= 0 {
        0
    } else {
        ((-off) as usize).div_ceil(s).min(n)
    };
    let end = len as isize - off;
    let hi = if end <= 0 {
        0
    } else {
        (end as usize).div_ceil(s).min(n)
    };
    (lo, hi.max(lo))
}

/// NCHW im2col of `cg` channels of one image (`x`), for the output lines
/// (pairs of the first two output dims) `l0..l1`: a (cg * K) x
/// ((l1 - l0) * last output dim) matrix.
fn im2col_nchw_lines<T: Float>(g: &Geo, x: &[T], cg: usize, l0: usize, l1: usize, col: &mut [T]) {
    let [i0, i1, i2] = g.ins;
    let [_, o1, o2] = g.outs;
    let p = (l1 - l0) * o2;
    let zero = T::of(0.0);
    let mut r = 0;
    for c in 0..cg {
        let xc = &x[c * i0 * i1 * i2..(c + 1) * i0 * i1 * i2];
        for a in 0..g.k[0] {
            for b in 0..g.k[1] {
                for e in 0..g.k[2] {
                    let row = &mut col[r * p..(r + 1) * p];
                    r += 1;
                    let off = (e * g.d[2]) as isize - g.ph[2] as isize;
                    let (lo, hi) = valid_range(o2, g.s[2], off, i2);
                    for (j, line) in (l0..l1).enumerate() {
                        let (z, y) = (line / o1, line % o1);
                        {
                            let out = &mut row[j * o2..(j + 1) * o2];
                            let (Some(zi), Some(yi)) = (g.tap(0, z, a), g.tap(1, y, b)) else {
                                out.fill(zero);
                                continue;
                            };
                            let xr = &xc[(zi * i1 + yi) * i2..(zi * i1 + yi + 1) * i2];
                            out[..lo].fill(zero);
                            out[hi..].fill(zero);
                            if hi == lo {
                                continue;
                            }
                            if g.s[2] == 1 {
                                let start = (lo as isize + off) as usize;
                                out[lo..hi].copy_from_slice(&xr[start..start + hi - lo]);
                            } else {
                                for (w, v) in out[lo..hi].iter_mut().enumerate() {
                                    *v = xr[(((lo + w) * g.s[2]) as isize + off) as usize];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col_nchw_lines`]: adds each entry of the window
/// matrix of output lines `l0..l1` (`cg * K` rows of `(l1 - l0) * last
/// output dim` columns) to its pixel of `x` (`cg` channels; the caller
/// zeroed it before the first block). Per pixel, the additions come in the
/// order (row of the window matrix, line), so that cutting the channels
/// into blocks does not change a result.
fn col2im_nchw_lines<T: Float>(g: &Geo, col: &[T], cg: usize, l0: usize, l1: usize, x: &mut [T]) {
    let [i0, i1, i2] = g.ins;
    let [_, o1, o2] = g.outs;
    let p = (l1 - l0) * o2;
    let mut r = 0;
    for c in 0..cg {
        let xc = &mut x[c * i0 * i1 * i2..(c + 1) * i0 * i1 * i2];
        for a in 0..g.k[0] {
            for b in 0..g.k[1] {
                for e in 0..g.k[2] {
                    let row = &col[r * p..(r + 1) * p];
                    r += 1;
                    let off = (e * g.d[2]) as isize - g.ph[2] as isize;
                    let (lo, hi) = valid_range(o2, g.s[2], off, i2);
                    if hi == lo {
                        continue;
                    }
                    for (j, line) in (l0..l1).enumerate() {
                        let (z, y) = (line / o1, line % o1);
                        let (Some(zi), Some(yi)) = (g.tap(0, z, a), g.tap(1, y, b)) else {
                            continue;
                        };
                        let src = &row[j * o2..(j + 1) * o2];
                        let xr = &mut xc[(zi * i1 + yi) * i2..(zi * i1 + yi + 1) * i2];
                        if g.s[2] == 1 {
                            let start = (lo as isize + off) as usize;
                            for (d, &v) in xr[start..start + hi - lo].iter_mut().zip(&src[lo..hi]) {
                                *d += v;
                            }
                        } else {
                            for (w, &v) in src[lo..hi].iter().enumerate() {
                                xr[(((lo + w) * g.s[2]) as isize + off) as usize] += v;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// NHWC im2col: channels `c0..c0 + cg` of one image (`x`, `ctot` channels
/// per pixel) to a P x (K * cg) matrix.
fn im2col_nhwc<T: Float>(g: &Geo, x: &[T], ctot: usize, c0: usize, cg: usize, col: &mut [T]) {
    let p = g.outs.iter().product();
    im2col_nhwc_pixels(g, x, ctot, c0, cg, 0, p, col)
}

/// The rows `j0..j1` (output pixels, flattened) of [`im2col_nhwc`]'s
/// matrix: a (j1 - j0) x (K * cg) matrix.
fn im2col_nhwc_pixels<T: Float>(
    g: &Geo,
    x: &[T],
    ctot: usize,
    c0: usize,
    cg: usize,
    j0: usize,
    j1: usize,
    col: &mut [T],
) {
    let [_, i1, i2] = g.ins;
    let [_, o1, o2] = g.outs;
    let zero = T::of(0.0);
    let mut j = 0;
    for pix in j0..j1 {
        let (z, y, w) = (pix / (o1 * o2), (pix / o2) % o1, pix % o2);
        for a in 0..g.k[0] {
            let zi = g.tap(0, z, a);
            for b in 0..g.k[1] {
                let yi = g.tap(1, y, b);
                for e in 0..g.k[2] {
                    let dst = &mut col[j..j + cg];
                    j += cg;
                    match (zi, yi, g.tap(2, w, e)) {
                        (Some(zi), Some(yi), Some(xi)) => {
                            let at = ((zi * i1 + yi) * i2 + xi) * ctot + c0;
                            dst.copy_from_slice(&x[at..at + cg]);
                        }
                        _ => dst.fill(zero),
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col_nhwc`] (adds into `x`, which the caller zeroed).
fn col2im_nhwc<T: Float>(g: &Geo, col: &[T], ctot: usize, c0: usize, cg: usize, x: &mut [T]) {
    let [_, i1, i2] = g.ins;
    let [o0, o1, o2] = g.outs;
    let mut j = 0;
    for z in 0..o0 {
        for y in 0..o1 {
            for w in 0..o2 {
                for a in 0..g.k[0] {
                    let zi = g.tap(0, z, a);
                    for b in 0..g.k[1] {
                        let yi = g.tap(1, y, b);
                        for e in 0..g.k[2] {
                            let src = &col[j..j + cg];
                            j += cg;
                            if let (Some(zi), Some(yi), Some(xi)) = (zi, yi, g.tap(2, w, e)) {
                                let at = ((zi * i1 + yi) * i2 + xi) * ctot + c0;
                                for (d, &v) in x[at..at + cg].iter_mut().zip(src) {
                                    *d += v;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

// ------------------------------------------------------------ the products --

/// One convolution's shapes. The filter's rows are the `cout` channels of
/// the col side (Conv's output, ConvTranspose's input); its columns, per
/// group, the `cin / group` channels of the image side times the window.
struct Plan {
    g: Geo,
    group: usize,
    cin: usize,
    cout: usize,
    order: Order,
    /// Split each product across the kernel pool (when the images are not).
    par: bool,
}

impl Plan {
    fn cg(&self) -> usize {
        self.cin / self.group
    }
    fn mg(&self) -> usize {
        self.cout / self.group
    }
    fn rows(&self) -> usize {
        self.cg() * self.g.ksize()
    }
    fn img_len(&self) -> usize {
        self.cin * self.g.in_len()
    }
    fn col_len(&self) -> usize {
        self.cout * self.g.out_len()
    }
    /// The window matrix of one image (none when the matrix is the image).
    fn scratch<T: Float>(&self) -> Result<Vec<T>> {
        if self.g.identity() {
            return Ok(Vec::new());
        }
        let n = crate::tensor::size_mul(self.rows(), self.g.out_len(), || {
            "the window matrix of a convolution".to_string()
        })?;
        crate::tensor::default_buffer(n, "the window matrix of a convolution")
    }
    /// Blocks of output lines (pairs of the first two output dims) whose
    /// window matrix has about `COL_BLOCK` elements (at least `MIN_COLS`
    /// columns, at least one line).
    fn line_blocks(&self) -> impl Iterator<Item = (usize, usize)> {
        let lines = self.g.outs[0] * self.g.outs[1];
        let per_line = (self.rows() * self.g.outs[2]).max(1);
        // At least MIN_COLS columns: each block packs the filter again, and
        // narrow products run below the GEMM kernel's speed.
        let step = (COL_BLOCK / per_line)
            .max(MIN_COLS.div_ceil(self.g.outs[2].max(1)))
            .max(1);
        (0..lines)
            .step_by(step)
            .map(move |l0| (l0, (l0 + step).min(lines)))
    }
    /// Multiply-adds of one image's product.
    fn macs(&self) -> usize {
        self.cout
            .saturating_mul(self.rows())
            .saturating_mul(self.g.out_len())
    }

    /// The col side of one image: out = W * im2col(img).
    fn fwd<T: Float>(&self, img: &[T], w: &[T], out: &mut [T], col: &mut [T]) -> Result<()> {
        let (cg, mg, rows, p, pin) = (
            self.cg(),
            self.mg(),
            self.rows(),
            self.g.out_len(),
            self.g.in_len(),
        );
        let zero = T::of(0.0);
        for g in 0..self.group {
            let wg = &w[g * mg * rows..(g + 1) * mg * rows];
            match self.order {
                Order::Nchw => {
                    let src = &img[g * cg * pin..(g + 1) * cg * pin];
                    let outg = &mut out[g * mg * p..];
                    if self.g.identity() {
                        product(
                            self.par,
                            mg,
                            rows,
                            p,
                            wg,
                            (rows, 1),
                            src,
                            (p, 1),
                            zero,
                            outg,
                            (p, 1),
                        );
                        continue;
                    }
                    // Blocks of output lines, so that the window matrix
                    // stays in cache between im2col and the product.
                    let o2 = self.g.outs[2];
                    if self.par && self.macs() >= PAR_MACS && o2 > 0 {
                        // One image alone: its line blocks (im2col and
                        // product each) go to the pool's threads.
                        let bounds: Vec<(usize, usize)> = self
                            .line_blocks()
                            .map(|(l0, l1)| (l0 * o2, l1 * o2))
                            .collect();
                        if bounds.len() > 1 {
                            super::gemm::par_column_blocks(
                                mg,
                                rows,
                                p,
                                T::of(1.0),
                                zero,
                                wg,
                                (rows, 1),
                                &bounds,
                                Vec::new,
                                |c0, c1, col| {
                                    im2col_nchw_lines(&self.g, src, cg, c0 / o2, c1 / o2, col)
                                },
                                &mut outg[..mg * p],
                            );
                            continue;
                        }
                    }
                    for (l0, l1) in self.line_blocks() {
                        let nc = (l1 - l0) * self.g.outs[2];
                        im2col_nchw_lines(&self.g, src, cg, l0, l1, col);
                        let c0 = l0 * self.g.outs[2];
                        product(
                            self.par,
                            mg,
                            rows,
                            nc,
                            wg,
                            (rows, 1),
                            col,
                            (nc, 1),
                            zero,
                            &mut outg[c0..],
                            (p, 1),
                        );
                    }
                }
                Order::Nhwc => {
                    if let Some(per) = self.pixel_blocks() {
                        // One image alone: blocks of output pixels (im2col
                        // and product each, its own rows of `out`) go to
                        // the pool's threads.
                        let cout = self.cout;
                        out[..p * cout]
                            .par_chunks_mut(per * cout)
                            .enumerate()
                            .try_for_each_init(
                                || block_buffer::<T>(per, rows),
                                |buf, (i, o)| {
                                    let buf = buf.as_mut().map_err(|e| e.clone())?;
                                    let np = o.len() / cout;
                                    let col = &mut buf[..np * rows];
                                    let j0 = i * per;
                                    im2col_nhwc_pixels(
                                        &self.g,
                                        img,
                                        self.cin,
                                        g * cg,
                                        cg,
                                        j0,
                                        j0 + np,
                                        col,
                                    );
                                    product(
                                        false,
                                        np,
                                        rows,
                                        mg,
                                        col,
                                        (rows, 1),
                                        wg,
                                        (1, rows),
                                        zero,
                                        &mut o[g * mg..],
                                        (cout, 1),
                                    );
                                    Ok(())
                                },
                            )?;
                        continue;
                    }
                    let (a, sa): (&[T], _) = if self.g.identity() {
                        (&img[g * cg..], (self.cin, 1))
                    } else {
                        im2col_nhwc(&self.g, img, self.cin, g * cg, cg, col);
                        (col, (rows, 1))
                    };
                    product(
                        self.par,
                        p,
                        rows,
                        mg,
                        a,
                        sa,
                        wg,
                        (1, rows),
                        zero,
                        &mut out[g * mg..],
                        (self.cout, 1),
                    );
                }
            }
        }
        Ok(())
    }

    /// The adjoint of `fwd`: img = col2im(W^T * cs), for one image.
    fn adj<T: Float>(&self, cs: &[T], w: &[T], img: &mut [T], col: &mut [T]) -> Result<()> {
        let (cg, mg, rows, p, pin) = (
            self.cg(),
            self.mg(),
            self.rows(),
            self.g.out_len(),
            self.g.in_len(),
        );
        let zero = T::of(0.0);
        if !self.g.identity() {
            img.fill(zero);
        }
        for g in 0..self.group {
            let wg = &w[g * mg * rows..(g + 1) * mg * rows];
            match self.order {
                Order::Nchw => {
                    let dst = &mut img[g * cg * pin..(g + 1) * cg * pin];
                    let csg = &cs[g * mg * p..];
                    if self.g.identity() {
                        product(
                            self.par,
                            rows,
                            mg,
                            p,
                            wg,
                            (1, rows),
                            csg,
                            (p, 1),
                            zero,
                            dst,
                            (p, 1),
                        );
                    } else {
                        self.adj_nchw_blocks(csg, wg, dst, col)?;
                    }
                }
                Order::Nhwc => {
                    let csg = &cs[g * mg..];
                    if self.g.identity() {
                        product(
                            self.par,
                            p,
                            mg,
                            rows,
                            csg,
                            (self.cout, 1),
                            wg,
                            (rows, 1),
                            zero,
                            &mut img[g * cg..],
                            (self.cin, 1),
                        );
                    } else {
                        product(
                            self.par,
                            p,
                            mg,
                            rows,
                            csg,
                            (self.cout, 1),
                            wg,
                            (rows, 1),
                            zero,
                            col,
                            (rows, 1),
                        );
                        col2im_nhwc(&self.g, col, self.cin, g * cg, cg, img);
                    }
                }
            }
        }
        Ok(())
    }

    /// Output pixels per block when one large image alone (NHWC, through a
    /// window matrix) splits its forward product across a pool of several
    /// threads: blocks of about `COL_BLOCK` elements of the window matrix,
    /// at least two per thread and at least `MIN_COLS` pixels. None: no
    /// split.
    fn pixel_blocks(&self) -> Option<usize> {
        let (p, rows, threads) = (self.g.out_len(), self.rows(), rayon::current_num_threads());
        if !(self.par
            && self.macs() >= PAR_MACS
            && threads > 1
            && p > 1
            && self.cout > 0
            && !self.g.identity())
        {
            return None;
        }
        let per = (COL_BLOCK / rows.max(1))
            .max(MIN_COLS)
            .min(p.div_ceil(2 * threads))
            .max(1);
        Some(per)
    }

    /// Channels per block when one large image alone (NCHW, through a
    /// window matrix) splits its input channels across a pool of several
    /// threads (`adj` and `wgrad`): two blocks per thread, fewer when there
    /// are fewer channels, so that one descheduled thread holds up less of
    /// the work. None: no split.
    fn channel_blocks(&self) -> Option<usize> {
        let (cg, threads) = (self.cg(), rayon::current_num_threads());
        (self.par
            && self.macs() >= PAR_MACS
            && threads > 1
            && cg > 1
            && self.g.in_len() > 0
            && !self.g.identity())
        .then(|| cg.div_ceil((2 * threads).min(cg)))
    }

    /// `wgrad` of one group, NCHW, with its input channels in blocks of
    /// `per` on the pool: dW's columns of channels c0.. are cs times the
    /// window matrix's rows of those channels, so each block builds only
    /// its own rows (im2col by line blocks, as on one thread) and
    /// accumulates its own columns of dW, in the same order as on one
    /// thread; the blocks are copied into `dwg` at the end.
    fn wgrad_nchw_split<T: Float>(
        &self,
        src: &[T],
        csg: &[T],
        dwg: &mut [T],
        per: usize,
    ) -> Result<()> {
        let (cg, mg, rows, p, pin) = (
            self.cg(),
            self.mg(),
            self.rows(),
            self.g.out_len(),
            self.g.in_len(),
        );
        let (ks, o2) = (self.g.ksize(), self.g.outs[2]);
        let (zero, one) = (T::of(0.0), T::of(1.0));
        let lines: Vec<(usize, usize)> = self.line_blocks().collect();
        let widest = lines
            .iter()
            .map(|&(l0, l1)| (l1 - l0) * o2)
            .max()
            .unwrap_or(0);
        let starts: Vec<usize> = (0..cg).step_by(per).collect();
        let before: &[T] = dwg;
        let blocks: Vec<(usize, Vec<T>)> = starts
            .into_par_iter()
            .map_init(
                || block_buffer::<T>(per * ks, widest),
                |buf, c0| -> Result<(usize, Vec<T>)> {
                    let buf = buf.as_mut().map_err(|e| e.clone())?;
                    let r = per.min(cg - c0) * ks;
                    let mut acc =
                        crate::tensor::filled_vec(mg * r, zero, "a filter gradient block")?;
                    for (i, a) in acc.chunks_mut(r).enumerate() {
                        let at = i * rows + c0 * ks;
                        a.copy_from_slice(&before[at..at + r]);
                    }
                    for &(l0, l1) in &lines {
                        let w = (l1 - l0) * o2;
                        let col = &mut buf[..r * w];
                        im2col_nchw_lines(&self.g, &src[c0 * pin..], r / ks, l0, l1, col);
                        product(
                            false,
                            mg,
                            w,
                            r,
                            &csg[l0 * o2..],
                            (p, 1),
                            col,
                            (1, w),
                            one,
                            &mut acc,
                            (r, 1),
                        );
                    }
                    Ok((c0, acc))
                },
            )
            .collect::<Result<_>>()?;
        for (c0, acc) in blocks {
            let r = acc.len() / mg.max(1);
            for (i, a) in acc.chunks(r.max(1)).enumerate() {
                let at = i * rows + c0 * ks;
                dwg[at..at + r].copy_from_slice(a);
            }
        }
        Ok(())
    }

    /// `adj` of one group, NCHW, through a window matrix: for each block
    /// of output lines, col = W^T * cs (its columns of it), then col2im of
    /// that block (the block stays in cache between the two). One large
    /// image alone on a pool of several threads cuts its `cg` channels into
    /// blocks that run on the pool, each over every line block with a
    /// scratch buffer of its own: a channel's pixels take additions only
    /// from its own rows of the window matrix, so the blocks write disjoint
    /// parts of `dst`, and each pixel sees the same additions in the same
    /// order as on one thread (the same values too, where the GEMM computes
    /// an element the same way whatever the height of the block, as
    /// `matrixmultiply` does: the tests check it bitwise in float64).
    fn adj_nchw_blocks<T: Float>(
        &self,
        csg: &[T],
        wg: &[T],
        dst: &mut [T],
        col: &mut [T],
    ) -> Result<()> {
        let (cg, mg, rows, p, pin) = (
            self.cg(),
            self.mg(),
            self.rows(),
            self.g.out_len(),
            self.g.in_len(),
        );
        let (ks, o2) = (self.g.ksize(), self.g.outs[2]);
        let zero = T::of(0.0);
        let lines: Vec<(usize, usize)> = self.line_blocks().collect();
        // Channels c0..c0 + nc into `dst` (their pixels), `buf` at least
        // nc * K x (widest block) elements.
        let run = |c0: usize, nc: usize, dst: &mut [T], buf: &mut [T]| {
            for &(l0, l1) in &lines {
                let w = (l1 - l0) * o2;
                let m = nc * ks;
                product(
                    false,
                    m,
                    mg,
                    w,
                    &wg[c0 * ks..],
                    (1, rows),
                    &csg[l0 * o2..],
                    (p, 1),
                    zero,
                    &mut buf[..m * w],
                    (w, 1),
                );
                col2im_nchw_lines(&self.g, &buf[..m * w], nc, l0, l1, dst);
            }
        };
        if let Some(per) = self.channel_blocks() {
            let widest = lines
                .iter()
                .map(|&(l0, l1)| (l1 - l0) * o2)
                .max()
                .unwrap_or(0);
            dst[..cg * pin]
                .par_chunks_mut(per * pin)
                .enumerate()
                .try_for_each_init(
                    || block_buffer::<T>(per * ks, widest),
                    |buf, (i, d)| {
                        let buf = buf.as_mut().map_err(|e| e.clone())?;
                        run(i * per, d.len() / pin.max(1), d, buf);
                        Ok(())
                    },
                )
        } else {
            run(0, cg, &mut dst[..cg * pin], col);
            Ok(())
        }
    }

    /// dW += cs * im2col(img)^T for one image.
    fn wgrad<T: Float>(&self, img: &[T], cs: &[T], dw: &mut [T], col: &mut [T]) -> Result<()> {
        let (cg, mg, rows, p, pin) = (
            self.cg(),
            self.mg(),
            self.rows(),
            self.g.out_len(),
            self.g.in_len(),
        );
        let one = T::of(1.0);
        for g in 0..self.group {
            let dwg = &mut dw[g * mg * rows..(g + 1) * mg * rows];
            match self.order {
                Order::Nchw => {
                    let src = &img[g * cg * pin..(g + 1) * cg * pin];
                    let csg = &cs[g * mg * p..];
                    if self.g.identity() {
                        product(
                            self.par,
                            mg,
                            p,
                            rows,
                            csg,
                            (p, 1),
                            src,
                            (1, p),
                            one,
                            dwg,
                            (rows, 1),
                        );
                        continue;
                    }
                    if let Some(per) = self.channel_blocks() {
                        self.wgrad_nchw_split(src, csg, dwg, per)?;
                        continue;
                    }
                    for (l0, l1) in self.line_blocks() {
                        let nc = (l1 - l0) * self.g.outs[2];
                        im2col_nchw_lines(&self.g, src, cg, l0, l1, col);
                        let c0 = l0 * self.g.outs[2];
                        product(
                            self.par,
                            mg,
                            nc,
                            rows,
                            &csg[c0..],
                            (p, 1),
                            col,
                            (1, nc),
                            one,
                            dwg,
                            (rows, 1),
                        );
                    }
                }
                Order::Nhwc => {
                    let (b, sb): (&[T], _) = if self.g.identity() {
                        (&img[g * cg..], (self.cin, 1))
                    } else {
                        im2col_nhwc(&self.g, img, self.cin, g * cg, cg, col);
                        (col, (rows, 1))
                    };
                    product(
                        self.par,
                        mg,
                        p,
                        rows,
                        &cs[g * mg..],
                        (1, self.cout),
                        b,
                        sb,
                        one,
                        dwg,
                        (rows, 1),
                    );
                }
            }
        }
        Ok(())
    }
}

/// A block of a window matrix (`rows` x `cols`) for one of the pool's
/// threads.
fn block_buffer<T: Float>(rows: usize, cols: usize) -> Result<Vec<T>> {
    let n = crate::tensor::size_mul(rows, cols, || "a block of a window matrix".to_string())?;
    crate::tensor::default_buffer(n, "a block of a window matrix")
}

/// Elements of a block of the window matrix (512 KiB of float32): small
/// enough to stay in the L2 cache between im2col and the product.
const COL_BLOCK: usize = 1 << 17;
/// The fewest columns of a block of the window matrix.
const MIN_COLS: usize = 256;

/// Images run on the kernel pool when there are several and the work
/// (multiply-adds) pays for the hand-off.
const PAR_MACS: usize = 1 << 20;

fn parallel(n: usize, macs_per_image: usize) -> bool {
    n > 1
        && macs_per_image.saturating_mul(n) >= PAR_MACS
        && crate::threads::pool_available()
        && rayon::current_num_threads() > 1
}

/// `f(i, src_i, dst_i, scratch)` for each image i.
fn per_image<T: Float>(
    plan: &Plan,
    n: usize,
    src: &[T],
    src_len: usize,
    dst: &mut [T],
    dst_len: usize,
    f: impl Fn(&[T], &mut [T], &mut [T]) -> Result<()> + Sync + Send,
) -> Result<()> {
    if dst_len == 0 {
        return Ok(());
    }
    if parallel(n, plan.macs()) {
        dst.par_chunks_mut(dst_len).enumerate().try_for_each_init(
            || plan.scratch::<T>(),
            |col, (i, d)| match col {
                Ok(col) => f(&src[i * src_len..(i + 1) * src_len], d, col),
                Err(e) => Err(e.clone()),
            },
        )
    } else {
        let mut col = plan.scratch::<T>()?;
        for (i, d) in dst.chunks_mut(dst_len).enumerate() {
            f(&src[i * src_len..(i + 1) * src_len], d, &mut col)?;
        }
        Ok(())
    }
}

/// The Winograd correlation (`ops/winograd.rs`) that computes `fwd`
/// (or, with `adjoint`, `adj`) for `n` images of this plan, when the
/// plan takes one: float32, one group, a 2-D 3x3 window with stride and
/// dilation 1, and a product large enough for it to measure faster than
/// im2col + GEMM (BENCHMARKS.md, "Conv (issue 15)").
fn winograd_for<T: Float>(p: &Plan, n: usize, adjoint: bool) -> Option<Wino> {
    let g = &p.g;
    let eligible = T::DTYPE == DataType::Float
        && p.group == 1
        && g.k == [1, 3, 3]
        && g.s == [1; 3]
        && g.d == [1; 3]
        && g.ins[0] == 1
        && g.outs[0] == 1
        && g.ph[0] == 0
        && winograd_pays(p, n);
    if !eligible {
        return None;
    }
    let nhwc = p.order == Order::Nhwc;
    let (ph, pw) = (g.ph[1] as isize, g.ph[2] as isize);
    Some(if adjoint {
        // img[iy] = sum over a of cs[iy - a + ph] * w[a]: a correlation of
        // the col side with the flipped filter, offset by 2 - ph.
        Wino {
            n,
            c: p.cout,
            k: p.cin,
            h: g.outs[1],
            w: g.outs[2],
            oh: g.ins[1],
            ow: g.ins[2],
            pt: 2 - ph,
            pl: 2 - pw,
            nhwc,
        }
    } else {
        Wino {
            n,
            c: p.cin,
            k: p.cout,
            h: g.ins[1],
            w: g.ins[2],
            oh: g.outs[1],
            ow: g.outs[2],
            pt: ph,
            pl: pw,
            nhwc,
        }
    })
}

/// Whether Winograd beats im2col + GEMM for `n` images of this plan.
/// Measured (BENCHMARKS.md "Conv (issue 15)", CPU time on one thread):
/// im2col's GEMM runs near full speed once an image has a few hundred
/// output pixels (ResNet-18's 56x56, 28x28 and 14x14 layers: 70-80 GF/s,
/// which this Winograd, its transforms included, did not beat), and slows
/// down for small images (7x7: 52 GF/s), where Winograd's GEMMs, over the
/// tiles of the whole batch, ran at 77 GF/s equivalent. Its filter
/// transform costs as much as the products of ~100 tiles, so the batch
/// must hold enough of them.
fn winograd_pays(p: &Plan, n: usize) -> bool {
    let tiles = n * p.g.outs[1].div_ceil(2) * p.g.outs[2].div_ceil(2);
    p.g.out_len() <= WINO_MAX_PIXELS && tiles >= WINO_MIN_TILES
}

/// The most output pixels per image for which Winograd is chosen.
const WINO_MAX_PIXELS: usize = 64;
/// The fewest tiles (2x2 outputs, over the batch) for which it is chosen.
const WINO_MIN_TILES: usize = 256;

/// Filter tap (a, b) of window column `c` of filter row `k` (the plan's
/// filter layout: NCHW `[k][c][a][b]`, NHWC `[k][a][b][c]`).
fn tap3<T: Float>(p: &Plan, w: &[T], k: usize, c: usize, a: usize, b: usize) -> T {
    let rows = p.rows();
    match p.order {
        Order::Nchw => w[k * rows + c * 9 + a * 3 + b],
        Order::Nhwc => w[k * rows + (a * 3 + b) * p.cin + c],
    }
}

/// `fwd` for each of `n` images (`src` the image side, `dst` the col side).
fn run_fwd<T: Float>(p: &Plan, n: usize, src: &[T], w: &[T], dst: &mut [T]) -> Result<()> {
    if let Some(wino) = winograd_for::<T>(p, n, false) {
        wino.run(src, |k, c, a, b| tap3(p, w, k, c, a, b), dst);
        return Ok(());
    }
    per_image(p, n, src, p.img_len(), dst, p.col_len(), |s, d, col| {
        p.fwd(s, w, d, col)
    })
}

/// `adj` for each of `n` images (`src` the col side, `dst` the image side).
fn run_adj<T: Float>(p: &Plan, n: usize, src: &[T], w: &[T], dst: &mut [T]) -> Result<()> {
    if let Some(wino) = winograd_for::<T>(p, n, true) {
        wino.run(src, |k, c, a, b| tap3(p, w, c, k, 2 - a, 2 - b), dst);
        return Ok(());
    }
    per_image(p, n, src, p.col_len(), dst, p.img_len(), |s, d, col| {
        p.adj(s, w, d, col)
    })
}

/// Sum over images of `wgrad(img_i, cs_i)`, into a fresh dW.
fn weight_grad<T: Float>(
    plan: &Plan,
    n: usize,
    img: &[T],
    cs: &[T],
    w_len: usize,
) -> Result<Vec<T>> {
    let (il, cl) = (plan.img_len(), plan.col_len());
    let one = |i: usize, acc: &mut Vec<T>, col: &mut Vec<T>| -> Result<()> {
        plan.wgrad(
            &img[i * il..(i + 1) * il],
            &cs[i * cl..(i + 1) * cl],
            acc,
            col,
        )
    };
    let acc = || crate::tensor::default_buffer::<T>(w_len, "a filter gradient");
    if parallel(n, plan.macs()) {
        (0..n)
            .into_par_iter()
            .fold(
                || -> Result<(Vec<T>, Vec<T>)> { Ok((acc()?, plan.scratch::<T>()?)) },
                |state, i| {
                    let (mut acc, mut col) = state?;
                    one(i, &mut acc, &mut col)?;
                    Ok((acc, col))
                },
            )
            .map(|r| r.map(|(acc, _)| acc))
            .try_reduce_with(|mut a, b| {
                for (x, y) in a.iter_mut().zip(b) {
                    *x += y;
                }
                Ok(a)
            })
            .unwrap_or_else(acc)
    } else {
        let mut acc = acc()?;
        let mut col = plan.scratch::<T>()?;
        for i in 0..n {
            one(i, &mut acc, &mut col)?;
        }
        Ok(acc)
    }
}

/// Adds `b[c]` to every pixel of channel c (images of `ch` channels and
/// `sp` pixels).
fn add_bias<T: Float>(y: &mut [T], b: &[T], ch: usize, sp: usize, order: Order) {
    let img = ch * sp;
    if img == 0 {
        return;
    }
    for im in y.chunks_mut(img) {
        match order {
            Order::Nchw => {
                for (plane, &bc) in im.chunks_mut(sp.max(1)).zip(b) {
                    for v in plane {
                        *v += bc;
                    }
                }
            }
            Order::Nhwc => {
                for px in im.chunks_mut(ch) {
                    for (v, &bc) in px.iter_mut().zip(b) {
                        *v += bc;
                    }
                }
            }
        }
    }
}

/// The per-channel sums of images of `ch` channels and `sp` pixels.
fn channel_sums<T: Float>(y: &[T], ch: usize, sp: usize, order: Order) -> Result<Vec<T>> {
    let mut s = crate::tensor::default_buffer::<T>(ch, "a bias gradient")?;
    let img = ch * sp;
    if img == 0 {
        return Ok(s);
    }
    for im in y.chunks(img) {
        match order {
            Order::Nchw => {
                for (plane, acc) in im.chunks(sp).zip(s.iter_mut()) {
                    for &v in plane {
                        *acc += v;
                    }
                }
            }
            Order::Nhwc => {
                for px in im.chunks(ch) {
                    for (acc, &v) in s.iter_mut().zip(px) {
                        *acc += v;
                    }
                }
            }
        }
    }
    Ok(s)
}

// ---------------------------------------------------------- shape checks --

/// (N, C, spatial dims) of an image tensor in `order`.
pub(crate) fn split_image(
    op: &str,
    what: &str,
    name: &str,
    shape: &[usize],
    order: Order,
) -> Result<(usize, usize, Vec<usize>)> {
    if !(3..=5).contains(&shape.len()) {
        return Err(Error::shape(format!(
            "{op}: {what} ('{name}', shape {shape:?}) must have 3 to 5 dims: N, C and 1 to 3 spatial dims ({order:?})"
        ))
        .with_blob(name));
    }
    let nd = shape.len() - 2;
    Ok(match order {
        Order::Nchw => (shape[0], shape[1], shape[2..].to_vec()),
        Order::Nhwc => (shape[0], shape[nd + 1], shape[1..=nd].to_vec()),
    })
}

/// The shape of an image tensor (N, C, spatial dims) in `order`.
pub(crate) fn image_shape(n: usize, c: usize, sp: &[usize], order: Order) -> Vec<usize> {
    let mut s = vec![n];
    match order {
        Order::Nchw => {
            s.push(c);
            s.extend_from_slice(sp);
        }
        Order::Nhwc => {
            s.extend_from_slice(sp);
            s.push(c);
        }
    }
    s
}

fn geo_err(op: &str, name: &str, e: Error) -> Error {
    Error::new(e.kind, format!("{op}: {}", e.message)).with_blob(name)
}

/// The filter's (rows, per-group image channels, spatial dims).
fn split_filter(
    op: &str,
    name: &str,
    shape: &[usize],
    nd: usize,
    order: Order,
) -> Result<(usize, usize, Vec<usize>)> {
    if shape.len() != nd + 2 {
        return Err(Error::shape(format!(
            "{op}: the filter ('{name}', shape {shape:?}) must have {} dims for a {nd}-D input",
            nd + 2
        ))
        .with_blob(name));
    }
    Ok(match order {
        Order::Nchw => (shape[0], shape[1], shape[2..].to_vec()),
        Order::Nhwc => (shape[0], shape[nd + 1], shape[1..=nd].to_vec()),
    })
}

/// The plan of a Conv or ConvTranspose op from its input and filter.
struct ConvSetup {
    plan: Plan,
    n: usize,
    /// The output's shape (Y for the forward ops).
    y_shape: Vec<usize>,
    /// Channels the bias adds to.
    bias_ch: usize,
}

fn conv_setup(
    l: &Locked<'_>,
    op: &str,
    win: &Window,
    group: usize,
    transposed: Option<&[usize]>,
) -> Result<ConvSetup> {
    let (xs, ws) = (l.tensor(0)?.shape(), l.tensor(1)?.shape());
    let (xn, wn) = (l.input_name(0), l.input_name(1));
    let order = win.order;
    let (n, c, sp) = split_image(op, "X", xn, xs, order)?;
    let nd = sp.len();
    let (rows, per_group, ksp) = split_filter(op, wn, ws, nd, order)?;
    let g = win
        .geometry(&sp, Some(&ksp), transposed)
        .map_err(|e| geo_err(op, wn, e))?;
    if transposed.is_none() {
        // Conv: X has C = per_group * group channels; W has M rows.
        if c != per_group * group || rows % group != 0 {
            return Err(Error::shape(format!(
                "{op}: X ('{xn}', shape {xs:?}) has {c} channels and the filter ('{wn}', shape {ws:?}) expects {per_group} per group x group {group}, with M = {rows} divisible by group"
            ))
            .with_blob(wn));
        }
        let y_shape = image_shape(n, rows, &g.outs[3 - nd..], order);
        crate::tensor::checked_numel::<f64>(&y_shape, format_args!("{op}'s output"))?;
        Ok(ConvSetup {
            plan: Plan {
                g,
                group,
                cin: c,
                cout: rows,
                order,
                par: false,
            },
            n,
            y_shape,
            bias_ch: rows,
        })
    } else {
        // ConvTranspose: W is (C, M / group, kernel); X has the C channels.
        if rows != c || c % group != 0 {
            return Err(Error::shape(format!(
                "{op}: X ('{xn}', shape {xs:?}) has {c} channels and the filter ('{wn}', shape {ws:?}) has {rows} (they must match, divisible by group {group})"
            ))
            .with_blob(wn));
        }
        let m = per_group * group;
        let y_shape = image_shape(n, m, &g.ins[3 - nd..], order);
        crate::tensor::checked_numel::<f64>(&y_shape, format_args!("{op}'s output"))?;
        Ok(ConvSetup {
            plan: Plan {
                g,
                group,
                cin: m,
                cout: c,
                order,
                par: false,
            },
            n,
            y_shape,
            bias_ch: m,
        })
    }
}

fn check_len(op: &str, l: &Locked<'_>, i: usize, what: &str, want: usize) -> Result<()> {
    let t = l.tensor(i)?;
    if t.shape().iter().product::<usize>() != want {
        return Err(Error::shape(format!(
            "{op}: {what} ('{}', shape {:?}) must have {want} elements",
            l.input_name(i),
            t.shape()
        ))
        .with_blob(l.input_name(i)));
    }
    Ok(())
}

// --------------------------------------------------------------- kernels --

struct ConvArgs {
    win: Window,
    group: usize,
    /// ConvTranspose's `adj` per dim (None for Conv).
    adj: Option<Dims>,
    op: String,
    num_inputs: usize,
    num_outputs: usize,
}

impl ConvArgs {
    fn parse(ctx: &OpDefCtx<'_>, transposed: bool) -> Result<ConvArgs> {
        let group = ctx.args.i64("group", 1)?;
        if group < 1 {
            return Err(ctx.bad_arg(format!("group must be >= 1, got {group}")));
        }
        let adj = if transposed {
            Some(dims_arg(ctx, "adjs", "adj", &["adj_h", "adj_w"], Some(0))?)
        } else {
            None
        };
        Ok(ConvArgs {
            win: Window::parse(ctx, !transposed)?,
            group: group as usize,
            adj,
            op: ctx.op_type().to_string(),
            num_inputs: ctx.num_inputs(),
            num_outputs: ctx.num_outputs(),
        })
    }
    fn adj(&self, nd: usize) -> Result<Option<Vec<usize>>> {
        self.adj
            .as_ref()
            .map(|a| a.resolve("adjs", nd, 1, 0))
            .transpose()
            .map_err(|e| Error::new(e.kind, format!("{}: {}", self.op, e.message)))
    }
    fn setup(&self, l: &Locked<'_>) -> Result<ConvSetup> {
        let nd = l.tensor(0)?.shape().len().saturating_sub(2);
        let adj = self.adj(nd)?;
        if let Some(a) = &adj {
            let s = self
                .win
                .stride
                .resolve("strides", nd, 1, 1)
                .unwrap_or_default();
            if a.iter().zip(&s).any(|(a, s)| a >= s) {
                return Err(Error::invalid_arg(format!(
                    "{}: adj {a:?} must be smaller than the strides {s:?}",
                    self.op
                )));
            }
        }
        let mut s = conv_setup(l, &self.op, &self.win, self.group, adj.as_deref())?;
        s.plan.par = !parallel(s.n, s.plan.macs()) && crate::threads::pool_available();
        Ok(s)
    }
}

fn conv_t<T: Float>(l: &mut Locked<'_>, a: &ConvArgs) -> Result<()> {
    let op = a.op.as_str();
    let transposed = a.adj.is_some();
    let s = a.setup(l)?;
    let x = dense(input::<T>(l, op, 0)?);
    let w = dense(input::<T>(l, op, 1)?);
    let bias = if a.num_inputs == 3 {
        check_len(op, l, 2, "the bias", s.bias_ch)?;
        Some(dense(input::<T>(l, op, 2)?).into_owned())
    } else {
        None
    };
    let p = &s.plan;
    let mut y = crate::tensor::zeroed_vec::<T>(&s.y_shape, format_args!("{op}'s output"))?;
    if transposed {
        run_adj(p, s.n, &x, &w, &mut y)?;
    } else {
        run_fwd(p, s.n, &x, &w, &mut y)?;
    }
    if let Some(b) = bias {
        let sp = if transposed {
            p.g.in_len()
        } else {
            p.g.out_len()
        };
        add_bias(&mut y, &b, s.bias_ch, sp, p.order);
    }
    l.set_output(0, T::wrap(array(&s.y_shape, y)?));
    Ok(())
}

fn build_conv(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let transposed = ctx.op_type().starts_with("ConvTranspose");
    let a = ConvArgs::parse(ctx, transposed)?;
    float_kernel!(&a.op, 0, |l| conv_t(&mut l, &a))
}

fn conv_grad_t<T: Float>(l: &mut Locked<'_>, a: &ConvArgs, no_bias: bool) -> Result<()> {
    let op = a.op.as_str();
    let transposed = a.adj.is_some();
    let s = a.setup(l)?;
    let y_len: usize = s.y_shape.iter().product();
    check_len(op, l, 2, "dY", y_len)?;
    let dys = l.tensor(2)?.shape().to_vec();
    if dys != s.y_shape {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {dys:?}) must have the forward output's shape {:?}",
            l.input_name(2),
            s.y_shape
        ))
        .with_blob(l.input_name(2)));
    }
    let (x, w, dy) = (
        input::<T>(l, op, 0)?,
        input::<T>(l, op, 1)?,
        input::<T>(l, op, 2)?,
    );
    let (x_shape, w_shape) = (x.shape().to_vec(), w.shape().to_vec());
    let (x, w, dy) = (dense(x), dense(w), dense(dy));
    let p = &s.plan;
    // Conv: image side X, col side dY; ConvTranspose: image side dY, col side X.
    let dw = if transposed {
        weight_grad(p, s.n, &dy, &x, w.len())?
    } else {
        weight_grad(p, s.n, &x, &dy, w.len())?
    };
    let sp = if transposed {
        p.g.in_len()
    } else {
        p.g.out_len()
    };
    let db = (!no_bias)
        .then(|| channel_sums(&dy, s.bias_ch, sp, p.order))
        .transpose()?;
    let want_dx = a.num_outputs == if no_bias { 2 } else { 3 };
    let dx = if want_dx {
        let mut dx = crate::tensor::zeroed_vec::<T>(&x_shape, format_args!("{op}'s dX"))?;
        if transposed {
            run_fwd(p, s.n, &dy, &w, &mut dx)?;
        } else {
            run_adj(p, s.n, &dy, &w, &mut dx)?;
        }
        Some(array(&x_shape, dx)?)
    } else {
        None
    };
    l.set_output(0, T::wrap(array(&w_shape, dw)?));
    let mut next = 1;
    if let Some(db) = db {
        l.set_output(1, T::wrap(array(&[s.bias_ch], db)?));
        next = 2;
    }
    if let Some(dx) = dx {
        l.set_output(next, T::wrap(dx));
    }
    Ok(())
}

fn build_conv_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let transposed = ctx.op_type().starts_with("ConvTranspose");
    let a = ConvArgs::parse(ctx, transposed)?;
    let no_bias = ctx.args.i64("no_bias", 0)? != 0;
    let no = ctx.num_outputs();
    if no_bias && no > 2 {
        return Err(ctx.bad_arg(format!(
            "with no_bias the outputs are (dW[, dX]); got {no} outputs"
        )));
    }
    float_kernel!(&a.op, 0, |l| conv_grad_t(&mut l, &a, no_bias))
}

// --------------------------------------------------------------- schemas --

/// The window arguments of conv and pooling ops.
pub(crate) const WINDOW_ARGS: &[ArgDoc] = &[
    arg!("kernel", "int", "none", "the window size in every spatial dim (2-D)"),
    arg!("kernels", "list of int", "none", "the window size per spatial dim (N-D)"),
    arg!("kernel_h", "int", "none", "window height (with kernel_w)"),
    arg!("kernel_w", "int", "none", "window width (with kernel_h)"),
    arg!("stride", "int", "1", "the stride in every spatial dim"),
    arg!("strides", "list of int", "1s", "the stride per spatial dim"),
    arg!("stride_h", "int", "1", "vertical stride"),
    arg!("stride_w", "int", "1", "horizontal stride"),
    arg!("pad", "int", "0", "zero padding at both ends of every spatial dim"),
    arg!("pads", "list of int", "0s", "pads: the heads of each spatial dim, then the tails"),
    arg!("pad_t", "int", "0", "top pad"),
    arg!("pad_l", "int", "0", "left pad"),
    arg!("pad_b", "int", "0", "bottom pad"),
    arg!("pad_r", "int", "0", "right pad"),
    arg!("dilation", "int", "1", "the dilation in every spatial dim"),
    arg!("dilations", "list of int", "1s", "the dilation per spatial dim"),
    arg!("dilation_h", "int", "1", "vertical dilation"),
    arg!("dilation_w", "int", "1", "horizontal dilation"),
    arg!("legacy_pad", "int", "0", "0 NOTSET (explicit pads), 1 VALID, 2 SAME, 3 CAFFE_LEGACY_POOLING (output size rounded up)"),
    arg!("order", "string", "\"NCHW\"", "NCHW (channels after the batch dim) or NHWC (channels last)"),
    arg!("global_pooling", "int", "0", "the window is the whole image (pooling)"),
    arg!("group", "int", "1", "groups of channels convolved separately (conv)"),
    arg!("count_include_pad", "bool", "false", "AveragePool divides by the window's size including pads"),
    arg!("no_gradient_to_input", "int", "0", "Conv, ConvTranspose: the backward pass computes no dX"),
    arg!("no_bias", "int", "0", "gradient ops: the forward op had no bias; outputs (dW[, dX])"),
    arg!("adj", "int", "0", "ConvTranspose: extra output size at the tail of every spatial dim"),
    arg!("adjs", "list of int", "0s", "ConvTranspose: adj per spatial dim"),
    arg!("adj_h", "int", "0", "ConvTranspose: vertical adj"),
    arg!("adj_w", "int", "0", "ConvTranspose: horizontal adj"),
];

/// Engine and memory hints that Caffe2 conv nets carry; accepted and ignored.
pub(crate) const CONV_IGNORED: &[ArgDoc] = &[
    arg!(
        "shared_buffer",
        "int",
        "0",
        "share the im2col buffer between ops (a memory hint); accepted and ignored"
    ),
    arg!(
        "float16_compute",
        "bool",
        "false",
        "half-precision compute hint (GPU); accepted and ignored"
    ),
    arg!(
        "engine",
        "string",
        "\"\"",
        "engine hint given as an argument; accepted and ignored"
    ),
    arg!(
        "force_algo_fwd",
        "int",
        "-1",
        "cuDNN forward algorithm choice; accepted and ignored"
    ),
    arg!(
        "force_algo_dgrad",
        "int",
        "-1",
        "cuDNN data-gradient algorithm choice; accepted and ignored"
    ),
    arg!(
        "force_algo_wgrad",
        "int",
        "-1",
        "cuDNN filter-gradient algorithm choice; accepted and ignored"
    ),
    arg!(
        "cudnn_state",
        "int",
        "0",
        "cuDNN state slot (GPU); accepted and ignored"
    ),
    arg!(
        "deterministic",
        "bool",
        "false",
        "cuDNN deterministic-algorithm hint (pooling); accepted and ignored"
    ),
];

pub fn schemas() -> Vec<OpSchema> {
    let conv = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_conv)
            .inputs(2, 3)
            .outputs(1, 1)
            .args(WINDOW_ARGS)
            .ignores(CONV_IGNORED)
            .doc(doc)
    };
    let grad = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_conv_grad)
            .inputs(3, 3)
            .outputs(1, 3)
            .args(WINDOW_ARGS)
            .ignores(CONV_IGNORED)
            .doc(doc)
    };
    const CONV_DOC: &str = "Convolution: inputs (X, filter W[, bias b]); NCHW: X (N, C, spatial), W (M, C / group, kernel), Y (N, M, out spatial); NHWC: X (N, spatial, C), W (M, kernel, C / group); 1 to 3 spatial dims. The kernel may be left out (read from W).";
    const CONV_GRAD_DOC: &str =
        "Gradient of Conv: inputs (X, W, dY), outputs (dW, db[, dX]), or (dW[, dX]) with no_bias.";
    const CT_DOC: &str = "Transposed convolution (the adjoint of Conv): inputs (X, W[, bias]); NCHW: X (N, C, spatial), W (C, M / group, kernel), Y (N, M, (in - 1) * stride - pads + kernel + adj); NHWC: W (C, kernel, M / group).";
    const CT_GRAD_DOC: &str = "Gradient of ConvTranspose: inputs (X, W, dY), outputs (dW, db[, dX]), or (dW[, dX]) with no_bias.";
    vec![
        conv("Conv", CONV_DOC),
        conv("Conv1D", "Conv on 1 spatial dim."),
        conv("Conv2D", "Conv on 2 spatial dims."),
        conv("Conv3D", "Conv on 3 spatial dims."),
        grad("ConvGradient", CONV_GRAD_DOC),
        grad("Conv1DGradient", CONV_GRAD_DOC),
        grad("Conv2DGradient", CONV_GRAD_DOC),
        grad("Conv3DGradient", CONV_GRAD_DOC),
        conv("ConvTranspose", CT_DOC),
        grad("ConvTransposeGradient", CT_GRAD_DOC),
    ]
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::test_util::{f32s, get, int_arg, op, run, vals, ws_with};

    /// Window arguments whose sizes overflow are refused, naming the
    /// argument (issue 28: they wrapped, or panicked in debug builds), and
    /// a kernel read from a filter with a 0 spatial dim is a shape error.
    #[test]
    fn overflowing_windows_and_empty_kernels_are_refused() {
        let ws = ws_with(&[
            ("x", f32s(&[1, 1, 5, 5], &[1.; 25])),
            ("w", f32s(&[3, 1, 3, 3], &[1.; 27])),
            ("wt", f32s(&[1, 3, 3, 3], &[1.; 27])),
            ("w0", f32s(&[3, 1, 0, 3], &[])),
            ("w4", f32s(&[1, 1, 4, 4], &[1.; 16])),
        ]);
        let cases = [
            (
                "Conv",
                "w",
                vec![int_arg("kernel", 3), int_arg("pad", 1 << 62)],
                "`pad`/`pads`",
            ),
            (
                "Conv",
                "w",
                vec![int_arg("kernel", 3), int_arg("pad", i64::MAX)],
                "`pad`/`pads`",
            ),
            (
                "ConvTranspose",
                "wt",
                vec![int_arg("kernel", 3), int_arg("stride", 1 << 62)],
                "`stride`/`strides`",
            ),
            (
                "MaxPool",
                "",
                vec![int_arg("kernel", 1), int_arg("pad", i64::MAX)],
                "`pad`/`pads`",
            ),
            (
                "Conv",
                "w4",
                vec![int_arg("kernel", 4), int_arg("dilation", i64::MAX)],
                "`dilation`/`dilations`",
            ),
        ];
        for (ty, w, args, arg) in cases {
            let ins: Vec<&str> = if w.is_empty() {
                vec!["x"]
            } else {
                vec!["x", w]
            };
            let e = run(&ws, op(ty, &ins, &["y"], args)).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{ty}: {}", e.message);
            assert!(e.message.contains(arg), "{ty}: {}", e.message);
        }
        let e = run(&ws, op("Conv", &["x", "w0"], &["y"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape, "{}", e.message);
        assert!(e.message.contains("must all be > 0"), "{}", e.message);
    }

    #[test]
    fn conv_by_hand() {
        // X 1x1x3x3 = 1..9, W 1x1x2x2 = ones, b = 1: Y = window sums + 1.
        let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        let ws = ws_with(&[
            ("x", f32s(&[1, 1, 3, 3], &x)),
            ("w", f32s(&[1, 1, 2, 2], &[1.; 4])),
            ("b", f32s(&[1], &[1.])),
        ]);
        run(
            &ws,
            op("Conv", &["x", "w", "b"], &["y"], vec![int_arg("kernel", 2)]),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "y")), vec![13., 17., 25., 29.]);
        // pad 1, stride 2: corners of a 4x4 padded window grid.
        run(
            &ws,
            op(
                "Conv",
                &["x", "w"],
                &["y2"],
                vec![
                    int_arg("kernel", 2),
                    int_arg("pad", 1),
                    int_arg("stride", 2),
                ],
            ),
        )
        .unwrap();
        assert_eq!(get(&ws, "y2").shape(), &[1, 1, 2, 2]);
        assert_eq!(vals(&get(&ws, "y2")), vec![1., 5., 11., 28.]);
        // A kernel that does not match the filter is a shape error.
        let e = run(
            &ws,
            op("Conv", &["x", "w"], &["y3"], vec![int_arg("kernel", 3)]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        let e = run(
            &ws,
            op("Conv", &["x", "w"], &["y3"], vec![int_arg("stride", -1)]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    /// dX of a 2-D convolution (NCHW) by its definition: every product
    /// w[m, c, a, b] * dy[n, m, y, x] added to the input pixel its tap
    /// reads.
    #[allow(clippy::too_many_arguments)]
    fn dx_by_definition(
        n: usize,
        c: usize,
        m: usize,
        (h, w): (usize, usize),
        k: usize,
        (s, p, d, group): (usize, usize, usize, usize),
        wt: &[f64],
        dy: &[f64],
    ) -> Vec<f64> {
        let oh = (h + 2 * p - d * (k - 1) - 1) / s + 1;
        let ow = (w + 2 * p - d * (k - 1) - 1) / s + 1;
        let (cg, mg) = (c / group, m / group);
        let mut dx = vec![0.0; n * c * h * w];
        for i in 0..n {
            for mo in 0..m {
                let g = mo / mg;
                for ci in 0..cg {
                    let cc = g * cg + ci;
                    for a in 0..k {
                        for b in 0..k {
                            let wv = wt[((mo * cg + ci) * k + a) * k + b];
                            for y in 0..oh {
                                let yi = (y * s + a * d) as isize - p as isize;
                                if yi < 0 || yi >= h as isize {
                                    continue;
                                }
                                for x in 0..ow {
                                    let xi = (x * s + b * d) as isize - p as isize;
                                    if xi < 0 || xi >= w as isize {
                                        continue;
                                    }
                                    dx[((i * c + cc) * h + yi as usize) * w + xi as usize] +=
                                        wv * dy[((i * m + mo) * oh + y) * ow + x];
                                }
                            }
                        }
                    }
                }
            }
        }
        dx
    }

    /// dW of the same convolution by its definition: every product
    /// x[n, c, tap] * dy[n, m, y, x] added to the filter entry of the tap.
    #[allow(clippy::too_many_arguments)]
    fn dw_by_definition(
        n: usize,
        c: usize,
        m: usize,
        (h, w): (usize, usize),
        k: usize,
        (s, p, d, group): (usize, usize, usize, usize),
        x: &[f64],
        dy: &[f64],
    ) -> Vec<f64> {
        let oh = (h + 2 * p - d * (k - 1) - 1) / s + 1;
        let ow = (w + 2 * p - d * (k - 1) - 1) / s + 1;
        let (cg, mg) = (c / group, m / group);
        let mut dw = vec![0.0; m * cg * k * k];
        for i in 0..n {
            for mo in 0..m {
                let g = mo / mg;
                for ci in 0..cg {
                    for a in 0..k {
                        for b in 0..k {
                            let mut acc = 0.0;
                            for y in 0..oh {
                                let yi = (y * s + a * d) as isize - p as isize;
                                if yi < 0 || yi >= h as isize {
                                    continue;
                                }
                                for xo in 0..ow {
                                    let xi = (xo * s + b * d) as isize - p as isize;
                                    if xi < 0 || xi >= w as isize {
                                        continue;
                                    }
                                    acc += x[((i * c + g * cg + ci) * h + yi as usize) * w
                                        + xi as usize]
                                        * dy[((i * m + mo) * oh + y) * ow + xo];
                                }
                            }
                            dw[((mo * cg + ci) * k + a) * k + b] += acc;
                        }
                    }
                }
            }
        }
        dw
    }

    #[test]
    fn gradients_of_one_large_image_are_the_same_on_one_and_two_threads() {
        // Shapes whose single image takes the split of its channels over
        // the pool (at least 2^20 multiply-adds): several line blocks, odd
        // sizes with stride 2 and channel blocks of unequal size, groups,
        // dilation, few channels; and a batch of two (images on the pool).
        use crate::tensor::Tensor;
        for &(n, c, m, hw, k, s, p, d, group) in &[
            (1, 16, 32, (32, 32), 3, 1, 1, 1, 1),
            (1, 5, 64, (45, 37), 3, 2, 0, 1, 1),
            (1, 12, 12, (40, 40), 5, 1, 2, 1, 3),
            (1, 6, 32, (30, 30), 3, 1, 2, 2, 1),
            (1, 3, 16, (64, 64), 7, 2, 3, 1, 1),
            (2, 16, 32, (32, 32), 3, 1, 1, 1, 1),
        ] {
            let oh = (hw.0 + 2 * p - d * (k - 1) - 1) / s + 1;
            let ow = (hw.1 + 2 * p - d * (k - 1) - 1) / s + 1;
            let val = |i: usize, salt: usize| (((i * 7919 + salt) % 1009) as f64) / 504.5 - 1.0;
            let x: Vec<f64> = (0..n * c * hw.0 * hw.1).map(|i| val(i, 1)).collect();
            let x0 = x.clone();
            let w: Vec<f64> = (0..m * (c / group) * k * k).map(|i| val(i, 2)).collect();
            let dy: Vec<f64> = (0..n * m * oh * ow).map(|i| val(i, 3)).collect();
            let ws = ws_with(&[
                ("x", Tensor::from_vec(&[n, c, hw.0, hw.1], x).unwrap()),
                (
                    "w",
                    Tensor::from_vec(&[m, c / group, k, k], w.clone()).unwrap(),
                ),
                ("dy", Tensor::from_vec(&[n, m, oh, ow], dy.clone()).unwrap()),
            ]);
            let on = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let (dwo, dbo, out) = (
                    format!("dw{threads}"),
                    format!("db{threads}"),
                    format!("dx{threads}"),
                );
                pool.install(|| {
                    run(
                        &ws,
                        op(
                            "ConvGradient",
                            &["x", "w", "dy"],
                            &[&dwo, &dbo, &out],
                            vec![
                                int_arg("kernel", k as i64),
                                int_arg("stride", s as i64),
                                int_arg("pad", p as i64),
                                int_arg("dilation", d as i64),
                                int_arg("group", group as i64),
                            ],
                        ),
                    )
                })
                .unwrap();
                let f = |b: &str| -> Vec<f64> {
                    get(&ws, b)
                        .array::<f64>()
                        .unwrap()
                        .iter()
                        .copied()
                        .collect()
                };
                (f(&dwo), f(&dbo), f(&out))
            };
            let (one, two) = (on(1), on(2));
            let geo = (s, p, d, group);
            let want_dx = dx_by_definition(n, c, m, hw, k, geo, &w, &dy);
            let want_dw = dw_by_definition(n, c, m, hw, k, geo, &x0, &dy);
            let sp = oh * ow;
            let want_db: Vec<f64> = (0..m)
                .map(|mo| {
                    (0..n)
                        .map(|i| {
                            dy[(i * m + mo) * sp..(i * m + mo + 1) * sp]
                                .iter()
                                .sum::<f64>()
                        })
                        .sum()
                })
                .collect();
            let case = (n, c, m, hw, k, s, p, d, group);
            // The same additions in the same order on either pool (a batch
            // sums its images' dW in the order the pool's threads finish).
            assert!(one.2 == two.2 && one.1 == two.1, "{case:?}: dX or db");
            assert!(n > 1 || one.0 == two.0, "{case:?}: dW");
            for (got, want, what) in [
                (&one.0, &want_dw, "dW"),
                (&one.1, &want_db, "db"),
                (&one.2, &want_dx, "dX"),
            ] {
                assert_eq!(got.len(), want.len(), "{case:?} {what}");
                let err = got
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                assert!(err < 1e-9, "{case:?}: {what} off by {err}");
            }
        }
    }

    #[test]
    fn nhwc_forward_of_one_large_image_is_the_same_on_one_and_two_threads() {
        // One NHWC image whose product takes the split into blocks of
        // output pixels (uneven last block, stride 2, groups), against the
        // definition: y[pixel, m] = b[m] + sum of x[tap, c] * w[m, tap, c].
        use crate::tensor::Tensor;
        for &(c, m, (h, w), k, s, p, group) in &[
            (16, 32, (33, 31), 3, 1, 1, 1),
            (5, 64, (45, 37), 3, 2, 0, 1),
            (12, 12, (40, 40), 5, 1, 2, 3),
        ] {
            let (oh, ow) = ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1);
            let (cg, mg) = (c / group, m / group);
            let val = |i: usize, salt: usize| (((i * 7919 + salt) % 1009) as f64) / 504.5 - 1.0;
            let x: Vec<f64> = (0..h * w * c).map(|i| val(i, 1)).collect();
            let wt: Vec<f64> = (0..m * k * k * cg).map(|i| val(i, 2)).collect();
            let b: Vec<f64> = (0..m).map(|i| val(i, 3)).collect();
            let ws = ws_with(&[
                ("x", Tensor::from_vec(&[1, h, w, c], x.clone()).unwrap()),
                ("w", Tensor::from_vec(&[m, k, k, cg], wt.clone()).unwrap()),
                ("b", Tensor::from_vec(&[m], b.clone()).unwrap()),
            ]);
            let on = |threads: usize| -> Vec<f64> {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let out = format!("y{threads}");
                pool.install(|| {
                    let mut args = vec![
                        int_arg("kernel", k as i64),
                        int_arg("stride", s as i64),
                        int_arg("pad", p as i64),
                        int_arg("group", group as i64),
                    ];
                    args.push(crate::ir::Argument {
                        name: Some("order".into()),
                        s: Some(b"NHWC".to_vec()),
                        ..Default::default()
                    });
                    run(&ws, op("Conv", &["x", "w", "b"], &[&out], args))
                })
                .unwrap();
                get(&ws, &out)
                    .array::<f64>()
                    .unwrap()
                    .iter()
                    .copied()
                    .collect()
            };
            let (one, two) = (on(1), on(2));
            let case = (c, m, (h, w), k, s, p, group);
            assert!(one == two, "{case:?}");
            let mut err: f64 = 0.0;
            for (y, xo) in (0..oh).flat_map(|y| (0..ow).map(move |xo| (y, xo))) {
                for mo in 0..m {
                    let g = mo / mg;
                    let mut acc = b[mo];
                    for a in 0..k {
                        for e in 0..k {
                            let (yi, xi) = (
                                (y * s + a) as isize - p as isize,
                                (xo * s + e) as isize - p as isize,
                            );
                            if yi < 0 || xi < 0 || yi >= h as isize || xi >= w as isize {
                                continue;
                            }
                            for ci in 0..cg {
                                acc += x[(yi as usize * w + xi as usize) * c + g * cg + ci]
                                    * wt[((mo * k + a) * k + e) * cg + ci];
                            }
                        }
                    }
                    err = err.max((one[(y * ow + xo) * m + mo] - acc).abs());
                }
            }
            assert!(err < 1e-10, "{case:?}: off by {err}");
        }
    }
}
