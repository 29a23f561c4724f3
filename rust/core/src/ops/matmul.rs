//! Matrix products (issue 14): FC, FCTransposed, MatMul and BatchMatMul,
//! with their gradient ops. The products themselves go through
//! `ops::gemm` (the `gemm` crate, or a small-product float32 kernel; a
//! large product is split between its caller and the kernel pool, whose
//! size bounds the threads however many plan instances run ops at once, so
//! a GEMM never oversubscribes the cores).
//!
//! Every kernel takes float32 or float64 and computes into new buffers
//! before it writes any output.

#![allow(clippy::result_large_err)]

use super::kit::*;
use crate::arg;
use crate::error::{Error, Result};
use crate::ir::OperatorDef;
use crate::num::Float;
use crate::operator::{Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::Tensor;

pub fn schemas() -> Vec<OpSchema> {
    const FC_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "axis",
            "int",
            "1",
            "X is flattened to a matrix at this dim: (prod of dims before, prod of the rest)"
        ),
        arg!(
            "axis_w",
            "int",
            "1",
            "W is flattened to a matrix at this dim"
        ),
    ];
    const FC_INPUT_GRAD_ARGS: &[crate::operator::ArgDoc] = &[
        FC_ARGS[0],
        FC_ARGS[1],
        arg!(
            "transposed",
            "bool",
            "false",
            "W is stored K x N (FCTransposed's)"
        ),
    ];
    const FC_IGNORED: &[crate::operator::ArgDoc] = &[arg!(
        "float16_compute",
        "bool",
        "false",
        "half-precision compute hint (GPU); accepted and ignored"
    )];
    const MATMUL_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "axis_a",
            "int",
            "1",
            "A is flattened to a matrix at this dim"
        ),
        arg!(
            "axis_b",
            "int",
            "1",
            "B is flattened to a matrix at this dim"
        ),
        arg!("trans_a", "int", "0", "use A transposed"),
        arg!("trans_b", "int", "0", "use B transposed"),
    ];
    const BMM_ARGS: &[crate::operator::ArgDoc] = &[
        arg!("trans_a", "int", "0", "transpose the last two dims of A"),
        arg!("trans_b", "int", "0", "transpose the last two dims of B"),
        arg!(
            "broadcast",
            "int",
            "0",
            "numpy.matmul broadcasting of the batch dims (and 1-D inputs)"
        ),
    ];
    let mut v = vec![
        OpSchema::new("FC", build_fc)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(FC_ARGS)
            .ignores(FC_IGNORED)
            .doc("Y = X * W^T + b: X flattened to M x K at `axis`, W (N x K at `axis_w`), b (N); Y has X's dims before `axis`, then N."),
        OpSchema::new("FCTransposed", build_fc)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(FC_ARGS)
            .ignores(FC_IGNORED)
            .doc("FC with W stored transposed (K x N): Y = X * W + b."),
        OpSchema::new("FCGradient", build_fc_grad)
            .inputs(3, 3)
            .outputs(2, 3)
            .args(FC_ARGS)
            .ignores(FC_IGNORED)
            .doc("Gradient of FC: inputs (X, W, dY), outputs (dW, db[, dX])."),
        OpSchema::new("FCTransposedGradient", build_fc_grad)
            .inputs(3, 3)
            .outputs(2, 3)
            .args(FC_ARGS)
            .ignores(FC_IGNORED)
            .doc("Gradient of FCTransposed: inputs (X, W, dY), outputs (dW, db[, dX])."),
        OpSchema::new("rnn_internal_fc_input_gradient", build_fc_input_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(FC_INPUT_GRAD_ARGS)
            .doc("FCGradient's dX alone: inputs (X, W, dY), output dX. The recurrent gradient op puts it in a step net in place of an FCGradient whose weight and bias gradients it makes once over the sequence."),
        OpSchema::new("MatMul", build_matmul)
            .inputs(2, 3)
            .outputs(1, 1)
            .args(MATMUL_ARGS)
            .doc("Y = op(A) * op(B), A and B flattened to matrices at axis_a and axis_b, op transposing when trans_a / trans_b."),
        OpSchema::new("BatchMatMul", build_batch_matmul)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(BMM_ARGS)
            .doc("Y[i] = op(A[i]) * op(B[i]) over the batch dims (all but the last two; equal in A and B unless broadcast, which follows numpy.matmul)."),
        OpSchema::new("BatchMatMulGradient", build_batch_matmul_grad)
            .inputs(3, 3)
            .outputs(2, 2)
            .args(BMM_ARGS)
            .doc("Gradient of BatchMatMul with broadcast (not in Caffe2, whose maker refused broadcast=1): inputs (A, B, dY), outputs (dA, dB): each batch's products, summed over the batch dims A (B) was broadcast along; a 1-D operand as BatchMatMul takes it."),
    ];
    v.extend(row_product_schemas());
    v
}

/// Strides of a dense row-major `rows x cols` matrix, read transposed or not.
fn strides(rows: usize, cols: usize, transposed: bool) -> (usize, usize) {
    let _ = rows;
    if transposed {
        (1, cols)
    } else {
        (cols, 1)
    }
}

/// C (m x n) = op(A) * op(B), where A is stored `m x k` (or `k x m` when
/// `ta`) and B `k x n` (or `n x k` when `tb`).
fn matmul<T: Float>(
    ta: bool,
    tb: bool,
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
) -> Result<Vec<T>> {
    let what = format_args!("a {m} x {n} product");
    let len = m
        .checked_mul(n)
        .ok_or_else(|| crate::tensor::alloc_error(usize::MAX, what))?;
    let (sa, sb) = operand_strides(ta, tb, m, k, n);
    // SAFETY: `product_uninit` writes every element of C (beta 0: the
    // kernels write it without reading it; an empty sum writes zeros).
    unsafe {
        crate::tensor::written_vec(len, what, |c| {
            super::gemm::product_uninit(true, m, k, n, a, sa, b, sb, c)
        })
    }
}

/// A's and B's strides for [`matmul`]: A stored `m x k` (`k x m` when
/// `ta`), B `k x n` (`n x k` when `tb`).
fn operand_strides(
    ta: bool,
    tb: bool,
    m: usize,
    k: usize,
    n: usize,
) -> ((usize, usize), (usize, usize)) {
    let sa = if ta {
        strides(k, m, true)
    } else {
        strides(m, k, false)
    };
    let sb = if tb {
        strides(n, k, true)
    } else {
        strides(k, n, false)
    };
    (sa, sb)
}

/// [`matmul`] into `c` (m x n, zeroed).
#[allow(clippy::too_many_arguments)]
fn matmul_into<T: Float>(
    ta: bool,
    tb: bool,
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
    c: &mut [T],
) {
    if m * n == 0 || k == 0 {
        return;
    }
    let (sa, sb) = operand_strides(ta, tb, m, k, n);
    super::gemm::product(true, m, k, n, a, sa, b, sb, T::of(0.0), c, (n, 1));
}

// ------------------------------------------------------------------ FC --

struct FcDims {
    m: usize,
    k: usize,
    n: usize,
    y_shape: Vec<usize>,
}

fn fc_dims(l: &Locked<'_>, op: &str, axis: i64, axis_w: i64, transposed: bool) -> Result<FcDims> {
    let (x, w) = (l.tensor(0)?.shape(), l.tensor(1)?.shape());
    let names = [l.input_name(0), l.input_name(1)];
    fc_shapes(op, x, w, names, axis, axis_w, transposed)
}

/// [`fc_dims`] of X's and W's shapes (`names` theirs, for errors).
fn fc_shapes(
    op: &str,
    x: &[usize],
    w: &[usize],
    names: [&str; 2],
    axis: i64,
    axis_w: i64,
    transposed: bool,
) -> Result<FcDims> {
    let ax = canonical_axis(op, "axis", axis, x.len(), names[0])?;
    let aw = canonical_axis(op, "axis_w", axis_w, w.len(), names[1])?;
    let (m, k) = split_at(x, ax);
    let (w0, w1) = split_at(w, aw);
    let (kw, n) = if transposed { (w0, w1) } else { (w1, w0) };
    if k != kw {
        return Err(Error::shape(format!(
            "{op}: dimension mismatch: X ('{}') {x:?} flattened at axis {ax} is {m} x {k}, W ('{}') {w:?} flattened at axis_w {aw} has K = {kw}",
            names[0],
            names[1]
        ))
        .with_blob(names[1]));
    }
    let mut y_shape = x[..ax].to_vec();
    y_shape.push(n);
    Ok(FcDims { m, k, n, y_shape })
}

/// A weight laid out for the product once (`W^T`, K x N row-major) and
/// the weight's buffer it came from. Holding the buffer keeps it from being
/// written in place (writers copy a shared buffer first) or freed and its
/// address reused, so an entry whose buffer is the one FC reads is current.
struct PlainWeight {
    src: Box<dyn std::any::Any>,
    key: (usize, usize, usize, usize),
    plain: Box<dyn std::any::Any>,
}

thread_local! {
    /// `Some` inside [`with_plain_weights`]: the weights FC laid out there.
    static PLAIN_WEIGHTS: std::cell::RefCell<Option<Vec<PlainWeight>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` with FC's weights laid out once for the product and reused
/// while it runs (on this thread): the recurrent ops run their step net
/// in it, so a step's FC reads the W^T it laid out at the first step
/// instead of transposing W (a copy as large as W) at every step; only
/// where the product gets the same bits from either layout
/// ([`super::gemm::plain_b_same_bits`]), so a step's FC agrees to the bit
/// with the same FC outside. The layouts are dropped when `f` returns;
/// outside, FC keeps no state.
pub(crate) fn with_plain_weights<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            if self.0 {
                PLAIN_WEIGHTS.with(|c| *c.borrow_mut() = None);
            }
        }
    }
    let outer = PLAIN_WEIGHTS.with(|c| {
        let mut c = c.borrow_mut();
        let fresh = c.is_none();
        if fresh {
            *c = Some(Vec::new());
        }
        fresh
    });
    let _reset = Reset(outer);
    f()
}

/// A layout of FC's weight input 1 (`kind` names it in the cache) from
/// the layouts of [`with_plain_weights`] when one is active (made by
/// `make` from W's elements on first use), else `None`.
fn weight_layout<T: Float, L: Send + Sync + 'static>(
    l: &Locked<'_>,
    kind: usize,
    n: usize,
    k: usize,
    make: impl FnOnce(&[T]) -> Result<Option<L>>,
) -> Result<Option<std::sync::Arc<L>>> {
    let active = PLAIN_WEIGHTS.with(|c| c.borrow().is_some());
    let Some(src) = T::shared(l.tensor(1)?) else {
        return Ok(None);
    };
    if !active || n * k == 0 {
        return Ok(None);
    }
    let key = (src.as_ptr() as usize, n, k, kind);
    let found = PLAIN_WEIGHTS.with(|c| {
        c.borrow().as_ref().and_then(|v| {
            v.iter()
                .find(|e| {
                    e.key == key
                        && e.src
                            .downcast_ref::<crate::tensor::Shared<T>>()
                            .is_some_and(|s| std::sync::Arc::ptr_eq(s, src))
                })
                .and_then(|e| e.plain.downcast_ref::<std::sync::Arc<L>>().cloned())
        })
    });
    if found.is_some() {
        return Ok(found);
    }
    let Some(made) = make(&dense(src))? else {
        return Ok(None);
    };
    let made = std::sync::Arc::new(made);
    PLAIN_WEIGHTS.with(|c| {
        if let Some(v) = c.borrow_mut().as_mut() {
            v.push(PlainWeight {
                src: Box::new(src.clone()),
                key,
                plain: Box::new(made.clone()),
            });
        }
    });
    Ok(Some(made))
}

/// W^T (K x N, row-major) of FC's weight input 1 (N x K, row-major), from
/// the layouts of [`with_plain_weights`] (see [`weight_layout`]).
fn plain_weight<T: Float>(
    l: &Locked<'_>,
    n: usize,
    k: usize,
) -> Result<Option<std::sync::Arc<Vec<T>>>> {
    weight_layout::<T, Vec<T>>(l, 0, n, k, |w| {
        let mut t = crate::tensor::try_vec::<T>(n * k, "FC's weights laid out for the product")?;
        t.resize(n * k, T::of(0.0));
        // W^T[p][j] = W[j][p], 16 rows of W at a time (their columns stay
        // in cache while the rows of W^T are written).
        for j0 in (0..n).step_by(16) {
            let j1 = (j0 + 16).min(n);
            for p in 0..k {
                for j in j0..j1 {
                    t[p * n + j] = w[j * k + p];
                }
            }
        }
        Ok(Some(t))
    })
}

/// FC's weight input 1 (N x K, row-major, read transposed) packed for an
/// `m x k x n` product on the panel kernel, from the layouts of
/// [`with_plain_weights`] (see [`weight_layout`]); `None` where the
/// product does not run on it.
fn packed_weight<T: Float>(
    l: &Locked<'_>,
    m: usize,
    n: usize,
    k: usize,
) -> Result<Option<std::sync::Arc<super::gemm::PackedB>>> {
    weight_layout::<T, super::gemm::PackedB>(l, 1, n, k, |w| {
        super::gemm::PackedB::for_product::<T>(m, k, n, (k, 1), w, (1, k))
    })
}

/// [`matmul`] of a row-major A (`m x k`) by a B packed for it.
fn matmul_packed<T: Float>(
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &super::gemm::PackedB,
) -> Result<Vec<T>> {
    let what = format_args!("a {m} x {n} product");
    let len = m
        .checked_mul(n)
        .ok_or_else(|| crate::tensor::alloc_error(usize::MAX, what))?;
    // SAFETY: the packed product writes every element of C (beta 0).
    unsafe {
        crate::tensor::written_vec(len, what, |c| {
            super::gemm::product_packed_uninit(true, m, k, n, a, (k, 1), b, c)
        })
    }
}

fn fc_t<T: Float>(l: &mut Locked<'_>, op: &str, axis: i64, axis_w: i64, tr: bool) -> Result<()> {
    let d = fc_dims(l, op, axis, axis_w, tr)?;
    let (x, w, b) = (
        input::<T>(l, op, 0)?,
        input::<T>(l, op, 1)?,
        input::<T>(l, op, 2)?,
    );
    if b.len() != d.n {
        return Err(Error::shape(format!(
            "{op}: the bias ('{}', shape {:?}) must have N = {} elements",
            l.input_name(2),
            b.shape(),
            d.n
        ))
        .with_blob(l.input_name(2)));
    }
    // Inside a recurrent step: W laid out once for all the steps, packed
    // for the panel kernel or plainly, where the product gets the bits of
    // the same FC outside (which packs or reads W itself).
    let packed = if tr {
        None
    } else {
        packed_weight::<T>(l, d.m, d.n, d.k)?
    };
    let plain = if packed.is_some() || tr || !super::gemm::plain_b_same_bits::<T>(d.m, d.k, d.n) {
        None
    } else {
        plain_weight::<T>(l, d.n, d.k)?
    };
    let mut y = match (&packed, &plain) {
        (Some(p), _) => matmul_packed(d.m, d.k, d.n, &dense(x), p)?,
        (None, Some(wt)) => matmul(false, false, d.m, d.k, d.n, &dense(x), wt)?,
        (None, None) => matmul(false, !tr, d.m, d.k, d.n, &dense(x), &dense(w))?,
    };
    add_bias(&mut y, &dense(b));
    let y = array(&d.y_shape, y)?;
    l.set_output(0, T::wrap(y));
    Ok(())
}

/// Y's elements per block when FC's bias is added in blocks of rows.
const BIAS_PIECE: usize = 1 << 14;

/// Adds `b` to each row of `y`, in blocks of rows shared with pool threads
/// lingering after the product (see [`crate::threads::fork_each`]) when Y
/// is large; each element gets the same one addition whatever the split.
fn add_bias<T: Float>(y: &mut [T], b: &[T]) {
    let n = b.len().max(1);
    let per = (BIAS_PIECE / n).max(1) * n;
    let parts: Vec<&mut [T]> = y.chunks_mut(per).collect();
    crate::threads::fork_each(parts, |rows| {
        crate::vmath::wide(
            #[inline(always)]
            || {
                for row in rows.chunks_mut(n) {
                    for (v, &bi) in row.iter_mut().zip(b.iter()) {
                        *v += bi;
                    }
                }
            },
        )
    });
}

fn build_fc(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    let axis_w = ctx.args.i64("axis_w", 1)?;
    let tr = ctx.op_type() == "FCTransposed";
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| fc_t(&mut l, &op, axis, axis_w, tr))
}

/// Which of FCGradient's outputs an op makes: the weight and bias
/// gradients (outputs 0 and 1), dX (the next output), or both.
#[derive(Clone, Copy)]
struct FcGradOutputs {
    params: bool,
    dx: bool,
}

fn fc_grad_t<T: Float>(
    l: &mut Locked<'_>,
    op: &str,
    axis: i64,
    axis_w: i64,
    tr: bool,
    want: FcGradOutputs,
) -> Result<()> {
    let d = fc_dims(l, op, axis, axis_w, tr)?;
    let (x, w, dy) = (
        input::<T>(l, op, 0)?,
        input::<T>(l, op, 1)?,
        input::<T>(l, op, 2)?,
    );
    check_dy(op, dy.shape(), &d, l.input_name(2))?;
    let (xs, ws, dys) = (dense(x), dense(w), dense(dy));
    let params = want
        .params
        .then(|| fc_param_grads(&xs, &dys, &d, tr))
        .transpose()?;
    // FC: dX (M x K) = dY W; FCTransposed: dX = dY W^T.
    let dx = want
        .dx
        .then(|| matmul(false, tr, d.m, d.n, d.k, &dys, &ws))
        .transpose()?;
    let params = params
        .map(|(dw, db)| Ok::<_, Error>((array(w.shape(), dw)?, array(&[d.n], db)?)))
        .transpose()?;
    let dx = dx.map(|v| array(x.shape(), v)).transpose()?;
    let mut next = 0;
    if let Some((dw, db)) = params {
        l.set_output(0, T::wrap(dw));
        l.set_output(1, T::wrap(db));
        next = 2;
    }
    if let Some(dx) = dx {
        l.set_output(next, T::wrap(dx));
    }
    Ok(())
}

fn check_dy(op: &str, dy: &[usize], d: &FcDims, name: &str) -> Result<()> {
    if Some(dy.iter().product::<usize>()) != d.m.checked_mul(d.n) {
        return Err(Error::shape(format!(
            "{op}: dY ('{name}', shape {dy:?}) must have M x N = {} x {} elements",
            d.m, d.n
        ))
        .with_blob(name));
    }
    Ok(())
}

/// FC's weight gradient (FC: dW (N x K) = dY^T X; FCTransposed: dW (K x N)
/// = X^T dY) and bias gradient (dY's column sums) over the M rows of X and
/// dY.
fn fc_param_grads<T: Float>(x: &[T], dy: &[T], d: &FcDims, tr: bool) -> Result<(Vec<T>, Vec<T>)> {
    let dw = if tr {
        matmul(true, false, d.k, d.m, d.n, x, dy)?
    } else {
        matmul(true, false, d.n, d.m, d.k, dy, x)?
    };
    Ok((dw, column_sums(dy, d.n)?))
}

/// dY's elements per block of columns when its column sums are split
/// (at most 4 blocks, each at least 64 columns wide).
const COLUMN_SUMS_SPLIT: usize = 1 << 16;

/// The column sums of `dy` (rows of `n`; FC's bias gradient), in blocks of
/// columns shared with pool threads lingering after the weight gradient's
/// product (see [`crate::threads::fork_each`]) when dY is large. Each
/// column is summed in row order whatever the split, so the bits do not
/// depend on it.
fn column_sums<T: Float>(dy: &[T], n: usize) -> Result<Vec<T>> {
    let mut db = crate::tensor::default_buffer::<T>(n, "FC's bias gradient")?;
    if n == 0 {
        return Ok(db);
    }
    let blocks = (dy.len() / COLUMN_SUMS_SPLIT)
        .clamp(1, 4)
        .min(n.div_ceil(64));
    let width = n.div_ceil(blocks).next_multiple_of(16);
    let parts: Vec<(usize, &mut [T])> = db
        .chunks_mut(width)
        .enumerate()
        .map(|(i, c)| (i * width, c))
        .collect();
    crate::threads::fork_each(parts, |(j0, sums)| {
        crate::vmath::wide(
            #[inline(always)]
            || {
                for row in dy.chunks_exact(n) {
                    for (s, &v) in sums.iter_mut().zip(&row[j0..]) {
                        *s += v;
                    }
                }
            },
        )
    });
    Ok(db)
}

fn fc_grad_args(ctx: &OpDefCtx<'_>) -> Result<(i64, i64)> {
    Ok((ctx.args.i64("axis", 1)?, ctx.args.i64("axis_w", 1)?))
}

fn build_fc_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (axis, axis_w) = fc_grad_args(ctx)?;
    let tr = ctx.op_type() == "FCTransposedGradient";
    let want = FcGradOutputs {
        params: true,
        dx: ctx.num_outputs() == 3,
    };
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| fc_grad_t(&mut l, &op, axis, axis_w, tr, want))
}

fn build_fc_input_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (axis, axis_w) = fc_grad_args(ctx)?;
    let tr = ctx.args.bool("transposed", false)?;
    let want = FcGradOutputs {
        params: false,
        dx: true,
    };
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| fc_grad_t(&mut l, &op, axis, axis_w, tr, want))
}

// ------------------------------------------ FC's gradient over steps --

/// Rows of X and dY gathered over many runs of one FCGradient, whose weight
/// and bias gradients summed over the runs are then made as one product:
/// sum_t dY_t^T X_t is the product of the stacked rows. The recurrent
/// gradient op gathers a step net's FCGradient this way (the step net then
/// makes dX alone, `rnn_internal_fc_input_gradient`): one product with K =
/// every step's rows instead of one per step with K = the batch, each
/// summed into the parameter's gradient.
pub(crate) struct FcGradSteps {
    op: String,
    axis: i64,
    axis_w: i64,
    tr: bool,
    rows: Option<Gathered>,
}

/// The rows an [`FcGradSteps`] holds (kept with their capacity between
/// sequences).
struct Gathered {
    /// `(x, dy)` as `Vec<T>` of the runs' dtype.
    rows: Box<dyn std::any::Any + Send>,
    /// W's shape, K and N at the runs kept.
    w_shape: Vec<usize>,
    k: usize,
    n: usize,
    runs: usize,
    /// X's elements a run when runs are placed (`at`).
    block: usize,
    /// The runs since the last take were placed (`at`): dY is the caller's.
    placed: bool,
}

impl FcGradSteps {
    /// For FCGradient or FCTransposedGradient `op` with these arguments.
    pub(crate) fn new(op: &OperatorDef) -> Result<FcGradSteps> {
        let ty = op.r#type.clone().unwrap_or_default();
        let args = crate::args::Args::new(&ty, &op.arg)?;
        let (axis, axis_w) = (args.i64("axis", 1)?, args.i64("axis_w", 1)?);
        Ok(FcGradSteps {
            tr: ty == "FCTransposedGradient",
            op: ty,
            axis,
            axis_w,
            rows: None,
        })
    }

    /// The op that makes dX alone, for `op` (with `dx`, its dX output).
    pub(crate) fn input_gradient_op(&self, op: &OperatorDef, dx: String) -> OperatorDef {
        let mut d = op.clone();
        d.r#type = Some("rnn_internal_fc_input_gradient".to_string());
        d.output = vec![dx];
        d.arg.retain(|a| a.name.as_deref() != Some("transposed"));
        d.arg.push(crate::ir::Argument {
            name: Some("transposed".to_string()),
            i: Some(i64::from(self.tr)),
            ..Default::default()
        });
        d
    }

    /// Keeps one run's rows of X and dY (`names` X's, W's and dY's, for
    /// errors); `runs` is how many runs there will be, to reserve for
    /// them at the first. `at`: the caller keeps dY's rows (run `at`'s at
    /// rows `at` of the tensor it gives [`FcGradSteps::take`]), so only
    /// X's are kept, at block `at` (dY is still checked).
    pub(crate) fn push(
        &mut self,
        x: &Tensor,
        w: &Tensor,
        dy: &Tensor,
        names: [&str; 3],
        runs: usize,
        at: Option<usize>,
    ) -> Result<()> {
        crate::with_match_dtype!(floats x.dtype(), |T| self.push_t::<T>(x, w, dy, names, runs, at),
            else other => Err(crate::tensor::unsupported_dtype(other).with_blob(names[0])))
    }

    fn push_t<T: Float>(
        &mut self,
        x: &Tensor,
        w: &Tensor,
        dy: &Tensor,
        names: [&str; 3],
        runs: usize,
        at: Option<usize>,
    ) -> Result<()> {
        let op = self.op.as_str();
        let d = fc_shapes(
            op,
            x.shape(),
            w.shape(),
            [names[0], names[1]],
            self.axis,
            self.axis_w,
            self.tr,
        )?;
        check_dy(op, dy.shape(), &d, names[2])?;
        fn view<'t, T: Float>(
            op: &str,
            x: &Tensor,
            t: &'t Tensor,
            names: [&str; 3],
            i: usize,
        ) -> Result<&'t ndarray::ArrayD<T>> {
            T::view(t).ok_or_else(|| {
                Error::type_error(format!(
                    "{op}: '{}' is {}, '{}' {}",
                    names[0],
                    x.dtype(),
                    names[i],
                    t.dtype()
                ))
                .with_blob(names[i])
            })
        }
        let (xa, dya) = (
            view::<T>(op, x, x, names, 0)?,
            view::<T>(op, x, dy, names, 2)?,
        );
        let fresh = match &self.rows {
            None => true,
            Some(g) => g.runs == 0 && !g.rows.is::<(Vec<T>, Vec<T>)>(),
        };
        if fresh {
            let reserve = |len: usize| {
                crate::tensor::try_vec::<T>(
                    len.saturating_mul(runs.max(1)),
                    format_args!("{op}'s rows over the steps"),
                )
            };
            let dys = match at {
                Some(_) => Vec::new(),
                None => reserve(dya.len())?,
            };
            let rows: (Vec<T>, Vec<T>) = (reserve(xa.len())?, dys);
            self.rows = Some(Gathered {
                rows: Box::new(rows),
                w_shape: Vec::new(),
                k: 0,
                n: 0,
                runs: 0,
                block: 0,
                placed: false,
            });
        }
        let Some(g) = self.rows.as_mut() else {
            unreachable!("set above")
        };
        if g.runs == 0 {
            (g.w_shape, g.k, g.n) = (w.shape().to_vec(), d.k, d.n);
        } else if (g.k, g.n) != (d.k, d.n) || g.w_shape.as_slice() != w.shape() {
            return Err(Error::shape(format!(
                "{op}: W ('{}') has shape {:?} at this step, {:?} at an earlier one",
                names[1],
                w.shape(),
                g.w_shape
            ))
            .with_blob(names[1]));
        }
        let Some((xs, dys)) = g.rows.downcast_mut::<(Vec<T>, Vec<T>)>() else {
            return Err(Error::type_error(format!(
                "{op}: '{}' is {} at this step, another dtype at an earlier one",
                names[0],
                x.dtype()
            ))
            .with_blob(names[0]));
        };
        if let Some(t) = at {
            let len = xa.len().checked_mul(runs).ok_or_else(|| {
                crate::tensor::alloc_error(usize::MAX, format_args!("{op}'s rows over the steps"))
            })?;
            // Every block is written before the rows are taken: a run's
            // blocks overwrite the last run's.
            if g.runs == 0 && (xs.len() != len || !dys.is_empty()) {
                xs.clear();
                dys.clear();
                xs.try_reserve(len).map_err(|_| {
                    crate::tensor::alloc_error(
                        len.saturating_mul(size_of::<T>()),
                        format_args!("{op}'s rows over the steps"),
                    )
                })?;
                xs.resize(len, T::of(0.0));
            }
            let block = xa.len();
            (g.block, g.placed) = (block, true);
            if t >= runs || xs.len() != block * runs || !dys.is_empty() {
                return Err(Error::internal(format!(
                    "{op}: step {t}'s rows do not fit the {runs} kept"
                )));
            }
            let dst = &mut xs[t * block..(t + 1) * block];
            match xa.as_slice() {
                Some(src) => crate::tensor::copy_values(dst, src),
                None => dst.iter_mut().zip(xa.iter()).for_each(|(d, &v)| *d = v),
            }
            g.runs += 1;
            return Ok(());
        }
        if g.runs == 0 {
            xs.clear();
            dys.clear();
            (g.block, g.placed) = (0, false);
        }
        for (dst, src) in [(xs, xa), (dys, dya)] {
            dst.try_reserve(src.len()).map_err(|_| {
                crate::tensor::alloc_error(
                    src.len().saturating_mul(size_of::<T>()),
                    format_args!("{op}'s rows over the steps"),
                )
            })?;
            match src.as_slice() {
                Some(s) => crate::tensor::extend_values(dst, s),
                None => dst.extend(src.iter().copied()),
            }
        }
        g.runs += 1;
        Ok(())
    }

    /// Drops the rows kept since the last [`FcGradSteps::take`] (a run
    /// that stopped part-way must not add its steps to the next run's).
    pub(crate) fn clear(&mut self) {
        if self.rows.as_ref().is_some_and(|g| g.runs > 0) {
            self.rows = None;
        }
    }

    /// The weight and bias gradients summed over the runs kept since the
    /// last call (W's shape and (N)), or `None` if none was. `dy`: the
    /// tensor holding dY's rows when the runs were pushed with `at` (run
    /// t's at rows `row + t`).
    pub(crate) fn take(
        &mut self,
        dy: Option<(&Tensor, usize)>,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let Some(g) = self.rows.as_mut().filter(|g| g.runs > 0) else {
            return Ok(None);
        };
        let runs = std::mem::take(&mut g.runs);
        if dy.is_some() != g.placed {
            return Err(Error::internal(
                "FC's rows over the steps were kept another way",
            ));
        }
        let tr = self.tr;
        if let Some(r) = g.rows.downcast_mut::<(Vec<f32>, Vec<f32>)>() {
            return sums_over_rows(r, dy, (runs, g.block), &g.w_shape, g.k, g.n, tr).map(Some);
        }
        match g.rows.downcast_mut::<(Vec<f64>, Vec<f64>)>() {
            Some(r) => sums_over_rows(r, dy, (runs, g.block), &g.w_shape, g.k, g.n, tr).map(Some),
            None => Err(Error::internal(
                "FC's rows over the steps are of no float dtype",
            )),
        }
    }
}

/// [`FcGradSteps::take`] of rows `(xs, dys)` (dY's rows in `dy` when given:
/// `runs` runs of `block` elements of X each, from its row `row`), which
/// it empties (keeping their capacity).
fn sums_over_rows<T: Float>(
    (xs, dys): &mut (Vec<T>, Vec<T>),
    dy: Option<(&Tensor, usize)>,
    (runs, block): (usize, usize),
    shape: &[usize],
    k: usize,
    n: usize,
    tr: bool,
) -> Result<(Tensor, Tensor)> {
    let m = xs.len().checked_div(k).unwrap_or(dys.len() / n.max(1));
    let d = FcDims {
        m,
        k,
        n,
        y_shape: Vec::new(),
    };
    let sums = match dy {
        None => fc_param_grads(xs, dys, &d, tr),
        Some((t, row)) => {
            let a = T::view(t)
                .ok_or_else(|| Error::internal("dY's rows over the steps are of another dtype"))?;
            let all = a
                .as_slice()
                .ok_or_else(|| Error::internal("dY's rows over the steps are not contiguous"))?;
            let per = block.checked_div(k).unwrap_or(0) * n;
            let rows = t.shape().first().copied().unwrap_or(0);
            if xs.len() != block * runs || per * rows != all.len() || row + runs > rows {
                return Err(Error::internal(format!(
                    "dY's rows over the steps ({:?}) do not hold {runs} runs from row {row}",
                    t.shape()
                )));
            }
            fc_param_grads(xs, &all[row * per..(row + runs) * per], &d, tr)
        }
    };
    // Rows placed by run (`dy` given) keep their length: the next
    // sequence of as many runs overwrites them.
    if dy.is_none() {
        xs.clear();
    }
    dys.clear();
    let (dw, db) = sums?;
    Ok((T::wrap(array(shape, dw)?), T::wrap(array(&[n], db)?)))
}

// -------------------------------------------------------------- MatMul --

fn matmul_t<T: Float>(
    l: &mut Locked<'_>,
    ax: (i64, i64),
    ta: bool,
    tb: bool,
    ni: usize,
) -> Result<()> {
    let op = "MatMul";
    let (a, b) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let aa = canonical_axis(op, "axis_a", ax.0, a.ndim(), l.input_name(0))?;
    let ab = canonical_axis(op, "axis_b", ax.1, b.ndim(), l.input_name(1))?;
    let (a0, a1) = split_at(a.shape(), aa);
    let (b0, b1) = split_at(b.shape(), ab);
    let (m, k) = if ta { (a1, a0) } else { (a0, a1) };
    let (kb, n) = if tb { (b1, b0) } else { (b0, b1) };
    if k != kb {
        return Err(Error::shape(format!(
            "MatMul: dimension mismatch: trans_a: {}, trans_b: {}, A ('{}') {:?} is used as {m} x {k}, B ('{}') {:?} as {kb} x {n}",
            ta as i32,
            tb as i32,
            l.input_name(0),
            a.shape(),
            l.input_name(1),
            b.shape()
        ))
        .with_blob(l.input_name(1)));
    }
    let y = matmul(ta, tb, m, k, n, &dense(a), &dense(b))?;
    // A third input (the gradient ops' use) gives the output its shape.
    let shape = match ni {
        3 => {
            let like = l.tensor(2)?.shape().to_vec();
            if like.iter().product::<usize>() != y.len() {
                return Err(Error::shape(format!(
                    "MatMul: the product is {m} x {n}, which cannot take the shape {like:?} of '{}'",
                    l.input_name(2)
                ))
                .with_blob(l.input_name(2)));
            }
            like
        }
        _ => vec![m, n],
    };
    let y = array(&shape, y)?;
    l.set_output(0, T::wrap(y));
    Ok(())
}

fn build_matmul(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ax = (ctx.args.i64("axis_a", 1)?, ctx.args.i64("axis_b", 1)?);
    let ta = ctx.args.i64("trans_a", 0)? != 0;
    let tb = ctx.args.i64("trans_b", 0)? != 0;
    let ni = ctx.num_inputs();
    float_kernel!("MatMul", 0, |l| matmul_t(&mut l, ax, ta, tb, ni))
}

// --------------------------------------------------------- BatchMatMul --

/// Numpy-style broadcast of two batch shapes, or None.
fn broadcast_batch(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let nd = a.len().max(b.len());
    let pa = padded(a, nd, nd - a.len());
    let pb = padded(b, nd, nd - b.len());
    pa.iter()
        .zip(&pb)
        .map(|(&x, &y)| match (x, y) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// The flat offset, in a batch of shape `shape` (padded to `out`'s rank),
/// of the batch index `idx` of the broadcast batch `out`.
fn batch_offset(idx: usize, out: &[usize], shape: &[usize]) -> usize {
    let pad = padded(shape, out.len(), out.len() - shape.len());
    let (mut rem, mut off, mut stride) = (idx, 0, 1);
    for d in (0..out.len()).rev() {
        let i = rem % out[d].max(1);
        rem /= out[d].max(1);
        if pad[d] != 1 {
            off += i * stride;
        }
        stride *= pad[d];
    }
    off
}

/// BatchMatMul's operands seen as batches of matrices: a 1-D operand (with
/// broadcast) is a matrix of one row (A) or one column (B), never
/// transposed (numpy's rule); `batch` is the broadcast batch.
struct BmmDims {
    a_vec: bool,
    b_vec: bool,
    ta: bool,
    tb: bool,
    m: usize,
    k: usize,
    n: usize,
    ba: Vec<usize>,
    bb: Vec<usize>,
    batch: Vec<usize>,
}

impl BmmDims {
    fn of(
        l: &Locked<'_>,
        op: &str,
        (a, b): (&[usize], &[usize]),
        ta: bool,
        tb: bool,
        bcast: bool,
    ) -> Result<Self> {
        let (mut sa, mut sb) = (a.to_vec(), b.to_vec());
        let mismatch = |why: &str| {
            Error::shape(format!(
                "{op}: {why}: A ('{}') {a:?}, B ('{}') {b:?}, trans_a {}, trans_b {}",
                l.input_name(0),
                l.input_name(1),
                ta as i32,
                tb as i32
            ))
            .with_blob(l.input_name(1))
        };
        let (a_vec, b_vec) = (bcast && sa.len() == 1, bcast && sb.len() == 1);
        if a_vec {
            sa.insert(0, 1);
        }
        if b_vec {
            sb.push(1);
        }
        if sa.len() < 2 || sb.len() < 2 {
            return Err(mismatch("A and B need at least 2 dims (1 with broadcast)"));
        }
        if !bcast && (sa.len() != sb.len() || sa[..sa.len() - 2] != sb[..sb.len() - 2]) {
            return Err(mismatch(
                "the batch dims differ (broadcast=1 broadcasts them)",
            ));
        }
        let (ra, ca) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let (rb, cb) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        // With a 1-D input the vector is never transposed (numpy's rule).
        let (ta, tb) = (ta && !a_vec, tb && !b_vec);
        let (m, k) = if ta { (ca, ra) } else { (ra, ca) };
        let (kb, n) = if tb { (cb, rb) } else { (rb, cb) };
        if k != kb {
            return Err(mismatch("dimension mismatch"));
        }
        let (ba, bb) = (sa[..sa.len() - 2].to_vec(), sb[..sb.len() - 2].to_vec());
        let batch =
            broadcast_batch(&ba, &bb).ok_or_else(|| mismatch("the batch dims do not broadcast"))?;
        let nb: usize = batch.iter().product();
        nb.checked_mul(m)
            .and_then(|v| v.checked_mul(n))
            .and_then(|v| v.checked_mul(k.max(1)))
            .ok_or_else(|| mismatch("the products would have too many elements"))?;
        Ok(BmmDims {
            a_vec,
            b_vec,
            ta,
            tb,
            m,
            k,
            n,
            ba,
            bb,
            batch,
        })
    }

    /// The output's shape: the batch, then m and n (each left out for a
    /// 1-D operand).
    fn out_shape(&self) -> Vec<usize> {
        let mut shape = self.batch.clone();
        if !self.a_vec {
            shape.push(self.m);
        }
        if !self.b_vec {
            shape.push(self.n);
        }
        shape
    }
}

fn batch_matmul_t<T: Float>(l: &mut Locked<'_>, ta: bool, tb: bool, bcast: bool) -> Result<()> {
    let op = "BatchMatMul";
    let (a, b) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let d = BmmDims::of(l, op, (a.shape(), b.shape()), ta, tb, bcast)?;
    let (m, k, n) = (d.m, d.k, d.n);
    let total = crate::tensor::checked_numel::<T>(&d.out_shape(), format_args!("{op}'s output"))?;
    let nb: usize = d.batch.iter().product();
    let (ad, bd) = (dense(a), dense(b));
    let mut y = crate::tensor::default_buffer::<T>(total, format_args!("{op}'s output"))?;
    if m * n > 0 {
        for (i, c) in y.chunks_mut(m * n).enumerate().take(nb) {
            let oa = batch_offset(i, &d.batch, &d.ba) * m * k;
            let ob = batch_offset(i, &d.batch, &d.bb) * k * n;
            matmul_into(
                d.ta,
                d.tb,
                m,
                k,
                n,
                &ad[oa..oa + m * k],
                &bd[ob..ob + k * n],
                c,
            );
        }
    }
    l.set_output(0, T::wrap(array(&d.out_shape(), y)?));
    Ok(())
}

/// BatchMatMulGradient (inputs A, B, dY; outputs dA, dB): each batch's
/// products, summed into the batch of A (of B) it was broadcast from.
fn batch_matmul_grad_t<T: Float>(
    l: &mut Locked<'_>,
    ta: bool,
    tb: bool,
    bcast: bool,
) -> Result<()> {
    let op = "BatchMatMulGradient";
    let (a, b, dy) = (
        input::<T>(l, op, 0)?,
        input::<T>(l, op, 1)?,
        input::<T>(l, op, 2)?,
    );
    let d = BmmDims::of(l, op, (a.shape(), b.shape()), ta, tb, bcast)?;
    let (m, k, n) = (d.m, d.k, d.n);
    if dy.shape() != d.out_shape().as_slice() {
        return Err(Error::shape(format!(
            "{op}: dY ('{}') has shape {:?}, but BatchMatMul's output has shape {:?}",
            l.input_name(2),
            dy.shape(),
            d.out_shape()
        ))
        .with_blob(l.input_name(2)));
    }
    let nb: usize = d.batch.iter().product();
    let (ad, bd, gd) = (dense(a), dense(b), dense(dy));
    let mut da = crate::tensor::default_buffer::<T>(a.len(), format_args!("{op}'s dA"))?;
    let mut db = crate::tensor::default_buffer::<T>(b.len(), format_args!("{op}'s dB"))?;
    for i in 0..nb {
        let oa = batch_offset(i, &d.batch, &d.ba) * m * k;
        let ob = batch_offset(i, &d.batch, &d.bb) * k * n;
        let (ai, bi, gi) = (
            &ad[oa..oa + m * k],
            &bd[ob..ob + k * n],
            &gd[i * m * n..(i + 1) * m * n],
        );
        // Y = op(A) op(B): d op(A) = dY op(B)^T, d op(B) = op(A)^T dY,
        // each stored the way its operand is.
        let ga = match (d.ta, d.tb) {
            (false, false) => matmul(false, true, m, n, k, gi, bi),
            (false, true) => matmul(false, false, m, n, k, gi, bi),
            (true, false) => matmul(false, true, k, n, m, bi, gi),
            (true, true) => matmul(true, true, k, n, m, bi, gi),
        }?;
        let gb = match (d.ta, d.tb) {
            (false, false) => matmul(true, false, k, m, n, ai, gi),
            (true, false) => matmul(false, false, k, m, n, ai, gi),
            (false, true) => matmul(true, false, n, m, k, gi, ai),
            (true, true) => matmul(true, true, n, m, k, gi, ai),
        }?;
        for (s, v) in da[oa..oa + m * k].iter_mut().zip(ga) {
            *s = *s + v;
        }
        for (s, v) in db[ob..ob + k * n].iter_mut().zip(gb) {
            *s = *s + v;
        }
    }
    let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
    l.set_output(0, T::wrap(array(&sa, da)?));
    l.set_output(1, T::wrap(array(&sb, db)?));
    Ok(())
}

fn build_batch_matmul_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ta = ctx.args.i64("trans_a", 0)? != 0;
    let tb = ctx.args.i64("trans_b", 0)? != 0;
    let bcast = ctx.args.i64("broadcast", 0)? != 0;
    float_kernel!("BatchMatMulGradient", 0, |l| batch_matmul_grad_t(
        &mut l, ta, tb, bcast
    ))
}

fn build_batch_matmul(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ta = ctx.args.i64("trans_a", 0)? != 0;
    let tb = ctx.args.i64("trans_b", 0)? != 0;
    let bcast = ctx.args.i64("broadcast", 0)? != 0;
    float_kernel!("BatchMatMul", 0, |l| batch_matmul_t(&mut l, ta, tb, bcast))
}

// ------------------------------------------ row-wise products (issue 14) --

/// DotProduct, CosineSimilarity and DotProductWithPadding (row by row) and
/// their gradients.
fn row_product_schemas() -> Vec<OpSchema> {
    const PADDING_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "pad_value",
            "float",
            "0.0",
            "the value the shorter row is padded with"
        ),
        arg!(
            "replicate",
            "bool",
            "false",
            "repeat the shorter row instead of padding it"
        ),
    ];
    vec![
        OpSchema::new("DotProduct", build_dot_product)
            .inputs(2, 2)
            .outputs(1, 1)
            .infer(rows_infer)
            .doc("Z[i] = the dot product of row i of X and of Y (same shape, float32 or float64): the rows are the first dim, each the rest of the tensor (so 1-D inputs give X * Y elementwise)."),
        OpSchema::new("DotProductGradient", build_dot_product)
            .inputs(3, 3)
            .outputs(2, 2)
            .infer(pair_grad_infer)
            .doc("Gradient of DotProduct: inputs (X, Y, dZ), outputs (dX = dZ[i] * Y[i], dY = dZ[i] * X[i]) row by row."),
        OpSchema::new("CosineSimilarity", build_cosine)
            .inputs(2, 2)
            .outputs(1, 1)
            .infer(rows_infer)
            .doc("Z[i] = the cosine similarity of row i of X and of Y (same shape, float32 or float64; rows as DotProduct's): x.y / sqrt(max(|x|^2, 1e-12) max(|y|^2, 1e-12))."),
        OpSchema::new("CosineSimilarityGradient", build_cosine)
            .inputs(3, 3)
            .outputs(2, 2)
            .infer(pair_grad_infer)
            .doc("Gradient of CosineSimilarity: inputs (X, Y, dZ), outputs (dX, dY)."),
        OpSchema::new("DotProductWithPadding", build_dot_padded)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(PADDING_ARGS)
            .infer(rows_infer)
            .doc("Z[i] = the dot product of row i of X and of Y (the same number of dims and rows, float32 or float64), the shorter row padded with pad_value, or with replicate repeated, to the longer's length."),
        OpSchema::new("DotProductWithPaddingGradient", build_dot_padded)
            .inputs(3, 3)
            .outputs(2, 2)
            .args(PADDING_ARGS)
            .infer(pair_grad_infer)
            .doc("Gradient of DotProductWithPadding: inputs (X, Y, dZ), outputs (dX, dY)."),
    ]
}

// ----------------------------------------------------------- DotProduct --

/// X and Y (same shape) as N rows of D: N is the first dim (1 for a 0-d
/// tensor), D the rest.
fn dot_rows(l: &Locked<'_>, op: &str, xi: usize, yi: usize) -> Result<(usize, usize)> {
    let (xs, ys) = (l.tensor(xi)?.shape(), l.tensor(yi)?.shape());
    if xs != ys {
        return Err(Error::shape(format!(
            "{op}: X ('{}', shape {xs:?}) and Y ('{}', shape {ys:?}) must have the same shape",
            l.input_name(xi),
            l.input_name(yi)
        ))
        .with_blob(l.input_name(yi)));
    }
    let n = xs.first().copied().unwrap_or(1);
    let total: usize = xs.iter().product();
    Ok((n, total.checked_div(n).unwrap_or(0)))
}

fn dot_product_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    const OP: &str = "DotProduct";
    let (n, d) = dot_rows(l, OP, 0, 1)?;
    let (x, y) = (input::<T>(l, OP, 0)?, input::<T>(l, OP, 1)?);
    let (xs, ys) = (dense(x), dense(y));
    let z: Vec<T> = crate::tensor::try_collect(
        (0..n).map(|i| {
            let r = i * d..(i + 1) * d;
            dot(&xs[r.clone()], &ys[r])
        }),
        "a kernel buffer",
    )?;
    l.set_output(0, T::wrap(array(&[n], z)?));
    Ok(())
}

/// DotProductGradient: inputs (X, Y, dZ), outputs (dX = dZ * Y, dY = dZ * X)
/// row by row.
fn dot_product_grad_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    const OP: &str = "DotProductGradient";
    let (n, d) = dot_rows(l, OP, 0, 1)?;
    let (x, y, dz) = (
        input::<T>(l, OP, 0)?,
        input::<T>(l, OP, 1)?,
        input::<T>(l, OP, 2)?,
    );
    check_rows_grad(l, OP, dz.shape(), n)?;
    let shape = x.shape().to_vec();
    let (xs, ys, g) = (dense(x), dense(y), dense(dz));
    let scaled = |v: &[T]| -> Result<Vec<T>> {
        crate::tensor::try_collect(
            v.iter().enumerate().map(|(k, &e)| e * g[k / d.max(1)]),
            "a DotProduct gradient",
        )
    };
    let (dx, dy) = (scaled(&ys)?, scaled(&xs)?);
    let (dx, dy) = (array(&shape, dx)?, array(&shape, dy)?);
    l.set_output(0, T::wrap(dx));
    l.set_output(1, T::wrap(dy));
    Ok(())
}

/// The row-wise ops' output: one value per row of X (its first dim, 1 for
/// a 0-d X).
fn rows_infer(
    _: &crate::args::Args<'_>,
    ins: &[Option<crate::operator::ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<crate::operator::ShapeInfo>>> {
    Ok(vec![crate::shapes::rules::known(ins, 0).map(|x| {
        crate::operator::ShapeInfo::new(vec![x.dims.first().copied().unwrap_or(1)], x.dtype)
    })])
}

/// The row-wise ops' gradients: (dX, dY) have X's and Y's shapes.
fn pair_grad_infer(
    _: &crate::args::Args<'_>,
    ins: &[Option<crate::operator::ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<crate::operator::ShapeInfo>>> {
    use crate::shapes::rules::known;
    Ok(vec![known(ins, 0).cloned(), known(ins, 1).cloned()])
}

fn build_dot_product(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let grad = ctx.op_type().ends_with("Gradient");
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        if grad {
            by_float!(&l, "DotProductGradient", 0, dot_product_grad_t(&mut l))?;
        } else {
            by_float!(&l, "DotProduct", 0, dot_product_t(&mut l))?;
        }
        Ok(true)
    }))
}

// ------------------------------- CosineSimilarity, DotProductWithPadding --

/// Caffe2's floor under a squared norm in CosineSimilarity.
const COS_EPS: f64 = 1e-12;

/// The dot product of two slices.
fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).map(|(&x, &y)| x * y).sum()
}

/// CosineSimilarity (`grad` false): Z[i] = x.y / sqrt(max(|x|^2, eps)
/// max(|y|^2, eps)) row by row; its gradient (inputs (X, Y, dZ), outputs
/// (dX, dY)) differentiates that function (a norm under the floor is a
/// constant).
fn cosine_t<T: Float>(l: &mut Locked<'_>, grad: bool) -> Result<()> {
    let op = if grad {
        "CosineSimilarityGradient"
    } else {
        "CosineSimilarity"
    };
    let (n, d) = dot_rows(l, op, 0, 1)?;
    let (x, y) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let shape = x.shape().to_vec();
    let (xs, ys) = (dense(x), dense(y));
    let eps = T::of(COS_EPS);
    let floor = |v: T| if v < eps { eps } else { v };
    let row = |i: usize| (&xs[i * d..(i + 1) * d], &ys[i * d..(i + 1) * d]);
    if !grad {
        let z: Vec<T> = crate::tensor::try_collect(
            (0..n).map(|i| {
                let (xr, yr) = row(i);
                dot(xr, yr) / (floor(dot(xr, xr)) * floor(dot(yr, yr))).sqrt()
            }),
            "a kernel buffer",
        )?;
        l.set_output(0, T::wrap(array(&[n], z)?));
        return Ok(());
    }
    let dz = input::<T>(l, op, 2)?;
    check_rows_grad(l, op, dz.shape(), n)?;
    let g = dense(dz);
    let zero = T::of(0.0);
    let (mut dx, mut dy) = (
        crate::tensor::filled_vec(n * d, zero, "a kernel buffer")?,
        crate::tensor::filled_vec(n * d, zero, "a kernel buffer")?,
    );
    for i in 0..n {
        let (xr, yr) = row(i);
        let (x2, y2, xy) = (dot(xr, xr), dot(yr, yr), dot(xr, yr));
        let (xn2, yn2) = (floor(x2), floor(y2));
        let base = g[i] / (xn2 * yn2).sqrt();
        let kx = if x2 < eps { zero } else { base * xy / xn2 };
        let ky = if y2 < eps { zero } else { base * xy / yn2 };
        for j in 0..d {
            dx[i * d + j] = base * yr[j] - kx * xr[j];
            dy[i * d + j] = base * xr[j] - ky * yr[j];
        }
    }
    l.set_output(0, T::wrap(array(&shape, dx)?));
    l.set_output(1, T::wrap(array(&shape, dy)?));
    Ok(())
}

/// dZ of a row-wise gradient op must be 1-D with one value per row.
fn check_rows_grad(l: &Locked<'_>, op: &str, shape: &[usize], n: usize) -> Result<()> {
    if shape != [n] {
        return Err(Error::shape(format!(
            "{op}: dZ ('{}', shape {shape:?}) must be 1-D with the {n} rows of X",
            l.input_name(2)
        ))
        .with_blob(l.input_name(2)));
    }
    Ok(())
}

/// DotProductWithPadding's arguments.
#[derive(Clone, Copy)]
struct Padding {
    pad_value: f64,
    replicate: bool,
}

/// X and Y for DotProductWithPadding: the same number of dims and rows (the
/// first dim); (N, DX, DY), each row the rest of its tensor. With
/// `replicate` the longer row is a whole number of shorter ones.
fn padded_rows(l: &Locked<'_>, op: &str, replicate: bool) -> Result<(usize, usize, usize)> {
    let (xs, ys) = (l.tensor(0)?.shape(), l.tensor(1)?.shape());
    let bad = |why: String| {
        Error::shape(format!(
            "{op}: X ('{}', shape {xs:?}) and Y ('{}', shape {ys:?}) {why}",
            l.input_name(0),
            l.input_name(1)
        ))
        .with_blob(l.input_name(1))
    };
    if xs.len() != ys.len() || xs.first() != ys.first() {
        return Err(bad(
            "must have the same number of dims and the same first dim".into(),
        ));
    }
    let n = xs.first().copied().unwrap_or(1);
    let dx = xs.iter().product::<usize>().checked_div(n).unwrap_or(0);
    let dy = ys.iter().product::<usize>().checked_div(n).unwrap_or(0);
    let (short, long) = (dx.min(dy), dx.max(dy));
    if replicate && long.checked_rem(short).unwrap_or(long) != 0 {
        return Err(bad(format!(
            "have rows of {dx} and {dy}: with replicate, the longer must be a whole number of the shorter"
        )));
    }
    Ok((n, dx, dy))
}

/// DotProductWithPadding (`grad` false): per row, the shorter of x and y
/// padded with `pad_value` (or, with `replicate`, repeated) to the longer's
/// length, then the dot product; its gradient (inputs (X, Y, dZ), outputs
/// (dX, dY)).
fn dot_padded_t<T: Float>(l: &mut Locked<'_>, p: Padding, grad: bool) -> Result<()> {
    let op = if grad {
        "DotProductWithPaddingGradient"
    } else {
        "DotProductWithPadding"
    };
    let (n, dx, dy) = padded_rows(l, op, p.replicate)?;
    let (x, y) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let (xshape, yshape) = (x.shape().to_vec(), y.shape().to_vec());
    let (xs, ys) = (dense(x), dense(y));
    let pad = T::of(p.pad_value);
    let zero = T::of(0.0);
    let d = dx.min(dy);
    // Per row: (the longer row, the shorter, whether X is the longer).
    let rows = |i: usize| {
        let (xr, yr) = (&xs[i * dx..(i + 1) * dx], &ys[i * dy..(i + 1) * dy]);
        if dx > dy {
            (xr, yr, true)
        } else {
            (yr, xr, false)
        }
    };
    if !grad {
        let z: Vec<T> = crate::tensor::try_collect(
            (0..n).map(|i| {
                let (lr, sr, _) = rows(i);
                if p.replicate {
                    lr.chunks(d.max(1)).map(|c| dot(c, sr)).sum()
                } else {
                    dot(&lr[..d], sr) + pad * lr[d..].iter().copied().sum::<T>()
                }
            }),
            "a kernel buffer",
        )?;
        l.set_output(0, T::wrap(array(&[n], z)?));
        return Ok(());
    }
    let dz = input::<T>(l, op, 2)?;
    check_rows_grad(l, op, dz.shape(), n)?;
    let g = dense(dz);
    let (mut gx, mut gy) = (
        crate::tensor::filled_vec(n * dx, zero, "a kernel buffer")?,
        crate::tensor::filled_vec(n * dy, zero, "a kernel buffer")?,
    );
    let long_len = dx.max(dy);
    for i in 0..n {
        let (lr, sr, x_long) = rows(i);
        let mut gl = crate::tensor::filled_vec(long_len, zero, "a kernel buffer")?;
        let mut gs = crate::tensor::filled_vec(d, zero, "a kernel buffer")?;
        if p.replicate {
            for (c, glc) in lr.chunks(d.max(1)).zip(gl.chunks_mut(d.max(1))) {
                for j in 0..d {
                    glc[j] = g[i] * sr[j];
                    gs[j] += g[i] * c[j];
                }
            }
        } else {
            for j in 0..d {
                gl[j] = g[i] * sr[j];
                gs[j] = g[i] * lr[j];
            }
            for v in &mut gl[d..] {
                *v = g[i] * pad;
            }
        }
        let (gxr, gyr) = if x_long { (gl, gs) } else { (gs, gl) };
        gx[i * dx..(i + 1) * dx].copy_from_slice(&gxr);
        gy[i * dy..(i + 1) * dy].copy_from_slice(&gyr);
    }
    l.set_output(0, T::wrap(array(&xshape, gx)?));
    l.set_output(1, T::wrap(array(&yshape, gy)?));
    Ok(())
}

fn build_cosine(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let grad = ctx.op_type().ends_with("Gradient");
    float_kernel!("CosineSimilarity", 0, |l| cosine_t(&mut l, grad))
}

fn build_dot_padded(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let grad = ctx.op_type().ends_with("Gradient");
    let p = Padding {
        pad_value: f64::from(ctx.args.f32("pad_value", 0.0)?),
        replicate: ctx.args.bool("replicate", false)?,
    };
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| dot_padded_t(&mut l, p, grad))
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::test_util::{f32s, get, int_arg, op, run, vals, ws_with};

    #[test]
    fn fc_and_its_gradient_by_hand() {
        // X = [[1, 2], [3, 4]], W = [[1, 0], [1, 1], [0, 2]], b = [0, 1, 2].
        let ws = ws_with(&[
            ("x", f32s(&[2, 2], &[1., 2., 3., 4.])),
            ("w", f32s(&[3, 2], &[1., 0., 1., 1., 0., 2.])),
            ("b", f32s(&[3], &[0., 1., 2.])),
        ]);
        run(&ws, op("FC", &["x", "w", "b"], &["y"], vec![])).unwrap();
        let y = get(&ws, "y");
        assert_eq!(y.shape(), &[2, 3]);
        assert_eq!(vals(&y), vec![1., 4., 6., 3., 8., 10.]);
        // dY = ones: dW = column sums of X per row, db = 2, dX = row sums of W.
        crate::test_util::feed(&ws, "dy", f32s(&[2, 3], &[1.; 6]));
        run(
            &ws,
            op("FCGradient", &["x", "w", "dy"], &["dw", "db", "dx"], vec![]),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "dw")), vec![4., 6., 4., 6., 4., 6.]);
        assert_eq!(vals(&get(&ws, "db")), vec![2., 2., 2.]);
        assert_eq!(vals(&get(&ws, "dx")), vec![2., 3., 2., 3.]);
    }

    #[test]
    fn matmul_transposes() {
        let ws = ws_with(&[
            ("a", f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.])),
            ("b", f32s(&[2, 3], &[1., 0., 1., 0., 1., 0.])),
        ]);
        run(
            &ws,
            op("MatMul", &["a", "b"], &["y"], vec![int_arg("trans_b", 1)]),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "y")), vec![4., 2., 10., 5.]);
        let e = run(&ws, op("MatMul", &["a", "b"], &["z"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
    }

    #[test]
    fn batch_matmul_gradient_sums_over_broadcast_batches() {
        // A (2 x 1 x 2) broadcast against B (2 x 1): Y[b] = A[b] B, so
        // dA[b] = dY[b] B^T and dB = sum_b A[b]^T dY[b].
        let ws = ws_with(&[
            ("a", f32s(&[2, 1, 2], &[1., 2., 3., 4.])),
            ("b", f32s(&[2, 1], &[5., 6.])),
            ("dy", f32s(&[2, 1, 1], &[1., 10.])),
        ]);
        run(
            &ws,
            op(
                "BatchMatMulGradient",
                &["a", "b", "dy"],
                &["da", "db"],
                vec![int_arg("broadcast", 1)],
            ),
        )
        .unwrap();
        assert_eq!(get(&ws, "da").shape(), &[2, 1, 2]);
        assert_eq!(vals(&get(&ws, "da")), vec![5., 6., 50., 60.]);
        assert_eq!(get(&ws, "db").shape(), &[2, 1]);
        assert_eq!(vals(&get(&ws, "db")), vec![1. + 30., 2. + 40.]);
        // A 1-D A is one row, never transposed: Y = a B (B 2 x 1 -> Y 1-D).
        let ws = ws_with(&[
            ("a", f32s(&[2], &[1., 2.])),
            ("b", f32s(&[2, 1], &[5., 6.])),
            ("dy", f32s(&[1], &[3.])),
        ]);
        let args = vec![int_arg("broadcast", 1), int_arg("trans_a", 1)];
        run(
            &ws,
            op(
                "BatchMatMulGradient",
                &["a", "b", "dy"],
                &["da", "db"],
                args.clone(),
            ),
        )
        .unwrap();
        assert_eq!(get(&ws, "da").shape(), &[2]);
        assert_eq!(vals(&get(&ws, "da")), vec![15., 18.]);
        assert_eq!(vals(&get(&ws, "db")), vec![3., 6.]);
        // dY of another shape than the product's is an error naming it.
        let bad = ws_with(&[
            ("a", f32s(&[2], &[1., 2.])),
            ("b", f32s(&[2, 1], &[5., 6.])),
            ("dy", f32s(&[2], &[3., 4.])),
        ]);
        let e = run(
            &bad,
            op(
                "BatchMatMulGradient",
                &["a", "b", "dy"],
                &["da", "db"],
                args,
            ),
        )
        .unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("dy")),
            "{e}"
        );
    }
    #[test]
    fn dot_product_by_hand() {
        let ws = ws_with(&[
            ("x", f32s(&[2, 2], &[1., 2., 3., 4.])),
            ("y", f32s(&[2, 2], &[5., 6., 7., 8.])),
            ("dz", f32s(&[2], &[1., 10.])),
            ("v", f32s(&[3], &[1., 2., 3.])),
        ]);
        run(&ws, op("DotProduct", &["x", "y"], &["z"], vec![])).unwrap();
        assert_eq!(vals(&get(&ws, "z")), vec![17., 53.]);
        run(
            &ws,
            op(
                "DotProductGradient",
                &["x", "y", "dz"],
                &["dx", "dy"],
                vec![],
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "dx")), vec![5., 6., 70., 80.]);
        assert_eq!(vals(&get(&ws, "dy")), vec![1., 2., 30., 40.]);
        // 1-D inputs: one row per element.
        run(&ws, op("DotProduct", &["v", "v"], &["w"], vec![])).unwrap();
        assert_eq!(vals(&get(&ws, "w")), vec![1., 4., 9.]);
        let e = run(&ws, op("DotProduct", &["x", "v"], &["z"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
    }
    #[test]
    fn cosine_similarity_and_dot_with_padding_by_hand() {
        let h = std::f32::consts::FRAC_1_SQRT_2;
        let ws = ws_with(&[
            ("x", f32s(&[2, 2], &[3., 4., 1., 0.])),
            ("y", f32s(&[2, 2], &[4., 3., 1., 1.])),
            ("dz", f32s(&[2], &[0., 1.])),
            ("p", f32s(&[1, 3], &[1., 2., 3.])),
            ("q", f32s(&[1, 2], &[4., 5.])),
            ("r", f32s(&[1, 4], &[1., 2., 3., 4.])),
            ("s", f32s(&[1, 2], &[1., 10.])),
            ("g", f32s(&[1], &[1.])),
        ]);
        let close = |got: Vec<f32>, want: &[f32]| {
            assert!(
                got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6),
                "{got:?} vs {want:?}"
            );
        };
        run(&ws, op("CosineSimilarity", &["x", "y"], &["c"], vec![])).unwrap();
        close(vals(&get(&ws, "c")), &[0.96, h]);
        // Row 2: d cos/dx = y/(|x||y|) - (x.y) x/(|x|^3 |y|) = [0, 1/sqrt2].
        run(
            &ws,
            op(
                "CosineSimilarityGradient",
                &["x", "y", "dz"],
                &["dx", "dy"],
                vec![],
            ),
        )
        .unwrap();
        close(vals(&get(&ws, "dx")), &[0., 0., 0., h]);
        close(vals(&get(&ws, "dy")), &[0., 0., h / 2., -h / 2.]);
        let pad = |v: f32| vec![crate::test_util::float_arg("pad_value", v)];
        run(
            &ws,
            op("DotProductWithPadding", &["p", "q"], &["z"], pad(0.)),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "z")), vec![14.]);
        run(
            &ws,
            op("DotProductWithPadding", &["q", "p"], &["z"], pad(2.)),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "z")), vec![20.]);
        run(
            &ws,
            op(
                "DotProductWithPaddingGradient",
                &["p", "q", "g"],
                &["dp", "dq"],
                pad(2.),
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "dp")), vec![4., 5., 2.]);
        assert_eq!(vals(&get(&ws, "dq")), vec![1., 2.]);
        let rep = || vec![int_arg("replicate", 1)];
        run(&ws, op("DotProductWithPadding", &["r", "s"], &["z"], rep())).unwrap();
        assert_eq!(vals(&get(&ws, "z")), vec![64.]);
        run(
            &ws,
            op(
                "DotProductWithPaddingGradient",
                &["r", "s", "g"],
                &["dr", "ds"],
                rep(),
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "dr")), vec![1., 10., 1., 10.]);
        assert_eq!(vals(&get(&ws, "ds")), vec![4., 6.]);
        // 3 is not a whole number of 2s.
        let e = run(&ws, op("DotProductWithPadding", &["p", "q"], &["z"], rep())).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
    }
}
