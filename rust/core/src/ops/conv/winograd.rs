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

use crate::error::Result;
use crate::num::Float;
use crate::ops::gemm::product;

/// What the buffers below are called in an out-of-memory error.
const WHAT: &str = "a Winograd convolution's transformed tiles";

/// `n` zeros in a fallibly allocated buffer, filled in place (not
/// `calloc`, which [`crate::tensor::default_buffer`] uses): the filters'
/// transforms, made at every run. The blocks' transformed tiles run in
/// per-thread scratch kept between runs (`crate::scratch`; BENCHMARKS.md
/// "Zeroed buffers, Conv's bias, Concat and Winograd's scratch on the
/// pool").
fn zeros<T: Float>(n: usize) -> Result<Vec<T>> {
    let mut v = crate::tensor::try_vec(n, WHAT)?;
    v.resize(n, T::of(0.0));
    Ok(v)
}
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

    /// Elements `at..at + len` as a slice.
    ///
    /// # Safety
    /// No other thread reads or writes these elements while it lives.
    #[inline(always)]
    unsafe fn slice<'a>(self, at: usize, len: usize) -> &'a mut [T] {
        assert!(at + len <= self.1, "winograd: output range out of bounds");
        // SAFETY: in bounds (checked); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), len) }
    }
}

/// `e[q] = row[xs + 2q]`, `o[q] = row[xs + 2q + 1]` (zero where the
/// column is outside the row): a row's even and odd columns from `xs` on.
#[inline(always)]
fn split_row<T: Float>(row: &[T], xs: isize, e: &mut [T], o: &mut [T]) {
    let w = row.len() as isize;
    let len = e.len();
    let zero = T::of(0.0);
    // Pairs whose both columns are inside the row: qlo..qhi.
    let qlo = ((-xs).max(0) as usize).div_ceil(2).min(len);
    let qhi = if w - 1 - xs <= 0 {
        0
    } else {
        ((w - 1 - xs) as usize).div_ceil(2).min(len)
    }
    .max(qlo);
    let col = |c: isize| {
        if c >= 0 && c < w {
            row[c as usize]
        } else {
            zero
        }
    };
    for q in (0..qlo).chain(qhi..len) {
        let c = xs + 2 * q as isize;
        e[q] = col(c);
        o[q] = col(c + 1);
    }
    if qhi > qlo {
        let start = (xs + 2 * qlo as isize) as usize;
        let src = &row[start..start + 2 * (qhi - qlo)];
        for ((pair, e), o) in src
            .chunks_exact(2)
            .zip(&mut e[qlo..qhi])
            .zip(&mut o[qlo..qhi])
        {
            *e = pair[0];
            *o = pair[1];
        }
    }
}

/// Four slices of `len` elements of `v`, `stride` apart from `base`.
#[inline(always)]
fn four_mut<T>(v: &mut [T], base: usize, stride: usize, len: usize) -> [&mut [T]; 4] {
    let (a, rest) = v[base..].split_at_mut(stride);
    let (b, rest) = rest.split_at_mut(stride);
    let (c, d) = rest.split_at_mut(stride);
    [&mut a[..len], &mut b[..len], &mut c[..len], &mut d[..len]]
}

/// Tiles per block: enough that the GEMMs run near full speed, few enough
/// that the transformed input and sums (16 x tiles x channels) stay near
/// the cache, and, with several pool threads, a whole number of blocks per
/// thread, all of about one size (784 tiles on two threads: four blocks
/// of 196, not 256, 256, 256 and 16, which left one thread idle a third
/// of the time).
fn block_tiles(tiles: usize, c: usize, k: usize, threads: usize) -> usize {
    let cap = ((1usize << 18) / (16 * c.max(k).max(1))).clamp(64, 512);
    let mut blocks = tiles.div_ceil(cap).max(1);
    if threads > 1 && tiles >= 16 * threads {
        blocks = blocks.div_ceil(threads) * threads;
    }
    tiles.div_ceil(blocks).max(1)
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
    ) -> Result<()> {
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
            return Ok(());
        }
        if c == 0 {
            y.fill(T::of(0.0));
            return Ok(());
        }
        let threads = if crate::threads::pool_available() {
            rayon::current_num_threads()
        } else {
            1
        };
        // U[k][xi][c]: filter row k's 16 transformed values per channel.
        let mut u: Vec<T> = zeros(16 * k * c)?;
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
        // A block's transformed tiles V (16 x tb x C) and their products M
        // (16 x tb x K), each written before it is read: transform_in
        // writes the nt tiles' columns the products read, the products
        // (beta 0) write M without reading it.
        let scratch_len = 16 * tb * (c + k);
        let one = |v: &mut [T], m: &mut [T], b: usize| {
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
        // Runs the blocks not yet claimed, in this thread's scratch (kept
        // between calls: `crate::scratch`).
        let next = std::sync::atomic::AtomicUsize::new(0);
        let run_blocks = || {
            crate::scratch::with_scratch::<T, _>(scratch_len, WHAT, |s| {
                let (v, m) = s.split_at_mut(16 * tb * c);
                loop {
                    let b = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if b >= blocks {
                        return;
                    }
                    one(v, m, b);
                }
            })
        };
        if threads > 1 && blocks > 1 {
            // One task per thread, each claiming blocks until none is left
            // (rayon's `*_init` made a scratch for every piece its
            // splitting cut).
            (0..threads.min(blocks))
                .into_par_iter()
                .try_for_each(|_| run_blocks())
        } else {
            run_blocks()
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

    /// NCHW: a run of tiles along one tile row at a time. Each of the 4
    /// input rows of the run is split into its even and odd columns, so
    /// that B^T (across the rows) and B (across each tile's columns: tile
    /// q reads even columns q and q + 1 and odd columns q and q + 1) are
    /// elementwise operations on contiguous vectors.
    fn transform_in_nchw<T: Float>(&self, x: &[T], t0: usize, nt: usize, tb: usize, v: &mut [T]) {
        crate::vmath::wide(
            #[inline(always)]
            || self.transform_in_nchw_body(x, t0, nt, tb, v),
        )
    }

    /// [`Wino::transform_in_nchw`], compiled into each vector width.
    #[inline(always)]
    fn transform_in_nchw_body<T: Float>(
        &self,
        x: &[T],
        t0: usize,
        nt: usize,
        tb: usize,
        v: &mut [T],
    ) {
        let (c, h) = (self.c, self.h as isize);
        let (_, tw) = self.tiles();
        let zero = T::of(0.0);
        let plane = self.h * self.w;
        let plane_v = tb * c;
        let half = tw + 1;
        // Even and odd columns of the 4 input rows, then of B^T d's rows.
        let mut e = vec![zero; 4 * half];
        let mut o = vec![zero; 4 * half];
        let mut te = vec![zero; 4 * half];
        let mut to = vec![zero; 4 * half];
        let mut j = 0;
        while j < nt {
            let (img, ty, tx0) = self.tile(t0 + j);
            let run = (tw - tx0).min(nt - j);
            let len = run + 1;
            let y0 = (2 * ty) as isize - self.pt;
            let xs = (2 * tx0) as isize - self.pl;
            for cc in 0..c {
                let xc = &x[(img * c + cc) * plane..(img * c + cc + 1) * plane];
                for i in 0..4 {
                    let ei = &mut e[i * half..i * half + len];
                    let oi = &mut o[i * half..i * half + len];
                    let yy = y0 + i as isize;
                    if yy < 0 || yy >= h {
                        ei.fill(zero);
                        oi.fill(zero);
                    } else {
                        let r = yy as usize * self.w;
                        split_row(&xc[r..r + self.w], xs, ei, oi);
                    }
                }
                for (src, dst) in [(&e, &mut te), (&o, &mut to)] {
                    let (r0, r1, r2, r3) = (
                        &src[..len],
                        &src[half..half + len],
                        &src[2 * half..2 * half + len],
                        &src[3 * half..3 * half + len],
                    );
                    let [u0, u1, u2, u3] = four_mut(dst, 0, half, len);
                    for q in 0..len {
                        u0[q] = r0[q] - r2[q];
                        u1[q] = r1[q] + r2[q];
                        u2[q] = r2[q] - r1[q];
                        u3[q] = r1[q] - r3[q];
                    }
                }
                for i in 0..4 {
                    let ev = &te[i * half..i * half + len];
                    let od = &to[i * half..i * half + len];
                    let base = (i * 4) * plane_v + cc * tb + j;
                    let [v0, v1, v2, v3] = four_mut(v, base, plane_v, run);
                    for q in 0..run {
                        v0[q] = ev[q] - ev[q + 1];
                        v1[q] = od[q] + ev[q + 1];
                        v2[q] = ev[q + 1] - od[q];
                        v3[q] = od[q] - od[q + 1];
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
        if !self.nhwc {
            // SAFETY: forwarded (this block's tiles only).
            return unsafe { self.transform_out_nchw(m, t0, nt, tb, y) };
        }
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
                    let at = ((img * self.oh + yy) * self.ow + xx) * k + kk;
                    // SAFETY: the caller's contract (this tile's outputs).
                    unsafe { y.put(at, val) };
                }
            }
        };
        let mut s = [T::of(0.0); 16];
        for j in 0..nt {
            for kk in 0..k {
                for (xi, e) in s.iter_mut().enumerate() {
                    *e = m[xi * tb * k + j * k + kk];
                }
                one(j, kk, &s);
            }
        }
    }

    /// NCHW's output transform, a run of tiles along one tile row at a
    /// time: for each output channel the 16 sums of the run's tiles are
    /// contiguous vectors (`M[xi][k][j]`), so A^T m A is elementwise over
    /// the run, then each output row's even and odd columns interleave.
    /// The same operations in the same order as [`output_tile`].
    ///
    /// # Safety
    /// As [`Wino::transform_out`].
    unsafe fn transform_out_nchw<T: Float>(
        &self,
        m: &[T],
        t0: usize,
        nt: usize,
        tb: usize,
        y: YPtr<T>,
    ) {
        crate::vmath::wide(
            #[inline(always)]
            // SAFETY: forwarded.
            || unsafe { self.transform_out_nchw_body(m, t0, nt, tb, y) },
        )
    }

    /// [`Wino::transform_out_nchw`], compiled into each vector width.
    ///
    /// # Safety
    /// As [`Wino::transform_out`].
    #[inline(always)]
    unsafe fn transform_out_nchw_body<T: Float>(
        &self,
        m: &[T],
        t0: usize,
        nt: usize,
        tb: usize,
        y: YPtr<T>,
    ) {
        const CHUNK: usize = 64;
        let k = self.k;
        let (_, tw) = self.tiles();
        let plane_m = tb * k;
        let zero = T::of(0.0);
        let mut j = 0;
        while j < nt {
            let (img, ty, tx0) = self.tile(t0 + j);
            let run = (tw - tx0).min(nt - j);
            let (oy, ox0) = (2 * ty, 2 * tx0);
            let rows = 2.min(self.oh - oy);
            let cols = (2 * run).min(self.ow - ox0);
            for kk in 0..k {
                let at = ((img * k + kk) * self.oh + oy) * self.ow + ox0;
                // SAFETY: output rows oy, oy + 1, columns ox0.. of this
                // run's tiles: this block's alone (the caller's contract).
                let r0 = unsafe { y.slice(at, cols) };
                let mut r1 = if rows > 1 {
                    // SAFETY: as above.
                    Some(unsafe { y.slice(at + self.ow, cols) })
                } else {
                    None
                };
                let base = kk * tb + j;
                let mut c0 = 0;
                while c0 < run {
                    let cn = CHUNK.min(run - c0);
                    let ms: [&[T]; 16] =
                        std::array::from_fn(|xi| &m[xi * plane_m + base + c0..][..cn]);
                    let mut out = [[zero; CHUNK]; 4];
                    for q in 0..cn {
                        let g = |xi: usize| ms[xi][q];
                        let t00 = g(0) + g(4) + g(8);
                        let t01 = g(1) + g(5) + g(9);
                        let t02 = g(2) + g(6) + g(10);
                        let t03 = g(3) + g(7) + g(11);
                        let t10 = g(4) - g(8) - g(12);
                        let t11 = g(5) - g(9) - g(13);
                        let t12 = g(6) - g(10) - g(14);
                        let t13 = g(7) - g(11) - g(15);
                        out[0][q] = t00 + t01 + t02;
                        out[1][q] = t01 - t02 - t03;
                        out[2][q] = t10 + t11 + t12;
                        out[3][q] = t11 - t12 - t13;
                    }
                    let w0 = 2 * c0;
                    let pairs = cn.min((cols - w0) / 2);
                    let odd = pairs < cn && w0 + 2 * pairs < cols;
                    let put = |row: &mut [T], a: &[T; CHUNK], b: &[T; CHUNK]| {
                        for (q, d) in row[w0..w0 + 2 * pairs].chunks_exact_mut(2).enumerate() {
                            d[0] = a[q];
                            d[1] = b[q];
                        }
                        if odd {
                            row[w0 + 2 * pairs] = a[pairs];
                        }
                    };
                    put(r0, &out[0], &out[1]);
                    if let Some(r1) = r1.as_deref_mut() {
                        put(r1, &out[2], &out[3]);
                    }
                    c0 += cn;
                }
            }
            j += run;
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
                )
                .unwrap();
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
