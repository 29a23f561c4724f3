//! A float32 kernel for small and thin products (AVX2 + FMA, used when the
//! CPU has them, checked at run time): `matrixmultiply` packs both operands
//! into panels on every call, which costs as much as the product itself
//! below about 128^3 multiply-adds, and pads C's columns to its 8- or
//! 16-wide tile, which wastes most of the work when C has 10 columns
//! (BENCHMARKS.md "GEMM (issue 14)"). This kernel reads A in place (one
//! element at a time, broadcast, so any strides), reads B's rows in place
//! in strips 16 columns wide (copying a strip first when B is transposed,
//! too wide, or the last, narrower strip, zero-padded to whole vectors; a
//! transposed B's 16 contiguous columns are copied 8 x 8 blocks at a time,
//! transposed in registers, not element by element: BENCHMARKS.md
//! "Matrix-vector products"), and keeps a tile of 6 x 16 elements of C in
//! twelve registers (a last 1 or 2 rows join the tile before as 4 + 3 or
//! 4 + 4 rows).

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Rows of C per tile.
    pub const MR: usize = 6;
    /// Columns of C per tile (two vectors of 8).
    pub const NR: usize = super::STRIP;
    /// B's strips are read in place only when its rows are at most this many
    /// elements apart: the rows of a strip of a wider B (a power of two
    /// apart, typically) fall into a few L1 sets and evict each other, so
    /// they are copied together first.
    pub const IN_PLACE_ROW: isize = 128;

    /// Lanes `lo..lo + 8` of a tile `w` columns wide, as a mask for
    /// `maskload`/`maskstore`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn mask(w: usize, lo: usize) -> __m256i {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let lim = _mm256_set1_epi32(w.saturating_sub(lo).min(8) as i32);
        _mm256_cmpgt_epi32(lim, idx)
    }

    /// One tile: `R` rows of C, `w <= 16` columns (`V` vectors of 8; all
    /// lanes used when `!MASKED`).
    ///
    /// # Safety
    /// A (`R x k`, strides `sa`), B (`k x w`, row stride `sb0`, unit column
    /// stride) and C (`R x w`, strides `sc`) in bounds; avx2 and fma present.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    // Indexed loops over the register tile unroll into fixed registers.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    unsafe fn tile<const R: usize, const V: usize, const MASKED: bool>(
        k: usize,
        alpha: f32,
        a: *const f32,
        sa: (isize, isize),
        b: *const f32,
        sb0: isize,
        beta: f32,
        c: *mut f32,
        sc: (isize, isize),
        w: usize,
    ) {
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); V]; R];
            let mut ap = [a; R];
            for (r, p) in ap.iter_mut().enumerate() {
                *p = a.offset(r as isize * sa.0);
            }
            let mut bp = b;
            for _ in 0..k {
                let mut bv = [_mm256_setzero_ps(); V];
                for (v, x) in bv.iter_mut().enumerate() {
                    *x = _mm256_loadu_ps(bp.add(8 * v));
                }
                for r in 0..R {
                    let av = _mm256_broadcast_ss(&*ap[r]);
                    for v in 0..V {
                        acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
                    }
                    ap[r] = ap[r].offset(sa.1);
                }
                bp = bp.offset(sb0);
            }
            let (m0, m1) = (mask(w, 0), mask(w, 8));
            let al = _mm256_set1_ps(alpha);
            let be = _mm256_set1_ps(beta);
            for r in 0..R {
                let cr = c.offset(r as isize * sc.0);
                if sc.1 == 1 {
                    for v in 0..V {
                        let cp = cr.add(8 * v);
                        let mk = if v == 0 { m0 } else { m1 };
                        let mut y = _mm256_mul_ps(al, acc[r][v]);
                        if beta != 0.0 {
                            let old = if MASKED {
                                _mm256_maskload_ps(cp, mk)
                            } else {
                                _mm256_loadu_ps(cp)
                            };
                            y = _mm256_fmadd_ps(be, old, y);
                        }
                        if MASKED {
                            _mm256_maskstore_ps(cp, mk, y)
                        } else {
                            _mm256_storeu_ps(cp, y)
                        }
                    }
                } else {
                    let mut t = [0f32; 16];
                    for v in 0..V {
                        _mm256_storeu_ps(t.as_mut_ptr().add(8 * v), _mm256_mul_ps(al, acc[r][v]));
                    }
                    for (j, &x) in t.iter().enumerate().take(w) {
                        let cp = cr.offset(j as isize * sc.1);
                        *cp = if beta != 0.0 { x + beta * *cp } else { x };
                    }
                }
            }
        }
    }

    /// A column strip of C (`w` wide) for rows `0..m`, tile by tile.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn strip<const V: usize, const MASKED: bool>(
        m: usize,
        k: usize,
        alpha: f32,
        a: *const f32,
        sa: (isize, isize),
        b: *const f32,
        sb0: isize,
        beta: f32,
        c: *mut f32,
        sc: (isize, isize),
        w: usize,
    ) {
        unsafe {
            // Full tiles, but a last one or two rows go with the tile
            // before them as 4 + 3 or 4 + 4 rows: a tile of 1 or 2 rows
            // has too few independent accumulators to keep the FMA units
            // busy (32 rows: 6 + 6 + 6 + 6 + 4 + 4, not ... + 6 + 2). Each
            // element's sum is the same whichever tile computes it.
            let rest = m % MR;
            let full = if m > MR && rest > 0 && rest <= 2 {
                m - rest - MR
            } else {
                m - rest
            };
            let mut i = 0;
            while i < full {
                let (ai, ci) = (a.offset(i as isize * sa.0), c.offset(i as isize * sc.0));
                tile::<MR, V, MASKED>(k, alpha, ai, sa, b, sb0, beta, ci, sc, w);
                i += MR;
            }
            if m - i > MR {
                let (ai, ci) = (a.offset(i as isize * sa.0), c.offset(i as isize * sc.0));
                tile::<4, V, MASKED>(k, alpha, ai, sa, b, sb0, beta, ci, sc, w);
                i += 4;
            }
            let (ai, ci) = (a.offset(i as isize * sa.0), c.offset(i as isize * sc.0));
            match m - i {
                0 => {}
                1 => tile::<1, V, MASKED>(k, alpha, ai, sa, b, sb0, beta, ci, sc, w),
                2 => tile::<2, V, MASKED>(k, alpha, ai, sa, b, sb0, beta, ci, sc, w),
                3 => tile::<3, V, MASKED>(k, alpha, ai, sa, b, sb0, beta, ci, sc, w),
                4 => tile::<4, V, MASKED>(k, alpha, ai, sa, b, sb0, beta, ci, sc, w),
                _ => tile::<5, V, MASKED>(k, alpha, ai, sa, b, sb0, beta, ci, sc, w),
            }
        }
    }

    /// An 8 x 8 block transposed: lane `i` of output `j` is lane `j` of
    /// input `i`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }

    /// Copies 16 contiguous columns of a transposed B (column `jj` at `b +
    /// jj * sb1`, `k` long) into `pad` as a row-major `k x 16` strip (the
    /// same values the element-by-element copy writes).
    ///
    /// # Safety
    /// The 16 columns in bounds for `k` elements; `pad.len() >= 16 * k`;
    /// avx2 present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn strip_of_columns(k: usize, b: *const f32, sb1: isize, pad: &mut [f32]) {
        let out = pad[..16 * k].as_mut_ptr();
        unsafe {
            let mut p = 0;
            while p + 8 <= k {
                for h in 0..2 {
                    let mut r = [_mm256_setzero_ps(); 8];
                    for (i, x) in r.iter_mut().enumerate() {
                        *x = _mm256_loadu_ps(b.offset((8 * h + i) as isize * sb1).add(p));
                    }
                    for (i, x) in transpose8(r).iter().enumerate() {
                        _mm256_storeu_ps(out.add((p + i) * 16 + 8 * h), *x);
                    }
                }
                p += 8;
            }
            for p in p..k {
                for jj in 0..16 {
                    *out.add(p * 16 + jj) = *b.offset(jj as isize * sb1).add(p);
                }
            }
        }
    }

    /// C = alpha A B + beta C. Strips of B 16 columns wide are read in
    /// place when B's column stride is 1; others (the last, narrower strip,
    /// or all when B is transposed) are first copied into `pad`, zero-padded
    /// to a whole number of vectors.
    ///
    /// # Safety
    /// Every index the strides reach is in bounds; C aliases neither A nor
    /// B; avx2 and fma present.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn sgemm(
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
        pad: &mut Vec<f32>,
    ) {
        unsafe {
            let mut j = 0;
            while j < n {
                let w = (n - j).min(NR);
                let cj = c.offset(j as isize * sc.1);
                let wide = if w > 8 { 16 } else { 8 };
                // B's strip in place, or copied (zero-padded) into `pad`.
                let (bj, sbj) = if sb.1 == 1 && w == wide && sb.0 <= IN_PLACE_ROW {
                    (b.add(j), sb.0)
                } else if sb.0 == 1 && w == 16 {
                    // B transposed (FC's W): its columns are contiguous, so
                    // the strip is 16 of them, transposed 8 x 8 at a time.
                    pad.clear();
                    pad.resize(k * 16, 0.0);
                    strip_of_columns(k, b.offset(j as isize * sb.1), sb.1, pad);
                    (pad.as_ptr(), 16)
                } else {
                    pad.clear();
                    pad.resize(k * wide, 0.0);
                    for p in 0..k {
                        let row = b.offset(p as isize * sb.0 + j as isize * sb.1);
                        for (jj, x) in pad[p * wide..p * wide + w].iter_mut().enumerate() {
                            *x = *row.offset(jj as isize * sb.1);
                        }
                    }
                    (pad.as_ptr(), wide as isize)
                };
                match (wide, w == wide) {
                    (16, true) => strip::<2, false>(m, k, alpha, a, sa, bj, sbj, beta, cj, sc, w),
                    (16, false) => strip::<2, true>(m, k, alpha, a, sa, bj, sbj, beta, cj, sc, w),
                    (_, true) => strip::<1, false>(m, k, alpha, a, sa, bj, sbj, beta, cj, sc, w),
                    _ => strip::<1, true>(m, k, alpha, a, sa, bj, sbj, beta, cj, sc, w),
                }
                j += NR;
            }
        }
    }
}

/// Columns of C per strip (the tile's width), the unit a product split by
/// columns is cut in.
pub(crate) const STRIP: usize = 16;

/// Whether the kernel reads B (`k x n`, strides `sb`) in place, without
/// copying any strip but a last, narrower one.
pub(crate) fn reads_b_in_place(sb: (usize, usize)) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        sb.1 == 1 && sb.0 as isize <= x86::IN_PLACE_ROW
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = sb;
        false
    }
}

/// Copies 16 contiguous columns of a transposed B (column `jj` at `b +
/// jj * sb1`, `k` long) into `pad` as a row-major `k x 16` strip (`panel`
/// packs FC's weights with it).
///
/// # Safety
/// The 16 columns in bounds for `k` elements; `pad.len() >= 16 * k`;
/// `available()`.
pub(crate) unsafe fn strip_of_columns(k: usize, b: *const f32, sb1: isize, pad: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded from the caller's contract.
    unsafe {
        x86::strip_of_columns(k, b, sb1, pad)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (k, b, sb1, pad);
        unreachable!("small::strip_of_columns without small::available()");
    }
}

/// Whether this CPU runs the small kernel.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// Each thread's copy of B's strips that cannot be read in place.
    static PAD: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// C = alpha A B + beta C on raw pointers.
///
/// # Safety
/// Every index the strides reach is in bounds; C aliases neither A nor B;
/// `available()` is true.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
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
    #[cfg(target_arch = "x86_64")]
    PAD.with(|pad| {
        let mut fresh = Vec::new();
        let mut guard = pad.try_borrow_mut();
        let pad = match guard.as_mut() {
            Ok(p) => &mut **p,
            Err(_) => &mut fresh,
        };
        // SAFETY: forwarded from the caller's contract.
        unsafe { x86::sgemm(m, k, n, alpha, a, sa, b, sb, beta, c, sc, pad) }
        // A very deep B (k rows) leaves a large copy behind: let it go.
        if pad.capacity() > 1 << 18 {
            *pad = Vec::new();
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, k, n, alpha, a, sa, b, sb, beta, c, sc);
        unreachable!("small::sgemm without small::available()");
    }
}
