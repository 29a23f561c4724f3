//! The one numeric trait hierarchy of the kernels: [`Element`] (every
//! dtype a tensor holds, `tensor.rs`) -> [`Number`] (the numbers, float16
//! included: conversions with Cast's rules, wrapping integer arithmetic,
//! the bounds reductions start from) -> [`Float`] (float32 and float64:
//! IEEE arithmetic and the few math functions kernels call). Kernels are
//! generic over one of these and reach a concrete type through
//! [`crate::with_match_dtype!`]; a family adds no trait of its own.

use crate::tensor::{f16, Element};

/// A number a tensor holds (the dtype set `pod`: integers, float32,
/// float64 and float16).
pub trait Number: Element + Copy + PartialOrd + std::fmt::Display + Send + Sync {
    /// Whether the type is an integer (arithmetic wraps, division
    /// truncates toward zero).
    const INT: bool;
    const ZERO: Self;
    const ONE: Self;
    /// What a max (min) over no elements gives: -inf (inf) for floats,
    /// the type's bounds for integers.
    const MIN_IDENTITY: Self;
    const MAX_IDENTITY: Self;

    /// `v` as this type (Rust's `as`: floats to integers truncate toward
    /// zero and saturate, NaN gives 0).
    fn of(v: f64) -> Self;
    /// `v` as this type, keeping its low bits for an integer (C++'s
    /// conversion; Range's values).
    fn of_wrapped(v: i64) -> Self;
    fn to_f64(self) -> f64;
    fn to_f32(self) -> f32;
    fn to_i32(self) -> i32;
    fn to_i64(self) -> i64;
    fn to_u8(self) -> u8;
    fn to_i8(self) -> i8;
    fn to_i16(self) -> i16;
    fn to_u16(self) -> u16;
    /// `self != 0` (so NaN gives true).
    fn to_bool(self) -> bool;
    /// Rounded to the nearest half (numpy's `astype(np.float16)`).
    fn to_f16(self) -> f16 {
        f16::from_f64(self.to_f64())
    }

    /// Integers wrap like two's-complement C++; floats follow IEEE 754.
    fn wrapping_plus(self, o: Self) -> Self;
    fn wrapping_minus(self, o: Self) -> Self;
    fn wrapping_times(self, o: Self) -> Self;
    /// Integer division truncates toward zero and wraps (`MIN / -1 ==
    /// MIN`); kernels reject zero integer divisors before dividing, and a
    /// zero that gets here anyway gives 0 rather than a panic.
    fn wrapping_over(self, o: Self) -> Self;
    /// `self + o`, or None when an integer sum overflows (floats: IEEE).
    fn checked_plus(self, o: Self) -> Option<Self>;
    fn is_zero(self) -> bool;
}

/// Cast's conversions and `of`, Rust's `as` for every primitive number.
macro_rules! as_conversions {
    ($t:ty) => {
        #[inline]
        fn of(v: f64) -> Self {
            v as $t
        }
        #[inline]
        fn of_wrapped(v: i64) -> Self {
            v as $t
        }
        #[inline]
        fn to_f64(self) -> f64 {
            self as f64
        }
        #[inline]
        fn to_f32(self) -> f32 {
            self as f32
        }
        #[inline]
        fn to_i32(self) -> i32 {
            self as i32
        }
        #[inline]
        fn to_i64(self) -> i64 {
            self as i64
        }
        #[inline]
        fn to_u8(self) -> u8 {
            self as u8
        }
        #[inline]
        fn to_i8(self) -> i8 {
            self as i8
        }
        #[inline]
        fn to_i16(self) -> i16 {
            self as i16
        }
        #[inline]
        fn to_u16(self) -> u16 {
            self as u16
        }
    };
}

macro_rules! number_int {
    ($($t:ty),*) => {$(
        #[allow(clippy::unnecessary_cast)]
        impl Number for $t {
            const INT: bool = true;
            const ZERO: Self = 0;
            const ONE: Self = 1;
            const MIN_IDENTITY: Self = <$t>::MIN;
            const MAX_IDENTITY: Self = <$t>::MAX;
            as_conversions!($t);
            #[inline]
            fn to_bool(self) -> bool { self != 0 }
            #[inline]
            fn wrapping_plus(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline]
            fn wrapping_minus(self, o: Self) -> Self { self.wrapping_sub(o) }
            #[inline]
            fn wrapping_times(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline]
            fn wrapping_over(self, o: Self) -> Self { if o == 0 { 0 } else { self.wrapping_div(o) } }
            #[inline]
            fn checked_plus(self, o: Self) -> Option<Self> { self.checked_add(o) }
            #[inline]
            fn is_zero(self) -> bool { self == 0 }
        }
    )*};
}

macro_rules! number_float {
    ($($t:ty),*) => {$(
        #[allow(clippy::unnecessary_cast)]
        impl Number for $t {
            const INT: bool = false;
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const MIN_IDENTITY: Self = <$t>::NEG_INFINITY;
            const MAX_IDENTITY: Self = <$t>::INFINITY;
            as_conversions!($t);
            #[inline]
            fn to_bool(self) -> bool { self != 0.0 }
            #[inline]
            fn wrapping_plus(self, o: Self) -> Self { self + o }
            #[inline]
            fn wrapping_minus(self, o: Self) -> Self { self - o }
            #[inline]
            fn wrapping_times(self, o: Self) -> Self { self * o }
            #[inline]
            fn wrapping_over(self, o: Self) -> Self { self / o }
            #[inline]
            fn checked_plus(self, o: Self) -> Option<Self> { Some(self + o) }
            #[inline]
            fn is_zero(self) -> bool { self == 0.0 }
        }
    )*};
}

crate::with_match_dtype!(impl integers, number_int);
crate::with_match_dtype!(impl floats, number_float);

/// float16 converts through float32 (exact), then as float32 does.
impl Number for f16 {
    const INT: bool = false;
    const ZERO: Self = f16::ZERO;
    const ONE: Self = f16::ONE;
    const MIN_IDENTITY: Self = f16::NEG_INFINITY;
    const MAX_IDENTITY: Self = f16::INFINITY;
    fn of(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn of_wrapped(v: i64) -> Self {
        f16::from_f64(v as f64)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn to_i32(self) -> i32 {
        f16::to_f32(self).to_i32()
    }
    fn to_i64(self) -> i64 {
        f16::to_f32(self).to_i64()
    }
    fn to_u8(self) -> u8 {
        f16::to_f32(self).to_u8()
    }
    fn to_i8(self) -> i8 {
        f16::to_f32(self).to_i8()
    }
    fn to_i16(self) -> i16 {
        f16::to_f32(self).to_i16()
    }
    fn to_u16(self) -> u16 {
        f16::to_f32(self).to_u16()
    }
    fn to_bool(self) -> bool {
        f16::to_f32(self) != 0.0
    }
    fn to_f16(self) -> f16 {
        self
    }
    fn wrapping_plus(self, o: Self) -> Self {
        self + o
    }
    fn wrapping_minus(self, o: Self) -> Self {
        self - o
    }
    fn wrapping_times(self, o: Self) -> Self {
        self * o
    }
    fn wrapping_over(self, o: Self) -> Self {
        self / o
    }
    fn checked_plus(self, o: Self) -> Option<Self> {
        Some(self + o)
    }
    fn is_zero(self) -> bool {
        f16::to_f32(self) == 0.0
    }
}

/// float32 and float64 (the set `floats`): what the layers, losses,
/// convolutions and optimizers compute in, with IEEE arithmetic and the
/// few functions their kernels call. Matrix products of these types go
/// through `ops::gemm`.
pub trait Float:
    Number
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::AddAssign
    + std::iter::Sum
{
    /// The most negative finite value.
    const LOWEST: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn powf(self, e: Self) -> Self;
    /// e^x, tanh and 1 / (1 + e^-x) for elementwise kernels that want
    /// speed: float32 uses the vectorisable approximations of
    /// `crate::vmath` (a few ulps, see its doc), float64 std's functions
    /// (sigmoid in its stable form). Inlined, so loops over them vectorise.
    fn vexp(self) -> Self;
    fn vtanh(self) -> Self;
    fn vsigmoid(self) -> Self;
}

macro_rules! float {
    ($($t:ty),*) => {$(
        impl Float for $t {
            const LOWEST: Self = <$t>::MIN;
            #[inline]
            fn exp(self) -> Self { <$t>::exp(self) }
            #[inline]
            fn ln(self) -> Self { <$t>::ln(self) }
            #[inline]
            fn sqrt(self) -> Self { <$t>::sqrt(self) }
            #[inline]
            fn powf(self, e: Self) -> Self { <$t>::powf(self, e) }
            #[inline(always)]
            fn vexp(self) -> Self { VMath::vexp_(self) }
            #[inline(always)]
            fn vtanh(self) -> Self { VMath::vtanh_(self) }
            #[inline(always)]
            fn vsigmoid(self) -> Self { VMath::vsigmoid_(self) }
        }
    )*};
}
crate::with_match_dtype!(impl floats, float);

/// Where `Float`'s `v` functions come from, per type: float32 from
/// `crate::vmath`, float64 from std.
trait VMath: Sized {
    fn vexp_(self) -> Self;
    fn vtanh_(self) -> Self;
    fn vsigmoid_(self) -> Self;
}

impl VMath for f32 {
    #[inline(always)]
    fn vexp_(self) -> Self {
        crate::vmath::exp(self)
    }
    #[inline(always)]
    fn vtanh_(self) -> Self {
        crate::vmath::tanh(self)
    }
    #[inline(always)]
    fn vsigmoid_(self) -> Self {
        crate::vmath::sigmoid(self)
    }
}

impl VMath for f64 {
    #[inline]
    fn vexp_(self) -> Self {
        self.exp()
    }
    #[inline]
    fn vtanh_(self) -> Self {
        self.tanh()
    }
    #[inline]
    fn vsigmoid_(self) -> Self {
        if self >= 0.0 {
            1.0 / (1.0 + (-self).exp())
        } else {
            let e = self.exp();
            e / (1.0 + e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_follow_cast_rules() {
        assert_eq!(Number::to_i32(-2.7f32), -2);
        assert_eq!(Number::to_u8(300.0f64), 255);
        assert_eq!(Number::to_i64(f32::NAN), 0);
        assert_eq!(Number::to_u8(-1i32), 255);
        assert!(Number::to_bool(f64::NAN));
        assert_eq!(Number::to_i16(f16::from_f32(-3.5)), -3);
        assert_eq!(Number::to_f16(1.0f64 / 3.0), f16::from_f64(1.0 / 3.0));
    }

    #[test]
    fn integer_arithmetic_wraps_and_division_truncates() {
        assert_eq!(i32::MAX.wrapping_plus(1), i32::MIN);
        assert_eq!(i64::MIN.wrapping_over(-1), i64::MIN);
        assert_eq!((-7i32).wrapping_over(2), -3);
        assert_eq!(5i32.wrapping_over(0), 0);
        assert_eq!(<f32 as Number>::MIN_IDENTITY, f32::NEG_INFINITY);
        assert_eq!(<i64 as Number>::MAX_IDENTITY, i64::MAX);
        assert_eq!(<f64 as Float>::LOWEST, f64::MIN);
    }
}
