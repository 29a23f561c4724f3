//! N-dimensional tensors over `ndarray`, one variant per dtype.
//!
//! There are no implicit casts anywhere: an op that wants `f32` and is handed
//! an `i64` tensor gets a `Type` error naming both dtypes.

use crate::error::{Error, ErrorKind, Result};
/// IEEE 754 half precision, Caffe2's `at::Half` (`TensorProto.FLOAT16`).
pub use half::f16;
use ndarray::{ArrayD, IxDyn};
use std::sync::Arc;

/// Caffe2's `TensorProto.DataType` numbering (kept so plans and checkpoints
/// written by Caffe2 mean the same thing here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum DataType {
    Undefined = 0,
    Float = 1,
    Int32 = 2,
    Byte = 3,
    String = 4,
    Bool = 5,
    Uint8 = 6,
    Int8 = 7,
    Uint16 = 8,
    Int16 = 9,
    Int64 = 10,
    Float16 = 12,
    Double = 13,
}

impl DataType {
    pub fn from_i32(v: i32) -> Option<DataType> {
        use DataType::*;
        Some(match v {
            0 => Undefined,
            1 => Float,
            2 => Int32,
            3 => Byte,
            4 => String,
            5 => Bool,
            6 => Uint8,
            7 => Int8,
            8 => Uint16,
            9 => Int16,
            10 => Int64,
            12 => Float16,
            13 => Double,
            _ => return None,
        })
    }

    /// Parses Caffe2's upper-case names ("FLOAT", "INT64", ...).
    pub fn from_name(s: &str) -> Option<DataType> {
        use DataType::*;
        Some(match s.to_ascii_uppercase().as_str() {
            "UNDEFINED" => Undefined,
            "FLOAT" => Float,
            "INT32" => Int32,
            "BYTE" => Byte,
            "STRING" => String,
            "BOOL" => Bool,
            "UINT8" => Uint8,
            "INT8" => Int8,
            "UINT16" => Uint16,
            "INT16" => Int16,
            "INT64" => Int64,
            "FLOAT16" => Float16,
            "DOUBLE" => Double,
            _ => return None,
        })
    }

    /// The short name used in messages ("float32", "int64", ...), numpy's spelling.
    pub fn name(self) -> &'static str {
        use DataType::*;
        match self {
            Undefined => "undefined",
            Float => "float32",
            Int32 => "int32",
            Byte => "byte",
            String => "string",
            Bool => "bool",
            Uint8 => "uint8",
            Int8 => "int8",
            Uint16 => "uint16",
            Int16 => "int16",
            Int64 => "int64",
            Float16 => "float16",
            Double => "float64",
        }
    }
}

impl DataType {
    /// Caffe2's name of the dtype ("FLOAT", "INT64", ...), as `Cast`'s `to`
    /// takes it and `core.DataType` spells it.
    pub fn caffe2_name(self) -> &'static str {
        use DataType::*;
        match self {
            Undefined => "UNDEFINED",
            Float => "FLOAT",
            Int32 => "INT32",
            Byte => "BYTE",
            String => "STRING",
            Bool => "BOOL",
            Uint8 => "UINT8",
            Int8 => "INT8",
            Uint16 => "UINT16",
            Int16 => "INT16",
            Int64 => "INT64",
            Float16 => "FLOAT16",
            Double => "DOUBLE",
        }
    }

    /// How to give blob `blob` this dtype, for the end of a dtype error:
    /// feeding it so from Python, or converting it in the net. (Python
    /// scalars and lists become float64 or int64 arrays, the usual cause.)
    pub fn conversion_hint(self, blob: &str) -> String {
        let cast = format!(
            "Cast(['{blob}'], ['{blob}_{}'], to=core.DataType.{})",
            self.name(),
            self.caffe2_name()
        );
        match self {
            DataType::String | DataType::Byte | DataType::Undefined => {
                format!("convert '{blob}' with {cast}")
            }
            _ => {
                let np = if self == DataType::Bool {
                    "np.bool_".to_string()
                } else {
                    format!("np.{}", self.name())
                };
                format!(
                    "feed '{blob}' as {self} ({np}(value) for a scalar, array.astype({np}) for an array), \
                     or convert it in the net with {cast}"
                )
            }
        }
    }
}

impl DataType {
    /// The dtypes a tensor can hold, in the order of [`with_match_dtype!`]
    /// (its `all` set).
    pub const TENSOR: &'static [DataType] = crate::with_match_dtype!(dtypes all);
    /// Every dtype but strings (the set `fixed`).
    pub const FIXED: &'static [DataType] = crate::with_match_dtype!(dtypes fixed);
    /// The numbers, float16 included (the set `pod`).
    pub const POD: &'static [DataType] = crate::with_match_dtype!(dtypes pod);
    /// The number dtypes (the set `numeric`).
    pub const NUMERIC: &'static [DataType] = crate::with_match_dtype!(dtypes numeric);
    /// Numbers and bool (the set `numeric_and_bool`): what a numpy array can
    /// be fed as, besides strings.
    pub const NUMERIC_AND_BOOL: &'static [DataType] =
        crate::with_match_dtype!(dtypes numeric_and_bool);
    /// The integer dtypes (the set `integers`).
    pub const INTEGERS: &'static [DataType] = crate::with_match_dtype!(dtypes integers);
    /// int32 and int64 (the set `ints`, Caffe2's `IntTypes`).
    pub const INTS: &'static [DataType] = crate::with_match_dtype!(dtypes ints);
    /// int32, int64, float32 and float64 (the set `arith`, Caffe2's
    /// `NumericTypes`): what its arithmetic kernels take.
    pub const ARITH: &'static [DataType] = crate::with_match_dtype!(dtypes arith);
    /// bool, int32 and int64 (the set `ints_and_bool`: the bitwise ops).
    pub const INTS_AND_BOOL: &'static [DataType] = crate::with_match_dtype!(dtypes ints_and_bool);
    /// bool and the `arith` types (the set `arith_and_bool`: comparisons).
    pub const ARITH_AND_BOOL: &'static [DataType] = crate::with_match_dtype!(dtypes arith_and_bool);
    /// float32 and float64 (the set `floats`).
    pub const FLOATS: &'static [DataType] = crate::with_match_dtype!(dtypes floats);
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A dense tensor. Strings are byte strings, as Caffe2's `std::string` was.
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    F32(Shared<f32>),
    F64(Shared<f64>),
    I32(Shared<i32>),
    I64(Shared<i64>),
    Bool(Shared<bool>),
    U8(Shared<u8>),
    I8(Shared<i8>),
    I16(Shared<i16>),
    U16(Shared<u16>),
    Str(Shared<Vec<u8>>),
    /// float16: stored, fed, fetched, cast, saved and loaded; arithmetic
    /// kernels take it only where Caffe2's CPU ops did.
    F16(Shared<f16>),
}

/// A tensor's storage: an array shared by every clone of the tensor (and
/// by the numpy arrays a zero-copy fetch hands out), copied on write.
///
/// Reading borrows it (`Deref`); writing goes through [`make_unique`]
/// (which [`Tensor::array_mut`] and [`Element::view_mut`] call): a buffer
/// that anything else still holds is first copied, fallibly, so a shared
/// buffer is never written under its other holders. `Tensor::clone` is
/// therefore O(1) and a clone is a value, as before.
pub type Shared<T> = Arc<ArrayD<T>>;

/// The array of `a`, to be written: `a`'s own when nothing else holds it,
/// else a copy of it that replaces it in `a` (copy on write; an
/// `OutOfMemory` error, never an abort, when the copy cannot be allocated).
pub fn make_unique<T: Element>(a: &mut Shared<T>) -> Result<&mut ArrayD<T>> {
    if Arc::get_mut(a).is_none() {
        *a = Arc::new(copy_array(a.view())?);
    }
    Arc::get_mut(a)
        .ok_or_else(|| Error::internal("a tensor buffer copied on write is still shared"))
}

/// The array of `a` by value: moved out when nothing else holds it, else
/// copied (fallibly).
pub fn into_array<T: Element>(a: Shared<T>) -> Result<ArrayD<T>> {
    match Arc::try_unwrap(a) {
        Ok(a) => Ok(a),
        Err(a) => copy_array(a.view()),
    }
}

/// The one dtype dispatch (polars' `with_match_physical_*` pattern): binds
/// the type alias `$T` to the Rust element type of a tensor dtype and
/// evaluates `$body` for it; any other dtype evaluates the `else` arm.
///
/// The sets, each listed once below (`@set`), in the order error messages
/// name them: `all` (every dtype a tensor holds, [`DataType::TENSOR`]),
/// `fixed` (all but strings: what numpy holds in its own buffers), `pod`
/// (the numbers, float16 included: stored as their own bytes),
/// `numeric_and_bool`, `numeric`, `integers`, `ints_and_bool`, `arith_and_bool`, `arith`
/// (int32, int64, float32, float64), `ints` (int32, int64) and `floats`
/// (float32, float64); each has a [`DataType`] constant made from the same
/// list (`with_match_dtype!(dtypes SET)`), which error messages name (with
/// [`dtype_list`] or [`unsupported_dtype_of`]), so the text and the dispatch
/// cannot drift apart.
///
/// - `with_match_dtype!(dt, |T| body, else other => fallback)`: all dtypes
///   (`else` takes one or more match arms).
/// - `with_match_dtype!(SET dt, |T| body, else other => fallback)`: the
///   dtypes of a set (`numeric dt`, `floats dt`, ...).
/// - `with_match_dtype!(tensor SET t, |a: T| body, else other => fallback)`:
///   over a `&Tensor` (or `&mut Tensor`, or `Tensor`), binding `a` to the
///   variant's storage; `with_match_dtype!(tensor t, |a: T| body)` for all.
/// - `with_match_dtype!(each SET, |T| body)`: `body` once per type, in
///   order (for trying each type in turn).
/// - `with_match_dtype!(dtypes SET)`: the set as a `&[DataType]`.
/// - `with_match_dtype!(impl SET, m)`: `m!(t1, t2, ...)` with the set's
///   element types (to implement a trait for each).
#[macro_export]
macro_rules! with_match_dtype {
    // The sets: DataType variant, Tensor variant, element type.
    (@set all, $($k:tt)*) => { $crate::with_match_dtype!{@$($k)*;
        Float F32 f32, Double F64 f64, Int32 I32 i32, Int64 I64 i64, Bool Bool bool,
        Uint8 U8 u8, Int8 I8 i8, Int16 I16 i16, Uint16 U16 u16, String Str Vec<u8>,
        Float16 F16 $crate::tensor::f16} };
    (@set fixed, $($k:tt)*) => { $crate::with_match_dtype!{@$($k)*;
        Float F32 f32, Double F64 f64, Int32 I32 i32, Int64 I64 i64, Bool Bool bool,
        Uint8 U8 u8, Int8 I8 i8, Int16 I16 i16, Uint16 U16 u16, Float16 F16 $crate::tensor::f16} };
    (@set pod, $($k:tt)*) => { $crate::with_match_dtype!{@$($k)*;
        Float F32 f32, Double F64 f64, Int32 I32 i32, Int64 I64 i64,
        Uint8 U8 u8, Int8 I8 i8, Int16 I16 i16, Uint16 U16 u16, Float16 F16 $crate::tensor::f16} };
    (@set numeric_and_bool, $($k:tt)*) => { $crate::with_match_dtype!{@$($k)*;
        Float F32 f32, Double F64 f64, Int32 I32 i32, Int64 I64 i64, Bool Bool bool,
        Uint8 U8 u8, Int8 I8 i8, Int16 I16 i16, Uint16 U16 u16} };
    (@set numeric, $($k:tt)*) => { $crate::with_match_dtype!{@$($k)*;
        Float F32 f32, Double F64 f64, Int32 I32 i32, Int64 I64 i64,
        Uint8 U8 u8, Int8 I8 i8, Int16 I16 i16, Uint16 U16 u16} };
    (@set integers, $($k:tt)*) => { $crate::with_match_dtype!{@$($k)*;
        Int32 I32 i32, Int64 I64 i64, Uint8 U8 u8, Int8 I8 i8, Int16 I16 i16, Uint16 U16 u16} };
    (@set ints_and_bool, $($k:tt)*) => { $crate::with_match_dtype!{@$($k)*;
        Bool Bool bool, Int32 I32 i32, Int64 I64 i64} };
    (@set arith_and_bool, $($k:tt)*) => { $crate::with_match_dtype!{@$($k)*;
        Bool Bool bool, Int32 I32 i32, Int64 I64 i64, Float F32 f32, Double F64 f64} };
    (@set arith, $($k:tt)*) => { $crate::with_match_dtype!{@$($k)*;
        Int32 I32 i32, Int64 I64 i64, Float F32 f32, Double F64 f64} };
    (@set ints, $($k:tt)*) => { $crate::with_match_dtype!{@$($k)*; Int32 I32 i32, Int64 I64 i64} };
    (@set floats, $($k:tt)*) => { $crate::with_match_dtype!{@$($k)*; Float F32 f32, Double F64 f64} };

    // The forms.
    (dtypes $set:ident) => { $crate::with_match_dtype!{@set $set, dtypes} };
    (impl $set:ident, $m:ident) => { $crate::with_match_dtype!{@set $set, impls $m} };
    (each $set:ident, |$T:ident| $body:expr) => {
        $crate::with_match_dtype!{@set $set, each $T, $body}
    };
    (tensor $set:ident $t:expr, |$a:ident : $T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set $set, tmatch $t, $a, $T, $body, $($other => $fallback),+}
    };
    (enum $E:ident, $set:ident $t:expr, |$a:ident : $T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set $set, ematch $E, $t, $a, $T, $body, $($other => $fallback),+}
    };
    (wrap $E:ident, $set:ident $dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set $set, wrap $E, $dt, $T, $body, $($other => $fallback),+}
    };
    (tensor $t:expr, |$a:ident : $T:ident| $body:expr) => {
        $crate::with_match_dtype!{@set all, tmatch_all $t, $a, $T, $body}
    };
    (fixed $dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set fixed, match $dt, $T, $body, $($other => $fallback),+}
    };
    (pod $dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set pod, match $dt, $T, $body, $($other => $fallback),+}
    };
    (numeric_and_bool $dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set numeric_and_bool, match $dt, $T, $body, $($other => $fallback),+}
    };
    (numeric $dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set numeric, match $dt, $T, $body, $($other => $fallback),+}
    };
    (integers $dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set integers, match $dt, $T, $body, $($other => $fallback),+}
    };
    (ints_and_bool $dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set ints_and_bool, match $dt, $T, $body, $($other => $fallback),+}
    };
    (arith_and_bool $dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set arith_and_bool, match $dt, $T, $body, $($other => $fallback),+}
    };
    (arith $dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set arith, match $dt, $T, $body, $($other => $fallback),+}
    };
    (ints $dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set ints, match $dt, $T, $body, $($other => $fallback),+}
    };
    (floats $dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set floats, match $dt, $T, $body, $($other => $fallback),+}
    };
    ($dt:expr, |$T:ident| $body:expr, else $($other:pat => $fallback:expr),+ $(,)?) => {
        $crate::with_match_dtype!{@set all, match $dt, $T, $body, $($other => $fallback),+}
    };

    // The expansions.
    (@dtypes; $($v:ident $tv:ident $ty:ty),*) => {
        &[$($crate::tensor::DataType::$v),*]
    };
    (@impls $m:ident; $($v:ident $tv:ident $ty:ty),*) => { $m!{$($ty),*} };
    (@match $dt:expr, $T:ident, $body:expr, $($other:pat => $fallback:expr),+;
        $($v:ident $tv:ident $ty:ty),*) => {
        match $dt {
            $($crate::tensor::DataType::$v => {
                #[allow(dead_code)]
                type $T = $ty;
                $body
            })*
            $(#[allow(unreachable_patterns)]
            $other => $fallback,)+
        }
    };
    (@tmatch $t:expr, $a:ident, $T:ident, $body:expr, $($other:pat => $fallback:expr),+;
        $($v:ident $tv:ident $ty:ty),*) => {
        match $t {
            $($crate::tensor::Tensor::$tv($a) => {
                #[allow(dead_code)]
                type $T = $ty;
                $body
            })*
            $(#[allow(unreachable_patterns)]
            $other => $fallback,)+
        }
    };
    (@ematch $E:ident, $t:expr, $a:ident, $T:ident, $body:expr, $($other:pat => $fallback:expr),+;
        $($v:ident $tv:ident $ty:ty),*) => {
        match $t {
            $($E::$tv($a) => {
                #[allow(dead_code)]
                type $T = $ty;
                $body
            })*
            $(#[allow(unreachable_patterns)]
            $other => $fallback,)+
        }
    };
    (@wrap $E:ident, $dt:expr, $T:ident, $body:expr, $($other:pat => $fallback:expr),+;
        $($v:ident $tv:ident $ty:ty),*) => {
        match $dt {
            $($crate::tensor::DataType::$v => {
                #[allow(dead_code)]
                type $T = $ty;
                $E::$tv($body)
            })*
            $(#[allow(unreachable_patterns)]
            $other => $fallback,)+
        }
    };
    (@tmatch_all $t:expr, $a:ident, $T:ident, $body:expr;
        $($v:ident $tv:ident $ty:ty),*) => {
        match $t {
            $($crate::tensor::Tensor::$tv($a) => {
                #[allow(dead_code)]
                type $T = $ty;
                $body
            })*
        }
    };
    (@each $T:ident, $body:expr; $($v:ident $tv:ident $ty:ty),*) => {
        $({
            #[allow(dead_code)]
            type $T = $ty;
            $body
        })*
    };
}

/// "a, b and c": the names of `dtypes`, for the "supported dtypes" part of
/// error messages (over [`DataType::TENSOR`], [`DataType::NUMERIC`], ...).
pub fn dtype_list(dtypes: &[DataType]) -> String {
    let names: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

/// "a, b or c": the names of `dtypes` as alternatives ("must be a float32
/// or float64 tensor").
pub fn dtype_choice(dtypes: &[DataType]) -> String {
    let names: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

/// Applies one expression to whichever array a tensor holds.
#[macro_export]
macro_rules! with_array {
    ($t:expr, $a:ident => $body:expr) => {
        $crate::with_match_dtype!(tensor $t, |$a: _T| $body)
    };
}

/// A dtype no tensor holds (undefined, the legacy byte type).
#[cold]
pub fn unsupported_dtype(dt: DataType) -> Error {
    Error::type_error(format!("unsupported tensor dtype {dt}"))
}

#[cold]
fn wrong_dtype(want: DataType, got: DataType) -> Error {
    Error::type_error(format!("expected a tensor of dtype {want} but got {got}"))
}

/// A Rust element type that a tensor can hold.
pub trait Element: Clone + Default + Send + Sync + std::fmt::Debug + 'static {
    const DTYPE: DataType;
    /// Whether an all-zero bit pattern is a valid value equal to
    /// `Self::default()` (numbers and bool; not strings), so that a buffer of
    /// defaults can come zeroed from the allocator.
    const ZEROED_IS_DEFAULT: bool;
    fn wrap(a: ArrayD<Self>) -> Tensor;
    /// The array, borrowed, if the tensor's dtype is `Self`.
    fn view(t: &Tensor) -> Option<&ArrayD<Self>>;
    /// The shared storage, if the tensor's dtype is `Self`.
    fn shared(t: &Tensor) -> Option<&Shared<Self>>;
    /// The shared storage, to replace or to [`make_unique`].
    fn shared_mut(t: &mut Tensor) -> Option<&mut Shared<Self>>;
    /// The array, to be written, if the tensor's dtype is `Self`: copied
    /// first if its buffer is shared ([`make_unique`]); `None` also when
    /// that copy cannot be allocated (use [`Tensor::array_mut`] for the
    /// error).
    fn view_mut(t: &mut Tensor) -> Option<&mut ArrayD<Self>> {
        Self::shared_mut(t).and_then(|a| make_unique(a).ok())
    }
}

macro_rules! element {
    ($ty:ty, $var:ident, $dt:ident, $zeroed:expr) => {
        impl Element for $ty {
            const DTYPE: DataType = DataType::$dt;
            const ZEROED_IS_DEFAULT: bool = $zeroed;
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$var(Arc::new(a))
            }
            fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
                match t {
                    Tensor::$var(a) => Some(a),
                    _ => None,
                }
            }
            fn shared(t: &Tensor) -> Option<&Shared<Self>> {
                match t {
                    Tensor::$var(a) => Some(a),
                    _ => None,
                }
            }
            fn shared_mut(t: &mut Tensor) -> Option<&mut Shared<Self>> {
                match t {
                    Tensor::$var(a) => Some(a),
                    _ => None,
                }
            }
        }
        impl From<ArrayD<$ty>> for Tensor {
            fn from(a: ArrayD<$ty>) -> Tensor {
                Tensor::$var(Arc::new(a))
            }
        }
        impl From<Shared<$ty>> for Tensor {
            fn from(a: Shared<$ty>) -> Tensor {
                Tensor::$var(a)
            }
        }
    };
}

element!(f32, F32, Float, true);
element!(f64, F64, Double, true);
element!(i32, I32, Int32, true);
element!(i64, I64, Int64, true);
element!(bool, Bool, Bool, true);
element!(u8, U8, Uint8, true);
element!(i8, I8, Int8, true);
element!(i16, I16, Int16, true);
element!(u16, U16, Uint16, true);
element!(Vec<u8>, Str, String, false);
element!(f16, F16, Float16, true);

/// Buffers of at least this many bytes ask for transparent huge pages (numpy
/// does the same for its arrays of 4 MiB or more).
pub const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// Asks Linux to back the 2 MiB-aligned part of `len` bytes at `ptr` with
/// transparent huge pages when they are first touched (`MADV_HUGEPAGE`;
/// under the common `enabled=madvise` setting nothing else gets them).
/// Streaming over huge pages costs fewer TLB misses and page walks, which
/// are dear in a VM; numpy's arrays have them, so a kernel over 4 KiB pages
/// starts behind. Pages already touched keep their size. Only the contents'
/// paging policy changes, never the contents; a no-op for small buffers,
/// off Linux, and when the kernel refuses.
pub fn advise_huge_pages(ptr: *const u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::{c_int, c_void};
        extern "C" {
            fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
        }
        const MADV_HUGEPAGE: c_int = 14;
        const HUGE: usize = 2 << 20;
        if len < HUGE_PAGE_MIN_BYTES {
            return;
        }
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: [start, end) lies inside the caller's allocation and is
            // page-aligned; MADV_HUGEPAGE changes no data. Errors are ignored.
            unsafe {
                madvise(start as *mut c_void, end - start, MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}

// ------------------------------------------------------------ allocation --
//
// Every buffer whose size an op's arguments or inputs decide is allocated
// here, fallibly: a size that passes the element-count checks but that the
// system cannot provide is an `OutOfMemory` error (Python: MemoryError) that
// the op, its net and its output blob name, never an abort of the process
// (Rust's infallible allocations abort on failure: `vec![x; n]`,
// `Vec::with_capacity`, `collect`, ndarray's constructors). Sizes are
// counted with the checked arithmetic below ([`checked_numel`],
// [`size_mul`], [`size_add`]): a count that overflows is a `Shape` error
// (or the caller's `InvalidArgument`, naming its argument), never a
// panic, nor a wrapped size that allocates the wrong amount.
//
// Kernels use: [`zeroed_vec`] (a tensor's buffer of zeros, its shape
// checked), [`default_buffer`] (n zeros), [`filled_vec`] (n copies of a
// value: scratch of any type), [`try_vec`] (room for n), [`try_collect`]
// (an iterator's items), [`try_to_vec`] (a copy of a slice), and the array helpers [`default_array`],
// [`filled_array`], [`collect_array`], [`copy_array`], [`map_array`],
// [`zip_map_array`], [`fold_axis_array`], [`concatenate`].

/// The error for a size that overflows: `what` says what was being
/// sized, from what (an op's argument or input, named).
#[cold]
pub fn size_overflow(what: impl std::fmt::Display) -> Error {
    Error::shape(format!(
        "{what}: the size overflows (more elements than any tensor can hold)"
    ))
}

/// `a * b`, or a [`size_overflow`] error for `what`.
#[inline]
pub fn size_mul(a: usize, b: usize, what: impl FnOnce() -> String) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| size_overflow(what()))
}

/// `a + b`, or a [`size_overflow`] error for `what`.
#[inline]
pub fn size_add(a: usize, b: usize, what: impl FnOnce() -> String) -> Result<usize> {
    a.checked_add(b).ok_or_else(|| size_overflow(what()))
}

/// The number of elements of `shape`, if the shape is one a `T` tensor can
/// have: the product of its non-zero dims, in bytes, fits in `isize` (the
/// most one allocation can hold; ndarray's rule, so a zero dim does not
/// excuse the others). Else a `Shape` error naming `what` (the tensor:
/// "Tile's output", "the filter 'W'") and the shape.
pub fn checked_numel<T>(shape: &[usize], what: impl std::fmt::Display) -> Result<usize> {
    let item = std::mem::size_of::<T>().max(1);
    let fits = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .and_then(|n| n.checked_mul(item))
        .is_some_and(|b| b <= isize::MAX as usize);
    if !fits {
        return Err(Error::shape(format!(
            "{what}: the shape {shape:?} has too many elements (more than any tensor can hold)"
        )));
    }
    Ok(shape.iter().product())
}

/// A buffer of zeros (default values) for a `T` tensor of `shape` (its
/// count checked by [`checked_numel`]), or an `OutOfMemory` error. The
/// errors name `what` (the tensor: "Conv's output").
pub fn zeroed_vec<T: Element>(shape: &[usize], what: impl std::fmt::Display) -> Result<Vec<T>> {
    let n = checked_numel::<T>(shape, &what)?;
    default_buffer(
        n,
        format_args!("{what} ({} tensor of shape {shape:?})", T::DTYPE),
    )
}

/// `n` copies of `value` (scratch of any type), or an `OutOfMemory`
/// error for `what`.
pub fn filled_vec<T: Clone>(n: usize, value: T, what: impl std::fmt::Display) -> Result<Vec<T>> {
    let mut v = try_vec(n, what)?;
    v.resize(n, value);
    Ok(v)
}

/// A copy of `s` in a fallibly allocated `Vec` (`to_vec` aborts when it
/// cannot allocate).
pub fn try_to_vec<T: Clone>(s: &[T], what: impl std::fmt::Display) -> Result<Vec<T>> {
    let mut v = try_vec(s.len(), what)?;
    v.extend_from_slice(s);
    Ok(v)
}

/// The items of `it` in a fallibly allocated `Vec` (room for its lower
/// size hint is reserved first; more, if it yields more, fallibly too).
pub fn try_collect<T>(
    it: impl IntoIterator<Item = T>,
    what: impl std::fmt::Display,
) -> Result<Vec<T>> {
    let it = it.into_iter();
    let (lo, hi) = it.size_hint();
    let mut v = try_vec(lo, &what)?;
    if hi == Some(lo) {
        // An exact hint (a map over a slice or a range): `extend` fills the
        // room reserved above in one loop that vectorises, without the
        // per-item capacity check below. Should the iterator break its
        // hint and yield more, `extend` grows the Vec infallibly.
        v.extend(it);
        return Ok(v);
    }
    for x in it {
        if v.len() == v.capacity() {
            v.try_reserve(1).map_err(|_| {
                alloc_error(
                    (v.len() + 1).saturating_mul(std::mem::size_of::<T>()),
                    &what,
                )
            })?;
        }
        v.push(x);
    }
    Ok(v)
}

/// The `OutOfMemory` error for `what` (a tensor of a dtype and shape, a
/// buffer), naming the size asked for.
pub fn alloc_error(bytes: usize, what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::OutOfMemory,
        format!("cannot allocate {bytes} bytes for {what}: out of memory"),
    )
}

fn tensor_what<T: Element>(shape: &[usize]) -> TensorWhat<'_, T> {
    TensorWhat(shape, std::marker::PhantomData)
}

/// "a float tensor of shape [2, 3]", written only if an error needs it
/// (allocations name what they were for, and most succeed).
struct TensorWhat<'a, T>(&'a [usize], std::marker::PhantomData<T>);

impl<T: Element> std::fmt::Display for TensorWhat<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = T::DTYPE.to_string();
        let article = if name.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        write!(f, "{article} {name} tensor of shape {:?}", self.0)
    }
}

/// An empty `Vec` with room for `n` elements, or an `OutOfMemory` error
/// for `what`.
pub fn try_vec<T>(n: usize, what: impl std::fmt::Display) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| alloc_error(n.saturating_mul(std::mem::size_of::<T>()), what))?;
    Ok(v)
}

/// `n` values that `fill` writes, in a fallibly allocated `Vec` that is
/// not cleared first (else an `OutOfMemory` error for `what`): for outputs
/// that a kernel overwrites entirely. A large buffer the allocator hands
/// back after a free (glibc keeps freed blocks of up to 32 MiB) is not
/// fresh from the OS, so `calloc` ([`default_buffer`]) clears it in a pass
/// of its own, as long as the kernel's. Large ones are advised to use huge
/// pages, as `default_buffer`'s.
///
/// # Safety
/// `fill` must write every element of the slice it is given (with
/// `MaybeUninit::write`); when it panics the buffer is freed unread.
pub unsafe fn written_vec<T>(
    n: usize,
    what: impl std::fmt::Display,
    fill: impl FnOnce(&mut [std::mem::MaybeUninit<T>]),
) -> Result<Vec<T>> {
    let mut v: Vec<T> = try_vec(n, what)?;
    advise_huge_pages(
        v.as_ptr().cast(),
        n.saturating_mul(std::mem::size_of::<T>()),
    );
    fill(&mut v.spare_capacity_mut()[..n]);
    // SAFETY: the capacity is at least n, and the caller's `fill` wrote
    // all n elements.
    unsafe { v.set_len(n) };
    Ok(v)
}

/// Buffers of zeros of at least this many bytes are cleared by the kernel
/// pool's threads together ([`default_buffer`]), in chunks of
/// [`PAR_ZERO_CHUNK`] bytes: a buffer the allocator hands back after a
/// free (its cache, or glibc's) is cleared by a pass of its own, which on
/// the calling thread alone made a convolution's or a recurrent gradient's
/// zeroed output a serial stretch of a two-thread op (BENCHMARKS.md
/// "Zeroed buffers, Conv's bias, Concat and Winograd's scratch on the
/// pool").
const PAR_ZERO_BYTES: usize = 2 << 20;
const PAR_ZERO_CHUNK: usize = 256 << 10;

/// A tensor buffer of `n` default values (0, false, ""), or an
/// `OutOfMemory` error for `what`. Numeric buffers come zeroed from the
/// allocator (`calloc`, which maps fresh, untouched pages for large sizes,
/// as `vec![0; n]` does), or from [`PAR_ZERO_BYTES`] on, when the kernel
/// pool has more than one thread, cleared by its threads; large ones are
/// advised to use huge pages before anything writes them.
pub fn default_buffer<T: Element>(n: usize, what: impl std::fmt::Display) -> Result<Vec<T>> {
    let size = std::mem::size_of::<T>();
    let bytes = n.saturating_mul(size);
    let v = if T::ZEROED_IS_DEFAULT && bytes >= PAR_ZERO_BYTES && crate::threads::num_threads() > 1
    {
        use rayon::prelude::*;
        let mut v = try_vec::<T>(n, what)?;
        advise_huge_pages(v.as_ptr().cast(), bytes);
        v.spare_capacity_mut()[..n]
            .par_chunks_mut((PAR_ZERO_CHUNK / size).max(1))
            // SAFETY: writes zero bytes over the chunk's own elements.
            .for_each(|c| unsafe { std::ptr::write_bytes(c.as_mut_ptr(), 0, c.len()) });
        // SAFETY: the first n elements were all set to zero bytes just
        // above, a valid T (ZEROED_IS_DEFAULT).
        unsafe { v.set_len(n) };
        return Ok(v);
    } else if T::ZEROED_IS_DEFAULT && n > 0 && size > 0 {
        let layout = std::alloc::Layout::array::<T>(n)
            .map_err(|_| alloc_error(n.saturating_mul(size), &what))?;
        // SAFETY: the layout has a non-zero size (n > 0, size > 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
        if ptr.is_null() {
            return Err(alloc_error(layout.size(), what));
        }
        // SAFETY: `ptr` was allocated by the global allocator with the
        // layout of `n` Ts (what a Vec of capacity n uses); all n elements
        // are initialised, as zero bytes are a valid T (ZEROED_IS_DEFAULT).
        unsafe { Vec::from_raw_parts(ptr, n, n) }
    } else {
        let mut v = try_vec(n, what)?;
        v.resize(n, T::default());
        v
    };
    advise_huge_pages(v.as_ptr().cast(), n.saturating_mul(size));
    Ok(v)
}

/// [`checked_numel`] for a tensor named by its dtype and shape.
fn checked_count<T: Element>(shape: &[usize]) -> Result<usize> {
    checked_numel::<T>(shape, format_args!("a {} tensor", T::DTYPE))
}

/// An array of default values of `shape`, on a [`default_buffer`].
pub fn default_array<T: Element>(shape: &[usize]) -> Result<ArrayD<T>> {
    let n = checked_count::<T>(shape)?;
    let v = default_buffer(n, tensor_what::<T>(shape))?;
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| Error::shape(e.to_string()))
}

/// Whether `v`'s bytes are all zero (for numbers and bool only), so that a
/// buffer of `v`s can come zeroed from the allocator. Bits, not `==`: -0.0
/// equals 0.0 but is not zero bytes.
fn is_zero_bits<T: Element>(v: &T) -> bool {
    if !T::ZEROED_IS_DEFAULT {
        return false;
    }
    // SAFETY: ZEROED_IS_DEFAULT types are primitive numbers and bool, whose
    // bytes are all initialised (no padding); `v` is a valid reference.
    let bytes = unsafe {
        std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>())
    };
    bytes.iter().all(|&b| b == 0)
}

/// An array of `shape` holding `value` everywhere (zeros come untouched
/// from the allocator, as `vec![0; n]` would).
pub fn filled_array<T: Element>(shape: &[usize], value: T) -> Result<ArrayD<T>> {
    if is_zero_bits(&value) {
        return default_array(shape);
    }
    let n = checked_count::<T>(shape)?;
    let mut v = try_vec(n, tensor_what::<T>(shape))?;
    v.resize(n, value);
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| Error::shape(e.to_string()))
}

/// An array of `shape` holding the values `values` yields, row-major
/// (which must be exactly as many as the shape holds).
pub fn collect_array<T: Element>(
    shape: &[usize],
    values: impl IntoIterator<Item = T>,
) -> Result<ArrayD<T>> {
    let n = checked_count::<T>(shape)?;
    let mut v = try_vec(n, tensor_what::<T>(shape))?;
    v.extend(values.into_iter().take(n));
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| Error::shape(e.to_string()))
}

/// `f` of each element of `a` (row-major), in a fallibly allocated array
/// of `a`'s shape (ndarray's `map`/`mapv` abort when they cannot allocate).
pub fn map_array<A, U: Element>(
    a: ndarray::ArrayViewD<'_, A>,
    f: impl FnMut(&A) -> U,
) -> Result<ArrayD<U>> {
    let mut v = try_vec(a.len(), tensor_what::<U>(a.shape()))?;
    match a.as_slice() {
        Some(s) => v.extend(s.iter().map(f)),
        None => v.extend(a.iter().map(f)),
    }
    ArrayD::from_shape_vec(a.raw_dim(), v).map_err(|e| Error::internal(format!("mapping: {e}")))
}

/// `f` of each pair of elements of `a` and `b` (one shape, checked by the
/// caller), in a fallibly allocated array (ndarray's `Zip::map_collect`
/// aborts when it cannot allocate).
pub fn zip_map_array<A, B, U: Element>(
    a: ndarray::ArrayViewD<'_, A>,
    b: ndarray::ArrayViewD<'_, B>,
    mut f: impl FnMut(&A, &B) -> U,
) -> Result<ArrayD<U>> {
    if a.shape() != b.shape() {
        return Err(Error::shape(format!(
            "mapping shapes {:?} and {:?} together",
            a.shape(),
            b.shape()
        )));
    }
    let mut v = try_vec(a.len(), tensor_what::<U>(a.shape()))?;
    match (a.as_slice(), b.as_slice()) {
        (Some(x), Some(y)) => v.extend(x.iter().zip(y).map(|(x, y)| f(x, y))),
        _ => v.extend(a.iter().zip(b.iter()).map(|(x, y)| f(x, y))),
    }
    ArrayD::from_shape_vec(a.raw_dim(), v).map_err(|e| Error::internal(format!("mapping: {e}")))
}

/// `a` folded along `axis` (kept, of length 1), each result
/// `f(...f(f(init, a[0]), a[1])..., a[n-1])` as ndarray's `fold_axis`, in
/// a fallibly allocated array (`fold_axis` aborts when it cannot allocate).
pub fn fold_axis_array<T: Element>(
    a: ndarray::ArrayViewD<'_, T>,
    axis: usize,
    init: T,
    f: impl Fn(&T, &T) -> T,
) -> Result<ArrayD<T>> {
    let mut shape = a.shape().to_vec();
    shape[axis] = 1;
    let mut out = filled_array(&shape, init)?;
    {
        let mut o = out.index_axis_mut(ndarray::Axis(axis), 0);
        for lane in a.axis_iter(ndarray::Axis(axis)) {
            ndarray::Zip::from(&mut o)
                .and(&lane)
                .for_each(|o, x| *o = f(o, x));
        }
    }
    Ok(out)
}

/// Whether `T`'s values are plain bytes (numbers, bool: no drop glue,
/// `ZEROED_IS_DEFAULT`), so copying the bytes copies the values.
pub(crate) fn plain<T: Element>() -> bool {
    T::ZEROED_IS_DEFAULT && !std::mem::needs_drop::<T>()
}

/// `dst = src` (of one length). Plain values (numbers, bool) are copied
/// as bytes, a long copy shared with idle pool threads
/// (`threads::copy_bytes`); strings are cloned.
pub fn copy_values<T: Element>(dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "copy_values: lengths differ");
    if plain::<T>() {
        // SAFETY: both slices are live for `size_of_val(src)` bytes and do
        // not overlap (one is borrowed mutably); a plain value's bytes are
        // a valid copy of it.
        unsafe {
            crate::threads::copy_bytes(
                dst.as_mut_ptr().cast(),
                src.as_ptr().cast(),
                std::mem::size_of_val(src),
            )
        }
    } else {
        dst.clone_from_slice(src);
    }
}

/// Appends `src` to `v`, whose spare capacity holds it (else a plain
/// `extend_from_slice`), as [`copy_values`] copies.
pub fn extend_values<T: Element>(v: &mut Vec<T>, src: &[T]) {
    if !plain::<T>() || v.capacity() - v.len() < src.len() {
        v.extend_from_slice(src);
        return;
    }
    let at = v.len();
    // SAFETY: the spare capacity holds `src.len()` elements, written as
    // bytes of plain values (see `copy_values`) before the length grows.
    unsafe {
        crate::threads::copy_bytes(
            v.as_mut_ptr().add(at).cast(),
            src.as_ptr().cast(),
            std::mem::size_of_val(src),
        );
        v.set_len(at + src.len());
    }
}

/// An owned copy of `a` (row-major), or an `OutOfMemory` error. A large
/// contiguous source is copied into a buffer advised to use huge pages
/// before it is written, so tensors copied in from outside (fed arrays,
/// loaded checkpoints) stream as fast as the numpy arrays they came from.
pub fn copy_array<T: Element>(a: ndarray::ArrayViewD<'_, T>) -> Result<ArrayD<T>> {
    let n = a.len();
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    let mut v: Vec<T> = try_vec(n, tensor_what::<T>(a.shape()))?;
    advise_huge_pages(v.as_ptr().cast(), bytes);
    match a.as_slice() {
        Some(src) => extend_values(&mut v, src),
        None => v.extend(a.iter().cloned()),
    }
    ArrayD::from_shape_vec(a.raw_dim(), v).map_err(|e| Error::internal(format!("copying: {e}")))
}

/// `views` joined along `axis` (their other dims are equal; at least one
/// view), in a fallibly allocated array: ndarray's `concatenate` aborts
/// when the result cannot be allocated, and an op that names one input many
/// times makes a result far larger than its inputs. Along axis 0 the views
/// are copied one after the other (`memcpy` for contiguous ones).
pub fn concatenate<T: Element>(
    axis: usize,
    views: &[ndarray::ArrayViewD<'_, T>],
) -> Result<ArrayD<T>> {
    let first = views
        .first()
        .ok_or_else(|| Error::internal("concatenating no arrays"))?;
    let mut shape = first.shape().to_vec();
    shape[axis] = views
        .iter()
        .try_fold(0usize, |n, v| n.checked_add(v.shape()[axis]))
        .ok_or_else(|| Error::shape(format!("the concatenated dim {axis} overflows")))?;
    if axis == 0 {
        let n = checked_count::<T>(&shape)?;
        let mut v = try_vec(n, tensor_what::<T>(&shape))?;
        for part in views {
            match part.as_slice() {
                Some(s) => v.extend_from_slice(s),
                None => v.extend(part.iter().cloned()),
            }
        }
        return ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| Error::shape(e.to_string()));
    }
    if views.iter().all(|v| v.as_slice().is_some()) {
        // Contiguous parts (the usual case, NCHW channels): for each index
        // of the dims before the axis, each part's block of the dims from
        // the axis on, in turn, appended (no zero-filled buffer first).
        let n = checked_count::<T>(&shape)?;
        let outer: usize = shape[..axis].iter().product();
        let mut v = try_vec(n, tensor_what::<T>(&shape))?;
        if n > 0 {
            let blocks: Vec<(&[T], usize)> = views
                .iter()
                .filter_map(|p| p.as_slice().map(|s| (s, s.len() / outer)))
                .collect();
            for o in 0..outer {
                for &(s, k) in &blocks {
                    v.extend_from_slice(&s[o * k..(o + 1) * k]);
                }
            }
        }
        return ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| Error::shape(e.to_string()));
    }
    let mut out = default_array::<T>(&shape)?;
    let mut at = 0;
    for part in views {
        let k = part.shape()[axis];
        out.slice_axis_mut(ndarray::Axis(axis), ndarray::Slice::from(at..at + k))
            .assign(part);
        at += k;
    }
    Ok(out)
}

impl Tensor {
    /// Same dtype, shape and bits: unlike `==`, a NaN equals itself and
    /// -0.0 differs from 0.0 (a write of either is a change).
    pub fn same_bits(&self, other: &Tensor) -> bool {
        match (self, other) {
            (Tensor::F32(a), Tensor::F32(b)) => {
                a.shape() == b.shape()
                    && a.iter()
                        .zip(b.iter())
                        .all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (Tensor::F64(a), Tensor::F64(b)) => {
                a.shape() == b.shape()
                    && a.iter()
                        .zip(b.iter())
                        .all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (Tensor::F16(a), Tensor::F16(b)) => {
                a.shape() == b.shape()
                    && a.iter()
                        .zip(b.iter())
                        .all(|(x, y)| x.to_bits() == y.to_bits())
            }
            _ => self == other,
        }
    }

    #[inline]
    pub fn dtype(&self) -> DataType {
        crate::with_match_dtype!(tensor self, |_a: T| T::DTYPE)
    }

    #[inline]
    pub fn shape(&self) -> &[usize] {
        with_array!(self, a => a.shape())
    }

    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    pub fn numel(&self) -> usize {
        with_array!(self, a => a.len())
    }

    /// The size in bytes of one element as stored (for strings, of the
    /// string's header, not of its bytes).
    pub fn item_size(&self) -> usize {
        fn size<T>(_: &ArrayD<T>) -> usize {
            std::mem::size_of::<T>()
        }
        with_array!(self, a => size(a))
    }

    /// A tensor of default values (0, false, "") of the given dtype and shape.
    pub fn zeros(dtype: DataType, shape: &[usize]) -> Result<Tensor> {
        // Caffe2's legacy BYTE tensors are uint8.
        let dtype = if dtype == DataType::Byte {
            DataType::Uint8
        } else {
            dtype
        };
        crate::with_match_dtype!(dtype, |T| Ok(T::wrap(default_array::<T>(shape)?)),
            else other => Err(unsupported_dtype(other)))
    }

    /// A copy of the tensor. Storage is copy-on-write, so this shares the
    /// buffer (O(1), as `clone`); the first write to either copies it.
    /// Never fails now; kept fallible for its callers.
    pub fn try_clone(&self) -> Result<Tensor> {
        Ok(self.clone())
    }

    /// The same elements (row-major) in the shape `shape`, which must hold
    /// as many; the buffer is moved, not copied, when nothing else holds
    /// it and it is in row-major order.
    pub fn into_shape(self, shape: &[usize]) -> Result<Tensor> {
        let n = checked_numel::<u8>(shape, "the new shape")?;
        if n != self.numel() {
            return Err(Error::shape(format!(
                "a tensor of shape {:?} cannot take the shape {shape:?}",
                self.shape()
            )));
        }
        fn reshaped<T: Element>(a: Shared<T>, shape: &[usize]) -> Result<Shared<T>> {
            let a = into_array(a)?;
            let a = if a.is_standard_layout() {
                a
            } else {
                copy_array(a.view())?
            };
            a.into_shape_with_order(IxDyn(shape))
                .map(Arc::new)
                .map_err(|e| Error::internal(format!("reshaping: {e}")))
        }
        Ok(crate::with_match_dtype!(tensor self, |a: T| Tensor::from(reshaped(a, shape)?)))
    }

    /// A copy of the tensor in a buffer of its own (row-major), or an
    /// `OutOfMemory` error.
    pub fn deep_copy(&self) -> Result<Tensor> {
        Ok(with_array!(self, a => Tensor::from(copy_array(a.view())?)))
    }

    /// A 0-dim tensor holding one value.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        T::wrap(ArrayD::from_elem(IxDyn(&[]), v))
    }

    /// Builds a tensor from a shape and flat row-major values.
    pub fn from_vec<T: Element>(shape: &[usize], values: Vec<T>) -> Result<Tensor> {
        let n = checked_count::<T>(shape)?;
        if n != values.len() {
            return Err(Error::shape(format!(
                "shape {:?} holds {} elements but {} values were given",
                shape,
                n,
                values.len()
            )));
        }
        ArrayD::from_shape_vec(IxDyn(shape), values)
            .map(T::wrap)
            .map_err(|e| Error::shape(e.to_string()))
    }

    /// Borrows the array if the dtype is `T`, else a `Type` error naming both.
    // Inlined (with the error out of line): kernels call it once per run.
    #[inline]
    pub fn array<T: Element>(&self) -> Result<&ArrayD<T>> {
        match T::view(self) {
            Some(a) => Ok(a),
            None => Err(wrong_dtype(T::DTYPE, self.dtype())),
        }
    }

    /// The array, to be written, if the dtype is `T`, else a `Type` error
    /// naming both. Copy on write: a buffer shared with anything else (a
    /// clone of the tensor, a numpy array a zero-copy fetch handed out) is
    /// first copied, so the other holders never see the write; an
    /// `OutOfMemory` error when that copy cannot be allocated.
    #[inline]
    pub fn array_mut<T: Element>(&mut self) -> Result<&mut ArrayD<T>> {
        let got = self.dtype();
        match T::shared_mut(self) {
            Some(a) => make_unique(a),
            None => Err(wrong_dtype(T::DTYPE, got)),
        }
    }

    /// The shared storage if the dtype is `T`, else a `Type` error naming
    /// both (to hand the buffer out without copying it).
    pub fn shared<T: Element>(&self) -> Result<&Shared<T>> {
        T::shared(self).ok_or_else(|| wrong_dtype(T::DTYPE, self.dtype()))
    }

    /// Whether nothing else holds this tensor's buffer (a write would not
    /// copy it).
    pub fn is_unique(&self) -> bool {
        with_array!(self, a => Arc::strong_count(a) == 1 && Arc::weak_count(a) == 0)
    }

    /// Whether the two tensors share one buffer (a clone and its source do
    /// until either is written).
    pub fn shares_buffer(&self, other: &Tensor) -> bool {
        crate::with_match_dtype!(tensor self, |a: T| T::shared(other).is_some_and(|b| Arc::ptr_eq(a, b)))
    }

    /// The single element of a one-element tensor of dtype `T` (any shape).
    pub fn scalar_value<T: Element>(&self) -> Result<T> {
        let a = self.array::<T>()?;
        if a.len() != 1 {
            return Err(Error::shape(format!(
                "expected a tensor with exactly one element, got shape {:?}",
                a.shape()
            )));
        }
        Ok(a.iter().next().cloned().expect("one element"))
    }

    /// Appends `other` along dim 0 (inner dims must match). The rows are
    /// copied into the buffer's spare capacity (`memcpy` for plain types),
    /// which grows geometrically: amortised O(rows appended).
    pub fn append_rows(&mut self, other: &Tensor) -> Result<()> {
        self.append_rows_with(other, Growth::Vec).map(|_| ())
    }

    /// [`Tensor::append_rows`] for a tensor that keeps growing by appends,
    /// from several threads (a dataset written by a pipeline): the buffer
    /// grows as [`reserve_for_append`] says, and the unused capacity left
    /// after the new rows is returned ([`Spare`]; `None` when the tensor's
    /// layout did not allow appending in place).
    pub fn append_rows_growing(&mut self, other: &Tensor) -> Result<Option<Spare>> {
        self.append_rows_with(other, Growth::Appends)
    }

    fn append_rows_with(&mut self, other: &Tensor, growth: Growth) -> Result<Option<Spare>> {
        if self.dtype() != other.dtype() {
            return Err(Error::type_error(format!(
                "cannot append a {} tensor to a {} tensor",
                other.dtype(),
                self.dtype()
            )));
        }
        if self.ndim() == 0 || other.ndim() == 0 || self.shape()[1..] != other.shape()[1..] {
            return Err(Error::shape(format!(
                "cannot append rows of shape {:?} to a tensor of shape {:?}",
                other.shape(),
                self.shape()
            )));
        }
        crate::with_match_dtype!(tensor self, |a: T| {
            let b = other.array::<T>()?;
            extend_rows(make_unique(a)?, b, growth)
        })
    }
}

/// Where a tensor's buffer has room left after an append, as addresses:
/// `start..end` is allocated but holds no element yet; `buffer` is the
/// buffer's first address; `grew` says that the append reallocated it.
///
/// Only a hint (for [`prefault_for_write`]): the buffer may be reallocated
/// or freed as soon as the tensor's lock is released, so these addresses
/// must never be dereferenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spare {
    pub buffer: usize,
    pub start: usize,
    pub end: usize,
    pub grew: bool,
}

/// How [`extend_rows`] grows a buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Growth {
    /// As `Vec` does (doubling).
    Vec,
    /// As [`reserve_for_append`] does.
    Appends,
}

/// Appends the rows of `b` to `a` (the inner dims were checked) by
/// extending `a`'s vector: `memcpy` for plain types and amortised geometric
/// growth (ndarray's `append` clones element by element). An array not in
/// standard layout is first copied into one. A buffer that cannot grow is
/// an `OutOfMemory` error and leaves `a` as it was.
fn extend_rows<T: Element>(
    a: &mut ArrayD<T>,
    b: &ArrayD<T>,
    growth: Growth,
) -> Result<Option<Spare>> {
    if !a.is_standard_layout() {
        *a = copy_array(a.view())?;
    }
    let n = a.len();
    let old_shape = a.shape().to_vec();
    let mut shape = old_shape.clone();
    shape[0] = shape[0]
        .checked_add(b.shape()[0])
        .ok_or_else(|| Error::shape("appending rows: too many rows"))?;
    let placeholder = ArrayD::from_shape_vec(IxDyn(&[0]), Vec::new()).expect("an empty array");
    let (mut v, first) = std::mem::replace(a, placeholder).into_raw_vec_and_offset();
    // In standard layout the elements are v[first..first + n], in order.
    let first = first.unwrap_or(0);
    if first != 0 || v.len() != n {
        v.truncate(first + n);
        v.drain(..first);
    }
    let capacity = v.capacity();
    let reserved = match growth {
        Growth::Vec => v.try_reserve(b.len()).is_ok(),
        Growth::Appends => reserve_for_append(&mut v, b.len()),
    };
    if !reserved {
        let bytes = n
            .saturating_add(b.len())
            .saturating_mul(std::mem::size_of::<T>());
        *a = ArrayD::from_shape_vec(IxDyn(&old_shape), v)
            .map_err(|e| Error::internal(format!("appending rows: {e}")))?;
        return Err(alloc_error(bytes, tensor_what::<T>(&shape)));
    }
    let grew = v.capacity() != capacity;
    match b.as_slice() {
        Some(rows) => v.extend_from_slice(rows),
        None => v.extend(b.iter().cloned()),
    }
    let size = std::mem::size_of::<T>();
    let base = v.as_ptr() as usize;
    let spare = Spare {
        buffer: base,
        start: base + v.len() * size,
        end: base + v.capacity() * size,
        grew,
    };
    // The shape holds exactly v.len() elements, so this cannot fail.
    *a = ArrayD::from_shape_vec(IxDyn(&shape), v)
        .map_err(|e| Error::internal(format!("appending rows: {e}")))?;
    Ok(Some(spare))
}

/// The smallest buffer an append grows a tensor to, in bytes.
pub const MIN_APPEND_CAPACITY: usize = 64 << 10;
/// The capacity, in bytes, a buffer gets once it outgrows
/// [`MIN_APPEND_CAPACITY`]: large enough for glibc's allocator to map it on
/// its own (it always does from 32 MiB on), which it then grows by
/// remapping its pages (mremap) instead of copying them.
pub const LARGE_APPEND_CAPACITY: usize = 32 << 20;

/// Makes room in `v` for `more` elements. Growth is geometric (at least
/// doubling), to at least [`MIN_APPEND_CAPACITY`] bytes, then at once to at
/// least [`LARGE_APPEND_CAPACITY`]. A tensor that threads take turns
/// appending to under a mutex is thus reallocated twice, not on every
/// doubling (a reallocation copies the tensor, under the mutex, into fresh
/// pages, each a page fault), and never copied once large. Only address
/// space is reserved: pages are committed when first written (or
/// prefaulted).
/// False when not even `more` elements can be allocated.
fn reserve_for_append<T>(v: &mut Vec<T>, more: usize) -> bool {
    let need = v.len().saturating_add(more);
    if need <= v.capacity() {
        return true;
    }
    let size = std::mem::size_of::<T>().max(1);
    let mut want = need
        .max(v.capacity().saturating_mul(2))
        .max(MIN_APPEND_CAPACITY / size);
    if want.saturating_mul(size) > MIN_APPEND_CAPACITY {
        want = want.max(LARGE_APPEND_CAPACITY / size);
    }
    // Not that much address space: just what is needed.
    v.try_reserve_exact(want - v.len()).is_ok() || v.try_reserve(more).is_ok()
}

/// Asks the OS to map the whole pages inside `start..end` writable now, as
/// writing to them would, without touching their content (Linux's
/// `MADV_POPULATE_WRITE`): the page faults of fresh memory are taken here
/// rather than by whoever writes there next. Only a hint: failures (a
/// kernel older than 5.14, a range no longer mapped) are ignored, and after
/// an `EINVAL` the call is not tried again. A no-op on other systems.
pub fn prefault_for_write(start: usize, end: usize) {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::{c_int, c_long, c_void};
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::LazyLock;
        extern "C" {
            fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
            fn sysconf(name: c_int) -> c_long;
        }
        const MADV_POPULATE_WRITE: c_int = 23;
        const SC_PAGESIZE: c_int = 30;
        const EINVAL: i32 = 22;
        static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
        static PAGE: LazyLock<usize> = LazyLock::new(|| {
            // SAFETY: sysconf has no preconditions.
            let p = unsafe { sysconf(SC_PAGESIZE) };
            usize::try_from(p)
                .ok()
                .filter(|p| p.is_power_of_two())
                .unwrap_or(4096)
        });
        if UNSUPPORTED.load(Ordering::Relaxed) {
            return;
        }
        let page = *PAGE;
        let (s, e) = (
            start.saturating_add(page - 1) & !(page - 1),
            end & !(page - 1),
        );
        if e <= s {
            return;
        }
        // SAFETY: MADV_POPULATE_WRITE never changes the content of memory,
        // it only faults pages in. If the range is stale (its buffer was
        // reallocated or freed since), the call fails or populates pages of
        // whatever is mapped there now: equally harmless.
        let r = unsafe { madvise(s as *mut c_void, e - s, MADV_POPULATE_WRITE) };
        if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(EINVAL) {
            UNSUPPORTED.store(true, Ordering::Relaxed);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, end);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one checked size rule (issue 28): ndarray's (the product of the
    /// non-zero dims, in bytes, fits in isize), so a zero dim does not
    /// excuse overflowing others.
    #[test]
    fn checked_numel_follows_ndarrays_rule() {
        assert_eq!(checked_numel::<f32>(&[2, 3], "t").unwrap(), 6);
        assert_eq!(checked_numel::<f32>(&[0, 1 << 40], "t").unwrap(), 0);
        for bad in [
            &[1usize << 62, 1 << 62, 0][..],
            &[1 << 62, 2],
            &[usize::MAX],
        ] {
            let e = checked_numel::<f32>(bad, "Reshape's output").unwrap_err();
            assert_eq!(e.kind, ErrorKind::Shape);
            assert!(
                e.message.starts_with("Reshape's output: the shape"),
                "{}",
                e.message
            );
        }
        // 2^61 float32 elements are 2^63 bytes: one more than isize holds.
        assert!(checked_numel::<f32>(&[1 << 61], "t").is_err());
        assert!(checked_numel::<u8>(&[1 << 61], "t").is_ok());
    }

    /// A buffer that cannot be had is an OutOfMemory error naming its size,
    /// not an abort (2^56 bytes: more than any machine maps).
    #[test]
    fn unallocatable_buffers_are_out_of_memory_errors() {
        let huge = 1usize << 54;
        let errs = [
            zeroed_vec::<f32>(&[huge], "Tile's output").unwrap_err(),
            filled_vec(huge, 1.5f32, "scratch").unwrap_err(),
            default_buffer::<f64>(huge / 2, "scratch").unwrap_err(),
            try_collect((0..huge).map(|i| i as f32), "scratch").unwrap_err(),
        ];
        for e in errs {
            assert_eq!(e.kind, ErrorKind::OutOfMemory, "{}", e.message);
            assert!(e.message.contains(&(huge * 4).to_string()), "{}", e.message);
        }
    }

    /// The fallible array helpers give what ndarray's own would.
    #[test]
    fn fallible_array_helpers_match_ndarray() {
        let a =
            ArrayD::from_shape_vec(IxDyn(&[2, 3, 4]), (0..24).map(|v| v as f64).collect()).unwrap();
        for axis in 0..3 {
            let want = a.fold_axis(ndarray::Axis(axis), 0.5, |s, v| s * 0.5 + v);
            let got = fold_axis_array(a.view(), axis, 0.5, |s, v| s * 0.5 + v).unwrap();
            assert_eq!(got.index_axis(ndarray::Axis(axis), 0), want);
        }
        let t = a.view().reversed_axes();
        assert_eq!(
            map_array(t.view(), |v| v * 2.0).unwrap(),
            t.mapv(|v| v * 2.0)
        );
        assert_eq!(
            zip_map_array(t.view(), t.view(), |x, y| x - y).unwrap(),
            ArrayD::<f64>::zeros(t.raw_dim())
        );
        let moved = Tensor::from(a.clone()).into_shape(&[4, 6]).unwrap();
        assert_eq!(moved.shape(), &[4, 6]);
        assert_eq!(
            moved
                .array::<f64>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            a.iter().copied().collect::<Vec<_>>()
        );
        assert!(Tensor::from(a).into_shape(&[5, 5]).is_err());
    }

    #[test]
    fn wrong_dtype_names_both() {
        let t = Tensor::scalar(1i64);
        let e = t.array::<f32>().unwrap_err();
        assert_eq!(
            e.message,
            "expected a tensor of dtype float32 but got int64"
        );
        assert_eq!(t.ndim(), 0);
        assert_eq!(t.numel(), 1);
    }

    #[test]
    fn clones_share_the_buffer_until_one_is_written() {
        let a = Tensor::from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let mut b = a.clone();
        assert!(a.shares_buffer(&b));
        assert!(!a.is_unique());
        // Reads borrow the one buffer.
        assert_eq!(
            a.array::<f32>().unwrap().as_ptr(),
            b.array::<f32>().unwrap().as_ptr()
        );
        // A write copies first: `a` keeps its values and its buffer.
        let before = a.array::<f32>().unwrap().as_ptr();
        b.array_mut::<f32>().unwrap()[[0, 1]] = 20.0;
        assert!(!a.shares_buffer(&b));
        assert!(a.is_unique() && b.is_unique());
        assert_eq!(a.array::<f32>().unwrap().as_ptr(), before);
        assert_eq!(
            a,
            Tensor::from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap()
        );
        assert_eq!(
            b,
            Tensor::from_vec(&[2, 2], vec![1.0f32, 20.0, 3.0, 4.0]).unwrap()
        );
        // A unique buffer is written in place.
        let p = b.array::<f32>().unwrap().as_ptr();
        b.array_mut::<f32>().unwrap()[[1, 1]] = 40.0;
        assert_eq!(b.array::<f32>().unwrap().as_ptr(), p);
        // The wrong dtype is still a type error, and copies nothing.
        let c = a.clone();
        let mut d = a.clone();
        assert!(d.array_mut::<i64>().is_err());
        assert!(d.shares_buffer(&c));
    }

    #[test]
    fn every_mutable_path_copies_a_shared_buffer() {
        let held = Tensor::from_vec(&[2], vec![1i64, 2]).unwrap();
        // Element::view_mut
        let mut t = held.clone();
        <i64 as Element>::view_mut(&mut t).unwrap()[0] = 7;
        // append_rows
        let mut u = held.clone();
        u.append_rows(&Tensor::from_vec(&[1], vec![3i64]).unwrap())
            .unwrap();
        let mut w = held.clone();
        w.append_rows_growing(&Tensor::from_vec(&[1], vec![4i64]).unwrap())
            .unwrap();
        // make_unique on the storage itself
        let mut x = held.clone();
        if let Tensor::I64(s) = &mut x {
            make_unique(s).unwrap()[1] = 9;
        }
        assert_eq!(held, Tensor::from_vec(&[2], vec![1i64, 2]).unwrap());
        assert!(held.is_unique());
        assert_eq!(t, Tensor::from_vec(&[2], vec![7i64, 2]).unwrap());
        assert_eq!(u, Tensor::from_vec(&[3], vec![1i64, 2, 3]).unwrap());
        assert_eq!(w, Tensor::from_vec(&[3], vec![1i64, 2, 4]).unwrap());
        assert_eq!(x, Tensor::from_vec(&[2], vec![1i64, 9]).unwrap());
        // Strings too (a deep copy of each string).
        let s = Tensor::from_vec(&[1], vec![b"ab".to_vec()]).unwrap();
        let mut s2 = s.clone();
        s2.array_mut::<Vec<u8>>().unwrap()[0].push(b'c');
        assert_eq!(s.array::<Vec<u8>>().unwrap()[0], b"ab".to_vec());
        assert_eq!(s2.array::<Vec<u8>>().unwrap()[0], b"abc".to_vec());
    }

    #[test]
    fn storage_outlives_its_tensor_and_moves_out_when_unique() {
        let t = Tensor::from_vec(&[3], vec![1u8, 2, 3]).unwrap();
        let kept = t.shared::<u8>().unwrap().clone();
        let p = kept.as_ptr();
        drop(t);
        assert_eq!(kept.as_slice().unwrap(), &[1, 2, 3]);
        // Unique: moved out, same buffer; shared: copied.
        let other = kept.clone();
        let copied = into_array(kept).unwrap();
        assert_ne!(copied.as_ptr(), p);
        let moved = into_array(other).unwrap();
        assert_eq!(moved.as_ptr(), p);
        assert_eq!(copied, moved);
        assert!(Tensor::scalar(1u8).shared::<f32>().is_err());
        // try_clone shares; deep_copy does not.
        let t = Tensor::from_vec(&[2], vec![1.5f64, 2.5]).unwrap();
        assert!(t.try_clone().unwrap().shares_buffer(&t));
        let d = t.deep_copy().unwrap();
        assert!(!d.shares_buffer(&t));
        assert_eq!(d, t);
    }

    #[test]
    fn from_vec_checks_count() {
        assert!(Tensor::from_vec(&[2, 2], vec![1.0f32; 3]).is_err());
        let t = Tensor::from_vec(&[2, 2], vec![1i32, 2, 3, 4]).unwrap();
        assert_eq!(t.shape(), &[2, 2]);
    }

    #[test]
    fn zeros_small_and_large() {
        let t = Tensor::zeros(DataType::Int64, &[2, 3]).unwrap();
        assert_eq!(t, Tensor::from_vec(&[2, 3], vec![0i64; 6]).unwrap());
        // 8 MiB: allocated zeroed, advised to use huge pages; still zeros.
        let big = Tensor::zeros(DataType::Float, &[1 << 21]).unwrap();
        let a = big.array::<f32>().unwrap();
        assert_eq!(a.len(), 1 << 21);
        assert!(a.iter().all(|&x| x == 0.0));
        assert_eq!(
            Tensor::zeros(DataType::String, &[2]).unwrap(),
            Tensor::from_vec(&[2], vec![Vec::<u8>::new(), Vec::new()]).unwrap()
        );
        assert!(Tensor::zeros(DataType::Float, &[usize::MAX, 2]).is_err());
        assert!(Tensor::zeros(DataType::Float, &[usize::MAX / 2]).is_err());
    }

    #[test]
    fn filled_arrays_keep_every_bit_of_their_value() {
        let z = filled_array(&[3], 0.0f32).unwrap();
        assert!(z.iter().all(|x| x.to_bits() == 0));
        let nz = filled_array(&[3], -0.0f32).unwrap();
        assert!(nz.iter().all(|x| x.to_bits() == (-0.0f32).to_bits()));
        assert_eq!(
            filled_array(&[2], true)
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            vec![true, true]
        );
        assert_eq!(
            filled_array(&[2], b"s".to_vec())
                .unwrap()
                .iter()
                .cloned()
                .collect::<Vec<_>>(),
            vec![b"s".to_vec(), b"s".to_vec()]
        );
        assert!(filled_array(&[usize::MAX, 2], 1i64).is_err());
    }

    #[test]
    fn copy_array_copies_every_layout() {
        let small = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1i32, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(copy_array(small.view()).unwrap(), small);
        let t = small.t();
        assert_eq!(copy_array(t.view()).unwrap(), t.to_owned());
        let big = ArrayD::from_shape_vec(
            IxDyn(&[3, 1 << 20]),
            (0..3 << 20).map(|i| i as f32).collect(),
        )
        .unwrap();
        assert_eq!(copy_array(big.view()).unwrap(), big);
    }

    #[test]
    fn advising_odd_ranges_is_harmless() {
        let mut v = vec![1u8; (5 << 20) + 123];
        advise_huge_pages(v[7..].as_ptr(), v.len() - 7);
        advise_huge_pages(v.as_ptr(), 10);
        advise_huge_pages(std::ptr::null(), 0);
        v[3 << 20] = 2;
        assert_eq!(v.iter().map(|&x| x as usize).sum::<usize>(), v.len() + 1);
    }

    #[test]
    fn append_rows_checks_inner_dims() {
        let mut a = Tensor::from_vec(&[1, 2], vec![1i32, 2]).unwrap();
        a.append_rows(&Tensor::from_vec(&[2, 2], vec![3i32, 4, 5, 6]).unwrap())
            .unwrap();
        assert_eq!(
            a,
            Tensor::from_vec(&[3, 2], vec![1, 2, 3, 4, 5, 6]).unwrap()
        );
        assert!(a
            .append_rows(&Tensor::from_vec(&[1, 3], vec![1i32, 2, 3]).unwrap())
            .is_err());
    }

    fn f32s(shape: &[usize], v: Vec<f32>) -> Tensor {
        Tensor::from_vec(shape, v).unwrap()
    }

    #[test]
    fn append_rows_copies_the_rows_for_every_kind_of_element() {
        let mut a = f32s(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        a.append_rows(&f32s(&[1, 2], vec![5.0, 6.0])).unwrap();
        assert_eq!(a, f32s(&[3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        let mut b = Tensor::from_vec(&[2], vec![true, false]).unwrap();
        b.append_rows(&Tensor::from_vec(&[3], vec![false, true, true]).unwrap())
            .unwrap();
        assert_eq!(
            b,
            Tensor::from_vec(&[5], vec![true, false, false, true, true]).unwrap()
        );
        let words = |v: &[&str]| {
            Tensor::from_vec(
                &[v.len()],
                v.iter().map(|w| w.as_bytes().to_vec()).collect(),
            )
            .unwrap()
        };
        let mut c = words(&["a", "bc"]);
        c.append_rows(&words(&["", "def"])).unwrap();
        assert_eq!(c, words(&["a", "bc", "", "def"]));
        assert!(c.append_rows(&b).is_err());
    }

    #[test]
    fn append_rows_to_arrays_not_in_standard_layout() {
        // A transposed (column-major) 3 x 2 array, and one whose first row
        // was sliced off (its data does not start at its buffer's start).
        let t = ndarray::Array2::from_shape_vec((2, 3), vec![1i64, 2, 3, 4, 5, 6])
            .unwrap()
            .reversed_axes()
            .into_dyn();
        let mut a = Tensor::from(t);
        a.append_rows(&Tensor::from_vec(&[1, 2], vec![7i64, 8]).unwrap())
            .unwrap();
        assert_eq!(
            a,
            Tensor::from_vec(&[4, 2], vec![1i64, 4, 2, 5, 3, 6, 7, 8]).unwrap()
        );
        let mut sliced = ndarray::Array2::from_shape_vec((3, 2), vec![1i32, 2, 3, 4, 5, 6])
            .unwrap()
            .into_dyn();
        sliced.slice_collapse(ndarray::s![1.., ..].as_ref());
        let mut b = Tensor::from(sliced);
        let spare = b
            .append_rows_growing(&Tensor::from_vec(&[1, 2], vec![7i32, 8]).unwrap())
            .unwrap();
        assert!(spare.is_some());
        assert_eq!(
            b,
            Tensor::from_vec(&[3, 2], vec![3i32, 4, 5, 6, 7, 8]).unwrap()
        );
    }

    #[test]
    fn growing_appends_reallocate_twice_then_never() {
        let batch = 1000usize;
        let mut t = f32s(&[batch], (0..batch).map(|i| i as f32).collect());
        let mut grew_at = vec![];
        let mut capacities = vec![];
        let mut buffer = 0;
        for k in 1..300 {
            let rows = f32s(
                &[batch],
                (k * batch..(k + 1) * batch).map(|i| i as f32).collect(),
            );
            let spare = t.append_rows_growing(&rows).unwrap().expect("in place");
            assert_eq!(spare.start, spare.buffer + (k + 1) * batch * 4);
            if spare.grew {
                grew_at.push(k);
                capacities.push(spare.end - spare.buffer);
            } else {
                assert_eq!(spare.buffer, buffer, "moved without growing");
            }
            buffer = spare.buffer;
        }
        // 4 KB of rows, then 64 KiB of capacity, then 32 MiB.
        assert_eq!(grew_at, vec![1, 16]);
        assert_eq!(capacities[0], MIN_APPEND_CAPACITY);
        assert!(capacities[1] >= LARGE_APPEND_CAPACITY);
        let expected = f32s(&[300 * batch], (0..300 * batch).map(|i| i as f32).collect());
        assert_eq!(t, expected);
    }

    #[test]
    fn prefaulting_leaves_memory_as_it_was() {
        let mut v: Vec<u8> = Vec::with_capacity(1 << 20);
        v.extend((0..(1 << 19)).map(|i| (i % 251) as u8));
        let base = v.as_ptr() as usize;
        prefault_for_write(base, base + v.capacity());
        prefault_for_write(base + 100, base + 50); // empty: nothing to do
        prefault_for_write(4096, 8192); // not mapped: ignored
        assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        v.extend(std::iter::repeat_n(7u8, 1 << 19));
        assert_eq!(v[(1 << 20) - 1], 7);
    }
}
