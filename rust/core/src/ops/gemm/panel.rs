//! A float32 kernel over B packed into column panels (AVX-512F, used when
//! the CPU has it, checked at run time), for FC's products with 9 to 64
//! rows of C over its transposed weight. The path it replaces copied W^T
//! into a plain layout at each call for the `gemm` crate, whose 6-wide
//! tiles leave a 2-column remainder at 32 rows; packing costs the same as
//! that copy and this kernel runs 1.1-1.3x the crate's speed, so FC alone
//! takes 0.55-0.7x the time (32 x 256 -> 1024 160 -> 93 us on one thread,
//! BENCHMARKS.md "FC on packed panels; LeNet's first convolution"). A
//! recurrent step net's FC packs its weight once for all the steps
//! ([`super::PackedB`]); an FC of that shape outside a step packs it at
//! each call, so the two get the same bits. (Inside the LSTM the step's
//! product measured no faster than before: the 1 MiB weight no longer
//! stays in a core's 1 MiB L2 between steps, whichever kernel reads it.)
//!
//! B is packed as strips of 16 columns (`k x 16`, row-major, zero-padded
//! past n), two strips to a panel; a tile is 8 rows of C by a panel's 32
//! columns, sixteen registers, each element one fused multiply-add chain
//! over k in order, then `alpha * acc (+ beta * C)`: the same operations
//! whichever rows or columns are computed with it, so a product split by
//! panels has the bits of the whole.

/// Columns per strip, and per panel.
pub(crate) const STRIP: usize = 16;
pub(crate) const NR: usize = 2 * STRIP;

/// Elements of B packed: `k` rows of whole panels.
pub(crate) fn packed_len(k: usize, n: usize) -> usize {
    n.div_ceil(NR).saturating_mul(NR).saturating_mul(k)
}

/// Whether this CPU runs the kernel (AVX-512F, and AVX2 + FMA for the
/// packing's transposes).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| is_x86_feature_detected!("avx512f") && super::small::available())
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Packs B (`k x n`, strides `sb`) into `out` (at least [`packed_len`]).
///
/// # Safety
/// Every index the strides reach is in bounds; `available()`.
pub(crate) unsafe fn pack(k: usize, n: usize, b: *const f32, sb: (isize, isize), out: &mut [f32]) {
    let out = &mut out[..packed_len(k, n)];
    for (s, dst) in out.chunks_exact_mut(STRIP * k.max(1)).enumerate() {
        let j = s * STRIP;
        let w = n.saturating_sub(j).min(STRIP);
        if k == 0 {
            break;
        }
        // SAFETY (each branch): columns j..j + w of B, k rows, in bounds
        // by the caller's contract; `dst` holds k x 16.
        unsafe {
            if w == STRIP && sb.0 == 1 {
                // Transposed B (FC's W): 16 contiguous columns, 8 x 8
                // blocks transposed in registers.
                super::small::strip_of_columns(k, b.offset(j as isize * sb.1), sb.1, dst);
            } else if sb.1 == 1 {
                for (p, row) in dst.chunks_exact_mut(STRIP).enumerate() {
                    let src = b.offset(p as isize * sb.0).add(j);
                    row[..w].copy_from_slice(std::slice::from_raw_parts(src, w));
                    row[w..].fill(0.0);
                }
            } else {
                for (p, row) in dst.chunks_exact_mut(STRIP).enumerate() {
                    for (jj, x) in row.iter_mut().enumerate() {
                        *x = if jj < w {
                            *b.offset(p as isize * sb.0 + (j + jj) as isize * sb.1)
                        } else {
                            0.0
                        };
                    }
                }
            }
        }
    }
}

/// C (`m x n`, strides `sc`) = alpha A (`m x k`, strides `sa`) B + beta C,
/// B packed by [`pack`] (`bp`, its columns `0..n`); C is not read when
/// beta is 0.
///
/// # Safety
/// A and C in bounds for their strides; `bp` holds [`packed_len`]`(k, n)`;
/// C aliases neither; `available()`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: *const f32,
    sa: (isize, isize),
    bp: *const f32,
    beta: f32,
    c: *mut f32,
    sc: (isize, isize),
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: forwarded.
    unsafe {
        x86::run(m, k, n, alpha, a, sa, bp, beta, c, sc)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, k, n, alpha, a, sa, bp, beta, c, sc);
        unreachable!("panel::run without panel::available()");
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{NR, STRIP};
    use std::arch::x86_64::*;

    /// Rows of C per tile.
    const MR: usize = 8;
    /// How far ahead (elements of a strip, 8 rows) B is prefetched.
    const PREFETCH: usize = 8 * STRIP;

    /// `R` rows of C by one panel (`w <= 32` columns of it in C).
    ///
    /// # Safety
    /// As [`super::run`], for these rows and columns.
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    unsafe fn tile<const R: usize>(
        k: usize,
        alpha: f32,
        a: *const f32,
        sa: (isize, isize),
        bp: *const f32,
        beta: f32,
        c: *mut f32,
        sc: (isize, isize),
        w: usize,
    ) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            let mut ap = [a; R];
            for (r, p) in ap.iter_mut().enumerate() {
                *p = a.offset(r as isize * sa.0);
            }
            let (mut b0, mut b1) = (bp, bp.add(STRIP * k));
            for _ in 0..k {
                // B's panel comes from memory or L3 for the first tile of
                // a product: ask for it a few rows ahead.
                _mm_prefetch::<_MM_HINT_T0>(b0.add(PREFETCH).cast::<i8>());
                _mm_prefetch::<_MM_HINT_T0>(b1.add(PREFETCH).cast::<i8>());
                let (v0, v1) = (_mm512_loadu_ps(b0), _mm512_loadu_ps(b1));
                for r in 0..R {
                    let av = _mm512_set1_ps(*ap[r]);
                    acc[r][0] = _mm512_fmadd_ps(av, v0, acc[r][0]);
                    acc[r][1] = _mm512_fmadd_ps(av, v1, acc[r][1]);
                    ap[r] = ap[r].offset(sa.1);
                }
                b0 = b0.add(STRIP);
                b1 = b1.add(STRIP);
            }
            let lanes = |lo: usize| -> __mmask16 {
                let x = w.saturating_sub(lo).min(STRIP);
                ((1u32 << x) - 1) as __mmask16
            };
            let masks = [lanes(0), lanes(STRIP)];
            let (al, be) = (_mm512_set1_ps(alpha), _mm512_set1_ps(beta));
            for r in 0..R {
                let cr = c.offset(r as isize * sc.0);
                if sc.1 == 1 {
                    for v in 0..2 {
                        let cp = cr.add(STRIP * v);
                        let mut y = _mm512_mul_ps(al, acc[r][v]);
                        if beta != 0.0 {
                            y = _mm512_fmadd_ps(be, _mm512_maskz_loadu_ps(masks[v], cp), y);
                        }
                        _mm512_mask_storeu_ps(cp, masks[v], y);
                    }
                } else {
                    let mut t = [0f32; NR];
                    for v in 0..2 {
                        _mm512_storeu_ps(
                            t.as_mut_ptr().add(STRIP * v),
                            _mm512_mul_ps(al, acc[r][v]),
                        );
                    }
                    for (j, &x) in t.iter().enumerate().take(w) {
                        let cp = cr.offset(j as isize * sc.1);
                        *cp = if beta != 0.0 { beta.mul_add(*cp, x) } else { x };
                    }
                }
            }
        }
    }

    /// See [`super::run`].
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn run(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: *const f32,
        sa: (isize, isize),
        bp: *const f32,
        beta: f32,
        c: *mut f32,
        sc: (isize, isize),
    ) {
        unsafe {
            let mut j = 0;
            while j < n {
                let w = (n - j).min(NR);
                let (bj, cj) = (bp.add(j * k), c.offset(j as isize * sc.1));
                let mut i = 0;
                while i + MR <= m {
                    let (ai, ci) = (a.offset(i as isize * sa.0), cj.offset(i as isize * sc.0));
                    tile::<MR>(k, alpha, ai, sa, bj, beta, ci, sc, w);
                    i += MR;
                }
                let (ai, ci) = (a.offset(i as isize * sa.0), cj.offset(i as isize * sc.0));
                match m - i {
                    0 => {}
                    1 => tile::<1>(k, alpha, ai, sa, bj, beta, ci, sc, w),
                    2 => tile::<2>(k, alpha, ai, sa, bj, beta, ci, sc, w),
                    3 => tile::<3>(k, alpha, ai, sa, bj, beta, ci, sc, w),
                    4 => tile::<4>(k, alpha, ai, sa, bj, beta, ci, sc, w),
                    5 => tile::<5>(k, alpha, ai, sa, bj, beta, ci, sc, w),
                    6 => tile::<6>(k, alpha, ai, sa, bj, beta, ci, sc, w),
                    _ => tile::<7>(k, alpha, ai, sa, bj, beta, ci, sc, w),
                }
                j += NR;
            }
        }
    }
}
