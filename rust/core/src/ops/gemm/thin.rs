//! float32 products with few rows of C (at most [`ROWS`]: a fully connected
//! layer at batch 1 to 4, its gradient with respect to X, a matrix-vector
//! MatMul). They are matrix-vector products, bound by reading B once from
//! memory: `matrixmultiply` packs all of B first (reading it twice and
//! writing it once), and the small kernel walks B down strips of 16 columns
//! (copying them first when B is transposed or its rows are far apart),
//! one cache line per row, so both ran 4-5 times slower than B's size
//! allows at 1 x 25088 x 4096 (BENCHMARKS.md "Matrix-vector products").
//! Two kernels here (AVX2 + FMA, where `small::available()`) read B in the
//! order it is stored:
//!
//! - [`dot`], when B is transposed (its columns contiguous, FC's `W`) and
//!   A's rows are contiguous: each element of C is a dot product of a row
//!   of A with a column of B, accumulated in one vector of 8 lanes over k
//!   (a masked last vector), then summed across the lanes in a fixed order;
//!   a few columns of B are streamed at once.
//! - [`axpy`], when B's rows are contiguous: C's rows are built in blocks
//!   of [`BLOCK`] columns in a scratch accumulator (in L1) by adding
//!   `A[i, p] * B[p, block]` for p in order, streaming B's rows.
//!
//! Every element of C comes from the same sequence of operations whichever
//! columns are computed with it, so a product split by C's columns has the
//! same bits as the whole product on one thread (`dot`: the lanes of one
//! dot product never mix with another's; `axpy`: one fused multiply-add
//! chain per element, over p in order, from zero, the small kernel's own
//! order).

/// At most this many rows of C go to these kernels.
pub(crate) const ROWS: usize = 4;

/// Columns of C per block of [`axpy`]'s accumulator (a multiple of 8).
pub(crate) const BLOCK: usize = 512;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::BLOCK;
    use std::arch::x86_64::*;

    /// How far ahead (elements) [`block`] prefetches B's columns when A
    /// has two rows or more: 1 x 25088 x 4096 on one thread ran at
    /// 11.6-12.9 GFLOP/s without and 8.3-10.6 with (512); 2 rows 17-25
    /// without, 24-31 with; 4 rows 18-22 without, 30-33 with (a
    /// stand-alone build of this kernel, BENCHMARKS.md "Matrix-vector
    /// products").
    const PREFETCH: usize = 512;

    /// The first `w` (< 8) lanes, as a mask for `maskload`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn mask(w: usize) -> __m256i {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(w as i32), idx)
    }

    /// The sum of the 8 lanes, in a fixed order.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// alpha * x + beta * C's element at `cp` into it (C is not read when
    /// beta is 0).
    ///
    /// # Safety
    /// `cp` valid for reads and writes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn put(cp: *mut f32, x: f32, alpha: f32, beta: f32) {
        let y = alpha * x;
        // SAFETY: forwarded.
        unsafe { *cp = if beta != 0.0 { beta.mul_add(*cp, y) } else { y } }
    }

    /// Dot products of `R` rows of A (contiguous, `sa0` apart) with `J`
    /// columns of B (contiguous, `sb1` apart), each `k` long, into C's
    /// `R x J` block at `c`.
    ///
    /// # Safety
    /// Every row and column in bounds for `k` elements; C's block in
    /// bounds; avx2 and fma present.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    unsafe fn block<const R: usize, const J: usize>(
        k: usize,
        alpha: f32,
        a: *const f32,
        sa0: isize,
        b: *const f32,
        sb1: isize,
        beta: f32,
        c: *mut f32,
        sc: (isize, isize),
    ) {
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); J]; R];
            let mut ap = [a; R];
            for (r, p) in ap.iter_mut().enumerate() {
                *p = a.offset(r as isize * sa0);
            }
            let mut bp = [b; J];
            for (j, p) in bp.iter_mut().enumerate() {
                *p = b.offset(j as isize * sb1);
            }
            let mut p = 0;
            while p + 8 <= k {
                let mut bv = [_mm256_setzero_ps(); J];
                for j in 0..J {
                    bv[j] = _mm256_loadu_ps(bp[j].add(p));
                    // With two rows of A or more, fewer columns of B are
                    // streamed at once than the hardware prefetcher keeps
                    // up with: ask for each column's line PREFETCH ahead
                    // (a hint; never faults past the end).
                    if R >= 2 && p % 16 == 0 {
                        _mm_prefetch::<_MM_HINT_T0>(bp[j].wrapping_add(p + PREFETCH).cast());
                    }
                }
                for r in 0..R {
                    let av = _mm256_loadu_ps(ap[r].add(p));
                    for j in 0..J {
                        acc[r][j] = _mm256_fmadd_ps(av, bv[j], acc[r][j]);
                    }
                }
                p += 8;
            }
            if p < k {
                let mk = mask(k - p);
                let mut bv = [_mm256_setzero_ps(); J];
                for j in 0..J {
                    bv[j] = _mm256_maskload_ps(bp[j].add(p), mk);
                }
                for r in 0..R {
                    let av = _mm256_maskload_ps(ap[r].add(p), mk);
                    for j in 0..J {
                        acc[r][j] = _mm256_fmadd_ps(av, bv[j], acc[r][j]);
                    }
                }
            }
            for r in 0..R {
                for j in 0..J {
                    let cp = c.offset(r as isize * sc.0 + j as isize * sc.1);
                    put(cp, hsum(acc[r][j]), alpha, beta);
                }
            }
        }
    }

    /// [`block`]s of `J` columns (then single columns) over all of C's
    /// `R` rows.
    ///
    /// # Safety
    /// As [`super::dot`].
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn columns<const R: usize, const J: usize>(
        k: usize,
        n: usize,
        alpha: f32,
        a: *const f32,
        sa0: isize,
        b: *const f32,
        sb1: isize,
        beta: f32,
        c: *mut f32,
        sc: (isize, isize),
    ) {
        unsafe {
            let at = |j: usize| (b.offset(j as isize * sb1), c.offset(j as isize * sc.1));
            let mut j = 0;
            while j + J <= n {
                let (bj, cj) = at(j);
                block::<R, J>(k, alpha, a, sa0, bj, sb1, beta, cj, sc);
                j += J;
            }
            while j < n {
                let (bj, cj) = at(j);
                block::<R, 1>(k, alpha, a, sa0, bj, sb1, beta, cj, sc);
                j += 1;
            }
        }
    }

    /// See [`super::dot`].
    ///
    /// # Safety
    /// As [`super::dot`].
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dot(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: *const f32,
        sa0: isize,
        b: *const f32,
        sb1: isize,
        beta: f32,
        c: *mut f32,
        sc: (isize, isize),
    ) {
        // Accumulators, B's vectors and A's stay within 16 registers.
        unsafe {
            match m {
                1 => columns::<1, 8>(k, n, alpha, a, sa0, b, sb1, beta, c, sc),
                2 => columns::<2, 4>(k, n, alpha, a, sa0, b, sb1, beta, c, sc),
                3 => columns::<3, 3>(k, n, alpha, a, sa0, b, sb1, beta, c, sc),
                4 => columns::<4, 2>(k, n, alpha, a, sa0, b, sb1, beta, c, sc),
                _ => unreachable!("thin::dot with {m} rows"),
            }
        }
    }

    /// Adds `G` rows of B (from `b`, `sb0` apart; columns `0..w`) times
    /// A's elements `p..p + G` of each of `R` rows to `acc`, row of B after
    /// row of B for each element (one chain of fused multiply-adds over p).
    ///
    /// # Safety
    /// As [`super::axpy`] for these rows; avx2 and fma present.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    unsafe fn pass<const R: usize, const G: usize>(
        p: usize,
        w: usize,
        a: *const f32,
        sa: (isize, isize),
        b: *const f32,
        sb0: isize,
        acc: &mut [[f32; BLOCK]; R],
    ) {
        unsafe {
            let (nv, tail) = (w / 8, w % 8);
            let mk = mask(tail);
            let mut bp = [b; G];
            for (q, x) in bp.iter_mut().enumerate() {
                *x = b.offset((p + q) as isize * sb0);
            }
            for r in 0..R {
                let mut av = [_mm256_setzero_ps(); G];
                for q in 0..G {
                    av[q] = _mm256_set1_ps(*a.offset(r as isize * sa.0 + (p + q) as isize * sa.1));
                }
                let row = acc[r].as_mut_ptr();
                for v in 0..nv {
                    let ap = row.add(8 * v);
                    let mut s = _mm256_loadu_ps(ap);
                    for q in 0..G {
                        s = _mm256_fmadd_ps(av[q], _mm256_loadu_ps(bp[q].add(8 * v)), s);
                    }
                    _mm256_storeu_ps(ap, s);
                }
                if tail > 0 {
                    let ap = row.add(8 * nv);
                    let mut s = _mm256_loadu_ps(ap);
                    for q in 0..G {
                        s = _mm256_fmadd_ps(av[q], _mm256_maskload_ps(bp[q].add(8 * nv), mk), s);
                    }
                    _mm256_storeu_ps(ap, s);
                }
            }
        }
    }

    /// `R` rows of C, `w <= BLOCK` columns: the multiply-add chains over
    /// p in `acc` (`R x BLOCK`, zeroed first), `G` rows of B per pass.
    ///
    /// # Safety
    /// As [`super::axpy`] for this block; avx2 and fma present.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn accumulate<const R: usize, const G: usize>(
        k: usize,
        w: usize,
        a: *const f32,
        sa: (isize, isize),
        b: *const f32,
        sb0: isize,
        acc: &mut [[f32; BLOCK]; R],
    ) {
        let padded = w.div_ceil(8) * 8;
        for row in acc.iter_mut() {
            row[..padded].fill(0.0);
        }
        let mut p = 0;
        // SAFETY: rows p..p + G of B and columns p..p + G of A are below k.
        unsafe {
            while p + G <= k {
                pass::<R, G>(p, w, a, sa, b, sb0, acc);
                p += G;
            }
            while p < k {
                pass::<R, 1>(p, w, a, sa, b, sb0, acc);
                p += 1;
            }
        }
    }

    /// See [`super::axpy`], for `R` rows.
    ///
    /// # Safety
    /// As [`super::axpy`].
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn axpy_rows<const R: usize, const G: usize>(
        k: usize,
        n: usize,
        alpha: f32,
        a: *const f32,
        sa: (isize, isize),
        b: *const f32,
        sb0: isize,
        beta: f32,
        c: *mut f32,
        sc: (isize, isize),
    ) {
        let mut acc = [[0f32; BLOCK]; R];
        let mut j0 = 0;
        while j0 < n {
            let w = BLOCK.min(n - j0);
            // SAFETY: B's columns j0..j0 + w of rows 0..k and C's are in
            // bounds (the caller's contract).
            unsafe {
                accumulate::<R, G>(k, w, a, sa, b.add(j0), sb0, &mut acc);
                for (r, row) in acc.iter().enumerate() {
                    let cr = c.offset(r as isize * sc.0 + j0 as isize * sc.1);
                    if sc.1 == 1 {
                        let (al, be) = (_mm256_set1_ps(alpha), _mm256_set1_ps(beta));
                        let mut j = 0;
                        while j + 8 <= w {
                            let mut y = _mm256_mul_ps(al, _mm256_loadu_ps(row.as_ptr().add(j)));
                            if beta != 0.0 {
                                y = _mm256_fmadd_ps(be, _mm256_loadu_ps(cr.add(j)), y);
                            }
                            _mm256_storeu_ps(cr.add(j), y);
                            j += 8;
                        }
                        for (jj, &x) in row.iter().enumerate().take(w).skip(j) {
                            put(cr.add(jj), x, alpha, beta);
                        }
                    } else {
                        for (jj, &x) in row.iter().enumerate().take(w) {
                            put(cr.offset(jj as isize * sc.1), x, alpha, beta);
                        }
                    }
                }
            }
            j0 += BLOCK;
        }
    }

    /// See [`super::axpy`].
    ///
    /// # Safety
    /// As [`super::axpy`].
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn axpy(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: *const f32,
        sa: (isize, isize),
        b: *const f32,
        sb0: isize,
        beta: f32,
        c: *mut f32,
        sc: (isize, isize),
    ) {
        unsafe {
            match m {
                1 => axpy_rows::<1, 4>(k, n, alpha, a, sa, b, sb0, beta, c, sc),
                2 => axpy_rows::<2, 4>(k, n, alpha, a, sa, b, sb0, beta, c, sc),
                3 => axpy_rows::<3, 4>(k, n, alpha, a, sa, b, sb0, beta, c, sc),
                4 => axpy_rows::<4, 4>(k, n, alpha, a, sa, b, sb0, beta, c, sc),
                _ => unreachable!("thin::axpy with {m} rows"),
            }
        }
    }
}

/// Whether [`dot`] takes operands of these strides: A's rows and B's
/// columns contiguous.
pub(crate) fn dot_layout(sa: (usize, usize), sb: (usize, usize)) -> bool {
    sa.1 == 1 && sb.0 == 1
}

/// Whether [`axpy`] takes a B of these strides: its rows contiguous.
pub(crate) fn axpy_layout(sb: (usize, usize)) -> bool {
    sb.1 == 1
}

/// C = alpha A B + beta C for `1 <= m <= ROWS`, A's rows and B's columns
/// contiguous (row stride `sa0`, column stride `sb1`), by dot products.
///
/// # Safety
/// Every index the strides reach is in bounds; C aliases neither A nor B;
/// `small::available()` is true.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    sa0: isize,
    b: *const f32,
    sb1: isize,
    beta: f32,
    c: *mut f32,
    sc: (isize, isize),
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller's contract (avx2 and fma present:
    // `small::available()`).
    unsafe {
        x86::dot(m, k, n, alpha, a, sa0, b, sb1, beta, c, sc)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, k, n, alpha, a, sa0, b, sb1, beta, c, sc);
        unreachable!("thin::dot without small::available()");
    }
}

/// C = alpha A B + beta C for `1 <= m <= ROWS`, B's rows contiguous (row
/// stride `sb0`), A of any strides, by adding multiples of B's rows.
///
/// # Safety
/// Every index the strides reach is in bounds; C aliases neither A nor B;
/// `small::available()` is true.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn axpy(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    sa: (isize, isize),
    b: *const f32,
    sb0: isize,
    beta: f32,
    c: *mut f32,
    sc: (isize, isize),
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        x86::axpy(m, k, n, alpha, a, sa, b, sb0, beta, c, sc)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, k, n, alpha, a, sa, b, sb0, beta, c, sc);
        unreachable!("thin::axpy without small::available()");
    }
}
