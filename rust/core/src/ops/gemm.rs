//! Matrix products for the kernels (`nn.rs`, `conv.rs`, `winograd.rs`):
//! float32 products with at most four rows of C on `thin` (matrix-vector
//! products: FC at batch 1 to 4, its dX, MatMul by a vector; BENCHMARKS.md
//! "Matrix-vector products"), FC's products of 9 to 64 rows over its
//! transposed weight on `panel` (AVX-512F; B packed at each call, or once
//! for a recurrent step's weight: [`PackedB`]), others that are tiny, have
//! few columns or few rows over a transposed B on `small` (both AVX2 + FMA,
//! detected at run time), the rest on the `gemm` crate (AVX-512 where the CPU has it,
//! K cut in fixed blocks: [`blocked`]); float64 on `matrixmultiply`; on
//! strided matrices, bounds checked once; [`par_gemm`] splits a large
//! product into chunks of C's rows or columns that the caller and idle
//! threads of the kernel pool (rayon) claim one at a time (issue 14;
//! thresholds chosen by measurement, BENCHMARKS.md "GEMM (issue 14)" and
//! "GEMM on AVX-512 (issues 29, 30)").
//!
//! Bits: the kernel is chosen once per product ([`kernel`], from its shape
//! and strides, never from the pool's size), and in every kernel an
//! element of C is computed by the same operations whichever rows or
//! columns are computed with it (`small` and `panel`: one fused
//! multiply-add chain over k in order per element, whatever its tile; `thin`: see there; the
//! crate: K in blocks of [`KC`], and never a chunk small enough for its
//! dot-product kernels, see [`par_gemm`]); so a product split across the
//! pool has the same bits as on one thread, whatever the pool's size or
//! the chunks' boundaries. (They may differ between kernels, so between
//! CPUs with and without AVX2 + FMA or AVX-512.)
//!
//! The split never runs more threads than the kernel pool has
//! (`RAYON_NUM_THREADS`, `threads::set_num_threads`): the caller works on
//! its own product and counts as one of them, and a caller borrows only the
//! pool threads that no other caller in `par_gemm` stands for, so several
//! plan instances multiplying at once each keep to their own thread.

use crate::num::Float;
use crate::tensor::DataType;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

mod panel;
mod small;
mod thin;

/// Which float32 products run on `small` (where the CPU has AVX2 and FMA)
/// rather than the `gemm` crate (AVX-512 where the CPU has it), measured
/// kernel against kernel on one thread (BENCHMARKS.md "GEMM on AVX-512
/// (issues 29, 30)"): the crate was 1.5-2.4x faster from 32^3 up, on
/// either layout of B, but the small kernel won below about 16^3
/// multiply-adds ([`SMALL_MACS`]), on C at most [`SMALL_N`] columns wide
/// (0.6-1.0x), and where B is transposed (FC's weights, rows `k` apart),
/// A has at most [`THIN_M`] rows and K is over [`THIN_K`]: the crate reads
/// such a B in place, across its rows, 1.4-6x as slow, and a plain copy of
/// B (which [`blocked`] makes from 9 rows up) costs more than such a
/// product; up to [`THIN_M_LARGE_B`] rows when B is larger than
/// [`PLAIN_MAX_B`] (no copy then: see [`blocked`]). Products
/// with one row, or C of at most [`SMALL_C`] elements, stay on `small`
/// too: there the crate switches to dot-product kernels that sum in
/// another order, so a chunk of a product (a block of a convolution's
/// channels on the pool) could get other bits than the whole product.
/// float64 products stay on `matrixmultiply` (not a speed target; its
/// kernel computes an element the same way whatever the block's shape,
/// which the convolutions' bitwise tests rely on).
const SMALL_MACS: usize = 1 << 14;
const SMALL_N: usize = 16;
const SMALL_C: usize = 256;
const THIN_M: usize = 8;
const THIN_M_LARGE_B: usize = 64;
const THIN_K: usize = 256;

/// Whether an `m x k x n` float32 product with B's strides `sb` runs on
/// `small`.
fn use_small(m: usize, k: usize, n: usize, sb: (usize, usize)) -> bool {
    let macs = m.saturating_mul(k).saturating_mul(n);
    let b_transposed = sb.0 < sb.1;
    let thin_transposed =
        b_transposed && k > THIN_K && (m <= THIN_M || (m <= THIN_M_LARGE_B && !copies_b(k, n)));
    let tiny_c = m <= 1 || m.saturating_mul(n) <= SMALL_C;
    (n <= SMALL_N || tiny_c || macs < SMALL_MACS || thin_transposed) && small::available()
}

/// Whether an `m x k x n` product of `T` with a row-major A gets the same
/// bits from B transposed (FC's weights: `n x k` row-major) as from B laid
/// out plainly (`k x n` row-major): when both run on the packed kernel,
/// which computes each element of C the same way from either layout (see
/// [`blocked`]); the thin and small kernels sum in another order for each
/// layout. FC reads a weight laid out once only where it does, so a step
/// net's FC and the same FC outside it agree to the bit.
pub(crate) fn plain_b_same_bits<T: Float>(m: usize, k: usize, n: usize) -> bool {
    let sa = (k, 1);
    kernel::<T>(m, k, n, sa, (1, k)) == Kernel::Packed
        && kernel::<T>(m, k, n, sa, (n, 1)) == Kernel::Packed
}

/// The kernel of a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// The `gemm` crate for float32 (packs its operands; AVX-512 where
    /// the CPU has it), `matrixmultiply` for float64.
    Packed,
    /// `small`: small and thin products.
    Small,
    /// `thin::dot`: at most `thin::ROWS` rows of C, A's rows and B's
    /// columns contiguous (FC's layout).
    Dot,
    /// `thin::axpy`: at most `thin::ROWS` rows of C, B's rows contiguous.
    Axpy,
    /// `panel`: FC's products of [`PANEL_ROWS`] rows over its transposed
    /// weight, B packed into panels (at each call, or once: [`PackedB`]).
    Panel,
}

/// Rows of C of the products on `panel` (above those `small` reads a
/// transposed B in place for): FC at batch 9 to 64, a recurrent step's FC.
const PANEL_ROWS: std::ops::RangeInclusive<usize> = THIN_M + 1..=64;

/// Whether a float32 `m x k x n` product with B's strides `sb` runs on
/// `panel`: B transposed (FC's weights) and small enough that `blocked`
/// would copy it to a plain layout at each call ([`copies_b`], at least
/// [`PLAIN_MIN_N`] columns); `panel` packs it instead, in the same time,
/// and a recurrent step packs it once for all its steps.
fn use_panel(m: usize, k: usize, n: usize, sb: (usize, usize)) -> bool {
    let transposed_b = sb.0 == 1 && sb.1 > 1;
    transposed_b
        && PANEL_ROWS.contains(&m)
        && n >= PLAIN_MIN_N.max(panel::NR)
        && copies_b(k, n)
        && m.saturating_mul(k).saturating_mul(n) >= SMALL_MACS
        && panel::available()
}

/// The kernel of an `m x k x n` product of `T` with A's and B's strides
/// `sa`, `sb` (on this CPU): `thin` for float32 with at most
/// [`thin::ROWS`] rows of C in its layouts (matrix-vector products, bound
/// by reading B from memory), `small` for other small float32 products,
/// `matrixmultiply` for the rest. A split product asks once, for the whole
/// product, so every chunk runs the kernel the calling thread alone would
/// have run and the result has the same bits whatever the pool's size.
/// (`matrixmultiply` above stands for the `gemm` crate in float32.)
fn kernel<T: Float>(
    m: usize,
    k: usize,
    n: usize,
    sa: (usize, usize),
    sb: (usize, usize),
) -> Kernel {
    if T::DTYPE != DataType::Float || !small::available() {
        return Kernel::Packed;
    }
    if m <= thin::ROWS {
        if thin::dot_layout(sa, sb) {
            return Kernel::Dot;
        }
        if thin::axpy_layout(sb) {
            return Kernel::Axpy;
        }
    }
    if use_panel(m, k, n, sb) {
        Kernel::Panel
    } else if use_small(m, k, n, sb) {
        Kernel::Small
    } else {
        Kernel::Packed
    }
}

/// C = alpha A B + beta C on raw pointers, on `kernel` (only where
/// [`kernel`] chose it for some product; `Packed` is the `gemm` crate for
/// float32 ([`blocked`]) and `matrixmultiply`'s `dgemm` for float64; the
/// match on the dtype constant is resolved when the function is compiled
/// for `T`).
///
/// # Safety
/// Every index the strides reach must be inside the buffers, and C must
/// alias neither A nor B.
#[allow(clippy::too_many_arguments)]
unsafe fn raw<T: Float>(
    kernel: Kernel,
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: *const T,
    sa: (isize, isize),
    b: *const T,
    sb: (isize, isize),
    beta: T,
    c: *mut T,
    sc: (isize, isize),
) {
    // `Float` is float32 and float64 only, each its own `Element` dtype, so
    // the pointer casts below are to `T` itself.
    match T::DTYPE {
        DataType::Float => {
            let (a, b, c) = (a.cast::<f32>(), b.cast::<f32>(), c.cast::<f32>());
            let (alpha, beta) = (alpha.to_f32(), beta.to_f32());
            // SAFETY: forwarded from the caller's contract; `small` and
            // `thin` only where `kernel` found the CPU runs them (and
            // `thin` only for the rows and layouts it takes).
            unsafe {
                match kernel {
                    Kernel::Small => small::sgemm(m, k, n, alpha, a, sa, b, sb, beta, c, sc),
                    Kernel::Dot => thin::dot(m, k, n, alpha, a, sa.0, b, sb.1, beta, c, sc),
                    Kernel::Axpy => thin::axpy(m, k, n, alpha, a, sa, b, sb.0, beta, c, sc),
                    Kernel::Packed => blocked(m, k, n, alpha, a, sa, b, sb, beta, c, sc),
                    Kernel::Panel => packing_panels(m, k, n, alpha, a, sa, b, sb, beta, c, sc),
                }
            }
        }
        DataType::Double => {
            let (a, b, c) = (a.cast::<f64>(), b.cast::<f64>(), c.cast::<f64>());
            let (alpha, beta) = (alpha.to_f64(), beta.to_f64());
            // SAFETY: forwarded from the caller's contract.
            unsafe {
                matrixmultiply::dgemm(
                    m, k, n, alpha, a, sa.0, sa.1, b, sb.0, sb.1, beta, c, sc.0, sc.1,
                )
            }
        }
        other => unreachable!("a Float of dtype {other}"),
    }
}

thread_local! {
    /// Each thread's buffer for [`packing_panels`] (taken while in use).
    static PANELS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// C = alpha A B + beta C on `panel`, B packed into this thread's buffer
/// first (the products of [`Kernel::Panel`] but those given a
/// [`PackedB`]).
///
/// # Safety
/// As [`raw`]; `panel::available()`.
#[allow(clippy::too_many_arguments)]
unsafe fn packing_panels(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    sa: (isize, isize),
    b: *const f32,
    sb: (isize, isize),
    beta: f32,
    c: *mut f32,
    sc: (isize, isize),
) {
    let mut buf = PANELS.with(|p| p.take());
    let need = panel::packed_len(k, n);
    if buf.len() < need {
        buf.clear();
        if buf.try_reserve_exact(need).is_err() {
            // No memory for the packing: the crate, reading B in place
            // (other bits, but an answer rather than an abort).
            // SAFETY: forwarded from the caller's contract.
            return unsafe { blocked(m, k, n, alpha, a, sa, b, sb, beta, c, sc) };
        }
        buf.resize(need, 0.0);
    }
    // SAFETY: forwarded from the caller's contract; `buf` holds `need`.
    unsafe {
        panel::pack(k, n, b, sb, &mut buf);
        panel::run(m, k, n, alpha, a, sa, buf.as_ptr(), beta, c, sc);
    }
    // A large B leaves a large buffer behind: let it go.
    if buf.capacity() <= PLAIN_MAX_B + panel::NR * k {
        PANELS.with(|p| p.set(buf));
    }
}

/// A float32 B (`k x n`) packed once for the products that read it on
/// `panel` (a recurrent step net's FC weights, for all its steps): each
/// product then runs the kernel alone, with the bits of the same product
/// packing B itself.
pub(crate) struct PackedB {
    k: usize,
    n: usize,
    data: Vec<f32>,
}

impl PackedB {
    /// B (`k x n`, strides `sb`) packed, if a float32 `m x k x n` product
    /// with A's strides `sa` runs on `panel` (else `Ok(None)`).
    pub(crate) fn for_product<T: Float>(
        m: usize,
        k: usize,
        n: usize,
        sa: (usize, usize),
        b: &[T],
        sb: (usize, usize),
    ) -> crate::error::Result<Option<PackedB>> {
        if kernel::<T>(m, k, n, sa, sb) != Kernel::Panel {
            return Ok(None);
        }
        assert!(b.len() >= reach(k, n, sb), "gemm: B is too short");
        let len = panel::packed_len(k, n);
        let mut data = crate::tensor::try_vec::<f32>(len, "a weight packed for the product")?;
        data.resize(len, 0.0);
        let is = |s: (usize, usize)| (s.0 as isize, s.1 as isize);
        // SAFETY: `kernel` chose `panel`, so the CPU runs it and `T` is
        // float32; B's reach was asserted; `data` holds `len`.
        unsafe { panel::pack(k, n, b.as_ptr().cast::<f32>(), is(sb), &mut data) };
        Ok(Some(PackedB { k, n, data }))
    }
}

/// [`product_uninit`] with B packed: `b` was packed by
/// [`PackedB::for_product`] for this product's shape and A's strides.
///
/// Panics if `b` was packed for another `k x n`, or `c` is not `m x n`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn product_packed_uninit<T: Float>(
    split: bool,
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    sa: (usize, usize),
    b: &PackedB,
    c: &mut [std::mem::MaybeUninit<T>],
) {
    assert!(
        T::DTYPE == DataType::Float && (b.k, b.n) == (k, n),
        "gemm: B was packed for another product"
    );
    assert_eq!(Some(c.len()), m.checked_mul(n), "gemm: C is not m x n");
    assert!(a.len() >= reach(m, k, sa), "gemm: A is too short");
    let c = CBuf {
        ptr: c.as_mut_ptr().cast::<T>(),
        len: c.len(),
    };
    // SAFETY: T is float32 (asserted); A's reach asserted, B packed for
    // k x n (`PackedB` exists only where `panel` runs), C is m x n
    // row-major, written whole (beta 0).
    unsafe {
        par_gemm_packed(
            split,
            m,
            k,
            n,
            T::ONE,
            a,
            sa,
            b.data.as_ptr(),
            T::ZERO,
            c,
            (n, 1),
        );
    }
}

/// The depth of one call into the `gemm` crate: [`blocked`] cuts K into
/// blocks of at most this many, in order, so each element of C is C's old
/// value scaled, then each block's sum added in turn, whatever the shape
/// of the call; the crate blocks K itself only above 512 (by its cache
/// model, which depends on M and N), so a chunk of a split product sums in
/// the same order as the whole product (see [`plan`]).
const KC: usize = 512;

/// C = alpha A B + beta C on the `gemm` crate (float32 here, its AVX-512
/// kernels where the CPU has them), K in blocks of [`KC`]; C is not read
/// when beta is zero (it may be uninitialised memory written by nothing
/// yet, or hold NaN).
///
/// # Safety
/// As [`raw`]; `k >= 1`.
#[allow(clippy::too_many_arguments)]
unsafe fn blocked<T: Float>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: *const T,
    sa: (isize, isize),
    b: *const T,
    sb: (isize, isize),
    beta: T,
    c: *mut T,
    sc: (isize, isize),
) {
    // A transposed B (columns contiguous: FC's weights) under at most
    // `PLAIN_M` rows of A: the crate reads such a B in place, across its
    // rows, 1.4-6x as slow as the same B laid out plainly; copying each K
    // block into the plain layout first costs less than that difference
    // (BENCHMARKS.md "FC's weights laid out for the product"). The crate
    // computes each element of C the same way from either layout, so the
    // bits do not depend on the copy (the split products' bitwise tests).
    let transposed_b = sb.0 == 1 && sb.1 > 1;
    let mut plain = if T::DTYPE == DataType::Float
        && transposed_b
        && m <= PLAIN_M
        && n >= PLAIN_MIN_N
        && copies_b(k, n)
    {
        TRANSPOSED.with(|t| t.take())
    } else {
        None
    };
    let ld = n + PLAIN_PAD;
    // A stored by columns (A transposed: FC's weight gradient dY^T X), B
    // by rows, C by rows and A much the larger: C is made in a scratch
    // matrix stored by columns, then copied into place. The crate works on
    // a C stored by columns (it turns a row-major C's product around, C^T
    // = B^T A^T), and on that layout it reads A in place and packs the
    // small B, where on C's own it packs A: 1024 x 1600 x 128 4.1 -> 3.3
    // ms, and 7.3-7.9 -> 3.6-4.0 ms when A was last touched long before
    // (inside an LSTM's training step; BENCHMARKS.md "C stored by
    // columns"). Each element of C is the same sum in the same order
    // either way, so the bits do not change.
    let mut by_columns = if T::DTYPE == DataType::Float
        && sa.0 == 1
        && sa.1 > 1
        && sb.1 == 1
        && sc.1 == 1
        && m >= 2 * n
        && n >= 8
        && k >= 64
        && m * n <= COLUMNS_MAX
    {
        // The scratch is kept between calls; it is written before it is
        // read (C copied in, or the crate's first K block writing without
        // reading when beta is zero). No memory for it: C in place.
        COLUMNS.with(|t| t.take()).and_then(|mut buf| {
            if buf.len() < m * n {
                buf.clear();
                if buf.try_reserve_exact(m * n).is_err() {
                    COLUMNS.with(|t| t.set(Some(Vec::new())));
                    return None;
                }
                buf.resize(m * n, 0.0);
            }
            Some(buf)
        })
    } else {
        None
    };
    let (c_rows, c_row_stride) = (c, sc.0);
    let (c, sc) = match by_columns.as_mut() {
        Some(buf) => {
            if beta != T::ZERO {
                // SAFETY: C is m x n with rows sc.0 apart and columns
                // adjacent (the caller's contract, sc.1 == 1); `buf` holds
                // m * n.
                unsafe {
                    transpose_into(
                        c_rows.cast::<f32>(),
                        c_row_stride,
                        n,
                        m,
                        buf.as_mut_ptr(),
                        m,
                    )
                };
            }
            (buf.as_mut_ptr().cast::<T>(), (1, m as isize))
        }
        None => (c, sc),
    };
    let mut depth = 0;
    while depth < k {
        let kb = KC.min(k - depth);
        // B's rows depth.. of this block, and their strides, read in place
        // or from the plain copy.
        let mut bb = unsafe { b.offset(depth as isize * sb.0) };
        let mut bs = sb;
        if let Some(buf) = plain.as_mut() {
            let need = kb * ld;
            if buf.len() < need && buf.try_reserve_exact(need - buf.len()).is_ok() {
                buf.resize(need, 0.0);
            }
            if buf.len() >= need {
                // SAFETY: B's block reaches `kb` rows and `n` columns from
                // `bb` (the caller's contract); the buffer holds `kb * ld`.
                unsafe { transpose_into(bb.cast::<f32>(), sb.1, kb, n, buf.as_mut_ptr(), ld) };
                bb = buf.as_ptr().cast::<T>();
                bs = (ld as isize, 1);
            }
        }
        let first = depth == 0;
        // The crate computes dst = alpha * dst + beta * lhs * rhs, reading
        // dst only when asked (`read_dst`): its alpha is our beta.
        let (read, scale) = if first {
            (beta != T::ZERO, beta)
        } else {
            (true, T::ONE)
        };
        // SAFETY: forwarded from the caller's contract; the block's columns
        // of A and rows of B are within the operands.
        unsafe {
            gemm::gemm(
                m,
                n,
                kb,
                c,
                sc.1,
                sc.0,
                read,
                a.offset(depth as isize * sa.1),
                sa.1,
                sa.0,
                bb,
                bs.1,
                bs.0,
                scale,
                alpha,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
        depth += kb;
    }
    if let Some(buf) = plain {
        TRANSPOSED.with(|t| t.set(Some(buf)));
    }
    if let Some(buf) = by_columns {
        // SAFETY: `buf` holds C stored by columns (m x n, columns m
        // apart); C's rows are `c_row_stride` apart, its columns adjacent.
        unsafe {
            transpose_into(
                buf.as_ptr(),
                m as isize,
                m,
                n,
                c_rows.cast::<f32>(),
                c_row_stride as usize,
            )
        };
        COLUMNS.with(|t| t.set(Some(buf)));
    }
}

/// Elements of C up to which [`blocked`] makes it stored by columns (1
/// MiB, within this core's L2): 4096 x 256 x 1000, C of 16 MiB, took
/// 14.2 -> 21.8 ms that way, the two copies of C through memory.
const COLUMNS_MAX: usize = 1 << 18;

/// Rows of A up to which [`blocked`] lays a transposed B out plainly
/// first: at 32 and 64 rows the copy and the product took 0.26-0.9x the
/// time of the product alone, at 128-256 rows 0.99x (the crate's own
/// packing of A is then worth more than B's layout).
const PLAIN_M: usize = 128;
/// Elements of B above which it is read in place: the copy is written and
/// read again from memory rather than cache, three passes over B where
/// the product (memory-bound at these few rows) makes one (AlexNet's FC
/// layers at batch 16, B of 38M elements: 0.86x PyTorch with the copy).
const PLAIN_MAX_B: usize = 1 << 19;

/// Whether a transposed B of `k x n` is small enough for `blocked` to copy
/// into the plain layout ([`PLAIN_MAX_B`]); `use_small` keeps a larger one
/// for the small kernel up to [`THIN_M_LARGE_B`] rows.
fn copies_b(k: usize, n: usize) -> bool {
    k.saturating_mul(n) <= PLAIN_MAX_B
}
/// Columns of C below which B is read in place (too little to copy).
const PLAIN_MIN_N: usize = 32;
/// Padding of the plain copy's rows: rows 4 KiB apart (1024 columns) would
/// map to one set of the L1 cache and make the copy 4x as slow.
const PLAIN_PAD: usize = 16;

thread_local! {
    /// Each thread's buffer for [`blocked`]'s plain copy of a transposed B
    /// (taken while in use, so a product inside a product cannot share it).
    static TRANSPOSED: std::cell::Cell<Option<Vec<f32>>> = const { std::cell::Cell::new(Some(Vec::new())) };
    /// Each thread's scratch C stored by columns for [`blocked`] (taken
    /// while in use).
    static COLUMNS: std::cell::Cell<Option<Vec<f32>>> = const { std::cell::Cell::new(Some(Vec::new())) };
}

/// `dst[p * ld + j] = src[j * cs + p]` for `p < rows`, `j < cols`: the
/// `rows x cols` matrix whose columns are `cs` apart, copied row by row
/// with rows `ld` apart; 8x8 tiles, so both sides are read and written in
/// cache lines.
///
/// # Safety
/// `src` reaches `(cols - 1) * cs + rows` elements and `dst` holds
/// `(rows - 1) * ld + cols`.
unsafe fn transpose_into(
    src: *const f32,
    cs: isize,
    rows: usize,
    cols: usize,
    dst: *mut f32,
    ld: usize,
) {
    const T: usize = 8;
    let (cb, rb) = (cols / T * T, rows / T * T);
    let cs = cs as usize;
    // SAFETY (every access): within the bounds of the contract above.
    unsafe {
        for j0 in (0..cb).step_by(T) {
            for p0 in (0..rb).step_by(T) {
                let mut t = [[0f32; T]; T];
                for (r, row) in t.iter_mut().enumerate() {
                    let s = src.add((j0 + r) * cs + p0);
                    for (q, v) in row.iter_mut().enumerate() {
                        *v = *s.add(q);
                    }
                }
                for q in 0..T {
                    let d = dst.add((p0 + q) * ld + j0);
                    for (r, row) in t.iter().enumerate() {
                        *d.add(r) = row[q];
                    }
                }
            }
            for p in rb..rows {
                for r in 0..T {
                    *dst.add(p * ld + j0 + r) = *src.add((j0 + r) * cs + p);
                }
            }
        }
        for j in cb..cols {
            for p in 0..rows {
                *dst.add(p * ld + j) = *src.add(j * cs + p);
            }
        }
    }
}

/// One past the last index a `rows x cols` matrix with strides `s` reaches.
pub(crate) fn reach(rows: usize, cols: usize, s: (usize, usize)) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * s.0 + (cols - 1) * s.1 + 1
    }
}

/// Products of at least this many multiply-adds are split across the pool
/// (the conv kernels' threshold for the same hand-off; not re-tuned, see
/// BENCHMARKS.md "GEMM (issue 14)").
pub(crate) const PAR_MACS: usize = 1 << 20;

/// C's buffer for a product: its first element and how many it holds
/// (initialised, or, for a product with beta 0, to be written by it).
#[derive(Clone, Copy)]
struct CBuf<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> CBuf<T> {
    fn of(c: &mut [T]) -> Self {
        CBuf {
            ptr: c.as_mut_ptr(),
            len: c.len(),
        }
    }
}

/// C (m x n, strides sc) = alpha * A (m x k, strides sa) * B (k x n,
/// strides sb) + beta * C, on the calling thread.
///
/// Panics (a bug in the calling kernel, caught per op by `Net::run`) if an
/// operand is shorter than its strides reach.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Float>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: &[T],
    sa: (usize, usize),
    b: &[T],
    sb: (usize, usize),
    beta: T,
    c: &mut [T],
    sc: (usize, usize),
) {
    // SAFETY: C is a live mutable slice (initialised, aliasing neither A
    // nor B).
    unsafe { gemm_at(m, k, n, alpha, a, sa, b, sb, beta, CBuf::of(c), sc) }
}

/// [`gemm`] into `c`.
///
/// # Safety
/// `c` is `c.len` live elements aliasing neither A nor B, initialised
/// unless beta is 0 (the product does not read C then).
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_at<T: Float>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: &[T],
    sa: (usize, usize),
    b: &[T],
    sb: (usize, usize),
    beta: T,
    c: CBuf<T>,
    sc: (usize, usize),
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(c.len >= reach(m, n, sc), "gemm: C is too short");
    if k == 0 {
        // Empty sum: C = beta * C (not read when beta is 0).
        for i in 0..m {
            for j in 0..n {
                // SAFETY: within C's reach (asserted above).
                unsafe {
                    let v = c.ptr.add(i * sc.0 + j * sc.1);
                    v.write(if beta == T::ZERO {
                        T::ZERO
                    } else {
                        v.read() * beta
                    });
                }
            }
        }
        return;
    }
    assert!(
        a.len() >= reach(m, k, sa) && b.len() >= reach(k, n, sb),
        "gemm: an operand is too short"
    );
    let is = |s: (usize, usize)| (s.0 as isize, s.1 as isize);
    // SAFETY: the asserts bound every index the strides reach; C aliases
    // neither A nor B (the caller's contract).
    unsafe {
        raw(
            kernel::<T>(m, k, n, sa, sb),
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            is(sa),
            b.as_ptr(),
            is(sb),
            beta,
            c.ptr,
            is(sc),
        )
    }
}

/// [`product`] with beta 0 into a row-major `m x n` C that need not be
/// initialised: every element of `c` is written (for [`crate::tensor::written_vec`]).
///
/// Panics if `c` does not hold exactly `m * n` elements.
#[allow(clippy::too_many_arguments)]
pub(crate) fn product_uninit<T: Float>(
    split: bool,
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    sa: (usize, usize),
    b: &[T],
    sb: (usize, usize),
    c: &mut [std::mem::MaybeUninit<T>],
) {
    assert_eq!(Some(c.len()), m.checked_mul(n), "gemm: C is not m x n");
    let c = CBuf {
        ptr: c.as_mut_ptr().cast::<T>(),
        len: c.len(),
    };
    // SAFETY: `c` is a live mutable buffer (aliasing neither A nor B);
    // beta 0, so it is written, never read: by the kernels (each writes
    // every element of its C), or by the empty sum's zeros when k is 0.
    unsafe {
        if split {
            par_gemm_at(m, k, n, T::ONE, a, sa, b, sb, T::ZERO, c, (n, 1))
        } else {
            gemm_at(m, k, n, T::ONE, a, sa, b, sb, T::ZERO, c, (n, 1))
        }
    }
}

/// C (m x n, strides sc) = A (m x k, strides sa) * B (k x n, strides
/// sb) plus beta * C: the product every kernel calls. Split across the kernel
/// pool by [`par_gemm`] when `split` (the caller's pool is otherwise idle)
/// and the product is large, else [`gemm`] on the calling thread.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn product<T: Float>(
    split: bool,
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    sa: (usize, usize),
    b: &[T],
    sb: (usize, usize),
    beta: T,
    c: &mut [T],
    sc: (usize, usize),
) {
    if split {
        par_gemm(m, k, n, T::ONE, a, sa, b, sb, beta, c, sc)
    } else {
        gemm(m, k, n, T::ONE, a, sa, b, sb, beta, c, sc)
    }
}

/// C's base pointer, shared by the blocks of one split product (each
/// writes a disjoint set of C's elements).
#[derive(Clone, Copy)]
struct CPtr<T>(*mut T);
// SAFETY: the blocks that share it write disjoint elements (see `par_gemm`).
unsafe impl<T: Send> Send for CPtr<T> {}
unsafe impl<T: Send> Sync for CPtr<T> {}

impl<T> CPtr<T> {
    /// The pointer (a method, so that closures capture the whole `CPtr`).
    fn get(self) -> *mut T {
        self.0
    }
}

/// Callers inside [`par_gemm`] now, on any thread: each runs its own
/// product's chunks, so a split borrows only the pool threads that no other
/// caller stands for (several plan instances multiplying at once keep to
/// one thread each, as before the split).
static CALLERS: AtomicUsize = AtomicUsize::new(0);

/// Counts a caller in [`CALLERS`] while it lives.
struct Caller;
impl Caller {
    /// Enters as the caller of an `m x k x n` product, returning how many
    /// pool threads may help it now (see [`helpers`]).
    fn enter(m: usize, k: usize, n: usize) -> (Caller, usize) {
        let callers = CALLERS.fetch_add(1, Ordering::AcqRel) + 1;
        let threads = if crate::threads::pool_available() {
            rayon::current_num_threads()
        } else {
            1
        };
        (Caller, helpers(m, k, n, threads, callers))
    }
}
impl Drop for Caller {
    fn drop(&mut self) {
        CALLERS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many pool threads may help one `m x k x n` product whose caller
/// finds `callers` callers (itself included) in [`par_gemm`], on a pool of
/// `threads`: none below [`PAR_MACS`], else one fewer than the pool's
/// threads less the other callers (the caller works too), so the threads
/// multiplying stay within the pool's size.
fn helpers(m: usize, k: usize, n: usize, threads: usize, callers: usize) -> usize {
    if m.saturating_mul(k).saturating_mul(n) < PAR_MACS || m.max(n) < 2 * CHUNK {
        return 0;
    }
    threads.saturating_sub(callers)
}

/// A product is split only if C has at least twice this many rows or
/// columns.
const CHUNK: usize = 24;

/// The shared state of one split product: its operands as raw pointers,
/// and counters of the chunks claimed and done.
struct Split<T> {
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    beta: T,
    a: *const T,
    sa: (isize, isize),
    b: *const T,
    sb: (isize, isize),
    c: *mut T,
    sc: (isize, isize),
    /// The kernel of every chunk, chosen for the whole product.
    kernel: Kernel,
    /// B packed for `panel` ([`PackedB`]), or null: chunks pack their own.
    packed: *const f32,
    by_rows: bool,
    len: usize,
    /// Chunk boundaries are multiples of this (but the last).
    unit: usize,
    chunks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// The caller, woken when the last chunk is done.
    caller: std::thread::Thread,
}
// SAFETY: A and B are only read; each chunk writes its own rows (columns)
// of C, claimed by exactly one thread (`next`); the caller does not return
// (nor free the buffers) before every chunk is done, and a helper that
// starts later claims no chunk, so it touches only the counters.
unsafe impl<T: Send> Send for Split<T> {}
unsafe impl<T: Send> Sync for Split<T> {}

/// The B of a split product: in memory with its strides, or already
/// packed for `panel` ([`PackedB`]).
#[derive(Clone, Copy)]
enum BSource<'a, T> {
    Strided(&'a [T], (usize, usize)),
    Packed(*const f32),
}

impl<T: Float> Split<T> {
    /// The split of a product for `workers` threads (see [`plan`]); the
    /// operands were checked by the caller (`par_gemm`), which must keep
    /// them alive until every chunk is done.
    #[allow(clippy::too_many_arguments)]
    fn new(
        m: usize,
        k: usize,
        n: usize,
        alpha: T,
        a: &[T],
        sa: (usize, usize),
        b: BSource<'_, T>,
        beta: T,
        c: CBuf<T>,
        sc: (usize, usize),
        workers: usize,
    ) -> Self {
        let (b, sb, packed) = match b {
            BSource::Strided(b, sb) => (b.as_ptr(), sb, std::ptr::null()),
            BSource::Packed(p) => (std::ptr::null(), (0, 0), p),
        };
        let kernel = if packed.is_null() {
            kernel::<T>(m, k, n, sa, sb)
        } else {
            Kernel::Panel
        };
        let (by_rows, unit, chunks) = match kernel {
            // A few rows: chunks of C's columns (of B's rows, for `Dot`),
            // four per thread; each element's bits do not depend on the
            // columns computed with it (see `thin`).
            Kernel::Dot | Kernel::Axpy => (false, 16, (4 * workers).min(n / 16).max(1)),
            // By panels: a chunk packs (or reads) only its own columns.
            // Packing its own, two per thread, so a helper that wakes late
            // still finds work; packed once (a recurrent step's weight,
            // multiplied at every step), one per thread: the caller claims
            // the first chunk at once, so each thread tends to multiply the
            // same columns of B at every step, which then stay in its
            // core's cache between steps.
            Kernel::Panel => {
                let per = if packed.is_null() { 2 } else { 1 };
                (false, panel::NR, (per * workers).min(n / panel::NR).max(1))
            }
            _ => plan(m, n, sa, sb, kernel == Kernel::Small, workers),
        };
        let len = if by_rows { m } else { n };
        let is = |s: (usize, usize)| (s.0 as isize, s.1 as isize);
        Split {
            m,
            k,
            n,
            alpha,
            beta,
            a: a.as_ptr(),
            sa: is(sa),
            b,
            sb: is(sb),
            c: c.ptr,
            sc: is(sc),
            kernel,
            packed,
            by_rows,
            len,
            unit,
            chunks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            caller: std::thread::current(),
        }
    }

    /// Claims and runs chunks until none is left.
    ///
    /// # Safety
    /// The buffers are alive and in bounds for every chunk not yet done
    /// (the caller of `par_gemm` waits for them).
    unsafe fn work(&self) -> bool {
        let mut ran = false;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.chunks {
                return ran;
            }
            ran = true;
            let at = |i| bound(i, self.len, self.chunks, self.unit);
            let (lo, hi) = (at(i), at(i + 1));
            let off = |s: (isize, isize)| {
                if self.by_rows {
                    lo as isize * s.0
                } else {
                    lo as isize * s.1
                }
            };
            // SAFETY: chunk i reads rows (columns) lo..hi of A (B), all of
            // B (A), and writes only rows (columns) lo..hi of C, claimed by
            // this thread alone; bounds were checked by `par_gemm`.
            unsafe {
                if !self.packed.is_null() {
                    // Columns lo..hi of the packed B start at panel lo / NR.
                    panel::run(
                        self.m,
                        self.k,
                        hi - lo,
                        self.alpha.to_f32(),
                        self.a.cast::<f32>(),
                        self.sa,
                        self.packed.add(lo * self.k),
                        self.beta.to_f32(),
                        self.c.offset(off(self.sc)).cast::<f32>(),
                        self.sc,
                    )
                } else if self.by_rows {
                    raw(
                        self.kernel,
                        hi - lo,
                        self.k,
                        self.n,
                        self.alpha,
                        self.a.offset(off(self.sa)),
                        self.sa,
                        self.b,
                        self.sb,
                        self.beta,
                        self.c.offset(off(self.sc)),
                        self.sc,
                    )
                } else {
                    raw(
                        self.kernel,
                        self.m,
                        self.k,
                        hi - lo,
                        self.alpha,
                        self.a,
                        self.sa,
                        self.b.offset(off(self.sb)),
                        self.sb,
                        self.beta,
                        self.c.offset(off(self.sc)),
                        self.sc,
                    )
                }
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.chunks {
                self.caller.unpark();
            }
        }
    }
}

impl<T: Float> crate::threads::Pieces for Split<T> {
    fn run(&self) -> bool {
        // SAFETY: `run_split` returns only when every chunk is done, and a
        // thread that comes later claims none (see `Split`).
        unsafe { self.work() }
    }

    fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.chunks
    }
}

/// How a split `m x n` product (B's strides `sb`, on the small kernel if
/// `small`) is cut for `workers` threads (the caller and its helpers):
/// whether by C's rows, the unit chunk boundaries are multiples of, and
/// how many chunks (see [`bound`]).
fn plan(
    m: usize,
    n: usize,
    sa: (usize, usize),
    sb: (usize, usize),
    small: bool,
    workers: usize,
) -> (bool, usize, usize) {
    if small && n >= 2 * small::STRIP * workers {
        // The small kernel by C's column strips (16 wide): a chunk copies
        // only its own strips of B, if any (a strip it cannot read in
        // place), and reads A in place, so no operand is copied twice
        // however many chunks there are; about four chunks per thread, so
        // that a helper that wakes late still finds work and the threads
        // finish together. (Row chunks sharing one packed copy of B, made
        // strip by strip by whichever chunk needed it first, measured
        // slower: BENCHMARKS.md "Shared operands and balanced chunks".)
        (false, small::STRIP, (4 * workers).min(n / small::STRIP))
    } else {
        // C's rows (or columns, when C is wider than tall): four chunks
        // per thread where the kernel reads the other operand in place,
        // one per thread where it would copy it again for each chunk
        // (the `gemm` crate packs its operands on every call); chunk
        // boundaries on the kernel's tile (small: 6 rows; 16 for both
        // kernels' columns and the crate's rows, its AVX-512 tile).
        // C's rows when it is at least as tall as wide, but on the crate
        // with A transposed (columns contiguous: the weight gradient
        // dY^T X of FC), which it reads in place: two threads each
        // multiplying half of A's rows took as long as one thread doing it
        // all (1024 x 1600 x 256: 3.6-4.9 ms against 4.7), while halves of
        // C's columns took 2.3-2.6 ms (BENCHMARKS.md "FC's weight gradient
        // on two threads").
        let a_transposed = sa.0 == 1 && sa.1 > 1;
        let by_rows = m >= n && !(!small && a_transposed && n >= 64 * workers);
        let len = if by_rows { m } else { n };
        let in_place = small && (!by_rows || small::reads_b_in_place(sb));
        let unit = if by_rows && small { 6 } else { 16 };
        let per = if in_place { 4 } else { 1 };
        (by_rows, unit, (per * workers).min(len / unit).max(1))
    }
}

/// Where chunk `i` of `chunks` over `len` rows (columns) starts: `i /
/// chunks` of the way, rounded down to a multiple of `unit`, so chunks
/// differ by less than two units (a fixed chunk length rounded up would leave
/// one thread `len / 2 + unit` of `len`: 144 of 256 rows at 256^3). With
/// `chunks <= len / unit`, none is empty.
fn bound(i: usize, len: usize, chunks: usize, unit: usize) -> usize {
    if i >= chunks {
        len
    } else {
        i * len / chunks / unit * unit
    }
}

/// [`gemm`], split across the kernel pool when the product is large enough
/// and the pool has threads no other caller stands for: C's rows (or
/// columns, when C is wider than tall) are cut into chunks; the caller
/// hands the product to the helpers (`rayon::spawn`, which wakes sleeping
/// pool threads) and claims chunks itself at once, so a helper that wakes
/// late only takes fewer chunks (the product never waits for a pool thread
/// to wake, which takes longer than a small product on a VM); then it waits
/// for the chunks still running (spinning briefly, when another CPU can run
/// them, then parked).
#[allow(clippy::too_many_arguments)]
pub(crate) fn par_gemm<T: Float>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: &[T],
    sa: (usize, usize),
    b: &[T],
    sb: (usize, usize),
    beta: T,
    c: &mut [T],
    sc: (usize, usize),
) {
    // SAFETY: C is a live mutable slice (initialised, aliasing neither A
    // nor B).
    unsafe { par_gemm_at(m, k, n, alpha, a, sa, b, sb, beta, CBuf::of(c), sc) }
}

/// [`par_gemm`] into `c`.
///
/// # Safety
/// As [`gemm_at`].
#[allow(clippy::too_many_arguments)]
unsafe fn par_gemm_at<T: Float>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: &[T],
    sa: (usize, usize),
    b: &[T],
    sb: (usize, usize),
    beta: T,
    c: CBuf<T>,
    sc: (usize, usize),
) {
    if m == 0 || n == 0 || k == 0 || m.saturating_mul(k).saturating_mul(n) < PAR_MACS {
        // SAFETY: the caller's contract.
        return unsafe { gemm_at(m, k, n, alpha, a, sa, b, sb, beta, c, sc) };
    }
    let (_caller, helpers) = Caller::enter(m, k, n);
    // The chunks write disjoint elements only if C's strides map distinct
    // (row, column) pairs to distinct indices: row- or column-major.
    let distinct = (sc.1 >= 1 && sc.0 >= n * sc.1) || (sc.0 >= 1 && sc.1 >= m * sc.0);
    // A chunk on the `gemm` crate must not fall to one of its dot-product
    // kernels (C of at most 256 elements, or one row) unless the whole
    // product would, or its sums would run in another order: both sides of
    // C above 16, so every chunk (at least 16 rows or columns) has more.
    let on_crate = T::DTYPE == DataType::Float && kernel::<T>(m, k, n, sa, sb) == Kernel::Packed;
    let crate_shape_ok = !on_crate || m.min(n) > 16;
    if helpers == 0 || !distinct || !crate_shape_ok {
        // SAFETY: the caller's contract.
        return unsafe { gemm_at(m, k, n, alpha, a, sa, b, sb, beta, c, sc) };
    }
    assert!(
        c.len >= reach(m, n, sc) && a.len() >= reach(m, k, sa) && b.len() >= reach(k, n, sb),
        "gemm: an operand is too short"
    );
    let b = BSource::Strided(b, sb);
    let split = Split::new(m, k, n, alpha, a, sa, b, beta, c, sc, helpers + 1);
    // SAFETY: the caller's contract; the bounds asserted above.
    unsafe { run_split(split, helpers) }
}

/// [`par_gemm_at`] for float32 with B packed for `panel` at `bp` (see
/// [`product_packed_uninit`]), C row-major; split across the pool only if
/// `split`.
///
/// # Safety
/// As [`gemm_at`]; `bp` holds B packed for `k x n`; `T` is float32 and
/// `panel::available()`.
#[allow(clippy::too_many_arguments)]
unsafe fn par_gemm_packed<T: Float>(
    split: bool,
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: &[T],
    sa: (usize, usize),
    bp: *const f32,
    beta: T,
    c: CBuf<T>,
    sc: (usize, usize),
) {
    let is = |s: (usize, usize)| (s.0 as isize, s.1 as isize);
    let whole = || {
        // SAFETY: the caller's contract.
        unsafe {
            panel::run(
                m,
                k,
                n,
                alpha.to_f32(),
                a.as_ptr().cast::<f32>(),
                is(sa),
                bp,
                beta.to_f32(),
                c.ptr.cast::<f32>(),
                is(sc),
            )
        }
    };
    if !split {
        return whole();
    }
    let (_caller, helpers) = Caller::enter(m, k, n);
    if helpers == 0 || n < 2 * panel::NR {
        return whole();
    }
    let b = BSource::Packed(bp);
    let split = Split::new(m, k, n, alpha, a, sa, b, beta, c, sc, helpers + 1);
    // SAFETY: the caller's contract.
    unsafe { run_split(split, helpers) }
}

/// Runs a split product's chunks on the caller and up to `helpers` pool
/// threads (see `threads::share`), returning when every chunk is done.
///
/// # Safety
/// The split's buffers are alive and in bounds for every chunk.
unsafe fn run_split<T: Float>(split: Split<T>, helpers: usize) {
    let chunks = split.chunks;
    // SAFETY: the caller's contract.
    unsafe { crate::threads::share(std::sync::Arc::new(split), chunks, helpers) }
}

/// C (`m x n`, row-major with row stride `n`) = A (`m x k`, strides `sa`)
/// times a B that is made one column block at a time: for each block
/// `[c0, c1)` of `bounds`, `fill(c0, c1, buf)` writes B's columns `c0..c1`
/// as a row-major `k x (c1 - c0)` matrix into `buf` (a scratch buffer of
/// each pool thread, from `scratch`), and the block's product goes to C's
/// columns `c0..c1`. The blocks run on the kernel pool: the making of B
/// (an im2col) is split with the product, which a single large product
/// split by [`par_gemm`] cannot do. C is overwritten (beta 0).
#[allow(clippy::too_many_arguments)]
pub(crate) fn par_column_blocks<T: Float>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    zero: T,
    a: &[T],
    sa: (usize, usize),
    bounds: &[(usize, usize)],
    scratch: impl Fn() -> Vec<T> + Sync + Send,
    fill: impl Fn(usize, usize, &mut [T]) + Sync + Send,
    c: &mut [T],
) {
    assert!(
        c.len() >= reach(m, n, (n, 1)) && a.len() >= reach(m, k, sa),
        "par_column_blocks: an operand is too short"
    );
    assert!(
        bounds.iter().all(|&(c0, c1)| c0 <= c1 && c1 <= n),
        "par_column_blocks: a block outside C"
    );
    // Blocks must not overlap: each writes its own columns of C.
    let mut sorted = bounds.to_vec();
    sorted.sort_unstable();
    assert!(
        sorted.windows(2).all(|w| w[0].1 <= w[1].0),
        "par_column_blocks: overlapping blocks"
    );
    let cp = CPtr(c.as_mut_ptr());
    let is = |s: (usize, usize)| (s.0 as isize, s.1 as isize);
    bounds.par_iter().for_each_init(scratch, |buf, &(c0, c1)| {
        let nc = c1 - c0;
        if nc == 0 || m == 0 {
            return;
        }
        if buf.len() < k * nc {
            buf.resize(k * nc, zero);
        }
        fill(c0, c1, &mut buf[..k * nc]);
        // SAFETY: the asserts above bound A and C (rows < m, columns
        // c0..c1 <= n, row stride n); B is this thread's `k x nc` buffer;
        // blocks do not overlap, so no two threads write one element of C,
        // and C (a mutable slice) aliases neither A nor a scratch buffer.
        unsafe {
            raw(
                kernel::<T>(m, k, nc, sa, (nc, 1)),
                m,
                k,
                nc,
                alpha,
                a.as_ptr(),
                is(sa),
                buf.as_ptr(),
                (nc as isize, 1),
                zero,
                cp.get().add(c0),
                (n as isize, 1),
            )
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook triple loop.
    fn naive(m: usize, k: usize, n: usize, a: &[f64], b: &[f64]) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn split_products_match_the_triple_loop() {
        // Tall, wide, odd sizes, each above the split threshold.
        for &(m, k, n) in &[
            (300, 70, 61),
            (33, 90, 517),
            (129, 128, 127),
            (8, 200, 1000),
        ] {
            let a: Vec<f64> = (0..m * k).map(|i| ((i * 7 % 13) as f64) - 6.0).collect();
            let b: Vec<f64> = (0..k * n).map(|i| ((i * 5 % 11) as f64) - 5.0).collect();
            let want = naive(m, k, n, &a, &b);
            let mut c = vec![1.0; m * n];
            par_gemm(m, k, n, 1.0, &a, (k, 1), &b, (n, 1), 0.0, &mut c, (n, 1));
            assert_eq!(c, want, "{m}x{k}x{n}");
            // Column-major C, beta = 1 accumulates.
            let mut ct = vec![0.0; m * n];
            par_gemm(m, k, n, 1.0, &a, (k, 1), &b, (n, 1), 1.0, &mut ct, (1, m));
            par_gemm(m, k, n, 1.0, &a, (k, 1), &b, (n, 1), 1.0, &mut ct, (1, m));
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(ct[j * m + i], 2.0 * want[i * n + j]);
                }
            }
        }
    }

    /// C = alpha op(A) op(B) + beta C0 by the triple loop, in f64 (exact
    /// for the small integers used here), with A stored `m x k` (or `k x m`
    /// when `ta`), B `k x n` (or `n x k` when `tb`).
    #[allow(clippy::too_many_arguments)]
    fn reference(
        ta: bool,
        tb: bool,
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: &[f32],
        b: &[f32],
        beta: f32,
        c0: &[f32],
    ) -> Vec<f32> {
        let at = |i: usize, p: usize| f64::from(if ta { a[p * m + i] } else { a[i * k + p] });
        let bt = |p: usize, j: usize| f64::from(if tb { b[j * k + p] } else { b[p * n + j] });
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                c[i * n + j] =
                    (f64::from(alpha) * s + f64::from(beta) * f64::from(c0[i * n + j])) as f32;
            }
        }
        c
    }

    /// float32 through `gemm` (the small kernel where the CPU runs it, else
    /// the `gemm` crate) against the triple loop: odd sizes, either operand
    /// transposed, C row-major, column-major or padded, alpha and beta.
    fn check_f32(m: usize, k: usize, n: usize) {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32) - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32) - 5.0).collect();
        let c0: Vec<f32> = (0..m * n).map(|i| ((i * 3 % 7) as f32) - 3.0).collect();
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let sa = if ta { (1, m) } else { (k, 1) };
            let sb = if tb { (1, k) } else { (n, 1) };
            // beta 0 must not read C: start from NaN.
            let want = reference(ta, tb, m, k, n, 1.0, &a, &b, 0.0, &c0);
            let mut c = vec![f32::NAN; m * n];
            gemm(m, k, n, 1.0, &a, sa, &b, sb, 0.0, &mut c, (n, 1));
            assert_eq!(c, want, "{m}x{k}x{n} ta {ta} tb {tb}");
            // alpha 2, beta -1 on a column-major C.
            let want = reference(ta, tb, m, k, n, 2.0, &a, &b, -1.0, &c0);
            let mut ct = vec![0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    ct[j * m + i] = c0[i * n + j];
                }
            }
            gemm(m, k, n, 2.0, &a, sa, &b, sb, -1.0, &mut ct, (1, m));
            for i in 0..m {
                for j in 0..n {
                    assert_eq!(
                        ct[j * m + i],
                        want[i * n + j],
                        "{m}x{k}x{n} col-major ({i}, {j})"
                    );
                }
            }
            // A row-major C with 3 spare columns, which must stay untouched.
            let ld = n + 3;
            let mut cp = vec![7f32; m * ld];
            for i in 0..m {
                cp[i * ld..i * ld + n].copy_from_slice(&c0[i * n..(i + 1) * n]);
            }
            gemm(m, k, n, 2.0, &a, sa, &b, sb, -1.0, &mut cp, (ld, 1));
            for i in 0..m {
                assert_eq!(
                    &cp[i * ld..i * ld + n],
                    &want[i * n..(i + 1) * n],
                    "{m}x{k}x{n} padded"
                );
                assert_eq!(
                    &cp[i * ld + n..(i + 1) * ld],
                    &[7.0; 3],
                    "{m}x{k}x{n} padding"
                );
            }
        }
    }

    #[test]
    fn f32_small_and_odd_products_match_the_triple_loop() {
        for m in [1, 2, 5, 6, 7, 8, 13, 14] {
            for n in [1, 3, 8, 9, 10, 15, 16, 17, 24, 33] {
                for k in [1, 2, 7, 16] {
                    check_f32(m, k, n);
                }
            }
        }
    }

    #[test]
    fn f32_thin_and_mlp_shapes_match_the_triple_loop() {
        // The MLP's shapes (issue 14's benchmark), thin C, a deep k, and B
        // rows too far apart to be read in place (n > 128).
        for &(m, k, n) in &[
            (256, 128, 10),
            (64, 64, 128),
            (128, 256, 64),
            (64, 64, 64),
            (37, 300, 10),
            (300, 37, 5),
            (9, 20, 200),
            (70, 33, 129),
        ] {
            check_f32(m, k, n);
        }
    }

    #[test]
    fn f32_thin_products_match_the_triple_loop() {
        // At most `thin::ROWS` rows (and 5, past them): k and n not
        // multiples of the vector width, n past `thin::BLOCK`, every
        // transposition, alpha and beta, C row-major, column-major, padded.
        for m in [1, 2, 3, 4, 5] {
            for &(k, n) in &[(1, 5), (9, 3), (8, 1), (31, 17), (100, 530), (257, 1030)] {
                check_f32(m, k, n);
            }
        }
    }

    #[test]
    fn thin_products_run_on_the_thin_kernels() {
        let on = small::available();
        let want = |k| if on { k } else { Kernel::Packed };
        // FC at batch 1 and 4 (W transposed), its dX (W plain).
        let (k, n) = (25088, 4096);
        assert_eq!(kernel::<f32>(1, k, n, (k, 1), (1, k)), want(Kernel::Dot));
        assert_eq!(kernel::<f32>(4, k, n, (k, 1), (1, k)), want(Kernel::Dot));
        assert_eq!(kernel::<f32>(1, n, k, (n, 1), (k, 1)), want(Kernel::Axpy));
        // A transposed: `Axpy` reads it in place; with B transposed too,
        // neither layout (more than one row).
        assert_eq!(
            kernel::<f32>(3, 64, 64, (1, 3), (64, 1)),
            want(Kernel::Axpy)
        );
        assert_eq!(
            kernel::<f32>(3, 64, 64, (1, 3), (1, 64)),
            want(Kernel::Small)
        );
        // Five rows over a transposed B with a deep K: `small` (the crate
        // reads such a B across its rows); float64: `matrixmultiply`.
        assert_eq!(kernel::<f32>(5, k, n, (k, 1), (1, k)), want(Kernel::Small));
        assert_eq!(kernel::<f64>(1, k, n, (k, 1), (1, k)), Kernel::Packed);
    }

    #[test]
    fn f32_thin_split_products_equal_one_thread_bitwise() {
        // Fractional values: the chunks of a split thin product (by C's
        // columns, any boundaries) give the bits of the whole product.
        let (k, n) = (300, 1100);
        for m in 1..=thin::ROWS {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32) / 97.0 - 0.5)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 103) as f32) / 89.0 - 0.5)
                .collect();
            for (sb, sc) in [
                ((n, 1), (n, 1)),
                ((1, k), (n, 1)),
                ((1, k), (1, m)),
                ((n, 1), (1, m)),
            ] {
                let c0: Vec<f32> = (0..m * n).map(|i| (i % 7) as f32 / 3.0).collect();
                let mut one = c0.clone();
                gemm(m, k, n, 1.5, &a, (k, 1), &b, sb, 0.5, &mut one, sc);
                let mut split = c0.clone();
                par_gemm(m, k, n, 1.5, &a, (k, 1), &b, sb, 0.5, &mut split, sc);
                let same = |x: &[f32]| one.iter().zip(x).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same(&split), "{m}x{k}x{n} sb {sb:?} sc {sc:?}");
                for workers in [2, 3, 5] {
                    let mut chunked = c0.clone();
                    let s = Split::new(
                        m,
                        k,
                        n,
                        1.5,
                        &a,
                        (k, 1),
                        BSource::Strided(&b, sb),
                        0.5,
                        CBuf::of(&mut chunked),
                        sc,
                        workers,
                    );
                    assert!(!s.by_rows);
                    // SAFETY: the operands outlive `s`, run on this thread.
                    assert!(unsafe { s.work() });
                    assert!(
                        same(&chunked),
                        "{m}x{k}x{n} sb {sb:?} sc {sc:?} for {workers}"
                    );
                }
                // And right, loosely, against f64.
                for &(i, j) in &[(0, 0), (m - 1, n - 1), (m / 2, n / 3), (0, 517)] {
                    let s: f64 = (0..k)
                        .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * sb.0 + j * sb.1]))
                        .sum();
                    let want = 1.5 * s + 0.5 * f64::from(c0[i * sc.0 + j * sc.1]);
                    let got = f64::from(split[i * sc.0 + j * sc.1]);
                    assert!(
                        (got - want).abs() < 1e-3,
                        "{m}x{k}x{n} ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn f32_split_products_match_the_triple_loop() {
        // Blocks of a split float32 product run on the small kernel.
        for &(m, k, n) in &[(300, 70, 61), (33, 90, 517), (4000, 300, 10)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32) - 6.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32) - 5.0).collect();
            let want = reference(false, false, m, k, n, 1.0, &a, &b, 0.0, &vec![0.0; m * n]);
            let mut c = vec![f32::NAN; m * n];
            par_gemm(m, k, n, 1.0, &a, (k, 1), &b, (n, 1), 0.0, &mut c, (n, 1));
            assert_eq!(c, want, "{m}x{k}x{n}");
        }
    }

    #[test]
    fn f32_split_products_equal_one_thread_bitwise() {
        // Fractional values (rounding matters): a split product must give
        // the same bits as the whole product on the calling thread, for
        // B read in place, B wider than 128 columns, B transposed, a
        // column-major C, and A transposed (FC's weight gradient, split by
        // C's columns on the crate).
        for &(m, k, n) in &[
            (256, 64, 128),
            (256, 256, 256),
            (300, 70, 200),
            (130, 256, 190),
            (100, 40, 300),
            (1024, 300, 256),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32) / 97.0 - 0.5)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 103) as f32) / 89.0 - 0.5)
                .collect();
            for (sa, sb, sc) in [
                ((k, 1), (n, 1), (n, 1)),
                ((k, 1), (1, k), (n, 1)),
                ((k, 1), (n, 1), (1, m)),
                ((1, m), (n, 1), (n, 1)),
            ] {
                let c0: Vec<f32> = (0..m * n).map(|i| (i % 7) as f32 / 3.0).collect();
                let mut one = c0.clone();
                gemm(m, k, n, 1.5, &a, sa, &b, sb, 0.5, &mut one, sc);
                let mut split = c0.clone();
                par_gemm(m, k, n, 1.5, &a, sa, &b, sb, 0.5, &mut split, sc);
                // The chunks of a split for two and for three threads, all
                // run here (whether `par_gemm` split depends on the pool and
                // on the other tests running).
                for workers in [2, 3] {
                    let mut chunked = c0.clone();
                    let s = Split::new(
                        m,
                        k,
                        n,
                        1.5,
                        &a,
                        sa,
                        BSource::Strided(&b, sb),
                        0.5,
                        CBuf::of(&mut chunked),
                        sc,
                        workers,
                    );
                    if sa == (1, m) && m == 1024 {
                        assert!(!s.by_rows, "A transposed on the crate: by C's columns");
                    }
                    // SAFETY: the operands outlive `s`, run on this thread.
                    assert!(unsafe { s.work() });
                    assert_eq!(s.done.load(Ordering::Relaxed), s.chunks);
                    assert!(
                        one.iter()
                            .zip(&chunked)
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{m}x{k}x{n} sa {sa:?} sb {sb:?} sc {sc:?} chunked for {workers}"
                    );
                }
                assert!(
                    one.iter()
                        .zip(&split)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{m}x{k}x{n} sb {sb:?} sc {sc:?}"
                );
                // And right: against the triple loop in f64, loosely.
                let at = |i: usize, p: usize| f64::from(a[i * sa.0 + p * sa.1]);
                let bt = |p: usize, j: usize| f64::from(b[p * sb.0 + j * sb.1]);
                for &(i, j) in &[(0, 0), (m - 1, n - 1), (m / 2, n / 3), (7, n - 1)] {
                    let s: f64 = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                    let want = 1.5 * s + 0.5 * f64::from(c0[i * sc.0 + j * sc.1]);
                    let got = f64::from(split[i * sc.0 + j * sc.1]);
                    assert!(
                        (got - want).abs() < 1e-3,
                        "{m}x{k}x{n} ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn concurrent_split_products_match_the_triple_loop() {
        // Several callers at once (plan instances): each gets its own
        // product right, whichever chunks the pool's threads take.
        let (m, k, n) = (200, 90, 150);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32) - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32) - 5.0).collect();
        let want = reference(false, false, m, k, n, 1.0, &a, &b, 0.0, &vec![0.0; m * n]);
        std::thread::scope(|s| {
            for t in 0..4 {
                let (a, b, want) = (&a, &b, &want);
                s.spawn(move || {
                    for r in 0..20 {
                        let mut c = vec![f32::NAN; m * n];
                        if (t + r) % 2 == 0 {
                            par_gemm(m, k, n, 1.0, a, (k, 1), b, (n, 1), 0.0, &mut c, (n, 1));
                        } else {
                            // Column-major C: the split goes by columns.
                            par_gemm(n, k, m, 1.0, b, (1, n), a, (1, k), 0.0, &mut c, (m, 1));
                            let mut ct = vec![0f32; m * n];
                            for i in 0..m {
                                for j in 0..n {
                                    ct[i * n + j] = c[j * m + i];
                                }
                            }
                            c = ct;
                        }
                        assert_eq!(&c, want, "caller {t} run {r}");
                    }
                });
            }
        });
    }

    #[test]
    fn f32_empty_sum_scales_c() {
        let mut c = vec![2f32; 6];
        gemm(2, 0, 3, 1.0, &[], (0, 1), &[], (3, 1), 0.5, &mut c, (3, 1));
        assert_eq!(c, vec![1f32; 6]);
    }

    /// FC's operands with fractional values (rounding matters): X (m x k)
    /// and W (n x k), both row-major.
    fn fc_operands(m: usize, k: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let a = (0..m * k)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.37)
            .collect();
        let w = (0..n * k)
            .map(|i| ((i * 5 % 19) as f32 - 9.0) * 0.21)
            .collect();
        (a, w)
    }

    #[test]
    fn a_by_columns_gives_the_bits_of_the_transposed_product() {
        // `blocked` makes C = alpha A B + beta C, with A stored by columns
        // (FC's weight gradient dY^T X) and A's rows at least twice B's
        // columns, in a scratch C stored by columns: the same bits as the
        // transposed product C^T = B^T A^T asked for directly (which it
        // runs in place, having fewer rows than columns), and the values
        // of the f64 product; with beta zero (C not read) and not.
        for &(m, k, n) in &[(300, 600, 128), (256, 700, 100), (100, 300, 61), (33, 7, 5)] {
            // A^T (k x m) and B (k x n), both row-major.
            let (at, _) = fc_operands(k, m, 0);
            let (_, b) = fc_operands(0, k * n, 1);
            let c0: Vec<f32> = (0..m * n).map(|i| (i % 13) as f32 * 0.25 - 1.5).collect();
            for beta in [0f32, 0.5] {
                let mut c = c0.clone();
                let mut ct = vec![0f32; n * m];
                for i in 0..m {
                    for j in 0..n {
                        ct[j * m + i] = c0[i * n + j];
                    }
                }
                // C (m x n) = A B, or its transpose B^T A^T (n x m).
                let product = |rows: usize,
                               cols: usize,
                               a: &[f32],
                               sa,
                               b: &[f32],
                               sb,
                               c: &mut [f32]| unsafe {
                    blocked(
                        rows,
                        k,
                        cols,
                        1f32,
                        a.as_ptr(),
                        sa,
                        b.as_ptr(),
                        sb,
                        beta,
                        c.as_mut_ptr(),
                        (cols as isize, 1),
                    )
                };
                product(m, n, &at, (1, m as isize), &b, (n as isize, 1), &mut c);
                product(n, m, &b, (1, n as isize), &at, (m as isize, 1), &mut ct);
                for i in 0..m {
                    for j in 0..n {
                        let e: f64 = f64::from(beta) * f64::from(c0[i * n + j])
                            + (0..k)
                                .map(|p| f64::from(at[p * m + i]) * f64::from(b[p * n + j]))
                                .sum::<f64>();
                        let (x, y) = (c[i * n + j], ct[j * m + i]);
                        assert_eq!(
                            x.to_bits(),
                            y.to_bits(),
                            "{m}x{k}x{n} beta {beta} at ({i}, {j})"
                        );
                        assert!(
                            (f64::from(x) - e).abs() <= 1e-4 * (1.0 + e.abs()),
                            "{m}x{k}x{n} beta {beta}: {x} vs {e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_transposed_b_gives_the_bits_of_its_plain_layout() {
        // `blocked` copies a transposed B under few rows of A into B's
        // plain layout (padded rows, K in blocks of 512): same bits as the
        // crate on a plain B, and the values of the f64 product.
        for &(m, k, n) in &[
            (5, 7, 33),
            (32, 256, 1024),
            (32, 600, 40),
            (100, 300, 61),
            (129, 64, 64),
        ] {
            let (a, w) = fc_operands(m, k, n);
            let mut bt = vec![0f32; k * n];
            for j in 0..n {
                for p in 0..k {
                    bt[p * n + j] = w[j * k + p];
                }
            }
            let mut c_t = vec![f32::NAN; m * n];
            let mut c_p = vec![f32::NAN; m * n];
            unsafe {
                blocked(
                    m,
                    k,
                    n,
                    1f32,
                    a.as_ptr(),
                    (k as isize, 1),
                    w.as_ptr(),
                    (1, k as isize),
                    0f32,
                    c_t.as_mut_ptr(),
                    (n as isize, 1),
                );
                blocked(
                    m,
                    k,
                    n,
                    1f32,
                    a.as_ptr(),
                    (k as isize, 1),
                    bt.as_ptr(),
                    (n as isize, 1),
                    0f32,
                    c_p.as_mut_ptr(),
                    (n as isize, 1),
                );
            }
            for i in 0..m {
                for j in 0..n {
                    let e: f64 = (0..k)
                        .map(|p| f64::from(a[i * k + p]) * f64::from(w[j * k + p]))
                        .sum();
                    let (t, p) = (c_t[i * n + j], c_p[i * n + j]);
                    assert_eq!(t.to_bits(), p.to_bits(), "{m}x{k}x{n} at ({i}, {j})");
                    assert!(
                        (f64::from(t) - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{m}x{k}x{n}: {t} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn panel_products_match_the_triple_loop_and_their_packed_twin_bitwise() {
        // FC's shapes at 9 to 64 rows over a transposed B run on `panel`
        // where the CPU has AVX-512F: their values against the triple loop
        // (`check_f32`: alpha, beta, C's layouts), and packing at each
        // call, split across the pool or not, or from a B packed once,
        // the same bits.
        if !panel::available() {
            eprintln!("no AVX-512F: the panel kernel is not used on this CPU");
            return;
        }
        for &(m, k, n) in &[
            (9, 64, 32),
            (16, 33, 47),
            (32, 256, 1024),
            (32, 1024, 256),
            (41, 300, 96),
            (64, 128, 100),
            (17, 2000, 40),
        ] {
            let (sa, sb) = ((k, 1), (1, k));
            assert_eq!(kernel::<f32>(m, k, n, sa, sb), Kernel::Panel, "{m}x{k}x{n}");
            check_f32(m, k, n);
            let (a, w) = fc_operands(m, k, n);
            let mut one = vec![f32::NAN; m * n];
            gemm(m, k, n, 1.0, &a, sa, &w, sb, 0.0, &mut one, (n, 1));
            let mut split = vec![f32::NAN; m * n];
            par_gemm(m, k, n, 1.0, &a, sa, &w, sb, 0.0, &mut split, (n, 1));
            let packed = PackedB::for_product::<f32>(m, k, n, sa, &w, sb)
                .expect("memory")
                .expect("packs for panel");
            let mut from_packed = vec![std::mem::MaybeUninit::<f32>::uninit(); m * n];
            product_packed_uninit(true, m, k, n, &a, sa, &packed, &mut from_packed);
            // SAFETY: the product wrote every element.
            let from_packed: Vec<f32> = from_packed
                .iter()
                .map(|v| unsafe { v.assume_init() })
                .collect();
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&split), bits(&one), "{m}x{k}x{n} split");
            assert_eq!(bits(&from_packed), bits(&one), "{m}x{k}x{n} packed once");
            // The chunks of splits for two and three threads, packing
            // their own panels or reading the packed B, all run here
            // (whether the calls above split depends on the pool).
            for workers in [2, 3] {
                for b in [
                    BSource::Strided(&w, sb),
                    BSource::Packed(packed.data.as_ptr()),
                ] {
                    let mut chunked = vec![f32::NAN; m * n];
                    let c = CBuf::of(&mut chunked);
                    let s = Split::new(m, k, n, 1.0, &a, sa, b, 0.0, c, (n, 1), workers);
                    assert_eq!(s.kernel, Kernel::Panel);
                    // SAFETY: the operands outlive `s`, run on this thread.
                    assert!(unsafe { s.work() });
                    assert_eq!(s.done.load(Ordering::Relaxed), s.chunks);
                    assert_eq!(bits(&chunked), bits(&one), "{m}x{k}x{n} for {workers}");
                }
            }
        }
        // Other shapes and layouts are not packed.
        assert!(
            PackedB::for_product::<f32>(8, 64, 64, (64, 1), &[0.0; 4096], (1, 64))
                .expect("memory")
                .is_none()
        );
        assert!(
            PackedB::for_product::<f32>(32, 64, 64, (64, 1), &[0.0; 4096], (64, 1))
                .expect("memory")
                .is_none()
        );
        assert!(
            PackedB::for_product::<f64>(32, 64, 64, (64, 1), &[0.0; 4096], (1, 64))
                .expect("memory")
                .is_none()
        );
    }

    #[test]
    fn a_product_into_unwritten_memory_writes_every_element() {
        // C starts as NaN (standing for memory nobody wrote): the product
        // must equal gemm's with beta 0, on every kernel, split or not;
        // an empty sum (k = 0) is zeros.
        for &(m, k, n) in &[
            (1, 7, 33),
            (3, 40, 20),
            (9, 17, 300),
            (64, 300, 96),
            (5, 0, 6),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32) - 6.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32) - 5.0).collect();
            for (ta, tb) in [(false, false), (false, true), (true, false)] {
                let sa = if ta { (1, m) } else { (k, 1) };
                let sb = if tb { (1, k) } else { (n, 1) };
                let mut want = vec![0f32; m * n];
                gemm(m, k, n, 1.0, &a, sa, &b, sb, 0.0, &mut want, (n, 1));
                for split in [false, true] {
                    let mut c = vec![std::mem::MaybeUninit::new(f32::NAN); m * n];
                    product_uninit(split, m, k, n, &a, sa, &b, sb, &mut c);
                    // SAFETY: every element was initialised (NaN) above.
                    let got: Vec<f32> = c.iter().map(|v| unsafe { v.assume_init() }).collect();
                    assert_eq!(got, want, "{m}x{k}x{n} ta {ta} tb {tb} split {split}");
                }
            }
        }
    }

    #[test]
    fn transpose_into_copies_every_element() {
        for &(rows, cols) in &[(1, 1), (8, 8), (9, 17), (16, 3), (513, 40)] {
            let cs = rows + 3;
            let src: Vec<f32> = (0..cols * cs).map(|i| i as f32).collect();
            let ld = cols + PLAIN_PAD;
            let mut dst = vec![-1f32; rows * ld];
            unsafe { transpose_into(src.as_ptr(), cs as isize, rows, cols, dst.as_mut_ptr(), ld) };
            for p in 0..rows {
                for j in 0..cols {
                    assert_eq!(
                        dst[p * ld + j],
                        src[j * cs + p],
                        "({p}, {j}) of {rows}x{cols}"
                    );
                }
                assert!(dst[p * ld + cols..p * ld + ld].iter().all(|&v| v == -1.0));
            }
        }
    }

    #[test]
    fn the_small_kernel_takes_small_and_thin_products() {
        let on = small::available();
        let plain = |n: usize| (n, 1);
        // Tiny products and C at most 16 columns wide.
        assert_eq!(use_small(16, 16, 16, plain(16)), on);
        assert_eq!(use_small(4096, 4096, 10, plain(10)), on);
        assert!(!use_small(32, 32, 32, plain(32)));
        // One row, or C of at most 256 elements (the crate's dot-product
        // kernels): small.
        assert_eq!(use_small(1, 256, 1024, plain(1024)), on);
        assert_eq!(use_small(8, 4096, 32, plain(32)), on);
        assert!(!use_small(8, 4096, 33, plain(33)));
        assert!(!use_small(1024, 17, 1024, plain(1024)));
        assert!(!use_small(256, 256, 256, plain(256)));
        // B transposed (FC's weights): at most 8 rows of A and a deep K
        // only; from 9 rows the crate, on a plain copy of B (`blocked`).
        assert_eq!(use_small(8, 1024, 256, (1, 1024)), on);
        assert_eq!(use_small(5, 257, 1024, (1, 257)), on);
        assert!(!use_small(8, 256, 1024, (1, 256)));
        assert!(!use_small(9, 1024, 256, (1, 1024)));
        assert!(!use_small(32, 1024, 256, (1, 1024)));
        // ... unless B is too large to copy (AlexNet's fc6 at batch 16).
        assert_eq!(use_small(16, 9216, 4096, (1, 9216)), on);
        assert!(!use_small(65, 9216, 4096, (1, 9216)));
        assert_eq!(kernel::<f64>(16, 16, 16, (16, 1), (16, 1)), Kernel::Packed);
        // One to four rows in FC's or MatMul's layout: `thin`.
        assert_eq!(
            kernel::<f32>(1, 256, 1024, (256, 1), (1, 256)) == Kernel::Dot,
            on
        );
        assert_eq!(
            kernel::<f32>(4, 256, 1024, (256, 1), (1024, 1)) == Kernel::Axpy,
            on
        );
        // 9 to 64 rows over a transposed B it would copy: `panel` where the
        // CPU has AVX-512F, else the crate.
        let panel = if panel::available() {
            Kernel::Panel
        } else if on {
            Kernel::Packed
        } else {
            kernel::<f32>(32, 256, 1024, (256, 1), (1, 256))
        };
        assert_eq!(kernel::<f32>(32, 256, 1024, (256, 1), (1, 256)), panel);
        assert_eq!(kernel::<f32>(64, 256, 1024, (256, 1), (1, 256)), panel);
        assert!(kernel::<f32>(65, 256, 1024, (256, 1), (1, 256)) != Kernel::Panel);
        assert!(kernel::<f32>(32, 256, 1024, (256, 1), (1024, 1)) != Kernel::Panel);
    }

    #[test]
    fn split_plans_cut_balanced_chunks() {
        // 256^3 and the MLP's 256x128x64 on two threads, small kernel:
        // column strips, four chunks per thread.
        assert_eq!(plan(256, 256, (256, 1), (256, 1), true, 2), (false, 16, 8));
        assert_eq!(plan(256, 128, (128, 1), (128, 1), true, 2), (false, 16, 8));
        // Too few columns for strips: rows, on the 6-row tile, four per
        // thread if B is read in place, else one.
        assert_eq!(plan(4000, 10, (10, 1), (10, 1), true, 2), (true, 6, 8));
        assert_eq!(plan(4000, 10, (10, 1), (1, 4000), true, 2), (true, 6, 2));
        // The `gemm` crate: one chunk per thread, rows or columns.
        assert_eq!(plan(512, 512, (512, 1), (512, 1), false, 2), (true, 16, 2));
        // ... but columns where A is transposed (FC's dY^T X) and C has
        // 64 columns a thread.
        assert_eq!(
            plan(1024, 256, (1, 1024), (256, 1), false, 2),
            (false, 16, 2)
        );
        assert_eq!(
            plan(1024, 100, (1, 1024), (100, 1), false, 2),
            (true, 16, 2)
        );
        assert_eq!(plan(100, 900, (900, 1), (900, 1), false, 3), (false, 16, 3));
        // Boundaries: 128/128 rows (not 144/112), on the unit, chunks
        // within two units of each other, none empty, the last at len.
        let cuts = |len, chunks, unit| -> Vec<usize> {
            (0..=chunks).map(|i| bound(i, len, chunks, unit)).collect()
        };
        assert_eq!(cuts(256, 2, 16), vec![0, 128, 256]);
        for &(len, chunks, unit) in &[(256, 8, 6), (300, 8, 16), (1000, 7, 6), (50, 8, 6)] {
            let chunks = chunks.min(len / unit);
            let c = cuts(len, chunks, unit);
            assert_eq!((c[0], c[chunks]), (0, len));
            assert!(c[..chunks].iter().all(|x| x % unit == 0), "{c:?}");
            let sizes: Vec<usize> = c.windows(2).map(|w| w[1] - w[0]).collect();
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(*lo > 0 && hi - lo < 2 * unit, "{sizes:?}");
        }
    }

    #[test]
    fn helpers_only_for_large_products_and_free_pool_threads() {
        // Too small, or a pool of one: none.
        assert_eq!(helpers(64, 64, 64, 2, 1), 0);
        assert_eq!(helpers(512, 512, 512, 1, 1), 0);
        // One caller on two threads: one helper; two callers: none.
        assert_eq!(helpers(512, 512, 512, 2, 1), 1);
        assert_eq!(helpers(512, 512, 512, 2, 2), 0);
        assert_eq!(helpers(512, 512, 512, 4, 2), 2);
        // Too thin to cut into two chunks.
        assert_eq!(helpers(16, 1 << 20, 16, 4, 1), 0);
    }
}
