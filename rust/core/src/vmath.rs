//! Vectorisable float32 transcendental functions (issue 30): `exp`,
//! `sigmoid`, `tanh` and `log` as branch-free polynomial (tanh: rational)
//! evaluations in float32 arithmetic, with fused multiply-adds
//! (`f32::mul_add`: one rounding each, the same bits whether the CPU or libm
//! computes it), written so LLVM auto-vectorises a plain loop over a slice
//! (no libm call, no per-element function pointer; the few choices are
//! selects). The unary ops' float32 kernels run the scalar forms over
//! slices inside [`wide`] (as the slice forms [`exp_slice`],
//! [`sigmoid_slice`], [`tanh_slice`], [`log_slice`] do); the scalar
//! forms are `#[inline]` so the recurrent cells' loops, generic over
//! [`crate::num::Float`], inline them too (`Float::vexp`, `vsigmoid`,
//! `vtanh`: these for float32, std's functions for float64).
//!
//! Accuracy against float64 references (the sweep in the tests below: every
//! 1000th float32 bit pattern plus edge cases), in float32 ulps of the
//! reference value: exp <= [`EXP_MAX_ULP`], sigmoid <= [`SIGMOID_MAX_ULP`],
//! tanh <= [`TANH_MAX_ULP`], log <= [`LOG_MAX_ULP`]. Special values: NaN gives NaN; exp(+inf) =
//! +inf, exp(-inf) = 0, exp overflows to +inf above ln(f32::MAX) ~ 88.72 and
//! underflows gradually (subnormal results, correctly scaled, with one
//! rounding) to 0 below ~ -103.97; sigmoid(-inf) = 0, sigmoid(+inf) = 1, and
//! sigmoid keeps relative accuracy down to its subnormal results (x ~ -103);
//! tanh(+-inf) = +-1, tanh(-0) = -0, and tanh keeps relative accuracy near
//! 0 (tiny and subnormal inputs give themselves). Subnormal inputs are ordinary inputs (no flush to zero).

// The constants are written with the digits they were derived with; each
// parses to the intended float32.
#![allow(clippy::excessive_precision)]

/// The error bounds the tests hold, in float32 ulps (see the module doc).
/// Measured maxima (sweep and dense sweep; fused multiply-adds round once
/// on every target, so the same everywhere): exp 1.01, sigmoid 2.09 (near
/// x = -2, e / (1 + e)), tanh 4.40 (every 1000th bit pattern; 4.64 near
/// |x| = 6.9 over every 7th between 3e-5 and 10: Eigen's function).
pub const EXP_MAX_ULP: f64 = 1.5;
pub const SIGMOID_MAX_ULP: f64 = 2.5;
pub const TANH_MAX_ULP: f64 = 5.0;
pub const LOG_MAX_ULP: f64 = 1.0;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so `n * LN2_HI` is exact for |n| < 256 (Cody and Waite):
/// LN2_HI has 16 significant bits.
const LN2_HI: f32 = 0.693_145_751_953_125;
const LN2_LO: f32 = 1.428_606_765_330_187e-6;
/// 1.5 * 2^23: adding it rounds a float32 of magnitude < 2^22 to an
/// integer held in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// Inputs are clamped to this range before reduction; past it exp is inf
/// (above) or rounds to 0 (below) anyway.
const EXP_HI: f32 = 89.0;
const EXP_LO: f32 = -104.0;

/// e^x in float32 (<= [`EXP_MAX_ULP`] ulp).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // `max`/`min` take the bound for NaN (no garbage exponent bits below);
    // the select at the end restores it.
    #[allow(clippy::manual_clamp)]
    let xc = x.max(EXP_LO).min(EXP_HI);
    // n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2].
    let t = xc.mul_add(LOG2E, ROUND_MAGIC);
    let n = t.to_bits() as i32 - ROUND_MAGIC.to_bits() as i32;
    let nf = t - ROUND_MAGIC;
    let r = nf.mul_add(-LN2_LO, nf.mul_add(-LN2_HI, xc));
    // e^r by its Taylor polynomial to r^7 (truncation < 5e-9 relative at
    // |r| = ln2/2), written 1 + r + r^2 q(r) to keep the low terms exact.
    let q: f32 = 1.0 / 5040.0;
    let q = q.mul_add(r, 1.0 / 720.0);
    let q = q.mul_add(r, 1.0 / 120.0);
    let q = q.mul_add(r, 1.0 / 24.0);
    let q = q.mul_add(r, 1.0 / 6.0);
    let q = q.mul_add(r, 0.5);
    let p = 1.0 + (r * r).mul_add(q, r);
    // p * 2^n as p * 2^n1 * 2^n2 (both normal for n in [-150, 129]): the
    // first product is exact, the second rounds once (to inf above the
    // range, gradually to a subnormal or 0 below it).
    let n1 = n >> 1;
    let n2 = n - n1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
    let y = (p * s1) * s2;
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// 1 / (1 + e^-x) in float32 (<= [`SIGMOID_MAX_ULP`] ulp): e = e^-|x|,
/// then 1 / (1 + e) for x >= 0 and e / (1 + e) below, so tiny results keep
/// their relative accuracy.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    let e = exp(-x.abs());
    let num = if x >= 0.0 { 1.0 } else { e };
    // NaN: e is NaN, so the quotient is.
    num / (1.0 + e)
}

/// tanh is a rational function of x on [-TANH_CLAMP, TANH_CLAMP] and
/// +-1 beyond (where float32 tanh rounds to +-1 anyway); the clamp is the
/// largest float32 at which the rational function is still below 1.
const TANH_CLAMP: f32 = 7.998_811_721_801_757_81;
/// Below this |x|, tanh(x) rounds to x within 1 ulp (x^3/3 < 2^-24 x).
const TANH_TINY: f32 = 0.0004;
/// Numerator x P(x^2), P's coefficients from x^0 up, and denominator
/// Q(x^2): the minimax rational approximation of degree 13/6 that Eigen's
/// `generic_fast_tanh_float` uses (Eigen is MPL-2.0; these are its
/// published constants), so Caffe2's CPU Tanh, which runs Eigen's tanh,
/// computed the same function.
const TANH_P: [f32; 7] = [
    4.893_524_558_917_86e-3,
    6.372_619_288_754_36e-4,
    1.485_722_357_179_79e-5,
    5.122_297_090_371_14e-8,
    -8.604_671_522_137_35e-11,
    2.000_187_904_824_77e-13,
    -2.760_768_477_423_55e-16,
];
const TANH_Q: [f32; 4] = [
    4.893_525_185_543_85e-3,
    2.268_434_632_439_00e-3,
    1.185_347_056_866_54e-4,
    1.198_258_394_667_02e-6,
];

/// tanh(x) in float32 (<= [`TANH_MAX_ULP`] ulp): x P(x^2) / Q(x^2) on the
/// clamped x (one division, no exp), x itself for tiny |x|. Chosen by
/// measurement (BENCHMARKS.md "Tanh as a rational function"): 0.14 ns per
/// element against 0.47 for 1 - 2 / (e^2|x| + 1) through [`exp`] (1.3
/// ulp), on the 2-core AVX-512 machine.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    #[allow(clippy::manual_clamp)]
    let xc = x.max(-TANH_CLAMP).min(TANH_CLAMP);
    let t = xc * xc;
    let p = TANH_P[6];
    let p = p.mul_add(t, TANH_P[5]);
    let p = p.mul_add(t, TANH_P[4]);
    let p = p.mul_add(t, TANH_P[3]);
    let p = p.mul_add(t, TANH_P[2]);
    let p = p.mul_add(t, TANH_P[1]);
    let p = p.mul_add(t, TANH_P[0]);
    let q = TANH_Q[3];
    let q = q.mul_add(t, TANH_Q[2]);
    let q = q.mul_add(t, TANH_Q[1]);
    let q = q.mul_add(t, TANH_Q[0]);
    let y = (xc * p) / q;
    // Tiny x (and -0) give x; `max`/`min` took the bound for NaN.
    let y = if x.abs() < TANH_TINY { x } else { y };
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// ln 2 split for log's `k ln 2` (LOG_LN2_HI has 16 significant bits, so
/// `k * LOG_LN2_HI` is exact for the |k| <= 151 that occur).
const LOG_LN2_HI: f32 = 6.931_381_225_6e-1;
const LOG_LN2_LO: f32 = 9.058_000_614_5e-6;
/// ln(1 + f) = 2 atanh(s) with s = f / (2 + f): 2s + s^3 (2/3 + 2/5 s^2 +
/// ...), whose tail in z = s^2 is a minimax fit (the classic fdlibm
/// coefficients, for |s| <= 0.1716 on the reduced range below).
const LOG_P: [f32; 4] = [
    6.666_666_269_3e-1,
    4.000_097_215_2e-1,
    2.849_878_668_8e-1,
    2.427_907_884_1e-1,
];

/// ln(x) in float32 (<= [`LOG_MAX_ULP`] ulp): x = 2^k m with m in
/// [sqrt(2)/2, sqrt(2)) (subnormal inputs scaled by 2^25 first), ln x = k
/// ln 2 + ln m, ln m from s = (m - 1) / (m + 1) as above, the k ln 2 and
/// the leading terms added last so they are not rounded away. ln(0) =
/// -inf, ln(negative) = NaN, ln(+inf) = +inf, ln(NaN) = NaN, ln(1) = 0.
#[inline(always)]
pub fn log(x: f32) -> f32 {
    let tiny = x < f32::MIN_POSITIVE;
    let xs = if tiny { x * 33_554_432.0 } else { x };
    // Move the exponent boundary to sqrt(2)/2 (0x3f3504f3) so that the
    // mantissa lands in [sqrt(2)/2, sqrt(2)).
    let ix = (xs.to_bits() as i32).wrapping_add(0x3f80_0000 - 0x3f35_04f3);
    let k = (ix >> 23) - 127 - if tiny { 25 } else { 0 };
    let m = f32::from_bits(((ix & 0x007f_ffff) + 0x3f35_04f3) as u32);
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let w = z * z;
    let t1 = w * (LOG_P[1] + w * LOG_P[3]);
    let t2 = z * (LOG_P[0] + w * LOG_P[2]);
    let r = t2 + t1;
    let hfsq = 0.5 * f * f;
    let dk = k as f32;
    let y = s * (hfsq + r) + dk * LOG_LN2_LO - hfsq + f + dk * LOG_LN2_HI;
    // The specials, as selects: NaN and negatives, 0, +inf.
    let y = if x == f32::INFINITY { x } else { y };
    let y = if x == 0.0 { f32::NEG_INFINITY } else { y };
    if x < 0.0 || x.is_nan() {
        f32::NAN
    } else {
        y
    }
}

/// Runs `f` compiled for the widest vectors this CPU has: AVX-512 (16
/// float32 lanes) or AVX2 (8) when detected at run time, else the build's
/// baseline (SSE2 on x86-64, 4); AVX2 is taken with FMA only. `f` must be a closure marked
/// `#[inline(always)]` whose loops call only `#[inline]` functions, so it
/// is compiled into each wrapper below with that wrapper's features.
///
/// Only the vector width changes: Rust never fuses a multiply and an add
/// into an FMA on its own, every operation used here is IEEE-exact per
/// lane, and the explicit `mul_add`s round once (a hardware FMA on these
/// paths; the baseline path calls libm's `fmaf`, correct but slower), so
/// the results have the same bits on every path (the tests compare the
/// slice forms with the scalar forms over a sweep). Measured on the
/// 2-core AMD EPYC (Zen 5) of BENCHMARKS.md "Wider vectors at run time":
/// tanh 1.96 -> 0.44 ns per element, sigmoid 1.44 -> 0.33, exp 1.10 ->
/// 0.26.
#[inline(always)]
pub fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        fn w512<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        #[target_feature(enable = "avx2,fma")]
        fn w256<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { w512(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            return unsafe { w256(f) };
        }
    }
    f()
}

/// `y[i] = f(x[i])` on the widest vectors ([`wide`]).
#[inline(always)]
fn map_slice(what: &str, x: &[f32], y: &mut [f32], f: impl Fn(f32) -> f32) {
    assert_eq!(x.len(), y.len(), "{what}: lengths differ");
    wide(
        #[inline(always)]
        || {
            for (y, &x) in y.iter_mut().zip(x) {
                *y = f(x);
            }
        },
    )
}

/// `y[i] = exp(x[i])`. Panics if the lengths differ.
pub fn exp_slice(x: &[f32], y: &mut [f32]) {
    map_slice("exp_slice", x, y, exp)
}

/// `y[i] = sigmoid(x[i])`. Panics if the lengths differ.
pub fn sigmoid_slice(x: &[f32], y: &mut [f32]) {
    map_slice("sigmoid_slice", x, y, sigmoid)
}

/// `y[i] = tanh(x[i])`. Panics if the lengths differ.
pub fn tanh_slice(x: &[f32], y: &mut [f32]) {
    map_slice("tanh_slice", x, y, tanh)
}

/// `y[i] = ln(x[i])`. Panics if the lengths differ.
pub fn log_slice(x: &[f32], y: &mut [f32]) {
    map_slice("log_slice", x, y, log)
}

/// The error of `got` against the float64 reference `want`, in float32
/// ulps at `want` (the spacing of float32 values at |want|, subnormal
/// spacing below the normal range). Equal non-finite values and two NaNs
/// give 0; any other disagreement involving a non-finite value gives inf.
pub fn ulp_error(got: f32, want: f64) -> f64 {
    if want.is_nan() || got.is_nan() {
        return if want.is_nan() && got.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let g = f64::from(got);
    if g == want {
        return 0.0;
    }
    if g.is_infinite() {
        // An overflow where the rounded reference overflows too is exact.
        return if (want as f32) == got {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let w = want.abs().min(f64::from(f32::MAX));
    // The float32 exponent of w, at least the smallest normal one.
    let e = if w < f64::from(f32::MIN_POSITIVE) {
        -126
    } else {
        w.log2().floor() as i32
    };
    let ulp = 2f64.powi(e - 23);
    (g - want).abs() / ulp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sigmoid64(x: f64) -> f64 {
        if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            let e = x.exp();
            e / (1.0 + e)
        }
    }

    /// Every `step`th float32 bit pattern (both signs) plus edge cases.
    fn sweep(step: u32) -> Vec<f32> {
        let mut v: Vec<f32> = (0..=0x7f80_0000u32)
            .step_by(step as usize)
            .flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)])
            .collect();
        v.extend([
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            1e-45,
            -1e-45,
            1e-30,
            0.625,
            0.624_999_9,
            -0.625,
            0.346_573_6,
            88.72,
            88.722_83,
            88.8,
            -87.3,
            -88.0,
            -100.0,
            -103.0,
            -103.9,
            -104.0,
            -150.0,
            9.0,
            9.01,
            -9.01,
            20.0,
            44.0,
            45.0,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        v
    }

    /// The largest ulp error of `f` against `r` over `xs`, and where.
    fn worst(xs: &[f32], f: impl Fn(f32) -> f32, r: impl Fn(f64) -> f64) -> (f64, f32) {
        let mut w = (0.0, 0.0);
        for &x in xs {
            let e = ulp_error(f(x), r(f64::from(x)));
            if !(e <= w.0) {
                w = (e, x);
            }
        }
        w
    }

    #[test]
    fn log_is_within_its_ulp_bound_over_the_float32_range() {
        // Positive inputs (the sweep's negative half is NaN, checked in
        // `special_values`), subnormal ones included, and a dense sweep
        // around 1, where ln is near 0.
        let mut xs: Vec<f32> = sweep(1000).into_iter().filter(|&x| x > 0.0).collect();
        xs.extend((1..=200_000).map(|i| 0.9 + i as f32 * 1e-6));
        xs.extend((1..=100_000).map(|i| i as f32 * 1e-3));
        let (e, at) = worst(&xs, log, f64::ln);
        eprintln!("log: max {e} ulp at {at:e}");
        assert!(e <= LOG_MAX_ULP, "log: {e} ulp at {at:e}");
    }

    #[test]
    fn exp_is_within_its_ulp_bound_over_the_float32_range() {
        let (e, at) = worst(&sweep(1000), exp, f64::exp);
        eprintln!("exp: max {e} ulp at {at:e}");
        assert!(e <= EXP_MAX_ULP, "exp: {e} ulp at {at:e}");
    }

    #[test]
    fn sigmoid_is_within_its_ulp_bound_over_the_float32_range() {
        let (e, at) = worst(&sweep(1000), sigmoid, sigmoid64);
        eprintln!("sigmoid: max {e} ulp at {at:e}");
        assert!(e <= SIGMOID_MAX_ULP, "sigmoid: {e} ulp at {at:e}");
    }

    #[test]
    fn tanh_is_within_its_ulp_bound_over_the_float32_range() {
        let (e, at) = worst(&sweep(1000), tanh, f64::tanh);
        eprintln!("tanh: max {e} ulp at {at:e}");
        assert!(e <= TANH_MAX_ULP, "tanh: {e} ulp at {at:e}");
    }

    #[test]
    fn dense_sweeps_where_the_functions_vary() {
        // Every float32 in steps of 1e-4 over the ranges that matter.
        let xs: Vec<f32> = (-1_050_000..=1_050_000).map(|i| i as f32 * 1e-4).collect();
        assert!(worst(&xs, tanh, f64::tanh).0 <= TANH_MAX_ULP);
        assert!(worst(&xs, sigmoid, sigmoid64).0 <= SIGMOID_MAX_ULP);
        assert!(worst(&xs, exp, f64::exp).0 <= EXP_MAX_ULP);
    }

    #[test]
    fn special_values() {
        assert!(exp(f32::NAN).is_nan() && sigmoid(f32::NAN).is_nan() && tanh(f32::NAN).is_nan());
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(88.8), f32::INFINITY);
        assert_eq!(exp(f32::MAX), f32::INFINITY);
        assert_eq!(exp(-104.0), 0.0);
        assert_eq!(exp(f32::MIN), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-100.0) > 0.0 && exp(-100.0) < f32::MIN_POSITIVE);
        assert_eq!(sigmoid(f32::INFINITY), 1.0);
        assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid(0.0), 0.5);
        assert_eq!(sigmoid(100.0), 1.0);
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh(1e-30), 1e-30);
        assert_eq!(tanh(1e-45), 1e-45);
        assert!(tanh(-0.0).is_sign_negative() && tanh(-0.0) == 0.0);
        assert_eq!(tanh(20.0), 1.0);
        assert!(log(f32::NAN).is_nan() && log(-1.0).is_nan() && log(-0.0) == f32::NEG_INFINITY);
        assert!(log(f32::NEG_INFINITY).is_nan() && log(-1e-45).is_nan());
        assert_eq!(log(0.0), f32::NEG_INFINITY);
        assert_eq!(log(f32::INFINITY), f32::INFINITY);
        assert_eq!(log(1.0), 0.0);
        assert!((log(1e-45) - (-103.278_93)).abs() < 1e-4);
        assert!((log(f32::MAX) - 88.722_84).abs() < 1e-4);
    }

    #[test]
    fn slices_match_the_scalar_forms() {
        // The slice forms run on the widest vectors (`wide`), the scalar
        // forms here on the baseline: the same bits over the sweep, the
        // special values and an odd length (a remainder after the vectors).
        let mut x = sweep(997);
        x.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.0,
            1e-45,
            -1e-45,
        ]);
        x.push(0.5);
        let mut y = vec![0.0; x.len()];
        tanh_slice(&x, &mut y);
        assert!(x
            .iter()
            .zip(&y)
            .all(|(&x, &y)| y.to_bits() == tanh(x).to_bits()));
        sigmoid_slice(&x, &mut y);
        assert!(x
            .iter()
            .zip(&y)
            .all(|(&x, &y)| y.to_bits() == sigmoid(x).to_bits()));
        exp_slice(&x, &mut y);
        assert!(x
            .iter()
            .zip(&y)
            .all(|(&x, &y)| y.to_bits() == exp(x).to_bits()));
        log_slice(&x, &mut y);
        assert!(x
            .iter()
            .zip(&y)
            .all(|(&x, &y)| y.to_bits() == log(x).to_bits()));
    }
}
