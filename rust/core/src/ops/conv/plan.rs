//! The products of a convolution: the forward product, its adjoint and
//! the filter gradient of one op on a batch (`Plan`), each an im2col and a
//! GEMM (`ops::gemm`) per image and group, or Winograd (`winograd.rs`)
//! where it pays; images on the kernel pool, or blocks of one large image.

#![allow(clippy::result_large_err, clippy::too_many_arguments)]

use super::im2col::*;
use super::window::*;
use super::winograd::Wino;
use crate::error::Result;
use crate::num::Float;
use crate::ops::gemm::product;
use crate::ops::kit::Order;
use crate::tensor::DataType;
use rayon::prelude::*;

// ------------------------------------------------------------ the products --

/// One convolution's shapes. The filter's rows are the `cout` channels of
/// the col side (Conv's output, ConvTranspose's input); its columns, per
/// group, the `cin / group` channels of the image side times the window.
pub(crate) struct Plan {
    pub(crate) g: Geo,
    pub(crate) group: usize,
    pub(crate) cin: usize,
    pub(crate) cout: usize,
    pub(crate) order: Order,
    /// Split each product across the kernel pool (when the images are not).
    pub(crate) par: bool,
}

impl Plan {
    pub(crate) fn cg(&self) -> usize {
        self.cin / self.group
    }
    pub(crate) fn mg(&self) -> usize {
        self.cout / self.group
    }
    pub(crate) fn rows(&self) -> usize {
        self.cg() * self.g.ksize()
    }
    pub(crate) fn img_len(&self) -> usize {
        self.cin * self.g.in_len()
    }
    pub(crate) fn col_len(&self) -> usize {
        self.cout * self.g.out_len()
    }
    /// Elements of the window matrix of one image.
    fn col_len_full(&self) -> Result<usize> {
        crate::tensor::size_mul(self.rows(), self.g.out_len(), || {
            "the window matrix of a convolution".to_string()
        })
    }
    /// Elements of the window matrix of the widest of [`Plan::line_blocks`].
    fn col_len_lines(&self) -> usize {
        let widest = self
            .line_blocks()
            .map(|(l0, l1)| l1 - l0)
            .max()
            .unwrap_or(0);
        self.rows() * widest * self.g.outs[2]
    }
    /// Blocks of output lines (pairs of the first two output dims) whose
    /// window matrix has about `COL_BLOCK` elements (at least `MIN_COLS`
    /// columns, at least one line).
    pub(crate) fn line_blocks(&self) -> impl Iterator<Item = (usize, usize)> {
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
    /// [`Plan::line_blocks`] for one image whose blocks go to `threads`
    /// pool threads: a whole number of blocks per thread, of about one
    /// size (fewer, larger blocks than `line_blocks` gives; its own blocks
    /// when it gives fewer than the threads). ResNet-50's and VGG-19's
    /// 28x28 layers made three blocks, so one of two threads did two of
    /// them and the other waited (1.1-1.2x faster now: BENCHMARKS.md
    /// "Winograd on large images").
    pub(crate) fn par_line_blocks(&self, threads: usize) -> Vec<(usize, usize)> {
        let lines = self.g.outs[0] * self.g.outs[1];
        let threads = threads.max(1);
        let nb = self.line_blocks().count();
        if nb < threads {
            // One block: the caller splits the product itself; a few:
            // each its own.
            return self.line_blocks().collect();
        }
        let nb = nb / threads * threads;
        let step = lines.div_ceil(nb.max(1)).max(1);
        (0..lines)
            .step_by(step)
            .map(|l0| (l0, (l0 + step).min(lines)))
            .collect()
    }
    /// Multiply-adds of one image's product.
    pub(crate) fn macs(&self) -> usize {
        self.cout
            .saturating_mul(self.rows())
            .saturating_mul(self.g.out_len())
    }

    /// The col side of one image: out = W * im2col(img).
    pub(crate) fn fwd<T: Float>(
        &self,
        img: &[T],
        w: &[T],
        out: &mut [T],
        col: &mut Vec<T>,
    ) -> Result<()> {
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
                            .par_line_blocks(rayon::current_num_threads())
                            .into_iter()
                            .map(|(l0, l1)| (l0 * o2, l1 * o2))
                            .collect();
                        if bounds.len() > 1 {
                            crate::ops::gemm::par_column_blocks(
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
                    let col = col_of(col, self.col_len_lines())?;
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
                        let col = col_of(col, self.col_len_full()?)?;
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
    pub(crate) fn adj<T: Float>(
        &self,
        cs: &[T],
        w: &[T],
        img: &mut [T],
        col: &mut Vec<T>,
    ) -> Result<()> {
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
                        let col = col_of(col, self.col_len_full()?)?;
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

    /// Images per batch for [`run_fwd`], [`run_adj`] and [`weight_grad`]
    /// (1: image by image). NCHW images whose output is narrower than a
    /// GEMM runs at full speed (fewer than `MIN_COLS` pixels) go through
    /// one window matrix per batch, the images' columns side by side
    /// (about `2 * MIN_COLS` columns, at most `COL_BLOCK` elements), so the
    /// product is one wide GEMM instead of one narrow GEMM per image:
    /// LeNet's 4x4 layer over 64 images (20 -> 50 channels) made 64
    /// products of 16 columns.
    pub(crate) fn image_batch(&self, n: usize) -> usize {
        let pix = self.g.out_len();
        // A 1x1 window (the image is its own window matrix) keeps its
        // per-image products: not measured batched.
        if self.order != Order::Nchw || n < 2 || pix == 0 || pix >= MIN_COLS || self.g.identity() {
            return 1;
        }
        let by_cols = (2 * MIN_COLS).div_ceil(pix);
        let by_cache = COL_BLOCK / (self.rows() * pix).max(1);
        by_cols.min(by_cache).min(n).max(1)
    }

    /// `fwd` of the `b` images of `imgs` into `outs` through one window
    /// matrix (see [`Plan::image_batch`]); `split`: split the product
    /// across the kernel pool.
    fn fwd_batch<T: Float>(
        &self,
        imgs: &[T],
        w: &[T],
        outs: &mut [T],
        b: usize,
        split: bool,
    ) -> Result<()> {
        let (mg, rows, cols) = (self.mg(), self.rows(), b * self.g.out_len());
        self.with_batch_scratch(b, |win, plane, col, r| {
            for g in 0..self.group {
                self.batch_windows(win, imgs, g, b, col, plane);
                let wg = &w[g * mg * rows..(g + 1) * mg * rows];
                product(
                    split,
                    mg,
                    rows,
                    cols,
                    wg,
                    (rows, 1),
                    col,
                    (cols, 1),
                    T::of(0.0),
                    r,
                    (cols, 1),
                );
                self.scatter_cols(r, g, b, outs);
            }
        })
    }

    /// Runs `f` with what a batch of `b` images needs (see
    /// [`Plan::image_batch`]): the offsets of their windows, a padded
    /// channel, scratch for the window matrix (`rows` x `b * P`) and for
    /// `mg` rows of `b * P` (the output's or the col side's columns).
    fn with_batch_scratch<T: Float>(
        &self,
        b: usize,
        f: impl FnOnce(&SmallWindows, &mut [T], &mut [T], &mut [T]),
    ) -> Result<()> {
        let (mg, rows, cols) = (self.mg(), self.rows(), b * self.g.out_len());
        let win = SmallWindows::new(&self.g);
        let mut plane = crate::tensor::default_buffer::<T>(win.plane_len(), "a padded image")?;
        crate::scratch::with_scratch::<T, _>(
            (rows + mg) * cols,
            "the window matrix of a batch of images",
            |s| {
                let (col, other) = s.split_at_mut(rows * cols);
                f(&win, &mut plane, col, other)
            },
        )
    }

    /// The window matrix of group `g` of the `b` images of `imgs`, their
    /// columns side by side in `col` (`rows` rows of `b * P`).
    fn batch_windows<T: Float>(
        &self,
        win: &SmallWindows,
        imgs: &[T],
        g: usize,
        b: usize,
        col: &mut [T],
        plane: &mut [T],
    ) {
        let (p, il, at) = (
            self.g.out_len(),
            self.img_len(),
            g * self.cg() * self.g.in_len(),
        );
        for i in 0..b {
            let src = &imgs[i * il + at..];
            win.im2col(&self.g, src, self.cg(), &mut col[i * p..], b * p, plane);
        }
    }

    /// The (image row, batch column) pairs of group `g`'s col side: for each
    /// of the `b` images and `mg` rows, the row's offset in the images'
    /// col sides and in a matrix of the images side by side.
    fn batch_rows(&self, g: usize, b: usize) -> impl Iterator<Item = (usize, usize)> {
        let (mg, p, ol) = (self.mg(), self.g.out_len(), self.col_len());
        (0..b)
            .flat_map(move |i| (0..mg).map(move |m| (i * ol + (g * mg + m) * p, m * b * p + i * p)))
    }

    /// Copies the col side of group `g` of the `b` images of `cs` side by
    /// side into `csb` (`mg` rows of `b * P`).
    fn gather_cols<T: Float>(&self, cs: &[T], g: usize, b: usize, csb: &mut [T]) {
        let p = self.g.out_len();
        for (at, to) in self.batch_rows(g, b) {
            csb[to..to + p].copy_from_slice(&cs[at..at + p]);
        }
    }

    /// The inverse of [`Plan::gather_cols`]: `r`'s columns back into the
    /// `b` images' col sides `outs`.
    fn scatter_cols<T: Float>(&self, r: &[T], g: usize, b: usize, outs: &mut [T]) {
        let p = self.g.out_len();
        for (at, from) in self.batch_rows(g, b) {
            outs[at..at + p].copy_from_slice(&r[from..from + p]);
        }
    }

    /// `adj` of the `b` images of `cs` into `imgs` through one window
    /// matrix (see [`Plan::image_batch`]).
    fn adj_batch<T: Float>(
        &self,
        cs: &[T],
        w: &[T],
        imgs: &mut [T],
        b: usize,
        split: bool,
    ) -> Result<()> {
        let (cg, mg, rows, p, pin) = (
            self.cg(),
            self.mg(),
            self.rows(),
            self.g.out_len(),
            self.g.in_len(),
        );
        let (il, cols) = (self.img_len(), b * p);
        imgs[..b * il].fill(T::of(0.0));
        self.with_batch_scratch(b, |win, plane, col, csb| {
            for g in 0..self.group {
                self.gather_cols(cs, g, b, csb);
                let wg = &w[g * mg * rows..(g + 1) * mg * rows];
                product(
                    split,
                    rows,
                    mg,
                    cols,
                    wg,
                    (1, rows),
                    csb,
                    (cols, 1),
                    T::of(0.0),
                    col,
                    (cols, 1),
                );
                for i in 0..b {
                    let dst = &mut imgs[i * il + g * cg * pin..];
                    win.col2im(&self.g, &col[i * p..], cg, dst, cols, plane);
                }
            }
        })
    }

    /// dW += the filter gradient of the `b` images of `imgs` and `cs`
    /// through one window matrix (see [`Plan::image_batch`]).
    fn wgrad_batch<T: Float>(
        &self,
        imgs: &[T],
        cs: &[T],
        dw: &mut [T],
        b: usize,
        split: bool,
    ) -> Result<()> {
        let (mg, rows, cols) = (self.mg(), self.rows(), b * self.g.out_len());
        self.with_batch_scratch(b, |win, plane, col, csb| {
            for g in 0..self.group {
                self.batch_windows(win, imgs, g, b, col, plane);
                self.gather_cols(cs, g, b, csb);
                product(
                    split,
                    mg,
                    cols,
                    rows,
                    csb,
                    (cols, 1),
                    col,
                    (1, cols),
                    T::of(1.0),
                    &mut dw[g * mg * rows..(g + 1) * mg * rows],
                    (rows, 1),
                );
            }
        })
    }

    /// Output pixels per block when one large image alone (NHWC, through a
    /// window matrix) splits its forward product across a pool of several
    /// threads: blocks of about `COL_BLOCK` elements of the window matrix,
    /// at least two per thread and at least `MIN_COLS` pixels. None: no
    /// split.
    pub(crate) fn pixel_blocks(&self) -> Option<usize> {
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
    pub(crate) fn channel_blocks(&self) -> Option<usize> {
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
    pub(crate) fn wgrad_nchw_split<T: Float>(
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
    /// `ops::gemm` does: the tests check it bitwise in float64).
    pub(crate) fn adj_nchw_blocks<T: Float>(
        &self,
        csg: &[T],
        wg: &[T],
        dst: &mut [T],
        col: &mut Vec<T>,
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
            run(
                0,
                cg,
                &mut dst[..cg * pin],
                col_of(col, self.col_len_lines())?,
            );
            Ok(())
        }
    }

    /// dW += cs * im2col(img)^T for one image.
    pub(crate) fn wgrad<T: Float>(
        &self,
        img: &[T],
        cs: &[T],
        dw: &mut [T],
        col: &mut Vec<T>,
    ) -> Result<()> {
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
                    let col = col_of(col, self.col_len_lines())?;
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
                        let col = col_of(col, self.col_len_full()?)?;
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
pub(crate) fn block_buffer<T: Float>(rows: usize, cols: usize) -> Result<Vec<T>> {
    let n = crate::tensor::size_mul(rows, cols, || "a block of a window matrix".to_string())?;
    crate::tensor::default_buffer(n, "a block of a window matrix")
}

/// Elements of a block of the window matrix (512 KiB of float32): small
/// enough to stay in the L2 cache between im2col and the product.
pub(crate) const COL_BLOCK: usize = 1 << 17;
/// The fewest columns of a block of the window matrix.
pub(crate) const MIN_COLS: usize = 256;

/// Images run on the kernel pool when there are several and the work
/// (multiply-adds) pays for the hand-off.
pub(crate) const PAR_MACS: usize = 1 << 20;

/// The first `len` elements of the window-matrix scratch `col`, which is
/// made (zeroed) when a path first needs it, at the size that path uses: a
/// line block's for NCHW, the whole image's for NHWC, none for a 1x1
/// convolution or an image split by the pool (which has its own blocks).
fn col_of<T: Float>(col: &mut Vec<T>, len: usize) -> Result<&mut [T]> {
    if col.len() < len {
        *col = crate::tensor::default_buffer(len, "the window matrix of a convolution")?;
    }
    Ok(&mut col[..len])
}

pub(crate) fn parallel(n: usize, macs_per_image: usize) -> bool {
    n > 1
        && macs_per_image.saturating_mul(n) >= PAR_MACS
        && crate::threads::pool_available()
        && rayon::current_num_threads() > 1
}

/// `f(src_i, dst_i, scratch)` for each image i (the scratch for
/// [`col_of`]: one per pool task, made when first needed).
pub(crate) fn per_image<T: Float>(
    plan: &Plan,
    n: usize,
    src: &[T],
    src_len: usize,
    dst: &mut [T],
    dst_len: usize,
    f: impl Fn(&[T], &mut [T], &mut Vec<T>) -> Result<()> + Sync + Send,
) -> Result<()> {
    if dst_len == 0 {
        return Ok(());
    }
    if parallel(n, plan.macs()) {
        dst.par_chunks_mut(dst_len)
            .enumerate()
            .try_for_each_init(Vec::new, |col, (i, d)| {
                f(&src[i * src_len..(i + 1) * src_len], d, col)
            })
    } else {
        let mut col = Vec::new();
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
pub(crate) fn winograd_for<T: Float>(p: &Plan, n: usize, adjoint: bool) -> Option<Wino> {
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
/// Measured (BENCHMARKS.md "Conv (issue 15)" for small images, "Winograd
/// on large images" for the rest; 3x3 convolutions of the zoo's nets,
/// batch 1, alternating builds): im2col's product runs at 140-200 GF/s;
/// Winograd (2.25x fewer multiply-adds, its transforms on wide vectors)
/// beat it by 1.15-1.85x on images of 56x56 and up with 16 to 256
/// channels each side, tied on 14x14 and 28x28 (0.94-1.08x), lost with
/// 512 channels and with few input channels (3 -> 64 at 224x224: 0.3x).
/// On 8x8 and below it wins over the batch's tiles (im2col's product is
/// narrow there) when both sides have channels enough: with one input
/// channel its transforms are the whole cost (LeNet's first layer, 1 -> 20
/// over 64 images of 8x8: 410-510 us against 100 for im2col + GEMM in
/// float64 alone, BENCHMARKS.md "FC on packed panels; LeNet's first
/// convolution"). Its filter transform costs as much as the products of
/// ~100 tiles, so the batch must hold enough of them.
pub(crate) fn winograd_pays(p: &Plan, n: usize) -> bool {
    let tiles = n * p.g.outs[1].div_ceil(2) * p.g.outs[2].div_ceil(2);
    let pixels = p.g.out_len();
    let channels = p.cin.min(p.cout) >= WINO_MIN_CHANNELS;
    let large = pixels >= WINO_WIDE_PIXELS && channels && p.cin.max(p.cout) <= WINO_MAX_CHANNELS;
    // Small images whose batches make a wide window matrix go through it
    // instead (`Plan::image_batch`): LeNet's 4x4 layer, 20 -> 50 channels
    // over 64 images, 340 us against 680 for Winograd, its gradient 0.65 ms
    // against 1.3.
    let batched = p.image_batch(n) * pixels >= MIN_COLS;
    ((pixels <= WINO_MAX_PIXELS && channels && !batched) || large) && tiles >= WINO_MIN_TILES
}

/// Output pixels per image up to which Winograd is chosen (8x8).
pub(crate) const WINO_MAX_PIXELS: usize = 64;
/// Output pixels per image from which it is chosen again (50x50) ...
pub(crate) const WINO_WIDE_PIXELS: usize = 2500;
/// ... with at least this many channels on each side ...
pub(crate) const WINO_MIN_CHANNELS: usize = 16;
/// ... and at most this many on either.
pub(crate) const WINO_MAX_CHANNELS: usize = 256;
/// The fewest tiles (2x2 outputs, over the batch) for which it is chosen.
pub(crate) const WINO_MIN_TILES: usize = 256;

/// Filter tap (a, b) of window column `c` of filter row `k` (the plan's
/// filter layout: NCHW `[k][c][a][b]`, NHWC `[k][a][b][c]`).
pub(crate) fn tap3<T: Float>(p: &Plan, w: &[T], k: usize, c: usize, a: usize, b: usize) -> T {
    let rows = p.rows();
    match p.order {
        Order::Nchw => w[k * rows + c * 9 + a * 3 + b],
        Order::Nhwc => w[k * rows + (a * 3 + b) * p.cin + c],
    }
}

/// `fwd` for each of `n` images (`src` the image side, `dst` the col side).
pub(crate) fn run_fwd<T: Float>(
    p: &Plan,
    n: usize,
    src: &[T],
    w: &[T],
    dst: &mut [T],
) -> Result<()> {
    if let Some(wino) = winograd_for::<T>(p, n, false) {
        return wino.run(src, |k, c, a, b| tap3(p, w, k, c, a, b), dst);
    }
    let b = p.image_batch(n);
    if b > 1 {
        return per_batch(
            p,
            n,
            b,
            src,
            p.img_len(),
            dst,
            p.col_len(),
            |s, d, nb, split| p.fwd_batch(s, w, d, nb, split),
        );
    }
    per_image(p, n, src, p.img_len(), dst, p.col_len(), |s, d, col| {
        p.fwd(s, w, d, col)
    })
}

/// `adj` for each of `n` images (`src` the col side, `dst` the image side).
pub(crate) fn run_adj<T: Float>(
    p: &Plan,
    n: usize,
    src: &[T],
    w: &[T],
    dst: &mut [T],
) -> Result<()> {
    if let Some(wino) = winograd_for::<T>(p, n, true) {
        return wino.run(src, |k, c, a, b| tap3(p, w, c, k, 2 - a, 2 - b), dst);
    }
    let b = p.image_batch(n);
    if b > 1 {
        return per_batch(
            p,
            n,
            b,
            src,
            p.col_len(),
            dst,
            p.img_len(),
            |s, d, nb, split| p.adj_batch(s, w, d, nb, split),
        );
    }
    per_image(p, n, src, p.col_len(), dst, p.img_len(), |s, d, col| {
        p.adj(s, w, d, col)
    })
}

/// `f(src_b, dst_b, images, split)` for each batch of `b` images (the last
/// may hold fewer): batches on the kernel pool when there are several and
/// the work pays for it, else here with each product split across the pool
/// when the plan says so.
fn per_batch<T: Float>(
    plan: &Plan,
    n: usize,
    b: usize,
    src: &[T],
    src_len: usize,
    dst: &mut [T],
    dst_len: usize,
    f: impl Fn(&[T], &mut [T], usize, bool) -> Result<()> + Sync + Send,
) -> Result<()> {
    if dst_len == 0 {
        return Ok(());
    }
    let one = |(i, d): (usize, &mut [T])| {
        let nb = d.len() / dst_len;
        f(&src[i * b * src_len..(i * b + nb) * src_len], d, nb, false)
    };
    if n > b && parallel(n, plan.macs()) {
        dst[..n * dst_len]
            .par_chunks_mut(b * dst_len)
            .enumerate()
            .try_for_each(one)
    } else {
        for (i, d) in dst[..n * dst_len].chunks_mut(b * dst_len).enumerate() {
            let nb = d.len() / dst_len;
            f(
                &src[i * b * src_len..(i * b + nb) * src_len],
                d,
                nb,
                plan.par,
            )?;
        }
        Ok(())
    }
}

/// Sum over images of `wgrad(img_i, cs_i)`, into a fresh dW.
pub(crate) fn weight_grad<T: Float>(
    plan: &Plan,
    n: usize,
    img: &[T],
    cs: &[T],
    w_len: usize,
) -> Result<Vec<T>> {
    let (il, cl) = (plan.img_len(), plan.col_len());
    let b = plan.image_batch(n);
    if b > 1 {
        let batches = n.div_ceil(b);
        let one = |k: usize, acc: &mut [T], split: bool| -> Result<()> {
            let (i0, i1) = (k * b, ((k + 1) * b).min(n));
            plan.wgrad_batch(
                &img[i0 * il..i1 * il],
                &cs[i0 * cl..i1 * cl],
                acc,
                i1 - i0,
                split,
            )
        };
        let acc = || crate::tensor::default_buffer::<T>(w_len, "a filter gradient");
        return if batches > 1 && parallel(n, plan.macs()) {
            (0..batches)
                .into_par_iter()
                .fold(
                    || -> Result<Vec<T>> { acc() },
                    |state, k| {
                        let mut acc = state?;
                        one(k, &mut acc, false)?;
                        Ok(acc)
                    },
                )
                .try_reduce_with(|mut a, b| {
                    for (x, y) in a.iter_mut().zip(b) {
                        *x += y;
                    }
                    Ok(a)
                })
                .unwrap_or_else(acc)
        } else {
            let mut a = acc()?;
            for k in 0..batches {
                one(k, &mut a, plan.par)?;
            }
            Ok(a)
        };
    }
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
                || -> Result<(Vec<T>, Vec<T>)> { Ok((acc()?, Vec::new())) },
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
        let mut col = Vec::new();
        for i in 0..n {
            one(i, &mut acc, &mut col)?;
        }
        Ok(acc)
    }
}

/// Adds `b[c]` to every pixel of channel c (images of `ch` channels and
/// `sp` pixels), on the kernel pool for large outputs (in blocks of whole
/// planes or pixels; each element gets its one addition either way).
pub(crate) fn add_bias<T: Float>(y: &mut [T], b: &[T], ch: usize, sp: usize, order: Order) {
    if ch == 0 || sp == 0 {
        return;
    }
    // Runs of elements that share one bias value: a plane (NCHW) or a
    // pixel's channels (NHWC, all of b).
    let run = match order {
        Order::Nchw => sp,
        Order::Nhwc => ch,
    };
    // Adds the bias to `block`, whose first run is run `first` of y.
    let add = |first: usize, block: &mut [T]| {
        crate::vmath::wide(
            #[inline(always)]
            || {
                for (i, r) in block.chunks_mut(run).enumerate() {
                    match order {
                        Order::Nchw => {
                            let bc = b[(first + i) % ch];
                            for v in r {
                                *v += bc;
                            }
                        }
                        Order::Nhwc => {
                            for (v, &bc) in r.iter_mut().zip(b) {
                                *v += bc;
                            }
                        }
                    }
                }
            },
        )
    };
    if y.len() >= BIAS_PAR_MIN && crate::threads::num_threads() > 1 {
        use rayon::prelude::*;
        let runs = BIAS_TASK.div_ceil(run);
        y.par_chunks_mut(runs * run)
            .enumerate()
            .for_each(|(j, block)| add(j * runs, block));
    } else {
        add(0, y);
    }
}

/// Outputs of at least this many elements get their bias on the kernel
/// pool, in tasks of about [`BIAS_TASK`] elements (whole runs).
const BIAS_PAR_MIN: usize = 1 << 18;
const BIAS_TASK: usize = 1 << 15;

/// The per-channel sums of images of `ch` channels and `sp` pixels.
pub(crate) fn channel_sums<T: Float>(
    y: &[T],
    ch: usize,
    sp: usize,
    order: Order,
) -> Result<Vec<T>> {
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
