//! im2col and col2im: an image's windows laid out as the columns of a
//! matrix (and back, summing), for NCHW by lines of output and for NHWC by
//! pixels.

#![allow(clippy::result_large_err, clippy::too_many_arguments)]

use super::window::*;
use crate::num::Float;

/// NCHW im2col of `cg` channels of one image (`x`), for the output lines
/// (pairs of the first two output dims) `l0..l1`: a (cg * K) x
/// ((l1 - l0) * last output dim) matrix.
pub(crate) fn im2col_nchw_lines<T: Float>(
    g: &Geo,
    x: &[T],
    cg: usize,
    l0: usize,
    l1: usize,
    col: &mut [T],
) {
    let [i0, i1, i2] = g.ins;
    let [_, o1, o2] = g.outs;
    let p = (l1 - l0) * o2;
    let zero = T::of(0.0);
    let mut r = 0;
    for c in 0..cg {
        let xc = &x[c * i0 * i1 * i2..(c + 1) * i0 * i1 * i2];
        for a in 0..g.k[0] {
            for b in 0..g.k[1] {
                for e in 0..g.k[2] {
                    let row = &mut col[r * p..(r + 1) * p];
                    r += 1;
                    let off = (e * g.d[2]) as isize - g.ph[2] as isize;
                    let (lo, hi) = valid_range(o2, g.s[2], off, i2);
                    for (j, line) in (l0..l1).enumerate() {
                        let (z, y) = (line / o1, line % o1);
                        {
                            let out = &mut row[j * o2..(j + 1) * o2];
                            let (Some(zi), Some(yi)) = (g.tap(0, z, a), g.tap(1, y, b)) else {
                                out.fill(zero);
                                continue;
                            };
                            let xr = &xc[(zi * i1 + yi) * i2..(zi * i1 + yi + 1) * i2];
                            out[..lo].fill(zero);
                            out[hi..].fill(zero);
                            if hi == lo {
                                continue;
                            }
                            if g.s[2] == 1 {
                                let start = (lo as isize + off) as usize;
                                out[lo..hi].copy_from_slice(&xr[start..start + hi - lo]);
                            } else {
                                for (w, v) in out[lo..hi].iter_mut().enumerate() {
                                    *v = xr[(((lo + w) * g.s[2]) as isize + off) as usize];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col_nchw_lines`]: adds each entry of the window
/// matrix of output lines `l0..l1` (`cg * K` rows of `(l1 - l0) * last
/// output dim` columns) to its pixel of `x` (`cg` channels; the caller
/// zeroed it before the first block). Per pixel, the additions come in the
/// order (row of the window matrix, line), so that cutting the channels
/// into blocks does not change a result.
pub(crate) fn col2im_nchw_lines<T: Float>(
    g: &Geo,
    col: &[T],
    cg: usize,
    l0: usize,
    l1: usize,
    x: &mut [T],
) {
    let [i0, i1, i2] = g.ins;
    let [_, o1, o2] = g.outs;
    let p = (l1 - l0) * o2;
    let mut r = 0;
    for c in 0..cg {
        let xc = &mut x[c * i0 * i1 * i2..(c + 1) * i0 * i1 * i2];
        for a in 0..g.k[0] {
            for b in 0..g.k[1] {
                for e in 0..g.k[2] {
                    let row = &col[r * p..(r + 1) * p];
                    r += 1;
                    let off = (e * g.d[2]) as isize - g.ph[2] as isize;
                    let (lo, hi) = valid_range(o2, g.s[2], off, i2);
                    if hi == lo {
                        continue;
                    }
                    for (j, line) in (l0..l1).enumerate() {
                        let (z, y) = (line / o1, line % o1);
                        let (Some(zi), Some(yi)) = (g.tap(0, z, a), g.tap(1, y, b)) else {
                            continue;
                        };
                        let src = &row[j * o2..(j + 1) * o2];
                        let xr = &mut xc[(zi * i1 + yi) * i2..(zi * i1 + yi + 1) * i2];
                        if g.s[2] == 1 {
                            let start = (lo as isize + off) as usize;
                            for (d, &v) in xr[start..start + hi - lo].iter_mut().zip(&src[lo..hi]) {
                                *d += v;
                            }
                        } else {
                            for (w, &v) in src[lo..hi].iter().enumerate() {
                                xr[(((lo + w) * g.s[2]) as isize + off) as usize] += v;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The windows of a small image as offsets into a zero-padded copy of one
/// of its channels: the padded copy's offset of each output's first tap
/// (`base`, one per output pixel) and each tap's offset from it (`taps`).
/// im2col and col2im of a small image (a few pixels per output line, where
/// the line-by-line copies of [`im2col_nchw_lines`] are mostly bounds
/// checks) then gather and scatter through these with no check at all.
pub(crate) struct SmallWindows {
    /// The padded copy's extent per dim.
    ext: [usize; 3],
    base: Vec<usize>,
    taps: Vec<usize>,
}

impl SmallWindows {
    pub(crate) fn new(g: &Geo) -> SmallWindows {
        let ext: [usize; 3] = std::array::from_fn(|d| {
            let reach = (g.outs[d].max(1) - 1) * g.s[d] + (g.k[d].max(1) - 1) * g.d[d] + 1;
            (g.ph[d] + g.ins[d]).max(reach)
        });
        let at = |z: usize, y: usize, x: usize| (z * ext[1] + y) * ext[2] + x;
        let mut base = Vec::with_capacity(g.out_len());
        for z in 0..g.outs[0] {
            for y in 0..g.outs[1] {
                for x in 0..g.outs[2] {
                    base.push(at(z * g.s[0], y * g.s[1], x * g.s[2]));
                }
            }
        }
        let mut taps = Vec::with_capacity(g.ksize());
        for a in 0..g.k[0] {
            for b in 0..g.k[1] {
                for e in 0..g.k[2] {
                    taps.push(at(a * g.d[0], b * g.d[1], e * g.d[2]));
                }
            }
        }
        SmallWindows { ext, base, taps }
    }

    /// Elements of the padded copy of one channel.
    pub(crate) fn plane_len(&self) -> usize {
        self.ext.iter().product()
    }

    /// The padded copy's index of each input row (z, y) start.
    fn rows<'a>(&'a self, g: &'a Geo) -> impl Iterator<Item = usize> + 'a {
        (0..g.ins[0]).flat_map(move |z| {
            (0..g.ins[1])
                .map(move |y| ((z + g.ph[0]) * self.ext[1] + y + g.ph[1]) * self.ext[2] + g.ph[2])
        })
    }

    /// im2col of `cg` channels of one image (`x`) into the window matrix
    /// `col`, whose rows (one per channel and tap, all output pixels) are
    /// `ld` apart; `plane` ([`SmallWindows::plane_len`] elements) is
    /// scratch whose padding must be zero on entry (it stays zero).
    pub(crate) fn im2col<T: Float>(
        &self,
        g: &Geo,
        x: &[T],
        cg: usize,
        col: &mut [T],
        ld: usize,
        plane: &mut [T],
    ) {
        let (pin, i2, p) = (g.in_len(), g.ins[2], self.base.len());
        for c in 0..cg {
            let xc = &x[c * pin..(c + 1) * pin];
            for (r, src) in self.rows(g).zip(xc.chunks_exact(i2.max(1))) {
                plane[r..r + i2].copy_from_slice(src);
            }
            for (t, &off) in self.taps.iter().enumerate() {
                let row = &mut col[(c * self.taps.len() + t) * ld..][..p];
                let shifted = &plane[off..];
                for (v, &b) in row.iter_mut().zip(&self.base) {
                    *v = shifted[b];
                }
            }
        }
    }

    /// The adjoint of [`SmallWindows::im2col`]: adds each entry of `col`
    /// to its pixel of `x` (`cg` channels); per pixel the additions come in
    /// the order of the taps, summed in `plane` (scratch, any content)
    /// from zero and then added to the pixel.
    pub(crate) fn col2im<T: Float>(
        &self,
        g: &Geo,
        col: &[T],
        cg: usize,
        x: &mut [T],
        ld: usize,
        plane: &mut [T],
    ) {
        let (pin, i2, p) = (g.in_len(), g.ins[2], self.base.len());
        for c in 0..cg {
            plane.fill(T::of(0.0));
            for (t, &off) in self.taps.iter().enumerate() {
                let row = &col[(c * self.taps.len() + t) * ld..][..p];
                let shifted = &mut plane[off..];
                for (&v, &b) in row.iter().zip(&self.base) {
                    shifted[b] += v;
                }
            }
            let xc = &mut x[c * pin..(c + 1) * pin];
            for (r, dst) in self.rows(g).zip(xc.chunks_exact_mut(i2.max(1))) {
                for (d, &v) in dst.iter_mut().zip(&plane[r..r + i2]) {
                    *d += v;
                }
            }
        }
    }
}

/// NHWC im2col: channels `c0..c0 + cg` of one image (`x`, `ctot` channels
/// per pixel) to a P x (K * cg) matrix.
pub(crate) fn im2col_nhwc<T: Float>(
    g: &Geo,
    x: &[T],
    ctot: usize,
    c0: usize,
    cg: usize,
    col: &mut [T],
) {
    let p = g.outs.iter().product();
    im2col_nhwc_pixels(g, x, ctot, c0, cg, 0, p, col)
}

/// The rows `j0..j1` (output pixels, flattened) of [`im2col_nhwc`]'s
/// matrix: a (j1 - j0) x (K * cg) matrix.
pub(crate) fn im2col_nhwc_pixels<T: Float>(
    g: &Geo,
    x: &[T],
    ctot: usize,
    c0: usize,
    cg: usize,
    j0: usize,
    j1: usize,
    col: &mut [T],
) {
    let [_, i1, i2] = g.ins;
    let [_, o1, o2] = g.outs;
    let zero = T::of(0.0);
    let mut j = 0;
    for pix in j0..j1 {
        let (z, y, w) = (pix / (o1 * o2), (pix / o2) % o1, pix % o2);
        for a in 0..g.k[0] {
            let zi = g.tap(0, z, a);
            for b in 0..g.k[1] {
                let yi = g.tap(1, y, b);
                for e in 0..g.k[2] {
                    let dst = &mut col[j..j + cg];
                    j += cg;
                    match (zi, yi, g.tap(2, w, e)) {
                        (Some(zi), Some(yi), Some(xi)) => {
                            let at = ((zi * i1 + yi) * i2 + xi) * ctot + c0;
                            dst.copy_from_slice(&x[at..at + cg]);
                        }
                        _ => dst.fill(zero),
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col_nhwc`] (adds into `x`, which the caller zeroed).
pub(crate) fn col2im_nhwc<T: Float>(
    g: &Geo,
    col: &[T],
    ctot: usize,
    c0: usize,
    cg: usize,
    x: &mut [T],
) {
    let [_, i1, i2] = g.ins;
    let [o0, o1, o2] = g.outs;
    let mut j = 0;
    for z in 0..o0 {
        for y in 0..o1 {
            for w in 0..o2 {
                for a in 0..g.k[0] {
                    let zi = g.tap(0, z, a);
                    for b in 0..g.k[1] {
                        let yi = g.tap(1, y, b);
                        for e in 0..g.k[2] {
                            let src = &col[j..j + cg];
                            j += cg;
                            if let (Some(zi), Some(yi), Some(xi)) = (zi, yi, g.tap(2, w, e)) {
                                let at = ((zi * i1 + yi) * i2 + xi) * ctot + c0;
                                for (d, &v) in x[at..at + cg].iter_mut().zip(src) {
                                    *d += v;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
