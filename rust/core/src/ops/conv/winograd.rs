//! Winograd F(2x2, 3x3) convolution (issue 15): the 3x3, stride-1,
//! dilation-1, one-group 2-D products of `Conv` and `ConvTranspose` (their
//! forward and their input gradient, in NCHW and NHWC) where it measures
//! faster than im2col + GEMM (BENCHMARKS.md, "Conv (issue 15)"); `plan.rs`
//! decides when.
//!
//! Each 2x2 block of outputs (a tile) reads a 4x4 patch of the input. The
//! patch (B^T d B) and the filter (G g G^T) are transformed into 16
//! values each; then, for each of the 16, a GEMM over the channels
//! (out channels x in channels times in channels x tiles) replaces the
//! nine taps' products; the output transform (A^T m A) turns the 16 sums
//! back into the tile's 2x2 outputs. That is 16 multiply-adds per tile and
//! channel pair instead of 36, for a rounding error a few times im2col's
//! (see `tests/train/test_winograd.py` and the tests below).
//!
//! Tiles (of every image) are processed in blocks whose transformed input
//! stays near the cache; blocks run on the kernel pool.

use crate::num::Float;
use crate::ops::gemm::product;
use rayon::prelude::*;

/// One correlation: `y[n][k][oy][ox]` is the sum over c, a, b of
/// `x[n][c][oy + a - pt][ox + b - pl] * filter(k, c, a, b)`, taps outside
/// the input being zero (pads on any side, or none).
pub(crate) struct Wino {
    pub(crate) n: usize,
    /// Input channels.
    pub(crate) c: usize,
    /// Output channels.
    pub(crate) k: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    pub(crate) pt: isize,
    pub(crate) pl: isize,
    /// Channels last (NHWC), else NCHW.
    pub(crate) nhwc: bool,
}

/// The filter transform G g G^T of one 3x3 filter.
fn filter_tile<T: Float>(g: [[T; 3]; 3]) -> [T; 16] {
    let h = T::of(0.5);
    // t = G g (4 x 3).
    let mut t = [[T::of(0.0); 3]; 4];
    for j in 0..3 {
        let (a, b, c) = (g[0][j], g[1][j], g[2][j]);
        t[0][j] = a;
        t[1][j] = (a + b + c) * h;
        t[2][j] = (a - b + c) * h;
        t[3][j] = c;
    }
    // u = t G^T (4 x 4).
    let mut u = [T::of(0.0); 16];
    for i in 0..4 {
        let (a, b, c) = (t[i][0], t[i][1], t[i][2]);
        u[i * 4] = a;
        u[i * 4 + 1] = (a + b + c) * h;
        u[i * 4 + 2] = (a - b + c) * h;
        u[i * 4 + 3] = c;
    }
    u
}

/// The output transform A^T m A of one tile's 16 sums: its 2x2 outputs.
#[inline(always)]
fn output_tile<T: Float>(m: &[T; 16]) -> [[T; 2]; 2] {
    let mut t = [[T::of(0.0); 4]; 2];
    for j in 0..4 {
        t[0][j] = m[j] + m[4 + j] + m[8 + j];
        t[1][j] = m[4 + j] - m[8 + j] - m[12 + j];
    }
    [
        [t[0][0] + t[0][1] + t[0][2], t[0][1] - t[0][2] - t[0][3]],
        [t[1][0] + t[1][1] + t[1][2], t[1][1] - t[1][2] - t[1][3]],
    ]
}

/// `o = p + r` (`add`) or `o = p - r`, elementwise.
#[inline(always)]
fn combine<T: Float>(o: &mut [T], p: &[T], r: &[T], add: bool) {
    if add {
        for (o, (&p, &r)) in o.iter_mut().zip(p.iter().zip(r)) {
            *o = p + r;
        }
    } else {
        for (o, (&p, &r)) in o.iter_mut().zip(p.iter().zip(r)) {
            *o = p - r;
        }
    }
}

/// Output pointer shared by the blocks (each writes the outputs of its own
/// tiles only).
#[derive(Clone, Copy)]
struct YPtr<T>(*mut T, usize);
// SAFETY: blocks write disjoint elements (distinct tiles).
unsafe impl<T: Send> Send for YPtr<T> {}
unsafe impl<T: Send> Sync for YPtr<T> {}

impl<T> YPtr<T> {
    /// Writes element `i`.
    ///
    /// # Safety
    /// No other thread reads or writes element `i` meanwhile.
    #[inline(always)]
    unsafe fn put(self, i: usize, v: T) {
        assert!(i < self.1, "winograd: output index out of range");
        // SAFETY: in bounds (checked); exclusive by the caller's contract.
        unsafe { self.0.add(i).write(v) }
    }
}

/// Tiles per block: enough that the GEMMs run near full speed, few enough
/// that the transformed input and sums (16 x tiles x channels) stay near
/// the cache, and at least one block per pool thread when there are
/// enough tiles.
fn block_tiles(tiles: usize, c: usize, k: usize, threads: usize) -> usize {
    let cap = ((1usize << 18) / (16 * c.max(k).max(1))).clamp(64, 512);
    let per_thread = tiles.div_ceil(threads.max(1)).max(16);
    cap.min(per_thread).max(1)
}

impl Wino {
    fn tiles(&self) -> (usize, usize) {
        (self.oh.div_ceil(2), self.ow.div_ceil(2))
    }

    /// Runs the correlation of `x` into `y` (both dense, in `self`'s
    /// layout), with the filter tap `(k, c, a, b)` read by `filter`.
    pub(crate) fn run<T: Float>(
        &self,
        x: &[T],
        filter: impl Fn(usize, usize, usize, usize) -> T + Sync,
        y: &mut [T],
    ) {
        let (c, k) = (self.c, self.k);
        assert_eq!(
            x.len(),
            self.n * c * self.h * self.w,
            "winograd: input size"
        );
        assert_eq!(
            y.len(),
            self.n * k * self.oh * self.ow,
            "winograd: output size"
        );
        if y.is_empty() {
            return;
        }
        if c == 0 {
            y.fill(T::of(0.0));
            return;
        }
        let threads = if crate::threads::pool_available() {
            rayon::current_num_threads()
        } else {
            1
        };
        // U[k][xi][c]: filter row k's 16 transformed values per channel.
        let mut u = vec![T::of(0.0); 16 * k * c];
        let fill = |(kk, uk): (usize, &mut [T])| {
            for cc in 0..c {
                let mut g = [[T::of(0.0); 3]; 3];
                for (a, row) in g.iter_mut().enumerate() {
                    for (b, v) in row.iter_mut().enumerate() {
                        *v = filter(kk, cc, a, b);
                    }
                }
                for (xi, v) in filter_tile(g).into_iter().enumerate() {
                    uk[xi * c + cc] = v;
                }
            }
        };
        if threads > 1 && k * c >= 4096 {
            u.par_chunks_mut(16 * c).enumerate().for_each(fill);
        } else {
            u.chunks_mut(16 * c).enumerate().for_each(fill);
        }
        let (th, tw) = self.tiles();
        let tiles = self.n * th * tw;
        let tb = block_tiles(tiles, c, k, threads);
        let su = 16 * c;
        let blocks = tiles.div_ceil(tb);
        let yp = YPtr(y.as_mut_ptr(), y.len());
        let scratch = || (vec![T::of(0.0); 16 * tb * c], vec![T::of(0.0); 16 * tb * k]);
        let one = |(v, m): &mut (Vec<T>, Vec<T>), b: usize| {
            let t0 = b * tb;
            let nt = tb.min(tiles - t0);
            self.transform_in(x, t0, nt, tb, v);
            for xi in 0..16 {
                let ux = &u[xi * c..];
                let vx = &v[xi * tb * c..(xi + 1) * tb * c];
                let mx = &mut m[xi * tb * k..(xi + 1) * tb * k];
                if self.nhwc {
                    // M (nt x K) = V (nt x C) * U^T (C x K).
                    product(
                        false,
                        nt,
                        c,
                        k,
                        vx,
                        (c, 1),
                        ux,
                        (1, su),
                        T::of(0.0),
                        mx,
                        (k, 1),
                    );
                } else {
                    // M (K x nt) = U (K x C) * V (C x nt).
                    product(
                        false,
                        k,
                        c,
                        nt,
                        ux,
                        (su, 1),
                        vx,
                        (tb, 1),
                        T::of(0.0),
                        mx,
                        (tb, 1),
                    );
                }
            }
            // SAFETY: block b writes only the outputs of its tiles
            // t0..t0 + nt, which no other block writes.
            unsafe { self.transform_out(m, t0, nt, tb, yp) };
        };
        if threads > 1 && blocks > 1 {
            (0..blocks)
                .into_par_iter()
                .for_each_init(scratch, |s, b| one(s, b));
        } else {
            let mut s = scratch();
            for b in 0..blocks {
                one(&mut s, b);
            }
        }
    }

    /// The image and tile row and column of tile `t`.
    #[inline]
    fn tile(&self, t: usize) -> (usize, usize, usize) {
        let (th, tw) = self.tiles();
        (t / (th * tw), (t / tw) % th, t % tw)
    }

    /// V for tiles `t0..t0 + nt`: NCHW `V[xi][c][j]`, NHWC `V[xi][j][c]`
    /// (`tb` the block's capacity in tiles).
    fn transform_in<T: Float>(&self, x: &[T], t0: usize, nt: usize, tb: usize, v: &mut [T]) {
        if self.nhwc {
            self.transform_in_nhwc(x, t0, nt, tb, v)
        } else {
            self.transform_in_nchw(x, t0, nt, tb, v)
        }
    }

    /// NCHW: a run of tiles along one tile row at a time; B^T is applied
    /// to whole (zero-padded) input rows, then B to each tile's columns.
    fn transform_in_nchw<T: Float>(&self, x: &[T], t0: usize, nt: usize, tb: usize, v: &mut [T]) {
        let (c, h, w) = (self.c, self.h as isize, self.w as isize);
        let (_, tw) = self.tiles();
        let zero = T::of(0.0);
        let plane = self.h * self.w;
        // Padded rows of the run: columns x0 - pl .. x0 - pl + width.
        let mut rows = vec![zero; 4 * (2 * tw + 2)];
        let mut t = vec![zero; 4 * (2 * tw + 2)];
        let mut j = 0;
        while j < nt {
            let (img, ty, tx0) = self.tile(t0 + j);
            let run = (tw - tx0).min(nt - j);
            let width = 2 * run + 2;
            let y0 = (2 * ty) as isize - self.pt;
            let xs = (2 * tx0) as isize - self.pl;
            // The input columns inside the image: lo..hi of the run's width.
            let lo = (-xs).clamp(0, width as isize) as usize;
            let hi = (w - xs).clamp(lo as isize, width as isize) as usize;
            for cc in 0..c {
                let xc = &x[(img * c + cc) * plane..(img * c + cc + 1) * plane];
                for i in 0..4 {
                    let r = &mut rows[i * width..(i + 1) * width];
                    let yy = y0 + i as isize;
                    if yy < 0 || yy >= h || lo == hi {
                        r.fill(zero);
                        continue;
                    }
                    r[..lo].fill(zero);
                    r[hi..].fill(zero);
                    let s0 = yy as usize * self.w + (xs + lo as isize) as usize;
                    r[lo..hi].copy_from_slice(&xc[s0..s0 + hi - lo]);
                }
                {
                    let (r0, rest) = rows.split_at(width);
                    let (r1, rest) = rest.split_at(width);
                    let (r2, r3) = rest.split_at(width);
                    let (u0, rest) = t.split_at_mut(width);
                    let (u1, rest) = rest.split_at_mut(width);
                    let (u2, u3) = rest.split_at_mut(width);
                    for q in 0..width {
                        u0[q] = r0[q] - r2[q];
                        u1[q] = r1[q] + r2[q];
                        u2[q] = r2[q] - r1[q];
                        u3[q] = r1[q] - r3[q];
                    }
                }
                for i in 0..4 {
                    let r = &t[i * width..(i + 1) * width];
                    let base = (i * 4) * tb * c + cc * tb + j;
                    let plane_v = tb * c;
                    for q in 0..run {
                        let d = &r[2 * q..2 * q + 4];
                        v[base + q] = d[0] - d[2];
                        v[base + plane_v + q] = d[1] + d[2];
                        v[base + 2 * plane_v + q] = d[2] - d[1];
                        v[base + 3 * plane_v + q] = d[1] - d[3];
                    }
                }
            }
            j += run;
        }
    }

    /// NHWC: per tile, the 16 pixels' channel vectors (zeros outside the
    /// image) are transformed channel by channel.
    fn transform_in_nhwc<T: Float>(&self, x: &[T], t0: usize, nt: usize, tb: usize, v: &mut [T]) {
        let (c, h, w) = (self.c, self.h as isize, self.w as isize);
        let zeros = vec![T::of(0.0); c];
        let mut t = vec![T::of(0.0); 16 * c];
        for j in 0..nt {
            let (img, ty, tx) = self.tile(t0 + j);
            let y0 = (2 * ty) as isize - self.pt;
            let x0 = (2 * tx) as isize - self.pl;
            let px = |i: usize, q: usize| -> &[T] {
                let (yy, xx) = (y0 + i as isize, x0 + q as isize);
                if yy >= 0 && xx >= 0 && yy < h && xx < w {
                    let at = ((img * self.h + yy as usize) * self.w + xx as usize) * c;
                    &x[at..at + c]
                } else {
                    &zeros
                }
            };
            // t = B^T d, row i of t for column q at t[(i * 4 + q) * c..].
            for q in 0..4 {
                let (d0, d1, d2, d3) = (px(0, q), px(1, q), px(2, q), px(3, q));
                let rows = [
                    (d0, d2, false),
                    (d1, d2, true),
                    (d2, d1, false),
                    (d1, d3, false),
                ];
                for (i, (p, r, add)) in rows.into_iter().enumerate() {
                    let o = &mut t[(i * 4 + q) * c..(i * 4 + q + 1) * c];
                    combine(o, p, r, add);
                }
            }
            // v = t B, per row i of t.
            for i in 0..4 {
                let r = &t[i * 4 * c..(i + 1) * 4 * c];
                let (a0, rest) = r.split_at(c);
                let (a1, rest) = rest.split_at(c);
                let (a2, a3) = rest.split_at(c);
                let cols = [
                    (a0, a2, false),
                    (a1, a2, true),
                    (a2, a1, false),
                    (a1, a3, false),
                ];
                for (q, (p, r, add)) in cols.into_iter().enumerate() {
                    let at = (i * 4 + q) * tb * c + j * c;
                    combine(&mut v[at..at + c], p, r, add);
                }
            }
        }
    }

    /// Writes the outputs of tiles `t0..t0 + nt` from their sums `m`
    /// (NCHW `M[xi][k][j]`, NHWC `M[xi][j][k]`).
    ///
    /// # Safety
    /// No other thread touches these tiles' outputs meanwhile.
    unsafe fn transform_out<T: Float>(&self, m: &[T], t0: usize, nt: usize, tb: usize, y: YPtr<T>) {
        let k = self.k;
        let geo: Vec<(usize, usize, usize)> = (0..nt).map(|j| self.tile(t0 + j)).collect();
        let one = |j: usize, kk: usize, s: &[T; 16]| {
            let (img, ty, tx) = geo[j];
            let (oy, ox) = (2 * ty, 2 * tx);
            let rows = 2.min(self.oh - oy);
            let cols = 2.min(self.ow - ox);
            let o = output_tile(s);
            for (i, row) in o.iter().enumerate().take(rows) {
                for (jj, &val) in row.iter().enumerate().take(cols) {
                    let (yy, xx) = (oy + i, ox + jj);
                    let at = if self.nhwc {
                        ((img * self.oh + yy) * self.ow + xx) * k + kk
                    } else {
                        ((img * k + kk) * self.oh + yy) * self.ow + xx
                    };
                    // SAFETY: the caller's contract (this tile's outputs).
                    unsafe { y.put(at, val) };
                }
            }
        };
        let mut s = [T::of(0.0); 16];
        if self.nhwc {
            for j in 0..nt {
                for kk in 0..k {
                    for (xi, e) in s.iter_mut().enumerate() {
                        *e = m[xi * tb * k + j * k + kk];
                    }
                    one(j, kk, &s);
                }
            }
        } else {
            for kk in 0..k {
                for j in 0..nt {
                    for (xi, e) in s.iter_mut().enumerate() {
                        *e = m[xi * tb * k + kk * tb + j];
                    }
                    one(j, kk, &s);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The correlation by its definition, in float64.
    fn direct(p: &Wino, x: &[f32], f: &[f32]) -> Vec<f64> {
        let (c, k) = (p.c, p.k);
        let mut y = vec![0.0f64; p.n * k * p.oh * p.ow];
        for n in 0..p.n {
            for kk in 0..k {
                for oy in 0..p.oh {
                    for ox in 0..p.ow {
                        let mut s = 0.0f64;
                        for cc in 0..c {
                            for a in 0..3 {
                                for b in 0..3 {
                                    let iy = oy as isize + a as isize - p.pt;
                                    let ix = ox as isize + b as isize - p.pl;
                                    if iy < 0 || ix < 0 || iy >= p.h as isize || ix >= p.w as isize
                                    {
                                        continue;
                                    }
                                    let (iy, ix) = (iy as usize, ix as usize);
                                    let xi = if p.nhwc {
                                        ((n * p.h + iy) * p.w + ix) * c + cc
                                    } else {
                                        ((n * c + cc) * p.h + iy) * p.w + ix
                                    };
                                    s += x[xi] as f64 * f[((kk * c + cc) * 3 + a) * 3 + b] as f64;
                                }
                            }
                        }
                        let yi = if p.nhwc {
                            ((n * p.oh + oy) * p.ow + ox) * k + kk
                        } else {
                            ((n * k + kk) * p.oh + oy) * p.ow + ox
                        };
                        y[yi] = s;
                    }
                }
            }
        }
        y
    }

    /// A small deterministic generator (values in -1..1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_the_direct_correlation_at_edge_shapes() {
        let mut seed = 1;
        // (n, c, k, h, w, pt, pl, bottom pad, right pad): odd and even
        // sizes, images smaller than a tile, pads 0..2 on each side and
        // negative offsets (a transposed conv's pads above 2), many
        // channels, and enough tiles for several blocks.
        let cases: &[(
            usize,
            usize,
            usize,
            usize,
            usize,
            isize,
            isize,
            isize,
            isize,
        )] = &[
            (1, 1, 1, 3, 3, 0, 0, 0, 0),
            (1, 1, 1, 1, 1, 1, 1, 1, 1),
            (2, 3, 2, 1, 5, 1, 2, 1, 0),
            (1, 2, 3, 5, 4, 2, 2, 2, 2),
            (3, 4, 5, 7, 6, 1, 1, 1, 1),
            (1, 5, 4, 6, 9, 0, 1, 2, 0),
            (2, 3, 3, 8, 8, -1, -1, -1, -1),
            (1, 70, 65, 5, 7, 1, 1, 1, 1),
            (2, 8, 9, 33, 31, 1, 0, 1, 2),
        ];
        for &(n, c, k, h, w, pt, pl, pb, pr) in cases {
            let oh = (h as isize + pt + pb - 2) as usize;
            let ow = (w as isize + pl + pr - 2) as usize;
            for nhwc in [false, true] {
                let p = Wino {
                    n,
                    c,
                    k,
                    h,
                    w,
                    oh,
                    ow,
                    pt,
                    pl,
                    nhwc,
                };
                seed += 1;
                let x = values(n * c * h * w, seed);
                let f = values(k * c * 9, seed + 100);
                let mut y = vec![f32::NAN; n * k * oh * ow];
                p.run(
                    &x,
                    |kk, cc, a, b| f[((kk * c + cc) * 3 + a) * 3 + b],
                    &mut y,
                );
                let want = direct(&p, &x, &f);
                // Inputs in -1..1: the sum of 9c products is at most 9c;
                // Winograd's rounding stays within a few ulps of that.
                let tol = 1e-6 * (9 * c) as f64;
                for (i, (&got, &want)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (got as f64 - want).abs() <= tol,
                        "case {:?} nhwc {nhwc} at {i}: {got} vs {want}",
                        (n, c, k, h, w, pt, pl, pb, pr)
                    );
                }
            }
        }
    }
}
