//! The window geometry of the convolutions and the pooling ops
//! (`ops/pool.rs`): Caffe2's kernel, stride, pad and dilation arguments
//! (legacy pads included) for 1 to 3 spatial dims, the output sizes they
//! give, and the image and filter shapes of NCHW and NHWC.

#![allow(clippy::result_large_err, clippy::too_many_arguments)]

use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{ArgDoc, OpDefCtx};
use crate::ops::kit::{parse_order, Order};

/// A per-dim argument as given: not at all, one value for every dim, or one
/// per dim.
#[derive(Clone, Debug)]
pub(crate) enum Dims {
    Unset,
    One(usize),
    List(Vec<usize>),
}

impl Dims {
    /// Whether every given value is `v` (true when not given).
    pub(crate) fn all(&self, v: usize) -> bool {
        match self {
            Dims::Unset => true,
            Dims::One(x) => *x == v,
            Dims::List(xs) => xs.iter().all(|x| *x == v),
        }
    }

    /// The values for `nd` dims (`per` values per dim: 2 for pads).
    pub(crate) fn resolve(
        &self,
        what: &str,
        nd: usize,
        per: usize,
        default: usize,
    ) -> Result<Vec<usize>> {
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
pub(crate) enum Legacy {
    NotSet,
    Valid,
    Same,
    CaffePooling,
}

/// The window arguments of a conv or pooling op, parsed at creation.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    pub(crate) kernel: Dims,
    pub(crate) stride: Dims,
    pub(crate) dilation: Dims,
    pub(crate) pads: Dims,
    pub(crate) legacy: Legacy,
    pub(crate) global: bool,
    pub(crate) order: Order,
}

pub(crate) fn non_negative(ctx: &OpDefCtx<'_>, name: &str, v: i64) -> Result<usize> {
    usize::try_from(v).map_err(|_| ctx.bad_arg(format!("{name} must be >= 0, got {v}")))
}

/// `list` (repeated), else `one` (a single int), else the `parts` (each
/// defaulting to `part_default`; all required when `part_default` is None).
pub(crate) fn dims_arg(
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
        // Caffe2 checks the values, not their presence: a global window
        // takes stride 1, pads 0 and dilation 1 written out (DenseNet-121's
        // last AveragePool has `stride: 1, pad: 0, kernel: 0`).
        if global && !(stride.all(1) && pads.all(0) && dilation.all(1)) {
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
    pub(crate) fn fixed_nd(&self) -> Option<usize> {
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
pub(crate) fn too_large(arg: &str, what: String) -> Error {
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
pub(crate) fn out_size(
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
    pub(crate) fn identity(&self) -> bool {
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
pub(crate) fn valid_range(n: usize, s: usize, off: isize, len: usize) -> (usize, usize) {
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
