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

/// `e[q] = src[2q]`, `o[q] = src[2q + 1]`, on local arrays: in this form
/// the compiler makes vector loads and permutes (writing into a row of a
/// larger buffer, or with two shifts more, it left scalar code).
#[inline(always)]
fn deinterleave<T: Float>(src: &[T; 2 * LANES], e: &mut [T; LANES], o: &mut [T; LANES]) {
    for q in 0..LANES {
        e[q] = src[2 * q];
        o[q] = src[2 * q + 1];
    }
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
        // (16 x tb x K), rows `ts` apart (`Wino::stride`): transform_in
        // writes the nt tiles' columns the products read, the products
        // (beta 0) write M's without reading them. NCHW's output
        // transform also reads the padding after a row of M (lanes whose
        // values it does not write out).
        let ts = self.stride(tb);
        let scratch_len = 16 * ts * (c + k);
        let one = |v: &mut [T], m: &mut [T], b: usize| -> Result<()> {
            let t0 = b * tb;
            let nt = tb.min(tiles - t0);
            self.transform_in(x, t0, nt, ts, v)?;
            for xi in 0..16 {
                let ux = &u[xi * c..];
                let vx = &v[xi * ts * c..(xi + 1) * ts * c];
                let mx = &mut m[xi * ts * k..(xi + 1) * ts * k];
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
                        (ts, 1),
                        T::of(0.0),
                        mx,
                        (ts, 1),
                    );
                }
            }
            // SAFETY: block b writes only the outputs of its tiles
            // t0..t0 + nt, which no other block writes.
            unsafe { self.transform_out(m, t0, nt, ts, yp) };
            Ok(())
        };
        // Runs the blocks not yet claimed, in this thread's scratch (kept
        // between calls: `crate::scratch`).
        let next = std::sync::atomic::AtomicUsize::new(0);
        let run_blocks = || {
            crate::scratch::with_scratch::<T, _>(scratch_len, WHAT, |s| {
                let (v, m) = s.split_at_mut(16 * ts * c);
                loop {
                    let b = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if b >= blocks {
                        return Ok(());
                    }
                    one(v, m, b)?;
                }
            })?
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
    /// (`tb` the stride of V's rows: the block's capacity in tiles, and in
    /// NCHW a chunk of padding, [`Wino::stride`]).
    fn transform_in<T: Float>(
        &self,
        x: &[T],
        t0: usize,
        nt: usize,
        tb: usize,
        v: &mut [T],
    ) -> Result<()> {
        if self.nhwc {
            self.transform_in_nhwc(x, t0, nt, tb, v);
            Ok(())
        } else {
            self.transform_in_nchw(x, t0, nt, tb, v)
        }
    }

    /// NCHW: a run of tiles along one tile row at a time, in three
    /// passes over the run's channels, each reading what an earlier pass
    /// wrote well before (a vector load right after the smaller stores
    /// that wrote it waits for them): the 4 input rows of every channel
    /// are copied into zero-padded rows (no read checks the image's
    /// edges); each padded row is split into its even and odd columns;
    /// then, a chunk of [`LANES`] tiles at a time, B^T combines the 4 rows
    /// and B each tile's columns (tile q reads even columns q and q + 1 and
    /// odd columns q and q + 1: the split rows and the same one element
    /// on), elementwise on local arrays the compiler keeps in vector
    /// registers. Every chunk is whole (a run of 28 tiles is two), where
    /// a loop over 28 left 12 to scalar code: the lanes past the run
    /// compute values nothing reads, written into the padding that `tb`
    /// (the stride of V's rows, [`Wino::stride`]) leaves after the
    /// block's tiles, or into the next run's columns before that run
    /// writes them. The same operations as before, so the same bits.
    fn transform_in_nchw<T: Float>(
        &self,
        x: &[T],
        t0: usize,
        nt: usize,
        tb: usize,
        v: &mut [T],
    ) -> Result<()> {
        // A padded row: 2 columns per tile of the longest run in whole
        // chunks, and a chunk more for the reads one pair to the right;
        // the padded rows and their splits in this thread's scratch.
        let (_, tw) = self.tiles();
        let row_len = 2 * (tw.div_ceil(LANES) * LANES + LANES);
        let rows = self.c * 4 * row_len;
        crate::scratch::with_scratch::<T, _>(2 * rows, WHAT, |s| {
            let (padded, split) = s.split_at_mut(rows);
            crate::vmath::wide(
                #[inline(always)]
                || self.transform_in_nchw_body(x, t0, nt, tb, v, row_len, padded, split),
            )
        })
    }

    /// [`Wino::transform_in_nchw`], compiled into each vector width
    /// (`padded` and `split`: `c * 4` rows of `row_len` each, of any
    /// contents: every element read is written first).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn transform_in_nchw_body<T: Float>(
        &self,
        x: &[T],
        t0: usize,
        nt: usize,
        tb: usize,
        v: &mut [T],
        row_len: usize,
        padded: &mut [T],
        split: &mut [T],
    ) {
        let (c, h, w) = (self.c, self.h as isize, self.w as isize);
        let (_, tw) = self.tiles();
        let zero = T::of(0.0);
        let plane = self.h * self.w;
        let plane_v = tb * c;
        let half = row_len / 2;
        // The zeros of the padded rows: written (around each row's copy)
        // at the first run and whenever a run's columns or rows inside the
        // image differ from the last one's.
        let mut zeroed = None;
        let mut j = 0;
        while j < nt {
            let (img, ty, tx0) = self.tile(t0 + j);
            let run = (tw - tx0).min(nt - j);
            // The tiles computed, in whole chunks.
            let outs = run.div_ceil(LANES) * LANES;
            let y0 = (2 * ty) as isize - self.pt;
            let xs = (2 * tx0) as isize - self.pl;
            // Columns xs + lo .. xs + hi of a row are inside the image
            // (and of the run: tile q reads columns 2q .. 2q + 3).
            let end = (2 * run + 2) as isize;
            let lo = (-xs).clamp(0, end) as usize;
            let hi = (w - xs).clamp(lo as isize, end) as usize;
            // The run's 4 input rows of every channel, zero outside the
            // image, all copied before any is read (a load right after
            // the copy that wrote it waited for it). The zeros around them
            // stay from the last run with the same columns and rows inside
            // the image.
            let inside: [bool; 4] =
                std::array::from_fn(|i| (0..h).contains(&(y0 + i as isize)) && hi > lo);
            let pairs = (outs + 1).div_ceil(LANES) * LANES;
            let fresh = zeroed != Some((lo, hi, pairs, inside));
            zeroed = Some((lo, hi, pairs, inside));
            for cc in 0..c {
                let xc = &x[(img * c + cc) * plane..(img * c + cc + 1) * plane];
                for (i, &inn) in inside.iter().enumerate() {
                    let p = &mut padded[(cc * 4 + i) * row_len..][..2 * pairs];
                    if fresh {
                        if inn {
                            p[..lo].fill(zero);
                            p[hi..].fill(zero);
                        } else {
                            p.fill(zero);
                        }
                    }
                    if inn {
                        let r = (y0 + i as isize) as usize * self.w + (xs + lo as isize) as usize;
                        p[lo..hi].copy_from_slice(&xc[r..r + (hi - lo)]);
                    }
                }
            }
            // Each padded row's even and odd columns (`half` apart), for
            // whole chunks of pairs: the run's, and one pair more.
            for (p, eo) in padded
                .chunks_exact(row_len)
                .zip(split.chunks_exact_mut(row_len))
            {
                let (e, o) = eo.split_at_mut(half);
                let chunks = p[..2 * pairs].chunks_exact(2 * LANES);
                let outs = e[..pairs]
                    .chunks_exact_mut(LANES)
                    .zip(o[..pairs].chunks_exact_mut(LANES));
                for (src, (ec, oc)) in chunks.zip(outs) {
                    deinterleave(
                        src.try_into().expect("a chunk"),
                        ec.try_into().expect("a chunk"),
                        oc.try_into().expect("a chunk"),
                    );
                }
            }
            for cc in 0..c {
                let rows = &split[cc * 4 * row_len..(cc + 1) * 4 * row_len];
                let base = cc * tb + j;
                for q0 in (0..outs).step_by(LANES) {
                    // cols[i][s]: row i's columns 2(q0 + q) + s, s = 0..4
                    // (even, odd, and both one pair on): plain loads of
                    // the split rows.
                    let mut cols = [[[zero; LANES]; 4]; 4];
                    for (i, out) in cols.iter_mut().enumerate() {
                        let at = i * row_len + q0;
                        for (sft, o) in out.iter_mut().enumerate() {
                            let from = at + (sft & 1) * half + (sft >> 1);
                            o.copy_from_slice(&rows[from..from + LANES]);
                        }
                    }
                    // t = B^T d across the rows (t[i][s]: combination i
                    // of the rows' columns s).
                    let mut t = [[[zero; LANES]; 4]; 4];
                    for sft in 0..4 {
                        let d = |i: usize| &cols[i][sft];
                        for q in 0..LANES {
                            t[0][sft][q] = d(0)[q] - d(2)[q];
                            t[1][sft][q] = d(1)[q] + d(2)[q];
                            t[2][sft][q] = d(2)[q] - d(1)[q];
                            t[3][sft][q] = d(1)[q] - d(3)[q];
                        }
                    }
                    // V = t B across each tile's columns.
                    let mut vals = [[zero; LANES]; 16];
                    for (i, ti) in t.iter().enumerate() {
                        let [e0, o0, e1, o1] = ti;
                        for q in 0..LANES {
                            vals[4 * i][q] = e0[q] - e1[q];
                            vals[4 * i + 1][q] = o0[q] + e1[q];
                            vals[4 * i + 2][q] = e1[q] - o0[q];
                            vals[4 * i + 3][q] = o0[q] - o1[q];
                        }
                    }
                    for (xi, vx) in vals.iter().enumerate() {
                        let at = xi * plane_v + base + q0;
                        v[at..at + LANES].copy_from_slice(vx);
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
    /// (NCHW `M[xi][k][j]`, NHWC `M[xi][j][k]`; rows `tb` apart,
    /// [`Wino::stride`]).
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
    /// contiguous vectors (`M[xi][k][j]`, rows `tb` apart), so A^T m A is
    /// elementwise over the run, then each output row's even and odd
    /// columns interleave. The same operations in the same order as
    /// [`output_tile`], over whole chunks of [`LANES`] tiles (the lanes
    /// past the run read the padding after a row of M and are not
    /// written out).
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
                for q0 in (0..run).step_by(LANES) {
                    let chunk = |xi: usize| -> &[T; LANES] {
                        let at = xi * plane_m + base + q0;
                        m[at..at + LANES].try_into().expect("a chunk")
                    };
                    // Listed, not `array::from_fn`: that call was not
                    // inlined, and the loads after it waited for its stores.
                    let ms = [
                        chunk(0),
                        chunk(1),
                        chunk(2),
                        chunk(3),
                        chunk(4),
                        chunk(5),
                        chunk(6),
                        chunk(7),
                        chunk(8),
                        chunk(9),
                        chunk(10),
                        chunk(11),
                        chunk(12),
                        chunk(13),
                        chunk(14),
                        chunk(15),
                    ];
                    let mut out = [[zero; LANES]; 4];
                    for q in 0..LANES {
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
                    let w0 = 2 * q0;
                    let len = (cols - w0).min(2 * LANES);
                    let put = |row: &mut [T], a: &[T; LANES], b: &[T; LANES]| {
                        let mut both = [zero; 2 * LANES];
                        for q in 0..LANES {
                            both[2 * q] = a[q];
                            both[2 * q + 1] = b[q];
                        }
                        row[w0..w0 + len].copy_from_slice(&both[..len]);
                    };
                    put(r0, &out[0], &out[1]);
                    if let Some(r1) = r1.as_deref_mut() {
                        put(r1, &out[2], &out[3]);
                    }
                }
            }
            j += run;
        }
    }

    /// The stride of V's and M's rows for blocks of `tb` tiles: NCHW's
    /// transforms run whole chunks of [`LANES`] tiles, whose last one may
    /// reach up to `LANES - 1` columns past the block's tiles.
    fn stride(&self, tb: usize) -> usize {
        if self.nhwc {
            tb
        } else {
            tb + LANES
        }
    }
}

/// Elements per chunk of NCHW's transforms (16 float32 fill an AVX-512
/// register; narrower vectors run a chunk as several).
const LANES: usize = 16;

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
