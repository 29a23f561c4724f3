//! N-dimensional tensors over `ndarray`, one variant per dtype.
//!
//! There are no implicit casts anywhere: an op that wants `f32` and is handed
//! an `i64` tensor gets a `Type` error naming both dtypes.

use crate::error::{Error, Result};
use ndarray::{ArrayD, IxDyn};

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

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A dense tensor. Strings are byte strings, as Caffe2's `std::string` was.
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    I32(ArrayD<i32>),
    I64(ArrayD<i64>),
    Bool(ArrayD<bool>),
    U8(ArrayD<u8>),
    I8(ArrayD<i8>),
    I16(ArrayD<i16>),
    U16(ArrayD<u16>),
    Str(ArrayD<Vec<u8>>),
}

/// Applies one expression to whichever array a tensor holds.
#[macro_export]
macro_rules! with_array {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::tensor::Tensor::F32($a) => $body,
            $crate::tensor::Tensor::F64($a) => $body,
            $crate::tensor::Tensor::I32($a) => $body,
            $crate::tensor::Tensor::I64($a) => $body,
            $crate::tensor::Tensor::Bool($a) => $body,
            $crate::tensor::Tensor::U8($a) => $body,
            $crate::tensor::Tensor::I8($a) => $body,
            $crate::tensor::Tensor::I16($a) => $body,
            $crate::tensor::Tensor::U16($a) => $body,
            $crate::tensor::Tensor::Str($a) => $body,
        }
    };
}

/// A Rust element type that a tensor can hold.
pub trait Element: Clone + Default + Send + Sync + std::fmt::Debug + 'static {
    const DTYPE: DataType;
    fn wrap(a: ArrayD<Self>) -> Tensor;
    fn view(t: &Tensor) -> Option<&ArrayD<Self>>;
    fn view_mut(t: &mut Tensor) -> Option<&mut ArrayD<Self>>;
}

macro_rules! element {
    ($ty:ty, $var:ident, $dt:ident) => {
        impl Element for $ty {
            const DTYPE: DataType = DataType::$dt;
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$var(a)
            }
            fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
                match t {
                    Tensor::$var(a) => Some(a),
                    _ => None,
                }
            }
            fn view_mut(t: &mut Tensor) -> Option<&mut ArrayD<Self>> {
                match t {
                    Tensor::$var(a) => Some(a),
                    _ => None,
                }
            }
        }
        impl From<ArrayD<$ty>> for Tensor {
            fn from(a: ArrayD<$ty>) -> Tensor {
                Tensor::$var(a)
            }
        }
    };
}

element!(f32, F32, Float);
element!(f64, F64, Double);
element!(i32, I32, Int32);
element!(i64, I64, Int64);
element!(bool, Bool, Bool);
element!(u8, U8, Uint8);
element!(i8, I8, Int8);
element!(i16, I16, Int16);
element!(u16, U16, Uint16);
element!(Vec<u8>, Str, String);

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

/// A tensor buffer of `n` default values (0, false, ""). Large buffers are
/// allocated zeroed and untouched (numeric zeros come from `calloc`, which
/// maps fresh pages for large sizes) and advised to use huge pages before
/// anything writes them.
pub fn default_buffer<T: Element>(n: usize) -> Vec<T> {
    let v = vec![T::default(); n];
    advise_huge_pages(
        v.as_ptr().cast(),
        n.saturating_mul(std::mem::size_of::<T>()),
    );
    v
}

/// An array of default values of `shape`, on a [`default_buffer`].
pub fn default_array<T: Element>(shape: &[usize]) -> Result<ArrayD<T>> {
    let n = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| {
            n.checked_mul(std::mem::size_of::<T>().max(1))
                .is_some_and(|b| b <= isize::MAX as usize)
        })
        .ok_or_else(|| Error::shape(format!("shape {shape:?} has too many elements")))?;
    ArrayD::from_shape_vec(IxDyn(shape), default_buffer(n)).map_err(|e| Error::shape(e.to_string()))
}

/// An owned copy of `a` (row-major). A large contiguous source is copied
/// into a buffer advised to use huge pages before it is written, so tensors
/// copied in from outside (fed arrays, loaded checkpoints) stream as fast as
/// the numpy arrays they came from; anything else is `a.to_owned()`.
pub fn copy_array<T: Element + Copy>(a: ndarray::ArrayViewD<'_, T>) -> ArrayD<T> {
    let bytes = a.len().saturating_mul(std::mem::size_of::<T>());
    match a.as_slice() {
        Some(src) if bytes >= HUGE_PAGE_MIN_BYTES => {
            let mut v: Vec<T> = Vec::with_capacity(src.len());
            advise_huge_pages(v.as_ptr().cast(), bytes);
            v.extend_from_slice(src);
            ArrayD::from_shape_vec(a.raw_dim(), v).unwrap_or_else(|_| a.to_owned())
        }
        _ => a.to_owned(),
    }
}

impl Tensor {
    pub fn dtype(&self) -> DataType {
        match self {
            Tensor::F32(_) => DataType::Float,
            Tensor::F64(_) => DataType::Double,
            Tensor::I32(_) => DataType::Int32,
            Tensor::I64(_) => DataType::Int64,
            Tensor::Bool(_) => DataType::Bool,
            Tensor::U8(_) => DataType::Uint8,
            Tensor::I8(_) => DataType::Int8,
            Tensor::I16(_) => DataType::Int16,
            Tensor::U16(_) => DataType::Uint16,
            Tensor::Str(_) => DataType::String,
        }
    }

    pub fn shape(&self) -> &[usize] {
        with_array!(self, a => a.shape())
    }

    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    pub fn numel(&self) -> usize {
        with_array!(self, a => a.len())
    }

    /// A tensor of default values (0, false, "") of the given dtype and shape.
    pub fn zeros(dtype: DataType, shape: &[usize]) -> Result<Tensor> {
        let s = shape;
        Ok(match dtype {
            DataType::Float => Tensor::F32(default_array(s)?),
            DataType::Double => Tensor::F64(default_array(s)?),
            DataType::Int32 => Tensor::I32(default_array(s)?),
            DataType::Int64 => Tensor::I64(default_array(s)?),
            DataType::Bool => Tensor::Bool(default_array(s)?),
            DataType::Uint8 | DataType::Byte => Tensor::U8(default_array(s)?),
            DataType::Int8 => Tensor::I8(default_array(s)?),
            DataType::Int16 => Tensor::I16(default_array(s)?),
            DataType::Uint16 => Tensor::U16(default_array(s)?),
            DataType::String => Tensor::Str(default_array(s)?),
            other => {
                return Err(Error::type_error(format!(
                    "unsupported tensor dtype {other}"
                )))
            }
        })
    }

    /// A 0-dim tensor holding one value.
    pub fn scalar<T: Element>(v: T) -> Tensor {
        T::wrap(ArrayD::from_elem(IxDyn(&[]), v))
    }

    /// Builds a tensor from a shape and flat row-major values.
    pub fn from_vec<T: Element>(shape: &[usize], values: Vec<T>) -> Result<Tensor> {
        let n: usize = shape.iter().product();
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
    pub fn array<T: Element>(&self) -> Result<&ArrayD<T>> {
        T::view(self).ok_or_else(|| {
            Error::type_error(format!(
                "expected a tensor of dtype {} but got {}",
                T::DTYPE,
                self.dtype()
            ))
        })
    }

    pub fn array_mut<T: Element>(&mut self) -> Result<&mut ArrayD<T>> {
        let got = self.dtype();
        T::view_mut(self).ok_or_else(|| {
            Error::type_error(format!(
                "expected a tensor of dtype {} but got {}",
                T::DTYPE,
                got
            ))
        })
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

    /// Appends `other` along dim 0 (inner dims must match).
    pub fn append_rows(&mut self, other: &Tensor) -> Result<()> {
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
        macro_rules! app {
            ($a:ident, $T:ty) => {{
                let b = other.array::<$T>()?;
                $a.append(ndarray::Axis(0), b.view())
                    .map_err(|e| Error::shape(e.to_string()))
            }};
        }
        match self {
            Tensor::F32(a) => app!(a, f32),
            Tensor::F64(a) => app!(a, f64),
            Tensor::I32(a) => app!(a, i32),
            Tensor::I64(a) => app!(a, i64),
            Tensor::Bool(a) => app!(a, bool),
            Tensor::U8(a) => app!(a, u8),
            Tensor::I8(a) => app!(a, i8),
            Tensor::I16(a) => app!(a, i16),
            Tensor::U16(a) => app!(a, u16),
            Tensor::Str(a) => app!(a, Vec<u8>),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn copy_array_copies_every_layout() {
        let small = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1i32, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(copy_array(small.view()), small);
        let t = small.t();
        assert_eq!(copy_array(t.view()), t.to_owned());
        let big = ArrayD::from_shape_vec(
            IxDyn(&[3, 1 << 20]),
            (0..3 << 20).map(|i| i as f32).collect(),
        )
        .unwrap();
        assert_eq!(copy_array(big.view()), big);
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
}
